//! What every reconcile shares: the client, the watch caches, the metrics,
//! and the scheduler's lock and ledger.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::Store;
use wirerate_crds::transfer::AgentRef;
use wirerate_crds::{Consent, DtnPool, DtnPoolBinding, Transfer};

use crate::agents::{self, Agent, AgentId};
use crate::metrics::Metrics;
use crate::scheduler::Key;

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
    /// Assignments written but maybe not yet back through the watch, by Transfer uid.
    pub ledger: Mutex<HashMap<String, Assignment>>,
    /// Serialises scheduling so two reconciles never give out the same slot.
    pub schedule: tokio::sync::Mutex<()>,
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

/// Who a Transfer's attempt is assigned to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assignment {
    /// Attempt number.
    pub attempt: i32,
    /// Sender agent.
    pub sender: Option<AgentRef>,
    /// Receiver agent.
    pub receiver: Option<AgentRef>,
}

impl Assignment {
    /// The assignment a Transfer's status records.
    pub fn of(t: &Transfer) -> Self {
        let s = t.status.clone().unwrap_or_default();
        Self {
            attempt: s.attempt,
            sender: s.sender,
            receiver: s.receiver,
        }
    }
}

/// A consistent snapshot of the caches.
pub struct View {
    /// Pools by namespace and name.
    pub pools: BTreeMap<Key, DtnPool>,
    /// Agents by identity.
    pub agents: HashMap<AgentId, Agent>,
    /// Transfers, with assignments from the ledger laid over stale cache entries.
    pub transfers: Vec<Transfer>,
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
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            metrics,
            stores,
            ledger: Mutex::default(),
            schedule: tokio::sync::Mutex::new(()),
        }
    }

    /// Server-side applies `obj` as the operator, taking over its fields.
    pub async fn apply<K>(&self, obj: &K) -> crate::Result<()>
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
        let dt = K::DynamicType::default();
        let mut body = serde_json::to_value(obj).expect("Kubernetes objects serialize");
        body["apiVersion"] = serde_json::json!(K::api_version(&dt));
        body["kind"] = serde_json::json!(K::kind(&dt));
        api.patch(
            &name,
            &kube::api::PatchParams::apply(wirerate_crds::contract::OPERATOR_MANAGER).force(),
            &kube::api::Patch::Apply(&body),
        )
        .await?;
        Ok(())
    }

    /// Snapshots the caches at `now`.
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
        let pods = self.stores.pods.state();
        let leases = self.stores.leases.state();
        let mut agents = HashMap::new();
        for l in &leases {
            let ns = l.metadata.namespace.clone().unwrap_or_default();
            let in_ns: BTreeMap<String, &Pod> = pods
                .iter()
                .filter(|p| p.metadata.namespace.as_deref() == Some(ns.as_str()))
                .filter_map(|p| Some((p.metadata.name.clone()?, &**p)))
                .collect();
            if let Some(a) = agents::from_lease(l, &in_ns, now) {
                agents.insert(a.id(), a);
            }
        }
        let mut ledger = self.ledger.lock().expect("ledger lock");
        let transfers = self
            .stores
            .transfers
            .state()
            .iter()
            .map(|t| {
                let mut t = (**t).clone();
                let uid = t.metadata.uid.clone().unwrap_or_default();
                if let Some(a) = ledger.get(&uid) {
                    let seen = Assignment::of(&t);
                    if seen.attempt >= a.attempt && seen.sender.is_some() {
                        ledger.remove(&uid);
                    } else {
                        overlay(&mut t, a);
                    }
                }
                t
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
            agents,
            transfers,
            consents,
        }
    }
}

fn overlay(t: &mut Transfer, a: &Assignment) {
    let s = t.status.get_or_insert_with(Default::default);
    s.attempt = a.attempt;
    s.sender = a.sender.clone();
    s.receiver = a.receiver.clone();
}

impl View {
    /// What Transfers are validated against.
    pub fn catalog(&self) -> crate::validate::Catalog<'_> {
        crate::validate::Catalog {
            pools: &self.pools,
            consents: &self.consents,
        }
    }

    /// Transfers assigned to each agent, counting only those still in progress.
    pub fn load(&self) -> HashMap<AgentId, i32> {
        let mut load = HashMap::new();
        for t in &self.transfers {
            let s = t.status.clone().unwrap_or_default();
            if s.phase.is_some_and(|p| p.is_final()) || t.metadata.deletion_timestamp.is_some() {
                continue;
            }
            for (role, who) in s.assigned() {
                *load.entry(AgentId::assigned(t, role, who)).or_insert(0) += 1;
            }
        }
        load
    }
}
