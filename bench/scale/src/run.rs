//! `wirerate-scale run`: the three phases against the real operator binary.
//!
//! 1. **Schedule:** pools, bindings and agents' Leases first, the operator
//!    started and serving the pools; then the Transfers, created as fast as
//!    the API takes them. Timed: from the last create until every Transfer
//!    has a phase (and until every slot is taken), and each Transfer's
//!    create to its first status.
//! 2. **Rest:** nothing changes but the Lease renewals. The operator's CPU
//!    (utime + stime from /proc), its API requests (the double counts them
//!    by User-Agent: the driver's carry its own), its memory.
//! 3. **Refill:** running Transfers end as agents report them; timed until
//!    as many more are running.
//!
//! The observer checks capacity, assignments and priority at every state
//! throughout. Timings are reported, never asserted; only a correctness
//! failure (or a setup error) makes the exit status non-zero.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Client;
use kube::api::{Api, PostParams};
use wirerate_crds::{DtnPool, Transfer, TransferPhase};

use crate::agents::{self, Renewals};
use crate::cluster;
use crate::observer::{self, Observer};
use crate::operator::{self, Launch, Operator};
use crate::processes;
use crate::promtext;
use crate::report::{Latency, Reconcile, Refill, Report, Rest, Schedule, Setup};
use crate::requests::{AuditLog, Requests};
use crate::scenario::{POOL_NAMESPACE, SYSTEM_NAMESPACE, Scenario};
use wirerate_apiserver_double::{Actor, ApiServer, Tally};

/// `wirerate-scale run`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// The operator binary [default: wirerate-operator beside this binary,
    /// else target/release/wirerate-operator in the repository].
    #[arg(long)]
    operator: Option<PathBuf>,
    /// Run against this API server instead of the built-in double: the
    /// CRDs and namespaces are created if absent and removed afterwards.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// The real API server's audit log (JSON lines, level Metadata or
    /// above), from which the operator's writes are counted by its
    /// User-Agent; without it they are not counted there.
    #[arg(long, requires = "kubeconfig")]
    audit_log: Option<PathBuf>,
    /// Processes serving the API (kube-apiserver, etcd), whose CPU is
    /// reported beside the operator's; repeat for each.
    #[arg(long)]
    server_pid: Vec<u32>,
    /// Simulated agents [default: 100; --quick: 20].
    #[arg(long)]
    agents: Option<usize>,
    /// Pools the agents are dealt to.
    #[arg(long, default_value_t = 2)]
    pools: usize,
    /// Transfers each agent takes at once.
    #[arg(long, default_value_t = 2)]
    capacity: i32,
    /// Transfers created [default: 1000; --quick: 200].
    #[arg(long)]
    transfers: Option<usize>,
    /// Namespaces the Transfers are spread over.
    #[arg(long, default_value_t = 3)]
    namespaces: usize,
    /// Seconds at rest [default: 30; --quick: 10].
    #[arg(long)]
    rest_seconds: Option<u64>,
    /// Running Transfers finished in the refill phase [default: 100; --quick: 20].
    #[arg(long)]
    refill: Option<usize>,
    /// Times to kill -9 (and restart) the operator while Transfers arrive.
    #[arg(long, default_value_t = 0)]
    kills: usize,
    /// Concurrent creators.
    #[arg(long, default_value_t = 4)]
    creators: usize,
    /// Milliseconds the API double waits before answering each request
    /// (watch events excepted), as a real API server waits for etcd.
    #[arg(long, default_value_t = 0)]
    api_latency_ms: u64,
    /// Give up on a phase after this many seconds [default: 240; --quick: 60].
    #[arg(long)]
    timeout: Option<u64>,
    /// Also write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Directory for the operator's log and the double's kubeconfig
    /// [default: target/scale in the repository].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Run real `wirerate-agent run` processes (this binary) on loopback
    /// instead of simulated agents: they move paced bytes between
    /// directories under --out, and Transfers end by themselves.
    #[arg(long)]
    agent_binary: Option<PathBuf>,
    /// With --agent-binary: each Transfer's file, in MiB.
    #[arg(long, default_value_t = 64, requires = "agent_binary")]
    file_mib: u64,
    /// With --agent-binary: each Transfer's pace (maxRateMbps).
    #[arg(long, default_value_t = 8, requires = "agent_binary")]
    rate_mbps: i64,
    /// CI size: 20 agents, 200 Transfers, 10 s at rest, 20 refilled.
    #[arg(long)]
    quick: bool,
}

/// Aborts its tasks when dropped (on an error or an interrupt too).
struct Tasks(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn operator_binary(given: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let path = match given {
        Some(p) => p,
        None => {
            let beside = std::env::current_exe()?.with_file_name("wirerate-operator");
            if beside.exists() {
                beside
            } else {
                repo_root().join("target/release/wirerate-operator")
            }
        }
    };
    if !path.exists() {
        bail!(
            "no operator binary at {}: build it (cargo build --release -p wirerate-operator) or pass --operator",
            path.display()
        );
    }
    Ok(path)
}

/// Resolves on Ctrl-C or SIGTERM.
async fn interrupted() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let term = async {
        match term.as_mut() {
            Some(t) => {
                t.recv().await;
            }
            None => futures::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

/// Runs the bench; true when every correctness check held.
pub(crate) async fn main(a: Args) -> anyhow::Result<bool> {
    let q = a.quick;
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| repo_root().join("target/scale"));
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    let out = out.canonicalize()?;
    let s = Scenario {
        agents: a.agents.unwrap_or(if q { 20 } else { 100 }),
        pools: a.pools,
        capacity: a.capacity,
        transfers: a.transfers.unwrap_or(if q { 200 } else { 1000 }),
        namespaces: a.namespaces,
        data_root: match a.agent_binary {
            Some(_) => out.join("data").to_string_lossy().into_owned(),
            None => "/data".into(),
        },
        paced_mbps: a.agent_binary.as_ref().map(|_| a.rate_mbps),
    };
    if s.pools == 0 || s.agents < s.pools || s.namespaces == 0 || s.capacity < 1 {
        bail!("need at least one pool, an agent per pool, one namespace and a capacity of 1");
    }
    let operator_bin = operator_binary(a.operator.clone())?;

    let (double, kubeconfig) = match &a.kubeconfig {
        Some(k) => (None, k.clone()),
        None => {
            let d = ApiServer::start(Duration::from_millis(a.api_latency_ms))
                .await
                .context("cannot start the API double")?;
            let path = out.join("kubeconfig.json");
            d.write_kubeconfig(&path)?;
            (Some(d), path)
        }
    };
    let client = cluster::client(&kubeconfig).await?;
    eprintln!(
        "setting up {} ({} agents, {} Transfers)",
        double.as_ref().map_or_else(
            || kubeconfig.display().to_string(),
            |d| format!("the API double at {}", d.url())
        ),
        s.agents,
        s.transfers
    );
    let created = cluster::setup(&client, &s).await?;
    let launch = Launch {
        binary: operator_bin,
        kubeconfig: kubeconfig.clone(),
        namespace: SYSTEM_NAMESPACE.into(),
        log: out.join("operator.log"),
    };
    let outcome = tokio::select! {
        r = bench(&a, &s, &client, double.as_ref(), launch) => r,
        _ = interrupted() => Err(anyhow::anyhow!("interrupted")),
    };
    // The bench future is gone, and with it the operator (killed on drop)
    // and every task it started.
    if double.is_none() {
        eprintln!("removing what the bench created");
        if let Err(e) = cluster::cleanup(&client, &s, &created).await {
            eprintln!("warning: cleanup incomplete: {e:#}");
        }
    }
    let report = outcome?;
    println!("{}", report.table());
    if let Some(path) = &a.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(report.correctness.ok)
}

/// Requests the operator made, by "verb resource".
fn operator_requests(t: &Tally) -> BTreeMap<String, u64> {
    t.iter()
        .filter(|((actor, _, _), _)| *actor == Actor::Operator)
        .map(|((_, verb, res), n)| (format!("{verb} {res}"), *n))
        .collect()
}

/// The operator's writes (create, update, patch, delete) so far.
fn operator_writes(t: &Tally) -> u64 {
    t.iter()
        .filter(|((actor, verb, _), _)| {
            *actor == Actor::Operator && matches!(*verb, "create" | "update" | "patch" | "delete")
        })
        .map(|(_, n)| n)
        .sum()
}

/// The operator's writes of Transfers (status and metadata) so far.
fn transfer_writes(t: &Tally) -> u64 {
    t.iter()
        .filter(|((actor, verb, res), _)| {
            *actor == Actor::Operator
                && res.starts_with("transfers")
                && matches!(*verb, "create" | "update" | "patch" | "delete")
        })
        .map(|(_, n)| n)
        .sum()
}

fn delta(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, v)| *v > 0)
        .collect()
}

/// Fails when the operator has exited by itself.
fn alive(op: &mut Operator) -> anyhow::Result<()> {
    match op.exited() {
        Some(status) => Err(Crashed(status.to_string()).into()),
        None => Ok(()),
    }
}

/// The operator exited without being told to.
#[derive(Debug)]
struct Crashed(String);

impl std::fmt::Display for Crashed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the operator exited by itself: {}", self.0)
    }
}

impl std::error::Error for Crashed {}

async fn bench(
    a: &Args,
    s: &Scenario,
    client: &Client,
    double: Option<&ApiServer>,
    launch: Launch,
) -> anyhow::Result<Report> {
    let q = a.quick;
    let rest_secs = a.rest_seconds.unwrap_or(if q { 10 } else { 30 });
    let refill = a.refill.unwrap_or(if q { 20 } else { 100 });
    let timeout = Duration::from_secs(a.timeout.unwrap_or(if q { 60 } else { 240 }));
    let mut report = Report {
        setup: Setup {
            api: match double {
                Some(_) if a.api_latency_ms > 0 => {
                    format!("API double ({} ms per request)", a.api_latency_ms)
                }
                Some(_) => "API double".into(),
                None => format!("API server of {}", launch.kubeconfig.display()),
            },
            operator: launch.binary.display().to_string(),
            agents: s.agents,
            pools: s.pools,
            capacity: s.capacity,
            slots: s.slots(),
            transfers: s.transfers,
            namespaces: s.namespaces,
            rest_seconds: rest_secs,
            refill,
            kills: a.kills,
            cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
        },
        ..Report::default()
    };

    let requests = match (double, &a.audit_log) {
        (Some(d), _) => Requests::Double(d),
        (None, Some(path)) => Requests::Audit(Mutex::new(AuditLog::open(path.clone())?)),
        (None, None) => Requests::Unknown,
    };
    let observer = Arc::new(Mutex::new(Observer::new(s)));
    let mut tasks = Tasks(vec![tokio::spawn(observer::watch(
        client.clone(),
        observer.clone(),
    ))]);
    let renewals = Arc::new(Renewals::default());
    let mut real = start_agents(a, s, client, &observer, &renewals, &mut tasks, &launch).await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !observer.lock().expect("observer lock").synced {
        if Instant::now() > deadline {
            bail!("the driver's watch of Transfers did not start within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    eprintln!("starting {}", launch.binary.display());
    let log = launch.log.clone();
    let mut op = Operator::start(launch)?;
    let run = Run {
        a,
        s,
        client,
        requests: &requests,
        agent_pids: real
            .as_ref()
            .map(processes::Running::pids)
            .unwrap_or_default(),
        observer: &observer,
        rest_secs,
        refill,
        timeout,
    };
    let result = phases(&run, &mut op, &mut report).await;
    match result {
        Ok(()) => {}
        Err(e) if e.downcast_ref::<Crashed>().is_some() => {
            report.correctness.operator_crashed = Some(e.to_string());
            eprintln!("{e}; the end of its log ({}):", log.display());
            if let Ok(text) = std::fs::read_to_string(&log) {
                let lines: Vec<&str> = text.lines().collect();
                for l in &lines[lines.len().saturating_sub(20)..] {
                    eprintln!("  {l}");
                }
            }
        }
        Err(e) => return Err(e),
    }
    if report.correctness.operator_crashed.is_none() {
        if let Some(r) = reconcile_figures(&op).await {
            report.reconcile = r;
        }
    }
    op.stop().await;
    drop(tasks);

    report.operator_requests = requests.tally().map(|t| operator_requests(&t));
    let o = observer.lock().expect("observer lock");
    let (lost, failed) = o.lost_and_failed();
    let c = &mut report.correctness;
    c.capacity_overruns = o.overruns.clone();
    c.double_assignments = o.double_assignments.clone();
    c.priority_inversions = o.inversions.clone();
    c.lost = lost;
    c.failed = failed;
    c.failovers = o.failovers();
    c.peak_agent_load = o.peak_load;
    c.observer_relists = o.relists;
    c.lease_renewals = renewals.done.load(Ordering::Relaxed);
    c.lease_renewal_failures = renewals.failed.load(Ordering::Relaxed);
    c.operator_starts = op.starts;
    if let Some(r) = real.as_mut() {
        c.agents_exited = r.exited();
    }
    c.ok = c.capacity_overruns.count == 0
        && c.double_assignments.count == 0
        && c.lost.is_empty()
        && c.failed.is_empty()
        && c.agents_exited.is_empty()
        && c.create_errors.is_empty()
        && c.operator_crashed.is_none();
    drop(o);
    match requests {
        Requests::Unknown => report.notes.push(
            "a real API server without --audit-log: the operator's requests were not counted"
                .into(),
        ),
        Requests::Audit(_) => report
            .notes
            .push("requests counted from the API server's audit log, by User-Agent".into()),
        Requests::Double(_) => {}
    }
    if real.is_some() {
        report.notes.push(
            "real agents: Transfers land and new ones start during phase 2, so its figures are of the operator busy, not at rest".into(),
        );
    }
    if double.is_some() {
        report.notes.push(
            "the API double runs in the bench process and shares the machine's cores with the operator".into(),
        );
    }
    report.judge();
    Ok(report)
}

/// The operator's reconcile counts and latency, from its /metrics.
async fn reconcile_figures(op: &Operator) -> Option<Reconcile> {
    let m = op.metrics().await?;
    let by = [("controller", "transfer")];
    let h = promtext::histogram(&m, "wirerate_operator_reconcile_duration_seconds", &by);
    Some(Reconcile {
        transfer_reconciles: promtext::counter(&m, "wirerate_operator_reconciles_total", &by),
        pool_reconciles: promtext::counter(
            &m,
            "wirerate_operator_reconciles_total",
            &[("controller", "dtnpool")],
        ),
        errors: promtext::counter(&m, "wirerate_operator_reconcile_errors_total", &by),
        p50_seconds: h.quantile(0.5),
        p99_seconds: h.quantile(0.99),
        p50_at_least: h.beyond(0.5),
        p99_at_least: h.beyond(0.99),
        note: format!(
            "from the operator's histogram (buckets 5, 10, 50, 100, 250, 500 ms, 1 s, 5 s), linearly interpolated inside a bucket{}",
            if op.starts > 1 {
                "; since its last start"
            } else {
                ""
            }
        ),
    })
}

/// The agents: simulated ones' Leases written and renewed from `tasks`, or
/// real agents started (returned).
async fn start_agents(
    a: &Args,
    s: &Scenario,
    client: &Client,
    observer: &Arc<Mutex<Observer>>,
    renewals: &Arc<Renewals>,
    tasks: &mut Tasks,
    launch: &Launch,
) -> anyhow::Result<Option<processes::Running>> {
    match &a.agent_binary {
        None => {
            let leases: Api<Lease> = Api::namespaced(client.clone(), POOL_NAMESPACE);
            futures::stream::iter(s.agents())
                .map(|agent| {
                    let leases = leases.clone();
                    async move { agents::heartbeat(&leases, s, &agent, 0).await }
                })
                .buffer_unordered(16)
                .try_collect::<Vec<()>>()
                .await
                .context("cannot write the agents' Leases")?;
            tasks.0.extend(agents::renew_all(
                client,
                s,
                observer.clone(),
                renewals.clone(),
            ));
        }
        Some(binary) => {
            eprintln!(
                "writing {} sources of {} MiB (hard links)",
                s.transfers, a.file_mib
            );
            processes::make_sources(s, a.file_mib << 20)?;
            let logs = launch.log.with_file_name("agents");
            eprintln!(
                "starting {} agents ({}/<name>.log)",
                s.agents,
                logs.display()
            );
            return Ok(Some(processes::start(
                binary,
                s,
                &launch.kubeconfig,
                &logs,
            )?));
        }
    }
    Ok(None)
}

/// What the phases of one run share: the settings, the scenario, the
/// driver's client, where requests are counted, and the driver's view of
/// the Transfers.
struct Run<'a> {
    a: &'a Args,
    s: &'a Scenario,
    client: &'a Client,
    requests: &'a Requests<'a>,
    /// Real agents' processes (none when they are simulated).
    agent_pids: Vec<u32>,
    observer: &'a Arc<Mutex<Observer>>,
    /// Phase 2's length.
    rest_secs: u64,
    /// Phase 3's running Transfers to finish.
    refill: usize,
    /// How long a phase may wait for what it waits for.
    timeout: Duration,
}

async fn phases(run: &Run<'_>, op: &mut Operator, report: &mut Report) -> anyhow::Result<()> {
    let (s, client, timeout) = (run.s, run.client, run.timeout);
    // The operator is up once it reports every agent of every pool ready.
    let pools: Api<DtnPool> = Api::namespaced(client.clone(), POOL_NAMESPACE);
    let per_pool = s.agents / s.pools;
    let ready_by = Instant::now() + Duration::from_secs(60);
    loop {
        alive(op)?;
        let mut ready = true;
        for p in s.pool_names() {
            let n = pools.get(&p).await?.status.map_or(0, |st| st.ready_agents);
            ready &= n as usize >= per_pool;
        }
        if ready {
            break;
        }
        if Instant::now() > ready_by {
            bail!("the operator did not report the pools' agents ready within 60 s (see its log)");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    eprintln!("phase 1: creating {} Transfers", s.transfers);
    let cpu_start = op.cpu_seconds();
    let server_cpu0 = operator::cpu_of(&run.a.server_pid);
    let writes0 = run.requests.tally().map(|t| operator_writes(&t));
    let t0 = Instant::now();
    schedule(run, op, report).await?;
    report.schedule.server_cpu_percent = operator::cpu_of(&run.a.server_pid)
        .zip(server_cpu0)
        .map(|(b, a)| 100.0 * (b - a) / t0.elapsed().as_secs_f64());
    if let (Some(w0), Some(w1)) = (writes0, run.requests.tally().map(|t| operator_writes(&t))) {
        let w = w1 - w0;
        let sc = &mut report.schedule;
        sc.operator_writes = Some(w);
        sc.writes_per_transfer = Some(w as f64 / sc.created.max(1) as f64);
        sc.writes_per_second = Some(w as f64 / t0.elapsed().as_secs_f64());
    }
    report.schedule.operator_cpu_seconds = match (cpu_start, op.cpu_seconds()) {
        (Some(a), Some(b)) if op.starts == 1 => Some(b - a),
        _ => None,
    };
    if report.schedule.all_phased_seconds.is_none() {
        report.notes.push(format!(
            "phase 1 timed out after {} s: {} of {} Transfers had a phase",
            timeout.as_secs(),
            report.schedule.phased,
            report.schedule.created
        ));
        return Ok(());
    }

    eprintln!("phase 2: {} s at rest", run.rest_secs);
    let agents_cpu0 = operator::cpu_of(&run.agent_pids);
    let rest_start = Instant::now();
    let mut r = rest(
        op,
        run.requests,
        &run.a.server_pid,
        run.rest_secs,
        run.a.quick,
    )
    .await?;
    r.agents_cpu_percent = operator::cpu_of(&run.agent_pids)
        .zip(agents_cpu0)
        .map(|(b, a)| 100.0 * (b - a) / rest_start.elapsed().as_secs_f64());
    report.rest = Some(r);

    report.refill = Some(if run.agent_pids.is_empty() {
        eprintln!("phase 3: finishing {} running Transfers", run.refill);
        refill_slots(client, op, run.observer, run.refill, timeout).await?
    } else {
        eprintln!(
            "phase 3: waiting for {} Transfers to land by themselves and as many more to start",
            run.refill
        );
        refill_by_agents(op, run.observer, run.refill, timeout).await?
    });
    Ok(())
}

/// Phase 3 with real agents: Transfers end when their bytes have landed;
/// timed until `want` of the ones running now have Succeeded, and until as
/// many more have taken their slots.
async fn refill_by_agents(
    op: &mut Operator,
    observer: &Arc<Mutex<Observer>>,
    want: usize,
    timeout: Duration,
) -> anyhow::Result<Refill> {
    let (running, queued) = {
        let o = observer.lock().expect("observer lock");
        (o.running_keys(), o.queued())
    };
    let target = want.min(queued).min(running.len());
    let t0 = Instant::now();
    let (mut refilled, mut succeeded) = (None, None);
    let mut landed = 0;
    while t0.elapsed() < timeout && (refilled.is_none() || succeeded.is_none()) {
        alive(op)?;
        {
            let o = observer.lock().expect("observer lock");
            let now = Instant::now();
            landed = running
                .iter()
                .filter(|k| o.phase(k) == Some(TransferPhase::Succeeded))
                .count();
            if succeeded.is_none() && landed >= target {
                succeeded = Some(now);
            }
            if refilled.is_none() && o.assigned_since(t0) >= target {
                refilled = Some(now);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let newly_running = observer.lock().expect("observer lock").assigned_since(t0);
    Ok(Refill {
        finished: landed,
        target,
        reports_seconds: 0.0,
        refill_seconds: refilled.map(|t| (t - t0).as_secs_f64()),
        succeeded_seconds: succeeded.map(|t| (t - t0).as_secs_f64()),
        newly_running,
    })
}

/// Phase 1: creates the Transfers and waits until each has a phase and
/// the slots are filled (or the timeout), killing the operator on the way
/// if asked.
async fn schedule(run: &Run<'_>, op: &mut Operator, report: &mut Report) -> anyhow::Result<()> {
    let (a, s, client, observer) = (run.a, run.s, run.client, run.observer);
    let next = Arc::new(AtomicUsize::new(0));
    let made = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let last_done = Arc::new(Mutex::new(None::<Instant>));
    let start = Instant::now();
    let mut creators = Tasks(Vec::new());
    for _ in 0..a.creators.max(1) {
        let (client, s, observer) = (client.clone(), s.clone(), observer.clone());
        let (next, made, errors, last_done) = (
            next.clone(),
            made.clone(),
            errors.clone(),
            last_done.clone(),
        );
        creators.0.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= s.transfers {
                    break;
                }
                let plan = s.transfer(i);
                let t: Transfer = match serde_json::from_value(plan.body) {
                    Ok(t) => t,
                    Err(e) => {
                        errors.lock().expect("errors lock").push(e.to_string());
                        continue;
                    }
                };
                let api: Api<Transfer> = Api::namespaced(client.clone(), &plan.namespace);
                observer
                    .lock()
                    .expect("observer lock")
                    .creating(format!("{}/{}", plan.namespace, plan.name), Instant::now());
                match api.create(&PostParams::default(), &t).await {
                    Ok(_) => {
                        made.fetch_add(1, Ordering::Relaxed);
                        let now = Instant::now();
                        let mut l = last_done.lock().expect("last lock");
                        *l = Some(l.map_or(now, |x| x.max(now)));
                    }
                    Err(e) => errors
                        .lock()
                        .expect("errors lock")
                        .push(format!("{}: {e}", plan.name)),
                }
            }
        }));
    }

    let kill_at: Vec<usize> = (1..=a.kills)
        .map(|i| s.transfers * i / (a.kills + 1))
        .collect();
    let mut kills = 0;
    let mut last_kill: Option<Instant> = None;
    let slots = s.slots().min(s.transfers);
    let (mut last_create, mut all_phased, mut filled) = (None::<Instant>, None, None);
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        alive(op)?;
        let now = Instant::now();
        let creating = creators.0.iter().any(|t| !t.is_finished());
        if !creating && last_create.is_none() {
            last_create = Some(last_done.lock().expect("last lock").unwrap_or(now));
        }
        if kills < a.kills
            && (!creating || made.load(Ordering::Relaxed) >= kill_at[kills])
            && last_kill.is_none_or(|k| now - k >= Duration::from_secs(2))
        {
            eprintln!("  kill -9 the operator ({} of {})", kills + 1, a.kills);
            op.kill_and_restart().await?;
            kills += 1;
            last_kill = Some(now);
        }
        let Some(last) = last_create else { continue };
        let (phased, _) = observer.lock().expect("observer lock").phased();
        let running = observer.lock().expect("observer lock").running();
        let total = made.load(Ordering::Relaxed);
        if all_phased.is_none() && phased >= total {
            all_phased = Some(now);
        }
        if filled.is_none() && running >= slots {
            filled = Some(now);
        }
        if all_phased.is_some() && filled.is_some() && kills == a.kills {
            break;
        }
        if now - last > run.timeout {
            break;
        }
    }
    let last = last_create.expect("set before the loop ends");
    let o = observer.lock().expect("observer lock");
    let (phased, pending) = o.phased();
    let created = made.load(Ordering::Relaxed);
    let create_seconds = (last - start).as_secs_f64();
    report.schedule = Schedule {
        created,
        create_seconds,
        creates_per_second: created as f64 / create_seconds.max(1e-3),
        all_phased_seconds: all_phased.map(|t| (t - last).as_secs_f64()),
        phased,
        pending,
        slots_filled_seconds: filled.map(|t| (t - last).as_secs_f64()),
        running: o.running(),
        first_status: Latency::of(o.first_status().iter().map(Duration::as_secs_f64).collect()),
        operator_cpu_seconds: None,
        ..Schedule::default()
    };
    report.correctness.create_errors = errors.lock().expect("errors lock").clone();
    if pending > 0 {
        report.notes.push(format!(
            "{pending} Transfers stayed Pending (invalid): the scenario is wrong for this operator"
        ));
    }
    Ok(())
}

async fn rest(
    op: &mut Operator,
    requests: &Requests<'_>,
    servers: &[u32],
    secs: u64,
    quick: bool,
) -> anyhow::Result<Rest> {
    // Let the tail of phase 1 (queue places written once they settle)
    // pass first: rest starts once the operator has written no Transfer
    // for `quiet` (waiting at most 60 s), or after 2 s where writes are
    // not counted. (Its leader Lease and the pools' status are written
    // every few seconds for good, so they are not waited for.)
    let settle_start = Instant::now();
    // Queue places are written at most every 10 s each (the operator's
    // budget), so the last of them can follow a quiet spell that long.
    let quiet = Duration::from_secs(if quick { 3 } else { 12 });
    let mut quiet_since = Instant::now();
    let mut last = requests.tally().map(|t| transfer_writes(&t));
    loop {
        tokio::time::sleep(if last.is_some() {
            Duration::from_millis(500)
        } else {
            Duration::from_secs(2)
        })
        .await;
        alive(op)?;
        let Some(before) = last else { break };
        let now = requests.tally().map(|t| transfer_writes(&t));
        if now != Some(before) {
            quiet_since = Instant::now();
            last = now;
        }
        if quiet_since.elapsed() >= quiet || settle_start.elapsed() >= Duration::from_secs(60) {
            break;
        }
    }
    let settled_after = settle_start.elapsed().as_secs_f64();
    let reconciles = |m: Option<String>| {
        m.map(|m| {
            promtext::counter(
                &m,
                "wirerate_operator_reconciles_total",
                &[("controller", "transfer")],
            )
        })
    };
    let cpu0 = op.cpu_seconds();
    let bench0 = operator::cpu_seconds("/proc/self/stat");
    let server0 = operator::cpu_of(servers);
    let tally0 = requests.tally();
    let req0 = tally0.as_ref().map(operator_requests);
    let writes0 = tally0.as_ref().map(operator_writes);
    let rec0 = reconciles(op.metrics().await);
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs(secs);
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(200)).await;
        alive(op)?;
    }
    let secs = t0.elapsed().as_secs_f64();
    let cpu1 = op.cpu_seconds();
    let bench1 = operator::cpu_seconds("/proc/self/stat");
    let server1 = operator::cpu_of(servers);
    let tally1 = requests.tally();
    let req1 = tally1.as_ref().map(operator_requests);
    let writes1 = tally1.as_ref().map(operator_writes);
    let rec1 = reconciles(op.metrics().await);
    let mem = op.memory_kib();
    let percent = |a: Option<f64>, b: Option<f64>| Some(100.0 * (b? - a?) / secs);
    let mut r = Rest {
        seconds: secs,
        settled_after_seconds: settled_after,
        operator_cpu_percent: percent(cpu0, cpu1),
        bench_cpu_percent: percent(bench0, bench1),
        server_cpu_percent: percent(server0, server1),
        reconciles_per_second: match (rec0, rec1) {
            (Some(a), Some(b)) => Some((b - a) / secs),
            _ => None,
        },
        writes_per_second: match (writes0, writes1) {
            (Some(a), Some(b)) => Some((b - a) as f64 / secs),
            _ => None,
        },
        rss_mib: mem.map(|m| m.0 as f64 / 1024.0),
        peak_rss_mib: mem.map(|m| m.1 as f64 / 1024.0),
        ..Rest::default()
    };
    if let (Some(a), Some(b)) = (req0, req1) {
        let d = delta(&a, &b);
        r.operator_requests_per_second = Some(d.values().sum::<u64>() as f64 / secs);
        r.status_writes_per_second =
            Some(d.get("patch transfers/status").copied().unwrap_or(0) as f64 / secs);
        for (k, n) in d {
            let verb = k.split(' ').next().unwrap_or_default().to_owned();
            *r.operator_requests_by_verb.entry(verb).or_default() += n as f64 / secs;
            r.operator_requests_by_resource.insert(k, n as f64 / secs);
        }
    }
    Ok(r)
}

async fn refill_slots(
    client: &Client,
    op: &mut Operator,
    observer: &Arc<Mutex<Observer>>,
    refill: usize,
    timeout: Duration,
) -> anyhow::Result<Refill> {
    let (running, queued) = {
        let o = observer.lock().expect("observer lock");
        (o.running_keys(), o.queued())
    };
    let t0 = Instant::now();
    let chosen = agents::finish_running(client, &running, refill)
        .await
        .context("cannot report Transfers finished")?;
    let target = chosen.len().min(queued);
    let reports_seconds = t0.elapsed().as_secs_f64();
    let (mut refilled, mut succeeded) = (None, None);
    while t0.elapsed() < timeout {
        alive(op)?;
        {
            let o = observer.lock().expect("observer lock");
            let now = Instant::now();
            if refilled.is_none() && o.assigned_since(t0) >= target {
                refilled = Some(now);
            }
            if succeeded.is_none()
                && chosen
                    .iter()
                    .all(|k| o.phase(k) == Some(TransferPhase::Succeeded))
            {
                succeeded = Some(now);
            }
        }
        if refilled.is_some() && succeeded.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let newly_running = observer.lock().expect("observer lock").assigned_since(t0);
    Ok(Refill {
        finished: chosen.len(),
        target,
        reports_seconds,
        refill_seconds: refilled.map(|t| (t - t0).as_secs_f64()),
        succeeded_seconds: succeeded.map(|t| (t - t0).as_secs_f64()),
        newly_running,
    })
}
