//! What is the operator's to change or delete. Every object the operator
//! renders or grants carries a controller owner reference to the DtnPool or
//! Transfer it is for; an object of the same name without it belongs to
//! someone else and is neither rewritten nor deleted. The rendering and the
//! grants both ask this module, so neither depends on the other for it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, Preconditions};

/// Whether an object with `meta` is the operator's own for the `kind`
/// object `uid` (its controller owner), so applying over it takes nothing
/// from anyone.
pub fn owned_by(meta: &ObjectMeta, kind: &str, uid: &str) -> bool {
    meta.owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.uid == uid && o.kind == kind)
}

/// Deletes what `meta` describes and nothing else: true when it is gone;
/// false when another object has taken its name since it was read (the
/// API server's 409 on the uid precondition), which stays.
pub async fn delete_exactly<K>(api: &Api<K>, meta: &ObjectMeta) -> kube::Result<bool>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let name = meta.name.clone().unwrap_or_default();
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: meta.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&name, &dp).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Deletes the object `name` of `api` if the `kind` object `uid` controls
/// it, and no other of that name. One that took its place meanwhile is
/// looked at again: it may be a grant of ours made again (by another
/// replica of the operator, say).
pub async fn delete_owned<K>(api: &Api<K>, name: &str, kind: &str, uid: &str) -> kube::Result<()>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    for _ in 0..3 {
        match api.get_metadata_opt(name).await? {
            Some(m) if owned_by(&m.metadata, kind, uid) => {
                if delete_exactly(api, &m.metadata).await? {
                    return Ok(());
                }
            }
            _ => return Ok(()),
        }
    }
    Ok(())
}
