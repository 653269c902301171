//! `send --to a,b,c`: one transfer over several receivers that share one
//! root, as processes on loopback. Each receiver is a `serve` of its own;
//! the shared root is one directory (the shared file system a pool
//! declares). What a network namespace per host adds is in `netns`.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::common::{
    BIN, Proc, assert_no_leftovers, assert_same, free_port, serve_bin, setup, wait_written,
};

pub(crate) fn receivers(root: &Path, token: &Path, n: usize) -> (Vec<Proc>, Vec<u16>) {
    let ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
    let procs = ports
        .iter()
        .map(|&p| serve_bin(root, token, p, &[]))
        .collect();
    (procs, ports)
}

pub(crate) fn to(ports: &[u16]) -> String {
    ports
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect::<Vec<_>>()
        .join(",")
}

pub(crate) fn send(to: &str, token: &Path, src: &Path, dest: &str, extra: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(["send", "--to", to, "--json", "--quiet"])
        .args(["--block-size", "1MiB", "--streams", "2"])
        .arg("--token-file")
        .arg(token)
        .args(extra)
        .arg(src)
        .arg(dest)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

pub(crate) fn json(out: &Output) -> serde_json::Value {
    let s = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(s.trim()).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): stdout {s:?} stderr {:?}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[test]
fn a_file_and_a_tree_over_three_receivers_land_identical_with_one_pairs_digest() {
    let s = setup("pairs-three", 40 << 20);
    let (_rx, ports) = receivers(&s.root, &s.token, 3);
    let out = send(&to(&ports), &s.token, &s.src, "in/f.bin", &[])
        .output()
        .unwrap();
    let sum = json(&out);
    assert!(out.status.success(), "{sum}");
    assert_same(&s.src, &s.root.join("in/f.bin"));
    assert_eq!(sum["pairs"].as_array().unwrap().len(), 3);
    // 40 chunks of 1 MiB blocks, 2 streams: every pair had some.
    for p in sum["pairs"].as_array().unwrap() {
        assert!(p["chunks_done"].as_u64().unwrap() > 0, "{sum}");
    }
    assert_eq!(sum["bytes_sent"], sum["bytes_total"], "{sum}");
    // The digest built from the pieces' block checksums is the one a
    // single pair reports for the same file.
    let one = send(
        &format!("127.0.0.1:{}", ports[0]),
        &s.token,
        &s.src,
        "one.bin",
        &[],
    )
    .output()
    .unwrap();
    assert_eq!(json(&one)["digest"], sum["digest"]);
    // Found in review: a receiver re-reading its piece (--verify reread)
    // digested every block of the shared file, where the sender counts
    // the other pairs' blocks as 0, so no file of several pieces landed.
    let reread = send(
        &to(&ports),
        &s.token,
        &s.src,
        "reread.bin",
        &["--verify", "reread"],
    )
    .output()
    .unwrap();
    let reread = json(&reread);
    assert_eq!(reread["ok"], true, "{reread}");
    assert_eq!(reread["digest"], sum["digest"]);
    assert_same(&s.src, &s.root.join("reread.bin"));

    // A tree: files bundled by bytes, an empty file, nested directories.
    let tree = s.root.parent().unwrap().join("tree");
    for (i, size) in [0usize, 1, 4096, 300 << 10, 3 << 20, 9 << 20]
        .iter()
        .enumerate()
    {
        let dir = tree.join(format!("d{}/e", i % 2));
        std::fs::create_dir_all(&dir).unwrap();
        crate::common::write_file(&dir.join(format!("f{i}")), *size, i as u64);
    }
    let out = send(&to(&ports), &s.token, &tree, "t", &[])
        .output()
        .unwrap();
    let sum = json(&out);
    assert!(out.status.success(), "{sum}");
    assert_eq!(sum["files_ok"], 6, "{sum}");
    for f in crate::common::walk(&tree) {
        let rel = f.strip_prefix(&tree).unwrap();
        if f.is_file() {
            assert_same(&f, &s.root.join("t").join(rel));
        }
    }
    // No shared temporary file, checkpoint or marker stays behind.
    assert_no_leftovers(&s.root);
}

#[test]
fn a_receiver_killed_mid_file_hands_its_unacknowledged_pieces_to_the_others() {
    let s = setup("pairs-kill", 64 << 20);
    let (mut rx, ports) = receivers(&s.root, &s.token, 3);
    // Paced, so that every pair is mid-chunk when one is killed.
    let child = send(
        &to(&ports),
        &s.token,
        &s.src,
        "f.bin",
        &["--max-rate", "100Mbps"],
    )
    .spawn()
    .unwrap();
    // Sized in full when created.
    let part = s.root.join(".f.bin.wirerate-part");
    wait_written(&part, Duration::from_secs(30), "nothing started");
    std::thread::sleep(Duration::from_millis(500));
    rx[1].0.kill().unwrap();
    let out = child.wait_with_output().unwrap();
    let sum = json(&out);
    assert!(out.status.success(), "{sum}");
    assert_same(&s.src, &s.root.join("f.bin"));
    let pairs = sum["pairs"].as_array().unwrap();
    assert_ne!(pairs[1]["state"], "finished", "{sum}");
    // Nothing listens where it was: given up on its refusals, not after
    // the 8 s a receiver that does not answer gets.
    let why = pairs[1]["error"].as_str().unwrap_or_default();
    assert!(why.contains("of refused connections"), "{sum}");
    // The others went on and finished the lost pair's work; what they
    // sent again is at most the two chunks the lost pair was writing (a
    // lane runs two sessions at once; its queued item was never sent).
    // The lost pair's own count may hold blocks it sent twice itself, on
    // a stream that died and again on another, before it gave up.
    let chunk = sum["chunk_bytes"].as_u64().unwrap();
    let total = sum["bytes_total"].as_u64().unwrap();
    let others: u64 = [0, 2]
        .iter()
        .map(|&i| pairs[i]["bytes_sent"].as_u64().unwrap())
        .sum();
    let lost_wrote = pairs[1]["bytes"].as_u64().unwrap();
    assert!(
        others <= total - lost_wrote + 2 * chunk,
        "the others sent {others} of {total} (the lost pair wrote {lost_wrote}), chunk {chunk}: {sum}"
    );
    assert_no_leftovers(&s.root);
}

// Before per-chunk checkpoints a new run, or a new attempt with another
// sender, sent every piece again, however many had landed.
#[test]
fn a_sender_killed_mid_file_is_resumed_from_the_pieces_that_landed() {
    let s = setup("pairs-resume", 64 << 20);
    let (_rx, ports) = receivers(&s.root, &s.token, 3);
    let mut child = send(
        &to(&ports),
        &s.token,
        &s.src,
        "f.bin",
        &["--max-rate", "100Mbps"],
    )
    .spawn()
    .unwrap();
    // Killed once some pieces have landed and been recorded.
    let records = s.root.join(".f.bin.wirerate-pieces");
    wait_written(&records, Duration::from_secs(30), "no piece recorded");
    std::thread::sleep(Duration::from_millis(300));
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!s.root.join("f.bin").exists(), "published before the kill");

    let out = send(&to(&ports), &s.token, &s.src, "f.bin", &[])
        .output()
        .unwrap();
    let sum = json(&out);
    assert!(out.status.success(), "{sum}");
    assert_same(&s.src, &s.root.join("f.bin"));
    let total = sum["bytes_total"].as_u64().unwrap();
    let resumed = sum["bytes_resumed"].as_u64().unwrap();
    let sent = sum["bytes_sent"].as_u64().unwrap();
    assert!(resumed > 0, "nothing resumed: {sum}");
    assert!(
        sent + resumed <= total,
        "{sent} sent and {resumed} resumed of {total}: {sum}"
    );
    // The records went with the temporary file.
    assert!(!records.exists() && !s.root.join(".f.bin.wirerate-part").exists());
}

// Found in review: unverified (--verify none), a piece's checksums are 0,
// and its record could never be confirmed; none is written.
#[test]
fn an_unverified_transfer_records_no_pieces() {
    let s = setup("pairs-unverified", 64 << 20);
    let (_rx, ports) = receivers(&s.root, &s.token, 3);
    let mut child = send(
        &to(&ports),
        &s.token,
        &s.src,
        "f.bin",
        &["--max-rate", "100Mbps", "--verify", "none"],
    )
    .spawn()
    .unwrap();
    // About 5 s in all: by half way several pieces have landed.
    let part = s.root.join(".f.bin.wirerate-part");
    wait_written(&part, Duration::from_secs(30), "nothing started");
    std::thread::sleep(Duration::from_millis(2500));
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!s.root.join("f.bin").exists(), "published before the kill");
    assert!(!s.root.join(".f.bin.wirerate-pieces").exists());
}

#[test]
fn a_receiver_whose_root_is_not_shared_fails_the_transfer_and_says_why() {
    let s = setup("pairs-private", 8 << 20);
    let private = s.root.parent().unwrap().join("private");
    std::fs::create_dir_all(&private).unwrap();
    let a = free_port();
    let b = free_port();
    let _ra = serve_bin(&s.root, &s.token, a, &[]);
    let _rb = serve_bin(&private, &s.token, b, &[]);
    let out = send(
        &to(&[a, b]),
        &s.token,
        &s.src,
        "f.bin",
        &["--retry-for", "2"],
    )
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("is not the storage the other receivers"),
        "{err}"
    );
    // Nothing was published, on either disk.
    assert!(!s.root.join("f.bin").exists());
    assert!(!private.join("f.bin").exists());
}

#[test]
fn receiver_lists_that_cannot_make_a_transfer_are_refused_plainly() {
    let s = setup("pairs-refused", 1 << 20);
    let cases: [(&str, &[&str], &str); 3] = [
        ("127.0.0.1:1,127.0.0.1:1", &[], "names 127.0.0.1:1 twice"),
        (
            "127.0.0.1:1,127.0.0.1:2",
            &["--synthetic", "1GiB"],
            "runs on one pair",
        ),
        (
            "127.0.0.1:1,127.0.0.1:2",
            &["--repeat", "2"],
            "give --to one receiver",
        ),
    ];
    for (to, extra, want) in cases {
        let mut c = Command::new(BIN);
        c.args(["send", "--to", to, "--quiet", "--token-file"])
            .arg(&s.token)
            .args(extra);
        if !extra.contains(&"--synthetic") {
            c.arg(&s.src).arg("x");
        }
        let out = c.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{to} {extra:?}");
        assert!(err.contains(want), "{to} {extra:?}: {err}");
    }
}
