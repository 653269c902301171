//! Leader election through a coordination.k8s.io Lease, so that of several
//! operator replicas exactly one reconciles.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::time::Instant;

use crate::Result;

/// Name of the operator's Lease.
pub const LEASE_NAME: &str = "wirerate-operator";
/// Seconds a leader's claim lasts without renewal.
pub const LEASE_SECONDS: i32 = 15;
/// How often the leader renews.
const RENEW_EVERY: Duration = Duration::from_secs(5);
/// How long the leader leads on without a renewal the API server took:
/// well inside [`LEASE_SECONDS`], so that it has stopped before a standby
/// may take the Lease (client-go's leader election keeps 10 s of 15 too).
/// A renewal that hangs counts from when it was stamped, not answered.
pub const RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// How long one try to take the Lease may take, while not leading.
const TRY_DEADLINE: Duration = Duration::from_secs(10);

/// What to do with a Lease as `me`, at `now`: the new Lease to write, or None
/// when someone else holds it. Pure, so takeover rules are tested directly.
pub fn claim(lease: &Lease, me: &str, now: Timestamp) -> Option<Lease> {
    let spec = lease.spec.clone().unwrap_or_default();
    let holder = spec.holder_identity.as_deref();
    let duration = i64::from(spec.lease_duration_seconds.unwrap_or(LEASE_SECONDS));
    let expired = spec
        .renew_time
        .as_ref()
        .is_none_or(|t| t.0 + SignedDuration::from_secs(duration) < now);
    if holder != Some(me) && holder.is_some() && !expired {
        return None;
    }
    let mut next = lease.clone();
    let taking_over = holder != Some(me);
    next.spec = Some(LeaseSpec {
        holder_identity: Some(me.to_owned()),
        lease_duration_seconds: Some(LEASE_SECONDS),
        acquire_time: if taking_over {
            Some(MicroTime(now))
        } else {
            spec.acquire_time
        },
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(
            spec.lease_transitions.unwrap_or(0) + i32::from(taking_over && holder.is_some()),
        ),
        ..Default::default()
    });
    Some(next)
}

/// The Lease handed back by `me`, or None when `me` does not hold it. With
/// no holder, a standby takes it on its next try instead of waiting out the
/// duration.
pub fn released(lease: &Lease, me: &str) -> Option<Lease> {
    let spec = lease.spec.clone().unwrap_or_default();
    if spec.holder_identity.as_deref() != Some(me) {
        return None;
    }
    let mut next = lease.clone();
    next.spec = Some(LeaseSpec {
        holder_identity: None,
        renew_time: None,
        acquire_time: None,
        ..spec
    });
    Some(next)
}

/// Hands the Lease back if this replica holds it (on a clean shutdown).
pub async fn release(client: &Client, namespace: &str, me: &str) -> Result<bool> {
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let Some(current) = api.get_opt(LEASE_NAME).await? else {
        return Ok(false);
    };
    let Some(next) = released(&current, me) else {
        return Ok(false);
    };
    match api.replace(LEASE_NAME, &PostParams::default(), &next).await {
        Ok(_) => Ok(true),
        // Someone renewed or took it meanwhile: nothing of ours to release.
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Tries once to take or keep the Lease; true while we lead.
pub async fn try_lead(client: &Client, namespace: &str, me: &str) -> Result<bool> {
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let now = Timestamp::now();
    match api.get_opt(LEASE_NAME).await? {
        None => {
            let fresh = Lease {
                metadata: ObjectMeta {
                    name: Some(LEASE_NAME.into()),
                    namespace: Some(namespace.into()),
                    ..Default::default()
                },
                spec: None,
            };
            let lease = claim(&fresh, me, now).expect("an empty lease is free");
            match api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e.into()),
            }
        }
        Some(current) => match claim(&current, me, now) {
            None => Ok(false),
            // replace() carries the resourceVersion we read: a racing replica gets 409.
            Some(next) => match api.replace(LEASE_NAME, &PostParams::default(), &next).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e.into()),
            },
        },
    }
}

/// Blocks until this replica leads; returns when the Lease it took was
/// stamped, for [`hold`]. A try that fails, or that the API server does not
/// answer within [`TRY_DEADLINE`], counts as not leading: a standby waits
/// out an API server's blip rather than exit with the leader (if a try was
/// applied late, the next finds the Lease ours and renews it).
pub async fn acquire(client: &Client, namespace: &str, me: &str) -> Instant {
    loop {
        let attempt = Instant::now();
        match tokio::time::timeout(TRY_DEADLINE, try_lead(client, namespace, me)).await {
            Ok(Ok(true)) => return attempt,
            Ok(Ok(false)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "cannot read or take the leader Lease"),
            Err(_) => tracing::warn!("no answer on the leader Lease within {TRY_DEADLINE:?}"),
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// How long after a failed renewal the leader tries again.
const RETRY_EVERY: Duration = Duration::from_secs(1);

/// How long to wait before the next renewal, `since` the Lease was last
/// stamped, after a try that `failed` (or None: stop leading, the deadline
/// has passed). Renewals keep to the stamp's cadence, so a slow answer does
/// not push the next one late; a failed one is tried again soon.
pub fn next_renewal(since: Duration, failed: bool) -> Option<Duration> {
    let left = RENEW_DEADLINE.checked_sub(since).filter(|l| !l.is_zero())?;
    Some(if failed {
        RETRY_EVERY.min(left)
    } else {
        RENEW_EVERY.saturating_sub(since)
    })
}

/// Renews the Lease on the cadence of [`next_renewal`]; returns when
/// leadership is lost or may be: another replica holds the Lease, or no
/// renewal was taken within [`RENEW_DEADLINE`] of the last stamp (a
/// stalled API server included: each renewal waits only for what is left
/// of the deadline). `stamped` is [`acquire`]'s answer.
pub async fn hold(client: Client, namespace: String, me: String, mut stamped: Instant) -> String {
    let lapsed = || format!("no renewal of the Lease taken within {RENEW_DEADLINE:?}");
    let mut failed = false;
    loop {
        let Some(wait) = next_renewal(stamped.elapsed(), failed) else {
            return lapsed();
        };
        tokio::time::sleep(wait).await;
        let Some(left) = RENEW_DEADLINE.checked_sub(stamped.elapsed()) else {
            return lapsed();
        };
        let attempt = Instant::now();
        match tokio::time::timeout(left, try_lead(&client, &namespace, &me)).await {
            Ok(Ok(true)) => (stamped, failed) = (attempt, false),
            Ok(Ok(false)) => return "another replica holds the Lease".into(),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot renew the leader Lease; trying again");
                failed = true;
            }
            Err(_) => return format!("{}: the API server did not answer", lapsed()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    #[test]
    fn takes_a_free_or_expired_lease_and_keeps_its_own() {
        let free = Lease::default();
        let mine = claim(&free, "a", at(100)).unwrap();
        assert_eq!(
            mine.spec.as_ref().unwrap().holder_identity.as_deref(),
            Some("a")
        );
        // Someone else's fresh lease: hands off.
        assert!(claim(&mine, "b", at(110)).is_none());
        // Renewing our own keeps the acquire time.
        let renewed = claim(&mine, "a", at(110)).unwrap();
        assert_eq!(
            renewed.spec.as_ref().unwrap().acquire_time,
            mine.spec.as_ref().unwrap().acquire_time
        );
        // Expired: b takes over and the transition is counted.
        let taken = claim(&renewed, "b", at(126)).unwrap();
        let s = taken.spec.unwrap();
        assert_eq!(
            (s.holder_identity.as_deref(), s.lease_transitions),
            (Some("b"), Some(1))
        );
    }

    // Found against a real API server: a leader stopped by SIGTERM kept its
    // Lease, so the standby waited out the 15 s duration (28 s under load).
    #[test]
    fn a_released_lease_is_taken_at_once() {
        let mine = claim(&Lease::default(), "a", at(100)).unwrap();
        assert!(released(&mine, "b").is_none(), "only the holder releases");
        let free = released(&mine, "a").unwrap();
        let s = free.spec.as_ref().unwrap();
        assert_eq!(s.holder_identity, None);
        // One second later, not fifteen: b takes it.
        let taken = claim(&free, "b", at(101)).expect("free at once");
        assert_eq!(taken.spec.unwrap().holder_identity.as_deref(), Some("b"));
    }

    /// The API double, a client of it, and the instant "a" took the Lease
    /// there (in namespace "ops").
    async fn leading_on_double() -> (wirerate_apiserver_double::ApiServer, Client, Instant) {
        use wirerate_apiserver_double::{ApiServer, install};
        let api = ApiServer::start(Duration::ZERO).await.unwrap();
        let client = api.client().unwrap();
        install(&client, &["ops"]).await.unwrap();
        let stamped = acquire(&client, "ops", "a").await;
        (api, client, stamped)
    }

    // issue 35: the leader renewed its Lease with no deadline on the call,
    // so a renewal the API server held for 30 s kept it reconciling while
    // its Lease lapsed at 15 s and a standby took over: two leaders. Now it
    // stops within RENEW_DEADLINE of its last stamp, before the Lease ends.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_leader_whose_renewals_stall_stops_before_its_lease_ends() {
        let (api, client, stamped) = leading_on_double().await;
        // Every later write of the Lease (a renewal is a replace) is held.
        api.stall("update", "leases", Duration::from_secs(30));
        let why = tokio::time::timeout(
            Duration::from_secs(LEASE_SECONDS.unsigned_abs().into()),
            hold(client.clone(), "ops".into(), "a".into(), stamped),
        )
        .await
        .expect("the leader stops leading before its Lease could be taken");
        assert!(
            stamped.elapsed() < Duration::from_secs(LEASE_SECONDS.unsigned_abs().into()),
            "stopped {:?} after the stamp",
            stamped.elapsed()
        );
        assert!(why.contains("no renewal"), "{why}");
        api.unstall();
    }

    #[test]
    fn renewals_keep_to_the_stamp_and_retry_soon_until_the_deadline() {
        let s = Duration::from_secs;
        // On cadence: 5 s after the stamp, whenever the last answer came.
        assert_eq!(next_renewal(s(0), false), Some(s(5)));
        assert_eq!(
            next_renewal(Duration::from_millis(2500), false),
            Some(Duration::from_millis(2500))
        );
        // Late already: at once.
        assert_eq!(next_renewal(s(7), false), Some(s(0)));
        // After a failure, again within a second, never past the deadline.
        assert_eq!(next_renewal(s(5), true), Some(s(1)));
        assert_eq!(
            next_renewal(Duration::from_millis(9500), true),
            Some(Duration::from_millis(500))
        );
        assert_eq!(next_renewal(s(10), true), None);
        assert_eq!(next_renewal(s(11), false), None);
    }

    // From a review: one failed renewal (a 5xx, a reset while the API
    // server restarts) and a few slow ones must not end a healthy
    // leadership, as a first version of the deadline did.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_leader_rides_out_slow_renewals() {
        let (api, client, stamped) = leading_on_double().await;
        // Every renewal answered 3 s late, through more than a Lease.
        api.stall("update", "leases", Duration::from_secs(3));
        let held = tokio::time::timeout(
            Duration::from_secs(17),
            hold(client.clone(), "ops".into(), "a".into(), stamped),
        )
        .await;
        assert!(held.is_err(), "gave up: {held:?}");
        api.unstall();
    }
}
