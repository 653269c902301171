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
//! A lane may send through a relay (`relay`, `send_over_pairs_via`):
//! another sending host that runs the lane's write sessions from its own
//! view of the shared source, so that a transfer reads and sends from
//! several hosts; the marker and publish sessions stay with this one.
//!
//! Receivers may join a running transfer (`Joins`): a lost pair's
//! replacement, or a receiver whose job came back on another port. Each
//! gets a lane of its own and takes work not yet started, like a pair
//! that ran dry; nothing restarts.

mod relayed;
mod run;
mod summary;
#[cfg(test)]
mod tests;

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
use run::Run;
use summary::state_name;
pub use summary::{PairSummary, PairsSummary};

/// How long a pair's receiver may stay unreachable before the pair is
/// lost and its work goes to the others: long enough that a network blip
/// of a few seconds, which may take every pair at once, and a transfer
/// with them, is ridden out. One whose packets vanish is found by its
/// Lease or the data streams' keepalive instead, later.
pub const PAIR_PATIENCE: Duration = Duration::from_secs(8);
const _: () = assert!(PAIR_PATIENCE.as_secs() == crate::wire::RELAY_SILENCE.as_secs());
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
/// its thread is stuck in the kernel, reading a hung source disk). A
/// relay's session that ended unanswered counts as running until
/// `RELAY_UNANSWERED_FENCE` after (`Run::unanswered`).
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
/// Most files publishes queued together are merged into: one session's
/// manifest stays bounded by it, or by one batch of verified files where
/// that alone is larger.
const MAX_PUBLISH: usize = 4096;
/// Blocks a chunk holds per data stream, at least: a block goes out on
/// one stream, so a chunk of fewer blocks than streams leaves streams
/// idle (and under --max-rate, each paced to its share, runs slow).
const MIN_BLOCKS_PER_STREAM: u64 = 2;
/// The largest.
const MAX_CHUNK: u64 = 1 << 30;
/// The smallest bundle of small files aimed at: each item is a session,
/// whose round trips a bundle should outweigh.
const MIN_BUNDLE: u64 = 16 << 20;
/// Chunks per pair, about, for a transfer of one large file: enough that
/// the pairs finish close together.
const CHUNKS_PER_PAIR: u64 = 8;

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
    /// The relay its data sessions run on (`relay`); `None`: this host.
    via: Option<String>,
    progress: Arc<Progress>,
    /// Set when the lane is lost or the transfer ends in failure: its
    /// running sessions end within a keepalive interval, so that a lost
    /// lane stops writing soon and a failed transfer returns soon.
    cancel: Arc<AtomicBool>,
}

impl Lane {
    fn new(to: &str, via: Option<&str>) -> Self {
        Self {
            to: to.to_string(),
            via: via.map(str::to_string),
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
    /// What a relay's lasting refusal means.
    relays: Relays,
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
        lane.progress
            .share_compression(&self.cfg.progress, self.cfg.compress);
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
            filtered: 0,
            hard_links: 0,
            base: Arc::clone(&self.list.base),
            base_path: self.list.base_path.clone(),
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
                let (st, run) = match &lane.via {
                    Some(via) => relayed::run_job(via, &cfg, &self.subset(&ids)),
                    None => super::send_list(&cfg, &self.subset(&ids)),
                };
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
    send_over_pairs_via(cfg, to, &vec![None; to.len()])
}

/// As `send_over_pairs`, each pair's data sent by the relay `via` names
/// for it (`None`: by this host), which reads the same source through
/// shared storage (`relay`).
pub fn send_over_pairs_via(
    cfg: &SendConfig,
    to: &[String],
    via: &[Option<String>],
) -> Result<PairsSummary> {
    check_named(cfg, to, via)?;
    send_pairs(cfg, (to, via, Relays::Named), &Joins::default(), to.len())
}

/// Refuses the receivers and senders a user named (`--to`, `--via`)
/// where they cannot make a transfer over several pairs: what
/// `send_over_pairs_via` checks first, for a caller that must know before
/// it sends (a dry run plans on the first receiver alone).
pub fn check_named(cfg: &SendConfig, to: &[String], via: &[Option<String>]) -> Result<()> {
    check_receivers(cfg, to, 2)?;
    if via.len() != to.len() {
        return Err(Error::Config(format!(
            "--via names {} senders for {} receivers; name one for each receiver, - for this host",
            via.len(),
            to.len()
        )));
    }
    Ok(())
}

/// Whose relays a transfer's are, and so what one that refuses for good
/// (short of memory, a private view of the source, another token) means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Relays {
    /// Named by the user (`send --via`): the transfer fails, saying why,
    /// for the user to fix.
    Named,
    /// Chosen by the operator: its lane is lost like a lost relay's, the
    /// other pairs take its work, and its receiver may join again, sent
    /// to from this host (the agent tells of every receiver each round).
    Lent,
}

/// As `send_over_pairs_via`, from one receiver at least, taking in the
/// receivers told of in `joins` while it runs (this host sends to those);
/// the work is cut for `most` pairs, so that those that join find some
/// not yet started. The relays are lent (the operator's choice): one that
/// refuses for good only loses its lane.
pub fn send_over_pairs_joined(
    cfg: &SendConfig,
    to: &[String],
    via: &[Option<String>],
    joins: &Joins,
    most: usize,
) -> Result<PairsSummary> {
    if via.len() != to.len() {
        return Err(Error::Config(format!(
            "{} relays named for {} receivers",
            via.len(),
            to.len()
        )));
    }
    send_pairs(cfg, (to, via, Relays::Lent), joins, most)
}

fn send_pairs(
    cfg: &SendConfig,
    (to, via, relays): (&[String], &[Option<String>], Relays),
    joins: &Joins,
    most: usize,
) -> Result<PairsSummary> {
    cfg.validate()?;
    check_receivers(cfg, to, 1)?;
    if cfg.mirror.is_some() {
        return Err(Error::Config(
            "--delete is not done over several pairs yet: mirror with one receiver (they share one root, so the result is the same)".into(),
        ));
    }
    if cfg.dry_run {
        return Err(Error::Config(
            "--dry-run is not planned over several pairs yet: plan with one receiver (the plan is the same)".into(),
        ));
    }
    let start = Instant::now();
    let (list, present) = leave_present(cfg, to, cfg.list()?)?;
    // The pairs' receivers share each file's temporary copy, which a
    // file found present by one would leave to the others half made:
    // what is present was asked once, above, and the pairs send the rest.
    let unsynced = SendConfig {
        sync: crate::sync::SyncLevel::None,
        ..cfg.clone()
    };
    let cfg = &unsynced;
    // Every file there: no pair is started (their directories are there
    // too, beneath which the files were found).
    if present.files > 0 && !list.files.iter().any(|f| f.kind == EntryKind::File) {
        return Ok(PairsSummary::nothing_sent(cfg, present, start));
    }
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
    let geometry = Geometry::new(cfg.block_size, chunk, None)
        .map_err(|e| Error::Config(e.to_string()))?
        .bundled(
            bundle_bytes(total, most),
            u64::from(cfg.streams) * MIN_BLOCKS_PER_STREAM,
        );
    let plan = Plan {
        cfg,
        list: &list,
        group: u64::from_le_bytes(crate::net::auth::random()),
        relays,
        pairs: AtomicUsize::new(to.len()),
    };
    let lanes: Vec<Arc<Lane>> = to
        .iter()
        .zip(via)
        .map(|(t, v)| Arc::new(Lane::new(t, v.as_deref())))
        .collect();
    mark(&plan, &lanes)?;
    let mut run = Run::new(
        &plan,
        Coordinator::new(geometry, &files, WINDOW),
        lanes,
        start,
    );
    let outcome = std::thread::scope(|s| {
        let (tx, rx) = mpsc::channel();
        // A lane's workers: parked connections and one pool of buffers
        // per receiver, shared by its lane's sessions.
        let spawn = |pair: PairId, lane: Arc<Lane>| {
            let warm = Arc::new(Warm::sharing_pools());
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
    Ok(run.summary(geometry, seconds).with_present(present))
}

/// What a sync level found already at the destination: files and bytes.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Present {
    level: crate::sync::SyncLevel,
    files: usize,
    bytes: u64,
}

/// `list` without the files the destination already has at `cfg.sync`,
/// and what those were. A receiver is asked, in a dry run (the pairs'
/// receivers share one file system: what one finds there, all do): the
/// first, or the next where it cannot be reached within a pair's
/// patience, as `mark` does. A file it would refuse stays, for the pairs
/// to fail as a run would.
fn leave_present(
    cfg: &SendConfig,
    to: &[String],
    list: SourceList,
) -> Result<(SourceList, Present)> {
    let level = cfg.sync;
    if level == crate::sync::SyncLevel::None {
        return Ok((list, Present::default()));
    }
    let mut dry = cfg.clone();
    dry.dry_run = true;
    dry.progress = Arc::default();
    dry.warm = None;
    dry.retry_for = cfg.retry_for.min(PAIR_PATIENCE);
    dry.refused_for = Some(REFUSED_PATIENCE.min(dry.retry_for));
    let mut last = None;
    let mut planned = None;
    for t in to {
        dry.to.clone_from(t);
        let (st, ran) = super::send_list(&dry, &list);
        match ran {
            Ok(()) => {
                planned = Some(st);
                break;
            }
            Err(e) => {
                tracing::warn!(receiver = %t, "asking what is already there: {e}; asking the next");
                last = Some(e);
            }
        }
    }
    let Some(st) = planned else {
        return Err(last.unwrap_or_else(|| Error::Config("no receiver to ask".into())));
    };
    let mut present = Present {
        level,
        ..Present::default()
    };
    let mut kept = Vec::with_capacity(list.files.len());
    for (i, f) in list.files.iter().enumerate() {
        if matches!(st.verdicts.get(&(i as u32)), Some(FileVerdict::Present)) {
            present.files += 1;
            present.bytes += f.size;
        } else {
            kept.push(f.clone());
        }
    }
    Ok((
        SourceList {
            files: kept,
            ..list
        },
        present,
    ))
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

/// Bytes a bundle of small files aims at: a tree is cut into about as
/// many items as a large file of its size, so that the pairs finish
/// together; a chunk's floor of blocks per stream does not hold a bundle
/// of one-block files up (`Geometry::bundled`).
fn bundle_bytes(total: u64, pairs: usize) -> u64 {
    (total / (pairs as u64 * CHUNKS_PER_PAIR).max(1)).max(MIN_BUNDLE)
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
