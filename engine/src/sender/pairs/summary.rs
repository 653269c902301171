//! What a transfer over several pairs did, as its summary shows it.

use super::*;

/// One pair as the summary shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PairSummary {
    /// The receiver.
    pub to: String,
    /// The relay that sent its data (`relay`), when not this host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
    /// `running` (finished with it), `lost` or `gone`.
    pub state: String,
    /// Bytes it made durable first.
    pub bytes: u64,
    /// Payload bytes it put on the wire, resends included: a session that
    /// fails may have sent some of its blocks twice, on a stream that
    /// died and again on another.
    pub bytes_sent: u64,
    /// Its rate from its first item to the end, Gbit/s.
    pub gbps: f64,
    /// Items (chunks or bundles of files) it finished.
    pub chunks_done: u64,
    /// Why it was lost.
    pub error: Option<String>,
    /// Seconds from the start of the transfer until it was given up as
    /// lost and its work went to the others.
    pub lost_after_s: Option<f64>,
}

/// What a transfer over several pairs did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PairsSummary {
    /// Every file published.
    pub ok: bool,
    /// Bytes of the transfer's files.
    pub bytes_total: u64,
    /// Payload bytes sent, as plain (before packing), over every pair,
    /// resends included.
    pub bytes_sent: u64,
    /// Bytes of pieces that landed which the receivers already held (their
    /// per-chunk checkpoints: from an earlier run, or written by a pair
    /// lost before it answered), read and checked here but not sent.
    pub bytes_resumed: u64,
    /// Wall time, first connect to the last publish.
    pub seconds: f64,
    /// `bytes_total` over `seconds`, Gbit/s.
    pub gbps: f64,
    /// The split: chunk size in bytes.
    pub chunk_bytes: u64,
    /// Block size in bytes.
    pub block_size: u64,
    /// Data streams per pair.
    pub streams_per_pair: u16,
    /// Each pair.
    pub pairs: Vec<PairSummary>,
    /// Regular files, and those published.
    pub files: usize,
    /// Regular files verified and published.
    pub files_ok: usize,
    /// Files that failed, with why.
    pub failures: Vec<(String, String)>,
    /// The file's digest for one file, the tree digest for several: the
    /// same a transfer over one pair reports.
    pub digest: String,
    /// What compression did, over every pair (one decision for all).
    pub compression: crate::summary::CompressionSummary,
    /// The sync level: which files already at the destination were left
    /// (asked of the first receiver before the pairs start).
    #[serde(serialize_with = "spelled")]
    pub sync: crate::sync::SyncLevel,
    /// Regular files the destination already had, at that level: not
    /// sent, and not among `files`.
    pub files_present: usize,
    /// Their bytes.
    pub bytes_present: u64,
}

fn spelled<S: serde::Serializer>(v: &impl std::fmt::Display, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

impl PairsSummary {
    /// The summary with what a sync level left: `present`.
    pub(super) fn with_present(self, present: Present) -> Self {
        Self {
            sync: present.level,
            files_present: present.files,
            bytes_present: present.bytes,
            ..self
        }
    }

    /// The summary of a transfer whose files the destination all had
    /// (`present`), which no pair was started for (its directories are
    /// all there too: a file present is beneath them).
    pub(super) fn nothing_sent(cfg: &SendConfig, present: Present, start: Instant) -> Self {
        Self {
            ok: true,
            bytes_total: 0,
            bytes_sent: 0,
            bytes_resumed: 0,
            seconds: start.elapsed().as_secs_f64(),
            gbps: 0.0,
            chunk_bytes: 0,
            block_size: cfg.block_size,
            streams_per_pair: cfg.streams,
            pairs: Vec::new(),
            files: 0,
            files_ok: 0,
            failures: Vec::new(),
            digest: "none (nothing sent)".into(),
            compression: cfg.progress.compression_or(cfg.compress).into(),
            sync: present.level,
            files_present: present.files,
            bytes_present: present.bytes,
        }
    }

    /// The human-readable summary.
    pub fn render(&self) -> String {
        use crate::units::fmt_bytes;
        let mut s = format!(
            "transfer over {} pairs {}\n",
            self.pairs.len(),
            if self.ok {
                "complete and verified"
            } else {
                "FAILED"
            }
        );
        s.push_str(&format!(
            "  bytes      {} total, {} sent, {} resumed\n  time       {:.2} s\n  rate       {:.2} Gbit/s\n",
            fmt_bytes(self.bytes_total),
            fmt_bytes(self.bytes_sent),
            fmt_bytes(self.bytes_resumed),
            self.seconds,
            self.gbps
        ));
        s.push_str(&format!(
            "  split      chunks of {}, blocks of {}, {} streams a pair\n",
            fmt_bytes(self.chunk_bytes),
            fmt_bytes(self.block_size),
            self.streams_per_pair
        ));
        for p in &self.pairs {
            s.push_str(&format!(
                "  pair       {}{} {}: {} first-written, {} sent, {:.2} Gbit/s, {} chunks{}\n",
                p.via
                    .as_ref()
                    .map(|v| format!("{v} -> "))
                    .unwrap_or_default(),
                p.to,
                p.state,
                fmt_bytes(p.bytes),
                fmt_bytes(p.bytes_sent),
                p.gbps,
                p.chunks_done,
                match (&p.error, p.lost_after_s) {
                    (Some(e), Some(t)) => format!(", lost after {t:.1} s ({e})"),
                    _ => String::new(),
                }
            ));
        }
        s.push_str(&format!("  compressed {}\n", self.compression.render()));
        s.push_str(&format!(
            "  files      {} of {} published\n  digest     {}\n",
            self.files_ok, self.files, self.digest
        ));
        if self.sync != crate::sync::SyncLevel::None {
            s.push_str(&format!(
                "  sync       {}: {} files ({}) already there, not sent\n",
                self.sync,
                self.files_present,
                fmt_bytes(self.bytes_present)
            ));
        }
        for (path, why) in &self.failures {
            s.push_str(&format!("  failed     {path}: {why}\n"));
        }
        s
    }
}

/// What a pair in `state` is called, `working` the word for a pair that
/// takes work (or, at the end, took it to the end).
pub(super) fn state_name(state: PairState, working: &'static str) -> &'static str {
    match state {
        PairState::Running => working,
        PairState::Leaving if working == "finished" => working,
        PairState::Leaving => "leaving",
        PairState::Lost => "lost",
        PairState::Gone => "gone",
    }
}
