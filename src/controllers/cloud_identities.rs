//! Which namespaces may log in with the operator's own cloud identity.
//!
//! The cloud methods (`awsIamAuth`, `azureAuth`, `gcpIdTokenAuth`,
//! `gcpIamAuth`) prove who the *operator* is (its pod's AWS role, Azure
//! managed identity, GCP service account, or a key file under
//! `--key-file-dir`) and name a KMS machine identity that trusts it. An
//! identity ID is not a secret, so without a rule any tenant could name
//! another team's identity and receive its secrets (a confused deputy).
//!
//! The cluster admin therefore lists, in a file only they can change
//! (`--cloud-identities`, the chart's `cloudIdentities` value), which
//! namespaces may use which identity IDs and key files, by method. Nothing
//! is allowed without a rule. `kubernetesAuth` is not affected: its token
//! is a ServiceAccount's of the resource's own namespace.
//!
//! ```yaml
//! - namespaces: [team-a, "team-a-*"]   # names; `*` matches any run of characters
//!   methods: [awsIamAuth]              # default: every cloud method
//!   identityIds: ["2f7e…"]             # "*": any
//! - namespaces: [ml]
//!   methods: [gcpIamAuth]
//!   identityIds: ["*"]
//!   keyFiles: [ml-sa.json]             # gcpIamAuth: paths under --key-file-dir
//! ```

use std::path::Path;

use serde::Deserialize;

use crate::kms::cloud::CloudMethod;

/// The setting's name in messages.
pub const SETTING: &str =
    "the operator's --cloud-identities rules (the chart value cloudIdentities)";

/// One rule: these namespaces may use these identities.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Rule {
    /// Namespace names or patterns (`*` matches any run of characters).
    pub namespaces: Vec<String>,
    /// Method fields (`awsIamAuth`, `azureAuth`, `gcpIdTokenAuth`,
    /// `gcpIamAuth`); empty: every cloud method.
    #[serde(default)]
    pub methods: Vec<String>,
    /// Machine identity IDs (`*`: any).
    #[serde(default)]
    pub identity_ids: Vec<String>,
    /// Key files of `gcpIamAuth`, as the resource names them (`*`: any).
    #[serde(default)]
    pub key_files: Vec<String>,
}

/// The rules; empty allows nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CloudIdentities {
    rules: Vec<Rule>,
}

/// What a resource asks to use.
#[derive(Clone, Copy, Debug)]
pub struct Use<'a> {
    /// The resource's namespace.
    pub namespace: &'a str,
    /// The method.
    pub method: CloudMethod,
    /// The machine identity ID.
    pub identity_id: &'a str,
    /// The key file (`gcpIamAuth`).
    pub key_file: Option<&'a str>,
}

impl CloudIdentities {
    /// Rules from YAML (or JSON) text: a list of rules.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        let rules: Vec<Rule> =
            serde_saphyr::from_str(text).map_err(|e| format!("not a list of rules: {e}"))?;
        const METHODS: [&str; 4] = ["awsIamAuth", "azureAuth", "gcpIdTokenAuth", "gcpIamAuth"];
        for (i, rule) in rules.iter().enumerate() {
            if rule.namespaces.is_empty() {
                return Err(format!("rule {i}: namespaces is empty"));
            }
            if let Some(m) = rule.methods.iter().find(|m| !METHODS.contains(&m.as_str())) {
                return Err(format!(
                    "rule {i}: unknown method {m:?} (one of {})",
                    METHODS.join(", ")
                ));
            }
            if rule.identity_ids.is_empty() {
                return Err(format!(
                    "rule {i}: identityIds is empty (list the IDs, or \"*\" for any)"
                ));
            }
        }
        Ok(Self { rules })
    }

    /// Rules from a file.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("--cloud-identities {}: {e}", path.display()))?;
        Self::parse(&text)
            .map_err(|e| anyhow::anyhow!("--cloud-identities {}: {e}", path.display()))
    }

    /// How many rules there are.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// Whether there are no rules (nothing is allowed).
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Whether a rule allows this use; else a message that names the
    /// namespace, the identity, and the setting to change.
    pub fn check(&self, u: Use<'_>) -> Result<(), String> {
        let field = u.method.field();
        let allowed = self.rules.iter().any(|r| {
            r.namespaces.iter().any(|p| matches(p, u.namespace))
                && (r.methods.is_empty() || r.methods.iter().any(|m| m == field))
                && r.identity_ids
                    .iter()
                    .any(|p| p == "*" || p == u.identity_id)
                && match u.method {
                    CloudMethod::GcpIam => {
                        let file = u.key_file.unwrap_or_default();
                        r.key_files.iter().any(|p| p == "*" || p == file)
                    }
                    _ => true,
                }
        });
        if allowed {
            return Ok(());
        }
        let what = match (u.method, u.key_file) {
            (CloudMethod::GcpIam, Some(file)) => {
                format!("identity {:?} with key file {file:?}", u.identity_id)
            }
            _ => format!("identity {:?}", u.identity_id),
        };
        Err(format!(
            "authentication.{field}: {what} may not be used from namespace {}: the operator's own \
             cloud identity is usable only where the cluster admin allows it, and no rule of {SETTING} \
             allows this; ask the cluster admin to add one (nothing was sent to the KMS)",
            u.namespace
        ))
    }
}

/// Whether `name` matches `pattern` (`*` matches any run of characters).
fn matches(pattern: &str, name: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == name;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !name.starts_with(first) || name.len() < first.len() + last.len() || !name.ends_with(last) {
        return false;
    }
    let mut rest = &name[first.len()..name.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn aws<'a>(ns: &'a str, id: &'a str) -> Use<'a> {
        Use {
            namespace: ns,
            method: CloudMethod::AwsIam,
            identity_id: id,
            key_file: None,
        }
    }

    #[test]
    fn nothing_is_allowed_without_a_rule() {
        let none = CloudIdentities::parse("").unwrap();
        assert!(none.is_empty());
        let err = none.check(aws("tenant-a", "id-b")).unwrap_err();
        assert!(err.contains("authentication.awsIamAuth"), "{err}");
        assert!(
            err.contains("\"id-b\"") && err.contains("tenant-a"),
            "{err}"
        );
        assert!(err.contains("--cloud-identities"), "{err}");
    }

    #[test]
    fn a_tenant_cannot_name_another_teams_identity() {
        let rules = CloudIdentities::parse(
            "- namespaces: [team-a, \"team-a-*\"]\n  methods: [awsIamAuth]\n  identityIds: [id-a]\n\
             - namespaces: [team-b]\n  identityIds: [id-b]\n",
        )
        .unwrap();
        assert_eq!(rules.len(), 2);
        assert!(rules.check(aws("team-a", "id-a")).is_ok());
        assert!(rules.check(aws("team-a-dev", "id-a")).is_ok());
        assert!(rules.check(aws("team-a", "id-b")).is_err());
        assert!(rules.check(aws("team-b", "id-b")).is_ok());
        assert!(rules.check(aws("team-b", "id-a")).is_err());
        assert!(rules.check(aws("team-ab", "id-a")).is_err());
        // The first rule is for AWS only.
        let azure = Use {
            method: CloudMethod::Azure,
            ..aws("team-a", "id-a")
        };
        assert!(rules.check(azure).is_err());
    }

    #[test]
    fn key_files_are_allowed_by_name() {
        let rules = CloudIdentities::parse(
            "- namespaces: [ml]\n  methods: [gcpIamAuth]\n  identityIds: [\"*\"]\n  keyFiles: [ml.json]\n",
        )
        .unwrap();
        let gcp = |file| Use {
            namespace: "ml",
            method: CloudMethod::GcpIam,
            identity_id: "any",
            key_file: Some(file),
        };
        assert!(rules.check(gcp("ml.json")).is_ok());
        let err = rules.check(gcp("ops.json")).unwrap_err();
        assert!(err.contains("key file \"ops.json\""), "{err}");
    }

    #[test]
    fn bad_rules_are_refused_with_the_reason() {
        for (text, want) in [
            (
                "- namespaces: []\n  identityIds: [x]\n",
                "namespaces is empty",
            ),
            (
                "- namespaces: [a]\n  methods: [aws]\n  identityIds: [x]\n",
                "unknown method",
            ),
            ("- namespaces: [a]\n", "identityIds is empty"),
            (
                "- namespaces: [a]\n  identityIds: [x]\n  bogus: 1\n",
                "not a list",
            ),
            ("namespaces: [a]\n", "not a list"),
        ] {
            let err = CloudIdentities::parse(text).unwrap_err();
            assert!(err.contains(want), "{text}: {err}");
        }
    }

    #[test]
    fn patterns() {
        assert!(matches("*", "anything"));
        assert!(matches("team-*", "team-x"));
        assert!(matches("*-prod", "a-prod"));
        assert!(matches("a*b*c", "aXbYc"));
        assert!(!matches("a*b*c", "aXcYb"));
        assert!(!matches("team-*", "team"));
        assert!(matches("exact", "exact"));
        assert!(!matches("exact", "exactly"));
    }
}
