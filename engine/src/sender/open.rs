//! Opening a session on the control connection: `Open`, the manifest,
//! and the plan the control core checks.

use std::io::Write;
use std::time::Instant;

use super::connect::authenticate;
use super::shared::end_error;
use super::source::SourceFile;
use super::{RunState, SendConfig};
use crate::digest::entry_identity;
use crate::error::{Error, Result};
use crate::net::{self, Conn};
use crate::scheduler::PlannedFile;
use crate::session::FileVerdict;
use crate::session::SenderControl;
use crate::session::sender::Action;
use crate::wire::{
    EntryKind, FileEntry, Frame, FrameReader, IDLE_TIMEOUT, KEEPALIVE_INTERVAL, Purpose, SessionId,
    encode_files, pack, write_frame,
};

fn send_manifest(control: &mut Conn, entries: &[FileEntry]) -> Result<()> {
    let mut out = Vec::new();
    encode_files(entries, &mut out);
    pack(&mut out);
    control
        .write_all(&out)
        .map_err(|e| Error::net("sending the manifest", e))
}

/// What opening a session settled: the control connection and the files
/// the receiver accepted, with the bytes it already holds.
pub(super) struct Opened {
    pub(super) control: Conn,
    pub(super) core: SenderControl,
    /// Reads the control connection from here on: it may hold frames
    /// of a packed frame not yet taken.
    pub(super) reader: FrameReader,
    pub(super) planned: Vec<PlannedFile>,
    pub(super) held_bytes: u64,
}

/// Authenticates the control connection, opens the session for `streams`
/// data streams and reads the plan.
pub(super) fn open_session(
    cfg: &SendConfig,
    control: Conn,
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
    st.encryption = control.in_effect();
    write_frame(
        &mut control,
        &Frame::Open {
            session,
            block_size: cfg.block_size as u32,
            streams,
            verify: cfg.verify,
            discard: cfg.synthetic.is_some(),
            // The decision's own mode: a progress shared with an earlier
            // send keeps that send's decision, and its codec.
            codecs: crate::compress::Codecs::of_mode(
                cfg.progress.compression_or(cfg.compress).mode,
            ),
            sync: cfg.sync,
            dry_run: cfg.dry_run,
        },
    )?;
    if let Some(stripe) = &cfg.stripe {
        write_frame(&mut control, &Frame::Stripe(stripe.clone()))?;
    }
    let entries: Vec<FileEntry> = pending
        .iter()
        .map(|(id, f)| FileEntry {
            file_id: *id,
            kind: f.kind,
            size: f.size,
            fingerprint: f.stamp.fingerprint(),
            mode: f.mode,
            mtime: f.stamp.wire_mtime(),
            digest: st.digests.get(id).map(|d| d.to_le_bytes()),
            meta: st.metas.get(id).cloned(),
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
    .with_identities(entries.iter().map(|e| (e.file_id, entry_identity(e))))
    .with_sync(
        cfg.sync,
        entries
            .iter()
            .filter(|e| e.kind == EntryKind::Dir)
            .map(|e| e.file_id),
    );
    let mut reader = FrameReader::unpacking();
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
    for file_id in plan.present {
        st.verdicts.insert(file_id, FileVerdict::Present);
    }
    Ok(Opened {
        control,
        core,
        reader,
        planned: plan.accepted,
        held_bytes: plan.held_bytes,
    })
}

/// How long a dry run's receiver has to close after `Finish`: it has
/// only its summary to record.
const DRY_RUN_CLOSE: std::time::Duration = std::time::Duration::from_secs(10);

/// Ends a dry run's session once its plan is in: each file the receiver
/// would take is recorded as one a run would send, and the receiver hears
/// `Finish`. Its close is waited for, `DRY_RUN_CLOSE` at most, so that its
/// summary is recorded when the send returns; what it sends meanwhile is
/// not read as frames, only drained.
pub(super) fn end_dry_run(opened: Opened, st: &mut RunState) -> Result<()> {
    use std::io::Read;
    for f in &opened.planned {
        st.verdicts.insert(f.file_id, FileVerdict::WouldSend);
    }
    let mut control = opened.control;
    write_frame(&mut control, &Frame::Finish)?;
    let until = Instant::now() + DRY_RUN_CLOSE;
    let mut sink = [0u8; 4096];
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() || control.set_read_timeout(Some(left)).is_err() {
            break;
        }
        match control.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    Ok(())
}
