//! Engine settings shared by `DtnPool` (defaults) and `Transfer` (overrides).

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How an agent reads and writes file data (the paper's three modes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum IoMode {
    /// io_uring with O_DIRECT, many requests in flight.
    #[default]
    Async,
    /// O_DIRECT, one request at a time.
    Direct,
    /// Through the page cache.
    Buffered,
}

impl IoMode {
    /// The agent's command-line spelling.
    pub fn as_arg(self) -> &'static str {
        match self {
            Self::Async => "async",
            Self::Direct => "direct",
            Self::Buffered => "buffered",
        }
    }
}

/// How the receiver proves the file that landed is the file that left.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Verification {
    /// Trust TCP: no checksums (only for data that is checked elsewhere).
    None,
    /// Check every block's checksum and compare the whole-file digests.
    #[default]
    Checksums,
    /// As `Checksums`, and re-read the written file from disk for the digest.
    Reread,
}

/// Engine tuning; every field is optional so a Transfer overrides only what it names.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Tuning {
    /// Parallel TCP data streams.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 64))]
    pub streams: Option<i32>,
    /// Content block size in bytes: a multiple of 4096, from 64 KiB to 256 MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 65536, max = 268435456))]
    #[x_kube(validation = Rule::new("self % 4096 == 0").message("blockSize must be a multiple of 4096 bytes (4 KiB), for example 16777216 for 16 MiB"))]
    pub block_size: Option<i64>,
    /// Read and write mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_mode: Option<IoMode>,
    /// I/O requests in flight per file in async mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 256))]
    pub queue_depth: Option<i32>,
    /// Buffer memory per transfer in bytes, from 8 MiB to 64 GiB; at least twice the block size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 8388608, max = 68719476736_i64))]
    pub buffer_size: Option<i64>,
    /// TCP congestion control algorithm (for example `bbr` or `cubic`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 16), regex(pattern = r"^[a-z0-9_]+$"))]
    pub congestion: Option<String>,
}

impl Tuning {
    /// `self` with every unset field taken from `defaults`.
    pub fn or(&self, defaults: &Self) -> Self {
        Self {
            streams: self.streams.or(defaults.streams),
            block_size: self.block_size.or(defaults.block_size),
            io_mode: self.io_mode.or(defaults.io_mode),
            queue_depth: self.queue_depth.or(defaults.queue_depth),
            buffer_size: self.buffer_size.or(defaults.buffer_size),
            congestion: self
                .congestion
                .clone()
                .or_else(|| defaults.congestion.clone()),
        }
    }

    /// Why this combination cannot run, if it cannot.
    pub fn problem(&self, striping: Option<&Striping>) -> Option<String> {
        if let (Some(block), Some(buffer)) = (self.block_size, self.buffer_size)
            && buffer < 2 * block
        {
            return Some(format!(
                "bufferSize {buffer} is less than twice blockSize {block}: raise bufferSize or lower blockSize"
            ));
        }
        if let (Some(block), Some(s)) = (self.block_size, striping)
            && block % s.stripe_size != 0
        {
            return Some(format!(
                "striping.stripeSize {} does not divide blockSize {block}: pick a stripe size that divides the block size",
                s.stripe_size
            ));
        }
        None
    }
}

/// Lustre layout for files the receiver creates.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Striping {
    /// OSTs to stripe over; -1 means every OST.
    #[schemars(range(min = -1, max = 2000))]
    #[x_kube(validation = Rule::new("self != 0").message("stripeCount must be -1 (all OSTs) or at least 1"))]
    pub stripe_count: i32,
    /// Bytes per stripe: a multiple of 64 KiB, at most 4 GiB.
    #[schemars(range(min = 65536, max = 4294967296_i64))]
    #[x_kube(validation = Rule::new("self % 65536 == 0").message("stripeSize must be a multiple of 65536 bytes (64 KiB), as Lustre requires"))]
    pub stripe_size: i64,
}
