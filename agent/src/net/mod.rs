//! TCP sockets: connect, listen, per-socket congestion control, pacing and
//! buffer sizes, and the authentication handshake.

pub mod auth;

use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::time::Duration;

use socket2::{Domain, Protocol, SockRef, Socket, Type};

use crate::error::{Error, Result};
use crate::io::caps::capabilities;

/// Per-socket tuning.
#[derive(Debug, Clone, Default)]
pub struct SocketOpts {
    /// TCP congestion control algorithm (TCP_CONGESTION).
    pub congestion: Option<String>,
    /// Pacing cap in bytes per second for this socket (SO_MAX_PACING_RATE).
    pub pacing: Option<u64>,
    /// Explicit SO_SNDBUF/SO_RCVBUF; `None` leaves autotuning on.
    pub buffer: Option<usize>,
}

fn set_pacing(sock: &SockRef<'_>, bytes_per_sec: u64) -> std::io::Result<()> {
    let v: u64 = bytes_per_sec;
    // SAFETY: setsockopt reads exactly `size_of::<u64>()` bytes from a valid
    // pointer to a local; the fd is borrowed from a live socket.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_MAX_PACING_RATE,
            (&raw const v).cast(),
            size_of::<u64>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Applies `opts` to a socket.
pub fn apply(stream: &TcpStream, opts: &SocketOpts) -> Result<()> {
    let sock = SockRef::from(stream);
    sock.set_tcp_nodelay(true)
        .map_err(|e| Error::net("setting TCP_NODELAY", e))?;
    if let Some(cc) = &opts.congestion {
        sock.set_tcp_congestion(cc.as_bytes()).map_err(|e| {
            Error::Config(format!(
                "congestion control {cc:?} is not available here ({e}); available: {}",
                capabilities().congestion.join(", ")
            ))
        })?;
    }
    if let Some(rate) = opts.pacing {
        set_pacing(&sock, rate).map_err(|e| Error::net("setting SO_MAX_PACING_RATE", e))?;
    }
    if let Some(b) = opts.buffer {
        sock.set_send_buffer_size(b)
            .and_then(|()| sock.set_recv_buffer_size(b))
            .map_err(|e| Error::net("setting socket buffer sizes", e))?;
    }
    Ok(())
}

/// The congestion control a socket ended up with.
pub fn congestion_of(stream: &TcpStream) -> String {
    SockRef::from(stream)
        .tcp_congestion()
        .map(|v| {
            String::from_utf8_lossy(&v)
                .trim_end_matches('\0')
                .to_string()
        })
        .unwrap_or_default()
}

/// Connects to `addr` (host:port), trying each resolved address.
pub fn connect(addr: &str, opts: &SocketOpts, timeout: Duration) -> Result<TcpStream> {
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| Error::net(format!("resolving {addr}"), e))?
        .collect();
    let mut last = None;
    for a in addrs {
        let sock = Socket::new(Domain::for_address(a), Type::STREAM, Some(Protocol::TCP))
            .map_err(|e| Error::net("creating a socket", e))?;
        // Congestion control and buffers must be set before the handshake
        // to shape the window from the first packet.
        let stream: TcpStream = sock.into();
        apply(&stream, opts)?;
        let sock = Socket::from(stream);
        match sock.connect_timeout(&a.into(), timeout) {
            Ok(()) => return Ok(sock.into()),
            Err(e) => last = Some(Error::net(format!("connecting to {a}"), e)),
        }
    }
    Err(last.unwrap_or_else(|| {
        Error::net(
            format!("resolving {addr}"),
            std::io::Error::new(std::io::ErrorKind::NotFound, "no address"),
        )
    }))
}

/// Listens on `addr` with SO_REUSEADDR, so a restarted receiver can rebind.
pub fn listen(addr: &str) -> Result<TcpListener> {
    let a: SocketAddr = addr
        .to_socket_addrs()
        .map_err(|e| Error::Config(format!("cannot resolve listen address {addr}: {e}")))?
        .next()
        .ok_or_else(|| Error::Config(format!("listen address {addr} resolves to nothing")))?;
    let sock = Socket::new(Domain::for_address(a), Type::STREAM, Some(Protocol::TCP))
        .map_err(|e| Error::net("creating a socket", e))?;
    sock.set_reuse_address(true)
        .map_err(|e| Error::net("setting SO_REUSEADDR", e))?;
    sock.bind(&a.into())
        .map_err(|e| Error::Config(format!("cannot listen on {a}: {e}")))?;
    sock.listen(1024)
        .map_err(|e| Error::net(format!("listening on {a}"), e))?;
    Ok(sock.into())
}

/// The most one stream can carry over `rtt` given the host's TCP buffer
/// maximums, in bits per second; `None` when unknown.
pub fn buffer_ceiling_bps(rtt: Duration) -> Option<f64> {
    let caps = capabilities();
    let buf = caps.tcp_wmem_max.min(caps.tcp_rmem_max);
    (buf > 0 && !rtt.is_zero()).then(|| buf as f64 * 8.0 / rtt.as_secs_f64())
}

/// A warning when the host's TCP buffer maximums keep `streams` streams
/// over `rtt` below the wanted rate (`max_rate` in bytes/s, else 10 Gbit/s):
/// the bandwidth-delay product does not fit the window.
pub fn buffer_warning(rtt: Duration, streams: u16, max_rate: Option<u64>) -> Option<String> {
    let per_stream = buffer_ceiling_bps(rtt)?;
    let ceiling = per_stream * f64::from(streams);
    let want = max_rate.map_or(10e9, |r| r as f64 * 8.0);
    if rtt <= Duration::from_millis(1) || ceiling >= want {
        return None;
    }
    let caps = capabilities();
    Some(format!(
        "TCP buffer maximums (tcp_rmem {} / tcp_wmem {} bytes) cap each stream at {:.2} Gbit/s over this {:.1} ms path \
         ({:.2} Gbit/s for {streams} streams); raise net.ipv4.tcp_rmem/tcp_wmem (and net.core.rmem_max/wmem_max) \
         to the bandwidth-delay product ({} bytes for {:.0} Gbit/s), or use more --streams",
        caps.tcp_rmem_max,
        caps.tcp_wmem_max,
        per_stream / 1e9,
        rtt.as_secs_f64() * 1e3,
        ceiling / 1e9,
        (want / 8.0 * rtt.as_secs_f64()) as u64,
        want / 1e9
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warns_only_when_the_window_cannot_fill_the_path() {
        assert!(
            buffer_warning(Duration::from_micros(50), 4, None).is_none(),
            "loopback never warns"
        );
        let caps = capabilities();
        if caps.tcp_rmem_max == 0 {
            return;
        }
        // 150 ms and a 100 Gbit/s wish: no default Linux buffer fills that.
        let w = buffer_warning(Duration::from_millis(150), 1, Some(100_000_000_000 / 8)).unwrap();
        assert!(w.contains("bandwidth-delay product"), "{w}");
        // A rate the window covers easily: no warning.
        assert!(buffer_warning(Duration::from_millis(150), 1, Some(1000)).is_none());
    }
}
