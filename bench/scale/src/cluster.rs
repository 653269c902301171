//! Getting a cluster ready for the bench and tidy after it, the same way on
//! the double and on a real API server: the CRDs (from `wirerate_crds`),
//! the namespaces, the pools and the bindings. What it created, it removes.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, bail};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, CustomResourceExt};
use serde_json::{Value, json};
use wirerate_crds::{DtnPool, DtnPoolBinding, Transfer};

use crate::scenario::{POOL_NAMESPACE, Scenario};
use wirerate_apiserver_double::DRIVER_AGENT;

/// Field manager of everything the driver applies itself.
pub(crate) const DRIVER_MANAGER: &str = "wirerate-scale";

/// A client for `kubeconfig` whose requests say they are the driver's.
pub(crate) async fn client(kubeconfig: &Path) -> anyhow::Result<Client> {
    let kc = Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("cannot read {}", kubeconfig.display()))?;
    let mut config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .context("unusable kubeconfig")?;
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(DRIVER_AGENT),
    ));
    Ok(Client::try_from(config)?)
}

/// An untyped API for kind `K`, in `namespace` or across all.
fn api_for<K>(client: &Client, namespace: Option<&str>) -> Api<DynamicObject>
where
    K: kube::Resource<DynamicType = ()>,
{
    let ar = ApiResource::erase::<K>(&());
    match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

/// Applies `obj` as the driver.
async fn apply<K>(client: &Client, obj: &Value) -> anyhow::Result<()>
where
    K: kube::Resource<DynamicType = ()>,
{
    let name = obj["metadata"]["name"].as_str().context("a name")?;
    let api = api_for::<K>(client, obj["metadata"]["namespace"].as_str());
    api.patch(
        name,
        &PatchParams::apply(DRIVER_MANAGER).force(),
        &Patch::Apply(obj),
    )
    .await
    .with_context(|| format!("cannot apply {name}"))?;
    Ok(())
}

/// What setup created, so cleanup removes that and nothing else.
#[derive(Debug, Default)]
pub(crate) struct Created {
    crds: Vec<String>,
    namespaces: Vec<String>,
}

/// CRDs, namespaces, pools and bindings.
pub(crate) async fn setup(client: &Client, s: &Scenario) -> anyhow::Result<Created> {
    let mut created = Created::default();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in [DtnPool::crd(), Transfer::crd(), DtnPoolBinding::crd()] {
        let name = crd.metadata.name.clone().context("a CRD name")?;
        if crds.get_opt(&name).await?.is_none() {
            crds.create(&Default::default(), &crd)
                .await
                .with_context(|| format!("cannot create the CRD {name}"))?;
            created.crds.push(name.clone());
        }
        wait_established(&crds, &name).await?;
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for ns in s.all_namespaces() {
        if namespaces.get_opt(&ns).await?.is_none() {
            let obj: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}}))?;
            namespaces
                .create(&Default::default(), &obj)
                .await
                .with_context(|| format!("cannot create namespace {ns}"))?;
            created.namespaces.push(ns);
        }
    }
    for pool in s.pool_names() {
        apply::<DtnPool>(client, &s.pool(&pool)).await?;
    }
    for b in s.bindings() {
        apply::<DtnPoolBinding>(client, &b).await?;
    }
    Ok(created)
}

async fn wait_established(crds: &Api<CustomResourceDefinition>, name: &str) -> anyhow::Result<()> {
    for _ in 0..150 {
        let crd = crds.get(name).await?;
        let established = crd
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        if established {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bail!("the CRD {name} did not become Established within 30 s")
}

/// Removes what setup created. Run with the operator stopped: finalizers
/// nobody will remove any more are taken off first, so namespaces go.
pub(crate) async fn cleanup(
    client: &Client,
    s: &Scenario,
    created: &Created,
) -> anyhow::Result<()> {
    let unfinalize = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    let pp = PatchParams::default();
    for ns in s.user_namespaces() {
        let api = api_for::<Transfer>(client, Some(&ns));
        for t in api.list(&ListParams::default()).await?.items {
            if let Some(name) = t.metadata.name.filter(|_| t.metadata.finalizers.is_some()) {
                api.patch(&name, &pp, &unfinalize).await?;
            }
        }
    }
    let pools = api_for::<DtnPool>(client, Some(POOL_NAMESPACE));
    for p in pools.list(&ListParams::default()).await?.items {
        if let Some(name) = p.metadata.name {
            api_ok(pools.patch(&name, &pp, &unfinalize).await.map(|_| ()))?;
            api_ok(
                pools
                    .delete(&name, &DeleteParams::default())
                    .await
                    .map(|_| ()),
            )?;
        }
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for ns in &created.namespaces {
        api_ok(
            namespaces
                .delete(ns, &DeleteParams::default())
                .await
                .map(|_| ()),
        )?;
    }
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for name in &created.crds {
        api_ok(
            crds.delete(name, &DeleteParams::default())
                .await
                .map(|_| ()),
        )?;
    }
    Ok(())
}

/// A 404 is as good as done.
fn api_ok(r: kube::Result<()>) -> anyhow::Result<()> {
    match r {
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        other => Ok(other?),
    }
}
