//! A session's writer: keeps `queue_depth` writes in flight at each block's
//! offset, acknowledges blocks once written, checkpoints durable blocks,
//! and verifies and publishes finished files.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use super::Shared;
use super::checkpointer::{Checkpointer, Done, Job};
use super::dest::{DestFile, Files, Staged, discard_unresumable};
use super::kept::Kept;
use super::stats::Stats;
use super::verdicts::{Answer, VerdictTx};
use crate::CheckpointPolicy;
use crate::digest::{block_checksum, file_digest, fmt_digest};
use crate::error::{Error, Result};
use crate::io::{ALIGN, BlockIo, IoDone, IoMode, IoOp, OpKind, Pool, backend};
use crate::session::reports::{Reported, Reports, Stall, digest_agrees};
use crate::violation::{Violation, ViolationKind};
use crate::wire::{EntryKind, Frame, Verification};

/// Work for the writer.
pub(crate) enum WriterMsg {
    /// A verified block to write; acknowledge on `ack` once written.
    Block {
        file_id: u32,
        block: u64,
        buf: crate::io::PoolBuf,
        checksum: u64,
        ack: mpsc::SyncSender<Frame>,
    },
    /// The sender has every block acknowledged; verify and publish.
    FileDone(Reported),
    /// The sender gave the file up (its source changed): discard it.
    Abort { file_id: u32, message: String },
    /// Sync what is written, checkpoint, and stop.
    Stop,
}

/// How the writer ended.
pub(crate) struct Report {
    pub(crate) io_mode: IoMode,
    pub(crate) fallback: Option<String>,
    pub(crate) error: Option<String>,
    /// Things the receiver's operator should know (checkpoints not stored).
    pub(crate) warnings: Vec<String>,
}

impl Report {
    pub(crate) fn panicked() -> Self {
        Self {
            io_mode: IoMode::Async,
            fallback: None,
            error: Some("the writer thread panicked".into()),
            warnings: Vec::new(),
        }
    }
}

/// Warnings kept per session: one full disk makes every checkpoint fail.
const MAX_WARNINGS: usize = 8;

struct Pending {
    file_id: u32,
    block: u64,
    checksum: u64,
    ack: mpsc::SyncSender<Frame>,
}

pub(crate) struct Writer {
    shared: Arc<Shared>,
    files: Files,
    rx: mpsc::Receiver<WriterMsg>,
    /// To the control thread, which owns the control connection.
    verdicts: VerdictTx,
    verify: Verification,
    stats: Arc<Stats>,
    io: Box<dyn BlockIo>,
    mode: IoMode,
    fallback: Option<String>,
    /// Keyed by a per-op sequence number: a resent block may be written
    /// again while its first copy is still in flight.
    pending: HashMap<u64, Pending>,
    next_tag: u64,
    policy: CheckpointPolicy,
    checkpointer: Checkpointer,
    /// A message taken while gathering finished files, handled next.
    lookahead: Option<WriterMsg>,
    /// Which reports can be answered, and which files were (see
    /// `session::reports`).
    reports: Reports,
    warnings: Vec<String>,
    /// What a new session would keep, shown as the transfer's progress.
    kept: Kept,
    /// `Stats::arriving` when last looked at.
    arrived: u64,
}

/// Files finished together are made durable together.
const MAX_FINISH_BATCH: usize = 1024;

impl Writer {
    pub(crate) fn new(
        shared: Arc<Shared>,
        files: Staged<'_>,
        rx: mpsc::Receiver<WriterMsg>,
        verdicts: VerdictTx,
        verify: Verification,
        stats: Arc<Stats>,
    ) -> Result<Self> {
        let (io, mode, fallback) = backend(shared.cfg.io_mode, shared.cfg.queue_depth);
        let policy = CheckpointPolicy::new(Instant::now(), shared.cfg.checkpoint_interval);
        let checkpointer = Checkpointer::start(Arc::clone(&shared))?;
        let files = files.into_files();
        let mut kept = Kept::new(Arc::clone(&stats));
        for (id, f) in files.iter() {
            let Some(f) = f else { continue };
            kept.set(id, f.layout.bytes_in(&f.tracker.durable()));
        }
        let progress_timeout = shared.cfg.idle_timeout;
        Ok(Self {
            shared,
            files,
            rx,
            verdicts,
            verify,
            stats,
            io,
            mode,
            fallback,
            pending: HashMap::new(),
            next_tag: 0,
            policy,
            checkpointer,
            lookahead: None,
            reports: Reports::new(progress_timeout),
            warnings: Vec::new(),
            kept,
            arrived: 0,
        })
    }

    fn warn(&mut self, w: String) {
        if self.warnings.len() < MAX_WARNINGS && !self.warnings.contains(&w) {
            tracing::warn!("{w}");
            self.warnings.push(w);
        }
    }

    pub(crate) fn run(mut self) -> Report {
        let result = super::verdicts::unwound(|| self.work());
        self.verdicts.send_failure(&result);
        // Whatever happened, make what is on disk resumable, and remove
        // what cannot be resumed.
        let _ = self.drain();
        let _ = self.checkpoint_all();
        // Dropping the writer then removes what cannot be resumed.
        Report {
            io_mode: self.mode,
            fallback: self.fallback.take(),
            error: result.err().map(|e| e.to_string()),
            warnings: std::mem::take(&mut self.warnings),
        }
    }

    fn work(&mut self) -> Result<()> {
        loop {
            let msg = if let Some(m) = self.lookahead.take() {
                Some(m)
            } else if self.io.in_flight() == 0 {
                let due = self.policy.poll_timeout();
                let due = self.reports.poll_timeout().map_or(due, |s| s.min(due));
                let wait = due
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(5));
                match self.rx.recv_timeout(wait) {
                    Ok(m) => Some(m),
                    Err(mpsc::RecvTimeoutError::Timeout) => None,
                    Err(mpsc::RecvTimeoutError::Disconnected) => Some(WriterMsg::Stop),
                }
            } else {
                match self.rx.try_recv() {
                    Ok(m) => Some(m),
                    Err(mpsc::TryRecvError::Empty) => None,
                    Err(mpsc::TryRecvError::Disconnected) => Some(WriterMsg::Stop),
                }
            };
            // Nothing queued and nothing being written: only then can a
            // report be waiting for blocks that are not coming.
            let idle = msg.is_none() && self.io.in_flight() == 0;
            match msg {
                Some(WriterMsg::Block {
                    file_id,
                    block,
                    buf,
                    checksum,
                    ack,
                }) => {
                    while self.io.in_flight() >= self.io.depth() {
                        self.reap(true)?;
                    }
                    self.write(file_id, block, buf, checksum, ack)?;
                }
                Some(WriterMsg::FileDone(report)) => {
                    // Gather the files that finished together (a tree of
                    // small files finishes many at a time).
                    let mut batch = vec![report];
                    while batch.len() < MAX_FINISH_BATCH {
                        match self.rx.try_recv() {
                            Ok(WriterMsg::FileDone(report)) => batch.push(report),
                            Ok(other) => {
                                self.lookahead = Some(other);
                                break;
                            }
                            Err(_) => break,
                        }
                    }
                    // Answered below, once their blocks are all written.
                    let now = Instant::now();
                    for report in batch {
                        self.reports.handle_reported(report, now);
                    }
                }
                Some(WriterMsg::Abort { file_id, message }) => self.abort(file_id, message)?,
                Some(WriterMsg::Stop) => return Ok(()),
                None if self.io.in_flight() > 0 => self.reap(true)?,
                None => {}
            }
            self.reap(false)?;
            self.finish_awaited()?;
            self.check_progress(idle)?;
            self.maybe_checkpoint()?;
        }
    }

    /// Ends the session when a reported file's blocks stopped coming (see
    /// `session::reports`): a new one resumes from what is durable. Judged
    /// only when the writer is `idle`, so that blocks already read and
    /// queued behind its own long work (a sync, a re-read) count.
    fn check_progress(&mut self, idle: bool) -> Result<()> {
        let now = Instant::now();
        let arrived = self.stats.arriving.load(Ordering::Relaxed);
        if arrived != self.arrived {
            self.arrived = arrived;
            self.reports.handle_progress(now);
        }
        if !idle {
            return Ok(());
        }
        let Some(stall) = self.reports.poll_stalled(now) else {
            return Ok(());
        };
        Err(stalled(&self.files, stall))
    }

    /// Answers the reported files whose blocks have all been written.
    fn finish_awaited(&mut self) -> Result<()> {
        let files = &self.files;
        let ready = self.reports.poll_ready(|id| can_finish(files, id));
        if ready.is_empty() {
            return Ok(());
        }
        self.drain()?;
        self.finish(ready)?;
        // Its syncs and re-reads took the writer's time, not the sender's.
        self.reports.handle_progress(Instant::now());
        Ok(())
    }

    fn write(
        &mut self,
        file_id: u32,
        block: u64,
        buf: crate::io::PoolBuf,
        checksum: u64,
        ack: mpsc::SyncSender<Frame>,
    ) -> Result<()> {
        if self.reports.is_answered(file_id) {
            let _ = ack.send(Frame::Ack { file_id, block });
            return Ok(());
        }
        let want_direct = self.mode.wants_direct();
        let f = self
            .files
            .get_mut(file_id)
            .and_then(Option::as_deref_mut)
            .ok_or_else(|| {
                Error::from(Violation::new(
                    ViolationKind::Unknown,
                    format!("block for finished or unknown file {file_id}"),
                ))
            })?;
        if let Some(note) = f.open(&self.shared.root, want_direct)? {
            if self.fallback.is_none() {
                tracing::warn!("{note}");
                self.fallback = Some(note);
            }
        }
        let offset = f.layout.offset(block);
        let len = buf.len();
        // Aligned blocks go direct; the unaligned tail goes through the
        // page cache, since O_DIRECT refuses it.
        let file = match f.direct() {
            Some(d) if len % ALIGN == 0 => Arc::clone(d),
            _ => Arc::clone(f.plain().expect("opened above")),
        };
        let tag = self.next_tag;
        self.next_tag += 1;
        self.pending.insert(
            tag,
            Pending {
                file_id,
                block,
                checksum,
                ack,
            },
        );
        self.io.submit(IoOp {
            file,
            kind: OpKind::Write,
            buf,
            offset,
            len,
            tag,
        });
        Ok(())
    }

    fn complete(&mut self, p: Pending, len: usize, result: std::io::Result<usize>) -> Result<()> {
        let f = self
            .files
            .get_mut(p.file_id)
            .and_then(Option::as_deref_mut)
            .expect("pending writes belong to open files");
        if let Err(e) = result {
            return Err(Error::disk(
                format!(
                    "writing block {} of {}; free space there (the sender retries for its --retry-for)",
                    p.block, f.dest.rel
                ),
                e,
            ));
        }
        f.tracker.handle_written(p.block, p.checksum);
        self.reports.handle_progress(Instant::now());
        self.stats.bytes.fetch_add(len as u64, Ordering::Relaxed);
        self.shared
            .job
            .written
            .fetch_add(len as u64, Ordering::Relaxed);
        self.shared.cfg.observer.written(len as u64);
        let _ = p.ack.send(Frame::Ack {
            file_id: p.file_id,
            block: p.block,
        });
        Ok(())
    }

    fn reap(&mut self, wait: bool) -> Result<()> {
        for IoDone {
            tag, buf, result, ..
        } in self.io.reap(wait)?
        {
            let p = self
                .pending
                .remove(&tag)
                .expect("every op has a pending entry");
            let len = buf.len();
            drop(buf);
            self.complete(p, len, result)?;
        }
        Ok(())
    }

    fn drain(&mut self) -> Result<()> {
        while self.io.in_flight() > 0 {
            self.reap(true)?;
        }
        Ok(())
    }

    fn maybe_checkpoint(&mut self) -> Result<()> {
        if let Some(done) = self.checkpointer.poll(false) {
            self.apply(done)?;
        }
        let now = Instant::now();
        // This runs for every block, and a session may hold a million
        // files: they are looked through only once a checkpoint could be
        // due, and a look that finds nothing to checkpoint counts as one,
        // so that a tree of one-block files (never checkpointed) is not
        // looked through again at every block.
        if self.checkpointer.busy() || now < self.policy.poll_timeout() {
            return Ok(());
        }
        let unsynced: u64 = self
            .files
            .present_mut()
            .map(|(_, f)| &*f)
            .filter(|f| f.layout.blocks() > 1)
            .map(|f| f.tracker.unsynced())
            .sum();
        if !self.policy.poll_due(now, unsynced) {
            self.policy.handle_checkpointed(now);
            return Ok(());
        }
        // No drain and no sync here: the checkpoint thread syncs what was
        // written when the batch was made, while the writes in flight and
        // those that follow keep the disk busy.
        let batch: Vec<Job> = self
            .files
            .present_mut()
            .filter(|(_, f)| f.layout.blocks() > 1 && f.tracker.unsynced() > 0)
            .filter_map(|(file_id, f)| {
                let file = Arc::clone(f.plain()?);
                let covered = f.tracker.begin_sync();
                let (durable, checksums) = f.tracker.checkpoint_after(&covered);
                Some(Job {
                    file_id,
                    file,
                    rel: f.dest.rel.to_string(),
                    parent: f.dest.parent().to_string(),
                    ckpt_name: f.dest.ckpt_name(),
                    part_name: f.dest.part_name(),
                    checkpoint: f.record(durable, checksums),
                    covered,
                })
            })
            .collect();
        if !batch.is_empty() {
            self.checkpointer.submit(batch)?;
        }
        self.policy.handle_checkpointed(now);
        Ok(())
    }

    /// Marks what a finished background checkpoint made durable.
    fn apply(&mut self, done: Done) -> Result<()> {
        let batch = done?;
        for (file_id, covered, stored) in batch.synced {
            if let Some(f) = self.files.get_mut(file_id).and_then(Option::as_deref_mut) {
                f.tracker.handle_synced_upto(&covered);
                f.has_checkpoint |= stored;
                if stored {
                    self.kept
                        .set(file_id, f.layout.bytes_in(&f.tracker.durable()));
                }
            }
        }
        for w in batch.warnings {
            self.warn(w);
        }
        Ok(())
    }

    /// Waits for a background checkpoint, so that nothing stores a
    /// checkpoint behind a file that is being published or discarded.
    fn settle(&mut self) -> Result<()> {
        match self.checkpointer.poll(true) {
            Some(done) => self.apply(done),
            None => Ok(()),
        }
    }

    fn checkpoint_all(&mut self) -> Result<()> {
        self.settle()?;
        // A one-block file is simply sent again after a crash: syncing and
        // checkpointing each of thousands of small files would cost more
        // than it could save.
        let mut warnings = Vec::new();
        for (id, f) in self
            .files
            .present_mut()
            .filter(|(_, f)| f.layout.blocks() > 1)
        {
            if f.tracker.unsynced() > 0 && f.plain().is_some() {
                f.sync()?;
                match f.checkpoint(&self.shared.root) {
                    Ok(()) => {
                        f.has_checkpoint = true;
                        self.kept.set(id, f.layout.bytes_in(&f.tracker.durable()));
                    }
                    Err(e) => warnings.push(format!(
                        "checkpoint of {} not stored ({e}); a new session resumes it from its last stored checkpoint, or from the start",
                        f.dest.rel
                    )),
                }
            }
        }
        for w in warnings {
            self.warn(w);
        }
        Ok(())
    }

    /// The sender gave a file up: what it wrote is discarded, never
    /// published, and the file is answered as failed.
    fn abort(&mut self, file_id: u32, message: String) -> Result<()> {
        // Its writes in flight complete first: they refer to the file.
        self.drain()?;
        self.settle()?;
        self.reports.handle_given_up(file_id);
        let mut f = self.files.take(file_id).ok_or_else(|| {
            Error::from(Violation::new(
                ViolationKind::Unknown,
                format!("file {file_id} given up after its result, or never planned"),
            ))
        })?;
        if f.kind == EntryKind::File {
            self.kept.set(file_id, 0);
            f.discard(&self.shared.root)?;
        }
        tracing::warn!(path = %f.dest.rel, reason = %message, "the sender gave the file up");
        self.result(
            (file_id, f.identity),
            false,
            0,
            format!("{message}; the receiver discarded what it had of it"),
        )
    }

    /// Answers file `file_id`, whose entry here has `identity`.
    fn result(
        &mut self,
        (file_id, identity): (u32, u64),
        ok: bool,
        digest: u128,
        message: String,
    ) -> Result<()> {
        self.verdicts.answer(
            &self.stats,
            Some(&*self.shared.cfg.observer),
            Answer {
                file_id,
                ok,
                digest,
                identity,
                message,
            },
        );
        Ok(())
    }

    /// The entry this receiver was given for file `file_id`, `f`, is not the one the sender
    /// meant, `theirs` (its name, size or mode damaged on the way):
    /// whatever its data, it is not published under it. (A directory was
    /// created when planned; it keeps the receiver's default mode.)
    fn refuse_identity(&mut self, file_id: u32, mut f: DestFile, theirs: u64) -> Result<()> {
        if f.kind == EntryKind::File {
            self.kept.set(file_id, 0);
            f.discard(&self.shared.root)?;
        }
        let msg = format!(
            "{}: the file list entry this receiver holds (identity {:016x}) is not the one \
             the sender meant ({theirs:016x}); nothing was published under it, send it again",
            f.dest.rel, f.identity
        );
        tracing::error!("{msg}");
        self.result((file_id, f.identity), false, 0, msg)
    }

    /// Verifies and publishes finished files. Their data is made durable
    /// first (one fdatasync, or one syncfs per filesystem for many files),
    /// then they are renamed, then each directory is synced once, so a
    /// final name never points at data a crash could lose.
    fn finish(&mut self, batch: Vec<Reported>) -> Result<()> {
        self.settle()?;
        let shared = Arc::clone(&self.shared);
        let root = &shared.root;
        let mut ready = Vec::with_capacity(batch.len());
        for report in batch {
            let file_id = report.file_id;
            let sender_digest = report.digest;
            let mut f = self.files.take(file_id).ok_or_else(|| {
                Error::from(Violation::new(
                    ViolationKind::Unknown,
                    format!("file {file_id} reported done twice or never planned"),
                ))
            })?;
            self.reports.handle_answered(file_id);
            let id = (file_id, f.identity);
            if report.identity != f.identity {
                self.refuse_identity(file_id, *f, report.identity)?;
            } else if f.kind == EntryKind::Dir {
                let digest = if self.verify == Verification::None {
                    0
                } else {
                    f.tracker.digest()
                };
                f.set_dir_mode(root)?;
                self.result(id, true, digest, String::new())?;
            } else if !f.tracker.is_complete() {
                let msg = format!("{} is missing blocks; it stays resumable", f.dest.rel);
                if f.checkpoint(root).is_ok() {
                    self.kept
                        .set(file_id, f.layout.bytes_in(&f.tracker.durable()));
                } else if !f.has_checkpoint {
                    // Nothing could resume it: do not leave it behind.
                    let _ = f.discard(root);
                    self.kept.set(file_id, 0);
                }
                self.result(id, false, 0, msg)?;
            } else {
                f.open(root, false)?;
                ready.push((file_id, sender_digest, f));
            }
        }
        if let [(_, _, f)] = ready.as_mut_slice() {
            f.sync()?;
        } else if !ready.is_empty() {
            let mut synced = HashSet::new();
            for (_, _, f) in &mut ready {
                let plain = f.plain().expect("opened above");
                let dev = plain
                    .metadata()
                    .map_err(|e| Error::io(format!("inspecting {}", f.dest.rel), e))?
                    .dev();
                if synced.insert(dev) {
                    rustix::fs::syncfs(&**plain).map_err(|e| {
                        Error::io(
                            format!("syncing the filesystem of {}", f.dest.rel),
                            e.into(),
                        )
                    })?;
                }
                f.mark_synced();
            }
        }
        let mut published = Vec::with_capacity(ready.len());
        for (file_id, sender_digest, mut f) in ready {
            let digest = match self.verify {
                Verification::None => 0,
                Verification::Checksums => f.tracker.digest(),
                Verification::Reread => reread(&f)?,
            };
            if !digest_agrees(self.verify, digest, sender_digest) {
                self.kept.set(file_id, 0);
                f.discard(root)?;
                let msg = format!(
                    "{}: digest mismatch (received {}, sent {}); the data was discarded, send it again",
                    f.dest.rel,
                    fmt_digest(digest),
                    fmt_digest(sender_digest)
                );
                tracing::error!("{msg}");
                self.result((file_id, f.identity), false, digest, msg)?;
                continue;
            }
            f.rename_into_place(root)?;
            // From now on the server's published bytes count it.
            self.kept.set(file_id, 0);
            self.shared
                .job
                .published
                .fetch_add(f.layout.size, Ordering::Relaxed);
            published.push((file_id, digest, f));
        }
        let mut dirs = HashSet::new();
        for (_, _, f) in &published {
            if dirs.insert(f.dest.parent().to_string()) {
                f.sync_dir(root)?;
            }
        }
        for (file_id, digest, f) in published {
            self.result((file_id, f.identity), true, digest, String::new())?;
        }
        Ok(())
    }
}

/// The error that ends a session whose reported file's blocks stopped
/// coming: the sender hears it, and resumes from what is durable.
fn stalled(files: &Files, stall: Stall) -> Error {
    let what = match files.get(stall.file_id).and_then(Option::as_deref) {
        Some(f) => format!(
            "{}, reported sent, lacks {} of its {} blocks",
            f.dest.rel,
            f.tracker.missing(),
            f.layout.blocks()
        ),
        None => format!("file {} was reported sent, but lacks blocks", stall.file_id),
    };
    Error::Stalled(format!(
        "{what}, and no block has arrived for {:.0} s: the two sides disagree on what this \
         receiver holds",
        stall.quiet.as_secs_f64()
    ))
}

/// Whether a reported file can be answered now: it has all its blocks
/// (or is a directory). An unknown or already answered file also goes to
/// `finish`, which refuses it.
fn can_finish(files: &Files, file_id: u32) -> bool {
    files
        .get(file_id)
        .and_then(Option::as_deref)
        .is_none_or(|f| f.kind == EntryKind::Dir || f.tracker.is_complete())
}

impl Drop for Writer {
    /// However the writer ends (having run or not), the temporary files of
    /// its unfinished files that no checkpoint can resume go.
    fn drop(&mut self) {
        discard_unresumable(
            &self.shared.root,
            self.files.present_mut().map(|(_, f)| &mut **f),
        );
    }
}

/// Re-reads the written file from disk (not the page cache) and digests it.
fn reread(f: &DestFile) -> Result<u128> {
    let plain = f.plain().expect("opened before reread");
    // Written pages are clean after the sync: drop them so the reads
    // below come from the device.
    let _ = rustix::fs::fadvise(&**plain, 0, None, rustix::fs::Advice::DontNeed);
    let pool = Pool::new(f.layout.block_size as usize, 1)?;
    let mut buf = pool.try_get().expect("a new pool has a buffer");
    let mut sums = Vec::with_capacity(f.layout.blocks() as usize);
    for b in 0..f.layout.blocks() {
        let len = f.layout.len(b) as usize;
        let n = crate::io::read_full(plain, &mut buf.as_mut_full()[..len], f.layout.offset(b))
            .map_err(|e| Error::io(format!("re-reading {}", f.dest.rel), e))?;
        if n != len {
            return Err(Error::Verify {
                path: f.dest.rel.to_string(),
                detail: format!("block {b} is short on disk ({n} of {len} bytes)"),
            });
        }
        buf.set_len(len);
        sums.push(block_checksum(buf.as_slice()));
    }
    Ok(file_digest(&sums))
}
