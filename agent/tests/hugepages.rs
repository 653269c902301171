//! Buffers on the huge pages a pod was given: the hugetlbfs mount named by
//! WIRERATE_HUGEPAGES, as the operator renders DtnPool.spec.hugepages, at
//! that mount's page size. Real processes, a real hugetlbfs mount, real
//! huge pages reserved on the host (and given back).
//!
//! One test in its own binary: it changes the host's huge page reserve,
//! which no other test may see meanwhile.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::*;

const TWO_MIB: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB";

fn read(dir: &str, what: &str) -> u64 {
    std::fs::read_to_string(format!("{dir}/{what}"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Adds `n` pages of the size `dir` stands for to the host's reserve until dropped.
struct Reserve(&'static str, u64);

impl Reserve {
    fn add(dir: &'static str, n: u64) -> Self {
        let before = read(dir, "nr_hugepages");
        std::fs::write(format!("{dir}/nr_hugepages"), (before + n).to_string()).unwrap();
        let reserve = Self(dir, before);
        let now = read(dir, "nr_hugepages");
        assert_eq!(
            now,
            before + n,
            "the kernel could not reserve {n} more pages in {dir} (memory too fragmented?)"
        );
        reserve
    }
}

impl Drop for Reserve {
    fn drop(&mut self) {
        let _ = std::fs::write(format!("{}/nr_hugepages", self.0), self.1.to_string());
    }
}

/// A hugetlbfs mount at `dir` until dropped.
struct Mount(std::path::PathBuf);

impl Mount {
    fn hugetlbfs(dir: &Path, opts: &str) -> Self {
        let ok = Command::new("mount")
            .args(["-t", "hugetlbfs", "-o", opts, "none"])
            .arg(dir)
            .status()
            .unwrap()
            .success();
        assert!(ok, "mount -t hugetlbfs -o {opts} failed");
        Self(dir.to_path_buf())
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Sends `src` to a receiver on `port`, both with WIRERATE_HUGEPAGES=`huge`;
/// the sender's and the receiver's JSON summaries.
fn transfer(huge: &Path, s: &Setup, port: u16) -> (serde_json::Value, serde_json::Value) {
    let out = s.src.parent().unwrap().join(format!("serve-{port}.json"));
    let mut rx = Proc(
        Command::new(BIN)
            .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--json"])
            .args(["--buffer", "16MiB", "--root"])
            .arg(&s.root)
            .arg("--token-file")
            .arg(&s.token)
            .env("WIRERATE_HUGEPAGES", huge)
            .env("RUST_LOG", "warn")
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let t0 = std::time::Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(t0.elapsed().as_secs() < 10, "receiver did not start");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let sent = Command::new(BIN)
        .args([
            "send",
            "--to",
            &format!("127.0.0.1:{port}"),
            "--json",
            "--quiet",
        ])
        .args(["--block-size", "1MiB", "--buffer", "16MiB", "--token-file"])
        .arg(&s.token)
        .arg(&s.src)
        .arg("f")
        .env("WIRERATE_HUGEPAGES", huge)
        .output()
        .unwrap();
    assert!(
        sent.status.success(),
        "{}",
        String::from_utf8_lossy(&sent.stderr)
    );
    let sender: serde_json::Value = serde_json::from_slice(&sent.stdout).unwrap();
    let t0 = std::time::Instant::now();
    let receiver = loop {
        let text = std::fs::read_to_string(&out).unwrap_or_default();
        if let Some(l) = text.lines().next() {
            break serde_json::from_str::<serde_json::Value>(l).unwrap();
        }
        assert!(t0.elapsed().as_secs() < 10, "no receiver summary");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let _ = rx.0.kill();
    assert_same(&s.src, &s.root.join("f"));
    std::fs::remove_file(s.root.join("f")).unwrap();
    (sender, receiver)
}

#[test]
fn buffers_sit_on_the_pods_huge_pages_and_say_when_they_cannot() {
    if !require_root("reserving huge pages and mounting hugetlbfs") {
        return;
    }
    let s = setup("hugepages", 24 << 20);
    let _reserve = Reserve::add(TWO_MIB, 64);
    let given = scratch("hugetlbfs-given");
    let _m = Mount::hugetlbfs(given.path(), "pagesize=2M,size=64M");
    let free_before = read(TWO_MIB, "free_hugepages");

    let (sender, receiver) = transfer(given.path(), &s, free_port());
    assert_eq!(sender["buffer_pages"], "2 MiB huge-page", "{sender}");
    assert_eq!(receiver["buffer_pages"], "2 MiB huge-page", "{receiver}");
    assert!(sender["hugepages"].as_bool().unwrap());
    // Both processes are gone and their pages are back: the buffer files
    // were unlinked at once.
    assert_eq!(read(TWO_MIB, "free_hugepages"), free_before);
    assert_eq!(std::fs::read_dir(given.path()).unwrap().count(), 0);

    // 1 GiB pages are decided the same way (unit tests in io/hugepages.rs);
    // they are not reserved here: two contiguous GiB are seldom free once
    // a build has filled the page cache, and a test must not fail on that.

    // A mount too small for the buffers: normal pages, and the summary says why.
    let small = scratch("hugetlbfs-small");
    let _m2 = Mount::hugetlbfs(small.path(), "pagesize=2M,size=4M");
    let (sender, receiver) = transfer(small.path(), &s, free_port());
    assert_eq!(sender["buffer_pages"], "normal-page", "{sender}");
    assert_eq!(receiver["buffer_pages"], "normal-page", "{receiver}");
    let warned = |v: &serde_json::Value| {
        v["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w.as_str().unwrap().contains("2 MiB huge pages failed"))
    };
    assert!(warned(&sender), "{sender}");
    assert!(warned(&receiver), "{receiver}");

    // Not a hugetlbfs mount at all.
    let plain = scratch("not-hugetlbfs");
    let (sender, _) = transfer(plain.path(), &s, free_port());
    assert_eq!(sender["buffer_pages"], "normal-page");
    assert!(
        sender["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w.as_str().unwrap().contains("not a hugetlbfs mount")),
        "{sender}"
    );
}
