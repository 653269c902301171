//! The write budget: what the operator writes to the API server, and when.
//! Pure: fed statuses, positions and `now`, it does no I/O.
//!
//! A Transfer costs a bounded number of writes over its life: queued,
//! scheduled, one refresh per interval while it runs (the stall mark) or
//! waits (its place in line), and its verdict. Places in line are shown
//! exactly for the first [`EXACT_POSITIONS`] of a pool's queue and as a
//! coarse upper bound beyond (20, 50, 100, 200, 500, ...), so a queue of a
//! thousand that moves by one rewrites a handful of statuses, not a
//! thousand. On top, the operator's writes as a whole go through one token
//! bucket ([`WriteBudget`]) whose rate a flag sets: writes that change what
//! a Transfer is (its phase, its agents, its conditions) wait for their
//! turn; refreshes give way to them and come later.

use std::time::{Duration, Instant};

use wirerate_crds::TransferStatus;

/// Writes per second the operator makes at most, unless told otherwise.
pub const DEFAULT_WRITES_PER_SECOND: u32 = 200;

/// Places in line shown exactly; beyond them, a coarse upper bound.
pub const EXACT_POSITIONS: i32 = 10;

/// The shortest time between two writes of one Transfer's place in line
/// alone.
pub const POSITION_INTERVAL: Duration = Duration::from_secs(10);

/// What a write does, for its turn in the budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// Changes what a Transfer is: its phase, agents, conditions; or an
    /// object it needs (its token, its grant, the finalizer).
    Change,
    /// Only refreshes a figure the next write would refresh anyway: a
    /// place in line, the stall mark.
    Refresh,
}

/// The budget's answer to a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Write now.
    Now,
    /// Write after this wait (the turn is taken).
    After(Duration),
    /// Do not write; ask again after this long.
    Later(Duration),
}

/// A token bucket of writes. Changes take a token each, waiting in turn
/// when there is none; refreshes take one only while the bucket is at least
/// half full, so that they never delay a change.
#[derive(Clone, Debug)]
pub struct WriteBudget {
    per_second: f64,
    burst: f64,
    /// Below zero: writes promised to changes already waiting.
    tokens: f64,
    at: Option<Instant>,
}

impl WriteBudget {
    /// `per_second` writes a second (at least one), a second's worth at once.
    pub fn new(per_second: u32) -> Self {
        let per_second = f64::from(per_second.max(1));
        Self {
            per_second,
            burst: per_second,
            tokens: per_second,
            at: None,
        }
    }

    /// Writes a second.
    pub fn per_second(&self) -> f64 {
        self.per_second
    }

    /// Asks for one write of `class` at `now`.
    pub fn admit(&mut self, class: Class, now: Instant) -> Admit {
        if let Some(at) = self.at {
            let earned = now.saturating_duration_since(at).as_secs_f64() * self.per_second;
            self.tokens = (self.tokens + earned).min(self.burst);
        }
        self.at = Some(now);
        match class {
            Class::Change => {
                self.tokens -= 1.0;
                if self.tokens >= 0.0 {
                    Admit::Now
                } else {
                    Admit::After(Duration::from_secs_f64(-self.tokens / self.per_second))
                }
            }
            Class::Refresh => {
                let reserve = self.burst / 2.0;
                if self.tokens - 1.0 >= reserve {
                    self.tokens -= 1.0;
                    Admit::Now
                } else {
                    let short = reserve + 1.0 - self.tokens;
                    Admit::Later(Duration::from_secs_f64(short / self.per_second).max(SECOND))
                }
            }
        }
    }
}

const SECOND: Duration = Duration::from_secs(1);

/// The place in line a status shows for the exact place `exact` (1 is
/// next): itself up to [`EXACT_POSITIONS`], else the next of 20, 50, 100,
/// 200, 500, 1000, ... at or above it, so "50" reads "at most 50th".
pub fn shown_position(exact: i32) -> i32 {
    if exact <= EXACT_POSITIONS {
        return exact;
    }
    let mut step: i64 = 10;
    loop {
        for m in [2, 5, 10] {
            let bound = step * m;
            if i64::from(exact) <= bound {
                return i32::try_from(bound).unwrap_or(i32::MAX);
            }
        }
        step *= 10;
    }
}

/// Of a status write that `old` would become `new`: None when nothing the
/// operator owns changes; else whether it changes what the Transfer is, or
/// only refreshes its place in line or its stall mark.
pub fn classify(old: &TransferStatus, new: &TransferStatus) -> Option<Class> {
    if old == new {
        return None;
    }
    let figures_aside = |s: &TransferStatus| TransferStatus {
        queue_position: None,
        last_moved: None,
        ..s.clone()
    };
    // The first place in line goes with the first status; one that
    // appears or goes goes with a change of phase.
    let position_came_or_went = old.queue_position.is_some() != new.queue_position.is_some();
    if figures_aside(old) == figures_aside(new) && !position_came_or_went {
        Some(Class::Refresh)
    } else {
        Some(Class::Change)
    }
}

/// Whether a status that differs from the last written only by its place
/// in line may be written, `since` after the last such write of this
/// Transfer (None: none since the operator started); else how long to
/// wait.
pub fn position_due(since: Option<Duration>) -> Result<(), Duration> {
    match since {
        Some(s) if s < POSITION_INTERVAL => Err(POSITION_INTERVAL - s),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wirerate_crds::TransferPhase;

    // Issue 39 changed what queuePosition means; `kubectl explain` must say
    // so, in the figures this module uses.
    #[test]
    fn the_crd_says_what_a_place_in_line_means() {
        use kube::CustomResourceExt;
        let crd = serde_json::to_value(wirerate_crds::Transfer::crd()).unwrap();
        let about = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
            ["properties"]["queuePosition"]["description"]
            .as_str()
            .unwrap()
            .to_owned();
        let coarse = shown_position(EXACT_POSITIONS + 1);
        for says in [
            format!("Exact for the first {EXACT_POSITIONS};"),
            format!("coarse upper bound ({coarse},"),
            format!("at most every {} s", POSITION_INTERVAL.as_secs()),
        ] {
            let flat = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
            assert!(
                flat(&about).contains(&flat(&says)),
                "{about:?} says no {says:?}"
            );
        }
    }

    #[test]
    fn places_are_exact_at_the_front_and_coarse_behind() {
        let shown: Vec<i32> = [
            1, 2, 10, 11, 20, 21, 50, 51, 100, 101, 499, 500, 501, 1000, 1001,
        ]
        .into_iter()
        .map(shown_position)
        .collect();
        assert_eq!(
            shown,
            [
                1, 2, 10, 20, 20, 50, 50, 100, 100, 200, 500, 500, 1000, 1000, 2000
            ]
        );
        assert_eq!(shown_position(i32::MAX), i32::MAX);
    }

    // The storm found on a real API server: every queued Transfer's place
    // was rewritten on every change. A Transfer that moves from the back of
    // a queue of a thousand to its front changes what it shows 16 times,
    // whatever the path, and no more often than every POSITION_INTERVAL.
    #[test]
    fn a_walk_through_a_queue_of_a_thousand_shows_few_places() {
        let mut shown = Vec::new();
        for exact in (1..=1000).rev() {
            let s = shown_position(exact);
            if shown.last() != Some(&s) {
                shown.push(s);
            }
        }
        assert_eq!(shown.len(), 16, "{shown:?}");
        assert_eq!(position_due(None), Ok(()));
        assert_eq!(
            position_due(Some(Duration::from_secs(4))),
            Err(Duration::from_secs(6))
        );
        assert_eq!(position_due(Some(POSITION_INTERVAL)), Ok(()));
    }

    #[test]
    fn a_change_of_phase_is_a_change_and_a_new_place_a_refresh() {
        let queued = TransferStatus {
            phase: Some(TransferPhase::Queued),
            queue_position: Some(40),
            ..Default::default()
        };
        assert_eq!(classify(&queued, &queued), None);
        let moved = TransferStatus {
            queue_position: Some(3),
            ..queued.clone()
        };
        assert_eq!(classify(&queued, &moved), Some(Class::Refresh));
        let running = TransferStatus {
            phase: Some(TransferPhase::Running),
            queue_position: None,
            ..queued.clone()
        };
        assert_eq!(classify(&queued, &running), Some(Class::Change));
        // The first status, with its first place in line.
        assert_eq!(
            classify(&TransferStatus::default(), &queued),
            Some(Class::Change)
        );
    }

    #[test]
    fn changes_wait_their_turn_and_refreshes_give_way() {
        let t0 = Instant::now();
        let mut b = WriteBudget::new(10);
        // A second's worth at once; refreshes only while half is left.
        for _ in 0..5 {
            assert_eq!(b.admit(Class::Refresh, t0), Admit::Now);
        }
        assert!(matches!(b.admit(Class::Refresh, t0), Admit::Later(_)));
        for _ in 0..5 {
            assert_eq!(b.admit(Class::Change, t0), Admit::Now);
        }
        // Empty: changes queue up, a tenth of a second apart.
        let wait = |a: Admit| match a {
            Admit::After(d) => d.as_millis(),
            other => panic!("{other:?}"),
        };
        assert_eq!(wait(b.admit(Class::Change, t0)), 100);
        assert_eq!(wait(b.admit(Class::Change, t0)), 200);
        // Refreshes wait until the changes are through and half is back.
        assert!(matches!(b.admit(Class::Refresh, t0), Admit::Later(d) if d >= SECOND));
        let later = t0 + Duration::from_secs(2);
        assert_eq!(b.admit(Class::Refresh, later), Admit::Now);
    }

    #[test]
    fn the_rate_over_a_long_run_is_the_rate_asked_for() {
        let t0 = Instant::now();
        let mut b = WriteBudget::new(50);
        let mut last = Duration::ZERO;
        for _ in 0..1050 {
            if let Admit::After(d) = b.admit(Class::Change, t0) {
                last = d;
            }
        }
        // 50 at once, the other 1000 over 20 s.
        assert_eq!(last, Duration::from_secs(20));
        assert_eq!(WriteBudget::new(0).per_second(), 1.0);
    }
}
