//! Agent liveness, read from each agent's coordination.k8s.io Lease (so agents
//! outside the cluster can join a pool) and, in the cluster, from its pod.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use wirerate_crds::contract;
use wirerate_crds::lease::PathTestRecord;
use wirerate_crds::transfer::{AgentRef, Role};
use wirerate_crds::{AgentLease, Transfer};

/// Who an agent is. A name alone is not enough: names are unique only within
/// one pool, and pools of the same name live in different namespaces.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AgentId {
    /// Namespace of its pool (and of its Lease).
    pub namespace: String,
    /// Its pool.
    pub pool: String,
    /// Agent name.
    pub name: String,
}

impl AgentId {
    /// The agent `name` of the pool `pool` (`namespace/name`).
    pub fn new(pool: &(String, String), name: &str) -> Self {
        Self {
            namespace: pool.0.clone(),
            pool: pool.1.clone(),
            name: name.to_owned(),
        }
    }

    /// The agent `who` that holds `role` in `t`.
    pub fn assigned(t: &Transfer, role: Role, who: &AgentRef) -> Self {
        Self {
            namespace: t.pool_namespace(role).unwrap_or_default().to_owned(),
            pool: who.pool.clone(),
            name: who.name.clone(),
        }
    }
}

/// One agent as the operator sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Agent {
    /// Agent name.
    pub name: String,
    /// Its pool.
    pub pool: String,
    /// Namespace of the pool (and of the Lease).
    pub namespace: String,
    /// Advertised data address.
    pub address: Option<String>,
    /// Node or host.
    pub node: Option<String>,
    /// Its pod, in the cluster.
    pub pod: Option<String>,
    /// Transfers it accepts at once.
    pub capacity: i32,
    /// Last renewal.
    pub renewed: Option<Time>,
    /// When its Lease runs out unless renewed.
    pub expires: Option<Timestamp>,
    /// Why it is not live, if it is not.
    pub dead: Option<String>,
    /// Host checks that failed: (check, message).
    pub preflight: Vec<(String, String)>,
    /// The I/O mode in effect for the pool's transfers on it.
    pub io_mode: Option<String>,
    /// Why that mode is not the one the pool asks for.
    pub io_mode_reason: Option<String>,
    /// Its path-test listener, host:port.
    pub path_test_address: Option<String>,
    /// Its last path test to each target.
    pub path_tests: Vec<PathTestRecord>,
}

impl Agent {
    /// Its identity.
    pub fn id(&self) -> AgentId {
        AgentId {
            namespace: self.namespace.clone(),
            pool: self.pool.clone(),
            name: self.name.clone(),
        }
    }

    /// Whether transfers may be assigned to it, and kept on it.
    pub fn live(&self) -> bool {
        self.dead.is_none()
    }

    /// What its Transfers and its pool's status depend on; a renewal alone
    /// changes none of it.
    pub fn summary(&self) -> Summary {
        Summary {
            live: self.live(),
            capacity: self.capacity,
            address: self.address.clone(),
            node: self.node.clone(),
            pod: self.pod.clone(),
            preflight: self.preflight.clone(),
            io_mode: self.io_mode.clone(),
            path_test_address: self.path_test_address.clone(),
            path_tests: self.path_tests.clone(),
        }
    }
}

/// An agent as far as anyone who reads it cares, without its heartbeat.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    live: bool,
    capacity: i32,
    address: Option<String>,
    node: Option<String>,
    pod: Option<String>,
    preflight: Vec<(String, String)>,
    io_mode: Option<String>,
    path_test_address: Option<String>,
    path_tests: Vec<PathTestRecord>,
}

/// The agents whose summary differs between `before` and `after` (new and gone ones too).
pub fn changed(
    before: &HashMap<AgentId, Summary>,
    after: &HashMap<AgentId, Summary>,
) -> BTreeSet<AgentId> {
    let mut out = BTreeSet::new();
    for (id, s) in after {
        if before.get(id) != Some(s) {
            out.insert(id.clone());
        }
    }
    for id in before.keys() {
        if !after.contains_key(id) {
            out.insert(id.clone());
        }
    }
    out
}

/// The most transfers one agent is counted as taking at once, whatever
/// its Lease says: what a pool may ask of an agent.
pub const MAX_CAPACITY: i32 = contract::MAX_TRANSFERS_PER_AGENT;

/// When the operator heard each agent's Lease renewed, on its own clock.
///
/// An agent's `renewTime` is stamped by the agent's clock and reaches the
/// operator as late as the API server lets it: judged against the
/// operator's clock, a skewed agent clock or a slow API server looks like a
/// lost agent, and a lost agent costs its Transfers an attempt. As the
/// node lifecycle controller does, a Lease is judged from when its latest
/// renewal was first seen. A renewal seen for the first time (an operator
/// that just started) is trusted as stamped, but never from the future.
#[derive(Debug, Default)]
pub struct Heartbeats(HashMap<(String, String), (Timestamp, Timestamp)>);

impl Heartbeats {
    /// When the operator first saw `lease`'s current renewal (None when it
    /// was never renewed), noting it at `now` if it is new.
    pub fn hear(&mut self, lease: &Lease, now: Timestamp) -> Option<Timestamp> {
        let renewed = lease.spec.as_ref()?.renew_time.as_ref()?.0;
        let key = (
            lease.metadata.namespace.clone().unwrap_or_default(),
            lease.metadata.name.clone().unwrap_or_default(),
        );
        let heard = match self.0.get(&key) {
            Some((r, heard)) if *r == renewed => return Some(*heard),
            Some(_) => now,
            None => renewed.min(now),
        };
        self.0.insert(key, (renewed, heard));
        Some(heard)
    }

    /// Forgets the Leases not in `leases` (deleted ones).
    pub fn keep_only<'a>(&mut self, leases: impl Iterator<Item = &'a Lease>) {
        let keep: BTreeSet<(&str, &str)> = leases
            .map(|l| {
                (
                    l.metadata.namespace.as_deref().unwrap_or_default(),
                    l.metadata.name.as_deref().unwrap_or_default(),
                )
            })
            .collect();
        self.0
            .retain(|(ns, name), _| keep.contains(&(ns.as_str(), name.as_str())));
    }
}

/// Reads an agent from its Lease; `pods` maps pod names of the Lease's
/// namespace to pods; `heard` is when the operator saw its current renewal
/// (see [`Heartbeats`]; None judges by the agent's own `renewTime`). None
/// when the Lease is not an agent's.
pub fn from_lease(
    lease: &Lease,
    pods: &BTreeMap<String, &Pod>,
    now: Timestamp,
    heard: Option<Timestamp>,
) -> Option<Agent> {
    let meta = &lease.metadata;
    let pool = meta.labels.as_ref()?.get(contract::POOL_LABEL)?.clone();
    let spec = lease.spec.as_ref()?;
    let name = spec.holder_identity.clone()?;
    let said = AgentLease::from_lease(lease)?;
    let duration = i64::from(
        spec.lease_duration_seconds
            .unwrap_or(contract::LEASE_SECONDS),
    );
    let renewed = spec.renew_time.as_ref().map(|t| Time(t.0));
    let pod = said.pod.clone();
    let since = heard.or(renewed.as_ref().map(|t| t.0));

    let dead = match since {
        None => Some("the agent has not renewed its Lease yet".to_owned()),
        // checked: a renewTime near the end of time must not panic the operator.
        Some(t)
            if t.checked_add(SignedDuration::from_secs(duration))
                .is_ok_and(|end| end < now) =>
        {
            Some(format!(
                "its Lease expired: last renewal seen {}s ago, valid for {duration}s",
                now.duration_since(t).as_secs()
            ))
        }
        Some(_) => match pod.as_deref().map(|p| (p, pods.get(p))) {
            Some((p, None)) => Some(format!("its pod {p} is gone")),
            Some((p, Some(pod))) if pod.metadata.deletion_timestamp.is_some() => {
                Some(format!("its pod {p} is being deleted"))
            }
            _ => None,
        },
    };
    Some(Agent {
        name,
        pool,
        namespace: meta.namespace.clone().unwrap_or_default(),
        address: said.address,
        node: said.node,
        pod,
        capacity: said
            .capacity
            .unwrap_or(1)
            // Sums of capacities must not overflow.
            .clamp(1, MAX_CAPACITY),
        expires: since.and_then(|t| t.checked_add(SignedDuration::from_secs(duration)).ok()),
        renewed,
        dead,
        preflight: said.preflight,
        io_mode: said.io_mode.map(|m| m.as_str().to_owned()),
        io_mode_reason: said.io_mode_reason,
        path_test_address: said.path_test_address,
        path_tests: said.path_tests,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A Lease of `agent` in pool `pool` renewed at `renewed` (seconds).
    pub(crate) fn lease(pool: &str, agent: &str, renewed: i64, pod: Option<&str>) -> Lease {
        let mut lease = AgentLease {
            address: Some(format!("{agent}.example:7700")),
            capacity: Some(2),
            pod: pod.map(str::to_owned),
            ..AgentLease::default()
        }
        .to_lease(pool, agent, Timestamp::from_second(renewed).unwrap());
        lease.metadata.namespace = Some("data".into());
        lease
    }

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    #[test]
    fn lease_freshness_decides_liveness() {
        let pods = BTreeMap::new();
        let a = from_lease(&lease("p", "a", 100, None), &pods, at(110), None).unwrap();
        assert!(a.live());
        assert_eq!(a.capacity, 2);
        assert_eq!(a.address.as_deref(), Some("a.example:7700"));
        let a = from_lease(&lease("p", "a", 100, None), &pods, at(120), None).unwrap();
        assert!(a.dead.unwrap().contains("Lease expired"));
    }

    // Found on a real, loaded API server (issue 39): an agent whose
    // renewals reach the operator late, or whose clock runs behind, was
    // judged lost by its own stamp and its Transfers failed over.
    #[test]
    fn a_lease_is_judged_by_when_its_renewal_was_heard() {
        let pods = BTreeMap::new();
        let mut beats = Heartbeats::default();
        // First seen at 110, stamped 100: trusted as stamped.
        let l = lease("p", "a", 100, None);
        let heard = beats.hear(&l, at(110));
        assert_eq!(heard, Some(at(100)));
        assert!(from_lease(&l, &pods, at(110), heard).unwrap().live());
        // Its clock runs 20 s behind: stamped 110, first seen at 130.
        let l = lease("p", "a", 110, None);
        let heard = beats.hear(&l, at(130));
        assert_eq!(heard, Some(at(130)));
        let a = from_lease(&l, &pods, at(140), heard).unwrap();
        assert!(a.live(), "{:?}", a.dead);
        // Judged by its stamp alone, it was lost.
        assert!(!from_lease(&l, &pods, at(140), None).unwrap().live());
        // The same renewal seen again does not refresh it; 15 s of silence does expire it.
        assert_eq!(beats.hear(&l, at(146)), Some(at(130)));
        let a = from_lease(&l, &pods, at(146), Some(at(130))).unwrap();
        assert!(a.dead.unwrap().contains("Lease expired"));
        // A stamp from the future is not believed ahead of the operator's clock.
        let mut beats = Heartbeats::default();
        let l = lease("p", "b", 1000, None);
        assert_eq!(beats.hear(&l, at(200)), Some(at(200)));
        // Deleted Leases are forgotten.
        beats.keep_only(std::iter::empty());
        assert!(beats.0.is_empty());
    }

    #[test]
    fn a_deleted_pod_kills_a_fresh_lease() {
        let l = lease("p", "p-agent-0", 100, Some("p-agent-0"));
        let none = BTreeMap::new();
        let a = from_lease(&l, &none, at(101), None).unwrap();
        assert!(a.dead.unwrap().contains("is gone"));

        let mut pod = Pod::default();
        let pods = BTreeMap::from([("p-agent-0".to_owned(), &pod)]);
        assert!(from_lease(&l, &pods, at(101), None).unwrap().live());
        pod.metadata.deletion_timestamp = Some(Time(at(100)));
        let pods = BTreeMap::from([("p-agent-0".to_owned(), &pod)]);
        assert!(
            from_lease(&l, &pods, at(101), None)
                .unwrap()
                .dead
                .unwrap()
                .contains("being deleted")
        );
    }

    #[test]
    fn leases_without_a_pool_label_are_not_agents() {
        let mut l = lease("p", "a", 100, None);
        l.metadata.labels = None;
        assert!(from_lease(&l, &BTreeMap::new(), at(100), None).is_none());
    }
}
