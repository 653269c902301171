//! Sync levels between a real sender and receiver: a second send of a
//! tree leaves what the destination already has, at the level asked,
//! sends what changed or is new, and every landed file carries its
//! source's modification time, so that `mtime` finds it again.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

use crate::common::*;
use wirerate_engine::io::IoMode;
use wirerate_engine::sender::send;
use wirerate_engine::summary::SendSummary;
use wirerate_engine::sync::SyncLevel;

/// `path`'s modification time, seconds and nanoseconds.
fn mtime(path: &Path) -> (i64, i64) {
    let m = std::fs::metadata(path).unwrap();
    (m.mtime(), m.mtime_nsec())
}

/// Sets `path`'s modification time `secs` seconds after the epoch (a
/// file or a directory).
fn touch(path: &Path, secs: u64) {
    set_mtime(
        path,
        SystemTime::UNIX_EPOCH + Duration::new(secs, 123_456_789),
    );
}

fn sync_send(
    srv: &wirerate_engine::receiver::ServerHandle,
    src: &Path,
    level: SyncLevel,
) -> SendSummary {
    let mut cfg = send_cfg(srv.addr(), src, "out");
    cfg.sync = level;
    let s = send(&cfg).unwrap();
    assert!(s.ok, "{}", s.render());
    s
}

/// The paths `results` says were found present, sorted.
fn present(s: &SendSummary) -> Vec<String> {
    let mut p: Vec<String> = s
        .results
        .iter()
        .filter(|r| r.present)
        .map(|r| r.path.rsplit('/').next().unwrap().to_owned())
        .collect();
    p.sort();
    p
}

#[test]
fn each_level_leaves_what_the_destination_has_and_sends_the_rest() {
    let dir = scratch("sync-levels");
    let src = dir.path().join("src");
    // One small file, one of many blocks (resumable, checkpointed), one
    // empty.
    write_file(&src.join("small.bin"), 5000, 1);
    write_file(&src.join("runs/big.bin"), 20 * 64 * 1024 + 7, 2);
    write_file(&src.join("runs/empty.bin"), 0, 3);
    touch(&src.join("small.bin"), 1_600_000_000);
    let root = dir.path().join("dst");
    std::fs::create_dir_all(&root).unwrap();
    let srv = server(&root, IoMode::Async);
    let landed = |f: &str| root.join("out").join(f);

    // A first send lands every file with its source's mtime.
    let first = sync_send(&srv, &src, SyncLevel::Mtime);
    assert_eq!(
        (first.files_ok, first.files_present),
        (3, 0),
        "{}",
        first.render()
    );
    for f in ["small.bin", "runs/big.bin", "runs/empty.bin"] {
        assert_same(&src.join(f), &landed(f));
        assert_eq!(mtime(&landed(f)), mtime(&src.join(f)), "{f}");
    }
    let big_ino = std::fs::metadata(landed("runs/big.bin")).unwrap().ino();

    // Again, unchanged: nothing is sent, nothing at the destination moves.
    let again = sync_send(&srv, &src, SyncLevel::Mtime);
    assert_eq!(
        (again.files_ok, again.files_present),
        (0, 3),
        "{}",
        again.render()
    );
    assert_eq!(again.bytes_sent, 0);
    assert_eq!(again.bytes_present, 5000 + 20 * 64 * 1024 + 7);
    assert_eq!(again.digest, "none (nothing sent)");
    assert!(
        again.render().contains("sync       mtime: 3 files"),
        "{}",
        again.render()
    );
    assert_eq!(
        std::fs::metadata(landed("runs/big.bin")).unwrap().ino(),
        big_ino
    );

    // The small file changes in place, keeping its size; a new file
    // appears. `size` misses the change (as it says it would), `mtime`
    // does not; the new file goes at every level.
    write_file(&src.join("small.bin"), 5000, 9);
    write_file(&src.join("new.bin"), 3000, 4);
    let by_size = sync_send(&srv, &src, SyncLevel::Size);
    assert_eq!(present(&by_size), ["big.bin", "empty.bin", "small.bin"]);
    assert_eq!(by_size.files_ok, 1);
    assert_same(&src.join("new.bin"), &landed("new.bin"));
    assert_ne!(
        std::fs::read(landed("small.bin")).unwrap(),
        std::fs::read(src.join("small.bin")).unwrap()
    );
    let by_mtime = sync_send(&srv, &src, SyncLevel::Mtime);
    assert_eq!(present(&by_mtime), ["big.bin", "empty.bin", "new.bin"]);
    assert_same(&src.join("small.bin"), &landed("small.bin"));
    assert_eq!(mtime(&landed("small.bin")), mtime(&src.join("small.bin")));

    // `exists` leaves a file of another size; `none` sends everything.
    write_file(&src.join("runs/big.bin"), 3 * 64 * 1024, 5);
    let exists = sync_send(&srv, &src, SyncLevel::Exists);
    assert_eq!(exists.files_present, 4, "{}", exists.render());
    assert_eq!(
        std::fs::metadata(landed("runs/big.bin")).unwrap().ino(),
        big_ino
    );
    let all = sync_send(&srv, &src, SyncLevel::None);
    assert_eq!((all.files_ok, all.files_present), (4, 0));
    assert_same(&src.join("runs/big.bin"), &landed("runs/big.bin"));
    let rx = wait_summaries(&srv, 6);
    assert_eq!(
        rx.iter().map(|r| r.files_present).sum::<u64>(),
        3 + 3 + 3 + 4
    );
}

// `checksum` compares contents: a file changed in place that kept its
// size and had its time set back is missed by `mtime` and sent by
// `checksum`; an unchanged tree sends nothing. Both ends read the files.
#[test]
fn checksum_finds_what_metadata_misses_and_leaves_what_is_the_same() {
    let dir = scratch("sync-checksum");
    let src = dir.path().join("src");
    write_file(&src.join("big.bin"), 20 * 64 * 1024 + 7, 1);
    write_file(&src.join("small.bin"), 5000, 2);
    write_file(&src.join("empty.bin"), 0, 3);
    let root = dir.path().join("dst");
    std::fs::create_dir_all(&root).unwrap();
    let srv = server(&root, IoMode::Async);
    let first = sync_send(&srv, &src, SyncLevel::Checksum);
    assert_eq!((first.files_ok, first.files_present), (3, 0));
    let again = sync_send(&srv, &src, SyncLevel::Checksum);
    assert_eq!(
        (again.files_ok, again.files_present),
        (0, 3),
        "{}",
        again.render()
    );
    assert_eq!(again.bytes_sent, 0);
    // One byte of the big file changes at the source; its time is set
    // back to what it was.
    let before = mtime(&src.join("big.bin"));
    let mut data = std::fs::read(src.join("big.bin")).unwrap();
    data[64 * 1024 + 5] ^= 0xff;
    std::fs::write(src.join("big.bin"), &data).unwrap();
    set_mtime(
        &src.join("big.bin"),
        SystemTime::UNIX_EPOCH + Duration::new(before.0 as u64, before.1 as u32),
    );
    assert_eq!(mtime(&src.join("big.bin")), before);
    let by_mtime = sync_send(&srv, &src, SyncLevel::Mtime);
    assert_eq!(
        by_mtime.files_present,
        3,
        "mtime cannot see it: {}",
        by_mtime.render()
    );
    let by_sum = sync_send(&srv, &src, SyncLevel::Checksum);
    assert_eq!(
        present(&by_sum),
        ["empty.bin", "small.bin"],
        "{}",
        by_sum.render()
    );
    assert_eq!(by_sum.files_ok, 1);
    assert_same(&src.join("big.bin"), &root.join("out/big.bin"));
}

// Directories land with their source's modification time too, set once
// the session has written into them (publishing a file changes a
// directory's time), deepest first.
#[test]
fn directories_keep_their_sources_modification_time() {
    let dir = scratch("sync-dir-times");
    let src = dir.path().join("src");
    write_file(&src.join("a/b/deep.bin"), 3 * 64 * 1024, 1);
    write_file(&src.join("a/top.bin"), 100, 2);
    // Deepest first: setting a child's time does not change its parent's,
    // but creating files does, so the files are written before.
    for (d, secs) in [
        ("a/b", 1_500_000_000),
        ("a", 1_500_000_100),
        ("", 1_500_000_200),
    ] {
        touch(&src.join(d), secs);
    }
    let root = dir.path().join("dst");
    std::fs::create_dir_all(&root).unwrap();
    let srv = server(&root, IoMode::Async);
    let s = sync_send(&srv, &src, SyncLevel::None);
    assert_eq!(s.files_ok, 2, "{}", s.render());
    wait_summaries(&srv, 1);
    for d in ["a/b", "a", ""] {
        assert_eq!(
            mtime(&root.join("out").join(d)),
            mtime(&src.join(d)),
            "{d:?}"
        );
    }
}

// Hard links are found, and said: each name lands as a file of its own.
#[test]
fn hard_links_are_found_and_said_each_landing_as_a_copy() {
    let dir = scratch("sync-hard-links");
    let src = dir.path().join("src");
    write_file(&src.join("a.bin"), 5000, 1);
    std::fs::hard_link(src.join("a.bin"), src.join("b.bin")).unwrap();
    std::fs::hard_link(src.join("a.bin"), src.join("c.bin")).unwrap();
    let root = dir.path().join("dst");
    std::fs::create_dir_all(&root).unwrap();
    let srv = server(&root, IoMode::Async);
    let s = sync_send(&srv, &src, SyncLevel::None);
    assert_eq!(s.files_ok, 3, "{}", s.render());
    assert!(
        s.warnings
            .iter()
            .any(|w| w.starts_with("2 file(s) are hard links to others sent with them")),
        "{}",
        s.render()
    );
    let ino = |f: &str| std::fs::metadata(root.join("out").join(f)).unwrap().ino();
    assert_ne!(ino("a.bin"), ino("b.bin"));
    assert_same(&src.join("a.bin"), &root.join("out/c.bin"));
}

// Only a regular file is ever present: a directory in the file's place is
// refused as before, and a symlink there is replaced by the file, never
// followed, whatever the level.
#[test]
fn only_a_regular_file_counts_as_present() {
    let dir = scratch("sync-kinds");
    let src = dir.path().join("src");
    write_file(&src.join("a.bin"), 4000, 1);
    write_file(&src.join("b.bin"), 4000, 2);
    let root = dir.path().join("dst");
    std::fs::create_dir_all(root.join("out/a.bin")).unwrap();
    let outside = dir.path().join("outside.bin");
    write_file(&outside, 4000, 3);
    std::os::unix::fs::symlink(&outside, root.join("out/b.bin")).unwrap();
    let srv = server(&root, IoMode::Async);
    let mut cfg = send_cfg(srv.addr(), &src, "out");
    cfg.sync = SyncLevel::Exists;
    let s = send(&cfg).unwrap();
    assert_eq!(s.files_present, 0, "{}", s.render());
    assert_eq!(s.failures.len(), 1, "{}", s.render());
    assert!(
        s.failures[0].message.contains("directory"),
        "{}",
        s.render()
    );
    let b = root.join("out/b.bin");
    assert!(std::fs::symlink_metadata(&b).unwrap().is_file());
    assert_same(&src.join("b.bin"), &b);
    assert_eq!(std::fs::read(&outside).unwrap(), bytes(4000, 3));
}

// A send of one file that is already there accepts nothing: the session
// still ends at once, ok, having sent nothing; and a file beneath a
// symlinked directory that stays inside the root (where the receiver
// writes it) is found there too.
#[test]
fn a_send_with_every_file_present_ends_having_sent_nothing() {
    let dir = scratch("sync-all-present");
    let src = dir.path().join("one.bin");
    write_file(&src, 3 * 64 * 1024, 1);
    let root = dir.path().join("dst");
    std::fs::create_dir_all(root.join("runs/2026")).unwrap();
    std::os::unix::fs::symlink("runs/2026", root.join("latest")).unwrap();
    let srv = server(&root, IoMode::Async);
    let mut cfg = send_cfg(srv.addr(), &src, "latest/one.bin");
    cfg.sync = SyncLevel::Mtime;
    let first = send(&cfg).unwrap();
    assert_eq!(
        (first.files_ok, first.files_present),
        (1, 0),
        "{}",
        first.render()
    );
    assert_same(&src, &root.join("runs/2026/one.bin"));
    let second = send(&cfg).unwrap();
    assert!(second.ok, "{}", second.render());
    assert_eq!(
        (second.files_ok, second.files_present),
        (0, 1),
        "{}",
        second.render()
    );
    assert_eq!(second.bytes_sent, 0);
}

// Over several pairs a level is applied: the first receiver is asked,
// once, what the shared destination already has, and the pairs send the
// rest; a run that finds everything there starts no pair.
#[test]
fn a_sync_level_over_several_pairs_leaves_what_is_there() {
    let dir = scratch("sync-pairs");
    let src = dir.path().join("src");
    write_file(&src.join("a.bin"), 3 * 64 * 1024, 1);
    write_file(&src.join("b.bin"), 5000, 2);
    let root = dir.path().join("dst");
    std::fs::create_dir_all(&root).unwrap();
    let (a, b) = (server(&root, IoMode::Async), server(&root, IoMode::Async));
    let mut cfg = send_cfg(a.addr(), &src, "out");
    cfg.sync = SyncLevel::Mtime;
    let to = [a.addr().to_string(), b.addr().to_string()];
    let pairs = |cfg: &wirerate_engine::sender::SendConfig| {
        let s = wirerate_engine::sender::pairs::send_over_pairs(cfg, &to).unwrap();
        assert!(s.ok, "{}", s.render());
        s
    };
    let first = pairs(&cfg);
    assert_eq!((first.files_ok, first.files_present), (2, 0));
    for f in ["a.bin", "b.bin"] {
        assert_same(&src.join(f), &root.join("out").join(f));
        assert_eq!(mtime(&root.join("out").join(f)), mtime(&src.join(f)));
    }
    let again = pairs(&cfg);
    assert_eq!(
        (again.files, again.files_present),
        (0, 2),
        "{}",
        again.render()
    );
    assert_eq!(again.bytes_sent, 0);
    assert!(
        again.render().contains("  sync       mtime: 2 files"),
        "{}",
        again.render()
    );
    // The first receiver down: the next is asked what is there, and the
    // pairs run without the lost one.
    let down = format!("127.0.0.1:{}", free_port());
    let with_down = [down, a.addr().to_string(), b.addr().to_string()];
    let s = wirerate_engine::sender::pairs::send_over_pairs(&cfg, &with_down).unwrap();
    assert!(s.ok && s.files_present == 2, "{}", s.render());
    write_file(&src.join("b.bin"), 5000, 9);
    let changed = pairs(&cfg);
    assert_eq!(
        (changed.files_ok, changed.files_present),
        (1, 1),
        "{}",
        changed.render()
    );
    assert_same(&src.join("b.bin"), &root.join("out/b.bin"));
}
