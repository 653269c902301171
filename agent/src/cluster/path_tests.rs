//! The agent's side of its pool's path tests (`spec.pathTests`).
//!
//! A pool that listens has every agent keep a discard-only receiver on
//! `pathTests.port`; the token is the pool's path-test Secret. A pool that
//! tests has the operator pick, per target, one of its agents and one of
//! the target's listeners (`status.pathTests`); that agent probes the
//! listener every `intervalSeconds`, rate-capped, never while it runs a
//! transfer, and says what it found in its Lease and its metrics.
//!
//! [`Schedule`] decides when (no I/O, time passed in); [`PathTester`]
//! reads the API, runs the probes and the listener.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use wirerate_crds::lease::{MAX_PATH_TEST_ERROR, PathTestRecord};
use wirerate_crds::pool::{PathTestResult, PathTests};
use wirerate_crds::{DtnPool, contract};
use wirerate_engine::error::{Error, Result};
use wirerate_engine::probe::{ProbeConfig, ProbeReport, probe};
use wirerate_engine::receiver::{DiscardPolicy, ServeConfig, Server, ServerHandle};

use super::RunConfig;
use crate::metrics::path_test_metrics;
use crate::observer::Shown;

/// How long after an agent learns of a target it first tests it, at the
/// least: long enough for a restarted agent to have picked up its
/// transfers, which come first.
const FIRST_DELAY: Duration = Duration::from_secs(30);
/// The most a target's first test is put off beyond that, so that the
/// agents of a mesh that start together do not all test at once.
const FIRST_SPREAD_S: u64 = 60;
/// How soon a failed test is tried again (or the interval, if shorter).
const RETRY_AFTER: Duration = Duration::from_secs(300);
/// How soon a listener that could not start is tried again.
const LISTEN_RETRY: Duration = Duration::from_secs(30);

/// When each target this agent tests is due.
#[derive(Debug, Default)]
pub struct Schedule {
    due: BTreeMap<String, Duration>,
    running: Option<String>,
}

/// A stable spread of `s` over `0..n` (the same on every start).
fn spread(s: &str, n: u64) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    }) % n.max(1)
}

impl Schedule {
    /// The targets this agent is to test, as of `now`: new ones become due
    /// after [`FIRST_DELAY`] and a spread, dropped ones are forgotten.
    pub fn assign<'a>(&mut self, targets: impl IntoIterator<Item = &'a str>, now: Duration) {
        let mut kept = BTreeMap::new();
        for t in targets {
            let due = self.due.get(t).copied().unwrap_or_else(|| {
                now + FIRST_DELAY + Duration::from_secs(spread(t, FIRST_SPREAD_S))
            });
            kept.insert(t.to_owned(), due);
        }
        self.due = kept;
    }

    /// The target to test now, if one is due, none runs, and the agent is
    /// not `busy` with transfers (a test would take from them). The
    /// longest overdue goes first.
    pub fn poll(&mut self, now: Duration, busy: bool) -> Option<String> {
        if busy || self.running.is_some() {
            return None;
        }
        let (target, _) = self
            .due
            .iter()
            .filter(|(_, due)| **due <= now)
            .min_by_key(|(_, due)| **due)?;
        self.running = Some(target.clone());
        self.running.clone()
    }

    /// The running test ended at `now`: the next is due an `interval`
    /// later, or sooner after a failure.
    pub fn finished(&mut self, ok: bool, interval: Duration, now: Duration) {
        let Some(target) = self.running.take() else {
            return;
        };
        let after = if ok {
            interval
        } else {
            interval.min(RETRY_AFTER)
        };
        if let Some(due) = self.due.get_mut(&target) {
            *due = now + after;
        }
    }

    /// The test running, if one is.
    pub fn running(&self) -> Option<&str> {
        self.running.as_deref()
    }
}

/// What `report` (or the error) says of the path to `endpoint`.
pub fn result(
    agent: &str,
    endpoint: &str,
    outcome: &Result<ProbeReport>,
    at: Timestamp,
) -> PathTestResult {
    let mut r = PathTestResult {
        at: Time(at),
        agent: agent.to_owned(),
        endpoint: endpoint.to_owned(),
        ok: outcome.is_ok(),
        error: None,
        single_stream_gbps: 0.0,
        gbps: 0.0,
        streams: 0,
        rtt_ms: 0.0,
        retransmits: 0,
        advised_streams: 0,
    };
    match outcome {
        Ok(p) => {
            r.single_stream_gbps = p.one.figures.gbps;
            r.gbps = p.many.figures.gbps;
            r.streams = i32::from(p.many.figures.streams);
            r.rtt_ms = p.many.figures.rtt_ms;
            r.retransmits = i64::try_from(p.many.figures.retransmits).unwrap_or(i64::MAX);
            r.advised_streams = i32::from(p.advice.streams);
        }
        Err(e) => r.error = Some(e.to_string().chars().take(MAX_PATH_TEST_ERROR).collect()),
    }
    r
}

/// The probe of one target, running on a blocking thread.
struct Running {
    target: String,
    endpoint: String,
    task: tokio::task::JoinHandle<Result<ProbeReport>>,
}

/// The discard-only listener, and the port it was started for.
struct Listener {
    port: u16,
    handle: ServerHandle,
}

/// This agent's path tests and listener.
#[derive(Default)]
pub struct PathTester {
    schedule: Schedule,
    running: Option<Running>,
    /// The last result for each target, as the Lease carries them.
    results: BTreeMap<String, PathTestRecord>,
    listener: Option<Listener>,
    /// When to try starting the listener again after it could not be.
    listen_retry: Option<Duration>,
}

impl PathTester {
    /// The listener's address to advertise, if it is up.
    pub fn listener_address(&self, advertise: &str) -> Option<String> {
        self.listener
            .as_ref()
            .map(|l| format!("{advertise}:{}", l.port))
    }

    /// The last result of each target this agent tests.
    pub fn records(&self) -> Vec<PathTestRecord> {
        self.results.values().cloned().collect()
    }

    /// One step, once a second: keeps the listener as the pool asks,
    /// collects a finished test, and starts a due one unless `busy`.
    pub async fn step(
        &mut self,
        client: &Client,
        cfg: &RunConfig,
        pool: &DtnPool,
        busy: bool,
        now: Duration,
    ) {
        let spec = pool.spec.path_tests.as_ref();
        self.keep_listener(client, cfg, pool, spec, now).await;
        let Some(spec) = spec else {
            self.schedule.assign([], now);
            self.results.clear();
            return;
        };
        // What the operator assigned this agent: a target and a listener.
        let mine: BTreeMap<&str, &str> = pool
            .status
            .iter()
            .flat_map(|s| &s.path_tests)
            .filter(|s| s.tester.as_deref() == Some(cfg.agent.as_str()))
            .filter_map(|s| Some((s.target.as_str(), s.endpoint.as_deref()?)))
            .collect();
        self.schedule.assign(mine.keys().copied(), now);
        self.results.retain(|t, _| mine.contains_key(t.as_str()));
        let interval = Duration::from_secs(u64::try_from(spec.interval_seconds).unwrap_or(3600));
        if self.running.as_ref().is_some_and(|r| r.task.is_finished()) {
            let r = self.running.take().expect("checked above");
            let outcome = r
                .task
                .await
                .unwrap_or_else(|e| Err(Error::Config(format!("the path test stopped: {e}"))));
            self.record(&cfg.agent, &r.target, &r.endpoint, &outcome);
            self.schedule.finished(outcome.is_ok(), interval, now);
        }
        let Some(target) = self.schedule.poll(now, busy) else {
            return;
        };
        let Some(endpoint) = mine.get(target.as_str()).map(|e| (*e).to_owned()) else {
            self.schedule.finished(false, interval, now);
            return;
        };
        let secret = contract::path_test_secret(&target);
        // Asked once: a test can wait for its next turn, the agent's loop
        // (and its Lease) cannot.
        let token = match super::read_token(client, &cfg.namespace, &secret, Duration::ZERO).await {
            Ok(t) => t,
            Err(e) => {
                let outcome = Err(e);
                self.record(&cfg.agent, &target, &endpoint, &outcome);
                self.schedule.finished(false, interval, now);
                return;
            }
        };
        let probe_cfg = probe_config(&endpoint, token, spec);
        tracing::info!(target, endpoint, "testing the path");
        self.running = Some(Running {
            target,
            endpoint,
            task: tokio::task::spawn_blocking(move || probe(&probe_cfg)),
        });
    }

    fn record(&mut self, agent: &str, target: &str, endpoint: &str, outcome: &Result<ProbeReport>) {
        let now = Timestamp::now();
        let r = result(agent, endpoint, outcome, now);
        let m = path_test_metrics();
        let outcome_label = if r.ok { "ok" } else { "failed" };
        m.tests.with_label_values(&[target, outcome_label]).inc();
        m.last_timestamp_seconds
            .with_label_values(&[target])
            .set(now.as_millisecond() as f64 / 1e3);
        if r.ok {
            m.gbps.with_label_values(&[target]).set(r.gbps);
            m.single_stream_gbps
                .with_label_values(&[target])
                .set(r.single_stream_gbps);
            m.rtt_seconds
                .with_label_values(&[target])
                .set(r.rtt_ms / 1e3);
            m.retransmits
                .with_label_values(&[target])
                .set(r.retransmits);
            tracing::info!(target, gbps = r.gbps, rtt_ms = r.rtt_ms, "path test done");
        } else {
            tracing::warn!(
                target,
                error = r.error.as_deref().unwrap_or(""),
                "path test failed"
            );
        }
        self.results.insert(
            target.to_owned(),
            PathTestRecord {
                target: target.to_owned(),
                result: r,
            },
        );
    }

    async fn keep_listener(
        &mut self,
        client: &Client,
        cfg: &RunConfig,
        pool: &DtnPool,
        spec: Option<&PathTests>,
        now: Duration,
    ) {
        let want = spec
            .filter(|s| s.listen)
            .and_then(|s| u16::try_from(s.port).ok());
        if self.listener.as_ref().map(|l| l.port) == want {
            return;
        }
        if let Some(l) = self.listener.take() {
            l.handle.stop();
            tracing::info!(port = l.port, "path-test listener stopped");
        }
        let Some(port) = want else {
            return;
        };
        if self.listen_retry.is_some_and(|t| now < t) {
            return;
        }
        match start_listener(client, cfg, pool, port).await {
            Ok(handle) => {
                tracing::info!(port, "path-test listener up (memory-to-memory tests only)");
                self.listener = Some(Listener { port, handle });
                self.listen_retry = None;
            }
            Err(e) => {
                tracing::warn!(port, error = %e, "cannot start the path-test listener; trying again in {}s", LISTEN_RETRY.as_secs());
                self.listen_retry = Some(now + LISTEN_RETRY);
            }
        }
    }
}

/// A probe of `endpoint` as the pool's `spec` asks.
fn probe_config(endpoint: &str, token: Vec<u8>, spec: &PathTests) -> ProbeConfig {
    ProbeConfig {
        to: endpoint.to_owned(),
        token,
        streams: u16::try_from(spec.streams).unwrap_or(4).max(2),
        seconds: f64::from(spec.phase_seconds),
        block_size: wirerate_engine::Settings::default().block_size,
        socket: Default::default(),
        max_rate: u64::try_from(spec.max_rate_mbps)
            .ok()
            .map(|m| m.saturating_mul(1_000_000) / 8),
    }
}

/// Starts the discard-only listener on `port`, with the pool's path-test
/// token. Its root is the pool's first allowed root: a discard-only
/// receiver writes nothing, and were that ever to change it would stay
/// where the pool's agents may write anyway.
async fn start_listener(
    client: &Client,
    cfg: &RunConfig,
    pool: &DtnPool,
    port: u16,
) -> Result<ServerHandle> {
    let root = pool
        .spec
        .allowed_roots
        .first()
        .map(PathBuf::from)
        .ok_or_else(|| Error::Config("the pool has no allowedRoots".into()))?;
    let secret = contract::path_test_secret(&cfg.pool);
    let token = super::read_token(client, &cfg.namespace, &secret, Duration::ZERO).await?;
    let mut serve = ServeConfig::new(root, token);
    serve.discard = DiscardPolicy::Only;
    serve.max_sessions = 2;
    serve.observer = Shown::metrics().observe();
    Ok(Server::bind(&format!("0.0.0.0:{port}"), serve)?.spawn())
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_new_target_waits_then_runs_once_at_a_time_and_never_beside_a_transfer() {
        let mut s = Schedule::default();
        s.assign(["far", "near"], Duration::ZERO);
        assert_eq!(s.poll(FIRST_DELAY - S, false), None, "too early");
        let late = FIRST_DELAY + Duration::from_secs(FIRST_SPREAD_S);
        assert_eq!(s.poll(late, true), None, "a transfer runs");
        let first = s.poll(late, false).expect("due");
        assert_eq!(s.running(), Some(first.as_str()));
        assert_eq!(s.poll(late, false), None, "one test at a time");
        s.finished(true, 3600 * S, late);
        let second = s.poll(late, false).expect("the other is due too");
        assert_ne!(first, second);
        s.finished(true, 3600 * S, late);
        assert_eq!(s.poll(late + 3599 * S, false), None);
        assert!(s.poll(late + 3600 * S, false).is_some());
    }

    #[test]
    fn a_failed_test_is_tried_again_sooner_and_a_dropped_target_forgotten() {
        let mut s = Schedule::default();
        s.assign(["far"], Duration::ZERO);
        let late = FIRST_DELAY + Duration::from_secs(FIRST_SPREAD_S);
        assert_eq!(s.poll(late, false).as_deref(), Some("far"));
        s.finished(false, 3600 * S, late);
        assert_eq!(s.poll(late + RETRY_AFTER - S, false), None);
        assert_eq!(s.poll(late + RETRY_AFTER, false).as_deref(), Some("far"));
        s.finished(true, 3600 * S, late + RETRY_AFTER);
        // Re-assigning keeps when it is due; dropping forgets it.
        s.assign(["far"], late + RETRY_AFTER + S);
        assert_eq!(s.poll(late + RETRY_AFTER + S, false), None);
        s.assign([], late);
        assert_eq!(s.poll(late + 10 * 3600 * S, false), None);
        // Ending a test that is not running changes nothing.
        s.finished(true, S, late);
    }

    #[test]
    fn first_tests_of_a_mesh_are_spread() {
        let firsts: std::collections::BTreeSet<u64> = (0..20)
            .map(|i| spread(&format!("pool-{i}"), FIRST_SPREAD_S))
            .collect();
        assert!(firsts.len() > 10, "{firsts:?}");
        assert!(firsts.iter().all(|s| *s < FIRST_SPREAD_S));
    }

    #[test]
    fn a_failure_is_recorded_bounded_and_a_success_with_its_figures() {
        let long = Error::Config("x".repeat(5000));
        let r = result("a-0", "10.0.0.1:7690", &Err(long), Timestamp::UNIX_EPOCH);
        assert!(!r.ok);
        assert_eq!(r.error.unwrap().chars().count(), MAX_PATH_TEST_ERROR);
        assert_eq!((r.gbps, r.streams), (0.0, 0));
    }

    #[test]
    fn the_probe_is_capped_at_the_pools_rate() {
        let spec = PathTests {
            listen: false,
            port: 7690,
            targets: vec![],
            interval_seconds: 3600,
            phase_seconds: 2,
            streams: 4,
            max_rate_mbps: 800,
        };
        let c = probe_config("h:1", vec![1], &spec);
        assert_eq!(c.max_rate, Some(100_000_000));
        assert_eq!((c.streams, c.seconds), (4, 2.0));
    }
}
