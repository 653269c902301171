//! The receiver writer's decisions about reported files, with no I/O: which
//! reports can be answered now, which files are answered, and whether a
//! verified file's digest is the sender's.
//!
//! The sender reports a file once every block has gone out, and the report
//! travels on the control connection, so it can overtake the file's last
//! blocks on the data streams: a report waits until its file is complete.
//! Once answered, a file takes no more writes; a copy of one of its blocks
//! that the sender resent after a stream broke can still arrive, and is
//! acknowledged and dropped.

use std::collections::HashSet;

use crate::wire::Verification;

/// Reported files waiting for their last blocks, and the files answered.
#[derive(Debug, Default)]
pub struct Reports {
    /// Reported done, with the sender's digest, in report order.
    awaiting: Vec<(u32, u128)>,
    answered: HashSet<u32>,
}

impl Reports {
    /// The sender reported `file_id` done with its `digest`.
    pub fn handle_reported(&mut self, file_id: u32, digest: u128) {
        self.awaiting.push((file_id, digest));
    }

    /// The sender gave `file_id` up: a report of it no longer waits, and
    /// it is answered (as failed) now.
    pub fn handle_given_up(&mut self, file_id: u32) {
        self.awaiting.retain(|(id, _)| *id != file_id);
        self.answered.insert(file_id);
    }

    /// The reports that can be answered now, in report order: those whose
    /// file `complete` says has all its blocks. The caller answers each
    /// and says so with [`Self::handle_answered`].
    pub fn poll_ready(&mut self, complete: impl Fn(u32) -> bool) -> Vec<(u32, u128)> {
        let (ready, waiting) = std::mem::take(&mut self.awaiting)
            .into_iter()
            .partition(|(id, _)| complete(*id));
        self.awaiting = waiting;
        ready
    }

    /// `file_id` is answered: verified and published, or failed.
    pub fn handle_answered(&mut self, file_id: u32) {
        self.answered.insert(file_id);
    }

    /// Whether `file_id` was answered: a block of it is acknowledged and
    /// dropped.
    pub fn is_answered(&self, file_id: u32) -> bool {
        self.answered.contains(&file_id)
    }
}

/// Whether a file whose data reads as `ours` may be published, when the
/// sender's digest is `theirs` at verification level `verify`.
pub fn digest_agrees(verify: Verification, ours: u128, theirs: u128) -> bool {
    verify == Verification::None || ours == theirs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_waits_for_its_last_blocks_and_keeps_its_order() {
        let mut r = Reports::default();
        r.handle_reported(3, 30);
        r.handle_reported(1, 10);
        r.handle_reported(2, 20);
        // File 1's last block is still on its way.
        assert_eq!(r.poll_ready(|id| id != 1), [(3, 30), (2, 20)]);
        assert_eq!(r.poll_ready(|id| id != 1), []);
        assert_eq!(r.poll_ready(|_| true), [(1, 10)]);
        assert!(r.poll_ready(|_| true).is_empty());
    }

    #[test]
    fn a_file_given_up_is_answered_and_its_report_forgotten() {
        let mut r = Reports::default();
        r.handle_reported(5, 50);
        r.handle_given_up(5);
        assert!(r.is_answered(5));
        assert!(r.poll_ready(|_| true).is_empty());
        assert!(!r.is_answered(6));
        r.handle_answered(6);
        assert!(r.is_answered(6));
    }

    #[test]
    fn only_a_matching_digest_is_published_unless_unverified() {
        assert!(digest_agrees(Verification::Checksums, 7, 7));
        assert!(!digest_agrees(Verification::Checksums, 7, 8));
        assert!(!digest_agrees(Verification::Reread, 7, 8));
        assert!(digest_agrees(Verification::None, 0, 8));
    }
}
