//! wirerate's operator: renders DtnPools into agents, queues and assigns
//! Transfers, and fails them over when an agent is lost.
//!
//! The decisions are pure modules (`planner`, `scheduler`, `destinations`, `lifecycle`, `budget`, `validate`,
//! `render`, `token_grant`, `pool_status`, `path_tests`, `agents`), tested without a cluster; the
//! controllers only read the watch caches, call them, and server-side apply
//! what they return.
#![forbid(unsafe_code)]

pub mod admission;
pub mod agents;
pub mod applied;
pub mod budget;
pub mod cli;
pub mod clients;
pub mod context;
pub mod destinations;
pub mod error;
pub mod install;
pub mod leader;
pub mod lifecycle;
pub mod metrics;
pub mod ownership;
pub mod path_tests;
pub mod planner;
pub mod pool_controller;
pub mod pool_status;
pub mod render;
pub mod scheduler;
pub mod token_grant;
pub mod transfer_controller;
pub mod validate;
pub mod written;

pub use context::Context;
pub use error::{Error, Result};

#[cfg(test)]
mod controller_tests;
#[cfg(test)]
mod fixtures;
