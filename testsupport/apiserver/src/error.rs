//! Refusals, in the shape of a Kubernetes `Status`.

use serde_json::{Value, json};

/// An API error: HTTP code, the Status `reason`, and a message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ApiError {
    pub(crate) code: u16,
    pub(crate) reason: &'static str,
    pub(crate) message: String,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
        }
    }

    /// 404: no such object (or resource).
    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Self::new(404, "NotFound", message)
    }

    /// 409: an object of that name exists.
    pub(crate) fn already_exists(message: impl Into<String>) -> Self {
        Self::new(409, "AlreadyExists", message)
    }

    /// 409: the resourceVersion sent is not the current one.
    pub(crate) fn conflict(message: impl Into<String>) -> Self {
        Self::new(409, "Conflict", message)
    }

    /// 422: the object or patch is not acceptable.
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(422, "Invalid", message)
    }

    /// 400: the request is malformed.
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 405: not a verb this path takes.
    pub(crate) fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    /// 410: a watch from a resourceVersion older than the history kept.
    pub(crate) fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// 403: refused (the double refuses what a test told it to).
    pub(crate) fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }

    /// 500: the API server could not answer (a test's fault). Not 503,
    /// which kube's client retries for minutes before it gives up.
    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// 415: a patch type the double does not speak.
    pub(crate) fn unsupported_media_type(message: impl Into<String>) -> Self {
        Self::new(415, "UnsupportedMediaType", message)
    }

    /// The `Status` object the API server answers with.
    pub(crate) fn to_status(&self) -> Value {
        json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        })
    }
}
