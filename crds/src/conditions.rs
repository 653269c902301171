//! Kubernetes-convention conditions and the one way they are updated.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Condition types the operator sets on a Transfer and a DtnPool.
pub mod types {
    /// Transfer: the spec refers to pools and paths that exist and are allowed.
    pub const VALID: &str = "Valid";
    /// Transfer: a sender and a receiver agent are assigned.
    pub const SCHEDULED: &str = "Scheduled";
    /// Transfer: the file landed and was verified.
    pub const COMPLETE: &str = "Complete";
    /// Transfer: it will not be retried any more.
    pub const FAILED: &str = "Failed";
    /// DtnPool: every desired agent is live.
    pub const READY: &str = "Ready";
    /// DtnPool: something keeps agents from running; the reason says what.
    pub const DEGRADED: &str = "Degraded";
}

/// A condition with `status` "True" or "False".
pub fn condition(type_: &str, ok: bool, reason: &str, message: impl Into<String>) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: if ok { "True" } else { "False" }.to_owned(),
        reason: reason.to_owned(),
        message: message.into(),
        last_transition_time: Time(Default::default()),
        observed_generation: None,
    }
}

/// `t` as the API stores a Time: to the second. A status holding finer
/// times never equals what is read back, so each write would look like a
/// change and trigger another.
pub fn whole_seconds(t: k8s_openapi::jiff::Timestamp) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(t.as_second()).unwrap_or(t))
}

/// Puts `new` into `conditions`, keeping the old transition time when the status
/// did not change, so re-reconciling never looks like a transition.
pub fn set(
    conditions: &mut Vec<Condition>,
    mut new: Condition,
    generation: Option<i64>,
    now: &Time,
) {
    new.observed_generation = generation;
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        Some(old) => {
            new.last_transition_time = if old.status == new.status {
                old.last_transition_time.clone()
            } else {
                now.clone()
            };
            *old = new;
        }
        None => {
            new.last_transition_time = now.clone();
            conditions.push(new);
        }
    }
}

/// The condition of `type_`, if present.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether `type_` is present with status "True".
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
    }

    #[test]
    fn transition_time_moves_only_when_status_changes() {
        let mut c = Vec::new();
        set(
            &mut c,
            condition(types::VALID, true, "Ok", "fine"),
            Some(1),
            &at(10),
        );
        set(
            &mut c,
            condition(types::VALID, true, "Ok", "still fine"),
            Some(2),
            &at(20),
        );
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].last_transition_time, at(10));
        assert_eq!(c[0].message, "still fine");
        assert_eq!(c[0].observed_generation, Some(2));
        set(
            &mut c,
            condition(types::VALID, false, "Bad", "broken"),
            Some(3),
            &at(30),
        );
        assert_eq!(c[0].last_transition_time, at(30));
        assert!(!is_true(&c, types::VALID));
    }
}
