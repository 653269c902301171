//! A session: its control connection (manifest, plan, results) and the
//! data streams that join it.

use std::collections::HashSet;
use std::net::{Shutdown, TcpStream};
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
use super::{ParkKey, Shared, lock};
use crate::Layout;
use crate::by_id::ById;
use crate::digest::{BlockHasher, HASH_PIECE, entry_identity};
use crate::error::{Error, Result};
use crate::fsroot::validate;
use crate::io::{PoolBuf, Pools};
use crate::net;
use crate::observe::{Observe, Observer};
use crate::session::describe;
use crate::session::receiver::{
    Action, End, Limits, ReceiverControl, Refusal, RefusalReason, Report, SessionOutcome,
};
use crate::session::reports::Reported;
use crate::spans::carry;
use crate::summary::{IoInEffect, ReceiverSummary};
use crate::tuning::STREAMS;
use crate::units::{fmt_bytes, gbps};
use crate::violation::{Violation, ViolationKind};
use crate::wire::{
    BlockHeader, FileEntry, Frame, FrameReader, KEEPALIVE_INTERVAL, MAX_SMALL_FRAME, SessionId,
    Verification, write_frame,
};

/// Acknowledgements queued per data stream before its reader waits.
const ACK_QUEUE: usize = 1024;

/// Once its session has ended, a data stream's sender has this long to
/// park it (`Frame::Park`) or close it.
const PARK_GRACE: Duration = Duration::from_secs(10);

/// How often a data stream waiting for its next block looks whether its
/// session has ended.
const END_POLL: Duration = Duration::from_secs(1);

/// How a data stream's part in its session ended.
enum StreamEnd {
    /// Closed, cut, or done.
    Closed,
    /// The sender parked it for its next session.
    Park,
}

/// What data streams need to know about their session.
pub(crate) struct Session {
    verify: Verification,
    /// The planned files' sizes, which place their blocks.
    sizes: ById<u64>,
    block_size: u64,
    pool: Pools,
    writer_tx: mpsc::Sender<WriterMsg>,
    data_streams: Mutex<Vec<TcpStream>>,
    aborted: AtomicBool,
    stats: Arc<Stats>,
    observer: Observe,
}

fn hex(id: &SessionId) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// The first 8 hex digits of a session id, as the summary shows it.
fn short(id: &SessionId) -> String {
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
            // thread gives it `PARK_GRACE` for that). A session that ended
            // badly cuts them.
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

/// The data streams one session takes: the most a sender opens.
const MOST_STREAMS: usize = STREAMS.max as usize;

/// Writes the frames the core wants sent, batched into one write, and
/// returns the first thing it wants done that is not a frame. A session
/// the core has closed stays closed even when its last words cannot be
/// written.
fn flush(
    core: &mut ReceiverControl,
    stream: &mut TcpStream,
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
    stream: TcpStream,
    reader: FrameReader,
    /// The frames of one write (see `flush`).
    out: Vec<u8>,
    core: ReceiverControl,
}

impl<'a> Control<'a> {
    fn new(shared: &'a Arc<Shared>, stream: TcpStream) -> Result<Self> {
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
            reader: FrameReader::default(),
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
        terms: &Terms,
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
            terms.discard,
            stats,
        );
        let mut seen_paths = HashSet::new();
        let mut written_at = Instant::now();
        for (i, (e, &identity)) in entries.iter().zip(&identities).enumerate() {
            // Preparing a large tree takes a while. The outcomes decided so far
            // go out in batches, and at least every PLAN_FLUSH: the core counts
            // a queued outcome as heard by the sender, so it queues no
            // keepalive while outcomes are queued, and a slow filesystem must
            // not hold them back until the sender's idle deadline.
            let now = Instant::now();
            self.core.handle_timeout(now);
            if i % PLAN_BATCH == 0 || now.saturating_duration_since(written_at) >= PLAN_FLUSH {
                written_at = now;
                if let Some(action) = self.flush()? {
                    return Err(out_of_order(Some(action)));
                }
            }
            life.heard(now);
            let repeated = !seen_paths.insert(e.path.as_str());
            let outcome = planner.decide(e, identity, repeated);
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
            let (readable, woken) = net::wait_readable_or(
                &self.stream,
                verdicts.fd(),
                wake.saturating_duration_since(now),
            )
            .map_err(|e| Error::net("waiting for the sender", e))?;
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
    id: SessionId,
    block_size: u64,
    stream: &TcpStream,
    started: Instant,
) -> Result<std::result::Result<Admitted, Refusal>> {
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
    let count = (shared.cfg.buffer / block_size).clamp(2, 4096) as usize;
    let spare = lock(&shared.spare_pool).take_if(|(p, _)| p.is_shaped(block_size as usize, count));
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

pub(crate) fn run_control(shared: &Arc<Shared>, stream: TcpStream) -> Result<()> {
    let result = control(shared, stream);
    crate::io::sys::release_freed_memory();
    result
}

fn control(shared: &Arc<Shared>, stream: TcpStream) -> Result<()> {
    let started = Instant::now();
    let mut ctl = Control::new(shared, stream)?;
    let terms = match ctl.read_until_action()? {
        Action::Admit {
            session,
            block_size,
            streams,
            verify,
            discard,
        } => Terms {
            id: session,
            block_size,
            streams,
            verify,
            discard,
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
    } = match admit(shared, terms.id, terms.block_size, &ctl.stream, started)? {
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
    if let Err(refusal) = claim(shared, &manifest, terms.discard, &life) {
        return ctl.refuse(refusal);
    }
    let stats = Arc::new(Stats::default());
    let plan = ctl.plan(manifest, &terms, &life, &stats)?;
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
    } = start(shared, &terms, plan, pool, &stats)?;

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
/// one file, taking them over from a session whose sender has gone silent.
/// A memory-to-memory session writes none.
fn claim(
    shared: &Shared,
    manifest: &Manifest,
    discard: bool,
    life: &Arc<Life>,
) -> std::result::Result<(), Refusal> {
    let takeover_after = (3 * KEEPALIVE_INTERVAL).min(shared.cfg.idle_timeout);
    let paths: Vec<&str> = if discard {
        Vec::new()
    } else {
        manifest.entries.iter().map(|e| e.path.as_str()).collect()
    };
    // The sender waits quietly for the plan; the receiver's own work on
    // the session (claiming, then preparing) counts as hearing from it, or
    // a long claim wait or plan would look like a vanished sender.
    life.heard(Instant::now());
    let claimed = shared.claims.claim(&paths, life, takeover_after);
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
    terms: &Terms,
    plan: Plan<'_>,
    pool: Pools,
    stats: &Arc<Stats>,
) -> Result<Running> {
    let Plan { files, sizes, .. } = plan;
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
        )?;
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
        memory_to_memory: terms.discard,
        warnings: report.warnings.into_iter().chain(huge_note).collect(),
    }
}

/// Runs data stream `idx` of session `id`; returns the connection, and
/// its key in `Shared::parked`, when the sender parked it, clean, for its
/// next session.
pub(crate) fn run_stream(
    shared: &Arc<Shared>,
    mut stream: TcpStream,
    id: SessionId,
    idx: u16,
) -> Result<Option<(TcpStream, ParkKey)>> {
    let _stream = tracing::info_span!("stream", session = %short(&id), idx).entered();
    let session = find_session(shared, &mut stream, &id)?;
    let ends = stream.local_addr().ok().zip(stream.peer_addr().ok());
    join(&session, &mut stream)?;
    if session.aborted.load(Ordering::SeqCst) {
        return Ok(None);
    }
    session.stats.streams.fetch_add(1, Ordering::Relaxed);
    let acks = Acks::start(&stream, shared.cfg.idle_timeout, idx)?;
    let result = receive_blocks(&session, &mut stream, &acks.tx);
    if let (Ok(StreamEnd::Park), Some(key)) = (&result, ends) {
        return Ok(if park(shared, &session, &stream, key, acks) {
            Some((stream, key))
        } else {
            None
        });
    }
    if let Ok(StreamEnd::Park) = result {
        // Its ends unknown, it could not be told from its siblings.
        let _ = stream.shutdown(Shutdown::Both);
    }
    let result = result.map(|_| None);
    if let Err(e @ (Error::Protocol(_) | Error::Violation(_))) = &result {
        if let Error::Violation(v) = e {
            session.observer.violation(v.kind);
        }
        // Written directly: the ack thread may be gone, and the peer must
        // hear why before the close, and that a new connection can get
        // past a damaged frame.
        let _ = write_frame(
            &mut stream,
            &Frame::Error {
                retryable: e.is_retryable(),
                message: e.to_string(),
            },
        );
        // Clones held by the session would keep the socket open.
        let _ = stream.shutdown(Shutdown::Both);
    }
    result
}

/// Session `id`, once it is open; the sender of `stream` hears when it
/// is not.
fn find_session(shared: &Shared, stream: &mut TcpStream, id: &SessionId) -> Result<Arc<Session>> {
    let stopping = || shared.stop.load(Ordering::SeqCst);
    let Some(session) = shared.sessions.wait(id, shared.cfg.join_wait, stopping) else {
        let message = "unknown session: open it on a control connection first".to_string();
        let _ = write_frame(
            stream,
            &Frame::Error {
                retryable: true,
                message: message.clone(),
            },
        );
        return Err(Violation::new(ViolationKind::Unknown, message).into());
    };
    Ok(session)
}

/// Adds `stream` to `session`'s data streams, or refuses it past the most
/// one session takes.
fn join(session: &Session, stream: &mut TcpStream) -> Result<()> {
    // Each join is a connection and two threads here. Our senders open
    // at most STREAMS.max, added ones included; more would let one
    // session hold the connections every other session needs.
    let mut joined = lock(&session.data_streams);
    if joined.len() >= MOST_STREAMS {
        drop(joined);
        let v = Violation::new(
            ViolationKind::Excess,
            format!(
                "this session already has {MOST_STREAMS} data streams, the most one session takes"
            ),
        );
        session.observer.violation(v.kind);
        let _ = write_frame(
            stream,
            &Frame::Error {
                retryable: false,
                message: v.to_string(),
            },
        );
        return Err(v.into());
    }
    joined.push(
        stream
            .try_clone()
            .map_err(|e| Error::net("cloning a stream", e))?,
    );
    Ok(())
}

/// A data stream's acknowledgements, which a thread of their own writes.
struct Acks {
    tx: mpsc::SyncSender<Frame>,
    /// Says whether it wrote `Parked`, the last frame it writes.
    thread: JoinHandle<bool>,
}

impl Acks {
    /// Sets data stream `idx`'s timeouts and starts the thread that writes
    /// its acknowledgements.
    fn start(stream: &TcpStream, idle_timeout: Duration, idx: u16) -> Result<Self> {
        // Bounded, and the socket's writes too: a sender that stops reading
        // its acknowledgements stops this stream (and, after the idle timeout,
        // loses it) instead of queueing them in the receiver's memory.
        let (tx, rx) = mpsc::sync_channel::<Frame>(ACK_QUEUE);
        // Reads too: between frames the stream waits in `next_frame_due`, but
        // a sender that stops in the middle of one is gone.
        stream
            .set_write_timeout(Some(idle_timeout))
            .and_then(|()| stream.set_read_timeout(Some(idle_timeout)))
            .map_err(|e| Error::net("setting a stream's timeouts", e))?;
        let mut ack_stream = stream
            .try_clone()
            .map_err(|e| Error::net("cloning a stream", e))?;
        let thread = std::thread::Builder::new()
            .name(format!("acks-{idx}"))
            .spawn(move || {
                for f in rx {
                    let last = f == Frame::Parked;
                    if write_frame(&mut ack_stream, &f).is_err() {
                        return false;
                    }
                    if last {
                        return true;
                    }
                }
                false
            })
            .map_err(|e| Error::io("starting an ack thread", e))?;
        Ok(Self { tx, thread })
    }
}

/// Keeps data stream `stream`, which its sender parked, for the sender's
/// next session under `key`, once `acks` has written what was queued for
/// it; false when it was closed instead.
fn park(shared: &Shared, session: &Session, stream: &TcpStream, key: ParkKey, acks: Acks) -> bool {
    // Parked only while the receiver holds fewer than its share: the
    // rest of its connections stay for senders starting cold. The
    // place is taken here, under the lock, and `wait_parked` gives it
    // back.
    let placed = {
        let mut parked = lock(&shared.parked);
        parked.len() < shared.most_parked()
            && stream.try_clone().map(|c| parked.insert(key, c)).is_ok()
    };
    if !placed {
        tracing::debug!("too many parked connections; closing this one instead");
        let _ = stream.shutdown(Shutdown::Both);
        return false;
    }
    // The session's end must not cut it any more.
    lock(&session.data_streams)
        .retain(|s| s.local_addr().ok().zip(s.peer_addr().ok()) != Some(key));
    // After every acknowledgement already queued; one the writer
    // sends later (for a block the sender did not wait for) is lost
    // with the session, not written into the next.
    let queued = acks.tx.send(Frame::Parked).is_ok();
    drop(acks.tx);
    if queued && acks.thread.join().unwrap_or(false) {
        tracing::debug!("data stream parked for the sender's next session");
        return true;
    }
    lock(&shared.parked).remove(&key);
    let _ = stream.shutdown(Shutdown::Both);
    false
}

/// Waits for data stream `stream`'s next frame: as long as it takes
/// while the session runs (a stream may idle while its siblings carry the
/// blocks), at most `PARK_GRACE` once the session has ended. False when
/// that ran out.
fn next_frame_due(session: &Session, stream: &TcpStream) -> Result<bool> {
    let mut ended = None;
    loop {
        if net::wait_readable(stream, END_POLL)
            .map_err(|e| Error::net("waiting on a data stream", e))?
        {
            return Ok(true);
        }
        if session.aborted.load(Ordering::SeqCst)
            && ended.get_or_insert_with(Instant::now).elapsed() >= PARK_GRACE
        {
            return Ok(false);
        }
    }
}

fn receive_blocks(
    session: &Session,
    stream: &mut TcpStream,
    ack_tx: &mpsc::SyncSender<Frame>,
) -> Result<StreamEnd> {
    let mut reader = FrameReader::default();
    loop {
        if !next_frame_due(session, stream)? {
            return Ok(StreamEnd::Closed);
        }
        let h = match reader.read_capped(stream, MAX_SMALL_FRAME) {
            Ok(Frame::Block(h)) => h,
            Ok(Frame::Finish) => return Ok(StreamEnd::Closed),
            Ok(Frame::Park) => return Ok(StreamEnd::Park),
            Ok(other) => {
                return Err(Violation::new(
                    ViolationKind::Unexpected,
                    format!("unexpected {} on a data stream", describe(&other)),
                )
                .into());
            }
            // The sender closing a stream at the end (or a cut) is not our error.
            Err(Error::Net { .. }) => return Ok(StreamEnd::Closed),
            Err(e) => return Err(e),
        };
        session.check_placed(&h)?;
        let Some(mut buf) = session.buffer_for(&h) else {
            return Ok(StreamEnd::Closed);
        };
        let Some(checksum) = session.read_block(stream, &h, &mut buf)? else {
            session.reject(&h, ack_tx);
            continue;
        };
        let msg = WriterMsg::Block {
            file_id: h.file_id,
            block: h.block,
            buf,
            checksum,
            ack: ack_tx.clone(),
        };
        if session.writer_tx.send(msg).is_err() {
            return Ok(StreamEnd::Closed);
        }
    }
}

impl Session {
    /// Refuses block `h` unless its file is in the plan and it sits where
    /// the file's layout puts it.
    fn check_placed(&self, h: &BlockHeader) -> Result<()> {
        let layout = self
            .sizes
            .get(h.file_id)
            .map(|&size| Layout::new(size, self.block_size));
        let layout = layout.ok_or_else(|| {
            Error::from(Violation::new(
                ViolationKind::Unknown,
                format!("block for file {} that is not in the plan", h.file_id),
            ))
        })?;
        if h.block >= layout.blocks()
            || h.offset != layout.offset(h.block)
            || u64::from(h.len) != layout.len(h.block)
        {
            return Err(Violation::new(
                ViolationKind::Inconsistent,
                format!(
                    "block {} of file {} has offset {} and length {}, which do not match the file's layout",
                    h.block, h.file_id, h.offset, h.len
                ),
            )
            .into());
        }
        Ok(())
    }

    /// A buffer for block `h`, once one is free; None when the session
    /// ends first.
    fn buffer_for(&self, h: &BlockHeader) -> Option<PoolBuf> {
        loop {
            if self.aborted.load(Ordering::SeqCst) {
                return None;
            }
            if let Some(b) = self
                .pool
                .for_len(h.len as usize)
                .get_timeout(Duration::from_millis(200))
            {
                return Some(b);
            }
        }
    }

    /// Reads block `h`'s bytes into `buf`, and the checksum that follows
    /// them. Returns the checksum (0 when the session verifies nothing),
    /// or None when the bytes do not match it.
    fn read_block(
        &self,
        stream: &mut TcpStream,
        h: &BlockHeader,
        buf: &mut PoolBuf,
    ) -> Result<Option<u64>> {
        use std::io::Read;
        let len = h.len as usize;
        let mut hasher = (self.verify != Verification::None).then(BlockHasher::default);
        for piece in buf.as_mut_full()[..len].chunks_mut(HASH_PIECE) {
            stream
                .read_exact(piece)
                .map_err(|e| Error::net("reading a block", e))?;
            self.stats.arriving.fetch_add(1, Ordering::Relaxed);
            if let Some(h) = &mut hasher {
                h.update(piece);
            }
        }
        let mut trailer = [0u8; 8];
        stream
            .read_exact(&mut trailer)
            .map_err(|e| Error::net("reading a block's checksum", e))?;
        buf.set_len(len);
        let checksum = match hasher {
            None => 0,
            Some(hasher) => {
                let c = hasher.finish();
                if c != u64::from_le_bytes(trailer) {
                    return Ok(None);
                }
                c
            }
        };
        Ok(Some(checksum))
    }

    /// Counts block `h` damaged in flight, and asks the sender for it again.
    fn reject(&self, h: &BlockHeader, ack_tx: &mpsc::SyncSender<Frame>) {
        self.stats.rejected.fetch_add(1, Ordering::Relaxed);
        self.observer.damaged();
        tracing::warn!(
            file = h.file_id,
            block = h.block,
            "block arrived damaged; asking for it again"
        );
        let _ = ack_tx.send(Frame::Nack {
            file_id: h.file_id,
            block: h.block,
        });
    }
}
