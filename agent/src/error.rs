//! The crate's one error type: every message says what went wrong and what to do.

use crate::wire::DecodeError;

/// Result alias used throughout the agent.
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
    Protocol(#[from] DecodeError),
    /// The peer broke the protocol's rules in a well-formed frame.
    #[error("peer violated the protocol: {0}; closing the connection")]
    Violation(String),
    /// Token mismatch, or the peer does not speak our handshake.
    #[error("authentication failed: {0}")]
    Auth(String),
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
    /// The transfer cannot continue and retrying will not help.
    #[error("{0}")]
    Transfer(String),
}

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

    /// Whether reconnecting and resuming could get past this error.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Net { .. } | Self::NoSpace { .. } => true,
            Self::Remote { retryable, .. } => *retryable,
            _ => false,
        }
    }
}
