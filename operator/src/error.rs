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

    /// Whether kube-runtime's finalizer helper tried to add the finalizer
    /// again from a cache copy that did not show its own add yet: the
    /// JSON patch's test fails (422) and the next look, from a fresh copy,
    /// finds it there. Seen for every pool at an operator's start on a
    /// real API server, logged as a failed reconcile.
    pub fn is_stale_copy(&self) -> bool {
        use kube::runtime::finalizer::Error as F;
        matches!(self, Self::Finalizer(f) if matches!(&**f, F::AddFinalizer(kube::Error::Api(s)) if s.code == 422))
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

    #[test]
    fn a_finalizer_added_twice_from_a_stale_copy_is_told_apart() {
        let api = |code| {
            kube::Error::Api(
                kube::core::Status::failure("the server rejected our request", "Invalid")
                    .with_code(code)
                    .boxed(),
            )
        };
        let add = |code| Error::Finalizer(Box::new(F::AddFinalizer(api(code))));
        assert!(add(422).is_stale_copy());
        assert!(!add(403).is_stale_copy());
        assert!(!Error::Finalizer(Box::new(F::RemoveFinalizer(api(422)))).is_stale_copy());
        assert!(!Error::Kube(api(422)).is_stale_copy());
    }
}
