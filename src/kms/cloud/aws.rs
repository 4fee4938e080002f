//! AWS IAM auth: a SigV4-signed STS `GetCallerIdentity` request.
//!
//! The KMS forwards the signed request to STS and learns from the answer
//! which IAM principal the operator runs as. The request is signed with the
//! pod's ambient credentials, looked up in this order:
//!
//! 1. the environment: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and, for
//!    temporary credentials, `AWS_SESSION_TOKEN`;
//! 2. a web identity (EKS IAM roles for service accounts): the token file of
//!    `AWS_WEB_IDENTITY_TOKEN_FILE` exchanged for credentials of
//!    `AWS_ROLE_ARN` by STS `AssumeRoleWithWebIdentity`;
//! 3. the container credentials endpoint (EKS Pod Identity, ECS task
//!    roles): `AWS_CONTAINER_CREDENTIALS_FULL_URI` (EKS sets
//!    `http://169.254.170.23/v1/credentials`) asked with the token of
//!    `AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE` (read at every request: the
//!    agent rotates it) or `AWS_CONTAINER_AUTHORIZATION_TOKEN`, or
//!    `AWS_CONTAINER_CREDENTIALS_RELATIVE_URI` under `http://169.254.170.2`;
//!    plain HTTP only to the addresses the AWS SDKs allow (those two, and
//!    loopback);
//! 4. the instance metadata service (IMDSv2): a session token, then the
//!    credentials of the instance profile's role.
//!
//! A source that is not configured is skipped; one that is configured and
//! fails stops the search. Either way the error lists every source tried.
//! STS is the regional endpoint of `AWS_REGION`/`AWS_DEFAULT_REGION` when
//! set, else the global one; `--aws-sts-endpoint` overrides it.

use std::time::SystemTime;

use futures::future::BoxFuture;
use secrecy::{ExposeSecret, SecretString};

use super::common::{
    CloudConfig, CloudError, CloudProof, CloudSource, SignedRequest, base, describe,
};

/// The body of the signed request.
pub const GET_CALLER_IDENTITY: &str = "Action=GetCallerIdentity&Version=2011-06-15";

/// AWS credentials. `Debug` shows the access key id only.
#[derive(Clone)]
pub struct AwsCredentials {
    /// Access key id (not secret).
    pub access_key_id: String,
    /// Secret access key.
    pub secret_access_key: SecretString,
    /// Session token of temporary credentials.
    pub session_token: Option<SecretString>,
}

impl std::fmt::Debug for AwsCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwsCredentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"[REDACTED]")
            .field(
                "session_token",
                &self.session_token.as_ref().map(|_| "[REDACTED]"),
            )
            .finish()
    }
}

/// Sign a request with SigV4 (signature in headers). `headers` are the
/// request's own headers (lower-case names, `host` included); the result is
/// `headers` plus `x-amz-date`, `authorization` and, with a session token,
/// `x-amz-security-token`.
#[allow(clippy::too_many_arguments)]
pub fn sign_v4(
    method: &str,
    url: &str,
    headers: &[(String, String)],
    body: &[u8],
    credentials: &AwsCredentials,
    region: &str,
    service: &str,
    time: SystemTime,
) -> Result<Vec<(String, String)>, CloudError> {
    use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
    use aws_sigv4::sign::v4;
    let identity = aws_credential_types::Credentials::new(
        credentials.access_key_id.clone(),
        credentials.secret_access_key.expose_secret().to_owned(),
        credentials
            .session_token
            .as_ref()
            .map(|t| t.expose_secret().to_owned()),
        None,
        "kms-operator",
    )
    .into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name(service)
        .time(time)
        .settings(SigningSettings::default())
        .build()
        .map_err(|e| CloudError(format!("cannot sign the STS request: {e}")))?
        .into();
    let request = SignableRequest::new(
        method,
        url,
        headers.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        SignableBody::Bytes(body),
    )
    .map_err(|e| CloudError(format!("cannot sign the STS request: {e}")))?;
    let (instructions, _signature) = sign(request, &params)
        .map_err(|e| CloudError(format!("cannot sign the STS request: {e}")))?
        .into_parts();
    let (added, _) = instructions.into_parts();
    let mut out = headers.to_vec();
    for h in added {
        out.retain(|(k, _)| !k.eq_ignore_ascii_case(h.name()));
        out.push((h.name().to_owned(), h.value().to_owned()));
    }
    Ok(out)
}

/// The AWS IAM source.
pub struct AwsSource {
    config: CloudConfig,
}

impl AwsSource {
    /// A source looking where `config` says.
    pub fn new(config: CloudConfig) -> Self {
        Self { config }
    }

    fn env(&self, name: &str) -> Option<String> {
        (self.config.env)(name).map(|v| v.trim().to_owned())
    }

    /// The region and the STS endpoint.
    pub fn sts(&self) -> (String, String) {
        let region = self
            .env("AWS_REGION")
            .or_else(|| self.env("AWS_DEFAULT_REGION"));
        let endpoint = match (&self.config.aws_sts_endpoint, &region) {
            (Some(e), _) => base(e),
            (None, Some(r)) => format!("https://sts.{r}.amazonaws.com"),
            (None, None) => "https://sts.amazonaws.com".to_owned(),
        };
        (region.unwrap_or_else(|| "us-east-1".to_owned()), endpoint)
    }

    /// The ambient credentials, trying each source in turn.
    pub async fn credentials(&self) -> Result<AwsCredentials, CloudError> {
        let mut tried: Vec<String> = Vec::new();
        let fail = |tried: &[String], what: String| {
            CloudError(format!(
                "no AWS credentials: tried {}; {what}",
                tried.join(", ")
            ))
        };
        // 1. Environment.
        match (
            self.env("AWS_ACCESS_KEY_ID"),
            self.env("AWS_SECRET_ACCESS_KEY"),
        ) {
            (Some(id), Some(secret)) => {
                return Ok(AwsCredentials {
                    access_key_id: id,
                    secret_access_key: SecretString::from(secret),
                    session_token: self.env("AWS_SESSION_TOKEN").map(SecretString::from),
                });
            }
            (None, _) => tried.push("environment (AWS_ACCESS_KEY_ID unset)".to_owned()),
            (Some(_), None) => {
                tried.push("environment (AWS_SECRET_ACCESS_KEY unset)".to_owned());
            }
        }
        // 2. Web identity.
        match (
            self.env("AWS_WEB_IDENTITY_TOKEN_FILE"),
            self.env("AWS_ROLE_ARN"),
        ) {
            (Some(file), Some(role)) => {
                tried.push(format!("web identity (token file {file}, role {role})"));
                return self
                    .web_identity(&file, &role)
                    .await
                    .map_err(|e| fail(&tried, format!("web identity failed: {e}")));
            }
            (None, _) => tried.push("web identity (AWS_WEB_IDENTITY_TOKEN_FILE unset)".to_owned()),
            (Some(_), None) => tried.push("web identity (AWS_ROLE_ARN unset)".to_owned()),
        }
        // 3. Container credentials.
        match self.container_endpoint() {
            Ok(Some(url)) => {
                tried.push(format!("container credentials at {url}"));
                return self
                    .container(&url)
                    .await
                    .map_err(|e| fail(&tried, format!("container credentials failed: {e}")));
            }
            Ok(None) => tried.push(
                "container credentials (AWS_CONTAINER_CREDENTIALS_FULL_URI unset)".to_owned(),
            ),
            Err(e) => return Err(fail(&tried, e)),
        }
        // 4. Instance metadata.
        let imds = base(&self.config.aws_imds_endpoint);
        match self.imds(&imds).await {
            Ok(c) => Ok(c),
            Err(e) => {
                tried.push(format!("instance metadata at {imds} ({e})"));
                Err(CloudError(format!(
                    "no AWS credentials: tried {}",
                    tried.join(", ")
                )))
            }
        }
    }

    async fn web_identity(&self, file: &str, role: &str) -> Result<AwsCredentials, String> {
        let token = tokio::fs::read_to_string(file)
            .await
            .map_err(|e| format!("cannot read the token file {file}: {}", e.kind()))?;
        let token = SecretString::from(token.trim().to_owned());
        let session = self
            .env("AWS_ROLE_SESSION_NAME")
            .unwrap_or_else(|| "kms-operator".to_owned());
        let (_, sts) = self.sts();
        let http = self.config.http().map_err(|e| e.0)?;
        let form = [
            ("Action", "AssumeRoleWithWebIdentity"),
            ("Version", "2011-06-15"),
            ("RoleArn", role),
            ("RoleSessionName", session.as_str()),
            ("WebIdentityToken", token.expose_secret()),
        ];
        let body: String = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(form)
            .finish();
        let resp = http
            .post(format!("{sts}/"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body)
            .send()
            .await
            .map_err(|e| format!("STS at {sts}: {}", describe(&e)))?;
        let status = resp.status();
        let text = super::common::text(resp)
            .await
            .map_err(|e| format!("STS at {sts}: {e}"))?;
        if !status.is_success() {
            let code = xml_tag(&text, "Code").unwrap_or_default();
            let message = xml_tag(&text, "Message").unwrap_or_default();
            return Err(format!(
                "STS at {sts} answered {}: {code} {}",
                status.as_u16(),
                super::common::truncate(&message, 300)
            ));
        }
        let creds = xml_tag(&text, "Credentials").ok_or_else(|| {
            format!("STS at {sts}: no Credentials in the AssumeRoleWithWebIdentity answer")
        })?;
        match (
            xml_tag(&creds, "AccessKeyId"),
            xml_tag(&creds, "SecretAccessKey"),
        ) {
            (Some(id), Some(secret)) => Ok(AwsCredentials {
                access_key_id: id,
                secret_access_key: SecretString::from(secret),
                session_token: xml_tag(&creds, "SessionToken").map(SecretString::from),
            }),
            _ => Err(format!(
                "STS at {sts}: incomplete Credentials in the AssumeRoleWithWebIdentity answer"
            )),
        }
    }

    /// The container credentials URL, when the environment names one; an
    /// error for a plain-HTTP URL to a host the AWS SDKs would not ask.
    fn container_endpoint(&self) -> Result<Option<String>, String> {
        if let Some(relative) = self.env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI") {
            return Ok(Some(format!("http://169.254.170.2{relative}")));
        }
        let Some(full) = self.env("AWS_CONTAINER_CREDENTIALS_FULL_URI") else {
            return Ok(None);
        };
        let url = url::Url::parse(&full)
            .map_err(|_| "AWS_CONTAINER_CREDENTIALS_FULL_URI is not a URL".to_owned())?;
        let allowed = match url.scheme() {
            "https" => true,
            "http" => match url.host() {
                Some(url::Host::Ipv4(ip)) => {
                    ip.is_loopback()
                        || ip == std::net::Ipv4Addr::new(169, 254, 170, 2)
                        || ip == std::net::Ipv4Addr::new(169, 254, 170, 23)
                }
                Some(url::Host::Ipv6(ip)) => {
                    ip.is_loopback()
                        || ip == std::net::Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x23)
                }
                Some(url::Host::Domain(d)) => d == "localhost",
                None => false,
            },
            _ => false,
        };
        if !allowed {
            return Err(format!(
                "AWS_CONTAINER_CREDENTIALS_FULL_URI {full} is refused: plain HTTP only to loopback, 169.254.170.2, 169.254.170.23 or fd00:ec2::23"
            ));
        }
        Ok(Some(full))
    }

    async fn container(&self, url: &str) -> Result<AwsCredentials, String> {
        let token = match self.env("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE") {
            Some(file) => Some(SecretString::from(
                tokio::fs::read_to_string(&file)
                    .await
                    .map_err(|e| format!("cannot read the token file {file}: {}", e.kind()))?
                    .trim()
                    .to_owned(),
            )),
            None => self
                .env("AWS_CONTAINER_AUTHORIZATION_TOKEN")
                .map(SecretString::from),
        };
        let http = self.config.http().map_err(|e| e.0)?;
        let mut req = http.get(url);
        if let Some(token) = &token {
            req = req.header("authorization", token.expose_secret());
        }
        let resp = req.send().await.map_err(|e| describe(&e))?;
        let status = resp.status();
        let body = super::common::body(resp).await?;
        if !status.is_success() {
            #[derive(serde::Deserialize)]
            struct Failure {
                #[serde(default)]
                code: String,
                #[serde(default)]
                message: String,
            }
            let detail = serde_json::from_slice::<Failure>(&body)
                .map(|f| format!(": {} {}", f.code, super::common::truncate(&f.message, 300)))
                .unwrap_or_default();
            return Err(format!("answered {}{detail}", status.as_u16()));
        }
        credentials_json(&body, "the container credentials")
    }

    async fn imds(&self, imds: &str) -> Result<AwsCredentials, String> {
        let http = self.config.http().map_err(|e| e.0)?;
        let resp = http
            .put(format!("{imds}/latest/api/token"))
            .header("x-aws-ec2-metadata-token-ttl-seconds", "300")
            .send()
            .await
            .map_err(|e| describe(&e))?;
        if !resp.status().is_success() {
            return Err(format!(
                "the IMDSv2 token request answered {}",
                resp.status().as_u16()
            ));
        }
        let session = SecretString::from(super::common::text(resp).await?);
        let get = |path: String| {
            http.get(format!("{imds}{path}"))
                .header("x-aws-ec2-metadata-token", session.expose_secret())
                .send()
        };
        let path = "/latest/meta-data/iam/security-credentials/";
        let resp = get(path.to_owned()).await.map_err(|e| describe(&e))?;
        if !resp.status().is_success() {
            return Err(format!(
                "{path} answered {} (no instance profile?)",
                resp.status().as_u16()
            ));
        }
        let roles = super::common::text(resp).await?;
        let role = roles
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .ok_or_else(|| "the instance has no IAM role".to_owned())?
            .to_owned();
        let resp = get(format!("{path}{role}"))
            .await
            .map_err(|e| describe(&e))?;
        if !resp.status().is_success() {
            return Err(format!(
                "the credentials of role {role} answered {}",
                resp.status().as_u16()
            ));
        }
        let body = super::common::body(resp).await?;
        credentials_json(&body, &format!("the credentials of role {role}"))
    }

    /// The signed `GetCallerIdentity` request.
    pub async fn signed_request(&self) -> Result<SignedRequest, CloudError> {
        let credentials = self.credentials().await?;
        let (region, sts) = self.sts();
        let url = format!("{sts}/");
        let host = url::Url::parse(&url)
            .ok()
            .and_then(|u| {
                u.host_str().map(|h| match u.port() {
                    Some(p) => format!("{h}:{p}"),
                    None => h.to_owned(),
                })
            })
            .ok_or_else(|| CloudError(format!("invalid STS endpoint {sts}")))?;
        let headers = vec![
            ("host".to_owned(), host),
            (
                "content-type".to_owned(),
                "application/x-www-form-urlencoded; charset=utf-8".to_owned(),
            ),
            (
                "content-length".to_owned(),
                GET_CALLER_IDENTITY.len().to_string(),
            ),
        ];
        let headers = sign_v4(
            "POST",
            &url,
            &headers,
            GET_CALLER_IDENTITY.as_bytes(),
            &credentials,
            &region,
            "sts",
            SystemTime::now(),
        )?;
        Ok(SignedRequest {
            method: "POST".to_owned(),
            url,
            body: GET_CALLER_IDENTITY.to_owned(),
            headers,
        })
    }
}

impl CloudSource for AwsSource {
    fn proof<'a>(&'a self, _identity_id: &'a str) -> BoxFuture<'a, Result<CloudProof, CloudError>> {
        Box::pin(async move { self.signed_request().await.map(CloudProof::Aws) })
    }
}

/// Credentials in the JSON of the instance metadata and container
/// endpoints (`AccessKeyId`, `SecretAccessKey`, `Token`; a `Code` other
/// than `Success` is a failure). `what` names the source in errors.
fn credentials_json(body: &[u8], what: &str) -> Result<AwsCredentials, String> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct Credentials {
        #[serde(default)]
        code: Option<String>,
        access_key_id: Option<String>,
        secret_access_key: Option<SecretString>,
        token: Option<SecretString>,
    }
    let creds: Credentials =
        serde_json::from_slice(body).map_err(|_| format!("{what} are not valid JSON"))?;
    if let Some(code) = creds.code.filter(|c| c != "Success") {
        return Err(format!("{what}: {code}"));
    }
    match (creds.access_key_id, creds.secret_access_key) {
        (Some(id), Some(secret)) => Ok(AwsCredentials {
            access_key_id: id,
            secret_access_key: secret,
            session_token: creds.token,
        }),
        _ => Err(format!("{what} are incomplete")),
    }
}

/// The text of the first `<tag>…</tag>` in `xml` (enough for STS answers).
fn xml_tag(xml: &str, tag: &str) -> Option<String> {
    let open = format!("<{tag}>");
    let close = format!("</{tag}>");
    let start = xml.find(&open)? + open.len();
    let end = start + xml[start..].find(&close)?;
    Some(
        xml[start..end]
            .trim()
            .replace("&amp;", "&")
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&quot;", "\"")
            .replace("&apos;", "'"),
    )
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::time::{Duration, UNIX_EPOCH};

    use super::super::stand_in::{StandIn, closed_port};
    use super::*;

    // The AWS SigV4 test suite's credentials, scope and time.
    const SUITE_KEY_ID: &str = "AKIDEXAMPLE";
    const SUITE_SECRET: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
    // 2015-08-30T12:36:00Z.
    const SUITE_TIME: u64 = 1_440_938_160;

    fn suite_credentials() -> AwsCredentials {
        AwsCredentials {
            access_key_id: SUITE_KEY_ID.into(),
            secret_access_key: SecretString::from(SUITE_SECRET.to_owned()),
            session_token: None,
        }
    }

    fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn suite_sign(method: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<(String, String)> {
        let headers: Vec<(String, String)> = headers
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        sign_v4(
            method,
            "https://example.amazonaws.com/",
            &headers,
            body,
            &suite_credentials(),
            "us-east-1",
            "service",
            UNIX_EPOCH + Duration::from_secs(SUITE_TIME),
        )
        .unwrap()
    }

    /// `get-vanilla` of the AWS SigV4 test suite. The suite's canonical
    /// request is
    /// `GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0…b855`,
    /// its SHA-256 (the last line of the string to sign) is `bb5797…7e63`,
    /// and the signature `5fa00f…bf31`. The canonical request and the string
    /// to sign are rebuilt here from the suite's text and hashed with ring,
    /// then the signer's output is held to the suite's signature.
    #[test]
    fn sigv4_get_vanilla() {
        let canonical = "GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        let hash = crate::kms::endpoint::hex(
            ring::digest::digest(&ring::digest::SHA256, canonical.as_bytes()).as_ref(),
        );
        assert_eq!(
            hash,
            "bb579772317eb040ac9ed261061d46c1f17a8133879d6129b6e1c25292927e63"
        );
        let string_to_sign = format!(
            "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\n{hash}"
        );
        assert_eq!(
            suite_signature(&string_to_sign),
            "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
        );
        let signed = suite_sign("GET", &[("host", "example.amazonaws.com")], b"");
        assert_eq!(header(&signed, "x-amz-date"), Some("20150830T123600Z"));
        assert_eq!(
            header(&signed, "authorization"),
            Some(
                "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, \
                 SignedHeaders=host;x-amz-date, \
                 Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
            )
        );
    }

    /// `post-x-www-form-urlencoded` of the suite: body `Param1=value1`,
    /// payload hash `9095…0b6e`, signature `ff1189…473a`.
    #[test]
    fn sigv4_post_x_www_form_urlencoded() {
        let payload = crate::kms::endpoint::hex(
            ring::digest::digest(&ring::digest::SHA256, b"Param1=value1").as_ref(),
        );
        assert_eq!(
            payload,
            "9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e"
        );
        let canonical = format!(
            "POST\n/\n\ncontent-type:application/x-www-form-urlencoded\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\ncontent-type;host;x-amz-date\n{payload}"
        );
        let hash = crate::kms::endpoint::hex(
            ring::digest::digest(&ring::digest::SHA256, canonical.as_bytes()).as_ref(),
        );
        let string_to_sign = format!(
            "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\n{hash}"
        );
        assert_eq!(
            suite_signature(&string_to_sign),
            "ff11897932ad3f4e8b18135d722051e5ac45fc38421b1da7b9d196a0fe09473a"
        );
        let signed = suite_sign(
            "POST",
            &[
                ("content-type", "application/x-www-form-urlencoded"),
                ("host", "example.amazonaws.com"),
            ],
            b"Param1=value1",
        );
        assert_eq!(
            header(&signed, "authorization"),
            Some(
                "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, \
                 SignedHeaders=content-type;host;x-amz-date, \
                 Signature=ff11897932ad3f4e8b18135d722051e5ac45fc38421b1da7b9d196a0fe09473a"
            )
        );
    }

    /// The suite's signing-key derivation (HMAC chain over date, region,
    /// service, `aws4_request`) with ring, for the checks above.
    fn suite_signature(string_to_sign: &str) -> String {
        use ring::hmac;
        let step = |key: &[u8], data: &str| {
            hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), data.as_bytes())
                .as_ref()
                .to_vec()
        };
        let k = step(format!("AWS4{SUITE_SECRET}").as_bytes(), "20150830");
        let k = step(&k, "us-east-1");
        let k = step(&k, "service");
        let k = step(&k, "aws4_request");
        crate::kms::endpoint::hex(&step(&k, string_to_sign))
    }

    #[test]
    fn session_tokens_are_signed_and_redacted() {
        let creds = AwsCredentials {
            session_token: Some(SecretString::from("session-secret".to_owned())),
            ..suite_credentials()
        };
        let signed = sign_v4(
            "POST",
            "https://sts.amazonaws.com/",
            &[("host".into(), "sts.amazonaws.com".into())],
            GET_CALLER_IDENTITY.as_bytes(),
            &creds,
            "us-east-1",
            "sts",
            SystemTime::now(),
        )
        .unwrap();
        assert_eq!(
            header(&signed, "x-amz-security-token"),
            Some("session-secret")
        );
        assert!(
            header(&signed, "authorization")
                .unwrap()
                .contains("x-amz-security-token")
        );
        let debug = format!("{creds:?}");
        assert!(!debug.contains("session-secret") && !debug.contains(SUITE_SECRET));
    }

    fn config(env: &[(&str, &str)], imds: &str, sts: Option<&str>) -> CloudConfig {
        CloudConfig {
            aws_imds_endpoint: imds.to_owned(),
            aws_sts_endpoint: sts.map(str::to_owned),
            timeout: Duration::from_secs(2),
            ..CloudConfig::default()
        }
        .with_env(
            env.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<HashMap<_, _>>(),
        )
    }

    #[tokio::test]
    async fn environment_credentials_sign_get_caller_identity() {
        let source = AwsSource::new(config(
            &[
                ("AWS_ACCESS_KEY_ID", "AKIAENV"),
                ("AWS_SECRET_ACCESS_KEY", "env-secret"),
                ("AWS_REGION", "eu-west-1"),
            ],
            &closed_port().await,
            None,
        ));
        let req = source.signed_request().await.unwrap();
        assert_eq!(req.url, "https://sts.eu-west-1.amazonaws.com/");
        assert_eq!(req.body, GET_CALLER_IDENTITY);
        assert_eq!(
            header(&req.headers, "host"),
            Some("sts.eu-west-1.amazonaws.com")
        );
        let auth = header(&req.headers, "authorization").unwrap();
        assert!(
            auth.starts_with("AWS4-HMAC-SHA256 Credential=AKIAENV/"),
            "{auth}"
        );
        assert!(auth.contains("/eu-west-1/sts/aws4_request"), "{auth}");
        let debug = format!("{req:?}");
        assert!(!debug.contains("Signature="), "{debug}");
        let body = CloudProof::Aws(req).login_body("id-1");
        assert_eq!(body["iamHttpRequestMethod"], "POST");
        assert_eq!(body["identityId"], "id-1");
    }

    #[tokio::test]
    async fn web_identity_is_exchanged_at_sts() {
        let sts = StandIn::start(|seen| {
            if seen.body.contains("Action=AssumeRoleWithWebIdentity")
                && seen.body.contains("WebIdentityToken=the-jwt")
                && seen.body.contains("RoleArn=arn%3Aaws%3Aiam%3A%3A1%3Arole%2Fr")
            {
                (200, "<AssumeRoleWithWebIdentityResponse><AssumeRoleWithWebIdentityResult><Credentials><AccessKeyId>ASIAWEB</AccessKeyId><SecretAccessKey>web-secret</SecretAccessKey><SessionToken>web-session</SessionToken></Credentials></AssumeRoleWithWebIdentityResult></AssumeRoleWithWebIdentityResponse>".to_owned())
            } else {
                (403, "<ErrorResponse><Error><Code>AccessDenied</Code><Message>Not authorized</Message></Error></ErrorResponse>".to_owned())
            }
        })
        .await;
        let dir = std::env::temp_dir().join(format!("kms-aws-wi-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, "the-jwt\n").unwrap();
        let env = [
            ("AWS_WEB_IDENTITY_TOKEN_FILE", file.to_str().unwrap()),
            ("AWS_ROLE_ARN", "arn:aws:iam::1:role/r"),
        ];
        let source = AwsSource::new(config(&env, &closed_port().await, Some(&sts.url)));
        let creds = source.credentials().await.unwrap();
        assert_eq!(creds.access_key_id, "ASIAWEB");
        assert_eq!(creds.session_token.unwrap().expose_secret(), "web-session");
        let req = source.signed_request().await.unwrap();
        assert_eq!(req.url, format!("{}/", sts.url));
        // A role STS refuses: its answer is in the error.
        let env = [
            ("AWS_WEB_IDENTITY_TOKEN_FILE", file.to_str().unwrap()),
            ("AWS_ROLE_ARN", "arn:aws:iam::1:role/other"),
        ];
        let source = AwsSource::new(config(&env, &closed_port().await, Some(&sts.url)));
        let err = source.credentials().await.unwrap_err().0;
        assert!(err.contains("403: AccessDenied Not authorized"), "{err}");
        assert!(
            err.contains("environment (AWS_ACCESS_KEY_ID unset)"),
            "{err}"
        );
        assert!(!err.contains("the-jwt"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn instance_metadata_v2() {
        let imds = StandIn::start(|seen| match (seen.method.as_str(), seen.uri.as_str()) {
            ("PUT", "/latest/api/token") => (200, "imds-session".to_owned()),
            (_, uri)
                if StandIn::header(seen, "x-aws-ec2-metadata-token").as_deref()
                    != Some("imds-session") =>
            {
                (401, format!("no session for {uri}"))
            }
            ("GET", "/latest/meta-data/iam/security-credentials/") => (200, "node-role\n".to_owned()),
            ("GET", "/latest/meta-data/iam/security-credentials/node-role") => (
                200,
                r#"{"Code":"Success","AccessKeyId":"ASIAIMDS","SecretAccessKey":"imds-secret","Token":"imds-token","Expiration":"2030-01-01T00:00:00Z"}"#.to_owned(),
            ),
            _ => (404, String::new()),
        })
        .await;
        let source = AwsSource::new(config(&[], &imds.url, None));
        let creds = source.credentials().await.unwrap();
        assert_eq!(creds.access_key_id, "ASIAIMDS");
        assert_eq!(creds.session_token.unwrap().expose_secret(), "imds-token");
        let req = source.signed_request().await.unwrap();
        assert_eq!(req.url, "https://sts.amazonaws.com/");
        assert!(
            header(&req.headers, "authorization")
                .unwrap()
                .contains("/us-east-1/sts/aws4_request")
        );
    }

    #[tokio::test]
    async fn eks_pod_identity_container_credentials() {
        let agent = StandIn::start(|seen| {
            match (seen.uri.as_str(), StandIn::header(seen, "authorization").as_deref()) {
                ("/v1/credentials", Some("pod-token-2")) => (
                    200,
                    r#"{"AccessKeyId":"ASIAPOD","SecretAccessKey":"pod-secret","Token":"pod-session","AccountId":"1","Expiration":"2030-01-01T00:00:00Z"}"#.to_owned(),
                ),
                _ => (
                    403,
                    r#"{"code":"AccessDeniedException","message":"bad token"}"#.to_owned(),
                ),
            }
        })
        .await;
        let dir = std::env::temp_dir().join(format!("kms-aws-pod-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("eks-pod-identity-token");
        std::fs::write(&file, "pod-token-1\n").unwrap();
        let url = format!("{}/v1/credentials", agent.url);
        let env = [
            ("AWS_CONTAINER_CREDENTIALS_FULL_URI", url.as_str()),
            (
                "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
                file.to_str().unwrap(),
            ),
        ];
        let source = AwsSource::new(config(&env, &closed_port().await, None));
        // The agent refuses the old token, with its reason in the error
        // and no token in it.
        let err = source.credentials().await.unwrap_err().0;
        assert!(
            err.contains("403: AccessDeniedException bad token"),
            "{err}"
        );
        assert!(!err.contains("pod-token"), "{err}");
        // The file is read at every request: a rotated token is used.
        std::fs::write(&file, "pod-token-2\n").unwrap();
        let creds = source.credentials().await.unwrap();
        assert_eq!(creds.access_key_id, "ASIAPOD");
        assert_eq!(creds.session_token.unwrap().expose_secret(), "pod-session");
        // Plain HTTP to a host the SDKs would not ask is refused unasked.
        let env = [(
            "AWS_CONTAINER_CREDENTIALS_FULL_URI",
            "http://metadata.example.com/creds",
        )];
        let source = AwsSource::new(config(&env, &closed_port().await, None));
        let err = source.credentials().await.unwrap_err().0;
        assert!(err.contains("is refused: plain HTTP only to"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn no_credentials_names_every_source_tried() {
        let imds = closed_port().await;
        let source = AwsSource::new(config(&[], &imds, None));
        let err = source.credentials().await.unwrap_err().0;
        assert_eq!(
            err,
            format!(
                "no AWS credentials: tried environment (AWS_ACCESS_KEY_ID unset), web identity (AWS_WEB_IDENTITY_TOKEN_FILE unset), container credentials (AWS_CONTAINER_CREDENTIALS_FULL_URI unset), instance metadata at {imds} (connection refused)"
            )
        );
    }

    #[test]
    fn xml_tags() {
        assert_eq!(
            xml_tag("<a><Code>X&amp;Y</Code></a>", "Code").as_deref(),
            Some("X&Y")
        );
        assert_eq!(xml_tag("<a/>", "Code"), None);
    }
}
