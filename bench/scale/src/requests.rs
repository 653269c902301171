//! Who asked the API server for what, so far: the double counts requests
//! itself; a real API server records them in its audit log, which the
//! bench reads as it grows. Both end up as one [`Tally`], so every figure
//! built on it means the same against either.
//!
//! The audit log must be JSON lines (`--audit-log-format=json`, the
//! default) at level `Metadata` or above for every request; the bench
//! counts an event once, at its `ResponseComplete` stage. Who made it comes
//! from its User-Agent: the operator sends `wirerate-operator/<version>`,
//! the bench's driver `wirerate-scale`; the API server's own loopback
//! requests and anyone else's are left out.

use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::PathBuf;
use std::sync::Mutex;

use anyhow::Context as _;
use serde::Deserialize;
use wirerate_apiserver_double::{Actor, ApiServer, DRIVER_AGENT, Tally};

/// The operator's User-Agent prefix, as its client sends it.
const OPERATOR_AGENT: &str = "wirerate-operator";

/// Where the requests are counted.
pub(crate) enum Requests<'a> {
    /// The double counts them as it serves them.
    Double(&'a ApiServer),
    /// A real API server's audit log, read from where it was last read.
    Audit(Mutex<AuditLog>),
    /// A real API server whose audit log the bench was not given.
    Unknown,
}

impl Requests<'_> {
    /// Everything counted so far; `None` when nothing can be.
    pub(crate) fn tally(&self) -> Option<Tally> {
        match self {
            Self::Double(d) => Some(d.counts()),
            Self::Audit(log) => {
                let mut log = log.lock().expect("audit log lock");
                match log.catch_up() {
                    Ok(()) => Some(log.tally.clone()),
                    Err(e) => {
                        eprintln!("warning: {e:#}");
                        None
                    }
                }
            }
            Self::Unknown => None,
        }
    }
}

/// An audit log read so far.
pub(crate) struct AuditLog {
    path: PathBuf,
    /// Bytes read, up to the end of the last whole line.
    offset: u64,
    tally: Tally,
}

/// The parts of an audit event the tally needs.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Event {
    stage: String,
    verb: String,
    #[serde(default)]
    user_agent: String,
    #[serde(default)]
    object_ref: Option<ObjectRef>,
}

#[derive(Deserialize)]
struct ObjectRef {
    #[serde(default)]
    resource: String,
    #[serde(default)]
    subresource: Option<String>,
}

impl AuditLog {
    /// Counts from the log's current end on: what was there before the
    /// bench started is someone else's.
    pub(crate) fn open(path: PathBuf) -> anyhow::Result<Self> {
        let offset = std::fs::metadata(&path)
            .with_context(|| format!("cannot read the audit log {}", path.display()))?
            .len();
        Ok(Self {
            path,
            offset,
            tally: Tally::new(),
        })
    }

    /// Reads and counts the lines written since the last call.
    fn catch_up(&mut self) -> anyhow::Result<()> {
        let mut f = std::fs::File::open(&self.path)
            .with_context(|| format!("cannot open the audit log {}", self.path.display()))?;
        if f.metadata()?.len() < self.offset {
            anyhow::bail!(
                "the audit log {} shrank: rotated while the bench ran (raise --audit-log-maxsize)",
                self.path.display()
            );
        }
        f.seek(SeekFrom::Start(self.offset))?;
        let mut text = Vec::new();
        f.read_to_end(&mut text)?;
        // A line still being written is left for the next call.
        let whole = text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        for line in text[..whole].split(|&b| b == b'\n') {
            if let Some((actor, verb, resource)) = counted(line) {
                *self.tally.entry((actor, verb, resource)).or_default() += 1;
            }
        }
        self.offset += whole as u64;
        Ok(())
    }
}

/// One audit line as (who, verb, resource), when it is a completed request
/// of the operator or the driver.
fn counted(line: &[u8]) -> Option<(Actor, &'static str, String)> {
    let e: Event = serde_json::from_slice(line).ok()?;
    if e.stage != "ResponseComplete" {
        return None;
    }
    let actor = if e.user_agent.starts_with(OPERATOR_AGENT) {
        Actor::Operator
    } else if e.user_agent.starts_with(DRIVER_AGENT) {
        Actor::Driver
    } else {
        return None;
    };
    let verb = match e.verb.as_str() {
        "create" => "create",
        "update" => "update",
        "patch" => "patch",
        "delete" => "delete",
        "deletecollection" => "deletecollection",
        "get" => "get",
        "list" => "list",
        "watch" => "watch",
        _ => "other",
    };
    let resource = match e.object_ref {
        Some(ObjectRef {
            resource,
            subresource: Some(sub),
        }) => format!("{resource}/{sub}"),
        Some(o) => o.resource,
        None => String::new(),
    };
    Some((actor, verb, resource))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_audit_line_is_counted_by_user_agent_at_completion() {
        let op = br#"{"kind":"Event","stage":"ResponseComplete","verb":"patch","userAgent":"wirerate-operator/0.1.0","objectRef":{"resource":"transfers","namespace":"a","name":"t","subresource":"status"}}"#;
        assert_eq!(
            counted(op),
            Some((Actor::Operator, "patch", "transfers/status".into()))
        );
        let started = br#"{"stage":"ResponseStarted","verb":"watch","userAgent":"wirerate-operator/0.1.0","objectRef":{"resource":"transfers"}}"#;
        assert_eq!(counted(started), None);
        let driver = br#"{"stage":"ResponseComplete","verb":"create","userAgent":"wirerate-scale","objectRef":{"resource":"transfers"}}"#;
        assert_eq!(
            counted(driver),
            Some((Actor::Driver, "create", "transfers".into()))
        );
        let server = br#"{"stage":"ResponseComplete","verb":"update","userAgent":"kube-apiserver/v1.32.13","objectRef":{"resource":"leases"}}"#;
        assert_eq!(counted(server), None);
        assert_eq!(counted(b"{not json"), None);
    }

    #[test]
    fn a_line_half_written_waits_for_the_next_read() {
        let dir = std::env::temp_dir().join(format!("wirerate-audit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("audit.log");
        std::fs::write(&path, "old line before the bench\n").unwrap();
        let mut log = AuditLog::open(path.clone()).unwrap();
        let line = r#"{"stage":"ResponseComplete","verb":"create","userAgent":"wirerate-operator/1","objectRef":{"resource":"secrets"}}"#;
        let (head, tail) = line.split_at(40);
        std::fs::write(&path, format!("old line before the bench\n{line}\n{head}")).unwrap();
        log.catch_up().unwrap();
        assert_eq!(log.tally.values().sum::<u64>(), 1);
        std::fs::write(
            &path,
            format!("old line before the bench\n{line}\n{head}{tail}\n"),
        )
        .unwrap();
        log.catch_up().unwrap();
        let key = (Actor::Operator, "create", "secrets".to_owned());
        assert_eq!(log.tally.get(&key), Some(&2));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
