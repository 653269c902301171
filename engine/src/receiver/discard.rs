//! The writer of a memory-to-memory session (`send --synthetic` to a
//! receiver started with `--allow-discard`): it takes the blocks the data
//! streams verified, acknowledges each at once and drops it, and answers
//! every reported file from the checksums of its blocks, as the writer
//! does, without a disk. Nothing is created beneath the root.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use super::dest::Prepared;
use super::stats::Stats;
use super::verdicts::{Answer, VerdictTx};
use super::writer::{Report, WriterMsg};
use crate::Layout;
use crate::digest::fmt_digest;
use crate::error::{Error, Result};
use crate::fsroot::validate;
use crate::io::IoMode;
use crate::observe::Observe;
use crate::session::reports::{Reported, Reports, digest_agrees};
use crate::tracker::FileTracker;
use crate::violation::{Violation, ViolationKind};
use crate::wire::{EntryKind, FileEntry, Frame, Verification};

/// Most blocks a memory-to-memory session may carry. The receiver keeps
/// a checksum and two bits for each; a file to write bounds that by the
/// space it must reserve on disk, and nothing bounds a test's but this
/// (8 MiB of checksums at this cap: 16 TiB in 16 MiB blocks).
pub(crate) const MAX_DISCARD_BLOCKS: u64 = 1 << 20;

/// Whether a memory-to-memory session may send `e`, which brings the
/// session's blocks to `blocks_after`: a file with a well-formed name
/// (only logged; nothing is created under it), within the block cap.
pub(crate) fn plan(e: &FileEntry, blocks_after: u64) -> Prepared {
    if e.kind != EntryKind::File {
        return Prepared::Refuse(format!(
            "{}: a memory-to-memory test sends files only",
            e.path
        ));
    }
    if blocks_after > MAX_DISCARD_BLOCKS {
        return Prepared::Refuse(format!(
            "{}: a memory-to-memory test carries at most {MAX_DISCARD_BLOCKS} blocks; send less \
             (--synthetic) or in larger blocks (--block-size)",
            e.path
        ));
    }
    match validate(&e.path) {
        Ok(_) => Prepared::Discard,
        Err(err) => Prepared::Refuse(err.to_string()),
    }
}

pub(crate) struct Discard {
    files: HashMap<u32, FileTracker>,
    rx: mpsc::Receiver<WriterMsg>,
    verdicts: VerdictTx,
    verify: Verification,
    stats: Arc<Stats>,
    observer: Observe,
    reports: Reports,
    /// The receiver's I/O mode, which the summary shows (nothing used it).
    io_mode: IoMode,
}

impl Discard {
    pub(crate) fn new(
        layouts: impl Iterator<Item = (u32, Layout)>,
        rx: mpsc::Receiver<WriterMsg>,
        verdicts: VerdictTx,
        verify: Verification,
        stats: Arc<Stats>,
        observer: Observe,
        io_mode: IoMode,
    ) -> Self {
        Self {
            files: layouts
                .map(|(id, l)| (id, FileTracker::new(l.blocks(), None)))
                .collect(),
            rx,
            verdicts,
            verify,
            stats,
            observer,
            // Its plan asks for every block, so no report can wait for
            // one the sender believes is here: no stall to look for.
            reports: Reports::new(Duration::MAX),
            io_mode,
        }
    }

    pub(crate) fn run(mut self) -> Report {
        let result = super::verdicts::unwound(|| self.work());
        self.verdicts.send_failure(&result);
        Report {
            io_mode: self.io_mode,
            fallback: None,
            error: result.err().map(|e| e.to_string()),
            warnings: Vec::new(),
        }
    }

    fn work(&mut self) -> Result<()> {
        // A closed channel is the session's end, as `Stop` is.
        while let Ok(msg) = self.rx.recv() {
            match msg {
                WriterMsg::Block {
                    file_id,
                    block,
                    buf,
                    checksum,
                    ack,
                } => {
                    let len = buf.len() as u64;
                    drop(buf);
                    // A late copy of a block of an answered file is acked
                    // and dropped, as the writer does.
                    if !self.reports.is_answered(file_id) {
                        let t = self.files.get_mut(&file_id).ok_or_else(|| {
                            Error::from(Violation::new(
                                ViolationKind::Unknown,
                                format!("block for finished or unknown file {file_id}"),
                            ))
                        })?;
                        t.handle_written(block, checksum);
                        self.stats.bytes.fetch_add(len, Ordering::Relaxed);
                        self.observer.discarded(len);
                    }
                    let _ = ack.send(Frame::Ack { file_id, block });
                }
                WriterMsg::FileDone(report) => {
                    self.reports.handle_reported(report, Instant::now());
                }
                WriterMsg::Abort { file_id, message } => {
                    self.reports.handle_given_up(file_id);
                    self.files.remove(&file_id).ok_or_else(|| {
                        Error::from(Violation::new(
                            ViolationKind::Unknown,
                            format!("file {file_id} given up after its result, or never planned"),
                        ))
                    })?;
                    self.verdicts.answer(
                        &self.stats,
                        None,
                        Answer {
                            file_id,
                            ok: false,
                            digest: 0,
                            identity: 0,
                            message,
                        },
                    );
                }
                WriterMsg::Stop => return Ok(()),
            }
            self.answer_ready()?;
        }
        Ok(())
    }

    /// Answers the reported files whose blocks have all arrived.
    fn answer_ready(&mut self) -> Result<()> {
        let files = &self.files;
        let ready = self
            .reports
            .poll_ready(|id| files.get(&id).is_none_or(FileTracker::is_complete));
        for Reported {
            file_id,
            digest: theirs,
            identity,
        } in ready
        {
            let t = self.files.remove(&file_id).ok_or_else(|| {
                Error::from(Violation::new(
                    ViolationKind::Unknown,
                    format!("file {file_id} reported done twice or never planned"),
                ))
            })?;
            self.reports.handle_answered(file_id);
            let ours = if self.verify == Verification::None {
                0
            } else {
                t.digest()
            };
            let (ok, message) = if digest_agrees(self.verify, ours, theirs) {
                (true, String::new())
            } else {
                let m = format!(
                    "digest mismatch (received {}, sent {}): the memory-to-memory test's data was damaged on the way",
                    fmt_digest(ours),
                    fmt_digest(theirs)
                );
                tracing::error!("{m}");
                (false, m)
            };
            // Nothing is published under any name: the sender's identity
            // is echoed.
            self.verdicts.answer(
                &self.stats,
                None,
                Answer {
                    file_id,
                    ok,
                    digest: ours,
                    identity,
                    message,
                },
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(kind: EntryKind, path: &str) -> FileEntry {
        FileEntry {
            file_id: 1,
            kind,
            size: 1 << 30,
            fingerprint: 0,
            mode: 0o644,
            mtime: (0, 0),
            digest: None,
            meta: None,
            path: path.into(),
        }
    }

    #[test]
    fn a_test_may_send_well_named_files_within_the_block_cap_only() {
        let file = entry(EntryKind::File, "synthetic");
        assert!(matches!(plan(&file, 1024), Prepared::Discard));
        assert!(matches!(plan(&file, MAX_DISCARD_BLOCKS), Prepared::Discard));
        let refused = |p: Prepared| match p {
            Prepared::Refuse(m) => m,
            _ => panic!("accepted"),
        };
        assert!(refused(plan(&file, MAX_DISCARD_BLOCKS + 1)).contains("--block-size"));
        assert!(refused(plan(&entry(EntryKind::Dir, "d"), 0)).contains("files only"));
        // Never created, but a name no real session could use is refused
        // the same way.
        refused(plan(&entry(EntryKind::File, "../escape"), 1));
        refused(plan(&entry(EntryKind::File, "/abs"), 1));
    }
}
