//! The JSON shapes of responses, field for field and in the real server's
//! order (the order matters for the `ETag`, which hashes the exact bytes).

use serde::Serialize;
use serde::ser::SerializeMap;

use crate::clock::iso;
use crate::ids::derived;
use crate::model::{DynamicSecret, Lease, Project, Secret, ServiceToken};
use crate::store::State;

/// Where a secret is shown, which decides its fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// An item of a list: with `secretPath` and `tags`.
    List,
    /// The answer of a get: with `tags`, without `secretPath`.
    Get,
    /// The answer of a write: neither `secretPath` nor `tags`.
    Write,
    /// A secret of an import block: no timestamps, reminder fields, path or
    /// tags, and an empty `workspace`.
    Imported,
}

/// A secret as the v3 raw routes show it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SecretView {
    id: String,
    #[serde(rename = "_id")]
    legacy_id: String,
    workspace: String,
    environment: String,
    version: u64,
    #[serde(rename = "type")]
    kind: &'static str,
    secret_key: String,
    secret_value: String,
    secret_comment: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    secret_reminder_note: Option<Option<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    secret_reminder_repeat_days: Option<Option<u64>>,
    skip_multiline_encoding: bool,
    metadata: (),
    #[serde(skip_serializing_if = "Option::is_none")]
    created_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    updated_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    secret_path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tags: Option<[(); 0]>,
}

impl SecretView {
    /// `secret` in `shape`, with its value replaced by `value` if given (an
    /// expanded value).
    pub fn new(secret: &Secret, shape: Shape, value: Option<String>) -> SecretView {
        let imported = shape == Shape::Imported;
        SecretView {
            id: secret.id.clone(),
            legacy_id: secret.id.clone(),
            workspace: if imported {
                String::new()
            } else {
                secret.project_id.clone()
            },
            environment: secret.environment.clone(),
            version: secret.version,
            kind: "shared",
            secret_key: secret.key.clone(),
            secret_value: value.unwrap_or_else(|| secret.value.clone()),
            secret_comment: secret.comment.clone(),
            secret_reminder_note: (!imported).then(|| secret.reminder_note.clone()),
            secret_reminder_repeat_days: (!imported).then_some(secret.reminder_repeat_days),
            skip_multiline_encoding: secret.skip_multiline_encoding,
            metadata: (),
            created_at: (!imported).then(|| iso(secret.created_at)),
            updated_at: (!imported).then(|| iso(secret.updated_at)),
            secret_path: (shape == Shape::List).then(|| secret.path.clone()),
            tags: matches!(shape, Shape::List | Shape::Get).then_some([]),
        }
    }

    /// Show `comment` instead of the stored comment.
    pub fn with_comment(mut self, comment: String) -> SecretView {
        self.secret_comment = comment;
        self
    }
}

/// An import block of a list.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ImportView {
    pub secret_path: String,
    pub environment: String,
    pub folder_id: String,
    pub secrets: Vec<SecretView>,
}

/// An environment of a project.
#[derive(Debug, Serialize)]
struct EnvironmentView<'a> {
    name: &'a str,
    slug: &'a str,
    id: &'a str,
}

/// A project as `GET /api/v2/workspace/:slug` shows it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ProjectView<'a> {
    id: &'a str,
    name: &'a str,
    slug: &'a str,
    auto_capitalization: bool,
    org_id: &'a str,
    created_at: String,
    updated_at: String,
    version: u32,
    upgrade_status: (),
    pit_version_limit: u32,
    kms_certificate_key_id: (),
    audit_logs_retention_days: (),
    #[serde(rename = "_id")]
    legacy_id: &'a str,
    environments: Vec<EnvironmentView<'a>>,
}

impl<'a> ProjectView<'a> {
    /// The view of `p`.
    pub fn new(p: &'a Project) -> ProjectView<'a> {
        ProjectView {
            id: &p.id,
            name: &p.name,
            slug: &p.slug,
            auto_capitalization: p.auto_capitalization,
            org_id: &p.org_id,
            created_at: iso(p.created_at),
            updated_at: iso(p.updated_at),
            // The project format version of current servers.
            version: 3,
            upgrade_status: (),
            pit_version_limit: 10,
            kms_certificate_key_id: (),
            audit_logs_retention_days: (),
            legacy_id: &p.id,
            environments: p
                .environments
                .iter()
                .map(|e| EnvironmentView {
                    name: &e.name,
                    slug: &e.slug,
                    id: &e.id,
                })
                .collect(),
        }
    }
}

/// The scope of a service token.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ScopeView<'a> {
    environment: &'a str,
    secret_path: &'a str,
}

/// The user a service token was made by: the dev server has one.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct TokenUserView {
    id: String,
    email: &'static str,
    username: &'static str,
    first_name: &'static str,
    last_name: &'static str,
    #[serde(rename = "_id")]
    legacy_id: String,
    #[serde(rename = "__v")]
    legacy_version: u32,
}

/// A service token as `GET /api/v2/service-token` shows it: the record
/// (without its secret hash), `workspace` (the project id), the user who
/// made it, and the legacy `_id`/`__v`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ServiceTokenView<'a> {
    id: &'a str,
    name: &'a str,
    scopes: [ScopeView<'a>; 1],
    permissions: &'a [String],
    last_used: (),
    expires_at: (),
    encrypted_key: &'static str,
    iv: &'static str,
    tag: &'static str,
    created_at: String,
    updated_at: String,
    created_by: String,
    project_id: &'a str,
    workspace: &'a str,
    user: TokenUserView,
    #[serde(rename = "_id")]
    legacy_id: &'a str,
    #[serde(rename = "__v")]
    legacy_version: u32,
}

impl<'a> ServiceTokenView<'a> {
    /// The view of `t`.
    pub fn new(t: &'a ServiceToken) -> ServiceTokenView<'a> {
        let user = derived("user", &["dev-server"]);
        ServiceTokenView {
            id: &t.id,
            name: &t.name,
            scopes: [ScopeView {
                environment: &t.environment,
                secret_path: &t.path,
            }],
            permissions: &t.permissions,
            last_used: (),
            expires_at: (),
            encrypted_key: "",
            iv: "",
            tag: "",
            created_at: iso(t.created_at),
            updated_at: iso(t.created_at),
            created_by: user.clone(),
            project_id: &t.project_id,
            workspace: &t.project_id,
            user: TokenUserView {
                id: user.clone(),
                email: "dev@dev-server.local",
                username: "dev@dev-server.local",
                first_name: "Dev",
                last_name: "Server",
                legacy_id: user,
                legacy_version: 0,
            },
            legacy_id: &t.id,
            legacy_version: 0,
        }
    }
}

/// A dynamic secret (its provider inputs are never shown).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct DynamicSecretView {
    id: String,
    name: String,
    version: u32,
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(rename = "defaultTTL")]
    default_ttl: String,
    #[serde(rename = "maxTTL")]
    max_ttl: Option<String>,
    folder_id: String,
    status: Option<String>,
    status_details: Option<String>,
    created_at: String,
    updated_at: String,
}

/// The provider type reported for the built-in provider: its credentials
/// have the shape of the SQL provider's.
pub(crate) const PROVIDER_TYPE: &str = "sql-database";

impl DynamicSecretView {
    /// The view of `d`.
    pub fn new(d: &DynamicSecret) -> DynamicSecretView {
        DynamicSecretView {
            id: d.id.clone(),
            name: d.name.clone(),
            version: 1,
            kind: PROVIDER_TYPE,
            default_ttl: d.default_ttl.clone(),
            max_ttl: d.max_ttl.clone(),
            folder_id: State::folder_id(&d.project_id, &d.environment, &d.path),
            status: None,
            status_details: None,
            created_at: iso(d.created_at),
            updated_at: iso(d.updated_at),
        }
    }
}

/// A lease.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct LeaseView {
    id: String,
    version: u64,
    external_entity_id: String,
    expire_at: String,
    status: Option<String>,
    status_details: Option<String>,
    dynamic_secret_id: String,
    created_at: String,
    updated_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    dynamic_secret: Option<DynamicSecretView>,
}

impl LeaseView {
    /// The view of `l`, with its dynamic secret if given.
    pub fn new(l: &Lease, with: Option<&DynamicSecret>) -> LeaseView {
        LeaseView {
            id: l.id.clone(),
            version: l.version,
            external_entity_id: l.external_entity_id.clone(),
            expire_at: iso(l.expire_at),
            status: None,
            status_details: None,
            dynamic_secret_id: l.dynamic_secret_id.clone(),
            created_at: iso(l.created_at),
            updated_at: iso(l.updated_at),
            dynamic_secret: with.map(DynamicSecretView::new),
        }
    }
}

/// Key-value pairs serialized as a JSON object in their order.
#[derive(Debug)]
pub(crate) struct OrderedMap<'a>(pub &'a [(String, String)]);

impl Serialize for OrderedMap<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}
