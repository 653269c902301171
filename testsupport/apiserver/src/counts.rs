//! Requests counted by who made them, verb and resource: the bench reports
//! the operator's API traffic, and the driver's own requests (its simulated
//! agents, its watch) must not count as the operator's. Writes are also
//! counted per object, so a test can bound what one Transfer costs.

use std::collections::BTreeMap;
use std::sync::Mutex;

/// The User-Agent prefix the driver's requests carry; kube-rs sends none
/// of its own, so anything else is the operator.
pub const DRIVER_AGENT: &str = "wirerate-scale";

/// Who made a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Actor {
    /// The operator under test.
    Operator,
    /// The bench's driver (agents, creators, observer).
    Driver,
}

impl Actor {
    /// From the request's User-Agent header.
    pub(crate) fn from_user_agent(ua: Option<&str>) -> Self {
        if ua.is_some_and(|u| u.starts_with(DRIVER_AGENT)) {
            Self::Driver
        } else {
            Self::Operator
        }
    }
}

/// (actor, verb, resource) -> requests.
pub type Tally = BTreeMap<(Actor, &'static str, String), u64>;

/// (actor, resource, `namespace/name`) -> writes (create, update, patch,
/// delete) of that object; a create counts under the name in its body.
pub type ObjectWrites = BTreeMap<(Actor, String, String), u64>;

/// The running tally.
#[derive(Debug, Default)]
pub(crate) struct Counts {
    requests: Mutex<Tally>,
    objects: Mutex<ObjectWrites>,
}

impl Counts {
    /// Counts one request.
    pub(crate) fn add(&self, actor: Actor, verb: &'static str, resource: String) {
        *self
            .requests
            .lock()
            .expect("counts lock")
            .entry((actor, verb, resource))
            .or_default() += 1;
    }

    /// Counts one write of the object `namespace/name` of `resource`.
    pub(crate) fn add_write(&self, actor: Actor, resource: String, object: String) {
        *self
            .objects
            .lock()
            .expect("counts lock")
            .entry((actor, resource, object))
            .or_default() += 1;
    }

    /// A copy of the tally so far.
    pub(crate) fn snapshot(&self) -> Tally {
        self.requests.lock().expect("counts lock").clone()
    }

    /// A copy of the per-object writes so far.
    pub(crate) fn objects(&self) -> ObjectWrites {
        self.objects.lock().expect("counts lock").clone()
    }
}
