//! Can this agent read and write the pool's storage as the user it runs as?
//!
//! Agents run with all capabilities dropped but IPC_LOCK and NET_ADMIN, so
//! file permissions apply to them as to anyone: data owned by uid 1000 with
//! mode 0600 cannot be read by an agent running as root without
//! DAC_READ_SEARCH. The agent tries each allowed root once a minute (list
//! it; where the pool may write, create, write, read back and remove a probe
//! file) and reports what failed in its Lease, from where the pool's status
//! shows it; and a Transfer that fails on permissions says who the agent is.

use std::io::{Read, Write};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use wirerate_crds::contract;

/// Who the agent runs as, for messages: `uid 1000, gid 1000, groups 1000,2000`.
pub fn identity() -> String {
    let uid = rustix::process::getuid().as_raw();
    let gid = rustix::process::getgid().as_raw();
    let groups: Vec<String> = rustix::process::getgroups()
        .unwrap_or_default()
        .iter()
        .map(|g| g.as_raw().to_string())
        .collect();
    format!("uid {uid}, gid {gid}, groups [{}]", groups.join(","))
}

const FIX: &str = "set the pool's spec.securityContext (runAsUser, runAsGroup, fsGroup or supplementalGroups) to match the data's owner, or add a capability there (DAC_READ_SEARCH to read, DAC_OVERRIDE to write)";

/// Failed checks of `roots`, each `(root, whether the pool may write there)`,
/// as (check, what was found and what to change).
pub fn probe(roots: &[(String, bool)], agent: &str) -> Vec<(String, String)> {
    let who = identity();
    let mut out = Vec::new();
    for (root, writes) in roots {
        let dir = Path::new(root);
        if let Err(e) = std::fs::read_dir(dir) {
            out.push((
                contract::PREFLIGHT_STORAGE_READABLE.to_owned(),
                format!("cannot list {root}: {e} (the agent runs as {who}): {FIX}"),
            ));
            continue;
        }
        if *writes && let Err(e) = write_and_read_back(dir, agent) {
            out.push((
                contract::PREFLIGHT_STORAGE_WRITABLE.to_owned(),
                format!("cannot write and read back a file in {root}: {e} (the agent runs as {who}): {FIX}"),
            ));
        }
    }
    out
}

fn write_and_read_back(dir: &Path, agent: &str) -> std::io::Result<()> {
    let name = dir.join(format!("{}{agent}", contract::STORAGE_PROBE_PREFIX));
    let payload = format!("wirerate storage probe by {agent}\n");
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&name)?;
        f.write_all(payload.as_bytes())?;
        drop(f);
        let mut back = String::new();
        std::fs::File::open(&name)?.read_to_string(&mut back)?;
        if back != payload {
            return Err(std::io::Error::other("read back something else"));
        }
        Ok(())
    })();
    let _ = std::fs::remove_file(&name);
    result
}

/// What was probed, when, and what was found.
type Probed = (Instant, Vec<(String, bool)>, Vec<(String, String)>);

/// [`probe`], at most once a minute: the findings go into every heartbeat.
pub fn probe_cached(roots: &[(String, bool)], agent: &str) -> Vec<(String, String)> {
    static LAST: Mutex<Option<Probed>> = Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((at, checked, found)) = last.as_ref()
        && at.elapsed() < Duration::from_secs(60)
        && checked == roots
    {
        return found.clone();
    }
    let found = probe(roots, agent);
    *last = Some((Instant::now(), roots.to_vec(), found.clone()));
    found
}

/// Adds who the agent is to an error caused by file permissions.
pub fn explain(e: &wirerate_engine::Error) -> String {
    let denied = match e {
        wirerate_engine::Error::Io { cause, .. } => {
            cause.kind() == std::io::ErrorKind::PermissionDenied
        }
        _ => false,
    };
    if denied {
        format!("{e} (the agent runs as {}): {FIX}", identity())
    } else {
        e.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let d =
            std::env::temp_dir().join(format!("wirerate-storage-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_usable_root_has_no_findings_and_no_leftovers() {
        let d = scratch("ok");
        let root = d.display().to_string();
        assert!(probe(&[(root.clone(), true)], "a0").is_empty());
        assert_eq!(
            std::fs::read_dir(&d).unwrap().count(),
            0,
            "probe file removed"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_missing_root_is_named_with_who_the_agent_is() {
        let f = probe(&[("/nonexistent/wirerate".to_owned(), true)], "a0");
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].0, contract::PREFLIGHT_STORAGE_READABLE);
        assert!(f[0].1.contains("uid "), "{}", f[0].1);
        assert!(f[0].1.contains("securityContext"), "{}", f[0].1);
    }

    // Found in a cluster: an agent that could not write its destination
    // failed each Transfer in turn and the pool said nothing.
    #[test]
    fn an_unwritable_root_is_reported_where_the_pool_writes_only() {
        let d = scratch("ro");
        let sub = d.join("locked");
        std::fs::create_dir(&sub).unwrap();
        // Tests run as root, whom modes do not stop: make the write fail by
        // taking the probe's name with a directory.
        std::fs::create_dir(sub.join(".wirerate-probe-a0")).unwrap();
        let root = sub.display().to_string();
        let f = probe(&[(root.clone(), true)], "a0");
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].0, contract::PREFLIGHT_STORAGE_WRITABLE);
        assert!(
            probe(&[(root, false)], "a0").is_empty(),
            "read-only roots are only read"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn permission_errors_say_who_the_agent_is() {
        let e = wirerate_engine::Error::io(
            "opening /data/x",
            std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        );
        let m = explain(&e);
        assert!(m.contains("uid ") && m.contains("DAC_READ_SEARCH"), "{m}");
        let other = wirerate_engine::Error::Config("x".into());
        assert_eq!(explain(&other), other.to_string());
    }
}
