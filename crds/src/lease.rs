//! The agent's Lease: the one typed definition of what an agent tells the
//! operator about itself. The agent writes it with [`AgentLease::to_lease`]
//! and the operator reads it with [`AgentLease::from_lease`]; the annotation
//! keys are spelled here and nowhere else.
//!
//! A Lease is written by an agent, so the operator reads it as untrusted:
//! every field is bounded, and a field it cannot read is left out rather
//! than failing the whole agent.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use wirerate_engine::IoMode;

use serde::{Deserialize, Serialize};

use crate::contract;
use crate::pool::{MAX_PATH_TEST_TARGETS, PathTestResult};

/// `host:port` where the agent accepts data connections.
const ADDRESS: &str = "wirerate.io/address";
/// The node (or host, outside the cluster) the agent runs on.
const NODE: &str = "wirerate.io/node";
/// Transfers the agent is running now.
const ACTIVE: &str = "wirerate.io/active-transfers";
/// Transfers the agent accepts at once.
const CAPACITY: &str = "wirerate.io/max-transfers";
/// The pod, when the agent runs in the cluster.
const POD: &str = "wirerate.io/pod";
/// JSON list of `[check, finding]` pairs from the host preflight.
const PREFLIGHT: &str = "wirerate.io/preflight";
/// The I/O mode in effect for the pool's transfers on the agent.
const IO_MODE: &str = "wirerate.io/io-mode";
/// Why that mode is not the one the pool asks for.
const IO_MODE_REASON: &str = "wirerate.io/io-mode-reason";
/// `host:port` of the agent's path-test listener, when its pool listens.
const PATH_TEST_ADDRESS: &str = "wirerate.io/path-test-address";
/// JSON list of the agent's last path test to each target.
const PATH_TESTS: &str = "wirerate.io/path-tests";

/// Longest annotation value the operator reads; an agent has no reason to
/// write more, and the operator keeps every agent's Lease in memory.
pub const MAX_VALUE_LEN: usize = 16 * 1024;
/// The most preflight findings read from one Lease.
pub const MAX_FINDINGS: usize = 64;

/// Longest path-test error read from a Lease, in characters.
pub const MAX_PATH_TEST_ERROR: usize = 512;
/// Longest `host:port` read from a Lease's path-test fields.
pub const MAX_ENDPOINT: usize = 255;

/// Whether `s` reads as `host:port`, short enough to be one.
fn endpoint(s: &str) -> bool {
    s.len() <= MAX_ENDPOINT
        && s.rsplit_once(':')
            .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0))
}

/// One host preflight finding: the check's name and what it found.
pub type Finding = (String, String);

/// The last path test an agent ran to one target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PathTestRecord {
    /// The target pool.
    pub target: String,
    /// What the test found.
    #[serde(flatten)]
    pub result: PathTestResult,
}

/// `records` as JSON within [`MAX_VALUE_LEN`], which the reader insists on:
/// long errors (escaped, or not ASCII) are cut shorter, then dropped,
/// rather than losing every result to one value too long.
fn fitted(records: &[PathTestRecord]) -> Option<String> {
    let mut records = records.to_vec();
    for cut in [MAX_PATH_TEST_ERROR, 128, 0] {
        for r in &mut records {
            if let Some(e) = &mut r.result.error {
                *e = e.chars().take(cut).collect();
            }
        }
        let json = serde_json::to_string(&records).ok()?;
        if json.len() <= MAX_VALUE_LEN {
            return Some(json);
        }
    }
    None
}

/// What an agent says about itself in its Lease's annotations.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgentLease {
    /// `host:port` for data connections.
    pub address: Option<String>,
    /// The node it runs on.
    pub node: Option<String>,
    /// Transfers it accepts at once.
    pub capacity: Option<i32>,
    /// Transfers it runs now.
    pub active: Option<i32>,
    /// Its pod, in the cluster.
    pub pod: Option<String>,
    /// What the host preflight found wrong.
    pub preflight: Vec<Finding>,
    /// The I/O mode in effect.
    pub io_mode: Option<IoMode>,
    /// Why that is not the mode the pool asks for.
    pub io_mode_reason: Option<String>,
    /// Its path-test listener, host:port.
    pub path_test_address: Option<String>,
    /// Its last path test to each target it tests.
    pub path_tests: Vec<PathTestRecord>,
}

impl AgentLease {
    /// The annotations that carry it.
    pub fn to_annotations(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        let mut put = |k: &str, v: Option<String>| {
            if let Some(v) = v {
                out.insert(k.to_owned(), v);
            }
        };
        put(ADDRESS, self.address.clone());
        put(NODE, self.node.clone());
        put(CAPACITY, self.capacity.map(|c| c.to_string()));
        put(ACTIVE, self.active.map(|a| a.to_string()));
        put(POD, self.pod.clone());
        put(PREFLIGHT, serde_json::to_string(&self.preflight).ok());
        put(IO_MODE, self.io_mode.map(|m| m.as_str().to_owned()));
        put(IO_MODE_REASON, self.io_mode_reason.clone());
        put(PATH_TEST_ADDRESS, self.path_test_address.clone());
        if !self.path_tests.is_empty() {
            put(PATH_TESTS, fitted(&self.path_tests));
        }
        out
    }

    /// Reads it back; a value too long or not of its type is left out.
    pub fn from_annotations(ann: &BTreeMap<String, String>) -> Self {
        let get = |k: &str| {
            ann.get(k)
                .filter(|v| v.len() <= MAX_VALUE_LEN)
                .map(String::as_str)
        };
        let mut preflight: Vec<Finding> = get(PREFLIGHT)
            .and_then(|s| serde_json::from_str(s).ok())
            .unwrap_or_default();
        preflight.truncate(MAX_FINDINGS);
        // One record at a time: one that does not read is dropped, not
        // the agent's every result.
        let records: Vec<serde_json::Value> = get(PATH_TESTS)
            .and_then(|s| serde_json::from_str(s).ok())
            .unwrap_or_default();
        let path_tests: Vec<PathTestRecord> = records
            .into_iter()
            .take(MAX_PATH_TEST_TARGETS)
            .filter_map(|v| serde_json::from_value::<PathTestRecord>(v).ok())
            .filter(|r| endpoint(&r.result.endpoint) && r.target.len() <= 63)
            .map(|mut r| {
                if let Some(e) = &mut r.result.error {
                    *e = e.chars().take(MAX_PATH_TEST_ERROR).collect();
                }
                r
            })
            .collect();
        Self {
            address: get(ADDRESS).map(str::to_owned),
            node: get(NODE).map(str::to_owned),
            capacity: get(CAPACITY).and_then(|s| s.parse().ok()),
            active: get(ACTIVE).and_then(|s| s.parse().ok()),
            pod: get(POD).map(str::to_owned),
            preflight,
            io_mode: get(IO_MODE).and_then(|s| s.parse().ok()),
            io_mode_reason: get(IO_MODE_REASON).map(str::to_owned),
            path_test_address: get(PATH_TEST_ADDRESS)
                .filter(|a| endpoint(a))
                .map(str::to_owned),
            path_tests,
        }
    }

    /// The Lease agent `agent` of `pool` applies, renewed `now`.
    pub fn to_lease(&self, pool: &str, agent: &str, now: Timestamp) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(contract::lease_name(pool, agent)),
                labels: Some(BTreeMap::from([(
                    contract::POOL_LABEL.to_owned(),
                    pool.to_owned(),
                )])),
                annotations: Some(self.to_annotations()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(agent.to_owned()),
                lease_duration_seconds: Some(contract::LEASE_SECONDS),
                renew_time: Some(MicroTime(now)),
                ..LeaseSpec::default()
            }),
        }
    }

    /// What a Lease's annotations say, if it is an agent's (it carries the
    /// pool label and a holder).
    pub fn from_lease(lease: &Lease) -> Option<Self> {
        lease.metadata.labels.as_ref()?.get(contract::POOL_LABEL)?;
        lease.spec.as_ref()?.holder_identity.as_ref()?;
        Some(Self::from_annotations(
            lease
                .metadata
                .annotations
                .as_ref()
                .unwrap_or(&BTreeMap::new()),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full() -> AgentLease {
        AgentLease {
            address: Some("10.0.0.7:7700".into()),
            node: Some("dtn-3".into()),
            capacity: Some(2),
            active: Some(1),
            pod: Some("lab-agent-0".into()),
            preflight: vec![(
                "mtu".into(),
                "eth1 has MTU 1500, the pool asks for 9000".into(),
            )],
            io_mode: Some(IoMode::Direct),
            io_mode_reason: Some("io_uring is blocked by seccomp".into()),
            path_test_address: Some("10.0.0.7:7690".into()),
            path_tests: vec![record("far", None)],
        }
    }

    fn record(target: &str, error: Option<String>) -> PathTestRecord {
        PathTestRecord {
            target: target.into(),
            result: PathTestResult {
                at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    Timestamp::from_second(1_700_000_000).unwrap(),
                ),
                agent: "lab-agent-0".into(),
                endpoint: "10.0.9.1:7690".into(),
                ok: error.is_none(),
                error,
                single_stream_gbps: 3.5,
                gbps: 9.25,
                streams: 4,
                rtt_ms: 150.5,
                retransmits: 12,
                advised_streams: 8,
            },
        }
    }

    #[test]
    fn round_trips_through_annotations_and_a_lease() {
        let a = full();
        assert_eq!(AgentLease::from_annotations(&a.to_annotations()), a);
        let lease = a.to_lease(
            "lab",
            "lab-agent-0",
            Timestamp::from_second(1_700_000_000).unwrap(),
        );
        assert_eq!(lease.metadata.name.as_deref(), Some("wirerate-lab-agent-0"));
        assert_eq!(AgentLease::from_lease(&lease), Some(a));
        let empty = AgentLease::default();
        let back = AgentLease::from_annotations(&empty.to_annotations());
        assert_eq!(back, empty);
    }

    #[test]
    fn the_wire_spelling_is_stable() {
        // Agents and operators of adjacent versions read each other's Leases.
        let ann = full().to_annotations();
        assert_eq!(ann["wirerate.io/address"], "10.0.0.7:7700");
        assert_eq!(ann["wirerate.io/max-transfers"], "2");
        assert_eq!(ann["wirerate.io/active-transfers"], "1");
        assert_eq!(ann["wirerate.io/io-mode"], "direct");
        assert_eq!(
            ann["wirerate.io/preflight"],
            r#"[["mtu","eth1 has MTU 1500, the pool asks for 9000"]]"#
        );
        assert_eq!(ann["wirerate.io/path-test-address"], "10.0.0.7:7690");
        let tests: serde_json::Value =
            serde_json::from_str(&ann["wirerate.io/path-tests"]).unwrap();
        assert_eq!(tests[0]["target"], "far");
        assert_eq!(tests[0]["gbps"], 9.25);
        assert_eq!(tests[0]["at"], "2023-11-14T22:13:20Z");
    }

    #[test]
    fn path_tests_read_from_a_lease_are_bounded() {
        let many = AgentLease {
            path_tests: (0..=MAX_PATH_TEST_TARGETS)
                .map(|i| record(&format!("t{i}"), Some("e".repeat(600))))
                .collect(),
            ..AgentLease::default()
        };
        assert!(many.to_annotations()[PATH_TESTS].len() < MAX_VALUE_LEN);
        let back = AgentLease::from_annotations(&many.to_annotations());
        assert_eq!(back.path_tests.len(), MAX_PATH_TEST_TARGETS);
        for r in &back.path_tests {
            assert_eq!(
                r.result.error.as_ref().unwrap().chars().count(),
                MAX_PATH_TEST_ERROR
            );
        }
        // Errors that escape long (quotes, not ASCII) are cut to fit,
        // rather than the whole value dropped by the reader.
        let escaped = AgentLease {
            path_tests: (0..MAX_PATH_TEST_TARGETS)
                .map(|i| record(&format!("t{i}"), Some("\"é".repeat(400))))
                .collect(),
            ..AgentLease::default()
        };
        let back = AgentLease::from_annotations(&escaped.to_annotations());
        assert_eq!(back.path_tests.len(), MAX_PATH_TEST_TARGETS);
        assert!(
            back.path_tests
                .iter()
                .all(|r| r.result.error.as_ref().is_some_and(|e| !e.is_empty()))
        );
        // Not a list of records: none, rather than a failed agent.
        let ann = BTreeMap::from([(PATH_TESTS.to_owned(), r#"{"target":1}"#.to_owned())]);
        assert!(AgentLease::from_annotations(&ann).path_tests.is_empty());
        // One record that does not read, or names no listener, costs only
        // itself; an address that is not host:port is no address.
        let good = serde_json::to_value(record("far", None)).unwrap();
        let mut odd = good.clone();
        odd["gbps"] = serde_json::Value::Null;
        let mut far_off = good.clone();
        far_off["endpoint"] = "h".repeat(300).into();
        let ann = BTreeMap::from([
            (
                PATH_TESTS.to_owned(),
                serde_json::to_string(&[odd, good, far_off]).unwrap(),
            ),
            (PATH_TEST_ADDRESS.to_owned(), "not an address".to_owned()),
        ]);
        let back = AgentLease::from_annotations(&ann);
        assert_eq!(back.path_tests, [record("far", None)]);
        assert_eq!(back.path_test_address, None);
    }

    #[test]
    fn hostile_values_are_dropped_not_trusted() {
        let ann = BTreeMap::from([
            (CAPACITY.to_owned(), "lots".to_owned()),
            (IO_MODE.to_owned(), "turbo".to_owned()),
            (ADDRESS.to_owned(), "x".repeat(MAX_VALUE_LEN + 1)),
            (
                PREFLIGHT.to_owned(),
                serde_json::to_string(&vec![("a", "b"); 1000]).unwrap(),
            ),
        ]);
        let a = AgentLease::from_annotations(&ann);
        assert_eq!(a.capacity, None);
        assert_eq!(a.io_mode, None);
        assert_eq!(a.address, None);
        assert_eq!(a.preflight.len(), MAX_FINDINGS);
    }

    #[test]
    fn a_lease_without_the_pool_label_is_not_an_agents() {
        let mut lease = full().to_lease("lab", "a", Timestamp::UNIX_EPOCH);
        lease.metadata.labels = None;
        assert_eq!(AgentLease::from_lease(&lease), None);
    }
}
