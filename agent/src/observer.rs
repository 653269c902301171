//! The agent's observer of the engine: every event into the Prometheus
//! metrics, a sender's stream choices into the progress shown, and a
//! receiver's session summaries printed when the command line asks for
//! them.

use std::sync::Arc;

use wirerate_engine::compress::{Codec, Reason};
use wirerate_engine::encryption::InEffect;
use wirerate_engine::net::TcpStats;
use wirerate_engine::net::tls::Side;
use wirerate_engine::observe::{Observe, Observer, SessionEnd};
use wirerate_engine::optimizer::StreamChange;
use wirerate_engine::sender::SendConfig;
use wirerate_engine::summary::ReceiverSummary;
use wirerate_engine::tuner::StreamChoice;
use wirerate_engine::violation::ViolationKind;

use crate::metrics::{metrics, path_test_metrics, sender_metrics};
use crate::progress::{MOST_CHANGES, Progress};

/// Sets `cfg` up to be shown: the engine moves the returned progress's
/// position, and the agent's observer counts into the metrics and keeps
/// the stream choices with it. One call wires both halves, so that a
/// progress bar cannot be left reading a position nobody moves.
pub fn watch_send(cfg: &mut SendConfig) -> Arc<Progress> {
    let progress = Arc::new(Progress::default());
    cfg.progress = Arc::clone(&progress.transfer);
    cfg.observer = Shown::metrics()
        .with_progress(Arc::clone(&progress))
        .observe();
    progress
}

/// What the agent shows of a transfer. Metrics always; the rest on request.
#[derive(Debug, Default)]
pub struct Shown {
    progress: Option<Arc<Progress>>,
    /// Print each receiver session's summary; `Some(true)`: as JSON.
    print_json: Option<bool>,
    /// The pool's path-test listener: its sessions are tests, counted
    /// apart from the transfers a receiver's session metrics count.
    path_test_listener: bool,
}

impl Shown {
    /// Counts into the metrics and nothing else.
    pub fn metrics() -> Self {
        Self::default()
    }

    /// Counts into the metrics, its sessions as the path-test listener's.
    pub fn path_test_listener() -> Self {
        Self {
            path_test_listener: true,
            ..Self::default()
        }
    }

    /// Also moves `progress` as the sender's position moves.
    pub fn with_progress(mut self, progress: Arc<Progress>) -> Self {
        self.progress = Some(progress);
        self
    }

    /// Also prints each receiver session's summary on stdout.
    pub fn printing_summaries(mut self, json: bool) -> Self {
        self.print_json = Some(json);
        self
    }

    /// The handle a configuration carries.
    pub fn observe(self) -> Observe {
        Arc::new(self)
    }
}

impl Observer for Shown {
    fn streams_chosen(&self, choice: &StreamChoice) {
        if let Some(p) = &self.progress {
            // Once per run: retries keep the first choice.
            let _ = p.streams_chosen.set(choice.clone());
        }
    }

    fn streams_changed(&self, change: &StreamChange) {
        sender_metrics()
            .streams_added
            .inc_by(u64::from(change.to.saturating_sub(change.from)));
        if let Some(p) = &self.progress {
            let mut c = p.stream_changes.lock().unwrap_or_else(|e| e.into_inner());
            if c.len() < MOST_CHANGES {
                c.push(change.clone());
            }
        }
    }

    fn sent(&self, stream: u16, bytes: u64) {
        let m = sender_metrics();
        m.bytes_sent.inc_by(bytes);
        m.stream_bytes
            .with_label_values(&[&stream.to_string()])
            .inc_by(bytes);
    }

    fn packed(&self, codec: Codec, plain: u64, wire: u64) {
        let m = sender_metrics();
        m.packed_bytes
            .with_label_values(&[codec.as_str()])
            .inc_by(plain);
        m.packed_wire_bytes
            .with_label_values(&[codec.as_str()])
            .inc_by(wire);
    }

    fn compression_changed(&self, reason: Reason) {
        let m = sender_metrics();
        for r in Reason::ALL {
            m.compression
                .with_label_values(&[r.metric_label()])
                .set(i64::from(r == reason));
        }
    }

    fn in_flight(&self, delta: i64) {
        sender_metrics().bytes_in_flight.add(delta);
    }

    fn stream_failed(&self) {
        sender_metrics().stream_failures.inc();
    }

    fn connection_agreed(&self, side: Side, in_effect: InEffect) {
        let label = [in_effect.as_str()];
        match side {
            Side::Client => {
                sender_metrics().connections.with_label_values(&label).inc();
                if let Some(p) = &self.progress {
                    let _ = p.encryption.set(in_effect);
                }
            }
            Side::Server => metrics().connections.with_label_values(&label).inc(),
        }
    }

    fn tcp_sampled(&self, stream: u16, stats: &TcpStats) {
        let m = sender_metrics();
        let s = stream.to_string();
        m.stream_rtt_seconds
            .with_label_values(&[&s])
            .set(stats.rtt_ms / 1000.0);
        m.stream_retransmits
            .with_label_values(&[&s])
            .set(i64::from(stats.retransmits));
        m.stream_delivery_rate
            .with_label_values(&[&s])
            .set(i64::try_from(stats.delivery_rate).unwrap_or(i64::MAX));
    }

    fn resent(&self, blocks: u64) {
        sender_metrics().blocks_resent.inc_by(blocks);
    }

    fn send_session_ended(&self, end: SessionEnd) {
        sender_metrics()
            .sessions
            .with_label_values(&[end.metric_label()])
            .inc();
    }

    fn refused(&self, reason: &'static str) {
        metrics().rejected.with_label_values(&[reason]).inc();
    }

    fn session_opened(&self) {
        if self.path_test_listener {
            path_test_metrics().listener_sessions.inc();
            path_test_metrics().listener_sessions_active.inc();
        } else {
            metrics().sessions.inc();
            metrics().sessions_active.inc();
        }
    }

    fn session_closed(&self) {
        if self.path_test_listener {
            path_test_metrics().listener_sessions_active.dec();
        } else {
            metrics().sessions_active.dec();
        }
    }

    fn summarized(&self, summary: &ReceiverSummary) {
        if let Some(json) = self.print_json {
            crate::summary::print(summary, ReceiverSummary::render, json);
        }
    }

    fn written(&self, bytes: u64) {
        metrics().bytes_written.inc_by(bytes);
        metrics().blocks_written.inc();
    }

    fn discarded(&self, bytes: u64) {
        metrics().bytes_discarded.inc_by(bytes);
    }

    fn damaged(&self) {
        metrics().checksum_failures.inc();
    }

    fn unpack_failed(&self, codec: Codec) {
        metrics()
            .unpack_failures
            .with_label_values(&[codec.as_str()])
            .inc();
    }

    fn violation(&self, kind: ViolationKind) {
        metrics()
            .violations
            .with_label_values(&[kind.metric_label()])
            .inc();
    }

    fn file_done(&self, published: bool) {
        if published {
            metrics().files_completed.inc();
        } else {
            metrics().files_failed.inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_print_only_when_asked() {
        let shown = Shown::metrics();
        assert_eq!(shown.print_json, None);
        assert_eq!(
            Shown::metrics().printing_summaries(true).print_json,
            Some(true)
        );
    }

    #[test]
    fn the_optimizers_changes_reach_the_progress_bounded_and_the_metric() {
        let p = Arc::new(Progress::default());
        let shown = Shown::metrics().with_progress(Arc::clone(&p));
        let added = || sender_metrics().streams_added.get();
        let before = added();
        let change = |from, to| StreamChange {
            after_secs: 2.0,
            from,
            to,
            reason: "short".into(),
        };
        shown.streams_changed(&change(4, 6));
        assert!(added() >= before + 2);
        assert_eq!(*p.stream_changes.lock().unwrap(), [change(4, 6)]);
        for _ in 0..100 {
            shown.streams_changed(&change(6, 6));
        }
        assert_eq!(p.stream_changes.lock().unwrap().len(), MOST_CHANGES);
    }
}
