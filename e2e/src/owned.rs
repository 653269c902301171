//! Data that belongs to a user, not to root: an agent that runs as someone
//! else says so in its pool's status and fails a Transfer at once, naming
//! the uid it runs as; an agent running as the data's owner moves it.
//! (In a cluster, the pool's spec.securityContext sets the uid; here the
//! agents are local processes started through setpriv.)

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use kube::Client;
use kube::api::{Api, PostParams};
use wirerate_crds::conditions::{self, types};
use wirerate_crds::{DtnPool, Transfer, TransferPhase};

use crate::{Procs, bin, pool, same_file, spawn, transfer, wait_for, write_random};

/// The uid that owns the data, and one that does not.
const OWNER: u32 = 1000;
const STRANGER: u32 = 2000;

/// The agent of pool `owned` named `name`, run as `uid` through setpriv.
fn agent_args(name: &str, ns: &str, port: u16, uid: u32) -> Vec<String> {
    let id = uid.to_string();
    let mut args: Vec<String> = ["--reuid", &id, "--regid", &id, "--clear-groups"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.push(bin("wirerate-agent").display().to_string());
    args.extend(crate::agent_args(name, ns, "owned", port));
    args
}

/// Runs the scenario; `work` is the e2e's scratch directory, `dst` the
/// receivers' root.
pub async fn uid_owned_data(
    client: &Client,
    ns: &str,
    kubeconfig: &str,
    procs: &mut Procs,
    work: &Path,
    dst: &Path,
    logs: &Path,
) -> Result<()> {
    println!("== data owned by uid {OWNER}, mode 0600 in a 0700 directory");
    let owned = work.join("owned");
    std::fs::create_dir_all(&owned)?;
    let file = owned.join("data.bin");
    write_random(&file, 64 << 20)?;
    for p in [&owned, &file] {
        std::os::unix::fs::chown(p, Some(OWNER), Some(OWNER))?;
    }
    std::fs::set_permissions(&owned, std::fs::Permissions::from_mode(0o700))?;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))?;
    // The unprivileged agents need a kubeconfig they can read.
    let kc = work.join("kubeconfig-agents");
    std::fs::copy(kubeconfig, &kc)?;
    std::fs::set_permissions(&kc, std::fs::Permissions::from_mode(0o644))?;
    let kc = kc.display().to_string();

    let pools: Api<DtnPool> = Api::namespaced(client.clone(), ns);
    pools
        .create(&PostParams::default(), &pool("owned", &owned))
        .await?;
    let setpriv = Path::new("/usr/bin/setpriv");
    spawn(
        procs,
        "own-wrong",
        setpriv,
        &agent_args("own-wrong", ns, 18100, STRANGER),
        &kc,
        logs,
    )?;

    let start = Instant::now();
    let degraded = loop {
        let p = pools.get("owned").await?;
        let c = p
            .status
            .as_ref()
            .and_then(|s| conditions::find(&s.conditions, types::DEGRADED).cloned());
        if let Some(c) = c
            && c.status == "True"
            && c.reason == "StorageNotReadable"
        {
            break c;
        }
        ensure!(
            start.elapsed() < Duration::from_secs(90),
            "the pool never said its agent cannot read its storage: {:?}",
            p.status
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    ensure!(
        degraded.message.contains(&format!("uid {STRANGER}")),
        "the pool's condition does not say who the agent is: {}",
        degraded.message
    );
    println!("  pool Degraded, StorageNotReadable: {}", degraded.message);

    let transfers: Api<Transfer> = Api::namespaced(client.clone(), ns);
    let mut t = transfer("owned-1", &file, &dst.join("owned-1.dat"), None);
    t.spec.source.pool = "owned".into();
    transfers.create(&PostParams::default(), &t).await?;
    let start = Instant::now();
    let failed = loop {
        let t = transfers.get("owned-1").await?;
        let s = t.status.unwrap_or_default();
        if s.phase == Some(TransferPhase::Failed) {
            break s;
        }
        ensure!(
            s.phase != Some(TransferPhase::Succeeded),
            "a stranger's agent read a 0600 file"
        );
        ensure!(
            start.elapsed() < Duration::from_secs(60),
            "owned-1 did not fail fast: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let why = conditions::find(&failed.conditions, types::FAILED)
        .map(|c| c.message.clone())
        .context("no Failed condition")?;
    ensure!(
        why.contains(&format!("uid {STRANGER}")) && why.contains("Permission denied"),
        "the failure does not name the errno and the uid: {why}"
    );
    println!(
        "  owned-1 failed in {:.1} s: {why}",
        start.elapsed().as_secs_f64()
    );

    println!("== the same data with an agent running as its owner");
    procs.kill("own-wrong");
    spawn(
        procs,
        "own-right",
        setpriv,
        &agent_args("own-right", ns, 18200, OWNER),
        &kc,
        logs,
    )?;
    let out = dst.join("owned-2.dat");
    let mut t = transfer("owned-2", &file, &out, None);
    t.spec.source.pool = "owned".into();
    transfers.create(&PostParams::default(), &t).await?;
    // The stranger's Lease may still be current: then the Transfer fails
    // over to the owner's agent once it expires.
    wait_for(
        &transfers,
        "owned-2",
        "success",
        Duration::from_secs(300),
        |t| t.status.as_ref().and_then(|s| s.phase) == Some(TransferPhase::Succeeded),
    )
    .await?;
    if !same_file(&file, &out)? {
        bail!("owned-2: {} differs from {}", out.display(), file.display());
    }
    println!("  identical");
    Ok(())
}
