//! The send filters (`filter::Filters`) compiled: which entries the
//! listing of a source takes. Globs go to globset, which sorts them into
//! hash sets (literal names, extensions), Aho-Corasick automata and one
//! regex set, so that a path is matched in time linear in its length
//! whatever the number of patterns.

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};

use crate::error::{Error, Result};
use crate::filter::{Filters, normalized, truncated};

/// The compiled filters of one send.
#[derive(Debug, Clone)]
pub struct Select {
    filters: Filters,
    /// Files some include matches are taken; `None`: every file.
    include: Option<GlobSet>,
    /// Files and directories left out.
    exclude: GlobSet,
    /// Directories left out (the patterns that end in `/`).
    exclude_dirs: GlobSet,
    /// Seconds since the epoch that ages are measured from.
    now: i64,
}

/// A glob of `pattern` (normalized), as the send matches it.
fn glob(pattern: &str, normalized: &str) -> Result<globset::Glob> {
    GlobBuilder::new(normalized)
        .literal_separator(true)
        .backslash_escape(true)
        .build()
        .map_err(|e| {
            Error::Config(format!(
                "filter pattern {:?}: {}",
                truncated(pattern),
                e.kind()
            ))
        })
}

/// A built set, or why the patterns cannot be used together.
fn built(set: GlobSetBuilder) -> Result<GlobSet> {
    set.build()
        .map_err(|e| Error::Config(format!("the filter patterns cannot be used together: {e}")))
}

impl Select {
    /// Takes everything.
    pub fn all() -> Self {
        Self::new(&Filters::default(), 0).expect("no pattern to refuse")
    }

    /// `filters` compiled, ages measured from `now` (seconds since the
    /// epoch); refused, saying which pattern and why, where they cannot be.
    pub fn new(filters: &Filters, now: i64) -> Result<Self> {
        filters.check().map_err(|e| Error::Config(e.0))?;
        // An include of a directory takes every file beneath it.
        let mut include = GlobSetBuilder::new();
        for pattern in &filters.include {
            let (p, dir_only) = normalized(pattern).map_err(|e| Error::Config(e.0))?;
            let p = if dir_only { format!("{p}/**") } else { p };
            include.add(glob(pattern, &p)?);
        }
        // Excludes of files and directories, and of directories alone.
        let (mut exclude, mut exclude_dirs) = (GlobSetBuilder::new(), GlobSetBuilder::new());
        for pattern in &filters.exclude {
            let (p, dir_only) = normalized(pattern).map_err(|e| Error::Config(e.0))?;
            let set = if dir_only {
                &mut exclude_dirs
            } else {
                &mut exclude
            };
            set.add(glob(pattern, &p)?);
        }
        Ok(Self {
            filters: filters.clone(),
            include: (!filters.include.is_empty())
                .then(|| built(include))
                .transpose()?,
            exclude: built(exclude)?,
            exclude_dirs: built(exclude_dirs)?,
            now,
        })
    }

    /// Whether anything is filtered at all.
    pub fn active(&self) -> bool {
        !self.filters.is_empty()
    }

    /// The filters, for messages.
    pub fn filters(&self) -> &Filters {
        &self.filters
    }

    /// Whether the directory at `rel` (beneath the source) is listed.
    pub fn takes_dir(&self, rel: &str) -> bool {
        !self.exclude.is_match(rel) && !self.exclude_dirs.is_match(rel)
    }

    /// Whether an include matches the file at `rel` (or none is given),
    /// whatever the excludes and bounds make of it.
    pub fn included(&self, rel: &str) -> bool {
        self.include.as_ref().is_none_or(|s| s.is_match(rel))
    }

    /// Whether a mirror leaves the destination's entry at `rel` (a
    /// directory when `dir`) alone whatever the source holds, because the
    /// filters' names would not take it or a directory above it: what a
    /// send does not take, its mirror does not delete (rsync's and
    /// rclone's rule). Sizes and ages are the source's, so only names
    /// count here.
    pub fn leaves_alone(&self, rel: &str, dir: bool) -> bool {
        let mut at = rel;
        while let Some((parent, _)) = at.rsplit_once('/') {
            if !self.takes_dir(parent) {
                return true;
            }
            at = parent;
        }
        match dir {
            true => !self.takes_dir(rel),
            false => self.exclude.is_match(rel) || !self.included(rel),
        }
    }

    /// Whether the file at `rel`, of `size` bytes and modified at
    /// `mtime` (seconds since the epoch), is sent.
    pub fn takes_file(&self, rel: &str, size: u64, mtime: i64) -> bool {
        !self.exclude.is_match(rel)
            && self.included(rel)
            && self.filters.in_bounds(size, mtime, self.now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn select(include: &[&str], exclude: &[&str]) -> Select {
        let owned = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
        Select::new(
            &Filters {
                include: owned(include),
                exclude: owned(exclude),
                ..Filters::default()
            },
            0,
        )
        .unwrap()
    }

    #[test]
    fn names_match_at_any_depth_paths_from_the_root_and_stars_stay_in_a_name() {
        let s = select(&["*.h5", "raw/*.fits", "/top.txt"], &[]);
        for (path, taken) in [
            ("a.h5", true),
            ("deep/er/a.h5", true),
            ("raw/x.fits", true),
            ("raw/sub/x.fits", false),
            ("other/raw/x.fits", false),
            ("top.txt", true),
            ("sub/top.txt", false),
            ("a.h5.tmp", false),
        ] {
            assert_eq!(s.takes_file(path, 1, 0), taken, "{path}");
        }
        let s = select(&["raw/**/*.fits"], &[]);
        assert!(s.takes_file("raw/x.fits", 1, 0));
        assert!(s.takes_file("raw/a/b/x.fits", 1, 0));
    }

    #[test]
    fn excludes_win_and_a_trailing_slash_names_directories_only() {
        let s = select(&["*.log", "keep/"], &["debug*.log", "scratch/", "*.tmp"]);
        assert!(s.takes_file("run/app.log", 1, 0));
        assert!(!s.takes_file("run/debug-1.log", 1, 0));
        assert!(
            s.takes_file("keep/any/thing.bin", 1, 0),
            "included directory"
        );
        assert!(!s.takes_file("keep/x.tmp", 1, 0));
        assert!(!s.takes_dir("a/scratch"));
        assert!(s.takes_dir("a/scratch.d"));
        // `scratch/` names directories only: a file of that name stays.
        let only_dirs = select(&[], &["scratch/"]);
        assert!(only_dirs.takes_file("scratch", 1, 0));
        // An exclude without a slash leaves a directory out too.
        assert!(!select(&[], &["*.tmp"]).takes_dir("x/y.tmp"));
    }

    #[test]
    fn a_bad_pattern_is_refused_naming_it() {
        let err = Select::new(
            &Filters {
                exclude: vec!["[unclosed".into()],
                ..Filters::default()
            },
            0,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("\"[unclosed\""), "{err}");
    }

    // rclone#9014: a long exclude list made listing hang. Here 100,000
    // patterns of the shapes users write (names and extensions, looked up
    // in hash sets, and the 1,000 with other wildcards a send takes)
    // compile once and match 80,000 paths: it would not finish otherwise.
    #[test]
    fn a_hundred_thousand_patterns_compile_and_match() {
        let mut exclude: Vec<String> = (0..60_000).map(|i| format!("frame-{i}.h5")).collect();
        exclude.extend((0..39_000).map(|i| format!("*.x{i}")));
        exclude.extend((0..1_000).map(|i| format!("runs/r{i}/*.tmp")));
        let s = Select::new(
            &Filters {
                exclude,
                ..Filters::default()
            },
            0,
        )
        .unwrap();
        let mut taken = 0;
        for i in 0..20_000 {
            for path in [
                format!("d/frame-{i}.h5"),
                format!("d/f{i}.x{i}"),
                format!("runs/r{i}/a.tmp"),
                format!("d/kept-{i}.h5"),
            ] {
                taken += usize::from(s.takes_file(&path, 1, 0));
            }
        }
        // The kept files, and the runs' past the 1,000 excluded.
        assert_eq!(taken, 20_000 + 19_000);
    }
}
