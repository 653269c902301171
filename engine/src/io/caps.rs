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

/// A kernel setting by its sysctl name (`net.core.rmem_max`), read now,
/// trimmed; empty when it cannot be read (a setting the kernel lacks, or
/// one hidden in this network namespace, reads as unknown either way).
/// The probe below, the in-cluster preflight, the socket setup's
/// explanations and the node name all read /proc/sys through here.
pub fn sysctl(name: &str) -> String {
    read_trim(&format!("/proc/sys/{}", name.replace('.', "/")))
}

/// A numeric sysctl, if it reads as one.
pub fn sysctl_number(name: &str) -> Option<i64> {
    sysctl(name).parse().ok()
}

/// The words of a list-valued sysctl (`net.ipv4.tcp_available_congestion_control`).
pub fn sysctl_words(name: &str) -> Vec<String> {
    sysctl(name).split_whitespace().map(str::to_owned).collect()
}

fn third_field(name: &str) -> u64 {
    sysctl(name)
        .split_whitespace()
        .nth(2)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Whether a connection that pauses (between files, while a checkpoint
/// syncs, a reused warm connection) has its window cut and ramps again.
/// Read now, per network namespace; `None` when it cannot be read.
pub fn slow_start_after_idle() -> Option<bool> {
    sysctl_number(crate::advice::SLOW_START_AFTER_IDLE).map(|v| v != 0)
}

/// Whether one `syncfs` may stand for the fdatasync of each file on a
/// filesystem of type `f_type` (`statfs`): only where the kernel's syncfs
/// reports writeback errors (Linux 5.8 and later; before, it returned
/// success whatever failed) and on the local filesystems known to write
/// back and report through it. Elsewhere (FUSE, which forwards syncfs to
/// its daemon only for virtiofs; network and out-of-tree filesystems whose
/// syncfs is unknown) each file is synced on its own.
pub fn syncfs_trusted(f_type: i64) -> bool {
    static REPORTS: OnceLock<bool> = OnceLock::new();
    let reports = *REPORTS.get_or_init(|| release_at_least(&sysctl("kernel.osrelease"), (5, 8)));
    reports && LOCAL_FILESYSTEMS.contains(&f_type)
}

/// The `statfs` type of the filesystem `fd` is on; 0 when it cannot be
/// read.
pub fn fs_type(fd: impl std::os::fd::AsFd) -> i64 {
    // `f_type`'s width differs by target (i64 on x86_64 and aarch64).
    #[allow(clippy::unnecessary_cast)]
    rustix::fs::fstatfs(fd).map_or(0, |s| s.f_type as i64)
}

/// ext4 (and ext2/3), XFS, btrfs and tmpfs, by their `statfs` magic.
const LOCAL_FILESYSTEMS: [i64; 4] = [0xEF53, 0x5846_5342, 0x9123_683E, 0x0102_1994];

/// Whether kernel release `release` (`6.1.0-28-amd64`, `4.18.0-477.el8`)
/// is `min` or later; an unreadable one is not.
fn release_at_least(release: &str, min: (u32, u32)) -> bool {
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(major), Some(minor)) => (major, minor) >= min,
        _ => false,
    }
}

/// The probed capabilities of this host (probed on first use).
pub fn capabilities() -> &'static Capabilities {
    static CAPS: OnceLock<Capabilities> = OnceLock::new();
    CAPS.get_or_init(|| Capabilities {
        io_uring: io_uring::IoUring::new(2)
            .map(drop)
            .map_err(|e| io_uring_refused(&e)),
        congestion: sysctl_words("net.ipv4.tcp_available_congestion_control"),
        default_congestion: sysctl("net.ipv4.tcp_congestion_control"),
        tcp_rmem_max: third_field("net.ipv4.tcp_rmem"),
        tcp_wmem_max: third_field("net.ipv4.tcp_wmem"),
    })
}

/// Why the kernel refused an io_uring, and what would allow it: a
/// container runtime's default seccomp profile (Docker's and containerd's
/// both deny `io_uring_setup`), the host's `kernel.io_uring_disabled`, or a
/// kernel without io_uring look alike from here (EPERM or ENOSYS).
pub fn io_uring_refused(e: &std::io::Error) -> String {
    explain_refusal(
        e,
        &sysctl("kernel.io_uring_disabled"),
        &std::fs::read_to_string("/proc/self/status").unwrap_or_default(),
    )
}

/// The profile that allows io_uring and nothing else beyond the runtime's
/// default, as shipped in the repository and installed on the nodes.
pub const SECCOMP_PROFILE: &str = "deploy/seccomp/wirerate-agent.json";

fn explain_refusal(e: &std::io::Error, disabled: &str, status: &str) -> String {
    let filtered = status
        .lines()
        .find_map(|l| l.strip_prefix("Seccomp:"))
        .is_some_and(|m| m.trim() == "2");
    match (e.raw_os_error(), disabled) {
        (Some(libc::EPERM), "2") => format!(
            "io_uring is disabled on this host ({e}; kernel.io_uring_disabled = 2): set the sysctl to 0 on the node to use it"
        ),
        (Some(libc::EPERM), "1") => format!(
            "io_uring is restricted on this host ({e}; kernel.io_uring_disabled = 1 allows only the group in kernel.io_uring_group): set the sysctl to 0, or run the agent in that group"
        ),
        (Some(libc::EPERM | libc::ENOSYS), _) if filtered => format!(
            "io_uring is blocked by seccomp ({e}): the container runtime's default profile denies io_uring_setup; run the agent with the profile {SECCOMP_PROFILE} (docker run --security-opt seccomp={SECCOMP_PROFILE}; in Kubernetes, the DtnPool's seccompProfile of type Localhost with that file installed on the nodes)"
        ),
        (Some(libc::ENOSYS), _) => {
            format!("this kernel has no io_uring ({e}; it needs Linux 5.1 or later built with it)")
        }
        (Some(libc::ENOMEM), _) => format!(
            "the kernel refused the ring's memory ({e}): raise the locked-memory limit (ulimit -l) or grant IPC_LOCK"
        ),
        _ => format!("io_uring unavailable: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::release_at_least;

    #[test]
    fn syncfs_stands_for_file_syncs_only_on_local_filesystems() {
        // This machine's kernel is 5.8 or later (the test below says how
        // that is read).
        assert!(syncfs_trusted(0xEF53), "ext4");
        assert!(syncfs_trusted(0x5846_5342), "xfs");
        assert!(!syncfs_trusted(0x6573_5546), "fuse");
        assert!(!syncfs_trusted(0x6969), "nfs");
        assert!(!syncfs_trusted(0x0BD0_0BD0), "lustre");
        assert!(!syncfs_trusted(0));
    }

    #[test]
    fn syncfs_is_trusted_with_writeback_errors_from_linux_5_8() {
        assert!(release_at_least("6.1.0-28-amd64", (5, 8)));
        assert!(release_at_least("5.8.0", (5, 8)));
        assert!(release_at_least("5.14.0-427.el9.x86_64", (5, 8)));
        // RHEL 8's kernel, and the ones before the fix.
        assert!(!release_at_least("4.18.0-477.el8.x86_64", (5, 8)));
        assert!(!release_at_least("5.4.0-150-generic", (5, 8)));
        assert!(!release_at_least("", (5, 8)));
        assert!(!release_at_least("garbage", (5, 8)));
    }

    use super::*;

    fn errno(n: i32) -> std::io::Error {
        std::io::Error::from_raw_os_error(n)
    }

    const FILTERED: &str = "Name:\twirerate-agent\nSeccomp:\t2\nSeccomp_filters:\t1\n";
    const OPEN: &str = "Name:\twirerate-agent\nSeccomp:\t0\n";

    #[test]
    fn sysctls_are_read_by_their_names() {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
        assert_eq!(sysctl("kernel.hostname"), host.trim());
        assert!(sysctl_number("kernel.pid_max").is_some_and(|v| v > 0));
        assert_eq!(sysctl_words("kernel.ostype"), ["Linux"]);
        assert_eq!(sysctl("no.such.setting"), "");
        assert_eq!(sysctl_number("kernel.hostname"), None);
    }

    #[test]
    fn a_seccomp_filter_is_named_with_the_profile_that_allows_io_uring() {
        let why = explain_refusal(&errno(libc::EPERM), "0", FILTERED);
        assert!(why.contains("blocked by seccomp"), "{why}");
        assert!(why.contains(SECCOMP_PROFILE), "{why}");
    }

    #[test]
    fn the_hosts_sysctl_is_named_before_seccomp() {
        let why = explain_refusal(&errno(libc::EPERM), "2", FILTERED);
        assert!(why.contains("kernel.io_uring_disabled = 2"), "{why}");
        let why = explain_refusal(&errno(libc::EPERM), "1", OPEN);
        assert!(why.contains("kernel.io_uring_group"), "{why}");
    }

    #[test]
    fn no_filter_and_enosys_is_an_old_kernel() {
        let why = explain_refusal(&errno(libc::ENOSYS), "", OPEN);
        assert!(why.contains("no io_uring"), "{why}");
        let why = explain_refusal(&errno(libc::EPERM), "0", OPEN);
        assert!(why.starts_with("io_uring unavailable"), "{why}");
    }
}
