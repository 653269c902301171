//! The metrics reference, written from the collectors each registry is
//! filled from. A registry's `gather` leaves out a vector with no series
//! yet (every `connections_rejected_total{reason}` before the first refusal)
//! and names no labels of its own, so each collector is asked directly: its
//! `desc()` for the name, help and label names, its `collect()` for the type.

use std::fmt::Write as _;

use prometheus::core::Collector;
use prometheus::proto::MetricType;

use crate::markdown::{cell, code};

/// One binary's metrics: which binary, where it serves them, and its
/// registries (a name prefix and the collectors registered under it).
pub struct Set {
    /// The binary.
    pub binary: &'static str,
    /// Where it serves them.
    pub served: &'static str,
    /// Each registry's prefix and collectors.
    pub registries: Vec<(&'static str, Vec<Box<dyn Collector>>)>,
}

/// The agent's and the operator's metrics.
pub fn sets() -> Vec<Set> {
    let operator = wirerate_operator::metrics::Metrics::default();
    vec![
        Set {
            binary: "wirerate-agent",
            served: "on `serve --metrics-addr` and, in a cluster, on its pool's \
                     `metricsPort`; the path-test results are set only in a cluster",
            registries: wirerate_agent::metrics::catalogue(),
        },
        Set {
            binary: "wirerate-operator",
            served: "on `--metrics-addr` (port 8080, Service `wirerate-operator-metrics`)",
            registries: vec![(wirerate_operator::metrics::PREFIX, operator.collectors())],
        },
    ]
}

/// One metric as the reference lists it.
#[derive(Debug, PartialEq)]
pub struct Metric {
    /// Its full name, prefix included.
    pub name: String,
    /// counter, gauge, histogram, ...
    pub kind: &'static str,
    /// Its label names.
    pub labels: Vec<String>,
    /// Its help text.
    pub help: String,
}

/// The metrics `collectors` serve under `prefix`, sorted by name as
/// /metrics serves them.
pub fn describe(prefix: &str, collectors: &[Box<dyn Collector>]) -> Vec<Metric> {
    let mut out = Vec::new();
    for c in collectors {
        let families = c.collect();
        for desc in c.desc() {
            let kind = families
                .iter()
                .find(|f| f.name() == desc.fq_name)
                .map(|f| kind(f.get_field_type()))
                .unwrap_or("untyped");
            out.push(Metric {
                name: format!("{prefix}_{}", desc.fq_name),
                kind,
                labels: desc.variable_labels.clone(),
                help: desc.help.clone(),
            });
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

fn kind(t: MetricType) -> &'static str {
    match t {
        MetricType::COUNTER => "counter",
        MetricType::GAUGE => "gauge",
        MetricType::HISTOGRAM => "histogram",
        MetricType::SUMMARY => "summary",
        MetricType::UNTYPED => "untyped",
    }
}

/// The whole page.
pub fn page(sets: &[Set]) -> String {
    let mut out = format!(
        "# Metrics\n\n{}\n\nEvery metric the binaries serve on `/metrics`, in \
         Prometheus' text format. Where they come from and what reads them \
         (the ServiceMonitor, the Grafana dashboard) is in \
         [Observability](../admin/observability.md).\n",
        crate::GENERATED
    );
    for set in sets {
        let _ = write!(out, "\n## {}\n\nServed {}.\n", set.binary, set.served);
        for (prefix, collectors) in &set.registries {
            let _ = write!(
                out,
                "\n### {prefix}_*\n\n| metric | type | labels | meaning |\n|---|---|---|---|\n"
            );
            for m in describe(prefix, collectors) {
                let labels: Vec<String> = m.labels.iter().map(|l| code(l)).collect();
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} |",
                    code(&m.name),
                    m.kind,
                    labels.join(", "),
                    cell(&m.help)
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vector_with_no_series_yet_is_listed_with_its_labels() {
        let agent = &sets()[0];
        let all: Vec<Metric> = agent
            .registries
            .iter()
            .flat_map(|(p, c)| describe(p, c))
            .collect();
        let rejected = all
            .iter()
            .find(|m| m.name == "wirerate_receiver_connections_rejected_total")
            .expect("listed");
        assert_eq!(rejected.kind, "counter");
        assert_eq!(rejected.labels, ["reason"]);
    }

    #[test]
    fn every_family_the_operator_serves_is_listed() {
        let m = wirerate_operator::metrics::Metrics::default();
        let listed: Vec<String> = describe(wirerate_operator::metrics::PREFIX, &m.collectors())
            .into_iter()
            .map(|m| m.name)
            .collect();
        let served = m.registry.gather();
        assert!(!served.is_empty());
        for f in served {
            assert!(listed.contains(&f.name().to_string()), "{}", f.name());
        }
        assert!(listed.contains(&"wirerate_operator_reconcile_duration_seconds".to_string()));
    }

    #[test]
    fn every_family_the_agent_serves_is_listed() {
        let page = page(&sets());
        let text = String::from_utf8(wirerate_agent::metrics::render()).unwrap();
        let served: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split(' ').next())
            .collect();
        assert!(!served.is_empty());
        for name in served {
            assert!(page.contains(&format!("`{name}`")), "{name} is not listed");
        }
    }
}
