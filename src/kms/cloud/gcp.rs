//! GCP auth, both variants the KMS's `gcp-auth` login accepts:
//!
//! - ID token (`gcpIdTokenAuth`): an identity token of the pod's service
//!   account from the metadata server
//!   (`GET /computeMetadata/v1/instance/service-accounts/default/identity`
//!   with `Metadata-Flavor: Google`), with the KMS identity id as audience;
//! - IAM (`gcpIamAuth`): a JWT signed (RS256) with the private key of a
//!   service-account key file (`client_email`, `private_key`,
//!   `private_key_id`). The file is read only from under `--key-file-dir`;
//!   a path that leaves it (`..`, symlinks) is refused. The JWT names the
//!   service account as issuer and subject, the identity id as audience, and
//!   lives ten minutes; the KMS checks it against the key Google publishes
//!   for the service account.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use futures::future::BoxFuture;
use secrecy::{ExposeSecret, SecretString};

use super::common::{CloudConfig, CloudError, CloudProof, CloudSource, base, describe, truncate};

/// Lifetime of a self-signed service-account JWT.
const JWT_LIFETIME_SECS: u64 = 600;

/// The GCP ID-token source.
pub struct GcpIdTokenSource {
    config: CloudConfig,
}

impl GcpIdTokenSource {
    /// A source asking the metadata server of `config`.
    pub fn new(config: CloudConfig) -> Self {
        Self { config }
    }

    /// An identity token for `audience`.
    pub async fn token(&self, audience: &str) -> Result<SecretString, CloudError> {
        let server = base(&self.config.gcp_metadata_endpoint);
        let fail = |what: String| {
            CloudError(format!(
                "no GCP identity token: metadata server at {server}: {what}"
            ))
        };
        let http = self.config.http()?;
        let resp = http
            .get(format!(
                "{server}/computeMetadata/v1/instance/service-accounts/default/identity"
            ))
            .query(&[("audience", audience), ("format", "full")])
            .header("Metadata-Flavor", "Google")
            .send()
            .await
            .map_err(|e| fail(describe(&e)))?;
        let status = resp.status();
        let text = super::common::text(resp).await.map_err(fail)?;
        if !status.is_success() {
            return Err(fail(format!(
                "answered {}: {}",
                status.as_u16(),
                truncate(text.trim(), 300)
            )));
        }
        let token = text.trim();
        if token.split('.').count() != 3 {
            return Err(fail("the answer is not a JWT".to_owned()));
        }
        Ok(SecretString::from(token.to_owned()))
    }
}

impl CloudSource for GcpIdTokenSource {
    fn proof<'a>(&'a self, identity_id: &'a str) -> BoxFuture<'a, Result<CloudProof, CloudError>> {
        Box::pin(async move { self.token(identity_id).await.map(CloudProof::Jwt) })
    }
}

/// The GCP IAM source: a service-account key file.
pub struct GcpIamSource {
    config: CloudConfig,
    path: String,
}

/// The parts of a key file used.
#[derive(serde::Deserialize)]
struct KeyFile {
    client_email: String,
    private_key: SecretString,
    #[serde(default)]
    private_key_id: Option<String>,
}

impl GcpIamSource {
    /// A source reading the key file at `path` (absolute, or relative to
    /// `--key-file-dir`).
    pub fn new(config: CloudConfig, path: &str) -> Self {
        Self {
            config,
            path: path.trim().to_owned(),
        }
    }

    /// The key file's path, checked to lie under `--key-file-dir`.
    pub fn resolve(&self) -> Result<PathBuf, CloudError> {
        resolve_under(self.config.key_file_dir.as_deref(), &self.path)
    }

    /// A JWT for `audience`, signed with the key file's key, issued `now`.
    pub async fn jwt(&self, audience: &str, now: SystemTime) -> Result<SecretString, CloudError> {
        let path = self.resolve()?;
        let shown = path.display().to_string();
        let raw = tokio::fs::read(&path).await.map_err(|e| {
            CloudError(format!(
                "gcpIamAuth: cannot read the key file {shown}: {}",
                e.kind()
            ))
        })?;
        let key: KeyFile = serde_json::from_slice(&raw).map_err(|_| {
            CloudError(format!(
                "gcpIamAuth: the key file {shown} is not a service-account key (JSON with client_email and private_key)"
            ))
        })?;
        sign_jwt(&key, audience, now)
            .map_err(|e| CloudError(format!("gcpIamAuth: the key file {shown}: {e}")))
    }
}

impl CloudSource for GcpIamSource {
    fn proof<'a>(&'a self, identity_id: &'a str) -> BoxFuture<'a, Result<CloudProof, CloudError>> {
        Box::pin(async move {
            self.jwt(identity_id, SystemTime::now())
                .await
                .map(CloudProof::Jwt)
        })
    }
}

/// `path` (absolute, or relative to `dir`) resolved with symlinks, if it
/// lies under `dir`.
pub fn resolve_under(dir: Option<&Path>, path: &str) -> Result<PathBuf, CloudError> {
    let Some(dir) = dir else {
        return Err(CloudError(
            "gcpIamAuth: key files are not allowed: the operator runs without --key-file-dir"
                .to_owned(),
        ));
    };
    if path.is_empty() {
        return Err(CloudError(
            "gcpIamAuth: serviceAccountKeyFilePath is empty".to_owned(),
        ));
    }
    let root = dir.canonicalize().map_err(|e| {
        CloudError(format!(
            "gcpIamAuth: --key-file-dir {} cannot be used: {}",
            dir.display(),
            e.kind()
        ))
    })?;
    let wanted = dir.join(path);
    let resolved = wanted.canonicalize().map_err(|e| {
        CloudError(format!(
            "gcpIamAuth: the key file {path} cannot be read: {}",
            e.kind()
        ))
    })?;
    if !resolved.starts_with(&root) || resolved == root {
        return Err(CloudError(format!(
            "gcpIamAuth: the key file {path} is not under --key-file-dir {}",
            dir.display()
        )));
    }
    Ok(resolved)
}

fn b64url(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// The DER of the first `PRIVATE KEY` block of a PEM text.
fn pem_pkcs8(pem: &str) -> Result<Vec<u8>, String> {
    const BEGIN: &str = "-----BEGIN PRIVATE KEY-----";
    const END: &str = "-----END PRIVATE KEY-----";
    let start = pem
        .find(BEGIN)
        .ok_or("private_key is not a PEM PRIVATE KEY (PKCS#8)")?
        + BEGIN.len();
    let end = start
        + pem[start..]
            .find(END)
            .ok_or("private_key: unterminated PEM")?;
    let body: String = pem[start..end]
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    base64::engine::general_purpose::STANDARD
        .decode(body)
        .map_err(|_| "private_key: invalid base64 in the PEM".to_owned())
}

fn sign_jwt(key: &KeyFile, audience: &str, now: SystemTime) -> Result<SecretString, String> {
    let der = pem_pkcs8(key.private_key.expose_secret())?;
    let pair = ring::signature::RsaKeyPair::from_pkcs8(&der)
        .map_err(|e| format!("private_key is not a usable RSA key ({e})"))?;
    let iat = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let mut header = serde_json::json!({"alg": "RS256", "typ": "JWT"});
    if let Some(kid) = key.private_key_id.as_deref().filter(|k| !k.is_empty()) {
        header["kid"] = serde_json::Value::String(kid.to_owned());
    }
    let claims = serde_json::json!({
        "iss": key.client_email,
        "sub": key.client_email,
        "email": key.client_email,
        "aud": audience,
        "iat": iat,
        "exp": iat + JWT_LIFETIME_SECS,
    });
    let signing_input = format!(
        "{}.{}",
        b64url(header.to_string().as_bytes()),
        b64url(claims.to_string().as_bytes())
    );
    let mut signature = vec![0; pair.public().modulus_len()];
    pair.sign(
        &ring::signature::RSA_PKCS1_SHA256,
        &ring::rand::SystemRandom::new(),
        signing_input.as_bytes(),
        &mut signature,
    )
    .map_err(|_| "signing failed".to_owned())?;
    Ok(SecretString::from(format!(
        "{signing_input}.{}",
        b64url(&signature)
    )))
}

#[cfg(test)]
pub(crate) mod tests {
    use std::time::Duration;

    use super::super::stand_in::{StandIn, closed_port};
    use super::*;

    /// A 2048-bit RSA test key (PKCS#8), made for these tests only.
    pub(crate) const TEST_KEY_PEM: &str = include_str!("testdata/rsa-test-key.pem");

    fn temp_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "kms-gcp-{tag}-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[tokio::test]
    async fn id_token_from_the_metadata_server() {
        let server = StandIn::start(|seen| {
            if StandIn::header(seen, "metadata-flavor").as_deref() != Some("Google") {
                return (403, "Missing Metadata-Flavor:Google header.".to_owned());
            }
            (200, "aaa.bbb.ccc".to_owned())
        })
        .await;
        let source = GcpIdTokenSource::new(CloudConfig {
            gcp_metadata_endpoint: server.url.clone(),
            timeout: Duration::from_secs(2),
            ..CloudConfig::default()
        });
        let token = source.token("identity-1").await.unwrap();
        assert_eq!(token.expose_secret(), "aaa.bbb.ccc");
        let seen = server.seen.lock().unwrap()[0].clone();
        assert_eq!(
            seen.uri,
            "/computeMetadata/v1/instance/service-accounts/default/identity?audience=identity-1&format=full"
        );

        let url = closed_port().await;
        let err = GcpIdTokenSource::new(CloudConfig {
            gcp_metadata_endpoint: url.clone(),
            ..CloudConfig::default()
        })
        .token("identity-1")
        .await
        .unwrap_err()
        .0;
        assert_eq!(
            err,
            format!("no GCP identity token: metadata server at {url}: connection refused")
        );
    }

    #[tokio::test]
    async fn key_file_jwt_verifies_with_the_public_key() {
        let dir = temp_dir("iam");
        let key = serde_json::json!({
            "type": "service_account",
            "client_email": "sa@proj.iam.gserviceaccount.com",
            "private_key_id": "kid-1",
            "private_key": TEST_KEY_PEM,
        });
        std::fs::write(dir.join("key.json"), key.to_string()).unwrap();
        let source = GcpIamSource::new(
            CloudConfig {
                key_file_dir: Some(dir.clone()),
                ..CloudConfig::default()
            },
            "key.json",
        );
        let now = SystemTime::now();
        let jwt = source.jwt("identity-1", now).await.unwrap();
        let jwt = jwt.expose_secret();
        let parts: Vec<&str> = jwt.split('.').collect();
        assert_eq!(parts.len(), 3);
        let decode = |s: &str| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(s)
                .unwrap()
        };
        let header: serde_json::Value = serde_json::from_slice(&decode(parts[0])).unwrap();
        assert_eq!(header["alg"], "RS256");
        assert_eq!(header["kid"], "kid-1");
        let claims: serde_json::Value = serde_json::from_slice(&decode(parts[1])).unwrap();
        assert_eq!(claims["aud"], "identity-1");
        assert_eq!(claims["sub"], "sa@proj.iam.gserviceaccount.com");
        let iat = claims["iat"].as_u64().unwrap();
        assert_eq!(claims["exp"].as_u64().unwrap(), iat + 600);
        // The signature verifies with the key's public half.
        let der = pem_pkcs8(TEST_KEY_PEM).unwrap();
        let pair = ring::signature::RsaKeyPair::from_pkcs8(&der).unwrap();
        let public = ring::signature::UnparsedPublicKey::new(
            &ring::signature::RSA_PKCS1_2048_8192_SHA256,
            pair.public().as_ref(),
        );
        public
            .verify(
                format!("{}.{}", parts[0], parts[1]).as_bytes(),
                &decode(parts[2]),
            )
            .unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn key_files_outside_the_directory_are_refused() {
        let dir = temp_dir("escape");
        let inner = dir.join("keys");
        std::fs::create_dir_all(&inner).unwrap();
        std::fs::write(inner.join("ok.json"), "{}").unwrap();
        std::fs::write(dir.join("outside.json"), "{}").unwrap();
        assert!(resolve_under(Some(&inner), "ok.json").is_ok());
        let abs = inner.join("ok.json");
        assert!(resolve_under(Some(&inner), abs.to_str().unwrap()).is_ok());
        for bad in [
            "../outside.json",
            dir.join("outside.json").to_str().unwrap(),
        ] {
            let err = resolve_under(Some(&inner), bad).unwrap_err().0;
            assert!(err.contains("is not under --key-file-dir"), "{bad}: {err}");
        }
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(dir.join("outside.json"), inner.join("link.json")).unwrap();
            let err = resolve_under(Some(&inner), "link.json").unwrap_err().0;
            assert!(err.contains("is not under --key-file-dir"), "{err}");
        }
        let err = resolve_under(None, "ok.json").unwrap_err().0;
        assert!(err.contains("without --key-file-dir"), "{err}");
        let err = resolve_under(Some(&inner), "missing.json").unwrap_err().0;
        assert!(err.contains("cannot be read"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn bad_key_files_are_reported_without_their_content() {
        let dir = temp_dir("bad");
        std::fs::write(
            dir.join("k.json"),
            r#"{"client_email":"a@b","private_key":"secret-not-pem"}"#,
        )
        .unwrap();
        let source = GcpIamSource::new(
            CloudConfig {
                key_file_dir: Some(dir.clone()),
                ..CloudConfig::default()
            },
            "k.json",
        );
        let err = source.jwt("id", SystemTime::now()).await.unwrap_err().0;
        assert!(err.contains("not a PEM PRIVATE KEY"), "{err}");
        assert!(!err.contains("secret-not-pem"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
