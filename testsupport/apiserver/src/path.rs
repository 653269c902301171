//! Which resource a request path names. Kubernetes spells every kind the
//! same way (`/api/v1/...` for the core group, `/apis/{group}/{version}/...`
//! for the rest), so one parser serves every type the double stores.

/// What a request path points at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Target {
    /// API group; empty for the core group.
    pub(crate) group: String,
    /// API version of the path.
    pub(crate) version: String,
    /// Plural resource name (`transfers`).
    pub(crate) resource: String,
    /// Namespace of a namespaced path.
    pub(crate) namespace: Option<String>,
    /// Object name; None for a collection.
    pub(crate) name: Option<String>,
    /// Subresource (`status`).
    pub(crate) sub: Option<String>,
}

impl Target {
    /// `apiVersion` of objects at this path.
    pub(crate) fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `resource.group`, as API server messages name a resource.
    pub(crate) fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.resource.clone()
        } else {
            format!("{}.{}", self.resource, self.group)
        }
    }

    /// The resource with its subresource, as the request counts name it.
    pub(crate) fn counted_as(&self) -> String {
        match &self.sub {
            Some(s) => format!("{}/{s}", self.resource),
            None => self.resource.clone(),
        }
    }
}

/// Parses a request path; None for anything that is not a resource path
/// (discovery, `/version`, ...), which the double does not serve.
pub(crate) fn parse(path: &str) -> Option<Target> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match parts.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return None,
    };
    let t = |resource: &str, namespace: Option<&str>, name: Option<&str>, sub: Option<&str>| {
        Some(Target {
            group: group.to_owned(),
            version: version.to_owned(),
            resource: resource.to_owned(),
            namespace: namespace.map(str::to_owned),
            name: name.map(str::to_owned),
            sub: sub.map(str::to_owned),
        })
    };
    if rest.iter().any(|s| s.is_empty()) {
        return None;
    }
    match rest {
        // A namespace is itself a cluster-scoped object under the same prefix.
        ["namespaces", ns] => t("namespaces", None, Some(ns), None),
        ["namespaces", ns, sub @ ("status" | "finalize")] => {
            t("namespaces", None, Some(ns), Some(sub))
        }
        ["namespaces", ns, res] => t(res, Some(ns), None, None),
        ["namespaces", ns, res, name] => t(res, Some(ns), Some(name), None),
        ["namespaces", ns, res, name, sub] => t(res, Some(ns), Some(name), Some(sub)),
        [res] => t(res, None, None, None),
        [res, name] => t(res, None, Some(name), None),
        [res, name, sub] => t(res, None, Some(name), Some(sub)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaced_and_cluster_paths_are_told_apart() {
        let t = parse("/apis/wirerate.io/v1alpha1/namespaces/u1/transfers/t-1/status").unwrap();
        assert_eq!(
            (
                t.group.as_str(),
                t.resource.as_str(),
                t.namespace.as_deref()
            ),
            ("wirerate.io", "transfers", Some("u1"))
        );
        assert_eq!(
            (t.name.as_deref(), t.sub.as_deref()),
            (Some("t-1"), Some("status"))
        );
        assert_eq!(t.counted_as(), "transfers/status");

        let all = parse("/apis/wirerate.io/v1alpha1/transfers").unwrap();
        assert_eq!((all.namespace, all.name), (None, None));

        let ns = parse("/api/v1/namespaces/u1").unwrap();
        assert_eq!(
            (ns.resource.as_str(), ns.name.as_deref(), ns.namespace),
            ("namespaces", Some("u1"), None)
        );
        let leases = parse("/apis/coordination.k8s.io/v1/namespaces/p/leases").unwrap();
        assert_eq!(
            (leases.resource.as_str(), leases.namespace.as_deref()),
            ("leases", Some("p"))
        );
        assert_eq!(leases.api_version(), "coordination.k8s.io/v1");
        assert!(parse("/apis").is_none());
        assert!(parse("/version").is_none());
    }
}
