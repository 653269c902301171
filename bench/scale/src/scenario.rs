//! The cluster the bench builds: pools of agents outside the cluster (their
//! Leases only), namespaces that consent to the pools, and Transfers spread
//! over the namespaces with mixed priorities, each from one pool to another.

use serde_json::{Value, json};
use wirerate_crds::contract;

/// Namespace of the operator's leader Lease.
pub(crate) const SYSTEM_NAMESPACE: &str = "wirerate-scale-system";
/// Namespace of the pools and their agents' Leases.
pub(crate) const POOL_NAMESPACE: &str = "wirerate-scale-pools";
/// Priorities the Transfers take in turn.
pub(crate) const PRIORITIES: [i32; 3] = [0, 5, 10];

/// What to build.
#[derive(Clone, Debug)]
pub(crate) struct Scenario {
    pub(crate) agents: usize,
    pub(crate) pools: usize,
    pub(crate) capacity: i32,
    pub(crate) transfers: usize,
    pub(crate) namespaces: usize,
    /// Where the pools' volumes are: `/data` for simulated agents (a path
    /// nothing reads), the bench's own directory for real ones.
    pub(crate) data_root: String,
    /// Real agents move bytes: each Transfer is paced to this rate so it
    /// is still running when the slots are counted. None: simulated agents.
    pub(crate) paced_mbps: Option<i64>,
}

/// One simulated agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Agent {
    pub(crate) pool: String,
    pub(crate) name: String,
    /// Its place among all agents (spreads their renewals over the period).
    pub(crate) index: usize,
}

/// One Transfer to create.
#[derive(Clone, Debug)]
pub(crate) struct TransferPlan {
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) body: Value,
}

impl Scenario {
    /// Pool names.
    pub(crate) fn pool_names(&self) -> Vec<String> {
        (0..self.pools).map(|p| format!("pool-{p}")).collect()
    }

    /// Namespaces of the Transfers.
    pub(crate) fn user_namespaces(&self) -> Vec<String> {
        (0..self.namespaces)
            .map(|n| format!("wirerate-scale-u{n}"))
            .collect()
    }

    /// Every namespace the bench needs.
    pub(crate) fn all_namespaces(&self) -> Vec<String> {
        let mut all = vec![SYSTEM_NAMESPACE.to_owned(), POOL_NAMESPACE.to_owned()];
        all.extend(self.user_namespaces());
        all
    }

    /// Agents, dealt to the pools in turn, named as a StatefulSet's pods are.
    pub(crate) fn agents(&self) -> Vec<Agent> {
        let pools = self.pool_names();
        let mut next = vec![0usize; pools.len()];
        (0..self.agents)
            .map(|i| {
                let p = i % pools.len();
                let a = Agent {
                    pool: pools[p].clone(),
                    name: format!("{}-agent-{}", pools[p], next[p]),
                    index: i,
                };
                next[p] += 1;
                a
            })
            .collect()
    }

    /// Transfers that can run at once: every one takes a slot in each of
    /// its two pools.
    pub(crate) fn slots(&self) -> usize {
        let per_pool = self.agents / self.pools.max(1);
        let slots = per_pool * self.capacity.max(0) as usize;
        if self.pools == 1 { slots / 2 } else { slots }
    }

    fn root(&self, pool: &str) -> String {
        format!("{}/{pool}/xfer", self.data_root)
    }

    fn source_of(&self, pool: &str, name: &str) -> String {
        format!("{}/{name}/src.h5", self.root(pool))
    }

    /// Transfer `i`'s source path.
    pub(crate) fn source_path(&self, i: usize) -> String {
        let (src, _) = self.direction(i);
        self.source_of(&self.pool_names()[src], &format!("t-{i:05}"))
    }

    /// Transfer `i`'s (source, destination) pools, by index: the direction
    /// changes every block of namespace x priority.
    fn direction(&self, i: usize) -> (usize, usize) {
        let block = self.namespaces.max(1) * PRIORITIES.len();
        let src = (i / block) % self.pools.max(1);
        (src, (src + 1) % self.pools.max(1))
    }

    /// A pool of agents outside the cluster (no replicas), offered to the
    /// user namespaces.
    pub(crate) fn pool(&self, name: &str) -> Value {
        json!({
            "apiVersion": "wirerate.io/v1alpha1",
            "kind": "DtnPool",
            "metadata": {"name": name, "namespace": POOL_NAMESPACE},
            "spec": {
                "replicas": 0,
                "image": "wirerate/agent:scale-bench",
                "volumes": [{"name": "data", "mountPath": format!("{}/{name}", self.data_root), "hostPath": format!("{}/{name}", self.data_root)}],
                "allowedRoots": [self.root(name)],
                "maxTransfersPerAgent": self.capacity,
                "allowedNamespaces": self.user_namespaces(),
            }
        })
    }

    /// Each user namespace's consent to each pool.
    pub(crate) fn bindings(&self) -> Vec<Value> {
        let mut out = Vec::new();
        for ns in self.user_namespaces() {
            for pool in self.pool_names() {
                out.push(json!({
                    "apiVersion": "wirerate.io/v1alpha1",
                    "kind": "DtnPoolBinding",
                    "metadata": {"name": format!("use-{pool}"), "namespace": ns},
                    "spec": {"poolNamespace": POOL_NAMESPACE, "pool": pool},
                }));
            }
        }
        out
    }

    /// Transfer `i`: namespaces in turn, priorities in turn within each
    /// namespace, and the direction between pools changing every block of
    /// namespace x priority, so every namespace and priority goes both ways.
    /// Each namespace writes under its own subtree of the shared pool's
    /// root, as the operator requires of tenants.
    pub(crate) fn transfer(&self, i: usize) -> TransferPlan {
        let users = self.user_namespaces();
        let namespace = users[i % users.len()].clone();
        let priority = PRIORITIES[(i / users.len()) % PRIORITIES.len()];
        let pools = self.pool_names();
        let (src, dst) = self.direction(i);
        let name = format!("t-{i:05}");
        let mut body = json!({
            "apiVersion": "wirerate.io/v1alpha1",
            "kind": "Transfer",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "source": {"pool": pools[src], "poolNamespace": POOL_NAMESPACE, "path": self.source_of(&pools[src], &name)},
                "destination": {"pool": pools[dst], "poolNamespace": POOL_NAMESPACE, "path": format!("{}/{namespace}/{name}/dst.h5", self.root(&pools[dst]))},
                "priority": priority,
            }
        });
        body["spec"].as_object_mut().expect("an object").extend(match self.paced_mbps {
            // The simulated agents move no bytes: keep the stall detector
            // out of a long run.
            None => [("stallTimeoutSeconds".to_owned(), json!(86400))].into_iter().collect::<Vec<_>>(),
            // A hundred of them at once on one machine: one stream and
            // small buffers each.
            Some(mbps) => vec![
                ("maxRateMbps".to_owned(), json!(mbps)),
                (
                    "tuning".to_owned(),
                    json!({"streams": 1, "blockSize": 1 << 20, "bufferSize": 4 << 20, "ioMode": "Buffered"}),
                ),
            ],
        });
        TransferPlan {
            namespace,
            name,
            body,
        }
    }

    /// The Lease an agent renews, in the shape `wirerate-agent run` writes
    /// it (outside the cluster: no pod annotation).
    pub(crate) fn lease(&self, agent: &Agent, active: usize, renewed: &Value) -> Value {
        let annotations = wirerate_crds::AgentLease {
            address: Some(format!(
                "10.99.{}.{}:7700",
                agent.index / 250,
                agent.index % 250 + 1
            )),
            node: Some(format!("dtn-{:03}", agent.index)),
            capacity: Some(self.capacity),
            active: i32::try_from(active).ok(),
            ..Default::default()
        }
        .to_annotations();
        json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": contract::lease_name(&agent.pool, &agent.name),
                "labels": {contract::POOL_LABEL: agent.pool},
                "annotations": annotations,
            },
            "spec": {
                "holderIdentity": agent.name,
                "leaseDurationSeconds": contract::LEASE_SECONDS,
                "renewTime": renewed,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use wirerate_crds::{DtnPool, Transfer};

    fn full() -> Scenario {
        Scenario {
            agents: 100,
            pools: 2,
            capacity: 2,
            transfers: 1000,
            namespaces: 3,
            data_root: "/data".into(),
            paced_mbps: None,
        }
    }

    #[test]
    fn transfers_mix_namespaces_priorities_and_directions() {
        let s = full();
        let mut seen = BTreeSet::new();
        for i in 0..36 {
            let t: Transfer = serde_json::from_value(s.transfer(i).body).unwrap();
            seen.insert((
                t.metadata.namespace.clone().unwrap(),
                t.spec.priority,
                t.spec.source.pool.clone(),
            ));
            assert_eq!(t.spec.source.path, s.source_path(i));
            assert_ne!(Some(t.spec.source.pool), t.spec.destination.pool);
        }
        assert_eq!(seen.len(), 3 * 3 * 2);
        assert_eq!(s.slots(), 100);
        assert_eq!(s.agents().len(), 100);
        assert_eq!(s.agents()[1].name, "pool-1-agent-0");
        let _: DtnPool = serde_json::from_value(s.pool("pool-0")).unwrap();
    }

    // After tenant subtrees came in, every Transfer of the first run on
    // main stayed Pending: PathNotAllowed.
    #[test]
    fn every_destination_is_in_its_namespace_s_subtree_of_the_pool() {
        let s = full();
        for i in 0..s.transfers {
            let t: Transfer = serde_json::from_value(s.transfer(i).body).unwrap();
            let ns = t.metadata.namespace.clone().unwrap();
            let pool: DtnPool =
                serde_json::from_value(s.pool(t.spec.destination.pool.as_deref().unwrap()))
                    .unwrap();
            let path = &t.spec.destination.path;
            let roots = wirerate_crds::pool::tenant_roots(&pool, &ns);
            assert!(
                roots.iter().any(|r| path.starts_with(&format!("{r}/"))),
                "{path} is outside {roots:?}"
            );
        }
    }

    // The first run with real agents created nothing: the tuning said
    // "buffered" where the CRD spells it "Buffered".
    #[test]
    fn a_paced_transfer_for_real_agents_is_one_the_crds_accept() {
        let s = Scenario {
            paced_mbps: Some(8),
            data_root: "/tmp/scale".into(),
            ..full()
        };
        let t: Transfer = serde_json::from_value(s.transfer(7).body).unwrap();
        assert_eq!(t.spec.max_rate_mbps, Some(8));
        assert_eq!(t.spec.tuning.expect("tuning").problem(None), None);
        assert!(t.spec.source.path.starts_with("/tmp/scale/pool-"));
    }
}
