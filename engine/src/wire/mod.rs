//! The wire protocol: versioned, length-delimited frames.
//!
//! Every frame is `[u32 length][u8 type][body][u64 check]` in
//! little-endian, where `length` counts the type byte, the body and the
//! check, and `check` is the XXH3-64 of the type byte and the body (seeded
//! apart from the block checksums). TCP's own checksum lets about one
//! damaged segment in 16 million to 10 billion through (Stone and
//! Partridge, 2000): so that none of those becomes an instruction (a file
//! name, a resume plan, an acknowledgement), a frame whose check fails is
//! a broken connection, reconnected and resumed. A damaged length prefix
//! moves where the check is read from, so it fails too. Hellos and
//! challenges of versions before `CHECKED_SINCE` carry no check, so that
//! each side can still tell an older peer which version it speaks. A `Block` frame is followed
//! by `len` raw payload bytes that are not part of the frame, so the payload
//! goes from the pool buffer to the socket without a copy, and then by the
//! payload's xxh3-64 checksum as 8 little-endian bytes (0 when verification
//! is off). The checksum trails the payload so that the sender can hash
//! each piece just before it sends it, reading the payload from memory once. Decoding checks
//! the remaining length before every read and the caller checks the frame
//! cap before allocating, so a peer cannot make us panic or allocate much.
//!
//! `codec` is the encoding, with no I/O; `pack` packs runs of small
//! control frames into compressed ones; `stream` reads and writes frames
//! on sockets for the shells.

mod codec;
mod pack;
#[cfg(feature = "shells")]
mod stream;

#[cfg(test)]
pub(crate) use codec::tests::arb_frame;
pub use codec::{
    DecodeError, decode, decode_body, decode_unchecked, encode, encode_files, encode_for,
};
pub use pack::{MAX_PACKED_FRAME, MAX_PACKED_RAW, pack};
#[cfg(feature = "shells")]
pub use stream::{
    FrameReader, read_frame, read_frame_capped, write_all_vectored, write_frame,
    write_frame_with_payload,
};

use std::time::Duration;

/// Identifies the protocol on the first frame.
pub const MAGIC: [u8; 4] = *b"WRRT";
/// The protocol version this build speaks (2: the one-round-trip handshake,
/// block checksums after the payload; 3: `FileDone` once every block has
/// gone out, held by the receiver until the file is written; 4: keepalives
/// on the control connection, `FileAbort`, permission bits in the manifest;
/// 5: `Open` says whether the session is memory to memory; 6: `Park` and
/// `Parked`, which an older receiver would take for garbage; 7: `Hello`
/// names the port it was meant for, so that a parked connection can be
/// handed to another receiver of the same process; 8: a checksum on every
/// frame, and a file's identity in `FileDone` and `FileResult`; 9:
/// `Stripe`, for a transfer over several pairs; 10: a `Stripe` session's
/// plan may hold blocks of its own pieces, from the receivers' per-chunk
/// checkpoints, which the sender reads to checksum, where a 9 sender
/// took every held block for another pair's; 11: relay jobs, by which
/// a transfer's lead sender has another sending host run a session;
/// 12: packed runs of control frames, `pack`, and `PlanRun`; 13: the
/// hello offers encryption and the challenge answers, `ENCRYPTION_SINCE`;
/// 14: `Open` names the codecs its blocks may come packed in, and
/// `PackedBlock`; 15: a packed piece's prefix carries a check of its own,
/// so a damaged one is refused at once, never read as another length;
/// 16: `Open.sync`, `FileEntry.mtime` and `PlanOutcome::Present`; 17:
/// `Open.dry_run`, a session that plans and writes nothing; 18:
/// `FileEntry.digest`, for `SyncLevel::Checksum`; 19: `Purpose::Mirror`,
/// `MirrorOpen` and `Remove`, a mirror's deletes; 20: `FileEntry.meta`,
/// owners and extended attributes).
pub const VERSION: u16 = 20;
/// The first version whose `Hello` carries an encryption offer and whose
/// `Challenge` says whether TLS follows.
pub const ENCRYPTION_SINCE: u16 = 13;
/// The first version whose frames carry a checksum (`FRAME_CHECK_LEN`
/// bytes after their fields).
pub const CHECKED_SINCE: u16 = 8;
/// Length of a frame's checksum.
pub const FRAME_CHECK_LEN: usize = 8;
/// The first version whose `Hello` carries a port: an older one still
/// decodes, so that its sender hears which version this receiver speaks.
pub const HELLO_PORT_SINCE: u16 = 7;
/// Largest control frame (manifest chunk, plan bitmap) we accept, once
/// the peer has authenticated.
pub const MAX_FRAME: usize = (4 << 20) + 4096;
/// Largest frame an unauthenticated peer may send: a hello or an auth
/// (under 60 bytes). Nothing is allocated for more before the peer proved
/// it holds the token.
pub const MAX_PREAUTH_FRAME: usize = 128;
/// Largest frame of every other kind: handshake replies, block headers,
/// acknowledgements, results and errors (a message of at most
/// `MAX_MESSAGE` bytes plus its fields).
pub const MAX_SMALL_FRAME: usize = MAX_MESSAGE + 64;
/// Each side writes on the control connection at least this often (a
/// `Keepalive` when it has nothing else to say), so that the other side
/// can tell a silent peer from a vanished one.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// A peer silent this long on the control connection (no frame, not even
/// a keepalive) is presumed gone, by default: six keepalive intervals.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a receiver keeps a parked data connection waiting for its
/// next handshake; a sender reuses one for a little less, from the moment
/// the receiver's `Parked` arrived, so that it does not pick one the
/// receiver is about to close.
pub const PARK_IDLE: Duration = Duration::from_secs(30);
/// Largest block payload any peer may announce.
pub const MAX_BLOCK: u32 = crate::tuning::BLOCK_SIZE.max as u32;
const _: () = assert!(crate::tuning::BLOCK_SIZE.max <= u32::MAX as u64);
/// Longest destination path, in bytes.
pub const MAX_PATH: usize = 4096;
/// Longest error or result message, in bytes.
pub const MAX_MESSAGE: usize = 4096;
/// Most manifest entries one session may carry.
pub const MAX_ENTRIES: usize = 1 << 20;
/// Most bytes of destination paths one session's manifest may carry: the
/// receiver holds every path for the whole session.
pub const MAX_MANIFEST_BYTES: usize = 64 << 20;
/// Most pieces one `Stripe` frame may carry: one per manifest entry.
pub const MAX_PIECES: usize = MAX_ENTRIES;
/// Most blocks one session may track: the receiver holds a checksum and
/// two bits per block of every file it accepts (about 540 MiB at this cap).
pub const MAX_BLOCKS_PER_SESSION: u64 = 1 << 26;
/// Most blocks a single file may have (the plan bitmap must fit a frame).
pub const MAX_BLOCKS_PER_FILE: u64 = 1 << 24;
/// Length of handshake nonces.
pub const NONCE_LEN: usize = 32;
/// Length of an HMAC-SHA256 tag.
pub const MAC_LEN: usize = 32;
/// Length of a session id.
pub const SESSION_ID_LEN: usize = 16;

/// A session identifier chosen by the sender.
pub type SessionId = [u8; SESSION_ID_LEN];

/// What an authenticated connection will be used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// The session's control connection (manifest, plan, results).
    Control,
    /// A data stream of an open session.
    Join {
        /// The session to join.
        session: SessionId,
        /// This stream's index within the session.
        stream: u16,
    },
    /// A relay job (`relay`): the lead sender of a transfer over several
    /// pairs has this host run one session, from its own view of the
    /// shared source.
    Relay,
    /// A mirror's deletes (`mirror`): the receiver lists a destination
    /// directory, and removes what the sender names of that listing.
    Mirror,
}

pub use crate::compress::{Codec, Codecs};
pub use crate::tuning::Encryption;
pub use crate::tuning::Verification;

/// The kind of a manifest entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory (created, carries no data).
    Dir,
}

/// One entry of the sender's manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileEntry {
    /// The sender's id for this file within the session.
    pub file_id: u32,
    /// File or directory.
    pub kind: EntryKind,
    /// Size in bytes.
    pub size: u64,
    /// Identifies the source version (size and mtime) so stale checkpoints are dropped.
    pub fingerprint: u64,
    /// The source's permission bits (`0o777` at most; the receiver masks
    /// them with its umask and never sets setuid, setgid or sticky bits).
    pub mode: u16,
    /// The source's modification time: seconds since the epoch and
    /// nanoseconds (under 10^9). The receiver publishes a file with it.
    pub mtime: (i64, u32),
    /// Under `SyncLevel::Checksum`, the source file's digest
    /// (`digest::file_digest` of its blocks at the session's block
    /// size), which the receiver compares with what it has; else none.
    /// Little-endian bytes, not a `u128`: its 16-byte alignment would
    /// round every entry of a manifest up by 16 bytes.
    pub digest: Option<[u8; 16]>,
    /// Owner and extended attributes, where the send keeps them
    /// (`send --keep`); boxed, so that an entry without them (and a
    /// file waiting in a large manifest) costs a pointer.
    pub meta: Option<Box<Meta>>,
    /// Destination path relative to the receiver's root.
    pub path: String,
}

/// Most extended attributes one entry carries.
pub const MAX_XATTRS: usize = 64;
/// Most bytes of extended attributes (names and values) one entry
/// carries: the receiver holds them for every file of its manifest.
pub const MAX_XATTR_BYTES: usize = 64 << 10;
/// Longest attribute name (XATTR_NAME_MAX).
pub const MAX_XATTR_NAME: usize = 255;

/// What a file carries beyond its data, mode and times, where the send
/// keeps it (`metadata`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Meta {
    /// Owner and group ids, as the sender's map made them.
    pub owner: Option<(u32, u32)>,
    /// Extended attributes, name and value (POSIX ACLs among them, as
    /// `system.posix_acl_access` and `system.posix_acl_default`).
    pub xattrs: Vec<(String, Vec<u8>)>,
}

impl Meta {
    /// Bytes of its attributes' names and values.
    pub fn xattr_bytes(&self) -> usize {
        self.xattrs.iter().map(|(n, v)| n.len() + v.len()).sum()
    }
}

/// The header that precedes each block's payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockHeader {
    /// Which file.
    pub file_id: u32,
    /// Block index within the file.
    pub block: u64,
    /// Byte offset within the file.
    pub offset: u64,
    /// Payload length.
    pub len: u32,
}

/// What a session of a transfer over several pairs does with the
/// temporary files that every receiver of the transfer shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StripeRole {
    /// Write this session's pieces, after creating the marker that tells
    /// the other receivers they share this storage.
    Mark,
    /// Write this session's pieces; the marker must be here.
    Write,
    /// Publish the files, whose pieces were all written and verified; the
    /// marker must be here.
    Publish,
    /// Remove the marker: the transfer is over.
    Unmark,
}

/// The blocks `first..end` of one manifest entry: the only ones a
/// `Stripe` session writes of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StripePiece {
    /// The manifest entry.
    pub file_id: u32,
    /// Its first block.
    pub first: u64,
    /// One past its last block.
    pub end: u64,
}

/// Makes a session one of a transfer over several pairs (see `Frame::Stripe`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stripe {
    /// The transfer's id: names the shared-storage marker.
    pub group: u64,
    /// What the session does.
    pub role: StripeRole,
    /// For `Mark` and `Write`, the blocks of each regular file it writes.
    pub pieces: Vec<StripePiece>,
}

impl Stripe {
    /// The blocks `first..end` it writes of each file, by id.
    pub fn ranges(&self) -> std::collections::HashMap<u32, (u64, u64)> {
        self.pieces
            .iter()
            .map(|p| (p.file_id, (p.first, p.end)))
            .collect()
    }
}

/// The receiver's answer for one manifest entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanOutcome {
    /// Send it; `have` is a bitmap of blocks already durable (resume).
    Accept {
        /// One bit per block, least significant bit first.
        have: Vec<u8>,
    },
    /// Will not be written; the message says why.
    Refuse {
        /// Why.
        message: String,
    },
    /// Already at the destination, as the session's sync level compares
    /// (`Open.sync`): not sent, and left as it is.
    Present,
}

/// Each side of a relay job (`relay`) writes at least this often.
pub const RELAY_ALIVE_EVERY: Duration = Duration::from_secs(1);
/// A side of a relay job silent this long is taken as gone: as long as a
/// pair's patience with an unreachable receiver (`PAIR_PATIENCE`).
pub const RELAY_SILENCE: Duration = Duration::from_secs(8);
/// How long after a relay went silent (or its connection closed without
/// its answer) its session may still write: a running relay notices the
/// lead's silence after `RELAY_SILENCE`, and its cancelled session ends
/// within a keepalive interval; a stopped one's session (a paused VM),
/// silent too, is dropped by the receiver after its idle timeout
/// (`IDLE_TIMEOUT`, the default), so that nothing it sends on waking
/// lands.
pub const RELAY_UNANSWERED_FENCE: Duration =
    Duration::from_secs(IDLE_TIMEOUT.as_secs() + KEEPALIVE_INTERVAL.as_secs() + 2);
const _: () = assert!(RELAY_UNANSWERED_FENCE.as_secs() > RELAY_SILENCE.as_secs() + 5);
/// Most block checksums one `RelaySums` frame carries (512 KiB of them).
pub const MAX_RELAY_SUMS: usize = 1 << 16;
/// Longest receiver address a relay job names.
pub const MAX_ADDR: usize = 255;

/// One session a lead sender hands a relay: where to send, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayJob {
    /// The receiver, host:port.
    pub to: String,
    /// The directory, as the lead sees it, beneath which every entry's
    /// `rel` is opened: the relay must see the same one (shared storage).
    pub source: String,
    /// Block size in bytes.
    pub block_size: u32,
    /// Data streams.
    pub streams: u16,
    /// Verification level.
    pub verify: Verification,
    /// The session's rate cap, bytes per second; 0 for none.
    pub max_rate: u64,
    /// How long the relay keeps reconnecting to the receiver, ms.
    pub retry_ms: u32,
    /// How long it may find every reconnect refused, ms; 0 for as long
    /// as `retry_ms`.
    pub refused_ms: u32,
    /// The lead's encryption: the relay's session to the receiver runs
    /// under the stricter of it and the relay's own.
    pub encrypt: Encryption,
    /// The lead's compression, which the relay's session runs under.
    pub compress: crate::compress::Compression,
}

/// One file of a relay job: its manifest entry and where it is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayEntry {
    /// The entry as the receiver is told it (`file_id` is the job's index).
    pub entry: FileEntry,
    /// Its path beneath `RelayJob::source`, as raw bytes.
    pub rel: Vec<u8>,
}

/// Why a relay job failed, as the relay's session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayError {
    /// Whether another pair, or this one later, may get past it (the
    /// receiver was lost, the link failed); otherwise the transfer ends.
    pub retryable: bool,
    /// What went wrong.
    pub message: String,
}

/// Every message of the protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Client's first frame.
    Hello {
        /// Protocol version.
        version: u16,
        /// Client nonce.
        nonce: [u8; NONCE_LEN],
        /// The port the client dialled for the receiver it means (0 before
        /// `HELLO_PORT_SINCE`). Only a parked connection heeds it: its
        /// process hands it to its receiver on that port (`Lobby`).
        port: u16,
        /// The client's encryption mode (`None` before `ENCRYPTION_SINCE`).
        encrypt: Encryption,
    },
    /// Server's challenge.
    Challenge {
        /// Protocol version.
        version: u16,
        /// Server nonce.
        nonce: [u8; NONCE_LEN],
        /// Whether the connection is encrypted from here on: a TLS
        /// handshake follows, or the connection already is.
        encrypted: bool,
    },
    /// Client's proof of the token, and what the connection is for.
    Auth {
        /// HMAC over both nonces.
        mac: [u8; MAC_LEN],
        /// Control or data stream.
        purpose: Purpose,
    },
    /// Server's proof of the token, sent right after its challenge.
    ServerProof {
        /// HMAC over both nonces, the other way round.
        mac: [u8; MAC_LEN],
    },
    /// Opens a session on a control connection.
    Open {
        /// Chosen by the sender.
        session: SessionId,
        /// Block size in bytes.
        block_size: u32,
        /// Number of data streams that will join.
        streams: u16,
        /// Verification level.
        verify: Verification,
        /// A memory-to-memory test: the data is generated, and the
        /// receiver verifies and drops it instead of writing it, if it
        /// allows that at all (`serve --allow-discard`).
        discard: bool,
        /// The codecs blocks may come packed in (`PackedBlock`); any
        /// other packing is refused.
        codecs: Codecs,
        /// Which files the receiver answers `PlanOutcome::Present` for,
        /// instead of taking them.
        sync: crate::tuning::SyncLevel,
        /// A dry run: the receiver answers the plan without creating or
        /// changing anything, and no block follows (`send --dry-run`).
        dry_run: bool,
    },
    /// Sent between `Open` and the manifest: the session is one of a
    /// transfer over several pairs, whose receivers share one file system
    /// and write into the same temporary files, which none of them
    /// publishes until told to (see `stripes`).
    Stripe(Stripe),
    /// A chunk of the manifest.
    Files {
        /// The entries.
        entries: Vec<FileEntry>,
    },
    /// End of the manifest (or of a mirror's listing).
    FilesEnd,
    /// On a `Purpose::Mirror` connection, the sender's first frame: list
    /// the directory `base` beneath the root. The receiver answers with
    /// its entries (`Files`, ids counting from 0, paths relative to
    /// `base`) and `FilesEnd`; the sender then names the ones to remove
    /// (`Remove`) and ends with `Finish`, and the receiver answers each
    /// removal that failed (`FileResult`) and ends with `Finish`.
    MirrorOpen {
        /// The directory, relative to the root ("" for the root).
        base: String,
    },
    /// On a mirror connection: remove these entries of the listing, in
    /// this order.
    Remove {
        /// Ids the listing gave them.
        ids: Vec<u32>,
    },
    /// The receiver's plan for one entry.
    Plan {
        /// Which entry.
        file_id: u32,
        /// Accept (with resume bitmap) or refuse.
        outcome: PlanOutcome,
    },
    /// The receiver accepts files `first..first + count`, holding none of
    /// their blocks: what a tree sent afresh plans, one frame for a run of
    /// ids rather than one each.
    PlanRun {
        /// The first file of the run.
        first: u32,
        /// How many files, at least 1.
        count: u32,
    },
    /// End of the plan.
    PlanEnd,
    /// A block header; `len` payload bytes follow.
    Block(BlockHeader),
    /// A block header; the block's pieces follow, each packed with
    /// `codec` or as it is behind its checked prefix (`compress::Piece`), then
    /// the checksum of the plain bytes.
    PackedBlock {
        /// The block, as plain.
        header: BlockHeader,
        /// How its pieces were packed: one the session's `Open` named.
        codec: Codec,
    },
    /// The block is written.
    Ack {
        /// Which file.
        file_id: u32,
        /// Which block.
        block: u64,
    },
    /// The block arrived damaged; send it again.
    Nack {
        /// Which file.
        file_id: u32,
        /// Which block.
        block: u64,
    },
    /// Every block of the file has gone out (some may still be in flight;
    /// the receiver answers once it has written them); this is the
    /// sender's digest.
    FileDone {
        /// Which file.
        file_id: u32,
        /// xxh3-128 over the block checksums.
        digest: u128,
        /// The file's identity as the sender means it
        /// (`digest::entry_identity`): the receiver publishes the file
        /// only if the entry it holds has the same.
        identity: u64,
    },
    /// The receiver's verdict on a file.
    FileResult {
        /// Which file.
        file_id: u32,
        /// Published under its final name.
        ok: bool,
        /// The receiver's digest.
        digest: u128,
        /// The identity of the entry the receiver holds for the file
        /// (name, kind, size, mode, fingerprint): the sender believes a
        /// published file only under its own.
        identity: u64,
        /// Why not, when not ok.
        message: String,
    },
    /// The sender gives up on a file it had announced (its source changed
    /// while it was being read, or was replaced): the receiver discards
    /// what it has of it and answers with a failed `FileResult`.
    FileAbort {
        /// Which file.
        file_id: u32,
        /// Why, for the receiver's log and summary.
        message: String,
    },
    /// Nothing to say, but still here (see `KEEPALIVE_INTERVAL`).
    Keepalive,
    /// The sender is done with the session.
    Finish,
    /// On a data stream, once every block it carried is acknowledged: no
    /// more blocks; keep the connection for this sender's next session
    /// (see `sender::warm`).
    Park,
    /// The receiver's answer to `Park`: every acknowledgement is before
    /// it, and the connection now waits for a new handshake.
    Parked,
    /// Lead to relay: run one session (`Stripe`, `RelayFiles` and
    /// `FilesEnd` follow).
    RelayJob(RelayJob),
    /// Lead to relay: a chunk of the job's files.
    RelayFiles {
        /// The entries.
        entries: Vec<RelayEntry>,
    },
    /// Relay to lead, every second while the job runs: the bytes its data
    /// streams moved so far.
    RelayAlive {
        /// Bytes sent.
        moved: u64,
    },
    /// Relay to lead: the block checksums `first..first + sums.len()` of
    /// one file of the job, as the receiver verified them.
    RelaySums {
        /// Which file (the job's index).
        file_id: u32,
        /// The first block.
        first: u64,
        /// Their checksums.
        sums: Vec<u64>,
    },
    /// Relay to lead: the receiver's verdict on one file of the job.
    RelayResult {
        /// Which file (the job's index).
        file_id: u32,
        /// Its piece landed and was verified.
        ok: bool,
        /// The receiver's digest (0 over several pairs).
        digest: u128,
        /// Bytes of its piece the receiver already held.
        held: u64,
        /// Why not, when not ok.
        message: String,
    },
    /// Relay to lead: the job ended (the last frame).
    RelayDone {
        /// Bytes its data streams sent.
        bytes_sent: u64,
        /// How the session failed, if it did.
        error: Option<RelayError>,
    },
    /// A fatal error; the connection closes after it.
    Error {
        /// Whether reconnecting could help.
        retryable: bool,
        /// What went wrong.
        message: String,
    },
}
