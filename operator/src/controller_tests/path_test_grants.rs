//! The DtnPool controller's path-test grants: the listening pool's token
//! shared with its testers, external targets' tokens granted once marked,
//! and every grant taken back when the pool no longer wants it, but never
//! one of the same name that someone else holds.

use super::*;

/// A Secret named as pool `far`'s path-test token, owned by nobody.
fn someone_elses_secret(d: &Cluster) {
    let mut theirs = k8s_openapi::api::core::v1::Secret::default();
    theirs.metadata.name = Some("wirerate-path-test.far".into());
    theirs.metadata.namespace = Some("data".into());
    d.put(
        "/api/v1/namespaces/data/secrets/wirerate-path-test.far",
        &theirs,
    );
}

/// `pool` of `data` with path tests: listening or not, testing `targets`.
fn path_testing(name: &str, root: &str, listen: bool, targets: &[&str]) -> DtnPool {
    let mut p = finalized(pool(name, root), pool_controller::POOL_FINALIZER);
    p.spec.path_tests = Some(wirerate_crds::pool::PathTests {
        listen,
        port: 7690,
        targets: targets
            .iter()
            .map(|t| wirerate_crds::pool::PathTestTarget { pool: (*t).into() })
            .collect(),
        external: vec![],
        interval_seconds: 3600,
        phase_seconds: 2,
        streams: 4,
        max_rate_mbps: 1000,
    });
    p
}

#[tokio::test]
async fn a_listening_pool_shares_its_test_token_with_its_testers_and_shows_their_results() {
    let mut d = Cluster::new().await;
    let far = path_testing("far", "/out", true, &[]);
    let near = path_testing("near", "/in", false, &["far"]);
    d.pool(&far);
    d.pool(&near);
    let mut l = wirerate_crds::AgentLease {
        address: Some("far-0.example:7700".into()),
        capacity: Some(2),
        path_test_address: Some("far-0.example:7690".into()),
        ..Default::default()
    }
    .to_lease("far", "far-0", Timestamp::now());
    l.metadata.namespace = Some("data".into());
    d.lease(&l);
    let record = wirerate_crds::lease::PathTestRecord {
        target: "far".into(),
        result: wirerate_crds::pool::PathTestResult {
            at: Time(Timestamp::now()),
            agent: "someone-else".into(),
            endpoint: "far-0.example:7690".into(),
            ok: true,
            error: None,
            single_stream_gbps: 2.5,
            gbps: 8.75,
            streams: 4,
            rtt_ms: 150.25,
            retransmits: 7,
            advised_streams: 8,
        },
    };
    let mut l = wirerate_crds::AgentLease {
        address: Some("near-0.example:7700".into()),
        capacity: Some(2),
        path_tests: vec![record],
        ..Default::default()
    }
    .to_lease("near", "near-0", Timestamp::now());
    l.metadata.namespace = Some("data".into());
    d.lease(&l);

    pool_controller::reconcile(Arc::new(far.clone()), d.ctx.clone())
        .await
        .expect("reconcile");
    let calls = d.calls();
    let created = calls
        .iter()
        .find(|c| c.method == "POST" && c.path.ends_with("/namespaces/data/secrets"))
        .expect("the token Secret is created");
    assert_eq!(created.body["metadata"]["name"], "wirerate-path-test.far");
    assert_eq!(
        created.body["metadata"]["ownerReferences"][0]["uid"],
        "uid-far"
    );
    let rb = calls
        .iter()
        .find(|c| {
            c.is(
                "PATCH",
                "/namespaces/data/rolebindings/wirerate-path-test.far.readers",
            )
        })
        .expect("its readers are bound");
    assert_eq!(
        rb.body["subjects"],
        serde_json::json!([
            {"kind": "ServiceAccount", "name": "far-agent", "namespace": "data"},
            {"kind": "ServiceAccount", "name": "near-agent", "namespace": "data"}
        ])
    );
    let role = calls
        .iter()
        .find(|c| {
            c.is(
                "PATCH",
                "/namespaces/data/roles/wirerate-path-test.far.readers",
            )
        })
        .unwrap();
    assert_eq!(
        role.body["rules"],
        serde_json::json!([{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["wirerate-path-test.far"], "verbs": ["get"]}])
    );
    // The pool's next look, with nothing moved, writes none of its grant
    // again (it once applied the Role and RoleBinding every 10 s).
    let before = d.calls().len();
    pool_controller::reconcile(Arc::new(far.clone()), d.ctx.clone())
        .await
        .expect("reconcile");
    let again: Vec<_> = d
        .calls()
        .into_iter()
        .skip(before)
        .filter(|c| c.method != "GET" && c.path.contains("wirerate-path-test.far"))
        .collect();
    assert!(again.is_empty(), "{again:#?}");

    pool_controller::reconcile(Arc::new(near.clone()), d.ctx.clone())
        .await
        .expect("reconcile");
    let s = d.last_status("/dtnpools/near");
    let t = &s["pathTests"][0];
    assert_eq!(t["target"], "far");
    assert_eq!(t["tester"], "near-0");
    assert_eq!(t["endpoint"], "far-0.example:7690");
    assert_eq!(t["last"]["gbps"], 8.75);
    // Credited to the agent whose Lease says it, not to whom it claims.
    assert_eq!(t["last"]["agent"], "near-0");
    // A tester is not a listener: it gets no token of its own.
    assert!(
        !d.calls()
            .iter()
            .any(|c| c.method != "GET" && c.path.contains("wirerate-path-test.near")),
        "{:#?}",
        d.calls()
    );
}

#[tokio::test]
async fn a_path_test_secret_someone_else_owns_is_not_handed_out() {
    let mut d = Cluster::new().await;
    let far = path_testing("far", "/out", true, &[]);
    d.pool(&far);
    someone_elses_secret(&d);
    pool_controller::reconcile(Arc::new(far), d.ctx.clone())
        .await
        .expect("reconcile");
    assert!(
        !d.calls()
            .iter()
            .any(|c| c.method == "PATCH" && c.path.ends_with("wirerate-path-test.far.readers")),
        "{:#?}",
        d.calls()
    );
}

#[tokio::test]
async fn a_pool_that_stops_listening_takes_its_grant_back() {
    let d = far_stops_listening(None).await;
    assert!(!d.has(FAR_READERS), "{:#?}", d.calls());
    assert!(!d.has(
        "/apis/rbac.authorization.k8s.io/v1/namespaces/data/rolebindings/wirerate-path-test.far.readers"
    ));
}

const FAR_READERS: &str =
    "/apis/rbac.authorization.k8s.io/v1/namespaces/data/roles/wirerate-path-test.far.readers";

/// A listening pool `far` that stops listening; its grant's Role is
/// replaced by `swap`, if given, just after the operator reads it to
/// revoke it.
async fn far_stops_listening(swap: Option<&serde_json::Value>) -> Cluster {
    let mut d = Cluster::new().await;
    let mut far = path_testing("far", "/out", true, &[]);
    far.metadata.generation = Some(1);
    d.pool(&far);
    pool_controller::reconcile(Arc::new(far.clone()), d.ctx.clone())
        .await
        .expect("reconcile");
    assert!(d.has(FAR_READERS));
    if let Some(next) = swap {
        d.replaced_after_get(FAR_READERS, next);
    }
    far.spec.path_tests.as_mut().unwrap().listen = false;
    // As the API holds it: the status of generation 1 written.
    far.status = Some(wirerate_crds::DtnPoolStatus {
        observed_generation: Some(1),
        ..Default::default()
    });
    far.metadata.generation = Some(2);
    d.pool(&far);
    pool_controller::reconcile(Arc::new(far), d.ctx.clone())
        .await
        .expect("reconcile");
    d
}

// Found in review: the grant was deleted by name after a look at its
// owner, so a Role of that name made by someone else in between went too.
#[tokio::test]
async fn a_grant_replaced_since_it_was_read_is_not_deleted() {
    let theirs = serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "wirerate-path-test.far.readers", "namespace": "data", "uid": "theirs"}});
    let d = far_stops_listening(Some(&theirs)).await;
    assert_eq!(
        d.object_at(FAR_READERS)["metadata"]["uid"],
        "theirs",
        "{:#?}",
        d.calls()
    );
}

// The same name taken by a grant of the pool's own, made again meanwhile
// (another replica of the operator): that one goes too.
#[tokio::test]
async fn a_grant_made_again_since_it_was_read_is_deleted() {
    let mut again = serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "wirerate-path-test.far.readers", "namespace": "data", "uid": "again"}});
    let far = path_testing("far", "/out", true, &[]);
    again["metadata"]["ownerReferences"] =
        serde_json::to_value(kube::Resource::controller_owner_ref(&far, &()).map(|o| vec![o]))
            .unwrap();
    let d = far_stops_listening(Some(&again)).await;
    assert!(!d.has(FAR_READERS), "{:#?}", d.calls());
}

// Found in review: a grant made earlier stayed when the pool's Secret was
// later replaced by someone else's, so the agents could read that one.
#[tokio::test]
async fn a_grant_goes_when_its_secret_is_no_longer_the_pools() {
    let mut d = Cluster::new().await;
    let far = path_testing("far", "/out", true, &[]);
    d.pool(&far);
    pool_controller::reconcile(Arc::new(far.clone()), d.ctx.clone())
        .await
        .expect("reconcile");
    let role =
        "/apis/rbac.authorization.k8s.io/v1/namespaces/data/roles/wirerate-path-test.far.readers";
    assert!(d.has(role));
    someone_elses_secret(&d);
    pool_controller::reconcile(Arc::new(far), d.ctx.clone())
        .await
        .expect("reconcile");
    assert!(!d.has(role), "{:#?}", d.calls());
    assert!(!d.has(
        "/apis/rbac.authorization.k8s.io/v1/namespaces/data/rolebindings/wirerate-path-test.far.readers"
    ));
}

// Found in review: the grant's Role was applied over one of the same name
// that the pool did not own.
#[tokio::test]
async fn a_role_of_the_grants_name_someone_else_owns_is_left_alone() {
    let mut d = Cluster::new().await;
    let far = path_testing("far", "/out", true, &[]);
    d.pool(&far);
    let mut theirs = k8s_openapi::api::rbac::v1::Role::default();
    theirs.metadata.name = Some("wirerate-path-test.far.readers".into());
    theirs.metadata.namespace = Some("data".into());
    let role =
        "/apis/rbac.authorization.k8s.io/v1/namespaces/data/roles/wirerate-path-test.far.readers";
    d.put(role, &theirs);
    pool_controller::reconcile(Arc::new(far), d.ctx.clone())
        .await
        .expect("reconcile");
    // Nothing written for path tests: no Secret, no grant (an Event only).
    assert!(
        !d.calls().iter().any(|c| c.method != "GET"
            && !c.path.contains("/events")
            && (c.path.contains("wirerate-path-test") || c.path.ends_with("/secrets"))),
        "{:#?}",
        d.calls()
    );
    assert!(d.has(role), "someone else's Role stays");
}

/// `near` of `data`, testing one external target whose token is in
/// `partner-token`.
fn testing_partner() -> DtnPool {
    let mut near = path_testing("near", "/in", false, &[]);
    near.spec.path_tests.as_mut().unwrap().external =
        vec![wirerate_crds::pool::ExternalPathTestTarget {
            name: "partner".into(),
            address: "dtn.partner.example:7690".into(),
            token_secret: "partner-token".into(),
        }];
    near
}

const PARTNER_TOKEN: &str = "/api/v1/namespaces/data/secrets/partner-token";
const EXTERNAL_ROLE: &str =
    "/apis/rbac.authorization.k8s.io/v1/namespaces/data/roles/wirerate-path-test.near.external";
const EXTERNAL_BINDING: &str = "/apis/rbac.authorization.k8s.io/v1/namespaces/data/rolebindings/wirerate-path-test.near.external";

/// The partner's token Secret, marked for wirerate or not.
fn partner_token(d: &Cluster, marked: bool) {
    let labels = if marked {
        serde_json::json!({contract::EXTERNAL_TOKEN_LABEL: "true"})
    } else {
        serde_json::json!({})
    };
    d.put(
        PARTNER_TOKEN,
        &serde_json::json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "partner-token", "namespace": "data", "labels": labels}}),
    );
}

/// What `near`'s last status says of its target `partner`.
fn partner_status(d: &Cluster) -> serde_json::Value {
    let s = d.last_status("/dtnpools/near");
    s["pathTests"]
        .as_array()
        .and_then(|l| l.iter().find(|t| t["target"] == "partner").cloned())
        .unwrap_or_else(|| panic!("no partner in {s}"))
}

// Found in review: any Secret the pool's author could read was handed to
// the agents, where anyone who may run a pod under their ServiceAccount
// reads it; a Transfer's external token must be marked, and so must this.
#[tokio::test]
async fn an_external_targets_token_is_granted_only_once_marked_for_wirerate() {
    let mut d = Cluster::new().await;
    let mut near = testing_partner();
    // As the API holds it after a first pass: no spec change to see.
    near.metadata.generation = Some(1);
    near.status = Some(wirerate_crds::DtnPoolStatus {
        observed_generation: Some(1),
        ..Default::default()
    });
    d.pool(&near);
    pool_controller::reconcile(Arc::new(near.clone()), d.ctx.clone())
        .await
        .expect("reconcile");
    assert!(!d.has(EXTERNAL_ROLE), "no Secret, no grant");
    let p = partner_status(&d);
    assert!(
        p["waiting"].as_str().unwrap().contains("does not exist"),
        "{p}"
    );
    partner_token(&d, false);
    pool_controller::reconcile(Arc::new(near.clone()), d.ctx.clone())
        .await
        .expect("reconcile");
    assert!(!d.has(EXTERNAL_ROLE), "an unmarked Secret is not granted");
    let p = partner_status(&d);
    assert!(
        p["waiting"]
            .as_str()
            .unwrap()
            .contains("wirerate.io/external-token=true"),
        "{p}"
    );
    partner_token(&d, true);
    pool_controller::reconcile(Arc::new(near.clone()), d.ctx.clone())
        .await
        .expect("reconcile");
    assert!(d.has(EXTERNAL_ROLE), "{:#?}", d.calls());
    // Found in review: the label taken off again, on a pass that moved no
    // spec, left the grant in place.
    partner_token(&d, false);
    pool_controller::reconcile(Arc::new(near), d.ctx.clone())
        .await
        .expect("reconcile");
    assert!(!d.has(EXTERNAL_ROLE), "the grant outlived the label");
    assert!(!d.has(EXTERNAL_BINDING));
}

#[tokio::test]
async fn external_targets_tokens_are_granted_to_the_pools_agents_and_taken_back() {
    let mut d = Cluster::new().await;
    let mut near = testing_partner();
    near.metadata.generation = Some(1);
    d.pool(&near);
    partner_token(&d, true);
    pool_controller::reconcile(Arc::new(near.clone()), d.ctx.clone())
        .await
        .expect("reconcile");
    let r: k8s_openapi::api::rbac::v1::Role =
        serde_json::from_value(d.object_at(EXTERNAL_ROLE)).expect("the Role");
    assert_eq!(
        r.rules.unwrap()[0].resource_names.as_deref(),
        Some(&["partner-token".to_owned()][..])
    );
    assert!(d.has(EXTERNAL_BINDING));
    // No external target left: the grant goes.
    near.spec.path_tests.as_mut().unwrap().external.clear();
    near.status = Some(wirerate_crds::DtnPoolStatus {
        observed_generation: Some(1),
        ..Default::default()
    });
    near.metadata.generation = Some(2);
    d.pool(&near);
    pool_controller::reconcile(Arc::new(near), d.ctx.clone())
        .await
        .expect("reconcile");
    assert!(!d.has(EXTERNAL_ROLE), "{:#?}", d.calls());
    assert!(!d.has(EXTERNAL_BINDING));
}

// Found in review: with a RoleBinding of the grant's name someone else's,
// the pool's own Role stayed, no longer kept to the spec.
#[tokio::test]
async fn an_external_grants_name_someone_else_owns_is_left_alone_and_ours_goes() {
    let mut d = Cluster::new().await;
    let near = testing_partner();
    d.pool(&near);
    partner_token(&d, true);
    pool_controller::reconcile(Arc::new(near.clone()), d.ctx.clone())
        .await
        .expect("reconcile");
    assert!(d.has(EXTERNAL_ROLE));
    let mut theirs = k8s_openapi::api::rbac::v1::RoleBinding::default();
    theirs.metadata.name = Some("wirerate-path-test.near.external".into());
    theirs.metadata.namespace = Some("data".into());
    d.put(EXTERNAL_BINDING, &theirs);
    let before = d.calls().len();
    pool_controller::reconcile(Arc::new(near), d.ctx.clone())
        .await
        .expect("reconcile");
    let calls = d.calls().split_off(before);
    assert!(
        !calls
            .iter()
            .any(|c| c.method == "PATCH" && c.path.contains("wirerate-path-test.near.external")),
        "{calls:#?}"
    );
    assert!(d.has(EXTERNAL_BINDING), "someone else's RoleBinding stays");
    assert!(!d.has(EXTERNAL_ROLE), "the pool's own Role goes");
    let event = calls
        .iter()
        .find(|c| c.method == "POST" && c.path.ends_with("/events"))
        .expect("an Event");
    assert_eq!(event.body["reason"], "PathTestSecretTaken");
}

// Found in review: a revocation that failed was remembered in memory only,
// so an operator started after it, with the spec unchanged since, left the
// grant for good. A start takes back whatever the pool no longer wants.
#[tokio::test]
async fn a_started_operator_takes_back_a_grant_the_pool_no_longer_wants() {
    let mut d = Cluster::new().await;
    let mut near = testing_partner();
    partner_token(&d, true);
    d.pool(&near);
    pool_controller::reconcile(Arc::new(near.clone()), d.ctx.clone())
        .await
        .expect("reconcile");
    assert!(d.has(EXTERNAL_ROLE));
    // The target gone, and that spec seen, while the revocation failed.
    near.spec.path_tests.as_mut().unwrap().external.clear();
    near.metadata.generation = Some(2);
    near.status = Some(wirerate_crds::DtnPoolStatus {
        observed_generation: Some(2),
        ..Default::default()
    });
    // A new operator: the same objects, nothing remembered.
    let mut fresh = Cluster::new().await;
    for path in [EXTERNAL_ROLE, EXTERNAL_BINDING] {
        fresh.put(path, &d.object_at(path));
    }
    fresh.pool(&near);
    pool_controller::reconcile(Arc::new(near), fresh.ctx.clone())
        .await
        .expect("reconcile");
    assert!(!fresh.has(EXTERNAL_ROLE), "{:#?}", fresh.calls());
    assert!(!fresh.has(EXTERNAL_BINDING));
}
