//! How a Transfer's files are cut into work for several pairs.
//!
//! A large file is cut into chunks of whole blocks, each starting and
//! ending on a stripe boundary where the destination is striped (Lustre),
//! so that two receivers never write into one stripe object's unit at
//! once. Files smaller than a chunk are bundled whole, a bundle holding
//! about `Geometry::bundle_bytes` (a chunk's at most, and less where a
//! chunk's floor of blocks per stream would leave a tree in a handful of
//! items): a tree is split by files, balanced by bytes.
//! The largest work goes first, so that the last pieces handed out are
//! the small ones and the pairs finish together.

use std::collections::VecDeque;

use crate::Layout;

/// One contiguous run of one file's blocks, `first..end`. A piece of an
/// empty file has no blocks: it stands for creating the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Piece {
    /// The file's id in the plan.
    pub file: u32,
    /// Its first block.
    pub first: u64,
    /// One past its last block.
    pub end: u64,
}

impl Piece {
    /// Blocks in the piece.
    pub fn blocks(&self) -> u64 {
        self.end - self.first
    }
}

/// What the pairs are handed: pieces one pair works through in order.
pub type Work = Vec<Piece>;

/// Why a split cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SplitError {
    /// The block size is 0.
    #[error("the block size must be above 0")]
    NoBlockSize,
    /// The stripe size is 0.
    #[error("the destination's stripe size must be above 0")]
    NoStripeSize,
    /// Block and stripe sizes whose common multiple is too large to be a
    /// chunk boundary.
    #[error(
        "block size {block} and stripe size {stripe} have no common multiple at or under {max} bytes"
    )]
    NoCommonBoundary {
        /// The block size.
        block: u64,
        /// The stripe size.
        stripe: u64,
        /// The largest grain allowed.
        max: u64,
    },
}

/// The largest grain (block and stripe boundary) allowed: 4 GiB.
pub const MAX_GRAIN: u64 = 4 << 30;

/// The split's geometry: what the operator records as the stripe settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    block_size: u64,
    stripe_size: Option<u64>,
    grain_blocks: u64,
    chunk_blocks: u64,
    bundle_bytes: u64,
    bundle_blocks: u64,
}

impl Geometry {
    /// Chunks of about `chunk_bytes`, in `block_size` blocks, on
    /// `stripe_size` boundaries where the destination is striped. The
    /// chunk is rounded up to whole grains (at least one).
    pub fn new(
        block_size: u64,
        chunk_bytes: u64,
        stripe_size: Option<u64>,
    ) -> Result<Self, SplitError> {
        if block_size == 0 {
            return Err(SplitError::NoBlockSize);
        }
        let grain_bytes = match stripe_size {
            None => block_size,
            Some(0) => return Err(SplitError::NoStripeSize),
            Some(s) => lcm(block_size, s)
                .filter(|&g| g <= MAX_GRAIN.max(block_size))
                .ok_or(SplitError::NoCommonBoundary {
                    block: block_size,
                    stripe: s,
                    max: MAX_GRAIN.max(block_size),
                })?,
        };
        let grain_blocks = grain_bytes / block_size;
        let grains = chunk_bytes.div_ceil(grain_bytes).max(1);
        Ok(Self {
            block_size,
            stripe_size,
            grain_blocks,
            chunk_blocks: grains.saturating_mul(grain_blocks),
            bundle_bytes: u64::MAX,
            bundle_blocks: 0,
        })
    }

    /// Bundles of small files of about `bytes` (never over a chunk's),
    /// each of at least `blocks` blocks where the files allow: a chunk's
    /// size is held up by its floor of blocks for every stream, which a
    /// bundle of one-block files meets in far fewer bytes. Without this a
    /// bundle is a chunk's bytes.
    pub fn bundled(self, bytes: u64, blocks: u64) -> Self {
        Self {
            bundle_bytes: bytes.max(1),
            bundle_blocks: blocks,
            ..self
        }
    }

    /// The block size.
    pub fn block_size(&self) -> u64 {
        self.block_size
    }

    /// The destination's stripe size, where it has one.
    pub fn stripe_size(&self) -> Option<u64> {
        self.stripe_size
    }

    /// Blocks in the smallest run that starts and ends on a stripe
    /// boundary: work is only ever cut at multiples of it.
    pub fn grain_blocks(&self) -> u64 {
        self.grain_blocks
    }

    /// Blocks in a chunk.
    pub fn chunk_blocks(&self) -> u64 {
        self.chunk_blocks
    }

    /// Bytes in a chunk.
    pub fn chunk_bytes(&self) -> u64 {
        self.chunk_blocks.saturating_mul(self.block_size)
    }

    /// Bytes a bundle of small files aims at.
    pub fn bundle_bytes(&self) -> u64 {
        self.bundle_bytes.min(self.chunk_bytes())
    }

    /// `block` rounded down to a grain boundary.
    pub fn grain_floor(&self, block: u64) -> u64 {
        block - block % self.grain_blocks
    }

    /// Bytes in `piece` of a `size`-byte file, its last block at its length.
    pub fn bytes(&self, piece: &Piece, size: u64) -> u64 {
        let at = |block: u64| block.saturating_mul(self.block_size).min(size);
        at(piece.end) - at(piece.first)
    }

    /// The work for `files` (id, size), largest first: whole chunks of
    /// large files, then bundles of small files of about `bundle_bytes`
    /// each.
    pub fn split(&self, files: &[(u32, u64)]) -> VecDeque<Work> {
        let mut works: Vec<(u64, Work)> = Vec::new();
        let mut bundle: (u64, Work) = (0, Vec::new());
        let mut bundle_blocks = 0;
        let (chunk_bytes, aim) = (self.chunk_bytes(), self.bundle_bytes());
        let mut small: Vec<(u32, u64)> = Vec::new();
        for &(file, size) in files {
            let blocks = Layout::new(size, self.block_size).blocks();
            if blocks <= self.chunk_blocks {
                small.push((file, size));
                continue;
            }
            let mut first = 0;
            while first < blocks {
                let end = (first + self.chunk_blocks).min(blocks);
                let piece = Piece { file, first, end };
                works.push((self.bytes(&piece, size), vec![piece]));
                first = end;
            }
        }
        // Largest small files first, so that bundles fill evenly.
        small.sort_by_key(|&(file, size)| (std::cmp::Reverse(size), file));
        for (file, size) in small {
            let over = bundle.0 + size;
            let full = over > chunk_bytes || (over > aim && bundle_blocks >= self.bundle_blocks);
            if !bundle.1.is_empty() && full {
                works.push(std::mem::take(&mut bundle));
                bundle_blocks = 0;
            }
            let end = Layout::new(size, self.block_size).blocks();
            bundle_blocks += end;
            bundle.0 += size;
            bundle.1.push(Piece {
                file,
                first: 0,
                end,
            });
        }
        if !bundle.1.is_empty() {
            works.push(bundle);
        }
        works.sort_by_key(|(bytes, _)| std::cmp::Reverse(*bytes));
        works.into_iter().map(|(_, work)| work).collect()
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

fn lcm(a: u64, b: u64) -> Option<u64> {
    (a / gcd(a, b)).checked_mul(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn chunks_start_and_end_on_stripe_boundaries() {
        // 3 MiB blocks on a 4 MiB stripe: the grain is 12 MiB, 4 blocks.
        let g = Geometry::new(3 * MIB, 20 * MIB, Some(4 * MIB)).unwrap();
        assert_eq!(g.grain_blocks(), 4);
        assert_eq!(g.chunk_blocks(), 8, "20 MiB rounds up to two grains");
        let works = g.split(&[(7, 100 * MIB)]);
        for work in &works {
            let p = work[0];
            assert_eq!(p.first * 3 * MIB % (4 * MIB), 0, "{p:?}");
        }
        let blocks: u64 = works.iter().flatten().map(Piece::blocks).sum();
        assert_eq!(blocks, 34, "every block once");
    }

    #[test]
    fn small_files_are_bundled_by_bytes_and_empty_files_kept() {
        let g = Geometry::new(MIB, 4 * MIB, None).unwrap();
        let files: Vec<(u32, u64)> = (0..10).map(|i| (i, MIB)).chain([(10, 0)]).collect();
        let works = g.split(&files);
        assert_eq!(works.len(), 3, "{works:?}");
        assert!(works.iter().all(|w| w.len() <= 5));
        let mut ids: Vec<u32> = works.iter().flatten().map(|p| p.file).collect();
        ids.sort_unstable();
        assert_eq!(ids, (0..=10).collect::<Vec<_>>());
    }

    #[test]
    fn bundles_aim_below_a_chunk_but_keep_their_blocks() {
        // 16 MiB blocks, chunks of 128 MiB: 1,000 files of 1 MiB were 8
        // bundles, too few to share evenly over 3 pairs.
        let g = Geometry::new(16 * MIB, 128 * MIB, None)
            .unwrap()
            .bundled(42 * MIB, 8);
        let files: Vec<(u32, u64)> = (0..1000).map(|i| (i, MIB)).collect();
        let works = g.split(&files);
        assert_eq!(works.len(), 24, "{}", works.len());
        assert!(works.iter().all(|w| w.len() <= 42));
        // Files of 12 MiB: one block each, so 8 of them even past the aim.
        let files: Vec<(u32, u64)> = (0..16).map(|i| (i, 12 * MIB)).collect();
        let works = g.split(&files);
        assert_eq!(works.len(), 2, "{works:?}");
        // Never more than a chunk's bytes.
        let g = g.bundled(MIB, 1000);
        let works = g.split(&files);
        assert!(works.iter().all(|w| w.len() * 12 <= 128), "{works:?}");
        assert_eq!(g.bundle_bytes(), MIB);
    }

    #[test]
    fn largest_work_goes_first() {
        let g = Geometry::new(MIB, 4 * MIB, None).unwrap();
        let works = g.split(&[(1, MIB), (2, 9 * MIB), (3, 2 * MIB)]);
        let sizes: Vec<u64> = works
            .iter()
            .map(|w| w.iter().map(|p| p.blocks()).sum())
            .collect();
        assert!(sizes.windows(2).all(|w| w[0] >= w[1]), "{sizes:?}");
    }

    #[test]
    fn a_geometry_with_no_boundary_is_refused() {
        assert_eq!(Geometry::new(0, MIB, None), Err(SplitError::NoBlockSize));
        assert_eq!(
            Geometry::new(MIB, MIB, Some(0)),
            Err(SplitError::NoStripeSize)
        );
        assert!(matches!(
            Geometry::new(4096 * 1021, MIB, Some(4096 * 1031 * 1033)),
            Err(SplitError::NoCommonBoundary { .. })
        ));
    }
}
