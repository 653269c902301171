//! One sender/receiver pair as the coordinator sees it: its state, the
//! items it holds, and its rate, which decides who steals from whom.

use std::time::{Duration, Instant};

/// A pair's id, given by whoever runs the coordinator (never reused).
pub type PairId = u32;

/// An item's id: one piece of work handed to one pair.
pub type ItemId = u64;

/// Where a pair is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PairState {
    /// Takes work.
    Running,
    /// Scaling down: its unfinished work went back to the queue, and it
    /// was told to stop; writes it still has in flight may land.
    Leaving,
    /// Thought lost: its unacknowledged work went back to the queue. It
    /// may still write until its fence.
    Lost,
    /// Stopped, or past its fence: nothing it writes is accepted.
    Gone,
}

/// A pair's figures, for the Transfer's status.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PairView {
    /// Where it is.
    pub state: PairState,
    /// Bytes it made durable first (a block written again by another
    /// pair counts once, for the first).
    pub bytes: u64,
    /// Its rate since it was first handed work, bytes a second.
    pub rate: f64,
    /// Items it finished.
    pub chunks_done: u64,
}

#[derive(Debug)]
pub(super) struct Pair {
    pub(super) state: PairState,
    /// Items in the order handed out.
    pub(super) items: Vec<ItemId>,
    pub(super) bytes: u64,
    pub(super) chunks_done: u64,
    /// When it was first handed work: its rate counts from there.
    pub(super) since: Option<Instant>,
    /// For a lost pair: when its writes can no longer land.
    pub(super) fence: Option<Instant>,
}

impl Pair {
    pub(super) fn new() -> Self {
        Self {
            state: PairState::Running,
            items: Vec::new(),
            bytes: 0,
            chunks_done: 0,
            since: None,
            fence: None,
        }
    }

    /// Bytes a second since it was first handed work; `None` before it
    /// has a measure (no byte yet, or under a millisecond).
    pub(super) fn rate(&self, now: Instant) -> Option<f64> {
        let since = self.since?;
        let secs = now.saturating_duration_since(since).as_secs_f64();
        (self.bytes > 0 && secs >= Duration::from_millis(1).as_secs_f64())
            .then(|| self.bytes as f64 / secs)
    }

    pub(super) fn view(&self, now: Instant) -> PairView {
        PairView {
            state: self.state,
            bytes: self.bytes,
            rate: self.rate(now).unwrap_or(0.0),
            chunks_done: self.chunks_done,
        }
    }
}

/// The share of `remaining` blocks a thief takes from a victim: in
/// proportion to their rates, so that both finish together. Unknown
/// rates count as equal.
pub(super) fn thief_share(remaining: u64, thief: Option<f64>, victim: Option<f64>) -> u64 {
    let (t, v) = match (thief, victim) {
        (Some(t), Some(v)) if t + v > 0.0 => (t, v),
        _ => (1.0, 1.0),
    };
    let share = remaining as f64 * t / (t + v);
    // Truncation keeps at least the victim's own share with it.
    (share as u64).min(remaining)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_faster_thief_takes_more_and_unknown_rates_split_evenly() {
        assert_eq!(thief_share(100, Some(3.0), Some(1.0)), 75);
        assert_eq!(thief_share(100, Some(1.0), Some(3.0)), 25);
        assert_eq!(thief_share(100, None, Some(3.0)), 50);
        assert_eq!(thief_share(1, None, None), 0);
    }
}
