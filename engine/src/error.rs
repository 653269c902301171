//! The data path's one error type: every message says what went wrong and what to do.

use crate::wire::DecodeError;

/// Result alias used throughout the engine and the agent.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can stop a transfer or a server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Local file or disk trouble; the context names the file and the operation.
    #[error("{context}: {cause}")]
    Io {
        /// What we were doing, with the path.
        context: String,
        /// The operating system's error (in the message, so not chained again).
        cause: std::io::Error,
    },
    /// The network broke or a peer went away; a retry may succeed.
    #[error("{context}: {cause}")]
    Net {
        /// What we were doing, with the address.
        context: String,
        /// The operating system's error (in the message, so not chained again).
        cause: std::io::Error,
    },
    /// This host cannot listen where asked: the port is taken, or the
    /// address is not one of this host's.
    #[error("cannot listen on {addr}: {cause}{}", listen_hint(*addr, cause))]
    Listen {
        /// The address, resolved.
        addr: std::net::SocketAddr,
        /// The operating system's error.
        cause: std::io::Error,
    },
    /// Every port of a receiving agent's data port range is taken, or
    /// refused.
    #[error(
        "no data port of {first}..{end} is free to receive on (the last: {cause}){}",
        if cause.raw_os_error() == Some(libc::EADDRINUSE) {
            "; the agent's own receivers or other processes on the host hold them"
        } else {
            ""
        }
    )]
    NoFreePort {
        /// The range's first port.
        first: u16,
        /// The port after its last.
        end: u16,
        /// Why the last port could not be bound.
        cause: std::io::Error,
    },
    /// The receiver's name does not resolve.
    #[error("cannot resolve {addr}: {cause}; check the address")]
    Unresolvable {
        /// The address as given.
        addr: String,
        /// The resolver's error.
        cause: std::io::Error,
    },
    /// The peer sent something that is not valid wirerate protocol.
    #[error("peer sent an invalid frame: {0}; closing the connection")]
    Protocol(DecodeError),
    /// The peer broke the protocol's rules in a well-formed frame.
    #[error("peer violated the protocol: {0}; closing the connection")]
    Violation(crate::Violation),
    /// The two sides do not hold the same token.
    #[error("authentication failed: {0}")]
    Auth(AuthError),
    /// The two ends' encryption modes cannot be met: one requires TLS and
    /// the other will not (or something on the path removed the offer).
    #[error("encryption refused: {0}")]
    Encryption(crate::encryption::Disagreement),
    /// A destination path that would leave the receiver's root.
    #[error("refused destination path {path:?}: {reason}")]
    PathRefused {
        /// The path as the sender gave it.
        path: String,
        /// Why it was refused.
        reason: String,
    },
    /// A bad command-line value or combination of settings.
    #[error("invalid setting: {0}")]
    Config(String),
    /// A tuning value out of its bounds; the message names the field.
    #[error("invalid setting: {0}")]
    Tuning(crate::TuningError),
    /// A filesystem is full, or a quota reached: freeing space and trying
    /// again can get past it.
    #[error("no space left on the receiver's filesystem: {context}")]
    NoSpace {
        /// What needed the space, and what to do.
        context: String,
    },
    /// The receiver reported a failure.
    #[error("receiver reported: {message}")]
    Remote {
        /// The receiver's message.
        message: String,
        /// Whether reconnecting could help.
        retryable: bool,
    },
    /// A source file is not the one that was listed, or changed while it
    /// was read; it is not sent (or not published), the rest goes on.
    #[error("{path}: {reason}")]
    SourceChanged {
        /// The source path.
        path: String,
        /// What happened to it.
        reason: String,
    },
    /// The data that landed is not the data that left.
    #[error("verification failed for {path}: {detail}")]
    Verify {
        /// Destination path.
        path: String,
        /// What did not match.
        detail: String,
    },
    /// The sender was told to stop (the in-cluster agent's assignment
    /// moved away) while it was trying again after `last`.
    #[error("cancelled ({last})")]
    Cancelled {
        /// The error it was trying to get past.
        last: Box<Self>,
    },
    /// Reconnecting for `--retry-for` did not get past `last` (or, over
    /// several pairs, every reconnect was refused for `retry_for`).
    #[error(
        "{last}; gave up after {}{}",
        if *refused {
            format!("{} s of refused connections (nothing listens there)", retry_for.as_secs())
        } else {
            format!("--retry-for {} s", retry_for.as_secs())
        },
        if *resumable {
            ". What reached the receiver is checkpointed: run the same command again to resume"
        } else {
            ""
        }
    )]
    GaveUp {
        /// The last session's error.
        last: Box<Self>,
        /// How long it kept trying.
        retry_for: std::time::Duration,
        /// It gave up sooner, every reconnect refused (`Backoff::refused_for`).
        refused: bool,
        /// Some bytes reached the receiver, so a new run resumes.
        resumable: bool,
    },
    /// A block kept arriving damaged: the path is faulty.
    #[error(transparent)]
    Damaged(#[from] crate::scheduler::Damaged),
    /// Another session took over or published a file this one was writing.
    #[error(
        "{path}: the partial file is no longer this session's (another session took it over or published it); stopping"
    )]
    TakenOver {
        /// The destination, relative to the root.
        path: String,
    },
    /// The receiver's writer failed; the sender was told.
    #[error("{message}")]
    Writer {
        /// The writer's error.
        message: String,
        /// Whether a new session can get past it.
        retryable: bool,
    },
    /// A session stopped making progress with work outstanding (see
    /// `session::reports`): a new session resumes from what is durable.
    #[error("no progress: {0}; the session is ended, to resume from what is durable")]
    Stalled(String),
    /// A control connection failed under the shell before the session
    /// ended.
    #[error("{0}")]
    ConnectionLost(String),
    /// Some files did not land: the summary says which and why.
    #[error("{failed} of {files} files failed:\n{summary}")]
    Incomplete {
        /// Files that failed.
        failed: usize,
        /// Files in the transfer.
        files: usize,
        /// The sender's summary.
        summary: String,
    },
    /// A relay (another sending host, `relay`) could not run a session
    /// it was handed, or lost touch while it ran one.
    #[error("relay {relay}: {message}")]
    Relayed {
        /// The relay's address.
        relay: String,
        /// What it said, or what went wrong reaching it.
        message: String,
        /// Whether another pair may get past it (the relay or its
        /// receiver was lost); otherwise the transfer ends with it.
        retryable: bool,
        /// Whether the relay answered: otherwise its session may still
        /// be writing, until it notices the lead is gone.
        answered: bool,
    },
    /// Something that cannot happen did: a bug.
    #[error("internal error: {0} (a bug: please report it)")]
    Internal(String),
}

/// Why a handshake failed authentication; each says what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// Seen by a sender: the receiver's proof does not match our token.
    #[error(
        "the receiver holds a different token than this sender; give both sides the same token (if they hold the same, something on the path altered the handshake)"
    )]
    ReceiverTokenDiffers,
    /// Seen by a receiver: a peer's proof does not match our token.
    #[error(
        "a peer presented a wrong token; if it is one of yours, give it this receiver's token (if it holds it, something on the path altered the handshake)"
    )]
    PeerTokenWrong,
    /// Seen by a receiver: a sender found our proof wrong, so the two
    /// hold different tokens (or it dialled the wrong receiver).
    #[error(
        "a sender refused this receiver's proof: it holds a different token; if it is one of yours, give it this receiver's token"
    )]
    SenderTokenDiffers,
    /// Seen by a sender: the receiver refused our proof, in its words.
    #[error("{0}")]
    RefusedByReceiver(String),
}

/// `From` for the variants whose message holds the inner error: not with
/// thiserror's `#[from]`, which makes it the `source` too, so that a chain
/// printed whole (`{:#}`, as the binary prints errors) said it twice:
/// "authentication failed: the receiver holds a different token ...: the
/// receiver holds a different token ...".
macro_rules! said_once {
    ($($variant:ident($inner:ty)),* $(,)?) => {$(
        impl From<$inner> for Error {
            fn from(e: $inner) -> Self {
                Self::$variant(e)
            }
        }
    )*};
}

said_once!(
    Protocol(DecodeError),
    Violation(crate::Violation),
    Auth(AuthError),
    Encryption(crate::encryption::Disagreement),
    Tuning(crate::TuningError),
);

impl Error {
    /// Wraps a local I/O error with what we were doing.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            cause: source,
        }
    }

    /// Wraps a local I/O error, telling a full filesystem (ENOSPC, EDQUOT)
    /// from other failures: the first may pass once space is freed.
    pub fn disk(context: impl Into<String>, source: std::io::Error) -> Self {
        match source.raw_os_error() {
            Some(libc::ENOSPC | libc::EDQUOT) => Self::NoSpace {
                context: context.into(),
            },
            _ => Self::io(context, source),
        }
    }

    /// Wraps a network error with what we were doing.
    pub fn net(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Net {
            context: context.into(),
            cause: source,
        }
    }

    /// The peer on a control connection sent nothing, not even a
    /// keepalive, for `silent`: a network error (so a sender reconnects).
    /// `peer` names it; `then` says what follows, after the duration.
    pub fn silent(peer: &str, silent: std::time::Duration, then: &str) -> Self {
        Self::net(
            format!("waiting for the {peer}"),
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("nothing heard for {:.0} s{then}", silent.as_secs_f64()),
            ),
        )
    }

    /// Whether this error, met making one destination file, concerns that
    /// file alone, as a plan refusal would: its path (a directory in the
    /// way, a parent that is a file, no permission there) or the space it
    /// needs. A failing disk (EIO), a read-only file system or a process
    /// out of descriptors would fail every file after it too, so the
    /// session ends instead, rather than drain the sender's data into a
    /// refusal per file.
    pub fn concerns_one_file(&self) -> bool {
        match self {
            Self::PathRefused { .. } | Self::NoSpace { .. } => true,
            Self::Io { cause, .. } => matches!(
                cause.raw_os_error(),
                Some(
                    libc::EACCES
                        | libc::EPERM
                        | libc::ENOTDIR
                        | libc::EISDIR
                        | libc::ENAMETOOLONG
                        | libc::ELOOP
                        | libc::EEXIST
                        | libc::ENOSPC
                        | libc::EDQUOT
                        | libc::EFBIG
                )
            ),
            _ => false,
        }
    }

    /// What the code that meets this error does with it.
    pub fn disposition(&self) -> Disposition {
        match self {
            // The path or the peer may come back; space may be freed.
            // A port may come free as another transfer ends.
            Self::Net { .. }
            | Self::NoSpace { .. }
            | Self::ConnectionLost(_)
            | Self::Stalled(_)
            | Self::NoFreePort { .. } => Disposition::Retry,
            // A frame damaged on the way, or a peer's mistake on one
            // connection: a new connection resumes. Only a peer that is
            // not a wirerate peer of this version is given up at once.
            Self::Protocol(e) if !e.is_foreign() => Disposition::Retry,
            Self::Violation(v) if v.kind != crate::ViolationKind::Version => Disposition::Retry,
            Self::Remote { retryable, .. }
            | Self::Writer { retryable, .. }
            | Self::Relayed { retryable, .. } => {
                if *retryable {
                    Disposition::Retry
                } else {
                    Disposition::FailSession
                }
            }
            // One file's trouble: the rest of the transfer goes on.
            Self::PathRefused { .. } | Self::SourceChanged { .. } | Self::Verify { .. } => {
                Disposition::RefuseFile
            }
            Self::Io { .. }
            | Self::Unresolvable { .. }
            | Self::Listen { .. }
            | Self::Protocol(_)
            | Self::Violation(_)
            | Self::Auth(_)
            | Self::Encryption(_)
            | Self::Config(_)
            | Self::Tuning(_)
            | Self::Cancelled { .. }
            | Self::GaveUp { .. }
            | Self::Damaged(_)
            | Self::TakenOver { .. }
            | Self::Incomplete { .. }
            | Self::Internal(_) => Disposition::FailSession,
        }
    }

    /// Whether reconnecting and resuming could get past this error.
    pub fn is_retryable(&self) -> bool {
        self.disposition() == Disposition::Retry
    }

    /// Whether the peer refused the connection: nothing listens there.
    pub fn is_refused(&self) -> bool {
        matches!(self, Self::Net { cause, .. } if cause.kind() == std::io::ErrorKind::ConnectionRefused)
    }

    /// A bounded name for the kind of error, for metric labels and log
    /// fields (never the message, which carries paths and addresses).
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Io { .. } => "io",
            Self::Net { .. } => "net",
            Self::Unresolvable { .. } => "unresolvable",
            Self::Listen { .. } | Self::NoFreePort { .. } => "listen",
            Self::Protocol(DecodeError::Damaged(_)) => "damaged_frame",
            Self::Protocol(_) => "protocol",
            Self::Violation(_) => "violation",
            Self::Auth(_) => "auth",
            Self::Encryption(_) => "encryption",
            Self::PathRefused { .. } => "path_refused",
            Self::Config(_) => "config",
            Self::Tuning(_) => "tuning",
            Self::NoSpace { .. } => "no_space",
            Self::Remote { .. } => "remote",
            Self::SourceChanged { .. } => "source_changed",
            Self::Verify { .. } => "verify",
            Self::Cancelled { .. } => "cancelled",
            Self::GaveUp { .. } => "gave_up",
            Self::Damaged(_) => "damaged",
            Self::TakenOver { .. } => "taken_over",
            Self::Writer { .. } => "writer",
            Self::Stalled(_) => "stalled",
            Self::ConnectionLost(_) => "connection_lost",
            Self::Incomplete { .. } => "incomplete",
            Self::Relayed { .. } => "relayed",
            Self::Internal(_) => "internal",
        }
    }
}

/// What to do about a failed bind, where the cause says.
fn listen_hint(addr: std::net::SocketAddr, cause: &std::io::Error) -> &'static str {
    match cause.raw_os_error() {
        Some(libc::EADDRINUSE) => {
            "; another process listens on this port: stop it, or choose another port"
        }
        Some(libc::EADDRNOTAVAIL) => {
            "; this host has no such address: listen on one of its own, or on 0.0.0.0"
        }
        Some(libc::EACCES) if addr.port() < 1024 => {
            "; ports below 1024 need CAP_NET_BIND_SERVICE: choose a higher one"
        }
        _ => "",
    }
}

/// What to do about an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Reconnect and resume: what is durable is kept.
    Retry,
    /// Give up this file, say why, and go on with the rest.
    RefuseFile,
    /// End the session (and the run) with the error.
    FailSession,
}

#[cfg(test)]
mod tests {
    use super::*;

    // A file that cannot be made for its own reasons fails alone; a disk
    // that fails every file ends the session (found by review: every
    // creation error was per-file, so EIO drained a whole tree into
    // refusals).
    #[test]
    fn only_a_files_own_trouble_concerns_that_file_alone() {
        let io = |n| Error::io("creating x", std::io::Error::from_raw_os_error(n));
        for n in [
            libc::EACCES,
            libc::ENOTDIR,
            libc::EISDIR,
            libc::ELOOP,
            libc::EEXIST,
            libc::ENOSPC,
            libc::EDQUOT,
        ] {
            assert!(io(n).concerns_one_file(), "{n}");
        }
        for n in [
            libc::EIO,
            libc::EROFS,
            libc::EMFILE,
            libc::ENFILE,
            libc::ENOMEM,
        ] {
            assert!(!io(n).concerns_one_file(), "{n}");
        }
        let refused = Error::PathRefused {
            path: "a".into(),
            reason: "it exists and is a directory".into(),
        };
        assert!(refused.concerns_one_file());
        assert!(
            Error::NoSpace {
                context: "a".into()
            }
            .concerns_one_file()
        );
        assert!(
            !Error::net("x", std::io::Error::from_raw_os_error(libc::EACCES)).concerns_one_file()
        );
    }

    /// What `{:#}` prints: the error, then each cause.
    fn chain(e: &dyn std::error::Error) -> String {
        let mut s = e.to_string();
        let mut cause = e.source();
        while let Some(c) = cause {
            s.push_str(&format!(": {c}"));
            cause = c.source();
        }
        s
    }

    // The binary printed "authentication failed: X: X".
    #[test]
    fn a_wrapped_error_is_said_once_in_the_whole_chain() {
        let inner = [
            AuthError::ReceiverTokenDiffers.to_string(),
            DecodeError::UnexpectedEnd.to_string(),
            "a detail".to_string(),
            crate::TuningError::Congestion { name: "X".into() }.to_string(),
        ];
        let outer: [Error; 4] = [
            AuthError::ReceiverTokenDiffers.into(),
            DecodeError::UnexpectedEnd.into(),
            crate::Violation::new(crate::ViolationKind::Unknown, "a detail").into(),
            crate::TuningError::Congestion { name: "X".into() }.into(),
        ];
        for (inner, outer) in inner.iter().zip(&outer) {
            let said = chain(outer);
            assert_eq!(said.matches(inner.as_str()).count(), 1, "{said}");
        }
    }

    #[test]
    fn dispositions_and_labels() {
        let enospc = std::io::Error::from_raw_os_error(libc::ENOSPC);
        assert_eq!(
            Error::disk("writing x", enospc).disposition(),
            Disposition::Retry
        );
        let eio = std::io::Error::from_raw_os_error(libc::EIO);
        let e = Error::disk("writing x", eio);
        assert_eq!(e.disposition(), Disposition::FailSession);
        assert_eq!(e.metric_label(), "io");
        let refused = Error::PathRefused {
            path: "../x".into(),
            reason: "it leaves the root".into(),
        };
        assert_eq!(refused.disposition(), Disposition::RefuseFile);
        assert!(!refused.is_retryable());
        let remote = Error::Remote {
            message: "busy".into(),
            retryable: true,
        };
        assert!(remote.is_retryable());
        assert_eq!(remote.metric_label(), "remote");
    }

    // The failures that were all `Transfer(String)`, and so all final,
    // keep the disposition their cause has. (On the receiver, where these
    // two arise, nothing retries yet: the sender reconnects on its own
    // errors.)
    #[test]
    fn what_was_a_string_keeps_its_disposition() {
        let writer = |retryable| Error::Writer {
            message: "disk full".into(),
            retryable,
        };
        assert!(writer(true).is_retryable());
        assert!(!writer(false).is_retryable());
        assert!(Error::ConnectionLost("reset".into()).is_retryable());
        let last = || Box::new(Error::ConnectionLost("refused".into()));
        let gave_up = |resumable| Error::GaveUp {
            last: last(),
            retry_for: std::time::Duration::from_secs(120),
            refused: false,
            resumable,
        };
        assert_eq!(
            gave_up(false).to_string(),
            "refused; gave up after --retry-for 120 s"
        );
        assert!(
            gave_up(true)
                .to_string()
                .ends_with("run the same command again to resume")
        );
        assert!(!gave_up(true).is_retryable());
        let refused = Error::GaveUp {
            last: last(),
            retry_for: std::time::Duration::from_secs(3),
            refused: true,
            resumable: false,
        };
        assert_eq!(
            refused.to_string(),
            "refused; gave up after 3 s of refused connections (nothing listens there)"
        );
        assert_eq!(gave_up(true).metric_label(), "gave_up");
        let damaged = Error::from(crate::scheduler::Damaged {
            file_id: 1,
            block: 2,
            times: 9,
        });
        assert!(damaged.to_string().contains("faulty hardware"));
        assert_eq!(damaged.disposition(), Disposition::FailSession);
        assert!(
            Error::Internal("x".into())
                .to_string()
                .contains("a bug: please report it")
        );
    }
}
