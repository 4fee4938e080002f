//! Projects: by slug (`GET /api/v2/workspace/:slug`, the project object
//! itself) and by id (`GET /api/v1/workspace/:workspaceId`, wrapped in
//! `workspace`), with their environments.

use axum::extract::{Request, State};
use serde::Serialize;

use super::auth::caller;
use super::{ApiResult, Param, project_for};
use crate::app::App;
use crate::errors::ok;
use crate::views::ProjectView;

#[derive(Serialize)]
struct WorkspaceOut<'a> {
    workspace: ProjectView<'a>,
}

/// `GET /api/v2/workspace/:slug`.
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
