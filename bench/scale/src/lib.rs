//! The scale bench's library half: the HTTP Kubernetes API double, which
//! the bench drives the operator against and which other crates' tests
//! (the operator's two-namespace path tests) run real binaries against.
#![forbid(unsafe_code)]

pub mod apiserver;
