//! Wire types of the KMS HTTP API (Infisical shapes) and the merged view of a
//! fetched scope. Secret values are held in [`SecretString`], whose `Debug`
//! redacts them.

use std::collections::BTreeMap;

use secrecy::SecretString;
use serde::Deserialize;

thread_local! {
    /// Secrets the list being parsed on this thread may still hold (see
    /// [`with_secret_cap`]); `usize::MAX` when no cap is set.
    static SECRETS_LEFT: std::cell::Cell<usize> = const { std::cell::Cell::new(usize::MAX) };
}

/// Parse with at most `cap` secrets in the lists of the answer (the
/// scope's and every import block's together); the result, and whether
/// the cap stopped the parse (then the result is an error). A hostile or
/// misconfigured KMS answering with hundreds of thousands of tiny secrets
/// is refused before they are all built.
pub fn with_secret_cap<T>(cap: usize, parse: impl FnOnce() -> T) -> (T, bool) {
    let before = SECRETS_LEFT.with(|left| left.replace(cap.saturating_add(1)));
    let result = parse();
    let exceeded = SECRETS_LEFT.with(|left| left.replace(before)) == 0;
    (result, exceeded)
}

/// A list of secrets, counted against the cap of [`with_secret_cap`] as
/// it is read.
fn counted<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<RawSecret>, D::Error> {
    struct Items;
    impl<'de> serde::de::Visitor<'de> for Items {
        type Value = Vec<RawSecret>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a list of secrets")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(item) = seq.next_element()? {
                let left = SECRETS_LEFT.with(|l| match l.get() {
                    usize::MAX => usize::MAX,
                    n => {
                        l.set(n.saturating_sub(1));
                        n.saturating_sub(1)
                    }
                });
                if left == 0 {
                    return Err(serde::de::Error::custom("too many secrets"));
                }
                out.push(item);
            }
            Ok(out)
        }
    }
    d.deserialize_seq(Items)
}

/// Body of every machine-identity login and of token renewal.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoginResponse {
    /// The bearer token.
    pub access_token: SecretString,
    /// Seconds the token lives without renewal; 0 = no TTL.
    #[serde(default)]
    pub expires_in: u64,
    /// Seconds the token may live across renewals; 0 = no cap.
    #[serde(default, rename = "accessTokenMaxTTL")]
    pub access_token_max_ttl: u64,
}

/// One secret as the v3 raw endpoints return it (only the fields we use).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RawSecret {
    /// The secret's id.
    #[serde(default)]
    pub id: String,
    /// The key.
    pub secret_key: String,
    /// The value.
    pub secret_value: SecretString,
    /// The folder it lives in (list items; absent on single gets).
    #[serde(default)]
    pub secret_path: Option<String>,
    /// Version, raised on every change.
    #[serde(default)]
    pub version: Option<i64>,
    /// `shared` or `personal`.
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
}

/// A block of imported secrets in a list response.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImportBlock {
    /// Folder the secrets were imported from.
    #[serde(default)]
    pub secret_path: String,
    /// Environment they were imported from.
    #[serde(default)]
    pub environment: String,
    /// The imported secrets.
    #[serde(default, deserialize_with = "counted")]
    pub secrets: Vec<RawSecret>,
}

/// Body of `GET /api/v3/secrets/raw`.
#[derive(Debug, Deserialize)]
pub struct ListSecretsResponse {
    /// Secrets of the folder (and sub-folders with `recursive`).
    #[serde(deserialize_with = "counted")]
    pub secrets: Vec<RawSecret>,
    /// Imported blocks, with `include_imports`.
    #[serde(default)]
    pub imports: Vec<ImportBlock>,
}

/// Body of `GET /api/v3/secrets/raw/:secretName`.
#[derive(Debug, Deserialize)]
pub struct GetSecretResponse {
    /// The secret.
    pub secret: RawSecret,
}

/// The error envelope of the KMS: `{statusCode, message, error}`, where
/// `message` may be a string or a list of validation issues.
#[derive(Debug, Deserialize)]
pub struct ErrorBody {
    /// A class name such as `NotFound`, or sometimes a detail text.
    #[serde(default)]
    pub error: Option<String>,
    /// A string, or a list of issues.
    #[serde(default)]
    pub message: Option<serde_json::Value>,
}

impl ErrorBody {
    /// The message as one line: list items are joined with `; `, each item
    /// reduced to its `message` field (validation issues never carry values).
    pub fn message_text(&self) -> String {
        match &self.message {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Array(items)) => items
                .iter()
                .map(|i| match i {
                    serde_json::Value::String(s) => s.clone(),
                    other => other
                        .get("message")
                        .and_then(|m| m.as_str())
                        .map(|m| {
                            let path = other
                                .get("path")
                                .and_then(|p| p.as_array())
                                .map(|p| {
                                    p.iter()
                                        .map(|x| {
                                            x.as_str().map_or_else(|| x.to_string(), str::to_owned)
                                        })
                                        .collect::<Vec<_>>()
                                        .join(".")
                                })
                                .unwrap_or_default();
                            if path.is_empty() {
                                m.to_owned()
                            } else {
                                format!("{path}: {m}")
                            }
                        })
                        .unwrap_or_else(|| "invalid request".to_owned()),
                })
                .collect::<Vec<_>>()
                .join("; "),
            _ => String::new(),
        }
    }
}

/// A project as `GET /api/v2/workspace/:slug` returns it (unwrapped).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Project {
    /// Project id.
    pub id: String,
    /// Project slug.
    #[serde(default)]
    pub slug: String,
    /// Display name.
    #[serde(default)]
    pub name: String,
    /// Its environments.
    #[serde(default)]
    pub environments: Vec<ProjectEnvironment>,
}

/// An environment of a [`Project`].
#[derive(Debug, Clone, Deserialize)]
pub struct ProjectEnvironment {
    /// Slug, as resources name it.
    pub slug: String,
}

/// `GET /api/v1/workspace/:workspaceId`: the project, wrapped.
#[derive(Debug, Clone, Deserialize)]
pub struct WorkspaceBody {
    /// The project.
    pub workspace: Project,
}

/// `GET /api/v1/folders`: the sub-folders of a folder.
#[derive(Debug, Clone, Deserialize)]
pub struct FoldersBody {
    /// The folders.
    pub folders: Vec<FolderBody>,
}

/// One folder of [`FoldersBody`].
#[derive(Debug, Clone, Deserialize)]
pub struct FolderBody {
    /// Its name (the last path segment).
    pub name: String,
}

/// One secret of a fetched scope, after merging imports.
#[derive(Debug, Clone)]
pub struct SecretItem {
    /// The key.
    pub key: String,
    /// The value.
    pub value: SecretString,
    /// The folder it came from.
    pub secret_path: String,
}

/// The secrets of a scope, keyed by secret key.
pub type SecretMap = BTreeMap<String, SecretItem>;

/// Merge a list response into one map, deterministically and independent of
/// the order in which the KMS lists items:
///
/// - secrets of the scope itself win over imported ones;
/// - with `recursive`, a key present in several folders is taken from the
///   folder nearest the scope root (fewest path segments, then the
///   lexicographically first path);
/// - among imports, earlier blocks win (the server's import order).
pub fn merge_list(response: ListSecretsResponse, scope_path: &str) -> SecretMap {
    let mut out = SecretMap::new();
    let depth = |p: &str| p.split('/').filter(|s| !s.is_empty()).count();
    for raw in response.secrets {
        if raw.kind.as_deref() == Some("personal") {
            continue;
        }
        let path = raw
            .secret_path
            .clone()
            .unwrap_or_else(|| scope_path.to_owned());
        let better = match out.get(&raw.secret_key) {
            None => true,
            Some(existing) => {
                (depth(&path), path.as_str())
                    < (depth(&existing.secret_path), existing.secret_path.as_str())
            }
        };
        if better {
            out.insert(
                raw.secret_key.clone(),
                SecretItem {
                    key: raw.secret_key,
                    value: raw.secret_value,
                    secret_path: path,
                },
            );
        }
    }
    for block in response.imports {
        for raw in block.secrets {
            if raw.kind.as_deref() == Some("personal") || out.contains_key(&raw.secret_key) {
                continue;
            }
            out.insert(
                raw.secret_key.clone(),
                SecretItem {
                    key: raw.secret_key,
                    value: raw.secret_value,
                    secret_path: block.secret_path.clone(),
                },
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use secrecy::ExposeSecret;

    fn raw(key: &str, value: &str, path: &str) -> serde_json::Value {
        serde_json::json!({"id": format!("{key}{path}"), "secretKey": key, "secretValue": value, "secretPath": path, "type": "shared"})
    }

    #[test]
    fn merge_is_independent_of_list_order() {
        let a = serde_json::json!({"secrets": [raw("K", "root", "/"), raw("K", "deep", "/a/b"), raw("K", "mid", "/a")]});
        let b = serde_json::json!({"secrets": [raw("K", "deep", "/a/b"), raw("K", "mid", "/a"), raw("K", "root", "/")]});
        for body in [a, b] {
            let map = merge_list(serde_json::from_value(body).unwrap(), "/");
            assert_eq!(map["K"].value.expose_secret(), "root");
            assert_eq!(map["K"].secret_path, "/");
        }
    }

    #[test]
    fn own_secrets_win_over_imports_and_first_import_wins() {
        let body = serde_json::json!({
            "secrets": [raw("A", "own", "/")],
            "imports": [
                {"secretPath": "/x", "environment": "dev", "secrets": [{"secretKey": "A", "secretValue": "imp"}, {"secretKey": "B", "secretValue": "x"}]},
                {"secretPath": "/y", "environment": "dev", "secrets": [{"secretKey": "B", "secretValue": "y"}]}
            ]
        });
        let map = merge_list(serde_json::from_value(body).unwrap(), "/");
        assert_eq!(map["A"].value.expose_secret(), "own");
        assert_eq!(map["B"].value.expose_secret(), "x");
        assert_eq!(map["B"].secret_path, "/x");
    }

    #[test]
    fn debug_output_redacts_values() {
        let body = serde_json::json!({"secrets": [raw("A", "very-secret-value", "/")]});
        let map = merge_list(serde_json::from_value(body).unwrap(), "/");
        let debug = format!("{map:?}");
        assert!(!debug.contains("very-secret-value"), "{debug}");
    }

    #[test]
    fn validation_messages_are_flattened() {
        let body: ErrorBody = serde_json::from_value(serde_json::json!({
            "statusCode": 401, "error": "ValidationFailure",
            "message": [{"code": "invalid_type", "path": ["secretValue"], "message": "Required"}]
        }))
        .unwrap();
        assert_eq!(body.message_text(), "secretValue: Required");
    }
}
