//! When the agent writes to the API server: its Lease renewals, and reports
//! that wait to be sent again. Pure (the time is passed in as the time since
//! any fixed start), so the agent's write budget is tested without a clock.
//!
//! The budget: an idle agent writes its Lease every third of the lease's
//! duration and nothing else, so at most one write every 5 s for the
//! contract's 15 s Lease. A renewal that failed is tried again soon, since
//! the Lease is then at risk; a change the operator should know of (a
//! transfer started or ended) goes out early, but never within
//! [`LeaseCadence::MIN_GAP`] of the last write.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::time::Duration;

/// When to renew the Lease.
#[derive(Debug)]
pub struct LeaseCadence {
    period: Duration,
    /// The last renewal the API server took.
    last_ok: Option<Duration>,
    /// The last renewal tried, and whether it failed.
    last_try: Option<(Duration, bool)>,
}

impl LeaseCadence {
    /// Shortest gap between two renewals that carry a change.
    pub const MIN_GAP: Duration = Duration::from_secs(1);
    /// How soon a failed renewal is tried again.
    pub const RETRY: Duration = Duration::from_secs(1);
    /// How long one renewal may take before it counts as failed: short
    /// enough that two in a row fit in what is left of the Lease.
    pub const CALL_TIMEOUT: Duration = Duration::from_secs(4);

    /// For a Lease valid `lease` long: renewed every third of it, so that
    /// two renewals in a row may be lost or late before it lapses.
    pub fn new(lease: Duration) -> Self {
        Self {
            period: (lease / 3).max(Self::MIN_GAP),
            last_ok: None,
            last_try: None,
        }
    }

    /// The time from the last renewal to the next, when all is well.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// How long from `now` until a renewal is due (zero: now), given
    /// whether the Lease's content `changed` since the last one taken.
    pub fn wait(&self, now: Duration, changed: bool) -> Duration {
        let Some((tried, failed)) = self.last_try else {
            return Duration::ZERO;
        };
        let after = if failed {
            Self::RETRY
        } else if changed {
            Self::MIN_GAP
        } else {
            self.period
        };
        (tried + after).saturating_sub(now)
    }

    /// Whether to renew at `now`.
    pub fn due(&self, now: Duration, changed: bool) -> bool {
        self.wait(now, changed).is_zero()
    }

    /// A renewal was tried at `now` (when it was sent); `ok` if taken.
    pub fn tried(&mut self, now: Duration, ok: bool) {
        self.last_try = Some((now, !ok));
        if ok {
            self.last_ok = Some(now);
        }
    }

    /// When the last renewal taken was sent.
    pub fn last_ok(&self) -> Option<Duration> {
        self.last_ok
    }
}

/// What became of one send of a report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sent {
    /// The API server took it.
    Taken,
    /// It may take it later (a timeout, 429, 5xx, a broken connection).
    Retry,
    /// It never will (the Transfer is gone, the agent may not write it).
    Refused,
}

struct Entry<R> {
    report: R,
    /// Bumped by each post, so an answer to an older send does not
    /// settle a newer report.
    seq: u64,
    sending: bool,
    retry_at: Duration,
    failures: u32,
}

/// Reports waiting to be sent, the latest per key: a report that could not
/// be sent is sent again later, with a growing pause, until it is taken or
/// a newer report of the same key replaces it. So a verdict the API server
/// was too slow to take arrives late rather than never, and the agent's
/// loop never waits for the API server.
pub struct Outbox<K, R> {
    entries: BTreeMap<K, Entry<R>>,
    seq: u64,
}

impl<K, R> Default for Outbox<K, R> {
    fn default() -> Self {
        Self {
            entries: BTreeMap::new(),
            seq: 0,
        }
    }
}

impl<K: Ord + Clone, R: Clone> Outbox<K, R> {
    /// The first pause after a failed send; it doubles up to [`Self::MAX_PAUSE`].
    pub const FIRST_PAUSE: Duration = Duration::from_secs(1);
    /// The longest pause between two sends of one report.
    pub const MAX_PAUSE: Duration = Duration::from_secs(10);

    /// Queues `report` for `key`, replacing one not yet taken. A report
    /// waiting out a pause keeps waiting: the API server is no faster for it.
    pub fn post(&mut self, key: K, report: R) {
        self.seq += 1;
        let seq = self.seq;
        self.entries
            .entry(key)
            .and_modify(|e| {
                e.report = report.clone();
                e.seq = seq;
            })
            .or_insert(Entry {
                report,
                seq,
                sending: false,
                retry_at: Duration::ZERO,
                failures: 0,
            });
    }

    /// The reports to send at `now`, each with its sequence number: one
    /// send at a time per key, so two of its reports never race.
    pub fn ready(&mut self, now: Duration) -> Vec<(K, u64, R)> {
        self.entries
            .iter_mut()
            .filter(|(_, e)| !e.sending && e.retry_at <= now)
            .map(|(k, e)| {
                e.sending = true;
                (k.clone(), e.seq, e.report.clone())
            })
            .collect()
    }

    /// The send of `key`'s report `seq` ended at `now` as `sent`.
    pub fn done(&mut self, key: &K, seq: u64, sent: Sent, now: Duration) {
        let Some(e) = self.entries.get_mut(key) else {
            return;
        };
        e.sending = false;
        match sent {
            Sent::Taken | Sent::Refused if e.seq == seq => {
                self.entries.remove(key);
            }
            // A newer report came meanwhile: it goes next, at once.
            Sent::Taken | Sent::Refused => e.failures = 0,
            Sent::Retry => {
                e.failures = e.failures.saturating_add(1);
                let pause = Self::FIRST_PAUSE
                    .saturating_mul(1 << e.failures.min(8).saturating_sub(1))
                    .min(Self::MAX_PAUSE);
                e.retry_at = now + pause;
            }
        }
    }

    /// How long from `now` until a report waiting out a pause is due; None
    /// when none waits (nothing queued, or all being sent).
    pub fn wait(&self, now: Duration) -> Option<Duration> {
        self.entries
            .values()
            .filter(|e| !e.sending)
            .map(|e| e.retry_at.saturating_sub(now))
            .min()
    }

    /// Reports not yet taken.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether every report was taken (or refused).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// How long a side of a Transfer may wait for its token before the agent
/// gives up on it: the operator writes the Secret and the grant before the
/// assignment, but the agent may see the assignment first (its watch, or
/// a copy of the status written from a stale cache), and the API server's
/// authorizer learns of a new RoleBinding a moment late.
pub const TOKEN_WAIT: Duration = Duration::from_secs(60);

/// Sides of Transfers waiting for their token, since when.
#[derive(Debug)]
pub struct NotYet<K> {
    since: HashMap<K, Duration>,
}

impl<K> Default for NotYet<K> {
    fn default() -> Self {
        Self {
            since: HashMap::new(),
        }
    }
}

impl<K: Hash + Eq + Clone> NotYet<K> {
    /// `key` could not start at `now` for want of its token: true while it
    /// may wait longer, false once it has waited [`TOKEN_WAIT`].
    pub fn waiting(&mut self, key: &K, now: Duration) -> bool {
        let since = *self.since.entry(key.clone()).or_insert(now);
        now.saturating_sub(since) < TOKEN_WAIT
    }

    /// `key` started, or is no longer wanted.
    pub fn forget(&mut self, key: &K) {
        self.since.remove(key);
    }

    /// Forgets every key `keep` says no to.
    pub fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        self.since.retain(|k, _| keep(k));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    /// Writes an agent makes over `secs` seconds of a 1 s loop, renewing
    /// whenever due, with `fails(t)` telling which tries fail.
    fn renewals(secs: u64, changed_at: &[u64], fails: impl Fn(u64) -> bool) -> Vec<u64> {
        let mut c = LeaseCadence::new(s(15));
        let mut out = Vec::new();
        let mut pending_change = false;
        for t in 0..secs {
            pending_change |= changed_at.contains(&t);
            if c.due(s(t), pending_change) {
                let ok = !fails(t);
                c.tried(s(t), ok);
                out.push(t);
                if ok {
                    pending_change = false;
                }
            }
        }
        out
    }

    #[test]
    fn an_idle_agent_renews_once_every_five_seconds() {
        let w = renewals(60, &[], |_| false);
        assert_eq!(w, [0, 5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 55]);
        assert_eq!(LeaseCadence::new(s(15)).period(), s(5));
    }

    #[test]
    fn a_change_goes_out_early_but_not_within_a_second() {
        // Changes at 2 and 3: renewals at 2 and 3, then the period counts
        // from the last.
        let w = renewals(12, &[2, 3], |_| false);
        assert_eq!(w, [0, 2, 3, 8]);
    }

    #[test]
    fn a_failed_renewal_is_tried_again_within_a_second() {
        let w = renewals(20, &[], |t| t == 5 || t == 6);
        assert_eq!(w, [0, 5, 6, 7, 12, 17]);
        let mut c = LeaseCadence::new(s(15));
        c.tried(s(5), true);
        c.tried(s(10), false);
        assert_eq!(
            c.last_ok(),
            Some(s(5)),
            "a failure does not count as renewed"
        );
        assert_eq!(c.wait(s(10), false), s(1));
    }

    #[test]
    fn two_renewals_may_be_lost_before_the_lease_lapses() {
        // Renewed at 0, the next two time out: each is due again at once
        // when it gives up (RETRY is shorter than the timeout), and the
        // third is sent in time.
        let mut c = LeaseCadence::new(s(15));
        c.tried(s(0), true);
        let second = c.wait(s(0), false);
        c.tried(second, false);
        let given_up = second + LeaseCadence::CALL_TIMEOUT;
        assert!(c.due(given_up, false));
        c.tried(given_up, false);
        let third = given_up + LeaseCadence::CALL_TIMEOUT;
        assert!(c.due(third, false));
        assert!(third < s(15), "{third:?}");
    }

    #[test]
    fn a_report_not_taken_is_sent_again_with_a_growing_pause() {
        let mut o: Outbox<&str, &str> = Outbox::default();
        o.post("a", "running");
        let sent = o.ready(s(0));
        assert_eq!(sent, [("a", 1, "running")]);
        assert!(o.ready(s(0)).is_empty(), "one send at a time");
        o.done(&"a", 1, Sent::Retry, s(4));
        assert_eq!(o.wait(s(4)), Some(s(1)));
        assert!(o.ready(s(4)).is_empty());
        let again = o.ready(s(5));
        assert_eq!(again.len(), 1);
        o.done(&"a", 1, Sent::Retry, s(9));
        assert_eq!(o.wait(s(9)), Some(s(2)), "doubled");
        for _ in 0..10 {
            let now = s(9) + o.wait(s(9)).unwrap();
            let r = o.ready(now);
            o.done(&"a", r[0].1, Sent::Retry, now);
            assert!(o.wait(now).unwrap() <= Outbox::<&str, &str>::MAX_PAUSE);
        }
        o.ready(s(1000));
        o.done(&"a", 1, Sent::Taken, s(1000));
        assert!(o.is_empty());
    }

    #[test]
    fn a_newer_report_replaces_the_one_waiting_and_outlives_an_older_answer() {
        let mut o: Outbox<&str, &str> = Outbox::default();
        o.post("a", "running");
        o.post("b", "running");
        let first = o.ready(s(0));
        assert_eq!(first.len(), 2);
        // The verdict comes while the last report is in flight.
        o.post("a", "succeeded");
        o.done(&"a", first[0].1, Sent::Taken, s(1));
        assert_eq!(o.len(), 2, "the verdict is still to send");
        assert_eq!(o.ready(s(1)), [("a", 3, "succeeded")]);
        o.done(&"a", 3, Sent::Taken, s(2));
        o.done(&"b", first[1].1, Sent::Refused, s(2));
        assert!(o.is_empty(), "taken, or refused for good");
        assert_eq!(o.wait(s(2)), None);
    }

    #[test]
    fn a_missing_token_is_waited_for_within_a_bound() {
        let mut n = NotYet::default();
        assert!(n.waiting(&"a", s(100)));
        assert!(n.waiting(&"a", s(159)));
        assert!(!n.waiting(&"a", s(160)), "given up after TOKEN_WAIT");
        n.forget(&"a");
        assert!(n.waiting(&"a", s(200)), "a new wait starts afresh");
        n.retain(|_| false);
        assert!(n.waiting(&"a", s(300)));
    }
}
