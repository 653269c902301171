//! A fixed-size set of block indices: the resume bitmap.

/// One bit per block, persisted and sent as bytes, least significant bit first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bitmap {
    len: u64,
    words: Vec<u64>,
}

impl Bitmap {
    /// An empty bitmap for `len` blocks.
    pub fn new(len: u64) -> Self {
        Self {
            len,
            words: vec![0; len.div_ceil(64) as usize],
        }
    }

    /// Number of blocks it covers.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True when it covers no blocks.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether block `i` is set; false out of range.
    pub fn get(&self, i: u64) -> bool {
        i < self.len && self.words[(i / 64) as usize] & (1 << (i % 64)) != 0
    }

    /// Sets block `i`; returns false (and changes nothing) out of range.
    pub fn set(&mut self, i: u64) -> bool {
        if i >= self.len {
            return false;
        }
        self.words[(i / 64) as usize] |= 1 << (i % 64);
        true
    }

    /// Sets every block set in `other` (same length required).
    pub fn union_with(&mut self, other: &Self) {
        debug_assert_eq!(self.len, other.len);
        for (a, b) in self.words.iter_mut().zip(&other.words) {
            *a |= *b;
        }
    }

    /// Clears every block.
    pub fn clear(&mut self) {
        self.words.iter_mut().for_each(|w| *w = 0);
    }

    /// Number of blocks set.
    pub fn count(&self) -> u64 {
        self.words.iter().map(|w| u64::from(w.count_ones())).sum()
    }

    /// True when every block is set.
    pub fn is_full(&self) -> bool {
        self.count() == self.len
    }

    /// The bytes sent on the wire and persisted in checkpoints.
    pub fn to_bytes(&self) -> Vec<u8> {
        let n = self.len.div_ceil(8) as usize;
        let mut out: Vec<u8> = self.words.iter().flat_map(|w| w.to_le_bytes()).collect();
        out.truncate(n);
        out
    }

    /// Parses bytes for a `len`-block bitmap; `None` when the length is wrong
    /// or bits beyond `len` are set (a peer or a file we must not trust).
    pub fn from_bytes(len: u64, bytes: &[u8]) -> Option<Self> {
        if bytes.len() as u64 != len.div_ceil(8) {
            return None;
        }
        let mut b = Self::new(len);
        for (i, chunk) in bytes.chunks(8).enumerate() {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            b.words[i] = u64::from_le_bytes(w);
        }
        if len % 64 != 0 {
            if let Some(last) = b.words.last() {
                if last >> (len % 64) != 0 {
                    return None;
                }
            }
        }
        Some(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn set_get_count() {
        let mut b = Bitmap::new(70);
        assert!(b.set(0) && b.set(69) && !b.set(70));
        assert!(b.get(0) && b.get(69) && !b.get(1) && !b.get(70));
        assert_eq!(b.count(), 2);
        assert!(!b.is_full());
    }

    #[test]
    fn stray_bits_refused() {
        assert!(Bitmap::from_bytes(3, &[0b0000_1000]).is_none());
        assert!(Bitmap::from_bytes(3, &[0b0000_0111]).is_some());
        assert!(Bitmap::from_bytes(9, &[0]).is_none());
    }

    proptest! {
        #[test]
        fn bytes_roundtrip(len in 0u64..500, bits in proptest::collection::vec(any::<u64>(), 0..50)) {
            let mut b = Bitmap::new(len);
            for i in bits { if len > 0 { b.set(i % len); } }
            let back = Bitmap::from_bytes(len, &b.to_bytes()).unwrap();
            prop_assert_eq!(back, b);
        }
    }
}
