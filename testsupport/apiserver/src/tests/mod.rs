//! The double's semantics, through a real `kube::Client` over HTTP: what the
//! operator relies on must come out as a real API server gives it.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, WatchEvent,
    WatchParams,
};
use kube::{Client, CustomResourceExt};
use serde_json::{Value, json};
use wirerate_crds::Transfer;

use super::ApiServer;

mod back_door;

async fn cluster(history: usize) -> (ApiServer, Client, Api<DynamicObject>) {
    let server = ApiServer::start_with(history, Duration::ZERO)
        .await
        .unwrap();
    let client = Client::try_from(kube::Config::new(server.url().parse().unwrap())).unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &Transfer::crd())
        .await
        .unwrap();
    let ns: Api<Namespace> = Api::all(client.clone());
    let u1: Namespace = serde_json::from_value(json!({"metadata": {"name": "u1"}})).unwrap();
    ns.create(&PostParams::default(), &u1).await.unwrap();
    let ar = ApiResource::erase::<Transfer>(&());
    let api = Api::namespaced_with(client.clone(), "u1", &ar);
    (server, client, api)
}

fn transfer(name: &str, extra: Value) -> DynamicObject {
    let mut v = json!({
        "apiVersion": "wirerate.io/v1alpha1",
        "kind": "Transfer",
        "metadata": {"name": name},
        "spec": {"source": {"pool": "a", "path": "/d/x"}, "destination": {"pool": "b", "path": "/d/y"}},
    });
    json_patch::merge(&mut v, &extra);
    serde_json::from_value(v).unwrap()
}

fn value(o: &DynamicObject) -> Value {
    serde_json::to_value(o).unwrap()
}

fn apply(manager: &str) -> PatchParams {
    PatchParams::apply(manager).force()
}

fn code(e: kube::Error) -> u16 {
    match e {
        kube::Error::Api(s) => s.code,
        other => panic!("not an API error: {other}"),
    }
}

#[tokio::test]
async fn apply_merges_reports_by_role_and_drops_what_a_manager_stops_applying() {
    let (_s, _c, api) = cluster(100).await;
    api.create(
        &PostParams::default(),
        &transfer("t", json!({"metadata": {"labels": {"team": "x"}}})),
    )
    .await
    .unwrap();
    let status = |s: Value| {
        Patch::Apply(json!({"apiVersion": "wirerate.io/v1alpha1", "kind": "Transfer", "status": s}))
    };
    api.patch_status("t", &apply("op"), &status(json!({"phase": "Queued", "queuePosition": 5, "conditions": [{"type": "Valid", "status": "True"}]})))
        .await
        .unwrap();
    for (agent, role) in [("r", "Receiver"), ("s", "Sender")] {
        api.patch_status(
            "t",
            &apply(&format!("wirerate-agent/{agent}")),
            &status(json!({"reports": [{"role": role, "agent": agent, "state": "Running"}]})),
        )
        .await
        .unwrap();
    }
    api.patch_status("t", &apply("op"), &status(json!({"phase": "Running", "conditions": [{"type": "Valid", "status": "True"}, {"type": "Scheduled", "status": "True"}]})))
        .await
        .unwrap();
    let labels = |l: Value| {
        Patch::Apply(
            json!({"apiVersion": "wirerate.io/v1alpha1", "kind": "Transfer", "metadata": {"name": "t", "labels": l}}),
        )
    };
    api.patch(
        "t",
        &apply("op"),
        &labels(json!({"wirerate.io/sender": "s"})),
    )
    .await
    .unwrap();
    let t = value(
        &api.patch("t", &apply("op"), &labels(json!({})))
            .await
            .unwrap(),
    );
    assert_eq!(t["status"]["phase"], "Running");
    assert!(t["status"].get("queuePosition").is_none(), "{t}");
    let roles: Vec<&str> = t["status"]["reports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["Receiver", "Sender"]);
    assert_eq!(t["status"]["conditions"].as_array().unwrap().len(), 2);
    assert_eq!(t["metadata"]["labels"], json!({"team": "x"}));
}

#[tokio::test]
async fn status_is_a_subresource_and_generation_follows_the_spec() {
    let (_s, _c, api) = cluster(100).await;
    let made = value(
        &api.create(
            &PostParams::default(),
            &transfer("t", json!({"status": {"phase": "Succeeded"}})),
        )
        .await
        .unwrap(),
    );
    assert!(made.get("status").is_none(), "status is not the creator's");
    assert_eq!(made["metadata"]["generation"], 1);
    let pp = PatchParams::default();
    let merged = value(
        &api.patch(
            "t",
            &pp,
            &Patch::Merge(json!({"spec": {"priority": 5}, "status": {"phase": "Failed"}})),
        )
        .await
        .unwrap(),
    );
    assert!(merged.get("status").is_none());
    assert_eq!(
        (
            merged["spec"]["priority"].clone(),
            merged["metadata"]["generation"].clone()
        ),
        (json!(5), json!(2))
    );
    let status = value(
        &api.patch_status(
            "t",
            &pp,
            &Patch::Merge(json!({"spec": {"priority": 9}, "status": {"phase": "Queued"}})),
        )
        .await
        .unwrap(),
    );
    assert_eq!(status["status"]["phase"], "Queued");
    assert_eq!(status["spec"]["priority"], 5);
    assert_eq!(
        status["metadata"]["generation"], 2,
        "status moves no generation"
    );
    // A write that changes nothing makes no new version.
    let again = value(
        &api.patch_status(
            "t",
            &pp,
            &Patch::Merge(json!({"status": {"phase": "Queued"}})),
        )
        .await
        .unwrap(),
    );
    assert_eq!(
        again["metadata"]["resourceVersion"],
        status["metadata"]["resourceVersion"]
    );
}

#[tokio::test]
async fn conflicts_and_failed_tests_are_refused_as_the_api_server_does() {
    let (_s, client, api) = cluster(100).await;
    let pp = PostParams::default();
    api.create(&pp, &transfer("t", json!({}))).await.unwrap();
    assert_eq!(
        code(
            api.create(&pp, &transfer("t", json!({})))
                .await
                .unwrap_err()
        ),
        409
    );

    // Leader election: a replace carrying an old resourceVersion loses.
    let leases: Api<DynamicObject> = Api::namespaced_with(
        client,
        "u1",
        &ApiResource::erase::<k8s_openapi::api::coordination::v1::Lease>(&()),
    );
    let lease: DynamicObject = serde_json::from_value(json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "leader"}, "spec": {"holderIdentity": "a"}})).unwrap();
    let first = leases.create(&pp, &lease).await.unwrap();
    let mut mine = first.clone();
    mine.data["spec"]["holderIdentity"] = json!("b");
    leases.replace("leader", &pp, &mine).await.unwrap();
    mine.data["spec"]["holderIdentity"] = json!("c");
    assert_eq!(
        code(leases.replace("leader", &pp, &mine).await.unwrap_err()),
        409
    );

    // The finalizer helpers' JSON patches: a test for null passes on a
    // missing list, a test that does not hold is 422.
    let add = |test: Value| -> Patch<()> {
        Patch::Json(
            serde_json::from_value(json!([
                {"op": "test", "path": "/metadata/finalizers", "value": test},
                {"op": "add", "path": "/metadata/finalizers", "value": ["x/y"]},
            ]))
            .unwrap(),
        )
    };
    let pp = PatchParams::default();
    api.patch("t", &pp, &add(Value::Null)).await.unwrap();
    assert_eq!(
        code(api.patch("t", &pp, &add(Value::Null)).await.unwrap_err()),
        422
    );
    assert_eq!(code(api.get("missing").await.unwrap_err()), 404);
}

#[tokio::test]
async fn finalizers_hold_a_deletion_until_the_last_one_goes() {
    let (_s, _c, api) = cluster(100).await;
    let made = api
        .create(
            &PostParams::default(),
            &transfer(
                "t",
                json!({"metadata": {"finalizers": ["wirerate.io/cleanup"]}}),
            ),
        )
        .await
        .unwrap();
    let rv = made.metadata.resource_version.clone().unwrap();
    api.delete("t", &DeleteParams::default()).await.unwrap();
    let held = value(&api.get("t").await.unwrap());
    assert!(held["metadata"]["deletionTimestamp"].is_string());
    let remove: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/finalizers/0", "value": "wirerate.io/cleanup"},
        {"op": "remove", "path": "/metadata/finalizers/0"},
    ]))
    .unwrap();
    api.patch("t", &PatchParams::default(), &Patch::<()>::Json(remove))
        .await
        .unwrap();
    assert_eq!(code(api.get("t").await.unwrap_err()), 404);
    let events = watch_events(&api, &rv, 2).await;
    assert_eq!(events, ["MODIFIED t", "DELETED t"]);
}

#[tokio::test]
async fn a_deleted_namespace_takes_its_objects_and_a_deleted_crd_its_kind() {
    let (_s, client, api) = cluster(100).await;
    api.create(&PostParams::default(), &transfer("t", json!({})))
        .await
        .unwrap();
    let ns: Api<Namespace> = Api::all(client.clone());
    ns.delete("u1", &DeleteParams::default()).await.unwrap();
    assert_eq!(code(api.get("t").await.unwrap_err()), 404);
    let crds: Api<CustomResourceDefinition> = Api::all(client);
    crds.delete("transfers.wirerate.io", &DeleteParams::default())
        .await
        .unwrap();
    let all: Api<DynamicObject> =
        Api::all_with(crds.into_client(), &ApiResource::erase::<Transfer>(&()));
    assert_eq!(code(all.list(&Default::default()).await.unwrap_err()), 404);
}

async fn watch_events(api: &Api<DynamicObject>, rv: &str, n: usize) -> Vec<String> {
    let stream = api
        .watch(&WatchParams::default().timeout(5), rv)
        .await
        .unwrap();
    let events: Vec<WatchEvent<DynamicObject>> =
        tokio::time::timeout(Duration::from_secs(5), stream.take(n).try_collect())
            .await
            .expect("events in time")
            .unwrap();
    events
        .into_iter()
        .map(|e| match e {
            WatchEvent::Added(o) => format!("ADDED {}", o.metadata.name.unwrap()),
            WatchEvent::Modified(o) => format!("MODIFIED {}", o.metadata.name.unwrap()),
            WatchEvent::Deleted(o) => format!("DELETED {}", o.metadata.name.unwrap()),
            WatchEvent::Bookmark(_) => "BOOKMARK".into(),
            WatchEvent::Error(e) => format!("ERROR {}", e.code),
        })
        .collect()
}

#[tokio::test]
async fn a_watch_resumes_after_its_resource_version_and_sees_selectors_change() {
    let (_s, _c, api) = cluster(100).await;
    let pp = PostParams::default();
    let a = api.create(&pp, &transfer("a", json!({}))).await.unwrap();
    let rv = a.metadata.resource_version.clone().unwrap();
    api.create(
        &pp,
        &transfer(
            "b",
            json!({"metadata": {"labels": {"wirerate.io/sender": "s"}}}),
        ),
    )
    .await
    .unwrap();
    let label = |v: Value| Patch::Merge(json!({"metadata": {"labels": {"wirerate.io/sender": v}}}));
    api.patch("a", &PatchParams::default(), &label(json!("s")))
        .await
        .unwrap();
    api.patch("a", &PatchParams::default(), &label(Value::Null))
        .await
        .unwrap();
    assert_eq!(
        watch_events(&api, &rv, 3).await,
        ["ADDED b", "MODIFIED a", "MODIFIED a"]
    );
    // Through a label selector, `a` joins and leaves.
    let stream = api
        .watch(
            &WatchParams::default()
                .labels("wirerate.io/sender")
                .timeout(5),
            &rv,
        )
        .await
        .unwrap();
    let seen: Vec<String> = stream
        .take(3)
        .map(|e| match e.unwrap() {
            WatchEvent::Added(o) => format!("ADDED {}", o.metadata.name.unwrap()),
            WatchEvent::Deleted(o) => format!("DELETED {}", o.metadata.name.unwrap()),
            _ => "other".into(),
        })
        .collect()
        .await;
    assert_eq!(seen, ["ADDED b", "ADDED a", "DELETED a"]);
}

#[tokio::test]
async fn a_watch_older_than_the_history_gets_410_in_its_stream() {
    let (_s, _c, api) = cluster(2).await;
    let pp = PostParams::default();
    let first = api.create(&pp, &transfer("a", json!({}))).await.unwrap();
    for n in ["b", "c", "d"] {
        api.create(&pp, &transfer(n, json!({}))).await.unwrap();
    }
    let rv = first.metadata.resource_version.unwrap();
    assert_eq!(watch_events(&api, &rv, 1).await, ["ERROR 410"]);
}
