//! A preallocated pool of aligned block buffers, on huge pages when the pod
//! was given them or the host has enough free (see `hugepages`).

use std::ptr::NonNull;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::ALIGN;
use super::hugepages::{self, Backing, PageSize};
use crate::error::{Error, Result};

struct Inner {
    base: NonNull<u8>,
    map_len: usize,
    buf_size: usize,
    free: Mutex<Vec<usize>>,
    cv: Condvar,
    page: Option<PageSize>,
    /// Why huge pages that were asked for are not used.
    huge_note: Option<String>,
    count: usize,
}

// SAFETY: the mapping is owned by `Inner` and lives until it drops; each
// buffer index is handed to at most one `PoolBuf` at a time (the free list
// is behind a mutex), so no two threads touch the same bytes.
unsafe impl Send for Inner {}
// SAFETY: as above; shared access only reads `base`, which never changes.
unsafe impl Sync for Inner {}

impl Drop for Inner {
    fn drop(&mut self) {
        // SAFETY: `base`/`map_len` came from a successful mmap, and every
        // PoolBuf holds an Arc to us, so no buffer outlives the mapping. Ops
        // in flight own their PoolBuf, so the kernel is done with the memory.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.map_len);
        }
    }
}

/// The pool; clones share it.
#[derive(Clone)]
pub struct Pool {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("buf_size", &self.inner.buf_size)
            .field("count", &self.inner.count)
            .field("page", &self.inner.page)
            .finish()
    }
}

/// Maps `len` bytes of a new, unlinked file in the hugetlbfs mount `dir`:
/// the pages come from what the pod was given there, at its page size.
fn map_file(dir: &std::path::Path, len: usize) -> Option<NonNull<u8>> {
    use std::os::fd::AsRawFd;
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = dir.join(format!(".wirerate-buffers-{}-{n}", std::process::id()));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .ok()?;
    // Unlinked at once: the pages go back when the mapping goes, even after a crash.
    let _ = std::fs::remove_file(&path);
    file.set_len(len as u64).ok()?;
    // SAFETY: a shared mapping of a file only this function has opened, with
    // no address hint, touches no existing memory; hugetlbfs reserves the
    // pages at mmap time, so a shortage is an error here rather than a
    // SIGBUS later; the result is checked for MAP_FAILED before use.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_POPULATE,
            file.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    NonNull::new(p.cast())
}

fn map(len: usize, huge: Option<PageSize>) -> Option<NonNull<u8>> {
    let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    if let Some(page) = huge {
        // Hugepages are reserved at mmap time anyway; fault them in now.
        flags |= libc::MAP_HUGETLB | libc::MAP_POPULATE | page.map_flag();
    }
    // Normal pages are left to fault in on first use: populating the whole
    // pool up front zeroed 512 MiB per side before every transfer, which
    // dominated small transfers' time and CPU.

    // SAFETY: an anonymous private mapping with no address hint touches no
    // existing memory; the result is checked for MAP_FAILED before use.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return None;
    }
    if huge.is_none() {
        // Transparent hugepages where the host allows them (THP "madvise"
        // is common): a 16 MiB buffer faults in 8 times instead of 4,096,
        // which was a tenth of a small transfer's CPU time.
        // SAFETY: [p, p + len) is the mapping just created, owned by no one
        // else yet; MADV_HUGEPAGE changes only how it is backed, never its
        // contents, and a refusal (THP off) is harmless.
        unsafe {
            libc::madvise(p, len, libc::MADV_HUGEPAGE);
        }
    }
    NonNull::new(p.cast())
}

impl Pool {
    /// `count` buffers of `buf_size` bytes (a multiple of 4096), on huge
    /// pages when it can.
    pub fn new(buf_size: usize, count: usize) -> Result<Self> {
        Self::build(buf_size, count, true)
    }

    /// Like `new`, on normal pages: a pool of small buffers would round up
    /// to a whole huge page (1 GiB of them) for a few KiB.
    pub fn normal(buf_size: usize, count: usize) -> Result<Self> {
        Self::build(buf_size, count, false)
    }

    fn build(buf_size: usize, count: usize, may_be_huge: bool) -> Result<Self> {
        if buf_size == 0 || buf_size % ALIGN != 0 || count == 0 {
            return Err(Error::Config(format!(
                "buffer pool needs a block size that is a positive multiple of {ALIGN} (got {buf_size}) and at least one buffer"
            )));
        }
        let len = buf_size
            .checked_mul(count)
            .ok_or_else(|| Error::Config("buffer pool size overflows".into()))?;
        let backing = if may_be_huge {
            hugepages::decide(&hugepages::offer(), len)
        } else {
            Backing::Normal { why: None }
        };
        let (huge, mut huge_note) = match backing {
            Backing::Huge {
                page,
                len: huge_len,
                file_in,
            } => {
                let p = match &file_in {
                    Some(dir) => map_file(dir, huge_len),
                    None => map(huge_len, Some(page)),
                };
                let note = (p.is_none() && file_in.is_some()).then(|| {
                    format!(
                        "mapping {huge_len} bytes of {page} huge pages failed ({}): buffers are on normal pages",
                        std::io::Error::last_os_error()
                    )
                });
                (p.map(|p| (p, huge_len, page)), note)
            }
            Backing::Normal { why } => (None, why),
        };
        let (base, map_len, page) = match huge {
            Some((p, l, page)) => (p, l, Some(page)),
            None => match map(len, None) {
                Some(p) => (p, len, None),
                None => {
                    return Err(Error::io(
                        format!("allocating {len} bytes of transfer buffers"),
                        std::io::Error::last_os_error(),
                    ));
                }
            },
        };
        Ok(Self {
            inner: Arc::new(Inner {
                base,
                map_len,
                buf_size,
                free: Mutex::new((0..count).rev().collect()),
                cv: Condvar::new(),
                page,
                huge_note: huge_note.take(),
                count,
            }),
        })
    }

    /// Size of each buffer.
    pub fn buf_size(&self) -> usize {
        self.inner.buf_size
    }

    /// Number of buffers.
    pub fn count(&self) -> usize {
        self.inner.count
    }

    /// Whether the buffers sit on hugepages.
    pub fn hugepages(&self) -> bool {
        self.inner.page.is_some()
    }

    /// The huge page size the buffers sit on, if they do.
    pub fn page_size(&self) -> Option<PageSize> {
        self.inner.page
    }

    /// Why huge pages asked for (`WIRERATE_HUGEPAGES`) are not used, if not.
    pub fn huge_note(&self) -> Option<&str> {
        self.inner.huge_note.as_deref()
    }

    fn take(&self, idx: usize) -> PoolBuf {
        PoolBuf {
            inner: Arc::clone(&self.inner),
            idx,
            len: 0,
        }
    }

    /// A free buffer, if one is free now.
    pub fn try_get(&self) -> Option<PoolBuf> {
        let idx = self
            .inner
            .free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop()?;
        Some(self.take(idx))
    }

    /// A free buffer, waiting at most `timeout` for one.
    pub fn get_timeout(&self, timeout: Duration) -> Option<PoolBuf> {
        let free = self.inner.free.lock().unwrap_or_else(|p| p.into_inner());
        let (mut free, _) = self
            .inner
            .cv
            .wait_timeout_while(free, timeout, |f| f.is_empty())
            .unwrap_or_else(|p| p.into_inner());
        let idx = free.pop()?;
        drop(free);
        Some(self.take(idx))
    }
}

/// Size of the buffers that hold small blocks (small files, tails).
pub const SMALL_BUF: usize = 64 << 10;

/// Buffers in two sizes: without the small ones, every block of a small
/// file would tie up a whole block-size buffer, and a tree of small files
/// would be limited by how many buffers fit in one round trip.
#[derive(Clone, Debug)]
pub struct Pools {
    large: Pool,
    small: Option<Pool>,
}

impl Pools {
    /// `large_count` buffers of `block_size`, plus 64 KiB buffers worth an
    /// eighth of that memory (16 to 1,024 of them) when blocks are larger.
    pub fn new(block_size: usize, large_count: usize) -> Result<Self> {
        let large = Pool::new(block_size, large_count)?;
        let small = match Self::small_count(block_size, large_count) {
            0 => None,
            n => Some(Pool::normal(SMALL_BUF, n)?),
        };
        Ok(Self { large, small })
    }

    fn small_count(block_size: usize, large_count: usize) -> usize {
        if block_size > SMALL_BUF {
            (block_size.saturating_mul(large_count) / 8 / SMALL_BUF).clamp(16, 1024)
        } else {
            0
        }
    }

    /// The memory `new(block_size, large_count)` takes.
    pub fn bytes_for(block_size: usize, large_count: usize) -> u64 {
        (block_size as u64).saturating_mul(large_count as u64)
            + (Self::small_count(block_size, large_count) * SMALL_BUF) as u64
    }

    /// The pool whose buffers suit a `len`-byte block.
    pub fn for_len(&self, len: usize) -> &Pool {
        match &self.small {
            Some(s) if len <= s.buf_size() => s,
            _ => &self.large,
        }
    }

    /// Whether these are `large_count` buffers of `block_size`, as
    /// `new(block_size, large_count)` would make.
    pub fn is_shaped(&self, block_size: usize, large_count: usize) -> bool {
        self.large.buf_size() == block_size && self.large.count() == large_count
    }

    /// Bytes in the block-size buffers.
    pub fn large_bytes(&self) -> u64 {
        (self.large.buf_size() * self.large.count()) as u64
    }

    /// Whether the block-size buffers sit on hugepages.
    pub fn hugepages(&self) -> bool {
        self.large.hugepages()
    }

    /// What the block-size buffers sit on, for people: `1 GiB huge-page`.
    pub fn pages(&self) -> String {
        match self.large.page_size() {
            Some(p) => format!("{p} huge-page"),
            None => "normal-page".into(),
        }
    }

    /// Why huge pages asked for are not used, if not.
    pub fn huge_note(&self) -> Option<&str> {
        self.large.huge_note()
    }
}

/// One buffer of the pool, returned to it on drop.
pub struct PoolBuf {
    inner: Arc<Inner>,
    idx: usize,
    len: usize,
}

impl PoolBuf {
    /// Capacity in bytes (the pool's block size).
    pub fn capacity(&self) -> usize {
        self.inner.buf_size
    }

    /// Valid bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// No valid bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Marks the first `len` bytes valid (clamped to capacity).
    pub fn set_len(&mut self, len: usize) {
        self.len = len.min(self.capacity());
    }

    /// Start of the buffer, for the kernel; stays put for the buffer's life.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        // SAFETY: idx < count, so the offset stays inside the mapping.
        unsafe { self.inner.base.as_ptr().add(self.idx * self.inner.buf_size) }
    }

    /// The valid bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: this buffer's range is inside the mapping, initialised
        // (anonymous mappings are zero-filled) and owned by us alone.
        unsafe {
            std::slice::from_raw_parts(
                self.inner.base.as_ptr().add(self.idx * self.inner.buf_size),
                self.len,
            )
        }
    }

    /// The whole capacity, for filling.
    pub fn as_mut_full(&mut self) -> &mut [u8] {
        let cap = self.capacity();
        // SAFETY: as in `as_slice`, and `&mut self` makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.as_mut_ptr(), cap) }
    }
}

impl Drop for PoolBuf {
    fn drop(&mut self) {
        self.inner
            .free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(self.idx);
        self.inner.cv.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_distinct_and_recycled() {
        let pool = Pool::new(8192, 2).unwrap();
        let mut a = pool.try_get().unwrap();
        let mut b = pool.try_get().unwrap();
        assert!(pool.try_get().is_none());
        assert_eq!(a.as_mut_ptr() as usize % ALIGN, 0);
        assert_eq!(b.as_mut_ptr() as usize % ALIGN, 0);
        a.as_mut_full().fill(1);
        b.as_mut_full().fill(2);
        a.set_len(10);
        assert!(a.as_slice().iter().all(|&x| x == 1));
        drop(a);
        assert!(pool.get_timeout(Duration::from_millis(10)).is_some());
        assert!(Pool::new(1000, 1).is_err());
    }

    #[test]
    fn small_blocks_get_small_buffers() {
        let p = Pools::new(1 << 20, 4).unwrap();
        assert_eq!(p.for_len(100).buf_size(), SMALL_BUF);
        assert_eq!(p.for_len(SMALL_BUF).buf_size(), SMALL_BUF);
        assert_eq!(p.for_len(SMALL_BUF + 1).buf_size(), 1 << 20);
        let q = Pools::new(SMALL_BUF, 4).unwrap();
        assert_eq!(
            q.for_len(10).buf_size(),
            SMALL_BUF,
            "one size when blocks are small"
        );
    }
}
