//! The simulated agents: each renews its Lease every 5 s by server-side
//! apply under its own field manager, as `wirerate-agent run` does, and
//! reports a Transfer's end the way the agents do (the sender's report with
//! its final progress, then the receiver's verdict) when the bench says it
//! landed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use wirerate_crds::transfer::Role;
use wirerate_crds::{Transfer, TransferPhase, contract};

use crate::observer::Observer;
use crate::scenario::{Agent, POOL_NAMESPACE, Scenario};

/// How often an agent renews its Lease (the agent's beat).
pub(crate) const RENEW_EVERY: Duration = Duration::from_secs(5);

/// Renews one agent's Lease now.
pub(crate) async fn heartbeat(
    api: &Api<Lease>,
    s: &Scenario,
    agent: &Agent,
    active: usize,
) -> kube::Result<()> {
    let renewed = serde_json::to_value(MicroTime(Timestamp::now())).expect("times serialize");
    let lease = s.lease(agent, active, &renewed);
    let pp = PatchParams::apply(&contract::agent_manager(&agent.name)).force();
    api.patch(
        &contract::lease_name(&agent.pool, &agent.name),
        &pp,
        &Patch::Apply(&lease),
    )
    .await
    .map(|_| ())
}

/// Renewals that failed.
#[derive(Debug, Default)]
pub(crate) struct Renewals {
    pub(crate) failed: AtomicU64,
    pub(crate) done: AtomicU64,
}

/// Renews every agent's Lease on its own beat, spread over the period, until
/// the tasks are aborted.
pub(crate) fn renew_all(
    client: &Client,
    s: &Scenario,
    observer: Arc<Mutex<Observer>>,
    tally: Arc<Renewals>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let n = s.agents.max(1) as u32;
    s.agents()
        .into_iter()
        .map(|agent| {
            let api: Api<Lease> = Api::namespaced(client.clone(), POOL_NAMESPACE);
            let (s, observer, tally) = (s.clone(), observer.clone(), tally.clone());
            tokio::spawn(async move {
                let offset = RENEW_EVERY * agent.index as u32 / n;
                let mut beat =
                    tokio::time::interval_at(tokio::time::Instant::now() + offset, RENEW_EVERY);
                beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    beat.tick().await;
                    let active = observer
                        .lock()
                        .expect("observer lock")
                        .active(&agent.pool, &agent.name);
                    match heartbeat(&api, &s, &agent, active).await {
                        Ok(()) => tally.done.fetch_add(1, Ordering::Relaxed),
                        Err(_) => tally.failed.fetch_add(1, Ordering::Relaxed),
                    };
                }
            })
        })
        .collect()
}

/// Reports up to `want` of `candidates` (`ns/name`, seen Running) landed
/// and verified, in order, and returns the ones reported. A candidate that
/// is no longer Running with both agents when fetched (a failover, or the
/// operator's write not yet seen) is passed over for the next one: the bench
/// finishes what is running now, and one moved Transfer is no reason to
/// abandon the run.
pub(crate) async fn finish_running(
    client: &Client,
    candidates: &[String],
    want: usize,
) -> anyhow::Result<Vec<String>> {
    let mut reported = Vec::new();
    let mut rest = candidates.iter();
    while reported.len() < want {
        let batch: Vec<&String> = rest.by_ref().take(want - reported.len()).collect();
        if batch.is_empty() {
            break;
        }
        let done: Vec<Option<String>> = futures::stream::iter(batch)
            .map(|key| async move {
                let (ns, name) = key
                    .split_once('/')
                    .with_context(|| format!("{key} is not a namespaced key"))?;
                let api: Api<Transfer> = Api::namespaced(client.clone(), ns);
                let t = api.get(name).await?;
                let reported = report_success(client, &t).await?;
                anyhow::Ok(reported.then(|| key.clone()))
            })
            .buffer_unordered(8)
            .try_collect()
            .await?;
        reported.extend(done.into_iter().flatten());
    }
    Ok(reported)
}

/// Reports `t` landed and verified, as its two agents do: the sender's
/// final report with its progress, then the receiver's Succeeded. Returns
/// false, writing nothing, when `t` is not Running with both agents.
pub(crate) async fn report_success(client: &Client, t: &Transfer) -> anyhow::Result<bool> {
    let ns = t.metadata.namespace.clone().unwrap_or_default();
    let name = t.metadata.name.clone().unwrap_or_default();
    let s = t.status.clone().unwrap_or_default();
    let (Some(TransferPhase::Running), Some(sender), Some(receiver)) =
        (s.phase, s.sender, s.receiver)
    else {
        return Ok(false);
    };
    let api: Api<Transfer> = Api::namespaced(client.clone(), &ns);
    let now = || serde_json::to_value(Time(Timestamp::now())).expect("times serialize");
    let bytes: i64 = 64 << 30;
    let block: i64 = 16 << 20;
    let sender_status = json!({
        "reports": [{"role": "Sender", "agent": sender.name, "attempt": s.attempt, "state": "Succeeded",
                     "message": "sent 1 file(s)", "updatedAt": now()}],
        "progress": {"attempt": s.attempt, "bytesDone": bytes, "bytesTotal": bytes,
                     "blocksDone": bytes / block, "blocksTotal": bytes / block, "percent": "100%",
                     "rateBps": 0, "rate": "0.00 Gbit/s", "updatedAt": now()},
    });
    let receiver_status = json!({
        "reports": [{"role": "Receiver", "agent": receiver.name, "attempt": s.attempt, "state": "Succeeded",
                     "message": format!("1 file(s) verified into {}", t.spec.destination.path),
                     "updatedAt": now()}],
    });
    for (agent, role, status) in [
        (sender.name, Role::Sender, sender_status),
        (receiver.name, Role::Receiver, receiver_status),
    ] {
        let patch =
            json!({"apiVersion": "wirerate.io/v1alpha1", "kind": "Transfer", "status": status});
        api.patch_status(
            &name,
            &PatchParams::apply(&contract::report_manager(&agent, role)).force(),
            &Patch::Apply(&patch),
        )
        .await?;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use kube::api::PostParams;
    use serde_json::Value;

    use super::*;
    use crate::apiserver::ApiServer;

    /// A Transfer in `u1` with `status`, as the operator left it.
    async fn transfer(api: &Api<Transfer>, name: &str, status: Value) {
        let t: Transfer = serde_json::from_value(json!({
            "apiVersion": "wirerate.io/v1alpha1", "kind": "Transfer",
            "metadata": {"name": name},
            "spec": {"source": {"pool": "a", "path": "/d/x"}, "destination": {"pool": "b", "path": "/d/y"}},
        }))
        .unwrap();
        api.create(&PostParams::default(), &t).await.unwrap();
        let patch =
            json!({"apiVersion": "wirerate.io/v1alpha1", "kind": "Transfer", "status": status});
        api.patch_status(
            name,
            &PatchParams::apply("op").force(),
            &Patch::Apply(&patch),
        )
        .await
        .unwrap();
    }

    // The first scale run against a real API server aborted here: a
    // Transfer seen Running had been failed over by the time it was fetched.
    #[tokio::test]
    async fn a_transfer_that_lost_its_agents_is_passed_over_not_fatal() {
        let server = ApiServer::start_with(100, Duration::ZERO).await.unwrap();
        let client = server.client().unwrap();
        wirerate_apiserver_double::install(&client, &["u1"])
            .await
            .unwrap();
        let api: Api<Transfer> = Api::namespaced(client.clone(), "u1");
        let running = |n: &str| {
            json!({"phase": "Running", "attempt": 1,
                   "sender": {"name": format!("s{n}"), "pool": "a"},
                   "receiver": {"name": format!("r{n}"), "pool": "b"}})
        };
        transfer(&api, "t1", running("1")).await;
        transfer(&api, "t2", json!({"phase": "Queued", "attempt": 1})).await;
        transfer(&api, "t3", running("3")).await;
        transfer(&api, "t4", running("4")).await;

        let seen = ["u1/t2", "u1/t1", "u1/t3", "u1/t4"].map(String::from);
        let reported = finish_running(&client, &seen, 2).await.unwrap();

        assert_eq!(reported, ["u1/t1", "u1/t3"]);
        for (name, finished) in [("t1", true), ("t2", false), ("t3", true), ("t4", false)] {
            let s = api.get(name).await.unwrap().status.unwrap();
            assert_eq!(s.reports.len(), if finished { 2 } else { 0 }, "{name}");
        }
    }
}
