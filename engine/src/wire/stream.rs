//! Blocking frame I/O over any `Read`/`Write` (TCP streams in practice).

use std::io::{self, IoSlice, Read, Write};

use super::pack::{T_PACKED, next, unpack};
use super::{DecodeError, Frame, MAX_FRAME, MAX_PACKED_FRAME, decode_body, encode};
use crate::error::{Error, Result};

/// Reads one frame, refusing a length prefix over `MAX_FRAME` before allocating.
pub fn read_frame(r: &mut impl Read) -> Result<Frame> {
    FrameReader::default().read(r)
}

/// Reads one frame of at most `cap` bytes, refusing a longer length
/// prefix before allocating (see `MAX_PREAUTH_FRAME`, `MAX_SMALL_FRAME`).
pub fn read_frame_capped(r: &mut impl Read, cap: usize) -> Result<Frame> {
    FrameReader::default().read_capped(r, cap)
}

/// Reads frames reusing one buffer.
#[derive(Default)]
pub struct FrameReader {
    buf: Vec<u8>,
    /// Opens packed frames (`pack`): the control connection of an
    /// authenticated session.
    unpack: bool,
    /// The frames of the last packed frame, and where the next one begins.
    unpacked: Vec<u8>,
    at: usize,
}

impl FrameReader {
    /// A reader for the control connection of an authenticated session,
    /// where runs of frames may come packed: it returns the frames inside
    /// them one by one, each checked and capped as if read on its own.
    pub fn unpacking() -> Self {
        Self {
            unpack: true,
            ..Self::default()
        }
    }

    /// Whether frames of a packed frame are still to be returned: the
    /// next read takes one without touching the socket, so a caller that
    /// waits for the socket to be readable must not wait for it first.
    pub fn has_pending(&self) -> bool {
        self.at < self.unpacked.len()
    }

    /// Reads the next frame from `r`.
    pub fn read(&mut self, r: &mut impl Read) -> Result<Frame> {
        self.read_capped(r, MAX_FRAME)
    }

    /// Reads the next frame from `r`, refusing one over `cap` bytes.
    pub fn read_capped(&mut self, r: &mut impl Read, cap: usize) -> Result<Frame> {
        if !self.has_pending() {
            // A packed frame may be larger than the frames it carries, each
            // of which is held to `cap` as it is taken out.
            let outer = if self.unpack {
                cap.max(MAX_PACKED_FRAME)
            } else {
                cap
            };
            let unpacking = self.unpack;
            let body = self.read_body(r, outer)?;
            if !(unpacking && body.first() == Some(&T_PACKED)) {
                if body.len() > cap {
                    let len = body.len();
                    return Err(DecodeError::TooLarge { len, max: cap }.into());
                }
                return Ok(decode_body(body)?);
            }
            self.at = 0;
            if let Err(e) = unpack(&self.buf, &mut self.unpacked) {
                self.unpacked.clear();
                return Err(e.into());
            }
        }
        let frame = next(&self.unpacked, &mut self.at, cap.min(MAX_FRAME)).and_then(decode_body);
        if frame.is_err() || !self.has_pending() {
            // Refused frames end the connection; taken ones are not kept.
            self.unpacked.clear();
            self.at = 0;
        }
        Ok(frame?)
    }

    /// Reads the next frame's body (its type, fields and check, not yet
    /// checked) from `r`, refusing one over `cap` bytes before allocating.
    pub fn read_body(&mut self, r: &mut impl Read, cap: usize) -> Result<&[u8]> {
        let mut prefix = [0u8; 4];
        r.read_exact(&mut prefix)
            .map_err(|e| Error::net("reading a frame", e))?;
        let len = u32::from_le_bytes(prefix) as usize;
        let cap = cap.min(MAX_FRAME);
        if len > cap {
            return Err(DecodeError::TooLarge { len, max: cap }.into());
        }
        self.buf.clear();
        self.buf.resize(len, 0);
        r.read_exact(&mut self.buf)
            .map_err(|e| Error::net("reading a frame", e))?;
        Ok(&self.buf)
    }
}

/// Writes one frame.
pub fn write_frame(w: &mut impl Write, frame: &Frame) -> Result<()> {
    let mut buf = Vec::with_capacity(64);
    encode(frame, &mut buf);
    w.write_all(&buf)
        .map_err(|e| Error::net("sending a frame", e))
}

/// Writes a frame followed by `payload`, in one gathered write where the
/// kernel takes it, so the payload is never copied in user space.
pub fn write_frame_with_payload(w: &mut impl Write, frame: &Frame, payload: &[u8]) -> Result<()> {
    let mut head = Vec::with_capacity(48);
    encode(frame, &mut head);
    write_all_vectored(w, &mut [IoSlice::new(&head), IoSlice::new(payload)])
}

/// Writes every byte of `slices`, in as few calls as `w` takes.
pub fn write_all_vectored(w: &mut impl Write, slices: &mut [IoSlice<'_>]) -> Result<()> {
    let mut bufs: &mut [IoSlice<'_>] = slices;
    while !bufs.is_empty() {
        match w.write_vectored(bufs) {
            Ok(0) => {
                return Err(Error::net(
                    "sending a block",
                    io::Error::new(io::ErrorKind::WriteZero, "connection closed"),
                ));
            }
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::net("sending a block", e)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{MAX_SMALL_FRAME, PlanOutcome, pack};

    fn plan_entry(file_id: u32) -> Frame {
        Frame::Plan {
            file_id,
            outcome: PlanOutcome::Accept { have: vec![0] },
        }
    }

    fn packed_plan(n: u32) -> Vec<u8> {
        let mut out = Vec::new();
        for i in 0..n {
            encode(&plan_entry(i), &mut out);
        }
        encode(&Frame::PlanEnd, &mut out);
        let raw = out.len();
        pack(&mut out);
        // Each frame's check is eight bytes no compressor shrinks.
        assert!(
            out.len() * 4 < raw * 3,
            "{raw} bytes packed into {}",
            out.len()
        );
        out
    }

    #[test]
    fn an_unpacking_reader_returns_the_packed_frames_in_order() {
        let bytes = packed_plan(500);
        let mut src = &bytes[..];
        let mut r = FrameReader::unpacking();
        for i in 0..500 {
            // The packed frame is over the small cap; the frames in it are not.
            assert_eq!(
                r.read_capped(&mut src, MAX_SMALL_FRAME).unwrap(),
                plan_entry(i)
            );
            assert!(r.has_pending());
        }
        assert_eq!(r.read(&mut src).unwrap(), Frame::PlanEnd);
        assert!(!r.has_pending());
        assert!(src.is_empty());
    }

    #[test]
    fn packed_frames_are_opened_only_on_an_open_session_s_control_connection() {
        let bytes = packed_plan(500);
        let err = FrameReader::default().read(&mut &bytes[..]).unwrap_err();
        assert!(err.to_string().contains("unknown frame type 28"), "{err}");
        // The cap a caller sets still holds for a frame that is not packed.
        let mut big = Vec::new();
        encode(
            &Frame::Plan {
                file_id: 1,
                outcome: PlanOutcome::Accept {
                    have: vec![0; 8192],
                },
            },
            &mut big,
        );
        let err = FrameReader::unpacking()
            .read_capped(&mut &big[..], MAX_SMALL_FRAME)
            .unwrap_err();
        assert!(err.to_string().contains("limit"), "{err}");
    }
}
