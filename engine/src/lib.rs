//! wirerate's data path, with no kube, tokio, prometheus or CLI.
//!
//! **The core** decides with no I/O: what to read, which stream sends what,
//! what to resend, when to checkpoint, when to retry (`scheduler`,
//! `tracker`, `bitmap`, `retry`), and the session protocol of a control
//! connection (`session`), and how one transfer runs over several pairs
//! (`stripes`). Tests drive it with no disk, socket or clock.
//! `tuning` is the one definition of every setting, bound and default that
//! the CRDs, the operator, the CLI and the engine share; `advice` (what a
//! path test says to change), `tuner` (how many streams a link needs) and
//! `optimizer` (whether more streams raise a running transfer's rate)
//! decide from measurements the shells take.
//!
//! **The shells** only move bytes and events: `sender` and `receiver` are
//! the threads that feed the core and carry out what it polls; `wire` is
//! the frames, their checked codec and their socket I/O; `io` the buffer
//! pool and the I/O modes (io_uring, O_DIRECT); `net` sockets and
//! authentication; `fsroot` path confinement. They report to the outside
//! through `observe::Observer`, which the binary implements with metrics,
//! a progress bar and printed summaries.
//!
//! Unsafe code is allowed only in three modules of `io` (`pool`: aligned
//! buffers, `uring`: io_uring, `sys`: the few raw system calls with no safe
//! wrapper), each block with its SAFETY comment.
//!
//! The shells, and their dependencies, are the default feature `shells`;
//! without it the crate is the core and the settings alone, which is what
//! the CRDs and the operator build.
#![deny(unsafe_code)]

pub mod advice;
pub mod bitmap;
pub mod by_id;
pub mod compress;
pub mod digest;
pub mod encryption;
#[cfg(feature = "shells")]
pub mod error;
pub mod filter;
#[cfg(feature = "shells")]
pub mod fsroot;
#[cfg(feature = "shells")]
pub mod io;
pub mod layout;
pub mod liveness;
pub mod metadata;
pub mod mirror;
#[cfg(feature = "shells")]
pub mod net;
#[cfg(feature = "shells")]
pub mod observe;
pub mod optimizer;
#[cfg(feature = "shells")]
pub mod probe;
#[cfg(feature = "shells")]
pub mod progress;
#[cfg(feature = "shells")]
pub mod receiver;
#[cfg(feature = "shells")]
pub mod relay;
pub mod retry;
pub mod scheduler;
#[cfg(feature = "shells")]
pub mod sender;
pub mod session;
#[cfg(feature = "shells")]
pub mod spans;
pub mod stripes;
#[cfg(feature = "shells")]
pub mod summary;
pub mod sync;
pub mod throttle;
pub mod tracker;
pub mod tuner;
pub mod tuning;
pub mod units;
pub mod violation;
pub mod wire;

pub use bitmap::Bitmap;
#[cfg(feature = "shells")]
pub use error::{AuthError, Disposition, Error, Result};
pub use layout::Layout;
pub use liveness::{Due, Liveness};
pub use retry::Backoff;
pub use scheduler::{ReadOrder, Scheduler, SendOrder};
pub use throttle::Throttle;
pub use tracker::{CheckpointPolicy, FileTracker};
pub use tuning::{IoMode, Settings, TuningError, Verification};
pub use violation::{Violation, ViolationKind};
