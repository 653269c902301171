//! The operator's one error type.

/// What can go wrong in a reconcile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused or failed a request.
    #[error("Kubernetes API request failed: {0}")]
    Kube(#[from] kube::Error),
    /// Adding or removing the finalizer failed.
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Self>>),
    /// An object from the API lacks a field every object has.
    #[error("object without {0}; is the API server sending partial objects?")]
    Malformed(&'static str),
    /// A deleted Transfer waits for its agents to stop and clean up.
    #[error("waiting for agents {0} to stop and remove temporary files")]
    CleanupPending(String),
    /// The CRDs are not installed.
    #[error("the wirerate CRDs are not installed ({0}): kubectl apply -f charts/wirerate/crds/")]
    CrdsMissing(String),
}

impl Error {
    /// Whether this is an expected wait rather than a failure.
    pub fn is_waiting(&self) -> bool {
        use kube::runtime::finalizer::Error as F;
        match self {
            Self::CleanupPending(_) => true,
            Self::Finalizer(f) => matches!(**f, F::CleanupFailed(Self::CleanupPending(_))),
            _ => false,
        }
    }

    /// A short, bounded label for metrics (never the message, which carries data).
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Kube(_) => "kube",
            Self::Finalizer(_) if self.is_waiting() => "cleanup_pending",
            Self::Finalizer(_) => "finalizer",
            Self::Malformed(_) => "malformed",
            Self::CleanupPending(_) => "cleanup_pending",
            Self::CrdsMissing(_) => "crds_missing",
        }
    }
}

/// Result with the operator's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::finalizer::Error as F;

    #[test]
    fn every_error_label_is_one_the_metrics_start_with() {
        let all = [
            Error::CleanupPending("x".into()),
            Error::Malformed("x"),
            Error::CrdsMissing("x".into()),
            Error::Finalizer(Box::new(F::ApplyFailed(Error::Malformed("x")))),
        ];
        for e in &all {
            assert!(
                crate::metrics::ERROR_LABELS.contains(&e.metric_label()),
                "{e:?}"
            );
        }
        assert!(crate::metrics::ERROR_LABELS.contains(&"kube"));
    }

    #[test]
    fn a_pending_cleanup_is_a_wait_and_other_errors_are_not() {
        let pending = || Error::CleanupPending("send-1".into());
        assert!(pending().is_waiting());
        assert!(Error::Finalizer(Box::new(F::CleanupFailed(pending()))).is_waiting());
        assert!(!Error::Finalizer(Box::new(F::ApplyFailed(pending()))).is_waiting());
        assert!(!Error::Malformed("a namespace").is_waiting());
    }
}
