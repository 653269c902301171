//! The writer's verdicts on their way to the control thread, which alone
//! writes on the control connection. An eventfd wakes that thread's poll,
//! so a verdict goes out at once (or, held with a commit batch's, at the
//! batch's end) rather than at its next keepalive.

use std::cell::Cell;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};

use super::stats::Stats;
use crate::error::{Error, Result};
use crate::observe::Observer;
pub(crate) use crate::session::Verdict;
use rustix::event::{EventfdFlags, eventfd};

/// Runs a writer's `work` to its end, a panic included: a bug must not
/// leave the sender waiting forever on a dead writer, so a panic becomes
/// an error the sender is told about (see `VerdictTx::send_failure`).
pub(crate) fn unwound(work: impl FnOnce() -> Result<()>) -> Result<()> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(work))
        .unwrap_or_else(|_| Err(Error::Internal("the writer panicked".into())))
}

/// The writer's end.
pub(crate) struct VerdictTx {
    tx: mpsc::Sender<Verdict>,
    wake: Arc<OwnedFd>,
    /// Verdicts are being held (`hold`): the control thread is woken once,
    /// at the `release`.
    holding: Cell<bool>,
    /// A verdict was queued while holding.
    owed: Cell<bool>,
}

/// The control thread's end.
pub(crate) struct VerdictRx {
    rx: mpsc::Receiver<Verdict>,
    wake: Arc<OwnedFd>,
}

/// A channel whose receiver can be polled beside a socket.
pub(crate) fn channel() -> std::io::Result<(VerdictTx, VerdictRx)> {
    let wake = Arc::new(eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?);
    let (tx, rx) = mpsc::channel();
    Ok((
        VerdictTx {
            tx,
            wake: Arc::clone(&wake),
            holding: Cell::new(false),
            owed: Cell::new(false),
        },
        VerdictRx { rx, wake },
    ))
}

impl VerdictTx {
    /// Queues `v` and wakes the control thread. A control thread that has
    /// gone (the session ended) no longer wants it.
    pub(crate) fn send(&self, v: Verdict) {
        if self.tx.send(v).is_ok() {
            if self.holding.get() {
                self.owed.set(true);
            } else {
                self.wake();
            }
        }
    }

    fn wake(&self) {
        // Cannot fail but by overflowing a counter that is reset on every
        // wake; a missed wake would only delay to the next poll.
        let _ = rustix::io::write(&*self.wake, &1u64.to_ne_bytes());
    }

    /// Verdicts sent from now until `release` wake the control thread
    /// once, at the release: a batch of a thousand small files published
    /// together is answered in one wake and one packed write, not a
    /// thousand of each.
    pub(crate) fn hold(&self) {
        self.holding.set(true);
    }

    /// Ends a `hold`, waking the control thread if a verdict was sent
    /// during it.
    pub(crate) fn release(&self) {
        self.holding.set(false);
        if self.owed.replace(false) {
            self.wake();
        }
    }

    /// Tells the control thread that its writer failed, when `result` says
    /// so: the session ends with that error, and the sender hears whether
    /// retrying can help.
    pub(crate) fn send_failure(&self, result: &Result<()>) {
        // Whatever was held goes now, a panic's unwinding past a release
        // included.
        self.release();
        if let Err(e) = result {
            tracing::error!(error = %e, kind = e.metric_label(), "writer failed");
            self.send(Verdict::Failed {
                retryable: e.is_retryable(),
                message: format!("receiver: {e}"),
            });
        }
    }

    /// Answers a file: counts it in the session's stats, tells `observer`
    /// (none for a memory-to-memory test's file, which is no file
    /// published or failed), and sends its verdict. The control thread
    /// ends the session once every accepted file has its verdict, rather
    /// than a round trip later at the sender's Finish.
    pub(crate) fn answer(&self, stats: &Stats, observer: Option<&dyn Observer>, answer: Answer) {
        let Answer {
            file_id,
            ok,
            digest,
            identity,
            message,
        } = answer;
        let count = if ok {
            &stats.files_ok
        } else {
            &stats.files_failed
        };
        count.fetch_add(1, Ordering::SeqCst);
        if let Some(o) = observer {
            o.file_done(ok);
        }
        self.send(Verdict::File {
            file_id,
            ok,
            digest,
            identity,
            message,
        });
    }
}

/// A file's answer (see `Verdict::File`).
pub(crate) struct Answer {
    pub(crate) file_id: u32,
    pub(crate) ok: bool,
    pub(crate) digest: u128,
    /// The identity of the entry the receiver holds for it.
    pub(crate) identity: u64,
    pub(crate) message: String,
}

impl VerdictRx {
    /// What to poll for readability: set while verdicts wait.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.wake.as_fd()
    }

    /// Every verdict queued so far, in order.
    pub(crate) fn take(&self) -> Vec<Verdict> {
        // Reset before draining: a verdict sent after the drain sets the
        // eventfd again, so none is left waiting without a wake.
        let mut count = [0u8; 8];
        let _ = rustix::io::read(&*self.wake, &mut count);
        self.rx.try_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn woken(rx: &VerdictRx, wait: Duration) -> bool {
        use rustix::event::{PollFd, PollFlags, Timespec, poll};
        let ts = Timespec::try_from(wait).unwrap();
        let mut fds = [PollFd::from_borrowed_fd(rx.fd(), PollFlags::IN)];
        poll(&mut fds, Some(&ts)).unwrap() > 0
    }

    #[test]
    fn a_verdict_from_another_thread_wakes_the_poll_and_keeps_its_order() {
        let (tx, rx) = channel().unwrap();
        assert!(!woken(&rx, Duration::from_millis(10)));
        let t = std::thread::spawn(move || {
            for file_id in 0..3 {
                tx.send(Verdict::File {
                    file_id,
                    ok: true,
                    digest: 0,
                    identity: 0,
                    message: String::new(),
                });
            }
        });
        t.join().unwrap();
        assert!(woken(&rx, Duration::from_secs(5)));
        let ids: Vec<u32> = rx
            .take()
            .into_iter()
            .map(|v| match v {
                Verdict::File { file_id, .. } => file_id,
                Verdict::Failed { .. } => u32::MAX,
            })
            .collect();
        assert_eq!(ids, [0, 1, 2]);
        // Drained and reset: nothing wakes until the next verdict.
        assert!(!woken(&rx, Duration::from_millis(10)));
        assert!(rx.take().is_empty());
    }

    fn file(file_id: u32) -> Verdict {
        Verdict::File {
            file_id,
            ok: true,
            digest: 0,
            identity: 0,
            message: String::new(),
        }
    }

    // Verdicts sent during a hold wake the control thread at its release,
    // and none is held back past it, nor past a failure (the writer's
    // error or panic, which may come between a hold and its release).
    #[test]
    fn held_verdicts_wake_once_at_the_release_or_the_failure() {
        let (tx, rx) = channel().unwrap();
        tx.hold();
        tx.send(file(1));
        tx.send(file(2));
        assert!(!woken(&rx, Duration::from_millis(10)), "woken while held");
        tx.release();
        assert!(woken(&rx, Duration::from_millis(10)));
        assert_eq!(rx.take().len(), 2);
        // A hold with nothing sent owes no wake; a verdict after one wakes
        // at once.
        tx.hold();
        tx.release();
        assert!(!woken(&rx, Duration::from_millis(10)));
        tx.send(file(3));
        assert!(woken(&rx, Duration::from_millis(10)));
        assert_eq!(rx.take().len(), 1);
        tx.hold();
        tx.send(file(4));
        tx.send_failure(&Err(Error::Internal("the writer panicked".into())));
        assert!(woken(&rx, Duration::from_millis(10)));
        assert_eq!(rx.take().len(), 2);
    }
}
