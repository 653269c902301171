//! Mirrors (`send --delete`) between a real sender and receiver: what the
//! source no longer has is deleted beneath the destination directory, and
//! nothing else; the guard, a failed file and a receiver that does not
//! allow deletes each leave the destination as it was; a dry run lists
//! the deletes and changes nothing; a peer that names what the receiver
//! did not list is refused.

use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use crate::common::*;
use wirerate_engine::mirror::Guard;
use wirerate_engine::net::auth;
use wirerate_engine::receiver::ServerHandle;
use wirerate_engine::sender::{SendConfig, send};
use wirerate_engine::summary::SendSummary;
use wirerate_engine::sync::SyncLevel;
use wirerate_engine::wire::{self, Frame, Purpose};

fn deleting(root: &Path) -> ServerHandle {
    server_with(root, "127.0.0.1:0", |c| c.allow_delete = true)
}

/// Every path beneath `root`, sorted.
fn tree(root: &Path) -> Vec<String> {
    fn visit(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            out.push(p.strip_prefix(root).unwrap().to_string_lossy().into_owned());
            if std::fs::symlink_metadata(&p).unwrap().is_dir() {
                visit(root, &p, out);
            }
        }
    }
    let mut out = Vec::new();
    visit(root, root, &mut out);
    out.sort();
    out
}

/// A source tree sent once to `out`, then changed: `sub/a.bin` and the
/// whole of `logs/` gone from the source; at the destination a stray file,
/// a file the filters exclude, and a file outside the mirrored directory.
struct Scene {
    _dir: tempfile::TempDir,
    root: std::path::PathBuf,
    srv: ServerHandle,
    cfg: SendConfig,
}

fn scene(name: &str) -> Scene {
    let dir = scratch(name);
    let src = dir.path().join("src");
    write_file(&src.join("keep.txt"), 100, 1);
    write_file(&src.join("sub/a.bin"), 70_000, 2);
    write_file(&src.join("sub/b.bin"), 3_000, 3);
    write_file(&src.join("logs/x.log"), 500, 4);
    write_file(&src.join("logs/deep/y.log"), 600, 5);
    let root = dir.path().join("dst");
    std::fs::create_dir_all(&root).unwrap();
    let srv = deleting(&root);
    let mut cfg = send_cfg(srv.addr(), &src, "out");
    cfg.sync = SyncLevel::Mtime;
    let first = send(&cfg).unwrap();
    assert_eq!(first.files_ok, 5, "{}", first.render());
    std::fs::remove_file(src.join("sub/a.bin")).unwrap();
    std::fs::remove_dir_all(src.join("logs")).unwrap();
    write_file(&root.join("out/stray.txt"), 40, 6);
    write_file(&root.join("out/sub/notes.tmp"), 30, 7);
    write_file(&root.join("other/f"), 20, 8);
    // Differs from a source name in case alone: kept (a destination that
    // folds case would list the landed file so).
    write_file(&root.join("out/KEEP.txt"), 10, 11);
    cfg.filters.exclude = vec!["*.tmp".into()];
    Scene {
        _dir: dir,
        root,
        srv,
        cfg,
    }
}

fn mirrored(cfg: &SendConfig, guard: Guard) -> SendSummary {
    let mut cfg = cfg.clone();
    cfg.mirror = Some(guard);
    send(&cfg).unwrap()
}

// The dry run lists exactly the deletes and touches nothing; the mirror
// then deletes exactly those (files before their directories), and keeps
// what the source has, what its filters exclude and what lies outside.
#[test]
fn a_mirror_deletes_what_the_source_no_longer_has_and_nothing_else() {
    let s = scene("mirror-deletes");
    let before = tree(&s.root);
    let mut dry = s.cfg.clone();
    dry.dry_run = true;
    let plan = mirrored(&dry, Guard::default());
    assert!(plan.ok, "{}", plan.render());
    let m = plan.mirror.as_ref().unwrap();
    assert_eq!((m.files, m.dirs, m.deleted), (4, 2, 0), "{}", plan.render());
    assert_eq!(m.bytes, 70_000 + 500 + 600 + 40);
    assert_eq!(tree(&s.root), before, "a dry run deletes nothing");
    let text = plan.render();
    assert!(
        text.contains("would delete 4 files and 2 directories"),
        "{text}"
    );
    assert!(text.contains("would delete logs/deep/y.log"), "{text}");

    let run = mirrored(&s.cfg, Guard::default());
    assert!(run.ok, "{}", run.render());
    let m = run.mirror.as_ref().unwrap();
    assert_eq!((m.deleted, m.failed), (6, 0), "{}", run.render());
    let text = run.render();
    assert!(
        text.contains("mirror     deleted 6 of 6: 4 files and 2 directories"),
        "{text}"
    );
    assert_eq!(
        tree(&s.root),
        [
            "other",
            "other/f",
            "out",
            "out/KEEP.txt",
            "out/keep.txt",
            "out/sub",
            "out/sub/b.bin",
            "out/sub/notes.tmp",
        ]
    );
    // Mirrored again: nothing left to delete.
    let again = mirrored(&s.cfg, Guard::default());
    assert_eq!(
        again.mirror.as_ref().unwrap().count(),
        0,
        "{}",
        again.render()
    );
    assert!(again.ok);
}

// Above either limit, and from a source with no file, nothing is deleted
// and the send says why; the copies themselves stand.
#[test]
fn the_guard_deletes_nothing_above_its_limits_or_from_an_empty_source() {
    let s = scene("mirror-guard");
    let before = tree(&s.root);
    for (guard, says) in [
        (
            Guard {
                max_delete: 5,
                max_delete_bytes: None,
            },
            "6 entries at the destination, more than its limit of 5",
        ),
        (
            Guard {
                max_delete: 100,
                max_delete_bytes: Some(1000),
            },
            "more than its limit of 1000 B",
        ),
    ] {
        let run = mirrored(&s.cfg, guard);
        assert!(!run.ok, "{}", run.render());
        assert_eq!(run.files_ok + run.files_present, run.files, "copies stand");
        let why = run.mirror.as_ref().unwrap().refused.clone().unwrap();
        assert!(why.contains(says), "{why}");
        assert!(run.render().contains("nothing was deleted"));
        assert_eq!(tree(&s.root), before);
    }
    // An emptied source (say, unmounted) would wipe its replica.
    let empty = s.root.parent().unwrap().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let mut cfg = s.cfg.clone();
    cfg.source = empty;
    let run = mirrored(&cfg, Guard::default());
    let why = run.mirror.as_ref().unwrap().refused.clone().unwrap();
    assert!(why.contains("the source holds no file"), "{why}");
    assert_eq!(tree(&s.root), before);
}

// A file that fails (a directory stands where it goes) leaves every
// extra in place: deletes only follow a send that landed everything.
#[test]
fn nothing_is_deleted_after_a_failed_file() {
    let s = scene("mirror-after-failure");
    write_file(&s.cfg.source.join("blocked.bin"), 10, 9);
    write_file(&s.root.join("out/blocked.bin/inside"), 10, 10);
    let before = tree(&s.root);
    let run = mirrored(&s.cfg, Guard::default());
    assert!(!run.ok, "{}", run.render());
    let m = run.mirror.as_ref().unwrap();
    assert!(
        m.skipped.as_ref().unwrap().contains("1 file(s) failed"),
        "{}",
        run.render()
    );
    assert_eq!(tree(&s.root), before);
}

// A receiver that was not told to allow deletes refuses the mirror, and
// says how to allow it; its files landed all the same.
#[test]
fn a_receiver_that_does_not_allow_deletes_refuses_a_mirror() {
    let s = scene("mirror-not-allowed");
    let plain = server(&s.root, wirerate_engine::io::IoMode::Async);
    let mut cfg = s.cfg.clone();
    cfg.to = plain.addr().to_string();
    let before = tree(&s.root);
    let run = mirrored(&cfg, Guard::default());
    assert!(!run.ok);
    let e = run.mirror.as_ref().unwrap().error.clone().unwrap();
    assert!(e.contains("--allow-delete"), "{e}");
    assert_eq!(tree(&s.root), before);
    drop(s.srv);
}

// A peer that names an entry the listing did not hold, or asks twice, or
// names a directory out of the root, is refused, and nothing goes.
#[test]
fn a_mirror_peer_cannot_remove_what_was_not_listed() {
    let s = scene("mirror-hostile");
    let before = tree(&s.root);
    let talk = |base: &str, frames: &[Frame]| -> Vec<Frame> {
        let mut c = TcpStream::connect(s.srv.addr()).unwrap();
        auth::client(
            &mut c,
            TOKEN,
            Purpose::Mirror,
            0,
            wirerate_engine::encryption::Encryption::None,
        )
        .unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        wire::write_frame(&mut c, &Frame::MirrorOpen { base: base.into() }).unwrap();
        let mut reader = wire::FrameReader::unpacking();
        let mut got = Vec::new();
        // The listing first (when the base is good).
        loop {
            match reader.read(&mut c) {
                Ok(Frame::FilesEnd) => break,
                Ok(f @ Frame::Files { .. }) => got.push(f),
                Ok(f) => return vec![f],
                Err(_) => return got,
            }
        }
        for f in frames {
            wire::write_frame(&mut c, f).unwrap();
        }
        while let Ok(f) = reader.read(&mut c) {
            got.push(f);
        }
        got
    };
    let listed = talk("out", &[Frame::Finish]);
    let count: usize = listed
        .iter()
        .map(|f| match f {
            Frame::Files { entries } => entries.len(),
            _ => 0,
        })
        .sum();
    // Everything beneath out/, as the receiver lists it.
    let beneath = tree(&s.root.join("out")).len();
    assert_eq!(count, beneath, "{listed:?}");
    assert_eq!(tree(&s.root), before, "a listing alone removes nothing");
    // An id past the listing: the connection ends, nothing removed.
    let got = talk(
        "out",
        &[Frame::Remove {
            ids: vec![beneath as u32],
        }],
    );
    assert!(!got.contains(&Frame::Finish), "{got:?}");
    assert_eq!(tree(&s.root), before);
    // The same id twice: the first goes, then the connection ends.
    talk("out", &[Frame::Remove { ids: vec![0, 0] }]);
    assert_eq!(tree(&s.root).len(), before.len() - 1);
    // A base out of the root, or the root itself, is refused before
    // any listing, saying why.
    for base in ["../etc", ""] {
        let got = talk(base, &[]);
        assert!(
            matches!(&got[..], [Frame::Error { message, .. }] if message.contains("refused")),
            "{base:?}: {got:?}"
        );
    }
    assert_eq!(tree(&s.root).len(), before.len() - 1);
}

// The command line: --delete with a dry run prints the plan and deletes
// nothing; --max-delete 0 refuses and exits 1.
#[test]
fn send_delete_on_the_command_line() {
    let s = scene("mirror-cli");
    let token = s.root.parent().unwrap().join("token");
    std::fs::write(&token, std::str::from_utf8(TOKEN).unwrap()).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    let to = s.srv.addr().to_string();
    let before = tree(&s.root);
    let flags = [
        "--quiet",
        "--block-size",
        "64KiB",
        "--sync",
        "mtime",
        "--exclude",
        "*.tmp",
        "--delete",
    ];
    let out = send_bin(
        &to,
        &[&flags[..], &["--dry-run"]].concat(),
        &token,
        &s.cfg.source,
        "out",
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("would delete 4 files"), "{text}");
    assert_eq!(tree(&s.root), before);
    let out = send_bin(
        &to,
        &[&flags[..], &["--max-delete", "0"]].concat(),
        &token,
        &s.cfg.source,
        "out",
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("refused"), "{text}");
    assert_eq!(tree(&s.root), before);
    // A trailing / would leave what is mirrored to guesswork.
    let out = send_bin(&to, &flags, &token, &s.cfg.source, "out/");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("without a trailing /"));
    // --max-delete means nothing without --delete.
    let out = send_bin(&to, &["--max-delete", "3"], &token, &s.cfg.source, "out");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--delete"));
}
