//! Dynamic-secret leases: create, renew, revoke, and the project id → slug
//! lookup the lease endpoints need (they address projects by slug).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

use super::auth::Identity;
use super::client::{Kms, parse, urlencode};
use super::error::KmsError;

const CREATE: &str = "POST /api/v1/dynamic-secrets/leases";
const RENEW: &str = "POST /api/v1/dynamic-secrets/leases/:leaseId/renew";
const REVOKE: &str = "DELETE /api/v1/dynamic-secrets/leases/:leaseId";
const WORKSPACE: &str = "GET /api/v1/workspace/:id";

/// Which dynamic secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseTarget {
    /// Project slug.
    pub project_slug: String,
    /// Environment slug.
    pub environment: String,
    /// Folder path.
    pub path: String,
    /// Dynamic secret name.
    pub name: String,
}

/// A lease as the KMS reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// Lease id.
    pub id: String,
    /// Version.
    pub version: i64,
    /// When it expires unless renewed.
    pub expire_at: Timestamp,
}

/// A new lease with its credentials.
pub struct CreatedLease {
    /// The lease.
    pub lease: Lease,
    /// The credentials, by key.
    pub data: BTreeMap<String, SecretString>,
    /// Id of the dynamic secret.
    pub dynamic_secret_id: String,
    /// The dynamic secret's maximum lease lifetime, as the KMS writes it.
    pub max_ttl: Option<String>,
    /// The dynamic secret's default TTL, as the KMS writes it.
    pub default_ttl: Option<String>,
}

impl std::fmt::Debug for CreatedLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CreatedLease")
            .field("lease", &self.lease)
            .field("keys", &self.data.keys().collect::<Vec<_>>())
            .field("max_ttl", &self.max_ttl)
            .finish()
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LeaseBody {
    id: String,
    #[serde(default)]
    version: i64,
    expire_at: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DynamicSecretBody {
    #[serde(default)]
    id: String,
    #[serde(default, rename = "maxTTL")]
    max_ttl: Option<String>,
    #[serde(default, rename = "defaultTTL")]
    default_ttl: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CreateBody {
    lease: LeaseBody,
    dynamic_secret: DynamicSecretBody,
    #[serde(default)]
    data: BTreeMap<String, serde_json::Value>,
}

#[derive(Deserialize)]
struct LeaseOnly {
    lease: LeaseBody,
}

#[derive(Deserialize)]
struct WorkspaceBody {
    workspace: super::model::Project,
}

fn lease_of(route: &'static str, b: LeaseBody) -> Result<Lease, KmsError> {
    let expire_at = b
        .expire_at
        .parse::<Timestamp>()
        .map_err(|e| KmsError::Decode {
            endpoint: route,
            reason: format!("lease expireAt is not a timestamp: {e}"),
        })?;
    Ok(Lease {
        id: b.id,
        version: b.version,
        expire_at,
    })
}

/// The body of a lease request: where the dynamic secret is, and the TTL
/// asked for (the default when `None`).
fn lease_body(target: &LeaseTarget, ttl: Option<&str>) -> serde_json::Value {
    let mut body = serde_json::json!({
        "projectSlug": target.project_slug,
        "environmentSlug": target.environment,
        "path": target.path,
    });
    if let Some(ttl) = ttl {
        body["ttl"] = serde_json::json!(ttl);
    }
    body
}

impl Kms {
    /// POST `body` to `url` (the route `route`) with the identity's token:
    /// the answer, parsed.
    async fn post<T: serde::de::DeserializeOwned>(
        &self,
        identity: &Identity,
        route: &'static str,
        url: &str,
        body: &serde_json::Value,
    ) -> Result<T, KmsError> {
        self.with_token(identity, |token| async move {
            let reply = self
                .send(&identity.endpoint, route, |c| {
                    c.post(url).bearer_auth(token.expose_secret()).json(body)
                })
                .await?;
            parse(route, &reply)
        })
        .await
    }

    /// The slug of a project given its id.
    pub async fn project_slug(
        &self,
        identity: &Identity,
        project_id: &str,
    ) -> Result<String, KmsError> {
        let url = format!(
            "{}/v1/workspace/{}",
            identity.endpoint.base,
            urlencode(project_id)
        );
        self.with_token(identity, |token| {
            let url = url.clone();
            async move {
                let reply = self
                    .send(&identity.endpoint, WORKSPACE, |c| {
                        c.get(&url).bearer_auth(token.expose_secret())
                    })
                    .await?;
                let body: WorkspaceBody = parse(WORKSPACE, &reply)?;
                Ok(body.workspace.slug)
            }
        })
        .await
    }

    /// Create a lease (`ttl` as the KMS reads it, e.g. `1h`; default TTL
    /// when `None`).
    pub async fn create_lease(
        &self,
        identity: &Identity,
        target: &LeaseTarget,
        ttl: Option<&str>,
    ) -> Result<CreatedLease, KmsError> {
        let url = format!("{}/v1/dynamic-secrets/leases", identity.endpoint.base);
        let mut body = lease_body(target, ttl);
        body["dynamicSecretName"] = serde_json::json!(target.name);
        let b: CreateBody = self.post(identity, CREATE, &url, &body).await?;
        let data = b
            .data
            .into_iter()
            .map(|(k, v)| {
                let text = match v {
                    serde_json::Value::String(s) => s,
                    other => other.to_string(),
                };
                (k, SecretString::from(text))
            })
            .collect();
        Ok(CreatedLease {
            lease: lease_of(CREATE, b.lease)?,
            data,
            dynamic_secret_id: b.dynamic_secret.id,
            max_ttl: b.dynamic_secret.max_ttl.filter(|m| !m.is_empty()),
            default_ttl: b.dynamic_secret.default_ttl.filter(|m| !m.is_empty()),
        })
    }

    /// Renew a lease by `ttl` (default TTL when `None`).
    pub async fn renew_lease(
        &self,
        identity: &Identity,
        target: &LeaseTarget,
        lease_id: &str,
        ttl: Option<&str>,
    ) -> Result<Lease, KmsError> {
        let url = format!(
            "{}/v1/dynamic-secrets/leases/{}/renew",
            identity.endpoint.base,
            urlencode(lease_id)
        );
        let b: LeaseOnly = self
            .post(identity, RENEW, &url, &lease_body(target, ttl))
            .await?;
        lease_of(RENEW, b.lease)
    }

    /// Revoke a lease. A lease the KMS no longer knows (expired, revoked)
    /// counts as revoked.
    pub async fn revoke_lease(
        &self,
        identity: &Identity,
        target: &LeaseTarget,
        lease_id: &str,
    ) -> Result<(), KmsError> {
        let url = format!(
            "{}/v1/dynamic-secrets/leases/{}",
            identity.endpoint.base,
            urlencode(lease_id)
        );
        let body = serde_json::json!({
            "projectSlug": target.project_slug,
            "environmentSlug": target.environment,
            "path": target.path,
            "isForced": false,
        });
        let result = self
            .with_token(identity, |token| {
                let (url, body) = (url.clone(), body.clone());
                async move {
                    let reply = self
                        .send(&identity.endpoint, REVOKE, |c| {
                            c.delete(&url)
                                .bearer_auth(token.expose_secret())
                                .json(&body)
                        })
                        .await?;
                    parse::<serde_json::Value>(REVOKE, &reply).map(|_| ())
                }
            })
            .await;
        match result {
            Err(KmsError::Api { status: 404, .. }) => Ok(()),
            other => other,
        }
    }
}

/// Whether a renewal error means the lease cannot be renewed any more (it
/// is gone, or renewing would pass its maximum lifetime), so a new lease is
/// needed. Matches the status and the messages of old and new servers.
pub fn renewal_refused(e: &KmsError) -> bool {
    match e {
        KmsError::Api { status: 404, .. } => true,
        KmsError::Api {
            status: 400,
            message,
            ..
        } => {
            let m = message.to_ascii_lowercase();
            m.contains("max ttl") || m.contains("maximum allowed lease") || m.contains("max_ttl")
        }
        _ => false,
    }
}

/// Parse a TTL as the KMS writes it: `1h`, `1h30m`, `90s`, `2d`, or seconds.
pub fn parse_ttl(s: &str) -> Option<Duration> {
    let t = s.trim();
    if t.is_empty() {
        return None;
    }
    crate::api::duration::parse_duration(t)
        .ok()
        .filter(|d| !d.is_zero())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(status: u16, message: &str) -> KmsError {
        KmsError::Api {
            endpoint: RENEW,
            status,
            error: "BadRequest".into(),
            message: message.into(),
        }
    }

    #[test]
    fn refused_renewals_are_recognised_across_server_versions() {
        assert!(renewal_refused(&api(
            400,
            "TTL cannot be larger than max ttl"
        )));
        assert!(renewal_refused(&api(
            400,
            "The requested renewal would exceed the maximum allowed lease duration. Please choose a shorter TTL"
        )));
        assert!(renewal_refused(&api(
            404,
            "Dynamic secret lease with ID 'x' not found"
        )));
        assert!(!renewal_refused(&api(
            400,
            "TTL must be a greater than 1min"
        )));
        assert!(!renewal_refused(&api(503, "down")));
    }

    #[test]
    fn ttl_formats() {
        assert_eq!(parse_ttl("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_ttl("24h"), Some(Duration::from_secs(86_400)));
        assert_eq!(parse_ttl("3600"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_ttl(""), None);
        assert_eq!(parse_ttl("0s"), None);
    }

    #[test]
    fn created_lease_debug_hides_credentials() {
        let c = CreatedLease {
            lease: Lease {
                id: "l".into(),
                version: 1,
                expire_at: Timestamp::UNIX_EPOCH,
            },
            data: [(
                "DB_PASSWORD".to_owned(),
                SecretString::from("hunter2".to_owned()),
            )]
            .into(),
            dynamic_secret_id: "d".into(),
            max_ttl: None,
            default_ttl: None,
        };
        let d = format!("{c:?}");
        assert!(d.contains("DB_PASSWORD") && !d.contains("hunter2"), "{d}");
    }
}
