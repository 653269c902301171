//! The agent's integration tests, one module per concern, in one test
//! binary: each binary links the whole agent, and cargo runs binaries one
//! after another, so a binary's slow tail (a test that waits on a timer)
//! held the machine idle. Together, the test threads move on to the next
//! test instead. Two stay binaries of their own: `containers.rs` (it
//! builds the release images on first use, which would load the machine
//! under the others) and `hugepages.rs` (it changes the machine's huge page
//! reserve, which another test's agent could take).

#[path = "../common/mod.rs"]
mod common;

mod cluster_api;
mod cluster_jobs;
mod compression;
mod demo;
mod dry_run;
mod faults;
mod filters;
mod hostile;
mod integrity;
mod metadata;
mod mirror;
mod netns;
mod pairs;
mod processes;
mod refusals;
mod relays;
mod seccomp_profile;
mod sources;
mod sync;
mod transfers;
mod warm;
