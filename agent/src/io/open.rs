//! Opening files for the chosen I/O mode, with O_DIRECT fallbacks said once.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

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

/// Opens a source file for reading, with O_DIRECT when wanted and possible.
pub fn open_source(path: &Path, want_direct: bool) -> Result<(File, DirectStatus)> {
    let ctx = || format!("opening {} for reading", path.display());
    if want_direct {
        match OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
        {
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
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                let f = File::open(path).map_err(|e| Error::io(ctx(), e))?;
                return Ok((
                    f,
                    DirectStatus::Buffered(Some(format!(
                        "the filesystem of {} does not support O_DIRECT; reading through the page cache",
                        path.display()
                    ))),
                ));
            }
            Err(e) => return Err(Error::io(ctx(), e)),
        }
    }
    let f = File::open(path).map_err(|e| Error::io(ctx(), e))?;
    Ok((f, DirectStatus::Buffered(None)))
}
