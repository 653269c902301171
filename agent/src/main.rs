//! `wirerate-agent`: serve, send, demo.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use wirerate_agent::observer::Shown;
use wirerate_agent::progress::{Progress, Renderer};
use wirerate_agent::units::{parse_rate, parse_size};
use wirerate_agent::{demo, metrics};
use wirerate_crds::contract;
use wirerate_engine::io::IoMode;
use wirerate_engine::net::SocketOpts;
use wirerate_engine::receiver::{DiscardPolicy, ServeConfig, Server};
use wirerate_engine::sender::warm::Warm;
use wirerate_engine::sender::{SendConfig, send};
use wirerate_engine::summary::SendSummary;
use wirerate_engine::tuning::{self, Overrides};
use wirerate_engine::wire::Verification;
use wirerate_telemetry::init_logs;

#[derive(Parser)]
#[command(
    name = "wirerate-agent",
    version,
    about = "Disk-to-disk transfers at the wire rate"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Receive transfers, writing beneath --root.
    Serve(ServeArgs),
    /// Send a file or a directory tree to a receiver.
    Send(SendArgs),
    /// A real transfer on this machine with a generated file (the README's first command).
    Demo(DemoArgs),
    /// A short memory-to-memory test of the path to a receiver (which must
    /// run with --allow-discard): one stream, then several; what the kernel
    /// measured of each; and what to use.
    Probe(ProbeArgs),
    /// In-cluster mode: renew this agent's Lease and run the Transfers assigned to it.
    Run(RunArgs),
}

/// Identity and ports of an agent in a DtnPool; the operator's pod template sets them.
#[derive(Args)]
struct RunArgs {
    /// Agent name (the pod name in the cluster).
    #[arg(long, env = "WIRERATE_AGENT_NAME")]
    agent_name: String,
    /// Namespace of the agent's DtnPool.
    #[arg(long, env = "WIRERATE_NAMESPACE")]
    namespace: String,
    /// The agent's DtnPool.
    #[arg(long, env = "WIRERATE_POOL")]
    pool: String,
    /// Node or host name (default: this host's name).
    #[arg(long, env = "WIRERATE_NODE")]
    node: Option<String>,
    /// Address senders reach this agent at.
    #[arg(long, env = "WIRERATE_ADVERTISE")]
    advertise: Option<String>,
    /// NIC whose IPv4 address to advertise, when --advertise is not given.
    #[arg(long, env = "WIRERATE_INTERFACE")]
    interface: Option<String>,
    /// First data port; each transfer received binds the next free one.
    #[arg(long, env = "WIRERATE_DATA_PORT", default_value_t = 7700)]
    data_port: u16,
    /// Port of /metrics (0: none).
    #[arg(long, env = "WIRERATE_METRICS_PORT", default_value_t = 9700)]
    metrics_port: u16,
    /// Transfers this agent runs at once.
    #[arg(long, env = "WIRERATE_MAX_TRANSFERS", default_value_t = 2,
          value_parser = clap::value_parser!(u16).range(1..=i64::from(contract::MAX_TRANSFERS_PER_AGENT)))]
    max_transfers: u16,
    /// Other namespaces whose Transfers this pool serves, comma-separated.
    #[arg(
        long,
        env = "WIRERATE_WATCH_NAMESPACES",
        default_value = "",
        value_delimiter = ','
    )]
    watch_namespaces: Vec<String>,
}

#[derive(Args, Clone)]
struct IoArgs {
    /// I/O mode: buffered (page cache), direct (O_DIRECT, one request), async (io_uring, many).
    #[arg(long, default_value_t = IoMode::default(), value_parser = names::<IoMode>(IoMode::ALL.map(IoMode::as_str)))]
    io_mode: IoMode,
    /// Requests in flight in async mode.
    #[arg(long, default_value_t = tuning::QUEUE_DEPTH.default)]
    queue_depth: u64,
    /// In-flight buffer memory, e.g. 4GiB [default: 512MiB, or two blocks when --block-size is larger].
    #[arg(long, value_parser = size)]
    buffer: Option<u64>,
    /// TCP congestion control (cubic, bbr, reno, ...); default: the kernel's.
    #[arg(long)]
    congestion: Option<String>,
    /// Explicit socket buffer size (disables autotuning), e.g. 64MiB.
    #[arg(long, value_parser = size)]
    socket_buffer: Option<u64>,
}

impl IoArgs {
    /// The flags as the engine's overrides: the path a Transfer's tuning
    /// takes too, so the same bounds refuse the same values with the same
    /// message.
    fn overrides(&self) -> Overrides {
        Overrides {
            io_mode: Some(self.io_mode),
            queue_depth: Some(self.queue_depth.into()),
            buffer: self.buffer.map(i128::from),
            congestion: self.congestion.clone(),
            ..Overrides::default()
        }
    }

    fn socket(&self) -> SocketOpts {
        SocketOpts {
            congestion: self.congestion.clone(),
            pacing: None,
            buffer: self.socket_buffer.map(|b| b as usize),
        }
    }
}

#[derive(Args)]
struct TokenArgs {
    /// File holding the shared secret (or set WIRERATE_TOKEN).
    #[arg(long, env = "WIRERATE_TOKEN_FILE")]
    token_file: Option<PathBuf>,
}

impl TokenArgs {
    /// The token; says what is weak about how it is kept (logs must be
    /// set up first).
    fn load(&self) -> Result<Vec<u8>> {
        let token = match (&self.token_file, std::env::var("WIRERATE_TOKEN")) {
            (Some(p), _) => wirerate_agent::token::from_file(p)?,
            (None, Ok(t)) => wirerate_agent::token::from_env("WIRERATE_TOKEN", &t)?,
            (None, Err(_)) => bail!("no token: pass --token-file FILE or set WIRERATE_TOKEN"),
        };
        for w in &token.warnings {
            tracing::warn!("{w}");
        }
        Ok(token.bytes)
    }
}

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

#[derive(Args)]
struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0:7470")]
    listen: String,
    /// Directory everything is written beneath.
    #[arg(long)]
    root: PathBuf,
    #[command(flatten)]
    token: TokenArgs,
    #[command(flatten)]
    io: IoArgs,
    /// Serve Prometheus metrics on this address, e.g. 0.0.0.0:9470.
    #[arg(long)]
    metrics_addr: Option<String>,
    /// Concurrent sessions.
    #[arg(long, default_value_t = 16, value_parser = at_least_one)]
    max_sessions: usize,
    /// Buffer memory all sessions together may hold, e.g. 4GiB (default:
    /// --max-sessions x --buffer).
    #[arg(long, value_parser = size)]
    max_memory: Option<u64>,
    /// Connections served at once (each costs a thread).
    #[arg(long, default_value_t = wirerate_engine::receiver::MAX_CONNECTIONS, value_parser = at_least_one)]
    max_connections: usize,
    /// Seconds a sender may stay silent (not even a keepalive) before its
    /// session is ended and its files released; at least 10.
    #[arg(long, default_value_t = wirerate_engine::wire::IDLE_TIMEOUT.as_secs_f64(), value_parser = seconds)]
    idle_timeout: f64,
    /// Permission bits cleared from the modes senders' files carry (octal).
    #[arg(long, default_value = "022", value_parser = umask)]
    umask: u32,
    /// Seconds between checkpoints of durable blocks.
    #[arg(long, default_value_t = 1.0, value_parser = seconds)]
    checkpoint_interval: f64,
    /// Print session summaries as JSON.
    #[arg(long)]
    json: bool,
    /// Take memory-to-memory tests (send --synthetic): their data is
    /// verified and dropped, nothing is written. Off by default.
    #[arg(long)]
    allow_discard: bool,
    /// Take memory-to-memory tests and nothing else: a standing
    /// path-test listener (for `probe`), whose token lets its holders
    /// measure the path but never write a file under the root.
    #[arg(long, conflicts_with = "allow_discard")]
    discard_only: bool,
}

#[derive(Args)]
struct SendArgs {
    /// Receiver address, host:port.
    #[arg(long)]
    to: String,
    #[command(flatten)]
    token: TokenArgs,
    /// File or directory to send.
    #[arg(required_unless_present = "synthetic")]
    source: Option<PathBuf>,
    /// Destination relative to the receiver's root (end with / to keep the file name).
    #[arg(required_unless_present = "synthetic")]
    dest: Option<String>,
    /// Send this much generated data instead of a file, e.g. 20GiB: a
    /// memory-to-memory test of the path and the engine, with no disk read
    /// or written. The receiver verifies the data and drops it; it must run
    /// with --allow-discard.
    #[arg(long, value_parser = size, conflicts_with = "source")]
    synthetic: Option<u64>,
    #[command(flatten)]
    tuning: SendTuning,
    /// Send it this many times, one after another, in this process: each
    /// run after the first joins over the data connections the last one
    /// parked (as a long-running sender's next transfer to the same
    /// receiver does), skipping TCP's handshake and, where
    /// net.ipv4.tcp_slow_start_after_idle is 0, its slow start. For
    /// measuring the warm start; bench/run does.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    repeat: u32,
    /// Seconds to wait between the runs of --repeat: a warm connection
    /// idle longer than its retransmission timeout starts TCP's slow start
    /// again, unless net.ipv4.tcp_slow_start_after_idle is 0.
    #[arg(long, default_value_t = 0.0, requires = "repeat", value_parser = repeat_pause)]
    repeat_pause: f64,
    /// Print the summary as one JSON object (one per line with --repeat,
    /// each with its run's number and start).
    #[arg(long)]
    json: bool,
    /// No progress output.
    #[arg(long, short)]
    quiet: bool,
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

#[derive(Args, Clone)]
struct SendTuning {
    /// Parallel TCP streams [default: 4, or more when the path's round trip
    /// and the hosts' TCP buffer maximums need more to carry 10 Gbit/s (or
    /// --max-rate); the summary says why].
    #[arg(long)]
    streams: Option<u64>,
    /// Content block size, a multiple of 4 KiB, e.g. 64MiB [default: 16MiB, or half of --buffer when that is smaller].
    #[arg(long, value_parser = size)]
    block_size: Option<u64>,
    #[command(flatten)]
    io: IoArgs,
    /// Cap the transfer's rate, e.g. 5Gbps (TCP pacing, split over the streams).
    #[arg(long, value_parser = rate)]
    max_rate: Option<u64>,
    /// none: trust TCP; checksums: checksum every block and compare file digests; reread: also re-read from disk.
    #[arg(long, default_value_t = Verification::default(), value_parser = names::<Verification>(Verification::ALL.map(Verification::as_str)))]
    verify: Verification,
    /// Keep reconnecting and resuming this long after a failure, e.g. 120 (seconds).
    #[arg(long, default_value_t = 120.0, value_parser = seconds)]
    retry_for: f64,
}

#[derive(Args)]
struct ProbeArgs {
    /// Receiver address, host:port.
    #[arg(long)]
    to: String,
    #[command(flatten)]
    token: TokenArgs,
    /// Streams of the second phase.
    #[arg(long, default_value_t = 8,
          value_parser = clap::value_parser!(u16).range(2..=i64::try_from(tuning::STREAMS.max).unwrap_or(i64::MAX)))]
    streams: u16,
    /// About how long each phase lasts, seconds (0.5 to 60).
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Content block size, e.g. 4MiB.
    #[arg(long, default_value = "4MiB", value_parser = size)]
    block_size: u64,
    /// TCP congestion control to test with; default: the kernel's.
    #[arg(long)]
    congestion: Option<String>,
    /// Explicit socket buffer size to test with (disables autotuning).
    #[arg(long, value_parser = size)]
    socket_buffer: Option<u64>,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct DemoArgs {
    /// Size of the generated test file.
    #[arg(long, default_value = "2GiB", value_parser = size)]
    size: u64,
    /// Directory for the temporary files (a real disk, not tmpfs).
    #[arg(long, env = "TMPDIR", default_value = "/var/tmp")]
    dir: PathBuf,
    /// Run one transfer in each I/O mode (buffered, direct, async) and compare.
    #[arg(long)]
    all_modes: bool,
    /// Keep the generated files.
    #[arg(long)]
    keep: bool,
    #[command(flatten)]
    tuning: SendTuning,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

fn size(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}
fn rate(s: &str) -> Result<u64, String> {
    parse_rate(s).map_err(|e| e.to_string())
}
/// The longest duration a flag takes: a year. Past it, a deadline of
/// `now` plus it could overflow, and `--retry-for 1e300` panicked.
const MOST_SECONDS: f64 = 365.0 * 24.0 * 3600.0;

fn seconds(s: &str) -> Result<f64, String> {
    s.parse::<f64>()
        .ok()
        .filter(|v| (0.0..=MOST_SECONDS).contains(v))
        .ok_or_else(|| {
            format!("{s:?} is not a number of seconds from 0 to {MOST_SECONDS:.0} (a year)")
        })
}
fn repeat_pause(s: &str) -> Result<f64, String> {
    s.parse::<f64>()
        .ok()
        .filter(|p| (0.0..=3600.0).contains(p))
        .ok_or_else(|| format!("{s:?} is not a number of seconds from 0 to 3600"))
}
fn umask(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s, 8)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| format!("{s:?} is not an octal permission mask (000 to 777)"))
}
/// A parser of one of `names` (listed in `--help`) into `T`; `blocks` is
/// the old name of `checksums`.
fn names<T>(names: [&'static str; 3]) -> impl clap::builder::TypedValueParser<Value = T>
where
    T: std::str::FromStr + Clone + Send + Sync + 'static,
    T::Err: std::error::Error + Send + Sync + 'static,
{
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new(names.map(|n| {
        let v = PossibleValue::new(n);
        if n == "checksums" {
            v.alias("blocks")
        } else {
            v
        }
    }))
    .try_map(|s| s.parse::<T>())
}

fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("{s:?} is not a whole number of at least 1")),
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
    c.retry_for = Duration::from_secs_f64(t.retry_for);
    c.validate()?;
    Ok(c)
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
        Cmd::Serve(a) => {
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
        Cmd::Send(a) => {
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
            cfg.warm = (a.repeat > 1).then(|| Arc::new(Warm::default()));
            let start = std::time::Instant::now();
            let mut all_ok = true;
            for run in 1..=a.repeat {
                if run > 1 {
                    std::thread::sleep(Duration::from_secs_f64(a.repeat_pause));
                }
                let progress = Arc::new(Progress::default());
                cfg.observer = Shown::metrics()
                    .with_progress(Arc::clone(&progress))
                    .observe();
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
        Cmd::Run(a) => {
            let log = init_logs("info,kube=warn");
            raise_fd_limit();
            let advertise = match (a.advertise, &a.interface) {
                (Some(addr), _) => addr,
                (None, Some(nic)) => wirerate_agent::cluster::host::interface_address(nic)
                    .with_context(|| format!("interface {nic} has no IPv4 address to advertise"))?
                    .to_string(),
                (None, None) => bail!(
                    "set --advertise (WIRERATE_ADVERTISE) or --interface (WIRERATE_INTERFACE)"
                ),
            };
            if a.metrics_port != 0 {
                // Ready at once: its pods' probe is the port itself, and the
                // cluster loop reports its own state in its Lease.
                let endpoints = metrics::endpoints().with_log_level(log.clone());
                endpoints.set_ready(true);
                let addr =
                    metrics::serve_endpoints(&format!("0.0.0.0:{}", a.metrics_port), endpoints)?;
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
            };
            tokio::runtime::Runtime::new()?.block_on(wirerate_agent::cluster::run(cfg))?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Probe(a) => {
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
            wirerate_agent::summary::print(
                &report,
                wirerate_engine::probe::ProbeReport::render,
                a.json,
            );
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Demo(a) => {
            let _ = init_logs("warn");
            let mut send_cfg = send_config(
                &a.tuning,
                String::new(),
                b"demo".to_vec(),
                PathBuf::new(),
                String::new(),
            )?;
            send_cfg.retry_for = Duration::ZERO;
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
    }
}
