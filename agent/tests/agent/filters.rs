//! Send filters between a real sender and receiver: globs, sizes and ages
//! choose the files a send takes; what they leave out is neither sent nor
//! created at the destination, and filters that take nothing are refused.

use std::path::Path;
use std::time::{Duration, SystemTime};

use crate::common::*;
use wirerate_engine::filter::Filters;
use wirerate_engine::io::IoMode;
use wirerate_engine::sender::send;

/// Sets `path`'s modification time `ago` before now.
fn age(path: &Path, ago: Duration) {
    set_mtime(path, SystemTime::now() - ago);
}

/// Every path beneath `root` (directories too), relative, sorted.
fn landed(root: &Path) -> Vec<String> {
    let mut v: Vec<String> = walk(root)
        .iter()
        .map(|p| p.strip_prefix(root).unwrap().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn owned(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

// An instrument's run directory: frames, logs, a scratch directory, a file
// still being written. The filters take the frames and one log, leave the
// rest out (not sent, no directory made for it), and the summary counts
// what they left.
#[test]
fn filters_take_what_they_name_and_nothing_else_lands() {
    let dir = scratch("filters-take");
    let src = dir.path().join("run42");
    write_file(&src.join("frames/f1.h5"), 3 * 64 * 1024, 1);
    write_file(&src.join("frames/f2.h5"), 5000, 2);
    write_file(&src.join("frames/tiny.h5"), 10, 3);
    write_file(&src.join("frames/writing.h5"), 4000, 4);
    write_file(&src.join("logs/run.log"), 800, 5);
    write_file(&src.join("logs/debug-1.log"), 800, 6);
    write_file(&src.join("scratch/big.h5"), 9000, 7);
    write_file(&src.join("notes.txt"), 100, 8);
    for f in [
        "frames/f1.h5",
        "frames/f2.h5",
        "frames/tiny.h5",
        "logs/run.log",
        "logs/debug-1.log",
        "scratch/big.h5",
        "notes.txt",
    ] {
        age(&src.join(f), Duration::from_secs(3600));
    }
    let root = dir.path().join("dst");
    std::fs::create_dir_all(&root).unwrap();
    let srv = server(&root, IoMode::Async);
    let mut cfg = send_cfg(srv.addr(), &src, "in");
    cfg.filters = Filters {
        include: owned(&["*.h5", "*.log"]),
        exclude: owned(&["debug*.log", "scratch/"]),
        min_size: Some(100),
        min_age_seconds: Some(600),
        ..Filters::default()
    };
    let s = send(&cfg).unwrap();
    assert!(s.ok, "{}", s.render());
    assert_eq!(
        landed(&root.join("in")),
        [
            "frames",
            "frames/f1.h5",
            "frames/f2.h5",
            "logs",
            "logs/run.log"
        ]
    );
    assert_same(&src.join("frames/f1.h5"), &root.join("in/frames/f1.h5"));
    assert!(!root.join("in/scratch").exists());
    // Left out: tiny (size), writing (age), debug (exclude), notes
    // (include); scratch is not listed at all.
    assert_eq!(s.files_filtered, 4, "{}", s.render());
    assert_eq!((s.files, s.files_ok), (3, 3));
    assert!(
        s.render()
            .contains("  filtered   4 file(s) left out by the filters"),
        "{}",
        s.render()
    );
}

// Includes that match no file are refused before anything is sent,
// saying how many files they passed over; so is a pattern that does not
// parse. Excludes and bounds that leave nothing (a run with nothing old
// enough yet) make an empty send, not an error: a schedule polling a
// directory must not fail each quiet run.
#[test]
fn includes_that_match_nothing_or_do_not_parse_are_refused() {
    let dir = scratch("filters-none");
    let src = dir.path().join("src");
    write_file(&src.join("a.bin"), 100, 1);
    write_file(&src.join("b.bin"), 100, 2);
    let root = dir.path().join("dst");
    std::fs::create_dir_all(&root).unwrap();
    let srv = server(&root, IoMode::Async);
    let mut cfg = send_cfg(srv.addr(), &src, "in");
    cfg.filters.include = owned(&["*.h5"]);
    let err = send(&cfg).unwrap_err().to_string();
    assert!(
        err.contains("the include patterns (1) match none of the 2 file(s)"),
        "{err}"
    );
    cfg.filters.include = owned(&["a[.bin"]);
    let err = send(&cfg).unwrap_err().to_string();
    assert!(err.contains("filter pattern \"a[.bin\""), "{err}");
    // A single file is matched by its name.
    let mut one = send_cfg(srv.addr(), &src.join("a.bin"), "one.bin");
    one.filters.include = owned(&["b.bin"]);
    assert!(send(&one).unwrap_err().to_string().contains("match none"));
    assert!(walk(&root).is_empty(), "{:?}", walk(&root));
    // Nothing old enough: an empty send, ok.
    cfg.filters = Filters {
        min_age_seconds: Some(3600),
        ..Filters::default()
    };
    let s = send(&cfg).unwrap();
    assert!(
        s.ok && s.files == 0 && s.files_filtered == 2,
        "{}",
        s.render()
    );
    assert_eq!(landed(&root), ["in"]);
}

// The binary: patterns from a file, an age bound, and a dry run that shows
// what they take.
#[test]
fn the_cli_reads_pattern_files_and_ages() {
    let s = setup("filters-cli", 1000);
    let src = s.src.parent().unwrap().join("tree");
    write_file(&src.join("keep.dat"), 2000, 1);
    write_file(&src.join("skip.tmp"), 2000, 2);
    write_file(&src.join("fresh.dat"), 2000, 3);
    age(&src.join("keep.dat"), Duration::from_secs(7200));
    age(&src.join("skip.tmp"), Duration::from_secs(7200));
    let patterns = s.src.parent().unwrap().join("exclude.txt");
    std::fs::write(&patterns, "# scratch files\n\n*.tmp\n").unwrap();
    let port = free_port();
    let _rx = serve_bin(&s.root, &s.token, port, &[]);
    let exclude_from = patterns.to_str().unwrap();
    let flags = [
        "--quiet",
        "--dry-run",
        "--min-age",
        "1h",
        "--exclude-from",
        exclude_from,
    ];
    let out = send_bin(&format!("127.0.0.1:{port}"), &flags, &s.token, &src, "t");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("  plan       1 to send"), "{text}");
    assert!(text.contains("  send       t/keep.dat"), "{text}");
    assert!(
        text.contains("  filtered   2 file(s) left out by the filters"),
        "{text}"
    );
    let out = send_bin("127.0.0.1:1", &["--min-age", "10x"], &s.token, &src, "t");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not an age"));
}
