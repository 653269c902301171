//! The session handshake: each side proves it holds the per-transfer token
//! with HMAC-SHA256 over fresh nonces from both sides; the token itself
//! never crosses the wire.
//!
//! One round trip: the client sends its nonce; the receiver answers with
//! its nonce and its proof; the client checks that proof, sends its own and
//! goes straight on with its first request, which the receiver reads only
//! after the client's proof verified. The two proofs carry different labels,
//! so neither side's proof can be reflected back as the other's. On a
//! 150 ms path the second round trip the old handshake spent waiting for
//! the receiver's verdict cost every connection 150 ms.
//!
//! Encryption is agreed on the way (`encryption`): the hello carries the
//! client's mode and the challenge the receiver's answer; when it is yes,
//! a TLS 1.3 handshake follows the challenge and the proofs travel
//! sealed. Both proofs cover the mode and the answer, and the TLS
//! session's exporter (its channel binding): stripping the offer, or
//! sitting in the middle with a TLS session to each end, makes them fail.
//! An encrypted handshake takes two more round trips (the TLS handshake,
//! and the receiver's proof after the client's Finished).
#![forbid(unsafe_code)]

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::tls::{BINDING_LEN, Side};
use crate::encryption::{self, Disagreement, Encryption};
use crate::error::{AuthError, Error, Result};
use crate::session::describe;
use crate::violation::{Violation, ViolationKind};
use crate::wire::{
    CHECKED_SINCE, DecodeError, Frame, FrameReader, MAC_LEN, MAX_PREAUTH_FRAME, MAX_SMALL_FRAME,
    NONCE_LEN, Purpose, VERSION, decode_body, decode_unchecked, encode, encode_for,
    read_frame_capped, write_frame,
};

/// How `Error::Auth` introduces itself; a peer's message that already
/// starts with it is not prefixed twice.
const AUTH_FAILED: &str = "authentication failed: ";

type HmacSha256 = Hmac<Sha256>;

/// The receiver's first reply: a challenge, or a refusal. A receiver
/// before `CHECKED_SINCE` writes its refusal without a checksum (before
/// version 7 it took this hello's port for garbage): that is told as the
/// version mismatch it is, not as a damaged frame.
fn read_reply<S: Read>(s: &mut S) -> Result<Frame> {
    let mut reader = FrameReader::default();
    let body = match reader.read_body(s, MAX_SMALL_FRAME) {
        Err(Error::Protocol(too_large)) => return Err(foreign(&too_large)),
        other => other?,
    };
    match decode_body(body) {
        Ok(frame) => Ok(frame),
        Err(damaged @ DecodeError::Damaged(_)) => match decode_unchecked(body) {
            // Only an older receiver's own words: a damaged length prefix
            // can make a checked refusal ("busy") decode without its check
            // too, and that must stay a damaged frame, retried.
            Ok(Frame::Error { message, .. })
                if OLD_REFUSALS.iter().any(|r| message.starts_with(r)) =>
            {
                Err(Violation::new(
                    ViolationKind::Version,
                    format!(
                        "the receiver refused this sender's hello ({message}): it speaks a \
                         protocol version older than {CHECKED_SINCE}, this sender {VERSION}; \
                         upgrade one side"
                    ),
                )
                .into())
            }
            _ => Err(damaged.into()),
        },
        // Whatever answers is not a wirerate receiver (an SSH banner, an
        // HTTP server): trying again would not make it one.
        Err(e) => Err(foreign(&e)),
    }
}

/// How receivers before `CHECKED_SINCE` refused a hello they could not
/// take: a version they did not speak, or (before version 7) the port
/// this hello carries, as bytes too many.
const OLD_REFUSALS: [&str; 2] = [
    "unsupported protocol version",
    "peer sent an invalid frame: ",
];

/// The error for a first reply that is no wirerate frame at all: final.
fn foreign(e: &DecodeError) -> Error {
    Violation::new(
        ViolationKind::Version,
        format!(
            "whatever listens there does not speak wirerate ({e}): check the receiver's \
             address and port"
        ),
    )
    .into()
}

/// What a sender tells a receiver whose proof did not verify.
const SENDER_REFUSAL: &str = "the receiver's proof does not match this sender's token";

const CLIENT_LABEL: &[u8] = b"wirerate/1 client";
const SERVER_LABEL: &[u8] = b"wirerate/1 server";

/// What both proofs cover besides the nonces: the client's mode, the
/// receiver's answer, and the TLS session's channel binding (zeros in
/// clear).
#[derive(Clone, Copy)]
struct Agreed {
    offer: Encryption,
    encrypted: bool,
    binding: [u8; BINDING_LEN],
}

impl Agreed {
    fn over(s: &impl Seal, offer: Encryption, encrypted: bool) -> Self {
        Self {
            offer,
            encrypted,
            binding: s.binding().unwrap_or([0; BINDING_LEN]),
        }
    }
}

fn mac(token: &[u8], label: &[u8], a: &[u8], b: &[u8], agreed: &Agreed) -> HmacSha256 {
    let mut m = HmacSha256::new_from_slice(token).expect("HMAC takes keys of any length");
    m.update(label);
    m.update(a);
    m.update(b);
    m.update(&[encryption::code(agreed.offer), u8::from(agreed.encrypted)]);
    m.update(&agreed.binding);
    m
}

/// A connection a handshake can seal with TLS on the way.
pub trait Seal: Read + Write {
    /// Whether `start_tls` can work here at all.
    fn can_seal(&self) -> bool {
        true
    }
    /// Runs the TLS handshake as `side`; reads and writes are sealed after.
    fn start_tls(&mut self, side: Side) -> Result<()>;
    /// Whether reads and writes are sealed.
    fn encrypted(&self) -> bool;
    /// The TLS session's channel binding, when sealed.
    fn binding(&self) -> Option<[u8; BINDING_LEN]>;
}

impl Seal for super::Deadline<'_> {
    fn start_tls(&mut self, side: Side) -> Result<()> {
        super::Deadline::start_tls(self, side)
    }

    fn encrypted(&self) -> bool {
        super::Deadline::encrypted(self)
    }

    fn binding(&self) -> Option<[u8; BINDING_LEN]> {
        super::Deadline::binding(self)
    }
}

/// A bare socket: a connection in clear, which cannot be sealed (tools
/// and tests that speak the handshake by hand).
impl Seal for std::net::TcpStream {
    fn can_seal(&self) -> bool {
        false
    }

    fn start_tls(&mut self, _: Side) -> Result<()> {
        Err(Error::Config(
            "this connection cannot be encrypted: it is a bare socket".into(),
        ))
    }

    fn encrypted(&self) -> bool {
        false
    }

    fn binding(&self) -> Option<[u8; BINDING_LEN]> {
        None
    }
}

/// The mode a handshake over `s` runs under: `mode`, but `None` for a
/// `Preferred` end that cannot seal; a `Required` one that cannot is
/// refused before a frame is sent.
fn possible<S: Seal>(s: &S, mode: Encryption) -> Result<Encryption> {
    match (s.can_seal() || s.encrypted(), mode) {
        (true, m) | (false, m @ Encryption::None) => Ok(m),
        (false, Encryption::Preferred) => Ok(Encryption::None),
        (false, Encryption::Required) => Err(Error::Config(
            "encryption is required and this connection cannot be encrypted".into(),
        )),
    }
}

/// How a receiver refuses a hello over encryption; its sender reads the
/// disagreement back from these words.
const ENCRYPTION_REFUSED: &str = "encryption refused: ";

/// How a sender that requires encryption tells a receiver that answered
/// in clear why it leaves: short, since a receiver takes no longer frame
/// before the sender's proof (`MAX_PREAUTH_FRAME`).
const SENDER_REQUIRES: &str = "encryption refused: the sender requires it";

/// Fresh random bytes for a nonce or session id.
pub fn random<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).expect("the kernel's random source is available");
    b
}

fn peer_error(frame: Frame, expected: &str) -> Error {
    match frame {
        Frame::Error { message, retryable } => {
            if message.strip_prefix(ENCRYPTION_REFUSED)
                == Some(&Disagreement::ReceiverRequires.to_string())
            {
                Error::Encryption(Disagreement::ReceiverRequires)
            } else if let Some(reason) = message.strip_prefix(AUTH_FAILED) {
                AuthError::RefusedByReceiver(reason.to_owned()).into()
            } else {
                Error::Remote { message, retryable }
            }
        }
        other => Violation::unexpected(expected, describe(&other)).into(),
    }
}

/// Client side, for the receiver the client dialled at `port`, under
/// encryption `mode`; returns the round-trip time the handshake measured.
/// It does not wait for the receiver to accept its proof: a receiver that
/// refuses says so in its reply to the client's next frame.
pub fn client<S: Seal>(
    s: &mut S,
    token: &[u8],
    purpose: Purpose,
    port: u16,
    mode: Encryption,
) -> Result<Duration> {
    let mode = possible(s, mode)?;
    let nonce_c = random::<NONCE_LEN>();
    let t0 = Instant::now();
    write_frame(
        s,
        &Frame::Hello {
            version: VERSION,
            nonce: nonce_c,
            port,
            encrypt: mode,
        },
    )?;
    let (nonce_s, encrypted) = match read_reply(s)? {
        Frame::Challenge {
            version,
            nonce,
            encrypted,
        } if version == VERSION => (nonce, encrypted),
        Frame::Challenge { version, .. } => {
            return Err(Violation::new(
                ViolationKind::Version,
                format!(
                    "receiver speaks protocol version {version}, this sender {VERSION}; upgrade one side"
                ),
            )
            .into());
        }
        other => {
            return Err(match peer_error(other, "a challenge") {
                // Refused for offering none, though it offered: the offer
                // was removed on the way.
                Error::Encryption(Disagreement::ReceiverRequires) if mode != Encryption::None => {
                    Disagreement::OfferRemoved.into()
                }
                e => e,
            });
        }
    };
    // Before a byte more: a client that requires encryption sends nothing
    // in clear, and tells the receiver why it leaves.
    if let Err(no) = encryption::accept(mode, encrypted) {
        let _ = write_frame(
            s,
            &Frame::Error {
                retryable: false,
                message: SENDER_REQUIRES.to_owned(),
            },
        );
        return Err(no.into());
    }
    if encrypted && !s.encrypted() {
        s.start_tls(Side::Client)?;
    }
    let agreed = Agreed::over(s, mode, encrypted);
    let theirs = match read_frame_capped(s, MAX_SMALL_FRAME)? {
        Frame::ServerProof { mac } => mac,
        other => return Err(peer_error(other, "the receiver's proof")),
    };
    let rtt = t0.elapsed();
    // Our proof goes only to a receiver that proved the token: a MAC over
    // a nonce the listener chose would let whoever sits at that address
    // (an impostor, or a listener of another token) guess a weak token
    // offline. The receiver is told instead, so it records the mismatch.
    if mac(token, SERVER_LABEL, &nonce_c, &nonce_s, &agreed)
        .verify_slice(&theirs)
        .is_err()
    {
        let _ = write_frame(
            s,
            &Frame::Error {
                retryable: false,
                message: format!("{AUTH_FAILED}{SENDER_REFUSAL}"),
            },
        );
        return Err(AuthError::ReceiverTokenDiffers.into());
    }
    let tag: [u8; MAC_LEN] = mac(token, CLIENT_LABEL, &nonce_s, &nonce_c, &agreed)
        .finalize()
        .into_bytes()
        .into();
    write_frame(s, &Frame::Auth { mac: tag, purpose })?;
    Ok(rtt)
}

/// A client's first frame, read: what the rest of the handshake needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    nonce: [u8; NONCE_LEN],
    /// The port the client dialled for the receiver it means.
    pub port: u16,
    /// The client's encryption mode.
    pub encrypt: Encryption,
}

/// Server side; returns what the client wants the connection for. On a bad
/// token it tells the client and fails. It allocates nothing for frames
/// over `MAX_PREAUTH_FRAME`; the caller bounds its time (`net::within`).
pub fn server<S: Seal>(s: &mut S, token: &[u8], mode: Encryption) -> Result<Purpose> {
    let hello = read_hello(s)?;
    answer(s, &hello, token, mode)
}

/// The server's first step: the client's hello, of this version. An
/// older or newer one is told which version this side speaks.
pub fn read_hello<S: Read + Write>(s: &mut S) -> Result<Hello> {
    match read_frame_capped(s, MAX_PREAUTH_FRAME)? {
        Frame::Hello {
            version,
            nonce,
            port,
            encrypt,
        } if version == VERSION => Ok(Hello {
            nonce,
            port,
            encrypt,
        }),
        Frame::Hello { version, .. } => {
            let msg =
                format!("unsupported protocol version {version}; this receiver speaks {VERSION}");
            // In the framing of the sender's version, so that it reads
            // these words rather than a frame it cannot decode.
            let mut out = Vec::with_capacity(128);
            encode_for(
                version,
                &Frame::Error {
                    retryable: false,
                    message: msg.clone(),
                },
                &mut out,
            );
            let _ = s.write_all(&out);
            Err(Violation::new(ViolationKind::Version, msg).into())
        }
        other => Err(Violation::unexpected("a hello", describe(&other)).into()),
    }
}

/// The rest of the server's side, after `hello`, with `token`, under
/// encryption `mode`.
pub fn answer<S: Seal>(
    s: &mut S,
    hello: &Hello,
    token: &[u8],
    mode: Encryption,
) -> Result<Purpose> {
    let mode = possible(s, mode)?;
    let nonce_c = hello.nonce;
    let nonce_s = random::<NONCE_LEN>();
    let encrypted = match encryption::decide(hello.encrypt, mode, s.encrypted()) {
        Ok(yes) => yes,
        Err(no) => {
            let _ = write_frame(
                s,
                &Frame::Error {
                    retryable: false,
                    message: format!("{ENCRYPTION_REFUSED}{no}"),
                },
            );
            return Err(no.into());
        }
    };
    let challenge = Frame::Challenge {
        version: VERSION,
        nonce: nonce_s,
        encrypted,
    };
    let fresh_tls = encrypted && !s.encrypted();
    let mut out = Vec::with_capacity(2 * (NONCE_LEN + 16));
    encode(&challenge, &mut out);
    if fresh_tls {
        s.write_all(&out)
            .map_err(|e| Error::net("answering a handshake", e))?;
        out.clear();
        s.start_tls(Side::Server)?;
    }
    let agreed = Agreed::over(s, hello.encrypt, encrypted);
    let ours: [u8; MAC_LEN] = mac(token, SERVER_LABEL, &nonce_c, &nonce_s, &agreed)
        .finalize()
        .into_bytes()
        .into();
    // In clear, one write: the challenge and the proof travel in one
    // segment.
    encode(&Frame::ServerProof { mac: ours }, &mut out);
    s.write_all(&out)
        .map_err(|e| Error::net("answering a handshake", e))?;
    let (tag, purpose) = match read_frame_capped(s, MAX_PREAUTH_FRAME)? {
        Frame::Auth { mac, purpose } => (mac, purpose),
        // Only what this version's senders say; any other error frame is
        // a violation like any other frame out of place.
        Frame::Error { message, .. }
            if message.strip_prefix(AUTH_FAILED) == Some(SENDER_REFUSAL) =>
        {
            return Err(AuthError::SenderTokenDiffers.into());
        }
        Frame::Error { message, .. } if message == SENDER_REQUIRES => {
            return Err(Disagreement::ReceiverDeclined.into());
        }
        other => {
            return Err(Violation::unexpected("authentication", describe(&other)).into());
        }
    };
    if mac(token, CLIENT_LABEL, &nonce_s, &nonce_c, &agreed)
        .verify_slice(&tag)
        .is_err()
    {
        let _ = write_frame(
            s,
            &Frame::Error {
                retryable: false,
                message: format!("{AUTH_FAILED}the token does not match the receiver's"),
            },
        );
        return Err(AuthError::PeerTokenWrong.into());
    }
    Ok(purpose)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    /// One end of a socket pair that cannot start TLS: the handshake in
    /// clear, as every mode but a TLS one runs it.
    struct Plain(UnixStream);

    impl Read for Plain {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.0.read(buf)
        }
    }

    impl Write for Plain {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.write(buf)
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Seal for Plain {
        fn can_seal(&self) -> bool {
            false
        }

        fn start_tls(&mut self, _: Side) -> Result<()> {
            Err(Error::Internal("a plain test pair cannot start TLS".into()))
        }

        fn encrypted(&self) -> bool {
            false
        }

        fn binding(&self) -> Option<[u8; BINDING_LEN]> {
            None
        }
    }

    fn pair() -> (Plain, Plain) {
        let (a, b) = UnixStream::pair().unwrap();
        (Plain(a), Plain(b))
    }

    fn run(
        client_token: &'static [u8],
        server_token: &'static [u8],
    ) -> (Result<Duration>, Result<Purpose>) {
        let (mut a, mut b) = pair();
        let srv = std::thread::spawn(move || server(&mut b, server_token, Encryption::None));
        let c = client(
            &mut a,
            client_token,
            Purpose::Control,
            7470,
            Encryption::None,
        );
        (c, srv.join().unwrap())
    }

    #[test]
    fn matching_tokens_authenticate_both_ways() {
        let (c, s) = run(b"secret-token-123", b"secret-token-123");
        assert!(c.is_ok());
        assert_eq!(s.unwrap(), Purpose::Control);
    }

    #[test]
    fn wrong_token_is_refused_with_a_clear_message() {
        let (c, s) = run(b"wrong", b"secret-token-123");
        assert!(matches!(s, Err(Error::Auth(AuthError::SenderTokenDiffers))));
        let c = c.unwrap_err();
        assert!(
            matches!(c, Error::Auth(AuthError::ReceiverTokenDiffers)),
            "{c:?}"
        );
        let msg = c.to_string();
        assert_eq!(
            msg.matches("authentication failed").count(),
            1,
            "said once: {msg}"
        );
    }

    /// A receiver of version 6 refuses a hello with a port as bytes too
    /// many, in a frame without a checksum (as every receiver before
    /// version 8 writes them); the sender says which versions are at odds
    /// rather than that the frame came damaged.
    #[test]
    fn an_older_receivers_refusal_of_the_hello_names_the_versions() {
        let (mut a, mut b) = pair();
        let old = std::thread::spawn(move || {
            let _ = read_frame_capped(&mut b, MAX_PREAUTH_FRAME);
            let mut out = Vec::new();
            encode_for(
                6,
                &Frame::Error {
                    retryable: false,
                    message: "peer sent an invalid frame: 10 unexpected bytes after the frame's fields; closing the connection".into(),
                },
                &mut out,
            );
            b.write_all(&out).unwrap();
        });
        let e = client(
            &mut a,
            b"secret-token-123",
            Purpose::Control,
            7470,
            Encryption::None,
        )
        .unwrap_err();
        old.join().unwrap();
        assert!(
            matches!(&e, Error::Violation(v) if v.kind == ViolationKind::Version),
            "{e:?}"
        );
        assert!(e.to_string().contains("older than 8"), "{e}");
        assert!(!e.is_retryable(), "a version mismatch is final: {e}");
    }

    /// Whatever answers on a wrong port (an SSH banner here) is no
    /// wirerate receiver: said so at once, not retried for --retry-for.
    #[test]
    fn a_peer_that_is_no_wirerate_receiver_is_final() {
        let (mut a, mut b) = pair();
        let ssh = std::thread::spawn(move || {
            let _ = read_frame_capped(&mut b, MAX_PREAUTH_FRAME);
            b.write_all(b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n").unwrap();
        });
        let e = client(
            &mut a,
            b"secret-token-123",
            Purpose::Control,
            22,
            Encryption::None,
        )
        .unwrap_err();
        ssh.join().unwrap();
        assert!(!e.is_retryable(), "{e}");
        assert!(e.to_string().contains("does not speak wirerate"), "{e}");
    }

    /// A receiver's "busy" whose length prefix lost 8 on the way decodes
    /// without its check, as an older receiver's refusal would: it is a
    /// damaged frame, retried, not a version to upgrade.
    #[test]
    fn a_damaged_refusal_is_not_taken_for_an_older_receiver() {
        let (mut a, mut b) = pair();
        let busy = std::thread::spawn(move || {
            let _ = read_frame_capped(&mut b, MAX_PREAUTH_FRAME);
            let mut out = Vec::new();
            encode(
                &Frame::Error {
                    retryable: true,
                    message: "receiver busy: too many connections".into(),
                },
                &mut out,
            );
            let len = u32::from_le_bytes(out[..4].try_into().unwrap()) - 8;
            out[..4].copy_from_slice(&len.to_le_bytes());
            b.write_all(&out).unwrap();
        });
        let e = client(
            &mut a,
            b"secret-token-123",
            Purpose::Control,
            7470,
            Encryption::None,
        )
        .unwrap_err();
        busy.join().unwrap();
        assert!(e.is_retryable(), "{e}");
        assert!(
            matches!(e, Error::Protocol(DecodeError::Damaged(_))),
            "{e:?}"
        );
    }

    /// A receiver of version 7 answers this hello with its own challenge,
    /// without a checksum; and an older sender's hello here is refused in
    /// words its own decoder reads.
    #[test]
    fn versions_before_frame_checksums_are_told_apart_both_ways() {
        let (mut a, mut b) = pair();
        let old = std::thread::spawn(move || {
            let _ = read_frame_capped(&mut b, MAX_PREAUTH_FRAME);
            let mut out = Vec::new();
            encode_for(
                7,
                &Frame::Challenge {
                    version: 7,
                    nonce: [1; NONCE_LEN],
                    encrypted: false,
                },
                &mut out,
            );
            b.write_all(&out).unwrap();
        });
        let e = client(
            &mut a,
            b"secret-token-123",
            Purpose::Control,
            7470,
            Encryption::None,
        )
        .unwrap_err();
        old.join().unwrap();
        assert!(
            e.to_string().contains("receiver speaks protocol version 7"),
            "{e}"
        );

        let (mut a, mut b) = pair();
        let mut out = Vec::new();
        encode_for(
            7,
            &Frame::Hello {
                version: 7,
                nonce: [2; NONCE_LEN],
                port: 7470,
                encrypt: Encryption::None,
            },
            &mut out,
        );
        a.write_all(&out).unwrap();
        let e = read_hello(&mut b).unwrap_err();
        assert!(
            e.to_string().contains("unsupported protocol version 7"),
            "{e}"
        );
        let mut len = [0u8; 4];
        a.read_exact(&mut len).unwrap();
        let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
        a.read_exact(&mut body).unwrap();
        // The old sender's decoder: no checksum expected.
        assert!(matches!(
            decode_unchecked(&body),
            Ok(Frame::Error { message, .. }) if message.contains(&format!("this receiver speaks {VERSION}"))
        ));
    }

    /// A listener that cannot prove the token (an impostor at the
    /// receiver's address, or one holding another token) gets no MAC of
    /// the sender's over nonces it chose: that would let it guess a weak
    /// token offline. It is told why instead, and records the mismatch.
    #[test]
    fn a_receiver_whose_proof_fails_gets_no_proof_back() {
        let (mut a, mut b) = pair();
        let impostor = std::thread::spawn(move || {
            let hello = read_hello(&mut b).unwrap();
            let mut out = Vec::new();
            encode(
                &Frame::Challenge {
                    version: VERSION,
                    nonce: [7; NONCE_LEN],
                    encrypted: false,
                },
                &mut out,
            );
            let guess: [u8; MAC_LEN] = mac(
                b"guess",
                SERVER_LABEL,
                &hello.nonce,
                &[7; NONCE_LEN],
                &Agreed::over(&b, Encryption::None, false),
            )
            .finalize()
            .into_bytes()
            .into();
            encode(&Frame::ServerProof { mac: guess }, &mut out);
            b.write_all(&out).unwrap();
            read_frame_capped(&mut b, MAX_PREAUTH_FRAME).unwrap()
        });
        let e = client(
            &mut a,
            b"secret-token-123",
            Purpose::Control,
            7470,
            Encryption::None,
        )
        .unwrap_err();
        assert!(
            matches!(e, Error::Auth(AuthError::ReceiverTokenDiffers)),
            "{e:?}"
        );
        match impostor.join().unwrap() {
            Frame::Error { message, retryable } => {
                assert!(!retryable);
                assert_eq!(message, format!("{AUTH_FAILED}{SENDER_REFUSAL}"));
            }
            other => panic!("the sender answered a failed proof with {other:?}"),
        }
    }

    /// A client that sends a proof without the token (not this version's
    /// sender, which stops at the receiver's proof) is refused and told.
    #[test]
    fn a_wrong_proof_is_refused_and_the_client_told() {
        let (mut a, mut b) = pair();
        let srv = std::thread::spawn(move || server(&mut b, b"secret-token-123", Encryption::None));
        write_frame(
            &mut a,
            &Frame::Hello {
                version: VERSION,
                nonce: [1; NONCE_LEN],
                port: 7470,
                encrypt: Encryption::None,
            },
        )
        .unwrap();
        assert!(matches!(
            read_frame_capped(&mut a, MAX_SMALL_FRAME).unwrap(),
            Frame::Challenge { .. }
        ));
        assert!(matches!(
            read_frame_capped(&mut a, MAX_SMALL_FRAME).unwrap(),
            Frame::ServerProof { .. }
        ));
        write_frame(
            &mut a,
            &Frame::Auth {
                mac: [9; MAC_LEN],
                purpose: Purpose::Control,
            },
        )
        .unwrap();
        let told = read_frame_capped(&mut a, MAX_SMALL_FRAME).unwrap();
        assert!(
            matches!(&told, Frame::Error { message, .. } if message.starts_with(AUTH_FAILED)),
            "{told:?}"
        );
        let e = srv.join().unwrap().unwrap_err();
        assert!(matches!(e, Error::Auth(AuthError::PeerTokenWrong)), "{e:?}");
    }

    #[test]
    fn the_receivers_refusal_is_said_once() {
        let e = peer_error(
            Frame::Error {
                retryable: false,
                message: format!("{AUTH_FAILED}the token does not match the receiver's"),
            },
            "a challenge",
        );
        assert!(
            matches!(e, Error::Auth(AuthError::RefusedByReceiver(_))),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "authentication failed: the token does not match the receiver's"
        );
    }

    #[test]
    fn an_unauthenticated_peer_cannot_announce_a_large_frame() {
        let (mut a, mut b) = pair();
        let srv = std::thread::spawn(move || server(&mut b, b"secret-token-123", Encryption::None));
        // 4 MiB announced: refused from the length prefix alone.
        a.write_all(&(4u32 << 20).to_le_bytes()).unwrap();
        let e = srv.join().unwrap().unwrap_err();
        assert!(
            matches!(e, Error::Protocol(DecodeError::TooLarge { max, .. }) if max == MAX_PREAUTH_FRAME),
            "{e:?}"
        );
    }
}
