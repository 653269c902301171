//! How a file is cut into content blocks.

use super::Bitmap;

/// Block geometry of one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// File size in bytes.
    pub size: u64,
    /// Block size in bytes.
    pub block_size: u64,
}

impl Layout {
    /// The geometry of a `size`-byte file in `block_size` blocks.
    pub fn new(size: u64, block_size: u64) -> Self {
        assert!(block_size > 0, "block size is validated before use");
        Self { size, block_size }
    }

    /// Number of blocks (0 for an empty file).
    pub fn blocks(&self) -> u64 {
        self.size.div_ceil(self.block_size)
    }

    /// Offset of block `i`.
    pub fn offset(&self, i: u64) -> u64 {
        i * self.block_size
    }

    /// Length of block `i` (the last may be short); 0 past the end.
    pub fn len(&self, i: u64) -> u64 {
        let off = self.offset(i);
        if off >= self.size {
            0
        } else {
            (self.size - off).min(self.block_size)
        }
    }

    /// Bytes held by the blocks set in `blocks` (a bitmap of this file's
    /// blocks): whole blocks, and the last one at its own length.
    pub fn bytes_in(&self, blocks: &Bitmap) -> u64 {
        let set = blocks.count();
        let n = self.blocks();
        if set == 0 || n == 0 {
            return 0;
        }
        if blocks.get(n - 1) {
            (set - 1) * self.block_size + self.len(n - 1)
        } else {
            set * self.block_size
        }
    }

    /// Bytes held by the blocks of `range` set in `blocks`.
    pub fn bytes_in_range(&self, blocks: &Bitmap, range: std::ops::Range<u64>) -> u64 {
        (range.start..range.end.min(self.blocks()))
            .filter(|&b| blocks.get(b))
            .map(|b| self.len(b))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry() {
        let l = Layout::new(10, 4);
        assert_eq!(l.blocks(), 3);
        assert_eq!((l.len(0), l.len(1), l.len(2), l.len(3)), (4, 4, 2, 0));
        assert_eq!(Layout::new(0, 4).blocks(), 0);
        assert_eq!(Layout::new(8, 4).blocks(), 2);
    }

    #[test]
    fn bytes_held_by_blocks_count_the_short_last_block_at_its_length() {
        let l = Layout::new(10, 4);
        let mut b = Bitmap::new(3);
        assert_eq!(l.bytes_in(&b), 0);
        b.set(1);
        assert_eq!(l.bytes_in(&b), 4);
        b.set(2);
        assert_eq!(l.bytes_in(&b), 6);
        b.set(0);
        assert_eq!(l.bytes_in(&b), 10);
        assert_eq!(Layout::new(8, 4).len(1), 4);
        // Of a range, only its blocks; one past the file counts nothing.
        assert_eq!(l.bytes_in_range(&b, 1..3), 6);
        assert_eq!(l.bytes_in_range(&b, 0..1), 4);
        assert_eq!(l.bytes_in_range(&b, 2..9), 2);
    }
}
