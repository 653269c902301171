//! One transfer from this sender to several receivers that share one
//! root (`send --to a,b,c`): the shell of `stripes::Coordinator`.
//!
//! Each receiver is one pair's far end, driven by a lane: a thread that
//! runs one session per item of work the coordinator hands its pair,
//! writing that item's pieces into the temporary files all receivers
//! share (`Frame::Stripe`), over the lane's parked connections
//! (`sender::warm`). The first session creates the shared-storage marker
//! and every later one on any receiver must find it. A lane whose
//! receiver stays unreachable for `PAIR_PATIENCE` is lost: its unfinished
//! pieces go to the others, and the transfer goes on without a restart.
//! Each file is verified once from its block checksums and published by
//! one receiver, once every piece of it is durable.
//!
//! A steal takes only items still queued on a lane: a running session is
//! not cut short (`Coordinator::started`, told by the driving thread as
//! it hands the item to a worker, so a steal never crosses a start).
//! The coordinator's ledger lives in this process: a new `send` after a
//! crash of this one starts the pieces over.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs::File;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use super::source::{SourceFile, SourceList, Stamp};
use super::{RunState, SendConfig, warm::Warm};
use crate::digest::{fmt_digest, tree_digest};
use crate::error::{Error, Result};
use crate::progress::Progress;
use crate::session::FileVerdict;
use crate::stripes::{Action, Coordinator, Geometry, ItemId, PairId, PairState, Piece, Verified};
use crate::wire::{EntryKind, Stripe, StripePiece, StripeRole};

/// How long a pair's receiver may stay unreachable before the pair is
/// lost and its work goes to the others.
pub const PAIR_PATIENCE: Duration = Duration::from_secs(10);
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
            "  bytes      {} total, {} sent\n  time       {:.2} s\n  rate       {:.2} Gbit/s\n",
            fmt_bytes(self.bytes_total),
            fmt_bytes(self.bytes_sent),
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

enum Job {
    Item(ItemId, Vec<Piece>),
    Publish(Vec<u32>),
    Unmark,
}

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

/// One receiver, and the jobs queued for its workers. Only the driving
/// thread touches the queue: it hands each job to an idle worker and, for
/// an item, tells the coordinator it started in the same step, so that no
/// steal can cut an item a worker already runs.
struct Lane {
    to: String,
    jobs: Mutex<VecDeque<Job>>,
    progress: Arc<Progress>,
}

impl Lane {
    fn push(&self, job: Job) {
        self.queue().push_back(job);
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, VecDeque<Job>> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The transfer's fixed parts: what every lane's sessions share.
struct Plan<'a> {
    cfg: &'a SendConfig,
    list: &'a SourceList,
    group: u64,
}

impl Plan<'_> {
    /// The config of one session to `to` in `role`, writing `pieces`.
    fn session(&self, lane: &Lane, warm: &Arc<Warm>, stripe: Stripe) -> SendConfig {
        let mut cfg = self.cfg.clone();
        cfg.to = lane.to.clone();
        cfg.retry_for = self.cfg.retry_for.min(PAIR_PATIENCE);
        cfg.progress = Arc::clone(&lane.progress);
        cfg.warm = Some(Arc::clone(warm));
        cfg.stripe = Some(stripe);
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
            Job::Publish(files) => {
                let cfg = self.session(lane, warm, stripe(StripeRole::Publish, Vec::new()));
                let (st, run) = super::send_list(&cfg, &self.subset(&files));
                Event::Published {
                    pair,
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
    cfg.validate()?;
    check_receivers(cfg, to)?;
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
    let chunk = chunk_bytes(total, to.len(), cfg.block_size, cfg.streams);
    let geometry =
        Geometry::new(cfg.block_size, chunk, None).map_err(|e| Error::Config(e.to_string()))?;
    let plan = Plan {
        cfg,
        list: &list,
        group: u64::from_le_bytes(crate::net::auth::random()),
    };
    let lanes: Vec<Lane> = to
        .iter()
        .map(|t| Lane {
            to: t.clone(),
            jobs: Mutex::default(),
            progress: Arc::default(),
        })
        .collect();
    let start = Instant::now();
    mark(&plan, &lanes)?;
    let mut run = Run::new(
        &plan,
        Coordinator::new(geometry, &files, WINDOW),
        &lanes,
        start,
    );
    let outcome = std::thread::scope(|s| {
        let (tx, rx) = mpsc::channel();
        for (i, lane) in lanes.iter().enumerate() {
            // One pool of parked connections and buffers per receiver,
            // shared by its lane's sessions.
            let warm = Arc::new(Warm::default());
            for _ in 0..SESSIONS_PER_LANE {
                let (tx, plan, warm) = (tx.clone(), &plan, Arc::clone(&warm));
                s.spawn(move || work_lane(plan, i as PairId, lane, &warm, &tx));
            }
        }
        drop(tx);
        let outcome = run.drive(&rx);
        // Idle workers stop now; busy ones when their session ends and
        // finds no one to report to.
        run.idle.clear();
        drop(rx);
        outcome
    });
    let seconds = start.elapsed().as_secs_f64();
    outcome?;
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
        let event = plan.run(pair, lane, warm, job);
        let failed = matches!(
            &event,
            Event::Item { run: Err(_), .. } | Event::Published { run: Err(_), .. }
        );
        if tx.send(event).is_err() || failed {
            return;
        }
    }
}

/// Refuses a list of receivers that cannot make a transfer.
fn check_receivers(cfg: &SendConfig, to: &[String]) -> Result<()> {
    if to.len() < 2 || to.len() > MAX_RECEIVERS {
        return Err(Error::Config(format!(
            "--to names {} receivers; a transfer over several pairs takes 2 to {MAX_RECEIVERS}",
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
fn mark(plan: &Plan<'_>, lanes: &[Lane]) -> Result<()> {
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
    lanes: &'a [Lane],
    /// Lost pairs: why, and when.
    lost: BTreeMap<PairId, (String, Instant)>,
    started_at: Instant,
    /// Workers waiting for a job.
    idle: Vec<(PairId, mpsc::Sender<Option<Job>>)>,
    /// Publish jobs handed to a lane and not yet answered.
    publishing: BTreeMap<PairId, Vec<Vec<u32>>>,
    /// Sessions each file's pieces failed in.
    failures: HashMap<u32, u32>,
    failed: BTreeMap<u32, String>,
    published: BTreeMap<u32, u128>,
    digests: HashMap<u32, u128>,
    bytes_sent: BTreeMap<PairId, u64>,
    unmarking: bool,
}

impl<'a> Run<'a> {
    fn new(plan: &'a Plan<'a>, coord: Coordinator, lanes: &'a [Lane], started_at: Instant) -> Self {
        Self {
            plan,
            coord,
            lanes,
            lost: BTreeMap::new(),
            started_at,
            idle: Vec::new(),
            publishing: BTreeMap::new(),
            failures: HashMap::new(),
            failed: BTreeMap::new(),
            published: BTreeMap::new(),
            digests: HashMap::new(),
            bytes_sent: BTreeMap::new(),
            unmarking: false,
        }
    }

    /// Feeds the lanes' events to the coordinator and carries out its
    /// actions until every file is published or given up.
    fn drive(&mut self, rx: &mpsc::Receiver<Event>) -> Result<()> {
        let now = Instant::now();
        for pair in 0..self.lanes.len() as PairId {
            self.coord
                .join(now, pair)
                .map_err(|e| Error::Internal(e.to_string()))?;
        }
        loop {
            self.act()?;
            self.dispatch();
            if self.coord.is_finished() && self.publishing.is_empty() {
                return self.unmark(rx);
            }
            if self.coord.waiting_for_pairs() || self.lost.len() == self.lanes.len() {
                return Err(self.all_lost());
            }
            self.show_progress();
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(event) => self.handle(event)?,
                Err(mpsc::RecvTimeoutError::Timeout) => self.coord.tick(Instant::now()),
                Err(mpsc::RecvTimeoutError::Disconnected) => return Err(self.all_lost()),
            }
        }
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
            let Some(job) = self.lanes[pair as usize].queue().pop_front() else {
                waiting.push((pair, reply));
                continue;
            };
            if let Job::Item(item, _) = &job {
                // Refused only for a pair lost meanwhile, checked above.
                let _ = self.coord.started(pair, *item);
            }
            if let Err(mpsc::SendError(Some(job))) = reply.send(Some(job)) {
                // The worker is gone: the job goes back for another.
                self.lanes[pair as usize].queue().push_front(job);
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
    }

    /// Carries out what the coordinator asks.
    fn act(&mut self) -> Result<()> {
        let mut publish = Vec::new();
        while let Some(action) = self.coord.poll() {
            match action {
                Action::Assign { pair, item, work } => {
                    self.lanes[pair as usize].push(Job::Item(item, hull(&work)));
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
        let lane = &self.lanes[pair as usize];
        let mut q = lane.queue();
        let at = q
            .iter()
            .position(|j| matches!(j, Job::Item(i, _) if *i == item));
        if let Some(at) = at {
            if keep.is_empty() {
                q.remove(at);
                drop(q);
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
            .min_by_key(|p| self.lanes[*p as usize].queue().len())
            .ok_or_else(|| self.all_lost())?;
        self.lanes[lane as usize].push(Job::Publish(files.clone()));
        self.publishing.entry(lane).or_default().push(files);
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
                match run {
                    Ok(()) => self.item_done(now, pair, item, &pieces, &st),
                    Err(e) => self.lane_failed(now, pair, e),
                }
            }
            Event::Published {
                pair,
                files,
                st,
                run,
            } => {
                self.sent(pair, &st);
                if let Some(jobs) = self.publishing.get_mut(&pair) {
                    jobs.retain(|j| *j != files);
                    if jobs.is_empty() {
                        self.publishing.remove(&pair);
                    }
                }
                match run {
                    Ok(()) => {
                        self.published_files(&files, &st);
                        Ok(())
                    }
                    Err(e) => {
                        self.lane_failed(now, pair, e)?;
                        self.dispatch_publish(files)
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
    /// (its sessions are over, so nothing it sent lands later), unless the
    /// failure is one that retrying cannot fix anywhere, which ends the
    /// transfer.
    fn lane_failed(&mut self, now: Instant, pair: PairId, e: Error) -> Result<()> {
        let to = &self.lanes[pair as usize].to;
        if !(e.is_retryable() || matches!(e, Error::GaveUp { .. })) {
            return Err(Error::Config(format!("{to}: {e}")));
        }
        tracing::warn!(receiver = %to, error = %e, "pair lost; its work goes to the others");
        self.lanes[pair as usize].queue().clear();
        // Its other session may fail too: the first failure is the news.
        if self.lost.contains_key(&pair) {
            return Ok(());
        }
        self.lost.insert(pair, (e.to_string(), now));
        let _ = self.coord.lost(now, pair, now);
        let orphans = self.publishing.remove(&pair).unwrap_or_default();
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
        self.lanes[lane].push(Job::Unmark);
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
                state: match v.state {
                    PairState::Running | PairState::Leaving => "finished",
                    PairState::Lost => "lost",
                    PairState::Gone => "gone",
                }
                .to_string(),
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
