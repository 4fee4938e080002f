//! The health and metrics endpoints: `/healthz` (the process is alive),
//! `/readyz` (the watches have synced; owning a shard is not required, so
//! replicas beyond the shard count are still ready; a `503` says why not,
//! e.g. which CRD is not installed) and `/metrics`
//! (Prometheus text format). Health and metrics may share one address.
//!
//! With `--metrics-tls`, `/metrics` is served over HTTPS (a certificate from
//! `--metrics-cert-path`, or a self-signed one made at start) and requires a
//! bearer token that the API server authenticates (TokenReview) and
//! authorises for `get` on the non-resource URL `/metrics`
//! (SubjectAccessReview), as kube-rbac-proxy does. Decisions are cached for a
//! minute per token (at most [`MAX_CACHED_TOKENS`] of them).
//!
//! Both servers bound what a client can hold: [`MAX_CONNECTIONS`]
//! connections at once, [`HEADER_TIMEOUT`] to send a request head of at
//! most [`MAX_HEAD_BYTES`], [`CONNECTION_LIFETIME`] in all.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::cli::BindAddr;
use crate::metrics::Metrics;

/// Refuse to serve metrics in plain, unauthenticated HTTP on an address
/// other pods or hosts can reach, unless asked to with `insecure`.
pub fn check_exposure(addr: &BindAddr, tls: bool, insecure: bool) -> anyhow::Result<()> {
    match addr {
        BindAddr::Addr(a) if !tls && !insecure && !a.ip().is_loopback() => Err(anyhow::anyhow!(
            "--metrics-addr {a} is not a loopback address: serve metrics over HTTPS with token \
             authentication (--metrics-tls), or accept plain unauthenticated HTTP with \
             --metrics-insecure"
        )),
        _ => Ok(()),
    }
}

/// Readiness check: ready, or why not (the body of a `503`).
pub type ReadyFn = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// How `/metrics` is protected.
#[derive(Clone, Debug, Default)]
pub struct MetricsTls {
    /// Serve HTTPS with token authentication.
    pub enabled: bool,
    /// Certificate directory; `None` makes a self-signed certificate.
    pub cert_dir: Option<PathBuf>,
    /// Certificate file name in the directory.
    pub cert_name: String,
    /// Key file name in the directory.
    pub key_name: String,
}

fn health_routes(ready: ReadyFn) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let ready = ready.clone();
                async move {
                    match ready() {
                        Ok(()) => (StatusCode::OK, "ok".to_owned()),
                        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
                    }
                }
            }),
        )
}

fn metrics_routes(metrics: Metrics) -> Router {
    Router::new().route(
        "/metrics",
        get(move || {
            let metrics = metrics.clone();
            async move {
                (
                    [(
                        header::CONTENT_TYPE,
                        "text/plain; version=0.0.4; charset=utf-8",
                    )],
                    metrics.encode(),
                )
                    .into_response()
            }
        }),
    )
}

/// What the API server says of a bearer token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// An authenticated user who may `get /metrics`.
    Allowed,
    /// Not a valid token (TokenReview: not authenticated): 401.
    Unauthenticated,
    /// A valid token of a user who may not `get /metrics`: 403.
    Forbidden,
    /// The API server could not be asked (not cached): 503.
    Unknown,
}

/// The most token decisions kept: a client sending many tokens costs
/// their reviews, not memory.
pub const MAX_CACHED_TOKENS: usize = 1024;

/// Decisions by token digest: when decided, and what.
type Decisions = HashMap<[u8; 32], (Instant, Decision)>;

/// Token authentication and authorisation through the API server.
#[derive(Clone)]
pub struct TokenAuth {
    client: kube::Client,
    cache: Arc<Mutex<Decisions>>,
}

impl TokenAuth {
    /// Check tokens with the API server behind `client`.
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            cache: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// Whether `token` belongs to a user who may `get /metrics`.
    pub async fn allowed(&self, token: &str) -> Decision {
        let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
        let mut key = [0u8; 32];
        key.copy_from_slice(digest.as_ref());
        {
            let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            cache.retain(|_, (at, _)| at.elapsed() < Duration::from_secs(60));
            if let Some((_, decision)) = cache.get(&key) {
                return *decision;
            }
        }
        let decision = match self.review(token).await {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %e, "could not review a metrics token");
                return Decision::Unknown;
            }
        };
        remember(
            &mut self.cache.lock().unwrap_or_else(|e| e.into_inner()),
            key,
            decision,
        );
        decision
    }

    async fn review(&self, token: &str) -> Result<Decision, kube::Error> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_owned(),
                audiences: None,
            },
            ..TokenReview::default()
        };
        let reviewed = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await?;
        let Some(status) = reviewed.status.filter(|s| s.authenticated == Some(true)) else {
            return Ok(Decision::Unauthenticated);
        };
        let user = status.user.unwrap_or_default();
        let sar = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username,
                groups: user.groups,
                uid: user.uid,
                extra: user.extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some("/metrics".to_owned()),
                    verb: Some("get".to_owned()),
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let decided = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &sar)
            .await?;
        Ok(if decided.status.is_some_and(|s| s.allowed) {
            Decision::Allowed
        } else {
            Decision::Forbidden
        })
    }
}

/// Keep a decision; when full of tokens seen within the minute, the
/// oldest goes.
fn remember(cache: &mut Decisions, key: [u8; 32], decision: Decision) {
    if cache.len() >= MAX_CACHED_TOKENS {
        let oldest = cache.iter().min_by_key(|(_, (at, _))| *at).map(|(k, _)| *k);
        if let Some(oldest) = oldest {
            cache.remove(&oldest);
        }
    }
    cache.insert(key, (Instant::now(), decision));
}

async fn require_token(State(auth): State<TokenAuth>, request: Request, next: Next) -> Response {
    let token = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::to_owned);
    let Some(token) = token else {
        return (StatusCode::UNAUTHORIZED, "a bearer token is required").into_response();
    };
    match auth.allowed(&token).await {
        Decision::Allowed => next.run(request).await,
        Decision::Unauthenticated => {
            (StatusCode::UNAUTHORIZED, "the bearer token is not valid").into_response()
        }
        Decision::Forbidden => {
            (StatusCode::FORBIDDEN, "the token may not get /metrics").into_response()
        }
        Decision::Unknown => (
            StatusCode::SERVICE_UNAVAILABLE,
            "the token could not be checked; try again",
        )
            .into_response(),
    }
}

/// A TLS server configuration from PEM files, or a self-signed one.
fn tls_config(tls: &MetricsTls) -> anyhow::Result<rustls::ServerConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let (certs, key) = match &tls.cert_dir {
        Some(dir) => {
            let cert_path = dir.join(&tls.cert_name);
            let key_path = dir.join(&tls.key_name);
            let certs = CertificateDer::pem_file_iter(&cert_path)
                .and_then(Iterator::collect::<Result<Vec<_>, _>>)
                .map_err(|e| anyhow::anyhow!("reading {}: {e}", cert_path.display()))?;
            let key = PrivateKeyDer::from_pem_file(&key_path)
                .map_err(|e| anyhow::anyhow!("reading {}: {e}", key_path.display()))?;
            (certs, key)
        }
        None => {
            let key = rcgen::KeyPair::generate()?;
            let names = vec!["localhost".to_owned(), "kms-operator".to_owned()];
            let cert = rcgen::CertificateParams::new(names)?.self_signed(&key)?;
            (
                vec![cert.der().clone()],
                PrivateKeyDer::try_from(key.serialize_der()).map_err(|e| anyhow::anyhow!("{e}"))?,
            )
        }
    };
    let mut config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// A listener that completes TLS handshakes off the accept loop.
struct TlsListener {
    local: std::net::SocketAddr,
    rx: tokio::sync::mpsc::Receiver<(
        tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
        std::net::SocketAddr,
    )>,
}

impl TlsListener {
    fn new(
        listener: tokio::net::TcpListener,
        config: rustls::ServerConfig,
    ) -> std::io::Result<Self> {
        let local = listener.local_addr()?;
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        // Handshakes in progress are bounded like connections, and each
        // gets the time of a request head.
        let handshakes = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
        tokio::spawn(async move {
            loop {
                let Ok(permit) = handshakes.clone().acquire_owned().await else {
                    return;
                };
                let Ok((stream, addr)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    let handshake =
                        tokio::time::timeout(HEADER_TIMEOUT, acceptor.accept(stream)).await;
                    drop(permit);
                    if let Ok(Ok(tls)) = handshake {
                        let _ = tx.send((tls, addr)).await;
                    }
                });
            }
        });
        Ok(Self { local, rx })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(conn) => conn,
            // The accept loop never ends while the listener lives.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// Connections served at once per listener; more wait in the listen
/// backlog until one ends.
pub const MAX_CONNECTIONS: usize = 64;
/// How long a client may take to send a request's head (and how long an
/// idle keep-alive connection is kept).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest request head read; a longer one is refused (431) and the
/// connection closed.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
/// The longest a connection lives, whatever it does.
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(120);

/// Serve `router` on `listener` within the limits above: a slow or
/// oversized request costs at most one connection's small buffer for a few
/// seconds, and the connections at once are bounded.
async fn serve<L>(mut listener: L, router: Router)
where
    L: axum::serve::Listener,
    L::Io: Send + 'static,
{
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let (io, _) = listener.accept().await;
        let service = TowerToHyperService::new(router.clone());
        tokio::spawn(async move {
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .max_buf_size(MAX_HEAD_BYTES)
                .serve_connection(TokioIo::new(io), service);
            let _ = tokio::time::timeout(CONNECTION_LIFETIME, connection).await;
            drop(permit);
        });
    }
}

/// Bind and serve. Returns a handle that serves until aborted.
pub async fn start(
    health: &BindAddr,
    metrics_addr: &BindAddr,
    metrics: Metrics,
    ready: ReadyFn,
    tls: &MetricsTls,
    client: kube::Client,
) -> anyhow::Result<JoinHandle<()>> {
    let protect = |router: Router| -> Router {
        if tls.enabled {
            let auth = TokenAuth::new(client.clone());
            router.layer(middleware::from_fn_with_state(auth, require_token))
        } else {
            router
        }
    };
    let mut plain: Vec<(std::net::SocketAddr, Router)> = Vec::new();
    let mut secure: Option<(std::net::SocketAddr, Router)> = None;
    match (health, metrics_addr) {
        (BindAddr::Addr(h), BindAddr::Addr(m)) if h == m && !tls.enabled => {
            plain.push((*h, health_routes(ready).merge(metrics_routes(metrics))));
        }
        _ => {
            if let BindAddr::Addr(h) = health {
                plain.push((*h, health_routes(ready)));
            }
            if let BindAddr::Addr(m) = metrics_addr {
                if tls.enabled {
                    secure = Some((*m, protect(metrics_routes(metrics))));
                } else {
                    plain.push((*m, metrics_routes(metrics)));
                }
            }
        }
    }
    let mut tasks = Vec::new();
    for (addr, router) in plain {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
        tracing::info!(addr = %listener.local_addr()?, "serving health/metrics");
        tasks.push(tokio::spawn(serve(listener, router)));
    }
    if let Some((addr, router)) = secure {
        let config = tls_config(tls)?;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
        let listener = TlsListener::new(listener, config)?;
        tracing::info!(addr = %listener.local, "serving metrics over HTTPS with token authentication");
        tasks.push(tokio::spawn(serve(listener, router)));
    }
    Ok(tokio::spawn(async move {
        for t in tasks {
            let _ = t.await;
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_cache_is_bounded() {
        let mut cache = Decisions::new();
        for i in 0..(MAX_CACHED_TOKENS as u32 * 3) {
            let mut key = [0u8; 32];
            key[..4].copy_from_slice(&i.to_le_bytes());
            remember(&mut cache, key, Decision::Forbidden);
        }
        assert_eq!(cache.len(), MAX_CACHED_TOKENS);
        // The newest is kept.
        let mut last = [0u8; 32];
        last[..4].copy_from_slice(&(MAX_CACHED_TOKENS as u32 * 3 - 1).to_le_bytes());
        assert!(cache.contains_key(&last));
    }
}
