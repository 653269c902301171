//! A session: its control connection (manifest, plan, results) and the
//! data streams that join it.

use std::collections::{HashMap, HashSet};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use super::dest::{Prepared, prepare};
use super::writer::{Writer, WriterMsg};
use super::{Shared, lock};
use crate::engine::Layout;
use crate::engine::digest::{BlockHasher, HASH_PIECE};
use crate::error::{Error, Result};
use crate::io::Pools;
use crate::metrics::metrics;
use crate::summary::ReceiverSummary;
use crate::units::gbps;
use crate::wire::{Frame, FrameReader, PlanOutcome, SessionId, Verify, write_frame};

/// Most manifest entries one session may carry.
const MAX_ENTRIES: usize = 1 << 20;

/// Counters shared by a session's threads.
#[derive(Default)]
pub(crate) struct Stats {
    pub(crate) bytes: AtomicU64,
    pub(crate) rejected: AtomicU64,
    pub(crate) streams: AtomicU64,
    pub(crate) files_ok: AtomicU64,
    pub(crate) files_failed: AtomicU64,
}

/// Files of the session that have their result.
pub(crate) fn answered(stats: &Stats) -> u64 {
    stats.files_ok.load(Ordering::SeqCst) + stats.files_failed.load(Ordering::SeqCst)
}

/// What data streams need to know about their session.
pub(crate) struct Session {
    verify: Verify,
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

/// Releases the session's registrations however the control thread ends.
struct Registration<'a> {
    shared: &'a Shared,
    id: SessionId,
    paths: Vec<String>,
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
        let mut busy = lock(&self.shared.busy);
        for p in &self.paths {
            busy.remove(p);
        }
    }
}

pub(crate) fn run_control(shared: &Arc<Shared>, mut stream: TcpStream) -> Result<()> {
    let started = Instant::now();
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
    let refuse = |stream: &mut TcpStream, retryable: bool, message: String| {
        let _ = write_frame(
            stream,
            &Frame::Error {
                retryable,
                message: message.clone(),
            },
        );
        Error::Remote { message, retryable }
    };
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
                crate::units::fmt_bytes(block_size),
                crate::units::fmt_bytes(max_block)
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
        paths: Vec::new(),
        graceful: false,
    };

    // The manifest.
    let mut entries = Vec::new();
    let mut ids = HashSet::new();
    loop {
        match reader.read(&mut stream)? {
            Frame::Files { entries: chunk } => {
                for e in chunk {
                    if !ids.insert(e.file_id) {
                        return Err(refuse(
                            &mut stream,
                            false,
                            format!("file id {} appears twice in the manifest", e.file_id),
                        ));
                    }
                    entries.push(e);
                }
                if entries.len() > MAX_ENTRIES {
                    return Err(refuse(
                        &mut stream,
                        false,
                        format!("manifest over {MAX_ENTRIES} entries; split the transfer"),
                    ));
                }
            }
            Frame::FilesEnd => break,
            other => {
                return Err(Error::Violation(format!(
                    "expected the manifest, got {other:?}"
                )));
            }
        }
    }

    // Claim the destinations so that two sessions never write one file.
    {
        let mut busy = lock(&shared.busy);
        for e in &entries {
            if busy.contains(&e.path) {
                drop(busy);
                return Err(refuse(
                    &mut stream,
                    true,
                    format!(
                        "{} is being written by another session right now; retry when it ends",
                        e.path
                    ),
                ));
            }
        }
        for e in &entries {
            busy.insert(e.path.clone());
            reg.paths.push(e.path.clone());
        }
    }

    // The plan.
    let mut files = HashMap::new();
    let mut layouts = HashMap::new();
    let mut plan = Vec::with_capacity(entries.len());
    let mut resumed_bytes = 0u64;
    let mut seen_paths = HashSet::new();
    for e in &entries {
        let outcome = if !seen_paths.insert(e.path.trim_end_matches('/')) {
            PlanOutcome::Refuse {
                message: format!("{} appears twice in the manifest", e.path),
            }
        } else {
            match prepare(&shared.root, e, block_size) {
                Ok(Prepared::Accept(file, have)) => {
                    resumed_bytes += (0..have.len())
                        .filter(|&b| have.get(b))
                        .map(|b| file.layout.len(b))
                        .sum::<u64>();
                    layouts.insert(e.file_id, file.layout);
                    files.insert(e.file_id, *file);
                    PlanOutcome::Accept {
                        have: have.to_bytes(),
                    }
                }
                Ok(Prepared::Refuse(message)) => {
                    metrics().files_failed.inc();
                    PlanOutcome::Refuse { message }
                }
                Err(err) => return Err(refuse(&mut stream, false, err.to_string())),
            }
        };
        plan.push(Frame::Plan {
            file_id: e.file_id,
            outcome,
        });
    }

    let count = (shared.cfg.buffer / block_size).clamp(2, 4096) as usize;
    let spare = lock(&shared.spare_pool).take_if(|p| p.is_shaped(block_size as usize, count));
    let pool = match spare {
        Some(p) => p,
        None => Pools::new(block_size as usize, count)?,
    };
    let stats = Arc::new(Stats::default());
    let (writer_tx, writer_rx) = mpsc::channel();
    let control = Arc::new(Mutex::new(
        stream
            .try_clone()
            .map_err(|e| Error::net("cloning the control connection", e))?,
    ));
    let accepted = files.len() as u64;
    let writer = Writer::new(
        Arc::clone(shared),
        files,
        writer_rx,
        Arc::clone(&control),
        verify,
        Arc::clone(&stats),
    )?;
    let hugepages = pool.hugepages();
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
        .spawn(move || writer.run())
        .map_err(|e| Error::io("starting the writer thread", e))?;

    let mut out = Vec::new();
    for f in &plan {
        crate::wire::encode(f, &mut out);
    }
    crate::wire::encode(&Frame::PlanEnd, &mut out);
    let sent = {
        use std::io::Write;
        lock(&control)
            .write_all(&out)
            .map_err(|e| Error::net("sending the plan", e))
    };

    // Results flow until the sender finishes or goes away.
    let outcome = sent.and_then(|()| {
        loop {
            match reader.read(&mut stream) {
                Ok(Frame::FileDone { file_id, digest }) => {
                    if writer_tx
                        .send(WriterMsg::FileDone { file_id, digest })
                        .is_err()
                    {
                        break Err(Error::Transfer("the writer stopped".into()));
                    }
                }
                Ok(Frame::Finish) => break Ok(()),
                // The writer ended the session after the last result.
                Err(_) if answered(&stats) >= accepted => break Ok(()),
                Ok(other) => {
                    break Err(Error::Violation(format!(
                        "unexpected {other:?} on the control connection"
                    )));
                }
                Err(e) => break Err(e),
            }
        }
    });
    let _ = writer_tx.send(WriterMsg::Stop);
    let report = writer
        .join()
        .unwrap_or_else(|_| super::writer::Report::panicked());
    reg.graceful = outcome.is_ok() && report.error.is_none();
    drop(reg);
    // Buffers still held by a stream thread that has not noticed the end
    // go back to the free list when it lets go, so the next session can
    // take the pool now.
    lock(&shared.spare_pool).put(session.pool.clone(), Instant::now());

    let secs = started.elapsed().as_secs_f64();
    let bytes = stats.bytes.load(Ordering::Relaxed);
    let summary = ReceiverSummary {
        session: hex(&id),
        outcome: match (&outcome, &report.error) {
            (_, Some(e)) => format!("failed: {e}"),
            (Ok(()), None) => "complete".into(),
            (Err(e), None) => format!("interrupted: {e}"),
        },
        bytes_written: bytes,
        bytes_skipped_resume: resumed_bytes,
        seconds: secs,
        gbps: gbps(bytes, secs),
        io_mode: report.io_mode,
        io_fallback: report.fallback,
        hugepages,
        streams: stats.streams.load(Ordering::Relaxed),
        requested_streams: streams,
        blocks_rejected: stats.rejected.load(Ordering::Relaxed),
        files_ok: stats.files_ok.load(Ordering::Relaxed),
        files_failed: stats.files_failed.load(Ordering::Relaxed),
    };
    tracing::info!(session = %summary.session, outcome = %summary.outcome, bytes, "session ended");
    if shared.cfg.print_summaries {
        summary.print(shared.cfg.json);
    }
    lock(&shared.summaries).push(summary);
    // Closed last: a sender waiting for this close knows the session is
    // over, its destinations released and its summary recorded.
    if outcome.is_ok() {
        let _ = lock(&control).shutdown(Shutdown::Both);
    }
    outcome
}

pub(crate) fn run_stream(
    shared: &Arc<Shared>,
    mut stream: TcpStream,
    id: SessionId,
    idx: u16,
) -> Result<()> {
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
    let (ack_tx, ack_rx) = mpsc::channel::<Frame>();
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
    ack_tx: &mpsc::Sender<Frame>,
) -> Result<()> {
    use std::io::Read;
    let mut reader = FrameReader::default();
    loop {
        let h = match reader.read(stream) {
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
        let mut hasher = (session.verify != Verify::None).then(BlockHasher::default);
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
