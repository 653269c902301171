//! A session's writer: keeps `queue_depth` writes in flight at each block's
//! offset, acknowledges blocks once written, checkpoints durable blocks,
//! and verifies and publishes finished files. What to do with each file
//! (write or drop a block, when to checkpoint and what, when a reported
//! file may be verified and published) is `session::lifecycle`'s to
//! decide; this carries it out.

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
use crate::digest::{block_checksum, file_digest, fmt_digest};
use crate::error::{Error, Result};
use crate::io::{ALIGN, BlockIo, IoDone, IoMode, IoOp, OpKind, Pool, backend};
use crate::session::lifecycle::{
    BlockFate, COMMIT_BATCH, CheckpointJob, FileLifecycle, Finish, Planned,
};
use crate::session::reports::{Reported, Stall};
use crate::violation::{Violation, ViolationKind};
use crate::wire::{EntryKind, Frame, StripeRole, Verification};

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
    /// What to do with each file, decided with no I/O.
    core: FileLifecycle,
    checkpointer: Checkpointer,
    /// A message taken while gathering finished files, handled next.
    lookahead: Option<WriterMsg>,
    warnings: Vec<String>,
    /// The directories of the session's manifest, whose modification
    /// times (and, where the send keeps them, owners and attributes) are
    /// set once nothing more is written into them (`finish_dirs`).
    dirs: Vec<DestFile>,
    /// What a new session would keep, shown as the transfer's progress.
    kept: Kept,
    /// `Stats::arriving` when last looked at.
    arrived: u64,
    /// The session's part in a transfer over several pairs: its temporary
    /// files are shared, so it never removes one, and only a `Publish`
    /// session publishes.
    stripe: Option<StripeRole>,
    /// The blocks `first..end` a stripe session writes of each file.
    pieces: HashMap<u32, (u64, u64)>,
}

/// A file verified and made durable, to publish or discard: its id, the
/// sender's digest, the digest of its written checksums, the file, and
/// (for a piece of a shared file) its block checksums.
type Ready = (u32, u128, u128, Box<DestFile>, Vec<u64>);

/// The error for a block or report of a file this writer does not hold.
fn unknown(what: String) -> Error {
    Error::from(Violation::new(ViolationKind::Unknown, what))
}

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
        let checkpointer = Checkpointer::start(Arc::clone(&shared))?;
        let (files, mut resumed) = files.into_files();
        let mut kept = Kept::new(Arc::clone(&stats));
        for (&file_id, r) in &resumed {
            if let Some(f) = files.get(file_id).and_then(Option::as_deref) {
                kept.set(file_id, f.layout.bytes_in(&r.0));
            }
        }
        // Straight from the table, with no list of a million in between.
        let planned = files.iter().filter_map(|(file_id, f)| {
            let f = f.as_deref()?;
            Some(Planned {
                file_id,
                blocks: f.layout.blocks(),
                dir: f.kind == EntryKind::Dir,
                identity: f.identity,
                resumed: resumed.remove(&file_id).map(|r| *r),
            })
        });
        let core = FileLifecycle::new(
            planned,
            verify,
            shared.cfg.checkpoint_interval,
            shared.cfg.idle_timeout,
            Instant::now(),
        );
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
            core,
            checkpointer,
            lookahead: None,
            warnings: Vec::new(),
            dirs: Vec::new(),
            kept,
            arrived: 0,
            stripe: None,
            pieces: HashMap::new(),
        })
    }

    /// The writer of a session that is part of a transfer over several
    /// pairs, in `role` (see `receiver::stripe`), writing blocks
    /// `first..end` of each file by id.
    pub(crate) fn in_stripe(
        mut self,
        role: Option<StripeRole>,
        pieces: HashMap<u32, (u64, u64)>,
    ) -> Self {
        self.stripe = role;
        if matches!(role, Some(StripeRole::Mark | StripeRole::Write)) {
            self.core.keep_checksums();
        }
        self.pieces = pieces;
        self
    }

    /// Records the piece of `f` this session wrote, durable and checked,
    /// as a per-chunk checkpoint (`receiver::pieces`). Not recorded, it
    /// costs only its resending by a later attempt.
    fn record_piece(&mut self, file_id: u32, f: &DestFile, checksums: &[u64]) {
        // Unverified, the checksums are 0 and no block could be confirmed.
        if self.verify == Verification::None {
            return;
        }
        let Some(&(first, end)) = self.pieces.get(&file_id) else {
            return;
        };
        let Some(sums) = checksums.get(first as usize..end as usize) else {
            return;
        };
        if sums.len() < 2 {
            return;
        }
        let recorded = f.record_piece(&self.shared.root, first, sums);
        if let Err(e) = recorded {
            self.warn(format!(
                "the per-chunk checkpoint of {} was not stored ({e}); the transfer goes on, and a new attempt would send the piece again",
                f.dest.rel
            ));
        }
    }

    /// Drops the per-chunk checkpoints of `f`, whose piece did not match.
    fn forget_pieces(&mut self, f: &DestFile) {
        if self.shares_files()
            && let Err(e) = f.forget_pieces(&self.shared.root)
        {
            self.warn(format!(
                "the per-chunk checkpoints of {} were not removed ({e})",
                f.dest.rel
            ));
        }
    }

    /// Whether the files' temporary files are other receivers' too, and
    /// are left for the transfer to publish or remove.
    fn shares_files(&self) -> bool {
        self.stripe.is_some()
    }

    /// Removes `f`'s temporary file, unless other receivers share it.
    fn discard_own(&self, f: &mut DestFile) -> Result<()> {
        if self.shares_files() {
            return Ok(());
        }
        f.discard(&self.shared.root)
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
        self.finish_dirs();
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
            let msg = self.next_msg();
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
                Some(WriterMsg::FileDone(report)) => self.reported(report)?,
                Some(WriterMsg::Abort { file_id, message }) => self.abort(file_id, message)?,
                // Files still held for a group commit stay unpublished: a
                // stopped session can no longer tell the sender, who would
                // send them again, or, in a transfer over several pairs,
                // hand their publish to a receiver that finds no temporary
                // file.
                Some(WriterMsg::Stop) => return Ok(()),
                None if self.io.in_flight() > 0 => self.reap(true)?,
                None => {}
            }
            self.reap(false)?;
            // Small files are committed together while blocks keep
            // coming; once they stop, nothing is held back.
            self.finish_awaited(idle)?;
            self.check_progress(idle)?;
            self.maybe_checkpoint()?;
        }
    }

    /// The next message: waits for one only when nothing is being written,
    /// and no longer than until a checkpoint or a stall is due.
    fn next_msg(&mut self) -> Option<WriterMsg> {
        if let Some(m) = self.lookahead.take() {
            return Some(m);
        }
        if self.io.in_flight() == 0 {
            let wait = self
                .core
                .poll_timeout()
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
        }
    }

    /// Gives each directory of the session its source's modification
    /// time (and what else the send keeps), deepest first: publishing
    /// into a directory changes its time,
    /// and so does setting a child's. Files a later session lands in one
    /// (after a reconnect) change it again.
    fn finish_dirs(&mut self) {
        let mut dirs = std::mem::take(&mut self.dirs);
        dirs.sort_by_key(|d| std::cmp::Reverse(d.dest.rel.matches('/').count()));
        for d in dirs {
            d.finish_dir(&self.shared.root);
        }
    }

    /// The sender reported a file done: it is answered once its blocks are
    /// all written. The files that finished together (a tree of small
    /// files finishes many at a time) are gathered, to be made durable
    /// together.
    fn reported(&mut self, report: Reported) -> Result<()> {
        let mut batch = vec![report];
        while batch.len() < COMMIT_BATCH {
            match self.rx.try_recv() {
                Ok(WriterMsg::FileDone(report)) => batch.push(report),
                Ok(other) => {
                    self.lookahead = Some(other);
                    break;
                }
                Err(_) => break,
            }
        }
        let now = Instant::now();
        for report in batch {
            self.create_if_empty(report.file_id)?;
            self.core.handle_reported(report, now);
        }
        Ok(())
    }

    /// Makes the temporary file of an empty file created on write, which
    /// no block will ever make, as its report arrives: one that cannot be
    /// made fails alone, as a one-block file's does (`not_created`).
    fn create_if_empty(&mut self, file_id: u32) -> Result<()> {
        let Some(f) = self.files.get_mut(file_id).and_then(Option::as_deref_mut) else {
            return Ok(());
        };
        if !f.is_created_on_write() || f.layout.blocks() > 0 {
            return Ok(());
        }
        match f.open(&self.shared.root, false) {
            Ok(_) => Ok(()),
            Err(e) if e.concerns_one_file() => {
                self.not_created(file_id, &e);
                Ok(())
            }
            Err(e) => Err(e),
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
            self.core.handle_arrived(now);
        }
        if !idle {
            return Ok(());
        }
        let Some(stall) = self.core.poll_stalled(now) else {
            return Ok(());
        };
        Err(stalled(&self.files, &self.core, stall))
    }

    /// Answers the reported files whose blocks have all been written, as
    /// the core says when (`flush`: now).
    fn finish_awaited(&mut self, flush: bool) -> Result<()> {
        let ready = self.core.poll_finish(Instant::now(), flush);
        if ready.is_empty() {
            return Ok(());
        }
        self.drain()?;
        self.verdicts.hold();
        let finished = self.finish(ready);
        self.verdicts.release();
        finished?;
        // Its syncs and re-reads took the writer's time, not the sender's.
        self.core.handle_arrived(Instant::now());
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
        match self.core.handle_block(file_id) {
            BlockFate::Write => {}
            BlockFate::Drop => {
                let _ = ack.send(Frame::Ack { file_id, block });
                return Ok(());
            }
            BlockFate::Unknown => {
                return Err(unknown(format!(
                    "block for finished or unknown file {file_id}"
                )));
            }
        }
        let want_direct = self.mode.wants_direct();
        let f = self
            .files
            .get_mut(file_id)
            .and_then(Option::as_deref_mut)
            .ok_or_else(|| Error::Internal(format!("file {file_id} is held but not open")))?;
        let created_here = f.is_created_on_write();
        match f.open(&self.shared.root, want_direct) {
            Ok(None) => {}
            Ok(Some(note)) => {
                if self.fallback.is_none() {
                    tracing::warn!("{note}");
                    self.fallback = Some(note);
                }
            }
            Err(e) if created_here && e.concerns_one_file() => {
                self.not_created(file_id, &e);
                let _ = ack.send(Frame::Ack { file_id, block });
                return Ok(());
            }
            Err(e) => return Err(e),
        }
        let f = self
            .files
            .get_mut(file_id)
            .and_then(Option::as_deref_mut)
            .expect("opened above");
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

    /// The temporary file of `file_id`, made when its data arrived, could
    /// not be made (`e`, which `Error::concerns_one_file`): the file fails
    /// alone, as it would have had the plan refused it. (A failed creation
    /// leaves nothing on disk; a file made whose O_DIRECT open then failed
    /// goes when it is answered.)
    fn not_created(&mut self, file_id: u32, e: &Error) {
        if let Some(f) = self.files.get(file_id).and_then(Option::as_deref) {
            tracing::warn!(path = %f.dest.rel, "refused: {e}");
        }
        self.core.handle_not_created(file_id, &e.to_string());
    }

    fn complete(&mut self, p: Pending, len: usize, result: std::io::Result<usize>) -> Result<()> {
        if let Err(e) = result {
            self.core.handle_write_failed(p.file_id);
            let rel = self
                .files
                .get(p.file_id)
                .and_then(Option::as_deref)
                .map_or_else(|| format!("file {}", p.file_id), |f| f.dest.rel.to_string());
            return Err(Error::disk(
                format!(
                    "writing block {} of {rel}; free space there (the sender retries for its --retry-for)",
                    p.block
                ),
                e,
            ));
        }
        self.core
            .handle_written(p.file_id, p.block, p.checksum, Instant::now());
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
        if self.checkpointer.busy() {
            return Ok(());
        }
        let Some(batch) = self.core.poll_checkpoint(Instant::now()) else {
            return Ok(());
        };
        // No drain and no sync here: the checkpoint thread syncs what was
        // written when the batch was made, while the writes in flight and
        // those that follow keep the disk busy.
        let batch = batch
            .into_iter()
            .map(|job| self.job(job))
            .collect::<Result<Vec<Job>>>()?;
        if !batch.is_empty() {
            self.checkpointer.submit(batch)?;
        }
        Ok(())
    }

    /// What the checkpoint thread needs to carry out `job`.
    fn job(&self, job: CheckpointJob) -> Result<Job> {
        let CheckpointJob {
            file_id,
            covered,
            durable,
            checksums,
        } = job;
        // A file with unsynced blocks was written, so it is open.
        let f = self
            .files
            .get(file_id)
            .and_then(Option::as_deref)
            .filter(|f| f.plain().is_some())
            .ok_or_else(|| Error::Internal(format!("file {file_id} to checkpoint is not open")))?;
        Ok(Job {
            file_id,
            file: Arc::clone(f.plain().expect("checked above")),
            rel: f.dest.rel.to_string(),
            parent: f.dest.parent().to_string(),
            ckpt_name: f.dest.ckpt_name(),
            part_name: f.dest.part_name(),
            checkpoint: f.record(durable, checksums),
            covered,
            // A shared temporary file has no checkpoint of one receiver's.
            store: !self.shares_files(),
        })
    }

    /// Marks what a finished background checkpoint made durable.
    fn apply(&mut self, done: Done) -> Result<()> {
        let batch = match done {
            Ok(batch) => batch,
            Err(e) => {
                self.core.handle_checkpoint_failed();
                return Err(e);
            }
        };
        for file_id in self.core.handle_checkpointed(batch.synced) {
            self.update_kept(file_id);
        }
        for w in batch.warnings {
            self.warn(w);
        }
        Ok(())
    }

    /// `file_id` keeps what its latest stored checkpoint records.
    fn update_kept(&mut self, file_id: u32) {
        let f = self.files.get(file_id).and_then(Option::as_deref);
        if let (Some(f), Some(durable)) = (f, self.core.durable(file_id)) {
            self.kept.set(file_id, f.layout.bytes_in(&durable));
        }
    }

    /// Waits for a background checkpoint, so that nothing stores a
    /// checkpoint behind a file that is being published or discarded.
    fn settle(&mut self) -> Result<()> {
        match self.checkpointer.poll(true) {
            Some(done) => self.apply(done),
            None => Ok(()),
        }
    }

    /// Syncs and checkpoints what the core says a new session should
    /// keep, as the session ends.
    fn checkpoint_all(&mut self) -> Result<()> {
        self.settle()?;
        let mut warnings = Vec::new();
        for id in self.core.poll_wind_down() {
            let Some(f) = self.files.get(id).and_then(Option::as_deref) else {
                continue;
            };
            if f.plain().is_none() {
                continue;
            }
            f.sync()?;
            if self.shares_files() {
                continue;
            }
            let Some(record) = self.core.handle_synced(id) else {
                continue;
            };
            match f.checkpoint(&self.shared.root, record) {
                Ok(()) => {
                    self.core.handle_checkpoint_stored(id);
                    self.update_kept(id);
                }
                Err(e) => warnings.push(format!(
                    "checkpoint of {} not stored ({e}); a new session resumes it from its last stored checkpoint, or from the start",
                    f.dest.rel
                )),
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
        let held = self.core.handle_given_up(file_id);
        let mut f = self.files.take(file_id).filter(|_| held).ok_or_else(|| {
            unknown(format!(
                "file {file_id} given up after its result, or never planned"
            ))
        })?;
        if f.kind == EntryKind::File {
            self.kept.set(file_id, 0);
            self.discard_own(&mut f)?;
        }
        tracing::warn!(path = %f.dest.rel, reason = %message, "the sender gave the file up");
        self.result(
            (file_id, f.identity),
            false,
            0,
            format!("{message}; the receiver discarded what it had of it"),
        );
        Ok(())
    }

    /// Answers file `file_id`, whose entry here has `identity`.
    fn result(&mut self, (file_id, identity): (u32, u64), ok: bool, digest: u128, message: String) {
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
    }

    /// The entry this receiver was given for file `file_id`, `f`, is not the one the sender
    /// meant, `theirs` (its name, size or mode damaged on the way):
    /// whatever its data, it is not published under it. (A directory was
    /// created when planned; it keeps the receiver's default mode.)
    fn refuse_identity(&mut self, file_id: u32, mut f: DestFile, theirs: u64) -> Result<()> {
        if f.kind == EntryKind::File {
            self.kept.set(file_id, 0);
            self.discard_own(&mut f)?;
        }
        let msg = format!(
            "{}: the file list entry this receiver holds (identity {:016x}) is not the one \
             the sender meant ({theirs:016x}); nothing was published under it, send it again",
            f.dest.rel, f.identity
        );
        tracing::error!("{msg}");
        self.result((file_id, f.identity), false, 0, msg);
        Ok(())
    }

    /// Carries out what the core decided for finished files: refuses,
    /// answers directories, and verifies and publishes the rest.
    fn finish(&mut self, batch: Vec<Finish>) -> Result<()> {
        self.settle()?;
        let mut ready = Vec::with_capacity(batch.len());
        for decision in batch {
            let report = match &decision {
                Finish::Unknown(r)
                | Finish::WrongIdentity { report: r, .. }
                | Finish::NotCreated { report: r, .. }
                | Finish::Dir { report: r, .. }
                | Finish::Verify { report: r, .. } => *r,
            };
            let file_id = report.file_id;
            let taken = match decision {
                Finish::Unknown(_) => None,
                _ => self.files.take(file_id),
            };
            let mut f = taken.ok_or_else(|| {
                unknown(format!(
                    "file {file_id} reported done twice or never planned"
                ))
            })?;
            match decision {
                Finish::Unknown(_) => {}
                Finish::WrongIdentity { report, .. } => {
                    self.refuse_identity(file_id, *f, report.identity)?;
                }
                Finish::NotCreated { message, .. } => {
                    // Nothing of it is on disk, unless it was made and then
                    // failed to open for direct I/O.
                    self.discard_own(&mut f)?;
                    self.result((file_id, f.identity), false, 0, message);
                }
                Finish::Dir { digest, .. } => {
                    f.set_dir_mode(&self.shared.root)?;
                    self.result((file_id, f.identity), true, digest, String::new());
                    self.dirs.push(*f);
                }
                Finish::Verify {
                    report,
                    checksums_digest,
                    checksums,
                    ..
                } => {
                    // Every file is made by now: by the plan, by its block,
                    // or (empty) as it was reported.
                    f.open(&self.shared.root, false)?;
                    ready.push((file_id, report.digest, checksums_digest, f, checksums));
                }
            }
        }
        make_durable(&mut ready)?;
        self.publish(ready)
    }

    /// Verifies files made durable, and publishes those whose digest is
    /// the sender's; then each directory is synced once, so a final name
    /// never points at data a crash could lose.
    fn publish(&mut self, ready: Vec<Ready>) -> Result<()> {
        let shared = Arc::clone(&self.shared);
        let root = &shared.root;
        let mut published = Vec::with_capacity(ready.len());
        for (file_id, sender_digest, checksums_digest, mut f, checksums) in ready {
            let digest = match self.verify {
                Verification::None => 0,
                Verification::Checksums => checksums_digest,
                Verification::Reread => match self.stripe {
                    None => reread(&f, None)?,
                    Some(StripeRole::Mark | StripeRole::Write) => {
                        let piece = self.pieces.get(&file_id).copied().unwrap_or((0, 0));
                        reread(&f, Some(piece))?
                    }
                    // Each piece was re-read as it landed; the blocks count
                    // as 0 on both sides here.
                    Some(_) => checksums_digest,
                },
            };
            if !self.core.may_publish(digest, sender_digest) {
                self.kept.set(file_id, 0);
                self.discard_own(&mut f)?;
                // A resumed block may be what disagrees: the next attempt
                // starts the file's pieces over.
                self.forget_pieces(&f);
                let msg = format!(
                    "{}: digest mismatch (received {}, sent {}); the data was discarded, send it again",
                    f.dest.rel,
                    fmt_digest(digest),
                    fmt_digest(sender_digest)
                );
                tracing::error!("{msg}");
                self.result((file_id, f.identity), false, digest, msg);
                continue;
            }
            if matches!(self.stripe, Some(StripeRole::Mark | StripeRole::Write)) {
                // A piece: durable, checked, and left for the transfer to
                // publish once every piece is.
                self.kept.set(file_id, 0);
                self.record_piece(file_id, &f, &checksums);
                self.result((file_id, f.identity), true, digest, String::new());
                continue;
            }
            if self.stripe.is_some() {
                // Before the name goes: records left beside a published
                // file could only be read back as not confirmed, but they
                // would never be removed.
                self.forget_pieces(&f);
            }
            match f.rename_into_place(root) {
                Ok(()) => {}
                Err(e @ Error::PathRefused { .. }) => {
                    // A directory took its name since it was planned (or,
                    // for a file created on write, was never looked for).
                    self.kept.set(file_id, 0);
                    self.discard_own(&mut f)?;
                    tracing::warn!(path = %f.dest.rel, "refused: {e}");
                    self.result((file_id, f.identity), false, 0, e.to_string());
                    continue;
                }
                Err(e) => return Err(e),
            }
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
            self.result((file_id, f.identity), true, digest, String::new());
        }
        Ok(())
    }
}

/// Makes the data of finished files durable before any is renamed: one
/// fdatasync for one file; for many, one syncfs per filesystem where
/// syncfs is known to report writeback errors (see
/// `caps::syncfs_trusted`), else fdatasync for each.
fn make_durable(ready: &mut [Ready]) -> Result<()> {
    if let [(_, _, _, f, _)] = ready {
        return f.sync();
    }
    // By device: whether its syncfs may stand for the files' syncs, and
    // whether it has been called.
    let mut devices: HashMap<u64, (bool, bool)> = HashMap::new();
    for (_, _, _, f, _) in ready {
        let plain = f.plain().expect("opened before");
        let dev = plain
            .metadata()
            .map_err(|e| Error::io(format!("inspecting {}", f.dest.rel), e))?
            .dev();
        let (trusted, synced) = devices.entry(dev).or_insert_with(|| {
            let fs = crate::io::caps::fs_type(&**plain);
            (crate::io::caps::syncfs_trusted(fs), false)
        });
        if !*trusted {
            f.sync()?;
        } else if !*synced {
            rustix::fs::syncfs(&**plain).map_err(|e| {
                Error::io(
                    format!("syncing the filesystem of {}", f.dest.rel),
                    e.into(),
                )
            })?;
            *synced = true;
        }
    }
    Ok(())
}

/// The error that ends a session whose reported file's blocks stopped
/// coming: the sender hears it, and resumes from what is durable.
fn stalled(files: &Files, core: &FileLifecycle, stall: Stall) -> Error {
    let file = files.get(stall.file_id).and_then(Option::as_deref);
    let what = match (file, core.missing(stall.file_id)) {
        (Some(f), Some(missing)) => format!(
            "{}, reported sent, lacks {missing} of its {} blocks",
            f.dest.rel,
            f.layout.blocks()
        ),
        _ => format!("file {} was reported sent, but lacks blocks", stall.file_id),
    };
    Error::Stalled(format!(
        "{what}, and no block has arrived for {:.0} s: the two sides disagree on what this \
         receiver holds",
        stall.quiet.as_secs_f64()
    ))
}

impl Drop for Writer {
    /// However the writer ends (having run or not), the temporary files of
    /// its unfinished files that no checkpoint can resume go.
    fn drop(&mut self) {
        if self.shares_files() {
            return;
        }
        let core = &self.core;
        discard_unresumable(
            &self.shared.root,
            self.files
                .present_mut()
                .map(|(id, f)| (&mut **f, core.is_resumable(id))),
        );
    }
}

/// Re-reads the written file from disk (not the page cache) and digests
/// it; of a piece, blocks `first..end` (`piece`), the others counting as
/// 0 as in the piece's session.
fn reread(f: &DestFile, piece: Option<(u64, u64)>) -> Result<u128> {
    let plain = f.plain().expect("opened before reread");
    // Written pages are clean after the sync: drop them so the reads
    // below come from the device.
    let _ = rustix::fs::fadvise(&**plain, 0, None, rustix::fs::Advice::DontNeed);
    let pool = Pool::new(f.layout.block_size as usize, 1)?;
    let mut buf = pool.try_get().expect("a new pool has a buffer");
    let mut sums = Vec::with_capacity(f.layout.blocks() as usize);
    for b in 0..f.layout.blocks() {
        if piece.is_some_and(|(first, end)| !(first..end).contains(&b)) {
            sums.push(0);
            continue;
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest::entry_identity;
    use crate::receiver::dest::{Prepared, prepare};
    use crate::receiver::verdicts::{VerdictRx, channel};
    use crate::receiver::{ServeConfig, Server};
    use crate::session::Verdict;

    /// Runs a writer for one finished one-block file beneath `root`, and
    /// stops it at once (`stop_at_once`) or once it has gone idle; returns
    /// whether the file was answered as published, and whether it is
    /// there under its final name.
    fn run_writer(root: &std::path::Path, stop_at_once: bool) -> (bool, bool) {
        let mut cfg = ServeConfig::new(root.to_path_buf(), vec![0; 32]);
        // Written as it arrives: nothing in flight decides the outcome.
        cfg.io_mode = IoMode::Buffered;
        let server = Server::bind("127.0.0.1:0", cfg).unwrap();
        let shared = Arc::clone(&server.shared);
        let e = crate::wire::FileEntry {
            file_id: 0,
            kind: EntryKind::File,
            size: 3,
            fingerprint: 1,
            mode: 0o644,
            mtime: (0, 0),
            digest: None,
            meta: None,
            path: "f".into(),
        };
        let identity = entry_identity(&e);
        let Prepared::Accept(mut file, _, resumed) = prepare(&shared.root, &e, 4096, 0o022) else {
            panic!("not prepared");
        };
        file.identity = identity;
        let mut staged = Staged::with_capacity(&shared.root, 1);
        staged.insert(0, file, resumed);
        let (tx, rx) = mpsc::channel();
        let (verdicts_tx, verdicts) = channel().unwrap();
        let stats = Arc::new(Stats::default());
        let writer = Writer::new(
            Arc::clone(&shared),
            staged,
            rx,
            verdicts_tx,
            Verification::Checksums,
            stats,
        )
        .unwrap();
        let pools = crate::io::Pools::new(4096, 1).unwrap();
        let mut buf = pools.for_len(3).try_get().unwrap();
        buf.as_mut_full()[..3].copy_from_slice(b"abc");
        buf.set_len(3);
        let checksum = block_checksum(b"abc");
        let (ack, _acks) = mpsc::sync_channel(4);
        let block = WriterMsg::Block {
            file_id: 0,
            block: 0,
            buf,
            checksum,
            ack,
        };
        tx.send(block).unwrap();
        let done = Reported {
            file_id: 0,
            digest: file_digest(&[checksum]),
            identity,
        };
        tx.send(WriterMsg::FileDone(done)).unwrap();
        let mut published = false;
        std::thread::scope(|s| {
            let w = s.spawn(move || writer.run());
            if !stop_at_once {
                let deadline = Instant::now() + Duration::from_secs(10);
                while !published && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(5));
                    published |= answered_ok(&verdicts);
                }
            }
            tx.send(WriterMsg::Stop).unwrap();
            w.join().unwrap();
        });
        published |= answered_ok(&verdicts);
        (published, root.join("f").exists())
    }

    fn answered_ok(verdicts: &VerdictRx) -> bool {
        verdicts
            .take()
            .iter()
            .any(|v| matches!(v, Verdict::File { ok: true, .. }))
    }

    /// A session that stops while a finished small file waits for its
    /// group commit leaves it unpublished: no answer can reach the sender
    /// any more, and a file published behind its back would be sent
    /// again or, in a transfer over several pairs, fail when the next
    /// receiver finds its temporary file gone.
    #[test]
    fn a_stopped_session_publishes_nothing_it_cannot_answer() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(run_writer(dir.path(), true), (false, false));
        // The same file, left to go idle, is committed and answered.
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(run_writer(dir.path(), false), (true, true));
    }
}
