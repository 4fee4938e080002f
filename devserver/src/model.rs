//! The records the dev server keeps: projects with their environments,
//! folders, secrets, secret imports, identities, access tokens, service
//! tokens, dynamic secrets and leases. Each is stored as JSON under
//! `<kind>/<id>` in sled.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::scope::glob_matches;

/// A project (the real API also calls it a workspace).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Project {
    pub id: String,
    pub slug: String,
    pub name: String,
    pub org_id: String,
    pub auto_capitalization: bool,
    pub environments: Vec<Environment>,
    pub created_at: i64,
    pub updated_at: i64,
}

impl Project {
    /// The environment with this slug.
    pub fn environment(&self, slug: &str) -> Option<&Environment> {
        self.environments.iter().find(|e| e.slug == slug)
    }
}

/// An environment of a project.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Environment {
    pub id: String,
    pub slug: String,
    pub name: String,
}

/// A folder below the root of an environment. Roots (`/`) always exist
/// and have no record.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Folder {
    pub id: String,
    pub project_id: String,
    pub environment: String,
    pub path: String,
}

/// A shared secret.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Secret {
    pub id: String,
    pub project_id: String,
    pub environment: String,
    pub path: String,
    pub key: String,
    pub value: String,
    pub comment: String,
    pub version: u64,
    pub skip_multiline_encoding: bool,
    pub reminder_note: Option<String>,
    pub reminder_repeat_days: Option<u64>,
    pub created_at: i64,
    pub updated_at: i64,
}

/// A secret import: the folder (`environment`, `path`) of a project also
/// shows the secrets of (`import_environment`, `import_path`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Import {
    pub id: String,
    pub project_id: String,
    pub environment: String,
    pub path: String,
    pub position: u32,
    pub import_environment: String,
    pub import_path: String,
}

/// A machine identity.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Identity {
    pub id: String,
    pub name: String,
    /// Ids of the projects the identity is a member of.
    pub projects: Vec<String>,
    /// For the projects where the identity may only use some folders: the
    /// project id → folder-path globs. A member project without an entry is
    /// open in full.
    #[serde(default)]
    pub path_scopes: BTreeMap<String, Vec<String>>,
    pub universal_auth: Option<UniversalAuth>,
    #[serde(default)]
    pub kubernetes_auth: Option<KubernetesAuth>,
    #[serde(default)]
    pub ldap_auth: Option<LdapAuth>,
    /// AWS IAM auth (test mode).
    #[serde(default)]
    pub aws_auth: Option<Box<crate::seed::SeedAwsAuth>>,
    /// Azure auth (test mode).
    #[serde(default)]
    pub azure_auth: Option<Box<crate::seed::SeedAzureAuth>>,
    /// GCP auth (test mode).
    #[serde(default)]
    pub gcp_auth: Option<Box<crate::seed::SeedGcpAuth>>,
}

impl Identity {
    /// Whether the identity may use the folder `path` of a project it is a
    /// member of (`path` may itself be a glob, matched as text).
    pub fn may_use(&self, project_id: &str, path: &str) -> bool {
        match self.path_scopes.get(project_id) {
            None => true,
            Some(globs) => globs.iter().any(|g| glob_matches(g, path)),
        }
    }
}

/// Universal-auth settings of an identity.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct UniversalAuth {
    pub client_id: String,
    pub client_secret: String,
    /// Access-token TTL in seconds; 0 means no TTL.
    pub access_token_ttl: u64,
    /// Access-token lifetime cap in seconds; 0 means no cap.
    pub access_token_max_ttl: u64,
}

/// Kubernetes-auth settings of an identity: which service accounts may log
/// in. Empty lists allow any.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct KubernetesAuth {
    /// Namespace globs.
    pub allowed_namespaces: Vec<String>,
    /// Service-account name globs.
    pub allowed_names: Vec<String>,
    /// The audience a token must have, if any.
    pub allowed_audience: Option<String>,
    pub access_token_ttl: u64,
    pub access_token_max_ttl: u64,
}

/// LDAP-auth settings of an identity: the dev server is the directory and
/// knows one user.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct LdapAuth {
    pub username: String,
    pub password: String,
    pub access_token_ttl: u64,
    pub access_token_max_ttl: u64,
}

/// A legacy service token (`st.<id>.<secret>.<key>`), scoped to one
/// environment and folder glob of one project.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct ServiceToken {
    /// The second dot-part of the token.
    pub id: String,
    pub name: String,
    /// The third dot-part, compared with what a client sends.
    pub secret: String,
    pub project_id: String,
    pub environment: String,
    /// A folder path or a glob.
    pub path: String,
    /// `read`, `write`.
    pub permissions: Vec<String>,
    pub created_at: i64,
}

impl ServiceToken {
    /// Whether the token may use the folder (`path` may itself be a glob,
    /// matched as text).
    pub fn covers(&self, project_id: &str, environment: &str, path: &str) -> bool {
        self.project_id == project_id
            && self.environment == environment
            && glob_matches(&self.path, path)
    }

    /// Whether the token has a permission.
    pub fn can(&self, permission: &str) -> bool {
        self.permissions.iter().any(|p| p == permission)
    }
}

/// An identity access token (the JWT handed out only names it).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct AccessToken {
    pub id: String,
    pub identity_id: String,
    pub created_at: i64,
    pub last_renewed_at: Option<i64>,
    pub ttl: u64,
    pub max_ttl: u64,
}

impl AccessToken {
    /// When the TTL runs out (ms), if there is a TTL.
    pub fn ttl_expiry(&self) -> Option<i64> {
        (self.ttl > 0)
            .then(|| self.last_renewed_at.unwrap_or(self.created_at) + secs_to_ms(self.ttl))
    }

    /// When the lifetime cap runs out (ms), if there is a cap.
    pub fn max_expiry(&self) -> Option<i64> {
        (self.max_ttl > 0).then(|| self.created_at + secs_to_ms(self.max_ttl))
    }
}

/// Seconds as milliseconds, saturating.
pub(crate) fn secs_to_ms(secs: u64) -> i64 {
    i64::try_from(secs.saturating_mul(1000)).unwrap_or(i64::MAX)
}

/// A dynamic secret of the built-in provider.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct DynamicSecret {
    pub id: String,
    pub project_id: String,
    pub environment: String,
    pub path: String,
    pub name: String,
    /// As written in the seed, e.g. `1h`.
    pub default_ttl: String,
    pub default_ttl_ms: i64,
    /// As written in the seed; `None` means no cap.
    pub max_ttl: Option<String>,
    pub max_ttl_ms: Option<i64>,
    pub created_at: i64,
    pub updated_at: i64,
}

/// A lease of a dynamic secret.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Lease {
    pub id: String,
    pub dynamic_secret_id: String,
    pub version: u64,
    pub external_entity_id: String,
    /// The credentials minted for the lease, in order.
    pub data: Vec<(String, String)>,
    pub expire_at: i64,
    pub created_at: i64,
    pub updated_at: i64,
    pub revoked_at: Option<i64>,
}

impl Lease {
    /// Neither revoked nor expired at `now`.
    pub fn is_active(&self, now: i64) -> bool {
        self.revoked_at.is_none() && self.expire_at > now
    }
}
