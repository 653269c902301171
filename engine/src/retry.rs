//! When to reconnect after a session fails.

use std::time::{Duration, Instant};

/// Exponential backoff bounded by a deadline.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    deadline: Instant,
    next: Duration,
}

impl Backoff {
    /// Retries start `initial` apart, double up to `max`, and stop at `start + retry_for`.
    pub fn new(start: Instant, retry_for: Duration, initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            deadline: start + retry_for,
            next: initial,
        }
    }

    /// How long to wait before the next attempt, or `None` to give up.
    #[must_use]
    pub fn poll_delay(&mut self, now: Instant) -> Option<Duration> {
        if now >= self.deadline {
            return None;
        }
        let delay = self.next.min(self.deadline - now);
        self.next = (self.next * 2).min(self.max);
        Some(delay)
    }

    /// A session made progress: the next failure starts the backoff again.
    pub fn handle_progress(&mut self) {
        self.next = self.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_caps_and_gives_up() {
        let t0 = Instant::now();
        let mut b = Backoff::new(
            t0,
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
    fn zero_budget_never_retries() {
        let t0 = Instant::now();
        let mut b = Backoff::new(
            t0,
            Duration::ZERO,
            Duration::from_millis(1),
            Duration::from_millis(1),
        );
        assert_eq!(b.poll_delay(t0), None);
    }
}
