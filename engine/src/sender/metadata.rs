//! Reading what a send keeps of each file beyond its data (`metadata`):
//! its owner, mapped, and the extended attributes `Keep` names, read
//! from the file opened beneath the source as the reader opens it.

use std::os::fd::OwnedFd;

use rustix::fs::{Mode, OFlags, ResolveFlags};

use super::source::SourceFile;
use crate::metadata::{IdMap, Keep};
use crate::wire::{MAX_XATTR_BYTES, MAX_XATTR_NAME, MAX_XATTRS, Meta};

/// What a send keeps, and the id maps its owners go through.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Keeping {
    /// What it keeps.
    pub keep: Keep,
    /// Owner ids, sending site to receiving site.
    pub uids: IdMap,
    /// Group ids, likewise.
    pub gids: IdMap,
}

/// `f`'s metadata as `k` keeps it, beneath `base`; None when it keeps
/// nothing. `Err` says why its attributes were left out (they could not
/// be read, or exceed what an entry carries): the file goes without them.
pub(super) fn read(
    base: &OwnedFd,
    f: &SourceFile,
    k: &Keeping,
) -> (Option<Box<Meta>>, Option<String>) {
    if !k.keep.any() {
        return (None, None);
    }
    let (uid, gid) = f.stamp.owner;
    let owner = k.keep.owner.then(|| (k.uids.map(uid), k.gids.map(gid)));
    let (xattrs, why) = match k.keep.xattrs || k.keep.acls {
        true => match xattrs(base, f, k.keep) {
            Ok(x) => (x, None),
            Err(why) => (Vec::new(), Some(format!("{}: {why}", f.path.display()))),
        },
        false => (Vec::new(), None),
    };
    (Some(Box::new(Meta { owner, xattrs })), why)
}

/// The attributes of `f` that `keep` names.
fn xattrs(base: &OwnedFd, f: &SourceFile, keep: Keep) -> Result<Vec<(String, Vec<u8>)>, String> {
    let fd = rustix::fs::openat2(
        base,
        &f.rel,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|e| format!("opening it to read its attributes: {e}"))?;
    let mut names = vec![0u8; 64 << 10];
    let n = rustix::fs::flistxattr(&fd, &mut names[..])
        .map_err(|e| format!("listing its attributes: {e}"))?;
    let mut out = Vec::new();
    let mut bytes = 0;
    for name in names[..n].split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let Ok(name) = std::str::from_utf8(name) else {
            continue;
        };
        if !keep.keeps_xattr(name) {
            continue;
        }
        let mut value = vec![0u8; MAX_XATTR_BYTES];
        let len = match rustix::fs::fgetxattr(&fd, name, &mut value[..]) {
            Ok(len) => len,
            Err(e) => return Err(format!("reading its attribute {name}: {e}")),
        };
        value.truncate(len);
        bytes += name.len() + len;
        if out.len() == MAX_XATTRS || bytes > MAX_XATTR_BYTES || name.len() > MAX_XATTR_NAME {
            return Err(format!(
                "its attributes exceed what one file carries ({MAX_XATTRS}, {} in all)",
                crate::units::fmt_bytes(MAX_XATTR_BYTES as u64)
            ));
        }
        out.push((name.to_owned(), value));
    }
    Ok(out)
}
