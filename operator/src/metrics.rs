//! Prometheus metrics of the operator.

use prometheus::{
    HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry,
};

/// The operator's metrics, registered in one registry.
#[derive(Clone)]
pub struct Metrics {
    /// Registry to serve.
    pub registry: Registry,
    /// Reconciles by controller.
    pub reconciles: IntCounterVec,
    /// Failed reconciles by controller and error label.
    pub failures: IntCounterVec,
    /// Reconcile duration by controller.
    pub duration: HistogramVec,
    /// Transfers by phase.
    pub phases: IntGaugeVec,
    /// Transfers waiting for agents, by sending pool.
    pub queue: IntGaugeVec,
    /// Bytes of transfers that succeeded.
    pub bytes: IntCounter,
    /// Failovers performed.
    pub failovers: IntCounter,
}

impl Default for Metrics {
    fn default() -> Self {
        let registry =
            Registry::new_custom(Some("wirerate_operator".into()), None).expect("a valid prefix");
        let reconciles =
            IntCounterVec::new(Opts::new("reconciles_total", "Reconciles"), &["controller"])
                .unwrap();
        let failures = IntCounterVec::new(
            Opts::new("reconcile_errors_total", "Failed reconciles"),
            &["controller", "error"],
        )
        .unwrap();
        let duration = HistogramVec::new(
            HistogramOpts::new("reconcile_duration_seconds", "Reconcile duration")
                .buckets(vec![0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0]),
            &["controller"],
        )
        .unwrap();
        let phases =
            IntGaugeVec::new(Opts::new("transfers", "Transfers by phase"), &["phase"]).unwrap();
        let queue = IntGaugeVec::new(
            Opts::new("queue_length", "Transfers waiting for agents"),
            &["pool"],
        )
        .unwrap();
        let bytes =
            IntCounter::new("bytes_moved_total", "Bytes of transfers that succeeded").unwrap();
        let failovers =
            IntCounter::new("failovers_total", "Transfers reassigned after a lost agent").unwrap();
        for c in [
            Box::new(reconciles.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(failures.clone()),
            Box::new(duration.clone()),
            Box::new(phases.clone()),
            Box::new(queue.clone()),
            Box::new(bytes.clone()),
            Box::new(failovers.clone()),
        ] {
            registry.register(c).expect("metric names are unique");
        }
        Self {
            registry,
            reconciles,
            failures,
            duration,
            phases,
            queue,
            bytes,
            failovers,
        }
    }
}

impl Metrics {
    /// The metrics in Prometheus' text format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        prometheus::TextEncoder::new()
            .encode_utf8(&self.registry.gather(), &mut out)
            .expect("text encoding cannot fail");
        out
    }
}
