//! TLS 1.3 on a connection: the handshake (rustls, ring), the channel
//! binding the HMAC proofs are made over, and the sealed link the
//! connection reads and writes through afterwards (`link`).
//!
//! Both ends make a key pair per process, self-signed and checked by
//! nobody: what authenticates a connection is the per-transfer token,
//! whose HMAC proofs (`net::auth`) cover this connection's TLS exporter.
//! A man in the middle holds a TLS session with each end, each with its
//! own exporter, so the proofs it relays fail on both sides, whatever key
//! or certificate it shows; so there is no CA to run and nothing to pin
//! or rotate beyond the token itself.

mod link;

pub use link::{Link, REKEY_AFTER};

use std::io::{Read, Write};
use std::sync::{Arc, OnceLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms, ring};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    ClientConfig, ClientConnection, DigitallySignedStruct, ServerConfig, SignatureScheme,
};

use crate::error::{Error, Result};

/// The exporter label of the channel binding (RFC 8446 section 7.5).
const BINDING_LABEL: &[u8] = b"EXPORTER-wirerate-channel-binding";
/// Length of the channel binding.
pub const BINDING_LEN: usize = 32;

fn provider() -> Arc<CryptoProvider> {
    Arc::new(ring::default_provider())
}

/// This process's key pair and self-signed certificate, made once.
fn identity() -> Result<&'static (CertificateDer<'static>, Vec<u8>)> {
    static ID: OnceLock<std::result::Result<(CertificateDer<'static>, Vec<u8>), String>> =
        OnceLock::new();
    ID.get_or_init(|| {
        let made = rcgen::generate_simple_self_signed(vec!["wirerate".to_owned()])
            .map_err(|e| e.to_string())?;
        Ok((made.cert.der().clone(), made.signing_key.serialize_der()))
    })
    .as_ref()
    .map_err(|e| Error::Config(format!("making this process's TLS key: {e}")))
}

fn server_config() -> Result<Arc<ServerConfig>> {
    static CONFIG: OnceLock<Arc<ServerConfig>> = OnceLock::new();
    if let Some(c) = CONFIG.get() {
        return Ok(c.clone());
    }
    let (cert, key) = identity()?;
    let key = PrivateKeyDer::try_from(key.clone())
        .map_err(|e| Error::Config(format!("this process's TLS key: {e}")))?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .and_then(|b| {
            b.with_no_client_auth()
                .with_single_cert(vec![cert.clone()], key)
        })
        .map_err(|e| Error::Config(format!("setting up TLS: {e}")))?;
    // No tickets: a connection is resumed by parking it, never by a
    // ticket, and a ticket arriving later would wake a parked reader.
    config.send_tls13_tickets = 0;
    Ok(CONFIG.get_or_init(|| Arc::new(config)).clone())
}

fn client_config() -> Result<Arc<ClientConfig>> {
    static CONFIG: OnceLock<Arc<ClientConfig>> = OnceLock::new();
    if let Some(c) = CONFIG.get() {
        return Ok(c.clone());
    }
    let provider = provider();
    let verifier = Arc::new(BoundByToken(provider.signature_verification_algorithms));
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| Error::Config(format!("setting up TLS: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    config.resumption = rustls::client::Resumption::disabled();
    config.enable_sni = false;
    Ok(CONFIG.get_or_init(|| Arc::new(config)).clone())
}

/// Takes the receiver's certificate as it is, checking only that it
/// signed the handshake: the token's proofs over the channel binding
/// authenticate the receiver, not a certificate (see the module's words).
#[derive(Debug)]
struct BoundByToken(WebPkiSupportedAlgorithms);

impl ServerCertVerifier for BoundByToken {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        // TLS 1.3 only: a 1.2 handshake never gets this far.
        Err(rustls::Error::PeerIncompatible(
            rustls::PeerIncompatible::Tls12NotOffered,
        ))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

/// Which side of the TLS handshake this end takes: the side that dialled
/// is the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Client,
    Server,
}

/// Runs the TLS handshake over `io` (a connection under its handshake
/// deadline) and returns the sealed link.
pub fn handshake(io: &mut (impl Read + Write), side: Side) -> Result<Link> {
    let mut conn: rustls::Connection = match side {
        Side::Client => {
            let name = ServerName::try_from("wirerate").expect("a valid DNS name");
            ClientConnection::new(client_config()?, name)
                .map_err(|e| Error::Config(format!("starting TLS: {e}")))?
                .into()
        }
        Side::Server => rustls::ServerConnection::new(server_config()?)
            .map_err(|e| Error::Config(format!("starting TLS: {e}")))?
            .into(),
    };
    while conn.is_handshaking() {
        conn.complete_io(io)
            .map_err(|e| Error::net("in the TLS handshake", e))?;
    }
    // The client's last flight (its Finished) must leave before the
    // receiver's first sealed frame is awaited.
    while conn.wants_write() {
        conn.write_tls(io)
            .map_err(|e| Error::net("in the TLS handshake", e))?;
    }
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        tracing::info!(
            "TLS 1.3 is sealed and opened in this process (rustls), not the kernel: {}",
            why_userspace()
        );
    });
    let mut binding = [0u8; BINDING_LEN];
    conn.export_keying_material(&mut binding, BINDING_LABEL, None)
        .map_err(|e| Error::Config(format!("exporting the TLS channel binding: {e}")))?;
    Ok(Link::new(conn, binding))
}

/// What the summary and status say of TLS sealed in this process.
pub fn userspace_note() -> String {
    format!("kernel TLS not used: {}", why_userspace())
}

/// Why records are sealed in this process rather than by the kernel
/// (kTLS): said in the summary, status and log.
pub fn why_userspace() -> &'static str {
    static WHY: OnceLock<&'static str> = OnceLock::new();
    WHY.get_or_init(|| {
        let ulps =
            std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_ulp").unwrap_or_default();
        if ulps.split_whitespace().any(|u| u == "tls") {
            "this build does not yet hand the keys to the kernel"
        } else {
            "this kernel offers no TLS (no \"tls\" in net.ipv4.tcp_available_ulp)"
        }
    })
}

#[cfg(test)]
mod tests;
