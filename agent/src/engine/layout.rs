//! How a file is cut into content blocks.

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
        assert_eq!(Layout::new(8, 4).len(1), 4);
    }
}
