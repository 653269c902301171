//! Async mode: many O_DIRECT requests in flight on one io_uring.
//!
//! Each op owns its pool buffer and an `Arc<File>` in a slot of the op
//! table until its completion is reaped, so the kernel never sees memory
//! or a descriptor that was freed. Ops that find the submission queue full
//! wait in a backlog that is served first; short transfers and EINTR/EAGAIN
//! resubmit the rest; completions are collected before any is handled.

use std::collections::VecDeque;
use std::io;
use std::os::fd::AsRawFd;

use io_uring::{IoUring, opcode, types};

use super::{BlockIo, IoDone, IoOp, OpKind};
use crate::error::{Error, Result};

struct Slot {
    op: IoOp,
    done: usize,
}

/// The io_uring backend.
pub struct Uring {
    ring: IoUring,
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
    backlog: VecDeque<usize>,
    in_kernel: usize,
    in_table: usize,
    depth: usize,
    finished: Vec<IoDone>,
}

impl Uring {
    /// A ring for `depth` requests in flight.
    pub fn new(depth: usize) -> io::Result<Self> {
        let depth = depth.clamp(1, 4096);
        let ring = IoUring::new(depth.next_power_of_two() as u32)?;
        Ok(Self {
            ring,
            slots: Vec::new(),
            free: Vec::new(),
            backlog: VecDeque::new(),
            in_kernel: 0,
            in_table: 0,
            depth,
            finished: Vec::new(),
        })
    }

    fn push_backlog(&mut self) {
        while let Some(&idx) = self.backlog.front() {
            let Some(slot) = self.slots[idx].as_mut() else {
                self.backlog.pop_front();
                continue;
            };
            let fd = types::Fd(slot.op.file.as_raw_fd());
            let remaining = (slot.op.len - slot.done) as u32;
            let offset = slot.op.offset + slot.done as u64;
            // SAFETY: `done < len <= capacity`, so the pointer stays inside
            // the op's own buffer.
            let ptr = unsafe { slot.op.buf.as_mut_ptr().add(slot.done) };
            let entry = match slot.op.kind {
                OpKind::Read => opcode::Read::new(fd, ptr, remaining).offset(offset).build(),
                OpKind::Write => opcode::Write::new(fd, ptr, remaining)
                    .offset(offset)
                    .build(),
            }
            .user_data(idx as u64);
            // SAFETY: the buffer and the file are owned by `slots[idx]`,
            // which is only emptied after this entry's completion is reaped
            // (and Drop waits for every completion), so both outlive the op.
            if unsafe { self.ring.submission().push(&entry) }.is_err() {
                break; // SQ full: keep the rest queued, served first next time.
            }
            self.backlog.pop_front();
            self.in_kernel += 1;
        }
    }

    fn submit(&mut self, wait: bool) -> Result<()> {
        loop {
            let want = usize::from(wait && self.in_kernel > 0);
            match self.ring.submit_and_wait(want) {
                Ok(_) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                // The completion queue is full: the caller reaps, then retries.
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => return Ok(()),
                Err(e) => return Err(Error::io("submitting to io_uring", e)),
            }
        }
    }

    fn complete(&mut self, idx: usize, result: io::Result<usize>) {
        if let Some(mut slot) = self.slots[idx].take() {
            if slot.op.kind == OpKind::Read {
                slot.op.buf.set_len(slot.done);
            }
            self.free.push(idx);
            self.in_table -= 1;
            self.finished.push(IoDone {
                tag: slot.op.tag,
                kind: slot.op.kind,
                buf: slot.op.buf,
                result,
            });
        }
    }

    fn handle_cqes(&mut self) {
        let cqes: Vec<(usize, i32)> = self
            .ring
            .completion()
            .map(|c| (c.user_data() as usize, c.result()))
            .collect();
        for (idx, res) in cqes {
            self.in_kernel -= 1;
            let Some(slot) = self.slots.get_mut(idx).and_then(Option::as_mut) else {
                continue;
            };
            if res < 0 {
                let errno = -res;
                if errno == libc::EINTR || errno == libc::EAGAIN {
                    self.backlog.push_back(idx);
                } else {
                    self.complete(idx, Err(io::Error::from_raw_os_error(errno)));
                }
                continue;
            }
            let n = res as usize;
            slot.done += n;
            let kind = slot.op.kind;
            if slot.done >= slot.op.len || (n == 0 && kind == OpKind::Read) {
                let done = slot.done;
                self.complete(idx, Ok(done));
            } else if n == 0 {
                self.complete(
                    idx,
                    Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        "write made no progress",
                    )),
                );
            } else {
                self.backlog.push_back(idx);
            }
        }
    }
}

impl BlockIo for Uring {
    fn submit(&mut self, mut op: IoOp) {
        op.len = op.len.min(op.buf.capacity());
        if op.len == 0 {
            self.finished.push(IoDone {
                tag: op.tag,
                kind: op.kind,
                buf: op.buf,
                result: Ok(0),
            });
            return;
        }
        let slot = Slot { op, done: 0 };
        let idx = match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(slot);
                i
            }
            None => {
                self.slots.push(Some(slot));
                self.slots.len() - 1
            }
        };
        self.in_table += 1;
        self.backlog.push_back(idx);
        self.push_backlog();
    }

    fn reap(&mut self, wait: bool) -> Result<Vec<IoDone>> {
        loop {
            self.push_backlog();
            let block = wait && self.finished.is_empty();
            self.submit(block)?;
            self.handle_cqes();
            if !self.finished.is_empty() || !block || self.in_table == 0 {
                return Ok(std::mem::take(&mut self.finished));
            }
        }
    }

    fn in_flight(&self) -> usize {
        self.in_table + self.finished.len()
    }

    fn depth(&self) -> usize {
        self.depth
    }
}

impl Drop for Uring {
    fn drop(&mut self) {
        // The kernel may still write into buffers owned by the table: wait
        // for every submitted op before the buffers go back to the pool.
        self.backlog.clear();
        while self.in_kernel > 0 {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(_) => break,
            }
            let n = self.ring.completion().count();
            self.in_kernel = self.in_kernel.saturating_sub(n);
        }
    }
}
