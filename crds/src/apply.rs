//! Server-side-apply bodies, typed. The apiVersion and kind come from the
//! resource type, the body from a typed struct, so a patch cannot name a
//! field the type does not have, and a field manager claims exactly the
//! fields it sets.

use std::collections::BTreeMap;

use kube::Resource;
use serde::Serialize;

use crate::transfer::{
    AgentReport, CompressionReport, EncryptionReport, Progress, StripesReport, StripingReport,
    TuningReport,
};

/// `{apiVersion, kind, status}`: applied to the status subresource.
#[derive(Debug, Serialize)]
pub struct StatusApply<'a, S> {
    #[serde(rename = "apiVersion")]
    api_version: String,
    kind: String,
    status: &'a S,
}

impl<'a, S: Serialize> StatusApply<'a, S> {
    /// The body that applies `status` to an object of kind `K`.
    pub fn new<K: Resource<DynamicType = ()>>(status: &'a S) -> Self {
        Self {
            api_version: K::api_version(&()).into_owned(),
            kind: K::kind(&()).into_owned(),
            status,
        }
    }
}

/// `{apiVersion, kind, metadata: {name, labels}}`: the labels a manager
/// owns on an object (an empty map gives them all up).
#[derive(Debug, Serialize)]
pub struct LabelsApply<'a> {
    #[serde(rename = "apiVersion")]
    api_version: String,
    kind: String,
    metadata: NamedLabels<'a>,
}

#[derive(Debug, Serialize)]
struct NamedLabels<'a> {
    name: &'a str,
    labels: &'a BTreeMap<String, String>,
}

impl<'a> LabelsApply<'a> {
    /// The body that sets `labels` on the object `name` of kind `K`.
    pub fn new<K: Resource<DynamicType = ()>>(
        name: &'a str,
        labels: &'a BTreeMap<String, String>,
    ) -> Self {
        Self {
            api_version: K::api_version(&()).into_owned(),
            kind: K::kind(&()).into_owned(),
            metadata: NamedLabels { name, labels },
        }
    }
}

/// The part of a Transfer's status an agent owns: its own report, and
/// what its role reports (progress, striping). Nothing else, so applying it
/// never takes a field from the operator (a `TransferStatus` would carry
/// `attempt: 0`).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentStatus {
    /// This agent's one report.
    pub reports: [AgentReport; 1],
    /// Bytes moved, if this side shows them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress: Option<Progress>,
    /// The layout the receiver gave the file, if it striped it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub striping: Option<StripingReport>,
    /// The streams the sender's tuner chose, once it has.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tuning: Option<TuningReport>,
    /// What sealed the sender's connections, once one authenticated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub encryption: Option<EncryptionReport>,
    /// What compression did, once the sender began sending.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compression: Option<CompressionReport>,
    /// Over several pairs, the sender's view of each.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stripes: Option<StripesReport>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transfer::{ReportState, Role};
    use crate::{DtnPool, Transfer, TransferStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    use serde_json::json;

    #[test]
    fn bodies_are_what_the_hand_written_patches_were() {
        let s = TransferStatus::default();
        assert_eq!(
            serde_json::to_value(StatusApply::new::<Transfer>(&s)).unwrap(),
            json!({"apiVersion": "wirerate.io/v1alpha1", "kind": "Transfer", "status": s})
        );
        let p = crate::DtnPoolStatus::default();
        assert_eq!(
            serde_json::to_value(StatusApply::new::<DtnPool>(&p)).unwrap(),
            json!({"apiVersion": "wirerate.io/v1alpha1", "kind": "DtnPool", "status": p})
        );
        let labels = BTreeMap::from([("wirerate.io/sender".to_owned(), "a-0".to_owned())]);
        assert_eq!(
            serde_json::to_value(LabelsApply::new::<Transfer>("t", &labels)).unwrap(),
            json!({"apiVersion": "wirerate.io/v1alpha1", "kind": "Transfer",
                   "metadata": {"name": "t", "labels": {"wirerate.io/sender": "a-0"}}})
        );
    }

    // An agent's patch must not carry fields it does not own: applying
    // `attempt` would take it from the operator.
    #[test]
    fn an_agents_status_carries_only_its_own_fields() {
        let at = Time(Timestamp::from_second(1_700_000_000).unwrap());
        let body = AgentStatus {
            reports: [AgentReport {
                role: Role::Receiver,
                agent: "b-0".into(),
                attempt: 2,
                state: ReportState::Running,
                message: "writing".into(),
                endpoint: Some("10.0.0.2:7701".into()),
                updated_at: at.clone(),
            }],
            progress: None,
            striping: None,
            tuning: None,
            encryption: None,
            compression: None,
            stripes: None,
        };
        let v = serde_json::to_value(StatusApply::new::<Transfer>(&body)).unwrap();
        assert_eq!(
            v["status"],
            json!({"reports": [{"role": "Receiver", "agent": "b-0", "attempt": 2,
                   "state": "Running", "message": "writing", "endpoint": "10.0.0.2:7701",
                   "updatedAt": at}]})
        );
        // A sender whose tuner chose its streams says so in status.tuning,
        // which a Transfer reads back.
        let body = AgentStatus {
            tuning: Some(TuningReport {
                attempt: 2,
                streams: 15,
                reason: "15: over 150.0 ms ...".into(),
                changes: Vec::new(),
            }),
            ..body
        };
        let v = serde_json::to_value(StatusApply::new::<Transfer>(&body)).unwrap();
        assert_eq!(
            v["status"]["tuning"],
            json!({"attempt": 2, "streams": 15, "reason": "15: over 150.0 ms ..."})
        );
        let back: TransferStatus = serde_json::from_value(v["status"].clone()).unwrap();
        assert_eq!(back.tuning.unwrap().streams, 15);
        // What sealed the connections, in status.encryption.
        let sealed = AgentStatus {
            encryption: Some(EncryptionReport {
                attempt: 2,
                in_effect: "tls-userspace".into(),
                note: Some("kernel TLS not used: ...".into()),
            }),
            ..body
        };
        let v = serde_json::to_value(StatusApply::new::<Transfer>(&sealed)).unwrap();
        assert_eq!(
            v["status"]["encryption"],
            json!({"attempt": 2, "inEffect": "tls-userspace", "note": "kernel TLS not used: ..."})
        );
        let back: TransferStatus = serde_json::from_value(v["status"].clone()).unwrap();
        assert_eq!(back.encryption.unwrap().in_effect, "tls-userspace");
        let body = AgentStatus {
            encryption: None,
            ..sealed
        };
        // With the optimizer's additions listed.
        let mut t = body.tuning.clone().unwrap();
        t.streams = 22;
        t.changes = vec!["after 3.0 s: 15 -> 22 ...".into()];
        let body = AgentStatus {
            tuning: Some(t),
            ..body
        };
        let v = serde_json::to_value(StatusApply::new::<Transfer>(&body)).unwrap();
        assert_eq!(
            v["status"]["tuning"]["changes"],
            json!(["after 3.0 s: 15 -> 22 ..."])
        );
        let back: TransferStatus = serde_json::from_value(v["status"].clone()).unwrap();
        assert_eq!(back.tuning, body.tuning);
    }
}
