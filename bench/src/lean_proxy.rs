//! A lean HTTP/1.1 reverse proxy for `bench_gateway`: what the least HTTP-aware hop costs on this
//! machine, to tell the cost of HTTP itself from the cost of hyper's server and hyper-util's client.
//!
//! Each request's head is parsed (`httparse`, the parser hyper uses) and the request, head and body,
//! sent on over an idle connection to the upstream taken from a shared pool (or a new one); the
//! answer's head is parsed the same way and the answer copied back, and the connection goes back to
//! the pool. The task that serves the client connection does the whole exchange: no connection task
//! of the client's, no channels, no header maps, no body streams. Messages are framed by
//! `Content-Length` only; anything else (chunked bodies, upgrades, answers read to the end of the
//! connection) closes the client's connection. That is enough for an exec of `true`, and is what a
//! gateway could at best do per call: it still reads every request's head, so it could authorise it.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The most headers a head may have.
const MAX_HEADERS: usize = 32;
/// The most bytes one message (head and body) may have.
const MAX_MESSAGE: usize = 1 << 20;

/// Why a message cannot be proxied.
#[derive(Debug, PartialEq, Eq)]
pub enum Framing {
    /// The head is not HTTP/1.1, or too long.
    Malformed,
    /// The message is not framed by `Content-Length` (chunked, upgraded, or read to the end).
    Unsupported,
}

/// The length of the first complete message in `buffer`, head and `Content-Length` body, or `None`
/// while more bytes are needed (pure). `response` selects which kind of head is parsed.
pub fn message_length(buffer: &[u8], response: bool) -> Result<Option<usize>, Framing> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let parsed = if response {
        httparse::Response::new(&mut headers).parse(buffer)
    } else {
        httparse::Request::new(&mut headers).parse(buffer)
    };
    let head = match parsed {
        Ok(httparse::Status::Complete(head)) => head,
        Ok(httparse::Status::Partial) if buffer.len() < MAX_MESSAGE => return Ok(None),
        Ok(httparse::Status::Partial) | Err(_) => return Err(Framing::Malformed),
    };
    let mut body = None;
    for header in headers.iter().take_while(|h| !h.name.is_empty()) {
        if header.name.eq_ignore_ascii_case("transfer-encoding")
            || header.name.eq_ignore_ascii_case("upgrade")
        {
            return Err(Framing::Unsupported);
        }
        if header.name.eq_ignore_ascii_case("content-length") {
            let length = std::str::from_utf8(header.value)
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok())
                .ok_or(Framing::Malformed)?;
            body = Some(length);
        }
    }
    let body = match body {
        Some(length) => length,
        // A request without a length has no body; an answer without one runs to the end.
        None if !response => 0,
        None => return Err(Framing::Unsupported),
    };
    let total = head.checked_add(body).ok_or(Framing::Malformed)?;
    if total > MAX_MESSAGE {
        return Err(Framing::Malformed);
    }
    Ok((buffer.len() >= total).then_some(total))
}

/// Reads from `stream` into `buffer` until it holds one whole message; returns its length, or
/// `None` if the stream ended before any byte of one.
async fn read_message(
    stream: &mut TcpStream,
    buffer: &mut Vec<u8>,
    response: bool,
) -> io::Result<Option<usize>> {
    loop {
        if !buffer.is_empty() {
            match message_length(buffer, response) {
                Ok(Some(length)) => return Ok(Some(length)),
                Ok(None) => {}
                Err(framing) => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("{framing:?}"),
                    ));
                }
            }
        }
        if stream.read_buf(buffer).await? == 0 {
            return if buffer.is_empty() {
                Ok(None)
            } else {
                Err(io::ErrorKind::UnexpectedEof.into())
            };
        }
    }
}

/// Idle connections to the upstream, shared by every client connection.
#[derive(Clone, Default)]
pub struct Pool(Arc<Mutex<Vec<TcpStream>>>);

impl Pool {
    fn take(&self) -> Option<TcpStream> {
        self.0.lock().ok()?.pop()
    }

    fn give_back(&self, stream: TcpStream) {
        if let Ok(mut idle) = self.0.lock() {
            idle.push(stream);
        }
    }
}

/// Sends `request` to `upstream` and reads its answer into `answer`, on a pooled connection if one is
/// idle (once more on a new one if that pooled connection turns out closed before it answered) and
/// returns the connection to the pool after a whole answer. Returns the answer's length.
async fn exchange(
    request: &[u8],
    upstream: SocketAddr,
    pool: &Pool,
    answer: &mut Vec<u8>,
) -> io::Result<usize> {
    if let Some(mut agent) = pool.take() {
        answer.clear();
        // Sent again on a new connection only if the pooled one was closed before any byte of an
        // answer came back.
        let answered = match agent.write_all(request).await {
            Ok(()) => read_message(&mut agent, answer, true).await?,
            Err(_) => None,
        };
        if let Some(length) = answered {
            if answer.len() == length {
                pool.give_back(agent);
            }
            return Ok(length);
        }
    }
    answer.clear();
    let mut agent = TcpStream::connect(upstream).await?;
    agent.set_nodelay(true)?;
    agent.write_all(request).await?;
    let length = read_message(&mut agent, answer, true)
        .await?
        .ok_or(io::ErrorKind::UnexpectedEof)?;
    // Bytes beyond the answer (none from a well-behaved upstream) would belong to nothing.
    if answer.len() == length {
        pool.give_back(agent);
    }
    Ok(length)
}

/// Serves one client connection: each request, in order, to `upstream` and its answer back, until the
/// client closes it or a message cannot be proxied.
pub async fn serve_connection(
    mut client: TcpStream,
    upstream: SocketAddr,
    pool: Pool,
) -> io::Result<()> {
    client.set_nodelay(true)?;
    let (mut request, mut answer) = (Vec::with_capacity(4096), Vec::with_capacity(4096));
    while let Some(length) = read_message(&mut client, &mut request, false).await? {
        let answered = exchange(&request[..length], upstream, &pool, &mut answer).await?;
        client.write_all(&answer[..answered]).await?;
        request.drain(..length);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_whole_with_its_content_length_body() {
        let request = b"POST /v1/exec HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n\r\nbody";
        assert_eq!(message_length(request, false), Ok(Some(request.len())));
        assert_eq!(
            message_length(&request[..request.len() - 1], false),
            Ok(None)
        );
        assert_eq!(message_length(&request[..10], false), Ok(None));
        let get = b"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET";
        assert_eq!(message_length(get, false), Ok(Some(get.len() - 3)));
    }

    #[test]
    fn answers_need_a_length_and_other_framing_is_refused() {
        let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}";
        assert_eq!(message_length(answer, true), Ok(Some(answer.len())));
        let to_the_end = b"HTTP/1.1 200 OK\r\n\r\n{}";
        assert_eq!(message_length(to_the_end, true), Err(Framing::Unsupported));
        let chunked = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert_eq!(message_length(chunked, false), Err(Framing::Unsupported));
        let bad_length = b"POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n";
        assert_eq!(message_length(bad_length, false), Err(Framing::Malformed));
        assert_eq!(
            message_length(b"\x00\x01 nonsense\r\n\r\n", false),
            Err(Framing::Malformed)
        );
    }

    /// An upstream that answers every request with its body, and closes each connection after
    /// `per_connection` answers, so the proxy must find a pooled connection closed.
    async fn echo_upstream(per_connection: usize) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buffer = Vec::new();
                    for _ in 0..per_connection {
                        let Ok(Some(length)) = read_message(&mut stream, &mut buffer, false).await
                        else {
                            return;
                        };
                        let body_at = buffer
                            .windows(4)
                            .position(|w| w == b"\r\n\r\n")
                            .expect("a head")
                            + 4;
                        let body = buffer[body_at..length].to_vec();
                        let head =
                            format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len());
                        let _ = stream.write_all(&[head.as_bytes(), &body].concat()).await;
                        buffer.drain(..length);
                    }
                });
            }
        });
        address
    }

    #[tokio::test]
    async fn requests_are_answered_in_order_and_closed_pooled_connections_replaced() {
        let upstream = echo_upstream(2).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let proxy = listener.local_addr().expect("address");
        let pool = Pool::default();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(serve_connection(client, upstream, pool.clone()));
            }
        });
        let mut client = TcpStream::connect(proxy).await.expect("connect");
        let mut buffer = Vec::new();
        for call in 0..5 {
            let body = format!("call {call}");
            let request = format!(
                "POST /x HTTP/1.1\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            client.write_all(request.as_bytes()).await.expect("send");
            let length = read_message(&mut client, &mut buffer, true)
                .await
                .expect("answer")
                .expect("an answer");
            assert!(buffer[..length].ends_with(body.as_bytes()), "call {call}");
            buffer.drain(..length);
        }
        let chunked = b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
        client.write_all(chunked).await.expect("send");
        let mut rest = Vec::new();
        client.read_to_end(&mut rest).await.expect("closed");
        assert!(
            rest.is_empty(),
            "a message it cannot frame closes the connection"
        );
    }
}
