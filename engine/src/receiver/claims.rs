//! Which session is writing which destination, so that two sessions never
//! write one file, and how a new session takes a destination over from
//! one whose sender has gone silent.
//!
//! A sender whose network vanished (no FIN, no RST) leaves its session
//! open here until the idle deadline ends it. When the same sender comes
//! back sooner with a new session for the same files, waiting for that
//! deadline would only cost it time: a session that has not heard from its
//! sender for `takeover_after` (three keepalive intervals: a live sender
//! writes every one) is ended, and the new session waits until it has
//! released the files (its writer drained and checkpointed them) before it
//! claims them.
#![forbid(unsafe_code)]

use crate::net::Conn;
use std::hash::{BuildHasher, RandomState};
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long a new session waits for a silent one to let go of its files:
/// shorter than the sender's idle deadline, since the waiting session
/// says nothing to its sender meanwhile.
const RELEASE_WAIT: Duration = Duration::from_secs(20);

/// What others may need of a session: when its sender was last heard, and
/// a way to end it.
#[derive(Debug)]
pub(crate) struct Life {
    born: Instant,
    /// Milliseconds after `born` that the sender was last heard.
    heard_ms: AtomicU64,
    /// A handle on the control connection: shutting it down wakes the
    /// session's control thread, which then ends the session.
    control: Conn,
    taken_over: AtomicBool,
}

impl Life {
    pub(crate) fn new(control: Conn, now: Instant) -> Self {
        Self {
            born: now,
            heard_ms: AtomicU64::new(0),
            control,
            taken_over: AtomicBool::new(false),
        }
    }

    /// The sender was heard at `now`.
    pub(crate) fn heard(&self, now: Instant) {
        let ms = now.saturating_duration_since(self.born).as_millis() as u64;
        self.heard_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// How long the sender has been silent at `now`.
    pub(crate) fn silent_for(&self, now: Instant) -> Duration {
        let heard = self.born + Duration::from_millis(self.heard_ms.load(Ordering::Relaxed));
        now.saturating_duration_since(heard)
    }

    /// Whether another session ended this one to take its files.
    pub(crate) fn was_taken_over(&self) -> bool {
        self.taken_over.load(Ordering::SeqCst)
    }

    fn take_over(&self) {
        if !self.taken_over.swap(true, Ordering::SeqCst) {
            let _ = self.control.shutdown(Shutdown::Both);
        }
    }
}

/// Why a session could not claim its files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Busy {
    /// The first contended destination.
    pub(crate) path: String,
    /// How long its holder's sender has been silent.
    pub(crate) silent: Duration,
    /// The holder was told to end but has not let go in time.
    pub(crate) releasing: bool,
}

impl Busy {
    pub(crate) fn message(&self) -> String {
        if self.releasing {
            format!(
                "{} is still being released by a session whose sender went silent; retry shortly",
                self.path
            )
        } else {
            format!(
                "{} is being written by another session right now (its sender was heard {:.0} s ago); retry when it ends",
                self.path,
                self.silent.as_secs_f64()
            )
        }
    }
}

/// A destination as claims know it: its path hashed with this receiver's
/// secret key. A claim per file of a million-file manifest then costs a
/// word rather than a copy of its path. Equal paths always collide, so two
/// sessions never write one file. Unequal paths collide only by chance
/// (about n*m/2^64 for sessions of n and m files; an attacker cannot aim
/// without the key), and then they are treated as one: the new session is
/// refused as busy and retries, or, if the holder's sender has been silent
/// for the takeover time, the holder is ended as for a real takeover and
/// resumes later. A cost, never a wrong write.
type Key = u64;

/// One session's claims: its keys, sorted, held exactly (a hash map
/// would hold twice as many slots as keys).
#[derive(Debug)]
struct Holder {
    life: Arc<Life>,
    keys: Box<[Key]>,
    /// The transfer over several pairs this session is part of: its
    /// sessions write disjoint pieces of the same files, and do not
    /// contend with one another.
    group: Option<u64>,
}

impl Holder {
    /// A key both this and `sorted` hold: the smaller side is looked up in
    /// the larger, so a small session costs little against a huge one.
    fn common(&self, sorted: &[Key]) -> Option<Key> {
        let (few, many) = if self.keys.len() <= sorted.len() {
            (&*self.keys, sorted)
        } else {
            (sorted, &*self.keys)
        };
        few.iter().copied().find(|k| many.binary_search(k).is_ok())
    }
}

/// Destinations in use, by the session writing them.
#[derive(Debug, Default)]
pub(crate) struct Claims {
    key: RandomState,
    /// At most one per session (`--max-sessions`).
    held: Mutex<Vec<Holder>>,
    released: Condvar,
}

impl Claims {
    fn lock(&self) -> MutexGuard<'_, Vec<Holder>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn key(&self, path: &str) -> Key {
        self.key.hash_one(path)
    }

    /// Claims `paths` for `life`. A holder silent for `takeover_after` is
    /// ended and waited for; a live one makes this fail.
    #[cfg(test)]
    pub(crate) fn claim(
        &self,
        paths: &[&str],
        life: &Arc<Life>,
        takeover_after: Duration,
    ) -> Result<(), Busy> {
        self.claim_in(paths, life, takeover_after, None)
    }

    /// `claim`, for a session of transfer `group` (over several pairs)
    /// where it has one: holders of the same group do not contend.
    pub(crate) fn claim_in(
        &self,
        paths: &[&str],
        life: &Arc<Life>,
        takeover_after: Duration,
        group: Option<u64>,
    ) -> Result<(), Busy> {
        let deadline = Instant::now() + RELEASE_WAIT;
        let mut keys: Vec<Key> = paths.iter().map(|p| self.key(p)).collect();
        keys.sort_unstable();
        keys.dedup();
        let mut held = self.lock();
        loop {
            let contended = held
                .iter()
                .filter(|h| group.is_none() || h.group != group)
                .find_map(|h| h.common(&keys).map(|k| (k, Arc::clone(&h.life))));
            let Some((key, holder)) = contended else {
                if !keys.is_empty() {
                    held.push(Holder {
                        life: Arc::clone(life),
                        keys: keys.into_boxed_slice(),
                        group,
                    });
                }
                return Ok(());
            };
            let path = paths
                .iter()
                .find(|p| self.key(p) == key)
                .copied()
                .unwrap_or_default();
            let now = Instant::now();
            let silent = holder.silent_for(now);
            if silent < takeover_after && !holder.was_taken_over() {
                return Err(Busy {
                    path: path.to_string(),
                    silent,
                    releasing: false,
                });
            }
            if now >= deadline {
                return Err(Busy {
                    path: path.to_string(),
                    silent,
                    releasing: true,
                });
            }
            if !holder.was_taken_over() {
                tracing::warn!(
                    path,
                    silent_s = silent.as_secs_f64().round(),
                    "taking the destination over from a session whose sender is silent"
                );
                holder.take_over();
            }
            held = self
                .released
                .wait_timeout(held, (deadline - now).min(Duration::from_secs(1)))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Lets go of whatever `life` holds.
    pub(crate) fn release(&self, life: &Arc<Life>) {
        self.lock().retain(|h| !Arc::ptr_eq(&h.life, life));
        self.released.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A Life on a real (loopback) control connection; the peer end is
    /// returned so the test can see it shut down.
    fn life(now: Instant) -> (Arc<Life>, Conn) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (Arc::new(Life::new(s.into(), now)), c.into())
    }

    const TAKEOVER: Duration = Duration::from_secs(15);

    #[test]
    fn a_live_holder_keeps_its_files() {
        let c = Claims::default();
        let now = Instant::now();
        let (a, _pa) = life(now);
        let (b, _pb) = life(now);
        c.claim(&["x", "y"], &a, TAKEOVER).unwrap();
        let busy = c.claim(&["z", "y"], &b, TAKEOVER).unwrap_err();
        assert_eq!(busy.path, "y");
        assert!(!busy.releasing);
        assert!(busy.message().contains("being written by another session"));
        assert!(!a.was_taken_over());
        c.release(&a);
        c.claim(&["z", "y"], &b, TAKEOVER)
            .expect("free once released");
    }

    // Found by bench/scaleout: a lane running two sessions at once on one
    // receiver, each writing a piece of the same file, was refused as busy.
    #[test]
    fn sessions_of_one_transfer_over_several_pairs_share_their_files_and_no_one_else() {
        let c = Claims::default();
        let now = Instant::now();
        let (a, _pa) = life(now);
        let (b, _pb) = life(now);
        let (other, _po) = life(now);
        let (plain, _pp) = life(now);
        c.claim_in(&["f"], &a, TAKEOVER, Some(7)).unwrap();
        c.claim_in(&["f"], &b, TAKEOVER, Some(7))
            .expect("same transfer");
        assert!(c.claim_in(&["f"], &other, TAKEOVER, Some(8)).is_err());
        assert!(c.claim(&["f"], &plain, TAKEOVER).is_err());
        // Nor does a piece session take a file a plain session writes.
        c.release(&a);
        c.release(&b);
        c.claim(&["f"], &plain, TAKEOVER).unwrap();
        assert!(c.claim_in(&["f"], &a, TAKEOVER, Some(7)).is_err());
    }

    #[test]
    fn a_silent_holder_is_ended_and_its_files_taken_once_released() {
        let c = Arc::new(Claims::default());
        let long_ago = Instant::now() - Duration::from_secs(60);
        let (old, mut old_peer) = life(long_ago);
        c.claim(&["f"], &old, TAKEOVER).unwrap();
        // The old session ends as its control thread would: once woken,
        // it releases what it held.
        let releaser = {
            let (c, old) = (Arc::clone(&c), Arc::clone(&old));
            std::thread::spawn(move || {
                let mut buf = [0u8; 1];
                use std::io::Read;
                // EOF here: the takeover shut the old control connection.
                assert_eq!(old_peer.read(&mut buf).unwrap(), 0);
                c.release(&old);
            })
        };
        let (new, _pn) = life(Instant::now());
        c.claim(&["f"], &new, TAKEOVER).expect("taken over");
        assert!(old.was_taken_over());
        releaser.join().unwrap();
        // The late release of the old session does not free the new claim.
        c.release(&old);
        let (third, _pt) = life(Instant::now());
        assert!(c.claim(&["f"], &third, TAKEOVER).is_err());
    }

    #[test]
    fn silence_is_measured_from_the_last_time_the_sender_was_heard() {
        let t0 = Instant::now();
        let (l, _p) = life(t0);
        l.heard(t0 + Duration::from_secs(20));
        assert_eq!(
            l.silent_for(t0 + Duration::from_secs(26)),
            Duration::from_secs(6)
        );
        l.heard(t0 + Duration::from_secs(10));
        assert_eq!(
            l.silent_for(t0 + Duration::from_secs(26)),
            Duration::from_secs(6),
            "an older report does not make it look silent"
        );
    }
}
