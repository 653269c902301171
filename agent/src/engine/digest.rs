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
    fn order_matters() {
        assert_ne!(file_digest(&[1, 2]), file_digest(&[2, 1]));
        assert_eq!(file_digest(&[1, 2]), file_digest(&[1, 2]));
        assert_ne!(block_checksum(b"a"), block_checksum(b"b"));
    }
}
