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
use rustix::fs::{Mode, OFlags};

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
        }
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
    /// The directory every entry is opened beneath (the source directory,
    /// or a single file's parent).
    pub base: Arc<OwnedFd>,
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

fn kind_name(ft: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_symlink() {
        "symlink, not followed"
    } else if ft.is_block_device() || ft.is_char_device() {
        "device file, not sent"
    } else if ft.is_fifo() {
        "FIFO, not sent"
    } else if ft.is_socket() {
        "socket, not sent"
    } else {
        "special file, not sent"
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

/// Lists `source` for the destination `dest`. A file goes to `dest` (or
/// `dest/<name>` when `dest` ends in `/`); a directory's contents go
/// beneath `dest`.
pub fn scan(source: &Path, dest: &str) -> Result<SourceList> {
    // The named path itself may be a symlink: it is resolved once, here,
    // and everything after is opened beneath what it resolved to.
    let real = source
        .canonicalize()
        .map_err(|e| Error::io(format!("reading {}", source.display()), e))?;
    let m = std::fs::metadata(&real)
        .map_err(|e| Error::io(format!("reading {}", source.display()), e))?;
    if m.is_file() {
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
        let file = entry(source.to_path_buf(), PathBuf::from(name), dest, &m)?;
        return Ok(SourceList {
            files: vec![file],
            skipped: Vec::new(),
            base: Arc::new(open_dir(parent)?),
        });
    }
    if !m.is_dir() {
        return Err(Error::Config(format!(
            "{} is a {}; send a regular file or a directory",
            source.display(),
            kind_name(m.file_type())
        )));
    }
    let base = dest.trim_end_matches('/').to_string();
    if base.is_empty() {
        return Err(Error::Config(
            "a directory needs a destination directory name (e.g. ingest/run42/)".into(),
        ));
    }
    let mut list = SourceList {
        files: Vec::new(),
        skipped: Vec::new(),
        base: Arc::new(open_dir(&real)?),
    };
    list.files.push(entry(
        source.to_path_buf(),
        PathBuf::from("."),
        base.clone(),
        &m,
    )?);
    let mut path_bytes = base.len();
    let mut stack = vec![(PathBuf::new(), base)];
    while let Some((rel_dir, dest_dir)) = stack.pop() {
        let dir = real.join(&rel_dir);
        let mut children: Vec<_> = std::fs::read_dir(&dir)
            .map_err(|e| Error::io(format!("listing {}", dir.display()), e))?
            .collect::<std::io::Result<_>>()
            .map_err(|e| Error::io(format!("listing {}", dir.display()), e))?;
        children.sort_by_key(|c| c.file_name());
        let mut subdirs = Vec::new();
        for c in children {
            let shown = source.join(&rel_dir).join(c.file_name());
            let name = c.file_name();
            let Some(name) = name.to_str() else {
                list.skipped.push(Skipped {
                    path: shown.display().to_string(),
                    reason: "name is not UTF-8".into(),
                });
                continue;
            };
            let cm = std::fs::symlink_metadata(c.path())
                .map_err(|e| Error::io(format!("reading {}", shown.display()), e))?;
            let d = format!("{dest_dir}/{name}");
            let rel = rel_dir.join(name);
            if cm.is_file() || cm.is_dir() {
                path_bytes += d.len();
                list.files.push(entry(shown, rel.clone(), d.clone(), &cm)?);
                if list.files.len() > MAX_ENTRIES || path_bytes > MAX_MANIFEST_BYTES {
                    return Err(Error::Config(format!(
                        "{} has more than {MAX_ENTRIES} entries or {} of destination paths, more than one transfer carries; send its subdirectories separately",
                        source.display(),
                        crate::units::fmt_bytes(MAX_MANIFEST_BYTES as u64)
                    )));
                }
                if cm.is_dir() {
                    subdirs.push((rel, d));
                }
            } else {
                list.skipped.push(Skipped {
                    path: shown.display().to_string(),
                    reason: kind_name(cm.file_type()).into(),
                });
            }
        }
        // Depth-first in name order: push in reverse so the first pops first.
        stack.extend(subdirs.into_iter().rev());
    }
    Ok(list)
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
            },
        }],
        skipped: Vec::new(),
        // Never opened beneath: the generator reads nothing.
        base: Arc::new(open_dir(Path::new("/"))?),
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
