//! The objects, the one resourceVersion counter of the whole "cluster", and
//! a bounded history of changes for watches. Every write goes through
//! `commit`, which does what an API server does to every object whatever
//! the verb: it keeps server-set metadata (uid, creation time, deletion
//! time), moves `generation` when anything but metadata and status changed,
//! drops a write that changes nothing (no new resourceVersion, no watch
//! event), and removes an object being deleted once its last finalizer is
//! gone.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use base64::Engine as _;
use json_patch::PatchOperation;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Map, Value, json};

use super::apply::{self, FieldSet};
use super::error::ApiError;
use super::path::Target;
use super::select::Selector;
use super::types::{Registry, ResourceType};

/// A stored object; shared with the history and the watches.
pub(crate) type Obj = Arc<Value>;

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    group: String,
    resource: String,
    namespace: String,
    name: String,
}

/// What happened to an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ChangeType {
    Added,
    Modified,
    Deleted,
}

/// One change, as watches replay it.
#[derive(Debug)]
pub(crate) struct Change {
    /// The resourceVersion it made.
    pub(crate) rv: u64,
    pub(crate) group: String,
    pub(crate) resource: String,
    pub(crate) namespace: String,
    pub(crate) kind: ChangeType,
    /// The object before (None for Added); a watch with a selector needs it
    /// to tell an object that stopped matching (DELETED for that watch).
    pub(crate) prev: Option<Obj>,
    /// The object after (for Deleted: its last state, at the new version).
    pub(crate) obj: Obj,
}

/// A patch, by content type.
#[derive(Clone, Debug)]
pub(crate) enum Patch {
    /// `application/apply-patch+yaml` (a JSON body), under a field manager.
    Apply { body: Value, manager: String },
    /// `application/merge-patch+json`.
    Merge(Value),
    /// `application/json-patch+json`.
    Json(Vec<PatchOperation>),
}

struct Entry {
    obj: Obj,
    /// Last apply of each (field manager, through /status).
    applied: BTreeMap<(String, bool), FieldSet>,
}

/// The double's state.
pub(crate) struct Store {
    rv: u64,
    objects: BTreeMap<Key, Entry>,
    history: VecDeque<Arc<Change>>,
    /// Highest resourceVersion no longer in the history.
    horizon: u64,
    capacity: usize,
    types: Registry,
    uids: u64,
    notify: tokio::sync::watch::Sender<u64>,
}

fn now() -> String {
    Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn meta(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj["metadata"].is_object() {
        obj["metadata"] = json!({});
    }
    obj["metadata"]
        .as_object_mut()
        .expect("just made an object")
}

fn rv_of(obj: &Value) -> Option<&str> {
    obj["metadata"]["resourceVersion"]
        .as_str()
        .filter(|s| !s.is_empty())
}

/// Whether everything but metadata and status is the same.
fn same_spec(a: &Value, b: &Value) -> bool {
    let part = |v: &Value| -> Vec<(String, Value)> {
        v.as_object()
            .map(|m| {
                m.iter()
                    .filter(|(k, _)| *k != "metadata" && *k != "status")
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default()
    };
    let (mut x, mut y) = (part(a), part(b));
    x.sort_by(|p, q| p.0.cmp(&q.0));
    y.sort_by(|p, q| p.0.cmp(&q.0));
    x == y
}

/// A label value as the API server accepts it.
fn label_value_ok(v: &str) -> bool {
    let alnum = |c: char| c.is_ascii_alphanumeric();
    v.is_empty()
        || (v.len() <= 63
            && v.starts_with(alnum)
            && v.ends_with(alnum)
            && v.chars()
                .all(|c| alnum(c) || c == '-' || c == '_' || c == '.'))
}

/// Applies a JSON patch as the API server does: a `test` for null passes
/// on a missing path (kube-runtime's finalizer helper relies on that), and
/// a failed `test` is 422.
fn json_patch(doc: &mut Value, ops: &[PatchOperation]) -> Result<(), ApiError> {
    for op in ops {
        if let PatchOperation::Test(t) = op
            && t.value.is_null()
        {
            match doc.pointer(t.path.as_str()) {
                None | Some(Value::Null) => continue,
                Some(_) => {
                    return Err(ApiError::invalid(format!(
                        "the server rejected our request due to an error in our request: testing value {} failed",
                        t.path.as_str()
                    )));
                }
            }
        }
        json_patch::patch(doc, std::slice::from_ref(op)).map_err(|e| {
            ApiError::invalid(format!(
                "the server rejected our request due to an error in our request: {e}"
            ))
        })?;
    }
    Ok(())
}

/// 409 when `uid` is given and is not `current`'s, as the API server
/// answers a write or a delete meant for an object since replaced.
fn uid_precondition(uid: Option<&str>, current: &Value) -> Result<(), ApiError> {
    let now = current["metadata"]["uid"].as_str().unwrap_or_default();
    match uid {
        Some(u) if u != now => Err(ApiError::conflict(format!(
            "Precondition failed: UID in precondition: {u}, UID in object meta: {now}"
        ))),
        _ => Ok(()),
    }
}

/// The longest object name (a DNS subdomain).
const MAX_NAME: usize = 253;

/// The server-managed parts of metadata a client cannot write.
const SERVER_FIELDS: &[&str] = &[
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
    "managedFields",
    "selfLink",
];

impl Store {
    /// An empty cluster keeping the last `capacity` changes for watches.
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            rv: 1,
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            horizon: 0,
            capacity,
            types: Registry::default(),
            uids: 0,
            notify: tokio::sync::watch::channel(1).0,
        }
    }

    /// Wakes on every change.
    pub(crate) fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.notify.subscribe()
    }

    /// The resource a path names, checked against its scope.
    pub(crate) fn resolve(&self, t: &Target) -> Result<ResourceType, ApiError> {
        let missing = || ApiError::not_found("the server could not find the requested resource");
        let ty = self.types.get(&t.group, &t.resource).ok_or_else(missing)?;
        if t.namespace.is_some() && !ty.namespaced
            || t.name.is_some() && ty.namespaced != t.namespace.is_some()
        {
            return Err(missing());
        }
        match t.sub.as_deref() {
            None => {}
            Some("status") if ty.status => {}
            Some(_) => return Err(missing()),
        }
        Ok(ty.clone())
    }

    /// The type, name and key of a request on one object; `unnamed` is why
    /// the same request without a name is refused.
    fn one(
        &self,
        t: &Target,
        unnamed: &'static str,
    ) -> Result<(ResourceType, String, Key), ApiError> {
        let ty = self.resolve(t)?;
        let name = t
            .name
            .clone()
            .ok_or_else(|| ApiError::method_not_allowed(unnamed))?;
        let key = Self::key(t, &name);
        Ok((ty, name, key))
    }

    fn key(t: &Target, name: &str) -> Key {
        Key {
            group: t.group.clone(),
            resource: t.resource.clone(),
            namespace: t.namespace.clone().unwrap_or_default(),
            name: name.to_owned(),
        }
    }

    fn not_found(t: &Target, name: &str) -> ApiError {
        ApiError::not_found(format!("{} \"{name}\" not found", t.qualified()))
    }

    /// GET of one object.
    pub(crate) fn get(&self, t: &Target) -> Result<Obj, ApiError> {
        self.resolve(t)?;
        let name = t.name.as_deref().unwrap_or_default();
        self.objects
            .get(&Self::key(t, name))
            .map(|e| e.obj.clone())
            .ok_or_else(|| Self::not_found(t, name))
    }

    /// LIST: every matching object (no paging) and the current resourceVersion.
    pub(crate) fn list(&self, t: &Target, sel: &Selector) -> Result<(Vec<Obj>, u64), ApiError> {
        self.resolve(t)?;
        let from = Key {
            group: t.group.clone(),
            resource: t.resource.clone(),
            namespace: t.namespace.clone().unwrap_or_default(),
            name: String::new(),
        };
        let items = self
            .objects
            .range(from..)
            .take_while(|(k, _)| {
                k.group == t.group
                    && k.resource == t.resource
                    && t.namespace.as_ref().is_none_or(|ns| &k.namespace == ns)
            })
            .filter(|(_, e)| sel.matches(&e.obj))
            .map(|(_, e)| e.obj.clone())
            .collect();
        Ok((items, self.rv))
    }

    /// Changes after `from`, and the resourceVersion they reach; 410 when
    /// some of them are no longer kept.
    pub(crate) fn changes_since(&self, from: u64) -> Result<(Vec<Arc<Change>>, u64), ApiError> {
        if from < self.horizon {
            return Err(ApiError::gone(format!(
                "too old resource version: {from} ({})",
                self.horizon + 1
            )));
        }
        let i = self.history.partition_point(|c| c.rv <= from);
        Ok((self.history.range(i..).cloned().collect(), self.rv))
    }

    fn namespace_exists(&self, t: &Target, ty: &ResourceType) -> Result<(), ApiError> {
        let Some(ns) = t.namespace.as_ref().filter(|_| ty.namespaced) else {
            return Ok(());
        };
        let key = Key {
            group: String::new(),
            resource: "namespaces".into(),
            namespace: String::new(),
            name: ns.clone(),
        };
        if self.objects.contains_key(&key) {
            Ok(())
        } else {
            Err(ApiError::not_found(format!(
                "namespaces \"{ns}\" not found"
            )))
        }
    }

    /// Fills in what the server sets on a new object.
    fn fresh(&mut self, t: &Target, ty: &ResourceType, obj: &mut Value, name: &str) {
        self.uids += 1;
        let uid = format!(
            "5ca1e000-0000-4000-8000-{:012x}",
            self.uids + (u64::from(std::process::id()) << 24)
        );
        if ty.status && t.resource != "customresourcedefinitions" {
            // As for a CRD with a status subresource: status is not the
            // creator's to set.
            if let Some(m) = obj.as_object_mut() {
                m.remove("status");
            }
        }
        if obj["apiVersion"].as_str().is_none_or(str::is_empty) {
            obj["apiVersion"] = json!(t.api_version());
        }
        if obj["kind"].as_str().is_none_or(str::is_empty) {
            obj["kind"] = json!(ty.kind);
        }
        let m = meta(obj);
        for f in SERVER_FIELDS {
            m.remove(*f);
        }
        m.remove("generateName");
        m.insert("name".into(), json!(name));
        if let Some(ns) = &t.namespace {
            m.insert("namespace".into(), json!(ns));
        }
        m.insert("uid".into(), json!(uid));
        m.insert("creationTimestamp".into(), json!(now()));
        m.insert("generation".into(), json!(1));
    }

    /// POST.
    pub(crate) fn create(&mut self, t: &Target, mut body: Value) -> Result<Obj, ApiError> {
        let ty = self.resolve(t)?;
        if t.name.is_some() || t.sub.is_some() {
            return Err(ApiError::method_not_allowed(
                "create needs a collection path",
            ));
        }
        if !body.is_object() {
            return Err(ApiError::bad_request("the body is not a JSON object"));
        }
        if ty.namespaced && t.namespace.is_none() {
            return Err(ApiError::not_found(
                "a namespaced object is created in its namespace's path",
            ));
        }
        if let (Some(ns), Some(sent)) = (&t.namespace, body["metadata"]["namespace"].as_str())
            && ns != sent
        {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        let name = match (
            body["metadata"]["name"].as_str(),
            body["metadata"]["generateName"].as_str(),
        ) {
            (Some(n), _) if !n.is_empty() => n.to_owned(),
            (_, Some(prefix)) => format!("{prefix}{:05x}", self.uids % 0x100000),
            _ => {
                return Err(ApiError::invalid(
                    "metadata.name: Required value: name or generateName is required",
                ));
            }
        };
        if name.len() > MAX_NAME {
            return Err(ApiError::invalid(format!(
                "metadata.name: Invalid value: \"{name}\": must be no more than {MAX_NAME} characters"
            )));
        }
        self.namespace_exists(t, &ty)?;
        let key = Self::key(t, &name);
        if self.objects.contains_key(&key) {
            return Err(ApiError::already_exists(format!(
                "{} \"{name}\" already exists",
                t.qualified()
            )));
        }
        self.fresh(t, &ty, &mut body, &name);
        self.commit(&key, &ty, None, body, false)
    }

    /// PUT.
    pub(crate) fn replace(&mut self, t: &Target, body: Value) -> Result<Obj, ApiError> {
        let (ty, name, key) = self.one(t, "update needs an object path")?;
        let old = self
            .objects
            .get(&key)
            .map(|e| e.obj.clone())
            .ok_or_else(|| Self::not_found(t, &name))?;
        if body["metadata"]["name"].as_str() != Some(name.as_str()) {
            return Err(ApiError::bad_request(
                "the name of the object does not match the name on the URL",
            ));
        }
        Self::precondition(t, &name, &body, &old)?;
        let new = Self::through(&ty, t, &old, body);
        self.commit(&key, &ty, Some(old), new, false)
    }

    /// 409 when `sent` names a uid or a resourceVersion other than
    /// `current`'s: the object written is not the one the client read.
    fn precondition(t: &Target, name: &str, sent: &Value, current: &Value) -> Result<(), ApiError> {
        uid_precondition(sent["metadata"]["uid"].as_str(), current)?;
        match rv_of(sent) {
            Some(rv) if Some(rv) != rv_of(current) => Err(ApiError::conflict(format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                t.qualified()
            ))),
            _ => Ok(()),
        }
    }

    /// What a write through `t` may change of `old`: with a status
    /// subresource, the object's path leaves status alone and `/status`
    /// changes nothing else.
    fn through(ty: &ResourceType, t: &Target, old: &Value, mut new: Value) -> Value {
        if !ty.status {
            return new;
        }
        let status_of = |v: &Value| v.get("status").cloned();
        let (mut out, status) = if t.sub.is_some() {
            (old.clone(), status_of(&new))
        } else {
            let s = status_of(old);
            (std::mem::take(&mut new), s)
        };
        if let Some(m) = out.as_object_mut() {
            match status {
                Some(s) => m.insert("status".into(), s),
                None => m.remove("status"),
            };
        }
        out
    }

    /// PATCH (and server-side apply, which may create).
    pub(crate) fn patch(&mut self, t: &Target, patch: Patch) -> Result<Obj, ApiError> {
        let (ty, name, key) = self.one(t, "patch needs an object path")?;
        let old = self.objects.get(&key).map(|e| e.obj.clone());
        let status_sub = t.sub.is_some();
        let (new, applied) = match patch {
            Patch::Merge(p) => {
                let old = old.as_ref().ok_or_else(|| Self::not_found(t, &name))?;
                Self::precondition(t, &name, &p, old)?;
                let mut doc = (**old).clone();
                json_patch::merge(&mut doc, &p);
                (Self::through(&ty, t, old, doc), None)
            }
            Patch::Json(ops) => {
                let old = old.as_ref().ok_or_else(|| Self::not_found(t, &name))?;
                let mut doc = (**old).clone();
                json_patch(&mut doc, &ops)?;
                Self::precondition(t, &name, &doc, old)?;
                (Self::through(&ty, t, old, doc), None)
            }
            Patch::Apply { body, manager } => {
                if !body.is_object() {
                    return Err(ApiError::bad_request("the apply body is not a JSON object"));
                }
                if body["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n != name.as_str())
                {
                    return Err(ApiError::bad_request(
                        "the name of the object does not match the name on the URL",
                    ));
                }
                if let Some(old) = &old {
                    Self::precondition(t, &name, &body, old)?;
                }
                let mut applied = body;
                for f in SERVER_FIELDS {
                    meta(&mut applied).remove(*f);
                }
                if ty.status
                    && let Some(m) = applied.as_object_mut()
                {
                    if status_sub {
                        m.retain(|k, _| k == "status" || k == "apiVersion" || k == "kind");
                    } else {
                        m.remove("status");
                    }
                }
                let new_set = apply::fields(&applied, &ty.list_keys);
                let mut doc = match &old {
                    Some(o) => (**o).clone(),
                    None if status_sub => return Err(Self::not_found(t, &name)),
                    None => {
                        self.namespace_exists(t, &ty)?;
                        let mut fresh = json!({});
                        self.fresh(t, &ty, &mut fresh, &name);
                        fresh
                    }
                };
                apply::merge(&mut doc, &applied, &ty.list_keys);
                let who = (manager, status_sub);
                if let Some(entry) = self.objects.get(&key) {
                    let empty = FieldSet::new();
                    let before = entry.applied.get(&who).unwrap_or(&empty);
                    let others = entry
                        .applied
                        .iter()
                        .filter(|(k, _)| **k != who)
                        .map(|(_, v)| v);
                    apply::drop_omitted(&mut doc, before, &new_set, others, &ty.list_keys);
                }
                let doc = match &old {
                    Some(o) => Self::through(&ty, t, o, doc),
                    None => doc,
                };
                (doc, Some((who, new_set)))
            }
        };
        let obj = self.commit(&key, &ty, old, new, false)?;
        if let (Some((who, set)), Some(entry)) = (applied, self.objects.get_mut(&key)) {
            entry.applied.insert(who, set);
        }
        Ok(obj)
    }

    /// DELETE: an object with finalizers only gets its deletionTimestamp.
    /// `pre` are the DeleteOptions' preconditions (uid, resourceVersion),
    /// Null when none were sent.
    pub(crate) fn delete(&mut self, t: &Target, pre: &Value) -> Result<Obj, ApiError> {
        let (ty, name, key) = self.one(t, "deletecollection is not served")?;
        if t.sub.is_some() {
            return Err(ApiError::method_not_allowed("a subresource is not deleted"));
        }
        let old = self
            .objects
            .get(&key)
            .map(|e| e.obj.clone())
            .ok_or_else(|| Self::not_found(t, &name))?;
        uid_precondition(pre["uid"].as_str(), &old)?;
        if let Some(rv) = pre["resourceVersion"].as_str()
            && Some(rv) != rv_of(&old)
        {
            return Err(ApiError::conflict(format!(
                "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                rv_of(&old).unwrap_or_default()
            )));
        }
        let finalizers = old["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        if finalizers {
            if old["metadata"]["deletionTimestamp"].is_string() {
                return Ok(old);
            }
            let mut new = (*old).clone();
            let m = meta(&mut new);
            m.insert("deletionTimestamp".into(), json!(now()));
            m.insert("deletionGracePeriodSeconds".into(), json!(0));
            return self.commit(&key, &ty, Some(old), new, true);
        }
        let last = self.remove(&key, old);
        self.cascade(&key, &last);
        Ok(last)
    }

    /// A test's back door: stores `obj` at the object path `t` as it is
    /// (its uid, labels, owners and status kept; what the server sets and
    /// the object lacks filled in), with no namespace needed, as if some
    /// other client had written it. An object of another uid already there
    /// is deleted first: the new one takes its name.
    pub(crate) fn put(&mut self, t: &Target, mut obj: Value) -> Result<Obj, ApiError> {
        let (ty, _, key) = self.one(t, "put needs an object path")?;
        if !obj.is_object() {
            return Err(ApiError::bad_request("the object is not a JSON object"));
        }
        let mut old = self.objects.get(&key).map(|e| e.obj.clone());
        if let Some(o) = old.clone()
            && obj["metadata"]["uid"]
                .as_str()
                .is_some_and(|u| o["metadata"]["uid"].as_str() != Some(u))
        {
            self.remove(&key, o);
            old = None;
        }
        if obj["apiVersion"].as_str().is_none_or(str::is_empty) {
            obj["apiVersion"] = json!(t.api_version());
        }
        if obj["kind"].as_str().is_none_or(str::is_empty) {
            obj["kind"] = json!(ty.kind);
        }
        if old.is_none() {
            self.uids += 1;
            let uid = format!("5ca1e000-0000-4000-8000-{:012x}", self.uids);
            let m = meta(&mut obj);
            m.entry("uid").or_insert_with(|| json!(uid));
            m.entry("creationTimestamp").or_insert_with(|| json!(now()));
            m.entry("generation").or_insert_with(|| json!(1));
        }
        meta(&mut obj).remove("resourceVersion");
        self.commit(&key, &ty, old, obj, false)
    }

    /// Removes the object at `key` (whose current state is `old`), as a change.
    fn remove(&mut self, key: &Key, old: Obj) -> Obj {
        self.objects.remove(key);
        self.rv += 1;
        let mut last = (*old).clone();
        meta(&mut last).insert("resourceVersion".into(), json!(self.rv.to_string()));
        let last = Arc::new(last);
        self.record(key, ChangeType::Deleted, Some(old), last.clone());
        last
    }

    /// What goes with a deleted namespace (its objects) or CRD (its
    /// objects, and the resource). The API server's controllers do this a
    /// moment later and wait for finalizers; the double does it at once.
    fn cascade(&mut self, key: &Key, gone: &Value) {
        let doomed: Vec<Key> = match (key.group.as_str(), key.resource.as_str()) {
            ("", "namespaces") => self
                .objects
                .keys()
                .filter(|k| k.namespace == key.name)
                .cloned()
                .collect(),
            ("apiextensions.k8s.io", "customresourcedefinitions") => {
                let group = gone["spec"]["group"].as_str().unwrap_or_default();
                let plural = gone["spec"]["names"]["plural"].as_str().unwrap_or_default();
                self.types.forget(group, plural);
                self.objects
                    .keys()
                    .filter(|k| k.group == group && k.resource == plural)
                    .cloned()
                    .collect()
            }
            _ => return,
        };
        for k in doomed {
            if let Some(old) = self.objects.get(&k).map(|e| e.obj.clone()) {
                self.remove(&k, old);
            }
        }
    }

    /// Server-side effects of writing some kinds.
    fn effects(&mut self, key: &Key, obj: &mut Value) -> Result<(), ApiError> {
        match (key.group.as_str(), key.resource.as_str()) {
            ("", "secrets") => {
                // The API server stores stringData base64-encoded under data.
                if let Some(Value::Object(sd)) =
                    obj.as_object_mut().and_then(|m| m.remove("stringData"))
                {
                    if !obj["data"].is_object() {
                        obj["data"] = json!({});
                    }
                    for (k, v) in sd {
                        let text = v.as_str().unwrap_or_default();
                        obj["data"][k] = json!(
                            base64::engine::general_purpose::STANDARD.encode(text.as_bytes())
                        );
                    }
                }
            }
            ("", "namespaces") => obj["status"] = json!({"phase": "Active"}),
            ("apiextensions.k8s.io", "customresourcedefinitions") => {
                if self.types.learn(obj).is_none() {
                    return Err(ApiError::invalid(
                        "spec: a CustomResourceDefinition needs group, names and versions",
                    ));
                }
                let names = obj["spec"]["names"].clone();
                let versions: Vec<Value> = obj["spec"]["versions"]
                    .as_array()
                    .map(|vs| vs.iter().map(|v| v["name"].clone()).collect())
                    .unwrap_or_default();
                let t = now();
                obj["status"] = json!({
                    "acceptedNames": names,
                    "storedVersions": versions,
                    "conditions": [
                        {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": t},
                        {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": t},
                    ],
                });
            }
            _ => {}
        }
        Ok(())
    }

    /// Stores `new` in place of `old` (None: a new object).
    fn commit(
        &mut self,
        key: &Key,
        ty: &ResourceType,
        old: Option<Obj>,
        mut new: Value,
        deleting: bool,
    ) -> Result<Obj, ApiError> {
        self.effects(key, &mut new)?;
        if let Some(o) = &old {
            let m = meta(&mut new);
            for f in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
            ] {
                if deleting && f.starts_with("deletion") {
                    continue;
                }
                match o["metadata"].get(f) {
                    Some(v) => m.insert(f.into(), v.clone()),
                    None => m.remove(f),
                };
            }
        }
        let m = meta(&mut new);
        m.insert("name".into(), json!(key.name));
        if ty.namespaced {
            m.insert("namespace".into(), json!(key.namespace));
        }
        m.remove("managedFields");
        m.remove("selfLink");
        for (f, empty) in [
            ("finalizers", json!([])),
            ("ownerReferences", json!([])),
            ("labels", json!({})),
            ("annotations", json!({})),
        ] {
            if m.get(f).is_some_and(|v| v.is_null() || *v == empty) {
                m.remove(f);
            }
        }
        if let Some(Value::Object(labels)) = m.get("labels")
            && let Some((k, v)) = labels
                .iter()
                .find(|(_, v)| !v.as_str().is_some_and(label_value_ok))
        {
            return Err(ApiError::invalid(format!(
                "metadata.labels: Invalid value: {v}: a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character, at most 63 characters (label {k})"
            )));
        }
        if let Some(o) = &old {
            let finalizers = |v: &Value| -> Vec<Value> {
                v["metadata"]["finalizers"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            };
            if o["metadata"]["deletionTimestamp"].is_string() {
                let before = finalizers(o);
                if finalizers(&new).iter().any(|f| !before.contains(f)) {
                    return Err(ApiError::invalid(
                        "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted",
                    ));
                }
            }
            let generation = o["metadata"]["generation"].as_i64().unwrap_or(1);
            let generation = if same_spec(o, &new) {
                generation
            } else {
                generation + 1
            };
            let m = meta(&mut new);
            m.insert("generation".into(), json!(generation));
            m.insert(
                "resourceVersion".into(),
                json!(rv_of(o).unwrap_or_default()),
            );
            if **o == new {
                return Ok(o.clone());
            }
        }
        self.rv += 1;
        meta(&mut new).insert("resourceVersion".into(), json!(self.rv.to_string()));
        let gone = new["metadata"]["deletionTimestamp"].is_string()
            && new["metadata"]["finalizers"]
                .as_array()
                .is_none_or(|f| f.is_empty());
        let obj = Arc::new(new);
        if gone {
            self.objects.remove(key);
            self.record(key, ChangeType::Deleted, old, obj.clone());
            self.cascade(key, &obj);
            return Ok(obj);
        }
        let kind = if old.is_some() {
            ChangeType::Modified
        } else {
            ChangeType::Added
        };
        match self.objects.get_mut(key) {
            Some(e) => e.obj = obj.clone(),
            None => {
                self.objects.insert(
                    key.clone(),
                    Entry {
                        obj: obj.clone(),
                        applied: BTreeMap::new(),
                    },
                );
            }
        }
        self.record(key, kind, old, obj.clone());
        Ok(obj)
    }

    fn record(&mut self, key: &Key, kind: ChangeType, prev: Option<Obj>, obj: Obj) {
        self.history.push_back(Arc::new(Change {
            rv: self.rv,
            group: key.group.clone(),
            resource: key.resource.clone(),
            namespace: key.namespace.clone(),
            kind,
            prev,
            obj,
        }));
        while self.history.len() > self.capacity {
            if let Some(c) = self.history.pop_front() {
                self.horizon = c.rv;
            }
        }
        self.notify.send_replace(self.rv);
    }
}
