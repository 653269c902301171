//! The lead's side of a relay job (`relay`): hand the relay one session,
//! pass its progress to the lane, and take its answers as a local
//! session's.

use std::net::Shutdown;
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::net::{self, Conn, auth};
use crate::retry::Backoff;
use crate::sender::source::SourceList;
use crate::sender::{RunState, SendConfig, cancelled, sleep_unless_cancelled};
use crate::session::FileVerdict;
use crate::violation::{Violation, ViolationKind};
use crate::wire::{
    self, FileEntry, Frame, MAX_ADDR, MAX_FRAME, MAX_PATH, Purpose, RelayEntry, RelayError,
    RelayJob, StripeRole, write_frame,
};
use crate::wire::{RELAY_ALIVE_EVERY as ALIVE_EVERY, RELAY_SILENCE as SILENCE};

/// Entries per `RelayFiles` frame, at most, and bytes of paths.
const FILES_PER_FRAME: usize = 4096;
const PATH_BYTES_PER_FRAME: usize = 1 << 20;

/// How far a job got, for what a failure means.
#[derive(Default)]
struct Reached {
    /// The relay has the job: its session may be writing.
    handed: bool,
    /// The relay said how it ended: its session writes no more.
    answered: bool,
    /// It refused the job before running it.
    refused: bool,
}

/// Runs the write session `cfg` describes (to `cfg.to`, its pieces in
/// `cfg.stripe`) of `list` on the relay at `via`; what it did comes back
/// as a local session's would. A failure is `Error::Relayed` (or
/// `Cancelled`, when `cfg.cancel` stopped it).
pub(crate) fn run_job(via: &str, cfg: &SendConfig, list: &SourceList) -> (RunState, Result<()>) {
    let mut st = RunState::default();
    let mut reached = Reached::default();
    let run = job(via, cfg, list, &mut st, &mut reached);
    let run = run.map_err(|e| match e {
        e @ (Error::Relayed { .. } | Error::Cancelled { .. }) => e,
        e => Error::Relayed {
            relay: via.to_string(),
            retryable: e.is_retryable() || matches!(e, Error::GaveUp { .. }),
            message: e.to_string(),
            answered: !reached.handed || reached.answered,
        },
    });
    (st, run)
}

fn job(
    via: &str,
    cfg: &SendConfig,
    list: &SourceList,
    st: &mut RunState,
    reached: &mut Reached,
) -> Result<()> {
    let stripe = match &cfg.stripe {
        Some(s) if s.role == StripeRole::Write => s.clone(),
        _ => return Err(Error::Internal("a relay runs write sessions only".into())),
    };
    let source = list.base_path.to_str().ok_or_else(|| {
        Error::Config(format!(
            "{}: a relay is told the source directory by name, and this one's is not UTF-8",
            list.base_path.display()
        ))
    })?;
    if let Some(f) = list
        .files
        .iter()
        .find(|f| f.rel.as_os_str().len() > MAX_PATH)
    {
        return Err(Error::Config(format!(
            "{}: a relay job names a file in at most {MAX_PATH} bytes",
            f.path.display()
        )));
    }
    if cfg.to.len() > MAX_ADDR || source.len() > MAX_PATH {
        return Err(Error::Config(format!(
            "a relay job names the receiver and the source in at most {MAX_ADDR} and {MAX_PATH} bytes: {} is too long",
            if cfg.to.len() > MAX_ADDR {
                &cfg.to
            } else {
                source
            }
        )));
    }
    let job = RelayJob {
        to: cfg.to.clone(),
        source: source.to_string(),
        block_size: cfg.block_size as u32,
        streams: cfg.streams,
        verify: cfg.verify,
        max_rate: cfg.max_rate.unwrap_or(0),
        retry_ms: millis(cfg.retry_for),
        refused_ms: cfg.refused_for.map_or(0, millis),
        encrypt: cfg.encrypt,
        compress: cfg.compress,
    };
    let frames = entries(list);
    // A busy relay (its connection slots taken) is asked again, within
    // the pair's patience, as an unreachable one is.
    let mut busy = backoff(cfg);
    loop {
        // What an earlier try's refusal said is no answer of this one's.
        *reached = Reached::default();
        let mut conn = connect(via, cfg)?;
        net::within(&conn, SILENCE, |d| {
            write_frame(d, &Frame::RelayJob(job.clone()))?;
            write_frame(d, &Frame::Stripe(stripe.clone()))?;
            for entries in &frames {
                write_frame(
                    d,
                    &Frame::RelayFiles {
                        entries: entries.clone(),
                    },
                )?;
            }
            write_frame(d, &Frame::FilesEnd)
        })?;
        reached.handed = true;
        match read_answers(via, &mut conn, cfg, list, st, reached) {
            Err(
                e @ Error::Relayed {
                    retryable: true, ..
                },
            ) if reached.refused => {
                // Refused before it ran: nothing of it writes. Closed
                // before the wait, so the relay does not linger on it.
                drop(conn);
                let Some(d) = busy.poll_delay(Instant::now(), false) else {
                    return Err(e);
                };
                if sleep_unless_cancelled(cfg, d) {
                    return Err(Error::Cancelled { last: Box::new(e) });
                }
            }
            other => return other,
        }
    }
}

/// The waits between tries to reach a relay, within the pair's patience.
fn backoff(cfg: &SendConfig) -> Backoff {
    Backoff::new(
        cfg.retry_for,
        Duration::from_millis(250),
        Duration::from_secs(2),
    )
}

fn millis(d: Duration) -> u32 {
    d.as_millis().min(u128::from(u32::MAX)) as u32
}

/// The job's files, in frames.
fn entries(list: &SourceList) -> Vec<Vec<RelayEntry>> {
    let mut frames = vec![Vec::new()];
    let mut bytes = 0;
    for (i, f) in list.files.iter().enumerate() {
        let rel = f.rel.as_os_str().as_bytes().to_vec();
        let size = rel.len() + f.dest.len();
        let last = frames.last_mut().expect("one at least");
        if last.len() >= FILES_PER_FRAME
            || (bytes + size > PATH_BYTES_PER_FRAME && !last.is_empty())
        {
            frames.push(Vec::new());
            bytes = 0;
        }
        bytes += size;
        frames.last_mut().expect("one at least").push(RelayEntry {
            entry: FileEntry {
                file_id: i as u32,
                kind: f.kind,
                size: f.size,
                fingerprint: f.stamp.fingerprint(),
                mode: f.mode,
                mtime: f.stamp.wire_mtime(),
                digest: None,
                meta: None,
                path: f.dest.clone(),
            },
            rel,
        });
    }
    frames
}

/// Dials the relay and authenticates, retrying within `cfg.retry_for`
/// (or `cfg.refused_for` of refusals) as a session would.
fn connect(via: &str, cfg: &SendConfig) -> Result<Conn> {
    let mut backoff = backoff(cfg);
    if let Some(d) = cfg.refused_for {
        backoff = backoff.refused_for(d);
    }
    loop {
        if cancelled(cfg) {
            return Err(Error::Cancelled {
                last: Box::new(Error::Config("stopped before the relay job started".into())),
            });
        }
        let e = match dial(via, cfg) {
            Ok(conn) => return Ok(conn),
            Err(e) if e.is_retryable() => e,
            Err(e) => return Err(e),
        };
        let Some(d) = backoff.poll_delay(Instant::now(), e.is_refused()) else {
            return Err(cfg.gave_up(&backoff, e, false));
        };
        if sleep_unless_cancelled(cfg, d) {
            return Err(Error::Cancelled { last: Box::new(e) });
        }
    }
}

fn dial(via: &str, cfg: &SendConfig) -> Result<Conn> {
    let mut conn = Conn::from(net::connect(via, &cfg.socket, cfg.connect_timeout)?);
    net::handshake(&mut conn, net::HANDSHAKE_TIMEOUT, |d| {
        auth::client(
            d,
            &cfg.token,
            Purpose::Relay,
            net::port_of(via),
            cfg.encrypt,
        )
    })?;
    conn.tcp()
        .set_nodelay(true)
        .map_err(|e| Error::net("setting TCP_NODELAY", e))?;
    Ok(conn)
}

/// Reads the relay's answers until its `RelayDone`, saying it is still
/// here every `ALIVE_EVERY`; a relay silent for `SILENCE` is gone. A
/// cancelled job is half-closed, which the relay takes as its cue to
/// stop, and its answer still awaited, so that the lead knows it has
/// stopped writing.
fn read_answers(
    via: &str,
    conn: &mut Conn,
    cfg: &SendConfig,
    list: &SourceList,
    st: &mut RunState,
    reached: &mut Reached,
) -> Result<()> {
    let (mut heard, mut said) = (Instant::now(), Instant::now());
    let mut moved = 0u64;
    let mut cancelling = None;
    loop {
        if cancelling.is_none() && cancelled(cfg) {
            let _ = conn.shutdown(Shutdown::Write);
            cancelling = Some(Instant::now());
        }
        // Told to stop, it answers once its session has: within a
        // keepalive interval, unless its thread is stuck in the kernel.
        if cancelling.is_some_and(|t: Instant| t.elapsed() >= SILENCE + wire::KEEPALIVE_INTERVAL) {
            return Err(Error::ConnectionLost(
                "the relay did not answer once told to stop".into(),
            ));
        }
        if cancelling.is_none() && said.elapsed() >= ALIVE_EVERY {
            net::within(conn, SILENCE, |d| write_frame(d, &Frame::Keepalive))?;
            said = Instant::now();
        }
        if heard.elapsed() >= SILENCE {
            return Err(Error::ConnectionLost(format!(
                "the relay said nothing for {} s; is it running and reachable? Its log says why",
                SILENCE.as_secs()
            )));
        }
        let ready = net::wait_readable(conn, Duration::from_millis(200))
            .map_err(|e| Error::net("waiting for the relay", e))?;
        if !ready {
            continue;
        }
        // A connection that closes without an answer is unanswered too:
        // a reset may have reached this side only, and the relay goes on
        // until it notices the silence.
        let frame = net::within(conn, SILENCE, |d| wire::read_frame_capped(d, MAX_FRAME))?;
        heard = Instant::now();
        let Some(answer) = take(frame, cfg, list, st, &mut moved)? else {
            continue;
        };
        reached.answered = true;
        reached.refused = matches!(answer, Answer::Refused(_));
        let relayed = |e: RelayError| Error::Relayed {
            relay: via.to_string(),
            message: e.message,
            retryable: e.retryable,
            answered: true,
        };
        return match (answer, cancelling.is_some()) {
            (Answer::Done(_), true) => Err(Error::Cancelled {
                last: Box::new(Error::Config("the relay job was stopped".into())),
            }),
            (Answer::Done(None), false) => Ok(()),
            (Answer::Done(Some(e)) | Answer::Refused(e), _) => Err(relayed(e)),
        };
    }
}

/// How a relay ended a job.
enum Answer {
    /// It ran, and ended so.
    Done(Option<RelayError>),
    /// It refused the job before running it (busy, or no relay at all).
    Refused(RelayError),
}

/// Takes one of the relay's frames into `st`; the answer, once it came.
fn take(
    frame: Frame,
    cfg: &SendConfig,
    list: &SourceList,
    st: &mut RunState,
    moved: &mut u64,
) -> Result<Option<Answer>> {
    match frame {
        Frame::Keepalive => {}
        Frame::RelayAlive { moved: now } => {
            cfg.progress.sent(now.saturating_sub(*moved));
            *moved = (*moved).max(now);
        }
        Frame::RelaySums {
            file_id,
            first,
            sums,
        } => take_sums(cfg, list, st, file_id, first, &sums)?,
        Frame::RelayResult {
            file_id,
            ok,
            digest,
            held,
            message,
        } => {
            known(list, file_id)?;
            let verdict = if ok {
                FileVerdict::Ok(digest)
            } else {
                FileVerdict::Failed(message)
            };
            st.verdicts.insert(file_id, verdict);
            if held > 0 {
                st.held_in_pieces.insert(file_id, held);
            }
        }
        Frame::RelayDone { bytes_sent, error } => {
            st.bytes_sent = bytes_sent;
            cfg.progress.sent(bytes_sent.saturating_sub(*moved));
            return Ok(Some(Answer::Done(error)));
        }
        Frame::Error { retryable, message } => {
            return Ok(Some(Answer::Refused(RelayError { retryable, message })));
        }
        other => {
            return Err(Violation::unexpected(
                "a relay's answer",
                crate::session::describe(&other),
            )
            .into());
        }
    }
    Ok(None)
}

fn outside(file_id: u32) -> Error {
    Violation::new(
        ViolationKind::Unknown,
        format!("the relay sent checksums outside the piece of file {file_id} it wrote"),
    )
    .into()
}

fn known(list: &SourceList, file_id: u32) -> Result<()> {
    if (file_id as usize) < list.files.len() {
        Ok(())
    } else {
        Err(Violation::new(
            ViolationKind::Unknown,
            format!("the relay answered for file {file_id}, which the job does not hold"),
        )
        .into())
    }
}

/// Takes checksums a relay sent for `first..` of a file, bounded by the
/// file's own blocks (a relay cannot make the lead hold more).
fn take_sums(
    cfg: &SendConfig,
    list: &SourceList,
    st: &mut RunState,
    file_id: u32,
    first: u64,
    sums: &[u64],
) -> Result<()> {
    known(list, file_id)?;
    // Only within the piece the job wrote of it.
    let piece = cfg
        .stripe
        .as_ref()
        .and_then(|s| s.ranges().get(&file_id).copied());
    let end = first.checked_add(sums.len() as u64);
    let (Some((from, to)), Some(end)) = (piece, end) else {
        return Err(outside(file_id));
    };
    if first < from || end > to {
        return Err(outside(file_id));
    }
    let v = st.sums.entry(file_id).or_default();
    if (v.len() as u64) < end {
        v.resize(end as usize, 0);
    }
    v[first as usize..end as usize].copy_from_slice(sums);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(sizes: &[u64]) -> (tempfile::TempDir, SourceList) {
        let dir = tempfile::tempdir().unwrap();
        for (i, &size) in sizes.iter().enumerate() {
            std::fs::write(dir.path().join(format!("f{i}")), vec![1u8; size as usize]).unwrap();
        }
        let list = crate::sender::source::scan(dir.path(), "t/").unwrap();
        (dir, list)
    }

    #[test]
    fn a_relay_cannot_make_the_lead_hold_checksums_past_a_file_or_for_another() {
        let (_d, list) = list(&[10 * 4096]);
        // The tree's directory is entry 0, the file entry 1.
        let file = list
            .files
            .iter()
            .position(|f| f.kind == wire::EntryKind::File)
            .unwrap() as u32;
        let mut cfg = SendConfig::new("", vec![1; 32], "", "");
        cfg.block_size = 4096;
        cfg.stripe = Some(wire::Stripe {
            group: 1,
            role: StripeRole::Write,
            pieces: vec![wire::StripePiece {
                file_id: file,
                first: 6,
                end: 10,
            }],
        });
        let mut st = RunState::default();
        take_sums(&cfg, &list, &mut st, file, 8, &[7, 9]).unwrap();
        assert_eq!(st.sums[&file], [0, 0, 0, 0, 0, 0, 0, 0, 7, 9]);
        assert!(take_sums(&cfg, &list, &mut st, file, 9, &[1, 2]).is_err());
        // Within the file, outside the piece the job wrote.
        assert!(take_sums(&cfg, &list, &mut st, file, 2, &[1, 2]).is_err());
        assert!(take_sums(&cfg, &list, &mut st, file, u64::MAX, &[1]).is_err());
        assert!(take_sums(&cfg, &list, &mut st, 99, 0, &[1]).is_err());
    }

    #[test]
    fn a_job_is_carried_in_frames_of_bounded_size() {
        let (_d, list) = list(&vec![1; 5000]);
        let frames = entries(&list);
        assert_eq!(frames.len(), 2);
        assert!(frames.iter().all(|f| f.len() <= FILES_PER_FRAME));
        let ids: Vec<u32> = frames.iter().flatten().map(|e| e.entry.file_id).collect();
        assert_eq!(ids, (0..list.files.len() as u32).collect::<Vec<_>>());
    }
}
