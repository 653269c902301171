//! When to reconnect after a session fails.
//!
//! The budget (`retry_for`) is the length of one outage: it counts from
//! the first failure after the transfer last made progress, not from the
//! start of the run, so that a transfer that has been running for an hour
//! still rides out a receiver's restart. A second, shorter budget
//! (`refused_for`) may end it sooner when every reconnect in a row is
//! refused: nothing listens where the peer was.

use std::time::{Duration, Instant};

/// Exponential backoff bounded by a deadline.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    retry_for: Duration,
    /// When retrying stops: `retry_for` after the first failure since the
    /// last progress (or the start); `None` until that failure.
    deadline: Option<Instant>,
    next: Duration,
    /// Give up once the failures have been refused connections, every
    /// one in a row, for this long (`refused_for`).
    refused_for: Option<Duration>,
    /// The first of the failures in a row that were refused connections.
    refused_since: Option<Instant>,
    /// The last `poll_delay` gave up on refusals.
    gave_up_refused: bool,
}

impl Backoff {
    /// Retries start `initial` apart, double up to `max`, and stop
    /// `retry_for` after the first failure, counted again from the first
    /// failure after each `handle_progress`.
    pub fn new(retry_for: Duration, initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            retry_for,
            deadline: None,
            next: initial,
            refused_for: None,
            refused_since: None,
            gave_up_refused: false,
        }
    }

    /// Gives up sooner, `d` after the first of failures in a row that
    /// were all refused connections: nothing listens where the peer was,
    /// which a network blip does not usually look like (its connections
    /// time out; only a firewall that rejects them refuses).
    pub fn refused_for(mut self, d: Duration) -> Self {
        self.refused_for = Some(d);
        self
    }

    /// A session failed at `now`, its connection `refused` or not: how
    /// long to wait before the next attempt, or `None` to give up.
    #[must_use]
    pub fn poll_delay(&mut self, now: Instant, refused: bool) -> Option<Duration> {
        self.gave_up_refused = false;
        let deadline = *self.deadline.get_or_insert(now + self.retry_for);
        if now >= deadline {
            return None;
        }
        self.refused_since = if refused {
            Some(*self.refused_since.get_or_insert(now))
        } else {
            None
        };
        let mut until = deadline;
        if let (Some(since), Some(d)) = (self.refused_since, self.refused_for) {
            if now.duration_since(since) >= d {
                self.gave_up_refused = true;
                return None;
            }
            until = until.min(since + d);
        }
        let delay = self.next.min(until - now);
        self.next = (self.next * 2).min(self.max);
        Some(delay)
    }

    /// Whether the last `poll_delay` gave up on refusals, before
    /// `retry_for`.
    pub fn gave_up_refused(&self) -> bool {
        self.gave_up_refused
    }

    /// A session made progress: the next failure starts the backoff, and
    /// the time allowed for retrying, again.
    pub fn handle_progress(&mut self) {
        self.next = self.initial;
        self.deadline = None;
        self.refused_since = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_caps_and_gives_up() {
        let t0 = Instant::now();
        let mut b = Backoff::new(
            Duration::from_secs(10),
            Duration::from_millis(500),
            Duration::from_secs(2),
        );
        assert_eq!(b.poll_delay(t0, false), Some(Duration::from_millis(500)));
        assert_eq!(b.poll_delay(t0, false), Some(Duration::from_secs(1)));
        assert_eq!(b.poll_delay(t0, false), Some(Duration::from_secs(2)));
        assert_eq!(b.poll_delay(t0, false), Some(Duration::from_secs(2)));
        b.handle_progress();
        assert_eq!(b.poll_delay(t0, false), Some(Duration::from_millis(500)));
        // Never sleeps past the deadline, then stops.
        assert_eq!(
            b.poll_delay(t0 + Duration::from_millis(9900), false),
            Some(Duration::from_millis(100))
        );
        assert_eq!(b.poll_delay(t0 + Duration::from_secs(10), false), None);
    }

    #[test]
    fn the_budget_counts_from_the_first_failure_after_progress() {
        let t0 = Instant::now();
        let at = |s| t0 + Duration::from_secs(s);
        let mut b = Backoff::new(
            Duration::from_secs(120),
            Duration::from_millis(250),
            Duration::from_secs(5),
        );
        // A transfer that ran for an hour before its first failure still
        // has its whole budget for it (it once gave up at once: the
        // deadline was the run's start plus the budget).
        assert_eq!(
            b.poll_delay(at(3600), false),
            Some(Duration::from_millis(250))
        );
        assert!(b.poll_delay(at(3700), false).is_some());
        assert_eq!(b.poll_delay(at(3720), false), None);
        // After a session that made progress, the next outage gets it all
        // again.
        b.handle_progress();
        assert_eq!(
            b.poll_delay(at(7200), false),
            Some(Duration::from_millis(250))
        );
        assert!(b.poll_delay(at(7319), false).is_some());
        assert_eq!(b.poll_delay(at(7320), false), None);
    }

    #[test]
    fn zero_budget_never_retries() {
        let t0 = Instant::now();
        let mut b = Backoff::new(
            Duration::ZERO,
            Duration::from_millis(1),
            Duration::from_millis(1),
        );
        assert_eq!(b.poll_delay(t0, false), None);
    }

    // A receiver whose process is gone refuses every connection: given up
    // after `refused_for`, where a silent path gets all of `retry_for`.
    #[test]
    fn refusals_in_a_row_give_up_sooner_and_anything_else_starts_them_again() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut b = Backoff::new(
            Duration::from_secs(8),
            Duration::from_millis(250),
            Duration::from_secs(5),
        )
        .refused_for(Duration::from_secs(3));
        // The session broke (a reset), then every reconnect is refused:
        // no wait runs past 3 s after the first refusal, and then it stops.
        assert!(b.poll_delay(at(0), false).is_some());
        assert!(b.poll_delay(at(250), true).is_some());
        assert_eq!(
            b.poll_delay(at(3000), true),
            Some(Duration::from_millis(250))
        );
        assert!(!b.gave_up_refused());
        assert_eq!(b.poll_delay(at(3250), true), None);
        assert!(b.gave_up_refused());
        // A timeout between refusals counts them again from the next.
        let mut b = Backoff::new(
            Duration::from_secs(8),
            Duration::from_millis(250),
            Duration::from_secs(5),
        )
        .refused_for(Duration::from_secs(3));
        assert!(b.poll_delay(at(0), true).is_some());
        assert!(b.poll_delay(at(2000), false).is_some());
        assert!(b.poll_delay(at(4000), true).is_some());
        assert!(b.poll_delay(at(6900), true).is_some());
        assert_eq!(b.poll_delay(at(7000), true), None);
        // Progress starts the count again; retry_for still ends it first
        // when it comes first.
        b.handle_progress();
        assert!(b.poll_delay(at(7000), true).is_some());
        assert!(b.poll_delay(at(9500), true).is_some());
        assert!(b.poll_delay(at(9999), true).is_some());
        b.handle_progress();
        assert!(b.poll_delay(at(10_000), false).is_some());
        assert!(b.poll_delay(at(17_000), true).is_some());
        assert_eq!(b.poll_delay(at(18_000), true), None);
        assert!(!b.gave_up_refused(), "the deadline, not the refusals");
        // Without the budget, refusals get all of retry_for.
        let mut b = Backoff::new(
            Duration::from_secs(8),
            Duration::from_millis(250),
            Duration::from_secs(5),
        );
        assert!(b.poll_delay(at(0), true).is_some());
        assert!(b.poll_delay(at(7000), true).is_some());
        assert_eq!(b.poll_delay(at(8000), true), None);
    }
}
