//! The agent's calls to the API server, each under a deadline, and the two
//! tasks that write for it: the Lease keeper and the report sender.
//!
//! kube's client sets no read timeout, and a loaded API server can hold a
//! request for minutes. So no call is awaited without a deadline, and
//! nothing the agent's loop does waits for a write: the Lease is renewed by
//! a task of its own (a stalled report must not let it lapse, or a healthy
//! transfer is failed over), and reports go through an [`Outbox`] that a
//! task of its own empties, sending again what was not taken.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, Config};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use wirerate_crds::transfer::Role;
use wirerate_crds::{AgentLease, Transfer, contract};

use super::cadence::{LeaseCadence, Outbox, Sent};
use super::plan::JobKey;

/// How long one read or report may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long connecting to the API server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A call the API server did not answer as asked.
#[derive(Debug)]
pub enum ApiError {
    /// No answer within the deadline (the call may still be applied).
    TimedOut(Duration),
    /// The client's error, or the API server's answer.
    Kube(kube::Error),
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TimedOut(d) => write!(f, "no answer from the API server within {d:?}"),
            // The API's own message, not the whole Status it came in.
            Self::Kube(kube::Error::Api(s)) => write!(f, "{} {}", s.code, s.message),
            Self::Kube(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ApiError {}

impl ApiError {
    /// The API server's status code, if it answered.
    pub fn code(&self) -> Option<u16> {
        match self {
            Self::Kube(kube::Error::Api(s)) => Some(s.code),
            _ => None,
        }
    }

    /// Whether the same call may succeed later: no answer, a broken
    /// connection, throttling or a server error. A 4xx is the answer.
    pub fn transient(&self) -> bool {
        self.code().is_none_or(|c| c == 429 || c == 409 || c >= 500)
    }
}

/// Awaits `call` for at most `deadline`.
pub async fn call<T>(
    deadline: Duration,
    call: impl Future<Output = kube::Result<T>>,
) -> Result<T, ApiError> {
    match tokio::time::timeout(deadline, call).await {
        Ok(r) => r.map_err(ApiError::Kube),
        Err(_) => Err(ApiError::TimedOut(deadline)),
    }
}

/// A client for the cluster the environment names (KUBECONFIG, or the
/// pod's service account), with connect and write deadlines; reads have
/// theirs per call ([`call`]), and watches their own idle timeout.
pub async fn client() -> Result<Client, kube::Error> {
    let mut config = Config::infer().await.map_err(kube::Error::InferConfig)?;
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    config.write_timeout = Some(CALL_TIMEOUT);
    // Named in the API server's audit log and per-client metrics.
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(concat!("wirerate-agent/", env!("CARGO_PKG_VERSION"))),
    ));
    Client::try_from(config)
}

/// Keeps this agent's Lease renewed, with the latest content `info` says,
/// on the cadence of [`LeaseCadence`], each renewal under its own deadline.
/// Runs until `info`'s sender is dropped.
pub async fn keep_lease(
    client: Client,
    namespace: String,
    pool: String,
    agent: String,
    mut info: watch::Receiver<AgentLease>,
) {
    let api: Api<Lease> = Api::namespaced(client, &namespace);
    let name = contract::lease_name(&pool, &agent);
    let pp = PatchParams::apply(&contract::agent_manager(&agent)).force();
    let lease = Duration::from_secs(contract::LEASE_SECONDS.unsigned_abs().into());
    let mut cadence = LeaseCadence::new(lease);
    let start = Instant::now();
    let mut taken: Option<AgentLease> = None;
    loop {
        let now = start.elapsed();
        let latest = info.borrow_and_update().clone();
        let changed = taken.as_ref().is_some_and(|t| *t != latest);
        if cadence.due(now, changed) {
            let body = latest.to_lease(&pool, &agent, Timestamp::now());
            let r = call(
                LeaseCadence::CALL_TIMEOUT,
                api.patch(&name, &pp, &Patch::Apply(&body)),
            )
            .await;
            cadence.tried(now, r.is_ok());
            match r {
                Ok(_) => taken = Some(latest),
                Err(e) => tracing::warn!(lease = %name, error = %e, "cannot renew the Lease"),
            }
            continue;
        }
        let wait = cadence.wait(now, changed);
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            r = info.changed() => if r.is_err() { return },
        }
    }
}

/// Where a report goes: a Transfer, and the side and attempt it is of.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ReportKey {
    /// Namespace and name of the Transfer.
    pub transfer: (String, String),
    /// Its uid, the side (sender first) and the attempt.
    pub side: (String, Role, i32),
}

impl ReportKey {
    /// The report of side `key` of Transfer `transfer`.
    pub fn new(transfer: &(String, String), key: &JobKey) -> Self {
        Self {
            transfer: transfer.clone(),
            side: (key.uid.clone(), key.role, key.attempt),
        }
    }
}

type Shared = Arc<Mutex<Outbox<ReportKey, serde_json::Value>>>;

/// The reports the agent's loop posts, and the task that sends them.
#[derive(Clone)]
pub struct Reports {
    outbox: Shared,
    posted: Arc<Notify>,
}

impl Reports {
    /// Starts the sender: reports are applied as `agent` (its field
    /// manager) on `client`, each under its own deadline and several at
    /// once, so one slow Transfer holds up no other.
    pub fn start(client: Client, agent: &str) -> Self {
        let r = Self {
            outbox: Arc::default(),
            posted: Arc::new(Notify::new()),
        };
        let agent = agent.to_owned();
        let (outbox, posted) = (r.outbox.clone(), r.posted.clone());
        tokio::spawn(async move {
            let start = Instant::now();
            loop {
                let (ready, wait) = {
                    let mut o = lock(&outbox);
                    let ready = o.ready(start.elapsed());
                    (ready, o.wait(start.elapsed()))
                };
                for (k, seq, body) in ready {
                    let api: Api<Transfer> = Api::namespaced(client.clone(), &k.transfer.0);
                    let pp =
                        PatchParams::apply(&contract::report_manager(&agent, k.side.1)).force();
                    let (outbox, posted) = (outbox.clone(), posted.clone());
                    // A task per send: the loop never waits for one, and
                    // every send ends in `done`.
                    tokio::spawn(async move {
                        let r = call(
                            CALL_TIMEOUT,
                            api.patch_status(&k.transfer.1, &pp, &Patch::Apply(&body)),
                        )
                        .await;
                        let sent = match &r {
                            Ok(_) => Sent::Taken,
                            Err(e) if e.transient() => Sent::Retry,
                            Err(_) => Sent::Refused,
                        };
                        if let Err(e) = &r {
                            tracing::warn!(transfer = %k.transfer.1, error = %e, ?sent, "cannot report");
                        }
                        lock(&outbox).done(&k, seq, sent, start.elapsed());
                        posted.notify_one();
                    });
                }
                let pause = wait.unwrap_or(Duration::from_secs(3600));
                tokio::select! {
                    () = tokio::time::sleep(pause) => {}
                    () = posted.notified() => {}
                }
            }
        });
        r
    }

    /// Queues `status` (an apply body) for `key`, replacing one not yet sent.
    pub fn post(&self, key: ReportKey, status: serde_json::Value) {
        lock(&self.outbox).post(key, status);
        self.posted.notify_one();
    }

    /// Reports not yet taken by the API server.
    pub fn pending(&self) -> usize {
        lock(&self.outbox).len()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
