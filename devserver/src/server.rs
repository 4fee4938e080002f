//! The accept loop: HTTP/1.1 connections (over TLS when the server has a
//! certificate) served by hyper with the axum router, trailing slashes
//! ignored as on the real server, connections closed without an answer when
//! a fault says so, and a graceful stop.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::Uri;
use axum::response::IntoResponse as _;
use futures_util::FutureExt as _;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt as _;

use crate::errors::ApiError;
use crate::middleware::DropConnection;

/// How long requests in flight may take to finish at shutdown.
const GRACE: Duration = Duration::from_secs(5);
/// How long a TLS handshake may take.
const HANDSHAKE: Duration = Duration::from_secs(10);

/// The error that makes hyper close a connection without answering.
#[derive(Debug)]
struct Dropped;

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection dropped by an injected fault")
    }
}

impl std::error::Error for Dropped {}

/// The peer of a connection, available to handlers as an extension.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peer(pub SocketAddr);

/// Serve until `stop` turns true or its sender is dropped; `on_stop` runs
/// when the listener closes, before waiting for requests in flight (it ends
/// the event streams, which would otherwise hold their connections).
pub(crate) async fn serve(
    listener: TcpListener,
    router: Arc<Router>,
    tls: Option<TlsAcceptor>,
    mut stop: watch::Receiver<bool>,
    on_stop: Box<dyn FnOnce() + Send>,
) {
    let graceful = GracefulShutdown::new();
    let mut connections = JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            changed = stop.changed() => {
                if changed.is_err() || *stop.borrow() {
                    break;
                }
                continue;
            }
        };
        let (stream, peer) = match accepted {
            Ok(conn) => conn,
            Err(e) => {
                tracing::warn!(error = %e, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let router = router.clone();
        let watcher = graceful.watcher();
        let tls = tls.clone();
        connections.spawn(async move {
            match tls {
                None => serve_io(stream, router, peer, watcher).await,
                Some(acceptor) => {
                    match tokio::time::timeout(HANDSHAKE, acceptor.accept(stream)).await {
                        Ok(Ok(stream)) => serve_io(stream, router, peer, watcher).await,
                        Ok(Err(e)) => tracing::debug!(error = %e, %peer, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                }
            }
        });
    }
    drop(listener);
    on_stop();
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(GRACE) => {
            tracing::warn!("requests still running at shutdown were cut off");
        }
    }
    connections.shutdown().await;
}

/// Serve the requests of one connection.
async fn serve_io<I>(io: I, router: Arc<Router>, peer: SocketAddr, watcher: Watcher)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let router = router.clone();
        async move {
            let mut req = req.map(Body::new);
            strip_trailing_slash(&mut req);
            req.extensions_mut().insert(Peer(peer));
            // A bug must not cost the client its connection: a panic
            // becomes the real server's 500.
            let served = std::panic::AssertUnwindSafe((*router).clone().oneshot(req))
                .catch_unwind()
                .await;
            let resp = match served {
                Ok(Ok(resp)) => resp,
                Ok(Err(never)) => match never {},
                Err(_) => {
                    tracing::error!("a request handler panicked");
                    ApiError::internal().into_response()
                }
            };
            if resp.extensions().get::<DropConnection>().is_some() {
                return Err(Dropped);
            }
            Ok::<_, Dropped>(resp)
        }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(30))
        .serve_connection(TokioIo::new(io), service);
    if let Err(e) = watcher.watch(conn).await {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

/// `/a/b/` → `/a/b` (the real server ignores trailing slashes).
fn strip_trailing_slash(req: &mut Request) {
    let path = req.uri().path();
    if path.len() <= 1 || !path.ends_with('/') {
        return;
    }
    let trimmed = path.trim_end_matches('/');
    let trimmed = if trimmed.is_empty() { "/" } else { trimmed };
    let rebuilt = match req.uri().query() {
        Some(q) => format!("{trimmed}?{q}"),
        None => trimmed.to_owned(),
    };
    let mut parts = req.uri().clone().into_parts();
    if let Ok(pq) = rebuilt.parse() {
        parts.path_and_query = Some(pq);
        if let Ok(uri) = Uri::from_parts(parts) {
            *req.uri_mut() = uri;
        }
    }
}
