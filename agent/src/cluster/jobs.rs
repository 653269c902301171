//! The engine, run for one side of one attempt: a sender thread, or a
//! receiver bound for this transfer alone (its own port, token and root).
//!
//! The transfers of one agent share what keeps connections warm between
//! them: its senders park their data connections in one `Warm`, keyed by
//! the receiving host, and its receivers hand parked connections to each
//! other through one `Lobby`. So the next transfer between two agents
//! joins over the last one's connections (their TCP windows grown) even
//! though it has a receiver, port and token of its own, and authenticates
//! them afresh with that token.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use wirerate_crds::Tuning;

use crate::observer::{Shown, watch_send};
use crate::progress::Progress;
use wirerate_engine::error::{Disposition, Error, Result};
use wirerate_engine::fsroot::{is_temporary, temp_names};
use wirerate_engine::progress::Position;
use wirerate_engine::receiver::{Lobby, ServeConfig, Server, ServerHandle};
use wirerate_engine::sender::pairs::{Joins, PairsSummary, send_over_pairs_joined};
use wirerate_engine::sender::warm::Warm;
use wirerate_engine::sender::{SendConfig, send};
use wirerate_engine::summary::{ReceiverSummary, SendSummary};
use wirerate_engine::sync::SyncLevel;
use wirerate_engine::wire::Verification;

/// The agent's parked data connections and last send buffers, shared by
/// its senders.
fn warm() -> Arc<Warm> {
    static WARM: OnceLock<Arc<Warm>> = OnceLock::new();
    Arc::clone(WARM.get_or_init(|| Arc::new(Warm::across_ports())))
}

/// Lets go of what the agent's senders kept longer than it is of use.
pub fn expire_warm() {
    warm().expire(std::time::Instant::now());
}

/// The lobby of the agent's receivers.
fn lobby() -> Arc<Lobby> {
    static LOBBY: OnceLock<Arc<Lobby>> = OnceLock::new();
    Arc::clone(LOBBY.get_or_init(Arc::default))
}

/// `path` resolved, if it lies under one of `roots`; symlinks cannot lead out.
pub fn under_roots(path: &Path, roots: &[String]) -> Result<PathBuf> {
    let real = path
        .canonicalize()
        .map_err(|e| Error::io(format!("resolving {}", path.display()), e))?;
    for r in roots {
        if let Ok(root) = Path::new(r).canonicalize()
            && real.starts_with(&root)
        {
            return Ok(real);
        }
    }
    Err(Error::PathRefused {
        path: path.display().to_string(),
        reason: format!(
            "it is not under this pool's allowedRoots ({})",
            roots.join(", ")
        ),
    })
}

/// Whether `a` and `b` name one file (same device and inode), however
/// spelled; false when either cannot be looked at.
pub fn is_same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

/// Refuses a Transfer whose destination is its source, when this agent can
/// see both (pools on one file system): copying a file onto itself would
/// truncate it.
pub fn refuse_same_file(source: &str, dest: &str) -> Result<()> {
    if is_same_file(Path::new(source), Path::new(dest)) {
        return Err(Error::PathRefused {
            path: dest.to_owned(),
            reason: format!("it is the source file {source} itself (same device and inode)"),
        });
    }
    Ok(())
}

/// What a finished send reports, over one pair or several.
#[derive(Debug, Clone)]
pub struct Sent {
    /// Every file verified (and, over several pairs, published).
    pub ok: bool,
    /// Bytes of the transfer's files.
    pub bytes_total: u64,
    /// Seconds the run took.
    pub seconds: f64,
    /// Its rate, Gbit/s.
    pub gbps: f64,
    /// The file's or the tree's digest.
    pub digest: String,
    /// Data streams that joined over connections an earlier transfer parked.
    pub streams_warm: u64,
    /// Data streams at the end (per pair, over several).
    pub streams: u16,
    /// Why the per-link tuner chose the count it started with, if it chose.
    pub streams_chosen: Option<String>,
    /// The files that failed: path, why.
    pub failures: Vec<(String, String)>,
    /// Over several pairs: each pair's receiver, state, bytes made durable
    /// first and chunks done.
    pub pairs: Vec<(String, String, u64, u64)>,
    /// Over several pairs: bytes the receivers already held (per-chunk
    /// checkpoints of an earlier attempt), checked but not sent again.
    pub bytes_resumed: u64,
    /// Files the destination already had, at the Transfer's sync level:
    /// not sent.
    pub files_present: usize,
    /// Source files the Transfer's filters left out (not counted over
    /// several pairs yet).
    pub files_filtered: usize,
    /// What its mirror did, in a line (`MirrorSummary::note`).
    pub mirror: Option<String>,
}

impl From<SendSummary> for Sent {
    fn from(s: SendSummary) -> Self {
        Self {
            ok: s.ok,
            bytes_total: s.bytes_total,
            seconds: s.seconds,
            gbps: s.gbps,
            digest: s.digest,
            streams_warm: s.streams_warm,
            streams: s.streams,
            streams_chosen: s.streams_chosen,
            // A mirror that did not do all it was to do fails the
            // Transfer, saying why, as a file would.
            failures: s
                .failures
                .into_iter()
                .map(|f| (f.path, f.message))
                .chain(
                    s.mirror
                        .as_ref()
                        .filter(|m| !m.ok())
                        .map(|m| (format!("mirror of {}", m.base), m.note())),
                )
                .collect(),
            pairs: Vec::new(),
            // Over one pair the receiver reports what it resumed.
            bytes_resumed: 0,
            files_present: s.files_present,
            files_filtered: s.files_filtered,
            mirror: s.mirror.as_ref().map(|m| m.note()),
        }
    }
}

impl From<PairsSummary> for Sent {
    fn from(s: PairsSummary) -> Self {
        Self {
            ok: s.ok,
            bytes_total: s.bytes_total,
            seconds: s.seconds,
            gbps: s.gbps,
            digest: s.digest,
            streams_warm: 0,
            streams: s.streams_per_pair,
            streams_chosen: None,
            failures: s.failures,
            pairs: s
                .pairs
                .into_iter()
                .map(|p| (p.to, p.state, p.bytes, p.chunks_done))
                .collect(),
            bytes_resumed: s.bytes_resumed,
            files_present: s.files_present,
            files_filtered: 0,
            mirror: None,
        }
    }
}

/// Where a sender job sends.
#[derive(Clone, Copy, Debug)]
pub struct Targets<'a> {
    /// Where the receiver listens, or over several pairs where each does.
    pub endpoints: &'a [String],
    /// Over several pairs, who sends each of `endpoints`' data: a relay's
    /// `host:port`, or None for this host. Empty: this host for all.
    pub via: &'a [Option<String>],
    /// Some: a Transfer over several pairs, at most this many.
    pub pairs: Option<usize>,
}

impl<'a> Targets<'a> {
    /// The receiver at `endpoints[0]`, over one pair.
    pub fn one(endpoints: &'a [String]) -> Self {
        Self {
            endpoints,
            via: &[],
            pairs: None,
        }
    }

    /// Over at most `most` pairs, the receivers at `endpoints` first,
    /// each sent to from this host.
    pub fn pairs(endpoints: &'a [String], most: usize) -> Self {
        Self {
            endpoints,
            via: &[],
            pairs: Some(most),
        }
    }
}

/// A sender in flight.
pub struct SenderJob {
    /// Where it stands, and what the tuner and optimizer chose.
    pub progress: Arc<Progress>,
    cancel: Arc<AtomicBool>,
    result: Arc<Mutex<Option<Result<Sent>>>>,
    thread: Option<JoinHandle<()>>,
    /// Over several pairs: receivers to take in while it runs.
    joins: Option<Joins>,
}

/// What a Transfer asks of its send beyond its pools' tuning.
#[derive(Debug, Clone, Default)]
pub struct SendTerms {
    /// How the landed data is checked.
    pub verify: Verification,
    /// Which files the destination already has are left as they are.
    pub sync: SyncLevel,
    /// Cap on the rate, megabits per second.
    pub max_rate_mbps: Option<i64>,
    /// Which files of the source are sent.
    pub filters: wirerate_engine::filter::Filters,
    /// Delete at the destination what the source does not have, within
    /// this guard, once every file landed.
    pub mirror: Option<wirerate_engine::mirror::Guard>,
    /// What each file keeps beyond its data, mode and times.
    pub keeping: wirerate_engine::metadata::Keeping,
}

/// What a Transfer asks of its receiver beyond its pool's tuning.
#[derive(Debug, Clone, Default)]
pub struct ReceiveTerms {
    /// Where its mirror may delete: the Transfer's destination, where it
    /// mirrors and its pool allows deletes; None takes no deletes.
    pub mirror: Option<String>,
    /// Whether it sets the owners its sender sends.
    pub owners: wirerate_engine::metadata::OwnerPolicy,
    /// Whether it sets the ACLs its sender sends.
    pub acls: bool,
}

impl SenderJob {
    /// Starts sending `source` to `dest` at `to`'s endpoints: one
    /// receiver, or over several pairs those that share one root, each
    /// the far end of a pair, taking in more as they join.
    pub fn start(
        to: Targets<'_>,
        token: Vec<u8>,
        source: PathBuf,
        dest: String,
        tuning: &Tuning,
        terms: SendTerms,
    ) -> Result<Self> {
        let SendTerms {
            verify,
            sync,
            max_rate_mbps,
            filters,
            mirror,
            keeping,
        } = terms;
        let Targets {
            endpoints,
            via,
            pairs,
        } = to;
        let first = endpoints.first().cloned().unwrap_or_default();
        let mut cfg = SendConfig::new(&first, token, source, dest);
        // Out-of-range values are refused, never clamped: the Transfer
        // fails naming the field rather than running with other settings.
        cfg.tune(&tuning.settings()?);
        // Neither the Transfer nor its pool fixed the streams: the link
        // decides (reported in status.tuning and an Event).
        cfg.per_link = tuning.streams.is_none();
        cfg.verify = verify;
        cfg.encrypt = tuning.encryption();
        cfg.compress = tuning.compression();
        cfg.sync = sync;
        cfg.filters = filters;
        cfg.mirror = mirror;
        cfg.keeping = keeping;
        cfg.max_rate = max_rate_mbps.map(|m| m as u64 * 1_000_000 / 8);
        // Longer than a Lease: a lost receiver is replaced before the sender gives up.
        cfg.retry_for = Duration::from_secs(90);
        let cancel = Arc::new(AtomicBool::new(false));
        cfg.cancel = Some(cancel.clone());
        cfg.warm = Some(warm());
        cfg.validate()?;
        let progress = watch_send(&mut cfg);
        let result = Arc::new(Mutex::new(None));
        let r = result.clone();
        let to = endpoints.to_vec();
        let via = match via.is_empty() {
            true => vec![None; to.len()],
            false => via.to_vec(),
        };
        let joins = pairs.map(|_| Joins::default());
        let told = joins.clone();
        let thread = std::thread::Builder::new()
            .name("k8s-send".into())
            .spawn(wirerate_engine::spans::carry(move || {
                let out = match (pairs, &told) {
                    (Some(most), Some(joins)) => {
                        send_over_pairs_joined(&cfg, &to, &via, joins, most).map(Sent::from)
                    }
                    _ => send(&cfg).map(Sent::from),
                };
                *r.lock().expect("result lock") = Some(out);
            }))
            .map_err(|e| Error::io("starting a sender thread".to_string(), e))?;
        Ok(Self {
            progress,
            cancel,
            result,
            thread: Some(thread),
            joins,
        })
    }

    /// Tells a sender over several pairs of a receiver at `to` (one that
    /// replaces a lost pair, or moved): it takes it in as a new pair,
    /// without a restart, unless it sends there already. False for a
    /// sender over one pair, which must start again to follow it.
    pub fn join(&self, to: &str) -> bool {
        match &self.joins {
            Some(joins) => {
                joins.add(to);
                true
            }
            None => false,
        }
    }

    /// The outcome, once the sender is done.
    pub fn outcome(&self) -> Option<SenderOutcome> {
        let r = self.result.lock().expect("result lock");
        r.as_ref().map(|r| match r {
            Ok(s) if s.ok => SenderOutcome::Verified(s.clone()),
            Ok(s) => SenderOutcome::FilesFailed(s.clone()),
            Err(e) => SenderOutcome::Failed {
                reason: e.to_string(),
                disposition: e.disposition(),
            },
        })
    }

    /// Stops the send: no session starts after this, and one in progress
    /// ends within a keepalive interval.
    pub fn cancel(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
        // Detach: the thread ends on its own, and nothing waits for it.
        drop(self.thread.take());
    }
}

/// How a sender job ended.
#[derive(Debug, Clone)]
pub enum SenderOutcome {
    /// Every file is verified at the receiver.
    Verified(Sent),
    /// The run ended with files that failed; the summary names them.
    FilesFailed(Sent),
    /// The run itself failed.
    Failed {
        /// The error, with what to do.
        reason: String,
        /// Whether a new attempt could get further.
        disposition: Disposition,
    },
}

impl SenderOutcome {
    /// The run's summary, when it got as far as one.
    pub fn summary(&self) -> Option<&Sent> {
        match self {
            Self::Verified(s) | Self::FilesFailed(s) => Some(s),
            Self::Failed { .. } => None,
        }
    }
}

/// What `bind` bound on the first port of `ports` it could, and the port.
pub fn bind_first<T>(
    ports: std::ops::Range<u16>,
    mut bind: impl FnMut(&str) -> Result<T>,
) -> Result<(u16, T)> {
    let mut last = None;
    for port in ports.clone() {
        match bind(&format!("0.0.0.0:{port}")) {
            Ok(bound) => return Ok((port, bound)),
            // The next port may be free; a root that cannot be opened
            // or a setting refused is the same on every port.
            Err(Error::Listen { cause, .. }) => last = Some(cause),
            Err(e) => return Err(e),
        }
    }
    Err(Error::NoFreePort {
        first: ports.start,
        end: ports.end,
        cause: last.unwrap_or_else(|| std::io::Error::other("the range is empty")),
    })
}

/// A receiver bound for one transfer.
pub struct ReceiverJob {
    handle: Option<ServerHandle>,
    /// Port it listens on.
    pub port: u16,
}

impl ReceiverJob {
    /// Binds the first free port in `ports` and serves `root` with
    /// `token`, on `terms`.
    pub fn start(
        root: PathBuf,
        token: Vec<u8>,
        tuning: &Tuning,
        ports: std::ops::Range<u16>,
        terms: ReceiveTerms,
    ) -> Result<Self> {
        let mut cfg = ServeConfig::new(root, token);
        cfg.allow_delete = terms.mirror.is_some();
        cfg.mirror_base = terms.mirror;
        cfg.owners = terms.owners;
        cfg.acls = terms.acls;
        cfg.observer = Shown::metrics().observe();
        cfg.tune(&tuning.settings()?);
        cfg.encrypt = tuning.encryption();
        cfg.max_sessions = 4;
        cfg.lobby = Some(lobby());
        let (port, server) = bind_first(ports, |addr| Server::bind(addr, cfg.clone()))?;
        Ok(Self {
            port,
            handle: Some(server.spawn()),
        })
    }

    /// Mirror connections served to their end.
    pub fn mirrors_done(&self) -> u64 {
        self.handle.as_ref().map_or(0, ServerHandle::mirrors_done)
    }

    /// Sessions that ended so far.
    pub fn summaries(&self) -> Vec<ReceiverSummary> {
        self.handle
            .as_ref()
            .map(ServerHandle::summaries)
            .unwrap_or_default()
    }

    /// Where the transfer stands, as its latest session has it.
    pub fn position(&self) -> Option<Position> {
        self.handle.as_ref().and_then(ServerHandle::position)
    }

    /// Stops listening and ends its sessions.
    pub fn stop(&mut self) {
        if let Some(h) = self.handle.take() {
            h.stop();
        }
    }
}

impl Drop for ReceiverJob {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Removes the temporary files and checkpoints a cancelled transfer left at `dest`.
pub fn remove_partials(dest: &Path) -> usize {
    fn walk(dir: &Path, n: &mut usize) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                walk(&p, n);
            } else if is_temporary(&e.file_name().to_string_lossy())
                && std::fs::remove_file(&p).is_ok()
            {
                *n += 1;
            }
        }
    }
    let mut n = 0;
    if dest.is_dir() {
        walk(dest, &mut n);
    } else if let (Some(dir), Some(name)) = (dest.parent(), dest.file_name()) {
        for temp in temp_names(&name.to_string_lossy()) {
            if std::fs::remove_file(dir.join(temp)).is_ok() {
                n += 1;
            }
        }
    }
    n
}

#[cfg(test)]
mod same_file_tests {
    use super::*;

    // Found against a real API server: `/x/f` and `/x//f` passed as two
    // files, and an agent copied a file onto itself.
    #[test]
    fn one_file_under_two_spellings_is_refused() {
        let dir = std::env::temp_dir().join(format!("wirerate-same-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("f");
        std::fs::write(&f, b"data").unwrap();
        let other = dir.join("g");
        std::fs::write(&other, b"data").unwrap();
        let d = dir.display();
        for spelling in [format!("{d}//f"), format!("{d}/./f"), format!("{d}/f")] {
            let e = refuse_same_file(&f.display().to_string(), &spelling).unwrap_err();
            assert!(e.to_string().contains("itself"), "{e}");
        }
        let link = dir.join("hard");
        std::fs::hard_link(&f, &link).unwrap();
        assert!(is_same_file(&f, &link));
        assert!(refuse_same_file(&f.display().to_string(), &other.display().to_string()).is_ok());
        assert!(
            refuse_same_file(&f.display().to_string(), &format!("{d}/not-there")).is_ok(),
            "a new destination is not the source"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
