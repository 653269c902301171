//! When to reconnect after a session fails.
//!
//! The budget (`retry_for`) is the length of one outage: it counts from
//! the first failure after the transfer last made progress, not from the
//! start of the run, so that a transfer that has been running for an hour
//! still rides out a receiver's restart.

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
        }
    }

    /// A session failed at `now`: how long to wait before the next
    /// attempt, or `None` to give up.
    #[must_use]
    pub fn poll_delay(&mut self, now: Instant) -> Option<Duration> {
        let deadline = *self.deadline.get_or_insert(now + self.retry_for);
        if now >= deadline {
            return None;
        }
        let delay = self.next.min(deadline - now);
        self.next = (self.next * 2).min(self.max);
        Some(delay)
    }

    /// A session made progress: the next failure starts the backoff, and
    /// the time allowed for retrying, again.
    pub fn handle_progress(&mut self) {
        self.next = self.initial;
        self.deadline = None;
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
        assert_eq!(b.poll_delay(t0), Some(Duration::from_millis(500)));
        assert_eq!(b.poll_delay(t0), Some(Duration::from_secs(1)));
        assert_eq!(b.poll_delay(t0), Some(Duration::from_secs(2)));
        assert_eq!(b.poll_delay(t0), Some(Duration::from_secs(2)));
        b.handle_progress();
        assert_eq!(b.poll_delay(t0), Some(Duration::from_millis(500)));
        // Never sleeps past the deadline, then stops.
        assert_eq!(
            b.poll_delay(t0 + Duration::from_millis(9900)),
            Some(Duration::from_millis(100))
        );
        assert_eq!(b.poll_delay(t0 + Duration::from_secs(10)), None);
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
        assert_eq!(b.poll_delay(at(3600)), Some(Duration::from_millis(250)));
        assert!(b.poll_delay(at(3700)).is_some());
        assert_eq!(b.poll_delay(at(3720)), None);
        // After a session that made progress, the next outage gets it all
        // again.
        b.handle_progress();
        assert_eq!(b.poll_delay(at(7200)), Some(Duration::from_millis(250)));
        assert!(b.poll_delay(at(7319)).is_some());
        assert_eq!(b.poll_delay(at(7320)), None);
    }

    #[test]
    fn zero_budget_never_retries() {
        let t0 = Instant::now();
        let mut b = Backoff::new(
            Duration::ZERO,
            Duration::from_millis(1),
            Duration::from_millis(1),
        );
        assert_eq!(b.poll_delay(t0), None);
    }
}
