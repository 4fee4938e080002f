//! The admin API under `/admin` (bearer `--admin-token`; open when none is
//! set). Its requests are not counted and not subject to faults.
//!
//! - `GET /admin/stats`, `DELETE /admin/stats`: request counters, the
//!   requests the rate limits refused, and the number of distinct folders
//!   read (`foldersRead`: listed with a `200` or a `304`).
//! - `GET /admin/faults`, `POST /admin/faults`, `DELETE /admin/faults`.
//! - `GET /admin/ratelimit`, `POST /admin/ratelimit`, `DELETE
//!   /admin/ratelimit`: the per-client rate limits.
//! - `GET /admin/leases` (`?all=true` adds expired and revoked ones).
//! - `PUT /admin/secrets`, `DELETE /admin/secrets`: change a secret without
//!   a token, for tests (announced to event streams like any change).

use axum::Router;
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::{Next, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::{Deserialize, Serialize};

use crate::api::{ApiResult, ROUTES};
use crate::app::App;
use crate::clock::{iso, now_ms};
use crate::errors::{ApiError, ok};
use crate::faults::FaultSpec;
use crate::ids::random_uuid;
use crate::model::{Project, Secret};
use crate::ratelimit::{LimitSpec, Limits};
use crate::seed::normalize_path;
use crate::stats::Counts;
use crate::store::{Kind, Record, State as Db, Tx};
use crate::validate::{query_object, read_json};
use crate::views::{OrderedMap, SecretView, Shape};

/// The admin routes (nested under `/admin`).
pub(crate) fn router(app: App) -> Router {
    Router::new()
        .route("/stats", get(stats).delete(reset_stats))
        .route("/faults", get(faults).post(set_faults).delete(clear_faults))
        .route(
            "/ratelimit",
            get(rate_limits)
                .post(set_rate_limits)
                .delete(clear_rate_limits),
        )
        .route("/leases", get(leases))
        .route(
            "/secrets",
            axum::routing::put(put_secret).delete(delete_secret),
        )
        .fallback(unknown)
        .layer(from_fn_with_state(app.clone(), guard))
        .with_state(app)
}

/// Refuse requests without the admin token, when one is set.
async fn guard(State(app): State<App>, req: Request, next: Next) -> Response {
    if let Some(expected) = &app.admin_token {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if !app.secret_matches(expected, given.trim()) {
            return ApiError::unauthorized("A valid admin token is required").into_response();
        }
    }
    next.run(req).await
}

async fn unknown(req: Request) -> ApiError {
    ApiError::not_found(format!(
        "No admin route {} {}",
        req.method(),
        req.uri().path()
    ))
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StatsOut {
    requests: Counts,
    rate_limited: std::collections::BTreeMap<String, u64>,
    folders_read: usize,
}

async fn stats(State(app): State<App>) -> Response {
    let (requests, rate_limited, folders_read) = app.stats.snapshot();
    ok(&StatsOut {
        requests,
        rate_limited,
        folders_read,
    })
}

async fn reset_stats(State(app): State<App>) -> Response {
    app.stats.reset();
    ok(&StatsOut {
        requests: Counts::new(),
        rate_limited: std::collections::BTreeMap::new(),
        folders_read: 0,
    })
}

#[derive(Serialize)]
struct LimitsOut {
    limits: Option<Limits>,
}

async fn rate_limits(State(app): State<App>) -> Response {
    ok(&LimitsOut {
        limits: app.limiter.limits(),
    })
}

/// `POST /admin/ratelimit`: `{"perMinute": N}` for every route, and/or
/// `secrets`, `read`, `write` per category. Every window starts again.
async fn set_rate_limits(State(app): State<App>, req: Request) -> ApiResult {
    let spec: LimitSpec = body(req).await?;
    let limits = spec.limits().map_err(ApiError::bad_request)?;
    app.limiter.set(limits);
    tracing::info!(?limits, "rate limits set");
    Ok(ok(&LimitsOut {
        limits: app.limiter.limits(),
    }))
}

async fn clear_rate_limits(State(app): State<App>) -> Response {
    app.limiter.set(Limits::default());
    tracing::info!("rate limits off");
    ok(&LimitsOut { limits: None })
}

#[derive(Serialize)]
struct FaultsOut {
    faults: Vec<FaultSpec>,
}

async fn faults(State(app): State<App>) -> Response {
    ok(&FaultsOut {
        faults: app.faults.list(),
    })
}

/// Parse an admin body into `T`, answering 400 with the reason.
async fn body<T: for<'de> Deserialize<'de>>(req: Request) -> Result<T, ApiError> {
    let (parts, body) = req.into_parts();
    let value = read_json(&parts.headers, body)
        .await?
        .unwrap_or(serde_json::Value::Object(serde_json::Map::new()));
    serde_json::from_value(value).map_err(|e| ApiError::bad_request(e.to_string()))
}

async fn set_faults(State(app): State<App>, req: Request) -> ApiResult {
    let spec: FaultSpec = body(req).await?;
    spec.check(ROUTES).map_err(ApiError::bad_request)?;
    tracing::info!(?spec, "faults set");
    app.faults.set(spec);
    Ok(ok(&FaultsOut {
        faults: app.faults.list(),
    }))
}

async fn clear_faults(State(app): State<App>) -> Response {
    app.faults.clear();
    tracing::info!("faults cleared");
    ok(&FaultsOut { faults: Vec::new() })
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct LeaseOut<'a> {
    id: &'a str,
    dynamic_secret: &'a str,
    expire_at: String,
    created_at: String,
    state: &'static str,
    project: &'a str,
    environment: &'a str,
    path: &'a str,
    data: OrderedMap<'a>,
}

async fn leases(State(app): State<App>, req: Request) -> Response {
    let all = query_object(req.uri().query())["all"] == "true";
    let st = app.store.read().await;
    let now = now_ms();
    let out: Vec<LeaseOut<'_>> = st
        .leases
        .values()
        .filter(|l| all || l.is_active(now))
        .filter_map(|l| {
            let ds = st.dynamic_secrets.get(&l.dynamic_secret_id)?;
            let project = st.project(&ds.project_id).map_or("", |p| p.slug.as_str());
            Some(LeaseOut {
                id: &l.id,
                dynamic_secret: &ds.name,
                expire_at: iso(l.expire_at),
                created_at: iso(l.created_at),
                state: if l.revoked_at.is_some() {
                    "revoked"
                } else if l.is_active(now) {
                    "active"
                } else {
                    "expired"
                },
                project,
                environment: &ds.environment,
                path: &ds.path,
                data: OrderedMap(&l.data),
            })
        })
        .collect();
    ok(&out)
}

/// A secret named by the admin API.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SecretRef {
    /// Project slug or id.
    project: String,
    environment: String,
    #[serde(default)]
    path: Option<String>,
    key: String,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    comment: Option<String>,
}

#[derive(Serialize)]
struct SecretOut {
    secret: SecretView,
}

fn admin_project<'s>(st: &'s Db, r: &SecretRef) -> Result<&'s Project, ApiError> {
    let project = st
        .project_by_slug(&r.project)
        .or_else(|| st.project(&r.project))
        .ok_or_else(|| ApiError::not_found(format!("No project {:?}", r.project)))?;
    if project.environment(&r.environment).is_none() {
        return Err(ApiError::not_found(format!(
            "Project {:?} has no environment {:?}",
            r.project, r.environment
        )));
    }
    Ok(project)
}

/// `PUT /admin/secrets`: create or update a secret (version + 1), creating
/// its folder if needed.
async fn put_secret(State(app): State<App>, req: Request) -> ApiResult {
    let r: SecretRef = body(req).await?;
    let Some(value) = r.value.clone() else {
        return Err(ApiError::bad_request("missing field `value`"));
    };
    let key = r.key.trim().to_owned();
    if key.is_empty() || key.contains('/') {
        return Err(ApiError::bad_request("invalid key"));
    }
    let path = normalize_path(r.path.as_deref().unwrap_or("/"));
    let mut st = app.store.write().await;
    let project = admin_project(&st, &r)?.clone();
    let now = now_ms();
    let secret = match st.find_secret(&project.id, &r.environment, &path, &key) {
        Some(existing) => Secret {
            value,
            comment: r.comment.clone().unwrap_or(existing.comment.clone()),
            version: existing.version + 1,
            updated_at: now,
            ..existing.clone()
        },
        None => Secret {
            id: random_uuid(),
            project_id: project.id.clone(),
            environment: r.environment.clone(),
            path: path.clone(),
            key,
            value,
            comment: r.comment.clone().unwrap_or_default(),
            version: 1,
            skip_multiline_encoding: false,
            reminder_note: None,
            reminder_repeat_days: None,
            created_at: now,
            updated_at: now,
        },
    };
    let mut tx = Tx::default();
    for folder in st.missing_folders(&project.id, &r.environment, &path) {
        tx.put(Record::Folder(folder));
    }
    tx.put(Record::Secret(secret.clone()));
    app.store.commit(&mut st, tx).await?;
    Ok(ok(&SecretOut {
        secret: SecretView::new(&secret, Shape::List, None),
    }))
}

/// `DELETE /admin/secrets`.
async fn delete_secret(State(app): State<App>, req: Request) -> ApiResult {
    let r: SecretRef = body(req).await?;
    let path = normalize_path(r.path.as_deref().unwrap_or("/"));
    let mut st = app.store.write().await;
    let project = admin_project(&st, &r)?.clone();
    let secret = st
        .find_secret(&project.id, &r.environment, &path, r.key.trim())
        .cloned()
        .ok_or_else(|| ApiError::not_found(format!("No secret {:?} in {path}", r.key)))?;
    let mut tx = Tx::default();
    tx.delete(Kind::Secret, &secret.id);
    app.store.commit(&mut st, tx).await?;
    Ok(ok(&SecretOut {
        secret: SecretView::new(&secret, Shape::List, None),
    }))
}
