//! The layers around every API route, outermost first: counting answers for
//! the admin API, injecting faults, admitting requests (the kind of token a
//! route accepts, then the rate limits), and turning a `200` whose `ETag`
//! the client already has (`If-None-Match`) into `304 Not Modified`.

use std::time::Instant;

use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::api::auth::{authenticates, bearer, is_service_token};
use crate::api::{Accepts, route_info};
use crate::app::App;
use crate::errors::ApiError;
use crate::faults::Action;
use crate::ratelimit::{Category, Verdict};
use crate::server::Peer;
use crate::validate::query_object;

/// Marks a response that must not be sent: the connection is closed instead.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DropConnection;

/// `METHOD /route/:param` of a request, or `METHOD *` for a path no route
/// matches.
pub(crate) fn route_key(req: &Request) -> String {
    let method = req.method().as_str();
    match req.extensions().get::<MatchedPath>() {
        Some(path) => format!("{method} {}", template(path.as_str())),
        None => format!("{method} *"),
    }
}

/// A router path (`/raw/{secretName}`) in the API's notation (`/raw/:secretName`).
pub(crate) fn template(path: &str) -> String {
    path.split('/')
        .map(
            |seg| match seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
                Some(name) => format!(":{name}"),
                None => seg.to_owned(),
            },
        )
        .collect::<Vec<_>>()
        .join("/")
}

/// The routes that list a folder.
const LISTS: [&str; 2] = ["GET /api/v3/secrets/raw", "GET /api/v4/secrets"];

/// Count every answer by route and status (`dropped` for a dropped
/// connection), and every folder a list read.
pub(crate) async fn count(State(app): State<App>, req: Request, next: Next) -> Response {
    let key = route_key(&req);
    let folder = LISTS
        .contains(&key.as_str())
        .then(|| folder_of(req.uri().query()));
    let resp = next.run(req).await;
    let dropped = resp.extensions().get::<DropConnection>().is_some();
    let status = if dropped {
        "dropped".to_owned()
    } else {
        resp.status().as_u16().to_string()
    };
    if let Some(folder) = folder
        && !dropped
        && matches!(resp.status(), StatusCode::OK | StatusCode::NOT_MODIFIED)
    {
        app.stats.record_folder_read(folder);
    }
    app.stats.record(key, status);
    resp
}

/// The folder a list's query names: project (slug or id), environment and
/// path (`/` when absent), as the query spells them.
fn folder_of(query: Option<&str>) -> String {
    let q = query_object(query);
    let field = |names: &[&str]| {
        names
            .iter()
            .find_map(|n| q[*n].as_str())
            .unwrap_or_default()
            .to_owned()
    };
    let path = field(&["secretPath"]);
    format!(
        "{}/{}:{}",
        field(&["workspaceSlug", "workspaceId", "projectSlug", "projectId"]),
        field(&["environment"]),
        if path.is_empty() { "/" } else { &path }
    )
}

/// Apply the faults in force.
pub(crate) async fn inject(State(app): State<App>, req: Request, next: Next) -> Response {
    let decision = app.faults.decide(&route_key(&req));
    if !decision.latency.is_zero() {
        tokio::time::sleep(decision.latency).await;
    }
    match decision.action {
        Action::Pass => {}
        Action::Drop => {
            let mut resp = Response::new(Body::empty());
            resp.extensions_mut().insert(DropConnection);
            return resp;
        }
        Action::Fail(error) => return error.into_response(),
    }
    let mut resp = next.run(req).await;
    if let Some((limit, remaining, reset)) = decision.rate_headers {
        rate_headers(resp.headers_mut(), limit, remaining, reset);
    }
    resp
}

fn rate_headers(headers: &mut HeaderMap, limit: u32, remaining: u32, reset: u64) {
    for (name, value) in [
        ("x-ratelimit-limit", limit.to_string()),
        ("x-ratelimit-remaining", remaining.to_string()),
        ("x-ratelimit-reset", reset.to_string()),
    ] {
        if let Ok(v) = HeaderValue::from_str(&value) {
            headers.insert(HeaderName::from_static(name), v);
        }
    }
}

/// Refuse a kind of token the route does not accept (403, as the real
/// server's route guard), then apply the rate limits to requests that
/// authenticate.
pub(crate) async fn admit(State(app): State<App>, req: Request, next: Next) -> Response {
    let key = route_key(&req);
    let info = route_info(&key);
    if let Some(token) = bearer(req.headers()) {
        let service = is_service_token(token);
        let refused = match info.accepts {
            Accepts::Identity => service,
            Accepts::ServiceToken => !service,
            Accepts::Nothing | Accepts::IdentityOrServiceToken => false,
        };
        if refused {
            let target = req
                .uri()
                .path_and_query()
                .map_or_else(|| req.uri().path().to_owned(), |pq| pq.as_str().to_owned());
            return ApiError::unauthorized_access(&target).into_response();
        }
    }
    if info.category == Category::Exempt || !app.limiter.enabled() {
        return next.run(req).await;
    }
    if info.accepts != Accepts::Nothing && !authenticates(&app, req.headers()).await {
        // Refused by the handler before any rate limit, as on the real
        // server.
        return next.run(req).await;
    }
    let client = client_of(&req);
    match app
        .limiter
        .check(&client, &key, info.category, Instant::now())
    {
        None => next.run(req).await,
        Some(Verdict::Limited { limit, retry_after }) => {
            app.stats.record_limited(key);
            ApiError::rate_limited(limit, retry_after).into_response()
        }
        Some(Verdict::Allowed {
            limit,
            remaining,
            reset,
        }) => {
            let mut resp = next.run(req).await;
            rate_headers(resp.headers_mut(), limit, remaining, reset);
            resp
        }
    }
}

/// The client of a request: the first address of `X-Forwarded-For`, else
/// the peer's IP.
fn client_of(req: &Request) -> String {
    let forwarded = req
        .headers()
        .get("x-forwarded-for")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(',').next())
        .map(str::trim)
        .filter(|v| !v.is_empty());
    match forwarded {
        Some(addr) => addr.to_owned(),
        None => req
            .extensions()
            .get::<Peer>()
            .map_or_else(String::new, |p| p.0.ip().to_string()),
    }
}

/// Answer `304` (same headers, no body) to a `GET` whose `If-None-Match`
/// names the `ETag` of the `200` it would get.
pub(crate) async fn not_modified(req: Request, next: Next) -> Response {
    let conditional = matches!(*req.method(), Method::GET | Method::HEAD);
    let wanted = req.headers().get(header::IF_NONE_MATCH).cloned();
    let resp = next.run(req).await;
    let (Some(wanted), true) = (wanted, conditional && resp.status() == StatusCode::OK) else {
        return resp;
    };
    let Some(etag) = resp.headers().get(header::ETAG) else {
        return resp;
    };
    if !etag_listed(wanted.as_bytes(), etag.as_bytes()) {
        return resp;
    }
    let (mut parts, _) = resp.into_parts();
    parts.status = StatusCode::NOT_MODIFIED;
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::empty())
}

/// Whether `etag` is one of the tags of an `If-None-Match` header (`*`
/// matches any; weak tags compare by their opaque part).
fn etag_listed(header: &[u8], etag: &[u8]) -> bool {
    let Ok(header) = std::str::from_utf8(header) else {
        return false;
    };
    let Ok(etag) = std::str::from_utf8(etag) else {
        return false;
    };
    let strip = |t: &str| t.trim().trim_start_matches("W/").to_owned();
    let etag = strip(etag);
    header
        .split(',')
        .any(|t| t.trim() == "*" || strip(t) == etag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates() {
        assert_eq!(
            template("/api/v3/secrets/raw/{secretName}"),
            "/api/v3/secrets/raw/:secretName"
        );
        assert_eq!(template("/api/v3/secrets/raw"), "/api/v3/secrets/raw");
    }

    #[test]
    fn a_folder_is_its_project_environment_and_path() {
        let a = folder_of(Some(
            "workspaceSlug=p&environment=dev&secretPath=%2Fapps%2Fa",
        ));
        assert_eq!(a, "p/dev:/apps/a");
        assert_eq!(
            folder_of(Some(
                "environment=dev&secretPath=/apps/a&workspaceSlug=p&recursive=true"
            )),
            a,
            "the order of the query and other fields do not matter"
        );
        assert_eq!(
            folder_of(Some("projectSlug=p&environment=dev&secretPath=%2Fapps%2Fb")),
            "p/dev:/apps/b"
        );
        assert_eq!(
            folder_of(Some("workspaceId=42&environment=prod")),
            "42/prod:/"
        );
        assert_eq!(folder_of(None), "/:/");
    }

    #[test]
    fn if_none_match_lists() {
        assert!(etag_listed(b"\"a\"", b"\"a\""));
        assert!(etag_listed(b"\"x\", W/\"a\"", b"\"a\""));
        assert!(etag_listed(b"*", b"\"a\""));
        assert!(!etag_listed(b"\"b\"", b"\"a\""));
        assert!(!etag_listed(b"a", b"\"a\""));
    }
}
