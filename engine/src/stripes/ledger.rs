//! What is known of each file's blocks: which are durable at the shared
//! destination, with which checksum, and who may still write to the file.
//!
//! Any pair's receiver may acknowledge any block of a file it was handed,
//! and a block can be written twice (by a pair thought lost and by its
//! successor). Both writes carry the source's bytes, so they agree; two
//! acknowledgements of one block that disagree mean the source changed
//! while it was read, and the file is given up. The whole-file digest is
//! built from the acknowledged checksums in block order.

use crate::digest::file_digest;
use crate::{Bitmap, Layout};

use super::split::Piece;

/// How a file ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GiveUp {
    /// Two acknowledgements of one block disagreed, or the source no
    /// longer matches its listing: it changed while it was sent.
    SourceChanged,
    /// The temporary file does not match the acknowledged checksums.
    Mismatch,
    /// The shell gave it up: a receiver refused it, or its pieces failed
    /// more often than the shell allows.
    Failed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Open,
    Failing(GiveUp),
    Verifying,
    Published,
    GivenUp,
}

/// One file of the plan.
#[derive(Debug)]
pub(super) struct FileLedger {
    layout: Layout,
    acked: Bitmap,
    acked_count: u64,
    sums: Vec<u64>,
    opened: bool,
    /// Live items that may still write to the file: until each is
    /// finished or its pair fenced, the file is neither verified nor
    /// given up.
    holders: u32,
    end: End,
}

/// What a file is ready for, once nothing can write to it any more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ready {
    /// Every block is acknowledged: verify against this digest.
    Verify(u128),
    /// Give it up, for this reason.
    GiveUp(GiveUp),
}

impl FileLedger {
    pub(super) fn new(size: u64, block_size: u64) -> Self {
        let layout = Layout::new(size, block_size);
        let blocks = layout.blocks();
        Self {
            layout,
            acked: Bitmap::new(blocks),
            acked_count: 0,
            sums: vec![0; usize::try_from(blocks).unwrap_or(0)],
            opened: false,
            holders: 0,
            end: End::Open,
        }
    }

    pub(super) fn blocks(&self) -> u64 {
        self.layout.blocks()
    }

    pub(super) fn size(&self) -> u64 {
        self.layout.size
    }

    /// True while its blocks are still wanted.
    pub(super) fn is_open(&self) -> bool {
        self.end == End::Open
    }

    /// True while a `Verify` for it waits for its answer.
    pub(super) fn is_verifying(&self) -> bool {
        self.end == End::Verifying
    }

    pub(super) fn is_ended(&self) -> bool {
        matches!(self.end, End::Published | End::GivenUp)
    }

    pub(super) fn hold(&mut self) {
        self.holders += 1;
    }

    pub(super) fn release(&mut self) {
        self.holders = self.holders.saturating_sub(1);
    }

    /// Records `sums` for the blocks from `first`; returns the bytes newly
    /// durable. A disagreement fails the file.
    pub(super) fn ack(&mut self, first: u64, sums: &[u64]) -> u64 {
        self.opened = true;
        let mut new = 0;
        for (block, &sum) in (first..).zip(sums) {
            let i = block as usize;
            if self.acked.get(block) {
                if self.sums[i] != sum {
                    self.fail(GiveUp::SourceChanged);
                }
                continue;
            }
            self.acked.set(block);
            self.acked_count += 1;
            self.sums[i] = sum;
            new += self.layout.len(block);
        }
        new
    }

    /// The file is to be given up once nothing writes to it.
    pub(super) fn fail(&mut self, why: GiveUp) {
        if matches!(self.end, End::Open | End::Verifying) {
            self.end = End::Failing(why);
        }
    }

    /// The unacknowledged runs of `piece`; an empty file's piece while
    /// nobody has created the file.
    pub(super) fn unacked_runs(&self, piece: &Piece) -> Vec<Piece> {
        if piece.blocks() == 0 {
            return if self.opened { vec![] } else { vec![*piece] };
        }
        let mut runs = Vec::new();
        let mut start = None;
        for b in piece.first..piece.end {
            match (self.acked.get(b), start) {
                (false, None) => start = Some(b),
                (true, Some(s)) => {
                    runs.push(Piece {
                        first: s,
                        end: b,
                        ..*piece
                    });
                    start = None;
                }
                _ => {}
            }
        }
        if let Some(s) = start {
            runs.push(Piece {
                first: s,
                end: piece.end,
                ..*piece
            });
        }
        runs
    }

    /// Blocks of `piece` still unacknowledged (an uncreated empty file
    /// counts as one).
    pub(super) fn unacked_in(&self, piece: &Piece) -> u64 {
        if piece.blocks() == 0 {
            return u64::from(!self.opened);
        }
        (piece.first..piece.end)
            .filter(|&b| !self.acked.get(b))
            .count() as u64
    }

    /// What the file is ready for, if anything: only once no live item
    /// holds it, so nothing can write to it after it is checked.
    pub(super) fn ready(&mut self) -> Option<Ready> {
        if self.holders > 0 {
            return None;
        }
        match self.end {
            End::Failing(why) => {
                self.end = End::GivenUp;
                Some(Ready::GiveUp(why))
            }
            End::Open if self.opened && self.acked_count == self.blocks() => {
                self.end = End::Verifying;
                Some(Ready::Verify(file_digest(&self.sums)))
            }
            _ => None,
        }
    }

    /// True if the file was waiting for its check, and now is published.
    pub(super) fn publish(&mut self) -> bool {
        let was = self.end == End::Verifying;
        if was {
            self.end = End::Published;
        }
        was
    }

    pub(super) fn acked_bytes(&self) -> u64 {
        self.layout.bytes_in(&self.acked)
    }
}
