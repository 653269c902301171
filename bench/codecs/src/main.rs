//! Packs and unpacks each file named on the command line in 256 KiB
//! pieces (the engine's `compress::PIECE`) with lz4_flex (the engine's
//! choice), the C lz4 and zstd at level 1, on one core, and prints one
//! JSON line per file and codec: plain MB/s packing and unpacking (best
//! of `--rounds`, default 5) and the ratio. Every piece is checked to
//! unpack to itself.

use std::time::{Duration, Instant};

const PIECE: usize = 256 << 10;

/// A codec under test: packs `plain` into `out` (returning the packed
/// length), unpacks `packed` into `into` (exactly its length).
struct Codec {
    name: &'static str,
    pack: fn(&[u8], &mut Vec<u8>, &mut zstd::bulk::Compressor<'static>) -> usize,
    unpack: fn(&[u8], &mut [u8], &mut zstd::bulk::Decompressor<'static>),
}

fn flex_pack(plain: &[u8], out: &mut Vec<u8>, _: &mut zstd::bulk::Compressor<'static>) -> usize {
    out.resize(lz4_flex::block::get_maximum_output_size(plain.len()), 0);
    lz4_flex::block::compress_into(plain, out).expect("room for the worst case")
}

fn flex_unpack(packed: &[u8], into: &mut [u8], _: &mut zstd::bulk::Decompressor<'static>) {
    let n = lz4_flex::block::decompress_into(packed, into).expect("unpacks");
    assert_eq!(n, into.len());
}

fn c_pack(plain: &[u8], out: &mut Vec<u8>, _: &mut zstd::bulk::Compressor<'static>) -> usize {
    out.resize(lz4::block::compress_bound(plain.len()).expect("bound"), 0);
    lz4::block::compress_to_buffer(plain, Some(lz4::block::CompressionMode::DEFAULT), false, out)
        .expect("room for the worst case")
}

fn c_unpack(packed: &[u8], into: &mut [u8], _: &mut zstd::bulk::Decompressor<'static>) {
    let n = into.len() as i32;
    let got = lz4::block::decompress_to_buffer(packed, Some(n), into).expect("unpacks");
    assert_eq!(got, into.len());
}

fn zstd_pack(plain: &[u8], out: &mut Vec<u8>, z: &mut zstd::bulk::Compressor<'static>) -> usize {
    out.resize(zstd::zstd_safe::compress_bound(plain.len()), 0);
    z.compress_to_buffer(plain, out).expect("room for the worst case")
}

fn zstd_unpack(packed: &[u8], into: &mut [u8], z: &mut zstd::bulk::Decompressor<'static>) {
    let n = z.decompress_to_buffer(packed, into).expect("unpacks");
    assert_eq!(n, into.len());
}

const CODECS: [Codec; 3] = [
    Codec { name: "lz4_flex", pack: flex_pack, unpack: flex_unpack },
    Codec { name: "lz4-c", pack: c_pack, unpack: c_unpack },
    Codec { name: "zstd-1", pack: zstd_pack, unpack: zstd_unpack },
];

/// One round: every piece of `data` packed, then unpacked and compared.
fn round(codec: &Codec, data: &[u8]) -> (Duration, Duration, usize) {
    let mut zc = zstd::bulk::Compressor::new(1).expect("a zstd context");
    let mut zd = zstd::bulk::Decompressor::new().expect("a zstd context");
    let mut packed: Vec<Vec<u8>> = Vec::with_capacity(data.len() / PIECE + 1);
    let start = Instant::now();
    let mut wire = 0;
    for piece in data.chunks(PIECE) {
        let mut out = Vec::new();
        let n = (codec.pack)(piece, &mut out, &mut zc);
        out.truncate(n);
        wire += n;
        packed.push(out);
    }
    let packing = start.elapsed();
    let mut into = vec![0u8; PIECE];
    let mut unpacking = Duration::ZERO;
    for (piece, p) in data.chunks(PIECE).zip(&packed) {
        let into = &mut into[..piece.len()];
        let start = Instant::now();
        (codec.unpack)(p, into, &mut zd);
        unpacking += start.elapsed();
        assert!(into == piece, "{} did not unpack to the same bytes", codec.name);
    }
    (packing, unpacking, wire)
}

fn main() {
    let mut rounds = 5;
    let mut files = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--rounds" {
            rounds = args.next().and_then(|r| r.parse().ok()).expect("--rounds N");
        } else {
            files.push(a);
        }
    }
    for file in files {
        let data = std::fs::read(&file).unwrap_or_else(|e| panic!("{file}: {e}"));
        let mb = data.len() as f64 / 1e6;
        for codec in &CODECS {
            let (mut pack, mut unpack, mut wire) = (Duration::MAX, Duration::MAX, 0);
            for _ in 0..rounds {
                let (p, u, w) = round(codec, &data);
                pack = pack.min(p);
                unpack = unpack.min(u);
                wire = w;
            }
            println!(
                "{{\"file\": \"{}\", \"codec\": \"{}\", \"pack_mbps\": {:.1}, \"unpack_mbps\": {:.1}, \"ratio\": {:.3}}}",
                std::path::Path::new(&file).file_name().unwrap().to_string_lossy(),
                codec.name,
                mb / pack.as_secs_f64(),
                mb / unpack.as_secs_f64(),
                data.len() as f64 / wire as f64
            );
        }
    }
}
