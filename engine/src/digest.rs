//! Block checksums and whole-file digests.
//!
//! Blocks arrive out of order, so the file digest is xxh3-128 over the
//! ordered list of block checksums: both sides can compute it without
//! holding the file, and the receiver can reuse checksums from a checkpoint.
//!
//! XXH3 comes from `twox-hash`, which picks AVX2 (or NEON) at run time:
//! hashing a cache-hot piece runs at about twice the SSE2 rate, and hashing
//! is the largest share of the sender's CPU time. Its output is the XXH3
//! specification's, pinned by `outputs_are_the_specifications` below, so
//! agents of any version agree on every checksum.

use std::hash::Hasher;

use twox_hash::{XxHash3_64, XxHash3_128};

/// XXH3-64 of `bytes` (seed 0): block checksums, and the project's other
/// short hashes (checkpoint integrity, names, content stamps).
pub fn xxh3_64(bytes: &[u8]) -> u64 {
    XxHash3_64::oneshot(bytes)
}

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
pub struct BlockHasher(XxHash3_64);

impl BlockHasher {
    /// Adds the next piece of the payload.
    pub fn update(&mut self, piece: &[u8]) {
        self.0.write(piece);
    }

    /// The checksum of everything added.
    pub fn finish(&self) -> u64 {
        self.0.finish()
    }
}

/// Digest of a file from its block checksums in order.
pub fn file_digest(checksums: &[u64]) -> u128 {
    let mut h = XxHash3_128::default();
    for c in checksums {
        h.write(&c.to_le_bytes());
    }
    h.finish_128()
}

/// `file_digest` of what `r` holds: `size` bytes read in blocks of
/// `block_size`, each checksummed as its block would be sent, so that
/// both ends of a checksum sync (`SyncLevel::Checksum`) compute the same
/// digest from the same bytes. The checksums are folded in as they come:
/// the memory is one piece's, whatever the file's size or block size.
/// `go_on` is called after every piece read (a long read must not look
/// like silence, and can be stopped): false ends it, as `Interrupted`.
/// Fails if `r` holds fewer bytes than `size`.
pub fn digest_of(
    r: &mut impl std::io::Read,
    size: u64,
    block_size: u64,
    go_on: &mut dyn FnMut() -> bool,
) -> std::io::Result<u128> {
    let mut piece = vec![0u8; HASH_PIECE];
    let mut digest = XxHash3_128::default();
    let mut left = size;
    while left > 0 {
        let mut block_left = left.min(block_size.max(1));
        left -= block_left;
        let mut h = BlockHasher::default();
        while block_left > 0 {
            let n = block_left.min(HASH_PIECE as u64) as usize;
            r.read_exact(&mut piece[..n])?;
            h.update(&piece[..n]);
            block_left -= n as u64;
            if !go_on() {
                return Err(std::io::ErrorKind::Interrupted.into());
            }
        }
        digest.write(&h.finish().to_le_bytes());
    }
    Ok(digest.finish_128())
}

/// Digest of a whole transfer from (path, file digest) pairs in manifest order.
pub fn tree_digest<'a>(files: impl IntoIterator<Item = (&'a str, u128)>) -> u128 {
    let mut h = XxHash3_128::default();
    for (path, d) in files {
        h.write(&(path.len() as u64).to_le_bytes());
        h.write(path.as_bytes());
        h.write(&d.to_le_bytes());
    }
    h.finish_128()
}

/// Seed of frame checksums: a frame's check never equals the checksum of
/// a block payload with the same bytes.
const FRAME_SEED: u64 = 0x7772_7274_6672_616d; // "wrrtfram"

/// Checksum of a frame's type byte and fields (see `wire`).
pub fn frame_checksum(content: &[u8]) -> u64 {
    XxHash3_64::oneshot_with_seed(FRAME_SEED, content)
}

/// A file's identity: everything that says which file a manifest entry is
/// (its destination path, kind, size, permission bits and source
/// version). Both sides compute it from the entry they hold; a file is
/// published, and believed published, only when the two agree, so a
/// damaged entry can never be reported verified under a name, size or
/// mode the sender did not mean.
pub fn entry_identity(e: &crate::wire::FileEntry) -> u64 {
    let mut h = XxHash3_64::with_seed(FRAME_SEED);
    h.write_u8(match e.kind {
        crate::wire::EntryKind::File => 0,
        crate::wire::EntryKind::Dir => 1,
    });
    h.write(&e.size.to_le_bytes());
    h.write(&e.fingerprint.to_le_bytes());
    h.write(&e.mode.to_le_bytes());
    h.write(&(e.path.len() as u64).to_le_bytes());
    h.write(e.path.as_bytes());
    h.finish()
}

/// Formats a digest the way summaries print it.
pub fn fmt_digest(d: u128) -> String {
    format!("xxh3-128:{d:032x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_files_digest_is_the_one_its_blocks_make() {
        let data: Vec<u8> = (0..1_000_003u32).map(|i| (i * 31 % 251) as u8).collect();
        let block = 300_000u64;
        let sums: Vec<u64> = data.chunks(block as usize).map(block_checksum).collect();
        let mut calls = 0;
        let mut count = || {
            calls += 1;
            true
        };
        let d = digest_of(&mut &data[..], data.len() as u64, block, &mut count).unwrap();
        assert_eq!(d, file_digest(&sums));
        // Two pieces a block of 300,000 bytes, one for the last 100,003.
        assert_eq!(calls, 7);
        assert_eq!(
            digest_of(&mut &[][..], 0, block, &mut || true).unwrap(),
            file_digest(&[])
        );
        // Fewer bytes than said: an error, not a digest; nor once stopped.
        assert!(digest_of(&mut &data[..10], 11, block, &mut || true).is_err());
        let stopped = digest_of(&mut &data[..], data.len() as u64, block, &mut || false);
        assert_eq!(stopped.unwrap_err().kind(), std::io::ErrorKind::Interrupted);
    }

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
    fn outputs_are_the_specifications() {
        // XXH3's published values for the empty input, and what the
        // previous implementation (xxhash-rust 0.8) gave for inputs that
        // take the short, the mid-size and the long (vectorised) paths:
        // every agent, of any version, must compute the same checksums.
        let data: Vec<u8> = (0..1u32 << 20)
            .map(|i| i.wrapping_mul(2_654_435_761) as u8)
            .collect();
        let whole = |d: &[u8]| {
            let mut h = XxHash3_128::default();
            h.write(d);
            h.finish_128()
        };
        for (len, h64, h128) in [
            (0, 0x2d06800538d394c2, 0x99aa06d3014798d86001c324468d497f),
            (3, 0xe7a0b893acc4c816, 0x47e1b9edc67a36c4e7a0b893acc4c816),
            (200, 0x4429220ceabd9050, 0xbb0d87755192638b31cab9b42949a403),
            (
                1 << 20,
                0x1dc5efcf97953220,
                0xb48ebae88e3b77801dc5efcf97953220,
            ),
        ] {
            let d = &data[..len];
            assert_eq!(block_checksum(d), h64, "64 of {len}");
            assert_eq!(whole(d), h128, "128 of {len}");
            // Pieces that end on either side of the internal 64-byte
            // stripes and 1 KiB blocks, and the size the shells use.
            for piece in [63, 64, 65, 1023, 1024, 1025, HASH_PIECE / 3] {
                let mut pieces = BlockHasher::default();
                for p in d.chunks(piece) {
                    pieces.update(p);
                }
                assert_eq!(pieces.finish(), h64, "64 of {len} in pieces of {piece}");
            }
        }
        // The digests a `FileDone` and a summary carry, fed 8 bytes and a
        // path at a time.
        let sums: Vec<u64> = (0..1000u64)
            .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .collect();
        assert_eq!(file_digest(&sums), 0x7c456e25aa67981d59812fa6b9250d72);
        let paths: Vec<String> = (0..50).map(|i| format!("dir/file-{i}.bin")).collect();
        let tree = tree_digest(
            paths
                .iter()
                .zip(&sums)
                .enumerate()
                .map(|(i, (p, c))| (p.as_str(), u128::from(*c) << 64 | i as u128)),
        );
        assert_eq!(tree, 0x183d16fc893fc99649493071b6eb2290);
    }

    #[test]
    fn order_matters() {
        assert_ne!(file_digest(&[1, 2]), file_digest(&[2, 1]));
        assert_eq!(file_digest(&[1, 2]), file_digest(&[1, 2]));
        assert_ne!(block_checksum(b"a"), block_checksum(b"b"));
    }
}
