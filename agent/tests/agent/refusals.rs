//! Flags that cannot work are refused when the binary starts, with what to
//! change, rather than accepted and failing (or crawling) later: each case
//! was found by an adversarial probe of the release binary.

use std::process::{Command, Output};

use crate::common::*;

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `serve` on a free port with `extra`; it must exit on its own (a
/// refusal), so a receiver that starts anyway is killed after 10 s and
/// reported as such.
fn serve_expecting_refusal(s: &Setup, extra: &[&str]) -> Output {
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", &format!("127.0.0.1:{}", free_port())])
        .args(extra)
        .arg("--root")
        .arg(&s.root)
        .arg("--token-file")
        .arg(&s.token)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > std::time::Duration::from_secs(10) {
            child.kill().unwrap();
            let out = child.wait_with_output().unwrap();
            panic!(
                "serve {extra:?} started instead of refusing: {}",
                stderr(&out)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

// It used to log "serving", then drop every connection with a warning
// (the sender saw "failed to fill whole buffer").
#[test]
fn serve_refuses_a_congestion_control_the_kernel_lacks_at_start() {
    let available = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control")
        .expect("this test needs the kernel's list of congestion controls");
    assert!(!available.trim().is_empty(), "the kernel lists none");
    let s = setup("cc-serve", 10);
    let out = serve_expecting_refusal(&s, &["--congestion", "nosuch"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("congestion control \"nosuch\" is not available; available: "),
        "{err}"
    );
    assert!(!err.contains("serving"), "{err}");
}

// `--socket-buffer 0` or `1` was taken and ran at 0.01 Gbit/s.
#[test]
fn socket_buffers_below_the_least_are_refused_by_every_command() {
    let want = "socketBuffer (--socket-buffer) must be from 64 KiB to 1 GiB; got ";
    let s = setup("sockbuf", 10);
    for b in ["0", "1", "4GiB"] {
        let out = serve_expecting_refusal(&s, &["--socket-buffer", b]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "serve {b}: {err}");
        assert!(err.contains(want), "serve {b}: {err}");
        // The message once, not again as its own cause.
        assert_eq!(err.matches(want).count(), 1, "serve {b}: {err}");
    }
    // Nothing listens on the port: the refusal comes before any connect.
    let port = free_port().to_string();
    let to = format!("127.0.0.1:{port}");
    for args in [
        vec![
            "send",
            "--to",
            &to,
            "--socket-buffer",
            "1",
            "--retry-for",
            "0",
        ],
        vec!["probe", "--to", &to, "--socket-buffer", "1"],
    ] {
        let mut c = Command::new(BIN);
        c.args(&args).arg("--token-file").arg(&s.token);
        if args[0] == "send" {
            c.arg(&s.src).arg("x");
        }
        let out = c.output().unwrap();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!err.contains("connecting to"), "{args:?}: {err}");
    }
}

// A reviewer found: `--retry-for 1e300` and `--idle-timeout 1e300` passed
// the "finite" check and panicked converting to a duration (exit 101).
#[test]
fn durations_past_a_year_are_refused_not_a_panic() {
    let s = setup("huge-seconds", 10);
    let out = serve_expecting_refusal(&s, &["--idle-timeout", "1e300"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("is not a number of seconds from 0 to"),
        "{err}"
    );
    let out = Command::new(BIN)
        .args(["send", "--to", "127.0.0.1:9", "--retry-for", "1e300"])
        .arg("--token-file")
        .arg(&s.token)
        .arg(&s.src)
        .arg("x.bin")
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--retry-for"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
