//! wirerate's data path, with no kube, tokio, prometheus or CLI.
//!
//! **The core** decides with no I/O: what to read, which stream sends what,
//! what to resend, when to checkpoint, when to retry (`scheduler`,
//! `tracker`, `bitmap`, `retry`), and the session protocol of a control
//! connection (`session`). Tests drive it with no disk, socket or clock.
//! `tuning` is the one definition of every setting, bound and default that
//! the CRDs, the operator, the CLI and the engine share.
//!
//! **The shells** only move bytes and events: `sender` and `receiver` are
//! the threads that feed the core and carry out what it polls; `wire` is
//! the frames, their checked codec and their socket I/O; `io` the buffer
//! pool and the I/O modes (io_uring, O_DIRECT); `net` sockets and
//! authentication; `fsroot` path confinement. They report to the outside
//! through `observe::Observer`, which the binary implements with metrics,
//! a progress bar and printed summaries.
//!
//! Unsafe code is allowed only in `io` (io_uring, aligned buffers, the few
//! raw system calls with no safe wrapper), each block with its SAFETY
//! comment.
#![deny(unsafe_code)]

pub mod bitmap;
pub mod digest;
pub mod error;
pub mod fsroot;
#[allow(unsafe_code)]
pub mod io;
pub mod layout;
pub mod liveness;
pub mod net;
pub mod observe;
pub mod receiver;
pub mod retry;
pub mod scheduler;
pub mod sender;
pub mod session;
pub mod spans;
pub mod summary;
pub mod throttle;
pub mod tracker;
pub mod tuning;
pub mod units;
pub mod violation;
pub mod wire;

pub use bitmap::Bitmap;
pub use error::{AuthError, Disposition, Error, Result};
pub use layout::Layout;
pub use liveness::{Due, Liveness};
pub use retry::Backoff;
pub use scheduler::{ReadOrder, Scheduler, SendOrder};
pub use throttle::Throttle;
pub use tracker::{CheckpointPolicy, FileTracker};
pub use tuning::{IoMode, Settings, TuningError, Verification};
pub use violation::{Violation, ViolationKind};
