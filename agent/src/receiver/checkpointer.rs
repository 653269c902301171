//! Syncs files and stores their checkpoints on a thread of its own, so the
//! writer keeps writes in flight meanwhile. An fdatasync plus a durable
//! checkpoint replace costs a few journal commits; done by the writer, the
//! disk idled for that long every checkpoint interval.
#![forbid(unsafe_code)]

use std::fs::File;
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;

use super::Shared;
use super::checkpoint::Checkpoint;
use crate::engine::Bitmap;
use crate::error::{Error, Result};

/// One file to make durable up to `covered`, then checkpoint.
pub(crate) struct Job {
    pub(crate) file_id: u32,
    pub(crate) file: Arc<File>,
    pub(crate) rel: String,
    pub(crate) parent: String,
    pub(crate) ckpt_name: String,
    pub(crate) checkpoint: Checkpoint,
    pub(crate) covered: Bitmap,
}

/// A finished batch, or the first error syncing a file's data (which
/// means written blocks may be lost, so the session cannot go on).
pub(crate) type Done = Result<Batch>;

/// What a batch made durable and recorded.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    /// Files now durable up to what each job covered, and whether their
    /// checkpoint was stored.
    pub(crate) synced: Vec<(u32, Bitmap, bool)>,
    /// Checkpoints that could not be stored, and why. Not fatal: the
    /// blocks are durable all the same, a later checkpoint records them,
    /// and until then a crash costs only their resending.
    pub(crate) warnings: Vec<String>,
}

/// The background thread; one batch at a time.
pub(crate) struct Checkpointer {
    jobs: Option<mpsc::Sender<Vec<Job>>>,
    done: mpsc::Receiver<Done>,
    busy: bool,
    thread: Option<JoinHandle<()>>,
}

impl Checkpointer {
    pub(crate) fn start(shared: Arc<Shared>) -> Result<Self> {
        let (jobs, job_rx) = mpsc::channel::<Vec<Job>>();
        let (done_tx, done) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("checkpoint".into())
            .spawn(move || {
                for batch in job_rx {
                    if done_tx.send(run(&shared, batch)).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| Error::io("starting the checkpoint thread", e))?;
        Ok(Self {
            jobs: Some(jobs),
            done,
            busy: false,
            thread: Some(thread),
        })
    }

    /// Whether a batch is being synced.
    pub(crate) fn busy(&self) -> bool {
        self.busy
    }

    /// Hands over a batch; the caller checks `busy` first.
    pub(crate) fn submit(&mut self, batch: Vec<Job>) -> Result<()> {
        debug_assert!(!self.busy, "one batch at a time");
        self.jobs
            .as_ref()
            .and_then(|j| j.send(batch).ok())
            .ok_or_else(|| Error::Transfer("the checkpoint thread stopped".into()))?;
        self.busy = true;
        Ok(())
    }

    /// The finished batch, waiting for it when `wait`; `None` when none is
    /// due (or, without `wait`, not finished yet).
    pub(crate) fn poll(&mut self, wait: bool) -> Option<Done> {
        if !self.busy {
            return None;
        }
        let got = if wait {
            self.done.recv().map_err(|_| ())
        } else {
            self.done.try_recv().map_err(|_| ())
        };
        match got {
            Ok(d) => {
                self.busy = false;
                Some(d)
            }
            Err(()) if wait => {
                self.busy = false;
                Some(Err(Error::Transfer("the checkpoint thread stopped".into())))
            }
            Err(()) => None,
        }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(shared: &Shared, batch: Vec<Job>) -> Done {
    let mut out = Batch::default();
    for j in batch {
        j.file
            .sync_data()
            .map_err(|e| Error::disk(format!("syncing {}", j.rel), e))?;
        let stored = shared
            .root
            .dir(&j.parent)
            .and_then(|dir| j.checkpoint.store(&dir, &j.ckpt_name));
        if let Err(e) = &stored {
            out.warnings.push(format!(
                "checkpoint of {} not stored ({e}); the transfer goes on, and a crash would resend its blocks",
                j.rel
            ));
        }
        out.synced.push((j.file_id, j.covered, stored.is_ok()));
    }
    Ok(out)
}
