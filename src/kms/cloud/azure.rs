//! Azure auth: an access token of a managed identity, for the resource the
//! KMS identity expects (default `https://management.azure.com/`), from
//!
//! 1. Microsoft Entra Workload ID (AKS), when its webhook has set
//!    `AZURE_FEDERATED_TOKEN_FILE` and `AZURE_TENANT_ID`: the pod's
//!    federated service-account token (read at every login: the kubelet
//!    rotates it) exchanged at `AZURE_AUTHORITY_HOST` (default
//!    `https://login.microsoftonline.com/`) for a token of the identity
//!    `azureManagedIdentityClientId`, else `AZURE_CLIENT_ID`
//!    (client-credentials grant with the token as client assertion);
//! 2. otherwise the instance metadata service (`GET
//!    /metadata/identity/oauth2/token` with the header `Metadata: true`),
//!    for the identity of `azureManagedIdentityClientId` when the node has
//!    several user-assigned identities.

use futures::future::BoxFuture;
use secrecy::{ExposeSecret, SecretString};

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

    fn env(&self, name: &str) -> Option<String> {
        (self.config.env)(name)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    }

    /// The managed-identity token: Workload ID when the pod has it, else the
    /// instance metadata service.
    pub async fn token(&self) -> Result<SecretString, CloudError> {
        match (
            self.env("AZURE_FEDERATED_TOKEN_FILE"),
            self.env("AZURE_TENANT_ID"),
        ) {
            (Some(file), Some(tenant)) => self.workload_identity(&file, &tenant).await,
            _ => self.instance_metadata().await,
        }
    }

    async fn workload_identity(
        &self,
        file: &str,
        tenant: &str,
    ) -> Result<SecretString, CloudError> {
        let authority = base(
            &self
                .env("AZURE_AUTHORITY_HOST")
                .unwrap_or_else(|| "https://login.microsoftonline.com/".to_owned()),
        );
        let url = format!("{authority}/{tenant}/oauth2/v2.0/token");
        let fail = |what: String| CloudError(format!("no Azure Workload ID token: {url}: {what}"));
        let client_id = self
            .client_id
            .clone()
            .or_else(|| self.env("AZURE_CLIENT_ID"))
            .ok_or_else(|| {
                fail(
                    "no client id (AZURE_CLIENT_ID unset and no azureManagedIdentityClientId)"
                        .to_owned(),
                )
            })?;
        let assertion = SecretString::from(
            tokio::fs::read_to_string(file)
                .await
                .map_err(|e| fail(format!("cannot read the token file {file}: {}", e.kind())))?
                .trim()
                .to_owned(),
        );
        let scope = format!("{}/.default", self.resource.trim_end_matches('/'));
        let form = [
            ("grant_type", "client_credentials"),
            ("client_id", client_id.as_str()),
            ("scope", scope.as_str()),
            (
                "client_assertion_type",
                "urn:ietf:params:oauth:client-assertion-type:jwt-bearer",
            ),
            ("client_assertion", assertion.expose_secret()),
        ];
        let body: String = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(form)
            .finish();
        let http = self.config.http()?;
        let resp = http
            .post(&url)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body)
            .send()
            .await
            .map_err(|e| fail(describe(&e)))?;
        token_answer(resp).await.map_err(fail)
    }

    async fn instance_metadata(&self) -> Result<SecretString, CloudError> {
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
        token_answer(resp).await.map_err(fail)
    }
}

/// The access token of an OAuth token answer (the instance metadata
/// service and Microsoft Entra answer alike), or what went wrong.
async fn token_answer(resp: reqwest::Response) -> Result<SecretString, String> {
    let status = resp.status();
    let body = super::common::body(resp).await?;
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
        return Err(format!(
            "answered {} {error}: {}",
            status.as_u16(),
            truncate(&description, 300)
        ));
    }
    answer
        .and_then(|a| a.access_token)
        .ok_or_else(|| "the answer has no access_token".to_owned())
}

impl CloudSource for AzureSource {
    fn proof<'a>(&'a self, _identity_id: &'a str) -> BoxFuture<'a, Result<CloudProof, CloudError>> {
        Box::pin(async move { self.token().await.map(CloudProof::Jwt) })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
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
    async fn workload_identity_exchanges_the_federated_token() {
        let entra = StandIn::start(|seen| {
            let ok = seen.uri == "/tenant-1/oauth2/v2.0/token"
                && seen.body.contains("grant_type=client_credentials")
                && seen.body.contains("client_id=wi-client")
                && seen.body.contains("scope=https%3A%2F%2Fmanagement.azure.com%2F.default")
                && seen.body.contains(
                    "client_assertion_type=urn%3Aietf%3Aparams%3Aoauth%3Aclient-assertion-type%3Ajwt-bearer",
                )
                && seen.body.contains("client_assertion=federated-jwt");
            if ok {
                (200, r#"{"token_type":"Bearer","expires_in":3599,"access_token":"entra-jwt"}"#.to_owned())
            } else {
                (401, r#"{"error":"invalid_client","error_description":"AADSTS700213: No matching federated identity record found"}"#.to_owned())
            }
        })
        .await;
        let dir = std::env::temp_dir().join(format!("kms-azure-wi-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("azure-identity-token");
        std::fs::write(&file, "federated-jwt\n").unwrap();
        let env = |client: &str| {
            HashMap::from([
                (
                    "AZURE_FEDERATED_TOKEN_FILE".to_owned(),
                    file.to_str().unwrap().to_owned(),
                ),
                ("AZURE_TENANT_ID".to_owned(), "tenant-1".to_owned()),
                ("AZURE_CLIENT_ID".to_owned(), client.to_owned()),
                ("AZURE_AUTHORITY_HOST".to_owned(), format!("{}/", entra.url)),
            ])
        };
        // The instance metadata service is never asked (closed port).
        let imds = closed_port().await;
        let source = AzureSource::new(config(&imds).with_env(env("wi-client")), None, None);
        assert_eq!(source.token().await.unwrap().expose_secret(), "entra-jwt");
        // The resource's client id wins over the webhook's.
        let source = AzureSource::new(
            config(&imds).with_env(env("other")),
            None,
            Some("wi-client"),
        );
        assert_eq!(source.token().await.unwrap().expose_secret(), "entra-jwt");
        // A refusal carries Entra's reason, never the token.
        let source = AzureSource::new(config(&imds).with_env(env("unknown")), None, None);
        let err = source.token().await.unwrap_err().0;
        assert!(
            err.contains("answered 401 invalid_client: AADSTS700213"),
            "{err}"
        );
        assert!(!err.contains("federated-jwt"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
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
