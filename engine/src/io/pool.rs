//! A preallocated pool of aligned block buffers, on huge pages when the pod
//! was given them or the host has enough free (see `hugepages`).

use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
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
    /// Where several sessions draw on the pool at once: how many of its
    /// buffers this one may hold (`Pools::shared`).
    quota: Option<Arc<Quota>>,
}

/// A cap on the buffers one holder of a shared pool has at once, so that
/// one whose blocks stall (its stream black-holed until it times out)
/// cannot starve the others.
#[derive(Debug)]
struct Quota {
    most: usize,
    held: AtomicUsize,
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
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
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
            quota: None,
        })
    }

    /// A clone whose holder may have at most `most` buffers at once.
    fn with_quota(&self, most: usize) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            quota: Some(Arc::new(Quota {
                most: most.max(1),
                held: AtomicUsize::new(0),
            })),
        }
    }

    /// Buffers this holder may have at once.
    fn usable(&self) -> usize {
        self.quota
            .as_ref()
            .map_or(self.inner.count, |q| q.most.min(self.inner.count))
    }

    /// Takes a free buffer, unless none is free or the quota is reached;
    /// under the free list's lock, so two threads never both take the
    /// last one the quota allows.
    fn claim(&self, free: &mut Vec<usize>) -> Option<PoolBuf> {
        if self.at_quota() {
            return None;
        }
        let idx = free.pop()?;
        if let Some(q) = &self.quota {
            q.held.fetch_add(1, Ordering::SeqCst);
        }
        Some(PoolBuf {
            inner: Arc::clone(&self.inner),
            quota: self.quota.clone(),
            idx,
            len: 0,
        })
    }

    fn at_quota(&self) -> bool {
        self.quota
            .as_ref()
            .is_some_and(|q| q.held.load(Ordering::SeqCst) >= q.most)
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

    /// A free buffer, if one is free now.
    pub fn try_get(&self) -> Option<PoolBuf> {
        let mut free = self.inner.free.lock().unwrap_or_else(|p| p.into_inner());
        self.claim(&mut free)
    }

    /// A free buffer, waiting at most `timeout` for one.
    pub fn get_timeout(&self, timeout: Duration) -> Option<PoolBuf> {
        let free = self.inner.free.lock().unwrap_or_else(|p| p.into_inner());
        let (mut free, _) = self
            .inner
            .cv
            .wait_timeout_while(free, timeout, |f| f.is_empty() || self.at_quota())
            .unwrap_or_else(|p| p.into_inner());
        self.claim(&mut free)
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
        (self.large.buf_size() * self.large.usable()) as u64
    }

    /// A clone for one of several sessions that draw on these buffers at
    /// once: it may hold at most three quarters of each size, so that
    /// one whose blocks stall leaves the others some.
    pub fn shared(&self) -> Self {
        // Three quarters, and never all of a pool of two or more.
        let share = |p: &Pool| {
            let n = p.count();
            p.with_quota((n * 3 / 4).clamp(1, n.saturating_sub(1).max(1)))
        };
        Self {
            large: share(&self.large),
            small: self.small.as_ref().map(share),
        }
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
    quota: Option<Arc<Quota>>,
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
        let mut free = self.inner.free.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(q) = &self.quota {
            q.held.fetch_sub(1, Ordering::SeqCst);
        }
        free.push(self.idx);
        drop(free);
        // Waiters of a shared pool wait on their own quotas too: the one
        // this buffer frees may not be the one woken first.
        match self.quota {
            Some(_) => self.inner.cv.notify_all(),
            None => self.inner.cv.notify_one(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A session whose streams stall holds its buffers until it times out:
    // sharing a pool must leave the other session some.
    #[test]
    fn a_shared_clone_holds_three_quarters_at_most_and_wakes_the_other() {
        let p = Pools::new(4096, 8).unwrap();
        let (a, b) = (p.shared(), p.shared());
        assert_eq!(a.large_bytes(), 6 * 4096);
        let held: Vec<_> = (0..6).map_while(|_| a.for_len(4096).try_get()).collect();
        assert_eq!(held.len(), 6);
        assert!(a.for_len(4096).try_get().is_none(), "over its quota");
        assert!(
            a.for_len(4096)
                .get_timeout(Duration::from_millis(10))
                .is_none()
        );
        let other: Vec<_> = (0..2).map_while(|_| b.for_len(4096).try_get()).collect();
        assert_eq!(other.len(), 2);
        // One of its own coming back lets it take one again.
        let mut held = held;
        let again = std::thread::scope(|s| {
            let waiting = s.spawn(|| a.for_len(4096).get_timeout(Duration::from_secs(5)));
            std::thread::sleep(Duration::from_millis(50));
            held.pop();
            waiting.join().unwrap()
        });
        assert!(again.is_some());
        assert!(b.for_len(4096).try_get().is_none(), "every buffer is held");
        // An unshared clone is not held back; a shared one never holds
        // all of a small pool.
        assert_eq!(p.large_bytes(), 8 * 4096);
        assert_eq!(Pools::new(4096, 2).unwrap().shared().large_bytes(), 4096);
        assert_eq!(Pools::new(4096, 1).unwrap().shared().large_bytes(), 4096);
    }

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
