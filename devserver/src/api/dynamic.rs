//! Dynamic secrets and their leases. The built-in provider mints a random
//! `DB_USERNAME` and `DB_PASSWORD` per lease. A lease lives from its
//! creation to `expireAt`; renewing adds the TTL to the current `expireAt`,
//! within `createdAt + maxTTL`; revoking ends it. Expired and revoked leases
//! are answered as not found, as the real server does once it has removed
//! them.

use axum::extract::{Request, State};
use serde::Serialize;

use super::auth::caller;
use super::{ApiResult, Caller, Param, folder_not_found};
use crate::app::App;
use crate::clock::now_ms;
use crate::durations;
use crate::errors::{ApiError, ok};
use crate::ids::{ALNUM, LOWER_ALNUM, random_string, random_uuid};
use crate::model::{DynamicSecret, Lease, Project};
use crate::store::{Record, State as Db, Tx};
use crate::validate::{Fields, query_object, read_json};
use crate::views::{DynamicSecretView, LeaseView, OrderedMap};

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct CreatedOut<'a> {
    lease: LeaseView,
    dynamic_secret: DynamicSecretView,
    data: OrderedMap<'a>,
}

#[derive(Serialize)]
struct LeaseOut {
    lease: LeaseView,
}

#[derive(Serialize)]
struct LeasesOut {
    leases: Vec<LeaseView>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ListOut {
    dynamic_secrets: Vec<DynamicSecretView>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct OneOut {
    dynamic_secret: DynamicSecretView,
}

/// Project slug, environment and folder of a request.
struct Place {
    project_slug: String,
    environment: String,
    path: String,
}

impl Place {
    fn read(f: &mut Fields<'_>) -> Place {
        Place {
            project_slug: f.required_name("projectSlug"),
            environment: f.required_name("environmentSlug"),
            path: f.secret_path("path"),
        }
    }

    /// The project, if the caller is a member that may use the folder and
    /// the folder exists.
    fn project<'s>(&self, st: &'s Db, caller: &Caller) -> Result<&'s Project, ApiError> {
        let project = super::project_for(
            st,
            caller,
            None,
            Some(&self.project_slug),
            "Missing project slug",
        )?;
        if !caller.may_read(&project.id, &self.environment, &self.path) {
            return Err(ApiError::permission_denied("read", "dynamic-secrets"));
        }
        if project.environment(&self.environment).is_none()
            || !st.folder_exists(&project.id, &self.environment, &self.path)
        {
            return Err(folder_not_found(&self.path, &self.environment));
        }
        Ok(project)
    }

    /// The dynamic secret `name` (case-insensitive) of the folder.
    fn dynamic_secret<'s>(
        &self,
        st: &'s Db,
        project: &Project,
        name: &str,
    ) -> Result<&'s DynamicSecret, ApiError> {
        let wanted = name.to_lowercase();
        st.dynamic_secrets_in(&project.id, &self.environment, &self.path)
            .into_iter()
            .find(|d| d.name.to_lowercase() == wanted)
            .ok_or_else(|| {
                ApiError::not_found(format!(
                    "Dynamic secret with name '{name}' in folder with path '{}' not found",
                    self.path
                ))
            })
    }

    /// An active lease of a dynamic secret of this folder, with it.
    fn lease<'s>(
        &self,
        st: &'s Db,
        project: &Project,
        lease_id: &str,
        now: i64,
    ) -> Result<(&'s Lease, &'s DynamicSecret), ApiError> {
        st.leases
            .get(lease_id)
            .filter(|l| l.is_active(now))
            .and_then(|l| st.dynamic_secrets.get(&l.dynamic_secret_id).map(|d| (l, d)))
            .filter(|(_, d)| {
                d.project_id == project.id
                    && d.environment == self.environment
                    && d.path == self.path
            })
            .ok_or_else(|| {
                ApiError::not_found(format!(
                    "Dynamic secret lease with ID '{lease_id}' not found"
                ))
            })
    }
}

/// A requested TTL in milliseconds, checked against the minimum.
fn requested_ttl(app: &App, ttl: Option<&str>) -> Result<Option<i64>, ApiError> {
    let Some(text) = ttl else { return Ok(None) };
    let Some(d) = durations::parse_api(text) else {
        return Err(ApiError::bad_request(format!(
            "Invalid TTL '{text}': use a duration such as 30m, 1h or 1d"
        )));
    };
    if d < app.min_lease_ttl {
        return Err(ApiError::bad_request(format!(
            "TTL must be a greater than {}",
            durations::short(app.min_lease_ttl)
        )));
    }
    Ok(Some(durations::ms(d)))
}

/// `POST /api/v1/dynamic-secrets/leases`.
pub(crate) async fn create_lease(State(app): State<App>, req: Request) -> ApiResult {
    let (parts, body) = req.into_parts();
    let caller = caller(&app, &parts.headers).await?;
    let body = read_json(&parts.headers, body).await?;
    let mut f = Fields::of(body.as_ref());
    let name = f.required_name("dynamicSecretName");
    let place = Place::read(&mut f);
    let ttl = f.optional_string("ttl");
    f.finish()?;
    let ttl = requested_ttl(&app, ttl.as_deref())?;
    let mut st = app.store.write().await;
    let project = place.project(&st, &caller)?.clone();
    let ds = place.dynamic_secret(&st, &project, &name)?.clone();
    let ttl = ttl.unwrap_or(ds.default_ttl_ms);
    if ds.max_ttl_ms.is_some_and(|max| ttl > max) {
        return Err(ApiError::bad_request("TTL cannot be larger than max TTL"));
    }
    let now = now_ms();
    let username = format!("dev-{}", random_string(12, LOWER_ALNUM));
    let password = random_string(32, ALNUM);
    let lease = Lease {
        id: random_uuid(),
        dynamic_secret_id: ds.id.clone(),
        version: 1,
        external_entity_id: username.clone(),
        data: vec![
            ("DB_USERNAME".to_owned(), username),
            ("DB_PASSWORD".to_owned(), password),
        ],
        expire_at: now.saturating_add(ttl),
        created_at: now,
        updated_at: now,
        revoked_at: None,
    };
    app.store
        .commit(&mut st, Tx::one(Record::Lease(lease.clone())))
        .await?;
    tracing::debug!(lease = %lease.id, dynamic_secret = %ds.name, "lease created");
    Ok(ok(&CreatedOut {
        lease: LeaseView::new(&lease, None),
        dynamic_secret: DynamicSecretView::new(&ds),
        data: OrderedMap(&lease.data),
    }))
}

/// `POST /api/v1/dynamic-secrets/leases/:leaseId/renew`.
pub(crate) async fn renew_lease(
    State(app): State<App>,
    Param(id): Param,
    req: Request,
) -> ApiResult {
    let (parts, body) = req.into_parts();
    let caller = caller(&app, &parts.headers).await?;
    let body = read_json(&parts.headers, body).await?;
    let mut f = Fields::of(body.as_ref());
    let ttl = f.optional_string("ttl");
    let place = Place::read(&mut f);
    f.finish()?;
    let ttl = requested_ttl(&app, ttl.as_deref())?;
    let mut st = app.store.write().await;
    let now = now_ms();
    let project = place.project(&st, &caller)?.clone();
    let (lease, ds) = place.lease(&st, &project, &id, now)?;
    let ttl = ttl.unwrap_or(ds.default_ttl_ms);
    let expire_at = lease.expire_at.saturating_add(ttl);
    if ds
        .max_ttl_ms
        .is_some_and(|max| expire_at > lease.created_at.saturating_add(max))
    {
        return Err(ApiError::bad_request("TTL cannot be larger than max ttl"));
    }
    let renewed = Lease {
        expire_at,
        updated_at: now,
        ..lease.clone()
    };
    app.store
        .commit(&mut st, Tx::one(Record::Lease(renewed.clone())))
        .await?;
    Ok(ok(&LeaseOut {
        lease: LeaseView::new(&renewed, None),
    }))
}

/// `DELETE /api/v1/dynamic-secrets/leases/:leaseId` (JSON body). The
/// built-in provider never fails to revoke, so `isForced` changes nothing.
pub(crate) async fn revoke_lease(
    State(app): State<App>,
    Param(id): Param,
    req: Request,
) -> ApiResult {
    let (parts, body) = req.into_parts();
    let caller = caller(&app, &parts.headers).await?;
    let body = read_json(&parts.headers, body).await?;
    let mut f = Fields::of(body.as_ref());
    let place = Place::read(&mut f);
    f.optional_bool("isForced");
    f.finish()?;
    let mut st = app.store.write().await;
    let now = now_ms();
    let project = place.project(&st, &caller)?.clone();
    let (lease, _) = place.lease(&st, &project, &id, now)?;
    let shown = LeaseView::new(lease, None);
    let revoked = Lease {
        revoked_at: Some(now),
        updated_at: now,
        ..lease.clone()
    };
    app.store
        .commit(&mut st, Tx::one(Record::Lease(revoked)))
        .await?;
    tracing::debug!(lease = %id, "lease revoked");
    Ok(ok(&LeaseOut { lease: shown }))
}

/// `GET /api/v1/dynamic-secrets/leases/:leaseId`.
pub(crate) async fn get_lease(State(app): State<App>, Param(id): Param, req: Request) -> ApiResult {
    let caller = caller(&app, req.headers()).await?;
    let query = query_object(req.uri().query());
    let mut f = Fields::of(Some(&query));
    let place = Place::read(&mut f);
    f.finish()?;
    let st = app.store.read().await;
    let project = place.project(&st, &caller)?;
    let (lease, ds) = place.lease(&st, project, &id, now_ms())?;
    Ok(ok(&LeaseOut {
        lease: LeaseView::new(lease, Some(ds)),
    }))
}

/// `GET /api/v1/dynamic-secrets`.
pub(crate) async fn list(State(app): State<App>, req: Request) -> ApiResult {
    let caller = caller(&app, req.headers()).await?;
    let query = query_object(req.uri().query());
    let mut f = Fields::of(Some(&query));
    let place = Place::read(&mut f);
    f.finish()?;
    let st = app.store.read().await;
    let project = place.project(&st, &caller)?;
    Ok(ok(&ListOut {
        dynamic_secrets: st
            .dynamic_secrets_in(&project.id, &place.environment, &place.path)
            .into_iter()
            .map(DynamicSecretView::new)
            .collect(),
    }))
}

/// `GET /api/v1/dynamic-secrets/:name`.
pub(crate) async fn get_one(State(app): State<App>, Param(name): Param, req: Request) -> ApiResult {
    let caller = caller(&app, req.headers()).await?;
    let query = query_object(req.uri().query());
    let mut f = Fields::of(Some(&query));
    let place = Place::read(&mut f);
    f.finish()?;
    let st = app.store.read().await;
    let project = place.project(&st, &caller)?;
    let ds = place.dynamic_secret(&st, project, &name)?;
    Ok(ok(&OneOut {
        dynamic_secret: DynamicSecretView::new(ds),
    }))
}

/// `GET /api/v1/dynamic-secrets/:name/leases`: the active leases.
pub(crate) async fn leases_of(
    State(app): State<App>,
    Param(name): Param,
    req: Request,
) -> ApiResult {
    let caller = caller(&app, req.headers()).await?;
    let query = query_object(req.uri().query());
    let mut f = Fields::of(Some(&query));
    let place = Place::read(&mut f);
    f.finish()?;
    let st = app.store.read().await;
    let project = place.project(&st, &caller)?;
    let ds = place.dynamic_secret(&st, project, &name)?;
    let now = now_ms();
    Ok(ok(&LeasesOut {
        leases: st
            .leases
            .values()
            .filter(|l| l.dynamic_secret_id == ds.id && l.is_active(now))
            .map(|l| LeaseView::new(l, None))
            .collect(),
    }))
}
