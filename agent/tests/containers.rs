//! The images `deploy/build-images` builds, run as real containers on a
//! Docker network this test creates, the way a pod runs them: all
//! capabilities dropped but IPC_LOCK and NET_ADMIN, a read-only root
//! filesystem, data on volumes.
//! - both images answer `--version` and carry their labels;
//! - a transfer between two agent containers lands byte-identical, under the
//!   runtime's default seccomp profile (io_uring refused: the agent says it
//!   is seccomp, names the profile that allows it, and uses direct I/O) and
//!   under `deploy/seccomp/wirerate-agent.json` (io_uring in effect);
//! - a receiving container killed mid-way and started again: the sender
//!   reconnects, the receiver resumes from its checkpoint, the file is
//!   identical.
//!
//! Needs a running Docker daemon (every machine of the project has one; CI
//! runs as root). The images are built first when missing or stale: a
//! static release build, minutes the first time. Nothing is pulled.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::{assert_same, scratch, write_file};

const TOKEN: &str = "c0ntainer-test-t0ken-0123456789abcdef0123456789abcdef";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The images of this checkout, built once per test run.
struct Images {
    version: String,
    agent: String,
    operator: String,
}

fn images() -> &'static Images {
    static IMAGES: OnceLock<Images> = OnceLock::new();
    IMAGES.get_or_init(|| {
        let script = repo().join("deploy/build-images");
        let out = Command::new(&script)
            .stdin(Stdio::null())
            .output()
            .expect("running deploy/build-images");
        assert!(
            out.status.success(),
            "deploy/build-images failed (this test needs Docker):\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        eprint!("{}", String::from_utf8_lossy(&out.stdout));
        let tags = Command::new(&script).arg("--tags").output().unwrap();
        let tags = String::from_utf8(tags.stdout).unwrap();
        let field = |k: &str| {
            tags.lines()
                .find_map(|l| l.strip_prefix(&format!("{k}=")))
                .unwrap_or_else(|| panic!("no {k} in {tags}"))
                .to_owned()
        };
        let revision = field("revision");
        Images {
            version: field("version"),
            agent: format!("wirerate-agent:{revision}"),
            operator: format!("wirerate-operator:{revision}"),
        }
    })
}

/// The variables cargo sets for a test process, which a shell running
/// `deploy/build-images` does not have.
fn set_by_cargo_for_tests(name: &str) -> bool {
    ["CARGO_PKG_", "CARGO_MANIFEST_"]
        .iter()
        .any(|p| name.starts_with(p))
        || [
            "CARGO_CRATE_NAME",
            "CARGO_PRIMARY_PACKAGE",
            "CARGO_TARGET_TMPDIR",
            "CARGO_BIN_NAME",
            "OUT_DIR",
        ]
        .contains(&name)
}

// issue 33: run from this test, cargo's variables for it
// (CARGO_MANIFEST_DIR first) reached the static build, whose fingerprints
// track them (ring's build script): the test rebuilt the whole release
// tree, 140 s, that CI's own step had built just before. Run as a shell
// runs it, right after the test's own run, the script compiles nothing.
#[test]
fn the_images_build_is_the_same_from_a_test_as_from_a_shell() {
    images();
    let mut c = Command::new(repo().join("deploy/build-images"));
    for (name, _) in std::env::vars_os() {
        if name.to_str().is_some_and(set_by_cargo_for_tests) {
            c.env_remove(name);
        }
    }
    let out = c
        .stdin(Stdio::null())
        .output()
        .expect("running deploy/build-images");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "deploy/build-images failed:\n{err}");
    assert!(
        !err.contains("Compiling "),
        "deploy/build-images, run as a shell runs it, rebuilt what it had just built from this test:\n{err}"
    );
}

fn docker(args: &[&str]) -> Output {
    Command::new("docker")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running docker")
}

/// Runs docker; panics with its output unless it succeeded; returns stdout.
fn docker_ok(args: &[&str]) -> String {
    let out = docker(args);
    assert!(
        out.status.success(),
        "docker {} failed: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A network and the containers on it, removed however the test ends.
struct Lab {
    network: String,
    containers: Vec<String>,
}

impl Lab {
    fn new(name: &str) -> Self {
        let network = format!("wirerate-test-{name}-{}", std::process::id());
        let _ = docker(&["network", "rm", &network]);
        docker_ok(&["network", "create", &network]);
        Self {
            network,
            containers: Vec::new(),
        }
    }

    fn name(&mut self, role: &str) -> String {
        let name = format!("{}-{role}", self.network);
        let _ = docker(&["rm", "-f", &name]);
        self.containers.push(name.clone());
        name
    }

    /// The options every agent container runs with, as in a DtnPool's pod.
    fn pod_like(&self, profile: Seccomp) -> Vec<String> {
        let mut o: Vec<String> = [
            "--network",
            &self.network,
            "--cap-drop",
            "ALL",
            "--cap-add",
            "IPC_LOCK",
            "--cap-add",
            "NET_ADMIN",
            "--read-only",
            "-e",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        o.push(format!("WIRERATE_TOKEN={TOKEN}"));
        let p = match profile {
            Seccomp::RuntimeDefault => runtime_default_profile(),
            Seccomp::Project => repo().join("deploy/seccomp/wirerate-agent.json"),
        };
        o.push("--security-opt".into());
        o.push(format!("seccomp={}", p.display()));
        o
    }

    /// Starts a receiver container serving `dir`.
    fn receiver(&mut self, dir: &Path, profile: Seccomp) -> String {
        let name = self.name("rx");
        let mut args: Vec<String> = vec!["run".into(), "-d".into(), "--name".into(), name.clone()];
        args.extend(self.pod_like(profile));
        args.extend([
            "-v".into(),
            format!("{}:/data", dir.display()),
            images().agent.clone(),
            "serve".into(),
            "--root".into(),
            "/data".into(),
            "--listen".into(),
            "0.0.0.0:7470".into(),
            "--buffer".into(),
            "64MiB".into(),
            "--json".into(),
        ]);
        docker_ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
        name
    }

    /// The sender's `docker run` command line, sending /src/`file` to `rx`.
    fn sender(
        &mut self,
        src: &Path,
        file: &str,
        rx: &str,
        profile: Seccomp,
        extra: &[&str],
    ) -> Command {
        let name = self.name("tx");
        let mut c = Command::new("docker");
        c.args(["run", "--rm", "--name", &name])
            .args(self.pod_like(profile))
            .arg("-v")
            .arg(format!("{}:/src:ro", src.display()))
            .arg(&images().agent)
            .args(["send", "--to", &format!("{rx}:7470")])
            .arg(format!("/src/{file}"))
            .arg(file)
            .args(["--json", "--quiet", "--buffer", "64MiB"])
            .args(extra)
            .stdin(Stdio::null());
        c
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for c in &self.containers {
            let _ = docker(&["rm", "-f", c]);
        }
        let _ = docker(&["network", "rm", &self.network]);
    }
}

#[derive(Clone, Copy)]
enum Seccomp {
    /// The runtimes' default profile as Docker Engine 25+ and containerd
    /// ship it, which denies io_uring (what a pod gets with RuntimeDefault).
    /// It is passed as a file: the Docker Engine of Debian 12 (20.10)
    /// predates that change, and its built-in default still allows io_uring.
    RuntimeDefault,
    /// deploy/seccomp/wirerate-agent.json.
    Project,
}

/// The project's profile without its io_uring rule: the runtime default it
/// was made from (tests/seccomp_profile.rs checks that this is exact).
fn runtime_default_profile() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let ours =
            std::fs::read_to_string(repo().join("deploy/seccomp/wirerate-agent.json")).unwrap();
        let mut p: serde_json::Value = serde_json::from_str(&ours).unwrap();
        p["syscalls"]
            .as_array_mut()
            .unwrap()
            .retain(|r| !r["names"].to_string().contains("io_uring"));
        let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("runtime-default-seccomp.json");
        std::fs::write(&path, serde_json::to_vec_pretty(&p).unwrap()).unwrap();
        path
    })
    .clone()
}

/// The JSON summaries the receiver container printed, one per session.
fn receiver_summaries(rx: &str) -> Vec<serde_json::Value> {
    docker_ok(&["logs", rx])
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn wait_for_summary(rx: &str, pred: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let start = Instant::now();
    loop {
        if let Some(s) = receiver_summaries(rx).into_iter().find(|s| pred(s)) {
            return s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no such receiver summary; its log:\n{}",
            String::from_utf8_lossy(&docker(&["logs", rx]).stderr)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn both_images_answer_their_version_and_carry_their_labels() {
    let im = images();
    for (image, name) in [
        (&im.agent, "wirerate-agent"),
        (&im.operator, "wirerate-operator"),
    ] {
        let out = docker_ok(&["run", "--rm", image, "--version"]);
        assert_eq!(out.trim(), format!("{name} {}", im.version), "{image}");
        let labels = docker_ok(&[
            "image",
            "inspect",
            "--format",
            "{{json .Config.Labels}}",
            image,
        ]);
        let labels: serde_json::Value = serde_json::from_str(&labels).unwrap();
        assert_eq!(
            labels["org.opencontainers.image.version"],
            im.version.as_str()
        );
        let revision = image.rsplit(':').next().unwrap();
        assert_eq!(labels["org.opencontainers.image.revision"], revision);
        assert_eq!(labels["org.opencontainers.image.title"], name);
    }
    let user = docker_ok(&[
        "image",
        "inspect",
        "--format",
        "{{.Config.User}}",
        &im.operator,
    ]);
    assert_eq!(
        user.trim(),
        "65532:65532",
        "the operator runs as a non-root user"
    );
    let who = docker_ok(&[
        "run",
        "--rm",
        "--read-only",
        "--cap-drop",
        "ALL",
        &im.operator,
        "--help",
    ]);
    assert!(who.contains("Usage"), "{who}");
}

/// A transfer between two agent containers; returns the summaries of
/// sender and receiver.
fn transfer(profile: Seccomp, tag: &str) -> (serde_json::Value, serde_json::Value) {
    let dir = scratch(&format!("containers-{tag}"));
    let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(&dst).unwrap();
    write_file(&src.join("scan.h5"), 48 * (1 << 20) + 4321, 3);
    let mut lab = Lab::new(tag);
    let rx = lab.receiver(&dst, profile);
    let out = lab
        .sender(&src, "scan.h5", &rx, profile, &[])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the sender container failed: {}\n{}\nreceiver: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&docker(&["logs", &rx]).stderr)
    );
    let sent: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("the sender's JSON summary");
    assert_eq!(sent["ok"], true, "{sent}");
    assert_same(&src.join("scan.h5"), &dst.join("scan.h5"));
    let got = wait_for_summary(&rx, |s| s["outcome"] == "complete");
    (sent, got)
}

#[test]
fn under_the_runtimes_default_seccomp_profile_the_agents_say_why_and_use_direct_io() {
    let (sent, got) = transfer(Seccomp::RuntimeDefault, "default");
    for (side, s) in [("sender", &sent), ("receiver", &got)] {
        assert_eq!(s["io_mode"], "direct", "{side}: {s}");
        let why = s["io_fallback"].as_str().unwrap_or_default();
        assert!(
            why.contains("blocked by seccomp")
                && why.contains("deploy/seccomp/wirerate-agent.json"),
            "{side} does not say why io_uring is off, or how to allow it: {why:?}"
        );
    }
}

#[test]
fn under_the_projects_seccomp_profile_io_uring_is_in_effect() {
    let (sent, got) = transfer(Seccomp::Project, "profile");
    for (side, s) in [("sender", &sent), ("receiver", &got)] {
        assert_eq!(s["io_mode"], "async", "{side}: {s}");
        assert!(s["io_fallback"].is_null(), "{side}: {s}");
    }
}

#[test]
fn a_receiving_container_killed_mid_way_and_started_again_resumes() {
    let dir = scratch("containers-kill");
    let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(&dst).unwrap();
    let size = 128 * (1 << 20) + 17;
    write_file(&src.join("run.dat"), size, 5);
    let mut lab = Lab::new("kill");
    let rx = lab.receiver(&dst, Seccomp::Project);
    // 400 Mbit/s: about 2.7 s, time to kill it after its first checkpoint.
    let sender = lab
        .sender(
            &src,
            "run.dat",
            &rx,
            Seccomp::Project,
            &["--max-rate", "400Mbps", "--block-size", "4MiB"],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let ckpt = dst.join(".run.dat.wirerate-ckpt");
    let start = Instant::now();
    while !ckpt.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no checkpoint appeared"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    docker_ok(&["kill", &rx]);
    assert!(
        !dst.join("run.dat").exists(),
        "the file was published before the kill: the test killed nothing"
    );
    std::thread::sleep(Duration::from_millis(500));
    docker_ok(&["start", &rx]);
    let out = sender.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the sender gave up: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let sent: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(sent["ok"], true, "{sent}");
    assert!(
        sent["sessions"].as_u64().unwrap() >= 2,
        "it never reconnected: {sent}"
    );
    assert_same(&src.join("run.dat"), &dst.join("run.dat"));
    // The restarted receiver resumed from the checkpoint.
    let got = wait_for_summary(&rx, |s| s["outcome"] == "complete");
    assert!(
        got["bytes_skipped_resume"].as_u64().unwrap() > 0,
        "the restarted receiver resumed nothing: {got}"
    );
    assert!(!ckpt.exists(), "the checkpoint outlived the published file");
}
