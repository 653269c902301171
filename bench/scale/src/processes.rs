//! Real agents: `wirerate-agent run` processes on loopback in place of the
//! simulated ones, each renewing its own Lease, reporting to the API server
//! and moving real bytes between the two pools' directories under the
//! bench's output directory. The Transfers' sources are hard links to one
//! file, so 1,000 of them cost one file's space, and each is paced
//! (`maxRateMbps`) so that it is still running when the slots are counted.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::Context as _;
use tokio::process::{Child, Command};

use crate::scenario::{POOL_NAMESPACE, Scenario};

/// Data ports each agent may bind, from its first: one per Transfer it
/// receives at once, with room to spare.
const PORTS_PER_AGENT: u16 = 8;
/// The first agent's first data port.
const FIRST_PORT: u16 = 21000;

/// The agents' processes, killed when dropped.
pub(crate) struct Running {
    children: Vec<(String, Child)>,
    logs: PathBuf,
}

impl Running {
    /// Agents that have exited, with how, and the end of each one's log.
    pub(crate) fn exited(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        for (name, child) in &mut self.children {
            if let Ok(Some(status)) = child.try_wait() {
                let log = std::fs::read_to_string(self.logs.join(format!("{name}.log")))
                    .unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(3).collect();
                out.push(format!("{name}: {status}: {}", tail.join(" | ")));
            }
        }
        out
    }

    /// The agents' pids, for their CPU.
    pub(crate) fn pids(&self) -> Vec<u32> {
        self.children.iter().filter_map(|(_, c)| c.id()).collect()
    }
}

/// Creates every Transfer's source under its pool's root: one file of
/// `size` bytes, hard-linked to each path.
pub(crate) fn make_sources(s: &Scenario, size: u64) -> anyhow::Result<()> {
    let data = Path::new(&s.data_root);
    std::fs::create_dir_all(data)?;
    let original = data.join("source.bin");
    if std::fs::metadata(&original).map(|m| m.len()).ok() != Some(size) {
        let _ = std::fs::remove_file(&original);
        write_pattern(&original, size)?;
    }
    for i in 0..s.transfers {
        let src = PathBuf::from(s.source_path(i));
        let dir = src.parent().context("a source has a parent")?;
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        if !src.exists() {
            std::fs::hard_link(&original, &src)
                .with_context(|| format!("cannot link {}", src.display()))?;
        }
    }
    Ok(())
}

/// `size` bytes that compress badly and differ block to block.
fn write_pattern(path: &Path, size: u64) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut f = std::io::BufWriter::new(File::create(path)?);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut left = size;
    while left > 0 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let n = left.min(8) as usize;
        f.write_all(&x.to_le_bytes()[..n])?;
        left -= n as u64;
    }
    f.flush()?;
    Ok(())
}

/// Starts one `wirerate-agent run` per agent of the scenario.
pub(crate) fn start(
    binary: &Path,
    s: &Scenario,
    kubeconfig: &Path,
    logs: &Path,
) -> anyhow::Result<Running> {
    std::fs::create_dir_all(logs)?;
    let mut running = Running {
        children: Vec::new(),
        logs: logs.to_owned(),
    };
    let watch = s.user_namespaces().join(",");
    for agent in s.agents() {
        let port = u16::try_from(agent.index)
            .ok()
            .and_then(|i| i.checked_mul(PORTS_PER_AGENT))
            .and_then(|p| p.checked_add(FIRST_PORT))
            .context("too many agents for the data ports")?;
        let log = File::create(logs.join(format!("{}.log", agent.name)))?;
        let child = Command::new(binary)
            .args([
                "run",
                "--agent-name",
                &agent.name,
                "--namespace",
                POOL_NAMESPACE,
            ])
            .args(["--pool", &agent.pool, "--advertise", "127.0.0.1"])
            .args(["--data-port", &port.to_string(), "--metrics-port", "0"])
            .args(["--max-transfers", &s.capacity.to_string()])
            .args(["--watch-namespaces", &watch])
            .env("KUBECONFIG", kubeconfig)
            .env("WIRERATE_NODE", format!("dtn-{:03}", agent.index))
            .env("RUST_LOG", "warn")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {}", binary.display()))?;
        running.children.push((agent.name, child));
    }
    Ok(running)
}
