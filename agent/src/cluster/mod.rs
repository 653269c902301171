//! In-cluster mode (`wirerate-agent run`): keep this agent's Lease renewed,
//! run the sides of the Transfers assigned to it, and report on them under
//! the agent's own field manager.
//!
//! `plan` decides what should run and when to report, `cadence` when to
//! write, `api` makes the calls (each under a deadline) and keeps the Lease
//! on a task of its own, `jobs` runs the engine, `host` reads the machine, `storage` checks the agent may use the
//! pool's storage, `path_tests` tests the paths to other pools; this module
//! talks to the API server.

pub mod api;
pub mod cadence;
pub mod host;
pub mod jobs;
pub mod path_tests;
pub mod plan;
pub mod relay_job;
pub mod storage;
pub mod stripes;
pub mod tuning;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use wirerate_crds::apply::{AgentStatus, StatusApply};
use wirerate_crds::transfer::{
    AgentReport, CompressionReport, EncryptionReport, Progress as ProgressStatus, ReportState,
    Role, StripesReport, StripingReport, TuningReport,
};
use wirerate_crds::{AgentLease, DtnPool, Transfer, contract};
use wirerate_engine::encryption::InEffect;

use crate::units::{self, fmt_bytes};
use jobs::{ReceiverJob, SenderJob, SenderOutcome, Targets};
use plan::{Cadence, JobKey, Me, Want};
use relay_job::RelayJob;
use wirerate_engine::error::{Error, Result};
use wirerate_engine::progress::Position;

/// Who this agent is and where it listens.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// Agent name (the pod name in the cluster).
    pub agent: String,
    /// Namespace of its pool.
    pub namespace: String,
    /// Its pool.
    pub pool: String,
    /// Node or host name.
    pub node: String,
    /// Host or address senders reach it at.
    pub advertise: String,
    /// First data port; receivers bind the first free one from here.
    pub data_port: u16,
    /// Transfers at once.
    pub max_transfers: u16,
    /// Other namespaces whose Transfers to watch.
    pub watch_namespaces: Vec<String>,
    /// Running in a pod (then the Lease names it).
    pub in_pod: bool,
    /// The least time from learning of a path-test target to its first
    /// test.
    pub path_test_delay: Duration,
}

enum Side {
    Sender {
        job: SenderJob,
        /// The receiver is outside the cluster, so only the sender can
        /// show progress (bytes the remote acknowledged as written); an
        /// in-cluster receiver shows what it holds durably instead.
        shows_progress: bool,
        /// The state last reported, so that a sender that shows no
        /// progress writes only when its state moves (or every
        /// `Cadence::MAX`).
        last_state: Option<ReportState>,
        /// Tries left to tell the tuner's choice in an Event (0: told, or
        /// given up).
        announce_tries: u8,
        /// The optimizer's changes told in Events so far.
        changes_told: usize,
        /// Over several pairs: each receiver's endpoint and agent name.
        pair_names: Vec<(String, String)>,
        /// Over several pairs: each relay's endpoint and agent name.
        relay_names: Vec<(String, String)>,
        /// Over several pairs: the pairs, and those lost, at the last
        /// report; a change is told at once (`Cadence::due_urgent`).
        pairs_told: (usize, usize),
    },
    Receiver {
        job: ReceiverJob,
        dest: PathBuf,
        striping: StripingReport,
        reported: bool,
        /// Bytes kept at the last report.
        shown_kept: u64,
        /// One of several pairs' receivers: its sessions carry parts of
        /// files, the sender alone knows when the whole is published (and
        /// reports the verdict and progress), and the job ends with the
        /// Transfer. It reports once, where it listens.
        multi: bool,
        /// Whether its verdict waits for the sender's mirror.
        mirror: MirrorWait,
    },
    /// Reads and sends pairs' data for the sender, until the Transfer no
    /// longer names it. It reports once, where it listens.
    Relay { job: RelayJob, reported: bool },
}

struct Job {
    transfer: (String, String),
    /// Where a sender sends; a receiver that restarted listens elsewhere.
    endpoints: Vec<String>,
    side: Side,
    cadence: Cadence,
    last_done: (Duration, u64),
    block_size: i64,
    /// The Transfer's progress when this job started (bytes done, total).
    carried: (u64, u64),
    /// Since when the job is no longer wanted, while it finishes.
    unwanted_since: Option<Duration>,
}

/// How long a sender that has sent everything may go on after its Transfer
/// is over, to report how it ended.
const FINISH_GRACE: Duration = Duration::from_secs(30);

/// How long a starting agent waits for its DtnPool (and the RBAC to read
/// it) to appear: GitOps tools apply a pool, its agents and their roles in
/// no fixed order.
const POOL_WAIT: Duration = Duration::from_secs(120);

/// Why the agent in cluster mode stopped: what it needs from the API
/// server at start, typed with the API's answer, or a transfer's error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// No API server configured (no KUBECONFIG, not in a pod), or its
    /// configuration does not load.
    #[error("no Kubernetes API to talk to ({0}): set KUBECONFIG or run in a pod")]
    NoApi(kube::Error),
    /// The agent's DtnPool could not be read for [`POOL_WAIT`].
    #[error(
        "cannot read DtnPool {namespace}/{pool} after {}s ({last}): create the pool, or check that this agent's service account may get dtnpools",
        POOL_WAIT.as_secs()
    )]
    PoolUnreadable {
        /// The pool's namespace.
        namespace: String,
        /// The pool.
        pool: String,
        /// The last answer, or its absence (in the message, so not
        /// chained again).
        last: api::ApiError,
    },
    /// The agent's own work failed.
    #[error(transparent)]
    Agent(#[from] Error),
}

impl RunError {
    /// Whether starting again may get past it: the API server did not
    /// answer, or answered with a server error. A missing pool or a
    /// refusal needs a change first.
    pub fn transient(&self) -> bool {
        match self {
            Self::NoApi(_) | Self::Agent(_) => false,
            Self::PoolUnreadable { last, .. } => last.transient(),
        }
    }
}

/// Reads this agent's DtnPool, retrying with a growing pause until
/// `POOL_WAIT` has passed.
async fn read_pool(pools: &Api<DtnPool>, cfg: &RunConfig) -> Result<DtnPool, RunError> {
    let start = Instant::now();
    let mut pause = Duration::from_millis(500);
    loop {
        let e = match api::call(api::CALL_TIMEOUT, pools.get(&cfg.pool)).await {
            Ok(p) => return Ok(p),
            Err(e) => e,
        };
        if start.elapsed() + pause >= POOL_WAIT {
            return Err(RunError::PoolUnreadable {
                namespace: cfg.namespace.clone(),
                pool: cfg.pool.clone(),
                last: e,
            });
        }
        tracing::warn!(
            namespace = %cfg.namespace,
            pool = %cfg.pool,
            error = %e,
            retry_in_s = pause.as_secs_f64(),
            "cannot read the DtnPool yet"
        );
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(10));
    }
}

/// Runs the agent until the process is stopped.
pub async fn run(cfg: RunConfig) -> Result<(), RunError> {
    let client = api::client().await.map_err(RunError::NoApi)?;
    run_with(client, cfg).await
}

/// Runs the agent on `client` until the process is stopped.
pub async fn run_with(client: Client, cfg: RunConfig) -> Result<(), RunError> {
    let pools: Api<DtnPool> = Api::namespaced(client.clone(), &cfg.namespace);
    let pool = read_pool(&pools, &cfg).await?;
    tracing::info!(
        agent = cfg.agent,
        pool = cfg.pool,
        advertise = cfg.advertise,
        "agent starting"
    );
    let stores = watch_transfers(&client, &cfg);
    let tester = path_tests::PathTester::new(cfg.path_test_delay);
    // The Lease has a task of its own: nothing this loop waits for (a slow
    // report, a token read, a pool read) can let it lapse.
    let (lease, lease_rx) = tokio::sync::watch::channel(lease_info(&cfg, &pool, 0, &tester));
    tokio::spawn(api::keep_lease(
        client.clone(),
        cfg.namespace.clone(),
        cfg.pool.clone(),
        cfg.agent.clone(),
        lease_rx,
    ));
    let mut agent = Agent {
        me: Me {
            namespace: cfg.namespace.clone(),
            pool: cfg.pool.clone(),
            name: cfg.agent.clone(),
        },
        reports: api::Reports::start(client.clone(), &cfg.agent),
        client,
        cfg,
        pools,
        pool,
        stores,
        start: Instant::now(),
        jobs: HashMap::new(),
        finished: HashSet::new(),
        no_token: cadence::NotYet::default(),
        tester,
        lease,
        last_look: None,
        shown_active: 0,
    };
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        agent.round().await;
    }
}

/// Watches the Transfers that name this agent, in its namespace and those
/// it watches besides.
fn watch_transfers(client: &Client, cfg: &RunConfig) -> Vec<Store<Transfer>> {
    let mut namespaces = vec![cfg.namespace.clone()];
    namespaces.extend(
        cfg.watch_namespaces
            .iter()
            .filter(|n| !n.is_empty() && **n != cfg.namespace)
            .cloned(),
    );
    let mut stores: Vec<Store<Transfer>> = Vec::new();
    for ns in &namespaces {
        // A Transfer over several pairs names each receiver with a label
        // of its own (a label has one value).
        let selectors = [
            format!("{}={}", contract::SENDER_LABEL, cfg.agent),
            format!("{}={}", contract::RECEIVER_LABEL, cfg.agent),
            format!(
                "{}=true",
                contract::pair_receiver_label(&cfg.namespace, &cfg.pool, &cfg.agent)
            ),
            format!(
                "{}=true",
                contract::pair_relay_label(&cfg.namespace, &cfg.pool, &cfg.agent)
            ),
        ];
        for selector in selectors {
            let (reader, writer) = reflector::store();
            let api: Api<Transfer> = Api::namespaced(client.clone(), ns);
            tokio::spawn(
                reflector::reflector(
                    writer,
                    watcher(api, watcher::Config::default().labels(&selector)),
                )
                .default_backoff()
                .touched_objects()
                .for_each(|_| async {}),
            );
            stores.push(reader);
        }
    }
    stores
}

/// The agent between its rounds: what it runs, and what it has seen.
struct Agent {
    client: Client,
    cfg: RunConfig,
    me: Me,
    pools: Api<DtnPool>,
    pool: DtnPool,
    stores: Vec<Store<Transfer>>,
    start: Instant,
    jobs: HashMap<JobKey, Job>,
    finished: HashSet<JobKey>,
    no_token: cadence::NotYet<JobKey>,
    tester: path_tests::PathTester,
    lease: tokio::sync::watch::Sender<AgentLease>,
    reports: api::Reports,
    last_look: Option<Instant>,
    shown_active: usize,
}

impl Agent {
    /// One round, every second: the pool and the Lease, then each
    /// Transfer's jobs stopped, started and observed, then path tests.
    async fn round(&mut self) {
        jobs::expire_warm();
        self.look_around().await;
        let mut seen: BTreeMap<String, Transfer> = BTreeMap::new();
        for s in &self.stores {
            for t in s.state() {
                seen.insert(t.metadata.uid.clone().unwrap_or_default(), (*t).clone());
            }
        }
        let transfers: Vec<Transfer> = seen.into_values().collect();
        let by_uid: HashMap<String, &Transfer> = transfers
            .iter()
            .map(|t| (t.metadata.uid.clone().unwrap_or_default(), t))
            .collect();
        self.cancel(&transfers, &by_uid);
        let wanted = plan::wanted(&transfers, &self.me);
        let wanted_now: HashSet<JobKey> = wanted.iter().map(|w| w.key.clone()).collect();
        self.stop_unwanted(&wanted, &by_uid);
        for w in wanted {
            self.start_wanted(w, &by_uid).await;
        }
        let jobs = &self.jobs;
        self.no_token
            .retain(|k| wanted_now.contains(k) && !jobs.contains_key(k));
        self.observe_all();
        self.tester
            .step(
                &self.client,
                &self.cfg,
                &self.pool,
                !self.jobs.is_empty(),
                self.start.elapsed(),
            )
            .await;
    }

    /// The pool and the host are looked at every 5 s, and the Lease's
    /// content follows them (the Lease task writes it when it changed).
    async fn look_around(&mut self) {
        let due = self
            .last_look
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(5));
        if !due && self.shown_active == self.jobs.len() {
            return;
        }
        if due {
            self.last_look = Some(Instant::now());
            match api::call(api::CALL_TIMEOUT, self.pools.get(&self.cfg.pool)).await {
                Ok(p) => self.pool = p,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the DtnPool; keeping the last copy")
                }
            }
        }
        self.shown_active = self.jobs.len();
        let info = lease_info(&self.cfg, &self.pool, self.jobs.len(), &self.tester);
        self.lease.send_if_modified(|l| {
            let changed = *l != info;
            *l = info;
            changed
        });
    }

    /// Stops the jobs of Transfers cancelled, and says so.
    fn cancel(&mut self, transfers: &[Transfer], by_uid: &HashMap<String, &Transfer>) {
        for (key, name) in plan::cancelled(transfers, &self.me) {
            if let Some(mut j) = self.jobs.remove(&key) {
                stop(&mut j);
            }
            let msg = match by_uid.get(&key.uid) {
                Some(t) if key.role == Role::Receiver => {
                    let n = jobs::remove_partials(Path::new(&t.spec.destination.path));
                    format!("stopped; removed {n} temporary files")
                }
                _ => "stopped".to_owned(),
            };
            report(
                &self.reports,
                &self.cfg,
                &name,
                &key,
                Report::new(ReportState::Cancelled, &msg),
            );
        }
    }

    /// Stops the jobs whose assignment moved away, once a sender that may
    /// still finish has had `FINISH_GRACE`.
    fn stop_unwanted(&mut self, wanted: &[Want], by_uid: &HashMap<String, &Transfer>) {
        let elapsed = self.start.elapsed();
        for key in plan::to_stop(self.jobs.keys(), wanted, &self.finished) {
            let Some(j) = self.jobs.get_mut(&key) else {
                continue;
            };
            let acked = match &j.side {
                Side::Sender { job: s, .. } => {
                    let at = s.progress.position();
                    at.total > 0 && at.done >= at.total
                }
                Side::Receiver { .. } | Side::Relay { .. } => false,
            };
            let lingering = *j.unwanted_since.get_or_insert(elapsed);
            if plan::may_finish(&key, by_uid.get(&key.uid).copied(), acked)
                && elapsed - lingering < FINISH_GRACE
            {
                continue;
            }
            if let Some(mut j) = self.jobs.remove(&key) {
                tracing::info!(transfer = ?j.transfer, "assignment moved away; stopping attempt {}", key.attempt);
                stop(&mut j);
            }
        }
    }

    /// Follows a running job's receivers, or starts the job `w` wants.
    async fn start_wanted(&mut self, w: Want, by_uid: &HashMap<String, &Transfer>) {
        if let Some(j) = self.jobs.get_mut(&w.key) {
            take_in(j, &w);
            let multi = by_uid.get(&w.key.uid).is_some_and(|t| t.multi_pair());
            if plan::receivers_moved(&j.endpoints, &w.endpoints, multi) {
                tracing::info!(transfer = ?j.transfer, "the receiver moved to {:?}; following it", w.endpoints);
                stop(j);
                self.jobs.remove(&w.key);
            }
        }
        if self.jobs.contains_key(&w.key) || self.finished.contains(&w.key) || !plan::may_start(&w)
        {
            return;
        }
        let Some(t) = by_uid.get(&w.key.uid) else {
            return;
        };
        let span = tracing::info_span!(
            "transfer",
            transfer = %format!("{}/{}", w.transfer.0, w.transfer.1),
            role = ?w.key.role,
            attempt = w.key.attempt
        );
        let started = start_job(&self.client, &self.cfg, &self.pool, t, &w, &span).await;
        let failed = match started {
            Ok(job) => {
                tracing::info!(transfer = ?w.transfer, role = ?w.key.role, attempt = w.key.attempt, "started");
                self.jobs.insert(w.key.clone(), job);
                self.no_token.forget(&w.key);
                None
            }
            Err(Start::NotYet(why)) if self.no_token.waiting(&w.key, self.start.elapsed()) => {
                tracing::info!(transfer = ?w.transfer, "not starting yet: {why}");
                None
            }
            Err(Start::NotYet(why)) => Some(format!(
                "{why}, for {}s after the assignment",
                cadence::TOKEN_WAIT.as_secs()
            )),
            Err(Start::Failed(e)) => Some(storage::explain(&e)),
        };
        if let Some(msg) = failed {
            tracing::warn!(transfer = ?w.transfer, "cannot start: {msg}");
            report(
                &self.reports,
                &self.cfg,
                &w.transfer,
                &w.key,
                Report::new(ReportState::Failed, &msg),
            );
            self.no_token.forget(&w.key);
            self.finished.insert(w.key);
        }
    }

    /// Reports each job, and ends those that finished.
    fn observe_all(&mut self) {
        let now = self.start.elapsed();
        let mut done = Vec::new();
        for (key, job) in self.jobs.iter_mut() {
            if let Some(finish) = observe(&self.client, &self.reports, &self.cfg, key, job, now) {
                done.push((key.clone(), finish));
            }
        }
        for (key, _) in done {
            if let Some(mut j) = self.jobs.remove(&key) {
                stop(&mut j);
            }
            self.finished.insert(key);
        }
    }
}

fn stop(j: &mut Job) {
    match &mut j.side {
        Side::Sender { job, .. } => job.cancel(),
        Side::Receiver { job, .. } => job.stop(),
        Side::Relay { job, .. } => job.stop(),
    }
}

/// Why a job did not start.
enum Start {
    /// What it needs is not there yet (its token): asked again next round.
    NotYet(String),
    /// It cannot run.
    Failed(Error),
}

impl From<Error> for Start {
    fn from(e: Error) -> Self {
        Self::Failed(e)
    }
}

async fn start_job(
    client: &Client,
    cfg: &RunConfig,
    pool: &DtnPool,
    t: &Transfer,
    w: &Want,
    span: &tracing::Span,
) -> std::result::Result<Job, Start> {
    let s = t.status.clone().unwrap_or_default();
    let tuning = s.effective_tuning.clone().unwrap_or_else(|| {
        t.spec
            .tuning
            .clone()
            .unwrap_or_default()
            .or(&pool.spec.tuning)
    });
    let block_size = tuning.settings().map_err(Error::from)?.block_size as i64;
    // The assignment may be seen before its token: not yet, not a failure.
    let Some(secret_name) = s.token_secret.clone() else {
        return Err(Start::NotYet("the Transfer has no token Secret yet".into()));
    };
    for path in [&t.spec.source.path, &t.spec.destination.path] {
        if !wirerate_crds::transfer::plain_path(path) {
            return Err(Start::Failed(Error::PathRefused {
                path: path.clone(),
                reason: "it is not spelled plainly (no '//', '/./' or trailing '/')".into(),
            }));
        }
    }
    if t.spec.destination.external.is_none() {
        jobs::refuse_same_file(&t.spec.source.path, &t.spec.destination.path)?;
    }
    let token = match fetch_token(client, &w.transfer.0, &secret_name).await {
        Ok(t) => t,
        Err(TokenRead::NotYet(why)) => return Err(Start::NotYet(why)),
        Err(TokenRead::Unusable(e)) => return Err(Start::Failed(e)),
    };
    let side = match w.key.role {
        Role::Sender => span.in_scope(|| sender_side(t, w, pool, token, &tuning))?,
        Role::Receiver => span.in_scope(|| receiver_side(cfg, t, pool, &s, token, &tuning))?,
        Role::Relay => span.in_scope(|| relay_side(cfg, t, pool, token, &tuning))?,
    };
    let carried = s
        .progress
        .as_ref()
        .map(|p| (p.bytes_done.max(0) as u64, p.bytes_total.max(0) as u64))
        .unwrap_or_default();
    Ok(Job {
        transfer: w.transfer.clone(),
        endpoints: w.endpoints.clone(),
        side,
        cadence: Cadence::default(),
        // A sender counts from what was done; a receiver's counter of
        // bytes written starts at 0 with its session.
        last_done: (
            Duration::ZERO,
            if w.key.role == Role::Sender {
                carried.0
            } else {
                0
            },
        ),
        block_size,
        carried,
        unwanted_since: None,
    })
}

/// A sender's side of a job: its engine job started (its thread logs
/// under the caller's span).
fn sender_side(
    t: &Transfer,
    w: &Want,
    pool: &DtnPool,
    token: Vec<u8>,
    tuning: &wirerate_crds::tuning::Tuning,
) -> Result<Side> {
    let source = jobs::under_roots(Path::new(&t.spec.source.path), &pool.spec.allowed_roots)?;
    let dest = dest_name(&t.spec.destination.path)?;
    Ok(Side::Sender {
        job: SenderJob::start(
            Targets {
                endpoints: &w.endpoints,
                via: &w.via,
                pairs: t.multi_pair().then(|| t.pairs() as usize),
            },
            token,
            source,
            dest,
            tuning,
            jobs::SendTerms {
                verify: t.spec.verification,
                sync: t.spec.sync,
                max_rate_mbps: t.spec.max_rate_mbps,
                filters: t.spec.filters.clone().unwrap_or_default(),
                mirror: t.spec.mirror,
                keeping: t
                    .spec
                    .keep
                    .as_ref()
                    .map(|k| {
                        k.keeping()
                            .map_err(|e| Error::Config(format!("spec.keep.{e}")))
                    })
                    .transpose()?
                    .unwrap_or_default(),
            },
        )?,
        // Over several pairs no one receiver holds the whole.
        shows_progress: t.spec.destination.external.is_some() || t.multi_pair(),
        last_state: None,
        announce_tries: ANNOUNCE_TRIES,
        changes_told: 0,
        pair_names: pair_names(w, t.multi_pair()),
        relay_names: w.relays.clone(),
        pairs_told: (0, 0),
    })
}

/// A relay's side of a job: the engine's relay bound for this Transfer,
/// reading beneath the source's directory alone (the source checked
/// against the pool's allowed roots as the sender checks it): a relay
/// serves whoever holds the Transfer's token, and that is all it needs.
fn relay_side(
    cfg: &RunConfig,
    t: &Transfer,
    pool: &DtnPool,
    token: Vec<u8>,
    tuning: &wirerate_crds::tuning::Tuning,
) -> Result<Side> {
    let source = jobs::under_roots(Path::new(&t.spec.source.path), &pool.spec.allowed_roots)?;
    let root = match source.is_dir() {
        true => source.clone(),
        false => source.parent().map_or(source.clone(), Path::to_path_buf),
    };
    let ports = contract::data_ports(cfg.data_port, cfg.max_transfers);
    Ok(Side::Relay {
        job: RelayJob::start(root, token, tuning, ports)?,
        reported: false,
    })
}

/// A receiver's side of a job: the destination's parent created beneath
/// an allowed root (never above one; for another namespace's Transfer,
/// beneath its own subtree), and its engine job started.
fn receiver_side(
    cfg: &RunConfig,
    t: &Transfer,
    pool: &DtnPool,
    s: &wirerate_crds::TransferStatus,
    token: Vec<u8>,
    tuning: &wirerate_crds::tuning::Tuning,
) -> Result<Side> {
    let dest = PathBuf::from(&t.spec.destination.path);
    let parent = dest
        .parent()
        .ok_or_else(|| Error::Config("the destination has no parent directory".into()))?;
    let namespace = t.metadata.namespace.as_deref().unwrap_or_default();
    let roots = wirerate_crds::pool::tenant_roots(pool, namespace);
    let root = roots
        .iter()
        .find(|r| parent.starts_with(r))
        .ok_or_else(|| Error::PathRefused {
            path: dest.display().to_string(),
            reason: format!(
                "it is not under this pool's roots for namespace {namespace} ({})",
                roots.join(", ")
            ),
        })?;
    std::fs::create_dir_all(parent)
        .map_err(|e| Error::io(format!("creating {}", parent.display()), e))?;
    let parent = jobs::under_roots(parent, std::slice::from_ref(root))?;
    let striping = stripe(&parent, s.effective_striping.as_ref());
    let ports = contract::data_ports(cfg.data_port, cfg.max_transfers);
    // Deletes beneath the destination alone, and only for a Transfer
    // that mirrors into a pool that allows them.
    let deletes = (t.spec.mirror.is_some() && pool.spec.allow_deletes)
        .then(|| dest.file_name().map(|n| n.to_string_lossy().into_owned()))
        .flatten();
    // Owners only where the Transfer keeps them and the pool gave its
    // agents the capabilities to set them (the operator checked both);
    // ACLs where the Transfer keeps them: they grant no more than the
    // modes its files may already have.
    let owners = match t.spec.keep.as_ref().is_some_and(|k| k.owner) && pool.gives_chown() {
        true => wirerate_engine::metadata::OwnerPolicy::Keep,
        false => wirerate_engine::metadata::OwnerPolicy::Ignore,
    };
    let terms = jobs::ReceiveTerms {
        mirror: deletes,
        owners,
        acls: t.spec.keep.as_ref().is_some_and(|k| k.acls),
    };
    let job = ReceiverJob::start(parent, token, tuning, ports, terms)?;
    Ok(Side::Receiver {
        job,
        dest,
        striping,
        reported: false,
        shown_kept: 0,
        multi: t.multi_pair(),
        mirror: match t.spec.mirror {
            Some(_) => MirrorWait::Pending,
            None => MirrorWait::None,
        },
    })
}

/// What a sender's report adds when data streams joined over connections
/// an earlier transfer parked (see `jobs`).
fn warm_note(streams_warm: u64) -> String {
    match streams_warm {
        0 => String::new(),
        n => format!(", {n} data streams joined warm"),
    }
}

/// Tells a running sender over several pairs of every receiver `w`
/// names: one it does not send to yet (a lost pair's replacement, or a
/// receiver that moved) joins as a new pair, and is named in its reports.
fn take_in(j: &mut Job, w: &Want) {
    let Side::Sender {
        job, pair_names, ..
    } = &mut j.side
    else {
        return;
    };
    for (to, agent) in w.endpoints.iter().zip(&w.receivers) {
        if !job.join(to) {
            return;
        }
        if !pair_names.iter().any(|(e, _)| e == to) {
            tracing::info!(transfer = ?j.transfer, receiver = %agent, "a receiver joins at {to}");
            pair_names.push((to.clone(), agent.clone()));
        }
    }
}

/// Over several pairs, each receiver's endpoint with its agent (none over
/// one pair).
fn pair_names(w: &Want, multi: bool) -> Vec<(String, String)> {
    if !multi {
        return Vec::new();
    }
    w.endpoints
        .iter()
        .cloned()
        .zip(w.receivers.iter().cloned())
        .collect()
}

/// What a sender's last report adds over several pairs: the pairs that
/// ran to the end (and those lost on the way), then each pair's receiver,
/// how it ended, its bytes and chunks.
fn pairs_note(pairs: &[(String, String, u64, u64)]) -> String {
    if pairs.is_empty() {
        return String::new();
    }
    let each: Vec<String> = pairs
        .iter()
        .map(|(to, state, bytes, chunks)| {
            format!("{to} {state} {} in {chunks} chunks", fmt_bytes(*bytes))
        })
        .collect();
    let lost = pairs
        .iter()
        .filter(|p| matches!(p.1.as_str(), "lost" | "gone"))
        .count();
    let ran = pairs.len() - lost;
    match lost {
        0 => format!(", over {ran} pairs: {}", each.join("; ")),
        _ => format!(", over {ran} pairs ({lost} lost): {}", each.join("; ")),
    }
}

/// The receiver's root is the destination's parent; the sender names the last component.
fn dest_name(path: &str) -> Result<String> {
    Path::new(path)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| Error::Config(format!("destination {path} has no file name")))
}

fn stripe(dir: &Path, want: Option<&wirerate_crds::Striping>) -> StripingReport {
    let (is_lustre, magic) = host::lustre(dir);
    let none = |message: String| StripingReport {
        applied: false,
        stripe_count: None,
        stripe_size: None,
        message,
    };
    match (is_lustre, want) {
        (false, _) => none(format!(
            "{} is not on Lustre (filesystem magic {magic:#x}); no layout set",
            dir.display()
        )),
        (true, None) => none("no striping asked for; files inherit the directory's layout".into()),
        (true, Some(s)) => {
            let out = std::process::Command::new("lfs")
                .args([
                    "setstripe",
                    "-c",
                    &s.stripe_count.to_string(),
                    "-S",
                    &s.stripe_size.to_string(),
                ])
                .arg(dir)
                .output();
            match out {
                Ok(o) if o.status.success() => StripingReport {
                    applied: true,
                    stripe_count: Some(s.stripe_count),
                    stripe_size: Some(s.stripe_size),
                    message: format!("lfs setstripe on {}", dir.display()),
                },
                Ok(o) => none(format!(
                    "lfs setstripe failed: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                )),
                Err(e) => none(format!("cannot run lfs: {e}")),
            }
        }
    }
}

/// Why a token could not be read.
enum TokenRead {
    /// Not there, not readable or not answered yet: the operator writes the
    /// Secret and its grant before the assignment, but the API server's
    /// authorizer learns of a new RoleBinding a moment late, and a loaded
    /// API server answers late.
    NotYet(String),
    /// There, and not a token.
    Unusable(Error),
}

/// Reads the token in Secret `ns/name`, once.
async fn fetch_token(
    client: &Client,
    ns: &str,
    name: &str,
) -> std::result::Result<Vec<u8>, TokenRead> {
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    let s = match api::call(api::CALL_TIMEOUT, api.get(name)).await {
        Ok(s) => s,
        Err(e) if matches!(e.code(), Some(403 | 404)) || e.transient() => {
            return Err(TokenRead::NotYet(format!(
                "cannot read token Secret {ns}/{name} yet ({e})"
            )));
        }
        Err(e) => {
            return Err(TokenRead::Unusable(Error::Config(format!(
                "cannot read token Secret {ns}/{name}: {e}"
            ))));
        }
    };
    s.data
        .and_then(|d| d.get(contract::TOKEN_KEY).cloned())
        .map(|b| b.0)
        .filter(|b| !b.is_empty())
        .ok_or_else(|| {
            TokenRead::Unusable(Error::Config(format!(
                "Secret {ns}/{name} has no '{}' key",
                contract::TOKEN_KEY
            )))
        })
}

/// Reads the token in Secret `ns/name`, once; any failure is an error.
async fn read_token(client: &Client, ns: &str, name: &str) -> Result<Vec<u8>> {
    fetch_token(client, ns, name).await.map_err(|e| match e {
        TokenRead::NotYet(why) => Error::Config(why),
        TokenRead::Unusable(e) => e,
    })
}

/// Looks at a running job; reports what changed. Some(()) when it is over.
fn observe(
    client: &Client,
    reports: &api::Reports,
    cfg: &RunConfig,
    key: &JobKey,
    job: &mut Job,
    now: Duration,
) -> Option<()> {
    match job.side {
        Side::Sender { .. } => observe_sender(client, reports, cfg, key, job, now),
        Side::Receiver { .. } => observe_receiver(reports, cfg, key, job, now),
        Side::Relay { .. } => observe_relay(reports, cfg, key, job),
    }
}

/// What the sender's tuner and optimizer chose (for `status.tuning`),
/// each choice told in an Event too (`announce_tuning`), and whether it
/// is fresh (just chosen or changed: reported now, not at the next
/// cadence). `told` holds the tries left and the changes told so far.
fn tuning_told(
    client: &Client,
    cfg: &RunConfig,
    about: ((String, String), String),
    key: &JobKey,
    s: &SenderJob,
    told: (&mut u8, &mut usize),
) -> (Option<TuningReport>, bool) {
    let choice = s.progress.streams_chosen.get();
    let changes = s
        .progress
        .stream_changes
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let tuning = choice.map(|c| tuning::report(key.attempt, c, &changes));
    let fresh = (choice.is_some() && *told.0 == ANNOUNCE_TRIES) || changes.len() > *told.1;
    announce_tuning(
        client,
        &cfg.agent,
        about,
        key.attempt,
        (choice, &changes),
        told,
    );
    (tuning, fresh)
}

/// A relay says once where it listens: the sender waits for that. It has
/// no verdict of its own; its job ends with the Transfer, or when the
/// Transfer no longer names it.
fn observe_relay(
    reports: &api::Reports,
    cfg: &RunConfig,
    key: &JobKey,
    job: &mut Job,
) -> Option<()> {
    let Side::Relay { job: rj, reported } = &mut job.side else {
        return None;
    };
    if !*reported {
        let endpoint = format!("{}:{}", cfg.advertise, rj.port);
        let msg = format!("relaying on {endpoint} for the sender");
        let r = Report {
            endpoint: Some(&endpoint),
            ..Report::new(ReportState::Running, &msg)
        };
        report(reports, cfg, &job.transfer, key, r);
        *reported = true;
    }
    None
}

/// Looks at a running sender job; reports what changed. Some(()) when it is over.
fn observe_sender(
    client: &Client,
    reports: &api::Reports,
    cfg: &RunConfig,
    key: &JobKey,
    job: &mut Job,
    now: Duration,
) -> Option<()> {
    let Side::Sender {
        job: s,
        shows_progress,
        last_state,
        announce_tries,
        changes_told,
        pair_names,
        relay_names,
        pairs_told,
    } = &mut job.side
    else {
        return None;
    };
    let pairs_now = pairs_and_lost(&s.progress);
    let about = (job.transfer.clone(), key.uid.clone());
    let (tuning, fresh) = tuning_told(client, cfg, about, key, s, (announce_tries, changes_told));
    let (total, done) = shown(s.progress.position(), job.carried);
    let (state, msg, p, over) = if let Some(outcome) = s.outcome() {
        let (state, msg, rate) = sender_verdict(outcome);
        (
            state,
            msg,
            progress(key, (total, done, None), job.block_size, rate, Some(0)),
            true,
        )
    } else {
        let state = if total > 0 && done >= total {
            ReportState::Verifying
        } else {
            ReportState::Running
        };
        let changed = fresh
            || if *shows_progress {
                done != job.last_done.1
            } else {
                *last_state != Some(state)
            };
        // A pair lost or joined is told at once: the operator records
        // it, and replaces a lost one.
        let urgent = pairs_now != *pairs_told && job.cadence.due_urgent(now);
        if !urgent && !job.cadence.due(now, changed) {
            return None;
        }
        let secs = now.saturating_sub(job.last_done.0).as_secs_f64();
        let rate = units::rate(job.last_done.1, done, secs);
        let eta = units::eta(total.saturating_sub(done), rate).map(|s| s as i64);
        let rate = rate as i64;
        job.last_done = (now, done);
        (
            state,
            String::new(),
            progress(key, (total, done, None), job.block_size, rate, eta),
            false,
        )
    };
    *last_state = Some(state);
    *pairs_told = pairs_now;
    // Read after the outcome: the pairs as they ended go with the verdict.
    let stripes = s.progress.transfer.pairs().map(|shown| {
        let names = stripes::Names {
            receivers: pair_names,
            relays: relay_names,
        };
        stripes::report(key.attempt, &cfg.agent, &shown, &names)
    });
    let encryption = s.progress.encryption.get().map(|e| EncryptionReport {
        attempt: key.attempt,
        in_effect: e.as_str().to_owned(),
        note: (*e == InEffect::Userspace).then(wirerate_engine::net::tls::userspace_note),
    });
    let compression = s
        .progress
        .transfer
        .compression()
        .map(|c| compression_report(key.attempt, &c));
    report(
        reports,
        cfg,
        &job.transfer,
        key,
        Report {
            progress: shows_progress.then_some(&p),
            tuning: tuning.as_ref(),
            encryption: encryption.as_ref(),
            compression: compression.as_ref(),
            stripes: stripes.as_ref(),
            ..Report::new(state, &msg)
        },
    );
    over.then_some(())
}

/// Tells in Events the streams the tuner chose (`choice`, tried up to
/// `ANNOUNCE_TRIES` times) and each the optimizer added since the last
/// look (`changes`), about the Transfer `about`; counts them as told.
fn announce_tuning(
    client: &Client,
    agent: &str,
    about: ((String, String), String),
    attempt: i32,
    (choice, changes): (
        Option<&wirerate_engine::tuner::StreamChoice>,
        &[wirerate_engine::optimizer::StreamChange],
    ),
    (announce_tries, changes_told): (&mut u8, &mut usize),
) {
    if let Some(c) = choice.filter(|_| *announce_tries > 0) {
        let note = tuning::chosen_note(attempt, c);
        let event = ("StreamsChosen", note);
        tokio::spawn(announce(
            client.clone(),
            agent.to_owned(),
            about.clone(),
            event,
            ANNOUNCE_TRIES,
        ));
        *announce_tries = 0;
    }
    // Each addition once, told or not: a missed one is still in
    // status.tuning.changes.
    for c in changes.iter().skip(*changes_told) {
        let event = ("StreamsAdded", tuning::added_note(attempt, c));
        tokio::spawn(announce(
            client.clone(),
            agent.to_owned(),
            about.clone(),
            event,
            1,
        ));
    }
    *changes_told = changes.len();
}

/// Over several pairs: the pairs a sender has, and how many of them are
/// lost; (0, 0) over one.
fn pairs_and_lost(progress: &crate::progress::Progress) -> (usize, usize) {
    progress.transfer.pairs().map_or((0, 0), |p| {
        let lost = p
            .pairs
            .iter()
            .filter(|p| matches!(p.state, "lost" | "gone"));
        (p.pairs.len(), lost.count())
    })
}

/// What the verdict says of the pieces an earlier attempt landed.
fn resumed_note(bytes: u64) -> String {
    if bytes == 0 {
        return String::new();
    }
    format!(
        ", {} resumed from the pieces an earlier attempt landed",
        fmt_bytes(bytes)
    )
}

/// What a finished sender reports: its state, the message, and the
/// session's own rate (which the Rate column then shows for a finished
/// transfer).
fn sender_verdict(outcome: SenderOutcome) -> (ReportState, String, i64) {
    let rate = outcome
        .summary()
        .map_or(0, |sum| (sum.gbps * 1e9 / 8.0) as i64);
    let (state, msg) = match outcome {
        SenderOutcome::Verified(sum) => (
            ReportState::Succeeded,
            format!(
                "{} in {:.1} s at {:.2} Gbit/s, digest {}{}{}{}{}{}{}",
                fmt_bytes(sum.bytes_total),
                sum.seconds,
                sum.gbps,
                sum.digest,
                warm_note(sum.streams_warm),
                pairs_note(&sum.pairs),
                resumed_note(sum.bytes_resumed),
                match sum.files_present {
                    0 => String::new(),
                    n => format!("; {n} file(s) already there, not sent (sync)"),
                },
                match sum.files_filtered {
                    0 => String::new(),
                    n => format!("; {n} file(s) left out by the filters"),
                },
                sum.mirror
                    .as_ref()
                    .map(|m| format!("; {m}"))
                    .unwrap_or_default()
            ),
        ),
        SenderOutcome::FilesFailed(sum) => (
            ReportState::Failed,
            sum.failures
                .iter()
                .map(|(path, why)| format!("{path}: {why}"))
                .collect::<Vec<_>>()
                .join("; "),
        ),
        SenderOutcome::Failed { reason, .. } => (ReportState::Failed, reason),
    };
    (state, msg, rate)
}

/// A receiver's verdict, once a session completed or failed: its state,
/// message and rate. A dry run's session (`send --dry-run` with the job's
/// token) is no part of the job: it wrote nothing, and its "complete" is
/// not the job's.
fn receiver_verdict(
    sums: &[wirerate_engine::summary::ReceiverSummary],
    at: Position,
    dest: &Path,
) -> Option<(ReportState, String, i64)> {
    let sums: Vec<_> = sums.iter().filter(|s| !s.dry_run).collect();
    match sums.iter().find(|s| s.outcome.is_complete()) {
        Some(s) if s.files_failed > 0 => Some((
            ReportState::Failed,
            format!(
                "{} of {} files failed verification",
                s.files_failed,
                s.files_failed + s.files_ok
            ),
            0,
        )),
        Some(s) => Some((
            ReportState::Succeeded,
            format!(
                "{} file(s) verified into {}: {} written this attempt, {} resumed{}",
                s.files_ok,
                dest.display(),
                fmt_bytes(at.moved),
                fmt_bytes(s.bytes_skipped_resume),
                // Every attempt's: a retry does not offer them again.
                match sums.iter().map(|s| s.files_present).sum::<u64>() {
                    0 => String::new(),
                    n => format!("; {n} already there, not sent (sync)"),
                }
            ),
            // The attempt's own rate: what all its sessions wrote over
            // the time since the first was planned (the average the
            // Transfer shows).
            (at.moved as f64 / at.seconds.max(0.001)) as i64,
        )),
        None => sums
            .iter()
            .find(|s| s.outcome.failure().is_some())
            .map(|s| (ReportState::Failed, s.outcome.to_string(), 0)),
    }
}

/// How long a receiver job whose files landed waits for its sender's
/// mirror (`spec.mirror`) before it ends anyway: the sender connects
/// for it right after its last session.
const MIRROR_GRACE: Duration = Duration::from_secs(60);

/// Where a receiver job stands with its sender's mirror: a mirror's
/// deletes come after the last session, and the job serves them before
/// it ends, or ends anyway `MIRROR_GRACE` after its files landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MirrorWait {
    /// The Transfer does not mirror.
    None,
    /// It mirrors; its files have not all landed yet.
    Pending,
    /// Its files landed at this time since the agent started.
    Since(Duration),
}

/// Whether a receiver job whose files landed still waits for its
/// sender's mirror, `done` mirrors served so far, at `now`.
fn awaits_mirror(mirror: &mut MirrorWait, done: u64, now: Duration) -> bool {
    let first = match *mirror {
        MirrorWait::None => return false,
        MirrorWait::Pending => {
            *mirror = MirrorWait::Since(now);
            now
        }
        MirrorWait::Since(first) => first,
    };
    done == 0 && now.saturating_sub(first) < MIRROR_GRACE
}

/// Looks at a running receiver job; reports what changed. Some(()) when it is over.
fn observe_receiver(
    reports: &api::Reports,
    cfg: &RunConfig,
    key: &JobKey,
    job: &mut Job,
    now: Duration,
) -> Option<()> {
    let Side::Receiver {
        job: rj,
        striping,
        reported,
        dest,
        shown_kept,
        multi,
        mirror,
    } = &mut job.side
    else {
        return None;
    };
    let endpoint = format!("{}:{}", cfg.advertise, rj.port);
    // One of several pairs' receivers: its sessions carry parts of files,
    // and only the sender knows when the whole is published.
    if *multi {
        if !*reported {
            let msg = format!("listening on {endpoint}, one of several pairs");
            let r = Report {
                striping: Some(striping),
                endpoint: Some(&endpoint),
                ..Report::new(ReportState::Running, &msg)
            };
            report(reports, cfg, &job.transfer, key, r);
            *reported = true;
        }
        return None;
    }
    let sums = rj.summaries();
    let at = rj.position().unwrap_or_default();
    let (total, kept) = shown(at, job.carried);
    let mut verdict = receiver_verdict(&sums, at, dest);
    if let Some((ReportState::Succeeded, ..)) = verdict
        && awaits_mirror(mirror, rj.mirrors_done(), now)
    {
        verdict = None;
    }
    // The verdict, once there is one, ends the job; until then
    // the running progress, at the cadence.
    let update = if let Some((state, msg, rate)) = verdict {
        Some((state, msg, rate, None, true))
    } else if !*reported
        || job
            .cadence
            .due(now, kept != *shown_kept || at.moved != job.last_done.1)
    {
        // The rate is of bytes written, durable or not; what is
        // shown done is only what a resume would keep.
        let secs = now.saturating_sub(job.last_done.0).as_secs_f64();
        let rate = units::rate(job.last_done.1, at.moved, secs);
        let eta = units::eta(total.saturating_sub(kept), rate).map(|s| s as i64);
        job.last_done = (now, at.moved);
        let msg = format!("listening on {endpoint}");
        Some((ReportState::Running, msg, rate as i64, eta, false))
    } else {
        None
    };
    if let Some((state, msg, rate, eta, last)) = update {
        let p = progress(
            key,
            (total, kept, Some(at.moved)),
            job.block_size,
            rate,
            eta,
        );
        report(
            reports,
            cfg,
            &job.transfer,
            key,
            Report {
                progress: Some(&p),
                striping: Some(striping),
                endpoint: Some(&endpoint),
                ..Report::new(state, &msg)
            },
        );
        // Posted is as good as sent: the outbox sends it again
        // until the API server takes it.
        if last {
            return Some(());
        }
        *reported = true;
        *shown_kept = kept;
    }
    None
}

/// The (total, done) a job reports: its own once it knows the total (the
/// sender has listed its source, the receiver planned a session), and until
/// then the figures the Transfer already showed, so that a new attempt
/// after a failover does not drop the progress back to 0% for its first
/// report.
fn shown(at: Position, carried: (u64, u64)) -> (u64, u64) {
    if at.total == 0 {
        (carried.1, carried.0)
    } else {
        (at.total, at.done)
    }
}

fn progress(
    key: &JobKey,
    (total, done, written): (u64, u64, Option<u64>),
    block: i64,
    rate: i64,
    eta: Option<i64>,
) -> ProgressStatus {
    let block = block.max(1) as u64;
    // Before the source is listed the total is unknown: nothing is done yet.
    let pct = if total == 0 {
        0.0
    } else {
        done as f64 * 100.0 / total as f64
    };
    ProgressStatus {
        attempt: key.attempt,
        bytes_done: done as i64,
        bytes_total: total as i64,
        bytes_written: written.map(|w| w as i64),
        blocks_done: done.div_ceil(block) as i64,
        blocks_total: total.div_ceil(block) as i64,
        percent: format!("{pct:.0}%"),
        rate_bps: rate,
        rate: format!("{:.2} Gbit/s", rate as f64 * 8.0 / 1e9),
        eta_seconds: eta,
        updated_at: Time(Timestamp::now()),
    }
}

/// The status's account of what compression did for `attempt`.
fn compression_report(attempt: i32, c: &wirerate_engine::compress::Report) -> CompressionReport {
    CompressionReport {
        attempt,
        mode: c.mode,
        codec: c.codec.map(|c| c.as_str().to_owned()),
        packing: c.packing,
        reason: c.reason.as_str().to_owned(),
        plain_bytes: i64::try_from(c.plain_bytes).unwrap_or(i64::MAX),
        wire_bytes: i64::try_from(c.wire_bytes).unwrap_or(i64::MAX),
    }
}

/// What one report says; the optional parts are fields the agent's role owns.
struct Report<'a> {
    state: ReportState,
    message: &'a str,
    progress: Option<&'a ProgressStatus>,
    striping: Option<&'a StripingReport>,
    tuning: Option<&'a TuningReport>,
    encryption: Option<&'a EncryptionReport>,
    compression: Option<&'a CompressionReport>,
    endpoint: Option<&'a str>,
    stripes: Option<&'a StripesReport>,
}

impl<'a> Report<'a> {
    /// A state and a message, nothing else.
    fn new(state: ReportState, message: &'a str) -> Self {
        Self {
            state,
            message,
            progress: None,
            striping: None,
            tuning: None,
            encryption: None,
            compression: None,
            endpoint: None,
            stripes: None,
        }
    }
}

/// Posts this agent's report (and the fields its role owns), to be
/// applied under its field manager when the API server takes it.
fn report(
    reports: &api::Reports,
    cfg: &RunConfig,
    transfer: &(String, String),
    key: &JobKey,
    r: Report<'_>,
) {
    let Report {
        state,
        message,
        progress,
        striping,
        tuning,
        encryption,
        compression,
        endpoint,
        stripes,
    } = r;
    let status = AgentStatus {
        reports: [AgentReport {
            role: key.role,
            agent: cfg.agent.clone(),
            attempt: key.attempt,
            state,
            message: message.chars().take(1000).collect(),
            endpoint: endpoint.map(str::to_owned),
            updated_at: Time(Timestamp::now()),
        }],
        progress: progress.cloned(),
        striping: striping.cloned(),
        tuning: tuning.cloned(),
        encryption: encryption.cloned(),
        compression: compression.cloned(),
        stripes: stripes.cloned(),
    };
    match serde_json::to_value(StatusApply::new::<Transfer>(&status)) {
        Ok(body) => reports.post(api::ReportKey::new(transfer, key), body),
        Err(e) => tracing::warn!(transfer = transfer.1, "cannot encode a report: {e}"),
    }
}

/// Tries to publish the tuner's choice before the agent gives up on it (an
/// agent without the right to record Events says so this many times).
const ANNOUNCE_TRIES: u8 = 3;

/// Tells the Transfer's watchers how many streams the sender's tuner
/// opened (once per attempt) or the optimizer added, and why (also in
/// `status.tuning`): an Event with `reason` and `note`. True once
/// published.
async fn announce(
    client: Client,
    agent: String,
    ((ns, name), uid): ((String, String), String),
    (reason, note): (&'static str, String),
    tries: u8,
) {
    // A recorder of its own: one kept across attempts would fold a new
    // attempt's Event into the last one's (same reason, action and
    // object) and keep that one's note, the old choice.
    let recorder = Recorder::new(
        client,
        Reporter {
            controller: "wirerate-agent".into(),
            instance: Some(agent),
        },
    );
    let transfer = ObjectReference {
        api_version: Some(Transfer::api_version(&()).into_owned()),
        kind: Some(Transfer::kind(&()).into_owned()),
        namespace: Some(ns.clone()),
        name: Some(name.clone()),
        uid: Some(uid),
        ..ObjectReference::default()
    };
    let ev = Event {
        type_: EventType::Normal,
        reason: reason.into(),
        note: Some(note),
        action: "Tune".into(),
        secondary: None,
    };
    for _ in 0..tries {
        match tokio::time::timeout(api::CALL_TIMEOUT, recorder.publish(&ev, &transfer)).await {
            Ok(Ok(())) => return,
            Ok(Err(e)) => tracing::warn!(transfer = name, error = %e, "cannot publish an event"),
            Err(_) => tracing::warn!(
                transfer = name,
                "cannot publish an event: no answer in time"
            ),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The pool's allowed roots, each with whether the pool may write there (not
/// beneath a read-only volume).
fn roots(pool: &DtnPool) -> Vec<(String, bool)> {
    pool.spec
        .allowed_roots
        .iter()
        .map(|r| {
            let read_only = pool.spec.volumes.iter().any(|v| {
                let mount = v.mount_path.trim_end_matches('/');
                v.read_only && (r == mount || r.starts_with(&format!("{mount}/")))
            });
            (r.clone(), !read_only)
        })
        .collect()
}

/// What this agent says of itself in its Lease (the Lease task stamps the
/// renewal time).
fn lease_info(
    cfg: &RunConfig,
    pool: &DtnPool,
    active: usize,
    tester: &path_tests::PathTester,
) -> AgentLease {
    let interface = std::env::var(contract::ENV_INTERFACE).ok();
    let mut findings = host::preflight(
        &pool.spec.preflight,
        pool.spec.mtu,
        &host::Readings::read(interface.as_deref()),
    );
    findings.extend(storage::probe_cached(&roots(pool), &cfg.agent));
    // The pool asked for huge pages: say if a default-sized buffer pool
    // would not get them (the transfer still runs, on normal pages).
    if std::env::var_os(wirerate_engine::io::hugepages::ENV).is_some()
        && let wirerate_engine::io::hugepages::Backing::Normal { why: Some(why) } =
            wirerate_engine::io::hugepages::decide(
                &wirerate_engine::io::hugepages::offer(),
                wirerate_engine::Settings::default().buffer as usize,
            )
    {
        findings.push(("hugepages".to_owned(), why));
    }
    let (io_mode, io_why) = host::io_mode(
        pool.spec.tuning.io_mode.unwrap_or_default(),
        &wirerate_engine::io::caps::capabilities().io_uring,
    );
    if let Some(why) = &io_why {
        findings.push((contract::PREFLIGHT_IO_URING.to_owned(), why.clone()));
    }
    findings.extend(tester.finding());
    AgentLease {
        address: Some(format!("{}:{}", cfg.advertise, cfg.data_port)),
        node: Some(cfg.node.clone()),
        capacity: Some(cfg.max_transfers.into()),
        active: Some(i32::try_from(active).unwrap_or(i32::MAX)),
        pod: cfg.in_pod.then(|| cfg.agent.clone()),
        preflight: findings,
        io_mode: Some(io_mode),
        io_mode_reason: io_why,
        path_test_address: tester.listener_address(&cfg.advertise),
        path_tests: tester.records(),
    }
}

#[cfg(test)]
mod tests {
    use super::{
        MIRROR_GRACE, MirrorWait, Position, ReportState, awaits_mirror, receiver_verdict, shown,
    };
    use std::time::Duration;
    use wirerate_engine::summary::ReceiverSummary;

    fn at(total: u64, done: u64) -> Position {
        Position {
            total,
            done,
            ..Position::default()
        }
    }

    #[test]
    fn a_new_attempt_shows_the_last_progress_until_it_knows_its_own() {
        // Attempt 2 before it has listed the source: attempt 1's 55% stands.
        assert_eq!(shown(at(0, 0), (550, 1000)), (1000, 550));
        // Listed, with the resumed bytes counted: its own figures from now on.
        assert_eq!(shown(at(1000, 520), (550, 1000)), (1000, 520));
        // A first attempt has nothing to carry: 0 of an unknown total.
        assert_eq!(shown(at(0, 0), (0, 0)), (0, 0));
    }

    fn summary(dry_run: bool, files_ok: u64, files_present: u64) -> ReceiverSummary {
        ReceiverSummary {
            session: "0123456789abcdef".into(),
            outcome: wirerate_engine::summary::SessionOutcome::Complete,
            bytes_written: 0,
            bytes_skipped_resume: 0,
            seconds: 1.0,
            gbps: 0.0,
            io: wirerate_engine::summary::IoInEffect {
                io_mode: wirerate_engine::io::IoMode::Async,
                io_fallback: None,
                hugepages: false,
                buffer_pages: "none".into(),
            },
            streams: 0,
            requested_streams: 1,
            blocks_rejected: 0,
            files_ok,
            files_failed: 0,
            files_present,
            memory_to_memory: false,
            dry_run,
            warnings: Vec::new(),
        }
    }

    // A receiver job whose Transfer mirrors does not end on its files'
    // verdict: the sender's mirror connects after its last session, and
    // found the job gone (a stopped receiver refuses it).
    #[test]
    fn a_receiver_job_waits_for_its_mirror_within_the_grace() {
        let s = Duration::from_secs;
        assert!(
            !awaits_mirror(&mut MirrorWait::None, 0, s(5)),
            "no mirror: no wait"
        );
        let mut m = MirrorWait::Pending;
        assert!(awaits_mirror(&mut m, 0, s(5)));
        assert!(awaits_mirror(&mut m, 0, s(5) + MIRROR_GRACE - s(1)));
        assert!(!awaits_mirror(&mut m, 1, s(6)), "served");
        assert!(!awaits_mirror(&mut m, 0, s(5) + MIRROR_GRACE), "given up");
    }

    // A dry run against a running job's receiver (anyone with its token
    // may plan) once ended the job as succeeded, having written nothing.
    #[test]
    fn a_dry_runs_session_is_no_verdict_of_the_job() {
        let dest = std::path::Path::new("/data/in");
        let dry = summary(true, 0, 3);
        assert_eq!(
            receiver_verdict(std::slice::from_ref(&dry), at(0, 0), dest),
            None
        );
        let (state, msg, _) =
            receiver_verdict(&[dry, summary(false, 2, 1)], at(10, 10), dest).unwrap();
        assert_eq!(state, ReportState::Succeeded);
        assert!(msg.starts_with("2 file(s) verified"), "{msg}");
        assert!(msg.ends_with("; 1 already there, not sent (sync)"), "{msg}");
    }
}

#[cfg(test)]
mod start_tests {
    use std::time::Duration;

    use super::{RunError, api};

    // issue 35: the agent's errors from the API server were flattened
    // into Config(String) at start; now typed, with whether a restart may
    // help.
    #[test]
    fn start_errors_keep_the_api_answer_and_say_whether_to_retry() {
        let unreadable = |last| RunError::PoolUnreadable {
            namespace: "research-data".into(),
            pool: "center".into(),
            last,
        };
        let late = unreadable(api::ApiError::TimedOut(Duration::from_secs(10)));
        assert!(late.transient());
        let text = late.to_string();
        assert!(
            text.contains("DtnPool research-data/center after 120s"),
            "{text}"
        );
        assert!(text.contains("no answer from the API server"), "{text}");
        // Printed with its causes (as main does), the answer appears once.
        let chained = format!("{:#}", anyhow::Error::from(late));
        assert_eq!(
            chained.matches("no answer from the API server").count(),
            1,
            "{chained}"
        );
        let status = |code: u16| {
            let mut s = kube::core::Status::failure("dtnpools \"center\" not found", "NotFound");
            s.code = code;
            api::ApiError::Kube(kube::Error::Api(Box::new(s)))
        };
        let missing = unreadable(status(404));
        assert!(!missing.transient());
        assert!(missing.to_string().contains("404"), "{missing}");
        assert!(unreadable(status(503)).transient());
        assert!(!unreadable(status(403)).transient());
    }
}
