//! Where a transfer stands, read the same way at both ends: whoever shows
//! progress (the command line's bar, the in-cluster agent's status
//! reports) asks for a `Position` when it likes, from the sender's
//! `Progress` (`SendConfig::progress`) or from a receiver
//! (`ServerHandle::position`). The engine moves the figures as it works;
//! nothing is pushed to the one who shows them.
#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::compress::{Auto, Compression, Report};
use std::time::Instant;

/// Where a transfer stands.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Position {
    /// Bytes of the transfer; 0 until they are known (the sender has
    /// listed its source, the receiver planned a session).
    pub total: u64,
    /// Bytes the receiver holds that a resume would keep. The sender
    /// counts what the receiver held at the plan and what it acknowledged
    /// since; the receiver counts what it published and what its stored
    /// checkpoints cover, so that the progress shown never runs ahead of
    /// a resume of the same files.
    pub done: u64,
    /// Bytes this end moved, resent or not yet durable ones included (sent
    /// by the sender, written by the receiver): what a rate is made of.
    pub moved: u64,
    /// Seconds since this end started: the sender listed its source, the
    /// receiver planned its first session (0 before).
    pub seconds: f64,
}

/// One pair of a transfer over several, as it stands.
#[derive(Debug, Clone, PartialEq)]
pub struct PairShown {
    /// Its receiver (`host:port`).
    pub to: String,
    /// The relay that sends its data (`host:port`); None: this host.
    pub via: Option<String>,
    /// `running`, `leaving`, `lost` (its unacknowledged work went to the
    /// others) or `gone` (fenced: nothing it writes lands).
    pub state: &'static str,
    /// Bytes it made durable first.
    pub bytes: u64,
    /// Its rate since it was first handed work, bytes a second.
    pub rate_bps: u64,
    /// Items (chunks, or bundles of small files) it finished.
    pub chunks_done: u64,
}

/// How a transfer over several pairs is split, and each pair.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PairsShown {
    /// Bytes in a chunk of a large file.
    pub chunk_bytes: u64,
    /// Data streams of each pair's sessions.
    pub streams_per_pair: u16,
    /// Each pair, in the order of its receivers.
    pub pairs: Vec<PairShown>,
}

/// The sender's figures, moved by the engine as a send runs and read with
/// `position`.
#[derive(Debug, Default)]
pub struct Progress {
    total: AtomicU64,
    done: AtomicU64,
    moved: AtomicU64,
    started: OnceLock<Instant>,
    pairs: Mutex<Option<PairsShown>>,
    /// Whether blocks are packed: one decision for the send (over all its
    /// sessions, and its pairs: `share_compression`), which they go on
    /// measuring.
    compression: OnceLock<Arc<Mutex<Auto>>>,
}

impl Progress {
    /// The send's compression decision, made for `mode` by the first
    /// session to ask.
    pub(crate) fn compression_for(&self, mode: Compression) -> Arc<Mutex<Auto>> {
        Arc::clone(
            self.compression
                .get_or_init(|| Arc::new(Mutex::new(Auto::new(mode)))),
        )
    }

    /// Shares `from`'s compression decision: a transfer over several pairs
    /// makes one, which every pair's sessions feed and follow.
    pub(crate) fn share_compression(&self, from: &Self, mode: Compression) {
        let _ = self.compression.set(from.compression_for(mode));
    }

    /// What compression has done so far; what `mode` would report before
    /// any session started.
    pub fn compression_or(&self, mode: Compression) -> Report {
        self.compression()
            .unwrap_or_else(|| Auto::new(mode).report())
    }

    /// What compression has done so far, once a session started.
    pub fn compression(&self) -> Option<Report> {
        let auto = self.compression.get()?;
        Some(auto.lock().unwrap_or_else(|p| p.into_inner()).report())
    }

    /// Where the send stands now.
    pub fn position(&self) -> Position {
        Position {
            total: self.total.load(Ordering::Relaxed),
            done: self.done.load(Ordering::Relaxed),
            moved: self.moved.load(Ordering::Relaxed),
            seconds: self
                .started
                .get()
                .map_or(0.0, |t| t.elapsed().as_secs_f64()),
        }
    }

    /// The source is listed: the transfer holds `total` bytes.
    pub(crate) fn sized(&self, total: u64) {
        self.total.store(total, Ordering::Relaxed);
        let _ = self.started.set(Instant::now());
    }

    /// A session's plan is in: the receiver holds `held` bytes already
    /// (verified files and resumed blocks), and progress restarts there.
    pub(crate) fn held(&self, held: u64) {
        self.done.store(held, Ordering::Relaxed);
    }

    /// The receiver acknowledged `bytes`.
    pub(crate) fn acknowledged(&self, bytes: u64) {
        self.done.fetch_add(bytes, Ordering::Relaxed);
    }

    /// A transfer over several pairs (`sender::pairs`): `done` bytes are
    /// durable at the shared destination, and its pairs moved `moved`.
    pub(crate) fn set(&self, done: u64, moved: u64) {
        self.done.store(done, Ordering::Relaxed);
        self.moved.store(moved, Ordering::Relaxed);
    }

    /// Over several pairs: the split and where each pair stands.
    pub fn pairs(&self) -> Option<PairsShown> {
        self.pairs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// A transfer over several pairs is split into chunks of
    /// `chunk_bytes`, each pair's sessions with `streams` data streams.
    pub(crate) fn split(&self, chunk_bytes: u64, streams: u16) {
        let mut p = self
            .pairs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let shown = p.get_or_insert_with(PairsShown::default);
        shown.chunk_bytes = chunk_bytes;
        shown.streams_per_pair = streams;
    }

    /// Where each pair stands now.
    pub(crate) fn set_pairs(&self, pairs: Vec<PairShown>) {
        let mut p = self
            .pairs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        p.get_or_insert_with(PairsShown::default).pairs = pairs;
    }

    /// `bytes` went out on a data stream.
    pub(crate) fn sent(&self, bytes: u64) {
        self.moved.fetch_add(bytes, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_session_restarts_from_what_the_receiver_holds() {
        let p = Progress::default();
        assert_eq!(p.position(), Position::default());
        p.sized(100);
        p.held(40);
        p.acknowledged(10);
        p.sent(10);
        let at = p.position();
        assert_eq!((at.total, at.done, at.moved), (100, 50, 10));
        // A session that resumes: what it holds replaces what was counted,
        // while the bytes moved keep adding up.
        p.held(45);
        p.sent(5);
        let at = p.position();
        assert_eq!((at.total, at.done, at.moved), (100, 45, 15));
        assert!(at.seconds >= 0.0);
    }
}
