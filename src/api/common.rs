//! Building blocks shared by the custom resources: references to Secrets and
//! ServiceAccounts, TLS settings, managed-target descriptions, templates and the
//! authentication methods.
//!
//! Every string that a CEL rule touches carries a `maxLength`, and every list a
//! `maxItems`, so the API server can bound the cost of the rules.

use std::collections::BTreeMap;

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Pattern for interval strings: empty (use the default), a bare number of
/// seconds (`60`), or one or more `<number><unit>` parts with units `s`, `m`,
/// `h`, `d`, `w` (`30s`, `5m`, `1h30m`, `1w`).
pub const DURATION_PATTERN: &str = r"^([0-9]+|([0-9]+[smhdw])+)?$";

/// Annotation that releases a KmsPushSecret or KmsDynamicSecret being
/// deleted without its KMS cleanup (`"true"`).
pub const SKIP_CLEANUP_ANNOTATION: &str = "secrets.hanzo.ai/skip-cleanup";

/// A Kubernetes Secret named by name and namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubeSecretReference {
    /// Name of the Secret.
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,
    /// Namespace of the Secret. Defaults to the namespace of the resource that
    /// refers to it. Another namespace is allowed only when the operator runs
    /// with `--allow-cross-namespace-refs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub secret_namespace: Option<String>,
}

/// A data key inside a Kubernetes Secret that holds a PEM CA bundle.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CaReference {
    /// Name of the Secret that holds the CA bundle.
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,
    /// Namespace of that Secret. Defaults to the namespace of the resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub secret_namespace: Option<String>,
    /// Data key of the PEM bundle inside the Secret, for example `ca.crt`.
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// TLS settings for the connection to the KMS.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct TlsConfig {
    /// A CA bundle trusted in addition to the system roots, for a KMS with a
    /// private certificate authority.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_ref: Option<CaReference>,
}

/// A Kubernetes ServiceAccount named by name and namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubernetesServiceAccountRef {
    /// Name of the ServiceAccount.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Namespace of the ServiceAccount. Defaults to the namespace of the
    /// resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub namespace: Option<String>,
}

/// Whether a managed object is owned by (and garbage-collected with) the
/// resource that writes it.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema, Default)]
pub enum CreationPolicy {
    /// The object outlives the resource.
    #[default]
    Orphan,
    /// The object carries a controller owner reference to the resource and is
    /// deleted with it; it must be in the resource's namespace.
    Owner,
}

/// Labels and annotations to put on a managed object.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct TemplateMetadata {
    /// Labels of the managed object. When `metadata` is set, these replace the
    /// labels copied from the resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("maxProperties" = 256))]
    pub labels: Option<BTreeMap<String, String>>,
    /// Annotations of the managed object. When `metadata` is set, these replace
    /// the annotations copied from the resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("maxProperties" = 256))]
    pub annotations: Option<BTreeMap<String, String>>,
}

/// How the data of a managed object is built from the fetched secrets.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct SecretTemplate {
    /// Write every fetched secret as a key, with `data` entries overriding keys
    /// of the same name. When false, only the keys of `data` are written.
    #[serde(default)]
    pub include_all_secrets: bool,
    /// Output key to template source. Each entry is rendered on its own with
    /// minijinja; every secret is available as `KEY.Value` and
    /// `KEY.SecretPath`, and as `secrets["KEY"]` for keys that are not
    /// identifiers. See `docs/templating.md`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("maxProperties" = 1024))]
    pub data: Option<BTreeMap<String, String>>,
    /// Labels and annotations of the managed object. When set, they replace the
    /// labels and annotations copied from the resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateMetadata>,
}

fn default_secret_type() -> String {
    "Opaque".to_owned()
}

/// A Kubernetes Secret that the operator writes.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ManagedKubeSecretConfig {
    /// Name of the Secret to write.
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,
    /// Namespace of the Secret. Defaults to the namespace of the resource.
    /// Another namespace is allowed only when the operator runs with
    /// `--allow-cross-namespace-refs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub secret_namespace: Option<String>,
    /// Type of the Secret, used when the operator creates it (an existing
    /// Secret's type is never changed).
    #[serde(default = "default_secret_type")]
    #[schemars(length(max = 253))]
    pub secret_type: String,
    /// `Owner` makes the resource the Secret's controller owner (same
    /// namespace only), so the Secret is deleted with it; `Orphan` leaves it.
    #[serde(default)]
    pub creation_policy: CreationPolicy,
    /// How the Secret's data is built; without a template every fetched
    /// secret is written as a key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<SecretTemplate>,
}

/// A Kubernetes ConfigMap that the operator writes.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ManagedKubeConfigMapConfig {
    /// Name of the ConfigMap to write.
    #[schemars(length(min = 1, max = 253))]
    pub config_map_name: String,
    /// Namespace of the ConfigMap. Defaults to the namespace of the resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub config_map_namespace: Option<String>,
    /// `Owner` makes the resource the ConfigMap's controller owner (same
    /// namespace only); `Orphan` leaves it.
    #[serde(default)]
    pub creation_policy: CreationPolicy,
    /// How the ConfigMap's data is built; without a template every fetched
    /// secret is written as a key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<SecretTemplate>,
}

/// Where to read secrets from, for machine-identity authentication.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("(has(self.projectSlug) && size(self.projectSlug) > 0) != (has(self.projectId) && size(self.projectId) > 0)")
        .message("secretsScope: exactly one of projectSlug and projectId must be set"),
    validation = Rule::new("!(has(self.secretName) && size(self.secretName) > 0 && has(self.recursive) && self.recursive)")
        .message("secretsScope: secretName cannot be combined with recursive: true"),
)]
pub struct MachineIdentityScope {
    /// Folder path in the KMS; `/` is the root.
    #[schemars(length(min = 1, max = 1024))]
    pub secrets_path: String,
    /// Environment slug, for example `dev` or `prod`.
    #[schemars(length(min = 1, max = 256))]
    pub env_slug: String,
    /// Slug of the project. Exactly one of `projectSlug` and `projectId`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub project_slug: Option<String>,
    /// ID of the project. Exactly one of `projectSlug` and `projectId`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub project_id: Option<String>,
    /// Fetch only this one secret instead of the whole folder. Not allowed with
    /// `recursive: true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub secret_name: Option<String>,
    /// Include the secrets of sub-folders.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recursive: Option<bool>,
}

/// Where to read secrets from, for a service token (the project comes from the
/// token).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceTokenScope {
    /// Folder path in the KMS; `/` is the root.
    #[schemars(length(min = 1, max = 1024))]
    pub secrets_path: String,
    /// Environment slug.
    #[schemars(length(min = 1, max = 256))]
    pub env_slug: String,
    /// Include the secrets of sub-folders.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recursive: Option<bool>,
}

/// Universal auth: a client ID and secret from a Kubernetes Secret.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UniversalAuth {
    /// Secret with the keys `clientId` and `clientSecret`.
    pub credentials_ref: KubeSecretReference,
}

/// Kubernetes auth: a ServiceAccount token checked by the KMS with a
/// TokenReview.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubernetesAuth {
    /// ID of the KMS machine identity to log in as.
    #[schemars(length(min = 1, max = 256))]
    pub identity_id: String,
    /// The ServiceAccount whose token is sent.
    pub service_account_ref: KubernetesServiceAccountRef,
    /// Request a short-lived token with the TokenRequest API instead of reading
    /// the ServiceAccount's legacy token Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_create_service_account_token: Option<bool>,
    /// Audiences of the requested token (with `autoCreateServiceAccountToken`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16), inner(length(max = 1024)))]
    pub service_account_token_audiences: Option<Vec<String>>,
}

/// AWS IAM auth: a signed STS `GetCallerIdentity` request made with the
/// operator pod's ambient AWS credentials.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AwsIamAuth {
    /// ID of the KMS machine identity to log in as.
    #[schemars(length(min = 1, max = 256))]
    pub identity_id: String,
}

/// Azure auth: a managed-identity token from the instance metadata service.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AzureAuth {
    /// ID of the KMS machine identity to log in as.
    #[schemars(length(min = 1, max = 256))]
    pub identity_id: String,
    /// Resource the token is requested for; defaults to
    /// `https://management.azure.com/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub resource: Option<String>,
    /// Client ID of a user-assigned managed identity, when the pod has several.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub azure_managed_identity_client_id: Option<String>,
}

/// GCP ID-token auth: an identity token from the GCP metadata server.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GcpIdTokenAuth {
    /// ID of the KMS machine identity to log in as.
    #[schemars(length(min = 1, max = 256))]
    pub identity_id: String,
}

/// GCP IAM auth: a JWT signed with a service-account key file on the operator
/// pod.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GcpIamAuth {
    /// ID of the KMS machine identity to log in as.
    #[schemars(length(min = 1, max = 256))]
    pub identity_id: String,
    /// Path of the service-account key file on the operator pod; it must lie
    /// under the operator's `--key-file-dir`.
    #[schemars(length(min = 1, max = 4096))]
    pub service_account_key_file_path: String,
}

/// LDAP auth: a username and password from a Kubernetes Secret.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LdapAuth {
    /// ID of the KMS machine identity to log in as.
    #[schemars(length(min = 1, max = 256))]
    pub identity_id: String,
    /// Secret with the keys `username` and `password`.
    pub credentials_ref: KubeSecretReference,
}

/// Authentication of a push or dynamic secret: exactly one method.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct GenericAuthentication {
    /// Universal auth (client ID and secret).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub universal_auth: Option<UniversalAuth>,
    /// Kubernetes auth (ServiceAccount token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_auth: Option<KubernetesAuth>,
    /// AWS IAM auth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aws_iam_auth: Option<AwsIamAuth>,
    /// Azure managed-identity auth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub azure_auth: Option<AzureAuth>,
    /// GCP ID-token auth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gcp_id_token_auth: Option<GcpIdTokenAuth>,
    /// GCP IAM auth (service-account key file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gcp_iam_auth: Option<GcpIamAuth>,
    /// LDAP auth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ldap_auth: Option<LdapAuth>,
}

/// An authentication method, as the spec names it: the one list every
/// other list of methods (the CEL rules and their messages, the migration
/// from the Go operators, the messages that name a resource's method) is
/// derived from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MethodName {
    /// `universalAuth`.
    Universal,
    /// `kubernetesAuth`.
    Kubernetes,
    /// `awsIamAuth`.
    AwsIam,
    /// `azureAuth`.
    Azure,
    /// `gcpIdTokenAuth`.
    GcpIdToken,
    /// `gcpIamAuth`.
    GcpIam,
    /// `ldapAuth`.
    Ldap,
    /// `serviceToken` (a KmsSecret's only).
    ServiceToken,
    /// `serviceAccount` (a KmsSecret's only).
    ServiceAccount,
}

impl MethodName {
    /// The methods of a `GenericAuthentication` (KmsPushSecret,
    /// KmsDynamicSecret) in the order they are preferred when several are
    /// set. A KmsSecret adds [`MethodName::KMS_SECRET_ONLY`].
    pub const GENERIC: [MethodName; 7] = [
        Self::Universal,
        Self::Kubernetes,
        Self::AwsIam,
        Self::Azure,
        Self::GcpIdToken,
        Self::GcpIam,
        Self::Ldap,
    ];

    /// The methods only a KmsSecret's `authentication` has.
    pub const KMS_SECRET_ONLY: [MethodName; 2] = [Self::ServiceToken, Self::ServiceAccount];

    /// The spec field that sets the method.
    pub const fn field(self) -> &'static str {
        match self {
            Self::Universal => "universalAuth",
            Self::Kubernetes => "kubernetesAuth",
            Self::AwsIam => "awsIamAuth",
            Self::Azure => "azureAuth",
            Self::GcpIdToken => "gcpIdTokenAuth",
            Self::GcpIam => "gcpIamAuth",
            Self::Ldap => "ldapAuth",
            Self::ServiceToken => "serviceToken",
            Self::ServiceAccount => "serviceAccount",
        }
    }

    /// The method set by the spec field `field`.
    pub fn of_field(field: &str) -> Option<MethodName> {
        Self::GENERIC
            .into_iter()
            .chain(Self::KMS_SECRET_ONLY)
            .find(|m| m.field() == field)
    }

    /// Whether the method logs in with the operator pod's own cloud
    /// identity (so an admin rule must allow it per namespace).
    pub const fn is_cloud(self) -> bool {
        matches!(
            self,
            Self::AwsIam | Self::Azure | Self::GcpIdToken | Self::GcpIam
        )
    }
}

/// The fields of `methods`, as a constant.
const fn fields<const N: usize>(methods: [MethodName; N]) -> [&'static str; N] {
    let mut out = [""; N];
    let mut i = 0;
    while i < N {
        out[i] = methods[i].field();
        i += 1;
    }
    out
}

/// The fields of [`MethodName::GENERIC`], for the CEL rules.
pub(crate) const GENERIC_AUTH_METHODS: [&str; 7] = fields(MethodName::GENERIC);

/// The fields of [`MethodName::KMS_SECRET_ONLY`].
pub(crate) const KMS_SECRET_ONLY_METHODS: [&str; 2] = fields(MethodName::KMS_SECRET_ONLY);

/// One machine-identity method's settings, borrowed from an
/// `authentication` block: the typed view the controllers match on.
#[derive(Clone, Copy, Debug)]
pub enum Method<'a> {
    /// Universal auth.
    Universal(&'a UniversalAuth),
    /// Kubernetes auth.
    Kubernetes(&'a KubernetesAuth),
    /// AWS IAM auth.
    AwsIam(&'a AwsIamAuth),
    /// Azure managed-identity auth.
    Azure(&'a AzureAuth),
    /// GCP ID-token auth.
    GcpIdToken(&'a GcpIdTokenAuth),
    /// GCP IAM auth.
    GcpIam(&'a GcpIamAuth),
    /// LDAP auth.
    Ldap(&'a LdapAuth),
}

impl Method<'_> {
    /// The method's name.
    pub fn name(&self) -> MethodName {
        match self {
            Method::Universal(_) => MethodName::Universal,
            Method::Kubernetes(_) => MethodName::Kubernetes,
            Method::AwsIam(_) => MethodName::AwsIam,
            Method::Azure(_) => MethodName::Azure,
            Method::GcpIdToken(_) => MethodName::GcpIdToken,
            Method::GcpIam(_) => MethodName::GcpIam,
            Method::Ldap(_) => MethodName::Ldap,
        }
    }
}

impl GenericAuthentication {
    /// The method set (the schema allows exactly one; the first in
    /// [`MethodName::GENERIC`]'s order if several are).
    pub fn method(&self) -> Option<Method<'_>> {
        MethodName::GENERIC.into_iter().find_map(|name| {
            Some(match name {
                MethodName::Universal => Method::Universal(self.universal_auth.as_ref()?),
                MethodName::Kubernetes => Method::Kubernetes(self.kubernetes_auth.as_ref()?),
                MethodName::AwsIam => Method::AwsIam(self.aws_iam_auth.as_ref()?),
                MethodName::Azure => Method::Azure(self.azure_auth.as_ref()?),
                MethodName::GcpIdToken => Method::GcpIdToken(self.gcp_id_token_auth.as_ref()?),
                MethodName::GcpIam => Method::GcpIam(self.gcp_iam_auth.as_ref()?),
                MethodName::Ldap => Method::Ldap(self.ldap_auth.as_ref()?),
                MethodName::ServiceToken | MethodName::ServiceAccount => return None,
            })
        })
    }
}

/// CEL expression counting the `methods` set at `self.authentication`.
pub(crate) fn auth_count(methods: &[&str]) -> String {
    let terms: Vec<String> = methods
        .iter()
        .map(|m| format!("(has(self.authentication.{m}) ? 1 : 0)"))
        .collect();
    format!("(has(self.authentication) ? {} : 0)", terms.join(" + "))
}

/// The message of the rule that exactly one of `methods` is set (`tail`
/// names what else counts, e.g. a legacy field).
pub(crate) fn one_method_message(methods: &[&str], tail: &str) -> String {
    let (first, rest) = methods.split_first().expect("at least one method");
    let mut names = vec![format!("authentication.{first}")];
    names.extend(rest.iter().map(|m| (*m).to_owned()));
    format!(
        "exactly one authentication method must be set: one of {}{tail}",
        names.join(", ")
    )
}

/// A KMS project named by slug or ID, exactly one of them.
pub(crate) const PROJECT_ONE_OF: &str = "(has(self.projectSlug) && size(self.projectSlug) > 0) != (has(self.projectId) && size(self.projectId) > 0)";

/// A condition with the status `True`, `False` or `Unknown`.
pub type Condition = k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// A point in time, serialised as RFC 3339.
pub type Time = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
