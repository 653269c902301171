//! Two hosts in network namespaces joined by a veth pair, with the agent
//! running as a separate process on each: random packet loss on both
//! directions, a link outage mid-transfer, and a sender host that
//! vanishes. Needs root, iproute2 and iptables; skips loudly without them
//! and fails under CI.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

fn sh(args: &[&str]) {
    let st = Command::new(args[0]).args(&args[1..]).status().unwrap();
    assert!(st.success(), "{args:?} failed");
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn available(what: &str) -> bool {
    if !require_root(what) {
        return false;
    }
    for tool in ["ip", "iptables"] {
        if !have(tool) {
            if std::env::var_os("CI").is_some() {
                panic!("{what} needs `{tool}`; .ci/run installs it");
            }
            eprintln!("SKIPPED: {what} needs `{tool}` (apt-get install iproute2 iptables)");
            return false;
        }
    }
    true
}

/// Two namespaces `<tag>a` (10.203.0.1) and `<tag>b` (10.203.0.2), removed on drop.
struct Hosts {
    a: String,
    b: String,
}

impl Hosts {
    fn up(tag: &str) -> Self {
        let tag = format!("wt{}{tag}", std::process::id() % 100_000);
        let h = Self {
            a: format!("{tag}a"),
            b: format!("{tag}b"),
        };
        sh(&["ip", "netns", "add", &h.a]);
        sh(&["ip", "netns", "add", &h.b]);
        sh(&[
            "ip",
            "link",
            "add",
            &format!("{}0", h.a),
            "type",
            "veth",
            "peer",
            "name",
            &format!("{}0", h.b),
        ]);
        for (ns, addr) in [(&h.a, "10.203.0.1/24"), (&h.b, "10.203.0.2/24")] {
            let dev = format!("{ns}0");
            sh(&["ip", "link", "set", &dev, "netns", ns]);
            sh(&["ip", "-n", ns, "addr", "add", addr, "dev", &dev]);
            sh(&["ip", "-n", ns, "link", "set", &dev, "up"]);
            sh(&["ip", "-n", ns, "link", "set", "lo", "up"]);
        }
        h
    }

    /// Drops a random `p` of the packets arriving in `ns`.
    fn loss(&self, ns: &str, p: &str) {
        sh(&[
            "ip",
            "netns",
            "exec",
            ns,
            "iptables",
            "-A",
            "INPUT",
            "-m",
            "statistic",
            "--mode",
            "random",
            "--probability",
            p,
            "-j",
            "DROP",
        ]);
    }

    /// `ns` drops every packet in and out, as a host that lost power or
    /// its network would: its peers hear no FIN and no RST.
    fn vanish(&self, ns: &str) {
        for chain in ["INPUT", "OUTPUT"] {
            sh(&[
                "ip", "netns", "exec", ns, "iptables", "-I", chain, "-j", "DROP",
            ]);
        }
    }

    /// Established TCP connections in `ns` to or from `peer`.
    fn established(&self, ns: &str, peer: &str) -> usize {
        let out = Command::new("ip")
            .args(["netns", "exec", ns, "ss", "-Htn", "state", "established"])
            .args(["dst", peer])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ss: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).lines().count()
    }

    fn link(&self, up: bool) {
        let state = if up { "up" } else { "down" };
        sh(&[
            "ip",
            "-n",
            &self.a,
            "link",
            "set",
            &format!("{}0", self.a),
            state,
        ]);
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for ns in [&self.a, &self.b] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

fn serve_in(ns: &str, root: &Path, token: &Path, extra: &[&str]) -> Proc {
    Proc(
        Command::new("ip")
            .args([
                "netns",
                "exec",
                ns,
                BIN,
                "serve",
                "--listen",
                "10.203.0.2:7470",
            ])
            .arg("--root")
            .arg(root)
            .arg("--token-file")
            .arg(token)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// Runs the agent's `cmd` (`send`, `probe`) in `ns` against the receiver
/// `serve_in` started, `--json` with the token and then `args`; its report,
/// once it succeeded.
fn json_in(ns: &str, token: &Path, cmd: &str, args: &[&str]) -> serde_json::Value {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, BIN, cmd])
        .args(["--to", "10.203.0.2:7470", "--json", "--token-file"])
        .arg(token)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn send_from(ns: &str, token: &Path, src: &Path, extra: &[&str]) -> Command {
    let mut c = Command::new("ip");
    c.args([
        "netns",
        "exec",
        ns,
        BIN,
        "send",
        "--to",
        "10.203.0.2:7470",
        "--json",
        "--quiet",
        "--retry-for",
        "30",
    ])
    .arg("--token-file")
    .arg(token)
    .args(extra)
    .arg(src)
    .arg("out.bin")
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    c
}

#[test]
fn across_hosts_with_packet_loss_both_ways() {
    if !available("the network-namespace loss test") {
        return;
    }
    let s = setup("netns-loss", 24 << 20);
    let (src, root, token) = (s.src.clone(), s.root.clone(), s.token.clone());
    let h = Hosts::up("l");
    h.loss(&h.b, "0.01");
    h.loss(&h.a, "0.01");
    let _rx = serve_in(&h.b, &root, &token, &[]);
    let out = send_from(
        &h.a,
        &token,
        &src,
        &["--streams", "4", "--block-size", "1MiB"],
    )
    .output()
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["ok"], true);
    assert_same(&src, &root.join("out.bin"));
}

#[test]
fn across_hosts_surviving_a_link_outage() {
    if !available("the network-namespace outage test") {
        return;
    }
    let s = setup("netns-outage", 24 << 20);
    let (src, root, token) = (s.src.clone(), s.root.clone(), s.token.clone());
    let h = Hosts::up("o");
    let _rx = serve_in(&h.b, &root, &token, &[]);
    // Paced to about 3 s, so the outage lands mid-transfer.
    let sender = send_from(
        &h.a,
        &token,
        &src,
        &[
            "--streams",
            "2",
            "--block-size",
            "1MiB",
            "--max-rate",
            "64Mbps",
        ],
    )
    .spawn()
    .unwrap();
    std::thread::sleep(Duration::from_millis(1200));
    assert!(
        !root.join("out.bin").exists(),
        "the outage must land mid-transfer"
    );
    h.link(false);
    std::thread::sleep(Duration::from_millis(1500));
    h.link(true);
    let out = sender.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_same(&src, &root.join("out.bin"));
}

#[test]
fn a_vanished_sender_is_let_go_and_its_file_taken_over() {
    if !available("the network-namespace vanished-sender test") {
        return;
    }
    let s = setup("netns-vanish", 24 << 20);
    let (src, root, token) = (s.src.clone(), s.root.clone(), s.token.clone());
    let h = Hosts::up("v");
    // The receiver runs with its default idle timeout (30 s).
    let _rx = serve_in(&h.b, &root, &token, &[]);
    let mut first = send_from(
        &h.a,
        &token,
        &src,
        &[
            "--streams",
            "2",
            "--block-size",
            "1MiB",
            "--max-rate",
            "32Mbps",
        ],
    )
    .spawn()
    .unwrap();
    let ckpt = root.join(".out.bin.wirerate-ckpt");
    let t0 = Instant::now();
    while !ckpt.exists() {
        assert!(t0.elapsed() < Duration::from_secs(20), "no checkpoint yet");
        std::thread::sleep(Duration::from_millis(20));
    }
    let n = h.established(&h.b, "10.203.0.1");
    eprintln!("{n} connections from the sender before it vanishes");
    assert!(n >= 1, "the sender is connected");
    // Host a vanishes, and its sender dies without a word reaching b.
    h.vanish(&h.a);
    first.kill().unwrap();
    first.wait().unwrap();
    let vanished = Instant::now();
    // The same transfer, restarted from another host, is refused while the
    // old session might still be alive, then takes its file over once the
    // old sender has been silent for three keepalive intervals (15 s),
    // well before the idle timeout would have ended it.
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            &h.b,
            BIN,
            "send",
            "--to",
            "10.203.0.2:7470",
        ])
        .args([
            "--json",
            "--quiet",
            "--retry-for",
            "60",
            "--block-size",
            "1MiB",
        ])
        .arg("--token-file")
        .arg(&token)
        .arg(&src)
        .arg("out.bin")
        .output()
        .unwrap();
    let took = vanished.elapsed();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        j["bytes_skipped_resume"].as_u64().unwrap() > 0,
        "it resumed from the vanished session's checkpoint: {j}"
    );
    assert_same(&src, &root.join("out.bin"));
    // Bound: taken over within 28 s of the vanishing (takeover at 15 s,
    // the sender's reconnect backoff up to 5 s, the rest of the file).
    assert!(took < Duration::from_secs(28), "took {took:?}");
    // And the vanished host's connections are gone from the receiver.
    let t0 = Instant::now();
    while h.established(&h.b, "10.203.0.1") > 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "connections from the vanished host are still established"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until `addr:port` accepts connections from inside `ns`.
fn wait_in(ns: &str, addr: &str, port: u16) {
    let t0 = Instant::now();
    let probe = format!("exec 3<>/dev/tcp/{addr}/{port}");
    while !Command::new("ip")
        .args(["netns", "exec", ns, "bash", "-c", &probe])
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success()
    {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{addr}:{port} never listened"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

// The path test between two hosts with their own addresses, over a link
// that loses packets: every stream's TCP_INFO is the veth's (its MTU, a
// real loss), and the report ends with advice.
#[test]
fn probe_across_hosts_reads_every_streams_path() {
    if !available("the network-namespace probe test") {
        return;
    }
    let s = setup("netns-probe", 1000);
    let h = Hosts::up("p");
    h.loss(&h.b, "0.005");
    let _rx = serve_in(&h.b, &s.root, &s.token, &["--allow-discard"]);
    wait_in(&h.a, "10.203.0.2", 7470);
    let j = json_in(
        &h.a,
        &s.token,
        "probe",
        &["--streams", "4", "--seconds", "0.5", "--block-size", "1MiB"],
    );
    for (phase, streams) in [("one", 1), ("many", 4)] {
        let tcp = j[phase]["tcp"].as_array().unwrap();
        assert_eq!(tcp.len(), streams, "{j}");
        for t in tcp {
            assert_eq!(t["pmtu"], 1500, "{t}");
            assert!(t["mss"].as_u64().unwrap() <= 1460, "{t}");
            assert!(t["rtt_ms"].as_f64().unwrap() > 0.0, "{t}");
        }
    }
    // Half a percent of the packets into the receiver are dropped.
    assert!(j["many"]["retransmits"].as_u64().unwrap() > 0, "{j}");
    assert!(
        !j["advice"]["reasons"].as_array().unwrap().is_empty(),
        "{j}"
    );
    assert_eq!(std::fs::read_dir(&s.root).unwrap().count(), 0);
}

// A link that carries less than the tuner aimed at: a 2 Gbit/s token
// bucket (tbf) between the hosts, where the veth's round trip of
// microseconds made the tuner keep the default 4 streams for the 10
// Gbit/s aimed at. While the transfer runs, the optimizer measures 2
// Gbit/s, a fifth of the aim, tries twice as many streams, finds they
// carry no more and holds; the blocks
// the added streams carry arrive verified like the others, and the
// summary records the change and why it stopped.
#[test]
fn a_transfer_short_of_its_aim_adds_streams_while_it_runs() {
    if !available("the network-namespace optimizer test") {
        return;
    }
    if !have("tc") {
        assert!(
            std::env::var_os("CI").is_none(),
            "the optimizer test needs `tc`"
        );
        eprintln!("SKIPPED: the optimizer test needs `tc` (apt-get install iproute2)");
        return;
    }
    let s = setup("netns-optimizer", 1000);
    let h = Hosts::up("g");
    let dev = format!("{}0", h.a);
    sh(&[
        "tc", "-n", &h.a, "qdisc", "add", "dev", &dev, "root", "tbf", "rate", "2gbit", "burst",
        "256kb", "latency", "20ms",
    ]);
    let _rx = serve_in(&h.b, &s.root, &s.token, &["--allow-discard"]);
    wait_in(&h.a, "10.203.0.2", 7470);
    // 3 GiB at 2 Gbit/s: about 13 s, and the optimizer decides after 2
    // (a second to settle, a second to measure) and again after 4.
    let j = json_in(&h.a, &s.token, "send", &["--quiet", "--synthetic", "3GiB"]);
    assert_eq!(j["ok"], true, "{j}");
    assert!(
        j["streams_chosen"]
            .as_str()
            .unwrap()
            .contains("the default"),
        "{j}"
    );
    let changes = j["stream_changes"].as_array().unwrap();
    assert!(!changes.is_empty(), "{j}");
    assert_eq!(
        (&changes[0]["from"], &changes[0]["to"]),
        (&4.into(), &8.into()),
        "{j}"
    );
    let why = changes[0]["reason"].as_str().unwrap();
    assert!(why.contains("short of the 10.0 Gbit/s aimed at"), "{why}");
    for w in changes.windows(2) {
        assert_eq!(w[0]["to"], w[1]["from"], "{j}");
        assert!(
            w[1]["after_secs"].as_f64() > w[0]["after_secs"].as_f64(),
            "{j}"
        );
    }
    let last = changes.last().unwrap()["to"].as_u64().unwrap() as usize;
    assert_eq!(j["streams"], last, "{j}");
    // Every stream, the added ones too, connected and carried blocks.
    assert_eq!(j["tcp"].as_array().unwrap().len(), last, "{j}");
    assert!(
        j["tcp"].as_array().unwrap().iter().all(|t| !t.is_null()),
        "{j}"
    );
    let per = j["per_stream_gbps"].as_array().unwrap();
    assert_eq!(per.len(), last, "{j}");
    assert!(per[4].as_f64().unwrap() > 0.0, "{j}");
    // More streams through the same bucket carry no more: held, said why.
    // On a machine busy with other tests the streams may reach the bucket's
    // rate only slowly, each step still gaining, until the tuner's bound
    // holds them instead (seen in CI: 1.21, 1.85, then 2.15 Gbit/s on 15):
    // held either way, and the summary says which.
    let held = j["streams_held"].as_str().unwrap_or_default();
    assert!(
        held.contains("do not raise the rate") || held.contains("is the most the tuner opens"),
        "{j}"
    );
    assert_eq!(std::fs::read_dir(&s.root).unwrap().count(), 0);
}

// Hosts whose TCP buffer maximum (4 KiB) is far below what the link's
// round trip needs: even over a 1 us round trip (the veth's handshake
// measures a few) a stream's window carries 16 Gbit/s, so the 400 Gbit/s
// aimed at needs far more than the default 4 streams (25 at least), and
// the sender opens as many as its buffer feeds (32 MiB of 1 MiB blocks:
// two kept for the reader, two a stream, 15) and says why. A count given
// on the command line is kept as given. (This kernel has no netem, so the
// test shrinks the window instead of stretching the round trip; the
// arithmetic for long paths is `tuner`'s unit tests.)
#[test]
fn a_window_too_small_for_the_link_gets_the_streams_it_needs() {
    if !available("the network-namespace tuner test") {
        return;
    }
    let s = setup("netns-tuner", 1000);
    let h = Hosts::up("t");
    for ns in [&h.a, &h.b] {
        sh(&[
            "ip",
            "netns",
            "exec",
            ns,
            "sysctl",
            "-qw",
            "net.ipv4.tcp_wmem=4096 4096 4096",
            "net.ipv4.tcp_rmem=4096 4096 4096",
        ]);
    }
    let _rx = serve_in(&h.b, &s.root, &s.token, &["--allow-discard"]);
    wait_in(&h.a, "10.203.0.2", 7470);
    let send = |extra: &[&str]| {
        let args = ["--quiet", "--synthetic", "16MiB", "--max-rate", "400Gbps"];
        let more = ["--block-size", "1MiB", "--buffer", "32MiB"];
        json_in(&h.a, &s.token, "send", &[&args[..], &more, extra].concat())
    };
    let j = send(&[]);
    assert_eq!(j["ok"], true, "{j}");
    assert_eq!(j["streams"], 15, "{j}");
    assert_eq!(j["tcp"].as_array().unwrap().len(), 15, "{j}");
    let why = j["streams_chosen"].as_str().unwrap();
    assert!(why.contains("4.00 KiB buffer"), "{why}");
    assert!(why.contains("400.0 Gbit/s aimed at"), "{why}");
    assert!(why.contains("--buffer"), "{why}");
    // Fixed on the command line: as given, no reason.
    let j = send(&["--streams", "2"]);
    assert_eq!(j["streams"], 2, "{j}");
    assert!(j["streams_chosen"].is_null(), "{j}");
    assert_eq!(std::fs::read_dir(&s.root).unwrap().count(), 0);
}

/// Reads every frame crossing `dev` into a file (AF_PACKET, as tcpdump
/// does) until a stop file appears; writes a ready file once bound.
const CAPTURE: &str = r#"
import os, socket, sys
dev, out, ready, stop = sys.argv[1:5]
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
# SO_RCVBUFFORCE: as root, past net.core.rmem_max, so a burst waits here
# rather than being dropped before this loop reads it.
s.setsockopt(socket.SOL_SOCKET, 33, 256 << 20)
s.bind((dev, 0))
s.settimeout(0.1)
open(ready, "w").close()
with open(out, "wb") as f:
    while not os.path.exists(stop):
        try:
            f.write(s.recv(1 << 18))
        except socket.timeout:
            pass
"#;

/// What crossed the sending host's link while `send` ran there, sending
/// `src` with `mode`.
fn captured(h: &Hosts, dir: &Path, token: &Path, src: &Path, mode: &str) -> Vec<u8> {
    let (out, ready, stop) = (
        dir.join(format!("{mode}.cap")),
        dir.join(format!("{mode}.ready")),
        dir.join(format!("{mode}.stop")),
    );
    let mut cap = Proc(
        Command::new("ip")
            .args(["netns", "exec", &h.a, "python3", "-c", CAPTURE])
            .arg(format!("{}0", h.a))
            .args([&out, &ready, &stop])
            .spawn()
            .unwrap(),
    );
    let until = Instant::now() + Duration::from_secs(10);
    while !ready.exists() {
        assert!(Instant::now() < until, "the capture did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Paced, so that the capture keeps up and sees it all; in clear
    // blocks, so that the control capture shows the text (paced, `auto`
    // would pack it: the pacing makes the link the limit).
    let sent = send_from(
        &h.a,
        token,
        src,
        &[
            "--encrypt",
            mode,
            "--max-rate",
            "200Mbps",
            "--compress",
            "none",
        ],
    )
    .output()
    .unwrap();
    assert!(
        sent.status.success(),
        "{}",
        String::from_utf8_lossy(&sent.stderr)
    );
    let j: serde_json::Value = serde_json::from_slice(&sent.stdout).unwrap();
    let expected = if mode == "none" {
        "none"
    } else {
        "tls-userspace"
    };
    assert_eq!(j["encryption"], expected, "{j}");
    std::fs::write(&stop, b"").unwrap();
    let _ = cap.0.wait();
    std::fs::read(&out).unwrap()
}

/// A transfer with `--encrypt required` carries nothing of the file in
/// clear across a real link: a capture on the sender's interface finds
/// no trace of a text the file repeats, where the same capture of the
/// same transfer in clear finds it (so the capture sees what it should).
#[test]
fn an_encrypted_transfer_shows_nothing_in_clear_on_the_wire() {
    if !available("the network-namespace capture test") {
        return;
    }
    let s = setup("netns-capture", 1 << 20);
    let marker = b"WIRERATE-KNOWN-PLAINTEXT-7f3a9c";
    let text: Vec<u8> = (0..)
        .flat_map(|i: u32| [&marker[..], format!("-{i:08}\n").as_bytes()].concat())
        .take(8 << 20)
        .collect();
    std::fs::write(&s.src, &text).unwrap();
    let dir = s.root.parent().unwrap().to_path_buf();
    let h = Hosts::up("c");
    let _rx = serve_in(&h.b, &s.root, &s.token, &["--encrypt", "preferred"]);
    let clear = captured(&h, &dir, &s.token, &s.src, "none");
    assert!(clear.len() > text.len(), "captured {} bytes", clear.len());
    assert!(
        clear.windows(marker.len()).any(|w| w == marker),
        "the capture of a clear transfer should show the text"
    );
    // Sent afresh, not found already landed.
    std::fs::remove_file(s.root.join("out.bin")).unwrap();
    let sealed = captured(&h, &dir, &s.token, &s.src, "required");
    assert!(sealed.len() > text.len(), "captured {} bytes", sealed.len());
    assert!(
        !sealed.windows(marker.len()).any(|w| w == marker),
        "an encrypted transfer showed the file's text on the wire"
    );
    assert_same(&s.src, &s.root.join("out.bin"));
}
