//! Prometheus metrics of the receiver (`wirerate_receiver_*`) and of the
//! sender (`wirerate_sender_*`), served together on `--metrics-addr` (and
//! on the in-cluster agent's metrics port).

use std::net::SocketAddr;
use std::sync::OnceLock;

use prometheus::core::Collector;
use prometheus::{
    Encoder, GaugeVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};
use wirerate_engine::compress::Reason;
use wirerate_engine::observe::SessionEnd;
use wirerate_telemetry::Endpoints;

/// The agent's metrics.
pub struct Metrics {
    /// Registry holding everything below.
    pub registry: Registry,
    /// Payload bytes written to disk.
    pub bytes_written: IntCounter,
    /// Blocks written to disk.
    pub blocks_written: IntCounter,
    /// Payload bytes of memory-to-memory tests, verified and dropped.
    pub bytes_discarded: IntCounter,
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
    /// Connections authenticated, by what sealed them.
    pub connections: IntCounterVec,
    /// Connections closed because the sender broke the protocol, by kind.
    pub violations: IntCounterVec,
    /// Packed blocks that did not unpack, by codec.
    pub unpack_failures: IntCounterVec,
}

/// A registry whose names all start with `prefix`.
fn registry(prefix: &str) -> Registry {
    Registry::new_custom(Some(prefix.into()), None).expect("static registry prefix is valid")
}

/// Registers `collectors` in `registry`: each set registers exactly what its
/// `collectors()` lists, so what is served and what the reference documents
/// are one list.
fn register_all(registry: &Registry, collectors: Vec<Box<dyn Collector>>) {
    for c in collectors {
        registry.register(c).expect("metric registered once");
    }
}

fn counter(name: &str, help: &str) -> IntCounter {
    IntCounter::new(name, help).expect("valid")
}

fn counter_vec(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    IntCounterVec::new(Opts::new(name, help), labels).expect("valid")
}

fn gauge_vec(name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    GaugeVec::new(Opts::new(name, help), labels).expect("valid")
}

fn int_gauge_vec(name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    IntGaugeVec::new(Opts::new(name, help), labels).expect("valid")
}

/// Prefix of the receiver's metrics.
pub const RECEIVER_PREFIX: &str = "wirerate_receiver";
/// Prefix of the sender's metrics.
pub const SENDER_PREFIX: &str = "wirerate_sender";
/// Prefix of the path tests' metrics.
pub const PATH_TEST_PREFIX: &str = "wirerate_path_test";

impl Metrics {
    fn new() -> Self {
        let m = Self {
            registry: registry(RECEIVER_PREFIX),
            bytes_written: counter("bytes_written_total", "Payload bytes written to disk"),
            blocks_written: counter("blocks_written_total", "Blocks written to disk"),
            bytes_discarded: counter(
                "bytes_discarded_total",
                "Payload bytes of memory-to-memory tests, verified and dropped",
            ),
            checksum_failures: counter("checksum_failures_total", "Blocks that arrived damaged"),
            sessions: counter("sessions_total", "Sessions opened"),
            sessions_active: IntGauge::new("sessions_active", "Sessions open now").expect("valid"),
            files_completed: counter("files_completed_total", "Files verified and published"),
            files_failed: counter("files_failed_total", "Files that failed"),
            rejected: counter_vec(
                "connections_rejected_total",
                "Connections refused, by reason",
                &["reason"],
            ),
            connections: counter_vec(
                "connections_total",
                "Connections authenticated, by what sealed them: none, tls-userspace (TLS sealed in the agent) or tls-kernel (kTLS)",
                &["encryption"],
            ),
            violations: counter_vec(
                "violations_total",
                "Connections closed because the sender broke the protocol, by kind",
                &["kind"],
            ),
            unpack_failures: counter_vec(
                "unpack_failures_total",
                "Packed blocks that did not unpack (also counted as checksum failures), by codec",
                &["codec"],
            ),
        };
        register_all(&m.registry, m.collectors());
        m
    }

    /// Everything this set registers, in the order it is served.
    pub fn collectors(&self) -> Vec<Box<dyn Collector>> {
        vec![
            Box::new(self.sessions_active.clone()),
            Box::new(self.rejected.clone()),
            Box::new(self.connections.clone()),
            Box::new(self.violations.clone()),
            Box::new(self.bytes_written.clone()),
            Box::new(self.blocks_written.clone()),
            Box::new(self.bytes_discarded.clone()),
            Box::new(self.checksum_failures.clone()),
            Box::new(self.unpack_failures.clone()),
            Box::new(self.sessions.clone()),
            Box::new(self.files_completed.clone()),
            Box::new(self.files_failed.clone()),
        ]
    }
}

/// The process-wide metrics.
pub fn metrics() -> &'static Metrics {
    static M: OnceLock<Metrics> = OnceLock::new();
    M.get_or_init(Metrics::new)
}

/// The sending side's metrics.
pub struct SenderMetrics {
    /// Registry holding everything below.
    pub registry: Registry,
    /// Payload bytes sent, counted plain (resends included).
    pub bytes_sent: IntCounter,
    /// Blocks sent again (damaged in flight, or on a stream that broke).
    pub blocks_resent: IntCounter,
    /// Data streams that broke.
    pub stream_failures: IntCounter,
    /// Connections authenticated, by what sealed them.
    pub connections: IntCounterVec,
    /// Data streams the optimizer added to running transfers.
    pub streams_added: IntCounter,
    /// Sessions by how they ended: `complete`, `retried` (failed with an
    /// error worth reconnecting for), `failed`.
    pub sessions: IntCounterVec,
    /// Bytes sent and not yet acknowledged, all sessions together.
    pub bytes_in_flight: IntGauge,
    /// Payload bytes by data stream index, for per-stream throughput.
    pub stream_bytes: IntCounterVec,
    /// Each data stream's smoothed round trip, as its last session ended.
    pub stream_rtt_seconds: GaugeVec,
    /// Segments each data stream's connection sent again, as its last
    /// session ended.
    pub stream_retransmits: IntGaugeVec,
    /// The kernel's delivery-rate estimate of each data stream, bytes per
    /// second, as its last session ended.
    pub stream_delivery_rate: IntGaugeVec,
    /// Plain bytes of the blocks that went packed, by codec.
    pub packed_bytes: IntCounterVec,
    /// What those blocks took on the wire, by codec.
    pub packed_wire_bytes: IntCounterVec,
    /// 1 for why packing is on or off in the latest send, 0 for the rest.
    pub compression: IntGaugeVec,
}

impl SenderMetrics {
    fn new() -> Self {
        let m = Self {
            registry: registry(SENDER_PREFIX),
            bytes_in_flight: IntGauge::new(
                "bytes_in_flight",
                "Bytes sent and not yet acknowledged",
            )
            .expect("valid"),
            stream_rtt_seconds: gauge_vec(
                "stream_rtt_seconds",
                "Smoothed round trip of each data stream (TCP_INFO), as its session ended",
                &["stream"],
            ),
            sessions: counter_vec("sessions_total", "Sessions by how they ended", &["outcome"]),
            bytes_sent: counter(
                "bytes_sent_total",
                "Payload bytes sent, counted plain (packed_wire_bytes_total has what packed blocks took)",
            ),
            blocks_resent: counter("blocks_resent_total", "Blocks sent again"),
            stream_failures: counter("stream_failures_total", "Data streams that broke"),
            connections: counter_vec(
                "connections_total",
                "Connections authenticated, by what sealed them: none, tls-userspace (TLS sealed in the agent) or tls-kernel (kTLS)",
                &["encryption"],
            ),
            streams_added: counter(
                "streams_added_total",
                "Data streams the optimizer added to running transfers",
            ),
            stream_bytes: counter_vec(
                "stream_bytes_total",
                "Payload bytes by data stream index",
                &["stream"],
            ),
            stream_retransmits: int_gauge_vec(
                "stream_retransmits",
                "Segments each data stream sent again (TCP_INFO), as its session ended",
                &["stream"],
            ),
            stream_delivery_rate: int_gauge_vec(
                "stream_delivery_rate_bytes",
                "The kernel's delivery-rate estimate of each data stream, bytes/s, as its session ended",
                &["stream"],
            ),
            packed_bytes: counter_vec(
                "packed_bytes_total",
                "Plain bytes of the blocks that went packed, by codec",
                &["codec"],
            ),
            packed_wire_bytes: counter_vec(
                "packed_wire_bytes_total",
                "What the blocks that went packed took on the wire, by codec",
                &["codec"],
            ),
            compression: int_gauge_vec(
                "compression",
                &format!(
                    "1 for why packing is on or off in the latest send ({}), 0 for the rest",
                    Reason::ALL.map(Reason::metric_label).join(", ")
                ),
                &["reason"],
            ),
        };
        for o in SessionEnd::ALL {
            m.sessions.with_label_values(&[o.metric_label()]);
        }
        register_all(&m.registry, m.collectors());
        m
    }

    /// Everything this set registers, in the order it is served.
    pub fn collectors(&self) -> Vec<Box<dyn Collector>> {
        vec![
            Box::new(self.bytes_in_flight.clone()),
            Box::new(self.stream_rtt_seconds.clone()),
            Box::new(self.sessions.clone()),
            Box::new(self.bytes_sent.clone()),
            Box::new(self.blocks_resent.clone()),
            Box::new(self.stream_failures.clone()),
            Box::new(self.connections.clone()),
            Box::new(self.streams_added.clone()),
            Box::new(self.stream_bytes.clone()),
            Box::new(self.stream_retransmits.clone()),
            Box::new(self.stream_delivery_rate.clone()),
            Box::new(self.packed_bytes.clone()),
            Box::new(self.packed_wire_bytes.clone()),
            Box::new(self.compression.clone()),
        ]
    }
}

/// The process-wide sender metrics.
pub fn sender_metrics() -> &'static SenderMetrics {
    static M: OnceLock<SenderMetrics> = OnceLock::new();
    M.get_or_init(SenderMetrics::new)
}

/// Metrics of the in-cluster agent's path tests (`wirerate_path_test_*`),
/// one series per target pool (at most `MAX_PATH_TEST_TARGETS`).
pub struct PathTestMetrics {
    /// Registry holding everything below.
    pub registry: Registry,
    /// Tests by target and outcome (`ok`, `failed`).
    pub tests: IntCounterVec,
    /// The last good test's rate with several streams, Gbit/s.
    pub gbps: GaugeVec,
    /// The last good test's rate with one stream, Gbit/s.
    pub single_stream_gbps: GaugeVec,
    /// The lowest round trip the last good test saw, seconds.
    pub rtt_seconds: GaugeVec,
    /// Segments the last good test's streams sent again.
    pub retransmits: IntGaugeVec,
    /// When the last test ended, failed or not (Unix seconds).
    pub last_timestamp_seconds: GaugeVec,
    /// Sessions the pool's path-test listener served, which the
    /// receiver's `sessions_total` does not count.
    pub listener_sessions: IntCounter,
    /// Sessions the path-test listener serves now.
    pub listener_sessions_active: IntGauge,
}

impl PathTestMetrics {
    fn new() -> Self {
        let m = Self {
            registry: registry(PATH_TEST_PREFIX),
            tests: counter_vec(
                "tests_total",
                "Path tests by target pool and outcome",
                &["target", "outcome"],
            ),
            gbps: gauge_vec(
                "gbps",
                "The last good test's rate with several streams, Gbit/s",
                &["target"],
            ),
            single_stream_gbps: gauge_vec(
                "single_stream_gbps",
                "The last good test's rate with one stream, Gbit/s",
                &["target"],
            ),
            rtt_seconds: gauge_vec(
                "rtt_seconds",
                "The lowest round trip the last good test saw",
                &["target"],
            ),
            retransmits: int_gauge_vec(
                "retransmits",
                "Segments the last good test's streams sent again",
                &["target"],
            ),
            last_timestamp_seconds: gauge_vec(
                "last_timestamp_seconds",
                "When the last test ended, failed or not (Unix seconds)",
                &["target"],
            ),
            listener_sessions: counter(
                "listener_sessions_total",
                "Test sessions this agent's path-test listener served",
            ),
            listener_sessions_active: IntGauge::new(
                "listener_sessions_active",
                "Test sessions this agent's path-test listener serves now",
            )
            .expect("valid"),
        };
        register_all(&m.registry, m.collectors());
        m
    }

    /// Everything this set registers, in the order it is served.
    pub fn collectors(&self) -> Vec<Box<dyn Collector>> {
        vec![
            Box::new(self.tests.clone()),
            Box::new(self.gbps.clone()),
            Box::new(self.single_stream_gbps.clone()),
            Box::new(self.rtt_seconds.clone()),
            Box::new(self.retransmits.clone()),
            Box::new(self.last_timestamp_seconds.clone()),
            Box::new(self.listener_sessions.clone()),
            Box::new(self.listener_sessions_active.clone()),
        ]
    }
}

/// The process-wide path-test metrics.
pub fn path_test_metrics() -> &'static PathTestMetrics {
    static M: OnceLock<PathTestMetrics> = OnceLock::new();
    M.get_or_init(PathTestMetrics::new)
}

/// What /metrics serves, set by set: each registry's name prefix and the
/// collectors it was filled from (vectors included before they have a
/// series, which a registry's `gather` leaves out). The metrics reference
/// in docs/ is written from this.
pub fn catalogue() -> Vec<(&'static str, Vec<Box<dyn Collector>>)> {
    vec![
        (RECEIVER_PREFIX, metrics().collectors()),
        (SENDER_PREFIX, sender_metrics().collectors()),
        (PATH_TEST_PREFIX, path_test_metrics().collectors()),
    ]
}

/// Everything the agent serves on /metrics, in Prometheus' text format.
pub fn render() -> Vec<u8> {
    let mut families = metrics().registry.gather();
    families.extend(sender_metrics().registry.gather());
    families.extend(path_test_metrics().registry.gather());
    let mut buf = Vec::new();
    let _ = TextEncoder::new().encode(&families, &mut buf);
    buf
}

/// What the agent serves about itself: its metrics; not ready until the
/// caller says so (the receiver once it listens, cluster mode once it runs).
pub fn endpoints() -> Endpoints {
    Endpoints::new(render)
}

/// Serves the agent's metrics, health and readiness on `addr` from a
/// background thread (see `wirerate_telemetry` for the bounds), ready at
/// once.
pub fn serve(addr: &str) -> wirerate_engine::Result<SocketAddr> {
    let e = endpoints();
    e.set_ready(true);
    serve_endpoints(addr, e)
}

/// Serves `endpoints` on `addr` from a background thread.
pub fn serve_endpoints(addr: &str, endpoints: Endpoints) -> wirerate_engine::Result<SocketAddr> {
    wirerate_telemetry::serve_in_thread(addr, endpoints).map_err(|cause| {
        // A port taken is not a bad setting; an address that does not
        // parse is.
        match (addr.parse(), cause.raw_os_error()) {
            (Ok(addr), Some(libc::EADDRINUSE | libc::EADDRNOTAVAIL | libc::EACCES)) => {
                wirerate_engine::Error::Listen { addr, cause }
            }
            _ => wirerate_engine::Error::Config(format!("cannot serve metrics on {addr}: {cause}")),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metrics_port_in_use_is_not_called_an_invalid_setting() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        let e = serve(&addr.to_string()).unwrap_err();
        assert!(matches!(e, wirerate_engine::Error::Listen { .. }), "{e}");
        assert!(
            e.to_string()
                .contains("another process listens on this port"),
            "{e}"
        );
    }
}
