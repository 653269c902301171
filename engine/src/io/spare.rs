//! The last session's buffers, kept for the next session and let go when
//! they have been idle for a while: the receiver's (`receiver::KEEP_IDLE`)
//! and a long-running sender's (`sender::warm::KEEP_WARM`).
//!
//! Keeping them saves the next session the first-touch cost of its pages
//! (about 0.3 s of CPU per 512 MiB on the reference VM); letting them go
//! gives a shared node its memory back once transfers stop. Time is passed
//! in, so the policy is tested without a clock.

use std::time::{Duration, Instant};

/// At most one spare pool and when it was put back.
#[derive(Debug)]
pub(crate) struct Spare<P> {
    kept: Option<(P, Instant)>,
    keep_idle: Duration,
}

impl<P> Spare<P> {
    /// An empty slot that keeps a pool for `keep_idle` after it comes back.
    pub(crate) fn new(keep_idle: Duration) -> Self {
        Self {
            kept: None,
            keep_idle,
        }
    }

    /// A session ended at `now` and hands its pool back.
    pub(crate) fn put(&mut self, pool: P, now: Instant) {
        self.kept = Some((pool, now));
    }

    /// A session starts: the kept pool, if it fits.
    pub(crate) fn take_if(&mut self, fits: impl FnOnce(&P) -> bool) -> Option<P> {
        match self.kept.take() {
            Some((p, _)) if fits(&p) => Some(p),
            // A pool of the wrong shape is dropped: the session allocates
            // its own, and two pools would double the memory held.
            _ => None,
        }
    }

    /// A session starts on a pool shared with those running: a clone of
    /// the kept pool if it fits, which stays kept. One that does not fit
    /// is dropped, as in `take_if`.
    pub(crate) fn clone_if(&mut self, fits: impl FnOnce(&P) -> bool) -> Option<P>
    where
        P: Clone,
    {
        match &self.kept {
            Some((p, _)) if fits(p) => Some(p.clone()),
            _ => {
                self.kept = None;
                None
            }
        }
    }

    /// Lets go of the kept pool, if any.
    pub(crate) fn clear(&mut self) {
        self.kept = None;
    }

    /// The pool to let go of at `now`, if it has been idle too long.
    pub(crate) fn expire(&mut self, now: Instant) -> Option<P> {
        match &self.kept {
            Some((_, at)) if now.saturating_duration_since(*at) >= self.keep_idle => {
                self.kept.take().map(|(p, _)| p)
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_pool_is_reused_when_it_fits() {
        let t0 = Instant::now();
        let mut s = Spare::new(Duration::from_secs(300));
        assert_eq!(s.take_if(|_| true), None::<u32>);
        s.put(16u32, t0);
        assert_eq!(s.take_if(|p| *p == 16), Some(16));
        assert_eq!(s.take_if(|_| true), None, "taken once");
    }

    #[test]
    fn misfit_pool_is_dropped_not_kept() {
        let t0 = Instant::now();
        let mut s = Spare::new(Duration::from_secs(300));
        s.put(16u32, t0);
        assert_eq!(s.take_if(|p| *p == 32), None);
        assert_eq!(s.take_if(|_| true), None, "the misfit is gone");
    }

    #[test]
    fn a_shared_pool_stays_kept_while_cloned() {
        let t0 = Instant::now();
        let mut s = Spare::new(Duration::from_secs(300));
        s.put(16u32, t0);
        assert_eq!(s.clone_if(|p| *p == 16), Some(16));
        assert_eq!(s.clone_if(|p| *p == 16), Some(16), "still kept");
        assert_eq!(s.clone_if(|p| *p == 32), None);
        assert_eq!(s.take_if(|_| true), None, "the misfit is gone");
    }

    #[test]
    fn idle_pool_expires_after_keep_idle_only() {
        let t0 = Instant::now();
        let idle = Duration::from_secs(300);
        let mut s = Spare::new(idle);
        s.put(16u32, t0);
        assert_eq!(s.expire(t0 + idle - Duration::from_secs(1)), None);
        assert_eq!(s.expire(t0 + idle), Some(16));
        assert_eq!(s.expire(t0 + 2 * idle), None, "expired once");
    }

    #[test]
    fn returning_a_pool_restarts_its_idle_time() {
        let t0 = Instant::now();
        let idle = Duration::from_secs(300);
        let mut s = Spare::new(idle);
        s.put(16u32, t0);
        let p = s.take_if(|_| true).unwrap();
        s.put(p, t0 + Duration::from_secs(200));
        assert_eq!(s.expire(t0 + idle), None);
        assert_eq!(s.expire(t0 + Duration::from_secs(500)), Some(16));
    }
}
