//! The receiving side: `wirerate-agent serve`.
//!
//! One thread per connection. A control connection opens a session, gets
//! the manifest, answers with a plan (what to send, what it already has)
//! and receives per-file digests; data streams join the session and hand
//! verified blocks to the session's writer thread, which keeps
//! `queue_depth` writes in flight and checkpoints durable blocks.

mod checkpoint;
mod checkpointer;
mod dest;
mod registry;
mod session;
mod spare;
mod writer;

use std::collections::HashSet;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

pub use checkpoint::Checkpoint;

use crate::error::{Error, Result};
use crate::fsroot::Root;
use crate::io::IoMode;
use crate::metrics::metrics;
use crate::net::{self, SocketOpts, auth};
use crate::summary::ReceiverSummary;
use crate::wire::{Frame, Purpose, write_frame};

/// More concurrent connections than this are refused, so a flood of
/// garbage peers cannot exhaust threads.
const MAX_CONNECTIONS: usize = 1024;
/// A peer has this long to complete the handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How the receiver writes.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Everything is written beneath this directory.
    pub root: PathBuf,
    /// The shared secret.
    pub token: Vec<u8>,
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
    /// Print a summary line per session on stdout (JSON when `json`).
    pub print_summaries: bool,
    /// Print summaries as JSON.
    pub json: bool,
}

impl ServeConfig {
    /// Defaults for `root` and `token`.
    pub fn new(root: PathBuf, token: Vec<u8>) -> Self {
        Self {
            root,
            token,
            io_mode: IoMode::Async,
            queue_depth: crate::defaults::QUEUE_DEPTH,
            buffer: crate::defaults::BUFFER,
            max_sessions: 16,
            checkpoint_interval: Duration::from_secs(1),
            socket: SocketOpts::default(),
            join_wait: HANDSHAKE_TIMEOUT,
            print_summaries: false,
            json: false,
        }
    }
}

pub(crate) struct Shared {
    cfg: ServeConfig,
    root: Root,
    sessions: registry::Registry<Arc<session::Session>>,
    /// The last session's buffers, kept for the next one (see `spare`).
    spare_pool: Mutex<spare::Spare<crate::io::Pools>>,
    busy: Mutex<HashSet<String>>,
    connections: AtomicUsize,
    stop: AtomicBool,
    summaries: Mutex<Vec<ReceiverSummary>>,
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
        if cfg.token.is_empty() {
            return Err(Error::Config(
                "the token is empty; put a secret in the token file".into(),
            ));
        }
        let root = Root::open(&cfg.root)?;
        let listener = net::listen(addr)?;
        Ok(Self {
            listener,
            shared: Arc::new(Shared {
                cfg,
                root,
                sessions: registry::Registry::default(),
                spare_pool: Mutex::new(spare::Spare::new(spare::KEEP_IDLE)),
                busy: Mutex::default(),
                connections: AtomicUsize::new(0),
                stop: AtomicBool::new(false),
                summaries: Mutex::default(),
            }),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// Accepts connections until stopped.
    pub fn run(self) {
        let shared = Arc::clone(&self.shared);
        let janitor = std::thread::Builder::new()
            .name("spare-pool".into())
            .spawn(move || release_idle_pool(&shared));
        if let Err(e) = janitor {
            tracing::warn!("cannot start the thread that frees idle buffers: {e}");
        }
        accept_loop(&self.listener, &self.shared);
    }

    /// Runs the accept loop on a background thread.
    pub fn spawn(self) -> ServerHandle {
        let addr = self.local_addr();
        let shared = Arc::clone(&self.shared);
        let thread = std::thread::Builder::new()
            .name("accept".into())
            .spawn(move || self.run())
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

    /// Summaries of the sessions that ended so far.
    pub fn summaries(&self) -> Vec<ReceiverSummary> {
        lock(&self.shared.summaries).clone()
    }

    /// Stops accepting and waits for the accept thread.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
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

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Lets go of the last session's buffers once the receiver has been idle
/// for `spare::KEEP_IDLE`.
fn release_idle_pool(shared: &Shared) {
    while !shared.stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_secs(1));
        let expired = lock(&shared.spare_pool).expire(std::time::Instant::now());
        if expired.is_some() {
            tracing::debug!("idle: freeing the last session's buffers");
        }
    }
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    for conn in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            break;
        }
        let stream = match conn {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        if shared.connections.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            shared.connections.fetch_sub(1, Ordering::SeqCst);
            metrics()
                .rejected
                .with_label_values(&["too_many_connections"])
                .inc();
            continue;
        }
        let shared = Arc::clone(shared);
        let spawned = std::thread::Builder::new()
            .name("conn".into())
            .spawn(move || {
                let peer = stream.peer_addr().ok();
                if let Err(e) = handle_connection(&shared, stream) {
                    tracing::warn!(?peer, "connection closed: {e}");
                }
                shared.connections.fetch_sub(1, Ordering::SeqCst);
            });
        if let Err(e) = spawned {
            tracing::error!("cannot start a connection thread: {e}");
        }
    }
}

fn handle_connection(shared: &Arc<Shared>, mut stream: TcpStream) -> Result<()> {
    net::apply(&stream, &shared.cfg.socket)?;
    stream
        .set_read_timeout(Some(HANDSHAKE_TIMEOUT))
        .map_err(|e| Error::net("setting a read timeout", e))?;
    // TCP readiness probes and port waits connect and close without a
    // byte; that is not worth a warning on every probe.
    if matches!(stream.peek(&mut [0u8; 1]), Ok(0)) {
        tracing::debug!("connection closed before its hello (a probe?)");
        return Ok(());
    }
    let purpose = match auth::server(&mut stream, &shared.cfg.token) {
        Ok(p) => p,
        Err(e) => {
            let reason = match &e {
                Error::Auth(_) => "auth",
                Error::Protocol(_) | Error::Violation(_) => "protocol",
                _ => "handshake",
            };
            metrics().rejected.with_label_values(&[reason]).inc();
            if matches!(e, Error::Protocol(_)) {
                let _ = write_frame(
                    &mut stream,
                    &Frame::Error {
                        retryable: false,
                        message: e.to_string(),
                    },
                );
            }
            return Err(e);
        }
    };
    stream
        .set_read_timeout(None)
        .map_err(|e| Error::net("clearing the read timeout", e))?;
    match purpose {
        Purpose::Control => session::run_control(shared, stream),
        Purpose::Join {
            session,
            stream: idx,
        } => session::run_stream(shared, stream, session, idx),
    }
}
