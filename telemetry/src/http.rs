//! One HTTP/1.1 endpoint per process: `GET /metrics`, `GET /healthz`
//! (also `/health`, its name before this crate), `GET /readyz` and
//! `GET`/`PUT /loglevel`.
//!
//! Every request is bounded in size and time and served concurrently, so
//! one slow or hostile client cannot stall or bloat the scrapes of
//! others. When every slot is taken, the oldest client whose request has
//! not yet arrived is cut to make room, or else the oldest whose answer
//! has taken over 2 s (one that asks and does not read): a scrape sends
//! its request at once and reads its answer, while clients that trickle
//! their request (a byte a second, reopened when cut) or never read
//! would otherwise hold every slot. Changing the log level is taken only from loopback, that is
//! from inside the pod (`kubectl port-forward`, `kubectl exec`): at
//! `trace`, client libraries may log request headers, and whoever can
//! reach a metrics port must not be able to turn that on.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::Semaphore;
use tokio::task::AbortHandle;

use crate::logs::{LogLevel, MAX_FILTER};

/// Clients served at once; more are closed at once.
const MAX_CLIENTS: usize = 64;
/// A request's head must arrive within this...
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// ...and the whole exchange be over within this.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longer than any scrape takes to read its answer: past it, a client
/// whose answer is still going out may be cut for a newcomer.
const ANSWER_GRACE: Duration = Duration::from_secs(2);
/// How long a new client waits for the slot of one cut for it.
const CUT_WAIT: Duration = Duration::from_millis(200);
/// Largest request head read (hyper's smallest buffer): a longer one is
/// answered 431 and closed.
const MAX_REQUEST: usize = 8192;

/// What a process serves about itself.
#[derive(Clone)]
pub struct Endpoints {
    render: Arc<dyn Fn() -> Vec<u8> + Send + Sync>,
    ready: Arc<AtomicBool>,
    log: Option<LogLevel>,
}

impl Endpoints {
    /// `/metrics` serves what `render` returns (Prometheus' text format).
    /// Not ready until [`Self::set_ready`] says so.
    pub fn new(render: impl Fn() -> Vec<u8> + Send + Sync + 'static) -> Self {
        Self {
            render: Arc::new(render),
            ready: Arc::new(AtomicBool::new(false)),
            log: None,
        }
    }

    /// `/loglevel` reads and (from loopback) changes this filter.
    #[must_use]
    pub fn with_log_level(mut self, log: LogLevel) -> Self {
        self.log = Some(log);
        self
    }

    /// Whether `/readyz` answers 200 (ready) or 503.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }
}

/// A client being served: cut it while its request has not arrived, or
/// once its answer has taken longer than any reader needs.
struct Client {
    abort: AbortHandle,
    /// Its request head arrived: it is being answered.
    heard: Arc<AtomicBool>,
    since: Instant,
}

/// The clients in their order of arrival.
#[derive(Default)]
struct Clients(Mutex<VecDeque<Client>>);

impl Clients {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Client>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn add(&self, client: Client) {
        let mut g = self.lock();
        g.retain(|c| !c.abort.is_finished());
        g.push_back(client);
    }

    /// Cuts the oldest client still waiting for its request or, if none
    /// is, the oldest one whose answer has taken over `ANSWER_GRACE` (a
    /// client that asks and then does not read); false if none may be.
    fn cut_oldest_waiting(&self, now: Instant) -> bool {
        let mut g = self.lock();
        g.retain(|c| !c.abort.is_finished());
        let waiting = g.iter().position(|c| !c.heard.load(Ordering::SeqCst));
        let slow = || {
            g.iter()
                .position(|c| now.saturating_duration_since(c.since) >= ANSWER_GRACE)
        };
        let Some(i) = waiting.or_else(slow) else {
            return false;
        };
        if let Some(c) = g.remove(i) {
            c.abort.abort();
        }
        true
    }
}

/// Serves `endpoints` on `listener` until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, endpoints: Endpoints) {
    let slots = Arc::new(Semaphore::new(MAX_CLIENTS));
    let clients = Clients::default();
    loop {
        let (sock, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                // Out of descriptors, say: wait for some to close.
                tracing::debug!("telemetry accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(permit) = slot(&slots, &clients).await else {
            continue;
        };
        let endpoints = endpoints.clone();
        let heard = Arc::new(AtomicBool::new(false));
        let heard_here = Arc::clone(&heard);
        let task = tokio::spawn(async move {
            let _permit = permit;
            let service = service_fn(move |req| {
                heard_here.store(true, Ordering::SeqCst);
                respond(endpoints.clone(), peer, req)
            });
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEAD_TIMEOUT)
                .max_buf_size(MAX_REQUEST)
                .keep_alive(false)
                .serve_connection(TokioIo::new(sock), service);
            let _ = tokio::time::timeout(EXCHANGE_TIMEOUT, conn).await;
        });
        clients.add(Client {
            abort: task.abort_handle(),
            heard,
            since: Instant::now(),
        });
    }
}

/// A slot for a new client: a free one, or the one of the oldest client
/// still waiting for its request, cut for it. `None` when every slot is
/// answering a request.
async fn slot(
    slots: &Arc<Semaphore>,
    clients: &Clients,
) -> Option<tokio::sync::OwnedSemaphorePermit> {
    if let Ok(p) = Arc::clone(slots).try_acquire_owned() {
        return Some(p);
    }
    if !clients.cut_oldest_waiting(Instant::now()) {
        return None;
    }
    // The cut client gives its slot back once its task is dropped, at
    // the runtime's next turn.
    tokio::time::timeout(CUT_WAIT, Arc::clone(slots).acquire_owned())
        .await
        .ok()?
        .ok()
}

/// Serves `endpoints` on `addr` from a thread of its own, for a process
/// with no runtime of its own; returns the address bound.
pub fn serve_in_thread(addr: &str, endpoints: Endpoints) -> std::io::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind(addr)?;
    let local = listener.local_addr()?;
    listener.set_nonblocking(true)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()?;
    std::thread::Builder::new()
        .name("telemetry".into())
        .spawn(move || {
            runtime.block_on(async move {
                match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => serve(l, endpoints).await,
                    Err(e) => tracing::error!("telemetry listener: {e}"),
                }
            });
        })?;
    Ok(local)
}

fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

async fn respond(
    endpoints: Endpoints,
    peer: SocketAddr,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let text = |status: StatusCode, body: String| (status, body.into_bytes());
    let metrics = req.method() == Method::GET && req.uri().path() == "/metrics";
    let log = endpoints.log.clone();
    let (status, body) = match (req.method(), req.uri().path(), log) {
        (&Method::GET, "/metrics", _) => (StatusCode::OK, (endpoints.render)()),
        (&Method::GET, "/health" | "/healthz", _) => text(StatusCode::OK, "ok\n".into()),
        (&Method::GET, "/readyz", _) if endpoints.ready.load(Ordering::SeqCst) => {
            text(StatusCode::OK, "ready\n".into())
        }
        (&Method::GET, "/readyz", _) => text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n".into()),
        (_, "/loglevel", None) => text(
            StatusCode::NOT_FOUND,
            "this process does not change its log level at run time\n".into(),
        ),
        (&Method::GET, "/loglevel", Some(log)) => text(StatusCode::OK, format!("{}\n", log.get())),
        (&Method::PUT, "/loglevel", Some(_)) if !is_loopback(peer.ip()) => text(
            StatusCode::FORBIDDEN,
            "the log level changes only from inside the pod: use kubectl port-forward or exec\n"
                .into(),
        ),
        (&Method::PUT, "/loglevel", Some(log)) => {
            match Limited::new(req.into_body(), MAX_FILTER).collect().await {
                Err(_) => text(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("a log filter is at most {MAX_FILTER} bytes\n"),
                ),
                Ok(body) => {
                    let wanted = String::from_utf8_lossy(&body.to_bytes()).into_owned();
                    match log.set(&wanted) {
                        Ok(()) => {
                            tracing::warn!(filter = %wanted.trim(), %peer, "log level changed");
                            text(
                                StatusCode::OK,
                                format!("log filter now {}\n", wanted.trim()),
                            )
                        }
                        Err(e) => text(StatusCode::BAD_REQUEST, format!("{e}\n")),
                    }
                }
            }
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "try /metrics, /healthz, /readyz or /loglevel\n".into(),
        ),
    };
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(if metrics {
            // Prometheus' text exposition format.
            "text/plain; version=0.0.4"
        } else {
            "text/plain; charset=utf-8"
        }),
    );
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    // The network test reaches the endpoint only over loopback, so the
    // refusal of everyone else is checked on the rule itself.
    #[test]
    fn only_loopback_changes_the_log_level() {
        for ip in ["127.0.0.1", "127.8.9.10", "::1", "::ffff:127.0.0.1"] {
            assert!(is_loopback(ip.parse().unwrap()), "{ip}");
        }
        for ip in [
            "10.0.0.7",
            "0.0.0.0",
            "::",
            "fd00::1",
            "::ffff:10.1.2.3",
            "169.254.1.1",
        ] {
            assert!(!is_loopback(ip.parse().unwrap()), "{ip}");
        }
    }
}
