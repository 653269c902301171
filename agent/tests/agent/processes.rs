//! The `wirerate-agent` binary as users run it: real processes, a receiver
//! killed mid-transfer and restarted, JSON output, exit codes.

use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

fn serve(root: &Path, token: &Path, port: u16) -> Proc {
    serve_bin(root, token, port, &[])
}

/// `serve` on `port` for `s`, with `extra` flags, logging at info, its
/// output where the test wants it; returns once it listens.
fn serve_piped(
    s: &Setup,
    port: u16,
    extra: &[&str],
    stdout: Stdio,
    stderr: Stdio,
) -> std::process::Child {
    let rx = Command::new(BIN)
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args(extra)
        .arg("--root")
        .arg(&s.root)
        .arg("--token-file")
        .arg(&s.token)
        .env("RUST_LOG", "info")
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .unwrap();
    wait_listening(port);
    rx
}

/// Stops a receiver started with a piped stdout and returns what it printed.
fn stop_and_read(mut rx: std::process::Child) -> String {
    use std::io::Read;
    rx.kill().unwrap();
    rx.wait().unwrap();
    let mut printed = String::new();
    rx.stdout
        .take()
        .unwrap()
        .read_to_string(&mut printed)
        .unwrap();
    printed
}

fn send_cmd(port: u16, token: &Path, src: &Path, dest: &str, extra: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args([
        "send",
        "--to",
        &format!("127.0.0.1:{port}"),
        "--json",
        "--quiet",
    ])
    .args(if extra.contains(&"--block-size") {
        &[][..]
    } else {
        &["--block-size", "1MiB"][..]
    })
    .arg("--token-file")
    .arg(token)
    .args(extra)
    .arg(src)
    .arg(dest)
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    c
}

fn json(out: &Output) -> serde_json::Value {
    let s = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(s.trim()).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): stdout {s:?} stderr {:?}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Waits until the receiver has checkpointed some durable blocks.
fn wait_for_checkpoint(root: &Path, name: &str) {
    let ckpt = root.join(format!(".{name}.wirerate-ckpt"));
    let t0 = Instant::now();
    loop {
        if let Some(c) = std::fs::read(&ckpt)
            .ok()
            .and_then(|b| wirerate_engine::receiver::Checkpoint::decode(&b))
        {
            if c.durable.count() >= 4 {
                return;
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no checkpoint appeared"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn receiver_killed_mid_transfer_then_a_new_run_resumes() {
    let s = setup("kill-resume", 48 << 20);
    let port = free_port();
    let mut rx = serve(&s.root, &s.token, port);
    // Paced so the kill lands mid-transfer.
    let first = send_cmd(
        port,
        &s.token,
        &s.src,
        "out.bin",
        &["--max-rate", "160Mbps", "--retry-for", "0"],
    )
    .spawn()
    .unwrap();
    wait_for_checkpoint(&s.root, "out.bin");
    rx.0.kill().unwrap();
    rx.0.wait().unwrap();
    let out = first.wait_with_output().unwrap();
    assert!(
        !out.status.success(),
        "the first run must fail when its receiver dies"
    );
    assert!(
        !s.root.join("out.bin").exists(),
        "nothing under the final name yet"
    );

    let _rx = serve(&s.root, &s.token, port);
    let out = send_cmd(port, &s.token, &s.src, "out.bin", &[])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j = json(&out);
    let sent = j["bytes_sent"].as_u64().unwrap();
    let skipped = j["bytes_skipped_resume"].as_u64().unwrap();
    assert!(
        sent < s.size,
        "the second run sent {sent} of {} bytes: it must resume",
        s.size
    );
    assert!(
        skipped > 0 && sent + skipped >= s.size,
        "sent {sent} + skipped {skipped}"
    );
    assert_eq!(j["bytes_total"].as_u64(), Some(s.size));
    assert_eq!(j["ok"], true);
    assert_same(&s.src, &s.root.join("out.bin"));
    assert_no_leftovers(&s.root);
}

#[test]
fn sender_reconnects_and_resumes_when_its_receiver_restarts() {
    let s = setup("reconnect", 32 << 20);
    let port = free_port();
    let mut rx = serve(&s.root, &s.token, port);
    // The receiver dies after the run has gone on longer than
    // --retry-for: the budget is for the outage, counted from the failure
    // (it was once counted from the run's start, and such a sender gave
    // up at once).
    let began = Instant::now();
    let sender = send_cmd(
        port,
        &s.token,
        &s.src,
        "out.bin",
        &["--max-rate", "32Mbps", "--retry-for", "3"],
    )
    .spawn()
    .unwrap();
    wait_for_checkpoint(&s.root, "out.bin");
    std::thread::sleep(Duration::from_secs(4).saturating_sub(began.elapsed()));
    rx.0.kill().unwrap();
    rx.0.wait().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let _rx = serve(&s.root, &s.token, port);
    let out = sender.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j = json(&out);
    assert!(j["sessions"].as_u64().unwrap() >= 2, "{j}");
    assert!(j["bytes_sent"].as_u64().unwrap() < 2 * s.size, "{j}");
    assert_same(&s.src, &s.root.join("out.bin"));
}

#[test]
fn json_summary_has_the_documented_keys() {
    let s = setup("json", 3 << 20);
    let port = free_port();
    let _rx = serve(&s.root, &s.token, port);
    let out = send_cmd(
        port,
        &s.token,
        &s.src,
        "a/b/out.bin",
        &["--streams", "3", "--io-mode", "direct"],
    )
    .output()
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j = json(&out);
    for key in [
        "bytes_total",
        "bytes_sent",
        "bytes_skipped_resume",
        "blocks_retried",
        "seconds",
        "gbps",
        "io_mode",
        "streams",
        "digest",
    ] {
        assert!(j.get(key).is_some(), "missing {key} in {j}");
    }
    assert_eq!(j["io_mode"], "direct");
    assert_eq!(j["streams"], 3);
    assert_eq!(j["per_stream_gbps"].as_array().unwrap().len(), 3);
    assert!(j["digest"].as_str().unwrap().starts_with("xxh3-128:"));
    assert_eq!(j["results"][0]["path"], "a/b/out.bin");
    assert_eq!(j["results"][0]["ok"], true);
    assert_eq!(j["results"][0]["digest"], j["digest"]);
    assert_same(&s.src, &s.root.join("a/b/out.bin"));
    // Per-socket congestion control is applied and reported.
    let out = send_cmd(port, &s.token, &s.src, "cc.bin", &["--congestion", "cubic"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(json(&out)["congestion"], "cubic");
    let out = send_cmd(
        port,
        &s.token,
        &s.src,
        "cc.bin",
        &["--congestion", "nosuchcc"],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("available:"));
}

#[test]
fn bad_arguments_and_refusals_exit_non_zero_with_a_clear_message() {
    let s = setup("cli", 1000);
    let port = free_port();
    let _rx = serve(&s.root, &s.token, port);
    let out = send_cmd(port, &s.token, &s.src, "x", &["--block-size", "1000"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("multiple of 4 KiB"));
    let out = send_cmd(port, &s.token, &s.src, "x", &["--max-rate", "fast"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a rate"));
    // A refused path: the transfer ran, the file did not land: exit 1.
    let out = send_cmd(port, &s.token, &s.src, "../x", &[])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(json(&out)["ok"], false);
    // No receiver: a clear connection error, exit 2.
    let out = send_cmd(free_port(), &s.token, &s.src, "x", &["--retry-for", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("connecting to"));
}

// Found in a pod's log: the log lines carried terminal colour codes.
#[test]
fn logs_carry_no_colour_codes_when_not_at_a_terminal() {
    use std::io::Read;
    let s = setup("nocolour", 1 << 20);
    let port = free_port();
    let mut rx = serve_piped(&s, port, &[], Stdio::null(), Stdio::piped());
    // The port listens a moment before the receiver logs that it serves:
    // wait for that line (or 10 s) before stopping it.
    let mut pipe = rx.stderr.take().unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let reader = {
        let seen = std::sync::Arc::clone(&seen);
        std::thread::spawn(move || {
            let mut chunk = [0u8; 4096];
            while let Ok(n @ 1..) = pipe.read(&mut chunk) {
                seen.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&chunk[..n]));
            }
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !seen.lock().unwrap().contains("serving") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    rx.kill().unwrap();
    rx.wait().unwrap();
    reader.join().unwrap();
    let err = seen.lock().unwrap().clone();
    assert!(err.contains("serving"), "no log line to check: {err:?}");
    assert!(!err.contains('\x1b'), "colour codes in a pipe: {err:?}");
}

/// The receiver's /metrics page on `mport`.
fn scrape(mport: u16) -> String {
    use std::io::{Read, Write};
    let mut c = TcpStream::connect(("127.0.0.1", mport)).unwrap();
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    c.read_to_string(&mut body).unwrap();
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    body
}

/// The value of the sample `name` on a metrics page.
fn metric(body: &str, name: &str) -> f64 {
    body.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing in {body}"))
}

#[test]
fn serve_exposes_prometheus_metrics() {
    let s = setup("metrics", 2 << 20);
    let port = free_port();
    let mport = free_port();
    let _rx = serve_bin(
        &s.root,
        &s.token,
        port,
        &["--metrics-addr", &format!("127.0.0.1:{mport}")],
    );
    let out = send_cmd(port, &s.token, &s.src, "m.bin", &[])
        .output()
        .unwrap();
    assert!(out.status.success());
    let body = scrape(mport);
    let value = |name: &str| metric(&body, name);
    assert_eq!(
        value("wirerate_receiver_bytes_written_total"),
        s.size as f64
    );
    assert_eq!(value("wirerate_receiver_files_completed_total"), 1.0);
    assert_eq!(value("wirerate_receiver_sessions_total"), 1.0);
}

#[test]
fn memory_to_memory_needs_the_receivers_consent_and_writes_nothing() {
    let s = setup("m2m", 1000);
    let synthetic = |port: u16, extra: &[&str]| {
        Command::new(BIN)
            .args(["send", "--to", &format!("127.0.0.1:{port}"), "--quiet"])
            .args([
                "--block-size",
                "1MiB",
                "--streams",
                "3",
                "--synthetic",
                "24MiB",
            ])
            .arg("--token-file")
            .arg(&s.token)
            .args(extra)
            .output()
            .unwrap()
    };
    // Refused by default, for good (not retried), saying how to allow it.
    let port = free_port();
    let rx = serve(&s.root, &s.token, port);
    let out = synthetic(port, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("serve --allow-discard"), "{err}");
    drop(rx);

    let port = free_port();
    let mport = free_port();
    let rx = serve_piped(
        &s,
        port,
        &[
            "--allow-discard",
            "--json",
            "--metrics-addr",
            &format!("127.0.0.1:{mport}"),
        ],
        Stdio::piped(),
        Stdio::null(),
    );
    let out = synthetic(port, &[]);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{shown}");
    assert!(
        shown.starts_with("memory-to-memory test complete"),
        "{shown}"
    );
    assert!(shown.contains("MEMORY TO MEMORY"), "{shown}");
    let j = json(&synthetic(port, &["--json"]));
    assert_eq!(j["memory_to_memory"], true, "{j}");
    assert_eq!(j["bytes_sent"], 24 << 20, "{j}");
    assert_eq!(j["results"][0]["ok"], true, "{j}");
    assert!(
        j["digest"].as_str().unwrap().starts_with("xxh3-128:"),
        "{j}"
    );
    // Counted apart from what is written to disk.
    let body = scrape(mport);
    assert_eq!(
        metric(&body, "wirerate_receiver_bytes_discarded_total"),
        f64::from(2 * (24 << 20))
    );
    assert_eq!(metric(&body, "wirerate_receiver_bytes_written_total"), 0.0);
    // Nothing to re-read, so refused before connecting.
    let out = synthetic(port, &["--verify", "reread"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--verify checksums"));

    let printed = stop_and_read(rx);
    let sessions: Vec<serde_json::Value> = printed
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(sessions.len(), 2, "{printed}");
    for v in &sessions {
        assert_eq!(v["outcome"], "complete", "{v}");
        assert_eq!(v["memory_to_memory"], true, "{v}");
        assert_eq!(v["bytes_written"], 24 << 20, "{v}");
    }
    // Dropped, not written: not a file, a temporary or a checkpoint.
    let left: Vec<_> = std::fs::read_dir(&s.root).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
    // A test the plan refuses (past the block cap: 5 GiB in 4 KiB blocks)
    // fails at the sender, but is no file failed at the receiver.
    let (port, mport) = (free_port(), free_port());
    let _rx = Proc(serve_piped(
        &s,
        port,
        &[
            "--allow-discard",
            "--metrics-addr",
            &format!("127.0.0.1:{mport}"),
        ],
        Stdio::null(),
        Stdio::null(),
    ));
    let out = Command::new(BIN)
        .args(["send", "--to", &format!("127.0.0.1:{port}"), "--quiet"])
        .args([
            "--block-size",
            "4KiB",
            "--synthetic",
            "5GiB",
            "--token-file",
        ])
        .arg(&s.token)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let body = scrape(mport);
    assert_eq!(metric(&body, "wirerate_receiver_files_failed_total"), 0.0);
    assert_eq!(
        metric(&body, "wirerate_receiver_files_completed_total"),
        0.0
    );
}

#[test]
fn a_discard_only_receiver_is_probed_but_never_written_to() {
    // A path-test listener's token goes to whoever measures the path; with
    // it they may send generated data to be dropped, and never a file.
    let s = setup("discard-only", 1000);
    let port = free_port();
    let _rx = serve_bin(&s.root, &s.token, port, &["--discard-only"]);
    let out = send_cmd(port, &s.token, &s.src, "kept.bin", &[])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("only memory-to-memory tests"), "{err}");
    let out = Command::new(BIN)
        .args(["probe", "--to", &format!("127.0.0.1:{port}"), "--json"])
        .args(["--streams", "2", "--seconds", "0.5", "--block-size", "1MiB"])
        .arg("--token-file")
        .arg(&s.token)
        .output()
        .unwrap();
    let j = json(&out);
    assert!(j["many"]["bytes"].as_u64().unwrap() > 0, "{j}");
    let left: Vec<_> = std::fs::read_dir(&s.root).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
    // The two consents exclude each other rather than one silently winning.
    let out = Command::new(BIN)
        .args(["serve", "--discard-only", "--allow-discard", "--token-file"])
        .arg(&s.token)
        .arg("--root")
        .arg(&s.root)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be used with"));
}

#[test]
fn probe_reports_each_stream_and_what_to_use() {
    let s = setup("probe", 1000);
    let probe = |port: u16| {
        Command::new(BIN)
            .args(["probe", "--to", &format!("127.0.0.1:{port}"), "--json"])
            .args(["--streams", "3", "--seconds", "0.5", "--block-size", "1MiB"])
            .arg("--token-file")
            .arg(&s.token)
            .output()
            .unwrap()
    };
    // A receiver that does not take memory-to-memory tests says so.
    let port = free_port();
    let rx = serve(&s.root, &s.token, port);
    let out = probe(port);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--allow-discard"));
    drop(rx);

    let port = free_port();
    let _rx = Proc(serve_piped(
        &s,
        port,
        &["--allow-discard"],
        Stdio::null(),
        Stdio::null(),
    ));
    let j = json(&probe(port));
    for (phase, streams) in [("one", 1), ("many", 3)] {
        let p = &j[phase];
        assert_eq!(p["streams"], streams, "{j}");
        assert!(p["gbps"].as_f64().unwrap() > 0.0, "{j}");
        let tcp = p["tcp"].as_array().unwrap();
        assert_eq!(tcp.len(), streams, "{j}");
        for t in tcp {
            assert!(t["rtt_ms"].as_f64().unwrap() > 0.0, "{t}");
            assert!(t["pmtu"].as_u64().unwrap() >= 1280, "{t}");
            assert!(t["send_buffer"].as_u64().unwrap() > 0, "{t}");
        }
    }
    let advice = &j["advice"];
    assert!(
        (1..=6).contains(&advice["streams"].as_u64().unwrap()),
        "{j}"
    );
    assert!(!advice["reasons"].as_array().unwrap().is_empty(), "{j}");
    assert!(advice["socket_buffer"].as_u64().is_some(), "{j}");
    // Dropped, not written.
    assert_eq!(std::fs::read_dir(&s.root).unwrap().count(), 0);
}

#[test]
fn serve_prints_each_sessions_summary_as_json() {
    // The receiver's summary reaches stdout through the engine's observer:
    // the engine itself prints nothing.
    let s = setup("summaries", 3 << 20);
    let port = free_port();
    let rx = serve_piped(&s, port, &["--json"], Stdio::piped(), Stdio::null());
    let out = send_cmd(port, &s.token, &s.src, "s.bin", &[])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = stop_and_read(rx);
    let line = printed
        .lines()
        .next()
        .unwrap_or_else(|| panic!("no summary printed"));
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    assert_eq!(v["outcome"], "complete", "{line}");
    assert_eq!(v["bytes_written"], s.size, "{line}");
    assert_eq!(v["files_ok"], 1, "{line}");
}

#[test]
fn weak_tokens_hopeless_addresses_and_empty_runs_are_said_plainly() {
    use std::os::unix::fs::PermissionsExt;
    let s = setup("plain", 1000);
    let port = free_port();
    let _rx = serve(&s.root, &s.token, port);
    // A token file anyone can read is named, with the fix.
    std::fs::set_permissions(&s.token, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = send_cmd(port, &s.token, &s.src, "w.bin", &[])
        .output()
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("can be read by its group and everyone else") && err.contains("chmod 600"),
        "{err}"
    );
    std::fs::set_permissions(&s.token, std::fs::Permissions::from_mode(0o600)).unwrap();

    // A name that does not resolve is not retried for --retry-for.
    let t0 = Instant::now();
    let out = Command::new(BIN)
        .args([
            "send",
            "--to",
            "no-such-host.invalid:7470",
            "--retry-for",
            "60",
        ])
        .arg("--token-file")
        .arg(&s.token)
        .arg(&s.src)
        .arg("x")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("cannot resolve no-such-host.invalid"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(20), "retried: {err}");

    // A receiver that never answers: retried, then given up, with no
    // promise of a resume when nothing was sent.
    let out = send_cmd(free_port(), &s.token, &s.src, "x", &["--retry-for", "1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("gave up after --retry-for 1 s"), "{err}");
    assert!(!err.contains("resume"), "{err}");

    // A wrong token says so once.
    let wrong = s.root.parent().unwrap().join("wrong-token");
    std::fs::write(&wrong, "not-the-right-token-at-all").unwrap();
    std::fs::set_permissions(&wrong, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = send_cmd(port, &wrong, &s.src, "x", &["--retry-for", "60"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.matches("authentication failed").count(), 1, "{err}");
}

#[test]
fn zero_sizes_are_refused_with_what_to_change() {
    let dir = scratch("zeros");
    for (args, want) in [
        (
            &["demo", "--size", "0"][..],
            "--size must be at least 1 byte",
        ),
        (
            &["demo", "--buffer", "0"][..],
            "bufferSize (--buffer) must be from 8 KiB to 64 GiB; got 0",
        ),
        // These were clamped into range and run with other settings than asked.
        (
            &["demo", "--streams", "300"][..],
            "streams (--streams) must be from 1 to 256; got 300",
        ),
        (
            &["demo", "--queue-depth", "0"][..],
            "queueDepth (--queue-depth) must be from 1 to 4096; got 0",
        ),
    ] {
        let out = Command::new(BIN)
            .args(args)
            .arg("--dir")
            .arg(dir.path())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(
            !err.contains("generating"),
            "{args:?} must fail before any work"
        );
    }
    let s = setup("zeros-serve", 10);
    for (args, want) in [
        (
            &["--buffer", "0"][..],
            "bufferSize (--buffer) must be from 8 KiB to 64 GiB; got 0",
        ),
        // Before, clamped to 1 and 4096 without a word.
        (
            &["--queue-depth", "0"][..],
            "queueDepth (--queue-depth) must be from 1 to 4096; got 0",
        ),
        (
            &["--queue-depth", "5000"][..],
            "queueDepth (--queue-depth) must be from 1 to 4096; got 5000",
        ),
        (
            &["--max-sessions", "0"][..],
            "\"0\" is not a whole number of at least 1",
        ),
    ] {
        let out = Command::new(BIN)
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(args)
            .arg("--root")
            .arg(&s.root)
            .arg("--token-file")
            .arg(&s.token)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}
