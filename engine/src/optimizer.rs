//! Adds data streams while a transfer runs, in the spirit of FTS3's
//! optimizer: the count `tuner` chose from the handshake's round trip and
//! the host's buffer limits is a guess, and what the path really carries
//! shows only once data flows. So, while the transfer is short of the
//! rate aimed at, the optimizer measures its rate, tries twice as many
//! streams (half as many again past half the aim), and keeps trying while
//! each step raises the rate; once a step does not (the path, the disk or
//! the CPU is the limit) or the bound is reached, it holds. Streams are only added: one removed would
//! have to drain first, and one too many costs little.
//!
//! No I/O: the sender feeds it the bytes acknowledged so far with the
//! time, carries out the additions it asks for, and says how many streams
//! it then has.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::tuner::MOST_CHOSEN;

/// The shortest settling time and measuring window: a rate over less
/// than a second is mostly noise of bursts and acknowledgement timing.
pub const SHORTEST: Duration = Duration::from_secs(1);
/// Settling lasts this many round trips when that is longer: slow start
/// doubles a stream's window each round trip from 10 segments, and a
/// window of 10 Gbit/s over 150 ms (190 MB, 130,000 segments) takes 14.
pub const SETTLE_ROUND_TRIPS: u32 = 16;
/// Measuring lasts this many round trips when that is longer.
pub const MEASURE_ROUND_TRIPS: u32 = 10;
/// The longest: a decision a minute apart is no longer about this path.
pub const LONGEST: Duration = Duration::from_secs(30);
/// A step must raise the rate by this share for another to follow.
pub const GAIN: f64 = 0.10;
/// The share of the aimed rate that counts as reaching it.
pub const REACHED: f64 = 0.9;

/// One addition, as recorded in the summary and the cluster's status.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StreamChange {
    /// Seconds since the session's data started flowing.
    pub after_secs: f64,
    /// Streams before.
    pub from: u16,
    /// Streams asked for.
    pub to: u16,
    /// What was measured, in words.
    pub reason: String,
}

/// What the optimizer wants done.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Open streams up to `change.to`, then call `handle_added`.
    Add(StreamChange),
    /// No more changes in this session, and why.
    Hold(String),
}

#[derive(Debug, Clone, PartialEq)]
enum Phase {
    /// Streams (new ones, or all at the start) leave slow start.
    Settling { until: Instant },
    /// The rate is measured from `from`, when `bytes` were acknowledged.
    Measuring { from: Instant, bytes: u64 },
    /// The shell is opening the streams asked for.
    Adding { from: u16 },
    /// Held: nothing more to decide.
    Done,
}

/// The optimizer of one session.
#[derive(Debug, Clone)]
pub struct Optimizer {
    started: Instant,
    streams: u16,
    most: u16,
    aim_bps: f64,
    settle: Duration,
    window: Duration,
    phase: Phase,
    /// The rate measured before the last addition, and with how many.
    before: Option<(u16, f64)>,
    out: Option<Decision>,
}

/// `now + d`, or `now` where that is past what an `Instant` holds.
fn later(now: Instant, d: Duration) -> Instant {
    now.checked_add(d).unwrap_or(now)
}

fn gbps(bps: f64) -> f64 {
    bps / 1e9
}

impl Optimizer {
    /// An optimizer for a session whose `streams` started flowing at
    /// `now`, over a path of round trip `rtt` (zero: unknown), aiming at
    /// `aim_bps`, with at most `most` streams.
    pub fn new(now: Instant, streams: u16, most: u16, aim_bps: f64, rtt: Duration) -> Self {
        let rtts = |n: u32| rtt.saturating_mul(n).clamp(SHORTEST, LONGEST);
        let settle = rtts(SETTLE_ROUND_TRIPS);
        Self {
            started: now,
            streams,
            most: most.max(streams),
            aim_bps,
            settle,
            window: rtts(MEASURE_ROUND_TRIPS),
            phase: Phase::Settling {
                until: later(now, settle),
            },
            before: None,
            out: None,
        }
    }

    /// How long the streams settle, and then how long the rate is
    /// measured, before each decision.
    pub fn period(&self) -> (Duration, Duration) {
        (self.settle, self.window)
    }

    /// Whether the optimizer has stopped deciding.
    pub fn is_done(&self) -> bool {
        self.phase == Phase::Done
    }

    /// When it next wants `handle_progress`: as settling ends, then as
    /// the measuring window closes (none while the shell adds streams or
    /// once held).
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.phase {
            Phase::Settling { until } => Some(until),
            Phase::Measuring { from, .. } => Some(later(from, self.window)),
            Phase::Adding { .. } | Phase::Done => None,
        }
    }

    /// `acked` bytes are acknowledged so far, at `now`.
    pub fn handle_progress(&mut self, now: Instant, acked: u64) {
        match self.phase {
            Phase::Settling { until } if now >= until => {
                self.phase = Phase::Measuring {
                    from: now,
                    bytes: acked,
                };
            }
            Phase::Measuring { from, bytes } => {
                let secs = now.saturating_duration_since(from);
                if secs >= self.window {
                    let bps = acked.saturating_sub(bytes) as f64 * 8.0 / secs.as_secs_f64();
                    self.decide(now, bps);
                }
            }
            _ => {}
        }
    }

    /// The streams asked for are open, or as many of them as connected:
    /// `streams` in all.
    pub fn handle_added(&mut self, now: Instant, streams: u16) {
        let Phase::Adding { from } = self.phase else {
            return;
        };
        if streams <= from {
            self.hold(format!(
                "no new data stream could connect; holding at {from}"
            ));
            return;
        }
        self.streams = streams;
        self.phase = Phase::Settling {
            until: later(now, self.settle),
        };
    }

    /// What to do next, once.
    pub fn poll(&mut self) -> Option<Decision> {
        self.out.take()
    }

    fn hold(&mut self, reason: String) {
        self.phase = Phase::Done;
        self.out = Some(Decision::Hold(reason));
    }

    fn decide(&mut self, now: Instant, bps: f64) {
        let n = self.streams;
        let carry = format!("{n} streams carry {:.2} Gbit/s", gbps(bps));
        let aim = format!("{:.1} Gbit/s aimed at", gbps(self.aim_bps));
        if bps >= REACHED * self.aim_bps {
            return self.hold(format!(
                "{carry}, {:.0}% of the {aim}",
                100.0 * bps / self.aim_bps
            ));
        }
        let mut versus = String::new();
        if let Some((m, before)) = self.before {
            let change = if before > 0.0 {
                100.0 * (bps / before - 1.0)
            } else {
                0.0
            };
            versus = format!(
                ", {:.0}% {} than {m} did ({:.2})",
                change.abs(),
                if change < 0.0 { "less" } else { "more" },
                gbps(before)
            );
            // Strictly more: a stalled transfer (nothing acknowledged
            // twice) is not grown again.
            let grew = bps > before * (1.0 + GAIN);
            if !grew {
                return self.hold(format!(
                    "{carry}{versus}: more streams do not raise the rate (the path, the disk or \
                     the CPU is the limit); holding at {n}"
                ));
            }
        }
        if n >= self.most {
            return self.hold(format!(
                "{carry}{versus}, short of the {aim}, but {n} is the most the tuner opens (at most \
                 {MOST_CHOSEN}, and two blocks of the sender's buffer each; --streams sets more, --buffer \
                 feeds more)"
            ));
        }
        // Far short of the aim, twice as many: at 150 ms a step takes
        // about four seconds, and a path that wants 16 streams where 4 were
        // chosen should not take four steps to get them.
        let step = if bps < self.aim_bps / 2.0 { n } else { n / 2 };
        let to = n.saturating_add(step.max(1)).min(self.most);
        self.before = Some((n, bps));
        self.phase = Phase::Adding { from: n };
        self.out = Some(Decision::Add(StreamChange {
            after_secs: now.saturating_duration_since(self.started).as_secs_f64(),
            from: n,
            to,
            reason: format!("{carry}{versus}, short of the {aim}: trying {to}"),
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GBIT: u64 = 1_000_000_000 / 8;

    /// Feeds half a second at a time at `rate` bytes a second until the
    /// optimizer decides.
    fn run_until_decided(
        o: &mut Optimizer,
        now: &mut Instant,
        acked: &mut u64,
        rate: u64,
    ) -> Decision {
        for _ in 0..100 {
            *now += Duration::from_millis(500);
            *acked += rate / 2;
            o.handle_progress(*now, *acked);
            if let Some(d) = o.poll() {
                return d;
            }
        }
        panic!("no decision in 50 s: {o:?}");
    }

    #[test]
    fn adds_streams_while_the_rate_grows_then_holds() {
        let mut now = Instant::now();
        let start = now;
        let mut acked = 0;
        let mut o = Optimizer::new(now, 4, 64, 10e9, Duration::from_millis(150));
        assert_eq!(
            o.period(),
            (Duration::from_millis(2400), Duration::from_millis(1500))
        );
        // It says when it next needs to be asked: settling ends, then the
        // window closes.
        assert_eq!(o.poll_timeout(), Some(start + Duration::from_millis(2400)));
        let settled = start + Duration::from_millis(2400);
        let mut probe = o.clone();
        probe.handle_progress(settled, 0);
        assert_eq!(
            probe.poll_timeout(),
            Some(settled + Duration::from_millis(1500))
        );
        // A window-limited path: each stream carries 0.25 Gbit/s.
        let Decision::Add(c) = run_until_decided(&mut o, &mut now, &mut acked, 4 * GBIT / 4) else {
            panic!()
        };
        assert_eq!((c.from, c.to), (4, 8), "{c:?}");
        assert!(c.reason.contains("4 streams carry 1.00 Gbit/s"), "{c:?}");
        // Not before the streams settled and a window was measured.
        assert!(c.after_secs >= 3.9, "{c:?}");
        assert!(now - start >= Duration::from_millis(3900));
        // Nothing more is decided while the shell connects.
        for _ in 0..10 {
            now += Duration::from_secs(1);
            acked += GBIT;
            o.handle_progress(now, acked);
            assert_eq!(o.poll(), None);
        }
        o.handle_added(now, 8);
        let Decision::Add(c) = run_until_decided(&mut o, &mut now, &mut acked, 6 * GBIT / 4) else {
            panic!()
        };
        assert_eq!((c.from, c.to), (8, 16), "{c:?}");
        assert!(c.reason.contains("50% more than 4 did"), "{c:?}");
        o.handle_added(now, 16);
        // Sixteen carry no more than eight: the limit is elsewhere.
        let Decision::Hold(why) = run_until_decided(&mut o, &mut now, &mut acked, 6 * GBIT / 4)
        else {
            panic!()
        };
        assert!(why.contains("0% more than 8 did"), "{why}");
        assert!(why.contains("holding at 16"), "{why}");
        assert!(o.is_done());
        for _ in 0..20 {
            now += Duration::from_secs(1);
            acked += 10 * GBIT;
            o.handle_progress(now, acked);
            assert_eq!(o.poll(), None);
        }
    }

    #[test]
    fn holds_at_the_aim_the_bound_or_when_nothing_connects() {
        let rtt = Duration::from_millis(1);
        // 9.5 of 10 Gbit/s: reached.
        let (mut now, mut acked) = (Instant::now(), 0);
        let mut o = Optimizer::new(now, 4, 64, 10e9, rtt);
        assert_eq!(o.period(), (SHORTEST, SHORTEST));
        let d = run_until_decided(&mut o, &mut now, &mut acked, 95 * GBIT / 10);
        assert!(
            matches!(&d, Decision::Hold(w) if w.contains("95% of the 10.0 Gbit/s")),
            "{d:?}"
        );
        // At the bound: said so, with what sets more.
        let (mut now, mut acked) = (Instant::now(), 0);
        let mut o = Optimizer::new(now, 15, 15, 10e9, rtt);
        let d = run_until_decided(&mut o, &mut now, &mut acked, GBIT);
        assert!(
            matches!(&d, Decision::Hold(w) if w.contains("--streams")),
            "{d:?}"
        );
        // Exactly half the aim: half as many again.
        let (mut now, mut acked) = (Instant::now(), 0);
        let mut o = Optimizer::new(now, 4, 64, 10e9, rtt);
        let d = run_until_decided(&mut o, &mut now, &mut acked, 5 * GBIT);
        assert!(
            matches!(&d, Decision::Add(c) if (c.from, c.to) == (4, 6)),
            "{d:?}"
        );
        // Past half the aim, half as many again.
        let (mut now, mut acked) = (Instant::now(), 0);
        let mut o = Optimizer::new(now, 4, 64, 10e9, rtt);
        let d = run_until_decided(&mut o, &mut now, &mut acked, 6 * GBIT);
        assert!(
            matches!(&d, Decision::Add(c) if (c.from, c.to) == (4, 6)),
            "{d:?}"
        );
        // The last step stops at the bound.
        let (mut now, mut acked) = (Instant::now(), 0);
        let mut o = Optimizer::new(now, 4, 5, 10e9, rtt);
        let d = run_until_decided(&mut o, &mut now, &mut acked, GBIT);
        assert!(matches!(&d, Decision::Add(c) if c.to == 5), "{d:?}");
        // None of the new streams connected.
        o.handle_added(now, 4);
        assert!(matches!(o.poll(), Some(Decision::Hold(w)) if w.contains("could connect")));
        // A rate that falls: held, said as less.
        let (mut now, mut acked) = (Instant::now(), 0);
        let mut o = Optimizer::new(now, 1, 64, 10e9, rtt);
        let d = run_until_decided(&mut o, &mut now, &mut acked, GBIT);
        assert!(
            matches!(&d, Decision::Add(c) if (c.from, c.to) == (1, 2)),
            "{d:?}"
        );
        o.handle_added(now, 2);
        let d = run_until_decided(&mut o, &mut now, &mut acked, GBIT / 2);
        assert!(
            matches!(&d, Decision::Hold(w) if w.contains("50% less than 1 did")),
            "{d:?}"
        );
    }

    #[test]
    fn a_stalled_transfer_is_not_grown_and_no_input_panics() {
        // Nothing acknowledged (a stalled receiver): 0 is below the aim,
        // and one step is tried; a second zero holds.
        let (mut now, mut acked) = (Instant::now(), 0);
        let mut o = Optimizer::new(now, 4, 64, 10e9, Duration::ZERO);
        assert!(matches!(
            run_until_decided(&mut o, &mut now, &mut acked, 0),
            Decision::Add(_)
        ));
        o.handle_added(now, 6);
        assert!(matches!(
            run_until_decided(&mut o, &mut now, &mut acked, 0),
            Decision::Hold(_)
        ));
        // Odd inputs: time going back, counters going back, huge values.
        for aim in [0.0, f64::NAN, f64::INFINITY, 1e9] {
            for most in [0, 1, u16::MAX] {
                let t = Instant::now();
                let mut o = Optimizer::new(t, u16::MAX, most, aim, Duration::MAX);
                for (dt, b) in [(0, u64::MAX), (5, 0), (1, u64::MAX), (u64::MAX / 4, 3)] {
                    let at = t.checked_add(Duration::from_secs(dt)).unwrap_or(t);
                    o.handle_progress(at, b);
                    let _ = o.poll();
                    o.handle_added(at, u16::MAX);
                }
            }
        }
    }
}
