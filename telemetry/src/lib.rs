//! What both wirerate binaries, the agent and the operator, serve about
//! themselves: logs on stderr whose level can change while the process
//! runs, and one small HTTP endpoint for `/metrics`, `/healthz`, `/readyz`
//! and `/loglevel`.
#![forbid(unsafe_code)]

mod http;
mod logs;

pub use http::{Endpoints, serve, serve_in_thread};
pub use logs::{FilterError, LogLevel, init_logs};
