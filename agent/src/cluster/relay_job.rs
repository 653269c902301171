//! The engine's relay, run for one Transfer by an agent of the sending
//! pool that `status.relays` names: it reads and sends the data of the
//! pairs the sender hands it, from this agent's view of the shared
//! source, with the Transfer's token, beneath the one allowed root that
//! holds the source.

use std::path::PathBuf;

use wirerate_crds::Tuning;
use wirerate_engine::error::Result;
use wirerate_engine::relay::{Relay, RelayConfig, RelayHandle};
use wirerate_engine::sender::SendConfig;

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
        let mut send = SendConfig::new("", token.clone(), PathBuf::new(), "");
        send.tune(&tuning.settings()?);
        let cfg = RelayConfig {
            token,
            roots: vec![root],
            send,
            max_memory: None,
        };
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

impl Drop for RelayJob {
    fn drop(&mut self) {
        self.stop();
    }
}
