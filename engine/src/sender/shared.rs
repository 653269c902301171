//! What a sending session's threads share: the scheduler under one lock,
//! the source files, verdicts, counters and the first error.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::Scheduler;
use crate::session::SenderControl;
use crate::session::sender::{Action, End};

use super::source::SourceFile;
use crate::error::Error;
use crate::io::PoolBuf;
use crate::observe::Observe;
use crate::progress::Progress;
use crate::wire::{Verification, encode};

use crate::session::FileVerdict;

pub(crate) struct Inner {
    pub(crate) sched: Scheduler,
    pub(crate) bufs: HashMap<usize, Arc<PoolBuf>>,
    pub(super) verdicts: HashMap<u32, FileVerdict>,
    /// The control connection's decisions; `outbox` holds the frames it
    /// wants sent until the coordinator, the connection's one writer,
    /// sends them.
    pub(super) control: SenderControl,
    pub(super) outbox: Vec<u8>,
    pub(super) error: Option<Error>,
    /// Data streams the receiver parked at the session's end (see
    /// `Shared::park`), by index, with when its `Parked` arrived, for the
    /// sender's next session.
    pub(super) parked: Vec<(u16, crate::net::Conn, std::time::Instant)>,
    /// Acknowledgement readers not yet ended.
    pub(super) acks_running: usize,
    /// Data streams that failed and why, for the summary's warnings (the
    /// log alone is gone by the time a `--json` reader looks).
    pub(super) cuts: Vec<String>,
}

/// The error a control connection that ended with `end` fails its
/// session with.
pub(super) fn end_error(end: End) -> Error {
    match end {
        End::Remote { retryable, message } => Error::Remote { message, retryable },
        End::Violation(v) => Error::Violation(v),
        End::Silent(silent) => {
            Error::silent("receiver", silent, ", not even a keepalive; reconnecting")
        }
        End::Lost(reason) => Error::net(
            "the control connection broke",
            std::io::Error::other(reason),
        ),
    }
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
    /// Set, before `stop`, when the session ended well and its data streams
    /// are to be parked (`sender::warm`) rather than closed.
    pub(super) park: AtomicBool,
    pub(crate) read_bytes: AtomicU64,
    pub(super) sent_bytes: AtomicU64,
    /// Bytes the receiver acknowledged: what the optimizer measures.
    pub(super) acked_bytes: AtomicU64,
    pub(super) per_stream: Vec<AtomicU64>,
    pub(super) observer: Observe,
    pub(super) progress: Arc<Progress>,
    pub(super) verify: Verification,
    /// Whether the next block is packed; told what packing and writing
    /// each block took.
    pub(super) compress: Arc<Mutex<crate::compress::Auto>>,
    /// This session's bytes in flight as told to the observer: sent, not
    /// yet acknowledged (a resent block counts once more, until the session
    /// ends, when what is left is taken back).
    pub(super) in_flight: std::sync::atomic::AtomicI64,
    /// Set by whoever runs the send to stop it: the session ends at the
    /// control thread's next wake, within a keepalive interval.
    pub(super) cancel: Option<Arc<AtomicBool>>,
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Fails the session once its sender is cancelled; says whether it is.
    pub(super) fn check_cancel(&self) -> bool {
        let cancelled = self
            .cancel
            .as_ref()
            .is_some_and(|c| c.load(Ordering::Relaxed));
        if cancelled {
            self.fail(Error::Cancelled {
                last: Box::new(Error::Config("stopped while a session ran".into())),
            });
        }
        cancelled
    }

    /// Carries out what the control core decided: frames to the outbox,
    /// verdicts recorded, an end turned into the session's error (the
    /// first error stands, and none once the session stopped). Says
    /// whether anything was done, so that threads are woken only then.
    pub(super) fn apply_control(&self, g: &mut Inner) -> bool {
        let mut any = false;
        while let Some(action) = g.control.poll_action() {
            any = true;
            match action {
                Action::Send(frame) if !self.stopped() => encode(&frame, &mut g.outbox),
                Action::Send(_) => {}
                Action::Verdict { file_id, verdict } => {
                    g.verdicts.insert(file_id, verdict);
                }
                Action::Close(end) => {
                    if g.error.is_none() && !self.stopped() {
                        g.error = Some(end_error(end));
                    }
                }
                // The plan is taken before the session's threads start.
                Action::Planned(_) => {}
            }
        }
        any
    }

    pub(super) fn fail(&self, e: Error) {
        let mut g = self.lock();
        if g.error.is_none() && !self.stopped() {
            g.error = Some(e);
        }
        drop(g);
        self.cv.notify_all();
    }

    /// Moves this session's bytes in flight (and tells the observer) by `delta`.
    pub(super) fn in_flight(&self, delta: i64) {
        self.in_flight.fetch_add(delta, Ordering::Relaxed);
        self.observer.in_flight(delta);
    }

    pub(super) fn stream_failed(&self, stream: u16, why: &str) {
        let mut g = self.lock();
        if !self.stopped() && g.sched.stream_alive(stream) {
            let n = g.sched.handle_stream_failed(stream);
            // A stream that owed nothing (every block it carried is
            // acknowledged, and none is left for any stream) lost nothing:
            // its close is the receiver ending the session, which can
            // reach this side before the last result does.
            if n == 0 && g.sched.nothing_left_to_send() {
                tracing::debug!(
                    stream,
                    reason = why,
                    "a data stream closed with nothing owed"
                );
            } else {
                self.observer.stream_failed();
                tracing::warn!(
                    stream,
                    reason = why,
                    resent = n,
                    "a data stream failed; its unacknowledged blocks go to the other streams"
                );
                g.cuts.push(format!(
                    "data stream {stream} failed ({why}); its {n} unacknowledged blocks went to the other streams"
                ));
            }
        }
        drop(g);
        self.cv.notify_all();
    }
}

/// A mutex's guard, also after a thread panicked holding it (the data
/// under it is sockets, which stay valid).
pub(super) fn hold<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
