//! A pool's periodic path tests (`spec.pathTests`): the receiving pool
//! listens, the sending pool tests it, and the result reaches the sending
//! pool's status; the listener's token is granted to both pools by name,
//! and the test writes nothing where the listener runs.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use wirerate_crds::DtnPool;

use crate::security;

/// Port of the receivers' path-test listener (one agent per host binds
/// it; the others on this one host cannot and say so).
const PORT: u16 = 17690;

fn names(dir: &Path) -> Result<Vec<String>> {
    let mut out: Vec<String> = std::fs::read_dir(dir)?
        .map(|e| Ok(e?.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_>>()?;
    out.sort();
    Ok(out)
}

/// Turns path tests on between the two pools and waits for a result.
pub async fn pools_test_the_path_between_them(
    client: &Client,
    kubeconfig: &str,
    ns: &str,
    dst: &Path,
) -> Result<()> {
    println!("== path tests: senders test the path to receivers");
    let before = names(dst)?;
    let pools: Api<DtnPool> = Api::namespaced(client.clone(), ns);
    let pp = PatchParams::default();
    pools
        .patch(
            "receivers",
            &pp,
            &Patch::Merge(json!({"spec": {"pathTests": {"listen": true, "port": PORT}}})),
        )
        .await?;
    pools
        .patch(
            "senders",
            &pp,
            &Patch::Merge(json!({"spec": {"pathTests": {
                "targets": [{"pool": "receivers"}],
                "intervalSeconds": 300,
                "phaseSeconds": 1,
                "streams": 2,
                "maxRateMbps": 2000
            }}})),
        )
        .await?;
    // The first test comes 30 to 90 s after the tester learns of it, and
    // the listener may need a retry (10 s) while its grant reaches the
    // authorizer.
    let start = Instant::now();
    let found = loop {
        let p = pools.get("senders").await?;
        let s = p.status.unwrap_or_default();
        if let Some(t) = s.path_tests.iter().find(|t| t.target == "receivers")
            && let Some(last) = &t.last
        {
            break (t.clone(), last.clone());
        }
        ensure!(
            start.elapsed() < Duration::from_secs(240),
            "no path test result within 4 minutes; status.pathTests: {:#?}",
            s.path_tests
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    let (t, last) = found;
    ensure!(
        last.ok,
        "the path test failed: {:?} (status {t:#?})",
        last.error
    );
    ensure!(last.gbps > 0.0 && last.streams == 2, "{last:#?}");
    ensure!(
        last.endpoint == format!("127.0.0.1:{PORT}"),
        "tested {}, not the receivers' listener",
        last.endpoint
    );
    ensure!(t.tester.as_deref() == Some(last.agent.as_str()), "{t:#?}");
    println!(
        "  {} tested {} in {:.0} s: {:.2} Gbit/s with {} streams, {:.2} with one, rtt {:.2} ms",
        last.agent,
        last.endpoint,
        start.elapsed().as_secs_f64(),
        last.gbps,
        last.streams,
        last.single_stream_gbps,
        last.rtt_ms
    );

    // The token is the listening pool's, readable by the two pools' agents
    // by name and by nobody else.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    secrets
        .get("wirerate-path-test.receivers")
        .await
        .context("the listeners' token Secret")?;
    let rb: RoleBinding = Api::namespaced(client.clone(), ns)
        .get("wirerate-path-test.receivers.readers")
        .await
        .context("the binding that grants it")?;
    let who: Vec<String> = rb
        .subjects
        .unwrap_or_default()
        .into_iter()
        .map(|s| s.name)
        .collect();
    ensure!(
        who == ["receivers-agent", "senders-agent"],
        "granted to {who:?}"
    );
    // Memory to memory: nothing landed where the listener runs.
    let after = names(dst)?;
    ensure!(before == after, "files appeared: {before:?} -> {after:?}");
    author_must_read_the_token(client, kubeconfig, ns).await?;

    // Turning listening off takes the grant back.
    pools
        .patch(
            "receivers",
            &pp,
            &Patch::Merge(json!({"spec": {"pathTests": {"listen": false}}})),
        )
        .await?;
    let rbs: Api<RoleBinding> = Api::namespaced(client.clone(), ns);
    let start = Instant::now();
    while rbs
        .get_opt("wirerate-path-test.receivers.readers")
        .await?
        .is_some()
    {
        ensure!(
            start.elapsed() < Duration::from_secs(30),
            "the grant outlived listening by 30 s"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!(
        "  listening off: the grant went after {:.1} s",
        start.elapsed().as_secs_f64()
    );
    // The agents that could not take the port (all run on this one host)
    // said so as a finding; with listening off, it clears.
    let start = Instant::now();
    loop {
        let s = pools.get("receivers").await?.status.unwrap_or_default();
        if !s.preflight.iter().any(|f| f.check == "path-test-listener") {
            break;
        }
        ensure!(
            start.elapsed() < Duration::from_secs(60),
            "the path-test-listener finding outlived listening by a minute: {:?}",
            s.preflight
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!(
        "  and the listener findings cleared after {:.1} s",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// A pool author who may run agents (and even escalate roles) but may not
/// read a listening pool's token is refused a pool that would test it.
async fn author_must_read_the_token(client: &Client, kubeconfig: &str, ns: &str) -> Result<()> {
    let user = "wirerate-e2e-path-tester";
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": "path-tester", "namespace": ns},
        "rules": [
            {"apiGroups": ["wirerate.io"], "resources": ["dtnpools"], "verbs": ["create", "get", "delete"]},
            {"apiGroups": ["apps"], "resources": ["statefulsets"], "verbs": ["create"]},
            {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["escalate"]}
        ]
    }))?;
    Api::<Role>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &role)
        .await?;
    let rb: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "path-tester", "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "path-tester"},
        "subjects": [{"kind": "User", "name": user}]
    }))?;
    Api::<RoleBinding>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &rb)
        .await?;
    security::until("the path tester may create DtnPools", || async {
        security::may(client, user, "create", "wirerate.io", "dtnpools", ns, None).await
    })
    .await?;
    let author = security::as_user(kubeconfig, user).await?;
    let pools: Api<DtnPool> = Api::namespaced(author, ns);
    let mut p = crate::pool("prober", Path::new("/tmp"));
    p.metadata.namespace = Some(ns.into());
    p.spec.path_tests = Some(wirerate_crds::pool::PathTests {
        listen: false,
        port: PORT.into(),
        targets: vec![wirerate_crds::pool::PathTestTarget {
            pool: "receivers".into(),
        }],
        external: vec![],
        interval_seconds: 3600,
        phase_seconds: 2,
        streams: 4,
        max_rate_mbps: 1000,
    });
    security::refused(
        pools.create(&PostParams::default(), &p).await,
        "path-test token of pool receivers",
        "a pool testing one whose token its author may not read",
    )?;
    // Likewise an endpoint outside the cluster, whose token Secret the
    // pool's agents would get to read.
    if let Some(t) = p.spec.path_tests.as_mut() {
        t.targets.clear();
        t.external = vec![wirerate_crds::pool::ExternalPathTestTarget {
            name: "partner".into(),
            address: "dtn1.partner.example.org:7690".into(),
            token_secret: "partner-token".into(),
        }];
    }
    security::refused(
        pools.create(&PostParams::default(), &p).await,
        "token of external path-test target partner",
        "a pool testing an external endpoint whose token its author may not read",
    )?;
    // The same pool without the targets is this author's to make.
    p.spec.path_tests = None;
    pools
        .create(&PostParams::default(), &p)
        .await
        .context("the same pool without path-test targets")?;
    pools.delete("prober", &Default::default()).await?;
    println!("  a pool without the target was accepted from the same author");
    Ok(())
}
