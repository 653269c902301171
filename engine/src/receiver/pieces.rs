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
//! version or of another temporary file is ignored. A record vouches for
//! what was written, not for what the temporary file holds now (another
//! transfer to the same name, a file removed and its inode number given
//! to a new one): so every recorded block is read back from the temporary
//! file and held only if its checksum is still the recorded one. The
//! sender reads it from the source to checksum it too, so a source that
//! changed is caught by the piece's digest as with any resume. A record
//! skipped or not confirmed costs only the resending of its blocks.
#![forbid(unsafe_code)]

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::time::Instant;

use rustix::fs::OFlags;

use crate::digest::{block_checksum, xxh3_64};
use crate::error::{Error, Result};
use crate::fsroot::Root;
use crate::{Bitmap, Layout};

const MAGIC: &[u8; 4] = b"WRPC";
/// Magic, then fingerprint, size, block size, inode, first block, blocks.
const HEADER: usize = 4 + 6 * 8;
/// The most read of one file's records: a file of the most blocks a file
/// may have, covered twice over, with room for the headers.
const MAX_READ: u64 = 272 << 20;
/// What damaged records may cost in hashing beyond the records' length.
const MAX_REHASH: usize = 16 << 20;

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
/// first block, checksums and length. Adds what it hashed to `hashed`.
fn decode(buf: &[u8], hashed: &mut usize) -> Option<(Stamp, u64, Vec<u64>, usize)> {
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
    *hashed += body;
    if xxh3_64(&buf[..body]) != u64_at(buf, body)? {
        return None;
    }
    let checksums = buf[HEADER..body]
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
        .collect();
    Some((stamp, first, checksums, body + 8))
}

/// What a file's records say of it.
struct Held {
    /// The blocks the records matching the stamp name.
    have: Bitmap,
    /// Their checksums (0 for the others).
    sums: Vec<u64>,
    /// Intact records of another stamp were found, and none of this one:
    /// the file describes another version or another temporary file.
    stale: bool,
    /// Bytes hashed to find them.
    #[cfg_attr(not(test), allow(dead_code))]
    hashed: usize,
}

/// The blocks of a file `blocks` long that `buf`'s records matching
/// `stamp` hold. Hashing stops once it has covered `buf` and
/// `MAX_REHASH` more, so that no content (damaged headers that each claim
/// the rest of the file) makes this quadratic.
fn held(buf: &[u8], stamp: Stamp, blocks: u64) -> Held {
    let mut have = Bitmap::new(blocks);
    let mut sums = vec![0; blocks as usize];
    let (mut mine, mut foreign, mut hashed) = (0, 0, 0);
    let mut at = 0;
    while at < buf.len() && hashed < buf.len() + MAX_REHASH {
        let Some((s, first, checksums, len)) = decode(&buf[at..], &mut hashed) else {
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
            foreign += 1;
            continue;
        }
        mine += 1;
        for (b, c) in (first..end).zip(checksums) {
            have.set(b);
            sums[b as usize] = c;
        }
    }
    Held {
        have,
        sums,
        stale: foreign > 0 && mine == 0,
        hashed,
    }
}

/// The records `name` in `dir`, at most `MAX_READ` bytes of them; none
/// where there are none, or where the name is not a regular file (a FIFO
/// there must not hang the session).
fn read_records(dir: &OwnedFd, name: &str) -> Vec<u8> {
    let mut buf = Vec::new();
    let read = Root::open_in(dir, name, OFlags::RDONLY | OFlags::NONBLOCK)
        .map_err(std::io::Error::from)
        .and_then(|f| {
            let meta = f.metadata()?;
            if !meta.is_file() {
                return Err(std::io::Error::other("not a regular file"));
            }
            buf.reserve_exact(meta.len().min(MAX_READ) as usize);
            f.take(MAX_READ).read_to_end(&mut buf)
        });
    if read.is_err() {
        buf.clear();
    }
    buf
}

/// The blocks of the piece `first..end` of the file `stamp` names that
/// the records `name` in `dir` hold and that the temporary file `part`
/// still holds, each read back and checksummed until `confirm_by` (those
/// left are sent again); and their checksums (0 for the others). Records
/// that all describe another version or another temporary file are
/// removed.
pub(crate) fn resume(
    (dir, name): (&OwnedFd, &str),
    stamp: Stamp,
    (part, layout): (&File, &Layout),
    (first, end): (u64, u64),
    confirm_by: Instant,
) -> (Bitmap, Vec<u64>) {
    let blocks = layout.blocks();
    let Held {
        have, sums, stale, ..
    } = held(&read_records(dir, name), stamp, blocks);
    if stale {
        let _ = Root::remove_in(dir, name);
    }
    let mut held = Bitmap::new(blocks);
    let mut confirmed = vec![0; blocks as usize];
    let mut buf = Vec::new();
    for b in (first..end.min(blocks)).filter(|&b| have.get(b)) {
        if Instant::now() >= confirm_by {
            break;
        }
        let len = layout.len(b) as usize;
        buf.resize(len, 0);
        if part.read_exact_at(&mut buf, layout.offset(b)).is_ok()
            && block_checksum(&buf) == sums[b as usize]
        {
            held.set(b);
            confirmed[b as usize] = sums[b as usize];
        }
    }
    (held, confirmed)
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
        let held = held(&buf, STAMP, 10);
        assert_eq!(blocks(&held.have), [2, 3, 4, 8, 9]);
        assert_eq!(held.sums, [0, 0, 12, 13, 14, 0, 0, 0, 18, 19]);
        assert!(!held.stale);
        // Only other versions' records: the file is stale.
        assert!(held_in(&encode(Stamp { ino: 1, ..STAMP }, 0, &[1]), 10).stale);
    }

    fn held_in(buf: &[u8], blocks: u64) -> Held {
        held(buf, STAMP, blocks)
    }

    #[test]
    fn a_damaged_or_torn_record_is_skipped_and_the_next_still_read() {
        let first = encode(STAMP, 0, &[10, 11]);
        let mut buf = first.clone();
        buf[HEADER + 3] ^= 1;
        // Torn: a record cut short by a crash, then another appended.
        buf.extend(&encode(STAMP, 4, &[14, 15])[..HEADER + 4]);
        buf.extend(encode(STAMP, 6, &[16]));
        let held = held_in(&buf, 10);
        assert_eq!(blocks(&held.have), [6]);
        assert_eq!(held.sums[6], 16);
        // A header claiming more blocks than there are bytes reads nothing.
        let mut huge = encode(STAMP, 0, &[1]);
        huge[4 + 5 * 8..4 + 6 * 8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(held_in(&huge, 10).have.count(), 0);
        assert_eq!(held_in(b"WRPCWRPC", 10).have.count(), 0);
    }

    // Damaged headers that each claim nearly the rest of the file: hashing
    // stops at its budget instead of going over the file once per header.
    #[test]
    fn damaged_headers_cannot_make_reading_quadratic() {
        let k = 100_000;
        let len = k * (HEADER + 8);
        let mut buf = Vec::with_capacity(len);
        for i in 0..k {
            let rest = len - i * (HEADER + 8);
            let n = (rest - HEADER - 8) / 8;
            let mut r = encode(STAMP, 0, &[]);
            r[4 + 5 * 8..4 + 6 * 8].copy_from_slice(&(n as u64).to_le_bytes());
            buf.extend(r);
        }
        let held = held_in(&buf, 10);
        assert_eq!(held.have.count(), 0);
        // Without the budget: about k * len / 2, 300 GB.
        assert!(held.hashed <= len + MAX_REHASH + len, "{}", held.hashed);
    }

    /// A temporary file of `blocks` blocks of 4 bytes, block `b` holding
    /// the bytes `[b; 4]`, with records for blocks `0..blocks`; the root.
    fn shared(blocks: u8) -> (tempfile::TempDir, OwnedFd, File, Layout, Stamp) {
        let tmp = tempfile::tempdir().unwrap();
        let dir: OwnedFd = File::open(tmp.path()).unwrap().into();
        let data: Vec<u8> = (0..blocks).flat_map(|b| [b; 4]).collect();
        std::fs::write(tmp.path().join(".f.wirerate-part"), &data).unwrap();
        let part = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(tmp.path().join(".f.wirerate-part"))
            .unwrap();
        let layout = Layout::new(data.len() as u64, 4);
        let stamp = Stamp {
            fingerprint: 7,
            size: data.len() as u64,
            block_size: 4,
            ino: 42,
        };
        let sums: Vec<u64> = (0..blocks).map(|b| block_checksum(&[b; 4])).collect();
        append(&dir, ".f.wirerate-pieces", stamp, 0, &sums).unwrap();
        (tmp, dir, part, layout, stamp)
    }

    fn later() -> Instant {
        Instant::now() + std::time::Duration::from_secs(60)
    }

    // On slow shared storage a chunk's worth of reading back could outlast
    // the sender's wait for the plan: past its budget, the rest is sent.
    #[test]
    fn blocks_not_confirmed_by_the_deadline_are_sent_again() {
        let (_tmp, dir, part, layout, stamp) = shared(4);
        let name = ".f.wirerate-pieces";
        let (have, _) = resume(
            (&dir, name),
            stamp,
            (&part, &layout),
            (0, 4),
            Instant::now(),
        );
        assert_eq!(have.count(), 0);
    }

    #[test]
    fn records_are_appended_and_read_back_for_the_piece_asked() {
        let (_tmp, dir, part, layout, stamp) = shared(6);
        let name = ".f.wirerate-pieces";
        let (have, sums) = resume((&dir, name), stamp, (&part, &layout), (1, 4), later());
        assert_eq!(blocks(&have), [1, 2, 3]);
        assert_eq!(sums[2], block_checksum(&[2; 4]));
        assert_eq!(sums[0], 0, "outside the piece");
        // None recorded yet for another name.
        let (have, _) = resume(
            (&dir, ".g.wirerate-pieces"),
            stamp,
            (&part, &layout),
            (0, 6),
            later(),
        );
        assert_eq!(have.count(), 0);
    }

    // Found in review: a record vouches for what was written, not for what
    // the temporary file holds now. Another transfer to the same name, or
    // a new temporary file given the inode number of one removed, holds
    // other bytes under records that still match; trusted as they stand,
    // those blocks were published unread.
    #[test]
    fn a_recorded_block_that_the_temporary_file_no_longer_holds_is_not_resumed() {
        let (_tmp, dir, part, layout, stamp) = shared(6);
        part.write_all_at(&[9; 4], 2 * 4).unwrap();
        part.set_len(5 * 4 + 2).unwrap();
        let name = ".f.wirerate-pieces";
        let (have, sums) = resume((&dir, name), stamp, (&part, &layout), (0, 6), later());
        // Block 2 was overwritten, block 5 is short: both are sent again.
        assert_eq!(blocks(&have), [0, 1, 3, 4]);
        assert_eq!((sums[2], sums[5]), (0, 0));
    }

    #[test]
    fn records_of_only_other_versions_are_removed_and_a_fifo_is_not_read() {
        let (tmp, dir, part, layout, stamp) = shared(2);
        let name = ".f.wirerate-pieces";
        let other = Stamp { ino: 1, ..stamp };
        let (have, _) = resume((&dir, name), other, (&part, &layout), (0, 2), later());
        assert_eq!(have.count(), 0);
        assert!(!tmp.path().join(name).exists(), "stale records stay");
        rustix::fs::mkfifoat(&dir, name, rustix::fs::Mode::from_raw_mode(0o600)).unwrap();
        let (have, _) = resume((&dir, name), stamp, (&part, &layout), (0, 2), later());
        assert_eq!(have.count(), 0);
    }
}
