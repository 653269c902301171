//! The double's HTTP face: hyper on plain HTTP/1.1, routing each request to
//! the store, and watches as chunked streams of newline-delimited JSON
//! events, replayed from the store's history.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::header::{ACCEPT, CONTENT_TYPE, USER_AGENT};
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use super::counts::{Actor, Counts};
use super::error::ApiError;
use super::faults::{Call, Faults};
use super::path::{self, Target};
use super::select::Selector;
use super::store::{Change, ChangeType, Obj, Patch, Store};

type Body = BoxBody<Bytes, Infallible>;

/// A watch that asked for bookmarks gets one this often, as the API server
/// sends them, so a quiet watch's resourceVersion stays fresh.
const BOOKMARK_EVERY: Duration = Duration::from_secs(30);
/// The API server's watch timeout when the client names none (it picks
/// 30 to 60 minutes).
const DEFAULT_WATCH_SECONDS: u64 = 1800;
/// Request bodies larger than this are refused (the API server's limit is 3 MiB per object).
const MAX_BODY: usize = 8 << 20;

/// What every connection shares.
pub(crate) struct Shared {
    pub(crate) store: Mutex<Store>,
    pub(crate) counts: Counts,
    /// Added to every answer: a real API server's writes wait for etcd,
    /// and an operator that makes its round trips one after another is
    /// slowed by that where the double alone would hide it.
    pub(crate) latency: Duration,
    /// Extra delays for some requests: (verb, resource as counted, delay).
    /// A loaded API server is slow on some paths (status writes queued
    /// behind etcd) while others answer at once.
    pub(crate) stalls: Mutex<Vec<(&'static str, String, Duration)>>,
    /// The request log and the faults a test set.
    pub(crate) faults: Faults,
}

impl Shared {
    fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().expect("store lock")
    }
}

/// Serves connections from `listener` until the task is dropped.
pub(crate) async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let shared = shared.clone();
                async move {
                    Ok::<_, Infallible>(match respond(shared, req).await {
                        Ok(r) => r,
                        Err(e) => json(e.code, Bytes::from(e.to_status().to_string())),
                    })
                }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

fn json(code: u16, body: Bytes) -> Response<Body> {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(body).boxed())
        .expect("a valid response")
}

/// The object as sent: whole, or its metadata alone when the client asked
/// for PartialObjectMetadata (kube's `get_metadata`).
fn shaped(obj: &Value, meta_only: bool) -> Vec<u8> {
    let v = if meta_only {
        serde_json::to_vec(&json!({
            "apiVersion": "meta.k8s.io/v1",
            "kind": "PartialObjectMetadata",
            "metadata": obj["metadata"],
        }))
    } else {
        serde_json::to_vec(obj)
    };
    v.expect("JSON values serialize")
}

fn header(parts: &http::request::Parts, name: http::HeaderName) -> Option<&str> {
    parts.headers.get(name).and_then(|v| v.to_str().ok())
}

fn body_json(bytes: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("the body is not JSON: {e}")))
}

async fn respond(shared: Arc<Shared>, req: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let (parts, body) = req.into_parts();
    let actor = Actor::from_user_agent(header(&parts, USER_AGENT));
    let query: HashMap<String, String> =
        form_urlencoded::parse(parts.uri.query().unwrap_or_default().as_bytes())
            .into_owned()
            .collect();
    let q = |k: &str| query.get(k).map(String::as_str);
    let Some(t) = path::parse(parts.uri.path()) else {
        shared
            .counts
            .add(actor, "other", parts.uri.path().to_owned());
        return Err(ApiError::not_found(
            "the server could not find the requested resource",
        ));
    };
    let verb = match (&parts.method, t.name.is_some()) {
        (&Method::GET, true) => "get",
        (&Method::GET, false) if matches!(q("watch"), Some("true" | "1")) => "watch",
        (&Method::GET, false) => "list",
        (&Method::POST, _) => "create",
        (&Method::PUT, _) => "update",
        (&Method::PATCH, _) => "patch",
        (&Method::DELETE, _) => "delete",
        _ => "other",
    };
    shared.counts.add(actor, verb, t.counted_as());
    delay(&shared, verb, &t).await;
    let meta_only = header(&parts, ACCEPT).is_some_and(|a| a.contains("as=PartialObjectMetadata"));
    let selector =
        || Selector::parse(q("labelSelector"), q("fieldSelector")).map_err(ApiError::bad_request);
    let bytes = read_body(body).await?;
    shared.faults.log(Call {
        method: parts.method.to_string(),
        path: parts.uri.path().to_owned(),
        query: parts.uri.query().unwrap_or_default().to_owned(),
        content_type: header(&parts, CONTENT_TYPE).unwrap_or_default().to_owned(),
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    });
    match verb {
        "get" if shared.faults.is_unavailable(parts.uri.path()) => {
            return Err(ApiError::internal("the double was told to fail this read"));
        }
        "patch" if shared.faults.is_refused(parts.uri.path()) => {
            return Err(ApiError::forbidden(
                "the double was told to refuse this patch",
            ));
        }
        _ => {}
    }
    if matches!(verb, "create" | "update" | "patch" | "delete") {
        count_write(&shared, actor, &t, &bytes);
    }
    let one = |code: u16, obj: Obj| Ok(json(code, Bytes::from(shaped(&obj, meta_only))));
    match verb {
        "get" => {
            let mut store = shared.store();
            let obj = store.get(&t)?;
            if let Some(next) = shared.faults.take_swap(parts.uri.path()) {
                // Another object takes the name just after this read.
                store.put(&t, next)?;
            }
            one(200, obj)
        }
        "list" => list(&shared, &t, &selector()?, meta_only),
        "watch" => watch(shared, t, selector()?, &query, meta_only),
        "create" => one(201, shared.store().create(&t, body_json(&bytes)?)?),
        "update" => one(200, shared.store().replace(&t, body_json(&bytes)?)?),
        "patch" => {
            let content_type = header(&parts, CONTENT_TYPE).unwrap_or_default();
            let patch = patch_of(content_type, q("fieldManager"), &bytes)?;
            one(200, shared.store().patch(&t, patch)?)
        }
        "delete" => {
            // DeleteOptions, when sent, may carry preconditions.
            let options: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            one(200, shared.store().delete(&t, &options["preconditions"])?)
        }
        _ => Err(ApiError::method_not_allowed(format!(
            "{} is not served",
            parts.method
        ))),
    }
}

/// Waits as the API server would before answering: the latency set for
/// every request (watch events aside), and any stall set for this one.
async fn delay(shared: &Shared, verb: &str, t: &Target) {
    if !shared.latency.is_zero() && verb != "watch" {
        tokio::time::sleep(shared.latency).await;
    }
    let stall = shared
        .stalls
        .lock()
        .expect("stalls lock")
        .iter()
        .find(|(v, r, _)| *v == verb && *r == t.counted_as())
        .map(|(_, _, d)| *d);
    if let Some(d) = stall {
        tokio::time::sleep(d).await;
    }
}

/// Counts a write of the object `t` names (a create: the one its body names).
fn count_write(shared: &Shared, actor: Actor, t: &Target, body: &[u8]) {
    let name = t.name.clone().unwrap_or_else(|| {
        serde_json::from_slice::<Value>(body)
            .ok()
            .and_then(|b| b["metadata"]["name"].as_str().map(str::to_owned))
            .unwrap_or_default()
    });
    let object = format!("{}/{name}", t.namespace.as_deref().unwrap_or_default());
    shared.counts.add_write(actor, t.counted_as(), object);
}

/// A LIST's answer: every object `sel` picks, whole or as metadata.
fn list(
    shared: &Shared,
    t: &Target,
    sel: &Selector,
    meta_only: bool,
) -> Result<Response<Body>, ApiError> {
    let (kind, items, rv) = {
        let store = shared.store();
        let kind = store.resolve(t)?.kind;
        let (items, rv) = store.list(t, sel)?;
        (kind, items, rv)
    };
    let (api_version, kind) = if meta_only {
        (
            "meta.k8s.io/v1".to_owned(),
            "PartialObjectMetadataList".to_owned(),
        )
    } else {
        (t.api_version(), format!("{kind}List"))
    };
    let mut out = serde_json::to_vec(&json!({
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"resourceVersion": rv.to_string()},
    }))
    .expect("JSON values serialize");
    // Items are written one by one rather than cloned into one Value.
    out.pop();
    out.extend_from_slice(b",\"items\":[");
    for (i, o) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend(shaped(o, meta_only));
    }
    out.extend_from_slice(b"]}");
    Ok(json(200, Bytes::from(out)))
}

/// The patch a PATCH carries, by its content type; an apply names its
/// field `manager`.
fn patch_of(content_type: &str, manager: Option<&str>, bytes: &[u8]) -> Result<Patch, ApiError> {
    Ok(match content_type {
        ct if ct.starts_with("application/apply-patch") => Patch::Apply {
            // kube-rs sends apply bodies as JSON, which is YAML too.
            body: body_json(bytes)?,
            manager: manager
                .filter(|m| !m.is_empty())
                .ok_or_else(|| {
                    ApiError::bad_request("fieldManager is required for apply requests")
                })?
                .to_owned(),
        },
        ct if ct.starts_with("application/merge-patch+json") => Patch::Merge(body_json(bytes)?),
        ct if ct.starts_with("application/json-patch+json") => Patch::Json(
            serde_json::from_slice(bytes)
                .map_err(|e| ApiError::bad_request(format!("not a JSON patch: {e}")))?,
        ),
        other => {
            return Err(ApiError::unsupported_media_type(format!(
                "the double does not take patches of type {other:?}"
            )));
        }
    })
}

/// Reads a request body up to MAX_BODY.
async fn read_body(body: Incoming) -> Result<Bytes, ApiError> {
    http_body_util::Limited::new(body, MAX_BODY)
        .collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(|e| ApiError::bad_request(format!("cannot read the body: {e}")))
}

/// What one watch sends.
struct WatchSpec {
    target: Target,
    selector: Selector,
    kind: String,
    meta_only: bool,
    bookmarks: bool,
    /// Replay the current objects as ADDED first.
    initial: bool,
    /// Mark the end of the replay with a bookmark (sendInitialEvents).
    initial_end: bool,
    from: u64,
    timeout: Duration,
}

fn watch(
    shared: Arc<Shared>,
    target: Target,
    selector: Selector,
    query: &HashMap<String, String>,
    meta_only: bool,
) -> Result<Response<Body>, ApiError> {
    let kind = shared.store().resolve(&target)?.kind;
    let q = |k: &str| query.get(k).map(String::as_str);
    let from = match q("resourceVersion") {
        None | Some("" | "0") => None,
        Some(rv) => Some(
            rv.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {rv:?}")))?,
        ),
    };
    let initial_end = q("sendInitialEvents") == Some("true");
    let spec = WatchSpec {
        target,
        selector,
        kind,
        meta_only,
        bookmarks: q("allowWatchBookmarks") == Some("true"),
        // Without a resourceVersion a watch starts with the current state,
        // as the API server's "any" semantics do.
        initial: from.is_none() || initial_end,
        initial_end,
        from: from.unwrap_or(0),
        timeout: Duration::from_secs(
            q("timeoutSeconds")
                .and_then(|s| s.parse().ok())
                .unwrap_or(DEFAULT_WATCH_SECONDS),
        ),
    };
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    tokio::spawn(stream_changes(shared, spec, tx));
    let frames = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header(CONTENT_TYPE, "application/json")
        .body(BodyExt::boxed(StreamBody::new(frames)))
        .expect("a valid response"))
}

fn event_line(out: &mut Vec<u8>, kind: &str, obj: &[u8]) {
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(b"\",\"object\":");
    out.extend_from_slice(obj);
    out.extend_from_slice(b"}\n");
}

fn bookmark(spec: &WatchSpec, rv: u64, initial_end: bool) -> Bytes {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    let obj = json!({"kind": spec.kind, "apiVersion": spec.target.api_version(), "metadata": meta});
    let mut out = Vec::new();
    event_line(&mut out, "BOOKMARK", obj.to_string().as_bytes());
    Bytes::from(out)
}

/// How `c` looks to this watch: a selector turns an object that starts or
/// stops matching into ADDED or DELETED.
fn seen_as(spec: &WatchSpec, c: &Change) -> Option<&'static str> {
    let t = &spec.target;
    if c.group != t.group
        || c.resource != t.resource
        || t.namespace.as_ref().is_some_and(|ns| *ns != c.namespace)
    {
        return None;
    }
    let now = spec.selector.matches(&c.obj);
    match c.kind {
        ChangeType::Added => now.then_some("ADDED"),
        ChangeType::Deleted => now.then_some("DELETED"),
        ChangeType::Modified => {
            let before = c.prev.as_ref().is_some_and(|p| spec.selector.matches(p));
            match (before, now) {
                (true, true) => Some("MODIFIED"),
                (false, true) => Some("ADDED"),
                (true, false) => Some("DELETED"),
                (false, false) => None,
            }
        }
    }
}

async fn stream_changes(shared: Arc<Shared>, spec: WatchSpec, tx: mpsc::Sender<Bytes>) {
    let deadline = tokio::time::Instant::now() + spec.timeout;
    let mut ticks =
        tokio::time::interval_at(tokio::time::Instant::now() + BOOKMARK_EVERY, BOOKMARK_EVERY);
    let mut wake = shared.store().subscribe();
    let mut at = spec.from;
    if spec.initial {
        let listed = {
            let store = shared.store();
            store.list(&spec.target, &spec.selector)
        };
        let Ok((items, rv)) = listed else { return };
        let mut out = Vec::new();
        for o in &items {
            event_line(&mut out, "ADDED", &shaped(o, spec.meta_only));
        }
        at = rv;
        if !out.is_empty() && tx.send(Bytes::from(out)).await.is_err() {
            return;
        }
        if spec.initial_end && tx.send(bookmark(&spec, at, true)).await.is_err() {
            return;
        }
    }
    loop {
        wake.borrow_and_update();
        let batch = shared.store().changes_since(at);
        match batch {
            Err(e) => {
                // As the API server does: a 200 stream with one ERROR event,
                // on which kube's watcher lists again. An HTTP 410 instead
                // would make it retry the same resourceVersion for ever.
                let mut out = Vec::new();
                event_line(&mut out, "ERROR", e.to_status().to_string().as_bytes());
                let _ = tx.send(Bytes::from(out)).await;
                return;
            }
            Ok((changes, through)) => {
                let mut out = Vec::new();
                for c in &changes {
                    if let Some(kind) = seen_as(&spec, c) {
                        event_line(&mut out, kind, &shaped(&c.obj, spec.meta_only));
                    }
                }
                at = through;
                if !out.is_empty() && tx.send(Bytes::from(out)).await.is_err() {
                    return;
                }
            }
        }
        let bookmark_due = tokio::select! {
            r = wake.changed() => {
                if r.is_err() {
                    return;
                }
                false
            }
            _ = tokio::time::sleep_until(deadline) => {
                if spec.bookmarks {
                    let _ = tx.send(bookmark(&spec, at, false)).await;
                }
                return;
            }
            _ = ticks.tick() => spec.bookmarks,
            _ = tx.closed() => return,
        };
        if bookmark_due && tx.send(bookmark(&spec, at, false)).await.is_err() {
            return;
        }
    }
}
