//! The receiver writer's per-file decisions, with no I/O: which blocks to
//! write and which to acknowledge and drop, when a background checkpoint
//! is due and what it may record, when a reported file may be verified and
//! published, whether it may, what a session that winds down syncs and
//! checkpoints, and which temporary files a new session could resume.
//!
//! The writer shell (`receiver::writer`) feeds it events (a block arrived,
//! a write completed, a sync finished, a file's temporary file could not be
//! made, the sender reported a file) and
//! carries out what it polls, passing `now` in; the seeded simulation
//! (`engine/tests/simulation.rs`) drives the same machine over a simulated
//! disk.
//!
//! A file's state lives here from the plan until it is answered (published
//! or failed), then it is gone: a block of it that still arrives (a copy
//! the sender resent after a stream broke) is acknowledged and dropped.

use std::borrow::Cow;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::by_id::ById;
use crate::session::reports::{Reported, Reports, Stall, digest_agrees};
use crate::wire::Verification;
use crate::{Bitmap, CheckpointPolicy, FileTracker};

/// A file of the plan, as the writer starts.
#[derive(Debug, Clone)]
pub struct Planned {
    /// Its id in the session.
    pub file_id: u32,
    /// How many blocks it has (0 for a directory).
    pub blocks: u64,
    /// A directory: created when planned, answered once reported.
    pub dir: bool,
    /// `digest::entry_identity` of the entry this receiver holds.
    pub identity: u64,
    /// What its stored checkpoint recorded: durable blocks and checksums.
    pub resumed: Option<(Bitmap, Vec<u64>)>,
}

/// What becomes of a block that arrived intact.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockFate {
    /// Write it, then report the write with `handle_written`.
    Write,
    /// Its file is answered: acknowledge it and drop it.
    Drop,
    /// No such file in the plan: the sender broke the protocol.
    Unknown,
}

/// One file a background checkpoint covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointJob {
    /// Which file.
    pub file_id: u32,
    /// The blocks written when the batch was made: the sync must cover
    /// them (fdatasync the file) before the record is stored.
    pub covered: Bitmap,
    /// What the checkpoint records: the blocks durable once `covered` is.
    pub durable: Bitmap,
    /// The checksums by block that go with it.
    pub checksums: Vec<u64>,
}

/// What to do with a reported file whose blocks are all written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finish {
    /// Reported twice, or never planned: the sender broke the protocol.
    Unknown(Reported),
    /// The sender meant another entry than the one held here (a name,
    /// size or mode damaged on the way): discard what was written, and
    /// answer it as failed.
    WrongIdentity {
        /// The sender's report.
        report: Reported,
        /// The identity of the entry held here.
        ours: u64,
    },
    /// Its temporary file could not be made when its data arrived (see
    /// `handle_not_created`): nothing of it is on disk; answer it as
    /// failed, with why.
    NotCreated {
        /// The sender's report.
        report: Reported,
        /// Why, for the sender.
        message: String,
    },
    /// A directory: give it its mode and answer it, with this digest.
    Dir {
        /// The sender's report.
        report: Reported,
        /// The digest to answer with.
        digest: u128,
    },
    /// A file with every block written: make it durable, digest it (from
    /// `checksums_digest`, or by re-reading), ask `may_publish`, and
    /// publish it or discard it.
    Verify {
        /// The sender's report.
        report: Reported,
        /// The digest of the checksums of the blocks written.
        checksums_digest: u128,
        /// Its blocks.
        blocks: u64,
        /// The checksums of its blocks, where the shell asked for them
        /// (`keep_checksums`); else empty.
        checksums: Vec<u64>,
    },
}

/// Small files finished within this long of the first of them are made
/// durable and published together: one filesystem sync and one directory
/// sync for the lot, where one each per file held a tree of small files
/// to the disk's sync latency. A file waits at most this long for its
/// answer (the writer sees that nothing is arriving only when its wait,
/// bounded by this deadline, times out).
pub const COMMIT_HOLD: Duration = Duration::from_millis(20);
/// Files committed together, at most.
pub const COMMIT_BATCH: usize = 1024;

/// A finished file worth holding for a group commit: one of at most one
/// block, whose own sync costs about as much as a sync of many.
fn is_small(f: &Finish) -> bool {
    match f {
        Finish::Verify { blocks, .. } => *blocks <= 1,
        _ => true,
    }
}

/// Whether a file of `blocks` blocks is ever checkpointed: a one-block
/// file is simply sent again after a crash, as syncing and checkpointing
/// each of thousands of small files would cost more than it could save.
/// So it has nothing to resume, and the receiver makes its temporary file
/// only when its data arrives (`receiver::dest`).
pub fn is_checkpointed(blocks: u64) -> bool {
    blocks > 1
}

/// One file's state while the session writes it.
#[derive(Debug)]
struct Landing {
    tracker: FileTracker,
    identity: u64,
    dir: bool,
    /// A checkpoint of it is stored (loaded or written), so what was
    /// written can be resumed.
    has_checkpoint: bool,
    /// Writes submitted and not completed: a file is verified only once
    /// none is left, since a resent copy may still be landing.
    in_flight: u32,
    /// Its temporary file could not be made (`handle_not_created`): its
    /// blocks are acknowledged and dropped, and its report answered as
    /// failed.
    not_created: bool,
}

/// The writer's per-file state machine.
#[derive(Debug)]
pub struct FileLifecycle {
    files: ById<Option<Landing>>,
    reports: Reports,
    policy: CheckpointPolicy,
    /// A background checkpoint is running: one batch at a time.
    syncing: bool,
    verify: Verification,
    /// Finished small files waiting to be committed together, and when
    /// the first of them finished.
    commit: Vec<Finish>,
    commit_since: Option<Instant>,
    /// Finished files carry their block checksums (`Finish::Verify`).
    keep_checksums: bool,
    /// Why each file whose temporary file could not be made was not, until
    /// it is answered: most sessions have none, so the reason is kept here
    /// rather than in every `Landing`.
    why_not_created: HashMap<u32, String>,
}

impl FileLifecycle {
    /// Finished files carry their block checksums: a piece of a shared
    /// file records them as its per-chunk checkpoint.
    pub fn keep_checksums(&mut self) {
        self.keep_checksums = true;
    }

    /// A writer for `files`, which checkpoints at most every `interval`
    /// and gives a waiting report `progress_timeout` of quiet.
    pub fn new(
        files: impl IntoIterator<Item = Planned>,
        verify: Verification,
        interval: Duration,
        progress_timeout: Duration,
        now: Instant,
    ) -> Self {
        let files = files.into_iter();
        // Sized once for the whole plan, which may list a million files:
        // grown by doubling, it would leave its outgrown copies behind.
        let mut table = Vec::with_capacity(files.size_hint().1.unwrap_or(0));
        table.extend(files.map(|p| {
            let has_checkpoint = p.resumed.is_some();
            let landing = Landing {
                tracker: FileTracker::new(p.blocks, p.resumed),
                identity: p.identity,
                dir: p.dir,
                has_checkpoint,
                in_flight: 0,
                not_created: false,
            };
            (p.file_id, Some(landing))
        }));
        Self {
            files: table.into_iter().collect(),
            reports: Reports::new(progress_timeout),
            policy: CheckpointPolicy::new(now, interval),
            syncing: false,
            verify,
            commit: Vec::new(),
            commit_since: None,
            keep_checksums: false,
            why_not_created: HashMap::new(),
        }
    }

    fn get(&self, file_id: u32) -> Option<&Landing> {
        self.files.get(file_id).and_then(Option::as_ref)
    }

    fn get_mut(&mut self, file_id: u32) -> Option<&mut Landing> {
        self.files.get_mut(file_id).and_then(Option::as_mut)
    }

    /// An intact block of `file_id` arrived: whether to write it. A
    /// `Write` counts as in flight until `handle_written` or
    /// `handle_write_failed`.
    pub fn handle_block(&mut self, file_id: u32) -> BlockFate {
        if self.reports.is_answered(file_id) {
            return BlockFate::Drop;
        }
        match self.get_mut(file_id) {
            Some(f) if f.not_created => BlockFate::Drop,
            Some(f) => {
                f.in_flight += 1;
                BlockFate::Write
            }
            None => BlockFate::Unknown,
        }
    }

    /// The temporary file of `file_id`, made when its first block is
    /// written (a file of one block, with nothing to resume), could not be
    /// made, for `why`: the write counted by `handle_block` is not made.
    /// The file fails alone, as it would have had the plan refused it:
    /// its blocks are acknowledged and dropped, and once the sender
    /// reports it, it is answered as failed (`Finish::NotCreated`). The
    /// session goes on with the others.
    pub fn handle_not_created(&mut self, file_id: u32, why: &str) {
        if let Some(f) = self.get_mut(file_id) {
            f.in_flight = f.in_flight.saturating_sub(1);
            f.not_created = true;
            self.why_not_created.insert(file_id, why.to_string());
        }
    }

    /// Block data arrived at `now` (progress, for a waiting report).
    pub fn handle_arrived(&mut self, now: Instant) {
        self.reports.handle_progress(now);
    }

    /// A write of `block` of `file_id`, whose checksum is `checksum`,
    /// completed at `now`: acknowledge it.
    pub fn handle_written(&mut self, file_id: u32, block: u64, checksum: u64, now: Instant) {
        if let Some(f) = self.get_mut(file_id) {
            f.in_flight = f.in_flight.saturating_sub(1);
            f.tracker.handle_written(block, checksum);
        }
        self.reports.handle_progress(now);
    }

    /// A write of `file_id` failed. The session ends (the shell says how:
    /// no space is retried, other errors are not); what is durable and
    /// checkpointed is kept, and `poll_wind_down` says what else to keep.
    pub fn handle_write_failed(&mut self, file_id: u32) {
        if let Some(f) = self.get_mut(file_id) {
            f.in_flight = f.in_flight.saturating_sub(1);
        }
    }

    /// The sender reported a file done at `now`.
    pub fn handle_reported(&mut self, report: Reported, now: Instant) {
        self.reports.handle_reported(report, now);
    }

    /// When something is next due: a checkpoint, a waiting report's
    /// stall, or the commit of finished small files.
    pub fn poll_timeout(&self) -> Instant {
        let due = self.policy.poll_timeout();
        let due = self.reports.poll_timeout().map_or(due, |s| s.min(due));
        self.commit_since.map_or(due, |t| due.min(t + COMMIT_HOLD))
    }

    /// A report that waited with nothing arriving for the progress
    /// timeout: the session must end, to resume from what is durable.
    pub fn poll_stalled(&self, now: Instant) -> Option<Stall> {
        self.reports.poll_stalled(now)
    }

    /// Files with unsynced blocks that a checkpoint records (see
    /// `is_checkpointed`).
    /// (Unsynced blocks first: a file never written has no bitmap, and
    /// would get one allocated to be asked its length.)
    fn checkpointed(&mut self) -> impl Iterator<Item = (u32, &mut Landing)> {
        self.files
            .present_mut()
            .filter(|(_, f)| f.tracker.unsynced() > 0 && is_checkpointed(f.tracker.durable().len()))
    }

    /// A background checkpoint, when one is due at `now` and none runs:
    /// the files to sync up to what each job covers, then checkpoint. The
    /// shell reports the outcome with `handle_checkpointed`.
    pub fn poll_checkpoint(&mut self, now: Instant) -> Option<Vec<CheckpointJob>> {
        // This runs for every block, and a session may hold a million
        // files: they are looked through only once a checkpoint could be
        // due, and a look that finds nothing counts as one, so that a tree
        // of one-block files is not looked through again at every block.
        if self.syncing || now < self.policy.poll_timeout() {
            return None;
        }
        let unsynced: u64 = self.checkpointed().map(|(_, f)| f.tracker.unsynced()).sum();
        let due = self.policy.poll_due(now, unsynced);
        self.policy.handle_checkpointed(now);
        if !due {
            return None;
        }
        // No sync here: the shell syncs what was written when the batch
        // was made, while later writes keep the disk busy.
        let batch: Vec<CheckpointJob> = self
            .checkpointed()
            .map(|(file_id, f)| {
                let covered = f.tracker.begin_sync();
                let (durable, checksums) = f.tracker.checkpoint_after(&covered);
                CheckpointJob {
                    file_id,
                    covered,
                    durable,
                    checksums,
                }
            })
            .collect();
        self.syncing = !batch.is_empty();
        Some(batch)
    }

    /// The background checkpoint finished: each file is durable up to what
    /// its job covered, and its record was stored or not. A file answered
    /// meanwhile is left alone. Returns the files whose kept blocks grew.
    pub fn handle_checkpointed(
        &mut self,
        synced: impl IntoIterator<Item = (u32, Bitmap, bool)>,
    ) -> Vec<u32> {
        self.syncing = false;
        let mut kept = Vec::new();
        for (file_id, covered, stored) in synced {
            if let Some(f) = self.get_mut(file_id) {
                f.tracker.handle_synced_upto(&covered);
                f.has_checkpoint |= stored;
                if stored {
                    kept.push(file_id);
                }
            }
        }
        kept
    }

    /// The background checkpoint failed: a file's data may be lost, and
    /// the session ends.
    pub fn handle_checkpoint_failed(&mut self) {
        self.syncing = false;
    }

    /// Whether a background checkpoint runs; the shell waits for it before
    /// publishing or discarding a file, so that no checkpoint is stored
    /// behind either.
    pub fn is_syncing(&self) -> bool {
        self.syncing
    }

    /// The reported files to answer now, in report order, each with what
    /// to do: those with every block written and no write in flight (and
    /// directories, and files not held, which are refused). Each is
    /// answered once returned, and blocks of it that still arrive are
    /// dropped.
    ///
    /// Files of one block are held back and committed together (see
    /// `COMMIT_HOLD`): until `COMMIT_BATCH` of them are waiting, or the
    /// first has waited `COMMIT_HOLD`, or a larger file is ready, or the
    /// shell says to `flush` (nothing is arriving, or the session ends).
    pub fn poll_finish(&mut self, now: Instant, flush: bool) -> Vec<Finish> {
        let ready = self.poll_ready();
        let large = ready.iter().any(|f| !is_small(f));
        if !ready.is_empty() && self.commit.is_empty() {
            self.commit_since = Some(now);
        }
        self.commit.extend(ready);
        let due = flush
            || large
            || self.commit.len() >= COMMIT_BATCH
            || self.commit_since.is_some_and(|t| now >= t + COMMIT_HOLD);
        if !due {
            return Vec::new();
        }
        self.commit_since = None;
        std::mem::take(&mut self.commit)
    }

    fn poll_ready(&mut self) -> Vec<Finish> {
        let files = &self.files;
        let ready = self.reports.poll_ready(|id| {
            files.get(id).and_then(Option::as_ref).is_none_or(|f| {
                f.dir || (f.in_flight == 0 && (f.not_created || f.tracker.is_complete()))
            })
        });
        ready
            .into_iter()
            .map(|report| {
                let file_id = report.file_id;
                let Some(f) = self.files.take(file_id) else {
                    return Finish::Unknown(report);
                };
                self.reports.handle_answered(file_id);
                let why_not_created = if f.not_created {
                    self.why_not_created.remove(&file_id)
                } else {
                    None
                };
                if report.identity != f.identity {
                    Finish::WrongIdentity {
                        report,
                        ours: f.identity,
                    }
                } else if f.not_created {
                    Finish::NotCreated {
                        report,
                        message: why_not_created.unwrap_or_default(),
                    }
                } else if f.dir {
                    let digest = if self.verify == Verification::None {
                        0
                    } else {
                        f.tracker.digest()
                    };
                    Finish::Dir { report, digest }
                } else {
                    Finish::Verify {
                        report,
                        checksums_digest: f.tracker.digest(),
                        blocks: f.tracker.blocks(),
                        checksums: if self.keep_checksums {
                            f.tracker.checksums().into_owned()
                        } else {
                            Vec::new()
                        },
                    }
                }
            })
            .collect()
    }

    /// Whether a verified file whose data reads as `ours` may be
    /// published under the sender's digest `theirs`.
    pub fn may_publish(&self, ours: u128, theirs: u128) -> bool {
        digest_agrees(self.verify, ours, theirs)
    }

    /// The sender gave `file_id` up: it is answered as failed, and what was
    /// written of it is discarded. False when it is not held (answered
    /// already, or never planned).
    pub fn handle_given_up(&mut self, file_id: u32) -> bool {
        let held = self.files.take(file_id).is_some();
        self.why_not_created.remove(&file_id);
        self.reports.handle_given_up(file_id);
        held
    }

    /// The session winds down: the files to sync and checkpoint now, each
    /// then reported with `handle_synced`, so that a new session keeps
    /// everything written of them.
    pub fn poll_wind_down(&mut self) -> Vec<u32> {
        self.checkpointed().map(|(id, _)| id).collect()
    }

    /// `file_id` was synced (all that was written is durable): returns what
    /// its checkpoint records, the durable blocks and their checksums.
    pub fn handle_synced(&mut self, file_id: u32) -> Option<(Bitmap, Vec<u64>)> {
        let f = self.get_mut(file_id)?;
        f.tracker.handle_synced();
        Some((
            f.tracker.durable().into_owned(),
            f.tracker.checksums().into_owned(),
        ))
    }

    /// A checkpoint of `file_id` was stored.
    pub fn handle_checkpoint_stored(&mut self, file_id: u32) {
        if let Some(f) = self.get_mut(file_id) {
            f.has_checkpoint = true;
        }
    }

    /// Whether a new session could resume `file_id` (a checkpoint of it
    /// is stored): when not, its temporary file goes with the session.
    pub fn is_resumable(&self, file_id: u32) -> bool {
        self.get(file_id).is_some_and(|f| f.has_checkpoint)
    }

    /// The durable blocks of a file still held.
    pub fn durable(&self, file_id: u32) -> Option<Cow<'_, Bitmap>> {
        self.get(file_id).map(|f| f.tracker.durable())
    }

    /// How many blocks of a file still held are not written yet.
    pub fn missing(&self, file_id: u32) -> Option<u64> {
        self.get(file_id).map(|f| f.tracker.missing())
    }

    /// The files still held, by id.
    pub fn held(&self) -> impl Iterator<Item = u32> + '_ {
        self.files
            .iter()
            .filter_map(|(id, f)| f.as_ref().map(|_| id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    fn file(file_id: u32, blocks: u64) -> Planned {
        Planned {
            file_id,
            blocks,
            dir: false,
            identity: u64::from(file_id) + 100,
            resumed: None,
        }
    }

    fn report(file_id: u32) -> Reported {
        Reported {
            file_id,
            digest: 7,
            identity: u64::from(file_id) + 100,
        }
    }

    fn core(files: Vec<Planned>, t0: Instant) -> FileLifecycle {
        FileLifecycle::new(files, Verification::Checksums, SECOND, 30 * SECOND, t0)
    }

    // A piece of a shared file records its block checksums as a per-chunk
    // checkpoint: only a core told to keep them hands them over.
    #[test]
    fn a_finished_file_carries_its_checksums_where_asked() {
        let t0 = Instant::now();
        let mut c = core(vec![file(1, 2)], t0);
        c.keep_checksums();
        c.handle_reported(report(1), t0);
        for (b, sum) in [(0, 10), (1, 11)] {
            assert_eq!(c.handle_block(1), BlockFate::Write);
            c.handle_written(1, b, sum, t0);
        }
        let finished = c.poll_finish(t0, true);
        assert!(
            matches!(&finished[..], [Finish::Verify { checksums, .. }] if checksums == &[10, 11]),
            "{finished:?}"
        );
    }

    /// Lands file `id`'s one block and reports it.
    fn land(c: &mut FileLifecycle, id: u32, now: Instant) {
        assert_eq!(c.handle_block(id), BlockFate::Write);
        c.handle_written(id, 0, 5, now);
        c.handle_reported(report(id), now);
    }

    fn ids(finished: &[Finish]) -> Vec<u32> {
        finished
            .iter()
            .map(|f| match f {
                Finish::Verify { report, .. } => report.file_id,
                other => panic!("{other:?}"),
            })
            .collect()
    }

    /// Small files finished close together are committed together, and
    /// none waits longer than `COMMIT_HOLD`, or at all once the sender
    /// pauses or a larger file is ready.
    #[test]
    fn small_files_are_committed_together_and_none_waits_long() {
        let t0 = Instant::now();
        let ms = Duration::from_millis(1);
        let mut c = core(
            (1..=6).map(|i| file(i, 1)).chain([file(7, 2)]).collect(),
            t0,
        );
        land(&mut c, 1, t0);
        assert!(c.poll_finish(t0, false).is_empty());
        assert_eq!(c.poll_timeout(), t0 + COMMIT_HOLD);
        land(&mut c, 2, t0 + ms);
        assert!(c.poll_finish(t0 + ms, false).is_empty());
        assert_eq!(ids(&c.poll_finish(t0 + COMMIT_HOLD, false)), [1, 2]);
        // Held anew, then flushed by a pause of the sender.
        land(&mut c, 3, t0 + COMMIT_HOLD);
        assert!(c.poll_finish(t0 + COMMIT_HOLD, false).is_empty());
        assert_eq!(ids(&c.poll_finish(t0 + COMMIT_HOLD + ms, true)), [3]);
        // A larger file takes the small ones held with it.
        land(&mut c, 4, t0 + 30 * ms);
        assert!(c.poll_finish(t0 + 30 * ms, false).is_empty());
        for b in 0..2 {
            assert_eq!(c.handle_block(7), BlockFate::Write);
            c.handle_written(7, b, 5, t0);
        }
        c.handle_reported(report(7), t0 + 31 * ms);
        assert_eq!(ids(&c.poll_finish(t0 + 31 * ms, false)), [4, 7]);
        assert!(c.poll_timeout() > t0 + 31 * ms + COMMIT_HOLD);
    }

    #[test]
    fn a_block_is_written_until_its_file_is_answered_then_dropped() {
        let t0 = Instant::now();
        let mut c = core(vec![file(1, 1)], t0);
        assert_eq!(c.handle_block(9), BlockFate::Unknown);
        assert_eq!(c.handle_block(1), BlockFate::Write);
        c.handle_written(1, 0, 5, t0);
        c.handle_reported(report(1), t0);
        assert!(matches!(
            c.poll_finish(t0, true)[..],
            [Finish::Verify { .. }]
        ));
        // A copy the sender resent after a stream broke.
        assert_eq!(c.handle_block(1), BlockFate::Drop);
        assert!(!c.handle_given_up(1) && c.held().next().is_none());
    }

    // A one-block file whose temporary file could not be made when its
    // block arrived (a full disk): it fails alone, with why, without
    // waiting for a block that will never be written, and a resent copy
    // of its block is dropped; the file beside it lands.
    #[test]
    fn a_file_not_created_is_answered_as_failed_with_why_and_alone() {
        let t0 = Instant::now();
        let mut c = core(vec![file(1, 1), file(2, 1)], t0);
        assert_eq!(c.handle_block(1), BlockFate::Write);
        c.handle_not_created(1, "no space left for f1");
        assert_eq!(c.handle_block(1), BlockFate::Drop);
        assert!(c.poll_finish(t0, true).is_empty(), "not reported yet");
        land(&mut c, 2, t0);
        c.handle_reported(report(1), t0);
        let finished = c.poll_finish(t0, true);
        assert!(
            matches!(&finished[..], [
                Finish::Verify { report: r2, .. },
                Finish::NotCreated { report: r1, message },
            ] if r2.file_id == 2 && r1.file_id == 1 && message == "no space left for f1"),
            "{finished:?}"
        );
        assert_eq!(c.handle_block(1), BlockFate::Drop);
        assert!(c.held().next().is_none() && c.why_not_created.is_empty());
        assert!(c.poll_stalled(t0 + 60 * SECOND).is_none());
    }

    // The reason a file was not created is kept only until the file is
    // answered, however it ends: given up by the sender, or reported as
    // another entry than the one held here.
    #[test]
    fn why_a_file_was_not_created_goes_when_it_is_answered_any_way() {
        let t0 = Instant::now();
        let mut c = core(vec![file(1, 1), file(2, 1)], t0);
        for id in [1, 2] {
            assert_eq!(c.handle_block(id), BlockFate::Write);
            c.handle_not_created(id, "no space left");
        }
        assert!(c.handle_given_up(1));
        let mut other = report(2);
        other.identity += 1;
        c.handle_reported(other, t0);
        assert!(matches!(
            c.poll_finish(t0, true)[..],
            [Finish::WrongIdentity { .. }]
        ));
        assert!(c.why_not_created.is_empty(), "{:?}", c.why_not_created);
    }

    // A resent copy of a block still being written when the file is
    // reported: the file is verified only once that write lands too.
    #[test]
    fn a_report_waits_for_the_last_block_and_for_the_files_writes_in_flight() {
        let t0 = Instant::now();
        let mut c = core(vec![file(1, 2), file(2, 1)], t0);
        c.handle_reported(report(1), t0);
        c.handle_reported(report(2), t0);
        for _ in 0..2 {
            assert_eq!(c.handle_block(1), BlockFate::Write);
        }
        c.handle_written(1, 0, 10, t0);
        assert!(c.poll_finish(t0, true).is_empty());
        assert_eq!(c.handle_block(1), BlockFate::Write);
        c.handle_written(1, 1, 11, t0);
        // Complete, but the first copy of block 1 is still in flight.
        assert!(c.poll_finish(t0, true).is_empty());
        c.handle_written(1, 1, 11, t0);
        let digest = crate::digest::file_digest(&[10, 11]);
        assert_eq!(
            c.poll_finish(t0, true),
            [Finish::Verify {
                report: report(1),
                checksums_digest: digest,
                blocks: 2,
                checksums: Vec::new(),
            }]
        );
        assert!(c.may_publish(digest, digest) && !c.may_publish(digest, 7));
        // File 2 never got its block: after the progress timeout, a stall.
        assert_eq!(c.poll_stalled(t0 + 29 * SECOND), None);
        assert_eq!(c.poll_stalled(t0 + 30 * SECOND).map(|s| s.file_id), Some(2));
    }

    #[test]
    fn a_checkpoint_records_what_its_sync_covers_and_one_runs_at_a_time() {
        let t0 = Instant::now();
        let mut c = core(vec![file(1, 3), file(2, 1)], t0);
        for (f, b) in [(1, 0), (2, 0)] {
            assert_eq!(c.handle_block(f), BlockFate::Write);
            c.handle_written(f, b, 10 + b, t0);
        }
        assert_eq!(c.poll_checkpoint(t0 + SECOND / 2), None);
        // The one-block file is sent again after a crash, never synced.
        let jobs = c.poll_checkpoint(t0 + SECOND).expect("due");
        assert_eq!(jobs.len(), 1);
        let job = &jobs[0];
        assert_eq!(
            (job.file_id, job.covered.count(), job.durable.count()),
            (1, 1, 1)
        );
        assert!(!c.is_resumable(1));
        // Written while the sync runs: not in this batch, nor a new one yet.
        c.handle_block(1);
        c.handle_written(1, 1, 11, t0 + SECOND);
        assert!(c.is_syncing());
        assert_eq!(c.poll_checkpoint(t0 + 5 * SECOND), None);
        let kept = c.handle_checkpointed([(1, job.covered.clone(), true)]);
        assert_eq!(kept, [1]);
        assert!(c.is_resumable(1) && !c.is_resumable(2));
        assert_eq!(c.durable(1).unwrap().count(), 1);
        // Winding down syncs and records the rest.
        assert_eq!(c.poll_wind_down(), [1]);
        let (durable, sums) = c.handle_synced(1).unwrap();
        assert_eq!((durable.count(), &sums[..2]), (2, &[10, 11][..]));
        assert!(c.poll_wind_down().is_empty());
    }

    #[test]
    fn nothing_unsynced_is_no_checkpoint_and_counts_as_a_look() {
        let t0 = Instant::now();
        let mut c = core(vec![file(1, 3)], t0);
        assert_eq!(c.poll_checkpoint(t0 + SECOND), None);
        c.handle_block(1);
        c.handle_written(1, 0, 1, t0 + SECOND);
        // The look at t0 + 1 s counted: the next is due a second later.
        assert_eq!(c.poll_timeout(), t0 + 2 * SECOND);
        assert_eq!(c.poll_checkpoint(t0 + SECOND + SECOND / 2), None);
        assert!(c.poll_checkpoint(t0 + 2 * SECOND).is_some());
    }

    #[test]
    fn a_wrong_identity_a_directory_and_an_unknown_report_are_told_apart() {
        let t0 = Instant::now();
        let dir = Planned {
            dir: true,
            ..file(3, 0)
        };
        let resumed = Planned {
            resumed: Some((Bitmap::new(2), vec![0, 0])),
            ..file(4, 2)
        };
        let mut c = core(vec![file(1, 0), dir, resumed], t0);
        assert!(c.is_resumable(4));
        let theirs = Reported {
            identity: 5,
            ..report(1)
        };
        for r in [theirs, report(3), report(8)] {
            c.handle_reported(r, t0);
        }
        assert_eq!(
            c.poll_finish(t0, true),
            [
                Finish::WrongIdentity {
                    report: theirs,
                    ours: 101
                },
                Finish::Dir {
                    report: report(3),
                    digest: crate::digest::file_digest(&[])
                },
                Finish::Unknown(report(8)),
            ]
        );
        assert!(c.handle_given_up(4));
        assert!(!c.is_resumable(4));
        assert_eq!(c.held().count(), 0);
    }

    // A receiver holds one per file of a manifest that may list a million,
    // in one flat table with its id: 40 bytes a file.
    #[test]
    fn a_files_state_is_small() {
        assert!(
            size_of::<Option<Landing>>() <= 32,
            "{}",
            size_of::<Option<Landing>>()
        );
    }
}
