//! Names the operator and the agents share. Changing one is a protocol change.
//! The agent's Lease annotations are in `lease`, typed.

/// Label on a Transfer naming the agent that sends it (the agents watch it).
pub const SENDER_LABEL: &str = "wirerate.io/sender";
/// Label on a Transfer naming the agent that receives it.
pub const RECEIVER_LABEL: &str = "wirerate.io/receiver";
/// Label on everything rendered for a pool, and on each agent's Lease.
pub const POOL_LABEL: &str = "wirerate.io/pool";
/// Label on a token Secret naming its Transfer.
pub const TRANSFER_LABEL: &str = "wirerate.io/transfer";
/// `app.kubernetes.io/*` labels on rendered objects.
pub const APP_NAME: &str = "wirerate-agent";

/// Label an external receiver's token Secret must carry (value `true`) before
/// the operator lets the sending pool's agents read it.
pub const EXTERNAL_TOKEN_LABEL: &str = "wirerate.io/external-token";
/// Preflight check: the agent cannot list an allowed root.
pub const PREFLIGHT_STORAGE_READABLE: &str = "storage-readable";
/// Preflight check: the agent cannot write and read back a file under an
/// allowed root the pool writes to.
pub const PREFLIGHT_STORAGE_WRITABLE: &str = "storage-writable";
/// Key of the token in a Transfer's token Secret.
pub const TOKEN_KEY: &str = "token";
/// Preflight finding: the pool asks for async I/O and io_uring is refused.
pub const PREFLIGHT_IO_URING: &str = "io-uring";
/// Finalizer the operator puts on Transfers.
pub const TRANSFER_FINALIZER: &str = "wirerate.io/cleanup";
/// Field manager of the operator.
pub const OPERATOR_MANAGER: &str = "wirerate-operator";

/// Environment: the agent's name (its pod name in the cluster).
pub const ENV_AGENT: &str = "WIRERATE_AGENT_NAME";
/// Environment: the namespace of the agent's pool.
pub const ENV_NAMESPACE: &str = "WIRERATE_NAMESPACE";
/// Environment: the agent's pool.
pub const ENV_POOL: &str = "WIRERATE_POOL";
/// Environment: the node the agent runs on.
pub const ENV_NODE: &str = "WIRERATE_NODE";
/// Environment: the address to advertise (`host` or `host:port`).
pub const ENV_ADVERTISE: &str = "WIRERATE_ADVERTISE";
/// Environment: the NIC whose address to advertise, when no address is given.
pub const ENV_INTERFACE: &str = "WIRERATE_INTERFACE";

/// The most transfers one agent runs at once: the bound of a pool's
/// `maxTransfersPerAgent`, of the agent's `--max-transfers`, and of the
/// capacity the operator counts an agent's Lease for.
pub const MAX_TRANSFERS_PER_AGENT: i32 = 64;

/// The most pairs one Transfer runs on: the bound of `spec.pairs`, the
/// engine's.
pub const MAX_PAIRS: i32 = wirerate_engine::stripes::MAX_PAIRS as i32;

/// Label on a Transfer over several pairs (its value the pair count), for
/// people: `kubectl get transfers -l wirerate.io/pairs`.
pub const PAIRS_LABEL: &str = "wirerate.io/pairs";

/// Prefix of the labels naming the receivers of a Transfer over several
/// pairs, one per agent ([`pair_receiver_label`]): several receivers
/// cannot share one label's value, and an agent that watched every
/// Transfer over several pairs would be sent each one's every status
/// write.
pub const PAIR_RECEIVER_PREFIX: &str = "receiver.wirerate.io/";

/// The key of the label that names agent `agent` of pool `namespace/pool`
/// a receiver of a Transfer over several pairs (value `true`): a hash,
/// since a label key's name holds at most 63 characters and a pool's name
/// up to 253. The agent watches Transfers by it.
pub fn pair_receiver_label(namespace: &str, pool: &str, agent: &str) -> String {
    agent_label(PAIR_RECEIVER_PREFIX, namespace, pool, agent)
}

/// The label key `prefix` gives agent `agent` of pool `namespace/pool`.
fn agent_label(prefix: &str, namespace: &str, pool: &str, agent: &str) -> String {
    let id = fnv1a(&format!("{namespace}/{pool}/{agent}"));
    format!("{prefix}{id:016x}")
}

/// Prefix of the labels naming the relays of a Transfer over several
/// pairs ([`pair_relay_label`]), one per agent, for the same reasons.
pub const PAIR_RELAY_PREFIX: &str = "relay.wirerate.io/";

/// The key of the label that names agent `agent` of pool `namespace/pool`
/// a relay of a Transfer over several pairs (value `true`), hashed as
/// [`pair_receiver_label`]'s. The agent watches Transfers by it.
pub fn pair_relay_label(namespace: &str, pool: &str, agent: &str) -> String {
    agent_label(PAIR_RELAY_PREFIX, namespace, pool, agent)
}

/// Whether `key` is one of the labels the operator keeps on a Transfer.
pub fn operator_label(key: &str) -> bool {
    key.starts_with("wirerate.io/")
        || key.starts_with(PAIR_RECEIVER_PREFIX)
        || key.starts_with(PAIR_RELAY_PREFIX)
}

/// A small stable hash (FNV-1a, 64 bits): the same on every pass, in every
/// replica of the operator and in the agents.
pub fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Ports in an agent's data range for each transfer it may run: receiver
/// jobs bind the first free port of [`data_ports`], and twice as many
/// ports as transfers let a job start while others still close theirs.
/// The CRD's rule that keeps `pathTests.port` off these ports spells the
/// same `2 *` (a CEL string cannot read this constant);
/// `crds/tests/schema.rs` holds the two together.
const DATA_PORTS_PER_TRANSFER: u16 = 2;

/// Start of the name of the file an agent writes and removes in each root
/// to check its storage (followed by the agent's name).
pub const STORAGE_PROBE_PREFIX: &str = ".wirerate-probe-";

/// The ports an agent whose first data port is `first` and which runs up
/// to `max_transfers` at once binds for the transfers it receives.
pub fn data_ports(first: u16, max_transfers: u16) -> std::ops::Range<u16> {
    first..first.saturating_add(max_transfers.saturating_mul(DATA_PORTS_PER_TRANSFER))
}

/// How long an agent's Lease stays valid without renewal, in seconds.
pub const LEASE_SECONDS: i32 = 15;

/// Name of the Lease an agent of `pool` named `agent` renews.
pub fn lease_name(pool: &str, agent: &str) -> String {
    // Pods of a StatefulSet are already named `<pool>-agent-N`; do not repeat the pool.
    if agent.starts_with(pool) {
        format!("wirerate-{agent}")
    } else {
        format!("wirerate-{pool}-{agent}")
    }
}

/// Name of the Secret holding the token of `pool`'s path-test listeners,
/// and of the Role that lets the pools that test it read it. The dot keeps
/// it apart from names people give Secrets of their own.
pub fn path_test_secret(pool: &str) -> String {
    format!("wirerate-path-test.{pool}")
}

/// Field manager an agent writes its Lease under.
pub fn agent_manager(agent: &str) -> String {
    format!("wirerate-agent/{agent}")
}

/// Field manager an agent writes its report of one side of a Transfer
/// under: one per role, for an apply drops what its manager applied
/// before and left out, and an agent that both sends and receives one
/// Transfer sends one side's report at a time.
pub fn report_manager(agent: &str, role: crate::transfer::Role) -> String {
    let role = match role {
        crate::transfer::Role::Sender => "sender",
        crate::transfer::Role::Receiver => "receiver",
        crate::transfer::Role::Relay => "relay",
    };
    format!("wirerate-agent/{agent}/{role}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pair_receivers_label_is_a_valid_key_whatever_the_pools_name() {
        let long_pool = "p".repeat(253);
        let key = pair_receiver_label("research-data", &long_pool, &format!("{long_pool}-17"));
        let (prefix, name) = key.split_once('/').unwrap();
        assert_eq!(prefix, "receiver.wirerate.io");
        assert_eq!(name.len(), 16, "{key}");
        assert!(name.bytes().all(|b| b.is_ascii_hexdigit()), "{key}");
        assert!(operator_label(&key));
        // One agent per key: the same name in another pool or namespace
        // is another agent.
        let a = pair_receiver_label("ns", "dst", "dst-0");
        assert_eq!(a, pair_receiver_label("ns", "dst", "dst-0"));
        assert_ne!(a, pair_receiver_label("ns", "other", "dst-0"));
        assert_ne!(a, pair_receiver_label("ns2", "dst", "dst-0"));
        assert!(!operator_label("app.kubernetes.io/name"));
    }
}
