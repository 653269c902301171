//! The sender's reader: one thread keeping `queue_depth` reads in flight
//! into pool buffers, in the order the scheduler asks, and making sure
//! each file is still the one that was listed from before its first read
//! to after its last (see `source`).

use std::fs::File;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::shared::Shared;
use super::source::{SourceFile, Stamp};
use crate::digest::block_checksum;
use crate::error::{Error, Result};
use crate::io::{
    ALIGN, BlockIo, DirectStatus, IoDone, IoMode, IoOp, OpKind, PoolBuf, Pools, backend,
    open_source,
};
use crate::session::reading::{Completed, ReadyBlock, SourceReads};

/// What the reader found out about the I/O path.
#[derive(Debug, Default, Clone)]
pub(crate) struct ReadReport {
    pub(crate) mode: Option<IoMode>,
    pub(crate) fallback: Option<String>,
}

/// The file's state now against what the scan saw: the reason to give it
/// up, if it is no longer the same.
fn check(src: &SourceFile, file: &File) -> Option<String> {
    let now = match file.metadata() {
        Ok(m) => Stamp::of(&m),
        Err(e) => return Some(format!("cannot inspect it: {e}")),
    };
    src.stamp
        .change_to(&now)
        .map(|c| format!("{c}; it was not published: send it again once it is stable"))
}

/// Opens `src` beneath the source root and checks it is still the file
/// that was listed.
fn open_checked(shared: &Shared, src: &SourceFile, direct: bool) -> Result<(File, DirectStatus)> {
    let (file, status) = open_source(&shared.base, &src.rel, &src.path, direct)?;
    match check(src, &file) {
        None => Ok((file, status)),
        Some(reason) => Err(Error::SourceChanged {
            path: src.path.display().to_string(),
            reason,
        }),
    }
}

/// Gives a file up: the scheduler drops what is left of it, and its read
/// blocks' buffers go back to the pool.
fn give_up(shared: &Shared, file_id: u32, reason: String) {
    tracing::warn!("{reason}");
    let mut g = shared.lock();
    for gid in g.sched.handle_file_failed(file_id, reason) {
        g.bufs.remove(&gid);
    }
    drop(g);
    shared.cv.notify_all();
}

/// The reader shell: the I/O backend, the open source files, and the core
/// that decides what each read and each file comes to.
struct Reader<'a> {
    shared: &'a Shared,
    pools: &'a Pools,
    io: Box<dyn BlockIo>,
    mode: IoMode,
    fallback: Option<String>,
    /// Holds each open file's descriptor; a read op holds one too, until
    /// it completes.
    core: SourceReads<Arc<File>>,
    finished_reading: bool,
}

pub(crate) fn run(
    shared: &Shared,
    pools: &Pools,
    mode: IoMode,
    depth: usize,
    need_digest: bool,
) -> Result<ReadReport> {
    let (io, mode, fallback) = backend(mode, depth);
    let mut r = Reader {
        shared,
        pools,
        io,
        mode,
        fallback,
        core: SourceReads::new(need_digest),
        finished_reading: false,
    };
    while !shared.stopped() {
        r.submit_reads()?;
        if r.finished_reading && r.io.in_flight() == 0 {
            break;
        }
        let wait = r.io.in_flight() > 0;
        for done in r.io.reap(wait)? {
            r.completed(done)?;
        }
    }
    Ok(ReadReport {
        mode: Some(r.mode),
        fallback: r.fallback,
    })
}

impl Reader<'_> {
    /// Keeps the backend's queue full with the reads the scheduler asks
    /// for, while pool buffers are free.
    fn submit_reads(&mut self) -> Result<()> {
        while !self.finished_reading && self.io.in_flight() < self.io.depth() {
            let Some(next_len) = self.shared.lock().sched.next_read_len() else {
                self.finished_reading = true;
                return Ok(());
            };
            // Only this thread reads, so the block polled below is the one
            // measured here.
            let pool = self
                .pools
                .for_len((next_len as usize).next_multiple_of(ALIGN));
            let buf = if self.io.in_flight() == 0 {
                pool.get_timeout(Duration::from_millis(100))
            } else {
                pool.try_get()
            };
            let Some(buf) = buf else { return Ok(()) };
            let Some(order) = self.shared.lock().sched.poll_read() else {
                self.finished_reading = true;
                return Ok(());
            };
            if self.core.needs_open(order.file_id) && !self.open_file(order.file_id) {
                continue;
            }
            // Open now (`open_file`): a read order dropped here would
            // leave its file never done.
            let len = self.core.handle_submitted(&order);
            let (Some(len), Some(file)) = (len, self.core.handle(order.file_id).map(Arc::clone))
            else {
                return Err(Error::Internal(format!(
                    "read {} of file {} has no open descriptor",
                    order.gid, order.file_id
                )));
            };
            self.io.submit(IoOp {
                // The op keeps the descriptor alive until it completes.
                file,
                kind: OpKind::Read,
                buf,
                offset: order.offset,
                len: len as usize,
                tag: order.gid as u64,
            });
        }
        Ok(())
    }

    /// Opens `file_id` for its first read and checks it is as listed;
    /// gives it up when not.
    fn open_file(&mut self, file_id: u32) -> bool {
        let src = &self.shared.files[&file_id];
        match open_checked(self.shared, src, self.mode.wants_direct()) {
            Ok((f, status)) => {
                if let DirectStatus::Buffered(Some(note)) = &status {
                    if self.fallback.is_none() {
                        tracing::warn!("{note}");
                        self.fallback = Some(note.clone());
                    }
                }
                self.core
                    .handle_opened(file_id, status.is_direct(), Arc::new(f));
                true
            }
            Err(err) => {
                self.core.handle_given_up(file_id);
                give_up(self.shared, file_id, err.to_string());
                false
            }
        }
    }

    /// A read completed: the core says whether the file must be checked
    /// first, and whether the block goes on, is dropped, or gives its
    /// file up.
    fn completed(&mut self, done: IoDone) -> Result<()> {
        let gid = done.tag as usize;
        let Some((file_id, block)) = self.core.read_of(gid) else {
            return Err(Error::Internal(format!("read {gid} completed untracked")));
        };
        let src = &self.shared.files[&file_id];
        let got = done.result.map_err(|e| {
            Error::io(
                format!("reading {} at block {block}", src.path.display()),
                e,
            )
        })?;
        let mut next = self.core.handle_completed(gid, got as u64);
        if let Some(Completed::Check { file_id }) = next {
            // After the file's last read and before that block is handed
            // on (so before the file can be reported done), it must still
            // be the file that was listed, unchanged.
            let change = match self.core.handle(file_id) {
                Some(f) => check(src, f),
                // Never unchecked: a file whose descriptor is gone is not
                // known to be as listed.
                None => Some("its descriptor closed before its last read was checked".into()),
            };
            next = self.core.handle_checked(gid, change);
        }
        match next {
            // The core has closed the file's descriptor where its last read
            // was handed on, or the file was given up.
            Some(Completed::Ready(block)) => self.hand_on(gid, done.buf, block),
            Some(Completed::GiveUp { file_id, reason }) => {
                give_up(
                    self.shared,
                    file_id,
                    format!("{}: {reason}", src.path.display()),
                );
            }
            // A file already given up: its reads are dropped.
            Some(Completed::Dropped | Completed::Check { .. }) | None => {}
        }
        Ok(())
    }

    /// A block read whole goes to the scheduler, and its buffer to the
    /// senders when the scheduler wants it sent.
    fn hand_on(&self, gid: usize, mut buf: PoolBuf, block: ReadyBlock) {
        buf.set_len(block.len as usize);
        // Blocks to send are hashed as they go out (see send_loop);
        // only those the receiver already holds are hashed here.
        let sum = if block.hash {
            block_checksum(buf.as_slice())
        } else {
            0
        };
        let mut g = self.shared.lock();
        g.sched.handle_read(gid, sum);
        if g.sched.is_ready(gid) {
            g.bufs.insert(gid, Arc::new(buf));
        }
        drop(g);
        self.shared
            .read_bytes
            .fetch_add(block.len, Ordering::Relaxed);
        self.shared.cv.notify_all();
    }
}

/// Checks the files that have no block to read (empty ones), which the
/// reader never opens, and gives up those no longer as listed. Called
/// before the session reports any file.
pub(crate) fn check_empty(shared: &Shared, ids: &[u32]) {
    for id in ids {
        if let Err(e) = open_checked(shared, &shared.files[id], false) {
            give_up(shared, *id, e.to_string());
        }
    }
}
