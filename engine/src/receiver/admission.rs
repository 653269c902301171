//! Which connections the receiver takes on before anyone has
//! authenticated.
//!
//! - At most `max_connections` in all.
//! - At most `per_address` still in their handshake from any one source
//!   address, so that one host cannot hold every handshake.
//! - At most half the slots in their handshake in all (but always room
//!   for one sender's control connection and every data stream it may
//!   open), so that a flood from many addresses cannot fill the slots
//!   authenticated sessions need.
//! - When the handshakes' share or every slot is taken, a newcomer cuts a
//!   handshake rather than being refused: the oldest one of the address
//!   that holds the most handshakes, if that address holds more than the
//!   newcomer's. So a flood from many addresses that reopens whatever is
//!   cut only takes slots from itself, while a sender's few connections
//!   get in, and are never cut for their own siblings. Only when no
//!   address holds more than the newcomer's, or every slot holds an
//!   authenticated connection, is a newcomer told the receiver is busy.
//!
//! A connection refused is told why (an `Error` frame) and closed by the
//! accept loop itself, without a thread of its own.
#![forbid(unsafe_code)]

use crate::net::Conn;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{IpAddr, Shutdown};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Why a connection was not taken on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Every connection slot holds an authenticated connection.
    Connections(usize),
    /// Too many handshakes in progress from this address.
    Handshakes(IpAddr, usize),
    /// The handshakes' share is taken, by addresses that hold no more than
    /// this one's, or that only just started.
    Crowded(usize),
}

impl Refusal {
    /// What the peer is told.
    pub(crate) fn message(&self) -> String {
        match self {
            Self::Connections(max) => format!(
                "receiver busy: too many connections ({max} open, --max-connections); retry later"
            ),
            Self::Handshakes(ip, max) => format!(
                "receiver busy: too many unauthenticated connections from {ip} ({max} at most); retry later"
            ),
            Self::Crowded(max) => format!(
                "receiver busy: {max} connections are in their handshake, the most it takes at once; retry later"
            ),
        }
    }

    /// The `reason` label of `connections_rejected_total`.
    pub(crate) fn metric_label(&self) -> &'static str {
        match self {
            Self::Connections(_) => "too_many_connections",
            Self::Handshakes(..) | Self::Crowded(_) => "too_many_handshakes",
        }
    }
}

/// One sender's connections: its control connection and the most data
/// streams a session may join, which it may open all at once.
const ONE_SENDER: usize = crate::tuning::STREAMS.max as usize + 1;

/// The `reason` label of `connections_rejected_total` for a handshake cut
/// to make room for a newer connection.
pub(crate) const EVICTED: &str = "handshake_evicted";

/// The source a limit applies to: an IPv4 address, or an IPv6 /64 (one
/// host is commonly given a whole /64, and could otherwise spread its
/// connections over as many addresses as it likes).
fn source(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !u128::from(u64::MAX)).into()),
        },
        v4 => v4,
    }
}

/// A connection in its handshake: where from, since when, and a handle
/// to cut it.
#[derive(Debug)]
struct Handshake {
    ip: IpAddr,
    since: Instant,
    cut: Option<Conn>,
}

/// How long a handshake is spared when its address holds no other: when
/// many addresses hold one each (a flood from many IPv6 /64s), counts
/// cannot tell a sender from the flood, and a sender's handshake takes
/// a round trip or two.
const LONE_GRACE: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
struct State {
    connections: usize,
    handshaking: HashMap<IpAddr, usize>,
    /// Handshakes in progress by ticket number: the first is the oldest.
    queue: BTreeMap<u64, Handshake>,
    /// Tickets whose handshake was cut: their slots are already given back.
    evicted: HashSet<u64>,
    next: u64,
}

/// The receiver's connection slots.
#[derive(Debug)]
pub(crate) struct Admission {
    max_connections: usize,
    per_address: usize,
    max_handshakes: usize,
    state: Mutex<State>,
}

/// One admitted connection; its slots are given back on drop.
#[derive(Debug)]
pub(crate) struct Ticket {
    admission: Arc<Admission>,
    id: u64,
    ip: IpAddr,
    handshaking: bool,
}

/// An admitted connection, and whether an older handshake was cut for it.
#[derive(Debug)]
pub(crate) struct Admitted {
    pub(crate) ticket: Ticket,
    pub(crate) evicted: bool,
}

impl Admission {
    pub(crate) fn new(max_connections: usize, per_address: usize) -> Self {
        let max_connections = max_connections.max(1);
        Self {
            max_connections,
            per_address: per_address.max(1),
            max_handshakes: (max_connections / 2).max(ONE_SENDER).min(max_connections),
            state: Mutex::default(),
        }
    }

    /// With at most `n` connections in their handshake at once (a relay's
    /// leads open one connection a job, so the share a sender's burst of
    /// data streams needs does not apply).
    pub(crate) fn with_handshakes(mut self, n: usize) -> Self {
        self.max_handshakes = n.clamp(1, self.max_connections);
        self
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes on a connection from `ip` at `now`, in its handshake until
    /// the ticket says it authenticated; `stream` is how it is cut should
    /// a newer connection need its place (none: it is never cut).
    pub(crate) fn admit(
        self: &Arc<Self>,
        ip: IpAddr,
        stream: Option<&Conn>,
        now: Instant,
    ) -> Result<Admitted, Refusal> {
        let ip = source(ip);
        // A connection that could not be cut would hold its place past
        // the rules: out of descriptors, it is better refused.
        let cut = match stream.map(Conn::try_clone) {
            Some(Ok(s)) => Some(s),
            Some(Err(_)) => return Err(Refusal::Connections(self.max_connections)),
            None => None,
        };
        let mut g = self.lock();
        if g.handshaking.get(&ip).copied().unwrap_or(0) >= self.per_address {
            return Err(Refusal::Handshakes(ip, self.per_address));
        }
        let mut evicted = false;
        if g.queue.len() >= self.max_handshakes || g.connections >= self.max_connections {
            evicted = Self::evict_for(&mut g, ip, now);
            if !evicted {
                return Err(if g.connections >= self.max_connections {
                    Refusal::Connections(self.max_connections)
                } else {
                    Refusal::Crowded(self.max_handshakes)
                });
            }
        }
        *g.handshaking.entry(ip).or_default() += 1;
        g.connections += 1;
        let id = g.next;
        g.next += 1;
        g.queue.insert(
            id,
            Handshake {
                ip,
                since: now,
                cut,
            },
        );
        Ok(Admitted {
            ticket: Ticket {
                admission: Arc::clone(self),
                id,
                ip,
                handshaking: true,
            },
            evicted,
        })
    }

    /// Cuts a handshake for a newcomer from `ip` (see the module's
    /// rules) and gives its slots back at once: its thread ends on the
    /// cut, and its ticket then gives back nothing. False if none may be.
    fn evict_for(g: &mut State, ip: IpAddr, now: Instant) -> bool {
        let mine = g.handshaking.get(&ip).copied().unwrap_or(0);
        let Some(most) = g.handshaking.values().copied().max() else {
            return false;
        };
        if most <= mine {
            return false;
        }
        // The oldest handshake of the addresses that hold the most; one
        // alone at its address only once it had its grace.
        let Some(id) = g
            .queue
            .iter()
            .find(|(_, h)| {
                g.handshaking.get(&h.ip) == Some(&most)
                    && (most > 1 || now.saturating_duration_since(h.since) >= LONE_GRACE)
            })
            .map(|(id, _)| *id)
        else {
            return false;
        };
        let h = g.queue.remove(&id).expect("found above");
        if let Some(s) = &h.cut {
            let _ = s.shutdown(Shutdown::Both);
        }
        Self::end_handshake(g, h.ip);
        g.connections -= 1;
        g.evicted.insert(id);
        true
    }

    /// Connections open now.
    pub(crate) fn connections(&self) -> usize {
        self.lock().connections
    }

    /// Connections in their handshake now.
    #[cfg(test)]
    fn handshakes(&self) -> usize {
        self.lock().queue.len()
    }

    fn end_handshake(g: &mut State, ip: IpAddr) {
        if let Some(n) = g.handshaking.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                g.handshaking.remove(&ip);
            }
        }
    }
}

impl Ticket {
    /// The peer authenticated: its address may start another handshake,
    /// and it is never cut for a newer connection.
    pub(crate) fn authenticated(&mut self) {
        if std::mem::replace(&mut self.handshaking, false) {
            let mut g = self.admission.lock();
            if g.queue.remove(&self.id).is_some() {
                Admission::end_handshake(&mut g, self.ip);
            }
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut g = self.admission.lock();
        if g.evicted.remove(&self.id) {
            return;
        }
        g.connections -= 1;
        if self.handshaking && g.queue.remove(&self.id).is_some() {
            Admission::end_handshake(&mut g, self.ip);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    #[test]
    fn one_address_cannot_hold_more_than_its_share_of_handshakes() {
        let a = Arc::new(Admission::new(100, 2));
        let t1 = a.admit(ip(1), None, Instant::now()).unwrap().ticket;
        let _t2 = a.admit(ip(1), None, Instant::now()).unwrap().ticket;
        assert_eq!(
            a.admit(ip(1), None, Instant::now()).unwrap_err(),
            Refusal::Handshakes(ip(1), 2)
        );
        let _other = a
            .admit(ip(2), None, Instant::now())
            .expect("another address is not affected");
        drop(t1);
        let _t3 = a
            .admit(ip(1), None, Instant::now())
            .expect("a finished handshake frees its place");
    }

    #[test]
    fn an_authenticated_connection_no_longer_counts_as_a_handshake() {
        let a = Arc::new(Admission::new(100, 1));
        let mut t = a.admit(ip(1), None, Instant::now()).unwrap().ticket;
        t.authenticated();
        t.authenticated();
        let _u = a
            .admit(ip(1), None, Instant::now())
            .expect("the address may handshake again");
        assert_eq!(a.connections(), 2);
        drop(t);
        assert_eq!(a.connections(), 1);
    }

    #[test]
    fn an_ipv6_host_counts_as_its_slash_64() {
        let a = Arc::new(Admission::new(100, 2));
        let v6 = |last: u16| IpAddr::from([0x2001, 0xdb8, 0, 1, 0, 0, 0, last]);
        let _t1 = a.admit(v6(1), None, Instant::now()).unwrap();
        let _t2 = a.admit(v6(2), None, Instant::now()).unwrap();
        assert!(
            matches!(
                a.admit(v6(3), None, Instant::now()),
                Err(Refusal::Handshakes(..))
            ),
            "another address of the same /64 is the same source"
        );
        let other = IpAddr::from([0x2001, 0xdb8, 0, 2, 0, 0, 0, 1]);
        assert!(
            a.admit(other, None, Instant::now()).is_ok(),
            "another /64 is not"
        );
    }

    #[test]
    fn the_connection_cap_holds_for_authenticated_connections() {
        let a = Arc::new(Admission::new(3, 10));
        let held: Vec<_> = (1..=3)
            .map(|i| {
                let mut t = a.admit(ip(i), None, Instant::now()).unwrap().ticket;
                t.authenticated();
                t
            })
            .collect();
        let refusal = a.admit(ip(9), None, Instant::now()).unwrap_err();
        assert_eq!(refusal, Refusal::Connections(3));
        assert!(
            refusal.message().starts_with("receiver busy"),
            "{}",
            refusal.message()
        );
        drop(held);
        assert_eq!(a.connections(), 0);
        assert!(a.lock().handshaking.is_empty(), "nothing is left behind");
    }

    // A flood from many addresses, each under its own cap, that reopens
    // what the handshake deadline cuts, held every slot: a sender got
    // "receiver busy" for its whole --retry-for.
    #[test]
    fn a_flood_of_handshakes_gives_way_to_a_newcomers_few() {
        let a = Arc::new(Admission::new(16, 100));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mut flood = Vec::new();
        for i in 0..16 {
            let client = std::net::TcpStream::connect(addr).unwrap();
            let server_side = Conn::from(listener.accept().unwrap().0);
            let t = a
                .admit(ip(10 + i / 4), Some(&server_side), Instant::now())
                .unwrap();
            assert!(!t.evicted);
            flood.push((client, server_side, t.ticket));
        }
        // Every slot is a handshake: a newcomer cuts the oldest one of an
        // address that holds more than its own.
        let sender = ip(50);
        let control = a.admit(sender, None, Instant::now()).unwrap();
        assert!(control.evicted);
        assert_eq!(a.connections(), 16);
        let mut oldest = &flood[0].0;
        let mut byte = [0u8; 1];
        assert_eq!(
            std::io::Read::read(&mut oldest, &mut byte).unwrap(),
            0,
            "the oldest handshake was cut"
        );
        // Its ticket, dropped when its thread ends, gives back nothing twice.
        let (_, _, cut) = flood.remove(0);
        drop(cut);
        assert_eq!(a.connections(), 16);
        let stream = a.admit(sender, None, Instant::now()).unwrap();
        assert!(stream.evicted);
        // The flood's newcomers cut each other, never the sender's: its
        // address holds no more than theirs.
        let mut cuts = 0;
        for k in 0..40 {
            // An address that holds as many as any waits its turn.
            if let Ok(t) = a.admit(ip(10 + k % 4), None, Instant::now()) {
                assert!(t.evicted, "every slot is taken");
                cuts += 1;
                flood.push((
                    std::net::TcpStream::connect(addr).unwrap(),
                    listener.accept().unwrap().0.into(),
                    t.ticket,
                ));
            }
            assert_eq!(a.lock().handshaking.get(&sender), Some(&2));
            assert_eq!(a.connections(), 16);
        }
        assert!(cuts >= 10, "the flood cut only {cuts} of its own");
        // A newcomer whose own address holds the most is refused, never
        // cut for its siblings.
        let most = (10..14).max_by_key(|i| a.lock().handshaking.get(&ip(*i)).copied());
        assert!(a.admit(ip(most.unwrap()), None, Instant::now()).is_err());
        // Authenticated, its connections are never cut.
        let (mut control, mut stream) = (control.ticket, stream.ticket);
        control.authenticated();
        stream.authenticated();
        assert_eq!(a.handshakes(), 14);
        drop((control, stream));
        drop(flood);
        assert_eq!(a.connections(), 0);
        assert!(a.lock().evicted.is_empty(), "every cut ticket was dropped");
    }

    // A flood from as many addresses as there are handshake places (an
    // IPv6 /48 holds 65,536 /64s), one handshake each: counts cannot tell
    // the sender from the flood, so a handshake alone at its address is
    // spared for its first second.
    #[test]
    fn a_lone_handshake_is_spared_its_first_second() {
        let a = Arc::new(Admission::new(4, 100));
        let t0 = Instant::now();
        let flood: Vec<_> = (0..3)
            .map(|i| a.admit(ip(10 + i), None, t0).unwrap().ticket)
            .collect();
        let sender = a.admit(ip(50), None, t0).unwrap().ticket;
        // A fifth address, at once: nobody may be cut yet.
        let early = a.admit(ip(60), None, t0 + Duration::from_millis(500));
        assert_eq!(early.unwrap_err(), Refusal::Connections(4));
        // A second on, the oldest (the flood's first) gives way; the
        // sender, as young as it, would have been next.
        let late = a.admit(ip(60), None, t0 + LONE_GRACE).unwrap();
        assert!(late.evicted);
        assert_eq!(a.lock().handshaking.get(&ip(10)), None);
        assert_eq!(a.lock().handshaking.get(&ip(50)), Some(&1));
        drop((flood, sender, late));
        assert_eq!(a.connections(), 0);
    }

    #[test]
    fn a_crowded_refusal_says_what_is_full() {
        let a = Arc::new(Admission::new(1000, 100));
        assert_eq!(a.max_handshakes, 500);
        let r = Refusal::Crowded(500);
        assert_eq!(
            r.message(),
            "receiver busy: 500 connections are in their handshake, the most it takes at once; retry later"
        );
        assert_eq!(r.metric_label(), "too_many_handshakes");
        // Small caps leave room for one whole sender.
        assert_eq!(Admission::new(16, 100).max_handshakes, 16);
        assert_eq!(Admission::new(600, 100).max_handshakes, 300);
    }
}
