//! Prometheus metrics of the operator.

use prometheus::core::Collector;
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
    /// Current rate of each transfer on the wire, by namespace and name.
    pub transfer_rate: IntGaugeVec,
    /// Seconds left of each running transfer at its current rate.
    pub transfer_eta: IntGaugeVec,
    /// Bytes each running transfer holds durably at the receiver.
    pub transfer_done: IntGaugeVec,
    /// Agents by pool and state (`live`, `lost`).
    pub agents: IntGaugeVec,
    /// Writes that waited for their turn in the write budget.
    pub write_waits: IntCounter,
    /// Refreshes (places in line, stall marks) put off so changes go first.
    pub refreshes_put_off: IntCounter,
}

/// Prefix of every metric the operator serves.
pub const PREFIX: &str = "wirerate_operator";

/// The controllers, as the `controller` label spells them.
pub const CONTROLLERS: [&str; 2] = ["transfer", "dtnpool"];
/// Every value of the `error` label (`Error::metric_label`).
pub const ERROR_LABELS: [&str; 5] = [
    "kube",
    "cleanup_pending",
    "finalizer",
    "malformed",
    "crds_missing",
];

impl Default for Metrics {
    fn default() -> Self {
        let registry = Registry::new_custom(Some(PREFIX.into()), None).expect("a valid prefix");
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
        let per_transfer = |name: &str, help: &str| {
            IntGaugeVec::new(Opts::new(name, help), &["namespace", "transfer"]).unwrap()
        };
        let transfer_rate = per_transfer(
            "transfer_rate_bytes_per_second",
            "Current rate of each running transfer, as its agents report it",
        );
        let transfer_eta = per_transfer(
            "transfer_eta_seconds",
            "Seconds left of each running transfer at its current rate",
        );
        let transfer_done = per_transfer(
            "transfer_bytes_done",
            "Bytes of each running transfer a resume would keep",
        );
        let agents = IntGaugeVec::new(
            Opts::new("agents", "Agents by pool and state (live or lost)"),
            &["namespace", "pool", "state"],
        )
        .unwrap();
        let write_waits = IntCounter::new(
            "write_waits_total",
            "Writes that waited for their turn under --max-writes-per-second",
        )
        .unwrap();
        let refreshes_put_off = IntCounter::new(
            "refreshes_put_off_total",
            "Status refreshes (places in line, stall marks) put off so that changes go first",
        )
        .unwrap();
        // Every controller's series exist from the start, at 0, so that
        // dashboards and rate() see the first reconcile and the first error.
        for p in wirerate_crds::TransferPhase::ALL {
            phases.with_label_values(&[p.as_str()]);
        }
        for c in CONTROLLERS {
            reconciles.with_label_values(&[c]);
            duration.with_label_values(&[c]);
            for e in ERROR_LABELS {
                failures.with_label_values(&[c, e]);
            }
        }
        let m = Self {
            registry,
            reconciles,
            failures,
            duration,
            plan,
            phases,
            queue,
            bytes,
            failovers,
            transfer_rate,
            transfer_eta,
            transfer_done,
            agents,
            write_waits,
            refreshes_put_off,
        };
        for c in m.collectors() {
            m.registry.register(c).expect("metric names are unique");
        }
        m
    }
}

impl Metrics {
    /// Everything the registry holds: it is filled from this list, and the
    /// metrics reference in docs/ is written from it (vectors included
    /// before they have a series, which `Registry::gather` leaves out).
    pub fn collectors(&self) -> Vec<Box<dyn Collector>> {
        vec![
            Box::new(self.reconciles.clone()),
            Box::new(self.failures.clone()),
            Box::new(self.duration.clone()),
            Box::new(self.plan.clone()),
            Box::new(self.phases.clone()),
            Box::new(self.queue.clone()),
            Box::new(self.bytes.clone()),
            Box::new(self.failovers.clone()),
            Box::new(self.transfer_rate.clone()),
            Box::new(self.transfer_eta.clone()),
            Box::new(self.transfer_done.clone()),
            Box::new(self.agents.clone()),
            Box::new(self.write_waits.clone()),
            Box::new(self.refreshes_put_off.clone()),
        ]
    }

    /// Sets the gauges from the cache: transfers by phase, the queues, each
    /// running transfer's rate, ETA and bytes, and agents by state.
    pub fn observe<'a>(
        &self,
        transfers: impl IntoIterator<Item = &'a wirerate_crds::Transfer> + Clone,
        agents: impl IntoIterator<Item = &'a crate::agents::Agent>,
    ) {
        let (by_phase, queues) = tally(transfers.clone());
        for p in wirerate_crds::TransferPhase::ALL {
            self.phases
                .with_label_values(&[p.as_str()])
                .set(by_phase.get(&p).copied().unwrap_or(0));
        }
        self.queue.reset();
        for ((ns, pool_ns, pool), n) in queues {
            self.queue.with_label_values(&[&ns, &pool_ns, &pool]).set(n);
        }
        for g in [&self.transfer_rate, &self.transfer_eta, &self.transfer_done] {
            g.reset();
        }
        for (ns, name, rate, eta, done) in running(transfers) {
            self.transfer_rate
                .with_label_values(&[&ns, &name])
                .set(rate);
            self.transfer_done
                .with_label_values(&[&ns, &name])
                .set(done);
            if let Some(eta) = eta {
                self.transfer_eta.with_label_values(&[&ns, &name]).set(eta);
            }
        }
        self.agents.reset();
        for ((ns, pool, state), n) in agent_states(agents) {
            self.agents.with_label_values(&[&ns, &pool, state]).set(n);
        }
    }

    /// The metrics in Prometheus' text format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        prometheus::TextEncoder::new()
            .encode_utf8(&self.registry.gather(), &mut out)
            .expect("text encoding cannot fail");
        out
    }
}

/// A running transfer's figures: (namespace, name, rate in bytes/s,
/// seconds left, bytes done).
pub type Running = (String, String, i64, Option<i64>, i64);

/// The transfers running or verifying, with their progress.
pub fn running<'a>(
    transfers: impl IntoIterator<Item = &'a wirerate_crds::Transfer>,
) -> Vec<Running> {
    use wirerate_crds::TransferPhase;
    transfers
        .into_iter()
        .filter_map(|t| {
            let s = t.status.as_ref()?;
            if !matches!(
                s.phase,
                Some(TransferPhase::Running | TransferPhase::Verifying)
            ) {
                return None;
            }
            let p = s.progress.as_ref().filter(|p| p.attempt == s.attempt)?;
            Some((
                t.metadata.namespace.clone().unwrap_or_default(),
                t.metadata.name.clone().unwrap_or_default(),
                p.rate_bps,
                p.eta_seconds,
                p.bytes_done,
            ))
        })
        .collect()
}

/// Agents by (namespace, pool) and whether live.
pub fn agent_states<'a>(
    agents: impl IntoIterator<Item = &'a crate::agents::Agent>,
) -> std::collections::BTreeMap<(String, String, &'static str), i64> {
    let mut out = std::collections::BTreeMap::new();
    for a in agents {
        let state = if a.live() { "live" } else { "lost" };
        *out.entry((a.namespace.clone(), a.pool.clone(), state))
            .or_default() += 1;
    }
    out
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

    /// The metric names the dashboard's queries read, by prefix.
    pub(crate) fn dashboard_names(prefix: &str) -> Vec<String> {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../charts/wirerate/dashboards/wirerate.json"
        );
        let d: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let mut names = Vec::new();
        for panel in d["panels"].as_array().unwrap() {
            for t in panel["targets"].as_array().unwrap() {
                let expr = t["expr"].as_str().unwrap();
                let mut rest = expr;
                while let Some(i) = rest.find(prefix) {
                    let name: String = rest[i..]
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    rest = &rest[i + name.len()..];
                    if !names.contains(&name) {
                        names.push(name);
                    }
                }
            }
        }
        names
    }

    #[tokio::test]
    async fn every_operator_metric_the_dashboard_queries_is_served() {
        use crate::agents::{from_lease, tests::lease};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let wanted = dashboard_names("wirerate_operator_");
        assert!(wanted.len() >= 8, "{wanted:?}");

        // A cluster with a running, a queued transfer and two agents.
        let mut run = transfer("run", "/in/a", "/out/a");
        run.status = Some(TransferStatus {
            phase: Some(TransferPhase::Running),
            attempt: 1,
            progress: Some(wirerate_crds::transfer::Progress {
                attempt: 1,
                bytes_done: 1 << 30,
                bytes_total: 4 << 30,
                bytes_written: None,
                blocks_done: 64,
                blocks_total: 256,
                percent: "25%".into(),
                rate_bps: 1_000_000_000,
                rate: "8.00 Gbit/s".into(),
                eta_seconds: Some(3),
                updated_at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::from_second(100).unwrap(),
                ),
            }),
            ..Default::default()
        });
        let mut queued = transfer("q", "/in/b", "/out/b");
        queued.status = Some(TransferStatus {
            phase: Some(TransferPhase::Queued),
            ..Default::default()
        });
        let now = k8s_openapi::jiff::Timestamp::from_second(101).unwrap();
        let agents = [("src", "s0", 100), ("dst", "r0", 10)].map(|(pool, name, renewed)| {
            from_lease(
                &lease(pool, name, renewed, None),
                &Default::default(),
                now,
                None,
            )
            .unwrap()
        });
        let m = std::sync::Arc::new(Metrics::default());
        m.observe([&run, &queued], agents.iter());

        // The operator's own endpoint, as Prometheus scrapes it.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let served = m.clone();
        let server = tokio::spawn(wirerate_telemetry::serve(
            listener,
            wirerate_telemetry::Endpoints::new(move || served.render().into_bytes()),
        ));
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut body = String::new();
        c.read_to_string(&mut body).await.unwrap();
        server.abort();
        assert!(body.starts_with("HTTP/1.1 200"), "{body}");
        let served: Vec<&str> = body
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split(['{', ' ']).next())
            .collect();
        let missing: Vec<&String> = wanted
            .iter()
            .filter(|n| !served.contains(&n.as_str()))
            .collect();
        assert!(
            missing.is_empty(),
            "the dashboard queries {missing:?}, not served:\n{body}"
        );
        assert!(body.contains(
            "wirerate_operator_transfer_eta_seconds{namespace=\"data\",transfer=\"run\"} 3"
        ));
        assert!(body.contains("state=\"lost\""), "r0's Lease is 91 s old");
    }
}
