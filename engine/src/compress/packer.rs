//! Packing and unpacking a block's pieces, with a buffer and contexts kept
//! from one piece to the next (one of each per data stream).

use super::Codec;

/// zstd's level: its fastest regular one.
const ZSTD_LEVEL: i32 = 1;

/// A piece is sent packed only if packing saved at least this share of
/// it: the receiver's unpacking is not free either.
const MIN_SAVING: usize = 16;

/// Packs pieces for one data stream.
#[derive(Default)]
pub struct Packer {
    out: Vec<u8>,
    zstd: Option<zstd::bulk::Compressor<'static>>,
}

impl Packer {
    /// `plain` packed with `codec`, or None when it did not shrink by at
    /// least a sixteenth (it then goes as it is).
    pub fn pack(&mut self, codec: Codec, plain: &[u8]) -> Option<&[u8]> {
        let most = plain.len() - plain.len() / MIN_SAVING;
        let packed = match codec {
            Codec::Lz4 => {
                // Zeroed once, when it grows: not on every piece.
                let room = lz4_flex::block::get_maximum_output_size(plain.len());
                if self.out.len() < room {
                    self.out.resize(room, 0);
                }
                lz4_flex::block::compress_into(plain, &mut self.out).ok()
            }
            Codec::Zstd => {
                // Room for no more than is worth sending: zstd gives up
                // as soon as it would not fit.
                self.out.clear();
                self.out.reserve(most);
                let zstd = match &mut self.zstd {
                    Some(z) => z,
                    None => match zstd::bulk::Compressor::new(ZSTD_LEVEL) {
                        Ok(z) => self.zstd.insert(z),
                        // Out of memory, in practice: the piece goes plain.
                        Err(e) => {
                            tracing::warn!("no zstd context, this piece goes plain: {e}");
                            return None;
                        }
                    },
                };
                zstd.compress_to_buffer(plain, &mut self.out).ok()
            }
        }?;
        (packed > 0 && packed < most).then(|| &self.out[..packed])
    }
}

/// Why a packed piece did not unpack to exactly its plain length.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Corrupt {
    /// The codec refused its bytes.
    #[error("a {codec} piece does not unpack: {detail}")]
    Malformed {
        /// How it was packed.
        codec: Codec,
        /// What the codec said.
        detail: String,
    },
    /// It unpacked to another length than the piece's.
    #[error("a {codec} piece unpacks to {got} bytes, not the piece's {want}")]
    WrongLength {
        /// How it was packed.
        codec: Codec,
        /// What it unpacked to.
        got: usize,
        /// The piece's length.
        want: usize,
    },
}

/// Unpacks pieces for one data stream.
#[derive(Default)]
pub struct Unpacker {
    zstd: Option<zstd::bulk::Decompressor<'static>>,
}

impl Unpacker {
    /// Unpacks `packed` into `into`, which it must fill exactly: whatever
    /// a frame claims, nothing is written beyond `into`, and nothing is
    /// allocated for it (a bomb stops at the piece's length).
    pub fn unpack(&mut self, codec: Codec, packed: &[u8], into: &mut [u8]) -> Result<(), Corrupt> {
        let malformed = |detail: String| Corrupt::Malformed { codec, detail };
        let got = match codec {
            Codec::Lz4 => lz4_flex::block::decompress_into(packed, into)
                .map_err(|e| malformed(e.to_string()))?,
            Codec::Zstd => {
                let zstd = match &mut self.zstd {
                    Some(z) => z,
                    None => self.zstd.insert(
                        zstd::bulk::Decompressor::new()
                            .map_err(|e| malformed(format!("no zstd context: {e}")))?,
                    ),
                };
                zstd.decompress_to_buffer(packed, into)
                    .map_err(|e| malformed(e.to_string()))?
            }
        };
        if got != into.len() {
            return Err(Corrupt::WrongLength {
                codec,
                got,
                want: into.len(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(len: usize) -> Vec<u8> {
        let line = b"2026-12-07T13:47:23Z INFO detector 7 frame 1234 exposure 0.25 s ok\n";
        line.iter().copied().cycle().take(len).collect()
    }

    fn noise(len: usize) -> Vec<u8> {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    #[test]
    fn blocks_round_trip_and_noise_is_not_packed() {
        let mut packer = Packer::default();
        let mut unpacker = Unpacker::default();
        for codec in Codec::ALL {
            for len in [1, 100, 4096, 1 << 20] {
                let plain = text(len);
                let mut back = vec![0; len];
                match packer.pack(codec, &plain) {
                    Some(packed) => {
                        assert!(packed.len() < len);
                        unpacker.unpack(codec, packed, &mut back).unwrap();
                        assert_eq!(back, plain, "{codec} {len}");
                    }
                    None => assert!(len < 4096, "{codec} left {len} bytes of text plain"),
                }
            }
            assert!(packer.pack(codec, &noise(1 << 20)).is_none(), "{codec}");
        }
    }

    // Whatever the packed bytes say, unpacking fills the block's buffer
    // and no more, or fails: a truncated block, a flipped byte, a block
    // unpacked into the wrong length, a bomb that claims gigabytes.
    #[test]
    fn damaged_and_hostile_blocks_fail_without_writing_past_the_block() {
        let mut packer = Packer::default();
        let mut unpacker = Unpacker::default();
        let plain = text(256 << 10);
        for codec in Codec::ALL {
            let packed = packer.pack(codec, &plain).unwrap().to_vec();
            let mut into = vec![0; plain.len()];
            let mut short = vec![0; plain.len() - 1];
            let mut long = vec![0; plain.len() + 1];
            assert!(
                unpacker
                    .unpack(codec, &packed[..packed.len() / 2], &mut into)
                    .is_err()
            );
            assert!(unpacker.unpack(codec, &packed, &mut short).is_err());
            assert_eq!(
                unpacker.unpack(codec, &packed, &mut long),
                Err(Corrupt::WrongLength {
                    codec,
                    got: plain.len(),
                    want: plain.len() + 1
                })
            );
            for at in [0, 3, packed.len() / 2, packed.len() - 1] {
                let mut bad = packed.clone();
                bad[at] ^= 0x55;
                // Either refused here, or it unpacks to the wrong bytes,
                // which the block's checksum refuses.
                if unpacker.unpack(codec, &bad, &mut into).is_ok() {
                    assert_ne!(into, plain, "{codec}: flipping byte {at} changed nothing");
                }
            }
        }
        // 64 MiB of zeros packs to kilobytes in either format; unpacked
        // into a 64 KiB block it is refused.
        let zeros = vec![0u8; 64 << 20];
        for codec in Codec::ALL {
            let bomb = match codec {
                Codec::Lz4 => lz4_flex::block::compress(&zeros),
                Codec::Zstd => zstd::bulk::compress(&zeros, 1).unwrap(),
            };
            assert!(bomb.len() < 1 << 20);
            let mut into = vec![0; 64 << 10];
            assert!(unpacker.unpack(codec, &bomb, &mut into).is_err(), "{codec}");
        }
    }
}
