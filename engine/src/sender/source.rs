//! What to send: one file, or a directory tree walked without following
//! symlinks, and what each entry looked like when it was listed.
//!
//! Symlink policy: the path named on the command line is resolved (the
//! user chose it, link or not); nothing inside a tree is ever followed.
//! Symlinks met while listing are reported and skipped, and every file is
//! later opened beneath the listed root with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS)`, so a file swapped for a symlink after the scan
//! (to `/etc/shadow`, say) fails to open instead of being sent.
//!
//! Change policy, as rsync and Globus have it: a file is sent only if it
//! is still the file that was listed (same device and inode) and has not
//! changed (size, mtime, ctime) from before its first read to after its
//! last. Otherwise it fails and is never published: both ends hash the
//! bytes that were sent, so digests alone cannot see a source that changed
//! under the reader.
#![forbid(unsafe_code)]

use std::fmt;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::digest::xxh3_64;
use rustix::fs::{AtFlags, Mode, OFlags};

use super::select::Select;
use crate::error::{Error, Result};
use crate::summary::Skipped;
use crate::wire::{EntryKind, MAX_ENTRIES, MAX_MANIFEST_BYTES, MAX_PATH};

/// What a file looked like: the identity and change marks compared before
/// its first read and after its last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// Device.
    pub dev: u64,
    /// Inode.
    pub ino: u64,
    /// Size in bytes.
    pub size: u64,
    /// Modification time, seconds and nanoseconds.
    pub mtime: (i64, i64),
    /// Status change time, seconds and nanoseconds.
    pub ctime: (i64, i64),
    /// Owner and group ids (sent where the send keeps owners; a change
    /// shows in `ctime`).
    pub owner: (u32, u32),
}

impl Stamp {
    /// The stamp of `m`.
    pub fn of(m: &std::fs::Metadata) -> Self {
        Self {
            dev: m.dev(),
            ino: m.ino(),
            size: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
            owner: (m.uid(), m.gid()),
        }
    }

    /// The stamp of `st`, as `fstat` gave it.
    pub fn of_stat(st: &rustix::fs::Stat) -> Self {
        Self {
            dev: st.st_dev,
            ino: st.st_ino,
            size: st.st_size.max(0) as u64,
            mtime: (st.st_mtime, st.st_mtime_nsec as i64),
            ctime: (st.st_ctime, st.st_ctime_nsec as i64),
            owner: (st.st_uid, st.st_gid),
        }
    }

    /// The modification time as a manifest carries it: nanoseconds within
    /// a second, whatever a file system reported.
    pub fn wire_mtime(&self) -> (i64, u32) {
        (self.mtime.0, self.mtime.1.clamp(0, 999_999_999) as u32)
    }

    /// The source version a receiver's checkpoint is tied to (size and
    /// mtime), so a stale checkpoint is not reused.
    pub fn fingerprint(&self) -> u64 {
        let mut b = [0u8; 24];
        b[..8].copy_from_slice(&self.size.to_le_bytes());
        b[8..16].copy_from_slice(&self.mtime.0.to_le_bytes());
        b[16..].copy_from_slice(&self.mtime.1.to_le_bytes());
        xxh3_64(&b)
    }

    /// How `now` differs from this stamp, if it does.
    #[must_use]
    pub fn change_to(&self, now: &Self) -> Option<SourceChange> {
        if (self.dev, self.ino) != (now.dev, now.ino) {
            Some(SourceChange::Replaced)
        } else if self.size != now.size {
            Some(SourceChange::Size {
                listed: self.size,
                now: now.size,
            })
        } else if self.mtime != now.mtime {
            Some(SourceChange::Modified)
        } else if self.ctime != now.ctime {
            Some(SourceChange::StatusChanged)
        } else {
            None
        }
    }
}

/// How a source file changed since it was listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceChange {
    /// Another file now has its name.
    Replaced,
    /// It grew or shrank.
    Size {
        /// Bytes when listed.
        listed: u64,
        /// Bytes now.
        now: u64,
    },
    /// Its contents were written (mtime moved).
    Modified,
    /// Its status changed (ctime moved: permissions, owner, links,
    /// attributes, or a write that kept its mtime).
    StatusChanged,
}

impl fmt::Display for SourceChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Replaced => f.write_str("it was replaced by another file after it was listed"),
            Self::Size { listed, now } => write!(
                f,
                "its size changed from {listed} to {now} bytes while it was being sent"
            ),
            Self::Modified => f.write_str("it was modified while it was being sent"),
            Self::StatusChanged => f.write_str(
                "its status (ctime) changed while it was being sent: it was written, \
                 or its permissions, owner, links or attributes changed",
            ),
        }
    }
}

/// One entry to send.
#[derive(Debug, Clone)]
pub struct SourceFile {
    /// Where it is read from, for messages.
    pub path: PathBuf,
    /// Where it is opened from: relative to the listed root's descriptor.
    pub rel: PathBuf,
    /// Destination path relative to the receiver's root.
    pub dest: String,
    /// File or directory.
    pub kind: EntryKind,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits.
    pub mode: u16,
    /// What it looked like when listed.
    pub stamp: Stamp,
}

/// The manifest and what was left out.
#[derive(Debug)]
pub struct SourceList {
    /// Entries to send, directories before their contents.
    pub files: Vec<SourceFile>,
    /// Entries not sent, with reasons.
    pub skipped: Vec<Skipped>,
    /// Files the send's filters left out (`filter`): not sent, not named.
    pub filtered: usize,
    /// Files that are hard links to a file listed before them: each is
    /// sent, and lands, as a file of its own.
    pub hard_links: usize,
    /// The directory every entry is opened beneath (the source directory,
    /// or a single file's parent).
    pub base: Arc<OwnedFd>,
    /// Its path, resolved, as this host sees it (a relay opens the same
    /// one on its own, `relay`).
    pub base_path: PathBuf,
}

fn entry(path: PathBuf, rel: PathBuf, dest: String, m: &std::fs::Metadata) -> Result<SourceFile> {
    if dest.len() > MAX_PATH {
        return Err(Error::Config(format!(
            "destination path {dest:?} is longer than {MAX_PATH} bytes"
        )));
    }
    Ok(SourceFile {
        path,
        rel,
        kind: if m.is_dir() {
            EntryKind::Dir
        } else {
            EntryKind::File
        },
        size: if m.is_dir() { 0 } else { m.len() },
        mode: (m.permissions().mode() & 0o777) as u16,
        stamp: Stamp::of(m),
        dest,
    })
}

fn kind_name(ft: rustix::fs::FileType) -> &'static str {
    use rustix::fs::FileType as T;
    match ft {
        T::Symlink => "symlink, not followed",
        T::BlockDevice | T::CharacterDevice => "device file, not sent",
        T::Fifo => "FIFO, not sent",
        T::Socket => "socket, not sent",
        _ => "special file, not sent",
    }
}

fn open_dir(path: &Path) -> Result<OwnedFd> {
    rustix::fs::open(
        path,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| Error::io(format!("opening {}", path.display()), e.into()))
}

/// The longest path the kernel resolves (PATH_MAX, counting the NUL):
/// every file is opened by its path beneath the source root, so one
/// whose path there is longer cannot be read.
const OPEN_PATH_MAX: usize = 4095;

/// Why the entry at `rel` beneath the source root, bound for `dest`,
/// cannot be sent by its path alone, if it cannot: the reader opens it by
/// `rel`, and the protocol carries no destination path over `MAX_PATH`.
/// Such an entry is skipped with this note rather than failing the scan,
/// so one over-deep corner of a tree does not keep the rest from being
/// sent.
fn path_limit(rel: &Path, dest: &str, is_dir: bool) -> Option<String> {
    let beneath = if is_dir {
        ", nor anything beneath it"
    } else {
        ""
    };
    let rel_len = rel.as_os_str().len();
    if rel_len > OPEN_PATH_MAX {
        Some(format!(
            "path too long: {rel_len} bytes beneath the source, more than the \
             {OPEN_PATH_MAX} the system opens (PATH_MAX); not sent{beneath}"
        ))
    } else if dest.len() > MAX_PATH {
        Some(format!(
            "destination path too long: {} bytes, more than the protocol's \
             {MAX_PATH}; not sent{beneath}",
            dest.len()
        ))
    } else {
        None
    }
}

/// What a directory entry was when listed, from `fstatat`: the scan lists
/// beneath the root's descriptor, never by absolute path, so it goes as
/// deep as the reader can open and no deeper.
struct Listed {
    kind: rustix::fs::FileType,
    size: u64,
    mode: u16,
    stamp: Stamp,
    /// Names the file has.
    links: u64,
}

impl Listed {
    // The field types differ by architecture: widen each to ours.
    #[allow(clippy::useless_conversion, clippy::unnecessary_cast)]
    fn of(st: &rustix::fs::Stat) -> Self {
        let stamp = Stamp {
            dev: st.st_dev as u64,
            ino: st.st_ino as u64,
            size: st.st_size as u64,
            mtime: (st.st_mtime as i64, st.st_mtime_nsec as i64),
            ctime: (st.st_ctime as i64, st.st_ctime_nsec as i64),
            owner: (st.st_uid as u32, st.st_gid as u32),
        };
        Self {
            kind: rustix::fs::FileType::from_raw_mode(st.st_mode),
            size: stamp.size,
            mode: (st.st_mode & 0o777) as u16,
            stamp,
            links: st.st_nlink as u64,
        }
    }
}

fn too_many(source: &Path) -> Error {
    Error::Config(format!(
        "{} has more than {MAX_ENTRIES} entries or {} of destination paths, more than one \
         transfer carries; send its subdirectories separately",
        source.display(),
        crate::units::fmt_bytes(MAX_MANIFEST_BYTES as u64)
    ))
}

/// Lists `source` for the destination `dest`. A file goes to `dest` (or
/// `dest/<name>` when `dest` ends in `/`); a directory's contents go
/// beneath `dest`.
pub fn scan(source: &Path, dest: &str) -> Result<SourceList> {
    scan_with(source, dest, &Select::all())
}

/// Lists `source` for `dest` as `scan` does, taking only what `select`
/// takes. Include patterns that match no file at all are refused, saying
/// so: a send of nothing by an include is a pattern's mistake more likely
/// than a wish. Excludes and bounds that leave nothing (a run directory
/// with nothing old enough yet) make an empty send, not an error.
pub fn scan_with(source: &Path, dest: &str, select: &Select) -> Result<SourceList> {
    let (list, included) = scan_all(source, dest, select)?;
    if !select.active() {
        return Ok(list);
    }
    if included == 0 && !select.filters().include.is_empty() {
        return Err(Error::Config(format!(
            "the include patterns ({}) match none of the {} file(s) listed under {}: check them (a pattern with no / matches a name at any depth, one with a / the path from the source)",
            select.filters().include.len(),
            list.filtered,
            source.display()
        )));
    }
    Ok(without_empty_dirs(list))
}

/// `list` without the directories that hold no file it takes, beneath
/// them at any depth (the source directory itself stays).
fn without_empty_dirs(mut list: SourceList) -> SourceList {
    let mut needed: std::collections::HashSet<String> = std::collections::HashSet::new();
    for f in list.files.iter().filter(|f| f.kind == EntryKind::File) {
        let mut at = f.dest.as_str();
        while let Some((parent, _)) = at.rsplit_once('/') {
            if !needed.insert(parent.to_string()) {
                break;
            }
            at = parent;
        }
    }
    list.files.retain(|f| {
        f.kind == EntryKind::File || f.rel == Path::new(".") || needed.contains(&f.dest)
    });
    list
}

/// The listing, and how many files an include matched (whatever the
/// excludes and bounds then made of them).
fn scan_all(source: &Path, dest: &str, select: &Select) -> Result<(SourceList, usize)> {
    // The named path itself may be a symlink: it is resolved once, here,
    // and everything after is opened beneath what it resolved to.
    let real = source
        .canonicalize()
        .map_err(|e| Error::io(format!("reading {}", source.display()), e))?;
    let m = std::fs::metadata(&real)
        .map_err(|e| Error::io(format!("reading {}", source.display()), e))?;
    if m.is_file() {
        return scan_file(source, &real, dest, &m, select);
    }
    if !m.is_dir() {
        return Err(Error::Config(format!(
            "{} is a {}; send a regular file or a directory",
            source.display(),
            kind_name(rustix::fs::FileType::from_raw_mode(m.mode()))
        )));
    }
    scan_tree(source, &real, dest, &m, select)
}

/// The list of the single file `source`, which resolved to `real`.
fn scan_file(
    source: &Path,
    real: &Path,
    dest: &str,
    m: &std::fs::Metadata,
    select: &Select,
) -> Result<(SourceList, usize)> {
    let name = real
        .file_name()
        .ok_or_else(|| Error::Config(format!("{} has no file name", source.display())))?;
    let dest = if dest.ends_with('/') || dest.is_empty() {
        let shown = source.file_name().unwrap_or(name);
        format!("{}{}", dest, shown.to_string_lossy())
    } else {
        dest.to_string()
    };
    let parent = real.parent().unwrap_or(Path::new("/"));
    let file = entry(source.to_path_buf(), PathBuf::from(name), dest, m)?;
    // A single file is matched by its name.
    let shown = name.to_string_lossy();
    let taken = select.takes_file(&shown, file.size, file.stamp.mtime.0);
    let list = SourceList {
        filtered: usize::from(!taken),
        hard_links: 0,
        files: if taken { vec![file] } else { Vec::new() },
        skipped: Vec::new(),
        base: Arc::new(open_dir(parent)?),
        base_path: parent.to_path_buf(),
    };
    Ok((list, usize::from(select.included(&shown))))
}

/// The list of the directory `source`, which resolved to `real`: the
/// directory itself, then everything beneath it.
fn scan_tree(
    source: &Path,
    real: &Path,
    dest: &str,
    m: &std::fs::Metadata,
    select: &Select,
) -> Result<(SourceList, usize)> {
    let base = dest.trim_end_matches('/').to_string();
    if base.is_empty() {
        return Err(Error::Config(
            "a directory needs a destination directory name (e.g. ingest/run42/)".into(),
        ));
    }
    let mut walk = Walk {
        source,
        select,
        included: 0,
        linked: std::collections::HashSet::new(),
        list: SourceList {
            files: Vec::new(),
            skipped: Vec::new(),
            filtered: 0,
            hard_links: 0,
            base: Arc::new(open_dir(real)?),
            base_path: real.to_path_buf(),
        },
        path_bytes: base.len(),
    };
    walk.list.files.push(entry(
        source.to_path_buf(),
        PathBuf::from("."),
        base.clone(),
        m,
    )?);
    let mut stack = vec![(PathBuf::new(), base)];
    while let Some((rel_dir, dest_dir)) = stack.pop() {
        let subdirs = walk.add_entries(&rel_dir, &dest_dir)?;
        // Depth-first in name order: push in reverse so the first pops first.
        stack.extend(subdirs.into_iter().rev());
    }
    Ok((walk.list, walk.included))
}

/// A directory tree's walk: what it has listed so far.
struct Walk<'a> {
    /// The directory as named, for messages and `SourceFile::path`.
    source: &'a Path,
    /// What the send's filters take.
    select: &'a Select,
    /// Files an include matched.
    included: usize,
    /// Device and inode of the files with more than one name listed.
    linked: std::collections::HashSet<(u64, u64)>,
    list: SourceList,
    /// Bytes of the destination paths listed, which the manifest carries.
    path_bytes: usize,
}

impl Walk<'_> {
    /// Lists the entries of the directory `rel_dir` beneath the source,
    /// bound for `dest_dir`; returns its subdirectories, in name order, to
    /// be listed next.
    fn add_entries(&mut self, rel_dir: &Path, dest_dir: &str) -> Result<Vec<(PathBuf, String)>> {
        let shown_dir = self.source.join(rel_dir);
        let listing =
            |e: rustix::io::Errno| Error::io(format!("listing {}", shown_dir.display()), e.into());
        let (dir, names) = crate::fsroot::list_dir(&self.list.base, rel_dir).map_err(listing)?;
        let mut subdirs = Vec::new();
        for name in names {
            let shown = shown_dir.join(&name);
            let skip = |reason: String| Skipped {
                path: shown.display().to_string(),
                reason,
            };
            let Some(name) = name.to_str() else {
                self.list.skipped.push(skip("name is not UTF-8".into()));
                continue;
            };
            let st = match rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => Listed::of(&st),
                Err(rustix::io::Errno::NAMETOOLONG) => {
                    self.list
                        .skipped
                        .push(skip("name too long for this system; not sent".into()));
                    continue;
                }
                Err(e) => {
                    return Err(Error::io(format!("reading {}", shown.display()), e.into()));
                }
            };
            let is_dir = st.kind == rustix::fs::FileType::Directory;
            if !is_dir && st.kind != rustix::fs::FileType::RegularFile {
                self.list.skipped.push(skip(kind_name(st.kind).into()));
                continue;
            }
            let d = format!("{dest_dir}/{name}");
            let rel = rel_dir.join(name);
            // Filtered before the path limits: what is left out is not
            // named as skipped.
            let rel_str = rel.to_string_lossy();
            if is_dir && !self.select.takes_dir(&rel_str) {
                continue;
            }
            if !is_dir {
                self.included += usize::from(self.select.included(&rel_str));
                if !self.select.takes_file(&rel_str, st.size, st.stamp.mtime.0) {
                    self.list.filtered += 1;
                    continue;
                }
            }
            if let Some(reason) = path_limit(&rel, &d, is_dir) {
                self.list.skipped.push(skip(reason));
                continue;
            }
            if !is_dir && st.links > 1 && !self.linked.insert((st.stamp.dev, st.stamp.ino)) {
                self.list.hard_links += 1;
            }
            self.add(shown, rel.clone(), d.clone(), &st)?;
            if is_dir {
                subdirs.push((rel, d));
            }
        }
        Ok(subdirs)
    }

    /// Adds the listed entry `st`, shown as `shown`, at `rel` beneath the
    /// source and bound for `dest`; refuses a tree larger than one
    /// transfer carries.
    fn add(&mut self, shown: PathBuf, rel: PathBuf, dest: String, st: &Listed) -> Result<()> {
        let is_dir = st.kind == rustix::fs::FileType::Directory;
        self.path_bytes += dest.len();
        self.list.files.push(SourceFile {
            path: shown,
            rel,
            dest,
            kind: if is_dir {
                EntryKind::Dir
            } else {
                EntryKind::File
            },
            size: if is_dir { 0 } else { st.size },
            mode: st.mode,
            stamp: st.stamp,
        });
        if self.list.files.len() > MAX_ENTRIES || self.path_bytes > MAX_MANIFEST_BYTES {
            return Err(too_many(self.source));
        }
        Ok(())
    }
}

/// The name a memory-to-memory test's data goes by when no destination
/// is given: the receiver creates nothing under it.
pub const SYNTHETIC_NAME: &str = "synthetic";

/// The manifest of a memory-to-memory test: one file of `size` generated
/// bytes, named `dest` (or [`SYNTHETIC_NAME`]) in the receiver's logs.
pub fn synthetic(size: u64, dest: &str) -> Result<SourceList> {
    let dest = match dest.trim_end_matches('/') {
        "" => SYNTHETIC_NAME.to_string(),
        d => d.to_string(),
    };
    if dest.len() > MAX_PATH {
        return Err(Error::Config(format!(
            "destination path {dest:?} is longer than {MAX_PATH} bytes"
        )));
    }
    Ok(SourceList {
        files: vec![SourceFile {
            path: PathBuf::from(format!("(generated: {})", crate::units::fmt_bytes(size))),
            rel: PathBuf::from("."),
            dest,
            kind: EntryKind::File,
            size,
            mode: 0o644,
            // No file stands behind it: nothing is opened, or compared.
            stamp: Stamp {
                dev: 0,
                ino: 0,
                size,
                mtime: (0, 0),
                ctime: (0, 0),
                owner: (0, 0),
            },
        }],
        skipped: Vec::new(),
        filtered: 0,
        hard_links: 0,
        // Never opened beneath: the generator reads nothing.
        base: Arc::new(open_dir(Path::new("/"))?),
        base_path: PathBuf::from("/"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp() -> Stamp {
        Stamp {
            dev: 1,
            ino: 2,
            size: 100,
            mtime: (10, 5),
            ctime: (11, 6),
            owner: (0, 0),
        }
    }

    #[test]
    fn an_unchanged_file_passes() {
        assert_eq!(stamp().change_to(&stamp()), None);
    }

    #[test]
    fn every_kind_of_change_is_seen_and_named() {
        let s = stamp();
        let cases = [
            (Stamp { ino: 3, ..s }, SourceChange::Replaced),
            (Stamp { dev: 9, ..s }, SourceChange::Replaced),
            (
                Stamp { size: 101, ..s },
                SourceChange::Size {
                    listed: 100,
                    now: 101,
                },
            ),
            (
                Stamp {
                    mtime: (10, 6),
                    ..s
                },
                SourceChange::Modified,
            ),
            (
                Stamp {
                    ctime: (12, 0),
                    ..s
                },
                SourceChange::StatusChanged,
            ),
        ];
        for (now, want) in cases {
            assert_eq!(s.change_to(&now), Some(want), "{now:?}");
            assert!(!want.to_string().is_empty());
        }
    }

    #[test]
    fn paths_past_either_limit_are_named_and_the_rest_pass() {
        let rel = |n: usize| PathBuf::from("a".repeat(n));
        assert_eq!(
            path_limit(&rel(OPEN_PATH_MAX), &"d".repeat(MAX_PATH), false),
            None
        );
        let deep = path_limit(&rel(OPEN_PATH_MAX + 1), "d", true).unwrap();
        assert!(
            deep.contains("path too long") && deep.contains("beneath it"),
            "{deep}"
        );
        let far = path_limit(&rel(1), &"d".repeat(MAX_PATH + 1), false).unwrap();
        assert!(far.contains("destination path too long"), "{far}");
        assert!(!far.contains("beneath it"), "{far}");
    }

    #[test]
    fn a_replacement_is_reported_before_what_else_differs() {
        let s = stamp();
        let now = Stamp {
            ino: 7,
            size: 1,
            ..s
        };
        assert_eq!(s.change_to(&now), Some(SourceChange::Replaced));
    }
}
