//! The DtnPool reconciler: renders the agents and reports on them.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Event as CoreEvent;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::{Resource, ResourceExt};
use wirerate_crds::DtnPoolStatus;
use wirerate_crds::conditions::{self, types};
use wirerate_crds::{DtnPool, contract};

use crate::context::{Context, lock};
use crate::{
    Error, Result, applied, ownership, path_tests, pool_status, render, token_grant, validate,
};

/// Finalizer that removes the pool's Roles in other namespaces (owner
/// references cannot reach across namespaces).
pub const POOL_FINALIZER: &str = "wirerate.io/remote-rbac";

/// Reconciles one DtnPool.
#[tracing::instrument(skip_all, fields(pool = %pool.name_any(), ns = pool.namespace().unwrap_or_default()))]
pub async fn reconcile(pool: Arc<DtnPool>, ctx: Arc<Context>) -> Result<Action> {
    if !ctx.caches_ready().await {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
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

/// What of a pool needs a reconcile when it changes: its spec (the
/// generation), its deletion and its finalizers. Not its status: the pool's
/// own status write (an agent's heartbeat moved) would otherwise trigger
/// the next reconcile, which writes the next heartbeat, about once a second
/// per pool while nothing happens. Agents' changes reach the pool through
/// the agent watcher, and heartbeats on the requeue.
pub fn changed(pool: &DtnPool) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (
        pool.metadata.generation,
        &pool.metadata.uid,
        pool.metadata.deletion_timestamp.is_some(),
        &pool.metadata.finalizers,
    )
        .hash(&mut h);
    Some(h.finish())
}

/// Logs and counts a failed reconcile, and retries it.
pub fn error_policy(pool: Arc<DtnPool>, error: &Error, ctx: Arc<Context>) -> Action {
    if error.is_stale_copy() {
        tracing::debug!(pool = %pool.name_any(), "finalizer already added; looking again");
        return Action::requeue(Duration::from_secs(1));
    }
    tracing::warn!(pool = %pool.name_any(), "reconcile failed: {error}");
    ctx.metrics
        .failures
        .with_label_values(&["dtnpool", error.metric_label()])
        .inc();
    Action::requeue(Duration::from_secs(5))
}

async fn apply(pool: &DtnPool, ctx: &Context, api: &Api<DtnPool>) -> Result<Action> {
    let now = Timestamp::now();
    let view = ctx.view(now);
    let ns = pool.namespace().unwrap_or_default();
    let name = pool.name_any();
    let key = (ns.clone(), name.clone());
    // The pool's offer grants nothing by itself: a namespace is served only
    // once it consented (see `wirerate_crds::binding`).
    let (serving, awaiting): (Vec<String>, Vec<String>) = pool
        .spec
        .allowed_namespaces
        .iter()
        .filter(|n| **n != ns)
        .cloned()
        .partition(|n| validate::serves(pool, &key, n, &view.consents));

    let r = render::render(pool, &serving);
    let unusable = settle_grants(pool, ctx, (&r, &serving), &view).await?;
    let written = write_rendered(pool, ctx, &r).await;

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
    let create_failure = if (pods.len() as i32) < pool.spec.replicas {
        create_failure(ctx, &ns, &render::agent_name(pool)).await
    } else {
        None
    };
    let seen = pool_status::Observed {
        agents: &agents,
        pods: &pods,
        active: ctx.load(now),
        namespaces: pool_status::Namespaces {
            serving: &serving,
            awaiting: &awaiting,
            missing: &written.missing,
        },
        create_failure: create_failure.as_deref(),
    };
    let mut status = pool_status::status(pool, &seen, now);
    let neighbours: Vec<_> = view.agents.values().filter(|a| a.namespace == ns).collect();
    status.path_tests = path_tests::status(pool, &view.pools, &neighbours, &unusable, now);
    let blocked = written.blocked;
    pool_status::set_taken(&mut status, pool, &blocked.taken, &blocked.failed, now);
    let policies = lock(&ctx.policies_missing).clone();
    pool_status::set_policies(&mut status, pool, policies.as_deref(), now);
    pool_status::set_refused(&mut status, pool, written.refused.as_deref(), now);
    write_status(pool, ctx, api, &status).await?;
    if let Some(e) = blocked.error {
        // After the status that says so; the error retries it sooner.
        return Err(e);
    }
    // Heartbeats are not watched events; look again on their beat.
    Ok(Action::requeue(Duration::from_secs(10)))
}

/// Takes back what the pool no longer grants, before anything else is
/// written, and grants what its path tests need; returns the path-test
/// tokens it found unusable.
async fn settle_grants(
    pool: &DtnPool,
    ctx: &Context,
    (r, serving): (&render::Rendered, &[String]),
    view: &crate::context::View,
) -> Result<path_tests::Unusable> {
    // Revocation first, so that no other namespace's trouble below can hold
    // it up. Only when what the pool serves may have changed: it lists Roles
    // across the cluster.
    let old = pool.status.clone().unwrap_or_default();
    let spec_moved = pool.status.is_none() || old.observed_generation != pool.metadata.generation;
    if spec_moved || old.serving_namespaces != serving {
        revoke_remote(pool, ctx, &r.remote).await?;
    }
    // The path-test grants before the applies below, for the same reason,
    // and never in their way: their trouble is logged, and a revocation
    // that failed, or that a start cannot know of, is tried again on every
    // pass until it goes through.
    let uid = pool.metadata.uid.clone().unwrap_or_default();
    let pending = ctx
        .revokes_settled
        .lock()
        .map(|p| !p.contains(&uid))
        .unwrap_or(true);
    let mut revoked = None;
    if path_tests::listens(pool) {
        if let Err(e) = grant_path_tests(pool, ctx, &view.pools).await {
            tracing::warn!(error = %e, "cannot grant the pool's path-test token");
        }
    } else if spec_moved || pending {
        revoked = Some(revoke_path_tests(pool, ctx).await);
    }
    let unusable = unusable_tokens(pool, ctx).await;
    if let Some((role, binding)) = path_tests::external_grant(pool, &unusable) {
        if let Err(e) = grant_external(pool, ctx, &role, &binding).await {
            tracing::warn!(error = %e, "cannot grant the external path-test targets' tokens");
        }
    } else if spec_moved || pending || !unusable.is_empty() {
        // Also while every Secret is unusable: a label taken off one is
        // seen on a pass that moved no spec.
        let name = path_tests::external_grant_name(&pool.name_any());
        let gone = revoke_grant(pool, ctx, &name).await;
        revoked = Some(revoked.unwrap_or(Ok(())).and(gone));
    }
    if let Some(revoked) = revoked {
        if let Err(e) = &revoked {
            tracing::warn!(error = %e, "cannot take the pool's path-test grant back; trying again");
        }
        if let Ok(mut p) = ctx.revokes_settled.lock() {
            if revoked.is_ok() {
                p.insert(uid);
            } else {
                p.remove(&uid);
            }
        }
    }
    Ok(unusable)
}

/// What writing a pool's rendered objects came to.
struct Written {
    blocked: Blocked,
    /// Consenting namespaces the pool's Role could not be written in (not
    /// those where the name is someone else's: those are in `blocked`).
    missing: Vec<String>,
    /// Why the StatefulSet was not written: host paths the admin did not
    /// allow.
    refused: Option<String>,
}

/// Writes what the pool renders, in order, each only where it is the
/// pool's (see `ensure`), and the StatefulSet only once the agents'
/// identity, grants and Service are in place.
async fn write_rendered(pool: &DtnPool, ctx: &Context, r: &render::Rendered) -> Written {
    // Nothing rendered is written over someone else's object of its name,
    // nor taken (an owner reference added would have the pool's deletion
    // delete it). A ServiceAccount or RBAC object that is not the pool's
    // stops the agents and their other grants: they would run with, or
    // hand out, someone else's rights.
    let mut blocked = Blocked::default();
    let account = ensure(ctx, pool, &r.service_account, &mut blocked).await;
    let role = ensure(ctx, pool, &r.role, &mut blocked).await;
    let bound = role && ensure(ctx, pool, &r.role_binding, &mut blocked).await;
    let rbac = account && bound;
    // A consenting namespace that vanished, or refuses the Role, degrades
    // the pool; its own namespace and the others still work.
    let mut missing = Vec::new();
    for (role, rb) in r.remote.iter().filter(|_| rbac) {
        let at = role.metadata.namespace.clone().unwrap_or_default();
        let mut here = Blocked::default();
        if !(ensure(ctx, pool, role, &mut here).await && ensure(ctx, pool, rb, &mut here).await) {
            tracing::warn!(
                namespace = at,
                "cannot give the pool's agents access: {here:?}"
            );
            if here.taken.is_empty() {
                missing.push(at);
            }
            blocked.taken.append(&mut here.taken);
        }
    }
    let service = ensure(ctx, pool, &r.service, &mut blocked).await;
    let refused = validate::host_path_refused(pool, &ctx.allowed_host_paths);
    if rbac && service && refused.is_none() {
        ensure(ctx, pool, &r.stateful_set, &mut blocked).await;
    }
    Written {
        blocked,
        missing,
        refused,
    }
}

/// Announces what changed in the pool's status, and writes it when it
/// differs from what the pool has.
async fn write_status(
    pool: &DtnPool,
    ctx: &Context,
    api: &Api<DtnPool>,
    status: &DtnPoolStatus,
) -> Result<()> {
    announce(ctx, pool, status).await;
    for c in [pool_status::NAME_TAKEN, pool_status::HOST_PATH_NOT_ALLOWED] {
        announce_condition(ctx, pool, status, c).await;
    }
    if pool.status.as_ref() != Some(status) {
        let patch = wirerate_crds::apply::StatusApply::new::<DtnPool>(status);
        api.patch_status(
            &pool.name_any(),
            &PatchParams::apply(contract::OPERATOR_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await?;
    }
    Ok(())
}

/// What kept the pool's rendered objects from being written: names someone
/// else holds ("Kind namespace/name"), and writes that failed (with why).
#[derive(Debug, Default)]
struct Blocked {
    taken: Vec<String>,
    failed: Vec<String>,
    /// The first failed write's error, for the retry.
    error: Option<Error>,
}

/// Creates `obj` if its name is free, or applies it over the pool's own
/// object of that name (see [`render::claim`]); true when it is the pool's
/// and up to date. Someone else's object is left as it is and recorded as
/// taken; a failed write is recorded too, so a takeover stopped halfway
/// shows in the pool's status.
async fn ensure<K>(ctx: &Context, pool: &DtnPool, obj: &K, blocked: &mut Blocked) -> bool
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + serde::Serialize
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
{
    let ns = obj.meta().namespace.clone().unwrap_or_default();
    let name = obj.meta().name.clone().unwrap_or_default();
    let what = format!("{} {ns}/{name}", K::kind(&()));
    let rendered = applied::rendered(obj);
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &ns);
    let done = match api.get_metadata_opt(&name).await {
        Err(e) => Err(Error::from(e)),
        Ok(m) => match render::claim(pool, obj.meta(), m.as_ref().map(|m| &m.metadata)) {
            render::Claim::Taken => {
                blocked.taken.push(what);
                return false;
            }
            render::Claim::Create => {
                let pp = PostParams {
                    field_manager: Some(contract::OPERATOR_MANAGER.into()),
                    ..PostParams::default()
                };
                match api.create(&pp, obj).await {
                    Ok(made) => {
                        remember(ctx, &made, rendered);
                        Ok(())
                    }
                    // Made since the look: the next pass decides whose.
                    Err(kube::Error::Api(e)) if e.code == 409 => return false,
                    Err(e) => Err(e.into()),
                }
            }
            render::Claim::Update { uid } => {
                // The uid in the apply makes it a conflict if another object
                // took the name since the look.
                let mut o = obj.clone();
                o.meta_mut().uid = Some(uid);
                apply_remembered(ctx, &o, rendered, m.as_ref().map(|m| &m.metadata)).await
            }
        },
    };
    match done {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(object = what, "cannot write the pool's object: {e}");
            blocked.failed.push(format!("{what}: {e}"));
            blocked.error.get_or_insert(e);
            false
        }
    }
}

/// Applies `obj`, which renders as `rendered` (`applied::rendered`), over
/// the operator's own object whose metadata was just read as `seen`,
/// unless that object is as the operator last left it.
async fn apply_remembered<K>(
    ctx: &Context,
    obj: &K,
    rendered: u64,
    seen: Option<&kube::api::ObjectMeta>,
) -> Result<()>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + serde::Serialize
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
{
    let left = seen.is_some_and(|m| {
        m.uid.as_deref().is_some_and(|uid| {
            lock(&ctx.applied).unchanged(
                &applied::key_of(obj),
                uid,
                m.resource_version.as_deref(),
                rendered,
            )
        })
    });
    if !left {
        let written = ctx.apply(obj).await?;
        remember(ctx, &written, rendered);
    }
    Ok(())
}

/// Notes how the operator left `written`, which it wrote from what renders
/// as `rendered`.
fn remember<K: Resource<DynamicType = ()>>(ctx: &Context, written: &K, rendered: u64) {
    let meta = written.meta();
    lock(&ctx.applied).record(
        applied::key_of(written),
        meta.uid.clone(),
        meta.resource_version.clone(),
        rendered,
    );
}

/// A Warning Event when the pool's condition `type_` (one that is true
/// when something is wrong) turns true or says something else.
async fn announce_condition(ctx: &Context, pool: &DtnPool, status: &DtnPoolStatus, type_: &str) {
    let find =
        |s: Option<&DtnPoolStatus>| s.and_then(|s| conditions::find(&s.conditions, type_).cloned());
    let Some(new) = find(Some(status)) else {
        return;
    };
    let old = find(pool.status.as_ref());
    if new.status != "True" || old.is_some_and(|o| o.status == "True" && o.message == new.message) {
        return;
    }
    let ev = Event {
        type_: EventType::Warning,
        reason: new.reason.clone(),
        note: Some(new.message.chars().take(1000).collect()),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&ev, &pool.object_ref(&())).await {
        tracing::warn!(reason = ev.reason, error = %e, "cannot publish an event");
    }
}

/// Gives a listening pool its listeners' token, readable by its own agents
/// and by those of the pools of its namespace that test it. A Secret, Role
/// or RoleBinding of those names the pool does not own is someone else's:
/// it is neither handed out nor taken over, the pool's own grant goes, and
/// an Event says why.
async fn grant_path_tests(
    pool: &DtnPool,
    ctx: &Context,
    pools: &std::collections::BTreeMap<crate::scheduler::Key, DtnPool>,
) -> Result<()> {
    let testers = path_tests::testers_of(pool, pools.values());
    let (secret, role, binding) = path_tests::grant(pool, &testers);
    let ns = pool.namespace().unwrap_or_default();
    let uid = pool.metadata.uid.clone().unwrap_or_default();
    let grant = path_tests::grant_name(&pool.name_any());
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let name = secret.metadata.name.clone().unwrap_or_default();
    let seen = look_at_grant(ctx, &ns, &grant, &uid).await?;
    let taken = if let Some(what) = seen.taken {
        Some(what)
    } else {
        // Asked before created, so that an existing token costs a read and
        // no fresh one travels to the API server on every pass.
        let ours = match secrets.get_metadata_opt(&name).await? {
            Some(m) => ownership::owned_by(&m.metadata, "DtnPool", &uid),
            None => token_grant::ensure_secret(&secrets, &secret, "DtnPool", &uid).await?,
        };
        (!ours).then(|| format!("Secret {ns}/{name}"))
    };
    if let Some(what) = taken {
        taken_event(pool, ctx, &what).await;
        return revoke_path_tests(pool, ctx).await;
    }
    apply_remembered(ctx, &role, applied::rendered(&role), seen.role.as_ref()).await?;
    let rendered = applied::rendered(&binding);
    apply_remembered(ctx, &binding, rendered, seen.binding.as_ref()).await
}

/// Lets a pool's own agents read the token Secrets of its external
/// targets, unless a Role or RoleBinding of the grant's name is someone
/// else's (then an Event says so, and nothing is applied).
async fn grant_external(
    pool: &DtnPool,
    ctx: &Context,
    role: &Role,
    binding: &RoleBinding,
) -> Result<()> {
    let ns = pool.namespace().unwrap_or_default();
    let uid = pool.metadata.uid.clone().unwrap_or_default();
    let grant = path_tests::external_grant_name(&pool.name_any());
    let seen = look_at_grant(ctx, &ns, &grant, &uid).await?;
    if let Some(what) = seen.taken {
        taken_event(pool, ctx, &what).await;
        // The pool's own half goes too: a binding of ours to someone
        // else's Role would give the agents whatever that Role allows.
        return revoke_grant(pool, ctx, &grant).await;
    }
    apply_remembered(ctx, role, applied::rendered(role), seen.role.as_ref()).await?;
    apply_remembered(
        ctx,
        binding,
        applied::rendered(binding),
        seen.binding.as_ref(),
    )
    .await
}

/// Why each token Secret `pool`'s external targets name cannot be granted,
/// if it cannot: it must exist and be marked for wirerate, as an external
/// receiver's token must (the pool's author chose it). One that cannot be
/// looked at is not granted either, and the rest of the pool goes on.
async fn unusable_tokens(pool: &DtnPool, ctx: &Context) -> path_tests::Unusable {
    let ns = pool.namespace().unwrap_or_default();
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let mut out = path_tests::Unusable::new();
    for name in path_tests::external_secrets(pool) {
        let field = "pathTests.external[].tokenSecret";
        let why = match token_grant::unmarked_token(&api, &ns, &name, field).await {
            Ok(why) => why,
            Err(e) => Some(format!("cannot look at Secret {ns}/{name}: {e}")),
        };
        if let Some(why) = why {
            out.insert(name, why);
        }
    }
    out
}

/// A path-test grant as it is now: its Role's and
/// RoleBinding's metadata, and which of them, if any, is not the pool
/// `uid`'s ("Kind ns/name").
struct GrantSeen {
    taken: Option<String>,
    role: Option<kube::api::ObjectMeta>,
    binding: Option<kube::api::ObjectMeta>,
}

/// Looks at the grant named `grant` in `ns`, for the pool of `uid`.
async fn look_at_grant(ctx: &Context, ns: &str, grant: &str, uid: &str) -> Result<GrantSeen> {
    let roles: Api<Role> = Api::namespaced(ctx.client.clone(), ns);
    let bindings: Api<RoleBinding> = Api::namespaced(ctx.client.clone(), ns);
    let foreign = |m: &Option<kube::api::ObjectMeta>| {
        m.as_ref()
            .is_some_and(|m| !ownership::owned_by(m, "DtnPool", uid))
    };
    let role = roles.get_metadata_opt(grant).await?.map(|m| m.metadata);
    if foreign(&role) {
        return Ok(GrantSeen {
            taken: Some(format!("Role {ns}/{grant}")),
            role,
            binding: None,
        });
    }
    let binding = bindings.get_metadata_opt(grant).await?.map(|m| m.metadata);
    let taken = foreign(&binding).then(|| format!("RoleBinding {ns}/{grant}"));
    Ok(GrantSeen {
        taken,
        role,
        binding,
    })
}

/// Says, in the log and as an Event on the pool, that `what` is another
/// owner's and is neither handed out nor taken over.
async fn taken_event(pool: &DtnPool, ctx: &Context, what: &str) {
    tracing::warn!(
        object = what,
        "a path-test object belongs to another owner; not granting it"
    );
    let ev = Event {
        type_: EventType::Warning,
        reason: "PathTestSecretTaken".into(),
        note: Some(format!(
            "{what} exists and does not belong to this pool; wirerate will not hand it to agents or take it over: delete or rename it for path tests to run"
        )),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&ev, &pool.object_ref(&())).await {
        tracing::warn!(error = %e, "cannot publish an event");
    }
}

/// Takes the path-test grant away from a pool (one that no longer listens,
/// or whose Secret is someone else's). The token Secret stays, readable by
/// no agent, for when it listens again; the pool's deletion takes it by its
/// owner reference (and the operator needs no right to delete Secrets).
async fn revoke_path_tests(pool: &DtnPool, ctx: &Context) -> Result<()> {
    revoke_grant(pool, ctx, &path_tests::grant_name(&pool.name_any())).await
}

/// Deletes the Role and RoleBinding `name` of the pool's namespace, where
/// the pool owns them.
async fn revoke_grant(pool: &DtnPool, ctx: &Context, name: &str) -> Result<()> {
    let ns = pool.namespace().unwrap_or_default();
    if name.len() > 253 {
        // Never created: no object can have that name.
        return Ok(());
    }
    let uid = pool.metadata.uid.clone().unwrap_or_default();
    let binding: Api<RoleBinding> = Api::namespaced(ctx.client.clone(), &ns);
    let role: Api<Role> = Api::namespaced(ctx.client.clone(), &ns);
    // Only what this pool owns: a Role of the same name is someone else's,
    // also when it took the place of ours since we looked.
    ownership::delete_owned(&binding, name, "DtnPool", &uid).await?;
    ownership::delete_owned(&role, name, "DtnPool", &uid).await?;
    Ok(())
}

/// The latest reason the StatefulSet `sts` gave for not creating a pod, from
/// its FailedCreate Events (the pool's status says nothing else of it).
async fn create_failure(ctx: &Context, ns: &str, sts: &str) -> Option<String> {
    let api: Api<CoreEvent> = Api::namespaced(ctx.client.clone(), ns);
    let lp = ListParams::default().fields(&format!(
        "involvedObject.kind=StatefulSet,involvedObject.name={sts},reason=FailedCreate"
    ));
    let events = match api.list(&lp).await {
        Ok(l) => l.items,
        Err(e) => {
            tracing::debug!(error = %e, "cannot list the StatefulSet's events");
            return None;
        }
    };
    events
        .into_iter()
        .max_by_key(|e| {
            e.last_timestamp
                .as_ref()
                .or(e.metadata.creation_timestamp.as_ref())
                .map(|t| t.0.as_second())
        })
        .and_then(|e| e.message)
}

/// An Event on the pool when it becomes degraded, or recovers.
async fn announce(ctx: &Context, pool: &DtnPool, status: &DtnPoolStatus) {
    let find = |s: Option<&DtnPoolStatus>| {
        s.and_then(|s| conditions::find(&s.conditions, types::DEGRADED).cloned())
    };
    let (Some(new), old) = (find(Some(status)), find(pool.status.as_ref())) else {
        return;
    };
    let was = old.as_ref().map(|c| (c.status.clone(), c.reason.clone()));
    if was == Some((new.status.clone(), new.reason.clone())) {
        return;
    }
    let degraded = new.status == "True";
    if !degraded && old.as_ref().is_none_or(|c| c.status != "True") {
        return;
    }
    let ev = Event {
        type_: if degraded {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: if degraded {
            new.reason.clone()
        } else {
            "Recovered".into()
        },
        note: Some(new.message.chars().take(1000).collect()),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&ev, &pool.object_ref(&())).await {
        tracing::warn!(reason = ev.reason, error = %e, "cannot publish an event");
    }
}

/// Removes the pool's Roles and RoleBindings from every other namespace but
/// those `keep` renders (by namespace and name): one dropped from
/// allowedNamespaces, or whose DtnPoolBinding was deleted. Found by label,
/// so nothing is left behind whatever changed.
async fn revoke_remote(pool: &DtnPool, ctx: &Context, keep: &[(Role, RoleBinding)]) -> Result<()> {
    let keep: Vec<(String, String)> = keep
        .iter()
        .map(|(r, _)| {
            (
                r.metadata.namespace.clone().unwrap_or_default(),
                r.metadata.name.clone().unwrap_or_default(),
            )
        })
        .collect();
    let ns = pool.namespace().unwrap_or_default();
    if pool.name_any().len() > 63 {
        // Not a label value: nothing was ever labelled with it (every apply
        // failed), and a selector with it is refused, which would hold the
        // pool's deletion for ever.
        return Ok(());
    }
    let selector = format!(
        "{}={},{}={ns}",
        contract::POOL_LABEL,
        pool.name_any(),
        render::POOL_NAMESPACE_LABEL
    );
    let lp = ListParams::default().labels(&selector);
    let bindings = Api::<RoleBinding>::all(ctx.client.clone())
        .list(&lp)
        .await?;
    let roles = Api::<Role>::all(ctx.client.clone()).list(&lp).await?;
    let stale = |m: &kube::api::ObjectMeta| {
        let at = m.namespace.clone().unwrap_or_default();
        let name = m.name.clone().unwrap_or_default();
        (at != ns && !keep.contains(&(at.clone(), name))).then_some(at)
    };
    for b in &bindings.items {
        if let Some(at) = stale(&b.metadata) {
            tracing::info!(namespace = at, "revoking the pool's access to {at}");
            let api = Api::<RoleBinding>::namespaced(ctx.client.clone(), &at);
            // One that took its place since the list is left for the
            // next look, which lists again.
            ownership::delete_exactly(&api, &b.metadata).await?;
        }
    }
    for r in &roles.items {
        if let Some(at) = stale(&r.metadata) {
            let api = Api::<Role>::namespaced(ctx.client.clone(), &at);
            ownership::delete_exactly(&api, &r.metadata).await?;
        }
    }
    Ok(())
}

async fn cleanup(pool: &DtnPool, ctx: &Context) -> Result<Action> {
    revoke_remote(pool, ctx, &[]).await?;
    // What the operator remembers of its objects goes with them.
    let pool_name = pool.name_any();
    let names = [
        render::agent_name(pool),
        path_tests::grant_name(&pool_name),
        path_tests::external_grant_name(&pool_name),
    ];
    lock(&ctx.applied).forget(|(_, _, name)| names.contains(name));
    // Its path-test grant goes with it, by owner reference.
    if let (Ok(mut p), Some(uid)) = (ctx.revokes_settled.lock(), &pool.metadata.uid) {
        p.remove(uid);
    }
    Ok(Action::await_change())
}
