//! What this host can do, probed once: io_uring, hugepages, congestion
//! control, TCP buffer limits.

use std::sync::OnceLock;

/// Host capabilities relevant to the data path.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Capabilities {
    /// io_uring setup works (or the reason it does not).
    pub io_uring: Result<(), String>,
    /// Congestion control algorithms the kernel offers.
    pub congestion: Vec<String>,
    /// The default congestion control.
    pub default_congestion: String,
    /// Maximum TCP receive buffer (net.ipv4.tcp_rmem, third field).
    pub tcp_rmem_max: u64,
    /// Maximum TCP send buffer (net.ipv4.tcp_wmem, third field).
    pub tcp_wmem_max: u64,
}

fn read_trim(path: &str) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .trim()
        .to_string()
}

fn third_field(path: &str) -> u64 {
    read_trim(path)
        .split_whitespace()
        .nth(2)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The probed capabilities of this host (probed on first use).
pub fn capabilities() -> &'static Capabilities {
    static CAPS: OnceLock<Capabilities> = OnceLock::new();
    CAPS.get_or_init(|| Capabilities {
        io_uring: io_uring::IoUring::new(2)
            .map(drop)
            .map_err(|e| e.to_string()),
        congestion: read_trim("/proc/sys/net/ipv4/tcp_available_congestion_control")
            .split_whitespace()
            .map(str::to_string)
            .collect(),
        default_congestion: read_trim("/proc/sys/net/ipv4/tcp_congestion_control"),
        tcp_rmem_max: third_field("/proc/sys/net/ipv4/tcp_rmem"),
        tcp_wmem_max: third_field("/proc/sys/net/ipv4/tcp_wmem"),
    })
}
