//! Warm data streams over loopback: a sender's next session to the same
//! receiver joins over the connections its last one parked, with a fresh
//! handshake each time, and nothing a parked connection carried survives
//! into the next session.

mod common;

use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use wirerate_engine::io::IoMode;
use wirerate_engine::receiver::{ServeConfig, Server, ServerHandle};
use wirerate_engine::sender::send;
use wirerate_engine::sender::warm::{Warm, WarmKey};
use wirerate_engine::wire::{
    BlockHeader, Frame, NONCE_LEN, VERSION, read_frame_capped, write_frame,
};

fn warm_cfg(
    to: SocketAddr,
    src: &std::path::Path,
    dest: &str,
    streams: u16,
    warm: &Arc<Warm>,
) -> wirerate_engine::sender::SendConfig {
    let mut cfg = send_cfg(to, src, dest);
    cfg.streams = streams;
    cfg.warm = Some(Arc::clone(warm));
    cfg
}

/// A scratch directory with a receiver's root `dst` and a file `a.dat` of
/// `len` bytes.
fn setup(name: &str, len: usize, seed: u64) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = scratch(name);
    let root = dir.path().join("dst");
    std::fs::create_dir_all(&root).unwrap();
    let a = dir.path().join("a.dat");
    write_file(&a, len, seed);
    (dir, root, a)
}

/// Waits until the receiver holds `n` connections (a control connection
/// is let go just after its sender returns).
fn wait_connections(srv: &ServerHandle, n: usize) {
    let until = Instant::now() + Duration::from_secs(10);
    while srv.connections() != n && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(srv.connections(), n, "connections the receiver holds");
}

#[test]
fn the_next_send_joins_over_the_streams_the_last_one_parked() {
    let dir = scratch("warm");
    let root = dir.path().join("dst");
    std::fs::create_dir_all(&root).unwrap();
    let src = dir.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    let a = src.join("a.dat");
    let b = src.join("b.dat");
    let c = src.join("c.dat");
    write_file(&a, 3 << 20, 1);
    write_file(&b, (5 << 20) + 4321, 2);
    write_file(&c, 7 << 20, 3);
    let srv = server(&root, IoMode::Async);
    let warm = Arc::new(Warm::default());

    let first = send(&warm_cfg(srv.addr(), &a, "a.dat", 4, &warm)).unwrap();
    assert!(first.ok, "{}", first.render());
    assert_eq!(first.streams_warm, 0, "nothing was parked before");
    assert_eq!(warm.len(), 4, "every data stream parked");
    // The receiver keeps them too, waiting for a handshake.
    wait_connections(&srv, 4);

    let second = send(&warm_cfg(srv.addr(), &b, "b.dat", 4, &warm)).unwrap();
    assert!(second.ok, "{}", second.render());
    assert_eq!(second.streams_warm, 4, "{}", second.render());
    assert!(second.render().contains("4 data stream joins over parked"));
    assert_same(&b, &root.join("b.dat"));
    wait_connections(&srv, 4);

    // More streams than are parked: the rest connect afresh, and all park.
    let third = send(&warm_cfg(srv.addr(), &c, "c.dat", 8, &warm)).unwrap();
    assert!(third.ok, "{}", third.render());
    assert_eq!(third.streams_warm, 4);
    assert_same(&c, &root.join("c.dat"));
    assert_eq!(warm.len(), 8);

    let summaries = wait_summaries(&srv, 3);
    assert_eq!(summaries.len(), 3);
    assert!(summaries.iter().all(|s| s.outcome.is_complete()));
    assert_same(&a, &root.join("a.dat"));
    assert_no_leftovers(&root);
}

#[test]
fn a_sender_without_a_warm_pool_closes_its_streams() {
    let (_dir, root, a) = setup("cold", 1 << 20, 4);
    let srv = server(&root, IoMode::Async);
    let s = send(&send_cfg(srv.addr(), &a, "a.dat")).unwrap();
    assert!(s.ok);
    wait_connections(&srv, 0);
}

#[test]
fn a_parked_connection_is_not_reused_once_its_receiver_has_gone() {
    let (_dir, root, a) = setup("gone", 2 << 20, 5);
    let first_srv = server(&root, IoMode::Async);
    let addr = first_srv.addr();
    let warm = Arc::new(Warm::default());
    assert!(send(&warm_cfg(addr, &a, "a.dat", 2, &warm)).unwrap().ok);
    assert_eq!(warm.len(), 2);
    // A stopped receiver closes what it had parked.
    first_srv.stop();
    let srv = server_at(&root, addr);
    let s = send(&warm_cfg(addr, &a, "again.dat", 2, &warm)).unwrap();
    assert!(s.ok, "{}", s.render());
    assert_eq!(
        s.streams_warm, 0,
        "both connections were to the old receiver"
    );
    assert_same(&a, &root.join("again.dat"));
    assert_eq!(warm.len(), 2, "the new ones parked");
    assert!(wait_summaries(&srv, 1)[0].outcome.is_complete());
}

/// A parked connection carries no authentication into what follows: it
/// is back in the handshake (a hello of another version is answered as
/// at a new connection's start), and a block sent on one without a new
/// handshake is refused and the connection closed.
#[test]
fn a_parked_connection_must_authenticate_again() {
    let (_dir, root, a) = setup("reauth", 1 << 20, 6);
    let srv = server(&root, IoMode::Async);
    let warm = Arc::new(Warm::default());
    assert!(
        send(&warm_cfg(srv.addr(), &a, "a.dat", 2, &warm))
            .unwrap()
            .ok
    );
    let key = WarmKey {
        to: srv.addr().to_string(),
        buffer: None,
        congestion: None,
    };
    let take = || {
        let st: TcpStream = warm.take(&key, Instant::now()).expect("a parked stream");
        st.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        st
    };
    let mut hello = take();
    write_frame(
        &mut hello,
        &Frame::Hello {
            version: VERSION + 1,
            nonce: [7; NONCE_LEN],
        },
    )
    .unwrap();
    match read_frame_capped(&mut hello, 1 << 16) {
        Ok(Frame::Error { message, .. }) => {
            assert!(
                message.contains("unsupported protocol version"),
                "{message}"
            );
        }
        other => panic!("a parked stream's hello answered with {other:?}"),
    }
    let mut block = take();
    write_frame(
        &mut block,
        &Frame::Block(BlockHeader {
            file_id: 0,
            block: 0,
            offset: 0,
            len: 4096,
        }),
    )
    .unwrap();
    // Refused as a broken handshake, then closed.
    let mut said = Vec::new();
    while let Ok(f) = read_frame_capped(&mut block, 1 << 16) {
        said.push(f);
    }
    assert!(
        matches!(said.as_slice(), [] | [Frame::Error { .. }]),
        "{said:?}"
    );
    wait_connections(&srv, 0);
    assert_eq!(wait_summaries(&srv, 1).len(), 1, "no second session");
}

/// Idle warm senders must not hold the slots a cold one needs: a
/// receiver parks at most a quarter of its connections, and closes the
/// rest as before.
#[test]
fn a_receiver_parks_at_most_a_quarter_of_its_connections() {
    let (_dir, root, a) = setup("quarter", 2 << 20, 7);
    let mut cfg = ServeConfig::new(root.clone(), TOKEN.to_vec());
    cfg.buffer = 8 << 20;
    // A control connection and four streams, and two parked.
    cfg.max_connections = 8;
    let srv = Server::bind("127.0.0.1:0", cfg).unwrap().spawn();
    let warm = Arc::new(Warm::default());
    assert!(
        send(&warm_cfg(srv.addr(), &a, "a.dat", 4, &warm))
            .unwrap()
            .ok
    );
    assert_eq!(warm.len(), 2, "the receiver parked two of four");
    wait_connections(&srv, 2);
    let s = send(&warm_cfg(srv.addr(), &a, "b.dat", 4, &warm)).unwrap();
    assert!(s.ok, "{}", s.render());
    assert_eq!(s.streams_warm, 2);
    assert_same(&a, &root.join("b.dat"));
    // The first two gave their places back: two park again.
    assert_eq!(warm.len(), 2);
    wait_connections(&srv, 2);
}
