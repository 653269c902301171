//! Who runs next, and on which agents: a pure function of the waiting
//! transfers and the agents' free slots, so its order and fairness are tested
//! without an API server.
//!
//! Order: higher priority first; within one priority, namespaces take turns
//! (the namespace with the fewest transfers already running on the pool goes
//! first, then the one waiting longest), and each namespace's own transfers
//! run oldest first. A transfer that cannot be placed because a pool it needs
//! is busy reserves what it needs in its other pool, so that the ones behind
//! it take only what does not delay it: otherwise a high priority needing
//! two pools waits for ever while lower ones keep taking the free agent of
//! the pool that is not full. A transfer that could not run even on idle
//! agents (a pool it needs has no live agent it may use) reserves nothing.

use std::collections::{BTreeMap, HashMap, VecDeque};

/// `namespace/name`.
pub type Key = (String, String);

/// A transfer that needs one or both agents.
#[derive(Clone, Debug, PartialEq)]
pub struct Waiting {
    /// The Transfer.
    pub key: Key,
    /// Its priority.
    pub priority: i32,
    /// Creation time, in seconds (older first).
    pub created: i64,
    /// `namespace/pool` the sender comes from, when a sender is needed.
    pub sender_pool: Option<Key>,
    /// `namespace/pool` the receivers come from, when receivers are needed.
    pub receiver_pool: Option<Key>,
    /// How many distinct receivers it needs from `receiver_pool` (one per
    /// pair; 1 for a transfer over one pair): the most.
    pub receivers: usize,
    /// How many it may start with: `receivers`, or fewer (pairsPolicy
    /// Auto starts on one and grows).
    pub least: usize,
    /// Agents this transfer must not get (lost ones).
    pub avoid: Vec<String>,
    /// It runs, and asks for a receiver to replace a lost pair: placed
    /// when one is free, holding nothing while none is.
    pub replacing: bool,
    /// Relays it may take from `sender_pool` once placed: the most, and
    /// only agents no Transfer in line could use now (see [`relays`]).
    pub relays: usize,
}

/// An agent with room for more transfers.
#[derive(Clone, Debug, PartialEq)]
pub struct Slot {
    /// `namespace/pool`.
    pub pool: Key,
    /// Agent name.
    pub agent: String,
    /// Transfers it can still take.
    pub free: i32,
    /// Transfers it can take in all, busy or not.
    pub capacity: i32,
}

/// The agents chosen for one transfer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    /// New sender, if one was needed.
    pub sender: Option<String>,
    /// New receivers, one per pair, if they were needed.
    pub receivers: Vec<String>,
    /// Relays from the sender's pool, with a new sender (see [`relays`]).
    pub relays: Vec<String>,
}

/// The queue in the order transfers should get agents.
pub fn order(waiting: &[Waiting], running_per_namespace: &HashMap<String, usize>) -> Vec<Key> {
    let mut by_priority: BTreeMap<std::cmp::Reverse<i32>, BTreeMap<String, Vec<&Waiting>>> =
        BTreeMap::new();
    for w in waiting {
        by_priority
            .entry(std::cmp::Reverse(w.priority))
            .or_default()
            .entry(w.key.0.clone())
            .or_default()
            .push(w);
    }
    let mut out = Vec::with_capacity(waiting.len());
    for namespaces in by_priority.into_values() {
        let mut queues: Vec<(String, VecDeque<&Waiting>)> = namespaces
            .into_iter()
            .map(|(ns, mut v)| {
                v.sort_by(|a, b| a.created.cmp(&b.created).then_with(|| a.key.cmp(&b.key)));
                (ns, v.into())
            })
            .collect();
        let running = |ns: &str| running_per_namespace.get(ns).copied().unwrap_or(0);
        queues.sort_by(|(a, qa), (b, qb)| {
            running(a)
                .cmp(&running(b))
                .then_with(|| qa[0].created.cmp(&qb[0].created))
                .then_with(|| a.cmp(b))
        });
        while !queues.is_empty() {
            queues.retain_mut(|(_, q)| match q.pop_front() {
                Some(w) => {
                    out.push(w.key.clone());
                    true
                }
                None => false,
            });
            queues.retain(|(_, q)| !q.is_empty());
        }
    }
    out
}

/// Places transfers in `order` on the agents with the most free slots;
/// one that waits for a busy pool holds a slot in its other pool.
pub fn assign(order: &[Key], waiting: &[Waiting], slots: &[Slot]) -> BTreeMap<Key, Placement> {
    let by_key: HashMap<&Key, &Waiting> = waiting.iter().map(|w| (&w.key, w)).collect();
    let mut free: Vec<Slot> = slots.to_vec();
    // Room left per pool: once a pool is full, the rest of a long queue for
    // it is passed over without looking at each of its agents.
    let mut room: HashMap<Key, i32> = HashMap::new();
    for s in slots {
        *room.entry(s.pool.clone()).or_default() += s.free.max(0);
    }
    // Nothing left there for it: full, or not needed.
    let spent = |room: &HashMap<Key, i32>, pool: &Option<Key>| {
        pool.as_ref()
            .is_none_or(|p| room.get(p).copied().unwrap_or(0) <= 0)
    };
    // Slots held for transfers that wait on a busy pool, by that pool. No
    // more are held than the busy pool could ever start at once: a long
    // queue blocked on one pool must not idle every agent of the other.
    let mut capacity: HashMap<&Key, i32> = HashMap::new();
    for s in slots {
        *capacity.entry(&s.pool).or_default() += s.capacity.max(0);
    }
    let mut held_for: HashMap<&Key, i32> = HashMap::new();
    let mut placed = BTreeMap::new();
    // Transfers that run and ask for one more receiver (a lost pair's
    // replacement, or pairsPolicy Auto growing) take only what those of
    // their priority waiting to start leave; a higher priority still goes
    // first. `order` is by priority already: the sort is stable.
    let mut order: Vec<&Key> = order.iter().collect();
    order.sort_by_key(|k| {
        by_key
            .get(k)
            .map(|w| (std::cmp::Reverse(w.priority), w.replacing))
    });
    for &key in &order {
        let Some(w) = by_key.get(key) else { continue };
        if spent(&room, &w.sender_pool) && spent(&room, &w.receiver_pool) {
            continue;
        }
        let pick = |free: &[Slot], pool: &Key| {
            free.iter()
                .enumerate()
                .filter(|(_, s)| &s.pool == pool && s.free > 0 && !w.avoid.contains(&s.agent))
                // Most room first; the name breaks ties so the choice is repeatable.
                .max_by(|(_, a), (_, b)| a.free.cmp(&b.free).then_with(|| b.agent.cmp(&a.agent)))
                .map(|(i, _)| i)
        };
        let sender = w.sender_pool.as_ref().map(|pool| pick(&free, pool));
        let receiver = w
            .receiver_pool
            .as_ref()
            .map(|pool| receivers(&free, pool, w, sender.flatten()));
        let complete =
            sender.is_none_or(|s| s.is_some()) && receiver.as_ref().is_none_or(|r| r.is_ok());
        if !complete {
            let blocked: Vec<&Key> = [
                (&w.sender_pool, sender.is_some_and(|s| s.is_none())),
                (
                    &w.receiver_pool,
                    receiver.as_ref().is_some_and(|r| r.is_err()),
                ),
            ]
            .into_iter()
            .filter_map(|(pool, short)| pool.as_ref().filter(|_| short))
            .collect();
            let room_to_hold = blocked.iter().all(|p| {
                held_for.get(p).copied().unwrap_or(0) < capacity.get(p).copied().unwrap_or(0)
            });
            if w.replacing || !room_to_hold || !could_run(w, slots) {
                continue;
            }
            for p in blocked {
                *held_for.entry(p).or_default() += 1;
            }
        }
        // Placed, or (incomplete) the slots it found held for it: no more
        // than it may start with (pairsPolicy Auto needs one).
        let mut found: Vec<usize> = receiver
            .map(|r| r.unwrap_or_else(|short| short))
            .unwrap_or_default();
        if !complete {
            found.truncate(w.least.clamp(1, w.receivers.max(1)));
        }
        for i in sender.flatten().iter().chain(&found) {
            free[*i].free -= 1;
            *room.entry(free[*i].pool.clone()).or_default() -= 1;
        }
        if complete {
            placed.insert(
                key.clone(),
                Placement {
                    sender: sender.flatten().map(|i| free[i].agent.clone()),
                    receivers: found.iter().map(|i| free[*i].agent.clone()).collect(),
                    relays: Vec::new(),
                },
            );
        }
    }
    relays(&order, &mut placed, &by_key, &mut free);
    placed
}

/// Gives each Transfer placed with a new sender that may take relays
/// (`Waiting::relays`) agents free in the sender's pool, one per pair it
/// was placed on but the sender's, in line order: only once every
/// Transfer in line has been placed or has had its slots held, so that
/// a relay never takes a slot one of them could use. Never the sender
/// nor one of the receivers. Most room first; the name breaks ties.
fn relays(
    order: &[&Key],
    placed: &mut BTreeMap<Key, Placement>,
    by_key: &HashMap<&Key, &Waiting>,
    free: &mut [Slot],
) {
    for &key in order {
        let (Some(p), Some(w)) = (placed.get_mut(key), by_key.get(key)) else {
            continue;
        };
        let (Some(pool), Some(sender)) = (&w.sender_pool, &p.sender) else {
            continue;
        };
        // One per pair but the sender's own: an Auto Transfer placed on
        // fewer receivers than it may grow to takes fewer.
        let pairs = match p.receivers.is_empty() {
            true => w.relays + 1,
            false => p.receivers.len(),
        };
        while p.relays.len() < w.relays.min(pairs - 1) {
            let taken = |a: &String| a == sender || p.receivers.contains(a) || p.relays.contains(a);
            let best = free
                .iter()
                .enumerate()
                .filter(|(_, s)| {
                    &s.pool == pool && s.free > 0 && !w.avoid.contains(&s.agent) && !taken(&s.agent)
                })
                .max_by(|(_, a), (_, b)| a.free.cmp(&b.free).then_with(|| b.agent.cmp(&a.agent)))
                .map(|(i, _)| i);
            let Some(i) = best else { break };
            free[i].free -= 1;
            p.relays.push(free[i].agent.clone());
        }
    }
}

/// The `w.receivers` distinct agents of `pool` to receive `w`, as indices
/// into `free`: Ok with all of them, or Err with those there are room for
/// now. Most room first. An agent also sends only when it is the pool's
/// last choice (two agents spread the disk load), and then takes two of
/// its slots.
fn receivers(
    free: &[Slot],
    pool: &Key,
    w: &Waiting,
    sender: Option<usize>,
) -> Result<Vec<usize>, Vec<usize>> {
    let mut candidates: Vec<usize> = (0..free.len())
        .filter(|&i| {
            let s = &free[i];
            &s.pool == pool
                && !w.avoid.contains(&s.agent)
                && s.free >= if Some(i) == sender { 2 } else { 1 }
        })
        .collect();
    // The sender last, then most room; the name breaks ties so the choice
    // is repeatable.
    candidates.sort_by(|&a, &b| {
        (Some(a) == sender)
            .cmp(&(Some(b) == sender))
            .then_with(|| free[b].free.cmp(&free[a].free))
            .then_with(|| free[a].agent.cmp(&free[b].agent))
    });
    candidates.truncate(w.receivers.max(1));
    if candidates.len() >= w.least.clamp(1, w.receivers.max(1)) {
        Ok(candidates)
    } else {
        Err(candidates)
    }
}

/// Whether `w` could be placed once agents finish what they run: every
/// pool it needs has as many live agents it may use as it needs there.
pub fn could_run(w: &Waiting, slots: &[Slot]) -> bool {
    let usable = |pool: &Option<Key>, needed: usize| {
        pool.as_ref().is_none_or(|p| {
            slots
                .iter()
                .filter(|s| &s.pool == p && !w.avoid.contains(&s.agent))
                .count()
                >= needed
        })
    };
    usable(&w.sender_pool, 1) && usable(&w.receiver_pool, w.least.clamp(1, w.receivers.max(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An agent with `free` slots, of capacity `free` (1 when it is full).
    fn slot(pool_name: &str, agent: &str, free: i32) -> Slot {
        Slot {
            pool: pool(pool_name),
            agent: agent.into(),
            free,
            capacity: free.max(1),
        }
    }

    fn pool(name: &str) -> Key {
        ("data".into(), name.into())
    }

    fn w(ns: &str, name: &str, priority: i32, created: i64) -> Waiting {
        Waiting {
            key: (ns.into(), name.into()),
            priority,
            created,
            sender_pool: Some(pool("src")),
            receiver_pool: Some(pool("dst")),
            receivers: 1,
            least: 1,
            avoid: vec![],
            replacing: false,
            relays: 0,
        }
    }

    fn names(keys: &[Key]) -> Vec<&str> {
        keys.iter().map(|k| k.1.as_str()).collect()
    }

    #[test]
    fn priority_then_age() {
        let q = [
            w("a", "old-low", 0, 1),
            w("a", "new-high", 5, 9),
            w("a", "new-low", 0, 5),
        ];
        assert_eq!(
            names(&order(&q, &HashMap::new())),
            ["new-high", "old-low", "new-low"]
        );
    }

    #[test]
    fn namespaces_take_turns_within_a_priority() {
        let q = [
            w("busy", "b1", 0, 1),
            w("busy", "b2", 0, 2),
            w("busy", "b3", 0, 3),
            w("quiet", "q1", 0, 10),
        ];
        assert_eq!(names(&order(&q, &HashMap::new())), ["b1", "q1", "b2", "b3"]);
        // A namespace that already runs transfers on the pool goes after one that runs none.
        let running = HashMap::from([("busy".to_owned(), 2)]);
        assert_eq!(names(&order(&q, &running)), ["q1", "b1", "b2", "b3"]);
    }

    #[test]
    fn places_within_capacity_and_spreads_load() {
        let q = [w("a", "t1", 0, 1), w("a", "t2", 0, 2), w("a", "t3", 0, 3)];
        let slots = [
            slot("src", "s0", 2),
            slot("dst", "r0", 1),
            slot("dst", "r1", 1),
        ];
        let placed = assign(&order(&q, &HashMap::new()), &q, &slots);
        assert_eq!(placed.len(), 2, "the sender has two slots");
        let t1 = &placed[&("a".to_owned(), "t1".to_owned())];
        let t2 = &placed[&("a".to_owned(), "t2".to_owned())];
        assert_eq!(t1.sender.as_deref(), Some("s0"));
        assert_ne!(t1.receivers, t2.receivers, "receivers are spread");
    }

    fn placed_names(placed: &BTreeMap<Key, Placement>) -> Vec<&str> {
        placed.keys().map(|k| k.1.as_str()).collect()
    }

    // Found on a real API server (issue 39): a priority-100 Transfer
    // needing agents of two pools stayed Queued through five rounds, while
    // priority-0 Transfers took the free agent of the pool that was not
    // full each time one freed up.
    #[test]
    fn a_transfer_waiting_for_a_full_pool_holds_its_agent_in_the_other() {
        let mut high = w("a", "high", 100, 5);
        high.sender_pool = Some(pool("busy"));
        high.receiver_pool = Some(pool("dst"));
        // Low priorities that need only the pool with room (an external receiver).
        let low: Vec<Waiting> = (0..3)
            .map(|i| {
                let mut l = w("a", &format!("low{i}"), 0, i);
                l.sender_pool = Some(pool("dst"));
                l.receiver_pool = None;
                l
            })
            .collect();
        let q: Vec<Waiting> = std::iter::once(high.clone()).chain(low).collect();
        let ord = order(&q, &HashMap::new());
        assert_eq!(ord[0], high.key);

        // The busy pool's agent is full, the other has one free slot: it is
        // held for high, and no low priority takes it.
        let slots = [slot("busy", "b0", 0), slot("dst", "r0", 1)];
        assert!(assign(&ord, &q, &slots).is_empty());

        // A second free slot is backfilled: taking it delays nobody.
        let slots = [slot("busy", "b0", 0), slot("dst", "r0", 2)];
        assert_eq!(placed_names(&assign(&ord, &q, &slots)), ["low0"]);

        // The busy agent frees a slot: high gets both.
        let slots = [slot("busy", "b0", 1), slot("dst", "r0", 1)];
        let placed = assign(&ord, &q, &slots);
        assert_eq!(placed_names(&placed), ["high"]);
        assert_eq!(
            placed[&high.key],
            Placement {
                sender: Some("b0".into()),
                receivers: vec!["r0".into()],
                relays: vec![]
            }
        );
    }

    // A queue blocked on a busy pool holds no more of the other pool than
    // the busy pool could start at once; the rest is backfilled.
    #[test]
    fn a_long_queue_blocked_on_one_pool_does_not_idle_the_other() {
        let highs = (0..3).map(|i| {
            let mut h = w("a", &format!("high{i}"), 100, i);
            h.sender_pool = Some(pool("busy"));
            h.receiver_pool = Some(pool("dst"));
            h
        });
        let lows = (0..3).map(|i| {
            let mut l = w("a", &format!("low{i}"), 0, i);
            l.sender_pool = Some(pool("dst"));
            l.receiver_pool = None;
            l
        });
        let q: Vec<Waiting> = highs.chain(lows).collect();
        let ord = order(&q, &HashMap::new());
        // The busy pool has one agent of capacity 1, all taken.
        let slots = [slot("busy", "b0", 0), slot("dst", "r0", 3)];
        assert_eq!(placed_names(&assign(&ord, &q, &slots)), ["low0", "low1"]);
    }

    #[test]
    fn one_agent_sends_and_receives_only_with_two_free_slots() {
        let mut within = w("a", "within", 0, 1);
        within.receiver_pool = Some(pool("src"));
        let q = [within.clone()];
        let placed = assign(&[within.key.clone()], &q, &[slot("src", "s0", 1)]);
        assert!(placed.is_empty(), "one slot is not two: {placed:?}");
        let placed = assign(&[within.key.clone()], &q, &[slot("src", "s0", 2)]);
        assert_eq!(
            placed[&within.key],
            Placement {
                sender: Some("s0".into()),
                receivers: vec!["s0".into()],
                relays: vec![]
            }
        );
    }

    #[test]
    fn a_transfer_that_cannot_run_at_all_holds_nothing_back() {
        // Its pool has no live agent (or only ones it lost): nothing frees
        // up for it, so holding a slot would only waste it.
        let mut blocked = w("a", "to-empty-pool", 5, 1);
        blocked.receiver_pool = Some(pool("empty"));
        let q = [blocked.clone(), w("a", "other", 0, 2)];
        let slots = [slot("src", "s0", 1), slot("dst", "r0", 1)];
        let placed = assign(&order(&q, &HashMap::new()), &q, &slots);
        assert_eq!(placed_names(&placed), ["other"]);

        blocked.avoid = vec!["e0".into()];
        let q = [blocked, w("a", "other", 0, 2)];
        let slots = [
            slot("src", "s0", 1),
            slot("dst", "r0", 1),
            slot("empty", "e0", 0),
        ];
        let placed = assign(&order(&q, &HashMap::new()), &q, &slots);
        assert_eq!(placed_names(&placed), ["other"]);
    }

    #[test]
    fn failover_needs_one_side_and_avoids_the_lost_agent() {
        let mut f = w("a", "t", 0, 1);
        f.sender_pool = None;
        f.avoid = vec!["r0".into()];
        let slots = [slot("dst", "r0", 2), slot("dst", "r1", 1)];
        let placed = assign(&[f.key.clone()], &[f.clone()], &slots);
        assert_eq!(
            placed[&f.key],
            Placement {
                sender: None,
                receivers: vec!["r1".into()],
                relays: vec![]
            }
        );
        // No other live agent: it waits.
        let placed = assign(&[f.key.clone()], &[f], &slots[..1]);
        assert!(placed.is_empty());
    }

    /// `name` over `pairs` pairs, from src into dst.
    fn over_pairs(name: &str, pairs: usize, created: i64) -> Waiting {
        let mut p = w("a", name, 0, created);
        p.receivers = pairs;
        p.least = pairs;
        p
    }

    #[test]
    fn several_pairs_get_as_many_distinct_receivers_or_wait() {
        let q = [over_pairs("wide", 3, 1)];
        let slots = [
            slot("src", "s0", 1),
            slot("dst", "r0", 2),
            slot("dst", "r1", 1),
            slot("dst", "r2", 1),
        ];
        let placed = assign(&order(&q, &HashMap::new()), &q, &slots);
        let p = &placed[&q[0].key];
        assert_eq!(p.sender.as_deref(), Some("s0"));
        assert_eq!(
            p.receivers,
            ["r0", "r1", "r2"],
            "three agents, one pair each"
        );

        // Two agents free for three pairs: it waits, and holds the two
        // (and the sender) so that the one-pair Transfers behind it do
        // not take them.
        let q = [over_pairs("wide", 3, 1), w("a", "narrow", 0, 2)];
        let slots = [
            slot("src", "s0", 2),
            slot("dst", "r0", 1),
            slot("dst", "r1", 1),
            slot("dst", "r2", 0),
        ];
        let placed = assign(&order(&q, &HashMap::new()), &q, &slots);
        assert!(placed.is_empty(), "{placed:?}");

        // A pool with fewer agents than pairs could never run it: it holds
        // nothing, and the one behind it runs.
        let slots = [
            slot("src", "s0", 2),
            slot("dst", "r0", 1),
            slot("dst", "r1", 1),
        ];
        assert!(!could_run(&q[0], &slots));
        let placed = assign(&order(&q, &HashMap::new()), &q, &slots);
        assert_eq!(placed_names(&placed), ["narrow"]);
    }

    /// A running Transfer over several pairs that asks for a lost pair's
    /// replacement gets a free receiver it does not avoid; while none is
    /// free it holds nothing, and what it would have held stays with the
    /// Transfers waiting behind it.
    #[test]
    fn a_replacement_takes_a_free_receiver_and_holds_nothing_while_none_is() {
        let replacing = |created| Waiting {
            sender_pool: None,
            avoid: vec!["r0".into()],
            replacing: true,
            ..w("a", "running", 0, created)
        };
        let q = [replacing(1)];
        let slots = [slot("dst", "r0", 3), slot("dst", "r1", 1)];
        let placed = assign(&order(&q, &HashMap::new()), &q, &slots);
        let p = &placed[&q[0].key];
        assert_eq!(
            (p.sender.as_deref(), p.receivers.as_slice()),
            (None, &["r1".to_owned()][..])
        );

        // The only free receiver is one both lost before (the other is
        // busy). The replacements
        // wait without counting as holders of dst; the one-pair Transfer
        // behind it holds the sender it found, so the one after that,
        // which could use it, waits too.
        let mut narrow = w("a", "narrow", 0, 3);
        narrow.avoid = vec!["r0".into()];
        let mut other = w("a", "other", 0, 4);
        other.receiver_pool = Some(pool("dst2"));
        let mut second = replacing(2);
        second.key.1 = "running-too".into();
        let q = [replacing(1), second, narrow, other];
        let slots = [
            slot("src", "s0", 1),
            slot("dst", "r0", 1),
            Slot {
                free: 0,
                ..slot("dst", "r1", 1)
            },
            slot("dst2", "x0", 1),
        ];
        let placed = assign(&order(&q, &HashMap::new()), &q, &slots);
        assert!(placed.is_empty(), "{placed:?}");
    }

    /// pairsPolicy Auto: as many receivers as are free, up to its bound,
    /// one at least; a pool of one agent can run it.
    #[test]
    fn auto_pairs_take_the_receivers_free_up_to_the_bound() {
        let mut auto = over_pairs("auto", 3, 1);
        auto.least = 1;
        let q = [auto.clone()];
        let slots = [
            slot("src", "s0", 1),
            slot("dst", "r0", 1),
            slot("dst", "r1", 1),
            slot("dst", "r2", 0),
        ];
        let placed = assign(&order(&q, &HashMap::new()), &q, &slots);
        assert_eq!(placed[&auto.key].receivers, ["r0", "r1"]);
        let one = [slot("src", "s0", 1), slot("dst", "r0", 1)];
        assert!(could_run(&auto, &one));
        let placed = assign(&order(&q, &HashMap::new()), &q, &one);
        assert_eq!(placed[&auto.key].receivers, ["r0"]);
        // Five free: no more than three.
        let five: Vec<Slot> = std::iter::once(slot("src", "s0", 1))
            .chain((0..5).map(|i| slot("dst", &format!("r{i}"), 1)))
            .collect();
        let placed = assign(&order(&q, &HashMap::new()), &q, &five);
        assert_eq!(placed[&auto.key].receivers.len(), 3);
    }

    /// A running Transfer that grows (or replaces a lost pair) takes only
    /// what the ones waiting to start leave, however old it is.
    #[test]
    fn a_growing_transfer_yields_to_those_waiting_to_start() {
        let growing = Waiting {
            sender_pool: None,
            replacing: true,
            ..w("a", "growing", 0, 1)
        };
        let q = [growing, w("b", "new", 0, 2)];
        let slots = [slot("src", "s0", 1), slot("dst", "r0", 1)];
        let placed = assign(&order(&q, &HashMap::new()), &q, &slots);
        assert_eq!(placed_names(&placed), ["new"]);
        // Found by review: not before a higher priority, though.
        let mut urgent = q[0].clone();
        urgent.priority = 10;
        let q = [urgent, w("b", "new", 0, 2)];
        let slots = [slot("src", "s0", 1), slot("dst", "r0", 1)];
        let placed = assign(&order(&q, &HashMap::new()), &q, &slots);
        assert_eq!(placed_names(&placed), ["growing"]);
    }

    /// Found by review: an Auto Transfer waiting for a busy sending pool
    /// held every receiver it could grow to; it holds the one it may start
    /// with, and the others go to those behind it.
    #[test]
    fn an_auto_transfer_waiting_for_a_sender_holds_one_receiver() {
        let mut auto = over_pairs("auto", 3, 1);
        auto.least = 1;
        let mut other = w("a", "other", 0, 2);
        other.sender_pool = Some(pool("src2"));
        other.receivers = 2;
        other.least = 2;
        let q = [auto, other];
        let slots = [
            slot("src", "s0", 0),
            slot("src2", "t0", 1),
            slot("dst", "r0", 1),
            slot("dst", "r1", 1),
            slot("dst", "r2", 1),
        ];
        let placed = assign(&order(&q, &HashMap::new()), &q, &slots);
        assert_eq!(placed_names(&placed), ["other"]);
    }

    /// Relays take only what no Transfer in line could use, from the
    /// sender's pool, never the sender or a receiver, and only with a new
    /// sender.
    #[test]
    fn relays_take_only_what_the_line_leaves() {
        let mut multi = w("a", "multi", 5, 1);
        multi.receivers = 3;
        multi.least = 3;
        multi.relays = 2;
        let behind = w("a", "behind", 0, 2);
        let slots = [
            slot("src", "s0", 1),
            slot("src", "s1", 1),
            slot("src", "s2", 1),
            slot("dst", "r0", 1),
            slot("dst", "r1", 1),
            slot("dst", "r2", 1),
            slot("dst", "r3", 1),
        ];
        let q = [multi.clone(), behind.clone()];
        let placed = assign(&order(&q, &HashMap::new()), &q, &slots);
        let m = &placed[&multi.key];
        assert_eq!(m.sender.as_deref(), Some("s0"));
        // The one behind, though of a lower priority, sends from s1
        // before s1 may relay: only s2 is left.
        assert_eq!(placed[&behind.key].sender.as_deref(), Some("s1"));
        assert_eq!(m.relays, ["s2"]);
        // Alone, it takes two, never its sender.
        let placed = assign(
            &order(&[multi.clone()], &HashMap::new()),
            &[multi.clone()],
            &slots,
        );
        let mut got = placed[&multi.key].relays.clone();
        got.sort();
        assert_eq!(got, ["s1", "s2"]);
        // Placed on one receiver (pairsPolicy Auto), it sends that pair
        // itself: no relay.
        let mut auto = multi.clone();
        auto.least = 1;
        let one = [
            slot("src", "s0", 1),
            slot("src", "s1", 1),
            slot("dst", "r0", 1),
        ];
        let placed = assign(
            &order(&[auto.clone()], &HashMap::new()),
            &[auto.clone()],
            &one,
        );
        assert_eq!(placed[&auto.key].receivers, ["r0"]);
        assert!(placed[&auto.key].relays.is_empty());
        // Without a new sender (a replacement), none.
        let mut replacing = multi.clone();
        replacing.sender_pool = None;
        replacing.receivers = 1;
        replacing.least = 1;
        let placed = assign(
            &order(&[replacing.clone()], &HashMap::new()),
            &[replacing.clone()],
            &slots,
        );
        assert!(placed[&replacing.key].relays.is_empty());
    }
}
