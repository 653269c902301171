//! End-of-transfer summaries: what the shells hand back, serializable as
//! JSON and rendered for people (the binary prints them).

use serde::Serialize;

use crate::compress::{Codec, Compression, Report};
use crate::encryption::InEffect;
use crate::io::IoMode;
use crate::net::TcpStats;
use crate::optimizer::StreamChange;
use crate::sync::SyncLevel;
use crate::units::fmt_bytes;
use crate::wire::Verification;

/// What compression did over a send (`compress::auto::Report`).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CompressionSummary {
    /// The mode asked for: `none`, `auto`, `lz4` or `zstd`.
    #[serde(serialize_with = "spelled")]
    pub mode: Compression,
    /// The codec packing used, when the mode packs at all.
    pub codec: Option<&'static str>,
    /// Whether blocks were being packed at the end.
    pub packing: bool,
    /// Why packing was on or off at the end.
    pub reason: &'static str,
    /// Plain bytes of the blocks sent.
    pub plain_bytes: u64,
    /// What they took on the wire.
    pub wire_bytes: u64,
    /// Blocks that went packed.
    pub packed_blocks: u64,
}

impl From<Report> for CompressionSummary {
    fn from(r: Report) -> Self {
        Self {
            mode: r.mode,
            codec: r.codec.map(Codec::as_str),
            packing: r.packing,
            reason: r.reason.as_str(),
            plain_bytes: r.plain_bytes,
            wire_bytes: r.wire_bytes,
            packed_blocks: r.packed_blocks,
        }
    }
}

impl CompressionSummary {
    /// One line, for people.
    pub fn render(&self) -> String {
        let codec = self.codec.unwrap_or("none");
        let state = match (self.mode, self.packing) {
            (Compression::None, _) => return "off (mode none)".to_owned(),
            (Compression::Auto, true) => format!("{codec}, on ({})", self.reason),
            (Compression::Auto, false) => format!("{codec}, off ({})", self.reason),
            _ => format!("{codec}, every block"),
        };
        if self.packed_blocks == 0 || self.wire_bytes == 0 {
            return format!("{state}; no block went packed");
        }
        format!(
            "{state}; {} packed, {} went as {} ({:.2}:1)",
            count_blocks(self.packed_blocks),
            fmt_bytes(self.plain_bytes),
            fmt_bytes(self.wire_bytes),
            self.plain_bytes as f64 / self.wire_bytes as f64
        )
    }
}

fn count_blocks(n: u64) -> String {
    if n == 1 {
        "1 block".to_owned()
    } else {
        format!("{n} blocks")
    }
}

/// A file that did not make it, and why.
#[derive(Debug, Clone, Serialize)]
pub struct FileFailure {
    /// Destination path.
    pub path: String,
    /// Why.
    pub message: String,
}

/// What a mirror deleted at the destination, or would (`send --delete`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct MirrorSummary {
    /// The mirrored directory, relative to the receiver's root.
    pub base: String,
    /// Files (anything but a directory) the source does not have.
    pub files: u64,
    /// Directories the source does not have.
    pub dirs: u64,
    /// Bytes of those files.
    pub bytes: u64,
    /// The first of them (`PLAN_SHOWN`), deepest first.
    pub paths: Vec<String>,
    /// Entries deleted (0 in a dry run, or when refused or skipped).
    pub deleted: u64,
    /// Entries the receiver could not delete.
    pub failed: u64,
    /// The first of those, and why.
    pub failures: Vec<FileFailure>,
    /// Why nothing was deleted: the guard (`mirror::Refusal`).
    pub refused: Option<String>,
    /// Why nothing was even planned: a file of the send failed, and a
    /// mirror deletes only after every copy succeeded.
    pub skipped: Option<String>,
    /// What ended the mirror early (the receiver refused, the connection
    /// failed): nothing more was deleted.
    pub error: Option<String>,
}

impl MirrorSummary {
    /// Entries the source does not have (files and directories).
    pub fn count(&self) -> u64 {
        self.files + self.dirs
    }

    /// Whether it did all it was to do.
    pub fn ok(&self) -> bool {
        self.failed == 0 && self.refused.is_none() && self.skipped.is_none() && self.error.is_none()
    }

    /// What it did, in a line (a Transfer's status message).
    pub fn note(&self) -> String {
        if let Some(why) = &self.skipped {
            return format!("no deletes: {why}");
        }
        if let Some(why) = &self.refused {
            return format!("mirror refused: {why}");
        }
        let done = format!(
            "mirror deleted {} of {} entries ({})",
            self.deleted,
            self.count(),
            fmt_bytes(self.bytes)
        );
        match (&self.error, self.failures.first()) {
            (Some(e), _) => format!("{done}, then stopped: {e}"),
            (None, Some(f)) => format!(
                "{done}; {} could not be, the first {}: {}",
                self.failed, f.path, f.message
            ),
            (None, None) => done,
        }
    }

    /// Its lines of a summary; `dry` for a plan.
    fn render(&self, dry: bool, s: &mut String) {
        let what = format!(
            "{} and {}, {}, that the source does not have, under {:?}",
            counted(self.files, "file", "files"),
            counted(self.dirs, "directory", "directories"),
            fmt_bytes(self.bytes),
            self.base
        );
        if let Some(why) = &self.skipped {
            s.push_str(&format!("  mirror     no deletes: {why}\n"));
            return;
        }
        match (dry, &self.refused) {
            (_, Some(why)) => s.push_str(&format!("  mirror     refused: {why}\n")),
            (true, None) => s.push_str(&format!("  mirror     would delete {what}\n")),
            (false, None) => s.push_str(&format!(
                "  mirror     deleted {} of {}: {what}\n",
                self.deleted,
                self.count()
            )),
        }
        let total = self.files + self.dirs;
        let label = match dry || self.refused.is_some() {
            true => "would delete",
            false => "delete",
        };
        for p in &self.paths {
            s.push_str(&format!("  {label:<10} {p}\n"));
        }
        if total > self.paths.len() as u64 {
            s.push_str(&format!(
                "  {label:<10} ... and {} more\n",
                total - self.paths.len() as u64
            ));
        }
        for f in &self.failures {
            s.push_str(&format!("  not deleted {}: {}\n", f.path, f.message));
        }
        if let Some(e) = &self.error {
            s.push_str(&format!("  mirror     stopped: {e}\n"));
        }
    }
}

/// `n` and its noun, singular or plural.
fn counted(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// One manifest entry's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct FileOutcome {
    /// Destination path.
    pub path: String,
    /// Size in bytes (0 for directories).
    pub bytes: u64,
    /// Landed and verified.
    pub ok: bool,
    /// The file digest, when verified.
    pub digest: Option<String>,
    /// Why not, when not ok.
    pub message: Option<String>,
    /// Not sent: the destination already had it, at the sync level.
    pub present: bool,
    /// A dry run's: a run would send this file (`ok` then says the
    /// receiver would take it).
    pub to_send: bool,
}

/// A source entry that was not sent (symlink, device, socket, ...).
#[derive(Debug, Clone, Serialize)]
pub struct Skipped {
    /// Source path.
    pub path: String,
    /// Why.
    pub reason: String,
}

/// The I/O one side ran with, as both summaries report it.
#[derive(Debug, Clone, Serialize)]
pub struct IoInEffect {
    /// I/O mode in effect: reads on the sender, writes on the receiver.
    #[serde(serialize_with = "spelled")]
    pub io_mode: IoMode,
    /// Why the configured mode was not fully in effect, if not.
    pub io_fallback: Option<String>,
    /// Buffers on hugepages.
    pub hugepages: bool,
    /// What the buffers sit on: `normal-page`, `2 MiB huge-page`, `1 GiB huge-page`.
    pub buffer_pages: String,
}

/// The sender's summary.
#[derive(Debug, Clone, Serialize)]
pub struct SendSummary {
    /// Everything landed and verified.
    pub ok: bool,
    /// Bytes in all files of the transfer.
    pub bytes_total: u64,
    /// Payload bytes this run sent (resends included), counted plain:
    /// what packed blocks took on the wire is in `compression`.
    pub bytes_sent: u64,
    /// Bytes the receiver already held when this run started.
    pub bytes_skipped_resume: u64,
    /// Blocks sent again (damaged in flight, or on a broken stream).
    pub blocks_retried: u64,
    /// Wall time from first connect to the last verified file.
    pub seconds: f64,
    /// `bytes_sent` over `seconds`, in Gbit/s.
    pub gbps: f64,
    /// The source's I/O.
    #[serde(flatten)]
    pub io: IoInEffect,
    /// Data streams opened.
    pub streams: u16,
    /// Data streams that joined over a connection an earlier session to
    /// the same receiver had parked (`SendConfig::warm`), skipping the TCP
    /// handshake and, where the host allows, slow start.
    pub streams_warm: u64,
    /// Why that many, when the per-link tuner chose them (`null` when the
    /// count was fixed).
    pub streams_chosen: Option<String>,
    /// Streams the optimizer added while the transfer ran, in order.
    pub stream_changes: Vec<StreamChange>,
    /// Why the optimizer stopped adding (`null` when it did not run, or
    /// the transfer ended first).
    pub streams_held: Option<String>,
    /// Gbit/s each stream carried over the whole run, by stream index (a
    /// stream the optimizer added carried for less of it).
    pub per_stream_gbps: Vec<f64>,
    /// Each stream's TCP_INFO at the end of the last session, by stream
    /// index (`null` for a stream that did not connect).
    pub tcp: Vec<Option<TcpStats>>,
    /// Whole-transfer digest (file digest for one file).
    pub digest: String,
    /// Regular files in the manifest.
    pub files: usize,
    /// Regular files verified and published.
    pub files_ok: usize,
    /// The sync level: which files already at the destination were left
    /// as they are.
    #[serde(serialize_with = "spelled")]
    pub sync: SyncLevel,
    /// Regular files the destination already had, at that level: not
    /// sent, and not in the digest.
    pub files_present: usize,
    /// Their bytes.
    pub bytes_present: u64,
    /// A dry run (`--dry-run`): the receiver planned, nothing was sent,
    /// created or changed; `ok` says the run would take every file.
    pub dry_run: bool,
    /// In a dry run, the regular files a run would send (directories
    /// are made where they are needed, and not counted).
    pub files_to_send: usize,
    /// Their bytes, whole: a run resumes a file an interrupted send
    /// left checkpointed, which the plan does not read, and so sends
    /// less of it.
    pub bytes_to_send: u64,
    /// Directories in the manifest (created, with their modes; `failures`
    /// names any that failed).
    pub dirs: usize,
    /// Entries that failed, with reasons.
    pub failures: Vec<FileFailure>,
    /// Every entry's outcome, in manifest order (JSON only; the text
    /// summary lists failures).
    pub results: Vec<FileOutcome>,
    /// Source entries not sent.
    pub skipped: Vec<Skipped>,
    /// Source files the send's filters left out (`--include`,
    /// `--exclude`, `--min-size`, ...).
    pub files_filtered: usize,
    /// What its mirror deleted, or would (`send --delete`); None without
    /// one.
    pub mirror: Option<MirrorSummary>,
    /// Block size in bytes.
    pub block_size: u64,
    /// Requests in flight.
    pub queue_depth: usize,
    /// Verification level.
    #[serde(serialize_with = "spelled")]
    pub verify: Verification,
    /// Congestion control in use.
    pub congestion: String,
    /// What sealed the connections: `none`, `tls-userspace` or
    /// `tls-kernel`.
    pub encryption: InEffect,
    /// Why TLS ran in this process rather than in the kernel, when it did.
    pub encryption_note: Option<String>,
    /// What compression did.
    pub compression: CompressionSummary,
    /// Sessions it took (1 unless the sender reconnected).
    pub sessions: u32,
    /// Round-trip time measured by the handshake, in milliseconds.
    pub rtt_ms: f64,
    /// A memory-to-memory test (`--synthetic`): generated data, dropped
    /// by the receiver once verified; no disk was read or written.
    pub memory_to_memory: bool,
    /// Things the user should know (small TCP buffers, fallbacks).
    pub warnings: Vec<String>,
}

/// What the summaries of a memory-to-memory test say first, so that
/// nobody takes its rate for a transfer's.
pub const MEMORY_TO_MEMORY: &str =
    "MEMORY TO MEMORY: generated data, dropped by the receiver; no disk was read or written";

impl SendSummary {
    /// The human-readable summary.
    pub fn render(&self) -> String {
        if self.dry_run {
            return self.render_plan();
        }
        let mut s = String::new();
        let status = match (self.ok, self.verify) {
            (false, _) => "FAILED",
            (true, Verification::None) => "complete, unverified (--verify none)",
            (true, _) => "complete and verified",
        };
        if self.memory_to_memory {
            s.push_str(&format!("memory-to-memory test {status}\n"));
            s.push_str(&format!("  {MEMORY_TO_MEMORY}\n"));
        } else {
            s.push_str(&format!("transfer {status}\n"));
        }
        s.push_str(&format!(
            "  bytes      {} total, {} sent, {} already at the receiver\n",
            fmt_bytes(self.bytes_total),
            fmt_bytes(self.bytes_sent),
            fmt_bytes(self.bytes_skipped_resume)
        ));
        s.push_str(&format!("  time       {:.2} s\n", self.seconds));
        s.push_str(&format!(
            "  rate       {:.2} Gbit/s ({:.2} GB/s)\n",
            self.gbps,
            self.gbps / 8.0
        ));
        if self.memory_to_memory {
            s.push_str(&format!(
                "  io         none (generated), block {}, {} buffers\n",
                fmt_bytes(self.block_size),
                self.io.buffer_pages
            ));
        } else {
            s.push_str(&format!(
                "  io         {}{}, block {}, queue depth {}, {} buffers\n",
                self.io.io_mode,
                if self.io.io_mode.wants_direct() {
                    " (O_DIRECT)"
                } else {
                    ""
                },
                fmt_bytes(self.block_size),
                self.queue_depth,
                self.io.buffer_pages
            ));
        }
        if let Some(f) = &self.io.io_fallback {
            s.push_str(&format!("  fallback   {f}\n"));
        }
        let per: Vec<String> = self
            .per_stream_gbps
            .iter()
            .map(|g| format!("{g:.2}"))
            .collect();
        s.push_str(&format!(
            "  streams    {} ({}), Gbit/s each: {}\n",
            self.streams,
            self.congestion,
            per.join(" ")
        ));
        s.push_str(&format!(
            "  encrypted  {}\n",
            match (self.encryption, &self.encryption_note) {
                (InEffect::Clear, _) => "no: in clear".to_owned(),
                (InEffect::Userspace, note) => format!(
                    "TLS 1.3 in this process (rustls){}",
                    note.as_ref().map(|n| format!("; {n}")).unwrap_or_default()
                ),
                (InEffect::Kernel, _) => "TLS 1.3 in the kernel (kTLS)".to_owned(),
            }
        ));
        s.push_str(&format!("  compressed {}\n", self.compression.render()));
        if self.streams_warm > 0 {
            s.push_str(&format!(
                "  warm       {} data stream joins over parked connections\n",
                self.streams_warm
            ));
        }
        if let Some(why) = &self.streams_chosen {
            s.push_str(&format!("  tuned      streams {why}\n"));
        }
        for c in &self.stream_changes {
            s.push_str(&format!(
                "  added      {} -> {} streams after {:.1} s: {}\n",
                c.from, c.to, c.after_secs, c.reason
            ));
        }
        if let Some(why) = &self.streams_held {
            s.push_str(&format!("  held       {why}\n"));
        }
        if let Some(line) = tcp_line(&self.tcp) {
            s.push_str(&line);
        }
        s.push_str(&format!(
            "  retried    {} blocks; sessions {}; rtt {:.2} ms\n",
            self.blocks_retried, self.sessions, self.rtt_ms
        ));
        let dirs = match self.dirs {
            0 => String::new(),
            1 => " (and 1 directory)".to_string(),
            n => format!(" (and {n} directories)"),
        };
        s.push_str(&format!(
            "  files      {} of {} ok{dirs}; verify {}; digest {}\n",
            self.files_ok + self.files_present,
            self.files,
            self.verify,
            self.digest
        ));
        if self.sync != SyncLevel::None {
            s.push_str(&format!(
                "  sync       {}: {} files ({}) already there, not sent; {} sent\n",
                self.sync,
                self.files_present,
                fmt_bytes(self.bytes_present),
                self.files_ok
            ));
        }
        for f in &self.failures {
            s.push_str(&format!("  failed     {}: {}\n", f.path, f.message));
        }
        self.render_tail(&mut s);
        s
    }

    /// A dry run's summary: what a run would send, leave and be refused.
    fn render_plan(&self) -> String {
        let mut s = format!(
            "dry run {}: nothing was sent, and nothing created or changed at the receiver\n",
            if self.ok {
                "planned"
            } else {
                "planned, with files a run would fail"
            }
        );
        s.push_str(&format!(
            "  plan       {} to send ({}); {} already there (sync {}); {} refused\n",
            self.files_to_send,
            fmt_bytes(self.bytes_to_send),
            self.files_present,
            self.sync,
            self.failures.len()
        ));
        let sends: Vec<&FileOutcome> = self.results.iter().filter(|r| r.to_send).collect();
        for r in sends.iter().take(PLAN_SHOWN) {
            s.push_str(&format!(
                "  send       {} ({})\n",
                r.path,
                fmt_bytes(r.bytes)
            ));
        }
        if sends.len() > PLAN_SHOWN {
            s.push_str(&format!(
                "  send       ... and {} more (--json lists every entry)\n",
                sends.len() - PLAN_SHOWN
            ));
        }
        for f in &self.failures {
            s.push_str(&format!("  refused    {}: {}\n", f.path, f.message));
        }
        self.render_tail(&mut s);
        s
    }

    /// The lines both summaries end with: what the filters left out,
    /// what was skipped, and warnings.
    fn render_tail(&self, s: &mut String) {
        if let Some(m) = &self.mirror {
            m.render(self.dry_run, s);
        }
        if self.files_filtered > 0 {
            s.push_str(&format!(
                "  filtered   {} file(s) left out by the filters\n",
                self.files_filtered
            ));
        }
        for k in self.skipped.iter().take(20) {
            s.push_str(&format!("  skipped    {}: {}\n", k.path, k.reason));
        }
        if self.skipped.len() > 20 {
            s.push_str(&format!(
                "  skipped    ... and {} more\n",
                self.skipped.len() - 20
            ));
        }
        for w in &self.warnings {
            s.push_str(&format!("  warning    {w}\n"));
        }
    }
}

/// How many of the entries a dry run would send its text summary names.
pub const PLAN_SHOWN: usize = 20;

pub use crate::session::SessionOutcome;

/// The streams that joined a session against those announced: more where
/// the sender's optimizer added some.
fn joined(streams: u64, announced: u16) -> String {
    if streams > u64::from(announced) {
        format!("{streams} streams ({announced} at the start, the rest added)")
    } else {
        format!("{streams} of {announced} streams")
    }
}

/// The receiver's summary of one session.
#[derive(Debug, Clone, Serialize)]
pub struct ReceiverSummary {
    /// Session id (hex).
    pub session: String,
    /// How it ended (`complete`, `interrupted: ...` or `failed: ...` in JSON).
    #[serde(serialize_with = "spelled")]
    pub outcome: SessionOutcome,
    /// Payload bytes written.
    pub bytes_written: u64,
    /// Bytes already durable from an earlier session.
    pub bytes_skipped_resume: u64,
    /// Session duration.
    pub seconds: f64,
    /// `bytes_written` over `seconds`, in Gbit/s.
    pub gbps: f64,
    /// The destination's I/O.
    #[serde(flatten)]
    pub io: IoInEffect,
    /// Data streams that joined (more than announced where the sender's
    /// optimizer added some).
    pub streams: u64,
    /// Data streams the sender announced.
    pub requested_streams: u16,
    /// Blocks that arrived damaged and were asked again.
    pub blocks_rejected: u64,
    /// Files verified and published.
    pub files_ok: u64,
    /// Files that failed, refused ones included.
    pub files_failed: u64,
    /// Files already here at the session's sync level: left as they were.
    pub files_present: u64,
    /// A memory-to-memory test: `bytes_written` were received, verified
    /// and dropped, and nothing was written.
    pub memory_to_memory: bool,
    /// A dry run (`send --dry-run`): the session planned, and wrote and
    /// created nothing; `files_failed` are the files a run would refuse.
    pub dry_run: bool,
    /// Things the receiver's operator should know (checkpoints that could
    /// not be stored, for one).
    pub warnings: Vec<String>,
}

impl ReceiverSummary {
    /// The human-readable summary: one line, then one per warning.
    pub fn render(&self) -> String {
        if self.dry_run {
            return format!(
                "session {} {}: a dry run, which wrote nothing: {} file(s) already here, {} a run would refuse\n",
                &self.session[..8.min(self.session.len())],
                self.outcome,
                self.files_present,
                self.files_failed
            );
        }
        let mut s = format!(
            "session {} {}: {} written in {:.2} s = {:.2} Gbit/s, io {}{}, {} buffers, {}, {} damaged blocks refetched, {} resumed, files {} ok / {} failed\n",
            &self.session[..8.min(self.session.len())],
            self.outcome,
            fmt_bytes(self.bytes_written),
            self.seconds,
            self.gbps,
            if self.memory_to_memory {
                "none".to_string()
            } else {
                self.io.io_mode.to_string()
            },
            self.io
                .io_fallback
                .as_deref()
                .map(|f| format!(" ({f})"))
                .unwrap_or_default(),
            self.io.buffer_pages,
            joined(self.streams, self.requested_streams),
            self.blocks_rejected,
            fmt_bytes(self.bytes_skipped_resume),
            self.files_ok,
            self.files_failed
        );
        if self.files_present > 0 {
            s.insert_str(
                s.len() - 1,
                &format!(" / {} already here", self.files_present),
            );
        }
        if self.memory_to_memory {
            s = s.replacen(" written in ", " received in ", 1);
            s.push_str(&format!("  {MEMORY_TO_MEMORY}\n"));
        }
        for w in &self.warnings {
            s.push_str(&format!("  warning: {w}\n"));
        }
        s
    }
}

/// One line over the streams' TCP_INFO: the spread of their round trips
/// and windows, and their retransmits together.
fn tcp_line(tcp: &[Option<TcpStats>]) -> Option<String> {
    let seen: Vec<&TcpStats> = tcp.iter().flatten().collect();
    let first = seen.first()?;
    let spread = |f: &dyn Fn(&TcpStats) -> f64| {
        seen.iter()
            .map(|t| f(t))
            .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)))
    };
    let (rtt_lo, rtt_hi) = spread(&|t| t.rtt_ms);
    let (cwnd_lo, cwnd_hi) = spread(&|t| f64::from(t.cwnd));
    let min_rtt = spread(&|t| t.min_rtt_ms).0;
    let retransmits: u64 = seen.iter().map(|t| u64::from(t.retransmits)).sum();
    Some(format!(
        "  tcp        rtt {rtt_lo:.2}-{rtt_hi:.2} ms (lowest {min_rtt:.2}), cwnd {cwnd_lo:.0}-{cwnd_hi:.0} segments of {} B, path MTU {} B, {retransmits} retransmitted\n",
        first.mss, first.pmtu
    ))
}

/// Settings as the command line spells them (`async`, `checksums`): the
/// I/O mode as `--json` always showed it; the verification level as
/// `checksums` since it has one name everywhere (it was `blocks`).
fn spelled<S: serde::Serializer>(v: &impl std::fmt::Display, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

#[cfg(test)]
mod tests {
    use super::joined;

    #[test]
    fn streams_added_during_a_session_are_not_read_as_more_than_announced() {
        assert_eq!(joined(3, 4), "3 of 4 streams");
        assert_eq!(joined(4, 4), "4 of 4 streams");
        assert_eq!(joined(6, 4), "6 streams (4 at the start, the rest added)");
    }
}
