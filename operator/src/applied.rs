//! What the operator last wrote of each object a pool renders (and of its
//! path-test grants), so that a pass that would write the same thing again
//! writes nothing.
//!
//! The pool controller looks again every 10 s (agents' heartbeats are not
//! watched events). Applying each rendered object on every look cost a
//! request per object per pass for nothing: a server-side apply that
//! changes nothing is still a request for the API server to decode, merge
//! and compare. An object is applied again only when it is not as the
//! operator last left it: its uid or resourceVersion moved (someone
//! changed it, or it was made anew), or what the pool renders changed. A
//! restarted operator remembers nothing and applies each object once.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

use serde::Serialize;

/// An object by kind, namespace and name.
pub type Key = (String, String, String);

/// How the operator last left an object.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Left {
    uid: String,
    resource_version: String,
    rendered: u64,
}

/// The objects the operator wrote, as it left them.
#[derive(Debug, Default)]
pub struct Applied {
    by_key: HashMap<Key, Left>,
}

/// The key of `obj`.
pub fn key_of<K: kube::Resource<DynamicType = ()>>(obj: &K) -> Key {
    let m = obj.meta();
    (
        K::kind(&()).into_owned(),
        m.namespace.clone().unwrap_or_default(),
        m.name.clone().unwrap_or_default(),
    )
}

/// A fingerprint of what is rendered, to tell whether it changed. Only
/// compared within one process, so the hasher need not be stable across
/// versions.
pub fn rendered<T: Serialize>(obj: &T) -> u64 {
    let mut h = DefaultHasher::new();
    serde_json::to_string(obj).unwrap_or_default().hash(&mut h);
    h.finish()
}

impl Applied {
    /// Whether the object at `key`, now at `uid` and `resource_version`,
    /// is still as the operator left it after writing `rendered`: then
    /// writing it again would change nothing.
    pub fn unchanged(
        &self,
        key: &Key,
        uid: &str,
        resource_version: Option<&str>,
        rendered: u64,
    ) -> bool {
        self.by_key.get(key).is_some_and(|l| {
            l.uid == uid
                && Some(l.resource_version.as_str()) == resource_version
                && l.rendered == rendered
        })
    }

    /// The operator wrote `rendered` to `key`, which then had `uid` and
    /// `resource_version`. Without them (an answer that lacks them) the
    /// object is forgotten, and written again on the next pass.
    pub fn record(
        &mut self,
        key: Key,
        uid: Option<String>,
        resource_version: Option<String>,
        rendered: u64,
    ) {
        match (uid, resource_version) {
            (Some(uid), Some(resource_version)) => {
                self.by_key.insert(
                    key,
                    Left {
                        uid,
                        resource_version,
                        rendered,
                    },
                );
            }
            _ => {
                self.by_key.remove(&key);
            }
        }
    }

    /// Forgets the objects whose key matches `gone` (a deleted pool's).
    pub fn forget(&mut self, gone: impl Fn(&Key) -> bool) {
        self.by_key.retain(|k, _| !gone(k));
    }

    /// Forgets every object, as a restarted operator would.
    pub fn clear(&mut self) {
        self.by_key.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> Key {
        ("StatefulSet".into(), "ns".into(), name.into())
    }

    #[test]
    fn an_object_is_written_again_only_when_it_or_its_rendering_moved() {
        let mut a = Applied::default();
        let r = rendered(&serde_json::json!({"spec": {"replicas": 2}}));
        // Never written by this process: write it.
        assert!(!a.unchanged(&key("x"), "u1", Some("10"), r));
        a.record(key("x"), Some("u1".into()), Some("10".into()), r);
        assert!(a.unchanged(&key("x"), "u1", Some("10"), r));
        // Someone changed it, it was made anew, or the pool renders
        // something else: write it.
        assert!(!a.unchanged(&key("x"), "u1", Some("11"), r));
        assert!(!a.unchanged(&key("x"), "u2", Some("10"), r));
        let r2 = rendered(&serde_json::json!({"spec": {"replicas": 3}}));
        assert_ne!(r, r2);
        assert!(!a.unchanged(&key("x"), "u1", Some("10"), r2));
        assert!(!a.unchanged(&key("x"), "u1", None, r));
        assert!(!a.unchanged(&key("y"), "u1", Some("10"), r));
        // An answer without a version is not remembered.
        a.record(key("x"), Some("u1".into()), None, r);
        assert!(!a.unchanged(&key("x"), "u1", Some("10"), r));
        a.record(key("x"), Some("u1".into()), Some("12".into()), r);
        a.record(key("y"), Some("u2".into()), Some("13".into()), r);
        a.forget(|(_, _, name)| name == "y");
        assert!(a.unchanged(&key("x"), "u1", Some("12"), r));
        assert!(!a.unchanged(&key("y"), "u2", Some("13"), r));
        a.clear();
        assert!(!a.unchanged(&key("x"), "u1", Some("12"), r));
    }
}
