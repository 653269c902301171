//! Every frame checked: a proxy that understands the framing damages one
//! frame of a chosen type on its way (a file list, a plan, an
//! acknowledgement, a block header), and the transfer must still land
//! byte-identical under the name and mode the sender meant, or fail, but
//! never publish wrong and never hang.
//!
//! Before frames carried checksums, one flipped bit in the file list landed
//! `xfile` as `yfile` and the sender printed "verified"; one in a resume
//! plan hung the session for ever; one in an acknowledgement or a block
//! header ended the transfer at once, ignoring `--retry-for`.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use crate::common::{TOKEN, assert_same, scratch, write_file};
use proptest::prelude::*;
use wirerate_engine::compress::{PIECE, PREFIX_LEN, Piece, PieceAt};
use wirerate_engine::digest::frame_checksum;
use wirerate_engine::receiver::{ServeConfig, Server, ServerHandle};
use wirerate_engine::sender::{SendConfig, send};
use wirerate_engine::summary::SendSummary;
use wirerate_engine::wire::FRAME_CHECK_LEN;

const T_FILES: u8 = 6;
const T_PLAN_RUN: u8 = 29;
const T_BLOCK: u8 = 10;
const T_PACKED_BLOCK: u8 = 30;
const T_ACK: u8 = 11;
const BS: usize = 64 << 10;

/// One frame to damage, once in the whole run.
#[derive(Debug, Clone, Copy)]
struct Damage {
    /// Sender to receiver (else the other way).
    upstream: bool,
    /// The frame's type byte (`None`: any frame).
    ty: Option<u8>,
    /// How many such frames to let through first.
    skip: usize,
    /// Which byte of its body (type byte at 0) to flip, modulo its length.
    at: usize,
    /// The bits flipped.
    mask: u8,
    /// Recompute the frame's checksum after the flip: a peer that means
    /// what it says (a receiver whose plan is wrong), not a damaged path.
    reseal: bool,
}

impl Damage {
    /// Flips `mask` in byte `at` of the first frame of type `ty` going
    /// `upstream` (or the other way).
    fn first(upstream: bool, ty: u8, at: usize, mask: u8) -> Self {
        Self {
            upstream,
            ty: Some(ty),
            skip: 0,
            at,
            mask,
            reseal: false,
        }
    }
}

/// A TCP proxy that reads frames and damages the first one `Damage` names.
struct FlipProxy {
    addr: SocketAddr,
    /// Frames that matched `Damage` so far; it fired if over `skip`.
    fired: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl FlipProxy {
    fn start(target: SocketAddr, damage: Damage) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let fired = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (f, s) = (fired.clone(), stop.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                let Ok(upstream) = TcpStream::connect(target) else {
                    continue;
                };
                let (c2, u2) = (client.try_clone().unwrap(), upstream.try_clone().unwrap());
                let (f1, f2) = (f.clone(), f.clone());
                std::thread::spawn(move || pump(client, upstream, true, damage, &f1));
                std::thread::spawn(move || pump(u2, c2, false, damage, &f2));
            }
        });
        Self { addr, fired, stop }
    }

    fn fired(&self, damage: &Damage) -> bool {
        self.fired.load(Ordering::SeqCst) > damage.skip
    }
}

impl Drop for FlipProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

/// Copies frames from `from` to `to`, damaging the one `damage` names if
/// it goes this way and has not fired yet. A block header's payload and
/// checksum follow it unframed, and are copied as they are; so are a
/// packed block's pieces, each behind its prefix.
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    upstream: bool,
    damage: Damage,
    fired: &AtomicUsize,
) {
    let mut relay = || -> std::io::Result<()> {
        loop {
            let mut prefix = [0u8; 4];
            from.read_exact(&mut prefix)?;
            let mut body = vec![0u8; u32::from_le_bytes(prefix) as usize];
            from.read_exact(&mut body)?;
            let ty = body.first().copied();
            if damage.upstream == upstream
                && !body.is_empty()
                && damage.ty.is_none_or(|t| ty == Some(t))
                && fired.fetch_add(1, Ordering::SeqCst) == damage.skip
            {
                let at = damage.at % body.len();
                body[at] ^= damage.mask;
                if damage.reseal {
                    let n = body.len() - FRAME_CHECK_LEN;
                    let check = frame_checksum(&body[..n]);
                    body[n..].copy_from_slice(&check.to_le_bytes());
                }
            }
            to.write_all(&prefix)?;
            to.write_all(&body)?;
            if !upstream || body.len() < 25 {
                continue;
            }
            let len = u32::from_le_bytes(body[21..25].try_into().unwrap()) as u64;
            let whole = match ty {
                Some(T_BLOCK) => copy_exactly(&mut from, &mut to, len)?,
                Some(T_PACKED_BLOCK) => copy_pieces(&mut from, &mut to, &body, len)?,
                _ => continue,
            };
            if !whole || !copy_exactly(&mut from, &mut to, 8)? {
                return Ok(());
            }
        }
    };
    let _ = relay();
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

/// Copies `n` bytes from `from` to `to`; false if `from` ended first.
fn copy_exactly(from: &mut TcpStream, to: &mut TcpStream, n: u64) -> std::io::Result<bool> {
    Ok(std::io::copy(&mut from.take(n), to)? == n)
}

/// Copies the pieces of the packed block whose header is `body`, of `len`
/// plain bytes: each piece's prefix, then the bytes it announces; false
/// if `from` ended, or a prefix was not what the sender would write.
fn copy_pieces(
    from: &mut TcpStream,
    to: &mut TcpStream,
    body: &[u8],
    len: u64,
) -> std::io::Result<bool> {
    let file_id = u32::from_le_bytes(body[1..5].try_into().unwrap());
    let block = u64::from_le_bytes(body[5..13].try_into().unwrap());
    for (index, at) in (0u32..).zip((0..len).step_by(PIECE)) {
        let mut prefix = [0u8; PREFIX_LEN];
        from.read_exact(&mut prefix)?;
        to.write_all(&prefix)?;
        let plain = (len - at).min(PIECE as u64);
        let n = match Piece::of_prefix(
            prefix,
            plain as usize,
            PieceAt {
                file_id,
                block,
                index,
            },
        ) {
            Some(Piece::Stored) => plain,
            Some(Piece::Packed(n)) => u64::from(n),
            None => return Ok(false),
        };
        if !copy_exactly(from, to, n)? {
            return Ok(false);
        }
    }
    Ok(true)
}

fn receiver(root: &std::path::Path, idle_timeout: Duration) -> ServerHandle {
    let mut cfg = ServeConfig::new(root.to_path_buf(), TOKEN.to_vec());
    cfg.buffer = 8 << 20;
    cfg.checkpoint_interval = Duration::from_millis(100);
    cfg.idle_timeout = idle_timeout;
    cfg.umask = 0o022;
    Server::bind("127.0.0.1:0", cfg).unwrap().spawn()
}

/// Sends `cfg` on a thread and waits for it at most `limit`: `None` if
/// it hung, so that a session that hangs fails the test instead of the
/// test run.
fn send_within(cfg: SendConfig, limit: Duration) -> Option<wirerate_engine::Result<SendSummary>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(send(&cfg));
    });
    rx.recv_timeout(limit).ok()
}

/// One file `xfile` (mode 0644, 16 blocks) of `seed`, a receiver with
/// `idle_timeout`, and a sender retrying for `retry_for` through a proxy
/// that does `damage`.
struct Scene {
    _dir: tempfile::TempDir,
    src: std::path::PathBuf,
    root: std::path::PathBuf,
    srv: ServerHandle,
    proxy: FlipProxy,
    cfg: SendConfig,
}

impl Scene {
    fn new(
        name: &str,
        seed: u64,
        damage: Damage,
        idle_timeout: Duration,
        retry_for: Duration,
    ) -> Self {
        let dir = scratch(name);
        let src = dir.path().join("src/xfile");
        write_file(&src, 16 * BS, seed);
        std::fs::set_permissions(&src, std::fs::Permissions::from_mode(0o644)).unwrap();
        let root = dir.path().join("dst");
        std::fs::create_dir_all(&root).unwrap();
        let srv = receiver(&root, idle_timeout);
        let proxy = FlipProxy::start(srv.addr(), damage);
        let mut cfg = SendConfig::new(proxy.addr.to_string(), TOKEN.to_vec(), &src, "xfile");
        cfg.block_size = BS as u64;
        cfg.buffer = 4 << 20;
        cfg.streams = 2;
        cfg.retry_for = retry_for;
        Self {
            _dir: dir,
            src,
            root,
            srv,
            proxy,
            cfg,
        }
    }
}

/// `Scene` sent once: it must land right, after what retries it takes.
fn run(name: &str, damage: Damage, idle_timeout: Duration) -> SendSummary {
    let Scene {
        _dir,
        src,
        root,
        srv,
        proxy,
        cfg,
    } = Scene::new(name, 41, damage, idle_timeout, Duration::from_secs(60));
    let summary = match send_within(cfg, Duration::from_secs(90)) {
        Some(r) => r.unwrap_or_else(|e| panic!("the send failed: {e}")),
        None => panic!("the send hung for 90 s"),
    };
    assert!(
        proxy.fired(&damage),
        "the proxy never met a frame to damage"
    );
    assert!(summary.ok, "{}", summary.render());
    assert_same(&src, &root.join("xfile"));
    let names: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["xfile"], "published under another name too");
    let mode = std::fs::metadata(root.join("xfile"))
        .unwrap()
        .permissions()
        .mode()
        & 0o7777;
    assert_eq!(mode, 0o644, "published with another mode");
    drop(srv);
    summary
}

// Body offsets in a `Files` frame: type, count, then the first entry's id,
// kind, size, fingerprint, mode (u16) and path (u16 length, bytes).
const FIRST_MODE: usize = 1 + 4 + 4 + 1 + 8 + 8;
const FIRST_PATH: usize = FIRST_MODE + 2 + 2;

#[test]
fn a_damaged_file_name_is_never_published() {
    let damage = Damage::first(true, T_FILES, FIRST_PATH, 0x01);
    let summary = run("flip-name", damage, Duration::from_secs(30));
    assert!(summary.sessions >= 2, "the damaged session was not redone");
}

#[test]
fn a_damaged_mode_is_never_published() {
    let damage = Damage::first(true, T_FILES, FIRST_MODE, 0x01);
    run("flip-mode", damage, Duration::from_secs(30));
}

// A file sent afresh is planned in a run (protocol 12): type, first file,
// count. The one file here is file 0, in a run of 1.
const RUN_FIRST: usize = 1;
const RUN_COUNT: usize = 1 + 4;

#[test]
fn a_damaged_plan_is_redone_not_hung() {
    // A run of 0 files, caught by the frame's check.
    let damage = Damage::first(false, T_PLAN_RUN, RUN_COUNT, 0x01);
    let summary = run("flip-plan", damage, Duration::from_secs(30));
    assert!(summary.sessions >= 2, "{}", summary.render());
}

// The same kind of damage with a valid checksum: what a receiver whose
// own bookkeeping is wrong would send, a plan for file 1 where file 0 was
// offered. The sender refuses it as a plan for a file not offered, and
// the session is redone. (A plan that wrongly says a block is held can
// only come in a resumed file's `Plan` entry; the receiver's progress
// timeout ends that session: `session::reports`' tests.)
#[test]
fn a_wrong_plan_is_refused_and_redone() {
    let damage = Damage {
        reseal: true,
        ..Damage::first(false, T_PLAN_RUN, RUN_FIRST, 0x01)
    };
    let t0 = Instant::now();
    let summary = run("wrong-plan", damage, Duration::from_secs(10));
    let took = t0.elapsed();
    assert!(summary.sessions >= 2, "{}", summary.render());
    eprintln!("a wrong plan became a retry and landed in {took:?}");
}

#[test]
fn a_damaged_acknowledgement_is_redone_not_fatal() {
    // The file id's high byte: "acknowledgement for unknown file
    // 4278190080" ended the transfer.
    let damage = Damage::first(false, T_ACK, 4, 0xff);
    run("flip-ack", damage, Duration::from_secs(30));
}

#[test]
fn a_damaged_block_header_is_redone_not_fatal() {
    // The block index's low byte.
    let damage = Damage::first(true, T_BLOCK, 1 + 4, 0x01);
    run("flip-header", damage, Duration::from_secs(30));
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("WIRERATE_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(12),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// One bit flipped anywhere in a valid session, in any frame either
    /// way (block payloads aside, which their own checksums cover): the
    /// transfer lands identical after a retry, or fails and says so; it
    /// never hangs and never publishes anything wrong.
    #[test]
    fn one_flipped_bit_anywhere_is_retried_or_refused_never_published(
        upstream in any::<bool>(),
        skip in 0usize..24,
        at in 0usize..256,
        bit in 0u8..8,
    ) {
        let damage = Damage { upstream, ty: None, skip, at, mask: 1 << bit, reseal: false };
        let Scene { _dir, src, root, srv: _srv, proxy: _proxy, cfg } =
            Scene::new("flip-any", 43, damage, Duration::from_secs(30), Duration::from_secs(20));
        let outcome = send_within(cfg, Duration::from_secs(90));
        prop_assert!(outcome.is_some(), "hung with {:?}", damage);
        let landed = root.join("xfile");
        match outcome.unwrap() {
            Ok(summary) if summary.ok => {
                assert_same(&src, &landed);
                let mode = std::fs::metadata(&landed).unwrap().permissions().mode() & 0o7777;
                prop_assert_eq!(mode, 0o644);
            }
            // Failed, and said so: whatever is at the destination is not
            // a file published wrong.
            _ => prop_assert!(!landed.exists() || std::fs::read(&landed).unwrap() == std::fs::read(&src).unwrap()),
        }
        for e in std::fs::read_dir(&root).unwrap() {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            prop_assert!(name == "xfile" || name.starts_with(".xfile"), "published as {} with {:?}", name, damage);
        }
    }
}
