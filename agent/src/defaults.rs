//! Default tuning, chosen from measurements on the reference machine
//! (see the README's "Defaults" section for the figures behind them).

/// Content block size: large enough that per-block overhead vanishes and
/// O_DIRECT requests reach the device's best rate.
pub const BLOCK_SIZE: u64 = 16 << 20;
/// Parallel TCP streams.
pub const STREAMS: u16 = 4;
/// io_uring requests in flight.
pub const QUEUE_DEPTH: usize = 8;
/// In-flight buffer memory per side.
pub const BUFFER: u64 = 512 << 20;
