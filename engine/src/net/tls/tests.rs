//! The handshake's encryption over real TCP connections: what each pair
//! of modes gets, that nothing in clear crosses an encrypted connection,
//! and what a man in the middle or a stripped offer gets.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::Duration;

use super::{Side, handshake};
use crate::encryption::{Disagreement, Encryption};
use crate::error::{AuthError, Error, Result};
use crate::net::{self, Conn, auth};
use crate::wire::{Frame, FrameReader, MAX_SMALL_FRAME, Purpose, encode, read_frame, write_frame};

const TOKEN: &[u8] = b"secret-token-123";
const WITHIN: Duration = Duration::from_secs(10);
/// What a transfer would carry, to be looked for on the wire.
const MARKER: &[u8] = b"PLAINTEXT-MARKER-0123456789";

fn tcp_pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    (c, l.accept().unwrap().0)
}

fn client(conn: &mut Conn, mode: Encryption) -> Result<Duration> {
    net::handshake(conn, WITHIN, |d| {
        auth::client(d, TOKEN, Purpose::Control, 7470, mode)
    })
}

fn server(conn: &mut Conn, mode: Encryption) -> Result<Purpose> {
    net::handshake(conn, WITHIN, |d| auth::server(d, TOKEN, mode))
}

/// A sender in `sender` mode and a receiver in `receiver` mode, joined by
/// `link` (a direct pair, or a proxy): each side's handshake, and each
/// side's connection afterwards.
fn run(
    sender: Encryption,
    receiver: Encryption,
    (c, s): (TcpStream, TcpStream),
) -> ((Result<Duration>, Conn), (Result<Purpose>, Conn)) {
    let srv = thread::spawn(move || {
        let mut conn = Conn::from(s);
        (server(&mut conn, receiver), conn)
    });
    let mut conn = Conn::from(c);
    ((client(&mut conn, sender), conn), srv.join().unwrap())
}

/// Relays bytes both ways between `a` and `b`, keeping a copy of all
/// that crossed, until both directions close.
fn tap(a: TcpStream, b: TcpStream) -> thread::JoinHandle<Vec<u8>> {
    fn pump(mut from: TcpStream, mut to: TcpStream) -> Vec<u8> {
        let (mut seen, mut buf) = (Vec::new(), [0u8; 16 << 10]);
        while let Ok(n @ 1..) = from.read(&mut buf) {
            seen.extend_from_slice(&buf[..n]);
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Write);
        seen
    }
    let (a2, b2) = (a.try_clone().unwrap(), b.try_clone().unwrap());
    let back = thread::spawn(move || pump(b2, a2));
    thread::spawn(move || {
        let mut seen = pump(a, b);
        seen.extend(back.join().unwrap());
        seen
    })
}

/// A sender-side and a receiver-side socket joined through `tap`.
fn tapped() -> ((TcpStream, TcpStream), thread::JoinHandle<Vec<u8>>) {
    let (c, near) = tcp_pair();
    let (far, s) = tcp_pair();
    ((c, s), tap(near, far))
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Sends `MARKER` as a frame each way, and checks it arrived.
fn exchange(c: &mut Conn, s: &mut Conn) {
    let message = String::from_utf8(MARKER.to_vec()).unwrap();
    let said = Frame::Error {
        retryable: false,
        message,
    };
    write_frame(c, &said).unwrap();
    assert_eq!(read_frame(s).unwrap(), said);
    write_frame(s, &said).unwrap();
    assert_eq!(read_frame(c).unwrap(), said);
}

#[test]
fn every_pair_of_modes_over_tcp() {
    use Encryption::{None as Off, Preferred, Required};
    for (sender, receiver, sealed) in [
        (Off, Off, false),
        (Off, Preferred, false),
        (Preferred, Off, false),
        (Preferred, Preferred, true),
        (Preferred, Required, true),
        (Required, Preferred, true),
        (Required, Required, true),
    ] {
        let (link, wire) = tapped();
        let ((c, mut cc), (s, mut sc)) = run(sender, receiver, link);
        c.unwrap_or_else(|e| panic!("{sender} to {receiver}: {e}"));
        assert_eq!(s.unwrap(), Purpose::Control);
        assert_eq!(cc.link().is_some(), sealed, "{sender} to {receiver}");
        assert_eq!(sc.link().is_some(), sealed, "{sender} to {receiver}");
        exchange(&mut cc, &mut sc);
        drop((cc, sc));
        let seen = wire.join().unwrap();
        assert_eq!(
            contains(&seen, MARKER),
            !sealed,
            "{sender} to {receiver}: the marker was {} on the wire",
            if sealed { "seen" } else { "not seen" }
        );
    }
}

#[test]
fn a_required_side_refuses_a_clear_peer_with_a_message() {
    let ((c, cc), (s, _)) = run(Encryption::Required, Encryption::None, tcp_pair());
    assert!(
        matches!(c, Err(Error::Encryption(Disagreement::ReceiverDeclined))),
        "{c:?}"
    );
    assert!(cc.link().is_none());
    let s = s.unwrap_err();
    assert!(
        matches!(s, Error::Encryption(Disagreement::ReceiverDeclined)),
        "{s:?}"
    );

    let ((c, _), (s, _)) = run(Encryption::None, Encryption::Required, tcp_pair());
    let c = c.unwrap_err();
    assert!(
        matches!(c, Error::Encryption(Disagreement::ReceiverRequires)),
        "{c:?}"
    );
    assert!(c.to_string().contains("--encrypt required"), "{c}");
    assert!(!c.is_retryable());
    assert!(matches!(
        s,
        Err(Error::Encryption(Disagreement::ReceiverRequires))
    ));
}

/// Relays a handshake, rewriting the sender's hello to offer no
/// encryption (its frame check recomputed, as anyone on the path can),
/// then relays bytes as they come.
fn stripping_proxy(near: TcpStream, far: TcpStream) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let (mut near_r, mut far_w) = (near.try_clone().unwrap(), far.try_clone().unwrap());
        let Ok(Frame::Hello {
            version,
            nonce,
            port,
            ..
        }) = FrameReader::default().read_capped(&mut near_r, MAX_SMALL_FRAME)
        else {
            return;
        };
        let mut out = Vec::new();
        let stripped = Frame::Hello {
            version,
            nonce,
            port,
            encrypt: Encryption::None,
        };
        encode(&stripped, &mut out);
        far_w.write_all(&out).unwrap();
        let _ = tap(near, far).join();
    })
}

#[test]
fn a_stripped_offer_is_refused_never_downgraded() {
    for (sender, receiver) in [
        (Encryption::Required, Encryption::Preferred),
        (Encryption::Preferred, Encryption::Preferred),
        (Encryption::Required, Encryption::Required),
    ] {
        let (c, near) = tcp_pair();
        let (far, s) = tcp_pair();
        let proxy = stripping_proxy(near, far);
        let ((c, cc), (s, _)) = run(sender, receiver, (c, s));
        let c = c.expect_err("a stripped offer must not authenticate");
        assert!(cc.link().is_none());
        match (sender, receiver) {
            // The receiver answers a hello without an offer in clear:
            // refused before the sender's proof.
            (Encryption::Required, Encryption::Preferred) => assert!(
                matches!(c, Error::Encryption(Disagreement::ReceiverDeclined)),
                "{c:?}"
            ),
            // In clear on both sides, but the proofs cover the offer.
            (Encryption::Preferred, _) => assert!(
                matches!(c, Error::Auth(AuthError::ReceiverTokenDiffers)),
                "{c:?}"
            ),
            // The receiver refuses the stripped hello itself.
            _ => assert!(
                matches!(c, Error::Encryption(Disagreement::OfferRemoved)),
                "{c:?}"
            ),
        }
        assert!(s.is_err(), "{sender} to {receiver}: the receiver took it");
        drop(cc);
        proxy.join().unwrap();
    }
}

/// A man in the middle that holds a TLS session with each end, its own
/// key towards the sender, and relays every frame between them.
fn tls_terminating_proxy(near: TcpStream, far: TcpStream) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let relay = |from: &TcpStream, to: &TcpStream| {
            let f = FrameReader::default().read_capped(&mut &*from, MAX_SMALL_FRAME)?;
            write_frame(&mut &*to, &f)
        };
        // The hello and the challenge, in clear.
        if relay(&near, &far)
            .and_then(|()| relay(&far, &near))
            .is_err()
        {
            return;
        }
        let (mut n, mut f) = (Conn::from(near), Conn::from(far));
        let towards_sender = net::handshake(&mut n, WITHIN, |d| d.start_tls(Side::Server));
        let towards_receiver = net::handshake(&mut f, WITHIN, |d| d.start_tls(Side::Client));
        if towards_sender.is_err() || towards_receiver.is_err() {
            return;
        }
        // The receiver's proof one way, the sender's answer the other.
        let copy = |from: &Conn, to: &Conn| -> Result<()> {
            let frame = read_frame(&mut &*from)?;
            write_frame(&mut &*to, &frame)
        };
        let _ = copy(&f, &n).and_then(|()| copy(&n, &f));
    })
}

#[test]
fn a_man_in_the_middle_with_its_own_key_is_refused() {
    let (c, near) = tcp_pair();
    let (far, s) = tcp_pair();
    let mitm = tls_terminating_proxy(near, far);
    let ((c, _), (s, _)) = run(Encryption::Required, Encryption::Required, (c, s));
    mitm.join().unwrap();
    let c = c.expect_err("the sender must refuse a relayed proof");
    assert!(
        matches!(c, Error::Auth(AuthError::ReceiverTokenDiffers)),
        "{c:?}"
    );
    assert!(
        c.to_string()
            .contains("something on the path altered the handshake"),
        "{c}"
    );
    let s = s.expect_err("the receiver must not take a relayed sender");
    assert!(
        matches!(s, Error::Auth(AuthError::SenderTokenDiffers)),
        "{s:?}"
    );
}

/// A parked connection authenticated afresh stays sealed in its TLS
/// session, whatever the next offer, with no second TLS handshake.
#[test]
fn an_encrypted_connection_authenticates_again_inside_its_session() {
    let ((c, mut cc), (s, mut sc)) = run(Encryption::Required, Encryption::Preferred, tcp_pair());
    c.unwrap();
    s.unwrap();
    let before = cc.link().cloned().unwrap();
    let srv = thread::spawn(move || (server(&mut sc, Encryption::None), sc));
    client(&mut cc, Encryption::None).unwrap();
    let (s, mut sc) = srv.join().unwrap();
    s.unwrap();
    assert!(std::sync::Arc::ptr_eq(&before, cc.link().unwrap()));
    exchange(&mut cc, &mut sc);
}

/// Far more than `rekey_after` each way, both handles of each end busy
/// at once: every byte arrives, in order, across the key updates.
#[test]
fn a_stream_carries_many_keys_worth_of_records() {
    let (c, s) = tcp_pair();
    let srv = thread::spawn(move || handshake(&mut &s, Side::Server).map(|l| (l, s)));
    let client_link = handshake(&mut &c, Side::Client).unwrap();
    let (server_link, s) = srv.join().unwrap().unwrap();
    let (client_link, server_link) = (
        std::sync::Arc::new(client_link.rekeying_after(64 << 10)),
        std::sync::Arc::new(server_link.rekeying_after(64 << 10)),
    );
    const LEN: usize = 8 << 20;
    let data: Vec<u8> = (0..LEN).map(|i| (i * 7 + i / 4093) as u8).collect();
    let mut joins = Vec::new();
    for (link, tcp) in [(client_link.clone(), c), (server_link.clone(), s)] {
        let (expected, sent) = (data.clone(), data.clone());
        let (reader, l2) = (tcp.try_clone().unwrap(), link.clone());
        joins.push(thread::spawn(move || {
            for piece in sent.chunks(1 << 20) {
                link.write_all(&tcp, &[piece]).unwrap();
            }
        }));
        joins.push(thread::spawn(move || {
            let mut got = vec![0u8; LEN];
            let mut at = 0;
            while at < LEN {
                let n = l2.read(&reader, &mut got[at..], &|| Ok(())).unwrap();
                assert!(n > 0, "closed at {at}");
                at += n;
            }
            assert!(got == expected, "the data differs after key updates");
        }));
    }
    for j in joins {
        j.join().unwrap();
    }
    // A key update at most once per piece sealed at a time.
    let updates = (LEN / super::link::SEAL_CHUNK - 1) as u64;
    assert_eq!(client_link.rekeys(), updates);
    assert_eq!(server_link.rekeys(), updates);
}

/// A clear connection authenticated afresh by a sender that requires
/// encryption (a parked one, taken by the next transfer) starts TLS then
/// and is sealed from there.
#[test]
fn a_clear_connection_is_sealed_when_the_next_handshake_asks() {
    let ((c, mut cc), (s, mut sc)) = run(Encryption::None, Encryption::Preferred, tcp_pair());
    c.unwrap();
    s.unwrap();
    assert!(cc.link().is_none());
    let srv = thread::spawn(move || (server(&mut sc, Encryption::Preferred), sc));
    client(&mut cc, Encryption::Required).unwrap();
    let (s, mut sc) = srv.join().unwrap();
    s.unwrap();
    assert!(cc.link().is_some() && sc.link().is_some());
    exchange(&mut cc, &mut sc);
}

/// A client that completes TLS and then trickles its sealed proof a
/// byte at a time, each byte inside the time left, is cut off at the
/// handshake's deadline, not kept for as long as it likes.
#[test]
fn a_sealed_handshake_trickled_a_byte_at_a_time_still_ends_at_its_deadline() {
    let (c, s) = tcp_pair();
    let within = Duration::from_millis(800);
    let srv = thread::spawn(move || {
        let mut conn = Conn::from(s);
        let t0 = std::time::Instant::now();
        let r = net::handshake(&mut conn, within, |d| {
            auth::server(d, TOKEN, Encryption::Required)
        });
        (r, t0.elapsed())
    });
    let mut raw = &c;
    write_frame(
        &mut raw,
        &Frame::Hello {
            version: crate::wire::VERSION,
            nonce: [1; crate::wire::NONCE_LEN],
            port: 7470,
            encrypt: Encryption::Required,
        },
    )
    .unwrap();
    assert!(matches!(
        read_frame(&mut raw).unwrap(),
        Frame::Challenge {
            encrypted: true,
            ..
        }
    ));
    let link = handshake(&mut raw, Side::Client).unwrap();
    // The proof, sealed into a record that goes to a spare socket, so
    // that its bytes can be trickled by hand.
    let (spare, sealed_out) = tcp_pair();
    let mut proof = Vec::new();
    encode(
        &Frame::Auth {
            mac: [3; crate::wire::MAC_LEN],
            purpose: Purpose::Control,
        },
        &mut proof,
    );
    link.write_all(&spare, &[&proof]).unwrap();
    drop(spare);
    let mut record = Vec::new();
    (&sealed_out).read_to_end(&mut record).unwrap();
    let trickle = thread::spawn(move || {
        for b in record {
            if (&c).write_all(&[b]).is_err() {
                return;
            }
            thread::sleep(Duration::from_millis(150));
        }
    });
    let (r, took) = srv.join().unwrap();
    let e = r.expect_err("a trickled proof authenticated");
    assert!(e.to_string().contains("did not finish within"), "{e}");
    assert!(
        took < Duration::from_secs(3),
        "the handshake took {took:?}, its deadline {within:?}"
    );
    trickle.join().unwrap();
}

/// Bytes from a small generator, for garbage a peer sends.
fn garbage(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A receiver that requires encryption, and a peer that has not
/// authenticated: garbage where its TLS handshake should be, or garbage
/// in place of sealed records once the TLS session is up. Each is refused
/// within the deadline, with no panic, and the receiver's thread ends.
#[test]
fn garbage_before_or_after_tls_is_refused_within_the_deadline() {
    let within = Duration::from_secs(2);
    for seed in 0..24u64 {
        let after_tls = seed % 2 == 1;
        let (c, s) = tcp_pair();
        let srv = thread::spawn(move || {
            let mut conn = Conn::from(s);
            let t0 = std::time::Instant::now();
            let r = net::handshake(&mut conn, within, |d| {
                auth::server(d, TOKEN, Encryption::Required)
            });
            (r, t0.elapsed())
        });
        let mut raw = &c;
        write_frame(
            &mut raw,
            &Frame::Hello {
                version: crate::wire::VERSION,
                nonce: [1; crate::wire::NONCE_LEN],
                port: 7470,
                encrypt: Encryption::Required,
            },
        )
        .unwrap();
        read_frame(&mut raw).unwrap();
        if after_tls {
            handshake(&mut raw, Side::Client).unwrap();
        }
        let junk = garbage(seed, 1 + (seed as usize * 997) % 40_000);
        let _ = raw.write_all(&junk);
        let (r, took) = srv.join().unwrap();
        assert!(r.is_err(), "seed {seed}: garbage authenticated");
        assert!(
            took < within + Duration::from_secs(1),
            "seed {seed}: {took:?}"
        );
    }
}

/// TLS 1.3 records sealed by hand with a session's extracted keys: what
/// a hostile peer can send that rustls itself never would.
struct HandSealed {
    key: ring::aead::LessSafeKey,
    iv: [u8; 12],
    seq: u64,
}

impl HandSealed {
    /// Completes a TLS handshake as the client over `tcp` and takes the
    /// keys it would send with.
    fn client(tcp: &TcpStream) -> Self {
        use rustls::ConnectionTrafficSecrets as S;
        let provider = super::provider();
        let verifier = std::sync::Arc::new(super::BoundByToken(
            provider.signature_verification_algorithms,
        ));
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth();
        config.enable_secret_extraction = true;
        let name = rustls::pki_types::ServerName::try_from("wirerate").unwrap();
        let mut conn = rustls::ClientConnection::new(std::sync::Arc::new(config), name).unwrap();
        let mut io = tcp;
        while conn.is_handshaking() {
            conn.complete_io(&mut io).unwrap();
        }
        while conn.wants_write() {
            conn.write_tls(&mut io).unwrap();
        }
        let (seq, secrets) = conn.dangerous_extract_secrets().unwrap().tx;
        let (alg, key, iv) = match secrets {
            S::Aes128Gcm { key, iv } => (&ring::aead::AES_128_GCM, key, iv),
            S::Aes256Gcm { key, iv } => (&ring::aead::AES_256_GCM, key, iv),
            S::Chacha20Poly1305 { key, iv } => (&ring::aead::CHACHA20_POLY1305, key, iv),
            _ => panic!("a cipher suite this test cannot seal for"),
        };
        Self {
            key: ring::aead::LessSafeKey::new(
                ring::aead::UnboundKey::new(alg, key.as_ref()).unwrap(),
            ),
            iv: iv.as_ref().try_into().unwrap(),
            seq,
        }
    }

    /// One record of content type `kind` holding `fragment`.
    fn record(&mut self, kind: u8, fragment: &[u8]) -> Vec<u8> {
        let mut body = [fragment, &[kind]].concat();
        let len = (body.len() + 16) as u16;
        let header = [0x17, 0x03, 0x03, (len >> 8) as u8, len as u8];
        let mut nonce = self.iv;
        for (n, s) in nonce[4..].iter_mut().zip(self.seq.to_be_bytes()) {
            *n ^= s;
        }
        self.seq += 1;
        self.key
            .seal_in_place_append_tag(
                ring::aead::Nonce::assume_unique_for_key(nonce),
                ring::aead::Aad::from(header),
                &mut body,
            )
            .unwrap();
        [&header[..], &body].concat()
    }
}

/// A peer that has not authenticated opens TLS, then sends one handshake
/// message fragmented a byte per record until rustls's 64 KiB for such a
/// message is full: rustls refuses more bytes, and the reader must fail
/// on it, not spin forever without reading the socket again.
#[test]
fn a_handshake_message_fragmented_past_its_bound_fails_the_read() {
    let (c, s) = tcp_pair();
    let (done, result) = std::sync::mpsc::channel();
    thread::spawn(move || {
        let link = handshake(&mut &s, Side::Server).unwrap();
        let r = link.read(&s, &mut [0u8; 64], &|| Ok(()));
        let _ = done.send(r.map_err(|e| e.to_string()));
    });
    let mut sealer = HandSealed::client(&c);
    // A KeyUpdate that claims 65,520 bytes, then a byte at a time.
    let mut wire = sealer.record(0x16, &[24, 0x00, 0xff, 0xf0, 0]);
    for _ in 0..4000 {
        wire.extend(sealer.record(0x16, &[0]));
    }
    let _ = (&c).write_all(&wire);
    let r = result
        .recv_timeout(Duration::from_secs(20))
        .expect("the reader neither failed nor returned: it spins");
    let e = r.expect_err("a read of a message that never ends returned data");
    assert!(e.starts_with("TLS: "), "{e}");
}
