//! What a sending process keeps between its sessions to a receiver: the
//! data connections they parked, and the last one's buffers.
//!
//! A data stream whose session ended well is parked (`Frame::Park`) rather
//! than closed, and the next session to the same receiver (or, with
//! `Warm::across_ports`, to another receiver of its host) joins over it
//! after a fresh handshake. That skips the TCP handshake and, where
//! net.ipv4.tcp_slow_start_after_idle is 0, TCP's slow start: on a 150 ms
//! path, about two seconds of every cold session. The receiver closes a
//! parked connection after `PARK_IDLE`; a sender reuses one for a little
//! less, and not once it sees the receiver has closed it. The buffers are
//! kept because faulting in a fresh 512 MiB pool costs this machine about
//! 0.3 s of CPU, which at the start of a warm session halves its rate;
//! they go after `KEEP_WARM` unused too, or a process that stops sending
//! would hold them for good (`expire`).

use crate::net::Conn;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::io::Pools;
use crate::io::spare::Spare;
use crate::wire::PARK_IDLE;

/// How long a parked connection is reused, from its `Parked`: the
/// receiver's timer started half a round trip earlier. The last send's
/// buffers are kept as long, from its end.
pub const KEEP_WARM: Duration = Duration::from_secs(PARK_IDLE.as_secs() - 5);

/// The most connections kept, over all receivers: as many as the
/// optimizer opens for one session, which bounds the descriptors and the
/// receivers' slots an idle sender holds.
pub const MOST_WARM: usize = crate::tuning::STREAMS.max as usize;

/// Which connections a session may reuse: the same receiver (or the same
/// host, `Warm::across_ports`), and the same fixed socket buffer (a buffer
/// once set turns the kernel's autotuning off for good, so a connection
/// cannot change between the two).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarmKey {
    /// The receiver's address as the sender was given it, or its host part
    /// alone.
    pub to: String,
    /// `SocketOpts::buffer`.
    pub buffer: Option<usize>,
    /// `SocketOpts::congestion`: set on a connection, it can be set again,
    /// but left unset it could not go back to the host's default.
    pub congestion: Option<String>,
}

struct Parked {
    key: WarmKey,
    stream: Conn,
    since: Instant,
}

/// What one sending process keeps for its next session, shared by its
/// sends (`SendConfig::warm`).
pub struct Warm {
    parked: Mutex<Vec<Parked>>,
    /// The last send's buffers, for the next one of the same shape.
    spare: Mutex<Spare<Pools>>,
    across_ports: bool,
    sharing_pools: bool,
}

impl Default for Warm {
    fn default() -> Self {
        Self {
            parked: Mutex::default(),
            spare: Mutex::new(Spare::new(KEEP_WARM)),
            across_ports: false,
            sharing_pools: false,
        }
    }
}

impl std::fmt::Debug for Warm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Warm({} parked)", self.len())
    }
}

impl Warm {
    /// Keeps connections for any port of a receiving host, for senders
    /// whose receivers share a `receiver::Lobby` (an agent's, one receiver
    /// per transfer): a connection parked at one receiver carries the
    /// next session to another, whose handshake names its port. A port
    /// whose process has no such receiver refuses the hello, and the
    /// stream connects afresh, one round trip later.
    pub fn across_ports() -> Self {
        Self {
            across_ports: true,
            ..Self::default()
        }
    }

    /// Lets sends that run at once draw their buffers from one pool, of
    /// the shape they share: a lane of a transfer over several pairs runs
    /// two sessions to one receiver at once, each of which faulted in a
    /// pool of its own (on a VM whose host backs memory as it is first
    /// touched, most of the sender's CPU in a tree's first seconds). Its
    /// sends share the lane's link, so one pool's buffers are enough; each
    /// may hold at most three quarters of them (`Pools::shared`), so one
    /// whose streams stall leaves the other some.
    pub fn sharing_pools() -> Self {
        Self {
            sharing_pools: true,
            ..Self::default()
        }
    }

    /// The key of connections to `to` (host:port) with `buffer` and
    /// `congestion`.
    pub fn key(&self, to: &str, buffer: Option<usize>, congestion: Option<String>) -> WarmKey {
        let to = match to.rsplit_once(':') {
            Some((host, _)) if self.across_ports => host,
            _ => to,
        };
        WarmKey {
            to: to.to_owned(),
            buffer,
            congestion,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Parked>> {
        self.parked.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The buffers for a send of `count` blocks of `block_size`: the last
    /// send's when they have that shape (already faulted in), new ones
    /// otherwise. A send running at the same time gets its own, unless
    /// this keeps one pool for all its sends (`sharing_pools`).
    pub(crate) fn take_pools(
        &self,
        block_size: usize,
        count: usize,
    ) -> crate::error::Result<Pools> {
        let fits = |p: &Pools| p.is_shaped(block_size, count);
        // Freed and allocated outside the lock: another send, or the
        // agent's expiry tick, must not wait on 512 MiB being touched.
        // A shared pool is made under it, so that two sends starting at
        // once share it: on normal pages that costs only its mapping (its
        // pages fault in as its sends use them), on huge pages their
        // reservation.
        let (expired, kept) = {
            let mut spare = self.spare();
            let expired = spare.expire(Instant::now());
            if self.sharing_pools {
                let pools = match spare.clone_if(fits) {
                    Some(p) => p,
                    None => Pools::new(block_size, count)?,
                };
                // Kept from now: a pool its sends keep starting on is not
                // idle, though none of them has ended for a while.
                spare.put(pools.clone(), Instant::now());
                (expired, Some(pools.shared()))
            } else {
                (expired, spare.take_if(fits))
            }
        };
        drop(expired);
        match kept {
            Some(p) => Ok(p),
            None => Pools::new(block_size, count),
        }
    }

    /// Keeps a finished send's buffers for the next, for `KEEP_WARM`
    /// (from now: a shared pool's idle time starts with its last send).
    pub(crate) fn keep_pools(&self, pools: Pools) {
        self.spare().put(pools, Instant::now());
    }

    fn spare(&self) -> std::sync::MutexGuard<'_, Spare<Pools>> {
        self.spare.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Closes the connections, and lets go of the buffers, kept longer
    /// than `KEEP_WARM` at `now`. A long-running process calls it now
    /// and then (the agent does every second): nothing else would, once
    /// it stops sending.
    pub fn expire(&self, now: Instant) {
        expire_parked(&mut self.lock(), now);
        let expired = self.spare().expire(now);
        drop(expired);
    }

    /// Keeps `stream`, whose `Parked` arrived at `since` (its reuse is
    /// timed from then), for a session to `key`; the oldest goes when
    /// `MOST_WARM` are kept.
    pub fn put(&self, key: WarmKey, stream: Conn, since: Instant) {
        let mut g = self.lock();
        expire_parked(&mut g, since);
        if g.len() >= MOST_WARM {
            g.remove(0);
        }
        g.push(Parked { key, stream, since });
    }

    /// The most recently parked connection for `key` the receiver has not
    /// closed, if any.
    pub fn take(&self, key: &WarmKey, now: Instant) -> Option<Conn> {
        let mut g = self.lock();
        expire_parked(&mut g, now);
        while let Some(i) = g.iter().rposition(|p| &p.key == key) {
            let p = g.remove(i);
            // A parked connection has nothing to read: readable means the
            // receiver closed it (its idle limit, a restart) or broke the
            // protocol; either way it is dropped.
            if matches!(
                crate::net::wait_readable(&p.stream, Duration::ZERO),
                Ok(false)
            ) {
                return Some(p.stream);
            }
        }
        None
    }

    /// Connections kept now and still reusable at `now`; the others are
    /// closed.
    pub fn len_at(&self, now: Instant) -> usize {
        let mut g = self.lock();
        expire_parked(&mut g, now);
        g.len()
    }

    /// Connections kept now.
    pub fn len(&self) -> usize {
        self.len_at(Instant::now())
    }

    /// Whether none are kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn expire_parked(parked: &mut Vec<Parked>, now: Instant) {
    parked.retain(|p| now.saturating_duration_since(p.since) < KEEP_WARM);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn pair(l: &TcpListener) -> (Conn, Conn) {
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        (c.into(), l.accept().unwrap().0.into())
    }

    fn key(to: &str) -> WarmKey {
        WarmKey {
            to: to.into(),
            buffer: None,
            congestion: None,
        }
    }

    #[test]
    fn takes_the_newest_of_its_key_and_none_expired_or_closed() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let w = Warm::default();
        let t0 = Instant::now();
        let (old, _old_peer) = pair(&l);
        let (closed, closed_peer) = pair(&l);
        let (new, _new_peer) = pair(&l);
        let (other, _other_peer) = pair(&l);
        let old_addr = old.local_addr().unwrap();
        let new_addr = new.local_addr().unwrap();
        w.put(key("a"), old, t0);
        w.put(key("a"), new, t0);
        w.put(key("a"), closed, t0);
        w.put(key("b"), other, t0);
        drop(closed_peer);
        std::thread::sleep(Duration::from_millis(50));
        let now = t0 + Duration::from_secs(1);
        // The closed one is newest, but its receiver has gone.
        assert_eq!(
            w.take(&key("a"), now).unwrap().local_addr().unwrap(),
            new_addr
        );
        assert_eq!(
            w.take(&key("a"), now).unwrap().local_addr().unwrap(),
            old_addr
        );
        assert!(w.take(&key("a"), now).is_none());
        let other_buffer = WarmKey {
            buffer: Some(1 << 20),
            ..key("b")
        };
        assert!(w.take(&other_buffer, now).is_none());
        assert!(w.take(&key("b"), t0 + KEEP_WARM).is_none(), "expired");
        assert!(w.is_empty());
    }

    // Found by the scale-out bench: the two sessions a lane runs at once
    // each faulted in a pool of their own (seven 512 MiB pools for a tree
    // over three pairs), whose first touch was most of the sender's CPU
    // in the tree's first second.
    #[test]
    fn a_lanes_sessions_at_once_draw_on_one_pool() {
        let w = Warm::sharing_pools();
        let a = w.take_pools(4096, 4).unwrap();
        let b = w.take_pools(4096, 4).unwrap();
        let held: Vec<_> = (0..3).map(|_| a.for_len(4096).try_get()).collect();
        assert!(held.iter().all(Option::is_some));
        assert!(
            a.for_len(4096).try_get().is_none(),
            "a session holds three quarters at most"
        );
        let last = b.for_len(4096).try_get();
        assert!(last.is_some());
        assert!(
            b.for_len(4096).try_get().is_none(),
            "the second session has a pool of its own"
        );
        // Not shared by default: a send at the same time gets its own.
        let w = Warm::default();
        let a = w.take_pools(4096, 2).unwrap();
        let b = w.take_pools(4096, 2).unwrap();
        let _held: Vec<_> = (0..2).map(|_| a.for_len(4096).try_get()).collect();
        assert!(b.for_len(4096).try_get().is_some());
        // A shared pool of another shape replaces it.
        let w = Warm::sharing_pools();
        let a = w.take_pools(4096, 2).unwrap();
        let b = w.take_pools(8192, 2).unwrap();
        let _held: Vec<_> = (0..2).map(|_| a.for_len(4096).try_get()).collect();
        assert!(b.for_len(8192).try_get().is_some());
    }

    #[test]
    fn the_buffers_go_after_keep_warm_unused() {
        let w = Warm::default();
        w.keep_pools(Pools::new(4096, 2).unwrap());
        w.expire(Instant::now() + KEEP_WARM / 2);
        assert!(w.spare().take_if(|_| true).is_some(), "kept a while");
        w.keep_pools(Pools::new(4096, 2).unwrap());
        w.expire(Instant::now() + KEEP_WARM);
        assert!(w.spare().take_if(|_| true).is_none(), "let go");
    }

    #[test]
    fn keeps_at_most_most_warm() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let w = Warm::default();
        let now = Instant::now();
        let mut peers = Vec::new();
        for _ in 0..=MOST_WARM {
            let (c, p) = pair(&l);
            peers.push(p);
            w.put(key("a"), c, now);
        }
        assert_eq!(w.len(), MOST_WARM);
    }
}
