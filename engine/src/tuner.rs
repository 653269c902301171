//! The per-link tuner: how many data streams a transfer opens when the
//! user does not fix the number. One stream carries at most its window
//! per round trip, and the window is capped by the TCP buffer maximums
//! (net.ipv4.tcp_wmem / tcp_rmem) or an explicit socket buffer; so on a
//! long path of an untuned host (Debian's 4 MiB over 150 ms: about 0.1
//! Gbit/s a stream) the default streams carry a fraction of the link,
//! and more of them carry more. No I/O: the sender measures the round
//! trip of its control connection's TCP handshake and the host's limits,
//! and this decides.

use std::time::Duration;

use serde::Serialize;

use crate::advice::BUFFER_OVERHEAD;
use crate::tuning::STREAMS;
use crate::units::fmt_bytes;

/// The rate aimed at when the transfer has no --max-rate: a 10 Gbit/s
/// link, the smallest a DTN is given today.
pub const AIM_BPS: f64 = 10e9;

/// The most streams the tuner opens by itself: each is a connection and
/// threads on both hosts, and a receiver takes only so many handshakes
/// from one address at once. More can be asked for with --streams.
pub const MOST_CHOSEN: u16 = 64;

/// What the sender knows of the link when it chooses.
#[derive(Debug, Clone, PartialEq)]
pub struct Link {
    /// Round trip of the control connection's TCP handshake.
    pub rtt: Duration,
    /// The buffer one stream may use, bytes: the explicit socket buffer,
    /// else the smaller TCP buffer maximum (0: unknown).
    pub buffer: u64,
    /// Whether `buffer` is an explicit socket buffer (autotuning off).
    pub explicit: bool,
    /// The rate to aim for, bits per second.
    pub aim_bps: f64,
    /// The streams the sender's buffer can feed, two blocks each.
    pub most: u16,
}

/// The streams chosen, and why, in words for the summary.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StreamChoice {
    /// Streams to open.
    pub streams: u16,
    /// Why that many.
    pub reason: String,
}

/// Round trips past this are not a measurement: the kernel's "no sample"
/// (`~0U` microseconds) reads as 4294967 ms.
const MAX_RTT_MS: f64 = 10_000.0;

/// The round trip to tune for, from what TCP_INFO said of a connection
/// just made: the lowest it saw, unless the kernel has no sample (a SYN
/// sent again without timestamps) or it is above the smoothed one; then
/// the smoothed one; else none (zero: unknown).
pub fn round_trip(min_rtt_ms: f64, rtt_ms: f64) -> Duration {
    let sample = |ms: f64| (ms > 0.0 && ms < MAX_RTT_MS).then_some(ms);
    sample(min_rtt_ms)
        .filter(|m| *m <= rtt_ms)
        .or(sample(rtt_ms))
        .map_or(Duration::ZERO, |ms| Duration::from_secs_f64(ms / 1e3))
}

/// The most one stream carries over `rtt` with a `buffer`-byte socket
/// buffer, bits per second: its window (half the buffer, the rest is the
/// kernel's bookkeeping) once per round trip.
pub fn stream_ceiling_bps(buffer: u64, rtt: Duration) -> Option<f64> {
    (buffer > 0 && !rtt.is_zero())
        .then(|| buffer as f64 / BUFFER_OVERHEAD * 8.0 / rtt.as_secs_f64())
}

/// The most streams the tuner (and then the optimizer) opens by itself
/// when the sender's buffer feeds `fed` and the default is `floor`.
pub fn most_opened(fed: u16, floor: u16) -> u16 {
    fed.max(floor).min(MOST_CHOSEN.min(STREAMS.max as u16))
}

/// Streams for `link`: at least `floor` (the default), more when the
/// windows of `floor` streams cannot carry the aimed rate, and never more
/// than the buffer can feed or `MOST_CHOSEN`.
pub fn choose_streams(link: &Link, floor: u16) -> StreamChoice {
    let floor = floor.max(1);
    let ms = link.rtt.as_secs_f64() * 1e3;
    let Some(per) = stream_ceiling_bps(link.buffer, link.rtt) else {
        return StreamChoice {
            streams: floor,
            reason: format!(
                "{floor}, the default: the round trip or the TCP buffer maximum is unknown"
            ),
        };
    };
    let gbps = |bps: f64| bps / 1e9;
    let carries = format!(
        "over {ms:.1} ms one stream's {} buffer carries about {:.2} Gbit/s",
        fmt_bytes(link.buffer),
        gbps(per)
    );
    let need = (link.aim_bps / per).ceil().min(f64::from(u16::MAX)) as u16;
    if need <= floor {
        return StreamChoice {
            streams: floor,
            reason: format!(
                "{floor}, the default: {carries}, so {floor} carry the {:.1} Gbit/s aimed at",
                gbps(link.aim_bps)
            ),
        };
    }
    let fed = link.most.max(floor);
    let bound = most_opened(link.most, floor);
    let streams = need.min(bound);
    let mut reason = format!(
        "{streams}: {carries}, and the {:.1} Gbit/s aimed at needs {need}",
        gbps(link.aim_bps)
    );
    if streams < need {
        let limit = if fed == bound {
            "the sender's buffer feeds no more at two blocks a stream (a larger --buffer or a smaller \
             --block-size feeds more)"
        } else {
            "the tuner opens no more by itself (--streams sets up to 256)"
        };
        let raise = if link.explicit {
            "raise --socket-buffer (and net.core.wmem_max, rmem_max)"
        } else {
            "raise the TCP buffer maximums (net.ipv4.tcp_wmem, tcp_rmem) on both hosts"
        };
        reason.push_str(&format!(
            "; {limit}, so the transfer runs at up to {:.2} Gbit/s: {raise}",
            gbps(per * f64::from(streams))
        ));
    }
    StreamChoice { streams, reason }
}

/// The streams a session of small files opens at least over a long path.
/// Such a transfer ends before TCP's slow start does: its rate is its
/// streams' windows growing from their first ten packets, so more streams
/// end it sooner (2,000 files of 64 KiB over 150 ms: 2.8 s on 4 streams,
/// 2.6 s on 16).
pub const SMALL_FILES_STREAMS: u16 = 16;

/// Below this round trip slow start is over in a few milliseconds, and
/// more streams only cost CPU (10,000 files of 64 KiB on loopback: 4.6
/// CPU seconds on 16 streams, 3.2 on 4, and no faster).
pub const SMALL_FILES_FROM_RTT: Duration = Duration::from_millis(5);

/// Whether a session's files are small: many of them, one block or less
/// on average.
pub fn small_files(files: usize, bytes: u64, block_size: u64) -> bool {
    files >= usize::from(SMALL_FILES_STREAMS) * 4 && bytes <= files as u64 * block_size
}

/// `choice`, raised to `SMALL_FILES_STREAMS` for a session of small
/// files over a path of `rtt` from `SMALL_FILES_FROM_RTT`, within what the
/// sender's buffer feeds (`fed`).
pub fn for_small_files(choice: StreamChoice, rtt: Duration, fed: u16) -> StreamChoice {
    let streams = SMALL_FILES_STREAMS.min(most_opened(fed, choice.streams));
    if streams <= choice.streams || rtt < SMALL_FILES_FROM_RTT {
        return choice;
    }
    StreamChoice {
        streams,
        reason: format!(
            "{streams}: the files are small, so the transfer is mostly TCP's slow start, \
             which more streams shorten (for the link alone: {})",
            choice.reason
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_of_small_files_starts_on_more_streams_within_the_buffer() {
        let four = choose_streams(&link(150, 256 << 20), 4);
        assert_eq!(four.streams, 4);
        assert!(small_files(2000, 2000 * 65536, 4 << 20));
        let wan = Duration::from_millis(150);
        let chosen = for_small_files(four.clone(), wan, 100);
        assert_eq!(chosen.streams, SMALL_FILES_STREAMS);
        assert!(chosen.reason.contains("slow start"), "{}", chosen.reason);
        // Never past what the buffer feeds, never fewer than chosen, and
        // not where slow start is over at once.
        assert_eq!(for_small_files(four.clone(), wan, 6).streams, 6);
        assert_eq!(for_small_files(four.clone(), wan, 2), four);
        let lan = Duration::from_micros(200);
        assert_eq!(for_small_files(four.clone(), lan, 100), four);
        // One large file, or a handful of files, is not a tree of small ones.
        assert!(!small_files(1, 8 << 30, 4 << 20));
        assert!(!small_files(10, 10 * 65536, 4 << 20));
        assert!(!small_files(2000, 2000 * (8 << 20), 4 << 20));
    }

    fn link(rtt_ms: u64, buffer: u64) -> Link {
        Link {
            rtt: Duration::from_millis(rtt_ms),
            buffer,
            explicit: false,
            aim_bps: AIM_BPS,
            // 512 MiB of 16 MiB blocks, two kept for the reader.
            most: 15,
        }
    }

    #[test]
    fn a_short_path_keeps_the_default() {
        let c = choose_streams(&link(1, 4 << 20), 4);
        assert_eq!(c.streams, 4);
        assert!(c.reason.contains("the default"), "{c:?}");
        // Unknown limits: the default, said so.
        let c = choose_streams(&link(150, 0), 4);
        assert_eq!(c.streams, 4);
        assert!(c.reason.contains("unknown"), "{c:?}");
        let c = choose_streams(
            &Link {
                rtt: Duration::ZERO,
                ..link(0, 4 << 20)
            },
            4,
        );
        assert_eq!(c.streams, 4);
    }

    #[test]
    fn a_window_too_small_for_the_path_gets_more_streams() {
        // 64 MiB over 50 ms: 5.4 Gbit/s a stream, two for 10 Gbit/s, but
        // never below the default.
        assert_eq!(choose_streams(&link(50, 64 << 20), 4).streams, 4);
        // 16 MiB over 50 ms: 1.34 Gbit/s a stream, 8 for 10 Gbit/s.
        let c = choose_streams(&link(50, 16 << 20), 4);
        assert_eq!(c.streams, 8, "{c:?}");
        assert!(c.reason.contains("needs 8"), "{c:?}");
        // A capped transfer aims at its cap: 2 Gbit/s needs 2 of them.
        let capped = Link {
            aim_bps: 2e9,
            ..link(50, 16 << 20)
        };
        assert_eq!(choose_streams(&capped, 1).streams, 2);
    }

    #[test]
    fn the_buffer_and_the_bound_cap_the_choice_and_say_what_to_raise() {
        // Debian's 4 MiB over 150 ms: 0.11 Gbit/s a stream, 90 for
        // 10 Gbit/s; the default buffer feeds 15.
        let c = choose_streams(&link(150, 4 << 20), 4);
        assert_eq!(c.streams, 15, "{c:?}");
        assert!(c.reason.contains("--buffer"), "{c:?}");
        assert!(c.reason.contains("tcp_wmem"), "{c:?}");
        // An explicit socket buffer: that is what to raise.
        let explicit = Link {
            explicit: true,
            ..link(150, 4 << 20)
        };
        let c = choose_streams(&explicit, 4);
        assert!(c.reason.contains("--socket-buffer"), "{c:?}");
        assert!(!c.reason.contains("tcp_wmem"), "{c:?}");
        // A big buffer: the tuner's own bound.
        let big = Link {
            most: 4096,
            ..link(150, 1 << 20)
        };
        let c = choose_streams(&big, 4);
        assert_eq!(c.streams, MOST_CHOSEN);
        assert!(c.reason.contains("--streams sets up to 256"), "{c:?}");
        // A buffer that feeds fewer than the default: the default stands
        // (the sender's pool holds two blocks for each).
        let small = Link {
            most: 2,
            ..link(150, 4 << 20)
        };
        assert_eq!(choose_streams(&small, 4).streams, 4);
    }

    #[test]
    fn a_round_trip_the_kernel_did_not_measure_is_not_tuned_for() {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        assert_eq!(ms(round_trip(150.0, 151.0)), 150.0);
        // No sample: TCP_INFO's min_rtt is ~0U microseconds.
        assert_eq!(ms(round_trip(4_294_967.295, 150.0)), 150.0);
        assert_eq!(round_trip(4_294_967.295, 4_294_967.295), Duration::ZERO);
        assert_eq!(round_trip(0.0, 0.0), Duration::ZERO);
        assert_eq!(ms(round_trip(0.0, 12.0)), 12.0);
        assert_eq!(round_trip(f64::NAN, f64::NAN), Duration::ZERO);
        // Unknown: the default streams, not the most allowed.
        let c = choose_streams(
            &Link {
                rtt: round_trip(4_294_967.295, 4_294_967.295),
                ..link(0, 4 << 20)
            },
            4,
        );
        assert_eq!(c.streams, 4, "{c:?}");
    }

    #[test]
    fn no_input_panics() {
        for rtt in [0, 1, 150, u64::MAX / 2] {
            for buffer in [0, 1, u64::MAX] {
                for aim in [0.0, 1.0, AIM_BPS, f64::MAX, f64::INFINITY, f64::NAN] {
                    let c = choose_streams(
                        &Link {
                            rtt: Duration::from_millis(rtt),
                            buffer,
                            explicit: false,
                            aim_bps: aim,
                            most: 0,
                        },
                        0,
                    );
                    assert!((1..=STREAMS.max as u16).contains(&c.streams), "{c:?}");
                }
            }
        }
    }
}
