//! What tests ask of the double beyond a healthy API server: the request
//! log, faults on chosen paths, the back door, and the preconditions
//! (uid, resourceVersion, name length) the API server enforces.

use kube::api::{DeleteParams, Preconditions};

use super::*;

const T: &str = "/apis/wirerate.io/v1alpha1/namespaces/u1/transfers/t";

fn err(e: kube::Error) -> (u16, String) {
    match e {
        kube::Error::Api(s) => (s.code, s.reason),
        other => panic!("not an API error: {other}"),
    }
}

#[tokio::test]
async fn the_log_shows_each_request_with_its_field_manager_and_body() {
    let (s, _c, api) = cluster(100).await;
    api.create(&PostParams::default(), &transfer("t", json!({})))
        .await
        .unwrap();
    assert!(s.calls().is_empty(), "nothing is logged until asked");
    s.record();
    api.patch_status(
        "t",
        &apply("wirerate-operator"),
        &Patch::Apply(json!({"apiVersion": "wirerate.io/v1alpha1", "kind": "Transfer", "status": {"phase": "Queued"}})),
    )
    .await
    .unwrap();
    api.get("t").await.unwrap();
    let calls = s.calls();
    assert_eq!(calls.len(), 2, "{calls:#?}");
    let c = &calls[0];
    assert!(c.is("PATCH", "/transfers/t/status"));
    assert!(c.is_apply() && c.forced());
    assert_eq!(c.field_manager().as_deref(), Some("wirerate-operator"));
    assert_eq!(c.body["status"]["phase"], "Queued");
    assert!(calls[1].is("GET", "/transfers/t"));
    assert_eq!(calls[1].field_manager(), None);
}

#[tokio::test]
async fn failed_reads_and_refused_patches_last_until_a_put() {
    let (s, _c, api) = cluster(100).await;
    api.create(&PostParams::default(), &transfer("t", json!({})))
        .await
        .unwrap();
    s.fail_gets(T);
    assert_eq!(err(api.get("t").await.unwrap_err()).0, 500);
    s.refuse_patches(&format!("{T}/status"));
    let status = Patch::Apply(
        json!({"apiVersion": "wirerate.io/v1alpha1", "kind": "Transfer", "status": {"phase": "Queued"}}),
    );
    let refused = api.patch_status("t", &apply("op"), &status).await;
    assert_eq!(err(refused.unwrap_err()).0, 403);
    // The object's own path is another path: not refused.
    api.patch("t", &apply("op"), &Patch::Apply(json!({"apiVersion": "wirerate.io/v1alpha1", "kind": "Transfer", "metadata": {"labels": {"a": "b"}}})))
        .await
        .unwrap();
    s.put(T, &s.object(T).unwrap());
    api.get("t").await.unwrap();
}

#[tokio::test]
async fn the_back_door_keeps_uid_owners_and_status_and_replaces_another_uid() {
    let (s, _c, api) = cluster(100).await;
    s.put(
        T,
        &json!({"metadata": {"name": "t", "namespace": "u1", "uid": "theirs"},
                "spec": {"source": {"pool": "a", "path": "/d/x"}, "destination": {"pool": "b", "path": "/d/y"}},
                "status": {"phase": "Running"}}),
    );
    let got = value(&api.get("t").await.unwrap());
    assert_eq!(got["metadata"]["uid"], "theirs");
    assert_eq!(got["status"]["phase"], "Running");
    assert_eq!(got["kind"], "Transfer");
    let rv = got["metadata"]["resourceVersion"].clone();
    assert!(rv.is_string());
    // No uid: the same object, updated.
    s.put(T, &json!({"metadata": {"name": "t", "labels": {"x": "y"}}}));
    let same = s.object(T).unwrap();
    assert_eq!(same["metadata"]["uid"], "theirs");
    assert_ne!(same["metadata"]["resourceVersion"], rv);
    // Another uid: another object took the name.
    s.put(T, &json!({"metadata": {"name": "t", "uid": "next"}}));
    assert_eq!(s.object(T).unwrap()["metadata"]["uid"], "next");
    s.delete(T);
    assert!(!s.has(T));
}

#[tokio::test]
async fn a_read_then_a_write_can_meet_another_object_of_the_name() {
    let (s, _c, api) = cluster(100).await;
    api.create(&PostParams::default(), &transfer("t", json!({})))
        .await
        .unwrap();
    s.replace_after_get(T, &json!({"metadata": {"name": "t", "uid": "theirs"}}));
    let read = api.get("t").await.unwrap();
    assert_ne!(
        read.metadata.uid.as_deref(),
        Some("theirs"),
        "served before the swap"
    );
    // A delete meant for what was read leaves the newcomer.
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: read.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    assert_eq!(
        err(api.delete("t", &dp).await.unwrap_err()),
        (409, "Conflict".into())
    );
    assert_eq!(s.object(T).unwrap()["metadata"]["uid"], "theirs");
    // So does a patch that names the uid read.
    let mut stale = value(&read);
    stale["metadata"]["resourceVersion"] = Value::Null;
    stale["metadata"]["managedFields"] = Value::Null;
    let e = api
        .patch("t", &apply("op"), &Patch::Apply(stale))
        .await
        .unwrap_err();
    assert_eq!(err(e).0, 409);
    // A stale resourceVersion precondition on a delete too.
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: None,
            resource_version: Some("1".into()),
        }),
        ..DeleteParams::default()
    };
    assert_eq!(err(api.delete("t", &dp).await.unwrap_err()).0, 409);
    // The right uid deletes it.
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some("theirs".into()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    api.delete("t", &dp).await.unwrap();
    assert!(!s.has(T));
}

#[tokio::test]
async fn a_name_longer_than_a_dns_subdomain_is_refused() {
    let (_s, _c, api) = cluster(100).await;
    let long = "a".repeat(254);
    let e = api
        .create(&PostParams::default(), &transfer(&long, json!({})))
        .await
        .unwrap_err();
    assert_eq!(err(e), (422, "Invalid".into()));
    api.create(
        &PostParams::default(),
        &transfer(&"a".repeat(253), json!({})),
    )
    .await
    .unwrap();
}
