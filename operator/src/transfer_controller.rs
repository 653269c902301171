//! The Transfer reconciler: validity, phase, scheduling, failover, cleanup.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::{Role as RbacRole, RoleBinding};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::{Resource, ResourceExt};
use serde_json::json;
use wirerate_crds::apply::{LabelsApply, StatusApply};
use wirerate_crds::transfer::{ReportState, Role};
use wirerate_crds::{Transfer, TransferPhase, TransferStatus, contract};

use crate::agents::{Agent, AgentId};
use crate::budget::{self, Class};
use crate::context::{Assignment, Context, View};
use crate::lifecycle::{self, Note};
use crate::planner::Plan;
use crate::scheduler::Key;
use crate::validate::{Invalid, Resolved, reason, validate};
use crate::{Error, Result};
use crate::{ownership, token_grant};

/// How long to wait for agents to clean up a deleted Transfer before letting it go.
const CLEANUP_GRACE: Duration = Duration::from_secs(60);

/// Reconciles one Transfer.
#[tracing::instrument(skip_all, fields(transfer = %t.name_any(), ns = t.namespace().unwrap_or_default()))]
pub async fn reconcile(t: Arc<Transfer>, ctx: Arc<Context>) -> Result<Action> {
    tracing::trace!("reconciling");
    let _timer = ctx
        .metrics
        .duration
        .with_label_values(&["transfer"])
        .start_timer();
    ctx.metrics
        .reconciles
        .with_label_values(&["transfer"])
        .inc();
    if !ctx.caches_ready().await {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let ns = t.namespace().ok_or(Error::Malformed("a namespace"))?;
    let api: Api<Transfer> = Api::namespaced(ctx.client.clone(), &ns);
    // The finalizer is added only when agents are about to be given the
    // Transfer (see `apply`), and dropped once it is over: a Transfer never
    // scheduled, or finished, must not hold up a namespace's deletion while
    // the operator is down.
    if !t
        .finalizers()
        .iter()
        .any(|f| f == contract::TRANSFER_FINALIZER)
    {
        if t.meta().deletion_timestamp.is_some() {
            return Ok(Action::await_change());
        }
        return apply(&t, &ctx, &api).await;
    }
    finalizer(&api, contract::TRANSFER_FINALIZER, t, |event| async {
        match event {
            Finalizer::Apply(t) => apply(&t, &ctx, &api).await,
            Finalizer::Cleanup(t) => cleanup(&t, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
}

/// Logs and counts a failed reconcile, and retries it with backoff.
pub fn error_policy(t: Arc<Transfer>, error: &Error, ctx: Arc<Context>) -> Action {
    if error.is_waiting() {
        // A deletion waiting for its agents is routine, not a warning; the
        // agents usually confirm within a second.
        tracing::info!(transfer = %t.name_any(), "{error}");
        return Action::requeue(Duration::from_secs(1));
    }
    tracing::warn!(transfer = %t.name_any(), "reconcile failed: {error}");
    ctx.metrics
        .failures
        .with_label_values(&["transfer", error.metric_label()])
        .inc();
    Action::requeue(Duration::from_secs(5))
}

/// One look at a Transfer: validity, the next status, agents if it needs
/// them, the write, and what follows from the phase it is in now.
async fn apply(t: &Transfer, ctx: &Context, api: &Api<Transfer>) -> Result<Action> {
    let now = Timestamp::now();
    // The cache may lag our own last write; decide from the freshest copy.
    let current = &ctx.current(t);
    let look = Look {
        t: current,
        ctx,
        key: key(t)?,
        view: ctx.view(now),
        now,
    };
    let validity = check(&look).await?;
    let mut step = lifecycle::step(current, &validity, &look.view.agents, now);
    // A placement taken from the plan, given back unless its status is written.
    let taken = match step.needs.clone() {
        Some(needs) => schedule(&look, &validity, &needs, &mut step).await?,
        None => None,
    };
    // Tokens before assignments: a status that names agents names their
    // token, and the token and its grant exist before it is written. One
    // computed from a copy the cache had before the operator's own
    // assignment (the ledger standing in for it) names the agents but not
    // the token; written as it was, server-side apply dropped the token's
    // name, the agents failed the Transfer, and, with no token named, its
    // grant was never revoked.
    if let Ok(resolved) = &validity {
        keep_token_named(current, ctx, resolved, &mut step.status, now).await?;
    }
    count(ctx, current, &step.status);

    let before = lifecycle::operator_fields(&current.status.clone().unwrap_or_default());
    let put_off = put_off_refresh(ctx, &look.key, &before, &mut step.status);
    let written = write(current, ctx, api, &step.status).await;
    settle(current, ctx, taken, &written).await;
    written?;
    let moved = before.queue_position != step.status.queue_position;
    ctx.shown(
        &look.key,
        step.status.queue_position,
        moved.then(Instant::now),
    );
    let_go(current, ctx, api, Next::of(&step.status)).await?;
    for n in &step.notes {
        publish(ctx, t, n).await;
    }
    if let Some(wait) = put_off {
        return Ok(Action::requeue(wait));
    }
    Ok(next_look(&step.status, current, now))
}

/// What one look at a Transfer works from.
struct Look<'a> {
    /// The freshest copy of the Transfer.
    t: &'a Transfer,
    ctx: &'a Context,
    key: Key,
    /// Pools, agents and consents, as the caches show them.
    view: View,
    now: Timestamp,
}

/// Whether the Transfer can run: its spec checked against the pools and,
/// while it may still need it, its external token Secret's label.
async fn check(look: &Look<'_>) -> Result<std::result::Result<Resolved, Invalid>> {
    let current = look.t;
    let mut validity = validate(current, look.view.catalog());
    // Asked again while it runs: the label is its owner's consent, and a
    // label taken off (or a Secret deleted) ends the grant and the Transfer.
    // Not once the data has landed: a Secret cleaned up as the transfer
    // ends must not fail what succeeded (the grant goes as it ends anyway).
    if validity.is_ok() && !landed(current) {
        match external_token_unusable(current, look.ctx).await {
            Ok(Some(why)) => validity = Err(why),
            Ok(None) => {}
            // A look that failed for a moment keeps the last answer for a
            // Transfer that runs, so that its reports, failover and stall
            // checks go on; a refusal (the operator's rights gone) does not.
            Err(e) if Assignment::of(current).sender.is_some() && !refused(&e) => {
                tracing::warn!(error = %e, "cannot check the external token Secret's label; checking again at the next look");
            }
            Err(e) => return Err(e),
        }
    }
    Ok(validity)
}

/// For a Transfer that `needs` agents: its place in line and why it
/// waits, or the agents the plan holds for it, taken from the plan and
/// granted its token. The placement taken is given back when what is
/// returned is dropped before its status is written.
async fn schedule<'a>(
    look: &Look<'a>,
    validity: &std::result::Result<Resolved, Invalid>,
    needs: &lifecycle::Needs,
    step: &mut lifecycle::Step,
) -> Result<Option<Taken<'a>>> {
    let (current, ctx, key, now) = (look.t, look.ctx, &look.key, look.now);
    // A lost agent's back-off ending is no event the planner hears of:
    // the Transfer is looked at then (see the requeue in `next_look`), and
    // asks for a plan that counts the agent in again.
    if lifecycle::back_off(&step.status.failovers)
        .iter()
        .any(|(_, end)| (now.as_second() - 10..=now.as_second()).contains(end))
    {
        ctx.changed();
    }
    let plan = ctx.recent_plan(now).await;
    // A running Transfer that asks for a lost pair's replacement runs on
    // meanwhile: it has no place in line, and stays Scheduled.
    if !needs.replacing {
        step.status.queue_position = shown_position(&plan, key);
    }
    let Ok(resolved) = validity else {
        return Ok(None);
    };
    if !needs.replacing {
        if let Some(why) = plan.held_back.get(key) {
            lifecycle::waiting_for_destination(&mut step.status, why, current, now);
            return Ok(None);
        }
        let message = lifecycle::waiting_message(resolved, needs, &look.view.agents);
        lifecycle::waiting_for_agents(&mut step.status, &message, current, now);
    }
    if !plan.placements.contains_key(key) {
        return Ok(None);
    }
    if let Some(why) = names_taken(current, ctx).await? {
        // Someone else's Secret or Role holds a name this Transfer needs:
        // applying over it would hand it to the agents, or take it over.
        let mut refused = lifecycle::step(current, &Err(why), &look.view.agents, now);
        let mut notes = std::mem::take(&mut step.notes);
        notes.append(&mut refused.notes);
        refused.notes = notes;
        *step = refused;
        return Ok(None);
    }
    let uid = current.metadata.uid.clone().unwrap_or_default();
    let token = token_secret_name(current);
    let Some(((status, note), before)) = take_placement(look, resolved, needs, step, &token) else {
        if !needs.replacing {
            step.status.queue_position = shown_position(&ctx.plan(now), key);
        }
        return Ok(None);
    };
    let taken = Taken { ctx, uid, before };
    if let Err(e) = grant(current, ctx, &token, &resolved.pools()).await {
        // The placement goes back (Taken), and what was granted for it
        // with it, unless the agents already hold it.
        drop(taken);
        if unassigned(current) {
            revoke_quietly(current, ctx).await;
        }
        return Err(e);
    }
    step.status = status;
    step.notes.push(note);
    Ok(Some(taken))
}

/// Takes what the plan holds for the Transfer now (it may have moved on
/// since it was read): exactly the roles it needs, on agents live now.
/// Gives the status and Event of that assignment, and the ledger's entry
/// it replaced.
fn take_placement(
    look: &Look<'_>,
    resolved: &Resolved,
    needs: &lifecycle::Needs,
    step: &lifecycle::Step,
    token: &str,
) -> Option<((TransferStatus, Note), Option<Assignment>)> {
    let current = look.t;
    let uid = current.metadata.uid.clone().unwrap_or_default();
    // Agents as they are now, not before the wait for the plan.
    let agents = look.ctx.agents(Timestamp::now());
    look.ctx.take(&look.key, &uid, look.now, |p| {
        if p.sender.is_some() != needs.sender
            || !(needs.least..=needs.receivers).contains(&p.receivers.len())
        {
            return None;
        }
        // The agent `name` of `pool`, if it is live now.
        let live = |pool: Option<&Key>, name: &str| {
            agents.get(&AgentId::new(pool?, name)).filter(|a| a.live())
        };
        let receivers = p
            .receivers
            .iter()
            .map(|r| live(resolved.receiver_pool.as_ref(), r))
            .collect::<Option<Vec<&Agent>>>()?;
        let sender = match &p.sender {
            Some(n) => Some(live(Some(&resolved.sender_pool), n)?),
            None => None,
        };
        // Best effort: a relay that is no longer live is left out.
        let relays: Vec<&Agent> = p
            .relays
            .iter()
            .filter_map(|r| live(Some(&resolved.sender_pool), r))
            .collect();
        let placed = lifecycle::Placed {
            sender,
            receivers: &receivers,
            relays: &relays,
            token_secret: token,
        };
        let (status, note) =
            lifecycle::assigned(current, resolved, step.status.clone(), placed, look.now);
        Some((Assignment::in_status(&status), (status, note)))
    })
}

/// Counts a new failover, and the bytes of a succeeded transfer once its
/// size is first known (the sender's last report can land after the
/// verdict).
fn count(ctx: &Context, current: &Transfer, status: &TransferStatus) {
    let old = current.status.as_ref();
    if status.failovers.len() > old.map_or(0, |s| s.failovers.len()) {
        ctx.metrics.failovers.inc();
    }
    if status.average_rate_bps.is_some() && old.and_then(|s| s.average_rate_bps).is_none() {
        let bytes = old
            .and_then(|s| s.progress.as_ref())
            .map_or(0, |p| p.bytes_total);
        ctx.metrics.bytes.inc_by(bytes.max(0) as u64);
    }
}

/// After the status write: a placement taken for it is kept, unless the
/// write was surely refused; then it goes back, and the grant made for it
/// too.
async fn settle(current: &Transfer, ctx: &Context, taken: Option<Taken<'_>>, written: &Result<()>) {
    match taken {
        Some(taken) if written.as_ref().is_err_and(refused) => {
            drop(taken);
            if unassigned(current) {
                revoke_quietly(current, ctx).await;
            }
        }
        Some(taken) => taken.keep(),
        None => {}
    }
}

/// Where a Transfer stands after its status was written.
#[derive(Clone, Copy, Debug)]
struct Next {
    phase: TransferPhase,
    /// Its status names a token.
    granted: bool,
    /// Its status names agents.
    assigned: bool,
}

impl Next {
    fn of(s: &TransferStatus) -> Self {
        Self {
            phase: s.phase.unwrap_or_default(),
            granted: s.token_secret.is_some(),
            assigned: s.assigned().next().is_some(),
        }
    }
}

/// Lets go of what the Transfer no longer needs in its phase now: the
/// agents' access to its token (over, or unable to run), its own token
/// (over), and the finalizer (nothing left for agents to clean up). Each
/// is idempotent, so a failure or a restart in between is made good at the
/// next look.
async fn let_go(current: &Transfer, ctx: &Context, api: &Api<Transfer>, next: Next) -> Result<()> {
    let Next {
        phase,
        granted,
        assigned,
    } = next;
    if granted && (phase.is_final() || phase == TransferPhase::Pending) {
        revoke_token(current, ctx).await?;
    }
    if phase.is_final() {
        // Its own token is of no use any more; gone now, it cannot be left
        // behind by a deletion that orphans what the Transfer owns.
        delete_own_token(current, ctx).await?;
    }
    if phase.is_final() || (phase == TransferPhase::Pending && !assigned) {
        hold(current, ctx, api, false).await?;
    }
    Ok(())
}

/// When to look at the Transfer again. Agents' comings and goings,
/// reports and the plan's placements wake a Transfer; the clock only for
/// what no event announces.
fn next_look(status: &TransferStatus, current: &Transfer, now: Timestamp) -> Action {
    match status.phase.unwrap_or_default() {
        TransferPhase::Succeeded | TransferPhase::Failed => Action::await_change(),
        // A pool that appears, or a Secret that gets its label, sends no event here.
        TransferPhase::Pending => Action::requeue(Duration::from_secs(30)),
        // A lost agent's back-off ending, at the latest.
        TransferPhase::Queued => Action::requeue(
            lifecycle::next_release(&status.failovers, now)
                .map_or(RESYNC, |end| {
                    Duration::from_secs((end - now.as_second() + 1).clamp(1, 300) as u64)
                })
                .min(RESYNC),
        ),
        TransferPhase::Running | TransferPhase::Verifying => {
            Action::requeue(stall_check(status, current, now))
        }
    }
}

/// Puts off a status that only refreshes a figure (a place in line, a
/// stall mark), keeping `before`, when it is not its turn: a place in line
/// is written at most every [`budget::POSITION_INTERVAL`], and no refresh
/// while changes wait for the write budget. Says when to look again.
fn put_off_refresh(
    ctx: &Context,
    key: &Key,
    before: &TransferStatus,
    status: &mut TransferStatus,
) -> Option<Duration> {
    if budget::classify(before, status) != Some(Class::Refresh) {
        return None;
    }
    let due = if before.queue_position == status.queue_position {
        Ok(())
    } else {
        ctx.position_due(key, Instant::now())
    };
    let wait = due.and_then(|()| ctx.refresh_permit()).err()?;
    *status = before.clone();
    Some(wait)
}

/// The place in line `key` shows in `plan` (coarse behind the first few).
fn shown_position(plan: &Plan, key: &Key) -> Option<i32> {
    plan.positions.get(key).copied().map(budget::shown_position)
}

/// Whether `t` is over, or its assigned sender says the data has landed
/// (an external receiver reports nothing; the sender hears its verdict).
/// Its word alone: any agent of a consented pool may write reports.
fn landed(t: &Transfer) -> bool {
    t.status.as_ref().is_some_and(|s| {
        s.phase.is_some_and(|p| p.is_final())
            || s.reports.iter().any(|r| {
                r.role == Role::Sender
                    && r.attempt == s.attempt
                    && s.sender.as_ref().is_some_and(|a| a.name == r.agent)
                    && matches!(r.state, ReportState::Verifying | ReportState::Succeeded)
            })
    })
}

/// A look now and then at a Transfer that events should keep current anyway.
const RESYNC: Duration = Duration::from_secs(300);

/// When a running Transfer that lands nothing more would count as stalled
/// (see `lifecycle`), a second after; at most [`RESYNC`].
fn stall_check(s: &TransferStatus, t: &Transfer, now: Timestamp) -> Duration {
    let Some(mark) = &s.last_moved else {
        return RESYNC;
    };
    let due = mark.at.0.as_second() + i64::from(t.spec.stall_timeout_seconds.max(1)) + 1;
    let wait = (due - now.as_second()).clamp(1, RESYNC.as_secs() as i64);
    Duration::from_secs(wait as u64)
}

/// A placement taken from the plan: given back when dropped before `keep`.
struct Taken<'a> {
    ctx: &'a Context,
    uid: String,
    /// The ledger's entry it replaced.
    before: Option<Assignment>,
}

impl Taken<'_> {
    /// Its assignment is written, or may have been: the ledger keeps it
    /// until the cache shows it (or the Transfer's next look writes it).
    fn keep(mut self) {
        self.uid.clear();
    }
}

impl Drop for Taken<'_> {
    fn drop(&mut self) {
        if !self.uid.is_empty() {
            self.ctx.release(&self.uid, self.before.take());
        }
    }
}

/// Whether `t`'s agents hold nothing of it yet: a grant made for it now
/// is the only one, and goes if its assignment cannot be written.
fn unassigned(t: &Transfer) -> bool {
    t.status
        .as_ref()
        .is_none_or(|s| s.assigned().next().is_none())
}

/// Restores what the assignment set (the token's name first) in a status
/// that names agents but not their token, after making sure the token and
/// its grant exist. Such a status comes from a copy the cache had before
/// the operator's own assignment; its Event went out with the assignment.
async fn keep_token_named(
    t: &Transfer,
    ctx: &Context,
    resolved: &Resolved,
    status: &mut TransferStatus,
    now: Timestamp,
) -> Result<()> {
    let phase = status.phase.unwrap_or_default();
    if status.token_secret.is_some()
        || status.sender.is_none()
        || !matches!(phase, TransferPhase::Running | TransferPhase::Verifying)
    {
        return Ok(());
    }
    let token = token_secret_name(t);
    grant(t, ctx, &token, &resolved.pools()).await?;
    let placed = lifecycle::Placed {
        sender: None,
        receivers: &[],
        relays: &[],
        token_secret: &token,
    };
    let (mut s, _) = lifecycle::assigned(t, resolved, status.clone(), placed, now);
    s.phase = Some(phase);
    *status = s;
    Ok(())
}

/// Makes what the agents of `pools` need before they see an assignment:
/// the finalizer (from here on there is a grant to take back), the token,
/// then access to it (the API server's authorizer may lag a moment; agents
/// retry).
async fn grant(t: &Transfer, ctx: &Context, token: &str, pools: &[&Key]) -> Result<()> {
    hold(t, ctx, &api_for(t, ctx)?, true).await?;
    ensure_token(t, ctx).await?;
    let (role, binding) = token_grant::render(t, token, pools);
    ctx.apply(&role).await?;
    ctx.apply(&binding).await?;
    Ok(())
}

/// Revokes `t`'s grant on a path that already fails: a failure here is
/// logged, and the next look at `t` (or its verdict, or its finalizer)
/// revokes it again.
async fn revoke_quietly(t: &Transfer, ctx: &Context) {
    if let Err(e) = revoke_token(t, ctx).await {
        tracing::warn!(error = %e, "cannot revoke the grant of an assignment not made; trying again later");
    }
}

/// Whether the API server surely did not apply a write that failed with
/// `e`: it said no. A timeout or a broken connection may hide a write that
/// was applied, whose slots must stay counted.
fn refused(e: &Error) -> bool {
    matches!(e, Error::Kube(kube::Error::Api(a)) if (400..500).contains(&a.code))
}

fn key(t: &Transfer) -> Result<Key> {
    Ok((
        t.namespace().ok_or(Error::Malformed("a namespace"))?,
        t.name_any(),
    ))
}

/// Why the names this Transfer's token and grant need are not its own to
/// use, if they are not: an object there that this Transfer does not
/// control (a Secret named `<transfer>-token` made by someone else, say).
async fn names_taken(t: &Transfer, ctx: &Context) -> Result<Option<Invalid>> {
    let ns = t.namespace().ok_or(Error::Malformed("a namespace"))?;
    let uid = t.metadata.uid.clone().unwrap_or_default();
    let grant = token_grant::grant_name(&t.name_any());
    let mut found = Vec::new();
    if t.spec.destination.external.is_none() {
        let name = token_name(t);
        let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
        found.push((
            "Secret",
            name.clone(),
            api.get_metadata_opt(&name).await?.map(|m| m.metadata),
        ));
    }
    let roles: Api<RbacRole> = Api::namespaced(ctx.client.clone(), &ns);
    found.push((
        "Role",
        grant.clone(),
        roles.get_metadata_opt(&grant).await?.map(|m| m.metadata),
    ));
    let bindings: Api<RoleBinding> = Api::namespaced(ctx.client.clone(), &ns);
    found.push((
        "RoleBinding",
        grant.clone(),
        bindings.get_metadata_opt(&grant).await?.map(|m| m.metadata),
    ));
    for (kind, name, meta) in found {
        if let Some(meta) = meta
            && !ownership::owned_by(&meta, "Transfer", &uid)
        {
            return Ok(Some(Invalid {
                reason: reason::TOKEN_SECRET_NOT_USABLE,
                message: format!(
                    "{kind} {ns}/{name} exists and does not belong to this Transfer, and wirerate will not hand it to agents or take it over: delete it, or give the Transfer another name"
                ),
            }));
        }
    }
    Ok(None)
}

/// Name of the Secret holding a Transfer's own token.
fn token_name(t: &Transfer) -> String {
    format!("{}-token", t.name_any())
}

/// Name of the Secret the agents read the token from: the Transfer's own,
/// or the external receiver's.
fn token_secret_name(t: &Transfer) -> String {
    match &t.spec.destination.external {
        Some(ext) => ext.token_secret.clone(),
        None => token_name(t),
    }
}

/// Creates the Transfer's token Secret once; never rotates it under a running transfer.
async fn ensure_token(t: &Transfer, ctx: &Context) -> Result<()> {
    if t.spec.destination.external.is_some() {
        return Ok(());
    }
    let ns = t.namespace().ok_or(Error::Malformed("a namespace"))?;
    let name = token_name(t);
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let token = token_grant::fresh_token();
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(ns),
            labels: Some(BTreeMap::from([(
                contract::TRANSFER_LABEL.to_owned(),
                t.name_any(),
            )])),
            owner_references: t.controller_owner_ref(&()).map(|o| vec![o]),
            ..Default::default()
        },
        string_data: Some(BTreeMap::from([(contract::TOKEN_KEY.to_owned(), token)])),
        type_: Some("Opaque".into()),
        ..Default::default()
    };
    // One from an earlier pass (names_taken checked the owner) is kept: a
    // running transfer's token never changes.
    let uid = t.metadata.uid.as_deref().unwrap_or_default();
    ctx.change_permit().await;
    if token_grant::ensure_secret(&api, &secret, "Transfer", uid).await? {
        Ok(())
    } else {
        Err(Error::Malformed("a token Secret this Transfer owns"))
    }
}

fn api_for(t: &Transfer, ctx: &Context) -> Result<Api<Transfer>> {
    let ns = t.namespace().ok_or(Error::Malformed("a namespace"))?;
    Ok(Api::namespaced(ctx.client.clone(), &ns))
}

/// Adds (`keep`) or removes the operator's finalizer, if that changes
/// anything. A JSON patch that tests the list first, so a concurrent change
/// to the finalizers fails the patch rather than being overwritten. `t` may
/// be a stale copy (the cache lags the operator's own last write): when the
/// test fails, the object is read afresh and, if it still needs it, patched
/// once more.
async fn hold(t: &Transfer, ctx: &Context, api: &Api<Transfer>, keep: bool) -> Result<()> {
    let Some(patch) = finalizer_patch(t, keep) else {
        return Ok(());
    };
    ctx.change_permit().await;
    let pp = PatchParams::default();
    match api
        .patch::<Transfer>(&t.name_any(), &pp, &Patch::Json(patch))
        .await
    {
        Err(kube::Error::Api(e)) if e.code == 422 => {
            let fresh = api.get(&t.name_any()).await?;
            if let Some(patch) = finalizer_patch(&fresh, keep) {
                api.patch::<Transfer>(&t.name_any(), &pp, &Patch::Json(patch))
                    .await?;
            }
        }
        other => other.map(|_| ()).map_err(Error::from)?,
    }
    let uid = t.metadata.uid.as_deref().unwrap_or_default();
    crate::context::lock(&ctx.written).record_hold(uid, keep, Instant::now());
    Ok(())
}

/// The JSON patch that adds (`keep`) or removes the operator's finalizer
/// on `t`; None when `t` is already so.
fn finalizer_patch(t: &Transfer, keep: bool) -> Option<json_patch::Patch> {
    let ours = contract::TRANSFER_FINALIZER;
    let list = t.finalizers();
    let at = list.iter().position(|f| f == ours);
    let ops = match (keep, at) {
        (true, Some(_)) | (false, None) => return None,
        (true, None) if t.meta().finalizers.is_none() => {
            json!([{"op": "test", "path": "/metadata/finalizers", "value": null},
                   {"op": "add", "path": "/metadata/finalizers", "value": [ours]}])
        }
        (true, None) => {
            json!([{"op": "test", "path": "/metadata/finalizers", "value": list},
                   {"op": "add", "path": "/metadata/finalizers/-", "value": ours}])
        }
        (false, Some(i)) => {
            json!([{"op": "test", "path": format!("/metadata/finalizers/{i}"), "value": ours},
                   {"op": "remove", "path": format!("/metadata/finalizers/{i}")}])
        }
    };
    Some(serde_json::from_value(ops).expect("a well-formed JSON patch"))
}

/// Why an external receiver's token Secret cannot be handed to the sending
/// agents, if it cannot (see [`token_grant::unmarked_token`]).
async fn external_token_unusable(t: &Transfer, ctx: &Context) -> Result<Option<Invalid>> {
    let Some(ext) = &t.spec.destination.external else {
        return Ok(None);
    };
    let ns = t.namespace().ok_or(Error::Malformed("a namespace"))?;
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let problem = token_grant::unmarked_token(
        &api,
        &ns,
        &ext.token_secret,
        "destination.external.tokenSecret",
    )
    .await?;
    Ok(problem.map(|message| Invalid {
        reason: reason::TOKEN_SECRET_NOT_USABLE,
        message,
    }))
}

/// Takes back the agents' access to a finished Transfer's token: the
/// Role and RoleBinding the Transfer owns, and no other of their names.
async fn revoke_token(t: &Transfer, ctx: &Context) -> Result<()> {
    let ns = t.namespace().ok_or(Error::Malformed("a namespace"))?;
    let name = token_grant::grant_name(&t.name_any());
    let uid = t.metadata.uid.clone().unwrap_or_default();
    let bindings = Api::<RoleBinding>::namespaced(ctx.client.clone(), &ns);
    ctx.change_permit().await;
    ownership::delete_owned(&bindings, &name, "Transfer", &uid).await?;
    let roles = Api::<RbacRole>::namespaced(ctx.client.clone(), &ns);
    ctx.change_permit().await;
    ownership::delete_owned(&roles, &name, "Transfer", &uid).await?;
    Ok(())
}

/// Deletes the token Secret `t` owns, if it owns one (an external
/// receiver's belongs to its owner).
async fn delete_own_token(t: &Transfer, ctx: &Context) -> Result<()> {
    if t.spec.destination.external.is_some() {
        return Ok(());
    }
    let ns = t.namespace().ok_or(Error::Malformed("a namespace"))?;
    let uid = t.metadata.uid.clone().unwrap_or_default();
    let secrets = Api::<Secret>::namespaced(ctx.client.clone(), &ns);
    ctx.change_permit().await;
    ownership::delete_owned(&secrets, &token_name(t), "Transfer", &uid).await?;
    Ok(())
}

/// Applies the operator's status fields and the assignment labels, where
/// they differ from `t` (the freshest copy, see `Context::current`).
async fn write(t: &Transfer, ctx: &Context, api: &Api<Transfer>, s: &TransferStatus) -> Result<()> {
    let name = t.name_any();
    let pp = PatchParams::apply(contract::OPERATOR_MANAGER).force();
    let old = t.status.clone().unwrap_or_default();
    let assigned = Assignment::in_status(s);
    let live = !s.phase.is_some_and(|p| p.is_final());
    let mut wanted = BTreeMap::new();
    if live {
        if let Some(a) = &assigned.sender {
            wanted.insert(contract::SENDER_LABEL.to_owned(), a.name.clone());
        }
        if let Some(a) = &assigned.receiver {
            wanted.insert(contract::RECEIVER_LABEL.to_owned(), a.name.clone());
        }
        // Several receivers cannot share one label value: each has a
        // label of its own, which it watches by.
        if !assigned.receivers.is_empty() {
            wanted.insert(contract::PAIRS_LABEL.to_owned(), t.pairs().to_string());
            let ns = t.pool_namespace(Role::Receiver).unwrap_or_default();
            for r in &assigned.receivers {
                let key = contract::pair_receiver_label(ns, &r.pool, &r.name);
                wanted.insert(key, "true".to_owned());
            }
        }
        let ns = t.pool_namespace(Role::Relay).unwrap_or_default();
        for r in &assigned.relays {
            let key = contract::pair_relay_label(ns, &r.pool, &r.name);
            wanted.insert(key, "true".to_owned());
        }
    }
    let uid = t.metadata.uid.clone().unwrap_or_default();
    let mut wrote = false;
    if crate::written::operator_labels(t) != wanted {
        ctx.change_permit().await;
        let patch = LabelsApply::new::<Transfer>(&name, &wanted);
        api.patch(&name, &pp, &Patch::Apply(&patch)).await?;
        wrote = true;
    }
    if let Some(class) = budget::classify(&lifecycle::operator_fields(&old), s) {
        // A refresh took its turn before (`refresh_permit`).
        if class == Class::Change {
            ctx.change_permit().await;
        }
        let patch = StatusApply::new::<Transfer>(s);
        api.patch_status(&name, &pp, &Patch::Apply(&patch)).await?;
        wrote = true;
        // Until the cache shows it, the ledger stands in (a failover's new
        // attempt must not be made twice from a stale copy).
        if Assignment::of(t) != assigned {
            let mut ledger = crate::context::lock(&ctx.ledger);
            if ledger.get(&uid) != Some(&assigned) {
                ledger.insert(uid.clone(), assigned);
                drop(ledger);
                ctx.changed();
            }
        }
    }
    if wrote {
        crate::context::lock(&ctx.written).record(&uid, s, wanted, Instant::now());
    }
    Ok(())
}

async fn publish(ctx: &Context, t: &Transfer, n: &Note) {
    let ev = Event {
        type_: if n.warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: n.reason.into(),
        note: Some(n.message.chars().take(1000).collect()),
        action: "Reconcile".into(),
        secondary: None,
    };
    ctx.change_permit().await;
    if let Err(e) = ctx.recorder.publish(&ev, &t.object_ref(&())).await {
        tracing::warn!(reason = n.reason, error = %e, "cannot publish an event");
    }
}

/// Deleting: lets the agents stop and remove temporary files, then takes
/// back the grant and the token (by uid: only what this Transfer owns), so
/// that a deletion orphaning what it owns (`--cascade=orphan`) leaves no
/// access behind, and lets go.
async fn cleanup(t: &Transfer, ctx: &Context) -> Result<Action> {
    if let Some(pending) = cleanup_pending(t, ctx) {
        // An error keeps the finalizer in place; error_policy requeues.
        return Err(Error::CleanupPending(pending));
    }
    revoke_token(t, ctx).await?;
    delete_own_token(t, ctx).await?;
    Ok(Action::await_change())
}

/// The live agents still to confirm they stopped `t`, if any and if the
/// grace for them has not run out.
fn cleanup_pending(t: &Transfer, ctx: &Context) -> Option<String> {
    let s = t.status.clone().unwrap_or_default();
    if s.phase.is_some_and(|p| p.is_final()) || s.sender.is_none() {
        return None;
    }
    let view = ctx.view(Timestamp::now());
    let pending: Vec<&str> = s
        .occupied()
        .filter(|(role, a)| {
            view.agents
                .get(&AgentId::assigned(t, *role, a))
                .is_some_and(|a| a.live())
        })
        .filter(|(role, a)| {
            !s.reports.iter().any(|r| {
                r.agent == a.name
                    && r.role == *role
                    && r.attempt == s.attempt
                    && r.state == ReportState::Cancelled
            })
        })
        .map(|(_, a)| a.name.as_str())
        .collect();
    let since = t
        .meta()
        .deletion_timestamp
        .as_ref()
        .map_or(Duration::ZERO, |d| {
            Timestamp::now().duration_since(d.0).unsigned_abs()
        });
    if pending.is_empty() {
        return None;
    }
    if since > CLEANUP_GRACE {
        tracing::warn!(
            "agents {pending:?} did not confirm cleanup within {CLEANUP_GRACE:?}; releasing the Transfer"
        );
        return None;
    }
    Some(pending.join(", "))
}
