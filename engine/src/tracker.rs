//! The receiver's view of one file: which blocks are written, which are
//! durable, and when to checkpoint.

use std::borrow::Cow;
use std::time::{Duration, Instant};

use super::{Bitmap, digest::file_digest};

/// Written and durable blocks of one destination file.
///
/// A receiver holds one per file of a manifest that may list a million,
/// most of them waiting for their first block: until then (and unless it
/// resumed from a checkpoint) it is a block count and a null pointer.
#[derive(Debug, Clone)]
pub struct FileTracker {
    blocks: u64,
    progress: Option<Box<Progress>>,
}

/// What a tracker knows once a block is written or a checkpoint resumed.
#[derive(Debug, Clone)]
struct Progress {
    durable: Bitmap,
    written: Bitmap,
    /// One per block.
    checksums: Vec<u64>,
    unsynced: u64,
}

impl FileTracker {
    /// A tracker for `blocks` blocks, starting from a checkpoint's durable
    /// blocks and their checksums when resuming.
    pub fn new(blocks: u64, resumed: Option<(Bitmap, Vec<u64>)>) -> Self {
        let progress = match resumed {
            Some((durable, checksums))
                if durable.len() == blocks && checksums.len() as u64 == blocks =>
            {
                Some(Box::new(Progress {
                    written: durable.clone(),
                    durable,
                    checksums,
                    unsynced: 0,
                }))
            }
            _ => None,
        };
        Self { blocks, progress }
    }

    fn progress_mut(&mut self) -> &mut Progress {
        let blocks = self.blocks;
        self.progress.get_or_insert_with(|| {
            Box::new(Progress {
                durable: Bitmap::new(blocks),
                written: Bitmap::new(blocks),
                checksums: vec![0; blocks as usize],
                unsynced: 0,
            })
        })
    }

    /// A block's write completed. Returns false for an index out of range.
    pub fn handle_written(&mut self, block: u64, checksum: u64) -> bool {
        if block >= self.blocks {
            return false;
        }
        let p = self.progress_mut();
        p.checksums[block as usize] = checksum;
        if p.durable.get(block) {
            // A resend of a durable block rewrote the same bytes.
            return true;
        }
        if !p.written.get(block) {
            p.written.set(block);
        }
        p.unsynced += 1;
        true
    }

    /// Blocks written since the last sync.
    pub fn unsynced(&self) -> u64 {
        self.progress.as_ref().map_or(0, |p| p.unsynced)
    }

    /// The file was fdatasync'ed: everything written so far is durable.
    pub fn handle_synced(&mut self) {
        let written = self.begin_sync();
        self.handle_synced_upto(&written);
    }

    /// A sync is about to start in the background: returns the blocks it
    /// will cover (those written so far). Writes that complete while it
    /// runs count as unsynced again.
    pub fn begin_sync(&mut self) -> Bitmap {
        match &mut self.progress {
            Some(p) => {
                p.unsynced = 0;
                p.written.clone()
            }
            None => Bitmap::new(self.blocks),
        }
    }

    /// The sync started by `begin_sync` finished: what it covered is durable.
    pub fn handle_synced_upto(&mut self, covered: &Bitmap) {
        if covered.count() > 0 {
            self.progress_mut().durable.union_with(covered);
        }
    }

    /// What a checkpoint taken once `covered` is durable records: the
    /// durable blocks then, and the checksums now (a covered block's
    /// checksum cannot change, since its write already completed).
    pub fn checkpoint_after(&self, covered: &Bitmap) -> (Bitmap, Vec<u64>) {
        let mut durable = self.durable().into_owned();
        durable.union_with(covered);
        (durable, self.checksums().into_owned())
    }

    /// Durable blocks (what a checkpoint records).
    pub fn durable(&self) -> Cow<'_, Bitmap> {
        match &self.progress {
            Some(p) => Cow::Borrowed(&p.durable),
            None => Cow::Owned(Bitmap::new(self.blocks)),
        }
    }

    /// Checksums by block (meaningful for written blocks; 0 for the rest).
    pub fn checksums(&self) -> Cow<'_, [u64]> {
        match &self.progress {
            Some(p) => Cow::Borrowed(&p.checksums),
            None => Cow::Owned(vec![0; self.blocks as usize]),
        }
    }

    /// The file's blocks.
    pub fn blocks(&self) -> u64 {
        self.blocks
    }

    /// Blocks not written yet.
    pub fn missing(&self) -> u64 {
        self.blocks - self.progress.as_ref().map_or(0, |p| p.written.count())
    }

    /// Every block is written.
    pub fn is_complete(&self) -> bool {
        self.missing() == 0
    }

    /// The file digest from the checksums of the received blocks.
    pub fn digest(&self) -> u128 {
        file_digest(&self.checksums())
    }
}

/// Decides when unsynced blocks are worth an fdatasync and a checkpoint.
#[derive(Debug, Clone)]
pub struct CheckpointPolicy {
    interval: Duration,
    last: Instant,
}

impl CheckpointPolicy {
    /// Checkpoint at most every `interval`.
    pub fn new(now: Instant, interval: Duration) -> Self {
        Self {
            interval,
            last: now,
        }
    }

    /// Whether a checkpoint is due, given how many blocks await a sync.
    #[must_use]
    pub fn poll_due(&self, now: Instant, unsynced: u64) -> bool {
        unsynced > 0 && now.saturating_duration_since(self.last) >= self.interval
    }

    /// When the next checkpoint could fall due.
    #[must_use]
    pub fn poll_timeout(&self) -> Instant {
        self.last + self.interval
    }

    /// A checkpoint was taken at `now`.
    pub fn handle_checkpointed(&mut self, now: Instant) {
        self.last = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_background_sync_covers_only_what_was_written_when_it_began() {
        let mut t = FileTracker::new(4, None);
        assert!(t.handle_written(0, 10) && t.handle_written(1, 11));
        let covered = t.begin_sync();
        assert_eq!(t.unsynced(), 0);
        // Lands while the sync runs: not covered by it.
        assert!(t.handle_written(2, 12));
        assert_eq!(
            t.unsynced(),
            1,
            "a write during the sync waits for the next"
        );
        let (durable, sums) = t.checkpoint_after(&covered);
        assert!(durable.get(0) && durable.get(1) && !durable.get(2));
        assert_eq!(&sums[..3], &[10, 11, 12]);
        assert!(!t.durable().get(0), "not durable before the sync finished");
        t.handle_synced_upto(&covered);
        assert!(t.durable().get(0) && t.durable().get(1));
        assert!(!t.durable().get(2), "written after the sync began");
        t.handle_synced();
        assert!(t.durable().get(2));
        assert_eq!(t.unsynced(), 0);
    }

    #[test]
    fn block_is_durable_only_after_sync() {
        let mut t = FileTracker::new(3, None);
        assert!(t.handle_written(1, 11));
        assert!(
            !t.durable().get(1),
            "written is not durable before fdatasync"
        );
        assert_eq!(t.unsynced(), 1);
        t.handle_synced();
        assert!(t.durable().get(1));
        assert_eq!(t.unsynced(), 0);
        assert!(!t.is_complete());
        assert!(t.handle_written(0, 10) && t.handle_written(2, 12));
        assert!(t.is_complete());
        assert_eq!(t.digest(), file_digest(&[10, 11, 12]));
        assert!(!t.handle_written(3, 0));
    }

    #[test]
    fn resumed_tracker_keeps_checkpointed_checksums() {
        let mut b = Bitmap::new(2);
        b.set(0);
        let mut t = FileTracker::new(2, Some((b, vec![5, 0])));
        assert!(!t.is_complete());
        t.handle_written(1, 6);
        assert!(t.is_complete());
        assert_eq!(t.digest(), file_digest(&[5, 6]));
    }

    #[test]
    fn a_tracker_waiting_for_its_first_block_holds_nothing_on_the_heap() {
        let mut t = FileTracker::new(1000, None);
        assert!(t.progress.is_none());
        assert_eq!((t.missing(), t.unsynced()), (1000, 0));
        assert_eq!(t.durable().len(), 1000);
        assert_eq!(t.checksums().len(), 1000);
        t.handle_synced();
        assert!(t.progress.is_none(), "a sync of nothing allocates nothing");
        assert!(t.handle_written(999, 7));
        assert_eq!((t.missing(), t.unsynced(), t.checksums()[999]), (999, 1, 7));
        assert!(
            size_of::<FileTracker>() <= 16,
            "a waiting file's tracker is a count and a pointer"
        );
    }

    #[test]
    fn mismatched_checkpoint_is_ignored() {
        let b = Bitmap::new(5);
        let t = FileTracker::new(2, Some((b, vec![0; 5])));
        assert_eq!(t.durable().len(), 2);
    }

    #[test]
    fn checkpoint_policy() {
        let t0 = Instant::now();
        let mut p = CheckpointPolicy::new(t0, Duration::from_secs(1));
        assert!(
            !p.poll_due(t0 + Duration::from_secs(5), 0),
            "nothing to sync"
        );
        assert!(!p.poll_due(t0 + Duration::from_millis(500), 3));
        assert!(p.poll_due(t0 + Duration::from_secs(1), 3));
        p.handle_checkpointed(t0 + Duration::from_secs(1));
        assert_eq!(p.poll_timeout(), t0 + Duration::from_secs(2));
    }
}
