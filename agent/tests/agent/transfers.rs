//! Real transfers between a sender and a receiver over loopback TCP, on
//! real files: every size edge, every I/O mode on both sides, 1 and 8
//! streams, and a directory tree. Each destination must be byte-identical.

use crate::common::*;
use wirerate_engine::io::IoMode;
use wirerate_engine::sender::send;
use wirerate_engine::wire::Verification;

const BS: usize = 64 << 10;
const MODES: [IoMode; 3] = [IoMode::Buffered, IoMode::Direct, IoMode::Async];

fn sizes() -> Vec<usize> {
    vec![0, 1, 4095, 4096, BS - 1, BS, BS + 1, 3 * BS + 777]
}

#[test]
fn every_size_every_mode_pair_one_and_eight_streams() {
    let dir = scratch("matrix");
    let src_dir = dir.path().join("src");
    let mut sources = Vec::new();
    for (i, size) in sizes().into_iter().enumerate() {
        let p = src_dir.join(format!("f{size}"));
        write_file(&p, size, i as u64 + 1);
        sources.push((p, size));
    }
    for rx_mode in MODES {
        let root = dir.path().join(format!("dst-{rx_mode}"));
        std::fs::create_dir_all(&root).unwrap();
        let srv = server(&root, rx_mode);
        for tx_mode in MODES {
            for streams in [1u16, 8] {
                for (src, size) in &sources {
                    let dest = format!("{tx_mode}-{streams}/f{size}");
                    let mut cfg = send_cfg(srv.addr(), src, &dest);
                    cfg.io_mode = tx_mode;
                    cfg.streams = streams;
                    let s = send(&cfg).unwrap_or_else(|e| {
                        panic!("{tx_mode}->{rx_mode} x{streams} size {size}: {e}")
                    });
                    assert!(
                        s.ok,
                        "{tx_mode}->{rx_mode} x{streams} size {size}: {}",
                        s.render()
                    );
                    assert_eq!(s.bytes_total, *size as u64);
                    assert_eq!(s.bytes_sent, *size as u64, "nothing resent on a clean path");
                    assert_eq!(s.io.io_mode, tx_mode);
                    assert_same(src, &root.join(&dest));
                }
            }
        }
        let summaries = wait_summaries(&srv, 3 * 2 * sizes().len());
        assert_eq!(summaries.len(), 3 * 2 * sizes().len());
        assert!(
            summaries
                .iter()
                .all(|r| r.outcome.is_complete() && r.io.io_mode == rx_mode)
        );
        assert_no_leftovers(&root);
    }
}

#[test]
fn directory_of_small_files_and_two_large_ones() {
    let dir = scratch("tree");
    let src = dir.path().join("src/run42");
    let mut expected = 0u64;
    for i in 0..2000u64 {
        let size = (i * 7919 % 9000) as usize;
        write_file(&src.join(format!("d{}/s{i:04}.dat", i % 17)), size, i);
        expected += size as u64;
    }
    write_file(&src.join("big/a.h5"), 3 * (1 << 20) + 12345, 99);
    write_file(&src.join("big/b.h5"), 5 << 20, 98);
    expected += 3 * (1 << 20) + 12345 + (5 << 20);
    std::fs::create_dir_all(src.join("empty")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", src.join("link-out")).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        src.join("pipe"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();

    let root = dir.path().join("dst");
    std::fs::create_dir_all(&root).unwrap();
    let srv = server(&root, IoMode::Async);
    let mut cfg = send_cfg(srv.addr(), &src, "ingest/run42/");
    cfg.streams = 8;
    let s = send(&cfg).unwrap();
    assert!(s.ok, "{}", s.render());
    assert_eq!(s.bytes_total, expected);
    // 2002 files, and the directories (top, 17 subdirs, big, empty) on
    // their own: they were counted as files.
    assert_eq!(s.files, 2002);
    assert_eq!(s.files_ok, s.files);
    assert_eq!(s.dirs, 1 + 17 + 2);
    assert!(
        s.render()
            .contains("files      2002 of 2002 ok (and 20 directories)"),
        "{}",
        s.render()
    );
    let mut skipped: Vec<_> = s.skipped.iter().map(|k| k.reason.as_str()).collect();
    skipped.sort();
    assert_eq!(skipped, ["FIFO, not sent", "symlink, not followed"]);

    let out = root.join("ingest/run42");
    for p in walk(&src) {
        let rel = p.strip_prefix(&src).unwrap();
        let m = std::fs::symlink_metadata(&p).unwrap();
        if m.is_file() {
            assert_same(&p, &out.join(rel));
        } else if m.is_dir() {
            assert!(out.join(rel).is_dir(), "{} missing", rel.display());
        } else {
            assert!(
                !out.join(rel).exists(),
                "{} must not be sent",
                rel.display()
            );
        }
    }
    assert_no_leftovers(&root);
}

#[test]
fn verify_levels_none_and_reread() {
    let dir = scratch("verify");
    let src = dir.path().join("src.bin");
    write_file(&src, 5 * BS + 3, 7);
    let root = dir.path().join("dst");
    std::fs::create_dir_all(&root).unwrap();
    let srv = server(&root, IoMode::Async);
    for (v, dest) in [
        (Verification::None, "none.bin"),
        (Verification::Reread, "reread.bin"),
    ] {
        let mut cfg = send_cfg(srv.addr(), &src, dest);
        cfg.verify = v;
        let s = send(&cfg).unwrap();
        assert!(s.ok, "{}", s.render());
        assert_same(&src, &root.join(dest));
        assert_eq!(s.digest.starts_with("xxh3-128:"), v != Verification::None);
    }
}

#[test]
fn same_file_twice_gives_same_digest_and_overwrites() {
    let dir = scratch("twice");
    let src = dir.path().join("src.bin");
    write_file(&src, 2 * BS + 5, 3);
    let root = dir.path().join("dst");
    std::fs::create_dir_all(&root).unwrap();
    write_file(&root.join("x.bin"), 10, 1);
    let srv = server(&root, IoMode::Async);
    let a = send(&send_cfg(srv.addr(), &src, "x.bin")).unwrap();
    // `send` returns only once the receiver has closed the session, so the
    // destination is free for the next one at once.
    assert_eq!(srv.summaries().len(), 1);
    let b = send(&send_cfg(srv.addr(), &src, "x.bin")).unwrap();
    assert!(a.ok && b.ok);
    assert_eq!(a.digest, b.digest);
    assert_same(&src, &root.join("x.bin"));
}

#[test]
fn each_data_streams_tcp_info_is_in_the_summary() {
    let dir = scratch("tcp-info");
    let src = dir.path().join("src.bin");
    write_file(&src, 12 << 20, 3);
    let root = dir.path().join("dst");
    std::fs::create_dir_all(&root).unwrap();
    let srv = server(&root, IoMode::Async);
    let mut cfg = send_cfg(srv.addr(), &src, "t.bin");
    cfg.streams = 4;
    let s = send(&cfg).unwrap();
    assert!(s.ok, "{}", s.render());
    assert_eq!(s.tcp.len(), 4, "{:?}", s.tcp);
    for (i, t) in s.tcp.iter().enumerate() {
        let t = t.unwrap_or_else(|| panic!("stream {i} has no TCP_INFO"));
        assert!(
            t.rtt_ms > 0.0 && t.mss > 0 && t.pmtu > 0,
            "stream {i}: {t:?}"
        );
    }
    let text = s.render();
    assert!(text.contains("  tcp        rtt "), "{text}");
    let json = serde_json::to_value(&s).unwrap();
    assert!(json["tcp"][3]["rtt_ms"].as_f64().unwrap() > 0.0, "{json}");
}
