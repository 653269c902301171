//! Which source files a send takes: include and exclude globs, and size
//! and age bounds, as the CLI (`--include`, `--exclude`, `--min-size`, ...)
//! and a Transfer's `spec.filters` give them. The one definition of the
//! fields and their bounds; the sender compiles the globs
//! (`sender::select`) and applies them as it lists the source.
//!
//! What a pattern means:
//! - it matches a path relative to the source directory, `/` between
//!   names (`raw/run1/frame.h5`);
//! - `*` and `?` never cross a `/`; `**` does (`raw/**/*.h5`);
//! - a pattern with no `/` matches a name at any depth (`*.log`), one
//!   with a `/` the whole relative path (a leading `/` is dropped);
//! - a pattern ending in `/` matches directories only (`scratch/`).
//!
//! What is taken: a file that no exclude matches, that some include
//! matches (when any is given), and that is within the size and age
//! bounds. A directory an exclude matches is not listed at all.
//! Directories left with no file taken beneath them are not sent.

use serde::{Deserialize, Serialize};

/// Most patterns (includes and excludes together) one send may carry.
pub const MAX_PATTERNS: usize = 100_000;
/// Longest pattern, in bytes.
pub const MAX_PATTERN_LEN: usize = 4096;

/// The filters of a send. Empty (the default) takes everything.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Filters {
    /// Globs of the files to take; none takes every file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(
        feature = "schema",
        schemars(length(max = MAX_PATTERNS), inner(length(max = MAX_PATTERN_LEN)))
    )]
    pub include: Vec<String>,
    /// Globs of the files and directories to leave out; they win over
    /// `include`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[cfg_attr(
        feature = "schema",
        schemars(length(max = MAX_PATTERNS), inner(length(max = MAX_PATTERN_LEN)))
    )]
    pub exclude: Vec<String>,
    /// Leave out files smaller than this many bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_size: Option<u64>,
    /// Leave out files larger than this many bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_size: Option<u64>,
    /// Leave out files modified less than this many seconds ago (files
    /// an instrument may still be writing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_age_seconds: Option<u64>,
    /// Leave out files modified more than this many seconds ago.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age_seconds: Option<u64>,
}

/// Why filters cannot be used, said to the user as it stands.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct FilterError(pub String);

impl Filters {
    /// Whether it takes everything.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// Refuses filters past the bounds, or that contradict themselves.
    pub fn check(&self) -> Result<(), FilterError> {
        let count = self.include.len() + self.exclude.len();
        if count > MAX_PATTERNS {
            return Err(FilterError(format!(
                "{count} include and exclude patterns, more than the {MAX_PATTERNS} a send takes; match directories rather than each file"
            )));
        }
        if let Some(p) = self
            .include
            .iter()
            .chain(&self.exclude)
            .find(|p| p.is_empty() || p.len() > MAX_PATTERN_LEN || p.contains('\0'))
        {
            return Err(FilterError(format!(
                "pattern {:?} is empty, longer than {MAX_PATTERN_LEN} bytes or holds a NUL",
                truncated(p)
            )));
        }
        if let (Some(lo), Some(hi)) = (self.min_size, self.max_size)
            && lo > hi
        {
            return Err(FilterError(format!(
                "minSize ({lo}) is above maxSize ({hi}): no file could be taken"
            )));
        }
        if let (Some(lo), Some(hi)) = (self.min_age_seconds, self.max_age_seconds)
            && lo > hi
        {
            return Err(FilterError(format!(
                "minAgeSeconds ({lo}) is above maxAgeSeconds ({hi}): no file could be taken"
            )));
        }
        Ok(())
    }

    /// Whether a file of `size` bytes, modified at `mtime` (seconds since
    /// the epoch), is within the size and age bounds at `now` (the same).
    pub fn in_bounds(&self, size: u64, mtime: i64, now: i64) -> bool {
        let age = now.saturating_sub(mtime).max(0) as u64;
        self.min_size.is_none_or(|lo| size >= lo)
            && self.max_size.is_none_or(|hi| size <= hi)
            && self.min_age_seconds.is_none_or(|lo| age >= lo)
            && self.max_age_seconds.is_none_or(|hi| age <= hi)
    }

    /// What the filters are, in a line, for messages.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if !self.include.is_empty() {
            parts.push(format!("{} include pattern(s)", self.include.len()));
        }
        if !self.exclude.is_empty() {
            parts.push(format!("{} exclude pattern(s)", self.exclude.len()));
        }
        let bound = |name: &str, v: Option<u64>| v.map(|v| format!("{name} {v}"));
        parts.extend(
            [
                bound("minSize", self.min_size),
                bound("maxSize", self.max_size),
                bound("minAgeSeconds", self.min_age_seconds),
                bound("maxAgeSeconds", self.max_age_seconds),
            ]
            .into_iter()
            .flatten(),
        );
        parts.join(", ")
    }
}

/// At most 80 characters of a pattern, for a message.
fn truncated(p: &str) -> String {
    p.chars().take(80).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_take_what_lies_between_them_inclusive() {
        let f = Filters {
            min_size: Some(10),
            max_size: Some(20),
            min_age_seconds: Some(60),
            max_age_seconds: Some(3600),
            ..Filters::default()
        };
        let now = 1_000_000;
        assert!(f.in_bounds(10, now - 60, now));
        assert!(f.in_bounds(20, now - 3600, now));
        assert!(!f.in_bounds(9, now - 100, now));
        assert!(!f.in_bounds(21, now - 100, now));
        assert!(!f.in_bounds(15, now - 59, now), "too fresh");
        assert!(!f.in_bounds(15, now - 3601, now), "too old");
        // A file from the future is of age 0.
        assert!(Filters::default().in_bounds(0, now + 5, now));
    }

    #[test]
    fn contradictions_and_excess_are_refused_saying_what() {
        let bad = |f: Filters| f.check().unwrap_err().0;
        assert!(
            bad(Filters {
                min_size: Some(2),
                max_size: Some(1),
                ..Filters::default()
            })
            .contains("minSize (2) is above maxSize (1)")
        );
        assert!(
            bad(Filters {
                min_age_seconds: Some(2),
                max_age_seconds: Some(1),
                ..Filters::default()
            })
            .contains("minAgeSeconds")
        );
        assert!(
            bad(Filters {
                exclude: vec![String::new()],
                ..Filters::default()
            })
            .contains("is empty")
        );
        let many = Filters {
            include: vec!["a".into(); MAX_PATTERNS + 1],
            ..Filters::default()
        };
        assert!(bad(many).contains("more than the 100000"));
        assert!(Filters::default().check().is_ok() && Filters::default().is_empty());
    }
}
