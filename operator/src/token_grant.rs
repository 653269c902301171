//! Each Transfer's token, readable by exactly the pools it is assigned to.
//!
//! The agents' own Roles hold no Secret rights at all. When a Transfer is
//! assigned, the operator applies a Role in the Transfer's namespace that
//! allows `get` on that one Secret (`resourceNames`) and binds it to the
//! ServiceAccounts of the sending and receiving pools. The Role is owned by
//! the Transfer, so it goes with it, and it is deleted when the Transfer ends.
//! Agents of one pool share a ServiceAccount, so the unit of access is the
//! pool, not the single agent.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use kube::{Resource, ResourceExt};
use wirerate_crds::{Transfer, contract};

use crate::ownership::owned_by;
use crate::render::agent_account;
use crate::scheduler::Key;

/// Name of the Role and RoleBinding granting `transfer`'s token. The dot
/// keeps it apart from names people give (a Transfer name has none, since
/// the operator's own names are checked before use anyway).
pub fn grant_name(transfer: &str) -> String {
    format!("wirerate-token.{transfer}")
}

/// A fresh token: 32 random bytes, in hex.
pub fn fresh_token() -> String {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("the kernel's random source is available");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Why the Secret `name` of `api`'s namespace `ns`, named in `field` of a
/// user's object, cannot be handed to agents, if it cannot. Whoever wrote
/// the object chose the Secret, so it must say itself that it is meant for
/// wirerate: whoever labelled it could read it, so the agents get nothing
/// its owners did not give.
pub async fn unmarked_token(
    api: &Api<Secret>,
    ns: &str,
    name: &str,
    field: &str,
) -> kube::Result<Option<String>> {
    let label = contract::EXTERNAL_TOKEN_LABEL;
    Ok(match api.get_metadata_opt(name).await? {
        None => Some(format!(
            "Secret {ns}/{name} ({field}) does not exist: create it with the token under the key '{}' and the label {label}=true",
            contract::TOKEN_KEY
        )),
        Some(s) if s.labels().get(label).map(String::as_str) != Some("true") => Some(format!(
            "Secret {ns}/{name} ({field}) is not marked for wirerate: label it {label}=true (kubectl label secret -n {ns} {name} {label}=true) to let the pool's agents read it"
        )),
        Some(_) => None,
    })
}

/// Creates `secret` (owned by the `kind` object `uid`) unless it exists;
/// never rewrites it, so a token in use never changes. False when a Secret
/// of its name exists that another owns: it is not ours to hand out.
pub async fn ensure_secret(
    api: &Api<Secret>,
    secret: &Secret,
    kind: &str,
    uid: &str,
) -> kube::Result<bool> {
    match api.create(&PostParams::default(), secret).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => {
            let name = secret.metadata.name.clone().unwrap_or_default();
            let meta = api.get_metadata(&name).await?.metadata;
            Ok(owned_by(&meta, kind, uid))
        }
        Err(e) => Err(e),
    }
}

/// A Role named as `meta` says that allows `get` on the Secrets `secrets`
/// (no rule at all when there are none), and its binding to the
/// ServiceAccounts `accounts` (namespace, name).
pub fn reader(
    meta: ObjectMeta,
    secrets: &[String],
    accounts: &[(String, String)],
) -> (Role, RoleBinding) {
    let name = meta.name.clone().unwrap_or_default();
    let role = Role {
        metadata: meta.clone(),
        // Never a rule with no names: that would mean every Secret.
        rules: Some(
            (!secrets.is_empty())
                .then(|| PolicyRule {
                    api_groups: Some(vec![String::new()]),
                    resources: Some(vec!["secrets".into()]),
                    resource_names: Some(secrets.to_vec()),
                    verbs: vec!["get".into()],
                    ..Default::default()
                })
                .into_iter()
                .collect(),
        ),
    };
    let mut subjects: Vec<Subject> = accounts
        .iter()
        .map(|(ns, sa)| Subject {
            kind: "ServiceAccount".into(),
            name: sa.clone(),
            namespace: Some(ns.clone()),
            ..Default::default()
        })
        .collect();
    // Each once, in the order given.
    let mut seen = std::collections::HashSet::new();
    subjects.retain(|s| seen.insert((s.namespace.clone(), s.name.clone())));
    let binding = RoleBinding {
        metadata: meta,
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name,
        },
        subjects: Some(subjects),
    };
    (role, binding)
}

/// The Role and RoleBinding that let the agents of `pools` read `secret`.
pub fn render(t: &Transfer, secret: &str, pools: &[&Key]) -> (Role, RoleBinding) {
    let name = grant_name(&t.name_any());
    let meta = ObjectMeta {
        name: Some(name.clone()),
        namespace: t.namespace(),
        labels: Some(BTreeMap::from([
            (contract::TRANSFER_LABEL.to_owned(), t.name_any()),
            (
                "app.kubernetes.io/managed-by".to_owned(),
                contract::OPERATOR_MANAGER.to_owned(),
            ),
        ])),
        owner_references: t.controller_owner_ref(&()).map(|o| vec![o]),
        ..Default::default()
    };
    let accounts: Vec<(String, String)> = pools
        .iter()
        .map(|(ns, pool)| (ns.clone(), agent_account(pool)))
        .collect();
    reader(meta, &[secret.to_owned()], &accounts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::tests::transfer;

    #[test]
    fn grants_one_secret_to_the_assigned_pools_only() {
        let t = transfer("t", "/in/a", "/out/a");
        let src = ("data".to_owned(), "src".to_owned());
        let dst = ("far".to_owned(), "dst".to_owned());
        let (role, rb) = render(&t, "t-token", &[&src, &dst]);
        let rules = role.rules.unwrap();
        assert_eq!(rules.len(), 1);
        assert_eq!(
            rules[0].resources.as_deref(),
            Some(&["secrets".to_owned()][..])
        );
        assert_eq!(rules[0].verbs, ["get"]);
        assert_eq!(
            rules[0].resource_names.as_deref(),
            Some(&["t-token".to_owned()][..])
        );
        assert_eq!(role.metadata.namespace.as_deref(), Some("data"));
        assert_eq!(
            role.metadata.owner_references.unwrap()[0].kind,
            "Transfer",
            "goes with its Transfer"
        );
        let who: Vec<(String, String)> = rb
            .subjects
            .unwrap()
            .into_iter()
            .map(|s| (s.namespace.unwrap(), s.name))
            .collect();
        assert_eq!(
            who,
            [
                ("data".to_owned(), "src-agent".to_owned()),
                ("far".to_owned(), "dst-agent".to_owned())
            ]
        );
        assert_eq!(rb.role_ref.name, "wirerate-token.t");
    }

    #[test]
    fn no_secret_named_grants_no_secret() {
        let (role, _) = reader(ObjectMeta::default(), &[], &[]);
        assert_eq!(role.rules, Some(vec![]), "a rule without names reads all");
    }
}
