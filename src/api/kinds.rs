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
