//! What the double knows of each resource: its kind, its scope, whether it
//! has a status subresource, and which lists server-side apply merges by
//! key. Built-in kinds come from a fixed table; custom kinds are learnt from
//! their CustomResourceDefinitions when those are created, as an API server
//! learns them, so the Transfer's `status.reports` merge by `role` because
//! the CRD says so, not because the double was told.

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;

/// One resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ResourceType {
    /// Kind of its objects.
    pub(crate) kind: String,
    /// Namespaced or cluster-scoped.
    pub(crate) namespaced: bool,
    /// Whether `status` is a subresource (written only through `/status`).
    pub(crate) status: bool,
    /// Lists that merge by key under apply: dotted path (list items add no
    /// segment) to key fields.
    pub(crate) list_keys: BTreeMap<String, Vec<String>>,
}

/// Resources by (group, plural).
#[derive(Clone, Debug)]
pub(crate) struct Registry {
    types: HashMap<(String, String), ResourceType>,
}

/// Built-in resources the operator and the driver use:
/// (group, plural, kind, namespaced, status subresource).
const BUILTIN: &[(&str, &str, &str, bool, bool)] = &[
    ("", "namespaces", "Namespace", false, true),
    ("", "pods", "Pod", true, true),
    ("", "secrets", "Secret", true, false),
    ("", "configmaps", "ConfigMap", true, false),
    ("", "serviceaccounts", "ServiceAccount", true, false),
    ("", "services", "Service", true, true),
    ("", "events", "Event", true, false),
    ("apps", "statefulsets", "StatefulSet", true, true),
    ("coordination.k8s.io", "leases", "Lease", true, false),
    ("rbac.authorization.k8s.io", "roles", "Role", true, false),
    (
        "rbac.authorization.k8s.io",
        "rolebindings",
        "RoleBinding",
        true,
        false,
    ),
    ("events.k8s.io", "events", "Event", true, false),
    (
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        false,
        true,
    ),
];

impl Default for Registry {
    fn default() -> Self {
        let types = BUILTIN
            .iter()
            .map(|&(group, plural, kind, namespaced, status)| {
                (
                    (group.to_owned(), plural.to_owned()),
                    ResourceType {
                        kind: kind.to_owned(),
                        namespaced,
                        status,
                        // Owner references merge by uid in every kind.
                        list_keys: BTreeMap::from([(
                            "metadata.ownerReferences".to_owned(),
                            vec!["uid".to_owned()],
                        )]),
                    },
                )
            })
            .collect();
        Self { types }
    }
}

impl Registry {
    /// The resource `group`/`plural`, if known.
    pub(crate) fn get(&self, group: &str, plural: &str) -> Option<&ResourceType> {
        self.types.get(&(group.to_owned(), plural.to_owned()))
    }

    /// Forgets a custom resource whose CRD was deleted.
    pub(crate) fn forget(&mut self, group: &str, plural: &str) {
        self.types.remove(&(group.to_owned(), plural.to_owned()));
    }

    /// Learns the resource a CustomResourceDefinition defines. Returns its
    /// (group, plural), or None if the CRD is malformed.
    pub(crate) fn learn(&mut self, crd: &Value) -> Option<(String, String)> {
        let spec = &crd["spec"];
        let group = spec["group"].as_str()?.to_owned();
        let plural = spec["names"]["plural"].as_str()?.to_owned();
        let kind = spec["names"]["kind"].as_str()?.to_owned();
        let versions = spec["versions"].as_array()?;
        // The storage version's schema and subresources speak for all.
        let v = versions
            .iter()
            .find(|v| v["storage"] == Value::Bool(true))
            .or(versions.first())?;
        let mut list_keys = BTreeMap::from([(
            "metadata.ownerReferences".to_owned(),
            vec!["uid".to_owned()],
        )]);
        walk(&v["schema"]["openAPIV3Schema"], "", &mut list_keys);
        self.types.insert(
            (group.clone(), plural.clone()),
            ResourceType {
                kind,
                namespaced: spec["scope"] == "Namespaced",
                status: v["subresources"].get("status").is_some(),
                list_keys,
            },
        );
        Some((group, plural))
    }
}

/// Collects `x-kubernetes-list-type: map` lists and their keys.
fn walk(schema: &Value, path: &str, out: &mut BTreeMap<String, Vec<String>>) {
    if schema["x-kubernetes-list-type"] == "map" {
        let keys = schema["x-kubernetes-list-map-keys"]
            .as_array()
            .map(|ks| {
                ks.iter()
                    .filter_map(|k| k.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        out.insert(path.to_owned(), keys);
    }
    if let Some(props) = schema["properties"].as_object() {
        for (name, sub) in props {
            let p = if path.is_empty() {
                name.clone()
            } else {
                format!("{path}.{name}")
            };
            walk(sub, &p, out);
        }
    }
    if let Some(items) = schema.get("items") {
        walk(items, path, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;
    use wirerate_crds::{DtnPool, Transfer};

    #[test]
    fn list_map_keys_come_from_the_crds() {
        let mut r = Registry::default();
        let crd = serde_json::to_value(Transfer::crd()).unwrap();
        assert_eq!(
            r.learn(&crd),
            Some(("wirerate.io".to_owned(), "transfers".to_owned()))
        );
        let t = r.get("wirerate.io", "transfers").unwrap();
        assert!(t.status && t.namespaced);
        assert_eq!(t.list_keys["status.reports"], ["role", "agent"]);
        assert_eq!(t.list_keys["status.conditions"], ["type"]);
        r.learn(&serde_json::to_value(DtnPool::crd()).unwrap());
        assert_eq!(
            r.get("wirerate.io", "dtnpools").unwrap().list_keys["status.agents"],
            ["name"]
        );
        assert!(!r.get("coordination.k8s.io", "leases").unwrap().status);
    }
}
