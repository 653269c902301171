//! A connection: the TCP socket, and the TLS session its bytes go
//! through when it is encrypted. Every handle of one connection (a reader
//! and a writer on two threads) shares the one session.

use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::time::Duration;

use super::tls::Link;
use crate::encryption::InEffect;

/// A TCP connection, in clear or sealed by TLS.
#[derive(Debug)]
pub struct Conn {
    tcp: TcpStream,
    tls: Option<Arc<Link>>,
}

impl From<TcpStream> for Conn {
    fn from(tcp: TcpStream) -> Self {
        Self { tcp, tls: None }
    }
}

impl Conn {
    /// The socket, for its options and statistics; its bytes are sealed
    /// records when the connection is encrypted, so never read or write
    /// it directly.
    pub fn tcp(&self) -> &TcpStream {
        &self.tcp
    }

    /// The TLS session, when encrypted.
    pub fn link(&self) -> Option<&Arc<Link>> {
        self.tls.as_ref()
    }

    /// Seals the connection with `link` from here on.
    pub(super) fn seal(&mut self, link: Arc<Link>) {
        self.tls = Some(link);
    }

    /// What is in effect on this connection.
    pub fn in_effect(&self) -> InEffect {
        if self.tls.is_some() {
            InEffect::Userspace
        } else {
            InEffect::Clear
        }
    }

    /// Another handle of the same connection and session.
    pub fn try_clone(&self) -> io::Result<Self> {
        Ok(Self {
            tcp: self.tcp.try_clone()?,
            tls: self.tls.clone(),
        })
    }

    /// Whether a read would find bytes without the socket being readable
    /// (plaintext opened and not yet taken): such a reader must not wait
    /// on the socket first.
    pub fn has_pending(&self) -> bool {
        self.tls.as_ref().is_some_and(|l| l.has_pending())
    }

    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.tcp.shutdown(how)
    }

    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.tcp.set_read_timeout(t)
    }

    pub fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        self.tcp.set_write_timeout(t)
    }

    pub fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        self.tcp.set_nonblocking(on)
    }

    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.peer_addr()
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.local_addr()
    }

    /// Looks at the socket's next raw byte without taking it: only to
    /// tell whether the peer closed (0).
    pub fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.tcp.peek(buf)
    }
}

impl AsFd for Conn {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.tcp.as_fd()
    }
}

impl Read for &Conn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &self.tls {
            Some(link) => link.read(&self.tcp, buf, &|| Ok(())),
            None => (&self.tcp).read(buf),
        }
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        (&*self).read(buf)
    }
}

impl Write for &Conn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &self.tls {
            Some(link) => link.write_all(&self.tcp, &[buf]).map(|()| buf.len()),
            None => (&self.tcp).write(buf),
        }
    }

    /// Sealed, every slice goes in one call, so a caller's loop over a
    /// short write never splits a record stream.
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match &self.tls {
            Some(link) => {
                let slices: Vec<&[u8]> = bufs.iter().map(|b| &**b).collect();
                link.write_all(&self.tcp, &slices)?;
                Ok(slices.iter().map(|s| s.len()).sum())
            }
            None => (&self.tcp).write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&*self).write(buf)
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        (&*self).write_vectored(bufs)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
