//! Writing only beneath a configured root.
//!
//! Destination paths from the network are checked lexically (relative, no
//! `..`, no empty or `.` components, no NUL, no names we use for temporary
//! files) and then resolved by the kernel with openat2 `RESOLVE_BENEATH`,
//! so a symlink inside the root that points outside fails with EXDEV
//! instead of being followed.
#![forbid(unsafe_code)]

use std::ffi::OsString;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use crate::error::{Error, Result};

/// Suffix of a file being received.
pub const PART_SUFFIX: &str = ".wirerate-part";
/// Suffix of a file's resume checkpoint.
pub const CKPT_SUFFIX: &str = ".wirerate-ckpt";
/// Suffix of a checkpoint being replaced (written, synced, then renamed).
pub const CKPT_TMP_SUFFIX: &str = ".wirerate-ckpt.tmp";
/// Suffix of the per-chunk checkpoints of a temporary file that several
/// receivers share (see `receiver::pieces`).
pub const PIECES_SUFFIX: &str = ".wirerate-pieces";
/// Every suffix of the receiver's own files, which no destination may use.
pub const TEMP_SUFFIXES: [&str; 4] = [PART_SUFFIX, CKPT_SUFFIX, CKPT_TMP_SUFFIX, PIECES_SUFFIX];
/// Longest file name most filesystems take (NAME_MAX).
const NAME_MAX: usize = 255;

/// Suffix of the marker that says a root is shared by the receivers of a
/// transfer over several pairs (see `receiver::stripe`).
pub const STRIPE_SUFFIX: &str = ".wirerate-stripe";

/// Whether `name` is one of the receiver's own temporary files.
pub fn is_temporary(name: &str) -> bool {
    name.starts_with('.')
        && (TEMP_SUFFIXES.iter().any(|s| name.ends_with(s)) || name.ends_with(STRIPE_SUFFIX))
}

/// The stem of the temporary files of the destination file `name`: the
/// name itself while it is short enough that `.`, the name and the longest
/// suffix fit NAME_MAX with room to spare; else a prefix of it and a hash
/// of the whole name, so a name of 241-255 bytes still gets temporary files
/// (and the same ones on every resume). Plain stems are at most
/// `room - 4` bytes and hashed ones at least `room - 3` (the prefix gives
/// up at most three bytes to end on a character boundary), so no plain
/// name can take a long name's temporary files.
fn temp_stem(name: &str) -> std::borrow::Cow<'_, str> {
    let room = NAME_MAX - 1 - CKPT_TMP_SUFFIX.len();
    if name.len() <= room - 4 {
        return name.into();
    }
    let hash = format!("~{:016x}", crate::digest::xxh3_64(name.as_bytes()));
    let mut end = room - hash.len();
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{hash}", &name[..end]).into()
}

/// The names of the temporary file, checkpoint, checkpoint being
/// replaced and per-chunk checkpoints of the destination file `name`, in
/// the same directory.
pub fn temp_names(name: &str) -> [String; 4] {
    let stem = temp_stem(name);
    TEMP_SUFFIXES.map(|suffix| format!(".{stem}{suffix}"))
}

const RESOLVE: ResolveFlags = ResolveFlags::BENEATH.union(ResolveFlags::NO_MAGICLINKS);

/// The directory a receiver may write beneath.
#[derive(Debug)]
pub struct Root {
    fd: OwnedFd,
    path: PathBuf,
}

/// A validated destination: its path relative to the root, which splits
/// into a parent directory and a file name (one string, since a manifest
/// may hold a million of them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DestPath {
    /// Path relative to the root, as given (normalised).
    pub rel: Box<str>,
    /// Where the file name starts in `rel` (a frame, and so a path, is
    /// far shorter than 4 GiB).
    name_at: u32,
}

impl DestPath {
    /// Parent directory relative to the root ("" for the root itself).
    pub fn parent(&self) -> &str {
        self.rel[..self.name_at as usize].trim_end_matches('/')
    }
    /// Final file name.
    pub fn name(&self) -> &str {
        &self.rel[self.name_at as usize..]
    }
    /// Name of the temporary file the data is written to.
    pub fn part_name(&self) -> String {
        let [part, ..] = temp_names(self.name());
        part
    }
    /// Name of the checkpoint file.
    pub fn ckpt_name(&self) -> String {
        let [_, ckpt, ..] = temp_names(self.name());
        ckpt
    }
    /// Name of the per-chunk checkpoints of a shared temporary file.
    pub fn pieces_name(&self) -> String {
        let [.., pieces] = temp_names(self.name());
        pieces
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
            c if c.len() > NAME_MAX => {
                return Err(refused(path, "a component is longer than 255 bytes"));
            }
            c if TEMP_SUFFIXES.iter().any(|s| c.ends_with(s)) || c.ends_with(STRIPE_SUFFIX) => {
                return Err(refused(
                    path,
                    "names ending in .wirerate-part, .wirerate-ckpt, .wirerate-ckpt.tmp, .wirerate-pieces or .wirerate-stripe are reserved",
                ));
            }
            _ => {}
        }
    }
    let rel = comps.join("/");
    let name_at = rel.rfind('/').map_or(0, |i| i + 1);
    let name_at = u32::try_from(name_at).map_err(|_| refused(path, "longer than 4 GiB"))?;
    Ok(DestPath {
        rel: rel.into_boxed_str(),
        name_at,
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
        self.walk_dir(rel, true)?
            .ok_or_else(|| Error::Internal(format!("directory {rel} was made but not opened")))
    }

    /// Whether `dir(rel)` would succeed, without creating anything (a dry
    /// run's plan): the parts of `rel` that exist are resolved as `dir`
    /// resolves them and refused as it would refuse them (a file in a
    /// directory's place, a symlink out of the root or to nowhere); the
    /// first part missing, and the rest, `dir` would make.
    pub fn probe_dir(&self, rel: &str) -> Result<()> {
        self.walk_dir(rel, false).map(|_| ())
    }

    /// The directory `rel` ("" for the root) as `dir` resolves it, if it
    /// is there; None if it is not (nothing is made).
    pub fn existing_dir(&self, rel: &str) -> Result<Option<OwnedFd>> {
        self.walk_dir(rel, false)
    }

    /// The directory `rel`, resolved one part at a time, each relative to
    /// a parent itself resolved beneath the root. A missing part is made
    /// when `make`; otherwise the walk stops there (`None`: `dir` would
    /// make the rest). A name that leads nowhere is refused either way.
    fn walk_dir(&self, rel: &str, make: bool) -> Result<Option<OwnedFd>> {
        match self.open_dir(rel) {
            Ok(fd) => return Ok(Some(fd)),
            Err(Errno::NOENT) => {}
            Err(e) => return Err(map_resolve(rel, e)),
        }
        let mut prefix = String::new();
        let mut parent = self.open_dir("").map_err(|e| map_resolve(rel, e))?;
        for comp in rel.split('/') {
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(comp);
            if make {
                self.make_dir(&parent, comp, &prefix)?;
            }
            parent = match self.open_dir(&prefix) {
                Ok(fd) => fd,
                // Nothing at all there, not made: the rest would be.
                Err(Errno::NOENT)
                    if !make
                        && rustix::fs::statat(&parent, comp, AtFlags::SYMLINK_NOFOLLOW)
                            .is_err() =>
                {
                    return Ok(None);
                }
                // What was just made or found is gone: a symlink to
                // nowhere, or removed meanwhile.
                Err(Errno::NOENT) => {
                    return Err(refused(
                        &prefix,
                        "a symlink to nowhere, or removed while it was made",
                    ));
                }
                Err(e) => return Err(map_resolve(&prefix, e)),
            };
        }
        Ok(Some(parent))
    }

    /// Makes directory `comp` in `parent` (at `prefix` beneath the root),
    /// unless something is there already.
    fn make_dir(&self, parent: &OwnedFd, comp: &str, prefix: &str) -> Result<()> {
        match rustix::fs::mkdirat(parent, comp, Mode::from_raw_mode(0o755)) {
            Ok(()) | Err(Errno::EXIST) => Ok(()),
            Err(Errno::MLINK) => Err(refused(
                prefix,
                "its directory holds all the directories it may",
            )),
            Err(e) => Err(Error::io(
                format!("creating directory {prefix} under {}", self.path.display()),
                e.into(),
            )),
        }
    }

    /// The directory `p` beneath the root (the root itself for ""), for
    /// its path only, resolved beneath the root.
    fn open_dir(&self, p: &str) -> std::result::Result<OwnedFd, Errno> {
        rustix::fs::openat2(
            &self.fd,
            if p.is_empty() { "." } else { p },
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            RESOLVE,
        )
    }

    /// What is at `rel` beneath the root, without creating anything:
    /// its parents resolved as `dir` resolves them (a symlink that stays
    /// beneath the root is followed), its last component never followed
    /// (a symlink there is what is found). None if nothing is there, or
    /// nothing that can be reached beneath the root.
    pub fn stat(&self, rel: &str) -> Option<rustix::fs::Stat> {
        let fd = rustix::fs::openat2(
            &self.fd,
            rel,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            RESOLVE,
        )
        .ok()?;
        rustix::fs::fstat(&fd).ok()
    }

    /// The regular file at `rel` beneath the root, opened to read, as
    /// `stat` finds it (parents resolved beneath the root, the name never
    /// followed), with its size. None if it cannot be, or is not a
    /// regular file: opened non-blocking, so that a FIFO swapped in
    /// cannot hold the open, and blocking again once it is known regular.
    pub fn open_read(&self, rel: &str) -> Option<(File, u64)> {
        let fd = rustix::fs::openat2(
            &self.fd,
            rel,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
            RESOLVE,
        )
        .ok()?;
        let st = rustix::fs::fstat(&fd).ok()?;
        if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
            return None;
        }
        rustix::fs::fcntl_setfl(&fd, OFlags::RDONLY).ok()?;
        Some((File::from(fd), st.st_size.max(0) as u64))
    }

    /// Opens `name` in the directory `dir` (which must come from `dir()`),
    /// never following a symlink at the last component. A file it creates
    /// is readable by its owner only: what is being received stays private
    /// until it is published with the sender's permission bits.
    pub fn open_in(dir: &OwnedFd, name: &str, flags: OFlags) -> std::result::Result<File, Errno> {
        // openat2 insists on a zero mode unless a file may be created.
        let mode = if flags.contains(OFlags::CREATE) {
            Mode::from_raw_mode(0o600)
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

/// The names in the directory `rel_dir` beneath `base`, sorted, with the
/// directory's descriptor to inspect them through: opened beneath `base`,
/// following no symlink (the sender's listing of a source, a mirror's of
/// a destination).
pub fn list_dir(base: &OwnedFd, rel_dir: &Path) -> rustix::io::Result<(OwnedFd, Vec<OsString>)> {
    let at = if rel_dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel_dir
    };
    let fd = rustix::fs::openat2(
        base,
        at,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        RESOLVE | ResolveFlags::NO_SYMLINKS,
    )?;
    let mut names = Vec::new();
    for e in rustix::fs::Dir::read_from(&fd)? {
        let name = e?.file_name().to_bytes().to_vec();
        if name != b"." && name != b".." {
            names.push(OsString::from_vec(name));
        }
    }
    names.sort();
    Ok((fd, names))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lexical_checks() {
        assert!(validate("a/b.h5").is_ok());
        assert_eq!(validate("run/").unwrap().name(), "run");
        let d = validate("x/y/z").unwrap();
        assert_eq!((d.parent(), d.name()), ("x/y", "z"));
        assert_eq!(d.part_name(), ".z.wirerate-part");
        let top = validate("z").unwrap();
        assert_eq!((top.parent(), top.name()), ("", "z"));
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../../x",
            "a//b",
            "./a",
            "a/\0",
            "a/.b.wirerate-part",
            "a/.b.wirerate-ckpt.tmp",
            "a/.b.wirerate-pieces",
        ] {
            assert!(validate(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn temporary_names_fit_for_every_name_a_filesystem_takes() {
        for len in [1, 200, 236, 237, 240, 241, 250, 255] {
            let name = "n".repeat(len);
            let names = temp_names(&name);
            for t in &names {
                assert!(t.len() <= NAME_MAX, "{len}: {t} is {} bytes", t.len());
                assert!(is_temporary(t), "{t}");
            }
            assert_eq!(names, temp_names(&name), "the same on every resume");
            if len <= 232 {
                assert_eq!(names[0], format!(".{name}{PART_SUFFIX}"));
            }
        }
        // Two long names alike but for their end get different files.
        let a = format!("{}a", "n".repeat(250));
        let b = format!("{}b", "n".repeat(250));
        assert_ne!(temp_names(&a), temp_names(&b));
        // A plain name shaped like a long name's stem does not share its
        // temporary files.
        let long = "n".repeat(250);
        let stem = temp_names(&long)[0]
            .trim_start_matches('.')
            .trim_end_matches(PART_SUFFIX)
            .to_string();
        assert_ne!(temp_names(&stem), temp_names(&long));
        // A multi-byte character is never cut in half.
        let wide = "é".repeat(127);
        assert!(temp_names(&wide)[2].len() <= NAME_MAX);
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
