//! How a peer broke the protocol with well-formed frames: a kind to count
//! and test by, and what it did, for the message.

/// What kind of rule a peer broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ViolationKind {
    /// A frame the protocol does not allow at this point.
    Unexpected,
    /// The peer speaks another protocol version.
    Version,
    /// A frame about a session, file or block that it does not hold.
    Unknown,
    /// Said twice what may be said once (a plan entry, a report, a result).
    Repeated,
    /// Said before its time (a result before the file's report).
    Early,
    /// Contradicts what was agreed: a plan that does not add up, a bitmap
    /// of the wrong length, a block off its file's layout, a file given
    /// up and then said published.
    Inconsistent,
    /// More than the protocol's bound allows: data streams of one session.
    Excess,
}

impl ViolationKind {
    /// A bounded name for the kind, for metric labels and log fields.
    pub fn metric_label(self) -> &'static str {
        match self {
            Self::Unexpected => "unexpected",
            Self::Version => "version",
            Self::Unknown => "unknown",
            Self::Repeated => "repeated",
            Self::Early => "early",
            Self::Inconsistent => "inconsistent",
            Self::Excess => "excess",
        }
    }
}

/// A broken rule: its kind, and what the peer did in words a user can act
/// on (the `Display`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{detail}")]
pub struct Violation {
    /// Which rule.
    pub kind: ViolationKind,
    /// What the peer did.
    pub detail: String,
}

impl Violation {
    /// A violation of `kind`, described by `detail`.
    pub fn new(kind: ViolationKind, detail: impl Into<String>) -> Self {
        Self {
            kind,
            detail: detail.into(),
        }
    }

    /// A frame the protocol does not allow here: `expected`, got `got`.
    pub fn unexpected(expected: &str, got: impl std::fmt::Display) -> Self {
        Self::new(
            ViolationKind::Unexpected,
            format!("expected {expected}, got {got}"),
        )
    }
}
