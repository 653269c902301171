//! One Transfer over several sender/receiver pairs whose agents share one
//! file system at each end: how the files are cut into work (`split`),
//! what is known of each file's blocks (`ledger`), the pairs (`pairs`),
//! and the coordinator that hands work out, lets an idle pair steal from
//! the slowest, gives a lost pair's work to the others, and publishes each
//! file once (`coordinator`). I/O-free: the simulation in
//! `engine/tests/stripes.rs` drives it with many pairs, losses, steals,
//! duplicate writes and pools scaled up and down.

mod coordinator;
mod ledger;
mod pairs;
mod split;

pub use coordinator::{Action, Coordinator, MAX_PAIRS, Refused, Verified};
pub use ledger::GiveUp;
pub use pairs::{ItemId, PairId, PairState, PairView};
pub use split::{Geometry, MAX_GRAIN, Piece, SplitError, Work};

#[cfg(test)]
mod tests;
