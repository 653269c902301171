//! A TLS session shared by every handle of one connection (a reader and
//! a writer on different threads, as the plain socket is shared), sealing
//! and opening records in this process.
//!
//! Three locks, always taken in this order: `recv` (one reader on the
//! socket at a time), `send` (records reach the socket in the order they
//! were sealed), `state` (the rustls session). The socket is read and
//! written with `state` released, so a writer blocked on a full socket
//! never stops the reader from opening what arrives, and so never stops
//! the acknowledgements that would unblock it. The reader writes only an
//! alert, before the connection fails; rustls sends the answer to a
//! peer's key update with the next record this end seals.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::BINDING_LEN;

/// Plaintext sealed under one key before this end asks for new keys (a
/// TLS 1.3 KeyUpdate). AES-GCM's limit in TLS 1.3 is 2^24.5 full records,
/// about 362 GiB, and rustls refreshes keys before it on its own; this
/// stays far under it whatever rustls does, and lets a test lower it to
/// see streams carry many keys' worth.
pub const REKEY_AFTER: u64 = 64 << 30;

/// Raw bytes read from the socket in one call, at most...
const RAW_CHUNK: usize = 256 << 10;
/// ...and at least: one full record. The buffer grows with what callers
/// read, so the small frames of a handshake (a peer not yet
/// authenticated) get no more than this.
const RAW_FIRST: usize = 16 << 10;
/// Plaintext sealed per lock of the session: a block of several MiB is
/// sealed and sent in pieces, so the reader is never kept waiting long.
pub(super) const SEAL_CHUNK: usize = 256 << 10;

/// One connection's TLS session.
pub struct Link {
    recv: Mutex<Raw>,
    send: Mutex<Vec<u8>>,
    state: Mutex<Session>,
    binding: [u8; BINDING_LEN],
    rekey_after: u64,
    rekeys: AtomicU64,
    /// Set by a read that left plaintext to take (or records to open).
    pending: AtomicBool,
    /// Set once a write failed part-way (the session's record numbers
    /// have moved past what the peer received, so nothing sealed after
    /// it could be opened) or a record was refused: every later read or
    /// write fails at once.
    broken: AtomicBool,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("rekeys", &self.rekeys())
            .finish_non_exhaustive()
    }
}

/// Bytes read from the socket and not yet handed to the session, and
/// what ended reading.
struct Raw {
    buf: Vec<u8>,
    at: usize,
    end: usize,
    eof: bool,
    /// The session refused what arrived: said to every later read.
    failed: Option<String>,
}

struct Session {
    conn: rustls::Connection,
    /// Plaintext sealed since the last key update.
    sealed: u64,
}

/// Whether opened plaintext waits to be taken, or the peer has closed
/// (a read returns at once either way).
fn left_to_take(st: &mut Session) -> bool {
    st.conn
        .process_new_packets()
        .is_ok_and(|s| s.plaintext_bytes_to_read() > 0 || s.peer_has_closed())
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn refused(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {what}"))
}

fn broken_error() -> io::Error {
    io::Error::new(
        io::ErrorKind::BrokenPipe,
        "TLS: the session broke earlier (a write that failed part-way, or a record refused)",
    )
}

impl Link {
    pub(super) fn new(mut conn: rustls::Connection, binding: [u8; BINDING_LEN]) -> Self {
        // Whatever a writer hands over is sealed at once: the socket, not
        // rustls, is where a writer waits.
        conn.set_buffer_limit(None);
        // What the handshake's last reads opened already.
        let pending = conn
            .process_new_packets()
            .is_ok_and(|s| s.plaintext_bytes_to_read() > 0);
        Self {
            recv: Mutex::new(Raw {
                buf: Vec::new(),
                at: 0,
                end: 0,
                eof: false,
                failed: None,
            }),
            send: Mutex::new(Vec::new()),
            state: Mutex::new(Session { conn, sealed: 0 }),
            binding,
            rekey_after: REKEY_AFTER,
            rekeys: AtomicU64::new(0),
            pending: AtomicBool::new(pending),
            broken: AtomicBool::new(false),
        }
    }

    /// The same link, asking for new keys after `bytes` instead (tests).
    pub fn rekeying_after(mut self, bytes: u64) -> Self {
        self.rekey_after = bytes.max(1);
        self
    }

    /// The TLS exporter value both ends' HMAC proofs cover.
    pub fn binding(&self) -> &[u8; BINDING_LEN] {
        &self.binding
    }

    /// How many key updates this end asked for.
    pub fn rekeys(&self) -> u64 {
        self.rekeys.load(Ordering::Relaxed)
    }

    /// Whether plaintext already opened waits here: a reader must not
    /// wait for the socket to be readable first.
    pub fn has_pending(&self) -> bool {
        self.pending.load(Ordering::Acquire)
    }

    /// Reads plaintext, reading and opening records from `tcp` as needed;
    /// 0 once the peer closed. `before_read` runs before each read of the
    /// socket (a handshake's deadline sets the time left there).
    pub fn read(
        &self,
        tcp: &TcpStream,
        buf: &mut [u8],
        before_read: &dyn Fn() -> io::Result<()>,
    ) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let mut raw = lock(&self.recv);
        loop {
            if let Some(why) = &raw.failed {
                return Err(refused(why));
            }
            if self.broken.load(Ordering::Acquire) {
                return Err(broken_error());
            }
            let mut st = lock(&self.state);
            match st.conn.reader().read(buf) {
                Ok(n) => {
                    let left = self.open_more(&mut raw, &mut st);
                    self.pending.store(left, Ordering::Release);
                    drop(st);
                    if raw.failed.is_some() {
                        self.send_alert(tcp);
                    }
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                // Closed without a close_notify: the protocol's own
                // frames say whether anything was cut short.
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
                Err(e) => return Err(e),
            }
            if raw.at < raw.end {
                let at = raw.at;
                let opened = self.open_more(&mut raw, &mut st);
                drop(st);
                if raw.failed.is_some() {
                    self.send_alert(tcp);
                } else if raw.at == at && !opened {
                    // Never loop without progress, whatever rustls does.
                    raw.failed = Some("a record that neither opens nor fails".into());
                    self.broken.store(true, Ordering::Release);
                }
                continue;
            }
            drop(st);
            if raw.eof {
                return Ok(0);
            }
            let want = buf.len().clamp(RAW_FIRST, RAW_CHUNK);
            if raw.buf.len() < want {
                raw.buf.resize(want, 0);
            }
            let n = loop {
                before_read()?;
                match (&*tcp).read(&mut raw.buf) {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    other => break other?,
                }
            };
            (raw.at, raw.end, raw.eof) = (0, n, n == 0);
        }
    }

    /// Hands the raw bytes read to the session and opens every whole
    /// record among them (a partial one waits in the session for the
    /// rest); says whether plaintext is left to take. A refusal is kept
    /// in `raw.failed`.
    fn open_more(&self, raw: &mut Raw, st: &mut Session) -> bool {
        while raw.at < raw.end && raw.failed.is_none() {
            let mut unread = &raw.buf[raw.at..raw.end];
            let before = unread.len();
            let took = match st.conn.read_tls(&mut unread) {
                Ok(n) => n,
                // Refused while opened plaintext waits (rustls holds only
                // so much): the rest is handed over once it is taken.
                Err(_) if left_to_take(st) => break,
                // Refused for what the peer sent: a handshake message
                // fragmented past rustls's 64 KiB, say. It never opens.
                Err(e) => {
                    raw.failed = Some(e.to_string());
                    break;
                }
            };
            raw.at += before - unread.len();
            if let Err(e) = st.conn.process_new_packets() {
                raw.failed = Some(e.to_string());
            }
            if took == 0 {
                break;
            }
        }
        if raw.failed.is_some() {
            // Nothing sealed after a refusal could reach the peer whole.
            self.broken.store(true, Ordering::Release);
            return true;
        }
        left_to_take(st)
    }

    /// Sends the alert the session sealed on refusing a record, if no
    /// writer holds the socket (one blocked on a full socket must not
    /// hold the reader too).
    fn send_alert(&self, tcp: &TcpStream) {
        let Ok(mut out) = self.send.try_lock() else {
            return;
        };
        out.clear();
        {
            let mut st = lock(&self.state);
            while st.conn.wants_write() {
                if st.conn.write_tls(&mut *out).is_err() {
                    break;
                }
            }
        }
        let _ = (&*tcp).write_all(&out);
    }

    /// Seals `bufs` in order and writes them to `tcp`.
    pub fn write_all(&self, tcp: &TcpStream, bufs: &[&[u8]]) -> io::Result<()> {
        let mut out = lock(&self.send);
        if self.broken.load(Ordering::Acquire) {
            return Err(broken_error());
        }
        for chunk in bufs.iter().flat_map(|b| b.chunks(SEAL_CHUNK)) {
            out.clear();
            {
                let mut st = lock(&self.state);
                if st.sealed >= self.rekey_after {
                    st.conn
                        .refresh_traffic_keys()
                        .map_err(|e| refused(&e.to_string()))?;
                    st.sealed = 0;
                    self.rekeys.fetch_add(1, Ordering::Relaxed);
                }
                st.conn.writer().write_all(chunk)?;
                st.sealed += chunk.len() as u64;
                while st.conn.wants_write() {
                    st.conn.write_tls(&mut *out)?;
                }
            }
            if let Err(e) = (&*tcp).write_all(&out) {
                self.broken.store(true, Ordering::Release);
                return Err(e);
            }
        }
        Ok(())
    }
}
