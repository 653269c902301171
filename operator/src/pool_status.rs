//! A DtnPool's status from its agents, its pods and the transfers on them.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use wirerate_crds::conditions::{self, condition, types, whole_seconds};
use wirerate_crds::pool::{AgentStatus, PreflightFinding};
use wirerate_crds::{DtnPool, DtnPoolStatus, contract};

use crate::agents::{Agent, AgentId};
use crate::render;

/// Reasons of the Degraded condition.
pub mod reason {
    /// Pods cannot be placed: no node matches the selection.
    pub const NO_SCHEDULABLE_NODE: &str = "NoSchedulableNode";
    /// Pods cannot be placed: no node has the huge pages asked for.
    pub const HUGEPAGES_UNAVAILABLE: &str = "HugepagesUnavailable";
    /// Pods cannot be placed: on every node that matches, another pod
    /// holds one of the pool's host ports.
    pub const HOST_PORTS_TAKEN: &str = "HostPortsTaken";
    /// A PersistentVolumeClaim the pool's volumes name does not exist.
    pub const CLAIM_MISSING: &str = "PersistentVolumeClaimMissing";
    /// A PersistentVolumeClaim the pool's volumes name is not bound yet.
    pub const CLAIM_UNBOUND: &str = "PersistentVolumeClaimUnbound";
    /// An agent's host checks failed.
    pub const PREFLIGHT_FAILED: &str = "PreflightFailed";
    /// Agents are known but their Leases are stale.
    pub const AGENTS_LOST: &str = "AgentsLost";
    /// A namespace in spec.allowedNamespaces does not exist.
    pub const NAMESPACE_MISSING: &str = "NamespaceMissing";
    /// An agent cannot write under an allowed root.
    pub const STORAGE_NOT_WRITABLE: &str = "StorageNotWritable";
    /// An agent cannot read an allowed root.
    pub const STORAGE_NOT_READABLE: &str = "StorageNotReadable";
    /// The StatefulSet cannot create the agents' pods.
    pub const PODS_NOT_CREATED: &str = "PodsNotCreated";
    /// The pool asks for async I/O and an agent cannot have io_uring
    /// (seccomp, a sysctl, the kernel): it uses direct I/O.
    pub const IO_URING_UNAVAILABLE: &str = "IoUringUnavailable";
}

/// Condition type: an object the pool renders has a name someone else's
/// object holds (the message names kind, namespace and name).
pub const NAME_TAKEN: &str = "NameTaken";
/// Condition type: every object the pool renders was written.
pub const RENDERED: &str = "Rendered";

/// Puts the NameTaken and Rendered conditions into `status`: `taken` are
/// other owners' objects holding names the pool renders ("Kind ns/name"),
/// `failed` the writes that failed, with why.
pub fn set_taken(
    status: &mut DtnPoolStatus,
    pool: &DtnPool,
    taken: &[String],
    failed: &[String],
    now: Timestamp,
) {
    let generation = pool.metadata.generation;
    let now = whole_seconds(now);
    let c = if taken.is_empty() {
        condition(
            NAME_TAKEN,
            false,
            "NamesFree",
            "no other owner's object holds a name this pool renders",
        )
    } else {
        condition(
            NAME_TAKEN,
            true,
            NAME_TAKEN,
            format!(
                "{} exists and is not this pool's (no controller owner reference to it): wirerate neither changes nor deletes it, and does not run the pool's agents while their ServiceAccount, RBAC, Service or StatefulSet is someone else's; rename the pool, or delete or rename that object",
                taken.join(", ")
            ),
        )
    };
    conditions::set(&mut status.conditions, c, generation, &now);
    let c = if failed.is_empty() {
        condition(
            RENDERED,
            taken.is_empty(),
            if taken.is_empty() {
                "Applied"
            } else {
                NAME_TAKEN
            },
            if taken.is_empty() {
                "every object the pool renders is written".to_owned()
            } else {
                "not every object the pool renders is written: see NameTaken".to_owned()
            },
        )
    } else {
        condition(
            RENDERED,
            false,
            "WriteFailed",
            format!("cannot write {}", failed.join("; ")),
        )
    };
    conditions::set(&mut status.conditions, c, generation, &now);
}

/// Condition type: wirerate's admission policies are not on the API server,
/// so nothing checks that a pool's author may grant what it renders.
pub const POLICIES_MISSING: &str = "AdmissionPoliciesMissing";

/// Puts the AdmissionPoliciesMissing condition into `status`: `missing` is
/// what the operator's look at the API server found (None: all there).
pub fn set_policies(
    status: &mut DtnPoolStatus,
    pool: &DtnPool,
    missing: Option<&str>,
    now: Timestamp,
) {
    let c = match missing {
        Some(m) => condition(POLICIES_MISSING, true, POLICIES_MISSING, m),
        None => condition(
            POLICIES_MISSING,
            false,
            "PoliciesInstalled",
            "wirerate's admission policies and their bindings are installed",
        ),
    };
    conditions::set(
        &mut status.conditions,
        c,
        pool.metadata.generation,
        &whole_seconds(now),
    );
}

/// Condition type: a volume's host path is outside what the admin allows;
/// the agents are not rendered.
pub const HOST_PATH_NOT_ALLOWED: &str = "HostPathNotAllowed";

/// Puts the HostPathNotAllowed condition into `status`: `refused` says why
/// (None: every host path is allowed).
pub fn set_refused(
    status: &mut DtnPoolStatus,
    pool: &DtnPool,
    refused: Option<&str>,
    now: Timestamp,
) {
    let c = match refused {
        Some(why) => condition(
            HOST_PATH_NOT_ALLOWED,
            true,
            HOST_PATH_NOT_ALLOWED,
            format!("{why}; the agents' StatefulSet is not written until it is"),
        ),
        None => condition(
            HOST_PATH_NOT_ALLOWED,
            false,
            "HostPathsAllowed",
            "every host path the pool mounts is allowed",
        ),
    };
    conditions::set(
        &mut status.conditions,
        c,
        pool.metadata.generation,
        &whole_seconds(now),
    );
}

/// The other namespaces a pool offers to serve, by how far they got.
#[derive(Clone, Copy, Debug, Default)]
pub struct Namespaces<'a> {
    /// Consented: the agents have access there.
    pub serving: &'a [String],
    /// Offered but with no DtnPoolBinding: no access until there is one.
    pub awaiting: &'a [String],
    /// Consented but gone.
    pub missing: &'a [String],
}

fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Why a pod is unschedulable, if it is.
fn unschedulable(p: &Pod) -> Option<String> {
    p.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find_map(|c| {
            (c.type_ == "PodScheduled"
                && c.status == "False"
                && c.reason.as_deref() == Some("Unschedulable"))
            .then(|| c.message.clone().unwrap_or_default())
        })
}

/// What a pool's status is computed from, besides the pool and the time:
/// what the controller observed of its agents and namespaces.
#[derive(Clone, Debug, Default)]
pub struct Observed<'a> {
    /// The pool's agents, from their Leases.
    pub agents: &'a [&'a Agent],
    /// The agents' pods.
    pub pods: &'a [&'a Pod],
    /// The number of transfers assigned to each agent.
    pub active: HashMap<AgentId, i32>,
    /// The other namespaces the pool serves, or offers to.
    pub namespaces: Namespaces<'a>,
    /// Why the agents' StatefulSet cannot create pods, if it says so.
    pub create_failure: Option<&'a str>,
}

/// Computes the status of `pool` from what was `seen` of it at `now`.
pub fn status(pool: &DtnPool, seen: &Observed<'_>, now: Timestamp) -> DtnPoolStatus {
    let missing_namespaces = seen.namespaces.missing;
    let old = pool.status.clone().unwrap_or_default();
    let now_t = whole_seconds(now);
    let generation = pool.metadata.generation;
    let list = agent_statuses(seen);
    let ready = list.iter().filter(|a| a.ready).count() as i32;
    let preflight = preflight_findings(seen.agents);

    let mut conds = old.conditions.clone();
    let desired = pool.spec.replicas;
    let ready_ok = if desired > 0 {
        ready >= desired
    } else {
        ready > 0
    };
    let msg = format!("{ready} of {} agents live", desired.max(list.len() as i32));
    let why = if ready_ok {
        "AgentsReady"
    } else {
        "AgentsNotReady"
    };
    conditions::set(
        &mut conds,
        condition(types::READY, ready_ok, why, msg),
        generation,
        &now_t,
    );
    let (is_degraded, r, m) = match degraded(pool, seen, &preflight) {
        Some((r, m)) => (true, r, m),
        None => (false, "AsExpected", "no problems seen".to_owned()),
    };
    conditions::set(
        &mut conds,
        condition(types::DEGRADED, is_degraded, r, m),
        generation,
        &now_t,
    );

    DtnPoolStatus {
        observed_generation: generation,
        replicas: ready,
        label_selector: render::selector_string(pool),
        ready_agents: ready,
        active_transfers: list.iter().map(|a| a.active_transfers).sum(),
        agents: list,
        preflight,
        serving_namespaces: seen
            .namespaces
            .serving
            .iter()
            .filter(|n| !missing_namespaces.contains(n))
            .cloned()
            .collect(),
        awaiting_binding: seen.namespaces.awaiting.to_vec(),
        // `path_tests::status` fills these: they need the other pools.
        path_tests: Vec::new(),
        conditions: conds,
    }
}

/// Each agent as the status lists it, by name: live and its pod (if it
/// has one) ready, and the transfers on it.
fn agent_statuses(seen: &Observed<'_>) -> Vec<AgentStatus> {
    let pods_by_name: HashMap<&str, &Pod> = seen
        .pods
        .iter()
        .filter_map(|p| Some((p.metadata.name.as_deref()?, *p)))
        .collect();
    let mut list: Vec<AgentStatus> = seen
        .agents
        .iter()
        .map(|a| {
            let pod_ok = a
                .pod
                .as_deref()
                .map(|p| pods_by_name.get(p).is_some_and(|p| pod_ready(p)));
            AgentStatus {
                name: a.name.clone(),
                pod: a.pod.clone(),
                node: a.node.clone(),
                address: a.address.clone(),
                ready: a.live() && pod_ok.unwrap_or(true),
                active_transfers: seen.active.get(&a.id()).copied().unwrap_or(0),
                last_heartbeat: a.renewed.as_ref().map(|t| whole_seconds(t.0)),
                io_mode: a.io_mode.clone(),
                io_mode_reason: a.io_mode_reason.clone(),
            }
        })
        .collect();
    list.sort_by(|a, b| a.name.cmp(&b.name));
    list
}

/// The agents' failed host checks, agent by agent.
fn preflight_findings(agents: &[&Agent]) -> Vec<PreflightFinding> {
    agents
        .iter()
        .flat_map(|a| {
            a.preflight.iter().map(|(check, message)| PreflightFinding {
                agent: a.name.clone(),
                check: check.clone(),
                message: message.clone(),
            })
        })
        .collect()
}

/// Why the pool is degraded (reason, message), the most pressing first:
/// pods that cannot be made or placed, namespaces gone, then what the
/// agents found, then agents lost. None when nothing is wrong.
fn degraded(
    pool: &DtnPool,
    seen: &Observed<'_>,
    preflight: &[PreflightFinding],
) -> Option<(&'static str, String)> {
    if let Some(why) = seen.create_failure {
        return Some((
            reason::PODS_NOT_CREATED,
            format!("the agents' StatefulSet cannot create pods: {why}"),
        ));
    }
    if let Some(found) = unschedulable_pods(pool, seen.pods) {
        return Some(found);
    }
    let missing = seen.namespaces.missing;
    if !missing.is_empty() {
        return Some((
            reason::NAMESPACE_MISSING,
            format!(
                "spec.allowedNamespaces lists {}, which does not exist: create it or remove it from the list (Transfers there cannot use this pool until then)",
                missing.join(", ")
            ),
        ));
    }
    if let Some(found) = failed_checks(preflight) {
        return Some(found);
    }
    let lost = seen.agents.iter().find(|a| !a.live())?;
    Some((
        reason::AGENTS_LOST,
        format!(
            "agent {}: {}",
            lost.name,
            lost.dead.as_deref().unwrap_or_default()
        ),
    ))
}

/// Why the pool's pods cannot be placed, if one cannot: a missing claim,
/// huge pages no node has, or no node that matches.
fn unschedulable_pods(pool: &DtnPool, pods: &[&Pod]) -> Option<(&'static str, String)> {
    let stuck: Vec<(String, String)> = pods
        .iter()
        .filter_map(|p| Some((p.metadata.name.clone()?, unschedulable(p)?)))
        .collect();
    if let Some((pod, why)) = stuck.iter().find(|(_, m)| {
        let m = m.to_lowercase();
        m.contains("persistentvolumeclaim") && m.contains("not found")
    }) {
        let claims: Vec<&str> = pool
            .spec
            .volumes
            .iter()
            .filter_map(|v| v.claim_name.as_deref())
            .collect();
        return Some((
            reason::CLAIM_MISSING,
            format!(
                "pod {pod} cannot be scheduled, a PersistentVolumeClaim it mounts does not exist ({why}): create it in this namespace, or change spec.volumes[].claimName (the pool names {})",
                claims.join(", ")
            ),
        ));
    }
    // The scheduler's words for a claim that exists and waits for a volume
    // (bound at once, or on the pod's node: WaitForFirstConsumer).
    if let Some((pod, why)) = stuck.iter().find(|(_, m)| {
        let m = m.to_lowercase();
        (m.contains("unbound") && m.contains("persistentvolumeclaim"))
            || m.contains("didn't find available persistent volumes to bind")
    }) {
        return Some((
            reason::CLAIM_UNBOUND,
            format!(
                "pod {pod} waits for a PersistentVolumeClaim it mounts to be bound ({why}): see `kubectl get pvc`; the claim needs a PersistentVolume that matches it, or a StorageClass that provisions one"
            ),
        ));
    }
    if let Some((pod, why)) = stuck
        .iter()
        .find(|(_, m)| m.to_lowercase().contains("hugepages"))
    {
        return Some((
            reason::HUGEPAGES_UNAVAILABLE,
            format!(
                "pod {pod} cannot be scheduled, no DTN node has the huge pages asked for ({why}): reserve huge pages on the nodes (vm.nr_hugepages) or lower spec.hugepages.amount"
            ),
        ));
    }
    // The scheduler's words for a host port in use (NodePorts plugin).
    if let Some((pod, why)) = stuck.iter().find(|(_, m)| m.contains("free ports")) {
        return Some((
            reason::HOST_PORTS_TAKEN,
            format!(
                "pod {pod} cannot be scheduled, on the nodes it may run on another pod already holds one of its host ports ({why}): agents use the host's network (spec.dataPort and the next two per transfer, spec.metricsPort), so a node runs one agent of a pool; add DTN nodes, lower spec.replicas, give pools that share nodes port ranges that do not overlap, or uncordon a node being drained"
            ),
        ));
    }
    let (pod, why) = stuck.first()?;
    Some((
        reason::NO_SCHEDULABLE_NODE,
        format!(
            "pod {pod} cannot be scheduled ({why}): label DTN nodes to match spec.nodeSelector, or add tolerations for their taints"
        ),
    ))
}

/// What the agents' host checks found that degrades the pool, storage
/// first, then io_uring, then any other check.
fn failed_checks(preflight: &[PreflightFinding]) -> Option<(&'static str, String)> {
    let storage = [
        (
            reason::STORAGE_NOT_READABLE,
            contract::PREFLIGHT_STORAGE_READABLE,
        ),
        (
            reason::STORAGE_NOT_WRITABLE,
            contract::PREFLIGHT_STORAGE_WRITABLE,
        ),
    ];
    if let Some((r, f)) = storage
        .into_iter()
        .find_map(|(r, check)| Some((r, preflight.iter().find(|f| f.check == check)?)))
    {
        return Some((r, format!("agent {}: {}", f.agent, f.message)));
    }
    if let Some(f) = preflight
        .iter()
        .find(|f| f.check == contract::PREFLIGHT_IO_URING)
    {
        return Some((
            reason::IO_URING_UNAVAILABLE,
            format!(
                "agent {} cannot use io_uring, which the pool's async I/O needs: {}. Give the agents a seccomp profile that allows it (spec.seccompProfile: type Localhost, localhostProfile profiles/wirerate-agent.json, from deploy/seccomp/), or set spec.tuning.ioMode to Direct to accept direct I/O",
                f.agent, f.message
            ),
        ));
    }
    let f = preflight.first()?;
    Some((
        reason::PREFLIGHT_FAILED,
        format!(
            "agent {} failed the {} check: {}",
            f.agent, f.check, f.message
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents::{from_lease, tests::lease};
    use crate::render::tests::lustre_pool;
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    /// An agent of lustre-dtn that renewed its Lease at 100, seen at 101.
    fn live_agent(name: &str) -> Agent {
        from_lease(
            &lease("lustre-dtn", name, 100, None),
            &Default::default(),
            at(101),
            None,
        )
        .unwrap()
    }

    fn pending_pod(name: &str, message: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.status = Some(PodStatus {
            conditions: Some(vec![PodCondition {
                type_: "PodScheduled".into(),
                status: "False".into(),
                reason: Some("Unschedulable".into()),
                message: Some(message.into()),
                ..Default::default()
            }]),
            ..Default::default()
        });
        p
    }

    // Found against a real API server: two idle pools wrote their status
    // about five times a second. The heartbeat carried the Lease's
    // microseconds, the API kept seconds, so what was read back never
    // equalled what was computed, and each write woke the next reconcile.
    #[test]
    fn a_status_read_back_from_the_api_is_not_written_again() {
        let mut pool = lustre_pool();
        let mut l = lease("lustre-dtn", "a0", 100, None);
        let fine = Timestamp::from_second(100).unwrap() + std::time::Duration::from_micros(123_456);
        l.spec.as_mut().unwrap().renew_time = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(fine),
        );
        let a0 = from_lease(&l, &Default::default(), at(101), None).unwrap();
        let now = at(101) + std::time::Duration::from_millis(250);
        let first = status(
            &pool,
            &Observed {
                agents: &[&a0],
                ..Default::default()
            },
            now,
        );
        // Through the API and back, as the next reconcile sees it.
        let stored: DtnPoolStatus =
            serde_json::from_value(serde_json::to_value(&first).unwrap()).unwrap();
        pool.status = Some(stored.clone());
        let later = now + std::time::Duration::from_millis(300);
        let second = status(
            &pool,
            &Observed {
                agents: &[&a0],
                ..Default::default()
            },
            later,
        );
        assert_eq!(second, stored, "nothing changed, so nothing to write");
    }

    #[test]
    fn storage_an_agent_cannot_use_degrades_the_pool_with_its_own_reason() {
        let pool = lustre_pool();
        for (check, want) in [
            (
                contract::PREFLIGHT_STORAGE_WRITABLE,
                reason::STORAGE_NOT_WRITABLE,
            ),
            (
                contract::PREFLIGHT_STORAGE_READABLE,
                reason::STORAGE_NOT_READABLE,
            ),
        ] {
            let mut a0 = live_agent("a0");
            a0.preflight = vec![
                ("mtu".to_owned(), "the MTU is off".to_owned()),
                (
                    check.to_owned(),
                    "cannot write ... (the agent runs as uid 0)".to_owned(),
                ),
            ];
            let s = status(
                &pool,
                &Observed {
                    agents: &[&a0],
                    ..Default::default()
                },
                at(101),
            );
            let d = conditions::find(&s.conditions, types::DEGRADED).unwrap();
            assert_eq!((d.status.as_str(), d.reason.as_str()), ("True", want));
            assert!(d.message.contains("uid 0"), "{}", d.message);
        }
    }

    #[test]
    fn an_agent_without_io_uring_degrades_the_pool_and_shows_its_mode() {
        let pool = lustre_pool();
        let mut a0 = live_agent("a0");
        let why = "io_uring is blocked by seccomp (Operation not permitted); transfers use synchronous direct I/O";
        a0.preflight = vec![
            ("mtu".to_owned(), "the MTU is off".to_owned()),
            (contract::PREFLIGHT_IO_URING.to_owned(), why.to_owned()),
        ];
        a0.io_mode = Some("direct".to_owned());
        a0.io_mode_reason = Some(why.to_owned());
        let mut a1 = live_agent("a1");
        a1.io_mode = Some("async".to_owned());
        let s = status(
            &pool,
            &Observed {
                agents: &[&a0, &a1],
                ..Default::default()
            },
            at(101),
        );
        let d = conditions::find(&s.conditions, types::DEGRADED).unwrap();
        assert_eq!(
            (d.status.as_str(), d.reason.as_str()),
            ("True", reason::IO_URING_UNAVAILABLE)
        );
        assert!(d.message.contains("seccompProfile"), "{}", d.message);
        let modes: Vec<_> = s
            .agents
            .iter()
            .map(|a| {
                (
                    a.name.as_str(),
                    a.io_mode.as_deref(),
                    a.io_mode_reason.is_some(),
                )
            })
            .collect();
        assert_eq!(
            modes,
            [("a0", Some("direct"), true), ("a1", Some("async"), false)]
        );
    }

    // Found against a real API server: with a hugepage amount the kubelet
    // refuses, the StatefulSet failed with FailedCreate while the pool said
    // Degraded=False.
    #[test]
    fn pods_the_statefulset_cannot_create_degrade_the_pool() {
        let pool = lustre_pool();
        let why =
            "pods \"lustre-dtn-agent-0\" is forbidden: hugepages-2Mi must be a multiple of 2Mi";
        let s = status(
            &pool,
            &Observed {
                create_failure: Some(why),
                ..Default::default()
            },
            at(1),
        );
        let d = conditions::find(&s.conditions, types::DEGRADED).unwrap();
        assert_eq!(
            (d.status.as_str(), d.reason.as_str()),
            ("True", reason::PODS_NOT_CREATED)
        );
        assert!(d.message.contains("multiple of 2Mi"), "{}", d.message);
    }

    // Found in a first hour: a pool whose claim was never created said
    // only that no node matched, and to label nodes.
    /// The Degraded condition of `pool` whose one pod is Pending, unscheduled
    /// with `message`.
    fn degraded_by_pending(pool: &DtnPool, message: &str) -> Condition {
        let p = pending_pod("lustre-dtn-agent-0", message);
        let s = status(
            pool,
            &Observed {
                pods: &[&p],
                ..Default::default()
            },
            at(1),
        );
        conditions::find(&s.conditions, types::DEGRADED)
            .unwrap()
            .clone()
    }

    #[test]
    fn a_missing_claim_is_named_as_such() {
        let mut pool = lustre_pool();
        pool.spec.volumes[0].host_path = None;
        pool.spec.volumes[0].claim_name = Some("lustre-pvc".into());
        let c = degraded_by_pending(
            &pool,
            "0/3 nodes are available: persistentvolumeclaim \"lustre-pvc\" not found. preemption: 0/3 nodes are available.",
        );
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", reason::CLAIM_MISSING)
        );
        assert!(c.message.contains("lustre-pvc"), "{}", c.message);
    }

    #[test]
    fn ready_when_every_desired_agent_is_live() {
        let pool = lustre_pool();
        let a0 = live_agent("a0");
        let a1 = live_agent("a1");
        let active = HashMap::from([(a0.id(), 2)]);
        let s = status(
            &pool,
            &Observed {
                agents: &[&a0, &a1],
                active: active.clone(),
                ..Default::default()
            },
            at(101),
        );
        assert_eq!((s.ready_agents, s.active_transfers, s.replicas), (2, 2, 2));
        assert!(conditions::is_true(&s.conditions, types::READY));
        assert!(!conditions::is_true(&s.conditions, types::DEGRADED));
        assert_eq!(s.agents[0].active_transfers, 2);
        let s = status(
            &pool,
            &Observed {
                agents: &[&a0],
                active: active.clone(),
                ..Default::default()
            },
            at(101),
        );
        assert!(!conditions::is_true(&s.conditions, types::READY));
    }

    #[test]
    fn degraded_says_why_pods_do_not_schedule() {
        let pool = lustre_pool();
        let c = degraded_by_pending(
            &pool,
            "0/3 nodes are available: 3 Insufficient hugepages-2Mi.",
        );
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", reason::HUGEPAGES_UNAVAILABLE)
        );
        let c = degraded_by_pending(
            &pool,
            "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector.",
        );
        assert_eq!(c.reason, reason::NO_SCHEDULABLE_NODE);
        assert!(c.message.contains("nodeSelector"));
        // A real kube-scheduler's words for a pool scaled past its DTN
        // nodes: the selector and taints are right, the ports are taken.
        let c = degraded_by_pending(
            &pool,
            "0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 2 node(s) didn't have free ports for the requested pod ports. preemption: 0/3 nodes are available: 1 Preemption is not helpful for scheduling, 2 No preemption victims found for incoming pod.",
        );
        assert_eq!(c.reason, reason::HOST_PORTS_TAKEN);
        assert!(c.message.contains("one agent of a pool"), "{}", c.message);
        assert!(!c.message.contains("label DTN nodes"), "{}", c.message);
        // And for a claim that waits for its volume (seen while a
        // PersistentVolume was being bound to it).
        let c = degraded_by_pending(
            &pool,
            "0/3 nodes are available: pod has unbound immediate PersistentVolumeClaims. preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling.",
        );
        assert_eq!(c.reason, reason::CLAIM_UNBOUND);
        assert!(c.message.contains("kubectl get pvc"), "{}", c.message);
        let c = degraded_by_pending(
            &pool,
            "0/3 nodes are available: 3 node(s) didn't find available persistent volumes to bind.",
        );
        assert_eq!(c.reason, reason::CLAIM_UNBOUND);
    }

    #[test]
    fn a_missing_allowed_namespace_degrades_the_pool_and_says_which() {
        let pool = lustre_pool();
        let a0 = live_agent("a0");
        let s = status(
            &pool,
            &Observed {
                agents: &[&a0],
                namespaces: Namespaces {
                    serving: &["beamline-7".to_owned()],
                    awaiting: &["beamline-9".to_owned()],
                    missing: &["beamline-7".to_owned()],
                },
                ..Default::default()
            },
            at(101),
        );
        let d = s
            .conditions
            .iter()
            .find(|c| c.type_ == types::DEGRADED)
            .unwrap();
        assert_eq!(
            (d.status.as_str(), d.reason.as_str()),
            ("True", reason::NAMESPACE_MISSING)
        );
        assert!(d.message.contains("beamline-7"), "{}", d.message);
        assert_eq!(s.ready_agents, 1, "the pool still serves its own namespace");
        assert!(
            s.serving_namespaces.is_empty(),
            "a missing one is not served"
        );
        assert_eq!(s.awaiting_binding, ["beamline-9"]);
    }
}
