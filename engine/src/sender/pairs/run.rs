//! The run's state in the driving thread: the coordinator's actions
//! carried out, the lanes' events fed back to it.

use super::*;

/// Whether `f` is still the file that was listed.
pub(super) fn unchanged(base: &OwnedFd, f: &SourceFile) -> bool {
    use rustix::fs::{Mode, OFlags};
    let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let Ok(fd) = rustix::fs::openat(base, &f.rel, flags, Mode::empty()) else {
        return false;
    };
    File::from(fd)
        .metadata()
        .is_ok_and(|m| f.stamp.change_to(&Stamp::of(&m)).is_none())
}

/// The run's state in the driving thread.
pub(super) struct Run<'a> {
    pub(super) plan: &'a Plan<'a>,
    pub(super) coord: Coordinator,
    /// Each pair's lane, by pair id: the first `plan.pairs`, then those
    /// that joined.
    pub(super) lanes: Vec<Arc<Lane>>,
    /// Lost pairs: why, and when.
    pub(super) lost: BTreeMap<PairId, (String, Instant)>,
    pub(super) started_at: Instant,
    /// Each lane's jobs not yet handed to a worker. Only the driving
    /// thread touches them: it hands each job to an idle worker and, for
    /// an item, tells the coordinator it started in the same step, so
    /// that no steal can cut an item a worker already runs.
    pub(super) queues: Vec<VecDeque<Job>>,
    /// Workers waiting for a job.
    pub(super) idle: Vec<(PairId, mpsc::Sender<Option<Job>>)>,
    /// Each lane's item sessions running: a lost lane still writes until
    /// its last one has answered.
    pub(super) writing: Vec<usize>,
    /// Relay sessions that ended unanswered (their relay went silent), by
    /// lane: counted in `writing` until the relay has surely stopped.
    pub(super) unanswered: Vec<(PairId, Instant)>,
    /// Publish jobs not yet answered.
    pub(super) publishing: BTreeSet<PublishId>,
    pub(super) next_publish: PublishId,
    /// Sessions each file's pieces failed in.
    pub(super) failures: HashMap<u32, u32>,
    pub(super) failed: BTreeMap<u32, String>,
    pub(super) published: BTreeMap<u32, u128>,
    pub(super) digests: HashMap<u32, u128>,
    pub(super) bytes_sent: BTreeMap<PairId, u64>,
    /// What the pieces that landed already held (`PairsSummary`).
    pub(super) bytes_resumed: u64,
    pub(super) unmarking: bool,
    /// Lanes the transfer started with; those after joined it.
    pub(super) initial: usize,
    /// Whether a lane that joined already failed with what retrying
    /// cannot fix: a second such failure is the transfer's, not a lane's.
    pub(super) joined_refused: bool,
}

impl<'a> Run<'a> {
    pub(super) fn new(
        plan: &'a Plan<'a>,
        coord: Coordinator,
        lanes: Vec<Arc<Lane>>,
        started_at: Instant,
    ) -> Self {
        Self {
            plan,
            coord,
            queues: lanes.iter().map(|_| VecDeque::new()).collect(),
            writing: vec![0; lanes.len()],
            unanswered: Vec::new(),
            initial: lanes.len(),
            joined_refused: false,
            lanes,
            lost: BTreeMap::new(),
            started_at,
            idle: Vec::new(),
            publishing: BTreeSet::new(),
            next_publish: 0,
            failures: HashMap::new(),
            failed: BTreeMap::new(),
            published: BTreeMap::new(),
            digests: HashMap::new(),
            bytes_sent: BTreeMap::new(),
            bytes_resumed: 0,
            unmarking: false,
        }
    }

    /// Feeds the lanes' events to the coordinator and carries out its
    /// actions until every file is published or given up.
    pub(super) fn drive(
        &mut self,
        rx: &mpsc::Receiver<Event>,
        joins: &Joins,
        spawn: &dyn Fn(PairId, Arc<Lane>),
    ) -> Result<()> {
        let now = Instant::now();
        for pair in 0..self.lanes.len() as PairId {
            self.coord
                .join(now, pair)
                .map_err(|e| Error::Internal(e.to_string()))?;
        }
        loop {
            self.expire_unanswered(Instant::now());
            for to in joins.take() {
                if let Some(lane) = self.join(Instant::now(), &to) {
                    spawn(self.lanes.len() as PairId - 1, lane);
                }
            }
            self.act()?;
            self.dispatch();
            if self.coord.is_finished() && self.publishing.is_empty() {
                return self.unmark(rx);
            }
            if self.coord.waiting_for_pairs() || self.lost.len() == self.lanes.len() {
                return Err(self.all_lost());
            }
            if let Some(c) = &self.plan.cfg.cancel
                && c.load(Ordering::Relaxed)
            {
                return Err(Error::Cancelled {
                    last: Box::new(Error::Config("stopped with files left to send".into())),
                });
            }
            self.show_progress();
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(event) => self.handle(event)?,
                Err(mpsc::RecvTimeoutError::Timeout) => self.coord.tick(Instant::now()),
                Err(mpsc::RecvTimeoutError::Disconnected) => return Err(self.all_lost()),
            }
        }
    }

    /// Opens a lane to `to`, a receiver that joins, unless a live lane
    /// goes there or one was lost there within `REJOIN_AFTER`; gives the
    /// lane opened, whose workers are the caller's to start.
    pub(super) fn join(&mut self, now: Instant, to: &str) -> Option<Arc<Lane>> {
        let taken = self.lanes.iter().enumerate().any(|(i, l)| {
            l.to == to
                && self
                    .lost
                    .get(&(i as PairId))
                    .is_none_or(|(_, at)| now.duration_since(*at) < REJOIN_AFTER)
        });
        if taken || self.coord.is_finished() {
            return None;
        }
        let pair = self.lanes.len() as PairId;
        if let Err(e) = self.coord.join(now, pair) {
            tracing::warn!(receiver = %to, "a receiver cannot join: {e}");
            return None;
        }
        tracing::info!(receiver = %to, "a receiver joined; it takes work not yet started");
        self.plan.pairs.fetch_add(1, Ordering::Relaxed);
        // The lead sends to a receiver that joins itself.
        let lane = Arc::new(Lane::new(to, None));
        self.lanes.push(Arc::clone(&lane));
        self.queues.push(VecDeque::new());
        self.writing.push(0);
        Some(lane)
    }

    /// Hands queued jobs to idle workers of live lanes; an item is told
    /// to the coordinator as started in the same step.
    pub(super) fn dispatch(&mut self) {
        let mut waiting = Vec::with_capacity(self.idle.len());
        for (pair, reply) in std::mem::take(&mut self.idle) {
            if self.lost.contains_key(&pair) {
                let _ = reply.send(None);
                continue;
            }
            let Some(job) = self.queues[pair as usize].pop_front() else {
                waiting.push((pair, reply));
                continue;
            };
            let item = match &job {
                Job::Item(item, _) => Some(*item),
                _ => None,
            };
            if let Err(mpsc::SendError(Some(job))) = reply.send(Some(job)) {
                // The worker is gone: the job goes back for another.
                self.queues[pair as usize].push_front(job);
            } else if let Some(item) = item {
                // Refused only for a pair lost meanwhile, checked above.
                let _ = self.coord.started(pair, item);
                self.writing[pair as usize] += 1;
            }
        }
        self.idle = waiting;
    }

    pub(super) fn all_lost(&self) -> Error {
        let why: Vec<String> = self
            .lost
            .iter()
            .map(|(p, (e, _))| format!("{}: {e}", self.lanes[*p as usize].to))
            .collect();
        Error::Config(format!(
            "every receiver of the transfer was lost, with files left to send ({})",
            why.join("; ")
        ))
    }

    pub(super) fn show_progress(&self) {
        let (done, _) = self.coord.progress();
        let moved = self.lanes.iter().map(|l| l.progress.position().moved).sum();
        self.plan.cfg.progress.set(done, moved);
        self.show_pairs("running");
    }

    /// Shows each pair, `working` the word for one that takes work (or
    /// took it to the end).
    pub(super) fn show_pairs(&self, working: &'static str) {
        let pairs = self
            .coord
            .pair_views(Instant::now())
            .iter()
            .map(|(id, v)| PairShown {
                to: self.lanes[*id as usize].to.clone(),
                via: self.lanes[*id as usize].via.clone(),
                state: state_name(v.state, working),
                bytes: v.bytes,
                rate_bps: v.rate as u64,
                chunks_done: v.chunks_done,
            })
            .collect();
        self.plan.cfg.progress.set_pairs(pairs);
    }

    /// Carries out what the coordinator asks.
    pub(super) fn act(&mut self) -> Result<()> {
        let mut publish = Vec::new();
        while let Some(action) = self.coord.poll() {
            match action {
                Action::Assign { pair, item, work } => {
                    self.queues[pair as usize].push_back(Job::Item(item, hull(&work)));
                }
                Action::Withdraw { pair, item, keep } => self.withdraw(pair, item, keep),
                // This shell never scales a pair away.
                Action::Stop { .. } => {}
                Action::Verify { file, digest } => {
                    let f = &self.plan.list.files[file as usize];
                    let answer = if unchanged(&self.plan.list.base, f) {
                        self.digests.insert(file, digest);
                        Verified::Good
                    } else {
                        Verified::SourceChanged
                    };
                    self.coord
                        .verified(file, answer)
                        .map_err(|e| Error::Internal(e.to_string()))?;
                }
                Action::Publish { file } => publish.push(file),
                Action::GiveUp { file, why } => {
                    let message = match why {
                        crate::stripes::GiveUp::SourceChanged => {
                            "the source changed while it was sent; send it again once it is stable"
                                .to_string()
                        }
                        crate::stripes::GiveUp::Mismatch => {
                            "the written file does not match its checksums".to_string()
                        }
                        crate::stripes::GiveUp::Failed => "its pieces failed".to_string(),
                    };
                    self.failed.entry(file).or_insert(message);
                }
                Action::Finished => {}
            }
        }
        if !publish.is_empty() {
            self.dispatch_publish(publish)?;
        }
        Ok(())
    }

    /// A stolen item still queued on its lane keeps only `keep`; one
    /// already running finishes as it is.
    pub(super) fn withdraw(&mut self, pair: PairId, item: ItemId, keep: Vec<Piece>) {
        let q = &mut self.queues[pair as usize];
        let at = q
            .iter()
            .position(|j| matches!(j, Job::Item(i, _) if *i == item));
        if let Some(at) = at {
            if keep.is_empty() {
                q.remove(at);
                let _ = self.coord.finished(Instant::now(), pair, item);
            } else {
                q[at] = Job::Item(item, hull(&keep));
            }
        }
    }

    /// Hands `files` to a publish still queued on a live lane while they
    /// fit in one (`MAX_PUBLISH`), else to a new one; either goes to the
    /// live lane with the least queued when that is nearer the front than
    /// where the waiting one stands. Each publish is a session that holds
    /// one of its lane's workers, so publishes that pile up behind running
    /// items go as one rather than keep a worker from the next item a
    /// session at a time; and one that waits behind a busy lane's item
    /// moves to an idle lane, rather than keep ready files unpublished.
    pub(super) fn dispatch_publish(&mut self, mut files: Vec<u32>) -> Result<()> {
        let least = (0..self.lanes.len() as PairId)
            .filter(|p| !self.lost.contains_key(p))
            .min_by_key(|p| self.queues[*p as usize].len());
        let Some(least) = least.map(|p| p as usize) else {
            return Err(self.all_lost());
        };
        match self.queued_publish(files.len()) {
            Some((lane, at)) => {
                let Some(Job::Publish(id, mut queued)) = self.queues[lane].remove(at) else {
                    return Err(Error::Internal("a queued publish went missing".into()));
                };
                queued.append(&mut files);
                let job = Job::Publish(id, queued);
                match self.queues[least].len() < at {
                    true => self.queues[least].push_back(job),
                    false => self.queues[lane].insert(at, job),
                }
            }
            None => {
                let id = self.next_publish;
                self.next_publish += 1;
                self.publishing.insert(id);
                self.queues[least].push_back(Job::Publish(id, files));
            }
        }
        Ok(())
    }

    /// Where a publish no worker has started stands, on a live lane, with
    /// room for `more` files: its lane and its place in that lane's queue.
    fn queued_publish(&self, more: usize) -> Option<(usize, usize)> {
        self.queues.iter().enumerate().find_map(|(p, q)| {
            if self.lost.contains_key(&(p as PairId)) {
                return None;
            }
            let at = q.iter().position(
                |job| matches!(job, Job::Publish(_, files) if files.len() + more <= MAX_PUBLISH),
            )?;
            Some((p, at))
        })
    }

    pub(super) fn handle(&mut self, event: Event) -> Result<()> {
        let now = Instant::now();
        match event {
            Event::Item {
                pair,
                item,
                pieces,
                st,
                run,
            } => {
                self.sent(pair, &st);
                if matches!(
                    &run,
                    Err(Error::Relayed {
                        answered: false,
                        ..
                    })
                ) {
                    // Its relay may still be writing, until it notices.
                    let until = now + crate::wire::RELAY_UNANSWERED_FENCE;
                    self.unanswered.push((pair, until));
                } else {
                    self.writing[pair as usize] = self.writing[pair as usize].saturating_sub(1);
                }
                match run {
                    Ok(()) => self.item_done(now, pair, item, &pieces, &st)?,
                    Err(e) => self.lane_failed(now, pair, e)?,
                }
                self.fence_if_quiet(now, pair);
                Ok(())
            }
            Event::Published {
                pair,
                id,
                files,
                st,
                run,
            } => {
                self.sent(pair, &st);
                self.publishing.remove(&id);
                match run {
                    Ok(()) => {
                        self.published_files(&files, &st);
                        Ok(())
                    }
                    Err(e) => {
                        self.lane_failed(now, pair, e)?;
                        // Files it published before failing are final:
                        // handed on, the next receiver would find no
                        // temporary file and fail them.
                        let rest = self.published_ok(&files, &st);
                        if rest.is_empty() {
                            return Ok(());
                        }
                        self.dispatch_publish(rest)
                    }
                }
            }
            Event::Idle { pair, reply } => {
                self.idle.push((pair, reply));
                Ok(())
            }
            Event::Unmarked => Ok(()),
        }
    }

    /// A lost lane whose last writing session has ended writes no more,
    /// and its files may be verified.
    pub(super) fn fence_if_quiet(&mut self, now: Instant, pair: PairId) {
        if self.lost.contains_key(&pair) && self.writing[pair as usize] == 0 {
            let _ = self.coord.stopped(now, pair);
        }
    }

    /// Relay sessions that ended unanswered are taken as ended once their
    /// relay has surely stopped them.
    pub(super) fn expire_unanswered(&mut self, now: Instant) {
        let (due, left): (Vec<_>, Vec<_>) = std::mem::take(&mut self.unanswered)
            .into_iter()
            .partition(|(_, until)| *until <= now);
        self.unanswered = left;
        for (pair, _) in due {
            self.writing[pair as usize] = self.writing[pair as usize].saturating_sub(1);
            self.fence_if_quiet(now, pair);
        }
    }

    pub(super) fn sent(&mut self, pair: PairId, st: &RunState) {
        // Saturating: a relay's count is its word, not this host's.
        let sent = self.bytes_sent.entry(pair).or_default();
        *sent = sent.saturating_add(st.bytes_sent);
    }

    /// Records the files of a failed publish session that the receiver
    /// answered as published; returns the others.
    pub(super) fn published_ok(&mut self, files: &[u32], st: &RunState) -> Vec<u32> {
        let mut rest = Vec::new();
        for (i, &file) in files.iter().enumerate() {
            if let Some(FileVerdict::Ok(_)) = st.verdicts.get(&(i as u32)) {
                let digest = self.digests.get(&file).copied().unwrap_or(0);
                self.published.insert(file, digest);
            } else {
                rest.push(file);
            }
        }
        rest
    }

    pub(super) fn published_files(&mut self, files: &[u32], st: &RunState) {
        for (i, &file) in files.iter().enumerate() {
            match st.verdicts.get(&(i as u32)) {
                Some(FileVerdict::Ok(_)) => {
                    let digest = self.digests.get(&file).copied().unwrap_or(0);
                    self.published.insert(file, digest);
                }
                Some(FileVerdict::Failed(why)) => {
                    self.failed.insert(file, format!("not published: {why}"));
                }
                // Pairs send every file (no sync level, no dry run):
                // never taken.
                Some(FileVerdict::Present | FileVerdict::WouldSend) | None => {
                    self.failed.insert(file, "not published".into());
                }
            }
        }
    }

    /// An item's session ended well: each piece the receiver verified and
    /// made durable is acknowledged with its block checksums.
    pub(super) fn item_done(
        &mut self,
        now: Instant,
        pair: PairId,
        item: ItemId,
        pieces: &[Piece],
        st: &RunState,
    ) -> Result<()> {
        for (i, piece) in pieces.iter().enumerate() {
            let id = i as u32;
            // A relay has no checksums to send for an empty file: none
            // held is none owed, and a piece with blocks still needs them.
            let sums = st.sums.get(&id).map_or(&[][..], Vec::as_slice);
            match st.verdicts.get(&id) {
                Some(FileVerdict::Ok(_)) if piece.end as usize <= sums.len() => {
                    let held = st.held_in_pieces.get(&id).copied().unwrap_or(0);
                    self.bytes_resumed = self.bytes_resumed.saturating_add(held);
                    let sums = &sums[piece.first as usize..piece.end as usize];
                    let _ = self.coord.acked(now, pair, *piece, sums);
                }
                Some(FileVerdict::Failed(why)) => self.piece_failed(now, piece.file, why),
                Some(FileVerdict::Ok(_)) => {
                    self.piece_failed(now, piece.file, "answered without its blocks' checksums")
                }
                Some(FileVerdict::Present | FileVerdict::WouldSend) | None => {
                    self.piece_failed(now, piece.file, "no verdict")
                }
            }
        }
        // Refused by the coordinator only if the pair was fenced meanwhile.
        let _ = self.coord.finished(now, pair, item);
        Ok(())
    }

    pub(super) fn piece_failed(&mut self, now: Instant, file: u32, why: &str) {
        let n = self.failures.entry(file).or_insert(0);
        *n += 1;
        tracing::warn!(file = %self.plan.list.files[file as usize].dest, attempt = *n, "a piece failed: {why}");
        if *n >= MAX_PIECE_FAILURES {
            self.failed.insert(file, why.to_string());
            let _ = self.coord.give_up(now, file);
        }
    }

    /// A lane's session failed past the pair's patience: the pair is lost
    /// (its other sessions may still write: see `writing`), unless the
    /// failure is one that retrying cannot fix anywhere, which ends the
    /// transfer. The first lane that joined and meets such a failure is
    /// lost instead: a replacement with a broken disk or a private mount
    /// must not fail a transfer the others carry (found by review). A
    /// second is taken as the transfer's (a full shared disk, say), which
    /// would otherwise lose every pair that joins, one by one, and hide
    /// why. A lane sent by a relay the operator lent (`Relays::Lent`) is
    /// lost on any failure: the relay is not the user's to fix.
    pub(super) fn lane_failed(&mut self, now: Instant, pair: PairId, e: Error) -> Result<()> {
        let to = &self.lanes[pair as usize].to;
        // A lost lane's sessions end cancelled, which is no news.
        let cancelled = self.lost.contains_key(&pair) && matches!(e, Error::Cancelled { .. });
        let fatal = !(cancelled || e.is_retryable() || matches!(e, Error::GaveUp { .. }));
        let first_joined = pair as usize >= self.initial && !self.joined_refused;
        let lent = self.lanes[pair as usize].via.is_some() && self.plan.relays == Relays::Lent;
        if fatal && lent {
            // The relay's refusal, or its receiver's (a relay answers
            // both alike): the lane is lost either way. A receiver's own
            // refusal comes again on the lanes this host sends, where it
            // ends the transfer (a receiver taken back after this counts
            // as one that joined: its first refusal loses it alone).
            tracing::warn!(receiver = %to, error = %e, "a lent relay refused for good; its pair is lost");
        } else if fatal && first_joined {
            self.joined_refused = true;
        } else if fatal {
            return Err(Error::Config(format!("{to}: {e}")));
        }
        // Its queued items are the coordinator's to hand out again; its
        // queued publishes are handed on here. A publish a worker runs is
        // handed on by its own answer, if that is a failure, so no file
        // is ever published by two receivers at once.
        let orphans: Vec<Vec<u32>> = std::mem::take(&mut self.queues[pair as usize])
            .into_iter()
            .filter_map(|job| match job {
                Job::Publish(id, files) => {
                    self.publishing.remove(&id);
                    Some(files)
                }
                _ => None,
            })
            .collect();
        // Its other session may fail too: the first failure is the news.
        if let std::collections::btree_map::Entry::Vacant(lost) = self.lost.entry(pair) {
            tracing::warn!(receiver = %to, error = %e, "pair lost; its work goes to the others");
            lost.insert((e.to_string(), now));
            let _ = self
                .plan
                .pairs
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
            self.lanes[pair as usize]
                .cancel
                .store(true, Ordering::Relaxed);
            // Its work goes to the others now, but a session of it that
            // still runs may still write: the pair is fenced when that
            // one answers (`handle`), not before.
            let fence = match self.writing[pair as usize] {
                0 => now,
                _ => now + UNTIL_ANSWERED,
            };
            let _ = self.coord.lost(now, pair, fence);
        }
        for files in orphans {
            self.dispatch_publish(files)?;
        }
        Ok(())
    }

    /// Removes the shared-storage marker through a live lane, and waits
    /// for it (a marker left behind harms nothing but tidiness).
    pub(super) fn unmark(&mut self, rx: &mpsc::Receiver<Event>) -> Result<()> {
        if self.unmarking {
            return Ok(());
        }
        self.unmarking = true;
        let Some(lane) = (0..self.lanes.len()).find(|p| !self.lost.contains_key(&(*p as u32)))
        else {
            return Ok(());
        };
        self.queues[lane].push_back(Job::Unmark);
        self.dispatch();
        while let Ok(event) = rx.recv_timeout(PAIR_PATIENCE * 2) {
            match event {
                Event::Unmarked => break,
                Event::Idle { pair, reply } => {
                    self.idle.push((pair, reply));
                    self.dispatch();
                }
                _ => {}
            }
        }
        Ok(())
    }

    pub(super) fn summary(&self, geometry: Geometry, seconds: f64) -> PairsSummary {
        let now = Instant::now();
        let views = self.coord.pair_views(now);
        let pairs = views
            .iter()
            .map(|(id, v)| PairSummary {
                to: self.lanes[*id as usize].to.clone(),
                via: self.lanes[*id as usize].via.clone(),
                state: state_name(v.state, "finished").to_string(),
                bytes: v.bytes,
                bytes_sent: self.bytes_sent.get(id).copied().unwrap_or(0),
                gbps: v.rate * 8.0 / 1e9,
                chunks_done: v.chunks_done,
                error: self.lost.get(id).map(|(e, _)| e.clone()),
                lost_after_s: self
                    .lost
                    .get(id)
                    .map(|(_, at)| at.duration_since(self.started_at).as_secs_f64()),
            })
            .collect();
        let list = &self.plan.list.files;
        let regular = list.iter().filter(|f| f.kind == EntryKind::File).count();
        let (_, total) = self.coord.progress();
        let digest = match self.published.len() {
            1 if regular == 1 => fmt_digest(*self.published.values().next().unwrap_or(&0)),
            _ => fmt_digest(tree_digest(
                self.published
                    .iter()
                    .map(|(f, d)| (list[*f as usize].dest.as_str(), *d)),
            )),
        };
        PairsSummary {
            ok: self.failed.is_empty() && self.published.len() == regular,
            bytes_total: total,
            bytes_sent: self
                .bytes_sent
                .values()
                .fold(0u64, |a, b| a.saturating_add(*b)),
            bytes_resumed: self.bytes_resumed,
            seconds,
            gbps: total as f64 * 8.0 / seconds.max(1e-9) / 1e9,
            chunk_bytes: geometry.chunk_bytes(),
            block_size: geometry.block_size(),
            streams_per_pair: self.plan.cfg.streams,
            pairs,
            files: regular,
            files_ok: self.published.len(),
            failures: self
                .failed
                .iter()
                .map(|(f, why)| (list[*f as usize].dest.clone(), why.clone()))
                .collect(),
            digest,
            compression: self
                .plan
                .cfg
                .progress
                .compression_or(self.plan.cfg.compress)
                .into(),
            sync: crate::sync::SyncLevel::None,
            files_present: 0,
            bytes_present: 0,
        }
    }
}

/// One piece per file: the span of a file's runs in `work` (a run
/// between two of them that another pair already wrote is written again,
/// with the same bytes).
pub(super) fn hull(work: &[Piece]) -> Vec<Piece> {
    let mut out: Vec<Piece> = Vec::with_capacity(work.len());
    for p in work {
        match out.iter_mut().find(|o| o.file == p.file) {
            Some(o) => {
                o.first = o.first.min(p.first);
                o.end = o.end.max(p.end);
            }
            None => out.push(*p),
        }
    }
    out
}
