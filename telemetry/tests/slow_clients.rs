//! The endpoint against clients that trickle their request: before, about
//! 100 of them (a byte a second, reopened when cut) held every slot, and 2
//! of 20 Prometheus scrapes were answered.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use wirerate_telemetry::{Endpoints, serve_in_thread};

const SLOW: usize = 100;
const SCRAPES: usize = 20;

/// One trickling client: a byte a second of a request that never ends,
/// reopened at once whenever the endpoint cuts it.
fn trickle(addr: SocketAddr, stop: &AtomicBool, opened: &AtomicUsize) {
    while !stop.load(Ordering::SeqCst) {
        let Ok(mut c) = TcpStream::connect(addr) else {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        opened.fetch_add(1, Ordering::SeqCst);
        for b in b"GET /metrics HTTP/1.1\r\nX-Slow: "
            .iter()
            .chain(std::iter::repeat(&b'a'))
        {
            if stop.load(Ordering::SeqCst) || c.write_all(&[*b]).is_err() {
                break;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    }
}

/// One scrape, as Prometheus makes it: answered 200 within its timeout?
fn scrape(addr: SocketAddr) -> bool {
    let Ok(mut c) = TcpStream::connect(addr) else {
        return false;
    };
    c.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    if c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut reply = Vec::new();
    let _ = c.read_to_end(&mut reply);
    reply.starts_with(b"HTTP/1.1 200") && reply.ends_with(b"wirerate_up 1\n")
}

#[test]
fn trickling_clients_leave_scrapes_answered() {
    let endpoints = Endpoints::new(|| b"wirerate_up 1\n".to_vec());
    let addr = serve_in_thread("127.0.0.1:0", endpoints).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let opened = Arc::new(AtomicUsize::new(0));
    let slow: Vec<_> = (0..SLOW)
        .map(|_| {
            let (stop, opened) = (stop.clone(), opened.clone());
            std::thread::spawn(move || trickle(addr, &stop, &opened))
        })
        .collect();
    // Every slow client has connected at least once: the slots are full.
    while opened.load(Ordering::SeqCst) < SLOW {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(500));
    let answered = (0..SCRAPES)
        .filter(|_| {
            let ok = scrape(addr);
            std::thread::sleep(Duration::from_millis(100));
            ok
        })
        .count();
    stop.store(true, Ordering::SeqCst);
    for t in slow {
        t.join().unwrap();
    }
    eprintln!(
        "{answered} of {SCRAPES} scrapes answered beside {SLOW} trickling clients ({} connections)",
        opened.load(Ordering::SeqCst)
    );
    assert!(
        answered >= SCRAPES - 1,
        "{answered} of {SCRAPES} scrapes answered"
    );
}

/// Clients that ask and then never read a large answer held their slots
/// for the whole 10 s exchange: past 2 s, one is cut for a newcomer.
#[test]
fn clients_that_never_read_leave_scrapes_answered() {
    const BODY: usize = 16 << 20;
    let endpoints = Endpoints::new(|| vec![b'x'; BODY]);
    let addr = serve_in_thread("127.0.0.1:0", endpoints).unwrap();
    let held: Vec<TcpStream> = (0..80)
        .filter_map(|_| {
            let mut c = TcpStream::connect(addr).ok()?;
            c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                .ok()?;
            Some(c)
        })
        .collect();
    std::thread::sleep(Duration::from_millis(2500));
    let answered = (0..5)
        .filter(|_| {
            let Ok(mut c) = TcpStream::connect(addr) else {
                return false;
            };
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let _ = c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
            let mut reply = Vec::new();
            let _ = c.read_to_end(&mut reply);
            reply.starts_with(b"HTTP/1.1 200") && reply.len() > BODY
        })
        .count();
    drop(held);
    assert_eq!(answered, 5, "{answered} of 5 scrapes answered");
}
