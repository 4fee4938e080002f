//! Folders: `GET /api/v1/folders`, the sub-folders of a folder, as the
//! October 2024 server lists them (`workspaceId`, `environment`, `path` or
//! the older `directory`). The operator asks it to tell a folder that exists
//! and is empty from one that does not, on servers that list both as empty.
//! `POST /api/v1/folders` creates one folder (`name`) in an existing one
//! (`path`), as the documented v1 route does; a folder that exists already
//! is answered as it is. It needs write access to the new folder's path.
//!
//! An environment the project does not have is a 404. A parent folder that
//! does not exist lists no folders, as on that server; with
//! `missing_folders_not_found` it is a 404 naming the folder, as on current
//! servers.

use axum::extract::{Request, State};
use serde::Serialize;

use super::auth::caller;
use super::{ApiResult, check_read, folder_not_found, project_for};
use crate::app::App;
use crate::errors::{ApiError, ok};
use crate::model::Folder;
use crate::store::{Record, State as Db, Tx};
use crate::validate::{Fields, query_object, read_json};

const MISSING: &str = "Missing workspace id or environment";

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct FolderView {
    id: String,
    name: String,
    version: u32,
    env_id: String,
    parent_id: String,
    is_reserved: bool,
}

#[derive(Serialize)]
struct ListOut {
    folders: Vec<FolderView>,
}

/// `GET /api/v1/folders`.
pub(crate) async fn list(State(app): State<App>, req: Request) -> ApiResult {
    let caller = caller(&app, req.headers()).await?;
    let query = query_object(req.uri().query());
    let mut f = Fields::of(Some(&query));
    let workspace_id = f.optional_trimmed("workspaceId");
    let environment = f.optional_trimmed("environment");
    let path = f.secret_path("path");
    let directory = f.optional_trimmed("directory");
    f.optional_flag("recursive");
    f.finish()?;
    let path = match directory {
        Some(d) if path == "/" => crate::seed::normalize_path(&d),
        _ => path,
    };
    let (Some(workspace_id), Some(environment)) = (workspace_id, environment) else {
        return Err(ApiError::bad_request(MISSING));
    };
    let st = app.store.read().await;
    let project = project_for(&st, &caller, Some(&workspace_id), None, MISSING)?;
    check_read(&caller, &project.id, &environment, &path)?;
    let Some(env) = project.environment(&environment) else {
        return Err(ApiError::not_found(format!(
            "Environment with slug '{environment}' in project with ID '{}' not found",
            project.id
        )));
    };
    if !st.folder_exists(&project.id, &environment, &path) {
        if app.missing_folders_not_found {
            return Err(folder_not_found(&path, &environment));
        }
        return Ok(ok(&ListOut {
            folders: Vec::new(),
        }));
    }
    let parent_id = Db::folder_id(&project.id, &environment, &path);
    let prefix = if path == "/" {
        "/".to_owned()
    } else {
        format!("{path}/")
    };
    let folders = st
        .folders
        .values()
        .filter(|x| x.project_id == project.id && x.environment == environment)
        .filter_map(|x| {
            let name = x.path.strip_prefix(&prefix)?;
            (!name.is_empty() && !name.contains('/')).then(|| FolderView {
                id: x.id.clone(),
                name: name.to_owned(),
                version: 1,
                env_id: env.id.clone(),
                parent_id: parent_id.clone(),
                is_reserved: false,
            })
        })
        .collect();
    Ok(ok(&ListOut { folders }))
}

#[derive(Serialize)]
struct OneOut {
    folder: FolderView,
}

/// `POST /api/v1/folders`.
pub(crate) async fn create(State(app): State<App>, req: Request) -> ApiResult {
    let (parts, body) = req.into_parts();
    let caller = caller(&app, &parts.headers).await?;
    let body = read_json(&parts.headers, body).await?;
    let mut f = Fields::of(body.as_ref());
    let workspace_id = f.optional_trimmed("workspaceId");
    let environment = f.required_string("environment").trim().to_owned();
    let name = f.required_string("name").trim().to_owned();
    let path = f.secret_path("path");
    let directory = f.optional_trimmed("directory");
    f.optional_string("description");
    f.finish()?;
    let parent = match directory {
        Some(d) if path == "/" => crate::seed::normalize_path(&d),
        _ => path,
    };
    if name.is_empty() || name.contains('/') {
        return Err(ApiError::bad_request("Invalid folder name"));
    }
    let Some(workspace_id) = workspace_id else {
        return Err(ApiError::bad_request(MISSING));
    };
    let mut st = app.store.write().await;
    let project = project_for(&st, &caller, Some(&workspace_id), None, MISSING)?.clone();
    let Some(env) = project.environment(&environment).cloned() else {
        return Err(ApiError::not_found(format!(
            "Environment with slug '{environment}' in project with ID '{}' not found",
            project.id
        )));
    };
    let full = if parent == "/" {
        format!("/{name}")
    } else {
        format!("{parent}/{name}")
    };
    if !caller.may_write(&project.id, &environment, &full) {
        return Err(ApiError::permission_denied("create", "secretFolders"));
    }
    if !st.folder_exists(&project.id, &environment, &parent) {
        return Err(folder_not_found(&parent, &environment));
    }
    let view = FolderView {
        id: Db::folder_id(&project.id, &environment, &full),
        name,
        version: 1,
        env_id: env.id.clone(),
        parent_id: Db::folder_id(&project.id, &environment, &parent),
        is_reserved: false,
    };
    if !st.folder_exists(&project.id, &environment, &full) {
        let mut tx = Tx::default();
        tx.put(Record::Folder(Folder {
            id: view.id.clone(),
            project_id: project.id.clone(),
            environment: environment.clone(),
            path: full,
        }));
        app.store.commit(&mut st, tx).await?;
    }
    Ok(ok(&OneOut { folder: view }))
}
