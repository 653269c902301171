//! `DtnPoolBinding`: a namespace's consent to be served by a pool elsewhere.
//!
//! A pool's `allowedNamespaces` is the pool owner's offer; it grants nothing
//! on its own, because the pool's owner has no rights in those namespaces.
//! The operator gives a pool's agents access to another namespace's Transfers
//! only when that namespace holds a DtnPoolBinding naming the pool, which
//! only someone with rights in that namespace can create (Gateway API's
//! ReferenceGrant is the same pattern).

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// This namespace lets the named pool's agents run its Transfers.
// Clippy reads each printcolumn's `type_` as a repeated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "wirerate.io",
    version = "v1alpha1",
    kind = "DtnPoolBinding",
    doc = "Consent of this namespace to have its Transfers run by a DtnPool in another namespace.",
    namespaced,
    shortname = "dtnpb",
    category = "wirerate",
    printcolumn(
        json_path = ".spec.poolNamespace",
        name = "Pool-Namespace",
        type_ = "string"
    ),
    printcolumn(json_path = ".spec.pool", name = "Pool", type_ = "string"),
    printcolumn(
        json_path = ".metadata.creationTimestamp",
        name = "Age",
        type_ = "date"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct DtnPoolBindingSpec {
    /// Namespace of the DtnPool.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
    )]
    pub pool_namespace: String,
    /// Name of the DtnPool.
    #[schemars(length(min = 1, max = 253))]
    pub pool: String,
}

impl DtnPoolBinding {
    /// `(served namespace, pool namespace, pool)`: the consent this binding gives.
    pub fn consent(&self) -> Option<Consent> {
        Some(Consent {
            namespace: self.metadata.namespace.clone()?,
            pool_namespace: self.spec.pool_namespace.clone(),
            pool: self.spec.pool.clone(),
        })
    }
}

/// One namespace's consent to one pool.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Consent {
    /// The namespace that consents.
    pub namespace: String,
    /// The pool's namespace.
    pub pool_namespace: String,
    /// The pool.
    pub pool: String,
}
