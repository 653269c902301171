//! The reconcilers against the API double: what they apply, in what order,
//! with which field manager.
//!
//! One file per controller (and one for the wakes between them); the
//! helpers they share are here.

mod path_test_grants;
mod pools;
mod tokens;
mod transfers;
mod wakes;

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use wirerate_crds::transfer::{AgentReport, ReportState, Role};
use wirerate_crds::{DtnPool, DtnPoolBinding, DtnPoolBindingSpec, Transfer, contract};

use crate::agents::tests::lease;
use crate::context::lock;
use crate::fixtures::Cluster;
use crate::render::tests::lustre_pool;
use crate::validate::tests::{pool, transfer};
use crate::{pool_controller, token_grant, transfer_controller};

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

/// Agent `name` of `pool`, as a status names it.
fn agent_ref(name: &str, pool: &str) -> wirerate_crds::transfer::AgentRef {
    wirerate_crds::transfer::AgentRef {
        name: name.into(),
        pool: pool.into(),
        address: None,
        node: None,
    }
}

fn pools(d: &mut Cluster) {
    for p in [pool("src", "/in"), pool("dst", "/out")] {
        d.pool(&finalized(p, pool_controller::POOL_FINALIZER));
    }
}

fn binding(ns: &str, pool_ns: &str, pool: &str) -> DtnPoolBinding {
    let mut b = DtnPoolBinding::new(
        &format!("use-{pool}"),
        DtnPoolBindingSpec {
            pool_namespace: pool_ns.into(),
            pool: pool.into(),
        },
    );
    b.metadata.namespace = Some(ns.into());
    b
}

/// Pools `src` and `dst` with one agent each (`s0`, `r0`) and Transfer `x`,
/// reconciled once: assigned to them.
async fn one_transfer_assigned() -> (Cluster, Transfer) {
    let mut d = Cluster::new().await;
    pools(&mut d);
    d.lease(&lease("src", "s0", now(), None));
    d.lease(&lease("dst", "r0", now(), None));
    let x = t("x", 0, 1);
    d.transfer(&x);
    reconcile(&d, &x).await;
    (d, x)
}

/// `r0`'s report that its first attempt succeeded.
fn receiver_success() -> AgentReport {
    AgentReport {
        role: Role::Receiver,
        agent: "r0".into(),
        attempt: 1,
        state: ReportState::Succeeded,
        message: "digest 0123".into(),
        endpoint: None,
        updated_at: Time(Timestamp::now()),
    }
}

/// `x` with the status last applied to it and receiver r0's success on
/// attempt 1, put in the API and reconciled.
async fn receiver_succeeded(d: &mut Cluster, mut x: Transfer) -> Transfer {
    let mut s: wirerate_crds::TransferStatus = serde_json::from_value(d.last_status(&format!(
        "/transfers/{}",
        x.metadata.name.as_deref().unwrap_or_default()
    )))
    .unwrap();
    s.reports = vec![receiver_success()];
    x.status = Some(s);
    d.transfer(&x);
    reconcile(d, &x).await;
    x
}

/// Asserts that the grant of Transfer `name`'s token (namespace `data`),
/// its Role and RoleBinding, was deleted.
fn assert_token_revoked(d: &Cluster, name: &str) {
    let gone: Vec<String> = d
        .calls()
        .into_iter()
        .filter(|c| c.method == "DELETE")
        .map(|c| c.path)
        .collect();
    for grant in ["roles", "rolebindings"] {
        assert!(
            gone.iter()
                .any(|p| p.ends_with(&format!("/namespaces/data/{grant}/wirerate-token.{name}"))),
            "{gone:?}"
        );
    }
}

/// The condition `type_` of the last status written at `path_end`.
fn condition(d: &Cluster, path_end: &str, type_: &str) -> serde_json::Value {
    d.last_status(path_end)["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .cloned()
        .unwrap_or_else(|| panic!("no {type_} condition"))
}

async fn reconcile(d: &Cluster, t: &Transfer) {
    transfer_controller::reconcile(Arc::new(t.clone()), d.ctx.clone())
        .await
        .expect("reconcile");
}
