//! `send --to a,b,c --via -,h2,h3`: one transfer read and sent from
//! several hosts, as processes on loopback. Each other sending host is a
//! `wirerate relay` reading the same source directory (the shared file
//! system a pool declares); each receiver a `serve` writing the same
//! root. Storage that is not shared is made real with a mount namespace.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::pairs::{json, receivers};
use std::time::Duration;

use crate::common::{
    BIN, Proc, assert_no_leftovers, assert_same, free_port, require_root, setup, wait_listening,
    wait_written, write_file,
};

fn relay_cmd(allow: &Path, token: &Path, port: u16) -> Vec<String> {
    vec![
        BIN.to_string(),
        "relay".into(),
        "--listen".into(),
        format!("127.0.0.1:{port}"),
        "--allow-root".into(),
        allow.display().to_string(),
        "--token-file".into(),
        token.display().to_string(),
    ]
}

fn spawn(argv: &[String], port: u16) -> Proc {
    spawn_logged(argv, port, None)
}

/// As `spawn`, its warnings written to `log`.
fn spawn_logged(argv: &[String], port: u16, log: Option<&Path>) -> Proc {
    let stderr = match log {
        Some(p) => Stdio::from(std::fs::File::create(p).unwrap()),
        None => Stdio::null(),
    };
    let child = Command::new(&argv[0])
        .args(&argv[1..])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap();
    wait_listening(port);
    Proc(child)
}

fn relay(allow: &Path, token: &Path) -> (Proc, u16) {
    let port = free_port();
    (spawn(&relay_cmd(allow, token, port), port), port)
}

/// `send` to `to` via this host for the first receiver and the relays
/// at `relays` for the others (`pairs::send`, with `--via`).
fn send(
    to: &[u16],
    relays: &[u16],
    token: &Path,
    src: &Path,
    dest: &str,
    extra: &[&str],
) -> Command {
    let via = std::iter::once("-".to_string())
        .chain(relays.iter().map(|p| format!("127.0.0.1:{p}")))
        .collect::<Vec<_>>()
        .join(",");
    let args: Vec<&str> = ["--via", via.as_str()]
        .iter()
        .chain(extra)
        .copied()
        .collect();
    crate::pairs::send(&crate::pairs::to(to), token, src, dest, &args)
}

#[test]
fn a_file_and_a_tree_sent_from_three_hosts_land_identical() {
    let s = setup("relays-three", 48 << 20);
    let shared = s.src.parent().unwrap();
    let (_rx, ports) = receivers(&s.root, &s.token, 3);
    let (_r1, p1) = relay(shared, &s.token);
    let (_r2, p2) = relay(shared, &s.token);
    let out = send(&ports, &[p1, p2], &s.token, &s.src, "in/f.bin", &[])
        .output()
        .unwrap();
    let sum = json(&out);
    assert!(out.status.success(), "{sum}");
    assert_same(&s.src, &s.root.join("in/f.bin"));
    // Every host sent a share: the relays' pairs name them.
    let pairs = sum["pairs"].as_array().unwrap();
    for (i, p) in pairs.iter().enumerate() {
        assert!(p["chunks_done"].as_u64().unwrap() > 0, "{sum}");
        assert!(p["bytes_sent"].as_u64().unwrap() > 0, "{sum}");
        let via = p["via"].as_str().map(str::to_string);
        let want = [None, Some(p1), Some(p2)][i].map(|p| format!("127.0.0.1:{p}"));
        assert_eq!(via, want, "{sum}");
    }
    assert_eq!(sum["bytes_sent"], sum["bytes_total"], "{sum}");

    // A tree: many files, some empty, bundled into items.
    let tree = shared.join("tree");
    for i in 0..40 {
        let dir = tree.join(format!("d{}", i % 4));
        std::fs::create_dir_all(&dir).unwrap();
        write_file(&dir.join(format!("f{i}")), (i * 37_000) % 900_000, i as u64);
    }
    let out = send(&ports, &[p1, p2], &s.token, &tree, "t/", &[])
        .output()
        .unwrap();
    let sum = json(&out);
    assert!(out.status.success(), "{sum}");
    for i in 0..40 {
        let rel = format!("d{}/f{i}", i % 4);
        assert_same(&tree.join(&rel), &s.root.join("t").join(&rel));
    }
    assert_no_leftovers(&s.root);
}

// A relay killed mid-file (its pair lost at once, its chunks sent by the
// others, the file identical) is a run of bench/scaleout, with its hosts
// in network namespaces (not with --quick: the fence costs it 40 s). Its
// connection closed unanswered takes the same path as the silence below.

// A relay that goes silent (stopped, as a host cut off by a partition):
// the lead loses its pair after its silence, keeps the files it touched
// unverified until the relay has surely stopped writing, and the
// transfer lands. Woken afterwards, the relay finds its lead gone and
// stops its session; nothing it still had to send reaches the published
// file.
#[test]
fn a_silent_relay_is_lost_and_fenced_and_the_file_lands_identical() {
    let s = setup("relays-silent", 64 << 20);
    let shared = s.src.parent().unwrap();
    let (_rx, ports) = receivers(&s.root, &s.token, 3);
    let (r1, p1) = relay(shared, &s.token);
    let (_r2, p2) = relay(shared, &s.token);
    let child = send(
        &ports,
        &[p1, p2],
        &s.token,
        &s.src,
        "f.bin",
        &["--max-rate", "100Mbps"],
    )
    .spawn()
    .unwrap();
    let part = s.root.join(".f.bin.wirerate-part");
    wait_written(&part, Duration::from_secs(30), "nothing started");
    std::thread::sleep(Duration::from_millis(500));
    let signal = |sig: &str| {
        let pid = r1.0.id().to_string();
        assert!(
            Command::new("kill")
                .args([sig, &pid])
                .status()
                .unwrap()
                .success()
        );
    };
    signal("-STOP");
    let out = child.wait_with_output().unwrap();
    let sum = json(&out);
    assert!(out.status.success(), "{sum}");
    assert_same(&s.src, &s.root.join("f.bin"));
    let pairs = sum["pairs"].as_array().unwrap();
    let why = pairs[1]["error"].as_str().unwrap_or_default();
    let silence = wirerate_engine::relay::SILENCE.as_secs();
    assert!(
        why.contains(&format!("said nothing for {silence} s")),
        "{sum}"
    );
    // Published no sooner than the fence after its loss: by then the
    // receiver has dropped the stopped relay's silent session.
    let lost_after = pairs[1]["lost_after_s"].as_f64().unwrap();
    let seconds = sum["seconds"].as_f64().unwrap();
    let fence = wirerate_engine::relay::UNANSWERED_FENCE.as_secs_f64();
    assert!(seconds - lost_after >= fence - 1.0, "{sum}");
    // Whatever the woken relay still had to send lands nowhere: the
    // published file, changed here, stays as changed.
    let landed = s.root.join("f.bin");
    std::fs::write(&landed, vec![0x5a; s.size as usize]).unwrap();
    signal("-CONT");
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        std::fs::read(&landed).unwrap().iter().all(|&b| b == 0x5a),
        "the woken relay wrote into the published file"
    );
    drop(r1);
    assert_no_leftovers(&s.root);
}

// A relay whose memory can never hold a job says so, and what to raise;
// one whose jobs hold it for now holds the next job, alive, until the
// memory is given back: its pair's two sessions take turns, and the file
// lands with the pair never lost.
#[test]
fn a_relay_short_of_memory_says_so_or_takes_turns() {
    let s = setup("relays-memory", 48 << 20);
    let shared = s.src.parent().unwrap();
    let (_rx, ports) = receivers(&s.root, &s.token, 2);
    let with = |max: &str| {
        let log = shared.join(format!("relay-{max}.log"));
        let port = free_port();
        let mut argv = relay_cmd(shared, &s.token, port);
        argv.extend(["--buffer", "8MiB", "--max-memory", max].map(String::from));
        (spawn_logged(&argv, port, Some(&log)), port, log)
    };
    let (_r1, p1, _) = with("1MiB");
    let out = send(&ports, &[p1], &s.token, &s.src, "f.bin", &[])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("more than this relay's --max-memory 1.00 MiB: raise it"),
        "{err}"
    );
    // Room for one job of 8 MiB at a time.
    let (_r2, p2, log) = with("12MiB");
    let out = send(&ports, &[p2], &s.token, &s.src, "g.bin", &[])
        .output()
        .unwrap();
    let sum = json(&out);
    assert!(out.status.success(), "{sum}");
    assert_same(&s.src, &s.root.join("g.bin"));
    assert_eq!(sum["pairs"][1]["state"], "finished", "{sum}");
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(said.contains("relay job waits for memory"), "{said}");
}

#[test]
fn a_receiver_named_as_a_relay_says_what_it_is() {
    let s = setup("relays-not-a-relay", 4 << 20);
    let (_rx, ports) = receivers(&s.root, &s.token, 2);
    let out = send(&ports, &[ports[1]], &s.token, &s.src, "f.bin", &[])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("this is a receiver (wirerate serve), not a relay"),
        "{err}"
    );
}

#[test]
fn a_relay_reads_only_beneath_its_allowed_roots() {
    let s = setup("relays-roots", 4 << 20);
    let elsewhere = s.root.parent().unwrap().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let (_rx, ports) = receivers(&s.root, &s.token, 2);
    let (_r1, p1) = relay(&elsewhere, &s.token);
    let out = send(&ports, &[p1], &s.token, &s.src, "f.bin", &[])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("is not beneath this relay's --allow-root"),
        "{err}"
    );
    assert!(!s.root.join("f.bin").exists());
}

#[test]
fn a_relay_holding_another_token_is_refused_plainly() {
    let s = setup("relays-token", 4 << 20);
    let shared = s.src.parent().unwrap();
    let other = shared.join("other-token");
    std::fs::write(&other, "a-different-token\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (_rx, ports) = receivers(&s.root, &s.token, 2);
    let (_r1, p1) = relay(shared, &other);
    let out = send(&ports, &[p1], &s.token, &s.src, "f.bin", &[])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains(&format!("relay 127.0.0.1:{p1}")), "{err}");
    assert!(err.contains("different token"), "{err}");
}

// The relay's own view of the source is a mount of its own (a tmpfs in a
// mount namespace, as a host whose "shared" path is a local disk): the
// same name and size, another file. It must fail the transfer and say
// why, never land a file made from two disks.
#[test]
fn a_relay_that_does_not_share_the_source_fails_the_transfer_and_says_why() {
    if !require_root("mounting a private view of the source for the relay") {
        return;
    }
    let s = setup("relays-private", 8 << 20);
    let shared = s.src.parent().unwrap();
    let (_rx, ports) = receivers(&s.root, &s.token, 2);
    let port = free_port();
    let token = shared.join("token-copy");
    std::fs::copy(&s.token, &token).unwrap();
    let relay = relay_cmd(shared, &token, port).join(" ");
    let script = format!(
        "set -e; cp {token} /tmp/.relay-token-$$; mount -t tmpfs tmpfs {dir}; \
         cp /tmp/.relay-token-$$ {token}; rm /tmp/.relay-token-$$; \
         head -c {size} /dev/zero > {dir}/src.bin; exec {relay}",
        token = token.display(),
        dir = shared.display(),
        size = s.size,
    );
    let argv: Vec<String> = ["unshare", "--mount", "--propagation", "private", "sh", "-c"]
        .iter()
        .map(|a| a.to_string())
        .chain([script])
        .collect();
    let _r1 = spawn(&argv, port);
    let out = send(&ports, &[port], &s.token, &s.src, "f.bin", &[])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("the relay does not see the file the lead listed"),
        "{err}"
    );
    assert!(!s.root.join("f.bin").exists());
}
