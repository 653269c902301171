//! Telling a silent peer from a vanished one on a control connection.
//!
//! A peer whose host vanished sends no FIN or RST, and a peer whose process
//! hangs still has its kernel answer TCP keepalives; either would hold a
//! receiver's session, its destinations and its slot forever. So each side
//! writes on the control connection at least every `KEEPALIVE_INTERVAL`
//! (a `Keepalive` frame when it has nothing else to say), and gives the
//! peer up once it has heard nothing for an idle deadline several intervals
//! long. Time is passed in, so the policy is tested without a clock.

use std::time::{Duration, Instant};

/// When this side owes its peer a sign of life.
#[derive(Debug, Clone)]
pub struct Keepalive {
    interval: Duration,
    next: Instant,
}

impl Keepalive {
    /// A keepalive is due `interval` after `now` unless something is sent.
    pub fn new(now: Instant, interval: Duration) -> Self {
        Self {
            interval,
            next: now + interval,
        }
    }

    /// Something was written to the peer at `now`.
    pub fn handle_sent(&mut self, now: Instant) {
        self.next = now + self.interval;
    }

    /// Whether a keepalive must be written now; call `handle_sent` once it is.
    #[must_use]
    pub fn poll_due(&self, now: Instant) -> bool {
        now >= self.next
    }

    /// When `poll_due` turns true.
    #[must_use]
    pub fn poll_timeout(&self) -> Instant {
        self.next
    }
}

/// When this side gives its peer up.
#[derive(Debug, Clone)]
pub struct IdleDeadline {
    idle: Duration,
    last_heard: Instant,
}

impl IdleDeadline {
    /// The peer, last heard at `now`, is given up after `idle` of silence.
    pub fn new(now: Instant, idle: Duration) -> Self {
        Self {
            idle,
            last_heard: now,
        }
    }

    /// A frame arrived at `now`.
    pub fn handle_heard(&mut self, now: Instant) {
        self.last_heard = self.last_heard.max(now);
    }

    /// How long the peer has been silent, once that is past the deadline.
    #[must_use]
    pub fn poll_expired(&self, now: Instant) -> Option<Duration> {
        let silent = now.saturating_duration_since(self.last_heard);
        (silent >= self.idle).then_some(silent)
    }

    /// When `poll_expired` turns `Some` unless something is heard first.
    #[must_use]
    pub fn poll_timeout(&self) -> Instant {
        self.last_heard + self.idle
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_keepalive_is_due_an_interval_after_the_last_write() {
        let t0 = Instant::now();
        let mut k = Keepalive::new(t0, 5 * S);
        assert!(!k.poll_due(t0 + 4 * S));
        assert!(k.poll_due(t0 + 5 * S));
        assert_eq!(k.poll_timeout(), t0 + 5 * S);
        k.handle_sent(t0 + 3 * S);
        assert!(!k.poll_due(t0 + 5 * S), "any write postpones the keepalive");
        assert!(k.poll_due(t0 + 8 * S));
    }

    #[test]
    fn a_peer_is_given_up_only_after_the_whole_idle_deadline() {
        let t0 = Instant::now();
        let mut d = IdleDeadline::new(t0, 30 * S);
        assert_eq!(d.poll_expired(t0 + 29 * S), None);
        d.handle_heard(t0 + 20 * S);
        assert_eq!(d.poll_expired(t0 + 49 * S), None, "hearing restarts it");
        assert_eq!(d.poll_expired(t0 + 50 * S), Some(30 * S));
        assert_eq!(d.poll_timeout(), t0 + 50 * S);
    }

    #[test]
    fn a_late_timestamp_does_not_move_the_deadline_back() {
        let t0 = Instant::now();
        let mut d = IdleDeadline::new(t0 + 10 * S, 30 * S);
        d.handle_heard(t0);
        assert_eq!(d.poll_timeout(), t0 + 40 * S);
    }
}
