//! What the operator last wrote of each Transfer (its status fields and
//! assignment labels), laid over a cache copy that does not show it yet.
//!
//! A reconcile works from the watch cache, which lags the operator's own
//! writes by one watch event. Against a real API server with 100 agents
//! reporting, a Transfer's next look often came before its last write was
//! back: it saw the Transfer still waiting, worked out "Running" again
//! with a new `startTime`, wrote it, and the look after that put the first
//! one back, three status writes where one would do, and two label
//! patches. Only the operator writes these fields (agents write theirs
//! under their own field managers), so a cache copy whose operator fields
//! differ from the last ones written, shortly after the write, is a copy
//! from before it. After [`FRESH`] the cache is trusted again, so a field
//! someone else forced is seen and put right at the next look.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use kube::ResourceExt as _;
use wirerate_crds::{Transfer, TransferStatus, contract};

use crate::lifecycle::operator_fields;

/// How long a write stands in for the cache: far longer than a watch
/// event takes on a loaded API server, short enough that a change someone
/// else forced onto the operator's fields is not hidden for long.
pub const FRESH: Duration = Duration::from_secs(10);

/// What was written of one Transfer, and when.
#[derive(Debug, Clone)]
struct Written {
    status: TransferStatus,
    labels: BTreeMap<String, String>,
    at: Instant,
}

/// The last writes, by Transfer uid.
#[derive(Debug, Default)]
pub struct LastWritten {
    by_uid: HashMap<String, Written>,
    /// Whether the operator's finalizer was last added (true) or removed,
    /// and when.
    held: HashMap<String, (bool, Instant)>,
}

/// The operator's assignment labels on `t` (the `wirerate.io/` ones).
pub fn operator_labels(t: &Transfer) -> BTreeMap<String, String> {
    t.labels()
        .iter()
        .filter(|(k, _)| contract::operator_label(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

impl LastWritten {
    /// The operator wrote `status` (its fields of it) and `labels` to the
    /// Transfer `uid` at `now`.
    pub fn record(
        &mut self,
        uid: &str,
        status: &TransferStatus,
        labels: BTreeMap<String, String>,
        now: Instant,
    ) {
        self.by_uid
            .retain(|_, w| now.saturating_duration_since(w.at) < FRESH);
        self.by_uid.insert(
            uid.to_owned(),
            Written {
                status: operator_fields(status),
                labels,
                at: now,
            },
        );
    }

    /// The operator added (`held`) or removed its finalizer on the
    /// Transfer `uid` at `now`. A look from a copy that still showed it
    /// after its removal tried to remove it again: a JSON patch whose test
    /// failed (422) and a read, twice for every finished Transfer.
    pub fn record_hold(&mut self, uid: &str, held: bool, now: Instant) {
        self.held
            .retain(|_, (_, at)| now.saturating_duration_since(*at) < FRESH);
        self.held.insert(uid.to_owned(), (held, now));
    }

    /// `t` with the operator's last write laid over, if that write is
    /// recent and `t` does not show it: the agents' fields stay as `t` has
    /// them.
    pub fn over(&self, t: Transfer, now: Instant) -> Transfer {
        let t = self.finalizer_over(t, now);
        let Some(w) = t.metadata.uid.as_deref().and_then(|u| self.by_uid.get(u)) else {
            return t;
        };
        if now.saturating_duration_since(w.at) >= FRESH {
            return t;
        }
        let mut t = t;
        let cached = t.status.clone().unwrap_or_default();
        if operator_fields(&cached) != w.status {
            t.status = Some(TransferStatus {
                progress: cached.progress,
                striping: cached.striping,
                tuning: cached.tuning,
                stripes: cached.stripes,
                reports: cached.reports,
                ..w.status.clone()
            });
        }
        if operator_labels(&t) != w.labels {
            let labels = t.labels_mut();
            labels.retain(|k, _| !contract::operator_label(k));
            labels.extend(w.labels.clone());
        }
        t
    }

    fn finalizer_over(&self, mut t: Transfer, now: Instant) -> Transfer {
        let Some(&(held, at)) = t.metadata.uid.as_deref().and_then(|u| self.held.get(u)) else {
            return t;
        };
        if now.saturating_duration_since(at) >= FRESH {
            return t;
        }
        let ours = contract::TRANSFER_FINALIZER;
        let shown = t.finalizers().iter().any(|f| f == ours);
        if held && !shown {
            t.finalizers_mut().push(ours.to_owned());
        } else if !held && shown {
            t.finalizers_mut().retain(|f| f != ours);
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wirerate_crds::TransferPhase;
    use wirerate_crds::transfer::{AgentReport, ReportState, Role};

    fn transfer(uid: &str) -> Transfer {
        let mut t = crate::validate::tests::transfer("x", "/in/a", "/out/x");
        t.metadata.uid = Some(uid.into());
        t
    }

    fn running() -> TransferStatus {
        TransferStatus {
            phase: Some(TransferPhase::Running),
            attempt: 1,
            ..Default::default()
        }
    }

    #[test]
    fn a_copy_from_before_a_recent_write_shows_it_with_the_agents_fields_kept() {
        let now = Instant::now();
        let mut w = LastWritten::default();
        let labels = BTreeMap::from([("wirerate.io/sender".to_owned(), "s0".to_owned())]);
        w.record("u1", &running(), labels.clone(), now);
        let mut stale = transfer("u1");
        let report = AgentReport {
            role: Role::Receiver,
            agent: "r0".into(),
            attempt: 1,
            state: ReportState::Running,
            message: String::new(),
            endpoint: None,
            updated_at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ),
        };
        stale.status = Some(TransferStatus {
            reports: vec![report.clone()],
            ..Default::default()
        });
        let seen = w.over(stale.clone(), now + Duration::from_secs(1));
        let s = seen.status.clone().unwrap();
        assert_eq!(s.phase, Some(TransferPhase::Running));
        assert_eq!(s.reports, vec![report]);
        assert_eq!(operator_labels(&seen), labels);
        // Not for another Transfer, and not once the write is old.
        let other = w.over(transfer("u2"), now);
        assert_eq!(other.status, None);
        let late = w.over(stale, now + FRESH);
        assert_eq!(late.status.unwrap().phase, None);
    }

    #[test]
    fn a_finalizer_removed_a_moment_ago_is_not_shown_by_an_older_copy() {
        let now = Instant::now();
        let mut w = LastWritten::default();
        let mut stale = transfer("u1");
        stale.metadata.finalizers = Some(vec![
            "someone.else/x".into(),
            contract::TRANSFER_FINALIZER.into(),
        ]);
        w.record_hold("u1", false, now);
        assert_eq!(w.over(stale.clone(), now).finalizers(), ["someone.else/x"]);
        assert_eq!(w.over(stale.clone(), now + FRESH).finalizers().len(), 2);
        w.record_hold("u1", true, now);
        let mut none = transfer("u1");
        none.metadata.finalizers = None;
        assert_eq!(
            w.over(none, now).finalizers(),
            [contract::TRANSFER_FINALIZER]
        );
    }
}
