//! Encoding and checked decoding of frames, with no I/O.

use super::{
    BlockHeader, EntryKind, FileEntry, Frame, HELLO_PORT_SINCE, MAC_LEN, MAGIC, MAX_BLOCK,
    MAX_FRAME, MAX_MESSAGE, MAX_PATH, NONCE_LEN, PlanOutcome, Purpose, SESSION_ID_LEN, VERSION,
    Verification,
};

/// Why a frame could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The frame ended before a field did.
    #[error("frame ends early")]
    UnexpectedEnd,
    /// The length prefix is over the cap.
    #[error("frame of {len} bytes is over the {max}-byte limit")]
    TooLarge {
        /// Announced length.
        len: usize,
        /// The cap.
        max: usize,
    },
    /// A zero-length frame has no type.
    #[error("empty frame")]
    Empty,
    /// Unknown frame type.
    #[error("unknown frame type {0}")]
    UnknownType(u8),
    /// The first frame did not carry our magic.
    #[error("not a wirerate peer (bad magic)")]
    BadMagic,
    /// A field holds a value outside its domain.
    #[error("invalid {0}")]
    Invalid(&'static str),
    /// Bytes left over after the last field.
    #[error("{0} unexpected bytes after the frame's fields")]
    Trailing(usize),
}

const T_HELLO: u8 = 1;
const T_CHALLENGE: u8 = 2;
const T_AUTH: u8 = 3;
const T_SERVER_PROOF: u8 = 4;
const T_OPEN: u8 = 5;
const T_FILES: u8 = 6;
const T_FILES_END: u8 = 7;
const T_PLAN: u8 = 8;
const T_PLAN_END: u8 = 9;
const T_BLOCK: u8 = 10;
const T_ACK: u8 = 11;
const T_NACK: u8 = 12;
const T_FILE_DONE: u8 = 13;
const T_FILE_RESULT: u8 = 14;
const T_FINISH: u8 = 15;
const T_ERROR: u8 = 16;
const T_FILE_ABORT: u8 = 17;
const T_KEEPALIVE: u8 = 18;
const T_PARK: u8 = 19;
const T_PARKED: u8 = 20;

/// Appends the encoding of `frame` (length prefix included) to `out`.
pub fn encode(frame: &Frame, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    let mut w = Writer(out);
    match frame {
        Frame::Hello {
            version,
            nonce,
            port,
        } => {
            w.u8(T_HELLO);
            w.bytes(&MAGIC);
            w.u16(*version);
            w.bytes(nonce);
            if *version >= HELLO_PORT_SINCE {
                w.u16(*port);
            }
        }
        Frame::Challenge { version, nonce } => {
            w.u8(T_CHALLENGE);
            w.bytes(&MAGIC);
            w.u16(*version);
            w.bytes(nonce);
        }
        Frame::Auth { mac, purpose } => {
            w.u8(T_AUTH);
            w.bytes(mac);
            match purpose {
                Purpose::Control => w.u8(0),
                Purpose::Join { session, stream } => {
                    w.u8(1);
                    w.bytes(session);
                    w.u16(*stream);
                }
            }
        }
        Frame::ServerProof { mac } => {
            w.u8(T_SERVER_PROOF);
            w.bytes(mac);
        }
        Frame::Open {
            session,
            block_size,
            streams,
            verify,
            discard,
        } => {
            w.u8(T_OPEN);
            w.bytes(session);
            w.u32(*block_size);
            w.u16(*streams);
            w.u8(match verify {
                Verification::None => 0,
                Verification::Checksums => 1,
                Verification::Reread => 2,
            });
            w.u8(u8::from(*discard));
        }
        Frame::Files { entries } => {
            w.u8(T_FILES);
            w.u32(entries.len() as u32);
            for e in entries {
                w.u32(e.file_id);
                w.u8(match e.kind {
                    EntryKind::File => 0,
                    EntryKind::Dir => 1,
                });
                w.u64(e.size);
                w.u64(e.fingerprint);
                w.u16(e.mode);
                w.str(&e.path);
            }
        }
        Frame::FilesEnd => w.u8(T_FILES_END),
        Frame::Plan { file_id, outcome } => {
            w.u8(T_PLAN);
            w.u32(*file_id);
            match outcome {
                PlanOutcome::Accept { have } => {
                    w.u8(0);
                    w.u32(have.len() as u32);
                    w.bytes(have);
                }
                PlanOutcome::Refuse { message } => {
                    w.u8(1);
                    w.str(message);
                }
            }
        }
        Frame::PlanEnd => w.u8(T_PLAN_END),
        Frame::Block(h) => {
            w.u8(T_BLOCK);
            w.u32(h.file_id);
            w.u64(h.block);
            w.u64(h.offset);
            w.u32(h.len);
        }
        Frame::Ack { file_id, block } => {
            w.u8(T_ACK);
            w.u32(*file_id);
            w.u64(*block);
        }
        Frame::Nack { file_id, block } => {
            w.u8(T_NACK);
            w.u32(*file_id);
            w.u64(*block);
        }
        Frame::FileDone { file_id, digest } => {
            w.u8(T_FILE_DONE);
            w.u32(*file_id);
            w.bytes(&digest.to_le_bytes());
        }
        Frame::FileResult {
            file_id,
            ok,
            digest,
            message,
        } => {
            w.u8(T_FILE_RESULT);
            w.u32(*file_id);
            w.u8(u8::from(*ok));
            w.bytes(&digest.to_le_bytes());
            w.str(message);
        }
        Frame::FileAbort { file_id, message } => {
            w.u8(T_FILE_ABORT);
            w.u32(*file_id);
            w.str(message);
        }
        Frame::Keepalive => w.u8(T_KEEPALIVE),
        Frame::Finish => w.u8(T_FINISH),
        Frame::Park => w.u8(T_PARK),
        Frame::Parked => w.u8(T_PARKED),
        Frame::Error { retryable, message } => {
            w.u8(T_ERROR);
            w.u8(u8::from(*retryable));
            w.str(message);
        }
    }
    let len = (out.len() - start - 4) as u32;
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
}

/// Decodes one frame from the front of `buf`: `Ok(None)` when more bytes are
/// needed, else the frame and how many bytes it used.
pub fn decode(buf: &[u8]) -> Result<Option<(Frame, usize)>, DecodeError> {
    let Some(prefix) = buf.get(..4) else {
        return Ok(None);
    };
    let len = u32::from_le_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize;
    if len > MAX_FRAME {
        return Err(DecodeError::TooLarge {
            len,
            max: MAX_FRAME,
        });
    }
    let Some(body) = buf.get(4..4 + len) else {
        return Ok(None);
    };
    decode_body(body).map(|f| Some((f, 4 + len)))
}

/// Decodes a frame from its type byte and body (the length prefix removed).
pub fn decode_body(body: &[u8]) -> Result<Frame, DecodeError> {
    let mut r = Reader(body);
    let ty = r.u8().map_err(|_| DecodeError::Empty)?;
    let frame = match ty {
        T_HELLO | T_CHALLENGE => {
            if r.array::<4>()? != MAGIC {
                return Err(DecodeError::BadMagic);
            }
            let version = r.u16()?;
            let nonce = r.array::<NONCE_LEN>()?;
            if ty == T_HELLO {
                let port = if version >= HELLO_PORT_SINCE {
                    r.u16()?
                } else {
                    0
                };
                // A later version's hello may carry more: it still decodes,
                // so that its sender is told which version this side
                // speaks rather than that its frame was malformed.
                if version > VERSION {
                    r.0 = &[];
                }
                Frame::Hello {
                    version,
                    nonce,
                    port,
                }
            } else {
                Frame::Challenge { version, nonce }
            }
        }
        T_AUTH => {
            let mac = r.array::<MAC_LEN>()?;
            let purpose = match r.u8()? {
                0 => Purpose::Control,
                1 => Purpose::Join {
                    session: r.array::<SESSION_ID_LEN>()?,
                    stream: r.u16()?,
                },
                _ => return Err(DecodeError::Invalid("connection purpose")),
            };
            Frame::Auth { mac, purpose }
        }
        T_SERVER_PROOF => Frame::ServerProof {
            mac: r.array::<MAC_LEN>()?,
        },
        T_OPEN => {
            let session = r.array::<SESSION_ID_LEN>()?;
            let block_size = r.u32()?;
            if block_size == 0
                || block_size > MAX_BLOCK
                || u64::from(block_size) % crate::tuning::BLOCK_SIZE.step != 0
            {
                return Err(DecodeError::Invalid("block size"));
            }
            let streams = r.u16()?;
            if streams == 0 {
                return Err(DecodeError::Invalid("stream count"));
            }
            let verify = match r.u8()? {
                0 => Verification::None,
                1 => Verification::Checksums,
                2 => Verification::Reread,
                _ => return Err(DecodeError::Invalid("verify level")),
            };
            let discard = match r.u8()? {
                0 => false,
                1 => true,
                _ => return Err(DecodeError::Invalid("discard flag")),
            };
            Frame::Open {
                session,
                block_size,
                streams,
                verify,
                discard,
            }
        }
        T_FILES => {
            let count = r.u32()? as usize;
            // Each entry takes at least 25 bytes, so the count cannot make us
            // reserve more than the frame itself justifies.
            let mut entries = Vec::with_capacity(count.min(r.0.len() / 25));
            for _ in 0..count {
                let file_id = r.u32()?;
                let kind = match r.u8()? {
                    0 => EntryKind::File,
                    1 => EntryKind::Dir,
                    _ => return Err(DecodeError::Invalid("entry kind")),
                };
                let size = r.u64()?;
                let fingerprint = r.u64()?;
                let mode = r.u16()?;
                if mode > 0o777 {
                    return Err(DecodeError::Invalid("permission bits"));
                }
                let path = r.str(MAX_PATH)?;
                entries.push(FileEntry {
                    file_id,
                    kind,
                    size,
                    fingerprint,
                    mode,
                    path,
                });
            }
            Frame::Files { entries }
        }
        T_FILES_END => Frame::FilesEnd,
        T_PLAN => {
            let file_id = r.u32()?;
            let outcome = match r.u8()? {
                0 => {
                    let n = r.u32()? as usize;
                    PlanOutcome::Accept {
                        have: r.take(n)?.to_vec(),
                    }
                }
                1 => PlanOutcome::Refuse {
                    message: r.str(MAX_MESSAGE)?,
                },
                _ => return Err(DecodeError::Invalid("plan outcome")),
            };
            Frame::Plan { file_id, outcome }
        }
        T_PLAN_END => Frame::PlanEnd,
        T_BLOCK => {
            let h = BlockHeader {
                file_id: r.u32()?,
                block: r.u64()?,
                offset: r.u64()?,
                len: r.u32()?,
            };
            if h.len == 0 || h.len > MAX_BLOCK {
                return Err(DecodeError::Invalid("block length"));
            }
            Frame::Block(h)
        }
        T_ACK | T_NACK => {
            let file_id = r.u32()?;
            let block = r.u64()?;
            if ty == T_ACK {
                Frame::Ack { file_id, block }
            } else {
                Frame::Nack { file_id, block }
            }
        }
        T_FILE_DONE => Frame::FileDone {
            file_id: r.u32()?,
            digest: u128::from_le_bytes(r.array::<16>()?),
        },
        T_FILE_RESULT => Frame::FileResult {
            file_id: r.u32()?,
            ok: r.bool()?,
            digest: u128::from_le_bytes(r.array::<16>()?),
            message: r.str(MAX_MESSAGE)?,
        },
        T_FILE_ABORT => Frame::FileAbort {
            file_id: r.u32()?,
            message: r.str(MAX_MESSAGE)?,
        },
        T_KEEPALIVE => Frame::Keepalive,
        T_FINISH => Frame::Finish,
        T_PARK => Frame::Park,
        T_PARKED => Frame::Parked,
        T_ERROR => Frame::Error {
            retryable: r.bool()?,
            message: r.str(MAX_MESSAGE)?,
        },
        other => return Err(DecodeError::UnknownType(other)),
    };
    if !r.0.is_empty() {
        return Err(DecodeError::Trailing(r.0.len()));
    }
    Ok(frame)
}

struct Writer<'a>(&'a mut Vec<u8>);

impl Writer<'_> {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, v: &[u8]) {
        self.0.extend_from_slice(v);
    }
    /// Strings longer than a u16 are cut: every caller bounds them far lower.
    fn str(&mut self, s: &str) {
        let mut end = s.len().min(MAX_MESSAGE.max(MAX_PATH));
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.u16(end as u16);
        self.bytes(&s.as_bytes()[..end]);
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < n {
            return Err(DecodeError::UnexpectedEnd);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut a = [0; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }
    fn bool(&mut self) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(DecodeError::Invalid("boolean")),
        }
    }
    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    fn str(&mut self, max: usize) -> Result<String, DecodeError> {
        let n = self.u16()? as usize;
        if n > max {
            return Err(DecodeError::Invalid("string length"));
        }
        let b = self.take(n)?;
        String::from_utf8(b.to_vec()).map_err(|_| DecodeError::Invalid("UTF-8 string"))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arb_str(max: usize) -> impl Strategy<Value = String> {
        proptest::collection::vec(any::<char>(), 0..64).prop_map(move |v| {
            let mut s: String = v.into_iter().collect();
            while s.len() > max {
                s.pop();
            }
            s
        })
    }

    /// Any frame the codec can carry, for decoders and state machines.
    pub(crate) fn arb_frame() -> impl Strategy<Value = Frame> {
        prop_oneof![
            (any::<u16>(), any::<[u8; 32]>(), any::<u16>()).prop_map(|(version, nonce, port)| {
                Frame::Hello {
                    version,
                    nonce,
                    // An older hello has no port to carry.
                    port: if version >= HELLO_PORT_SINCE { port } else { 0 },
                }
            }),
            (any::<u16>(), any::<[u8; 32]>())
                .prop_map(|(version, nonce)| Frame::Challenge { version, nonce }),
            (any::<[u8; 32]>(), any::<Option<([u8; 16], u16)>>()).prop_map(|(mac, p)| {
                Frame::Auth {
                    mac,
                    purpose: match p {
                        None => Purpose::Control,
                        Some((session, stream)) => Purpose::Join { session, stream },
                    },
                }
            }),
            any::<[u8; 32]>().prop_map(|mac| Frame::ServerProof { mac }),
            (
                any::<[u8; 16]>(),
                1u32..=(MAX_BLOCK / 4096),
                1u16..,
                0u8..3,
                any::<bool>()
            )
                .prop_map(|(session, b, streams, v, discard)| Frame::Open {
                    session,
                    block_size: b * 4096,
                    streams,
                    verify: [
                        Verification::None,
                        Verification::Checksums,
                        Verification::Reread
                    ][v as usize],
                    discard,
                }),
            proptest::collection::vec(
                (
                    any::<u32>(),
                    any::<bool>(),
                    any::<u64>(),
                    any::<u64>(),
                    0u16..=0o777,
                    arb_str(200)
                ),
                0..20
            )
            .prop_map(|v| Frame::Files {
                entries: v
                    .into_iter()
                    .map(|(file_id, d, size, fingerprint, mode, path)| FileEntry {
                        file_id,
                        kind: if d { EntryKind::Dir } else { EntryKind::File },
                        size,
                        fingerprint,
                        mode,
                        path,
                    })
                    .collect()
            }),
            Just(Frame::FilesEnd),
            (any::<u32>(), proptest::collection::vec(any::<u8>(), 0..300)).prop_map(
                |(file_id, have)| Frame::Plan {
                    file_id,
                    outcome: PlanOutcome::Accept { have }
                }
            ),
            (any::<u32>(), arb_str(300)).prop_map(|(file_id, message)| Frame::Plan {
                file_id,
                outcome: PlanOutcome::Refuse { message }
            }),
            Just(Frame::PlanEnd),
            (any::<u32>(), any::<u64>(), any::<u64>(), 1..=MAX_BLOCK).prop_map(
                |(file_id, block, offset, len)| Frame::Block(BlockHeader {
                    file_id,
                    block,
                    offset,
                    len,
                })
            ),
            (any::<u32>(), any::<u64>()).prop_map(|(file_id, block)| Frame::Ack { file_id, block }),
            (any::<u32>(), any::<u64>())
                .prop_map(|(file_id, block)| Frame::Nack { file_id, block }),
            (any::<u32>(), any::<u128>())
                .prop_map(|(file_id, digest)| Frame::FileDone { file_id, digest }),
            (any::<u32>(), any::<bool>(), any::<u128>(), arb_str(300)).prop_map(
                |(file_id, ok, digest, message)| {
                    Frame::FileResult {
                        file_id,
                        ok,
                        digest,
                        message,
                    }
                }
            ),
            (any::<u32>(), arb_str(300))
                .prop_map(|(file_id, message)| Frame::FileAbort { file_id, message }),
            Just(Frame::Keepalive),
            Just(Frame::Finish),
            Just(Frame::Park),
            Just(Frame::Parked),
            (any::<bool>(), arb_str(300))
                .prop_map(|(retryable, message)| Frame::Error { retryable, message }),
        ]
    }

    proptest! {
        #[test]
        fn roundtrip(frame in arb_frame()) {
            let mut buf = Vec::new();
            encode(&frame, &mut buf);
            let (decoded, used) = decode(&buf).unwrap().unwrap();
            prop_assert_eq!(used, buf.len());
            prop_assert_eq!(decoded, frame);
        }

        #[test]
        fn every_prefix_asks_for_more(frame in arb_frame()) {
            let mut buf = Vec::new();
            encode(&frame, &mut buf);
            for cut in 0..buf.len() {
                prop_assert_eq!(decode(&buf[..cut]).unwrap(), None);
            }
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let _ = decode(&bytes);
            let _ = decode_body(&bytes);
        }

        #[test]
        fn truncated_body_is_an_error(frame in arb_frame()) {
            let mut buf = Vec::new();
            encode(&frame, &mut buf);
            let body = &buf[4..];
            for cut in 0..body.len() {
                prop_assert!(decode_body(&body[..cut]).is_err());
            }
        }
    }

    #[test]
    fn oversized_length_refused_before_allocation() {
        let buf = u32::MAX.to_le_bytes();
        assert!(matches!(decode(&buf), Err(DecodeError::TooLarge { .. })));
    }

    #[test]
    fn bad_magic_and_unknown_type() {
        let mut buf = Vec::new();
        encode(
            &Frame::Hello {
                version: 1,
                nonce: [0; 32],
                port: 0,
            },
            &mut buf,
        );
        buf[5] = b'X';
        assert_eq!(decode(&buf), Err(DecodeError::BadMagic));
        assert_eq!(decode_body(&[200]), Err(DecodeError::UnknownType(200)));
        assert_eq!(decode_body(&[]), Err(DecodeError::Empty));
    }

    #[test]
    fn a_later_versions_longer_hello_still_decodes() {
        let mut buf = Vec::new();
        encode(
            &Frame::Hello {
                version: VERSION + 1,
                nonce: [3; 32],
                port: 7470,
            },
            &mut buf,
        );
        buf.extend_from_slice(&[9, 9, 9]);
        let body = &buf[4..];
        assert!(matches!(
            decode_body(body),
            Ok(Frame::Hello { version, port: 7470, .. }) if version == VERSION + 1
        ));
        // This version's own hello gets no such leeway.
        let mut own = Vec::new();
        encode(
            &Frame::Hello {
                version: VERSION,
                nonce: [3; 32],
                port: 7470,
            },
            &mut own,
        );
        own.push(9);
        assert_eq!(decode_body(&own[4..]), Err(DecodeError::Trailing(1)));
    }

    #[test]
    fn trailing_bytes_refused() {
        let mut buf = Vec::new();
        encode(&Frame::Finish, &mut buf);
        buf.push(0);
        assert_eq!(decode_body(&buf[4..]), Err(DecodeError::Trailing(1)));
    }

    #[test]
    fn a_discard_flag_other_than_0_or_1_is_refused() {
        let mut buf = Vec::new();
        encode(
            &Frame::Open {
                session: [0; 16],
                block_size: 1 << 20,
                streams: 1,
                verify: Verification::Checksums,
                discard: true,
            },
            &mut buf,
        );
        *buf.last_mut().unwrap() = 2;
        assert_eq!(
            decode_body(&buf[4..]),
            Err(DecodeError::Invalid("discard flag"))
        );
    }

    #[test]
    fn huge_entry_count_does_not_preallocate() {
        let mut body = vec![T_FILES];
        body.extend_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(decode_body(&body), Err(DecodeError::UnexpectedEnd));
    }
}
