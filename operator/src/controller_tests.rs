//! The reconcilers against the API double: what they apply, in what order,
//! with which field manager.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use wirerate_crds::transfer::{AgentReport, ReportState, Role};
use wirerate_crds::{DtnPool, Transfer, contract};

use crate::agents::tests::lease;
use crate::fixtures::Double;
use crate::render::tests::lustre_pool;
use crate::validate::tests::{pool, transfer};
use crate::{pool_controller, transfer_controller};

fn now() -> i64 {
    Timestamp::now().as_second()
}

fn finalized<T: kube::Resource>(mut o: T, f: &str) -> T {
    o.meta_mut().finalizers = Some(vec![f.to_owned()]);
    o
}

fn t(name: &str, priority: i32, created: i64) -> Transfer {
    let mut t = finalized(
        transfer(name, "/in/a", &format!("/out/{name}")),
        contract::TRANSFER_FINALIZER,
    );
    t.spec.priority = priority;
    t.metadata.creation_timestamp = Some(Time(Timestamp::from_second(created).unwrap()));
    t
}

fn pools(d: &mut Double) {
    for p in [pool("src", "/in"), pool("dst", "/out")] {
        d.pool(&finalized(p, pool_controller::POOL_FINALIZER));
    }
}

async fn reconcile(d: &Double, t: &Transfer) {
    transfer_controller::reconcile(Arc::new(t.clone()), d.ctx.clone())
        .await
        .expect("reconcile");
}

#[tokio::test]
async fn pool_renders_agents_and_reports_status() {
    let mut d = Double::new();
    let p: DtnPool = finalized(lustre_pool(), pool_controller::POOL_FINALIZER);
    d.pool(&p);
    let mut l = lease("lustre-dtn", "lustre-dtn-agent-0", now(), None);
    l.metadata.namespace = Some("research-data".into());
    d.lease(&l);
    pool_controller::reconcile(Arc::new(p), d.ctx.clone())
        .await
        .expect("reconcile");

    let calls = d.calls();
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
        assert_eq!(c.method, "PATCH");
        assert!(
            c.query.contains("fieldManager=wirerate-operator") && c.query.contains("force=true"),
            "server-side apply: {}",
            c.query
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

#[tokio::test]
async fn an_invalid_spec_becomes_a_condition_and_an_event() {
    let mut d = Double::new();
    pools(&mut d);
    let mut bad = t("bad", 0, 1);
    bad.spec.destination.pool = Some("missing".into());
    d.transfer(&bad);
    reconcile(&d, &bad).await;
    let s = d.last_status("/transfers/bad");
    assert_eq!(s["phase"], "Pending");
    let valid = s["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Valid")
        .unwrap();
    assert_eq!(
        (valid["status"].as_str(), valid["reason"].as_str()),
        (Some("False"), Some("PoolNotFound"))
    );
    assert!(
        valid["message"]
            .as_str()
            .unwrap()
            .contains("data/missing does not exist")
    );
    let event = d
        .calls()
        .into_iter()
        .find(|c| c.path.ends_with("/events"))
        .expect("an Event");
    assert_eq!(event.body["reason"], "PoolNotFound");
    assert_eq!(event.body["type"], "Warning");
}

#[tokio::test]
async fn higher_priority_gets_the_only_slot_and_the_other_queues() {
    let mut d = Double::new();
    pools(&mut d);
    d.lease(&lease("src", "s0", now(), None));
    d.lease(&lease("dst", "r0", now(), None));
    // Each agent has 2 slots; three transfers want them.
    let low = t("low", 0, 1);
    let high = t("high", 10, 5);
    let mid = t("mid", 5, 3);
    for x in [&low, &high, &mid] {
        d.transfer(x);
    }
    reconcile(&d, &low).await;
    let s = d.last_status("/transfers/low");
    assert_eq!(s["phase"], "Queued");
    assert_eq!(
        s["queuePosition"], 1,
        "next in line once high and mid are placed"
    );
    assert!(s.get("sender").is_none());

    reconcile(&d, &high).await;
    let s = d.last_status("/transfers/high");
    assert_eq!(s["phase"], "Running");
    assert_eq!(
        (s["sender"]["name"].as_str(), s["receiver"]["name"].as_str()),
        (Some("s0"), Some("r0"))
    );
    assert_eq!(s["tokenSecret"], "high-token");
    assert_eq!(s["attempt"], 1);
    let calls = d.calls();
    let secret = calls
        .iter()
        .find(|c| c.is("POST", "/secrets"))
        .expect("token Secret created");
    assert_eq!(
        secret.body["metadata"]["ownerReferences"][0]["kind"],
        "Transfer"
    );
    assert_eq!(
        secret.body["stringData"]["token"].as_str().unwrap().len(),
        64
    );
    let labels = calls
        .iter()
        .find(|c| c.is("PATCH", "/transfers/high") && !c.path.ends_with("/status"))
        .unwrap();
    assert_eq!(
        labels.body["metadata"]["labels"][contract::RECEIVER_LABEL],
        "r0"
    );
    let sched = calls
        .iter()
        .rev()
        .find(|c| c.path.ends_with("/events"))
        .unwrap();
    assert_eq!(sched.body["reason"], "Scheduled");

    // Looked at again before the cache shows the assignment: the ledger's copy
    // keeps it whole (agents, pools, addresses), not a stub.
    reconcile(&d, &high).await;
    let again = d.last_status("/transfers/high");
    assert_eq!(again["receiver"]["pool"], "dst");
    assert_eq!(again["receiver"]["address"], "r0.example:7700");
    assert_eq!(again["attempt"], 1);

    // The ledger counts high's slot before the cache shows it: mid takes the
    // last one and low still waits.
    reconcile(&d, &mid).await;
    assert_eq!(d.last_status("/transfers/mid")["phase"], "Running");
    reconcile(&d, &low).await;
    assert_eq!(d.last_status("/transfers/low")["phase"], "Queued");
}

// Found against a real API server: agents were known by name alone, so the
// expired Leases of same-named agents in another namespace hid live ones.
#[tokio::test]
async fn same_named_agents_of_another_namespace_are_other_agents() {
    let mut d = Double::new();
    pools(&mut d);
    for (pool, agent) in [("src", "s0"), ("dst", "r0")] {
        let mut old = lease(pool, agent, now() - 600, None);
        old.metadata.namespace = Some("last-week".into());
        d.lease(&old);
        d.lease(&lease(pool, agent, now(), None));
        let mut old = lease(pool, agent, now() - 600, None);
        old.metadata.namespace = Some("next-week".into());
        d.lease(&old);
    }
    let x = t("x", 0, 1);
    d.transfer(&x);
    reconcile(&d, &x).await;
    let s = d.last_status("/transfers/x");
    assert_eq!(s["phase"], "Running", "{s}");
    assert_eq!(
        (s["sender"]["name"].as_str(), s["receiver"]["name"].as_str()),
        (Some("s0"), Some("r0"))
    );
    // Running, the expired namesakes do not count as its agents being lost.
    let mut x = x;
    x.status = Some(serde_json::from_value(s).unwrap());
    d.transfer(&x);
    reconcile(&d, &x).await;
    let s = d.last_status("/transfers/x");
    assert_eq!(s["attempt"], 1, "{s}");
    assert!(
        s.get("failovers")
            .is_none_or(|f| f.as_array().unwrap().is_empty()),
        "{s}"
    );
}

#[tokio::test]
async fn a_stale_receiver_lease_fails_over_to_another_agent() {
    let mut d = Double::new();
    pools(&mut d);
    d.lease(&lease("src", "s0", now(), None));
    d.lease(&lease("dst", "r0", now() - 60, None));
    d.lease(&lease("dst", "r1", now(), None));
    let mut x = t("x", 0, 1);
    let mut s = wirerate_crds::TransferStatus::default();
    let ag = |n: &str, p: &str| wirerate_crds::transfer::AgentRef {
        name: n.into(),
        pool: p.into(),
        address: None,
        node: None,
    };
    s.phase = Some(wirerate_crds::TransferPhase::Running);
    s.attempt = 1;
    s.sender = Some(ag("s0", "src"));
    s.receiver = Some(ag("r0", "dst"));
    s.token_secret = Some("x-token".into());
    x.status = Some(s);
    d.transfer(&x);
    reconcile(&d, &x).await;

    let s = d.last_status("/transfers/x");
    assert_eq!(s["attempt"], 2);
    assert_eq!(s["failovers"].as_array().unwrap().len(), 1);
    assert_eq!(s["failovers"][0]["agent"], "r0");
    assert!(
        s["failovers"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("Lease expired")
    );
    assert_eq!(s["receiver"]["name"], "r1", "reassigned in the same pass");
    assert_eq!(s["sender"]["name"], "s0");
    assert_eq!(s["phase"], "Running");
    let reasons: Vec<String> = d
        .calls()
        .iter()
        .filter(|c| c.path.ends_with("/events"))
        .map(|c| c.body["reason"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(reasons, ["Failover", "Scheduled"]);
}

#[tokio::test]
async fn the_receivers_success_completes_the_transfer_and_drops_the_labels() {
    let mut d = Double::new();
    pools(&mut d);
    d.lease(&lease("src", "s0", now(), None));
    d.lease(&lease("dst", "r0", now(), None));
    let mut x = t("x", 0, 1);
    x.metadata.labels = Some(
        [
            (contract::SENDER_LABEL.to_owned(), "s0".to_owned()),
            (contract::RECEIVER_LABEL.to_owned(), "r0".to_owned()),
        ]
        .into(),
    );
    let ag = |n: &str, p: &str| wirerate_crds::transfer::AgentRef {
        name: n.into(),
        pool: p.into(),
        address: None,
        node: None,
    };
    x.status = Some(wirerate_crds::TransferStatus {
        phase: Some(wirerate_crds::TransferPhase::Verifying),
        attempt: 1,
        sender: Some(ag("s0", "src")),
        receiver: Some(ag("r0", "dst")),
        start_time: Some(Time(Timestamp::from_second(now() - 10).unwrap())),
        reports: vec![AgentReport {
            role: Role::Receiver,
            agent: "r0".into(),
            attempt: 1,
            state: ReportState::Succeeded,
            message: "digest 0123".into(),
            endpoint: None,
            updated_at: Time(Timestamp::now()),
        }],
        ..Default::default()
    });
    d.transfer(&x);
    reconcile(&d, &x).await;
    let s = d.last_status("/transfers/x");
    assert_eq!(s["phase"], "Succeeded");
    assert!(s.get("completionTime").is_some());
    assert!(
        s.get("reports").is_none(),
        "the agents' reports are theirs; the operator never applies them"
    );
    let labels = d
        .calls()
        .into_iter()
        .find(|c| c.is("PATCH", "/transfers/x"))
        .unwrap();
    assert_eq!(
        labels.body["metadata"]["labels"],
        serde_json::json!({}),
        "assignment labels released"
    );
    let ev = d
        .calls()
        .into_iter()
        .rev()
        .find(|c| c.path.ends_with("/events"))
        .unwrap();
    assert_eq!(ev.body["reason"], "Succeeded");
    assert!(ev.body["note"].as_str().unwrap().contains("digest 0123"));
}
