//! The coordinator of one Transfer over several pairs: an I/O-free state
//! machine. Feed it what the pairs report, with `now`; poll it for what
//! to tell them.
//!
//! Work is handed out from one queue, a few items ahead per pair. A pair
//! that runs dry with the queue empty takes from the pair that will
//! finish last, in proportion to their rates, cut on a grain (stripe)
//! boundary. A lost pair's unacknowledged blocks go back to the front of
//! the queue; a pair that leaves (its pool scaled down) is told to stop
//! and its unfinished work goes back the same way. Acknowledged blocks
//! are durable at the shared destination and are never handed out again.
//!
//! A file is verified, and then published or given up, only when every
//! block is acknowledged and nothing can write to it any more: every item
//! that held a piece of it has finished, or its pair has stopped or is
//! past its fence (the time after which an agent that lost its lease has
//! stopped writing). So a pair thought lost that still writes cannot
//! change a file after it is checked.

use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;

use super::ledger::{FileLedger, GiveUp, Ready};
use super::pairs::{ItemId, Pair, PairId, PairState, PairView, thief_share};
use super::split::{Geometry, Piece, Work};

/// The most pairs one Transfer runs on.
pub const MAX_PAIRS: usize = 64;

/// What to tell the pairs, or the publisher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Hand `work` to `pair` as `item`. It works through it in order,
    /// acknowledges runs of blocks as they are durable and right, and says
    /// when it has finished with the item.
    Assign {
        /// Who.
        pair: PairId,
        /// The item's id.
        item: ItemId,
        /// Its pieces.
        work: Work,
    },
    /// `pair` keeps only `keep` of `item`; another pair has the rest.
    /// Blocks already in flight may still land.
    Withdraw {
        /// Who.
        pair: PairId,
        /// The item.
        item: ItemId,
        /// What stays with it.
        keep: Work,
    },
    /// Stop `pair`, and answer `stopped` once it writes no more.
    Stop {
        /// Who.
        pair: PairId,
    },
    /// Check `file`'s source against its listing and its temporary file
    /// against `digest`, and answer `verified`.
    Verify {
        /// The file.
        file: u32,
        /// xxh3-128 over its block checksums in order.
        digest: u128,
    },
    /// Publish `file`: it was verified. Polled once per file.
    Publish {
        /// The file.
        file: u32,
    },
    /// Give `file` up and remove what of it was written.
    GiveUp {
        /// The file.
        file: u32,
        /// Why.
        why: GiveUp,
    },
    /// Every file is published or given up.
    Finished,
}

/// The answer to a `Verify`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verified {
    /// The source matches its listing, the temporary file its digest.
    Good,
    /// The source no longer matches its listing.
    SourceChanged,
    /// The temporary file does not match the digest.
    Mismatch,
}

/// A report the coordinator refuses; it changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// No such pair.
    #[error("pair {0} is not part of this transfer")]
    UnknownPair(PairId),
    /// A pair id used before.
    #[error("pair {0} already joined this transfer")]
    Rejoined(PairId),
    /// More pairs than `MAX_PAIRS`.
    #[error("a transfer runs on at most {MAX_PAIRS} pairs")]
    TooManyPairs,
    /// A report from a pair that stopped or is past its fence.
    #[error("pair {0} reported after it stopped or was fenced")]
    Fenced(PairId),
    /// No such item, or another pair's.
    #[error("pair {pair} holds no item {item}")]
    NotItsItem {
        /// Who reported.
        pair: PairId,
        /// The item.
        item: ItemId,
    },
    /// Blocks of a file the pair was never handed, or past its end, or
    /// with a checksum count that is not the block count.
    #[error(
        "pair {pair} acknowledged blocks {first}..{end} of file {file}, which it does not hold"
    )]
    NotHeld {
        /// Who reported.
        pair: PairId,
        /// The file.
        file: u32,
        /// The first block.
        first: u64,
        /// One past the last.
        end: u64,
    },
    /// A verification nobody asked for.
    #[error("file {0} is not being verified")]
    NotVerifying(u32),
    /// A file given up that is not open (unknown, or already verified,
    /// published or given up).
    #[error("file {0} is not open")]
    NotOpen(u32),
}

#[derive(Debug)]
struct Item {
    pair: PairId,
    work: Work,
    /// The files it was handed, each held until the item ends.
    touches: Vec<u32>,
    /// Its pair has started it, and cannot be told to do less of it: a
    /// steal leaves it alone (see `started`).
    started: bool,
}

/// The coordinator of one multi-pair transfer.
#[derive(Debug)]
pub struct Coordinator {
    geometry: Geometry,
    files: BTreeMap<u32, FileLedger>,
    queue: VecDeque<Work>,
    pairs: BTreeMap<PairId, Pair>,
    items: BTreeMap<ItemId, Item>,
    next_item: ItemId,
    /// Items a pair holds with work left, at most.
    window: usize,
    actions: VecDeque<Action>,
    finished: bool,
}

impl Coordinator {
    /// The coordinator for `files` (id, size), split by `geometry`, each
    /// pair holding up to `window` items with work left.
    pub fn new(geometry: Geometry, files: &[(u32, u64)], window: usize) -> Self {
        let ledgers = files
            .iter()
            .map(|&(id, size)| (id, FileLedger::new(size, geometry.block_size())))
            .collect();
        let mut c = Self {
            geometry,
            files: ledgers,
            queue: geometry.split(files),
            pairs: BTreeMap::new(),
            items: BTreeMap::new(),
            next_item: 0,
            window: window.max(1),
            actions: VecDeque::new(),
            finished: false,
        };
        c.check_finished();
        c
    }

    /// The split's geometry.
    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    /// The next thing to do.
    #[must_use]
    pub fn poll(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// True once every file is published or given up.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// True while work is left and no pair runs: the Transfer waits for an
    /// agent.
    pub fn waiting_for_pairs(&self) -> bool {
        !self.finished && !self.pairs.values().any(|p| p.state == PairState::Running)
    }

    /// Each pair's figures.
    pub fn pair_views(&self, now: Instant) -> Vec<(PairId, PairView)> {
        self.pairs
            .iter()
            .map(|(&id, p)| (id, p.view(now)))
            .collect()
    }

    /// Bytes durable at the destination, and bytes in all.
    pub fn progress(&self) -> (u64, u64) {
        let done = self.files.values().map(FileLedger::acked_bytes).sum();
        let all = self.files.values().map(FileLedger::size).sum();
        (done, all)
    }

    /// A new pair joins and is handed work.
    pub fn join(&mut self, now: Instant, pair: PairId) -> Result<(), Refused> {
        if self.pairs.contains_key(&pair) {
            return Err(Refused::Rejoined(pair));
        }
        // Pairs that are gone do not count: a pool that churns through
        // agents (each a new id) must not run out of room.
        let live = self.pairs.values().filter(|p| p.state != PairState::Gone);
        if live.count() >= MAX_PAIRS {
            return Err(Refused::TooManyPairs);
        }
        self.pairs.insert(pair, Pair::new());
        self.refill(now);
        Ok(())
    }

    /// `pair` made `sums.len()` blocks of `piece.file` from `piece.first`
    /// durable and right, with these checksums.
    pub fn acked(
        &mut self,
        now: Instant,
        pair: PairId,
        piece: Piece,
        sums: &[u64],
    ) -> Result<(), Refused> {
        self.fence(now);
        self.live(pair)?;
        let not_held = Refused::NotHeld {
            pair,
            file: piece.file,
            first: piece.first,
            end: piece.end,
        };
        let holds = self.pairs[&pair]
            .items
            .iter()
            .any(|i| self.items[i].touches.contains(&piece.file));
        let fits = self.files.get(&piece.file).is_some_and(|f| {
            piece.first <= piece.end
                && piece.end <= f.blocks()
                && piece.blocks() == sums.len() as u64
        });
        if !holds || !fits {
            return Err(not_held);
        }
        let ledger = self.files.get_mut(&piece.file).expect("checked above");
        let was_open = ledger.is_open();
        let new = ledger.ack(piece.first, sums);
        let failed = was_open && !ledger.is_open();
        let p = self.pairs.get_mut(&pair).expect("checked above");
        p.bytes += new;
        if failed {
            self.withdraw_file(piece.file);
        }
        self.refill(now);
        Ok(())
    }

    /// `pair` has started `item` in a way that cannot be cut short (a shell
    /// that runs one session per item): steals take only from its items
    /// not yet started. A shell that can shrink running work never calls
    /// this.
    pub fn started(&mut self, pair: PairId, item: ItemId) -> Result<(), Refused> {
        self.live(pair)?;
        match self.items.get_mut(&item) {
            Some(i) if i.pair == pair => {
                i.started = true;
                Ok(())
            }
            _ => Err(Refused::NotItsItem { pair, item }),
        }
    }

    /// `pair` has nothing of `item` in flight any more. Whatever of it is
    /// still unacknowledged goes back to the queue.
    pub fn finished(&mut self, now: Instant, pair: PairId, item: ItemId) -> Result<(), Refused> {
        self.fence(now);
        self.live(pair)?;
        if self.items.get(&item).is_none_or(|i| i.pair != pair) {
            return Err(Refused::NotItsItem { pair, item });
        }
        let left = self.unacked_work(&self.items[&item].work);
        if !left.is_empty() {
            self.queue.push_front(left);
        }
        let p = self.pairs.get_mut(&pair).expect("checked above");
        p.chunks_done += 1;
        p.items.retain(|&i| i != item);
        self.end_item(item);
        self.refill(now);
        Ok(())
    }

    /// `pair` is thought lost. Its unacknowledged work goes to the others
    /// now; what it writes until `fence` is still accepted.
    pub fn lost(&mut self, now: Instant, pair: PairId, fence: Instant) -> Result<(), Refused> {
        self.live(pair)?;
        self.requeue(pair);
        let p = self.pairs.get_mut(&pair).expect("checked above");
        p.state = PairState::Lost;
        // A second report never brings the fence closer: the agent may
        // write until the latest one it was given.
        p.fence = Some(p.fence.map_or(fence, |f| f.max(fence)));
        self.tick(now);
        Ok(())
    }

    /// `pair` leaves (its pool scales down): its unfinished work goes to
    /// the others, and it is told to stop.
    /// A lost pair stays lost, with its fence: a dead agent never answers
    /// `Stop`. A leaving pair that never answers must be reported `lost`.
    pub fn leave(&mut self, now: Instant, pair: PairId) -> Result<(), Refused> {
        self.live(pair)?;
        if self.pairs[&pair].state != PairState::Running {
            return Ok(());
        }
        self.requeue(pair);
        self.pairs.get_mut(&pair).expect("checked above").state = PairState::Leaving;
        self.actions.push_back(Action::Stop { pair });
        self.refill(now);
        Ok(())
    }

    /// `pair` has stopped and writes no more.
    pub fn stopped(&mut self, now: Instant, pair: PairId) -> Result<(), Refused> {
        self.live(pair)?;
        if self.pairs[&pair].state == PairState::Running {
            self.requeue(pair);
        }
        self.gone(pair);
        self.refill(now);
        Ok(())
    }

    /// The answer to `Verify { file }`.
    pub fn verified(&mut self, file: u32, result: Verified) -> Result<(), Refused> {
        let ledger = self
            .files
            .get_mut(&file)
            .filter(|f| f.is_verifying())
            .ok_or(Refused::NotVerifying(file))?;
        // Only a file being verified gets here, and none of its items is
        // live: publishing and giving up both go through.
        let action = match result {
            Verified::Good => {
                let published = ledger.publish();
                debug_assert!(published);
                Action::Publish { file }
            }
            Verified::SourceChanged | Verified::Mismatch => {
                let why = if result == Verified::Mismatch {
                    GiveUp::Mismatch
                } else {
                    GiveUp::SourceChanged
                };
                ledger.fail(why);
                let ready = ledger.ready();
                debug_assert_eq!(ready, Some(Ready::GiveUp(why)));
                Action::GiveUp { file, why }
            }
        };
        self.actions.push_back(action);
        self.check_finished();
        Ok(())
    }

    /// The shell gives `file` up (a receiver refused it, or its pieces
    /// failed too often): it is taken back from every pair, and given up
    /// once nothing can write to it.
    pub fn give_up(&mut self, now: Instant, file: u32) -> Result<(), Refused> {
        let ledger = self
            .files
            .get_mut(&file)
            .filter(|f| f.is_open())
            .ok_or(Refused::NotOpen(file))?;
        ledger.fail(GiveUp::Failed);
        if let Some(Ready::GiveUp(why)) = ledger.ready() {
            self.actions.push_back(Action::GiveUp { file, why });
        }
        self.withdraw_file(file);
        self.check_finished();
        self.refill(now);
        Ok(())
    }

    /// When `tick` is next due: the earliest fence of a lost pair.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.pairs
            .values()
            .filter(|p| p.state == PairState::Lost)
            .filter_map(|p| p.fence)
            .min()
    }

    /// Time passes: lost pairs past their fence are gone, and idle pairs
    /// look again for work to steal.
    pub fn tick(&mut self, now: Instant) {
        self.fence(now);
        self.refill(now);
    }

    fn fence(&mut self, now: Instant) {
        let fenced: Vec<PairId> = self
            .pairs
            .iter()
            .filter(|(_, p)| p.state == PairState::Lost && p.fence.is_some_and(|f| f <= now))
            .map(|(&id, _)| id)
            .collect();
        for pair in fenced {
            self.gone(pair);
        }
    }

    fn live(&self, pair: PairId) -> Result<(), Refused> {
        match self.pairs.get(&pair) {
            None => Err(Refused::UnknownPair(pair)),
            Some(p) if p.state == PairState::Gone => Err(Refused::Fenced(pair)),
            Some(_) => Ok(()),
        }
    }

    /// The unacknowledged runs of `work`, of files still open.
    fn unacked_work(&self, work: &Work) -> Work {
        work.iter()
            .filter(|p| self.files[&p.file].is_open())
            .flat_map(|p| self.files[&p.file].unacked_runs(p))
            .collect()
    }

    /// Blocks of `work` still wanted.
    fn remaining_in(&self, work: &Work) -> u64 {
        work.iter()
            .filter(|p| self.files[&p.file].is_open())
            .map(|p| self.files[&p.file].unacked_in(p))
            .sum()
    }

    fn remaining(&self, pair: PairId) -> u64 {
        self.pairs[&pair]
            .items
            .iter()
            .map(|i| self.remaining_in(&self.items[i].work))
            .sum()
    }

    /// A pair's unacknowledged work goes to the front of the queue, in
    /// its order; its items keep holding their files until it is gone.
    fn requeue(&mut self, pair: PairId) {
        let ids = self.pairs[&pair].items.clone();
        for id in ids.into_iter().rev() {
            let left = self.unacked_work(&self.items[&id].work);
            if !left.is_empty() {
                self.queue.push_front(left);
            }
            self.items
                .get_mut(&id)
                .expect("a pair's own item")
                .work
                .clear();
        }
    }

    fn gone(&mut self, pair: PairId) {
        let p = self.pairs.get_mut(&pair).expect("callers check the pair");
        p.state = PairState::Gone;
        for item in std::mem::take(&mut p.items) {
            self.end_item(item);
        }
    }

    /// An item ends: the files it held may now be ready.
    fn end_item(&mut self, item: ItemId) {
        let Some(it) = self.items.remove(&item) else {
            return;
        };
        for file in it.touches {
            let ledger = self.files.get_mut(&file).expect("items hold known files");
            ledger.release();
            match ledger.ready() {
                Some(Ready::Verify(digest)) => {
                    self.actions.push_back(Action::Verify { file, digest })
                }
                Some(Ready::GiveUp(why)) => self.actions.push_back(Action::GiveUp { file, why }),
                None => {}
            }
        }
        self.check_finished();
    }

    /// A failed file's pieces are taken back from every running pair.
    fn withdraw_file(&mut self, file: u32) {
        let mut changes = Vec::new();
        for (&id, item) in &mut self.items {
            if item.work.iter().any(|p| p.file == file) {
                item.work.retain(|p| p.file != file);
                if self.pairs[&item.pair].state == PairState::Running {
                    changes.push(Action::Withdraw {
                        pair: item.pair,
                        item: id,
                        keep: item.work.clone(),
                    });
                }
            }
        }
        self.actions.extend(changes);
    }

    fn check_finished(&mut self) {
        if !self.finished && self.files.values().all(FileLedger::is_ended) {
            self.finished = true;
            self.actions.push_back(Action::Finished);
        }
    }

    /// Running pairs take from the queue, up to their window; a pair that
    /// runs dry with the queue empty steals.
    fn refill(&mut self, now: Instant) {
        let running: Vec<PairId> = self
            .pairs
            .iter()
            .filter(|(_, p)| p.state == PairState::Running)
            .map(|(&id, _)| id)
            .collect();
        for &pair in &running {
            while self.busy_items(pair) < self.window {
                let Some(work) = self.next_work() else { break };
                self.assign(now, pair, work);
            }
        }
        if self.queue.is_empty() {
            for pair in running {
                if self.remaining(pair) == 0 {
                    self.steal(now, pair);
                }
            }
        }
    }

    fn busy_items(&self, pair: PairId) -> usize {
        let items = &self.pairs[&pair].items;
        items
            .iter()
            .filter(|i| self.remaining_in(&self.items[i].work) > 0)
            .count()
    }

    fn next_work(&mut self) -> Option<Work> {
        while let Some(work) = self.queue.pop_front() {
            let left = self.unacked_work(&work);
            if !left.is_empty() {
                return Some(left);
            }
        }
        None
    }

    fn assign(&mut self, now: Instant, pair: PairId, work: Work) {
        let item = self.next_item;
        self.next_item += 1;
        let mut touches: Vec<u32> = work.iter().map(|p| p.file).collect();
        touches.sort_unstable();
        touches.dedup();
        for f in &touches {
            self.files.get_mut(f).expect("work of known files").hold();
        }
        let p = self.pairs.get_mut(&pair).expect("callers check the pair");
        p.items.push(item);
        p.since.get_or_insert(now);
        self.items.insert(
            item,
            Item {
                pair,
                work: work.clone(),
                touches,
                started: false,
            },
        );
        self.actions.push_back(Action::Assign { pair, item, work });
    }

    /// `thief` takes its share of the work of the pair that would finish
    /// last, from the end, cut on grain boundaries; the victim keeps
    /// something, so two pairs never hand one remnant back and forth.
    fn steal(&mut self, now: Instant, thief: PairId) {
        let Some((victim, left)) = self.slowest(now, thief) else {
            return;
        };
        let share = thief_share(
            left,
            self.pairs[&thief].rate(now),
            self.pairs[&victim].rate(now),
        );
        if share < self.geometry.grain_blocks() || share >= left {
            return;
        }
        let mut need = share;
        let mut taken: Work = Vec::new();
        let mut kept: Vec<(ItemId, Work)> = Vec::new();
        for &id in self.pairs[&victim].items.iter().rev() {
            if need == 0 {
                break;
            }
            if self.items[&id].started {
                continue;
            }
            let mut work = self.items[&id].work.clone();
            need = self.cut_tail(&mut work, need, &mut taken);
            if work != self.items[&id].work {
                kept.push((id, work));
            }
        }
        let victim_keeps: u64 = self.pairs[&victim]
            .items
            .iter()
            .map(|id| match kept.iter().find(|(k, _)| k == id) {
                Some((_, work)) => self.remaining_in(work),
                None => self.remaining_in(&self.items[id].work),
            })
            .sum();
        if taken.is_empty() || victim_keeps == 0 {
            // A grain rounded up to all of it: leave the victim be.
            return;
        }
        for (item, keep) in kept {
            self.items.get_mut(&item).expect("the victim's item").work = keep.clone();
            self.actions.push_back(Action::Withdraw {
                pair: victim,
                item,
                keep,
            });
        }
        taken.reverse();
        self.assign(now, thief, taken);
    }

    /// Cuts about `need` unacknowledged blocks off the end of `work`, on a
    /// grain boundary, onto `taken` (in reverse order); returns what is
    /// still needed.
    fn cut_tail(&self, work: &mut Work, mut need: u64, taken: &mut Work) -> u64 {
        while need > 0 {
            let Some(last) = work.last_mut() else { break };
            let ledger = &self.files[&last.file];
            let un = if ledger.is_open() {
                ledger.unacked_in(last)
            } else {
                0
            };
            let cut = if un <= need {
                last.first
            } else {
                self.geometry.grain_floor(last.end - need).max(last.first)
            };
            let tail = Piece {
                first: cut,
                ..*last
            };
            if ledger.is_open() {
                need = need.saturating_sub(ledger.unacked_in(&tail));
                taken.extend(ledger.unacked_runs(&tail).into_iter().rev());
            }
            if cut == last.first {
                work.pop();
            } else {
                last.end = cut;
            }
        }
        need
    }

    /// The running pair other than `thief` that would finish last, and
    /// its blocks left. A pair with no measured rate yet counts as slowest.
    fn slowest(&self, now: Instant, thief: PairId) -> Option<(PairId, u64)> {
        self.pairs
            .iter()
            .filter(|&(&id, p)| id != thief && p.state == PairState::Running)
            .map(|(&id, p)| {
                let left = self.remaining(id);
                let time = match p.rate(now) {
                    Some(r) if r > 0.0 => left as f64 / r,
                    _ => f64::INFINITY,
                };
                (id, left, time)
            })
            .filter(|&(_, left, _)| left > 0)
            .max_by(|a, b| a.2.total_cmp(&b.2).then(a.1.cmp(&b.1)))
            .map(|(id, left, _)| (id, left))
    }
}
