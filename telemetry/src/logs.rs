//! Logs to stderr through `tracing`, filtered by `RUST_LOG` or a default,
//! with a handle that changes the filter at run time.

use std::sync::Arc;

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Registry, reload};

/// Longest filter accepted at run time; real ones are a few dozen bytes.
pub(crate) const MAX_FILTER: usize = 512;

/// Why a new log filter was refused; the old one stays.
#[derive(Debug, thiserror::Error)]
pub enum FilterError {
    /// Empty, or longer than any real filter.
    #[error("a log filter is 1 to {MAX_FILTER} bytes, e.g. `debug` or `info,wirerate_agent=debug`")]
    Length,
    /// Not `RUST_LOG` syntax.
    #[error("{filter:?} is not a log filter: {reason}")]
    Invalid {
        /// The filter as given.
        filter: String,
        /// The parser's reason.
        reason: String,
    },
    /// The subscriber is gone (the process is exiting).
    #[error("cannot change the log filter: {0}")]
    Gone(String),
}

/// Reads and changes the log filter of a running process.
#[derive(Clone)]
pub struct LogLevel {
    handle: Arc<reload::Handle<EnvFilter, Registry>>,
}

impl LogLevel {
    /// The filter in effect, e.g. `info,kube=warn`.
    pub fn get(&self) -> String {
        self.handle
            .with_current(ToString::to_string)
            .unwrap_or_default()
    }

    /// Replaces the filter with `directives` (`RUST_LOG` syntax). An
    /// invalid one is refused with the parser's reason and changes nothing.
    pub fn set(&self, directives: &str) -> Result<(), FilterError> {
        let directives = directives.trim();
        if directives.is_empty() || directives.len() > MAX_FILTER {
            return Err(FilterError::Length);
        }
        let filter = EnvFilter::builder()
            .parse(directives)
            .map_err(|e| FilterError::Invalid {
                filter: directives.to_owned(),
                reason: e.to_string(),
            })?;
        self.handle
            .reload(filter)
            .map_err(|e| FilterError::Gone(e.to_string()))
    }
}

/// Sends logs to stderr, filtered by `RUST_LOG` if it is set and valid,
/// else by `default`. Colour only for a person at a terminal: escape codes
/// in a pod's log, a file or a pipe are noise to whoever greps them. Call
/// once per process; a second call changes nothing and returns a handle
/// that changes nothing either.
pub fn init_logs(default: &str) -> LogLevel {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let (filter, handle) = reload::Layer::new(filter);
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
        )
        .try_init();
    LogLevel {
        handle: Arc::new(handle),
    }
}
