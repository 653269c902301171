//! A data stream's two threads, one sending blocks and one reading
//! acknowledgements, and the parking of the streams as a session that
//! ended well winds down.

use crate::net::Conn;
use std::io::{IoSlice, Write};
use std::net::Shutdown;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::shared::{Shared, hold};
use crate::compress::packer::Packer;
use crate::compress::{Codec, Decision, PIECE, PREFIX_LEN, Piece, PieceAt};
use crate::digest::{BlockHasher, HASH_PIECE};
use crate::error::{Error, Result};
use crate::session::describe;
use crate::violation::{Violation, ViolationKind};
use crate::wire::{
    BlockHeader, Frame, FrameReader, MAX_SMALL_FRAME, Verification, write_frame,
    write_frame_with_payload,
};

/// How long the receiver has to answer a data stream's `Park`: a round
/// trip, normally. A stream it does not answer on is closed.
const PARK_WAIT: Duration = Duration::from_secs(5);

pub(super) fn send_loop(shared: &Shared, i: u16, mut stream: Conn) {
    let mut packer = Packer::default();
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
        let header = BlockHeader {
            file_id: order.file_id,
            block: order.block,
            offset: order.offset,
            len: order.len as u32,
        };
        let decision = hold(&shared.compress).decide(order.damaged_before);
        let sent = match decision {
            Decision::Plain => send_block(shared, &mut stream, header, order.gid, buf.as_slice()),
            Decision::Pack(codec) => send_packed(
                shared,
                &mut stream,
                header,
                order.gid,
                buf.as_slice(),
                (codec, &mut packer),
            ),
        };
        match sent {
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

/// Times the writes of one block: what `compress::auto` weighs packing
/// against.
#[derive(Default)]
struct Writes(Duration);

impl Writes {
    fn write(&mut self, stream: &mut Conn, bytes: &[u8]) -> Result<()> {
        let start = Instant::now();
        let r = stream
            .write_all(bytes)
            .map_err(|e| Error::net("sending a block", e));
        self.0 += start.elapsed();
        r
    }

    /// `a` then `b`, in as few calls as the socket takes.
    fn write_two(&mut self, stream: &mut Conn, a: &[u8], b: &[u8]) -> Result<()> {
        let start = Instant::now();
        let r = crate::wire::write_all_vectored(stream, &mut [IoSlice::new(a), IoSlice::new(b)]);
        self.0 += start.elapsed();
        r
    }

    fn write_frame(&mut self, stream: &mut Conn, frame: &Frame, first: &[u8]) -> Result<()> {
        let start = Instant::now();
        let r = write_frame_with_payload(stream, frame, first);
        self.0 += start.elapsed();
        r
    }
}

/// Sends a block's header, its payload in pieces, each hashed just before
/// it goes (so the kernel copies it from the CPU cache rather than from
/// memory), and the checksum after them.
fn send_block(
    shared: &Shared,
    stream: &mut Conn,
    header: BlockHeader,
    gid: usize,
    payload: &[u8],
) -> Result<()> {
    let mut hasher = (shared.verify != Verification::None).then(BlockHasher::default);
    let mut writes = Writes::default();
    let mut pieces = payload.chunks(HASH_PIECE);
    let first = pieces.next().unwrap_or_default();
    if let Some(h) = &mut hasher {
        h.update(first);
    }
    writes.write_frame(stream, &Frame::Block(header), first)?;
    for piece in pieces {
        if let Some(h) = &mut hasher {
            h.update(piece);
        }
        writes.write(stream, piece)?;
    }
    let sum = hasher.map_or(0, |h| h.finish());
    send_checksum(shared, stream, gid, sum, &mut writes)?;
    let len = payload.len() as u64;
    written(shared, len, len, writes.0);
    Ok(())
}

/// Sends a block as its pieces, each hashed plain and then packed with
/// `codec` (or sent as it is, if it did not shrink), behind its prefix.
fn send_packed(
    shared: &Shared,
    stream: &mut Conn,
    header: BlockHeader,
    gid: usize,
    payload: &[u8],
    (codec, packer): (Codec, &mut Packer),
) -> Result<()> {
    let mut hasher = (shared.verify != Verification::None).then(BlockHasher::default);
    let mut writes = Writes::default();
    // The header goes with the first piece, in one write.
    let mut head = frame_bytes(&Frame::PackedBlock { header, codec });
    let (mut packing, mut wire) = (Duration::ZERO, 0u64);
    for (index, piece) in (0u32..).zip(payload.chunks(PIECE)) {
        if let Some(h) = &mut hasher {
            h.update(piece);
        }
        let start = Instant::now();
        let packed = packer.pack(codec, piece);
        packing += start.elapsed();
        let (prefix, bytes) = match packed {
            Some(p) => (Piece::Packed(p.len() as u32), p),
            None => (Piece::Stored, piece),
        };
        let at = PieceAt {
            file_id: header.file_id,
            block: header.block,
            index,
        };
        head.extend_from_slice(&prefix.prefix(at));
        writes.write_two(stream, &head, bytes)?;
        head.clear();
        wire += (PREFIX_LEN + bytes.len()) as u64;
    }
    let sum = hasher.map_or(0, |h| h.finish());
    send_checksum(shared, stream, gid, sum, &mut writes)?;
    let plain = payload.len() as u64;
    let shrank = wire < plain;
    hold(&shared.compress).handle_packed(plain, shrank.then_some(wire), packing);
    if shrank {
        shared.observer.packed(codec, plain, wire);
    }
    written(shared, plain, wire, writes.0);
    Ok(())
}

/// `frame`, encoded.
fn frame_bytes(frame: &Frame) -> Vec<u8> {
    let mut out = Vec::with_capacity(48);
    crate::wire::encode(frame, &mut out);
    out
}

/// Tells the compression decision a block of `plain` bytes went out as
/// `wire` bytes in `took`, and the observer if that changed the decision.
fn written(shared: &Shared, plain: u64, wire: u64, took: Duration) {
    let changed = {
        let mut auto = hold(&shared.compress);
        auto.handle_written(plain, wire, took);
        auto.take_change()
    };
    if let Some(reason) = changed {
        tracing::debug!("compression: {}", reason.as_str());
        shared.observer.compression_changed(reason);
    }
}

/// Sends block `gid`'s checksum, recorded first.
fn send_checksum(
    shared: &Shared,
    stream: &mut Conn,
    gid: usize,
    sum: u64,
    writes: &mut Writes,
) -> Result<()> {
    // Recorded before the receiver can see the checksum, hence before it
    // can acknowledge the block. The last block of a file to go out lets
    // the coordinator report the file at once.
    if shared.lock().sched.handle_sent_checksum(gid, sum) {
        shared.cv.notify_all();
    }
    writes.write(stream, &sum.to_le_bytes())
}

/// What a data stream's acknowledgement reader reads at a time.
const ACK_READ_BUF: usize = 16 << 10;

/// Reads data stream `i`'s acknowledgements until the session stops and
/// the stream closes or is parked; tells `settle_parking` it has ended.
pub(super) fn ack_loop(shared: &Shared, i: u16, stream: Conn) {
    read_acks(shared, i, stream);
    shared.lock().acks_running -= 1;
    shared.cv.notify_all();
}

fn read_acks(shared: &Shared, i: u16, stream: Conn) {
    let mut reader = FrameReader::default();
    // The receiver writes the acknowledgements it has queued together (a
    // tree of one-block files has one a file): read them in as few calls.
    let mut stream = std::io::BufReader::with_capacity(ACK_READ_BUF, stream);
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
            // (Nothing may follow it before the next session's join, so
            // nothing read ahead is lost with the buffer.)
            Ok(Frame::Parked)
                if shared.park.load(Ordering::SeqCst) && stream.buffer().is_empty() =>
            {
                g.parked.push((i, stream.into_inner(), Instant::now()));
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
                let _ = stream.get_ref().shutdown(Shutdown::Both);
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
pub(super) fn settle_parking(shared: &Shared, open: &Mutex<Vec<Option<Conn>>>) {
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
