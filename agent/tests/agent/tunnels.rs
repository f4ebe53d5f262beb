//! Port-forward tunnels: an HTTP server on the loopback reached through the upgraded connection, the
//! [::1] fallback, 502 for a closed port, bad ports and headers, the token, and 100 tunnels at once.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::common::{Agent, TOKEN};

/// Serves `HTTP/1.1 200` with body `hello from <port>` to every connection, then closes it.
async fn http_server(listener: TcpListener) {
    let port = listener.local_addr().unwrap().port();
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            return;
        };
        tokio::spawn(async move {
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                if stream.read(&mut byte).await.unwrap_or(0) == 0 {
                    return;
                }
                head.push(byte[0]);
            }
            let body = format!("hello from {port}");
            let response = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
        });
    }
}

/// Echoes every connection's bytes back.
async fn echo_server(listener: TcpListener) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            return;
        };
        tokio::spawn(async move {
            let (mut reader, mut writer) = stream.split();
            let _ = tokio::io::copy(&mut reader, &mut writer).await;
        });
    }
}

/// Sends the upgrade request for `port` on a raw connection; the status line and the stream.
async fn open_tunnel(
    agent: SocketAddr,
    port: &str,
    token: Option<&str>,
    upgrade: bool,
) -> (String, TcpStream) {
    let mut stream = TcpStream::connect(agent).await.unwrap();
    let mut request = format!("GET /v1/ports/{port}/tunnel HTTP/1.1\r\nHost: agent\r\n");
    if let Some(token) = token {
        request.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    if upgrade {
        request.push_str("Connection: Upgrade\r\nUpgrade: tcp\r\n");
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(
            stream.read(&mut byte).await.unwrap(),
            1,
            "the agent closed during the head: {}",
            String::from_utf8_lossy(&head)
        );
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    (head, stream)
}

fn status_of(head: &str) -> u16 {
    head.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_server_is_reached_through_the_tunnel() {
    let agent = Agent::start();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(http_server(listener));
    let (head, mut stream) = open_tunnel(agent.addr, &port.to_string(), Some(TOKEN), true).await;
    assert_eq!(status_of(&head), 101, "{head}");
    assert!(head.to_ascii_lowercase().contains("upgrade: tcp"), "{head}");
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: inside\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_string(&mut answer))
        .await
        .unwrap()
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    assert!(answer.ends_with(&format!("hello from {port}")), "{answer}");

    // A server on the IPv6 loopback only is reached too, when the host has one.
    if let Ok(listener) = TcpListener::bind("[::1]:0").await {
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(http_server(listener));
        let (head, mut stream) =
            open_tunnel(agent.addr, &port.to_string(), Some(TOKEN), true).await;
        assert_eq!(status_of(&head), 101, "{head}");
        stream.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        assert!(answer.ends_with(&format!("hello from {port}")), "{answer}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_come_before_the_upgrade() {
    let agent = Agent::start();
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let (head, mut stream) = open_tunnel(agent.addr, &closed.to_string(), Some(TOKEN), true).await;
    assert_eq!(status_of(&head), 502, "{head}");
    let mut body = vec![0u8; 4096];
    let read = stream.read(&mut body).await.unwrap();
    let body = String::from_utf8_lossy(&body[..read]).to_string();
    assert!(
        body.contains("BadGateway") && body.contains(&format!("port {closed}")),
        "{body}"
    );
    for (port, token, upgrade, expected) in [
        ("0", Some(TOKEN), true, 400),
        ("65536", Some(TOKEN), true, 400),
        ("http", Some(TOKEN), true, 400),
        ("80", Some(TOKEN), false, 400),
        ("80", None, true, 401),
        ("80", Some("wrong"), true, 401),
    ] {
        let (head, _) = open_tunnel(agent.addr, port, token, upgrade).await;
        assert_eq!(
            status_of(&head),
            expected,
            "{port} {token:?} {upgrade}: {head}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_tunnels_at_once() {
    let agent = Agent::start();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    tokio::spawn(echo_server(listener));
    let mut tunnels = Vec::new();
    for _ in 0..100 {
        let (head, stream) = open_tunnel(agent.addr, &port, Some(TOKEN), true).await;
        assert_eq!(status_of(&head), 101, "{head}");
        tunnels.push(stream);
    }
    // All open at once; each carries its own bytes.
    let exchanges = tunnels
        .into_iter()
        .enumerate()
        .map(|(index, mut stream)| async move {
            let message = format!("tunnel {index} ").repeat(1000);
            stream.write_all(message.as_bytes()).await.unwrap();
            let mut back = vec![0u8; message.len()];
            stream.read_exact(&mut back).await.unwrap();
            assert_eq!(back, message.as_bytes());
            stream.shutdown().await.unwrap();
            let mut rest = Vec::new();
            stream.read_to_end(&mut rest).await.unwrap();
            assert!(rest.is_empty());
        });
    tokio::time::timeout(
        Duration::from_secs(60),
        futures::future::join_all(exchanges),
    )
    .await
    .unwrap();
    // The agent still serves ordinary requests.
    let (status, _) = agent.get("/v1/processes").await;
    assert_eq!(status, hyper::StatusCode::OK);
}
