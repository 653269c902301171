//! One session: connect, send the manifest, get the plan, then run the
//! reader, one sender and one ack reader per stream, and the control
//! reader, until every planned file has a verdict.

use std::collections::HashMap;
use std::io::Write;
use std::net::{Shutdown, TcpStream};
use std::ops::Range;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, mpsc};
use std::thread::{Scope, ScopedJoinHandle};
use std::time::{Duration, Instant};

use super::generate;
use super::reader::{self, ReadReport};
use super::shared::{Inner, Shared, end_error};
use super::source::SourceFile;
use super::warm::{Warm, WarmKey};
use super::{RunState, SendConfig};
use crate::Scheduler;
use crate::digest::{BlockHasher, HASH_PIECE, entry_identity};
use crate::error::{Error, Result};
use crate::io::Pools;
use crate::io::caps::{capabilities, sysctl_number};
use crate::io::sys::set_max_pacing_rate;
use crate::net::{self, SocketOpts, auth};
use crate::optimizer::{Decision, Optimizer, StreamChange};
use crate::scheduler::PlannedFile;
use crate::session::FileVerdict;
use crate::session::SenderControl;
use crate::session::describe;
use crate::session::sender::Action;
use crate::spans::carry;
use crate::tuner::{self, AIM_BPS, Link, StreamChoice};
use crate::violation::{Violation, ViolationKind};
use crate::wire::{
    BlockHeader, EntryKind, FileEntry, Frame, FrameReader, IDLE_TIMEOUT, KEEPALIVE_INTERVAL,
    MAX_SMALL_FRAME, Purpose, SessionId, Verification, encode, write_frame,
    write_frame_with_payload,
};

/// A data stream the receiver turns away as busy (too many handshakes
/// from this address at once) is tried again this many times.
const STREAM_CONNECT_ATTEMPTS: u32 = 4;

/// How long a stream the optimizer adds may take to connect (its TCP
/// handshake): the session waits for it as it ends.
const ADDED_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// How long a receiver has to close the control connection after
/// `Finish` (it does once it has released the session's destinations).
const FINISH_GRACE: Duration = Duration::from_secs(30);
/// How often the data streams' TCP_INFO reaches the observer while a
/// session runs.
const TCP_SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// How long the receiver has to answer a data stream's `Park`: a round
/// trip, normally. A stream it does not answer on is closed.
const PARK_WAIT: Duration = Duration::from_secs(5);

/// How long a parked connection's handshake may take before the stream
/// connects afresh instead: a receiver that vanished without a word would
/// otherwise hold the stream for the whole `net::HANDSHAKE_TIMEOUT`.
const REUSE_HANDSHAKE: Duration = Duration::from_secs(3);

/// Manifest frames stay well under the frame cap.
const MANIFEST_CHUNK_BYTES: usize = 1 << 20;

fn send_manifest(control: &mut TcpStream, entries: &[FileEntry]) -> Result<()> {
    let mut out = Vec::new();
    let mut chunk = Vec::new();
    let mut bytes = 0;
    for e in entries {
        bytes += 32 + e.path.len();
        chunk.push(e.clone());
        if bytes >= MANIFEST_CHUNK_BYTES {
            encode(
                &Frame::Files {
                    entries: std::mem::take(&mut chunk),
                },
                &mut out,
            );
            bytes = 0;
        }
    }
    if !chunk.is_empty() {
        encode(&Frame::Files { entries: chunk }, &mut out);
    }
    encode(&Frame::FilesEnd, &mut out);
    control
        .write_all(&out)
        .map_err(|e| Error::net("sending the manifest", e))
}

/// Connects to the receiver within `timeout` and authenticates for
/// `purpose`, the handshake bounded in time as a whole; returns the stream
/// and the round trip.
fn connect(
    cfg: &SendConfig,
    opts: &SocketOpts,
    purpose: Purpose,
    timeout: Duration,
) -> Result<(TcpStream, Duration)> {
    authenticate(
        cfg,
        net::connect(&cfg.to, opts, timeout)?,
        purpose,
        net::HANDSHAKE_TIMEOUT,
    )
}

/// Authenticates a connected `stream` for `purpose`, the handshake
/// bounded in time as a whole; returns it and the round trip.
fn authenticate(
    cfg: &SendConfig,
    stream: TcpStream,
    purpose: Purpose,
    within: Duration,
) -> Result<(TcpStream, Duration)> {
    let port = net::port_of(&cfg.to);
    let rtt = net::within(&stream, within, |d| {
        auth::client(d, &cfg.token, purpose, port)
    })?;
    Ok((stream, rtt))
}

/// What the tuner makes of the control connection's handshake round trip
/// and this host's TCP buffer limits, for a run with `cfg.per_link`.
fn streams_for_link(cfg: &SendConfig, control: &TcpStream, pool: &Pools) -> StreamChoice {
    let rtt = net::tcp_stats(control).map_or(Duration::ZERO, |t| {
        tuner::round_trip(t.min_rtt_ms, t.rtt_ms)
    });
    let caps = capabilities();
    let buffer = match cfg.socket.buffer {
        // The kernel grants twice what is asked for (socket(7)), up to
        // twice net.core.wmem_max.
        Some(b) => {
            let core = sysctl_number("net.core.wmem_max").map_or(u64::MAX, |m| m.max(0) as u64);
            (b as u64).min(core).saturating_mul(2)
        }
        None => caps.tcp_wmem_max.min(caps.tcp_rmem_max),
    };
    tuner::choose_streams(
        &Link {
            rtt,
            buffer,
            explicit: cfg.socket.buffer.is_some(),
            aim_bps: aim_bps(cfg),
            most: most_fed(cfg, pool),
        },
        cfg.streams,
    )
}

/// The rate the tuner and the optimizer aim at: the cap, else `AIM_BPS`.
fn aim_bps(cfg: &SendConfig) -> f64 {
    cfg.max_rate.map_or(AIM_BPS, |r| r as f64 * 8.0)
}

/// The streams the sender's buffer feeds: two blocks each, and the two
/// the pool keeps for the reader.
fn most_fed(cfg: &SendConfig, pool: &Pools) -> u16 {
    let blocks = pool.large_bytes() / cfg.block_size.max(1);
    (blocks.saturating_sub(2) / 2).min(u64::from(u16::MAX)) as u16
}

/// Each stream's share of the sender's `buffer` bytes when there are
/// `streams`.
fn per_stream_bytes(cfg: &SendConfig, buffer: u64, streams: u16) -> u64 {
    (buffer / u64::from(streams.max(1))).max(2 * cfg.block_size)
}

/// A mutex's guard, also after a thread panicked holding it (the data
/// under it is sockets, which stay valid).
fn hold<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What opening a session settled: the control connection and the files
/// the receiver accepted, with the bytes it already holds.
struct Opened {
    control: TcpStream,
    core: SenderControl,
    planned: Vec<PlannedFile>,
    held_bytes: u64,
}

/// Authenticates the control connection, opens the session for `streams`
/// data streams and reads the plan.
fn open_session(
    cfg: &SendConfig,
    control: TcpStream,
    streams: u16,
    pending: &[(u32, &SourceFile)],
    st: &mut RunState,
    session: SessionId,
) -> Result<Opened> {
    let (mut control, rtt) = authenticate(cfg, control, Purpose::Control, net::HANDSHAKE_TIMEOUT)?;
    st.connected = true;
    // A receiver that stops reading, or stops mid-frame, cannot hold this
    // side longer than a silent one would be waited for (between frames,
    // silence is watched by the idle deadline; see `control_loop`).
    control
        .set_write_timeout(Some(IDLE_TIMEOUT))
        .and_then(|()| control.set_read_timeout(Some(IDLE_TIMEOUT)))
        .map_err(|e| Error::net("setting the control connection's timeouts", e))?;
    // A count the tuner chose has its own reason, with what held it down.
    if st.rtt.is_none() && st.streams_chosen.is_none() {
        if let Some(w) = net::buffer_warning(rtt, streams, cfg.max_rate) {
            tracing::warn!("{w}");
        }
    }
    st.rtt = Some(rtt);
    st.congestion = net::congestion_of(&control);
    write_frame(
        &mut control,
        &Frame::Open {
            session,
            block_size: cfg.block_size as u32,
            streams,
            verify: cfg.verify,
            discard: cfg.synthetic.is_some(),
        },
    )?;
    let entries: Vec<FileEntry> = pending
        .iter()
        .map(|(id, f)| FileEntry {
            file_id: *id,
            kind: f.kind,
            size: f.size,
            fingerprint: f.stamp.fingerprint(),
            mode: f.mode,
            path: f.dest.clone(),
        })
        .collect();
    send_manifest(&mut control, &entries)?;

    // The plan: the core checks it answers each offered file once, with
    // resume bitmaps of the right length.
    let mut core = SenderControl::new(
        pending.iter().map(|(id, f)| (*id, f.size)),
        cfg.block_size,
        cfg.verify,
        KEEPALIVE_INTERVAL,
        IDLE_TIMEOUT,
    )
    .with_identities(entries.iter().map(|e| (e.file_id, entry_identity(e))));
    let mut reader = FrameReader::default();
    let plan = 'plan: loop {
        let frame = reader.read(&mut control)?;
        core.handle_frame(frame, Instant::now());
        while let Some(action) = core.poll_action() {
            match action {
                Action::Planned(plan) => break 'plan plan,
                // The receiver's last words: why we hang up.
                Action::Send(frame) => {
                    let _ = write_frame(&mut control, &frame);
                }
                Action::Close(end) => return Err(end_error(end)),
                other @ Action::Verdict { .. } => {
                    return Err(Error::Internal(format!(
                        "the session core asked for {other:?} before the plan"
                    )));
                }
            }
        }
    };
    for (file_id, message) in plan.refused {
        st.verdicts.insert(file_id, FileVerdict::Failed(message));
    }
    Ok(Opened {
        control,
        core,
        planned: plan.accepted,
        held_bytes: plan.held_bytes,
    })
}

/// What connecting a session's data streams takes.
struct Joining<'a> {
    cfg: &'a SendConfig,
    opts: &'a SocketOpts,
    session: SessionId,
    /// For each TCP handshake.
    timeout: Duration,
    /// Set once the session is over: a busy receiver is not tried again.
    stop: &'a AtomicBool,
    /// Counts the streams that joined over parked connections.
    reused: &'a AtomicU64,
}

/// Connects and authenticates data stream `i`, over a connection an
/// earlier session parked where there is one. A receiver that turns a new
/// one away as busy (more handshakes from this address at once than it
/// takes) is tried again shortly, as the others finish theirs, unless the
/// session is over.
fn connect_stream(j: &Joining<'_>, i: u16) -> Result<TcpStream> {
    let Joining { cfg, opts, .. } = *j;
    let purpose = Purpose::Join {
        session: j.session,
        stream: i,
    };
    if let Some(st) = reuse(cfg, opts, purpose) {
        j.reused.fetch_add(1, Ordering::Relaxed);
        return Ok(st);
    }
    let mut attempt = 1;
    loop {
        match connect(cfg, opts, purpose, j.timeout) {
            Ok((st, _)) => return Ok(st),
            Err(Error::Remote {
                retryable: true, ..
            }) if attempt < STREAM_CONNECT_ATTEMPTS && !j.stop.load(Ordering::SeqCst) => {
                std::thread::sleep(Duration::from_millis(100) * attempt);
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Which parked connections of `warm` a data stream with `opts` may reuse.
fn warm_key(cfg: &SendConfig, warm: &Warm, opts: &SocketOpts) -> WarmKey {
    warm.key(&cfg.to, opts.buffer, opts.congestion.clone())
}

/// A connection an earlier session to this receiver parked, set up for
/// `opts` and authenticated afresh for `purpose`; `None` when none is kept
/// or the one taken fails, and the stream connects as a new one.
fn reuse(cfg: &SendConfig, opts: &SocketOpts, purpose: Purpose) -> Option<TcpStream> {
    let warm = cfg.warm.as_ref()?;
    let st = warm.take(&warm_key(cfg, warm, opts), Instant::now())?;
    // This session's pacing, or none: the last one's may differ.
    let rearmed = net::apply(&st, opts).and_then(|()| {
        set_max_pacing_rate(&st, opts.pacing.unwrap_or(u64::MAX))
            .map_err(|e| Error::net("setting SO_MAX_PACING_RATE", e))
    });
    match rearmed.and_then(|()| authenticate(cfg, st, purpose, REUSE_HANDSHAKE)) {
        Ok((st, _)) => Some(st),
        Err(e) => {
            tracing::debug!(error = %e, "a parked connection could not be reused; connecting afresh");
            None
        }
    }
}

/// Starts connecting data streams `ids` of a session, all at once, each on
/// a thread of `scope`, while the caller goes on; `finish_connecting`
/// waits for them.
fn start_connecting<'scope>(
    scope: &'scope Scope<'scope, '_>,
    j: &'scope Joining<'scope>,
    ids: Range<u16>,
) -> Vec<ScopedJoinHandle<'scope, Result<TcpStream>>> {
    ids.map(|i| scope.spawn(carry(move || connect_stream(j, i))))
        .collect()
}

/// Each stream `start_connecting` started, connected or why not, in order.
fn finish_connecting(
    handles: Vec<ScopedJoinHandle<'_, Result<TcpStream>>>,
) -> Vec<Result<TcpStream>> {
    handles
        .into_iter()
        .map(|h| {
            h.join()
                .unwrap_or_else(|_| Err(Error::Internal("a connect thread panicked".into())))
        })
        .collect()
}

/// Runs one session over the files that have no verdict yet.
pub(crate) fn run(
    cfg: &SendConfig,
    all: &[SourceFile],
    base: &Arc<OwnedFd>,
    st: &mut RunState,
    pool: &Pools,
) -> Result<()> {
    let pending: Vec<(u32, &SourceFile)> = all
        .iter()
        .enumerate()
        .map(|(i, f)| (i as u32, f))
        .filter(|(i, _)| !st.verdicts.contains_key(i))
        .collect();
    let session: SessionId = auth::random();
    let control_opts = SocketOpts {
        pacing: None,
        ..cfg.socket.clone()
    };
    let control = net::connect(&cfg.to, &control_opts, cfg.connect_timeout)?;
    let streams = stream_count(cfg, &control, pool, st);
    let data_opts = SocketOpts {
        pacing: cfg.max_rate.map(|r| (r / u64::from(streams)).max(1)),
        ..cfg.socket.clone()
    };
    // Never set: the session's first streams are all waited for.
    let connecting = AtomicBool::new(false);
    let reused = AtomicU64::new(0);
    // The data streams connect while the control connection authenticates
    // and opens the session (the receiver holds their joins until it is
    // open): each costs a TCP handshake and a round trip of
    // authentication, which end about when the plan arrives instead of
    // coming on top of it. They start once the control connection's TCP
    // handshake has measured the round trip that decides how many.
    let joining = Joining {
        cfg,
        opts: &data_opts,
        session,
        timeout: cfg.connect_timeout,
        stop: &connecting,
        reused: &reused,
    };
    let (opened, connected) = std::thread::scope(|s| {
        let handles = start_connecting(s, &joining, 0..streams);
        let opened = open_session(cfg, control, streams, &pending, st, session);
        (opened, finish_connecting(handles))
    });
    let opened = opened?;
    note_plan(cfg, all, st, opened.held_bytes);
    let empty = empty_files(all, &opened.planned);
    // Where the tuner chose, the optimizer may add streams up to its bound.
    let most = if cfg.per_link {
        tuner::most_opened(most_fed(cfg, pool), streams).max(streams)
    } else {
        streams
    };
    let mut control = opened.control;
    let sched = Scheduler::new(
        opened.planned,
        cfg.block_size,
        streams,
        per_stream_bytes(cfg, pool.large_bytes(), streams),
        cfg.verify != Verification::None,
    );
    let shared = new_shared(cfg, sched, opened.core, (&pending, base), most);
    let streams = attach_streams(cfg, &shared, connected)?;

    // The control connection is read and written from here on; the time
    // spent connecting the data streams was no one's silence.
    let started = Instant::now();
    shared.lock().control.handle_started(started);
    // Once it held in this run, it is not asked again: a retried session
    // would otherwise grow the streams it found no gain in.
    let grow = (cfg.per_link && st.streams_held.is_none()).then(|| {
        let alive = shared.lock().sched.alive_streams() as u16;
        Grow {
            cfg,
            opts: &data_opts,
            session,
            reused: &reused,
            buffer: pool.large_bytes(),
            optimizer: Optimizer::new(
                started,
                alive,
                // The counters end at `most`, and dead streams hold theirs.
                alive.saturating_add(most.saturating_sub(streams.len() as u16)),
                aim_bps(cfg),
                st.rtt.unwrap_or_default(),
            ),
        }
    });
    let running = Running {
        cfg,
        pool,
        shared: &shared,
        empty: &empty,
        open: Mutex::new(streams),
    };
    let ended = running.run(&mut control, grow);
    st.streams_warm += reused.load(Ordering::Relaxed);
    record(st, &shared, cfg, &data_opts, ended)
}

/// The planned files with no block to read: empty regular files (a
/// directory is not read either, nor checked).
fn empty_files(all: &[SourceFile], planned: &[PlannedFile]) -> Vec<u32> {
    planned
        .iter()
        .filter(|p| p.size == 0)
        .map(|p| p.file_id)
        .filter(|id| all[*id as usize].kind == EntryKind::File)
        .collect()
}

/// How many data streams the session opens: the run's count once one
/// session chose it; else the tuner's, for the link the control
/// connection's handshake measured, or the configured one.
fn stream_count(cfg: &SendConfig, control: &TcpStream, pool: &Pools, st: &mut RunState) -> u16 {
    if let Some(n) = st.streams {
        return n;
    }
    let n = if cfg.per_link {
        let c = streams_for_link(cfg, control, pool);
        tracing::info!(streams = c.streams, "data streams: {}", c.reason);
        cfg.observer.streams_chosen(&c);
        st.streams_chosen = Some(c.reason);
        c.streams
    } else {
        cfg.streams
    };
    st.streams = Some(n);
    st.per_stream_bytes = vec![0; usize::from(n)];
    st.first_streams = usize::from(n);
    n
}

/// Takes in a session's plan: `held_bytes` were at the receiver before
/// it sent anything.
fn note_plan(cfg: &SendConfig, all: &[SourceFile], st: &mut RunState, held_bytes: u64) {
    // What the receiver held before this run sent anything: the first
    // plan of the run says, whichever attempt got it.
    if !st.planned {
        st.planned = true;
        st.bytes_skipped_resume = held_bytes;
    }
    let verified_bytes: u64 = st
        .verdicts
        .iter()
        .filter(|(_, v)| matches!(v, FileVerdict::Ok(_)))
        .map(|(id, _)| all[*id as usize].size)
        .sum();
    cfg.progress.held(verified_bytes + held_bytes);
}

/// The state a session's threads share, for the `pending` files under
/// `base`, with counters for up to `most` streams.
fn new_shared(
    cfg: &SendConfig,
    sched: Scheduler,
    control: SenderControl,
    (pending, base): (&[(u32, &SourceFile)], &Arc<OwnedFd>),
    most: u16,
) -> Shared {
    Shared {
        inner: Mutex::new(Inner {
            sched,
            bufs: HashMap::new(),
            verdicts: HashMap::new(),
            control,
            outbox: Vec::new(),
            error: None,
            parked: Vec::new(),
            acks_running: 0,
            cuts: Vec::new(),
        }),
        cv: Condvar::new(),
        files: pending.iter().map(|(id, f)| (*id, (*f).clone())).collect(),
        base: Arc::clone(base),
        empties_checked: AtomicBool::new(false),
        stop: AtomicBool::new(false),
        park: AtomicBool::new(false),
        read_bytes: AtomicU64::new(0),
        sent_bytes: AtomicU64::new(0),
        acked_bytes: AtomicU64::new(0),
        per_stream: (0..most).map(|_| AtomicU64::new(0)).collect(),
        observer: Arc::clone(&cfg.observer),
        progress: Arc::clone(&cfg.progress),
        verify: cfg.verify,
        in_flight: std::sync::atomic::AtomicI64::new(0),
    }
}

/// The data streams that connected, by index, their blocks going to the
/// others where one did not; fails when none did.
fn attach_streams(
    cfg: &SendConfig,
    shared: &Shared,
    connected: Vec<Result<TcpStream>>,
) -> Result<Vec<Option<TcpStream>>> {
    // The transfer goes on as long as one data stream connected.
    let mut streams: Vec<Option<TcpStream>> = Vec::with_capacity(connected.len());
    for (i, c) in connected.into_iter().enumerate() {
        match c {
            Ok(s) => streams.push(Some(s)),
            Err(e) => {
                tracing::warn!(stream = i, error = %e, "a data stream could not connect");
                shared.lock().sched.handle_stream_failed(i as u16);
                streams.push(None);
            }
        }
    }
    if streams.iter().all(Option::is_none) {
        return Err(Error::net(
            format!("opening data streams to {}", cfg.to),
            std::io::Error::other("no data stream could connect"),
        ));
    }
    Ok(streams)
}

/// A session from its plan to its end: the threads that read, send, read
/// acknowledgements and the control connection, and sample the streams.
struct Running<'a> {
    cfg: &'a SendConfig,
    pool: &'a Pools,
    shared: &'a Shared,
    /// The empty files, which are checked rather than read.
    empty: &'a [u32],
    /// Every data stream's socket, for sampling and for the close at the
    /// end; the optimizer's streams join them.
    open: Mutex<Vec<Option<TcpStream>>>,
}

/// What a session's threads leave when it ends.
struct Ended {
    outcome: Result<()>,
    report: ReadReport,
    /// Each data stream's last TCP_INFO, before it closed.
    tcp: Vec<Option<net::TcpStats>>,
    tuned: Tuned,
}

impl Running<'_> {
    /// Runs the session's threads until every file has a verdict or
    /// something fails, then ends it: parks or closes the data streams
    /// and sends `Finish`.
    fn run(&self, control: &mut TcpStream, grow: Option<Grow<'_>>) -> Ended {
        let (cfg, shared) = (self.cfg, self.shared);
        let spawned: Vec<(u16, Option<(TcpStream, TcpStream)>)> = hold(&self.open)
            .iter()
            .enumerate()
            .filter_map(|(i, st)| Some((i as u16, st.as_ref()?)))
            .map(|(i, st)| (i, st.try_clone().ok().zip(st.try_clone().ok())))
            .collect();
        let mut ended = Ended {
            outcome: Ok(()),
            report: ReadReport::default(),
            tcp: Vec::new(),
            tuned: Tuned::default(),
        };
        ended.outcome = std::thread::scope(|s| -> Result<()> {
            let reader_handle = s.spawn(carry(|| self.read()));
            for (i, clones) in spawned {
                let Some((w, r)) = clones else {
                    shared.stream_failed(i, "cannot clone the socket");
                    continue;
                };
                s.spawn(carry(move || send_loop(shared, i, w)));
                shared.lock().acks_running += 1;
                s.spawn(carry(move || ack_loop(shared, i, r)));
            }
            let mut ctl_r = control
                .try_clone()
                .map_err(|e| Error::net("cloning the control connection", e))?;
            s.spawn(carry(move || control_loop(shared, &mut ctl_r)));
            // Dropped when the session stops, which ends the sampling at once.
            let (sampling, stop_sampling) = mpsc::channel::<()>();
            let open = &self.open;
            let tuning = s.spawn(move || sample_loop(s, shared, open, grow, &stop_sampling));

            let result = coordinate(shared, control);
            // A session that ended well leaves its data streams to the next.
            let park = result.is_ok() && cfg.warm.is_some();
            shared.park.store(park, Ordering::SeqCst);
            drop(sampling);
            shared.stop.store(true, Ordering::SeqCst);
            shared.cv.notify_all();
            ended.tcp = self.close_streams(park);
            finish(shared, control, result.is_ok());
            if park {
                settle_parking(shared, open);
            }
            if let Ok(Some(r)) = reader_handle.join() {
                ended.report = r;
            }
            // After `Finish`: an addition still connecting gives up at its
            // next attempt.
            ended.tuned = tuning.join().unwrap_or_default();
            result
        });
        ended
    }

    /// The reader thread: checks the empty files, then reads (or
    /// generates) the blocks; its own error, with its disposition, fails
    /// the session.
    fn read(&self) -> Option<ReadReport> {
        let (cfg, shared) = (self.cfg, self.shared);
        // Empty files are never read: they are checked here, first,
        // and nothing is reported done until they are (meanwhile the
        // coordinator keeps the receiver told that this side is here).
        reader::check_empty(shared, self.empty);
        shared.empties_checked.store(true, Ordering::SeqCst);
        shared.cv.notify_all();
        let need_digest = cfg.verify != Verification::None;
        let r = if cfg.synthetic.is_some() {
            generate::run(shared, self.pool, need_digest)
        } else {
            reader::run(shared, self.pool, cfg.io_mode, cfg.queue_depth, need_digest)
        };
        r.map_err(|e| shared.fail(e)).ok()
    }

    /// Takes each data stream's TCP_INFO (what the kernel learned of each
    /// path) and closes the streams unless they are to be parked.
    fn close_streams(&self, park: bool) -> Vec<Option<net::TcpStats>> {
        // A stream the optimizer adds after this finds the session
        // stopped, under this lock, and closes itself.
        let open = hold(&self.open);
        let tcp = open
            .iter()
            .map(|s| s.as_ref().and_then(net::tcp_stats))
            .collect();
        if !park {
            for st in open.iter().flatten() {
                let _ = st.shutdown(Shutdown::Both);
            }
        }
        tcp
    }
}

/// Ends the control connection: after a session that ended well, with
/// `Finish`, waiting for the receiver to close it.
fn finish(shared: &Shared, control: &mut TcpStream, ok: bool) {
    if !ok {
        let _ = control.shutdown(Shutdown::Both);
        return;
    }
    let _ = write_frame(control, &Frame::Finish);
    shared
        .lock()
        .control
        .handle_finished(Instant::now(), FINISH_GRACE);
    // The receiver closes the control connection only after it has
    // stopped the session and released its destinations; waiting
    // for that close means a `send` that returns leaves nothing
    // behind (an immediate second send of the same file would
    // otherwise find it still claimed).
    let _ = control.set_read_timeout(Some(FINISH_GRACE));
    let _ = control.shutdown(Shutdown::Write);
}

/// Records what an ended session did into the run's state (its streams'
/// figures, the changes the optimizer made, resends, cuts, the I/O path
/// and the verdicts), parks its parked streams for the next session, and
/// returns how it ended.
fn record(
    st: &mut RunState,
    shared: &Shared,
    cfg: &SendConfig,
    data_opts: &SocketOpts,
    ended: Ended,
) -> Result<()> {
    let Ended {
        outcome,
        report,
        tcp,
        mut tuned,
    } = ended;
    for (i, t) in tcp.iter().enumerate() {
        if let Some(t) = t {
            shared.observer.tcp_sampled(i as u16, t);
        }
    }
    st.tcp = tcp;
    let mut g = shared.lock();
    if let Some(warm) = &cfg.warm {
        let key = warm_key(cfg, warm, data_opts);
        for (_, parked, since) in std::mem::take(&mut g.parked) {
            warm.put(key.clone(), parked, since);
        }
    }
    let opened = g.sched.streams();
    if let Some(last) = tuned.changes.last() {
        // Later sessions of this run start where this one got to: the
        // streams that opened (an added one that could not connect holds
        // an index, and a `null` in `tcp`, but is not counted).
        st.streams = Some(last.to);
    }
    st.stream_changes.append(&mut tuned.changes);
    if tuned.held.is_some() {
        st.streams_held = tuned.held;
    }
    if st.per_stream_bytes.len() < opened {
        st.per_stream_bytes.resize(opened, 0);
    }
    st.blocks_retried += g.sched.resends();
    for cut in g.cuts.drain(..) {
        if st.stream_cuts.len() < super::MAX_CUTS_SHOWN {
            st.stream_cuts.push(cut);
        } else {
            st.stream_cuts_more += 1;
        }
    }
    shared.observer.resent(g.sched.resends());
    // What this session still counts as in flight is not any more.
    shared
        .observer
        .in_flight(-shared.in_flight.swap(0, Ordering::Relaxed));
    st.bytes_sent += shared.sent_bytes.load(Ordering::Relaxed);
    for (i, b) in shared.per_stream.iter().take(opened).enumerate() {
        st.per_stream_bytes[i] += b.load(Ordering::Relaxed);
    }
    if report.mode.is_some() {
        st.io_mode = report.mode;
    }
    if report.fallback.is_some() {
        st.io_fallback = report.fallback;
    }
    for (id, v) in g.verdicts.drain() {
        st.verdicts.insert(id, v);
    }
    outcome
}

/// Tells the control core which files are done or given up, sends what
/// it wants sent (reports, keepalives), and waits until every accepted
/// file has a verdict and every block its acknowledgement, or something
/// fails.
fn coordinate(shared: &Shared, control: &mut TcpStream) -> Result<()> {
    let mut g = shared.lock();
    loop {
        let now = Instant::now();
        while shared.empties_checked.load(Ordering::SeqCst)
            && let Some((file_id, digest)) = g.sched.poll_file_done()
        {
            g.control.handle_file_done(file_id, digest, now);
        }
        while let Some((file_id, message)) = g.sched.poll_file_failed() {
            g.control.handle_file_failed(file_id, message, now);
        }
        g.control.handle_timeout(now);
        shared.apply_control(&mut g);
        if !g.outbox.is_empty() {
            let out = std::mem::take(&mut g.outbox);
            drop(g);
            control
                .write_all(&out)
                .map_err(|e| Error::net("writing to the receiver", e))?;
            g = shared.lock();
            continue;
        }
        if let Some(e) = g.error.take() {
            return Err(e);
        }
        if let Some(damaged) = g.sched.poll_fatal() {
            return Err(damaged.clone().into());
        }
        // The receiver answers a file after writing its last block, but the
        // acknowledgements travel on the data streams: wait for them too,
        // so progress ends at the full size.
        if g.control.all_answered() && (g.sched.all_acked() || g.sched.alive_streams() == 0) {
            return Ok(());
        }
        // Once every block is acknowledged the data streams have done
        // their part (the receiver may close them as the session ends);
        // only the results are still to come. A file reported done may
        // still have blocks in flight, so reports alone do not say that.
        if g.sched.alive_streams() == 0 && !g.sched.all_acked() {
            return Err(Error::net(
                "sending blocks",
                std::io::Error::other("every data stream failed"),
            ));
        }
        g = shared
            .cv
            .wait_timeout(g, Duration::from_millis(250))
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}

fn send_loop(shared: &Shared, i: u16, mut stream: TcpStream) {
    loop {
        let (order, buf) = {
            let mut g = shared.lock();
            loop {
                if shared.stopped() || !g.sched.stream_alive(i) {
                    // Written by this thread, the stream's one writer, so
                    // that it follows the last block whole.
                    let park = shared.park.load(Ordering::SeqCst) && g.sched.stream_alive(i);
                    drop(g);
                    if park {
                        let _ = write_frame(&mut stream, &Frame::Park);
                    }
                    return;
                }
                if let Some(o) = g.sched.poll_send(i) {
                    let b = Arc::clone(g.bufs.get(&o.gid).expect("a ready block has its buffer"));
                    break (o, b);
                }
                g = shared.cv.wait(g).unwrap_or_else(|p| p.into_inner());
            }
        };
        let frame = Frame::Block(BlockHeader {
            file_id: order.file_id,
            block: order.block,
            offset: order.offset,
            len: order.len as u32,
        });
        match send_block(shared, &mut stream, &frame, order.gid, buf.as_slice()) {
            Ok(()) => {
                shared.sent_bytes.fetch_add(order.len, Ordering::Relaxed);
                if let Some(c) = shared.per_stream.get(usize::from(i)) {
                    c.fetch_add(order.len, Ordering::Relaxed);
                }
                shared.observer.sent(i, order.len);
                shared.progress.sent(order.len);
                shared.in_flight(order.len as i64);
            }
            Err(e) => {
                let _ = stream.shutdown(Shutdown::Both);
                shared.stream_failed(i, &e.to_string());
                return;
            }
        }
    }
}

/// Sends a block's header, its payload in pieces, each hashed just before
/// it goes (so the kernel copies it from the CPU cache rather than from
/// memory), and the checksum after them.
fn send_block(
    shared: &Shared,
    stream: &mut TcpStream,
    frame: &Frame,
    gid: usize,
    payload: &[u8],
) -> Result<()> {
    let mut hasher = (shared.verify != Verification::None).then(BlockHasher::default);
    let mut pieces = payload.chunks(HASH_PIECE);
    let first = pieces.next().unwrap_or_default();
    if let Some(h) = &mut hasher {
        h.update(first);
    }
    write_frame_with_payload(stream, frame, first)?;
    for piece in pieces {
        if let Some(h) = &mut hasher {
            h.update(piece);
        }
        stream
            .write_all(piece)
            .map_err(|e| Error::net("sending a block", e))?;
    }
    let sum = hasher.map_or(0, |h| h.finish());
    // Recorded before the receiver can see the checksum, hence before it
    // can acknowledge the block. The last block of a file to go out lets
    // the coordinator report the file at once.
    if shared.lock().sched.handle_sent_checksum(gid, sum) {
        shared.cv.notify_all();
    }
    stream
        .write_all(&sum.to_le_bytes())
        .map_err(|e| Error::net("sending a block", e))
}

/// What the optimizer did in a session.
#[derive(Debug, Default)]
struct Tuned {
    changes: Vec<StreamChange>,
    /// Why it stopped adding, if it did before the session ended.
    held: Option<String>,
}

/// What a session whose streams the tuner chose needs to add more.
struct Grow<'a> {
    cfg: &'a SendConfig,
    opts: &'a SocketOpts,
    session: SessionId,
    /// Counts the streams that joined over parked connections.
    reused: &'a AtomicU64,
    /// The sender's buffer, which the streams share.
    buffer: u64,
    optimizer: Optimizer,
}

impl Grow<'_> {
    /// Connects `more` streams, all at once (fewer where the session's
    /// stream counters run out), and starts each that connected as the
    /// scheduler's next stream; returns the streams alive then. The
    /// buffer's share and a cap's pacing are spread over those alive.
    fn add<'scope>(
        &self,
        s: &'scope Scope<'scope, '_>,
        shared: &'scope Shared,
        open: &Mutex<Vec<Option<TcpStream>>>,
        more: u16,
    ) -> u16 {
        let from = hold(open).len() as u16;
        let to = from
            .saturating_add(more)
            .min(shared.per_stream.len() as u16);
        let joining = Joining {
            cfg: self.cfg,
            opts: self.opts,
            session: self.session,
            timeout: ADDED_CONNECT_TIMEOUT,
            stop: &shared.stop,
            reused: self.reused,
        };
        let connected =
            std::thread::scope(|c| finish_connecting(start_connecting(c, &joining, from..to)));
        let mut open = hold(open);
        let mut g = shared.lock();
        if shared.stopped() {
            for st in connected.iter().flatten() {
                let _ = st.shutdown(Shutdown::Both);
            }
            return g.sched.alive_streams() as u16;
        }
        let joining = connected.iter().filter(|c| c.is_ok()).count();
        let alive = (g.sched.alive_streams() + joining).max(1) as u16;
        let per = per_stream_bytes(self.cfg, self.buffer, alive);
        for c in connected {
            // Failed ones too: the scheduler's indices stay those the
            // streams joined with, and the counters' and sockets'.
            let i = g.sched.add_stream(per);
            let clones = c.and_then(|st| match (st.try_clone(), st.try_clone()) {
                (Ok(w), Ok(r)) => Ok((st, w, r)),
                (Err(e), _) | (_, Err(e)) => Err(Error::net("cloning a data stream", e)),
            });
            match clones {
                Ok((st, w, r)) => {
                    s.spawn(carry(move || send_loop(shared, i, w)));
                    g.acks_running += 1;
                    s.spawn(carry(move || ack_loop(shared, i, r)));
                    open.push(Some(st));
                }
                Err(e) => {
                    tracing::warn!(stream = i, error = %e, "an added data stream could not connect");
                    g.sched.handle_stream_failed(i);
                    open.push(None);
                }
            }
        }
        let alive = g.sched.alive_streams() as u16;
        drop(g);
        // A capped transfer's rate is shared by those alive now.
        if let Some(rate) = self.cfg.max_rate {
            let each = (rate / u64::from(alive.max(1))).max(1);
            for st in open.iter().flatten() {
                let _ = set_max_pacing_rate(st, each);
            }
        }
        shared.cv.notify_all();
        alive
    }
}

/// Tells the observer each data stream's TCP_INFO every
/// `TCP_SAMPLE_EVERY` until `stop` closes (and the session samples them
/// once more as it ends), so that a transfer's metrics show its paths
/// while it runs; and, where the tuner chose the streams, lets the
/// optimizer add more while that raises the rate.
fn sample_loop<'scope>(
    s: &'scope Scope<'scope, '_>,
    shared: &'scope Shared,
    open: &Mutex<Vec<Option<TcpStream>>>,
    mut grow: Option<Grow<'_>>,
    stop: &mpsc::Receiver<()>,
) -> Tuned {
    let mut tuned = Tuned::default();
    let mut next_sample = Instant::now() + TCP_SAMPLE_EVERY;
    loop {
        // Woken for the next sample, or sooner when the optimizer's
        // settling or window ends (a second's granularity would add up
        // to a second to each of its steps).
        let wake = grow
            .as_ref()
            .and_then(|g| g.optimizer.poll_timeout())
            .map_or(next_sample, |t| t.min(next_sample));
        let wait = wake.saturating_duration_since(Instant::now());
        if let Err(mpsc::RecvTimeoutError::Disconnected) | Ok(()) = stop.recv_timeout(wait) {
            return tuned;
        }
        if Instant::now() >= next_sample {
            next_sample += TCP_SAMPLE_EVERY;
            for (i, st) in hold(open).iter().enumerate() {
                if let Some(t) = st.as_ref().and_then(net::tcp_stats) {
                    shared.observer.tcp_sampled(i as u16, &t);
                }
            }
        }
        let Some(g) = grow.as_mut() else { continue };
        // Once every block is out, the rate falls for want of data, not
        // of streams.
        if shared.lock().sched.nothing_left_to_send() {
            grow = None;
            continue;
        }
        g.optimizer
            .handle_progress(Instant::now(), shared.acked_bytes.load(Ordering::Relaxed));
        while let Some(d) = g.optimizer.poll() {
            match d {
                Decision::Add(mut change) => {
                    let alive = g.add(s, shared, open, change.to - change.from);
                    if alive > change.from {
                        // What opened, which the reason's "trying" may
                        // exceed when some could not connect.
                        change.to = alive;
                        tracing::info!(
                            from = change.from,
                            to = change.to,
                            "added data streams: {}",
                            change.reason
                        );
                        shared.observer.streams_changed(&change);
                        tuned.changes.push(change);
                    }
                    if shared.stopped() {
                        return tuned;
                    }
                    g.optimizer.handle_added(Instant::now(), alive);
                }
                Decision::Hold(why) => {
                    tracing::info!("data streams held: {why}");
                    tuned.held = Some(why);
                }
            }
        }
        if g.optimizer.is_done() {
            grow = None;
        }
    }
}

/// Reads data stream `i`'s acknowledgements until the session stops and
/// the stream closes or is parked; tells `settle_parking` it has ended.
fn ack_loop(shared: &Shared, i: u16, stream: TcpStream) {
    read_acks(shared, i, stream);
    shared.lock().acks_running -= 1;
    shared.cv.notify_all();
}

fn read_acks(shared: &Shared, i: u16, mut stream: TcpStream) {
    let mut reader = FrameReader::default();
    loop {
        let frame = reader.read_capped(&mut stream, MAX_SMALL_FRAME);
        let mut g = shared.lock();
        match frame {
            Ok(Frame::Ack { file_id, block }) => match g.sched.handle_ack(i, file_id, block) {
                Ok(None) => {}
                Ok(Some(gid)) => {
                    if let Some(b) = g.bufs.remove(&gid) {
                        shared
                            .acked_bytes
                            .fetch_add(b.len() as u64, Ordering::Relaxed);
                        shared.progress.acknowledged(b.len() as u64);
                        shared.in_flight(-(b.len() as i64));
                    }
                }
                Err(v) => {
                    drop(g);
                    shared.fail(Error::Violation(v));
                    return;
                }
            },
            Ok(Frame::Nack { file_id, block }) => {
                tracing::warn!(
                    file_id,
                    block,
                    "receiver found a block damaged; resending it"
                );
                if let Err(v) = g.sched.handle_nack(i, file_id, block) {
                    drop(g);
                    shared.fail(Error::Violation(v));
                    return;
                }
            }
            // Every acknowledgement came before it: the stream is clean
            // for the next session.
            Ok(Frame::Parked) if shared.park.load(Ordering::SeqCst) => {
                g.parked.push((i, stream, Instant::now()));
                return;
            }
            Ok(Frame::Error { message, retryable }) => {
                drop(g);
                shared.fail(Error::Remote { message, retryable });
                return;
            }
            Ok(other) => {
                drop(g);
                shared.fail(
                    Violation::new(
                        ViolationKind::Unexpected,
                        format!("unexpected {} on data stream {i}", describe(&other)),
                    )
                    .into(),
                );
                return;
            }
            Err(e) => {
                drop(g);
                let _ = stream.shutdown(Shutdown::Both);
                shared.stream_failed(i, &e.to_string());
                return;
            }
        }
        drop(g);
        shared.cv.notify_all();
    }
}

/// Waits up to `PARK_WAIT` for every data stream's acknowledgement reader
/// to end (on the receiver's `Parked`, or on anything else), then closes
/// the streams that were not parked.
fn settle_parking(shared: &Shared, open: &Mutex<Vec<Option<TcpStream>>>) {
    let deadline = Instant::now() + PARK_WAIT;
    let mut g = shared.lock();
    while g.acks_running > 0 {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        g = shared
            .cv
            .wait_timeout(g, left)
            .map_or_else(|p| p.into_inner().0, |(g, _)| g);
    }
    let parked: Vec<u16> = g.parked.iter().map(|(i, ..)| *i).collect();
    drop(g);
    for (i, st) in hold(open).iter().enumerate() {
        if let Some(st) = st
            && !parked.contains(&(i as u16))
        {
            let _ = st.shutdown(Shutdown::Both);
        }
    }
}

/// Reads the receiver's frames into the control core until it ends the
/// session or the connection closes.
fn control_loop(shared: &Shared, control: &mut TcpStream) {
    let mut reader = FrameReader::default();
    // Runs past the session's end too: after `Finish` the receiver closes
    // the connection once it has released the session's destinations, and
    // the send returns only then (an immediate second send of the same
    // file would otherwise find it still claimed).
    loop {
        let wait = {
            let now = Instant::now();
            let mut g = shared.lock();
            g.control.handle_timeout(now);
            let changed = shared.apply_control(&mut g);
            let ended = g.control.end().is_some();
            let wake = g.control.poll_timeout();
            drop(g);
            if changed {
                shared.cv.notify_all();
            }
            if ended {
                return;
            }
            wake.map_or(KEEPALIVE_INTERVAL, |t| t.saturating_duration_since(now))
        };
        match net::wait_readable(control, wait) {
            Ok(false) => continue,
            Ok(true) => {}
            Err(e) => {
                shared.fail(Error::net("waiting for the receiver", e));
                return;
            }
        }
        let frame = reader.read_capped(control, MAX_SMALL_FRAME);
        let mut g = shared.lock();
        match frame {
            Ok(frame) => g.control.handle_frame(frame, Instant::now()),
            Err(e) => {
                // The receiver closes as soon as every file has its
                // result; before that, the session is lost.
                g.control.handle_lost(e.to_string());
                if g.control.end().is_some() && g.error.is_none() && !shared.stopped() {
                    g.error = Some(match e {
                        Error::Net { cause, .. } => {
                            Error::net("the control connection broke", cause)
                        }
                        other => other,
                    });
                }
                shared.apply_control(&mut g);
                drop(g);
                shared.cv.notify_all();
                return;
            }
        }
        // A keepalive changes nothing: the data path's threads sleep on.
        if shared.apply_control(&mut g) {
            drop(g);
            shared.cv.notify_all();
        }
    }
}
