//! The simulated agents: each renews its Lease every 5 s by server-side
//! apply under its own field manager, as `wirerate-agent run` does, and
//! reports a Transfer's end the way the agents do (the sender's report with
//! its final progress, then the receiver's verdict) when the bench says it
//! landed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use wirerate_crds::{Transfer, contract};

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

/// Reports `t` landed and verified, as its two agents do: the sender's
/// final report with its progress, then the receiver's Succeeded.
pub(crate) async fn report_success(client: &Client, t: &Transfer) -> anyhow::Result<()> {
    let ns = t.metadata.namespace.clone().unwrap_or_default();
    let name = t.metadata.name.clone().unwrap_or_default();
    let s = t.status.clone().unwrap_or_default();
    let (Some(sender), Some(receiver)) = (s.sender, s.receiver) else {
        anyhow::bail!("{ns}/{name} has no agents to report");
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
    for (agent, status) in [
        (sender.name, sender_status),
        (receiver.name, receiver_status),
    ] {
        let patch =
            json!({"apiVersion": "wirerate.io/v1alpha1", "kind": "Transfer", "status": status});
        api.patch_status(
            &name,
            &PatchParams::apply(&contract::agent_manager(&agent)).force(),
            &Patch::Apply(&patch),
        )
        .await?;
    }
    Ok(())
}
