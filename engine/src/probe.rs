//! A short test of the path to a receiver (`wirerate-agent probe`): memory
//! to memory through the engine itself, first with one stream and then
//! with several, reading what the kernel measured of every stream, and
//! ending with `advice`. The receiver must take memory-to-memory tests
//! (`serve --allow-discard` or `--discard-only`); nothing is written there.

use serde::Serialize;

use crate::advice::{Advice, HostLimits, PhaseFigures, advise};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::{Error, Result};
use crate::io::caps::capabilities;
use crate::net::{SocketOpts, TcpStats};
use crate::sender::{SendConfig, send};
use crate::summary::SendSummary;
use crate::units::fmt_bytes;

/// Where to probe, and how hard.
#[derive(Debug, Clone)]
pub struct ProbeConfig {
    /// Receiver address, host:port.
    pub to: String,
    /// The shared secret.
    pub token: Vec<u8>,
    /// Whether its connections are encrypted, to measure what TLS costs.
    pub encrypt: crate::encryption::Encryption,
    /// Streams of the second phase.
    pub streams: u16,
    /// About how long each phase should last, seconds.
    pub seconds: f64,
    /// Block size.
    pub block_size: u64,
    /// Congestion control and socket buffers to test with.
    pub socket: SocketOpts,
    /// Cap on the rate, bytes per second: what the test may take from a
    /// path others use.
    pub max_rate: Option<u64>,
    /// Set to stop the probe (a transfer wants the path): the run in
    /// progress ends within a keepalive interval.
    pub cancel: Option<Arc<AtomicBool>>,
}

/// How long a phase may be asked to last, seconds: long enough to say
/// something, short enough to stay a probe.
pub const PHASE_SECONDS: std::ops::RangeInclusive<f64> = 0.5..=60.0;

/// The smallest phase.
const MIN_PHASE: u64 = 16 << 20;
/// Blocks each stream gets at least, so that every stream carries some.
const MIN_BLOCKS_PER_STREAM: u64 = 4;
/// The largest phase, whatever the path: a probe stays short.
const MAX_PHASE: u64 = 64 << 30;
/// The first, sizing run.
const SIZING: u64 = 16 << 20;
/// A phase that ends before half its time is run again, larger (TCP's
/// ramp dominates a short one), at most this many times.
const MAX_TRIES: u32 = 3;

/// One phase: what it moved and what each stream's TCP_INFO said at its end.
#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    /// The figures `advice` works from.
    #[serde(flatten)]
    pub figures: PhaseFigures,
    /// Bytes moved.
    pub bytes: u64,
    /// Seconds it took, connection included.
    pub seconds: f64,
    /// Each stream's rate, Gbit/s.
    pub per_stream_gbps: Vec<f64>,
    /// Each stream's TCP_INFO (`null` for one that did not connect).
    pub tcp: Vec<Option<TcpStats>>,
}

impl Phase {
    fn of(s: &SendSummary) -> Self {
        let seen = || s.tcp.iter().flatten();
        // The lowest round trip the kernel saw; the handshake's when no
        // stream could say.
        let rtt_ms = seen()
            .map(|t| t.min_rtt_ms)
            .filter(|r| *r > 0.0)
            .fold(f64::INFINITY, f64::min);
        let retransmits: u64 = seen().map(|t| u64::from(t.retransmits)).sum();
        let mss = seen().map(|t| t.mss).max().unwrap_or(0).max(536);
        let segments = (s.bytes_sent / u64::from(mss)).max(1);
        Self {
            figures: PhaseFigures {
                streams: s.streams,
                gbps: s.gbps,
                rtt_ms: if rtt_ms.is_finite() { rtt_ms } else { s.rtt_ms },
                retransmits,
                loss: retransmits as f64 / segments as f64,
                send_buffer: seen().map(|t| t.send_buffer).max().unwrap_or(0),
            },
            bytes: s.bytes_sent,
            seconds: s.seconds,
            per_stream_gbps: s.per_stream_gbps.clone(),
            tcp: s.tcp.clone(),
        }
    }
}

/// What a probe found.
#[derive(Debug, Clone, Serialize)]
pub struct ProbeReport {
    /// The receiver probed.
    pub to: String,
    /// The round trip the handshake measured, milliseconds.
    pub handshake_rtt_ms: f64,
    /// One stream.
    pub one: Phase,
    /// `ProbeConfig::streams` streams.
    pub many: Phase,
    /// This host's limits.
    pub host: HostLimits,
    /// What to use.
    pub advice: Advice,
}

/// Bytes for a phase of `streams` that should last `seconds` at `gbps`.
fn phase_bytes(gbps: f64, seconds: f64, streams: u16, block_size: u64) -> u64 {
    let least = MIN_PHASE.max(u64::from(streams) * MIN_BLOCKS_PER_STREAM * block_size);
    let want = (gbps * 1e9 / 8.0 * seconds) as u64;
    want.clamp(least.min(MAX_PHASE), MAX_PHASE)
        .next_multiple_of(block_size)
}

fn run(cfg: &ProbeConfig, streams: u16, bytes: u64) -> Result<SendSummary> {
    if cfg
        .cancel
        .as_ref()
        .is_some_and(|c| c.load(Ordering::Relaxed))
    {
        return Err(Error::Cancelled {
            last: Box::new(Error::ConnectionLost(
                "the probe was stopped between runs".into(),
            )),
        });
    }
    let mut c = SendConfig::new(cfg.to.clone(), cfg.token.clone(), "", "probe");
    c.encrypt = cfg.encrypt;
    c.synthetic = Some(bytes);
    c.streams = streams;
    c.block_size = cfg.block_size;
    c.socket = cfg.socket.clone();
    c.max_rate = cfg.max_rate;
    // A failed probe is reported, not retried.
    c.retry_for = std::time::Duration::ZERO;
    // A probe beside a transfer that just started stops within a
    // keepalive interval, not at the end of a phase.
    c.cancel = cfg.cancel.clone();
    send(&c)
}

/// A phase of `streams` lasting about `cfg.seconds`: started at the
/// size `gbps` calls for, and run again larger while it ends in less than
/// half that (on a long path the first runs are mostly TCP's ramp).
fn phase(cfg: &ProbeConfig, streams: u16, gbps: f64) -> Result<SendSummary> {
    let mut bytes = phase_bytes(gbps, cfg.seconds, streams, cfg.block_size);
    let mut tries = 1;
    loop {
        let s = run(cfg, streams, bytes)?;
        if s.seconds >= cfg.seconds / 2.0 || bytes >= MAX_PHASE || tries >= MAX_TRIES {
            return Ok(s);
        }
        // At least twice as large, for what the run that ended showed.
        let rate = (s.gbps).max(gbps);
        bytes = phase_bytes(rate, cfg.seconds, streams, cfg.block_size).max(bytes * 2);
        tries += 1;
    }
}

/// Probes `cfg.to`: a sizing run, one stream, then `cfg.streams`.
pub fn probe(cfg: &ProbeConfig) -> Result<ProbeReport> {
    let sizing = run(cfg, 1, SIZING.next_multiple_of(cfg.block_size))?;
    let one = phase(cfg, 1, sizing.gbps)?;
    // Sized for streams that scale up to four times one: where they do
    // not, the phase takes up to four times as long.
    let many = phase(cfg, cfg.streams, one.gbps * f64::from(cfg.streams.min(4)))?;
    let caps = capabilities();
    let host = HostLimits {
        tcp_wmem_max: caps.tcp_wmem_max,
        tcp_rmem_max: caps.tcp_rmem_max,
        congestion: many.congestion.clone(),
        available: caps.congestion.clone(),
        slow_start_after_idle: crate::io::caps::slow_start_after_idle(),
    };
    let (one, many) = (Phase::of(&one), Phase::of(&many));
    let advice = advise(&one.figures, &many.figures, &host);
    Ok(ProbeReport {
        to: cfg.to.clone(),
        handshake_rtt_ms: sizing.rtt_ms,
        one,
        many,
        host,
        advice,
    })
}

impl ProbeReport {
    /// The human-readable report.
    pub fn render(&self) -> String {
        let mut s = format!(
            "probe of {}: memory to memory, nothing written\n  round trip {:.2} ms (handshake); congestion control {}\n",
            self.to, self.handshake_rtt_ms, self.host.congestion
        );
        for p in [&self.one, &self.many] {
            s.push_str(&format!(
                "  {} stream{}  {:.2} Gbit/s ({} in {:.2} s), {} retransmitted\n",
                p.figures.streams,
                if p.figures.streams == 1 { " " } else { "s" },
                p.figures.gbps,
                fmt_bytes(p.bytes),
                p.seconds,
                p.figures.retransmits
            ));
            s.push_str(
                "    stream  Gbit/s  rtt ms  rttvar  cwnd    MTU  retrans  delivery Gbit/s  pacing Gbit/s  send buffer\n",
            );
            for (i, (g, t)) in p.per_stream_gbps.iter().zip(&p.tcp).enumerate() {
                match t {
                    Some(t) => s.push_str(&format!(
                        "    {i:>6}  {g:>6.2}  {:>6.2}  {:>6.2}  {:>4}  {:>5}  {:>7}  {:>15.2}  {:>13.2}  {:>11}\n",
                        t.rtt_ms,
                        t.rttvar_ms,
                        t.cwnd,
                        t.pmtu,
                        t.retransmits,
                        t.delivery_rate as f64 * 8.0 / 1e9,
                        t.pacing_rate as f64 * 8.0 / 1e9,
                        fmt_bytes(t.send_buffer)
                    )),
                    None => s.push_str(&format!("    {i:>6}  did not connect\n")),
                }
            }
        }
        let a = &self.advice;
        s.push_str(&format!(
            "recommendation: --streams {} --congestion {}; TCP buffers of at least {} per stream\n",
            a.streams,
            a.congestion,
            fmt_bytes(a.socket_buffer)
        ));
        for r in &a.reasons {
            s.push_str(&format!("  because {r}\n"));
        }
        for c in &a.sysctl {
            s.push_str(&format!("  on both hosts: {c}\n"));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_last_about_the_asked_time_within_bounds() {
        // 8 Gbit/s for 2 s is 2 GB, a whole number of blocks.
        assert_eq!(phase_bytes(8.0, 2.0, 1, 1 << 20), 2_000_683_008);
        assert_eq!(phase_bytes(0.0, 2.0, 1, 1 << 20), MIN_PHASE);
        // Every stream gets blocks to carry.
        assert_eq!(phase_bytes(0.0, 2.0, 8, 4 << 20), 8 * 4 * (4 << 20));
        assert_eq!(phase_bytes(0.0, 2.0, 1, 64 << 20), 4 * (64 << 20));
        assert_eq!(phase_bytes(1e6, 2.0, 1, 1 << 20), MAX_PHASE);
    }
}
