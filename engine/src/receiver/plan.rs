//! The plan's decisions, entry by entry: which of the manifest's entries
//! the session takes, and what it keeps for each it takes.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::Shared;
use super::dest::{Prepared, Staged, prepare, prepare_piece, prepare_publish};
use super::stats::Stats;
use crate::Layout;
use crate::by_id::ById;
use crate::digest::digest_of;
use crate::fsroot::validate;
use crate::sync::{Found, SyncLevel, Wanted, needs_digest, present};
use crate::wire::{EntryKind, FileEntry, MAX_BLOCKS_PER_SESSION, PlanOutcome, Stripe, StripeRole};

/// What a session of a transfer over several pairs does with each file.
enum Part {
    /// Writes blocks `first..end` of each file, by id.
    Pieces(HashMap<u32, (u64, u64)>),
    /// Publishes what the others wrote.
    Publish,
}

/// What the plan leaves the session.
pub(super) struct Plan<'a> {
    /// The accepted files, for the writer.
    pub(super) files: Staged<'a>,
    /// The accepted files' sizes, which place their blocks.
    pub(super) sizes: ById<u64>,
    /// Bytes of the accepted files already here from earlier sessions.
    pub(super) resumed_bytes: u64,
    /// In a transfer over several pairs, the blocks `first..end` the
    /// session writes of each file, by id.
    pub(super) pieces: HashMap<u32, (u64, u64)>,
}

/// Decides each manifest entry in turn.
pub(super) struct Planner<'a> {
    shared: &'a Shared,
    block_size: u64,
    /// A memory-to-memory session: nothing is created.
    discard: bool,
    /// A dry run: nothing is created either, and no block follows.
    dry_run: bool,
    /// Which files already here are answered present, not taken.
    sync: SyncLevel,
    stats: &'a Stats,
    files: Staged<'a>,
    sizes: Vec<(u32, u64)>,
    resumed_bytes: u64,
    /// Blocks of the accepted files: the receiver holds state for each.
    tracked: u64,
    /// Set in a transfer over several pairs.
    part: Option<Part>,
    /// Until when blocks a per-chunk checkpoint holds are read back to
    /// confirm them: the sender waits for the plan, and on slow shared
    /// storage a chunk's worth of reads could outlast its patience.
    confirm_by: Instant,
    /// What of the sent owners and attributes was left, said once each.
    not_kept: Vec<crate::metadata::NotKept>,
}

/// How long a plan may spend reading back checkpointed blocks; those not
/// confirmed by then are sent again.
const CONFIRM_BUDGET: Duration = Duration::from_secs(5);

impl<'a> Planner<'a> {
    /// A planner for a manifest of `entries` entries.
    pub(super) fn new(
        shared: &'a Shared,
        entries: usize,
        block_size: u64,
        (discard, dry_run): (bool, bool),
        sync: SyncLevel,
        stats: &'a Stats,
        stripe: Option<&Stripe>,
    ) -> Self {
        let part = stripe.map(|s| match s.role {
            StripeRole::Mark | StripeRole::Write => Part::Pieces(s.ranges()),
            StripeRole::Publish | StripeRole::Unmark => Part::Publish,
        });
        let files = Staged::with_capacity(&shared.root, entries);
        Self {
            shared,
            block_size,
            discard,
            dry_run,
            sync,
            stats,
            // Sized for the whole manifest at once: a table grown by
            // doubling would leave its outgrown copies as holes in the heap.
            files: if part.is_some() {
                files.shared_with_others()
            } else {
                files
            },
            sizes: Vec::with_capacity(entries),
            resumed_bytes: 0,
            tracked: 0,
            part,
            confirm_by: Instant::now() + CONFIRM_BUDGET,
            not_kept: Vec::new(),
        }
    }

    /// Decides entry `e`, whose identity as it arrived is `identity`;
    /// `repeated` when an earlier entry has its path. `still_here` is
    /// called while a long decision reads (a checksum sync's digest), so
    /// that the sender keeps hearing from this side.
    pub(super) fn decide(
        &mut self,
        e: &FileEntry,
        (identity, repeated): (u64, bool),
        still_here: &mut dyn FnMut() -> bool,
    ) -> PlanOutcome {
        let tracked = self.tracked;
        // Looked at before `prepare` makes it; a plan that makes
        // nothing sets nothing.
        let meta = match self.dry_run || self.discard {
            true => None,
            false => self.admit(e),
        };
        let blocks = if e.kind == EntryKind::File {
            Layout::new(e.size, self.block_size).blocks()
        } else {
            0
        };
        let outcome = if repeated {
            Prepared::Refuse(format!("{} appears twice in the manifest", e.path))
        } else if !self.discard && self.is_present(e, still_here) {
            // Before the session's block budget: a file left as it is
            // costs the session nothing.
            Prepared::Present
        } else if tracked + blocks > MAX_BLOCKS_PER_SESSION {
            Prepared::Refuse(format!(
                "the session already tracks {tracked} blocks and {} needs {blocks} more, past the {MAX_BLOCKS_PER_SESSION} one session may track; send it with a larger --block-size or in a transfer of its own",
                e.path
            ))
        } else if self.discard {
            super::discard::plan(e, tracked + blocks)
        } else if self.dry_run {
            super::dest::prepare_dry(&self.shared.root, e, self.block_size)
        } else {
            let (root, umask) = (&self.shared.root, self.shared.cfg.umask);
            match &self.part {
                None => prepare(root, e, self.block_size, umask),
                Some(_) if e.kind == EntryKind::Dir => prepare(root, e, self.block_size, umask),
                Some(Part::Pieces(pieces)) => {
                    // The core checked that every regular file has one.
                    let range = pieces.get(&e.file_id).copied().unwrap_or((0, 0));
                    prepare_piece(root, e, (self.block_size, umask), range, self.confirm_by)
                }
                Some(Part::Publish) => prepare_publish(root, e, self.block_size, umask),
            }
        };
        match outcome {
            Prepared::Accept(mut file, have, resumed) => {
                file.identity = identity;
                if let Some(m) = meta {
                    file.set_meta(m);
                }
                self.tracked += blocks;
                // The blocks a piece leaves to other receivers were not
                // resumed here; those of its own that a per-chunk
                // checkpoint holds were.
                self.resumed_bytes += match &self.part {
                    None => file.layout.bytes_in(&have),
                    Some(Part::Pieces(pieces)) => {
                        let (first, end) = pieces.get(&e.file_id).copied().unwrap_or((0, 0));
                        file.layout.bytes_in_range(&have, first..end)
                    }
                    Some(Part::Publish) => 0,
                };
                self.stats
                    .total
                    .fetch_add(file.layout.size, Ordering::Relaxed);
                self.sizes.push((e.file_id, file.layout.size));
                self.files.insert(e.file_id, file, resumed);
                PlanOutcome::Accept {
                    have: have.to_bytes(),
                }
            }
            Prepared::Discard => {
                self.tracked += blocks;
                self.stats.total.fetch_add(e.size, Ordering::Relaxed);
                self.sizes.push((e.file_id, e.size));
                PlanOutcome::Accept {
                    have: crate::Bitmap::new(blocks).to_bytes(),
                }
            }
            Prepared::WouldWrite => {
                // Counted as the session's to write, so that its summary
                // says what a run would; never staged for the writer.
                self.tracked += blocks;
                self.stats.total.fetch_add(e.size, Ordering::Relaxed);
                PlanOutcome::Accept {
                    have: crate::Bitmap::new(blocks).to_bytes(),
                }
            }
            Prepared::Present => {
                self.stats.present.fetch_add(1, Ordering::Relaxed);
                // A dry run's plan is no part of the job's progress.
                if !self.dry_run {
                    self.shared.job.present.fetch_add(e.size, Ordering::Relaxed);
                }
                tracing::debug!(path = %e.path, level = %self.sync, "already here: not sent");
                PlanOutcome::Present
            }
            Prepared::Refuse(message) => {
                // A memory-to-memory test's file is no file failed here,
                // nor a file a dry run would refuse.
                if !self.discard && !self.dry_run {
                    self.shared.cfg.observer.file_done(false);
                }
                self.stats.refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(path = %e.path, "refused: {message}");
                PlanOutcome::Refuse { message }
            }
        }
    }

    /// What of `e`'s sent owner and attributes this receiver sets, if
    /// any; what it leaves is said once a session for each reason. A
    /// directory takes them only if a session of this receiver made it
    /// (`Shared::made_dirs`): one that was there before keeps its own.
    fn admit(&mut self, e: &FileEntry) -> Option<crate::wire::Meta> {
        let m = e.meta.as_ref()?;
        if e.kind == EntryKind::Dir && !self.shared.made_dirs.made(&self.shared.root, &e.path) {
            return None;
        }
        let cfg = &self.shared.cfg;
        let (admitted, left) = crate::metadata::admitted((**m).clone(), cfg.owners, cfg.acls);
        for why in left {
            if !self.not_kept.contains(&why) {
                tracing::warn!("{why}");
                self.not_kept.push(why);
            }
        }
        Some(admitted)
    }

    /// Whether regular file `e` is already at its destination, as the
    /// session's sync level compares. A session of a transfer over
    /// several pairs takes every file: its receivers share the files'
    /// temporary copies (and `pairs` refuses a level).
    fn is_present(&self, e: &FileEntry, still_here: &mut dyn FnMut() -> bool) -> bool {
        if self.sync == SyncLevel::None || e.kind != EntryKind::File || self.part.is_some() {
            return false;
        }
        // A name that does not validate is refused by `prepare`, saying why.
        let Ok(dest) = validate(&e.path) else {
            return false;
        };
        let root = &self.shared.root;
        let mut found = root.stat(&dest.rel).map(|st| Found {
            regular: rustix::fs::FileType::from_raw_mode(st.st_mode)
                == rustix::fs::FileType::RegularFile,
            size: st.st_size.max(0) as u64,
            mtime: (st.st_mtime, st.st_mtime_nsec as u32),
            digest: None,
        });
        let wanted = Wanted {
            size: e.size,
            mtime: e.mtime,
            digest: e.digest.map(u128::from_le_bytes),
        };
        if needs_digest(self.sync, found.as_ref(), &wanted)
            && let Some(f) = &mut found
        {
            // Read as it is now, and only if it is still the size it was
            // and stayed so: a file that changed meanwhile is sent.
            f.digest = root
                .open_read(&dest.rel)
                .filter(|(_, size)| *size == f.size)
                .and_then(|(mut file, _)| {
                    let d = digest_of(&mut file, f.size, self.block_size, still_here).ok()?;
                    let after = rustix::fs::fstat(&file).ok()?;
                    (after.st_size.max(0) as u64 == f.size).then_some(d)
                });
        }
        present(self.sync, found, wanted)
    }

    /// The plan, once every entry is decided.
    pub(super) fn finish(self) -> Plan<'a> {
        Plan {
            files: self.files,
            sizes: self.sizes.into_iter().collect(),
            resumed_bytes: self.resumed_bytes,
            pieces: match self.part {
                Some(Part::Pieces(pieces)) => pieces,
                _ => HashMap::new(),
            },
        }
    }
}
