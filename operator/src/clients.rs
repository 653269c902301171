//! The operator's two API clients: one for watches, one for every other
//! call. kube's client sets no read timeout, and a loaded API server can
//! hold a request for minutes; a watch, though, is a long poll that may go
//! quiet for as long as nothing changes. So calls get a read timeout and
//! watches a client without one.

use std::time::Duration;

use kube::{Client, Config};

/// How long a call may wait for the API server's next bytes: a stalled
/// write or read fails, and its reconcile is tried again with back-off.
pub const CALL_READ_TIMEOUT: Duration = Duration::from_secs(15);
/// How long connecting or sending a request may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The clients built from one configuration.
#[derive(Clone)]
pub struct Clients {
    /// Reads, writes and the leader Lease: under [`CALL_READ_TIMEOUT`].
    pub calls: Client,
    /// Watches and the controllers' streams: no read timeout.
    pub watches: Client,
}

/// Both clients for `config` (its own timeouts are replaced).
pub fn clients(mut config: Config) -> kube::Result<Clients> {
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    config.write_timeout = Some(CONNECT_TIMEOUT);
    config.read_timeout = None;
    let watches = Client::try_from(config.clone())?;
    config.read_timeout = Some(CALL_READ_TIMEOUT);
    let calls = Client::try_from(config)?;
    Ok(Clients { calls, watches })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::{Api, Patch, PatchParams, PostParams};
    use serde_json::json;
    use tokio::time::Instant;
    use wirerate_apiserver_double::{ApiServer, install};
    use wirerate_crds::Transfer;
    use wirerate_crds::fixtures::TransferBuilder;

    // issue 35: the operator's client had no read timeout, so a status
    // write the API server held blocked its reconcile for as long as the
    // server liked. Now it fails after CALL_READ_TIMEOUT and is tried
    // again; the watch client is left without one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stalled_status_write_fails_within_the_read_timeout() {
        let api = ApiServer::start(Duration::ZERO).await.unwrap();
        let url = api.url().parse().unwrap();
        let c = clients(Config::new(url)).unwrap();
        install(&c.calls, &["ops"]).await.unwrap();
        let transfers: Api<Transfer> = Api::namespaced(c.calls.clone(), "ops");
        let t = TransferBuilder::new("t", "/in/a", "/out/a")
            .pools("src", "dst")
            .namespace("ops")
            .build();
        transfers.create(&PostParams::default(), &t).await.unwrap();
        api.stall("patch", "transfers/status", Duration::from_secs(30));
        let began = Instant::now();
        let body = json!({"apiVersion": "wirerate.io/v1alpha1", "kind": "Transfer",
            "status": {"phase": "Queued"}});
        let pp = PatchParams::apply("test").force();
        let r = transfers.patch_status("t", &pp, &Patch::Apply(&body)).await;
        let took = began.elapsed();
        api.unstall();
        assert!(r.is_err(), "the stalled write was answered: {r:?}");
        assert!(
            took >= CALL_READ_TIMEOUT && took < Duration::from_secs(25),
            "failed after {took:?}"
        );
    }
}
