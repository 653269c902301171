//! Reading what a send keeps of each file beyond its data (`metadata`):
//! its owner, mapped, and the extended attributes `Keep` names, read
//! from the file opened beneath the source as the reader opens it.

use std::os::fd::OwnedFd;

use rustix::fs::{Mode, OFlags, ResolveFlags};

use super::source::SourceFile;
use crate::metadata::Keeping;
use crate::metadata::{Keep, is_acl, map_acl};
use crate::wire::{MAX_XATTR_BYTES, MAX_XATTR_NAME, MAX_XATTRS, Meta};

/// `f`'s metadata as `k` keeps it, beneath `base`, and why its
/// attributes were left out if they were (they could not be read, or
/// exceed what an entry carries: the file goes without them); None when
/// it keeps nothing.
pub(super) fn read(
    base: &OwnedFd,
    f: &SourceFile,
    k: &Keeping,
    scratch: &mut Scratch,
) -> (Option<Box<Meta>>, Option<String>) {
    if !k.keep.any() {
        return (None, None);
    }
    let (uid, gid) = f.stamp.owner;
    let owner = k.keep.owner.then(|| (k.uids.map(uid), k.gids.map(gid)));
    let (xattrs, why) = match k.keep.xattrs || k.keep.acls {
        true => match xattrs(base, f, k, scratch) {
            Ok(x) => (x, None),
            Err(why) => (Vec::new(), Some(format!("{}: {why}", f.path.display()))),
        },
        false => (Vec::new(), None),
    };
    (Some(Box::new(Meta { owner, xattrs })), why)
}

/// Buffers reused for every file's attributes, so that each value keeps
/// only its own bytes.
pub(super) struct Scratch {
    names: Vec<u8>,
    value: Vec<u8>,
}

impl Default for Scratch {
    fn default() -> Self {
        Self {
            names: vec![0u8; 64 << 10],
            value: vec![0u8; MAX_XATTR_BYTES],
        }
    }
}

/// The attributes of `f` that `k` keeps, the ids inside ACLs mapped.
fn xattrs(
    base: &OwnedFd,
    f: &SourceFile,
    k: &Keeping,
    scratch: &mut Scratch,
) -> Result<Vec<(String, Vec<u8>)>, String> {
    let keep: Keep = k.keep;
    let fd = rustix::fs::openat2(
        base,
        &f.rel,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|e| format!("opening it to read its attributes: {e}"))?;
    let Scratch { names, value } = scratch;
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
        let len = match rustix::fs::fgetxattr(&fd, name, &mut value[..]) {
            Ok(len) => len,
            Err(e) => return Err(format!("reading its attribute {name}: {e}")),
        };
        let v = match is_acl(name) {
            true => map_acl(&value[..len], &k.uids, &k.gids)
                .ok_or_else(|| format!("its attribute {name} is not a POSIX ACL"))?,
            false => value[..len].to_vec(),
        };
        bytes += name.len() + len;
        if out.len() == MAX_XATTRS || bytes > MAX_XATTR_BYTES || name.len() > MAX_XATTR_NAME {
            return Err(format!(
                "its attributes exceed what one file carries ({MAX_XATTRS}, {} in all)",
                crate::units::fmt_bytes(MAX_XATTR_BYTES as u64)
            ));
        }
        out.push((name.to_owned(), v));
    }
    Ok(out)
}
