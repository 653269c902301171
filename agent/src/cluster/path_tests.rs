//! The agent's side of its pool's path tests (`spec.pathTests`).
//!
//! A pool that listens has every agent keep a discard-only receiver on
//! `pathTests.port`; the token is the pool's path-test Secret. A pool that
//! tests has the operator pick, per target, one of its agents and one of
//! the target's listeners, or an external target's address
//! (`status.pathTests`); that agent probes the
//! listener every `intervalSeconds`, rate-capped, never starting one while
//! it runs a transfer and stopping one (at the end of its current run) when
//! a transfer starts, and says what it found in its Lease and its metrics.
//!
//! [`Schedule`] decides when (no I/O, time passed in); [`PathTester`]
//! reads the API, runs the probes and the listener.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use wirerate_crds::lease::{MAX_PATH_TEST_ERROR, PathTestRecord};
use wirerate_crds::pool::{MAX_PATH_TEST_STREAMS, PathTestResult, PathTests};
use wirerate_crds::{DtnPool, contract};
use wirerate_engine::error::{Error, Result};
use wirerate_engine::probe::{ProbeConfig, ProbeReport, probe};
use wirerate_engine::receiver::{DiscardPolicy, ServeConfig, Server, ServerHandle};

use super::RunConfig;
use crate::metrics::path_test_metrics;
use crate::observer::Shown;

/// How long after an agent learns of a target it first tests it, at the
/// least, unless `run --path-test-delay` says otherwise: long enough for a
/// restarted agent to have picked up its transfers, which come first.
pub const FIRST_DELAY: Duration = Duration::from_secs(30);
/// The bounds of `run --path-test-delay`, in seconds.
pub const FIRST_DELAY_BOUNDS_S: std::ops::RangeInclusive<u64> = 1..=3600;
/// The most a target's first test is put off beyond the first delay, as a
/// multiple of it, by tester and target, so that the agents of a mesh that
/// start together do not all test one listener at once.
const FIRST_SPREAD: u32 = 2;
/// How soon a failed test is tried again (or the interval, if shorter).
const RETRY_AFTER: Duration = Duration::from_secs(300);
/// How soon a listener that could not start is tried again.
const LISTEN_RETRY: Duration = Duration::from_secs(10);
/// How often a listener compares its token with the Secret's.
const TOKEN_RECHECK: Duration = Duration::from_secs(60);
/// Block size of a test: small, so that a test of many streams over a
/// capped or slow path stays short (each stream carries four blocks at
/// least).
const TEST_BLOCK: u64 = 1 << 20;
/// Buffer memory of the listener's sessions: enough for 1 MiB blocks in
/// flight, little beside the agent's transfers.
const LISTEN_BUFFER: u64 = 64 << 20;
/// Sessions and connections the listener takes at once: a few testers, not
/// a flood.
const LISTEN_SESSIONS: usize = 2;
/// Each session's control and data connections, and a few handshakes.
const LISTEN_CONNECTIONS: usize = LISTEN_SESSIONS * (MAX_PATH_TEST_STREAMS as usize + 1) + 8;

/// When each target this agent tests is due.
#[derive(Debug)]
pub struct Schedule {
    due: BTreeMap<String, Duration>,
    /// When each target's last good test here ended.
    ended: BTreeMap<String, Duration>,
    running: Option<String>,
    /// The least time from learning of a target to its first test.
    first_delay: Duration,
}

impl Default for Schedule {
    fn default() -> Self {
        Self::new(FIRST_DELAY)
    }
}

/// A stable spread of `s` over `0..n` (the same on every start).
fn spread(s: &str, n: u64) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    }) % n.max(1)
}

impl Schedule {
    /// A schedule that first tests a target `first_delay` after learning of
    /// it, plus a spread of up to twice that.
    pub fn new(first_delay: Duration) -> Self {
        Self {
            due: BTreeMap::new(),
            ended: BTreeMap::new(),
            running: None,
            first_delay,
        }
    }

    /// The targets agent `me` is to test, as of `now`, each with how long
    /// ago its last test ended if the pool's status knows. A new one is due
    /// an `interval` after that last test (so a restart or a move to
    /// another tester does not test again early), and never sooner than
    /// the first delay and a spread; dropped ones are forgotten.
    pub fn assign<'a>(
        &mut self,
        targets: impl IntoIterator<Item = (&'a str, Option<Duration>)>,
        me: &str,
        interval: Duration,
        now: Duration,
    ) {
        let mut kept = BTreeMap::new();
        for (t, ago) in targets {
            let due = match (self.due.get(t), self.ended.get(t)) {
                // A shorter interval counts from the last test at once.
                (Some(due), Some(ended)) => (*due).min(*ended + interval),
                (Some(due), None) => *due,
                (None, _) => {
                    let most = (self.first_delay * FIRST_SPREAD).as_millis();
                    let most = u64::try_from(most).unwrap_or(u64::MAX);
                    let first = self.first_delay
                        + Duration::from_millis(spread(&format!("{me}/{t}"), most));
                    let after_last = ago.map_or(Duration::ZERO, |a| interval.saturating_sub(a));
                    now + first.max(after_last)
                }
            };
            kept.insert(t.to_owned(), due);
        }
        self.ended.retain(|t, _| kept.contains_key(t));
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
        if ok {
            self.ended.insert(target, now);
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
    // JSON has no NaN: one would make the whole Lease field unreadable.
    for v in [&mut r.single_stream_gbps, &mut r.gbps, &mut r.rtt_ms] {
        if !v.is_finite() {
            *v = 0.0;
        }
    }
    r
}

/// Where to test `target`, which the status says is at `listed`: an
/// external target at the address its spec gives, beside the token Secret
/// that spec names (a status that lags the spec, or was written by someone
/// else, must not send one target's proof to another's address); a pool's
/// at its listener the operator chose.
pub fn endpoint<'a>(spec: &'a PathTests, target: &str, listed: &'a str) -> &'a str {
    spec.external
        .iter()
        .find(|e| e.name == target)
        .map_or(listed, |e| e.address.as_str())
}

/// The Secret holding `target`'s token: the one an external target names,
/// else the target pool's path-test Secret. The CRD keeps the two kinds'
/// names apart.
pub fn token_secret(spec: &PathTests, target: &str) -> String {
    spec.external.iter().find(|e| e.name == target).map_or_else(
        || contract::path_test_secret(target),
        |e| e.token_secret.clone(),
    )
}

/// The probe of one target, running on a blocking thread.
struct Running {
    target: String,
    endpoint: String,
    task: tokio::task::JoinHandle<Result<ProbeReport>>,
    /// Set when a transfer starts: the probe ends with its current run.
    cancel: Arc<AtomicBool>,
}

/// The discard-only listener, and the port it was started for.
struct Listener {
    port: u16,
    /// The token it takes.
    token: Vec<u8>,
    handle: ServerHandle,
    /// When its token was last compared with the Secret's.
    checked: Duration,
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
    /// Why the listener is not up, while the pool asks for it.
    listen_problem: Option<String>,
    /// A listener being started on a blocking thread, with its port and
    /// token.
    starting: Option<(u16, Vec<u8>, tokio::task::JoinHandle<Result<ServerHandle>>)>,
}

impl PathTester {
    /// A tester whose first test of a target comes `first_delay` after it
    /// learns of it, at the least.
    pub fn new(first_delay: Duration) -> Self {
        Self {
            schedule: Schedule::new(first_delay),
            ..Self::default()
        }
    }

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

    /// Why the listener the pool asks for is not up, as a preflight
    /// finding (so the pool's status says it, not only this agent's log).
    pub fn finding(&self) -> Option<(String, String)> {
        self.listen_problem
            .clone()
            .map(|p| ("path-test-listener".to_owned(), p))
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
        let interval = spec.map_or(Duration::from_secs(3600), |s| {
            Duration::from_secs(u64::try_from(s.interval_seconds).unwrap_or(3600))
        });
        // What the operator assigned this agent: a target and a listener,
        // and how long ago the target's last test ended.
        let wall = Timestamp::now();
        let mine: BTreeMap<&str, (&str, Option<Duration>)> = pool
            .status
            .iter()
            .filter(|_| spec.is_some())
            .flat_map(|s| &s.path_tests)
            .filter(|s| s.tester.as_deref() == Some(cfg.agent.as_str()))
            .filter_map(|s| {
                let ago = s.last.as_ref().map(|l| {
                    Duration::try_from(wall.duration_since(l.at.0)).unwrap_or(Duration::ZERO)
                });
                Some((
                    s.target.as_str(),
                    (endpoint(spec?, &s.target, s.endpoint.as_deref()?), ago),
                ))
            })
            .collect();
        // A test beside a transfer, or no longer this agent's to run, stops
        // its current run (within a keepalive interval).
        if let Some(r) = &self.running
            && (busy || !mine.contains_key(r.target.as_str()))
        {
            r.cancel.store(true, Ordering::Relaxed);
        }
        if self.running.as_ref().is_some_and(|r| r.task.is_finished()) {
            let r = self.running.take().expect("checked above");
            let outcome = r
                .task
                .await
                .unwrap_or_else(|e| Err(Error::Config(format!("the path test stopped: {e}"))));
            // Stopped for a transfer says nothing of the path: the last
            // result stands, and the test comes again as a failed one would.
            if !matches!(outcome, Err(Error::Cancelled { .. })) {
                self.record(&cfg.agent, &r.target, &r.endpoint, &outcome);
            }
            self.schedule.finished(outcome.is_ok(), interval, now);
        }
        self.schedule.assign(
            mine.iter().map(|(t, (_, ago))| (*t, *ago)),
            &cfg.agent,
            interval,
            now,
        );
        self.forget(|t| mine.contains_key(t));
        let Some(spec) = spec else {
            return;
        };
        let Some(target) = self.schedule.poll(now, busy) else {
            return;
        };
        let Some(endpoint) = mine.get(target.as_str()).map(|(e, _)| (*e).to_owned()) else {
            self.schedule.finished(false, interval, now);
            return;
        };
        let secret = token_secret(spec, &target);
        // Asked once: a test can wait for its next turn, the agent's loop
        // (and its Lease) cannot.
        let token = match super::read_token(client, &cfg.namespace, &secret).await {
            Ok(t) => t,
            Err(e) => {
                let outcome = Err(e);
                self.record(&cfg.agent, &target, &endpoint, &outcome);
                self.schedule.finished(false, interval, now);
                return;
            }
        };
        let mut probe_cfg = probe_config(&endpoint, token, spec);
        let cancel = Arc::new(AtomicBool::new(false));
        probe_cfg.cancel = Some(cancel.clone());
        tracing::info!(target, endpoint, "testing the path");
        self.running = Some(Running {
            target,
            endpoint,
            task: tokio::task::spawn_blocking(move || probe(&probe_cfg)),
            cancel,
        });
    }

    /// Drops the results and metric series of targets `keep` says no to.
    fn forget(&mut self, keep: impl Fn(&str) -> bool) {
        let m = path_test_metrics();
        self.results.retain(|t, _| {
            if keep(t) {
                return true;
            }
            for g in [
                &m.gbps,
                &m.single_stream_gbps,
                &m.rtt_seconds,
                &m.last_timestamp_seconds,
            ] {
                let _ = g.remove_label_values(&[t]);
            }
            let _ = m.retransmits.remove_label_values(&[t]);
            for o in ["ok", "failed"] {
                let _ = m.tests.remove_label_values(&[t, o]);
            }
            false
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
        // A start in progress is looked at, never waited for: it opens the
        // pool's root, which a hung mount could hold for as long as it likes.
        if let Some((port, token, task)) = self.starting.take() {
            if !task.is_finished() {
                self.starting = Some((port, token, task));
                return;
            }
            let started = task
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r.map_err(|e| e.to_string()));
            match started {
                Ok(handle) => {
                    tracing::info!(port, "path-test listener up (memory-to-memory tests only)");
                    self.listener = Some(Listener {
                        port,
                        token,
                        handle,
                        checked: now,
                    });
                    self.listen_retry = None;
                    self.listen_problem = None;
                }
                Err(e) => self.failed_to_listen(port, &e, now),
            }
        }
        let Some(port) = want else {
            self.stop_listener();
            self.listen_problem = None;
            self.listen_retry = None;
            return;
        };
        // The token Secret is read again now and then: one deleted and made
        // again holds a new token, which the testers read at once.
        let token_due = self
            .listener
            .as_ref()
            .is_some_and(|l| l.port == port && now >= l.checked + TOKEN_RECHECK);
        if token_due {
            let secret = contract::path_test_secret(&cfg.pool);
            if let (Ok(token), Some(l)) = (
                super::read_token(client, &cfg.namespace, &secret).await,
                self.listener.as_mut(),
            ) {
                l.checked = now;
                if token != l.token {
                    tracing::info!(port, "the path-test token changed; restarting the listener");
                    self.stop_listener();
                }
            }
        }
        if self.listener.as_ref().is_some_and(|l| l.port == port) {
            return;
        }
        self.stop_listener();
        if self.listen_retry.is_some_and(|t| now < t) {
            return;
        }
        let secret = contract::path_test_secret(&cfg.pool);
        // Asked once, as for a test.
        match super::read_token(client, &cfg.namespace, &secret).await {
            Ok(token) => match listener_config(pool, token.clone()) {
                Ok(serve) => {
                    let bind =
                        move || Server::bind(&format!("0.0.0.0:{port}"), serve).map(Server::spawn);
                    self.starting = Some((port, token, tokio::task::spawn_blocking(bind)));
                }
                Err(e) => self.failed_to_listen(port, &e.to_string(), now),
            },
            Err(e) => self.failed_to_listen(port, &e.to_string(), now),
        }
    }

    fn stop_listener(&mut self) {
        if let Some(l) = self.listener.take() {
            // Stopping joins its threads: not on the agent's loop.
            tokio::task::spawn_blocking(move || l.handle.stop());
            tracing::info!(port = l.port, "path-test listener stopped");
        }
    }

    fn failed_to_listen(&mut self, port: u16, e: &str, now: Duration) {
        tracing::warn!(
            port,
            error = e,
            "cannot start the path-test listener; trying again in {}s",
            LISTEN_RETRY.as_secs()
        );
        self.listen_retry = Some(now + LISTEN_RETRY);
        self.listen_problem = Some(format!("cannot listen for path tests on port {port}: {e}"));
    }
}

/// A probe of `endpoint` as the pool's `spec` asks.
fn probe_config(endpoint: &str, token: Vec<u8>, spec: &PathTests) -> ProbeConfig {
    ProbeConfig {
        // In clear: a path test carries generated data, never a file, and
        // measures the path itself, not what TLS in an agent costs.
        encrypt: wirerate_engine::encryption::Encryption::None,
        to: endpoint.to_owned(),
        token,
        streams: u16::try_from(spec.streams).unwrap_or(4).max(2),
        seconds: f64::from(spec.phase_seconds),
        block_size: TEST_BLOCK,
        socket: Default::default(),
        max_rate: u64::try_from(spec.max_rate_mbps)
            .ok()
            .map(|m| m.saturating_mul(1_000_000) / 8),
        cancel: None,
    }
}

/// The discard-only listener's settings, with the pool's path-test token.
/// Its root is the pool's first allowed root: a discard-only receiver
/// writes nothing, and were that ever to change it would stay where the
/// pool's agents may write anyway. Small: a few testers' sessions of 1 MiB
/// blocks, beside the agent's transfers.
fn listener_config(pool: &DtnPool, token: Vec<u8>) -> Result<ServeConfig> {
    let root = pool
        .spec
        .allowed_roots
        .first()
        .map(PathBuf::from)
        .ok_or_else(|| Error::Config("the pool has no allowedRoots".into()))?;
    let mut serve = ServeConfig::new(root, token);
    serve.discard = DiscardPolicy::Only;
    serve.buffer = LISTEN_BUFFER;
    serve.max_sessions = LISTEN_SESSIONS;
    serve.max_memory = Some(LISTEN_BUFFER * LISTEN_SESSIONS as u64);
    serve.max_connections = LISTEN_CONNECTIONS;
    serve.observer = Shown::path_test_listener().observe();
    Ok(serve)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    const HOUR: Duration = Duration::from_secs(3600);

    /// Tests sessions used to count as the receiver's sessions: an agent
    /// that only listened for path tests showed transfers in its
    /// `wirerate_receiver_sessions_*`.
    #[test]
    fn the_listeners_sessions_are_counted_as_path_tests() {
        let pool = wirerate_crds::fixtures::PoolBuilder::new("p", "/data").build();
        let serve = listener_config(&pool, b"token".to_vec()).unwrap();
        let tests = &path_test_metrics().listener_sessions;
        let receiver = &crate::metrics::metrics().sessions;
        let (tests_before, receiver_before) = (tests.get(), receiver.get());
        serve.observer.session_opened();
        serve.observer.session_closed();
        assert_eq!(tests.get(), tests_before + 1);
        assert_eq!(receiver.get(), receiver_before);
    }

    fn fresh<'a>(targets: &[&'a str]) -> Vec<(&'a str, Option<Duration>)> {
        targets.iter().map(|t| (*t, None)).collect()
    }

    #[test]
    fn a_new_target_waits_then_runs_once_at_a_time_and_never_beside_a_transfer() {
        let mut s = Schedule::default();
        s.assign(fresh(&["far", "near"]), "a-0", HOUR, Duration::ZERO);
        assert_eq!(s.poll(FIRST_DELAY - S, false), None, "too early");
        let late = FIRST_DELAY + FIRST_DELAY * FIRST_SPREAD;
        assert_eq!(s.poll(late, true), None, "a transfer runs");
        let first = s.poll(late, false).expect("due");
        assert_eq!(s.running(), Some(first.as_str()));
        assert_eq!(s.poll(late, false), None, "one test at a time");
        s.finished(true, HOUR, late);
        let second = s.poll(late, false).expect("the other is due too");
        assert_ne!(first, second);
        s.finished(true, HOUR, late);
        assert_eq!(s.poll(late + HOUR - S, false), None);
        assert!(s.poll(late + HOUR, false).is_some());
    }

    #[test]
    fn a_failed_test_is_tried_again_sooner_and_a_dropped_target_forgotten() {
        let mut s = Schedule::default();
        s.assign(fresh(&["far"]), "a-0", HOUR, Duration::ZERO);
        let late = FIRST_DELAY + FIRST_DELAY * FIRST_SPREAD;
        assert_eq!(s.poll(late, false).as_deref(), Some("far"));
        s.finished(false, HOUR, late);
        assert_eq!(s.poll(late + RETRY_AFTER - S, false), None);
        assert_eq!(s.poll(late + RETRY_AFTER, false).as_deref(), Some("far"));
        let done = late + RETRY_AFTER;
        s.finished(true, HOUR, done);
        // Ending a test that is not running changes nothing.
        s.finished(false, HOUR, done);
        // Re-assigning keeps when it is due (an hour on, not the first
        // delay a new target gets); dropping forgets it.
        s.assign(fresh(&["far"]), "a-0", HOUR, done + S);
        let first = FIRST_DELAY + FIRST_DELAY * FIRST_SPREAD;
        assert_eq!(s.poll(done + S + first, false), None);
        assert_eq!(s.poll(done + HOUR - S, false), None);
        assert_eq!(s.poll(done + HOUR, false).as_deref(), Some("far"));
        s.finished(true, HOUR, done + HOUR);
        s.assign([], "a-0", HOUR, done);
        assert_eq!(s.poll(done + 10 * HOUR, false), None);
    }

    // Found in review: lowering the interval waited out the old one.
    #[test]
    fn a_shorter_interval_counts_from_the_last_test_at_once() {
        let mut s = Schedule::default();
        s.assign(fresh(&["far"]), "a-0", 24 * HOUR, Duration::ZERO);
        let late = FIRST_DELAY + FIRST_DELAY * FIRST_SPREAD;
        assert!(s.poll(late, false).is_some());
        s.finished(true, 24 * HOUR, late);
        s.assign(fresh(&["far"]), "a-0", HOUR, late + S);
        assert_eq!(s.poll(late + HOUR - S, false), None);
        assert_eq!(s.poll(late + HOUR, false).as_deref(), Some("far"));
    }

    // Found in review: a restarted agent, or a target moved to another
    // tester, tested again within a minute whatever the interval.
    #[test]
    fn a_target_tested_lately_waits_for_its_interval_from_that_test() {
        let mut s = Schedule::default();
        let now = 1000 * S;
        s.assign([("far", Some(600 * S))], "a-1", HOUR, now);
        assert_eq!(s.poll(now + 3000 * S - S, false), None);
        assert_eq!(s.poll(now + 3000 * S, false).as_deref(), Some("far"));
        // One overdue is tested after the first delay, not at once.
        let mut s = Schedule::default();
        s.assign([("far", Some(10 * HOUR))], "a-1", HOUR, now);
        assert_eq!(s.poll(now + FIRST_DELAY - S, false), None);
        assert!(
            s.poll(now + FIRST_DELAY + FIRST_DELAY * FIRST_SPREAD, false)
                .is_some()
        );
    }

    // Found in review: the spread was by target alone, so every tester of
    // one listener came at the same second.
    #[test]
    fn the_testers_of_one_listener_do_not_all_come_at_once() {
        let firsts: std::collections::BTreeSet<Duration> = (0..20)
            .map(|i| {
                let mut s = Schedule::default();
                s.assign(
                    fresh(&["far"]),
                    &format!("pool-{i}-agent-0"),
                    HOUR,
                    Duration::ZERO,
                );
                s.due["far"]
            })
            .collect();
        assert!(firsts.len() > 10, "{firsts:?}");
        let last = FIRST_DELAY + FIRST_DELAY * FIRST_SPREAD;
        assert!(firsts.iter().all(|d| *d >= FIRST_DELAY && *d < last));
    }

    #[test]
    fn a_failure_is_recorded_with_its_error_bounded() {
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
            external: vec![],
            interval_seconds: 3600,
            phase_seconds: 2,
            streams: 4,
            max_rate_mbps: 800,
        };
        let c = probe_config("h:1", vec![1], &spec);
        assert_eq!(c.max_rate, Some(100_000_000));
        assert_eq!((c.streams, c.seconds), (4, 2.0));
    }

    #[test]
    fn an_external_target_takes_the_token_its_spec_names() {
        let spec = PathTests {
            listen: false,
            port: 7690,
            targets: vec![wirerate_crds::pool::PathTestTarget { pool: "far".into() }],
            external: vec![wirerate_crds::pool::ExternalPathTestTarget {
                name: "partner".into(),
                address: "dtn.partner.example:7690".into(),
                token_secret: "partner-token".into(),
            }],
            interval_seconds: 3600,
            phase_seconds: 2,
            streams: 4,
            max_rate_mbps: 800,
        };
        assert_eq!(token_secret(&spec, "partner"), "partner-token");
        assert_eq!(token_secret(&spec, "far"), "wirerate-path-test.far");
        // The spec's address, whatever the status lists.
        assert_eq!(
            endpoint(&spec, "partner", "elsewhere:1"),
            "dtn.partner.example:7690"
        );
        assert_eq!(endpoint(&spec, "far", "far-0:7690"), "far-0:7690");
    }
}
