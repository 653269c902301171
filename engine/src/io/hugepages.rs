//! Where the buffer pool's huge pages come from. In a pod, from what the pod
//! was given: the hugetlbfs mount the operator renders from
//! `DtnPool.spec.hugepages` (named by `WIRERATE_HUGEPAGES`), at that mount's
//! page size (2 MiB or 1 GiB), and within the pod's hugetlb cgroup limit —
//! not the host's free pages, which a pod may not be allowed to fault in
//! (a fault past the cgroup limit is a SIGBUS, not an error). Outside a pod,
//! from the host's free 2 MiB pages.
//!
//! `decide` is pure; `offer` reads /proc and /sys.

use std::path::{Path, PathBuf};

/// The variable naming the pod's hugetlbfs mount.
pub const ENV: &str = "WIRERATE_HUGEPAGES";

/// A huge page size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PageSize {
    /// 2 MiB.
    TwoMib,
    /// 1 GiB.
    OneGib,
}

impl PageSize {
    /// Bytes per page.
    pub fn bytes(self) -> usize {
        match self {
            Self::TwoMib => 2 << 20,
            Self::OneGib => 1 << 30,
        }
    }

    /// The size as /sys and cgroups spell it: `2048kB` and `2MB`.
    fn names(self) -> (&'static str, &'static str) {
        match self {
            Self::TwoMib => ("2048kB", "2MB"),
            Self::OneGib => ("1048576kB", "1GB"),
        }
    }

    /// mmap's MAP_HUGE_* flag for an anonymous mapping of this size.
    pub fn map_flag(self) -> i32 {
        // log2 of the size, shifted by MAP_HUGE_SHIFT (26).
        match self {
            Self::TwoMib => 21 << 26,
            Self::OneGib => 30 << 26,
        }
    }

    /// From a hugetlbfs `pagesize=` option (`2M`, `2048k`, `1G`, `1024M`).
    fn parse(s: &str) -> Option<Self> {
        let s = s.trim();
        let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit())?);
        let n: u64 = n.parse().ok()?;
        let bytes = match unit.to_ascii_uppercase().as_str() {
            "K" | "KB" => n << 10,
            "M" | "MB" => n << 20,
            "G" | "GB" => n << 30,
            _ => return None,
        };
        [Self::TwoMib, Self::OneGib]
            .into_iter()
            .find(|p| p.bytes() as u64 == bytes)
    }
}

impl std::fmt::Display for PageSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::TwoMib => "2 MiB",
            Self::OneGib => "1 GiB",
        })
    }
}

/// What the pod and the host offer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Offer {
    /// The mount `WIRERATE_HUGEPAGES` names, with its page size (None: not a
    /// hugetlbfs mount).
    pub mount: Option<(PathBuf, Option<PageSize>)>,
    /// Free pages on the host, in bytes, by size.
    pub host_free: Vec<(PageSize, u64)>,
    /// Room left under the pod's hugetlb cgroup limit, in bytes, by size;
    /// a size not listed has no limit known.
    pub cgroup_room: Vec<(PageSize, u64)>,
}

/// How the pool's memory is mapped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backing {
    /// Huge pages of `page`, `len` bytes (rounded up to the page); from a
    /// file in `file_in` (a hugetlbfs mount) or anonymous.
    Huge {
        /// Page size.
        page: PageSize,
        /// Length of the mapping.
        len: usize,
        /// The hugetlbfs mount to map a file of, if any.
        file_in: Option<PathBuf>,
    },
    /// Normal pages; `why` says why the huge pages asked for are not used.
    Normal {
        /// Set when huge pages were asked for (`WIRERATE_HUGEPAGES`).
        why: Option<String>,
    },
}

fn fmt_mib(b: u64) -> String {
    format!("{} MiB", b >> 20)
}

/// How to map `len` bytes of buffers, given `offer`.
pub fn decide(offer: &Offer, len: usize) -> Backing {
    let room = |page: PageSize| {
        let host = offer
            .host_free
            .iter()
            .find(|(p, _)| *p == page)
            .map_or(0, |(_, b)| *b);
        let cgroup = offer
            .cgroup_room
            .iter()
            .find(|(p, _)| *p == page)
            .map_or(u64::MAX, |(_, b)| *b);
        host.min(cgroup)
    };
    let Some((path, page)) = &offer.mount else {
        // Not asked for: the host's free 2 MiB pages if there are enough.
        let page = PageSize::TwoMib;
        let need = len.div_ceil(page.bytes()) * page.bytes();
        return if room(page) >= need as u64 {
            Backing::Huge {
                page,
                len: need,
                file_in: None,
            }
        } else {
            Backing::Normal { why: None }
        };
    };
    let Some(page) = page else {
        return Backing::Normal {
            why: Some(format!(
                "{ENV} is {}, which is not a hugetlbfs mount with a page size of 2 MiB or 1 GiB: buffers are on normal pages",
                path.display()
            )),
        };
    };
    let need = len.div_ceil(page.bytes()) * page.bytes();
    let have = room(*page);
    if have >= need as u64 {
        Backing::Huge {
            page: *page,
            len: need,
            file_in: Some(path.clone()),
        }
    } else {
        Backing::Normal {
            why: Some(format!(
                "the buffers need {} of {page} huge pages but only {} are free to this agent (host and pod limit): buffers are on normal pages; raise DtnPool.spec.hugepages or lower tuning.queueDepth",
                fmt_mib(need as u64),
                fmt_mib(have)
            )),
        }
    }
}

/// The hugetlbfs page size of the mount at `at`, from /proc/self/mountinfo
/// text; None if nothing of type hugetlbfs is mounted there.
pub fn mount_page_size(mountinfo: &str, at: &Path) -> Option<Option<PageSize>> {
    mountinfo.lines().rev().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let point = left.split_whitespace().nth(4)?;
        if Path::new(&unescape(point)) != at {
            return None;
        }
        let mut r = right.split_whitespace();
        if r.next()? != "hugetlbfs" {
            return Some(None);
        }
        let opts = r.nth(1).unwrap_or_default();
        // Without a pagesize option, the mount has the default size: 2 MiB on x86.
        let size = opts
            .split(',')
            .find_map(|o| o.strip_prefix("pagesize="))
            .map_or(Some(PageSize::TwoMib), PageSize::parse);
        Some(size)
    })
}

/// mountinfo escapes spaces and the like as octal (`\040`).
fn unescape(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' {
            let code: String = chars.by_ref().take(3).collect();
            match u8::from_str_radix(&code, 8) {
                Ok(b) => out.push(b as char),
                Err(_) => {
                    out.push('\\');
                    out.push_str(&code);
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn read_u64(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// What this process is offered, read from /proc and /sys.
pub fn offer() -> Offer {
    let sizes = [PageSize::TwoMib, PageSize::OneGib];
    let host_free = sizes
        .iter()
        .map(|p| {
            let pages = read_u64(&format!(
                "/sys/kernel/mm/hugepages/hugepages-{}/free_hugepages",
                p.names().0
            ))
            .unwrap_or(0);
            (*p, pages * p.bytes() as u64)
        })
        .collect();
    let cgroup_room = sizes
        .iter()
        .filter_map(|p| {
            let n = p.names().1;
            // cgroup v2, then v1. "max" (v2) means no limit.
            let v2 = std::fs::read_to_string(format!("/sys/fs/cgroup/hugetlb.{n}.max")).ok();
            let (limit, used) = match v2 {
                Some(max) => (
                    max.trim().parse::<u64>().ok()?,
                    read_u64(&format!("/sys/fs/cgroup/hugetlb.{n}.current")).unwrap_or(0),
                ),
                None => (
                    read_u64(&format!(
                        "/sys/fs/cgroup/hugetlb/hugetlb.{n}.limit_in_bytes"
                    ))?,
                    read_u64(&format!(
                        "/sys/fs/cgroup/hugetlb/hugetlb.{n}.usage_in_bytes"
                    ))
                    .unwrap_or(0),
                ),
            };
            Some((*p, limit.saturating_sub(used)))
        })
        .collect();
    let mount = std::env::var_os(ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .map(|path| {
            let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
            let page = mount_page_size(&info, &path).flatten();
            (path, page)
        });
    Offer {
        mount,
        host_free,
        cgroup_room,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    #[test]
    fn the_pods_mount_decides_the_page_size_and_its_limit_the_room() {
        let pod = |page, host: u64, limit: u64| Offer {
            mount: Some(("/dev/hugepages".into(), Some(page))),
            host_free: vec![(PageSize::TwoMib, 64 * GIB), (PageSize::OneGib, host)],
            cgroup_room: vec![(page, limit)],
        };
        // 1 GiB pages given, 4 GiB under the limit: 1.5 GiB of buffers take two pages.
        assert_eq!(
            decide(&pod(PageSize::OneGib, 8 * GIB, 4 * GIB), 1536 << 20),
            Backing::Huge {
                page: PageSize::OneGib,
                len: 2 << 30,
                file_in: Some("/dev/hugepages".into()),
            }
        );
        // The host has plenty of 2 MiB pages, but the pod was given 1 GiB
        // ones and a 1 GiB limit: normal pages, and it says why.
        let Backing::Normal { why: Some(why) } =
            decide(&pod(PageSize::OneGib, 8 * GIB, GIB), 1536 << 20)
        else {
            panic!("a pool past the pod's limit must not be mapped on huge pages");
        };
        assert!(why.contains("2048 MiB of 1 GiB huge pages"), "{why}");
        assert!(why.contains("only 1024 MiB"), "{why}");
        // The host's free pages bound it too.
        assert!(matches!(
            decide(&pod(PageSize::TwoMib, 0, 8 * GIB), 64 << 20),
            Backing::Huge {
                page: PageSize::TwoMib,
                ..
            }
        ));
        assert!(matches!(
            decide(
                &Offer {
                    host_free: vec![(PageSize::TwoMib, 32 * MIB)],
                    ..pod(PageSize::TwoMib, 0, 8 * GIB)
                },
                64 << 20
            ),
            Backing::Normal { why: Some(_) }
        ));
    }

    #[test]
    fn without_a_mount_only_the_hosts_free_2mib_pages_are_used_and_quietly() {
        let host = |free: u64| Offer {
            mount: None,
            host_free: vec![(PageSize::TwoMib, free), (PageSize::OneGib, 64 * GIB)],
            cgroup_room: vec![],
        };
        assert_eq!(
            decide(&host(64 * MIB), 63 << 20),
            Backing::Huge {
                page: PageSize::TwoMib,
                len: 64 << 20,
                file_in: None
            }
        );
        assert_eq!(
            decide(&host(32 * MIB), 63 << 20),
            Backing::Normal { why: None }
        );
    }

    #[test]
    fn a_mount_that_is_not_hugetlbfs_is_reported() {
        let o = Offer {
            mount: Some(("/data".into(), None)),
            host_free: vec![(PageSize::TwoMib, 64 * GIB)],
            cgroup_room: vec![],
        };
        let Backing::Normal { why: Some(why) } = decide(&o, MIB as usize) else {
            panic!("not a hugetlbfs mount");
        };
        assert!(why.contains("WIRERATE_HUGEPAGES is /data"), "{why}");
    }

    #[test]
    fn mountinfo_gives_the_page_size() {
        let info = "\
22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw
36 22 0:30 / /dev/hugepages rw,relatime shared:17 - hugetlbfs hugetlbfs rw,pagesize=1024M
37 22 0:31 / /mnt/huge\\0402m rw - hugetlbfs none rw,pagesize=2M
38 22 0:32 / /mnt/plain rw - hugetlbfs none rw
39 22 0:33 / /mnt/tmp rw - tmpfs tmpfs rw
";
        let at = |p: &str| mount_page_size(info, Path::new(p));
        assert_eq!(at("/dev/hugepages"), Some(Some(PageSize::OneGib)));
        assert_eq!(at("/mnt/huge 2m"), Some(Some(PageSize::TwoMib)));
        assert_eq!(at("/mnt/plain"), Some(Some(PageSize::TwoMib)));
        assert_eq!(at("/mnt/tmp"), Some(None));
        assert_eq!(at("/nowhere"), None);
        assert_eq!(PageSize::parse("1G"), Some(PageSize::OneGib));
        assert_eq!(PageSize::parse("2048k"), Some(PageSize::TwoMib));
        assert_eq!(PageSize::parse("4M"), None);
    }
}
