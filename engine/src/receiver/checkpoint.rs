//! The on-disk resume checkpoint: which blocks of the temporary file are
//! durable, and their checksums. Written to a temporary name, synced, then
//! renamed over the old one, so a crash leaves either checkpoint intact.
#![forbid(unsafe_code)]

use std::io::{Read, Write};
use std::os::fd::OwnedFd;

use crate::digest::xxh3_64;
use rustix::fs::OFlags;

use crate::Bitmap;
use crate::error::{Error, Result};
use crate::fsroot::Root;
use crate::wire::MAX_BLOCKS_PER_FILE;

const MAGIC: &[u8; 4] = b"WRCK";
/// Version 2 adds the temporary file's inode; version 1 is still read.
const VERSION: u32 = 2;
const VERSION_WITHOUT_INODE: u32 = 1;

/// What a checkpoint records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// The source version it belongs to.
    pub fingerprint: u64,
    /// File size.
    pub size: u64,
    /// Block size.
    pub block_size: u64,
    /// The inode of the temporary file it records (None from a version 1
    /// checkpoint): a checkpoint left without its temporary file, by a
    /// crash between a publication's rename and its removal, is never
    /// taken to match a later temporary file that happens to have the
    /// same size.
    pub ino: Option<u64>,
    /// Durable blocks.
    pub durable: Bitmap,
    /// Checksums by block.
    pub checksums: Vec<u64>,
}

impl Checkpoint {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(48 + self.checksums.len() * 8);
        out.extend_from_slice(MAGIC);
        let (version, ino) = match self.ino {
            Some(ino) => (VERSION, vec![ino]),
            None => (VERSION_WITHOUT_INODE, Vec::new()),
        };
        out.extend_from_slice(&version.to_le_bytes());
        let head = [self.fingerprint, self.size, self.block_size];
        for v in head.into_iter().chain(ino).chain([self.durable.len()]) {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.durable.to_bytes());
        for c in &self.checksums {
            out.extend_from_slice(&c.to_le_bytes());
        }
        let sum = xxh3_64(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    /// Parses a checkpoint; `None` if damaged or of another version.
    pub fn decode(buf: &[u8]) -> Option<Self> {
        let (body, sum) = buf.split_at_checked(buf.len().checked_sub(8)?)?;
        if xxh3_64(body).to_le_bytes() != sum {
            return None;
        }
        if body.get(..4)? != MAGIC {
            return None;
        }
        let with_inode = match u32::from_le_bytes(body.get(4..8)?.try_into().ok()?) {
            VERSION => true,
            VERSION_WITHOUT_INODE => false,
            _ => return None,
        };
        let u = |i: usize| -> Option<u64> {
            Some(u64::from_le_bytes(
                body.get(8 + i * 8..16 + i * 8)?.try_into().ok()?,
            ))
        };
        let (fingerprint, size, block_size) = (u(0)?, u(1)?, u(2)?);
        let (ino, n, head) = if with_inode {
            (Some(u(3)?), u(4)?, 48)
        } else {
            (None, u(3)?, 40)
        };
        // Bounded first: a forged count would overflow the sizes below.
        if block_size == 0 || n > MAX_BLOCKS_PER_FILE || n != size.div_ceil(block_size) {
            return None;
        }
        let bm_len = n.div_ceil(8) as usize;
        let rest = body.get(head..)?;
        if rest.len() as u64 != bm_len as u64 + n * 8 {
            return None;
        }
        let durable = Bitmap::from_bytes(n, &rest[..bm_len])?;
        let checksums = rest[bm_len..]
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
            .collect();
        Some(Self {
            fingerprint,
            size,
            block_size,
            ino,
            durable,
            checksums,
        })
    }

    /// Loads the checkpoint `name` in `dir`, if present and intact.
    pub fn load(dir: &OwnedFd, name: &str) -> Option<Self> {
        let mut f = Root::open_in(dir, name, OFlags::RDONLY).ok()?;
        let mut buf = Vec::new();
        // A checkpoint of a maximal file is ~130 MiB; refuse anything bigger.
        Read::by_ref(&mut f)
            .take(256 << 20)
            .read_to_end(&mut buf)
            .ok()?;
        Self::decode(&buf)
    }

    /// Durably replaces the checkpoint `name` in `dir`. On failure the
    /// old checkpoint stays as it was and no temporary file is left.
    pub fn store(&self, dir: &OwnedFd, name: &str) -> Result<()> {
        // `.tmp` after the checkpoint's own suffix: CKPT_TMP_SUFFIX.
        let tmp = format!("{name}.tmp");
        let ctx = |what: &str| format!("{what} checkpoint {name}");
        let written = Root::open_in(dir, &tmp, OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC)
            .map_err(|e| Error::disk(ctx("creating"), e.into()))
            .and_then(|mut f| {
                f.write_all(&self.encode())
                    .map_err(|e| Error::disk(ctx("writing"), e))?;
                f.sync_data().map_err(|e| Error::disk(ctx("syncing"), e))
            })
            .and_then(|()| {
                rustix::fs::renameat(dir, tmp.as_str(), dir, name)
                    .map_err(|e| Error::disk(ctx("renaming"), e.into()))
            });
        if written.is_err() {
            let _ = Root::remove_in(dir, &tmp);
        }
        written
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_replacement_is_named_as_the_receiver_knows_it() {
        assert_eq!(
            crate::fsroot::CKPT_TMP_SUFFIX,
            format!("{}.tmp", crate::fsroot::CKPT_SUFFIX)
        );
    }

    #[test]
    fn roundtrip_and_damage() {
        let mut durable = Bitmap::new(3);
        durable.set(1);
        let mut c = Checkpoint {
            fingerprint: 9,
            size: 10,
            block_size: 4,
            ino: Some(77),
            durable,
            checksums: vec![0, 5, 0],
        };
        // Version 2, and version 1 as earlier receivers stored it.
        assert_eq!(Checkpoint::decode(&c.encode()), Some(c.clone()));
        c.ino = None;
        let mut buf = c.encode();
        assert_eq!(buf[4..8], 1u32.to_le_bytes());
        assert_eq!(Checkpoint::decode(&buf), Some(c));
        buf[20] ^= 1;
        assert_eq!(Checkpoint::decode(&buf), None);
        assert_eq!(Checkpoint::decode(&[]), None);
        assert_eq!(Checkpoint::decode(&[0; 7]), None);
    }

    // A checkpoint is a file in the destination, which anyone who may write
    // there can forge (its check is no secret): a block count whose sizes
    // overflow is refused, not a panic (found by review).
    #[test]
    fn a_forged_block_count_is_refused_not_a_panic() {
        let mut body = Vec::new();
        body.extend_from_slice(MAGIC);
        body.extend_from_slice(&VERSION_WITHOUT_INODE.to_le_bytes());
        let n: u64 = 2_270_368_501_379_637_123;
        for v in [0, n, 1, n] {
            body.extend_from_slice(&v.to_le_bytes());
        }
        body.extend_from_slice(&[0; 9]);
        let sum = xxh3_64(&body);
        body.extend_from_slice(&sum.to_le_bytes());
        assert_eq!(Checkpoint::decode(&body), None);
    }
}
