//! Encoding and checked decoding of frames, with no I/O.

use super::{
    BlockHeader, CHECKED_SINCE, Codec, Codecs, ENCRYPTION_SINCE, Encryption, EntryKind,
    FRAME_CHECK_LEN, FileEntry, Frame, HELLO_PORT_SINCE, MAC_LEN, MAGIC, MAX_ADDR, MAX_BLOCK,
    MAX_ENTRIES, MAX_FRAME, MAX_MESSAGE, MAX_PATH, MAX_PIECES, MAX_RELAY_SUMS, NONCE_LEN,
    PlanOutcome, Purpose, RelayEntry, RelayError, RelayJob, SESSION_ID_LEN, Stripe, StripePiece,
    StripeRole, VERSION, Verification,
};
use super::{MAX_XATTR_BYTES, MAX_XATTR_NAME, MAX_XATTRS, Meta};
use crate::tuning::SyncLevel;

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
    /// The frame's checksum does not match its bytes: it was damaged on
    /// the way (or its length prefix was), so none of it is acted on.
    #[error("a damaged {0} frame (its checksum does not match)")]
    Damaged(&'static str),
}

impl DecodeError {
    /// Whether this shows that the peer is no wirerate peer at all, as
    /// opposed to a frame damaged on the way or a peer's mistake, which a
    /// new connection may get past.
    pub fn is_foreign(&self) -> bool {
        matches!(self, Self::BadMagic)
    }
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
const T_STRIPE: u8 = 21;
const T_RELAY_JOB: u8 = 22;
const T_RELAY_FILES: u8 = 23;
const T_RELAY_ALIVE: u8 = 24;
const T_RELAY_SUMS: u8 = 25;
const T_RELAY_RESULT: u8 = 26;
const T_RELAY_DONE: u8 = 27;
/// A run of whole frames, compressed (`pack`): only the control
/// connection of an open session unpacks it; anywhere else it is an
/// unknown type.
pub(super) const T_PACKED: u8 = 28;
const T_PLAN_RUN: u8 = 29;
const T_PACKED_BLOCK: u8 = 30;
const T_MIRROR_OPEN: u8 = 31;
const T_REMOVE: u8 = 32;

/// Appends the encoding of `frame` (length prefix and checksum included)
/// to `out`.
pub fn encode(frame: &Frame, out: &mut Vec<u8>) {
    encode_for(VERSION, frame, out);
}

/// A file list's frames stay under what one packed frame carries
/// (`pack`), and so well under the frame cap.
const FILES_CHUNK_BYTES: usize = 128 << 10;

/// Appends `entries` as `Files` frames of at most about 128 KiB each,
/// then `FilesEnd`: a manifest, or a mirror's listing.
pub fn encode_files(entries: &[FileEntry], out: &mut Vec<u8>) {
    let mut chunk = Vec::new();
    let mut bytes = 0;
    for e in entries {
        bytes += entry_len(e);
        chunk.push(e.clone());
        if bytes >= FILES_CHUNK_BYTES {
            let entries = std::mem::take(&mut chunk);
            encode(&Frame::Files { entries }, out);
            bytes = 0;
        }
    }
    if !chunk.is_empty() {
        encode(&Frame::Files { entries: chunk }, out);
    }
    encode(&Frame::FilesEnd, out);
}

/// What `entry` takes on the wire.
fn entry_len(e: &FileEntry) -> usize {
    let meta = e.meta.as_ref().map_or(0, |m| {
        1 + m.owner.map_or(0, |_| 8)
            + 2
            + m.xattrs
                .iter()
                .map(|(n, v)| 2 + n.len() + 4 + v.len())
                .sum::<usize>()
    });
    MIN_ENTRY + e.digest.map_or(0, |_| 16) + meta + e.path.len()
}

/// Appends the encoding of `frame` as a peer of protocol `version` reads
/// it: before `CHECKED_SINCE` frames carried no checksum, so a receiver
/// can tell an older sender, in words it decodes, which version it speaks.
pub fn encode_for(version: u16, frame: &Frame, out: &mut Vec<u8>) {
    encode_with(out, checked(frame, version), |out| {
        encode_fields(frame, out)
    });
}

/// Appends a frame whose type byte and fields `fields` writes, with its
/// length prefix and, where `check`, its checksum.
pub(super) fn encode_with(out: &mut Vec<u8>, check: bool, fields: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    fields(out);
    if check {
        let check = frame_check(&out[start + 4..]);
        out.extend_from_slice(&check.to_le_bytes());
    }
    let len = (out.len() - start - 4) as u32;
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
}

/// The checksum of a frame's type byte and fields. Its length prefix is
/// covered by where the checksum sits: a damaged length moves it.
pub(super) fn frame_check(content: &[u8]) -> u64 {
    crate::digest::frame_checksum(content)
}

/// Whether `frame`, written by a peer of `version`, carries a checksum:
/// a hello or challenge says its own version, every other frame is of
/// this version (the handshake refuses any other).
fn checked(frame: &Frame, version: u16) -> bool {
    match frame {
        Frame::Hello { version, .. } | Frame::Challenge { version, .. } => {
            *version >= CHECKED_SINCE
        }
        _ => version >= CHECKED_SINCE,
    }
}

fn encode_fields(frame: &Frame, out: &mut Vec<u8>) {
    let mut w = Writer(out);
    match frame {
        Frame::Hello {
            version,
            nonce,
            port,
            encrypt,
        } => {
            w.u8(T_HELLO);
            w.bytes(&MAGIC);
            w.u16(*version);
            w.bytes(nonce);
            if *version >= HELLO_PORT_SINCE {
                w.u16(*port);
            }
            if *version >= ENCRYPTION_SINCE {
                w.u8(crate::encryption::code(*encrypt));
            }
        }
        Frame::Challenge {
            version,
            nonce,
            encrypted,
        } => {
            w.u8(T_CHALLENGE);
            w.bytes(&MAGIC);
            w.u16(*version);
            w.bytes(nonce);
            if *version >= ENCRYPTION_SINCE {
                w.u8(u8::from(*encrypted));
            }
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
                Purpose::Relay => w.u8(2),
                Purpose::Mirror => w.u8(3),
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
            codecs,
            sync,
            dry_run,
        } => {
            w.u8(T_OPEN);
            w.bytes(session);
            w.u32(*block_size);
            w.u16(*streams);
            w.u8(verify_code(*verify));
            w.u8(u8::from(*discard));
            w.u8(codecs.bits());
            w.u8(sync_code(*sync));
            w.u8(u8::from(*dry_run));
        }
        Frame::Files { entries } => {
            w.u8(T_FILES);
            w.u32(entries.len() as u32);
            for e in entries {
                w.entry(e);
            }
        }
        Frame::FilesEnd => w.u8(T_FILES_END),
        Frame::MirrorOpen { base } => {
            w.u8(T_MIRROR_OPEN);
            w.str(base);
        }
        Frame::Remove { ids } => {
            w.u8(T_REMOVE);
            w.u32(ids.len() as u32);
            for id in ids {
                w.u32(*id);
            }
        }
        Frame::Stripe(stripe) => {
            w.u8(T_STRIPE);
            w.u64(stripe.group);
            w.u8(match stripe.role {
                StripeRole::Mark => 0,
                StripeRole::Write => 1,
                StripeRole::Publish => 2,
                StripeRole::Unmark => 3,
            });
            w.u32(stripe.pieces.len() as u32);
            for p in &stripe.pieces {
                w.u32(p.file_id);
                w.u64(p.first);
                w.u64(p.end);
            }
        }
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
                PlanOutcome::Present => w.u8(2),
            }
        }
        Frame::PlanRun { first, count } => {
            w.u8(T_PLAN_RUN);
            w.u32(*first);
            w.u32(*count);
        }
        Frame::PlanEnd => w.u8(T_PLAN_END),
        Frame::Block(h) => {
            w.u8(T_BLOCK);
            w.header(h);
        }
        Frame::PackedBlock { header, codec } => w.packed_block(header, *codec),
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
        Frame::FileDone {
            file_id,
            digest,
            identity,
        } => {
            w.u8(T_FILE_DONE);
            w.u32(*file_id);
            w.bytes(&digest.to_le_bytes());
            w.u64(*identity);
        }
        Frame::FileResult {
            file_id,
            ok,
            digest,
            identity,
            message,
        } => {
            w.u8(T_FILE_RESULT);
            w.u32(*file_id);
            w.u8(u8::from(*ok));
            w.bytes(&digest.to_le_bytes());
            w.u64(*identity);
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
        relay => encode_relay(relay, &mut w),
    }
}

/// The relay frames' fields (`relay`).
fn encode_relay(frame: &Frame, w: &mut Writer<'_>) {
    match frame {
        Frame::RelayJob(job) => {
            w.u8(T_RELAY_JOB);
            w.str(&job.to);
            w.str(&job.source);
            w.u32(job.block_size);
            w.u16(job.streams);
            w.u8(verify_code(job.verify));
            w.u64(job.max_rate);
            w.u32(job.retry_ms);
            w.u32(job.refused_ms);
            w.u8(crate::encryption::code(job.encrypt));
            w.u8(crate::compress::mode_code(job.compress));
        }
        Frame::RelayFiles { entries } => {
            w.u8(T_RELAY_FILES);
            w.u32(entries.len() as u32);
            for e in entries {
                w.entry(&e.entry);
                w.u16(e.rel.len().min(MAX_PATH) as u16);
                w.bytes(&e.rel[..e.rel.len().min(MAX_PATH)]);
            }
        }
        Frame::RelayAlive { moved } => {
            w.u8(T_RELAY_ALIVE);
            w.u64(*moved);
        }
        Frame::RelaySums {
            file_id,
            first,
            sums,
        } => {
            w.u8(T_RELAY_SUMS);
            w.u32(*file_id);
            w.u64(*first);
            w.u32(sums.len() as u32);
            for s in sums {
                w.u64(*s);
            }
        }
        Frame::RelayResult {
            file_id,
            ok,
            digest,
            held,
            message,
        } => {
            w.u8(T_RELAY_RESULT);
            w.u32(*file_id);
            w.u8(u8::from(*ok));
            w.bytes(&digest.to_le_bytes());
            w.u64(*held);
            w.str(message);
        }
        Frame::RelayDone { bytes_sent, error } => {
            w.u8(T_RELAY_DONE);
            w.u64(*bytes_sent);
            match error {
                None => w.u8(0),
                Some(e) => {
                    w.u8(1);
                    w.u8(u8::from(e.retryable));
                    w.str(&e.message);
                }
            }
        }
        other => unreachable!("{other:?} is not a relay frame"),
    }
}

fn verify_code(v: Verification) -> u8 {
    match v {
        Verification::None => 0,
        Verification::Checksums => 1,
        Verification::Reread => 2,
    }
}

fn sync_code(level: SyncLevel) -> u8 {
    match level {
        SyncLevel::None => 0,
        SyncLevel::Exists => 1,
        SyncLevel::Size => 2,
        SyncLevel::Mtime => 3,
        SyncLevel::Checksum => 4,
    }
}

/// The fewest bytes a manifest entry takes: id, kind, size, fingerprint,
/// mode, mtime, the digest's flag and the path's length.
const MIN_ENTRY: usize = 4 + 1 + 8 + 8 + 2 + 12 + 1 + 1 + 2;

/// A one-byte flag: 0 or 1, nothing else.
fn flag(code: u8, what: &'static str) -> Result<bool, DecodeError> {
    match code {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(DecodeError::Invalid(what)),
    }
}

fn decode_sync(code: u8) -> Result<SyncLevel, DecodeError> {
    SyncLevel::ALL
        .into_iter()
        .find(|&l| sync_code(l) == code)
        .ok_or(DecodeError::Invalid("sync level"))
}

fn decode_verify(code: u8) -> Result<Verification, DecodeError> {
    match code {
        0 => Ok(Verification::None),
        1 => Ok(Verification::Checksums),
        2 => Ok(Verification::Reread),
        _ => Err(DecodeError::Invalid("verify level")),
    }
}

/// A block size any session may use.
fn check_block_size(block_size: u32) -> Result<u32, DecodeError> {
    if block_size == 0
        || block_size > MAX_BLOCK
        || u64::from(block_size) % crate::tuning::BLOCK_SIZE.step != 0
    {
        return Err(DecodeError::Invalid("block size"));
    }
    Ok(block_size)
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

/// Decodes a frame from its type byte, body and checksum (the length
/// prefix removed), checking the checksum before any field is looked at.
pub fn decode_body(body: &[u8]) -> Result<Frame, DecodeError> {
    if body.is_empty() {
        return Err(DecodeError::Empty);
    }
    let fields = if carries_check(body) {
        checked_fields(body)?
    } else {
        body
    };
    decode_fields(fields)
}

/// The type byte and fields of frame `body`, once its check matches them.
pub(super) fn checked_fields(body: &[u8]) -> Result<&[u8], DecodeError> {
    let damaged = || DecodeError::Damaged(type_name(body.first().copied().unwrap_or_default()));
    // Too short to hold a check: its length prefix is damaged, or it
    // comes from a peer that writes none.
    let split = body
        .len()
        .checked_sub(FRAME_CHECK_LEN)
        .filter(|&n| n > 0)
        .ok_or_else(damaged)?;
    let (fields, check) = body.split_at(split);
    let check = u64::from_le_bytes(check.try_into().expect("split at the check's length"));
    if frame_check(fields) != check {
        return Err(damaged());
    }
    Ok(fields)
}

fn encryption_of(code: u8) -> Result<Encryption, DecodeError> {
    crate::encryption::of_code(code).ok_or(DecodeError::Invalid("encryption offer"))
}

/// Whether a received frame carries a checksum: all do, but a hello or a
/// challenge of a version before `CHECKED_SINCE`, whose version field
/// says so (it stands at the same place in every version).
fn carries_check(body: &[u8]) -> bool {
    match body {
        [T_HELLO | T_CHALLENGE, _, _, _, _, v0, v1, ..] => {
            u16::from_le_bytes([*v0, *v1]) >= CHECKED_SINCE
        }
        _ => true,
    }
}

/// A frame type's name, for saying which frame came damaged.
fn type_name(ty: u8) -> &'static str {
    match ty {
        T_HELLO => "hello",
        T_CHALLENGE => "challenge",
        T_AUTH => "auth",
        T_SERVER_PROOF => "server proof",
        T_OPEN => "open",
        T_FILES => "file list",
        T_FILES_END => "file list end",
        T_MIRROR_OPEN => "mirror open",
        T_REMOVE => "removals",
        T_PLAN => "plan",
        T_PLAN_END => "plan end",
        T_PLAN_RUN => "plan run",
        T_BLOCK => "block header",
        T_PACKED_BLOCK => "packed block header",
        T_ACK => "acknowledgement",
        T_NACK => "negative acknowledgement",
        T_FILE_DONE => "file done",
        T_FILE_RESULT => "file result",
        T_FINISH => "finish",
        T_ERROR => "error",
        T_FILE_ABORT => "file abort",
        T_KEEPALIVE => "keepalive",
        T_PARK => "park",
        T_PARKED => "parked",
        T_STRIPE => "stripe",
        T_RELAY_JOB => "relay job",
        T_RELAY_FILES => "relay file list",
        T_RELAY_ALIVE => "relay alive",
        T_RELAY_SUMS => "relay checksums",
        T_RELAY_RESULT => "relay result",
        T_RELAY_DONE => "relay done",
        T_PACKED => "packed frames",
        _ => "unknown",
    }
}

/// Decodes a frame of a peer before `CHECKED_SINCE`, which carries no
/// checksum: only to tell such a peer's refusal from a damaged frame.
pub fn decode_unchecked(body: &[u8]) -> Result<Frame, DecodeError> {
    decode_fields(body)
}

fn decode_fields(body: &[u8]) -> Result<Frame, DecodeError> {
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
                let encrypt = if (ENCRYPTION_SINCE..=VERSION).contains(&version) {
                    encryption_of(r.u8()?)?
                } else {
                    Encryption::None
                };
                Frame::Hello {
                    version,
                    nonce,
                    port,
                    encrypt,
                }
            } else {
                // Likewise a later version's challenge: its sender is told
                // the versions, not that the frame was malformed.
                let encrypted = match version {
                    v if v > VERSION => {
                        r.0 = &[];
                        false
                    }
                    v if v >= ENCRYPTION_SINCE => match r.u8()? {
                        0 => false,
                        1 => true,
                        _ => return Err(DecodeError::Invalid("encryption answer")),
                    },
                    _ => false,
                };
                Frame::Challenge {
                    version,
                    nonce,
                    encrypted,
                }
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
                2 => Purpose::Relay,
                3 => Purpose::Mirror,
                _ => return Err(DecodeError::Invalid("connection purpose")),
            };
            Frame::Auth { mac, purpose }
        }
        T_SERVER_PROOF => Frame::ServerProof {
            mac: r.array::<MAC_LEN>()?,
        },
        T_OPEN => {
            let session = r.array::<SESSION_ID_LEN>()?;
            let block_size = check_block_size(r.u32()?)?;
            let streams = r.u16()?;
            if streams == 0 {
                return Err(DecodeError::Invalid("stream count"));
            }
            let verify = decode_verify(r.u8()?)?;
            let discard = flag(r.u8()?, "discard flag")?;
            let codecs = Codecs::of_bits(r.u8()?).ok_or(DecodeError::Invalid("codecs"))?;
            let sync = decode_sync(r.u8()?)?;
            let dry_run = flag(r.u8()?, "dry-run flag")?;
            Frame::Open {
                session,
                block_size,
                streams,
                verify,
                discard,
                codecs,
                sync,
                dry_run,
            }
        }
        T_FILES => {
            let count = r.u32()? as usize;
            // Each entry takes at least MIN_ENTRY bytes, so the count cannot
            // make us reserve more than the frame itself justifies.
            let mut entries = Vec::with_capacity(count.min(r.0.len() / MIN_ENTRY));
            for _ in 0..count {
                entries.push(r.entry()?);
            }
            Frame::Files { entries }
        }
        T_FILES_END => Frame::FilesEnd,
        T_MIRROR_OPEN => Frame::MirrorOpen {
            base: r.str(MAX_PATH)?,
        },
        T_REMOVE => {
            let count = r.u32()? as usize;
            if count > MAX_ENTRIES {
                return Err(DecodeError::Invalid("removal count"));
            }
            let mut ids = Vec::with_capacity(count.min(r.0.len() / 4));
            for _ in 0..count {
                ids.push(r.u32()?);
            }
            Frame::Remove { ids }
        }
        T_STRIPE => {
            let group = r.u64()?;
            let role = match r.u8()? {
                0 => StripeRole::Mark,
                1 => StripeRole::Write,
                2 => StripeRole::Publish,
                3 => StripeRole::Unmark,
                _ => return Err(DecodeError::Invalid("stripe role")),
            };
            let count = r.u32()? as usize;
            if count > MAX_PIECES {
                return Err(DecodeError::Invalid("piece count"));
            }
            // Each piece takes 20 bytes: the count cannot reserve more
            // than the frame justifies.
            let mut pieces = Vec::with_capacity(count.min(r.0.len() / 20));
            for _ in 0..count {
                let (file_id, first, end) = (r.u32()?, r.u64()?, r.u64()?);
                if first > end {
                    return Err(DecodeError::Invalid("piece range"));
                }
                pieces.push(StripePiece {
                    file_id,
                    first,
                    end,
                });
            }
            Frame::Stripe(Stripe {
                group,
                role,
                pieces,
            })
        }
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
                2 => PlanOutcome::Present,
                _ => return Err(DecodeError::Invalid("plan outcome")),
            };
            Frame::Plan { file_id, outcome }
        }
        T_PLAN_END => Frame::PlanEnd,
        T_PLAN_RUN => {
            let first = r.u32()?;
            let count = r.u32()?;
            if count == 0 || first.checked_add(count - 1).is_none() {
                return Err(DecodeError::Invalid("plan run"));
            }
            Frame::PlanRun { first, count }
        }
        T_BLOCK => Frame::Block(r.header()?),
        T_PACKED_BLOCK => r.packed_block()?,
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
            identity: r.u64()?,
        },
        T_FILE_RESULT => Frame::FileResult {
            file_id: r.u32()?,
            ok: r.bool()?,
            digest: u128::from_le_bytes(r.array::<16>()?),
            identity: r.u64()?,
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
        T_RELAY_JOB..=T_RELAY_DONE => decode_relay(ty, &mut r)?,
        other => return Err(DecodeError::UnknownType(other)),
    };
    if !r.0.is_empty() {
        return Err(DecodeError::Trailing(r.0.len()));
    }
    Ok(frame)
}

/// The relay frames (`relay`), from after their type byte.
fn decode_relay(ty: u8, r: &mut Reader<'_>) -> Result<Frame, DecodeError> {
    Ok(match ty {
        T_RELAY_JOB => {
            let to = r.str(MAX_ADDR)?;
            let source = r.str(MAX_PATH)?;
            let block_size = check_block_size(r.u32()?)?;
            let streams = r.u16()?;
            if streams == 0 {
                return Err(DecodeError::Invalid("stream count"));
            }
            Frame::RelayJob(RelayJob {
                to,
                source,
                block_size,
                streams,
                verify: decode_verify(r.u8()?)?,
                max_rate: r.u64()?,
                retry_ms: r.u32()?,
                refused_ms: r.u32()?,
                encrypt: encryption_of(r.u8()?)?,
                compress: crate::compress::mode_of_code(r.u8()?)
                    .ok_or(DecodeError::Invalid("compression mode"))?,
            })
        }
        T_RELAY_FILES => {
            let count = r.u32()? as usize;
            // Each entry takes at least its manifest entry and a length:
            // the count cannot reserve more than the frame justifies.
            let mut entries = Vec::with_capacity(count.min(r.0.len() / (MIN_ENTRY + 2)));
            for _ in 0..count {
                let entry = r.entry()?;
                let n = r.u16()? as usize;
                if n > MAX_PATH {
                    return Err(DecodeError::Invalid("path length"));
                }
                entries.push(RelayEntry {
                    entry,
                    rel: r.take(n)?.to_vec(),
                });
            }
            Frame::RelayFiles { entries }
        }
        T_RELAY_ALIVE => Frame::RelayAlive { moved: r.u64()? },
        T_RELAY_SUMS => {
            let (file_id, first) = (r.u32()?, r.u64()?);
            let count = r.u32()? as usize;
            if count > MAX_RELAY_SUMS {
                return Err(DecodeError::Invalid("checksum count"));
            }
            let mut sums = Vec::with_capacity(count.min(r.0.len() / 8));
            for _ in 0..count {
                sums.push(r.u64()?);
            }
            Frame::RelaySums {
                file_id,
                first,
                sums,
            }
        }
        T_RELAY_RESULT => Frame::RelayResult {
            file_id: r.u32()?,
            ok: r.bool()?,
            digest: u128::from_le_bytes(r.array::<16>()?),
            held: r.u64()?,
            message: r.str(MAX_MESSAGE)?,
        },
        T_RELAY_DONE => {
            let bytes_sent = r.u64()?;
            let error = match r.u8()? {
                0 => None,
                1 => Some(RelayError {
                    retryable: r.bool()?,
                    message: r.str(MAX_MESSAGE)?,
                }),
                _ => return Err(DecodeError::Invalid("relay outcome")),
            };
            Frame::RelayDone { bytes_sent, error }
        }
        other => return Err(DecodeError::UnknownType(other)),
    })
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
    fn header(&mut self, h: &BlockHeader) {
        self.u32(h.file_id);
        self.u64(h.block);
        self.u64(h.offset);
        self.u32(h.len);
    }

    fn packed_block(&mut self, header: &BlockHeader, codec: Codec) {
        self.u8(T_PACKED_BLOCK);
        self.header(header);
        self.u8(codec.code());
    }

    fn entry(&mut self, e: &FileEntry) {
        self.u32(e.file_id);
        self.u8(match e.kind {
            EntryKind::File => 0,
            EntryKind::Dir => 1,
        });
        self.u64(e.size);
        self.u64(e.fingerprint);
        self.u16(e.mode);
        self.u64(e.mtime.0 as u64);
        self.u32(e.mtime.1);
        match e.digest {
            None => self.u8(0),
            Some(d) => {
                self.u8(1);
                self.bytes(&d);
            }
        }
        match &e.meta {
            None => self.u8(0),
            Some(m) => {
                self.u8(1);
                self.meta(m);
            }
        }
        self.str(&e.path);
    }
    fn meta(&mut self, m: &Meta) {
        match m.owner {
            None => self.u8(0),
            Some((uid, gid)) => {
                self.u8(1);
                self.u32(uid);
                self.u32(gid);
            }
        }
        self.u16(m.xattrs.len() as u16);
        for (name, value) in &m.xattrs {
            self.str(name);
            self.u32(value.len() as u32);
            self.bytes(value);
        }
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
    fn header(&mut self) -> Result<BlockHeader, DecodeError> {
        let h = BlockHeader {
            file_id: self.u32()?,
            block: self.u64()?,
            offset: self.u64()?,
            len: self.u32()?,
        };
        if h.len == 0 || h.len > MAX_BLOCK {
            return Err(DecodeError::Invalid("block length"));
        }
        Ok(h)
    }

    fn packed_block(&mut self) -> Result<Frame, DecodeError> {
        let header = self.header()?;
        let codec = Codec::of_code(self.u8()?).ok_or(DecodeError::Invalid("codec"))?;
        Ok(Frame::PackedBlock { header, codec })
    }

    fn entry(&mut self) -> Result<FileEntry, DecodeError> {
        let file_id = self.u32()?;
        let kind = match self.u8()? {
            0 => EntryKind::File,
            1 => EntryKind::Dir,
            _ => return Err(DecodeError::Invalid("entry kind")),
        };
        let size = self.u64()?;
        let fingerprint = self.u64()?;
        let mode = self.u16()?;
        if mode > 0o777 {
            return Err(DecodeError::Invalid("permission bits"));
        }
        let mtime = (self.u64()? as i64, self.u32()?);
        if mtime.1 >= 1_000_000_000 {
            return Err(DecodeError::Invalid("modification time"));
        }
        let digest = match self.u8()? {
            0 => None,
            1 => Some(self.array()?),
            _ => return Err(DecodeError::Invalid("digest flag")),
        };
        let meta = match self.u8()? {
            0 => None,
            1 => Some(Box::new(self.meta()?)),
            _ => return Err(DecodeError::Invalid("metadata flag")),
        };
        Ok(FileEntry {
            file_id,
            kind,
            size,
            fingerprint,
            mode,
            mtime,
            digest,
            meta,
            path: self.str(MAX_PATH)?,
        })
    }
    /// An entry's owner and attributes, within their bounds.
    fn meta(&mut self) -> Result<Meta, DecodeError> {
        let owner = match self.u8()? {
            0 => None,
            1 => Some((self.u32()?, self.u32()?)),
            _ => return Err(DecodeError::Invalid("owner flag")),
        };
        let count = self.u16()? as usize;
        if count > MAX_XATTRS {
            return Err(DecodeError::Invalid("attribute count"));
        }
        let mut xattrs = Vec::with_capacity(count);
        let mut bytes = 0usize;
        for _ in 0..count {
            let name = self.str(MAX_XATTR_NAME)?;
            let len = self.u32()? as usize;
            bytes += name.len() + len;
            if name.is_empty() || name.contains('\0') || bytes > MAX_XATTR_BYTES {
                return Err(DecodeError::Invalid("extended attribute"));
            }
            xattrs.push((name, self.take(len)?.to_vec()));
        }
        Ok(Meta { owner, xattrs })
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

    /// A manifest of one empty file at `path`, modified at `mtime`.
    fn one_file(path: String, mtime: (i64, u32)) -> Frame {
        Frame::Files {
            entries: vec![FileEntry {
                file_id: 1,
                kind: EntryKind::File,
                size: 0,
                fingerprint: 0,
                mode: 0o644,
                mtime,
                digest: None,
                meta: None,
                path,
            }],
        }
    }

    #[test]
    fn a_modification_time_past_a_second_of_nanoseconds_is_refused() {
        let entry = |nanos| one_file("a".into(), (-1, nanos));
        let mut body = Vec::new();
        encode_fields(&entry(999_999_999), &mut body);
        assert_eq!(decode_fields(&body), Ok(entry(999_999_999)));
        body.clear();
        encode_fields(&entry(1_000_000_000), &mut body);
        assert_eq!(
            decode_fields(&body),
            Err(DecodeError::Invalid("modification time"))
        );
    }

    #[test]
    fn a_manifest_path_over_max_path_is_refused_not_truncated() {
        // A hostile peer can write any length: the receiver must refuse a
        // path one byte over the protocol's limit, and take one at it.
        let at_limit = one_file("a".repeat(MAX_PATH), (0, 0));
        let mut body = Vec::new();
        encode_fields(&at_limit, &mut body);
        assert!(decode_fields(&body).is_ok());
        // The path's length is the u16 before its bytes, at the end.
        let len_at = body.len() - MAX_PATH - 2;
        body[len_at..len_at + 2].copy_from_slice(&((MAX_PATH + 1) as u16).to_le_bytes());
        body.push(b'a');
        assert!(matches!(
            decode_fields(&body),
            Err(DecodeError::Invalid("string length"))
        ));
    }

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
            (any::<u16>(), any::<[u8; 32]>(), any::<u16>(), 0u8..3).prop_map(
                |(version, nonce, port, encrypt)| {
                    Frame::Hello {
                        version,
                        nonce,
                        // An older hello has no port to carry, and no
                        // offer; a newer one's offer is not read.
                        port: if version >= HELLO_PORT_SINCE { port } else { 0 },
                        encrypt: if (ENCRYPTION_SINCE..=VERSION).contains(&version) {
                            encryption_of(encrypt).unwrap()
                        } else {
                            Encryption::None
                        },
                    }
                }
            ),
            (any::<u16>(), any::<[u8; 32]>(), any::<bool>()).prop_map(
                |(version, nonce, encrypted)| Frame::Challenge {
                    version,
                    nonce,
                    encrypted: encrypted && (ENCRYPTION_SINCE..=VERSION).contains(&version),
                }
            ),
            (any::<[u8; 32]>(), any::<Option<([u8; 16], u16)>>()).prop_map(|(mac, p)| {
                Frame::Auth {
                    mac,
                    purpose: match p {
                        None => Purpose::Control,
                        Some((session, 0)) if session[0] == 0 => Purpose::Relay,
                        Some((session, 1)) if session[0] == 0 => Purpose::Mirror,
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
                any::<bool>(),
                0u8..4,
                0u8..5,
                any::<bool>(),
            )
                .prop_map(|(session, b, streams, v, discard, c, l, dry_run)| {
                    Frame::Open {
                        session,
                        block_size: b * 4096,
                        streams,
                        verify: [
                            Verification::None,
                            Verification::Checksums,
                            Verification::Reread,
                        ][v as usize],
                        discard,
                        codecs: Codecs::of_bits(c).unwrap(),
                        sync: decode_sync(l).unwrap(),
                        dry_run,
                    }
                }),
            proptest::collection::vec(arb_entry(), 0..20)
                .prop_map(|entries| Frame::Files { entries }),
            Just(Frame::FilesEnd),
            arb_str(300).prop_map(|base| Frame::MirrorOpen { base }),
            proptest::collection::vec(any::<u32>(), 0..50).prop_map(|ids| Frame::Remove { ids }),
            (
                any::<u64>(),
                0u8..4,
                proptest::collection::vec((any::<u32>(), any::<u32>(), 0u64..1000), 0..20)
            )
                .prop_map(|(group, role, pieces)| Frame::Stripe(Stripe {
                    group,
                    role: [
                        StripeRole::Mark,
                        StripeRole::Write,
                        StripeRole::Publish,
                        StripeRole::Unmark
                    ][role as usize],
                    pieces: pieces
                        .into_iter()
                        .map(|(file_id, first, n)| StripePiece {
                            file_id,
                            first: u64::from(first),
                            end: u64::from(first) + n,
                        })
                        .collect(),
                })),
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
            any::<u32>().prop_map(|file_id| Frame::Plan {
                file_id,
                outcome: PlanOutcome::Present
            }),
            Just(Frame::PlanEnd),
            (0..u32::MAX / 2, 1..u32::MAX / 2)
                .prop_map(|(first, count)| Frame::PlanRun { first, count }),
            (any::<u32>(), any::<u64>(), any::<u64>(), 1..=MAX_BLOCK).prop_map(
                |(file_id, block, offset, len)| Frame::Block(BlockHeader {
                    file_id,
                    block,
                    offset,
                    len,
                })
            ),
            (
                any::<u32>(),
                any::<u64>(),
                any::<u64>(),
                1..=MAX_BLOCK,
                any::<bool>()
            )
                .prop_map(|(file_id, block, offset, len, zstd)| Frame::PackedBlock {
                    header: BlockHeader {
                        file_id,
                        block,
                        offset,
                        len,
                    },
                    codec: if zstd { Codec::Zstd } else { Codec::Lz4 },
                }),
            (any::<u32>(), any::<u64>()).prop_map(|(file_id, block)| Frame::Ack { file_id, block }),
            (any::<u32>(), any::<u64>())
                .prop_map(|(file_id, block)| Frame::Nack { file_id, block }),
            (any::<u32>(), any::<u128>(), any::<u64>()).prop_map(|(file_id, digest, identity)| {
                Frame::FileDone {
                    file_id,
                    digest,
                    identity,
                }
            }),
            (
                any::<u32>(),
                any::<bool>(),
                any::<u128>(),
                any::<u64>(),
                arb_str(300)
            )
                .prop_map(|(file_id, ok, digest, identity, message)| {
                    Frame::FileResult {
                        file_id,
                        ok,
                        digest,
                        identity,
                        message,
                    }
                }),
            (any::<u32>(), arb_str(300))
                .prop_map(|(file_id, message)| Frame::FileAbort { file_id, message }),
            Just(Frame::Keepalive),
            Just(Frame::Finish),
            Just(Frame::Park),
            Just(Frame::Parked),
            (any::<bool>(), arb_str(300))
                .prop_map(|(retryable, message)| Frame::Error { retryable, message }),
            arb_relay_frame(),
        ]
    }

    fn arb_entry() -> impl Strategy<Value = FileEntry> {
        (
            any::<u32>(),
            any::<bool>(),
            any::<u64>(),
            any::<u64>(),
            0u16..=0o777,
            (any::<i64>(), 0u32..1_000_000_000),
            proptest::option::of(any::<[u8; 16]>()),
            proptest::option::of(arb_meta()),
            arb_str(200),
        )
            .prop_map(
                |(file_id, dir, size, fingerprint, mode, mtime, digest, meta, path)| FileEntry {
                    file_id,
                    kind: if dir { EntryKind::Dir } else { EntryKind::File },
                    size,
                    fingerprint,
                    mode,
                    mtime,
                    digest,
                    meta: meta.map(Box::new),
                    path,
                },
            )
    }

    fn arb_meta() -> impl Strategy<Value = Meta> {
        (
            proptest::option::of(any::<(u32, u32)>()),
            proptest::collection::vec(
                (
                    "user\\.[a-z]{1,20}",
                    proptest::collection::vec(any::<u8>(), 0..40),
                ),
                0..4,
            ),
        )
            .prop_map(|(owner, xattrs)| Meta { owner, xattrs })
    }

    /// Any relay frame (`relay`).
    fn arb_relay_frame() -> impl Strategy<Value = Frame> {
        prop_oneof![
            (
                arb_str(MAX_ADDR),
                arb_str(300),
                1u32..=(MAX_BLOCK / 4096),
                1u16..,
                0u8..3,
                any::<(u64, u32, u32)>(),
                (0u8..3, 0u8..4)
            )
                .prop_map(
                    |(to, source, b, streams, v, (max_rate, retry_ms, refused_ms), (e, c))| {
                        Frame::RelayJob(RelayJob {
                            to,
                            source,
                            block_size: b * 4096,
                            streams,
                            verify: decode_verify(v).unwrap(),
                            max_rate,
                            retry_ms,
                            refused_ms,
                            encrypt: encryption_of(e).unwrap(),
                            compress: crate::compress::mode_of_code(c).unwrap(),
                        })
                    }
                ),
            proptest::collection::vec(
                (arb_entry(), proptest::collection::vec(any::<u8>(), 0..40)),
                0..10
            )
            .prop_map(|v| Frame::RelayFiles {
                entries: v
                    .into_iter()
                    .map(|(entry, rel)| RelayEntry { entry, rel })
                    .collect()
            }),
            any::<u64>().prop_map(|moved| Frame::RelayAlive { moved }),
            (
                any::<u32>(),
                any::<u64>(),
                proptest::collection::vec(any::<u64>(), 0..50)
            )
                .prop_map(|(file_id, first, sums)| Frame::RelaySums {
                    file_id,
                    first,
                    sums
                }),
            (
                any::<u32>(),
                any::<bool>(),
                any::<u128>(),
                any::<u64>(),
                arb_str(300)
            )
                .prop_map(|(file_id, ok, digest, held, message)| Frame::RelayResult {
                    file_id,
                    ok,
                    digest,
                    held,
                    message
                }),
            (any::<u64>(), any::<Option<(bool, String)>>()).prop_map(|(bytes_sent, e)| {
                Frame::RelayDone {
                    bytes_sent,
                    error: e.map(|(retryable, mut message)| {
                        while message.len() > 300 {
                            message.pop();
                        }
                        RelayError { retryable, message }
                    }),
                }
            }),
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

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        // The file list, the plan, acknowledgements and block headers were
        // acted on as they came: one flipped bit in a path published the
        // file under another name, one in a resume bitmap hung the session.
        #[test]
        fn every_flipped_bit_is_refused(frame in arb_frame()) {
            let mut buf = Vec::new();
            encode(&frame, &mut buf);
            let body = buf[4..].to_vec();
            for bit in 0..body.len() * 8 {
                let mut damaged = body.clone();
                damaged[bit / 8] ^= 1 << (bit % 8);
                prop_assert!(
                    decode_body(&damaged).is_err(),
                    "bit {} of {:?} flipped went through", bit, frame
                );
            }
            // A damaged length prefix: shorter moves where the check is
            // read from, longer waits for bytes that belong to the next
            // frame (and then fails the same way).
            for cut in 1..body.len() {
                prop_assert!(decode_body(&body[..cut]).is_err());
            }
        }
    }

    /// `fields` (type byte first) with this version's checksum after them.
    fn sealed(fields: &[u8]) -> Vec<u8> {
        let mut body = fields.to_vec();
        body.extend_from_slice(&frame_check(fields).to_le_bytes());
        body
    }

    #[test]
    fn a_damaged_frame_says_which_frame_it_was() {
        let mut buf = Vec::new();
        encode(
            &Frame::Ack {
                file_id: 1,
                block: 2,
            },
            &mut buf,
        );
        buf[5] ^= 0xff;
        let e = decode(&buf).unwrap_err();
        assert_eq!(e, DecodeError::Damaged("acknowledgement"));
        assert!(!e.is_foreign());
        assert_eq!(
            e.to_string(),
            "a damaged acknowledgement frame (its checksum does not match)"
        );
    }

    #[test]
    fn oversized_length_refused_before_allocation() {
        let buf = u32::MAX.to_le_bytes();
        assert!(matches!(decode(&buf), Err(DecodeError::TooLarge { .. })));
    }

    #[test]
    fn bad_magic_and_unknown_type() {
        let mut fields = vec![T_HELLO];
        fields.extend_from_slice(b"XRRT");
        fields.extend_from_slice(&VERSION.to_le_bytes());
        fields.extend_from_slice(&[0; NONCE_LEN + 2]);
        let e = decode_body(&sealed(&fields)).unwrap_err();
        assert_eq!(e, DecodeError::BadMagic);
        assert!(e.is_foreign());
        assert_eq!(
            decode_body(&sealed(&[200])),
            Err(DecodeError::UnknownType(200))
        );
        assert_eq!(decode_body(&[]), Err(DecodeError::Empty));
    }

    #[test]
    fn a_later_versions_longer_hello_still_decodes() {
        let mut fields = vec![T_HELLO];
        fields.extend_from_slice(&MAGIC);
        fields.extend_from_slice(&(VERSION + 1).to_le_bytes());
        fields.extend_from_slice(&[3; NONCE_LEN]);
        fields.extend_from_slice(&7470u16.to_le_bytes());
        fields.extend_from_slice(&[9, 9, 9]);
        assert!(matches!(
            decode_body(&sealed(&fields)),
            Ok(Frame::Hello { version, port: 7470, .. }) if version == VERSION + 1
        ));
        // This version's own hello gets no such leeway.
        let mut own = vec![T_HELLO];
        own.extend_from_slice(&MAGIC);
        own.extend_from_slice(&VERSION.to_le_bytes());
        own.extend_from_slice(&[3; NONCE_LEN]);
        own.extend_from_slice(&7470u16.to_le_bytes());
        own.push(9);
        assert_eq!(
            decode_body(&sealed(&own)),
            Err(DecodeError::Invalid("encryption offer"))
        );
        own.pop();
        own.extend_from_slice(&[2, 9]);
        assert_eq!(decode_body(&sealed(&own)), Err(DecodeError::Trailing(1)));
    }

    #[test]
    fn an_older_versions_hello_carries_no_checksum() {
        let mut buf = Vec::new();
        let hello = Frame::Hello {
            version: 7,
            nonce: [5; NONCE_LEN],
            port: 7470,
            encrypt: Encryption::None,
        };
        encode(&hello, &mut buf);
        assert_eq!(buf.len(), 4 + 1 + 4 + 2 + NONCE_LEN + 2);
        assert_eq!(decode(&buf).unwrap().unwrap().0, hello);
        // Every other frame is this version's, and needs its checksum.
        let mut error = Vec::new();
        encode_for(
            7,
            &Frame::Error {
                retryable: false,
                message: "old".into(),
            },
            &mut error,
        );
        assert_eq!(decode_body(&error[4..]), Err(DecodeError::Damaged("error")));
        assert!(decode_unchecked(&error[4..]).is_ok());
    }

    #[test]
    fn trailing_bytes_refused() {
        assert_eq!(
            decode_body(&sealed(&[T_FINISH, 0])),
            Err(DecodeError::Trailing(1))
        );
    }

    #[test]
    fn the_open_flags_codecs_and_level_are_refused_out_of_range() {
        let mut buf = Vec::new();
        encode(
            &Frame::Open {
                session: [0; 16],
                block_size: 1 << 20,
                streams: 1,
                verify: Verification::Checksums,
                discard: true,
                codecs: Codecs::NONE,
                sync: SyncLevel::None,
                dry_run: false,
            },
            &mut buf,
        );
        // The last four bytes: the discard flag, the codecs, the sync
        // level, the dry-run flag.
        let fields = buf[4..buf.len() - FRAME_CHECK_LEN].to_vec();
        let at = fields.len() - 4;
        for (offset, value, what) in [
            (0, 2, "discard flag"),
            (1, 4, "codecs"),
            (2, 5, "sync level"),
            (3, 2, "dry-run flag"),
        ] {
            let mut bad = fields.clone();
            bad[at + offset] = value;
            assert_eq!(
                decode_body(&sealed(&bad)),
                Err(DecodeError::Invalid(what)),
                "{what}"
            );
        }
    }

    /// A file entry with a one-byte path and neither digest nor metadata.
    fn small_entry() -> FileEntry {
        FileEntry {
            file_id: 1,
            kind: EntryKind::File,
            size: 5,
            fingerprint: 2,
            mode: 0o644,
            mtime: (3, 4),
            digest: None,
            meta: None,
            path: "a".into(),
        }
    }

    #[test]
    fn an_entrys_digest_flag_is_0_or_1() {
        let entry = small_entry();
        let mut buf = Vec::new();
        encode(
            &Frame::Files {
                entries: vec![entry],
            },
            &mut buf,
        );
        let mut fields = buf[4..buf.len() - FRAME_CHECK_LEN].to_vec();
        // The digest's flag sits before the metadata's, the path's length
        // and its one byte.
        let at = fields.len() - 5;
        assert_eq!(fields[at], 0);
        let mut bad_meta = fields.clone();
        bad_meta[at + 1] = 2;
        assert_eq!(
            decode_body(&sealed(&bad_meta)),
            Err(DecodeError::Invalid("metadata flag"))
        );
        assert_eq!(
            fields.len() - 5,
            MIN_ENTRY + 1,
            "the entry, after the type and count"
        );
        fields[at] = 2;
        assert_eq!(
            decode_body(&sealed(&fields)),
            Err(DecodeError::Invalid("digest flag"))
        );
    }

    // An entry's attributes are bounded in count and bytes, and named.
    #[test]
    fn an_entrys_attributes_are_bounded() {
        let with = |xattrs: Vec<(String, Vec<u8>)>| {
            let entry = FileEntry {
                meta: Some(Box::new(Meta {
                    owner: Some((7, 8)),
                    xattrs,
                })),
                ..small_entry()
            };
            let mut buf = Vec::new();
            encode(
                &Frame::Files {
                    entries: vec![entry],
                },
                &mut buf,
            );
            decode_body(&buf[4..])
        };
        let one = |n: usize| ("user.a".to_string(), vec![0u8; n]);
        assert!(with(vec![one(10); MAX_XATTRS]).is_ok());
        assert_eq!(
            with(vec![one(1); MAX_XATTRS + 1]),
            Err(DecodeError::Invalid("attribute count"))
        );
        assert!(with(vec![one(MAX_XATTR_BYTES - 6)]).is_ok());
        assert_eq!(
            with(vec![one(MAX_XATTR_BYTES - 5)]),
            Err(DecodeError::Invalid("extended attribute"))
        );
        assert_eq!(
            with(vec![(String::new(), vec![1])]),
            Err(DecodeError::Invalid("extended attribute"))
        );
    }

    // A packed block names a codec this version knows.
    #[test]
    fn a_packed_block_names_a_known_codec() {
        let header = BlockHeader {
            file_id: 1,
            block: 0,
            offset: 0,
            len: 4096,
        };
        let fields = |codec: u8| {
            let mut buf = Vec::new();
            encode(
                &Frame::PackedBlock {
                    header,
                    codec: Codec::Lz4,
                },
                &mut buf,
            );
            let mut f = buf[4..buf.len() - FRAME_CHECK_LEN].to_vec();
            *f.last_mut().unwrap() = codec;
            sealed(&f)
        };
        assert_eq!(
            decode_body(&fields(2)),
            Ok(Frame::PackedBlock {
                header,
                codec: Codec::Zstd
            })
        );
        for codec in [0, 3, 255] {
            assert_eq!(
                decode_body(&fields(codec)),
                Err(DecodeError::Invalid("codec"))
            );
        }
    }

    #[test]
    fn huge_entry_count_does_not_preallocate() {
        let mut fields = vec![T_FILES];
        fields.extend_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            decode_body(&sealed(&fields)),
            Err(DecodeError::UnexpectedEnd)
        );
    }
}
