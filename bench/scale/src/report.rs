//! The figures of one run: a table for people, each figure beside its
//! target, and the same as JSON.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::observer::Violations;

/// Latencies, in seconds.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct Latency {
    pub(crate) count: usize,
    pub(crate) p50: Option<f64>,
    pub(crate) p99: Option<f64>,
    pub(crate) max: Option<f64>,
}

impl Latency {
    /// Nearest-rank percentiles of `secs`.
    pub(crate) fn of(mut secs: Vec<f64>) -> Self {
        secs.sort_by(f64::total_cmp);
        let at = |q: f64| -> Option<f64> {
            if secs.is_empty() {
                return None;
            }
            let rank = ((q * secs.len() as f64).ceil() as usize).clamp(1, secs.len());
            Some(secs[rank - 1])
        };
        Self {
            count: secs.len(),
            p50: at(0.5),
            p99: at(0.99),
            max: secs.last().copied(),
        }
    }
}

/// What was run.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct Setup {
    pub(crate) api: String,
    pub(crate) operator: String,
    pub(crate) agents: usize,
    pub(crate) pools: usize,
    pub(crate) capacity: i32,
    pub(crate) slots: usize,
    pub(crate) transfers: usize,
    pub(crate) namespaces: usize,
    pub(crate) rest_seconds: u64,
    pub(crate) refill: usize,
    pub(crate) kills: usize,
    pub(crate) cores: usize,
}

/// Phase 1: the Transfers arrive.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct Schedule {
    pub(crate) created: usize,
    pub(crate) create_seconds: f64,
    pub(crate) creates_per_second: f64,
    /// From the last create until every Transfer had a phase; None if not
    /// within the timeout.
    pub(crate) all_phased_seconds: Option<f64>,
    /// Transfers with a phase when the phase ended.
    pub(crate) phased: usize,
    /// Transfers left Pending (an invalid scenario).
    pub(crate) pending: usize,
    /// From the last create until every slot was taken.
    pub(crate) slots_filled_seconds: Option<f64>,
    pub(crate) running: usize,
    pub(crate) first_status: Latency,
    pub(crate) operator_cpu_seconds: Option<f64>,
    /// The operator's writes from the first create until every Transfer
    /// had a phase and every slot was taken (double only).
    pub(crate) operator_writes: Option<u64>,
    pub(crate) writes_per_transfer: Option<f64>,
    /// The same per second of that window.
    pub(crate) writes_per_second: Option<f64>,
    /// The API server's processes (`--server-pid`) over the same window,
    /// as % of one core.
    pub(crate) server_cpu_percent: Option<f64>,
}

/// Phase 2: nothing changes but the Lease renewals.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct Rest {
    pub(crate) seconds: f64,
    /// From the end of phase 1 until the operator's writes stopped (rest
    /// starts then).
    pub(crate) settled_after_seconds: f64,
    pub(crate) operator_cpu_percent: Option<f64>,
    /// Requests per second the operator made (the double counts them).
    pub(crate) operator_requests_per_second: Option<f64>,
    /// The same by verb.
    pub(crate) operator_requests_by_verb: BTreeMap<String, f64>,
    /// The same by "verb resource".
    pub(crate) operator_requests_by_resource: BTreeMap<String, f64>,
    /// Transfer status writes per second.
    pub(crate) status_writes_per_second: Option<f64>,
    /// All the operator's writes per second (double only).
    pub(crate) writes_per_second: Option<f64>,
    pub(crate) reconciles_per_second: Option<f64>,
    pub(crate) rss_mib: Option<f64>,
    pub(crate) peak_rss_mib: Option<f64>,
    /// CPU of the bench process itself (the double, the agents, the
    /// observer) over the same window, sharing the machine's cores.
    pub(crate) bench_cpu_percent: Option<f64>,
    /// The API server's processes (`--server-pid`), % of one core.
    pub(crate) server_cpu_percent: Option<f64>,
    /// Real agents' processes together (`--agent-binary`), % of one core.
    pub(crate) agents_cpu_percent: Option<f64>,
}

/// Phase 3: Transfers end and free their slots.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct Refill {
    pub(crate) finished: usize,
    /// New assignments waited for (at most the Transfers still queued).
    pub(crate) target: usize,
    pub(crate) reports_seconds: f64,
    /// From the first report until `target` more were Running.
    pub(crate) refill_seconds: Option<f64>,
    /// From the first report until the finished ones were Succeeded.
    pub(crate) succeeded_seconds: Option<f64>,
    pub(crate) newly_running: usize,
}

/// The operator's own reconcile figures (its /metrics).
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct Reconcile {
    pub(crate) transfer_reconciles: f64,
    pub(crate) pool_reconciles: f64,
    pub(crate) errors: f64,
    pub(crate) p50_seconds: Option<f64>,
    pub(crate) p99_seconds: Option<f64>,
    /// The quantile is past the last bucket: the figure is a lower bound.
    pub(crate) p50_at_least: bool,
    pub(crate) p99_at_least: bool,
    pub(crate) note: String,
}

/// What must hold whatever the speed.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct Correctness {
    pub(crate) capacity_overruns: Violations,
    pub(crate) double_assignments: Violations,
    pub(crate) priority_inversions: Violations,
    pub(crate) lost: Vec<String>,
    pub(crate) failed: Vec<String>,
    pub(crate) operator_crashed: Option<String>,
    /// Real agents (`--agent-binary`) that exited during the run.
    pub(crate) agents_exited: Vec<String>,
    pub(crate) create_errors: Vec<String>,
    pub(crate) failovers: usize,
    pub(crate) peak_agent_load: i32,
    pub(crate) observer_relists: usize,
    pub(crate) lease_renewals: u64,
    pub(crate) lease_renewal_failures: u64,
    pub(crate) operator_starts: usize,
    /// No overrun, no double assignment, nothing lost or failed, no crash.
    pub(crate) ok: bool,
}

/// A figure against its target.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Target {
    pub(crate) name: String,
    pub(crate) value: Option<f64>,
    pub(crate) unit: String,
    /// Upper bound.
    pub(crate) target: f64,
    pub(crate) pass: bool,
}

/// One run.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct Report {
    pub(crate) setup: Setup,
    pub(crate) schedule: Schedule,
    pub(crate) rest: Option<Rest>,
    pub(crate) refill: Option<Refill>,
    pub(crate) reconcile: Reconcile,
    /// Every request the operator made, `verb resource` -> count (double only).
    pub(crate) operator_requests: Option<BTreeMap<String, u64>>,
    pub(crate) correctness: Correctness,
    pub(crate) targets: Vec<Target>,
    pub(crate) notes: Vec<String>,
}

impl Report {
    /// Fills `targets` from the figures.
    pub(crate) fn judge(&mut self) {
        let slots = self.refill.as_ref().map_or(0, |r| r.target);
        let t = |name: String, value: Option<f64>, unit: &str, target: f64| Target {
            pass: value.is_some_and(|v| v <= target),
            name,
            value,
            unit: unit.to_owned(),
            target,
        };
        self.targets = vec![
            t(
                "all Queued or Running after the last create".into(),
                self.schedule.all_phased_seconds,
                "s",
                10.0,
            ),
            t(
                "a new Transfer's first status, p99".into(),
                self.schedule.first_status.p99,
                "s",
                1.0,
            ),
            t(
                "operator CPU at rest".into(),
                self.rest.as_ref().and_then(|r| r.operator_cpu_percent),
                "% of a core",
                // Strictly below 5%: a bound of 4.999.. reads as "< 5".
                5.0 - 1e-9,
            ),
            t(
                format!("refill of {slots} slots"),
                self.refill.as_ref().and_then(|r| r.refill_seconds),
                "s",
                5.0,
            ),
        ];
    }

    /// The table for a terminal.
    pub(crate) fn table(&self) -> String {
        let mut o = String::new();
        let s = &self.setup;
        let _ = writeln!(
            o,
            "wirerate-scale: {} agents in {} pools (capacity {}, {} slots), {} Transfers in {} namespaces, {}; {} cores",
            s.agents, s.pools, s.capacity, s.slots, s.transfers, s.namespaces, s.api, s.cores
        );
        let _ = writeln!(o, "operator: {}", s.operator);
        let _ = writeln!(
            o,
            "{:<52} {:>16}  {:<14} result",
            "figure", "value", "target"
        );
        let row = |o: &mut String, name: &str, value: String, target: &str, result: &str| {
            let _ = writeln!(o, "{name:<52} {value:>22}  {target:<14} {result}");
        };
        let secs = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.2} s"));
        for t in &self.targets {
            let value = match t.value {
                Some(v) if t.unit == "s" => format!("{v:.2} s"),
                Some(v) => format!("{v:.1} %"),
                None => "not reached".into(),
            };
            let target = if t.unit == "s" {
                format!("<= {} s", t.target)
            } else {
                "< 5 %".to_owned()
            };
            row(
                &mut o,
                &t.name,
                value,
                &target,
                if t.pass { "PASS" } else { "MISS" },
            );
        }
        let sc = &self.schedule;
        row(
            &mut o,
            "  first status p50 / max",
            format!(
                "{} / {}",
                secs(sc.first_status.p50),
                secs(sc.first_status.max)
            ),
            "",
            "",
        );
        row(
            &mut o,
            &format!("creates ({} Transfers)", sc.created),
            format!("{:.2} s", sc.create_seconds),
            "",
            &format!("{:.0}/s", sc.creates_per_second),
        );
        row(
            &mut o,
            "operator writes per Transfer, creates until phased",
            sc.writes_per_transfer
                .map_or("not counted".into(), |v| format!("{v:.1}")),
            "",
            &sc.writes_per_second
                .map_or(String::new(), |v| format!("{v:.1}/s")),
        );
        if let Some(v) = sc.server_cpu_percent {
            row(
                &mut o,
                "API server CPU, creates until phased (--server-pid)",
                format!("{v:.1} %"),
                "",
                "",
            );
        }
        row(
            &mut o,
            "every slot taken, after the last create",
            secs(sc.slots_filled_seconds),
            "",
            &format!("{} running", sc.running),
        );
        if let Some(r) = &self.rest {
            let per_s = |v: Option<f64>| v.map_or("n/a".to_owned(), |v| format!("{v:.1} /s"));
            row(
                &mut o,
                "operator writes settled, after phase 1",
                format!("{:.2} s", r.settled_after_seconds),
                "",
                "",
            );
            row(
                &mut o,
                "operator API requests at rest",
                per_s(r.operator_requests_per_second),
                "",
                "",
            );
            if !r.operator_requests_by_verb.is_empty() {
                let by: Vec<String> = r
                    .operator_requests_by_verb
                    .iter()
                    .map(|(k, v)| format!("{k} {v:.1}"))
                    .collect();
                let _ = writeln!(o, "    by verb, /s: {}", by.join(", "));
            }
            row(
                &mut o,
                "  operator writes at rest",
                per_s(r.writes_per_second),
                "",
                "",
            );
            row(
                &mut o,
                "  Transfer status writes at rest",
                per_s(r.status_writes_per_second),
                "",
                "",
            );
            row(
                &mut o,
                "  reconciles at rest",
                per_s(r.reconciles_per_second),
                "",
                "",
            );
            row(
                &mut o,
                "operator memory, RSS / peak",
                match (r.rss_mib, r.peak_rss_mib) {
                    (Some(a), Some(b)) => format!("{a:.0} / {b:.0} MiB"),
                    _ => "-".into(),
                },
                "",
                "",
            );
            row(
                &mut o,
                "bench process CPU at rest (double, agents)",
                r.bench_cpu_percent
                    .map_or("-".into(), |v| format!("{v:.1} %")),
                "",
                "",
            );
            if let Some(v) = r.agents_cpu_percent {
                row(
                    &mut o,
                    "real agents' CPU at rest, all together",
                    format!("{v:.1} %"),
                    "",
                    "",
                );
            }
            if let Some(v) = r.server_cpu_percent {
                row(
                    &mut o,
                    "API server CPU at rest (--server-pid)",
                    format!("{v:.1} %"),
                    "",
                    "",
                );
            }
        }
        if let Some(r) = &self.refill {
            row(
                &mut o,
                &format!("  refill: {} finished, reports written in", r.finished),
                format!("{:.2} s", r.reports_seconds),
                "",
                &format!("{} newly running", r.newly_running),
            );
            row(
                &mut o,
                "  refill: all finished ones Succeeded",
                secs(r.succeeded_seconds),
                "",
                "",
            );
        }
        let rc = &self.reconcile;
        let bound = |v: Option<f64>, at_least: bool| {
            format!("{}{}", if at_least { ">= " } else { "" }, secs(v))
        };
        row(
            &mut o,
            "Transfer reconcile p50 / p99 (interpolated)",
            format!(
                "{} / {}",
                bound(rc.p50_seconds, rc.p50_at_least),
                bound(rc.p99_seconds, rc.p99_at_least)
            ),
            "",
            "",
        );
        row(
            &mut o,
            "Transfer reconciles / errors",
            format!("{:.0} / {:.0}", rc.transfer_reconciles, rc.errors),
            "",
            "",
        );
        let c = &self.correctness;
        let _ = writeln!(o, "correctness");
        let check = |o: &mut String, name: &str, value: String, ok: bool| {
            row(o, name, value, "", if ok { "PASS" } else { "FAIL" });
        };
        check(
            &mut o,
            "  capacity overruns",
            format!("{} (peak {})", c.capacity_overruns.count, c.peak_agent_load),
            c.capacity_overruns.count == 0,
        );
        check(
            &mut o,
            "  double assignments",
            c.double_assignments.count.to_string(),
            c.double_assignments.count == 0,
        );
        check(
            &mut o,
            "  lost / failed Transfers",
            format!("{} / {}", c.lost.len(), c.failed.len()),
            c.lost.is_empty() && c.failed.is_empty(),
        );
        check(
            &mut o,
            "  operator crashed",
            c.operator_crashed.clone().unwrap_or_else(|| "no".into()),
            c.operator_crashed.is_none(),
        );
        if !c.agents_exited.is_empty() {
            check(
                &mut o,
                "  real agents that exited",
                c.agents_exited.len().to_string(),
                false,
            );
            for line in c.agents_exited.iter().take(5) {
                let _ = writeln!(o, "    {line}");
            }
        }
        if !c.failed.is_empty() {
            let _ = writeln!(
                o,
                "    failed: {}",
                c.failed
                    .iter()
                    .take(5)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        check(
            &mut o,
            "  priority inversions (reported, not in exit code)",
            c.priority_inversions.count.to_string(),
            c.priority_inversions.count == 0,
        );
        let _ = writeln!(
            o,
            "  failovers {}, operator starts {}, lease renewals {} ({} failed), observer relists {}",
            c.failovers,
            c.operator_starts,
            c.lease_renewals,
            c.lease_renewal_failures,
            c.observer_relists
        );
        for v in [
            &c.capacity_overruns,
            &c.double_assignments,
            &c.priority_inversions,
        ] {
            for line in v.first.iter().take(5) {
                let _ = writeln!(o, "    {line}");
            }
        }
        for e in c.create_errors.iter().take(5) {
            let _ = writeln!(o, "    create: {e}");
        }
        for n in &self.notes {
            let _ = writeln!(o, "note: {n}");
        }
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let l = Latency::of((1..=100).map(f64::from).collect());
        assert_eq!((l.p50, l.p99, l.max), (Some(50.0), Some(99.0), Some(100.0)));
        assert_eq!(Latency::of(vec![]).p99, None);
    }

    #[test]
    fn targets_pass_at_or_under_and_miss_when_not_reached() {
        let mut r = Report::default();
        r.schedule.all_phased_seconds = Some(10.0);
        r.schedule.first_status = Latency::of(vec![2.0]);
        r.rest = Some(Rest {
            operator_cpu_percent: Some(5.0),
            ..Rest::default()
        });
        r.judge();
        let pass: Vec<bool> = r.targets.iter().map(|t| t.pass).collect();
        assert_eq!(pass, [true, false, false, false]);
        assert!(r.table().contains("MISS"));
    }
}
