//! `POST /api/v1/events/subscribe/project-events`: open a server-sent event
//! stream of a project's secret changes (see `crate::events` for what is
//! sent). Identities only; the body is
//! `{projectId, register: [{event, conditions?: {secretPath?, environmentSlug}}]}`
//! with 1 to 10 registrations.

use axum::extract::{Request, State};
use serde_json::json;

use super::auth::caller;
use super::{ApiResult, check_read};
use crate::app::App;
use crate::errors::ApiError;
use crate::events::{EVENT_NAMES, Registration};
use crate::validate::{Fields, read_json};

/// Most registrations a subscription may have.
const MAX_REGISTRATIONS: u32 = 10;

/// `POST /api/v1/events/subscribe/project-events`.
pub(crate) async fn subscribe(State(app): State<App>, req: Request) -> ApiResult {
    let (parts, body) = req.into_parts();
    let caller = caller(&app, &parts.headers).await?;
    let body = read_json(&parts.headers, body).await?;
    let mut f = Fields::of(body.as_ref());
    let project_id = f.required_string("projectId").trim().to_owned();
    let list = f.array_up_to("register", MAX_REGISTRATIONS);
    let mut registrations = Vec::with_capacity(list.len());
    for (i, item) in list.into_iter().enumerate() {
        let mut n = Fields::nested(item, vec![json!("register"), json!(i)]);
        let event = n.one_of("event", EVENT_NAMES, "");
        let (environment, path) = match n.optional_object("conditions") {
            Some(conditions) => {
                let mut c = Fields::nested(
                    conditions,
                    vec![json!("register"), json!(i), json!("conditions")],
                );
                let path = c
                    .optional_string("secretPath")
                    .map_or_else(|| "/".to_owned(), |p| p.trim().to_owned());
                let environment = c.required_string("environmentSlug").trim().to_owned();
                n.absorb(c);
                (Some(environment), path)
            }
            // No conditions: every folder of every environment.
            None => (None, "/**".to_owned()),
        };
        f.absorb(n);
        registrations.push(Registration {
            event,
            environment,
            path,
        });
    }
    f.finish()?;
    if caller.service_token().is_some() {
        // The admission layer refuses service tokens first; kept for safety.
        return Err(ApiError::unauthorized("Service tokens cannot subscribe"));
    }
    let st = app.store.read().await;
    let project = st
        .project(&project_id)
        .filter(|p| caller.member_of(&p.id))
        .ok_or_else(|| ApiError::not_member(&project_id))?;
    // Each registration must be readable, checked with its own text (a
    // glob is matched as written against the identity's globs).
    for r in &registrations {
        check_read(
            &caller,
            &project.id,
            r.environment.as_deref().unwrap_or(""),
            &r.path,
        )?;
    }
    let slot = app.streams.open(&project.id, caller.id())?;
    let events = app.store.subscribe();
    drop(st);
    let visibility = {
        let caller = caller.clone();
        let project_id = project_id.clone();
        Box::new(move |env: &str, path: &str| caller.may_read(&project_id, env, path))
    };
    tracing::debug!(
        project = %project_id,
        registrations = registrations.len(),
        "event stream opened"
    );
    Ok(app
        .streams
        .response(project_id, registrations, visibility, events, slot))
}
