//! What the cloud sources share: their configuration (every endpoint they
//! talk to), the methods, the proofs they produce, their errors, and reading
//! a cloud service's answer under a cap.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use secrecy::SecretString;

pub(crate) use crate::kms::endpoint::truncate;

/// Default AWS instance metadata service.
pub const DEFAULT_AWS_IMDS: &str = "http://169.254.169.254";
/// Default Azure instance metadata service.
pub const DEFAULT_AZURE_IMDS: &str = "http://169.254.169.254";
/// Default GCP metadata server.
pub const DEFAULT_GCP_METADATA: &str = "http://metadata.google.internal";
/// Default timeout of one call to a metadata service or STS.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3);

/// Reads an environment variable (the process environment, or a fixed map
/// in tests).
pub type EnvReader = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// Where the cloud sources look for credentials.
#[derive(Clone)]
pub struct CloudConfig {
    /// STS endpoint (`https://sts.amazonaws.com` or a regional one); `None`
    /// picks the regional endpoint of `AWS_REGION`/`AWS_DEFAULT_REGION`, else
    /// the global one.
    pub aws_sts_endpoint: Option<String>,
    /// AWS instance metadata service (IMDSv2).
    pub aws_imds_endpoint: String,
    /// Azure instance metadata service.
    pub azure_imds_endpoint: String,
    /// GCP metadata server.
    pub gcp_metadata_endpoint: String,
    /// Directory under which `gcpIamAuth` key files may be read; none
    /// refuses every key file.
    pub key_file_dir: Option<PathBuf>,
    /// Timeout of one call.
    pub timeout: Duration,
    /// The environment (AWS variables).
    pub env: EnvReader,
}

impl Default for CloudConfig {
    fn default() -> Self {
        Self {
            aws_sts_endpoint: None,
            aws_imds_endpoint: DEFAULT_AWS_IMDS.to_owned(),
            azure_imds_endpoint: DEFAULT_AZURE_IMDS.to_owned(),
            gcp_metadata_endpoint: DEFAULT_GCP_METADATA.to_owned(),
            key_file_dir: None,
            timeout: DEFAULT_TIMEOUT,
            env: Arc::new(|name| std::env::var(name).ok().filter(|v| !v.trim().is_empty())),
        }
    }
}

impl std::fmt::Debug for CloudConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CloudConfig")
            .field("aws_sts_endpoint", &self.aws_sts_endpoint)
            .field("aws_imds_endpoint", &self.aws_imds_endpoint)
            .field("azure_imds_endpoint", &self.azure_imds_endpoint)
            .field("gcp_metadata_endpoint", &self.gcp_metadata_endpoint)
            .field("key_file_dir", &self.key_file_dir)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl CloudConfig {
    /// A config reading the environment from a fixed map (tests).
    pub fn with_env(mut self, vars: HashMap<String, String>) -> Self {
        self.env = Arc::new(move |name| vars.get(name).cloned().filter(|v| !v.is_empty()));
        self
    }

    /// An HTTP client for metadata services and STS: short timeouts, no
    /// proxy (metadata addresses are link-local).
    pub(crate) fn http(&self) -> Result<reqwest::Client, CloudError> {
        reqwest::Client::builder()
            .user_agent(concat!("kms-operator/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(self.timeout)
            .timeout(self.timeout)
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| CloudError(format!("cannot build an HTTP client: {e}")))
    }
}

/// A cloud login method.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CloudMethod {
    /// AWS IAM (`awsIamAuth`).
    AwsIam,
    /// Azure managed identity (`azureAuth`).
    Azure,
    /// GCP identity token from the metadata server (`gcpIdTokenAuth`).
    GcpIdToken,
    /// GCP service-account key file (`gcpIamAuth`).
    GcpIam,
}

impl CloudMethod {
    /// The spec field that selects it.
    pub fn field(self) -> &'static str {
        match self {
            CloudMethod::AwsIam => "awsIamAuth",
            CloudMethod::Azure => "azureAuth",
            CloudMethod::GcpIdToken => "gcpIdTokenAuth",
            CloudMethod::GcpIam => "gcpIamAuth",
        }
    }
}

/// A signed STS `GetCallerIdentity` request, as the KMS forwards it to STS.
/// `Debug` shows only the method and URL.
#[derive(Clone)]
pub struct SignedRequest {
    /// `POST`.
    pub method: String,
    /// The STS URL.
    pub url: String,
    /// The form body.
    pub body: String,
    /// Every header to send, `Authorization` (with the signature) included.
    pub headers: Vec<(String, String)>,
}

impl std::fmt::Debug for SignedRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignedRequest")
            .field("method", &self.method)
            .field("url", &self.url)
            .field("headers", &"[REDACTED]")
            .finish()
    }
}

/// What a cloud source proves.
pub enum CloudProof {
    /// A signed AWS request.
    Aws(SignedRequest),
    /// A JWT (Azure managed-identity token, GCP identity token or
    /// self-signed service-account JWT).
    Jwt(SecretString),
}

impl std::fmt::Debug for CloudProof {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CloudProof::Aws(r) => f.debug_tuple("Aws").field(r).finish(),
            CloudProof::Jwt(_) => f.write_str("Jwt([REDACTED])"),
        }
    }
}

impl CloudProof {
    /// The login body for `identity_id` (secret material included: build it
    /// right before sending).
    pub fn login_body(&self, identity_id: &str) -> serde_json::Value {
        use base64::Engine;
        use secrecy::ExposeSecret;
        let b64 = |s: &[u8]| base64::engine::general_purpose::STANDARD.encode(s);
        match self {
            CloudProof::Aws(r) => {
                let headers: serde_json::Map<String, serde_json::Value> = r
                    .headers
                    .iter()
                    .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                    .collect();
                let headers = serde_json::to_vec(&headers).unwrap_or_default();
                serde_json::json!({
                    "identityId": identity_id,
                    "iamHttpRequestMethod": r.method,
                    "iamRequestBody": b64(r.body.as_bytes()),
                    "iamRequestHeaders": b64(&headers),
                })
            }
            CloudProof::Jwt(jwt) => serde_json::json!({
                "identityId": identity_id,
                "jwt": jwt.expose_secret(),
            }),
        }
    }
}

/// Why no proof could be produced: which sources were tried and what they
/// answered. Never carries secret material.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CloudError(pub String);

impl std::fmt::Display for CloudError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CloudError {}

/// A source of cloud proofs. Called at every login (never cached here: the
/// KMS token is what is cached and renewed).
pub trait CloudSource: Send + Sync {
    /// The proof for a login as `identity_id`.
    fn proof<'a>(&'a self, identity_id: &'a str) -> BoxFuture<'a, Result<CloudProof, CloudError>>;
}

/// A short description of a failed HTTP call: timeout, connection refused,
/// and so on (the innermost cause).
/// Most of a cloud service's answer that is read (tokens and credentials
/// are a few KiB).
pub(crate) const MAX_CLOUD_BODY: usize = 1024 * 1024;

/// The body of a cloud service's answer, at most [`MAX_CLOUD_BODY`] bytes.
pub(crate) async fn body(resp: reqwest::Response) -> Result<bytes::Bytes, String> {
    crate::kms::endpoint::read_capped(resp, MAX_CLOUD_BODY)
        .await
        .map_err(String::from)
}

/// The body of a cloud service's answer as text (see [`body`]).
pub(crate) async fn text(resp: reqwest::Response) -> Result<String, String> {
    body(resp)
        .await
        .map(|b| String::from_utf8_lossy(&b).into_owned())
}

pub(crate) fn describe(e: &reqwest::Error) -> String {
    let mut source: Option<&dyn std::error::Error> = std::error::Error::source(e);
    let mut last = None;
    while let Some(s) = source {
        last = Some(s.to_string());
        source = s.source();
    }
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "connection failed"
    } else {
        "request failed"
    };
    match last {
        Some(cause) if cause.to_lowercase().contains("refused") => "connection refused".to_owned(),
        Some(cause) => format!("{kind}: {}", truncate(&cause, 200)),
        None => kind.to_owned(),
    }
}

/// The base of an endpoint URL, without trailing slashes.
pub(crate) fn base(url: &str) -> String {
    url.trim().trim_end_matches('/').to_owned()
}
