//! The reconcilers' test cluster: the project's one API server double
//! (`wirerate-apiserver-double`, served over HTTP on 127.0.0.1) with
//! wirerate's CRDs and the namespaces the tests use, a `Context` whose
//! client talks to it, and watch caches fed by hand, so that a test decides
//! exactly what the reconcilers have seen. The double logs every request,
//! so tests assert what the operator asked of the API, with which field
//! manager, in what order; and it answers as an API server does (uids,
//! preconditions, server-side apply, 404s and 409s).

use std::sync::Arc;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::CustomResourceExt;
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher;
use serde_json::Value;
use wirerate_apiserver_double::{ApiServer, Call};
use wirerate_crds::{DtnPool, DtnPoolBinding, Transfer};

use crate::context::{Context, Stores};

/// Namespaces every test cluster has, besides the double's own (`default`,
/// `kube-system`): those the tests' pools and Transfers live in or serve.
const NAMESPACES: [&str; 4] = ["data", "research-data", "beamline-7", "guest"];

/// The double and the caches the reconcilers read.
pub(crate) struct Cluster {
    pub(crate) ctx: Arc<Context>,
    api: ApiServer,
    pools: Writer<DtnPool>,
    transfers: Writer<Transfer>,
    leases: Writer<Lease>,
    bindings: Writer<DtnPoolBinding>,
}

fn path_of(kind: &str, m: &kube::api::ObjectMeta) -> String {
    format!(
        "/apis/wirerate.io/v1alpha1/namespaces/{}/{kind}/{}",
        m.namespace.as_deref().unwrap_or_default(),
        m.name.as_deref().unwrap_or_default()
    )
}

impl Cluster {
    /// An empty cluster.
    pub(crate) async fn new() -> Self {
        Self::listed(true).await
    }

    /// An empty cluster whose Lease cache has not been listed yet (as
    /// just after the operator starts) unless `leases_listed`.
    pub(crate) async fn listed(leases_listed: bool) -> Self {
        let api = ApiServer::start(std::time::Duration::ZERO)
            .await
            .expect("the API double starts");
        for crd in [DtnPool::crd(), Transfer::crd(), DtnPoolBinding::crd()] {
            let name = crd.metadata.name.clone().unwrap_or_default();
            api.put(
                &format!("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"),
                &crd,
            );
        }
        let cluster_client = api.client().expect("a client of the double");
        let (pools_r, mut pools) = reflector::store::<DtnPool>();
        let (transfers_r, mut transfers) = reflector::store::<Transfer>();
        let (leases_r, mut leases) = reflector::store::<Lease>();
        let (pods_r, mut pods) = reflector::store::<Pod>();
        let (bindings_r, mut bindings) = reflector::store::<DtnPoolBinding>();
        // Listed once, empty, as the watches do first.
        pools.apply_watcher_event(&watcher::Event::InitDone);
        transfers.apply_watcher_event(&watcher::Event::InitDone);
        if leases_listed {
            leases.apply_watcher_event(&watcher::Event::InitDone);
        }
        pods.apply_watcher_event(&watcher::Event::InitDone);
        bindings.apply_watcher_event(&watcher::Event::InitDone);
        let stores = Stores {
            bindings: bindings_r,
            pools: pools_r,
            transfers: transfers_r,
            leases: leases_r,
            pods: pods_r,
        };
        let ctx = Arc::new(Context::new(
            cluster_client,
            stores,
            Default::default(),
            "test",
        ));
        let cluster = Self {
            ctx,
            api,
            pools,
            transfers,
            leases,
            bindings,
        };
        for ns in NAMESPACES {
            cluster.namespace(ns);
        }
        // What the operator asks from here on; the setup above is not its.
        cluster.api.record();
        cluster
    }

    /// Makes sure the namespace `ns` exists.
    pub(crate) fn namespace(&self, ns: &str) {
        let path = format!("/api/v1/namespaces/{ns}");
        if !ns.is_empty() && !self.api.has(&path) {
            self.api
                .put(&path, &serde_json::json!({"metadata": {"name": ns}}));
        }
    }

    /// Makes every PATCH of `path` fail with 403: a write the API server
    /// surely did not apply.
    pub(crate) fn refuse_patches(&self, path: &str) {
        self.api.refuse_patches(path);
    }

    /// Puts a DtnPool in the API and in the cache the reconcilers read.
    pub(crate) fn pool(&mut self, p: &DtnPool) {
        self.stored(&path_of("dtnpools", &p.metadata), p);
        self.pools
            .apply_watcher_event(&watcher::Event::Apply(p.clone()));
        // The watch streams note each change; so does the test cluster.
        self.ctx.changed();
    }

    /// Puts a Transfer in the API and the cache.
    pub(crate) fn transfer(&mut self, t: &Transfer) {
        self.stored(&path_of("transfers", &t.metadata), t);
        self.transfer_in_cache(t);
    }

    /// Puts a Transfer in the cache only (the API keeps its own copy).
    pub(crate) fn transfer_in_cache(&mut self, t: &Transfer) {
        self.transfers
            .apply_watcher_event(&watcher::Event::Apply(t.clone()));
        self.ctx.changed();
    }

    /// The API's copy of the object at `path` (Null when there is none).
    pub(crate) fn object_at(&self, path: &str) -> Value {
        self.api.object(path).unwrap_or(Value::Null)
    }

    /// Puts a DtnPoolBinding in the API and the cache.
    pub(crate) fn binding(&mut self, b: &DtnPoolBinding) {
        self.stored(&path_of("dtnpoolbindings", &b.metadata), b);
        self.bindings
            .apply_watcher_event(&watcher::Event::Apply(b.clone()));
        self.ctx.changed();
    }

    /// Takes a DtnPoolBinding out of the API and the cache.
    pub(crate) fn unbind(&mut self, b: &DtnPoolBinding) {
        self.api.delete(&path_of("dtnpoolbindings", &b.metadata));
        self.bindings
            .apply_watcher_event(&watcher::Event::Delete(b.clone()));
        self.ctx.changed();
    }

    /// Puts any object in the API (not in a cache), at its path, as it is
    /// (its uid and owners kept): someone else's object, or one left by an
    /// earlier look.
    pub(crate) fn put<T: serde::Serialize>(&self, path: &str, obj: &T) {
        self.api.put(path, obj);
    }

    /// Makes every GET of `path` fail until something is put there.
    pub(crate) fn unavailable(&self, path: &str) {
        self.api.fail_gets(path);
    }

    /// Puts `obj` at `path` just after the next GET of it has been
    /// answered: another object taking its name between a read and a write.
    pub(crate) fn replaced_after_get<T: serde::Serialize>(&self, path: &str, obj: &T) {
        self.api.replace_after_get(path, obj);
    }

    /// Whether the API holds an object at `path`.
    pub(crate) fn has(&self, path: &str) -> bool {
        self.api.has(path)
    }

    /// Puts an agent's Lease in the cache.
    pub(crate) fn lease(&mut self, l: &Lease) {
        self.leases
            .apply_watcher_event(&watcher::Event::Apply(l.clone()));
        self.ctx.changed();
    }

    /// Stores `obj` at `path`, in its namespace (made if need be).
    fn stored<T: serde::Serialize + kube::Resource>(&self, path: &str, obj: &T) {
        self.namespace(obj.meta().namespace.as_deref().unwrap_or_default());
        self.api.put(path, obj);
    }

    /// The requests the operator made so far.
    pub(crate) fn calls(&self) -> Vec<Call> {
        self.api.calls()
    }

    /// The last status the operator applied to `path_end`.
    pub(crate) fn last_status(&self, path_end: &str) -> Value {
        self.calls()
            .into_iter()
            .rev()
            .find(|c| c.is("PATCH", &format!("{path_end}/status")))
            .map(|c| c.body["status"].clone())
            .unwrap_or_else(|| {
                panic!(
                    "no status applied to {path_end}; calls: {:#?}",
                    self.calls()
                )
            })
    }
}
