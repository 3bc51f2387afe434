//! The HTTP accept loop, with the limits `axum::serve` does not set.
//!
//! `axum::serve` runs hyper without a timer, so a client that opens a
//! connection and never finishes its request headers (slowloris), or parks
//! an idle keep-alive connection, holds a socket and a task forever. This
//! loop serves the same router through hyper-util with:
//!
//! * a timer, so that request headers must arrive within the header read
//!   timeout (`--header-read-timeout-secs`) of the connection waiting for them (which also
//!   closes idle keep-alive connections after that long), and HTTP/2
//!   connections are pinged and closed when the peer stops answering;
//! * at most `max_connections` connections at once (accepting waits for a
//!   free slot; the kernel's backlog holds the rest);
//! * accept errors (out of file descriptors) logged and retried after a
//!   pause instead of ending the server;
//! * a graceful shutdown that stops accepting, lets in-flight requests
//!   finish (each is bounded by the request timeout layer) and gives up
//!   after `drain_limit`.
//!
//! Handlers see the peer address as `ConnectInfo<SocketAddr>`, as with
//! `into_make_service_with_connect_info`.

use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::ServiceExt;

/// HTTP/2 ping interval, and how long a ping may go unanswered.
pub const H2_KEEP_ALIVE: Duration = Duration::from_secs(20);
/// Pause after a failed accept (e.g. out of file descriptors).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// How [`serve`] bounds its clients.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Longest wait for a request's headers.
    pub header_read_timeout: Duration,
    /// Most connections at once.
    pub max_connections: usize,
    /// Longest wait for open connections at shutdown.
    pub drain_limit: Duration,
}

/// Serves `router` on `listener` until `shutdown` resolves, then drains.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(H2_KEEP_ALIVE))
        .keep_alive_timeout(H2_KEEP_ALIVE);
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection failed; retrying");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let service = router
            .clone()
            .map_request(move |mut req: axum::http::Request<Incoming>| {
                req.extensions_mut().insert(ConnectInfo(peer));
                req.map(axum::body::Body::new)
            });
        let conn = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), TowerToHyperService::new(service))
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    if tokio::time::timeout(limits.drain_limit, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            limit_s = limits.drain_limit.as_secs(),
            "connections still open after the drain limit; closing them"
        );
    }
}
