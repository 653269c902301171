//! What every reconcile shares: the client, the watch caches, the metrics,
//! the ledger of assignments in flight, and the scheduler's index and plan.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::channel::mpsc::{UnboundedReceiver, UnboundedSender, unbounded};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::Notify;
use wirerate_crds::{Consent, DtnPool, DtnPoolBinding, Transfer};

use crate::agents::{self, Agent, AgentId};
use crate::budget::{self, Admit, Class, WriteBudget};
use crate::metrics::Metrics;
pub use crate::planner::Assignment;
use crate::planner::{self, Inputs, Plan, Planner};
use crate::scheduler::{Key, Placement};

/// Locks `m`, poisoned or not: the data under these locks stays whole
/// across a panic (a plan is swapped in whole), and one panic must not
/// take every later reconcile down with it.
pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// How often, at most, queued Transfers are woken only to show a new place in line.
pub const POSITION_REFRESH: Duration = Duration::from_secs(5);

/// Changes arriving this close together share one plan.
const DEBOUNCE: Duration = Duration::from_millis(20);

/// Lease and pod events this close together are looked at once.
const AGENTS_DEBOUNCE: Duration = Duration::from_millis(250);

/// The longest a reconcile waits for the planner to see its change.
const PLAN_WAIT: Duration = Duration::from_millis(500);

/// Shared state of the controllers.
pub struct Context {
    /// API client.
    pub client: Client,
    /// Event publisher.
    pub recorder: Recorder,
    /// Metrics.
    pub metrics: Metrics,
    /// Watch caches.
    pub stores: Stores,
    /// Assignments taken (being written, or written but maybe not yet back
    /// through the watch), by Transfer uid.
    pub ledger: Mutex<HashMap<String, Assignment>>,
    /// Each Transfer's status and labels as the operator last wrote them,
    /// standing in for a cache copy that does not show them yet.
    pub written: Mutex<crate::written::LastWritten>,
    /// Pools (by uid) whose unwanted path-test grants this operator has
    /// seen gone. Any other pool's are taken back on every pass until they
    /// are, whatever else changed: after a failed revocation, and after a
    /// start, which cannot know of a failure before it.
    pub revokes_settled: Mutex<std::collections::HashSet<String>>,
    /// How the operator last left each object a pool renders, so that a
    /// pass does not write one again unchanged.
    pub applied: Mutex<crate::applied::Applied>,
    /// The index, the last plan, and who was woken for it.
    scheduling: Mutex<Scheduling>,
    /// Bumped by every change a plan depends on.
    changes: AtomicU64,
    /// Wakes the planner.
    changed: Notify,
    /// Wakes the agent watcher: a Lease or pod changed.
    agents_touched: Notify,
    /// The change count of the latest plan, for reconciles waiting on it.
    plans: tokio::sync::watch::Sender<u64>,
    /// Whether the planner task runs (else a reconcile plans itself).
    planner_running: std::sync::atomic::AtomicBool,
    wake_transfers: UnboundedSender<ObjectRef<Transfer>>,
    wake_pools: UnboundedSender<ObjectRef<DtnPool>>,
    wakes: Mutex<Option<Wakes>>,
    /// Every write the operator makes takes its turn here.
    writes: Mutex<WriteBudget>,
    /// When each agent's latest renewal was seen.
    heartbeats: Mutex<agents::Heartbeats>,
    /// The host paths the admin allows pools to mount (the operator's
    /// `--allowed-host-paths`); empty: any but the host's root and system
    /// directories (see [`crate::validate::host_path_refused`]).
    pub allowed_host_paths: Vec<String>,
    /// What the last look at the API server found missing of wirerate's
    /// admission policies ([`crate::admission::missing_message`]), for every
    /// pool's status; None while all are there.
    pub policies_missing: Mutex<Option<String>>,
}

/// Reconciles the controllers are asked for by the planner and the agent watcher.
pub struct Wakes {
    /// Transfers to look at.
    pub transfers: UnboundedReceiver<ObjectRef<Transfer>>,
    /// Pools to look at.
    pub pools: UnboundedReceiver<ObjectRef<DtnPool>>,
}

struct Scheduling {
    planner: Planner,
    plan: Arc<Plan>,
    /// The change count the plan was computed at.
    at: Option<u64>,
    /// Places in line the queued Transfers show, or were last woken to show
    /// (as shown: coarse behind the first few).
    announced: HashMap<Key, i32>,
    announced_at: Option<Instant>,
    /// When each queued Transfer's place in line was last written.
    position_written: HashMap<Key, Instant>,
}

/// The watch caches the controllers read.
#[derive(Clone)]
pub struct Stores {
    /// DtnPools.
    pub pools: Store<DtnPool>,
    /// Transfers.
    pub transfers: Store<Transfer>,
    /// Agents' Leases.
    pub leases: Store<Lease>,
    /// Agents' pods.
    pub pods: Store<Pod>,
    /// Namespaces' consents to pools elsewhere.
    pub bindings: Store<DtnPoolBinding>,
}

/// A consistent snapshot of the caches the decisions read, Transfers aside.
pub struct View {
    /// Pools by namespace and name.
    pub pools: BTreeMap<Key, DtnPool>,
    /// Agents by identity.
    pub agents: HashMap<AgentId, Agent>,
    /// Which namespaces consent to which pools (their DtnPoolBindings).
    pub consents: BTreeSet<Consent>,
}

impl Context {
    /// A context on `client` reading `stores`, counting into `metrics`.
    pub fn new(client: Client, stores: Stores, metrics: Metrics, identity: &str) -> Self {
        let reporter = Reporter {
            controller: "wirerate-operator".into(),
            instance: Some(identity.into()),
        };
        let (wake_transfers, transfers) = unbounded();
        let (wake_pools, pools) = unbounded();
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            metrics,
            stores,
            ledger: Mutex::default(),
            written: Mutex::default(),
            revokes_settled: Mutex::default(),
            applied: Mutex::default(),
            scheduling: Mutex::new(Scheduling {
                planner: Planner::default(),
                plan: Arc::default(),
                at: None,
                announced: HashMap::new(),
                announced_at: None,
                position_written: HashMap::new(),
            }),
            changes: AtomicU64::new(0),
            changed: Notify::new(),
            agents_touched: Notify::new(),
            plans: tokio::sync::watch::Sender::new(0),
            planner_running: std::sync::atomic::AtomicBool::new(false),
            wake_transfers,
            wake_pools,
            wakes: Mutex::new(Some(Wakes { transfers, pools })),
            writes: Mutex::new(WriteBudget::new(budget::DEFAULT_WRITES_PER_SECOND)),
            heartbeats: Mutex::default(),
            allowed_host_paths: Vec::new(),
            policies_missing: Mutex::default(),
        }
    }

    /// The same, letting pools mount only `paths` (empty: see
    /// [`Context::allowed_host_paths`]).
    pub fn with_allowed_host_paths(mut self, paths: Vec<String>) -> Self {
        self.allowed_host_paths = paths;
        self
    }

    /// The same, writing at most `per_second` times a second.
    pub fn with_write_rate(self, per_second: u32) -> Self {
        *lock(&self.writes) = WriteBudget::new(per_second);
        self
    }

    /// Waits for the turn of a write that changes something (see
    /// [`budget`]): every such write gets one, in the order asked.
    pub async fn change_permit(&self) {
        let admit = lock(&self.writes).admit(Class::Change, Instant::now());
        if let Admit::After(wait) = admit {
            self.metrics.write_waits.inc();
            tokio::time::sleep(wait).await;
        }
    }

    /// Whether a refresh (a place in line, a stall mark) may be written
    /// now; else how long to put it off, so that changes go first.
    pub fn refresh_permit(&self) -> Result<(), Duration> {
        match lock(&self.writes).admit(Class::Refresh, Instant::now()) {
            Admit::Later(wait) => {
                self.metrics.refreshes_put_off.inc();
                Err(wait)
            }
            Admit::Now | Admit::After(_) => Ok(()),
        }
    }

    /// Whether every cache a decision reads has been listed once. Before, a
    /// Transfer would read as naming no pool, or its agents as gone, and a
    /// restarted operator would fail or fail over running Transfers.
    pub async fn caches_ready(&self) -> bool {
        let all = async {
            let s = &self.stores;
            let (a, b, c, d, e) = futures::future::join5(
                s.pools.wait_until_ready(),
                s.transfers.wait_until_ready(),
                s.leases.wait_until_ready(),
                s.pods.wait_until_ready(),
                s.bindings.wait_until_ready(),
            )
            .await;
            a.is_ok() && b.is_ok() && c.is_ok() && d.is_ok() && e.is_ok()
        };
        tokio::time::timeout(Duration::from_millis(200), all)
            .await
            .unwrap_or(false)
    }

    /// The reconcile requests the planner and the agent watcher make; taken once.
    pub fn wakes(&self) -> Option<Wakes> {
        lock(&self.wakes).take()
    }

    /// Server-side applies `obj` as the operator, taking over its fields;
    /// returns the object as the API server then has it.
    pub async fn apply<K>(&self, obj: &K) -> crate::Result<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + serde::Serialize
            + Clone
            + std::fmt::Debug
            + serde::de::DeserializeOwned,
        K::DynamicType: Default,
    {
        use crate::Error;
        let ns = obj
            .meta()
            .namespace
            .clone()
            .ok_or(Error::Malformed("a namespace"))?;
        let name = obj.meta().name.clone().ok_or(Error::Malformed("a name"))?;
        let api: kube::Api<K> = kube::Api::namespaced(self.client.clone(), &ns);
        self.change_permit().await;
        let dt = K::DynamicType::default();
        let mut body = serde_json::to_value(obj).expect("Kubernetes objects serialize");
        body["apiVersion"] = serde_json::json!(K::api_version(&dt));
        body["kind"] = serde_json::json!(K::kind(&dt));
        let written = api
            .patch(
                &name,
                &kube::api::PatchParams::apply(wirerate_crds::contract::OPERATOR_MANAGER).force(),
                &kube::api::Patch::Apply(&body),
            )
            .await?;
        Ok(written)
    }

    /// Snapshots pools, agents and consents at `now`.
    pub fn view(&self, now: Timestamp) -> View {
        let pools = self
            .stores
            .pools
            .state()
            .iter()
            .filter_map(|p| {
                Some((
                    (p.metadata.namespace.clone()?, p.metadata.name.clone()?),
                    (**p).clone(),
                ))
            })
            .collect();
        let consents = self
            .stores
            .bindings
            .state()
            .iter()
            .filter_map(|b| b.consent())
            .collect();
        View {
            pools,
            agents: self.agents(now),
            consents,
        }
    }

    /// Every agent with a Lease, as it stands at `now`.
    pub fn agents(&self, now: Timestamp) -> HashMap<AgentId, Agent> {
        let pods = self.stores.pods.state();
        let mut by_ns: HashMap<&str, BTreeMap<String, &Pod>> = HashMap::new();
        for p in &pods {
            if let (Some(ns), Some(name)) = (&p.metadata.namespace, &p.metadata.name) {
                by_ns.entry(ns).or_default().insert(name.clone(), &**p);
            }
        }
        let none = BTreeMap::new();
        let leases = self.stores.leases.state();
        let mut beats = lock(&self.heartbeats);
        beats.keep_only(leases.iter().map(|l| &**l));
        leases
            .iter()
            .filter_map(|l| {
                let ns = l.metadata.namespace.as_deref().unwrap_or_default();
                let heard = beats.hear(l, now);
                agents::from_lease(l, by_ns.get(ns).unwrap_or(&none), now, heard)
            })
            .map(|a| (a.id(), a))
            .collect()
    }

    /// The freshest copy of `t`: the cache's, with the ledger's assignment
    /// and the operator's last status and labels laid over when the cache
    /// lags the operator's own last write.
    pub fn current(&self, t: &Transfer) -> Transfer {
        let cached = self
            .stores
            .transfers
            .get(&ObjectRef::from_obj(t))
            .filter(|c| c.metadata.uid == t.metadata.uid);
        let t = cached.as_deref().unwrap_or(t);
        let ledger = lock(&self.ledger);
        let t = planner::overlaid(t, &ledger).unwrap_or_else(|| t.clone());
        drop(ledger);
        lock(&self.written).over(t, Instant::now())
    }

    /// Notes a change a plan depends on (a Transfer, pool, binding or agent
    /// changed), so the next plan is computed afresh.
    pub fn changed(&self) {
        self.changes.fetch_add(1, Ordering::SeqCst);
        self.changed.notify_one();
    }

    /// Notes that a Lease or an agent's pod changed.
    pub fn agents_touched(&self) {
        self.agents_touched.notify_one();
    }

    /// The plan for the caches as they are: the last one, unless something
    /// changed since.
    pub fn plan(&self, now: Timestamp) -> Arc<Plan> {
        let mut s = lock(&self.scheduling);
        self.fresh(&mut s, now)
    }

    /// A plan that has seen every change noted so far: the planner's next,
    /// waited for (at most [`PLAN_WAIT`]), so that a burst of a thousand new
    /// Transfers costs a few plans rather than a thousand. Without the
    /// planner task (in tests), planned here.
    pub async fn recent_plan(&self, now: Timestamp) -> Arc<Plan> {
        if !self.planner_running.load(Ordering::SeqCst) {
            return self.plan(now);
        }
        let want = self.changes.load(Ordering::SeqCst);
        let mut rx = self.plans.subscribe();
        let _ = tokio::time::timeout(PLAN_WAIT, rx.wait_for(|at| *at >= want)).await;
        lock(&self.scheduling).plan.clone()
    }

    fn fresh(&self, s: &mut Scheduling, now: Timestamp) -> Arc<Plan> {
        let at = self.changes.load(Ordering::SeqCst);
        if s.at == Some(at) {
            return s.plan.clone();
        }
        let timer = self.metrics.plan.start_timer();
        let view = self.view(now);
        let transfers = self.stores.transfers.state();
        let mut ledger = lock(&self.ledger);
        // Entries the cache has caught up with, or whose Transfer is gone.
        let cached: HashMap<&str, &Transfer> = transfers
            .iter()
            .filter_map(|t| Some((t.metadata.uid.as_deref()?, &**t)))
            .collect();
        ledger.retain(|uid, a| {
            cached
                .get(uid.as_str())
                .is_some_and(|t| !planner::superseded(t, a))
        });
        let plan = s.planner.plan(&Inputs {
            transfers: &transfers,
            agents: &view.agents,
            catalog: view.catalog(),
            ledger: &ledger,
            now,
        });
        drop(ledger);
        timer.observe_duration();
        // The Transfers this plan gives agents to (or other agents than
        // before) are looked at now; the others see it when they next come.
        for (k, p) in &plan.placements {
            if s.plan.placements.get(k) != Some(p) {
                let _ = self
                    .wake_transfers
                    .unbounded_send(ObjectRef::new(&k.1).within(&k.0));
            }
        }
        s.plan = Arc::new(plan);
        s.at = Some(at);
        self.plans.send_replace(at);
        s.plan.clone()
    }

    /// Takes `key`'s placement in the latest plan, if it has one and
    /// `assign` accepts it (it may have gone stale: an agent lost since, or
    /// other roles needed): `assign` turns it into the Transfer's
    /// assignment, which goes into the ledger before anything is written.
    /// Undo with [`Context::release`] if it cannot be written.
    ///
    /// Why this cannot hand a slot out twice: the placements of one plan
    /// are disjoint, and a plan is computed (under the same lock) from the
    /// ledger, which holds every placement taken from the plans before it.
    pub fn take<T>(
        &self,
        key: &Key,
        uid: &str,
        now: Timestamp,
        assign: impl FnOnce(&Placement) -> Option<(Assignment, T)>,
    ) -> Option<(T, Option<Assignment>)> {
        let mut s = lock(&self.scheduling);
        if s.at.is_none() {
            self.fresh(&mut s, now);
        }
        let Some((a, out)) = assign(s.plan.placements.get(key)?) else {
            // Stale for this Transfer: forgotten here, so that the next plan,
            // placing it again, wakes it again.
            Arc::make_mut(&mut s.plan).placements.remove(key);
            self.changed();
            return None;
        };
        // Taken as planned, the plan stays true: the slots it handed out
        // are the ones now in use. No new plan needed.
        let before = lock(&self.ledger).insert(uid.to_owned(), a);
        Some((out, before))
    }

    /// Gives back a taken placement whose assignment was not written; the
    /// ledger's entry before it (a failover's stand-in) comes back.
    pub fn release(&self, uid: &str, before: Option<Assignment>) {
        let mut ledger = lock(&self.ledger);
        match before {
            Some(a) => ledger.insert(uid.to_owned(), a),
            None => ledger.remove(uid),
        };
        drop(ledger);
        self.changed();
    }

    /// Wakes queued Transfers whose place in line moved, at most every
    /// [`POSITION_REFRESH`]; a shifting queue of a thousand would otherwise
    /// rewrite a thousand statuses per start. When some are left to wake,
    /// says when to call again.
    pub fn announce(&self, now: Instant) -> Option<Instant> {
        let mut s = lock(&self.scheduling);
        let shown: HashMap<Key, i32> = s
            .plan
            .positions
            .iter()
            .map(|(k, p)| (k.clone(), budget::shown_position(*p)))
            .collect();
        // Out of the queue (placed, deleted): no place in line to refresh.
        s.position_written.retain(|k, _| shown.contains_key(k));
        let moved: Vec<Key> = shown
            .iter()
            .filter(|(k, p)| s.announced.get(*k) != Some(*p))
            .map(|(k, _)| k.clone())
            .collect();
        if moved.is_empty() {
            return None;
        }
        if let Some(at) = s.announced_at
            && now < at + POSITION_REFRESH
        {
            return Some(at + POSITION_REFRESH);
        }
        for k in moved {
            let _ = self
                .wake_transfers
                .unbounded_send(ObjectRef::new(&k.1).within(&k.0));
        }
        s.announced = shown;
        s.announced_at = Some(now);
        None
    }

    /// Notes the place in line `key`'s status now shows, so that it is
    /// woken only when the plan moves it from there; `written` when it was
    /// written just now.
    pub fn shown(&self, key: &Key, position: Option<i32>, written: Option<Instant>) {
        let mut s = lock(&self.scheduling);
        match position {
            Some(p) => {
                s.announced.insert(key.clone(), p);
                if let Some(at) = written {
                    s.position_written.insert(key.clone(), at);
                }
            }
            None => {
                s.announced.remove(key);
                s.position_written.remove(key);
            }
        };
    }

    /// Whether `key`'s new place in line may be written at `now`, else how
    /// long until it may (see [`budget::position_due`]).
    pub fn position_due(&self, key: &Key, now: Instant) -> Result<(), Duration> {
        let s = lock(&self.scheduling);
        let since = s
            .position_written
            .get(key)
            .map(|at| now.saturating_duration_since(*at));
        budget::position_due(since)
    }

    /// Plans after every change, debounced, and wakes who the plans concern.
    /// Runs for the life of the operator.
    pub async fn plan_on_changes(self: Arc<Self>) {
        self.planner_running.store(true, Ordering::SeqCst);
        let mut next: Option<Instant> = None;
        loop {
            match next {
                Some(at) => {
                    tokio::select! {
                        () = self.changed.notified() => {}
                        () = tokio::time::sleep_until(at.into()) => {}
                    }
                }
                None => self.changed.notified().await,
            }
            tokio::time::sleep(DEBOUNCE).await;
            self.plan(Timestamp::now());
            next = self.announce(Instant::now());
        }
    }

    /// Watches the agents: when one comes, goes, or changes in a way that
    /// matters (not a mere renewal), the Transfers it holds and its pool are
    /// looked at, and the next plan sees it. A Lease that runs out sends no
    /// event, so this also wakes when the next one would. Runs for the life
    /// of the operator.
    pub async fn watch_agents(self: Arc<Self>) {
        // Unknown at first: the controllers look at everything when they start.
        let mut known: Option<HashMap<AgentId, agents::Summary>> = None;
        loop {
            let now = Timestamp::now();
            let all = self.agents(now);
            let summaries: HashMap<AgentId, agents::Summary> = all
                .iter()
                .map(|(id, a)| (id.clone(), a.summary()))
                .collect();
            let changed = known
                .as_ref()
                .map(|k| agents::changed(k, &summaries))
                .unwrap_or_default();
            if !changed.is_empty() {
                self.changed();
                for t in self.stores.transfers.state() {
                    let Some(s) = &t.status else { continue };
                    if s.occupied()
                        .any(|(role, who)| changed.contains(&AgentId::assigned(&t, role, who)))
                    {
                        let _ = self.wake_transfers.unbounded_send(ObjectRef::from_obj(&*t));
                    }
                }
                let pools: BTreeSet<(&str, &str)> = changed
                    .iter()
                    .map(|id| (id.namespace.as_str(), id.pool.as_str()))
                    .collect();
                for (ns, pool) in pools {
                    let _ = self
                        .wake_pools
                        .unbounded_send(ObjectRef::new(pool).within(ns));
                }
            }
            known = Some(summaries);
            // A second past the earliest expiry, so the Lease reads as expired.
            let next = all
                .values()
                .filter(|a| a.live())
                .filter_map(|a| a.expires)
                .min()
                .map(|at| {
                    let wait = if at > now {
                        now.duration_until(at).unsigned_abs()
                    } else {
                        Duration::ZERO
                    };
                    Instant::now() + wait + Duration::from_secs(1)
                });
            match next {
                Some(at) => {
                    tokio::select! {
                        () = self.agents_touched.notified() => {}
                        () = tokio::time::sleep_until(at.into()) => {}
                    }
                }
                None => self.agents_touched.notified().await,
            }
            // A hundred agents renew twenty times a second: look at them
            // together. A quarter second is nothing beside a Lease's 15 s.
            tokio::time::sleep(AGENTS_DEBOUNCE).await;
        }
    }

    /// Transfers in progress on each agent, as the current plan counts them.
    pub fn load(&self, now: Timestamp) -> HashMap<AgentId, i32> {
        self.plan(now).load.clone()
    }
}

impl View {
    /// What Transfers are validated against.
    pub fn catalog(&self) -> crate::validate::Catalog<'_> {
        crate::validate::Catalog {
            pools: &self.pools,
            consents: &self.consents,
        }
    }
}
