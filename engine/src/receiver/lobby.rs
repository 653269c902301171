//! Receivers of one process that hand each other parked connections.
//!
//! The in-cluster agent runs a receiver per transfer, each on its own port
//! with its own token and root, stopped when the transfer ends. A data
//! connection a sender parked at one of them would die with it, and the
//! next transfer between the same two agents would start cold. Receivers
//! that share a `Lobby` keep what they parked when they stop, and a parked
//! connection whose next `Hello` names another port is handed to the
//! receiver on that port, which authenticates it with its own token as if
//! it had just connected. A parked connection carries no authority of its
//! own: what it reaches it reaches with the token of the receiver it goes
//! to. What it costs is time: a stopped receiver's parked connections hold
//! a thread each (and a connection slot of the receiver they wait at) for
//! up to `PARK_IDLE` after their transfer ended.

use std::net::IpAddr;
use std::sync::{Arc, Mutex, Weak};

use super::{Shared, lock};

/// What a parked connection is handed to (see the module comment). Share
/// one through `ServeConfig::lobby`.
#[derive(Default)]
pub struct Lobby {
    /// Every receiver that joined, the gone ones until the next joins: a
    /// stopped one is held while its parked connections' threads wait
    /// there (until they are handed over).
    receivers: Mutex<Vec<Weak<Shared>>>,
}

impl std::fmt::Debug for Lobby {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Lobby({} receivers held)", self.held())
    }
}

impl Lobby {
    /// Adds a receiver just bound; drops the entries of those gone.
    pub(crate) fn join(&self, shared: &Arc<Shared>) {
        let mut r = lock(&self.receivers);
        r.retain(|w| w.strong_count() > 0);
        r.push(Arc::downgrade(shared));
    }

    /// Receivers still held: running, or stopped with connections parked
    /// at them still waiting (and so their state, buffers included).
    pub fn held(&self) -> usize {
        lock(&self.receivers)
            .iter()
            .filter(|w| w.strong_count() > 0)
            .count()
    }

    /// The running receiver on `port` that takes connections to `local`
    /// (the address the parked connection arrived at), if any.
    pub(crate) fn running_on(&self, local: IpAddr, port: u16) -> Option<Arc<Shared>> {
        lock(&self.receivers)
            .iter()
            .filter_map(Weak::upgrade)
            .find(|s| {
                s.addr.port() == port
                    && (s.addr.ip().is_unspecified() || s.addr.ip() == local)
                    && !s.stopped()
            })
    }
}
