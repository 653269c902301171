//! The relay's side: take jobs from authenticated leads and run each as
//! the session the lead would have run, from this host.

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use super::job::{self, Root};
use super::{ALIVE_EVERY, JOB_WITHIN, MAX_JOBS, SILENCE};
use crate::error::{Error, Result};
use crate::net::{self, Conn, auth};
use crate::progress::Progress;
use crate::receiver::admission::{Admission, Ticket};
use crate::receiver::budget::{Budget, Reservation};
use crate::sender::warm::Warm;
use crate::sender::{RunState, SendConfig, send_list};
use crate::units::fmt_bytes;
use crate::wire::{
    Frame, MAX_RELAY_SUMS, MAX_SMALL_FRAME, Purpose, RelayError, read_frame_capped, write_frame,
};

/// Handshakes one address may hold at once, and all addresses together.
const HANDSHAKES_PER_ADDRESS: usize = 4;
const HANDSHAKES: usize = 16;
/// Keepalives taken from the lead per look: a lead that streams them
/// cannot keep the watch from its other duties.
const FRAMES_PER_LOOK: usize = 16;

/// What a relay serves.
#[derive(Clone)]
pub struct RelayConfig {
    /// The token leads must prove, and the relay proves to receivers.
    pub token: Vec<u8>,
    /// Whether connections are encrypted (TLS 1.3): `Required` refuses
    /// a peer that will not.
    pub encrypt: crate::encryption::Encryption,
    /// The directories jobs may read beneath.
    pub roots: Vec<PathBuf>,
    /// This host's own settings for the sessions it runs (I/O mode,
    /// buffers, sockets, connect timeout); the job sets the rest. Its
    /// `buffer` is the most one job's buffers may take.
    pub send: SendConfig,
    /// The most all jobs' buffers may take together (default: four
    /// jobs' `send.buffer`, two pairs' two sessions each).
    pub max_memory: Option<u64>,
    /// The most one job's buffers may take (default: `send.buffer`, the
    /// CLI's `--buffer`). The in-cluster relay allows what the Transfer's
    /// own sender could take (`sender::most_session_memory`), so that it
    /// never refuses a job the sender would have run itself.
    pub job_memory: Option<u64>,
}

/// A bound relay.
pub struct Relay {
    listener: TcpListener,
    shared: Arc<Shared>,
}

struct Shared {
    cfg: RelayConfig,
    roots: Vec<Root>,
    admission: Arc<Admission>,
    memory: Arc<Budget>,
    /// Parked data connections, by receiver, and the last job's buffers.
    warm: Arc<Warm>,
}

impl Relay {
    /// Binds `addr`, each root resolved and opened now.
    pub fn bind(addr: &str, cfg: RelayConfig) -> Result<Self> {
        if cfg.roots.is_empty() {
            return Err(Error::Config(
                "a relay needs at least one --allow-root to read beneath".into(),
            ));
        }
        let roots = cfg
            .roots
            .iter()
            .map(|r| Root::open(r))
            .collect::<Result<Vec<_>>>()?;
        let memory = cfg.max_memory.unwrap_or(cfg.send.buffer.saturating_mul(4));
        let listener = net::listen(addr)?;
        Ok(Self {
            listener,
            shared: Arc::new(Shared {
                roots,
                admission: Arc::new(
                    Admission::new(MAX_JOBS, HANDSHAKES_PER_ADDRESS).with_handshakes(HANDSHAKES),
                ),
                memory: Arc::new(Budget::new(memory)),
                warm: Arc::new(Warm::default()),
                cfg,
            }),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        self.listener
            .local_addr()
            .map_err(|e| Error::net("reading the bound address", e))
    }

    /// Serves jobs until the process ends.
    pub fn run(self) {
        self.serve_until(&AtomicBool::new(false));
    }

    /// Serves jobs in a thread of its own until the handle is stopped or
    /// dropped (the in-cluster agent runs one per Transfer it relays for).
    pub fn spawn(self) -> Result<RelayHandle> {
        let addr = self.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("relay-accept".into())
            .spawn(crate::spans::carry(move || self.serve_until(&stopped)))
            .map_err(|e| Error::io("starting a relay's thread".to_string(), e))?;
        Ok(RelayHandle {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    fn serve_until(self, stop: &AtomicBool) {
        for conn in self.listener.incoming() {
            if stop.load(Ordering::SeqCst) {
                break;
            }
            let Ok(stream) = conn.map(Conn::from) else {
                // EMFILE and friends: wait for connections to close.
                std::thread::sleep(Duration::from_millis(50));
                continue;
            };
            let Ok(peer) = stream.peer_addr() else {
                continue;
            };
            let admitted = self
                .shared
                .admission
                .admit(peer.ip(), Some(&stream), Instant::now());
            let ticket = match admitted {
                Ok(a) => a.ticket,
                Err(_) => {
                    let message = format!(
                        "relay busy: it runs {MAX_JOBS} jobs and {HANDSHAKES} handshakes at most; retry later"
                    );
                    crate::receiver::refuse_at_once(&stream, &message);
                    continue;
                }
            };
            let shared = Arc::clone(&self.shared);
            let spawned = std::thread::Builder::new()
                .name("relay-job".into())
                .spawn(move || {
                    let mut ticket = ticket;
                    if let Err(e) = serve(&shared, stream, &mut ticket) {
                        tracing::warn!(%peer, "relay job ended: {e}");
                    }
                });
            if let Err(e) = spawned {
                tracing::error!(error = %e, "cannot start a relay job's thread");
            }
        }
    }
}

/// A relay serving in its own thread ([`Relay::spawn`]).
pub struct RelayHandle {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RelayHandle {
    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Takes no more jobs and closes the listener. Jobs in flight run on
    /// until their lead ends them: the lead's coordinator counts on their
    /// answers, and fences what they write if it never comes.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept.
        let _ = std::net::TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for RelayHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

fn serve(shared: &Shared, mut conn: Conn, ticket: &mut Ticket) -> Result<()> {
    let purpose = net::handshake(&mut conn, net::HANDSHAKE_TIMEOUT, |d| {
        auth::server(d, &shared.cfg.token, shared.cfg.encrypt)
    })?;
    ticket.authenticated();
    if purpose != Purpose::Relay {
        let message = "this is a relay (wirerate relay), not a receiver: send to the receivers, \
                       and name this host in --via";
        return refuse(&conn, false, message.into());
    }
    let got = match net::within(&conn, JOB_WITHIN, |d| job::read(d)) {
        Ok(got) => got,
        Err(e) => {
            return refuse(
                &conn,
                false,
                format!("the relay could not read the job: {e}"),
            );
        }
    };
    let most = shared.cfg.job_memory.unwrap_or(shared.cfg.send.buffer);
    let need = match job::memory(&got.job, &shared.cfg.send, most) {
        Ok(need) => need,
        Err(e) => return refuse(&conn, false, e.to_string()),
    };
    if need > shared.memory.max() {
        let message = format!(
            "the job needs {} of buffers, more than this relay's --max-memory {}: raise it",
            fmt_bytes(need),
            fmt_bytes(shared.memory.max())
        );
        return refuse(&conn, false, message);
    }
    let stripe = got.stripe.clone();
    let cancel = Arc::new(AtomicBool::new(false));
    let progress = Arc::new(Progress::default());
    shared.warm.expire(Instant::now());
    let (st, run) = run_watched(&mut conn, &progress, &cancel, || {
        // A full relay holds the job, saying it is alive, until other
        // jobs give their buffers back: its lead's pair waits, not lost.
        let Some(_reservation) = wait_for_memory(&shared.memory, need, &cancel) else {
            let stopped = Error::Config("stopped while it waited for memory".into());
            return (
                RunState::default(),
                Err(Error::Cancelled {
                    last: Box::new(stopped),
                }),
            );
        };
        let (mut cfg, list) = match job::prepare(got, &shared.roots, &shared.cfg.send) {
            Ok(prepared) => prepared,
            Err(e) => {
                tracing::warn!("relay job refused: {e}");
                return (RunState::default(), Err(e));
            }
        };
        cfg.warm = Some(Arc::clone(&shared.warm));
        cfg.progress = Arc::clone(&progress);
        cfg.cancel = Some(Arc::clone(&cancel));
        send_list(&cfg, &list)
    });
    answer(&mut conn, &st, &run, &stripe)?;
    net::linger(&conn, SILENCE);
    Ok(())
}

/// Takes `need` bytes of the relay's memory once other jobs have given
/// them back; `None` if the job is cancelled first.
fn wait_for_memory(memory: &Arc<Budget>, need: u64, cancel: &AtomicBool) -> Option<Reservation> {
    let mut said = false;
    loop {
        match memory.reserve(need) {
            Ok(r) => return Some(r),
            Err(used) if !said => {
                tracing::warn!(
                    held = %fmt_bytes(used),
                    need = %fmt_bytes(need),
                    "relay job waits for memory (--max-memory {})",
                    fmt_bytes(memory.max())
                );
                said = true;
            }
            Err(_) => {}
        }
        if cancel.load(Ordering::Relaxed) {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Tells the lead why the job is not run, and closes.
fn refuse(conn: &Conn, retryable: bool, message: String) -> Result<()> {
    let refusal = Frame::Error { retryable, message };
    let _ = net::within(conn, SILENCE, |d| write_frame(d, &refusal));
    net::linger(conn, SILENCE);
    Ok(())
}

/// Runs `session` (the job's checks, then its session) while telling the
/// lead the job runs and what it moved, and cancels it when the lead
/// closes its side or goes silent.
fn run_watched(
    conn: &mut Conn,
    progress: &Progress,
    cancel: &AtomicBool,
    session: impl FnOnce() -> (RunState, Result<()>) + Send,
) -> (RunState, Result<()>) {
    let (tx, rx) = mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(move || {
            // A panic is a bug, and is told to the lead as one rather
            // than lost with the connection.
            let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(session))
                .unwrap_or_else(|_| {
                    let bug = Error::Internal("the relay's session panicked".into());
                    (RunState::default(), Err(bug))
                });
            let _ = tx.send(done);
        });
        let mut heard = Instant::now();
        let mut listening = true;
        loop {
            match rx.recv_timeout(ALIVE_EVERY) {
                Ok(done) => return done,
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return (
                        RunState::default(),
                        Err(Error::Internal("the relay's session ended unheard".into())),
                    );
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
            let moved = progress.position().moved;
            let alive = net::within(conn, SILENCE, |d| {
                write_frame(d, &Frame::RelayAlive { moved })
            });
            if listening {
                match heard_from(conn) {
                    Ok(true) => heard = Instant::now(),
                    Ok(false) => {}
                    // Closed (the lead cancelled the job) or broken.
                    Err(_) => listening = false,
                }
            }
            if alive.is_err() || !listening || heard.elapsed() >= SILENCE {
                cancel.store(true, Ordering::Relaxed);
            }
        }
    })
}

/// Takes the lead's keepalives that have arrived; `Err` once it closed.
fn heard_from(conn: &Conn) -> Result<bool> {
    let mut heard = false;
    for _ in 0..FRAMES_PER_LOOK {
        let ready = net::wait_readable(conn, Duration::ZERO)
            .map_err(|e| Error::net("waiting for the lead", e))?;
        if !ready {
            break;
        }
        match net::within(conn, SILENCE, |d| read_frame_capped(d, MAX_SMALL_FRAME))? {
            Frame::Keepalive => heard = true,
            other => {
                return Err(crate::violation::Violation::unexpected(
                    "a keepalive",
                    crate::session::describe(&other),
                )
                .into());
            }
        }
    }
    Ok(heard)
}

/// Tells the lead what the session did: each file's checksums of its
/// piece and verdict, then how it ended.
fn answer(
    conn: &mut Conn,
    st: &RunState,
    run: &Result<()>,
    stripe: &crate::wire::Stripe,
) -> Result<()> {
    let ranges = stripe.ranges();
    net::within(conn, SILENCE, |d| {
        for (&file_id, sums) in &st.sums {
            let (first, end) = ranges.get(&file_id).copied().unwrap_or((0, 0));
            let end = (end as usize).min(sums.len());
            let mut at = (first as usize).min(end);
            while at < end {
                let upto = (at + MAX_RELAY_SUMS).min(end);
                write_frame(
                    d,
                    &Frame::RelaySums {
                        file_id,
                        first: at as u64,
                        sums: sums[at..upto].to_vec(),
                    },
                )?;
                at = upto;
            }
        }
        for (&file_id, verdict) in &st.verdicts {
            let (ok, digest, message) = match verdict {
                crate::session::FileVerdict::Ok(d) => (true, *d, String::new()),
                crate::session::FileVerdict::Failed(why) => (false, 0, why.clone()),
                // A relay's sessions send every file (no sync level, no
                // dry run), so the core never takes a file as present.
                crate::session::FileVerdict::Present | crate::session::FileVerdict::WouldSend => {
                    (false, 0, "answered present in a relayed session".to_owned())
                }
            };
            let held = st.held_in_pieces.get(&file_id).copied().unwrap_or(0);
            write_frame(
                d,
                &Frame::RelayResult {
                    file_id,
                    ok,
                    digest,
                    held,
                    message,
                },
            )?;
        }
        let error = run.as_ref().err().map(|e| RelayError {
            retryable: e.is_retryable()
                || matches!(e, Error::GaveUp { .. } | Error::Cancelled { .. }),
            message: e.to_string(),
        });
        write_frame(
            d,
            &Frame::RelayDone {
                bytes_sent: st.bytes_sent,
                error,
            },
        )
    })
}
