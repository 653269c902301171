//! `wirerate-agent demo`, the README's first command, as users run it: it
//! must not fill the disk, nor leave its files behind when interrupted.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

/// Bytes in the regular files beneath `dir`, while a demo may be creating
/// and removing them (so what vanished meanwhile counts as nothing).
fn bytes_beneath(dir: &Path) -> u64 {
    bytes_beneath_in(dir, |_| true)
}

/// Bytes in the regular files beneath `dir` whose directory `within` takes.
fn bytes_beneath_in(dir: &Path, within: impl Fn(&Path) -> bool) -> u64 {
    let mut bytes = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => stack.push(e.path()),
                Ok(_) if !within(&d) => {}
                Ok(m) => bytes += m.len(),
                Err(_) => {}
            }
        }
    }
    bytes
}

fn demo(dir: &Path, size: &str) -> Child {
    Command::new(BIN)
        .args(["demo", "--json", "--size", size, "--dir"])
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn stderr_of(child: Child) -> (Option<i32>, String) {
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Waits until `child` exits, or fails the test (killing it) once it has
/// written anything beneath `dir` or 30 s have passed.
fn wait_without_writing(mut child: Child, dir: &Path) -> (Option<i32>, String) {
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        let written = bytes_beneath(dir);
        if written > 0 || t0.elapsed() > Duration::from_secs(30) {
            child.kill().unwrap();
            let (_, err) = stderr_of(child);
            panic!("the demo ran and wrote {written} bytes instead of refusing: {err}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    stderr_of(child)
}

// `demo --size 1TiB` wrote 25 GB until the disk was full.
#[test]
fn a_demo_larger_than_the_free_space_is_refused_before_writing() {
    let dir = scratch("demo-space");
    let st = rustix::fs::statvfs(dir.path()).unwrap();
    let free = st.f_bavail * st.f_frsize;
    // The file alone fits; with its copy it does not. And one no disk holds.
    for size in [free.to_string(), "1024TiB".to_string()] {
        let (code, err) = wait_without_writing(demo(dir.path(), &size), dir.path());
        assert_eq!(code, Some(2), "--size {size}: {err}");
        assert!(err.contains("the demo needs "), "--size {size}: {err}");
        assert!(
            err.contains(&format!("free in {}", dir.path().display())),
            "--size {size}: {err}"
        );
        assert!(err.contains("but only "), "--size {size}: {err}");
        assert!(err.contains("--dir"), "--size {size}: {err}");
        assert!(!err.contains("generating"), "--size {size}: {err}");
        assert_eq!(walk(dir.path()), Vec::<std::path::PathBuf>::new());
    }
}

// Ctrl-C or SIGTERM 3 s into a 2 GiB demo left 2.1 GB behind.
#[test]
fn an_interrupted_demo_removes_its_files_and_exits_as_the_signal_says() {
    use rustix::process::{Pid, Signal, kill_process};
    // SIGINT while it generates its file; SIGTERM once the transfer
    // writes, when the receiver's threads create files there too.
    for (signal, code, within) in [(Signal::INT, 130, None), (Signal::TERM, 143, Some("dst"))] {
        let dir = scratch("demo-signal");
        let mut child = demo(dir.path(), "512MiB");
        let t0 = Instant::now();
        while bytes_beneath_in(dir.path(), |d| within.is_none_or(|w| d.ends_with(w))) == 0 {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "{signal:?}: the demo wrote nothing there in 60 s"
            );
            assert!(
                child.try_wait().unwrap().is_none(),
                "{signal:?}: the demo ended before it was signalled"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let pid = Pid::from_child(&child);
        kill_process(pid, signal).unwrap();
        let (got, err) = stderr_of(child);
        assert_eq!(got, Some(code), "{signal:?}: {err}");
        assert!(err.contains("interrupted: removing"), "{signal:?}: {err}");
        assert_eq!(
            walk(dir.path()),
            Vec::<std::path::PathBuf>::new(),
            "{signal:?} left files: {err}"
        );
    }
}
