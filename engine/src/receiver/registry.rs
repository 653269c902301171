//! The receiver's sessions by id, including those still being opened.
//!
//! A sender connects its data streams while its control connection is
//! still opening the session, so a stream's join can arrive before the
//! session exists. It waits here: for a session being opened, until it is
//! published or withdrawn; for an id nobody has announced yet, for a grace
//! period, after which it is refused.
#![forbid(unsafe_code)]

use std::collections::{HashMap, HashSet};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::wire::SessionId;

/// How long a waiting join rechecks whether the receiver is stopping.
const RECHECK: Duration = Duration::from_millis(500);

struct State<T> {
    open: HashMap<SessionId, T>,
    opening: HashSet<SessionId>,
}

/// Sessions being opened and open, with a way to wait for one.
pub(crate) struct Registry<T> {
    state: Mutex<State<T>>,
    changed: Condvar,
}

impl<T> Default for Registry<T> {
    fn default() -> Self {
        Self {
            state: Mutex::new(State {
                open: HashMap::new(),
                opening: HashSet::new(),
            }),
            changed: Condvar::new(),
        }
    }
}

impl<T: Clone> Registry<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Claims `id` for a session about to be opened; false if it is taken.
    pub(crate) fn announce(&self, id: SessionId) -> bool {
        let mut g = self.lock();
        if g.open.contains_key(&id) || g.opening.contains(&id) {
            return false;
        }
        g.opening.insert(id);
        drop(g);
        self.changed.notify_all();
        true
    }

    /// The announced session is ready for its data streams.
    pub(crate) fn publish(&self, id: SessionId, session: T) {
        let mut g = self.lock();
        g.opening.remove(&id);
        g.open.insert(id, session);
        drop(g);
        self.changed.notify_all();
    }

    /// Forgets `id`, announced or open; returns the open session.
    pub(crate) fn withdraw(&self, id: &SessionId) -> Option<T> {
        let mut g = self.lock();
        g.opening.remove(id);
        let s = g.open.remove(id);
        drop(g);
        self.changed.notify_all();
        s
    }

    /// Sessions being opened or open.
    pub(crate) fn len(&self) -> usize {
        let g = self.lock();
        g.open.len() + g.opening.len()
    }

    /// Waits for `id` to be open. Gives up when it is withdrawn, when no one
    /// has announced it within `grace`, or when `stopping` says so.
    pub(crate) fn wait(
        &self,
        id: &SessionId,
        grace: Duration,
        stopping: impl Fn() -> bool,
    ) -> Option<T> {
        let deadline = Instant::now() + grace;
        let mut announced = false;
        let mut g = self.lock();
        loop {
            if let Some(s) = g.open.get(id) {
                return Some(s.clone());
            }
            let now = Instant::now();
            let wait = if g.opening.contains(id) {
                announced = true;
                RECHECK
            } else if announced || now >= deadline {
                // Withdrawn after its announcement, or never announced.
                return None;
            } else {
                (deadline - now).min(RECHECK)
            };
            if stopping() {
                return None;
            }
            g = self
                .changed
                .wait_timeout(g, wait)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    const A: SessionId = [1; 16];

    #[test]
    fn an_id_is_announced_once() {
        let r = Registry::<u32>::default();
        assert!(r.announce(A));
        assert!(!r.announce(A), "a second session may not take the same id");
        r.publish(A, 7);
        assert!(!r.announce(A), "nor may it take an open session's id");
        assert_eq!(r.len(), 1);
        assert_eq!(r.withdraw(&A), Some(7));
        assert_eq!(r.len(), 0);
        assert!(r.announce(A), "a withdrawn id is free again");
    }

    #[test]
    fn a_join_waits_for_its_session_to_be_published() {
        let r = Arc::new(Registry::<u32>::default());
        assert!(r.announce(A));
        let waiter = {
            let r = Arc::clone(&r);
            std::thread::spawn(move || r.wait(&A, Duration::ZERO, || false))
        };
        std::thread::sleep(Duration::from_millis(50));
        r.publish(A, 3);
        assert_eq!(
            waiter.join().unwrap(),
            Some(3),
            "an announced session is waited for past the grace period"
        );
    }

    #[test]
    fn a_join_that_races_the_announcement_is_not_refused() {
        let r = Arc::new(Registry::<u32>::default());
        let waiter = {
            let r = Arc::clone(&r);
            std::thread::spawn(move || r.wait(&A, Duration::from_secs(10), || false))
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(r.announce(A));
        r.publish(A, 5);
        assert_eq!(waiter.join().unwrap(), Some(5));
    }

    #[test]
    fn a_withdrawn_or_unknown_session_refuses_the_join() {
        let r = Arc::new(Registry::<u32>::default());
        let t0 = Instant::now();
        assert_eq!(r.wait(&A, Duration::from_millis(100), || false), None);
        assert!(
            t0.elapsed() >= Duration::from_millis(100),
            "waits out the grace"
        );

        assert!(r.announce(A));
        let waiter = {
            let r = Arc::clone(&r);
            std::thread::spawn(move || r.wait(&A, Duration::from_secs(10), || false))
        };
        std::thread::sleep(Duration::from_millis(50));
        r.withdraw(&A);
        assert_eq!(waiter.join().unwrap(), None, "a failed open ends the wait");

        assert_eq!(
            r.wait(&A, Duration::from_secs(10), || true),
            None,
            "a stopping receiver does not wait"
        );
    }
}
