//! The indexed scheduler: the whole cluster's placement, computed once per
//! change rather than once per Transfer.
//!
//! What each Transfer asks of the scheduler (its validity and lifecycle step)
//! is derived once and kept in an index under a fingerprint of everything it
//! depends on: the object's resourceVersion, the assignment the ledger holds
//! for it, the pools and consents it is validated against and, once it has
//! agents, their liveness. A plan then only re-derives the Transfers whose
//! fingerprint moved, orders the waiting ones and places them
//! ([`crate::scheduler`]). Pure: fed snapshots and `now`, it does no I/O.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use wirerate_crds::conditions::{self, types};
use wirerate_crds::transfer::AgentRef;
use wirerate_crds::{Transfer, TransferStatus};

use crate::agents::{Agent, AgentId};
use crate::destinations::{self, Destination, Held};
use crate::lifecycle::{self, Needs};
use crate::scheduler::{self, Key, Placement, Slot, Waiting};
use crate::validate::{Catalog, reason, validate};

/// One scheduling decision over the whole cluster.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// Agents for the Transfers that can start now.
    pub placements: BTreeMap<Key, Placement>,
    /// Place in line of the others, per sending pool (1 is next).
    pub positions: HashMap<Key, i32>,
    /// Transfers in progress on each agent, the ledger's counted.
    pub load: HashMap<AgentId, i32>,
    /// Transfers that wait for another writing where they would, and why.
    pub held_back: HashMap<Key, String>,
}

/// Who a Transfer's attempt is assigned to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Assignment {
    /// Attempt number.
    pub attempt: i32,
    /// Sender agent.
    pub sender: Option<AgentRef>,
    /// Receiver agent.
    pub receiver: Option<AgentRef>,
    /// Receiver agents, over several pairs.
    pub receivers: Vec<AgentRef>,
    /// The sender's relays, over several pairs.
    pub relays: Vec<AgentRef>,
}

impl Assignment {
    /// The assignment a Transfer's status records.
    pub fn of(t: &Transfer) -> Self {
        t.status.as_ref().map(Self::in_status).unwrap_or_default()
    }

    /// The assignment `s` records.
    pub fn in_status(s: &TransferStatus) -> Self {
        Self {
            attempt: s.attempt,
            sender: s.sender.clone(),
            receiver: s.receiver.clone(),
            receivers: s.receivers.clone(),
            relays: s.relays.clone(),
        }
    }
}

/// What one Transfer means to the scheduler.
#[derive(Clone, Debug, PartialEq)]
enum Derived {
    /// Needs agents (boxed: the other variants hold nothing).
    Waiting(Box<Waiting>),
    /// Has its agents and is not over: counts toward its namespace's turn.
    Running,
    /// Neither (over, invalid, or being deleted).
    Idle,
}

struct Cached {
    fingerprint: u64,
    derived: Derived,
}

/// The index: derived entries by Transfer uid.
#[derive(Default)]
pub struct Planner {
    entries: HashMap<String, Cached>,
    /// Entries derived by the last plan (for tests of the index).
    derived_last: usize,
}

/// What a plan is computed from.
pub struct Inputs<'a> {
    /// Every Transfer in the cache.
    pub transfers: &'a [Arc<Transfer>],
    /// Every known agent, live or not.
    pub agents: &'a HashMap<AgentId, Agent>,
    /// Pools and consents.
    pub catalog: Catalog<'a>,
    /// Assignments written (or being written) but maybe not yet in the cache, by uid.
    pub ledger: &'a HashMap<String, Assignment>,
    /// The time.
    pub now: Timestamp,
}

/// `t` as the ledger knows it: a newer assignment than the cache shows is laid over.
pub fn overlaid(t: &Transfer, ledger: &HashMap<String, Assignment>) -> Option<Transfer> {
    let a = ledger.get(t.metadata.uid.as_deref()?)?;
    if superseded(t, a) {
        return None;
    }
    let mut t = t.clone();
    let s = t.status.get_or_insert_with(Default::default);
    s.attempt = a.attempt;
    s.sender = a.sender.clone();
    s.receiver = a.receiver.clone();
    s.receivers = a.receivers.clone();
    s.relays = a.relays.clone();
    Some(t)
}

/// Whether the cache already shows the ledger's assignment `a`, or a later
/// attempt. Not merely the same attempt: after a one-sided failover the
/// cache shows the attempt with the survivor alone while the ledger holds
/// both agents.
pub fn superseded(t: &Transfer, a: &Assignment) -> bool {
    let seen = Assignment::of(t);
    seen == *a || seen.attempt > a.attempt
}

/// Transfers in progress on each agent: assigned, not over, not being deleted.
pub fn load<'a>(transfers: impl IntoIterator<Item = &'a Transfer>) -> HashMap<AgentId, i32> {
    let mut load = HashMap::new();
    for t in transfers {
        count(&mut load, t);
    }
    load
}

fn count(load: &mut HashMap<AgentId, i32>, t: &Transfer) {
    let Some(s) = &t.status else { return };
    if s.phase.is_some_and(|p| p.is_final()) || t.metadata.deletion_timestamp.is_some() {
        return;
    }
    for (role, who) in s.occupied() {
        *load.entry(AgentId::assigned(t, role, who)).or_insert(0) += 1;
    }
}

/// Whether a running `t` has landed nothing for its stall timeout by `now`
/// (when `lifecycle` fails it over): time, not an event, changes this.
fn stalled(t: &Transfer, now: Timestamp) -> bool {
    t.status
        .as_ref()
        .and_then(|s| s.last_moved.as_ref())
        .is_some_and(|m| {
            now.as_second() > m.at.0.as_second() + i64::from(t.spec.stall_timeout_seconds.max(1))
        })
}

fn hash_of(v: &impl Hash) -> u64 {
    let mut h = DefaultHasher::new();
    v.hash(&mut h);
    h.finish()
}

/// A fingerprint of the pools and consents: what validation reads.
fn catalog_fingerprint(c: &Catalog<'_>) -> u64 {
    let mut h = DefaultHasher::new();
    for (k, p) in c.pools {
        k.hash(&mut h);
        p.metadata.uid.hash(&mut h);
        serde_json::to_string(&p.spec)
            .unwrap_or_default()
            .hash(&mut h);
    }
    for c in c.consents {
        format!("{c:?}").hash(&mut h);
    }
    h.finish()
}

/// A fingerprint of what lifecycle steps read of the agents: who is live.
fn agents_fingerprint(agents: &HashMap<AgentId, Agent>) -> u64 {
    let mut live: Vec<&AgentId> = agents
        .iter()
        .filter(|(_, a)| a.live())
        .map(|(id, _)| id)
        .collect();
    live.sort();
    hash_of(&live)
}

/// What `t`'s derived entry depends on, hashed: None without a
/// resourceVersion, which alone tells two versions apart. `fps` are the
/// catalog's and the live agents' fingerprints.
fn fingerprint(
    t: &Transfer,
    inputs: &Inputs<'_>,
    (catalog_fp, agents_fp): (u64, u64),
) -> Option<u64> {
    let uid = t.metadata.uid.as_deref()?;
    let assigned = t.status.as_ref().is_some_and(|s| s.sender.is_some());
    t.metadata.resource_version.as_ref().map(|rv| {
        hash_of(&(
            rv,
            inputs.ledger.get(uid).map(|a| {
                let name =
                    |r: &Option<AgentRef>| r.as_ref().map(|r| (r.pool.clone(), r.name.clone()));
                let names = |v: &[AgentRef]| -> Vec<(String, String)> {
                    v.iter().map(|r| (r.pool.clone(), r.name.clone())).collect()
                };
                (
                    a.attempt,
                    name(&a.sender),
                    name(&a.receiver),
                    names(&a.receivers),
                    names(&a.relays),
                )
            }),
            t.metadata.deletion_timestamp.is_some(),
            catalog_fp,
            assigned.then_some((agents_fp, stalled(t, inputs.now))),
            // Time, not an event, ends a lost agent's back-off.
            t.status
                .as_ref()
                .map(|s| lifecycle::avoided(&s.failovers, inputs.now)),
        ))
    })
}

impl Planner {
    /// Plans from `inputs`, re-deriving only the Transfers that changed.
    pub fn plan(&mut self, inputs: &Inputs<'_>) -> Plan {
        let catalog_fp = catalog_fingerprint(&inputs.catalog);
        let agents_fp = agents_fingerprint(inputs.agents);
        let mut waiting = Vec::new();
        let mut running_per_ns: HashMap<String, usize> = HashMap::new();
        let mut seen = HashSet::with_capacity(inputs.transfers.len());
        let mut derived = 0;
        let mut load = HashMap::new();
        // Where the Transfers that started write, and where the waiting
        // ones that have not would.
        let mut held = Held::default();
        let mut fresh = HashMap::new();
        for t in inputs.transfers {
            let Some(uid) = t.metadata.uid.clone() else {
                continue;
            };
            let over = overlaid(t, inputs.ledger);
            let t: &Transfer = over.as_ref().unwrap_or(t);
            let fingerprint = fingerprint(t, inputs, (catalog_fp, agents_fp));
            let entry = match self.entries.get(&uid) {
                Some(c) if fingerprint == Some(c.fingerprint) => c.derived.clone(),
                _ => {
                    derived += 1;
                    let d = derive(t, inputs);
                    if let Some(fp) = fingerprint {
                        self.entries.insert(
                            uid.clone(),
                            Cached {
                                fingerprint: fp,
                                derived: d.clone(),
                            },
                        );
                    }
                    d
                }
            };
            // One that runs and asks for a lost pair's replacement still
            // takes its namespace's turn.
            let replacing = matches!(&entry, Derived::Waiting(w) if w.replacing);
            if matches!(&entry, Derived::Running) || replacing {
                *running_per_ns
                    .entry(t.namespace().unwrap_or_default())
                    .or_default() += 1;
            }
            if let Derived::Waiting(w) = entry {
                if !destinations::writes(t) {
                    fresh.insert(w.key.clone(), Destination::of(t));
                }
                waiting.push(*w);
            }
            if destinations::writes(t) {
                let key = (t.namespace().unwrap_or_default(), t.name_any());
                held.hold(Destination::of(t), key);
            }
            count(&mut load, t);
            seen.insert(uid);
        }
        // Gone from the cache: forget them.
        self.entries.retain(|uid, _| seen.contains(uid));
        self.derived_last = derived;

        let slots: Vec<Slot> = inputs
            .agents
            .values()
            .filter(|a| a.live())
            .map(|a| Slot {
                pool: (a.namespace.clone(), a.pool.clone()),
                agent: a.name.clone(),
                free: a.capacity - load.get(&a.id()).copied().unwrap_or(0),
                capacity: a.capacity,
            })
            .collect();
        let order = scheduler::order(&waiting, &running_per_ns);
        let (placements, positions, held_back) = place(&order, &waiting, &slots, fresh, held);
        Plan {
            placements,
            positions,
            load,
            held_back,
        }
    }

    /// How many Transfers the last plan had to derive afresh.
    pub fn derived_last(&self) -> usize {
        self.derived_last
    }
}

/// Places the `waiting` Transfers, in line `order`, on `slots`, holding
/// back those that would write where another does (`fresh` are the
/// destinations of those that have not started, `held` those of the
/// ones that write); gives the placements, each other one's place in its
/// pool's line, and those held back with why.
fn place(
    order: &[Key],
    waiting: &[Waiting],
    slots: &[Slot],
    fresh: HashMap<Key, Destination>,
    held: Held,
) -> (
    BTreeMap<Key, Placement>,
    HashMap<Key, i32>,
    HashMap<Key, String>,
) {
    let by_key: HashMap<&Key, &Waiting> = waiting.iter().map(|w| (&w.key, w)).collect();
    let could_run = |k: &Key| {
        by_key
            .get(k)
            .is_some_and(|w| scheduler::could_run(w, slots))
    };
    let held_back = destinations::held_back(order, &fresh, held, could_run);
    let free: Vec<Key> = order
        .iter()
        .filter(|k| !held_back.contains_key(*k))
        .cloned()
        .collect();
    let placements = scheduler::assign(&free, waiting, slots);
    let mut positions = HashMap::new();
    let mut per_pool: HashMap<Key, i32> = HashMap::new();
    for k in order.iter().filter(|k| !placements.contains_key(*k)) {
        let w = by_key[k];
        // A running Transfer has no place in line.
        if w.replacing {
            continue;
        }
        let pool = w
            .sender_pool
            .clone()
            .or_else(|| w.receiver_pool.clone())
            .unwrap_or_default();
        let n = per_pool.entry(pool).or_default();
        *n += 1;
        positions.insert(k.clone(), *n);
    }
    (placements, positions, held_back)
}

/// What `t` asks of the scheduler now.
fn derive(t: &Transfer, inputs: &Inputs<'_>) -> Derived {
    if t.metadata.deletion_timestamp.is_some() {
        return Derived::Idle;
    }
    let key = (t.namespace().unwrap_or_default(), t.name_any());
    // Found unusable by a check outside `validate` (its token or grant
    // names): it would hold a slot it cannot use. Its own reconcile looks
    // again.
    let refused = t
        .status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, types::VALID));
    if refused.is_some_and(|c| c.status == "False" && c.reason == reason::TOKEN_SECRET_NOT_USABLE) {
        return Derived::Idle;
    }
    let validity = validate(t, inputs.catalog);
    let step = lifecycle::step(t, &validity, inputs.agents, inputs.now);
    match (step.needs, &validity) {
        (
            Some(Needs {
                sender,
                receivers,
                least,
                avoid,
                replacing,
            }),
            Ok(r),
        ) => Derived::Waiting(Box::new(Waiting {
            priority: t.spec.priority,
            created: t
                .metadata
                .creation_timestamp
                .as_ref()
                .map_or(0, |c| c.0.as_second()),
            sender_pool: sender.then(|| r.sender_pool.clone()),
            receiver_pool: if receivers > 0 {
                r.receiver_pool.clone()
            } else {
                None
            },
            receivers,
            least,
            avoid,
            replacing,
            // Relays come with a new sender, and go with it.
            relays: if sender { r.relays } else { 0 },
            key,
        })),
        _ if step.status.phase.is_some_and(|p| !p.is_final()) && step.status.sender.is_some() => {
            Derived::Running
        }
        _ => Derived::Idle,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use wirerate_crds::TransferPhase;

    use super::*;
    use crate::agents::tests::lease;
    use crate::agents::{self};
    use crate::validate::tests::{pools, transfer};

    const NOW: i64 = 1_000_000;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    fn queued(name: &str, priority: i32, created: i64) -> Arc<Transfer> {
        let mut t = transfer(name, "/in/a", &format!("/out/{name}"));
        t.metadata.namespace = Some("data".into());
        t.metadata.uid = Some(format!("uid-{name}"));
        t.metadata.resource_version = Some("1".into());
        t.metadata.creation_timestamp = Some(Time(at(created)));
        t.spec.priority = priority;
        Arc::new(t)
    }

    fn agents(leases: &[Lease]) -> HashMap<AgentId, Agent> {
        leases
            .iter()
            .filter_map(|l| agents::from_lease(l, &Default::default(), at(NOW), None))
            .map(|a| (a.id(), a))
            .collect()
    }

    fn plan(
        planner: &mut Planner,
        transfers: &[Arc<Transfer>],
        agents: &HashMap<AgentId, Agent>,
        ledger: &HashMap<String, Assignment>,
    ) -> Plan {
        let pools = pools();
        let consents = BTreeSet::new();
        planner.plan(&Inputs {
            transfers,
            agents,
            catalog: Catalog {
                pools: &pools,
                consents: &consents,
            },
            ledger,
            now: at(NOW),
        })
    }

    // The scheduler re-validated and re-stepped every Transfer on every
    // reconcile: a thousand Transfers cost a million validations. The index
    // derives a Transfer again only when it, or what it is checked against,
    // changed.
    #[test]
    fn each_transfer_is_derived_once_per_change() {
        let mut planner = Planner::default();
        let ag = agents(&[lease("src", "s0", NOW, None), lease("dst", "r0", NOW, None)]);
        let mut all: Vec<Arc<Transfer>> =
            (0..100).map(|i| queued(&format!("t{i}"), 0, i)).collect();
        let ledger = HashMap::new();
        let first = plan(&mut planner, &all, &ag, &ledger);
        assert_eq!(planner.derived_last(), 100);
        assert_eq!(first.placements.len(), 2, "s0 and r0 have two slots each");

        let again = plan(&mut planner, &all, &ag, &ledger);
        assert_eq!(
            planner.derived_last(),
            0,
            "nothing changed, nothing derived"
        );
        assert_eq!(again, first);

        // One Transfer changes: one derivation.
        let mut t = (*all[50]).clone();
        t.metadata.resource_version = Some("2".into());
        t.spec.priority = 10;
        all[50] = Arc::new(t);
        let third = plan(&mut planner, &all, &ag, &ledger);
        assert_eq!(planner.derived_last(), 1);
        assert!(
            third
                .placements
                .contains_key(&("data".into(), "t50".into()))
        );

        // A new agent does not concern Transfers that have none yet.
        let more = agents(&[
            lease("src", "s0", NOW, None),
            lease("dst", "r0", NOW, None),
            lease("src", "s1", NOW, None),
        ]);
        plan(&mut planner, &all, &more, &ledger);
        assert_eq!(planner.derived_last(), 0);

        // A pool's spec is what Transfers are validated against: all again.
        let mut pools = pools();
        pools
            .get_mut(&("data".into(), "src".into()))
            .unwrap()
            .spec
            .replicas = 7;
        planner.plan(&Inputs {
            transfers: &all,
            agents: &more,
            catalog: Catalog {
                pools: &pools,
                consents: &BTreeSet::new(),
            },
            ledger: &ledger,
            now: at(NOW),
        });
        assert_eq!(planner.derived_last(), 100);
    }

    #[test]
    fn a_taken_placement_holds_its_slot_until_the_cache_shows_it() {
        let mut planner = Planner::default();
        let ag = agents(&[lease("src", "s0", NOW, None), lease("dst", "r0", NOW, None)]);
        let all: Vec<Arc<Transfer>> = (0..3).map(|i| queued(&format!("t{i}"), 0, i)).collect();
        let first = plan(&mut planner, &all, &ag, &HashMap::new());
        let placed: Vec<&Key> = first.placements.keys().collect();
        assert_eq!(placed.len(), 2);
        assert_eq!(first.positions[&("data".into(), "t2".into())], 1);

        // t0 took its placement; the cache does not show it yet.
        let who = |pool: &str, name: &str| {
            Some(AgentRef {
                name: name.into(),
                pool: pool.into(),
                address: None,
                node: None,
            })
        };
        let ledger = HashMap::from([(
            "uid-t0".to_owned(),
            Assignment {
                attempt: 1,
                sender: who("src", "s0"),
                receiver: who("dst", "r0"),
                ..Default::default()
            },
        )]);
        let next = plan(&mut planner, &all, &ag, &ledger);
        assert!(!next.placements.contains_key(&("data".into(), "t0".into())));
        assert_eq!(
            next.load[&AgentId::new(&("data".into(), "src".into()), "s0")],
            1
        );
        // One slot left on each agent: t1 keeps it, t2 still waits.
        assert!(next.placements.contains_key(&("data".into(), "t1".into())));
        assert_eq!(next.positions[&("data".into(), "t2".into())], 1);

        // The cache caught up: the ledger's entry is superseded.
        let mut t0 = (*all[0]).clone();
        t0.status = Some(TransferStatus {
            phase: Some(TransferPhase::Running),
            attempt: 1,
            sender: who("src", "s0"),
            receiver: who("dst", "r0"),
            ..Default::default()
        });
        assert!(superseded(&t0, &ledger["uid-t0"]));
        assert!(overlaid(&t0, &ledger).is_none());
    }

    // issue 39: an agent a Transfer had lost was never chosen for it again,
    // so a Transfer to a one-agent pool stayed Queued for ever.
    #[test]
    fn a_one_agent_pool_gets_its_lost_agent_back_after_the_back_off() {
        let mut planner = Planner::default();
        let ag = agents(&[lease("src", "s0", NOW, None), lease("dst", "r0", NOW, None)]);
        let mut t = (*queued("t", 0, 1)).clone();
        t.status = Some(TransferStatus {
            phase: Some(TransferPhase::Queued),
            attempt: 2,
            sender: Some(AgentRef {
                name: "s0".into(),
                pool: "src".into(),
                address: None,
                node: None,
            }),
            failovers: vec![wirerate_crds::transfer::Failover {
                attempt: 1,
                role: wirerate_crds::transfer::Role::Receiver,
                agent: "r0".into(),
                reason: "its Lease expired".into(),
                at: Time(at(NOW - 20)),
            }],
            ..Default::default()
        });
        let all = [Arc::new(t)];
        let pools = pools();
        let consents = BTreeSet::new();
        let mut plan_at = |now: i64| {
            planner.plan(&Inputs {
                transfers: &all,
                agents: &ag,
                catalog: Catalog {
                    pools: &pools,
                    consents: &consents,
                },
                ledger: &HashMap::new(),
                now: at(now),
            })
        };
        let key: Key = ("data".into(), "t".into());
        assert!(
            !plan_at(NOW).placements.contains_key(&key),
            "r0 is in its back-off, 10 s to go"
        );
        let later = plan_at(NOW + lifecycle::BACK_OFF - 20);
        assert_eq!(
            later
                .placements
                .get(&key)
                .and_then(|p| p.receivers.first().map(String::as_str)),
            Some("r0"),
            "the back-off over, r0 (live) is chosen again"
        );
        assert!(later.placements[&key].sender.is_none(), "s0 kept its side");
    }

    #[test]
    fn a_transfer_gone_from_the_cache_leaves_the_index() {
        let mut planner = Planner::default();
        let ag = agents(&[]);
        let all: Vec<Arc<Transfer>> = (0..5).map(|i| queued(&format!("t{i}"), 0, i)).collect();
        plan(&mut planner, &all, &ag, &HashMap::new());
        assert_eq!(planner.entries.len(), 5);
        let p = plan(&mut planner, &all[..2], &ag, &HashMap::new());
        assert_eq!(planner.entries.len(), 2);
        assert_eq!(p.positions.len(), 2);
        assert!(p.placements.is_empty(), "no agents, no placements");
    }
}
