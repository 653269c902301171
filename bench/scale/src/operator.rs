//! The operator under test, as a child process: started with a kubeconfig,
//! its log in a file, killed (`SIGKILL`) and restarted on demand, and read
//! from outside: CPU and memory from /proc, figures from its /metrics.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};

use anyhow::Context as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

/// How to start it.
#[derive(Clone, Debug)]
pub(crate) struct Launch {
    pub(crate) binary: PathBuf,
    pub(crate) kubeconfig: PathBuf,
    /// Namespace of its leader Lease.
    pub(crate) namespace: String,
    pub(crate) log: PathBuf,
}

/// The running operator.
pub(crate) struct Operator {
    launch: Launch,
    metrics_port: u16,
    child: Child,
    /// Times it was started.
    pub(crate) starts: usize,
}

/// A port nobody listens on now (the operator binds it a moment later).
fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn spawn(l: &Launch, port: u16) -> anyhow::Result<Child> {
    let log = File::options()
        .create(true)
        .append(true)
        .open(&l.log)
        .with_context(|| format!("cannot open {}", l.log.display()))?;
    Command::new(&l.binary)
        .args(["--namespace", &l.namespace, "--identity", "bench"])
        .arg("--metrics-addr")
        .arg(format!("127.0.0.1:{port}"))
        .env("KUBECONFIG", &l.kubeconfig)
        .env("RUST_LOG", "info,kube=warn")
        // Never the cluster the bench itself might run in.
        .env_remove("KUBERNETES_SERVICE_HOST")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start {}", l.binary.display()))
}

impl Operator {
    /// Starts the operator.
    pub(crate) fn start(launch: Launch) -> anyhow::Result<Self> {
        let metrics_port = free_port()?;
        let child = spawn(&launch, metrics_port)?;
        Ok(Self {
            launch,
            metrics_port,
            child,
            starts: 1,
        })
    }

    /// Its process id.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Its exit status, if it has exited.
    pub(crate) fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// `kill -9`, then a new process with the same identity.
    pub(crate) async fn kill_and_restart(&mut self) -> anyhow::Result<()> {
        self.stop().await;
        self.child = spawn(&self.launch, self.metrics_port)?;
        self.starts += 1;
        Ok(())
    }

    /// `kill -9` and reap.
    pub(crate) async fn stop(&mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }

    /// utime + stime in seconds.
    pub(crate) fn cpu_seconds(&self) -> Option<f64> {
        self.pid()
            .and_then(|p| cpu_seconds(&format!("/proc/{p}/stat")))
    }

    /// (VmRSS, VmHWM) in KiB.
    pub(crate) fn memory_kib(&self) -> Option<(u64, u64)> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()?)).ok()?;
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        };
        Some((field("VmRSS:")?, field("VmHWM:")?))
    }

    /// Its Prometheus text, or None while it does not answer.
    pub(crate) async fn metrics(&self) -> Option<String> {
        let mut sock = tokio::net::TcpStream::connect(("127.0.0.1", self.metrics_port))
            .await
            .ok()?;
        sock.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .await
            .ok()?;
        let mut raw = Vec::new();
        tokio::time::timeout(
            std::time::Duration::from_secs(5),
            sock.read_to_end(&mut raw),
        )
        .await
        .ok()?
        .ok()?;
        ok_body(&String::from_utf8_lossy(&raw)).map(str::to_owned)
    }
}

/// The body of an HTTP response whose status is 200. The request is
/// HTTP/1.0 and hyper answers in the request's version: a check for
/// "HTTP/1.1 200" never matched, and the bench reported no reconciles.
fn ok_body(response: &str) -> Option<&str> {
    let (head, body) = response.split_once("\r\n\r\n")?;
    let status = head.lines().next()?;
    (status.starts_with("HTTP/1.") && status.split_whitespace().nth(1) == Some("200"))
        .then_some(body)
}

/// Clock ticks per second of /proc's CPU times.
fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// utime + stime, in seconds, from a `/proc/<pid>/stat` file.
/// CPU seconds of all of `pids` together; None when there are none, or
/// one has gone.
pub(crate) fn cpu_of(pids: &[u32]) -> Option<f64> {
    if pids.is_empty() {
        return None;
    }
    pids.iter()
        .map(|p| cpu_seconds(&format!("/proc/{p}/stat")))
        .sum()
}

pub(crate) fn cpu_seconds(stat: &str) -> Option<f64> {
    let text = std::fs::read_to_string(Path::new(stat)).ok()?;
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let fields: Vec<&str> = text.rsplit_once(')')?.1.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / clock_ticks())
}

#[cfg(test)]
mod tests {
    use super::ok_body;

    #[test]
    fn a_200_in_either_http_1_version_is_read_and_an_error_is_not() {
        let body = "wirerate_operator_reconciles_total{controller=\"transfer\"} 3\n";
        assert_eq!(
            ok_body(&format!(
                "HTTP/1.0 200 OK\r\ncontent-length: 1\r\n\r\n{body}"
            )),
            Some(body)
        );
        assert_eq!(
            ok_body(&format!("HTTP/1.1 200 OK\r\n\r\n{body}")),
            Some(body)
        );
        assert_eq!(
            ok_body("HTTP/1.0 503 Service Unavailable\r\n\r\nnot ready"),
            None
        );
        assert_eq!(ok_body("HTTP/1.0 200 OK"), None);
    }
}
