//! An in-memory Kubernetes API server double, served over plain HTTP on
//! 127.0.0.1 (or an address the caller picks), so the real operator and
//! agent binaries can run against it with nothing but a kubeconfig. It
//! implements what the operator, the agents and the bench driver use,
//! answering as kube-apiserver does: objects of any group and version, get,
//! list and watch (selectors, resourceVersions, bookmarks, 410 for a
//! watch older than the history), create, update with optimistic
//! concurrency, merge, JSON and server-side-apply patches, status
//! subresources, finalizers, and `Status` errors. It counts every request by
//! who made it, verb and resource, and every write by object.
//!
//! Left out, because nothing here needs it: authentication and RBAC,
//! admission (CEL rules, webhooks), defaulting and schema validation,
//! paging (`limit` is ignored: a list returns everything, with no continue
//! token), garbage collection through owner references, strategic merge
//! patches, delete preconditions (a DELETE's body is not read), and
//! discovery. Deleting a namespace or a CRD removes its objects
//! at once (the API server's controllers take a moment, and wait for
//! finalizers).

mod apply;
mod counts;
mod error;
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
