//! One destination file: preparing its temporary file and checkpoint,
//! opening it for the chosen I/O mode, and publishing it.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

use rustix::fs::{AtFlags, FallocateFlags, OFlags};
use rustix::io::Errno;

use super::checkpoint::Checkpoint;
use crate::by_id::ById;
use crate::error::{Error, Result};
use crate::fsroot::{DestPath, Root, validate};
use crate::io::open::on_tmpfs;
use crate::session::lifecycle::is_checkpointed;
use crate::wire::{EntryKind, FileEntry, MAX_BLOCKS_PER_FILE};
use crate::{Bitmap, Layout};

/// A destination file of a session.
pub(crate) struct DestFile {
    pub(crate) kind: EntryKind,
    pub(crate) dest: DestPath,
    pub(crate) layout: Layout,
    pub(crate) fingerprint: u64,
    /// `digest::entry_identity` of the entry as it arrived, before its
    /// path was respelled (the session sets it; `prepare` sees the
    /// respelled path): the file is published only if the sender's report
    /// names the same.
    pub(crate) identity: u64,
    /// Permission bits it is published with (the sender's, masked).
    pub(crate) mode: u32,
    /// The modification time it is published with (the source's).
    pub(crate) mtime: (i64, u32),
    /// Its descriptors, once its first block is written, and the owner
    /// and attributes it is published with: a file waiting in a large
    /// manifest with neither holds a null pointer, not three.
    extra: Option<Box<Extra>>,
    /// Its temporary file is created when its block arrives, not when it
    /// is planned (see `is_created_on_write`).
    create_on_write: bool,
    /// Its temporary file was made on write, any checkpoint beside its name
    /// removed then: none is looked for when it is published.
    fresh: bool,
}

/// What a destination file holds beyond what every file does.
#[derive(Default)]
struct Extra {
    /// Its descriptors, once its first block is written.
    opened: Option<Opened>,
    /// The owner and attributes it is published with, as the receiver
    /// admitted them (`metadata::admitted`).
    meta: Option<crate::wire::Meta>,
}

/// The descriptors of a destination file being written.
struct Opened {
    /// Page-cache descriptor, for unaligned tails and syncs.
    plain: Arc<File>,
    /// O_DIRECT descriptor, when direct I/O is in effect.
    direct: Option<Arc<File>>,
}

/// What `prepare` decided for one manifest entry.
pub(crate) enum Prepared {
    /// Send it; the bitmap holds the blocks already durable here, and the
    /// checkpoint they come from goes to the writer.
    Accept(Box<DestFile>, Bitmap, Option<Resumed>),
    /// Refused, with the reason for the sender.
    Refuse(String),
    /// Send it, to be verified and dropped: a memory-to-memory session,
    /// for which nothing is created (see `discard`).
    Discard,
    /// Already here, at the session's sync level: not sent, left as it is.
    Present,
    /// A dry run would take it: nothing was created for it.
    WouldWrite,
}

/// What a file's stored checkpoint records: its durable blocks and their
/// checksums. Kept beside the file, not in it, until the writer's core
/// takes it (a million waiting files are a million `DestFile`s). Without
/// one, a file's temporary file is garbage once the session ends.
pub(crate) type Resumed = Box<(Bitmap, Vec<u64>)>;

/// A session's files by id; a file is taken out when it is answered.
pub(crate) type Files = ById<Option<Box<DestFile>>>;

/// Files prepared for a session that no writer owns yet, each boxed: an
/// answered file's slot then keeps a pointer, not a whole `DestFile`. If
/// the session fails before its writer takes them, the temporary files no
/// checkpoint can resume are removed rather than left fallocated at full
/// size.
pub(crate) struct Staged<'a> {
    root: &'a Root,
    files: Vec<(u32, Box<DestFile>)>,
    /// The checkpoints they resume from, by file: few files of a large
    /// manifest have one.
    resumed: HashMap<u32, Resumed>,
    /// Their temporary files are other receivers' too.
    shared: bool,
}

impl<'a> Staged<'a> {
    pub(crate) fn with_capacity(root: &'a Root, files: usize) -> Self {
        Self {
            root,
            files: Vec::with_capacity(files),
            resumed: HashMap::new(),
            shared: false,
        }
    }

    /// The files' temporary files are shared with other receivers (see
    /// `receiver::stripe`): none is removed here if the session fails.
    pub(crate) fn shared_with_others(mut self) -> Self {
        self.shared = true;
        self
    }

    pub(crate) fn insert(&mut self, file_id: u32, file: Box<DestFile>, resumed: Option<Resumed>) {
        self.files.push((file_id, file));
        if let Some(r) = resumed {
            self.resumed.insert(file_id, r);
        }
    }

    /// Hands the files over to their writer, with the checkpoints they
    /// resume from.
    pub(crate) fn into_files(mut self) -> (Files, HashMap<u32, Resumed>) {
        // The core refuses a manifest that repeats an id; were one let
        // through, the table would keep one file of the two and never
        // remove the other's temporary file.
        debug_assert!({
            let mut ids: Vec<u32> = self.files.iter().map(|(id, _)| *id).collect();
            ids.sort_unstable();
            ids.windows(2).all(|w| w[0] != w[1])
        });
        let files = std::mem::take(&mut self.files)
            .into_iter()
            .map(|(id, f)| (id, Some(f)))
            .collect();
        (files, std::mem::take(&mut self.resumed))
    }
}

impl Drop for Staged<'_> {
    fn drop(&mut self) {
        if self.shared {
            return;
        }
        let resumed = &self.resumed;
        discard_unresumable(
            self.root,
            self.files
                .iter_mut()
                .map(|(id, f)| (&mut **f, resumed.contains_key(id))),
        );
    }
}

/// Removes the temporary files of `files` that no checkpoint can resume
/// (one-block files are never checkpointed, and a file may not have got
/// its first one): a new session would start them over anyway, and
/// nothing else would ever remove them. Each comes with whether a
/// checkpoint of it is stored. A file created on write that was never
/// created has none to remove (`DestFile::discard`): a session of a
/// million small files that fails early is not followed by a million
/// removals.
pub(crate) fn discard_unresumable<'f>(
    root: &Root,
    files: impl Iterator<Item = (&'f mut DestFile, bool)>,
) {
    for (f, has_checkpoint) in files {
        if f.kind == EntryKind::File && !has_checkpoint {
            if let Err(e) = f.discard(root) {
                tracing::warn!(path = %f.dest.rel, error = %e, "cannot remove the temporary file");
            }
        }
    }
}

/// Whatever goes wrong preparing one entry concerns that entry only: it is
/// refused with the reason, and the rest of the manifest goes on.
fn per_file(e: Error) -> Prepared {
    Prepared::Refuse(e.to_string())
}

/// Sizes the temporary file up front so that a full disk fails now, with a
/// clear message, rather than halfway through.
fn reserve(part: &File, size: u64, path: &str) -> Result<()> {
    part.set_len(0)
        .map_err(|e| Error::io(format!("truncating the temporary file of {path}"), e))?;
    if size == 0 {
        return Ok(());
    }
    match rustix::fs::fallocate(part, FallocateFlags::empty(), 0, size) {
        Ok(()) => Ok(()),
        Err(Errno::NOSPC) | Err(Errno::FBIG) | Err(Errno::DQUOT) => Err(Error::NoSpace {
            context: format!(
                "{path} needs {}; free space there or choose another root",
                crate::units::fmt_bytes(size)
            ),
        }),
        Err(Errno::OPNOTSUPP) => part
            .set_len(size)
            .map_err(|e| Error::io(format!("sizing the temporary file of {path}"), e)),
        Err(e) => Err(Error::io(format!("reserving space for {path}"), e.into())),
    }
}

/// Prepares `e` beneath `root`: directories are created; files of more
/// than one block get their temporary file and any matching checkpoint is
/// loaded (a smaller one's is made when its data arrives: see
/// `DestFile::is_created_on_write`). Files are published with the
/// sender's permission bits less `umask`.
pub(crate) fn prepare(root: &Root, e: &FileEntry, block_size: u64, umask: u32) -> Prepared {
    prepare_entry(root, e, block_size, umask).unwrap_or_else(per_file)
}

/// What a dry run answers for entry `e`: what `prepare` would refuse
/// without writing (a name that does not validate, too many blocks, a
/// parent it could not make or reach beneath the root, a directory at a
/// file's name, or anything but a directory at a directory's), or
/// `WouldWrite`. Nothing is created, so what only writing finds
/// (permissions, a full disk) shows in the run.
pub(crate) fn prepare_dry(root: &Root, e: &FileEntry, block_size: u64) -> Prepared {
    let file = match DestFile::of_entry(e, block_size, 0) {
        Ok(Some(file)) => file,
        Ok(None) => return Prepared::Refuse(too_many_blocks(e, block_size)),
        Err(err) => return per_file(err),
    };
    let is_file = e.kind == EntryKind::File;
    let dir = if is_file {
        file.dest.parent()
    } else {
        &file.dest.rel
    };
    if let Err(err) = root.probe_dir(dir) {
        return per_file(err);
    }
    let is_dir = root.stat(&file.dest.rel).is_some_and(|st| {
        rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Directory
    });
    if is_file && is_dir {
        return per_file(a_directory_in_the_way(&e.path));
    }
    Prepared::WouldWrite
}

/// Prepares entry `e` of a session that writes blocks `first..end` of it
/// into the temporary file every receiver of the transfer shares (see
/// `receiver::stripe`): the file is created if no receiver has yet, never
/// truncated, and not published here. The blocks outside the piece count
/// as held, with a checksum of 0 on both sides, so that the session's
/// digest covers the piece alone; so do those of the piece that a
/// per-chunk checkpoint holds (`receiver::pieces`), with the checksums it
/// recorded, which the sender reads its blocks to match.
pub(crate) fn prepare_piece(
    root: &Root,
    e: &FileEntry,
    (block_size, umask): (u64, u32),
    (first, end): (u64, u64),
    confirm_by: std::time::Instant,
) -> Prepared {
    let prepared = (|| {
        let Some((file, dir)) = stage(root, e, block_size, umask)? else {
            return Ok(Prepared::Refuse(too_many_blocks(e, block_size)));
        };
        let blocks = file.layout.blocks();
        if file.kind != EntryKind::File || first > end || end > blocks {
            return Ok(Prepared::Refuse(format!(
                "{}: blocks {first}..{end} are not a piece of its {blocks} blocks",
                e.path
            )));
        }
        let part = Root::open_in(&dir, &file.dest.part_name(), OFlags::RDWR | OFlags::CREATE)
            .map_err(|err| {
                Error::io(
                    format!("creating the shared temporary file of {}", e.path),
                    err.into(),
                )
            })?;
        // Several receivers size it at once: each only ever grows it to
        // the one size, and fallocate keeps what others wrote.
        grow(&part, e.size, &e.path)?;
        let stamp = super::pieces::Stamp {
            fingerprint: e.fingerprint,
            size: e.size,
            block_size,
            ino: rustix::fs::fstat(&part).map_or(0, |st| st.st_ino),
        };
        let pieces = file.dest.pieces_name();
        let (mut have, mut sums) = super::pieces::resume(
            (&dir, &pieces),
            stamp,
            (&part, &file.layout),
            (first, end),
            confirm_by,
        );
        for b in (0..first).chain(end..blocks) {
            have.set(b);
            sums[b as usize] = 0;
        }
        let resumed = Box::new((have.clone(), sums));
        Ok(Prepared::Accept(Box::new(file), have, Some(resumed)))
    })();
    prepared.unwrap_or_else(per_file)
}

/// Prepares entry `e` of a session that publishes what the receivers of a
/// transfer over several pairs wrote: its shared temporary file must be
/// here, at its full size; every block counts as held.
pub(crate) fn prepare_publish(root: &Root, e: &FileEntry, block_size: u64, umask: u32) -> Prepared {
    let prepared = (|| {
        let Some((file, dir)) = stage(root, e, block_size, umask)? else {
            return Ok(Prepared::Refuse(too_many_blocks(e, block_size)));
        };
        let blocks = file.layout.blocks();
        if file.kind == EntryKind::File {
            let len = Root::open_in(&dir, &file.dest.part_name(), OFlags::RDONLY)
                .and_then(|f| rustix::fs::fstat(&f))
                .map(|st| st.st_size as u64);
            let found = match len {
                Ok(n) if n == e.size => None,
                Ok(n) => Some(format!("{n} of {} bytes", e.size)),
                Err(err) => Some(err.to_string()),
            };
            if let Some(found) = found {
                return Ok(Prepared::Refuse(format!(
                    "{}: the temporary file the other receivers wrote is not here at its full size ({found}); this receiver's storage is not the one they share",
                    e.path
                )));
            }
        }
        let mut have = Bitmap::new(blocks);
        for b in 0..blocks {
            have.set(b);
        }
        let resumed = Box::new((have.clone(), vec![0; blocks as usize]));
        Ok(Prepared::Accept(Box::new(file), have, Some(resumed)))
    })();
    prepared.unwrap_or_else(per_file)
}

fn too_many_blocks(e: &FileEntry, block_size: u64) -> String {
    format!(
        "{} needs {} blocks, more than the {MAX_BLOCKS_PER_FILE} a file may have; use a larger --block-size",
        e.path,
        Layout::new(e.size, block_size).blocks()
    )
}

/// The destination of entry `e` and its directory (created beneath the
/// root as needed); `None` when it has too many blocks.
fn stage(
    root: &Root,
    e: &FileEntry,
    block_size: u64,
    umask: u32,
) -> Result<Option<(DestFile, OwnedFd)>> {
    let Some(file) = DestFile::of_entry(e, block_size, umask)? else {
        return Ok(None);
    };
    let dir = if e.kind == EntryKind::Dir {
        root.dir(&file.dest.rel)?
    } else {
        root.dir(file.dest.parent())?
    };
    Ok(Some((file, dir)))
}

/// Grows `part` to `size` where it is shorter, reserving its blocks.
fn grow(part: &File, size: u64, path: &str) -> Result<()> {
    let len = part
        .metadata()
        .map_err(|err| Error::io(format!("inspecting the temporary file of {path}"), err))?
        .len();
    if len == size {
        return Ok(());
    }
    if len > size {
        part.set_len(size)
            .map_err(|err| Error::io(format!("sizing the temporary file of {path}"), err))?;
        return Ok(());
    }
    match rustix::fs::fallocate(part, FallocateFlags::empty(), 0, size) {
        Ok(()) => Ok(()),
        Err(Errno::OPNOTSUPP) => part
            .set_len(size)
            .map_err(|err| Error::io(format!("sizing the temporary file of {path}"), err)),
        Err(err) => Err(Error::io(
            format!("reserving {size} bytes for {path}"),
            err.into(),
        )),
    }
}

fn prepare_entry(root: &Root, e: &FileEntry, block_size: u64, umask: u32) -> Result<Prepared> {
    let Some(file) = DestFile::of_entry(e, block_size, umask)? else {
        return Ok(Prepared::Refuse(too_many_blocks(e, block_size)));
    };
    let layout = file.layout;
    if e.kind == EntryKind::Dir {
        root.dir(&file.dest.rel)?;
        return Ok(Prepared::Accept(Box::new(file), Bitmap::new(0), None));
    }
    if !is_checkpointed(layout.blocks()) {
        // No checkpoint of a one-block file is ever stored, so there is
        // nothing to resume: its temporary file is made when its block
        // arrives, on the writer's thread, and a tree of small files is
        // planned without a file created per entry before any data moves.
        let mut file = file;
        file.create_on_write = true;
        return Ok(Prepared::Accept(
            Box::new(file),
            Bitmap::new(layout.blocks()),
            None,
        ));
    }
    let dir = root.dir(file.dest.parent())?;
    refuse_a_directory(&dir, &file.dest, &e.path)?;
    let part = create_part(&dir, &file.dest, &e.path)?;
    let part_stat = part
        .metadata()
        .map_err(|err| Error::io(format!("inspecting the temporary file of {}", e.path), err))?;
    let resumed = Checkpoint::load(&dir, &file.dest.ckpt_name()).filter(|c| {
        let matches = c.fingerprint == e.fingerprint
            && c.size == e.size
            && c.block_size == block_size
            && part_stat.len() == e.size;
        let same_file = c.ino.is_none_or(|ino| ino == part_stat.ino());
        if matches && !same_file {
            // Storage whose inode numbers are not stable (some FUSE
            // mounts, CIFS with noserverino) loses its resumes here: say so.
            tracing::warn!(
                path = %e.path,
                recorded = c.ino.unwrap_or(0),
                now = part_stat.ino(),
                "the checkpoint recorded another temporary file (its inode differs): starting the file over"
            );
        }
        matches && same_file
    });
    match resumed {
        Some(c) => {
            let have = c.durable.clone();
            let resumed = Box::new((c.durable, c.checksums));
            Ok(Prepared::Accept(Box::new(file), have, Some(resumed)))
        }
        None => {
            file.remove_checkpoint(&dir)?;
            if let Err(err) = reserve(&part, e.size, &e.path) {
                drop(part);
                Root::remove_in(&dir, &file.dest.part_name())?;
                return Err(err);
            }
            Ok(Prepared::Accept(
                Box::new(file),
                Bitmap::new(layout.blocks()),
                None,
            ))
        }
    }
}

/// Refuses a destination whose final name is a directory: the rename
/// that publishes it could never succeed.
fn refuse_a_directory(dir: &OwnedFd, dest: &DestPath, path: &str) -> Result<()> {
    match rustix::fs::statat(dir, dest.name(), AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st)
            if rustix::fs::FileType::from_raw_mode(st.st_mode)
                == rustix::fs::FileType::Directory =>
        {
            Err(a_directory_in_the_way(path))
        }
        _ => Ok(()),
    }
}

/// Why a file whose destination name is a directory is refused.
fn a_directory_in_the_way(path: &str) -> Error {
    Error::PathRefused {
        path: path.to_string(),
        reason: "it exists and is a directory; remove it or choose another destination".into(),
    }
}

/// What opening the temporary file of `rel` was, for an error.
fn opening(rel: &str) -> String {
    format!("opening the temporary file of {rel}")
}

/// Opens the temporary file of `dest` in `dir`, creating it if need be.
fn create_part(dir: &OwnedFd, dest: &DestPath, path: &str) -> Result<File> {
    Root::open_in(dir, &dest.part_name(), OFlags::RDWR | OFlags::CREATE).map_err(|err| {
        Error::io(
            format!("creating the temporary file for {path}"),
            err.into(),
        )
    })
}

impl DestFile {
    /// The destination of entry `e`, its path checked, published with the
    /// sender's permission bits less `umask`; `None` when it has more
    /// blocks than a file may.
    fn of_entry(e: &FileEntry, block_size: u64, umask: u32) -> Result<Option<Self>> {
        let dest = validate(&e.path)?;
        let size = if e.kind == EntryKind::Dir { 0 } else { e.size };
        let layout = Layout::new(size, block_size);
        if layout.blocks() > MAX_BLOCKS_PER_FILE {
            return Ok(None);
        }
        Ok(Some(Self {
            kind: e.kind,
            dest,
            layout,
            fingerprint: e.fingerprint,
            identity: 0,
            mode: u32::from(e.mode) & 0o777 & !umask,
            mtime: e.mtime,
            extra: None,
            create_on_write: false,
            fresh: false,
        }))
    }

    /// The directory holding the file, resolved beneath the root again
    /// (descriptors are not kept per file so that trees of many files do
    /// not exhaust them).
    pub(crate) fn dir(&self, root: &Root) -> Result<OwnedFd> {
        root.dir(self.dest.parent())
    }

    /// Whether its temporary file is made only when its data arrives
    /// (`create`): a file of at most one block, which has no checkpoint to
    /// resume from. Until then nothing of it is on disk.
    pub(crate) fn is_created_on_write(&self) -> bool {
        self.create_on_write
    }

    /// Opens the temporary file; returns a note when O_DIRECT was wanted
    /// but is not in effect. A file created on write is created here (see
    /// `create`); the caller tells whether a failure concerns that file
    /// alone (`Error::concerns_one_file`).
    pub(crate) fn open(&mut self, root: &Root, want_direct: bool) -> Result<Option<String>> {
        if self.plain().is_some() {
            return Ok(None);
        }
        let dir = self.dir(root)?;
        let name = self.dest.part_name();
        let plain = if self.create_on_write {
            let part = self.create(&dir)?;
            self.create_on_write = false;
            part
        } else {
            Root::open_in(&dir, &name, OFlags::RDWR)
                .map_err(|e| Error::io(opening(&self.dest.rel), e.into()))?
        };
        let ctx = || opening(&self.dest.rel);
        let mut note = None;
        let mut direct = None;
        if want_direct {
            if on_tmpfs(&plain) {
                note = Some("the destination is on tmpfs, which ignores O_DIRECT".to_string());
            } else {
                match Root::open_in(&dir, &name, OFlags::RDWR | OFlags::DIRECT) {
                    Ok(f) => direct = Some(Arc::new(f)),
                    Err(Errno::INVAL) => {
                        note = Some(format!(
                            "the filesystem under {} does not support O_DIRECT; writing through the page cache",
                            root.path().display()
                        ));
                    }
                    Err(e) => return Err(Error::io(ctx(), e.into())),
                }
            }
        }
        self.extra.get_or_insert_default().opened = Some(Opened {
            plain: Arc::new(plain),
            direct,
        });
        Ok(note)
    }

    /// Makes the temporary file of a file created on write in `dir`, sized
    /// for its data, as `prepare` would have: a full disk refuses the file
    /// that does not fit, with why, and the others go on. It leaves nothing
    /// when it fails.
    ///
    /// A destination name taken by a directory is found when the file is
    /// published (`rename_into_place`), not looked for here: one block is
    /// little to have sent for nothing, and the look would cost every
    /// small file a lookup.
    fn create(&mut self, dir: &OwnedFd) -> Result<File> {
        let path = self.dest.rel.to_string();
        // A checkpoint may be beside the name: a crash between a
        // publication's rename and the checkpoint's removal leaves one, and
        // so may an earlier, larger version. It goes now, and no other
        // comes: a file this small is never checkpointed, so its
        // publication need not look for one.
        self.remove_checkpoint(dir)?;
        // A temporary file an earlier session left is taken over, emptied.
        let part = create_part(dir, &self.dest, &path)?;
        let sized = reserve(&part, self.layout.size, &path);
        let part = self.unless_sized(dir, part, sized)?;
        self.fresh = true;
        Ok(part)
    }

    /// `part`, made by `create`, once `sized`; else the error, with `part`
    /// removed: a file that failed to be made leaves nothing on disk.
    fn unless_sized(&self, dir: &OwnedFd, part: File, sized: Result<()>) -> Result<File> {
        match sized {
            Ok(()) => Ok(part),
            Err(err) => {
                drop(part);
                // The reason it failed is what the sender must hear.
                if let Err(e) = Root::remove_in(dir, &self.dest.part_name()) {
                    tracing::warn!(path = %self.dest.rel, error = %e, "cannot remove the temporary file");
                }
                Err(err)
            }
        }
    }

    /// The page-cache descriptor, once opened.
    pub(crate) fn plain(&self) -> Option<&Arc<File>> {
        self.opened().map(|o| &o.plain)
    }

    /// The O_DIRECT descriptor, when opened with direct I/O in effect.
    pub(crate) fn direct(&self) -> Option<&Arc<File>> {
        self.opened().and_then(|o| o.direct.as_ref())
    }

    fn opened(&self) -> Option<&Opened> {
        self.extra.as_ref().and_then(|e| e.opened.as_ref())
    }

    /// Closes its descriptors.
    fn close(&mut self) {
        if let Some(e) = &mut self.extra {
            e.opened = None;
        }
    }

    /// The owner and attributes it is published with.
    fn meta(&self) -> Option<&crate::wire::Meta> {
        self.extra.as_ref().and_then(|e| e.meta.as_ref())
    }

    /// Sets the owner and attributes it is published with.
    pub(crate) fn set_meta(&mut self, meta: crate::wire::Meta) {
        self.extra.get_or_insert_default().meta = Some(meta);
    }

    /// Flushes written blocks to stable storage (the caller marks them
    /// durable).
    pub(crate) fn sync(&self) -> Result<()> {
        if let Some(f) = self.plain() {
            f.sync_data()
                .map_err(|e| Error::io(format!("syncing {}", self.dest.rel), e))?;
        }
        Ok(())
    }

    /// Records `durable` blocks and their `checksums` for a later resume,
    /// unless another session has taken the partial file over (or
    /// published it) meanwhile: a checkpoint beside a published file would
    /// be a stale one.
    pub(crate) fn checkpoint(
        &self,
        root: &Root,
        (durable, checksums): (Bitmap, Vec<u64>),
    ) -> Result<()> {
        let dir = self.dir(root)?;
        if let Some(f) = self.plain()
            && !super::checkpointer::still_ours(&dir, &self.dest.part_name(), f)
        {
            return Err(Error::TakenOver {
                path: self.dest.rel.to_string(),
            });
        }
        self.record(durable, checksums)
            .store(&dir, &self.dest.ckpt_name())
    }

    /// The checkpoint of this file with `durable` blocks and `checksums`.
    pub(crate) fn record(&self, durable: Bitmap, checksums: Vec<u64>) -> Checkpoint {
        Checkpoint {
            fingerprint: self.fingerprint,
            size: self.layout.size,
            block_size: self.layout.block_size,
            ino: self
                .plain()
                .and_then(|f| rustix::fs::fstat(&**f).ok())
                .map(|st| st.st_ino),
            durable,
            checksums,
        }
    }

    /// Gives the verified file its permission bits, its source's
    /// modification time and its final name, and drops the checkpoint;
    /// the rename is durable only after `sync_dir`.
    /// A destination name taken by a directory refuses this file alone
    /// (`Error::PathRefused`), its temporary file left for `discard`.
    pub(crate) fn rename_into_place(&mut self, root: &Root) -> Result<()> {
        if let Some(f) = self.plain() {
            // Attributes before the mode, so that an ACL's entries for the
            // owner, group and others (and its mask) follow the mode as
            // masked here; the owner last, so that nothing after it needs
            // the rights of a file's owner (CAP_FOWNER).
            self.set_xattrs(f);
            rustix::fs::fchmod(&**f, rustix::fs::Mode::from_raw_mode(self.mode)).map_err(|e| {
                Error::io(format!("setting the mode of {}", self.dest.rel), e.into())
            })?;
            self.set_mtime(f);
            self.set_owner(f);
        }
        self.close();
        let dir = self.dir(root)?;
        match rustix::fs::renameat(&dir, self.dest.part_name().as_str(), &dir, self.dest.name()) {
            Ok(()) => {}
            Err(Errno::ISDIR) => return Err(a_directory_in_the_way(&self.dest.rel)),
            // Its checkpoint stays: a rename that failed (a busy name, no
            // permission there) costs a large file its publication, not its
            // resume.
            Err(e) => return Err(Error::io(format!("publishing {}", self.dest.rel), e.into())),
        }
        // A file made on write had any checkpoint beside it removed then
        // (`create`), and one-block files are never checkpointed.
        if self.fresh {
            return Ok(());
        }
        self.remove_checkpoint(&dir)
    }

    /// Gives the open temporary file the owner the sender sent, as the
    /// receiver admitted it. Only a warning if it cannot (a receiver
    /// without CAP_CHOWN, a file system that refuses): the data landed.
    fn set_owner(&self, f: &File) {
        let Some((uid, gid)) = self.meta().and_then(|m| m.owner) else {
            return;
        };
        let owner = (
            Some(rustix::process::Uid::from_raw(uid)),
            Some(rustix::process::Gid::from_raw(gid)),
        );
        if let Err(e) = rustix::fs::fchown(f, owner.0, owner.1) {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                tracing::warn!(
                    path = %self.dest.rel,
                    "setting the owner to {uid}:{gid}: {e} (said once; the receiver needs CAP_CHOWN to keep owners)"
                );
            });
        }
    }

    /// Gives the open temporary file the attributes the sender sent, as
    /// the receiver admitted them; a warning for each it cannot set.
    fn set_xattrs(&self, f: &File) {
        let Some(m) = self.meta() else {
            return;
        };
        for (name, value) in &m.xattrs {
            if let Err(e) =
                rustix::fs::fsetxattr(f, name.as_str(), value, rustix::fs::XattrFlags::empty())
            {
                tracing::warn!(path = %self.dest.rel, "setting the attribute {name}: {e}");
            }
        }
    }

    /// Gives the open temporary file its source's modification time,
    /// leaving its access time as it is, so that a sync by mtime finds it
    /// again. Only a warning if it cannot: the data is what was sent, and
    /// the next sync by mtime sends it again. So is a file system that
    /// keeps coarser times than the source's (read back to tell).
    fn set_mtime(&self, f: &File) {
        let (secs, nanos) = self.mtime;
        let times = rustix::fs::Timestamps {
            last_access: rustix::fs::Timespec {
                tv_sec: 0,
                tv_nsec: rustix::fs::UTIME_OMIT,
            },
            last_modification: rustix::fs::Timespec {
                tv_sec: secs,
                tv_nsec: i64::from(nanos),
            },
        };
        if let Err(e) = rustix::fs::futimens(f, &times) {
            // Once: a file system that refuses it refuses it for every file.
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                tracing::warn!(
                    path = %self.dest.rel,
                    "setting the modification time: {e} (said once; a sync by mtime will send such files again)"
                );
            });
            return;
        }
        let kept = rustix::fs::fstat(f)
            .is_ok_and(|st| (st.st_mtime, st.st_mtime_nsec as i64) == (secs, i64::from(nanos)));
        if !kept {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                tracing::warn!(
                    path = %self.dest.rel,
                    "this file system keeps modification times coarser than the source's \
                     (or out of its range): a sync by mtime will send such files again"
                );
            });
        }
    }

    /// Appends the record of blocks `first..` of this shared temporary
    /// file, which this session wrote and checked, to its per-chunk
    /// checkpoints, unless the file was taken over or published meanwhile.
    pub(crate) fn record_piece(&self, root: &Root, first: u64, checksums: &[u64]) -> Result<()> {
        let dir = self.dir(root)?;
        let f = self
            .plain()
            .ok_or_else(|| Error::Internal(format!("{} is not open", self.dest.rel)))?;
        if !super::checkpointer::still_ours(&dir, &self.dest.part_name(), f) {
            return Err(Error::TakenOver {
                path: self.dest.rel.to_string(),
            });
        }
        let ino = rustix::fs::fstat(&**f).map_or(0, |st| st.st_ino);
        let stamp = super::pieces::Stamp {
            fingerprint: self.fingerprint,
            size: self.layout.size,
            block_size: self.layout.block_size,
            ino,
        };
        super::pieces::append(&dir, &self.dest.pieces_name(), stamp, first, checksums)
    }

    /// Removes the per-chunk checkpoints of this shared temporary file.
    pub(crate) fn forget_pieces(&self, root: &Root) -> Result<()> {
        Root::remove_in(&self.dir(root)?, &self.dest.pieces_name())
    }

    /// Removes the checkpoint, and one left half-replaced by a crash.
    fn remove_checkpoint(&self, dir: &OwnedFd) -> Result<()> {
        let [_, ckpt, tmp, _] = crate::fsroot::temp_names(self.dest.name());
        Root::remove_in(dir, &ckpt)?;
        Root::remove_in(dir, &tmp)
    }

    /// Makes renames in the file's directory survive a crash.
    pub(crate) fn sync_dir(&self, root: &Root) -> Result<()> {
        let ctx = || format!("syncing the directory of {}", self.dest.rel);
        // O_PATH descriptors cannot be synced: open the directory itself.
        let d = rustix::fs::openat(
            self.dir(root)?,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| Error::io(ctx(), e.into()))?;
        rustix::fs::fsync(&d).map_err(|e| Error::io(ctx(), e.into()))
    }

    /// Gives a directory the sender's permission bits, keeping the owner's
    /// own, so that what is still to be written into it can be.
    pub(crate) fn set_dir_mode(&self, root: &Root) -> Result<()> {
        let ctx = || format!("setting the mode of {}", self.dest.rel);
        let d = rustix::fs::openat(
            root.dir(&self.dest.rel)?,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| Error::io(ctx(), e.into()))?;
        rustix::fs::fchmod(&d, rustix::fs::Mode::from_raw_mode(self.mode | 0o700))
            .map_err(|e| Error::io(ctx(), e.into()))
    }

    /// Gives a directory its source's owner and attributes (default ACLs
    /// among them) where the send keeps them, and its modification time,
    /// where it can (a failure is said, as for files).
    pub(crate) fn finish_dir(&self, root: &Root) {
        let d = root.dir(&self.dest.rel).and_then(|at| {
            rustix::fs::openat(
                at,
                ".",
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .map_err(|e| Error::io(format!("opening {}", self.dest.rel), e.into()))
        });
        match d {
            Ok(d) => {
                let d = File::from(d);
                self.set_xattrs(&d);
                self.set_mtime(&d);
                self.set_owner(&d);
            }
            Err(e) => tracing::debug!(path = %self.dest.rel, "not setting its time: {e}"),
        }
    }

    /// Removes the temporary file and checkpoint (data that failed
    /// verification). A file created on write that was not created has
    /// nothing of this session's on disk: its directory is not even looked
    /// up, since it may be what made the creation fail.
    pub(crate) fn discard(&mut self, root: &Root) -> Result<()> {
        if self.create_on_write {
            return Ok(());
        }
        self.close();
        let dir = self.dir(root)?;
        // Checkpoint first (see `rename_into_place`).
        self.remove_checkpoint(&dir)?;
        Root::remove_in(&dir, &self.dest.part_name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A checkpoint left without its temporary file (a crash between a
    // publication's rename and the checkpoint's removal) is not taken to
    // match a later temporary file that has the same size: only the one
    // it recorded.
    #[test]
    fn a_checkpoint_resumes_only_the_temporary_file_it_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::open(dir.path()).unwrap();
        let e = FileEntry {
            file_id: 0,
            kind: EntryKind::File,
            size: 3 * 4096,
            fingerprint: 5,
            mode: 0o644,
            mtime: (0, 0),
            digest: None,
            meta: None,
            path: "f.bin".into(),
        };
        let plan = || prepare(&root, &e, 4096, 0o022);
        let Prepared::Accept(mut f, _, None) = plan() else {
            panic!("not prepared afresh");
        };
        f.open(&root, false).unwrap();
        let mut durable = Bitmap::new(3);
        durable.set(0);
        f.checkpoint(&root, (durable, vec![1, 0, 0])).unwrap();
        drop(f);
        assert!(matches!(plan(), Prepared::Accept(_, have, Some(_)) if have.count() == 1));
        // Another temporary file of the same size takes its place (made
        // while the first still exists, so its inode differs).
        let other = dir.path().join("other");
        std::fs::write(&other, vec![0u8; 3 * 4096]).unwrap();
        std::fs::rename(&other, dir.path().join(".f.bin.wirerate-part")).unwrap();
        assert!(
            matches!(plan(), Prepared::Accept(_, have, None) if have.count() == 0),
            "resumed from a checkpoint of another temporary file"
        );
    }

    #[test]
    fn a_file_waiting_in_a_large_manifest_is_small() {
        // Boxed, it takes a 96-byte allocation (glibc rounds 88 plus its
        // header up to 96); at 89 it would take 112. It took 80 until it
        // carried the source's modification time (16 bytes more a file
        // waiting in a manifest). Its path and descriptors are allocated
        // apart, the last only once its first block is written; what is
        // written and durable of it is the writer core's
        // (`session::lifecycle`, 32 bytes a file).
        assert!(size_of::<DestFile>() <= 88, "{}", size_of::<DestFile>());
    }
}
