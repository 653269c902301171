//! `wirerate-agent demo`: a real transfer on this machine, from a generated
//! file to a receiver on 127.0.0.1, next to what the disk alone can do.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::observer::{Shown, watch_send};
use crate::progress::Renderer;
use crate::units::fmt_bytes;
use wirerate_engine::error::{Error, Result};
use wirerate_engine::io::{ALIGN, IoMode, IoOp, OpKind, Pool, backend, open::on_tmpfs, open_path};
use wirerate_engine::receiver::{ServeConfig, Server};
use wirerate_engine::sender::{SendConfig, send};
use wirerate_engine::summary::{ReceiverSummary, SendSummary};

/// What the demo does.
#[derive(Debug, Clone)]
pub struct DemoConfig {
    /// Size of the generated file.
    pub size: u64,
    /// Where the temporary directory goes (must be on a real disk).
    pub dir: PathBuf,
    /// The transfer's settings (source, destination and address are filled in).
    pub send: SendConfig,
    /// I/O modes to run, one transfer each.
    pub modes: Vec<IoMode>,
    /// Keep the files afterwards.
    pub keep: bool,
    /// No progress bar.
    pub quiet: bool,
}

/// One mode's result.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DemoRun {
    /// Sender summary.
    pub sender: SendSummary,
    /// Receiver summary.
    pub receiver: Option<ReceiverSummary>,
}

/// The demo's report.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DemoReport {
    /// Where it ran.
    pub dir: String,
    /// Generated file size.
    pub size: u64,
    /// Disk write rate alone, GB/s (O_DIRECT, while generating the file).
    pub disk_write_gbs: f64,
    /// Disk read rate alone, GB/s (O_DIRECT io_uring).
    pub disk_read_gbs: f64,
    /// Local copy on the same disk, GB/s: reading and writing at once, no
    /// network, final fsync included. The limit for this demo's transfer.
    pub disk_copy_gbs: f64,
    /// One transfer per mode.
    pub runs: Vec<DemoRun>,
}

fn drop_cache(path: &Path) {
    if let Ok(f) = File::open(path) {
        let _ = f.sync_all();
        let _ = rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed);
    }
}

/// Writes `size` bytes of pseudo-random data with O_DIRECT; returns GB/s.
fn generate(path: &Path, size: u64, seed: u64) -> Result<f64> {
    let ctx = || format!("creating the demo file {}", path.display());
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .or_else(|_| {
            OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(path)
        })
        .map_err(|e| Error::io(ctx(), e))?;
    let chunk = 8 << 20;
    let pool = Pool::new(chunk, 1)?;
    let mut buf = pool.try_get().expect("a new pool has a buffer");
    let mut state = seed | 1;
    let t0 = Instant::now();
    let mut off = 0u64;
    while off < size {
        let n = (size - off).min(chunk as u64) as usize;
        for w in buf.as_mut_full().chunks_exact_mut(8) {
            // xorshift64*: fast, and incompressible enough for a disk test.
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            w.copy_from_slice(&state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
        }
        if n % ALIGN == 0 {
            buf.set_len(n);
            f.write_all_at(buf.as_slice(), off)
                .map_err(|e| Error::io(ctx(), e))?;
        } else {
            // O_DIRECT refuses the unaligned tail: write it through the page cache.
            buf.set_len(n);
            OpenOptions::new()
                .write(true)
                .open(path)
                .and_then(|plain| plain.write_all_at(buf.as_slice(), off))
                .map_err(|e| Error::io(ctx(), e))?;
        }
        off += n as u64;
    }
    f.sync_all().map_err(|e| Error::io(ctx(), e))?;
    let secs = t0.elapsed().as_secs_f64();
    drop_cache(path);
    Ok(size as f64 / secs / 1e9)
}

/// Reads `src` with the async engine and no network, and with `dst` also
/// writes it there (reads and writes in flight at once: the disk-to-disk
/// limit when both share a disk). Returns GB/s, final fsync included.
fn disk_pass(src: &Path, dst: Option<&Path>, block: usize, depth: usize) -> Result<f64> {
    let (f, status) = open_path(src, true)?;
    let direct = status.is_direct();
    let f = Arc::new(f);
    let size = f.metadata().map_err(|e| Error::io("stat", e))?.len();
    let ctx = |p: &Path| format!("writing {}", p.display());
    let out = match dst {
        Some(p) => Some(Arc::new(
            OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .custom_flags(if direct { libc::O_DIRECT } else { 0 })
                .open(p)
                .map_err(|e| Error::io(ctx(p), e))?,
        )),
        None => None,
    };
    let depth = depth.max(1);
    let pool = Pool::new(block, depth * 2)?;
    let (mut io, _, _) = backend(IoMode::Async, depth * 2);
    let t0 = Instant::now();
    let mut off = 0u64;
    let mut reads = 0;
    loop {
        while off < size && reads < depth {
            let Some(buf) = pool.try_get() else { break };
            let len = (size - off).min(block as u64) as usize;
            io.submit(IoOp {
                file: Arc::clone(&f),
                kind: OpKind::Read,
                buf,
                offset: off,
                len: if direct {
                    len.next_multiple_of(ALIGN)
                } else {
                    len
                },
                tag: off,
            });
            reads += 1;
            off += len as u64;
        }
        if io.in_flight() == 0 {
            break;
        }
        for d in io.reap(true)? {
            d.result
                .map_err(|e| Error::io(format!("reading {}", src.display()), e))?;
            if d.kind == OpKind::Read {
                reads -= 1;
                if let Some(out) = &out {
                    // Whole aligned buffers go out; the file is cut to size below.
                    let len = d.buf.len().next_multiple_of(ALIGN);
                    io.submit(IoOp {
                        file: Arc::clone(out),
                        kind: OpKind::Write,
                        buf: d.buf,
                        offset: d.tag,
                        len,
                        tag: d.tag,
                    });
                }
            }
        }
    }
    if let (Some(out), Some(p)) = (&out, dst) {
        out.set_len(size).map_err(|e| Error::io(ctx(p), e))?;
        out.sync_all().map_err(|e| Error::io(ctx(p), e))?;
    }
    let secs = t0.elapsed().as_secs_f64();
    if let Some(p) = dst {
        let _ = std::fs::remove_file(p);
    }
    drop_cache(src);
    Ok(size as f64 / secs / 1e9)
}

/// The most the demo has on disk at once: the generated file and one copy
/// of it (first the local copy, removed before the transfers, then each
/// transfer's destination, removed before the next), each rounded up to
/// the O_DIRECT alignment it is written in, and a MiB for the receiver's
/// checkpoints and the directories.
fn space_needed(size: u64) -> u64 {
    let one = size
        .checked_next_multiple_of(ALIGN as u64)
        .unwrap_or(u64::MAX);
    one.saturating_mul(2).saturating_add(1 << 20)
}

/// Refuses a demo whose files would not fit in `dir` (or, when it does not
/// exist yet, the nearest directory above it that does): `--size 1TiB`
/// used to write until the disk was full.
fn check_space(dir: &Path, size: u64) -> Result<()> {
    let existing = dir
        .ancestors()
        .map(|a| {
            if a.as_os_str().is_empty() {
                Path::new(".")
            } else {
                a
            }
        })
        .find(|a| a.exists())
        .unwrap_or(Path::new("/"));
    let st = rustix::fs::statvfs(existing).map_err(|e| {
        Error::io(
            format!("reading the free space of {}", existing.display()),
            e.into(),
        )
    })?;
    let free = st.f_bavail.saturating_mul(st.f_frsize);
    let need = space_needed(size);
    if need > free {
        return Err(Error::Config(format!(
            "the demo needs {} free in {} (the {} file it generates and a copy of it), but only {} is free there: \
             pass a smaller --size, or --dir a directory on a disk with room",
            fmt_bytes(need),
            existing.display(),
            fmt_bytes(size),
            fmt_bytes(free)
        )));
    }
    Ok(())
}

/// The demo's directory while it exists, for `clean_up_on_signals`.
static SCRATCH: Mutex<Option<Scratch>> = Mutex::new(None);

struct Scratch {
    dir: PathBuf,
    keep: bool,
}

fn scratch() -> MutexGuard<'static, Option<Scratch>> {
    SCRATCH.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Forgets the demo's directory when dropped: past that, a signal has
/// nothing to remove (the `TempDir` does it, or `--keep` kept it).
struct Registered;

impl Drop for Registered {
    fn drop(&mut self) {
        *scratch() = None;
    }
}

/// Makes the demo's directory in `cfg.dir`, known to the signal handler
/// from the moment it exists (the lock is held across both, so a signal
/// in between waits for it).
fn make_scratch(cfg: &DemoConfig) -> Result<(tempfile::TempDir, Registered)> {
    let mut slot = scratch();
    let tmp = tempfile::Builder::new()
        .prefix("wirerate-demo-")
        .tempdir_in(&cfg.dir)
        .map_err(|e| Error::io(format!("creating a directory in {}", cfg.dir.display()), e))?;
    *slot = Some(Scratch {
        dir: tmp.path().to_path_buf(),
        keep: cfg.keep,
    });
    Ok((tmp, Registered))
}

/// Removes the demo's directory (unless `--keep`) when SIGINT or SIGTERM
/// arrives, then exits with the status a shell gives a process the signal
/// ended, 128 + its number (130, 143). Without it, an interrupted demo
/// left its generated file and copies behind (2.1 GB of a 2 GiB demo).
pub fn clean_up_on_signals() -> Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])
        .map_err(|e| Error::io("setting up the SIGINT and SIGTERM handlers", e))?;
    std::thread::Builder::new()
        .name("demo-signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                SIGNALLED.store(true, std::sync::atomic::Ordering::SeqCst);
                remove_scratch();
                std::process::exit(128 + sig);
            }
        })
        .map_err(|e| Error::io("starting the signal thread", e))?;
    Ok(())
}

/// Set once SIGINT or SIGTERM arrived: the signal thread is removing the
/// directory and will exit with the signal's status.
static SIGNALLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Once a signal arrived, the demo's own work fails as its files vanish;
/// its error must not end the process first, with its own status and the
/// files half removed (seen as "1 of 1 files failed", exit 2, under
/// SIGTERM). The signal thread ends the process.
fn wait_if_signalled() {
    while SIGNALLED.load(std::sync::atomic::Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn remove_scratch() {
    let Some(s) = scratch().take() else { return };
    if s.keep {
        eprintln!("\ninterrupted: kept {} (--keep)", s.dir.display());
        return;
    }
    eprintln!("\ninterrupted: removing {}", s.dir.display());
    // The demo's threads go on writing meanwhile and may create a file in
    // it between the removal's listing and its rmdir; once the directory
    // is gone they cannot, so a few tries are enough.
    for _ in 0..20 {
        match std::fs::remove_dir_all(&s.dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                std::thread::sleep(Duration::from_millis(50));
            }
            _ => return,
        }
    }
    eprintln!("could not remove {}: remove it by hand", s.dir.display());
}

/// Runs the demo.
pub fn run(cfg: &DemoConfig) -> Result<DemoReport> {
    let outcome = run_once(cfg);
    if outcome.is_err() {
        wait_if_signalled();
    }
    outcome
}

fn run_once(cfg: &DemoConfig) -> Result<DemoReport> {
    if cfg.size == 0 {
        return Err(Error::Config(
            "--size must be at least 1 byte (the demo moves a file of that size)".into(),
        ));
    }
    cfg.send.validate()?;
    check_space(&cfg.dir, cfg.size)?;
    std::fs::create_dir_all(&cfg.dir)
        .map_err(|e| Error::io(format!("creating {}", cfg.dir.display()), e))?;
    let (tmp, registered) = make_scratch(cfg)?;
    let base = tmp.path().to_path_buf();
    let src_dir = base.join("src");
    let dst_dir = base.join("dst");
    for d in [&src_dir, &dst_dir] {
        std::fs::create_dir(d).map_err(|e| Error::io(format!("creating {}", d.display()), e))?;
    }
    if let Ok(f) = File::open(&base) {
        if on_tmpfs(&f) {
            eprintln!(
                "note: {} is on tmpfs: O_DIRECT is ignored there and the figures measure memory, not disk; pass --dir on a real disk",
                base.display()
            );
        }
    }
    let src = src_dir.join("demo.bin");
    eprintln!(
        "generating {} of random data in {} ...",
        fmt_bytes(cfg.size),
        base.display()
    );
    let disk_write_gbs = generate(
        &src,
        cfg.size,
        u64::from_le_bytes(wirerate_engine::net::auth::random::<8>()),
    )?;
    let disk_read_gbs = disk_pass(
        &src,
        None,
        cfg.send.block_size as usize,
        cfg.send.queue_depth,
    )?;
    eprintln!("measuring a local copy on this disk (no network) ...");
    let disk_copy_gbs = disk_pass(
        &src,
        Some(&base.join("copy.bin")),
        cfg.send.block_size as usize,
        cfg.send.queue_depth,
    )?;

    let token = wirerate_engine::net::auth::random::<32>().to_vec();
    let mut scfg = ServeConfig::new(dst_dir.clone(), token.clone());
    scfg.encrypt = cfg.send.encrypt;
    scfg.observer = Shown::metrics().observe();
    scfg.queue_depth = cfg.send.queue_depth;
    scfg.buffer = cfg.send.buffer;
    let mut runs = Vec::new();
    for &mode in &cfg.modes {
        scfg.io_mode = mode;
        let server = Server::bind("127.0.0.1:0", scfg.clone())?.spawn();
        let mut send_cfg = cfg.send.clone();
        send_cfg.to = server.addr().to_string();
        send_cfg.token = token.clone();
        send_cfg.source = src.clone();
        send_cfg.dest = "demo.bin".into();
        send_cfg.io_mode = mode;
        send_cfg.retry_for = Duration::ZERO;
        let progress = watch_send(&mut send_cfg);
        let renderer = Renderer::start(Arc::clone(&progress), &format!("{mode:>8}"), cfg.quiet);
        let result = send(&send_cfg);
        renderer.finish();
        let sender = result?;
        // `send` returns only after the receiver closed the session and
        // recorded its summary.
        let receiver = server.summaries().pop();
        server.stop();
        if !sender.ok {
            return Err(Error::Incomplete {
                failed: sender.files - sender.files_ok,
                files: sender.files,
                summary: sender.render(),
            });
        }
        let _ = std::fs::remove_file(dst_dir.join("demo.bin"));
        drop_cache(&src);
        runs.push(DemoRun { sender, receiver });
    }
    let report = DemoReport {
        dir: base.display().to_string(),
        size: cfg.size,
        disk_write_gbs,
        disk_read_gbs,
        disk_copy_gbs,
        runs,
    };
    drop(registered);
    if cfg.keep {
        let kept = tmp.keep();
        eprintln!("kept {}", kept.display());
    }
    Ok(report)
}

impl DemoReport {
    /// The human-readable report.
    pub fn render(&self) -> String {
        let mut s = String::new();
        for r in &self.runs {
            s.push_str(&r.sender.render());
            if let Some(rx) = &r.receiver {
                s.push_str(&format!(
                    "  receiver   {} written, io {}{}, {} streams joined\n",
                    fmt_bytes(rx.bytes_written),
                    rx.io.io_mode,
                    rx.io
                        .io_fallback
                        .as_deref()
                        .map(|f| format!(" ({f})"))
                        .unwrap_or_default(),
                    rx.streams
                ));
            }
            s.push('\n');
        }
        s.push_str(&format!(
            "this disk alone (O_DIRECT): write {:.2} GB/s, read {:.2} GB/s, local copy (read and write at once) {:.2} GB/s\n",
            self.disk_write_gbs, self.disk_read_gbs, self.disk_copy_gbs
        ));
        s.push_str("mode       Gbit/s   GB/s   % of the local copy\n");
        for r in &self.runs {
            let gbs = r.sender.gbps / 8.0;
            s.push_str(&format!(
                "{:<9} {:>7.2} {:>6.2}   {:>5.0}%\n",
                r.sender.io.io_mode.to_string(),
                r.sender.gbps,
                gbs,
                gbs / self.disk_copy_gbs * 100.0
            ));
        }
        s.push_str(
            "(source and destination share this disk, so a local copy is the ceiling: the transfer reads, sends\n over loopback TCP, checksums, writes and syncs the same bytes)\n",
        );
        s
    }
}
