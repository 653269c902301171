//! Block checksums and whole-file digests.
//!
//! Blocks arrive out of order, so the file digest is xxh3-128 over the
//! ordered list of block checksums: both sides can compute it without
//! holding the file, and the receiver can reuse checksums from a checkpoint.

use xxhash_rust::xxh3::{Xxh3Default, xxh3_64};

/// Checksum of one block's payload.
pub fn block_checksum(payload: &[u8]) -> u64 {
    xxh3_64(payload)
}

/// Payloads are hashed (and sent, and read from the socket) in pieces of
/// this size, so each piece is hashed while it is in the CPU cache (L2).
pub const HASH_PIECE: usize = 256 << 10;

/// `block_checksum` of a payload that arrives in pieces: each piece is
/// hashed right after it lands, while it is still in the CPU cache, instead
/// of reading the whole block back from memory afterwards.
#[derive(Default)]
pub struct BlockHasher(Xxh3Default);

impl BlockHasher {
    /// Adds the next piece of the payload.
    pub fn update(&mut self, piece: &[u8]) {
        self.0.update(piece);
    }

    /// The checksum of everything added.
    pub fn finish(&self) -> u64 {
        self.0.digest()
    }
}

/// Digest of a file from its block checksums in order.
pub fn file_digest(checksums: &[u64]) -> u128 {
    let mut h = Xxh3Default::new();
    for c in checksums {
        h.update(&c.to_le_bytes());
    }
    h.digest128()
}

/// Digest of a whole transfer from (path, file digest) pairs in manifest order.
pub fn tree_digest<'a>(files: impl IntoIterator<Item = (&'a str, u128)>) -> u128 {
    let mut h = Xxh3Default::new();
    for (path, d) in files {
        h.update(&(path.len() as u64).to_le_bytes());
        h.update(path.as_bytes());
        h.update(&d.to_le_bytes());
    }
    h.digest128()
}

/// Formats a digest the way summaries print it.
pub fn fmt_digest(d: u128) -> String {
    format!("xxh3-128:{d:032x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_hash_like_the_whole() {
        let data: Vec<u8> = (0..3_000_017u32)
            .map(|i| i.wrapping_mul(2_654_435_761) as u8)
            .collect();
        for piece in [1, 63, 64, 1000, 4096, 256 << 10, data.len()] {
            let mut h = BlockHasher::default();
            for p in data.chunks(piece) {
                h.update(p);
            }
            assert_eq!(h.finish(), block_checksum(&data), "pieces of {piece}");
        }
        assert_eq!(BlockHasher::default().finish(), block_checksum(&[]));
    }

    #[test]
    fn order_matters() {
        assert_ne!(file_digest(&[1, 2]), file_digest(&[2, 1]));
        assert_eq!(file_digest(&[1, 2]), file_digest(&[1, 2]));
        assert_ne!(block_checksum(b"a"), block_checksum(b"b"));
    }
}
