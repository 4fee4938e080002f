//! Authentication: the logins (universal, Kubernetes and LDAP auth; AWS,
//! Azure and GCP in test mode), token
//! renew and revoke, and the check of the bearer token every other route
//! makes — an identity access token (a JWT of this server) or a legacy
//! service token (`st.<id>.<secret>`).

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use serde::Serialize;

use super::ApiResult;
use crate::app::App;
use crate::clock::now_ms;
use crate::errors::{ApiError, ok};
use crate::ids::random_uuid;
use crate::model::{AccessToken, Identity, ServiceToken};
use crate::scope::glob_matches;
use crate::store::{Kind, Record, State as Db, Tx};
use crate::token::JwtError;
use crate::validate::{Fields, read_json};

/// Who a request is made by.
#[derive(Debug, Clone)]
pub(crate) enum Actor {
    /// A machine identity, with an access token.
    Identity(Identity),
    /// A legacy service token.
    ServiceToken(ServiceToken),
}

/// The actor of a request.
#[derive(Debug, Clone)]
pub(crate) struct Caller {
    pub actor: Actor,
}

impl Caller {
    /// The identity's id, or the service token's.
    pub fn id(&self) -> &str {
        match &self.actor {
            Actor::Identity(i) => &i.id,
            Actor::ServiceToken(t) => &t.id,
        }
    }

    /// Whether the actor belongs to the project (a service token belongs to
    /// its own project only).
    pub fn member_of(&self, project_id: &str) -> bool {
        match &self.actor {
            Actor::Identity(i) => i.projects.iter().any(|p| p == project_id),
            Actor::ServiceToken(t) => t.project_id == project_id,
        }
    }

    /// Whether the actor may read the folder (`path` may be a glob, matched
    /// as text): a member identity within its path scope, or a service
    /// token whose scope covers it.
    pub fn may_read(&self, project_id: &str, environment: &str, path: &str) -> bool {
        match &self.actor {
            Actor::Identity(i) => self.member_of(project_id) && i.may_use(project_id, path),
            Actor::ServiceToken(t) => t.can("read") && t.covers(project_id, environment, path),
        }
    }

    /// Whether the actor may write the folder.
    pub fn may_write(&self, project_id: &str, environment: &str, path: &str) -> bool {
        match &self.actor {
            Actor::Identity(i) => self.member_of(project_id) && i.may_use(project_id, path),
            Actor::ServiceToken(t) => t.can("write") && t.covers(project_id, environment, path),
        }
    }

    /// The service token, when the actor is one.
    pub fn service_token(&self) -> Option<&ServiceToken> {
        match &self.actor {
            Actor::ServiceToken(t) => Some(t),
            Actor::Identity(_) => None,
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct TokenOut {
    access_token: String,
    expires_in: u64,
    #[serde(rename = "accessTokenMaxTTL")]
    access_token_max_ttl: u64,
    token_type: &'static str,
}

#[derive(Serialize)]
struct MessageOut {
    message: &'static str,
}

/// The token of the `Authorization` header: the real server drops the first
/// seven characters ("Bearer ") whatever they are. `None` when there is no
/// token.
pub(crate) fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    let value = headers.get(header::AUTHORIZATION)?;
    let token = value.as_bytes().get(7..).unwrap_or_default();
    let token = token.trim_ascii();
    (!token.is_empty()).then_some(token)
}

/// Whether a bearer token is a service token.
pub(crate) fn is_service_token(token: &[u8]) -> bool {
    token.starts_with(b"st.")
}

/// The actor of the bearer token of a request.
pub(crate) async fn caller(app: &App, headers: &HeaderMap) -> Result<Caller, ApiError> {
    let Some(token) = bearer(headers) else {
        return Err(ApiError::unauthorized("Token missing"));
    };
    let token = std::str::from_utf8(token).map_err(|_| JwtError::Malformed)?;
    if is_service_token(token.as_bytes()) {
        let st = app.store.read().await;
        let service_token = service_token(app, &st, token)?.clone();
        return Ok(Caller {
            actor: Actor::ServiceToken(service_token),
        });
    }
    let (_, identity) = live_token(app, token, "authenticate identity access token").await?;
    Ok(Caller {
        actor: Actor::Identity(identity),
    })
}

/// The service token `st.<id>.<secret>[.<key>]`, as the real server checks
/// it: an unknown id is 404, a wrong secret 401.
fn service_token<'s>(app: &App, st: &'s Db, token: &str) -> Result<&'s ServiceToken, ApiError> {
    let mut parts = token.split('.').skip(1);
    let id = parts.next().unwrap_or_default();
    let secret = parts.next().unwrap_or_default();
    let found = st
        .service_tokens
        .get(id)
        .ok_or_else(|| ApiError::not_found(format!("Service token with ID '{id}' not found")))?;
    if st.project(&found.project_id).is_none() {
        return Err(ApiError::not_found(format!(
            "Project with ID '{}' not found",
            found.project_id
        )));
    }
    if !app.secret_matches(&found.secret, secret) {
        return Err(ApiError::unauthorized("Invalid service token"));
    }
    Ok(found)
}

/// Whether the bearer token of a request would authenticate, without the
/// side effects of a full check (an expired token record is left for the
/// handler to remove and report).
pub(crate) async fn authenticates(app: &App, headers: &HeaderMap) -> bool {
    let Some(token) = bearer(headers).and_then(|t| std::str::from_utf8(t).ok()) else {
        return false;
    };
    let st = app.store.read().await;
    if is_service_token(token.as_bytes()) {
        return service_token(app, &st, token).is_ok();
    }
    let now = now_ms();
    let Ok(claims) = app.signer.verify(token, now / 1000) else {
        return false;
    };
    st.tokens
        .get(&claims.identity_access_token_id)
        .is_some_and(|t| {
            t.ttl_expiry().is_none_or(|e| now <= e)
                && t.max_expiry().is_none_or(|e| now <= e)
                && st.identities.contains_key(&t.identity_id)
        })
}

/// The access-token record and identity of a JWT, if both are alive; an
/// expired record is deleted. `verb` completes the real server's messages.
async fn live_token(app: &App, jwt: &str, verb: &str) -> Result<(AccessToken, Identity), ApiError> {
    let now = now_ms();
    let claims = app.signer.verify(jwt, now / 1000)?;
    let gone = || ApiError::unauthorized("No identity access token found");
    let (token, identity) = {
        let st = app.store.read().await;
        let token = st
            .tokens
            .get(&claims.identity_access_token_id)
            .cloned()
            .ok_or_else(gone)?;
        let identity = st.identities.get(&token.identity_id).cloned();
        (token, identity)
    };
    let expired = if token.ttl_expiry().is_some_and(|t| now > t) {
        Some("TTL expiration")
    } else if token.max_expiry().is_some_and(|t| now > t) {
        Some("Max TTL expiration")
    } else {
        None
    };
    if let Some(why) = expired {
        let mut st = app.store.write().await;
        let mut tx = Tx::default();
        tx.delete(Kind::Token, &token.id);
        app.store.commit(&mut st, tx).await?;
        return Err(ApiError::unauthorized(format!(
            "Failed to {verb} due to {why}"
        )));
    }
    let identity = identity.ok_or_else(gone)?;
    Ok((token, identity))
}

/// Issue an access token for an identity (the record is committed with
/// `st`).
async fn issue(
    app: &App,
    st: &mut Db,
    identity_id: &str,
    ttl: u64,
    max_ttl: u64,
) -> Result<TokenOut, ApiError> {
    let now = now_ms();
    let token = AccessToken {
        id: random_uuid(),
        identity_id: identity_id.to_owned(),
        created_at: now,
        last_renewed_at: None,
        ttl,
        max_ttl,
    };
    let iat = now / 1000;
    let exp = (max_ttl > 0).then(|| iat.saturating_add(i64::try_from(max_ttl).unwrap_or(i64::MAX)));
    let jwt = app.signer.issue(identity_id, &token.id, iat, exp);
    app.store.commit(st, Tx::one(Record::Token(token))).await?;
    Ok(TokenOut {
        access_token: jwt,
        expires_in: ttl,
        access_token_max_ttl: max_ttl,
        token_type: "Bearer",
    })
}

/// `POST /api/v1/auth/universal-auth/login`.
pub(crate) async fn universal_login(State(app): State<App>, req: Request) -> ApiResult {
    let (parts, body) = req.into_parts();
    let body = read_json(&parts.headers, body).await?;
    let mut f = Fields::of(body.as_ref());
    let client_id = f.required_string("clientId").trim().to_owned();
    let client_secret = f.required_string("clientSecret");
    f.finish()?;
    let mut st = app.store.write().await;
    let identity = st
        .identities
        .values()
        .find(|i| {
            i.universal_auth
                .as_ref()
                .is_some_and(|ua| ua.client_id == client_id)
        })
        .cloned()
        .ok_or_else(|| ApiError::not_found("No identity with specified client ID was found"))?;
    let Some(ua) = identity.universal_auth.as_ref() else {
        return Err(ApiError::internal());
    };
    if !app.secret_matches(&ua.client_secret, &client_secret) {
        return Err(ApiError::unauthorized("Invalid credentials"));
    }
    let out = issue(
        &app,
        &mut st,
        &identity.id,
        ua.access_token_ttl,
        ua.access_token_max_ttl,
    )
    .await?;
    tracing::debug!(identity = %identity.name, "universal-auth login");
    Ok(ok(&out))
}

/// `POST /api/v1/auth/ldap-auth/login`: the dev server is the directory;
/// the identity's seeded user name and password must match.
pub(crate) async fn ldap_login(State(app): State<App>, req: Request) -> ApiResult {
    let (parts, body) = req.into_parts();
    let body = read_json(&parts.headers, body).await?;
    let mut f = Fields::of(body.as_ref());
    let identity_id = f.required_name("identityId");
    let username = f.required_name("username");
    let password = f.required_name("password");
    f.finish()?;
    let mut st = app.store.write().await;
    let identity = st
        .identities
        .get(&identity_id)
        .filter(|i| i.ldap_auth.is_some())
        .cloned()
        .ok_or_else(|| {
            ApiError::not_found(
                "LDAP auth method not found for identity, did you configure LDAP auth?",
            )
        })?;
    let Some(ldap) = identity.ldap_auth.as_ref() else {
        return Err(ApiError::internal());
    };
    // Both compared in full, whatever the first result, so the time taken
    // does not tell which one was wrong.
    let user_ok = app.secret_matches(&ldap.username, &username);
    let password_ok = app.secret_matches(&ldap.password, &password);
    if !(user_ok && password_ok) {
        return Err(ApiError::unauthorized("LDAP authentication failed"));
    }
    let out = issue(
        &app,
        &mut st,
        &identity.id,
        ldap.access_token_ttl,
        ldap.access_token_max_ttl,
    )
    .await?;
    tracing::debug!(identity = %identity.name, "ldap-auth login");
    Ok(ok(&out))
}

/// The identity `identity_id` if it has the method `has`.
async fn identity_with(
    app: &App,
    identity_id: &str,
    has: fn(&Identity) -> bool,
    what: &str,
) -> Result<Identity, ApiError> {
    app.store
        .read()
        .await
        .identities
        .get(identity_id)
        .filter(|i| has(i))
        .cloned()
        .ok_or_else(|| {
            ApiError::not_found(format!(
                "{what} auth method not found for identity, did you configure {what} auth?"
            ))
        })
}

/// Issue a token after a cloud login was checked.
async fn issue_checked(
    app: &App,
    identity: &Identity,
    ttl: u64,
    max_ttl: u64,
) -> Result<TokenOut, ApiError> {
    let mut st = app.store.write().await;
    if !st.identities.contains_key(&identity.id) {
        return Err(ApiError::unauthorized("Identity not found"));
    }
    issue(app, &mut st, &identity.id, ttl, max_ttl).await
}

/// `POST /api/v1/auth/aws-auth/login`, test mode: the signed
/// `GetCallerIdentity` request is checked here instead of being sent to
/// STS (see [`crate::cloud`]).
pub(crate) async fn aws_login(State(app): State<App>, req: Request) -> ApiResult {
    let (parts, body) = req.into_parts();
    let body = read_json(&parts.headers, body).await?;
    let mut f = Fields::of(body.as_ref());
    let identity_id = f.required_string("identityId").trim().to_owned();
    let method = f.required_string("iamHttpRequestMethod");
    let request_body = f.required_string("iamRequestBody");
    let request_headers = f.required_string("iamRequestHeaders");
    let _ = f.optional_string("iamRequestUrl");
    let _ = f.optional_string("organizationSlug");
    f.finish()?;
    let identity = identity_with(&app, &identity_id, |i| i.aws_auth.is_some(), "AWS").await?;
    let Some(aws) = identity.aws_auth.as_ref() else {
        return Err(ApiError::internal());
    };
    let caller = crate::cloud::check_aws(
        aws,
        method.trim(),
        &request_body,
        &request_headers,
        now_ms() / 1000,
    )
    .map_err(|e| ApiError::unauthorized(format!("AWS IAM authentication failed: {e}")))?;
    let out = issue_checked(
        &app,
        &identity,
        aws.access_token_ttl,
        aws.access_token_max_ttl,
    )
    .await?;
    tracing::debug!(identity = %identity.name, caller = caller.as_deref().unwrap_or("(unknown key)"), "aws-auth login (test mode)");
    Ok(ok(&out))
}

/// `POST /api/v1/auth/azure-auth/login`, test mode: the managed-identity
/// JWT's claims (and, with keys, its signature) are checked here.
pub(crate) async fn azure_login(State(app): State<App>, req: Request) -> ApiResult {
    let (parts, body) = req.into_parts();
    let body = read_json(&parts.headers, body).await?;
    let mut f = Fields::of(body.as_ref());
    let identity_id = f.required_string("identityId").trim().to_owned();
    let jwt = f.required_string("jwt");
    let _ = f.optional_string("organizationSlug");
    f.finish()?;
    let identity = identity_with(&app, &identity_id, |i| i.azure_auth.is_some(), "Azure").await?;
    let Some(azure) = identity.azure_auth.as_ref() else {
        return Err(ApiError::internal());
    };
    let denied = |e: String| ApiError::unauthorized(format!("Azure authentication failed: {e}"));
    let claims = crate::cloud::check_jwt(&jwt, &azure.jwks, now_ms() / 1000).map_err(denied)?;
    let resource = azure
        .resource
        .as_deref()
        .unwrap_or("https://management.azure.com/");
    if !crate::cloud::has_audience(&claims, resource) {
        return Err(denied(format!("the token's audience is not {resource}")));
    }
    if let Some(tenant) = azure.tenant_id.as_deref() {
        let want = format!("https://sts.windows.net/{tenant}/");
        if claims["iss"].as_str() != Some(want.as_str()) {
            return Err(denied(format!("the token is not issued by {want}")));
        }
    }
    let oid = claims["oid"].as_str().unwrap_or_default();
    let allowed = &azure.allowed_service_principal_ids.0;
    if !allowed.is_empty() && !allowed.iter().any(|a| a == oid) {
        return Err(denied(format!("service principal {oid:?} is not allowed")));
    }
    let out = issue_checked(
        &app,
        &identity,
        azure.access_token_ttl,
        azure.access_token_max_ttl,
    )
    .await?;
    tracing::debug!(identity = %identity.name, oid, "azure-auth login (test mode)");
    Ok(ok(&out))
}

/// `POST /api/v1/auth/gcp-auth/login`, test mode: the JWT (a metadata-server
/// ID token or a service-account-signed JWT) is checked here: audience =
/// the identity id, the service account allowed, and, with keys, its
/// signature.
pub(crate) async fn gcp_login(State(app): State<App>, req: Request) -> ApiResult {
    let (parts, body) = req.into_parts();
    let body = read_json(&parts.headers, body).await?;
    let mut f = Fields::of(body.as_ref());
    let identity_id = f.required_string("identityId").trim().to_owned();
    let jwt = f.required_string("jwt");
    let _ = f.optional_string("organizationSlug");
    f.finish()?;
    let identity = identity_with(&app, &identity_id, |i| i.gcp_auth.is_some(), "GCP").await?;
    let Some(gcp) = identity.gcp_auth.as_ref() else {
        return Err(ApiError::internal());
    };
    let denied = |e: String| ApiError::unauthorized(format!("GCP authentication failed: {e}"));
    let claims = crate::cloud::check_jwt(&jwt, &gcp.jwks, now_ms() / 1000).map_err(denied)?;
    if !crate::cloud::has_audience(&claims, &identity.id) {
        return Err(denied(
            "the token's audience is not the identity id".to_owned(),
        ));
    }
    let account = claims["email"]
        .as_str()
        .or_else(|| claims["sub"].as_str())
        .unwrap_or_default()
        .to_owned();
    let allowed = &gcp.allowed_service_accounts.0;
    if !allowed.is_empty() && !allowed.contains(&account) {
        return Err(denied(format!(
            "service account {account:?} is not allowed"
        )));
    }
    let out = issue_checked(
        &app,
        &identity,
        gcp.access_token_ttl,
        gcp.access_token_max_ttl,
    )
    .await?;
    tracing::debug!(identity = %identity.name, %account, "gcp-auth login (test mode)");
    Ok(ok(&out))
}

/// `POST /api/v1/auth/kubernetes-auth/login`: the service-account token is
/// reviewed by the cluster of `--kubeconfig` (a `TokenReview`, for the
/// identity's audience if it has one), then its namespace, name and
/// audience are checked against the identity's Kubernetes-auth settings.
pub(crate) async fn kubernetes_login(State(app): State<App>, req: Request) -> ApiResult {
    let (parts, body) = req.into_parts();
    let body = read_json(&parts.headers, body).await?;
    let mut f = Fields::of(body.as_ref());
    let identity_id = f.required_string("identityId").trim().to_owned();
    let jwt = f.required_string("jwt").trim().to_owned();
    f.finish()?;
    let identity = app
        .store
        .read()
        .await
        .identities
        .get(&identity_id)
        .filter(|i| i.kubernetes_auth.is_some())
        .cloned()
        .ok_or_else(|| {
            ApiError::not_found(
                "Kubernetes auth method not found for identity, did you configure Kubernetes auth?",
            )
        })?;
    let Some(k8s) = identity.kubernetes_auth.as_ref() else {
        return Err(ApiError::internal());
    };
    let Some(reviewer) = app.reviewer.as_ref() else {
        return Err(ApiError::bad_request(
            "The dev server has no cluster to review Kubernetes service-account tokens with; \
             start it with --kubeconfig",
        ));
    };
    let review = reviewer
        .review(&jwt, k8s.allowed_audience.as_deref())
        .await
        .map_err(|e| {
            tracing::warn!(error = %e, "a TokenReview failed");
            ApiError::named(
                StatusCode::BAD_REQUEST,
                "KubernetesTokenReviewRequestError",
                format!("Failed to validate the token with the Kubernetes API server: {e}"),
            )
        })?;
    let review_error = |message: String| {
        ApiError::named(
            StatusCode::UNAUTHORIZED,
            "KubernetesTokenReviewError",
            message,
        )
    };
    if let Some(error) = review.error.filter(|e| !e.is_empty()) {
        return Err(review_error(error));
    }
    if !review.authenticated {
        return Err(review_error("Kubernetes token not authenticated".into()));
    }
    let Some((namespace, name)) = service_account_of(&review.username) else {
        return Err(ApiError::unauthorized("Invalid username format"));
    };
    let allowed = |globs: &[String], value: &str| {
        globs.is_empty() || globs.iter().any(|g| g == value || glob_matches(g, value))
    };
    if !allowed(&k8s.allowed_namespaces, namespace) {
        return Err(ApiError::unauthorized(
            "Access denied: K8s namespace not allowed.",
        ));
    }
    if !allowed(&k8s.allowed_names, name) {
        return Err(ApiError::unauthorized(
            "Access denied: K8s name not allowed.",
        ));
    }
    if let Some(audience) = &k8s.allowed_audience
        && !review.audiences.iter().any(|a| a == audience)
    {
        return Err(ApiError::unauthorized(
            "Access denied: K8s audience not allowed.",
        ));
    }
    let mut st = app.store.write().await;
    if !st.identities.contains_key(&identity.id) {
        return Err(ApiError::unauthorized("Identity not found"));
    }
    let out = issue(
        &app,
        &mut st,
        &identity.id,
        k8s.access_token_ttl,
        k8s.access_token_max_ttl,
    )
    .await?;
    tracing::debug!(identity = %identity.name, %namespace, service_account = %name, "kubernetes-auth login");
    Ok(ok(&out))
}

/// `system:serviceaccount:<namespace>:<name>` → (namespace, name).
fn service_account_of(username: &str) -> Option<(&str, &str)> {
    let mut parts = username.split(':');
    match (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) {
        (Some("system"), Some("serviceaccount"), Some(ns), Some(name), None)
            if !ns.is_empty() && !name.is_empty() =>
        {
            Some((ns, name))
        }
        _ => None,
    }
}

/// `POST /api/v1/auth/token/renew`: the same token, with its TTL counted
/// from now.
pub(crate) async fn renew(State(app): State<App>, req: Request) -> ApiResult {
    let (parts, body) = req.into_parts();
    let body = read_json(&parts.headers, body).await?;
    let mut f = Fields::of(body.as_ref());
    let jwt = f.required_string("accessToken");
    f.finish()?;
    let (mut token, _) = live_token(&app, jwt.trim(), "renew MI access token").await?;
    let now = now_ms();
    if let Some(max) = token.max_expiry()
        && token.ttl > 0
        && now + crate::model::secs_to_ms(token.ttl) > max
    {
        return Err(ApiError::unauthorized(
            "Failed to renew MI access token past its Max TTL expiration",
        ));
    }
    token.last_renewed_at = Some(now);
    let out = TokenOut {
        access_token: jwt.trim().to_owned(),
        expires_in: token.ttl,
        access_token_max_ttl: token.max_ttl,
        token_type: "Bearer",
    };
    let mut st = app.store.write().await;
    if !st.tokens.contains_key(&token.id) {
        return Err(ApiError::unauthorized("No identity access token found"));
    }
    app.store
        .commit(&mut st, Tx::one(Record::Token(token)))
        .await?;
    Ok(ok(&out))
}

/// `POST /api/v1/auth/token/revoke`.
pub(crate) async fn revoke(State(app): State<App>, req: Request) -> ApiResult {
    let (parts, body) = req.into_parts();
    let body = read_json(&parts.headers, body).await?;
    let mut f = Fields::of(body.as_ref());
    let jwt = f.required_string("accessToken");
    f.finish()?;
    let claims = app.signer.verify(jwt.trim(), now_ms() / 1000)?;
    let mut st = app.store.write().await;
    if !st.tokens.contains_key(&claims.identity_access_token_id) {
        return Err(ApiError::unauthorized("No identity access token found"));
    }
    let mut tx = Tx::default();
    tx.delete(Kind::Token, &claims.identity_access_token_id);
    app.store.commit(&mut st, tx).await?;
    Ok(ok(&MessageOut {
        message: "Successfully revoked access token",
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_account_usernames() {
        assert_eq!(
            service_account_of("system:serviceaccount:team-a:app"),
            Some(("team-a", "app"))
        );
        assert_eq!(service_account_of("system:serviceaccount:team-a"), None);
        assert_eq!(service_account_of("system:serviceaccount::app"), None);
        assert_eq!(service_account_of("alice"), None);
        assert_eq!(service_account_of("system:serviceaccount:a:b:c"), None);
    }

    #[test]
    fn bearer_tokens() {
        let mut h = HeaderMap::new();
        assert_eq!(bearer(&h), None);
        h.insert(header::AUTHORIZATION, "Bearer  ".parse().expect("header"));
        assert_eq!(bearer(&h), None);
        h.insert(
            header::AUTHORIZATION,
            "Bearer st.a.b ".parse().expect("header"),
        );
        assert_eq!(bearer(&h), Some(&b"st.a.b"[..]));
        assert!(is_service_token(b"st.a.b"));
        assert!(!is_service_token(b"eyJ.a.b"));
    }
}
