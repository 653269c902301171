//! Issue 34 against a real API server: a Transfer over three pairs, its
//! receivers agents of a pool with shared storage, loses one receiving
//! agent mid-file (killed); the operator drops the pair with an Event and a
//! condition, the others take its work, a free agent replaces it in the
//! same attempt, nothing restarts, and the file lands identical. Then
//! the sending agent of another such Transfer is killed: the new attempt
//! resumes from the chunks that landed. Last, a Transfer from a sending
//! pool with shared storage is sent by three of its agents (two as
//! relays), and loses a relay mid-file.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use kube::Client;
use kube::api::{Api, PostParams};
use wirerate_crds::{DtnPool, Transfer, TransferPhase, TransferStatus};

use crate::{Procs, same_file, spawn_agents, transfer, wait_for};

/// Runs the scenario on `file` (the 1 GiB source) into `dst`.
pub async fn a_lost_pair_is_taken_over(
    transfers: &Api<Transfer>,
    ns: &str,
    kubeconfig: &str,
    procs: &mut Procs,
    file: &Path,
    dst: &Path,
    logs: &Path,
) -> Result<()> {
    println!("== transfer over 3 pairs: one receiving agent killed mid-file");
    // Four receivers of their own, so that the pairs, and a spare to
    // replace the lost one, do not depend on which agents the earlier
    // scenarios left alive.
    let agents = [
        ("pair-a", "receivers", 18500),
        ("pair-b", "receivers", 18600),
        ("pair-c", "receivers", 18700),
        ("pair-d", "receivers", 18800),
    ];
    spawn_agents(procs, ns, kubeconfig, logs, &agents)?;
    let out = dst.join("run-1-wide.dat");
    // The kill comes at 20% (about 9 s in) and the killed agent's Lease
    // lapses (15 s) well before the end.
    let t = started_over_three(transfers, ("wide", file, &out), 20).await?;
    let s = t.status.unwrap_or_default();
    let names: Vec<String> = s.receivers.iter().map(|r| r.name.clone()).collect();
    println!("  receivers {names:?}");
    let victim = names
        .iter()
        .find(|n| agents.iter().any(|a| a.0 == n.as_str()))
        .context("none of the receivers is one of this scenario's agents")?
        .clone();
    println!("  killing {victim}");
    procs.kill(&victim);
    let killed = Instant::now();
    let dropped = wait_for(
        transfers,
        "wide",
        "the pair dropped",
        Duration::from_secs(120),
        |t| {
            t.status.as_ref().is_some_and(|s| {
                s.failovers.iter().any(|f| f.agent == victim)
                    || s.phase.is_some_and(|p| p.is_final())
            })
        },
    )
    .await?;
    let noticed = killed.elapsed();
    let replaced = wait_for(
        transfers,
        "wide",
        "the pair replaced",
        Duration::from_secs(120),
        |t| {
            t.status
                .as_ref()
                .is_some_and(|s| s.receivers.len() == 3 || s.phase.is_some_and(|p| p.is_final()))
        },
    )
    .await?;
    let replaced_after = killed.elapsed();
    let by: Vec<String> = replaced
        .status
        .as_ref()
        .map(|s| s.receivers.iter().map(|r| r.name.clone()).collect())
        .unwrap_or_default();
    println!(
        "  receivers {by:?} {:.1} s after the kill",
        replaced_after.as_secs_f64()
    );
    // While it runs on the others, it says so.
    let degraded = |t: &Transfer| {
        t.status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Degraded"))
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
    };
    // Lost and replaced may come in two writes a moment apart: Degraded
    // is seen True only if the look in between was caught.
    if let Some(d) = degraded(&dropped) {
        println!("  Degraded when the pair dropped: {d:?}");
    }
    let t = wait_for(
        transfers,
        "wide",
        "success over the other pairs",
        Duration::from_secs(600),
        |t| t.status.as_ref().and_then(|s| s.phase) == Some(TransferPhase::Succeeded),
    )
    .await?;
    let s = t.status.clone().unwrap_or_default();
    let lost = s
        .failovers
        .iter()
        .find(|f| f.agent == victim)
        .with_context(|| format!("no failover names {victim}: {:?}", s.failovers))?;
    ensure!(
        lost.reason.starts_with("pair lost"),
        "the loss of {victim} was not taken as a lost pair: {}",
        lost.reason
    );
    ensure!(s.attempt == 1, "restarted: attempt {}", s.attempt);
    ensure!(
        s.pairs == Some(3),
        "status.pairs is {:?}, not 3: the lost pair was not replaced",
        s.pairs
    );
    // Over, it runs degraded no more (the lost pair stays in failovers).
    let d = degraded(&t).context("no Degraded condition")?;
    ensure!(d.0 == "False", "Degraded once over: {d:?}");
    ensure!(
        same_file(file, &out)?,
        "transfer wide: {} differs from {}",
        out.display(),
        file.display()
    );
    let said = s
        .reports
        .iter()
        .find(|r| r.role == wirerate_crds::transfer::Role::Sender && r.attempt == 1)
        .map(|r| r.message.clone())
        .unwrap_or_default();
    ensure!(
        said.contains("over 3 pairs (1 lost)"),
        "the sender said {said:?}"
    );
    println!(
        "  identical; the operator dropped the pair {:.1} s after the kill ({})",
        noticed.as_secs_f64(),
        lost.reason
    );
    println!("  {said}");
    for (name, _, _) in agents {
        procs.kill(name);
    }
    Ok(())
}

/// Runs the scenario on `file` (the 1 GiB source) into `dst`: the sending
/// agent of a Transfer over three pairs is killed mid-file; the operator
/// fails it over to another sending agent (a new attempt), which resumes
/// from the per-chunk checkpoints the receivers kept on the shared
/// storage and sends only the chunks not landed.
pub async fn a_lost_sender_resumes_from_the_chunks_that_landed(
    transfers: &Api<Transfer>,
    ns: &str,
    kubeconfig: &str,
    procs: &mut Procs,
    (file, dst, logs): (&Path, &Path, &Path),
) -> Result<()> {
    println!("== transfer over 3 pairs: its sending agent killed mid-file");
    // A sending agent to fail over to, and three receivers, of their own.
    let agents = [
        ("lead-b", "senders", 18900),
        ("keep-a", "receivers", 19000),
        ("keep-b", "receivers", 19100),
        ("keep-c", "receivers", 19200),
    ];
    spawn_agents(procs, ns, kubeconfig, logs, &agents)?;
    let out = dst.join("run-1-resumed.dat");
    let t = started_over_three(transfers, ("resumed", file, &out), 40).await?;
    let s = t.status.unwrap_or_default();
    let sender = s.sender.context("no sender assigned")?.name;
    let at = s.progress.map_or(0, |p| p.bytes_done);
    println!("  killing the sending agent {sender} at {at} B");
    procs.kill(&sender);
    let killed = Instant::now();
    let s = succeeded(transfers, "resumed").await?;
    ensure!(s.attempt >= 2, "no failover: attempt {}", s.attempt);
    ensure!(
        s.failovers.iter().any(|f| f.agent == sender),
        "no failover names {sender}: {:?}",
        s.failovers
    );
    ensure!(
        same_file(file, &out)?,
        "transfer resumed: {} differs from {}",
        out.display(),
        file.display()
    );
    let said = s
        .reports
        .iter()
        .find(|r| r.role == wirerate_crds::transfer::Role::Sender && r.attempt == s.attempt)
        .map(|r| r.message.clone())
        .unwrap_or_default();
    ensure!(
        said.contains("resumed from the pieces an earlier attempt landed"),
        "the new sender resumed nothing: {said:?}"
    );
    println!(
        "  identical in attempt {}, {:.1} s after the kill; the new sender said: {said}",
        s.attempt,
        killed.elapsed().as_secs_f64()
    );
    for (name, _, _) in agents {
        procs.kill(name);
    }
    Ok(())
}

/// Runs the scenario on `file` (the 1 GiB source) into `dst`: a Transfer
/// over three pairs from a sending pool of three agents that declares
/// shared storage (`relays`, on the source's directory) gets two relays;
/// one relay is killed mid-file: it leaves `status.relays` with a
/// RelayLost Event, nothing fails over or restarts, and the file lands
/// identical.
pub async fn a_lost_relay_only_leaves(
    (client, transfers): (&Client, &Api<Transfer>),
    ns: &str,
    kubeconfig: &str,
    procs: &mut Procs,
    (file, dst, logs): (&Path, &Path, &Path),
) -> Result<()> {
    println!("== transfer over 3 pairs from 3 sending agents: one relay killed mid-file");
    // Pools of their own: the receiving pool's agents killed by the
    // scenarios before keep their Leases a while, and one of them
    // assigned here would be a failover at the start.
    let src = file.parent().context("the source's directory")?;
    let pools: Api<DtnPool> = Api::namespaced(client.clone(), ns);
    for (name, root) in [("relays", src), ("landing", dst)] {
        let mut p = crate::pool(name, root);
        p.spec.shared_storage = true;
        pools.create(&PostParams::default(), &p).await?;
    }
    let agents = [
        ("relay-a", "relays", 19300),
        ("relay-b", "relays", 19400),
        ("relay-c", "relays", 19500),
        ("lend-a", "landing", 19600),
        ("lend-b", "landing", 19700),
        ("lend-c", "landing", 19800),
    ];
    spawn_agents(procs, ns, kubeconfig, logs, &agents)?;
    let out = dst.join("run-1-relayed.dat");
    let mut t = crate::transfer("relayed", file, &out, Some(200));
    t.spec.source.pool = "relays".into();
    t.spec.destination.pool = Some("landing".into());
    t.spec.pairs = Some(3);
    transfers.create(&PostParams::default(), &t).await?;
    let t = wait_for(
        transfers,
        "relayed",
        "two relays, a relayed pair under way, and 25% progress",
        Duration::from_secs(300),
        |t| {
            t.status.as_ref().is_some_and(|s| {
                let relayed = s
                    .stripes
                    .as_ref()
                    .is_some_and(|st| st.pairs.iter().any(|p| p.relay.is_some() && p.bytes > 0));
                s.relays.len() == 2
                    && relayed
                    && s.progress
                        .as_ref()
                        .is_some_and(|p| p.bytes_total > 0 && p.bytes_done * 4 >= p.bytes_total)
            })
        },
    )
    .await?;
    let s = t.status.unwrap_or_default();
    let relays: Vec<String> = s.relays.iter().map(|r| r.name.clone()).collect();
    let sender = s.sender.map(|a| a.name).unwrap_or_default();
    println!("  sender {sender}, relays {relays:?}");
    let victim = relays.first().context("no relay")?.clone();
    println!("  killing the relay {victim}");
    procs.kill(&victim);
    let killed = Instant::now();
    wait_for(
        transfers,
        "relayed",
        "the relay dropped",
        Duration::from_secs(120),
        |t| {
            t.status.as_ref().is_some_and(|s| {
                !s.relays.iter().any(|r| r.name == victim) || s.phase.is_some_and(|p| p.is_final())
            })
        },
    )
    .await?;
    let dropped = killed.elapsed();
    let s = succeeded(transfers, "relayed").await?;
    ensure!(s.attempt == 1, "restarted: attempt {}", s.attempt);
    ensure!(s.failovers.is_empty(), "failed over: {:?}", s.failovers);
    ensure!(
        same_file(file, &out)?,
        "transfer relayed: {} differs from {}",
        out.display(),
        file.display()
    );
    ensure!(
        !s.relays.iter().any(|r| r.name == victim),
        "the killed relay {victim} was never dropped: {:?}",
        s.relays
    );
    let stripes = s.stripes.clone().context("no status.stripes")?;
    let lost = stripes
        .pairs
        .iter()
        .find(|p| p.relay.as_deref() == Some(victim.as_str()))
        .with_context(|| format!("no pair sent through {victim}: {stripes:?}"))?;
    ensure!(
        matches!(lost.state.as_str(), "lost" | "gone"),
        "the killed relay's pair ended {}",
        lost.state
    );
    let each: Vec<String> = stripes
        .pairs
        .iter()
        .map(|p| {
            format!(
                "{} via {} {} {} MiB",
                p.receiver,
                p.relay.as_deref().unwrap_or(&sender),
                p.state,
                p.bytes >> 20
            )
        })
        .collect();
    println!(
        "  identical in attempt 1, {:.1} s after the kill; the relay dropped {:.1} s after it; pairs: {}",
        killed.elapsed().as_secs_f64(),
        dropped.as_secs_f64(),
        each.join("; ")
    );
    for (name, _, _) in agents {
        procs.kill(name);
    }
    Ok(())
}

/// The status of Transfer `name` once it is over, an error unless it
/// succeeded.
async fn succeeded(transfers: &Api<Transfer>, name: &str) -> Result<TransferStatus> {
    let t = wait_for(transfers, name, "the end", Duration::from_secs(600), |t| {
        t.status
            .as_ref()
            .and_then(|s| s.phase)
            .is_some_and(|p| p.is_final())
    })
    .await?;
    let s = t.status.unwrap_or_default();
    ensure!(
        s.phase == Some(TransferPhase::Succeeded),
        "the Transfer ended {:?}: {:?}",
        s.phase,
        s.conditions
    );
    Ok(s)
}

/// Creates Transfer `name` of `file` into `out` over three pairs, 200
/// Mbit/s in all, and waits until it runs on three receivers with
/// `percent` of it done.
async fn started_over_three(
    transfers: &Api<Transfer>,
    (name, file, out): (&str, &Path, &Path),
    percent: i64,
) -> Result<Transfer> {
    let mut t = transfer(name, file, out, Some(200));
    t.spec.pairs = Some(3);
    transfers.create(&PostParams::default(), &t).await?;
    wait_for(
        transfers,
        name,
        &format!("three receivers and {percent}% progress"),
        Duration::from_secs(300),
        |t| {
            t.status.as_ref().is_some_and(|s| {
                s.receivers.len() == 3
                    && s.progress.as_ref().is_some_and(|p| {
                        p.bytes_total > 0 && p.bytes_done * 100 >= percent * p.bytes_total
                    })
            })
        },
    )
    .await
}
