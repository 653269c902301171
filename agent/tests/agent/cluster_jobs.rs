//! The in-cluster agent's engine jobs on real files and sockets: a receiver
//! bound for one transfer, a sender started from Transfer-style settings,
//! cancellation, the cleanup of a cancelled transfer, and root checks.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::common::{TOKEN, assert_same, scratch, write_file};
use wirerate_agent::cluster::jobs::{
    ReceiveTerms, ReceiverJob, SendTerms, SenderJob, SenderOutcome, Targets, remove_partials,
    under_roots,
};
use wirerate_crds::Tuning;
use wirerate_crds::tuning::Compression;
use wirerate_engine::Layout;
use wirerate_engine::receiver::Checkpoint;

fn tuning() -> Tuning {
    Tuning {
        streams: Some(4),
        block_size: Some(1 << 20),
        ..Default::default()
    }
}

fn free_ports() -> std::ops::Range<u16> {
    // Taken by this test alone: other tests bind port 0.
    let base = 20000 + (std::process::id() % 20000) as u16;
    base..base + 50
}

fn wait_outcome(s: &SenderJob, limit: Duration) -> SenderOutcome {
    let start = Instant::now();
    loop {
        if let Some(o) = s.outcome() {
            return o;
        }
        assert!(
            start.elapsed() < limit,
            "the sender did not finish within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_receiver_job_takes_a_sender_jobs_file_into_the_destination_directory() {
    let dir = scratch("cluster-jobs");
    let (src, dst) = (dir.path().join("src"), dir.path().join("dst/run-7"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(&dst).unwrap();
    let file = src.join("frames.h5");
    write_file(&file, 9 * (1 << 20) + 4321, 7);

    // A second job must get another port from the range.
    let first = ReceiverJob::start(
        dst.clone(),
        TOKEN.to_vec(),
        &tuning(),
        free_ports(),
        ReceiveTerms::default(),
    )
    .unwrap();
    let mut rx = ReceiverJob::start(
        dst.clone(),
        TOKEN.to_vec(),
        &tuning(),
        free_ports(),
        ReceiveTerms::default(),
    )
    .unwrap();
    assert_ne!(first.port, rx.port);

    let endpoint = format!("127.0.0.1:{}", rx.port);
    let tx = SenderJob::start(
        Targets::one(std::slice::from_ref(&endpoint)),
        TOKEN.to_vec(),
        file.clone(),
        "frames.h5".into(),
        &tuning(),
        SendTerms::default(),
    )
    .unwrap();
    let SenderOutcome::Verified(sum) = wait_outcome(&tx, Duration::from_secs(60)) else {
        panic!("not verified");
    };
    assert!(sum.ok, "{sum:?}");
    // Fixed by the tuning: as given, and nothing for status.tuning.
    assert_eq!(sum.streams, 4);
    assert_eq!(sum.streams_chosen, None);
    assert!(tx.progress.streams_chosen.get().is_none());
    assert_eq!(tx.progress.position().done, sum.bytes_total);
    assert_same(&file, &dst.join("frames.h5"));

    // Set by neither the Transfer nor its pool: the tuner chooses, and
    // the choice reaches what the agent reports (status.tuning, an Event).
    // The Transfer's compression reaches the engine likewise, and what it
    // did is what the agent reports (status.compression): every block of
    // this noise tried with zstd, none shrinking.
    let untuned = Tuning {
        streams: None,
        compression: Some(Compression::Zstd),
        ..tuning()
    };
    let tx = SenderJob::start(
        Targets::one(std::slice::from_ref(&endpoint)),
        TOKEN.to_vec(),
        file.clone(),
        "again.h5".into(),
        &untuned,
        SendTerms::default(),
    )
    .unwrap();
    let SenderOutcome::Verified(sum) = wait_outcome(&tx, Duration::from_secs(60)) else {
        panic!("not verified");
    };
    let packing = tx.progress.transfer.compression().expect("reported");
    assert_eq!(packing.mode, Compression::Zstd);
    assert_eq!(packing.codec, Some(wirerate_engine::compress::Codec::Zstd));
    assert_eq!(packing.packed_blocks, 0);
    // Every piece went as it is, behind its 8-byte prefix: 1 MiB blocks
    // of four 256 KiB pieces, the last block's one.
    let size = std::fs::metadata(&file).unwrap().len();
    assert_eq!(packing.plain_bytes, size);
    assert_eq!(packing.wire_bytes, size + 8 * (9 * 4 + 1));
    let chosen = tx.progress.streams_chosen.get().expect("a choice reported");
    assert_eq!(chosen.streams, sum.streams);
    assert_eq!(sum.streams_chosen.as_deref(), Some(chosen.reason.as_str()));
    assert_same(&file, &dst.join("again.h5"));

    // The Transfer's sync level reaches the engine: the same file again,
    // by mtime, is found there and not sent.
    let tx = SenderJob::start(
        Targets::one(std::slice::from_ref(&endpoint)),
        TOKEN.to_vec(),
        file.clone(),
        "again.h5".into(),
        &tuning(),
        SendTerms {
            sync: wirerate_engine::sync::SyncLevel::Mtime,
            ..SendTerms::default()
        },
    )
    .unwrap();
    let SenderOutcome::Verified(sum) = wait_outcome(&tx, Duration::from_secs(60)) else {
        panic!("not verified");
    };
    assert!(sum.ok, "{sum:?}");
    assert_eq!(sum.files_present, 1, "{sum:?}");
    assert_eq!(sum.digest, "none (nothing sent)");
    let start = Instant::now();
    while !rx
        .summaries()
        .iter()
        .any(|s| s.outcome.is_complete() && s.files_ok == 1)
    {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no complete receiver summary: {:?}",
            rx.summaries()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    rx.stop();
}

// A Transfer's filters reach the engine: only what they take lands.
#[test]
fn a_transfers_filters_choose_what_its_sender_sends() {
    let dir = scratch("cluster-jobs-filters");
    let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
    write_file(&src.join("a.h5"), 5000, 1);
    write_file(&src.join("b.txt"), 5000, 2);
    std::fs::create_dir_all(&dst).unwrap();
    let mut rx = ReceiverJob::start(
        dst.clone(),
        TOKEN.to_vec(),
        &tuning(),
        free_ports(),
        ReceiveTerms::default(),
    )
    .unwrap();
    let endpoint = format!("127.0.0.1:{}", rx.port);
    let tx = SenderJob::start(
        Targets::one(std::slice::from_ref(&endpoint)),
        TOKEN.to_vec(),
        src.clone(),
        "run".into(),
        &tuning(),
        SendTerms {
            filters: wirerate_engine::filter::Filters {
                include: vec!["*.h5".into()],
                ..Default::default()
            },
            ..SendTerms::default()
        },
    )
    .unwrap();
    let SenderOutcome::Verified(sum) = wait_outcome(&tx, Duration::from_secs(60)) else {
        panic!("not verified");
    };
    assert!(sum.ok, "{sum:?}");
    assert_eq!(sum.files_filtered, 1, "{sum:?}");
    assert_same(&src.join("a.h5"), &dst.join("run/a.h5"));
    assert!(!dst.join("run/b.txt").exists());
    rx.stop();
}

// A Transfer's mirror reaches the engine, and its receiving pool's
// allowDeletes decides: allowed, the stray file goes and the report says
// so; not allowed, nothing goes and the job fails saying why.
#[test]
fn a_transfers_mirror_deletes_only_where_its_pool_allows() {
    let dir = scratch("cluster-jobs-mirror");
    let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
    write_file(&src.join("a.h5"), 5000, 1);
    for allow in [false, true] {
        write_file(&dst.join("run/stray.h5"), 100, 2);
        let terms = ReceiveTerms {
            mirror: allow.then(|| "run".to_string()),
            ..ReceiveTerms::default()
        };
        let mut rx =
            ReceiverJob::start(dst.clone(), TOKEN.to_vec(), &tuning(), free_ports(), terms)
                .unwrap();
        let endpoint = format!("127.0.0.1:{}", rx.port);
        let tx = SenderJob::start(
            Targets::one(std::slice::from_ref(&endpoint)),
            TOKEN.to_vec(),
            src.clone(),
            "run".into(),
            &tuning(),
            SendTerms {
                mirror: Some(wirerate_engine::mirror::Guard::default()),
                ..SendTerms::default()
            },
        )
        .unwrap();
        match (allow, wait_outcome(&tx, Duration::from_secs(60))) {
            (true, SenderOutcome::Verified(sum)) => {
                let note = sum.mirror.clone().unwrap_or_default();
                assert!(note.contains("mirror deleted 1 of 1 entries"), "{sum:?}");
                assert!(!dst.join("run/stray.h5").exists());
            }
            (false, SenderOutcome::FilesFailed(sum)) => {
                let (what, why) = &sum.failures[0];
                assert_eq!(what, "mirror of run");
                assert!(why.contains("allowDeletes"), "{why}");
                assert!(dst.join("run/stray.h5").exists());
            }
            (_, other) => panic!("allow {allow}: {other:?}"),
        }
        assert_same(&src.join("a.h5"), &dst.join("run/a.h5"));
        rx.stop();
    }
}

// A Transfer's spec.keep reaches both engines: the owner (through its
// map) and a user attribute land with the file, where the receiving
// pool sets owners.
#[test]
fn a_transfers_keep_reaches_sender_and_receiver() {
    if !crate::common::require_root("keeping owners in cluster jobs") {
        return;
    }
    let dir = scratch("cluster-jobs-keep");
    let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
    let f = src.join("a.h5");
    write_file(&f, 5000, 1);
    std::os::unix::fs::chown(&f, Some(1234), Some(5678)).unwrap();
    rustix::fs::setxattr(&f, "user.run", b"42", rustix::fs::XattrFlags::empty()).unwrap();
    std::fs::create_dir_all(&dst).unwrap();
    let terms = ReceiveTerms {
        owners: wirerate_engine::metadata::OwnerPolicy::Keep,
        ..ReceiveTerms::default()
    };
    let mut rx =
        ReceiverJob::start(dst.clone(), TOKEN.to_vec(), &tuning(), free_ports(), terms).unwrap();
    let endpoint = format!("127.0.0.1:{}", rx.port);
    let spec = wirerate_crds::transfer::KeepSpec {
        owner: true,
        xattrs: true,
        uid_map: vec![wirerate_crds::transfer::IdPair {
            from: 1234,
            to: 4321,
        }],
        ..Default::default()
    };
    let tx = SenderJob::start(
        Targets::one(std::slice::from_ref(&endpoint)),
        TOKEN.to_vec(),
        src.clone(),
        "run".into(),
        &tuning(),
        SendTerms {
            keeping: spec.keeping().unwrap(),
            ..SendTerms::default()
        },
    )
    .unwrap();
    let SenderOutcome::Verified(_) = wait_outcome(&tx, Duration::from_secs(60)) else {
        panic!("not verified");
    };
    let got = dst.join("run/a.h5");
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(&got).unwrap();
    assert_eq!((m.uid(), m.gid()), (4321, 5678));
    let mut v = [0u8; 8];
    let n = rustix::fs::getxattr(&got, "user.run", &mut v[..]).unwrap();
    assert_eq!(&v[..n], b"42");
    rx.stop();
}

/// What a new session would keep of `name` in `dir` now: all of it once
/// published, else what its stored checkpoint records. The checkpoint is
/// read first: publishing removes it, and the published file is then seen.
fn resumable(dir: &std::path::Path, name: &str) -> u64 {
    let ckpt = std::fs::read(dir.join(format!(".{name}.wirerate-ckpt")))
        .ok()
        .and_then(|b| Checkpoint::decode(&b))
        .map_or(0, |c| {
            Layout::new(c.size, c.block_size).bytes_in(&c.durable)
        });
    match std::fs::metadata(dir.join(name)) {
        Ok(m) => m.len(),
        Err(_) => ckpt,
    }
}

#[test]
fn the_progress_a_receiver_shows_never_runs_ahead_of_what_a_resume_keeps() {
    // The sender used to show the bytes acknowledged as written: up to a
    // checkpoint interval ahead of the checkpoint (55% shown, 48% resumed).
    let dir = scratch("cluster-kept");
    let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(&dst).unwrap();
    let file = src.join("scan.raw");
    let size: u64 = 40 * (1 << 20) + 777;
    write_file(&file, size as usize, 11);
    let rx = ReceiverJob::start(
        dst.clone(),
        TOKEN.to_vec(),
        &tuning(),
        free_ports(),
        ReceiveTerms::default(),
    )
    .unwrap();
    assert_eq!(rx.position(), None, "nothing planned yet");
    // 160 Mbit/s: about 2 s, several checkpoints.
    let tx = SenderJob::start(
        Targets::one(&[format!("127.0.0.1:{}", rx.port)]),
        TOKEN.to_vec(),
        file.clone(),
        "scan.raw".into(),
        &tuning(),
        SendTerms {
            max_rate_mbps: Some(160),
            ..SendTerms::default()
        },
    )
    .unwrap();
    let (mut samples, mut acked_ahead, mut partial) = (0, 0, 0);
    let start = Instant::now();
    while tx.outcome().is_none() {
        assert!(start.elapsed() < Duration::from_secs(60), "not done");
        if let Some(l) = rx.position() {
            let acked = tx.progress.position().done;
            let kept = l.done;
            let on_disk = resumable(&dst, "scan.raw");
            assert!(
                kept <= on_disk,
                "shown {kept} B kept, but a resume would keep {on_disk} B"
            );
            assert!(l.total == size && kept <= l.total && l.moved <= l.total);
            samples += 1;
            acked_ahead += usize::from(acked > on_disk);
            partial += usize::from(kept > 0 && kept < size);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(matches!(tx.outcome(), Some(SenderOutcome::Verified(_))));
    assert!(samples > 50, "only {samples} samples");
    assert!(
        acked_ahead > 0,
        "the acknowledged count never ran ahead of the checkpoint: the test shows nothing"
    );
    assert!(
        partial > 0,
        "no checkpoint was shown while the transfer ran"
    );
    // Published: all of it is kept.
    let start = Instant::now();
    while rx.position().map(|l| l.done) != Some(size) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{:?}",
            rx.position()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_same(&file, &dst.join("scan.raw"));
}

#[test]
fn a_second_session_of_the_same_transfer_counts_on_from_the_first() {
    // A sender that reconnects lists only the files still open: the
    // receiver's figures were the new session's alone, so the progress fell
    // (60 of 100 GB to 0 of 40) and looked like a stall.
    let dir = scratch("cluster-sessions");
    let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(&dst).unwrap();
    let (a, b) = (5 * (1 << 20) + 1, 3 * (1 << 20) + 7);
    write_file(&src.join("a.bin"), a, 1);
    write_file(&src.join("b.bin"), b, 2);
    let rx = ReceiverJob::start(
        dst.clone(),
        TOKEN.to_vec(),
        &tuning(),
        free_ports(),
        ReceiveTerms::default(),
    )
    .unwrap();
    for name in ["a.bin", "b.bin"] {
        let tx = SenderJob::start(
            Targets::one(&[format!("127.0.0.1:{}", rx.port)]),
            TOKEN.to_vec(),
            src.join(name),
            name.into(),
            &tuning(),
            SendTerms::default(),
        )
        .unwrap();
        assert!(matches!(
            wait_outcome(&tx, Duration::from_secs(60)),
            SenderOutcome::Verified(_)
        ));
        assert_same(&src.join(name), &dst.join(name));
    }
    let l = rx.position().unwrap();
    let both = (a + b) as u64;
    assert_eq!((l.done, l.total), (both, both), "{l:?}");
    assert!(l.moved >= both && l.seconds > 0.0, "{l:?}");
}

/// The agent metric names the Grafana dashboard's queries read.
fn dashboard_names() -> Vec<String> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../charts/wirerate/dashboards/wirerate.json"
    );
    let d: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut names = Vec::new();
    for panel in d["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().unwrap() {
            let expr = t["expr"].as_str().unwrap();
            for (i, _) in expr.match_indices("wirerate_") {
                let name: String = expr[i..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                let agents =
                    name.starts_with("wirerate_sender_") || name.starts_with("wirerate_receiver_");
                if agents && !names.contains(&name) {
                    names.push(name);
                }
            }
        }
    }
    names
}

#[test]
fn the_agents_metrics_endpoint_serves_every_metric_the_dashboard_queries() {
    // Only the receiver exported metrics: a sending agent's bytes, resends,
    // stream failures and sessions were nowhere.
    let dir = scratch("cluster-metrics");
    let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(&dst).unwrap();
    let file = src.join("m.bin");
    write_file(&file, 6 * (1 << 20) + 5, 9);
    let rx = ReceiverJob::start(
        dst.clone(),
        TOKEN.to_vec(),
        &tuning(),
        free_ports(),
        ReceiveTerms::default(),
    )
    .unwrap();
    let tx = SenderJob::start(
        Targets::one(&[format!("127.0.0.1:{}", rx.port)]),
        TOKEN.to_vec(),
        file,
        "m.bin".into(),
        &tuning(),
        SendTerms::default(),
    )
    .unwrap();
    assert!(matches!(
        wait_outcome(&tx, Duration::from_secs(60)),
        SenderOutcome::Verified(_)
    ));

    let addr = wirerate_agent::metrics::serve("127.0.0.1:0").unwrap();
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    use std::io::{Read, Write};
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    c.read_to_string(&mut body).unwrap();
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    let served: Vec<&str> = body
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    // Each data stream's TCP_INFO, sampled as the session ended.
    assert!(
        served.contains(&"wirerate_sender_stream_rtt_seconds"),
        "{body}"
    );
    let wanted = dashboard_names();
    assert!(wanted.len() >= 6, "{wanted:?}");
    let missing: Vec<&String> = wanted
        .iter()
        .filter(|n| !served.contains(&n.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "the dashboard queries {missing:?}, not served:\n{body}"
    );
    let value = |line_start: &str| -> f64 {
        body.lines()
            .find(|l| l.starts_with(line_start))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {line_start} in {body}"))
    };
    // Other tests in this binary send too: at least this transfer's bytes.
    assert!(value("wirerate_sender_bytes_sent_total") >= (6 * (1 << 20) + 5) as f64);
    assert!(value("wirerate_sender_sessions_total{outcome=\"complete\"}") >= 1.0);
    assert!(body.contains("wirerate_sender_stream_bytes_total{stream=\"0\"}"));
}

#[test]
fn a_cancelled_sender_stops_retrying() {
    let dir = scratch("cluster-cancel");
    let file = dir.path().join("f");
    write_file(&file, 1 << 20, 1);
    // Nothing listens on port 9 of loopback: every connect is refused and retried.
    let mut tx = SenderJob::start(
        Targets::one(&["127.0.0.1:9".to_owned()]),
        TOKEN.to_vec(),
        file,
        "f".into(),
        &tuning(),
        SendTerms::default(),
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        tx.outcome().is_none(),
        "still retrying (retry window is 90 s)"
    );
    tx.cancel();
    let SenderOutcome::Failed {
        reason,
        disposition,
    } = wait_outcome(&tx, Duration::from_secs(15))
    else {
        panic!("a cancelled sender did not fail");
    };
    assert!(reason.contains("cancelled"), "{reason}");
    assert_eq!(
        disposition,
        wirerate_engine::Disposition::FailSession,
        "{reason}"
    );
}

#[test]
fn cleanup_removes_only_the_partial_files_of_the_destination() {
    let dir = scratch("cluster-cleanup");
    let d = dir.path();
    for name in [
        ".data.wirerate-part",
        ".data.wirerate-ckpt",
        ".other.wirerate-part",
        "keep.txt",
    ] {
        std::fs::write(d.join(name), b"x").unwrap();
    }
    assert_eq!(remove_partials(&d.join("data")), 2);
    assert!(d.join(".other.wirerate-part").exists() && d.join("keep.txt").exists());

    // A directory destination: partials anywhere beneath it.
    let tree = d.join("tree/sub");
    std::fs::create_dir_all(&tree).unwrap();
    std::fs::write(tree.join(".a.wirerate-part"), b"x").unwrap();
    std::fs::write(tree.join("a"), b"x").unwrap();
    assert_eq!(remove_partials(&d.join("tree")), 1);
    assert!(tree.join("a").exists());
}

#[test]
fn sources_must_resolve_beneath_an_allowed_root() {
    let dir = scratch("cluster-roots");
    let root = dir.path().join("allowed");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(root.join("ok"), b"x").unwrap();
    std::fs::write(dir.path().join("secret"), b"x").unwrap();
    std::os::unix::fs::symlink(dir.path().join("secret"), root.join("link")).unwrap();
    let roots = vec![root.display().to_string()];
    assert!(under_roots(&root.join("ok"), &roots).is_ok());
    let err = under_roots(&root.join("link"), &roots)
        .unwrap_err()
        .to_string();
    assert!(err.contains("not under this pool's allowedRoots"), "{err}");
    // A root is a directory, not a string prefix.
    std::fs::create_dir_all(dir.path().join("allowed-not")).unwrap();
    std::fs::write(dir.path().join("allowed-not/x"), b"x").unwrap();
    assert!(under_roots(&dir.path().join("allowed-not/x"), &roots).is_err());
}

// The in-cluster sender clamped streams to 1..=64 and the receiver raised a
// queue depth of 0 to 1, so a Transfer ran with settings nobody asked for.
// Out of range is now refused with the field's name, as the CLI refuses it.
#[test]
fn out_of_range_tuning_is_refused_naming_the_field_not_clamped() {
    let dst = scratch("refuse-tuning");
    let src = scratch("refuse-tuning-src");
    let file = src.path().join("f.bin");
    write_file(&file, 4096, 3);
    let wide = Tuning {
        streams: Some(300),
        ..tuning()
    };
    let err = SenderJob::start(
        Targets::one(&["127.0.0.1:9".to_owned()]),
        TOKEN.to_vec(),
        file,
        "f.bin".into(),
        &wide,
        SendTerms::default(),
    )
    .err()
    .expect("refused");
    assert!(
        err.to_string()
            .contains("streams (--streams) must be from 1 to 256; got 300"),
        "{err}"
    );
    let shallow = Tuning {
        queue_depth: Some(0),
        ..tuning()
    };
    let err = ReceiverJob::start(
        dst.path().to_path_buf(),
        TOKEN.to_vec(),
        &shallow,
        free_ports(),
        ReceiveTerms::default(),
    )
    .err()
    .expect("refused");
    assert!(
        err.to_string()
            .contains("queueDepth (--queue-depth) must be from 1 to 4096; got 0"),
        "{err}"
    );
}

/// A taken port used to read "invalid setting: cannot listen on ...",
/// the last port's error alone.
#[test]
fn a_receiver_job_with_every_port_taken_says_which_and_why() {
    let dst = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let err = ReceiverJob::start(
        dst.path().to_path_buf(),
        TOKEN.to_vec(),
        &tuning(),
        port..port + 1,
        ReceiveTerms::default(),
    )
    .err()
    .expect("refused");
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("no data port of {port}..{} is free", port + 1)),
        "{msg}"
    );
    assert!(
        msg.contains("the agent's own receivers or other processes"),
        "{msg}"
    );
    assert!(!msg.contains("invalid setting"), "{msg}");
    assert_eq!(err.metric_label(), "listen");
}

/// Everything logged in this test process, for the test below.
fn captured_logs() -> Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&logs);
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || Sink(Arc::clone(&sink)))
            .init();
        logs
    })
    .clone()
}

struct Sink(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Sink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

// An in-cluster agent runs several transfers at once, and its engine
// threads logged without saying which: "session 1 failed: connecting to
// ..." named no Transfer. They now log under the span the job was started
// in.
#[test]
fn a_jobs_threads_log_under_its_transfers_span() {
    let logs = captured_logs();
    let src = scratch("spans-src");
    let file = src.path().join("f.bin");
    write_file(&file, 4096, 5);
    // Nothing listens there: the sender fails to connect and says so.
    let closed = free_ports().end;
    let span = tracing::info_span!("transfer", transfer = "lab/run-42");
    let mut tx = span
        .in_scope(|| {
            SenderJob::start(
                Targets::one(&[format!("127.0.0.1:{closed}")]),
                TOKEN.to_vec(),
                file,
                "f.bin".into(),
                &tuning(),
                SendTerms::default(),
            )
        })
        .unwrap();
    let start = Instant::now();
    let line = loop {
        let text = String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
        // Tests run in parallel and log too: only this job's line counts.
        let ours = format!("127.0.0.1:{closed}");
        if let Some(l) = text
            .lines()
            .find(|l| l.contains("session failed") && l.contains(&ours))
        {
            break l.to_owned();
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no failure logged: {text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    tx.cancel();
    assert!(line.contains("transfer{transfer=\"lab/run-42\"}"), "{line}");
    assert!(line.contains("session=1"), "{line}");
}

// The in-cluster sender of a Transfer over several pairs: one job drives
// three receiver jobs that share one root, and the file lands once,
// identical, with each pair in the summary.
#[test]
fn a_sender_job_given_several_receivers_spreads_one_file_over_them() {
    let (_dir, file, dst, _receivers, endpoints) = three_receivers("cluster-pairs", 21);
    let tx = SenderJob::start(
        Targets::pairs(&endpoints, 3),
        TOKEN.to_vec(),
        file.clone(),
        "volume.tiff".into(),
        &tuning(),
        SendTerms::default(),
    )
    .unwrap();
    let sum = match wait_outcome(&tx, Duration::from_secs(120)) {
        SenderOutcome::Verified(s) => s,
        other => panic!("not verified: {other:?}"),
    };
    assert_same(&file, &dst.join("volume.tiff"));
    assert_eq!(sum.pairs.len(), 3, "{:?}", sum.pairs);
    let bytes: u64 = sum.pairs.iter().map(|p| p.2).sum();
    assert_eq!(
        bytes, sum.bytes_total,
        "every byte made durable by one pair"
    );
    assert!(
        sum.pairs.iter().filter(|p| p.3 > 0).count() >= 2,
        "the work was spread: {:?}",
        sum.pairs
    );
    // What the in-cluster sender writes to status.stripes as it runs.
    let shown = tx.progress.transfer.pairs().expect("the pairs are shown");
    assert_eq!(shown.pairs.len(), 3);
    assert!(
        shown.chunk_bytes > 0 && shown.streams_per_pair == 4,
        "{shown:?}"
    );
    let bytes: u64 = shown.pairs.iter().map(|p| p.bytes).sum();
    assert_eq!(bytes, sum.bytes_total, "{shown:?}");
    assert!(
        shown.pairs.iter().all(|p| p.state == "finished"),
        "none is running once the send is over: {shown:?}"
    );
}

// Issue 34: a sender over several pairs that starts on one receiver (a
// Transfer with pairsPolicy Auto, or whose others were lost before it
// started) takes in the receivers that join while it runs; they take
// work, and the file lands once, identical.
#[test]
fn a_sender_job_takes_in_receivers_that_join_while_it_runs() {
    let (_dir, file, dst, _receivers, endpoints) = three_receivers("cluster-joins", 22);
    let tx = SenderJob::start(
        Targets::pairs(&endpoints[..1], 3),
        TOKEN.to_vec(),
        file.clone(),
        "volume.tiff".into(),
        &tuning(),
        // Slow enough that the work is still there when they join.
        SendTerms {
            max_rate_mbps: Some(200),
            ..SendTerms::default()
        },
    )
    .unwrap();
    for e in &endpoints {
        // The one it sends to already changes nothing.
        assert!(tx.join(e));
    }
    let sum = match wait_outcome(&tx, Duration::from_secs(120)) {
        SenderOutcome::Verified(s) => s,
        other => panic!("not verified: {other:?}"),
    };
    assert_same(&file, &dst.join("volume.tiff"));
    assert_eq!(sum.pairs.len(), 3, "{:?}", sum.pairs);
    let joined = sum.pairs.iter().filter(|p| p.0 != endpoints[0] && p.3 > 0);
    assert!(
        joined.count() >= 1,
        "no receiver that joined took work: {:?}",
        sum.pairs
    );
    let bytes: u64 = sum.pairs.iter().map(|p| p.2).sum();
    assert_eq!(
        bytes, sum.bytes_total,
        "every byte made durable by one pair"
    );
}

// Issue 34: a new attempt after the sending agent was lost (its job
// cancelled here, as a failover ends it) resumes from the pieces the
// receivers recorded on the shared storage, where it used to send every
// piece again.
#[test]
fn a_new_attempt_over_several_pairs_resumes_the_pieces_the_last_one_landed() {
    let (_dir, file, dst, _receivers, endpoints) = three_receivers("cluster-resume", 23);
    let start = |rate| {
        SenderJob::start(
            Targets::pairs(&endpoints, 3),
            TOKEN.to_vec(),
            file.clone(),
            "volume.tiff".into(),
            &tuning(),
            SendTerms {
                max_rate_mbps: rate,
                ..SendTerms::default()
            },
        )
        .unwrap()
    };
    let mut first = start(Some(200));
    let records = dst.join(".volume.tiff.wirerate-pieces");
    crate::common::wait_written(&records, Duration::from_secs(60), "no piece recorded");
    first.cancel();
    assert!(matches!(
        wait_outcome(&first, Duration::from_secs(30)),
        SenderOutcome::Failed { .. }
    ));
    let second = start(None);
    let sum = match wait_outcome(&second, Duration::from_secs(120)) {
        SenderOutcome::Verified(s) => s,
        other => panic!("not verified: {other:?}"),
    };
    assert_same(&file, &dst.join("volume.tiff"));
    assert!(sum.bytes_resumed > 0, "nothing resumed: {sum:?}");
    assert!(sum.bytes_resumed < sum.bytes_total, "{sum:?}");
    assert!(!records.exists(), "the records outlived the publish");
}

/// A 48 MiB source file (of `seed`) and three receiver jobs sharing one
/// destination root, in a scratch directory named for `name`: the
/// directory, the file, the root, the jobs and where they listen.
fn three_receivers(
    name: &str,
    seed: u64,
) -> (
    tempfile::TempDir,
    PathBuf,
    PathBuf,
    Vec<ReceiverJob>,
    Vec<String>,
) {
    let dir = scratch(name);
    let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(&dst).unwrap();
    let file = src.join("volume.tiff");
    write_file(&file, 48 * (1 << 20) + 999, seed);
    let receivers: Vec<ReceiverJob> = (0..3)
        .map(|_| {
            ReceiverJob::start(
                dst.clone(),
                TOKEN.to_vec(),
                &tuning(),
                free_ports(),
                ReceiveTerms::default(),
            )
            .unwrap()
        })
        .collect();
    let endpoints = receivers
        .iter()
        .map(|r| format!("127.0.0.1:{}", r.port))
        .collect();
    (dir, file, dst, receivers, endpoints)
}
