//! The API routes, under `/api`, with the layers of `middleware` around
//! them, and what the handlers share: path parameters, the caller's
//! project, which tokens and rate-limit category each route has, and the 404
//! of unknown routes.

pub(crate) mod auth;
pub(crate) mod dynamic;
pub(crate) mod folders;
pub(crate) mod projects;
pub(crate) mod secrets;
pub(crate) mod subscribe;

use axum::Router;
use axum::extract::{FromRequestParts, Path, Request};
use axum::http::request::Parts;
use axum::middleware::{from_fn, from_fn_with_state};
use axum::response::Response;
use axum::routing::{get, post};
use serde::Serialize;

use crate::app::App;
use crate::clock::{iso, now_ms};
use crate::errors::{ApiError, ok};
use crate::middleware;
use crate::model::Project;
use crate::ratelimit::Category;
use crate::store::State;

pub(crate) use auth::Caller;

/// What a handler returns.
pub(crate) type ApiResult = Result<Response, ApiError>;

/// Every route, as `METHOD /template` (the keys of the request counters and
/// of route-scoped faults).
pub(crate) const ROUTES: &[&str] = &[
    "GET /api/status",
    "POST /api/v1/auth/universal-auth/login",
    "POST /api/v1/auth/kubernetes-auth/login",
    "POST /api/v1/auth/ldap-auth/login",
    "POST /api/v1/auth/aws-auth/login",
    "POST /api/v1/auth/azure-auth/login",
    "POST /api/v1/auth/gcp-auth/login",
    "POST /api/v1/auth/token/renew",
    "POST /api/v1/auth/token/revoke",
    "GET /api/v2/service-token",
    "GET /api/v2/workspace/:slug",
    "GET /api/v1/workspace/:workspaceId",
    "GET /api/v1/projects/slug/:slug",
    "GET /api/v1/folders",
    "POST /api/v1/folders",
    "POST /api/v1/events/subscribe/project-events",
    "GET /api/v4/secrets",
    "GET /api/v3/secrets/raw",
    "GET /api/v3/secrets/raw/:secretName",
    "POST /api/v3/secrets/raw/:secretName",
    "PATCH /api/v3/secrets/raw/:secretName",
    "DELETE /api/v3/secrets/raw/:secretName",
    "POST /api/v3/secrets/batch/raw",
    "PATCH /api/v3/secrets/batch/raw",
    "DELETE /api/v3/secrets/batch/raw",
    "GET /api/v1/dynamic-secrets",
    "GET /api/v1/dynamic-secrets/:name",
    "GET /api/v1/dynamic-secrets/:name/leases",
    "POST /api/v1/dynamic-secrets/leases",
    "GET /api/v1/dynamic-secrets/leases/:leaseId",
    "DELETE /api/v1/dynamic-secrets/leases/:leaseId",
    "POST /api/v1/dynamic-secrets/leases/:leaseId/renew",
];

/// The kinds of bearer token a route accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Accepts {
    /// No token (logins, `/api/status`).
    Nothing,
    /// Identity access tokens only.
    Identity,
    /// Identity access tokens and service tokens (the secret routes).
    IdentityOrServiceToken,
    /// Service tokens only (`GET /api/v2/service-token`).
    ServiceToken,
}

/// What the admission layer needs to know of a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RouteInfo {
    /// Its rate-limit category.
    pub category: Category,
    /// The tokens it accepts.
    pub accepts: Accepts,
}

/// The category and accepted tokens of a route key (`METHOD /template`, or
/// `METHOD *` for an unknown route). As on the real server, every secret
/// route is in the `secrets` category, logins and lease writes are writes,
/// and the events subscription is a read.
pub(crate) fn route_info(key: &str) -> RouteInfo {
    let (method, path) = key.split_once(' ').unwrap_or((key, ""));
    let exempt = RouteInfo {
        category: Category::Exempt,
        accepts: Accepts::Nothing,
    };
    if path == "*" || path == "/api/status" || !path.starts_with("/api/") {
        return exempt;
    }
    if path.starts_with("/api/v1/auth/") {
        return RouteInfo {
            category: Category::Write,
            accepts: Accepts::Nothing,
        };
    }
    if path.starts_with("/api/v3/secrets/")
        || path.starts_with("/api/v4/secrets")
        || path == "/api/v1/folders"
    {
        return RouteInfo {
            category: Category::Secrets,
            accepts: Accepts::IdentityOrServiceToken,
        };
    }
    let accepts = if path == "/api/v2/service-token" {
        Accepts::ServiceToken
    } else {
        Accepts::Identity
    };
    let read = method == "GET" || method == "HEAD" || path.starts_with("/api/v1/events/");
    RouteInfo {
        category: if read {
            Category::Read
        } else {
            Category::Write
        },
        accepts,
    }
}

/// The whole router: the API with its layers, and the admin API.
pub(crate) fn router(app: App) -> Router {
    let api = Router::new()
        .route("/api/status", get(status))
        .route(
            "/api/v1/auth/universal-auth/login",
            post(auth::universal_login),
        )
        .route(
            "/api/v1/auth/kubernetes-auth/login",
            post(auth::kubernetes_login),
        )
        .route("/api/v1/auth/ldap-auth/login", post(auth::ldap_login))
        .route("/api/v1/auth/aws-auth/login", post(auth::aws_login))
        .route("/api/v1/auth/azure-auth/login", post(auth::azure_login))
        .route("/api/v1/auth/gcp-auth/login", post(auth::gcp_login))
        .route("/api/v1/auth/token/renew", post(auth::renew))
        .route("/api/v1/auth/token/revoke", post(auth::revoke))
        .route("/api/v2/service-token", get(projects::service_token))
        .route("/api/v2/workspace/{slug}", get(projects::by_slug))
        .route("/api/v1/workspace/{workspaceId}", get(projects::by_id))
        .route("/api/v1/projects/slug/{slug}", get(projects::by_slug))
        .route("/api/v1/folders", get(folders::list).post(folders::create))
        .route(
            "/api/v1/events/subscribe/project-events",
            post(subscribe::subscribe),
        )
        .route("/api/v4/secrets", get(secrets::list_v4))
        .route("/api/v3/secrets/raw", get(secrets::list))
        .route(
            "/api/v3/secrets/raw/{secretName}",
            get(secrets::get_one)
                .post(secrets::create)
                .patch(secrets::update)
                .delete(secrets::delete),
        )
        .route(
            "/api/v3/secrets/batch/raw",
            post(secrets::batch_create)
                .patch(secrets::batch_update)
                .delete(secrets::batch_delete),
        )
        .route("/api/v1/dynamic-secrets", get(dynamic::list))
        .route("/api/v1/dynamic-secrets/{name}", get(dynamic::get_one))
        .route(
            "/api/v1/dynamic-secrets/{name}/leases",
            get(dynamic::leases_of),
        )
        .route(
            "/api/v1/dynamic-secrets/leases",
            post(dynamic::create_lease),
        )
        .route(
            "/api/v1/dynamic-secrets/leases/{leaseId}",
            get(dynamic::get_lease).delete(dynamic::revoke_lease),
        )
        .route(
            "/api/v1/dynamic-secrets/leases/{leaseId}/renew",
            post(dynamic::renew_lease),
        )
        .fallback(route_not_found)
        .method_not_allowed_fallback(route_not_found)
        .layer(from_fn(middleware::not_modified))
        .layer(from_fn_with_state(app.clone(), middleware::admit))
        .layer(from_fn_with_state(app.clone(), middleware::inject))
        .layer(from_fn_with_state(app.clone(), middleware::count))
        .with_state(app.clone());
    api.nest("/admin", crate::admin::router(app))
}

#[derive(Serialize)]
struct StatusOut {
    date: String,
    message: &'static str,
}

/// `GET /api/status`: the server is up.
async fn status() -> Response {
    ok(&StatusOut {
        date: iso(now_ms()),
        message: "Ok",
    })
}

/// The real server's 404 for a route it does not have.
async fn route_not_found(req: Request) -> ApiError {
    let target = req
        .uri()
        .path_and_query()
        .map_or_else(|| req.uri().path().to_owned(), |pq| pq.as_str().to_owned());
    ApiError::route_not_found(req.method().as_str(), &target)
}

/// The single path parameter of a route, percent-decoded.
pub(crate) struct Param(pub String);

impl<S: Send + Sync> FromRequestParts<S> for Param {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match Path::<String>::from_request_parts(parts, state).await {
            Ok(Path(value)) => Ok(Param(value)),
            Err(_) => Err(ApiError::bad_request("Invalid path parameter")),
        }
    }
}

/// The project named by id or slug, if the caller is a member. An unknown
/// id is refused like a project the caller is not a member of (as on the
/// real server, which checks membership by id first).
pub(crate) fn project_for<'s>(
    st: &'s State,
    caller: &Caller,
    id: Option<&str>,
    slug: Option<&str>,
    missing: &str,
) -> Result<&'s Project, ApiError> {
    let project = match (id, slug) {
        (Some(id), _) => st.project(id).ok_or_else(|| ApiError::not_member(id))?,
        (None, Some(slug)) => st
            .project_by_slug(slug)
            .ok_or_else(|| ApiError::not_found(format!("Project with slug '{slug}' not found")))?,
        (None, None) => return Err(ApiError::bad_request(missing)),
    };
    if !caller.member_of(&project.id) {
        return Err(ApiError::not_member(&project.id));
    }
    Ok(project)
}

/// Refuse a read of a folder the caller may not read (outside a path-scoped
/// identity's folders or a service token's scope).
pub(crate) fn check_read(
    caller: &Caller,
    project_id: &str,
    environment: &str,
    path: &str,
) -> Result<(), ApiError> {
    if caller.may_read(project_id, environment, path) {
        Ok(())
    } else {
        Err(ApiError::permission_denied("read", "secrets"))
    }
}

/// Refuse a write to a folder the caller may not write.
pub(crate) fn check_write(
    caller: &Caller,
    project_id: &str,
    environment: &str,
    path: &str,
    action: &str,
) -> Result<(), ApiError> {
    if caller.may_write(project_id, environment, path) {
        Ok(())
    } else {
        Err(ApiError::permission_denied(action, "secrets"))
    }
}

/// The 404 of a folder that does not exist.
pub(crate) fn folder_not_found(path: &str, environment: &str) -> ApiError {
    ApiError::not_found(format!(
        "Folder with path '{path}' in environment with slug '{environment}' not found"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_have_categories_and_tokens() {
        let info = |k: &str| {
            let i = route_info(k);
            (i.category, i.accepts)
        };
        assert_eq!(
            info("GET /api/v3/secrets/raw"),
            (Category::Secrets, Accepts::IdentityOrServiceToken)
        );
        assert_eq!(
            info("PATCH /api/v3/secrets/batch/raw"),
            (Category::Secrets, Accepts::IdentityOrServiceToken)
        );
        assert_eq!(
            info("GET /api/v4/secrets"),
            (Category::Secrets, Accepts::IdentityOrServiceToken)
        );
        assert_eq!(
            info("POST /api/v1/auth/universal-auth/login"),
            (Category::Write, Accepts::Nothing)
        );
        assert_eq!(
            info("GET /api/v2/workspace/:slug"),
            (Category::Read, Accepts::Identity)
        );
        assert_eq!(
            info("POST /api/v1/dynamic-secrets/leases"),
            (Category::Write, Accepts::Identity)
        );
        assert_eq!(
            info("POST /api/v1/events/subscribe/project-events"),
            (Category::Read, Accepts::Identity)
        );
        assert_eq!(
            info("GET /api/v2/service-token"),
            (Category::Read, Accepts::ServiceToken)
        );
        assert_eq!(info("GET /api/status").0, Category::Exempt);
        assert_eq!(info("GET *").0, Category::Exempt);
        for route in ROUTES {
            assert!(route.contains(" /api/"), "{route}");
        }
    }
}
