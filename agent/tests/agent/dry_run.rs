//! Dry runs (`send --dry-run`) between a real sender and receiver: the
//! plan says what a send would send, leave and refuse; nothing at the
//! destination is created or changed; and the send that follows does what
//! the plan said.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::common::*;
use wirerate_engine::io::IoMode;
use wirerate_engine::sender::send;
use wirerate_engine::summary::SendSummary;
use wirerate_engine::sync::SyncLevel;

/// Everything beneath `root` (temporary files and checkpoints included):
/// each path with its kind, size, modification time and inode.
fn snapshot(root: &Path) -> BTreeMap<String, (bool, u64, i64, i64, u64)> {
    fn visit(root: &Path, dir: &Path, out: &mut BTreeMap<String, (bool, u64, i64, i64, u64)>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            out.insert(
                rel,
                (m.is_dir(), m.len(), m.mtime(), m.mtime_nsec(), m.ino()),
            );
            if m.is_dir() {
                visit(root, &p, out);
            }
        }
    }
    let mut out = BTreeMap::new();
    visit(root, root, &mut out);
    out
}

/// The destination paths `s` marks by `which`, sorted.
fn paths(
    s: &SendSummary,
    which: impl Fn(&wirerate_engine::summary::FileOutcome) -> bool,
) -> Vec<String> {
    let mut p: Vec<String> = s
        .results
        .iter()
        .filter(|r| which(r))
        .map(|r| r.path.clone())
        .collect();
    p.sort();
    p
}

fn dry(cfg: &wirerate_engine::sender::SendConfig) -> SendSummary {
    let mut cfg = cfg.clone();
    cfg.dry_run = true;
    send(&cfg).unwrap()
}

// After a first sync, one file changes, one is new and a new directory
// holds another: the dry run names exactly those, leaves the destination
// as it was (no directory, temporary file or checkpoint made), and the
// send that follows sends exactly what it named.
#[test]
fn a_dry_run_changes_nothing_and_the_run_after_it_does_what_it_said() {
    let dir = scratch("dry-run-plan");
    let src = dir.path().join("src");
    write_file(&src.join("a.bin"), 5000, 1);
    write_file(&src.join("runs/big.bin"), 20 * 64 * 1024 + 7, 2);
    write_file(&src.join("runs/empty.bin"), 0, 3);
    let root = dir.path().join("dst");
    std::fs::create_dir_all(&root).unwrap();
    let srv = server(&root, IoMode::Async);
    let mut cfg = send_cfg(srv.addr(), &src, "out");
    cfg.sync = SyncLevel::Mtime;
    let first = send(&cfg).unwrap();
    assert_eq!(first.files_ok, 3, "{}", first.render());

    // Changed in place (same size, a new mtime), new, and new in a new
    // directory (many blocks: a run would checkpoint it).
    write_file(&src.join("a.bin"), 5000, 9);
    write_file(&src.join("runs/new.bin"), 3000, 4);
    write_file(&src.join("later/deep/c.bin"), 9 * 64 * 1024, 5);
    let before = snapshot(&root);
    let plan = dry(&cfg);
    assert!(plan.ok && plan.dry_run, "{}", plan.render());
    assert_eq!(snapshot(&root), before, "a dry run changed the destination");
    let to_send = paths(&plan, |r| r.to_send);
    assert_eq!(
        to_send,
        ["out/a.bin", "out/later/deep/c.bin", "out/runs/new.bin"]
    );
    assert_eq!(
        (plan.files_to_send, plan.bytes_to_send),
        (3, 5000 + 3000 + 9 * 64 * 1024)
    );
    assert_eq!((plan.files_present, plan.bytes_sent), (2, 0));
    assert_eq!(plan.digest, "none (dry run)");
    let text = plan.render();
    assert!(
        text.starts_with("dry run planned: nothing was sent"),
        "{text}"
    );
    assert!(
        text.contains("  send       out/later/deep/c.bin (576.00 KiB)"),
        "{text}"
    );
    // The receiver's summary of the session says so too.
    let rx = wait_summaries(&srv, 2);
    assert!(
        rx[1].dry_run && rx[1].bytes_written == 0,
        "{}",
        rx[1].render()
    );
    assert!(
        rx[1]
            .render()
            .contains("a dry run, which wrote nothing: 2 file(s) already here")
    );

    // The run after it sends what the plan named, and only that.
    let run = send(&cfg).unwrap();
    assert!(run.ok, "{}", run.render());
    let sent = paths(&run, |r| r.ok && !r.present && r.path.ends_with(".bin"));
    assert_eq!(sent, to_send, "{}", run.render());
    assert_eq!(run.files_ok, plan.files_to_send);
    assert_eq!(run.bytes_sent, plan.bytes_to_send);
    assert_same(
        &src.join("later/deep/c.bin"),
        &root.join("out/later/deep/c.bin"),
    );
}

// What a run would refuse, a dry run names, and the run then refuses
// exactly those: a directory in a file's place, a file in a directory's,
// a directory that is a symlink out of the root, one that is a symlink to
// nowhere. It exits as a failed run would (not ok), and creates nothing,
// not even the directories the other files need.
#[test]
fn a_dry_run_refuses_what_the_run_refuses_and_makes_no_directory() {
    let dir = scratch("dry-run-refused");
    let src = dir.path().join("src");
    for (i, f) in ["x.bin", "sub/y.bin", "esc/z.bin", "f/w.bin", "gone/v.bin"]
        .iter()
        .enumerate()
    {
        write_file(&src.join(f), 4000, i as u64);
    }
    let root = dir.path().join("dst");
    std::fs::create_dir_all(root.join("out/x.bin")).unwrap();
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("out/esc")).unwrap();
    std::fs::write(root.join("out/f"), b"a file").unwrap();
    std::os::unix::fs::symlink("nowhere", root.join("out/gone")).unwrap();
    let srv = server(&root, IoMode::Async);
    let cfg = send_cfg(srv.addr(), &src, "out");
    let before = snapshot(&root);
    let plan = dry(&cfg);
    assert!(!plan.ok && plan.dry_run, "{}", plan.render());
    assert_eq!(snapshot(&root), before);
    assert!(!root.join("out/sub").exists());
    let refused = |s: &SendSummary| {
        let mut p: Vec<String> = s.failures.iter().map(|f| f.path.clone()).collect();
        p.sort();
        p
    };
    // The directories' entries, and the files beneath them.
    let expected = [
        "out/esc",
        "out/esc/z.bin",
        "out/f",
        "out/f/w.bin",
        "out/gone",
        "out/gone/v.bin",
        "out/x.bin",
    ];
    assert_eq!(refused(&plan), expected, "{}", plan.render());
    assert_eq!(paths(&plan, |r| r.to_send), ["out/sub/y.bin"]);
    assert!(
        plan.render().contains("  refused    out/x.bin: "),
        "{}",
        plan.render()
    );
    let run = send(&cfg).unwrap();
    assert_eq!(refused(&run), expected, "{}", run.render());
    assert_same(&src.join("sub/y.bin"), &root.join("out/sub/y.bin"));
    assert_eq!(walk(&outside), Vec::<std::path::PathBuf>::new());
}

// Where a dry run cannot plan as a run would, it is refused before
// anything is sent, saying why: over several pairs, and of generated data.
#[test]
fn a_dry_run_over_pairs_or_of_generated_data_is_refused() {
    let dir = scratch("dry-run-refusals");
    let src = dir.path().join("a.bin");
    write_file(&src, 4000, 1);
    let root = dir.path().join("dst");
    std::fs::create_dir_all(&root).unwrap();
    let (a, b) = (server(&root, IoMode::Async), server(&root, IoMode::Async));
    let mut cfg = send_cfg(a.addr(), &src, "a.bin");
    cfg.dry_run = true;
    let to = [a.addr().to_string(), b.addr().to_string()];
    let err = wirerate_engine::sender::pairs::send_over_pairs(&cfg, &to).unwrap_err();
    assert!(
        err.to_string()
            .contains("--dry-run is not planned over several pairs"),
        "{err}"
    );
    cfg.synthetic = Some(1 << 20);
    let err = send(&cfg).unwrap_err();
    assert!(err.to_string().contains("has none to plan"), "{err}");
    assert!(walk(&root).is_empty(), "{:?}", walk(&root));
}

// The binary as a user runs it: `--dry-run` prints the plan, exits 0, and
// the destination stays empty; `--json` carries the plan's keys.
#[test]
fn send_dry_run_prints_the_plan_and_writes_nothing() {
    let s = setup("dry-run-cli", 3 << 20);
    let port = free_port();
    let _rx = serve_bin(&s.root, &s.token, port, &[]);
    let to = format!("127.0.0.1:{port}");
    let run = |extra: &[&str]| {
        let flags: Vec<&str> = ["--quiet", "--dry-run"]
            .into_iter()
            .chain(extra.iter().copied())
            .collect();
        send_bin(&to, &flags, &s.token, &s.src, "in/out.bin")
    };
    let out = run(&["--sync", "mtime"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("  plan       1 to send (3.00 MiB); 0 already there (sync mtime); 0 refused"),
        "{text}"
    );
    assert!(
        text.contains("  send       in/out.bin (3.00 MiB)"),
        "{text}"
    );
    let out = run(&["--json"]);
    assert!(out.status.success());
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["dry_run"], true);
    assert_eq!(j["files_to_send"], 1);
    assert_eq!(j["bytes_to_send"], 3 << 20);
    assert_eq!(j["results"][0]["to_send"], true);
    assert!(walk(&s.root).is_empty(), "{:?}", walk(&s.root));
    // Several receivers share one root: the first plans, and the others
    // (here, nothing listening) are not asked.
    let two = format!("127.0.0.1:{port},127.0.0.1:{}", free_port());
    let out = send_bin(
        &two,
        &["--quiet", "--dry-run"],
        &s.token,
        &s.src,
        "in/out.bin",
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("  send       in/out.bin"), "{text}");
}
