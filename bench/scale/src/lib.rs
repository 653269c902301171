//! The scale bench's library half, kept for the crates whose tests still
//! name the API double as `wirerate_scale::apiserver` (the agent's
//! cluster tests): the double itself is the crate
//! `wirerate-apiserver-double` (testsupport/apiserver), which new code
//! names directly.
#![forbid(unsafe_code)]

pub use wirerate_apiserver_double as apiserver;
