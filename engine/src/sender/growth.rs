//! How many data streams a session has: the tuner's choice for the link
//! at the start, and the streams the optimizer adds while the rate still
//! rises, with each stream's TCP_INFO sampled as it runs.

use std::net::Shutdown;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, mpsc};
use std::thread::Scope;
use std::time::{Duration, Instant};

use super::SendConfig;
use super::connect::{Joining, finish_connecting, start_connecting};
use super::shared::{Shared, hold};
use super::streams::{ack_loop, send_loop};
use crate::error::Error;
use crate::io::Pools;
use crate::io::caps::{capabilities, sysctl_number};
use crate::io::sys::set_max_pacing_rate;
use crate::net::{self, Conn, SocketOpts};
use crate::optimizer::{Decision, Optimizer, StreamChange};
use crate::spans::carry;
use crate::tuner::{self, AIM_BPS, Link, StreamChoice};
use crate::wire::SessionId;

/// How long a stream the optimizer adds may take to connect (its TCP
/// handshake): the session waits for it as it ends.
const ADDED_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// How often the data streams' TCP_INFO reaches the observer while a
/// session runs.
const TCP_SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// What the tuner makes of the control connection's handshake round trip
/// and this host's TCP buffer limits, for a run with `cfg.per_link`
/// whose files are `small` or not.
pub(super) fn streams_for_link(
    cfg: &SendConfig,
    (control, small): (&Conn, bool),
    pool: &Pools,
) -> StreamChoice {
    let rtt = net::tcp_stats(control).map_or(Duration::ZERO, |t| {
        tuner::round_trip(t.min_rtt_ms, t.rtt_ms)
    });
    let caps = capabilities();
    let buffer = match cfg.socket.buffer {
        // The kernel grants twice what is asked for (socket(7)), up to
        // twice net.core.wmem_max.
        Some(b) => {
            let core = sysctl_number("net.core.wmem_max").map_or(u64::MAX, |m| m.max(0) as u64);
            (b as u64).min(core).saturating_mul(2)
        }
        None => caps.tcp_wmem_max.min(caps.tcp_rmem_max),
    };
    let most = most_fed(cfg, pool);
    let choice = tuner::choose_streams(
        &Link {
            rtt,
            buffer,
            explicit: cfg.socket.buffer.is_some(),
            aim_bps: aim_bps(cfg),
            most,
        },
        cfg.streams,
    );
    if small {
        tuner::for_small_files(choice, rtt, most)
    } else {
        choice
    }
}

/// The rate the tuner and the optimizer aim at: the cap, else `AIM_BPS`.
pub(super) fn aim_bps(cfg: &SendConfig) -> f64 {
    cfg.max_rate.map_or(AIM_BPS, |r| r as f64 * 8.0)
}

/// The streams the sender's buffer feeds: two blocks each, and the two
/// the pool keeps for the reader.
pub(super) fn most_fed(cfg: &SendConfig, pool: &Pools) -> u16 {
    let blocks = pool.large_bytes() / cfg.block_size.max(1);
    (blocks.saturating_sub(2) / 2).min(u64::from(u16::MAX)) as u16
}

/// Each stream's share of the sender's `buffer` bytes when there are
/// `streams`.
pub(super) fn per_stream_bytes(cfg: &SendConfig, buffer: u64, streams: u16) -> u64 {
    (buffer / u64::from(streams.max(1))).max(2 * cfg.block_size)
}

/// What the optimizer did in a session.
#[derive(Debug, Default)]
pub(super) struct Tuned {
    pub(super) changes: Vec<StreamChange>,
    /// Why it stopped adding, if it did before the session ended.
    pub(super) held: Option<String>,
}

/// What a session whose streams the tuner chose needs to add more.
pub(super) struct Grow<'a> {
    pub(super) cfg: &'a SendConfig,
    pub(super) opts: &'a SocketOpts,
    pub(super) session: SessionId,
    /// Counts the streams that joined over parked connections.
    pub(super) reused: &'a AtomicU64,
    /// The sender's buffer, which the streams share.
    pub(super) buffer: u64,
    pub(super) optimizer: Optimizer,
}

impl Grow<'_> {
    /// Connects `more` streams, all at once (fewer where the session's
    /// stream counters run out), and starts each that connected as the
    /// scheduler's next stream; returns the streams alive then. The
    /// buffer's share and a cap's pacing are spread over those alive.
    fn add<'scope>(
        &self,
        s: &'scope Scope<'scope, '_>,
        shared: &'scope Shared,
        open: &Mutex<Vec<Option<Conn>>>,
        more: u16,
    ) -> u16 {
        let from = hold(open).len() as u16;
        let to = from
            .saturating_add(more)
            .min(shared.per_stream.len() as u16);
        let joining = Joining {
            cfg: self.cfg,
            opts: self.opts,
            session: self.session,
            timeout: ADDED_CONNECT_TIMEOUT,
            stop: &shared.stop,
            reused: self.reused,
        };
        let connected =
            std::thread::scope(|c| finish_connecting(start_connecting(c, &joining, from..to)));
        let mut open = hold(open);
        let mut g = shared.lock();
        if shared.stopped() {
            for st in connected.iter().flatten() {
                let _ = st.shutdown(Shutdown::Both);
            }
            return g.sched.alive_streams() as u16;
        }
        let joining = connected.iter().filter(|c| c.is_ok()).count();
        let alive = (g.sched.alive_streams() + joining).max(1) as u16;
        let per = per_stream_bytes(self.cfg, self.buffer, alive);
        for c in connected {
            // Failed ones too: the scheduler's indices stay those the
            // streams joined with, and the counters' and sockets'.
            let i = g.sched.add_stream(per);
            let clones = c.and_then(|st| match (st.try_clone(), st.try_clone()) {
                (Ok(w), Ok(r)) => Ok((st, w, r)),
                (Err(e), _) | (_, Err(e)) => Err(Error::net("cloning a data stream", e)),
            });
            match clones {
                Ok((st, w, r)) => {
                    s.spawn(carry(move || send_loop(shared, i, w)));
                    g.acks_running += 1;
                    s.spawn(carry(move || ack_loop(shared, i, r)));
                    open.push(Some(st));
                }
                Err(e) => {
                    tracing::warn!(stream = i, error = %e, "an added data stream could not connect");
                    g.sched.handle_stream_failed(i);
                    open.push(None);
                }
            }
        }
        let alive = g.sched.alive_streams() as u16;
        drop(g);
        // A capped transfer's rate is shared by those alive now.
        if let Some(rate) = self.cfg.max_rate {
            let each = (rate / u64::from(alive.max(1))).max(1);
            for st in open.iter().flatten() {
                let _ = set_max_pacing_rate(st, each);
            }
        }
        shared.cv.notify_all();
        alive
    }
}

/// Tells the observer each data stream's TCP_INFO every
/// `TCP_SAMPLE_EVERY` until `stop` closes (and the session samples them
/// once more as it ends), so that a transfer's metrics show its paths
/// while it runs; and, where the tuner chose the streams, lets the
/// optimizer add more while that raises the rate.
pub(super) fn sample_loop<'scope>(
    s: &'scope Scope<'scope, '_>,
    shared: &'scope Shared,
    open: &Mutex<Vec<Option<Conn>>>,
    mut grow: Option<Grow<'_>>,
    stop: &mpsc::Receiver<()>,
) -> Tuned {
    let mut tuned = Tuned::default();
    let mut next_sample = Instant::now() + TCP_SAMPLE_EVERY;
    loop {
        // Woken for the next sample, or sooner when the optimizer's
        // settling or window ends (a second's granularity would add up
        // to a second to each of its steps).
        let wake = grow
            .as_ref()
            .and_then(|g| g.optimizer.poll_timeout())
            .map_or(next_sample, |t| t.min(next_sample));
        let wait = wake.saturating_duration_since(Instant::now());
        if let Err(mpsc::RecvTimeoutError::Disconnected) | Ok(()) = stop.recv_timeout(wait) {
            return tuned;
        }
        if Instant::now() >= next_sample {
            next_sample += TCP_SAMPLE_EVERY;
            for (i, st) in hold(open).iter().enumerate() {
                if let Some(t) = st.as_ref().and_then(net::tcp_stats) {
                    shared.observer.tcp_sampled(i as u16, &t);
                }
            }
        }
        let Some(g) = grow.as_mut() else { continue };
        // Once every block is out, the rate falls for want of data, not
        // of streams.
        if shared.lock().sched.nothing_left_to_send() {
            grow = None;
            continue;
        }
        g.optimizer
            .handle_progress(Instant::now(), shared.acked_bytes.load(Ordering::Relaxed));
        while let Some(d) = g.optimizer.poll() {
            match d {
                Decision::Add(mut change) => {
                    let alive = g.add(s, shared, open, change.to - change.from);
                    if alive > change.from {
                        // What opened, which the reason's "trying" may
                        // exceed when some could not connect.
                        change.to = alive;
                        tracing::info!(
                            from = change.from,
                            to = change.to,
                            "added data streams: {}",
                            change.reason
                        );
                        shared.observer.streams_changed(&change);
                        tuned.changes.push(change);
                    }
                    if shared.stopped() {
                        return tuned;
                    }
                    g.optimizer.handle_added(Instant::now(), alive);
                }
                Decision::Hold(why) => {
                    tracing::info!("data streams held: {why}");
                    tuned.held = Some(why);
                }
            }
        }
        if g.optimizer.is_done() {
            grow = None;
        }
    }
}
