//! What a sending session's threads share: the scheduler under one lock,
//! the source files, verdicts, counters and the first error.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use wirerate_engine::Scheduler;

use super::source::SourceFile;
use crate::error::Error;
use crate::io::PoolBuf;
use crate::metrics::sender_metrics;
use crate::progress::Progress;
use crate::wire::Verification;

/// What a file's verdict was.
#[derive(Debug, Clone)]
pub(crate) enum Verdict {
    Ok(u128),
    Failed(String),
}

pub(crate) struct Inner {
    pub(crate) sched: Scheduler,
    pub(crate) bufs: HashMap<usize, Arc<PoolBuf>>,
    pub(super) verdicts: HashMap<u32, Verdict>,
    pub(super) sent_digests: HashMap<u32, u128>,
    pub(super) error: Option<Error>,
}

pub(crate) struct Shared {
    pub(super) inner: Mutex<Inner>,
    pub(crate) cv: Condvar,
    pub(crate) files: HashMap<u32, SourceFile>,
    /// The directory every source file is opened beneath.
    pub(crate) base: Arc<OwnedFd>,
    /// The empty files have been checked (see `reader::check_empty`).
    pub(super) empties_checked: AtomicBool,
    pub(super) stop: AtomicBool,
    pub(crate) read_bytes: AtomicU64,
    pub(super) sent_bytes: AtomicU64,
    pub(super) per_stream: Vec<AtomicU64>,
    pub(super) progress: Arc<Progress>,
    pub(super) verify: Verification,
    /// This session's share of the `bytes_in_flight` gauge: sent, not yet
    /// acknowledged (a resent block counts once more, until the session ends).
    pub(super) in_flight: std::sync::atomic::AtomicI64,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    pub(super) fn fail(&self, e: Error) {
        let mut g = self.lock();
        if g.error.is_none() && !self.stopped() {
            g.error = Some(e);
        }
        drop(g);
        self.cv.notify_all();
    }

    /// Moves this session's bytes in flight (and the agent's gauge) by `delta`.
    pub(super) fn in_flight(&self, delta: i64) {
        self.in_flight.fetch_add(delta, Ordering::Relaxed);
        sender_metrics().bytes_in_flight.add(delta);
    }

    pub(super) fn stream_failed(&self, stream: u16, why: &str) {
        let mut g = self.lock();
        if !self.stopped() && g.sched.stream_alive(stream) {
            let n = g.sched.handle_stream_failed(stream);
            sender_metrics().stream_failures.inc();
            tracing::warn!(
                "stream {stream} failed ({why}); {n} unacknowledged blocks go to the other streams"
            );
        }
        drop(g);
        self.cv.notify_all();
    }
}
