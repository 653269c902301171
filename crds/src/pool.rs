//! `DtnPool`: a set of agents on DTN hardware, with their storage and tuning.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::tuning::{Striping, Tuning};

/// A pool of DTN agents: where they run, what storage they see, how they tune transfers.
// Clippy reads each printcolumn's `type_` as a repeated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "wirerate.io",
    version = "v1alpha1",
    kind = "DtnPool",
    doc = "A pool of wirerate agents on DTN hardware.",
    namespaced,
    status = "DtnPoolStatus",
    shortname = "dtnp",
    shortname = "pool",
    category = "wirerate",
    printcolumn(
        json_path = ".status.readyAgents",
        name = "Ready",
        type_ = "integer",
        description = "Live agents"
    ),
    printcolumn(
        json_path = ".spec.replicas",
        name = "Desired",
        type_ = "integer",
        description = "Agents asked for"
    ),
    printcolumn(
        json_path = ".status.activeTransfers",
        name = "Active",
        type_ = "integer",
        description = "Transfers running on the pool's agents"
    ),
    printcolumn(
        json_path = ".metadata.creationTimestamp",
        name = "Age",
        type_ = "date"
    ),
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.labelSelector"
    )
)]
#[x_kube(validation = Rule::new("self.allowedRoots.all(r, self.volumes.exists(v, r == v.mountPath || r.startsWith(v.mountPath.endsWith('/') ? v.mountPath : v.mountPath + '/')))").message("every allowedRoots entry must lie under one of the volumes' mountPath: add a volume or change the root"))]
#[x_kube(validation = Rule::new("!has(self.pathTests) || !self.pathTests.listen || ((self.pathTests.port < self.dataPort || self.pathTests.port >= self.dataPort + 2 * self.maxTransfersPerAgent) && self.pathTests.port != self.metricsPort)").message("pathTests.port must be neither the metrics port nor one of the data ports (dataPort up to dataPort + 2 x maxTransfersPerAgent)"))]
#[x_kube(validation = Rule::new("self.metricsPort < self.dataPort || self.metricsPort >= self.dataPort + 2 * self.maxTransfersPerAgent").message("metricsPort must not be one of the data ports (dataPort up to dataPort + 2 x maxTransfersPerAgent): the agents bind both on the host's network"))]
#[x_kube(validation = Rule::new("!has(self.striping) || !has(self.tuning.blockSize) || self.tuning.blockSize % self.striping.stripeSize == 0").message("striping.stripeSize must divide tuning.blockSize"))]
#[serde(rename_all = "camelCase")]
pub struct DtnPoolSpec {
    /// Agents to run in the cluster (one per node); agents outside it join through their Lease.
    #[serde(default = "one")]
    #[schemars(range(min = 0, max = 512))]
    pub replicas: i32,
    /// The agent image.
    #[schemars(length(min = 1, max = 512))]
    pub image: String,
    /// Image pull policy (Always, IfNotPresent, Never).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16), regex(pattern = r"^(Always|IfNotPresent|Never)$"))]
    pub image_pull_policy: Option<String>,
    /// Nodes the agents may run on (for example `wirerate.io/dtn: "true"`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Scheduling affinity, added to the one-agent-per-node anti-affinity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// Tolerations for tainted DTN nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// TCP port the agents accept data connections on (host network).
    #[serde(default = "data_port")]
    #[schemars(range(min = 1024, max = 65535))]
    pub data_port: i32,
    /// TCP port of the agents' Prometheus metrics.
    #[serde(default = "metrics_port")]
    #[schemars(range(min = 1024, max = 65535))]
    pub metrics_port: i32,
    /// Which address the agents advertise to senders.
    #[serde(default)]
    pub advertise: Advertise,
    /// MTU the agents expect on the data NIC; preflight reports a mismatch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1280, max = 9216))]
    pub mtu: Option<i32>,
    /// Huge pages for the agents' buffer pools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hugepages: Option<Hugepages>,
    /// CPU and memory for each agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Storage the agents mount.
    #[schemars(length(min = 1, max = 16))]
    pub volumes: Vec<StorageVolume>,
    /// Every agent of the pool sees its allowedRoots as one file system
    /// (NFS, Lustre, GPFS, CephFS, a shared host directory), so that
    /// several of them can write one Transfer's files (spec.pairs above
    /// 1). Checked at each such transfer's start: the first receiver
    /// writes a marker file that every other must find, or the Transfer
    /// fails saying the mount is not shared.
    #[serde(default)]
    pub shared_storage: bool,
    /// Directories transfers may read from and write to, each under a volume.
    // Item lengths bound the CEL rules' estimated cost, which the API server
    // checks when the CRD is applied; without them it refuses the CRD.
    #[schemars(length(min = 1, max = 32), inner(length(min = 1, max = 1024)))]
    #[x_kube(validation = Rule::new("self.all(r, r.startsWith('/') && !r.contains('/../') && !r.endsWith('/..'))").message("allowedRoots must be absolute paths without '..'"))]
    #[x_kube(validation = Rule::new("self.all(r, !r.contains('//') && !r.contains('/./') && !r.endsWith('/.') && (r == '/' || !r.endsWith('/')))").message("allowedRoots must be spelled plainly: no '//', no '/./' and no trailing '/' or '/.'"))]
    #[x_kube(validation = Rule::new("self.all(r, !r.matches('[[:cntrl:]]'))").message("allowedRoots must not contain control characters (NUL, newline, any below 0x20, or DEL)"))]
    pub allowed_roots: Vec<String>,
    /// Let Transfers that mirror (`spec.mirror`) delete beneath their
    /// destination directories, under `allowedRoots`, what their sources
    /// do not have. Off by default: the operator then refuses such a
    /// Transfer before anything moves (DeletesNotAllowed). Deletes reach
    /// no further than the writes every Transfer to this pool may
    /// already make.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_deletes: bool,
    /// Transfers one agent runs at once.
    #[serde(default = "two")]
    #[schemars(range(min = 1, max = crate::contract::MAX_TRANSFERS_PER_AGENT))]
    pub max_transfers_per_agent: i32,
    /// Other namespaces whose Transfers may use this pool (its own always may).
    /// An offer only: a namespace is served once it also holds a
    /// DtnPoolBinding naming this pool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 64),
        inner(
            length(min = 1, max = 63),
            regex(pattern = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
        )
    )]
    pub allowed_namespaces: Vec<String>,
    /// Default tuning for transfers on this pool.
    #[serde(default)]
    pub tuning: Tuning,
    /// Default Lustre layout for files this pool receives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub striping: Option<Striping>,
    /// Host settings the agents check at start and report in status.
    #[serde(default)]
    pub preflight: Preflight,
    /// Who the agents run as on the storage: its owner's uid and groups, or
    /// capabilities that bypass file permissions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<AgentSecurityContext>,
    /// The agents' seccomp profile. Unset: the node's default (Unconfined,
    /// unless the kubelet runs with --seccomp-default). RuntimeDefault
    /// denies io_uring, so the agents use direct I/O and a pool that asks
    /// for async I/O says so (Degraded, IoUringUnavailable); `Localhost`
    /// with the project's profile (deploy/seccomp/wirerate-agent.json,
    /// installed on the nodes) allows io_uring and nothing else beyond the
    /// runtime's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seccomp_profile: Option<AgentSeccompProfile>,
    /// Periodic tests of the path to other pools of this namespace and to
    /// endpoints outside the cluster (a perfSONAR-style mesh):
    /// memory-to-memory probes, rate-capped, put off
    /// while the tester runs transfers and stopped at the end of their
    /// current run when one starts. Each target's last result is in
    /// status.pathTests and in the agents' metrics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_tests: Option<PathTests>,
}

/// The most pools one pool tests the path to.
pub const MAX_PATH_TEST_TARGETS: usize = 16;
/// The most endpoints outside the cluster one pool tests the path to.
pub const MAX_PATH_TEST_EXTERNAL: usize = 8;
/// The most streams a path test's second phase opens.
pub const MAX_PATH_TEST_STREAMS: i32 = 64;

/// What a pool tests and whether it can be tested.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[x_kube(validation = Rule::new("!has(self.external) || !has(self.targets) || self.external.all(e, self.targets.all(t, t.pool != e.name))").message("pathTests.external names must differ from the pools in pathTests.targets: both name a target in status.pathTests"))]
#[serde(rename_all = "camelCase")]
pub struct PathTests {
    /// Be a target of other pools' tests: every agent keeps a listener on
    /// `port` that takes memory-to-memory tests only and writes nothing.
    #[serde(default)]
    pub listen: bool,
    /// Port of that listener (host network); not one of the data ports.
    #[serde(default = "path_test_port")]
    #[schemars(range(min = 1024, max = 65535))]
    pub port: i32,
    /// Pools of this namespace to test the path to; each must listen.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_PATH_TEST_TARGETS))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["pool".into()]))]
    pub targets: Vec<PathTestTarget>,
    /// Listeners outside the cluster to test the path to: a
    /// `wirerate-agent serve --discard-only` at a partner site, with a
    /// token of its own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_PATH_TEST_EXTERNAL))]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub external: Vec<ExternalPathTestTarget>,
    /// Seconds between two tests of one target.
    #[serde(default = "path_test_interval")]
    #[schemars(range(min = 300, max = 86400))]
    pub interval_seconds: i32,
    /// About how long each of a test's two phases (one stream, then
    /// `streams`) lasts, seconds.
    #[serde(default = "path_test_seconds")]
    #[schemars(range(min = 1, max = 10))]
    pub phase_seconds: i32,
    /// Streams of the second phase.
    #[serde(default = "path_test_streams")]
    #[schemars(range(min = 2, max = MAX_PATH_TEST_STREAMS))]
    pub streams: i32,
    /// Cap on a test's rate, Mbit/s: what a test may take from the link.
    /// A path faster than the cap shows the cap.
    #[serde(default = "path_test_rate")]
    #[schemars(range(min = 100, max = 10000000))]
    pub max_rate_mbps: i64,
}

/// A pool to test the path to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct PathTestTarget {
    /// A DtnPool in this namespace whose pathTests.listen is true.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
    )]
    pub pool: String,
}

/// A listener outside the cluster to test the path to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExternalPathTestTarget {
    /// The target's name in status.pathTests and in the agents' metrics.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
    )]
    pub name: String,
    /// `host:port` of its listener.
    #[schemars(length(min = 3, max = 260))]
    #[x_kube(validation = Rule::new(crate::transfer::ADDRESS_RULE).message(crate::transfer::ADDRESS_MESSAGE))]
    pub address: String,
    /// Secret in the pool's namespace whose `token` key holds the
    /// listener's token, labelled wirerate.io/external-token=true. The
    /// pool's agents get `get` on it, so whoever writes the pool must be
    /// able to read it.
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub token_secret: String,
}

/// Which seccomp profile the agent container runs under.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[x_kube(validation = Rule::new("(self.type == 'Localhost') == has(self.localhostProfile)").message("seccompProfile.localhostProfile is set with type Localhost, and only then"))]
#[serde(rename_all = "camelCase")]
pub struct AgentSeccompProfile {
    /// RuntimeDefault, Localhost or Unconfined.
    #[serde(rename = "type")]
    pub type_: SeccompType,
    /// With Localhost: the profile's path beneath the kubelet's seccomp
    /// directory, for example `profiles/wirerate-agent.json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$")
    )]
    #[x_kube(validation = Rule::new("!self.split('/').exists(p, p == '..')").message("seccompProfile.localhostProfile must stay beneath the kubelet's seccomp directory (no '..')"))]
    pub localhost_profile: Option<String>,
}

/// The seccomp profile kinds a pod can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum SeccompType {
    /// The container runtime's default profile: io_uring denied, the agents
    /// use direct I/O.
    RuntimeDefault,
    /// A profile file on each node (the project's allows io_uring).
    Localhost,
    /// No seccomp filter at all (not recommended; refused by the
    /// `restricted` Pod Security Standard).
    Unconfined,
}

/// Where Transfers of namespace `ns` may write on `pool`: its allowedRoots
/// for its own namespace; for another that consented, a subtree of each
/// root named after that namespace (`<root>/<ns>`), so tenants sharing a
/// pool cannot overwrite one another's files. Namespace names hold no `/`
/// and no `..`, so the subtree is a single plain segment.
pub fn tenant_roots(pool: &DtnPool, ns: &str) -> Vec<String> {
    if pool.metadata.namespace.as_deref() == Some(ns) {
        return pool.spec.allowed_roots.clone();
    }
    pool.spec
        .allowed_roots
        .iter()
        .map(|r| format!("{}/{ns}", r.trim_end_matches('/')))
        .collect()
}

impl SeccompType {
    /// The name a pod's securityContext.seccompProfile.type takes.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RuntimeDefault => "RuntimeDefault",
            Self::Localhost => "Localhost",
            Self::Unconfined => "Unconfined",
        }
    }
}

/// The identity the agents read and write users' data with. File permissions
/// apply to the agents like to anyone (their capabilities are dropped), so
/// data of uid 1000 with mode 0600 needs the agents to run as uid 1000, or a
/// capability that bypasses permissions.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentSecurityContext {
    /// User the agents run as (pod securityContext.runAsUser).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 2147483647))]
    pub run_as_user: Option<i64>,
    /// Primary group (pod securityContext.runAsGroup).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 2147483647))]
    pub run_as_group: Option<i64>,
    /// Group that owns the pool's volumes where the volume type supports it
    /// (not hostPath), and a supplementary group of the agents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 2147483647))]
    pub fs_group: Option<i64>,
    /// More groups the agents belong to (for group-readable data).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(range(min = 0, max = 2147483647)))]
    pub supplemental_groups: Vec<i64>,
    /// Capabilities that bypass file permissions, for facilities whose data
    /// belongs to many users: DAC_READ_SEARCH reads any file, DAC_OVERRIDE
    /// also writes any file, CHOWN and FOWNER change owners and modes. Each
    /// makes the agents able to do so on everything their volumes hold.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4))]
    pub add_capabilities: Vec<FileCapability>,
}

impl DtnPool {
    /// Whether its agents may give files away and go on working with
    /// them (CHOWN, FOWNER and DAC_OVERRIDE), which keeping owners needs
    /// (a Transfer's `spec.keep.owner`): a directory given away is
    /// written into, and its time set, by a later session.
    pub fn gives_chown(&self) -> bool {
        self.spec.security_context.as_ref().is_some_and(|c| {
            [
                FileCapability::CHOWN,
                FileCapability::FOWNER,
                FileCapability::DAC_OVERRIDE,
            ]
            .iter()
            .all(|cap| c.add_capabilities.contains(cap))
        })
    }
}

/// A capability an agent may be given to get past file permissions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[allow(non_camel_case_types)]
pub enum FileCapability {
    /// Read any file and search any directory.
    DAC_READ_SEARCH,
    /// Read, write and search any file or directory.
    DAC_OVERRIDE,
    /// Change any file's owner.
    CHOWN,
    /// Act as the owner of any file (modes, times).
    FOWNER,
}

impl FileCapability {
    /// The capability's name, as a container's securityContext takes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::DAC_READ_SEARCH => "DAC_READ_SEARCH",
            Self::DAC_OVERRIDE => "DAC_OVERRIDE",
            Self::CHOWN => "CHOWN",
            Self::FOWNER => "FOWNER",
        }
    }
}

fn one() -> i32 {
    1
}
fn two() -> i32 {
    2
}
fn data_port() -> i32 {
    7700
}
fn metrics_port() -> i32 {
    9700
}
fn path_test_port() -> i32 {
    7690
}
fn path_test_interval() -> i32 {
    3600
}
fn path_test_seconds() -> i32 {
    2
}
fn path_test_streams() -> i32 {
    4
}
fn path_test_rate() -> i64 {
    10_000
}

/// The address agents give senders: a fixed address, a NIC's address, or the node's.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[x_kube(validation = Rule::new("!(has(self.interface) && has(self.address))").message("set advertise.interface or advertise.address, not both"))]
#[serde(rename_all = "camelCase")]
pub struct Advertise {
    /// Data NIC whose first IPv4 address to advertise (for example `ens1f0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 15))]
    pub interface: Option<String>,
    /// Address to advertise as is (outside the cluster, for example).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("!self.matches('^[^:]*:[0-9]*$') && !self.matches('^\\\\[.*\\\\]:[0-9]*$') && !self.matches('[ /[:cntrl:]]')").message("advertise.address is an address without a port (for example 10.0.0.1 or 2001:db8::1): the agents' data port is spec.dataPort"))]
    pub address: Option<String>,
}

/// Huge pages requested for each agent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[x_kube(validation = Rule::new("!self.amount.startsWith('0') && (self.pageSize == '1Gi' ? self.amount.endsWith('Gi') : (self.amount.endsWith('Gi') || int(self.amount.substring(0, size(self.amount) - 2)) % 2 == 0))").message("hugepages.amount must be a whole number of pages: a multiple of 2Mi for 2Mi pages, of 1Gi for 1Gi pages"))]
#[serde(rename_all = "camelCase")]
pub struct Hugepages {
    /// Page size: `2Mi` or `1Gi`.
    #[schemars(length(max = 3), regex(pattern = r"^(2Mi|1Gi)$"))]
    pub page_size: String,
    /// Amount per agent, as a quantity (for example `1Gi`).
    #[schemars(length(max = 16), regex(pattern = r"^[1-9][0-9]*(Mi|Gi)$"))]
    pub amount: String,
}

/// A volume the agents mount, from the host or from a claim.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[x_kube(validation = Rule::new("has(self.hostPath) != has(self.claimName)").message("a volume needs exactly one of hostPath or claimName"))]
#[serde(rename_all = "camelCase")]
pub struct StorageVolume {
    /// Volume name (a DNS label).
    #[schemars(
        length(max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
    )]
    pub name: String,
    /// Where the agents see it.
    #[schemars(length(min = 2, max = 1024), regex(pattern = r"^/"))]
    pub mount_path: String,
    /// Directory on the node (for example a Lustre mount point).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024), regex(pattern = r"^/"))]
    pub host_path: Option<String>,
    /// PersistentVolumeClaim in the pool's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub claim_name: Option<String>,
    /// Mount read-only (a pool that only sends).
    #[serde(default)]
    pub read_only: bool,
}

/// Host expectations an agent checks when it starts.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Preflight {
    /// Smallest acceptable net.core.rmem_max / wmem_max in bytes (the path's bandwidth-delay product).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub min_socket_buffer: Option<i64>,
    /// Congestion control that must be available.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 16))]
    pub congestion: Option<String>,
    /// What net.ipv4.tcp_slow_start_after_idle must be (`false`: 0). Off
    /// is what long paths want: with it on (Linux's default), a stream that
    /// pauses (the next file, a checkpoint's sync) has its window halved
    /// for every retransmission timeout the pause lasts, down to 10
    /// segments, and regains it one round trip at a time. Unset: not
    /// checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slow_start_after_idle: Option<bool>,
}

/// What the operator and the agents observed of a pool.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct DtnPoolStatus {
    /// Generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Live agents (for the scale subresource).
    #[serde(default)]
    pub replicas: i32,
    /// Selector of the pool's pods (for the scale subresource).
    #[serde(default)]
    pub label_selector: String,
    /// Agents whose Lease is current and, in the cluster, whose pod is ready.
    #[serde(default)]
    pub ready_agents: i32,
    /// Transfers running on the pool's agents.
    #[serde(default)]
    pub active_transfers: i32,
    /// Every agent known to the pool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["name".into()]))]
    pub agents: Vec<AgentStatus>,
    /// Host checks the agents reported that failed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preflight: Vec<PreflightFinding>,
    /// Other namespaces whose Transfers the agents may run: offered in
    /// allowedNamespaces and consented to with a DtnPoolBinding there.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub serving_namespaces: Vec<String>,
    /// Namespaces offered in allowedNamespaces that have no DtnPoolBinding
    /// naming this pool: the agents get no access there until one is made.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub awaiting_binding: Vec<String>,
    /// The last test of each pathTests target.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["target".into()]))]
    pub path_tests: Vec<PathTestStatus>,
    /// Ready and Degraded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

/// One pathTests target: who tests it, where, and what the last test found.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct PathTestStatus {
    /// The target pool.
    pub target: String,
    /// The agent of this pool that tests it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tester: Option<String>,
    /// The target agent's listener, host:port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Why the target is not tested now, when it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,
    /// The last test.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<PathTestResult>,
}

/// What one path test found.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct PathTestResult {
    /// When it ended.
    pub at: Time,
    /// The agent that ran it.
    pub agent: String,
    /// The listener it measured, host:port.
    pub endpoint: String,
    /// Whether it completed; `error` says why not.
    pub ok: bool,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Gbit/s of one stream.
    #[serde(default)]
    pub single_stream_gbps: f64,
    /// Gbit/s of `streams` streams.
    #[serde(default)]
    pub gbps: f64,
    /// Streams of that phase.
    #[serde(default)]
    pub streams: i32,
    /// Lowest round trip seen, milliseconds.
    #[serde(default)]
    pub rtt_ms: f64,
    /// Segments retransmitted in the second phase.
    #[serde(default)]
    pub retransmits: i64,
    /// Streams the probe recommends for this path.
    #[serde(default)]
    pub advised_streams: i32,
}

/// One agent as the operator sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentStatus {
    /// Agent name (its pod's name in the cluster).
    pub name: String,
    /// Pod, when the agent runs in the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// Node or host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Advertised data address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Lease current (and pod ready, in the cluster).
    pub ready: bool,
    /// Transfers running on it.
    #[serde(default)]
    pub active_transfers: i32,
    /// Last Lease renewal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat: Option<Time>,
    /// The I/O mode in effect for the pool's transfers on this agent
    /// (`async` is io_uring; `direct` when io_uring cannot be had).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_mode: Option<String>,
    /// Why the mode is not the one the pool asks for, if it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_mode_reason: Option<String>,
}

/// A host check an agent reported.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct PreflightFinding {
    /// The agent that checked.
    pub agent: String,
    /// What was checked (for example `rmem_max`).
    pub check: String,
    /// What was found and what to change.
    pub message: String,
}
