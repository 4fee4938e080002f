//! Writing secrets into a KMS folder, for push: list a folder as it is
//! stored (no imports, no reference expansion, so values compare raw),
//! create, update (and rename) and delete single secrets, and the batch forms
//! of the same writes.
//!
//! A folder protected by an approval policy answers a write with
//! `{"approval": …}` instead of the secret: that is reported as
//! [`Written::ApprovalRequired`], never as success. 4xx answers are not
//! retried (beyond what [`Kms`]'s request loop does for 429 and token
//! errors); a delete of a secret that is already gone counts as done.

use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use serde_json::{Value, json};

use super::auth::Identity;
use super::client::ProjectRef;
use super::client::{Kms, Reply, parse, urlencode};
use super::error::KmsError;

const LIST: &str = "GET /api/v3/secrets/raw";
const CREATE: &str = "POST /api/v3/secrets/raw/:secretName";
const UPDATE: &str = "PATCH /api/v3/secrets/raw/:secretName";
const DELETE: &str = "DELETE /api/v3/secrets/raw/:secretName";
const BATCH_CREATE: &str = "POST /api/v3/secrets/batch/raw";
const BATCH_UPDATE: &str = "PATCH /api/v3/secrets/batch/raw";
const BATCH_DELETE: &str = "DELETE /api/v3/secrets/batch/raw";

/// The KMS folder a push writes into.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Folder {
    /// The project.
    pub project: ProjectRef,
    /// Environment slug.
    pub environment: String,
    /// Folder path (`/`, `/app`).
    pub path: String,
}

impl Folder {
    /// The project, environment and folder fields of a write body.
    fn body(&self) -> serde_json::Map<String, Value> {
        let mut m = serde_json::Map::new();
        match &self.project {
            ProjectRef::Slug(s) => m.insert("projectSlug".into(), json!(s)),
            ProjectRef::Id(id) => m.insert("workspaceId".into(), json!(id)),
            // Push destinations always name their project.
            ProjectRef::OfServiceToken => None,
        };
        m.insert("environment".into(), json!(self.environment));
        m.insert("secretPath".into(), json!(self.path));
        m
    }
}

/// A secret stored in a folder, as listed.
#[derive(Clone)]
pub struct StoredSecret {
    /// The KMS secret id.
    pub id: String,
    /// The key.
    pub key: String,
    /// The value as stored.
    pub value: SecretString,
    /// The comment.
    pub comment: String,
}

impl std::fmt::Debug for StoredSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredSecret")
            .field("id", &self.id)
            .field("key", &self.key)
            .field("value", &"[REDACTED]")
            .field("comment", &self.comment)
            .finish()
    }
}

/// A secret to create.
#[derive(Clone)]
pub struct NewSecret {
    /// The key.
    pub key: String,
    /// The value.
    pub value: SecretString,
    /// The comment to store with it.
    pub comment: String,
}

/// A change to an existing secret: a new value, and optionally a new key.
#[derive(Clone)]
pub struct SecretChange {
    /// The key it has now.
    pub key: String,
    /// The new value.
    pub value: SecretString,
    /// The key it gets (a rename), if any.
    pub new_key: Option<String>,
}

/// A secret a write touched: its id and key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Touched {
    /// The KMS secret id.
    pub id: String,
    /// The key.
    pub key: String,
}

/// What a write did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Written {
    /// The secrets were written (for a delete: removed; a secret that was
    /// already gone is not listed).
    Done(Vec<Touched>),
    /// The folder needs approval: the KMS opened a change request instead of
    /// writing. Nothing was written yet.
    ApprovalRequired,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListedBody {
    #[serde(default)]
    id: String,
    secret_key: String,
    secret_value: SecretString,
    #[serde(default)]
    secret_comment: Option<String>,
    #[serde(default, rename = "type")]
    kind: Option<String>,
}

#[derive(Deserialize)]
struct ListBody {
    secrets: Vec<ListedBody>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TouchedBody {
    #[serde(default)]
    id: String,
    secret_key: String,
}

/// Read a write's answer: the secret(s), or an approval request.
fn written(route: &'static str, reply: &Reply) -> Result<Written, KmsError> {
    let body: Value = parse(route, reply)?;
    if body.get("approval").is_some_and(|a| !a.is_null()) {
        return Ok(Written::ApprovalRequired);
    }
    let decode = |v: &Value| {
        serde_json::from_value::<TouchedBody>(v.clone()).map_err(|_| KmsError::Decode {
            endpoint: route,
            reason: "a written secret lacks its id or key".to_owned(),
        })
    };
    let items: Vec<Touched> = match (body.get("secret"), body.get("secrets")) {
        (Some(one), _) if one.is_object() => vec![decode(one)?],
        (_, Some(Value::Array(many))) => many.iter().map(decode).collect::<Result<Vec<_>, _>>()?,
        _ => {
            return Err(KmsError::Decode {
                endpoint: route,
                reason: "the answer holds neither a secret nor an approval request".to_owned(),
            });
        }
    }
    .into_iter()
    .map(|b| Touched {
        id: b.id,
        key: b.secret_key,
    })
    .collect();
    Ok(Written::Done(items))
}

impl Kms {
    /// The shared secrets of a folder as they are stored: no imports, no
    /// sub-folders, references not expanded. A folder that does not exist
    /// lists as empty (as the KMS answers).
    pub async fn list_folder(
        &self,
        identity: &Identity,
        folder: &Folder,
    ) -> Result<Vec<StoredSecret>, KmsError> {
        let ep = &identity.endpoint;
        let url = format!("{}/v3/secrets/raw", ep.base);
        let project = match &folder.project {
            ProjectRef::Slug(s) => ("workspaceSlug", s.clone()),
            ProjectRef::Id(id) => ("workspaceId", id.clone()),
            ProjectRef::OfServiceToken => {
                return Err(KmsError::Credentials(
                    "a push destination must name its project".to_owned(),
                ));
            }
        };
        let query: Vec<(&str, String)> = vec![
            project,
            ("environment", folder.environment.clone()),
            ("secretPath", folder.path.clone()),
            ("recursive", "false".to_owned()),
            ("include_imports", "false".to_owned()),
            ("expandSecretReferences", "false".to_owned()),
        ];
        self.with_token(identity, |token| {
            let (url, query) = (&url, &query);
            async move {
                let reply = self
                    .send(ep, LIST, |c| {
                        c.get(url).query(query).bearer_auth(token.expose_secret())
                    })
                    .await?;
                let body: ListBody = parse(LIST, &reply)?;
                Ok(body
                    .secrets
                    .into_iter()
                    .filter(|s| s.kind.as_deref() != Some("personal"))
                    .map(|s| StoredSecret {
                        id: s.id,
                        key: s.secret_key,
                        value: s.secret_value,
                        comment: s.secret_comment.unwrap_or_default(),
                    })
                    .collect())
            }
        })
        .await
    }

    /// Send a JSON body to a secrets route and read the write's answer.
    /// `gone_ok`: a 404 means "already gone" (deletes of single secrets).
    async fn write(
        &self,
        identity: &Identity,
        method: reqwest::Method,
        route: &'static str,
        url: String,
        body: Value,
        gone_ok: bool,
    ) -> Result<Written, KmsError> {
        let ep = &identity.endpoint;
        self.with_token(identity, |token| {
            let (url, body, method) = (&url, &body, method.clone());
            async move {
                let reply = self
                    .send(ep, route, |c| {
                        c.request(method.clone(), url)
                            .json(body)
                            .bearer_auth(token.expose_secret())
                    })
                    .await?;
                if gone_ok && reply.status == reqwest::StatusCode::NOT_FOUND {
                    return Ok(Written::Done(Vec::new()));
                }
                written(route, &reply)
            }
        })
        .await
    }

    /// Create one secret.
    pub async fn create_secret(
        &self,
        identity: &Identity,
        folder: &Folder,
        secret: &NewSecret,
    ) -> Result<Written, KmsError> {
        let mut body = folder.body();
        body.insert("secretValue".into(), json!(secret.value.expose_secret()));
        body.insert("secretComment".into(), json!(secret.comment));
        body.insert("type".into(), json!("shared"));
        let url = format!(
            "{}/v3/secrets/raw/{}",
            identity.endpoint.base,
            urlencode(&secret.key)
        );
        self.write(
            identity,
            reqwest::Method::POST,
            CREATE,
            url,
            Value::Object(body),
            false,
        )
        .await
    }

    /// Update one secret's value (and rename it when `new_key` is set).
    pub async fn update_secret(
        &self,
        identity: &Identity,
        folder: &Folder,
        change: &SecretChange,
    ) -> Result<Written, KmsError> {
        let mut body = folder.body();
        body.insert("secretValue".into(), json!(change.value.expose_secret()));
        body.insert("type".into(), json!("shared"));
        if let Some(new_key) = &change.new_key {
            body.insert("newSecretName".into(), json!(new_key));
        }
        let url = format!(
            "{}/v3/secrets/raw/{}",
            identity.endpoint.base,
            urlencode(&change.key)
        );
        self.write(
            identity,
            reqwest::Method::PATCH,
            UPDATE,
            url,
            Value::Object(body),
            false,
        )
        .await
    }

    /// Delete one secret; one that is already gone counts as deleted (and is
    /// not listed in the answer).
    pub async fn delete_secret(
        &self,
        identity: &Identity,
        folder: &Folder,
        key: &str,
    ) -> Result<Written, KmsError> {
        let mut body = folder.body();
        body.insert("type".into(), json!("shared"));
        let url = format!(
            "{}/v3/secrets/raw/{}",
            identity.endpoint.base,
            urlencode(key)
        );
        self.write(
            identity,
            reqwest::Method::DELETE,
            DELETE,
            url,
            Value::Object(body),
            true,
        )
        .await
    }

    /// Create several secrets in one request (all or nothing).
    pub async fn create_secrets(
        &self,
        identity: &Identity,
        folder: &Folder,
        secrets: &[NewSecret],
    ) -> Result<Written, KmsError> {
        let mut body = folder.body();
        let items: Vec<Value> = secrets
            .iter()
            .map(|s| {
                json!({
                    "secretKey": s.key,
                    "secretValue": s.value.expose_secret(),
                    "secretComment": s.comment,
                })
            })
            .collect();
        body.insert("secrets".into(), Value::Array(items));
        let url = format!("{}/v3/secrets/batch/raw", identity.endpoint.base);
        self.write(
            identity,
            reqwest::Method::POST,
            BATCH_CREATE,
            url,
            Value::Object(body),
            false,
        )
        .await
    }

    /// Update several secrets in one request (all or nothing; a missing one
    /// fails the request).
    pub async fn update_secrets(
        &self,
        identity: &Identity,
        folder: &Folder,
        changes: &[SecretChange],
    ) -> Result<Written, KmsError> {
        let mut body = folder.body();
        let items: Vec<Value> = changes
            .iter()
            .map(|c| {
                let mut item = json!({
                    "secretKey": c.key,
                    "secretValue": c.value.expose_secret(),
                });
                if let Some(new_key) = &c.new_key {
                    item["newSecretName"] = json!(new_key);
                }
                item
            })
            .collect();
        body.insert("secrets".into(), Value::Array(items));
        body.insert("mode".into(), json!("failOnNotFound"));
        let url = format!("{}/v3/secrets/batch/raw", identity.endpoint.base);
        self.write(
            identity,
            reqwest::Method::PATCH,
            BATCH_UPDATE,
            url,
            Value::Object(body),
            false,
        )
        .await
    }

    /// Delete several secrets in one request (all or nothing; a missing one
    /// fails the request).
    pub async fn delete_secrets(
        &self,
        identity: &Identity,
        folder: &Folder,
        keys: &[String],
    ) -> Result<Written, KmsError> {
        let mut body = folder.body();
        let items: Vec<Value> = keys
            .iter()
            .map(|k| json!({"secretKey": k, "type": "shared"}))
            .collect();
        body.insert("secrets".into(), Value::Array(items));
        let url = format!("{}/v3/secrets/batch/raw", identity.endpoint.base);
        self.write(
            identity,
            reqwest::Method::DELETE,
            BATCH_DELETE,
            url,
            Value::Object(body),
            false,
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use reqwest::StatusCode;
    use reqwest::header::HeaderMap;

    fn reply(status: u16, body: Value) -> Reply {
        Reply {
            status: StatusCode::from_u16(status).unwrap(),
            headers: HeaderMap::new(),
            body: Bytes::from(serde_json::to_vec(&body).unwrap()),
            held: None,
        }
    }

    #[test]
    fn approvals_are_not_success() {
        let r = reply(200, json!({"approval": {"id": "a1", "status": "open"}}));
        assert_eq!(written(CREATE, &r).unwrap(), Written::ApprovalRequired);
        let r = reply(200, json!({"approval": {"id": "a1"}, "secrets": []}));
        assert_eq!(
            written(BATCH_CREATE, &r).unwrap(),
            Written::ApprovalRequired
        );
    }

    #[test]
    fn single_and_batch_answers_name_ids_and_keys() {
        let r = reply(
            200,
            json!({"secret": {"id": "i1", "secretKey": "A", "secretValue": "v", "version": 1}}),
        );
        assert_eq!(
            written(CREATE, &r).unwrap(),
            Written::Done(vec![Touched {
                id: "i1".into(),
                key: "A".into()
            }])
        );
        let r = reply(
            200,
            json!({"secrets": [{"id": "i1", "secretKey": "A"}, {"id": "i2", "secretKey": "B"}]}),
        );
        let Written::Done(items) = written(BATCH_CREATE, &r).unwrap() else {
            panic!()
        };
        assert_eq!(items.len(), 2);
        assert_eq!(items[1].key, "B");
    }

    #[test]
    fn unexpected_answers_are_errors_without_values() {
        let r = reply(200, json!({"message": "ok", "secretValue": "leak-me"}));
        let e = written(CREATE, &r).unwrap_err();
        assert!(matches!(e, KmsError::Decode { .. }), "{e}");
        assert!(!e.to_string().contains("leak-me"));
        let r = reply(
            400,
            json!({"statusCode": 400, "message": "Secret already exist", "error": "BadRequest"}),
        );
        let e = written(CREATE, &r).unwrap_err();
        assert_eq!(e.status(), Some(400));
    }

    #[test]
    fn folders_name_the_project_as_writes_expect() {
        let f = Folder {
            project: ProjectRef::Slug("demo".into()),
            environment: "dev".into(),
            path: "/app".into(),
        };
        let b = f.body();
        assert_eq!(b["projectSlug"], "demo");
        assert_eq!(b["secretPath"], "/app");
        let f = Folder {
            project: ProjectRef::Id("p1".into()),
            ..f
        };
        assert_eq!(f.body()["workspaceId"], "p1");
        assert!(!f.body().contains_key("projectSlug"));
    }

    #[test]
    fn listed_values_are_redacted_in_debug() {
        let s = StoredSecret {
            id: "i".into(),
            key: "K".into(),
            value: SecretString::from("hidden-value".to_owned()),
            comment: String::new(),
        };
        assert!(!format!("{s:?}").contains("hidden-value"));
    }
}
