//! The seed file: projects with environments, secrets, imports and dynamic
//! secrets, machine identities with their auth methods and memberships, and
//! service tokens, created at start. Parsing and checks live here; applying
//! the seed to the database is in `store`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{Error, durations};

/// Access-token TTL and max TTL used when the seed gives none (30 days, the
/// real server's default for a new auth method).
pub(crate) const DEFAULT_TOKEN_TTL: u64 = 2_592_000;

/// A seed file.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Seed {
    /// Projects to create.
    #[serde(default)]
    pub projects: Vec<SeedProject>,
    /// Machine identities to create.
    #[serde(default)]
    pub identities: Vec<SeedIdentity>,
    /// Legacy service tokens to create.
    #[serde(default)]
    pub service_tokens: Vec<SeedServiceToken>,
}

/// A project of the seed.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SeedProject {
    /// Project id; derived from the slug when absent.
    #[serde(default)]
    pub id: Option<String>,
    /// Project slug (lower-case letters, digits, `-` and `_`).
    pub slug: String,
    /// Display name; the slug when absent.
    #[serde(default)]
    pub name: Option<String>,
    /// Environments; `dev`, `staging` and `prod` when absent.
    #[serde(default)]
    pub environments: Vec<SeedEnvironment>,
    /// Secrets: environment → folder path → key → value.
    #[serde(default)]
    pub secrets: BTreeMap<String, BTreeMap<String, BTreeMap<String, SeedSecretValue>>>,
    /// Secret imports: environment → folder path → folders it imports, in
    /// order.
    #[serde(default)]
    pub imports: BTreeMap<String, BTreeMap<String, Vec<SeedImport>>>,
    /// Dynamic secrets served by the built-in provider.
    #[serde(default)]
    pub dynamic_secrets: Vec<SeedDynamicSecret>,
    /// The project's `autoCapitalization` flag (reported only).
    #[serde(default)]
    pub auto_capitalization: bool,
}

/// An environment: a bare slug (`dev`) or `{slug, name, id}`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(from = "RawEnvironment")]
pub struct SeedEnvironment {
    /// Environment slug.
    pub slug: String,
    /// Display name; `Development`, `Staging`, `Production` for `dev`,
    /// `staging`, `prod`, else the slug.
    pub name: Option<String>,
    /// Environment id; derived when absent.
    pub id: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawEnvironment {
    Slug(String),
    Full {
        slug: String,
        #[serde(default)]
        name: Option<String>,
        #[serde(default)]
        id: Option<String>,
    },
}

impl From<RawEnvironment> for SeedEnvironment {
    fn from(raw: RawEnvironment) -> Self {
        match raw {
            RawEnvironment::Slug(slug) => SeedEnvironment {
                slug,
                name: None,
                id: None,
            },
            RawEnvironment::Full { slug, name, id } => SeedEnvironment { slug, name, id },
        }
    }
}

/// A secret value: a scalar (`s3cret`, `8080`) or `{value, comment}`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(from = "RawSecretValue")]
pub struct SeedSecretValue {
    /// The value (numbers and booleans as written by YAML's parser).
    pub value: String,
    /// The secret's comment.
    pub comment: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawScalar {
    Text(String),
    Int(i64),
    UInt(u64),
    Float(f64),
    Bool(bool),
}

impl RawScalar {
    fn into_string(self) -> String {
        match self {
            RawScalar::Text(s) => s,
            RawScalar::Int(i) => i.to_string(),
            RawScalar::UInt(u) => u.to_string(),
            RawScalar::Float(f) => f.to_string(),
            RawScalar::Bool(b) => b.to_string(),
        }
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawSecretValue {
    Scalar(RawScalar),
    Full {
        value: RawScalar,
        #[serde(default)]
        comment: Option<String>,
    },
}

impl From<RawSecretValue> for SeedSecretValue {
    fn from(raw: RawSecretValue) -> Self {
        match raw {
            RawSecretValue::Scalar(v) => SeedSecretValue {
                value: v.into_string(),
                comment: None,
            },
            RawSecretValue::Full { value, comment } => SeedSecretValue {
                value: value.into_string(),
                comment,
            },
        }
    }
}

/// An imported folder.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct SeedImport {
    /// Environment slug of the imported folder.
    pub environment: String,
    /// Path of the imported folder.
    pub path: String,
}

/// A duration: `30s`, `5m`, `1h`, `1d`, or a number of seconds.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(try_from = "RawDuration")]
pub struct SeedDuration {
    /// As written (numbers become `<n>s`).
    pub text: String,
    /// Its length.
    pub duration: Duration,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawDuration {
    Secs(u64),
    Text(String),
}

impl TryFrom<RawDuration> for SeedDuration {
    type Error = String;

    fn try_from(raw: RawDuration) -> Result<Self, String> {
        match raw {
            RawDuration::Secs(s) => Ok(SeedDuration {
                text: format!("{s}s"),
                duration: Duration::from_secs(s),
            }),
            RawDuration::Text(text) => match durations::parse_seed(&text) {
                Some(duration) => Ok(SeedDuration { text, duration }),
                None => Err(format!(
                    "invalid duration {text:?} (use e.g. 30s, 5m, 1h, 1d)"
                )),
            },
        }
    }
}

impl SeedDuration {
    /// A duration from text such as `1h`.
    pub fn parse(text: &str) -> Option<SeedDuration> {
        SeedDuration::try_from(RawDuration::Text(text.to_owned())).ok()
    }
}

/// A dynamic secret served by the built-in provider, which mints a random
/// `DB_USERNAME` and `DB_PASSWORD` per lease.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct SeedDynamicSecret {
    /// Dynamic secret id; derived when absent.
    #[serde(default)]
    pub id: Option<String>,
    /// Name, unique in its folder.
    pub name: String,
    /// Environment slug.
    pub environment: String,
    /// Folder path (default `/`).
    #[serde(default = "root")]
    pub path: String,
    /// TTL of a lease created without one (default `1h`).
    #[serde(rename = "defaultTTL", default)]
    pub default_ttl: Option<SeedDuration>,
    /// Longest lifetime of a lease, renewals included; no cap when absent.
    #[serde(rename = "maxTTL", default)]
    pub max_ttl: Option<SeedDuration>,
}

fn root() -> String {
    "/".to_owned()
}

/// A machine identity.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SeedIdentity {
    /// Identity id; derived from the name when absent.
    #[serde(default)]
    pub id: Option<String>,
    /// Name, unique.
    pub name: String,
    /// Universal-auth credentials.
    #[serde(default)]
    pub universal_auth: Option<SeedUniversalAuth>,
    /// Kubernetes auth: which service accounts may log in.
    #[serde(default)]
    pub kubernetes_auth: Option<SeedKubernetesAuth>,
    /// LDAP auth: the one user of the dev server's directory.
    #[serde(default)]
    pub ldap_auth: Option<SeedLdapAuth>,
    /// AWS IAM auth in test mode: signed `GetCallerIdentity` requests are
    /// checked here, not sent to STS.
    #[serde(default)]
    pub aws_auth: Option<SeedAwsAuth>,
    /// Azure auth in test mode: managed-identity JWTs checked here.
    #[serde(default)]
    pub azure_auth: Option<SeedAzureAuth>,
    /// GCP auth (ID token and IAM) in test mode: JWTs checked here.
    #[serde(default)]
    pub gcp_auth: Option<SeedGcpAuth>,
    /// Projects the identity is a member of: slugs or ids, or
    /// `{slug, paths}` to allow only some folders.
    #[serde(default)]
    pub projects: Vec<SeedMembership>,
}

/// A membership of an identity: a project slug or id (`demo`), or
/// `{slug: demo, paths: ["/backend/**"]}` to allow only the folders the
/// globs match.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(from = "RawMembership")]
pub struct SeedMembership {
    /// Project slug or id.
    pub project: String,
    /// Folder-path globs the identity may use; all folders when absent.
    pub paths: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawMembership {
    Project(String),
    Scoped {
        #[serde(alias = "project", alias = "id")]
        slug: String,
        #[serde(default)]
        paths: Option<Vec<String>>,
    },
}

impl From<RawMembership> for SeedMembership {
    fn from(raw: RawMembership) -> Self {
        match raw {
            RawMembership::Project(project) => SeedMembership {
                project,
                paths: None,
            },
            RawMembership::Scoped { slug, paths } => SeedMembership {
                project: slug,
                paths,
            },
        }
    }
}

impl From<&str> for SeedMembership {
    fn from(project: &str) -> Self {
        SeedMembership {
            project: project.to_owned(),
            paths: None,
        }
    }
}

/// A list given as a YAML list or as one comma-separated string.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(from = "RawList")]
pub struct SeedList(pub Vec<String>);

#[derive(Deserialize)]
#[serde(untagged)]
enum RawList {
    Many(Vec<String>),
    One(String),
}

impl From<RawList> for SeedList {
    fn from(raw: RawList) -> Self {
        let items = match raw {
            RawList::Many(items) => items,
            RawList::One(text) => text.split(',').map(str::to_owned).collect(),
        };
        SeedList(
            items
                .into_iter()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect(),
        )
    }
}

/// Kubernetes-auth settings of an identity. A login's service-account
/// token is reviewed by the cluster of `--kubeconfig`, then its namespace,
/// name and audience are checked against these.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct SeedKubernetesAuth {
    /// Namespaces (globs allowed) whose service accounts may log in; any
    /// when empty.
    #[serde(rename = "allowedNamespaces", default)]
    pub allowed_namespaces: SeedList,
    /// Service-account names (globs allowed) that may log in; any when
    /// empty.
    #[serde(rename = "allowedNames", default)]
    pub allowed_names: SeedList,
    /// The audience tokens must carry (reviewed for it); none when absent.
    #[serde(rename = "allowedAudience", default)]
    pub allowed_audience: Option<String>,
    /// Access-token TTL in seconds (0 = none; default 30 days).
    #[serde(rename = "accessTokenTTL", default = "default_token_ttl")]
    pub access_token_ttl: u64,
    /// Access-token lifetime cap in seconds (0 = none; default 30 days).
    #[serde(rename = "accessTokenMaxTTL", default = "default_token_ttl")]
    pub access_token_max_ttl: u64,
}

/// LDAP-auth settings of an identity: the dev server plays the directory,
/// with this one user.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct SeedLdapAuth {
    /// The user name a login must send.
    pub username: String,
    /// Its password.
    pub password: String,
    /// Access-token TTL in seconds (0 = none; default 30 days).
    #[serde(rename = "accessTokenTTL", default = "default_token_ttl")]
    pub access_token_ttl: u64,
    /// Access-token lifetime cap in seconds (0 = none; default 30 days).
    #[serde(rename = "accessTokenMaxTTL", default = "default_token_ttl")]
    pub access_token_max_ttl: u64,
}

/// AWS IAM auth of an identity, in the dev server's **test mode**: the
/// dev server cannot ask STS who signed a `GetCallerIdentity` request, so it
/// checks the request's shape (method, body, SigV4 `Authorization` format,
/// a recent `X-Amz-Date`) and, when the access key is listed in `keys`,
/// verifies the signature with the key's secret and takes the key's ARN as
/// the caller. A key that is not listed has no known principal: it is
/// accepted only when both allow lists are empty.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SeedAwsAuth {
    /// Principal ARNs (`*` wildcards allowed) that may log in; any when
    /// empty.
    #[serde(default)]
    pub allowed_principal_arns: SeedList,
    /// AWS account ids that may log in; any when empty.
    #[serde(default)]
    pub allowed_account_ids: SeedList,
    /// Access keys the dev server knows, standing in for STS.
    #[serde(default)]
    pub keys: Vec<SeedAwsKey>,
    /// Access-token TTL in seconds (0 = none; default 30 days).
    #[serde(rename = "accessTokenTTL", default = "default_token_ttl")]
    pub access_token_ttl: u64,
    /// Access-token lifetime cap in seconds (0 = none; default 30 days).
    #[serde(rename = "accessTokenMaxTTL", default = "default_token_ttl")]
    pub access_token_max_ttl: u64,
}

/// An AWS access key known to the dev server and the principal it stands
/// for.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SeedAwsKey {
    /// The access key id.
    pub access_key_id: String,
    /// Its secret, to verify signatures with.
    pub secret_access_key: String,
    /// The caller ARN STS would report, e.g.
    /// `arn:aws:sts::123456789012:assumed-role/app/session`.
    pub arn: String,
}

/// An RSA public key (JWK members `n`, `e`, base64url) that signs the JWTs
/// of a test-mode cloud login.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct SeedJwk {
    /// Key id; when set, a JWT whose header names another `kid` is not
    /// checked with this key.
    #[serde(default)]
    pub kid: Option<String>,
    /// Modulus, base64url.
    pub n: String,
    /// Public exponent, base64url.
    pub e: String,
}

/// Azure auth of an identity, in **test mode**: the managed-identity JWT is
/// checked for structure, expiry, audience (`resource`), issuer (of
/// `tenantId`) and service principal (`oid`); its RS256 signature is
/// verified when `jwks` is given, else not checked.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SeedAzureAuth {
    /// Tenant; tokens must be issued by `https://sts.windows.net/<tenantId>/`.
    #[serde(default)]
    pub tenant_id: Option<String>,
    /// The audience tokens must carry (default
    /// `https://management.azure.com/`).
    #[serde(default)]
    pub resource: Option<String>,
    /// Service principal object ids (`oid`) that may log in; any when empty.
    #[serde(default)]
    pub allowed_service_principal_ids: SeedList,
    /// Keys that sign the tokens.
    #[serde(default)]
    pub jwks: Vec<SeedJwk>,
    /// Access-token TTL in seconds (0 = none; default 30 days).
    #[serde(rename = "accessTokenTTL", default = "default_token_ttl")]
    pub access_token_ttl: u64,
    /// Access-token lifetime cap in seconds (0 = none; default 30 days).
    #[serde(rename = "accessTokenMaxTTL", default = "default_token_ttl")]
    pub access_token_max_ttl: u64,
}

/// GCP auth of an identity (ID token and IAM alike), in **test mode**: the
/// JWT is checked for structure, expiry, audience (the identity id) and
/// service account (`email`, else `sub`); its RS256 signature is verified
/// when `jwks` is given, else not checked.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SeedGcpAuth {
    /// Service-account emails that may log in; any when empty.
    #[serde(default)]
    pub allowed_service_accounts: SeedList,
    /// Keys that sign the tokens.
    #[serde(default)]
    pub jwks: Vec<SeedJwk>,
    /// Access-token TTL in seconds (0 = none; default 30 days).
    #[serde(rename = "accessTokenTTL", default = "default_token_ttl")]
    pub access_token_ttl: u64,
    /// Access-token lifetime cap in seconds (0 = none; default 30 days).
    #[serde(rename = "accessTokenMaxTTL", default = "default_token_ttl")]
    pub access_token_max_ttl: u64,
}

/// A legacy service token, scoped to one environment and folder (or
/// folder glob) of a project.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct SeedServiceToken {
    /// The full token, `st.<id>.<secret>.<key>`; clients send
    /// `st.<id>.<secret>` as the bearer.
    pub token: String,
    /// Display name; `service-token-<id>` when absent.
    #[serde(default)]
    pub name: Option<String>,
    /// Project slug or id.
    pub project: String,
    /// Environment slug of the scope.
    pub environment: String,
    /// Folder path or glob of the scope (default `/`).
    #[serde(default = "root")]
    pub path: String,
    /// `read` and/or `write` (default `[read]`).
    #[serde(default)]
    pub permissions: Option<Vec<String>>,
}

impl SeedServiceToken {
    /// The id (second dot-part) and secret (third) of the token.
    pub fn parts(&self) -> Option<(&str, &str)> {
        let mut parts = self.token.trim().split('.');
        match (parts.next(), parts.next(), parts.next()) {
            (Some("st"), Some(id), Some(secret)) if !id.is_empty() && !secret.is_empty() => {
                Some((id, secret))
            }
            _ => None,
        }
    }

    /// The permissions, with the default.
    pub fn permission_list(&self) -> Vec<String> {
        self.permissions
            .clone()
            .unwrap_or_else(|| vec!["read".to_owned()])
    }
}

/// Universal-auth credentials of an identity.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct SeedUniversalAuth {
    /// Client id; derived from the identity's name when absent.
    #[serde(rename = "clientId", default)]
    pub client_id: Option<String>,
    /// Client secret.
    #[serde(rename = "clientSecret")]
    pub client_secret: String,
    /// Access-token TTL in seconds (0 = none; default 30 days).
    #[serde(rename = "accessTokenTTL", default = "default_token_ttl")]
    pub access_token_ttl: u64,
    /// Access-token lifetime cap in seconds (0 = none; default 30 days).
    #[serde(rename = "accessTokenMaxTTL", default = "default_token_ttl")]
    pub access_token_max_ttl: u64,
}

fn default_token_ttl() -> u64 {
    DEFAULT_TOKEN_TTL
}

/// The display name of an environment without one.
pub(crate) fn environment_name(slug: &str) -> String {
    match slug {
        "dev" => "Development".to_owned(),
        "staging" => "Staging".to_owned(),
        "prod" => "Production".to_owned(),
        other => other.to_owned(),
    }
}

/// A folder path in canonical form: leading `/`, no trailing or doubled
/// `/`, surrounding whitespace trimmed.
pub(crate) fn normalize_path(raw: &str) -> String {
    let segments: Vec<&str> = raw.trim().split('/').filter(|s| !s.is_empty()).collect();
    format!("/{}", segments.join("/"))
}

impl SeedProject {
    /// The environments, with the defaults when none are listed.
    pub fn environment_list(&self) -> Vec<SeedEnvironment> {
        if self.environments.is_empty() {
            ["dev", "staging", "prod"]
                .iter()
                .map(|s| SeedEnvironment {
                    slug: (*s).to_owned(),
                    name: None,
                    id: None,
                })
                .collect()
        } else {
            self.environments.clone()
        }
    }
}

impl Seed {
    /// Read and check a seed file.
    pub fn from_file(path: &Path) -> Result<Seed, Error> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Seed(format!("cannot read {}: {e}", path.display())))?;
        Seed::from_yaml(&text).map_err(|e| match e {
            Error::Seed(msg) => Error::Seed(format!("{}: {msg}", path.display())),
            other => other,
        })
    }

    /// Parse and check seed YAML.
    pub fn from_yaml(text: &str) -> Result<Seed, Error> {
        let blank = text
            .lines()
            .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'));
        let seed: Seed = if blank {
            Seed::default()
        } else {
            // A seed is written by whoever runs the server, and a large one
            // (10,000 identities and folders for a benchmark) holds more
            // nodes and events than the parser's default budget allows: the
            // budget grows with the text (a node or an event takes at
            // least a byte of it).
            let options = serde_saphyr::options! {
                budget: serde_saphyr::budget! {
                    max_nodes: text.len().max(250_000),
                    max_events: text.len().max(1_000_000),
                },
            };
            serde_saphyr::from_str_with_options(text, options)
                .map_err(|e| Error::Seed(e.to_string()))?
        };
        seed.validate()?;
        Ok(seed)
    }

    /// Check references and names; every problem found is reported.
    pub fn validate(&self) -> Result<(), Error> {
        let mut problems = Vec::new();
        let mut slugs = BTreeSet::new();
        let mut ids = BTreeSet::new();
        for p in &self.projects {
            let at = format!("project {:?}", p.slug);
            if !valid_slug(&p.slug) {
                problems.push(format!(
                    "{at}: a slug is 1-64 lower-case letters, digits, '-' or '_'"
                ));
            }
            if !slugs.insert(p.slug.clone()) {
                problems.push(format!("{at}: duplicate slug"));
            }
            if let Some(id) = &p.id
                && (!valid_id(id) || !ids.insert(id.clone()))
            {
                problems.push(format!("{at}: invalid or duplicate id {id:?}"));
            }
            let envs = p.environment_list();
            let mut env_slugs = BTreeSet::new();
            for e in &envs {
                if !valid_slug(&e.slug) || !env_slugs.insert(e.slug.clone()) {
                    problems.push(format!(
                        "{at}: invalid or duplicate environment {:?}",
                        e.slug
                    ));
                }
                if let Some(id) = &e.id
                    && !valid_id(id)
                {
                    problems.push(format!("{at}: invalid environment id {id:?}"));
                }
            }
            for (env, folders) in &p.secrets {
                if !env_slugs.contains(env) {
                    problems.push(format!("{at}: secrets name unknown environment {env:?}"));
                }
                for keys in folders.values() {
                    for key in keys.keys() {
                        if key.trim().is_empty() || key.trim() != key || key.contains('/') {
                            problems.push(format!(
                                "{at}: invalid secret key {key:?} (empty, padded or with '/')"
                            ));
                        }
                    }
                }
            }
            for (env, folders) in &p.imports {
                if !env_slugs.contains(env) {
                    problems.push(format!("{at}: imports name unknown environment {env:?}"));
                }
                for list in folders.values() {
                    for i in list {
                        if !env_slugs.contains(&i.environment) {
                            problems.push(format!(
                                "{at}: an import names unknown environment {:?}",
                                i.environment
                            ));
                        }
                    }
                }
            }
            let mut dyn_names = BTreeSet::new();
            for d in &p.dynamic_secrets {
                let dat = format!("{at}: dynamic secret {:?}", d.name);
                if d.name.trim().is_empty() {
                    problems.push(format!("{dat}: empty name"));
                }
                if !env_slugs.contains(&d.environment) {
                    problems.push(format!("{dat}: unknown environment {:?}", d.environment));
                }
                let folder = (
                    d.environment.clone(),
                    normalize_path(&d.path),
                    d.name.to_lowercase(),
                );
                if !dyn_names.insert(folder) {
                    problems.push(format!("{dat}: duplicate in its folder"));
                }
                if let Some(id) = &d.id
                    && !valid_id(id)
                {
                    problems.push(format!("{dat}: invalid id {id:?}"));
                }
                if let (Some(def), Some(max)) = (&d.default_ttl, &d.max_ttl)
                    && def.duration > max.duration
                {
                    problems.push(format!("{dat}: defaultTTL is longer than maxTTL"));
                }
                if d.default_ttl.as_ref().is_some_and(|t| t.duration.is_zero()) {
                    problems.push(format!("{dat}: defaultTTL must be positive"));
                }
            }
        }
        let mut names = BTreeSet::new();
        let mut client_ids = BTreeSet::new();
        for i in &self.identities {
            let at = format!("identity {:?}", i.name);
            if i.name.trim().is_empty() || !names.insert(i.name.clone()) {
                problems.push(format!("{at}: empty or duplicate name"));
            }
            if let Some(id) = &i.id
                && !valid_id(id)
            {
                problems.push(format!("{at}: invalid id {id:?}"));
            }
            for m in &i.projects {
                let p = &m.project;
                if self.find_project(p).is_none() {
                    problems.push(format!("{at}: unknown project {p:?}"));
                }
                if let Some(paths) = &m.paths {
                    if paths.is_empty() {
                        problems.push(format!("{at}: project {p:?} has an empty paths list"));
                    }
                    for path in paths {
                        if !path.trim().starts_with('/') {
                            problems.push(format!(
                                "{at}: path {path:?} of project {p:?} does not start with '/'"
                            ));
                        }
                    }
                }
            }
            if let Some(l) = &i.ldap_auth
                && (l.username.trim().is_empty() || l.password.trim().is_empty())
            {
                problems.push(format!("{at}: empty ldapAuth username or password"));
            }
            if let Some(a) = &i.aws_auth {
                for k in &a.keys {
                    if k.access_key_id.trim().is_empty()
                        || k.secret_access_key.is_empty()
                        || k.arn.split(':').count() < 6
                    {
                        problems.push(format!(
                            "{at}: awsAuth.keys: an access key needs accessKeyId, secretAccessKey and an arn (arn:aws:…)"
                        ));
                    }
                }
            }
            let jwks = i
                .azure_auth
                .iter()
                .flat_map(|a| a.jwks.iter())
                .chain(i.gcp_auth.iter().flat_map(|g| g.jwks.iter()));
            for k in jwks {
                if crate::cloud::rsa_key(k).is_none() {
                    problems.push(format!(
                        "{at}: jwks: a key needs n and e (base64url) of an RSA key"
                    ));
                }
            }
            if let Some(ua) = &i.universal_auth {
                if ua.client_secret.is_empty() {
                    problems.push(format!("{at}: empty clientSecret"));
                }
                let client_id = ua.client_id.clone().unwrap_or_default();
                if ua.client_id.is_some() && (client_id.is_empty() || !client_ids.insert(client_id))
                {
                    problems.push(format!("{at}: empty or duplicate clientId"));
                }
            }
        }
        let mut token_ids = BTreeSet::new();
        for (n, t) in self.service_tokens.iter().enumerate() {
            let at = format!("service token #{}", n + 1);
            match t.parts() {
                Some((id, _)) => {
                    if !valid_id(id) || !token_ids.insert(id.to_owned()) {
                        problems.push(format!("{at}: invalid or duplicate id {id:?}"));
                    }
                }
                None => problems.push(format!(
                    "{at}: a token is st.<id>.<secret>.<key> (at least the first three parts)"
                )),
            }
            match self.find_project(&t.project) {
                None => problems.push(format!("{at}: unknown project {:?}", t.project)),
                Some(p) => {
                    if !p.environment_list().iter().any(|e| e.slug == t.environment) {
                        problems.push(format!("{at}: unknown environment {:?}", t.environment));
                    }
                }
            }
            if !t.path.trim().starts_with('/') {
                problems.push(format!("{at}: path {:?} does not start with '/'", t.path));
            }
            for perm in t.permission_list() {
                if perm != "read" && perm != "write" {
                    problems.push(format!("{at}: unknown permission {perm:?} (read, write)"));
                }
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Error::Seed(problems.join("; ")))
        }
    }

    /// The project of the seed with this slug or id.
    fn find_project(&self, slug_or_id: &str) -> Option<&SeedProject> {
        self.projects
            .iter()
            .find(|p| p.slug == slug_or_id || p.id.as_deref() == Some(slug_or_id))
    }
}

fn valid_slug(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

fn valid_id(s: &str) -> bool {
    (1..=128).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    const ISSUE_EXAMPLE: &str = r#"
projects:
  - slug: demo                 # id optional
    name: Demo
    environments: [dev, prod]
    secrets:                   # environment -> folder path -> key -> value
      dev:
        /:
          DB_PASSWORD: s3cret
        /backend:
          API_KEY: abc
    imports:                   # optional: environment -> folder -> list of {environment, path}
      dev:
        /: [{environment: dev, path: /backend}]
    dynamicSecrets:
      - name: db-creds
        environment: dev
        path: /
        defaultTTL: 1h
        maxTTL: 24h
identities:
  - name: operator             # id optional
    universalAuth: {clientId: op-client, clientSecret: op-secret, accessTokenTTL: 3600, accessTokenMaxTTL: 86400}
    projects: [demo]
"#;

    #[test]
    fn the_issue_example_parses() {
        let seed = Seed::from_yaml(ISSUE_EXAMPLE).expect("seed");
        let p = &seed.projects[0];
        assert_eq!(p.slug, "demo");
        assert_eq!(p.name.as_deref(), Some("Demo"));
        assert_eq!(
            p.environments
                .iter()
                .map(|e| e.slug.as_str())
                .collect::<Vec<_>>(),
            ["dev", "prod"]
        );
        assert_eq!(p.secrets["dev"]["/"]["DB_PASSWORD"].value, "s3cret");
        assert_eq!(p.secrets["dev"]["/backend"]["API_KEY"].value, "abc");
        assert_eq!(p.imports["dev"]["/"][0].path, "/backend");
        let d = &p.dynamic_secrets[0];
        assert_eq!(
            d.default_ttl.as_ref().map(|t| t.duration),
            Some(Duration::from_secs(3600))
        );
        assert_eq!(d.max_ttl.as_ref().map(|t| t.text.as_str()), Some("24h"));
        let ua = seed.identities[0].universal_auth.as_ref().expect("ua");
        assert_eq!(ua.client_id.as_deref(), Some("op-client"));
        assert_eq!(ua.access_token_ttl, 3600);
        assert_eq!(ua.access_token_max_ttl, 86400);
        assert_eq!(seed.identities[0].projects, [SeedMembership::from("demo")]);
    }

    #[test]
    fn the_example_seed_of_the_docs_loads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/examples/dev-seed.yaml");
        let seed = Seed::from_file(&path).expect("docs/examples/dev-seed.yaml");
        assert_eq!(seed.projects[0].slug, "demo");
        assert_eq!(
            seed.projects[0].secrets["dev"]["/"]["LOG_LEVEL"].value,
            "debug"
        );
    }

    #[test]
    fn scalars_objects_and_defaults() {
        let seed = Seed::from_yaml(
            r#"
projects:
  - slug: p
    secrets:
      staging:
        /a/b/:
          PORT: 8080
          RATIO: 1.5
          ON: true
          NOTE: {value: hello, comment: a comment}
    dynamicSecrets: [{name: x, environment: prod, defaultTTL: 90}]
identities:
  - name: i
    universalAuth: {clientSecret: s}
    projects: [p]
"#,
        )
        .expect("seed");
        let p = &seed.projects[0];
        assert_eq!(p.environment_list().len(), 3);
        let f = &p.secrets["staging"]["/a/b/"];
        assert_eq!(f["PORT"].value, "8080");
        assert_eq!(f["RATIO"].value, "1.5");
        assert_eq!(f["ON"].value, "true");
        assert_eq!(f["NOTE"].comment.as_deref(), Some("a comment"));
        assert_eq!(
            p.dynamic_secrets[0]
                .default_ttl
                .as_ref()
                .map(|t| t.duration),
            Some(Duration::from_secs(90))
        );
        assert_eq!(p.dynamic_secrets[0].path, "/");
        let ua = seed.identities[0].universal_auth.as_ref().expect("ua");
        assert_eq!(ua.access_token_ttl, DEFAULT_TOKEN_TTL);
        assert_eq!(ua.client_id, None);
    }

    #[test]
    fn empty_seed_is_fine() {
        assert_eq!(
            Seed::from_yaml("# nothing\n").expect("seed"),
            Seed::default()
        );
        assert_eq!(
            Seed::from_yaml("projects: []").expect("seed"),
            Seed::default()
        );
    }

    #[test]
    fn bad_seeds_are_reported() {
        for (yaml, want) in [
            ("projects: [{slug: Demo}]", "lower-case"),
            ("projects: [{slug: a}, {slug: a}]", "duplicate slug"),
            (
                "projects: [{slug: a, environments: [dev], secrets: {prod: {/: {K: v}}}}]",
                "unknown environment",
            ),
            (
                "projects: [{slug: a, dynamicSecrets: [{name: d, environment: dev, defaultTTL: 2h, maxTTL: 1h}]}]",
                "longer than maxTTL",
            ),
            (
                "projects: [{slug: a, dynamicSecrets: [{name: d, environment: dev, defaultTTL: soon}]}]",
                "invalid duration",
            ),
            (
                "identities: [{name: i, projects: [nope]}]",
                "unknown project",
            ),
            ("projects: {slug: a}", ""),
        ] {
            let err = Seed::from_yaml(yaml).expect_err(yaml).to_string();
            assert!(err.contains(want), "{yaml}: {err}");
        }
    }

    #[test]
    fn auth_methods_scopes_and_service_tokens() {
        let seed = Seed::from_yaml(
            r#"
projects: [{slug: demo, environments: [dev]}]
identities:
  - name: k8s
    kubernetesAuth:
      allowedNamespaces: [team-a, "team-*"]
      allowedNames: "app, worker"
      allowedAudience: kms
      accessTokenTTL: 600
    ldapAuth: {username: alice, password: pw}
    projects: [{slug: demo, paths: ["/backend/**"]}]
  - name: plain
    projects: [demo]
serviceTokens:
  - {token: st.demo.abc.def, project: demo, environment: dev, path: /backend}
"#,
        )
        .expect("seed");
        let k = seed.identities[0].kubernetes_auth.as_ref().expect("k8s");
        assert_eq!(k.allowed_namespaces.0, ["team-a", "team-*"]);
        assert_eq!(k.allowed_names.0, ["app", "worker"]);
        assert_eq!(k.allowed_audience.as_deref(), Some("kms"));
        assert_eq!(k.access_token_ttl, 600);
        assert_eq!(k.access_token_max_ttl, DEFAULT_TOKEN_TTL);
        let l = seed.identities[0].ldap_auth.as_ref().expect("ldap");
        assert_eq!((l.username.as_str(), l.password.as_str()), ("alice", "pw"));
        assert_eq!(
            seed.identities[0].projects,
            [SeedMembership {
                project: "demo".into(),
                paths: Some(vec!["/backend/**".into()])
            }]
        );
        assert_eq!(seed.identities[1].projects, [SeedMembership::from("demo")]);
        let t = &seed.service_tokens[0];
        assert_eq!(t.parts(), Some(("demo", "abc")));
        assert_eq!(t.permission_list(), ["read"]);
        assert_eq!(t.path, "/backend");
    }

    #[test]
    fn bad_extras_are_reported() {
        for (yaml, want) in [
            (
                "projects: [{slug: a}]\nserviceTokens: [{token: st.x, project: a, environment: dev}]",
                "st.<id>.<secret>.<key>",
            ),
            (
                "projects: [{slug: a}]\nserviceTokens: [{token: st.x.y.z, project: b, environment: dev}]",
                "unknown project",
            ),
            (
                "projects: [{slug: a}]\nserviceTokens: [{token: st.x.y.z, project: a, environment: qa}]",
                "unknown environment",
            ),
            (
                "projects: [{slug: a}]\nserviceTokens: [{token: st.x.y.z, project: a, environment: dev, permissions: [admin]}]",
                "unknown permission",
            ),
            (
                "projects: [{slug: a}]\nserviceTokens: [{token: st.x.y.z, project: a, environment: dev}, {token: st.x.q.z, project: a, environment: dev}]",
                "duplicate id",
            ),
            (
                "projects: [{slug: a}]\nidentities: [{name: i, projects: [{slug: a, paths: [backend]}]}]",
                "does not start with '/'",
            ),
            (
                "projects: [{slug: a}]\nidentities: [{name: i, ldapAuth: {username: u, password: ''}}]",
                "ldapAuth",
            ),
        ] {
            let err = Seed::from_yaml(yaml).expect_err(yaml).to_string();
            assert!(err.contains(want), "{yaml}: {err}");
        }
    }

    #[test]
    fn paths_are_normalized() {
        assert_eq!(normalize_path("/"), "/");
        assert_eq!(normalize_path(""), "/");
        assert_eq!(normalize_path(" /a//b/ "), "/a/b");
        assert_eq!(normalize_path("backend"), "/backend");
    }
}
