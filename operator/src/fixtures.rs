//! An API server double for the reconcilers: a real `kube::Client` on a
//! tower-test channel, answered by a small in-memory object store. It records
//! every request so tests assert what the operator asked of the API, and it
//! answers as an API server would: objects merged with the patch, 404 for
//! unknown names, 409 for a second create.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::client::Body;
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher;
use serde_json::{Value, json};
use wirerate_crds::{DtnPool, DtnPoolBinding, Transfer};

use crate::context::{Context, Stores};

/// One request the operator made.
#[derive(Clone, Debug)]
pub(crate) struct Call {
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) query: String,
    pub(crate) body: Value,
}

impl Call {
    /// The resource path without `/status` and the namespace prefix, e.g. `statefulsets/p-agent`.
    pub(crate) fn is(&self, method: &str, path_end: &str) -> bool {
        self.method == method && self.path.ends_with(path_end)
    }
}

/// The double and the caches the reconcilers read.
pub(crate) struct Double {
    pub(crate) ctx: Arc<Context>,
    calls: Arc<Mutex<Vec<Call>>>,
    pools: Writer<DtnPool>,
    transfers: Writer<Transfer>,
    leases: Writer<Lease>,
    bindings: Writer<DtnPoolBinding>,
    objects: Arc<Mutex<BTreeMap<String, Value>>>,
    /// Paths whose GETs fail (`unavailable`).
    unavailable: Arc<Mutex<BTreeSet<String>>>,
    /// Paths (a subresource's included) whose PATCHes are refused (`refuse_patches`).
    refused: Arc<Mutex<BTreeSet<String>>>,
    /// Objects that take a path's place just after its next GET
    /// (`replaced_after_get`).
    swaps: Arc<Mutex<BTreeMap<String, Value>>>,
    server: tokio::task::JoinHandle<()>,
}

fn merge(into: &mut Value, patch: &Value) {
    match (into, patch) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b.clone(),
    }
}

/// For a collection path, the prefix up to the API version (plus the
/// namespace, if any) and the resource; None for an object's path.
fn list_of(path: &str) -> Option<(String, String)> {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let api = if parts.first() == Some(&"api") { 2 } else { 3 };
    let prefix = format!("/{}", parts.get(..api)?.join("/"));
    match parts.get(api..)? {
        [resource] => Some((prefix, (*resource).to_owned())),
        ["namespaces", ns, resource] => {
            Some((format!("{prefix}/namespaces/{ns}"), (*resource).to_owned()))
        }
        _ => None,
    }
}

/// Whether the object at `key` belongs to the list `prefix`/…/`resource`.
fn in_list(key: &str, prefix: &str, resource: &str) -> bool {
    let Some(rest) = key.strip_prefix(prefix) else {
        return false;
    };
    let parts: Vec<&str> = rest.trim_start_matches('/').split('/').collect();
    match parts.as_slice() {
        [r, _] => *r == resource,
        ["namespaces", _, r, _] => *r == resource,
        _ => false,
    }
}

/// Whether `o` matches the equality-based `labelSelector` of `query`.
fn selected(o: &Value, query: &str) -> bool {
    let Some(raw) = query
        .split('&')
        .find_map(|q| q.strip_prefix("labelSelector="))
    else {
        return true;
    };
    let decoded = raw
        .replace("%3D", "=")
        .replace("%2C", ",")
        .replace("%2F", "/");
    decoded.split(',').all(|term| match term.split_once('=') {
        Some((k, v)) => o["metadata"]["labels"][k].as_str() == Some(v),
        None => !o["metadata"]["labels"][term].is_null(),
    })
}

/// Applies a JSON patch as the API server does (a failed `test` is a 422);
/// like it, a `test` for null passes where the field is absent.
fn json_patched(o: &mut Value, ops: &Value) -> Result<(), String> {
    let ops: Vec<Value> = ops
        .as_array()
        .ok_or("a JSON patch is a list")?
        .iter()
        .filter(|op| {
            !(op["op"] == "test"
                && op["value"].is_null()
                && o.pointer(op["path"].as_str().unwrap_or_default()).is_none())
        })
        .cloned()
        .collect();
    let patch: json_patch::Patch =
        serde_json::from_value(Value::Array(ops)).map_err(|e| e.to_string())?;
    json_patch::patch(o, &patch).map_err(|e| e.to_string())
}

/// Gives an object the API server creates a uid of its own, as it does.
fn with_uid(o: &mut Value) {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    if o["metadata"].is_object() && o["metadata"]["uid"].is_null() {
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        o["metadata"]["uid"] = format!("double-{n}").into();
    }
}

fn status(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code, "message": reason})
}

impl Double {
    /// An empty cluster.
    pub(crate) fn new() -> Self {
        Self::listed(true)
    }

    /// An empty cluster whose Lease cache has not been listed yet (as
    /// just after the operator starts) unless `leases_listed`.
    pub(crate) fn listed(leases_listed: bool) -> Self {
        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(service, "default");
        let calls = Arc::new(Mutex::new(Vec::new()));
        let objects: Arc<Mutex<BTreeMap<String, Value>>> = Arc::default();
        let unavailable: Arc<Mutex<BTreeSet<String>>> = Arc::default();
        let swaps: Arc<Mutex<BTreeMap<String, Value>>> = Arc::default();
        let refused: Arc<Mutex<BTreeSet<String>>> = Arc::default();
        let (log, store, down) = (calls.clone(), objects.clone(), unavailable.clone());
        let no = refused.clone();
        let swapping = swaps.clone();
        let server = tokio::spawn(async move {
            while let Some((req, respond)) = handle.next_request().await {
                let method = req.method().to_string();
                let path = req.uri().path().to_owned();
                let query = req.uri().query().unwrap_or_default().to_owned();
                let bytes = req.into_body().collect().await.unwrap().to_bytes();
                let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                let key = path.trim_end_matches("/status").to_owned();
                let (code, reply) = {
                    let mut objs = store.lock().unwrap();
                    match method.as_str() {
                        "GET" if down.lock().unwrap().contains(&key) => {
                            (503, status(503, "ServiceUnavailable"))
                        }
                        "PATCH" if no.lock().unwrap().contains(&path) => {
                            (403, status(403, "Forbidden"))
                        }
                        "GET" => match (objs.get(&key), list_of(&key)) {
                            (Some(o), _) => {
                                let served = o.clone();
                                if let Some(next) = swapping.lock().unwrap().remove(&key) {
                                    objs.insert(key.clone(), next);
                                }
                                (200, served)
                            }
                            (None, Some((prefix, resource))) => {
                                let items: Vec<Value> = objs
                                    .iter()
                                    .filter(|(k, o)| {
                                        in_list(k, &prefix, &resource) && selected(o, &query)
                                    })
                                    .map(|(_, o)| o.clone())
                                    .collect();
                                (
                                    200,
                                    json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": "1"}, "items": items}),
                                )
                            }
                            (None, None) => (404, status(404, "NotFound")),
                        },
                        "POST" => {
                            let name = body["metadata"]["name"]
                                .as_str()
                                .unwrap_or("generated")
                                .to_owned();
                            let k = format!("{key}/{name}");
                            // As the API server: a name is a DNS subdomain.
                            if name.len() > 253 {
                                (
                                    422,
                                    status(
                                        422,
                                        "Invalid: metadata.name: must be no more than 253 characters",
                                    ),
                                )
                            } else {
                                match objs.entry(k) {
                                    std::collections::btree_map::Entry::Occupied(_) => {
                                        (409, status(409, "AlreadyExists"))
                                    }
                                    std::collections::btree_map::Entry::Vacant(v) => {
                                        let o = v.insert(body.clone());
                                        with_uid(o);
                                        (201, o.clone())
                                    }
                                }
                            }
                        }
                        // As the API server: a uid in the body that is not
                        // the object's is a conflict.
                        "PATCH" | "PUT"
                            if body["metadata"]["uid"].is_string()
                                && objs.get(&key).is_some_and(|o| {
                                    o["metadata"]["uid"] != body["metadata"]["uid"]
                                }) =>
                        {
                            (409, status(409, "Conflict"))
                        }
                        "PATCH" | "PUT" => {
                            let o = objs.entry(key).or_insert_with(|| json!({}));
                            if body.is_object() {
                                merge(o, &body);
                                with_uid(o);
                                (200, o.clone())
                            } else {
                                match json_patched(o, &body) {
                                    Ok(()) => (200, o.clone()),
                                    Err(why) => (422, status(422, &why)),
                                }
                            }
                        }
                        // As the API server: a precondition on another
                        // object's uid is a conflict.
                        "DELETE"
                            if body["preconditions"]["uid"].is_string()
                                && objs.get(&key).is_some_and(|o| {
                                    o["metadata"]["uid"] != body["preconditions"]["uid"]
                                }) =>
                        {
                            (409, status(409, "Conflict"))
                        }
                        "DELETE" => match objs.remove(&key) {
                            Some(_) => (200, status(200, "Success")),
                            None => (404, status(404, "NotFound")),
                        },
                        _ => (405, status(405, "MethodNotAllowed")),
                    }
                };
                log.lock().unwrap().push(Call {
                    method,
                    path,
                    query,
                    body,
                });
                let resp = Response::builder()
                    .status(StatusCode::from_u16(code).unwrap())
                    .body(Body::from(serde_json::to_vec(&reply).unwrap()))
                    .unwrap();
                respond.send_response(resp);
            }
        });
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
        let ctx = Arc::new(Context::new(client, stores, Default::default(), "test"));
        Self {
            ctx,
            calls,
            pools,
            transfers,
            leases,
            bindings,
            objects,
            unavailable,
            refused,
            swaps,
            server,
        }
    }

    /// Makes every PATCH of `path` fail with 403: a write the API server
    /// surely did not apply.
    pub(crate) fn refuse_patches(&self, path: &str) {
        self.refused.lock().unwrap().insert(path.to_owned());
    }

    /// Puts `obj` in the API and in the cache the reconcilers read.
    pub(crate) fn pool(&mut self, p: &DtnPool) {
        self.object(
            &format!(
                "/apis/wirerate.io/v1alpha1/namespaces/{}/dtnpools/{}",
                ns(&p.metadata),
                name(&p.metadata)
            ),
            p,
        );
        self.pools
            .apply_watcher_event(&watcher::Event::Apply(p.clone()));
        // The watch streams note each change; so does the double.
        self.ctx.changed();
    }

    /// Puts a Transfer in the API and the cache.
    pub(crate) fn transfer(&mut self, t: &Transfer) {
        self.object(
            &format!(
                "/apis/wirerate.io/v1alpha1/namespaces/{}/transfers/{}",
                ns(&t.metadata),
                name(&t.metadata)
            ),
            t,
        );
        self.transfers
            .apply_watcher_event(&watcher::Event::Apply(t.clone()));
        self.ctx.changed();
    }

    /// Puts a Transfer in the cache only (the API keeps its own copy).
    pub(crate) fn transfer_in_cache(&mut self, t: &Transfer) {
        self.transfers
            .apply_watcher_event(&watcher::Event::Apply(t.clone()));
        self.ctx.changed();
    }

    /// The API's copy of the object at `path`.
    pub(crate) fn object_at(&self, path: &str) -> Value {
        self.objects
            .lock()
            .unwrap()
            .get(path)
            .cloned()
            .unwrap_or(Value::Null)
    }

    /// Puts a DtnPoolBinding in the API and the cache.
    pub(crate) fn binding(&mut self, b: &DtnPoolBinding) {
        self.object(
            &format!(
                "/apis/wirerate.io/v1alpha1/namespaces/{}/dtnpoolbindings/{}",
                ns(&b.metadata),
                name(&b.metadata)
            ),
            b,
        );
        self.bindings
            .apply_watcher_event(&watcher::Event::Apply(b.clone()));
        self.ctx.changed();
    }

    /// Takes a DtnPoolBinding out of the API and the cache.
    pub(crate) fn unbind(&mut self, b: &DtnPoolBinding) {
        self.objects.lock().unwrap().remove(&format!(
            "/apis/wirerate.io/v1alpha1/namespaces/{}/dtnpoolbindings/{}",
            ns(&b.metadata),
            name(&b.metadata)
        ));
        self.bindings
            .apply_watcher_event(&watcher::Event::Delete(b.clone()));
        self.ctx.changed();
    }

    /// Puts any object in the API (not in a cache), at its path.
    pub(crate) fn put<T: serde::Serialize>(&self, path: &str, obj: &T) {
        self.object(path, obj);
    }

    /// Makes every GET of `path` fail with 503 until something is put there.
    pub(crate) fn unavailable(&self, path: &str) {
        self.unavailable.lock().unwrap().insert(path.to_owned());
    }

    /// Puts `obj` at `path` just after the next GET of it has been
    /// answered: another object taking its name between a read and a write.
    pub(crate) fn replaced_after_get<T: serde::Serialize>(&self, path: &str, obj: &T) {
        self.swaps
            .lock()
            .unwrap()
            .insert(path.to_owned(), serde_json::to_value(obj).unwrap());
    }

    /// Whether the API holds an object at `path`.
    pub(crate) fn has(&self, path: &str) -> bool {
        self.objects.lock().unwrap().contains_key(path)
    }

    /// Puts an agent's Lease in the cache.
    pub(crate) fn lease(&mut self, l: &Lease) {
        self.leases
            .apply_watcher_event(&watcher::Event::Apply(l.clone()));
        self.ctx.changed();
    }

    fn object<T: serde::Serialize>(&self, path: &str, obj: &T) {
        self.unavailable.lock().unwrap().remove(path);
        self.objects
            .lock()
            .unwrap()
            .insert(path.to_owned(), serde_json::to_value(obj).unwrap());
    }

    /// The requests made so far.
    pub(crate) fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
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

impl Drop for Double {
    fn drop(&mut self) {
        self.server.abort();
    }
}

fn ns(m: &kube::api::ObjectMeta) -> String {
    m.namespace.clone().unwrap_or_default()
}

fn name(m: &kube::api::ObjectMeta) -> String {
    m.name.clone().unwrap_or_default()
}
