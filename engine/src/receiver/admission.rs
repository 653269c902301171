//! Which connections the receiver takes on before anyone has
//! authenticated: at most `max_connections` in all, and at most
//! `per_address` still in their handshake from any one source address, so
//! that one host that opens connections and never authenticates cannot
//! crowd out the senders that do. A connection over either limit is told
//! why (an `Error` frame) and closed by the accept loop itself, without a
//! thread of its own.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

/// Why a connection was not taken on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Every connection slot is taken.
    Connections(usize),
    /// Too many handshakes in progress from this address.
    Handshakes(IpAddr, usize),
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
        }
    }

    /// The `reason` label of `connections_rejected_total`.
    pub(crate) fn metric_label(&self) -> &'static str {
        match self {
            Self::Connections(_) => "too_many_connections",
            Self::Handshakes(..) => "too_many_handshakes",
        }
    }
}

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

#[derive(Debug, Default)]
struct State {
    connections: usize,
    handshaking: HashMap<IpAddr, usize>,
}

/// The receiver's connection slots.
#[derive(Debug)]
pub(crate) struct Admission {
    max_connections: usize,
    per_address: usize,
    state: Mutex<State>,
}

/// One admitted connection; its slots are given back on drop.
#[derive(Debug)]
pub(crate) struct Ticket {
    admission: Arc<Admission>,
    ip: IpAddr,
    handshaking: bool,
}

impl Admission {
    pub(crate) fn new(max_connections: usize, per_address: usize) -> Self {
        Self {
            max_connections: max_connections.max(1),
            per_address: per_address.max(1),
            state: Mutex::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes on a connection from `ip`, in its handshake until the ticket
    /// says it authenticated.
    pub(crate) fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Ticket, Refusal> {
        let ip = source(ip);
        let mut g = self.lock();
        if g.connections >= self.max_connections {
            return Err(Refusal::Connections(self.max_connections));
        }
        let n = g.handshaking.entry(ip).or_default();
        if *n >= self.per_address {
            return Err(Refusal::Handshakes(ip, self.per_address));
        }
        *n += 1;
        g.connections += 1;
        Ok(Ticket {
            admission: Arc::clone(self),
            ip,
            handshaking: true,
        })
    }

    /// Connections open now.
    pub(crate) fn connections(&self) -> usize {
        self.lock().connections
    }

    fn end_handshake(&self, g: &mut State, ip: IpAddr) {
        if let Some(n) = g.handshaking.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                g.handshaking.remove(&ip);
            }
        }
    }
}

impl Ticket {
    /// The peer authenticated: its address may start another handshake.
    pub(crate) fn authenticated(&mut self) {
        if std::mem::replace(&mut self.handshaking, false) {
            let mut g = self.admission.lock();
            self.admission.end_handshake(&mut g, self.ip);
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut g = self.admission.lock();
        g.connections -= 1;
        if self.handshaking {
            self.admission.end_handshake(&mut g, self.ip);
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
        let t1 = a.admit(ip(1)).unwrap();
        let _t2 = a.admit(ip(1)).unwrap();
        assert_eq!(a.admit(ip(1)).unwrap_err(), Refusal::Handshakes(ip(1), 2));
        let _other = a.admit(ip(2)).expect("another address is not affected");
        drop(t1);
        let _t3 = a
            .admit(ip(1))
            .expect("a finished handshake frees its place");
    }

    #[test]
    fn an_authenticated_connection_no_longer_counts_as_a_handshake() {
        let a = Arc::new(Admission::new(100, 1));
        let mut t = a.admit(ip(1)).unwrap();
        t.authenticated();
        t.authenticated();
        let _u = a.admit(ip(1)).expect("the address may handshake again");
        assert_eq!(a.connections(), 2);
        drop(t);
        assert_eq!(a.connections(), 1);
    }

    #[test]
    fn an_ipv6_host_counts_as_its_slash_64() {
        let a = Arc::new(Admission::new(100, 2));
        let v6 = |last: u16| IpAddr::from([0x2001, 0xdb8, 0, 1, 0, 0, 0, last]);
        let _t1 = a.admit(v6(1)).unwrap();
        let _t2 = a.admit(v6(2)).unwrap();
        assert!(
            matches!(a.admit(v6(3)), Err(Refusal::Handshakes(..))),
            "another address of the same /64 is the same source"
        );
        let other = IpAddr::from([0x2001, 0xdb8, 0, 2, 0, 0, 0, 1]);
        assert!(a.admit(other).is_ok(), "another /64 is not");
    }

    #[test]
    fn the_connection_cap_holds_for_every_address() {
        let a = Arc::new(Admission::new(3, 10));
        let held: Vec<_> = (1..=3).map(|i| a.admit(ip(i)).unwrap()).collect();
        let refusal = a.admit(ip(9)).unwrap_err();
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
}
