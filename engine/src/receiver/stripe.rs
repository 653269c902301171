//! A receiver's part in a transfer over several pairs (`Frame::Stripe`):
//! the receivers share one file system, each writes the pieces it is sent
//! into the temporary file they all share, and one of them publishes each
//! file once the coordinator has every piece of it.
//!
//! Sharing is checked, not assumed: the first session of the transfer
//! creates a marker in the root, named for the transfer, and every other
//! session (writing or publishing) must find it there. A receiver whose
//! "shared" root is a private disk finds no marker and refuses, so its
//! pieces never land in a file that another disk holds the rest of.
//!
//! A transfer whose sender was killed (or failed over: the new attempt
//! marks anew) leaves its marker behind. Every session of a live
//! transfer touches its marker, so one untouched for `STALE_MARKER` is
//! such a leftover, and a receiver that creates a marker removes those
//! it finds (looking at most once every `SWEEP_EVERY`).
#![forbid(unsafe_code)]

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use rustix::fs::{AtFlags, OFlags, Timespec, Timestamps};
use rustix::io::Errno;

use crate::fsroot::{Root, STRIPE_SUFFIX};
use crate::wire::{Stripe, StripeRole};

/// A marker untouched this long is a leftover of a transfer that ended
/// without removing it: far longer than any live transfer goes without a
/// session (a lost lane's fence is at most a day, `UNTIL_ANSWERED`), and
/// than any clock skew between the hosts and the file server.
const STALE_MARKER: Duration = Duration::from_secs(7 * 24 * 3600);
/// How often one process looks for leftovers, at most, and how many of
/// the root's entries it looks at: a root may hold millions.
const SWEEP_EVERY: Duration = Duration::from_secs(3600);
const SWEEP_ENTRIES: usize = 100_000;
static LAST_SWEEP: Mutex<Option<Instant>> = Mutex::new(None);

/// The marker's name in the root, for transfer `group`.
pub(crate) fn marker_name(group: u64) -> String {
    format!(".{group:016x}{STRIPE_SUFFIX}")
}

/// Creates, checks or removes the marker as `stripe`'s role asks; the
/// error says why the session cannot go on.
pub(crate) fn check_marker(root: &Root, stripe: &Stripe) -> Result<(), String> {
    let top = root.dir("").map_err(|e| format!("opening the root: {e}"))?;
    let name = marker_name(stripe.group);
    let content = stripe.group.to_le_bytes();
    match stripe.role {
        StripeRole::Mark => {
            let mut f = Root::open_in(&top, &name, OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC)
                .map_err(|e| format!("creating the shared-storage marker {name}: {e}"))?;
            f.write_all(&content)
                .and_then(|()| f.sync_all())
                .map_err(|e| format!("writing the shared-storage marker {name}: {e}"))?;
            // Ages are measured on the file server's clock: the marker
            // just written says what time it is there.
            let now = f.metadata().and_then(|m| m.modified());
            if let (Ok(now), true) = (now, sweep_due(&LAST_SWEEP, Instant::now())) {
                // Beside the session: a root of many entries on a network
                // file system may take a while to list.
                if let Ok(top) = top.try_clone() {
                    let sweep = std::thread::Builder::new().name("marker-sweep".into());
                    let _ = sweep.spawn(move || sweep_stale(&top, now));
                }
            }
            Ok(())
        }
        StripeRole::Write | StripeRole::Publish => {
            // Touched, so that it is never taken for a leftover; a
            // failure here is checked by the read below.
            let now = Timespec {
                tv_sec: 0,
                tv_nsec: rustix::fs::UTIME_NOW,
            };
            let times = Timestamps {
                last_access: now,
                last_modification: now,
            };
            let _ = rustix::fs::utimensat(&top, &name, &times, AtFlags::SYMLINK_NOFOLLOW);
            let mut found = Vec::new();
            let read = Root::open_in(&top, &name, OFlags::RDONLY)
                .map_err(std::io::Error::from)
                .and_then(|f| f.take(64).read_to_end(&mut found));
            match read {
                Ok(_) if found == content => Ok(()),
                Ok(_) => Err(format!(
                    "the shared-storage marker {name} in {} does not name this transfer",
                    root.path().display()
                )),
                Err(e) => Err(format!(
                    "{} is not the storage the other receivers of this transfer write to: \
                     the marker {name} that the first of them created is not here ({e}). \
                     A transfer over several pairs needs a root that every agent of the pool \
                     mounts as one file system",
                    root.path().display()
                )),
            }
        }
        StripeRole::Unmark => match rustix::fs::unlinkat(&top, &name, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(e) => Err(format!("removing the shared-storage marker {name}: {e}")),
        },
    }
}

/// Whether this process should look for leftover markers now, having
/// last looked at `last`.
fn sweep_due(last: &Mutex<Option<Instant>>, now: Instant) -> bool {
    let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
    if last.is_some_and(|t| now.duration_since(t) < SWEEP_EVERY) {
        return false;
    }
    *last = Some(now);
    true
}

/// Whether `name` is a marker's (`marker_name`).
fn is_marker(name: &str) -> bool {
    name.strip_prefix('.')
        .and_then(|n| n.strip_suffix(STRIPE_SUFFIX))
        .is_some_and(|hex| hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Removes the markers in the root (`top`) untouched since
/// `STALE_MARKER` before `now`; says how many. Best effort: a marker it
/// cannot read or remove stays.
fn sweep_stale(top: &OwnedFd, now: SystemTime) -> usize {
    let Ok(dir) = Root::open_in(top, ".", OFlags::RDONLY | OFlags::DIRECTORY) else {
        return 0;
    };
    let Ok(entries) = rustix::fs::Dir::read_from(&dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.take(SWEEP_ENTRIES).flatten() {
        let Ok(name) = entry.file_name().to_str() else {
            continue;
        };
        if !is_marker(name) {
            continue;
        }
        let Ok(st) = rustix::fs::statat(top, name, AtFlags::SYMLINK_NOFOLLOW) else {
            continue;
        };
        let touched =
            SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(st.st_mtime).unwrap_or(0));
        let stale = now
            .duration_since(touched)
            .is_ok_and(|age| age >= STALE_MARKER);
        let regular = rustix::fs::FileType::from_raw_mode(st.st_mode).is_file();
        if stale && regular && rustix::fs::unlinkat(top, name, AtFlags::empty()).is_ok() {
            tracing::info!(
                marker = name,
                "removed a shared-storage marker a transfer left behind"
            );
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stripe(group: u64, role: StripeRole) -> Stripe {
        Stripe {
            group,
            role,
            pieces: Vec::new(),
        }
    }

    #[test]
    fn a_root_without_the_first_receivers_marker_is_refused_as_not_shared() {
        let shared = tempfile::tempdir().unwrap();
        let private = tempfile::tempdir().unwrap();
        let a = Root::open(shared.path()).unwrap();
        let b = Root::open(private.path()).unwrap();
        check_marker(&a, &stripe(7, StripeRole::Mark)).unwrap();
        check_marker(&a, &stripe(7, StripeRole::Write)).unwrap();
        check_marker(&a, &stripe(7, StripeRole::Publish)).unwrap();
        let err = check_marker(&b, &stripe(7, StripeRole::Write)).unwrap_err();
        assert!(err.contains("not the storage the other receivers"), "{err}");
        // Another transfer's marker does not stand for this one's.
        let err = check_marker(&a, &stripe(8, StripeRole::Publish)).unwrap_err();
        assert!(err.contains("not the storage"), "{err}");
        check_marker(&a, &stripe(7, StripeRole::Unmark)).unwrap();
        assert!(check_marker(&a, &stripe(7, StripeRole::Write)).is_err());
        // Removing it twice is no error: a retried last session does.
        check_marker(&a, &stripe(7, StripeRole::Unmark)).unwrap();
    }

    /// Sets `name`'s modification time `ago` before now.
    fn age(dir: &std::path::Path, name: &str, ago: Duration) {
        let t = SystemTime::now() - ago;
        let f = std::fs::File::options()
            .write(true)
            .open(dir.join(name))
            .unwrap();
        f.set_modified(t).unwrap();
    }

    // Found in review: a sender killed mid-transfer, or failed over to a
    // new attempt (which marks anew), left its marker in the root for
    // ever.
    #[test]
    fn markers_a_transfer_left_behind_are_removed_and_live_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::open(dir.path()).unwrap();
        // Written here rather than marked: a Mark may start a sweep of its
        // own, which would race this test's.
        for group in [1, 2, 3] {
            std::fs::write(dir.path().join(marker_name(group)), group.to_le_bytes()).unwrap();
        }
        let old = STALE_MARKER + Duration::from_secs(3600);
        age(dir.path(), &marker_name(1), old);
        age(dir.path(), &marker_name(2), old);
        // Transfer 2 still runs: its next session touches its marker.
        check_marker(&root, &stripe(2, StripeRole::Write)).unwrap();
        // Not a marker's name, however old: left alone.
        std::fs::write(dir.path().join(".notes.wirerate-stripe"), b"x").unwrap();
        age(dir.path(), ".notes.wirerate-stripe", old);
        let top = root.dir("").unwrap();
        assert_eq!(sweep_stale(&top, SystemTime::now()), 1);
        assert!(!dir.path().join(marker_name(1)).exists());
        for name in [
            marker_name(2),
            marker_name(3),
            ".notes.wirerate-stripe".into(),
        ] {
            assert!(dir.path().join(&name).exists(), "{name}");
        }
        // Looked for at most once an hour by one process.
        let last = Mutex::new(None);
        let t = Instant::now();
        assert!(sweep_due(&last, t));
        assert!(!sweep_due(&last, t + Duration::from_secs(60)));
        assert!(sweep_due(&last, t + SWEEP_EVERY));
    }
}
