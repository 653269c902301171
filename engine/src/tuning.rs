//! The engine's settings: one definition of each name, bound and default.
//!
//! The CRD schema and its CEL rules, the operator's admission check, the
//! CLI's parsers, the in-cluster agent and the engine all read the bounds
//! below, so a value one of them accepts the others accept too. Nothing
//! clamps: a value out of range is an error that names the field, in the
//! CRD's spelling and the flag's.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Whether a transfer's connections are encrypted (TLS 1.3). Compared
/// by strictness: `None < Preferred < Required`, so a pool's floor and a
/// Transfer's wish combine as the stricter of the two.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum Encryption {
    /// Never: every byte in clear (the HMAC handshake still
    /// authenticates both ends).
    #[default]
    None,
    /// Whenever the peer can: a peer that cannot is served in clear, and
    /// the summary and status say so.
    Preferred,
    /// Always: a peer that cannot encrypt is refused before a byte of
    /// the transfer is sent.
    Required,
}

impl Encryption {
    /// Every mode, strictest first.
    pub const ALL: [Self; 3] = [Self::Required, Self::Preferred, Self::None];

    /// The command-line and log spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Required => "required",
            Self::Preferred => "preferred",
            Self::None => "none",
        }
    }
}

impl fmt::Display for Encryption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl FromStr for Encryption {
    type Err = UnknownName;

    /// Either spelling: `required` on the command line, `Required` in a manifest.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        by_name(Self::ALL, Self::as_str, s, "encryption mode")
    }
}

/// Whether a transfer's blocks are compressed on the wire. Each block is
/// hashed before it is compressed and checked after it is unpacked, so
/// the checksums and the resume bitmap stay on the plain data; a piece of
/// a block (256 KiB) that does not shrink goes as it is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum Compression {
    /// Never.
    None,
    /// With lz4, only while it pays: while sampled blocks shrink and
    /// compressing one costs less time than sending what it saves (the
    /// link, not the CPU, is the limit); `compress::auto` decides.
    #[default]
    Auto,
    /// Every block with lz4 (fast, about 2:1 on text).
    Lz4,
    /// Every block with zstd at level 1 (smaller, slower than lz4).
    Zstd,
}

impl Compression {
    /// Every mode.
    pub const ALL: [Self; 4] = [Self::None, Self::Auto, Self::Lz4, Self::Zstd];

    /// The command-line and log spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Auto => "auto",
            Self::Lz4 => "lz4",
            Self::Zstd => "zstd",
        }
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl FromStr for Compression {
    type Err = UnknownName;

    /// Either spelling: `lz4` on the command line, `Lz4` in a manifest.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        by_name(Self::ALL, Self::as_str, s, "compression")
    }
}

/// Which files a send skips because the destination already has them: a
/// regular file at the same path that matches at this level is left as
/// it is, and reported present. The receiver decides, from what it finds
/// under its root; the default sends every file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum SyncLevel {
    /// Skip nothing: every file is sent, and replaces what is there.
    #[default]
    None,
    /// Skip a file the destination has at all, whatever its contents.
    Exists,
    /// Skip a file the destination has with the same size.
    Size,
    /// Skip a file the destination has with the same size and
    /// modification time (to the nanosecond); wirerate gives every file
    /// it publishes its source's modification time, so a second run
    /// finds what the first sent.
    Mtime,
    /// Skip a file the destination has with the same size and the same
    /// contents, by whole-file digest: both ends read every such file
    /// before anything is sent (as `rsync --checksum` does). The level to
    /// use after a failure, or where times cannot be trusted.
    Checksum,
}

impl SyncLevel {
    /// Every level, from the one that skips nothing.
    pub const ALL: [Self; 5] = [
        Self::None,
        Self::Exists,
        Self::Size,
        Self::Mtime,
        Self::Checksum,
    ];

    /// The command-line and log spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Exists => "exists",
            Self::Size => "size",
            Self::Mtime => "mtime",
            Self::Checksum => "checksum",
        }
    }
}

impl fmt::Display for SyncLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl FromStr for SyncLevel {
    type Err = UnknownName;

    /// Either spelling: `mtime` on the command line, `Mtime` in a manifest.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        by_name(Self::ALL, Self::as_str, s, "sync level")
    }
}

/// How an agent reads and writes file data (the paper's three modes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
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
    /// Every mode, fastest first.
    pub const ALL: [Self; 3] = [Self::Async, Self::Direct, Self::Buffered];

    /// The command-line and log spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Async => "async",
            Self::Direct => "direct",
            Self::Buffered => "buffered",
        }
    }

    /// Whether this mode asks for O_DIRECT.
    pub fn wants_direct(self) -> bool {
        !matches!(self, Self::Buffered)
    }
}

impl fmt::Display for IoMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl FromStr for IoMode {
    type Err = UnknownName;

    /// Either spelling: `async` on the command line, `Async` in a manifest.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        by_name(Self::ALL, Self::as_str, s, "I/O mode")
    }
}

/// How the receiver proves the file that landed is the file that left.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum Verification {
    /// Trust TCP: no checksums (only for data that is checked elsewhere).
    None,
    /// Check every block's checksum and compare the whole-file digests.
    #[default]
    Checksums,
    /// As `Checksums`, and re-read the written file from disk for the digest.
    Reread,
}

impl Verification {
    /// Every level, weakest first.
    pub const ALL: [Self; 3] = [Self::None, Self::Checksums, Self::Reread];

    /// The command-line and log spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Checksums => "checksums",
            Self::Reread => "reread",
        }
    }
}

impl fmt::Display for Verification {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl FromStr for Verification {
    type Err = UnknownName;

    /// Either spelling; `blocks`, the command line's earlier name, still
    /// means `checksums` so scripts written for it keep working.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.eq_ignore_ascii_case("blocks") {
            return Ok(Self::Checksums);
        }
        by_name(Self::ALL, Self::as_str, s, "verification")
    }
}

/// A name that is not one of an enum's spellings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{got:?} is not a known {what}; use one of {expected}")]
pub struct UnknownName {
    what: &'static str,
    got: String,
    expected: String,
}

/// The one of `all` spelled `s` in either case, or the error listing them.
fn by_name<T: Copy, const N: usize>(
    all: [T; N],
    name: fn(T) -> &'static str,
    s: &str,
    what: &'static str,
) -> Result<T, UnknownName> {
    all.into_iter()
        .find(|v| name(*v).eq_ignore_ascii_case(s))
        .ok_or_else(|| UnknownName {
            what,
            got: s.to_owned(),
            expected: all.map(name).join(", "),
        })
}

/// O_DIRECT offsets, lengths and buffers are aligned to this, so block sizes
/// are multiples of it.
pub const ALIGN: u64 = 4096;

/// What a bounded number counts, for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// A plain count.
    Count,
    /// Bytes, shown in binary units.
    Bytes,
}

/// One tunable number: its names, range, step and default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    /// The field's name in `spec.tuning`.
    pub field: &'static str,
    /// The command-line flag.
    pub flag: &'static str,
    /// Smallest allowed value.
    pub min: u64,
    /// Largest allowed value.
    pub max: u64,
    /// Values must be multiples of this (1: any).
    pub step: u64,
    /// The value when nothing sets it, chosen from measurements on the
    /// reference machine (docs/src/admin/sizing.md, "Defaults").
    pub default: u64,
    /// What the number counts.
    pub unit: Unit,
}

/// Parallel TCP data streams. One thread each on both sides.
pub const STREAMS: Bound = Bound {
    field: "streams",
    flag: "--streams",
    min: 1,
    max: 256,
    step: 1,
    default: 4,
    unit: Unit::Count,
};

/// Content block size: large enough that per-block overhead vanishes and
/// O_DIRECT requests reach the device's best rate; at most what the wire
/// format carries in one block.
pub const BLOCK_SIZE: Bound = Bound {
    field: "blockSize",
    flag: "--block-size",
    min: ALIGN,
    max: 1 << 30,
    step: ALIGN,
    default: 16 << 20,
    unit: Unit::Bytes,
};

/// io_uring requests in flight per file in async mode.
pub const QUEUE_DEPTH: Bound = Bound {
    field: "queueDepth",
    flag: "--queue-depth",
    min: 1,
    max: 4096,
    step: 1,
    default: 8,
    unit: Unit::Count,
};

/// In-flight buffer memory per side of a transfer; at least two blocks
/// (one being filled while one is sent or written).
pub const BUFFER: Bound = Bound {
    field: "bufferSize",
    flag: "--buffer",
    min: 2 * ALIGN,
    max: 64 << 30,
    step: 1,
    default: 512 << 20,
    unit: Unit::Bytes,
};

/// An explicit socket buffer (SO_SNDBUF and SO_RCVBUF; unset leaves the
/// kernel's autotuning on, so there is no default size and `default` is 0).
/// The least is TCP's largest window without window scaling: below it a
/// stream stalls on every window (a buffer of 1 byte ran at 0.01 Gbit/s on
/// loopback), and the kernel would silently raise anything under about
/// 4.5 KiB anyway. The most is what the kernel's 32-bit limits take once it
/// doubles the value (socket(7)); socket2 passes it on as a C int, so 4 GiB
/// would wrap to 0.
pub const SOCKET_BUFFER: Bound = Bound {
    field: "socketBuffer",
    flag: "--socket-buffer",
    min: 64 << 10,
    max: 1 << 30,
    step: 1,
    default: 0,
    unit: Unit::Bytes,
};

/// Longest congestion-control name the kernel takes (`TCP_CA_NAME_MAX`, less
/// the terminating NUL).
pub const CONGESTION_MAX_LEN: usize = 15;

impl Bound {
    /// `value` if it is in range and on a step, else the error naming this field.
    pub fn check(&'static self, value: i128) -> Result<u64, TuningError> {
        let ok = value >= i128::from(self.min) && value <= i128::from(self.max);
        if !ok {
            return Err(TuningError::OutOfRange { bound: self, value });
        }
        // In range, so it fits.
        let v = value as u64;
        if v % self.step != 0 {
            return Err(TuningError::OffStep { bound: self, value });
        }
        Ok(v)
    }

    /// The allowed range in words, e.g. "a multiple of 4 KiB from 4 KiB to 1 GiB".
    pub fn describe(&self) -> String {
        let range = format!("from {} to {}", self.show(self.min), self.show(self.max));
        if self.step > 1 {
            format!("a multiple of {} {range}", self.show(self.step))
        } else {
            range
        }
    }

    /// `v` in this bound's unit: binary units for exact multiples, else bytes.
    pub fn show(&self, v: u64) -> String {
        match self.unit {
            Unit::Count => v.to_string(),
            Unit::Bytes => show_bytes(v),
        }
    }
}

fn show_bytes(v: u64) -> String {
    for (shift, unit) in [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if v >= 1 << shift && v % (1 << shift) == 0 {
            return format!("{} {unit}", v >> shift);
        }
    }
    format!("{v} B")
}

/// Settings that cannot run, each naming the field to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TuningError {
    /// Outside the field's range.
    #[error("{} ({}) must be {}; got {value}", .bound.field, .bound.flag, .bound.describe())]
    OutOfRange {
        /// The field.
        bound: &'static Bound,
        /// What was asked for.
        value: i128,
    },
    /// In range but not a multiple of the field's step.
    #[error("{} ({}) must be {}; got {value}, which is not a multiple of {}", .bound.field, .bound.flag, .bound.describe(), .bound.show(.bound.step))]
    OffStep {
        /// The field.
        bound: &'static Bound,
        /// What was asked for.
        value: i128,
    },
    /// The buffer cannot hold two blocks.
    #[error(
        "bufferSize (--buffer) {} is less than twice blockSize (--block-size) {}: raise the buffer or lower the block size",
        show_bytes(*.buffer),
        show_bytes(*.block_size)
    )]
    BufferBelowTwoBlocks {
        /// The buffer asked for.
        buffer: u64,
        /// The block size asked for.
        block_size: u64,
    },
    /// Not a congestion-control name the kernel could know.
    #[error(
        "congestion ({}) {name:?} is not a congestion-control name: 1 to {} characters of a-z, 0-9 and _",
        "--congestion",
        CONGESTION_MAX_LEN
    )]
    Congestion {
        /// What was asked for.
        name: String,
    },
}

/// The settings of one transfer, every field resolved and checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Parallel TCP data streams.
    pub streams: u16,
    /// Content block size in bytes.
    pub block_size: u64,
    /// Read and write mode.
    pub io_mode: IoMode,
    /// I/O requests in flight in async mode.
    pub queue_depth: usize,
    /// In-flight buffer memory per side in bytes.
    pub buffer: u64,
    /// TCP congestion control; `None` keeps the kernel's default.
    pub congestion: Option<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            streams: STREAMS.default as u16,
            block_size: BLOCK_SIZE.default,
            io_mode: IoMode::default(),
            queue_depth: QUEUE_DEPTH.default as usize,
            buffer: BUFFER.default,
            congestion: None,
        }
    }
}

/// Settings as optional overrides, each number as a manifest (i32, i64) or
/// a flag (u64) gives it, widened so that any of them is reported as given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// Parallel TCP data streams.
    pub streams: Option<i128>,
    /// Content block size in bytes.
    pub block_size: Option<i128>,
    /// Read and write mode.
    pub io_mode: Option<IoMode>,
    /// I/O requests in flight in async mode.
    pub queue_depth: Option<i128>,
    /// In-flight buffer memory per side in bytes.
    pub buffer: Option<i128>,
    /// TCP congestion control.
    pub congestion: Option<String>,
}

impl Overrides {
    /// The settings with every unset field at its default, or the first
    /// field that cannot run.
    ///
    /// The block size and the buffer default to fit each other: with only
    /// a buffer given, the block is the default or the largest that leaves
    /// room for two, whichever is smaller; with only a block given, the
    /// buffer is the default or two blocks, whichever is larger. So a value
    /// that ran before either was named keeps running.
    pub fn resolve(&self) -> Result<Settings, TuningError> {
        let pick = |b: &'static Bound, v: Option<i128>| b.check(v.unwrap_or(b.default.into()));
        let block_size = match (self.block_size, self.buffer) {
            (Some(b), _) => BLOCK_SIZE.check(b)?,
            (None, Some(buffer)) => {
                let half = (BUFFER.check(buffer)? / 2) / ALIGN * ALIGN;
                half.clamp(BLOCK_SIZE.min, BLOCK_SIZE.default)
            }
            (None, None) => BLOCK_SIZE.default,
        };
        let buffer = match self.buffer {
            Some(b) => BUFFER.check(b)?,
            None => BUFFER.default.max(2 * block_size),
        };
        let s = Settings {
            streams: pick(&STREAMS, self.streams)? as u16,
            block_size,
            io_mode: self.io_mode.unwrap_or_default(),
            queue_depth: pick(&QUEUE_DEPTH, self.queue_depth)? as usize,
            buffer,
            congestion: self.congestion.clone(),
        };
        s.check()?;
        Ok(s)
    }
}

impl Settings {
    /// Refuses settings that cannot run, naming the field to change.
    pub fn check(&self) -> Result<(), TuningError> {
        STREAMS.check(self.streams.into())?;
        BLOCK_SIZE.check(self.block_size.into())?;
        QUEUE_DEPTH.check(self.queue_depth as i128)?;
        BUFFER.check(self.buffer.into())?;
        if self.buffer < 2 * self.block_size {
            return Err(TuningError::BufferBelowTwoBlocks {
                buffer: self.buffer,
                block_size: self.block_size,
            });
        }
        if let Some(cc) = &self.congestion
            && !congestion_name_ok(cc)
        {
            return Err(TuningError::Congestion { name: cc.clone() });
        }
        Ok(())
    }
}

/// Whether `name` could be a kernel congestion-control module's name.
pub fn congestion_name_ok(name: &str) -> bool {
    (1..=CONGESTION_MAX_LEN).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// The CEL rule and message a manifest's field gets for a bound's step, so
/// the API server refuses what the engine would.
pub fn step_rule(b: &Bound) -> (String, String) {
    (
        format!("self % {} == 0", b.step),
        format!(
            "{} must be a multiple of {} bytes ({}), for example {} for {}",
            b.field,
            b.step,
            b.show(b.step),
            b.default,
            b.show(b.default)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_inside_their_bounds() {
        for b in [&STREAMS, &BLOCK_SIZE, &QUEUE_DEPTH, &BUFFER] {
            assert_eq!(b.check(b.default.into()), Ok(b.default), "{}", b.field);
        }
        Settings::default().check().unwrap();
        assert_eq!(Overrides::default().resolve().unwrap(), Settings::default());
    }

    #[test]
    fn out_of_range_names_the_field_in_both_spellings() {
        let e = Overrides {
            streams: Some(300),
            ..Overrides::default()
        }
        .resolve()
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "streams (--streams) must be from 1 to 256; got 300"
        );
        let e = Overrides {
            block_size: Some(5000),
            ..Overrides::default()
        }
        .resolve()
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "blockSize (--block-size) must be a multiple of 4 KiB from 4 KiB to 1 GiB; got 5000, which is not a multiple of 4 KiB"
        );
        for q in [0, -1, 4097, i64::MAX] {
            let e = Overrides {
                queue_depth: Some(q.into()),
                ..Overrides::default()
            }
            .resolve()
            .unwrap_err();
            assert!(
                matches!(e, TuningError::OutOfRange { bound, .. } if bound.field == "queueDepth"),
                "{e}"
            );
        }
    }

    // A manifest that named only a small buffer ran before (its blocks
    // were the default, or the receiver refused them); the block now
    // follows the buffer rather than the manifest being refused.
    #[test]
    fn an_unnamed_block_or_buffer_fits_the_other() {
        let only = |block_size: Option<i128>, buffer: Option<i128>| {
            Overrides {
                block_size,
                buffer,
                ..Overrides::default()
            }
            .resolve()
        };
        let s = only(None, Some(16 << 20)).unwrap();
        assert_eq!((s.block_size, s.buffer), (8 << 20, 16 << 20));
        let s = only(None, Some(12289)).unwrap();
        assert_eq!((s.block_size, s.buffer), (4096, 12289));
        let s = only(Some(1 << 30), None).unwrap();
        assert_eq!((s.block_size, s.buffer), (1 << 30, 2 << 30));
        let s = only(None, Some(4 << 30)).unwrap();
        assert_eq!(s.block_size, BLOCK_SIZE.default);
        // A value past every integer type a flag parses is reported as given.
        let e = only(None, Some(u64::MAX.into())).unwrap_err();
        assert!(e.to_string().ends_with("got 18446744073709551615"), "{e}");
    }

    #[test]
    fn modes_line_up_in_tables() {
        assert_eq!(
            format!("{:>8}|{:<9}|", IoMode::Async, Verification::None),
            "   async|none     |"
        );
    }

    #[test]
    fn the_buffer_must_hold_two_blocks() {
        let e = Overrides {
            block_size: Some(64 << 20),
            buffer: Some(64 << 20),
            ..Overrides::default()
        }
        .resolve()
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "bufferSize (--buffer) 64 MiB is less than twice blockSize (--block-size) 64 MiB: raise the buffer or lower the block size"
        );
    }

    #[test]
    fn congestion_names_are_checked_before_the_kernel_sees_them() {
        for bad in ["", "BBR", "bbr;rm", "a_very_long_name_x"] {
            let s = Settings {
                congestion: Some(bad.into()),
                ..Settings::default()
            };
            assert!(
                matches!(s.check(), Err(TuningError::Congestion { .. })),
                "{bad:?}"
            );
        }
        let s = Settings {
            congestion: Some("bbr".into()),
            ..Settings::default()
        };
        s.check().unwrap();
    }

    #[test]
    fn names_parse_in_either_spelling_and_round_trip() {
        for m in IoMode::ALL {
            assert_eq!(m.as_str().parse::<IoMode>(), Ok(m));
            assert_eq!(format!("{m:?}").parse::<IoMode>(), Ok(m));
        }
        for v in Verification::ALL {
            assert_eq!(v.as_str().parse::<Verification>(), Ok(v));
            assert_eq!(format!("{v:?}").parse::<Verification>(), Ok(v));
        }
        assert_eq!("blocks".parse(), Ok(Verification::Checksums));
        let e = "fast".parse::<IoMode>().unwrap_err();
        assert_eq!(
            e.to_string(),
            "\"fast\" is not a known I/O mode; use one of async, direct, buffered"
        );
    }

    #[test]
    fn the_step_rule_spells_the_bound() {
        let (rule, message) = step_rule(&BLOCK_SIZE);
        assert_eq!(rule, "self % 4096 == 0");
        assert_eq!(
            message,
            "blockSize must be a multiple of 4096 bytes (4 KiB), for example 16777216 for 16 MiB"
        );
    }
}
