//! What the operator's command line accepts. The binary carries it out; the
//! flags' reference in docs/ is written from `command()`.

use clap::{CommandFactory, Parser};

/// The operator's command line, as `--help` and the flags' reference show it.
pub fn command() -> clap::Command {
    Args::command()
}

/// wirerate's Kubernetes operator.
#[derive(Parser)]
#[command(version, about)]
pub struct Args {
    /// Namespace of the leader-election Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "wirerate-system")]
    pub namespace: String,
    /// This replica's identity in the Lease (the pod name in the cluster).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Address of /metrics and /healthz.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub metrics_addr: String,
    /// Writes to the API server per second at most, all kinds together.
    /// Changes (a phase, agents, a grant) wait their turn; refreshes (a
    /// place in line, a stall mark) give way to them.
    #[arg(long, default_value_t = crate::budget::DEFAULT_WRITES_PER_SECOND,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_writes_per_second: u32,
    /// Host directories pools may mount (comma-separated); a pool mounting
    /// any other is refused. Unset: any but the host's root and system
    /// directories.
    #[arg(long = crate::install::ALLOWED_HOST_PATHS_FLAG,
          env = "WIRERATE_ALLOWED_HOST_PATHS", value_delimiter = ',')]
    pub allowed_host_paths: Vec<String>,
}
