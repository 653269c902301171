//! wirerate's transfer engine: one file or a tree, disk to disk over many
//! TCP streams with io_uring O_DIRECT I/O, resumable and verified.
//!
//! Layout: `engine` holds the I/O-free state machines, `wire` the protocol,
//! `io` the buffer pool and I/O modes, `net` sockets and authentication,
//! `fsroot` path confinement, and `sender`/`receiver` the threads that
//! drive them.

pub mod cluster;
pub mod defaults;
pub mod demo;
pub mod engine;
pub mod error;
pub mod fsroot;
pub mod io;
pub mod metrics;
pub mod net;
pub mod progress;
pub mod receiver;
pub mod sender;
pub mod summary;
pub mod token;
pub mod units;
pub mod wire;

pub use error::{Error, Result};
