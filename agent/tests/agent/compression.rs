//! Compressed blocks between a real sender and receiver: what lands is
//! what left with either codec, damage to a packed block is caught and
//! counted, `none` sends every block plain, and data that does not
//! shrink goes as it is.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::common::*;
use wirerate_engine::compress::Compression;
use wirerate_engine::io::IoMode;
use wirerate_engine::sender::send;

/// Text that packs about 3:1 or better: log lines whose numbers change.
fn write_text(path: &Path, len: usize, seed: u64) {
    let mut s = String::with_capacity(len + 128);
    let mut n = seed;
    while s.len() < len {
        n = n
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        s.push_str(&format!(
            "2026-12-07T13:{:02}:{:02}Z detector={} frame={} exposure=0.25 status=ok\n",
            (n >> 20) % 60,
            (n >> 30) % 60,
            (n >> 40) % 16,
            (n >> 8) % 100_000
        ));
    }
    s.truncate(len);
    if let Some(p) = path.parent() {
        std::fs::create_dir_all(p).unwrap();
    }
    std::fs::write(path, s).unwrap();
}

/// A tree of compressible text and of noise, sent under `mode`.
fn send_tree(name: &str, mode: Compression) -> (wirerate_engine::summary::SendSummary, u64) {
    let dir = scratch(name);
    let src = dir.path().join("src");
    write_text(&src.join("log.txt"), 3 << 20, 1);
    write_text(&src.join("runs/a.txt"), 100_000, 2);
    write_file(&src.join("runs/noise.bin"), 1 << 20, 3);
    let root = dir.path().join("dst");
    std::fs::create_dir_all(&root).unwrap();
    let srv = server(&root, IoMode::Async);
    let mut cfg = send_cfg(srv.addr(), &src, "out");
    cfg.compress = mode;
    let s = send(&cfg).unwrap();
    assert!(s.ok, "{}", s.render());
    for f in ["log.txt", "runs/a.txt", "runs/noise.bin"] {
        assert_same(&src.join(f), &root.join("out").join(f));
    }
    let rx = wait_summaries(&srv, 1);
    (s, rx[0].blocks_rejected)
}

#[test]
fn chosen_codecs_pack_text_and_what_lands_is_what_left() {
    for mode in [Compression::Lz4, Compression::Zstd] {
        let (s, rejected) = send_tree(&format!("pack-{mode}"), mode);
        let c = &s.compression;
        assert_eq!(c.codec, Some(mode.as_str()));
        assert!(c.packed_blocks > 0, "{}", s.render());
        // The text shrinks well; the noise goes as it is.
        assert!(
            c.wire_bytes * 2 < c.plain_bytes,
            "{mode}: {} plain went as {}",
            c.plain_bytes,
            c.wire_bytes
        );
        assert!(c.wire_bytes > 1 << 20, "the noise went plain: {c:?}");
        assert_eq!(rejected, 0);
        assert!(
            s.render().contains(&format!("compressed {mode}")),
            "{}",
            s.render()
        );
    }
}

#[test]
fn none_sends_every_block_plain() {
    let (s, _) = send_tree("pack-none", Compression::None);
    let c = &s.compression;
    assert_eq!(c.packed_blocks, 0);
    assert_eq!(c.plain_bytes, c.wire_bytes);
    assert!(c.plain_bytes > 3 << 20, "{c:?}");
    assert!(s.render().contains("off (mode none)"), "{}", s.render());
}

// A flipped bit inside a packed block: the receiver refuses it (it does
// not unpack, or unpacks to bytes whose checksum is wrong), counts it and
// asks again; what lands is whole.
#[test]
fn a_damaged_packed_block_is_refused_counted_and_sent_again() {
    for mode in [Compression::Lz4, Compression::Zstd] {
        let dir = scratch(&format!("pack-flip-{mode}"));
        let src = dir.path().join("log.txt");
        write_text(&src, 1 << 20, 4);
        let root = dir.path().join("dst");
        std::fs::create_dir_all(&root).unwrap();
        let srv = server(&root, IoMode::Async);
        // Past the handshake and the first packed block's header.
        let relay = Relay::start(srv.addr(), vec![Fault::FlipByte { conn: 1, at: 3000 }]);
        let mut cfg = send_cfg(relay.addr, &src, "out.txt");
        cfg.streams = 1;
        cfg.compress = mode;
        let s = send(&cfg).unwrap();
        assert_eq!(relay.fired.load(Ordering::SeqCst), 1);
        assert!(s.ok, "{}", s.render());
        assert!(s.blocks_retried >= 1, "{}", s.render());
        assert!(s.compression.packed_blocks > 0);
        let rx = wait_summaries(&srv, 1);
        assert_eq!(rx[0].blocks_rejected, 1, "{mode}");
        assert_same(&src, &root.join("out.txt"));
    }
}

// Checksums are of the plain blocks, so a transfer cut while packing with
// zstd resumes plain and keeps every block that landed.
#[test]
fn a_transfer_cut_while_packing_resumes_under_another_mode() {
    let dir = scratch("pack-resume");
    let src = dir.path().join("log.txt");
    write_text(&src, 4 << 20, 5);
    let root = dir.path().join("dst");
    std::fs::create_dir_all(&root).unwrap();
    let srv = server(&root, IoMode::Async);
    let relay = Relay::start(srv.addr(), Vec::new());
    let mut cfg = send_cfg(relay.addr, &src, "out.txt");
    cfg.block_size = 256 << 10;
    cfg.buffer = 2 << 20;
    cfg.streams = 1;
    cfg.compress = Compression::Zstd;
    // Slow enough to cut mid-file: packed, the text moves several times
    // faster than the cap.
    cfg.max_rate = Some(300_000);
    let run = std::thread::spawn(move || send(&cfg));
    let ckpt = root.join(".out.txt.wirerate-ckpt");
    let t0 = std::time::Instant::now();
    while std::fs::read(&ckpt)
        .ok()
        .and_then(|b| wirerate_engine::receiver::Checkpoint::decode(&b))
        .is_none_or(|c| c.durable.count() < 2)
    {
        assert!(t0.elapsed() < Duration::from_secs(30), "no checkpoint");
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(relay);
    assert!(run.join().unwrap().is_err(), "the cut run must fail");
    wait_summaries(&srv, 1);
    let held = wirerate_engine::receiver::Checkpoint::decode(&std::fs::read(&ckpt).unwrap())
        .unwrap()
        .durable
        .count() as u64
        * (256 << 10);
    assert!(held > 0 && held < 4 << 20, "cut mid-file: {held}");
    let mut cfg = send_cfg(srv.addr(), &src, "out.txt");
    cfg.block_size = 256 << 10;
    cfg.compress = Compression::None;
    let s = send(&cfg).unwrap();
    assert!(s.ok, "{}", s.render());
    assert_eq!(s.bytes_skipped_resume, held, "{}", s.render());
    assert_eq!(s.compression.packed_blocks, 0);
    assert_same(&src, &root.join("out.txt"));
}
