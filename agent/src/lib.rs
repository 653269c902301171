//! The `wirerate-agent` binary's library: what turns the engine into a
//! program people and clusters run.
//!
//! The data path (the core and the shells that drive it) is the
//! `wirerate-engine` crate. Here: `cli` is what the command line accepts,
//! `cluster` the in-cluster mode, `demo` the README's one-command
//! transfer, `observer` the engine's
//! observer (into the Prometheus counters of `metrics`, the counters
//! `progress` renders, and the printed summaries of `summary`), and
//! `token`/`units` the command line's parsers.
#![forbid(unsafe_code)]

pub mod cli;
pub mod cluster;
pub mod demo;
pub mod metrics;
pub mod observer;
pub mod progress;
pub mod summary;
pub mod token;
pub mod units;
