//! The directories this receiver's sessions made: only those take a
//! sender's owner and attributes (`metadata`), so that a sender cannot
//! change a shared parent's or another transfer's, while a session that
//! retries after the one that made a directory failed still gives it
//! what the send keeps.

use std::collections::HashSet;
use std::sync::Mutex;

use crate::fsroot::Root;

/// Most directories remembered, and most bytes of their paths: past
/// either, a directory made now still takes what the send keeps, but a
/// retry no longer knows it was made here.
const MOST: usize = 1 << 20;
const MOST_BYTES: usize = 64 << 20;

/// Directories sessions of this receiver made (or are about to make).
#[derive(Default)]
pub(crate) struct MadeDirs {
    inner: Mutex<(HashSet<String>, usize)>,
}

impl MadeDirs {
    /// Whether the directory `rel` beneath `root` is one a session here
    /// made, or is about to make (nothing is there yet: it is recorded).
    pub(crate) fn made(&self, root: &Root, rel: &str) -> bool {
        let mut inner = super::lock(&self.inner);
        let (set, bytes) = &mut *inner;
        if set.contains(rel) {
            return true;
        }
        if root.stat(rel).is_some() {
            return false;
        }
        if set.len() < MOST && *bytes + rel.len() <= MOST_BYTES {
            *bytes += rel.len();
            set.insert(rel.to_owned());
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_made_here_stays_made_and_one_already_there_never_is() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("old")).unwrap();
        let root = Root::open(t.path()).unwrap();
        let made = MadeDirs::default();
        assert!(!made.made(&root, "old"));
        assert!(made.made(&root, "new"));
        // Made by that session, which then failed: a retry still owns it.
        std::fs::create_dir(t.path().join("new")).unwrap();
        assert!(made.made(&root, "new"));
        assert!(!made.made(&root, "old"));
    }
}
