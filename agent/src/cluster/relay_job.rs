//! The engine's relay, run for one Transfer by an agent of the sending
//! pool that `status.relays` names: it reads and sends the data of the
//! pairs the sender hands it, from this agent's view of the shared
//! source, with the Transfer's token, beneath the one allowed root that
//! holds the source.

use std::path::PathBuf;

use wirerate_crds::Tuning;
use wirerate_engine::error::Result;
use wirerate_engine::relay::{Relay, RelayConfig, RelayHandle};
use wirerate_engine::sender::{SendConfig, most_session_memory};

use super::jobs::bind_first;

/// A relay bound for one transfer.
pub struct RelayJob {
    handle: Option<RelayHandle>,
    /// Port it listens on.
    pub port: u16,
}

impl RelayJob {
    /// Binds the first free port in `ports` and relays, with `token`,
    /// what lies beneath `root`, with the Transfer's `tuning` for its
    /// sessions (the sender's own settings: the relay runs the sessions
    /// the sender would have).
    pub fn start(
        root: PathBuf,
        token: Vec<u8>,
        tuning: &Tuning,
        ports: std::ops::Range<u16>,
    ) -> Result<Self> {
        let cfg = config(root, token, tuning)?;
        let (port, relay) = bind_first(ports, |addr| Relay::bind(addr, cfg.clone()))?;
        Ok(Self {
            port,
            handle: Some(relay.spawn()?),
        })
    }

    /// Takes no more jobs (those in flight end with their sender).
    pub fn stop(&mut self) {
        if let Some(mut h) = self.handle.take() {
            h.stop();
        }
    }
}

/// The relay's settings for a Transfer tuned `tuning`: its sessions run
/// as the sender's would, and a job may take what the sender itself could
/// take for one session (`sender::most_session_memory`), so that the
/// relay never refuses a job its sender would have run; two sessions a
/// pair.
fn config(root: PathBuf, token: Vec<u8>, tuning: &Tuning) -> Result<RelayConfig> {
    let mut send = SendConfig::new("", token.clone(), PathBuf::new(), "");
    let settings = tuning.settings()?;
    send.tune(&settings);
    send.encrypt = tuning.encryption();
    send.compress = tuning.compression();
    let job_memory = most_session_memory(&settings, tuning.streams.is_some());
    Ok(RelayConfig {
        token,
        encrypt: send.encrypt,
        roots: vec![root],
        send,
        max_memory: Some(job_memory.saturating_mul(2)),
        job_memory: Some(job_memory),
    })
}

impl Drop for RelayJob {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Found by review: the relay allowed a job only its own buffer
    // (512 MiB by default), where the sender sizes its pool for the
    // streams it runs; a sender grown to 46 streams of 16 MiB blocks
    // (2 x 46 + 2 blocks, 1,504 MiB) had its relay refuse the job, and
    // the Transfer failed.
    #[test]
    fn a_relay_allows_a_job_what_its_sender_could_take() {
        let mut tuning = Tuning {
            block_size: Some(16 << 20),
            ..Default::default()
        };
        let cfg = config(PathBuf::from("/data"), vec![1; 32], &tuning).unwrap();
        let grown = (2 * 46 + 2) * (16 << 20);
        assert!(cfg.job_memory.unwrap() >= grown, "{:?}", cfg.job_memory);
        assert!(cfg.max_memory.unwrap() >= 2 * grown, "two sessions a pair");
        assert_eq!(cfg.send.block_size, 16 << 20);
        // Streams fixed by the Transfer: what they take, or the buffer.
        tuning.streams = Some(8);
        let cfg = config(PathBuf::from("/data"), vec![1; 32], &tuning).unwrap();
        assert_eq!(cfg.job_memory, Some(cfg.send.buffer.max(18 * (16 << 20))));
    }
}
