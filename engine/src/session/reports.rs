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
//!
//! A report whose blocks stop coming is a stall, not a wait: the sender
//! sends a report only once every block of the file has gone out, so if
//! nothing arrives for the progress timeout while a report waits, the two
//! sides disagree on what is here (a resume plan believed wrong, a block
//! lost between a stream and the writer) and the session must end, to be
//! resumed from what is durable. Keepalives on the control connection
//! prove the sender is there, not that the transfer moves.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::wire::Verification;

/// A file the sender reported done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reported {
    /// Which file.
    pub file_id: u32,
    /// The sender's digest.
    pub digest: u128,
    /// The sender's identity of the file (`digest::entry_identity`).
    pub identity: u64,
}

/// A report that waited too long for its file's last blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stall {
    /// The file that waited longest.
    pub file_id: u32,
    /// How long nothing has arrived.
    pub quiet: Duration,
}

/// Reported files waiting for their last blocks, and the files answered.
#[derive(Debug)]
pub struct Reports {
    /// Reported done, in report order, with when.
    awaiting: Vec<(Reported, Instant)>,
    answered: HashSet<u32>,
    /// How long a report may wait with nothing arriving.
    progress_timeout: Duration,
    /// When the last byte of a block arrived or a block was written.
    progress: Option<Instant>,
}

impl Reports {
    /// Reports whose blocks stop arriving for `progress_timeout` stall.
    pub fn new(progress_timeout: Duration) -> Self {
        Self {
            awaiting: Vec::new(),
            answered: HashSet::new(),
            progress_timeout,
            progress: None,
        }
    }

    /// The sender reported a file done at `now`.
    pub fn handle_reported(&mut self, report: Reported, now: Instant) {
        self.awaiting.push((report, now));
    }

    /// Block data arrived, or a block was written, at `now`.
    pub fn handle_progress(&mut self, now: Instant) {
        self.progress = Some(now);
    }

    /// The sender gave `file_id` up: a report of it no longer waits, and
    /// it is answered (as failed) now.
    pub fn handle_given_up(&mut self, file_id: u32) {
        self.awaiting.retain(|(r, _)| r.file_id != file_id);
        self.answered.insert(file_id);
    }

    /// The reports that can be answered now, in report order: those whose
    /// file `complete` says has all its blocks. The caller answers each
    /// and says so with [`Self::handle_answered`].
    pub fn poll_ready(&mut self, complete: impl Fn(u32) -> bool) -> Vec<Reported> {
        let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.awaiting)
            .into_iter()
            .partition(|(r, _)| complete(r.file_id));
        self.awaiting = waiting;
        ready.into_iter().map(|(r, _)| r).collect()
    }

    /// When a waiting report stalls, if nothing arrives before.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.quiet_since()
            .and_then(|t| t.checked_add(self.progress_timeout))
    }

    /// A report that has waited `progress_timeout` with nothing arriving,
    /// if one has: the session must end and resume.
    pub fn poll_stalled(&self, now: Instant) -> Option<Stall> {
        let since = self.quiet_since()?;
        let quiet = now.saturating_duration_since(since);
        (quiet >= self.progress_timeout).then(|| Stall {
            file_id: self.awaiting[0].0.file_id,
            quiet,
        })
    }

    /// Since when nothing has arrived while a report waited.
    fn quiet_since(&self) -> Option<Instant> {
        let first = self.awaiting.first()?.1;
        Some(self.progress.map_or(first, |p| p.max(first)))
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

    const TIMEOUT: Duration = Duration::from_secs(30);

    fn report(file_id: u32) -> Reported {
        Reported {
            file_id,
            digest: u128::from(file_id) * 10,
            identity: u64::from(file_id),
        }
    }

    fn ids(r: Vec<Reported>) -> Vec<u32> {
        r.into_iter().map(|r| r.file_id).collect()
    }

    #[test]
    fn a_report_waits_for_its_last_blocks_and_keeps_its_order() {
        let now = Instant::now();
        let mut r = Reports::new(TIMEOUT);
        r.handle_reported(report(3), now);
        r.handle_reported(report(1), now);
        r.handle_reported(report(2), now);
        // File 1's last block is still on its way.
        assert_eq!(ids(r.poll_ready(|id| id != 1)), [3, 2]);
        assert!(r.poll_ready(|id| id != 1).is_empty());
        assert_eq!(r.poll_ready(|_| true), [report(1)]);
        assert!(r.poll_ready(|_| true).is_empty());
    }

    // A resume plan believed wrong: the sender never sends a block it
    // thinks the receiver holds, reports the file, and keeps the control
    // connection alive with keepalives. Before the progress timeout this
    // waited for ever.
    #[test]
    fn a_report_whose_blocks_stop_coming_stalls_after_the_progress_timeout() {
        let t0 = Instant::now();
        let mut r = Reports::new(TIMEOUT);
        assert_eq!(r.poll_timeout(), None);
        r.handle_progress(t0);
        r.handle_reported(report(4), t0 + Duration::from_secs(1));
        assert!(r.poll_ready(|_| false).is_empty());
        assert_eq!(r.poll_timeout(), Some(t0 + Duration::from_secs(31)));
        // Data still arriving (for this file or another) is progress.
        r.handle_progress(t0 + Duration::from_secs(20));
        assert_eq!(r.poll_stalled(t0 + Duration::from_secs(49)), None);
        assert_eq!(
            r.poll_stalled(t0 + Duration::from_secs(50)),
            Some(Stall {
                file_id: 4,
                quiet: TIMEOUT
            })
        );
        // Nothing waiting, nothing stalls, however quiet.
        assert_eq!(ids(r.poll_ready(|_| true)), [4]);
        assert_eq!(r.poll_stalled(t0 + Duration::from_secs(500)), None);
        assert_eq!(r.poll_timeout(), None);
    }

    #[test]
    fn a_file_given_up_is_answered_and_its_report_forgotten() {
        let mut r = Reports::new(TIMEOUT);
        r.handle_reported(report(5), Instant::now());
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
