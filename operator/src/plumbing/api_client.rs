//! The operator's Kubernetes client: kube's own stack (TLS, the configured credentials, extra headers,
//! kube's retry of 429/503/504, the connect/read/write time-outs), with one difference: pooled
//! connections are dropped after [`POOL_IDLE_TIMEOUT`] instead of hyper's default 90 s.
//!
//! kube-apiserver closes a keep-alive connection after 90 s idle (`IdleTimeout` of its HTTP server).
//! With the same 90 s on the client, a request sent at that moment goes out on a connection the server
//! is closing, and fails with a transport error (`SendRequest`) that nothing may safely repeat for a
//! write. bench-scale saw it: five gateway calls failed at once at the start of a burst after about 90 s
//! idle. A client that forgets idle connections well before the server does never reuses one the
//! server is about to close.
//!
//! kube builds its client with the pool's defaults and has no setting for this; kube's `ConfigExt`
//! gives the pieces, and [`client_builder`] puts them together the way kube's
//! `ClientBuilder::try_from(Config)` does. With a proxy configured (`proxy_url`), kube's own builder
//! is used unchanged: it knows the proxy protocols, and such set-ups are not ours to second-guess.

use std::time::Duration;

use hyper_timeout::TimeoutConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::api::Api;
use kube::client::retry::RetryPolicy;
use kube::client::{Body, ClientBuilder, ConfigExt, DynBody};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use tower::retry::RetryLayer;
use tower::util::BoxService;
use tower::{BoxError, ServiceBuilder, ServiceExt};

/// How long a connection may sit idle in the pool before it is dropped: well under kube-apiserver's
/// 90 s, so that the client, not the server, ends idle connections.
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(45);

/// The service a kube `Client` is built on (kube's `GenericService`).
pub type ClientService = BoxService<hyper::Request<Body>, hyper::Response<Box<DynBody>>, BoxError>;

/// A kube client builder for `config` whose connection pool drops connections idle for
/// `idle_timeout` (the operator passes [`POOL_IDLE_TIMEOUT`]).
pub fn client_builder(
    config: &kube::Config,
    idle_timeout: Duration,
) -> Result<ClientBuilder<ClientService>, kube::Error> {
    if config.proxy_url.is_some() {
        return ClientBuilder::try_from(config.clone());
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    let mut connector = TimeoutConnector::new(config.rustls_https_connector_with_connector(http)?);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let pool: hyper_util::client::legacy::Client<_, Body> =
        hyper_util::client::legacy::Builder::new(TokioExecutor::new())
            .pool_idle_timeout(idle_timeout)
            .pool_timer(TokioTimer::new())
            .build(connector);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| RetryLayer::new(RetryPolicy::server_retry())),
        )
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(pool)
        .map_response(|response| {
            response.map(|body| {
                Box::new(http_body_util::BodyExt::map_err(body, BoxError::from)) as Box<DynBody>
            })
        })
        .boxed();
    Ok(ClientBuilder::new(
        service,
        config.default_namespace.clone(),
    ))
}

/// An `Api` over every namespace, or over the one the operator is told to watch.
pub fn scoped_api<K>(client: &Client, namespace: &str) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    if namespace.is_empty() {
        Api::all(client.clone())
    } else {
        Api::namespaced(client.clone(), namespace)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use k8s_openapi::api::core::v1::ConfigMap;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// A plain-HTTP stand-in for kube-apiserver that answers every request with one ConfigMap, keeps
    /// connections alive, and counts the connections it accepted.
    async fn counting_server() -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let accepted = Arc::new(AtomicUsize::new(0));
        let counter = accepted.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                counter.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buffer = vec![0u8; 16 * 1024];
                    let body = r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c","namespace":"default"}}"#;
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    // One GET without a body per read is enough for these tests.
                    while let Ok(read) = socket.read(&mut buffer).await {
                        if read == 0 || socket.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (url, accepted)
    }

    fn config(url: &str) -> kube::Config {
        kube::Config::new(url.parse().unwrap())
    }

    async fn get(client: &kube::Client) {
        let api: kube::Api<ConfigMap> = kube::Api::namespaced(client.clone(), "default");
        api.get("c").await.unwrap();
    }

    #[tokio::test]
    async fn keep_alive_connections_are_reused_while_fresh() {
        let (url, accepted) = counting_server().await;
        let client = client_builder(&config(&url), Duration::from_secs(30))
            .unwrap()
            .build();
        get(&client).await;
        get(&client).await;
        get(&client).await;
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_connection_idle_longer_than_the_timeout_is_not_reused() {
        let (url, accepted) = counting_server().await;
        let client = client_builder(&config(&url), Duration::from_millis(100))
            .unwrap()
            .build();
        get(&client).await;
        tokio::time::sleep(Duration::from_millis(400)).await;
        get(&client).await;
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }
}
