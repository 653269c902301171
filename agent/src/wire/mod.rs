//! The wire protocol on sockets: reading and writing the frames that
//! `wirerate_engine::wire` defines and encodes.
#![forbid(unsafe_code)]

mod stream;

pub use stream::{
    FrameReader, read_frame, read_frame_capped, write_frame, write_frame_with_payload,
};
pub use wirerate_engine::wire::*;
