//! One session from its connection to its end: connect the control
//! connection and the data streams (`connect`) while the session opens
//! (`open`), then run the reader, one sender and one ack reader per stream
//! (`streams`), the control reader and the stream sampler (`growth`) until
//! every planned file has a verdict, end it, and record what it did into
//! the run's state.

use std::collections::HashMap;
use std::io::Write;
use std::net::Shutdown;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, mpsc};
use std::time::{Duration, Instant};

use super::connect::{Joining, finish_connecting, start_connecting, warm_key};
use super::generate;
use super::growth::{
    Grow, Tuned, aim_bps, most_fed, per_stream_bytes, sample_loop, streams_for_link,
};
use super::open::{end_dry_run, open_session};
use super::reader::{self, ReadReport};
use super::shared::{Inner, Shared, hold};
use super::source::SourceFile;
use super::streams::{ack_loop, send_loop, settle_parking};
use super::{RunState, SendConfig};
use crate::error::{Error, Result};
use crate::io::Pools;
use crate::net::{self, Conn, SocketOpts, auth};
use crate::optimizer::Optimizer;
use crate::scheduler::PlannedFile;
use crate::session::FileVerdict;
use crate::session::SenderControl;
use crate::spans::carry;
use crate::tuner;
use crate::wire::{
    EntryKind, Frame, FrameReader, KEEPALIVE_INTERVAL, MAX_SMALL_FRAME, SessionId, Stripe,
    Verification, write_frame,
};
use crate::{Layout, Scheduler};

/// How long a receiver has to close the control connection after
/// `Finish` (it does once it has released the session's destinations).
const FINISH_GRACE: Duration = Duration::from_secs(30);

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
    let control = Conn::from(net::connect(&cfg.to, &control_opts, cfg.connect_timeout)?);
    let small = tuner::small_files(
        pending.len(),
        pending.iter().map(|(_, f)| f.size).sum(),
        cfg.block_size,
    );
    // A dry run opens no data stream: one is announced (the protocol
    // counts at least one), none joins.
    let streams = if cfg.dry_run {
        1
    } else {
        stream_count(cfg, (&control, small), pool, st)
    };
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
        let handles = start_connecting(s, &joining, 0..if cfg.dry_run { 0 } else { streams });
        let opened = open_session(cfg, control, streams, &pending, st, session);
        (opened, finish_connecting(handles))
    });
    let opened = opened?;
    if cfg.dry_run {
        return end_dry_run(opened, st);
    }
    let held_bytes = match &cfg.stripe {
        Some(stripe) => {
            st.held_in_pieces = held_in_pieces(cfg.block_size, stripe, &opened.planned);
            st.held_in_pieces.values().sum()
        }
        None => opened.held_bytes,
    };
    note_plan(cfg, all, st, held_bytes);
    let empty = empty_files(all, &opened.planned);
    // Where the tuner chose, the optimizer may add streams up to its bound.
    let most = if cfg.per_link {
        tuner::most_opened(most_fed(cfg, pool), streams).max(streams)
    } else {
        streams
    };
    let mut control = opened.control;
    let reader = opened.reader;
    let sched = scheduler(cfg, opened.planned, streams, pool.large_bytes());
    let compress = cfg.progress.compression_for(cfg.compress);
    let shared = new_shared(cfg, sched, opened.core, (&pending, base), most, compress);
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
    let ended = running.run((&mut control, reader), grow);
    st.streams_warm += reused.load(Ordering::Relaxed);
    record(st, &shared, cfg, &data_opts, ended)
}

/// The session's scheduler of `planned` over `streams`: a stripe
/// session's reads only its pieces.
fn scheduler(cfg: &SendConfig, planned: Vec<PlannedFile>, streams: u16, buffer: u64) -> Scheduler {
    let per_stream = per_stream_bytes(cfg, buffer, streams);
    if let Some(stripe) = &cfg.stripe {
        Scheduler::for_pieces(
            planned,
            &stripe.ranges(),
            cfg.block_size,
            streams,
            per_stream,
        )
    } else {
        let digest = cfg.verify != Verification::None;
        Scheduler::new(planned, cfg.block_size, streams, per_stream, digest)
    }
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
/// connection's handshake measured and whether the files are `small`, or
/// the configured one.
fn stream_count(
    cfg: &SendConfig,
    (control, small): (&Conn, bool),
    pool: &Pools,
    st: &mut RunState,
) -> u16 {
    if let Some(n) = st.streams {
        return n;
    }
    let n = if cfg.per_link {
        let c = streams_for_link(cfg, (control, small), pool);
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

/// The bytes of a stripe session's pieces that the receiver already held
/// (its per-chunk checkpoints), by file: what it holds outside them is
/// other pairs' work.
fn held_in_pieces(block_size: u64, stripe: &Stripe, planned: &[PlannedFile]) -> HashMap<u32, u64> {
    let pieces = stripe.ranges();
    planned
        .iter()
        .filter_map(|f| Some((f, f.have.as_ref()?, pieces.get(&f.file_id)?)))
        .map(|(f, have, &(first, end))| {
            let held = Layout::new(f.size, block_size).bytes_in_range(have, first..end);
            (f.file_id, held)
        })
        .filter(|&(_, held)| held > 0)
        .collect()
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
        .filter(|(_, v)| matches!(v, FileVerdict::Ok(_) | FileVerdict::Present))
        .map(|(id, _)| all[*id as usize].size)
        .sum();
    cfg.progress.held(verified_bytes + held_bytes);
    st.handle_held(verified_bytes + held_bytes);
}

/// The state a session's threads share, for the `pending` files under
/// `base`, with counters for up to `most` streams.
fn new_shared(
    cfg: &SendConfig,
    sched: Scheduler,
    control: SenderControl,
    (pending, base): (&[(u32, &SourceFile)], &Arc<OwnedFd>),
    most: u16,
    compress: Arc<Mutex<crate::compress::Auto>>,
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
        compress,
        in_flight: std::sync::atomic::AtomicI64::new(0),
        cancel: cfg.cancel.clone(),
    }
}

/// The data streams that connected, by index, their blocks going to the
/// others where one did not; fails when none did.
fn attach_streams(
    cfg: &SendConfig,
    shared: &Shared,
    connected: Vec<Result<Conn>>,
) -> Result<Vec<Option<Conn>>> {
    // The transfer goes on as long as one data stream connected.
    let mut streams: Vec<Option<Conn>> = Vec::with_capacity(connected.len());
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
    open: Mutex<Vec<Option<Conn>>>,
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
    fn run(&self, (control, reader): (&mut Conn, FrameReader), grow: Option<Grow<'_>>) -> Ended {
        let (cfg, shared) = (self.cfg, self.shared);
        let spawned: Vec<(u16, Option<(Conn, Conn)>)> = hold(&self.open)
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
        // Before any thread starts: a failure once they run must stop them
        // (they wait for `stop`), or the scope would wait for them forever.
        let mut ctl_r = match control.try_clone() {
            Ok(c) => c,
            Err(e) => {
                ended.outcome = Err(Error::net("cloning the control connection", e));
                return ended;
            }
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
            s.spawn(carry(move || control_loop(shared, &mut ctl_r, reader)));
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
fn finish(shared: &Shared, control: &mut Conn, ok: bool) {
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
    let g = &mut *g;
    for (id, v) in g.verdicts.drain() {
        if cfg.stripe.is_some()
            && matches!(v, FileVerdict::Ok(_))
            && let Some(sums) = g.sched.checksums(id)
        {
            st.sums.insert(id, sums.to_vec());
        }
        st.verdicts.insert(id, v);
    }
    outcome
}

/// Tells the control core which files are done or given up, sends what
/// it wants sent (reports, keepalives), and waits until every accepted
/// file has a verdict and every block its acknowledgement, or something
/// fails.
fn coordinate(shared: &Shared, control: &mut Conn) -> Result<()> {
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
            let mut out = std::mem::take(&mut g.outbox);
            drop(g);
            crate::wire::pack(&mut out);
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

/// Reads the receiver's frames into the control core until it ends the
/// session or the connection closes.
fn control_loop(shared: &Shared, control: &mut Conn, mut reader: FrameReader) {
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
            shared.check_cancel();
            wake.map_or(KEEPALIVE_INTERVAL, |t| t.saturating_duration_since(now))
        };
        // Frames of a packed frame already read are taken first.
        let waited = if reader.has_pending() {
            Ok(true)
        } else {
            net::wait_readable(control, wait)
        };
        match waited {
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
