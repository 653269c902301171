//! The host as the agent sees it: the address of a NIC, preflight checks of
//! the pool's expectations, and the filesystem under a destination.

use std::path::Path;

use wirerate_crds::pool::Preflight;
use wirerate_engine::IoMode;
use wirerate_engine::advice::SLOW_START_AFTER_IDLE;
use wirerate_engine::io::caps::{slow_start_after_idle, sysctl_number, sysctl_words};

pub use wirerate_engine::io::sys::interface_address;

/// What the host reads as, for the checks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Readings {
    /// net.core.rmem_max.
    pub rmem_max: Option<i64>,
    /// net.core.wmem_max.
    pub wmem_max: Option<i64>,
    /// tcp_available_congestion_control.
    pub congestion: Vec<String>,
    /// MTU of the data NIC.
    pub mtu: Option<i32>,
    /// net.ipv4.tcp_slow_start_after_idle, on or off.
    pub slow_start_after_idle: Option<bool>,
}

impl Readings {
    /// Reads them from /proc and /sys.
    pub fn read(interface: Option<&str>) -> Self {
        let num = |p: &str| {
            std::fs::read_to_string(p)
                .ok()
                .and_then(|s| s.trim().parse().ok())
        };
        Self {
            rmem_max: sysctl_number("net.core.rmem_max"),
            wmem_max: sysctl_number("net.core.wmem_max"),
            congestion: sysctl_words("net.ipv4.tcp_available_congestion_control"),
            mtu: interface
                .and_then(|i| num(&format!("/sys/class/net/{i}/mtu")).map(|v: i64| v as i32)),
            slow_start_after_idle: slow_start_after_idle(),
        }
    }
}

/// Failed checks as (check, what was found and what to change).
pub fn preflight(expect: &Preflight, mtu: Option<i32>, r: &Readings) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if let Some(min) = expect.min_socket_buffer {
        for (name, v) in [("rmem_max", r.rmem_max), ("wmem_max", r.wmem_max)] {
            if v.is_some_and(|v| v < min) {
                out.push((name.to_owned(), format!(
                    "net.core.{name} is {}, below the pool's minSocketBuffer {min}: sysctl -w net.core.{name}={min}",
                    v.unwrap_or(0)
                )));
            }
        }
    }
    if let Some(cc) = &expect.congestion
        && !r.congestion.iter().any(|c| c == cc)
    {
        out.push((
            "congestion".to_owned(),
            format!(
                "congestion control {cc} is not available (have: {}): modprobe tcp_{cc}",
                r.congestion.join(" ")
            ),
        ));
    }
    if let (Some(want), Some(have)) = (mtu, r.mtu)
        && want != have
    {
        out.push((
            "mtu".to_owned(),
            format!("the data NIC's MTU is {have}, the pool expects {want}"),
        ));
    }
    if let (Some(want), Some(have)) = (expect.slow_start_after_idle, r.slow_start_after_idle)
        && want != have
    {
        let (is, fix) = if have { ("on", 0) } else { ("off", 1) };
        let why = if have {
            " (a data stream that pauses has its window halved for every retransmission timeout the pause lasts)"
        } else {
            ""
        };
        out.push((
            "slow_start_after_idle".to_owned(),
            format!(
                "{SLOW_START_AFTER_IDLE} is {is}, the pool expects it {}{why}: sysctl -w {SLOW_START_AFTER_IDLE}={fix}",
                if want { "on" } else { "off" }
            ),
        ));
    }
    out
}

/// Lustre's statfs magic.
const LUSTRE_MAGIC: i64 = 0x0BD0_0BD0;

/// The I/O mode the pool's transfers get on this host, and why it is not
/// the one asked for: async needs an io_uring, which seccomp, a sysctl or
/// the kernel may refuse (`uring` is the probe's outcome).
pub fn io_mode(wanted: IoMode, uring: &Result<(), String>) -> (IoMode, Option<String>) {
    match (wanted, uring) {
        (IoMode::Async, Err(why)) => (
            IoMode::Direct,
            Some(format!("{why}; transfers use synchronous direct I/O")),
        ),
        (m, _) => (m, None),
    }
}

/// Whether `dir` is on Lustre, and the filesystem's magic number.
pub fn lustre(dir: &Path) -> (bool, i64) {
    match rustix::fs::statfs(dir) {
        Ok(s) => (s.f_type == LUSTRE_MAGIC, s.f_type),
        Err(_) => (false, 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_ring_turns_async_into_direct_with_the_reason() {
        let refused = Err("io_uring is blocked by seccomp (EPERM)".to_owned());
        let (mode, why) = io_mode(IoMode::Async, &refused);
        assert_eq!(mode, IoMode::Direct);
        assert!(why.unwrap().contains("blocked by seccomp"));
        assert_eq!(io_mode(IoMode::Async, &Ok(())), (IoMode::Async, None));
        // A pool that asks for buffered I/O needs no ring.
        assert_eq!(
            io_mode(IoMode::Buffered, &refused),
            (IoMode::Buffered, None)
        );
    }

    #[test]
    fn preflight_names_the_fix() {
        let expect = Preflight {
            min_socket_buffer: Some(1 << 30),
            congestion: Some("bbr".into()),
            slow_start_after_idle: Some(false),
        };
        let r = Readings {
            rmem_max: Some(212992),
            wmem_max: Some(1 << 30),
            congestion: vec!["reno".into(), "cubic".into()],
            mtu: Some(1500),
            slow_start_after_idle: Some(true),
        };
        let f = preflight(&expect, Some(9000), &r);
        let checks: Vec<&str> = f.iter().map(|(c, _)| c.as_str()).collect();
        assert_eq!(
            checks,
            ["rmem_max", "congestion", "mtu", "slow_start_after_idle"]
        );
        assert!(f[0].1.contains("sysctl -w net.core.rmem_max="));
        assert!(
            f[3].1
                .ends_with("sysctl -w net.ipv4.tcp_slow_start_after_idle=0"),
            "{}",
            f[3].1
        );
        assert!(preflight(&Preflight::default(), None, &r).is_empty());
        // As the pool expects, or unreadable: nothing to report.
        let off = Readings {
            slow_start_after_idle: Some(false),
            ..r.clone()
        };
        assert!(
            !preflight(&expect, None, &off)
                .iter()
                .any(|(c, _)| c == "slow_start_after_idle")
        );
        let unknown = Readings {
            slow_start_after_idle: None,
            ..r.clone()
        };
        assert!(
            !preflight(&expect, None, &unknown)
                .iter()
                .any(|(c, _)| c == "slow_start_after_idle")
        );
    }
}
