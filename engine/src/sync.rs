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
}

/// Whether `found` (None: nothing there) counts as present, at `level`,
/// for a source file of `size` bytes modified at `mtime`. Only a regular
/// file ever does: anything else in its place is replaced, or refused, as
/// without a level.
pub fn present(level: SyncLevel, found: Option<Found>, size: u64, mtime: (i64, u32)) -> bool {
    let Some(f) = found.filter(|f| f.regular) else {
        return false;
    };
    match level {
        SyncLevel::None => false,
        SyncLevel::Exists => true,
        SyncLevel::Size => f.size == size,
        SyncLevel::Mtime => f.size == size && f.mtime == mtime,
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
        };
        let longer = Found { size: 11, ..same };
        let touched = Found {
            mtime: (at.0, 6),
            ..same
        };
        let dir = Found {
            regular: false,
            ..same
        };
        let cases = [
            (SyncLevel::None, [false, false, false, false, false]),
            (SyncLevel::Exists, [true, true, true, false, false]),
            (SyncLevel::Size, [true, false, true, false, false]),
            (SyncLevel::Mtime, [true, false, false, false, false]),
        ];
        for (level, want) in cases {
            let got = [Some(same), Some(longer), Some(touched), Some(dir), None]
                .map(|f| present(level, f, 10, at));
            assert_eq!(got, want, "{level}");
        }
    }
}
