//! Compression of blocks on the wire: the codecs a session may use, the
//! decision to use one (`auto`), and, in the shells, the packing and
//! unpacking itself (`packer`).
//!
//! A block is hashed plain and checked plain: the sender hashes it before
//! packing, the receiver unpacks it into a buffer of exactly the block's
//! length (so a bomb has nowhere to grow) and hashes that.
//!
//! A packed block travels as its pieces (`PIECE` bytes of plain data
//! each, the last shorter), each packed on its own behind a checked 8-byte prefix
//! (`Piece`): so either end holds one piece's packed bytes at a time,
//! never a block's, and a piece that does not shrink goes as it is.

pub mod auto;
#[cfg(feature = "shells")]
pub mod packer;

pub use crate::tuning::Compression;
pub use auto::{Auto, Decision, Reason, Report};

/// Plain bytes of each piece of a packed block (the last may be shorter):
/// the hashing piece, so each is hashed as it is packed or unpacked.
pub const PIECE: usize = crate::digest::HASH_PIECE;

/// A packed block's piece as its prefix says it: the bytes that follow
/// the prefix, packed or as they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece {
    /// This many packed bytes follow: at least 1, fewer than the piece.
    Packed(u32),
    /// The piece follows as it is (it did not shrink).
    Stored,
}

/// The prefix's bit that says a piece is stored.
const STORED: u32 = 1 << 31;

/// Bytes of a piece's prefix: its length word and that word's check.
pub const PREFIX_LEN: usize = 8;

/// Where a piece sits: its block and its index in the block. Its prefix's
/// check covers it, so a prefix is good only in its own place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PieceAt {
    /// The block's file.
    pub file_id: u32,
    /// The block.
    pub block: u64,
    /// The piece's index in the block.
    pub index: u32,
}

impl PieceAt {
    /// The check of `word` in this place.
    fn check(self, word: u32) -> u32 {
        let mut content = [0u8; 20];
        content[..4].copy_from_slice(&word.to_le_bytes());
        content[4..8].copy_from_slice(&self.file_id.to_le_bytes());
        content[8..16].copy_from_slice(&self.block.to_le_bytes());
        content[16..].copy_from_slice(&self.index.to_le_bytes());
        // Half the frame checksum: the prefix is 8 bytes, not 12, and a
        // damaged one is still caught but by one chance in 2^32.
        crate::digest::frame_checksum(&content) as u32
    }
}

impl Piece {
    fn word(self) -> u32 {
        match self {
            Self::Packed(n) => n,
            Self::Stored => STORED,
        }
    }

    /// The prefix of this piece at `at`: its length word, then the
    /// word's check.
    pub fn prefix(self, at: PieceAt) -> [u8; PREFIX_LEN] {
        let word = self.word();
        let mut out = [0u8; PREFIX_LEN];
        out[..4].copy_from_slice(&word.to_le_bytes());
        out[4..].copy_from_slice(&at.check(word).to_le_bytes());
        out
    }

    /// What prefix `raw` says of the piece at `at`, of `plain` bytes.
    /// None when its check fails (damaged, or another piece's) or it says
    /// something impossible (packed to nothing or to no less than the
    /// piece): the stream's framing cannot be trusted after it.
    pub fn of_prefix(raw: [u8; PREFIX_LEN], plain: usize, at: PieceAt) -> Option<Self> {
        let [w0, w1, w2, w3, c0, c1, c2, c3] = raw;
        let word = u32::from_le_bytes([w0, w1, w2, w3]);
        if u32::from_le_bytes([c0, c1, c2, c3]) != at.check(word) {
            return None;
        }
        match word {
            STORED => Some(Self::Stored),
            n if n > 0 && (n as usize) < plain => Some(Self::Packed(n)),
            _ => None,
        }
    }
}

/// A mode's byte on the wire (`RelayJob`).
pub fn mode_code(mode: Compression) -> u8 {
    match mode {
        Compression::None => 0,
        Compression::Auto => 1,
        Compression::Lz4 => 2,
        Compression::Zstd => 3,
    }
}

/// The mode a wire byte names.
pub fn mode_of_code(code: u8) -> Option<Compression> {
    Compression::ALL.into_iter().find(|&m| mode_code(m) == code)
}

/// How a compressed block's bytes were packed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Codec {
    /// lz4's block format (`lz4_flex`).
    Lz4,
    /// A zstd frame, level 1.
    Zstd,
}

impl Codec {
    /// Every codec.
    pub const ALL: [Self; 2] = [Self::Lz4, Self::Zstd];

    /// Its byte on the wire.
    pub fn code(self) -> u8 {
        match self {
            Self::Lz4 => 1,
            Self::Zstd => 2,
        }
    }

    /// The codec a wire byte names.
    pub fn of_code(code: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.code() == code)
    }

    /// How it is written in summaries, status and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Lz4 => "lz4",
            Self::Zstd => "zstd",
        }
    }

    /// The codec a mode packs with, if it packs at all.
    pub fn of_mode(mode: Compression) -> Option<Self> {
        match mode {
            Compression::None => None,
            Compression::Auto | Compression::Lz4 => Some(Self::Lz4),
            Compression::Zstd => Some(Self::Zstd),
        }
    }
}

impl std::fmt::Display for Codec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// The codecs a session's blocks may come in, as the sender's `Open`
/// names them: a bit per codec (`Codec::code` is the bit's position
/// plus one). The receiver refuses a block packed any other way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Codecs(u8);

impl Codecs {
    /// None: every block comes plain.
    pub const NONE: Self = Self(0);

    /// Only `codec`.
    pub fn only(codec: Codec) -> Self {
        Self(1 << (codec.code() - 1))
    }

    /// The codecs `mode` may pack with.
    pub fn of_mode(mode: Compression) -> Self {
        Codec::of_mode(mode).map_or(Self::NONE, Self::only)
    }

    /// Whether blocks may come packed with `codec`.
    pub fn allows(self, codec: Codec) -> bool {
        self.0 & Self::only(codec).0 != 0
    }

    /// The byte on the wire.
    pub fn bits(self) -> u8 {
        self.0
    }

    /// The codecs a wire byte names; None when it names one this
    /// version does not know.
    pub fn of_bits(bits: u8) -> Option<Self> {
        let known = Codec::ALL.iter().fold(0, |m, &c| m | Self::only(c).0);
        (bits & !known == 0).then_some(Self(bits))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_bits_round_trip_and_unknown_ones_are_refused() {
        for c in Codec::ALL {
            assert_eq!(Codec::of_code(c.code()), Some(c));
            let only = Codecs::only(c);
            assert!(only.allows(c));
            assert_eq!(Codecs::of_bits(only.bits()), Some(only));
            for other in Codec::ALL.into_iter().filter(|&o| o != c) {
                assert!(!only.allows(other));
            }
        }
        assert_eq!(Codec::of_code(0), None);
        assert_eq!(Codec::of_code(3), None);
        assert_eq!(Codecs::of_bits(0), Some(Codecs::NONE));
        assert_eq!(Codecs::of_bits(4), None);
        assert_eq!(Codecs::of_bits(0x80), None);
        assert_eq!(Codecs::of_mode(Compression::None), Codecs::NONE);
        assert!(Codecs::of_mode(Compression::Auto).allows(Codec::Lz4));
        assert!(Codecs::of_mode(Compression::Zstd).allows(Codec::Zstd));
        for m in Compression::ALL {
            assert_eq!(m.as_str().parse::<Compression>(), Ok(m));
            assert_eq!(mode_of_code(mode_code(m)), Some(m));
        }
        assert_eq!(mode_of_code(4), None);
        assert!("gzip".parse::<Compression>().is_err());
    }

    #[test]
    fn prefixes_read_back_only_whole_and_in_their_place() {
        let at = PieceAt {
            file_id: 3,
            block: 7,
            index: 2,
        };
        for p in [Piece::Packed(1), Piece::Packed(99), Piece::Stored] {
            let raw = p.prefix(at);
            assert_eq!(Piece::of_prefix(raw, 100, at), Some(p));
            // Any one bit flipped, anywhere in the prefix, is refused.
            for bit in 0..PREFIX_LEN * 8 {
                let mut flipped = raw;
                flipped[bit / 8] ^= 1 << (bit % 8);
                assert_eq!(Piece::of_prefix(flipped, 100, at), None, "{p:?} bit {bit}");
            }
            // And so is a good prefix in another piece's place.
            for other in [
                PieceAt { index: 3, ..at },
                PieceAt { block: 8, ..at },
                PieceAt { file_id: 4, ..at },
            ] {
                assert_eq!(
                    Piece::of_prefix(raw, 100, other),
                    None,
                    "{p:?} at {other:?}"
                );
            }
        }
        // What cannot be is refused even with a good check.
        for word in [0u32, 100, 101, STORED | 5, u32::MAX] {
            let mut raw = [0u8; PREFIX_LEN];
            raw[..4].copy_from_slice(&word.to_le_bytes());
            raw[4..].copy_from_slice(&at.check(word).to_le_bytes());
            assert_eq!(Piece::of_prefix(raw, 100, at), None, "{word:#x}");
        }
    }
}
