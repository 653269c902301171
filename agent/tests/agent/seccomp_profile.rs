//! deploy/seccomp/wirerate-agent.json is the container runtimes' default
//! seccomp profile plus io_uring_setup, io_uring_enter and
//! io_uring_register, and nothing else: a security team can diff it
//! against the default they already accept.

use serde_json::Value;

fn profile() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/seccomp/wirerate-agent.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).expect("the profile parses")
}

const IO_URING: [&str; 3] = ["io_uring_enter", "io_uring_register", "io_uring_setup"];

/// The profile with object keys sorted, so that its digest does not depend
/// on how a JSON library orders them.
fn canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<_> = m.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                canonical(&m[k], out);
            }
            out.push('}');
        }
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(x, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

fn names(rule: &Value) -> Vec<&str> {
    rule["names"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

#[test]
fn the_profile_is_the_runtime_default_plus_io_uring_and_nothing_else() {
    let mut p = profile();
    assert_eq!(p["defaultAction"], "SCMP_ACT_ERRNO", "deny by default");
    let rules = p["syscalls"].as_array_mut().expect("a syscalls list");
    let ours: Vec<usize> = rules
        .iter()
        .enumerate()
        .filter(|(_, r)| names(r).iter().any(|n| n.starts_with("io_uring")))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(ours.len(), 1, "one rule, and only one, names io_uring");
    let rule = rules.remove(ours[0]);
    let mut got = names(&rule);
    got.sort_unstable();
    assert_eq!(got, IO_URING);
    assert_eq!(rule["action"], "SCMP_ACT_ALLOW");
    for key in ["args", "includes", "excludes", "errnoRet"] {
        assert!(
            rule.get(key).is_none(),
            "the io_uring rule has {key}: {rule}"
        );
    }
    // What is left is, byte for byte after sorting keys, the default profile
    // of moby/profiles (seccomp/default.json at cd3bed8, the list Docker
    // Engine 25+ and containerd ship, which denies io_uring).
    let mut text = String::new();
    canonical(&p, &mut text);
    assert_eq!(
        format!("{:016x}", wirerate_engine::digest::xxh3_64(text.as_bytes())),
        RUNTIME_DEFAULT_DIGEST,
        "the rest of the profile is no longer the runtime default"
    );
}

const RUNTIME_DEFAULT_DIGEST: &str = "9812f279804db6b6";
