//! What the shells tell the outside as they run: the one way out of the
//! engine for metrics and printed summaries. (Progress is read, not told:
//! see `progress`.)
//!
//! The engine knows nothing of prometheus, terminals or Kubernetes; the
//! binary implements [`Observer`] with whatever it shows. Every method does
//! nothing by default, so an observer picks what it wants.
//!
//! The methods are called from the data path's threads, some once per
//! block and some under the sender's session lock: an implementation must
//! be cheap. `summarized` alone may take its time (the agent prints the
//! summary there): it runs on the session's control thread before the
//! connection closes, so it holds only that session's sender.

use std::fmt::Debug;
use std::sync::Arc;

use crate::compress::{Codec, Reason};
use crate::encryption::InEffect;
use crate::net::TcpStats;
use crate::optimizer::StreamChange;
use crate::summary::ReceiverSummary;
use crate::tuner::StreamChoice;
use crate::violation::ViolationKind;

/// How one sender session ended, as the retry loop judged it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionEnd {
    /// Every file answered.
    Complete,
    /// Failed with an error worth reconnecting for (counted also for the
    /// session after which the sender gives up, when its time is out).
    Retried,
    /// Failed for good.
    Failed,
}

impl SessionEnd {
    /// Every way a session ends.
    pub const ALL: [Self; 3] = [Self::Complete, Self::Retried, Self::Failed];

    /// The label a metric counts it under.
    pub fn metric_label(self) -> &'static str {
        match self {
            Self::Complete => "complete",
            Self::Retried => "retried",
            Self::Failed => "failed",
        }
    }
}

/// Receives the shells' events. `Debug` so that the configurations that
/// carry one stay printable.
pub trait Observer: Send + Sync + Debug {
    // The sending side.

    /// A block of `bytes` went out on data stream `stream`.
    fn sent(&self, stream: u16, bytes: u64) {
        let _ = (stream, bytes);
    }
    /// A block of `plain` bytes went out packed with `codec` as `wire`
    /// bytes (besides `sent`, which counts it plain).
    fn packed(&self, codec: Codec, plain: u64, wire: u64) {
        let _ = (codec, plain, wire);
    }
    /// Packing turned on or off (`reason` says which, and why), or this
    /// is the send's first word on it.
    fn compression_changed(&self, reason: Reason) {
        let _ = reason;
    }
    /// Bytes sent and not yet acknowledged moved by `delta`.
    fn in_flight(&self, delta: i64) {
        let _ = delta;
    }
    /// The per-link tuner chose how many data streams this run opens.
    fn streams_chosen(&self, choice: &StreamChoice) {
        let _ = choice;
    }
    /// The optimizer asked for more data streams while the transfer runs.
    fn streams_changed(&self, change: &StreamChange) {
        let _ = change;
    }
    /// A data stream broke; its blocks go to the others.
    fn stream_failed(&self) {}

    /// A connection authenticated, sealed as `in_effect`; `side` is
    /// `Client` on the sender (and a relay's sessions), `Server` on a
    /// receiver.
    fn connection_agreed(&self, side: crate::net::tls::Side, in_effect: InEffect) {
        let _ = (side, in_effect);
    }
    /// Data stream `stream`'s TCP_INFO: every second while a session runs,
    /// and once more as it ends.
    fn tcp_sampled(&self, stream: u16, stats: &TcpStats) {
        let _ = (stream, stats);
    }
    /// A session sent `blocks` again (damaged, or on a broken stream).
    fn resent(&self, blocks: u64) {
        let _ = blocks;
    }
    /// A sender session ended.
    fn send_session_ended(&self, end: SessionEnd) {
        let _ = end;
    }

    // The receiving side.

    /// A connection or session was refused: in its handshake, at the
    /// connection limits, or when it asked to open (too big a block or
    /// manifest, no room, its destination busy). `reason` is a metric
    /// label (`RefusalReason::metric_label`, `Refusal::metric_label` of
    /// the connection limits, `auth`, `protocol`, `handshake`).
    fn refused(&self, reason: &'static str) {
        let _ = reason;
    }
    /// A session opened.
    fn session_opened(&self) {}
    /// A session that opened closed (however it ended).
    fn session_closed(&self) {}
    /// A session's summary, once it ended with one.
    fn summarized(&self, summary: &ReceiverSummary) {
        let _ = summary;
    }
    /// A block of `bytes` was written to disk.
    fn written(&self, bytes: u64) {
        let _ = bytes;
    }
    /// A memory-to-memory session's block of `bytes` arrived intact and
    /// was dropped (never counted as written).
    fn discarded(&self, bytes: u64) {
        let _ = bytes;
    }
    /// A block arrived damaged and was asked again.
    fn damaged(&self) {}
    /// A packed block arrived that did not unpack (also `damaged`).
    fn unpack_failed(&self, codec: Codec) {
        let _ = codec;
    }
    /// A sender broke the protocol; the connection was closed.
    fn violation(&self, kind: ViolationKind) {
        let _ = kind;
    }
    /// A file was verified and published (`true`) or failed (`false`).
    fn file_done(&self, published: bool) {
        let _ = published;
    }
}

/// An observer that shows nothing: the default of every configuration.
#[derive(Debug, Default, Clone, Copy)]
pub struct Unobserved;

impl Observer for Unobserved {}

/// The shared handle the configurations carry.
pub type Observe = Arc<dyn Observer>;

/// The default handle: nothing observed.
pub fn unobserved() -> Observe {
    Arc::new(Unobserved)
}
