//! Opening files for the chosen I/O mode, with O_DIRECT fallbacks said once.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use crate::error::{Error, Result};

const TMPFS_MAGIC: i64 = 0x0102_1994;

/// Whether O_DIRECT is in effect on an opened file, and why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DirectStatus {
    /// Opened with O_DIRECT on a filesystem that honours it.
    Direct,
    /// Opened through the page cache; the string says why, if O_DIRECT was wanted.
    Buffered(Option<String>),
}

impl DirectStatus {
    /// True when O_DIRECT is in effect.
    pub fn is_direct(&self) -> bool {
        matches!(self, Self::Direct)
    }
}

/// Whether `file` lives on tmpfs, which accepts O_DIRECT but ignores it.
#[allow(
    clippy::unnecessary_cast,
    reason = "f_type's width differs between architectures"
)]
pub fn on_tmpfs(file: &File) -> bool {
    rustix::fs::fstatfs(file).is_ok_and(|s| s.f_type as i64 == TMPFS_MAGIC)
}

/// Opens the source file `rel` beneath `base` for reading, never through a
/// symlink at any component and never outside `base`, with O_DIRECT when
/// wanted and possible. `shown` names it in messages.
pub fn open_source(
    base: &OwnedFd,
    rel: &Path,
    shown: &Path,
    want_direct: bool,
) -> Result<(File, DirectStatus)> {
    let open = |direct: bool| {
        // Non-blocking for the open only: a FIFO or device swapped in
        // after the scan would otherwise block it until someone writes.
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK;
        let flags = if direct {
            flags | OFlags::DIRECT
        } else {
            flags
        };
        let fd = rustix::fs::openat2(
            base,
            rel,
            flags,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        )?;
        if rustix::fs::FileType::from_raw_mode(rustix::fs::fstat(&fd)?.st_mode)
            != rustix::fs::FileType::RegularFile
        {
            return Err(Errno::NOTSUP);
        }
        rustix::fs::fcntl_setfl(&fd, rustix::fs::fcntl_getfl(&fd)? - OFlags::NONBLOCK)?;
        Ok(File::from(fd))
    };
    let refused = |e: Errno| -> Error {
        let why = match e {
            Errno::LOOP => {
                "it, or a directory above it, was replaced by a symlink after it was listed; \
                            symlinks inside a source are never followed"
                    .to_string()
            }
            Errno::XDEV => "it resolves outside the source directory".to_string(),
            Errno::NOENT => "it disappeared after it was listed".to_string(),
            Errno::NOTSUP => {
                "it is no longer a regular file (replaced after it was listed)".to_string()
            }
            e => format!("cannot open it for reading: {e}"),
        };
        Error::SourceChanged {
            path: shown.display().to_string(),
            reason: format!("{why}; not sent"),
        }
    };
    if want_direct {
        match open(true) {
            Ok(f) if on_tmpfs(&f) => {
                return Ok((
                    f,
                    DirectStatus::Buffered(Some(
                        "the source is on tmpfs, which ignores O_DIRECT (reads come from memory)"
                            .into(),
                    )),
                ));
            }
            Ok(f) => return Ok((f, DirectStatus::Direct)),
            Err(Errno::INVAL) => {
                let f = open(false).map_err(refused)?;
                return Ok((
                    f,
                    DirectStatus::Buffered(Some(format!(
                        "the filesystem of {} does not support O_DIRECT; reading through the page cache",
                        shown.display()
                    ))),
                ));
            }
            Err(e) => return Err(refused(e)),
        }
    }
    let f = open(false).map_err(refused)?;
    Ok((f, DirectStatus::Buffered(None)))
}

/// Opens the local file `path` for reading, as `open_source` would with its
/// parent directory as the base (for the demo's own files).
pub fn open_path(path: &Path, want_direct: bool) -> Result<(File, DirectStatus)> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| Error::Config(format!("{} has no file name", path.display())))?;
    let base = rustix::fs::open(
        parent,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| Error::io(format!("opening {}", parent.display()), e.into()))?;
    open_source(&base, Path::new(name), path, want_direct)
}
