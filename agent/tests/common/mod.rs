//! Helpers shared by the integration tests: scratch directories on the real
//! disk, random files, receivers, and a TCP relay that injects faults.
#![allow(dead_code, unreachable_pub)]

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use wirerate_engine::io::IoMode;
use wirerate_engine::receiver::{ServeConfig, Server, ServerHandle};
use wirerate_engine::sender::SendConfig;

pub const TOKEN: &[u8] = b"test-token-0123456789abcdef";

/// A scratch directory under target/ (a real disk: O_DIRECT is real there).
pub fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("{name}-"))
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("scratch dir")
}

/// Deterministic pseudo-random bytes.
pub fn bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        v.extend_from_slice(&s.to_le_bytes());
    }
    v.truncate(len);
    v
}

pub fn write_file(path: &Path, len: usize, seed: u64) -> Vec<u8> {
    let data = bytes(len, seed);
    if let Some(p) = path.parent() {
        std::fs::create_dir_all(p).unwrap();
    }
    std::fs::write(path, &data).unwrap();
    data
}

/// Asserts `b` has exactly the bytes of `a`.
pub fn assert_same(a: &Path, b: &Path) {
    let x = std::fs::read(a).unwrap_or_else(|e| panic!("reading {}: {e}", a.display()));
    let y = std::fs::read(b).unwrap_or_else(|e| panic!("reading {}: {e}", b.display()));
    assert_eq!(
        x.len(),
        y.len(),
        "{} and {} differ in length",
        a.display(),
        b.display()
    );
    assert!(
        x == y,
        "{} and {} differ in content",
        a.display(),
        b.display()
    );
}

/// Asserts no temporary or checkpoint file is left anywhere under `dir`.
pub fn assert_no_leftovers(dir: &Path) {
    for e in walk(dir) {
        let n = e.file_name().unwrap().to_string_lossy().to_string();
        assert!(
            !n.contains(".wirerate-part")
                && !n.contains(".wirerate-ckpt")
                && !n.contains(".wirerate-pieces")
                && !n.contains(".wirerate-stripe"),
            "leftover {}",
            e.display()
        );
    }
}

pub fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                stack.push(p.clone());
            }
            out.push(p);
        }
    }
    out.sort();
    out
}

pub fn server(root: &Path, mode: IoMode) -> ServerHandle {
    bind_server(root, mode, "127.0.0.1:0")
}

/// A receiver at `addr` (a stopped one's, say), in async mode.
pub fn server_at(root: &Path, addr: SocketAddr) -> ServerHandle {
    bind_server(root, IoMode::Async, &addr.to_string())
}

fn bind_server(root: &Path, mode: IoMode, addr: &str) -> ServerHandle {
    server_with(root, addr, |c| c.io_mode = mode)
}

/// A receiver as `server` makes one, at `addr`, changed by `tweak`.
pub fn server_with(root: &Path, addr: &str, tweak: impl FnOnce(&mut ServeConfig)) -> ServerHandle {
    let mut cfg = ServeConfig::new(root.to_path_buf(), TOKEN.to_vec());
    cfg.buffer = 8 << 20;
    cfg.checkpoint_interval = Duration::from_millis(100);
    // A join for a session nobody opens is refused after this.
    cfg.join_wait = Duration::from_secs(1);
    tweak(&mut cfg);
    Server::bind(addr, cfg).expect("bind").spawn()
}

/// The receiver's session summaries once `n` have been recorded (the last
/// lands just after the sender's final result).
pub fn wait_summaries(
    srv: &ServerHandle,
    n: usize,
) -> Vec<wirerate_engine::summary::ReceiverSummary> {
    // Patient: a loaded machine may take seconds to end a session.
    for _ in 0..2000 {
        let s = srv.summaries();
        if s.len() >= n {
            return s;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    srv.summaries()
}

pub fn send_cfg(to: SocketAddr, src: &Path, dest: &str) -> SendConfig {
    let mut c = SendConfig::new(to.to_string(), TOKEN.to_vec(), src, dest);
    c.block_size = 64 << 10;
    c.buffer = 4 << 20;
    c.retry_for = Duration::ZERO;
    c
}

/// True when running as root; otherwise says loudly why the test is
/// skipped, and fails under CI, which runs as root and must not skip.
pub fn require_root(what: &str) -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    if std::env::var_os("CI").is_some() {
        panic!("{what} needs root, and CI runs as root: refusing to skip");
    }
    eprintln!("SKIPPED: {what} needs root (run the tests as root to include it)");
    false
}

/// A fault for the relay to inject into the client-to-server direction of
/// connection `conn`: 0 is the control connection, n the data stream with
/// index n - 1. The relay tells them apart by the purpose in the client's
/// handshake, since a sender connects them all at once.
#[derive(Debug, Clone, Copy)]
pub enum Fault {
    /// Close the connection after this many bytes.
    CutAfter { conn: usize, bytes: u64 },
    /// Flip one bit of the byte at this offset.
    FlipByte { conn: usize, at: u64 },
}

/// A TCP relay between a sender and a receiver.
pub struct Relay {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    pub fired: Arc<AtomicUsize>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
}

impl Relay {
    pub fn start(target: SocketAddr, faults: Vec<Fault>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let fired = Arc::new(AtomicUsize::new(0));
        let conns = Arc::new(Mutex::new(Vec::new()));
        let (s, f, c) = (stop.clone(), fired.clone(), conns.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                let Ok(upstream) = TcpStream::connect(target) else {
                    continue;
                };
                c.lock().unwrap().push(client.try_clone().unwrap());
                c.lock().unwrap().push(upstream.try_clone().unwrap());
                let (c2, u2) = (client.try_clone().unwrap(), upstream.try_clone().unwrap());
                let fired = f.clone();
                let faults = faults.clone();
                std::thread::spawn(move || pump(client, upstream, faults, fired));
                std::thread::spawn(move || pump(u2, c2, Vec::new(), Arc::new(AtomicUsize::new(0))));
            }
        });
        Self {
            addr,
            stop,
            fired,
            conns,
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
        for c in self.conns.lock().unwrap().iter() {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}

/// Which connection a client's first bytes open: 0 for control, n for data
/// stream n - 1; `None` until the handshake's purpose has arrived. The
/// auth frame follows the hello; its purpose byte follows its 4-byte
/// length, type byte and 32-byte MAC, then the 16-byte session id and the
/// little-endian stream index.
fn conn_of(head: &[u8]) -> Option<usize> {
    let mut hello = Vec::new();
    wirerate_engine::wire::encode(
        &wirerate_engine::wire::Frame::Hello {
            version: wirerate_engine::wire::VERSION,
            nonce: [0; 32],
            port: 0,
            encrypt: wirerate_engine::encryption::Encryption::None,
        },
        &mut hello,
    );
    let purpose = hello.len() + 4 + 1 + 32;
    match head.get(purpose)? {
        0 => Some(0),
        _ => {
            let i = head.get(purpose + 17..purpose + 19)?;
            Some(usize::from(u16::from_le_bytes([i[0], i[1]])) + 1)
        }
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream, all: Vec<Fault>, fired: Arc<AtomicUsize>) {
    let mut buf = vec![0u8; 64 << 10];
    let mut pos = 0u64;
    let mut head = Vec::new();
    let mut faults: Vec<Fault> = Vec::new();
    let mut known = all.is_empty();
    let mut done = Vec::new();
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if !known {
            head.extend_from_slice(&buf[..n.min(128)]);
            if let Some(idx) = conn_of(&head) {
                known = true;
                faults = all
                    .iter()
                    .copied()
                    .filter(|x| match x {
                        Fault::CutAfter { conn, .. } | Fault::FlipByte { conn, .. } => *conn == idx,
                    })
                    .collect();
                done = vec![false; faults.len()];
            }
        }
        let chunk = &mut buf[..n];
        let mut cut_at = None;
        for (i, f) in faults.iter().enumerate() {
            if done[i] {
                continue;
            }
            match *f {
                Fault::FlipByte { at, .. } if at >= pos && at < pos + n as u64 => {
                    chunk[(at - pos) as usize] ^= 0x01;
                    done[i] = true;
                    fired.fetch_add(1, Ordering::SeqCst);
                }
                Fault::CutAfter { bytes, .. } if bytes < pos + n as u64 => {
                    cut_at = Some((bytes.saturating_sub(pos)) as usize);
                    done[i] = true;
                    fired.fetch_add(1, Ordering::SeqCst);
                }
                _ => {}
            }
        }
        if let Some(k) = cut_at {
            let _ = to.write_all(&chunk[..k]);
            break;
        }
        if to.write_all(chunk).is_err() {
            break;
        }
        pos += n as u64;
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

/// Kills the child process on drop, so a failing test leaves nothing running.
pub struct Proc(pub std::process::Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A source file, an empty destination root and a token file in one scratch directory.
pub struct Setup {
    _dir: tempfile::TempDir,
    pub src: PathBuf,
    pub root: PathBuf,
    pub token: PathBuf,
    pub size: u64,
}

/// Runs `wirerate-agent send --to to` of `src` as `dest`, with `flags`
/// and the token file `token`; returns what it printed and its status.
pub fn send_bin(
    to: &str,
    flags: &[&str],
    token: &Path,
    src: &Path,
    dest: &str,
) -> std::process::Output {
    std::process::Command::new(BIN)
        .args(["send", "--to", to])
        .args(flags)
        .arg("--token-file")
        .arg(token)
        .arg(src)
        .arg(dest)
        .output()
        .unwrap()
}

/// Sets `path`'s modification time (a file's or a directory's).
pub fn set_mtime(path: &Path, at: std::time::SystemTime) {
    let f = match path.is_dir() {
        true => std::fs::File::open(path).unwrap(),
        false => std::fs::File::options().write(true).open(path).unwrap(),
    };
    f.set_modified(at).unwrap();
}

/// Runs `wirerate-agent send --quiet` of `s.src` to `to` as `dest`, with
/// `extra` flags, and asserts that it succeeded.
pub fn send_bin_ok(to: &str, s: &Setup, dest: &str, extra: &[&str]) {
    let flags: Vec<&str> = ["--quiet"]
        .into_iter()
        .chain(extra.iter().copied())
        .collect();
    let out = send_bin(to, &flags, &s.token, &s.src, dest);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn setup(name: &str, size: usize) -> Setup {
    let dir = scratch(name);
    let src = dir.path().join("src.bin");
    write_file(&src, size, 11);
    let root = dir.path().join("dst");
    std::fs::create_dir_all(&root).unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret-token-for-tests\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    Setup {
        src,
        root,
        token,
        size: size as u64,
        _dir: dir,
    }
}

/// A port nothing listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A field of /proc/PID/status in KiB (VmRSS, VmHWM, ...).
pub fn proc_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} missing in /proc/{pid}/status"))
}

/// A TCP connection to `to` from the loopback address `from` (127.0.0.x),
/// so that tests can play several hosts.
pub fn connect_from(from: [u8; 4], to: SocketAddr) -> TcpStream {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    s.bind(&SocketAddr::from((from, 0)).into()).unwrap();
    s.connect(&to.into()).unwrap();
    s.into()
}

/// The agent binary.
pub const BIN: &str = env!("CARGO_BIN_EXE_wirerate-agent");

/// Starts `wirerate-agent serve` on 127.0.0.1:`port` with `extra`
/// arguments, and waits until it listens.
pub fn serve_bin(root: &Path, token: &Path, port: u16, extra: &[&str]) -> Proc {
    let child = std::process::Command::new(BIN)
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--checkpoint-interval",
            "0.1",
            "--json",
        ])
        .args(extra)
        .arg("--root")
        .arg(root)
        .arg("--token-file")
        .arg(token)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_listening(port);
    Proc(child)
}

/// Lets this test process hold thousands of sockets: tests that open
/// floods of connections run side by side, and a default soft limit of
/// 1,024 descriptors would fail them for the wrong reason. The soft limit
/// goes to the hard one, as the agent's own `serve` does.
pub fn raise_fd_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut l = getrlimit(Resource::Nofile);
    l.current = l.maximum;
    setrlimit(Resource::Nofile, l).expect("raising the open-file soft limit to the hard one");
}

/// Waits until `path` exists and holds something (`limit` at most), or
/// fails saying `what` did not happen.
pub fn wait_written(path: &Path, limit: Duration, what: &str) {
    let t0 = std::time::Instant::now();
    while std::fs::metadata(path).map_or(0, |m| m.len()) == 0 {
        assert!(t0.elapsed() < limit, "{what}: {}", path.display());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits until a receiver listens on `port` (10 s at most).
pub fn wait_listening(port: u16) {
    let t0 = std::time::Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "receiver did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
