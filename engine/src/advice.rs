//! What a path test says to change: streams, socket buffers, congestion
//! control, and the host settings that cap them. No I/O: `probe` measures
//! and this decides, so every rule can be checked against made-up paths.

use serde::Serialize;

use crate::tuning::STREAMS;

/// One phase of a path test, as measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PhaseFigures {
    /// Streams it used.
    pub streams: u16,
    /// Its rate over the whole phase, Gbit/s.
    pub gbps: f64,
    /// The lowest smoothed round trip among its streams, milliseconds.
    pub rtt_ms: f64,
    /// Segments its streams sent again, together.
    pub retransmits: u64,
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
}

/// What to use on this path, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Advice {
    /// Streams to use.
    pub streams: u16,
    /// The window each stream needs for the rate seen, with the kernel's
    /// overhead: what the buffer maximums should allow, bytes.
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
const BUFFER_OVERHEAD: f64 = 2.0;

/// More streams are worth it when they raise the rate by at least this.
const WORTH_IT: f64 = 1.1;

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
    let rtt_s = one.rtt_ms.min(many.rtt_ms).max(0.0) / 1e3;
    let bdp = best * 1e9 / 8.0 * rtt_s;
    let socket_buffer = (bdp / f64::from(streams) * BUFFER_OVERHEAD).ceil() as u64;
    let cap = match (host.tcp_wmem_max, host.tcp_rmem_max) {
        (0, r) => r,
        (w, 0) => w,
        (w, r) => w.min(r),
    };
    if cap > 0 && socket_buffer > cap {
        reasons.push(format!(
            "at {best:.2} Gbit/s over {:.1} ms each of {streams} streams needs a {} buffer, more than \
             this host's TCP buffer maximum ({})",
            rtt_s * 1e3,
            crate::units::fmt_bytes(socket_buffer),
            crate::units::fmt_bytes(cap)
        ));
        let want = socket_buffer.next_power_of_two();
        sysctl.push(format!(
            "sysctl -w net.ipv4.tcp_rmem='4096 131072 {want}' net.ipv4.tcp_wmem='4096 16384 {want}' \
             net.core.rmem_max={want} net.core.wmem_max={want}"
        ));
    } else if one.send_buffer > 0
        && one.rtt_ms > 0.0
        && one.send_buffer as f64 / BUFFER_OVERHEAD * 8.0 / rtt_s / 1e9 < one.gbps * WORTH_IT
    {
        reasons.push(format!(
            "one stream ran as fast as the {} send buffer the kernel had granted it allows over {:.1} ms: \
             its window, not the path, held it back",
            crate::units::fmt_bytes(one.send_buffer),
            rtt_s * 1e3
        ));
    }
    let congestion = if many.retransmits > 0
        && host.congestion != "bbr"
        && host.available.iter().any(|c| c == "bbr")
    {
        reasons.push(format!(
            "the streams lost segments ({} sent again) and {} backs off on every loss; bbr paces to the \
             path's rate instead",
            many.retransmits, host.congestion
        ));
        "bbr".to_string()
    } else {
        host.congestion.clone()
    };
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
            send_buffer: 64 << 20,
        }
    }

    fn host() -> HostLimits {
        HostLimits {
            tcp_wmem_max: 256 << 20,
            tcp_rmem_max: 256 << 20,
            congestion: "cubic".into(),
            available: vec!["reno".into(), "cubic".into(), "bbr".into()],
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
    fn a_stream_held_by_its_granted_buffer_is_named() {
        // 4 MiB granted, half usable, over 150 ms: 0.11 Gbit/s at most.
        let held = PhaseFigures {
            send_buffer: 4 << 20,
            ..phase(1, 0.11)
        };
        let a = advise(&held, &phase(8, 0.85), &host());
        assert!(a.reasons.iter().any(|r| r.contains("its window")), "{a:?}");
    }

    #[test]
    fn loss_suggests_bbr_only_where_it_is_offered_and_not_in_use() {
        let lossy = PhaseFigures {
            retransmits: 40,
            ..phase(4, 2.0)
        };
        assert_eq!(advise(&phase(1, 1.0), &lossy, &host()).congestion, "bbr");
        let no_bbr = HostLimits {
            available: vec!["reno".into(), "cubic".into()],
            ..host()
        };
        assert_eq!(advise(&phase(1, 1.0), &lossy, &no_bbr).congestion, "cubic");
        // Without loss the congestion control in use stays.
        assert_eq!(
            advise(&phase(1, 1.0), &phase(4, 2.0), &host()).congestion,
            "cubic"
        );
    }
}
