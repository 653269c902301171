//! wirerate end to end against a real API server (WIRERATE_E2E_KUBECONFIG):
//! CRDs applied, the operator and three agents as local processes (two
//! receivers sharing one destination directory, one sender), two pools, a
//! 1 GiB Transfer checked byte for byte, then the same with the receiving
//! agent killed mid-transfer: the failover is counted, the new receiver
//! resumes from the checkpoint, and the file is identical; then a receiver
//! whose storage hangs while its Lease stays current (`stall`); last, deleting the
//! Transfers and pools lets their finalizers go; before that, the sending
//! pool tests the path to the receiving one (`path_tests`), and a Transfer
//! over three pairs loses a receiving agent mid-file (`pairs`). Along the way, the
//! security model: the escalation rule at admission, namespace consent, and
//! tokens granted by name (`security`).
#![forbid(unsafe_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, CustomResourceExt};
use serde_json::json;
use tokio::process::{Child, Command};
use wirerate_crds::fixtures::{PoolBuilder, TransferBuilder};
use wirerate_crds::{DtnPool, DtnPoolBinding, IoMode, Transfer, TransferPhase, Tuning};

mod owned;
mod pairs;
mod path_tests;
mod security;
mod stall;

const MANAGER: &str = "wirerate-e2e";

struct Procs(Vec<(String, Child)>);

impl Procs {
    fn pid(&self, name: &str) -> Option<u32> {
        self.0.iter().find(|(n, _)| n == name)?.1.id()
    }

    fn kill(&mut self, name: &str) {
        if let Some((_, c)) = self.0.iter_mut().find(|(n, _)| n == name) {
            let _ = c.start_kill();
        }
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        for (_, c) in &mut self.0 {
            let _ = c.start_kill();
        }
    }
}

fn bin(name: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join("target"));
    dir.join("release").join(name)
}

fn spawn(
    procs: &mut Procs,
    name: &str,
    program: &Path,
    args: &[String],
    kubeconfig: &str,
    log_dir: &Path,
) -> Result<()> {
    let log = std::fs::File::create(log_dir.join(format!("{name}.log")))?;
    let child = Command::new(program)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .stdout(Stdio::from(log.try_clone()?))
        .stderr(Stdio::from(log))
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", program.display()))?;
    procs.0.push((name.to_owned(), child));
    Ok(())
}

/// Starts `wirerate-agent run` for each (name, pool, data port) of `agents`.
fn spawn_agents(
    procs: &mut Procs,
    ns: &str,
    kubeconfig: &str,
    logs: &Path,
    agents: &[(&str, &str, u16)],
) -> Result<()> {
    for (name, pool, port) in agents {
        let args = agent_args(name, ns, pool, *port);
        spawn(procs, name, &bin("wirerate-agent"), &args, kubeconfig, logs)?;
    }
    Ok(())
}

/// `wirerate-agent run` as `name` of `pool`, on data port `port`.
fn agent_args(name: &str, ns: &str, pool: &str, port: u16) -> Vec<String> {
    [
        "run",
        "--agent-name",
        name,
        "--namespace",
        ns,
        "--pool",
        pool,
        "--advertise",
        "127.0.0.1",
        "--data-port",
        &port.to_string(),
        "--metrics-port",
        "0",
        "--max-transfers",
        "1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn same_file(a: &Path, b: &Path) -> Result<bool> {
    let (mut fa, mut fb) = (std::fs::File::open(a)?, std::fs::File::open(b)?);
    if fa.metadata()?.len() != fb.metadata()?.len() {
        return Ok(false);
    }
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        let n = fa.read(&mut ba)?;
        if n == 0 {
            return Ok(true);
        }
        fb.read_exact(&mut bb[..n])?;
        if ba[..n] != bb[..n] {
            return Ok(false);
        }
    }
}

/// `len` bytes of xorshift noise: incompressible, and different every run.
fn write_random(path: &Path, len: usize) -> Result<()> {
    use std::io::Write;
    let mut x = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos() as u64
        | 1;
    let mut out = std::io::BufWriter::with_capacity(1 << 22, std::fs::File::create(path)?);
    let mut buf = vec![0u8; 1 << 20];
    for _ in 0..len / buf.len() {
        for chunk in buf.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chunk.copy_from_slice(&x.to_le_bytes());
        }
        out.write_all(&buf)?;
    }
    out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    Ok(())
}

async fn wait_for<F: Fn(&Transfer) -> bool>(
    api: &Api<Transfer>,
    name: &str,
    what: &str,
    limit: Duration,
    f: F,
) -> Result<Transfer> {
    let start = Instant::now();
    let mut last = String::new();
    loop {
        let t = api.get(name).await?;
        let s = t.status.clone().unwrap_or_default();
        let line = format!(
            "{name}: {:?} attempt {} sender {} receiver {} progress {}",
            s.phase.unwrap_or_default(),
            s.attempt,
            s.sender.as_ref().map_or("-", |a| a.name.as_str()),
            s.receiver.as_ref().map_or("-", |a| a.name.as_str()),
            s.progress
                .as_ref()
                .map_or("-".to_owned(), |p| format!("{} {}", p.percent, p.rate)),
        );
        if line != last {
            println!("  {line}");
            last = line;
        }
        if f(&t) {
            return Ok(t);
        }
        if s.phase == Some(TransferPhase::Failed) {
            bail!(
                "{name} failed while waiting for {what}: {:#?}",
                s.conditions
            );
        }
        if start.elapsed() > limit {
            bail!("{name}: no {what} within {limit:?}; last status: {s:#?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn pool(name: &str, root: &Path) -> DtnPool {
    let root = root.to_string_lossy();
    // The agents run as local processes; the StatefulSet is rendered with no pods.
    PoolBuilder::new(name, &root)
        .replicas(0)
        .image("wirerate-agent:e2e")
        .max_transfers_per_agent(1)
        .tuning(Tuning {
            streams: Some(4),
            block_size: Some(4 << 20),
            io_mode: Some(IoMode::Async),
            ..Default::default()
        })
        .build()
}

fn transfer(name: &str, from: &Path, to: &Path, rate_mbps: Option<i64>) -> Transfer {
    TransferBuilder::new(name, &from.to_string_lossy(), &to.to_string_lossy())
        .pools("senders", "receivers")
        .max_rate_mbps(rate_mbps)
        .max_failovers(2)
        .build()
}

#[tokio::main]
async fn main() -> Result<()> {
    let kubeconfig =
        std::env::var("WIRERATE_E2E_KUBECONFIG").context("WIRERATE_E2E_KUBECONFIG is not set")?;
    let client = {
        let opts = kube::config::KubeConfigOptions::default();
        let kc = kube::config::Kubeconfig::read_from(&kubeconfig)?;
        Client::try_from(kube::Config::from_custom_kubeconfig(kc, &opts).await?)?
    };
    let ns = format!("wirerate-e2e-{}", std::process::id());
    let work = std::env::temp_dir().join(&ns);
    let (src, dst, logs) = (work.join("src"), work.join("dst"), work.join("logs"));
    for d in [&src, &dst, &logs] {
        std::fs::create_dir_all(d)?;
    }
    println!(
        "e2e: namespace {ns}, files and logs under {}",
        work.display()
    );

    println!("== CRDs");
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in [DtnPool::crd(), Transfer::crd(), DtnPoolBinding::crd()] {
        let name = crd.metadata.name.clone().unwrap_or_default();
        crds.patch(
            &name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&crd),
        )
        .await?;
        kube::runtime::wait::await_condition(
            crds.clone(),
            &name,
            kube::runtime::wait::conditions::is_crd_established(),
        )
        .await
        .with_context(|| format!("CRD {name} never became Established"))?;
    }
    security::apply_policies(&client).await?;
    let nss: Api<Namespace> = Api::all(client.clone());
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": ns}}))?,
    )
    .await?;

    let result = run(&client, &ns, &kubeconfig, &src, &dst, &logs).await;
    let _ = nss.delete(&ns, &DeleteParams::default()).await;
    match &result {
        Ok(()) => {
            let _ = std::fs::remove_dir_all(&work);
            println!("e2e: PASSED");
        }
        Err(e) => println!("e2e: FAILED: {e:#}\n(logs kept in {})", logs.display()),
    }
    result
}

/// Found against a real API server: another spelling of the source as the
/// destination passed the same-file rule, and an agent copied a file onto
/// itself. The API server now refuses every such spelling.
async fn path_spellings_are_refused(transfers: &Api<Transfer>, file: &Path) -> Result<()> {
    println!("== other spellings of the source as the destination are refused");
    let src = file.display().to_string();
    let (dir, leaf) = src.rsplit_once('/').context("an absolute path")?;
    for (i, spelling) in [
        format!("{src}/"),
        format!("{dir}//{leaf}"),
        format!("{dir}/./{leaf}"),
    ]
    .iter()
    .enumerate()
    {
        let mut t = transfer(&format!("self-{i}"), file, Path::new(spelling), None);
        t.spec.destination.pool = Some("senders".into());
        match transfers.create(&PostParams::default(), &t).await {
            Err(kube::Error::Api(e)) if e.code == 422 && e.message.contains("spelled plainly") => {
                println!("  refused: {spelling}");
            }
            other => bail!("{spelling}: expected a refusal naming the spelling, got {other:?}"),
        }
    }
    Ok(())
}

async fn run(
    client: &Client,
    ns: &str,
    kubeconfig: &str,
    src: &Path,
    dst: &Path,
    logs: &Path,
) -> Result<()> {
    println!("== a 1 GiB source file");
    let file = src.join("run-1.dat");
    write_random(&file, 1 << 30)?;

    // The pools first, as in a cluster, where an agent's pod exists only
    // because its pool does (an agent started earlier would wait for it).
    let pools: Api<DtnPool> = Api::namespaced(client.clone(), ns);
    let mut receivers = pool("receivers", dst);
    // Its agents all write one directory: shared, for the Transfer over
    // several pairs.
    receivers.spec.shared_storage = true;
    for p in [pool("senders", src), receivers] {
        pools.create(&PostParams::default(), &p).await?;
    }
    println!("== operator and agents (local processes)");
    let mut procs = Procs(Vec::new());
    let op_args: Vec<String> = vec![
        "--namespace".into(),
        ns.into(),
        "--metrics-addr".into(),
        "127.0.0.1:0".into(),
    ];
    spawn(
        &mut procs,
        "operator",
        &bin("wirerate-operator"),
        &op_args,
        kubeconfig,
        logs,
    )?;
    let agents = [
        ("recv-a", "receivers", 17700),
        ("recv-b", "receivers", 17800),
        ("send-a", "senders", 17900),
    ];
    spawn_agents(&mut procs, ns, kubeconfig, logs, &agents)?;
    let transfers: Api<Transfer> = Api::namespaced(client.clone(), ns);
    security::escalation_is_refused(client, kubeconfig, ns).await?;
    security::consent_is_required(client, ns).await?;
    path_spellings_are_refused(&transfers, &file).await?;
    let work = dst.parent().context("the scratch directory")?;
    owned::uid_owned_data(client, ns, kubeconfig, &mut procs, work, dst, logs).await?;

    println!("== transfer 1: straight through");
    let out = dst.join("run-1.dat");
    transfers
        .create(&PostParams::default(), &transfer("one", &file, &out, None))
        .await?;
    let t = wait_for(
        &transfers,
        "one",
        "success and an average rate",
        Duration::from_secs(600),
        |t| {
            t.status.as_ref().is_some_and(|s| {
                s.phase == Some(TransferPhase::Succeeded) && s.average_rate_bps.unwrap_or(0) > 0
            })
        },
    )
    .await?;
    ensure!(
        same_file(&file, &out)?,
        "transfer one: {} differs from {}",
        out.display(),
        file.display()
    );
    let s = t.status.unwrap_or_default();
    println!(
        "  identical; average {}",
        s.average_rate.unwrap_or_default()
    );
    security::token_is_granted_by_name(client, ns, "one", false).await?;

    println!("== transfer 2: the receiving agent killed mid-transfer");
    let out2 = dst.join("run-1-again.dat");
    // A rate cap keeps the transfer long enough to kill its receiver in the
    // middle, after the report that shows 30% (reports come at most every
    // 5 s; at 1,500 Mbit/s the 1 GiB was nearly over by then).
    transfers
        .create(
            &PostParams::default(),
            &transfer("two", &file, &out2, Some(400)),
        )
        .await?;
    let t = wait_for(
        &transfers,
        "two",
        "30% progress",
        Duration::from_secs(300),
        |t| {
            t.status
                .as_ref()
                .and_then(|s| s.progress.as_ref())
                .is_some_and(|p| {
                    p.bytes_total > 0 && p.bytes_done * 10 >= p.bytes_total * 3 && p.attempt == 1
                })
        },
    )
    .await?;
    security::token_is_granted_by_name(client, ns, "two", true).await?;
    // Progress shows what a resume keeps: the new receiver must resume at
    // least this much.
    let shown = t
        .status
        .as_ref()
        .and_then(|s| s.progress.as_ref())
        .map_or(0, |p| p.bytes_done);
    let victim = t
        .status
        .as_ref()
        .and_then(|s| s.receiver.clone())
        .context("no receiver")?
        .name;
    println!("  killing {victim}");
    procs.kill(&victim);
    let t = wait_for(
        &transfers,
        "two",
        "success after failover",
        Duration::from_secs(600),
        |t| t.status.as_ref().and_then(|s| s.phase) == Some(TransferPhase::Succeeded),
    )
    .await?;
    let s = t.status.unwrap_or_default();
    ensure!(
        s.failovers.len() == 1,
        "expected one failover, status says {:?}",
        s.failovers
    );
    ensure!(
        s.failovers[0].agent == victim,
        "the failover names {}, not {victim}",
        s.failovers[0].agent
    );
    let receiver = s.receiver.context("no receiver after failover")?.name;
    ensure!(receiver != victim, "still assigned to the killed agent");
    let report = s
        .reports
        .iter()
        .find(|r| r.agent == receiver)
        .context("no report of the new receiver")?;
    println!("  new receiver {receiver}: {}", report.message);
    ensure!(
        !report.message.contains(" 0 B resumed"),
        "the new receiver did not resume from the checkpoint: {}",
        report.message
    );
    let resumed = resumed_at_most(&report.message)
        .with_context(|| format!("no resumed size in {:?}", report.message))?;
    ensure!(
        resumed >= shown as f64,
        "attempt 1 showed {shown} B done, but its successor resumed only about {resumed:.0} B: progress ran ahead of what a resume keeps"
    );
    println!("  shown before the kill {shown} B, resumed up to {resumed:.0} B");
    ensure!(
        same_file(&file, &out2)?,
        "transfer two: {} differs from {}",
        out2.display(),
        file.display()
    );
    println!(
        "  identical after failover ({} failover: {})",
        s.failovers.len(),
        s.failovers[0].reason
    );

    stall::stuck_receiver_is_replaced(&transfers, ns, kubeconfig, &mut procs, &file, dst, logs)
        .await?;
    path_tests::pools_test_the_path_between_them(client, kubeconfig, ns, dst).await?;
    pairs::a_lost_pair_is_taken_over(&transfers, ns, kubeconfig, &mut procs, &file, dst, logs)
        .await?;
    pairs::a_lost_sender_resumes_from_the_chunks_that_landed(
        &transfers,
        ns,
        kubeconfig,
        &mut procs,
        (&file, dst, logs),
    )
    .await?;
    pairs::a_lost_relay_only_leaves(
        (client, &transfers),
        ns,
        kubeconfig,
        &mut procs,
        (&file, dst, logs),
    )
    .await?;

    // While the operator still runs: its finalizers must let both kinds go,
    // or the namespace could never be deleted.
    println!("== deleting the Transfers and pools");
    let dp = DeleteParams::default();
    let lp = kube::api::ListParams::default();
    for t in transfers.list(&lp).await?.items {
        transfers
            .delete(&t.metadata.name.unwrap_or_default(), &dp)
            .await?;
    }
    for p in pools.list(&lp).await?.items {
        pools
            .delete(&p.metadata.name.unwrap_or_default(), &dp)
            .await?;
    }
    let start = Instant::now();
    loop {
        let lp = kube::api::ListParams::default();
        let (t, p) = (transfers.list(&lp).await?, pools.list(&lp).await?);
        if t.items.is_empty() && p.items.is_empty() {
            break;
        }
        ensure!(
            start.elapsed() < Duration::from_secs(60),
            "still there a minute after deletion (finalizers not released): {} Transfers, {} pools",
            t.items.len(),
            p.items.len()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!("  gone after {:.1} s", start.elapsed().as_secs_f64());
    Ok(())
}

/// The largest byte count a receiver's "…, 1.50 GiB resumed" can stand
/// for (the figure is rounded to two decimals).
fn resumed_at_most(message: &str) -> Option<f64> {
    let head = message.strip_suffix(" resumed")?;
    let mut words = head.rsplit(' ');
    let unit = match words.next()? {
        "B" => 1.0,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        "TiB" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    let value: f64 = words.next()?.parse().ok()?;
    Some((value + 0.005) * unit)
}
