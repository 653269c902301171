//! A DtnPool rendered into the objects that run its agents. Pure: the same
//! pool always renders the same objects, which the reconciler server-side
//! applies.
//!
//! A StatefulSet rather than a DaemonSet: admins size pools (`kubectl scale
//! dtnpool`) rather than taking every matching node, agents get stable names
//! that their Leases and the Transfers' assignment labels use, and a required
//! anti-affinity keeps one agent per node, which host networking needs anyway
//! (the data port is the node's).

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    HostPathVolumeSource, ObjectFieldSelector, PersistentVolumeClaimVolumeSource, PodAffinityTerm,
    PodAntiAffinity, PodSecurityContext, PodSpec, PodTemplateSpec, Probe, ResourceRequirements,
    SeccompProfile, SecurityContext, Service, ServiceAccount, ServicePort, ServiceSpec,
    TCPSocketAction, Volume, VolumeMount,
};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Resource;
use wirerate_crds::{DtnPool, DtnPoolSpec, contract};

/// Label naming the pool's namespace on everything rendered for it (Roles in
/// other namespaces are found by it).
pub const POOL_NAMESPACE_LABEL: &str = "wirerate.io/pool-namespace";

/// Where the agents mount their huge pages.
pub const HUGEPAGES_MOUNT: &str = "/dev/hugepages";

/// The ports an agent binds on its host's network, declared so that the
/// scheduler places no two agents whose ports overlap on one node: every
/// data port it may receive on (found on real kubelets: only the first was
/// declared, so two pools' ranges could overlap unseen), then metrics.
fn host_ports(spec: &DtnPoolSpec) -> Vec<ContainerPort> {
    let port = |name: String, p: i32| ContainerPort {
        name: Some(name),
        container_port: p,
        protocol: Some("TCP".into()),
        ..Default::default()
    };
    // The CRD bounds both (1024-65535, 1-MAX_TRANSFERS_PER_AGENT).
    let first = u16::try_from(spec.data_port).unwrap_or(u16::MAX);
    let max = u16::try_from(spec.max_transfers_per_agent).unwrap_or(1);
    let mut ports: Vec<ContainerPort> = contract::data_ports(first, max)
        .enumerate()
        .map(|(i, p)| {
            let name = if i == 0 {
                "data".to_owned()
            } else {
                format!("data-{i}")
            };
            port(name, i32::from(p))
        })
        .collect();
    // A metrics port inside the data range is declared once: a hostPort
    // twice makes the pod refused at creation, where the agent's own bind
    // error says more.
    if !ports.iter().any(|p| p.container_port == spec.metrics_port) {
        ports.push(port("metrics".into(), spec.metrics_port));
    }
    ports
}

/// Everything a pool runs on, in the order to apply it.
#[derive(Clone, Debug, PartialEq)]
pub struct Rendered {
    /// The agents' identity.
    pub service_account: ServiceAccount,
    /// What agents may do in the pool's namespace.
    pub role: Role,
    /// Binds `role` to `service_account`.
    pub role_binding: RoleBinding,
    /// Roles and bindings in each other namespace the pool serves (offered
    /// in allowedNamespaces and consented to with a DtnPoolBinding).
    pub remote: Vec<(Role, RoleBinding)>,
    /// Headless service naming the agents (and their metrics port).
    pub service: Service,
    /// The agents.
    pub stateful_set: StatefulSet,
}

/// Name shared by the StatefulSet, Service, ServiceAccount and Role.
pub fn agent_name(pool: &DtnPool) -> String {
    agent_account(pool.metadata.name.as_deref().unwrap_or_default())
}

/// The ServiceAccount of the agents of the pool named `pool`.
pub fn agent_account(pool: &str) -> String {
    format!("{pool}-agent")
}

/// Labels on every rendered object and on the agents' pods.
pub fn selector_labels(pool: &DtnPool) -> BTreeMap<String, String> {
    let name = pool.metadata.name.clone().unwrap_or_default();
    BTreeMap::from([
        (
            "app.kubernetes.io/name".to_owned(),
            contract::APP_NAME.to_owned(),
        ),
        ("app.kubernetes.io/instance".to_owned(), name.clone()),
        (contract::POOL_LABEL.to_owned(), name),
    ])
}

/// The label selector string of the pool's pods (for the scale subresource).
pub fn selector_string(pool: &DtnPool) -> String {
    selector_labels(pool)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn meta(pool: &DtnPool, name: &str, namespace: Option<String>, owned: bool) -> ObjectMeta {
    let mut labels = selector_labels(pool);
    labels.insert(
        "app.kubernetes.io/managed-by".into(),
        contract::OPERATOR_MANAGER.into(),
    );
    labels.insert(
        POOL_NAMESPACE_LABEL.into(),
        pool.metadata.namespace.clone().unwrap_or_default(),
    );
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace,
        labels: Some(labels),
        owner_references: owned.then(|| owner(pool)).flatten().map(|o| vec![o]),
        ..Default::default()
    }
}

/// What the operator may do with an object it renders, given what already
/// holds that name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// Nothing holds the name: create it (create only, so that one made
    /// meanwhile is refused, not merged into).
    Create,
    /// The pool's own (its uid): apply over it, on condition that it is
    /// still that object (the uid goes into the apply).
    Update {
        /// The uid of the object the apply may change.
        uid: String,
    },
    /// Someone else's: neither written nor deleted.
    Taken,
}

/// Decides [`Claim`] for the object `rendered` of `pool`, where `existing`
/// is what holds its name now. An object the pool controls (owner
/// reference by uid) is its own; one rendered without an owner (a Role in
/// another namespace, which no owner reference can reach) is its own when
/// it carries the pool's labels, pool namespace included, as only this
/// pool's objects do there. Anything else is taken: applying over it would
/// rewrite it, and the owner reference added would have the garbage
/// collector delete it with the pool.
pub fn claim(pool: &DtnPool, rendered: &ObjectMeta, existing: Option<&ObjectMeta>) -> Claim {
    let Some(m) = existing else {
        return Claim::Create;
    };
    let uid = pool.metadata.uid.as_deref().unwrap_or_default();
    let owned = if rendered.owner_references.is_some() {
        !uid.is_empty() && crate::ownership::owned_by(m, "DtnPool", uid)
    } else {
        let has = m.labels.as_ref();
        m.owner_references.as_ref().is_none_or(Vec::is_empty)
            && rendered
                .labels
                .iter()
                .flatten()
                .filter(|(k, _)| *k == contract::POOL_LABEL || *k == POOL_NAMESPACE_LABEL)
                .all(|(k, v)| has.and_then(|h| h.get(k)) == Some(v))
    };
    match (owned, m.uid.clone()) {
        (true, Some(uid)) => Claim::Update { uid },
        _ => Claim::Taken,
    }
}

fn owner(pool: &DtnPool) -> Option<OwnerReference> {
    pool.controller_owner_ref(&())
}

pub(crate) fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    PolicyRule {
        api_groups: Some(s(groups)),
        resources: Some(s(resources)),
        verbs: s(verbs),
        ..Default::default()
    }
}

/// What an agent needs where Transfers live: see its assignments, report on
/// them, and leave Events. No Secrets: each Transfer's token is granted to
/// the pools it is assigned to by a Role of its own, naming that one Secret
/// (see [`token_access`]).
pub fn transfer_rules() -> Vec<PolicyRule> {
    vec![
        rule(&["wirerate.io"], &["transfers"], &["get", "list", "watch"]),
        rule(&["wirerate.io"], &["transfers/status"], &["get", "patch"]),
        rule(&["", "events.k8s.io"], &["events"], &["create", "patch"]),
    ]
}

/// What an agent needs in its pool's namespace: the above, plus its Lease,
/// its pod, and its pool.
pub fn pool_rules() -> Vec<PolicyRule> {
    let mut rules = transfer_rules();
    rules.push(rule(
        &["coordination.k8s.io"],
        &["leases"],
        &["get", "list", "watch", "create", "update", "patch"],
    ));
    rules.push(rule(&[""], &["pods"], &["get"]));
    rules.push(rule(&["wirerate.io"], &["dtnpools"], &["get"]));
    rules
}

/// Renders `pool`, with access to the other namespaces in `serving` (those
/// that consented; the caller checks).
pub fn render(pool: &DtnPool, serving: &[String]) -> Rendered {
    let name = agent_name(pool);
    let ns = pool.metadata.namespace.clone();
    let pool_name = pool.metadata.name.clone().unwrap_or_default();
    let spec = &pool.spec;

    let rules = pool_rules();
    let subject = Subject {
        kind: "ServiceAccount".into(),
        name: name.clone(),
        namespace: ns.clone(),
        ..Default::default()
    };
    let binding = |meta: ObjectMeta| RoleBinding {
        metadata: meta,
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: name.clone(),
        },
        subjects: Some(vec![subject.clone()]),
    };
    // Dots cannot occur in a namespace's name, so no two pools share one.
    let remote_name = format!(
        "wirerate-agent.{}.{pool_name}",
        ns.clone().unwrap_or_default()
    );
    let remote = serving
        .iter()
        .filter(|other| Some(*other) != ns.as_ref())
        .map(|other| {
            let m = meta(pool, &remote_name, Some(other.clone()), false);
            let role = Role {
                metadata: m.clone(),
                rules: Some(transfer_rules()),
            };
            let mut rb = binding(m);
            rb.role_ref.name = remote_name.clone();
            (role, rb)
        })
        .collect();

    let labels = selector_labels(pool);
    let service = Service {
        metadata: meta(pool, &name, ns.clone(), true),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            selector: Some(labels.clone()),
            ports: Some(vec![ServicePort {
                name: Some("metrics".into()),
                port: spec.metrics_port,
                target_port: Some(IntOrString::Int(spec.metrics_port)),
                ..Default::default()
            }]),
            publish_not_ready_addresses: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    };

    Rendered {
        service_account: ServiceAccount {
            metadata: meta(pool, &name, ns.clone(), true),
            ..Default::default()
        },
        role: Role {
            metadata: meta(pool, &name, ns.clone(), true),
            rules: Some(rules),
        },
        role_binding: binding(meta(pool, &name, ns.clone(), true)),
        remote,
        service,
        stateful_set: StatefulSet {
            metadata: meta(pool, &name, ns, true),
            spec: Some(StatefulSetSpec {
                replicas: Some(spec.replicas),
                service_name: Some(name.clone()),
                pod_management_policy: Some("Parallel".into()),
                selector: LabelSelector {
                    match_labels: Some(labels.clone()),
                    ..Default::default()
                },
                template: PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(labels.clone()),
                        ..Default::default()
                    }),
                    spec: Some(pod_spec(pool, &name, &pool_name, labels)),
                },
                ..Default::default()
            }),
            ..Default::default()
        },
    }
}

fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn env(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..Default::default()
    }
}

fn pod_spec(
    pool: &DtnPool,
    name: &str,
    pool_name: &str,
    labels: BTreeMap<String, String>,
) -> PodSpec {
    let spec = &pool.spec;
    let mut envs = vec![
        field_env(contract::ENV_AGENT, "metadata.name"),
        field_env(contract::ENV_NAMESPACE, "metadata.namespace"),
        field_env(contract::ENV_NODE, "spec.nodeName"),
        env(contract::ENV_POOL, pool_name),
        env("WIRERATE_DATA_PORT", spec.data_port.to_string()),
        env("WIRERATE_METRICS_PORT", spec.metrics_port.to_string()),
        env(
            "WIRERATE_MAX_TRANSFERS",
            spec.max_transfers_per_agent.to_string(),
        ),
        env(
            "WIRERATE_WATCH_NAMESPACES",
            spec.allowed_namespaces.join(","),
        ),
    ];
    match (&spec.advertise.address, &spec.advertise.interface) {
        (Some(a), _) => envs.push(env(contract::ENV_ADVERTISE, a.clone())),
        (None, Some(i)) => envs.push(env(contract::ENV_INTERFACE, i.clone())),
        // Host network: the node's address is the agent's.
        (None, None) => envs.push(field_env(contract::ENV_ADVERTISE, "status.hostIP")),
    }

    let mut volumes = Vec::new();
    let mut mounts = Vec::new();
    for v in &spec.volumes {
        volumes.push(Volume {
            name: v.name.clone(),
            host_path: v.host_path.as_ref().map(|p| HostPathVolumeSource {
                path: p.clone(),
                type_: Some("Directory".into()),
            }),
            persistent_volume_claim: v.claim_name.as_ref().map(|c| {
                PersistentVolumeClaimVolumeSource {
                    claim_name: c.clone(),
                    read_only: Some(v.read_only),
                }
            }),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            name: v.name.clone(),
            mount_path: v.mount_path.clone(),
            read_only: Some(v.read_only),
            ..Default::default()
        });
    }

    let mut resources = spec.resources.clone().unwrap_or_default();
    if let Some(h) = &spec.hugepages {
        let medium = format!("HugePages-{}", h.page_size);
        let key = format!("hugepages-{}", h.page_size);
        // Kubernetes requires hugepage requests to equal their limits.
        for list in [&mut resources.requests, &mut resources.limits] {
            list.get_or_insert_with(BTreeMap::new)
                .insert(key.clone(), Quantity(h.amount.clone()));
        }
        // ... and a CPU or memory request beside them.
        let requests = resources.requests.get_or_insert_with(BTreeMap::new);
        if !requests.contains_key("memory") && !requests.contains_key("cpu") {
            requests.insert("memory".into(), Quantity("256Mi".into()));
        }
        volumes.push(Volume {
            name: "hugepages".into(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some(medium),
                ..Default::default()
            }),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            name: "hugepages".into(),
            mount_path: HUGEPAGES_MOUNT.into(),
            ..Default::default()
        });
        envs.push(env("WIRERATE_HUGEPAGES", HUGEPAGES_MOUNT));
    }

    let mut affinity = spec.affinity.clone().unwrap_or_default();
    let one_per_node = PodAffinityTerm {
        label_selector: Some(LabelSelector {
            match_labels: Some(labels),
            ..Default::default()
        }),
        topology_key: "kubernetes.io/hostname".into(),
        ..Default::default()
    };
    affinity
        .pod_anti_affinity
        .get_or_insert_with(PodAntiAffinity::default)
        .required_during_scheduling_ignored_during_execution
        .get_or_insert_with(Vec::new)
        .push(one_per_node);

    let identity = spec.security_context.clone().unwrap_or_default();
    // IPC_LOCK: pin the transfer buffers (and huge pages) in memory.
    // NET_ADMIN: choose a congestion control outside the host's allowed
    // list, as the pool's tuning may ask. The rest only if the pool asks.
    let mut caps = vec!["IPC_LOCK".to_owned(), "NET_ADMIN".to_owned()];
    caps.extend(
        identity
            .add_capabilities
            .iter()
            .map(|c| c.as_str().to_owned()),
    );
    let pod_identity = PodSecurityContext {
        run_as_user: identity.run_as_user,
        run_as_group: identity.run_as_group,
        fs_group: identity.fs_group,
        supplemental_groups: (!identity.supplemental_groups.is_empty())
            .then(|| identity.supplemental_groups.clone()),
        ..Default::default()
    };

    PodSpec {
        host_network: Some(true),
        security_context: (pod_identity != PodSecurityContext::default()).then_some(pod_identity),
        dns_policy: Some("ClusterFirstWithHostNet".into()),
        service_account_name: Some(name.to_owned()),
        node_selector: (!spec.node_selector.is_empty()).then(|| spec.node_selector.clone()),
        tolerations: (!spec.tolerations.is_empty()).then(|| spec.tolerations.clone()),
        affinity: Some(Affinity { ..affinity }),
        termination_grace_period_seconds: Some(60),
        containers: vec![Container {
            name: "agent".into(),
            image: Some(spec.image.clone()),
            image_pull_policy: spec.image_pull_policy.clone(),
            args: Some(vec!["run".into()]),
            env: Some(envs),
            ports: Some(host_ports(spec)),
            readiness_probe: Some(Probe {
                tcp_socket: Some(TCPSocketAction {
                    port: IntOrString::Int(spec.metrics_port),
                    ..Default::default()
                }),
                period_seconds: Some(10),
                ..Default::default()
            }),
            resources: Some(ResourceRequirements { ..resources }),
            security_context: Some(SecurityContext {
                allow_privilege_escalation: Some(false),
                capabilities: Some(Capabilities {
                    drop: Some(vec!["ALL".into()]),
                    add: Some(caps),
                }),
                // The agent writes only beneath its allowed roots.
                read_only_root_filesystem: Some(true),
                // Unset, the node's default stands: setting one here would
                // change (and restart) every existing pool on upgrade.
                seccomp_profile: spec.seccomp_profile.as_ref().map(|p| SeccompProfile {
                    type_: p.type_.as_str().to_owned(),
                    localhost_profile: p.localhost_profile.clone(),
                }),
                ..Default::default()
            }),
            volume_mounts: Some(mounts),
            ..Default::default()
        }],
        volumes: Some(volumes),
        ..Default::default()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The Lustre pool from manifests/examples.
    pub(crate) fn lustre_pool() -> DtnPool {
        let mut p = example("dtnpool-lustre.yaml");
        p.metadata.uid = Some("uid-lustre".into());
        p
    }

    /// The pool `name` of manifests/examples.
    fn example(name: &str) -> DtnPool {
        let path = format!(
            "{}/../manifests/examples/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    /// The host ports an agent of `pool` binds: its data ports (one range
    /// per transfer it may receive) and its metrics port.
    fn bound_ports(pool: &DtnPool) -> Vec<u16> {
        let s = &pool.spec;
        let port = |p: i32| u16::try_from(p).unwrap();
        let max = u16::try_from(s.max_transfers_per_agent).unwrap();
        let mut ports: Vec<u16> = contract::data_ports(port(s.data_port), max).collect();
        ports.push(port(s.metrics_port));
        ports
    }

    // issue 35: on real kubelets the two example pools could not share the
    // beamline DTN node that kind-config.yaml gives them both: both used
    // 7700 and 9700 on the host's network, and the instrument's agent
    // stayed Pending. And the pods declared only their first data port, so
    // the scheduler could not see two pools' ranges overlap.
    #[test]
    fn the_example_pools_bind_different_host_ports() {
        let (a, b) = (
            example("dtnpool-instrument.yaml"),
            example("dtnpool-lustre.yaml"),
        );
        let declared = |p: &DtnPool| -> Vec<i32> {
            let sts = render(p, &[]).stateful_set;
            let pod = sts.spec.unwrap().template.spec.unwrap();
            pod.containers[0]
                .ports
                .iter()
                .flatten()
                .map(|c| c.container_port)
                .collect()
        };
        // What the scheduler sees is every port the agents bind.
        for p in [&a, &b] {
            let bound: Vec<i32> = bound_ports(p).into_iter().map(i32::from).collect();
            assert_eq!(declared(p), bound);
        }
        let shared: Vec<u16> = bound_ports(&a)
            .into_iter()
            .filter(|p| bound_ports(&b).contains(p))
            .collect();
        assert!(shared.is_empty(), "both example pools bind {shared:?}");
    }

    // From a review: a metrics port inside the data range, declared twice,
    // would make every pod of the pool refused at creation.
    #[test]
    fn a_port_in_both_roles_is_declared_once() {
        let mut pool = lustre_pool();
        pool.spec.metrics_port = pool.spec.data_port + 1;
        let sts = render(&pool, &[]).stateful_set;
        let pod = sts.spec.unwrap().template.spec.unwrap();
        let mut ports: Vec<i32> = pod.containers[0]
            .ports
            .iter()
            .flatten()
            .map(|c| c.container_port)
            .collect();
        let declared = ports.len();
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), declared, "{ports:?}");
    }

    /// The metadata of an object someone made: `owner` is the uid of its
    /// controller (a DtnPool), if any.
    fn existing(owner: Option<&str>, labels: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            uid: Some("their-uid".into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            owner_references: owner.map(|uid| {
                vec![OwnerReference {
                    api_version: "wirerate.io/v1alpha1".into(),
                    kind: "DtnPool".into(),
                    name: "lustre-dtn".into(),
                    uid: uid.into(),
                    controller: Some(true),
                    ..Default::default()
                }]
            }),
            ..Default::default()
        }
    }

    #[test]
    fn only_a_free_name_or_the_pools_own_object_is_written() {
        let p = lustre_pool();
        let r = render(&p, &["beamline-7".into()]);
        let sa = &r.service_account.metadata;
        assert_eq!(claim(&p, sa, None), Claim::Create);
        let ours = existing(Some("uid-lustre"), &[]);
        assert_eq!(
            claim(&p, sa, Some(&ours)),
            Claim::Update {
                uid: "their-uid".into()
            }
        );
        // Another team's, unowned or owned by another pool, even with the
        // pool's labels copied onto it.
        let labels = [
            (contract::POOL_LABEL, "lustre-dtn"),
            (POOL_NAMESPACE_LABEL, "research-data"),
        ];
        for theirs in [
            existing(None, &[]),
            existing(None, &labels),
            existing(Some("uid-other"), &[]),
        ] {
            assert_eq!(claim(&p, sa, Some(&theirs)), Claim::Taken, "{theirs:?}");
        }
        // A Role in another namespace has no owner reference: it is the
        // pool's by its labels alone.
        let remote = &r.remote[0].0.metadata;
        assert!(remote.owner_references.is_none());
        assert_eq!(
            claim(&p, remote, Some(&existing(None, &labels))),
            Claim::Update {
                uid: "their-uid".into()
            }
        );
        let other_ns = [
            (contract::POOL_LABEL, "lustre-dtn"),
            (POOL_NAMESPACE_LABEL, "elsewhere"),
        ];
        for theirs in [existing(None, &[]), existing(None, &other_ns)] {
            assert_eq!(claim(&p, remote, Some(&theirs)), Claim::Taken);
        }
        // A pool not yet given a uid owns nothing.
        let mut fresh = p.clone();
        fresh.metadata.uid = None;
        assert_eq!(
            claim(&fresh, sa, Some(&existing(Some(""), &[]))),
            Claim::Taken
        );
    }

    #[test]
    fn agents_run_on_the_host_network_one_per_dtn_node() {
        let r = render(&lustre_pool(), &[]);
        let sts = r.stateful_set.spec.unwrap();
        assert_eq!(sts.replicas, Some(2));
        let pod = sts.template.spec.unwrap();
        assert_eq!(pod.host_network, Some(true));
        assert_eq!(pod.dns_policy.as_deref(), Some("ClusterFirstWithHostNet"));
        assert_eq!(pod.node_selector.unwrap()["wirerate.io/dtn"], "true");
        assert_eq!(
            pod.tolerations.unwrap()[0].key.as_deref(),
            Some("wirerate.io/dtn")
        );
        let anti = pod.affinity.unwrap().pod_anti_affinity.unwrap();
        assert_eq!(
            anti.required_during_scheduling_ignored_during_execution
                .unwrap()[0]
                .topology_key,
            "kubernetes.io/hostname"
        );
        assert_eq!(
            pod.service_account_name.as_deref(),
            Some("lustre-dtn-agent")
        );
    }

    #[test]
    fn hugepages_storage_and_capabilities() {
        let r = render(&lustre_pool(), &[]);
        let pod = r.stateful_set.spec.unwrap().template.spec.unwrap();
        let c = &pod.containers[0];
        let res = c.resources.as_ref().unwrap();
        let req = res.requests.as_ref().unwrap();
        assert_eq!(req["hugepages-2Mi"], Quantity("1Gi".into()));
        assert_eq!(
            res.limits.as_ref().unwrap()["hugepages-2Mi"],
            Quantity("1Gi".into())
        );
        assert_eq!(
            req["cpu"],
            Quantity("4".into()),
            "the pool's own requests are kept"
        );
        let vols = pod.volumes.unwrap();
        let huge = vols.iter().find(|v| v.name == "hugepages").unwrap();
        assert_eq!(
            huge.empty_dir.as_ref().unwrap().medium.as_deref(),
            Some("HugePages-2Mi")
        );
        let lustre = vols.iter().find(|v| v.name == "lustre").unwrap();
        assert_eq!(lustre.host_path.as_ref().unwrap().path, "/lustre");
        let mounts = c.volume_mounts.as_ref().unwrap();
        assert!(mounts.iter().any(|m| m.mount_path == "/lustre"));
        assert!(mounts.iter().any(|m| m.mount_path == HUGEPAGES_MOUNT));
        let caps = c
            .security_context
            .as_ref()
            .unwrap()
            .capabilities
            .as_ref()
            .unwrap();
        assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]));
        assert_eq!(
            caps.add.as_deref(),
            Some(&["IPC_LOCK".to_string(), "NET_ADMIN".to_string()][..])
        );
        let env = c.env.as_ref().unwrap();
        assert!(
            env.iter()
                .any(|e| e.name == contract::ENV_INTERFACE && e.value.as_deref() == Some("ens1f0"))
        );
        assert!(
            env.iter()
                .any(|e| e.name == contract::ENV_AGENT && e.value_from.is_some())
        );
    }

    // Found in a cluster: with no uid or gid settings and all capabilities
    // dropped, agents could not read a uid-1000 file of mode 0600 nor write
    // into a uid-1000 directory.
    #[test]
    fn the_pool_chooses_who_its_agents_are_on_the_storage() {
        use wirerate_crds::pool::{AgentSecurityContext, FileCapability};
        let plain = render(&lustre_pool(), &[]);
        let pod = plain.stateful_set.spec.unwrap().template.spec.unwrap();
        assert!(pod.security_context.is_none(), "nothing asked, nothing set");

        let mut p = lustre_pool();
        p.spec.security_context = Some(AgentSecurityContext {
            run_as_user: Some(1000),
            run_as_group: Some(1000),
            fs_group: Some(2000),
            supplemental_groups: vec![3000],
            add_capabilities: vec![FileCapability::DAC_READ_SEARCH],
        });
        let pod = render(&p, &[])
            .stateful_set
            .spec
            .unwrap()
            .template
            .spec
            .unwrap();
        let sc = pod.security_context.unwrap();
        assert_eq!(
            (sc.run_as_user, sc.run_as_group, sc.fs_group),
            (Some(1000), Some(1000), Some(2000))
        );
        assert_eq!(sc.supplemental_groups, Some(vec![3000]));
        let caps = pod.containers[0]
            .security_context
            .as_ref()
            .unwrap()
            .capabilities
            .clone()
            .unwrap();
        assert_eq!(
            caps.add.unwrap(),
            ["IPC_LOCK", "NET_ADMIN", "DAC_READ_SEARCH"]
        );
        assert_eq!(caps.drop.unwrap(), ["ALL"]);
    }

    #[test]
    fn the_pool_chooses_the_agents_seccomp_profile() {
        use wirerate_crds::pool::{AgentSeccompProfile, SeccompType};
        let container = |p: &DtnPool| {
            render(p, &[])
                .stateful_set
                .spec
                .unwrap()
                .template
                .spec
                .unwrap()
                .containers[0]
                .security_context
                .clone()
                .unwrap()
        };
        let mut p = lustre_pool();
        p.spec.seccomp_profile = None;
        let sc = container(&p);
        assert_eq!(
            sc.seccomp_profile, None,
            "unset: the node's default, as before the field existed"
        );
        assert_eq!(sc.read_only_root_filesystem, Some(true));

        p.spec.seccomp_profile = Some(AgentSeccompProfile {
            type_: SeccompType::RuntimeDefault,
            localhost_profile: None,
        });
        assert_eq!(
            container(&p).seccomp_profile.unwrap().type_,
            "RuntimeDefault"
        );

        let mut p = lustre_pool();
        p.spec.seccomp_profile = Some(AgentSeccompProfile {
            type_: SeccompType::Localhost,
            localhost_profile: Some("profiles/wirerate-agent.json".into()),
        });
        let profile = container(&p).seccomp_profile.unwrap();
        assert_eq!(profile.type_, "Localhost");
        assert_eq!(
            profile.localhost_profile.as_deref(),
            Some("profiles/wirerate-agent.json")
        );
    }

    #[test]
    fn everything_is_owned_by_the_pool_and_rbac_is_namespaced() {
        // Offered in allowedNamespaces but not consented to: nothing there.
        assert!(render(&lustre_pool(), &[]).remote.is_empty());
        let r = render(&lustre_pool(), &["beamline-7".to_owned()]);
        for m in [
            &r.service_account.metadata,
            &r.role.metadata,
            &r.role_binding.metadata,
            &r.service.metadata,
            &r.stateful_set.metadata,
        ] {
            let o = &m.owner_references.as_ref().unwrap()[0];
            assert_eq!(
                (o.kind.as_str(), o.uid.as_str(), o.controller),
                ("DtnPool", "uid-lustre", Some(true))
            );
            assert_eq!(m.namespace.as_deref(), Some("research-data"));
        }
        let rules = r.role.rules.unwrap();
        assert!(
            rules
                .iter()
                .any(|r| r.resources.as_deref() == Some(&["leases".to_string()][..]))
        );
        // No Role of a pool reads Secrets: tokens are granted one by one.
        let all_rules = rules.iter().chain(
            r.remote
                .iter()
                .flat_map(|(role, _)| role.rules.iter().flatten()),
        );
        for rule in all_rules {
            let res = rule.resources.clone().unwrap_or_default();
            assert!(!res.iter().any(|x| x == "secrets" || x == "*"), "{rule:?}");
        }
        // The pool serves beamline-7 too: a Role there, without an owner (owners cannot cross namespaces).
        assert_eq!(r.remote.len(), 1);
        let (role, rb) = &r.remote[0];
        assert_eq!(role.metadata.namespace.as_deref(), Some("beamline-7"));
        assert!(role.metadata.owner_references.is_none());
        assert_eq!(
            rb.subjects.as_ref().unwrap()[0].namespace.as_deref(),
            Some("research-data")
        );
    }
}
