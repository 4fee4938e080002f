//! Errors of the KMS client. Messages name the endpoint, the status and the
//! server's own words; they never carry a secret value or a token.

use std::time::Duration;

/// What went wrong talking to the KMS.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KmsError {
    /// The host URL cannot be used.
    #[error("invalid KMS host {url:?}: {reason}")]
    InvalidHost {
        /// The URL as configured.
        url: String,
        /// Why it was refused.
        reason: String,
    },
    /// The host is not in `--allowed-kms-hosts`.
    #[error("KMS host {host} is not allowed by --allowed-kms-hosts")]
    HostNotAllowed {
        /// The refused host.
        host: String,
    },
    /// A login method that proves the operator's own cloud identity was
    /// pointed at a host the cluster admin has not trusted; nothing was sent.
    #[error(
        "{method} logs in with the operator's own cloud identity, so it may only talk to a KMS the \
         cluster admin trusts: {host} is neither the operator's global hostAPI ({trusted}) nor \
         listed in --allowed-kms-hosts (chart value security.allowedKmsHosts). Add it there, or use \
         a method whose credentials live in this namespace; no request was sent"
    )]
    HostNotTrusted {
        /// The spec field of the method (`awsIamAuth`, ...).
        method: &'static str,
        /// The refused host (scheme, host and port).
        host: String,
        /// The global hostAPI, the one host trusted by default.
        trusted: String,
    },
    /// The CA bundle cannot be used.
    #[error("invalid CA bundle: {0}")]
    InvalidCa(String),
    /// The connection failed or timed out.
    #[error(
        "cannot reach the KMS at {host}: {reason}; check the KMS address (spec.hostAPI, or hostAPI in \
         the kms-config ConfigMap) and that the operator's pods can reach it"
    )]
    Transport {
        /// The host that could not be reached.
        host: String,
        /// What failed (connect, TLS, timeout, reset).
        reason: String,
    },
    /// The KMS's TLS certificate is not trusted (unknown issuer, expired,
    /// wrong name). Not transient: retrying cannot help until the CA or the
    /// certificate changes.
    #[error(
        "the KMS at {host} presented a TLS certificate that is not trusted: {reason}; \
         set tls.caRef to the CA that issued it (or fix the server's certificate)"
    )]
    Certificate {
        /// The host whose certificate was refused.
        host: String,
        /// What the TLS library said of the certificate.
        reason: String,
    },
    /// The KMS answered with an error status.
    #[error("KMS {endpoint} answered {status}{}: {message}", error_suffix(.error))]
    Api {
        /// The route template, e.g. `GET /api/v3/secrets/raw`.
        endpoint: &'static str,
        /// HTTP status.
        status: u16,
        /// The `error` field of the server's envelope (a class name).
        error: String,
        /// The `message` field of the server's envelope.
        message: String,
    },
    /// The KMS asked us to slow down (a `429`): no request goes to that
    /// endpoint before `until`.
    // The wording does not change from one refusal to the next (no time
    // in it): a resource that waits is not rewritten at every retry.
    #[error(
        "KMS {endpoint} is rate limiting requests (429): the operator waits for its Retry-After before the next request and syncs then by itself"
    )]
    RateLimited {
        /// The route template.
        endpoint: &'static str,
        /// How long to wait before the next request to this endpoint.
        retry_after: Duration,
        /// When the wait ends.
        until: std::time::SystemTime,
    },
    /// Local credential material could not be produced (e.g. a
    /// service-account token for Kubernetes auth).
    #[error("{0}")]
    Credentials(String),
    /// The response could not be understood.
    #[error("unexpected response from KMS {endpoint}: {reason}")]
    Decode {
        /// The route template.
        endpoint: &'static str,
        /// What was wrong with it.
        reason: String,
    },
}

impl KmsError {
    /// A `429` pause of `retry_after` from now.
    pub fn rate_limited(endpoint: &'static str, retry_after: Duration) -> Self {
        KmsError::RateLimited {
            endpoint,
            retry_after,
            until: std::time::SystemTime::now() + retry_after,
        }
    }
}

fn error_suffix(error: &str) -> String {
    if error.is_empty() {
        String::new()
    } else {
        format!(" {error}")
    }
}

impl KmsError {
    /// Whether a later retry may succeed without anything changing on our
    /// side: transport errors, 5xx, 429 and unreadable responses.
    pub fn is_transient(&self) -> bool {
        match self {
            KmsError::Transport { .. } | KmsError::RateLimited { .. } | KmsError::Decode { .. } => {
                true
            }
            KmsError::Api { status, .. } => *status >= 500,
            _ => false,
        }
    }

    /// Whether the error says the token is not (or no longer) valid: 401, or
    /// a 403 `TokenError` (the real server answers expired JWTs with 403).
    pub fn is_token_error(&self) -> bool {
        matches!(self, KmsError::Api { status: 401, .. })
            || matches!(self, KmsError::Api { status: 403, error, .. } if error == "TokenError")
    }

    /// The HTTP status, if the KMS answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            KmsError::Api { status, .. } => Some(*status),
            KmsError::RateLimited { .. } => Some(429),
            _ => None,
        }
    }

    /// A short, bounded category used as a condition reason.
    pub fn reason(&self) -> &'static str {
        match self {
            KmsError::InvalidHost { .. } => "InvalidHost",
            KmsError::HostNotAllowed { .. } => "HostNotAllowed",
            KmsError::HostNotTrusted { .. } => "UntrustedKMSHost",
            KmsError::InvalidCa(_) => "InvalidCA",
            KmsError::Credentials(_) => "CredentialsInvalid",
            KmsError::Transport { .. } => "KMSUnreachable",
            KmsError::Certificate { .. } => "KMSCertificateInvalid",
            KmsError::RateLimited { .. } => "KMSRateLimited",
            KmsError::Decode { .. } => "KMSBadResponse",
            KmsError::Api { status, .. } => match status {
                401 | 403 => "KMSAccessDenied",
                404 => "KMSNotFound",
                s if *s >= 500 => "KMSUnavailable",
                _ => "KMSRequestRejected",
            },
        }
    }

    /// How long the server asked us to wait, if it did.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            KmsError::RateLimited { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(status: u16, error: &str) -> KmsError {
        KmsError::Api {
            endpoint: "GET /api/v3/secrets/raw",
            status,
            error: error.into(),
            message: "m".into(),
        }
    }

    #[test]
    fn classification() {
        assert!(api(503, "ServiceUnavailable").is_transient());
        assert!(!api(404, "NotFound").is_transient());
        assert!(api(401, "UnauthorizedError").is_token_error());
        assert!(api(403, "TokenError").is_token_error());
        assert!(!api(403, "PermissionDenied").is_token_error());
        assert_eq!(api(403, "PermissionDenied").reason(), "KMSAccessDenied");
        assert_eq!(
            api(404, "NotFound").to_string(),
            "KMS GET /api/v3/secrets/raw answered 404 NotFound: m"
        );
    }
}
