//! Prometheus metrics of the operator.

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry,
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
    /// Time to compute one plan of the whole cluster.
    pub plan: Histogram,
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
            HistogramOpts::new("reconcile_duration_seconds", "Reconcile duration").buckets(vec![
                0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ]),
            &["controller"],
        )
        .unwrap();
        let plan = Histogram::with_opts(
            HistogramOpts::new(
                "plan_duration_seconds",
                "Time to compute one scheduling plan of the whole cluster",
            )
            .buckets(vec![0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5]),
        )
        .unwrap();
        let phases =
            IntGaugeVec::new(Opts::new("transfers", "Transfers by phase"), &["phase"]).unwrap();
        let queue = IntGaugeVec::new(
            Opts::new(
                "queue_length",
                "Transfers waiting for agents, by their namespace and sending pool",
            ),
            &["namespace", "pool_namespace", "pool"],
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
            Box::new(plan.clone()),
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
            plan,
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

/// Queued Transfers by (their namespace, sending pool's namespace, sending pool).
pub type Queues = std::collections::BTreeMap<(String, String, String), i64>;

/// Transfers by phase, and the queues: read off the statuses, so the gauges
/// cost one pass over the cache and never a scheduling decision.
pub fn tally<'a>(
    transfers: impl IntoIterator<Item = &'a wirerate_crds::Transfer>,
) -> (
    std::collections::HashMap<wirerate_crds::TransferPhase, i64>,
    Queues,
) {
    use wirerate_crds::TransferPhase;
    use wirerate_crds::transfer::Role;
    let mut phases = std::collections::HashMap::new();
    let mut queues = std::collections::BTreeMap::new();
    for t in transfers {
        let phase = t.status.as_ref().and_then(|s| s.phase).unwrap_or_default();
        *phases.entry(phase).or_default() += 1;
        if phase == TransferPhase::Queued {
            let ns = t.metadata.namespace.clone().unwrap_or_default();
            let pool_ns = t
                .pool_namespace(Role::Sender)
                .unwrap_or_default()
                .to_owned();
            *queues
                .entry((ns, pool_ns, t.spec.source.pool.clone()))
                .or_default() += 1;
        }
    }
    (phases, queues)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::tests::transfer;
    use wirerate_crds::{TransferPhase, TransferStatus};

    // The queue gauge had only a pool label: two namespaces' queues on one
    // pool were one number.
    #[test]
    fn queues_are_counted_per_namespace_and_pool() {
        let queued = |name: &str, ns: &str| {
            let mut t = transfer(name, "/in/a", "/out/a");
            t.metadata.namespace = Some(ns.into());
            t.spec.source.pool_namespace = Some("data".into());
            t.status = Some(TransferStatus {
                phase: Some(TransferPhase::Queued),
                ..Default::default()
            });
            t
        };
        let mut running = transfer("r", "/in/a", "/out/a");
        running.status = Some(TransferStatus {
            phase: Some(TransferPhase::Running),
            ..Default::default()
        });
        let all = [
            queued("a1", "alpha"),
            queued("a2", "alpha"),
            queued("b1", "beta"),
            running,
        ];
        let (phases, queues) = tally(&all);
        assert_eq!(phases[&TransferPhase::Queued], 3);
        assert_eq!(phases[&TransferPhase::Running], 1);
        let key = |ns: &str| (ns.to_owned(), "data".to_owned(), "src".to_owned());
        assert_eq!(queues[&key("alpha")], 2);
        assert_eq!(queues[&key("beta")], 1);
        assert_eq!(queues.len(), 2);
        let m = Metrics::default();
        m.queue.with_label_values(&["alpha", "data", "src"]).set(2);
        assert!(m.render().contains("namespace=\"alpha\""));
    }
}
