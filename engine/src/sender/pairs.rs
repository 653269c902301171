//! One transfer from this sender to several receivers that share one
//! root (`send --to a,b,c`): the shell of `stripes::Coordinator`.
//!
//! Each receiver is one pair's far end, driven by a lane: a thread that
//! runs one session per item of work the coordinator hands its pair,
//! writing that item's pieces into the temporary files all receivers
//! share (`Frame::Stripe`), over the lane's parked connections
//! (`sender::warm`). The first session creates the shared-storage marker
//! and every later one on any receiver must find it. A lane whose
//! receiver stays unreachable for `PAIR_PATIENCE`, or refuses every
//! connection for `REFUSED_PATIENCE`, is lost: its unfinished
//! pieces go to the others at once, and the transfer goes on without a
//! restart. It is fenced (no file it could still write to is checked)
//! only once its last running session has answered; a publish it was
//! running is handed on only if that publish fails, so no file is ever
//! published by two receivers at once.
//! Each file is verified once from its block checksums and published by
//! one receiver, once every piece of it is durable.
//!
//! A steal takes only items still queued on a lane: a running session is
//! not cut short (`Coordinator::started`, told by the driving thread as
//! it hands the item to a worker, so a steal never crosses a start).
//! The coordinator's ledger lives in this process; what survives a crash
//! of it is on the receivers' side: each records the pieces it landed
//! beside the shared temporary file (`receiver::pieces`), so a new `send`
//! resends only the pieces not recorded there.
//!
//! Receivers may join a running transfer (`Joins`): a lost pair's
//! replacement, or a receiver whose job came back on another port. Each
//! gets a lane of its own and takes work not yet started, like a pair
//! that ran dry; nothing restarts.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fs::File;
use std::os::fd::OwnedFd;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use super::source::{SourceFile, SourceList, Stamp};
use super::{RunState, SendConfig, warm::Warm};
use crate::digest::{fmt_digest, tree_digest};
use crate::error::{Error, Result};
use crate::progress::{PairShown, Progress};
use crate::session::FileVerdict;
use crate::stripes::{Action, Coordinator, Geometry, ItemId, PairId, PairState, Piece, Verified};
use crate::wire::{EntryKind, Stripe, StripePiece, StripeRole};

/// How long a pair's receiver may stay unreachable before the pair is
/// lost and its work goes to the others: long enough that a network blip
/// of a few seconds, which may take every pair at once, and a transfer
/// with them, is ridden out. One whose packets vanish is found by its
/// Lease or the data streams' keepalive instead, later.
pub const PAIR_PATIENCE: Duration = Duration::from_secs(8);
/// How long a pair's receiver may refuse every connection before the
/// pair is lost, while other pairs run: nothing listens where it was, its
/// process is gone, which a blip does not usually look like (its
/// connections time out, or get through; only a firewall that rejects
/// them refuses). Short, so that the operator shows the loss well within
/// 10 s of the kill (the agent reports a pair lost within 1 s).
pub const REFUSED_PATIENCE: Duration = Duration::from_secs(3);
/// How long after a pair to a receiver was lost the same receiver may
/// join again: whoever tells of joins (the agent, from the Transfer's
/// status) may still list it for a moment after its loss, and a lane
/// opened to it then would take work only to fail it after
/// `PAIR_PATIENCE` (or `REFUSED_PATIENCE`). Shorter than the operator's
/// back-off on a lost agent (30 s), so that an agent placed again is
/// taken in.
const REJOIN_AFTER: Duration = Duration::from_secs(15);
/// A lost lane's fence while a session of it still runs: in effect none,
/// for the session's answer fences the lane, and a lost lane's sessions
/// are cancelled, so each answers within a keepalive interval (unless
/// its thread is stuck in the kernel, reading a hung source disk).
const UNTIL_ANSWERED: Duration = Duration::from_secs(24 * 3600);
/// Most receivers of one transfer.
pub const MAX_RECEIVERS: usize = crate::stripes::MAX_PAIRS;
/// Sessions one file's pieces may fail before the file is given up.
const MAX_PIECE_FAILURES: u32 = 3;
/// Sessions a lane runs at once: the next item's session opens while the
/// last one's final blocks and results are still on their way, so the
/// link does not idle for a session's round trips between items.
const SESSIONS_PER_LANE: usize = 2;
/// Items a pair holds at once: one per session, and one queued behind
/// them that a steal may still cut.
const WINDOW: usize = SESSIONS_PER_LANE + 1;
/// Blocks a chunk holds per data stream, at least: a block goes out on
/// one stream, so a chunk of fewer blocks than streams leaves streams
/// idle (and under --max-rate, each paced to its share, runs slow).
const MIN_BLOCKS_PER_STREAM: u64 = 2;
/// The largest.
const MAX_CHUNK: u64 = 1 << 30;
/// Chunks per pair, about, for a transfer of one large file: enough that
/// the pairs finish close together.
const CHUNKS_PER_PAIR: u64 = 8;

/// One pair as the summary shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PairSummary {
    /// The receiver.
    pub to: String,
    /// `running` (finished with it), `lost` or `gone`.
    pub state: String,
    /// Bytes it made durable first.
    pub bytes: u64,
    /// Payload bytes it put on the wire, resends included: a session that
    /// fails may have sent some of its blocks twice, on a stream that
    /// died and again on another.
    pub bytes_sent: u64,
    /// Its rate from its first item to the end, Gbit/s.
    pub gbps: f64,
    /// Items (chunks or bundles of files) it finished.
    pub chunks_done: u64,
    /// Why it was lost.
    pub error: Option<String>,
    /// Seconds from the start of the transfer until it was given up as
    /// lost and its work went to the others.
    pub lost_after_s: Option<f64>,
}

/// What a transfer over several pairs did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PairsSummary {
    /// Every file published.
    pub ok: bool,
    /// Bytes of the transfer's files.
    pub bytes_total: u64,
    /// Payload bytes put on the wire, over every pair, resends included.
    pub bytes_sent: u64,
    /// Bytes of pieces that landed which the receivers already held (their
    /// per-chunk checkpoints: from an earlier run, or written by a pair
    /// lost before it answered), read and checked here but not sent.
    pub bytes_resumed: u64,
    /// Wall time, first connect to the last publish.
    pub seconds: f64,
    /// `bytes_total` over `seconds`, Gbit/s.
    pub gbps: f64,
    /// The split: chunk size in bytes.
    pub chunk_bytes: u64,
    /// Block size in bytes.
    pub block_size: u64,
    /// Data streams per pair.
    pub streams_per_pair: u16,
    /// Each pair.
    pub pairs: Vec<PairSummary>,
    /// Regular files, and those published.
    pub files: usize,
    /// Regular files verified and published.
    pub files_ok: usize,
    /// Files that failed, with why.
    pub failures: Vec<(String, String)>,
    /// The file's digest for one file, the tree digest for several: the
    /// same a transfer over one pair reports.
    pub digest: String,
}

impl PairsSummary {
    /// The human-readable summary.
    pub fn render(&self) -> String {
        use crate::units::fmt_bytes;
        let mut s = format!(
            "transfer over {} pairs {}\n",
            self.pairs.len(),
            if self.ok {
                "complete and verified"
            } else {
                "FAILED"
            }
        );
        s.push_str(&format!(
            "  bytes      {} total, {} sent, {} resumed\n  time       {:.2} s\n  rate       {:.2} Gbit/s\n",
            fmt_bytes(self.bytes_total),
            fmt_bytes(self.bytes_sent),
            fmt_bytes(self.bytes_resumed),
            self.seconds,
            self.gbps
        ));
        s.push_str(&format!(
            "  split      chunks of {}, blocks of {}, {} streams a pair\n",
            fmt_bytes(self.chunk_bytes),
            fmt_bytes(self.block_size),
            self.streams_per_pair
        ));
        for p in &self.pairs {
            s.push_str(&format!(
                "  pair       {} {}: {} first-written, {} sent, {:.2} Gbit/s, {} chunks{}\n",
                p.to,
                p.state,
                fmt_bytes(p.bytes),
                fmt_bytes(p.bytes_sent),
                p.gbps,
                p.chunks_done,
                match (&p.error, p.lost_after_s) {
                    (Some(e), Some(t)) => format!(", lost after {t:.1} s ({e})"),
                    _ => String::new(),
                }
            ));
        }
        s.push_str(&format!(
            "  files      {} of {} published\n  digest     {}\n",
            self.files_ok, self.files, self.digest
        ));
        for (path, why) in &self.failures {
            s.push_str(&format!("  failed     {path}: {why}\n"));
        }
        s
    }
}

#[derive(Clone)]
enum Job {
    Item(ItemId, Vec<Piece>),
    Publish(PublishId, Vec<u32>),
    Unmark,
}

impl Job {
    /// The answer of a session of this job that ended in `e`.
    fn failed(self, pair: PairId, e: Error) -> Event {
        match self {
            Self::Item(item, pieces) => Event::Item {
                pair,
                item,
                pieces,
                st: RunState::default(),
                run: Err(e),
            },
            Self::Publish(id, files) => Event::Published {
                pair,
                id,
                files,
                st: RunState::default(),
                run: Err(e),
            },
            Self::Unmark => Event::Unmarked,
        }
    }
}

/// One publish job: the same files may be handed out again after a lane
/// is lost, so a job is known by its id, not by its files.
type PublishId = u64;

enum Event {
    Item {
        pair: PairId,
        item: ItemId,
        pieces: Vec<Piece>,
        st: RunState,
        run: Result<()>,
    },
    Published {
        pair: PairId,
        id: PublishId,
        files: Vec<u32>,
        st: RunState,
        run: Result<()>,
    },
    Unmarked,
    /// A worker of `pair`'s lane waits for its next job on `reply` (`None`:
    /// stop).
    Idle {
        pair: PairId,
        reply: mpsc::Sender<Option<Job>>,
    },
}

/// Receivers that join a running transfer over several pairs, told by
/// whoever learns of them (clones share one list), taken in by the
/// driving thread within a tick. Telling of a receiver the transfer
/// already sends to changes nothing, so they may be told again and again.
#[derive(Clone, Debug, Default)]
pub struct Joins(Arc<Mutex<Vec<String>>>);

impl Joins {
    /// Tells of a receiver, `host:port`, that shares the others' root.
    pub fn add(&self, to: &str) {
        let mut v = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if !v.iter().any(|t| t == to) && v.len() < MAX_RECEIVERS {
            v.push(to.to_string());
        }
    }

    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// One receiver, as its lane's workers see it.
struct Lane {
    to: String,
    progress: Arc<Progress>,
    /// Set when the lane is lost or the transfer ends in failure: its
    /// running sessions end within a keepalive interval, so that a lost
    /// lane stops writing soon and a failed transfer returns soon.
    cancel: Arc<AtomicBool>,
}

impl Lane {
    fn new(to: &str) -> Self {
        Self {
            to: to.to_string(),
            progress: Arc::default(),
            cancel: Arc::default(),
        }
    }
}

/// The transfer's fixed parts: what every lane's sessions share.
struct Plan<'a> {
    cfg: &'a SendConfig,
    list: &'a SourceList,
    group: u64,
    /// Pairs not lost: the transfer's rate cap is shared among them. Kept
    /// by the driving thread as receivers join and pairs are lost.
    pairs: AtomicUsize,
}

impl Plan<'_> {
    /// The config of one session to `to` in `role`, writing `pieces`.
    fn session(&self, lane: &Lane, warm: &Arc<Warm>, stripe: Stripe) -> SendConfig {
        let mut cfg = self.cfg.clone();
        cfg.to = lane.to.clone();
        cfg.retry_for = self.cfg.retry_for.min(PAIR_PATIENCE);
        // Not for the last pair: losing it fails the transfer, and an
        // agent restarted on its host comes back on the same address after
        // a few seconds of refusals, which `PAIR_PATIENCE` rides out.
        cfg.refused_for =
            (self.pairs.load(Ordering::Relaxed) > 1).then(|| REFUSED_PATIENCE.min(cfg.retry_for));
        cfg.progress = Arc::clone(&lane.progress);
        // Only writing sessions are cut short: a publish cut between its
        // renames and its answers would leave landed files unanswered,
        // and handed on, they would fail where no temporary file is left.
        cfg.cancel = (stripe.role == StripeRole::Write).then(|| Arc::clone(&lane.cancel));
        cfg.warm = Some(Arc::clone(warm));
        cfg.stripe = Some(stripe);
        // The cap is the transfer's: each session paces its own streams,
        // so it gets its share of every session that may run at once
        // (without this, N pairs ran at up to 2N times --max-rate). A
        // session keeps the share it started with: when a pair joins, the
        // cap is exceeded by at most the sessions already running.
        let pairs = self.pairs.load(Ordering::Relaxed);
        let sessions = (pairs.max(1) * SESSIONS_PER_LANE) as u64;
        cfg.max_rate = self.cfg.max_rate.map(|r| (r / sessions).max(1));
        cfg
    }

    /// The sub-list of `ids` (listing indices), and each one's index in it.
    fn subset(&self, ids: &[u32]) -> SourceList {
        SourceList {
            files: ids
                .iter()
                .map(|&i| self.list.files[i as usize].clone())
                .collect(),
            skipped: Vec::new(),
            base: Arc::clone(&self.list.base),
        }
    }

    /// Runs `job` on `lane`: one session, retried within the pair's patience.
    fn run(&self, pair: PairId, lane: &Lane, warm: &Arc<Warm>, job: Job) -> Event {
        let stripe = |role, pieces| Stripe {
            group: self.group,
            role,
            pieces,
        };
        match job {
            Job::Item(item, pieces) => {
                let ids: Vec<u32> = pieces.iter().map(|p| p.file).collect();
                let wire = pieces
                    .iter()
                    .enumerate()
                    .map(|(i, p)| StripePiece {
                        file_id: i as u32,
                        first: p.first,
                        end: p.end,
                    })
                    .collect();
                let cfg = self.session(lane, warm, stripe(StripeRole::Write, wire));
                let (st, run) = super::send_list(&cfg, &self.subset(&ids));
                Event::Item {
                    pair,
                    item,
                    pieces,
                    st,
                    run,
                }
            }
            Job::Publish(id, files) => {
                let cfg = self.session(lane, warm, stripe(StripeRole::Publish, Vec::new()));
                let (st, run) = super::send_list(&cfg, &self.subset(&files));
                Event::Published {
                    pair,
                    id,
                    files,
                    st,
                    run,
                }
            }
            Job::Unmark => {
                let cfg = self.session(lane, warm, stripe(StripeRole::Unmark, Vec::new()));
                let _ = super::send_list(&cfg, &self.subset(&[]));
                Event::Unmarked
            }
        }
    }
}

/// Sends `cfg.source` to the receivers `to`, which share one root, as one
/// transfer over as many pairs.
pub fn send_over_pairs(cfg: &SendConfig, to: &[String]) -> Result<PairsSummary> {
    check_receivers(cfg, to, 2)?;
    send_over_pairs_joined(cfg, to, &Joins::default(), to.len())
}

/// As `send_over_pairs`, from one receiver at least, taking in the
/// receivers told of in `joins` while it runs; the work is cut for `most`
/// pairs, so that those that join find some not yet started.
pub fn send_over_pairs_joined(
    cfg: &SendConfig,
    to: &[String],
    joins: &Joins,
    most: usize,
) -> Result<PairsSummary> {
    cfg.validate()?;
    check_receivers(cfg, to, 1)?;
    let list = super::source::scan(&cfg.source, &cfg.dest)?;
    let files: Vec<(u32, u64)> = list
        .files
        .iter()
        .enumerate()
        .filter(|(_, f)| f.kind == EntryKind::File)
        .map(|(i, f)| (i as u32, f.size))
        .collect();
    let total: u64 = files.iter().map(|f| f.1).sum();
    cfg.progress.sized(total);
    let most = most.clamp(to.len(), MAX_RECEIVERS);
    let chunk = chunk_bytes(total, most, cfg.block_size, cfg.streams);
    cfg.progress.split(chunk, cfg.streams);
    let geometry =
        Geometry::new(cfg.block_size, chunk, None).map_err(|e| Error::Config(e.to_string()))?;
    let plan = Plan {
        cfg,
        list: &list,
        group: u64::from_le_bytes(crate::net::auth::random()),
        pairs: AtomicUsize::new(to.len()),
    };
    let lanes: Vec<Arc<Lane>> = to.iter().map(|t| Arc::new(Lane::new(t))).collect();
    let start = Instant::now();
    mark(&plan, &lanes)?;
    let mut run = Run::new(
        &plan,
        Coordinator::new(geometry, &files, WINDOW),
        lanes,
        start,
    );
    let outcome = std::thread::scope(|s| {
        let (tx, rx) = mpsc::channel();
        // A lane's workers: one pool of parked connections and buffers
        // per receiver, shared by its lane's sessions.
        let spawn = |pair: PairId, lane: Arc<Lane>| {
            let warm = Arc::new(Warm::default());
            for _ in 0..SESSIONS_PER_LANE {
                let (tx, plan, warm, lane) =
                    (tx.clone(), &plan, Arc::clone(&warm), Arc::clone(&lane));
                s.spawn(move || work_lane(plan, pair, &lane, &warm, &tx));
            }
        };
        for (i, lane) in run.lanes.iter().enumerate() {
            spawn(i as PairId, Arc::clone(lane));
        }
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| run.drive(&rx, joins, &spawn)));
        // Idle workers stop now; busy ones, cancelled after a failure,
        // when their session ends and finds no one to report to. (Also
        // after a panic, or the scope would wait for them for ever.)
        run.idle.clear();
        if !matches!(outcome, Ok(Ok(()))) {
            for lane in &run.lanes {
                lane.cancel.store(true, Ordering::Relaxed);
            }
        }
        drop(rx);
        outcome.unwrap_or_else(|p| std::panic::resume_unwind(p))
    });
    let seconds = start.elapsed().as_secs_f64();
    outcome?;
    // The pairs as the summary has them: none is running any more.
    run.show_pairs("finished");
    Ok(run.summary(geometry, seconds))
}

/// One of a lane's workers: asks the driving thread for a job, runs it,
/// and reports, until it is told to stop or a job fails (the lane is then
/// lost).
fn work_lane(
    plan: &Plan<'_>,
    pair: PairId,
    lane: &Lane,
    warm: &Arc<Warm>,
    tx: &mpsc::Sender<Event>,
) {
    loop {
        // A channel per request: the driving thread holds its only
        // sender, so dropping that stops the worker.
        let (reply, job) = mpsc::channel();
        if tx.send(Event::Idle { pair, reply }).is_err() {
            return;
        }
        let Ok(Some(job)) = job.recv() else {
            return;
        };
        // A session that panics is a bug, and fails the transfer with
        // that said; it must not leave the driving thread waiting.
        let again = job.clone();
        let event = std::panic::catch_unwind(AssertUnwindSafe(|| plan.run(pair, lane, warm, job)))
            .unwrap_or_else(|_| {
                again.failed(
                    pair,
                    Error::Internal("a session to this receiver panicked".into()),
                )
            });
        let failed = matches!(
            &event,
            Event::Item { run: Err(_), .. } | Event::Published { run: Err(_), .. }
        );
        if tx.send(event).is_err() || failed {
            return;
        }
    }
}

/// Refuses a list of receivers that cannot make a transfer: fewer than
/// `least`, too many, or one named twice.
fn check_receivers(cfg: &SendConfig, to: &[String], least: usize) -> Result<()> {
    if to.len() < least || to.len() > MAX_RECEIVERS {
        return Err(Error::Config(format!(
            "--to names {} receivers; a transfer over several pairs takes {least} to {MAX_RECEIVERS}",
            to.len()
        )));
    }
    let mut seen = std::collections::HashSet::new();
    if let Some(dup) = to.iter().find(|t| !seen.insert(t.as_str())) {
        return Err(Error::Config(format!(
            "--to names {dup} twice; name each receiver once"
        )));
    }
    if cfg.synthetic.is_some() {
        return Err(Error::Config(
            "a memory-to-memory test (--synthetic) runs on one pair: give --to one receiver".into(),
        ));
    }
    Ok(())
}

/// About `CHUNKS_PER_PAIR` chunks a pair, each enough blocks to keep a
/// pair's `streams` busy, and at most `MAX_CHUNK` where that allows.
fn chunk_bytes(total: u64, pairs: usize, block_size: u64, streams: u16) -> u64 {
    let least = block_size * u64::from(streams) * MIN_BLOCKS_PER_STREAM;
    (total / (pairs as u64 * CHUNKS_PER_PAIR).max(1))
        .min(MAX_CHUNK)
        .max(least)
}

/// Creates the transfer's directories and its shared-storage marker
/// through the first receiver that answers.
fn mark(plan: &Plan<'_>, lanes: &[Arc<Lane>]) -> Result<()> {
    let dirs: Vec<u32> = plan
        .list
        .files
        .iter()
        .enumerate()
        .filter(|(_, f)| f.kind == EntryKind::Dir)
        .map(|(i, _)| i as u32)
        .collect();
    let mut last = None;
    for lane in lanes {
        let stripe = Stripe {
            group: plan.group,
            role: StripeRole::Mark,
            pieces: Vec::new(),
        };
        let cfg = plan.session(lane, &Arc::new(Warm::default()), stripe);
        match super::send_list(&cfg, &plan.subset(&dirs)) {
            (st, Ok(())) => return refused_entries(plan, &dirs, &st),
            (_, Err(e)) if e.is_retryable() || matches!(e, Error::GaveUp { .. }) => last = Some(e),
            (_, Err(e)) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| Error::Internal("no receiver to start on".into())))
}

/// The first entry of `ids` a session refused, as an error.
fn refused_entries(plan: &Plan<'_>, ids: &[u32], st: &RunState) -> Result<()> {
    for (i, v) in &st.verdicts {
        if let FileVerdict::Failed(why) = v {
            let path = &plan.list.files[ids[*i as usize] as usize].dest;
            return Err(Error::Config(format!("{path}: {why}")));
        }
    }
    Ok(())
}

/// What a pair in `state` is called, `working` the word for a pair that
/// takes work (or, at the end, took it to the end).
fn state_name(state: PairState, working: &'static str) -> &'static str {
    match state {
        PairState::Running => working,
        PairState::Leaving if working == "finished" => working,
        PairState::Leaving => "leaving",
        PairState::Lost => "lost",
        PairState::Gone => "gone",
    }
}

/// Whether `f` is still the file that was listed.
fn unchanged(base: &OwnedFd, f: &SourceFile) -> bool {
    use rustix::fs::{Mode, OFlags};
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let Ok(fd) = rustix::fs::openat(base, &f.rel, flags, Mode::empty()) else {
        return false;
    };
    File::from(fd)
        .metadata()
        .is_ok_and(|m| f.stamp.change_to(&Stamp::of(&m)).is_none())
}

/// The run's state in the driving thread.
struct Run<'a> {
    plan: &'a Plan<'a>,
    coord: Coordinator,
    /// Each pair's lane, by pair id: the first `plan.pairs`, then those
    /// that joined.
    lanes: Vec<Arc<Lane>>,
    /// Lost pairs: why, and when.
    lost: BTreeMap<PairId, (String, Instant)>,
    started_at: Instant,
    /// Each lane's jobs not yet handed to a worker. Only the driving
    /// thread touches them: it hands each job to an idle worker and, for
    /// an item, tells the coordinator it started in the same step, so
    /// that no steal can cut an item a worker already runs.
    queues: Vec<VecDeque<Job>>,
    /// Workers waiting for a job.
    idle: Vec<(PairId, mpsc::Sender<Option<Job>>)>,
    /// Each lane's item sessions running: a lost lane still writes until
    /// its last one has answered.
    writing: Vec<usize>,
    /// Publish jobs not yet answered.
    publishing: BTreeSet<PublishId>,
    next_publish: PublishId,
    /// Sessions each file's pieces failed in.
    failures: HashMap<u32, u32>,
    failed: BTreeMap<u32, String>,
    published: BTreeMap<u32, u128>,
    digests: HashMap<u32, u128>,
    bytes_sent: BTreeMap<PairId, u64>,
    /// What the pieces that landed already held (`PairsSummary`).
    bytes_resumed: u64,
    unmarking: bool,
    /// Lanes the transfer started with; those after joined it.
    initial: usize,
    /// Whether a lane that joined already failed with what retrying
    /// cannot fix: a second such failure is the transfer's, not a lane's.
    joined_refused: bool,
}

impl<'a> Run<'a> {
    fn new(
        plan: &'a Plan<'a>,
        coord: Coordinator,
        lanes: Vec<Arc<Lane>>,
        started_at: Instant,
    ) -> Self {
        Self {
            plan,
            coord,
            queues: lanes.iter().map(|_| VecDeque::new()).collect(),
            writing: vec![0; lanes.len()],
            initial: lanes.len(),
            joined_refused: false,
            lanes,
            lost: BTreeMap::new(),
            started_at,
            idle: Vec::new(),
            publishing: BTreeSet::new(),
            next_publish: 0,
            failures: HashMap::new(),
            failed: BTreeMap::new(),
            published: BTreeMap::new(),
            digests: HashMap::new(),
            bytes_sent: BTreeMap::new(),
            bytes_resumed: 0,
            unmarking: false,
        }
    }

    /// Feeds the lanes' events to the coordinator and carries out its
    /// actions until every file is published or given up.
    fn drive(
        &mut self,
        rx: &mpsc::Receiver<Event>,
        joins: &Joins,
        spawn: &dyn Fn(PairId, Arc<Lane>),
    ) -> Result<()> {
        let now = Instant::now();
        for pair in 0..self.lanes.len() as PairId {
            self.coord
                .join(now, pair)
                .map_err(|e| Error::Internal(e.to_string()))?;
        }
        loop {
            for to in joins.take() {
                if let Some(lane) = self.join(Instant::now(), &to) {
                    spawn(self.lanes.len() as PairId - 1, lane);
                }
            }
            self.act()?;
            self.dispatch();
            if self.coord.is_finished() && self.publishing.is_empty() {
                return self.unmark(rx);
            }
            if self.coord.waiting_for_pairs() || self.lost.len() == self.lanes.len() {
                return Err(self.all_lost());
            }
            if let Some(c) = &self.plan.cfg.cancel
                && c.load(Ordering::Relaxed)
            {
                return Err(Error::Cancelled {
                    last: Box::new(Error::Config("stopped with files left to send".into())),
                });
            }
            self.show_progress();
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(event) => self.handle(event)?,
                Err(mpsc::RecvTimeoutError::Timeout) => self.coord.tick(Instant::now()),
                Err(mpsc::RecvTimeoutError::Disconnected) => return Err(self.all_lost()),
            }
        }
    }

    /// Opens a lane to `to`, a receiver that joins, unless a live lane
    /// goes there or one was lost there within `REJOIN_AFTER`; gives the
    /// lane opened, whose workers are the caller's to start.
    fn join(&mut self, now: Instant, to: &str) -> Option<Arc<Lane>> {
        let taken = self.lanes.iter().enumerate().any(|(i, l)| {
            l.to == to
                && self
                    .lost
                    .get(&(i as PairId))
                    .is_none_or(|(_, at)| now.duration_since(*at) < REJOIN_AFTER)
        });
        if taken || self.coord.is_finished() {
            return None;
        }
        let pair = self.lanes.len() as PairId;
        if let Err(e) = self.coord.join(now, pair) {
            tracing::warn!(receiver = %to, "a receiver cannot join: {e}");
            return None;
        }
        tracing::info!(receiver = %to, "a receiver joined; it takes work not yet started");
        self.plan.pairs.fetch_add(1, Ordering::Relaxed);
        let lane = Arc::new(Lane::new(to));
        self.lanes.push(Arc::clone(&lane));
        self.queues.push(VecDeque::new());
        self.writing.push(0);
        Some(lane)
    }

    /// Hands queued jobs to idle workers of live lanes; an item is told
    /// to the coordinator as started in the same step.
    fn dispatch(&mut self) {
        let mut waiting = Vec::with_capacity(self.idle.len());
        for (pair, reply) in std::mem::take(&mut self.idle) {
            if self.lost.contains_key(&pair) {
                let _ = reply.send(None);
                continue;
            }
            let Some(job) = self.queues[pair as usize].pop_front() else {
                waiting.push((pair, reply));
                continue;
            };
            let item = match &job {
                Job::Item(item, _) => Some(*item),
                _ => None,
            };
            if let Err(mpsc::SendError(Some(job))) = reply.send(Some(job)) {
                // The worker is gone: the job goes back for another.
                self.queues[pair as usize].push_front(job);
            } else if let Some(item) = item {
                // Refused only for a pair lost meanwhile, checked above.
                let _ = self.coord.started(pair, item);
                self.writing[pair as usize] += 1;
            }
        }
        self.idle = waiting;
    }

    fn all_lost(&self) -> Error {
        let why: Vec<String> = self
            .lost
            .iter()
            .map(|(p, (e, _))| format!("{}: {e}", self.lanes[*p as usize].to))
            .collect();
        Error::Config(format!(
            "every receiver of the transfer was lost, with files left to send ({})",
            why.join("; ")
        ))
    }

    fn show_progress(&self) {
        let (done, _) = self.coord.progress();
        let moved = self.lanes.iter().map(|l| l.progress.position().moved).sum();
        self.plan.cfg.progress.set(done, moved);
        self.show_pairs("running");
    }

    /// Shows each pair, `working` the word for one that takes work (or
    /// took it to the end).
    fn show_pairs(&self, working: &'static str) {
        let pairs = self
            .coord
            .pair_views(Instant::now())
            .iter()
            .map(|(id, v)| PairShown {
                to: self.lanes[*id as usize].to.clone(),
                state: state_name(v.state, working),
                bytes: v.bytes,
                rate_bps: v.rate as u64,
                chunks_done: v.chunks_done,
            })
            .collect();
        self.plan.cfg.progress.set_pairs(pairs);
    }

    /// Carries out what the coordinator asks.
    fn act(&mut self) -> Result<()> {
        let mut publish = Vec::new();
        while let Some(action) = self.coord.poll() {
            match action {
                Action::Assign { pair, item, work } => {
                    self.queues[pair as usize].push_back(Job::Item(item, hull(&work)));
                }
                Action::Withdraw { pair, item, keep } => self.withdraw(pair, item, keep),
                // This shell never scales a pair away.
                Action::Stop { .. } => {}
                Action::Verify { file, digest } => {
                    let f = &self.plan.list.files[file as usize];
                    let answer = if unchanged(&self.plan.list.base, f) {
                        self.digests.insert(file, digest);
                        Verified::Good
                    } else {
                        Verified::SourceChanged
                    };
                    self.coord
                        .verified(file, answer)
                        .map_err(|e| Error::Internal(e.to_string()))?;
                }
                Action::Publish { file } => publish.push(file),
                Action::GiveUp { file, why } => {
                    let message = match why {
                        crate::stripes::GiveUp::SourceChanged => {
                            "the source changed while it was sent; send it again once it is stable"
                                .to_string()
                        }
                        crate::stripes::GiveUp::Mismatch => {
                            "the written file does not match its checksums".to_string()
                        }
                        crate::stripes::GiveUp::Failed => "its pieces failed".to_string(),
                    };
                    self.failed.entry(file).or_insert(message);
                }
                Action::Finished => {}
            }
        }
        if !publish.is_empty() {
            self.dispatch_publish(publish)?;
        }
        Ok(())
    }

    /// A stolen item still queued on its lane keeps only `keep`; one
    /// already running finishes as it is.
    fn withdraw(&mut self, pair: PairId, item: ItemId, keep: Vec<Piece>) {
        let q = &mut self.queues[pair as usize];
        let at = q
            .iter()
            .position(|j| matches!(j, Job::Item(i, _) if *i == item));
        if let Some(at) = at {
            if keep.is_empty() {
                q.remove(at);
                let _ = self.coord.finished(Instant::now(), pair, item);
            } else {
                q[at] = Job::Item(item, hull(&keep));
            }
        }
    }

    /// Hands `files` to the live lane with the least queued.
    fn dispatch_publish(&mut self, files: Vec<u32>) -> Result<()> {
        let lane = (0..self.lanes.len() as PairId)
            .filter(|p| !self.lost.contains_key(p))
            .min_by_key(|p| self.queues[*p as usize].len())
            .ok_or_else(|| self.all_lost())?;
        let id = self.next_publish;
        self.next_publish += 1;
        self.queues[lane as usize].push_back(Job::Publish(id, files));
        self.publishing.insert(id);
        Ok(())
    }

    fn handle(&mut self, event: Event) -> Result<()> {
        let now = Instant::now();
        match event {
            Event::Item {
                pair,
                item,
                pieces,
                st,
                run,
            } => {
                self.sent(pair, &st);
                self.writing[pair as usize] = self.writing[pair as usize].saturating_sub(1);
                match run {
                    Ok(()) => self.item_done(now, pair, item, &pieces, &st)?,
                    Err(e) => self.lane_failed(now, pair, e)?,
                }
                if self.lost.contains_key(&pair) && self.writing[pair as usize] == 0 {
                    // The lost lane's last writing session has ended: it
                    // writes no more, and its files may be verified.
                    let _ = self.coord.stopped(now, pair);
                }
                Ok(())
            }
            Event::Published {
                pair,
                id,
                files,
                st,
                run,
            } => {
                self.sent(pair, &st);
                self.publishing.remove(&id);
                match run {
                    Ok(()) => {
                        self.published_files(&files, &st);
                        Ok(())
                    }
                    Err(e) => {
                        self.lane_failed(now, pair, e)?;
                        // Files it published before failing are final:
                        // handed on, the next receiver would find no
                        // temporary file and fail them.
                        let rest = self.published_ok(&files, &st);
                        if rest.is_empty() {
                            return Ok(());
                        }
                        self.dispatch_publish(rest)
                    }
                }
            }
            Event::Idle { pair, reply } => {
                self.idle.push((pair, reply));
                Ok(())
            }
            Event::Unmarked => Ok(()),
        }
    }

    fn sent(&mut self, pair: PairId, st: &RunState) {
        *self.bytes_sent.entry(pair).or_default() += st.bytes_sent;
    }

    /// Records the files of a failed publish session that the receiver
    /// answered as published; returns the others.
    fn published_ok(&mut self, files: &[u32], st: &RunState) -> Vec<u32> {
        let mut rest = Vec::new();
        for (i, &file) in files.iter().enumerate() {
            if let Some(FileVerdict::Ok(_)) = st.verdicts.get(&(i as u32)) {
                let digest = self.digests.get(&file).copied().unwrap_or(0);
                self.published.insert(file, digest);
            } else {
                rest.push(file);
            }
        }
        rest
    }

    fn published_files(&mut self, files: &[u32], st: &RunState) {
        for (i, &file) in files.iter().enumerate() {
            match st.verdicts.get(&(i as u32)) {
                Some(FileVerdict::Ok(_)) => {
                    let digest = self.digests.get(&file).copied().unwrap_or(0);
                    self.published.insert(file, digest);
                }
                Some(FileVerdict::Failed(why)) => {
                    self.failed.insert(file, format!("not published: {why}"));
                }
                None => {
                    self.failed.insert(file, "not published".into());
                }
            }
        }
    }

    /// An item's session ended well: each piece the receiver verified and
    /// made durable is acknowledged with its block checksums.
    fn item_done(
        &mut self,
        now: Instant,
        pair: PairId,
        item: ItemId,
        pieces: &[Piece],
        st: &RunState,
    ) -> Result<()> {
        for (i, piece) in pieces.iter().enumerate() {
            let id = i as u32;
            match (st.verdicts.get(&id), st.sums.get(&id)) {
                (Some(FileVerdict::Ok(_)), Some(sums)) if piece.end as usize <= sums.len() => {
                    self.bytes_resumed += st.held_in_pieces.get(&id).copied().unwrap_or(0);
                    let sums = &sums[piece.first as usize..piece.end as usize];
                    let _ = self.coord.acked(now, pair, *piece, sums);
                }
                (Some(FileVerdict::Failed(why)), _) => self.piece_failed(now, piece.file, why),
                _ => self.piece_failed(now, piece.file, "no verdict"),
            }
        }
        // Refused by the coordinator only if the pair was fenced meanwhile.
        let _ = self.coord.finished(now, pair, item);
        Ok(())
    }

    fn piece_failed(&mut self, now: Instant, file: u32, why: &str) {
        let n = self.failures.entry(file).or_insert(0);
        *n += 1;
        tracing::warn!(file = %self.plan.list.files[file as usize].dest, attempt = *n, "a piece failed: {why}");
        if *n >= MAX_PIECE_FAILURES {
            self.failed.insert(file, why.to_string());
            let _ = self.coord.give_up(now, file);
        }
    }

    /// A lane's session failed past the pair's patience: the pair is lost
    /// (its other sessions may still write: see `writing`), unless the
    /// failure is one that retrying cannot fix anywhere, which ends the
    /// transfer. The first lane that joined and meets such a failure is
    /// lost instead: a replacement with a broken disk or a private mount
    /// must not fail a transfer the others carry (found by review). A
    /// second is taken as the transfer's (a full shared disk, say), which
    /// would otherwise lose every pair that joins, one by one, and hide
    /// why.
    fn lane_failed(&mut self, now: Instant, pair: PairId, e: Error) -> Result<()> {
        let to = &self.lanes[pair as usize].to;
        // A lost lane's sessions end cancelled, which is no news.
        let cancelled = self.lost.contains_key(&pair) && matches!(e, Error::Cancelled { .. });
        let fatal = !(cancelled || e.is_retryable() || matches!(e, Error::GaveUp { .. }));
        let first_joined = pair as usize >= self.initial && !self.joined_refused;
        if fatal && first_joined {
            self.joined_refused = true;
        } else if fatal {
            return Err(Error::Config(format!("{to}: {e}")));
        }
        // Its queued items are the coordinator's to hand out again; its
        // queued publishes are handed on here. A publish a worker runs is
        // handed on by its own answer, if that is a failure, so no file
        // is ever published by two receivers at once.
        let orphans: Vec<Vec<u32>> = std::mem::take(&mut self.queues[pair as usize])
            .into_iter()
            .filter_map(|job| match job {
                Job::Publish(id, files) => {
                    self.publishing.remove(&id);
                    Some(files)
                }
                _ => None,
            })
            .collect();
        // Its other session may fail too: the first failure is the news.
        if let std::collections::btree_map::Entry::Vacant(lost) = self.lost.entry(pair) {
            tracing::warn!(receiver = %to, error = %e, "pair lost; its work goes to the others");
            lost.insert((e.to_string(), now));
            let _ = self
                .plan
                .pairs
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
            self.lanes[pair as usize]
                .cancel
                .store(true, Ordering::Relaxed);
            // Its work goes to the others now, but a session of it that
            // still runs may still write: the pair is fenced when that
            // one answers (`handle`), not before.
            let fence = match self.writing[pair as usize] {
                0 => now,
                _ => now + UNTIL_ANSWERED,
            };
            let _ = self.coord.lost(now, pair, fence);
        }
        for files in orphans {
            self.dispatch_publish(files)?;
        }
        Ok(())
    }

    /// Removes the shared-storage marker through a live lane, and waits
    /// for it (a marker left behind harms nothing but tidiness).
    fn unmark(&mut self, rx: &mpsc::Receiver<Event>) -> Result<()> {
        if self.unmarking {
            return Ok(());
        }
        self.unmarking = true;
        let Some(lane) = (0..self.lanes.len()).find(|p| !self.lost.contains_key(&(*p as u32)))
        else {
            return Ok(());
        };
        self.queues[lane].push_back(Job::Unmark);
        self.dispatch();
        while let Ok(event) = rx.recv_timeout(PAIR_PATIENCE * 2) {
            match event {
                Event::Unmarked => break,
                Event::Idle { pair, reply } => {
                    self.idle.push((pair, reply));
                    self.dispatch();
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn summary(&self, geometry: Geometry, seconds: f64) -> PairsSummary {
        let now = Instant::now();
        let views = self.coord.pair_views(now);
        let pairs = views
            .iter()
            .map(|(id, v)| PairSummary {
                to: self.lanes[*id as usize].to.clone(),
                state: state_name(v.state, "finished").to_string(),
                bytes: v.bytes,
                bytes_sent: self.bytes_sent.get(id).copied().unwrap_or(0),
                gbps: v.rate * 8.0 / 1e9,
                chunks_done: v.chunks_done,
                error: self.lost.get(id).map(|(e, _)| e.clone()),
                lost_after_s: self
                    .lost
                    .get(id)
                    .map(|(_, at)| at.duration_since(self.started_at).as_secs_f64()),
            })
            .collect();
        let list = &self.plan.list.files;
        let regular = list.iter().filter(|f| f.kind == EntryKind::File).count();
        let (_, total) = self.coord.progress();
        let digest = match self.published.len() {
            1 if regular == 1 => fmt_digest(*self.published.values().next().unwrap_or(&0)),
            _ => fmt_digest(tree_digest(
                self.published
                    .iter()
                    .map(|(f, d)| (list[*f as usize].dest.as_str(), *d)),
            )),
        };
        PairsSummary {
            ok: self.failed.is_empty() && self.published.len() == regular,
            bytes_total: total,
            bytes_sent: self.bytes_sent.values().sum(),
            bytes_resumed: self.bytes_resumed,
            seconds,
            gbps: total as f64 * 8.0 / seconds.max(1e-9) / 1e9,
            chunk_bytes: geometry.chunk_bytes(),
            block_size: geometry.block_size(),
            streams_per_pair: self.plan.cfg.streams,
            pairs,
            files: regular,
            files_ok: self.published.len(),
            failures: self
                .failed
                .iter()
                .map(|(f, why)| (list[*f as usize].dest.clone(), why.clone()))
                .collect(),
            digest,
        }
    }
}

/// One piece per file: the span of a file's runs in `work` (a run
/// between two of them that another pair already wrote is written again,
/// with the same bytes).
fn hull(work: &[Piece]) -> Vec<Piece> {
    let mut out: Vec<Piece> = Vec::with_capacity(work.len());
    for p in work {
        match out.iter_mut().find(|o| o.file == p.file) {
            Some(o) => {
                o.first = o.first.min(p.first);
                o.end = o.end.max(p.end);
            }
            None => out.push(*p),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_files_runs_become_one_piece_and_other_files_keep_theirs() {
        let p = |file, first, end| Piece { file, first, end };
        assert_eq!(
            hull(&[p(1, 4, 6), p(2, 0, 3), p(1, 0, 2), p(1, 8, 9)]),
            [p(1, 0, 9), p(2, 0, 3)]
        );
    }

    fn publishes_queued(run: &Run<'_>, pair: usize) -> Vec<Vec<u32>> {
        run.queues[pair]
            .iter()
            .filter_map(|j| match j {
                Job::Publish(_, files) => Some(files.clone()),
                _ => None,
            })
            .collect()
    }

    fn refused() -> Error {
        Error::net("sending to a", std::io::ErrorKind::ConnectionRefused.into())
    }

    /// A source of `size` bytes and the config to send it to two lanes.
    struct Fixture {
        _dir: tempfile::TempDir,
        cfg: SendConfig,
        list: SourceList,
        lanes: Vec<Arc<Lane>>,
        size: u64,
    }

    impl Fixture {
        fn new(size: u64) -> Self {
            let dir = tempfile::tempdir().unwrap();
            let src = dir.path().join("f");
            std::fs::write(&src, vec![7u8; size as usize]).unwrap();
            let cfg = SendConfig::new("a", vec![0; 32], &src, "f");
            let list = super::super::source::scan(&cfg.source, &cfg.dest).unwrap();
            let lanes = ["a", "b"].iter().map(|t| Arc::new(Lane::new(t))).collect();
            Self {
                _dir: dir,
                cfg,
                list,
                lanes,
                size,
            }
        }

        fn plan(&self) -> Plan<'_> {
            Plan {
                cfg: &self.cfg,
                list: &self.list,
                group: 1,
                pairs: AtomicUsize::new(self.lanes.len()),
            }
        }

        /// A run over both lanes, joined, in blocks of 4 KiB and chunks
        /// of one block.
        fn run<'a>(&'a self, plan: &'a Plan<'a>) -> Run<'a> {
            let geometry = Geometry::new(4096, 4096, None).unwrap();
            let coord = Coordinator::new(geometry, &[(0, self.size)], WINDOW);
            let now = Instant::now();
            let mut run = Run::new(plan, coord, self.lanes.clone(), now);
            run.coord.join(now, 0).unwrap();
            run.coord.join(now, 1).unwrap();
            run
        }
    }

    /// Hands pair `pair`'s next job to a new idle worker, and returns it.
    fn take_job(run: &mut Run<'_>, pair: PairId) -> Job {
        let (reply, job) = mpsc::channel();
        run.handle(Event::Idle { pair, reply }).unwrap();
        run.dispatch();
        job.try_recv().unwrap().expect("a job")
    }

    fn item_failed(pair: PairId, item: ItemId, pieces: Vec<Piece>) -> Event {
        item_ended(pair, item, pieces, refused())
    }

    fn item_ended(pair: PairId, item: ItemId, pieces: Vec<Piece>, e: Error) -> Event {
        Event::Item {
            pair,
            item,
            pieces,
            st: RunState::default(),
            run: Err(e),
        }
    }

    /// Two items handed to workers of lane 0, as the coordinator assigns.
    fn two_items_on_lane_0(run: &mut Run<'_>) -> ((ItemId, Vec<Piece>), (ItemId, Vec<Piece>)) {
        run.act().unwrap();
        let mut take = || match take_job(run, 0) {
            Job::Item(item, pieces) => (item, pieces),
            _ => panic!("no item for lane 0"),
        };
        (take(), take())
    }

    fn state(run: &Run<'_>, pair: PairId) -> PairState {
        let views = run.coord.pair_views(Instant::now());
        views.iter().find(|(p, _)| *p == pair).unwrap().1.state
    }

    /// A receiver that joins gets a lane and takes the work a lost pair
    /// left; one the transfer already sends to, or lost a moment ago (it
    /// may still be listed for a while), gets none, and a lost one is
    /// taken in again once that moment has passed.
    #[test]
    fn a_receiver_that_joins_takes_a_lost_pairs_work_and_a_lost_one_rejoins_only_later() {
        let fx = Fixture::new(64 << 10);
        let plan = fx.plan();
        let mut run = fx.run(&plan);
        let ((item, pieces), _) = two_items_on_lane_0(&mut run);
        let now = Instant::now();
        run.handle(item_failed(0, item, pieces)).unwrap();
        assert!(run.lost.contains_key(&0));
        assert_eq!(
            plan.pairs.load(Ordering::Relaxed),
            1,
            "the cap is b's alone"
        );
        assert!(run.join(now, "b").is_none(), "b runs");
        assert!(run.join(now, "a").is_none(), "a was lost a moment ago");
        let lane = run.join(now, "c").expect("c joins");
        assert_eq!(lane.to, "c");
        assert_eq!(plan.pairs.load(Ordering::Relaxed), 2, "c shares the cap");
        assert_eq!(run.lanes.len(), 3);
        assert_eq!(state(&run, 2), PairState::Running);
        // The coordinator hands the new pair work at once.
        run.act().unwrap();
        assert!(
            matches!(take_job(&mut run, 2), Job::Item(..)),
            "c was handed work"
        );
        assert!(run.join(now, "c").is_none(), "c already runs");
        let later = now + REJOIN_AFTER + Duration::from_secs(1);
        assert!(run.join(later, "a").is_some(), "a is taken in again");
        assert_eq!(run.lanes.len(), 4);
        assert_eq!(run.queues.len(), 4);
        assert_eq!(run.writing.len(), 4);
    }

    /// The first lane that joined is lost whatever its failure, even one
    /// that ends the transfer when a lane it started with meets it (a
    /// private mount, say): the others carry the transfer on.
    #[test]
    fn a_joined_lanes_failure_loses_it_and_not_the_transfer() {
        let fx = Fixture::new(64 << 10);
        let plan = fx.plan();
        let mut run = fx.run(&plan);
        let now = Instant::now();
        run.join(now, "c").expect("c joins");
        let not_shared = || Error::Config("the root is not shared".into());
        run.handle(item_ended(2, 0, Vec::new(), not_shared()))
            .expect("a joined lane's failure is its own");
        assert!(run.lost.contains_key(&2));
        // A second joined lane failing so is the transfer's failure (a full
        // shared disk would otherwise lose every pair that joins).
        run.join(now, "d").expect("d joins");
        assert!(
            run.handle(item_ended(3, 1, Vec::new(), not_shared()))
                .is_err()
        );
        assert!(
            run.handle(item_ended(0, 2, Vec::new(), not_shared()))
                .is_err()
        );
    }

    /// Joins told again and again are taken once; the list is bounded.
    #[test]
    fn joins_are_taken_once_and_bounded() {
        let joins = Joins::default();
        joins.add("a:1");
        joins.clone().add("a:1");
        joins.add("b:1");
        assert_eq!(joins.take(), ["a:1", "b:1"]);
        assert!(joins.take().is_empty());
        for i in 0..MAX_RECEIVERS + 10 {
            joins.add(&format!("r{i}:1"));
        }
        assert_eq!(joins.take().len(), MAX_RECEIVERS);
    }

    /// A lost lane's running publish is handed on once, by its own
    /// failure, never also by the lane's loss: two receivers publishing
    /// one file at once could fail it (the second finds no temporary
    /// file) or let the run end before the first answers.
    #[test]
    fn a_lost_lanes_running_publish_is_handed_on_once() {
        let fx = Fixture::new(3);
        let plan = fx.plan();
        let mut run = fx.run(&plan);
        run.dispatch_publish(vec![0]).unwrap();
        assert_eq!(publishes_queued(&run, 0), [vec![0]]);
        // A worker of lane 0 takes the publish.
        let Job::Publish(id, files) = take_job(&mut run, 0) else {
            panic!("the idle worker was not handed the publish");
        };
        // Lane 0's other session fails: the lane is lost, but the
        // publish its worker runs is not handed to lane 1 yet.
        run.handle(item_failed(0, 0, Vec::new())).unwrap();
        assert!(run.lost.contains_key(&0));
        assert!(publishes_queued(&run, 1).is_empty());
        assert_eq!(
            run.publishing.len(),
            1,
            "the running publish is still awaited"
        );
        // It fails too: now, and only now, lane 1 publishes the file.
        let published = Event::Published {
            pair: 0,
            id,
            files,
            st: RunState::default(),
            run: Err(refused()),
        };
        run.handle(published).unwrap();
        assert_eq!(publishes_queued(&run, 1), [vec![0]]);
        assert_eq!(run.publishing.len(), 1);
    }

    /// A publish that fails part-way hands on only the files it did not
    /// publish: one already under its final name has no temporary file
    /// left, and the next receiver would fail it.
    #[test]
    fn a_publish_that_fails_part_way_hands_on_only_the_unpublished() {
        let fx = Fixture::new(3);
        let plan = fx.plan();
        let mut run = fx.run(&plan);
        run.dispatch_publish(vec![0, 5]).unwrap();
        let Job::Publish(id, files) = take_job(&mut run, 0) else {
            panic!("the idle worker was not handed the publish");
        };
        // The receiver answered file 0 (index 0) as published, then the
        // connection failed before file 5's answer.
        let mut st = RunState::default();
        st.verdicts.insert(0, FileVerdict::Ok(0));
        let published = Event::Published {
            pair: 0,
            id,
            files,
            st,
            run: Err(refused()),
        };
        run.handle(published).unwrap();
        assert_eq!(publishes_queued(&run, 1), [vec![5]]);
        assert!(run.published.contains_key(&0));
        assert!(!run.failed.contains_key(&0));
    }

    /// A lane whose first session fails while its second still writes is
    /// lost at once (its work goes to the others, and the second is
    /// cancelled) but fenced only when the second answers: until then a
    /// file it writes to is not checked.
    #[test]
    fn a_lost_lane_is_fenced_when_its_last_writing_session_answers() {
        let fx = Fixture::new(8 * 4096);
        let plan = fx.plan();
        let mut run = fx.run(&plan);
        let ((first, pieces), (second, later)) = two_items_on_lane_0(&mut run);
        run.handle(item_failed(0, first, pieces)).unwrap();
        assert!(run.lost.contains_key(&0));
        assert_eq!(
            state(&run, 0),
            PairState::Lost,
            "fenced while a session writes"
        );
        // Its running session is cancelled, and the other lane's is not.
        assert!(fx.lanes[0].cancel.load(Ordering::Relaxed));
        assert!(!fx.lanes[1].cancel.load(Ordering::Relaxed));
        // It answers as cancelled, which fences the lane and is no
        // failure of the transfer.
        let last = Box::new(refused());
        let cancelled = item_ended(0, second, later, Error::Cancelled { last });
        run.handle(cancelled).unwrap();
        assert_eq!(state(&run, 0), PairState::Gone);
    }

    /// Only a lane's writing sessions are cancelled with it: a publish cut
    /// between its renames and its answers would leave landed files
    /// unanswered, to fail where they are handed on.
    #[test]
    fn a_lost_lanes_publish_is_not_cut_short() {
        let fx = Fixture::new(3);
        let plan = fx.plan();
        let warm = Arc::new(Warm::default());
        let stripe = |role| Stripe {
            group: 1,
            role,
            pieces: Vec::new(),
        };
        let lane = &fx.lanes[0];
        assert!(
            plan.session(lane, &warm, stripe(StripeRole::Write))
                .cancel
                .is_some()
        );
        assert!(
            plan.session(lane, &warm, stripe(StripeRole::Publish))
                .cancel
                .is_none()
        );
    }

    // Found while adding Transfers over several pairs to the cluster: each
    // session paced its streams to the whole --max-rate, so two pairs of
    // two sessions each could send at four times the cap.
    #[test]
    fn the_rate_cap_is_shared_by_every_session_that_may_run_at_once() {
        let mut fx = Fixture::new(3);
        fx.cfg.max_rate = Some(100_000_000);
        let plan = fx.plan();
        let warm = Arc::new(Warm::default());
        let stripe = Stripe {
            group: 1,
            role: StripeRole::Write,
            pieces: Vec::new(),
        };
        let each = plan.session(&fx.lanes[0], &warm, stripe).max_rate.unwrap();
        let at_once = (fx.lanes.len() * SESSIONS_PER_LANE) as u64;
        assert!(
            each * at_once <= 100_000_000,
            "{at_once} sessions at {each} B/s each exceed the cap"
        );
        assert!(each * at_once >= 99_999_000, "the cap is shared, not cut");
    }

    /// A lost lane's cancelled sessions are no failure of the transfer,
    /// but anything else they answer with still is (a panic, say).
    #[test]
    fn a_lost_lanes_other_failures_still_end_the_transfer() {
        let fx = Fixture::new(8 * 4096);
        let plan = fx.plan();
        let mut run = fx.run(&plan);
        let ((first, pieces), (second, later)) = two_items_on_lane_0(&mut run);
        run.handle(item_failed(0, first, pieces)).unwrap();
        let why = Error::Internal("a session to this receiver panicked".into());
        let panicked = item_ended(0, second, later, why);
        assert!(run.handle(panicked).is_err());
    }

    /// A worker whose session panics answers with a failure: the driving
    /// thread is never left waiting for a worker that died.
    #[test]
    fn a_session_that_panics_is_answered_as_a_failure() {
        let fx = Fixture::new(3);
        let plan = fx.plan();
        let (tx, rx) = mpsc::channel();
        std::thread::scope(|s| {
            let (plan, lane) = (&plan, &fx.lanes[0]);
            s.spawn(move || work_lane(plan, 0, lane, &Arc::new(Warm::default()), &tx));
            let Ok(Event::Idle { reply, .. }) = rx.recv() else {
                panic!("the worker did not ask for a job");
            };
            // File 9 is not in the listing: the session panics on it.
            let piece = Piece {
                file: 9,
                first: 0,
                end: 1,
            };
            reply.send(Some(Job::Item(4, vec![piece]))).unwrap();
            match rx.recv_timeout(Duration::from_secs(10)) {
                Ok(Event::Item {
                    item: 4,
                    run: Err(Error::Internal(why)),
                    ..
                }) => assert!(why.contains("panicked"), "{why}"),
                _ => panic!("no failure answered for the panicked session"),
            }
        });
    }

    #[test]
    fn chunks_are_a_few_per_pair_and_keep_every_stream_busy() {
        let mib = 1 << 20;
        // Two 16 MiB blocks for each of 4 streams, at least.
        assert_eq!(chunk_bytes(0, 3, 16 * mib, 4), 128 * mib);
        assert_eq!(chunk_bytes(300 * mib, 3, 16 * mib, 4), 128 * mib);
        assert_eq!(chunk_bytes(24 << 30, 3, 16 * mib, 4), 1 << 30);
        assert_eq!(chunk_bytes(1 << 50, 2, 16 * mib, 4), MAX_CHUNK);
        // Small blocks: a few per pair.
        assert_eq!(chunk_bytes(8 << 30, 2, mib, 4), 512 * mib);
    }
}
