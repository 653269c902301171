//! Prometheus metrics of the receiver, served on `--metrics-addr`.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::OnceLock;

use prometheus::{Encoder, IntCounter, IntCounterVec, IntGauge, Opts, Registry, TextEncoder};

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

/// The process-wide metrics.
pub fn metrics() -> &'static Metrics {
    static M: OnceLock<Metrics> = OnceLock::new();
    M.get_or_init(|| {
        let registry = Registry::new_custom(Some("wirerate_receiver".into()), None)
            .expect("static registry prefix is valid");
        let counter = |name: &str, help: &str| {
            let c = IntCounter::new(name, help).expect("static metric definition is valid");
            registry
                .register(Box::new(c.clone()))
                .expect("metric registered once");
            c
        };
        let sessions_active = IntGauge::new("sessions_active", "Sessions open now").expect("valid");
        registry
            .register(Box::new(sessions_active.clone()))
            .expect("registered once");
        let rejected = IntCounterVec::new(
            Opts::new(
                "connections_rejected_total",
                "Connections refused, by reason",
            ),
            &["reason"],
        )
        .expect("valid");
        registry
            .register(Box::new(rejected.clone()))
            .expect("registered once");
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

/// Serves `/metrics` on `addr` from a background thread.
pub fn serve(addr: &str) -> crate::Result<std::net::SocketAddr> {
    let listener = TcpListener::bind(addr)
        .map_err(|e| crate::Error::Config(format!("cannot serve metrics on {addr}: {e}")))?;
    let local = listener
        .local_addr()
        .map_err(|e| crate::Error::net("metrics listener", e))?;
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            for conn in listener.incoming().flatten() {
                let _ = conn.set_read_timeout(Some(std::time::Duration::from_secs(5)));
                let mut line = String::new();
                let mut r = BufReader::new(&conn);
                if r.read_line(&mut line).is_err() {
                    continue;
                }
                let (status, body) = if line.starts_with("GET /metrics") {
                    let mut buf = Vec::new();
                    let _ = TextEncoder::new().encode(&metrics().registry.gather(), &mut buf);
                    ("200 OK", buf)
                } else if line.starts_with("GET /health") {
                    ("200 OK", b"ok\n".to_vec())
                } else {
                    ("404 Not Found", b"try /metrics\n".to_vec())
                };
                let mut w = &conn;
                let _ = write!(
                    w,
                    "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = w.write_all(&body);
            }
        })
        .map_err(|e| crate::Error::io("starting the metrics thread", e))?;
    Ok(local)
}
