//! The receiving side: `wirerate-agent serve`, the in-cluster receiver
//! job and the demo's receiver.
//!
//! One thread per connection. A control connection opens a session, gets
//! the manifest, answers with a plan (what to send, what it already has)
//! and receives per-file digests; data streams join the session and hand
//! verified blocks to the session's writer thread, which keeps
//! `queue_depth` writes in flight and checkpoints durable blocks.

pub(crate) mod admission;
pub(crate) mod budget;
mod checkpoint;
mod checkpointer;
mod claims;
mod dest;
mod discard;
mod kept;
mod lobby;
mod made_dirs;
pub mod mirror;
mod pieces;
mod plan;
mod registry;
mod session;
mod stats;
mod stream;
mod stripe;
mod verdicts;
mod writer;

use std::collections::HashMap;
use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use crate::session::DiscardPolicy;
pub use checkpoint::Checkpoint;
pub use lobby::Lobby;

use crate::error::{Error, Result};
use crate::fsroot::Root;
use crate::io::IoMode;
use crate::io::spare;
use crate::net::{self, Conn, SocketOpts, auth};
use crate::observe::{Observe, unobserved};
use crate::progress::Position;
use crate::summary::ReceiverSummary;
use crate::wire::{Frame, PARK_IDLE, Purpose, write_frame};
use crate::{Settings, Throttle, tuning};

/// How often a repeated failure is logged.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// Connections served at once, by default: each costs a thread.
pub const MAX_CONNECTIONS: usize = 1024;
/// Connections from one address that may be in their handshake at once,
/// by default: enough for a sender's control connection and 128 data
/// streams connecting together (a sender with more retries the rest).
pub const MAX_HANDSHAKES_PER_ADDRESS: usize = 129;
/// The shortest idle timeout allowed: a live sender writes every
/// `KEEPALIVE_INTERVAL`, so anything shorter would drop live ones.
pub const MIN_IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an idle receiver keeps the last session's buffers.
pub(crate) const KEEP_IDLE: Duration = Duration::from_secs(300);
/// Summaries kept for `ServerHandle::summaries`: a receiver that runs for
/// months must not keep one per session it ever served.
const KEEP_SUMMARIES: usize = 1000;

/// How the receiver writes.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Everything is written beneath this directory.
    pub root: PathBuf,
    /// The shared secret.
    pub token: Vec<u8>,
    /// Whether connections are encrypted (TLS 1.3): `Required` refuses
    /// a peer that will not.
    pub encrypt: crate::encryption::Encryption,
    /// I/O mode for writes.
    pub io_mode: IoMode,
    /// Writes in flight (async mode).
    pub queue_depth: usize,
    /// Buffer memory per session, in bytes.
    pub buffer: u64,
    /// Concurrent sessions accepted.
    pub max_sessions: usize,
    /// How often durable blocks are checkpointed.
    pub checkpoint_interval: Duration,
    /// Socket tuning for accepted connections.
    pub socket: SocketOpts,
    /// How long a data stream waits for the session it joins to be
    /// announced on its control connection (senders open both at once).
    pub join_wait: Duration,
    /// Connections served at once.
    pub max_connections: usize,
    /// Connections in their handshake at once from one address.
    pub max_handshakes_per_address: usize,
    /// How long a peer has for the whole handshake.
    pub handshake_timeout: Duration,
    /// A sender silent this long is presumed gone and its session ended
    /// (its destinations released, what it wrote checkpointed).
    pub idle_timeout: Duration,
    /// Buffer memory all sessions together may hold; `None`: up to
    /// `max_sessions` times `buffer` (and an eighth more for small files).
    pub max_memory: Option<u64>,
    /// Permission bits cleared from what the sender's files carry.
    pub umask: u32,
    /// Whether it takes memory-to-memory tests (`send --synthetic`),
    /// whose blocks are verified and dropped. Refused by default.
    pub discard: DiscardPolicy,
    /// Whether a sender may delete what its source does not have beneath
    /// a directory it mirrors (`send --delete`, `mirror`). Off by default.
    pub allow_delete: bool,
    /// Whether it sets the owners senders send (`send --keep owner`):
    /// it needs CAP_CHOWN for that. Off by default; root's is given only
    /// when asked for (`OwnerPolicy::KeepRoot`).
    pub owners: crate::metadata::OwnerPolicy,
    /// Whether it sets the POSIX ACLs senders send (`send --keep acls`):
    /// an ACL grants access to the users it names. Off by default.
    pub acls: bool,
    /// The one directory a mirror may name, where the receiver serves one
    /// transfer (the in-cluster agent: its destination); None: any
    /// directory beneath the root but the root itself.
    pub mirror_base: Option<String>,
    /// Told of blocks written, files and sessions done, refusals, and each
    /// session's summary.
    pub observer: Observe,
    /// Receivers of this process that take over each other's parked
    /// connections (`Lobby`); with one, a receiver that stops keeps what
    /// it parked for them. `None`: its own alone, cut when it stops.
    pub lobby: Option<Arc<Lobby>>,
}

impl ServeConfig {
    /// Defaults for `root` and `token`.
    pub fn new(root: PathBuf, token: Vec<u8>) -> Self {
        Self {
            root,
            token,
            encrypt: crate::encryption::Encryption::None,
            io_mode: IoMode::Async,
            queue_depth: Settings::default().queue_depth,
            buffer: Settings::default().buffer,
            max_sessions: 16,
            checkpoint_interval: Duration::from_secs(1),
            socket: SocketOpts::default(),
            join_wait: net::HANDSHAKE_TIMEOUT,
            max_connections: MAX_CONNECTIONS,
            max_handshakes_per_address: MAX_HANDSHAKES_PER_ADDRESS,
            handshake_timeout: net::HANDSHAKE_TIMEOUT,
            idle_timeout: crate::wire::IDLE_TIMEOUT,
            max_memory: None,
            umask: 0o022,
            discard: DiscardPolicy::Refuse,
            allow_delete: false,
            mirror_base: None,
            owners: crate::metadata::OwnerPolicy::Ignore,
            acls: false,
            observer: unobserved(),
            lobby: None,
        }
    }

    /// Takes a transfer's settings, as the sender does: the receiver's own
    /// share of them (the block size is the sender's to choose).
    pub fn tune(&mut self, s: &Settings) {
        self.io_mode = s.io_mode;
        self.queue_depth = s.queue_depth;
        self.buffer = s.buffer;
        self.socket.congestion = s.congestion.clone();
    }

    /// Refuses settings that cannot work, saying what to change.
    pub fn validate(&self) -> Result<()> {
        if self.token.is_empty() {
            return Err(Error::Config(
                "the token is empty; put a secret in the token file".into(),
            ));
        }
        // The blocks' size is the sender's to choose, so only the bounds of
        // this side's own settings are checked here.
        tuning::BUFFER.check(self.buffer.into())?;
        tuning::QUEUE_DEPTH.check(self.queue_depth as i128)?;
        if let Some(cc) = &self.socket.congestion
            && !tuning::congestion_name_ok(cc)
        {
            return Err(crate::TuningError::Congestion { name: cc.clone() }.into());
        }
        self.socket.check()?;
        if self.max_sessions == 0 {
            return Err(Error::Config("--max-sessions must be at least 1".into()));
        }
        if self.idle_timeout < MIN_IDLE_TIMEOUT {
            return Err(Error::Config(format!(
                "--idle-timeout must be at least {} s: senders write every {} s",
                MIN_IDLE_TIMEOUT.as_secs(),
                crate::wire::KEEPALIVE_INTERVAL.as_secs()
            )));
        }
        if let Some(m) = self.max_memory
            && m < self.buffer
        {
            return Err(Error::Config(format!(
                "--max-memory ({}) must hold at least one session's --buffer ({})",
                crate::units::fmt_bytes(m),
                crate::units::fmt_bytes(self.buffer)
            )));
        }
        if self.umask > 0o777 {
            return Err(Error::Config(format!(
                "--umask {:o} is not a permission mask (000 to 777)",
                self.umask
            )));
        }
        Ok(())
    }
}

pub(crate) struct Shared {
    cfg: ServeConfig,
    root: Root,
    sessions: registry::Registry<Arc<session::Session>>,
    /// The last session's buffers, kept for the next one (see `spare`),
    /// with their share of the memory budget.
    spare_pool: Mutex<spare::Spare<(crate::io::Pools, budget::Reservation)>>,
    memory: Arc<budget::Budget>,
    /// Destinations being written, and by which session.
    claims: claims::Claims,
    admission: Arc<admission::Admission>,
    /// The address it listens on: a parked connection whose next hello
    /// names another port goes to the `Lobby`.
    addr: SocketAddr,
    stop: AtomicBool,
    /// Parked data connections, by their two ends, cut the moment the
    /// server stops unless it is in a `Lobby`: a sender's next session
    /// must not join over one to a server that no longer has its sessions
    /// while another took its address. In a lobby they outlive it, and
    /// their next hello goes to the lobby's running receiver on the port
    /// it names, or is refused (`route`).
    parked: Mutex<HashMap<ParkKey, Conn>>,
    summaries: Mutex<std::collections::VecDeque<ReceiverSummary>>,
    /// The counters of the session planned last, for `ServerHandle::position`.
    latest: Mutex<Option<Arc<stats::Stats>>>,
    /// What every session of this server together did, for a server that
    /// serves one transfer (the in-cluster agent): a sender that
    /// reconnects lists only the files still open, so one session's
    /// figures alone would make the progress drop.
    job: JobCounters,
    /// Mirror connections served to their end (`mirror`).
    mirrors: AtomicU64,
    /// Directories its sessions made (`made_dirs`).
    made_dirs: made_dirs::MadeDirs,
    /// Refused connections and failed accepts are logged at most every
    /// 10 s, with how many (a flood must not flood the log too).
    refusals: Mutex<Throttle>,
    accept_failures: Mutex<Throttle>,
    /// Connections that fail before authenticating, likewise, one
    /// throttle per reason (`auth`, `protocol`, `handshake`): anyone can
    /// open them, token or not, and a scanner's flood must not hide a
    /// real sender's wrong token.
    failed_handshakes: Mutex<HashMap<&'static str, Throttle>>,
}

/// Counters of all sessions of a server together.
#[derive(Debug, Default)]
pub(crate) struct JobCounters {
    /// Bytes of files published.
    pub(crate) published: AtomicU64,
    /// Bytes written, durable or not.
    pub(crate) written: AtomicU64,
    /// Bytes of files found already here at a session's sync level: a
    /// retried session does not offer them again, so they are kept here.
    pub(crate) present: AtomicU64,
    /// When the first session was planned.
    pub(crate) first_plan: std::sync::OnceLock<Instant>,
}

/// A bound receiver.
pub struct Server {
    listener: TcpListener,
    shared: Arc<Shared>,
}

/// A receiver running on a background thread.
pub struct ServerHandle {
    addr: SocketAddr,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    /// Binds `addr` and opens the root.
    pub fn bind(addr: &str, cfg: ServeConfig) -> Result<Self> {
        cfg.validate()?;
        let root = Root::open(&cfg.root)?;
        let listener = net::listen(addr)?;
        let bound = listener
            .local_addr()
            .map_err(|e| Error::net("reading the bound address", e))?;
        let max_memory = cfg.max_memory.unwrap_or(u64::MAX);
        let admission =
            admission::Admission::new(cfg.max_connections, cfg.max_handshakes_per_address);
        let shared = Arc::new(Shared {
            cfg,
            root,
            sessions: registry::Registry::default(),
            spare_pool: Mutex::new(spare::Spare::new(KEEP_IDLE)),
            memory: Arc::new(budget::Budget::new(max_memory)),
            claims: claims::Claims::default(),
            admission: Arc::new(admission),
            addr: bound,
            stop: AtomicBool::new(false),
            parked: Mutex::default(),
            summaries: Mutex::default(),
            latest: Mutex::default(),
            job: JobCounters::default(),
            mirrors: AtomicU64::new(0),
            made_dirs: made_dirs::MadeDirs::default(),
            refusals: Mutex::new(Throttle::new(LOG_EVERY)),
            accept_failures: Mutex::new(Throttle::new(LOG_EVERY)),
            failed_handshakes: Mutex::new(HashMap::new()),
        });
        if let Some(lobby) = &shared.cfg.lobby {
            lobby.join(&shared);
        }
        Ok(Self { listener, shared })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// Accepts connections until stopped.
    pub fn run(self) {
        let shared = Arc::clone(&self.shared);
        let janitor = std::thread::Builder::new()
            .name("spare-pool".into())
            .spawn(move || release_idle_pool(&shared));
        if let Err(e) = janitor {
            tracing::warn!(error = %e, "cannot start the thread that frees idle buffers");
        }
        accept_loop(&self.listener, &self.shared);
    }

    /// Runs the accept loop on a background thread.
    pub fn spawn(self) -> ServerHandle {
        let addr = self.local_addr();
        let shared = Arc::clone(&self.shared);
        let thread = std::thread::Builder::new()
            .name("accept".into())
            .spawn(crate::spans::carry(move || self.run()))
            .expect("spawning the accept thread");
        ServerHandle {
            addr,
            shared,
            thread: Some(thread),
        }
    }
}

impl ServerHandle {
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Summaries of the sessions that ended so far (the last thousand).
    pub fn summaries(&self) -> Vec<ReceiverSummary> {
        lock(&self.shared.summaries).iter().cloned().collect()
    }

    /// Where the transfer stands, as the session planned last has it,
    /// while it runs and after it ended; `None` before any session was
    /// planned. Meant for a server that serves one transfer (the
    /// in-cluster agent), whose sessions are attempts at the same files:
    /// the total is of those published by earlier sessions and those the
    /// latest accepted; done, what a new session would keep if this one
    /// died now (published files, and stored checkpoints, resumed ones
    /// included); moved, what all sessions wrote, durable or not (the
    /// rate, and what tells a transfer that writes but cannot checkpoint
    /// from a stalled one); seconds, since the first session was planned.
    pub fn position(&self) -> Option<Position> {
        let job = &self.shared.job;
        lock(&self.shared.latest).as_ref().map(|s| Position {
            // Files found already here count as done: the transfer
            // covers them without moving them.
            total: s.published_before.load(Ordering::Relaxed)
                + s.total.load(Ordering::Relaxed)
                + job.present.load(Ordering::Relaxed),
            done: job.published.load(Ordering::Relaxed)
                + s.kept.load(Ordering::Relaxed)
                + job.present.load(Ordering::Relaxed),
            moved: job.written.load(Ordering::Relaxed),
            seconds: job
                .first_plan
                .get()
                .map_or(0.0, |t| t.elapsed().as_secs_f64()),
        })
    }

    /// Connections open now, authenticated or not.
    pub fn connections(&self) -> usize {
        self.shared.admission.connections()
    }

    /// Mirror connections served to their end (their deletes done, or
    /// none asked): a receiver that serves one transfer with a mirror is
    /// done only after it.
    pub fn mirrors_done(&self) -> u64 {
        self.shared.mirrors.load(Ordering::Relaxed)
    }

    /// Stops accepting and waits for the accept thread.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // No session will take them; in a lobby its parked connections'
        // threads keep this receiver's state a while longer.
        lock(&self.shared.spare_pool).clear();
        if self.shared.cfg.lobby.is_none() {
            for st in lock(&self.shared.parked).values() {
                let _ = st.shutdown(std::net::Shutdown::Both);
            }
        }
        // Wake the blocking accept.
        let _ = std::net::TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A parked connection's two ends, local and peer: a receiver on several
/// addresses may hold two connections from one sender port.
pub(crate) type ParkKey = (SocketAddr, SocketAddr);

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Lets go of the last session's buffers once the receiver has been idle
/// for `KEEP_IDLE`.
fn release_idle_pool(shared: &Shared) {
    while !shared.stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_secs(1));
        let expired = lock(&shared.spare_pool).expire(Instant::now());
        if expired.is_some() {
            tracing::debug!("idle: freeing the last session's buffers");
        }
    }
}

impl Shared {
    /// Whether it has stopped serving.
    pub(crate) fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Whether its parked connections wait for a next hello: until it
    /// stops, or for as long as they may in a `Lobby`.
    fn keeps_parked(&self) -> bool {
        !self.stopped() || self.cfg.lobby.is_some()
    }

    /// The most data connections parked at once: a quarter of
    /// `max_connections`, so that idle warm senders never hold the slots
    /// a sender starting cold needs.
    pub(crate) fn most_parked(&self) -> usize {
        self.cfg.max_connections / 4
    }

    /// Records a finished session's summary, keeping the last thousand.
    fn record(&self, summary: ReceiverSummary) {
        let mut s = lock(&self.summaries);
        if s.len() >= KEEP_SUMMARIES {
            s.pop_front();
        }
        s.push_back(summary);
    }

    /// Logs refused connections at most every 10 s, with how many.
    fn log_refusal(&self, message: &str) {
        if let Some(held) = lock(&self.refusals).poll(Instant::now()) {
            tracing::warn!(refused = held + 1, "refusing connections: {message}");
        }
    }

    /// Logs connections that failed their handshake for `reason` at most
    /// every 10 s: the first of each interval, with its peer, and how many
    /// were held back since the last one logged.
    fn log_failed_handshake(&self, reason: &'static str, peer: Option<SocketAddr>, e: &Error) {
        let told = lock(&self.failed_handshakes)
            .entry(reason)
            .or_insert_with(|| Throttle::new(LOG_EVERY))
            .poll(Instant::now());
        if let Some(held) = told {
            let peer = peer.map_or_else(|| "?".to_owned(), |p| p.to_string());
            tracing::warn!(
                failed = held + 1,
                %peer,
                "connections closed before authenticating: {e}"
            );
        }
    }
}

/// Tells a connection over a limit why, without waiting on it: the frame
/// fits a fresh socket's buffer, so a non-blocking write takes it whole.
pub(crate) fn refuse_at_once(stream: &Conn, message: &str) {
    let mut out = Vec::with_capacity(message.len() + 16);
    crate::wire::encode(
        &Frame::Error {
            retryable: true,
            message: message.to_string(),
        },
        &mut out,
    );
    let _ = stream.set_nonblocking(true);
    let _ = (&*stream).write(&out);
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    for conn in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            break;
        }
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                // EMFILE and friends: wait for connections to close.
                if let Some(held) = lock(&shared.accept_failures).poll(Instant::now()) {
                    tracing::warn!(failures = held + 1, "accept failed: {e}");
                }
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let stream = Conn::from(stream);
        let Ok(peer) = stream.peer_addr() else {
            continue;
        };
        let ticket = match shared
            .admission
            .admit(peer.ip(), Some(&stream), Instant::now())
        {
            Ok(admitted) => {
                if admitted.evicted {
                    shared.cfg.observer.refused(admission::EVICTED);
                }
                admitted.ticket
            }
            Err(refusal) => {
                shared.cfg.observer.refused(refusal.metric_label());
                let message = refusal.message();
                refuse_at_once(&stream, &message);
                shared.log_refusal(&message);
                continue;
            }
        };
        let shared = Arc::clone(shared);
        let spawned = std::thread::Builder::new()
            .name("conn".into())
            .spawn(crate::spans::carry(move || {
                if let Err(e) = handle_connection(shared, stream, ticket) {
                    tracing::warn!(%peer, "connection closed: {e}");
                }
            }));
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start a connection thread");
        }
    }
}

fn handle_connection(
    shared: Arc<Shared>,
    mut stream: Conn,
    ticket: admission::Ticket,
) -> Result<()> {
    net::apply(&stream, &shared.cfg.socket)?;
    // Whose the connection is: a parked one may be handed to another
    // receiver of the lobby, its slot with it, and nothing here keeps the
    // one it leaves (its buffers and root) alive.
    let mut at = At {
        shared,
        ticket,
        parked: false,
        dialled: 0,
    };
    // A data stream its sender parks comes back here for its next
    // session's handshake.
    loop {
        let Some(purpose) = handshake(&mut at, &mut stream) else {
            return Ok(());
        };
        at.ticket.authenticated();
        let shared = &at.shared;
        match purpose {
            Purpose::Control => return session::run_control(shared, stream),
            Purpose::Mirror => return mirror::run(shared, stream),
            Purpose::Join {
                session,
                stream: idx,
            } => match stream::run_stream(shared, stream, session, idx)? {
                Some((parked, key)) if wait_parked(shared, &parked, key) => {
                    stream = parked;
                    at.parked = true;
                }
                _ => return Ok(()),
            },
            Purpose::Relay => {
                let refusal = Frame::Error {
                    retryable: false,
                    message: "this is a receiver (wirerate serve), not a relay (wirerate relay); \
                              check the --via address"
                        .into(),
                };
                let _ = write_frame(&mut stream, &refusal);
                net::linger(&stream, Duration::from_secs(2));
                return Ok(());
            }
        }
    }
}

/// The receiver a connection is served by, and its slot there.
struct At {
    shared: Arc<Shared>,
    ticket: admission::Ticket,
    /// Whether it was parked: only then may its hello name another port.
    parked: bool,
    /// The port its sender dialled to reach this receiver, as its first
    /// hello named it (a port-forward on the way may have changed it).
    dialled: u16,
}

/// Serves a parked connection's next hello, which names `port`, where
/// it belongs: at the receiver it was parked at when it names the port
/// the sender dialled to reach that one and that one still runs,
/// otherwise at the lobby's receiver on `port` (a later transfer's may
/// have bound the stopped one's port). `Err` says why neither can (it is
/// told, and closed, and its sender connects afresh). A receiver never
/// serves a hello meant for another: with the same token it would
/// authenticate, and the stream would then join a session it does not
/// have.
fn route(at: &mut At, stream: &Conn, port: u16) -> std::result::Result<(), NotHere> {
    if port == at.dialled && !at.shared.stopped() {
        return Ok(());
    }
    hand_over(at, stream, port)
}

/// Why a parked connection's next hello is served by no receiver here.
#[derive(Debug, thiserror::Error)]
enum NotHere {
    #[error("the receiver this connection was parked at has stopped")]
    Stopped,
    #[error("this connection reached the receiver on port {reached}, not {named}")]
    OtherPort { reached: u16, named: u16 },
    #[error("no receiver on port {0} here")]
    NoReceiver(u16),
    #[error("{0}")]
    Busy(String),
    #[error("the connection is gone: {0}")]
    Gone(String),
}

/// Hands a parked connection whose hello names `port` to the lobby's
/// receiver there, taking a slot of its own there first.
fn hand_over(at: &mut At, stream: &Conn, port: u16) -> std::result::Result<(), NotHere> {
    let Some(lobby) = &at.shared.cfg.lobby else {
        return Err(if port == at.dialled {
            NotHere::Stopped
        } else {
            NotHere::OtherPort {
                reached: at.dialled,
                named: port,
            }
        });
    };
    let (local, peer) = stream
        .local_addr()
        .and_then(|l| Ok((l, stream.peer_addr()?)))
        .map_err(|e| NotHere::Gone(e.to_string()))?;
    let next = lobby
        .running_on(local.ip(), port)
        .ok_or(NotHere::NoReceiver(port))?;
    let admitted = next
        .admission
        .admit(peer.ip(), Some(stream), Instant::now())
        .map_err(|refusal| {
            let message = refusal.message();
            next.cfg.observer.refused(refusal.metric_label());
            next.log_refusal(&message);
            NotHere::Busy(message)
        })?;
    if admitted.evicted {
        next.cfg.observer.refused(admission::EVICTED);
    }
    let ticket = admitted.ticket;
    net::apply(stream, &next.cfg.socket).map_err(|e| NotHere::Gone(e.to_string()))?;
    tracing::debug!(
        from = %at.shared.addr,
        to = port,
        "a parked connection changes receivers"
    );
    at.shared = next;
    at.ticket = ticket;
    at.dialled = port;
    Ok(())
}

/// How a handshake ended, short of failing.
enum Step {
    /// Closed before its first byte.
    Probe,
    /// A parked connection's hello that no receiver here can take.
    NotHere(NotHere),
    Authenticated(Purpose),
}

/// Authenticates a connection within the handshake timeout; `None` (with
/// the refusal counted and logged) when it does not.
fn handshake(at: &mut At, stream: &mut Conn) -> Option<Purpose> {
    let timeout = at.shared.cfg.handshake_timeout;
    let handshake = net::handshake(stream, timeout, |d| {
        // TCP readiness probes and port waits connect and close without a
        // byte; that is not worth a warning on every probe.
        if matches!(d.peek(&mut [0u8; 1]), Ok(0)) {
            return Ok(Step::Probe);
        }
        let hello = auth::read_hello(d)?;
        if !at.parked {
            at.dialled = hello.port;
        } else if let Err(why) = route(at, d.conn(), hello.port) {
            let _ = write_frame(
                d,
                &Frame::Error {
                    retryable: true,
                    message: why.to_string(),
                },
            );
            return Ok(Step::NotHere(why));
        }
        let (token, mode) = (&at.shared.cfg.token, at.shared.cfg.encrypt);
        auth::answer(d, &hello, token, mode).map(Step::Authenticated)
    });
    let shared = &at.shared;
    match handshake {
        Ok(Step::Authenticated(p)) => {
            shared
                .cfg
                .observer
                .connection_agreed(net::tls::Side::Server, stream.in_effect());
            Some(p)
        }
        Ok(Step::Probe) => {
            tracing::debug!("connection closed before its hello (a probe, or a parked stream)");
            None
        }
        // Not a failure: its sender connects afresh.
        Ok(Step::NotHere(why)) => {
            tracing::debug!("a parked connection's next hello cannot be served: {why}");
            None
        }
        Err(e) => {
            let reason = match &e {
                Error::Auth(_) => "auth",
                Error::Encryption(_) => "encryption",
                Error::Protocol(_) | Error::Violation(_) => "protocol",
                _ => "handshake",
            };
            shared.cfg.observer.refused(reason);
            if matches!(e, Error::Protocol(_)) {
                let _ = write_frame(
                    stream,
                    &Frame::Error {
                        retryable: e.is_retryable(),
                        message: e.to_string(),
                    },
                );
            }
            // Counted in the metrics above; logged sparingly here, not by
            // the caller per connection.
            shared.log_failed_handshake(reason, stream.peer_addr().ok(), &e);
            None
        }
    }
}

/// Holds a data connection `stream::run_stream` parked (and registered
/// in `Shared::parked`) until its sender starts the next handshake on it
/// (true), or for at most `PARK_IDLE`, or until the receiver stops when
/// it is in no lobby (false: it closes); then takes it off the register by `key`, known
/// from before (a socket reset meanwhile no longer has a peer address).
fn wait_parked(shared: &Shared, stream: &Conn, key: ParkKey) -> bool {
    let woken = wait_parked_until(shared, stream, Instant::now() + PARK_IDLE);
    lock(&shared.parked).remove(&key);
    woken
}

fn wait_parked_until(shared: &Shared, stream: &Conn, until: Instant) -> bool {
    // Registered before this first look at `stop`: `shutdown` sets it and
    // then cuts what is registered, so either this sees it or it is cut.
    while shared.keeps_parked() {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            tracing::debug!("a parked data stream went unused; closing it");
            return false;
        }
        match net::wait_readable(stream, left.min(Duration::from_secs(1))) {
            Ok(true) => return true,
            Ok(false) => {}
            Err(_) => return false,
        }
    }
    false
}
