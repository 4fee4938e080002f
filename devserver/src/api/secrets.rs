//! Secrets: the v3 raw routes — list (with sub-folders, imports and
//! expanded references), get, create, update, delete, and the batch forms —
//! and the v4 list. Folders a write needs are created on the way; a list of
//! a folder or environment that does not exist is empty, as on the recorded
//! (October 2024) server, or a 404 `NotFound` naming the folder, as on
//! current servers, when the server runs with `missing_folders_not_found`.
//!
//! Access: a path-scoped identity, or a service token, may only use the
//! folders its globs match. A plain list, a get or a write of another folder
//! is refused with 403 `PermissionDenied`; a recursive list leaves out the
//! secrets of such folders, and so do import blocks and expanded references.
//! A service token whose scope is one folder (no glob) lists and gets that
//! folder whatever the query names, as on the real server.

use std::collections::BTreeSet;

use axum::extract::{Request, State};
use serde::Serialize;
use serde_json::json;

use super::auth::caller;
use super::{ApiResult, Caller, Param, check_read, check_write, folder_not_found, project_for};
use crate::app::App;
use crate::clock::now_ms;
use crate::errors::{ApiError, ok};
use crate::expand::Expander;
use crate::ids::random_uuid;
use crate::model::{Project, Secret};
use crate::scope::is_glob;
use crate::seed::normalize_path;
use crate::store::{Kind, Record, State as Db, Tx};
use crate::validate::{Fields, clean_value, query_object, read_json};
use crate::views::{ImportView, SecretView, Shape};

const MISSING_READ: &str = "Missing workspace id or environment";
const MISSING_READ_V4: &str = "Missing project id or environment";
const MISSING_WRITE: &str = "Missing workspace id or project slug";

#[derive(Serialize)]
struct ListOut {
    secrets: Vec<SecretView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    imports: Option<Vec<ImportView>>,
}

#[derive(Serialize)]
struct EmptyListOut {
    secrets: [(); 0],
    imports: [(); 0],
}

#[derive(Serialize)]
struct OneOut {
    secret: SecretView,
}

#[derive(Serialize)]
struct ManyOut {
    secrets: Vec<SecretView>,
}

/// The project, environment and folder of a write.
struct Target {
    workspace_id: Option<String>,
    project_slug: Option<String>,
    environment: String,
    path: String,
}

impl Target {
    fn read(f: &mut Fields<'_>) -> Target {
        Target {
            workspace_id: f.optional_trimmed("workspaceId"),
            project_slug: f.optional_trimmed("projectSlug"),
            environment: f.required_string("environment").trim().to_owned(),
            path: f.secret_path("secretPath"),
        }
    }

    /// The project, which must have the environment, if the caller may
    /// `action` (create, edit, delete) in the folder.
    fn project(&self, st: &Db, caller: &Caller, action: &str) -> Result<Project, ApiError> {
        let workspace_id = self
            .workspace_id
            .clone()
            .or_else(|| own_project(caller, self.project_slug.as_deref()));
        let project = project_for(
            st,
            caller,
            workspace_id.as_deref(),
            self.project_slug.as_deref(),
            MISSING_WRITE,
        )?;
        check_write(caller, &project.id, &self.environment, &self.path, action)?;
        if project.environment(&self.environment).is_none() {
            return Err(folder_not_found(&self.path, &self.environment));
        }
        Ok(project.clone())
    }

    /// Creating secrets in a folder that does not exist: current servers
    /// refuse it (`missing_folders_not_found`); older ones create the folder.
    fn folder_for_create(&self, app: &App, st: &Db, project: &Project) -> Result<(), ApiError> {
        if app.missing_folders_not_found
            && !st.folder_exists(&project.id, &self.environment, &self.path)
        {
            return Err(folder_not_found(&self.path, &self.environment));
        }
        Ok(())
    }
}

/// A service token's project when the request names none.
fn own_project(caller: &Caller, slug: Option<&str>) -> Option<String> {
    match (caller.service_token(), slug) {
        (Some(t), None) => Some(t.project_id.clone()),
        _ => None,
    }
}

/// Project, environment and folder of a read. A service token scoped to one
/// folder reads that folder, whatever the query says.
struct ReadPlace {
    project_id: Option<String>,
    project_slug: Option<String>,
    environment: Option<String>,
    path: String,
}

impl ReadPlace {
    fn resolve(mut self, caller: &Caller) -> ReadPlace {
        if let Some(t) = caller.service_token() {
            if !is_glob(&t.path) {
                self.project_id = Some(t.project_id.clone());
                self.project_slug = None;
                self.environment = Some(t.environment.clone());
                self.path = t.path.clone();
            } else if self.project_id.is_none() && self.project_slug.is_none() {
                self.project_id = Some(t.project_id.clone());
            }
        }
        self
    }
}

fn secret_not_found(key: &str) -> ApiError {
    ApiError::not_found(format!("Secret with name '{key}' not found"))
}

/// The import blocks of a folder, without the secrets the caller may not
/// read.
fn import_blocks(
    st: &Db,
    caller: &Caller,
    project_id: &str,
    environment: &str,
    path: &str,
    expander: Option<&Expander<'_>>,
) -> Vec<ImportView> {
    st.imports_of(project_id, environment, path)
        .into_iter()
        .map(|i| ImportView {
            secret_path: i.import_path.clone(),
            environment: i.import_environment.clone(),
            folder_id: Db::folder_id(project_id, &i.import_environment, &i.import_path),
            secrets: st
                .secrets_in(project_id, &i.import_environment, &i.import_path, false)
                .into_iter()
                .filter(|s| caller.may_read(project_id, &s.environment, &s.path))
                .map(|s| {
                    let value = expander.map(|x| x.expand(&s.environment, &s.path, &s.value));
                    SecretView::new(s, Shape::Imported, value)
                })
                .collect(),
        })
        .collect()
}

/// What a list asks for.
struct ListQuery {
    place: ReadPlace,
    recursive: bool,
    include_imports: bool,
    expand: bool,
    missing: &'static str,
}

/// A list, v3 or v4.
async fn list_secrets(app: &App, caller: &Caller, q: ListQuery) -> ApiResult {
    let place = q.place.resolve(caller);
    let Some(environment) = place.environment else {
        return Err(ApiError::bad_request(q.missing));
    };
    let path = place.path;
    let st = app.store.read().await;
    let project = project_for(
        &st,
        caller,
        place.project_id.as_deref(),
        place.project_slug.as_deref(),
        q.missing,
    )?;
    if !q.recursive {
        check_read(caller, &project.id, &environment, &path)?;
    }
    if project.environment(&environment).is_none()
        || !st.folder_exists(&project.id, &environment, &path)
    {
        if app.missing_folders_not_found {
            return Err(folder_not_found(&path, &environment));
        }
        return Ok(ok(&EmptyListOut {
            secrets: [],
            imports: [],
        }));
    }
    let visible = |env: &str, folder: &str| caller.may_read(&project.id, env, folder);
    let expander = q
        .expand
        .then(|| Expander::new(&st, &project.id).with_filter(&visible));
    let secrets = st
        .secrets_in(&project.id, &environment, &path, q.recursive)
        .into_iter()
        .filter(|s| visible(&s.environment, &s.path))
        .map(|s| {
            let value = expander
                .as_ref()
                .map(|x| x.expand(&s.environment, &s.path, &s.value));
            SecretView::new(s, Shape::List, value)
        })
        .collect();
    let imports = q.include_imports.then(|| {
        import_blocks(
            &st,
            caller,
            &project.id,
            &environment,
            &path,
            expander.as_ref(),
        )
    });
    Ok(ok(&ListOut { secrets, imports }))
}

/// `GET /api/v3/secrets/raw`.
pub(crate) async fn list(State(app): State<App>, req: Request) -> ApiResult {
    let caller = caller(&app, req.headers()).await?;
    let query = query_object(req.uri().query());
    let mut f = Fields::of(Some(&query));
    let place = ReadPlace {
        project_id: f.optional_trimmed("workspaceId"),
        project_slug: f.optional_trimmed("workspaceSlug"),
        environment: f.optional_trimmed("environment"),
        path: f.secret_path("secretPath"),
    };
    let recursive = f.flag("recursive");
    let include_imports = f.flag("include_imports");
    let expand = f.flag("expandSecretReferences");
    f.finish()?;
    list_secrets(
        &app,
        &caller,
        ListQuery {
            place,
            recursive,
            include_imports,
            expand,
            missing: MISSING_READ,
        },
    )
    .await
}

/// `GET /api/v4/secrets`, as newer servers serve it: `projectId` (no slug),
/// imports and expanded references by default, `includeImports` or
/// `include_imports` to choose. `viewSecretValue`, `tagSlugs` and
/// `metadataFilter` are accepted and have no effect.
pub(crate) async fn list_v4(State(app): State<App>, req: Request) -> ApiResult {
    let caller = caller(&app, req.headers()).await?;
    let query = query_object(req.uri().query());
    let mut f = Fields::of(Some(&query));
    let place = ReadPlace {
        project_id: f.optional_trimmed("projectId"),
        project_slug: None,
        environment: f.optional_trimmed("environment"),
        path: f.secret_path("secretPath"),
    };
    let recursive = f.flag("recursive");
    let new_spelling = f.optional_flag("includeImports");
    let old_spelling = f.optional_flag("include_imports");
    let expand = f.optional_flag("expandSecretReferences").unwrap_or(true);
    f.optional_flag("viewSecretValue");
    f.optional_flag("includePersonalOverrides");
    f.optional_string("tagSlugs");
    f.optional_string("metadataFilter");
    f.finish()?;
    list_secrets(
        &app,
        &caller,
        ListQuery {
            place,
            recursive,
            include_imports: new_spelling.or(old_spelling).unwrap_or(true),
            expand,
            missing: MISSING_READ_V4,
        },
    )
    .await
}

/// `GET /api/v3/secrets/raw/:secretName`.
pub(crate) async fn get_one(State(app): State<App>, Param(name): Param, req: Request) -> ApiResult {
    let caller = caller(&app, req.headers()).await?;
    let query = query_object(req.uri().query());
    let mut f = Fields::of(Some(&query));
    let place = ReadPlace {
        project_id: f.optional_trimmed("workspaceId"),
        project_slug: f.optional_trimmed("workspaceSlug"),
        environment: f.optional_trimmed("environment"),
        path: f.secret_path("secretPath"),
    };
    let kind = f.one_of("type", &["shared", "personal"], "shared");
    let version = f.optional_trimmed("version");
    let expand = f.flag("expandSecretReferences");
    let include_imports = f.flag("include_imports");
    f.finish()?;
    let place = place.resolve(&caller);
    let Some(environment) = place.environment else {
        return Err(ApiError::bad_request(MISSING_READ));
    };
    let path = place.path;
    let key = name.trim();
    let st = app.store.read().await;
    let project = project_for(
        &st,
        &caller,
        place.project_id.as_deref(),
        place.project_slug.as_deref(),
        MISSING_READ,
    )?;
    check_read(&caller, &project.id, &environment, &path)?;
    let visible = |env: &str, folder: &str| caller.may_read(&project.id, env, folder);
    let mut found = st.find_secret(&project.id, &environment, &path, key);
    if found.is_none() && include_imports {
        found = st
            .imports_of(&project.id, &environment, &path)
            .into_iter()
            .filter(|i| visible(&i.import_environment, &i.import_path))
            .find_map(|i| st.find_secret(&project.id, &i.import_environment, &i.import_path, key));
    }
    let secret = found
        .filter(|_| kind == "shared")
        .filter(|s| version.as_ref().is_none_or(|v| *v == s.version.to_string()))
        .ok_or_else(|| secret_not_found(key))?;
    let value = expand.then(|| {
        Expander::new(&st, &project.id)
            .with_filter(&visible)
            .expand(&secret.environment, &secret.path, &secret.value)
    });
    Ok(ok(&OneOut {
        secret: SecretView::new(secret, Shape::Get, value),
    }))
}

/// `POST /api/v3/secrets/raw/:secretName`.
pub(crate) async fn create(State(app): State<App>, Param(name): Param, req: Request) -> ApiResult {
    let (parts, body) = req.into_parts();
    let caller = caller(&app, &parts.headers).await?;
    let body = read_json(&parts.headers, body).await?;
    let mut f = Fields::of(body.as_ref());
    let key = name.trim().to_owned();
    if key.is_empty() {
        f.param_too_small("secretName");
    }
    let target = Target::read(&mut f);
    let value = f.required_string("secretValue");
    let comment = f.optional_string("secretComment");
    let skip = f.nullable_bool("skipMultilineEncoding");
    let kind = f.one_of("type", &["shared", "personal"], "shared");
    let reminder_days = f.nullable_count("secretReminderRepeatDays");
    let reminder_note = f.nullable_string("secretReminderNote");
    f.finish()?;
    if kind == "personal" {
        return Err(ApiError::bad_request(
            "Must be user to create personal secret",
        ));
    }
    let mut st = app.store.write().await;
    let project = target.project(&st, &caller, "create")?;
    target.folder_for_create(&app, &st, &project)?;
    if st
        .find_secret(&project.id, &target.environment, &target.path, &key)
        .is_some()
    {
        return Err(ApiError::bad_request("Secret already exist"));
    }
    let now = now_ms();
    let secret = Secret {
        id: random_uuid(),
        project_id: project.id.clone(),
        environment: target.environment.clone(),
        path: target.path.clone(),
        key,
        value: clean_value(&value),
        comment: comment.unwrap_or_default(),
        version: 1,
        skip_multiline_encoding: skip.flatten().unwrap_or(false),
        reminder_note: reminder_note.flatten(),
        reminder_repeat_days: reminder_days.flatten(),
        created_at: now,
        updated_at: now,
    };
    let mut tx = Tx::default();
    for folder in st.missing_folders(&project.id, &target.environment, &target.path) {
        tx.put(Record::Folder(folder));
    }
    tx.put(Record::Secret(secret.clone()));
    app.store.commit(&mut st, tx).await?;
    Ok(ok(&OneOut {
        secret: SecretView::new(&secret, Shape::Write, None),
    }))
}

/// `PATCH /api/v3/secrets/raw/:secretName`. The recorded server requires
/// `secretValue`, and its answer shows `secretComment` as sent (empty when
/// not sent) whatever the stored comment is; both are reproduced.
pub(crate) async fn update(State(app): State<App>, Param(name): Param, req: Request) -> ApiResult {
    let (parts, body) = req.into_parts();
    let caller = caller(&app, &parts.headers).await?;
    let body = read_json(&parts.headers, body).await?;
    let mut f = Fields::of(body.as_ref());
    let key = name.trim().to_owned();
    if key.is_empty() {
        f.param_too_small("secretName");
    }
    let target = Target::read(&mut f);
    let value = f.required_string("secretValue");
    let comment = f.optional_string("secretComment");
    let new_name = f.optional_trimmed("newSecretName");
    let skip = f.nullable_bool("skipMultilineEncoding");
    let kind = f.one_of("type", &["shared", "personal"], "shared");
    let reminder_days = f.nullable_count("secretReminderRepeatDays");
    let reminder_note = f.nullable_string("secretReminderNote");
    f.finish()?;
    let mut st = app.store.write().await;
    let project = target.project(&st, &caller, "edit")?;
    let existing = st
        .find_secret(&project.id, &target.environment, &target.path, &key)
        .filter(|_| kind == "shared")
        .cloned()
        .ok_or_else(|| secret_not_found(&key))?;
    if let Some(n) = &new_name
        && *n != key
        && st
            .find_secret(&project.id, &target.environment, &target.path, n)
            .is_some()
    {
        return Err(ApiError::bad_request(
            "Secret with the new name already exist",
        ));
    }
    let updated = Secret {
        key: new_name.unwrap_or(existing.key.clone()),
        value: clean_value(&value),
        comment: comment.clone().unwrap_or(existing.comment.clone()),
        version: existing.version + 1,
        skip_multiline_encoding: skip
            .map_or(existing.skip_multiline_encoding, |s| s.unwrap_or(false)),
        reminder_note: reminder_note.unwrap_or(existing.reminder_note.clone()),
        reminder_repeat_days: reminder_days.unwrap_or(existing.reminder_repeat_days),
        updated_at: now_ms(),
        ..existing
    };
    app.store
        .commit(&mut st, Tx::one(Record::Secret(updated.clone())))
        .await?;
    Ok(ok(&OneOut {
        secret: SecretView::new(&updated, Shape::Write, None)
            .with_comment(comment.unwrap_or_default()),
    }))
}

/// `DELETE /api/v3/secrets/raw/:secretName` (JSON body).
pub(crate) async fn delete(State(app): State<App>, Param(name): Param, req: Request) -> ApiResult {
    let (parts, body) = req.into_parts();
    let caller = caller(&app, &parts.headers).await?;
    let body = read_json(&parts.headers, body).await?;
    let mut f = Fields::of(body.as_ref());
    let key = name.trim().to_owned();
    if key.is_empty() {
        f.param_too_small("secretName");
    }
    let target = Target::read(&mut f);
    let kind = f.one_of("type", &["shared", "personal"], "shared");
    f.finish()?;
    let mut st = app.store.write().await;
    let project = target.project(&st, &caller, "delete")?;
    let existing = st
        .find_secret(&project.id, &target.environment, &target.path, &key)
        .filter(|_| kind == "shared")
        .cloned()
        .ok_or_else(|| secret_not_found(&key))?;
    let mut tx = Tx::default();
    tx.delete(Kind::Secret, &existing.id);
    app.store.commit(&mut st, tx).await?;
    Ok(ok(&OneOut {
        secret: SecretView::new(&existing, Shape::Write, None),
    }))
}

/// An item of a batch write.
struct Item {
    key: String,
    value: Option<String>,
    path: Option<String>,
    comment: Option<String>,
    skip: Option<Option<bool>>,
    new_name: Option<String>,
    reminder_note: Option<Option<String>>,
    reminder_days: Option<Option<u64>>,
}

/// Read the `secrets` items of a batch; `value_required` for creates.
fn batch_items(f: &mut Fields<'_>, value_required: bool, updates: bool) -> Vec<Item> {
    let list = f.non_empty_array("secrets");
    let mut items = Vec::with_capacity(list.len());
    for (i, item) in list.into_iter().enumerate() {
        let mut n = Fields::nested(item, vec![json!("secrets"), json!(i)]);
        let key = n.required_name("secretKey");
        let value = if value_required {
            Some(n.required_string("secretValue"))
        } else {
            n.optional_string("secretValue")
        };
        let path = updates
            .then(|| n.optional_string("secretPath").map(|p| normalize_path(&p)))
            .flatten();
        let comment = n.optional_string("secretComment");
        let skip = n.nullable_bool("skipMultilineEncoding");
        let new_name = updates
            .then(|| n.optional_trimmed("newSecretName"))
            .flatten();
        let reminder_note = n.nullable_string("secretReminderNote");
        let reminder_days = n.nullable_count("secretReminderRepeatDays");
        f.absorb(n);
        items.push(Item {
            key,
            value,
            path,
            comment,
            skip,
            new_name,
            reminder_note,
            reminder_days,
        });
    }
    items
}

/// Refuse a batch naming the same secret twice.
fn no_duplicates<'a>(keys: impl Iterator<Item = (&'a str, &'a str)>) -> Result<(), ApiError> {
    let mut seen = BTreeSet::new();
    let mut twice = Vec::new();
    for (path, key) in keys {
        if !seen.insert((path, key)) {
            twice.push(key);
        }
    }
    if twice.is_empty() {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!(
            "Secret keys are repeated in the request: {}",
            twice.join(", ")
        )))
    }
}

fn new_secret(project: &Project, environment: &str, path: &str, item: &Item, now: i64) -> Secret {
    Secret {
        id: random_uuid(),
        project_id: project.id.clone(),
        environment: environment.to_owned(),
        path: path.to_owned(),
        key: item.key.clone(),
        value: clean_value(item.value.as_deref().unwrap_or_default()),
        comment: item.comment.clone().unwrap_or_default(),
        version: 1,
        skip_multiline_encoding: item.skip.flatten().unwrap_or(false),
        reminder_note: item.reminder_note.clone().flatten(),
        reminder_repeat_days: item.reminder_days.flatten(),
        created_at: now,
        updated_at: now,
    }
}

/// `POST /api/v3/secrets/batch/raw`.
pub(crate) async fn batch_create(State(app): State<App>, req: Request) -> ApiResult {
    let (parts, body) = req.into_parts();
    let caller = caller(&app, &parts.headers).await?;
    let body = read_json(&parts.headers, body).await?;
    let mut f = Fields::of(body.as_ref());
    let target = Target::read(&mut f);
    let items = batch_items(&mut f, true, false);
    f.finish()?;
    no_duplicates(items.iter().map(|i| (target.path.as_str(), i.key.as_str())))?;
    let mut st = app.store.write().await;
    let project = target.project(&st, &caller, "create")?;
    target.folder_for_create(&app, &st, &project)?;
    let existing: Vec<&str> = items
        .iter()
        .filter(|i| {
            st.find_secret(&project.id, &target.environment, &target.path, &i.key)
                .is_some()
        })
        .map(|i| i.key.as_str())
        .collect();
    if !existing.is_empty() {
        return Err(ApiError::bad_request(format!(
            "Secret already exist: {}",
            existing.join(", ")
        )));
    }
    let now = now_ms();
    let mut tx = Tx::default();
    for folder in st.missing_folders(&project.id, &target.environment, &target.path) {
        tx.put(Record::Folder(folder));
    }
    let created: Vec<Secret> = items
        .iter()
        .map(|i| new_secret(&project, &target.environment, &target.path, i, now))
        .collect();
    for s in &created {
        tx.put(Record::Secret(s.clone()));
    }
    app.store.commit(&mut st, tx).await?;
    Ok(ok(&ManyOut {
        secrets: created
            .iter()
            .map(|s| SecretView::new(s, Shape::Write, None))
            .collect(),
    }))
}

/// `PATCH /api/v3/secrets/batch/raw`, with `mode` `failOnNotFound`
/// (default), `upsert` or `ignore`, and an optional `secretPath` per item.
pub(crate) async fn batch_update(State(app): State<App>, req: Request) -> ApiResult {
    let (parts, body) = req.into_parts();
    let caller = caller(&app, &parts.headers).await?;
    let body = read_json(&parts.headers, body).await?;
    let mut f = Fields::of(body.as_ref());
    let target = Target::read(&mut f);
    let mode = f.one_of(
        "mode",
        &["failOnNotFound", "upsert", "ignore"],
        "failOnNotFound",
    );
    let items = batch_items(&mut f, false, true);
    f.finish()?;
    let path_of = |i: &Item| i.path.clone().unwrap_or_else(|| target.path.clone());
    let paths: Vec<String> = items.iter().map(path_of).collect();
    no_duplicates(
        paths
            .iter()
            .map(String::as_str)
            .zip(items.iter().map(|i| i.key.as_str())),
    )?;
    let mut st = app.store.write().await;
    let project = target.project(&st, &caller, "edit")?;
    let env = target.environment.as_str();
    for path in &paths {
        check_write(&caller, &project.id, env, path, "edit")?;
    }
    let now = now_ms();
    let mut missing = Vec::new();
    let mut results = Vec::new();
    let mut tx = Tx::default();
    let mut taken = BTreeSet::new();
    let mut new_folders = BTreeSet::new();
    for (item, path) in items.iter().zip(&paths) {
        match st.find_secret(&project.id, env, path, &item.key).cloned() {
            Some(existing) => {
                let key = item.new_name.clone().unwrap_or(existing.key.clone());
                if key != existing.key
                    && (st.find_secret(&project.id, env, path, &key).is_some()
                        || !taken.insert((path.clone(), key.clone())))
                {
                    return Err(ApiError::bad_request(
                        "Secret with the new name already exist",
                    ));
                }
                let updated = Secret {
                    key,
                    value: item
                        .value
                        .as_deref()
                        .map_or(existing.value.clone(), clean_value),
                    comment: item.comment.clone().unwrap_or(existing.comment.clone()),
                    version: existing.version + 1,
                    skip_multiline_encoding: item
                        .skip
                        .map_or(existing.skip_multiline_encoding, |s| s.unwrap_or(false)),
                    reminder_note: item
                        .reminder_note
                        .clone()
                        .unwrap_or(existing.reminder_note.clone()),
                    reminder_repeat_days: item
                        .reminder_days
                        .unwrap_or(existing.reminder_repeat_days),
                    updated_at: now,
                    ..existing
                };
                results.push(updated);
            }
            None if mode == "upsert" => {
                for folder in st.missing_folders(&project.id, env, path) {
                    if new_folders.insert(folder.id.clone()) {
                        tx.put(Record::Folder(folder));
                    }
                }
                results.push(new_secret(&project, env, path, item, now));
            }
            None if mode == "ignore" => {}
            None => missing.push(item.key.clone()),
        }
    }
    if !missing.is_empty() {
        return Err(ApiError::not_found(format!(
            "Secret does not exist: {}",
            missing.join(", ")
        )));
    }
    for s in &results {
        tx.put(Record::Secret(s.clone()));
    }
    app.store.commit(&mut st, tx).await?;
    Ok(ok(&ManyOut {
        secrets: results
            .iter()
            .map(|s| SecretView::new(s, Shape::Write, None))
            .collect(),
    }))
}

/// `DELETE /api/v3/secrets/batch/raw` (JSON body).
pub(crate) async fn batch_delete(State(app): State<App>, req: Request) -> ApiResult {
    let (parts, body) = req.into_parts();
    let caller = caller(&app, &parts.headers).await?;
    let body = read_json(&parts.headers, body).await?;
    let mut f = Fields::of(body.as_ref());
    let target = Target::read(&mut f);
    let list = f.non_empty_array("secrets");
    let mut keys = Vec::with_capacity(list.len());
    for (i, item) in list.into_iter().enumerate() {
        let mut n = Fields::nested(item, vec![json!("secrets"), json!(i)]);
        keys.push(n.required_name("secretKey"));
        n.one_of("type", &["shared", "personal"], "shared");
        f.absorb(n);
    }
    f.finish()?;
    no_duplicates(keys.iter().map(|k| (target.path.as_str(), k.as_str())))?;
    let mut st = app.store.write().await;
    let project = target.project(&st, &caller, "delete")?;
    let mut missing = Vec::new();
    let mut deleted = Vec::new();
    for key in &keys {
        match st.find_secret(&project.id, &target.environment, &target.path, key) {
            Some(s) => deleted.push(s.clone()),
            None => missing.push(key.as_str()),
        }
    }
    if !missing.is_empty() {
        return Err(ApiError::not_found(format!(
            "Secret does not exist: {}",
            missing.join(", ")
        )));
    }
    let mut tx = Tx::default();
    for s in &deleted {
        tx.delete(Kind::Secret, &s.id);
    }
    app.store.commit(&mut st, tx).await?;
    Ok(ok(&ManyOut {
        secrets: deleted
            .iter()
            .map(|s| SecretView::new(s, Shape::Write, None))
            .collect(),
    }))
}
