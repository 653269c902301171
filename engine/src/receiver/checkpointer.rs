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
use crate::Bitmap;
use crate::error::{Error, Result};

/// One file to make durable up to `covered`, then checkpoint.
pub(crate) struct Job {
    pub(crate) file_id: u32,
    pub(crate) file: Arc<File>,
    pub(crate) rel: String,
    pub(crate) parent: String,
    pub(crate) ckpt_name: String,
    /// The partial file's name, to check it is still `file`.
    pub(crate) part_name: String,
    pub(crate) checkpoint: Checkpoint,
    pub(crate) covered: Bitmap,
    /// Store the checkpoint after the sync (not for a temporary file that
    /// several receivers share).
    pub(crate) store: bool,
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
            .spawn(crate::spans::carry(move || {
                for batch in job_rx {
                    if done_tx.send(run(&shared, batch)).is_err() {
                        break;
                    }
                }
            }))
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
            .ok_or_else(|| Error::Internal("the checkpoint thread stopped".into()))?;
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
                Some(Err(Error::Internal("the checkpoint thread stopped".into())))
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
        if !j.store {
            out.synced.push((j.file_id, j.covered, false));
            continue;
        }
        let dir = shared.root.dir(&j.parent);
        // Another session (another agent, after this one was failed over
        // while stuck) may have taken the file over and published it: then
        // this session must neither write its checkpoint beside the
        // published file nor go on.
        if let Ok(dir) = &dir
            && !still_ours(dir, &j.part_name, &j.file)
        {
            return Err(Error::TakenOver {
                path: j.rel.clone(),
            });
        }
        let stored = dir.and_then(|dir| j.checkpoint.store(&dir, &j.ckpt_name));
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

/// Whether `name` in `dir` is still the file `file` is open on.
pub(crate) fn still_ours(dir: &std::os::fd::OwnedFd, name: &str, file: &File) -> bool {
    use rustix::fs::{AtFlags, fstat, statat};
    match (statat(dir, name, AtFlags::SYMLINK_NOFOLLOW), fstat(file)) {
        (Ok(at), Ok(open)) => at.st_dev == open.st_dev && at.st_ino == open.st_ino,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::still_ours;

    // Found by e2e: a receiver stuck on its storage, failed over and then
    // thawed, stored its checkpoint beside the file the new receiver had
    // published (and went on writing). A session now checks that the
    // partial file is still the one it has open.
    #[test]
    fn a_partial_file_taken_over_or_published_is_no_longer_ours() {
        let dir = tempfile::tempdir().unwrap();
        let fd: std::os::fd::OwnedFd = std::fs::File::open(dir.path()).unwrap().into();
        let part = dir.path().join(".f.wirerate-part");
        let file = std::fs::File::create(&part).unwrap();
        assert!(still_ours(&fd, ".f.wirerate-part", &file));
        // Published by another session: renamed to its final name.
        std::fs::rename(&part, dir.path().join("f")).unwrap();
        assert!(!still_ours(&fd, ".f.wirerate-part", &file));
        // Another session's new partial file under the same name.
        std::fs::write(&part, b"theirs").unwrap();
        assert!(!still_ours(&fd, ".f.wirerate-part", &file));
    }
}
