//! A fixed-size set of block indices: the resume bitmap.

/// One bit per block, persisted and sent as bytes, least significant bit first.
///
/// Its words are allocated at the first bit set: until then it costs no
/// heap. A receiver holds two per file of a manifest that may list a
/// million files, most of which have nothing set while they wait.
#[derive(Debug, Clone)]
pub struct Bitmap {
    len: u64,
    /// Empty while no bit is set; else `len.div_ceil(64)` words.
    words: Vec<u64>,
}

impl PartialEq for Bitmap {
    fn eq(&self, other: &Self) -> bool {
        let zero = |w: &[u64]| w.iter().all(|&x| x == 0);
        self.len == other.len
            && match (self.words.is_empty(), other.words.is_empty()) {
                (true, true) => true,
                (true, false) => zero(&other.words),
                (false, true) => zero(&self.words),
                (false, false) => self.words == other.words,
            }
    }
}

impl Eq for Bitmap {}

impl Bitmap {
    /// An empty bitmap for `len` blocks.
    pub fn new(len: u64) -> Self {
        Self {
            len,
            words: Vec::new(),
        }
    }

    /// The words, allocated now if they were not.
    fn words_mut(&mut self) -> &mut [u64] {
        if self.words.is_empty() {
            self.words = vec![0; self.len.div_ceil(64) as usize];
        }
        &mut self.words
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
        i < self.len
            && self
                .words
                .get((i / 64) as usize)
                .is_some_and(|w| w & (1 << (i % 64)) != 0)
    }

    /// Sets block `i`; returns false (and changes nothing) out of range.
    pub fn set(&mut self, i: u64) -> bool {
        if i >= self.len {
            return false;
        }
        self.words_mut()[(i / 64) as usize] |= 1 << (i % 64);
        true
    }

    /// Sets every block set in `other` (same length required).
    pub fn union_with(&mut self, other: &Self) {
        debug_assert_eq!(self.len, other.len);
        if other.words.is_empty() {
            return;
        }
        for (a, b) in self.words_mut().iter_mut().zip(&other.words) {
            *a |= *b;
        }
    }

    /// Clears every block.
    pub fn clear(&mut self) {
        self.words = Vec::new();
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
        out.resize(n, 0);
        out
    }

    /// Parses bytes for a `len`-block bitmap; `None` when the length is wrong
    /// or bits beyond `len` are set (a peer or a file we must not trust).
    pub fn from_bytes(len: u64, bytes: &[u8]) -> Option<Self> {
        if bytes.len() as u64 != len.div_ceil(8) {
            return None;
        }
        let mut b = Self::new(len);
        if bytes.iter().any(|&x| x != 0) {
            let words = b.words_mut();
            for (i, chunk) in bytes.chunks(8).enumerate() {
                let mut w = [0u8; 8];
                w[..chunk.len()].copy_from_slice(chunk);
                words[i] = u64::from_le_bytes(w);
            }
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

    #[test]
    fn an_empty_bitmap_holds_no_words_until_a_bit_is_set() {
        let mut b = Bitmap::new(1000);
        assert_eq!(b.words.capacity(), 0);
        assert_eq!(
            b.to_bytes(),
            vec![0; 125],
            "still its full length on the wire"
        );
        assert_eq!(b, Bitmap::from_bytes(1000, &[0; 125]).unwrap());
        let mut other = Bitmap::new(1000);
        other.set(999);
        b.union_with(&other);
        assert!(b.get(999) && b.count() == 1);
        assert_ne!(b, Bitmap::new(1000));
        b.clear();
        assert_eq!(b, Bitmap::new(1000));
        assert_eq!(b.count(), 0);
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
