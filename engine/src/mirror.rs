//! A mirror's deletes, decided with no I/O: which entries of a
//! destination directory's listing the source no longer has, whether the
//! guard lets them go, and in what order.
//!
//! The sender decides (it holds the source, its filters and the guard);
//! the receiver lists, and removes only entries of its own listing that
//! are still the ones it listed (`receiver::mirror`). Deletes run only
//! after every file of the send landed, and not at all after any error,
//! as rclone has it: a mirror never trades a failed copy for a deleted
//! original.

use std::collections::HashSet;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::tuning::{Bound, Unit};
use crate::wire::EntryKind;

/// The most files and directories one mirror deletes unless told
/// otherwise; above it nothing is deleted. A tree emptied by accident (an
/// unmounted source, a wrong path) is refused long before it costs much.
pub const MAX_DELETE: Bound = Bound {
    field: "maxDelete",
    flag: "--max-delete",
    min: 0,
    max: crate::wire::MAX_ENTRIES as u64,
    step: 1,
    default: 1000,
    unit: Unit::Count,
};

/// How much a mirror may delete; above either bound it deletes nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Guard {
    /// Delete nothing if more than this many files and directories
    /// would go.
    #[serde(default = "max_delete")]
    #[cfg_attr(feature = "schema", schemars(range(max = MAX_DELETE.max)))]
    pub max_delete: u64,
    /// Delete nothing if more than this many bytes of files would go;
    /// unset: no bound but `maxDelete`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_delete_bytes: Option<u64>,
}

fn max_delete() -> u64 {
    MAX_DELETE.default
}

impl Default for Guard {
    fn default() -> Self {
        Self {
            max_delete: MAX_DELETE.default,
            max_delete_bytes: None,
        }
    }
}

/// One entry of the destination's listing, as the receiver sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// Relative to the mirrored directory.
    pub path: String,
    /// A directory, or anything else (a regular file, a symlink, a
    /// device): all of those go with one unlink.
    pub kind: EntryKind,
    /// Bytes, for a regular file; 0 otherwise.
    pub size: u64,
}

/// What a mirror deletes: listing ids in an order that empties each
/// directory before it goes, with what they add up to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Deletes {
    /// Ids into the listing, deepest first.
    pub ids: Vec<u32>,
    /// How many of them are files (anything but a directory).
    pub files: u64,
    /// How many are directories.
    pub dirs: u64,
    /// Bytes of the files.
    pub bytes: u64,
}

impl Deletes {
    /// Entries in all.
    pub fn count(&self) -> u64 {
        self.files + self.dirs
    }
}

/// Why a mirror deletes nothing: each says what was found and what to
/// change. Final: the same source and destination give the same answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// More entries than `Guard::max_delete`.
    TooMany {
        /// What the mirror would delete.
        count: u64,
        /// The guard.
        max: u64,
    },
    /// More bytes than `Guard::max_delete_bytes`.
    TooManyBytes {
        /// What the mirror would delete.
        bytes: u64,
        /// The guard.
        max: u64,
    },
    /// The source holds no file at all, and the destination does: an
    /// unmounted or emptied source would otherwise wipe its replica.
    EmptySource {
        /// Files the mirror would delete.
        files: u64,
    },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::TooMany { count, max } => write!(
                f,
                "the mirror would delete {count} entries at the destination, more than its \
                 limit of {max} ({}, {}): nothing was deleted; check the source, or raise the limit",
                MAX_DELETE.field, MAX_DELETE.flag
            ),
            Self::TooManyBytes { bytes, max } => write!(
                f,
                "the mirror would delete {} at the destination, more than its limit of {} \
                 (maxDeleteBytes, --max-delete-bytes): nothing was deleted; check the source, or \
                 raise the limit",
                crate::units::fmt_bytes(bytes),
                crate::units::fmt_bytes(max)
            ),
            Self::EmptySource { files } => write!(
                f,
                "the source holds no file, and the mirror would delete all {files} file(s) of the \
                 destination: nothing was deleted (is the source mounted?); send without a mirror \
                 to keep them, or delete them by hand"
            ),
        }
    }
}

/// The entries of `listing` a mirror deletes: those not `kept` (the
/// shell's verdict for each, in order: the source has it, or its filters
/// leave it alone), and that hold nothing kept at any depth. A directory
/// goes after everything beneath it.
pub fn plan(listing: &[Listed], kept: &[bool]) -> Deletes {
    // Every directory above a kept entry stays, or its removal would fail.
    let mut holding: HashSet<&str> = HashSet::new();
    for (e, _) in listing.iter().zip(kept).filter(|(_, k)| **k) {
        let mut at = e.path.as_str();
        while let Some((parent, _)) = at.rsplit_once('/') {
            if !holding.insert(parent) {
                break;
            }
            at = parent;
        }
    }
    let mut out = Deletes::default();
    let mut ids: Vec<(usize, u32)> = Vec::new();
    for (id, (e, k)) in listing.iter().zip(kept).enumerate() {
        if *k || (e.kind == EntryKind::Dir && holding.contains(e.path.as_str())) {
            continue;
        }
        match e.kind {
            EntryKind::Dir => out.dirs += 1,
            EntryKind::File => {
                out.files += 1;
                out.bytes = out.bytes.saturating_add(e.size);
            }
        }
        ids.push((e.path.matches('/').count(), id as u32));
    }
    // Deepest first; within a depth, as listed.
    ids.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    out.ids = ids.into_iter().map(|(_, id)| id).collect();
    out
}

/// Whether `guard` lets `deletes` go, for a source of `source_files`
/// files.
pub fn check(deletes: &Deletes, guard: &Guard, source_files: usize) -> Result<(), Refusal> {
    if source_files == 0 && deletes.files > 0 {
        return Err(Refusal::EmptySource {
            files: deletes.files,
        });
    }
    if deletes.count() > guard.max_delete {
        return Err(Refusal::TooMany {
            count: deletes.count(),
            max: guard.max_delete,
        });
    }
    match guard.max_delete_bytes {
        Some(max) if deletes.bytes > max => Err(Refusal::TooManyBytes {
            bytes: deletes.bytes,
            max,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(path: &str, kind: EntryKind, size: u64) -> Listed {
        Listed {
            path: path.into(),
            kind,
            size,
        }
    }

    fn listing() -> Vec<Listed> {
        use EntryKind::{Dir, File};
        vec![
            listed("keep.txt", File, 1),        // 0: the source has it
            listed("old", Dir, 0),              // 1: gone from the source
            listed("old/a.bin", File, 10),      // 2
            listed("old/deep", Dir, 0),         // 3
            listed("old/deep/b.bin", File, 5),  // 4
            listed("mixed", Dir, 0),            // 5: holds something kept
            listed("mixed/stale", File, 7),     // 6
            listed("mixed/notes.tmp", File, 3), // 7: excluded: kept
            listed("gone.txt", File, 2),        // 8
        ]
    }

    fn kept(listing: &[Listed]) -> Vec<bool> {
        listing
            .iter()
            .map(|e| e.path == "keep.txt" || e.path.ends_with(".tmp"))
            .collect()
    }

    #[test]
    fn extras_go_deepest_first_and_directories_that_hold_a_kept_entry_stay() {
        let d = plan(&listing(), &kept(&listing()));
        assert_eq!(d.ids, vec![4, 2, 3, 6, 1, 8]);
        assert_eq!((d.files, d.dirs, d.bytes), (4, 2, 24));
        // Every directory comes after what is beneath it.
        let l = listing();
        for (i, id) in d.ids.iter().enumerate() {
            let p = &l[*id as usize].path;
            for later in &d.ids[i + 1..] {
                assert!(!l[*later as usize].path.starts_with(&format!("{p}/")));
            }
        }
        // Nothing to delete when everything is kept.
        assert_eq!(plan(&listing(), &[true; 9]), Deletes::default());
    }

    #[test]
    fn the_guard_refuses_too_many_too_large_and_an_empty_source() {
        let d = plan(&listing(), &kept(&listing()));
        let guard = Guard::default();
        assert_eq!(check(&d, &guard, 3), Ok(()));
        let few = Guard {
            max_delete: 5,
            ..guard
        };
        assert_eq!(
            check(&d, &few, 3),
            Err(Refusal::TooMany { count: 6, max: 5 })
        );
        let small = Guard {
            max_delete_bytes: Some(23),
            ..guard
        };
        assert_eq!(
            check(&d, &small, 3),
            Err(Refusal::TooManyBytes { bytes: 24, max: 23 })
        );
        assert_eq!(check(&d, &guard, 0), Err(Refusal::EmptySource { files: 4 }));
        // An empty source with nothing to delete is no refusal.
        assert_eq!(check(&Deletes::default(), &guard, 0), Ok(()));
        for r in [
            check(&d, &few, 3),
            check(&d, &small, 3),
            check(&d, &guard, 0),
        ] {
            let m = r.unwrap_err().to_string();
            assert!(m.contains("nothing was deleted"), "{m}");
        }
    }
}
