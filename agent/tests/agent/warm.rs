//! Warm data streams over loopback: a sender's next session to the same
//! receiver joins over the connections its last one parked, with a fresh
//! handshake each time, and nothing a parked connection carried survives
//! into the next session.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use wirerate_engine::io::IoMode;
use wirerate_engine::receiver::{Lobby, ServeConfig, Server, ServerHandle};
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
        let st = warm.take(&key, Instant::now()).expect("a parked stream");
        st.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        st
    };
    let mut hello = take();
    write_frame(
        &mut hello,
        &Frame::Hello {
            version: VERSION + 1,
            nonce: [7; NONCE_LEN],
            port: 0,
            encrypt: wirerate_engine::encryption::Encryption::None,
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

/// A receiver with `token`, in `lobby` if given, as the agent runs one
/// per transfer.
fn receiver_with(root: &std::path::Path, token: &[u8], lobby: Option<&Arc<Lobby>>) -> ServerHandle {
    receiver_at("127.0.0.1:0", root, token, lobby)
}

fn receiver_at(
    addr: &str,
    root: &std::path::Path,
    token: &[u8],
    lobby: Option<&Arc<Lobby>>,
) -> ServerHandle {
    let mut cfg = ServeConfig::new(root.to_path_buf(), token.to_vec());
    cfg.buffer = 8 << 20;
    cfg.lobby = lobby.cloned();
    Server::bind(addr, cfg).unwrap().spawn()
}

/// Two transfers between the same agents, each with a receiver, port and
/// token of its own: the second joins over the connections the first
/// parked, though its receiver stopped, and authenticates them with the
/// second's token.
#[test]
fn the_next_transfer_joins_over_connections_parked_at_another_receiver_of_the_lobby() {
    let (dir, root_a, a) = setup("lobby", 3 << 20, 8);
    let root_b = dir.path().join("dst-b");
    std::fs::create_dir_all(&root_b).unwrap();
    let b = dir.path().join("b.dat");
    write_file(&b, (4 << 20) + 99, 9);
    let lobby = Arc::new(Lobby::default());
    let srv_a = receiver_with(&root_a, b"token-of-the-first-transfer", Some(&lobby));
    let srv_b = receiver_with(&root_b, b"token-of-the-second-transfer", Some(&lobby));
    let warm = Arc::new(Warm::across_ports());

    let mut cfg = warm_cfg(srv_a.addr(), &a, "a.dat", 4, &warm);
    cfg.token = b"token-of-the-first-transfer".to_vec();
    let first = send(&cfg).unwrap();
    assert!(first.ok, "{}", first.render());
    assert_eq!(warm.len(), 4);
    // The first transfer is over: its receiver goes, its parked ones stay.
    srv_a.stop();

    let mut cfg = warm_cfg(srv_b.addr(), &b, "b.dat", 4, &warm);
    cfg.token = b"token-of-the-second-transfer".to_vec();
    let second = send(&cfg).unwrap();
    assert!(second.ok, "{}", second.render());
    assert_eq!(second.streams_warm, 4, "{}", second.render());
    assert_same(&b, &root_b.join("b.dat"));
    assert!(!root_a.join("b.dat").exists());
    assert!(wait_summaries(&srv_b, 1)[0].outcome.is_complete());
    // Parked again, now at the second receiver, whose slots they hold.
    assert_eq!(warm.len(), 4);
    wait_connections(&srv_b, 4);
    // Nothing holds the first receiver (its buffers, its root) any more:
    // its connections went over to the second.
    let until = Instant::now() + Duration::from_secs(10);
    while lobby.held() > 1 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(lobby.held(), 1, "receivers the lobby still holds");
}

/// A parked connection's hello that names another receiver's port is
/// never served by the receiver it was parked at, even with the same
/// token: its stream would join a session that receiver does not have.
/// Without a lobby it is refused, and the stream connects afresh.
#[test]
fn a_parked_connection_serves_no_receiver_it_was_not_meant_for() {
    let (dir, root_a, a) = setup("not-meant", 2 << 20, 10);
    let root_b = dir.path().join("dst-b");
    std::fs::create_dir_all(&root_b).unwrap();
    let srv_a = receiver_with(&root_a, TOKEN, None);
    let srv_b = receiver_with(&root_b, TOKEN, None);
    let warm = Arc::new(Warm::across_ports());
    assert!(
        send(&warm_cfg(srv_a.addr(), &a, "a.dat", 2, &warm))
            .unwrap()
            .ok
    );
    assert_eq!(warm.len(), 2);
    let s = send(&warm_cfg(srv_b.addr(), &a, "a.dat", 2, &warm)).unwrap();
    assert!(s.ok, "{}", s.render());
    assert_eq!(s.streams_warm, 0, "{}", s.render());
    assert_same(&a, &root_b.join("a.dat"));
    assert_eq!(s.blocks_retried, 0, "{}", s.render());
    // The refused ones were closed; the first receiver kept its session's file.
    wait_connections(&srv_a, 0);
    assert_eq!(wait_summaries(&srv_a, 1).len(), 1);
}

/// The agent gives a new transfer's receiver the first free data port,
/// often the one the last transfer's receiver had: its parked connections
/// go to the new receiver there, not to the stopped one.
#[test]
fn a_later_receiver_on_a_stopped_ones_port_takes_over_its_parked_connections() {
    let (_dir, root, a) = setup("same-port", 2 << 20, 11);
    let lobby = Arc::new(Lobby::default());
    let first = receiver_with(&root, b"first-token", Some(&lobby));
    let addr = first.addr();
    let warm = Arc::new(Warm::across_ports());
    let mut cfg = warm_cfg(addr, &a, "a.dat", 2, &warm);
    cfg.token = b"first-token".to_vec();
    assert!(send(&cfg).unwrap().ok);
    assert_eq!(warm.len(), 2);
    first.stop();
    let next = receiver_at(&addr.to_string(), &root, b"next-token", Some(&lobby));
    let mut cfg = warm_cfg(addr, &a, "again.dat", 2, &warm);
    cfg.token = b"next-token".to_vec();
    let s = send(&cfg).unwrap();
    assert!(s.ok, "{}", s.render());
    assert_eq!(s.streams_warm, 2, "{}", s.render());
    assert_same(&a, &root.join("again.dat"));
    assert!(wait_summaries(&next, 1)[0].outcome.is_complete());
}
