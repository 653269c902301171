//! A run's summary, assembled once its last session has ended: what became
//! of each file, the transfer's digest, and what the user should know.

use std::collections::HashMap;

use super::source::{SourceFile, SourceList};
use super::{RunState, SendConfig};
use crate::digest::{fmt_digest, tree_digest};
use crate::encryption::InEffect;
use crate::io::{IoMode, Pools};
use crate::net::{buffer_warning, lagging};
use crate::session::FileVerdict;
use crate::summary::{FileFailure, FileOutcome, IoInEffect, SendSummary};
use crate::units::gbps;
use crate::wire::{EntryKind, Verification};

/// The summary of sending `list` with `cfg`, in `seconds`, which ended
/// as `st` says.
pub(super) fn summarize(
    cfg: &SendConfig,
    list: SourceList,
    st: &RunState,
    pool: &Pools,
    seconds: f64,
) -> SendSummary {
    let total: u64 = list.files.iter().map(|f| f.size).sum();
    let outcomes = outcomes(&list.files, &st.verdicts, cfg.verify);
    let digest = match (cfg.verify, outcomes.digests.as_slice(), list.files.len()) {
        _ if cfg.dry_run => "none (dry run)".to_string(),
        (Verification::None, _, _) => "none (--verify none)".to_string(),
        (_, [], _) if outcomes.present > 0 => "none (nothing sent)".to_string(),
        (_, [(_, d)], 1) => fmt_digest(*d),
        _ => fmt_digest(tree_digest(outcomes.digests.iter().copied())),
    };
    let rtt = st.rtt.unwrap_or_default();
    let streams = st.streams.unwrap_or(cfg.streams);
    let mut warnings = warnings(cfg, st, pool);
    if list.hard_links > 0 {
        warnings.push(format!(
            "{} file(s) are hard links to others sent with them: each landed as a copy of its own (hard links are found, not kept)",
            list.hard_links
        ));
    }
    SendSummary {
        ok: outcomes.failures.is_empty(),
        bytes_total: total,
        bytes_sent: st.bytes_sent,
        bytes_skipped_resume: st.bytes_skipped_resume,
        blocks_retried: st.blocks_retried,
        seconds,
        gbps: gbps(st.bytes_sent, seconds),
        io: IoInEffect {
            io_mode: st.io_mode.unwrap_or(cfg.io_mode),
            io_fallback: st.io_fallback.clone(),
            hugepages: pool.hugepages(),
            buffer_pages: pool.pages(),
        },
        streams,
        streams_warm: st.streams_warm,
        streams_chosen: st.streams_chosen.clone(),
        stream_changes: st.stream_changes.clone(),
        streams_held: st.streams_held.clone(),
        per_stream_gbps: st
            .per_stream_bytes
            .iter()
            .map(|b| gbps(*b, seconds))
            .collect(),
        tcp: st.tcp.clone(),
        digest,
        files: list
            .files
            .iter()
            .filter(|f| f.kind == EntryKind::File)
            .count(),
        files_ok: outcomes.files_ok,
        sync: cfg.sync,
        files_present: outcomes.present,
        bytes_present: outcomes.present_bytes,
        dry_run: cfg.dry_run,
        mirror: None,
        files_to_send: outcomes.to_send,
        bytes_to_send: outcomes.to_send_bytes,
        dirs: list
            .files
            .iter()
            .filter(|f| f.kind == EntryKind::Dir)
            .count(),
        failures: outcomes.failures,
        results: outcomes.results,
        skipped: list.skipped,
        files_filtered: list.filtered,
        block_size: cfg.block_size,
        queue_depth: if st.io_mode == Some(IoMode::Async) {
            cfg.queue_depth
        } else {
            1
        },
        verify: cfg.verify,
        congestion: st.congestion.clone(),
        encryption: st.encryption,
        encryption_note: (st.encryption == InEffect::Userspace)
            .then(crate::net::tls::userspace_note),
        compression: cfg.progress.compression_or(cfg.compress).into(),
        sessions: st.sessions,
        rtt_ms: rtt.as_secs_f64() * 1e3,
        memory_to_memory: cfg.synthetic.is_some(),
        warnings,
    }
}

/// What became of the entries of a run.
struct Outcomes<'a> {
    /// Each entry's, in the list's order.
    results: Vec<FileOutcome>,
    failures: Vec<FileFailure>,
    /// Files (not directories) verified.
    files_ok: usize,
    /// Files found already there, and their bytes.
    present: usize,
    present_bytes: u64,
    /// In a dry run, files a run would send, and their bytes.
    to_send: usize,
    to_send_bytes: u64,
    /// Their destinations and digests, for the transfer's digest.
    digests: Vec<(&'a str, u128)>,
}

/// What became of each of `files`, by the receiver's `verdicts` on them.
fn outcomes<'a>(
    files: &'a [SourceFile],
    verdicts: &HashMap<u32, FileVerdict>,
    verify: Verification,
) -> Outcomes<'a> {
    let mut failures = Vec::new();
    let mut digests = Vec::new();
    let mut files_ok = 0;
    let (mut present, mut present_bytes) = (0, 0);
    let (mut to_send, mut to_send_bytes) = (0, 0);
    let mut results = Vec::with_capacity(files.len());
    for (i, f) in files.iter().enumerate() {
        let (ok, digest, message) = match verdicts.get(&(i as u32)) {
            Some(FileVerdict::Ok(d)) => {
                if f.kind == EntryKind::File {
                    files_ok += 1;
                    digests.push((f.dest.as_str(), *d));
                }
                (
                    true,
                    (verify != Verification::None).then(|| fmt_digest(*d)),
                    None,
                )
            }
            Some(FileVerdict::Failed(m)) => (false, None, Some(m.clone())),
            Some(FileVerdict::Present) => {
                present += 1;
                present_bytes += f.size;
                (true, None, None)
            }
            // A directory is made where a file needs it: not counted.
            Some(FileVerdict::WouldSend) => {
                if f.kind == EntryKind::File {
                    to_send += 1;
                    to_send_bytes += f.size;
                }
                (true, None, None)
            }
            None => (
                false,
                None,
                Some("no verdict from the receiver".to_string()),
            ),
        };
        if let Some(m) = &message {
            failures.push(FileFailure {
                path: f.dest.clone(),
                message: m.clone(),
            });
        }
        results.push(FileOutcome {
            path: f.dest.clone(),
            bytes: f.size,
            ok,
            digest,
            message,
            present: matches!(verdicts.get(&(i as u32)), Some(FileVerdict::Present)),
            to_send: f.kind == EntryKind::File
                && matches!(verdicts.get(&(i as u32)), Some(FileVerdict::WouldSend)),
        });
    }
    Outcomes {
        results,
        failures,
        files_ok,
        present,
        present_bytes,
        to_send,
        to_send_bytes,
        digests,
    }
}

/// What the user should know about how the run went.
fn warnings(cfg: &SendConfig, st: &RunState, pool: &Pools) -> Vec<String> {
    let mut warnings = Vec::new();
    let rtt = st.rtt.unwrap_or_default();
    let streams = st.streams.unwrap_or(cfg.streams);
    if let Some(w) = buffer_warning(rtt, streams, cfg.max_rate)
        && st.streams_chosen.is_none()
    {
        warnings.push(w);
    }
    if let Some(f) = &st.io_fallback {
        warnings.push(f.clone());
    }
    if let Some(n) = pool.huge_note() {
        warnings.push(n.to_owned());
    }
    if st.metas_unread.1 > 0 {
        warnings.push(format!(
            "{} file(s) sent without their extended attributes (--keep): {}{}",
            st.metas_unread.1,
            st.metas_unread.0.join("; "),
            match st.metas_unread.1 - st.metas_unread.0.len() {
                0 => String::new(),
                n => format!("; and {n} more"),
            }
        ));
    }
    warnings.extend(st.stream_cuts.iter().cloned());
    if st.stream_cuts_more > 0 {
        warnings.push(format!(
            "... and {} more data stream failures",
            st.stream_cuts_more
        ));
    }
    let first = st.first_streams.min(st.per_stream_bytes.len());
    for l in lagging(&st.per_stream_bytes[..first], cfg.block_size) {
        warnings.push(format!(
            "data stream {} carried {:.0}% of what the median stream did: its path may be slower (see `tcp` in --json for its round trip and retransmits)",
            l.stream,
            l.share * 100.0
        ));
    }
    warnings
}
