//! wirerate's transfer engine: one file or a tree, disk to disk over many
//! TCP streams with io_uring O_DIRECT I/O, resumable and verified.
//!
//! Layout: the `wirerate-engine` crate holds the I/O-free state machines and
//! the settings' one definition; here `wire` is the protocol,
//! `io` the buffer pool and I/O modes, `net` sockets and authentication,
//! `fsroot` path confinement, and `sender`/`receiver` the threads that
//! drive them.

pub mod cluster;
pub mod demo;
pub mod error;
pub mod fsroot;
pub mod io;
pub mod metrics;
pub mod net;
pub mod progress;
pub mod receiver;
pub mod sender;
mod spans;
pub mod summary;
pub mod token;
pub mod units;
pub mod wire;

pub use error::{AuthError, Disposition, Error, Result};
