//! The DtnPool controller: what it renders and in what order, names it
//! leaves to their owners, consent by namespace, and what its status and
//! Events say.

use super::*;

#[tokio::test]
async fn pool_renders_agents_and_reports_status() {
    let mut d = Cluster::new().await;
    let p: DtnPool = finalized(lustre_pool(), pool_controller::POOL_FINALIZER);
    d.pool(&p);
    let mut l = lease("lustre-dtn", "lustre-dtn-agent-0", now(), None);
    l.metadata.namespace = Some("research-data".into());
    d.lease(&l);

    // beamline-7, which the pool offers to serve, consents.
    d.binding(&binding("beamline-7", "research-data", "lustre-dtn"));
    // The first pass creates; a restarted operator, which remembers
    // nothing it wrote, applies over what is the pool's.
    pool_controller::reconcile(Arc::new(p.clone()), d.ctx.clone())
        .await
        .expect("reconcile");
    lock(&d.ctx.applied).clear();
    let first = d.calls().len();
    pool_controller::reconcile(Arc::new(p.clone()), d.ctx.clone())
        .await
        .expect("reconcile");
    let second = d.calls().len();
    // Then a pass with nothing moved writes none of the pool's objects
    // (the pool controller looks every 10 s; it once applied every object
    // each time). Its status is left out here: this pool is the one
    // passed in, without the status the passes wrote.
    pool_controller::reconcile(Arc::new(p), d.ctx.clone())
        .await
        .expect("reconcile");
    let idle: Vec<_> = d
        .calls()
        .into_iter()
        .skip(second)
        .filter(|c| c.method != "GET" && !c.path.ends_with("/events"))
        .filter(|c| !c.path.ends_with("/status"))
        .collect();
    assert!(idle.is_empty(), "a pass with nothing moved wrote {idle:#?}");

    let calls: Vec<_> = d
        .calls()
        .into_iter()
        .skip(first)
        .take(second - first)
        .filter(|c| c.method != "GET" && !c.path.ends_with("/events"))
        .collect();
    let order: Vec<&str> = calls
        .iter()
        .map(|c| c.path.rsplit('/').nth(1).unwrap_or(""))
        .collect();
    assert_eq!(
        order,
        [
            "serviceaccounts",
            "roles",
            "rolebindings",
            "roles",
            "rolebindings",
            "services",
            "statefulsets",
            "lustre-dtn"
        ],
        "{calls:#?}"
    );
    for c in &calls {
        assert!(c.is_apply() && c.forced(), "server-side apply: {c:?}");
        assert_eq!(
            c.field_manager().as_deref(),
            Some("wirerate-operator"),
            "{c:?}"
        );
    }
    let sts = &calls
        .iter()
        .find(|c| c.path.contains("/statefulsets/"))
        .unwrap()
        .body;
    let pod = &sts["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(
        pod["containers"][0]["resources"]["limits"]["hugepages-2Mi"],
        "1Gi"
    );
    assert_eq!(pod["tolerations"][0]["key"], "wirerate.io/dtn");
    assert_eq!(pod["volumes"][0]["hostPath"]["path"], "/lustre");
    assert_eq!(
        pod["containers"][0]["securityContext"]["capabilities"]["add"],
        serde_json::json!(["IPC_LOCK", "NET_ADMIN"])
    );
    assert_eq!(sts["metadata"]["ownerReferences"][0]["kind"], "DtnPool");
    // The Role in the other namespace the pool serves.
    assert!(
        calls
            .iter()
            .any(|c| c.path.contains("/namespaces/beamline-7/roles/"))
    );

    let s = d.last_status("/dtnpools/lustre-dtn");
    assert_eq!(s["readyAgents"], 1);
    assert_eq!(s["agents"][0]["name"], "lustre-dtn-agent-0");
    let ready = s["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap();
    assert_eq!(ready["status"], "False", "1 of 2 agents: {ready}");
}

// Found against a real API server: a DtnPool `db` rewrote a user's
// Postgres Service `db-agent`, failed on every pass over a user's
// StatefulSet of that name, and took over (then, with its deletion,
// deleted) another team's ServiceAccount, Role and RoleBinding.
#[tokio::test]
async fn names_another_owner_holds_are_neither_rewritten_nor_taken() {
    let objects = [
        ("Service", "/api/v1/namespaces/data/services/db-agent"),
        (
            "ServiceAccount",
            "/api/v1/namespaces/data/serviceaccounts/db-agent",
        ),
        (
            "Role",
            "/apis/rbac.authorization.k8s.io/v1/namespaces/data/roles/db-agent",
        ),
        (
            "RoleBinding",
            "/apis/rbac.authorization.k8s.io/v1/namespaces/data/rolebindings/db-agent",
        ),
        (
            "StatefulSet",
            "/apis/apps/v1/namespaces/data/statefulsets/db-agent",
        ),
    ];
    for (kind, path) in objects {
        let mut d = Cluster::new().await;
        let p = finalized(pool("db", "/in"), pool_controller::POOL_FINALIZER);
        d.pool(&p);
        let theirs = serde_json::json!({
            "kind": kind,
            "metadata": {"name": "db-agent", "namespace": "data", "uid": "theirs",
                         "labels": {"app": "db"}},
            "spec": {"selector": {"app": "db"}, "ports": [{"port": 5432}]},
        });
        d.put(path, &theirs);
        // As stored: the API server's fields (resourceVersion among them) too.
        let stored = d.object_at(path);
        assert_eq!(stored["metadata"]["uid"], "theirs");
        pool_controller::reconcile(Arc::new(p), d.ctx.clone())
            .await
            .unwrap_or_else(|e| panic!("{kind}: {e}"));
        assert_eq!(d.object_at(path), stored, "{kind} left as it was");
        assert!(
            !d.calls()
                .iter()
                .any(|c| c.method != "GET" && c.path.ends_with(path)),
            "{kind}: {:#?}",
            d.calls()
        );
        let taken = condition(&d, "/dtnpools/db", "NameTaken");
        assert_eq!(taken["status"], "True", "{kind}");
        let message = taken["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("{kind} data/db-agent ")),
            "{message}"
        );
        let event = d
            .calls()
            .into_iter()
            .find(|c| c.path.ends_with("/events") && c.body["reason"] == "NameTaken")
            .unwrap_or_else(|| panic!("{kind}: a NameTaken Event"));
        assert_eq!(event.body["type"], "Warning");
        // Agents never run as, or bound to, someone else's identity.
        if kind != "Service" && kind != "StatefulSet" {
            assert!(
                !d.has("/apis/apps/v1/namespaces/data/statefulsets/db-agent"),
                "{kind}"
            );
        }
    }
}

#[tokio::test]
async fn the_pools_own_objects_are_created_then_applied_over_by_uid_when_they_moved() {
    let mut d = Cluster::new().await;
    let p = finalized(pool("db", "/in"), pool_controller::POOL_FINALIZER);
    d.pool(&p);
    let path = "/apis/apps/v1/namespaces/data/statefulsets/db-agent";
    let pass = || pool_controller::reconcile(Arc::new(p.clone()), d.ctx.clone());
    pass().await.expect("reconcile");
    pass().await.expect("reconcile");
    // Someone scales the StatefulSet by hand: the next pass takes it back.
    let mut sts = d.object_at(path);
    sts["spec"]["replicas"] = serde_json::json!(7);
    d.put(path, &sts);
    pass().await.expect("reconcile");
    pass().await.expect("reconcile");
    assert_eq!(d.object_at(path)["spec"]["replicas"], p.spec.replicas);
    let uid = d.object_at(path)["metadata"]["uid"].clone();
    let writes: Vec<_> = d
        .calls()
        .into_iter()
        .filter(|c| c.method != "GET" && c.path.contains("/statefulsets"))
        .map(|c| (c.method, c.body["metadata"]["uid"].clone()))
        .collect();
    // Created, left alone while it stayed as written, applied over (by
    // uid) once it moved, and left alone again.
    assert_eq!(
        writes,
        [
            ("POST".to_owned(), serde_json::Value::Null),
            ("PATCH".to_owned(), uid)
        ]
    );
    let taken = condition(&d, "/dtnpools/db", "NameTaken");
    assert_eq!(taken["status"], "False");
    assert_eq!(condition(&d, "/dtnpools/db", "Rendered")["status"], "True");
}

#[tokio::test]
async fn a_write_that_fails_partway_shows_in_the_pools_status() {
    let mut d = Cluster::new().await;
    let p = finalized(pool("db", "/in"), pool_controller::POOL_FINALIZER);
    d.pool(&p);
    d.unavailable("/apis/rbac.authorization.k8s.io/v1/namespaces/data/roles/db-agent");
    let failed = pool_controller::reconcile(Arc::new(p), d.ctx.clone()).await;
    assert!(failed.is_err(), "retried");
    let rendered = condition(&d, "/dtnpools/db", "Rendered");
    assert_eq!(rendered["status"], "False");
    assert!(
        rendered["message"]
            .as_str()
            .unwrap()
            .contains("Role data/db-agent"),
        "{rendered}"
    );
    assert!(!d.has("/apis/apps/v1/namespaces/data/statefulsets/db-agent"));
}

// Found against a real API server: a pool author listed kube-system in
// allowedNamespaces and the operator gave the pool's agents Secrets there.
#[tokio::test]
async fn a_pool_gets_nothing_in_a_namespace_that_did_not_consent() {
    let mut d = Cluster::new().await;
    let mut p: DtnPool = finalized(lustre_pool(), pool_controller::POOL_FINALIZER);
    p.spec.allowed_namespaces = vec!["kube-system".into(), "beamline-7".into()];
    d.pool(&p);
    let touched = |d: &Cluster, ns: &str| {
        d.calls()
            .into_iter()
            .filter(|c| c.method != "GET" && c.path.contains(&format!("/namespaces/{ns}/")))
            .map(|c| format!("{} {}", c.method, c.path))
            .collect::<Vec<_>>()
    };
    pool_controller::reconcile(Arc::new(p.clone()), d.ctx.clone())
        .await
        .expect("reconcile");
    assert_eq!(touched(&d, "kube-system"), Vec::<String>::new());
    assert_eq!(touched(&d, "beamline-7"), Vec::<String>::new());
    let s = d.last_status("/dtnpools/lustre-dtn");
    assert_eq!(
        s["awaitingBinding"],
        serde_json::json!(["kube-system", "beamline-7"])
    );
    // The pool's own Role reads no Secrets.
    let own = d
        .calls()
        .into_iter()
        .find(|c| {
            c.is("POST", "/namespaces/research-data/roles")
                && c.body["metadata"]["name"] == "lustre-dtn-agent"
        })
        .unwrap();
    assert!(!own.body.to_string().contains("secrets"), "{}", own.body);

    // A binding in another namespace, or naming another pool, is no consent.
    d.binding(&binding("default", "research-data", "lustre-dtn"));
    d.binding(&binding("beamline-7", "research-data", "other-pool"));
    d.binding(&binding("beamline-7", "elsewhere", "lustre-dtn"));
    pool_controller::reconcile(Arc::new(p.clone()), d.ctx.clone())
        .await
        .expect("reconcile");
    assert_eq!(touched(&d, "beamline-7"), Vec::<String>::new());

    // beamline-7 consents: a Role there, with no Secrets in it.
    let consent = binding("beamline-7", "research-data", "lustre-dtn");
    d.binding(&consent);
    pool_controller::reconcile(Arc::new(p.clone()), d.ctx.clone())
        .await
        .expect("reconcile");
    let there = touched(&d, "beamline-7");
    assert_eq!(there.len(), 2, "{there:?}");
    let role = "/apis/rbac.authorization.k8s.io/v1/namespaces/beamline-7/roles/wirerate-agent.research-data.lustre-dtn";
    let rb = "/apis/rbac.authorization.k8s.io/v1/namespaces/beamline-7/rolebindings/wirerate-agent.research-data.lustre-dtn";
    assert!(d.has(role) && d.has(rb));
    let applied = d
        .calls()
        .into_iter()
        .find(|c| {
            c.path.ends_with("/namespaces/beamline-7/roles")
                && c.body["metadata"]["name"] == "wirerate-agent.research-data.lustre-dtn"
        })
        .unwrap();
    assert!(
        !applied.body.to_string().contains("secrets"),
        "{}",
        applied.body
    );
    assert_eq!(touched(&d, "kube-system"), Vec::<String>::new());
    let s = d.last_status("/dtnpools/lustre-dtn");
    assert_eq!(s["servingNamespaces"], serde_json::json!(["beamline-7"]));

    // Consent withdrawn: the access goes on the next reconcile.
    d.unbind(&consent);
    pool_controller::reconcile(Arc::new(p.clone()), d.ctx.clone())
        .await
        .expect("reconcile");
    assert!(!d.has(role) && !d.has(rb), "access revoked");

    // Consent back, then the pool stops offering: revoked too.
    d.binding(&consent);
    pool_controller::reconcile(Arc::new(p.clone()), d.ctx.clone())
        .await
        .expect("reconcile");
    assert!(d.has(role));
    p.spec.allowed_namespaces.clear();
    pool_controller::reconcile(Arc::new(p), d.ctx.clone())
        .await
        .expect("reconcile");
    assert!(!d.has(role) && !d.has(rb), "access revoked");
}

// Found against a real API server: pools got no Events, so `kubectl describe
// dtnpool` showed nothing when one degraded.
#[tokio::test]
async fn a_pool_that_degrades_says_so_once_in_an_event() {
    let mut d = Cluster::new().await;
    let mut p: DtnPool = finalized(lustre_pool(), pool_controller::POOL_FINALIZER);
    p.spec.allowed_namespaces.clear();
    d.pool(&p);
    let mut l = lease("lustre-dtn", "lustre-dtn-agent-0", now() - 600, None);
    l.metadata.namespace = Some("research-data".into());
    d.lease(&l);
    let events = |d: &Cluster| -> Vec<String> {
        d.calls()
            .into_iter()
            .filter(|c| c.method == "POST" && c.path.ends_with("/events"))
            .map(|c| c.body["reason"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    pool_controller::reconcile(Arc::new(p.clone()), d.ctx.clone())
        .await
        .expect("reconcile");
    assert_eq!(events(&d), ["AgentsLost"]);
    // Looked at again with that status stored: no second Event.
    p.status = Some(serde_json::from_value(d.last_status("/dtnpools/lustre-dtn")).unwrap());
    pool_controller::reconcile(Arc::new(p), d.ctx.clone())
        .await
        .expect("reconcile");
    assert_eq!(events(&d), ["AgentsLost"]);
}

// Found in review: a pool name longer than a label value made the cleanup's
// label selector fail, and the finalizer kept the pool for ever.
#[tokio::test]
async fn a_pool_whose_name_is_no_label_value_can_still_be_deleted() {
    let mut d = Cluster::new().await;
    let mut p: DtnPool = finalized(lustre_pool(), pool_controller::POOL_FINALIZER);
    p.metadata.name = Some("p".repeat(64));
    p.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
    d.pool(&p);
    pool_controller::reconcile(Arc::new(p), d.ctx.clone())
        .await
        .expect("cleanup goes through");
    assert!(
        !d.calls().iter().any(|c| c.query.contains("labelSelector")),
        "{:?}",
        d.calls()
    );
}

// Found by the scale bench: each pool's own status write (a heartbeat had
// moved) woke the pool again, which wrote the next heartbeat: about one
// reconcile and seven applies a second per idle pool.
#[test]
fn a_pools_own_status_write_does_not_wake_it() {
    let p = lustre_pool();
    let mut written = p.clone();
    written.status = Some(wirerate_crds::DtnPoolStatus {
        ready_agents: 3,
        ..Default::default()
    });
    assert_eq!(
        pool_controller::changed(&p),
        pool_controller::changed(&written)
    );
    let mut spec = p.clone();
    spec.metadata.generation = Some(p.metadata.generation.unwrap_or(1) + 1);
    assert_ne!(
        pool_controller::changed(&p),
        pool_controller::changed(&spec)
    );
    let mut deleted = p.clone();
    deleted.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
    assert_ne!(
        pool_controller::changed(&p),
        pool_controller::changed(&deleted)
    );
    let finalized = finalized(p.clone(), pool_controller::POOL_FINALIZER);
    assert_ne!(
        pool_controller::changed(&p),
        pool_controller::changed(&finalized)
    );
}
