//! A session and its control connection: admission, the manifest, the
//! plan, the results and its end. The data streams that join it are
//! `stream`'s.

use crate::net::Conn;
use std::collections::HashSet;
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::claims::Life;
use super::discard::Discard;
use super::plan::{Plan, Planner};
use super::stats::Stats;
use super::verdicts::{self, Verdict, VerdictRx};
use super::writer::{Report as WriterReport, Writer, WriterMsg};
use super::{Shared, lock};
use crate::Layout;
use crate::by_id::ById;
use crate::digest::entry_identity;
use crate::error::{Error, Result};
use crate::fsroot::validate;
use crate::io::Pools;
use crate::net;
use crate::observe::{Observe, Observer};
use crate::session::receiver::{
    Action, End, Limits, ReceiverControl, Refusal, RefusalReason, Report, SessionOutcome,
};
use crate::session::reports::Reported;
use crate::spans::carry;
use crate::summary::{IoInEffect, ReceiverSummary};
use crate::tuning::SyncLevel;
use crate::units::{fmt_bytes, gbps};
use crate::wire::{
    Codecs, FileEntry, FrameReader, KEEPALIVE_INTERVAL, SessionId, Stripe, StripeRole, Verification,
};

/// What data streams need to know about their session.
pub(crate) struct Session {
    pub(super) verify: Verification,
    /// The codecs blocks may come packed in (the sender's `Open`).
    pub(super) codecs: Codecs,
    /// The planned files' sizes, which place their blocks.
    pub(super) sizes: ById<u64>,
    pub(super) block_size: u64,
    pub(super) pool: Pools,
    pub(super) writer_tx: mpsc::Sender<WriterMsg>,
    pub(super) data_streams: Mutex<Vec<Conn>>,
    pub(super) aborted: AtomicBool,
    pub(super) stats: Arc<Stats>,
    pub(super) observer: Observe,
}

fn hex(id: &SessionId) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// The first 8 hex digits of a session id, as the summary shows it.
pub(super) fn short(id: &SessionId) -> String {
    hex(id)[..8].to_owned()
}

/// Releases the session's registrations however the control thread ends.
struct Registration<'a> {
    shared: &'a Shared,
    id: SessionId,
    life: Arc<Life>,
    /// Every file was answered: let the data streams finish writing the
    /// acknowledgements queued for them rather than cut them.
    graceful: bool,
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        if let Some(s) = self.shared.sessions.withdraw(&self.id) {
            s.aborted.store(true, Ordering::SeqCst);
            // A file's result can overtake the acknowledgements of its last
            // blocks, which wait in the ack threads' queues; the sender
            // counts on them, and then parks or closes each stream (its
            // thread gives it a grace period for that, see `stream`). A
            // session that ended badly cuts them.
            if !self.graceful {
                for st in lock(&s.data_streams).iter() {
                    let _ = st.shutdown(Shutdown::Both);
                }
            }
            self.shared.cfg.observer.session_closed();
        }
        self.shared.claims.release(&self.life);
    }
}

/// Plan outcomes written together while a manifest is prepared...
const PLAN_BATCH: usize = 256;
/// ...or written after this long however few: well within the keepalive
/// interval (`wire::KEEPALIVE_INTERVAL`, 5 s).
const PLAN_FLUSH: Duration = Duration::from_secs(1);

/// Writes the frames the core wants sent, batched into one write, and
/// returns the first thing it wants done that is not a frame. A session
/// the core has closed stays closed even when its last words cannot be
/// written.
fn flush(
    core: &mut ReceiverControl,
    stream: &mut Conn,
    out: &mut Vec<u8>,
) -> Result<Option<Action>> {
    use std::io::Write;
    out.clear();
    let mut next = None;
    while let Some(action) = core.poll_action() {
        match action {
            Action::Send(frame) => crate::wire::encode(&frame, out),
            other => {
                next = Some(other);
                break;
            }
        }
    }
    crate::wire::pack(out);
    let written = if out.is_empty() {
        Ok(())
    } else {
        stream
            .write_all(out)
            .map_err(|e| Error::net("writing to the sender", e))
    };
    if out.capacity() > 1 << 20 {
        // The plan went out: do not hold its bytes all session, nor what
        // the manifest and plan took while they were built (freed by now,
        // but kept by the allocator unless given back).
        *out = Vec::new();
        crate::io::sys::release_freed_memory();
    }
    match (written, next) {
        // The sender missed its last results: not a clean end after all.
        (Err(e), Some(Action::Close(end))) if end.is_clean() => {
            core.handle_lost(e.to_string());
            Err(e)
        }
        (_, Some(Action::Close(end))) => Ok(Some(Action::Close(end))),
        (Err(e), _) => Err(e),
        (Ok(()), next) => Ok(next),
    }
}

/// The error a session that ended with `end` returns, if any.
fn ended(observer: &dyn Observer, end: End) -> Result<()> {
    // Counted here, where every refusal ends: the core's own (block size,
    // manifest) and the shell's (busy, memory, destination).
    match &end {
        End::Refused(r) => observer.refused(r.reason.metric_label()),
        End::Violation(v) => observer.violation(v.kind),
        _ => {}
    }
    match end {
        End::Finished | End::Answered => Ok(()),
        End::Refused(r) => Err(Error::Remote {
            message: r.message,
            retryable: r.retryable,
        }),
        End::WriterFailed { message, retryable } => Err(Error::Writer { message, retryable }),
        End::Violation(v) => Err(Error::Violation(v)),
        End::Silent(silent) => Err(Error::silent(
            "sender",
            silent,
            " (--idle-timeout), so it is presumed gone; what it wrote is checkpointed",
        )),
        End::Lost(reason) => Err(Error::ConnectionLost(reason)),
    }
}

/// What the shell did not expect the core to ask for at this point.
fn out_of_order(action: Option<Action>) -> Error {
    Error::Internal(format!(
        "the session core asked for {action:?} out of order"
    ))
}

/// The control connection, and the session core that decides what is read
/// and written on it.
struct Control<'a> {
    shared: &'a Arc<Shared>,
    stream: Conn,
    reader: FrameReader,
    /// The frames of one write (see `flush`).
    out: Vec<u8>,
    core: ReceiverControl,
}

impl<'a> Control<'a> {
    fn new(shared: &'a Arc<Shared>, stream: Conn) -> Result<Self> {
        let idle_timeout = shared.cfg.idle_timeout;
        // No single read or write of the session may stall longer than the
        // idle deadline: a sender that stops mid-frame, or stops reading, is
        // as gone as one that stops writing.
        stream
            .set_read_timeout(Some(idle_timeout))
            .and_then(|()| stream.set_write_timeout(Some(idle_timeout)))
            .map_err(|e| Error::net("setting the control connection's timeouts", e))?;
        // The sender picks the block size, but the receiver's memory is its
        // own: a session needs at least two buffers within --buffer.
        let core = ReceiverControl::new(Limits {
            discard: shared.cfg.discard,
            ..Limits::new(shared.cfg.buffer / 2, KEEPALIVE_INTERVAL, idle_timeout)
        });
        Ok(Self {
            shared,
            stream,
            reader: FrameReader::unpacking(),
            out: Vec::new(),
            core,
        })
    }

    fn flush(&mut self) -> Result<Option<Action>> {
        flush(&mut self.core, &mut self.stream, &mut self.out)
    }

    /// Feeds frames to the core until it asks for something else.
    fn read_until_action(&mut self) -> Result<Action> {
        loop {
            let frame = self.reader.read(&mut self.stream)?;
            self.core.handle_frame(frame, Instant::now());
            if let Some(action) = self.flush()? {
                return Ok(action);
            }
        }
    }

    /// Tells the sender why the session cannot go on, and returns the error.
    fn refuse(&mut self, refusal: Refusal) -> Result<()> {
        self.core.handle_refused(refusal);
        match flush(&mut self.core, &mut self.stream, &mut Vec::new())? {
            Some(Action::Close(end)) => ended(&*self.shared.cfg.observer, end),
            other => Err(out_of_order(other)),
        }
    }

    /// Decides each entry of `manifest`, writing the outcomes to the sender
    /// as they are decided.
    fn plan<'p>(
        &mut self,
        manifest: Manifest,
        (terms, stripe): (&Terms, Option<&Stripe>),
        life: &Life,
        stats: &'p Stats,
    ) -> Result<Plan<'p>>
    where
        'a: 'p,
    {
        let Manifest {
            entries,
            identities,
        } = manifest;
        let mut planner = Planner::new(
            self.shared,
            entries.len(),
            terms.block_size,
            (terms.discard, terms.dry_run),
            terms.sync,
            stats,
            stripe,
        );
        let mut seen_paths = HashSet::new();
        let mut written_at = Instant::now();
        for (i, (e, &identity)) in entries.iter().zip(&identities).enumerate() {
            // Preparing a large tree takes a while. The outcomes decided so far
            // go out in batches, and at least every PLAN_FLUSH (with the run
            // of fresh files the core holds): the core counts a queued outcome
            // as heard by the sender, so it queues no keepalive while outcomes
            // are queued, and a slow filesystem must not hold them back until
            // the sender's idle deadline.
            let now = Instant::now();
            self.core.handle_timeout(now);
            if i % PLAN_BATCH == 0 || now.saturating_duration_since(written_at) >= PLAN_FLUSH {
                written_at = now;
                self.core.flush_plan(now);
                if let Some(action) = self.flush()? {
                    return Err(out_of_order(Some(action)));
                }
            }
            life.heard(now);
            let repeated = !seen_paths.insert(e.path.as_str());
            // Between the pieces of a file read to decide it: keepalives
            // when due (a check of the clock otherwise), and the read
            // given up once the sender cannot be written to.
            let mut still_here = || {
                let now = Instant::now();
                life.heard(now);
                self.core.handle_timeout(now);
                self.flush().is_ok()
            };
            let outcome = planner.decide(e, (identity, repeated), &mut still_here);
            self.core.handle_planned(e.file_id, outcome, now);
        }
        drop(seen_paths);
        drop(entries);
        drop(identities);
        Ok(planner.finish())
    }

    /// Passes the sender's reports to the writer and the writer's verdicts to
    /// the sender until the core says the session is over; the core also
    /// says when the sender must hear from us and when it has been silent too
    /// long.
    fn results(
        &mut self,
        verdicts: &VerdictRx,
        writer_tx: &mpsc::Sender<WriterMsg>,
        life: &Life,
    ) -> Result<End> {
        loop {
            let now = Instant::now();
            self.core.handle_timeout(now);
            match self.flush()? {
                None => {}
                Some(Action::Report(report)) => {
                    let msg = match report {
                        Report::Done {
                            file_id,
                            digest,
                            identity,
                        } => WriterMsg::FileDone(Reported {
                            file_id,
                            digest,
                            identity,
                        }),
                        Report::Abort { file_id, message } => WriterMsg::Abort { file_id, message },
                    };
                    writer_tx.send(msg).map_err(|_| Error::Writer {
                        message: "the writer stopped".into(),
                        retryable: false,
                    })?;
                    continue;
                }
                Some(Action::Close(end)) => return Ok(end),
                Some(other) => return Err(out_of_order(Some(other))),
            }
            let wake = self.core.poll_timeout().unwrap_or(now + KEEPALIVE_INTERVAL);
            // Frames of a packed frame already read are taken first.
            let (readable, woken) = if self.reader.has_pending() {
                (true, false)
            } else {
                net::wait_readable_or(
                    &self.stream,
                    verdicts.fd(),
                    wake.saturating_duration_since(now),
                )
                .map_err(|e| Error::net("waiting for the sender", e))?
            };
            if woken {
                for v in verdicts.take() {
                    self.core.handle_verdict(v, Instant::now());
                }
            }
            // Read even when verdicts came too: a writer busy with a tree of
            // small files must not keep the sender's frames (and its
            // keepalives, which the idle deadline waits for) unread.
            if readable && self.core.end().is_none() {
                let frame = self.reader.read(&mut self.stream)?;
                let now = Instant::now();
                life.heard(now);
                self.core.handle_frame(frame, now);
            }
        }
    }

    /// Stops the writer and tells the sender how the session ended, which
    /// is `outcome` unless the writer has more to say; returns the writer's
    /// report.
    fn stop_writer(
        &mut self,
        writer_tx: &mpsc::Sender<WriterMsg>,
        writer: JoinHandle<WriterReport>,
        verdicts: &VerdictRx,
        outcome: &Result<()>,
    ) -> WriterReport {
        let _ = writer_tx.send(WriterMsg::Stop);
        let report = writer.join().unwrap_or_else(|_| WriterReport::panicked());
        // A writer that failed and stopped before this thread read its verdict
        // (it saw only "the writer stopped"): the sender still hears the real
        // error, and whether retrying can help. Only then is the session lost.
        for v in verdicts.take() {
            if matches!(v, Verdict::Failed { .. }) {
                self.core.handle_verdict(v, Instant::now());
            }
        }
        if let Err(e) = outcome {
            self.core.handle_lost(e.to_string());
        }
        let _ = self.flush();
        report
    }
}

/// What the sender opened the session with, and when.
struct Terms {
    id: SessionId,
    block_size: u64,
    /// The data streams the sender means to open.
    streams: u16,
    verify: Verification,
    /// A memory-to-memory session: its blocks are verified and dropped.
    discard: bool,
    /// The codecs its blocks may come packed in.
    codecs: Codecs,
    /// Which files are answered present rather than taken.
    sync: SyncLevel,
    /// A dry run: the plan is all it does.
    dry_run: bool,
    /// When its control connection was taken up.
    started: Instant,
}

/// What an admitted session holds: its buffers (a spare pool, or their
/// share of the memory budget) and its liveness.
struct Admitted {
    spare: Option<Pools>,
    /// Buffers of the session's pool.
    count: usize,
    reservation: super::budget::Reservation,
    life: Arc<Life>,
}

/// Admits session `id`, or says why not: as many sessions as the receiver
/// takes, its buffer memory taken, or the id already open. The buffers are
/// held before anything is written for the session.
fn admit(
    shared: &Shared,
    terms: &Terms,
    stream: &Conn,
    started: Instant,
) -> Result<std::result::Result<Admitted, Refusal>> {
    let (id, block_size) = (terms.id, terms.block_size);
    if shared.sessions.len() >= shared.cfg.max_sessions {
        return Ok(Err(Refusal {
            retryable: true,
            message: format!(
                "receiver busy: {} sessions already open (--max-sessions); retry later",
                shared.cfg.max_sessions
            ),
            reason: RefusalReason::Busy,
        }));
    }
    // A dry run holds no buffers: no block comes.
    let count = match terms.dry_run {
        true => 0,
        false => (shared.cfg.buffer / block_size).clamp(2, 4096) as usize,
    };
    let spare = match terms.dry_run {
        true => None,
        false => lock(&shared.spare_pool).take_if(|(p, _)| p.is_shaped(block_size as usize, count)),
    };
    let (spare, reservation) = match spare {
        Some((pool, r)) => (Some(pool), r),
        None => match shared
            .memory
            .reserve(Pools::bytes_for(block_size as usize, count))
        {
            Ok(r) => (None, r),
            Err(used) => {
                return Ok(Err(Refusal {
                    retryable: true,
                    message: format!(
                        "receiver busy: {} of its {} of buffer memory (--max-memory) is in use; retry later",
                        fmt_bytes(used),
                        fmt_bytes(shared.memory.max())
                    ),
                    reason: RefusalReason::Memory,
                }));
            }
        },
    };
    let life = Arc::new(Life::new(
        stream
            .try_clone()
            .map_err(|e| Error::net("cloning the control connection", e))?,
        started,
    ));
    if !shared.sessions.announce(id) {
        return Ok(Err(Refusal {
            retryable: false,
            message: format!("session {} is already open; pick a fresh id", hex(&id)),
            reason: RefusalReason::SessionOpen,
        }));
    }
    Ok(Ok(Admitted {
        spare,
        count,
        reservation,
        life,
    }))
}

pub(crate) fn run_control(shared: &Arc<Shared>, stream: Conn) -> Result<()> {
    let result = control(shared, stream);
    crate::io::sys::release_freed_memory();
    result
}

fn control(shared: &Arc<Shared>, stream: Conn) -> Result<()> {
    let started = Instant::now();
    let mut ctl = Control::new(shared, stream)?;
    let terms = match ctl.read_until_action()? {
        Action::Admit {
            session,
            block_size,
            streams,
            verify,
            discard,
            codecs,
            sync,
            dry_run,
        } => Terms {
            id: session,
            block_size,
            streams,
            verify,
            discard,
            codecs,
            sync,
            dry_run,
            started,
        },
        Action::Close(end) => return ended(&*shared.cfg.observer, end),
        other => return Err(out_of_order(Some(other))),
    };
    // Everything this session and its writer log carries its id.
    let _session = tracing::info_span!("session", id = %short(&terms.id)).entered();
    let Admitted {
        spare,
        count,
        reservation,
        life,
    } = match admit(shared, &terms, &ctl.stream, started)? {
        Ok(a) => a,
        Err(refusal) => return ctl.refuse(refusal),
    };
    ctl.core.handle_admitted(Ok(()));
    // From here on, dropping this releases the id and any claimed paths.
    let mut reg = Registration {
        shared,
        id: terms.id,
        life: Arc::clone(&life),
        graceful: false,
    };

    let manifest = match ctl.read_until_action()? {
        Action::Prepare(entries) => Manifest::new(entries),
        Action::Close(end) => return ended(&*shared.cfg.observer, end),
        other => return Err(out_of_order(Some(other))),
    };
    let stripe = ctl.core.stripe().cloned();
    if let Err(refusal) = take_manifest(shared, &manifest, (&terms, stripe.as_ref()), &life) {
        return ctl.refuse(refusal);
    }
    let stats = Arc::new(Stats::default());
    let plan = ctl.plan(manifest, (&terms, stripe.as_ref()), &life, &stats)?;
    if terms.dry_run {
        drop(plan);
        return end_dry_run(&mut ctl, &terms, &stats, (reg, &life));
    }
    let resumed_bytes = plan.resumed_bytes;
    let pool = match spare {
        Some(p) => p,
        None => Pools::new(terms.block_size as usize, count)?,
    };
    let Running {
        writer_tx,
        verdicts,
        writer,
        session,
    } = start(shared, (&terms, stripe.map(|s| s.role)), plan, pool, &stats)?;

    ctl.core.handle_plan_end(Instant::now());
    // The manifest and what planning it took are freed by now: give them
    // back rather than hold them all session.
    crate::io::sys::release_freed_memory();
    // Results flow until the sender finishes or goes away.
    let outcome = ctl
        .results(&verdicts, &writer_tx, &life)
        .and_then(|end| ended(&*shared.cfg.observer, end));
    let report = ctl.stop_writer(&writer_tx, writer, &verdicts, &outcome);
    reg.graceful = ctl.core.end().is_some_and(End::is_clean) && report.error.is_none();
    drop(reg);
    // Buffers still held by a stream thread that has not noticed the end
    // go back to the free list when it lets go, so the next session can
    // take the pool now. A stopped receiver takes no more sessions: it
    // keeps none (its stop cleared the slot, under this lock, after
    // setting the flag looked at here).
    {
        let mut spare = lock(&shared.spare_pool);
        if !shared.stopped() {
            spare.put((session.pool.clone(), reservation), Instant::now());
        }
    }

    let ending = ctl
        .core
        .outcome(report.error.as_deref(), life.was_taken_over());
    let summary = summary(&terms, ending, &session, report, resumed_bytes);
    tracing::info!(session = %summary.session, outcome = %summary.outcome, bytes = summary.bytes_written, "session ended");
    shared.cfg.observer.summarized(&summary);
    shared.record(summary);
    // Closed last: a sender waiting for this close knows the session is
    // over, its destinations released and its summary recorded.
    if outcome.is_ok() {
        let _ = ctl.stream.shutdown(Shutdown::Both);
    }
    outcome
}

/// The rest of a dry run's session, once its plan is decided: the plan's
/// end, then the sender's `Finish`. No writer, no buffers and no data
/// stream: nothing a running job's progress reads is touched.
fn end_dry_run(
    ctl: &mut Control<'_>,
    terms: &Terms,
    stats: &Stats,
    (mut reg, life): (Registration<'_>, &Arc<Life>),
) -> Result<()> {
    let shared = ctl.shared;
    ctl.core.handle_plan_end(Instant::now());
    // The core owes nothing for a dry plan: no report reaches a writer,
    // and no verdict comes back.
    let (_verdicts_tx, verdicts) =
        verdicts::channel().map_err(|e| Error::io("creating the writer's eventfd", e))?;
    let (writer_tx, _writer_rx) = mpsc::channel();
    let outcome = ctl
        .results(&verdicts, &writer_tx, life)
        .and_then(|end| ended(&*shared.cfg.observer, end));
    if let Err(e) = &outcome {
        ctl.core.handle_lost(e.to_string());
        let _ = ctl.flush();
    }
    reg.graceful = ctl.core.end().is_some_and(End::is_clean);
    drop(reg);
    let summary = ReceiverSummary {
        session: hex(&terms.id),
        outcome: ctl.core.outcome(None, life.was_taken_over()),
        bytes_written: 0,
        bytes_skipped_resume: 0,
        seconds: terms.started.elapsed().as_secs_f64(),
        gbps: 0.0,
        io: IoInEffect {
            io_mode: shared.cfg.io_mode,
            io_fallback: None,
            hugepages: false,
            buffer_pages: "none".into(),
        },
        streams: 0,
        requested_streams: terms.streams,
        blocks_rejected: 0,
        files_ok: 0,
        files_failed: stats.refused.load(Ordering::Relaxed),
        files_present: stats.present.load(Ordering::Relaxed),
        memory_to_memory: false,
        dry_run: true,
        warnings: Vec::new(),
    };
    tracing::info!(session = %summary.session, outcome = %summary.outcome, "dry run ended");
    shared.cfg.observer.summarized(&summary);
    shared.record(summary);
    if outcome.is_ok() {
        let _ = ctl.stream.shutdown(Shutdown::Both);
    }
    outcome
}

/// Checks a stripe session's storage and claims the manifest's
/// destinations, or says why the session cannot have them.
fn take_manifest(
    shared: &Shared,
    manifest: &Manifest,
    (terms, stripe): (&Terms, Option<&Stripe>),
    life: &Arc<Life>,
) -> std::result::Result<(), Refusal> {
    if let Some(refusal) = stripe.and_then(|s| stripe_refusal(shared, s, terms)) {
        return Err(refusal);
    }
    // A dry run writes nothing, so it claims nothing: it may plan a tree
    // that a running transfer is writing.
    claim(
        shared,
        manifest,
        (terms.discard || terms.dry_run, stripe.map(|s| s.group)),
        life,
    )
}

/// Why a session of a transfer over several pairs cannot go on here, if
/// it cannot: a memory-to-memory test has no shared files, and a root
/// without the transfer's marker is not the storage the others share.
fn stripe_refusal(shared: &Shared, stripe: &Stripe, terms: &Terms) -> Option<Refusal> {
    let message = if terms.discard {
        "a memory-to-memory test (--synthetic) runs on one pair".to_string()
    } else {
        super::stripe::check_marker(&shared.root, stripe).err()?
    };
    tracing::warn!("stripe session refused: {message}");
    Some(Refusal {
        retryable: false,
        message,
        reason: RefusalReason::NotShared,
    })
}

/// A manifest's entries as the session claims and plans them.
struct Manifest {
    entries: Vec<FileEntry>,
    /// Each entry's identity as it arrived.
    identities: Vec<u64>,
}

impl Manifest {
    fn new(mut entries: Vec<FileEntry>) -> Self {
        // Each file's identity as it arrived, before the spelling below
        // changes its path: the sender's report must name the same.
        let identities: Vec<u64> = entries.iter().map(entry_identity).collect();
        // One spelling per destination (`f`, `f/` and `f//` are one file), so
        // that claims and duplicates are compared as the filesystem sees them.
        for e in &mut entries {
            if let Ok(d) = validate(&e.path) {
                e.path = d.rel.into();
            }
        }
        Self {
            entries,
            identities,
        }
    }
}

/// Claims the destinations of `manifest` so that two sessions never write
/// one file, taking them over from a session whose sender has gone silent;
/// sessions of one transfer over several pairs (`group`) write disjoint
/// pieces of their files and share them.
/// A session that writes nothing (`none`) claims nothing.
fn claim(
    shared: &Shared,
    manifest: &Manifest,
    (none, group): (bool, Option<u64>),
    life: &Arc<Life>,
) -> std::result::Result<(), Refusal> {
    let takeover_after = (3 * KEEPALIVE_INTERVAL).min(shared.cfg.idle_timeout);
    let paths: Vec<&str> = if none {
        Vec::new()
    } else {
        manifest.entries.iter().map(|e| e.path.as_str()).collect()
    };
    // The sender waits quietly for the plan; the receiver's own work on
    // the session (claiming, then preparing) counts as hearing from it, or
    // a long claim wait or plan would look like a vanished sender.
    life.heard(Instant::now());
    let claimed = shared.claims.claim_in(&paths, life, takeover_after, group);
    life.heard(Instant::now());
    claimed.map_err(|busy| Refusal {
        retryable: true,
        message: busy.message(),
        reason: RefusalReason::DestinationBusy,
    })
}

/// What the control thread holds of a running session.
struct Running {
    writer_tx: mpsc::Sender<WriterMsg>,
    verdicts: VerdictRx,
    writer: JoinHandle<WriterReport>,
    session: Arc<Session>,
}

/// Starts the writer of `plan`'s files, and opens the session to its data
/// streams.
fn start(
    shared: &Arc<Shared>,
    (terms, stripe): (&Terms, Option<StripeRole>),
    plan: Plan<'_>,
    pool: Pools,
    stats: &Arc<Stats>,
) -> Result<Running> {
    let Plan {
        files,
        sizes,
        pieces,
        ..
    } = plan;
    let (writer_tx, writer_rx) = mpsc::channel();
    // The writer's verdicts come back to this thread, which alone writes
    // on the control connection.
    let (verdicts_tx, verdicts) =
        verdicts::channel().map_err(|e| Error::io("creating the writer's eventfd", e))?;
    // A memory-to-memory session's blocks go to a writer that drops them.
    let writer: Box<dyn FnOnce() -> WriterReport + Send> = if terms.discard {
        let sink = Discard::new(
            sizes
                .iter()
                .map(|(id, &size)| (id, Layout::new(size, terms.block_size))),
            writer_rx,
            verdicts_tx,
            terms.verify,
            Arc::clone(stats),
            Arc::clone(&shared.cfg.observer),
            shared.cfg.io_mode,
        );
        Box::new(move || sink.run())
    } else {
        let writer = Writer::new(
            Arc::clone(shared),
            files,
            writer_rx,
            verdicts_tx,
            terms.verify,
            Arc::clone(stats),
        )?
        .in_stripe(stripe, pieces);
        Box::new(move || writer.run())
    };
    // The writer counted what the files keep from earlier sessions.
    stats.published_before.store(
        shared.job.published.load(Ordering::Relaxed),
        Ordering::Relaxed,
    );
    shared.job.first_plan.get_or_init(Instant::now);
    *lock(&shared.latest) = Some(Arc::clone(stats));
    let session = Arc::new(Session {
        verify: terms.verify,
        codecs: terms.codecs,
        sizes,
        block_size: terms.block_size,
        pool,
        writer_tx: writer_tx.clone(),
        data_streams: Mutex::default(),
        aborted: AtomicBool::new(false),
        stats: Arc::clone(stats),
        observer: Arc::clone(&shared.cfg.observer),
    });
    shared.sessions.publish(terms.id, Arc::clone(&session));
    shared.cfg.observer.session_opened();
    let writer = std::thread::Builder::new()
        .name("writer".into())
        .spawn(carry(writer))
        .map_err(|e| Error::io("starting the writer thread", e))?;
    Ok(Running {
        writer_tx,
        verdicts,
        writer,
        session,
    })
}

/// The summary of session `terms`, which ended as `outcome` with the
/// writer's `report`.
fn summary(
    terms: &Terms,
    outcome: SessionOutcome,
    session: &Session,
    report: WriterReport,
    resumed_bytes: u64,
) -> ReceiverSummary {
    let stats = &session.stats;
    let secs = terms.started.elapsed().as_secs_f64();
    let bytes = stats.bytes.load(Ordering::Relaxed);
    let huge_note = session.pool.huge_note().map(str::to_owned);
    ReceiverSummary {
        session: hex(&terms.id),
        outcome,
        bytes_written: bytes,
        bytes_skipped_resume: resumed_bytes,
        seconds: secs,
        gbps: gbps(bytes, secs),
        io: IoInEffect {
            io_mode: report.io_mode,
            io_fallback: report.fallback,
            hugepages: session.pool.hugepages(),
            buffer_pages: session.pool.pages(),
        },
        streams: stats.streams.load(Ordering::Relaxed),
        requested_streams: terms.streams,
        blocks_rejected: stats.rejected.load(Ordering::Relaxed),
        files_ok: stats.files_ok.load(Ordering::Relaxed),
        files_failed: stats.files_failed.load(Ordering::Relaxed)
            + stats.refused.load(Ordering::Relaxed),
        files_present: stats.present.load(Ordering::Relaxed),
        memory_to_memory: terms.discard,
        dry_run: terms.dry_run,
        warnings: report.warnings.into_iter().chain(huge_note).collect(),
    }
}
