//! Printing summaries (a sender's, a receiver session's, the demo's) on
//! stdout, for people or as JSON.

use std::io::Write;

use serde::Serialize;

/// Prints `summary` on stdout: `render`'s lines for people, or one JSON
/// object per line for scripts. A closed pipe (`| head`) is not worth a
/// panic.
pub fn print<S: Serialize>(summary: &S, render: impl FnOnce(&S) -> String, json: bool) {
    let text = if json {
        serde_json::to_string(summary).unwrap_or_default() + "\n"
    } else {
        render(summary)
    };
    let _ = std::io::stdout().write_all(text.as_bytes());
}
