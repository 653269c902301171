//! Engine settings shared by `DtnPool` (defaults) and `Transfer` (overrides).

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

pub use wirerate_engine::filter::Filters;
use wirerate_engine::tuning::{
    BLOCK_SIZE, BUFFER, CONGESTION_MAX_LEN, Overrides, QUEUE_DEPTH, STREAMS, Settings, TuningError,
    step_rule,
};
pub use wirerate_engine::tuning::{Compression, Encryption, IoMode, SyncLevel, Verification};

/// Engine tuning; every field is optional so a Transfer overrides only what it names.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Tuning {
    /// Parallel TCP data streams.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = STREAMS.min, max = STREAMS.max))]
    pub streams: Option<i32>,
    /// Content block size in bytes: a multiple of 4 KiB, from 4 KiB to 1 GiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = BLOCK_SIZE.min, max = BLOCK_SIZE.max))]
    #[x_kube(validation = { let (rule, message) = step_rule(&BLOCK_SIZE); Rule::new(rule).message(message.as_str()) })]
    pub block_size: Option<i64>,
    /// Read and write mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_mode: Option<IoMode>,
    /// I/O requests in flight per file in async mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = QUEUE_DEPTH.min, max = QUEUE_DEPTH.max))]
    pub queue_depth: Option<i32>,
    /// Buffer memory per transfer in bytes, from 8 KiB to 64 GiB; at least twice the block size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = BUFFER.min, max = BUFFER.max))]
    pub buffer_size: Option<i64>,
    /// TCP congestion control algorithm (for example `bbr` or `cubic`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = CONGESTION_MAX_LEN), regex(pattern = r"^[a-z0-9_]+$"))]
    pub congestion: Option<String>,
    /// TLS 1.3 on every connection: `Required` (a peer that will not is
    /// refused, never a byte in clear), `Preferred` (whenever the peer
    /// can) or `None`. Unlike the other fields, the strictest of the
    /// Transfer's and both pools' wins: a pool's `Required` holds for
    /// every Transfer to or from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<Encryption>,
    /// Block compression on the wire: `Auto` (the default: lz4, only
    /// while the link rather than the CPU is the limit and the data
    /// shrinks), `Lz4` or `Zstd` (every block), or `None`. Checksums stay
    /// on the plain data.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<Compression>,
}

impl Tuning {
    /// `self` with every unset field taken from `defaults`; encryption,
    /// a floor rather than a default, the stricter of the two.
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
            encryption: self.encryption.max(defaults.encryption),
            compression: self.compression.or(defaults.compression),
        }
    }

    /// How the Transfer's blocks are compressed.
    pub fn compression(&self) -> Compression {
        self.compression.unwrap_or_default()
    }

    /// The encryption every connection of the Transfer runs under.
    pub fn encryption(&self) -> Encryption {
        self.encryption.unwrap_or_default()
    }

    /// The engine's settings: every unset field at its default, every
    /// field checked against the one set of bounds.
    pub fn settings(&self) -> Result<Settings, TuningError> {
        Settings::try_from(self)
    }

    /// Why this combination cannot run, if it cannot.
    pub fn problem(&self, striping: Option<&Striping>) -> Option<String> {
        let settings = match self.settings() {
            Ok(s) => s,
            Err(e) => return Some(e.to_string()),
        };
        // Only a block size that was named, as the CEL rule does: a default
        // one the stripe does not divide costs speed, not correctness.
        if let (Some(s), Some(_)) = (striping, self.block_size)
            && settings.block_size % s.stripe_size.max(1) as u64 != 0
        {
            return Some(format!(
                "striping.stripeSize {} does not divide blockSize {}: pick a stripe size that divides the block size",
                s.stripe_size, settings.block_size
            ));
        }
        None
    }
}

/// The one conversion from a manifest's tuning to the engine's settings;
/// the CLI's flags go through the same `Overrides`.
impl TryFrom<&Tuning> for Settings {
    type Error = TuningError;

    fn try_from(t: &Tuning) -> Result<Self, Self::Error> {
        Overrides {
            streams: t.streams.map(i128::from),
            block_size: t.block_size.map(i128::from),
            io_mode: t.io_mode,
            queue_depth: t.queue_depth.map(i128::from),
            buffer: t.buffer_size.map(i128::from),
            congestion: t.congestion.clone(),
        }
        .resolve()
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

#[cfg(test)]
mod tests {
    use super::*;

    // The operator validates on every reconcile and fails a running
    // Transfer that no longer validates: an upgrade must not start refusing
    // what the old rules accepted. These passed before the bounds moved to
    // the engine (an unnamed block size was never checked).
    #[test]
    fn what_the_old_rules_accepted_still_validates() {
        let small_buffer = Tuning {
            buffer_size: Some(16 << 20),
            ..Tuning::default()
        };
        assert_eq!(small_buffer.problem(None), None);
        assert_eq!(small_buffer.settings().unwrap().block_size, 8 << 20);
        let wide_stripes = Striping {
            stripe_count: -1,
            stripe_size: 64 << 20,
        };
        assert_eq!(Tuning::default().problem(Some(&wide_stripes)), None);
        let named = Tuning {
            block_size: Some(16 << 20),
            ..Tuning::default()
        };
        assert!(
            named
                .problem(Some(&wide_stripes))
                .unwrap()
                .contains("does not divide blockSize")
        );
    }
}
