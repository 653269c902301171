//! Whether a connection is encrypted: what a sender offers in its hello,
//! what the receiver decides, and what the sender accepts, with no I/O.
//!
//! The offer and the answer cross the wire in clear, so something on the
//! path could strip them. It gains nothing: both go into the HMAC proofs
//! (`net::auth`), so a stripped offer fails the handshake, and a side
//! whose mode is `Required` refuses a clear connection before its proof.

use std::fmt;

pub use crate::tuning::Encryption;

/// Why a connection's encryption could not be agreed: final, since the
/// same two modes disagree the same way on every retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disagreement {
    /// The receiver requires encryption; the sender offered none.
    ReceiverRequires,
    /// The sender requires encryption; the receiver answered in clear.
    ReceiverDeclined,
    /// The receiver requires encryption and read no offer, though the
    /// sender made one: something on the path removed it.
    OfferRemoved,
}

impl fmt::Display for Disagreement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::ReceiverRequires => {
                "the receiver requires encryption and this sender offered none: send with \
                 --encrypt required (or preferred), or set the Transfer's encryption"
            }
            Self::ReceiverDeclined => {
                "the sender requires encryption and the receiver answered in clear (the \
                 receiver's encryption is none, or something on the path removed the offer); \
                 nothing was sent in clear"
            }
            Self::OfferRemoved => {
                "the receiver requires encryption and read no offer from this sender, which \
                 made one: something on the path removed it; nothing was sent in clear"
            }
        })
    }
}

impl std::error::Error for Disagreement {}

/// A mode's byte on the wire (in a hello, and in what the proofs cover):
/// fixed here, never the enum's order.
pub fn code(mode: Encryption) -> u8 {
    match mode {
        Encryption::None => 0,
        Encryption::Preferred => 1,
        Encryption::Required => 2,
    }
}

/// The mode a byte on the wire names, if any.
pub fn of_code(code: u8) -> Option<Encryption> {
    match code {
        0 => Some(Encryption::None),
        1 => Some(Encryption::Preferred),
        2 => Some(Encryption::Required),
        _ => None,
    }
}

/// The receiver's decision on a client's `offer`, under its own `mode`;
/// a connection `already` encrypted (a parked one, authenticated afresh)
/// stays so whatever the offer.
pub fn decide(offer: Encryption, mode: Encryption, already: bool) -> Result<bool, Disagreement> {
    if already {
        return Ok(true);
    }
    match (offer, mode) {
        (Encryption::None, Encryption::Required) => Err(Disagreement::ReceiverRequires),
        (Encryption::None, _) | (_, Encryption::None) => Ok(false),
        _ => Ok(true),
    }
}

/// The sender's check of the receiver's answer (`encrypted`) under its
/// own `mode`.
pub fn accept(mode: Encryption, encrypted: bool) -> Result<(), Disagreement> {
    if mode == Encryption::Required && !encrypted {
        return Err(Disagreement::ReceiverDeclined);
    }
    Ok(())
}

/// What was in effect on a connection, for the summary, status and
/// metrics. `Kernel` is the design's aim and not produced yet: records
/// are sealed in this process on every kernel (`net::tls`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InEffect {
    /// In clear.
    #[default]
    Clear,
    /// TLS 1.3, records sealed and opened in this process (rustls).
    Userspace,
    /// TLS 1.3, records sealed and opened by the kernel (kTLS).
    Kernel,
}

impl serde::Serialize for InEffect {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl InEffect {
    /// The log, summary and metrics spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Clear => "none",
            Self::Userspace => "tls-userspace",
            Self::Kernel => "tls-kernel",
        }
    }
}

impl fmt::Display for InEffect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Encryption::{None as Off, Preferred, Required};

    /// Every pair of modes: encrypted where both can, clear where either
    /// will not, refused where a `Required` side would get clear.
    #[test]
    fn every_pair_of_modes_agrees_or_is_refused() {
        let table = [
            (Off, Off, Ok(false), Ok(())),
            (Off, Preferred, Ok(false), Ok(())),
            (Off, Required, Err(Disagreement::ReceiverRequires), Ok(())),
            (Preferred, Off, Ok(false), Ok(())),
            (Preferred, Preferred, Ok(true), Ok(())),
            (Preferred, Required, Ok(true), Ok(())),
            (
                Required,
                Off,
                Ok(false),
                Err(Disagreement::ReceiverDeclined),
            ),
            (Required, Preferred, Ok(true), Ok(())),
            (Required, Required, Ok(true), Ok(())),
        ];
        for (sender, receiver, decided, accepted) in table {
            let d = decide(sender, receiver, false);
            assert_eq!(d, decided, "{sender} to {receiver}");
            if let Ok(encrypted) = d {
                assert_eq!(
                    accept(sender, encrypted),
                    accepted,
                    "{sender} to {receiver}"
                );
            }
        }
    }

    #[test]
    fn an_encrypted_connection_stays_encrypted() {
        for (offer, mode) in [(Off, Off), (Off, Required), (Required, Off)] {
            assert_eq!(decide(offer, mode, true), Ok(true));
        }
    }

    #[test]
    fn the_stricter_mode_wins() {
        assert_eq!(Off.max(Required), Required);
        assert_eq!(Preferred.max(Off), Preferred);
        assert_eq!(
            "Required".parse::<Encryption>().unwrap(),
            Required,
            "the manifest's spelling"
        );
        assert!("tls".parse::<Encryption>().is_err());
    }
}
