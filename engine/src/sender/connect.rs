//! Connecting a session's data streams and authenticating each
//! connection, over a connection an earlier session parked where there
//! is one.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::{Scope, ScopedJoinHandle};
use std::time::{Duration, Instant};

use super::SendConfig;
use super::warm::{Warm, WarmKey};
use crate::error::{Error, Result};
use crate::io::sys::set_max_pacing_rate;
use crate::net::{self, Conn, SocketOpts, auth};
use crate::spans::carry;
use crate::wire::{Purpose, SessionId};

/// A data stream the receiver turns away as busy (too many handshakes
/// from this address at once) is tried again this many times.
const STREAM_CONNECT_ATTEMPTS: u32 = 4;

/// How long a parked connection's handshake may take before the stream
/// connects afresh instead: a receiver that vanished without a word would
/// otherwise hold the stream for the whole `net::HANDSHAKE_TIMEOUT`.
const REUSE_HANDSHAKE: Duration = Duration::from_secs(3);

/// Connects to the receiver within `timeout` and authenticates for
/// `purpose`, the handshake bounded in time as a whole; returns the stream
/// and the round trip.
pub(super) fn connect(
    cfg: &SendConfig,
    opts: &SocketOpts,
    purpose: Purpose,
    timeout: Duration,
) -> Result<(Conn, Duration)> {
    authenticate(
        cfg,
        net::connect(&cfg.to, opts, timeout)?.into(),
        purpose,
        net::HANDSHAKE_TIMEOUT,
    )
}

/// Authenticates a connected `stream` for `purpose`, the handshake
/// bounded in time as a whole; returns it and the round trip.
pub(super) fn authenticate(
    cfg: &SendConfig,
    mut stream: Conn,
    purpose: Purpose,
    within: Duration,
) -> Result<(Conn, Duration)> {
    let port = net::port_of(&cfg.to);
    let rtt = net::handshake(&mut stream, within, |d| {
        auth::client(d, &cfg.token, purpose, port, cfg.encrypt)
    })?;
    cfg.observer
        .connection_agreed(net::tls::Side::Client, stream.in_effect());
    Ok((stream, rtt))
}

/// What connecting a session's data streams takes.
pub(super) struct Joining<'a> {
    pub(super) cfg: &'a SendConfig,
    pub(super) opts: &'a SocketOpts,
    pub(super) session: SessionId,
    /// For each TCP handshake.
    pub(super) timeout: Duration,
    /// Set once the session is over: a busy receiver is not tried again.
    pub(super) stop: &'a AtomicBool,
    /// Counts the streams that joined over parked connections.
    pub(super) reused: &'a AtomicU64,
}

/// Connects and authenticates data stream `i`, over a connection an
/// earlier session parked where there is one. A receiver that turns a new
/// one away as busy (more handshakes from this address at once than it
/// takes) is tried again shortly, as the others finish theirs, unless the
/// session is over.
fn connect_stream(j: &Joining<'_>, i: u16) -> Result<Conn> {
    let Joining { cfg, opts, .. } = *j;
    let purpose = Purpose::Join {
        session: j.session,
        stream: i,
    };
    if let Some(st) = reuse(cfg, opts, purpose) {
        j.reused.fetch_add(1, Ordering::Relaxed);
        return Ok(st);
    }
    let mut attempt = 1;
    loop {
        match connect(cfg, opts, purpose, j.timeout) {
            Ok((st, _)) => return Ok(st),
            Err(Error::Remote {
                retryable: true, ..
            }) if attempt < STREAM_CONNECT_ATTEMPTS && !j.stop.load(Ordering::SeqCst) => {
                std::thread::sleep(Duration::from_millis(100) * attempt);
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Which parked connections of `warm` a data stream with `opts` may reuse.
pub(super) fn warm_key(cfg: &SendConfig, warm: &Warm, opts: &SocketOpts) -> WarmKey {
    warm.key(&cfg.to, opts.buffer, opts.congestion.clone())
}

/// A connection an earlier session to this receiver parked, set up for
/// `opts` and authenticated afresh for `purpose`; `None` when none is kept
/// or the one taken fails, and the stream connects as a new one.
pub(super) fn reuse(cfg: &SendConfig, opts: &SocketOpts, purpose: Purpose) -> Option<Conn> {
    let warm = cfg.warm.as_ref()?;
    let st = warm.take(&warm_key(cfg, warm, opts), Instant::now())?;
    // This session's pacing, or none: the last one's may differ.
    let rearmed = net::apply(&st, opts).and_then(|()| {
        set_max_pacing_rate(&st, opts.pacing.unwrap_or(u64::MAX))
            .map_err(|e| Error::net("setting SO_MAX_PACING_RATE", e))
    });
    match rearmed.and_then(|()| authenticate(cfg, st, purpose, REUSE_HANDSHAKE)) {
        Ok((st, _)) => Some(st),
        Err(e) => {
            tracing::debug!(error = %e, "a parked connection could not be reused; connecting afresh");
            None
        }
    }
}

/// Starts connecting data streams `ids` of a session, all at once, each on
/// a thread of `scope`, while the caller goes on; `finish_connecting`
/// waits for them.
pub(super) fn start_connecting<'scope>(
    scope: &'scope Scope<'scope, '_>,
    j: &'scope Joining<'scope>,
    ids: Range<u16>,
) -> Vec<ScopedJoinHandle<'scope, Result<Conn>>> {
    ids.map(|i| scope.spawn(carry(move || connect_stream(j, i))))
        .collect()
}

/// Each stream `start_connecting` started, connected or why not, in order.
pub(super) fn finish_connecting(
    handles: Vec<ScopedJoinHandle<'_, Result<Conn>>>,
) -> Vec<Result<Conn>> {
    handles
        .into_iter()
        .map(|h| {
            h.join()
                .unwrap_or_else(|_| Err(Error::Internal("a connect thread panicked".into())))
        })
        .collect()
}
