//! The endpoint as a scraper, a kubelet and an admin reach it: real
//! sockets, a real subscriber.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use wirerate_telemetry::{Endpoints, init_logs, serve};

async fn request(addr: SocketAddr, head: &str, body: &str) -> (u16, String) {
    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "{head} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    c.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(10), c.read_to_string(&mut out))
        .await
        .unwrap()
        .unwrap();
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = out.split("\r\n\r\n").nth(1).unwrap_or("").to_owned();
    (status, body)
}

/// A filter's directives in a stable order (the filter prints its own).
fn directives(filter: &str) -> Vec<String> {
    let mut d: Vec<String> = filter.trim().split(',').map(str::to_owned).collect();
    d.sort();
    d
}

// One test: the log subscriber is global to the process.
#[tokio::test(flavor = "current_thread")]
async fn metrics_health_readiness_and_the_log_level() {
    let log = init_logs("info,kube=warn");
    let endpoints = Endpoints::new(|| b"wirerate_up 1\n".to_vec()).with_log_level(log.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(serve(listener, endpoints.clone()));

    assert_eq!(
        request(addr, "GET /metrics", "").await,
        (200, "wirerate_up 1\n".into())
    );
    assert_eq!(request(addr, "GET /healthz", "").await.0, 200);
    assert_eq!(
        request(addr, "GET /readyz", "").await.0,
        503,
        "not ready until told"
    );
    endpoints.set_ready(true);
    assert_eq!(request(addr, "GET /readyz", "").await.0, 200);

    let (status, body) = request(addr, "GET /loglevel", "").await;
    assert_eq!(
        (status, directives(&body)),
        (200, directives("info,kube=warn"))
    );
    assert!(!tracing::enabled!(tracing::Level::DEBUG));
    let (status, body) = request(addr, "PUT /loglevel", "debug,kube=info").await;
    assert_eq!(status, 200, "{body}");
    assert!(
        tracing::enabled!(tracing::Level::DEBUG),
        "the new level is in effect"
    );
    assert_eq!(directives(&log.get()), directives("debug,kube=info"));

    // Refused, and nothing changes.
    let (status, body) = request(addr, "PUT /loglevel", "debug,kube=[").await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("is not a log filter"), "{body}");
    let (status, _) = request(addr, "PUT /loglevel", &"x".repeat(4096)).await;
    assert_eq!(status, 413);
    assert_eq!(directives(&log.get()), directives("debug,kube=info"));

    assert_eq!(request(addr, "POST /metrics", "").await.0, 404);
    server.abort();
}

#[tokio::test(flavor = "current_thread")]
async fn a_process_without_a_log_handle_says_so() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(serve(listener, Endpoints::new(Vec::new)));
    let (status, body) = request(addr, "PUT /loglevel", "trace").await;
    assert_eq!(status, 404);
    assert!(body.contains("does not change its log level"), "{body}");
    server.abort();
}
