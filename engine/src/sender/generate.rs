//! The reader of a memory-to-memory session (`send --synthetic`): it hands
//! the scheduler generated blocks instead of reading a disk, in the order
//! the scheduler asks and in the same pool buffers, so everything after it
//! (checksums, streams, pacing, acknowledgements, resends) is the
//! disk-to-disk path with the disk taken out.
//!
//! A block's bytes are one fixed pseudo-random sequence with the block's
//! file offset stamped at the start of every 4 KiB page. A buffer is
//! filled with the sequence the first time it is used and only restamped
//! after that, so making a block costs a store per page rather than a pass
//! over it; every block still differs from the others, and its bytes
//! depend on its offset alone, so a resent block is the same block.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::reader::ReadReport;
use super::shared::Shared;
use crate::digest::block_checksum;
use crate::error::Result;
use crate::io::{ALIGN, Pools};

/// Bytes between two offset stamps.
const STAMP_EVERY: usize = 4096;

/// Fills `buf` with the fixed sequence (xorshift64 from a fixed seed), the
/// same bytes at the same index whatever the buffer.
fn fill(buf: &mut [u8]) {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for chunk in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
}

/// Stamps the block at file `offset` into a buffer holding the sequence.
fn stamp(block: &mut [u8], offset: u64) {
    for (i, page) in block.chunks_mut(STAMP_EVERY).enumerate() {
        let at = (offset + (i * STAMP_EVERY) as u64).to_le_bytes();
        let n = page.len().min(at.len());
        page[..n].copy_from_slice(&at[..n]);
    }
}

/// Generates the blocks the scheduler asks for until it has none left or
/// the session stops.
pub(crate) fn run(shared: &Shared, pools: &Pools, need_digest: bool) -> Result<ReadReport> {
    let mut filled = HashSet::new();
    while !shared.stopped() {
        let Some(next_len) = shared.lock().sched.next_read_len() else {
            break;
        };
        let pool = pools.for_len((next_len as usize).next_multiple_of(ALIGN));
        // Buffers come back as blocks are acknowledged; wait a little, then
        // look at `stopped` again.
        let Some(mut buf) = pool.get_timeout(Duration::from_millis(100)) else {
            continue;
        };
        let Some(order) = shared.lock().sched.poll_read() else {
            break;
        };
        let len = order.len as usize;
        let full = buf.as_mut_full();
        if filled.insert(full.as_ptr() as usize) {
            fill(full);
        }
        stamp(&mut full[..len], order.offset);
        buf.set_len(len);
        // As the reader does: blocks to send are hashed as they go out.
        let sum = if need_digest && order.digest_only {
            block_checksum(buf.as_slice())
        } else {
            0
        };
        let mut g = shared.lock();
        g.sched.handle_read(order.gid, sum);
        if g.sched.is_ready(order.gid) {
            g.bufs.insert(order.gid, std::sync::Arc::new(buf));
        }
        drop(g);
        shared.read_bytes.fetch_add(len as u64, Ordering::Relaxed);
        shared.cv.notify_all();
    }
    Ok(ReadReport::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(offset: u64, len: usize, dirty: u8) -> Vec<u8> {
        let mut b = vec![dirty; len];
        fill(&mut b);
        stamp(&mut b, offset);
        b
    }

    #[test]
    fn a_block_is_a_function_of_its_offset_alone() {
        // Filled fresh, or reused after carrying another block: the same.
        let mut reused = block(0, 3 * STAMP_EVERY, 0xAA);
        stamp(&mut reused, 1 << 20);
        assert_eq!(reused, block(1 << 20, 3 * STAMP_EVERY, 0x55));
    }

    #[test]
    fn blocks_differ_from_each_other_and_within_themselves() {
        let a = block(0, 2 * STAMP_EVERY, 0);
        let b = block(16 << 20, 2 * STAMP_EVERY, 0);
        assert_ne!(a, b);
        assert_ne!(a[..STAMP_EVERY], a[STAMP_EVERY..]);
        // Not a constant: a compressing link would flatter the rate.
        let distinct: HashSet<u8> = a[8..STAMP_EVERY].iter().copied().collect();
        assert!(distinct.len() > 200, "{} distinct bytes", distinct.len());
    }

    #[test]
    fn a_short_tail_is_stamped_without_overrun() {
        let b = block(4096, 5, 0);
        assert_eq!(b, &4096u64.to_le_bytes()[..5]);
    }
}
