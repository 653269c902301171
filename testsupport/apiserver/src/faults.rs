//! What a test asks of the double beyond a healthy API server: a log of
//! every request (to assert what a client asked, with which field manager
//! and body), and faults on chosen paths: reads that fail, patches that are
//! refused, and an object that takes a name between a read and a write.
//! All of it is off until a test turns it on, so the bench pays nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use serde_json::Value;

/// One request as the double received it.
#[derive(Clone, Debug)]
pub struct Call {
    /// `GET`, `POST`, `PUT`, `PATCH`, `DELETE`.
    pub method: String,
    /// The path, subresource included (`.../transfers/t/status`).
    pub path: String,
    /// The raw query string (`fieldManager=...&force=true`).
    pub query: String,
    /// The Content-Type header, if any (which kind of patch).
    pub content_type: String,
    /// The body as JSON; Null when there was none or it was not JSON.
    pub body: Value,
}

impl Call {
    /// Whether this is a `method` request on a path ending in `path_end`.
    pub fn is(&self, method: &str, path_end: &str) -> bool {
        self.method == method && self.path.ends_with(path_end)
    }

    /// The field manager the request named, if any.
    pub fn field_manager(&self) -> Option<String> {
        form_urlencoded::parse(self.query.as_bytes())
            .find(|(k, _)| k == "fieldManager")
            .map(|(_, v)| v.into_owned())
    }

    /// Whether it was a server-side apply (`application/apply-patch`).
    pub fn is_apply(&self) -> bool {
        self.method == "PATCH" && self.content_type.starts_with("application/apply-patch")
    }

    /// Whether it asked to take fields from other managers (`force=true`).
    pub fn forced(&self) -> bool {
        form_urlencoded::parse(self.query.as_bytes()).any(|(k, v)| k == "force" && v == "true")
    }
}

/// The log and the faults, behind one lock each.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    /// None until `record` is turned on.
    log: Mutex<Option<Vec<Call>>>,
    /// Object paths (no subresource) whose GETs answer 500.
    unavailable: Mutex<BTreeSet<String>>,
    /// Paths (subresource included) whose PATCHes answer 403.
    refused: Mutex<BTreeSet<String>>,
    /// Objects put at a path just after its next GET is answered.
    swaps: Mutex<BTreeMap<String, Value>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().expect("faults lock")
}

impl Faults {
    pub(crate) fn record(&self) {
        lock(&self.log).get_or_insert_with(Vec::new);
    }

    pub(crate) fn log(&self, call: Call) {
        if let Some(log) = lock(&self.log).as_mut() {
            log.push(call);
        }
    }

    pub(crate) fn calls(&self) -> Vec<Call> {
        lock(&self.log).clone().unwrap_or_default()
    }

    pub(crate) fn set_unavailable(&self, path: &str) {
        lock(&self.unavailable).insert(path.to_owned());
    }

    /// A put at `path` makes it available again.
    pub(crate) fn available(&self, path: &str) {
        lock(&self.unavailable).remove(path);
    }

    pub(crate) fn is_unavailable(&self, path: &str) -> bool {
        lock(&self.unavailable).contains(path.trim_end_matches("/status"))
    }

    pub(crate) fn refuse_patches(&self, path: &str) {
        lock(&self.refused).insert(path.to_owned());
    }

    pub(crate) fn is_refused(&self, path: &str) -> bool {
        lock(&self.refused).contains(path)
    }

    pub(crate) fn swap_after_get(&self, path: &str, obj: Value) {
        lock(&self.swaps).insert(path.to_owned(), obj);
    }

    pub(crate) fn take_swap(&self, path: &str) -> Option<Value> {
        lock(&self.swaps).remove(path)
    }
}
