//! The few raw system calls that no safe wrapper in our dependencies
//! covers. They live here, beside the buffer pool and the io_uring backend
//! (the only other modules allowed unsafe code), so that the rest of every
//! crate denies it.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, AsRawFd};

/// Caps the kernel's pacing of `socket` at `bytes_per_sec`
/// (SO_MAX_PACING_RATE; neither socket2 nor rustix sets it).
pub fn set_max_pacing_rate(socket: impl AsFd, bytes_per_sec: u64) -> io::Result<()> {
    let v: u64 = bytes_per_sec;
    // SAFETY: setsockopt reads exactly `size_of::<u64>()` bytes from a valid
    // pointer to a local; the fd is borrowed from a live socket.
    let r = unsafe {
        libc::setsockopt(
            socket.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_MAX_PACING_RATE,
            (&raw const v).cast(),
            size_of::<u64>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The kernel's TCP_INFO for `socket` (neither socket2 nor rustix reads
/// it). An older kernel fills a prefix of the struct; the rest stays zero.
pub fn tcp_info(socket: impl AsFd) -> io::Result<libc::tcp_info> {
    // SAFETY: tcp_info is plain old data (integers only), so all zeroes is
    // a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `info`, which we
    // own and which is that large; the fd is borrowed from a live socket.
    let r = unsafe {
        libc::getsockopt(
            socket.as_fd().as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&raw mut info).cast(),
            &mut len,
        )
    };
    if r == 0 {
        Ok(info)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Gives the memory freed by a finished session back to the system. glibc
/// keeps freed small allocations (a large manifest's paths, say) in its
/// arenas, so without this a receiver that once served a big manifest
/// would hold that memory until it exits.
pub fn release_freed_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only walks glibc's own free lists; it takes no
    // pointer from us and is safe to call from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// First IPv4 address of the network interface `interface`.
pub fn interface_address(interface: &str) -> Option<Ipv4Addr> {
    let mut ifaddrs: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills a list it allocates; we free it below.
    if unsafe { libc::getifaddrs(&mut ifaddrs) } != 0 {
        return None;
    }
    let mut found = None;
    let mut cur = ifaddrs;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*cur };
        // SAFETY: ifa_name is a NUL-terminated string owned by the list.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) };
        if name.to_bytes() == interface.as_bytes() && !ifa.ifa_addr.is_null() {
            // SAFETY: ifa_addr is non-null and points to a sockaddr of the list.
            let family = unsafe { (*ifa.ifa_addr).sa_family };
            if i32::from(family) == libc::AF_INET {
                // SAFETY: AF_INET addresses are sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                found = Some(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)));
                break;
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: frees the list getifaddrs allocated, once.
    unsafe { libc::freeifaddrs(ifaddrs) };
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_loopback_address_and_no_other() {
        assert_eq!(interface_address("lo"), Some(Ipv4Addr::LOCALHOST));
        assert_eq!(interface_address("no-such-nic0"), None);
    }

    #[test]
    fn tcp_info_reads_a_connection_and_refuses_a_file() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let info = tcp_info(&c).unwrap();
        assert_eq!(info.tcpi_state, 1, "TCP_ESTABLISHED");
        assert!(info.tcpi_snd_mss > 0 && info.tcpi_pmtu > 0, "{info:?}");
        let f = std::fs::File::open("/proc/self/status").unwrap();
        assert!(tcp_info(&f).is_err());
    }

    #[test]
    fn pacing_is_set_on_a_socket_and_refused_on_a_file() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        set_max_pacing_rate(&l, 1 << 30).unwrap();
        let f = std::fs::File::open("/proc/self/status").unwrap();
        assert!(set_max_pacing_rate(&f, 1 << 30).is_err());
    }
}
