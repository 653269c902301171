//! Disk I/O: the buffer pool and the three I/O modes behind one trait.

pub mod caps;
pub mod hugepages;
pub mod open;
#[allow(unsafe_code)]
pub mod pool;
pub(crate) mod spare;
mod sync;
#[allow(unsafe_code)]
pub mod sys;
#[allow(unsafe_code)]
mod uring;

use std::fs::File;
use std::sync::Arc;

pub use open::{DirectStatus, open_path, open_source};
pub use pool::{Pool, PoolBuf, Pools};
pub use sync::SyncIo;
pub(crate) use sync::read_full;
pub use uring::Uring;

/// O_DIRECT needs offsets, lengths and buffers aligned to this.
pub const ALIGN: usize = crate::tuning::ALIGN as usize;

pub use crate::IoMode;

/// Read into or write from a pool buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    /// Read up to `len` bytes (fewer only at end of file).
    Read,
    /// Write exactly `len` bytes.
    Write,
}

/// One request; it owns its buffer and file until it completes.
pub struct IoOp {
    /// The file.
    pub file: Arc<File>,
    /// Read or write.
    pub kind: OpKind,
    /// The buffer, owned by the op until completion.
    pub buf: PoolBuf,
    /// File offset.
    pub offset: u64,
    /// Bytes to transfer.
    pub len: usize,
    /// The caller's tag, returned with the completion.
    pub tag: u64,
}

/// A finished request: the buffer comes back with the result.
pub struct IoDone {
    /// The caller's tag.
    pub tag: u64,
    /// Read or write.
    pub kind: OpKind,
    /// The buffer; for reads its length is the bytes read.
    pub buf: PoolBuf,
    /// Bytes transferred, or the error.
    pub result: std::io::Result<usize>,
}

/// The I/O modes behind one interface: submit owned ops, reap completions.
pub trait BlockIo: Send {
    /// Queues `op`; its completion comes from `reap`.
    fn submit(&mut self, op: IoOp);
    /// Returns finished ops; with `wait`, blocks until at least one finishes
    /// (when any is in flight).
    fn reap(&mut self, wait: bool) -> crate::Result<Vec<IoDone>>;
    /// Ops submitted and not yet reaped.
    fn in_flight(&self) -> usize;
    /// How many ops may usefully be in flight.
    fn depth(&self) -> usize;
}

/// What the I/O path actually does, for logs and summaries.
#[derive(Debug, Clone, serde::Serialize)]
pub struct IoReport {
    /// The mode in effect after any fallback.
    pub mode: IoMode,
    /// Whether O_DIRECT is in effect.
    pub direct: bool,
    /// Requests in flight.
    pub queue_depth: usize,
    /// Why the requested mode was not fully available, if it was not.
    pub fallback: Option<String>,
}

/// Builds the backend for `mode`, falling back from io_uring to synchronous
/// direct I/O when the kernel refuses a ring.
pub fn backend(mode: IoMode, queue_depth: usize) -> (Box<dyn BlockIo>, IoMode, Option<String>) {
    match mode {
        IoMode::Async => match Uring::new(queue_depth) {
            Ok(u) => (Box::new(u), IoMode::Async, None),
            Err(e) => (
                Box::new(SyncIo::default()),
                IoMode::Direct,
                Some(format!(
                    "{}; using synchronous direct I/O",
                    caps::io_uring_refused(&e)
                )),
            ),
        },
        m => (Box::new(SyncIo::default()), m, None),
    }
}
