//! The sending side: `wirerate-agent send`, the in-cluster sender job and
//! the demo's sender.

mod connect;
mod generate;
mod growth;
mod metadata;
mod mirror;
mod open;
pub mod pairs;
mod reader;
pub mod select;
mod session;
mod shared;
pub mod source;
mod streams;
mod summarize;
pub mod warm;

pub use crate::metadata::Keeping;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::session::FileVerdict;

use crate::Backoff;
use crate::Settings;
use crate::digest::digest_of;
use crate::error::{Error, Result};
use crate::io::{IoMode, Pools};
use crate::net::{SocketOpts, TcpStats};
use crate::observe::{Observe, SessionEnd, unobserved};
use crate::optimizer::StreamChange;
use crate::progress::Progress;
use crate::summary::SendSummary;
use crate::wire::{EntryKind, Stripe, Verification};
use source::SourceList;

/// What to send where, and how.
#[derive(Debug, Clone)]
pub struct SendConfig {
    /// Receiver address, host:port.
    pub to: String,
    /// The shared secret.
    pub token: Vec<u8>,
    /// Whether connections are encrypted (TLS 1.3): `Required` refuses
    /// a peer that will not.
    pub encrypt: crate::encryption::Encryption,
    /// Whether blocks are compressed on the wire (`compress::auto`).
    pub compress: crate::compress::Compression,
    /// Which files the receiver may leave as they are because it already
    /// has them (`sync`). Not over several pairs yet: `pairs` refuses it.
    pub sync: crate::sync::SyncLevel,
    /// Plan and report what a send would do, and send nothing: the
    /// receiver creates and changes nothing either (`--dry-run`).
    pub dry_run: bool,
    /// Which files of the source to send (`--include`, `--exclude`,
    /// `--min-size`, ...); empty: all of them.
    pub filters: crate::filter::Filters,
    /// What it keeps of each file beyond its data, mode and times (owner,
    /// extended attributes, ACLs: `send --keep`), and the id maps.
    pub keeping: Keeping,
    /// Mirror: once every file has landed, delete beneath the destination
    /// directory what the source does not have, within this guard
    /// (`--delete`); None leaves the destination's other files alone.
    pub mirror: Option<crate::mirror::Guard>,
    /// File or directory to send (unused when `synthetic` is set).
    pub source: PathBuf,
    /// A memory-to-memory test: send this many bytes of generated data,
    /// which the receiver verifies and drops (it must allow that), instead
    /// of reading `source`.
    pub synthetic: Option<u64>,
    /// Destination relative to the receiver's root.
    pub dest: String,
    /// Parallel TCP streams (with `per_link`, the fewest to open).
    pub streams: u16,
    /// Open more streams than `streams` when the link needs them: the
    /// windows that the TCP buffer maximums allow over the control
    /// connection's round trip cannot carry the aimed rate (`tuner`). The
    /// choice is made once per run and kept by its retries.
    pub per_link: bool,
    /// Content block size in bytes.
    pub block_size: u64,
    /// I/O mode for reads.
    pub io_mode: IoMode,
    /// Reads in flight (async mode).
    pub queue_depth: usize,
    /// In-flight buffer memory in bytes.
    pub buffer: u64,
    /// Socket tuning (congestion control, buffers).
    pub socket: SocketOpts,
    /// Cap on the whole transfer's rate, bytes per second.
    pub max_rate: Option<u64>,
    /// Verification level.
    pub verify: Verification,
    /// How long to keep reconnecting after a failure.
    pub retry_for: Duration,
    /// Set by `pairs`: how long a receiver may refuse every connection
    /// (nothing listens there: its process is gone) before it is given
    /// up, sooner than `retry_for`, which a silent path needs.
    pub(crate) refused_for: Option<Duration>,
    /// Timeout of each connect.
    pub connect_timeout: Duration,
    /// Set to stop the send (the in-cluster agent's assignment moved away,
    /// or a transfer over several pairs lost this receiver): no session
    /// starts after it, and a running one ends within a keepalive interval.
    pub cancel: Option<Arc<AtomicBool>>,
    /// Where the send stands, for whoever shows its progress.
    pub progress: Arc<Progress>,
    /// Told of blocks sent, streams and sessions ended.
    pub observer: Observe,
    /// Where data streams and buffers are kept between sends to the same
    /// receiver, and taken from; `None` closes and frees them at the end.
    pub warm: Option<Arc<warm::Warm>>,
    /// Set by `pairs` for the sessions of a transfer over several pairs:
    /// the pieces this send writes, or the files it publishes.
    pub(crate) stripe: Option<Stripe>,
}

impl SendConfig {
    /// The defaults, for `source` to `dest` at `to`.
    pub fn new(
        to: impl Into<String>,
        token: Vec<u8>,
        source: impl Into<PathBuf>,
        dest: impl Into<String>,
    ) -> Self {
        Self {
            to: to.into(),
            token,
            encrypt: crate::encryption::Encryption::None,
            compress: crate::compress::Compression::default(),
            sync: crate::sync::SyncLevel::default(),
            dry_run: false,
            filters: crate::filter::Filters::default(),
            mirror: None,
            keeping: Keeping::default(),
            source: source.into(),
            synthetic: None,
            dest: dest.into(),
            streams: Settings::default().streams,
            per_link: false,
            block_size: Settings::default().block_size,
            io_mode: IoMode::Async,
            queue_depth: Settings::default().queue_depth,
            buffer: Settings::default().buffer,
            socket: SocketOpts::default(),
            max_rate: None,
            verify: Verification::Checksums,
            retry_for: Duration::from_secs(120),
            refused_for: None,
            connect_timeout: Duration::from_secs(10),
            cancel: None,
            progress: Arc::default(),
            observer: unobserved(),
            warm: None,
            stripe: None,
        }
    }

    /// The error of a send that retried as long as this config allows,
    /// `last` its last failure: the patience it names is the refusals'
    /// (`refused_for`) when `backoff` gave up on those.
    pub(crate) fn gave_up(&self, backoff: &Backoff, last: Error, resumable: bool) -> Error {
        let refused = backoff.gave_up_refused();
        Error::GaveUp {
            last: Box::new(last),
            retry_for: match self.refused_for {
                Some(d) if refused => d,
                _ => self.retry_for,
            },
            refused,
            resumable,
        }
    }

    /// Takes a transfer's settings: the one path from a manifest's tuning
    /// or the command line's flags into the sender.
    pub fn tune(&mut self, s: &Settings) {
        self.streams = s.streams;
        self.block_size = s.block_size;
        self.io_mode = s.io_mode;
        self.queue_depth = s.queue_depth;
        self.buffer = s.buffer;
        self.socket.congestion = s.congestion.clone();
    }

    /// The settings in effect, for checking against the shared bounds.
    pub fn settings(&self) -> Settings {
        Settings {
            streams: self.streams,
            block_size: self.block_size,
            io_mode: self.io_mode,
            queue_depth: self.queue_depth,
            buffer: self.buffer,
            congestion: self.socket.congestion.clone(),
        }
    }

    /// The blocks of the send's buffer pool: a dry run reads no block,
    /// and holds the least a pool may.
    fn pool_count(&self) -> usize {
        match self.dry_run {
            true => 2,
            false => pool_blocks(self.buffer, self.block_size, self.streams) as usize,
        }
    }

    /// The source's listing, through the send's filters: ages are
    /// measured from now.
    pub(crate) fn list(&self) -> Result<SourceList> {
        source::scan_with(&self.source, &self.dest, &self.select()?)
    }

    /// The send's filters, compiled, ages measured from now.
    pub(crate) fn select(&self) -> Result<select::Select> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        select::Select::new(&self.filters, now)
    }

    /// Refuses settings that cannot work, saying what to change.
    pub fn validate(&self) -> Result<()> {
        if self.token.is_empty() {
            return Err(Error::Config(
                "the token is empty; put a secret in the token file".into(),
            ));
        }
        self.settings().check()?;
        match self.synthetic {
            Some(0) => {
                return Err(Error::Config(
                    "--synthetic needs a size of at least one byte, e.g. 10GiB".into(),
                ));
            }
            Some(_) if !self.filters.is_empty() => {
                return Err(Error::Config(
                    "filters (--include, --exclude, --min-size, ...) choose files of a source, and a memory-to-memory test (--synthetic) has none".into(),
                ));
            }
            Some(_) if self.mirror.is_some() => {
                return Err(Error::Config(
                    "--delete mirrors a source directory, and a memory-to-memory test (--synthetic) has none".into(),
                ));
            }
            Some(_) if self.dry_run => {
                return Err(Error::Config(
                    "--dry-run plans a send of files, and a memory-to-memory test (--synthetic) has none to plan".into(),
                ));
            }
            Some(_) if self.verify == Verification::Reread => {
                return Err(Error::Config(
                    "--verify reread re-reads the written file, and a memory-to-memory test writes none: use --verify checksums or none".into(),
                ));
            }
            _ => {}
        }
        if self.mirror.is_some() && self.dest.ends_with('/') {
            return Err(Error::Config(format!(
                "--delete mirrors into the directory the destination names: name it without a trailing / ({:?}), so that what it deletes beneath is plain",
                self.dest.trim_end_matches('/')
            )));
        }
        self.socket.check()
    }
}

impl RunState {
    /// A session's plan says the receiver holds `held` bytes of the
    /// transfer (verified files and resumed blocks).
    pub(crate) fn handle_held(&mut self, held: u64) {
        if held > self.most_held {
            self.most_held = held;
            self.kept_more = true;
        }
    }

    /// Whether the transfer moved on since the last call: a file got its
    /// verdict (there were `verdicts_before`), or a plan found the
    /// receiver holding more than ever. Bytes sent do not count: a
    /// receiver that takes some blocks and fails every session keeps
    /// nothing, and must not keep the sender retrying past `retry_for`.
    pub(crate) fn take_progress(&mut self, verdicts_before: usize) -> bool {
        std::mem::take(&mut self.kept_more) | (self.verdicts.len() != verdicts_before)
    }
}

/// Data stream failures the summary names one by one; more are counted.
pub(crate) const MAX_CUTS_SHOWN: usize = 8;

/// State carried across the sessions of one run.
#[derive(Debug, Default)]
pub(crate) struct RunState {
    pub(crate) sessions: u32,
    /// Some session reached the receiver and authenticated.
    pub(crate) connected: bool,
    /// Some session got the receiver's plan.
    pub(crate) planned: bool,
    pub(crate) verdicts: HashMap<u32, FileVerdict>,
    /// Under `SyncLevel::Checksum`, each regular file's digest, read once
    /// before the first session (`digest_sources`).
    pub(crate) digests: HashMap<u32, u128>,
    /// Where the send keeps owners or attributes, each entry's, read
    /// once before the first session (`metadata`).
    pub(crate) metas: HashMap<u32, Box<crate::wire::Meta>>,
    /// Entries whose attributes could not be kept, and why: the first
    /// `MAX_CUTS_SHOWN`, and how many in all.
    pub(crate) metas_unread: (Vec<String>, usize),
    pub(crate) bytes_sent: u64,
    pub(crate) bytes_skipped_resume: u64,
    pub(crate) blocks_retried: u64,
    /// Data streams that failed, and why (see `shared::Inner::cuts`):
    /// the first `MAX_CUTS_SHOWN`, and how many more.
    pub(crate) stream_cuts: Vec<String>,
    pub(crate) stream_cuts_more: usize,
    pub(crate) per_stream_bytes: Vec<u64>,
    pub(crate) io_mode: Option<IoMode>,
    pub(crate) io_fallback: Option<String>,
    pub(crate) rtt: Option<Duration>,
    /// The data streams of this run: chosen by the first session.
    pub(crate) streams: Option<u16>,
    /// Why, when the tuner chose them.
    pub(crate) streams_chosen: Option<String>,
    /// The streams the run started with (those after them were added by
    /// the optimizer, and carried for less of the run).
    pub(crate) first_streams: usize,
    /// Data stream joins over parked connections (`SendConfig::warm`).
    pub(crate) streams_warm: u64,
    /// The streams the optimizer added, in order.
    pub(crate) stream_changes: Vec<StreamChange>,
    /// The most the receiver held at any plan of this run.
    most_held: u64,
    /// A plan since the last `take_progress` showed the receiver holding
    /// more than any before.
    kept_more: bool,
    /// Why the optimizer stopped adding.
    pub(crate) streams_held: Option<String>,
    /// Each data stream's TCP_INFO at the end of the last session.
    pub(crate) tcp: Vec<Option<TcpStats>>,
    pub(crate) congestion: String,
    /// What the control connection's handshake agreed.
    pub(crate) encryption: crate::encryption::InEffect,
    /// In a transfer over several pairs, the block checksums of each file
    /// whose piece was written and verified, for the coordinator.
    pub(crate) sums: HashMap<u32, Vec<u64>>,
    /// In a transfer over several pairs, the bytes of each file's piece
    /// that the receiver already held (its per-chunk checkpoints).
    pub(crate) held_in_pieces: HashMap<u32, u64>,
}

/// Sends `cfg.source`, reconnecting and resuming on failures for up to
/// `cfg.retry_for`. Returns the summary; `ok` is false when any file
/// failed. `cfg.progress` moves as blocks are acknowledged.
pub fn send(cfg: &SendConfig) -> Result<SendSummary> {
    cfg.validate()?;
    let list = match cfg.synthetic {
        Some(size) => source::synthetic(size, &cfg.dest)?,
        None => cfg.list()?,
    };
    let total: u64 = list.files.iter().map(|f| f.size).sum();
    // Refused before anything moves, where the source cannot be mirrored.
    let mirroring = match cfg.mirror {
        Some(guard) => Some((guard, mirror::Mirroring::of(&list)?)),
        None => None,
    };
    cfg.progress.sized(total);
    let count = cfg.pool_count();
    let pool = match &cfg.warm {
        Some(w) => w.take_pools(cfg.block_size as usize, count)?,
        None => Pools::new(cfg.block_size as usize, count)?,
    };
    let mut st = RunState::default();
    let start = Instant::now();
    run_sessions(cfg, &list, &pool, &mut st)?;
    let seconds = start.elapsed().as_secs_f64();
    if let Some(w) = &cfg.warm {
        // Every session's threads are done with it.
        w.keep_pools(pool.clone());
    }
    let mut summary = summarize::summarize(cfg, list, &st, &pool, seconds);
    if let Some((guard, m)) = mirroring {
        let done = match summary.ok {
            true => mirror::mirror(cfg, &m, &guard, cfg.dry_run),
            false => mirror::skipped(&m, summary.failures.len(), cfg.dry_run),
        };
        summary.ok &= done.ok();
        summary.mirror = Some(done);
    }
    Ok(summary)
}

/// The blocks a send's buffer pool holds: what `buffer` allows, and at
/// least two in flight per stream and two more (a relay checks a job's
/// need against its own memory with this).
pub(crate) fn pool_blocks(buffer: u64, block_size: u64, streams: u16) -> u64 {
    (buffer / block_size).max(2 * u64::from(streams) + 2)
}

/// The most buffer memory one session of a send with settings `s` may
/// take: its pool at the most streams it may run, `s.streams` when
/// `fixed`, else up to the tuner's and optimizer's most
/// (`tuner::MOST_CHOSEN`). An in-cluster relay allows a job this much,
/// so that it refuses nothing its sender would have run itself.
pub fn most_session_memory(s: &Settings, fixed: bool) -> u64 {
    let streams = match fixed {
        true => s.streams,
        false => s.streams.max(crate::tuner::MOST_CHOSEN),
    };
    pool_blocks(s.buffer, s.block_size, streams).saturating_mul(s.block_size)
}

/// Sends the entries of `list` as `cfg.stripe` says (a piece session of a
/// transfer over several pairs), with `run_sessions`' retries; returns
/// what the run did (bytes sent, verdicts), and how it ended.
pub(crate) fn send_list(cfg: &SendConfig, list: &SourceList) -> (RunState, Result<()>) {
    let mut st = RunState::default();
    let count = cfg.pool_count();
    let pool = match &cfg.warm {
        Some(w) => w.take_pools(cfg.block_size as usize, count),
        None => Pools::new(cfg.block_size as usize, count),
    };
    let pool = match pool {
        Ok(p) => p,
        Err(e) => return (st, Err(e)),
    };
    let run = run_sessions(cfg, list, &pool, &mut st);
    if let Some(w) = &cfg.warm {
        w.keep_pools(pool.clone());
    }
    (st, run)
}

/// Each entry's owner and attributes, as the send keeps them.
fn read_metas(cfg: &SendConfig, list: &SourceList, st: &mut RunState) {
    let mut scratch = metadata::Scratch::default();
    for (id, f) in list.files.iter().enumerate() {
        // A cancel is heeded by the session that would follow.
        if id % 1024 == 0 && cancelled(cfg) {
            return;
        }
        let (meta, why) = metadata::read(&list.base, f, &cfg.keeping, &mut scratch);
        if let Some(m) = meta {
            st.metas.insert(id as u32, m);
        }
        if let Some(why) = why {
            st.metas_unread.1 += 1;
            if st.metas_unread.0.len() < MAX_CUTS_SHOWN {
                st.metas_unread.0.push(why);
            }
        }
    }
}

/// Runs sessions until one completes, reconnecting with backoff after
/// each failure that may pass, until `cfg.retry_for` after the first
/// failure since a session last made progress, or `cfg.refused_for` after
/// the first of reconnects in a row that were all refused.
/// Each regular file's digest, for a checksum sync: every file is read
/// before anything is sent, as `rsync --checksum` does, and before the
/// control connection opens, which would otherwise sit silent. A file
/// that cannot be read, or that changed from its listing by the end of
/// the read, has none, and is sent (its read then fails it, saying why,
/// if it still differs). Stops when the send is cancelled.
fn digest_sources(cfg: &SendConfig, list: &SourceList) -> Result<HashMap<u32, u128>> {
    let files: Vec<(u32, &source::SourceFile)> = list
        .files
        .iter()
        .enumerate()
        .filter(|(_, f)| f.kind == EntryKind::File)
        .map(|(i, f)| (i as u32, f))
        .collect();
    let bytes: u64 = files.iter().map(|(_, f)| f.size).sum();
    tracing::info!(
        files = files.len(),
        bytes,
        "--sync checksum: reading every file to digest it before sending"
    );
    let mut digests = HashMap::with_capacity(files.len());
    for (id, f) in files {
        let Ok((mut file, _)) = crate::io::open_source(&list.base, &f.rel, &f.path, false) else {
            continue;
        };
        let digest = digest_of(&mut file, f.size, cfg.block_size, &mut || !cancelled(cfg));
        if cancelled(cfg) {
            return Err(Error::Cancelled {
                last: Box::new(Error::Config(
                    "stopped while digesting the source (--sync checksum)".into(),
                )),
            });
        }
        let unchanged = file
            .metadata()
            .is_ok_and(|m| f.stamp.change_to(&source::Stamp::of(&m)).is_none());
        if let (Ok(d), true) = (digest, unchanged) {
            digests.insert(id, d);
        }
    }
    Ok(digests)
}

fn run_sessions(
    cfg: &SendConfig,
    list: &SourceList,
    pool: &Pools,
    st: &mut RunState,
) -> Result<()> {
    let mut backoff = Backoff::new(
        cfg.retry_for,
        Duration::from_millis(250),
        Duration::from_secs(5),
    );
    if let Some(d) = cfg.refused_for {
        backoff = backoff.refused_for(d);
    }
    if cfg.sync == crate::sync::SyncLevel::Checksum && st.digests.is_empty() {
        st.digests = digest_sources(cfg, list)?;
    }
    if cfg.keeping.keep.any() && st.metas.is_empty() {
        read_metas(cfg, list, st);
    }
    loop {
        if cancelled(cfg) {
            return Err(Error::Cancelled {
                last: Box::new(Error::Config("stopped before a session started".into())),
            });
        }
        st.sessions += 1;
        let verdicts_before = st.verdicts.len();
        let outcome = tracing::info_span!("session", n = st.sessions)
            .in_scope(|| session::run(cfg, &list.files, &list.base, st, pool));
        let retried = matches!(&outcome, Err(e) if e.is_retryable()
            || (st.connected && matches!(e, Error::Unresolvable { .. })));
        cfg.observer.send_session_ended(match (&outcome, retried) {
            (Ok(()), _) => SessionEnd::Complete,
            (Err(_), true) => SessionEnd::Retried,
            (Err(_), false) => SessionEnd::Failed,
        });
        match outcome {
            Ok(()) => return Ok(()),
            Err(e @ Error::Cancelled { .. }) => return Err(e),
            Err(e) if cancelled(cfg) => {
                return Err(Error::Cancelled { last: Box::new(e) });
            }
            // A name that never resolved is a typo, not an outage; once the
            // receiver was reached, a failed lookup is a passing DNS fault.
            Err(e)
                if e.is_retryable()
                    || (st.connected && matches!(e, Error::Unresolvable { .. })) =>
            {
                if st.take_progress(verdicts_before) {
                    backoff.handle_progress();
                }
                match backoff.poll_delay(Instant::now(), e.is_refused()) {
                    Some(d) => {
                        tracing::warn!(
                            session = st.sessions,
                            retry_in_s = d.as_secs_f64(),
                            error = %e,
                            sent = st.bytes_sent,
                            "session failed; reconnecting"

                        );
                        if sleep_unless_cancelled(cfg, d) {
                            return Err(Error::Cancelled { last: Box::new(e) });
                        }
                    }
                    None if cfg.retry_for.is_zero() => return Err(e),
                    None => {
                        // Nothing sent: there is nothing to resume.
                        return Err(cfg.gave_up(&backoff, e, st.bytes_sent > 0));
                    }
                }
            }
            Err(e) => return Err(e),
        }
    }
}

pub(crate) fn cancelled(cfg: &SendConfig) -> bool {
    cfg.cancel
        .as_ref()
        .is_some_and(|c| c.load(Ordering::Relaxed))
}

/// Sleeps `d`, waking every 100 ms to see whether the send was cancelled;
/// says whether it was.
pub(crate) fn sleep_unless_cancelled(cfg: &SendConfig, d: Duration) -> bool {
    let until = Instant::now() + d;
    loop {
        if cancelled(cfg) {
            return true;
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        std::thread::sleep(left.min(Duration::from_millis(100)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_the_receiver_keeps_counts_as_progress_for_the_retry_budget() {
        let mut st = RunState::default();
        // The first plan finds nothing held: no progress, nothing lost.
        st.handle_held(0);
        assert!(!st.take_progress(0));
        // A session that sent blocks and failed, its receiver keeping none
        // (the next plan holds no more): not progress, however much went
        // out, so the budget keeps running.
        st.bytes_sent += 64 << 20;
        st.handle_held(0);
        assert!(!st.take_progress(0));
        // A plan holding more than ever is, once.
        st.handle_held(8 << 20);
        assert!(st.take_progress(0));
        assert!(!st.take_progress(0));
        // Holding less after a crash lost unsynced blocks is not.
        st.handle_held(4 << 20);
        assert!(!st.take_progress(0));
        // A file's verdict is.
        st.verdicts.insert(3, FileVerdict::Ok(0));
        assert!(st.take_progress(0));
        assert!(!st.take_progress(1));
    }
}
