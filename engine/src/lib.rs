//! wirerate's transfer core, with no kube, tokio, prometheus or CLI.
//!
//! Decision logic with no I/O: what to read, which stream sends what, what
//! to resend, when to checkpoint, when to retry. The shells in the agent's
//! `sender/` and `receiver/` feed these state machines events and act on
//! what they poll, so tests drive them with no disk, socket or clock.
//!
//! `session` holds the session protocol's decisions for a control
//! connection, `wire` the frames and their checked codec (the agent reads
//! and writes them on sockets), and `tuning` the one definition of every
//! setting, bound and default that the CRDs, the operator, the CLI and the
//! engine share.
#![forbid(unsafe_code)]

pub mod bitmap;
pub mod digest;
pub mod layout;
pub mod liveness;
pub mod retry;
pub mod scheduler;
pub mod session;
pub mod throttle;
pub mod tracker;
pub mod tuning;
pub mod units;
pub mod wire;

pub use bitmap::Bitmap;
pub use layout::Layout;
pub use liveness::{Due, Liveness};
pub use retry::Backoff;
pub use scheduler::{ReadOrder, Scheduler, SendOrder};
pub use throttle::Throttle;
pub use tracker::{CheckpointPolicy, FileTracker};
pub use tuning::{IoMode, Settings, TuningError, Verification};
