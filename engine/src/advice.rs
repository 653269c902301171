//! What a path test says to change: streams, socket buffers, congestion
//! control, and the host settings that cap them. No I/O: `probe` measures
//! and this decides, so every rule can be checked against made-up paths.

use serde::Serialize;

use crate::tuning::{SOCKET_BUFFER, STREAMS};

/// One phase of a path test, as measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PhaseFigures {
    /// Streams it used.
    pub streams: u16,
    /// Its rate over the whole phase, Gbit/s.
    pub gbps: f64,
    /// The path's round trip: the lowest any of its streams saw,
    /// milliseconds (the smoothed one includes the queues a bulk phase
    /// fills).
    pub rtt_ms: f64,
    /// Segments its streams sent again, together.
    pub retransmits: u64,
    /// `retransmits` as a share of the segments the phase sent.
    pub loss: f64,
    /// The largest send buffer the kernel granted one of its streams, bytes.
    pub send_buffer: u64,
}

/// What this host allows and uses.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HostLimits {
    /// net.ipv4.tcp_wmem's maximum, bytes (0: unknown).
    pub tcp_wmem_max: u64,
    /// net.ipv4.tcp_rmem's maximum, bytes (0: unknown).
    pub tcp_rmem_max: u64,
    /// The congestion control the test ran with.
    pub congestion: String,
    /// Those the kernel offers.
    pub available: Vec<String>,
    /// Whether an idle connection falls back to slow start
    /// (net.ipv4.tcp_slow_start_after_idle); `None`: unknown.
    pub slow_start_after_idle: Option<bool>,
}

/// What to use on this path, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Advice {
    /// Streams to use.
    pub streams: u16,
    /// The buffer each stream needs for the rate seen, with the kernel's
    /// overhead: what the buffer maximums should allow at least, bytes.
    pub socket_buffer: u64,
    /// Congestion control to use.
    pub congestion: String,
    /// Why, one finding each.
    pub reasons: Vec<String>,
    /// Host settings to change (on both ends), as commands.
    pub sysctl: Vec<String>,
}

/// The kernel keeps about half of a socket buffer for its own bookkeeping
/// (net.ipv4.tcp_adv_win_scale), so a window of W needs a buffer of 2W.
pub(crate) const BUFFER_OVERHEAD: f64 = 2.0;

/// More streams are worth it when they raise the rate by at least this.
const WORTH_IT: f64 = 1.1;

/// A stream running at this share of what its window allows is held by
/// the window.
const AT_THE_WINDOW: f64 = 0.8;

/// Loss above this share of segments is worth a congestion control that
/// does not halve its rate on every loss.
const LOSSY: f64 = 1e-4;

/// The sysctl that shrinks an idle TCP connection's window: halved for
/// each retransmission timeout it stays idle, down to the initial window
/// (on by default in Linux; `tcp_cwnd_restart`).
pub const SLOW_START_AFTER_IDLE: &str = "net.ipv4.tcp_slow_start_after_idle";

/// Round trips from which slow start after a pause costs more than a
/// moment: ramping back to full rate takes a dozen of them.
const LONG_PATH_MS: f64 = 10.0;

/// The largest buffer maximum advised: the kernel's limits are 32-bit.
const MAX_BUFFER: u64 = SOCKET_BUFFER.max;

/// Whether `p`'s streams each ran at what their granted buffer allows
/// over `rtt_s`.
fn window_limited(p: &PhaseFigures, rtt_s: f64) -> bool {
    if p.send_buffer == 0 || rtt_s <= 0.0 || p.streams == 0 {
        return false;
    }
    let window_gbps = p.send_buffer as f64 / BUFFER_OVERHEAD * 8.0 / rtt_s / 1e9;
    p.gbps / f64::from(p.streams) >= AT_THE_WINDOW * window_gbps
}

fn raise_to(want: u64) -> String {
    format!(
        "sysctl -w net.ipv4.tcp_rmem='4096 131072 {want}' net.ipv4.tcp_wmem='4096 16384 {want}' \
         net.core.rmem_max={want} net.core.wmem_max={want}"
    )
}

/// The advice for a path that gave `one` with one stream and `many` with
/// more, on a host with `host`'s limits.
pub fn advise(one: &PhaseFigures, many: &PhaseFigures, host: &HostLimits) -> Advice {
    let mut reasons = Vec::new();
    let mut sysctl = Vec::new();
    let gain = if one.gbps > 0.0 {
        many.gbps / one.gbps
    } else {
        1.0
    };
    let streams = if gain >= 0.75 * f64::from(many.streams) && many.streams > 1 {
        let more = many.streams.saturating_mul(2).min(STREAMS.max as u16);
        reasons.push(format!(
            "{} streams carried {gain:.1}x what one did, nearly in proportion: the limit is per stream \
             (its window or its share of a loss), so more streams may carry more still; try {more}",
            many.streams
        ));
        more
    } else if gain >= WORTH_IT {
        reasons.push(format!(
            "{} streams carried {gain:.1}x what one did",
            many.streams
        ));
        many.streams
    } else {
        reasons.push(format!(
            "{} streams carried no more than one ({gain:.2}x): the path itself, not a stream's window, \
             is the limit, so one stream is enough",
            many.streams
        ));
        1
    };
    let best = one.gbps.max(many.gbps);
    let rtt_ms = [one.rtt_ms, many.rtt_ms]
        .into_iter()
        .filter(|r| r.is_finite() && *r > 0.0)
        .fold(f64::INFINITY, f64::min);
    let rtt_s = if rtt_ms.is_finite() {
        rtt_ms / 1e3
    } else {
        0.0
    };
    let bdp = best * 1e9 / 8.0 * rtt_s;
    // Never below what `--socket-buffer` takes: a short path's tiny
    // bandwidth-delay product (a few KiB on loopback) is no size to use.
    let socket_buffer = (bdp / f64::from(streams) * BUFFER_OVERHEAD)
        .ceil()
        .clamp(SOCKET_BUFFER.min as f64, MAX_BUFFER as f64) as u64;
    let cap = match (host.tcp_wmem_max, host.tcp_rmem_max) {
        (0, r) => r,
        (w, 0) => w,
        (w, r) => w.min(r),
    };
    let fmt = crate::units::fmt_bytes;
    let held = [one, many].into_iter().find(|p| window_limited(p, rtt_s));
    if cap > 0 && socket_buffer > cap {
        reasons.push(format!(
            "at {best:.2} Gbit/s over {:.1} ms each of {streams} streams needs a {} buffer, more than \
             this host's TCP buffer maximum ({})",
            rtt_s * 1e3,
            fmt(socket_buffer),
            fmt(cap)
        ));
        sysctl.push(raise_to(socket_buffer.next_power_of_two().min(MAX_BUFFER)));
    } else if let Some(p) = held {
        let each = p.gbps / f64::from(p.streams);
        if cap > 0 && p.send_buffer * 2 < cap {
            reasons.push(format!(
                "{} stream(s) ran at {each:.2} Gbit/s each, what the {} buffer the kernel had granted \
                 allows over {:.1} ms, and it may grow to {}: a longer probe (--seconds) lets it",
                p.streams,
                fmt(p.send_buffer),
                rtt_s * 1e3,
                fmt(cap)
            ));
        } else {
            let want = (p.send_buffer.max(cap) * 4)
                .next_power_of_two()
                .min(MAX_BUFFER);
            reasons.push(format!(
                "{} stream(s) ran at {each:.2} Gbit/s each, what a {} buffer allows over {:.1} ms: the \
                 window, not the path, held them back; raise the buffer maximums and probe again",
                p.streams,
                fmt(p.send_buffer),
                rtt_s * 1e3
            ));
            sysctl.push(raise_to(want));
        }
    }
    let congestion = if many.loss > LOSSY
        && host.congestion != "bbr"
        && host.available.iter().any(|c| c == "bbr")
    {
        reasons.push(format!(
            "the streams lost {:.3}% of their segments ({} sent again) and {} backs off on every loss; \
             bbr paces to the path's rate instead",
            many.loss * 100.0,
            many.retransmits,
            host.congestion
        ));
        "bbr".to_string()
    } else {
        host.congestion.clone()
    };
    if host.slow_start_after_idle == Some(true) && rtt_ms.is_finite() && rtt_ms >= LONG_PATH_MS {
        reasons.push(format!(
            "{SLOW_START_AFTER_IDLE} is on: a stream that pauses (the next file, a checkpoint's sync, a slow \
             read) has its window halved for every retransmission timeout the pause lasts, down to 10 \
             segments, and grows it back one round trip of {rtt_ms:.1} ms at a time"
        ));
        sysctl.push(format!("sysctl -w {SLOW_START_AFTER_IDLE}=0"));
    }
    Advice {
        streams,
        socket_buffer,
        congestion,
        reasons,
        sysctl,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phase(streams: u16, gbps: f64) -> PhaseFigures {
        PhaseFigures {
            streams,
            gbps,
            rtt_ms: 150.0,
            retransmits: 0,
            loss: 0.0,
            send_buffer: 256 << 20,
        }
    }

    fn host() -> HostLimits {
        HostLimits {
            tcp_wmem_max: 256 << 20,
            tcp_rmem_max: 256 << 20,
            congestion: "cubic".into(),
            available: vec!["reno".into(), "cubic".into(), "bbr".into()],
            slow_start_after_idle: Some(false),
        }
    }

    #[test]
    fn streams_follow_what_they_gained() {
        // In proportion: the limit is per stream, so try twice as many.
        assert_eq!(advise(&phase(1, 1.0), &phase(8, 7.0), &host()).streams, 16);
        // Some gain: keep what was tried.
        assert_eq!(advise(&phase(1, 1.0), &phase(8, 3.0), &host()).streams, 8);
        // None: one is enough.
        let a = advise(&phase(1, 9.0), &phase(8, 9.3), &host());
        assert_eq!(a.streams, 1);
        assert!(a.reasons[0].contains("one stream is enough"), "{a:?}");
        // Never past the bound every stream count is checked against.
        assert_eq!(
            advise(&phase(1, 1.0), &phase(200, 190.0), &host()).streams,
            STREAMS.max as u16
        );
    }

    #[test]
    fn a_host_whose_buffers_cannot_hold_the_window_is_told_what_to_set() {
        // 10 Gbit/s over 150 ms is 187.5 MB in flight: 4 streams (twice
        // what one carried) need 94 MB each with the kernel's overhead,
        // past a 4 MiB maximum.
        let small = HostLimits {
            tcp_wmem_max: 4 << 20,
            tcp_rmem_max: 6 << 20,
            ..host()
        };
        let a = advise(&phase(1, 5.0), &phase(4, 10.0), &small);
        assert_eq!(a.socket_buffer, 93_750_000);
        assert_eq!(a.sysctl.len(), 1);
        assert!(a.sysctl[0].contains("134217728"), "{:?}", a.sysctl);
        // The same path on a host that allows it: nothing to set.
        assert!(
            advise(&phase(1, 5.0), &phase(4, 10.0), &host())
                .sysctl
                .is_empty()
        );
    }

    #[test]
    fn streams_held_by_their_window_are_named_and_the_cap_raised() {
        // A 4 MiB maximum over 150 ms: 2 MiB usable, 0.11 Gbit/s a stream,
        // whatever the path could carry. The rate seen fits the cap, so
        // only the window rule can tell.
        let capped = HostLimits {
            tcp_wmem_max: 4 << 20,
            tcp_rmem_max: 4 << 20,
            ..host()
        };
        let at = |streams, gbps| PhaseFigures {
            send_buffer: 4 << 20,
            ..phase(streams, gbps)
        };
        let a = advise(&at(1, 0.11), &at(8, 0.88), &capped);
        assert!(
            a.reasons.iter().any(|r| r.contains("held them back")),
            "{a:?}"
        );
        assert_eq!(a.sysctl, [raise_to(16 << 20)]);
        // Granted far below what the host allows: autotuning had not grown
        // the buffer yet, so a longer probe, not a sysctl.
        let a = advise(&at(1, 0.11), &at(8, 0.88), &host());
        assert!(a.reasons.iter().any(|r| r.contains("--seconds")), "{a:?}");
        assert!(a.sysctl.is_empty(), "{a:?}");
    }

    #[test]
    fn no_round_trip_measured_advises_the_least_buffer_and_no_panic() {
        let blind = PhaseFigures {
            rtt_ms: f64::INFINITY,
            ..phase(1, 1.0)
        };
        let a = advise(&blind, &blind, &host());
        assert_eq!(a.socket_buffer, SOCKET_BUFFER.min);
        assert!(a.sysctl.is_empty());
    }

    // Found by a probe of loopback: 1 Gbit/s over 20 us is 2.5 KB in
    // flight, and the advice was a buffer of 5 KB, which
    // `--socket-buffer` refuses and the kernel would raise anyway.
    #[test]
    fn the_advised_buffer_is_one_that_can_be_set() {
        let near = |streams, gbps| PhaseFigures {
            rtt_ms: 0.02,
            ..phase(streams, gbps)
        };
        let a = advise(&near(1, 1.0), &near(8, 1.0), &host());
        assert_eq!(a.socket_buffer, SOCKET_BUFFER.min);
        SOCKET_BUFFER.check(a.socket_buffer.into()).unwrap();
    }

    #[test]
    fn slow_start_after_idle_is_named_on_a_long_path_only() {
        let on = HostLimits {
            slow_start_after_idle: Some(true),
            ..host()
        };
        let a = advise(&phase(1, 5.0), &phase(4, 10.0), &on);
        assert_eq!(a.sysctl, ["sysctl -w net.ipv4.tcp_slow_start_after_idle=0"]);
        assert!(
            a.reasons.iter().any(|r| r.contains("window halved")),
            "{a:?}"
        );
        // Off, or unknown: nothing to say.
        assert!(
            advise(&phase(1, 5.0), &phase(4, 10.0), &host())
                .sysctl
                .is_empty()
        );
        let unknown = HostLimits {
            slow_start_after_idle: None,
            ..host()
        };
        assert!(
            advise(&phase(1, 5.0), &phase(4, 10.0), &unknown)
                .sysctl
                .is_empty()
        );
        // Within a rack a ramp is over in a millisecond.
        let near = |streams, gbps| PhaseFigures {
            rtt_ms: 0.2,
            ..phase(streams, gbps)
        };
        assert!(advise(&near(1, 5.0), &near(4, 10.0), &on).sysctl.is_empty());
    }

    #[test]
    fn loss_suggests_bbr_only_where_it_is_offered_and_not_in_use() {
        let lossy = PhaseFigures {
            retransmits: 400,
            loss: 1e-3,
            ..phase(4, 2.0)
        };
        assert_eq!(advise(&phase(1, 1.0), &lossy, &host()).congestion, "bbr");
        let no_bbr = HostLimits {
            available: vec!["reno".into(), "cubic".into()],
            ..host()
        };
        assert_eq!(advise(&phase(1, 1.0), &lossy, &no_bbr).congestion, "cubic");
        // A few retransmits of slow start's overshoot are not loss.
        let overshoot = PhaseFigures {
            retransmits: 3,
            loss: 1e-5,
            ..phase(4, 2.0)
        };
        assert_eq!(
            advise(&phase(1, 1.0), &overshoot, &host()).congestion,
            "cubic"
        );
    }
}
