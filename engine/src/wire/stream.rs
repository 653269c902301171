//! Blocking frame I/O over any `Read`/`Write` (TCP streams in practice).

use std::io::{self, IoSlice, Read, Write};

use super::{DecodeError, Frame, MAX_FRAME, decode_body, encode};
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
}

impl FrameReader {
    /// Reads the next frame from `r`.
    pub fn read(&mut self, r: &mut impl Read) -> Result<Frame> {
        self.read_capped(r, MAX_FRAME)
    }

    /// Reads the next frame from `r`, refusing one over `cap` bytes.
    pub fn read_capped(&mut self, r: &mut impl Read, cap: usize) -> Result<Frame> {
        let body = self.read_body(r, cap)?;
        Ok(decode_body(body)?)
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
    let mut slices = [IoSlice::new(&head), IoSlice::new(payload)];
    let mut bufs: &mut [IoSlice<'_>] = &mut slices;
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
