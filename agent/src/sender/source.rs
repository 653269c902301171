//! What to send: one file, or a directory tree walked without following
//! symlinks.
#![forbid(unsafe_code)]

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use xxhash_rust::xxh3::xxh3_64;

use crate::error::{Error, Result};
use crate::summary::Skipped;
use crate::wire::{EntryKind, MAX_PATH};

/// One entry to send.
#[derive(Debug, Clone)]
pub struct SourceFile {
    /// Where it is read from.
    pub path: PathBuf,
    /// Destination path relative to the receiver's root.
    pub dest: String,
    /// File or directory.
    pub kind: EntryKind,
    /// Size in bytes.
    pub size: u64,
    /// Source version (size and mtime), so a stale checkpoint is not reused.
    pub fingerprint: u64,
}

/// The manifest and what was left out.
#[derive(Debug, Default)]
pub struct SourceList {
    /// Entries to send, directories before their contents.
    pub files: Vec<SourceFile>,
    /// Entries not sent, with reasons.
    pub skipped: Vec<Skipped>,
}

fn fingerprint(m: &std::fs::Metadata) -> u64 {
    let mut b = [0u8; 24];
    b[..8].copy_from_slice(&m.len().to_le_bytes());
    b[8..16].copy_from_slice(&m.mtime().to_le_bytes());
    b[16..].copy_from_slice(&m.mtime_nsec().to_le_bytes());
    xxh3_64(&b)
}

fn entry(path: PathBuf, dest: String, m: &std::fs::Metadata) -> Result<SourceFile> {
    if dest.len() > MAX_PATH {
        return Err(Error::Config(format!(
            "destination path {dest:?} is longer than {MAX_PATH} bytes"
        )));
    }
    Ok(SourceFile {
        path,
        kind: if m.is_dir() {
            EntryKind::Dir
        } else {
            EntryKind::File
        },
        size: if m.is_dir() { 0 } else { m.len() },
        fingerprint: fingerprint(m),
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

/// Lists `source` for the destination `dest`. A file goes to `dest` (or
/// `dest/<name>` when `dest` ends in `/`); a directory's contents go
/// beneath `dest`.
pub fn scan(source: &Path, dest: &str) -> Result<SourceList> {
    let m = std::fs::metadata(source)
        .map_err(|e| Error::io(format!("reading {}", source.display()), e))?;
    let mut list = SourceList::default();
    if m.is_file() {
        let dest = if dest.ends_with('/') || dest.is_empty() {
            let name = source
                .file_name()
                .ok_or_else(|| Error::Config(format!("{} has no file name", source.display())))?;
            format!("{}{}", dest, name.to_string_lossy())
        } else {
            dest.to_string()
        };
        list.files.push(entry(source.to_path_buf(), dest, &m)?);
        return Ok(list);
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
    list.files
        .push(entry(source.to_path_buf(), base.clone(), &m)?);
    let mut stack = vec![(source.to_path_buf(), base)];
    while let Some((dir, dest_dir)) = stack.pop() {
        let mut children: Vec<_> = std::fs::read_dir(&dir)
            .map_err(|e| Error::io(format!("listing {}", dir.display()), e))?
            .collect::<std::io::Result<_>>()
            .map_err(|e| Error::io(format!("listing {}", dir.display()), e))?;
        children.sort_by_key(|c| c.file_name());
        let mut subdirs = Vec::new();
        for c in children {
            let path = c.path();
            let name = c.file_name();
            let Some(name) = name.to_str() else {
                list.skipped.push(Skipped {
                    path: path.display().to_string(),
                    reason: "name is not UTF-8".into(),
                });
                continue;
            };
            let cm = std::fs::symlink_metadata(&path)
                .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
            let d = format!("{dest_dir}/{name}");
            if cm.is_file() {
                list.files.push(entry(path, d, &cm)?);
            } else if cm.is_dir() {
                list.files.push(entry(path.clone(), d.clone(), &cm)?);
                subdirs.push((path, d));
            } else {
                list.skipped.push(Skipped {
                    path: path.display().to_string(),
                    reason: kind_name(cm.file_type()).into(),
                });
            }
        }
        // Depth-first in name order: push in reverse so the first pops first.
        stack.extend(subdirs.into_iter().rev());
    }
    Ok(list)
}
