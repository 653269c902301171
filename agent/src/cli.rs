//! What the command line accepts: the subcommands, their flags and the
//! parsers of their values. `main.rs` carries them out; the flags' reference
//! in docs/ is written from `command()`.

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::{Args, CommandFactory, Parser, Subcommand};
use wirerate_crds::contract;
use wirerate_engine::compress::Compression;
use wirerate_engine::encryption::Encryption;
use wirerate_engine::io::IoMode;
use wirerate_engine::net::SocketOpts;
use wirerate_engine::sync::SyncLevel;
use wirerate_engine::tuning::{self, Overrides};
use wirerate_engine::wire::Verification;

use crate::cluster::path_tests;
use crate::units::{parse_rate, parse_size};

/// The whole command line, as `--help` and the flags' reference show it.
pub fn command() -> clap::Command {
    Cli::command()
}

#[derive(Parser)]
#[command(
    name = "wirerate-agent",
    version,
    about = "Disk-to-disk transfers at the wire rate"
)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand)]
pub enum Cmd {
    /// Receive transfers, writing beneath --root.
    Serve(ServeArgs),
    /// Send a file or a directory tree to a receiver.
    Send(Box<SendArgs>),
    /// Run the data sessions of another host's `send --via`, from this
    /// host's view of the same shared source.
    Relay(RelayArgs),
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
pub struct RunArgs {
    /// Agent name (the pod name in the cluster).
    #[arg(long, env = "WIRERATE_AGENT_NAME")]
    pub agent_name: String,
    /// Namespace of the agent's DtnPool.
    #[arg(long, env = "WIRERATE_NAMESPACE")]
    pub namespace: String,
    /// The agent's DtnPool.
    #[arg(long, env = "WIRERATE_POOL")]
    pub pool: String,
    /// Node or host name (default: this host's name).
    #[arg(long, env = "WIRERATE_NODE")]
    pub node: Option<String>,
    /// Address senders reach this agent at.
    #[arg(long, env = "WIRERATE_ADVERTISE")]
    pub advertise: Option<String>,
    /// NIC whose IPv4 address to advertise, when --advertise is not given.
    #[arg(long, env = "WIRERATE_INTERFACE")]
    pub interface: Option<String>,
    /// First data port; each transfer received binds the next free one.
    #[arg(long, env = "WIRERATE_DATA_PORT", default_value_t = 7700)]
    pub data_port: u16,
    /// Port of /metrics (0: none).
    #[arg(long, env = "WIRERATE_METRICS_PORT", default_value_t = 9700)]
    pub metrics_port: u16,
    /// Transfers this agent runs at once.
    #[arg(long, env = "WIRERATE_MAX_TRANSFERS", default_value_t = 2,
          value_parser = clap::value_parser!(u16).range(1..=i64::from(contract::MAX_TRANSFERS_PER_AGENT)))]
    pub max_transfers: u16,
    /// Other namespaces whose Transfers this pool serves, comma-separated.
    #[arg(
        long,
        env = "WIRERATE_WATCH_NAMESPACES",
        default_value = "",
        value_delimiter = ','
    )]
    pub watch_namespaces: Vec<String>,
    /// Seconds from learning of a path-test target to its first test, at
    /// the least; each target's first test comes up to twice as much later
    /// again, spread by tester and target.
    #[arg(long, env = "WIRERATE_PATH_TEST_DELAY",
          default_value_t = path_tests::FIRST_DELAY.as_secs(),
          value_parser = clap::value_parser!(u64).range(path_tests::FIRST_DELAY_BOUNDS_S))]
    pub path_test_delay: u64,
}

#[derive(Args, Clone)]
pub struct IoArgs {
    /// I/O mode: buffered (page cache), direct (O_DIRECT, one request), async (io_uring, many).
    #[arg(long, default_value_t = IoMode::default(), value_parser = names::<IoMode, 3>(IoMode::ALL.map(IoMode::as_str)))]
    pub io_mode: IoMode,
    /// Requests in flight in async mode.
    #[arg(long, default_value_t = tuning::QUEUE_DEPTH.default)]
    pub queue_depth: u64,
    /// In-flight buffer memory, e.g. 4GiB [default: 512MiB, or two blocks when --block-size is larger].
    #[arg(long, value_parser = size)]
    pub buffer: Option<u64>,
    /// TCP congestion control (cubic, bbr, reno, ...); default: the kernel's.
    #[arg(long)]
    pub congestion: Option<String>,
    /// Explicit socket buffer size (disables autotuning), e.g. 64MiB.
    #[arg(long, value_parser = size)]
    pub socket_buffer: Option<u64>,
}

impl IoArgs {
    /// The flags as the engine's overrides: the path a Transfer's tuning
    /// takes too, so the same bounds refuse the same values with the same
    /// message.
    pub fn overrides(&self) -> Overrides {
        Overrides {
            io_mode: Some(self.io_mode),
            queue_depth: Some(self.queue_depth.into()),
            buffer: self.buffer.map(i128::from),
            congestion: self.congestion.clone(),
            ..Overrides::default()
        }
    }

    pub fn socket(&self) -> SocketOpts {
        SocketOpts {
            congestion: self.congestion.clone(),
            pacing: None,
            buffer: self.socket_buffer.map(|b| b as usize),
        }
    }
}

#[derive(Args)]
pub struct TokenArgs {
    /// File holding the shared secret (or set WIRERATE_TOKEN).
    #[arg(long, env = "WIRERATE_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Encrypt connections with TLS 1.3: required (refuse a peer that
    /// will not, never a byte in clear), preferred (whenever the peer
    /// can), or none. Keys are made per process and bound to the token;
    /// the summary says what was in effect.
    #[arg(long, env = "WIRERATE_ENCRYPT", default_value_t = Encryption::default(), value_parser = encryption())]
    pub encrypt: Encryption,
}

impl TokenArgs {
    /// The token; says what is weak about how it is kept (logs must be
    /// set up first).
    pub fn load(&self) -> Result<Vec<u8>> {
        let token = match (&self.token_file, std::env::var("WIRERATE_TOKEN")) {
            (Some(p), _) => crate::token::from_file(p)?,
            (None, Ok(t)) => crate::token::from_env("WIRERATE_TOKEN", &t)?,
            (None, Err(_)) => bail!("no token: pass --token-file FILE or set WIRERATE_TOKEN"),
        };
        for w in &token.warnings {
            tracing::warn!("{w}");
        }
        Ok(token.bytes)
    }
}

#[derive(Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0:7470")]
    pub listen: String,
    /// Directory everything is written beneath.
    #[arg(long)]
    pub root: PathBuf,
    #[command(flatten)]
    pub token: TokenArgs,
    #[command(flatten)]
    pub io: IoArgs,
    /// Serve Prometheus metrics on this address, e.g. 0.0.0.0:9470.
    #[arg(long)]
    pub metrics_addr: Option<String>,
    /// Concurrent sessions.
    #[arg(long, default_value_t = 16, value_parser = at_least_one)]
    pub max_sessions: usize,
    /// Buffer memory all sessions together may hold, e.g. 4GiB (default:
    /// --max-sessions x --buffer).
    #[arg(long, value_parser = size)]
    pub max_memory: Option<u64>,
    /// Connections served at once (each costs a thread).
    #[arg(long, default_value_t = wirerate_engine::receiver::MAX_CONNECTIONS, value_parser = at_least_one)]
    pub max_connections: usize,
    /// Seconds a sender may stay silent (not even a keepalive) before its
    /// session is ended and its files released; at least 10.
    #[arg(long, default_value_t = wirerate_engine::wire::IDLE_TIMEOUT.as_secs_f64(), value_parser = seconds)]
    pub idle_timeout: f64,
    /// Permission bits cleared from the modes senders' files carry (octal).
    #[arg(long, default_value = "022", value_parser = umask)]
    pub umask: u32,
    /// Seconds between checkpoints of durable blocks.
    #[arg(long, default_value_t = 1.0, value_parser = seconds)]
    pub checkpoint_interval: f64,
    /// Print session summaries as JSON.
    #[arg(long)]
    pub json: bool,
    /// Take memory-to-memory tests (send --synthetic): their data is
    /// verified and dropped, nothing is written. Off by default.
    #[arg(long)]
    pub allow_discard: bool,
    /// Take memory-to-memory tests and nothing else: a standing
    /// path-test listener (for `probe`), whose token lets its holders
    /// measure the path but never write a file under the root.
    #[arg(long, conflicts_with = "allow_discard")]
    pub discard_only: bool,
    /// Let senders mirror (send --delete): once every file of a send
    /// landed, its sender may delete beneath the destination directory
    /// what its source does not have. Only entries this receiver lists
    /// there go, never through a symlink, never its own temporary files.
    /// Off by default.
    #[arg(long, conflicts_with = "discard_only")]
    pub allow_delete: bool,
    /// Set the owners and groups senders send (send --keep owner), as
    /// their maps made them: run as root, or with CAP_CHOWN, CAP_FOWNER
    /// and CAP_DAC_OVERRIDE (a directory given away is written into by a
    /// later session). Root's (id 0) only with --allow-root-owner. Off:
    /// every file is owned by this receiver.
    #[arg(long)]
    pub keep_owners: bool,
    /// With --keep-owners: give files root's owner or group too, where a
    /// sender sends id 0 (a file owned by root keeps what root's files
    /// may do: think twice on shared storage).
    #[arg(long, requires = "keep_owners")]
    pub allow_root_owner: bool,
    /// Set the POSIX ACLs senders send (send --keep acls). An ACL grants
    /// access to the users and groups it names (their ids mapped by the
    /// sender's --uid-map and --gid-map). Off: files get their mode alone.
    #[arg(long)]
    pub keep_acls: bool,
}

#[derive(Args)]
pub struct SendArgs {
    /// Receiver address, host:port; or several, comma-separated, that
    /// share one root (one file system mounted by all of them): the
    /// transfer is split over as many pairs, a receiver lost on the way
    /// hands its pieces to the others, and each file is verified and
    /// published once.
    #[arg(long)]
    pub to: String,
    /// With several receivers: the host that sends each one's data, in
    /// --to's order, comma-separated; - for this host, else a relay's
    /// host:port (`wirerate relay`, which reads the same source through
    /// shared storage). So one transfer reads and sends from several
    /// hosts. Default: this host sends to every receiver.
    #[arg(long, allow_hyphen_values = true)]
    pub via: Option<String>,
    #[command(flatten)]
    pub token: TokenArgs,
    /// File or directory to send.
    #[arg(required_unless_present = "synthetic")]
    pub source: Option<PathBuf>,
    /// Destination relative to the receiver's root (end with / to keep the file name).
    #[arg(required_unless_present = "synthetic")]
    pub dest: Option<String>,
    /// Send this much generated data instead of a file, e.g. 20GiB: a
    /// memory-to-memory test of the path and the engine, with no disk read
    /// or written. The receiver verifies the data and drops it; it must run
    /// with --allow-discard.
    #[arg(long, value_parser = size, conflicts_with = "source")]
    pub synthetic: Option<u64>,
    /// Leave files the destination already has: exists (any regular file
    /// at the path), size (the same size), mtime (the same size and
    /// modification time; wirerate publishes every file with its
    /// source's), checksum (the same size and contents, by digest: both
    /// ends read every such file first), or none (send every file). The receiver compares; files
    /// left are counted in the summary. With several receivers, the first
    /// is asked before the pairs start.
    #[arg(long, env = "WIRERATE_SYNC", default_value_t = SyncLevel::default(), value_parser = names::<SyncLevel, 5>(SyncLevel::ALL.map(SyncLevel::as_str)))]
    pub sync: SyncLevel,
    /// Plan only: print what a send would do (the files it would send,
    /// those the destination already has at --sync, those it would
    /// refuse) and send nothing. The receiver plans from what is beneath
    /// its root and creates and changes nothing. Exits 1 when a run would
    /// refuse a file. With several receivers (which share one root), the
    /// first plans.
    #[arg(long, conflicts_with_all = ["synthetic", "repeat"])]
    pub dry_run: bool,
    #[command(flatten)]
    pub filters: FilterArgs,
    #[command(flatten)]
    pub mirror: MirrorArgs,
    #[command(flatten)]
    pub keep: KeepArgs,
    #[command(flatten)]
    pub tuning: SendTuning,
    /// Send it this many times, one after another, in this process: each
    /// run after the first joins over the data connections the last one
    /// parked (as a long-running sender's next transfer to the same
    /// receiver does), skipping TCP's handshake and, where
    /// net.ipv4.tcp_slow_start_after_idle is 0, its slow start. For
    /// measuring the warm start; bench/run does.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub repeat: u32,
    /// Seconds to wait between the runs of --repeat: a warm connection
    /// idle longer than its retransmission timeout starts TCP's slow start
    /// again, unless net.ipv4.tcp_slow_start_after_idle is 0.
    #[arg(long, default_value_t = 0.0, requires = "repeat", value_parser = repeat_pause)]
    pub repeat_pause: f64,
    /// Print the summary as one JSON object (one per line with --repeat,
    /// each with its run's number and start).
    #[arg(long)]
    pub json: bool,
    /// No progress output.
    #[arg(long, short)]
    pub quiet: bool,
}

/// What a send keeps of each file beyond its data, mode and times.
#[derive(Args, Clone)]
pub struct KeepArgs {
    /// Keep, comma-separated: owner (owner and group ids; the receiver
    /// sets them only with serve --keep-owners), xattrs (extended
    /// attributes in the user. namespace), acls (POSIX ACLs, their named
    /// ids mapped too; the receiver sets them only with serve
    /// --keep-acls). A file the receiver cannot give them lands all the
    /// same, and its log says why. Directories the send makes get them
    /// too; those already there keep theirs.
    #[arg(long, value_name = "WHAT", default_value = "none", value_parser = |s: &str| s.parse::<wirerate_engine::metadata::Keep>())]
    pub keep: wirerate_engine::metadata::Keep,
    /// With --keep owner: owner ids of this site mapped to the
    /// receiving site's, FROM:TO comma-separated (e.g. 1000:2000); an id
    /// not listed goes as it is.
    #[arg(long, value_name = "MAP", default_value = "", value_parser = |s: &str| s.parse::<wirerate_engine::metadata::IdMap>())]
    pub uid_map: wirerate_engine::metadata::IdMap,
    /// With --keep owner: group ids, likewise.
    #[arg(long, value_name = "MAP", default_value = "", value_parser = |s: &str| s.parse::<wirerate_engine::metadata::IdMap>())]
    pub gid_map: wirerate_engine::metadata::IdMap,
}

impl KeepArgs {
    /// What the send keeps.
    pub fn keeping(&self) -> wirerate_engine::sender::Keeping {
        wirerate_engine::sender::Keeping {
            keep: self.keep,
            uids: self.uid_map.clone(),
            gids: self.gid_map.clone(),
        }
    }
}

/// Mirroring: deleting at the destination what the source does not have.
#[derive(Args, Clone)]
pub struct MirrorArgs {
    /// Mirror: once every file has landed (and only then; nothing is
    /// deleted after any error), delete beneath the destination directory
    /// what the source directory does not have. What the filters leave
    /// out is left alone. With --dry-run, lists what would be deleted.
    /// The receiver must allow it (serve --allow-delete).
    #[arg(long, conflicts_with = "synthetic")]
    pub delete: bool,
    /// With --delete: delete nothing if more than this many files and
    /// directories would go.
    #[arg(long, requires = "delete", default_value_t = wirerate_engine::mirror::MAX_DELETE.default, value_parser = clap::value_parser!(u64).range(0..=wirerate_engine::mirror::MAX_DELETE.max))]
    pub max_delete: u64,
    /// With --delete: delete nothing if more than this many bytes would
    /// go, e.g. 100GiB (default: no bound but --max-delete).
    #[arg(long, requires = "delete", value_parser = size)]
    pub max_delete_bytes: Option<u64>,
}

impl MirrorArgs {
    /// The guard, if mirroring.
    pub fn guard(&self) -> Option<wirerate_engine::mirror::Guard> {
        self.delete.then_some(wirerate_engine::mirror::Guard {
            max_delete: self.max_delete,
            max_delete_bytes: self.max_delete_bytes,
        })
    }
}

/// `relay`: the data sessions of a transfer whose lead sender runs elsewhere.
#[derive(Args)]
pub struct RelayArgs {
    /// Address to listen on for lead senders.
    #[arg(long, default_value = "0.0.0.0:7471")]
    pub listen: String,
    /// A directory jobs may read beneath (repeat for several); a job
    /// naming a source elsewhere is refused.
    #[arg(long, required = true)]
    pub allow_root: Vec<PathBuf>,
    /// Buffer memory all jobs together may hold, e.g. 4GiB (default: 4 x
    /// --buffer); --buffer is the most one job's may. A job waits, alive,
    /// while other jobs hold it; one it can never hold is refused.
    #[arg(long, value_parser = size)]
    pub max_memory: Option<u64>,
    #[command(flatten)]
    pub token: TokenArgs,
    #[command(flatten)]
    pub io: IoArgs,
}

/// Which files of the source `send` takes. A pattern with no / matches a
/// name at any depth (`*.log`), one with a / the path from the source
/// directory (`raw/*.h5`); `*` stays within a name and `**` crosses
/// directories; a trailing / names directories only. Excludes win over
/// includes; a directory excluded is not listed. Filters that take no
/// file are refused.
#[derive(Args, Clone, Default)]
pub struct FilterArgs {
    /// Send only files this glob matches (repeat for several; with none,
    /// every file).
    #[arg(long = "include", value_name = "GLOB", conflicts_with = "synthetic")]
    pub include: Vec<String>,
    /// Leave out files and directories this glob matches (repeat for
    /// several).
    #[arg(long = "exclude", value_name = "GLOB", conflicts_with = "synthetic")]
    pub exclude: Vec<String>,
    /// Read include globs from this file, one a line (blank lines and
    /// lines starting with # are passed over).
    #[arg(long, value_name = "FILE", conflicts_with = "synthetic")]
    pub include_from: Option<PathBuf>,
    /// Read exclude globs from this file, one a line.
    #[arg(long, value_name = "FILE", conflicts_with = "synthetic")]
    pub exclude_from: Option<PathBuf>,
    /// Leave out files smaller than this, e.g. 1MiB.
    #[arg(long, value_parser = size, conflicts_with = "synthetic")]
    pub min_size: Option<u64>,
    /// Leave out files larger than this, e.g. 10GiB.
    #[arg(long, value_parser = size, conflicts_with = "synthetic")]
    pub max_size: Option<u64>,
    /// Leave out files modified less than this long ago, e.g. 10m (those an
    /// instrument may still be writing): seconds, or a number with s, m, h
    /// or d.
    #[arg(long, value_parser = age, conflicts_with = "synthetic")]
    pub min_age: Option<u64>,
    /// Leave out files modified more than this long ago, e.g. 7d.
    #[arg(long, value_parser = age, conflicts_with = "synthetic")]
    pub max_age: Option<u64>,
}

/// Most bytes of a pattern file (`--include-from`, `--exclude-from`):
/// room for the most patterns at a typical length; no more than
/// `filter::MAX_PATTERNS` lines of it are kept.
const MAX_PATTERN_FILE: u64 = 64 << 20;

impl FilterArgs {
    /// The engine's filters, with the pattern files read.
    pub fn filters(&self) -> Result<wirerate_engine::filter::Filters> {
        let mut include = self.include.clone();
        let mut exclude = self.exclude.clone();
        for (file, into) in [
            (&self.include_from, &mut include),
            (&self.exclude_from, &mut exclude),
        ] {
            if let Some(path) = file {
                into.extend(pattern_file(path)?);
            }
        }
        let f = wirerate_engine::filter::Filters {
            include,
            exclude,
            min_size: self.min_size,
            max_size: self.max_size,
            min_age_seconds: self.min_age,
            max_age_seconds: self.max_age,
        };
        f.check()?;
        Ok(f)
    }
}

/// The patterns of `path`, one a line.
fn pattern_file(path: &std::path::Path) -> Result<Vec<String>> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_PATTERN_FILE + 1).read_to_string(&mut text))
        .map_err(|e| anyhow::anyhow!("reading the patterns in {}: {e}", path.display()))?;
    if text.len() as u64 > MAX_PATTERN_FILE {
        bail!(
            "{} is over {} MiB: more patterns than a send takes",
            path.display(),
            MAX_PATTERN_FILE >> 20
        );
    }
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        // One past the bound, for the check to refuse, and no more.
        .take(wirerate_engine::filter::MAX_PATTERNS + 1)
        .map(str::to_owned)
        .collect())
}

/// An age: seconds, or a number followed by s, m, h or d; at most a
/// century.
fn age(s: &str) -> Result<u64, String> {
    let (digits, unit) = match s.trim().char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => (&s.trim()[..i], c),
        _ => (s.trim(), 's'),
    };
    let per = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86400,
        _ => 0,
    };
    digits
        .parse::<u64>()
        .ok()
        .filter(|_| per > 0)
        .and_then(|n| n.checked_mul(per))
        .filter(|&secs| secs <= wirerate_engine::filter::MAX_AGE_SECONDS)
        .ok_or_else(|| {
            format!("{s:?} is not an age: seconds, or a number with s, m, h or d (10m, 7d), up to a century")
        })
}

#[derive(Args, Clone)]
pub struct SendTuning {
    /// Parallel TCP streams [default: 4, or more when the path's round trip
    /// and the hosts' TCP buffer maximums need more to carry 10 Gbit/s (or
    /// --max-rate); the summary says why].
    #[arg(long)]
    pub streams: Option<u64>,
    /// Content block size, a multiple of 4 KiB, e.g. 64MiB [default: 16MiB, or half of --buffer when that is smaller].
    #[arg(long, value_parser = size)]
    pub block_size: Option<u64>,
    #[command(flatten)]
    pub io: IoArgs,
    /// Cap the transfer's rate, e.g. 5Gbps (TCP pacing, split over the streams).
    #[arg(long, value_parser = rate)]
    pub max_rate: Option<u64>,
    /// none: trust TCP; checksums: checksum every block and compare file digests; reread: also re-read from disk.
    #[arg(long, default_value_t = Verification::default(), value_parser = names::<Verification, 3>(Verification::ALL.map(Verification::as_str)))]
    pub verify: Verification,
    /// Compress blocks on the wire: auto (lz4, only while the link rather
    /// than the CPU is the limit and the data shrinks), lz4, zstd (every
    /// block), or none. Checksums stay on the plain data; what does not
    /// shrink goes as it is.
    #[arg(long, env = "WIRERATE_COMPRESS", default_value_t = Compression::default(), value_parser = names::<Compression, 4>(Compression::ALL.map(Compression::as_str)))]
    pub compress: Compression,
    /// Keep reconnecting and resuming this long after a failure, e.g. 120 (seconds).
    #[arg(long, default_value_t = 120.0, value_parser = seconds)]
    pub retry_for: f64,
}

#[derive(Args)]
pub struct ProbeArgs {
    /// Receiver address, host:port.
    #[arg(long)]
    pub to: String,
    #[command(flatten)]
    pub token: TokenArgs,
    /// Streams of the second phase.
    #[arg(long, default_value_t = 8,
          value_parser = clap::value_parser!(u16).range(2..=i64::try_from(tuning::STREAMS.max).unwrap_or(i64::MAX)))]
    pub streams: u16,
    /// About how long each phase lasts, seconds (0.5 to 60).
    #[arg(long, default_value_t = 3.0)]
    pub seconds: f64,
    /// Content block size, e.g. 4MiB.
    #[arg(long, default_value = "4MiB", value_parser = size)]
    pub block_size: u64,
    /// TCP congestion control to test with; default: the kernel's.
    #[arg(long)]
    pub congestion: Option<String>,
    /// Explicit socket buffer size to test with (disables autotuning).
    #[arg(long, value_parser = size)]
    pub socket_buffer: Option<u64>,
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct DemoArgs {
    /// Size of the generated test file.
    #[arg(long, default_value = "2GiB", value_parser = size)]
    pub size: u64,
    /// Directory for the temporary files (a real disk, not tmpfs).
    #[arg(long, env = "TMPDIR", default_value = "/var/tmp")]
    pub dir: PathBuf,
    /// Run one transfer in each I/O mode (buffered, direct, async) and compare.
    #[arg(long)]
    pub all_modes: bool,
    /// Keep the generated files.
    #[arg(long)]
    pub keep: bool,
    #[command(flatten)]
    pub tuning: SendTuning,
    /// Encrypt the demo's connections with TLS 1.3, to see what it costs
    /// on this machine.
    #[arg(long, default_value_t = Encryption::default(), value_parser = encryption())]
    pub encrypt: Encryption,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
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
/// `--encrypt`'s values, in the engine's spelling.
fn encryption() -> impl clap::builder::TypedValueParser<Value = Encryption> {
    names::<Encryption, 3>(Encryption::ALL.map(Encryption::as_str))
}

fn names<T, const N: usize>(
    names: [&'static str; N],
) -> impl clap::builder::TypedValueParser<Value = T>
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
