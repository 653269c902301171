//! Watches every Transfer and checks, at each state the API server passes
//! through, what the operator must never do, while timing what it does.
//!
//! A watch delivers one Transfer's change per event, in resourceVersion
//! order, so checking after each event checks every state the API held:
//!
//! - **Capacity:** no agent has more non-final Transfers naming it as sender
//!   or receiver than its capacity.
//! - **Double assignment:** within one attempt, a Transfer's sender and
//!   receiver never change (a new agent comes only with a new attempt).
//! - **Priority:** when a Transfer gets its agents, the Transfers of higher
//!   priority that wait for the same pair of pools (phase Queued, so the
//!   operator has seen them) must still fit into what is left free in those
//!   pools. A lower-priority Transfer placed in the same pass as higher ones
//!   may be written first: that is no inversion as long as the higher ones
//!   still have room.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::Client;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use wirerate_crds::transfer::Role;
use wirerate_crds::{Transfer, TransferPhase};

use crate::scenario::{POOL_NAMESPACE, Scenario};

/// Violations of each kind kept in full; the rest are only counted.
const KEEP: usize = 20;

/// `namespace/pool/agent`.
type AgentKey = String;
/// Two pools, in order.
type PoolPair = (String, String);
/// The sender and receiver of one attempt.
type Pair = (Option<AgentKey>, Option<AgentKey>);

/// What the observer keeps of one Transfer.
#[derive(Clone, Debug, PartialEq)]
struct Seen {
    phase: Option<TransferPhase>,
    attempt: i32,
    sender: Option<AgentKey>,
    receiver: Option<AgentKey>,
    priority: i32,
    pools: PoolPair,
    deleting: bool,
    failovers: usize,
}

impl Seen {
    fn of(t: &Transfer) -> Self {
        let s = t.status.clone().unwrap_or_default();
        let agent = |role: Role, a: &Option<wirerate_crds::transfer::AgentRef>| {
            a.as_ref().map(|a| {
                format!(
                    "{}/{}/{}",
                    t.pool_namespace(role).unwrap_or_default(),
                    a.pool,
                    a.name
                )
            })
        };
        let pool = |role: Role, name: Option<&String>| {
            format!(
                "{}/{}",
                t.pool_namespace(role).unwrap_or_default(),
                name.map(String::as_str).unwrap_or("-")
            )
        };
        let (a, b) = (
            pool(Role::Sender, Some(&t.spec.source.pool)),
            pool(Role::Receiver, t.spec.destination.pool.as_ref()),
        );
        Self {
            phase: s.phase,
            attempt: s.attempt,
            sender: agent(Role::Sender, &s.sender),
            receiver: agent(Role::Receiver, &s.receiver),
            priority: t.spec.priority,
            pools: if a <= b { (a, b) } else { (b, a) },
            deleting: t.metadata.deletion_timestamp.is_some(),
            failovers: s.failovers.len(),
        }
    }

    /// Holding agents' slots: assigned and not over.
    fn holds(&self) -> bool {
        !self.deleting && !self.phase.is_some_and(|p| p.is_final())
    }

    /// Waiting for agents, as the operator last said.
    fn waiting(&self) -> bool {
        self.phase == Some(TransferPhase::Queued) && self.sender.is_none() && !self.deleting
    }
}

/// Violations of one kind: the first few in full, and how many.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub(crate) struct Violations {
    pub(crate) count: usize,
    pub(crate) first: Vec<String>,
}

impl Violations {
    fn add(&mut self, what: String) {
        self.count += 1;
        if self.first.len() < KEEP {
            self.first.push(what);
        }
    }
}

/// The observer's state.
#[derive(Debug)]
pub(crate) struct Observer {
    /// When each Transfer's create was sent.
    created: HashMap<String, Instant>,
    transfers: HashMap<String, Seen>,
    /// Create to first status.phase, per Transfer.
    first_status: HashMap<String, Duration>,
    load: HashMap<AgentKey, i32>,
    capacity: HashMap<AgentKey, i32>,
    /// Agents of each pool (`namespace/pool`).
    members: HashMap<String, Vec<AgentKey>>,
    /// (attempt -> (sender, receiver)) of each Transfer, as first assigned.
    assignments: HashMap<String, BTreeMap<i32, Pair>>,
    waiting: HashMap<PoolPair, BTreeMap<i32, BTreeSet<String>>>,
    /// When each assignment was first seen.
    assigned: Vec<Instant>,
    pub(crate) overruns: Violations,
    pub(crate) double_assignments: Violations,
    pub(crate) inversions: Violations,
    /// Highest load any agent reached.
    pub(crate) peak_load: i32,
    /// Relists of the observer's own watch.
    pub(crate) relists: usize,
    pub(crate) watch_errors: usize,
    /// The first list is in.
    pub(crate) synced: bool,
    relisting: Option<Vec<Transfer>>,
}

impl Observer {
    /// An observer of `s`'s agents.
    pub(crate) fn new(s: &Scenario) -> Self {
        let mut capacity = HashMap::new();
        let mut members: HashMap<String, Vec<AgentKey>> = HashMap::new();
        for a in s.agents() {
            let key = format!("{POOL_NAMESPACE}/{}/{}", a.pool, a.name);
            capacity.insert(key.clone(), s.capacity);
            members
                .entry(format!("{POOL_NAMESPACE}/{}", a.pool))
                .or_default()
                .push(key);
        }
        Self {
            created: HashMap::new(),
            transfers: HashMap::new(),
            first_status: HashMap::new(),
            load: HashMap::new(),
            capacity,
            members,
            assignments: HashMap::new(),
            waiting: HashMap::new(),
            assigned: Vec::new(),
            overruns: Violations::default(),
            double_assignments: Violations::default(),
            inversions: Violations::default(),
            peak_load: 0,
            relists: 0,
            watch_errors: 0,
            synced: false,
            relisting: None,
        }
    }

    /// Notes that the create of `ns/name` is being sent now.
    pub(crate) fn creating(&mut self, key: String, at: Instant) {
        self.created.insert(key, at);
    }

    fn key(t: &Transfer) -> String {
        format!(
            "{}/{}",
            t.metadata.namespace.as_deref().unwrap_or_default(),
            t.metadata.name.as_deref().unwrap_or_default()
        )
    }

    fn adjust(&mut self, s: &Seen, by: i32) -> Vec<AgentKey> {
        if !s.holds() {
            return Vec::new();
        }
        let mut touched = Vec::new();
        for a in s.sender.iter().chain(s.receiver.iter()) {
            *self.load.entry(a.clone()).or_default() += by;
            touched.push(a.clone());
        }
        touched
    }

    fn set_waiting(&mut self, key: &str, s: &Seen, on: bool) {
        if !s.waiting() {
            return;
        }
        let by_priority = self.waiting.entry(s.pools.clone()).or_default();
        let set = by_priority.entry(s.priority).or_default();
        if on {
            set.insert(key.to_owned());
        } else {
            set.remove(key);
            if set.is_empty() {
                by_priority.remove(&s.priority);
            }
        }
    }

    /// Free slots left in a pool (`namespace/pool`).
    fn free(&self, pool: &str) -> i32 {
        self.members.get(pool).map_or(0, |agents| {
            agents
                .iter()
                .map(|a| (self.capacity[a] - self.load.get(a).copied().unwrap_or(0)).max(0))
                .sum()
        })
    }

    /// Takes in the current state of one Transfer.
    pub(crate) fn apply(&mut self, t: &Transfer, now: Instant) {
        let key = Self::key(t);
        let new = Seen::of(t);
        let old = self.transfers.get(&key).cloned();
        if new.phase.is_some()
            && !self.first_status.contains_key(&key)
            && let Some(c) = self.created.get(&key)
        {
            self.first_status
                .insert(key.clone(), now.saturating_duration_since(*c));
        }
        if let Some(o) = &old {
            self.adjust(o, -1);
            self.set_waiting(&key, o, false);
        }
        for a in self.adjust(&new, 1) {
            let load = self.load[&a];
            self.peak_load = self.peak_load.max(load);
            let cap = self.capacity.get(&a).copied().unwrap_or(0);
            if load > cap {
                self.overruns.add(format!(
                    "agent {a} holds {load} transfers, capacity {cap} (at {key}, rv {})",
                    t.metadata.resource_version.as_deref().unwrap_or("?")
                ));
            }
        }
        self.set_waiting(&key, &new, true);

        if new.sender.is_some() || new.receiver.is_some() {
            let rec = self
                .assignments
                .entry(key.clone())
                .or_default()
                .entry(new.attempt)
                .or_insert((None, None));
            for (had, now_is, role) in [
                (&mut rec.0, &new.sender, "sender"),
                (&mut rec.1, &new.receiver, "receiver"),
            ] {
                match (had.as_ref(), now_is) {
                    (Some(h), Some(n)) if h != n => self.double_assignments.add(format!(
                        "{key} attempt {}: {role} {h} replaced by {n} within the attempt",
                        new.attempt
                    )),
                    (None, Some(n)) => *had = Some(n.clone()),
                    _ => {}
                }
            }
        }
        let newly = new.sender.is_some()
            && old
                .as_ref()
                .is_none_or(|o| o.sender.is_none() || o.attempt != new.attempt);
        if newly && new.holds() {
            self.assigned.push(now);
            self.check_priority(&key, &new);
        }
        self.transfers.insert(key, new);
    }

    fn check_priority(&mut self, key: &str, x: &Seen) {
        let Some(by_priority) = self.waiting.get(&x.pools) else {
            return;
        };
        let higher: usize = by_priority
            .range(x.priority + 1..)
            .map(|(_, s)| s.len())
            .sum();
        if higher == 0 {
            return;
        }
        let (a, b) = &x.pools;
        let room = if a == b {
            self.free(a) / 2
        } else {
            self.free(a).min(self.free(b))
        };
        if higher > room.max(0) as usize {
            let example = by_priority
                .range(x.priority + 1..)
                .next_back()
                .and_then(|(p, s)| s.iter().next().map(|k| format!("{k} (priority {p})")))
                .unwrap_or_default();
            self.inversions.add(format!(
                "{key} (priority {}) got agents while {higher} of higher priority waited for the same pools with room for {room}, e.g. {example}",
                x.priority
            ));
        }
    }

    /// Takes out a deleted Transfer.
    pub(crate) fn delete(&mut self, t: &Transfer) {
        let key = Self::key(t);
        if let Some(o) = self.transfers.remove(&key) {
            self.adjust(&o, -1);
            self.set_waiting(&key, &o, false);
        }
    }

    fn relist(&mut self, all: Vec<Transfer>, now: Instant) {
        let keep: BTreeSet<String> = all.iter().map(Self::key).collect();
        let gone: Vec<String> = self
            .transfers
            .keys()
            .filter(|k| !keep.contains(*k))
            .cloned()
            .collect();
        for k in gone {
            if let Some(o) = self.transfers.remove(&k) {
                self.adjust(&o, -1);
                self.set_waiting(&k, &o, false);
            }
        }
        for t in &all {
            self.apply(t, now);
        }
        self.synced = true;
    }

    /// Transfers with a phase other than Pending, and those still Pending.
    pub(crate) fn phased(&self) -> (usize, usize) {
        let mut done = 0;
        let mut pending = 0;
        for s in self.transfers.values() {
            match s.phase {
                Some(TransferPhase::Pending) => pending += 1,
                Some(_) => done += 1,
                None => {}
            }
        }
        (done, pending)
    }

    /// Transfers holding agents now.
    pub(crate) fn running(&self) -> usize {
        self.transfers
            .values()
            .filter(|s| s.sender.is_some() && s.holds())
            .count()
    }

    /// Transfers waiting for agents now.
    pub(crate) fn queued(&self) -> usize {
        self.transfers.values().filter(|s| s.waiting()).count()
    }

    /// Running Transfers (`ns/name`), in name order.
    pub(crate) fn running_keys(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .transfers
            .iter()
            .filter(|(_, s)| s.sender.is_some() && s.phase == Some(TransferPhase::Running))
            .map(|(k, _)| k.clone())
            .collect();
        v.sort();
        v
    }

    /// The phase of `ns/name`.
    pub(crate) fn phase(&self, key: &str) -> Option<TransferPhase> {
        self.transfers.get(key).and_then(|s| s.phase)
    }

    /// Assignments first seen at or after `t`.
    pub(crate) fn assigned_since(&self, t: Instant) -> usize {
        self.assigned.iter().filter(|a| **a >= t).count()
    }

    /// Create-to-first-status latencies seen so far.
    pub(crate) fn first_status(&self) -> Vec<Duration> {
        self.first_status.values().copied().collect()
    }

    /// Transfers the driver created that the API no longer has, and those
    /// that failed.
    pub(crate) fn lost_and_failed(&self) -> (Vec<String>, Vec<String>) {
        let mut lost: Vec<String> = self
            .created
            .keys()
            .filter(|k| !self.transfers.contains_key(*k))
            .cloned()
            .collect();
        lost.sort();
        let mut failed: Vec<String> = self
            .transfers
            .iter()
            .filter(|(_, s)| s.phase == Some(TransferPhase::Failed))
            .map(|(k, _)| k.clone())
            .collect();
        failed.sort();
        (lost, failed)
    }

    /// Failovers recorded in the Transfers' status.
    pub(crate) fn failovers(&self) -> usize {
        self.transfers.values().map(|s| s.failovers).sum()
    }

    /// Non-final Transfers naming `agent` (`name` within the pool namespace).
    pub(crate) fn active(&self, pool: &str, agent: &str) -> usize {
        self.load
            .get(&format!("{POOL_NAMESPACE}/{pool}/{agent}"))
            .copied()
            .unwrap_or(0)
            .max(0) as usize
    }
}

/// Watches every Transfer into `state` until the task is dropped.
pub(crate) async fn watch(client: Client, state: Arc<Mutex<Observer>>) {
    let api: Api<Transfer> = Api::all(client);
    let mut events = watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    while let Some(ev) = events.next().await {
        let now = Instant::now();
        let mut s = state.lock().expect("observer lock");
        match ev {
            Ok(watcher::Event::Apply(t)) => s.apply(&t, now),
            Ok(watcher::Event::Delete(t)) => s.delete(&t),
            Ok(watcher::Event::Init) => s.relisting = Some(Vec::new()),
            Ok(watcher::Event::InitApply(t)) => {
                if let Some(buf) = s.relisting.as_mut() {
                    buf.push(t);
                }
            }
            Ok(watcher::Event::InitDone) => {
                let all = s.relisting.take().unwrap_or_default();
                if s.synced {
                    s.relists += 1;
                }
                s.relist(all, now);
            }
            Err(_) => s.watch_errors += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn scenario() -> Scenario {
        Scenario {
            agents: 4,
            pools: 2,
            capacity: 1,
            transfers: 4,
            namespaces: 1,
            data_root: "/data".into(),
            paced_mbps: None,
        }
    }

    /// Transfer `name` of `priority` from pool-0 to pool-1, in `phase`,
    /// on agents `s` and `r` (indices in their pools) at `attempt`.
    fn t(
        name: &str,
        priority: i32,
        phase: &str,
        agents: Option<(usize, usize)>,
        attempt: i32,
    ) -> Transfer {
        let mut status = json!({"phase": phase, "attempt": attempt});
        if let Some((s, r)) = agents {
            status["sender"] = json!({"name": format!("pool-0-agent-{s}"), "pool": "pool-0"});
            status["receiver"] = json!({"name": format!("pool-1-agent-{r}"), "pool": "pool-1"});
        }
        serde_json::from_value(json!({
            "apiVersion": "wirerate.io/v1alpha1", "kind": "Transfer",
            "metadata": {"name": name, "namespace": "u"},
            "spec": {
                "source": {"pool": "pool-0", "poolNamespace": POOL_NAMESPACE, "path": "/d/a"},
                "destination": {"pool": "pool-1", "poolNamespace": POOL_NAMESPACE, "path": "/d/b"},
                "priority": priority,
            },
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn an_agent_over_its_capacity_is_an_overrun() {
        let mut o = Observer::new(&scenario());
        let now = Instant::now();
        o.apply(&t("a", 0, "Running", Some((0, 0)), 1), now);
        o.apply(&t("b", 0, "Running", Some((1, 1)), 1), now);
        assert_eq!(o.overruns.count, 0);
        o.apply(&t("c", 0, "Running", Some((0, 1)), 1), now);
        assert_eq!(o.overruns.count, 2, "{:?}", o.overruns);
        // Finished transfers free their slots.
        o.apply(&t("a", 0, "Succeeded", Some((0, 0)), 1), now);
        o.apply(&t("b", 0, "Succeeded", Some((1, 1)), 1), now);
        o.apply(&t("d", 0, "Running", Some((1, 0)), 1), now);
        assert_eq!(o.overruns.count, 2);
    }

    #[test]
    fn a_new_agent_within_an_attempt_is_a_double_assignment() {
        let mut o = Observer::new(&scenario());
        let now = Instant::now();
        o.apply(&t("a", 0, "Running", Some((0, 0)), 1), now);
        o.apply(&t("a", 0, "Running", Some((0, 0)), 1), now);
        o.apply(&t("a", 0, "Running", Some((1, 0)), 2), now);
        assert_eq!(o.double_assignments.count, 0);
        o.apply(&t("a", 0, "Running", Some((0, 0)), 2), now);
        assert_eq!(o.double_assignments.count, 1);
    }

    #[test]
    fn a_lower_priority_placed_while_a_higher_one_has_no_room_is_an_inversion() {
        let mut o = Observer::new(&scenario());
        let now = Instant::now();
        o.apply(&t("high1", 10, "Queued", None, 0), now);
        o.apply(&t("high2", 10, "Queued", None, 0), now);
        o.apply(&t("low", 0, "Queued", None, 0), now);
        // Two slots per pool: one higher left waiting with room for one.
        o.apply(&t("high1", 10, "Running", Some((0, 0)), 1), now);
        assert_eq!(o.inversions.count, 0);
        // The last slot goes to the lower priority while high2 waits.
        o.apply(&t("low", 0, "Running", Some((1, 1)), 1), now);
        assert_eq!(o.inversions.count, 1, "{:?}", o.inversions);
        assert_eq!(o.assigned_since(now), 2);
    }
}
