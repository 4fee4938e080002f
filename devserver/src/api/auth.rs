//! Authentication: universal-auth login, token renew and revoke, the
//! Kubernetes-auth login (which answers as for an identity without
//! Kubernetes auth until that method is served), and the check of the
//! bearer token every other route makes.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, header};
use serde::Serialize;

use super::ApiResult;
use crate::app::App;
use crate::clock::now_ms;
use crate::errors::{ApiError, ok};
use crate::ids::random_uuid;
use crate::model::{AccessToken, Identity};
use crate::store::{Kind, Record, Tx};
use crate::token::JwtError;
use crate::validate::{Fields, read_json};

/// The identity a request is made as.
#[derive(Debug, Clone)]
pub(crate) struct Caller {
    pub identity: Identity,
}

impl Caller {
    /// Whether the identity is a member of the project.
    pub fn member_of(&self, project_id: &str) -> bool {
        self.identity.projects.iter().any(|p| p == project_id)
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

/// The identity of the bearer token of a request.
pub(crate) async fn caller(app: &App, headers: &HeaderMap) -> Result<Caller, ApiError> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Err(ApiError::unauthorized("Token missing"));
    };
    // The real server drops the first seven characters ("Bearer ").
    let token = value.as_bytes().get(7..).unwrap_or_default();
    if token.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::unauthorized("Token missing"));
    }
    let token = std::str::from_utf8(token).map_err(|_| JwtError::Malformed)?;
    let (_, identity) = live_token(app, token.trim(), "authenticate identity access token").await?;
    Ok(Caller { identity })
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
    let now = now_ms();
    let token = AccessToken {
        id: random_uuid(),
        identity_id: identity.id.clone(),
        created_at: now,
        last_renewed_at: None,
        ttl: ua.access_token_ttl,
        max_ttl: ua.access_token_max_ttl,
    };
    let iat = now / 1000;
    let exp = (ua.access_token_max_ttl > 0)
        .then(|| iat.saturating_add(i64::try_from(ua.access_token_max_ttl).unwrap_or(i64::MAX)));
    let jwt = app.signer.issue(&identity.id, &token.id, iat, exp);
    let out = TokenOut {
        access_token: jwt,
        expires_in: ua.access_token_ttl,
        access_token_max_ttl: ua.access_token_max_ttl,
        token_type: "Bearer",
    };
    app.store
        .commit(&mut st, Tx::one(Record::Token(token)))
        .await?;
    tracing::debug!(identity = %identity.name, "universal-auth login");
    Ok(ok(&out))
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

/// `POST /api/v1/auth/kubernetes-auth/login`: no identity has Kubernetes
/// auth yet, so every well-formed login gets the real server's answer for
/// an identity without it.
pub(crate) async fn kubernetes_login(State(_app): State<App>, req: Request) -> ApiResult {
    let (parts, body) = req.into_parts();
    let body = read_json(&parts.headers, body).await?;
    let mut f = Fields::of(body.as_ref());
    f.required_string("identityId");
    f.required_string("jwt");
    f.finish()?;
    Err(ApiError::not_found(
        "Kubernetes auth method not found for identity, did you configure Kubernetes auth?",
    ))
}
