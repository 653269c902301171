//! A data stream of a session: joining it, receiving its blocks into the
//! session's buffers for the writer, acknowledging them, and parking the
//! connection for the sender's next session once the session ended.

use crate::net::Conn;
use std::net::Shutdown;
use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::session::{Session, short};
use super::writer::WriterMsg;
use super::{ParkKey, Shared, lock};
use crate::Layout;
use crate::compress::packer::Unpacker;
use crate::compress::{Codec, PIECE, Piece, PieceAt};
use crate::digest::{BlockHasher, HASH_PIECE};
use crate::error::{Error, Result};
use crate::io::PoolBuf;
use crate::net;
use crate::session::describe;
use crate::tuning::STREAMS;
use crate::violation::{Violation, ViolationKind};
use crate::wire::{
    BlockHeader, Frame, FrameReader, MAX_SMALL_FRAME, SessionId, Verification, write_frame,
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

/// The data streams one session takes: the most a sender opens.
const MOST_STREAMS: usize = STREAMS.max as usize;

/// Runs data stream `idx` of session `id`; returns the connection, and
/// its key in `Shared::parked`, when the sender parked it, clean, for its
/// next session.
pub(crate) fn run_stream(
    shared: &Arc<Shared>,
    mut stream: Conn,
    id: SessionId,
    idx: u16,
) -> Result<Option<(Conn, ParkKey)>> {
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
fn find_session(shared: &Shared, stream: &mut Conn, id: &SessionId) -> Result<Arc<Session>> {
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
fn join(session: &Session, stream: &mut Conn) -> Result<()> {
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
    fn start(stream: &Conn, idle_timeout: Duration, idx: u16) -> Result<Self> {
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
            .spawn(move || write_acks(&rx, &mut ack_stream))
            .map_err(|e| Error::io("starting an ack thread", e))?;
        Ok(Self { tx, thread })
    }
}

/// Acknowledgements already queued when one is written go in the same
/// write, up to this many bytes: a tree of one-block files is one
/// acknowledgement a file, and one write (and one wake of the sender's
/// reader) each cost more than the frame.
const ACK_WRITE_MAX: usize = 16 << 10;

/// Writes the frames `rx` delivers to `stream`, each with those already
/// queued behind it, never waiting for more; true when the last was
/// `Parked` (nothing follows it), false when the stream or the channel
/// closed first.
fn write_acks(rx: &mpsc::Receiver<Frame>, stream: &mut impl std::io::Write) -> bool {
    let mut buf = Vec::with_capacity(ACK_WRITE_MAX + 64);
    while let Ok(first) = rx.recv() {
        buf.clear();
        let mut parked = first == Frame::Parked;
        crate::wire::encode(&first, &mut buf);
        while !parked && buf.len() < ACK_WRITE_MAX {
            let Ok(f) = rx.try_recv() else { break };
            parked = f == Frame::Parked;
            crate::wire::encode(&f, &mut buf);
        }
        if stream.write_all(&buf).is_err() {
            return false;
        }
        if parked {
            return true;
        }
    }
    false
}

/// Keeps data stream `stream`, which its sender parked, for the sender's
/// next session under `key`, once `acks` has written what was queued for
/// it; false when it was closed instead.
fn park(shared: &Shared, session: &Session, stream: &Conn, key: ParkKey, acks: Acks) -> bool {
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
fn next_frame_due(session: &Session, stream: &Conn) -> Result<bool> {
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
    stream: &mut Conn,
    ack_tx: &mpsc::SyncSender<Frame>,
) -> Result<StreamEnd> {
    let mut reader = FrameReader::default();
    let mut unpacking = Unpacking::default();
    loop {
        if !next_frame_due(session, stream)? {
            return Ok(StreamEnd::Closed);
        }
        let (h, packing) = match reader.read_capped(stream, MAX_SMALL_FRAME) {
            Ok(Frame::Block(h)) => (h, None),
            Ok(Frame::PackedBlock { header, codec }) => (header, Some(codec)),
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
        if let Some(codec) = packing {
            session.check_codec(codec)?;
        }
        let Some(mut buf) = session.buffer_for(&h) else {
            return Ok(StreamEnd::Closed);
        };
        let read = match packing {
            None => session.read_block(stream, &h, &mut buf)?,
            Some(codec) => session.read_packed(stream, &h, codec, &mut buf, &mut unpacking)?,
        };
        let checksum = match read {
            BlockRead::Intact(checksum) => checksum,
            BlockRead::Damaged => {
                session.reject(&h, ack_tx);
                continue;
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
            return Ok(StreamEnd::Closed);
        }
    }
}

/// What reading a block came to.
enum BlockRead {
    /// Its bytes match its checksum (0 when the session verifies nothing).
    Intact(u64),
    /// They do not, or a packed block did not unpack: ask for it again.
    Damaged,
}

/// What a data stream keeps to unpack blocks: one piece's packed bytes
/// at a time, and the codecs' contexts.
#[derive(Default)]
struct Unpacking {
    bytes: Vec<u8>,
    unpacker: Unpacker,
}

/// The next `N` bytes of a block's stream: a piece's prefix, or the
/// checksum after the block.
fn read_array<const N: usize>(stream: &mut Conn, what: &'static str) -> Result<[u8; N]> {
    use std::io::Read;
    let mut bytes = [0u8; N];
    stream
        .read_exact(&mut bytes)
        .map_err(|e| Error::net(what, e))?;
    Ok(bytes)
}

/// Whether the block `hasher` hashed matches `trailer` (anything does
/// where the session verifies nothing).
fn checked(hasher: Option<BlockHasher>, trailer: [u8; 8]) -> BlockRead {
    match hasher.map(|h| h.finish()) {
        None => BlockRead::Intact(0),
        Some(c) if c == u64::from_le_bytes(trailer) => BlockRead::Intact(c),
        Some(_) => BlockRead::Damaged,
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
    /// them, hashing each piece as it arrives.
    fn read_block(
        &self,
        stream: &mut Conn,
        h: &BlockHeader,
        buf: &mut PoolBuf,
    ) -> Result<BlockRead> {
        let len = h.len as usize;
        let mut hasher = (self.verify != Verification::None).then(BlockHasher::default);
        self.read_pieces(stream, &mut buf.as_mut_full()[..len], hasher.as_mut())?;
        let trailer = read_array(stream, "reading a block's checksum")?;
        buf.set_len(len);
        Ok(checked(hasher, trailer))
    }

    /// Reads `into` off `stream` a piece at a time, each counted as
    /// arriving (the writer's sign of life) and fed to `hasher`.
    fn read_pieces(
        &self,
        stream: &mut Conn,
        into: &mut [u8],
        mut hasher: Option<&mut BlockHasher>,
    ) -> Result<()> {
        use std::io::Read;
        for piece in into.chunks_mut(HASH_PIECE) {
            stream
                .read_exact(piece)
                .map_err(|e| Error::net("reading a block", e))?;
            self.stats.arriving.fetch_add(1, Ordering::Relaxed);
            if let Some(h) = &mut hasher {
                h.update(piece);
            }
        }
        Ok(())
    }

    /// Refuses a block packed with `codec` unless the session's `Open`
    /// named it.
    fn check_codec(&self, codec: Codec) -> Result<()> {
        if self.codecs.allows(codec) {
            return Ok(());
        }
        Err(Violation::new(
            ViolationKind::Inconsistent,
            format!("a block packed with {codec}, which the session did not open with"),
        )
        .into())
    }

    /// Reads block `h`'s pieces, each packed with `codec` or as it is,
    /// into `buf`, unpacking each into its place and hashing it, and
    /// checks the checksum that follows them against the plain bytes. A
    /// piece that does not unpack makes the block damaged (counted); the
    /// rest are still read, to stay in step with the stream. A prefix
    /// that cannot be (it would lose that step) is a violation.
    fn read_packed(
        &self,
        stream: &mut Conn,
        h: &BlockHeader,
        codec: Codec,
        buf: &mut PoolBuf,
        scratch: &mut Unpacking,
    ) -> Result<BlockRead> {
        let len = h.len as usize;
        let mut hasher = (self.verify != Verification::None).then(BlockHasher::default);
        let mut damaged = None;
        for (index, piece) in (0u32..).zip(buf.as_mut_full()[..len].chunks_mut(PIECE)) {
            let raw = read_array(stream, "reading a block")?;
            let at = PieceAt {
                file_id: h.file_id,
                block: h.block,
                index,
            };
            match Piece::of_prefix(raw, piece.len(), at) {
                Some(Piece::Stored) => self.read_pieces(stream, piece, None)?,
                Some(Piece::Packed(n)) => {
                    // Under the piece's length: room for one piece, made
                    // once, holds it (resize alone would double past it).
                    if scratch.bytes.capacity() < PIECE {
                        scratch.bytes = Vec::with_capacity(PIECE);
                    }
                    scratch.bytes.resize(n as usize, 0);
                    self.read_pieces(stream, &mut scratch.bytes, None)?;
                    if damaged.is_none() {
                        damaged = scratch.unpacker.unpack(codec, &scratch.bytes, piece).err();
                    }
                }
                None => {
                    return Err(Violation::new(
                        ViolationKind::Inconsistent,
                        format!(
                            "block {} of file {}: piece {index} of {} bytes has a damaged or impossible prefix {:016x}",
                            h.block,
                            h.file_id,
                            piece.len(),
                            u64::from_be_bytes(raw)
                        ),
                    )
                    .into());
                }
            }
            if let Some(hasher) = &mut hasher {
                hasher.update(piece);
            }
        }
        let trailer = read_array(stream, "reading a block's checksum")?;
        if let Some(e) = damaged {
            tracing::warn!(file = h.file_id, block = h.block, "{e}");
            self.observer.unpack_failed(codec);
            return Ok(BlockRead::Damaged);
        }
        buf.set_len(len);
        Ok(checked(hasher, trailer))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts the writes it is given.
    #[derive(Default)]
    struct Writes {
        bytes: Vec<u8>,
        calls: usize,
    }

    impl std::io::Write for Writes {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.calls += 1;
            self.bytes.extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn frames(mut bytes: &[u8]) -> Vec<Frame> {
        let mut reader = FrameReader::default();
        let mut out = Vec::new();
        while !bytes.is_empty() {
            out.push(reader.read(&mut bytes).unwrap());
        }
        out
    }

    // Acknowledgements queued together go out in one write, in order, and
    // nothing queued after `Parked` is written.
    #[test]
    fn queued_acknowledgements_go_in_one_write_and_none_after_parked() {
        let (tx, rx) = mpsc::sync_channel(16);
        let acks: Vec<Frame> = (0..3)
            .map(|block| Frame::Ack { file_id: 7, block })
            .collect();
        for f in acks.iter().cloned().chain([
            Frame::Parked,
            Frame::Ack {
                file_id: 8,
                block: 0,
            },
        ]) {
            tx.send(f).unwrap();
        }
        let mut out = Writes::default();
        assert!(write_acks(&rx, &mut out));
        assert_eq!(out.calls, 1);
        let mut want = acks;
        want.push(Frame::Parked);
        assert_eq!(frames(&out.bytes), want);
        // The channel closing before `Parked` is no clean end.
        drop(tx);
        let (tx, rx) = mpsc::sync_channel(1);
        tx.send(Frame::Ack {
            file_id: 1,
            block: 0,
        })
        .unwrap();
        drop(tx);
        let mut out = Writes::default();
        assert!(!write_acks(&rx, &mut out));
        assert_eq!(
            frames(&out.bytes),
            [Frame::Ack {
                file_id: 1,
                block: 0
            }]
        );
    }
}
