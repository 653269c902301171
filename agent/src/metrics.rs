//! Prometheus metrics of the receiver (`wirerate_receiver_*`) and of the
//! sender (`wirerate_sender_*`), served together on `--metrics-addr` (and
//! on the in-cluster agent's metrics port).

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus::{Encoder, IntCounter, IntCounterVec, IntGauge, Opts, Registry, TextEncoder};
use tokio::sync::Semaphore;

/// The agent's metrics.
pub struct Metrics {
    /// Registry holding everything below.
    pub registry: Registry,
    /// Payload bytes written to disk.
    pub bytes_written: IntCounter,
    /// Blocks written to disk.
    pub blocks_written: IntCounter,
    /// Blocks whose checksum did not match (and were asked again).
    pub checksum_failures: IntCounter,
    /// Sessions opened.
    pub sessions: IntCounter,
    /// Sessions open now.
    pub sessions_active: IntGauge,
    /// Files published under their final name.
    pub files_completed: IntCounter,
    /// Files that failed.
    pub files_failed: IntCounter,
    /// Connections refused, by reason.
    pub rejected: IntCounterVec,
}

/// `c`, registered in `registry` (names are static and registered once).
fn registered<C: prometheus::core::Collector + Clone + 'static>(registry: &Registry, c: C) -> C {
    registry
        .register(Box::new(c.clone()))
        .expect("metric registered once");
    c
}

/// The process-wide metrics.
pub fn metrics() -> &'static Metrics {
    static M: OnceLock<Metrics> = OnceLock::new();
    M.get_or_init(|| {
        let registry = Registry::new_custom(Some("wirerate_receiver".into()), None)
            .expect("static registry prefix is valid");
        let counter = |name: &str, help: &str| {
            registered(&registry, IntCounter::new(name, help).expect("valid"))
        };
        let sessions_active = registered(
            &registry,
            IntGauge::new("sessions_active", "Sessions open now").expect("valid"),
        );
        let rejected = registered(
            &registry,
            IntCounterVec::new(
                Opts::new(
                    "connections_rejected_total",
                    "Connections refused, by reason",
                ),
                &["reason"],
            )
            .expect("valid"),
        );
        Metrics {
            bytes_written: counter("bytes_written_total", "Payload bytes written to disk"),
            blocks_written: counter("blocks_written_total", "Blocks written to disk"),
            checksum_failures: counter("checksum_failures_total", "Blocks that arrived damaged"),
            sessions: counter("sessions_total", "Sessions opened"),
            files_completed: counter("files_completed_total", "Files verified and published"),
            files_failed: counter("files_failed_total", "Files that failed"),
            sessions_active,
            rejected,
            registry,
        }
    })
}

/// The sending side's metrics.
pub struct SenderMetrics {
    /// Registry holding everything below.
    pub registry: Registry,
    /// Payload bytes put on the wire (resends included).
    pub bytes_sent: IntCounter,
    /// Blocks sent again (damaged in flight, or on a stream that broke).
    pub blocks_resent: IntCounter,
    /// Data streams that broke.
    pub stream_failures: IntCounter,
    /// Sessions by how they ended: `complete`, `retried` (failed with an
    /// error worth reconnecting for), `failed`.
    pub sessions: IntCounterVec,
    /// Bytes sent and not yet acknowledged, all sessions together.
    pub bytes_in_flight: IntGauge,
    /// Payload bytes by data stream index, for per-stream throughput.
    pub stream_bytes: IntCounterVec,
}

/// The sending outcomes, as the `outcome` label spells them.
pub const SEND_OUTCOMES: [&str; 3] = ["complete", "retried", "failed"];

/// The process-wide sender metrics.
pub fn sender_metrics() -> &'static SenderMetrics {
    static M: OnceLock<SenderMetrics> = OnceLock::new();
    M.get_or_init(|| {
        let registry = Registry::new_custom(Some("wirerate_sender".into()), None)
            .expect("static registry prefix is valid");
        let counter = |name: &str, help: &str| {
            registered(&registry, IntCounter::new(name, help).expect("valid"))
        };
        let vec = |name: &str, help: &str, label: &str| {
            registered(
                &registry,
                IntCounterVec::new(Opts::new(name, help), &[label]).expect("valid"),
            )
        };
        let bytes_in_flight = registered(
            &registry,
            IntGauge::new("bytes_in_flight", "Bytes sent and not yet acknowledged").expect("valid"),
        );
        let sessions = vec("sessions_total", "Sessions by how they ended", "outcome");
        for o in SEND_OUTCOMES {
            sessions.with_label_values(&[o]);
        }
        SenderMetrics {
            bytes_sent: counter("bytes_sent_total", "Payload bytes put on the wire"),
            blocks_resent: counter("blocks_resent_total", "Blocks sent again"),
            stream_failures: counter("stream_failures_total", "Data streams that broke"),
            stream_bytes: vec(
                "stream_bytes_total",
                "Payload bytes by data stream index",
                "stream",
            ),
            sessions,
            bytes_in_flight,
            registry,
        }
    })
}

/// Everything the agent serves on /metrics, in Prometheus' text format.
pub fn render() -> Vec<u8> {
    let mut families = metrics().registry.gather();
    families.extend(sender_metrics().registry.gather());
    let mut buf = Vec::new();
    let _ = TextEncoder::new().encode(&families, &mut buf);
    buf
}

/// Scrapes served at once; more are closed at once.
const MAX_SCRAPERS: usize = 64;
/// A request's head must arrive within this...
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// ...and the whole exchange be over within this.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest request head read (hyper's smallest buffer): a longer one is
/// answered 431 and closed.
const MAX_REQUEST: usize = 8192;

/// Serves `/metrics` and `/health` on `addr` from a background thread.
/// Requests are bounded in size and time and served concurrently, so one
/// slow or hostile client cannot stall or bloat the scrapes of others.
pub fn serve(addr: &str) -> crate::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind(addr)
        .map_err(|e| crate::Error::Config(format!("cannot serve metrics on {addr}: {e}")))?;
    let local = listener
        .local_addr()
        .map_err(|e| crate::Error::net("metrics listener", e))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| crate::Error::net("metrics listener", e))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(|e| crate::Error::io("starting the metrics runtime", e))?;
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            runtime.block_on(async move {
                match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => accept(l).await,
                    Err(e) => tracing::error!("metrics listener: {e}"),
                }
            });
        })
        .map_err(|e| crate::Error::io("starting the metrics thread", e))?;
    Ok(local)
}

async fn accept(listener: tokio::net::TcpListener) {
    let slots = Arc::new(Semaphore::new(MAX_SCRAPERS));
    loop {
        let sock = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                // Out of descriptors, say: wait for some to close.
                tracing::debug!("metrics accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
            continue;
        };
        tokio::spawn(async move {
            let _permit = permit;
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEAD_TIMEOUT)
                .max_buf_size(MAX_REQUEST)
                .keep_alive(false)
                .serve_connection(TokioIo::new(sock), service_fn(respond));
            let _ = tokio::time::timeout(EXCHANGE_TIMEOUT, conn).await;
        });
    }
}

async fn respond(
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let (status, body) = match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => (StatusCode::OK, render()),
        (&Method::GET, "/health" | "/healthz") => (StatusCode::OK, b"ok\n".to_vec()),
        _ => (StatusCode::NOT_FOUND, b"try /metrics\n".to_vec()),
    };
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    Ok(resp)
}
