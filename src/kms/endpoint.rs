//! Where the KMS is and how it is talked to: base-URL normalisation (`/api`
//! appended as the Go operators do), the `--allowed-kms-hosts` check, one HTTP
//! client per trust configuration (system roots, or system roots plus a
//! private CA), bodies read under a cap, and transport failures described.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::error::KmsError;

/// The default KMS when neither the resource nor `kms-config` names one.
pub const DEFAULT_HOST_API: &str = "https://kms.hanzo.ai/api";

/// A normalised KMS base URL (`scheme://host[:port][/prefix]/api`, no
/// trailing slash) and an optional private CA bundle.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// Base URL ending in `/api`.
    pub base: String,
    /// Host name (for metrics and the allow list).
    pub host: String,
    /// Scheme, host and port: the unit of the request budget and of 429
    /// pauses, and what the cloud methods' trust is checked against.
    pub origin: String,
    /// PEM CA bundle trusted in addition to the system roots.
    pub ca_pem: Option<Arc<Vec<u8>>>,
}

impl Endpoint {
    /// Build an endpoint from a configured host URL.
    pub fn new(host_api: &str, ca_pem: Option<Vec<u8>>) -> Result<Self, KmsError> {
        let base = normalize_base(host_api)?;
        let url = url::Url::parse(&base).map_err(|e| KmsError::InvalidHost {
            url: redact_userinfo(host_api),
            reason: e.to_string(),
        })?;
        let host = url.host_str().unwrap_or_default().to_owned();
        let origin = format!(
            "{}://{}:{}",
            url.scheme(),
            host,
            url.port_or_known_default().unwrap_or_default()
        );
        Ok(Self {
            base,
            host,
            origin,
            ca_pem: ca_pem.map(Arc::new),
        })
    }

    /// Whether the connection is unencrypted.
    pub fn is_plain_http(&self) -> bool {
        self.base.starts_with("http://")
    }

    /// A key identifying the trust configuration (for the identity key and
    /// the client cache): empty for system roots, else a SHA-256 of the PEM.
    pub fn trust_key(&self) -> String {
        match &self.ca_pem {
            None => String::new(),
            Some(pem) => hex(ring::digest::digest(&ring::digest::SHA256, pem).as_ref()),
        }
    }
}

/// Lower-case hex of bytes.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Normalise a host URL: trim, drop trailing slashes, append `/api` when the
/// path does not already end in it. Only `http` and `https` are accepted.
pub fn normalize_base(input: &str) -> Result<String, KmsError> {
    let trimmed = input.trim().trim_end_matches('/');
    let invalid = |reason: &str| KmsError::InvalidHost {
        url: redact_userinfo(input),
        reason: reason.to_owned(),
    };
    if trimmed.is_empty() {
        return Err(invalid("empty URL"));
    }
    let url = url::Url::parse(trimmed).map_err(|e| invalid(&e.to_string()))?;
    if url.scheme() != "http" && url.scheme() != "https" {
        return Err(invalid(
            "the scheme must be http or https: write it as http:// or https://<host>/api",
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(invalid("no host"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(invalid("a query or fragment is not allowed"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(invalid("credentials in the URL are not allowed"));
    }
    if trimmed.ends_with("/api") {
        Ok(trimmed.to_owned())
    } else {
        Ok(format!("{trimmed}/api"))
    }
}

/// A URL as it may be shown (conditions, Events, logs): credentials written
/// into it (`https://user:pass@host`) are replaced by `***`. Works on text
/// that is not a valid URL too, since that is when it is shown.
pub fn redact_userinfo(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(i) => url.split_at(i + 3),
        None => ("", url),
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}***@{}", &rest[at + 1..]),
        None => url.to_owned(),
    }
}

/// Whether `host` matches one of the patterns (`kms.example.com`,
/// `*.example.com`, `*`). An empty list allows every host.
pub fn host_allowed(host: &str, patterns: &[String]) -> bool {
    if patterns.is_empty() {
        return true;
    }
    let host = host.to_ascii_lowercase();
    patterns.iter().any(|p| {
        let p = p.trim().to_ascii_lowercase();
        if p == "*" {
            true
        } else if let Some(suffix) = p.strip_prefix("*.") {
            host.len() > suffix.len() + 1 && host.ends_with(&format!(".{suffix}"))
        } else {
            host == p
        }
    })
}

/// HTTP clients, one per trust configuration, shared by every request.
#[derive(Default)]
pub struct Clients {
    by_trust: Mutex<HashMap<String, reqwest::Client>>,
}

impl Clients {
    /// The client for an endpoint's trust configuration.
    pub fn get(&self, endpoint: &Endpoint) -> Result<reqwest::Client, KmsError> {
        let key = endpoint.trust_key();
        let mut map = self.by_trust.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = map.get(&key) {
            return Ok(c.clone());
        }
        let mut builder = reqwest::Client::builder()
            .user_agent(concat!("kms-operator/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(20))
            .pool_idle_timeout(Duration::from_secs(60))
            // A redirect is not followed: it could lead a request (and a
            // login's credentials) to a host the allow-list never checked.
            .redirect(reqwest::redirect::Policy::none());
        if let Some(pem) = &endpoint.ca_pem {
            let certs = reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| KmsError::InvalidCa(e.to_string()))?;
            if certs.is_empty() {
                return Err(KmsError::InvalidCa(
                    "no certificate in the bundle".to_owned(),
                ));
            }
            builder = builder.tls_certs_merge(certs);
        }
        let client = builder
            .build()
            .map_err(|e| KmsError::InvalidCa(format!("cannot build the HTTP client: {e}")))?;
        map.insert(key, client.clone());
        Ok(client)
    }
}

/// At most `max` bytes of `s` (on a character boundary).
pub(crate) fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_is_appended_once() {
        assert_eq!(
            normalize_base("https://kms.example.com").unwrap(),
            "https://kms.example.com/api"
        );
        assert_eq!(
            normalize_base("https://kms.example.com/").unwrap(),
            "https://kms.example.com/api"
        );
        assert_eq!(
            normalize_base("https://kms.example.com/api/").unwrap(),
            "https://kms.example.com/api"
        );
        assert_eq!(
            normalize_base("http://127.0.0.1:8080/api").unwrap(),
            "http://127.0.0.1:8080/api"
        );
        assert_eq!(
            normalize_base(" https://x.io/kms ").unwrap(),
            "https://x.io/kms/api"
        );
    }

    #[test]
    fn bad_hosts_are_refused() {
        for bad in [
            "",
            "kms.example.com",
            "ftp://x.io",
            "https://u:p@x.io",
            "https://x.io/?a=b",
        ] {
            assert!(normalize_base(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn credentials_in_a_url_are_never_shown() {
        for (input, shown) in [
            ("http://user:pass@kms.io/api", "http://***@kms.io/api"),
            ("https://tok@kms.io", "https://***@kms.io"),
            ("user:p@ss@kms.io/x", "***@kms.io/x"),
            ("https://kms.io/a@b", "https://kms.io/a@b"),
            ("https://kms.io", "https://kms.io"),
        ] {
            assert_eq!(redact_userinfo(input), shown, "{input}");
        }
        let err = normalize_base("http://admin:hunter2@kms.io").unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
        assert!(err.to_string().contains("***@kms.io"), "{err}");
        let err = normalize_base("ftp://admin:hunter2@kms.io").unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }

    #[test]
    fn allow_list() {
        let pats = vec!["*.example.com".to_owned(), "kms.internal".to_owned()];
        assert!(host_allowed("kms.example.com", &pats));
        assert!(host_allowed("KMS.Example.com", &pats));
        assert!(!host_allowed("example.com", &pats));
        assert!(!host_allowed("evil-example.com", &pats));
        assert!(host_allowed("kms.internal", &pats));
        assert!(!host_allowed("kms.internal.evil", &pats));
        assert!(host_allowed("anything", &[]));
        assert!(host_allowed("anything", &["*".to_owned()]));
    }

    #[test]
    fn trust_key_depends_on_the_ca() {
        let a = Endpoint::new("https://x.io", None).unwrap();
        let b = Endpoint::new("https://x.io", Some(b"pem-a".to_vec())).unwrap();
        let c = Endpoint::new("https://x.io", Some(b"pem-b".to_vec())).unwrap();
        assert_eq!(a.trust_key(), "");
        assert_ne!(b.trust_key(), c.trust_key());
        assert_eq!(b.host, "x.io");
        assert_eq!(b.origin, "https://x.io:443");
        assert_eq!(
            Endpoint::new("http://127.0.0.1:8080/kms", None)
                .unwrap()
                .origin,
            "http://127.0.0.1:8080"
        );
    }
}

/// Read a response body of at most `max` bytes. The cap holds while the
/// body streams in, whatever the response declares: a chunked body (no
/// `Content-Length`) that runs past it is cut off at the first chunk beyond
/// the cap, so a hostile or broken server cannot make the operator buffer
/// more than `max` plus one chunk.
pub(crate) async fn read_capped(
    mut resp: reqwest::Response,
    max: usize,
) -> Result<bytes::Bytes, BodyError> {
    if resp.content_length().is_some_and(|l| l > max as u64) {
        return Err(BodyError::TooLarge(max));
    }
    let mut body = bytes::BytesMut::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| BodyError::Read(describe_reqwest_error(&e)))?
    {
        if body.len() + chunk.len() > max {
            return Err(BodyError::TooLarge(max));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

/// Why a response body was not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BodyError {
    /// It is larger than the cap (in bytes): not read further.
    TooLarge(usize),
    /// The connection failed while reading it.
    Read(String),
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BodyError::TooLarge(max) => write!(f, "response larger than {max} bytes"),
            BodyError::Read(reason) => f.write_str(reason),
        }
    }
}

/// A transport failure in a few words: its kind and innermost cause.
pub(crate) fn describe_reqwest_error(e: &reqwest::Error) -> String {
    // The URL carries no secret (tokens travel in headers and bodies), but
    // keep the message short: the kind of failure and its innermost cause.
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "connection failed"
    } else if e.is_body() || e.is_decode() {
        "reading the response failed"
    } else {
        "request failed"
    };
    let mut source: Option<&dyn std::error::Error> = std::error::Error::source(e);
    let mut last = None;
    while let Some(s) = source {
        last = Some(s.to_string());
        source = s.source();
    }
    match last {
        Some(cause) => format!("{kind}: {cause}"),
        None => kind.to_owned(),
    }
}
