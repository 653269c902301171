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

/// A finished batch: the files now durable up to what each job covered,
/// or the first error.
pub(crate) type Done = Result<Vec<(u32, Bitmap)>>;

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
    let mut out = Vec::with_capacity(batch.len());
    for j in batch {
        j.file
            .sync_data()
            .map_err(|e| Error::io(format!("syncing {}", j.rel), e))?;
        let dir = shared.root.dir(&j.parent)?;
        j.checkpoint.store(&dir, &j.ckpt_name)?;
        out.push((j.file_id, j.covered));
    }
    Ok(out)
}
