//! The health and metrics endpoints: `/healthz` (the process is alive),
//! `/readyz` (the watches have synced; owning a shard is not required, so
//! replicas beyond the shard count are still ready) and `/metrics`
//! (Prometheus text format). Health and metrics may share one address.

use std::sync::Arc;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::task::JoinHandle;

use crate::cli::BindAddr;
use crate::metrics::Metrics;

/// Readiness check.
pub type ReadyFn = Arc<dyn Fn() -> bool + Send + Sync>;

fn health_routes(ready: ReadyFn) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let ready = ready.clone();
                async move {
                    if ready() {
                        (StatusCode::OK, "ok")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "caches not synced")
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

/// Bind and serve. Returns a handle that serves until aborted.
pub async fn start(
    health: &BindAddr,
    metrics_addr: &BindAddr,
    metrics: Metrics,
    ready: ReadyFn,
) -> anyhow::Result<JoinHandle<()>> {
    let mut routers: Vec<(std::net::SocketAddr, Router)> = Vec::new();
    match (health, metrics_addr) {
        (BindAddr::Addr(h), BindAddr::Addr(m)) if h == m => {
            routers.push((*h, health_routes(ready).merge(metrics_routes(metrics))));
        }
        _ => {
            if let BindAddr::Addr(h) = health {
                routers.push((*h, health_routes(ready)));
            }
            if let BindAddr::Addr(m) = metrics_addr {
                routers.push((*m, metrics_routes(metrics)));
            }
        }
    }
    let mut tasks = Vec::new();
    for (addr, router) in routers {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
        tracing::info!(addr = %listener.local_addr()?, "serving health/metrics");
        tasks.push(tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, router).await {
                tracing::error!(error = %e, "health/metrics server stopped");
            }
        }));
    }
    Ok(tokio::spawn(async move {
        for t in tasks {
            let _ = t.await;
        }
    }))
}
