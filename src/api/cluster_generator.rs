//! `ClusterGenerator`: a cluster-wide recipe for generated values (passwords,
//! UUIDs) that push secrets can reference.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::kms_push_secret::GeneratorKind;

/// A recipe for generated values (passwords, UUIDs) used by `KmsPushSecret`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[kube(
    group = "secrets.hanzo.ai",
    version = "v1alpha1",
    kind = "ClusterGenerator",
    plural = "clustergenerators",
    singular = "clustergenerator",
    category = "kms",
    doc = "A cluster-wide recipe for generated values (passwords, UUIDs) used by KmsPushSecret.",
    printcolumn(name = "Kind", type_ = "string", json_path = ".spec.kind"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterGeneratorSpec {
    /// Kind of value produced.
    pub kind: GeneratorKind,
    /// Settings of the generator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generator: Option<GeneratorSettings>,
}

/// Settings of a generator, by kind.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct GeneratorSettings {
    /// Settings of a password generator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_spec: Option<PasswordSpec>,
    /// Settings of a UUID generator (none so far).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid_spec: Option<UuidSpec>,
}

fn default_length() -> i32 {
    24
}

/// How a password is generated.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PasswordSpec {
    /// Total length.
    #[serde(default = "default_length")]
    #[schemars(range(min = 1, max = 1024))]
    pub length: i32,
    /// Number of digits; defaults to a quarter of the length.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1024))]
    pub digits: Option<i32>,
    /// Number of symbols; defaults to a quarter of the length.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1024))]
    pub symbols: Option<i32>,
    /// The symbols to choose from; defaults to
    /// ``~!@#$%^&*()_+`-={}|[]\:"<>?,./``.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub symbol_characters: Option<String>,
    /// Use no upper-case letters.
    #[serde(default)]
    pub no_upper: bool,
    /// Allow a character to appear more than once.
    #[serde(default)]
    pub allow_repeat: bool,
}

/// Settings of a UUID generator (none so far).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
pub struct UuidSpec {}
