//! The generated CRDs: committed copy current, examples valid, admission rules
//! refusing what they should with a message that says what to change.

use std::path::{Path, PathBuf};

use kube::core::cel::{validate_cel, validate_cel_update};
use wirerate_crds::{DtnPool, DtnPoolBinding, Transfer};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn example<T: serde::de::DeserializeOwned>(name: &str) -> T {
    let path = repo().join("manifests/examples").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The OpenAPI schema of `crd`'s only version, as JSON.
fn schema_of(
    crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> serde_json::Value {
    let version = &crd.spec.versions[0];
    let schema = version
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref());
    serde_json::to_value(schema.expect("a schema")).unwrap()
}

fn rejected_with<T: kube::CustomResourceExt + serde::Serialize>(obj: &T, needle: &str) {
    match validate_cel(obj) {
        Ok(()) => panic!("accepted, but should be refused with {needle:?}"),
        Err(e) => {
            let text = e.to_string();
            assert!(
                text.contains(needle),
                "refused, but with {text:?}, not {needle:?}"
            );
        }
    }
}

#[test]
fn committed_crds_are_current() {
    let path = repo().join("charts/wirerate/crds/crds.yaml");
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    let generated = wirerate_crds::crds_yaml().unwrap();
    assert!(
        committed == generated,
        "{} is stale: run `cargo run -p wirerate-crds --bin crdgen > charts/wirerate/crds/crds.yaml`",
        path.display()
    );
}

#[test]
fn crds_have_status_scale_short_names_and_columns() {
    use kube::CustomResourceExt;
    let pool = DtnPool::crd();
    let v = &pool.spec.versions[0];
    let sub = v.subresources.as_ref().unwrap();
    assert!(sub.status.is_some() && sub.scale.is_some());
    assert!(
        pool.spec
            .names
            .short_names
            .as_ref()
            .unwrap()
            .contains(&"dtnp".to_string())
    );
    let cols: Vec<_> = v
        .additional_printer_columns
        .as_ref()
        .unwrap()
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(cols, ["Ready", "Desired", "Active", "Age"]);

    let xfer = Transfer::crd();
    let v = &xfer.spec.versions[0];
    assert!(v.subresources.as_ref().unwrap().status.is_some());
    let cols: Vec<_> = v
        .additional_printer_columns
        .as_ref()
        .unwrap()
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(
        cols,
        [
            "Phase", "Progress", "Rate", "Pairs", "Sender", "Receiver", "Age", "Attempt", "Queue",
            "Reason", "Failure"
        ]
    );
    let yaml = serde_yaml::to_string(&xfer).unwrap();
    assert!(
        yaml.contains("x-kubernetes-list-map-keys:\n                - type"),
        "conditions must be a list-map keyed by type"
    );
}

/// Fields that embed Kubernetes' own types, which no CEL rule of ours reads.
const EMBEDDED: [&str; 4] = ["affinity", "tolerations", "resources", "nodeSelector"];

/// Collects the strings and arrays under `node` that have no upper bound.
fn unbounded(node: &serde_json::Value, path: &str, out: &mut Vec<String>) {
    let bounded = |key: &str| node.get(key).is_some() || node.get("enum").is_some();
    match node.get("type").and_then(|t| t.as_str()) {
        Some("string") if !bounded("maxLength") => out.push(path.to_owned()),
        Some("array") if !bounded("maxItems") => out.push(path.to_owned()),
        _ => {}
    }
    if let Some(items) = node.get("items") {
        unbounded(items, &format!("{path}[]"), out);
    }
    if let Some(props) = node.get("properties").and_then(|p| p.as_object()) {
        for (name, child) in props {
            if !EMBEDDED.contains(&name.as_str()) {
                unbounded(child, &format!("{path}.{name}"), out);
            }
        }
    }
}

/// Finds every schema node carrying CEL rules and the unbounded fields under it.
fn rule_inputs_unbounded(node: &serde_json::Value, path: &str, out: &mut Vec<String>) {
    if node.get("x-kubernetes-validations").is_some() {
        unbounded(node, path, out);
        return;
    }
    if let Some(items) = node.get("items") {
        rule_inputs_unbounded(items, &format!("{path}[]"), out);
    }
    if let Some(props) = node.get("properties").and_then(|p| p.as_object()) {
        for (name, child) in props {
            rule_inputs_unbounded(child, &format!("{path}.{name}"), out);
        }
    }
}

// The API server estimates each CEL rule's worst-case cost from the maxLength
// and maxItems of what it reads, and refuses the whole CRD when a rule exceeds
// the budget (found by applying the CRDs to kube-apiserver 1.32). The estimate
// itself needs an API server, so this keeps its inputs bounded instead.
#[test]
fn everything_a_rule_reads_is_bounded() {
    use kube::CustomResourceExt;
    for (kind, crd) in [("DtnPool", DtnPool::crd()), ("Transfer", Transfer::crd())] {
        let schema = serde_json::to_value(&crd.spec.versions[0].schema).unwrap();
        let mut out = Vec::new();
        rule_inputs_unbounded(&schema["openAPIV3Schema"], kind, &mut out);
        assert!(
            out.is_empty(),
            "{kind}: give these a maxLength/maxItems so the API server can bound its CEL rules' cost: {out:?}"
        );
    }
}

#[test]
fn examples_parse_and_pass_admission() {
    for name in ["dtnpool-lustre.yaml", "dtnpool-instrument.yaml"] {
        let pool: DtnPool = example(name);
        validate_cel(&pool).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    for name in ["transfer.yaml", "transfer-external.yaml"] {
        let t: Transfer = example(name);
        validate_cel(&t).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    let b: DtnPoolBinding = example("dtnpoolbinding.yaml");
    validate_cel(&b).unwrap();
    // The binding consents for the namespace it is in, to the pool it names,
    // and the example pool offers to serve that namespace.
    let consent = b.consent().unwrap();
    let pool: DtnPool = example("dtnpool-lustre.yaml");
    assert_eq!(
        (consent.pool_namespace.as_str(), consent.pool.as_str()),
        (
            pool.metadata.namespace.as_deref().unwrap(),
            pool.metadata.name.as_deref().unwrap()
        )
    );
    assert!(pool.spec.allowed_namespaces.contains(&consent.namespace));
}

#[test]
fn allowed_namespaces_must_be_namespace_names() {
    use kube::CustomResourceExt;
    let crd = serde_json::to_value(DtnPool::crd()).unwrap();
    let items = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        ["allowedNamespaces"]["items"];
    // The API server checks the pattern; its RFC 1123 label is a namespace name.
    assert_eq!(items["pattern"], r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$");
    assert_eq!(items["maxLength"], 63);
}

#[test]
fn transfer_rules_refuse_mistakes() {
    let good: Transfer = example("transfer.yaml");

    let mut t = good.clone();
    t.spec.destination.pool = Some(t.spec.source.pool.clone());
    t.spec.destination.path = t.spec.source.path.clone();
    rejected_with(&t, "source and destination are the same file");

    let mut t = good.clone();
    t.spec.tuning.as_mut().unwrap().block_size = Some(16 * 1024 * 1024 + 512);
    rejected_with(&t, "multiple of 4096");

    let mut t = good.clone();
    t.spec.tuning.as_mut().unwrap().block_size = Some(6 * 1024 * 1024);
    t.spec.striping.as_mut().unwrap().stripe_size = 4 * 1024 * 1024;
    rejected_with(&t, "stripeSize must divide tuning.blockSize");

    let mut t = good.clone();
    t.spec.striping.as_mut().unwrap().stripe_size = 100_000;
    rejected_with(&t, "multiple of 65536");

    let mut t = good.clone();
    t.spec.destination.path = "/lustre/incoming/../../etc".into();
    rejected_with(&t, "must not contain '..'");

    let mut t = good.clone();
    t.spec.destination.external = Some(wirerate_crds::transfer::External {
        address: "x:1".into(),
        token_secret: "s".into(),
    });
    rejected_with(&t, "exactly one of pool or external");

    let mut t = good.clone();
    t.spec.sync = wirerate_crds::tuning::SyncLevel::Mtime;
    validate_cel(&t).expect("a sync level over one pair passes admission");
    t.spec.pairs = Some(2);
    validate_cel(&t).expect("and over several pairs (the first receiver is asked)");

    let mut t = good.clone();
    t.spec.pairs = Some(3);
    validate_cel(&t).expect("several pairs into a pool pass admission");
    t.spec.destination.pool = None;
    t.spec.destination.external = Some(wirerate_crds::transfer::External {
        address: "x:1".into(),
        token_secret: "s".into(),
    });
    rejected_with(&t, "pairs above 1 needs destination.pool");

    // pairsPolicy Auto grows to pairs: a bound of 1 is no bound.
    use wirerate_crds::transfer::PairsPolicy;
    let mut t = good.clone();
    t.spec.pairs_policy = Some(PairsPolicy::Auto);
    rejected_with(&t, "pairsPolicy Auto needs pairs of 2 or more");
    t.spec.pairs = Some(1);
    rejected_with(&t, "pairsPolicy Auto needs pairs of 2 or more");
    t.spec.pairs = Some(8);
    validate_cel(&t).expect("Auto up to 8 pairs passes admission");
    t.spec.pairs_policy = Some(PairsPolicy::Fixed);
    validate_cel(&t).expect("Fixed 8 pairs passes admission");
}

// The pair count's bounds are the engine's, and `kubectl get` shows it.
#[test]
fn pairs_are_bounded_by_the_engine_and_shown() {
    use kube::CustomResourceExt;
    let crd = Transfer::crd();
    let v = &crd.spec.versions[0];
    let schema = schema_of(&crd);
    let pairs = &schema["properties"]["spec"]["properties"]["pairs"];
    assert_eq!(pairs["minimum"].as_f64(), Some(1.0), "{pairs}");
    assert_eq!(
        pairs["maximum"].as_f64(),
        Some(wirerate_engine::stripes::MAX_PAIRS as f64),
        "{pairs}"
    );
    let cols = v.additional_printer_columns.as_ref().unwrap();
    assert!(
        cols.iter()
            .any(|c| c.name == "Pairs" && c.json_path == ".status.pairs")
    );
    let pool = schema_of(&DtnPool::crd());
    assert_eq!(
        pool["properties"]["spec"]["properties"]["sharedStorage"]["default"],
        false
    );
}

// Found against a real API server: `/x/f/`, `/x//f` and `/x/./f` passed the
// same-file rule, and an agent copied a file onto itself.
#[test]
fn paths_are_spelled_one_way_so_the_same_file_is_seen() {
    let good: Transfer = example("transfer.yaml");
    let src = good.spec.source.path.clone();
    let (dir, leaf) = src.rsplit_once('/').unwrap();
    for spelling in [
        format!("{src}/"),
        format!("{dir}//{leaf}"),
        format!("{dir}/./{leaf}"),
        format!("{src}/."),
    ] {
        assert!(
            !wirerate_crds::transfer::plain_path(&spelling),
            "{spelling}"
        );
        let mut t = good.clone();
        t.spec.destination.pool = Some(t.spec.source.pool.clone());
        t.spec.destination.path = spelling.clone();
        rejected_with(&t, "spelled plainly");
        let mut t = good.clone();
        t.spec.source.path = spelling;
        rejected_with(&t, "spelled plainly");
    }
    assert!(wirerate_crds::transfer::plain_path(&src));
}

#[test]
fn an_external_address_needs_a_port() {
    let mut t: Transfer = example("transfer-external.yaml");
    validate_cel(&t).unwrap();
    // Found against a real API server: ports 0 and 99999 got through.
    for bad in [
        "dtn1.partner.example.org",
        "dtn1:",
        "10.0.0.1",
        "a b:7700",
        "dtn1:0",
        "dtn1:99999",
        "dtn1:65536",
        "dtn1:07700",
        "dtn\n1:7700",
    ] {
        t.spec.destination.external.as_mut().unwrap().address = bad.into();
        rejected_with(&t, "address must be host:port");
    }
    for ok in [
        "10.0.0.1:7700",
        "[2001:db8::1]:7700",
        "dtn1:1",
        "dtn1:65535",
    ] {
        t.spec.destination.external.as_mut().unwrap().address = ok.into();
        validate_cel(&t).unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
}

#[test]
fn wide_output_shows_attempt_queue_and_reasons() {
    use kube::CustomResourceExt;
    let crd = Transfer::crd();
    let wide: Vec<String> = crd.spec.versions[0]
        .additional_printer_columns
        .iter()
        .flatten()
        .filter(|c| c.priority == Some(1))
        .map(|c| c.name.clone())
        .collect();
    assert_eq!(wide, ["Attempt", "Queue", "Reason", "Failure"]);
}

#[test]
fn source_and_destination_are_immutable() {
    let old: Transfer = example("transfer.yaml");
    let mut new = old.clone();
    new.spec.priority = 100;
    validate_cel_update(&new, &old).expect("priority may change");

    new.spec.source.path = "/data/runs/other".into();
    let err = validate_cel_update(&new, &old)
        .expect_err("source changed")
        .to_string();
    assert!(err.contains("source cannot change"), "{err}");

    let mut new = old.clone();
    new.spec.destination.path = "/lustre/incoming/elsewhere".into();
    let err = validate_cel_update(&new, &old)
        .expect_err("destination changed")
        .to_string();
    assert!(err.contains("destination cannot change"), "{err}");

    // Found by review: pairs changed on a running Transfer left its
    // receivers assigned beside a new one, the verdict with an agent that
    // got no data.
    for (was, now) in [(None, Some(3)), (Some(3), Some(1)), (Some(3), None)] {
        let mut old = old.clone();
        old.spec.pairs = was;
        let mut new = old.clone();
        new.spec.pairs = now;
        let err = validate_cel_update(&new, &old)
            .expect_err("pairs changed")
            .to_string();
        assert!(
            err.contains("pairs cannot change once set"),
            "{was:?} -> {now:?}: {err}"
        );
    }
    let mut same = old.clone();
    same.spec.pairs = Some(3);
    validate_cel_update(&same, &same).expect("pairs kept");
    // Unset is one pair: spelling it out changes nothing, and a Transfer
    // stored without it stays updatable.
    let mut one = old.clone();
    one.spec.pairs = Some(1);
    validate_cel_update(&one, &old).expect("unset to 1");
    let mut prio = old.clone();
    prio.spec.priority = 7;
    validate_cel_update(&prio, &old).expect("unset kept, another field changed");

    // The policy is fixed with the pairs; unset is Fixed.
    use wirerate_crds::transfer::PairsPolicy;
    let mut wide = old.clone();
    wide.spec.pairs = Some(4);
    let mut auto = wide.clone();
    auto.spec.pairs_policy = Some(PairsPolicy::Auto);
    let err = validate_cel_update(&auto, &wide)
        .expect_err("policy changed")
        .to_string();
    assert!(err.contains("pairsPolicy cannot change once set"), "{err}");
    let mut fixed = wide.clone();
    fixed.spec.pairs_policy = Some(PairsPolicy::Fixed);
    validate_cel_update(&fixed, &wide).expect("unset to Fixed");
}

#[test]
fn pool_rules_refuse_mistakes() {
    let good: DtnPool = example("dtnpool-lustre.yaml");

    let mut p = good.clone();
    p.spec.allowed_roots.push("/scratch".into());
    rejected_with(&p, "must lie under one of the volumes");

    let mut p = good.clone();
    p.spec.advertise.address = Some("10.0.0.1".into());
    rejected_with(&p, "not both");

    let mut p = good.clone();
    p.spec.volumes[0].claim_name = Some("pvc".into());
    rejected_with(&p, "exactly one of hostPath or claimName");

    let mut p = good.clone();
    p.spec.tuning.block_size = Some(8 * 1024 * 1024);
    p.spec.striping.as_mut().unwrap().stripe_size = 3 * 1024 * 1024;
    rejected_with(&p, "stripeSize must divide");

    // Found against a real API server: these passed admission, and the
    // StatefulSet then failed to create pods.
    for (page, amount) in [
        ("2Mi", "3Mi"),
        ("1Gi", "1Mi"),
        ("1Gi", "512Mi"),
        ("2Mi", "0Mi"),
    ] {
        let mut p = good.clone();
        p.spec.hugepages = Some(wirerate_crds::pool::Hugepages {
            page_size: page.into(),
            amount: amount.into(),
        });
        rejected_with(&p, "whole number of pages");
    }
    use wirerate_crds::pool::{AgentSeccompProfile, SeccompType};
    let profile = |type_, path: Option<&str>| AgentSeccompProfile {
        type_,
        localhost_profile: path.map(str::to_owned),
    };
    for bad in [
        profile(SeccompType::Localhost, None),
        profile(
            SeccompType::RuntimeDefault,
            Some("profiles/wirerate-agent.json"),
        ),
    ] {
        let mut p = good.clone();
        p.spec.seccomp_profile = Some(bad);
        rejected_with(&p, "with type Localhost, and only then");
    }
    let mut p = good.clone();
    p.spec.seccomp_profile = Some(profile(
        SeccompType::Localhost,
        Some("profiles/../../etc/x.json"),
    ));
    rejected_with(&p, "no '..'");
    for ok in [
        Some(profile(
            SeccompType::Localhost,
            Some("profiles/wirerate-agent.json"),
        )),
        Some(profile(SeccompType::Unconfined, None)),
        Some(profile(SeccompType::RuntimeDefault, None)),
        None,
    ] {
        let mut p = good.clone();
        p.spec.seccomp_profile = ok.clone();
        validate_cel(&p).unwrap_or_else(|e| panic!("{ok:?}: {e}"));
    }

    for (page, amount) in [("2Mi", "4Mi"), ("2Mi", "1Gi"), ("1Gi", "2Gi")] {
        let mut p = good.clone();
        p.spec.hugepages = Some(wirerate_crds::pool::Hugepages {
            page_size: page.into(),
            amount: amount.into(),
        });
        validate_cel(&p).unwrap_or_else(|e| panic!("{amount} of {page}: {e}"));
    }

    // A path-test listener on a data port would take it from a transfer's
    // receiver, or the metrics from Prometheus.
    let tests = |port: i32, listen: bool| wirerate_crds::pool::PathTests {
        listen,
        port,
        targets: vec![],
        external: vec![],
        interval_seconds: 3600,
        phase_seconds: 2,
        streams: 4,
        max_rate_mbps: 10_000,
    };
    // The agent's range, from the one definition the rule must agree with.
    let ports = wirerate_crds::contract::data_ports(
        u16::try_from(good.spec.data_port).unwrap(),
        u16::try_from(good.spec.max_transfers_per_agent).unwrap(),
    );
    let (data, last_data) = (i32::from(ports.start), i32::from(ports.end) - 1);
    for bad in [data, last_data, good.spec.metrics_port] {
        let mut p = good.clone();
        p.spec.path_tests = Some(tests(bad, true));
        rejected_with(&p, "pathTests.port must be neither");
    }
    for (ok, listen) in [(data - 1, true), (last_data + 1, true), (data, false)] {
        let mut p = good.clone();
        p.spec.path_tests = Some(tests(ok, listen));
        validate_cel(&p).unwrap_or_else(|e| panic!("{ok}: {e}"));
    }

    // From a review (issue 35): a metrics port inside the data range is a
    // hostPort declared twice, and every pod of the pool is refused.
    for bad in [data, last_data] {
        let mut p = good.clone();
        p.spec.metrics_port = bad;
        rejected_with(&p, "metricsPort must not be one of the data ports");
    }
    for ok in [data - 1, last_data + 1] {
        let mut p = good.clone();
        p.spec.metrics_port = ok;
        validate_cel(&p).unwrap_or_else(|e| panic!("metricsPort {ok}: {e}"));
    }

    // An external target named like a pool target would share its line in
    // status.pathTests, its metrics and its token Secret's lookup.
    let external = |name: &str, address: &str| wirerate_crds::pool::ExternalPathTestTarget {
        name: name.into(),
        address: address.into(),
        token_secret: "partner-token".into(),
    };
    let with = |name: &str, address: &str| {
        let mut p = good.clone();
        let mut t = tests(7690, false);
        t.targets = vec![wirerate_crds::pool::PathTestTarget { pool: "far".into() }];
        t.external = vec![external(name, address)];
        p.spec.path_tests = Some(t);
        p
    };
    rejected_with(
        &with("far", "dtn.partner.example:7690"),
        "pathTests.external names must differ",
    );
    rejected_with(
        &with("partner", "dtn.partner.example"),
        "address must be host:port",
    );
    validate_cel(&with("partner", "[2001:db8::1]:7690")).expect("a distinct name and host:port");

    // Found against a real API server: a mountPath written with a trailing
    // slash made a root beneath it fail.
    let mut p = good;
    p.spec.volumes[0].mount_path = format!("{}/", p.spec.volumes[0].mount_path);
    validate_cel(&p).expect("a trailing slash on mountPath is the same directory");
}

// The CRD's bounds were written apart from the engine's and disagreed
// (streams 1..64 against 1..256, queueDepth ..256 against ..4096): a value
// the CLI took, a manifest could not say, and the agent clamped the rest.
#[test]
fn tuning_bounds_in_the_schema_are_the_engines() {
    use kube::CustomResourceExt;
    use wirerate_engine::tuning::{BLOCK_SIZE, BUFFER, CONGESTION_MAX_LEN, QUEUE_DEPTH, STREAMS};
    for crd in [Transfer::crd(), DtnPool::crd()] {
        let schema = schema_of(&crd);
        let tuning = &schema["properties"]["spec"]["properties"]["tuning"]["properties"];
        for b in [&STREAMS, &BLOCK_SIZE, &QUEUE_DEPTH, &BUFFER] {
            let field = &tuning[b.field];
            assert_eq!(
                field["minimum"].as_f64(),
                Some(b.min as f64),
                "{}: {field}",
                b.field
            );
            assert_eq!(
                field["maximum"].as_f64(),
                Some(b.max as f64),
                "{}: {field}",
                b.field
            );
            // The prose `kubectl explain` shows must not drift from the numbers.
            if b.unit == wirerate_engine::tuning::Unit::Bytes {
                let text = field["description"].as_str().unwrap_or_default();
                for v in [b.min, b.max] {
                    assert!(
                        text.contains(&b.show(v)),
                        "{}: {text:?} lacks {}",
                        b.field,
                        b.show(v)
                    );
                }
            }
        }
        assert_eq!(
            tuning["congestion"]["maxLength"].as_f64(),
            Some(CONGESTION_MAX_LEN as f64)
        );
        assert_eq!(
            tuning["ioMode"]["enum"],
            serde_json::json!(["Async", "Direct", "Buffered"])
        );
    }
}

#[test]
fn tuning_the_engine_refuses_is_refused_at_admission() {
    let mut t: Transfer = example("transfer.yaml");
    t.spec.tuning = Some(wirerate_crds::Tuning {
        block_size: Some(16 * 1024 * 1024 + 512),
        ..Default::default()
    });
    rejected_with(&t, "blockSize must be a multiple of 4096 bytes (4 KiB)");
    let settings = t.spec.tuning.as_ref().unwrap().settings();
    assert!(
        settings
            .unwrap_err()
            .to_string()
            .starts_with("blockSize (--block-size) must be a multiple of 4 KiB"),
    );
}

// Found against a real API server: each of these passed admission.
#[test]
fn paths_namespaces_and_roots_the_api_server_let_through_are_refused() {
    let good: Transfer = example("transfer.yaml");
    for bad in [
        "/in/a\0b",
        "/in/a\nb",
        "/in/a\u{1f}",
        "/in/a\u{7f}",
        "/in/\tb",
    ] {
        let mut t = good.clone();
        t.spec.source.path = bad.into();
        rejected_with(&t, "path must not contain control characters");
        let mut t = good.clone();
        t.spec.destination.path = bad.into();
        rejected_with(&t, "path must not contain control characters");
    }
    for bad in ["Not_A_NS", "-a", "a-", "a.b", "A"] {
        let mut t = good.clone();
        t.spec.source.pool_namespace = Some(bad.into());
        rejected_with(&t, "poolNamespace must be a namespace name");
        let mut t = good.clone();
        t.spec.destination.pool_namespace = Some(bad.into());
        rejected_with(&t, "poolNamespace must be a namespace name");
    }
    let mut t = good.clone();
    t.spec.source.pool_namespace = Some("research-data".into());
    validate_cel(&t).expect("a namespace name");

    let pool: DtnPool = example("dtnpool-lustre.yaml");
    let root = pool.spec.allowed_roots[0].clone();
    for (bad, needle) in [
        (
            format!("{root}/./in"),
            "allowedRoots must be spelled plainly",
        ),
        (
            format!("{root}//in"),
            "allowedRoots must be spelled plainly",
        ),
        (
            format!("{root}/in/"),
            "allowedRoots must be spelled plainly",
        ),
        (
            format!("{root}/in/."),
            "allowedRoots must be spelled plainly",
        ),
        (format!("{root}/in/.."), "without '..'"),
        (
            format!("{root}/in\nx"),
            "allowedRoots must not contain control",
        ),
        (
            format!("{root}/in\0"),
            "allowedRoots must not contain control",
        ),
    ] {
        let mut p = pool.clone();
        p.spec.allowed_roots = vec![bad.clone()];
        rejected_with(&p, needle);
    }
    let mut p = pool.clone();
    p.spec.advertise.interface = None;
    for bad in [
        "10.0.0.1:7700",
        "dtn1:7700",
        "[2001:db8::1]:7700",
        "dtn1:",
        "a b",
    ] {
        p.spec.advertise.address = Some(bad.into());
        rejected_with(&p, "advertise.address is an address without a port");
    }
    for ok in ["10.0.0.1", "dtn1.example.org", "2001:db8::1", "::1"] {
        p.spec.advertise.address = Some(ok.into());
        validate_cel(&p).unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
}

/// A worker of kind-config.yaml: its labels, and its taints as
/// (key, value, effect).
struct KindNode {
    labels: std::collections::BTreeMap<String, String>,
    taints: Vec<(String, String, String)>,
}

fn kind_workers() -> Vec<KindNode> {
    let text = std::fs::read_to_string(repo().join("kind-config.yaml")).unwrap();
    let config: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    let nodes = config["nodes"].as_sequence().unwrap();
    let s = |v: &serde_yaml::Value| v.as_str().unwrap_or_default().to_owned();
    nodes
        .iter()
        .filter(|n| n["role"] == "worker")
        .map(|n| {
            let labels = n["labels"]
                .as_mapping()
                .map(|m| m.iter().map(|(k, v)| (s(k), s(v))).collect())
                .unwrap_or_default();
            // Taints come in kubeadm's JoinConfiguration, a YAML string.
            let taints = n["kubeadmConfigPatches"]
                .as_sequence()
                .into_iter()
                .flatten()
                .flat_map(|patch| {
                    let p: serde_yaml::Value =
                        serde_yaml::from_str(patch.as_str().unwrap()).unwrap();
                    p["nodeRegistration"]["taints"]
                        .as_sequence()
                        .cloned()
                        .unwrap_or_default()
                })
                .map(|t| (s(&t["key"]), s(&t["value"]), s(&t["effect"])))
                .collect();
            KindNode { labels, taints }
        })
        .collect()
}

fn tolerates(pool: &DtnPool, (key, value, effect): &(String, String, String)) -> bool {
    pool.spec.tolerations.iter().any(|t| {
        t.key.as_deref() == Some(key.as_str())
            && (t.operator.as_deref() == Some("Exists")
                || t.value.as_deref() == Some(value.as_str()))
            && t.effect.as_deref().is_none_or(|e| e == effect)
    })
}

// issue 35: on real kubelets, shaped as kind-config.yaml says "the example
// pools select them", the instrument's example pool never scheduled: it
// selects the beamline DTN node and did not tolerate that node's taint.
#[test]
fn each_example_pool_fits_a_node_of_the_kind_cluster() {
    let workers = kind_workers();
    assert!(workers.len() >= 3, "kind-config.yaml has its three workers");
    for name in ["dtnpool-lustre.yaml", "dtnpool-instrument.yaml"] {
        let pool: DtnPool = example(name);
        let fits = workers.iter().filter(|n| {
            pool.spec
                .node_selector
                .iter()
                .all(|(k, v)| n.labels.get(k) == Some(v))
                && n.taints.iter().all(|t| tolerates(&pool, t))
        });
        assert!(
            fits.count() >= 1,
            "{name}: no worker of kind-config.yaml both matches its nodeSelector and tolerates its taints"
        );
    }
}

/// Field names a YAML 1.1 reader (kubernetes-validate's, and older
/// tooling's) takes for booleans where they stand unquoted, as they do in
/// a schema's `required` lists in the committed YAML.
const YAML11_BOOLEANS: [&str; 8] = ["y", "yes", "n", "no", "on", "off", "true", "false"];

fn yaml11_booleans(node: &serde_json::Value, path: &str, out: &mut Vec<String>) {
    match node {
        serde_json::Value::Object(map) => {
            if let Some(serde_json::Value::Object(props)) = map.get("properties") {
                for name in props.keys() {
                    if YAML11_BOOLEANS.contains(&name.to_ascii_lowercase().as_str()) {
                        out.push(format!("{path}.{name}"));
                    }
                }
            }
            for (k, v) in map {
                yaml11_booleans(v, &format!("{path}.{k}"), out);
            }
        }
        serde_json::Value::Array(items) => {
            for v in items {
                yaml11_booleans(v, path, out);
            }
        }
        _ => {}
    }
}

// `status.compression.on` was written `required: [.., on, ..]`, which
// kubernetes-validate read as `True` and refused install.yaml for.
#[test]
fn no_field_is_named_like_a_yaml_boolean() {
    use kube::CustomResourceExt;
    for (kind, crd) in [
        ("DtnPool", DtnPool::crd()),
        ("Transfer", Transfer::crd()),
        ("DtnPoolBinding", DtnPoolBinding::crd()),
    ] {
        let mut out = Vec::new();
        yaml11_booleans(&schema_of(&crd), kind, &mut out);
        assert!(out.is_empty(), "{kind}: rename these fields: {out:?}");
    }
}
