//! Calls to the KMS's public API as a client of it would make them
//! (universal-auth login, creating or updating a secret), for tests that
//! change the KMS through the routes the dev server counts and faults.
//! The admin API, which it neither counts nor faults, is on
//! [`crate::DevServer`].

use serde_json::{Value, json};

/// Logs in with universal auth at `api` (`<url>/api`); the access token.
pub async fn login(
    http: &reqwest::Client,
    api: &str,
    client_id: &str,
    client_secret: &str,
) -> anyhow::Result<String> {
    let answer: Value = http
        .post(format!("{api}/v1/auth/universal-auth/login"))
        .json(&json!({"clientId": client_id, "clientSecret": client_secret}))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    answer["accessToken"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| anyhow::anyhow!("login at {api}: no accessToken in the answer"))
}

/// Where a secret lives.
#[derive(Clone, Copy, Debug)]
pub struct Folder<'a> {
    /// Project slug.
    pub project: &'a str,
    /// Environment slug.
    pub environment: &'a str,
    /// Folder path.
    pub path: &'a str,
}

/// Updates `key` in `folder` with `value`, creating it when it does not
/// exist (the update answers 404).
pub async fn set_secret(
    http: &reqwest::Client,
    api: &str,
    token: &str,
    folder: Folder<'_>,
    key: &str,
    value: &str,
) -> anyhow::Result<()> {
    let url = format!("{api}/v3/secrets/raw/{key}");
    let body = json!({
        "projectSlug": folder.project,
        "environment": folder.environment,
        "secretPath": folder.path,
        "secretValue": value,
    });
    let update = http
        .patch(&url)
        .bearer_auth(token)
        .json(&body)
        .send()
        .await?;
    let (what, status) = if update.status() == reqwest::StatusCode::NOT_FOUND {
        let create = http
            .post(&url)
            .bearer_auth(token)
            .json(&body)
            .send()
            .await?;
        ("create", create.status())
    } else {
        ("update", update.status())
    };
    anyhow::ensure!(status.is_success(), "{what} {key}: {status}");
    Ok(())
}

/// The secrets of `folder` as the KMS lists them (`GET /v3/secrets/raw`):
/// each secret's JSON object (`secretKey`, `secretValue`, `secretComment`, …).
pub async fn list_secrets(
    http: &reqwest::Client,
    api: &str,
    token: &str,
    folder: Folder<'_>,
) -> anyhow::Result<Vec<Value>> {
    let body: Value = http
        .get(format!("{api}/v3/secrets/raw"))
        .query(&[
            ("workspaceSlug", folder.project),
            ("environment", folder.environment),
            ("secretPath", folder.path),
        ])
        .bearer_auth(token)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    match body["secrets"].as_array() {
        Some(secrets) => Ok(secrets.clone()),
        None => anyhow::bail!("list {}: no secrets in the answer", folder.path),
    }
}
