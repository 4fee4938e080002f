//! Identities and their tokens.
//!
//! An identity is what one login is for: (KMS base URL, trust configuration,
//! method, client or identity id, hash of the secret material). Every
//! resource that uses the same identity shares one token: one login, renewed
//! before it expires, replaced by a fresh login at its max TTL. Logins are
//! lazy: nothing is asked of the KMS until a request needs a token.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use tokio::time::Instant;

use super::cloud::{CloudMethod, CloudSource};
use super::endpoint::{Endpoint, hex};
use super::error::KmsError;

/// Produces a Kubernetes service-account token when a login needs one (a
/// TokenRequest, or the legacy token Secret). Called lazily, so a short-lived
/// token is fresh at login time and the identity key never depends on it.
pub type JwtSource = Arc<
    dyn Fn() -> futures::future::BoxFuture<'static, Result<SecretString, String>> + Send + Sync,
>;

/// Credentials of one login method. Secret material is held redacted.
#[derive(Clone)]
pub enum Credentials {
    /// Universal auth: client id and client secret.
    UniversalAuth {
        /// The client id.
        client_id: String,
        /// The client secret.
        client_secret: SecretString,
    },
    /// Kubernetes auth: a service-account token checked by the KMS.
    Kubernetes {
        /// The machine identity.
        identity_id: String,
        /// What the token is for: `namespace/serviceaccount` and audiences
        /// (part of the identity key; the token itself is not).
        subject: String,
        /// Produces the token at login time.
        jwt: JwtSource,
    },
    /// LDAP auth: a username and password checked by the KMS.
    Ldap {
        /// The machine identity.
        identity_id: String,
        /// The LDAP username.
        username: String,
        /// The LDAP password.
        password: SecretString,
    },
    /// A cloud method (AWS IAM, Azure, GCP ID token, GCP IAM): a proof from
    /// the pod's cloud environment, produced at login time.
    Cloud {
        /// Which method.
        method: CloudMethod,
        /// The machine identity.
        identity_id: String,
        /// What the proof is for (resource, client id, key file path; part
        /// of the identity key, never secret).
        subject: String,
        /// Produces the proof at login time.
        source: Arc<dyn CloudSource>,
    },
    /// A legacy service token (`st.<id>.<secret>.<key>`): no login; the
    /// first three dot-parts are the bearer token.
    ServiceToken {
        /// The full token.
        token: SecretString,
    },
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::UniversalAuth { client_id, .. } => f
                .debug_struct("UniversalAuth")
                .field("client_id", client_id)
                .field("client_secret", &"[REDACTED]")
                .finish(),
            Credentials::Kubernetes {
                identity_id,
                subject,
                ..
            } => f
                .debug_struct("Kubernetes")
                .field("identity_id", identity_id)
                .field("subject", subject)
                .finish(),
            Credentials::Ldap {
                identity_id,
                username,
                ..
            } => f
                .debug_struct("Ldap")
                .field("identity_id", identity_id)
                .field("username", username)
                .field("password", &"[REDACTED]")
                .finish(),
            Credentials::Cloud {
                method,
                identity_id,
                subject,
                ..
            } => f
                .debug_struct("Cloud")
                .field("method", method)
                .field("identity_id", identity_id)
                .field("subject", subject)
                .finish(),
            Credentials::ServiceToken { .. } => f
                .debug_struct("ServiceToken")
                .field("token", &"[REDACTED]")
                .finish(),
        }
    }
}

impl Credentials {
    /// The login method.
    pub fn method(&self) -> LoginMethod {
        match self {
            Credentials::UniversalAuth { .. } => LoginMethod::Universal,
            Credentials::Kubernetes { .. } => LoginMethod::Kubernetes,
            Credentials::Ldap { .. } => LoginMethod::Ldap,
            Credentials::Cloud { method, .. } => method.login(),
            Credentials::ServiceToken { .. } => LoginMethod::ServiceToken,
        }
    }

    /// The body of the login request, or `None` for credentials that are
    /// used as they are ([`Credentials::bearer_without_login`]).
    pub async fn login_body(&self) -> Result<Option<serde_json::Value>, KmsError> {
        Ok(Some(match self {
            Credentials::UniversalAuth {
                client_id,
                client_secret,
            } => {
                serde_json::json!({"clientId": client_id, "clientSecret": client_secret.expose_secret()})
            }
            Credentials::Kubernetes {
                identity_id, jwt, ..
            } => {
                let token = jwt().await.map_err(KmsError::Credentials)?;
                serde_json::json!({"identityId": identity_id, "jwt": token.expose_secret()})
            }
            Credentials::Ldap {
                identity_id,
                username,
                password,
            } => {
                serde_json::json!({"identityId": identity_id, "username": username, "password": password.expose_secret()})
            }
            Credentials::Cloud {
                identity_id,
                source,
                ..
            } => {
                let proof = source.proof(identity_id).await.map_err(|e| {
                    KmsError::Credentials(format!("{} login: {e}", self.strategy_name()))
                })?;
                proof.login_body(identity_id)
            }
            Credentials::ServiceToken { .. } => return Ok(None),
        }))
    }

    /// The bearer of credentials used without a login (a service token's
    /// first three dot-parts); empty for the others.
    pub fn bearer_without_login(&self) -> SecretString {
        match self {
            Credentials::ServiceToken { token } => {
                SecretString::from(Credentials::service_token_bearer(token.expose_secret()))
            }
            _ => SecretString::from(String::new()),
        }
    }

    /// Name of the method as shown in conditions.
    pub fn strategy_name(&self) -> &'static str {
        self.method().strategy_name()
    }

    fn principal(&self) -> &str {
        match self {
            Credentials::UniversalAuth { client_id, .. } => client_id,
            Credentials::Kubernetes { identity_id, .. }
            | Credentials::Ldap { identity_id, .. }
            | Credentials::Cloud { identity_id, .. } => identity_id,
            Credentials::ServiceToken { .. } => "",
        }
    }

    fn material_digest(&self) -> String {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        match self {
            Credentials::UniversalAuth { client_secret, .. } => {
                ctx.update(client_secret.expose_secret().as_bytes())
            }
            Credentials::Kubernetes { subject, .. } | Credentials::Cloud { subject, .. } => {
                ctx.update(subject.as_bytes())
            }
            Credentials::Ldap {
                username, password, ..
            } => {
                ctx.update(&(username.len() as u64).to_be_bytes());
                ctx.update(username.as_bytes());
                ctx.update(password.expose_secret().as_bytes());
            }
            Credentials::ServiceToken { token } => ctx.update(token.expose_secret().as_bytes()),
        }
        hex(ctx.finish().as_ref())
    }

    /// The bearer token of a service token: its first three dot-parts, with
    /// spaces removed.
    pub fn service_token_bearer(token: &str) -> String {
        let clean: String = token.chars().filter(|c| !c.is_whitespace()).collect();
        clean.split('.').take(3).collect::<Vec<_>>().join(".")
    }
}

/// Who logs in where.
#[derive(Clone, Debug)]
pub struct Identity {
    /// The KMS.
    pub endpoint: Endpoint,
    /// How to log in.
    pub credentials: Credentials,
}

/// The key of an identity: a SHA-256 over every part that makes a login
/// different. Never keyed by client id alone.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdentityKey(pub String);

impl Identity {
    /// The identity's key.
    pub fn key(&self) -> IdentityKey {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        for part in [
            self.endpoint.base.as_str(),
            &self.endpoint.trust_key(),
            self.credentials.method().label(),
            self.credentials.principal(),
            &self.credentials.material_digest(),
        ] {
            ctx.update(&(part.len() as u64).to_be_bytes());
            ctx.update(part.as_bytes());
        }
        IdentityKey(hex(ctx.finish().as_ref()))
    }
}

/// A token and its lifetime, measured on the monotonic clock.
#[derive(Clone)]
pub struct Token {
    /// The bearer token.
    pub access_token: SecretString,
    /// When it was obtained by login.
    pub obtained: Instant,
    /// When it was last obtained or renewed.
    pub renewed: Instant,
    /// TTL without renewal; zero = none.
    pub ttl: Duration,
    /// Lifetime cap from `obtained`; zero = none.
    pub max_ttl: Duration,
}

/// What to do with a cached token now.
#[derive(Debug, PartialEq, Eq)]
pub enum TokenAction {
    /// Use it.
    Use,
    /// Renew it first.
    Renew,
    /// Log in again.
    Login,
}

impl Token {
    /// Decide at `now`: use while within 80 % of its TTL (and at least 10 s
    /// before the max TTL); renew when a renewal still fits under the max
    /// TTL; otherwise log in again.
    pub fn action(&self, now: Instant) -> TokenAction {
        let margin = Duration::from_secs(10);
        let max_deadline = (!self.max_ttl.is_zero()).then(|| self.obtained + self.max_ttl);
        if let Some(deadline) = max_deadline
            && now + margin >= deadline
        {
            return TokenAction::Login;
        }
        if self.ttl.is_zero() {
            return TokenAction::Use;
        }
        let expiry = self.renewed + self.ttl;
        if now < self.renewed + self.ttl.mul_f64(0.8) && now + margin.min(self.ttl / 2) < expiry {
            return TokenAction::Use;
        }
        if now >= expiry {
            return TokenAction::Login;
        }
        match max_deadline {
            Some(deadline) if now + self.ttl > deadline => TokenAction::Login,
            _ => TokenAction::Renew,
        }
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token")
            .field("access_token", &"[REDACTED]")
            .field("ttl", &self.ttl)
            .field("max_ttl", &self.max_ttl)
            .finish()
    }
}

/// Tokens by identity. Each identity has its own async lock, so concurrent
/// requests for one identity wait for a single login.
#[derive(Default)]
pub struct TokenCache {
    slots: Mutex<HashMap<IdentityKey, Arc<tokio::sync::Mutex<Option<Token>>>>>,
}

impl TokenCache {
    /// The slot of an identity (created empty on first use).
    pub fn slot(&self, key: &IdentityKey) -> Arc<tokio::sync::Mutex<Option<Token>>> {
        let mut map = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(key.clone()).or_default().clone()
    }

    /// Forget the token of an identity if it is still `stale` (so a token
    /// error on an old token does not throw away a newer one).
    pub async fn invalidate(&self, key: &IdentityKey, stale: &SecretString) {
        let slot = self.slot(key);
        let mut guard = slot.lock().await;
        if guard
            .as_ref()
            .is_some_and(|t| t.access_token.expose_secret() == stale.expose_secret())
        {
            *guard = None;
        }
    }

    /// Identities with a cached token.
    pub fn len(&self) -> usize {
        self.slots.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether no identity has a slot.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

// The login methods, named once: each method's metric label, the strategy
// name conditions show and the route it logs in on.
/// How an identity logs in to the KMS.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LoginMethod {
    /// Universal auth (`universalAuth`): client id and secret.
    Universal,
    /// Kubernetes auth (`kubernetesAuth`): a service-account token.
    Kubernetes,
    /// AWS IAM (`awsIamAuth`).
    AwsIam,
    /// Azure managed identity (`azureAuth`).
    Azure,
    /// GCP identity token from the metadata server (`gcpIdTokenAuth`).
    GcpIdToken,
    /// GCP service-account key file (`gcpIamAuth`).
    GcpIam,
    /// LDAP (`ldapAuth`).
    Ldap,
    /// A legacy service token (`serviceToken`): no login.
    ServiceToken,
}

impl LoginMethod {
    /// Every method, in the order metrics list them.
    pub const ALL: [LoginMethod; 8] = [
        LoginMethod::Universal,
        LoginMethod::Kubernetes,
        LoginMethod::AwsIam,
        LoginMethod::Azure,
        LoginMethod::GcpIdToken,
        LoginMethod::GcpIam,
        LoginMethod::Ldap,
        LoginMethod::ServiceToken,
    ];

    /// The metric label (`kms_operator_kms_logins_total{method}`).
    pub fn label(self) -> &'static str {
        match self {
            LoginMethod::Universal => "universal",
            LoginMethod::Kubernetes => "kubernetes",
            LoginMethod::AwsIam => "aws-iam",
            LoginMethod::Azure => "azure",
            LoginMethod::GcpIdToken => "gcp-id-token",
            LoginMethod::GcpIam => "gcp-iam",
            LoginMethod::Ldap => "ldap",
            LoginMethod::ServiceToken => "service-token",
        }
    }

    /// The strategy name shown in conditions (the Go operators' names).
    pub fn strategy_name(self) -> &'static str {
        match self {
            LoginMethod::Universal => "UNIVERSAL_MACHINE_IDENTITY",
            LoginMethod::Kubernetes => "KUBERNETES_AUTH_MACHINE_IDENTITY",
            LoginMethod::AwsIam => "AWS_IAM_MACHINE_IDENTITY",
            LoginMethod::Azure => "AZURE_MACHINE_IDENTITY",
            LoginMethod::GcpIdToken => "GCP_ID_TOKEN_MACHINE_IDENTITY",
            LoginMethod::GcpIam => "GCP_IAM_MACHINE_IDENTITY",
            LoginMethod::Ldap => "LDAP_MACHINE_IDENTITY",
            LoginMethod::ServiceToken => "SERVICE_TOKEN",
        }
    }

    /// The login route as a metric label and its path under the API base;
    /// `None` for a service token, which never logs in.
    pub fn route(self) -> Option<(&'static str, &'static str)> {
        Some(match self {
            LoginMethod::Universal => (
                "POST /api/v1/auth/universal-auth/login",
                "/v1/auth/universal-auth/login",
            ),
            LoginMethod::Kubernetes => (
                "POST /api/v1/auth/kubernetes-auth/login",
                "/v1/auth/kubernetes-auth/login",
            ),
            LoginMethod::AwsIam => (
                "POST /api/v1/auth/aws-auth/login",
                "/v1/auth/aws-auth/login",
            ),
            LoginMethod::Azure => (
                "POST /api/v1/auth/azure-auth/login",
                "/v1/auth/azure-auth/login",
            ),
            LoginMethod::GcpIdToken | LoginMethod::GcpIam => (
                "POST /api/v1/auth/gcp-auth/login",
                "/v1/auth/gcp-auth/login",
            ),
            LoginMethod::Ldap => (
                "POST /api/v1/auth/ldap-auth/login",
                "/v1/auth/ldap-auth/login",
            ),
            LoginMethod::ServiceToken => return None,
        })
    }
}

impl CloudMethod {
    /// The login method it is.
    pub fn login(self) -> LoginMethod {
        match self {
            CloudMethod::AwsIam => LoginMethod::AwsIam,
            CloudMethod::Azure => LoginMethod::Azure,
            CloudMethod::GcpIdToken => LoginMethod::GcpIdToken,
            CloudMethod::GcpIam => LoginMethod::GcpIam,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ident(secret: &str, host: &str) -> Identity {
        Identity {
            endpoint: Endpoint::new(host, None).unwrap(),
            credentials: Credentials::UniversalAuth {
                client_id: "id".into(),
                client_secret: SecretString::from(secret.to_owned()),
            },
        }
    }

    #[test]
    fn service_token_bearer_is_the_first_three_parts() {
        assert_eq!(
            Credentials::service_token_bearer(" st.demo.abc.def \n"),
            "st.demo.abc"
        );
        assert_eq!(Credentials::service_token_bearer("st.a.b"), "st.a.b");
    }

    #[test]
    fn identity_key_covers_host_and_secret_material() {
        let a = ident("s1", "https://a.io");
        assert_eq!(a.key(), ident("s1", "https://a.io/api").key());
        assert_ne!(a.key(), ident("s2", "https://a.io").key());
        assert_ne!(a.key(), ident("s1", "https://b.io").key());
        let debug = format!("{a:?}");
        assert!(!debug.contains("s1\""), "{debug}");
    }

    #[tokio::test(start_paused = true)]
    async fn token_lifecycle() {
        let t0 = Instant::now();
        let tok = Token {
            access_token: SecretString::from("t".to_owned()),
            obtained: t0,
            renewed: t0,
            ttl: Duration::from_secs(100),
            max_ttl: Duration::from_secs(250),
        };
        assert_eq!(tok.action(t0), TokenAction::Use);
        assert_eq!(tok.action(t0 + Duration::from_secs(79)), TokenAction::Use);
        assert_eq!(tok.action(t0 + Duration::from_secs(85)), TokenAction::Renew);
        assert_eq!(
            tok.action(t0 + Duration::from_secs(100)),
            TokenAction::Login
        );
        let renewed = Token {
            renewed: t0 + Duration::from_secs(160),
            ..tok.clone()
        };
        // Still valid for 20 s (the cap is at 250 s): use it.
        assert_eq!(
            renewed.action(t0 + Duration::from_secs(230)),
            TokenAction::Use
        );
        // Within 10 s of the cap: log in again rather than renew past it.
        assert_eq!(
            renewed.action(t0 + Duration::from_secs(241)),
            TokenAction::Login
        );
        // Past 80 % of the TTL, and a renewal would run past the cap.
        let late = Token {
            renewed: t0 + Duration::from_secs(120),
            ..tok.clone()
        };
        assert_eq!(
            late.action(t0 + Duration::from_secs(210)),
            TokenAction::Login
        );
        let no_ttl = Token {
            ttl: Duration::ZERO,
            max_ttl: Duration::ZERO,
            ..tok
        };
        assert_eq!(
            no_ttl.action(t0 + Duration::from_secs(1_000_000)),
            TokenAction::Use
        );
    }

    #[test]
    fn labels_and_names_are_distinct() {
        let labels: std::collections::HashSet<_> =
            LoginMethod::ALL.iter().map(|m| m.label()).collect();
        let names: std::collections::HashSet<_> =
            LoginMethod::ALL.iter().map(|m| m.strategy_name()).collect();
        assert_eq!(labels.len(), LoginMethod::ALL.len());
        assert_eq!(names.len(), LoginMethod::ALL.len());
    }

    #[test]
    fn login_routes_are_not_listed_with_the_other_endpoints() {
        for m in LoginMethod::ALL {
            if let Some((route, path)) = m.route() {
                assert!(
                    !crate::metrics::KMS_ENDPOINTS.contains(&route),
                    "{route} is listed twice"
                );
                assert_eq!(route, format!("POST /api{path}"));
            }
        }
    }
}
