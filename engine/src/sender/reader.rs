//! The sender's reader: one thread keeping `queue_depth` reads in flight
//! into pool buffers, in the order the scheduler asks, and making sure
//! each file is still the one that was listed from before its first read
//! to after its last (see `source`).

use std::collections::HashMap;
use std::fs::File;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::shared::Shared;
use super::source::{SourceFile, Stamp};
use crate::digest::block_checksum;
use crate::error::{Error, Result};
use crate::io::{ALIGN, DirectStatus, IoMode, IoOp, OpKind, Pools, backend, open_source};

/// What the reader found out about the I/O path.
#[derive(Debug, Default, Clone)]
pub(crate) struct ReadReport {
    pub(crate) mode: Option<IoMode>,
    pub(crate) fallback: Option<String>,
}

struct InFlight {
    file_id: u32,
    block: u64,
    expected: usize,
    digest_only: bool,
}

/// A source file being read.
struct Open {
    file: Arc<File>,
    direct: bool,
    /// Reads submitted and not reaped.
    pending: usize,
    /// The scheduler has handed out its last read.
    all_submitted: bool,
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

pub(crate) fn run(
    shared: &Shared,
    pools: &Pools,
    mode: IoMode,
    depth: usize,
    need_digest: bool,
) -> Result<ReadReport> {
    let (mut io, eff_mode, mut fallback) = backend(mode, depth);
    let mut open: HashMap<u32, Open> = HashMap::new();
    let mut inflight: HashMap<u64, InFlight> = HashMap::new();
    let mut finished_reading = false;
    loop {
        if shared.stopped() {
            break;
        }
        while !finished_reading && io.in_flight() < io.depth() {
            let Some(next_len) = shared.lock().sched.next_read_len() else {
                finished_reading = true;
                break;
            };
            // Only this thread reads, so the block polled below is the one
            // measured here.
            let pool = pools.for_len((next_len as usize).next_multiple_of(ALIGN));
            let buf = if io.in_flight() == 0 {
                pool.get_timeout(Duration::from_millis(100))
            } else {
                pool.try_get()
            };
            let Some(buf) = buf else { break };
            let Some(order) = shared.lock().sched.poll_read() else {
                finished_reading = true;
                break;
            };
            let src = &shared.files[&order.file_id];
            let o = match open.entry(order.file_id) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    match open_checked(shared, src, eff_mode.wants_direct()) {
                        Ok((f, status)) => {
                            if let DirectStatus::Buffered(Some(note)) = &status {
                                if fallback.is_none() {
                                    tracing::warn!("{note}");
                                    fallback = Some(note.clone());
                                }
                            }
                            e.insert(Open {
                                file: Arc::new(f),
                                direct: status.is_direct(),
                                pending: 0,
                                all_submitted: false,
                            })
                        }
                        Err(err) => {
                            give_up(shared, order.file_id, err.to_string());
                            continue;
                        }
                    }
                }
            };
            o.pending += 1;
            o.all_submitted |= order.last_read_of_file;
            let expected = order.len as usize;
            let len = if o.direct {
                expected.next_multiple_of(ALIGN)
            } else {
                expected
            };
            inflight.insert(
                order.gid as u64,
                InFlight {
                    file_id: order.file_id,
                    block: order.block,
                    expected,
                    digest_only: order.digest_only,
                },
            );
            io.submit(IoOp {
                // The op keeps the descriptor alive until it completes.
                file: Arc::clone(&o.file),
                kind: OpKind::Read,
                buf,
                offset: order.offset,
                len,
                tag: order.gid as u64,
            });
        }
        if finished_reading && io.in_flight() == 0 {
            break;
        }
        for done in io.reap(io.in_flight() > 0)? {
            let f = inflight.remove(&done.tag).expect("every read is tracked");
            let src = &shared.files[&f.file_id];
            let n = done.result.map_err(|e| {
                Error::io(
                    format!("reading {} at block {}", src.path.display(), f.block),
                    e,
                )
            })?;
            // A file already given up has no entry; its reads are dropped.
            let Some(o) = open.get_mut(&f.file_id) else {
                continue;
            };
            o.pending -= 1;
            // After the file's last read and before that block is handed
            // on (so before the file can be reported done), it must still
            // be the file that was listed, unchanged.
            let last = o.pending == 0 && o.all_submitted;
            let changed = if n < f.expected || last {
                check(src, &o.file).or_else(|| {
                    (n < f.expected).then(|| {
                        format!(
                            "it shrank while being read (block {} has {n} of {} bytes); \
                             it was not published: send it again once it is stable",
                            f.block, f.expected
                        )
                    })
                })
            } else {
                None
            };
            if last || changed.is_some() {
                open.remove(&f.file_id);
            }
            if let Some(reason) = changed {
                give_up(
                    shared,
                    f.file_id,
                    format!("{}: {reason}", src.path.display()),
                );
                continue;
            }
            let mut buf = done.buf;
            buf.set_len(f.expected);
            // Blocks to send are hashed as they go out (see send_loop);
            // only those the receiver already holds are hashed here.
            let sum = if need_digest && f.digest_only {
                block_checksum(buf.as_slice())
            } else {
                0
            };
            let mut g = shared.lock();
            g.sched.handle_read(done.tag as usize, sum);
            if g.sched.is_ready(done.tag as usize) {
                g.bufs.insert(done.tag as usize, Arc::new(buf));
            }
            drop(g);
            shared
                .read_bytes
                .fetch_add(f.expected as u64, Ordering::Relaxed);
            shared.cv.notify_all();
        }
    }
    Ok(ReadReport {
        mode: Some(eff_mode),
        fallback,
    })
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
