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

/// Reads an agent from its Lease; `pods` maps pod names of the Lease's
/// namespace to pods. None when the Lease is not an agent's.
pub fn from_lease(lease: &Lease, pods: &BTreeMap<String, &Pod>, now: Timestamp) -> Option<Agent> {
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

    let dead = match &renewed {
        None => Some("the agent has not renewed its Lease yet".to_owned()),
        // checked: a renewTime near the end of time must not panic the operator.
        Some(t)
            if t.0
                .checked_add(SignedDuration::from_secs(duration))
                .is_ok_and(|end| end < now) =>
        {
            Some(format!(
                "its Lease expired: last renewed {}s ago, valid for {duration}s",
                now.duration_since(t.0).as_secs()
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
        expires: renewed
            .as_ref()
            .and_then(|t| t.0.checked_add(SignedDuration::from_secs(duration)).ok()),
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
        let a = from_lease(&lease("p", "a", 100, None), &pods, at(110)).unwrap();
        assert!(a.live());
        assert_eq!(a.capacity, 2);
        assert_eq!(a.address.as_deref(), Some("a.example:7700"));
        let a = from_lease(&lease("p", "a", 100, None), &pods, at(120)).unwrap();
        assert!(a.dead.unwrap().contains("Lease expired"));
    }

    #[test]
    fn a_deleted_pod_kills_a_fresh_lease() {
        let l = lease("p", "p-agent-0", 100, Some("p-agent-0"));
        let none = BTreeMap::new();
        let a = from_lease(&l, &none, at(101)).unwrap();
        assert!(a.dead.unwrap().contains("is gone"));

        let mut pod = Pod::default();
        let pods = BTreeMap::from([("p-agent-0".to_owned(), &pod)]);
        assert!(from_lease(&l, &pods, at(101)).unwrap().live());
        pod.metadata.deletion_timestamp = Some(Time(at(100)));
        let pods = BTreeMap::from([("p-agent-0".to_owned(), &pod)]);
        assert!(
            from_lease(&l, &pods, at(101))
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
        assert!(from_lease(&l, &BTreeMap::new(), at(100)).is_none());
    }
}
