//! Writing only beneath a configured root.
//!
//! Destination paths from the network are checked lexically (relative, no
//! `..`, no empty or `.` components, no NUL, no names we use for temporary
//! files) and then resolved by the kernel with openat2 `RESOLVE_BENEATH`,
//! so a symlink inside the root that points outside fails with EXDEV
//! instead of being followed.
#![forbid(unsafe_code)]

use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use crate::error::{Error, Result};

/// Suffix of a file being received.
pub const PART_SUFFIX: &str = ".wirerate-part";
/// Suffix of a file's resume checkpoint.
pub const CKPT_SUFFIX: &str = ".wirerate-ckpt";

const RESOLVE: ResolveFlags = ResolveFlags::BENEATH.union(ResolveFlags::NO_MAGICLINKS);

/// The directory a receiver may write beneath.
#[derive(Debug)]
pub struct Root {
    fd: OwnedFd,
    path: PathBuf,
}

/// A validated destination, split into its parent directory and file name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DestPath {
    /// Path relative to the root, as given (normalised).
    pub rel: String,
    /// Parent directory relative to the root ("" for the root itself).
    pub parent: String,
    /// Final file name.
    pub name: String,
}

impl DestPath {
    /// Name of the temporary file the data is written to.
    pub fn part_name(&self) -> String {
        format!(".{}{PART_SUFFIX}", self.name)
    }
    /// Name of the checkpoint file.
    pub fn ckpt_name(&self) -> String {
        format!(".{}{CKPT_SUFFIX}", self.name)
    }
}

fn refused(path: &str, reason: impl Into<String>) -> Error {
    Error::PathRefused {
        path: path.to_string(),
        reason: reason.into(),
    }
}

/// Checks a destination path from a peer without touching the filesystem.
pub fn validate(path: &str) -> Result<DestPath> {
    if path.is_empty() {
        return Err(refused(path, "empty path"));
    }
    if path.starts_with('/') {
        return Err(refused(
            path,
            "absolute paths are not allowed; give a path relative to the receiver's root",
        ));
    }
    if path.contains('\0') {
        return Err(refused(path, "contains a NUL byte"));
    }
    let comps: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    for c in &comps {
        match *c {
            "" => return Err(refused(path, "empty path component (//)")),
            "." | ".." => return Err(refused(path, "'.' and '..' components are not allowed")),
            c if c.len() > 255 => {
                return Err(refused(path, "a component is longer than 255 bytes"));
            }
            c if c.ends_with(PART_SUFFIX) || c.ends_with(CKPT_SUFFIX) => {
                return Err(refused(
                    path,
                    "names ending in .wirerate-part or .wirerate-ckpt are reserved",
                ));
            }
            _ => {}
        }
    }
    let (name, parents) = comps
        .split_last()
        .ok_or_else(|| refused(path, "empty path"))?;
    Ok(DestPath {
        rel: comps.join("/"),
        parent: parents.join("/"),
        name: (*name).to_string(),
    })
}

fn map_resolve(path: &str, e: Errno) -> Error {
    match e {
        Errno::XDEV => refused(
            path,
            "resolves outside the receiver's root (symlink escape)",
        ),
        Errno::LOOP => refused(path, "too many symlinks"),
        Errno::NOTDIR => refused(path, "a parent component is not a directory"),
        e => Error::io(format!("resolving {path} beneath the root"), e.into()),
    }
}

impl Root {
    /// Opens the root directory.
    pub fn open(path: &Path) -> Result<Self> {
        let fd = rustix::fs::open(
            path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| {
            Error::Config(format!(
                "the root {} cannot be opened as a directory ({e}); create it or pass another --root",
                path.display()
            ))
        })?;
        Ok(Self {
            fd,
            path: path.to_path_buf(),
        })
    }

    /// The root's path, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens (creating as needed) the directory `rel` beneath the root.
    pub fn dir(&self, rel: &str) -> Result<OwnedFd> {
        let open = |p: &str| {
            rustix::fs::openat2(
                &self.fd,
                if p.is_empty() { "." } else { p },
                OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
                RESOLVE,
            )
        };
        match open(rel) {
            Ok(fd) => return Ok(fd),
            Err(Errno::NOENT) => {}
            Err(e) => return Err(map_resolve(rel, e)),
        }
        // Create missing components one at a time, each relative to a
        // parent that was itself resolved beneath the root.
        let mut prefix = String::new();
        let mut parent = open("").map_err(|e| map_resolve(rel, e))?;
        for comp in rel.split('/') {
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(comp);
            match rustix::fs::mkdirat(&parent, comp, Mode::from_raw_mode(0o755)) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => {
                    return Err(Error::io(
                        format!("creating directory {prefix} under {}", self.path.display()),
                        e.into(),
                    ));
                }
            }
            parent = open(&prefix).map_err(|e| map_resolve(&prefix, e))?;
        }
        Ok(parent)
    }

    /// Opens `name` in the directory `dir` (which must come from `dir()`),
    /// never following a symlink at the last component.
    pub fn open_in(dir: &OwnedFd, name: &str, flags: OFlags) -> std::result::Result<File, Errno> {
        // openat2 insists on a zero mode unless a file may be created.
        let mode = if flags.contains(OFlags::CREATE) {
            Mode::from_raw_mode(0o644)
        } else {
            Mode::empty()
        };
        let fd = rustix::fs::openat2(
            dir,
            name,
            flags | OFlags::CLOEXEC,
            mode,
            RESOLVE | ResolveFlags::NO_SYMLINKS,
        )?;
        Ok(File::from(fd))
    }

    /// Removes `name` from `dir`, ignoring a missing file.
    pub fn remove_in(dir: &OwnedFd, name: &str) -> Result<()> {
        match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(e) => Err(Error::io(format!("removing {name}"), e.into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lexical_checks() {
        assert!(validate("a/b.h5").is_ok());
        assert_eq!(validate("run/").unwrap().name, "run");
        let d = validate("x/y/z").unwrap();
        assert_eq!((d.parent.as_str(), d.name.as_str()), ("x/y", "z"));
        assert_eq!(d.part_name(), ".z.wirerate-part");
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../../x",
            "a//b",
            "./a",
            "a/\0",
            "a/.b.wirerate-part",
        ] {
            assert!(validate(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn symlink_escape_is_refused() {
        let base = tempfile::tempdir_in(concat!(env!("CARGO_MANIFEST_DIR"), "/../target")).unwrap();
        let root = base.path().join("root");
        let outside = base.path().join("outside");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("esc")).unwrap();
        std::fs::create_dir(root.join("real")).unwrap();
        std::os::unix::fs::symlink("real", root.join("inner")).unwrap();
        let r = Root::open(&root).unwrap();
        assert!(matches!(r.dir("esc"), Err(Error::PathRefused { .. })));
        assert!(matches!(
            r.dir("esc/deeper"),
            Err(Error::PathRefused { .. })
        ));
        assert!(
            r.dir("inner").is_ok(),
            "a symlink that stays inside is fine"
        );
        let d = r.dir("new/deep").unwrap();
        assert!(root.join("new/deep").is_dir());
        std::os::unix::fs::symlink("/etc/passwd", root.join("new/deep/link")).unwrap();
        assert!(Root::open_in(&d, "link", OFlags::RDONLY).is_err());
    }
}
