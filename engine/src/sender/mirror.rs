//! The sender's side of a mirror (`send --delete`): once every file has
//! landed, it has the receiver list the destination directory, decides
//! what the source no longer has (`mirror::plan`), checks the guard
//! (`mirror::check`), and has the receiver remove it. A dry run stops
//! after the plan.

use std::collections::HashSet;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;

use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use super::SendConfig;
use super::connect::connect;
use super::select::Select;
use super::source::SourceList;
use crate::error::{Error, Result};
use crate::mirror::{Deletes, Guard, Listed, check, plan};
use crate::summary::{FileFailure, MirrorSummary, PLAN_SHOWN};
use crate::violation::{Violation, ViolationKind};
use crate::wire::{
    EntryKind, FileEntry, Frame, FrameReader, IDLE_TIMEOUT, MAX_ENTRIES, Purpose, write_frame,
};

/// Most ids one `Remove` frame carries (256 KiB of them).
const REMOVE_CHUNK: usize = 1 << 16;

/// What a mirror needs of the source's listing: taken before the send,
/// so that a source a mirror cannot use is refused before any data moves.
pub(crate) struct Mirroring {
    /// The destination directory, relative to the receiver's root.
    base: String,
    /// What the send sends, relative to `base`.
    sent: HashSet<String>,
    /// Files the source holds (after the filters).
    files: usize,
    /// The source directory, to find what its filters left out.
    source: Arc<OwnedFd>,
}

impl Mirroring {
    /// What mirroring `list` needs; refused for a single file.
    pub(crate) fn of(list: &SourceList) -> Result<Self> {
        let Some(root) = list
            .files
            .iter()
            .find(|f| f.rel == Path::new(".") && f.kind == EntryKind::Dir)
        else {
            return Err(Error::Config(
                "--delete mirrors a directory, and the source is a single file: send a directory, \
                 or leave out --delete"
                    .into(),
            ));
        };
        let prefix = format!("{}/", root.dest);
        Ok(Self {
            base: root.dest.clone(),
            sent: list
                .files
                .iter()
                .filter_map(|f| f.dest.strip_prefix(&prefix).map(str::to_owned))
                .collect(),
            files: list
                .files
                .iter()
                .filter(|f| f.kind == EntryKind::File)
                .count(),
            source: Arc::clone(&list.base),
        })
    }
}

/// The mirror of a send that landed every file; `dry` plans only.
pub(crate) fn mirror(cfg: &SendConfig, m: &Mirroring, guard: &Guard, dry: bool) -> MirrorSummary {
    let mut summary = MirrorSummary {
        base: m.base.clone(),
        ..MirrorSummary::default()
    };
    if let Err(e) = run(cfg, m, guard, dry, &mut summary) {
        summary.error = Some(e.to_string());
    }
    summary
}

/// A mirror that deletes nothing because `failed` files of its send
/// failed (or, in a dry run, would be refused).
pub(crate) fn skipped(m: &Mirroring, failed: usize, dry: bool) -> MirrorSummary {
    let why = match dry {
        true => format!(
            "a run would refuse {failed} file(s), and a mirror deletes only after every file landed"
        ),
        false => format!(
            "{failed} file(s) failed, and a mirror deletes only after every file landed: send again"
        ),
    };
    MirrorSummary {
        base: m.base.clone(),
        skipped: Some(why),
        ..MirrorSummary::default()
    }
}

fn run(
    cfg: &SendConfig,
    m: &Mirroring,
    guard: &Guard,
    dry: bool,
    out: &mut MirrorSummary,
) -> Result<()> {
    let select = cfg.select()?;
    let (mut conn, _) = connect(cfg, &cfg.socket, Purpose::Mirror, cfg.connect_timeout)?;
    conn.set_read_timeout(Some(IDLE_TIMEOUT))
        .and_then(|()| conn.set_write_timeout(Some(IDLE_TIMEOUT)))
        .map_err(|e| Error::net("setting the mirror connection's timeouts", e))?;
    write_frame(
        &mut conn,
        &Frame::MirrorOpen {
            base: m.base.clone(),
        },
    )?;
    let mut reader = FrameReader::unpacking();
    let listing = read_listing(&mut reader, &mut conn)?;
    let deletes = plan(&listing, |e| keeps(m, &select, e));
    out.files = deletes.files;
    out.dirs = deletes.dirs;
    out.bytes = deletes.bytes;
    out.paths = deletes
        .ids
        .iter()
        .take(PLAN_SHOWN)
        .map(|id| listing[*id as usize].path.clone())
        .collect();
    let go = !dry && deletes.count() > 0;
    if let Err(refusal) = check(&deletes, guard, m.files) {
        out.refused = Some(refusal.to_string());
    } else if go {
        send_removals(&mut conn, &deletes)?;
    }
    write_frame(&mut conn, &Frame::Finish)?;
    let failed = read_results(&mut reader, &mut conn, &listing, &deletes, out)?;
    out.failed = failed;
    if out.refused.is_none() && go {
        out.deleted = deletes.count() - failed;
    }
    Ok(())
}

/// Whether the mirror keeps the destination's entry `e`: the send
/// sends it, the filters leave it alone, or the source has it (a file the
/// filters' sizes or ages left out, a directory that held nothing taken).
fn keeps(m: &Mirroring, select: &Select, e: &Listed) -> bool {
    m.sent.contains(&e.path)
        || select.leaves_alone(&e.path, e.kind == EntryKind::Dir)
        || in_source(&m.source, &e.path)
}

/// Whether anything is at `rel` beneath the source directory. Anything
/// but a clear "nothing there" counts as there: a mirror errs on keeping.
fn in_source(source: &OwnedFd, rel: &str) -> bool {
    !matches!(
        rustix::fs::openat2(
            source,
            rel,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        ),
        Err(Errno::NOENT)
    )
}

/// The receiver's listing: ids in order from 0, paths it may name.
fn read_listing(reader: &mut FrameReader, conn: &mut crate::net::Conn) -> Result<Vec<Listed>> {
    let mut listing: Vec<Listed> = Vec::new();
    loop {
        match reader.read(conn)? {
            Frame::Keepalive => {}
            Frame::FilesEnd => return Ok(listing),
            Frame::Files { entries } => {
                for FileEntry {
                    file_id,
                    kind,
                    size,
                    path,
                    ..
                } in entries
                {
                    if file_id as usize != listing.len() || listing.len() >= MAX_ENTRIES {
                        return Err(Violation::new(
                            ViolationKind::Inconsistent,
                            format!(
                                "the mirror's listing gave entry {file_id} where {} was due",
                                listing.len()
                            ),
                        )
                        .into());
                    }
                    crate::fsroot::validate(&path)?;
                    listing.push(Listed { path, kind, size });
                }
            }
            Frame::Error { message, retryable } => {
                return Err(Error::Remote { message, retryable });
            }
            other => {
                return Err(Violation::unexpected(
                    "the mirror's listing",
                    crate::session::describe(&other),
                )
                .into());
            }
        }
    }
}

fn send_removals(conn: &mut crate::net::Conn, deletes: &Deletes) -> Result<()> {
    for ids in deletes.ids.chunks(REMOVE_CHUNK) {
        write_frame(conn, &Frame::Remove { ids: ids.to_vec() })?;
    }
    Ok(())
}

/// The receiver's answers to the removals, until its `Finish`: how many
/// failed, the first of them named in `out`.
fn read_results(
    reader: &mut FrameReader,
    conn: &mut crate::net::Conn,
    listing: &[Listed],
    deletes: &Deletes,
    out: &mut MirrorSummary,
) -> Result<u64> {
    let asked: HashSet<u32> = deletes.ids.iter().copied().collect();
    let mut failed: HashSet<u32> = HashSet::new();
    loop {
        match reader.read(conn)? {
            Frame::Keepalive => {}
            Frame::Finish => return Ok(failed.len() as u64),
            Frame::FileResult {
                file_id,
                ok: false,
                message,
                ..
            } if asked.contains(&file_id) && out.refused.is_none() => {
                if !failed.insert(file_id) {
                    return Err(Violation::new(
                        ViolationKind::Repeated,
                        format!("the removal of entry {file_id} was answered twice"),
                    )
                    .into());
                }
                if out.failures.len() < PLAN_SHOWN {
                    out.failures.push(FileFailure {
                        path: listing[file_id as usize].path.clone(),
                        message,
                    });
                }
            }
            Frame::Error { message, retryable } => {
                return Err(Error::Remote { message, retryable });
            }
            other => {
                return Err(Violation::unexpected(
                    "the mirror's removals answered",
                    crate::session::describe(&other),
                )
                .into());
            }
        }
    }
}
