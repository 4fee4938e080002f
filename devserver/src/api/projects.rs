//! Projects: by slug (`GET /api/v2/workspace/:slug` and, as newer servers
//! have it, `GET /api/v1/projects/slug/:slug`, both the project object
//! itself) and by id (`GET /api/v1/workspace/:workspaceId`, wrapped in
//! `workspace`), with their environments; and the record of a service token
//! (`GET /api/v2/service-token`), which names its project in `workspace`.

use axum::extract::{Request, State};
use serde::Serialize;

use super::auth::caller;
use super::{ApiResult, Param, project_for};
use crate::app::App;
use crate::errors::{ApiError, ok};
use crate::views::{ProjectView, ServiceTokenView};

#[derive(Serialize)]
struct WorkspaceOut<'a> {
    workspace: ProjectView<'a>,
}

/// `GET /api/v2/workspace/:slug` and `GET /api/v1/projects/slug/:slug`.
pub(crate) async fn by_slug(State(app): State<App>, Param(slug): Param, req: Request) -> ApiResult {
    let caller = caller(&app, req.headers()).await?;
    let st = app.store.read().await;
    let project = project_for(&st, &caller, None, Some(&slug), "Missing project slug")?;
    Ok(ok(&ProjectView::new(project)))
}

/// `GET /api/v1/workspace/:workspaceId`.
pub(crate) async fn by_id(State(app): State<App>, Param(id): Param, req: Request) -> ApiResult {
    let caller = caller(&app, req.headers()).await?;
    let st = app.store.read().await;
    let project = project_for(&st, &caller, Some(&id), None, "Missing workspace id")?;
    Ok(ok(&WorkspaceOut {
        workspace: ProjectView::new(project),
    }))
}

/// `GET /api/v2/service-token` (service tokens only).
pub(crate) async fn service_token(State(app): State<App>, req: Request) -> ApiResult {
    let caller = caller(&app, req.headers()).await?;
    let Some(token) = caller.service_token() else {
        return Err(ApiError::bad_request("Service token not found"));
    };
    Ok(ok(&ServiceTokenView::new(token)))
}
