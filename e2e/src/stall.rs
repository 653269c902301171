//! An agent that renews its Lease but lands nothing: its storage hangs.
//! Here the receiving agent's writer thread is frozen (a cgroup v1 freezer
//! holding that one thread), so its Lease, its control connection and its
//! keepalives carry on while no byte reaches the disk, as on a hung mount.
//! Past spec.stallTimeoutSeconds the operator replaces both agents (reason
//! Stalled); the new pair resumes from the checkpoint and the file lands
//! identical; the stuck agent, thawed, spoils nothing.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use kube::api::{Api, DeleteParams, PostParams};
use wirerate_crds::{Transfer, TransferPhase};

use crate::{Procs, same_file, spawn_agents, transfer, wait_for};

/// Threads of process `pid` named `name`, frozen until dropped.
struct Frozen {
    cgroup: PathBuf,
}

impl Frozen {
    fn threads(pid: u32, name: &str) -> Result<Self> {
        let root = Path::new("/sys/fs/cgroup/freezer");
        ensure!(
            root.join("tasks").exists(),
            "this scenario freezes one thread through the cgroup v1 freezer, and {} is not there",
            root.display()
        );
        let cgroup = root.join(format!("wirerate-e2e-{pid}"));
        std::fs::create_dir_all(&cgroup)?;
        let frozen = Self { cgroup };
        let mut moved = 0;
        for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
            let task = task?.path();
            let comm = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
            if comm.trim() == name {
                let tid = task
                    .file_name()
                    .context("a tid")?
                    .to_string_lossy()
                    .to_string();
                std::fs::write(frozen.cgroup.join("tasks"), &tid)?;
                moved += 1;
            }
        }
        ensure!(moved > 0, "process {pid} has no thread named {name}");
        std::fs::write(frozen.cgroup.join("freezer.state"), "FROZEN")?;
        println!("  froze {moved} '{name}' thread(s) of pid {pid}");
        Ok(frozen)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = std::fs::write(self.cgroup.join("freezer.state"), "THAWED");
        // The threads go back to the root cgroup, then the empty one goes.
        if let Ok(tasks) = std::fs::read_to_string(self.cgroup.join("tasks")) {
            for tid in tasks.lines() {
                let _ = std::fs::write("/sys/fs/cgroup/freezer/tasks", tid);
            }
        }
        let _ = std::fs::remove_dir(&self.cgroup);
    }
}

/// Runs the scenario: `file` is the 1 GiB source, `dst` the receivers' root.
pub async fn stuck_receiver_is_replaced(
    transfers: &Api<Transfer>,
    ns: &str,
    kubeconfig: &str,
    procs: &mut Procs,
    file: &Path,
    dst: &Path,
    logs: &Path,
) -> Result<()> {
    println!("== transfer 3: the receiving agent's storage hangs (its Lease stays current)");
    // Both agents are replaced on a stall, so each pool needs another live
    // one (recv-a was killed in transfer 2).
    let agents = [("send-b", "senders", 18000), ("recv-c", "receivers", 18400)];
    spawn_agents(procs, ns, kubeconfig, logs, &agents)?;
    let out = dst.join("run-1-stalled.dat");
    // Slow enough that the receiver is still writing after the report
    // that shows 20% (reports come at most every 5 s): at 1,500 Mbit/s the
    // 1 GiB was nearly over by then, and the writer thread gone.
    let mut t = transfer("three", file, &out, Some(400));
    t.spec.stall_timeout_seconds = 30;
    transfers.create(&PostParams::default(), &t).await?;
    let t = wait_for(
        transfers,
        "three",
        "20% progress",
        Duration::from_secs(300),
        |t| {
            t.status
                .as_ref()
                .and_then(|s| s.progress.as_ref())
                .is_some_and(|p| {
                    p.bytes_total > 0 && p.bytes_done * 5 >= p.bytes_total && p.attempt == 1
                })
        },
    )
    .await?;
    let victim = t
        .status
        .as_ref()
        .and_then(|s| s.receiver.clone())
        .context("no receiver")?
        .name;
    let pid = procs
        .pid(&victim)
        .context("the receiving agent's process")?;
    let frozen = Frozen::threads(pid, "writer")?;
    let t = wait_for(
        transfers,
        "three",
        "a Stalled failover",
        Duration::from_secs(180),
        |t| {
            t.status
                .as_ref()
                .is_some_and(|s| s.failovers.iter().any(|f| f.reason.starts_with("Stalled")))
        },
    )
    .await?;
    let s = t.status.unwrap_or_default();
    // Both agents replaced at once: one entry per side, one attempt (one
    // failover against spec.maxFailovers).
    let sides: Vec<(i32, &str)> = s
        .failovers
        .iter()
        .map(|f| (f.attempt, f.agent.as_str()))
        .collect();
    ensure!(
        s.failovers.len() == 2 && s.failovers.iter().all(|f| f.attempt == 1),
        "expected both agents of attempt 1 replaced: {sides:?}"
    );
    ensure!(
        s.failovers.iter().any(|f| f.agent == victim),
        "the stuck receiver {victim} is not among those replaced: {sides:?}"
    );
    let stuck_sender = s
        .failovers
        .iter()
        .find(|f| f.agent != victim)
        .map(|f| f.agent.clone())
        .unwrap_or_default();
    let t = wait_for(
        transfers,
        "three",
        "success after the stall",
        Duration::from_secs(600),
        |t| t.status.as_ref().and_then(|s| s.phase) == Some(TransferPhase::Succeeded),
    )
    .await?;
    let s = t.status.unwrap_or_default();
    let receiver = s.receiver.context("no receiver")?.name;
    let sender = s.sender.context("no sender")?.name;
    // Found here: the replacements were the very agents just replaced.
    ensure!(
        receiver != victim && sender != stuck_sender,
        "attempt {} went back to the stuck agents ({sender} to {receiver})",
        s.attempt
    );
    ensure!(
        same_file(file, &out)?,
        "transfer three: {} differs from {}",
        out.display(),
        file.display()
    );
    println!("  identical on {receiver}; thawing {victim}");
    drop(frozen);
    // The stuck agent wakes to find its transfer gone: it must not touch
    // what the new receiver published.
    tokio::time::sleep(Duration::from_secs(10)).await;
    ensure!(
        same_file(file, &out)?,
        "the thawed agent changed {}",
        out.display()
    );
    let stray: Vec<String> = std::fs::read_dir(dst)?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.contains("run-1-stalled") && n != "run-1-stalled.dat")
        .collect();
    ensure!(stray.is_empty(), "left behind: {stray:?}");
    println!("  the thawed agent left it alone");
    transfers.delete("three", &DeleteParams::default()).await?;
    procs.kill("send-b");
    procs.kill("recv-c");
    Ok(())
}
