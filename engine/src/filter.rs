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
/// Most of them that are matched one by one: those with wildcards other
/// than a name's extension (`*.h5`) or a literal name or path, which the
/// matcher looks up in hash sets whatever their number. Each of these
/// costs a regex run per file that might match it.
pub const MAX_WILD_PATTERNS: usize = 1_000;
/// Longest pattern, in bytes.
pub const MAX_PATTERN_LEN: usize = 4096;
/// Longest age a bound takes: a century.
pub const MAX_AGE_SECONDS: u64 = 100 * 365 * 86400;

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
        let mut wild = 0;
        for p in self.include.iter().chain(&self.exclude) {
            let (glob, _) = normalized(p)?;
            wild += usize::from(!hashed(&glob));
        }
        if wild > MAX_WILD_PATTERNS {
            return Err(FilterError(format!(
                "{wild} patterns have wildcards beyond a name's extension (*.h5), more than the {MAX_WILD_PATTERNS} a send takes: each is matched on its own against every file; list names or extensions instead, or match a directory"
            )));
        }
        for age in [self.min_age_seconds, self.max_age_seconds]
            .into_iter()
            .flatten()
        {
            if age > MAX_AGE_SECONDS {
                return Err(FilterError(format!(
                    "an age of {age} s is more than a century ({MAX_AGE_SECONDS} s)"
                )));
            }
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
pub fn truncated(p: &str) -> String {
    p.chars().take(80).collect()
}

/// Pattern `pattern` as it is matched, and whether it names directories
/// only (a trailing `/`): a leading `./` or `/` anchors it to the source
/// directory, and a pattern with no `/` gets `**/` before it (a name at
/// any depth). Refused where it could never match what it seems to say:
/// empty, a `.` or `..` or empty part, a NUL, a negated class (`[!x]`,
/// which in a glob matches `/` too), or longer than `MAX_PATTERN_LEN`.
pub fn normalized(pattern: &str) -> Result<(String, bool), FilterError> {
    let refuse = |why: &str| {
        Err(FilterError(format!(
            "pattern {:?} {why}",
            truncated(pattern)
        )))
    };
    if pattern.len() > MAX_PATTERN_LEN || pattern.contains('\0') {
        return refuse(&format!(
            "is longer than {MAX_PATTERN_LEN} bytes or holds a NUL"
        ));
    }
    if pattern.contains("[!") || pattern.contains("[^") {
        return refuse(
            "has a negated class ([!...]), which would match across a /: name what to match instead",
        );
    }
    let dir_only = pattern.ends_with('/');
    let p = pattern.strip_suffix('/').unwrap_or(pattern);
    let anchored = p.strip_prefix("./").or_else(|| p.strip_prefix('/'));
    let p = anchored.unwrap_or(p);
    if p.is_empty()
        || p.split('/')
            .any(|part| part.is_empty() || part == "." || part == "..")
    {
        return refuse(
            "is empty, or has an empty, . or .. part: write the path from the source directory, as a/b/*.h5",
        );
    }
    let glob = match anchored.is_none() && !p.contains('/') {
        true => format!("**/{p}"),
        false => p.to_string(),
    };
    Ok((glob, dir_only))
}

/// Whether the matcher looks glob `p` (normalized) up in a hash set, not
/// in a regex: a literal name or path, `**` alone, or `**/*.ext` with a
/// plain extension. Conservative: anything else counts as wild.
pub fn hashed(p: &str) -> bool {
    const META: &[char] = &['*', '?', '[', ']', '{', '}', '\\'];
    let plain = |s: &str| !s.contains(META);
    let rest = p.strip_prefix("**/").unwrap_or(p);
    p == "**"
        || p == "**/**"
        || plain(rest)
        || (p.starts_with("**/")
            && rest
                .strip_prefix("*.")
                .is_some_and(|ext| plain(ext) && !ext.contains(['/', '.'])))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_are_anchored_or_not_as_written_and_classed_by_cost() {
        let n = |p: &str| normalized(p).unwrap();
        assert_eq!(n("*.h5"), ("**/*.h5".into(), false));
        assert_eq!(n("./secret.key"), ("secret.key".into(), false));
        assert_eq!(n("/top.txt"), ("top.txt".into(), false));
        assert_eq!(n("raw/*.h5"), ("raw/*.h5".into(), false));
        assert_eq!(n("scratch/"), ("**/scratch".into(), true));
        assert_eq!(n("**"), ("**/**".into(), false));
        for cheap in ["**/*.h5", "**/frame-1.h5", "raw/a.h5", "**"] {
            assert!(hashed(cheap), "{cheap}");
        }
        for costly in ["raw/*.h5", "**/run-*.h5", "**/*.tar.gz", "*.h5", "**/a?"] {
            assert!(!hashed(costly), "{costly}");
        }
    }

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
        let wild = Filters {
            exclude: (0..=MAX_WILD_PATTERNS)
                .map(|i| format!("run-{i}-*.h5"))
                .collect(),
            ..Filters::default()
        };
        assert!(bad(wild).contains("1001 patterns have wildcards"));
        for p in ["/", "./", "a//b", "a/../b", "./.", "x[!0-9]", "y[^a]"] {
            let f = Filters {
                exclude: vec![p.into()],
                ..Filters::default()
            };
            assert!(f.check().is_err(), "{p}");
        }
        assert!(Filters::default().check().is_ok() && Filters::default().is_empty());
    }
}
