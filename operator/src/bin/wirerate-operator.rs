//! `wirerate-operator`: runs the DtnPool and Transfer controllers while it
//! holds the leader Lease.
#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ListParams};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::utils::PredicateConfig;
use kube::runtime::{Controller, WatchStreamExt, reflector, watcher};
use wirerate_crds::{DtnPool, DtnPoolBinding, Transfer, contract};
use wirerate_operator::cli::Args;
use wirerate_operator::context::{Context, Stores};
use wirerate_operator::{clients, leader, pool_controller, transfer_controller};
use wirerate_telemetry::Endpoints;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

async fn run() -> anyhow::Result<()> {
    let log = wirerate_telemetry::init_logs("info,kube=warn");
    let args = Args::parse();
    let identity = args.identity.unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        format!("{}-{}", host.trim(), std::process::id())
    });
    let mut config = kube::Config::infer()
        .await
        .context("no Kubernetes API to talk to: set KUBECONFIG or run in a pod")?;
    // Named in the API server's audit log and its per-client metrics, so an
    // admin (and bench/scale) can tell the operator's requests from others'.
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(concat!("wirerate-operator/", env!("CARGO_PKG_VERSION"))),
    ));
    let clients::Clients {
        calls: client,
        watches,
    } = clients::clients(config).context("cannot build the Kubernetes client")?;

    for (kind, probe) in [
        (
            "Transfer",
            Api::<Transfer>::all(client.clone())
                .list(&ListParams::default().limit(1))
                .await
                .map(|_| ()),
        ),
        (
            "DtnPool",
            Api::<DtnPool>::all(client.clone())
                .list(&ListParams::default().limit(1))
                .await
                .map(|_| ()),
        ),
    ] {
        probe.map_err(|e| {
            wirerate_operator::Error::CrdsMissing(format!("listing {kind}s failed: {e}"))
        })?;
    }

    let listener = tokio::net::TcpListener::bind(&args.metrics_addr)
        .await
        .with_context(|| format!("cannot listen on {}", args.metrics_addr))?;
    // Served before leading, so a standby replica is ready and a rollout proceeds.
    let metrics = wirerate_operator::metrics::Metrics::default();
    let endpoints = {
        let metrics = metrics.clone();
        Endpoints::new(move || metrics.render().into_bytes()).with_log_level(log)
    };
    // Ready once the API and the CRDs answered (above): a standby that
    // waits for the Lease is ready too.
    endpoints.set_ready(true);
    tokio::spawn(wirerate_telemetry::serve(listener, endpoints));
    tracing::info!(
        identity,
        namespace = args.namespace,
        "waiting for the leader Lease"
    );
    let stamped = leader::acquire(&client, &args.namespace, &identity).await;
    tracing::info!("leading; starting controllers");

    // Every change a plan depends on is noted as it arrives from the watch
    // (`Context::changed`); the context exists only after the caches do, so
    // the streams reach it through this cell.
    let cell: Cell = Arc::default();

    let (pool_store, pool_writer) = reflector::store::<DtnPool>();
    let pool_stream = reflector(
        pool_writer,
        watcher(
            Api::<DtnPool>::all(watches.clone()),
            watcher::Config::default(),
        ),
    )
    .default_backoff()
    .inspect_ok(noted(&cell, false))
    .applied_objects()
    .predicate_filter(pool_controller::changed, PredicateConfig::default());
    let pools = Controller::for_stream(pool_stream, pool_store.clone()).owns(
        Api::<StatefulSet>::all(watches.clone()),
        watcher::Config::default().labels(contract::POOL_LABEL),
    );
    // A new or deleted DtnPoolBinding changes what its pool may reach, and
    // whether the namespace's Transfers are valid.
    let pools = pools.watches(
        Api::<DtnPoolBinding>::all(watches.clone()),
        watcher::Config::default(),
        |b| Some(ObjectRef::new(&b.spec.pool).within(&b.spec.pool_namespace)),
    );
    let (transfer_store, transfer_writer) = reflector::store::<Transfer>();
    let transfer_stream = reflector(
        transfer_writer,
        watcher(
            Api::<Transfer>::all(watches.clone()),
            watcher::Config::default(),
        ),
    )
    .default_backoff()
    .inspect_ok(noted(&cell, false))
    .applied_objects();
    let transfers = Controller::for_stream(transfer_stream, transfer_store.clone());
    let in_namespace = transfer_store.clone();
    let transfers = transfers.watches(
        Api::<DtnPoolBinding>::all(watches.clone()),
        watcher::Config::default(),
        move |b| {
            let ns = b.metadata.namespace.clone();
            in_namespace
                .state()
                .iter()
                .filter(|t| t.metadata.namespace == ns)
                .map(|t| ObjectRef::from_obj(&**t))
                .collect::<Vec<_>>()
        },
    );

    let (leases, lease_writer) = reflector::store::<Lease>();
    let (pods, pod_writer) = reflector::store::<Pod>();
    let lease_watch = reflector(
        lease_writer,
        watcher(
            Api::<Lease>::all(watches.clone()),
            watcher::Config::default().labels(contract::POOL_LABEL),
        ),
    )
    .default_backoff()
    .inspect_ok(noted(&cell, true))
    .touched_objects()
    .for_each(|_| async {});
    let pod_watch = reflector(
        pod_writer,
        watcher(
            Api::<Pod>::all(watches.clone()),
            watcher::Config::default().labels(contract::POOL_LABEL),
        ),
    )
    .default_backoff()
    .inspect_ok(noted(&cell, true))
    .touched_objects()
    .for_each(|_| async {});
    let (bindings, binding_writer) = reflector::store::<DtnPoolBinding>();
    let binding_watch = reflector(
        binding_writer,
        watcher(
            Api::<DtnPoolBinding>::all(watches.clone()),
            watcher::Config::default(),
        ),
    )
    .default_backoff()
    .inspect_ok(noted(&cell, false))
    .touched_objects()
    .for_each(|_| async {});
    let stores = Stores {
        bindings,
        pools: pool_store,
        transfers: transfer_store,
        leases,
        pods,
    };
    let ctx = Arc::new(
        Context::new(client.clone(), stores, metrics, &identity)
            .with_write_rate(args.max_writes_per_second)
            .with_allowed_host_paths(args.allowed_host_paths.clone()),
    );
    // Loud and repeated (once a look, not once a reconcile): without the
    // policies, whoever may create a DtnPool gets what it renders.
    let looker = ctx.clone();
    tokio::spawn(async move {
        loop {
            let missing = policies_missing(&looker.client).await;
            match &missing {
                Some(m) => tracing::error!("{m}"),
                None => tracing::info!("wirerate's admission policies are installed"),
            }
            *wirerate_operator::context::lock(&looker.policies_missing) = missing;
            tokio::time::sleep(Duration::from_secs(300)).await;
        }
    });

    let _ = cell.set(ctx.clone());
    let wakes = ctx.wakes().expect("taken once, here");
    let pools = pools.reconcile_on(wakes.pools);
    let transfers = transfers.reconcile_on(wakes.transfers);

    tokio::spawn(lease_watch);
    tokio::spawn(pod_watch);
    tokio::spawn(binding_watch);
    let planner = tokio::spawn(ctx.clone().plan_on_changes());
    let agent_watcher = tokio::spawn(ctx.clone().watch_agents());
    tokio::spawn(gauges(ctx.clone()));

    let pool_run = pools
        .shutdown_on_signal()
        .run(
            pool_controller::reconcile,
            pool_controller::error_policy,
            ctx.clone(),
        )
        .for_each(|_| async {});
    let transfer_run = transfers
        .shutdown_on_signal()
        .run(
            transfer_controller::reconcile,
            transfer_controller::error_policy,
            ctx.clone(),
        )
        .for_each(|_| async {});
    tokio::select! {
        _ = futures::future::join(pool_run, transfer_run) => {
            // Stopped by a signal: hand the Lease to a standby now rather
            // than let it wait out the Lease's duration.
            tracing::info!("controllers stopped");
            // Bounded: a stalled API server must not hold a stopping
            // operator until its SIGKILL; the Lease then simply runs out.
            let release = leader::release(&client, &args.namespace, &identity);
            match tokio::time::timeout(Duration::from_secs(3), release).await {
                Ok(Ok(true)) => tracing::info!("leader Lease released"),
                Ok(Ok(false)) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "cannot release the leader Lease"),
                Err(_) => tracing::warn!("no answer on releasing the leader Lease within 3 s"),
            }
        }
        // They run for ever: one that ended panicked, and without it nothing
        // would be placed, or no lost agent noticed.
        end = planner => anyhow::bail!("the planner stopped: {end:?}"),
        end = agent_watcher => anyhow::bail!("the agent watcher stopped: {end:?}"),
        why = leader::hold(client.clone(), args.namespace.clone(), identity.clone(), stamped) => {
            // Another replica may be reconciling now; stopping at once is the safe side.
            anyhow::bail!("lost leadership ({why}); exiting so a restart waits for the Lease again");
        }
    }
    Ok(())
}

/// Where the watch streams find the context once it exists.
type Cell = Arc<std::sync::OnceLock<Arc<Context>>>;

/// Notes each watch event as a change a plan depends on, or (`agents`) as
/// one the agent watcher looks at.
fn noted<T>(cell: &Cell, agents: bool) -> impl FnMut(&T) + Send + 'static {
    let cell = cell.clone();
    move |_| {
        if let Some(ctx) = cell.get() {
            if agents {
                ctx.agents_touched();
            } else {
                ctx.changed();
            }
        }
    }
}

/// Keeps the gauges current: transfers by phase, queues, running
/// transfers' progress, agents.
async fn gauges(ctx: Arc<Context>) {
    loop {
        let transfers = ctx.stores.transfers.state();
        let agents = ctx.agents(k8s_openapi::jiff::Timestamp::now());
        ctx.metrics
            .observe(transfers.iter().map(|t| &**t), agents.values());
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
}

/// What of wirerate's admission policies the API server lacks, said with
/// its version and what they need ([`admission::missing_message`]).
async fn policies_missing(client: &Client) -> Option<String> {
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    };
    use wirerate_operator::admission;
    let server = match client.apiserver_version().await {
        Ok(v) => format!("{}.{}", v.major, v.minor),
        Err(e) => format!("of unknown version ({e})"),
    };
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
    let mut missing = Vec::new();
    for (kind, name) in admission::expected() {
        let found = if kind == "ValidatingAdmissionPolicy" {
            policies.get_metadata_opt(&name).await.map(|m| m.is_some())
        } else {
            bindings.get_metadata_opt(&name).await.map(|m| m.is_some())
        };
        match found {
            Ok(true) => {}
            Ok(false) => missing.push(format!("{kind} {name}")),
            // An older server has no such resource: a 404, not an error.
            Err(kube::Error::Api(e)) if e.code == 404 => missing.push(format!("{kind} {name}")),
            Err(e) => missing.push(format!("{kind} {name} (cannot look: {e})")),
        }
    }
    admission::missing_message(&server, &missing)
}
