//! `wirerate-agent`: serve, send, relay, probe, demo and run; what the command
//! line accepts is `wirerate_agent::cli`, what each command does is here.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use wirerate_agent::cli::{Cli, Cmd, SendTuning};
use wirerate_agent::observer::{Shown, watch_send};
use wirerate_agent::progress::Renderer;
use wirerate_agent::{demo, metrics};
use wirerate_engine::io::IoMode;
use wirerate_engine::net::SocketOpts;
use wirerate_engine::receiver::{DiscardPolicy, ServeConfig, Server};
use wirerate_engine::sender::pairs::{PairsSummary, send_over_pairs_via};
use wirerate_engine::sender::warm::Warm;
use wirerate_engine::sender::{SendConfig, send};
use wirerate_engine::summary::SendSummary;
use wirerate_engine::tuning::{self, Overrides};
use wirerate_telemetry::init_logs;

/// Raises the soft limit on open files to the hard one: a receiver serves
/// up to --max-connections sockets, far more than a default soft limit of
/// 1,024 descriptors allows once files are open too.
fn raise_fd_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut l = getrlimit(Resource::Nofile);
    if l.current < l.maximum {
        l.current = l.maximum;
        if let Err(e) = setrlimit(Resource::Nofile, l) {
            tracing::warn!(error = %e, "cannot raise the open-file limit");
        }
    }
}

/// One run of `send --repeat`.
#[derive(serde::Serialize)]
struct Repeated {
    run: u32,
    /// Seconds from the command's start to this run's.
    began_secs: f64,
    #[serde(flatten)]
    summary: SendSummary,
}

impl Repeated {
    fn render(&self) -> String {
        format!(
            "run {}, begun {:.2} s after the first:\n{}",
            self.run,
            self.began_secs,
            self.summary.render()
        )
    }
}

fn send_config(
    t: &SendTuning,
    to: String,
    token: Vec<u8>,
    source: PathBuf,
    dest: String,
) -> Result<SendConfig> {
    if !(t.retry_for.is_finite() && t.retry_for >= 0.0) {
        bail!("--retry-for must be a number of seconds >= 0");
    }
    let mut c = SendConfig::new(to, token, source, dest);
    c.socket = t.io.socket();
    c.tune(
        &Overrides {
            streams: t.streams.map(i128::from),
            block_size: t.block_size.map(i128::from),
            ..t.io.overrides()
        }
        .resolve()?,
    );
    c.per_link = t.streams.is_none();
    c.max_rate = t.max_rate;
    c.verify = t.verify;
    c.compress = t.compress;
    c.retry_for = Duration::from_secs_f64(t.retry_for);
    c.validate()?;
    Ok(c)
}

/// Who sends to each receiver of `send --to a,b,c --via -,h2:p,h3:p`:
/// `None` for this host.
fn senders(via: Option<&str>, receivers: usize) -> Result<Vec<Option<String>>> {
    let Some(v) = via else {
        return Ok(vec![None; receivers]);
    };
    v.split(',')
        .map(str::trim)
        .map(|h| match h {
            "" => bail!(
                "--via {v:?} has an empty entry: name a relay's host:port, or - for this host"
            ),
            "-" => Ok(None),
            h => Ok(Some(h.to_string())),
        })
        .collect()
}

/// The receivers of `send --to a,b,c`, when it names more than one.
fn receivers(to: &str, repeat: u32) -> Option<Result<Vec<String>>> {
    if !to.contains(',') {
        return None;
    }
    if repeat > 1 {
        return Some(Err(anyhow::anyhow!(
            "--repeat measures one pair's warm start: give --to one receiver"
        )));
    }
    Some(Ok(to.split(',').map(|t| t.trim().to_string()).collect()))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.cmd {
        Cmd::Serve(a) => serve(a),
        Cmd::Send(a) => send_cmd(*a),
        Cmd::Relay(a) => relay(a),
        Cmd::Run(a) => run_agent(a),
        Cmd::Probe(a) => probe(a),
        Cmd::Demo(a) => demo_cmd(a),
    }
}

/// `serve`.
fn serve(a: wirerate_agent::cli::ServeArgs) -> Result<ExitCode> {
    let log = init_logs("info");
    raise_fd_limit();
    let token = a.token.load()?;
    if !(a.checkpoint_interval.is_finite() && a.checkpoint_interval > 0.0) {
        bail!("--checkpoint-interval must be a positive number of seconds");
    }
    if !(a.idle_timeout.is_finite() && a.idle_timeout > 0.0) {
        bail!("--idle-timeout must be a positive number of seconds");
    }
    let mut cfg = ServeConfig::new(a.root, token);
    cfg.encrypt = a.token.encrypt;
    cfg.socket = a.io.socket();
    cfg.tune(&a.io.overrides().resolve()?);
    cfg.max_sessions = a.max_sessions;
    cfg.checkpoint_interval = Duration::from_secs_f64(a.checkpoint_interval);
    cfg.observer = Shown::metrics().printing_summaries(a.json).observe();
    cfg.max_memory = a.max_memory;
    cfg.max_connections = a.max_connections;
    cfg.idle_timeout = Duration::from_secs_f64(a.idle_timeout);
    cfg.umask = a.umask;
    cfg.discard = match (a.allow_discard, a.discard_only) {
        (_, true) => DiscardPolicy::Only,
        (true, false) => DiscardPolicy::Allow,
        (false, false) => DiscardPolicy::Refuse,
    };
    let endpoints = metrics::endpoints().with_log_level(log.clone());
    if let Some(m) = &a.metrics_addr {
        let addr = metrics::serve_endpoints(m, endpoints.clone())?;
        tracing::info!(%addr, "serving metrics on /metrics");
    }
    cfg.allow_delete = a.allow_delete;
    cfg.acls = a.keep_acls;
    cfg.owners = match (a.keep_owners, a.allow_root_owner) {
        (false, _) => wirerate_engine::metadata::OwnerPolicy::Ignore,
        (true, false) => wirerate_engine::metadata::OwnerPolicy::Keep,
        (true, true) => wirerate_engine::metadata::OwnerPolicy::KeepRoot,
    };
    if a.allow_delete {
        tracing::warn!(
            "--allow-delete: senders that mirror (send --delete) may delete beneath their destination directories what their sources do not have"
        );
    }
    let discard = cfg.discard;
    let server = Server::bind(&a.listen, cfg)?;
    endpoints.set_ready(true);
    tracing::info!(addr = %server.local_addr(), "serving");
    match discard {
        DiscardPolicy::Allow => tracing::warn!(
            "--allow-discard: senders may run memory-to-memory tests here; their data is verified and dropped, never written"
        ),
        DiscardPolicy::Only => tracing::info!(
            "--discard-only: this receiver takes memory-to-memory tests only and writes nothing"
        ),
        DiscardPolicy::Refuse => {}
    }
    server.run();
    Ok(ExitCode::SUCCESS)
}

/// `send`: to one receiver, or over several pairs.
fn send_cmd(a: wirerate_agent::cli::SendArgs) -> Result<ExitCode> {
    let _ = init_logs("warn");
    let token = a.token.load()?;
    let mut cfg = send_config(
        &a.tuning,
        a.to,
        token,
        a.source.unwrap_or_default(),
        a.dest.unwrap_or_default(),
    )?;
    cfg.synthetic = a.synthetic;
    cfg.sync = a.sync;
    cfg.dry_run = a.dry_run;
    cfg.filters = a.filters.filters()?;
    cfg.mirror = a.mirror.guard();
    cfg.keeping = a.keep.keeping();
    cfg.encrypt = a.token.encrypt;
    if a.via.is_some() && !cfg.to.contains(',') {
        bail!("--via names the sender of each of several receivers: give --to several");
    }
    // Several receivers share one root: a dry run asks the first, whose
    // plan is every pair's.
    // (Checked as the send would check them first.)
    if cfg.dry_run
        && let Some(to) = receivers(&cfg.to, a.repeat)
    {
        let mut to = to?;
        let via = senders(a.via.as_deref(), to.len())?;
        wirerate_engine::sender::pairs::check_named(&cfg, &to, &via)?;
        cfg.to = to.swap_remove(0);
    }
    if let Some(to) = receivers(&cfg.to, a.repeat) {
        let to = to?;
        let via = senders(a.via.as_deref(), to.len())?;
        let progress = watch_send(&mut cfg);
        let renderer = Renderer::start(Arc::clone(&progress), "send", a.quiet);
        let result = send_over_pairs_via(&cfg, &to, &via);
        renderer.finish();
        let summary = result?;
        wirerate_agent::summary::print(&summary, PairsSummary::render, a.json);
        return Ok(if summary.ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        });
    }
    cfg.warm = (a.repeat > 1).then(|| Arc::new(Warm::default()));
    let start = std::time::Instant::now();
    let mut all_ok = true;
    for run in 1..=a.repeat {
        if run > 1 {
            std::thread::sleep(Duration::from_secs_f64(a.repeat_pause));
        }
        let progress = watch_send(&mut cfg);
        let began = start.elapsed().as_secs_f64();
        let renderer = Renderer::start(Arc::clone(&progress), "send", a.quiet);
        let result = send(&cfg);
        renderer.finish();
        let summary = result?;
        all_ok &= summary.ok;
        if a.repeat == 1 {
            wirerate_agent::summary::print(&summary, SendSummary::render, a.json);
        } else {
            let r = Repeated {
                run,
                began_secs: began,
                summary,
            };
            wirerate_agent::summary::print(&r, Repeated::render, a.json);
        }
    }
    Ok(if all_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// `relay`.
fn relay(a: wirerate_agent::cli::RelayArgs) -> Result<ExitCode> {
    let _ = init_logs("info");
    raise_fd_limit();
    let token = a.token.load()?;
    let mut send = SendConfig::new("", token.clone(), PathBuf::new(), "");
    send.socket = a.io.socket();
    send.encrypt = a.token.encrypt;
    send.tune(&a.io.overrides().resolve()?);
    let relay = wirerate_engine::relay::Relay::bind(
        &a.listen,
        wirerate_engine::relay::RelayConfig {
            token,
            encrypt: a.token.encrypt,
            roots: a.allow_root,
            send,
            max_memory: a.max_memory,
            job_memory: None,
        },
    )?;
    tracing::info!(addr = %relay.local_addr()?, "relaying");
    relay.run();
    Ok(ExitCode::SUCCESS)
}

/// `run`: the in-cluster agent.
fn run_agent(a: wirerate_agent::cli::RunArgs) -> Result<ExitCode> {
    let log = init_logs("info,kube=warn");
    raise_fd_limit();
    let advertise = match (a.advertise, &a.interface) {
        (Some(addr), _) => addr,
        (None, Some(nic)) => wirerate_agent::cluster::host::interface_address(nic)
            .with_context(|| format!("interface {nic} has no IPv4 address to advertise"))?
            .to_string(),
        (None, None) => {
            bail!("set --advertise (WIRERATE_ADVERTISE) or --interface (WIRERATE_INTERFACE)")
        }
    };
    if a.metrics_port != 0 {
        // Ready at once: its pods' probe is the port itself, and the
        // cluster loop reports its own state in its Lease.
        let endpoints = metrics::endpoints().with_log_level(log.clone());
        endpoints.set_ready(true);
        let addr = metrics::serve_endpoints(&format!("0.0.0.0:{}", a.metrics_port), endpoints)?;
        tracing::info!(%addr, "serving metrics on /metrics");
    }
    let node = a
        .node
        .unwrap_or_else(|| wirerate_engine::io::caps::sysctl("kernel.hostname"));
    let cfg = wirerate_agent::cluster::RunConfig {
        agent: a.agent_name,
        namespace: a.namespace,
        pool: a.pool,
        node,
        advertise,
        data_port: a.data_port,
        max_transfers: a.max_transfers,
        watch_namespaces: a.watch_namespaces,
        in_pod: std::env::var_os("KUBERNETES_SERVICE_HOST").is_some(),
        path_test_delay: Duration::from_secs(a.path_test_delay),
    };
    let rt = tokio::runtime::Runtime::new()?;
    // On a task of its own, so that a signal does not wait for its teardown
    // (dropping a receiving job joins its accept thread): the runtime is
    // given a second to stop, then left.
    let agent = rt.spawn(wirerate_agent::cluster::run(cfg));
    let outcome = rt.block_on(async {
        tokio::select! {
            r = agent => r.context("the agent's task")?.map_err(anyhow::Error::from),
            s = terminated() => s.map(|_| ()).context("setting up the SIGTERM and SIGINT handlers"),
        }
    });
    // Transfer threads are not waited for, whatever ended the agent: what
    // they acknowledged is durable, and the next attempt resumes from it.
    rt.shutdown_timeout(Duration::from_secs(1));
    outcome?;
    Ok(ExitCode::SUCCESS)
}

/// Waits for SIGTERM or SIGINT, and says which. A pod's PID 1 has no default action for
/// them: without a handler, the kubelet's SIGTERM (a pod deleted, a node
/// drained, a rollout) is ignored and the pod takes its whole grace period
/// to go, holding its node's ports.
async fn terminated() -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let signal = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    };
    tracing::info!(
        signal,
        "stopping: what this agent's transfers acknowledged is checkpointed, and their next attempt resumes from it"
    );
    Ok(())
}

/// `probe`.
fn probe(a: wirerate_agent::cli::ProbeArgs) -> Result<ExitCode> {
    let _ = init_logs("warn");
    let bounds = wirerate_engine::probe::PHASE_SECONDS;
    if !(a.seconds.is_finite() && bounds.contains(&a.seconds)) {
        bail!(
            "--seconds must be between {} and {}",
            bounds.start(),
            bounds.end()
        );
    }
    tuning::BLOCK_SIZE.check(a.block_size.into())?;
    let cfg = wirerate_engine::probe::ProbeConfig {
        to: a.to,
        token: a.token.load()?,
        encrypt: a.token.encrypt,
        streams: a.streams,
        seconds: a.seconds,
        block_size: a.block_size,
        socket: SocketOpts {
            congestion: a.congestion,
            pacing: None,
            buffer: a.socket_buffer.map(|b| b as usize),
        },
        max_rate: None,
        cancel: None,
    };
    let report = wirerate_engine::probe::probe(&cfg)?;
    wirerate_agent::summary::print(&report, wirerate_engine::probe::ProbeReport::render, a.json);
    Ok(ExitCode::SUCCESS)
}

/// `demo`: the README's first command.
fn demo_cmd(a: wirerate_agent::cli::DemoArgs) -> Result<ExitCode> {
    let _ = init_logs("warn");
    let mut send_cfg = send_config(
        &a.tuning,
        String::new(),
        b"demo".to_vec(),
        PathBuf::new(),
        String::new(),
    )?;
    send_cfg.retry_for = Duration::ZERO;
    send_cfg.encrypt = a.encrypt;
    let modes = if a.all_modes {
        vec![IoMode::Buffered, IoMode::Direct, IoMode::Async]
    } else {
        vec![a.tuning.io.io_mode]
    };
    demo::clean_up_on_signals()?;
    let report = demo::run(&demo::DemoConfig {
        size: a.size,
        dir: a.dir,
        send: send_cfg,
        modes,
        keep: a.keep,
        quiet: a.json,
    })?;
    wirerate_agent::summary::print(&report, demo::DemoReport::render, a.json);
    Ok(ExitCode::SUCCESS)
}
