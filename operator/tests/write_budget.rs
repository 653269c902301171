//! The write budget (issue 39): the real operator against the HTTP API
//! double (testsupport/apiserver), 1,000 Transfers queued for 20 slots, three rounds
//! of them finishing and the next taking their slots. The double counts
//! every write by object; the test fails when one Transfer costs more
//! writes than its budget. On a real API server, each Transfer's
//! `queuePosition` was rewritten on every change of the queue: 158,786
//! status writes for 1,000 Transfers, which saturated it.
//!
//! What is counted is the operator's writes, not time: nothing here is
//! asserted about how fast it goes (that is `bench/scale`'s job).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::{Value, json};
use wirerate_apiserver_double::{self as apiserver, Actor, ApiServer, DRIVER_AGENT, ObjectWrites};
use wirerate_crds::transfer::Role;
use wirerate_crds::{DtnPool, DtnPoolBinding, Transfer, TransferPhase, contract};

const POOLS_NS: &str = "wb-pools";
const USERS: [&str; 3] = ["wb-u0", "wb-u1", "wb-u2"];
const POOLS: [&str; 2] = ["pool-0", "pool-1"];
const AGENTS_PER_POOL: usize = 10;
const CAPACITY: i32 = 2;
/// Every Transfer takes a slot in each pool.
const SLOTS: usize = AGENTS_PER_POOL * CAPACITY as usize;
const TRANSFERS: usize = 1000;
/// Each request waits this long for its answer, as a real API server
/// waits for etcd: without it, every write is through before the queue
/// moves again, and a storm that a loaded API server feeds stays unseen.
const LATENCY_MS: u64 = 5;
/// Rounds of finishing the running Transfers.
const ROUNDS: usize = 3;

/// The operator's writes to one Transfer (its status, labels and
/// finalizer) over its life: queued; finalizer, labels and status when
/// scheduled; status, labels and finalizer at its verdict; the rest for
/// its place in line (a few coarse steps, each at most every 10 s).
const TRANSFER_WRITES_MAX: u64 = 10;
/// The same on average over all 1,000 (most never leave the queue).
const TRANSFER_WRITES_MEAN: f64 = 3.0;
/// Everything else a scheduled Transfer costs: its token Secret, the Role
/// and RoleBinding that grant it, their deletion, and its Events.
const GRANT_WRITES_PER_SCHEDULED: f64 = 10.0;

/// A client whose requests the double counts as the driver's.
async fn client(kubeconfig: &Path) -> Client {
    let kc = Kubeconfig::read_from(kubeconfig).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap();
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(DRIVER_AGENT),
    ));
    Client::try_from(config).unwrap()
}

/// Kills the operator when the test ends, however it ends.
struct Operator(Child);

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn create<K>(api: &Api<K>, v: Value)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let o: K = serde_json::from_value(v).unwrap();
    api.create(&PostParams::default(), &o).await.unwrap();
}

async fn setup(client: &Client) {
    let namespaces: Vec<&str> = std::iter::once(POOLS_NS).chain(USERS).collect();
    apiserver::install(client, &namespaces).await.unwrap();
    let pools: Api<DtnPool> = Api::namespaced(client.clone(), POOLS_NS);
    for p in POOLS {
        create(&pools, json!({
            "apiVersion": "wirerate.io/v1alpha1", "kind": "DtnPool",
            "metadata": {"name": p, "namespace": POOLS_NS},
            "spec": {
                "replicas": 0, "image": "wirerate/agent:test",
                "volumes": [{"name": "data", "mountPath": format!("/data/{p}"), "hostPath": format!("/data/{p}")}],
                "allowedRoots": [format!("/data/{p}/x")],
                "maxTransfersPerAgent": CAPACITY,
                "allowedNamespaces": USERS,
            }
        }))
        .await;
    }
    for ns in USERS {
        let bindings: Api<DtnPoolBinding> = Api::namespaced(client.clone(), ns);
        for p in POOLS {
            create(
                &bindings,
                json!({
                    "apiVersion": "wirerate.io/v1alpha1", "kind": "DtnPoolBinding",
                    "metadata": {"name": format!("use-{p}"), "namespace": ns},
                    "spec": {"poolNamespace": POOLS_NS, "pool": p},
                }),
            )
            .await;
        }
    }
    // Agents outside the cluster, their Leases good for the whole test.
    let leases: Api<Lease> = Api::namespaced(client.clone(), POOLS_NS);
    for (i, p) in POOLS.iter().enumerate() {
        for a in 0..AGENTS_PER_POOL {
            let name = format!("{p}-agent-{a}");
            let annotations = wirerate_crds::AgentLease {
                address: Some(format!("10.99.{i}.{}:7700", a + 1)),
                capacity: Some(CAPACITY),
                ..Default::default()
            }
            .to_annotations();
            let lease = json!({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": contract::lease_name(p, &name), "namespace": POOLS_NS,
                             "labels": {contract::POOL_LABEL: p}, "annotations": annotations},
                "spec": {"holderIdentity": name, "leaseDurationSeconds": 3600,
                         "renewTime": MicroTime(Timestamp::now())},
            });
            create(&leases, lease).await;
        }
    }
}

/// Transfer `i`: namespaces and priorities in turn, each direction between the pools.
fn transfer(i: usize) -> (String, Value) {
    let ns = USERS[i % USERS.len()];
    let priority = [0, 5, 10][(i / USERS.len()) % 3];
    let src = (i / 9) % 2;
    let (from, to) = (POOLS[src], POOLS[1 - src]);
    let name = format!("t-{i:05}");
    let body = json!({
        "apiVersion": "wirerate.io/v1alpha1", "kind": "Transfer",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "source": {"pool": from, "poolNamespace": POOLS_NS, "path": format!("/data/{from}/x/{name}/a")},
            // A tenant of a shared pool writes in its own subtree of the roots.
            "destination": {"pool": to, "poolNamespace": POOLS_NS, "path": format!("/data/{to}/x/{ns}/{name}/b")},
            "priority": priority,
            "stallTimeoutSeconds": 86400,
        }
    });
    (ns.to_owned(), body)
}

/// Every Transfer, as the API has them now.
async fn all(client: &Client) -> Vec<Transfer> {
    Api::<Transfer>::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
}

fn phase(t: &Transfer) -> Option<TransferPhase> {
    t.status.as_ref().and_then(|s| s.phase)
}

/// The operator's writes to each Transfer (status, labels, finalizer), and
/// all its other writes.
fn tally(w: &ObjectWrites) -> (BTreeMap<String, u64>, BTreeMap<String, u64>) {
    let (mut transfers, mut other) = (BTreeMap::new(), BTreeMap::new());
    for ((actor, resource, object), n) in w {
        if *actor != Actor::Operator {
            continue;
        }
        if resource == "transfers" || resource == "transfers/status" {
            *transfers.entry(object.clone()).or_default() += n;
        } else {
            *other.entry(resource.clone()).or_default() += n;
        }
    }
    (transfers, other)
}

/// Waits until `done` holds of the Transfers, failing at once should the
/// operator write beyond its budget meanwhile (a storm never ends), or
/// after `patience`.
async fn until(
    api: &ApiServer,
    client: &Client,
    what: &str,
    done: impl Fn(&[Transfer]) -> bool,
) -> Vec<Transfer> {
    let patience = Duration::from_secs(600);
    let start = Instant::now();
    loop {
        let ts = all(client).await;
        let (writes, _) = tally(&api.writes_by_object());
        let total: u64 = writes.values().sum();
        assert!(
            total <= TRANSFER_WRITES_MAX * TRANSFERS as u64,
            "a write storm while waiting for {what}: {total} writes to {} Transfers ({:.1} each)",
            ts.len(),
            total as f64 / ts.len().max(1) as f64
        );
        if done(&ts) {
            return ts;
        }
        assert!(start.elapsed() < patience, "no {what} within {patience:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The receiver's verdict on `t`, as its agent writes it.
async fn succeed(client: &Client, t: &Transfer) {
    let s = t.status.clone().unwrap();
    let receiver = s.receiver.unwrap().name;
    let api: Api<Transfer> =
        Api::namespaced(client.clone(), t.metadata.namespace.as_deref().unwrap());
    let patch = json!({"apiVersion": "wirerate.io/v1alpha1", "kind": "Transfer", "status": {
        "reports": [{"role": "Receiver", "agent": receiver, "attempt": s.attempt, "state": "Succeeded",
                     "message": "verified", "updatedAt": Time(Timestamp::now())}]}});
    api.patch_status(
        t.metadata.name.as_deref().unwrap(),
        &PatchParams::apply(&contract::report_manager(&receiver, Role::Receiver)).force(),
        &Patch::Apply(&patch),
    )
    .await
    .unwrap();
}

fn running(ts: &[Transfer]) -> Vec<&Transfer> {
    ts.iter()
        .filter(|t| phase(t) == Some(TransferPhase::Running))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_transfers_cost_a_bounded_number_of_writes_each() {
    let latency = std::env::var("WB_LATENCY_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(LATENCY_MS);
    let api = ApiServer::start(Duration::from_millis(latency))
        .await
        .unwrap();
    let work = tempfile::Builder::new()
        .prefix("write-budget-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    let kubeconfig = work.path().join("kubeconfig.json");
    api.write_kubeconfig(&kubeconfig).unwrap();
    let client = client(&kubeconfig).await;
    setup(&client).await;

    let log = std::fs::File::create(work.path().join("operator.log")).unwrap();
    let _operator = Operator(
        Command::new(env!("CARGO_BIN_EXE_wirerate-operator"))
            .args(["--namespace", POOLS_NS, "--identity", "write-budget"])
            .args(["--metrics-addr", "127.0.0.1:0"])
            .env("KUBECONFIG", &kubeconfig)
            .env("RUST_LOG", "warn")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    );

    futures::stream::iter(0..TRANSFERS)
        .map(|i| {
            let client = client.clone();
            async move {
                let (ns, body) = transfer(i);
                let api: Api<Transfer> = Api::namespaced(client, &ns);
                let t: Transfer = serde_json::from_value(body).unwrap();
                api.create(&PostParams::default(), &t).await.map(|_| ())
            }
        })
        .buffer_unordered(8)
        .try_collect::<Vec<()>>()
        .await
        .unwrap();
    let created = Instant::now();
    let mut ts = until(
        &api,
        &client,
        "every Transfer phased and every slot taken",
        |ts| ts.iter().all(|t| phase(t).is_some()) && running(ts).len() == SLOTS,
    )
    .await;
    // For the record only: time is bench/scale's to measure.
    eprintln!(
        "all phased and {SLOTS} slots taken {:.1} s after the last create",
        created.elapsed().as_secs_f64()
    );
    for round in 1..=ROUNDS {
        futures::stream::iter(running(&ts))
            .for_each_concurrent(8, |t| succeed(&client, t))
            .await;
        ts = until(
            &api,
            &client,
            &format!("round {round}'s slots refilled"),
            |ts| {
                let done = ts
                    .iter()
                    .filter(|t| phase(t) == Some(TransferPhase::Succeeded))
                    .count();
                done == round * SLOTS && running(ts).len() == SLOTS
            },
        )
        .await;
    }
    // The last places in line, refreshed at most every few seconds, written.
    let mut last = 0;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now: u64 = tally(&api.writes_by_object()).0.values().sum();
        if now == last {
            break;
        }
        last = now;
    }

    let (per_transfer, other) = tally(&api.writes_by_object());
    let total: u64 = per_transfer.values().sum();
    let mean = total as f64 / TRANSFERS as f64;
    let (worst, most) = per_transfer
        .iter()
        .max_by_key(|(_, n)| **n)
        .map(|(k, n)| (k.clone(), *n))
        .unwrap_or_default();
    let scheduled = (ROUNDS + 1) * SLOTS;
    let grants: u64 = other
        .iter()
        .filter(|(r, _)| ["secrets", "roles", "rolebindings", "events"].contains(&r.as_str()))
        .map(|(_, n)| n)
        .sum();
    eprintln!(
        "operator writes to Transfers: {total} for {TRANSFERS} ({mean:.2} each, at most {most} to {worst}); \
         grants and Events: {grants} for {scheduled} scheduled ({:.2} each); all other writes: {other:?}",
        grants as f64 / scheduled as f64
    );
    assert!(
        most <= TRANSFER_WRITES_MAX,
        "{worst} cost {most} writes, more than the budget of {TRANSFER_WRITES_MAX}"
    );
    assert!(
        mean <= TRANSFER_WRITES_MEAN,
        "{mean:.2} writes per Transfer, more than {TRANSFER_WRITES_MEAN}"
    );
    assert!(
        grants as f64 <= GRANT_WRITES_PER_SCHEDULED * scheduled as f64,
        "{grants} writes of grants and Events for {scheduled} scheduled Transfers"
    );
}
