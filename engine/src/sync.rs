//! Sync levels: whether the file found at a destination counts as the one
//! a send would write there, at a level (`SyncLevel`). I/O-free: the
//! receiver's planner looks, and this decides.

pub use crate::tuning::SyncLevel;

/// What the receiver found at a file's destination name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    /// A regular file (not a directory, symlink or device).
    pub regular: bool,
    /// Its size in bytes.
    pub size: u64,
    /// Its modification time: seconds and nanoseconds.
    pub mtime: (i64, u32),
    /// Its digest (`digest::file_digest` at the session's block size),
    /// read only where the level compares it and the sizes agree.
    pub digest: Option<u128>,
}

/// What the source says of a file: the level compares it with `Found`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wanted {
    /// Size in bytes.
    pub size: u64,
    /// Modification time: seconds and nanoseconds.
    pub mtime: (i64, u32),
    /// Digest, under `SyncLevel::Checksum`.
    pub digest: Option<u128>,
}

/// Whether `level` needs the found file's digest, given `found` and
/// what is wanted: only `Checksum`, and only for a regular file of the
/// same size (reading it is the cost of the level).
pub fn needs_digest(level: SyncLevel, found: Option<&Found>, wanted: &Wanted) -> bool {
    level == SyncLevel::Checksum
        && wanted.digest.is_some()
        && found.is_some_and(|f| f.regular && f.size == wanted.size)
}

/// Whether `found` (None: nothing there) counts as present, at `level`,
/// for the source file `wanted`. Only a regular file ever does: anything
/// else in its place is replaced, or refused, as without a level. Under
/// `Checksum`, a digest missing on either side is no match.
pub fn present(level: SyncLevel, found: Option<Found>, wanted: Wanted) -> bool {
    let Some(f) = found.filter(|f| f.regular) else {
        return false;
    };
    match level {
        SyncLevel::None => false,
        SyncLevel::Exists => true,
        SyncLevel::Size => f.size == wanted.size,
        SyncLevel::Mtime => f.size == wanted.size && f.mtime == wanted.mtime,
        SyncLevel::Checksum => {
            f.size == wanted.size && f.digest.is_some() && f.digest == wanted.digest
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_level_compares_what_it_names_and_only_regular_files() {
        let at = (1_700_000_000, 5);
        let same = Found {
            regular: true,
            size: 10,
            mtime: at,
            digest: Some(7),
        };
        let longer = Found { size: 11, ..same };
        let touched = Found {
            mtime: (at.0, 6),
            ..same
        };
        let changed = Found {
            digest: Some(8),
            ..same
        };
        let dir = Found {
            regular: false,
            ..same
        };
        let cases = [
            (SyncLevel::None, [false, false, false, false, false, false]),
            (SyncLevel::Exists, [true, true, true, true, false, false]),
            (SyncLevel::Size, [true, false, true, true, false, false]),
            (SyncLevel::Mtime, [true, false, false, true, false, false]),
            (
                SyncLevel::Checksum,
                [true, false, true, false, false, false],
            ),
        ];
        let wanted = Wanted {
            size: 10,
            mtime: at,
            digest: Some(7),
        };
        for (level, want) in cases {
            let got = [
                Some(same),
                Some(longer),
                Some(touched),
                Some(changed),
                Some(dir),
                None,
            ]
            .map(|f| present(level, f, wanted));
            assert_eq!(got, want, "{level}");
        }
        // A digest missing on either side is no match.
        let unread = Found {
            digest: None,
            ..same
        };
        assert!(!present(SyncLevel::Checksum, Some(unread), wanted));
        let unsent = Wanted {
            digest: None,
            ..wanted
        };
        assert!(!present(SyncLevel::Checksum, Some(same), unsent));
        assert!(needs_digest(SyncLevel::Checksum, Some(&same), &wanted));
        assert!(!needs_digest(SyncLevel::Checksum, Some(&longer), &wanted));
        assert!(!needs_digest(SyncLevel::Mtime, Some(&same), &wanted));
    }
}
