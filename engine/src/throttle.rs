//! Rate limits for repeated log lines: a flood of the same failure (accept
//! errors while out of file descriptors, refused scanners) says so once
//! per interval with a count, rather than once per event.

use std::time::{Duration, Instant};

/// Lets one event of a kind through per interval and counts the rest.
#[derive(Debug, Clone)]
pub struct Throttle {
    interval: Duration,
    last: Option<Instant>,
    held: u64,
}

impl Throttle {
    /// At most one event through per `interval`.
    pub fn new(interval: Duration) -> Self {
        Self {
            interval,
            last: None,
            held: 0,
        }
    }

    /// An event at `now`: `Some(n)` if it should be told, with the `n`
    /// events held back since the last one told; `None` to hold it back.
    pub fn poll(&mut self, now: Instant) -> Option<u64> {
        if self
            .last
            .is_some_and(|at| now.saturating_duration_since(at) < self.interval)
        {
            self.held += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.held))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_per_interval_with_the_count_of_those_held() {
        let t0 = Instant::now();
        let mut t = Throttle::new(Duration::from_secs(10));
        assert_eq!(t.poll(t0), Some(0));
        for ms in [1, 50, 9_999] {
            assert_eq!(t.poll(t0 + Duration::from_millis(ms)), None);
        }
        assert_eq!(t.poll(t0 + Duration::from_secs(10)), Some(3));
        assert_eq!(t.poll(t0 + Duration::from_secs(11)), None);
        assert_eq!(t.poll(t0 + Duration::from_secs(30)), Some(1));
    }
}
