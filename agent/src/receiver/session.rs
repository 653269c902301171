//! A session: its control connection (manifest, plan, results) and the
//! data streams that join it.

use std::collections::{HashMap, HashSet};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use super::claims::Life;
use super::dest::{Prepared, Staged, prepare};
use super::stats::{Stats, answered};
use super::verdicts::{self, Verdict, VerdictRx};
use super::writer::{Writer, WriterMsg};
use super::{Shared, lock};
use crate::error::{Error, Result};
use crate::fsroot::validate;
use crate::io::Pools;
use crate::metrics::metrics;
use crate::net;
use crate::spans::carry;
use crate::summary::{ReceiverSummary, SessionOutcome};
use crate::units::{fmt_bytes, gbps};
use crate::wire::{
    EntryKind, FileEntry, Frame, FrameReader, KEEPALIVE_INTERVAL, MAX_BLOCKS_PER_SESSION,
    MAX_ENTRIES, MAX_MANIFEST_BYTES, MAX_SMALL_FRAME, PlanOutcome, SessionId, Verification,
    write_frame,
};
use wirerate_engine::digest::{BlockHasher, HASH_PIECE};
use wirerate_engine::{IdleDeadline, Keepalive, Layout};

/// Acknowledgements queued per data stream before its reader waits.
const ACK_QUEUE: usize = 1024;

/// What data streams need to know about their session.
pub(crate) struct Session {
    verify: Verification,
    layouts: HashMap<u32, Layout>,
    pool: Pools,
    writer_tx: mpsc::Sender<WriterMsg>,
    data_streams: Mutex<Vec<TcpStream>>,
    aborted: AtomicBool,
    stats: Arc<Stats>,
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
            // counts on them. Shutting down only the read side stops the
            // stream threads and lets the ack threads drain and close.
            let how = if self.graceful {
                Shutdown::Read
            } else {
                Shutdown::Both
            };
            for st in lock(&s.data_streams).iter() {
                let _ = st.shutdown(how);
            }
            metrics().sessions_active.dec();
        }
        self.shared.claims.release(&self.life);
    }
}

/// Tells the sender why the session cannot go on, and returns the error.
fn refuse(stream: &mut TcpStream, retryable: bool, message: String) -> Error {
    let _ = write_frame(
        stream,
        &Frame::Error {
            retryable,
            message: message.clone(),
        },
    );
    Error::Remote { message, retryable }
}

/// Reads the manifest, bounded in entries and in path bytes: the
/// receiver's memory is its own, and a sender could otherwise make it hold
/// gigabytes of paths. The outer error ends the connection; the inner one
/// is a refusal to tell the sender.
fn read_manifest(
    reader: &mut FrameReader,
    stream: &mut TcpStream,
) -> Result<std::result::Result<Vec<FileEntry>, String>> {
    let mut entries = Vec::new();
    let mut ids = HashSet::new();
    let mut path_bytes = 0usize;
    loop {
        match reader.read(stream)? {
            Frame::Files { entries: chunk } => {
                for e in chunk {
                    if !ids.insert(e.file_id) {
                        return Ok(Err(format!(
                            "file id {} appears twice in the manifest",
                            e.file_id
                        )));
                    }
                    path_bytes += e.path.len();
                    entries.push(e);
                }
                if entries.len() > MAX_ENTRIES || path_bytes > MAX_MANIFEST_BYTES {
                    metrics().rejected.with_label_values(&["manifest"]).inc();
                    return Ok(Err(format!(
                        "manifest over {MAX_ENTRIES} entries or {} of paths; split the transfer",
                        fmt_bytes(MAX_MANIFEST_BYTES as u64)
                    )));
                }
            }
            Frame::FilesEnd => return Ok(Ok(entries)),
            other => {
                return Err(Error::Violation(format!(
                    "expected the manifest, got {other:?}"
                )));
            }
        }
    }
}

pub(crate) fn run_control(shared: &Arc<Shared>, stream: TcpStream) -> Result<()> {
    let result = control(shared, stream);
    super::release_freed_memory();
    result
}

fn control(shared: &Arc<Shared>, mut stream: TcpStream) -> Result<()> {
    let started = Instant::now();
    let idle_timeout = shared.cfg.idle_timeout;
    // No single read or write of the session may stall longer than the
    // idle deadline: a sender that stops mid-frame, or stops reading, is
    // as gone as one that stops writing.
    stream
        .set_read_timeout(Some(idle_timeout))
        .and_then(|()| stream.set_write_timeout(Some(idle_timeout)))
        .map_err(|e| Error::net("setting the control connection's timeouts", e))?;
    let mut reader = FrameReader::default();
    let (id, block_size, streams, verify) = match reader.read(&mut stream)? {
        Frame::Open {
            session,
            block_size,
            streams,
            verify,
        } => (session, u64::from(block_size), streams, verify),
        other => {
            return Err(Error::Violation(format!(
                "expected a session to open, got {other:?}"
            )));
        }
    };
    // Everything this session and its writer log carries its id.
    let _session = tracing::info_span!("session", id = %short(&id)).entered();
    // The sender picks the block size, but the receiver's memory is its
    // own: a session needs at least two buffers within --buffer.
    let max_block = shared.cfg.buffer / 2;
    if block_size > max_block {
        metrics().rejected.with_label_values(&["block_size"]).inc();
        return Err(refuse(
            &mut stream,
            false,
            format!(
                "block size {} is more than this receiver allows ({}, half its --buffer); \
             send with a smaller --block-size or raise the receiver's --buffer",
                fmt_bytes(block_size),
                fmt_bytes(max_block)
            ),
        ));
    }
    if shared.sessions.len() >= shared.cfg.max_sessions {
        metrics().rejected.with_label_values(&["busy"]).inc();
        return Err(refuse(
            &mut stream,
            true,
            format!(
                "receiver busy: {} sessions already open (--max-sessions); retry later",
                shared.cfg.max_sessions
            ),
        ));
    }
    // The buffers, or their share of --max-memory, before anything is
    // written for the session.
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
                metrics().rejected.with_label_values(&["memory"]).inc();
                return Err(refuse(
                    &mut stream,
                    true,
                    format!(
                        "receiver busy: {} of its {} of buffer memory (--max-memory) is in use; retry later",
                        fmt_bytes(used),
                        fmt_bytes(shared.memory.max())
                    ),
                ));
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
        return Err(refuse(
            &mut stream,
            false,
            format!("session {} is already open; pick a fresh id", hex(&id)),
        ));
    }
    // From here on, dropping this releases the id and any claimed paths.
    let mut reg = Registration {
        shared,
        id,
        life: Arc::clone(&life),
        graceful: false,
    };

    let mut entries = match read_manifest(&mut reader, &mut stream)? {
        Ok(e) => e,
        Err(message) => return Err(refuse(&mut stream, false, message)),
    };
    // One spelling per destination (`f`, `f/` and `f//` are one file), so
    // that claims and duplicates are compared as the filesystem sees them.
    for e in &mut entries {
        if let Ok(d) = validate(&e.path) {
            e.path = d.rel;
        }
    }

    // Claim the destinations so that two sessions never write one file,
    // taking them over from a session whose sender has gone silent.
    let takeover_after = (3 * KEEPALIVE_INTERVAL).min(idle_timeout);
    let paths: Vec<&str> = entries.iter().map(|e| e.path.as_str()).collect();
    // The sender waits quietly for the plan; the receiver's own work on
    // the session (claiming, then preparing) counts as hearing from it, or
    // a long claim wait or plan would look like a vanished sender.
    life.heard(Instant::now());
    let claimed = shared.claims.claim(&paths, &life, takeover_after);
    life.heard(Instant::now());
    if let Err(busy) = claimed {
        metrics()
            .rejected
            .with_label_values(&["destination_busy"])
            .inc();
        return Err(refuse(&mut stream, true, busy.message()));
    }
    drop(paths);

    // The plan.
    let stats = Arc::new(Stats::default());
    let mut files = Staged::new(&shared.root);
    let mut layouts = HashMap::new();
    let mut plan = Vec::with_capacity(entries.len());
    let mut resumed_bytes = 0u64;
    // Blocks of the accepted files: the receiver holds state for each.
    let mut tracked = 0u64;
    let mut seen_paths = HashSet::new();
    // Preparing a large tree takes a while: the sender waiting for the
    // plan is told now and then that the receiver is still at it.
    let mut keepalive = Keepalive::new(Instant::now(), KEEPALIVE_INTERVAL);
    for e in &entries {
        let now = Instant::now();
        if keepalive.poll_due(now) {
            write_frame(&mut stream, &Frame::Keepalive)?;
            keepalive.handle_sent(now);
            life.heard(now);
        }
        let blocks = if e.kind == EntryKind::File {
            Layout::new(e.size, block_size).blocks()
        } else {
            0
        };
        let outcome = if !seen_paths.insert(e.path.as_str()) {
            Prepared::Refuse(format!("{} appears twice in the manifest", e.path))
        } else if tracked + blocks > MAX_BLOCKS_PER_SESSION {
            Prepared::Refuse(format!(
                "the session already tracks {tracked} blocks and {} needs {blocks} more, past the {MAX_BLOCKS_PER_SESSION} one session may track; send it with a larger --block-size or in a transfer of its own",
                e.path
            ))
        } else {
            prepare(&shared.root, e, block_size, shared.cfg.umask)
        };
        let outcome = match outcome {
            Prepared::Accept(file, have) => {
                tracked += blocks;
                resumed_bytes += file.layout.bytes_in(&have);
                stats.total.fetch_add(file.layout.size, Ordering::Relaxed);
                layouts.insert(e.file_id, file.layout);
                files.insert(e.file_id, *file);
                PlanOutcome::Accept {
                    have: have.to_bytes(),
                }
            }
            Prepared::Refuse(message) => {
                metrics().files_failed.inc();
                stats.refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("refused {}: {message}", e.path);
                PlanOutcome::Refuse { message }
            }
        };
        plan.push(Frame::Plan {
            file_id: e.file_id,
            outcome,
        });
    }
    drop(seen_paths);
    drop(entries);

    let pool = match spare {
        Some(p) => p,
        None => Pools::new(block_size as usize, count)?,
    };
    let (writer_tx, writer_rx) = mpsc::channel();
    // The writer's verdicts come back to this thread, which alone writes
    // on the control connection.
    let (verdicts_tx, verdicts) =
        verdicts::channel().map_err(|e| Error::io("creating the writer's eventfd", e))?;
    let accepted = files.len() as u64;
    let writer = Writer::new(
        Arc::clone(shared),
        files,
        writer_rx,
        verdicts_tx,
        verify,
        Arc::clone(&stats),
    )?;
    // The writer counted what the files keep from earlier sessions.
    stats.published_before.store(
        shared.job.published.load(Ordering::Relaxed),
        Ordering::Relaxed,
    );
    shared.job.first_plan.get_or_init(Instant::now);
    *lock(&shared.latest) = Some(Arc::clone(&stats));
    let hugepages = pool.hugepages();
    let buffer_pages = pool.pages();
    let huge_note = pool.huge_note().map(str::to_owned);
    let session = Arc::new(Session {
        verify,
        layouts,
        pool,
        writer_tx: writer_tx.clone(),
        data_streams: Mutex::default(),
        aborted: AtomicBool::new(false),
        stats: Arc::clone(&stats),
    });
    shared.sessions.publish(id, Arc::clone(&session));
    metrics().sessions.inc();
    metrics().sessions_active.inc();
    let writer = std::thread::Builder::new()
        .name("writer".into())
        .spawn(carry(move || writer.run()))
        .map_err(|e| Error::io("starting the writer thread", e))?;

    let mut out = Vec::new();
    for f in &plan {
        crate::wire::encode(f, &mut out);
    }
    crate::wire::encode(&Frame::PlanEnd, &mut out);
    drop(plan);
    let sent = {
        use std::io::Write;
        stream
            .write_all(&out)
            .map_err(|e| Error::net("sending the plan", e))
    };
    drop(out);

    // Results flow until the sender finishes or goes away.
    let outcome = sent.and_then(|()| {
        results(
            shared,
            &mut reader,
            &mut stream,
            &verdicts,
            &writer_tx,
            accepted,
            &life,
        )
    });
    let _ = writer_tx.send(WriterMsg::Stop);
    let report = writer
        .join()
        .unwrap_or_else(|_| super::writer::Report::panicked());
    // A writer that failed and stopped before this thread read its verdict
    // (it saw only "the writer stopped"): the sender still hears the real
    // error, and whether retrying can help.
    if outcome.is_err()
        && let Some(Verdict::Failed { retryable, message }) = verdicts
            .take()
            .into_iter()
            .find(|v| matches!(v, Verdict::Failed { .. }))
    {
        let _ = write_frame(&mut stream, &Frame::Error { retryable, message });
    }
    reg.graceful = outcome.is_ok() && report.error.is_none();
    drop(reg);
    // Buffers still held by a stream thread that has not noticed the end
    // go back to the free list when it lets go, so the next session can
    // take the pool now.
    lock(&shared.spare_pool).put((session.pool.clone(), reservation), Instant::now());

    let secs = started.elapsed().as_secs_f64();
    let bytes = stats.bytes.load(Ordering::Relaxed);
    let summary = ReceiverSummary {
        session: hex(&id),
        outcome: match (&outcome, &report.error) {
            (_, Some(e)) => SessionOutcome::Failed { reason: e.clone() },
            (Ok(()), None) if answered(&stats) >= accepted => SessionOutcome::Complete,
            (Ok(()), None) => SessionOutcome::Interrupted {
                reason: format!(
                    "the sender finished with {} of {accepted} files unanswered",
                    accepted - answered(&stats)
                ),
            },
            (Err(_), None) if life.was_taken_over() => SessionOutcome::Interrupted {
                reason: "its sender went silent, and a new session of it took its files over"
                    .into(),
            },
            (Err(e), None) => SessionOutcome::Interrupted {
                reason: e.to_string(),
            },
        },
        bytes_written: bytes,
        bytes_skipped_resume: resumed_bytes,
        seconds: secs,
        gbps: gbps(bytes, secs),
        io_mode: report.io_mode,
        io_fallback: report.fallback,
        hugepages,
        buffer_pages,
        streams: stats.streams.load(Ordering::Relaxed),
        requested_streams: streams,
        blocks_rejected: stats.rejected.load(Ordering::Relaxed),
        files_ok: stats.files_ok.load(Ordering::Relaxed),
        files_failed: stats.files_failed.load(Ordering::Relaxed)
            + stats.refused.load(Ordering::Relaxed),
        warnings: report.warnings.into_iter().chain(huge_note).collect(),
    };
    tracing::info!(session = %summary.session, outcome = %summary.outcome, bytes, "session ended");
    if shared.cfg.print_summaries {
        summary.print(shared.cfg.json);
    }
    shared.record(summary);
    // Closed last: a sender waiting for this close knows the session is
    // over, its destinations released and its summary recorded.
    if outcome.is_ok() {
        let _ = stream.shutdown(Shutdown::Both);
    }
    outcome
}

/// Passes the sender's reports to the writer until the sender finishes,
/// goes away or falls silent; keeps the sender told that we are here.
#[allow(clippy::too_many_arguments)]
fn results(
    shared: &Shared,
    reader: &mut FrameReader,
    stream: &mut TcpStream,
    verdicts: &VerdictRx,
    writer_tx: &mpsc::Sender<WriterMsg>,
    accepted: u64,
    life: &Life,
) -> Result<()> {
    let mut answered = 0;
    let now = Instant::now();
    let mut keepalive = Keepalive::new(now, KEEPALIVE_INTERVAL);
    let mut idle = IdleDeadline::new(now, shared.cfg.idle_timeout);
    let to_writer = |msg| {
        writer_tx
            .send(msg)
            .map_err(|_| Error::Transfer("the writer stopped".into()))
    };
    loop {
        let now = Instant::now();
        if let Some(silent) = idle.poll_expired(now) {
            return Err(Error::net(
                "waiting for the sender",
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "nothing heard for {:.0} s (--idle-timeout), so it is presumed gone; what it wrote is checkpointed",
                        silent.as_secs_f64()
                    ),
                ),
            ));
        }
        if keepalive.poll_due(now) {
            write_frame(stream, &Frame::Keepalive)?;
            keepalive.handle_sent(now);
        }
        let wake = keepalive.poll_timeout().min(idle.poll_timeout());
        let (readable, woken) =
            net::wait_readable_or(stream, verdicts.fd(), wake.saturating_duration_since(now))
                .map_err(|e| Error::net("waiting for the sender", e))?;
        if woken {
            for v in verdicts.take() {
                match v {
                    Verdict::File {
                        file_id,
                        ok,
                        digest,
                        message,
                    } => {
                        write_frame(
                            stream,
                            &Frame::FileResult {
                                file_id,
                                ok,
                                digest,
                                message,
                            },
                        )?;
                        answered += 1;
                    }
                    Verdict::Failed { retryable, message } => {
                        let _ = write_frame(
                            stream,
                            &Frame::Error {
                                retryable,
                                message: message.clone(),
                            },
                        );
                        return Err(Error::Transfer(message));
                    }
                }
            }
            if answered >= accepted {
                // Every file has its verdict: the session is over now, not
                // a round trip later when the sender's Finish arrives. The
                // caller stops the writer, releases the destinations and
                // closes the connection, which is what the sender waits for.
                return Ok(());
            }
        }
        if !readable {
            continue;
        }
        let frame = reader.read(stream);
        if frame.is_ok() {
            let now = Instant::now();
            idle.handle_heard(now);
            life.heard(now);
        }
        match frame {
            Ok(Frame::FileDone { file_id, digest }) => {
                to_writer(WriterMsg::FileDone { file_id, digest })?;
            }
            Ok(Frame::FileAbort { file_id, message }) => {
                to_writer(WriterMsg::Abort { file_id, message })?;
            }
            Ok(Frame::Keepalive) => {}
            Ok(Frame::Finish) => return Ok(()),
            Ok(other) => {
                return Err(Error::Violation(format!(
                    "unexpected {other:?} on the control connection"
                )));
            }
            Err(e) => return Err(e),
        }
    }
}

pub(crate) fn run_stream(
    shared: &Arc<Shared>,
    mut stream: TcpStream,
    id: SessionId,
    idx: u16,
) -> Result<()> {
    let _stream = tracing::info_span!("stream", session = %short(&id), idx).entered();
    let stopping = || shared.stop.load(Ordering::SeqCst);
    let Some(session) = shared.sessions.wait(&id, shared.cfg.join_wait, stopping) else {
        let message = "unknown session: open it on a control connection first".to_string();
        let _ = write_frame(
            &mut stream,
            &Frame::Error {
                retryable: true,
                message: message.clone(),
            },
        );
        return Err(Error::Violation(message));
    };
    lock(&session.data_streams).push(
        stream
            .try_clone()
            .map_err(|e| Error::net("cloning a stream", e))?,
    );
    if session.aborted.load(Ordering::SeqCst) {
        return Ok(());
    }
    session.stats.streams.fetch_add(1, Ordering::Relaxed);
    // Bounded, and the socket's writes too: a sender that stops reading
    // its acknowledgements stops this stream (and, after the idle timeout,
    // loses it) instead of queueing them in the receiver's memory.
    let (ack_tx, ack_rx) = mpsc::sync_channel::<Frame>(ACK_QUEUE);
    stream
        .set_write_timeout(Some(shared.cfg.idle_timeout))
        .map_err(|e| Error::net("setting a stream's write timeout", e))?;
    let mut ack_stream = stream
        .try_clone()
        .map_err(|e| Error::net("cloning a stream", e))?;
    std::thread::Builder::new()
        .name(format!("acks-{idx}"))
        .spawn(move || {
            for f in ack_rx {
                if write_frame(&mut ack_stream, &f).is_err() {
                    break;
                }
            }
        })
        .map_err(|e| Error::io("starting an ack thread", e))?;
    let result = receive_blocks(&session, &mut stream, &ack_tx);
    if let Err(e @ (Error::Protocol(_) | Error::Violation(_))) = &result {
        // Written directly: the ack thread may be gone, and the peer must
        // hear why before the close.
        let _ = write_frame(
            &mut stream,
            &Frame::Error {
                retryable: false,
                message: e.to_string(),
            },
        );
        // Clones held by the session would keep the socket open.
        let _ = stream.shutdown(Shutdown::Both);
    }
    result
}

fn receive_blocks(
    session: &Session,
    stream: &mut TcpStream,
    ack_tx: &mpsc::SyncSender<Frame>,
) -> Result<()> {
    use std::io::Read;
    let mut reader = FrameReader::default();
    loop {
        let h = match reader.read_capped(stream, MAX_SMALL_FRAME) {
            Ok(Frame::Block(h)) => h,
            Ok(Frame::Finish) => return Ok(()),
            Ok(other) => {
                return Err(Error::Violation(format!(
                    "unexpected {other:?} on a data stream"
                )));
            }
            // The sender closing a stream at the end (or a cut) is not our error.
            Err(Error::Net { .. }) => return Ok(()),
            Err(e) => return Err(e),
        };
        let layout = session.layouts.get(&h.file_id).ok_or_else(|| {
            Error::Violation(format!(
                "block for file {} that is not in the plan",
                h.file_id
            ))
        })?;
        if h.block >= layout.blocks()
            || h.offset != layout.offset(h.block)
            || u64::from(h.len) != layout.len(h.block)
        {
            return Err(Error::Violation(format!(
                "block {} of file {} has offset {} and length {}, which do not match the file's layout",
                h.block, h.file_id, h.offset, h.len
            )));
        }
        let mut buf = loop {
            if session.aborted.load(Ordering::SeqCst) {
                return Ok(());
            }
            if let Some(b) = session
                .pool
                .for_len(h.len as usize)
                .get_timeout(Duration::from_millis(200))
            {
                break b;
            }
        };
        let len = h.len as usize;
        let mut hasher = (session.verify != Verification::None).then(BlockHasher::default);
        for piece in buf.as_mut_full()[..len].chunks_mut(HASH_PIECE) {
            stream
                .read_exact(piece)
                .map_err(|e| Error::net("reading a block", e))?;
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
                    session.stats.rejected.fetch_add(1, Ordering::Relaxed);
                    metrics().checksum_failures.inc();
                    tracing::warn!(
                        file = h.file_id,
                        block = h.block,
                        "block arrived damaged; asking for it again"
                    );
                    let _ = ack_tx.send(Frame::Nack {
                        file_id: h.file_id,
                        block: h.block,
                    });
                    continue;
                }
                c
            }
        };
        let msg = WriterMsg::Block {
            file_id: h.file_id,
            block: h.block,
            buf,
            checksum,
            ack: ack_tx.clone(),
        };
        if session.writer_tx.send(msg).is_err() {
            return Ok(());
        }
    }
}
