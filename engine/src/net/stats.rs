//! What the kernel knows of a data stream's TCP connection, in the units
//! a summary shows, and which streams lag their siblings.

use serde::Serialize;

/// One connection's TCP_INFO, as the summary and the metrics show it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct TcpStats {
    /// Smoothed round-trip time, milliseconds.
    pub rtt_ms: f64,
    /// Its mean deviation, milliseconds.
    pub rttvar_ms: f64,
    /// The lowest round-trip time seen, milliseconds.
    pub min_rtt_ms: f64,
    /// Congestion window, segments.
    pub cwnd: u32,
    /// Largest segment it sends, bytes.
    pub mss: u32,
    /// Path MTU, bytes.
    pub pmtu: u32,
    /// Segments sent again over the connection's life.
    pub retransmits: u32,
    /// The kernel's estimate of the delivery rate, bytes per second.
    pub delivery_rate: u64,
    /// The rate the kernel paces at, bytes per second.
    pub pacing_rate: u64,
    /// The send buffer the kernel granted (SO_SNDBUF: autotuned, or what
    /// --socket-buffer asked for), bytes.
    pub send_buffer: u64,
}

/// `stream`'s TCP_INFO; `None` when the kernel will not say (not a TCP
/// socket any more).
pub fn tcp_stats(stream: &impl std::os::fd::AsFd) -> Option<TcpStats> {
    let i = crate::io::sys::tcp_info(stream).ok()?;
    let ms = |us: u32| f64::from(us) / 1000.0;
    Some(TcpStats {
        rtt_ms: ms(i.tcpi_rtt),
        rttvar_ms: ms(i.tcpi_rttvar),
        min_rtt_ms: ms(i.tcpi_min_rtt),
        cwnd: i.tcpi_snd_cwnd,
        mss: i.tcpi_snd_mss,
        pmtu: i.tcpi_pmtu,
        retransmits: i.tcpi_total_retrans,
        delivery_rate: i.tcpi_delivery_rate,
        // u64::MAX means no pacing at all.
        pacing_rate: if i.tcpi_pacing_rate == u64::MAX {
            0
        } else {
            i.tcpi_pacing_rate
        },
        send_buffer: socket2::SockRef::from(stream)
            .send_buffer_size()
            .map_or(0, |b| b as u64),
    })
}

/// A stream that carried far less than its siblings, as a summary flags it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Lagging {
    /// Its index.
    pub stream: usize,
    /// What it carried, as a share of the median stream's bytes.
    pub share: f64,
}

/// The streams whose bytes fell below a quarter of the median stream's.
/// Judged only when each stream had at least 8 blocks to carry on
/// average: with fewer, whichever stream pulled the last blocks decides,
/// not the path.
pub fn lagging(per_stream: &[u64], block_size: u64) -> Vec<Lagging> {
    let total: u64 = per_stream.iter().sum();
    if per_stream.len() < 2 || total < 8 * block_size * per_stream.len() as u64 {
        return Vec::new();
    }
    let mut sorted = per_stream.to_vec();
    sorted.sort_unstable();
    let median = sorted[sorted.len() / 2] as f64;
    per_stream
        .iter()
        .enumerate()
        .map(|(stream, &b)| Lagging {
            stream,
            share: b as f64 / median,
        })
        .filter(|l| l.share < 0.25)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_far_below_the_median_lags_once_there_is_enough_to_judge() {
        let block = 100;
        // 40 blocks over 4 streams, one of them starved.
        let l = lagging(&[1200, 1300, 1400, 100], block);
        assert_eq!(l.len(), 1);
        assert_eq!(l[0].stream, 3);
        assert!((l[0].share - 100.0 / 1300.0).abs() < 1e-9);
        // Evenly spread: none.
        assert!(lagging(&[1000, 1000, 1000, 1000], block).is_empty());
        // Too few blocks to say (the demo's 16 over 4 streams).
        assert!(lagging(&[500, 600, 500, 0], block).is_empty());
        // One stream: no siblings.
        assert!(lagging(&[5000], block).is_empty());
    }

    #[test]
    fn a_loopback_connection_has_a_round_trip_and_a_segment_size() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        use std::io::{Read, Write};
        c.write_all(&[7; 4096]).unwrap();
        s.read_exact(&mut [0; 4096]).unwrap();
        let t = tcp_stats(&c).unwrap();
        assert!(t.rtt_ms > 0.0 && t.mss > 0 && t.pmtu > 0, "{t:?}");
        assert!(t.cwnd > 0, "{t:?}");
    }
}
