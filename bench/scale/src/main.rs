//! `wirerate-scale`: a scale bench for the operator. It drives the real
//! `wirerate-operator` binary against an in-memory Kubernetes API double
//! served over HTTP (or any API server given a kubeconfig), with simulated
//! agents and many Transfers, and reports how fast the operator schedules,
//! what it costs at rest, and whether it ever overran an agent or assigned
//! a Transfer twice.
//!
//! Exit status: 0 when every correctness check held (timings are reported,
//! never asserted), 1 when one failed, 2 for a setup error.
#![forbid(unsafe_code)]

mod agents;
mod cluster;
mod observer;
mod operator;
mod processes;
mod promtext;
mod report;
mod requests;
mod run;
mod scenario;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use wirerate_apiserver_double as apiserver;

/// Scale bench for wirerate's operator.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the bench: schedule, rest, refill.
    Run(Box<run::Args>),
    /// Serve the API double alone until Ctrl-C (for kubectl, an operator
    /// started by hand, or `run --kubeconfig`).
    Serve {
        /// Where to write its kubeconfig.
        #[arg(long, default_value = "double-kubeconfig.json")]
        kubeconfig: std::path::PathBuf,
    },
}

/// Serves the double until interrupted.
async fn serve(kubeconfig: &std::path::Path) -> anyhow::Result<bool> {
    let d = apiserver::ApiServer::start(std::time::Duration::ZERO).await?;
    d.write_kubeconfig(kubeconfig)?;
    eprintln!(
        "API double at {}; kubeconfig {}; Ctrl-C stops it",
        d.url(),
        kubeconfig.display()
    );
    tokio::signal::ctrl_c().await?;
    Ok(true)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Two workers: the double, the agents and the observer share the
    // machine with the operator under test, and should not crowd it.
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let outcome = match cli.command {
        Command::Run(args) => runtime.block_on(run::main(*args)),
        Command::Serve { kubeconfig } => runtime.block_on(serve(&kubeconfig)),
    };
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("correctness check failed (see the table)");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
