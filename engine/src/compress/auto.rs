//! Whether the next block is packed: I/O-free, fed what packing and
//! writing the blocks took, asked once a block.
//!
//! Packing pays when the time it costs is less than the time the bytes it
//! saves would take to write. Per byte of plain data, packing costs `p`
//! and saves `(1 - r) * w`, where `r` is what a block packs to and `w`
//! what a byte takes to write. A link that is the limit makes `w` large
//! (writes wait for the window); a fast link whose CPU is the limit
//! makes it small (a write is a copy), and packing off. So `auto` needs
//! no rate target and no knowledge of the link: it measures both sides
//! of the sum on the blocks themselves. While off it packs one block in
//! `SAMPLE_EVERY` to keep measuring.
//!
//! What it cannot see: a receiver whose disk is the limit also makes
//! writes wait, so `auto` packs there though it gains nothing (the
//! sender's CPU pays, the rate does not suffer).

use std::time::Duration;

use super::{Codec, Compression};

/// Blocks measured before `auto` decides at all.
const MIN_SAMPLES: u32 = 4;
/// While measuring, one block in this many is packed.
const SAMPLE_EARLY: u32 = 2;
/// While off, one block in this many is packed, to see whether the data
/// or the link changed.
const SAMPLE_EVERY: u32 = 32;
/// A block must pack to less than this share of its size, on average,
/// for packing to stay on at all ...
const SHRINK_ENOUGH: f64 = 0.9;
/// ... and to less than this for it to turn on: data that packs to about
/// 0.9 would otherwise flap.
const SHRINK_TO_TURN_ON: f64 = 0.85;
/// Packing turns on only while it costs at most this share of the time
/// it saves; it stays on while it costs less than the time saved. The gap
/// keeps it from flapping on a link near the break-even point.
const TURN_ON_BELOW: f64 = 0.8;
/// Weight of each new measurement in the running averages: about the
/// last 8 blocks count.
const WEIGHT: f64 = 1.0 / 8.0;

/// What to do with the next block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Send it as it is.
    Plain,
    /// Pack its pieces with this codec (each that does not shrink goes
    /// as it is).
    Pack(Codec),
}

/// Why packing is on or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// `--compress none`.
    Disabled,
    /// A codec was chosen (`--compress lz4|zstd`): every block is packed.
    Chosen,
    /// `auto`, still measuring.
    Measuring,
    /// `auto`, on: packing a block costs less than writing what it saves.
    LinkLimit,
    /// `auto`, off: sampled blocks do not shrink enough.
    Incompressible,
    /// `auto`, off: packing a block costs more than writing what it saves.
    CpuLimit,
}

impl Reason {
    /// How summaries, status and metrics say it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disabled => "disabled",
            Self::Chosen => "chosen",
            Self::Measuring => "measuring",
            Self::LinkLimit => "link is the limit",
            Self::Incompressible => "data does not shrink",
            Self::CpuLimit => "CPU is the limit",
        }
    }

    /// Every reason.
    pub const ALL: [Self; 6] = [
        Self::Disabled,
        Self::Chosen,
        Self::Measuring,
        Self::LinkLimit,
        Self::Incompressible,
        Self::CpuLimit,
    ];

    /// The label a metric shows it under.
    pub fn metric_label(self) -> &'static str {
        match self {
            Self::Disabled => "disabled",
            Self::Chosen => "chosen",
            Self::Measuring => "measuring",
            Self::LinkLimit => "link_limit",
            Self::Incompressible => "incompressible",
            Self::CpuLimit => "cpu_limit",
        }
    }
}

/// A running average, unset until its first value.
#[derive(Debug, Clone, Copy, Default)]
struct Average(Option<f64>);

impl Average {
    fn add(&mut self, v: f64) {
        self.0 = Some(match self.0 {
            None => v,
            Some(a) => a + WEIGHT * (v - a),
        });
    }
}

/// A running quotient of two running averages (nanoseconds per byte,
/// packed bytes per plain byte): each block weighs by its size, so a
/// file's 4 KiB tail counts for little beside a 16 MiB block.
#[derive(Debug, Clone, Copy, Default)]
struct PerByte {
    of: Average,
    bytes: Average,
}

impl PerByte {
    fn add(&mut self, of: f64, bytes: u64) {
        self.of.add(of);
        self.bytes.add(bytes as f64);
    }

    fn get(&self) -> Option<f64> {
        match (self.of.0, self.bytes.0) {
            (Some(of), Some(bytes)) if bytes > 0.0 => Some(of / bytes),
            _ => None,
        }
    }
}

/// What `auto` did, for summaries, status and metrics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Report {
    /// The mode asked for.
    pub mode: Compression,
    /// The codec packing uses, when the mode packs at all.
    pub codec: Option<Codec>,
    /// Whether blocks are being packed now.
    pub packing: bool,
    /// Why.
    pub reason: Reason,
    /// Plain bytes of every block that went out.
    pub plain_bytes: u64,
    /// What those blocks took on the wire (packed or not).
    pub wire_bytes: u64,
    /// Blocks that went out packed.
    pub packed_blocks: u64,
    /// The recent ratio of packed to plain size over sampled blocks.
    pub ratio: Option<f64>,
}

/// The decision, for one send (it carries over its sessions).
#[derive(Debug, Clone)]
pub struct Auto {
    mode: Compression,
    codec: Option<Codec>,
    packing: bool,
    reason: Reason,
    samples: u32,
    /// Blocks since the last one packed while off.
    since_sample: u32,
    /// Packed size over plain size.
    ratio: PerByte,
    /// Nanoseconds to pack a plain byte.
    pack_ns: PerByte,
    /// Nanoseconds to write a byte.
    write_ns: PerByte,
    plain_bytes: u64,
    wire_bytes: u64,
    packed_blocks: u64,
    /// The reason last handed out by `take_change`.
    told: Option<Reason>,
}

impl Auto {
    /// The decision for `mode`.
    pub fn new(mode: Compression) -> Self {
        let codec = Codec::of_mode(mode);
        let (packing, reason) = match mode {
            Compression::None => (false, Reason::Disabled),
            Compression::Lz4 | Compression::Zstd => (true, Reason::Chosen),
            Compression::Auto => (false, Reason::Measuring),
        };
        Self {
            mode,
            codec,
            packing,
            reason,
            samples: 0,
            // The first block is a sample.
            since_sample: SAMPLE_EARLY - 1,
            ratio: PerByte::default(),
            pack_ns: PerByte::default(),
            write_ns: PerByte::default(),
            plain_bytes: 0,
            wire_bytes: 0,
            packed_blocks: 0,
            told: None,
        }
    }

    /// The reason, when it changed since the last call (and at the first).
    #[must_use]
    pub fn take_change(&mut self) -> Option<Reason> {
        (self.told != Some(self.reason)).then(|| {
            self.told = Some(self.reason);
            self.reason
        })
    }

    /// What to do with the next block; one the receiver found damaged
    /// before goes plain, in case packing (or unpacking) is what damaged
    /// it, so that the resend does not repeat it.
    #[must_use]
    pub fn decide(&mut self, damaged_before: bool) -> Decision {
        let Some(codec) = self.codec else {
            return Decision::Plain;
        };
        if damaged_before {
            return Decision::Plain;
        }
        if self.packing {
            return Decision::Pack(codec);
        }
        let every = if self.reason == Reason::Measuring {
            SAMPLE_EARLY
        } else {
            SAMPLE_EVERY
        };
        self.since_sample += 1;
        if self.since_sample >= every {
            self.since_sample = 0;
            return Decision::Pack(codec);
        }
        Decision::Plain
    }

    /// A block of `plain` bytes was packed in `took`, to `packed` bytes
    /// on the wire (None: it did not shrink, its pieces went as they are).
    pub fn handle_packed(&mut self, plain: u64, packed: Option<u64>, took: Duration) {
        if plain == 0 {
            return;
        }
        self.ratio
            .add(packed.map_or(plain, |p| p.min(plain)) as f64, plain);
        self.pack_ns.add(took.as_nanos() as f64, plain);
        self.samples = self.samples.saturating_add(1);
        if packed.is_some() {
            self.packed_blocks += 1;
        }
        self.reconsider();
    }

    /// A block of `plain` bytes went out as `wire` bytes, whose writes
    /// took `took`.
    pub fn handle_written(&mut self, plain: u64, wire: u64, took: Duration) {
        self.plain_bytes += plain;
        self.wire_bytes += wire;
        if wire > 0 {
            self.write_ns.add(took.as_nanos() as f64, wire);
        }
        self.reconsider();
    }

    fn reconsider(&mut self) {
        if self.mode != Compression::Auto || self.samples < MIN_SAMPLES {
            return;
        }
        let (Some(r), Some(p), Some(w)) =
            (self.ratio.get(), self.pack_ns.get(), self.write_ns.get())
        else {
            return;
        };
        let saved = (1.0 - r) * w;
        let shrinks = r < SHRINK_TO_TURN_ON || (self.packing && r < SHRINK_ENOUGH);
        let (on, reason) = if !shrinks {
            (false, Reason::Incompressible)
        } else if p < saved * TURN_ON_BELOW || (self.packing && p < saved) {
            (true, Reason::LinkLimit)
        } else {
            (false, Reason::CpuLimit)
        };
        self.packing = on;
        self.reason = reason;
    }

    /// What it did so far.
    pub fn report(&self) -> Report {
        Report {
            mode: self.mode,
            codec: self.codec,
            packing: self.packing,
            reason: self.reason,
            plain_bytes: self.plain_bytes,
            wire_bytes: self.wire_bytes,
            packed_blocks: self.packed_blocks,
            ratio: self.ratio.get(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BLOCK: u64 = 4 << 20;

    /// Runs `blocks` blocks through `auto`: each packs to `ratio` of its
    /// size at `pack_ns` a plain byte, and is written at `write_ns` a
    /// wire byte. Returns how many were packed.
    fn run(auto: &mut Auto, blocks: u32, ratio: f64, pack_ns: f64, write_ns: f64) -> u32 {
        let mut packed = 0;
        for _ in 0..blocks {
            let wire = match auto.decide(false) {
                Decision::Plain => BLOCK,
                Decision::Pack(_) => {
                    let took = Duration::from_nanos((pack_ns * BLOCK as f64) as u64);
                    let size = (BLOCK as f64 * ratio) as u64;
                    let shrank = ratio < 1.0;
                    auto.handle_packed(BLOCK, shrank.then_some(size), took);
                    if shrank {
                        packed += 1;
                        size
                    } else {
                        BLOCK
                    }
                }
            };
            let took = Duration::from_nanos((write_ns * wire as f64) as u64);
            auto.handle_written(BLOCK, wire, took);
        }
        packed
    }

    // lz4 packs about 2 GB/s (0.5 ns a byte); 1 Gbit/s over 8 streams is
    // 64 ns a byte for each stream's writes, loopback about 0.4.
    #[test]
    fn compressible_data_on_a_slow_link_is_packed() {
        let mut auto = Auto::new(Compression::Auto);
        run(&mut auto, 8, 0.5, 0.5, 64.0);
        assert_eq!(auto.report().reason, Reason::LinkLimit);
        assert_eq!(run(&mut auto, 100, 0.5, 0.5, 64.0), 100);
        let r = auto.report();
        assert!(r.packing);
        assert!(r.wire_bytes * 10 < r.plain_bytes * 6, "{r:?}");
    }

    #[test]
    fn a_fast_link_leaves_packing_off_but_sampling() {
        let mut auto = Auto::new(Compression::Auto);
        let packed = run(&mut auto, 320, 0.5, 0.5, 0.4);
        let r = auto.report();
        assert!(!r.packing);
        assert_eq!(r.reason, Reason::CpuLimit);
        // The first MIN_SAMPLES early samples, then one in SAMPLE_EVERY.
        assert!(packed <= MIN_SAMPLES + 320 / SAMPLE_EVERY, "{packed}");
        assert!(packed > MIN_SAMPLES, "it keeps sampling: {packed}");
    }

    // Data that packs to about 0.87: off until it packs below 0.85, then
    // on until above 0.9.
    #[test]
    fn the_shrink_threshold_has_hysteresis_too() {
        let mut auto = Auto::new(Compression::Auto);
        run(&mut auto, 200, 0.87, 0.1, 64.0);
        assert_eq!(auto.report().reason, Reason::Incompressible);
        let mut auto = Auto::new(Compression::Auto);
        run(&mut auto, 20, 0.5, 0.1, 64.0);
        assert!(auto.report().packing);
        run(&mut auto, 200, 0.87, 0.1, 64.0);
        assert!(auto.report().packing, "{:?}", auto.report());
    }

    #[test]
    fn data_that_does_not_shrink_is_sent_plain() {
        let mut auto = Auto::new(Compression::Auto);
        run(&mut auto, 320, 0.97, 0.3, 64.0);
        assert_eq!(auto.report().reason, Reason::Incompressible);
        assert!(!auto.report().packing);
        let mut auto = Auto::new(Compression::Auto);
        run(&mut auto, 320, 1.0, 0.3, 64.0);
        assert_eq!(auto.report().reason, Reason::Incompressible);
        assert_eq!(auto.report().packed_blocks, 0);
    }

    // The data changes under a running transfer: packing follows, within
    // a few dozen blocks each way (seconds at worst: a 4 MiB block is
    // 34 ms at 1 Gbit/s).
    #[test]
    fn it_follows_the_data_and_the_link_both_ways() {
        let mut auto = Auto::new(Compression::Auto);
        assert_eq!(auto.take_change(), Some(Reason::Measuring));
        assert_eq!(auto.take_change(), None);
        run(&mut auto, 20, 0.5, 0.5, 64.0);
        assert!(auto.report().packing);
        assert_eq!(auto.take_change(), Some(Reason::LinkLimit));
        run(&mut auto, 40, 1.0, 0.5, 64.0);
        assert_eq!(auto.report().reason, Reason::Incompressible);
        run(&mut auto, 400, 0.5, 0.5, 64.0);
        assert!(auto.report().packing, "{:?}", auto.report());
        // The link gets fast (the CPU becomes the limit): off.
        run(&mut auto, 40, 0.5, 0.5, 0.4);
        assert_eq!(auto.report().reason, Reason::CpuLimit);
    }

    // A file's small tail whose write waited on a full socket (hundreds
    // of ns a byte) does not turn packing on where the blocks around it
    // say the CPU is the limit: each block weighs by its bytes.
    #[test]
    fn small_blocks_weigh_by_their_size() {
        let mut auto = Auto::new(Compression::Auto);
        for i in 0..400u64 {
            let (plain, write_ns) = if i % 2 == 0 {
                (BLOCK, 0.4)
            } else {
                (4096, 200.0)
            };
            if let Decision::Pack(_) = auto.decide(false) {
                let took = Duration::from_nanos((0.5 * plain as f64) as u64);
                auto.handle_packed(plain, Some(plain / 2), took);
            }
            let took = Duration::from_nanos((write_ns * plain as f64) as u64);
            auto.handle_written(plain, plain, took);
        }
        assert_eq!(
            auto.report().reason,
            Reason::CpuLimit,
            "{:?}",
            auto.report()
        );
    }

    // Near break-even it does not flap: on needs packing to cost under
    // 0.8 of what it saves, off needs it to cost more than all of it.
    #[test]
    fn near_the_break_even_point_it_holds_its_state() {
        // Saves (1 - 0.5) * 2.0 = 1.0 ns a byte; packing costs 0.9.
        let mut auto = Auto::new(Compression::Auto);
        run(&mut auto, 200, 0.5, 0.9, 2.0);
        assert!(!auto.report().packing);
        let mut auto = Auto::new(Compression::Auto);
        run(&mut auto, 20, 0.5, 0.5, 2.0);
        assert!(auto.report().packing);
        run(&mut auto, 200, 0.5, 0.9, 2.0);
        assert!(auto.report().packing);
    }

    #[test]
    fn chosen_codecs_pack_every_block_and_none_packs_nothing() {
        for (mode, codec) in [
            (Compression::Lz4, Codec::Lz4),
            (Compression::Zstd, Codec::Zstd),
        ] {
            let mut auto = Auto::new(mode);
            // Even where auto would not.
            assert_eq!(run(&mut auto, 50, 0.5, 5.0, 0.4), 50);
            assert_eq!(auto.decide(false), Decision::Pack(codec));
            // Not a block the receiver found damaged.
            assert_eq!(auto.decide(true), Decision::Plain);
            assert_eq!(auto.report().reason, Reason::Chosen);
        }
        let mut auto = Auto::new(Compression::None);
        assert_eq!(run(&mut auto, 50, 0.5, 0.5, 64.0), 0);
        assert_eq!(auto.report().reason, Reason::Disabled);
    }
}
