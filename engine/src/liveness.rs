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

/// What time asks of a control connection now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// Nothing yet.
    Nothing,
    /// Write a keepalive.
    Keepalive,
    /// The peer has been silent this long: give it up.
    GiveUp(Duration),
}

/// Both timers of one control connection, each armed when its side of
/// the protocol says it starts and disarmed when the connection ends.
#[derive(Debug, Clone, Default)]
pub struct Liveness {
    keepalive: Option<Keepalive>,
    idle: Option<IdleDeadline>,
}

impl Liveness {
    /// From `now` on, this side owes a sign of life every `interval`.
    pub fn arm_keepalive(&mut self, now: Instant, interval: Duration) {
        self.keepalive = Some(Keepalive::new(now, interval));
    }

    /// From `now` on, the peer is given up after `idle` of silence.
    pub fn arm_idle(&mut self, now: Instant, idle: Duration) {
        self.idle = Some(IdleDeadline::new(now, idle));
    }

    /// The connection is over: nothing is due any more.
    pub fn disarm(&mut self) {
        *self = Self::default();
    }

    /// Something was written to the peer at `now`.
    pub fn handle_sent(&mut self, now: Instant) {
        if let Some(k) = &mut self.keepalive {
            k.handle_sent(now);
        }
    }

    /// A frame arrived at `now`.
    pub fn handle_heard(&mut self, now: Instant) {
        if let Some(i) = &mut self.idle {
            i.handle_heard(now);
        }
    }

    /// What is due at `now`; giving up comes before a keepalive.
    #[must_use]
    pub fn poll(&self, now: Instant) -> Due {
        if let Some(silent) = self.idle.as_ref().and_then(|i| i.poll_expired(now)) {
            Due::GiveUp(silent)
        } else if self.keepalive.as_ref().is_some_and(|k| k.poll_due(now)) {
            Due::Keepalive
        } else {
            Due::Nothing
        }
    }

    /// When `poll` next has something to say, if ever.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        let k = self.keepalive.as_ref().map(Keepalive::poll_timeout);
        let i = self.idle.as_ref().map(IdleDeadline::poll_timeout);
        match (k, i) {
            (Some(k), Some(i)) => Some(k.min(i)),
            (k, i) => k.or(i),
        }
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

    #[test]
    fn liveness_arms_each_timer_on_its_own_and_giving_up_comes_first() {
        let t0 = Instant::now();
        let mut l = Liveness::default();
        assert_eq!(l.poll_timeout(), None);
        assert_eq!(l.poll(t0 + 100 * S), Due::Nothing);
        l.arm_keepalive(t0, 5 * S);
        l.handle_heard(t0 + 100 * S);
        assert_eq!(l.poll_timeout(), Some(t0 + 5 * S));
        assert_eq!(l.poll(t0 + 5 * S), Due::Keepalive);
        l.handle_sent(t0 + 5 * S);
        l.arm_idle(t0 + 5 * S, 30 * S);
        assert_eq!(l.poll_timeout(), Some(t0 + 10 * S));
        assert_eq!(l.poll(t0 + 35 * S), Due::GiveUp(30 * S));
        l.disarm();
        assert_eq!(l.poll(t0 + 35 * S), Due::Nothing);
        assert_eq!(l.poll_timeout(), None);
    }
}
