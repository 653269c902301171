//! A session's counters, shared by its control, stream and writer threads.

use std::sync::atomic::AtomicU64;

/// Counters shared by a session's threads.
#[derive(Default)]
pub(crate) struct Stats {
    pub(crate) bytes: AtomicU64,
    /// Pieces of blocks read from the data streams: the writer's sign
    /// that blocks are still arriving (see `session::reports`).
    pub(crate) arriving: AtomicU64,
    pub(crate) rejected: AtomicU64,
    pub(crate) streams: AtomicU64,
    pub(crate) files_ok: AtomicU64,
    pub(crate) files_failed: AtomicU64,
    /// Entries refused in the plan (they get no result).
    pub(crate) refused: AtomicU64,
    /// Files already here at the session's sync level: not taken, left
    /// as they are (their bytes are the job's, `JobCounters::present`).
    pub(crate) present: AtomicU64,
    /// Bytes of the accepted files in all.
    pub(crate) total: AtomicU64,
    /// Bytes of this session's files a new session would keep, those
    /// published excepted (see `kept::Kept`).
    pub(crate) kept: AtomicU64,
    /// Bytes the server's sessions had published when this one was planned.
    pub(crate) published_before: AtomicU64,
}
