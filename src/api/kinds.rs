//! The table of our custom resources: one line per kind. API discovery
//! (`ServedKinds`), the metrics' series shown at zero,
//! `kms-operator status` and `check`, and the CLI's resource names read
//! it, so a new kind is one line here (plus its type, its controller and
//! its wiring).

/// One of our custom resources.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KindInfo {
    /// The kind as our types spell it.
    pub kind: &'static str,
    /// The resource (plural) the API serves it as.
    pub plural: &'static str,
    /// Its controller's name, as a metric label value.
    pub controller: &'static str,
}

/// Our custom resources other than `ClusterGenerator` (which no controller
/// reconciles).
pub const KINDS: [KindInfo; 3] = [
    KindInfo {
        kind: "KmsSecret",
        plural: "kmssecrets",
        controller: "kmssecret",
    },
    KindInfo {
        kind: "KmsPushSecret",
        plural: "kmspushsecrets",
        controller: "kmspushsecret",
    },
    KindInfo {
        kind: "KmsDynamicSecret",
        plural: "kmsdynamicsecrets",
        controller: "kmsdynamicsecret",
    },
];

/// The line of `kind` (our spelling).
pub fn info(kind: &str) -> Option<&'static KindInfo> {
    KINDS.iter().find(|k| k.kind == kind)
}

/// One of our resources whose status records the force-sync value handled
/// (`secrets.hanzo.ai/force-sync`) and its conditions.
pub trait Forceable: kube::Resource {
    /// `status.forceSync`.
    fn handled(&self) -> Option<&str>;
    /// `status.conditions`.
    fn conditions(&self) -> &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition];
}

/// One of our resources, which may name its own KMS (`spec.hostAPI`) and CA
/// (`spec.tls.caRef`) or follow the global configuration, field by field.
pub trait HostApi {
    /// Its own `hostAPI`, if set.
    fn host_api(&self) -> Option<&str>;
    /// Its own `tls.caRef` secret name, if set.
    fn ca_secret(&self) -> Option<&str>;
    /// Whether any field of its endpoint falls back to the global
    /// configuration.
    fn uses_global_config(&self) -> bool {
        self.host_api().is_none_or(|h| h.trim().is_empty())
            || self.ca_secret().is_none_or(|n| n.trim().is_empty())
    }
}

/// Gives one of our API types the views every resource has ([`Forceable`],
/// [`HostApi`]); each type's file names itself once.
macro_rules! our_resource {
    ($kind:ty) => {
        impl $crate::api::kinds::Forceable for $kind {
            fn handled(&self) -> Option<&str> {
                self.status.as_ref()?.force_sync.as_deref()
            }
            fn conditions(&self) -> &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition] {
                self.status.as_ref().map_or(&[], |s| &s.conditions)
            }
        }

        impl $crate::api::kinds::HostApi for $kind {
            fn host_api(&self) -> Option<&str> {
                self.spec.host_api.as_deref()
            }
            fn ca_secret(&self) -> Option<&str> {
                self.spec
                    .tls
                    .as_ref()
                    .and_then(|t| t.ca_ref.as_ref())
                    .map(|r| r.secret_name.as_str())
            }
        }
    };
}
pub(crate) use our_resource;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{KmsDynamicSecret, KmsPushSecret, KmsSecret};
    use kube::Resource;

    #[test]
    fn the_table_matches_the_types() {
        let types = [
            (KmsSecret::kind(&()), KmsSecret::plural(&())),
            (KmsPushSecret::kind(&()), KmsPushSecret::plural(&())),
            (KmsDynamicSecret::kind(&()), KmsDynamicSecret::plural(&())),
        ];
        assert_eq!(types.len(), KINDS.len());
        for ((kind, plural), info) in types.iter().zip(KINDS) {
            assert_eq!((kind.as_ref(), plural.as_ref()), (info.kind, info.plural));
            assert_eq!(info.controller, info.kind.to_ascii_lowercase());
        }
        assert_eq!(super::info("KmsPushSecret"), Some(&KINDS[1]));
        assert_eq!(super::info("Secret"), None);
    }
}
