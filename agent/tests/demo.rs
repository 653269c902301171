//! `wirerate-agent demo`, the README's first command, as users run it: it
//! must not fill the disk, nor leave its files behind when interrupted.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// Bytes in the regular files beneath `dir`, while a demo may be creating
/// and removing them (so what vanished meanwhile counts as nothing).
fn bytes_beneath(dir: &Path) -> u64 {
    let mut bytes = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => stack.push(e.path()),
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
