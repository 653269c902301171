//! The sender's side of a mirror (`send --delete`): once every file has
//! landed, it has the receiver list the destination directory, decides
//! what the source no longer has (`mirror::plan`), checks the guard
//! (`mirror::check`), and has the receiver remove it. A dry run stops
//! after the plan.

use std::collections::HashSet;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use super::SendConfig;
use super::connect::connect;
use super::select::Select;
use super::source::SourceList;
use crate::error::{Error, Result};
use crate::mirror::{Guard, Listed, check, plan};
use crate::summary::{FileFailure, MirrorSummary, PLAN_SHOWN};
use crate::violation::{Violation, ViolationKind};
use crate::wire::{
    EntryKind, FileEntry, Frame, FrameReader, IDLE_TIMEOUT, KEEPALIVE_INTERVAL, MAX_ENTRIES,
    MAX_MANIFEST_BYTES, Purpose, write_frame,
};

/// Most ids one `Remove` frame carries (256 KiB of them).
const REMOVE_CHUNK: usize = 1 << 16;

/// What a mirror needs of the source's listing: taken before the send,
/// so that a source a mirror cannot use is refused before any data moves.
pub(crate) struct Mirroring {
    /// The destination directory, relative to the receiver's root.
    base: String,
    /// What the send sends, relative to `base`, in lower case: a
    /// destination that folds case (or a name that differs from a sent
    /// one in case alone) is kept, never taken for an extra.
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
                .filter_map(|f| f.dest.strip_prefix(&prefix).map(str::to_lowercase))
                .collect(),
            // What the filters left out is still the source's: a fresh
            // run directory that --min-age empties is no emptied source.
            files: list
                .files
                .iter()
                .filter(|f| f.kind == EntryKind::File)
                .count()
                + list.filtered,
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
    not_cancelled(cfg)?;
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
    let listing = read_listing(cfg, &mut reader, &mut conn)?;
    // Looking at the source for each entry may take a while on a slow
    // file system: the receiver hears from this side meanwhile.
    let mut beat = Instant::now();
    let mut kept = Vec::with_capacity(listing.len());
    for e in &listing {
        if beat.elapsed() >= KEEPALIVE_INTERVAL {
            write_frame(&mut conn, &Frame::Keepalive)?;
            beat = Instant::now();
        }
        kept.push(keeps(m, &select, e));
    }
    let deletes = plan(&listing, &kept);
    out.files = deletes.files;
    out.dirs = deletes.dirs;
    out.bytes = deletes.bytes;
    out.paths = deletes
        .ids
        .iter()
        .take(PLAN_SHOWN)
        .map(|id| listing[*id as usize].path.clone())
        .collect();
    let mut asked: &[u32] = &[];
    if let Err(refusal) = check(&deletes, guard, m.files) {
        out.refused = Some(refusal.to_string());
    } else if !dry && deletes.count() > 0 {
        not_cancelled(cfg)?;
        asked = &deletes.ids;
    }
    let answered = send_removals(&mut conn, asked)
        .and_then(|()| write_frame(&mut conn, &Frame::Finish))
        .and_then(|()| read_results(cfg, &mut reader, &mut conn, &listing, asked, out));
    match answered {
        Ok(failed) => {
            out.failed = failed;
            out.deleted = asked.len() as u64 - failed;
            Ok(())
        }
        Err(e) if !asked.is_empty() => Err(Error::ConnectionLost(format!(
            "{e}, after asking for {} deletes: some may be done",
            asked.len()
        ))),
        Err(e) => Err(e),
    }
}

/// Refuses to go on once the send is cancelled (its Transfer moved or
/// was deleted): a mirror asks for no deletes after that.
fn not_cancelled(cfg: &SendConfig) -> Result<()> {
    match super::cancelled(cfg) {
        true => Err(Error::Cancelled {
            last: Box::new(Error::Internal(
                "the mirror was about to go on, and deleted nothing more".into(),
            )),
        }),
        false => Ok(()),
    }
}

/// Whether the mirror keeps the destination's entry `e`: the send
/// sends it (in any case), the filters leave it alone, or the source has it (a file the
/// filters' sizes or ages left out, a directory that held nothing taken).
fn keeps(m: &Mirroring, select: &Select, e: &Listed) -> bool {
    m.sent.contains(&e.path.to_lowercase())
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

/// The receiver's listing: ids in order from 0, paths it may name, at
/// most what one manifest may carry.
fn read_listing(
    cfg: &SendConfig,
    reader: &mut FrameReader,
    conn: &mut crate::net::Conn,
) -> Result<Vec<Listed>> {
    let mut listing: Vec<Listed> = Vec::new();
    let mut bytes = 0usize;
    loop {
        match next(cfg, reader, conn)? {
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
                    bytes += path.len();
                    if file_id as usize != listing.len()
                        || listing.len() >= MAX_ENTRIES
                        || bytes > MAX_MANIFEST_BYTES
                    {
                        return Err(Violation::new(
                            ViolationKind::Inconsistent,
                            format!(
                                "the mirror's listing gave entry {file_id} where {} was due, \
                                 or more than a manifest carries",
                                listing.len()
                            ),
                        )
                        .into());
                    }
                    crate::fsroot::validate(&path)?;
                    listing.push(Listed { path, kind, size });
                }
            }
            other => return Err(unexpected("the mirror's listing", &other)),
        }
    }
}

/// The receiver's next frame but keepalives, unless the send was
/// cancelled; its `Error` as the error it reports.
fn next(cfg: &SendConfig, reader: &mut FrameReader, conn: &mut crate::net::Conn) -> Result<Frame> {
    loop {
        not_cancelled(cfg)?;
        match reader.read(conn)? {
            Frame::Keepalive => {}
            Frame::Error { message, retryable } => {
                return Err(Error::Remote { message, retryable });
            }
            frame => return Ok(frame),
        }
    }
}

fn unexpected(expected: &str, got: &Frame) -> Error {
    Violation::unexpected(expected, crate::session::describe(got)).into()
}

fn send_removals(conn: &mut crate::net::Conn, ids: &[u32]) -> Result<()> {
    for ids in ids.chunks(REMOVE_CHUNK) {
        write_frame(conn, &Frame::Remove { ids: ids.to_vec() })?;
    }
    Ok(())
}

/// The receiver's answers to the removals, until its `Finish`: how many
/// failed, the first of them named in `out`.
fn read_results(
    cfg: &SendConfig,
    reader: &mut FrameReader,
    conn: &mut crate::net::Conn,
    listing: &[Listed],
    asked: &[u32],
    out: &mut MirrorSummary,
) -> Result<u64> {
    let asked: HashSet<u32> = asked.iter().copied().collect();
    let mut failed: HashSet<u32> = HashSet::new();
    loop {
        match next(cfg, reader, conn)? {
            Frame::Finish => return Ok(failed.len() as u64),
            Frame::FileResult {
                file_id,
                ok: false,
                message,
                ..
            } if asked.contains(&file_id) => {
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
            other => return Err(unexpected("the mirror's removals answered", &other)),
        }
    }
}
