//! The sender's reader: one thread keeping `queue_depth` reads in flight
//! into pool buffers, in the order the scheduler asks.

use std::collections::HashMap;
use std::fs::File;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::session::Shared;
use crate::engine::digest::block_checksum;
use crate::error::{Error, Result};
use crate::io::{ALIGN, IoMode, IoOp, OpKind, Pools, backend, open_source};

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

pub(crate) fn run(
    shared: &Shared,
    pools: &Pools,
    mode: IoMode,
    depth: usize,
    need_digest: bool,
) -> Result<ReadReport> {
    let (mut io, eff_mode, mut fallback) = backend(mode, depth);
    let mut open: HashMap<u32, (Arc<File>, bool)> = HashMap::new();
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
            let (file, direct) = match open.get(&order.file_id) {
                Some(f) => f.clone(),
                None => {
                    let (f, status) = open_source(&src.path, eff_mode.wants_direct())?;
                    if let crate::io::DirectStatus::Buffered(Some(note)) = &status {
                        if fallback.is_none() {
                            tracing::warn!("{note}");
                            fallback = Some(note.clone());
                        }
                    }
                    let entry = (Arc::new(f), status.is_direct());
                    open.insert(order.file_id, entry.clone());
                    entry
                }
            };
            if order.last_read_of_file {
                // The op keeps the descriptor alive until it completes.
                open.remove(&order.file_id);
            }
            let expected = order.len as usize;
            let len = if direct {
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
                file,
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
            let path = &shared.files[&f.file_id].path;
            let n = done.result.map_err(|e| {
                Error::io(
                    format!("reading {} at block {}", path.display(), f.block),
                    e,
                )
            })?;
            if n < f.expected {
                return Err(Error::Transfer(format!(
                    "{} shrank while being read (block {} has {n} of {} bytes); it must not change during a transfer",
                    path.display(),
                    f.block,
                    f.expected
                )));
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
