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
#![forbid(unsafe_code)]

use std::io::{Read, Write};

use rustix::fs::OFlags;
use rustix::io::Errno;

use crate::fsroot::{Root, STRIPE_SUFFIX};
use crate::wire::{Stripe, StripeRole};

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
                .map_err(|e| format!("writing the shared-storage marker {name}: {e}"))
        }
        StripeRole::Write | StripeRole::Publish => {
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
        StripeRole::Unmark => match rustix::fs::unlinkat(&top, &name, rustix::fs::AtFlags::empty())
        {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(e) => Err(format!("removing the shared-storage marker {name}: {e}")),
        },
    }
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
}
