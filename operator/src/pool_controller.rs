//! The DtnPool reconciler: renders the agents and reports on them.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde_json::json;
use wirerate_crds::{DtnPool, contract};

use crate::context::Context;
use crate::{Error, Result, pool_status, render};

/// Finalizer that removes the pool's Roles in other namespaces (owner
/// references cannot reach across namespaces).
pub const POOL_FINALIZER: &str = "wirerate.io/remote-rbac";

/// Reconciles one DtnPool.
#[tracing::instrument(skip_all, fields(pool = %pool.name_any(), ns = pool.namespace().unwrap_or_default()))]
pub async fn reconcile(pool: Arc<DtnPool>, ctx: Arc<Context>) -> Result<Action> {
    let _timer = ctx
        .metrics
        .duration
        .with_label_values(&["dtnpool"])
        .start_timer();
    ctx.metrics.reconciles.with_label_values(&["dtnpool"]).inc();
    let ns = pool.namespace().ok_or(Error::Malformed("a namespace"))?;
    let api: Api<DtnPool> = Api::namespaced(ctx.client.clone(), &ns);
    finalizer(&api, POOL_FINALIZER, pool, |event| async {
        match event {
            Finalizer::Apply(p) => apply(&p, &ctx, &api).await,
            Finalizer::Cleanup(p) => cleanup(&p, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
}

/// Logs and counts a failed reconcile, and retries it.
pub fn error_policy(pool: Arc<DtnPool>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(pool = %pool.name_any(), "reconcile failed: {error}");
    ctx.metrics
        .failures
        .with_label_values(&["dtnpool", error.metric_label()])
        .inc();
    Action::requeue(Duration::from_secs(5))
}

async fn ssa<K>(ctx: &Context, obj: &K) -> Result<()>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Serialize
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
    K::DynamicType: Default,
{
    let ns = obj
        .meta()
        .namespace
        .clone()
        .ok_or(Error::Malformed("a namespace"))?;
    let name = obj.meta().name.clone().ok_or(Error::Malformed("a name"))?;
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &ns);
    let dt = K::DynamicType::default();
    let mut body = serde_json::to_value(obj).expect("Kubernetes objects serialize");
    body["apiVersion"] = json!(K::api_version(&dt));
    body["kind"] = json!(K::kind(&dt));
    api.patch(
        &name,
        &PatchParams::apply(contract::OPERATOR_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await?;
    Ok(())
}

async fn apply(pool: &DtnPool, ctx: &Context, api: &Api<DtnPool>) -> Result<Action> {
    let r = render::render(pool);
    ssa(ctx, &r.service_account).await?;
    ssa(ctx, &r.role).await?;
    ssa(ctx, &r.role_binding).await?;
    // A missing allowed namespace degrades the pool; its own namespace still works.
    let mut missing = Vec::new();
    for (role, rb) in &r.remote {
        match ssa(ctx, role).await {
            Err(Error::Kube(kube::Error::Api(e))) if e.code == 404 => {
                missing.push(role.metadata.namespace.clone().unwrap_or_default());
                continue;
            }
            other => other?,
        }
        ssa(ctx, rb).await?;
    }
    ssa(ctx, &r.service).await?;
    ssa(ctx, &r.stateful_set).await?;

    let now = Timestamp::now();
    let view = ctx.view(now);
    let ns = pool.namespace().unwrap_or_default();
    let name = pool.name_any();
    let agents: Vec<_> = view
        .agents
        .values()
        .filter(|a| a.namespace == ns && a.pool == name)
        .collect();
    let pods_state = ctx.stores.pods.state();
    let pods: Vec<&Pod> = pods_state
        .iter()
        .filter(|p| p.metadata.namespace.as_deref() == Some(ns.as_str()))
        .filter(|p| p.labels().get(contract::POOL_LABEL) == Some(&name))
        .map(|p| &**p)
        .collect();
    let status = pool_status::status(pool, &agents, &pods, &view.load(), &missing, now);
    if pool.status.as_ref() != Some(&status) {
        let patch =
            json!({"apiVersion": "wirerate.io/v1alpha1", "kind": "DtnPool", "status": status});
        api.patch_status(
            &name,
            &PatchParams::apply(contract::OPERATOR_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await?;
    }
    // Heartbeats are not watched events; look again on their beat.
    Ok(Action::requeue(Duration::from_secs(10)))
}

async fn cleanup(pool: &DtnPool, ctx: &Context) -> Result<Action> {
    for (role, _) in render::render(pool).remote {
        let ns = role.metadata.namespace.clone().unwrap_or_default();
        let name = role.metadata.name.clone().unwrap_or_default();
        let dp = DeleteParams::default();
        let gone = [
            Api::<RoleBinding>::namespaced(ctx.client.clone(), &ns)
                .delete(&name, &dp)
                .await
                .map(|_| ()),
            Api::<Role>::namespaced(ctx.client.clone(), &ns)
                .delete(&name, &dp)
                .await
                .map(|_| ()),
        ];
        for result in gone {
            match result {
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                other => other?,
            }
        }
    }
    Ok(Action::await_change())
}
