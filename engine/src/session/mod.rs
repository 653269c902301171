//! The session protocol's decisions, one state machine per side of a
//! control connection. The shells in `sender` and `receiver` read and
//! write the sockets and carry out what these decide.

pub mod lifecycle;
pub mod reading;
pub mod receiver;
pub mod reports;
pub mod sender;

pub use receiver::{DiscardPolicy, ReceiverControl, SessionOutcome, Verdict};
pub use sender::{FileVerdict, SenderControl};

use crate::wire::Frame;

/// A frame's kind for an error message, without its payload (a manifest
/// chunk can be megabytes).
pub(crate) fn describe(frame: &Frame) -> String {
    match frame {
        Frame::Files { entries } => format!("a manifest chunk of {} entries", entries.len()),
        Frame::Plan { file_id, .. } => format!("a plan entry for file {file_id}"),
        Frame::PlanRun { first, count } => {
            format!("a plan run of {count} files from file {first}")
        }
        Frame::Stripe(s) => format!("a {:?} stripe of {} pieces", s.role, s.pieces.len()),
        other => {
            let mut s = format!("{other:?}");
            // The peer chose these bytes: cut on a character boundary.
            let cut = (0..=200.min(s.len()))
                .rev()
                .find(|&i| s.is_char_boundary(i))
                .unwrap_or(0);
            s.truncate(cut);
            s
        }
    }
}
