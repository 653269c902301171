//! Per-chunk checkpoints of a temporary file that the receivers of a
//! transfer over several pairs share, kept beside it on the shared
//! storage so that any receiver can resume any chunk: a new attempt, a
//! restarted sender or `send` run again skips the pieces already written
//! and verified.
//!
//! Each receiver appends one record per piece it wrote and checked: the
//! piece's blocks and their checksums, stamped with the source version
//! (fingerprint, size, block size) and the temporary file's inode. A
//! record is written only once the piece is durable and its digest is the
//! sender's, so a record never names a block that was not landed whole;
//! and since the data is durable first, the record needs no sync of its
//! own: one that a crash loses costs a resend, never a wrong block.
//! One-block pieces get none, as one-block files get no checkpoint.
//!
//! Records are hints, bounded and checked: each carries its own checksum,
//! a damaged or torn one is skipped (appends from several hosts may
//! interleave on some shared file systems), and one of another source
//! version or of another temporary file is ignored. A skipped record
//! costs only the resending of its piece. The sender still reads every
//! resumed block to checksum it, so a file whose source changed is caught
//! by its digest as with any resume.
#![forbid(unsafe_code)]

use std::io::{Read, Write};
use std::os::fd::OwnedFd;

use rustix::fs::OFlags;

use crate::Bitmap;
use crate::digest::xxh3_64;
use crate::error::{Error, Result};
use crate::fsroot::Root;

const MAGIC: &[u8; 4] = b"WRPC";
/// Magic, then fingerprint, size, block size, inode, first block, blocks.
const HEADER: usize = 4 + 6 * 8;
/// The most read of one file's records: a file of the most blocks a file
/// may have, covered twice over, with room for the headers.
const MAX_READ: u64 = 272 << 20;

/// What a record must match to be trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stamp {
    /// The source version.
    pub(crate) fingerprint: u64,
    /// The file's size.
    pub(crate) size: u64,
    /// The block size the pieces were cut in.
    pub(crate) block_size: u64,
    /// The shared temporary file's inode: a record of one that was
    /// published or removed does not stand for a new one.
    pub(crate) ino: u64,
}

/// One piece's record: blocks `first..first + checksums.len()`.
fn encode(stamp: Stamp, first: u64, checksums: &[u64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + 8 * checksums.len() + 8);
    out.extend_from_slice(MAGIC);
    for v in [
        stamp.fingerprint,
        stamp.size,
        stamp.block_size,
        stamp.ino,
        first,
        checksums.len() as u64,
    ] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    for c in checksums {
        out.extend_from_slice(&c.to_le_bytes());
    }
    let sum = xxh3_64(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

fn u64_at(buf: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(buf.get(at..at + 8)?.try_into().ok()?))
}

/// The record at the start of `buf`, if whole and intact: its stamp,
/// first block, checksums and length.
fn decode(buf: &[u8]) -> Option<(Stamp, u64, Vec<u64>, usize)> {
    if buf.get(..4)? != MAGIC {
        return None;
    }
    let field = |i: usize| u64_at(buf, 4 + 8 * i);
    let stamp = Stamp {
        fingerprint: field(0)?,
        size: field(1)?,
        block_size: field(2)?,
        ino: field(3)?,
    };
    let (first, n) = (field(4)?, field(5)?);
    let body = usize::try_from(n)
        .ok()?
        .checked_mul(8)?
        .checked_add(HEADER)?;
    if body.checked_add(8)? > buf.len() {
        return None;
    }
    if xxh3_64(&buf[..body]) != u64_at(buf, body)? {
        return None;
    }
    let checksums = buf[HEADER..body]
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
        .collect();
    Some((stamp, first, checksums, body + 8))
}

/// The blocks of a file `blocks` long that `buf`'s records matching
/// `stamp` hold, and their checksums (0 for the others).
fn held(buf: &[u8], stamp: Stamp, blocks: u64) -> (Bitmap, Vec<u64>) {
    let mut have = Bitmap::new(blocks);
    let mut sums = vec![0; blocks as usize];
    let mut at = 0;
    while at < buf.len() {
        let Some((s, first, checksums, len)) = decode(&buf[at..]) else {
            // Damaged, torn or overwritten: look for the next record.
            at += 1;
            match buf[at..].windows(4).position(|w| w == MAGIC) {
                Some(next) => at += next,
                None => break,
            }
            continue;
        };
        at += len;
        let end = first.saturating_add(checksums.len() as u64);
        if s != stamp || end > blocks {
            continue;
        }
        for (b, c) in (first..end).zip(checksums) {
            have.set(b);
            sums[b as usize] = c;
        }
    }
    (have, sums)
}

/// The blocks that the records `name` in `dir` hold of the file `stamp`
/// names, `blocks` long, and their checksums; none where there are no
/// records or they cannot be read.
pub(crate) fn load(dir: &OwnedFd, name: &str, stamp: Stamp, blocks: u64) -> (Bitmap, Vec<u64>) {
    let mut buf = Vec::new();
    let read = Root::open_in(dir, name, OFlags::RDONLY)
        .map_err(std::io::Error::from)
        .and_then(|f| f.take(MAX_READ).read_to_end(&mut buf));
    if read.is_err() {
        buf.clear();
    }
    held(&buf, stamp, blocks)
}

/// Appends the record of a piece, blocks `first..` with `checksums`, to
/// the records `name` in `dir`; the piece's data must be durable.
pub(crate) fn append(
    dir: &OwnedFd,
    name: &str,
    stamp: Stamp,
    first: u64,
    checksums: &[u64],
) -> Result<()> {
    let ctx = |what: &str| format!("{what} the per-chunk checkpoint {name}");
    // One write, so that appends from several receivers on one host never
    // interleave within a record.
    let record = encode(stamp, first, checksums);
    let flags = OFlags::WRONLY | OFlags::APPEND | OFlags::CREATE;
    let mut f =
        Root::open_in(dir, name, flags).map_err(|e| Error::disk(ctx("opening"), e.into()))?;
    f.write_all(&record)
        .map_err(|e| Error::disk(ctx("writing"), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAMP: Stamp = Stamp {
        fingerprint: 7,
        size: 10 << 20,
        block_size: 1 << 20,
        ino: 42,
    };

    fn blocks(have: &Bitmap) -> Vec<u64> {
        (0..have.len()).filter(|&b| have.get(b)).collect()
    }

    #[test]
    fn records_of_this_file_and_version_are_held_and_others_ignored() {
        let mut buf = encode(STAMP, 2, &[12, 13, 14]);
        buf.extend(encode(STAMP, 8, &[18, 19]));
        // Another source version, another temporary file, another block
        // size: each stands for other bytes than these.
        for other in [
            Stamp {
                fingerprint: 8,
                ..STAMP
            },
            Stamp { ino: 43, ..STAMP },
            Stamp {
                block_size: 1 << 19,
                ..STAMP
            },
        ] {
            buf.extend(encode(other, 0, &[99, 99]));
        }
        // Past the end of the file: not this file's.
        buf.extend(encode(STAMP, 9, &[99, 99]));
        let (have, sums) = held(&buf, STAMP, 10);
        assert_eq!(blocks(&have), [2, 3, 4, 8, 9]);
        assert_eq!(sums, [0, 0, 12, 13, 14, 0, 0, 0, 18, 19]);
    }

    #[test]
    fn a_damaged_or_torn_record_is_skipped_and_the_next_still_read() {
        let first = encode(STAMP, 0, &[10, 11]);
        let mut buf = first.clone();
        buf[HEADER + 3] ^= 1;
        // Torn: a record cut short by a crash, then another appended.
        buf.extend(&encode(STAMP, 4, &[14, 15])[..HEADER + 4]);
        buf.extend(encode(STAMP, 6, &[16]));
        let (have, sums) = held(&buf, STAMP, 10);
        assert_eq!(blocks(&have), [6]);
        assert_eq!(sums[6], 16);
        // A header claiming more blocks than there are bytes reads nothing.
        let mut huge = encode(STAMP, 0, &[1]);
        huge[4 + 5 * 8..4 + 6 * 8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(held(&huge, STAMP, 10).0.count(), 0);
        assert_eq!(held(b"WRPCWRPC", STAMP, 10).0.count(), 0);
    }

    #[test]
    fn records_are_appended_and_read_back() {
        let tmp = tempfile::tempdir().unwrap();
        let dir: OwnedFd = std::fs::File::open(tmp.path()).unwrap().into();
        let name = ".f.wirerate-pieces";
        assert_eq!(load(&dir, name, STAMP, 10).0.count(), 0, "none yet");
        append(&dir, name, STAMP, 0, &[5, 6]).unwrap();
        append(&dir, name, STAMP, 5, &[7]).unwrap();
        let (have, sums) = load(&dir, name, STAMP, 10);
        assert_eq!(blocks(&have), [0, 1, 5]);
        assert_eq!((sums[0], sums[1], sums[5]), (5, 6, 7));
    }
}
