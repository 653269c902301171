//! What a new session would keep of this one's unpublished files if it
//! died now: the bytes of their stored checkpoints (published files are
//! counted by the server, across sessions). The in-cluster receiver shows
//! this, plus what is published, as the transfer's progress, so the
//! progress shown never runs ahead of what a resume keeps (bytes written
//! but not yet synced and checkpointed would be sent again).
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::stats::Stats;

/// Kept bytes by file, summed into the session's counters. Only files
/// that keep something have an entry: a manifest of a million new files
/// would otherwise cost a million entries of zeros.
pub(crate) struct Kept {
    by_file: HashMap<u32, u64>,
    sum: u64,
    stats: Arc<Stats>,
}

impl Kept {
    pub(crate) fn new(stats: Arc<Stats>) -> Self {
        Self {
            by_file: HashMap::new(),
            sum: 0,
            stats,
        }
    }

    /// `file_id` now keeps `bytes`: a checkpoint of it was stored, or it
    /// was published or discarded (0).
    pub(crate) fn set(&mut self, file_id: u32, bytes: u64) {
        let old = if bytes == 0 {
            self.by_file.remove(&file_id)
        } else {
            self.by_file.insert(file_id, bytes)
        }
        .unwrap_or(0);
        self.sum = self.sum - old + bytes;
        self.stats.kept.store(self.sum, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sum_follows_each_files_latest_figure() {
        let stats = Arc::new(Stats::default());
        let mut k = Kept::new(Arc::clone(&stats));
        let kept = || stats.kept.load(Ordering::Relaxed);
        k.set(1, 4 << 20);
        k.set(2, 1 << 20);
        assert_eq!(kept(), 5 << 20);
        // A later checkpoint of the same file replaces its figure.
        k.set(1, 8 << 20);
        assert_eq!(kept(), 9 << 20);
        // A discarded file keeps nothing.
        k.set(2, 0);
        assert_eq!(kept(), 8 << 20);
        // Nothing kept, no entry held.
        k.set(3, 0);
        assert_eq!(k.by_file.len(), 1);
        assert_eq!(kept(), 8 << 20);
    }
}
