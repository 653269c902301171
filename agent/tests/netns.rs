//! Two hosts in network namespaces joined by a veth pair, with the agent
//! running as a separate process on each: random packet loss on both
//! directions, and a link outage mid-transfer. Needs root, iproute2 and
//! iptables; skips loudly without them and fails under CI.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

const BIN: &str = env!("CARGO_BIN_EXE_wirerate-agent");

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

fn serve_in(ns: &str, root: &Path, token: &Path) -> Proc {
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
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
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
    let _rx = serve_in(&h.b, &root, &token);
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
    let _rx = serve_in(&h.b, &root, &token);
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
