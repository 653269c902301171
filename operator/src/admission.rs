//! The escalation rule at admission: nobody obtains through wirerate what
//! they could not have granted themselves.
//!
//! The operator holds cluster-wide rights and acts on objects people write,
//! so it would hand out whatever a DtnPool, a DtnPoolBinding or a Transfer
//! asks of it. The API server refuses a Role to a user who does not hold its
//! permissions (unless they may `escalate`); these ValidatingAdmissionPolicies
//! apply the same rule to what the operator will create on the user's
//! behalf, with the requesting user's own authorizer:
//! - a DtnPool: its author must hold every permission the pool's agents get
//!   in that namespace, may create StatefulSets there, and may read the
//!   path-test token of every pool it tests and the token Secret of every
//!   external endpoint it tests;
//! - a DtnPoolBinding: its author must hold, in that namespace, every
//!   permission the pool's agents get there;
//! - a Transfer to an external receiver: its author must be able to read the
//!   token Secret it names.
//!
//! The policies are generated from the same rules `render` puts in the
//! agents' Roles, so the two cannot drift apart; the chart carries the
//! output of `cargo run -p wirerate-operator --bin policygen`.

use k8s_openapi::api::rbac::v1::PolicyRule;
use serde_json::{Value, json};

use crate::render::{pool_rules, transfer_rules};

/// Name prefix of the policies and their bindings.
pub const POLICY_PREFIX: &str = "wirerate.io-no-escalation";

/// One `authorizer` check per group, resource and verb of `rules`, as
/// `(expression, what it checks)`.
fn checks(rules: &[PolicyRule]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for r in rules {
        for group in r.api_groups.iter().flatten() {
            for resource in r.resources.iter().flatten() {
                let (res, sub) = match resource.split_once('/') {
                    Some((res, sub)) => (res, Some(sub)),
                    None => (resource.as_str(), None),
                };
                for verb in &r.verbs {
                    let mut c = format!("authorizer.group('{group}').resource('{res}')");
                    if let Some(sub) = sub {
                        c.push_str(&format!(".subresource('{sub}')"));
                    }
                    c.push_str(&format!(
                        ".namespace(object.metadata.namespace).check('{verb}').allowed()"
                    ));
                    let what = match group.as_str() {
                        "" => format!("{verb} {resource}"),
                        g => format!("{verb} {resource}.{g}"),
                    };
                    out.push((c, what));
                }
            }
        }
    }
    out
}

/// Whether the user may create Roles beyond their own rights (the API
/// server's own escape from the rule). A variable, so it is evaluated once:
/// each authorizer call is costly and a request's CEL budget is bounded.
const ESCALATE: &str = "authorizer.group('rbac.authorization.k8s.io').resource('roles').namespace(object.metadata.namespace).check('escalate').allowed()";

/// One validation per right in `rules`, each saying which right is missing.
fn held(rules: &[PolicyRule], what_for: &str) -> Vec<Value> {
    checks(rules)
        .into_iter()
        .map(|(expr, what)| {
            json!({
                "expression": format!("variables.escalate || {expr}"),
                "message": format!("{what_for} would get '{what}' in this namespace, which you do not hold yourself: ask someone who does (or who may escalate roles here)"),
                "reason": "Forbidden",
            })
        })
        .collect()
}

fn policy(name: &str, resource: &str, validations: Vec<Value>) -> [Value; 2] {
    let full = format!("{POLICY_PREFIX}-{name}");
    [
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": full},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{
                    "apiGroups": [wirerate_crds::GROUP],
                    "apiVersions": ["*"],
                    "operations": ["CREATE", "UPDATE"],
                    "resources": [resource],
                }]},
                // Only what changes the spec: the garbage collector removing
                // a finalizer, or a label change, asks for nothing new.
                "matchConditions": [{
                    "name": "spec-changes",
                    "expression": "request.operation == 'CREATE' || object.spec != oldObject.spec",
                }],
                "variables": [{"name": "escalate", "expression": ESCALATE}],
                "validations": validations,
            }
        }),
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": full},
            "spec": {"policyName": full, "validationActions": ["Deny"]}
        }),
    ]
}

/// The policies and their bindings.
pub fn policies() -> Vec<Value> {
    let mut pool_checks = vec![json!({
        "expression": "authorizer.group('apps').resource('statefulsets').namespace(object.metadata.namespace).check('create').allowed()",
        "message": "a DtnPool runs agent pods (host network, host paths) as a StatefulSet: you need create on statefulsets in this namespace",
        "reason": "Forbidden",
    })];
    pool_checks.extend(held(&pool_rules(), "the pool's agents"));
    let pool = policy("dtnpools", "dtnpools", pool_checks);
    let tests = policy("dtnpool-path-tests", "dtnpools", path_test_checks());
    let externals = policy(
        "dtnpool-path-test-externals",
        "dtnpools",
        external_path_test_checks(),
    );
    let binding = policy(
        "dtnpoolbindings",
        "dtnpoolbindings",
        held(&transfer_rules(), "the bound pool's agents"),
    );
    let transfer = policy(
        "transfers",
        "transfers",
        vec![json!({
            "expression": "!has(object.spec.destination.external) || authorizer.group('').resource('secrets').namespace(object.metadata.namespace).name(object.spec.destination.external.tokenSecret).check('get').allowed()",
            "messageExpression": "'the sending agents will read Secret ' + object.spec.destination.external.tokenSecret + ' (destination.external.tokenSecret), which you may not read yourself'",
            "reason": "Forbidden",
        })],
    );
    pool.into_iter()
        .chain(tests)
        .chain(externals)
        .chain(binding)
        .chain(transfer)
        .collect()
}

/// The operator grants a pool's agents the path-test token of each pool it
/// tests, so its author must be able to read each of those Secrets. One
/// validation per target, each with one authorizer call: the API server
/// prices a call at a third of an expression's cost limit, so a loop over
/// the targets in one expression would refuse every pool with three. Its
/// own policy, so its calls do not eat the pool policy's budget; and no
/// `escalate` shortcut: one who may escalate roles but not read a Secret
/// still could not bind a Role that reads it.
fn path_test_checks() -> Vec<Value> {
    let prefix = wirerate_crds::contract::path_test_secret("");
    (0..wirerate_crds::pool::MAX_PATH_TEST_TARGETS)
        .map(|i| {
            let target = format!("object.spec.pathTests.targets[{i}].pool");
            json!({
                "expression": format!("!has(object.spec.pathTests) || object.spec.pathTests == null || !has(object.spec.pathTests.targets) || size(object.spec.pathTests.targets) <= {i} || authorizer.group('').resource('secrets').namespace(object.metadata.namespace).name('{prefix}' + {target}).check('get').allowed()"),
                "messageExpression": format!("'the agents of this pool would read the path-test token of pool ' + {target} + ' (Secret {prefix}' + {target} + '), which you may not read yourself: ask someone who may'"),
                "reason": "Forbidden",
            })
        })
        .collect()
}

/// The same for the token Secret of each external target
/// (`pathTests.external[].tokenSecret`), which the pool's own agents get to
/// read; in a policy of its own, for the same budget: at about 350k a
/// call against 10M a policy, the 16 target checks and these 8 together
/// would leave little to spare.
fn external_path_test_checks() -> Vec<Value> {
    (0..wirerate_crds::pool::MAX_PATH_TEST_EXTERNAL)
        .map(|i| {
            let e = format!("object.spec.pathTests.external[{i}]");
            json!({
                "expression": format!("!has(object.spec.pathTests) || object.spec.pathTests == null || !has(object.spec.pathTests.external) || size(object.spec.pathTests.external) <= {i} || authorizer.group('').resource('secrets').namespace(object.metadata.namespace).name({e}.tokenSecret).check('get').allowed()"),
                "messageExpression": format!("'the agents of this pool would read Secret ' + {e}.tokenSecret + ' (the token of external path-test target ' + {e}.name + '), which you may not read yourself: ask someone who may'"),
                "reason": "Forbidden",
            })
        })
        .collect()
}

/// The Kubernetes version whose API server serves
/// admissionregistration.k8s.io/v1 ValidatingAdmissionPolicies.
pub const NEEDS: &str = "1.30";

/// Each policy and binding the operator relies on, as `(kind, name)`.
pub fn expected() -> Vec<(String, String)> {
    policies()
        .iter()
        .map(|p| {
            (
                p["kind"].as_str().unwrap_or_default().to_owned(),
                p["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect()
}

/// What to say when the policies `missing` ("Kind name") are not on the API
/// server of version `server`; None when none is missing. Without them the
/// operator renders whatever a pool asks for its author: host network, host
/// paths, other people's Secrets.
pub fn missing_message(server: &str, missing: &[String]) -> Option<String> {
    if missing.is_empty() {
        return None;
    }
    Some(format!(
        "wirerate's admission policies are missing on this API server (Kubernetes {server}; they need {NEEDS} or later, admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy): {}. Without them anyone who may create a DtnPool gets host-network agents with the host paths it names: apply manifests/install.yaml on a {NEEDS}+ cluster",
        missing.join(", ")
    ))
}

/// The policies as one multi-document YAML stream.
pub fn policies_yaml() -> Result<String, serde_yaml::Error> {
    let mut out = String::from(
        "# Generated by `cargo run -p wirerate-operator --bin policygen`; do not edit by hand.\n",
    );
    for p in policies() {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&p)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_missing_policy_is_named_with_the_server_version_and_what_it_needs() {
        let expected = expected();
        assert_eq!(expected.len(), policies().len());
        assert!(
            expected
                .iter()
                .any(|(k, n)| k == "ValidatingAdmissionPolicyBinding"
                    && n == "wirerate.io-no-escalation-dtnpools")
        );
        assert_eq!(missing_message("1.33", &[]), None);
        let m = missing_message(
            "1.29",
            &["ValidatingAdmissionPolicy wirerate.io-no-escalation-dtnpools".into()],
        )
        .unwrap();
        for needle in [
            "Kubernetes 1.29",
            "1.30 or later",
            "wirerate.io-no-escalation-dtnpools",
        ] {
            assert!(m.contains(needle), "{needle}: {m}");
        }
    }

    use super::*;
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    };

    #[test]
    fn committed_policies_are_current() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../charts/wirerate/templates/admission-policy.yaml"
        );
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            committed == policies_yaml().unwrap(),
            "{path} is stale: run `cargo run -p wirerate-operator --bin policygen > charts/wirerate/templates/admission-policy.yaml`"
        );
    }

    #[test]
    fn every_right_the_agents_get_is_checked_against_the_requester() {
        let ps = policies();
        let text = |kind: &str| {
            let p: ValidatingAdmissionPolicy = serde_json::from_value(
                ps.iter()
                    .find(|p| p["metadata"]["name"] == format!("{POLICY_PREFIX}-{kind}"))
                    .unwrap()
                    .clone(),
            )
            .unwrap();
            serde_json::to_string(&p.spec.unwrap().validations).unwrap()
        };
        for (kind, rules) in [
            ("dtnpools", pool_rules()),
            ("dtnpoolbindings", transfer_rules()),
        ] {
            let checks = text(kind);
            for r in &rules {
                for res in r.resources.iter().flatten() {
                    let res = res.split('/').next().unwrap();
                    for verb in &r.verbs {
                        assert!(
                            checks.contains(&format!("resource('{res}')"))
                                && checks.contains(&format!("check('{verb}')")),
                            "{kind}: {verb} {res} unchecked"
                        );
                    }
                }
            }
        }
        assert!(text("transfers").contains("tokenSecret"));
        let tests = text("dtnpool-path-tests");
        for i in 0..wirerate_crds::pool::MAX_PATH_TEST_TARGETS {
            assert!(
                tests.contains(&format!(
                    "name('wirerate-path-test.' + object.spec.pathTests.targets[{i}].pool).check('get')"
                )),
                "target {i} unchecked: {tests}"
            );
        }
        let externals = text("dtnpool-path-test-externals");
        for i in 0..wirerate_crds::pool::MAX_PATH_TEST_EXTERNAL {
            assert!(
                externals.contains(&format!(
                    "name(object.spec.pathTests.external[{i}].tokenSecret).check('get')"
                )),
                "external target {i} unchecked: {externals}"
            );
        }
        // Updates that leave the spec alone (the garbage collector taking a
        // finalizer off) are not checked: found in review, they were refused.
        for p in ps
            .iter()
            .filter(|p| p["kind"] == "ValidatingAdmissionPolicy")
        {
            assert_eq!(
                p["spec"]["matchConditions"][0]["expression"],
                "request.operation == 'CREATE' || object.spec != oldObject.spec"
            );
        }
        // Each policy is bound, to deny.
        for p in ps
            .iter()
            .filter(|p| p["kind"] == "ValidatingAdmissionPolicyBinding")
        {
            let b: ValidatingAdmissionPolicyBinding = serde_json::from_value(p.clone()).unwrap();
            assert_eq!(
                b.spec.unwrap().validation_actions,
                Some(vec!["Deny".to_owned()])
            );
        }
    }

    // Found in review: one expression looping over the targets with an
    // authorizer call each would cost past the API server's per-expression
    // limit at three targets, and refuse the pool.
    #[test]
    fn no_expression_makes_more_than_one_authorizer_call() {
        for p in policies()
            .iter()
            .filter(|p| p["kind"] == "ValidatingAdmissionPolicy")
        {
            let name = &p["metadata"]["name"];
            let vs = p["spec"]["validations"].as_array().unwrap();
            for v in vs {
                let e = v["expression"].as_str().unwrap();
                assert!(e.matches(".allowed()").count() <= 1, "{name}: {e}");
                assert!(
                    !e.contains(".all(") && !e.contains(".exists("),
                    "{name}: {e}"
                );
            }
            // The API server's budget for one policy: 10M, at 350k a call
            // (and the escalate variable once).
            assert!(vs.len() < 28, "{name}: {} calls", vs.len());
        }
    }

    #[test]
    fn a_check_per_verb_with_subresources_split_out() {
        let rules = transfer_rules();
        let h = checks(&rules)
            .into_iter()
            .map(|(c, _)| c)
            .collect::<Vec<_>>()
            .join(" && ");
        assert!(
            h.contains(".resource('transfers').subresource('status')"),
            "{h}"
        );
        let n: usize = rules
            .iter()
            .map(|r| {
                r.verbs.len()
                    * r.resources.as_ref().map_or(0, Vec::len)
                    * r.api_groups.as_ref().map_or(0, Vec::len)
            })
            .sum();
        assert_eq!(h.matches(".allowed()").count(), n);
    }
}
