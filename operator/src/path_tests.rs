//! A pool's path tests (`spec.pathTests`): which of its agents tests which
//! target pool, at which of the target's listeners, and what the last test
//! found; for a pool that listens, the token its listeners take and who
//! may read it; and for external targets, which token Secrets the pool's
//! agents may read.
//!
//! The namespace is the unit of trust: a pool tests only pools of its own
//! namespace that listen, and a listener's token buys a memory-to-memory
//! test and nothing else (the agents' listeners are discard-only). An
//! external target's token is a Secret of the namespace that its owners
//! marked for wirerate and the pool's author may read.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::{Resource, ResourceExt};
use wirerate_crds::pool::{PathTestResult, PathTestStatus};
use wirerate_crds::{DtnPool, contract};

use crate::agents::Agent;
use crate::render::agent_account;
use crate::scheduler::Key;
use crate::token_grant;

/// How far in the future an agent's clock may put a result before it is
/// not believed (a record dated years ahead would otherwise stay "last").
const CLOCK_SKEW: SignedDuration = SignedDuration::from_mins(5);

/// Name of the Role and RoleBinding that let agents read `pool`'s
/// path-test token. No name the operator gives a pool's own objects
/// (`<pool>-agent`), a Transfer's grant (`wirerate-token.<t>`), a remote
/// Role (`wirerate-agent.<ns>.<pool>`) or a pool's external grant
/// (`wirerate-path-test.<pool>.external`) can end this way, so no pool's
/// objects can land on another's.
pub fn grant_name(pool: &str) -> String {
    format!("{}.readers", contract::path_test_secret(pool))
}

/// Name of the Role and RoleBinding that let `pool`'s own agents read the
/// tokens of its external targets. Like [`grant_name`]'s it starts with
/// the path-test prefix, which no other name the operator gives starts
/// with, and its suffix differs from that one's, so no two pools' grants,
/// of either kind, share a name.
pub fn external_grant_name(pool: &str) -> String {
    format!("{}.external", contract::path_test_secret(pool))
}

/// Why a token Secret an external target names cannot be handed to the
/// pool's agents, by Secret name (see [`token_grant::unmarked_token`]).
pub type Unusable = BTreeMap<String, String>;

/// The token Secrets of `pool`'s external targets, each once, sorted.
pub fn external_secrets(pool: &DtnPool) -> Vec<String> {
    let mut names: Vec<String> = pool
        .spec
        .path_tests
        .iter()
        .flat_map(|t| &t.external)
        .map(|e| e.token_secret.clone())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The metadata of a grant of `pool`'s named `name`: labelled as the
/// pool's, owned by it, so it goes with the pool.
fn grant_meta(pool: &DtnPool, name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: pool.namespace(),
        labels: Some(BTreeMap::from([
            (contract::POOL_LABEL.to_owned(), pool.name_any()),
            (
                "app.kubernetes.io/managed-by".to_owned(),
                contract::OPERATOR_MANAGER.to_owned(),
            ),
        ])),
        owner_references: pool.controller_owner_ref(&()).map(|o| vec![o]),
        ..Default::default()
    }
}

/// What a pool with external targets needs: a Role and RoleBinding letting
/// its own agents, and nobody else, `get` the token Secrets of its targets
/// but those `unusable`. None when no Secret is left to grant.
pub fn external_grant(pool: &DtnPool, unusable: &Unusable) -> Option<(Role, RoleBinding)> {
    let secrets: Vec<String> = external_secrets(pool)
        .into_iter()
        .filter(|s| !unusable.contains_key(s))
        .collect();
    if secrets.is_empty() {
        return None;
    }
    let meta = grant_meta(pool, external_grant_name(&pool.name_any()));
    let ns = pool.namespace().unwrap_or_default();
    Some(token_grant::reader(
        meta,
        &secrets,
        &[(ns, agent_account(&pool.name_any()))],
    ))
}

/// Whether `pool` takes path tests.
pub fn listens(pool: &DtnPool) -> bool {
    pool.spec.path_tests.as_ref().is_some_and(|p| p.listen)
}

/// The pools of `listener`'s namespace among `pools` that test it.
pub fn testers_of<'a>(
    listener: &DtnPool,
    pools: impl IntoIterator<Item = &'a DtnPool>,
) -> Vec<&'a DtnPool> {
    let ns = listener.namespace();
    let name = listener.name_any();
    pools
        .into_iter()
        .filter(|p| p.namespace() == ns)
        .filter(|p| {
            p.spec
                .path_tests
                .iter()
                .flat_map(|t| &t.targets)
                .any(|t| t.pool == name)
        })
        .collect()
}

/// What a listening pool needs: the Secret with its listeners' token
/// (created once, never rewritten), and a Role and RoleBinding letting its
/// own agents and those of `testers` read that one Secret. All three are
/// owned by the pool and go with it.
pub fn grant(listener: &DtnPool, testers: &[&DtnPool]) -> (Secret, Role, RoleBinding) {
    let name = contract::path_test_secret(&listener.name_any());
    let ns = listener.namespace().unwrap_or_default();
    let meta = grant_meta(listener, grant_name(&listener.name_any()));
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..meta.clone()
        },
        string_data: Some(BTreeMap::from([(
            contract::TOKEN_KEY.to_owned(),
            token_grant::fresh_token(),
        )])),
        type_: Some("Opaque".into()),
        ..Default::default()
    };
    let accounts: Vec<(String, String)> = std::iter::once(listener)
        .chain(testers.iter().copied())
        .map(|p| (ns.clone(), agent_account(&p.name_any())))
        .collect();
    let (role, binding) = token_grant::reader(meta, std::slice::from_ref(&name), &accounts);
    (secret, role, binding)
}

/// A small stable hash, so that the same tester and listener are chosen
/// on every pass (and by every replica of the operator).
fn fnv(s: &str) -> usize {
    contract::fnv1a(s) as usize
}

/// The live agents of pool `key` among `agents`, by name.
fn live<'a>(agents: &[&'a Agent], key: &Key) -> Vec<&'a Agent> {
    let mut out: Vec<&Agent> = agents
        .iter()
        .copied()
        .filter(|a| a.live() && a.namespace == key.0 && a.pool == key.1)
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The most recent of `pool`'s results for `target`: its agents' Leases
/// (each result credited to the agent whose Lease carries it) and what
/// the status already held, which outlives a restarted agent.
fn last(pool: &DtnPool, target: &str, agents: &[&Agent], now: Timestamp) -> Option<PathTestResult> {
    let ns = pool.namespace().unwrap_or_default();
    let name = pool.name_any();
    let latest = now.checked_add(CLOCK_SKEW).unwrap_or(Timestamp::MAX);
    let believable = |r: &PathTestResult| r.at.0 <= latest;
    let held = pool
        .status
        .iter()
        .flat_map(|s| &s.path_tests)
        .filter(|s| s.target == target)
        .filter_map(|s| s.last.clone());
    let said = agents
        .iter()
        .filter(|a| a.namespace == ns && a.pool == name)
        .flat_map(|a| {
            a.path_tests
                .iter()
                .filter(|r| r.target == target)
                .map(|r| PathTestResult {
                    agent: a.name.clone(),
                    ..sane(r.result.clone())
                })
        });
    // Ties broken by agent name: the agents come in no fixed order, and a
    // status that changed with it would be written on every pass.
    held.chain(said)
        .filter(believable)
        .max_by(|a, b| (a.at.0, &a.agent).cmp(&(b.at.0, &b.agent)))
}

/// An agent's figures, with what no path can show taken out.
fn sane(mut r: PathTestResult) -> PathTestResult {
    for v in [&mut r.gbps, &mut r.single_stream_gbps, &mut r.rtt_ms] {
        *v = v.max(0.0);
    }
    r.streams = r.streams.max(0);
    r.retransmits = r.retransmits.max(0);
    r.advised_streams = r.advised_streams.max(0);
    r
}

/// Why a target has no tester.
const NO_TESTER: &str = "no agent of this pool is ready to test from";

/// The agent of `testers` that tests `target`: the same on every pass.
fn tester_of<'a>(testers: &[&'a Agent], target: &str) -> Option<&'a Agent> {
    (!testers.is_empty()).then(|| testers[fnv(target) % testers.len()])
}

/// The status of each of `pool`'s targets, from the pools of its namespace
/// (`pools`), every agent known (`agents`) and the external targets' token
/// Secrets that cannot be granted (`unusable`), seen at `now`.
pub fn status(
    pool: &DtnPool,
    pools: &BTreeMap<Key, DtnPool>,
    agents: &[&Agent],
    unusable: &Unusable,
    now: Timestamp,
) -> Vec<PathTestStatus> {
    let Some(spec) = &pool.spec.path_tests else {
        return Vec::new();
    };
    let ns = pool.namespace().unwrap_or_default();
    let testers = live(agents, &(ns.clone(), pool.name_any()));
    let of_pools = spec.targets.iter().map(|t| {
        let key = (ns.clone(), t.pool.clone());
        let tester = tester_of(&testers, &t.pool);
        let listeners: Vec<&Agent> = live(agents, &key)
            .into_iter()
            .filter(|a| a.path_test_address.is_some())
            .collect();
        let listener = match (tester, listeners.len()) {
            (Some(me), n) if n > 0 => Some(listeners[fnv(&me.name) % n]),
            _ => None,
        };
        let waiting = match pools.get(&key) {
            None => Some(format!("no DtnPool {} in this namespace", t.pool)),
            Some(p) if !listens(p) => Some(format!(
                "pool {} does not take path tests: set its spec.pathTests.listen",
                t.pool
            )),
            Some(_) if tester.is_none() => Some(NO_TESTER.to_owned()),
            Some(_) if listener.is_none() => Some(format!(
                "no ready agent of pool {} has its path-test listener up yet",
                t.pool
            )),
            Some(_) => None,
        };
        let chosen = waiting.is_none();
        PathTestStatus {
            target: t.pool.clone(),
            tester: tester.filter(|_| chosen).map(|a| a.name.clone()),
            endpoint: listener
                .filter(|_| chosen)
                .and_then(|a| a.path_test_address.clone()),
            waiting,
            last: last(pool, &t.pool, agents, now),
        }
    });
    // An external target is at its address: it has no agents and no Lease
    // to say whether it is up; a test that finds it down says so. One named
    // like a pool target (which the CRD refuses) is left out: the status
    // list is keyed by name, and a duplicate would fail its whole write.
    let external = spec
        .external
        .iter()
        .filter(|e| spec.targets.iter().all(|t| t.pool != e.name))
        .map(|e| {
            let tester = tester_of(&testers, &e.name);
            let waiting = match (unusable.get(&e.token_secret), tester) {
                (Some(why), _) => Some(why.clone()),
                (None, None) => Some(NO_TESTER.to_owned()),
                (None, Some(_)) => None,
            };
            let tester = tester.filter(|_| waiting.is_none());
            PathTestStatus {
                target: e.name.clone(),
                tester: tester.map(|a| a.name.clone()),
                endpoint: tester.map(|_| e.address.clone()),
                waiting,
                last: last(pool, &e.name, agents, now),
            }
        });
    of_pools.chain(external).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents::from_lease;
    use crate::render::tests::lustre_pool;
    use wirerate_crds::AgentLease;
    use wirerate_crds::lease::PathTestRecord;
    use wirerate_crds::pool::{PathTestTarget, PathTests};

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    /// A pool named `name` in `data` that listens or not and tests `targets`.
    fn pool(name: &str, listen: bool, targets: &[&str]) -> DtnPool {
        let mut p = lustre_pool();
        p.metadata.name = Some(name.into());
        p.metadata.namespace = Some("data".into());
        p.metadata.uid = Some(format!("uid-{name}"));
        p.spec.path_tests = Some(PathTests {
            listen,
            port: 7690,
            targets: targets
                .iter()
                .map(|t| PathTestTarget { pool: (*t).into() })
                .collect(),
            external: vec![],
            interval_seconds: 3600,
            phase_seconds: 2,
            streams: 4,
            max_rate_mbps: 10_000,
        });
        p
    }

    fn result(agent: &str, at_s: i64, gbps: f64) -> PathTestResult {
        PathTestResult {
            at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at(at_s)),
            agent: agent.into(),
            endpoint: "10.0.0.9:7690".into(),
            ok: true,
            error: None,
            single_stream_gbps: gbps / 2.0,
            gbps,
            streams: 4,
            rtt_ms: 150.0,
            retransmits: 3,
            advised_streams: 8,
        }
    }

    /// A live agent of `pool` (renewed at 100, seen at 101).
    fn agent(pool: &str, name: &str, listener: bool, tests: Vec<PathTestRecord>) -> Agent {
        let mut lease = AgentLease {
            address: Some(format!("{name}.example:7700")),
            capacity: Some(2),
            path_test_address: listener.then(|| format!("{name}.example:7690")),
            path_tests: tests,
            ..AgentLease::default()
        }
        .to_lease(pool, name, at(100));
        lease.metadata.namespace = Some("data".into());
        from_lease(&lease, &Default::default(), at(101), None).unwrap()
    }

    /// A live agent of `near` whose Lease carries `r` for target `far`.
    fn tested(name: &str, r: PathTestResult) -> Agent {
        let record = PathTestRecord {
            target: "far".into(),
            result: r,
        };
        agent("near", name, false, vec![record])
    }

    fn pools(list: &[&DtnPool]) -> BTreeMap<Key, DtnPool> {
        list.iter()
            .map(|p| ((p.namespace().unwrap(), p.name_any()), (*p).clone()))
            .collect()
    }

    #[test]
    fn each_target_gets_a_tester_and_a_listener_or_says_why_not() {
        let near = pool("near", false, &["far", "quiet", "gone", "empty"]);
        let far = pool("far", true, &[]);
        let quiet = pool("quiet", false, &[]);
        let empty = pool("empty", true, &[]);
        let all = pools(&[&near, &far, &quiet, &empty]);
        let agents = [
            agent("near", "near-0", false, vec![]),
            agent("near", "near-1", false, vec![]),
            agent("far", "far-0", true, vec![]),
            // Live, but its listener is not up.
            agent("empty", "empty-0", false, vec![]),
        ];
        let refs: Vec<&Agent> = agents.iter().collect();
        let s = status(&near, &all, &refs, &Unusable::new(), at(101));
        let by: BTreeMap<&str, &PathTestStatus> =
            s.iter().map(|s| (s.target.as_str(), s)).collect();
        let far_s = by["far"];
        assert_eq!(far_s.waiting, None);
        assert!(far_s.tester.as_deref().unwrap().starts_with("near-"));
        assert_eq!(far_s.endpoint.as_deref(), Some("far-0.example:7690"));
        assert!(
            by["quiet"]
                .waiting
                .as_deref()
                .unwrap()
                .contains("pathTests.listen"),
            "{s:?}"
        );
        assert!(
            by["gone"]
                .waiting
                .as_deref()
                .unwrap()
                .contains("no DtnPool gone")
        );
        assert!(
            by["empty"]
                .waiting
                .as_deref()
                .unwrap()
                .contains("listener up"),
            "{s:?}"
        );
        for w in ["quiet", "gone", "empty"] {
            assert_eq!((&by[w].tester, &by[w].endpoint), (&None, &None), "{w}");
        }
        // With no live agent of its own, nothing is tested.
        let s = status(&near, &all, &refs[2..], &Unusable::new(), at(101));
        assert!(
            s[0].waiting
                .as_deref()
                .unwrap()
                .contains("ready to test from"),
            "{s:?}"
        );
        // Stable from pass to pass, whatever order the agents come in.
        let reversed: Vec<&Agent> = refs.iter().rev().copied().collect();
        assert_eq!(
            status(&near, &all, &refs, &Unusable::new(), at(101)),
            status(&near, &all, &reversed, &Unusable::new(), at(101))
        );
    }

    #[test]
    fn the_last_result_is_the_newest_credited_to_the_lease_that_carries_it() {
        let mut near = pool("near", false, &["far"]);
        let far = pool("far", true, &[]);
        let all = pools(&[&near, &far]);
        // near-1 claims its result came from near-0, and another dates its
        // own a year ahead: neither is taken at its word.
        let agents = [
            tested("near-0", result("near-0", 50, 9.0)),
            tested("near-1", result("near-0", 60, 7.0)),
            tested("near-2", result("near-2", 101 + 365 * 86400, 99.0)),
            agent("far", "far-0", true, vec![]),
        ];
        let refs: Vec<&Agent> = agents.iter().collect();
        let s = status(&near, &all, &refs, &Unusable::new(), at(101));
        let last = s[0].last.as_ref().unwrap();
        assert_eq!((last.agent.as_str(), last.gbps), ("near-1", 7.0));
        // Two results of the same second: the same one, in either order
        // (found in review: the status flapped between them).
        let tied = [
            tested("near-0", result("near-0", 60, 1.0)),
            tested("near-1", result("near-1", 60, 2.0)),
        ];
        let one: Vec<&Agent> = tied.iter().collect();
        let other: Vec<&Agent> = tied.iter().rev().collect();
        assert_eq!(
            status(&near, &all, &one, &Unusable::new(), at(101)),
            status(&near, &all, &other, &Unusable::new(), at(101))
        );
        // A restarted agent forgets its result; the status keeps it.
        near.status = Some(wirerate_crds::DtnPoolStatus {
            path_tests: s.clone(),
            ..Default::default()
        });
        let s = status(&near, &all, &refs[3..], &Unusable::new(), at(200));
        assert_eq!(s[0].last.as_ref().unwrap().gbps, 7.0);
    }

    #[test]
    fn a_listeners_token_is_readable_by_it_and_its_testers_only() {
        let far = pool("far", true, &[]);
        let near = pool("near", false, &["far"]);
        let other = pool("other", false, &["elsewhere"]);
        let mut abroad = pool("near", false, &["far"]);
        abroad.metadata.namespace = Some("lab".into());
        let testers = testers_of(&far, [&near, &other, &abroad, &far]);
        assert_eq!(
            testers.iter().map(|p| p.name_any()).collect::<Vec<_>>(),
            ["near"]
        );
        let (secret, role, rb) = grant(&far, &testers);
        assert_eq!(
            secret.metadata.name.as_deref(),
            Some("wirerate-path-test.far")
        );
        assert_eq!(
            role.metadata.name.as_deref(),
            Some("wirerate-path-test.far.readers")
        );
        assert_eq!(rb.role_ref.name, "wirerate-path-test.far.readers");
        let token = &secret.string_data.as_ref().unwrap()[contract::TOKEN_KEY];
        assert_eq!(token.len(), 64);
        let rule = &role.rules.as_ref().unwrap()[0];
        assert_eq!(
            rule.resource_names.as_deref(),
            Some(&["wirerate-path-test.far".to_owned()][..])
        );
        assert_eq!(rule.verbs, ["get"]);
        let who: Vec<(String, String)> = rb
            .subjects
            .unwrap()
            .into_iter()
            .map(|s| (s.namespace.unwrap(), s.name))
            .collect();
        assert_eq!(
            who,
            [
                ("data".to_owned(), "far-agent".to_owned()),
                ("data".to_owned(), "near-agent".to_owned())
            ]
        );
        for owners in [
            &secret.metadata.owner_references,
            &role.metadata.owner_references,
        ] {
            let o = &owners.as_ref().unwrap()[0];
            assert_eq!((o.kind.as_str(), o.uid.as_str()), ("DtnPool", "uid-far"));
        }
    }

    fn external(name: &str, secret: &str) -> wirerate_crds::pool::ExternalPathTestTarget {
        wirerate_crds::pool::ExternalPathTestTarget {
            name: name.into(),
            address: format!("{name}.partner.example:7690"),
            token_secret: secret.into(),
        }
    }

    #[test]
    fn an_external_target_is_tested_at_its_address_by_one_agent_of_the_pool() {
        let mut near = pool("near", false, &["far"]);
        near.spec.path_tests.as_mut().unwrap().external =
            vec![external("partner", "partner-token")];
        let far = pool("far", true, &[]);
        let all = pools(&[&near, &far]);
        let agents = [
            agent("near", "near-0", false, vec![]),
            agent("near", "near-1", false, vec![]),
            agent("far", "far-0", true, vec![]),
        ];
        let refs: Vec<&Agent> = agents.iter().collect();
        let s = status(&near, &all, &refs, &Unusable::new(), at(101));
        assert_eq!(s.len(), 2, "{s:#?}");
        let p = s.iter().find(|t| t.target == "partner").unwrap();
        assert_eq!(p.waiting, None);
        assert!(p.tester.as_deref().unwrap().starts_with("near-"), "{p:?}");
        assert_eq!(p.endpoint.as_deref(), Some("partner.partner.example:7690"));
        // Its result is read like a pool target's, by its name.
        let record = PathTestRecord {
            target: "partner".into(),
            result: result("near-0", 90, 3.0),
        };
        let mut with = agents.to_vec();
        with[0] = agent("near", "near-0", false, vec![record]);
        let refs: Vec<&Agent> = with.iter().collect();
        let s = status(&near, &all, &refs, &Unusable::new(), at(101));
        let p = s.iter().find(|t| t.target == "partner").unwrap();
        assert_eq!(p.last.as_ref().map(|l| l.gbps), Some(3.0));
        // No live agent of its own: it waits, and says why.
        let s = status(&near, &all, &refs[2..], &Unusable::new(), at(101));
        let p = s.iter().find(|t| t.target == "partner").unwrap();
        assert_eq!((&p.tester, &p.endpoint), (&None, &None));
        assert!(p.waiting.as_deref().unwrap().contains("ready to test from"));
        // A token Secret that cannot be granted: not tested, and it says why.
        let unusable = Unusable::from([("partner-token".to_owned(), "not marked".to_owned())]);
        let s = status(&near, &all, &refs, &unusable, at(101));
        let p = s.iter().find(|t| t.target == "partner").unwrap();
        assert_eq!((&p.tester, &p.endpoint), (&None, &None));
        assert_eq!(p.waiting.as_deref(), Some("not marked"));
        // Named like a pool target (the CRD refuses it): left out, since the
        // status list takes one line per name.
        near.spec.path_tests.as_mut().unwrap().external = vec![external("far", "far-token")];
        let s = status(&near, &all, &refs, &Unusable::new(), at(101));
        assert_eq!(s.len(), 1, "{s:#?}");
    }

    #[test]
    fn external_tokens_are_readable_by_the_testing_pools_agents_only() {
        let mut near = pool("near", false, &[]);
        assert!(
            external_grant(&near, &Unusable::new()).is_none(),
            "nothing to grant"
        );
        near.spec.path_tests.as_mut().unwrap().external = vec![
            external("b", "token-b"),
            external("a", "token-a"),
            external("c", "token-a"),
        ];
        let (role, rb) = external_grant(&near, &Unusable::new()).unwrap();
        assert_eq!(
            role.metadata.name.as_deref(),
            Some("wirerate-path-test.near.external")
        );
        assert_ne!(external_grant_name("near"), grant_name("near"));
        let rules = role.rules.unwrap();
        assert_eq!(rules.len(), 1);
        assert_eq!(
            rules[0].resource_names.as_deref(),
            Some(&["token-a".to_owned(), "token-b".to_owned()][..])
        );
        assert_eq!(rules[0].verbs, ["get"]);
        let who: Vec<(Option<String>, String)> = rb
            .subjects
            .unwrap()
            .into_iter()
            .map(|s| (s.namespace, s.name))
            .collect();
        assert_eq!(who, [(Some("data".to_owned()), "near-agent".to_owned())]);
        assert_eq!(rb.role_ref.name, "wirerate-path-test.near.external");
        let o = &role.metadata.owner_references.unwrap()[0];
        assert_eq!((o.kind.as_str(), o.uid.as_str()), ("DtnPool", "uid-near"));
        // A Secret that is not marked for wirerate is not granted.
        let unusable = Unusable::from([("token-a".to_owned(), "not marked".to_owned())]);
        let (role, _) = external_grant(&near, &unusable).unwrap();
        assert_eq!(
            role.rules.unwrap()[0].resource_names.as_deref(),
            Some(&["token-b".to_owned()][..])
        );
        let unusable = Unusable::from([
            ("token-a".to_owned(), String::new()),
            ("token-b".to_owned(), String::new()),
        ]);
        assert!(external_grant(&near, &unusable).is_none());
    }
}
