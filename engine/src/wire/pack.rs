//! Packing runs of small control frames into compressed frames.
//!
//! A tree's manifest, its plan and its results are thousands of frames of
//! a few tens of bytes each. On a long path every 14 KB of them costs the
//! control connection's young congestion window another round trip: a
//! manifest of 2,000 files took three at 150 ms, and its plan two, while
//! the data streams, connected and idle, waited. Their paths and fields
//! repeat, so LZ4 shrinks them several times over.
//!
//! A packed frame is `[u32 length][T_PACKED][u32 unpacked length][LZ4
//! block][u64 check]`, checked like any frame, and every frame inside it
//! keeps its own check: packing changes how many bytes travel, not what
//! is trusted. The unpacked length is bounded (`MAX_PACKED_RAW`) before
//! anything is allocated for it, and the LZ4 block must unpack to exactly
//! that length. Only a reader made with `FrameReader::unpacking`, on the
//! control connection of an authenticated session, opens packed frames;
//! anywhere else a packed frame is an unknown frame type.

pub(super) use super::codec::T_PACKED;
use super::codec::{checked_fields, encode_with};
use super::{DecodeError, FRAME_CHECK_LEN};

/// Most bytes of frames one packed frame carries, unpacked.
pub const MAX_PACKED_RAW: usize = 256 << 10;
/// Largest packed frame: it is only sent when smaller than what it packs.
pub const MAX_PACKED_FRAME: usize = MAX_PACKED_RAW + 64;
/// Runs of frames shorter than this go as they are: they fit in a few
/// packets anyway, and a keepalive should not wait on a compressor.
const PACK_FROM: usize = 1024;

/// Replaces the whole encoded frames in `out` with packed frames wherever
/// that makes them smaller; a frame over `MAX_PACKED_RAW` goes as it is.
pub fn pack(out: &mut Vec<u8>) {
    if out.len() < PACK_FROM {
        return;
    }
    let raw = std::mem::take(out);
    out.reserve(raw.len() / 2);
    for run in runs(&raw) {
        let chunk = &raw[run];
        if chunk.len() < PACK_FROM || chunk.len() > MAX_PACKED_RAW {
            out.extend_from_slice(chunk);
            continue;
        }
        let packed = lz4_flex::block::compress(chunk);
        if packed.len() + 4 + 1 + 4 + FRAME_CHECK_LEN >= chunk.len() {
            out.extend_from_slice(chunk);
            continue;
        }
        encode_with(out, true, |out| {
            out.push(T_PACKED);
            out.extend_from_slice(&(chunk.len() as u32).to_le_bytes());
            out.extend_from_slice(&packed);
        });
    }
}

/// `raw` cut at frame boundaries into runs of at most `MAX_PACKED_RAW`
/// bytes, or of one frame where a frame alone is longer.
fn runs(raw: &[u8]) -> Vec<std::ops::Range<usize>> {
    let mut runs = Vec::new();
    let (mut start, mut at) = (0, 0);
    while at < raw.len() {
        let Some(prefix) = raw.get(at..at + 4) else {
            // Our own encoder wrote these: a torn frame is a bug; it still
            // goes out as it is, to be refused by the peer as damaged.
            break;
        };
        let frame = 4 + u32::from_le_bytes(prefix.try_into().expect("four bytes")) as usize;
        if at > start && at + frame - start > MAX_PACKED_RAW {
            runs.push(start..at);
            start = at;
        }
        at = (at + frame).min(raw.len());
    }
    if start < raw.len() {
        runs.push(start..raw.len());
    }
    runs
}

/// Checks packed frame `body` (type byte, fields and check) and unpacks
/// the frames it carries into `into`, replacing what was there.
// Only the shells read sockets.
#[cfg_attr(not(feature = "shells"), allow(dead_code))]
pub(super) fn unpack(body: &[u8], into: &mut Vec<u8>) -> Result<(), DecodeError> {
    let fields = checked_fields(body)?;
    if fields.len() <= 5 {
        return Err(DecodeError::Damaged("packed frames"));
    }
    let raw_len = u32::from_le_bytes(fields[1..5].try_into().expect("four bytes")) as usize;
    if raw_len == 0 || raw_len > MAX_PACKED_RAW {
        return Err(DecodeError::Invalid("unpacked length"));
    }
    into.clear();
    into.resize(raw_len, 0);
    match lz4_flex::block::decompress_into(&fields[5..], into) {
        Ok(n) if n == raw_len => Ok(()),
        _ => {
            into.clear();
            Err(DecodeError::Invalid("packed frames"))
        }
    }
}

/// The next whole frame's body in `unpacked` from `*at`, moving `*at`
/// past it; `cap` bounds it as it would a frame read from the socket.
// Only the shells read sockets.
#[cfg_attr(not(feature = "shells"), allow(dead_code))]
pub(super) fn next<'a>(
    unpacked: &'a [u8],
    at: &mut usize,
    cap: usize,
) -> Result<&'a [u8], DecodeError> {
    let rest = unpacked.get(*at..).unwrap_or_default();
    let prefix: [u8; 4] = rest
        .get(..4)
        .and_then(|p| p.try_into().ok())
        .ok_or(DecodeError::UnexpectedEnd)?;
    let len = u32::from_le_bytes(prefix) as usize;
    if len > cap {
        return Err(DecodeError::TooLarge { len, max: cap });
    }
    let body = rest.get(4..4 + len).ok_or(DecodeError::UnexpectedEnd)?;
    if body.first() == Some(&T_PACKED) {
        return Err(DecodeError::Invalid("packed frames inside packed frames"));
    }
    *at += 4 + len;
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::EntryKind;
    use crate::wire::codec::frame_check;
    use crate::wire::{FileEntry, Frame, PlanOutcome, decode_body, encode};

    fn manifest(n: u32) -> Vec<u8> {
        let entries = (0..n)
            .map(|i| FileEntry {
                file_id: i,
                kind: EntryKind::File,
                size: 65536,
                fingerprint: u64::from(i).wrapping_mul(0x9e37_79b9_7f4a_7c15),
                mode: 0o644,
                mtime: (0, 0),
                digest: None,
                meta: None,
                path: format!("tree/d{:03}/f{i:05}.bin", i / 500),
            })
            .collect();
        let mut out = Vec::new();
        encode(&Frame::Files { entries }, &mut out);
        for i in 0..n {
            encode(
                &Frame::Plan {
                    file_id: i,
                    outcome: PlanOutcome::Accept { have: vec![0] },
                },
                &mut out,
            );
        }
        out
    }

    /// Every frame of `bytes`, unpacking packed ones.
    fn frames(bytes: &[u8]) -> Result<Vec<Frame>, DecodeError> {
        let (mut at, mut got, mut unpacked) = (0, Vec::new(), Vec::new());
        while at < bytes.len() {
            let body = next_any(bytes, &mut at)?;
            if body[0] == T_PACKED {
                unpack(body, &mut unpacked)?;
                let mut inner = 0;
                while inner < unpacked.len() {
                    got.push(decode_body(next(&unpacked, &mut inner, usize::MAX)?)?);
                }
            } else {
                got.push(decode_body(body)?);
            }
        }
        Ok(got)
    }

    fn next_any<'a>(bytes: &'a [u8], at: &mut usize) -> Result<&'a [u8], DecodeError> {
        let len = u32::from_le_bytes(bytes[*at..*at + 4].try_into().unwrap()) as usize;
        let body = &bytes[*at + 4..*at + 4 + len];
        *at += 4 + len;
        Ok(body)
    }

    #[test]
    fn a_tree_manifest_and_plan_shrink_and_come_back_whole() {
        let raw = manifest(2000);
        let mut packed = raw.clone();
        pack(&mut packed);
        assert!(
            packed.len() * 2 < raw.len(),
            "{} bytes packed into {}",
            raw.len(),
            packed.len()
        );
        assert_eq!(frames(&packed).unwrap(), frames(&raw).unwrap());
    }

    #[test]
    fn small_runs_and_big_frames_go_as_they_are() {
        let mut few = Vec::new();
        encode(&Frame::Keepalive, &mut few);
        let before = few.clone();
        pack(&mut few);
        assert_eq!(few, before);
        // One frame over the cap is left alone; what follows it still packs.
        let mut out = manifest(8000);
        let first = 4 + u32::from_le_bytes(out[..4].try_into().unwrap()) as usize;
        assert!(first > MAX_PACKED_RAW);
        let raw = out.clone();
        pack(&mut out);
        assert_eq!(&out[..first], &raw[..first]);
        assert!(out.len() < raw.len());
        assert_eq!(frames(&out).unwrap(), frames(&raw).unwrap());
    }

    #[test]
    fn damaged_or_lying_packed_frames_are_refused() {
        let mut out = manifest(200);
        pack(&mut out);
        assert_eq!(out[4], T_PACKED, "one packed frame");
        let body = |out: &[u8]| out[4..].to_vec();
        let mut into = Vec::new();
        // A flipped bit anywhere fails the check.
        for i in [5, 9, out.len() / 2, out.len() - 1] {
            let mut bad = out.clone();
            bad[i] ^= 0x10;
            assert!(unpack(&body(&bad), &mut into).is_err(), "bit at {i}");
        }
        // An unpacked length over the bound, or not the block's, is refused
        // before or while unpacking, with a valid check.
        for raw_len in [0, MAX_PACKED_RAW as u32 + 1, 17] {
            let mut b = body(&out);
            b[1..5].copy_from_slice(&raw_len.to_le_bytes());
            let n = b.len() - FRAME_CHECK_LEN;
            let check = frame_check(&b[..n]);
            b[n..].copy_from_slice(&check.to_le_bytes());
            assert!(unpack(&b, &mut into).is_err(), "unpacked length {raw_len}");
            assert!(into.len() <= MAX_PACKED_RAW);
        }
        // Packed frames inside packed frames are refused.
        let mut inner = out.clone();
        inner.extend_from_slice(&out);
        let mut at = 0;
        assert!(next(&inner, &mut at, usize::MAX).is_err());
        // A frame inside over the reader's cap is refused.
        unpack(&body(&out), &mut into).unwrap();
        let mut at = 0;
        assert!(matches!(
            next(&into, &mut at, 16),
            Err(DecodeError::TooLarge { .. })
        ));
    }
}
