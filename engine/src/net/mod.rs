//! TCP sockets: connect, listen, per-socket congestion control, pacing and
//! buffer sizes, and the authentication handshake.

pub mod auth;
mod conn;
mod stats;
pub mod tls;

pub use conn::Conn;
pub use stats::{Lagging, TcpStats, lagging, tcp_stats};

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, SockRef, Socket, TcpKeepalive, Type};

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

impl SocketOpts {
    /// Refuses, before any connection, what a socket would take badly:
    /// an explicit buffer out of `tuning::SOCKET_BUFFER` (one that small
    /// is accepted by the kernel and crawls), or a congestion control this
    /// kernel does not offer (`apply` would fail on every connection, and
    /// a receiver would only log it per connection while senders saw their
    /// connections dropped). The sender and the receiver both check here,
    /// so the same flag is refused the same way on either side.
    pub fn check(&self) -> Result<()> {
        if let Some(b) = self.buffer {
            crate::tuning::SOCKET_BUFFER.check(b as i128)?;
        }
        if let Some(cc) = &self.congestion {
            let caps = capabilities();
            // An empty list means it could not be read: the connection
            // itself will say.
            if !caps.congestion.is_empty() && !caps.congestion.iter().any(|c| c == cc) {
                return Err(Error::Config(format!(
                    "congestion control {cc:?} is not available; available: {}",
                    caps.congestion.join(", ")
                )));
            }
        }
        Ok(())
    }
}

/// Data written to a peer that stays unacknowledged this long means the
/// peer is gone: the kernel closes the connection (TCP_USER_TIMEOUT).
/// Without it, a peer that vanished (no FIN, no RST) keeps a connection
/// that has data to send open for the whole retransmission schedule,
/// about 15 minutes.
pub const TCP_DEAD_AFTER: Duration = Duration::from_secs(30);
/// An idle connection is probed after this long without traffic...
const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
/// ...every this often...
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// ...and closed when this many probes in a row go unanswered (so an idle
/// connection to a vanished peer closes after about 30 s, not the
/// kernel's default of two hours and 11 minutes).
const KEEPALIVE_PROBES: u32 = 4;

/// Applies `opts` to a socket, and the liveness settings every connection
/// gets (TCP keepalive and TCP_USER_TIMEOUT).
pub fn apply(stream: &impl AsFd, opts: &SocketOpts) -> Result<()> {
    let sock = SockRef::from(stream);
    sock.set_tcp_nodelay(true)
        .map_err(|e| Error::net("setting TCP_NODELAY", e))?;
    let keepalive = TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    sock.set_tcp_keepalive(&keepalive)
        .map_err(|e| Error::net("setting TCP keepalive", e))?;
    sock.set_tcp_user_timeout(Some(TCP_DEAD_AFTER))
        .map_err(|e| Error::net("setting TCP_USER_TIMEOUT", e))?;
    if let Some(cc) = &opts.congestion {
        sock.set_tcp_congestion(cc.as_bytes())
            .map_err(|e| Error::Config(congestion_refused(cc, &e)))?;
    }
    if let Some(rate) = opts.pacing {
        crate::io::sys::set_max_pacing_rate(stream, rate)
            .map_err(|e| Error::net("setting SO_MAX_PACING_RATE", e))?;
    }
    if let Some(b) = opts.buffer {
        sock.set_send_buffer_size(b)
            .and_then(|()| sock.set_recv_buffer_size(b))
            .map_err(|e| Error::net("setting socket buffer sizes", e))?;
    }
    Ok(())
}

/// Why `cc` could not be set: not loaded, or loaded but not in the host's
/// allowed list without CAP_NET_ADMIN (both read "available" otherwise).
fn congestion_refused(cc: &str, e: &io::Error) -> String {
    let caps = capabilities();
    if e.raw_os_error() == Some(libc::EPERM) {
        format!(
            "congestion control {cc:?} is refused ({e}): it is not in net.ipv4.tcp_allowed_congestion_control ({}), and choosing another needs CAP_NET_ADMIN (the agent's pod has it unless dropped)",
            crate::io::caps::sysctl("net.ipv4.tcp_allowed_congestion_control")
        )
    } else {
        format!(
            "congestion control {cc:?} is not available here ({e}); available: {}",
            caps.congestion.join(", ")
        )
    }
}

/// The congestion control a socket ended up with.
pub fn congestion_of(stream: &impl AsFd) -> String {
    SockRef::from(stream)
        .tcp_congestion()
        .map(|v| {
            String::from_utf8_lossy(&v)
                .trim_end_matches('\0')
                .to_string()
        })
        .unwrap_or_default()
}

/// The port of `addr` (host:port), as dialled; 0 when it has none.
pub fn port_of(addr: &str) -> u16 {
    addr.rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or(0)
}

/// Connects to `addr` (host:port), trying each resolved address.
pub fn connect(addr: &str, opts: &SocketOpts, timeout: Duration) -> Result<TcpStream> {
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|cause| Error::Unresolvable {
            addr: addr.to_string(),
            cause,
        })?
        .collect();
    // A name may resolve to addresses of which only one is listened on (a
    // receiver bound to 0.0.0.0, its name resolving to IPv6 too): the
    // error kept is a refusal only when every address refused, so that an
    // address timing out in a blip is not taken for a process gone.
    let mut last: Option<Error> = None;
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
            Err(e) => {
                let e = Error::net(format!("connecting to {a}"), e);
                if last.as_ref().is_none_or(Error::is_refused) {
                    last = Some(e);
                }
            }
        }
    }
    Err(last.unwrap_or_else(|| {
        Error::net(
            format!("resolving {addr}"),
            io::Error::new(io::ErrorKind::NotFound, "no address"),
        )
    }))
}

/// A connection whose reads and writes must all be done by one deadline,
/// so that a peer cannot stretch a handshake by trickling it a byte at a
/// time (each read would otherwise get the whole timeout anew).
pub struct Deadline<'a> {
    conn: &'a Conn,
    /// The TLS session the handshake set up, once it has; reads and
    /// writes go through it from then on.
    sealed: Option<std::sync::Arc<tls::Link>>,
    at: Instant,
    within: Duration,
}

impl<'a> Deadline<'a> {
    /// Everything read or written through this must be done `within` from now.
    pub fn new(conn: &'a Conn, within: Duration) -> Self {
        Self {
            conn,
            sealed: conn.link().cloned(),
            at: Instant::now() + within,
            within,
        }
    }

    /// The connection, as it was when the deadline began.
    pub fn conn(&self) -> &'a Conn {
        self.conn
    }

    /// Whether the connection is encrypted from here on.
    pub fn encrypted(&self) -> bool {
        self.sealed.is_some()
    }

    /// The channel binding of the connection's TLS session, if any.
    pub fn binding(&self) -> Option<[u8; tls::BINDING_LEN]> {
        self.sealed.as_ref().map(|l| *l.binding())
    }

    /// Runs the TLS handshake as `side`, within what is left of the
    /// deadline; reads and writes are sealed from then on.
    pub fn start_tls(&mut self, side: tls::Side) -> Result<()> {
        let link = tls::handshake(&mut Raw(self), side)?;
        self.sealed = Some(std::sync::Arc::new(link));
        Ok(())
    }

    fn expired(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "the handshake did not finish within {} s",
                self.within.as_secs_f64()
            ),
        )
    }

    /// Time left, or the error once there is none.
    fn left(&self) -> io::Result<Duration> {
        let left = self.at.saturating_duration_since(Instant::now());
        if left.is_zero() {
            Err(self.expired())
        } else {
            Ok(left)
        }
    }

    /// Waits, within the deadline, for the first byte without taking it:
    /// 0 means the peer closed without sending one (a readiness probe).
    pub fn peek(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // Opened already: not closed, whatever the socket holds.
        if self.sealed.as_ref().is_some_and(|l| l.has_pending()) {
            return Ok(buf.len().min(1));
        }
        self.conn.set_read_timeout(Some(self.left()?))?;
        self.conn.peek(buf).map_err(|e| self.timed_out(e))
    }

    fn timed_out(&self, e: io::Error) -> io::Error {
        if matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ) {
            self.expired()
        } else {
            e
        }
    }
}

impl Read for Deadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // Before every read of the socket, however many one sealed read
        // takes: a peer trickling a record a byte at a time runs into
        // the deadline as it would in clear.
        let arm = || self.conn.set_read_timeout(Some(self.left()?));
        let r = match &self.sealed {
            Some(link) => link.read(self.conn.tcp(), buf, &arm),
            None => arm().and_then(|()| self.conn.tcp().read(buf)),
        };
        r.map_err(|e| self.timed_out(e))
    }
}

impl Write for Deadline<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.conn.set_write_timeout(Some(self.left()?))?;
        let r = match &self.sealed {
            Some(link) => link.write_all(self.conn.tcp(), &[buf]).map(|()| buf.len()),
            None => self.conn.tcp().write(buf),
        };
        r.map_err(|e| self.timed_out(e))
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The socket under a deadline, unsealed: what the TLS handshake itself
/// reads and writes.
struct Raw<'d, 'a>(&'d Deadline<'a>);

impl Read for Raw<'_, '_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let d = self.0;
        d.conn.set_read_timeout(Some(d.left()?))?;
        d.conn.tcp().read(buf).map_err(|e| d.timed_out(e))
    }
}

impl Write for Raw<'_, '_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let d = self.0;
        d.conn.set_write_timeout(Some(d.left()?))?;
        d.conn.tcp().write(buf).map_err(|e| d.timed_out(e))
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Closes `conn` once the peer has closed its side (or after `within`),
/// reading and dropping what it still sends: a close with unread bytes
/// resets the connection, and a reset discards the last answer still
/// queued at the peer.
pub fn linger(conn: &Conn, within: Duration) {
    let _ = conn.shutdown(std::net::Shutdown::Write);
    let until = Instant::now() + within;
    let mut sink = [0u8; 512];
    while let Some(left) = until.checked_duration_since(Instant::now()) {
        if conn
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .is_err()
        {
            return;
        }
        match conn.tcp().read(&mut sink) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// How long a peer has to complete the handshake, all reads and writes
/// together, on either side.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs `f` (frames read or written in a bounded time) over `conn` under
/// one deadline `within`, then clears the socket timeouts it set.
pub fn within<T>(
    conn: &Conn,
    within: Duration,
    f: impl FnOnce(&mut Deadline<'_>) -> Result<T>,
) -> Result<T> {
    let result = f(&mut Deadline::new(conn, within));
    clear_timeouts(conn, result)
}

/// Runs handshake `f` over `conn` as `within` does; a TLS session the
/// handshake set up seals `conn` from then on.
pub fn handshake<T>(
    conn: &mut Conn,
    within: Duration,
    f: impl FnOnce(&mut Deadline<'_>) -> Result<T>,
) -> Result<T> {
    let mut d = Deadline::new(conn, within);
    let result = f(&mut d);
    let sealed = d.sealed.take().filter(|_| conn.link().is_none());
    if let Some(link) = sealed {
        conn.seal(link);
    }
    clear_timeouts(conn, result)
}

fn clear_timeouts<T>(conn: &Conn, result: Result<T>) -> Result<T> {
    let cleared = conn
        .set_read_timeout(None)
        .and_then(|()| conn.set_write_timeout(None));
    let value = result?;
    cleared.map_err(|e| Error::net("clearing the handshake's timeouts", e))?;
    Ok(value)
}

/// Polls `fds` for input up to `timeout`; an interrupted wait counts as
/// nothing ready.
fn poll_in(fds: &mut [rustix::event::PollFd<'_>], timeout: Duration) -> io::Result<()> {
    use rustix::event::{Timespec, poll};
    let ts = Timespec::try_from(timeout).unwrap_or(Timespec {
        tv_sec: i64::MAX,
        tv_nsec: 0,
    });
    match poll(fds, Some(&ts)) {
        Ok(_) | Err(rustix::io::Errno::INTR) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Waits up to `timeout` for `stream` to have something to read (or to be
/// closed); false when the time ran out.
pub fn wait_readable(stream: &Conn, timeout: Duration) -> io::Result<bool> {
    use rustix::event::{PollFd, PollFlags};
    if stream.has_pending() {
        return Ok(true);
    }
    let mut fds = [PollFd::new(stream, PollFlags::IN)];
    poll_in(&mut fds, timeout)?;
    Ok(!fds[0].revents().is_empty())
}

/// Waits until `stream` is readable (or closed) or `wake` is readable, at
/// most `timeout`; says which.
pub fn wait_readable_or(
    stream: &Conn,
    wake: std::os::fd::BorrowedFd<'_>,
    timeout: Duration,
) -> io::Result<(bool, bool)> {
    use rustix::event::{PollFd, PollFlags};
    if stream.has_pending() {
        return Ok((true, false));
    }
    let mut fds = [
        PollFd::new(stream, PollFlags::IN),
        PollFd::from_borrowed_fd(wake, PollFlags::IN),
    ];
    poll_in(&mut fds, timeout)?;
    Ok((!fds[0].revents().is_empty(), !fds[1].revents().is_empty()))
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
        .map_err(|cause| Error::Listen { addr: a, cause })?;
    sock.listen(1024).map_err(|cause| listen_failed(a, cause))?;
    Ok(sock.into())
}

/// Why listen() on `a` failed. Two sockets with SO_REUSEADDR may both bind
/// one port while neither listens; the second to listen is refused with
/// EADDRINUSE. That is the same "this port is taken" as a refused bind, so
/// that a receiver trying a range of data ports goes on to the next.
fn listen_failed(a: SocketAddr, cause: io::Error) -> Error {
    match cause.kind() {
        io::ErrorKind::AddrInUse => Error::Listen { addr: a, cause },
        _ => Error::net(format!("listening on {a}"), cause),
    }
}

/// The most one stream can carry over `rtt` given the host's TCP buffer
/// maximums, in bits per second (the tuner's arithmetic); `None` when
/// unknown.
pub fn buffer_ceiling_bps(rtt: Duration) -> Option<f64> {
    let caps = capabilities();
    crate::tuner::stream_ceiling_bps(caps.tcp_wmem_max.min(caps.tcp_rmem_max), rtt)
}

/// A warning when the host's TCP buffer maximums keep `streams` streams
/// over `rtt` below the wanted rate (`max_rate` in bytes/s, else 10 Gbit/s):
/// the bandwidth-delay product does not fit the window.
pub fn buffer_warning(rtt: Duration, streams: u16, max_rate: Option<u64>) -> Option<String> {
    let per_stream = buffer_ceiling_bps(rtt)?;
    let ceiling = per_stream * f64::from(streams);
    let want = max_rate.map_or(crate::tuner::AIM_BPS, |r| r as f64 * 8.0);
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
    /// A port another socket started listening on between this one's bind
    /// and listen (both with SO_REUSEADDR) is a port taken, not a network
    /// failure: found in CI, where a receiver job gave up on its range.
    #[test]
    fn a_port_taken_between_bind_and_listen_is_a_port_taken() {
        let a: SocketAddr = "0.0.0.0:31158".parse().unwrap();
        let in_use = io::Error::from(io::ErrorKind::AddrInUse);
        assert!(matches!(listen_failed(a, in_use), Error::Listen { .. }));
        let other = io::Error::from(io::ErrorKind::PermissionDenied);
        assert!(matches!(listen_failed(a, other), Error::Net { .. }));
    }

    use super::*;

    #[test]
    fn a_loaded_but_disallowed_congestion_control_names_the_capability() {
        // It used to read "cubic is not available here; available: reno,
        // bbr, cubic" when a pod without NET_ADMIN asked for cubic.
        let why = congestion_refused("cubic", &io::Error::from_raw_os_error(libc::EPERM));
        assert!(why.contains("CAP_NET_ADMIN"), "{why}");
        assert!(why.contains("tcp_allowed_congestion_control"), "{why}");
        let why = congestion_refused("nosuch", &io::Error::from_raw_os_error(libc::ENOENT));
        assert!(why.contains("not available here"), "{why}");
    }

    // Found by a probe: `--socket-buffer 1` ran at 0.01 Gbit/s, and 4 GiB
    // would reach the kernel as 0 through a C int.
    #[test]
    fn socket_buffers_out_of_bounds_are_refused_before_any_connection() {
        let with = |b: usize| SocketOpts {
            buffer: Some(b),
            ..SocketOpts::default()
        };
        for b in [0, 1, 4096, (64 << 10) - 1, (1 << 30) + 1, 4 << 30] {
            let e = with(b).check().unwrap_err();
            assert!(
                e.to_string()
                    .contains("socketBuffer (--socket-buffer) must be from 64 KiB to 1 GiB"),
                "{b}: {e}"
            );
        }
        with(64 << 10).check().unwrap();
        with(1 << 30).check().unwrap();
        SocketOpts::default().check().unwrap();
    }

    /// A port in use is not a bad setting: it used to read "invalid
    /// setting: cannot listen on ...".
    #[test]
    fn a_port_in_use_is_said_as_such() {
        let first = listen("127.0.0.1:0").unwrap();
        let addr = first.local_addr().unwrap();
        let e = listen(&addr.to_string()).unwrap_err();
        assert!(
            matches!(&e, Error::Listen { addr: a, .. } if *a == addr),
            "{e:?}"
        );
        let msg = e.to_string();
        assert!(
            msg.starts_with(&format!("cannot listen on {addr}: ")),
            "{msg}"
        );
        assert!(
            msg.contains("another process listens on this port"),
            "{msg}"
        );
        assert!(!msg.contains("invalid setting"), "{msg}");
        assert_eq!(e.metric_label(), "listen");
    }

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
