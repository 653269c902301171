//! An in-memory Kubernetes API server double, served over plain HTTP on
//! 127.0.0.1 (or an address the caller picks), so the real operator and
//! agent binaries can run against it with nothing but a kubeconfig. It
//! implements what the operator, the agents and the bench driver use,
//! answering as kube-apiserver does: objects of any group and version, get,
//! list and watch (selectors, resourceVersions, bookmarks, 410 for a
//! watch older than the history), create, update with optimistic
//! concurrency, merge, JSON and server-side-apply patches, status
//! subresources, finalizers, uid and resourceVersion preconditions, and
//! `Status` errors. It counts every request by who made it, verb and
//! resource, and every write by object.
//!
//! For tests, it also logs every request when asked to ([`ApiServer::record`]),
//! fails chosen requests ([`ApiServer::fail_gets`],
//! [`ApiServer::refuse_patches`], [`ApiServer::replace_after_get`]), and has a
//! back door that stores and reads objects without a client
//! ([`ApiServer::put`], [`ApiServer::object`]).
//!
//! Left out, because nothing here needs it: authentication and RBAC,
//! admission (CEL rules, webhooks), defaulting and schema validation,
//! paging (`limit` is ignored: a list returns everything, with no continue
//! token), garbage collection through owner references, strategic merge
//! patches, and discovery. Deleting a namespace or a CRD removes its objects
//! at once (the API server's controllers take a moment, and wait for
//! finalizers).
#![forbid(unsafe_code)]

mod apply;
mod counts;
mod error;
mod faults;
mod path;
mod select;
mod serve;
mod store;
#[cfg(test)]
mod tests;
mod types;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use counts::{Actor, DRIVER_AGENT, ObjectWrites, Tally};
pub use faults::Call;

/// Changes kept for watches that resume from an older resourceVersion.
const HISTORY: usize = 20_000;

/// A running double.
pub struct ApiServer {
    addr: SocketAddr,
    shared: Arc<serve::Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl ApiServer {
    /// Starts an empty cluster on a free port of 127.0.0.1, answering each
    /// request (but for watch events) after `latency`.
    pub async fn start(latency: Duration) -> std::io::Result<Self> {
        Self::start_with(HISTORY, latency).await
    }

    /// As `start`, keeping `history` changes for watches.
    pub async fn start_with(history: usize, latency: Duration) -> std::io::Result<Self> {
        Self::bind(([127, 0, 0, 1], 0).into(), history, latency).await
    }

    /// As `start`, listening on `addr`: an address the caller chose, such
    /// as one that agents in network namespaces can reach.
    pub async fn start_on(addr: SocketAddr, latency: Duration) -> std::io::Result<Self> {
        Self::bind(addr, HISTORY, latency).await
    }

    async fn bind(addr: SocketAddr, history: usize, latency: Duration) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(serve::Shared {
            store: Mutex::new(store::Store::new(history)),
            counts: counts::Counts::default(),
            latency,
            stalls: Mutex::new(Vec::new()),
            faults: faults::Faults::default(),
        });
        let task = tokio::spawn(serve::serve(listener, shared.clone()));
        let server = Self { addr, shared, task };
        server.seed();
        Ok(server)
    }

    /// The namespaces every cluster has.
    fn seed(&self) {
        let mut store = self.shared.store.lock().expect("store lock");
        for ns in ["default", "kube-system"] {
            let t = path::parse("/api/v1/namespaces").expect("a resource path");
            store
                .create(
                    &t,
                    serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
                )
                .expect("a fresh store takes its namespaces");
        }
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A client of the double.
    pub fn client(&self) -> kube::Result<kube::Client> {
        let url = self
            .url()
            .parse()
            .expect("an http URL of an address parses");
        kube::Client::try_from(kube::Config::new(url))
    }

    /// Writes a kubeconfig pointing at the double (JSON, which is YAML).
    pub fn write_kubeconfig(&self, path: &Path) -> std::io::Result<()> {
        let config = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "double", "cluster": {"server": self.url()}}],
            "users": [{"name": "bench", "user": {}}],
            "contexts": [{"name": "double", "context": {"cluster": "double", "user": "bench"}}],
            "current-context": "double",
        });
        std::fs::write(path, serde_json::to_vec_pretty(&config)?)
    }

    /// Answers each later `verb` request on `resource` (as counted: `leases`,
    /// `transfers/status`) `delay` late, on top of the latency, until
    /// `unstall`. A stalled request is still applied, only late.
    pub fn stall(&self, verb: &'static str, resource: &str, delay: Duration) {
        let mut stalls = self.shared.stalls.lock().expect("stalls lock");
        stalls.retain(|(v, r, _)| !(*v == verb && r == resource));
        stalls.push((verb, resource.to_owned(), delay));
    }

    /// Ends every stall.
    pub fn unstall(&self) {
        self.shared.stalls.lock().expect("stalls lock").clear();
    }

    /// Requests so far.
    pub fn counts(&self) -> Tally {
        self.shared.counts.snapshot()
    }

    /// Writes so far, per object.
    pub fn writes_by_object(&self) -> ObjectWrites {
        self.shared.counts.objects()
    }

    /// Logs every request from now on (see [`calls`](Self::calls)).
    pub fn record(&self) {
        self.shared.faults.record();
    }

    /// The requests logged since [`record`](Self::record), in the order
    /// they arrived.
    pub fn calls(&self) -> Vec<Call> {
        self.shared.faults.calls()
    }

    /// Makes every GET of the object at `path` (its `/status` too) answer
    /// 500 until something is [`put`](Self::put) there: an error the client
    /// sees at once (a 503 it would retry for minutes).
    pub fn fail_gets(&self, path: &str) {
        self.shared.faults.set_unavailable(path);
    }

    /// Makes every PATCH of `path` (exactly: `.../status` is a path of its
    /// own) answer 403: a write the API server surely did not apply.
    pub fn refuse_patches(&self, path: &str) {
        self.shared.faults.refuse_patches(path);
    }

    /// Puts `obj` at `path` just after the next GET of it is answered:
    /// another object taking the name between a read and a write.
    pub fn replace_after_get<T: serde::Serialize>(&self, path: &str, obj: &T) {
        let obj = serde_json::to_value(obj).expect("a test's object serializes");
        self.shared.faults.swap_after_get(path, obj);
    }

    /// Stores `obj` at the object path `path` as it is, without a client:
    /// its uid, owners and status kept, the server's fields filled in where
    /// it lacks them. Another uid already there is replaced (deleted, then
    /// this one created). The resource's type must be known (for a custom
    /// resource: its CRD put or created first). Panics if it cannot be
    /// stored: that is a test's own setup going wrong.
    pub fn put<T: serde::Serialize>(&self, path: &str, obj: &T) {
        let obj = serde_json::to_value(obj).expect("a test's object serializes");
        let t = path::parse(path).unwrap_or_else(|| panic!("{path} is no resource path"));
        self.shared.faults.available(path);
        let mut store = self.shared.store.lock().expect("store lock");
        if let Err(e) = store.put(&t, obj) {
            panic!("cannot put {path}: {}", e.message);
        }
    }

    /// The object at `path` as stored, if there is one.
    pub fn object(&self, path: &str) -> Option<serde_json::Value> {
        let t = path::parse(path)?;
        let store = self.shared.store.lock().expect("store lock");
        store.get(&t).ok().map(|o| (*o).clone())
    }

    /// Whether an object is stored at `path`.
    pub fn has(&self, path: &str) -> bool {
        self.object(path).is_some()
    }

    /// Deletes the object at `path` without a client, as a DELETE does
    /// (an object with finalizers only gets its deletionTimestamp).
    pub fn delete(&self, path: &str) {
        let t = path::parse(path).unwrap_or_else(|| panic!("{path} is no resource path"));
        let mut store = self.shared.store.lock().expect("store lock");
        if let Err(e) = store.delete(&t, &serde_json::Value::Null) {
            panic!("cannot delete {path}: {}", e.message);
        }
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Creates wirerate's CRDs and `namespaces` through `client`: what a test
/// against an empty API server starts with.
pub async fn install(client: &kube::Client, namespaces: &[&str]) -> kube::Result<()> {
    use k8s_openapi::api::core::v1::Namespace;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::CustomResourceExt;
    use wirerate_crds::{DtnPool, DtnPoolBinding, Transfer};

    let pp = kube::api::PostParams::default();
    let crds: kube::Api<CustomResourceDefinition> = kube::Api::all(client.clone());
    for crd in [DtnPool::crd(), Transfer::crd(), DtnPoolBinding::crd()] {
        crds.create(&pp, &crd).await?;
    }
    let api: kube::Api<Namespace> = kube::Api::all(client.clone());
    for ns in namespaces {
        let mut obj = Namespace::default();
        obj.metadata.name = Some((*ns).to_owned());
        api.create(&pp, &obj).await?;
    }
    Ok(())
}
