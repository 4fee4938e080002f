//! The custom resources of kms-operator, in `secrets.hanzo.ai/v1alpha1`.
//!
//! One module per kind, plus the building blocks they share. The CRD YAML
//! under `crds/` is generated from these types (`kms-operator crds`); every
//! field's doc comment becomes its description, and the validation rules
//! (CEL, enums, patterns, immutability) are enforced by the API server.

pub mod cluster_generator;
pub mod common;
pub mod conditions;
pub mod duration;
pub mod kinds;
// kube's `printcolumn(...)` repeats `type_ = ...` once per column, which
// clippy reads as duplicated attributes.
#[allow(clippy::duplicated_attributes)]
pub mod kms_dynamic_secret;
// kube's `printcolumn(...)` repeats `type_ = ...` once per column, which
// clippy reads as duplicated attributes.
#[allow(clippy::duplicated_attributes)]
pub mod kms_push_secret;
// kube's `printcolumn(...)` repeats `type_ = ...` once per column, which
// clippy reads as duplicated attributes.
#[allow(clippy::duplicated_attributes)]
pub mod kms_secret;
pub mod served;

pub use cluster_generator::{ClusterGenerator, ClusterGeneratorSpec};
pub use kms_dynamic_secret::{KmsDynamicSecret, KmsDynamicSecretSpec, KmsDynamicSecretStatus};
pub use kms_push_secret::{KmsPushSecret, KmsPushSecretSpec, KmsPushSecretStatus};
pub use kms_secret::{KmsSecret, KmsSecretSpec, KmsSecretStatus};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// The API group of every kind.
pub const GROUP: &str = "secrets.hanzo.ai";
/// The API version of every kind.
pub const VERSION: &str = "v1alpha1";

/// All CRDs, in a stable order.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        ClusterGenerator::crd(),
        KmsDynamicSecret::crd(),
        KmsPushSecret::crd(),
        KmsSecret::crd(),
    ]
}

/// One CRD as YAML, as written to `crds/<plural>.yaml`.
pub fn crd_yaml(crd: &CustomResourceDefinition) -> Result<String, serde_saphyr::SerializeError> {
    serde_saphyr::to_string(crd)
}

/// The file name of a CRD under `crds/`: `<plural>.yaml`.
pub fn crd_file_name(crd: &CustomResourceDefinition) -> String {
    format!("{}.yaml", crd.spec.names.plural)
}

/// All CRDs as one multi-document YAML stream.
pub fn crds_yaml() -> Result<String, serde_saphyr::SerializeError> {
    let mut out = String::new();
    for crd in crds() {
        out.push_str("---\n");
        out.push_str(&crd_yaml(&crd)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn crd_dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("crds")
    }

    /// The property names of `T`'s JSON schema.
    fn properties<T: schemars::JsonSchema>() -> std::collections::BTreeSet<String> {
        let schema = schemars::schema_for!(T);
        schema
            .as_object()
            .and_then(|o| o.get("properties"))
            .and_then(|p| p.as_object())
            .map(|p| p.keys().cloned().collect())
            .unwrap_or_default()
    }

    #[test]
    fn the_method_lists_of_the_cel_rules_are_the_authentication_fields() {
        use std::collections::BTreeSet;
        let generic: BTreeSet<String> = common::GENERIC_AUTH_METHODS
            .iter()
            .map(|m| (*m).to_owned())
            .collect();
        assert_eq!(properties::<common::GenericAuthentication>(), generic);
        let kms_secret: BTreeSet<String> = common::GENERIC_AUTH_METHODS
            .iter()
            .chain(&common::KMS_SECRET_ONLY_METHODS)
            .map(|m| (*m).to_owned())
            .collect();
        assert_eq!(
            properties::<kms_secret::KmsSecretAuthentication>(),
            kms_secret
        );
        assert_eq!(
            common::one_method_message(&["aAuth", "bAuth"], ", or c"),
            "exactly one authentication method must be set: one of authentication.aAuth, bAuth, or c"
        );
    }

    #[test]
    fn committed_crds_are_fresh() {
        let mut expected: Vec<String> = Vec::new();
        for crd in crds() {
            let name = crd_file_name(&crd);
            let path = crd_dir().join(&name);
            let committed = std::fs::read_to_string(&path).unwrap_or_else(|e| {
                panic!(
                    "{} is missing ({e}); run scripts/generate.sh",
                    path.display()
                )
            });
            assert!(
                committed == crd_yaml(&crd).unwrap(),
                "crds/{name} is stale; run scripts/generate.sh and commit the result"
            );
            expected.push(name);
        }
        let mut present: Vec<String> = std::fs::read_dir(crd_dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        present.sort();
        expected.sort();
        assert_eq!(
            present, expected,
            "crds/ must hold exactly one <plural>.yaml per CRD"
        );
    }

    /// Look a dotted path up in an OpenAPI schema; `[]` steps into list items
    /// and `{}` into map values.
    fn schema_has(schema: &serde_json::Value, path: &str) -> bool {
        let mut node = schema;
        for part in path.split('.') {
            let (name, suffix) = match part.find(['[', '{']) {
                Some(i) => (&part[..i], &part[i..]),
                None => (part, ""),
            };
            match node.get("properties").and_then(|p| p.get(name)) {
                Some(next) => node = next,
                None => return false,
            }
            match suffix {
                "[]" => match node.get("items") {
                    Some(items) => node = items,
                    None => return false,
                },
                "{}" => match node.get("additionalProperties") {
                    Some(values) => node = values,
                    None => return false,
                },
                _ => {}
            }
        }
        true
    }

    const SCOPE: &[&str] = &[
        "secretsPath",
        "envSlug",
        "projectSlug",
        "projectId",
        "secretName",
        "recursive",
    ];
    const TEMPLATE: &[&str] = &[
        "template.includeAllSecrets",
        "template.data",
        "template.metadata.labels",
        "template.metadata.annotations",
    ];
    const TLS: &[&str] = &[
        "spec.tls.caRef.secretName",
        "spec.tls.caRef.secretNamespace",
        "spec.tls.caRef.key",
    ];

    fn generic_auth(prefix: &str) -> Vec<String> {
        [
            "universalAuth.credentialsRef.secretName",
            "universalAuth.credentialsRef.secretNamespace",
            "kubernetesAuth.identityId",
            "kubernetesAuth.serviceAccountRef.name",
            "kubernetesAuth.serviceAccountRef.namespace",
            "kubernetesAuth.autoCreateServiceAccountToken",
            "kubernetesAuth.serviceAccountTokenAudiences[]",
            "awsIamAuth.identityId",
            "azureAuth.identityId",
            "azureAuth.resource",
            "gcpIdTokenAuth.identityId",
            "gcpIamAuth.identityId",
            "gcpIamAuth.serviceAccountKeyFilePath",
            "ldapAuth.identityId",
            "ldapAuth.credentialsRef.secretName",
            "ldapAuth.credentialsRef.secretNamespace",
        ]
        .iter()
        .map(|f| format!("{prefix}.{f}"))
        .collect()
    }

    fn managed_secret(prefix: &str) -> Vec<String> {
        let mut v: Vec<String> = [
            "secretName",
            "secretNamespace",
            "secretType",
            "creationPolicy",
        ]
        .iter()
        .map(|f| format!("{prefix}.{f}"))
        .collect();
        v.extend(TEMPLATE.iter().map(|f| format!("{prefix}.{f}")));
        v
    }

    /// Every field of the Go operators' v1alpha1 CRDs, plus our status
    /// additions.
    fn expected_fields(plural: &str) -> Vec<String> {
        let mut f: Vec<String> = Vec::new();
        let own = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        match plural {
            "kmssecrets" => {
                f.extend(own(&[
                    "spec.hostAPI",
                    "spec.resyncInterval",
                    "spec.instantUpdates",
                ]));
                f.extend(own(TLS));
                f.extend(own(&[
                    "spec.syncConfig.resyncInterval",
                    "spec.syncConfig.instantUpdates",
                    "spec.tokenSecretReference.secretName",
                    "spec.tokenSecretReference.secretNamespace",
                ]));
                let auth = "spec.authentication";
                f.extend(generic_auth(auth));
                f.push(format!("{auth}.azureAuth.azureManagedIdentityClientId"));
                for method in common::GENERIC_AUTH_METHODS {
                    f.extend(
                        SCOPE
                            .iter()
                            .map(|s| format!("{auth}.{method}.secretsScope.{s}")),
                    );
                }
                f.extend(own(&[
                    "spec.authentication.serviceToken.serviceTokenSecretReference.secretName",
                    "spec.authentication.serviceToken.serviceTokenSecretReference.secretNamespace",
                    "spec.authentication.serviceToken.secretsScope.secretsPath",
                    "spec.authentication.serviceToken.secretsScope.envSlug",
                    "spec.authentication.serviceToken.secretsScope.recursive",
                    "spec.authentication.serviceAccount.serviceAccountSecretReference.secretName",
                    "spec.authentication.serviceAccount.serviceAccountSecretReference.secretNamespace",
                    "spec.authentication.serviceAccount.projectId",
                    "spec.authentication.serviceAccount.environmentName",
                ]));
                f.extend(managed_secret("spec.managedSecretReference"));
                f.extend(managed_secret("spec.managedKubeSecretReferences[]"));
                let cm = "spec.managedKubeConfigMapReferences[]";
                f.extend(
                    ["configMapName", "configMapNamespace", "creationPolicy"]
                        .iter()
                        .map(|s| format!("{cm}.{s}")),
                );
                f.extend(TEMPLATE.iter().map(|s| format!("{cm}.{s}")));
            }
            "kmspushsecrets" => {
                f.extend(own(&[
                    "spec.hostAPI",
                    "spec.resyncInterval",
                    "spec.updatePolicy",
                    "spec.deletionPolicy",
                    "spec.destination.secretsPath",
                    "spec.destination.environmentSlug",
                    "spec.destination.projectId",
                    "spec.destination.projectSlug",
                    "spec.push.secret.secretName",
                    "spec.push.secret.secretNamespace",
                    "spec.push.generators[].destinationSecretName",
                    "spec.push.generators[].generatorRef.kind",
                    "spec.push.generators[].generatorRef.name",
                    "status.managedSecrets{}",
                ]));
                f.extend(own(TLS));
                f.extend(generic_auth("spec.authentication"));
                f.extend(TEMPLATE.iter().map(|s| format!("spec.push.secret.{s}")));
            }
            "kmsdynamicsecrets" => {
                f.extend(own(&[
                    "spec.hostAPI",
                    "spec.dynamicSecret.secretName",
                    "spec.dynamicSecret.secretsPath",
                    "spec.dynamicSecret.environmentSlug",
                    "spec.dynamicSecret.projectId",
                    "spec.dynamicSecret.projectSlug",
                    "spec.leaseTTL",
                    "spec.leaseRevocationPolicy",
                    "status.lease.id",
                    "status.lease.version",
                    "status.lease.creationTimestamp",
                    "status.lease.expiresAt",
                    "status.dynamicSecretId",
                    "status.maxTTL",
                ]));
                f.extend(own(TLS));
                f.extend(generic_auth("spec.authentication"));
                f.extend(managed_secret("spec.managedSecretReference"));
            }
            "clustergenerators" => {
                return own(&[
                    "spec.kind",
                    "spec.generator.passwordSpec.length",
                    "spec.generator.passwordSpec.digits",
                    "spec.generator.passwordSpec.symbols",
                    "spec.generator.passwordSpec.symbolCharacters",
                    "spec.generator.passwordSpec.noUpper",
                    "spec.generator.passwordSpec.allowRepeat",
                    "spec.generator.uuidSpec",
                ]);
            }
            other => panic!("unexpected CRD {other}"),
        }
        f.extend(own(&[
            "status.conditions[].type",
            "status.conditions[].status",
            "status.conditions[].reason",
            "status.conditions[].message",
            "status.conditions[].lastTransitionTime",
            "status.conditions[].observedGeneration",
            "status.observedGeneration",
            "status.lastSyncTime",
            "status.syncedKeys",
            "status.shard",
        ]));
        f
    }

    #[test]
    fn every_reference_field_is_in_the_committed_crds() {
        let mut checked = 0;
        for crd in crds() {
            let plural = crd.spec.names.plural.clone();
            let text = std::fs::read_to_string(crd_dir().join(crd_file_name(&crd))).unwrap();
            let doc: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
            let schema = &doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
            let missing: Vec<String> = expected_fields(&plural)
                .into_iter()
                .inspect(|_| checked += 1)
                .filter(|p| !schema_has(schema, p))
                .collect();
            assert!(missing.is_empty(), "{plural}: missing fields {missing:#?}");
        }
        assert!(checked > 200, "only {checked} fields checked");
    }

    #[test]
    fn every_field_has_a_description() {
        fn walk(node: &serde_json::Value, path: &str, out: &mut Vec<String>) {
            if let Some(props) = node.get("properties").and_then(|p| p.as_object()) {
                for (name, child) in props {
                    let p = format!("{path}.{name}");
                    // metadata and apiVersion/kind are Kubernetes' own.
                    let standard = matches!(name.as_str(), "apiVersion" | "kind" | "metadata")
                        || path.contains("conditions");
                    if !standard && child.get("description").is_none() {
                        out.push(p.clone());
                    }
                    walk(child, &p, out);
                }
            }
            if let Some(items) = node.get("items") {
                walk(items, &format!("{path}[]"), out);
            }
        }
        for crd in crds() {
            let value = serde_json::to_value(&crd).unwrap();
            let mut missing = Vec::new();
            walk(
                &value["spec"]["versions"][0]["schema"]["openAPIV3Schema"],
                "",
                &mut missing,
            );
            assert!(
                missing.is_empty(),
                "{}: fields without a description: {missing:#?}",
                crd.spec.names.plural
            );
        }
    }

    #[test]
    fn names_and_columns_follow_the_spec() {
        for crd in crds() {
            assert_eq!(crd.spec.group, GROUP);
            let version = &crd.spec.versions[0];
            assert_eq!(version.name, VERSION);
            let kind = crd.spec.names.kind.as_str();
            if kind == "ClusterGenerator" {
                assert_eq!(crd.spec.scope, "Cluster");
                continue;
            }
            assert_eq!(crd.spec.scope, "Namespaced");
            let short = crd.spec.names.short_names.clone().unwrap_or_default();
            let want = match kind {
                "KmsSecret" => "kmss",
                "KmsPushSecret" => "kmsps",
                "KmsDynamicSecret" => "kmsds",
                other => panic!("unexpected kind {other}"),
            };
            assert_eq!(short, vec![want.to_owned()]);
            let columns: Vec<String> = version
                .additional_printer_columns
                .iter()
                .flatten()
                .map(|c| c.name.clone())
                .collect();
            let third = if kind == "KmsDynamicSecret" {
                "Lease Expires"
            } else {
                "Last Sync"
            };
            assert_eq!(columns, vec!["Ready", "Reason", third, "Age"]);
            assert!(
                version
                    .subresources
                    .as_ref()
                    .and_then(|s| s.status.as_ref())
                    .is_some()
            );
        }
    }
}
