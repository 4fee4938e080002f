//! Azure auth: a managed-identity access token from the Azure instance
//! metadata service (`GET /metadata/identity/oauth2/token` with the header
//! `Metadata: true`), for the resource the KMS identity expects (default
//! `https://management.azure.com/`) and, when the pod has several
//! user-assigned identities, the one of `azureManagedIdentityClientId`.

use futures::future::BoxFuture;
use secrecy::SecretString;

use super::common::{CloudConfig, CloudError, CloudProof, CloudSource, base, describe, truncate};

/// Resource of a token when the resource names none.
pub const DEFAULT_RESOURCE: &str = "https://management.azure.com/";

/// The Azure managed-identity source.
pub struct AzureSource {
    config: CloudConfig,
    resource: String,
    client_id: Option<String>,
}

impl AzureSource {
    /// A source for `resource` (default [`DEFAULT_RESOURCE`]) and an optional
    /// user-assigned identity.
    pub fn new(config: CloudConfig, resource: Option<&str>, client_id: Option<&str>) -> Self {
        Self {
            config,
            resource: resource
                .map(str::trim)
                .filter(|r| !r.is_empty())
                .unwrap_or(DEFAULT_RESOURCE)
                .to_owned(),
            client_id: client_id
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(str::to_owned),
        }
    }

    /// The managed-identity token.
    pub async fn token(&self) -> Result<SecretString, CloudError> {
        let imds = base(&self.config.azure_imds_endpoint);
        let fail = |what: String| {
            CloudError(format!(
                "no Azure managed-identity token: instance metadata at {imds}: {what}"
            ))
        };
        let http = self.config.http()?;
        let mut query = vec![
            ("api-version", "2018-02-01"),
            ("resource", self.resource.as_str()),
        ];
        if let Some(id) = &self.client_id {
            query.push(("client_id", id.as_str()));
        }
        let resp = http
            .get(format!("{imds}/metadata/identity/oauth2/token"))
            .query(&query)
            .header("Metadata", "true")
            .send()
            .await
            .map_err(|e| fail(describe(&e)))?;
        let status = resp.status();
        let body = super::common::body(resp).await.map_err(fail)?;
        #[derive(serde::Deserialize)]
        struct Answer {
            #[serde(default)]
            access_token: Option<SecretString>,
            #[serde(default)]
            error: Option<String>,
            #[serde(default)]
            error_description: Option<String>,
        }
        let answer: Option<Answer> = serde_json::from_slice(&body).ok();
        if !status.is_success() {
            let (error, description) = answer
                .map(|a| {
                    (
                        a.error.unwrap_or_default(),
                        a.error_description.unwrap_or_default(),
                    )
                })
                .unwrap_or_default();
            return Err(fail(format!(
                "answered {} {error}: {}",
                status.as_u16(),
                truncate(&description, 300)
            )));
        }
        answer
            .and_then(|a| a.access_token)
            .ok_or_else(|| fail("the answer has no access_token".to_owned()))
    }
}

impl CloudSource for AzureSource {
    fn proof<'a>(&'a self, _identity_id: &'a str) -> BoxFuture<'a, Result<CloudProof, CloudError>> {
        Box::pin(async move { self.token().await.map(CloudProof::Jwt) })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use secrecy::ExposeSecret;

    use super::super::stand_in::{StandIn, closed_port};
    use super::*;

    fn config(imds: &str) -> CloudConfig {
        CloudConfig {
            azure_imds_endpoint: imds.to_owned(),
            timeout: Duration::from_secs(2),
            ..CloudConfig::default()
        }
    }

    #[tokio::test]
    async fn token_from_instance_metadata() {
        let imds = StandIn::start(|seen| {
            if StandIn::header(seen, "metadata").as_deref() != Some("true") {
                return (400, r#"{"error":"invalid_request","error_description":"Required metadata header not specified"}"#.to_owned());
            }
            if seen.uri.contains("client_id=unknown") {
                return (400, r#"{"error":"invalid_request","error_description":"Identity not found"}"#.to_owned());
            }
            (200, r#"{"access_token":"azure-jwt","expires_in":"3599","token_type":"Bearer"}"#.to_owned())
        })
        .await;
        let source = AzureSource::new(config(&imds.url), None, Some("client-1"));
        assert_eq!(source.token().await.unwrap().expose_secret(), "azure-jwt");
        let seen = imds.seen.lock().unwrap()[0].clone();
        assert!(
            seen.uri.starts_with("/metadata/identity/oauth2/token?"),
            "{}",
            seen.uri
        );
        assert!(seen.uri.contains("api-version=2018-02-01"), "{}", seen.uri);
        assert!(
            seen.uri
                .contains("resource=https%3A%2F%2Fmanagement.azure.com%2F"),
            "{}",
            seen.uri
        );
        assert!(seen.uri.contains("client_id=client-1"), "{}", seen.uri);

        let source = AzureSource::new(config(&imds.url), Some("api://kms"), Some("unknown"));
        let err = source.token().await.unwrap_err().0;
        assert!(
            err.contains("answered 400 invalid_request: Identity not found"),
            "{err}"
        );
        assert!(err.contains(&imds.url), "{err}");
    }

    #[tokio::test]
    async fn unreachable_metadata_is_reported() {
        let url = closed_port().await;
        let err = AzureSource::new(config(&url), None, None)
            .token()
            .await
            .unwrap_err()
            .0;
        assert_eq!(
            err,
            format!(
                "no Azure managed-identity token: instance metadata at {url}: connection refused"
            )
        );
    }
}
