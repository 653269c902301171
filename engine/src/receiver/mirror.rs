//! The receiver's side of a mirror's deletes (`mirror`): it lists a
//! directory beneath its root, and removes the entries of that listing
//! the sender names, each only if it is still what was listed.
//!
//! A sender names listing ids, never paths, so it can remove nothing the
//! receiver did not list: nothing above the mirrored directory, none of
//! the receiver's own temporary files, nothing reached through a symlink
//! (the walk and every removal resolve beneath the directory, following
//! none). An entry replaced since it was listed (another inode at its
//! name: a file another transfer published meanwhile) is left, and said.
//! A receiver takes deletes at all only when its operator allows them
//! (`serve --allow-delete`, a pool's `allowDeletes`).

use std::collections::HashSet;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Instant;

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use super::Shared;
use crate::error::{Error, Result};
use crate::fsroot;
use crate::mirror::Listed;
use crate::net::Conn;
use crate::violation::{Violation, ViolationKind};
use crate::wire::{
    EntryKind, FileEntry, Frame, FrameReader, KEEPALIVE_INTERVAL, MAX_ENTRIES, MAX_MANIFEST_BYTES,
    MAX_PATH, encode_files, pack, write_frame,
};

/// What a receiver that takes no deletes says.
pub const NO_DELETES: &str = "this receiver takes no deletes: a mirror needs its operator to allow \
     them (wirerate-agent serve --allow-delete; a DtnPool's allowDeletes)";

/// One listed entry, with what it was when listed.
struct Entry {
    listed: Listed,
    dev: u64,
    ino: u64,
}

/// Serves a mirror connection: the listing, then the removals. What
/// ends it early is said to the sender (`Error`) before it closes.
pub(crate) fn run(shared: &Arc<Shared>, mut stream: Conn) -> Result<()> {
    let served = serve(shared, &mut stream);
    match &served {
        Ok(()) => {
            shared
                .mirrors
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Err(e) => {
            let _ = write_frame(
                &mut stream,
                &Frame::Error {
                    retryable: false,
                    message: e.to_string(),
                },
            );
        }
    }
    served
}

fn serve(shared: &Arc<Shared>, stream: &mut Conn) -> Result<()> {
    if !shared.cfg.allow_delete {
        return Err(Error::Config(NO_DELETES.into()));
    }
    let idle = Some(shared.cfg.idle_timeout);
    stream
        .set_read_timeout(idle)
        .and_then(|()| stream.set_write_timeout(idle))
        .map_err(|e| Error::net("setting the mirror connection's timeouts", e))?;
    let mut reader = FrameReader::default();
    let base = match reader.read(stream)? {
        Frame::MirrorOpen { base } => base,
        other => {
            return Err(
                Violation::unexpected("a mirror's open", crate::session::describe(&other)).into(),
            );
        }
    };
    check_base(&base, shared.cfg.mirror_base.as_deref())?;
    let mut beat = Beat::new();
    let Some(dir) = shared.root.existing_dir(&base)? else {
        // Nothing there: nothing to list, nothing to remove.
        write_frame(stream, &Frame::FilesEnd)?;
        return serve_removals(&mut reader, stream, &[], None, &mut beat);
    };
    let entries = list(&dir, &mut || beat.tick(stream))?;
    send_listing(stream, &entries)?;
    serve_removals(&mut reader, stream, &entries, Some(&dir), &mut beat)?;
    tracing::info!(base, listed = entries.len(), "mirror served");
    Ok(())
}

/// Refuses a mirror of the root itself (it would reach every transfer's
/// files), of a path a destination could not have, or of any directory
/// but `only` where the receiver serves one transfer.
fn check_base(base: &str, only: Option<&str>) -> Result<()> {
    if base.is_empty() {
        return Err(Error::PathRefused {
            path: base.into(),
            reason: "a mirror names a directory beneath the root, never the root itself".into(),
        });
    }
    fsroot::validate(base)?;
    match only {
        Some(only) if only != base => Err(Error::PathRefused {
            path: base.into(),
            reason: format!("this receiver mirrors {only:?} alone, its transfer's destination"),
        }),
        _ => Ok(()),
    }
}

/// Keepalives while the receiver works, so that the sender can tell a
/// long listing or removal from a vanished receiver.
struct Beat(Instant);

impl Beat {
    fn new() -> Self {
        Self(Instant::now())
    }

    fn tick(&mut self, stream: &mut Conn) -> Result<()> {
        if self.0.elapsed() >= KEEPALIVE_INTERVAL {
            write_frame(stream, &Frame::Keepalive)?;
            self.0 = Instant::now();
        }
        Ok(())
    }
}

fn send_listing(stream: &mut Conn, entries: &[Entry]) -> Result<()> {
    let listing: Vec<FileEntry> = entries
        .iter()
        .enumerate()
        .map(|(id, e)| FileEntry {
            file_id: id as u32,
            kind: e.listed.kind,
            size: e.listed.size,
            fingerprint: 0,
            mode: 0,
            mtime: (0, 0),
            digest: None,
            meta: None,
            path: e.listed.path.clone(),
        })
        .collect();
    let mut out = Vec::new();
    encode_files(&listing, &mut out);
    pack(&mut out);
    stream
        .write_all(&out)
        .map_err(|e| Error::net("sending the mirror's listing", e))
}

/// Reads the sender's removals until its `Finish`, removes each, then
/// answers each that failed (`FileResult`) and ends with `Finish`. The
/// answers wait for the sender's `Finish`: written while it still sends
/// removals, they could fill both directions at once.
fn serve_removals(
    reader: &mut FrameReader,
    stream: &mut Conn,
    entries: &[Entry],
    dir: Option<&OwnedFd>,
    beat: &mut Beat,
) -> Result<()> {
    let mut done: HashSet<u32> = HashSet::new();
    let mut failed: Vec<(u32, String)> = Vec::new();
    loop {
        match reader.read(stream)? {
            Frame::Keepalive => {}
            Frame::Finish => break,
            Frame::Remove { ids } => {
                for id in ids {
                    let (Some(e), Some(dir)) = (entries.get(id as usize), dir) else {
                        return Err(Violation::new(
                            ViolationKind::Unknown,
                            format!("asked to remove entry {id}, which the listing did not hold"),
                        )
                        .into());
                    };
                    if !done.insert(id) {
                        return Err(Violation::new(
                            ViolationKind::Repeated,
                            format!("asked to remove entry {id} twice"),
                        )
                        .into());
                    }
                    if let Err(why) = remove(dir, e) {
                        tracing::warn!(path = e.listed.path, "mirror: {why}");
                        failed.push((id, why.to_string()));
                    }
                    beat.tick(stream)?;
                }
            }
            other => {
                return Err(Violation::unexpected(
                    "removals or their end",
                    crate::session::describe(&other),
                )
                .into());
            }
        }
    }
    if !done.is_empty() {
        tracing::info!(
            removed = done.len() - failed.len(),
            failed = failed.len(),
            "mirror: removals done"
        );
    }
    for (file_id, message) in failed {
        write_frame(
            stream,
            &Frame::FileResult {
                file_id,
                ok: false,
                digest: 0,
                identity: 0,
                message,
            },
        )?;
    }
    write_frame(stream, &Frame::Finish)
}

const BENEATH: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);

/// Every entry beneath `dir`, at any depth, following no symlink, with
/// `tick` called at each. Left out, so never removed: the receiver's own
/// temporary files, names no destination could have (not UTF-8, too
/// long, refused by `fsroot::validate`), what cannot be read, what lies
/// on another file system (a mount beneath the directory), and every
/// directory above any of those (it could not be emptied). More entries
/// than a manifest may carry is refused.
fn list(dir: &OwnedFd, tick: &mut dyn FnMut() -> Result<()>) -> Result<Vec<Entry>> {
    let dev = rustix::fs::fstat(dir)
        .map_err(|e| Error::io("reading the mirrored directory", e.into()))?
        .st_dev;
    let mut entries: Vec<Entry> = Vec::new();
    let mut bytes = 0usize;
    let mut holding: HashSet<String> = HashSet::new();
    let mut stack = vec![String::new()];
    while let Some(at) = stack.pop() {
        let Ok((fd, names)) = fsroot::list_dir(dir, std::path::Path::new(&at)) else {
            hold(&mut holding, &at);
            continue;
        };
        for name in names {
            let Ok(name) = name.into_string() else {
                hold(&mut holding, &at);
                continue;
            };
            let path = match at.is_empty() {
                true => name.clone(),
                false => format!("{at}/{name}"),
            };
            tick()?;
            if fsroot::is_temporary(&name)
                || path.len() > MAX_PATH
                || fsroot::validate(&path).is_err()
            {
                hold(&mut holding, &at);
                continue;
            }
            let st = match rustix::fs::statat(&fd, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) if st.st_dev == dev => st,
                _ => {
                    hold(&mut holding, &at);
                    continue;
                }
            };
            let kind = rustix::fs::FileType::from_raw_mode(st.st_mode);
            let (kind, size) = match kind {
                rustix::fs::FileType::Directory => (EntryKind::Dir, 0),
                rustix::fs::FileType::RegularFile => (EntryKind::File, st.st_size.max(0) as u64),
                _ => (EntryKind::File, 0),
            };
            bytes += path.len();
            if entries.len() >= MAX_ENTRIES || bytes > MAX_MANIFEST_BYTES {
                return Err(Error::Config(format!(
                    "the mirrored directory holds more than {MAX_ENTRIES} entries or {} of paths, \
                     more than one listing carries: mirror its subdirectories separately",
                    crate::units::fmt_bytes(MAX_MANIFEST_BYTES as u64)
                )));
            }
            if kind == EntryKind::Dir {
                stack.push(path.clone());
            }
            entries.push(Entry {
                listed: Listed { path, kind, size },
                dev: st.st_dev,
                ino: st.st_ino,
            });
        }
    }
    entries.retain(|e| e.listed.kind != EntryKind::Dir || !holding.contains(&e.listed.path));
    Ok(entries)
}

/// Marks `dir` and every directory above it as holding something
/// unlisted.
fn hold(holding: &mut HashSet<String>, dir: &str) {
    let mut at = dir;
    while !at.is_empty() && holding.insert(at.to_string()) {
        at = at.rsplit_once('/').map_or("", |(parent, _)| parent);
    }
}

/// Why a listed entry was not removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NotRemoved {
    /// Its directory cannot be reached (beneath the listed one, with no
    /// symlink on the way).
    Unreachable(Errno),
    /// Another entry took its name since it was listed.
    Replaced,
    /// A directory that is not empty: something was added since.
    NotEmpty,
    /// The file system refused.
    Refused(Errno),
}

impl std::fmt::Display for NotRemoved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unreachable(e) => write!(f, "not removed: its directory cannot be reached ({e})"),
            Self::Replaced => f.write_str("not removed: replaced since it was listed"),
            Self::NotEmpty => f.write_str(
                "not removed: the directory is not empty (something was added since it was listed)",
            ),
            Self::Refused(e) => write!(f, "not removed: {e}"),
        }
    }
}

/// Removes `e` beneath `dir` if it is still the entry that was listed;
/// otherwise, or if it cannot be, says why. One already gone counts as
/// removed.
fn remove(dir: &OwnedFd, e: &Entry) -> std::result::Result<(), NotRemoved> {
    let (parent, name) = e
        .listed
        .path
        .rsplit_once('/')
        .unwrap_or(("", &e.listed.path));
    let parent = rustix::fs::openat2(
        dir,
        if parent.is_empty() { "." } else { parent },
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        BENEATH,
    );
    let parent = match parent {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(()),
        Err(err) => return Err(NotRemoved::Unreachable(err)),
    };
    match rustix::fs::statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) if (st.st_dev, st.st_ino) == (e.dev, e.ino) => {}
        Ok(_) => return Err(NotRemoved::Replaced),
        Err(Errno::NOENT) => return Ok(()),
        Err(err) => return Err(NotRemoved::Refused(err)),
    }
    let flags = match e.listed.kind {
        EntryKind::Dir => AtFlags::REMOVEDIR,
        EntryKind::File => AtFlags::empty(),
    };
    match rustix::fs::unlinkat(&parent, name, flags) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(Errno::NOTEMPTY | Errno::EXIST) => Err(NotRemoved::NotEmpty),
        Err(err) => Err(NotRemoved::Refused(err)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing(dir: &std::path::Path) -> Vec<(String, EntryKind, u64)> {
        let fd = rustix::fs::open(dir, OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap();
        let mut got: Vec<_> = list(&fd, &mut || Ok(()))
            .unwrap()
            .into_iter()
            .map(|e| (e.listed.path, e.listed.kind, e.listed.size))
            .collect();
        got.sort_by(|a, b| a.0.cmp(&b.0));
        got
    }

    #[test]
    fn the_listing_leaves_out_temporaries_and_the_directories_above_them() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        std::fs::create_dir_all(d.join("a/b")).unwrap();
        std::fs::create_dir_all(d.join("c")).unwrap();
        std::fs::write(d.join("a/b/.x.wirerate-part"), b"in flight").unwrap();
        std::fs::write(d.join("a/f"), b"12345").unwrap();
        std::fs::write(d.join("c/g"), b"").unwrap();
        // A name no destination could have: its directory is held too.
        std::fs::create_dir_all(d.join("e")).unwrap();
        std::fs::write(d.join("e/x.wirerate-stripe"), b"").unwrap();
        std::os::unix::fs::symlink("/etc", d.join("c/link")).unwrap();
        use EntryKind::{Dir, File};
        assert_eq!(
            listing(d),
            vec![
                ("a/f".into(), File, 5),
                ("c".into(), Dir, 0),
                ("c/g".into(), File, 0),
                ("c/link".into(), File, 0),
            ]
        );
    }

    #[test]
    fn the_root_and_any_directory_but_the_pinned_one_are_refused() {
        assert!(check_base("", None).is_err());
        assert!(check_base("../x", None).is_err());
        assert!(check_base("a/.b.wirerate-part", None).is_err());
        assert!(check_base("runs/42", None).is_ok());
        assert!(check_base("runs/42", Some("runs/42")).is_ok());
        let e = check_base("other", Some("runs/42"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("mirrors \"runs/42\" alone"), "{e}");
    }

    #[test]
    fn an_entry_replaced_since_it_was_listed_is_left() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        std::fs::write(d.join("f"), b"old").unwrap();
        std::fs::write(d.join("g"), b"old").unwrap();
        let fd = rustix::fs::open(d, OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap();
        let entries = list(&fd, &mut || Ok(())).unwrap();
        let f = entries.iter().find(|e| e.listed.path == "f").unwrap();
        let g = entries.iter().find(|e| e.listed.path == "g").unwrap();
        // Another file published at f's name meanwhile.
        std::fs::write(d.join("f.new"), b"new").unwrap();
        std::fs::rename(d.join("f.new"), d.join("f")).unwrap();
        assert_eq!(remove(&fd, f), Err(NotRemoved::Replaced));
        assert_eq!(std::fs::read(d.join("f")).unwrap(), b"new");
        remove(&fd, g).unwrap();
        assert!(!d.join("g").exists());
        // Gone already: nothing to do.
        remove(&fd, g).unwrap();
    }

    #[test]
    fn a_symlinked_directory_is_never_entered_or_removed_through() {
        let t = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("precious"), b"keep").unwrap();
        let d = t.path();
        std::os::unix::fs::symlink(outside.path(), d.join("l")).unwrap();
        let fd = rustix::fs::open(d, OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap();
        let entries = list(&fd, &mut || Ok(())).unwrap();
        assert_eq!(entries.len(), 1);
        // A listing entry forged to reach through the link.
        let forged = Entry {
            listed: Listed {
                path: "l/precious".into(),
                kind: EntryKind::File,
                size: 4,
            },
            dev: 0,
            ino: 0,
        };
        assert!(remove(&fd, &forged).is_err());
        assert!(outside.path().join("precious").exists());
        remove(&fd, &entries[0]).unwrap();
        assert!(outside.path().join("precious").exists());
        assert!(std::fs::symlink_metadata(d.join("l")).is_err());
    }
}
