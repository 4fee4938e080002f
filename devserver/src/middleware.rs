//! The layers around every API route, outermost first: counting answers for
//! the admin API, injecting faults, and turning a `200` whose `ETag` the
//! client already has (`If-None-Match`) into `304 Not Modified`.

use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::app::App;
use crate::faults::Action;

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

/// Count every answer by route and status (`dropped` for a dropped
/// connection).
pub(crate) async fn count(State(app): State<App>, req: Request, next: Next) -> Response {
    let key = route_key(&req);
    let resp = next.run(req).await;
    let status = if resp.extensions().get::<DropConnection>().is_some() {
        "dropped".to_owned()
    } else {
        resp.status().as_u16().to_string()
    };
    app.stats.record(key, status);
    resp
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
        for (name, value) in [
            ("x-ratelimit-limit", limit.to_string()),
            ("x-ratelimit-remaining", remaining.to_string()),
            ("x-ratelimit-reset", reset.to_string()),
        ] {
            if let Ok(v) = HeaderValue::from_str(&value) {
                resp.headers_mut().insert(HeaderName::from_static(name), v);
            }
        }
    }
    resp
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
    fn if_none_match_lists() {
        assert!(etag_listed(b"\"a\"", b"\"a\""));
        assert!(etag_listed(b"\"x\", W/\"a\"", b"\"a\""));
        assert!(etag_listed(b"*", b"\"a\""));
        assert!(!etag_listed(b"\"b\"", b"\"a\""));
        assert!(!etag_listed(b"a", b"\"a\""));
    }
}
