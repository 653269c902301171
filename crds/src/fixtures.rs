//! Builders of DtnPools and Transfers for tests: the operator's, the
//! agent's and e2e's (feature `test-fixtures`).
//!
//! A test names what matters to it; every other field is what a user's
//! minimal manifest gets once the API server has applied the schema's
//! defaults, because the builders start from such a manifest. A default
//! that changes in the types changes here with it.

use crate::transfer::{Destination, Source};
use crate::{DtnPool, DtnPoolSpec, Transfer, TransferSpec, TransferStatus, Tuning};

/// The image a built pool runs unless told otherwise.
pub const TEST_IMAGE: &str = "wirerate-agent:test";

/// A DtnPool under construction.
#[derive(Debug, Clone)]
pub struct PoolBuilder(DtnPool);

impl PoolBuilder {
    /// Pool `name` of [`TEST_IMAGE`] agents, with one hostPath volume
    /// mounted at `root` and that root allowed; no namespace.
    pub fn new(name: &str, root: &str) -> Self {
        let spec: DtnPoolSpec = serde_json::from_value(serde_json::json!({
            "image": TEST_IMAGE,
            "volumes": [{"name": "data", "mountPath": root, "hostPath": root}],
            "allowedRoots": [root],
        }))
        .expect("a minimal pool spec deserializes");
        Self(DtnPool::new(name, spec))
    }

    /// In namespace `ns`.
    pub fn namespace(mut self, ns: &str) -> Self {
        self.0.metadata.namespace = Some(ns.into());
        self
    }

    /// With uid `uid`, as the API server would have given it.
    pub fn uid(mut self, uid: impl Into<String>) -> Self {
        self.0.metadata.uid = Some(uid.into());
        self
    }

    /// Agents of `image`.
    pub fn image(mut self, image: &str) -> Self {
        self.0.spec.image = image.into();
        self
    }

    /// `n` agents.
    pub fn replicas(mut self, n: i32) -> Self {
        self.0.spec.replicas = n;
        self
    }

    /// At most `n` transfers per agent.
    pub fn max_transfers_per_agent(mut self, n: i32) -> Self {
        self.0.spec.max_transfers_per_agent = n;
        self
    }

    /// The pool's tuning.
    pub fn tuning(mut self, tuning: Tuning) -> Self {
        self.0.spec.tuning = tuning;
        self
    }

    /// The pool.
    pub fn build(self) -> DtnPool {
        self.0
    }
}

/// A Transfer under construction.
#[derive(Debug, Clone)]
pub struct TransferBuilder(Transfer);

impl TransferBuilder {
    /// Transfer `name` of `from` on pool `src` to `to` on pool `dst`, both
    /// pools in the Transfer's namespace; no namespace.
    pub fn new(name: &str, from: &str, to: &str) -> Self {
        let spec: TransferSpec = serde_json::from_value(serde_json::json!({
            "source": {"pool": "src", "path": from},
            "destination": {"pool": "dst", "path": to},
        }))
        .expect("a minimal transfer spec deserializes");
        Self(Transfer::new(name, spec))
    }

    /// From pool `source` to pool `destination`.
    pub fn pools(mut self, source: &str, destination: &str) -> Self {
        let spec = &mut self.0.spec;
        spec.source = Source {
            pool: source.into(),
            ..spec.source.clone()
        };
        spec.destination = Destination {
            pool: Some(destination.into()),
            ..spec.destination.clone()
        };
        self
    }

    /// In namespace `ns`, with uid `uid-<name>` and generation 1, as the
    /// API server would have stored it.
    pub fn stored_in(mut self, ns: &str) -> Self {
        let m = &mut self.0.metadata;
        m.uid = m.name.as_ref().map(|n| format!("uid-{n}"));
        m.namespace = Some(ns.into());
        m.generation = Some(1);
        self
    }

    /// In namespace `ns`, nothing else stored.
    pub fn namespace(mut self, ns: &str) -> Self {
        self.0.metadata.namespace = Some(ns.into());
        self
    }

    /// With uid `uid`.
    pub fn uid(mut self, uid: impl Into<String>) -> Self {
        self.0.metadata.uid = Some(uid.into());
        self
    }

    /// Capped at `mbps` megabits per second, if any.
    pub fn max_rate_mbps(mut self, mbps: Option<i64>) -> Self {
        self.0.spec.max_rate_mbps = mbps;
        self
    }

    /// At most `n` failovers.
    pub fn max_failovers(mut self, n: i32) -> Self {
        self.0.spec.max_failovers = n;
        self
    }

    /// With `status`.
    pub fn status(mut self, status: TransferStatus) -> Self {
        self.0.status = Some(status);
        self
    }

    /// The Transfer.
    pub fn build(self) -> Transfer {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_objects_carry_the_schema_defaults_and_what_was_asked() {
        let p = PoolBuilder::new("p", "/data")
            .namespace("ns")
            .replicas(0)
            .build();
        assert_eq!(p.spec.allowed_roots, ["/data"]);
        assert_eq!(p.spec.replicas, 0);
        assert_eq!(p.spec.max_transfers_per_agent, 2, "the schema's default");
        assert_eq!(p.metadata.namespace.as_deref(), Some("ns"));

        let t = TransferBuilder::new("t", "/in/f", "/out/f")
            .pools("a", "b")
            .stored_in("ns")
            .max_failovers(5)
            .build();
        assert_eq!(t.spec.source.pool, "a");
        assert_eq!(t.spec.destination.pool.as_deref(), Some("b"));
        assert_eq!(t.spec.destination.path, "/out/f");
        assert_eq!(t.spec.max_failovers, 5);
        assert_eq!(
            t.spec.stall_timeout_seconds,
            crate::transfer::STALL_TIMEOUT_SECONDS
        );
        assert_eq!(t.metadata.uid.as_deref(), Some("uid-t"));
        assert_eq!(t.metadata.generation, Some(1));
    }
}
