//! What the sender reads and what the receiver publishes: a source that
//! changes while it is sent, a file swapped for a symlink after the scan,
//! permission bits, and file names near the filesystem's limit. Real
//! files, real sockets, paced transfers so the change lands mid-way.

use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use wirerate_agent::observer::watch_send;
use wirerate_agent::progress::Progress;
use wirerate_engine::io::IoMode;
use wirerate_engine::receiver::{ServeConfig, Server};
use wirerate_engine::sender::{SendConfig, send};
use wirerate_engine::summary::SendSummary;

const BS: u64 = 256 << 10;

/// A send of `cfg` running on its own thread, with its progress.
struct Running {
    progress: Arc<Progress>,
    thread: std::thread::JoinHandle<wirerate_engine::Result<SendSummary>>,
}

fn start(mut cfg: SendConfig) -> Running {
    let progress = watch_send(&mut cfg);
    Running {
        progress,
        thread: std::thread::spawn(move || send(&cfg)),
    }
}

impl Running {
    /// Waits until at least `bytes` are acknowledged (the scan is long
    /// done by then), and checks the transfer is not over yet.
    fn wait_for(&self, bytes: u64) {
        let t0 = Instant::now();
        while self.progress.position().done < bytes {
            assert!(!self.thread.is_finished(), "the send ended early");
            assert!(t0.elapsed() < Duration::from_secs(30), "no progress");
            std::thread::sleep(Duration::from_millis(5));
        }
        let total = self.progress.position().total;
        assert!(
            self.progress.position().done < total / 2,
            "the change must land mid-transfer"
        );
    }

    fn finish(self) -> SendSummary {
        self.thread.join().unwrap().unwrap()
    }
}

/// A paced send: 16 MiB at 8 MB/s takes about 2 s, and the reader runs at
/// most a 2 MiB buffer ahead of what is acknowledged.
fn paced(to: std::net::SocketAddr, src: &Path, dest: &str) -> SendConfig {
    let mut c = send_cfg(to, src, dest);
    c.block_size = BS;
    c.buffer = 2 << 20;
    c.streams = 2;
    c.max_rate = Some(8_000_000);
    c
}

fn failure<'a>(s: &'a SendSummary, path: &str) -> &'a str {
    s.failures
        .iter()
        .find(|f| f.path == path)
        .map(|f| f.message.as_str())
        .unwrap_or_else(|| panic!("{path} did not fail: {}", s.render()))
}

#[test]
fn source_overwritten_in_place_while_sent_is_not_published() {
    let dir = scratch("overwrite");
    let src = dir.path().join("src.bin");
    write_file(&src, 16 << 20, 1);
    let root = dir.path().join("dst");
    std::fs::create_dir_all(&root).unwrap();
    let srv = server(&root, IoMode::Async);
    let run = start(paced(srv.addr(), &src, "out.bin"));
    run.wait_for(2 << 20);
    // Rewritten in place, as a careless instrument would: same size.
    let mut f = std::fs::OpenOptions::new().write(true).open(&src).unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.write_all(&bytes(1 << 20, 99)).unwrap();
    drop(f);
    let s = run.finish();
    assert!(!s.ok, "a source that changed must not pass: {}", s.render());
    let msg = failure(&s, "out.bin");
    assert!(msg.contains("modified while it was being sent"), "{msg}");
    assert!(msg.contains("not published"), "{msg}");
    assert!(
        !root.join("out.bin").exists(),
        "nothing under the final name"
    );
    let rx = wait_summaries(&srv, 1);
    assert_eq!(rx[0].files_failed, 1, "{:?}", rx[0]);
    assert_no_leftovers(&root);
}

#[test]
fn source_appended_while_sent_is_not_published() {
    let dir = scratch("append");
    let src = dir.path().join("src.bin");
    write_file(&src, 16 << 20, 2);
    let root = dir.path().join("dst");
    std::fs::create_dir_all(&root).unwrap();
    let srv = server(&root, IoMode::Async);
    let run = start(paced(srv.addr(), &src, "out.bin"));
    run.wait_for(2 << 20);
    let mut f = std::fs::OpenOptions::new().append(true).open(&src).unwrap();
    f.write_all(&bytes(1 << 20, 98)).unwrap();
    drop(f);
    let s = run.finish();
    assert!(!s.ok, "{}", s.render());
    let msg = failure(&s, "out.bin");
    assert!(msg.contains("size changed"), "{msg}");
    assert!(!root.join("out.bin").exists());
    assert_no_leftovers(&root);
    // Once the file is stable, the same command sends it whole.
    let mut cfg = paced(srv.addr(), &src, "out.bin");
    cfg.max_rate = None;
    let s = send(&cfg).unwrap();
    assert!(s.ok, "{}", s.render());
    assert_same(&src, &root.join("out.bin"));
}

#[test]
fn files_swapped_for_symlinks_during_a_send_are_not_followed() {
    let dir = scratch("swap");
    let tree = dir.path().join("tree");
    for i in 0..6 {
        write_file(&tree.join(format!("f{i}.bin")), 2 << 20, i);
    }
    write_file(&tree.join("sub/inner.bin"), 1 << 20, 7);
    // What an attacker who can write the source tree wants a root-run
    // sender to deliver.
    let secret = dir.path().join("outside/secret");
    std::fs::create_dir_all(secret.parent().unwrap()).unwrap();
    let marker = b"SECRET-SHADOW-CONTENTS".repeat(1000);
    std::fs::write(&secret, &marker).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::write(dir.path().join("outside/inner.bin"), &marker).unwrap();
    let root = dir.path().join("dst");
    std::fs::create_dir_all(&root).unwrap();
    let srv = server(&root, IoMode::Async);
    let run = start(paced(srv.addr(), &tree, "t/"));
    run.wait_for(1 << 20);
    // The last file becomes a link to the secret; a directory becomes a
    // link to a directory outside holding a file of the listed name.
    std::fs::remove_file(tree.join("f5.bin")).unwrap();
    std::os::unix::fs::symlink(&secret, tree.join("f5.bin")).unwrap();
    std::fs::remove_dir_all(tree.join("sub")).unwrap();
    std::os::unix::fs::symlink(dir.path().join("outside"), tree.join("sub")).unwrap();
    let s = run.finish();
    assert!(!s.ok, "{}", s.render());
    for path in ["t/f5.bin", "t/sub/inner.bin"] {
        let msg = failure(&s, path);
        assert!(msg.contains("symlink"), "{path}: {msg}");
    }
    assert_eq!(s.files_ok, s.files - 2, "{}", s.render());
    for e in walk(&root) {
        if e.is_file() {
            let data = std::fs::read(&e).unwrap();
            assert!(
                !data.windows(22).any(|w| w == b"SECRET-SHADOW-CONTENTS"),
                "{} holds the secret",
                e.display()
            );
        }
    }
    for i in 0..5 {
        assert_same(
            &dir.path().join(format!("tree/f{i}.bin")),
            &root.join(format!("t/f{i}.bin")),
        );
    }
    assert_no_leftovers(&root);
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

#[test]
fn permission_bits_are_carried_and_masked_by_the_receivers_umask() {
    let dir = scratch("modes");
    let tree = dir.path().join("tree");
    let files = [
        ("private.bin", 0o600),
        ("tool.sh", 0o755),
        ("group.bin", 0o640),
    ];
    for (name, m) in files {
        write_file(&tree.join(name), 5000, 3);
        std::fs::set_permissions(tree.join(name), std::fs::Permissions::from_mode(m)).unwrap();
    }
    write_file(&tree.join("d/x.bin"), 10, 4);
    std::fs::set_permissions(tree.join("d"), std::fs::Permissions::from_mode(0o750)).unwrap();
    // A setuid bit never travels.
    std::fs::set_permissions(
        tree.join("tool.sh"),
        std::fs::Permissions::from_mode(0o4755),
    )
    .unwrap();
    for (umask, want) in [
        (0o022, [0o600, 0o755, 0o640, 0o750]),
        (0o077, [0o600, 0o700, 0o600, 0o700]),
    ] {
        let root = dir.path().join(format!("dst-{umask:o}"));
        std::fs::create_dir_all(&root).unwrap();
        let mut cfg = ServeConfig::new(root.clone(), TOKEN.to_vec());
        cfg.buffer = 8 << 20;
        cfg.umask = umask;
        let srv = Server::bind("127.0.0.1:0", cfg).unwrap().spawn();
        let s = send(&send_cfg(srv.addr(), &tree, "t/")).unwrap();
        assert!(s.ok, "{}", s.render());
        let got = [
            mode(&root.join("t/private.bin")),
            mode(&root.join("t/tool.sh")),
            mode(&root.join("t/group.bin")),
            mode(&root.join("t/d")),
        ];
        assert_eq!(got, want, "umask {umask:03o}: got {got:?} (decimal)");
    }
}

#[test]
fn names_of_241_to_255_bytes_land_with_the_rest_of_the_tree() {
    let dir = scratch("longnames");
    let tree = dir.path().join("tree");
    let mut names = vec!["short.bin".to_string()];
    for len in [236, 237, 240, 241, 248, 255] {
        names.push(format!("{}{}", "n".repeat(len - 4), ".bin"));
    }
    // Two long names that differ only at the end get separate temporary files.
    names.push(format!("{}a", "m".repeat(254)));
    names.push(format!("{}b", "m".repeat(254)));
    for (i, n) in names.iter().enumerate() {
        // Several blocks each, so every one is checkpointed on the way.
        write_file(&tree.join(n), 3 * 65536 + i, i as u64);
    }
    let root = dir.path().join("dst");
    std::fs::create_dir_all(&root).unwrap();
    let srv = server(&root, IoMode::Async);
    let s = send(&send_cfg(srv.addr(), &tree, "t/")).unwrap();
    assert!(s.ok, "{}", s.render());
    for n in &names {
        assert_same(&tree.join(n), &root.join("t").join(n));
    }
    assert_no_leftovers(&root);
}

#[test]
fn a_file_swapped_for_a_fifo_fails_without_hanging_the_sender() {
    // Bound: the send ends (a FIFO with no writer would block a plain open
    // forever), the FIFO's entry failed, the rest landed.
    let dir = scratch("fifo");
    let tree = dir.path().join("tree");
    for i in 0..4 {
        write_file(&tree.join(format!("f{i}.bin")), 2 << 20, i);
    }
    let root = dir.path().join("dst");
    std::fs::create_dir_all(&root).unwrap();
    let srv = server(&root, IoMode::Async);
    let run = start(paced(srv.addr(), &tree, "t/"));
    run.wait_for(1 << 20);
    std::fs::remove_file(tree.join("f3.bin")).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(tree.join("f3.bin"))
        .status()
        .unwrap();
    assert!(made.success());
    let t0 = Instant::now();
    let s = run.finish();
    assert!(t0.elapsed() < Duration::from_secs(20));
    let msg = failure(&s, "t/f3.bin");
    assert!(msg.contains("no longer a regular file"), "{msg}");
    assert_eq!(s.files_ok, s.files - 1, "{}", s.render());
    assert_no_leftovers(&root);
}

/// Makes the directory `name` in `dir` and opens it: one relative step,
/// so a chain can go deeper than any absolute path the kernel takes.
fn mkdir_in(dir: &std::os::fd::OwnedFd, name: &str) -> std::os::fd::OwnedFd {
    use rustix::fs::{Mode, OFlags};
    rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(0o755)).unwrap();
    rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .unwrap()
}

/// Writes `data` to the new file `name` in `dir`.
fn write_in(dir: &std::os::fd::OwnedFd, name: &str, data: &[u8]) {
    use rustix::fs::{Mode, OFlags};
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    )
    .unwrap();
    std::fs::File::from(fd).write_all(data).unwrap();
}

#[test]
fn a_chain_deeper_than_path_max_is_skipped_and_the_rest_of_the_tree_is_sent() {
    // One directory chain whose paths pass PATH_MAX stopped the whole scan
    // ("File name too long"): the files beside it must still be sent, the
    // part of the chain that can be opened too, and the summary must name
    // what was left out and why.
    let dir = scratch("deep");
    let src = dir.path().join("src/tree");
    write_file(&src.join("a.dat"), 70_000, 1);
    write_file(&src.join("z/b.dat"), 3, 2);
    let comp = "d".repeat(200);
    let top = rustix::fs::open(
        &src,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY,
        rustix::fs::Mode::empty(),
    )
    .unwrap();
    // "deep" + k * "/ddd…": level 20 is 4024 bytes beneath the source, so
    // a file there can still be opened; level 21 (4225) cannot.
    let mut at = mkdir_in(&top, "deep");
    let mut rel = String::from("deep");
    let mut too_deep = None;
    for level in 1..=24 {
        at = mkdir_in(&at, &comp);
        rel = format!("{rel}/{comp}");
        if level == 20 {
            write_in(&at, "last.dat", b"still reachable");
        }
        if level == 21 {
            too_deep = Some(rel.clone());
        }
    }
    write_in(&at, "lost.dat", b"too deep to open");
    let too_deep = too_deep.unwrap();
    assert!(too_deep.len() > 4095 && too_deep.len() - 201 <= 4095);

    let root = dir.path().join("dst");
    std::fs::create_dir_all(&root).unwrap();
    let srv = server(&root, IoMode::Buffered);
    let s = send(&send_cfg(srv.addr(), &src, "t/")).unwrap_or_else(|e| panic!("send: {e}"));
    assert!(s.ok, "{}", s.render());
    assert_eq!(s.files, s.files_ok, "{}", s.render());
    assert_same(&src.join("a.dat"), &root.join("t/a.dat"));
    assert_same(&src.join("z/b.dat"), &root.join("t/z/b.dat"));

    // Exactly one note, for the first directory too deep to open.
    assert_eq!(s.skipped.len(), 1, "{:?}", s.skipped);
    let k = &s.skipped[0];
    assert!(k.path.ends_with(&too_deep), "{}", k.path);
    assert!(k.reason.contains("too long"), "{}", k.reason);
    assert!(k.reason.contains("beneath it"), "{}", k.reason);
    assert!(s.render().contains("too long"), "{}", s.render());

    // The reachable part of the chain landed, the rest did not.
    let out = rustix::fs::open(
        root.join("t/deep"),
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY,
        rustix::fs::Mode::empty(),
    )
    .unwrap();
    let mut out = out;
    for _ in 1..=20 {
        out = rustix::fs::openat(
            &out,
            comp.as_str(),
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY,
            rustix::fs::Mode::empty(),
        )
        .unwrap();
    }
    let last = rustix::fs::openat(
        &out,
        "last.dat",
        rustix::fs::OFlags::RDONLY,
        rustix::fs::Mode::empty(),
    )
    .unwrap();
    let mut got = String::new();
    std::io::Read::read_to_string(&mut std::fs::File::from(last), &mut got).unwrap();
    assert_eq!(got, "still reachable");
    let names: Vec<_> = rustix::fs::Dir::read_from(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "." && n != "..")
        .collect();
    assert_eq!(names, ["last.dat"], "nothing beyond level 20 is created");
}
