//! A relay job as the relay takes it: read within its bounds, checked
//! against the relay's roots and its own view of the source, and turned
//! into the session the lead would have run.

use std::ffi::OsStr;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};

use crate::error::{Error, Result};
use crate::sender::SendConfig;
use crate::sender::source::{SourceFile, SourceList, Stamp};
use crate::violation::Violation;
use crate::wire::{
    EntryKind, Frame, MAX_ENTRIES, MAX_FRAME, MAX_MANIFEST_BYTES, RelayEntry, RelayJob, Stripe,
    StripeRole, read_frame_capped,
};

/// What a lead sent: the job, its pieces and its files.
pub(super) struct Received {
    pub(super) job: RelayJob,
    pub(super) stripe: Stripe,
    pub(super) entries: Vec<RelayEntry>,
}

/// Reads a job's frames, bounded as a receiver bounds a manifest (the
/// caller bounds the time).
pub(super) fn read(r: &mut impl std::io::Read) -> Result<Received> {
    let job = match read_frame_capped(r, MAX_FRAME)? {
        Frame::RelayJob(job) => job,
        other => return Err(unexpected("a relay job", &other)),
    };
    let stripe = match read_frame_capped(r, MAX_FRAME)? {
        Frame::Stripe(s) => s,
        other => return Err(unexpected("the job's pieces", &other)),
    };
    let mut entries = Vec::new();
    let mut bytes = 0usize;
    loop {
        match read_frame_capped(r, MAX_FRAME)? {
            Frame::RelayFiles { entries: more } => {
                bytes += more
                    .iter()
                    .map(|e| e.rel.len() + e.entry.path.len())
                    .sum::<usize>();
                entries.extend(more);
                if entries.len() > MAX_ENTRIES || bytes > MAX_MANIFEST_BYTES {
                    return Err(Violation::new(
                        crate::violation::ViolationKind::Excess,
                        format!(
                            "a relay job of more than {MAX_ENTRIES} files or {MAX_MANIFEST_BYTES} bytes of paths"
                        ),
                    )
                    .into());
                }
            }
            Frame::FilesEnd => break,
            other => return Err(unexpected("the job's files", &other)),
        }
    }
    Ok(Received {
        job,
        stripe,
        entries,
    })
}

fn unexpected(expected: &str, got: &Frame) -> Error {
    Violation::unexpected(expected, crate::session::describe(got)).into()
}

/// A directory jobs may read beneath: its path, resolved when the relay
/// started, and a descriptor every job's source is opened beneath.
pub struct Root {
    path: PathBuf,
    fd: OwnedFd,
}

impl Root {
    /// Resolves and opens `path`.
    pub fn open(path: &Path) -> Result<Self> {
        let real = path
            .canonicalize()
            .map_err(|e| Error::io(format!("--allow-root {}", path.display()), e))?;
        let fd = rustix::fs::open(
            &real,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| Error::io(format!("--allow-root {}", path.display()), e.into()))?;
        Ok(Self { path: real, fd })
    }
}

/// The buffer memory a job's session takes (as `sender::send_list`
/// sizes its pools from `template.buffer`), refused when it is over
/// `most` (`RelayConfig::job_memory`: `wirerate relay`'s `--buffer`, or
/// in the cluster what the sender could take): a lead does not choose
/// the relay's memory.
pub(super) fn memory(job: &RelayJob, template: &SendConfig, most: u64) -> Result<u64> {
    let block = u64::from(job.block_size);
    let count = crate::sender::pool_blocks(template.buffer, block, job.streams);
    let need = count.saturating_mul(block);
    if need > most.max(block * 2) || u64::from(job.streams) > MAX_STREAMS {
        return Err(Error::Config(format!(
            "the job's {} streams of {} blocks need {} of buffers, more than this relay allows a job, {} \
             (or over {MAX_STREAMS} streams): send with fewer streams or smaller blocks, or raise the relay's --buffer",
            job.streams,
            crate::units::fmt_bytes(block),
            crate::units::fmt_bytes(need),
            crate::units::fmt_bytes(most),
        )));
    }
    Ok(need)
}

/// Most data streams a relay job may open: any send's bound.
const MAX_STREAMS: u64 = crate::tuning::STREAMS.max;

/// How often, and how far apart, a file that differs from the lead's
/// listing is looked at again before the job is refused: a network file
/// system's attribute cache may show a file touched a moment ago as it
/// was (each look again asks the server, `AT_STATX_FORCE_SYNC`).
const RECHECKS: u32 = 2;
const RECHECK_AFTER: Duration = Duration::from_secs(2);

/// The session `got` asks for, from this relay's view of the source:
/// `template` gives this host's own settings (I/O, buffers, sockets).
/// Refused, with why, when the job reads outside `roots`, or a file here
/// is not the one the lead listed.
pub(super) fn prepare(
    got: Received,
    roots: &[Root],
    template: &SendConfig,
) -> Result<(SendConfig, SourceList)> {
    let Received {
        job,
        stripe,
        entries,
    } = got;
    if stripe.role != StripeRole::Write {
        return Err(Error::Config(format!(
            "a relay runs write sessions only, not {:?}",
            stripe.role
        )));
    }
    let (base_path, base) = open_source(&job.source, roots)?;
    let mut files = Vec::with_capacity(entries.len());
    for (i, e) in entries.into_iter().enumerate() {
        files.push(source_file(&base, &base_path, i, e)?);
    }
    let mut cfg = template.clone();
    cfg.to = job.to;
    cfg.source = base_path.clone();
    cfg.block_size = u64::from(job.block_size);
    cfg.streams = job.streams;
    cfg.per_link = false;
    cfg.verify = job.verify;
    // The lead's mode holds on the relay's leg too: a transfer sent with
    // `Required` never crosses any link in clear.
    cfg.encrypt = cfg.encrypt.max(job.encrypt);
    // And its compression: the relay reads the same data over a link like
    // the lead's.
    cfg.compress = job.compress;
    cfg.max_rate = (job.max_rate > 0).then_some(job.max_rate);
    cfg.retry_for = Duration::from_millis(u64::from(job.retry_ms));
    cfg.refused_for =
        (job.refused_ms > 0).then(|| Duration::from_millis(u64::from(job.refused_ms)));
    cfg.stripe = Some(stripe);
    cfg.synthetic = None;
    cfg.validate()?;
    let list = SourceList {
        files,
        skipped: Vec::new(),
        filtered: 0,
        hard_links: 0,
        base: Arc::new(base),
        base_path,
    };
    Ok((cfg, list))
}

/// The job's source directory, opened beneath the root it names by its
/// path, with no symlink followed: the path is the lead's resolved one,
/// so a link in it here is another file system's, or a swap.
fn open_source(source: &str, roots: &[Root]) -> Result<(PathBuf, OwnedFd)> {
    let path = Path::new(source);
    let plain = path
        .components()
        .skip(1)
        .all(|c| matches!(c, Component::Normal(_)));
    if !path.is_absolute() || !plain {
        return Err(Error::Config(format!(
            "a relay job names the source {source:?}, which is not an absolute path without . or .."
        )));
    }
    let Some((root, rest)) = roots
        .iter()
        .find_map(|r| path.strip_prefix(&r.path).ok().map(|rest| (r, rest)))
    else {
        let allowed: Vec<String> = roots.iter().map(|r| r.path.display().to_string()).collect();
        return Err(Error::Config(format!(
            "{source} is not beneath this relay's --allow-root ({}); allow it there, or send from within it",
            allowed.join(", ")
        )));
    };
    let rest = if rest.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rest
    };
    let fd = rustix::fs::openat2(
        &root.fd,
        rest,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|e| Error::io(format!("the relay opening {source}"), e.into()))?;
    Ok((path.to_path_buf(), fd))
}

/// Entry `i` of the job, looked at here beneath `base` (without opening
/// it for reading: the session does, as any send does), and refused
/// unless it is the version the lead listed.
fn source_file(base: &OwnedFd, base_path: &Path, i: usize, e: RelayEntry) -> Result<SourceFile> {
    let rel = PathBuf::from(OsStr::from_bytes(&e.rel));
    let shown = base_path.join(&rel);
    let plain = rel.components().all(|c| matches!(c, Component::Normal(_)));
    if e.entry.file_id as usize != i
        || e.entry.kind != EntryKind::File
        || !plain
        || e.rel.is_empty()
    {
        return Err(Error::Config(format!(
            "a relay job holds an entry it cannot run: {} (file {}, {:?})",
            shown.display(),
            e.entry.file_id,
            e.entry.kind
        )));
    }
    let mut rechecks = 0;
    let (stamp, size) = loop {
        let st = stat_beneath(base, &rel, &shown, rechecks > 0)?;
        let stamp = Stamp::of_stat(&st);
        let regular = rustix::fs::FileType::from_raw_mode(st.st_mode).is_file();
        if regular && stamp.size == e.entry.size && stamp.fingerprint() == e.entry.fingerprint {
            break (stamp, stamp.size);
        }
        if !regular {
            return Err(Error::Config(format!(
                "{}: not a regular file on the relay (a link, a directory or a device), where the lead listed one",
                shown.display()
            )));
        }
        if rechecks == RECHECKS {
            return Err(Error::Config(format!(
                "{}: the relay does not see the file the lead listed ({} bytes here, {} there, or another \
                 modification time): the sending hosts do not share this storage, or it changed; \
                 a transfer over several sending hosts needs one file system seen by all of them",
                shown.display(),
                stamp.size,
                e.entry.size
            )));
        }
        rechecks += 1;
        std::thread::sleep(RECHECK_AFTER);
    };
    Ok(SourceFile {
        path: shown,
        rel,
        dest: e.entry.path,
        kind: EntryKind::File,
        size,
        mode: e.entry.mode,
        stamp,
    })
}

/// `rel`'s attributes, opened beneath `base` without following a link;
/// `fresh` asks a network file system's server rather than its cache.
fn stat_beneath(base: &OwnedFd, rel: &Path, shown: &Path, fresh: bool) -> Result<rustix::fs::Stat> {
    let fd = rustix::fs::openat2(
        base,
        rel,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|err| Error::io(format!("the relay opening {}", shown.display()), err.into()))?;
    if fresh {
        // Refreshes the cached attributes the fstat below reads.
        let flags = AtFlags::EMPTY_PATH | AtFlags::STATX_FORCE_SYNC;
        let _ = rustix::fs::statx(&fd, "", flags, rustix::fs::StatxFlags::BASIC_STATS);
    }
    rustix::fs::fstat(&fd)
        .map_err(|err| Error::io(format!("the relay reading {}", shown.display()), err.into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{FileEntry, StripePiece, Verification};

    fn job(source: &Path) -> RelayJob {
        RelayJob {
            to: "127.0.0.1:1".into(),
            source: source.display().to_string(),
            block_size: 1 << 20,
            streams: 2,
            verify: Verification::Checksums,
            max_rate: 0,
            retry_ms: 1000,
            refused_ms: 0,
            encrypt: crate::encryption::Encryption::None,
            compress: crate::compress::Compression::Zstd,
        }
    }

    fn entry(rel: &str, size: u64, fingerprint: u64) -> RelayEntry {
        RelayEntry {
            entry: FileEntry {
                file_id: 0,
                kind: EntryKind::File,
                size,
                fingerprint,
                mode: 0o644,
                mtime: (0, 0),
                digest: None,
                meta: None,
                path: "out".into(),
            },
            rel: rel.as_bytes().to_vec(),
        }
    }

    fn received(source: &Path, e: RelayEntry) -> Received {
        Received {
            job: job(source),
            stripe: Stripe {
                group: 1,
                role: StripeRole::Write,
                pieces: vec![StripePiece {
                    file_id: 0,
                    first: 0,
                    end: 1,
                }],
            },
            entries: vec![e],
        }
    }

    /// A source directory holding `f` (5 bytes) beneath a root, and that
    /// file's fingerprint.
    fn source() -> (tempfile::TempDir, PathBuf, u64) {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        std::fs::create_dir(&src).unwrap();
        std::fs::write(src.join("f"), b"hello").unwrap();
        std::fs::write(dir.path().join("secret"), b"keep out").unwrap();
        let m = std::fs::metadata(src.join("f")).unwrap();
        let fp = Stamp::of(&m).fingerprint();
        let root = dir.path().canonicalize().unwrap();
        (dir, root, fp)
    }

    fn roots(paths: &[PathBuf]) -> Vec<Root> {
        paths.iter().map(|p| Root::open(p).unwrap()).collect()
    }

    fn refused(got: Received, roots: &[PathBuf]) -> String {
        let roots = self::roots(roots);
        let template = SendConfig::new("", vec![1; 32], "", "");
        match prepare(got, &roots, &template) {
            Ok(_) => panic!("a job that should be refused was taken"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_job_of_the_listed_file_beneath_the_roots_is_taken() {
        let (_d, root, fp) = source();
        let template = SendConfig::new("", vec![1; 32], "", "");
        let got = received(&root.join("src"), entry("f", 5, fp));
        let (cfg, list) = prepare(got, &roots(std::slice::from_ref(&root)), &template).unwrap();
        assert_eq!(cfg.to, "127.0.0.1:1");
        assert_eq!(cfg.block_size, 1 << 20);
        // The lead's compression, not the relay's default (`auto`).
        assert_eq!(cfg.compress, crate::compress::Compression::Zstd);
        assert_eq!(list.files[0].dest, "out");
        assert_eq!(list.files[0].size, 5);
    }

    /// A lead that requires encryption holds the relay's leg to it too,
    /// whatever the relay's own mode; the stricter of the two holds.
    #[test]
    fn the_relays_leg_runs_under_the_stricter_of_the_two_modes() {
        use crate::encryption::Encryption::{None as Off, Preferred, Required};
        let (_d, root, fp) = source();
        for (own, lead, runs) in [
            (Preferred, Required, Required),
            (Off, Required, Required),
            (Required, Off, Required),
            (Off, Off, Off),
        ] {
            let mut template = SendConfig::new("", vec![1; 32], "", "");
            template.encrypt = own;
            let mut got = received(&root.join("src"), entry("f", 5, fp));
            got.job.encrypt = lead;
            let (cfg, _) = prepare(got, &roots(std::slice::from_ref(&root)), &template).unwrap();
            assert_eq!(cfg.encrypt, runs, "relay {own}, lead {lead}");
        }
    }

    #[test]
    fn a_job_outside_the_roots_or_escaping_its_source_is_refused() {
        let (_d, root, fp) = source();
        let src = root.join("src");
        let roots = [src.clone()];
        // The source itself outside the roots, and a relative one.
        let why = refused(received(&root, entry("secret", 8, fp)), &roots);
        assert!(
            why.contains("not beneath this relay's --allow-root"),
            "{why}"
        );
        let why = refused(received(Path::new("src"), entry("f", 5, fp)), &roots);
        assert!(why.contains("not an absolute path"), "{why}");
        // An entry that climbs out of its source, or is absolute.
        for rel in ["../secret", "/etc/passwd", ""] {
            let why = refused(received(&src, entry(rel, 8, fp)), &roots);
            assert!(why.contains("an entry it cannot run"), "{rel}: {why}");
        }
        // A symlink beneath the source that leads out of it.
        std::os::unix::fs::symlink(root.join("secret"), src.join("link")).unwrap();
        let why = refused(received(&src, entry("link", 8, fp)), &roots);
        assert!(why.contains("not a regular file on the relay"), "{why}");
    }

    #[test]
    fn a_file_that_is_not_the_one_the_lead_listed_is_refused() {
        let (_d, root, fp) = source();
        let src = root.join("src");
        let roots = [root.clone()];
        let why = refused(received(&src, entry("f", 6, fp)), &roots);
        assert!(
            why.contains("does not see the file the lead listed"),
            "{why}"
        );
        let why = refused(received(&src, entry("f", 5, fp ^ 1)), &roots);
        assert!(
            why.contains("does not see the file the lead listed"),
            "{why}"
        );
    }

    #[test]
    fn a_lead_cannot_size_the_relays_buffers_past_its_own() {
        let mut template = SendConfig::new("", vec![1; 32], "", "");
        template.buffer = 64 << 20;
        let mut j = job(Path::new("/"));
        j.block_size = 4 << 20;
        j.streams = 4;
        assert_eq!(memory(&j, &template, template.buffer).unwrap(), 64 << 20);
        // 2 x 256 + 2 blocks of 4 MiB: 2 GiB, over the relay's 64 MiB.
        j.streams = 256;
        let why = memory(&j, &template, template.buffer)
            .unwrap_err()
            .to_string();
        assert!(
            why.contains("more than this relay allows a job, 64.00 MiB"),
            "{why}"
        );
        j.streams = 4;
        j.block_size = 64 << 20;
        assert!(memory(&j, &template, template.buffer).is_err());
        // Allowed more (an in-cluster relay, as its sender would take):
        // 16 streams of 4 MiB blocks, 136 MiB, fit under 256 MiB.
        j.block_size = 4 << 20;
        j.streams = 16;
        assert!(memory(&j, &template, template.buffer).is_err());
        assert_eq!(memory(&j, &template, 256 << 20).unwrap(), 136 << 20);
    }

    #[test]
    fn only_write_sessions_are_relayed() {
        let (_d, root, fp) = source();
        let mut got = received(&root.join("src"), entry("f", 5, fp));
        got.stripe.role = StripeRole::Publish;
        let why = refused(got, std::slice::from_ref(&root));
        assert!(why.contains("write sessions only"), "{why}");
    }
}
