//! `Transfer`: one file or directory tree moved from one pool to another.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::tuning::{Compression, Filters, Striping, SyncLevel, Tuning, Verification};
pub use wirerate_engine::mirror::Guard;

/// Move `source` to `destination` at the wire rate and verify it.
// Clippy reads each printcolumn's `type_` as a repeated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "wirerate.io",
    version = "v1alpha1",
    kind = "Transfer",
    doc = "A wirerate transfer of one file or tree between pools.",
    namespaced,
    status = "TransferStatus",
    shortname = "xfer",
    shortname = "xf",
    category = "wirerate",
    printcolumn(json_path = ".status.phase", name = "Phase", type_ = "string"),
    printcolumn(
        json_path = ".status.progress.percent",
        name = "Progress",
        type_ = "string"
    ),
    printcolumn(json_path = ".status.progress.rate", name = "Rate", type_ = "string"),
    printcolumn(json_path = ".status.pairs", name = "Pairs", type_ = "integer"),
    printcolumn(json_path = ".status.sender.name", name = "Sender", type_ = "string"),
    printcolumn(
        json_path = ".status.receiver.name",
        name = "Receiver",
        type_ = "string"
    ),
    printcolumn(
        json_path = ".metadata.creationTimestamp",
        name = "Age",
        type_ = "date"
    ),
    printcolumn(
        json_path = ".status.attempt",
        name = "Attempt",
        type_ = "integer",
        priority = 1
    ),
    printcolumn(
        json_path = ".status.queuePosition",
        name = "Queue",
        type_ = "integer",
        description = "Place in the sending pool's queue (1 = next): exact to 10, an upper bound beyond (20, 50, 100, ...)",
        priority = 1
    ),
    printcolumn(
        json_path = r#".status.conditions[?(@.status=="False")].reason"#,
        name = "Reason",
        type_ = "string",
        description = "Why it waits (a False condition's reason)",
        priority = 1
    ),
    printcolumn(
        json_path = r#".status.conditions[?(@.type=="Failed")].reason"#,
        name = "Failure",
        type_ = "string",
        priority = 1
    )
)]
#[x_kube(validation = Rule::new("!has(self.destination.pool) || self.source.pool != self.destination.pool || self.source.path != self.destination.path").message("source and destination are the same file: change destination.path or destination.pool"))]
#[x_kube(validation = Rule::new("!has(self.striping) || !has(self.tuning) || !has(self.tuning.blockSize) || self.tuning.blockSize % self.striping.stripeSize == 0").message("striping.stripeSize must divide tuning.blockSize: pick a stripe size that divides the block size"))]
#[x_kube(validation = Rule::new("(has(self.pairs) ? self.pairs : 1) == (has(oldSelf.pairs) ? oldSelf.pairs : 1)").message("pairs cannot change once set: the pairs of a running transfer are fixed; create a new Transfer instead"))]
#[x_kube(validation = Rule::new("!has(self.pairs) || self.pairs == 1 || has(self.destination.pool)").message("pairs above 1 needs destination.pool: an agent outside the cluster is one receiver, so one pair"))]
#[x_kube(validation = Rule::new("!has(self.mirror) || !has(self.pairs) || self.pairs == 1").message("mirror is not done over several pairs yet: set pairs to 1 (the receivers share one root, so the result is the same)"))]
#[x_kube(validation = Rule::new("!has(self.pairsPolicy) || self.pairsPolicy == 'Fixed' || (has(self.pairs) && self.pairs >= 2)").message("pairsPolicy Auto needs pairs of 2 or more: with Auto, pairs is the most pairs the Transfer may grow to"))]
#[x_kube(validation = Rule::new("(has(self.pairsPolicy) ? self.pairsPolicy : 'Fixed') == (has(oldSelf.pairsPolicy) ? oldSelf.pairsPolicy : 'Fixed')").message("pairsPolicy cannot change once set: create a new Transfer instead"))]
#[serde(rename_all = "camelCase")]
pub struct TransferSpec {
    /// What to send: a path on a pool's storage.
    #[x_kube(validation = Rule::new("self == oldSelf").message("source cannot change once set: create a new Transfer instead"))]
    pub source: Source,
    /// Where it lands: a path on a pool's storage, or an agent outside the cluster.
    #[x_kube(validation = Rule::new("self == oldSelf").message("destination cannot change once set: create a new Transfer instead"))]
    pub destination: Destination,
    /// Sender/receiver pairs to spread the transfer over: files, and
    /// chunks of large files, are handed out to the receivers from one
    /// queue, an idle pair takes work from the slowest, and a lost pair's
    /// unfinished work goes to the others without a restart. Above 1 the
    /// receiving pool must declare `sharedStorage` (every receiver writes
    /// into the same files). The receivers are distinct agents. One
    /// sending agent drives every pair; where the sending pool declares
    /// `sharedStorage` too, free agents of it (up to `pairs` - 1, as many
    /// as are free when the sender is placed) read and send the data of
    /// a pair each as its relays, so that one sending host's NIC and
    /// disks are not the limit. Unset: 1.
    /// With `pairsPolicy: Auto`, the most pairs it may grow to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = crate::contract::MAX_PAIRS))]
    pub pairs: Option<i32>,
    /// `Fixed` (the default): the Transfer starts once `pairs` receivers
    /// are free, and a lost pair is replaced when an agent is free.
    /// `Auto`: it starts on as many receivers as are free, one at least,
    /// and grows to `pairs` as agents of the pool become free (one a
    /// `kubectl scale dtnpool` adds joins it, for work not yet started).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pairs_policy: Option<PairsPolicy>,
    /// Overrides of the pools' tuning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tuning: Option<Tuning>,
    /// Lustre layout of the destination, overriding the receiving pool's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub striping: Option<Striping>,
    /// Higher runs first; equal priorities run oldest first.
    #[serde(default)]
    #[schemars(range(min = -1000, max = 1000))]
    pub priority: i32,
    /// How the landed data is checked.
    #[serde(default)]
    pub verification: Verification,
    /// Which files the destination already has are left as they are,
    /// not sent: `None` (the default) sends every file; `Exists` leaves
    /// any regular file already at its path, `Size` one of the same size,
    /// `Mtime` one of the same size and modification time (every landed
    /// file gets its source's), `Checksum` one of the same size and
    /// contents by digest (both ends read their files first). Over
    /// several pairs, what the destination already has is asked once,
    /// before the pairs start.
    #[serde(default)]
    pub sync: SyncLevel,
    /// Which files of the source are sent: `include` and `exclude` globs
    /// (a pattern with no `/` matches a name at any depth, `*.log`; one
    /// with a `/` the path from the source directory, `raw/*.h5`; `**`
    /// crosses directories; a trailing `/` names directories only;
    /// excludes win), `minSize` and `maxSize` in bytes, and
    /// `minAgeSeconds` (leave out files an instrument may still be
    /// writing) and `maxAgeSeconds`. Include patterns that match no file
    /// fail the Transfer, saying so. Unset: every file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filters: Option<Filters>,
    /// Mirror: once every file has landed (never after any failure),
    /// delete beneath the destination directory what the source
    /// directory does not have; what the filters leave out is left
    /// alone. Nothing is deleted when more than `maxDelete` entries or
    /// `maxDeleteBytes` would go, or when the source holds no file. The destination pool must allow deletes
    /// (`allowDeletes`). Unset: nothing at the destination is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror: Option<Guard>,
    /// What each landed file keeps of its source beyond its data, mode
    /// and modification time: `owner` (owner and group ids, through
    /// `uidMap` and `gidMap`; the destination pool must add the CHOWN,
    /// FOWNER and DAC_OVERRIDE capabilities, and no id may map to root's
    /// 0), `xattrs` (extended attributes in `user.`) and `acls` (POSIX
    /// ACLs, their named ids mapped too). Directories the Transfer makes
    /// get them too; those already there keep theirs. Unset: none of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep: Option<KeepSpec>,
    /// Cap on the transfer's rate in megabits per second (sharing a path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000000))]
    pub max_rate_mbps: Option<i64>,
    /// Reassignments after an agent is lost before the transfer fails.
    #[serde(default = "three")]
    #[schemars(range(min = 0, max = 20))]
    pub max_failovers: i32,
    /// Seconds a running transfer may go without a byte landing before both
    /// of its agents are replaced (an agent that renews its Lease but is
    /// stuck, on a hung mount for example). Verifying is not counted.
    #[serde(default = "stall_timeout")]
    #[schemars(range(min = 30, max = 86400))]
    pub stall_timeout_seconds: i32,
}

/// What a Transfer keeps of each file (`spec.keep`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeepSpec {
    /// Owner and group ids.
    #[serde(default)]
    pub owner: bool,
    /// Extended attributes in the `user.` namespace.
    #[serde(default)]
    pub xattrs: bool,
    /// POSIX ACLs.
    #[serde(default)]
    pub acls: bool,
    /// Owner ids of the source's site mapped to the destination's; an id
    /// not listed goes as it is.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = wirerate_engine::metadata::MAX_ID_MAP))]
    pub uid_map: Vec<IdPair>,
    /// Group ids, likewise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = wirerate_engine::metadata::MAX_ID_MAP))]
    pub gid_map: Vec<IdPair>,
}

/// One id mapped: `from` on the source's site, `to` on the destination's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct IdPair {
    /// The source's id.
    pub from: u32,
    /// The destination's.
    pub to: u32,
}

impl KeepSpec {
    /// The engine's terms, or why they cannot be (an id mapped twice).
    pub fn keeping(&self) -> Result<wirerate_engine::metadata::Keeping, String> {
        let map = |pairs: &[IdPair]| {
            wirerate_engine::metadata::IdMap::from_pairs(pairs.iter().map(|p| (p.from, p.to)))
        };
        Ok(wirerate_engine::metadata::Keeping {
            keep: wirerate_engine::metadata::Keep {
                owner: self.owner,
                xattrs: self.xattrs,
                acls: self.acls,
            },
            uids: map(&self.uid_map).map_err(|e| format!("uidMap: {e}"))?,
            gids: map(&self.gid_map).map_err(|e| format!("gidMap: {e}"))?,
        })
    }

    /// Whether an owner may map to root's id 0, which no pool gives.
    pub fn maps_to_root(&self) -> bool {
        self.uid_map.iter().chain(&self.gid_map).any(|p| p.to == 0)
    }
}

fn three() -> i32 {
    3
}

/// The default of `stallTimeoutSeconds`: five minutes.
pub const STALL_TIMEOUT_SECONDS: i32 = 300;

fn stall_timeout() -> i32 {
    STALL_TIMEOUT_SECONDS
}

/// A path is spelled one way only, so that comparing two spellings compares
/// the files: `/x/f/`, `/x//f` and `/x/./f` would otherwise pass the
/// same-file rule as three files.
const PLAIN_PATH: &str = "!self.contains('//') && !self.contains('/./') && !self.endsWith('/.') && (self == '/' || !self.endsWith('/'))";
/// What the API server checks of a path: no control characters (a NUL
/// cannot be a file name's, a newline breaks logs and the agents' lists).
pub const NO_CONTROL: &str = "!self.matches('[[:cntrl:]]')";
/// Why a path with a control character was refused.
pub const NO_CONTROL_MESSAGE: &str =
    "path must not contain control characters (NUL, newline, tab, any below 0x20, or DEL)";
/// What the API server checks of a namespace name (a DNS-1123 label).
pub const NAMESPACE_RULE: &str = "self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')";
/// Why a namespace name was refused.
pub const NAMESPACE_MESSAGE: &str = "poolNamespace must be a namespace name: lower-case letters, digits and '-', starting and ending with a letter or digit";
const PLAIN_PATH_MESSAGE: &str =
    "path must be spelled plainly: no '//', no '/./' and no trailing '/' or '/.'";

/// Whether `path` is spelled as the CRD requires (the rule PLAIN_PATH).
pub fn plain_path(path: &str) -> bool {
    !path.contains("//")
        && !path.contains("/./")
        && !path.ends_with("/.")
        && (path == "/" || !path.ends_with('/'))
}

/// A path on a pool's storage.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Source {
    /// DtnPool that reads the data.
    #[schemars(length(min = 1, max = 253))]
    pub pool: String,
    /// Namespace of the pool, when not the Transfer's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    #[x_kube(validation = Rule::new(NAMESPACE_RULE).message(NAMESPACE_MESSAGE))]
    pub pool_namespace: Option<String>,
    /// Absolute path of a file or directory under one of the pool's allowedRoots.
    #[schemars(length(min = 2, max = 4096))]
    #[x_kube(validation = Rule::new("self.startsWith('/') && !self.contains('/../') && !self.endsWith('/..')").message("path must be absolute and must not contain '..'"))]
    #[x_kube(validation = Rule::new(PLAIN_PATH).message(PLAIN_PATH_MESSAGE))]
    #[x_kube(validation = Rule::new(NO_CONTROL).message(NO_CONTROL_MESSAGE))]
    pub path: String,
}

/// Where a transfer lands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[x_kube(validation = Rule::new("has(self.pool) != has(self.external)").message("destination needs exactly one of pool or external"))]
#[serde(rename_all = "camelCase")]
pub struct Destination {
    /// DtnPool that writes the data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub pool: Option<String>,
    /// Namespace of the pool, when not the Transfer's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    #[x_kube(validation = Rule::new(NAMESPACE_RULE).message(NAMESPACE_MESSAGE))]
    pub pool_namespace: Option<String>,
    /// An agent outside the cluster (`wirerate-agent serve`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external: Option<External>,
    /// Absolute path under the receiving pool's allowedRoots (for an external
    /// agent: relative to its root, with a leading '/').
    #[schemars(length(min = 2, max = 4096))]
    #[x_kube(validation = Rule::new("self.startsWith('/') && !self.contains('/../') && !self.endsWith('/..')").message("path must be absolute and must not contain '..'"))]
    #[x_kube(validation = Rule::new(PLAIN_PATH).message(PLAIN_PATH_MESSAGE))]
    #[x_kube(validation = Rule::new(NO_CONTROL).message(NO_CONTROL_MESSAGE))]
    pub path: String,
}

/// A receiver outside the cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct External {
    /// `host:port` of its data listener.
    #[schemars(length(min = 3, max = 260))]
    #[x_kube(validation = Rule::new(ADDRESS_RULE).message(ADDRESS_MESSAGE))]
    pub address: String,
    /// Secret in the Transfer's namespace whose `token` key holds its shared secret.
    #[schemars(length(min = 1, max = 253))]
    pub token_secret: String,
}

/// What the API server checks of an address outside the cluster (a
/// Transfer's external receiver, a pool's external path-test target): its
/// shape only; the agent resolves it when it connects, and a name that
/// does not resolve or answer fails that transfer or test.
pub const ADDRESS_RULE: &str = "self.matches('^[^ /[:cntrl:]]+:([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])$')";
/// Why an address was refused.
pub const ADDRESS_MESSAGE: &str = "address must be host:port with a port from 1 to 65535, for example dtn1.partner.example.org:7700 or [2001:db8::1]:7700";

/// Where a Transfer is in its life.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum TransferPhase {
    /// Not yet looked at, or waiting for a valid spec.
    #[default]
    Pending,
    /// Valid, waiting for free agents.
    Queued,
    /// Agents are moving data.
    Running,
    /// All data landed; the receiver is checking it.
    Verifying,
    /// Landed and verified.
    Succeeded,
    /// Given up; the Failed condition says why.
    Failed,
}

impl Transfer {
    /// Pairs the spec asks for (1 when unset).
    pub fn pairs(&self) -> i32 {
        self.spec.pairs.unwrap_or(1)
    }

    /// Whether it runs over several pairs.
    pub fn multi_pair(&self) -> bool {
        self.pairs() > 1
    }

    /// Whether it starts on the receivers free and grows to `pairs()`
    /// (`pairsPolicy: Auto`), rather than waiting for all of them.
    pub fn auto_pairs(&self) -> bool {
        self.spec.pairs_policy == Some(PairsPolicy::Auto)
    }

    /// Namespace of the pool that plays `role`: the one named, or the Transfer's own.
    pub fn pool_namespace(&self, role: Role) -> Option<&str> {
        let named = match role {
            Role::Sender | Role::Relay => &self.spec.source.pool_namespace,
            Role::Receiver => &self.spec.destination.pool_namespace,
        };
        named.as_deref().or(self.metadata.namespace.as_deref())
    }
}

impl TransferPhase {
    /// Succeeded or Failed: nothing more will happen.
    pub fn is_final(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed)
    }

    /// Every phase, in the order a transfer goes through them.
    pub const ALL: [Self; 6] = [
        Self::Pending,
        Self::Queued,
        Self::Running,
        Self::Verifying,
        Self::Succeeded,
        Self::Failed,
    ];

    /// The spelling used in status and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Queued => "Queued",
            Self::Running => "Running",
            Self::Verifying => "Verifying",
            Self::Succeeded => "Succeeded",
            Self::Failed => "Failed",
        }
    }
}

/// What the operator and the agents observed of a Transfer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct TransferStatus {
    /// Current phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<TransferPhase>,
    /// Generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Assignments so far (1 on the first run, +1 per failover).
    #[serde(default)]
    pub attempt: i32,
    /// The agent sending now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender: Option<AgentRef>,
    /// The agent receiving now (over one pair).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receiver: Option<AgentRef>,
    /// The agents receiving now, over several pairs (spec.pairs above 1):
    /// one per pair. A receiver that is lost leaves the list and its
    /// pair's unfinished work goes to the others.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub receivers: Vec<AgentRef>,
    /// Over several pairs from a sending pool with shared storage: the
    /// agents of the sending pool that read and send a pair's data each
    /// for the sender, which still splits the work, verifies and
    /// publishes. Taken with the sender from agents no waiting Transfer
    /// could use; one that is lost, fails or does not say where it
    /// listens within 30 s leaves the list, and its pair goes on from the
    /// sender itself.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub relays: Vec<AgentRef>,
    /// Pairs running now, for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pairs: Option<i32>,
    /// Pool defaults with the Transfer's overrides, fixed at assignment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effective_tuning: Option<Tuning>,
    /// Lustre layout the receiver is to apply, fixed at assignment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effective_striping: Option<Striping>,
    /// Secret holding this transfer's token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_secret: Option<String>,
    /// Place in the pool's queue while Queued (1 = next). Exact for the
    /// first 10; beyond them a coarse upper bound (20, 50, 100, 200, 500,
    /// ...: 50 means somewhere from 21st to 50th). A change of place alone
    /// is written at most every 10 s, so it may lag the queue by that much.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_position: Option<i32>,
    /// Progress, written by the sending agent from the receiver's acknowledgements
    /// (an acknowledged block is durable at the destination).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Progress>,
    /// The operator's note of when the transfer last moved, for
    /// spec.stallTimeoutSeconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_moved: Option<Moved>,
    /// The Lustre layout the receiver applied, or why none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub striping: Option<StripingReport>,
    /// What the sender's per-link tuner chose for this attempt, when
    /// neither the Transfer nor its pool fixed the streams.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tuning: Option<TuningReport>,
    /// What sealed the sender's connections for this attempt: TLS in
    /// the agent or in the kernel, or none; written by the sender.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<EncryptionReport>,
    /// What compression did for this attempt: on or off and why, and
    /// what the blocks took on the wire; written by the sender with its
    /// progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<CompressionReport>,
    /// Over several pairs: how the transfer is split and where each pair
    /// stands, written by the sender with its progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stripes: Option<StripesReport>,
    /// One entry per role and agent, each written by that agent (over
    /// several pairs, one per receiver).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["role".into(), "agent".into()]))]
    pub reports: Vec<AgentReport>,
    /// Each reassignment after a lost agent, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failovers: Vec<Failover>,
    /// When the first attempt started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When it succeeded or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// Bytes per second of the attempt that finished, as its agent measured
    /// it over its own session, once complete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub average_rate_bps: Option<i64>,
    /// The same, for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub average_rate: Option<String>,
    /// Valid, Scheduled, Complete and Failed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
}

impl TransferStatus {
    /// The assigned agents, each with the side it plays.
    pub fn assigned(&self) -> impl Iterator<Item = (Role, &AgentRef)> {
        [
            (Role::Sender, &self.sender),
            (Role::Receiver, &self.receiver),
        ]
        .into_iter()
        .filter_map(|(role, who)| Some((role, who.as_ref()?)))
        .chain(self.receivers.iter().map(|r| (Role::Receiver, r)))
    }

    /// The assigned agents and the relays, each with the part it plays:
    /// every agent this Transfer holds a slot of.
    pub fn occupied(&self) -> impl Iterator<Item = (Role, &AgentRef)> {
        self.assigned()
            .chain(self.relays.iter().map(|r| (Role::Relay, r)))
    }
}

/// An assigned agent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentRef {
    /// Agent name.
    pub name: String,
    /// Its pool.
    pub pool: String,
    /// Its data address (`host:port`), for the receiver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Node or host it runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// Progress as the receiver counts it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Progress {
    /// Attempt these figures belong to.
    pub attempt: i32,
    /// Bytes a resume would keep: those of published files and of stored
    /// checkpoints, including those resumed (toward an external receiver:
    /// the bytes it acknowledged as written).
    pub bytes_done: i64,
    /// Bytes in all.
    pub bytes_total: i64,
    /// Bytes the receiver wrote in this attempt, durable or not: with
    /// `bytesDone`, what tells a transfer that writes but cannot store its
    /// checkpoints (a full disk) from a stalled one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_written: Option<i64>,
    /// Blocks landed.
    pub blocks_done: i64,
    /// Blocks in all.
    pub blocks_total: i64,
    /// Share done, for `kubectl get` (for example `42%`).
    pub percent: String,
    /// Current rate in bytes per second.
    pub rate_bps: i64,
    /// Current rate, for people (for example `9.1 Gbit/s`).
    pub rate: String,
    /// Seconds left at the current rate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_seconds: Option<i64>,
    /// When these figures were taken.
    pub updated_at: Time,
}

/// Bytes landed at a point in time, in one attempt.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Moved {
    /// The attempt.
    pub attempt: i32,
    /// Bytes landed by then.
    pub bytes_done: i64,
    /// When the operator saw them.
    pub at: Time,
}

/// The Lustre layout a receiver applied.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StripingReport {
    /// Whether a layout was set.
    pub applied: bool,
    /// Stripe count set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stripe_count: Option<i32>,
    /// Stripe size set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stripe_size: Option<i64>,
    /// Why none was set, or how.
    pub message: String,
}

/// The data streams the sender's per-link tuner opened, and why: the
/// round trip it measured, the buffer one stream may use, the rate aimed
/// at, and what held the count down.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TuningReport {
    /// The attempt whose sender chose (an earlier attempt's may stand
    /// until the new sender has chosen).
    pub attempt: i32,
    /// Data streams open: the tuner's choice and what the optimizer
    /// added since.
    pub streams: i32,
    /// Why the tuner chose the count it started with.
    pub reason: String,
    /// The streams the optimizer added while the attempt ran, oldest
    /// first (at most `MAX_TUNING_CHANGES`): when, from how many to how
    /// many, and what it measured.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<String>,
}

/// What compression did for a Transfer, as its sender saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CompressionReport {
    /// The attempt whose sender reports it.
    pub attempt: i32,
    /// The mode asked for.
    pub mode: Compression,
    /// The codec packing uses, when the mode packs at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub codec: Option<String>,
    /// Whether blocks are being packed now. (Not `on`: YAML 1.1 reads
    /// that word, unquoted in the CRD's `required`, as a boolean.)
    pub packing: bool,
    /// Why: `chosen`, `measuring`, `link is the limit`, `data does not
    /// shrink`, `CPU is the limit` or `disabled`.
    pub reason: String,
    /// Plain bytes of the blocks sent so far.
    pub plain_bytes: i64,
    /// What those blocks took on the wire.
    pub wire_bytes: i64,
}

/// What sealed a Transfer's connections, as its sender's handshake agreed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EncryptionReport {
    /// The attempt whose sender agreed it.
    pub attempt: i32,
    /// `none`, `tls-userspace` (TLS 1.3 sealed in the agent) or
    /// `tls-kernel` (kTLS).
    pub in_effect: String,
    /// Why TLS ran in the agent rather than in the kernel, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// How a Transfer over several pairs is split, and where each pair
/// stands: its "stripe settings".
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StripesReport {
    /// The attempt these figures belong to.
    pub attempt: i32,
    /// The sending agent, which drives every pair.
    pub sender: String,
    /// Bytes in a chunk of a large file (small files go in bundles).
    pub chunk_bytes: i64,
    /// Data streams of each pair's sessions.
    pub streams_per_pair: i32,
    /// Pairs taking work now.
    pub running: i32,
    /// Bytes made durable, over every pair.
    pub bytes: i64,
    /// The pairs' rates added up, bytes a second.
    pub rate_bps: i64,
    /// Each pair, in the order of the receivers the sender started with.
    pub pairs: Vec<PairReport>,
}

/// One pair of a Transfer over several.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PairReport {
    /// The receiving agent (its endpoint, when its report is not seen).
    pub receiver: String,
    /// The relay that reads and sends this pair's data (its endpoint,
    /// when its report is not seen); unset: the sender itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relay: Option<String>,
    /// Where it listens (`host:port`).
    pub endpoint: String,
    /// `running`, `leaving`, `lost` (its unacknowledged work went to the
    /// others), `gone` (fenced: nothing it writes lands) or, at the end,
    /// `finished`.
    pub state: String,
    /// Bytes it made durable first.
    pub bytes: i64,
    /// Its rate since it was first handed work, bytes a second.
    pub rate_bps: i64,
    /// Chunks (or bundles of small files) it finished.
    pub chunks_done: i64,
}

/// The most changes `status.tuning` lists (the optimizer makes a few at
/// most: it doubles the streams, or adds half as many again, up to 64).
pub const MAX_TUNING_CHANGES: usize = 8;

/// The parts an agent plays in a transfer.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
pub enum Role {
    /// Reads the source and sends.
    Sender,
    /// Receives and writes the destination.
    Receiver,
    /// An agent of the sending pool that reads and sends one pair's data
    /// for the sender (over several pairs, from shared storage).
    Relay,
}

/// What one agent last said about its side of a transfer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentReport {
    /// Sender, Receiver or Relay.
    pub role: Role,
    /// The reporting agent.
    pub agent: String,
    /// Attempt the report belongs to; reports of earlier attempts are ignored.
    pub attempt: i32,
    /// Where this side is.
    pub state: ReportState,
    /// Detail for people (the error, or the verified digest).
    #[serde(default)]
    pub message: String,
    /// `host:port` the receiver, or the relay, listens on for this attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// When it was written.
    pub updated_at: Time,
}

/// How a Transfer over several pairs gets its receivers. `Fixed` (the
/// default): it starts once `pairs` receivers are free, and a lost pair
/// is replaced when an agent is free. `Auto`: it starts on as many
/// receivers as are free, one at least, and grows to `pairs` as agents of
/// the pool become free (one a `kubectl scale dtnpool` adds joins it, for
/// work not yet started). Cannot change once set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum PairsPolicy {
    /// Exactly `pairs`: it waits until that many receivers are free.
    #[default]
    Fixed,
    /// As many as the receiving pool has free, up to `pairs`.
    Auto,
}

/// One side's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ReportState {
    /// Moving data.
    Running,
    /// Checking what landed.
    Verifying,
    /// Done and verified.
    Succeeded,
    /// Gave up on this attempt.
    Failed,
    /// Stopped because the Transfer is being deleted; temporary files removed.
    Cancelled,
}

/// One reassignment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Failover {
    /// The attempt that was abandoned.
    pub attempt: i32,
    /// The role whose agent was lost.
    pub role: Role,
    /// The lost agent.
    pub agent: String,
    /// Why it counts as lost.
    pub reason: String,
    /// When the operator noticed.
    pub at: Time,
}
