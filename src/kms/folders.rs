//! Does a folder exist? Older servers answer a list of a folder or an
//! environment that does not exist with an empty list, which is also the
//! answer for a folder that exists and is empty. Before the operator empties
//! a target because a list came back empty, it asks the project (its
//! environments) and the folders API (`GET /api/v1/folders`, the sub-folders
//! of the parent) which one it is. A push may also create the folders of
//! its destination (`POST /api/v1/folders`).

use secrecy::{ExposeSecret, SecretString};

use super::auth::Identity;
use super::client::{Kms, ProjectRef, Scope, parse, urlencode};
use super::error::KmsError;
use super::model::{FoldersBody, Project, WorkspaceBody};

const PROJECT_BY_SLUG: &str = "GET /api/v2/workspace/:slug";
const PROJECT_BY_ID: &str = "GET /api/v1/workspace/:id";
const FOLDERS: &str = "GET /api/v1/folders";

/// What the KMS says of a scope's folder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FolderCheck {
    /// The environment and the folder exist.
    Exists,
    /// The project has no such environment.
    MissingEnvironment,
    /// The environment exists, the folder does not.
    MissingFolder,
}

/// `/a/b/c` → (`/a/b`, `c`); `/a` → (`/`, `a`); `None` for the root.
pub fn split_folder(path: &str) -> Option<(String, String)> {
    let trimmed = path.trim().trim_end_matches('/');
    let (parent, name) = trimmed.rsplit_once('/')?;
    if name.is_empty() {
        return None;
    }
    let parent = if parent.is_empty() { "/" } else { parent };
    Some((parent.to_owned(), name.to_owned()))
}

impl Kms {
    /// A project by slug or id, with its environments.
    pub async fn project(
        &self,
        identity: &Identity,
        project: &ProjectRef,
    ) -> Result<Project, KmsError> {
        self.with_token(identity, |token| async move {
            match project {
                ProjectRef::Slug(slug) => self.project_by_slug(identity, slug, &token).await,
                ProjectRef::Id(id) => self.project_by_id(identity, id, &token).await,
                ProjectRef::OfServiceToken => {
                    let id = self.service_token_project(identity, &token).await?;
                    self.project_by_id(identity, &id, &token).await
                }
            }
        })
        .await
    }

    async fn project_by_slug(
        &self,
        identity: &Identity,
        slug: &str,
        token: &SecretString,
    ) -> Result<Project, KmsError> {
        let url = format!(
            "{}/v2/workspace/{}",
            identity.endpoint.base,
            urlencode(slug)
        );
        let reply = self
            .send(&identity.endpoint, PROJECT_BY_SLUG, |c| {
                c.get(&url).bearer_auth(token.expose_secret())
            })
            .await?;
        parse(PROJECT_BY_SLUG, &reply)
    }

    async fn project_by_id(
        &self,
        identity: &Identity,
        id: &str,
        token: &SecretString,
    ) -> Result<Project, KmsError> {
        let url = format!("{}/v1/workspace/{}", identity.endpoint.base, urlencode(id));
        let reply = self
            .send(&identity.endpoint, PROJECT_BY_ID, |c| {
                c.get(&url).bearer_auth(token.expose_secret())
            })
            .await?;
        parse::<WorkspaceBody>(PROJECT_BY_ID, &reply).map(|w| w.workspace)
    }

    /// Whether the environment and folder of `scope` exist. Errors (a 403,
    /// an outage) are returned as they are: the caller must not take them
    /// for an answer.
    pub async fn check_folder(
        &self,
        identity: &Identity,
        scope: &Scope,
    ) -> Result<FolderCheck, KmsError> {
        let project = self.project(identity, &scope.project).await?;
        if !project
            .environments
            .iter()
            .any(|e| e.slug == scope.environment)
        {
            return Ok(FolderCheck::MissingEnvironment);
        }
        let Some((parent, name)) = split_folder(&scope.path) else {
            return Ok(FolderCheck::Exists);
        };
        match self
            .sub_folders(identity, &project.id, &scope.environment, &parent)
            .await
        {
            Ok(names) if names.contains(&name) => Ok(FolderCheck::Exists),
            Ok(_) => Ok(FolderCheck::MissingFolder),
            // Newer servers: the parent does not exist either.
            Err(KmsError::Api { status: 404, .. }) => Ok(FolderCheck::MissingFolder),
            Err(e) => Err(e),
        }
    }

    /// The names of the folders in `parent`.
    async fn sub_folders(
        &self,
        identity: &Identity,
        project_id: &str,
        environment: &str,
        parent: &str,
    ) -> Result<Vec<String>, KmsError> {
        let url = format!("{}/v1/folders", identity.endpoint.base);
        let query = [
            ("workspaceId", project_id),
            ("environment", environment),
            ("path", parent),
        ];
        self.with_token(identity, |token| {
            let (url, query) = (&url, &query);
            async move {
                let reply = self
                    .send(&identity.endpoint, FOLDERS, |c| {
                        c.get(url).query(query).bearer_auth(token.expose_secret())
                    })
                    .await?;
                let body = parse::<FoldersBody>(FOLDERS, &reply)?;
                Ok(body.folders.into_iter().map(|f| f.name).collect())
            }
        })
        .await
    }

    /// Create the folders of `path` that do not exist, parents first
    /// (`POST /api/v1/folders`, one per folder); the paths created. Each
    /// level is listed first, so a folder that exists is never created
    /// again. The first error (a 403: the identity may not create folders
    /// there) is returned as it is, naming nothing created after it.
    pub async fn create_folders(
        &self,
        identity: &Identity,
        project: &ProjectRef,
        environment: &str,
        path: &str,
    ) -> Result<Vec<String>, KmsError> {
        let project = self.project(identity, project).await?;
        let mut created = Vec::new();
        let mut parent = "/".to_owned();
        for name in path.split('/').filter(|s| !s.is_empty()) {
            let here = if parent == "/" {
                format!("/{name}")
            } else {
                format!("{parent}/{name}")
            };
            let exists = self
                .sub_folders(identity, &project.id, environment, &parent)
                .await?
                .iter()
                .any(|n| n == name);
            if !exists {
                self.create_folder(identity, &project.id, environment, &parent, name)
                    .await?;
                created.push(here.clone());
            }
            parent = here;
        }
        Ok(created)
    }

    async fn create_folder(
        &self,
        identity: &Identity,
        project_id: &str,
        environment: &str,
        parent: &str,
        name: &str,
    ) -> Result<(), KmsError> {
        const CREATE_FOLDER: &str = "POST /api/v1/folders";
        let url = format!("{}/v1/folders", identity.endpoint.base);
        let body = serde_json::json!({
            "workspaceId": project_id,
            "environment": environment,
            "path": parent,
            "name": name,
        });
        self.with_token(identity, |token| {
            let (url, body) = (&url, &body);
            async move {
                let reply = self
                    .send(&identity.endpoint, CREATE_FOLDER, |c| {
                        c.post(url).bearer_auth(token.expose_secret()).json(body)
                    })
                    .await?;
                parse::<serde_json::Value>(CREATE_FOLDER, &reply).map(|_| ())
            }
        })
        .await
    }
}

/// A KMS folder path: leading `/`, no trailing `/` (except the root).
pub fn normalize_path(p: &str) -> String {
    let trimmed = p.trim().trim_end_matches('/');
    if trimmed.is_empty() {
        "/".to_owned()
    } else if trimmed.starts_with('/') {
        trimmed.to_owned()
    } else {
        format!("/{trimmed}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folders_split_into_parent_and_name() {
        assert_eq!(split_folder("/"), None);
        assert_eq!(split_folder(""), None);
        assert_eq!(split_folder("/a"), Some(("/".into(), "a".into())));
        assert_eq!(split_folder("/a/b/"), Some(("/a".into(), "b".into())));
        assert_eq!(split_folder("/a/b/c"), Some(("/a/b".into(), "c".into())));
    }
}
