//! What this agent should be running, from the Transfers it can see, and
//! when to report. Pure: tested without a cluster or a clock.

use std::collections::HashSet;
use std::time::Duration;

use wirerate_crds::transfer::{AgentRef, ReportState, Role};
use wirerate_crds::{Transfer, TransferPhase};

/// This agent. Its name alone is not enough: names are unique only within one
/// pool, and a Transfer may use pools of other namespaces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Me {
    /// Namespace of its pool.
    pub namespace: String,
    /// Its pool.
    pub pool: String,
    /// Agent name.
    pub name: String,
}

impl Me {
    /// Whether `who`, holding `role` in `t`, is this agent.
    fn is(&self, t: &Transfer, role: Role, who: &AgentRef) -> bool {
        who.name == self.name
            && who.pool == self.pool
            && t.pool_namespace(role) == Some(self.namespace.as_str())
    }
}

/// One side of one attempt of one Transfer.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct JobKey {
    /// Transfer uid.
    pub uid: String,
    /// Our side.
    pub role: Role,
    /// Attempt number.
    pub attempt: i32,
}

/// A job to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Want {
    /// Identity.
    pub key: JobKey,
    /// Namespace and name of the Transfer.
    pub transfer: (String, String),
    /// For a sender: where the receiver listens, or over several pairs
    /// where each receiver does.
    pub endpoints: Vec<String>,
    /// The agent of each of `endpoints`, as assigned (an external
    /// receiver's address stands for it).
    pub receivers: Vec<String>,
    /// For a sender, over several pairs: who sends each of `endpoints`'
    /// data, a relay's `host:port` or None for the sender itself (see
    /// [`vias`]).
    pub via: Vec<Option<String>>,
    /// For a sender: each relay's endpoint with its agent.
    pub relays: Vec<(String, String)>,
    /// For a sender: every receiver assigned has said where it listens,
    /// and every relay has too or has failed, so a job may start. Over
    /// several pairs a running sender is still wanted while a receiver
    /// that joins (a lost pair's replacement) has not said yet, and takes
    /// in the others.
    pub complete: bool,
}

fn my_report_state(t: &Transfer, me: &Me, key: &JobKey) -> Option<ReportState> {
    t.status
        .as_ref()?
        .reports
        .iter()
        .find(|r| r.role == key.role && r.attempt == key.attempt && r.agent == me.name)
        .map(|r| r.state)
}

/// Where the receivers of `t`'s attempt that said so listen, each with
/// the assigned agent, and whether every one of them has said. One
/// receiver over one pair, each of `status.receivers` over several; an
/// external one's address is in the spec.
fn endpoints(t: &Transfer) -> (Vec<(String, String)>, bool) {
    let Some(s) = t.status.as_ref() else {
        return (Vec::new(), false);
    };
    if let Some(ext) = &t.spec.destination.external {
        return (vec![(ext.address.clone(), ext.address.clone())], true);
    }
    // Reports are kept per agent: only an assigned receiver's counts.
    let said = |who: &AgentRef| {
        s.reports
            .iter()
            .find(|r| r.role == Role::Receiver && r.attempt == s.attempt && r.agent == who.name)
            .and_then(|r| r.endpoint.clone())
            .map(|e| (who.name.clone(), e))
    };
    let assigned: Vec<&AgentRef> = s.receiver.iter().chain(&s.receivers).collect();
    let found: Vec<(String, String)> = assigned.iter().filter_map(|who| said(who)).collect();
    let complete = !found.is_empty() && found.len() == assigned.len();
    (found, complete)
}

/// Where the relays of `t`'s attempt that said so listen, each with its
/// agent, and whether every relay has said or failed (one that failed is
/// left out: it would never say, and the operator drops it).
fn relay_endpoints(t: &Transfer) -> (Vec<(String, String)>, bool) {
    let Some(s) = t.status.as_ref() else {
        return (Vec::new(), true);
    };
    let mut found = Vec::new();
    let mut settled = true;
    for who in &s.relays {
        let said = s
            .reports
            .iter()
            .find(|r| r.role == Role::Relay && r.attempt == s.attempt && r.agent == who.name);
        match said {
            Some(r) if r.state == ReportState::Failed => {}
            Some(r) if r.endpoint.is_some() => {
                found.push((r.endpoint.clone().unwrap_or_default(), who.name.clone()));
            }
            _ => settled = false,
        }
    }
    (found, settled)
}

/// Who sends each of `receivers`' pairs: the first from the sender
/// itself, each next one from the next of `relays` while there are any,
/// the rest from the sender too.
pub fn vias(receivers: usize, relays: &[(String, String)]) -> Vec<Option<String>> {
    (0..receivers)
        .map(|i| {
            i.checked_sub(1)
                .and_then(|k| relays.get(k))
                .map(|(e, _)| e.clone())
        })
        .collect()
}

/// Jobs `me` should run now. A sender starts once every receiver and
/// relay of the same attempt has said where it listens (a relay that
/// failed is not waited for; see `Want::complete`).
pub fn wanted(transfers: &[Transfer], me: &Me) -> Vec<Want> {
    let mut out = Vec::new();
    for t in transfers {
        let Some(s) = &t.status else { continue };
        if t.metadata.deletion_timestamp.is_some()
            || s.phase.is_some_and(|p| p.is_final())
            || s.attempt < 1
        {
            continue;
        }
        let uid = t.metadata.uid.clone().unwrap_or_default();
        let name = (
            t.metadata.namespace.clone().unwrap_or_default(),
            t.metadata.name.clone().unwrap_or_default(),
        );
        for (role, _) in s.occupied().filter(|(role, who)| me.is(t, *role, who)) {
            let key = JobKey {
                uid: uid.clone(),
                role,
                attempt: s.attempt,
            };
            if matches!(
                my_report_state(t, me, &key),
                Some(ReportState::Succeeded | ReportState::Failed | ReportState::Cancelled)
            ) {
                continue;
            }
            let (said, complete) = match role {
                Role::Receiver | Role::Relay => (Vec::new(), true),
                Role::Sender => endpoints(t),
            };
            // Over one pair a sender is wanted only with its receiver.
            if !complete && !t.multi_pair() {
                continue;
            }
            let (relays, relays_settled) = match role {
                Role::Sender => relay_endpoints(t),
                _ => (Vec::new(), true),
            };
            let (receivers, endpoints): (Vec<String>, Vec<String>) = said.into_iter().unzip();
            out.push(Want {
                key,
                transfer: name.clone(),
                via: vias(endpoints.len(), &relays),
                endpoints,
                receivers,
                relays,
                complete: complete && relays_settled,
            });
        }
    }
    out
}

/// Whether the job `w` may start now: a receiver or a relay at once; a
/// sender once every receiver and relay assigned has said where it
/// listens (over several pairs, receivers assigned later join it as they
/// say).
pub fn may_start(w: &Want) -> bool {
    w.key.role != Role::Sender || w.complete
}

/// Whether a running sender, sending to `running`, must start again to
/// reach its receivers at `wanted`: over one pair, when the receiver
/// moved. Over several (`multi`, however few it runs on: an Auto Transfer
/// may start on one), never: a receiver that leaves the list (lost) has
/// its work taken over by the others, and one that listens somewhere the
/// sender does not send to (a replacement, or a receiver's job restarted
/// on another port) is taken in as a new pair (`SenderJob::join`).
pub fn receivers_moved(running: &[String], wanted: &[String], multi: bool) -> bool {
    !multi && !wanted.is_empty() && running != wanted
}

/// Transfers being deleted on which `me` still has to stop and clean up.
pub fn cancelled(transfers: &[Transfer], me: &Me) -> Vec<(JobKey, (String, String))> {
    let mut out = Vec::new();
    for t in transfers {
        let Some(s) = &t.status else { continue };
        if t.metadata.deletion_timestamp.is_none() || s.phase.is_some_and(|p| p.is_final()) {
            continue;
        }
        for (role, _) in s.occupied().filter(|(role, who)| me.is(t, *role, who)) {
            let key = JobKey {
                uid: t.metadata.uid.clone().unwrap_or_default(),
                role,
                attempt: s.attempt,
            };
            if my_report_state(t, me, &key) != Some(ReportState::Cancelled) {
                out.push((
                    key,
                    (
                        t.metadata.namespace.clone().unwrap_or_default(),
                        t.metadata.name.clone().unwrap_or_default(),
                    ),
                ));
            }
        }
    }
    out
}

/// Running jobs that are no longer wanted (the assignment moved, or a new attempt began).
pub fn to_stop<'a>(
    running: impl IntoIterator<Item = &'a JobKey>,
    wanted: &[Want],
    finished: &HashSet<JobKey>,
) -> Vec<JobKey> {
    let keep: HashSet<&JobKey> = wanted.iter().map(|w| &w.key).collect();
    running
        .into_iter()
        .filter(|k| !keep.contains(k) && !finished.contains(k))
        .cloned()
        .collect()
}

/// Whether a job that is no longer wanted may still run to its end instead
/// of being stopped: a sender whose every byte is acknowledged, of a
/// Transfer that succeeded on its attempt or that this agent no longer sees
/// (the operator drops the assignment labels it watches by once a Transfer
/// is over). Stopping it then lost its final report: the Transfer showed
/// Succeeded at 0% with no rate (found against a real API server, about one
/// run in six). A job reassigned elsewhere, or with bytes still in flight,
/// stops at once.
pub fn may_finish(key: &JobKey, visible: Option<&Transfer>, all_acked: bool) -> bool {
    if key.role != Role::Sender || !all_acked {
        return false;
    }
    match visible.and_then(|t| t.status.as_ref()) {
        None => true,
        Some(s) => s.phase == Some(TransferPhase::Succeeded) && s.attempt == key.attempt,
    }
}

/// Progress reports: not more often than every 5 s, and at least every 10 s.
///
/// Each report is a status write: against a real API server with 100
/// transfers running, reports every 2 s made 40 writes a second, the
/// largest load on the server and more than the operator's. Verdicts are
/// not held back by this.
#[derive(Debug, Default)]
pub struct Cadence {
    last: Option<Duration>,
}

impl Cadence {
    /// Shortest gap between two reports.
    pub const MIN: Duration = Duration::from_secs(5);
    /// Longest silence.
    pub const MAX: Duration = Duration::from_secs(10);
    /// Shortest gap before a report of a change the operator acts on.
    pub const URGENT: Duration = Duration::from_secs(1);

    /// Whether to report at `now` a change the operator acts on (a pair
    /// lost or joined, which it records and replaces): at once, but not
    /// within `URGENT` of the last report. Records the report if so. Such
    /// changes are few, so this costs the API server little.
    pub fn due_urgent(&mut self, now: Duration) -> bool {
        let due = self
            .last
            .is_none_or(|last| now.saturating_sub(last) >= Self::URGENT);
        if due {
            self.last = Some(now);
        }
        due
    }

    /// Whether to report at `now` (time since any fixed start), given whether
    /// anything changed since the last report. Records the report if so.
    pub fn due(&mut self, now: Duration, changed: bool) -> bool {
        let due = match self.last {
            None => true,
            Some(last) => {
                let gap = now.saturating_sub(last);
                gap >= Self::MAX || (changed && gap >= Self::MIN)
            }
        };
        if due {
            self.last = Some(now);
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use wirerate_crds::TransferStatus;
    use wirerate_crds::fixtures::TransferBuilder;
    use wirerate_crds::transfer::{AgentRef, AgentReport};

    fn xfer(sender: &str, receiver: &str, attempt: i32) -> Transfer {
        let t = TransferBuilder::new("t", "/in/f", "/out/f")
            .pools("a", "b")
            .namespace("ns")
            .uid("u1");
        let r = |n: &str| AgentRef {
            name: n.into(),
            pool: "p".into(),
            address: None,
            node: None,
        };
        t.status(TransferStatus {
            phase: Some(TransferPhase::Running),
            attempt,
            sender: Some(r(sender)),
            receiver: Some(r(receiver)),
            ..Default::default()
        })
        .build()
    }

    fn me(name: &str) -> Me {
        Me {
            namespace: "ns".into(),
            pool: "p".into(),
            name: name.into(),
        }
    }

    fn report(
        t: &mut Transfer,
        role: Role,
        agent: &str,
        state: ReportState,
        endpoint: Option<&str>,
    ) {
        let s = t.status.as_mut().unwrap();
        let attempt = s.attempt;
        s.reports.push(AgentReport {
            role,
            agent: agent.into(),
            attempt,
            state,
            message: String::new(),
            endpoint: endpoint.map(Into::into),
            updated_at: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        });
    }

    #[test]
    fn the_sender_waits_for_the_receivers_endpoint() {
        let mut t = xfer("s", "r", 1);
        assert_eq!(wanted(std::slice::from_ref(&t), &me("r")).len(), 1);
        assert!(wanted(std::slice::from_ref(&t), &me("s")).is_empty());
        listens(&mut t, "r", "10.0.0.2:7700");
        let w = wanted(std::slice::from_ref(&t), &me("s"));
        assert_eq!(w[0].endpoints, ["10.0.0.2:7700"]);
        assert!(wanted(std::slice::from_ref(&t), &me("nobody")).is_empty());

        // Another agent's report (of this attempt) is not the receiver's.
        let mut t = xfer("s", "r", 1);
        listens(&mut t, "x", "10.9.9.9:1");
        assert!(wanted(std::slice::from_ref(&t), &me("s")).is_empty());
    }

    /// Receiver `agent`'s report that it listens at `endpoint`.
    fn listens(t: &mut Transfer, agent: &str, endpoint: &str) {
        report(
            t,
            Role::Receiver,
            agent,
            ReportState::Running,
            Some(endpoint),
        );
    }

    /// The agents named `names` of pool `p`.
    fn refs(names: &[&str]) -> Vec<AgentRef> {
        names
            .iter()
            .map(|n| AgentRef {
                name: (*n).into(),
                pool: "p".into(),
                address: None,
                node: None,
            })
            .collect()
    }

    /// `t` over several pairs, received by `receivers`.
    fn over_pairs(receivers: &[&str]) -> Transfer {
        let mut t = xfer("s", "unused", 1);
        let s = t.status.as_mut().unwrap();
        s.receiver = None;
        s.receivers = refs(receivers);
        t.spec.pairs = Some(receivers.len() as i32);
        t
    }

    #[test]
    fn over_several_pairs_each_receiver_serves_and_the_sender_waits_for_all() {
        let mut t = over_pairs(&["r0", "r1", "r2"]);
        for r in ["r0", "r1", "r2"] {
            let w = wanted(std::slice::from_ref(&t), &me(r));
            assert_eq!(w.len(), 1, "{r} receives");
            assert_eq!(w[0].key.role, Role::Receiver);
        }
        listens(&mut t, "r0", "a:1");
        listens(&mut t, "r2", "c:1");
        let w = wanted(std::slice::from_ref(&t), &me("s"));
        assert!(!w[0].complete, "r1 has not said where it listens");
        assert_eq!(w[0].endpoints, ["a:1", "c:1"]);
        assert!(!may_start(&w[0]));
        listens(&mut t, "r1", "b:1");
        let w = wanted(std::slice::from_ref(&t), &me("s"));
        assert!(w[0].complete);
        assert!(may_start(&w[0]));
        assert_eq!(w[0].endpoints, ["a:1", "b:1", "c:1"], "in the pairs' order");
        assert_eq!(w[0].receivers, ["r0", "r1", "r2"]);
        // A receiver dropped from the list (lost) is not waited for.
        let mut t = over_pairs(&["r0", "r2"]);
        listens(&mut t, "r0", "a:1");
        listens(&mut t, "r2", "c:1");
        listens(&mut t, "r1", "b:1");
        let w = wanted(std::slice::from_ref(&t), &me("s"));
        assert_eq!(w[0].endpoints, ["a:1", "c:1"]);
        assert!(wanted(std::slice::from_ref(&t), &me("r1")).is_empty());
        // Each receiver starts at once; so does a sender over several
        // pairs that has one receiver so far (pairsPolicy Auto, or the
        // others lost before it started): the rest join it.
        let r = wanted(std::slice::from_ref(&t), &me("r0"));
        assert!(may_start(&r[0]), "a receiver over several pairs starts");
        let mut t = over_pairs(&["r0"]);
        t.spec.pairs = Some(3);
        listens(&mut t, "r0", "a:1");
        let w = wanted(std::slice::from_ref(&t), &me("s"));
        assert!(w[0].complete && may_start(&w[0]));
    }

    // Issue 34: a relay starts at once; the sender waits for each relay
    // to say where it listens (or to fail), and sends the second pair on
    // through the first relay, the third through the second.
    #[test]
    fn relays_start_at_once_and_the_sender_waits_for_them_and_pairs_them_in_order() {
        let mut t = over_pairs(&["r0", "r1", "r2"]);
        t.status.as_mut().unwrap().relays = refs(&["s1", "s2"]);
        for r in ["s1", "s2"] {
            let w = wanted(std::slice::from_ref(&t), &me(r));
            assert_eq!(w.len(), 1, "{r} relays");
            assert_eq!(w[0].key.role, Role::Relay);
            assert!(may_start(&w[0]));
        }
        for (r, e) in [("r0", "a:1"), ("r1", "b:1"), ("r2", "c:1")] {
            listens(&mut t, r, e);
        }
        report(
            &mut t,
            Role::Relay,
            "s1",
            ReportState::Running,
            Some("h1:1"),
        );
        let w = wanted(std::slice::from_ref(&t), &me("s"));
        assert!(!may_start(&w[0]), "s2 has not said where it listens");
        // A receiver's report does not stand for a relay's.
        report(
            &mut t,
            Role::Receiver,
            "s2",
            ReportState::Running,
            Some("x:1"),
        );
        assert!(!may_start(&wanted(std::slice::from_ref(&t), &me("s"))[0]));
        report(
            &mut t,
            Role::Relay,
            "s2",
            ReportState::Running,
            Some("h2:1"),
        );
        let w = wanted(std::slice::from_ref(&t), &me("s"));
        assert!(may_start(&w[0]));
        assert_eq!(w[0].via, [None, Some("h1:1".into()), Some("h2:1".into())]);
        assert_eq!(w[0].relays[1], ("h2:1".to_owned(), "s2".to_owned()));
        // A relay that failed is not waited for, nor sent through.
        let s = t.status.as_mut().unwrap();
        s.reports.retain(|r| r.agent != "s2");
        report(&mut t, Role::Relay, "s2", ReportState::Failed, None);
        let w = wanted(std::slice::from_ref(&t), &me("s"));
        assert!(may_start(&w[0]));
        assert_eq!(w[0].via, [None, Some("h1:1".into()), None]);
        // Deleted: the relay is asked to clean up too.
        t.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        let c = cancelled(std::slice::from_ref(&t), &me("s1"));
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].0.role, Role::Relay);
    }

    #[test]
    fn each_pair_but_the_first_is_sent_through_a_relay_while_there_are_any() {
        let relays = [("h1:1".to_owned(), "s1".to_owned())];
        assert_eq!(vias(3, &relays), [None, Some("h1:1".into()), None]);
        assert_eq!(vias(1, &relays), [None]);
        assert!(vias(0, &relays).is_empty());
    }

    // Found by review: a sender over several pairs never followed a
    // receiver whose job restarted on another port (its pair was lost for
    // good, and a rolling restart of the pool lost them all). It now takes
    // such a receiver in as a new pair rather than starting over, which
    // sent every byte again.
    #[test]
    fn a_sender_over_one_pair_starts_again_for_a_receiver_that_moved_one_over_several_never() {
        let e = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert!(!receivers_moved(&e(&["a:1"]), &e(&["a:1"]), false));
        assert!(receivers_moved(&e(&["a:1"]), &e(&["a:2"]), false));
        let three = e(&["a:1", "b:1", "c:1"]);
        assert!(!receivers_moved(&three, &three, true));
        assert!(
            !receivers_moved(&three, &e(&["a:1", "c:1"]), true),
            "b left"
        );
        assert!(
            !receivers_moved(&three, &e(&["a:1", "b:2", "c:1"]), true),
            "b moved"
        );
        assert!(
            !receivers_moved(&three, &e(&["a:1", "b:2"]), true),
            "b moved, c left"
        );
        assert!(
            !receivers_moved(&three, &e(&["b:2"]), true),
            "one left, and it moved"
        );
        assert!(!receivers_moved(&three, &[], true), "none has said yet");
        // Found by review: a sender over several pairs that started on
        // one receiver (pairsPolicy Auto) restarted, and sent everything
        // again, when that one was lost and another ran on.
        assert!(!receivers_moved(&e(&["a:1"]), &e(&["b:1"]), true));
    }

    #[test]
    fn a_new_attempt_replaces_the_old_job_and_finished_jobs_stay_finished() {
        let t1 = xfer("s", "r", 1);
        let old = wanted(std::slice::from_ref(&t1), &me("r"));
        let t2 = xfer("s", "r2", 2);
        let now = wanted(std::slice::from_ref(&t2), &me("r"));
        assert!(now.is_empty(), "r lost its assignment");
        assert_eq!(
            to_stop([&old[0].key], &now, &HashSet::new()),
            vec![old[0].key.clone()]
        );

        let mut done = xfer("s", "r", 1);
        report(&mut done, Role::Receiver, "r", ReportState::Succeeded, None);
        assert!(wanted(&[done], &me("r")).is_empty());
    }

    #[test]
    fn a_sender_that_has_sent_everything_may_report_its_end() {
        let key = |role, attempt| JobKey {
            uid: "uid-t".into(),
            role,
            attempt,
        };
        let mut done = xfer("s", "r", 1);
        done.status.as_mut().unwrap().phase = Some(TransferPhase::Succeeded);
        assert!(may_finish(&key(Role::Sender, 1), Some(&done), true));
        assert!(
            may_finish(&key(Role::Sender, 1), None, true),
            "labels already gone"
        );
        assert!(
            !may_finish(&key(Role::Sender, 1), Some(&done), false),
            "bytes in flight"
        );
        assert!(!may_finish(&key(Role::Receiver, 1), Some(&done), true));
        let moved = xfer("s2", "r", 2);
        assert!(
            !may_finish(&key(Role::Sender, 1), Some(&moved), true),
            "reassigned"
        );
        let mut failed = xfer("s", "r", 1);
        failed.status.as_mut().unwrap().phase = Some(TransferPhase::Failed);
        assert!(!may_finish(&key(Role::Sender, 1), Some(&failed), true));
    }

    #[test]
    fn deletion_asks_each_assigned_agent_to_clean_up_once() {
        let mut t = xfer("s", "r", 1);
        t.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        assert!(wanted(std::slice::from_ref(&t), &me("r")).is_empty());
        assert_eq!(cancelled(std::slice::from_ref(&t), &me("r")).len(), 1);
        report(&mut t, Role::Receiver, "r", ReportState::Cancelled, None);
        assert!(cancelled(&[t], &me("r")).is_empty());
    }

    #[test]
    fn cadence_between_five_and_ten_seconds() {
        let mut c = Cadence::default();
        let s = Duration::from_secs;
        assert!(c.due(s(0), false), "first report at once");
        assert!(!c.due_urgent(Duration::from_millis(500)), "not within 1 s");
        assert!(c.due_urgent(s(1)), "a pair lost is told within 1 s");
        assert!(!c.due(s(2), true), "not within 5 s of the last");
        assert!(!c.due(s(5), true), "not within 5 s of the last");
        assert!(c.due(s(6), true));
        assert!(!c.due(s(8), true), "not within 5 s");
        assert!(!c.due(s(15), false), "nothing new, not yet 10 s");
        assert!(c.due(s(16), false), "at least every 10 s");
    }

    #[test]
    fn a_namesake_in_another_pool_or_namespace_is_not_me() {
        let t = xfer("s", "r", 1);
        let mut other = me("r");
        other.pool = "q".into();
        assert!(wanted(std::slice::from_ref(&t), &other).is_empty());
        other = me("r");
        other.namespace = "elsewhere".into();
        assert!(wanted(std::slice::from_ref(&t), &other).is_empty());
        assert_eq!(wanted(std::slice::from_ref(&t), &me("r")).len(), 1);
    }
}
