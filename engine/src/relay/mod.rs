//! Relays: the other sending hosts of a transfer over several pairs;
//! this is the relay's side (`server`, `job`), the lead's is
//! `sender::pairs::relayed`.
//!
//! A transfer's lead sender (`send --to a,b,c --via -,h2:p,h3:p`) runs
//! the coordinator (`stripes`) and its own pair's sessions. Each other
//! pair's sessions that move data run on that pair's relay, a host that
//! sees the same source as the lead through shared storage: the lead
//! hands the relay one job per item (where to send, the pieces, the
//! files), and the relay runs the very session the lead would have run
//! (`sender::send_list`), reading from its own disk and sending from its
//! own NIC, then answers what the receiver verified. So adding sending
//! hosts adds read bandwidth and NIC capacity to one transfer, as adding
//! receivers adds write bandwidth. The lead's own light sessions (the
//! shared-storage marker, publishing) go straight to the receivers.
//!
//! Trust and bounds:
//! - A relay is dialled with the transfer's token and authenticates the
//!   lead as a receiver authenticates a sender; nothing is read from an
//!   unauthenticated peer beyond its handshake, within a deadline.
//! - The relay reads only beneath its own `--allow-root`s, opens each file
//!   beneath the job's source with the same confined opens as any send,
//!   and refuses a file whose size or modification time differs from
//!   what the lead listed: storage that is not shared fails the transfer
//!   with that said, and never makes a file from two disks.
//! - Each side speaks at least every `ALIVE_EVERY`; one that hears
//!   nothing for `SILENCE` takes the other as gone. The relay then
//!   cancels its session (it stops writing within a keepalive interval);
//!   the lead loses the pair, hands its work to the others, and keeps the
//!   files it touched unverified for `UNANSWERED_FENCE`, by when the
//!   relay has stopped writing: a running relay stops once it notices,
//!   and a stopped one (a paused VM, a host cut off) that wakes later
//!   finds its session dropped by the receiver, silent past its idle
//!   timeout (the receiver's default is assumed).

mod job;
mod server;

use std::time::Duration;

pub use job::Root;
pub use server::{Relay, RelayConfig, RelayHandle};

pub use crate::wire::{
    RELAY_ALIVE_EVERY as ALIVE_EVERY, RELAY_SILENCE as SILENCE,
    RELAY_UNANSWERED_FENCE as UNANSWERED_FENCE,
};
/// Most relay jobs one relay runs at once (two per pair it serves).
pub const MAX_JOBS: usize = 64;
/// How long a lead has to send its job once authenticated.
const JOB_WITHIN: Duration = Duration::from_secs(30);
