//! The sender reader's per-file decisions, with no I/O: when a source file
//! must be opened and may be closed, how many bytes each read asks for,
//! when a file must be checked against what the scan listed (after its
//! last read, and after a short one), what a completed read becomes (a
//! block handed on, hashed first or not, or dropped because its file was
//! given up), and why a file is given up.
//!
//! The reader shell (`sender::reader`) feeds it the scheduler's read orders
//! and the reads' completions and carries out what it answers; the seeded
//! simulation (`engine/tests/simulation.rs`) drives the same machine over
//! source files that change, shrink or vanish while they are read.
//!
//! A file is checked after its last read and before that block is handed
//! on, so before the file can be reported done: a file that changed at any
//! time between its first read and then is given up, never sent as a mix
//! of two versions.

use std::collections::HashMap;

use crate::scheduler::ReadOrder;
use crate::tuning::ALIGN;

/// A source file with reads in flight, and the shell's handle of it (its
/// descriptor), which goes when the file closes or is given up.
#[derive(Debug)]
struct Reading<F> {
    handle: F,
    /// Opened for direct I/O: reads ask for whole aligned lengths.
    direct: bool,
    /// Reads submitted and not completed.
    pending: u32,
    /// The scheduler has handed out its last read.
    all_submitted: bool,
}

/// A read in flight, by its gid.
#[derive(Debug, Clone, Copy)]
struct InFlight {
    file_id: u32,
    block: u64,
    expected: u64,
    digest_only: bool,
}

/// A completed read waiting for its file's check (`handle_checked`).
#[derive(Debug, Clone, Copy)]
struct Checking {
    read: InFlight,
    got: u64,
    last: bool,
}

/// What a completed read becomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Completed {
    /// Its file was given up: drop the block.
    Dropped,
    /// Check the file against its listing, then call `handle_checked`
    /// with what changed, before the block goes anywhere.
    Check {
        /// Which file.
        file_id: u32,
    },
    /// Hand the block on.
    Ready(ReadyBlock),
    /// Give the file up: nothing more of it is read or sent, and its
    /// descriptor closes.
    GiveUp {
        /// Which file.
        file_id: u32,
        /// Why, for the receiver and the log.
        reason: String,
    },
}

/// A block read whole, to hand on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadyBlock {
    /// Which file.
    pub file_id: u32,
    /// The block's length: the buffer is cut to it (a direct read asked
    /// for more).
    pub len: u64,
    /// Hash it here: the receiver holds it, so it is read for the file's
    /// digest only and never goes out (blocks that go out are hashed as
    /// they are sent).
    pub hash: bool,
    /// The file's last read: the file is closed (its handle let go).
    pub close: bool,
}

/// The reader's per-file state machine; `F` is the shell's handle of an
/// open file (its descriptor; the simulation's is `()`).
#[derive(Debug)]
pub struct SourceReads<F = ()> {
    files: HashMap<u32, Reading<F>>,
    in_flight: HashMap<usize, InFlight>,
    checking: HashMap<usize, Checking>,
    need_digest: bool,
}

impl<F> SourceReads<F> {
    /// A reader whose session verifies files by digest when `need_digest`.
    pub fn new(need_digest: bool) -> Self {
        Self {
            files: HashMap::new(),
            in_flight: HashMap::new(),
            checking: HashMap::new(),
            need_digest,
        }
    }

    /// Whether `file_id` must be opened (and checked against its listing)
    /// before a read of it is submitted: its first read, or its first
    /// since it was closed.
    pub fn needs_open(&self, file_id: u32) -> bool {
        !self.files.contains_key(&file_id)
    }

    /// `file_id` was opened, as `handle`, and found as listed; `direct`
    /// when its reads bypass the page cache.
    pub fn handle_opened(&mut self, file_id: u32, direct: bool, handle: F) {
        self.files.insert(
            file_id,
            Reading {
                handle,
                direct,
                pending: 0,
                all_submitted: false,
            },
        );
    }

    /// `order` is about to be submitted; returns how many bytes the read
    /// asks for. `None` when its file is not open (`needs_open`).
    pub fn handle_submitted(&mut self, order: &ReadOrder) -> Option<u64> {
        let f = self.files.get_mut(&order.file_id)?;
        f.pending += 1;
        f.all_submitted |= order.last_read_of_file;
        self.in_flight.insert(
            order.gid,
            InFlight {
                file_id: order.file_id,
                block: order.block,
                expected: order.len,
                digest_only: order.digest_only,
            },
        );
        Some(if f.direct {
            order.len.next_multiple_of(ALIGN)
        } else {
            order.len
        })
    }

    /// Read `gid` completed with `got` bytes. `None` for a read this
    /// machine never submitted.
    pub fn handle_completed(&mut self, gid: usize, got: u64) -> Option<Completed> {
        let read = self.in_flight.remove(&gid)?;
        let Some(f) = self.files.get_mut(&read.file_id) else {
            return Some(Completed::Dropped);
        };
        f.pending -= 1;
        let last = f.pending == 0 && f.all_submitted;
        if last || got < read.expected {
            self.checking.insert(gid, Checking { read, got, last });
            return Some(Completed::Check {
                file_id: read.file_id,
            });
        }
        Some(Completed::Ready(self.ready(read, false)))
    }

    /// The check `handle_completed` asked for of read `gid`'s file:
    /// `change` says how it is no longer as listed, if it is not. `None`
    /// for a read not waiting for a check.
    pub fn handle_checked(&mut self, gid: usize, change: Option<String>) -> Option<Completed> {
        let Checking { read, got, last } = self.checking.remove(&gid)?;
        let reason = change.or_else(|| {
            (got < read.expected).then(|| {
                format!(
                    "it shrank while being read (block {} has {got} of {} bytes); \
                     it was not published: send it again once it is stable",
                    read.block, read.expected
                )
            })
        });
        if let Some(reason) = reason {
            self.files.remove(&read.file_id);
            return Some(Completed::GiveUp {
                file_id: read.file_id,
                reason,
            });
        }
        if last {
            self.files.remove(&read.file_id);
        }
        Some(Completed::Ready(self.ready(read, last)))
    }

    /// The handle of `file_id` while it is open: from `handle_opened` until
    /// its last read is checked or it is given up (so while a read of it
    /// is in flight or waits for its check).
    pub fn handle(&self, file_id: u32) -> Option<&F> {
        self.files.get(&file_id).map(|f| &f.handle)
    }

    /// `file_id` was given up elsewhere (it could not be opened): reads of
    /// it still in flight are dropped as they complete.
    pub fn handle_given_up(&mut self, file_id: u32) {
        self.files.remove(&file_id);
    }

    fn ready(&self, read: InFlight, close: bool) -> ReadyBlock {
        ReadyBlock {
            file_id: read.file_id,
            len: read.expected,
            hash: self.need_digest && read.digest_only,
            close,
        }
    }

    /// The file and block read `gid` reads, while it is in flight.
    pub fn read_of(&self, gid: usize) -> Option<(u32, u64)> {
        self.in_flight.get(&gid).map(|r| (r.file_id, r.block))
    }

    /// Reads submitted and not completed, or completed and waiting for
    /// their file's check.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len() + self.checking.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(gid: usize, file_id: u32, block: u64, last: bool) -> ReadOrder {
        ReadOrder {
            gid,
            file_id,
            block,
            offset: block * 4096,
            len: 4096,
            digest_only: false,
            last_read_of_file: last,
        }
    }

    fn ready(file_id: u32, close: bool) -> Option<Completed> {
        Some(Completed::Ready(ReadyBlock {
            file_id,
            len: 4096,
            hash: false,
            close,
        }))
    }

    #[test]
    fn a_file_is_checked_once_after_its_last_read_and_then_closes() {
        let mut r = SourceReads::<()>::new(true);
        assert!(r.needs_open(7));
        r.handle_opened(7, false, ());
        assert!(!r.needs_open(7));
        for gid in 0..3 {
            assert_eq!(
                r.handle_submitted(&order(gid, 7, gid as u64, gid == 2)),
                Some(4096)
            );
        }
        // Out of order: the last to complete is the one checked, whichever
        // block it is.
        assert_eq!(r.handle_completed(2, 4096), ready(7, false));
        assert_eq!(r.handle_completed(0, 4096), ready(7, false));
        assert_eq!(
            r.handle_completed(1, 4096),
            Some(Completed::Check { file_id: 7 })
        );
        assert_eq!(r.handle_checked(1, None), ready(7, true));
        assert!(r.needs_open(7));
        assert_eq!(r.in_flight(), 0);
    }

    #[test]
    fn a_file_that_changed_is_given_up_and_its_later_reads_dropped() {
        let mut r = SourceReads::<()>::new(true);
        r.handle_opened(1, false, ());
        r.handle_submitted(&order(0, 1, 0, false));
        r.handle_submitted(&order(1, 1, 1, true));
        // A short read is checked at once, before the file's last.
        assert_eq!(
            r.handle_completed(0, 100),
            Some(Completed::Check { file_id: 1 })
        );
        let Some(Completed::GiveUp { file_id: 1, reason }) = r.handle_checked(0, None) else {
            panic!("a short read must give the file up");
        };
        assert!(reason.contains("shrank while being read (block 0 has 100 of 4096 bytes)"));
        assert_eq!(r.handle_completed(1, 4096), Some(Completed::Dropped));
        // The check's own finding comes first.
        r.handle_opened(2, false, ());
        r.handle_submitted(&order(2, 2, 0, true));
        assert_eq!(
            r.handle_completed(2, 4096),
            Some(Completed::Check { file_id: 2 })
        );
        assert_eq!(
            r.handle_checked(2, Some("its mtime changed".into())),
            Some(Completed::GiveUp {
                file_id: 2,
                reason: "its mtime changed".into()
            })
        );
        assert_eq!(r.in_flight(), 0);
    }

    #[test]
    fn direct_reads_ask_for_aligned_lengths_and_held_blocks_are_hashed_here() {
        let mut r = SourceReads::<()>::new(true);
        r.handle_opened(3, true, ());
        let mut o = order(0, 3, 0, true);
        o.len = 100;
        o.digest_only = true;
        assert_eq!(r.handle_submitted(&o), Some(ALIGN));
        assert_eq!(
            r.handle_completed(0, 100),
            Some(Completed::Check { file_id: 3 })
        );
        assert_eq!(
            r.handle_checked(0, None),
            Some(Completed::Ready(ReadyBlock {
                file_id: 3,
                len: 100,
                hash: true,
                close: true
            }))
        );
        // Without digests nothing is hashed; unknown reads are refused.
        let mut r = SourceReads::<()>::new(false);
        r.handle_opened(3, false, ());
        r.handle_submitted(&o);
        r.handle_completed(0, 100);
        assert!(matches!(
            r.handle_checked(0, None),
            Some(Completed::Ready(ReadyBlock { hash: false, .. }))
        ));
        assert_eq!(r.handle_completed(9, 1), None);
        assert_eq!(r.handle_checked(9, None), None);
        // Not open: nothing is submitted.
        assert_eq!(r.handle_submitted(&order(4, 8, 0, true)), None);
    }
}
