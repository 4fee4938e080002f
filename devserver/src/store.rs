//! Storage: every record lives in one sled tree under `<kind>/<id>` and in
//! memory. A write applies its changes to sled as one atomic batch and
//! flushes it to disk before the in-memory state changes and before the
//! response is sent, so an acknowledged write survives `kill -9`. Also
//! here: applying the seed (create-if-absent, remembering what it created
//! so objects deleted through the API stay deleted). Every committed change
//! of a secret or an import is also announced to the events stream.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;
use std::time::{Duration, Instant};

use tokio::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard, broadcast};

use crate::Error;
use crate::clock::now_ms;
use crate::durations;
use crate::events::{self, ProjectEvent};
use crate::ids::{derived, fill};
use crate::model::{
    AccessToken, DynamicSecret, Environment, Folder, Identity, Import, KubernetesAuth, LdapAuth,
    Lease, Project, Secret, ServiceToken, UniversalAuth,
};
use crate::seed::{Seed, environment_name, normalize_path};

/// Key of the token-signing key.
const SIGNING_KEY: &[u8] = b"meta/signing-key";
/// Default TTL of a dynamic secret whose seed gives none.
const DEFAULT_LEASE_TTL: &str = "1h";
/// Events kept for a subscriber that is slow to read them.
const EVENT_BACKLOG: usize = 1024;

/// A write that could not be made durable.
#[derive(Debug)]
pub(crate) struct StorageError(pub String);

impl fmt::Display for StorageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The kinds of record, each with its key prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Project,
    Folder,
    Secret,
    Import,
    Identity,
    Token,
    ServiceToken,
    DynamicSecret,
    Lease,
    Seeded,
}

impl Kind {
    fn prefix(self) -> &'static str {
        match self {
            Kind::Project => "project",
            Kind::Folder => "folder",
            Kind::Secret => "secret",
            Kind::Import => "import",
            Kind::Identity => "identity",
            Kind::Token => "token",
            Kind::ServiceToken => "service-token",
            Kind::DynamicSecret => "dynamic-secret",
            Kind::Lease => "lease",
            Kind::Seeded => "seeded",
        }
    }

    fn key(self, id: &str) -> String {
        format!("{}/{id}", self.prefix())
    }
}

/// A record to store.
#[derive(Debug, Clone)]
pub(crate) enum Record {
    Project(Project),
    Folder(Folder),
    Secret(Secret),
    Import(Import),
    Identity(Identity),
    Token(AccessToken),
    ServiceToken(ServiceToken),
    DynamicSecret(DynamicSecret),
    Lease(Lease),
    /// A marker: the seed created the object with this marker once.
    Seeded(String),
}

impl Record {
    fn kind_and_id(&self) -> (Kind, &str) {
        match self {
            Record::Project(r) => (Kind::Project, &r.id),
            Record::Folder(r) => (Kind::Folder, &r.id),
            Record::Secret(r) => (Kind::Secret, &r.id),
            Record::Import(r) => (Kind::Import, &r.id),
            Record::Identity(r) => (Kind::Identity, &r.id),
            Record::Token(r) => (Kind::Token, &r.id),
            Record::ServiceToken(r) => (Kind::ServiceToken, &r.id),
            Record::DynamicSecret(r) => (Kind::DynamicSecret, &r.id),
            Record::Lease(r) => (Kind::Lease, &r.id),
            Record::Seeded(marker) => (Kind::Seeded, marker),
        }
    }

    fn encode(&self) -> Result<Vec<u8>, serde_json::Error> {
        match self {
            Record::Project(r) => serde_json::to_vec(r),
            Record::Folder(r) => serde_json::to_vec(r),
            Record::Secret(r) => serde_json::to_vec(r),
            Record::Import(r) => serde_json::to_vec(r),
            Record::Identity(r) => serde_json::to_vec(r),
            Record::Token(r) => serde_json::to_vec(r),
            Record::ServiceToken(r) => serde_json::to_vec(r),
            Record::DynamicSecret(r) => serde_json::to_vec(r),
            Record::Lease(r) => serde_json::to_vec(r),
            Record::Seeded(_) => Ok(Vec::new()),
        }
    }
}

/// One change of a write.
#[derive(Debug, Clone)]
pub(crate) enum Change {
    Put(Box<Record>),
    Delete(Kind, String),
}

/// The changes of one write, applied atomically.
#[derive(Debug, Default)]
pub(crate) struct Tx {
    changes: Vec<Change>,
}

impl Tx {
    /// A write of one record.
    pub fn one(record: Record) -> Tx {
        Tx {
            changes: vec![Change::Put(Box::new(record))],
        }
    }

    /// Store `record`.
    pub fn put(&mut self, record: Record) {
        self.changes.push(Change::Put(Box::new(record)));
    }

    /// Remove the record `id` of `kind`.
    pub fn delete(&mut self, kind: Kind, id: &str) {
        self.changes.push(Change::Delete(kind, id.to_owned()));
    }

    /// The changes, in order.
    pub fn changes(&self) -> &[Change] {
        &self.changes
    }
}

/// Everything the server knows, in memory. Maps are keyed by id, so
/// iterating secrets yields them sorted by id, as the real server lists
/// them.
#[derive(Debug, Default)]
pub(crate) struct State {
    pub projects: BTreeMap<String, Project>,
    pub folders: BTreeMap<String, Folder>,
    pub secrets: BTreeMap<String, Secret>,
    pub imports: BTreeMap<String, Import>,
    pub identities: BTreeMap<String, Identity>,
    pub tokens: BTreeMap<String, AccessToken>,
    pub service_tokens: BTreeMap<String, ServiceToken>,
    pub dynamic_secrets: BTreeMap<String, DynamicSecret>,
    pub leases: BTreeMap<String, Lease>,
    pub seeded: BTreeSet<String>,
}

impl State {
    fn apply(&mut self, change: Change) {
        match change {
            Change::Put(record) => match *record {
                Record::Project(r) => {
                    self.projects.insert(r.id.clone(), r);
                }
                Record::Folder(r) => {
                    self.folders.insert(r.id.clone(), r);
                }
                Record::Secret(r) => {
                    self.secrets.insert(r.id.clone(), r);
                }
                Record::Import(r) => {
                    self.imports.insert(r.id.clone(), r);
                }
                Record::Identity(r) => {
                    self.identities.insert(r.id.clone(), r);
                }
                Record::Token(r) => {
                    self.tokens.insert(r.id.clone(), r);
                }
                Record::ServiceToken(r) => {
                    self.service_tokens.insert(r.id.clone(), r);
                }
                Record::DynamicSecret(r) => {
                    self.dynamic_secrets.insert(r.id.clone(), r);
                }
                Record::Lease(r) => {
                    self.leases.insert(r.id.clone(), r);
                }
                Record::Seeded(marker) => {
                    self.seeded.insert(marker);
                }
            },
            Change::Delete(kind, id) => match kind {
                Kind::Project => {
                    self.projects.remove(&id);
                }
                Kind::Folder => {
                    self.folders.remove(&id);
                }
                Kind::Secret => {
                    self.secrets.remove(&id);
                }
                Kind::Import => {
                    self.imports.remove(&id);
                }
                Kind::Identity => {
                    self.identities.remove(&id);
                }
                Kind::Token => {
                    self.tokens.remove(&id);
                }
                Kind::ServiceToken => {
                    self.service_tokens.remove(&id);
                }
                Kind::DynamicSecret => {
                    self.dynamic_secrets.remove(&id);
                }
                Kind::Lease => {
                    self.leases.remove(&id);
                }
                Kind::Seeded => {
                    self.seeded.remove(&id);
                }
            },
        }
    }

    fn load(&mut self, key: &[u8], value: &[u8]) -> Result<(), String> {
        let key = std::str::from_utf8(key).map_err(|_| "a key is not UTF-8".to_owned())?;
        let Some((prefix, id)) = key.split_once('/') else {
            return Ok(());
        };
        let bad = |e: serde_json::Error| format!("record {key:?} is unreadable: {e}");
        let record = match prefix {
            "project" => Record::Project(serde_json::from_slice(value).map_err(bad)?),
            "folder" => Record::Folder(serde_json::from_slice(value).map_err(bad)?),
            "secret" => Record::Secret(serde_json::from_slice(value).map_err(bad)?),
            "import" => Record::Import(serde_json::from_slice(value).map_err(bad)?),
            "identity" => Record::Identity(serde_json::from_slice(value).map_err(bad)?),
            "token" => Record::Token(serde_json::from_slice(value).map_err(bad)?),
            "service-token" => Record::ServiceToken(serde_json::from_slice(value).map_err(bad)?),
            "dynamic-secret" => Record::DynamicSecret(serde_json::from_slice(value).map_err(bad)?),
            "lease" => Record::Lease(serde_json::from_slice(value).map_err(bad)?),
            "seeded" => Record::Seeded(id.to_owned()),
            _ => return Ok(()),
        };
        self.apply(Change::Put(Box::new(record)));
        Ok(())
    }

    /// The project with this id.
    pub fn project(&self, id: &str) -> Option<&Project> {
        self.projects.get(id)
    }

    /// The project with this slug.
    pub fn project_by_slug(&self, slug: &str) -> Option<&Project> {
        self.projects.values().find(|p| p.slug == slug)
    }

    /// The id of a folder (derived, so roots and folders alike have one).
    pub fn folder_id(project_id: &str, environment: &str, path: &str) -> String {
        derived("folder", &[project_id, environment, path])
    }

    /// Whether the folder exists; `path` is normalized. Roots always exist.
    pub fn folder_exists(&self, project_id: &str, environment: &str, path: &str) -> bool {
        path == "/"
            || self
                .folders
                .contains_key(&State::folder_id(project_id, environment, path))
    }

    /// The folders to create so that `path` exists, parents first.
    pub fn missing_folders(&self, project_id: &str, environment: &str, path: &str) -> Vec<Folder> {
        let mut out = Vec::new();
        let mut current = String::new();
        for segment in path.split('/').filter(|s| !s.is_empty()) {
            current.push('/');
            current.push_str(segment);
            if !self.folder_exists(project_id, environment, &current) {
                out.push(Folder {
                    id: State::folder_id(project_id, environment, &current),
                    project_id: project_id.to_owned(),
                    environment: environment.to_owned(),
                    path: current.clone(),
                });
            }
        }
        out
    }

    /// The secret `key` in a folder.
    pub fn find_secret(
        &self,
        project_id: &str,
        environment: &str,
        path: &str,
        key: &str,
    ) -> Option<&Secret> {
        self.secrets.values().find(|s| {
            s.key == key
                && s.path == path
                && s.environment == environment
                && s.project_id == project_id
        })
    }

    /// The secrets of a folder (and of its sub-folders when `recursive`),
    /// sorted by id.
    pub fn secrets_in(
        &self,
        project_id: &str,
        environment: &str,
        path: &str,
        recursive: bool,
    ) -> Vec<&Secret> {
        self.secrets
            .values()
            .filter(|s| {
                s.project_id == project_id
                    && s.environment == environment
                    && (s.path == path || (recursive && is_below(&s.path, path)))
            })
            .collect()
    }

    /// The imports of a folder, in order.
    pub fn imports_of(&self, project_id: &str, environment: &str, path: &str) -> Vec<&Import> {
        let mut list: Vec<&Import> = self
            .imports
            .values()
            .filter(|i| {
                i.project_id == project_id && i.environment == environment && i.path == path
            })
            .collect();
        list.sort_by(|a, b| a.position.cmp(&b.position).then_with(|| a.id.cmp(&b.id)));
        list
    }

    /// The dynamic secrets of a folder.
    pub fn dynamic_secrets_in(
        &self,
        project_id: &str,
        environment: &str,
        path: &str,
    ) -> Vec<&DynamicSecret> {
        let mut list: Vec<&DynamicSecret> = self
            .dynamic_secrets
            .values()
            .filter(|d| {
                d.project_id == project_id && d.environment == environment && d.path == path
            })
            .collect();
        list.sort_by(|a, b| {
            a.created_at
                .cmp(&b.created_at)
                .then_with(|| a.name.cmp(&b.name))
        });
        list
    }
}

/// Whether `path` is strictly below `base`.
fn is_below(path: &str, base: &str) -> bool {
    if base == "/" {
        path != "/"
    } else {
        path.strip_prefix(base)
            .is_some_and(|rest| rest.starts_with('/'))
    }
}

/// An object present after the seed was applied, as printed at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeededObject {
    /// `project`, `environment`, `identity` or `dynamic-secret`.
    pub kind: String,
    /// Its name: the project slug, `<project>/<environment>`, the identity
    /// name, or `<project>/<environment>:<path>/<name>`.
    pub name: String,
    /// Its id.
    pub id: String,
    /// More to know, such as an identity's client id.
    pub detail: Option<String>,
}

impl fmt::Display for SeededObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} id={}", self.kind, self.name, self.id)?;
        if let Some(detail) = &self.detail {
            write!(f, " {detail}")?;
        }
        Ok(())
    }
}

/// The database and the in-memory state.
#[derive(Debug)]
pub(crate) struct Store {
    db: sled::Db,
    state: RwLock<State>,
    events: broadcast::Sender<std::sync::Arc<ProjectEvent>>,
}

impl Store {
    /// Open (or create) the database in `dir`, or a temporary one, and load
    /// it. A lock still held by a closing server is waited for up to `retry`.
    pub async fn open(dir: Option<&Path>, retry: Duration) -> Result<Store, Error> {
        let config = sled::Config::new()
            .cache_capacity(64 << 20)
            .flush_every_ms(None);
        let config = match dir {
            Some(dir) => {
                std::fs::create_dir_all(dir)
                    .map_err(|e| Error::Storage(format!("cannot create {}: {e}", dir.display())))?;
                config.path(dir)
            }
            None => config.temporary(true),
        };
        let started = Instant::now();
        let db = loop {
            let attempt = config.clone();
            let opened = tokio::task::spawn_blocking(move || attempt.open())
                .await
                .map_err(|e| Error::Storage(e.to_string()))?;
            match opened {
                Ok(db) => break db,
                Err(e)
                    if e.to_string().contains("could not acquire lock")
                        && started.elapsed() < retry =>
                {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => {
                    let place = dir.map_or_else(
                        || "a temporary database".to_owned(),
                        |d| d.display().to_string(),
                    );
                    return Err(Error::Storage(format!("cannot open {place}: {e}")));
                }
            }
        };
        let mut state = State::default();
        for item in db.iter() {
            let (k, v) = item.map_err(|e| Error::Storage(e.to_string()))?;
            state.load(&k, &v).map_err(Error::Storage)?;
        }
        Ok(Store {
            db,
            state: RwLock::new(state),
            events: broadcast::channel(EVENT_BACKLOG).0,
        })
    }

    /// Receive the events of every commit from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<std::sync::Arc<ProjectEvent>> {
        self.events.subscribe()
    }

    /// Read access to the state.
    pub async fn read(&self) -> RwLockReadGuard<'_, State> {
        self.state.read().await
    }

    /// Write access to the state; changes go through [`Store::commit`].
    pub async fn write(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write().await
    }

    /// Make the changes durable, apply them to `state`, then announce the
    /// changes of secrets and imports.
    pub async fn commit(&self, state: &mut State, tx: Tx) -> Result<(), StorageError> {
        self.persist(&tx).await?;
        let announced = events::of_changes(state, &tx);
        for change in tx.changes {
            state.apply(change);
        }
        for event in announced {
            // Nobody listening is fine.
            let _ = self.events.send(std::sync::Arc::new(event));
        }
        Ok(())
    }

    async fn persist(&self, tx: &Tx) -> Result<(), StorageError> {
        if tx.changes.is_empty() {
            return Ok(());
        }
        let mut batch = sled::Batch::default();
        for change in &tx.changes {
            match change {
                Change::Put(record) => {
                    let (kind, id) = record.kind_and_id();
                    let value = record
                        .encode()
                        .map_err(|e| StorageError(format!("cannot encode a record: {e}")))?;
                    batch.insert(kind.key(id).as_bytes(), value);
                }
                Change::Delete(kind, id) => batch.remove(kind.key(id).as_bytes()),
            }
        }
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || -> sled::Result<()> {
            db.apply_batch(batch)?;
            db.flush()?;
            Ok(())
        })
        .await
        .map_err(|e| StorageError(e.to_string()))?
        .map_err(|e| StorageError(e.to_string()))
    }

    /// Flush everything (a no-op when every write already flushed).
    pub async fn close(&self) {
        let db = self.db.clone();
        match tokio::task::spawn_blocking(move || db.flush()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "flushing the database at shutdown failed"),
            Err(e) => tracing::warn!(error = %e, "flushing the database at shutdown failed"),
        }
    }

    /// The key that signs access tokens: kept in the database, so tokens
    /// stay valid across restarts with the same data directory.
    pub async fn signing_key(&self) -> Result<Vec<u8>, Error> {
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || -> Result<Vec<u8>, Error> {
            let storage = |e: sled::Error| Error::Storage(e.to_string());
            if let Some(key) = db.get(SIGNING_KEY).map_err(storage)?
                && key.len() == 32
            {
                return Ok(key.to_vec());
            }
            let mut key = vec![0u8; 32];
            fill(&mut key);
            db.insert(SIGNING_KEY, key.as_slice()).map_err(storage)?;
            db.flush().map_err(storage)?;
            Ok(key)
        })
        .await
        .map_err(|e| Error::Storage(e.to_string()))?
    }

    /// What is in the database, for printing at start.
    pub async fn inventory(&self) -> Vec<SeededObject> {
        let st = self.read().await;
        let mut out = Vec::new();
        for p in st.projects.values() {
            out.push(SeededObject {
                kind: "project".into(),
                name: p.slug.clone(),
                id: p.id.clone(),
                detail: None,
            });
            for e in &p.environments {
                out.push(SeededObject {
                    kind: "environment".into(),
                    name: format!("{}/{}", p.slug, e.slug),
                    id: e.id.clone(),
                    detail: None,
                });
            }
            for d in st.dynamic_secrets.values().filter(|d| d.project_id == p.id) {
                let sep = if d.path == "/" { "" } else { "/" };
                out.push(SeededObject {
                    kind: "dynamic-secret".into(),
                    name: format!("{}/{}:{}{sep}{}", p.slug, d.environment, d.path, d.name),
                    id: d.id.clone(),
                    detail: None,
                });
            }
        }
        for i in st.identities.values() {
            let mut methods = Vec::new();
            if let Some(ua) = &i.universal_auth {
                methods.push(format!("clientId={}", ua.client_id));
            }
            if i.kubernetes_auth.is_some() {
                methods.push("kubernetesAuth".to_owned());
            }
            if let Some(l) = &i.ldap_auth {
                methods.push(format!("ldapUser={}", l.username));
            }
            if i.aws_auth.is_some() {
                methods.push("awsAuth(test mode)".to_owned());
            }
            if i.azure_auth.is_some() {
                methods.push("azureAuth(test mode)".to_owned());
            }
            if i.gcp_auth.is_some() {
                methods.push("gcpAuth(test mode)".to_owned());
            }
            out.push(SeededObject {
                kind: "identity".into(),
                name: i.name.clone(),
                id: i.id.clone(),
                detail: (!methods.is_empty()).then(|| methods.join(" ")),
            });
        }
        for t in st.service_tokens.values() {
            let project = st.project(&t.project_id).map_or("", |p| p.slug.as_str());
            out.push(SeededObject {
                kind: "service-token".into(),
                name: t.name.clone(),
                id: t.id.clone(),
                detail: Some(format!(
                    "scope={project}/{}:{} permissions={}",
                    t.environment,
                    t.path,
                    t.permissions.join(",")
                )),
            });
        }
        out
    }

    /// Create what the seed describes and is neither in the database nor
    /// was created by an earlier run, then report the inventory.
    pub async fn apply_seed(&self, seed: &Seed) -> Result<Vec<SeededObject>, Error> {
        {
            let mut guard = self.write().await;
            let st = &mut *guard;
            let mut tx = Tx::default();
            let now = now_ms();
            let mut slug_to_id = BTreeMap::new();
            for p in &seed.projects {
                let pid = seed_project(st, &mut tx, p, now)?;
                slug_to_id.insert(p.slug.clone(), pid);
            }
            for i in &seed.identities {
                seed_identity(st, &mut tx, i, &slug_to_id);
            }
            for t in &seed.service_tokens {
                seed_service_token(st, &mut tx, t, &slug_to_id, now);
            }
            self.persist(&tx)
                .await
                .map_err(|e| Error::Storage(e.to_string()))?;
        }
        Ok(self.inventory().await)
    }
}

/// Apply a change to memory now and remember it for the seed's one write.
fn stage(st: &mut State, tx: &mut Tx, record: Record) {
    st.apply(Change::Put(Box::new(record.clone())));
    tx.put(record);
}

/// Mark `marker` as created by the seed; false if an earlier run did.
fn first_time(st: &mut State, tx: &mut Tx, marker: String) -> bool {
    if st.seeded.contains(&marker) {
        return false;
    }
    stage(st, tx, Record::Seeded(marker));
    true
}

fn seed_project(
    st: &mut State,
    tx: &mut Tx,
    p: &crate::seed::SeedProject,
    now: i64,
) -> Result<String, Error> {
    let pid =
        p.id.clone()
            .unwrap_or_else(|| derived("project", &[&p.slug]));
    if let Some(other) = st.project_by_slug(&p.slug)
        && other.id != pid
    {
        return Err(Error::Seed(format!(
            "project {:?}: the data directory has this slug with id {}, the seed gives id {pid}",
            p.slug, other.id
        )));
    }
    let envs = p.environment_list();
    if first_time(st, tx, format!("project:{pid}")) && !st.projects.contains_key(&pid) {
        stage(
            st,
            tx,
            Record::Project(Project {
                id: pid.clone(),
                slug: p.slug.clone(),
                name: p.name.clone().unwrap_or_else(|| p.slug.clone()),
                org_id: derived("organization", &["dev-server"]),
                auto_capitalization: p.auto_capitalization,
                environments: Vec::new(),
                created_at: now,
                updated_at: now,
            }),
        );
    }
    // Environments added to the seed later are added to the project.
    for e in &envs {
        if !first_time(st, tx, format!("environment:{pid}:{}", e.slug)) {
            continue;
        }
        if let Some(project) = st.projects.get(&pid)
            && project.environment(&e.slug).is_none()
        {
            let mut project = project.clone();
            project.environments.push(Environment {
                id: e
                    .id
                    .clone()
                    .unwrap_or_else(|| derived("environment", &[&pid, &e.slug])),
                slug: e.slug.clone(),
                name: e.name.clone().unwrap_or_else(|| environment_name(&e.slug)),
            });
            project.updated_at = now;
            stage(st, tx, Record::Project(project));
        }
    }
    let Some(project) = st.projects.get(&pid).cloned() else {
        // Deleted from the data directory after an earlier seed: leave it.
        return Ok(pid);
    };
    let has_env = |slug: &str| project.environment(slug).is_some();

    let ensure_folder = |st: &mut State, tx: &mut Tx, env: &str, path: &str| {
        for folder in st.missing_folders(&pid, env, path) {
            stage(st, tx, Record::Folder(folder));
        }
    };

    for (env, folders) in &p.secrets {
        if !has_env(env) {
            continue;
        }
        for (raw_path, keys) in folders {
            let path = normalize_path(raw_path);
            ensure_folder(st, tx, env, &path);
            for (key, value) in keys {
                let id = derived("secret", &[&pid, env, &path, key]);
                if !first_time(st, tx, format!("secret:{id}"))
                    || st.find_secret(&pid, env, &path, key).is_some()
                {
                    continue;
                }
                stage(
                    st,
                    tx,
                    Record::Secret(Secret {
                        id,
                        project_id: pid.clone(),
                        environment: env.clone(),
                        path: path.clone(),
                        key: key.clone(),
                        value: value.value.clone(),
                        comment: value.comment.clone().unwrap_or_default(),
                        version: 1,
                        skip_multiline_encoding: false,
                        reminder_note: None,
                        reminder_repeat_days: None,
                        created_at: now,
                        updated_at: now,
                    }),
                );
            }
        }
    }

    for (env, folders) in &p.imports {
        if !has_env(env) {
            continue;
        }
        for (raw_path, list) in folders {
            let path = normalize_path(raw_path);
            ensure_folder(st, tx, env, &path);
            for (position, import) in list.iter().enumerate() {
                if !has_env(&import.environment) {
                    continue;
                }
                let import_path = normalize_path(&import.path);
                ensure_folder(st, tx, &import.environment, &import_path);
                let id = derived(
                    "import",
                    &[&pid, env, &path, &import.environment, &import_path],
                );
                if !first_time(st, tx, format!("import:{id}")) || st.imports.contains_key(&id) {
                    continue;
                }
                stage(
                    st,
                    tx,
                    Record::Import(Import {
                        id,
                        project_id: pid.clone(),
                        environment: env.clone(),
                        path: path.clone(),
                        position: u32::try_from(position).unwrap_or(u32::MAX),
                        import_environment: import.environment.clone(),
                        import_path,
                    }),
                );
            }
        }
    }

    for d in &p.dynamic_secrets {
        if !has_env(&d.environment) {
            continue;
        }
        let path = normalize_path(&d.path);
        ensure_folder(st, tx, &d.environment, &path);
        let id = d.id.clone().unwrap_or_else(|| {
            derived(
                "dynamic-secret",
                &[&pid, &d.environment, &path, &d.name.to_lowercase()],
            )
        });
        if !first_time(st, tx, format!("dynamic-secret:{id}"))
            || st.dynamic_secrets.contains_key(&id)
        {
            continue;
        }
        let (default_ttl, default_ms) = match &d.default_ttl {
            Some(t) => (t.text.clone(), durations::ms(t.duration)),
            None => (DEFAULT_LEASE_TTL.to_owned(), 3_600_000),
        };
        stage(
            st,
            tx,
            Record::DynamicSecret(DynamicSecret {
                id,
                project_id: pid.clone(),
                environment: d.environment.clone(),
                path,
                name: d.name.clone(),
                default_ttl,
                default_ttl_ms: default_ms,
                max_ttl: d.max_ttl.as_ref().map(|t| t.text.clone()),
                max_ttl_ms: d.max_ttl.as_ref().map(|t| durations::ms(t.duration)),
                created_at: now,
                updated_at: now,
            }),
        );
    }
    Ok(pid)
}

fn seed_identity(
    st: &mut State,
    tx: &mut Tx,
    i: &crate::seed::SeedIdentity,
    slug_to_id: &BTreeMap<String, String>,
) {
    let iid =
        i.id.clone()
            .unwrap_or_else(|| derived("identity", &[&i.name]));
    if first_time(st, tx, format!("identity:{iid}")) && !st.identities.contains_key(&iid) {
        stage(
            st,
            tx,
            Record::Identity(Identity {
                id: iid.clone(),
                name: i.name.clone(),
                projects: Vec::new(),
                path_scopes: BTreeMap::new(),
                universal_auth: i.universal_auth.as_ref().map(|ua| UniversalAuth {
                    client_id: ua
                        .client_id
                        .clone()
                        .unwrap_or_else(|| derived("client-id", &[&i.name])),
                    client_secret: ua.client_secret.clone(),
                    access_token_ttl: ua.access_token_ttl,
                    access_token_max_ttl: ua.access_token_max_ttl,
                }),
                kubernetes_auth: i.kubernetes_auth.as_ref().map(|k| KubernetesAuth {
                    allowed_namespaces: k.allowed_namespaces.0.clone(),
                    allowed_names: k.allowed_names.0.clone(),
                    // An empty audience means no audience check, as in the real
                    // API.
                    allowed_audience: k
                        .allowed_audience
                        .as_ref()
                        .map(|a| a.trim().to_owned())
                        .filter(|a| !a.is_empty()),
                    access_token_ttl: k.access_token_ttl,
                    access_token_max_ttl: k.access_token_max_ttl,
                }),
                ldap_auth: i.ldap_auth.as_ref().map(|l| LdapAuth {
                    username: l.username.trim().to_owned(),
                    password: l.password.trim().to_owned(),
                    access_token_ttl: l.access_token_ttl,
                    access_token_max_ttl: l.access_token_max_ttl,
                }),
                aws_auth: i.aws_auth.clone().map(Box::new),
                azure_auth: i.azure_auth.clone().map(Box::new),
                gcp_auth: i.gcp_auth.clone().map(Box::new),
            }),
        );
    }
    // Memberships added to the seed later are added to the identity.
    for m in &i.projects {
        let pid = slug_to_id
            .get(&m.project)
            .cloned()
            .unwrap_or_else(|| m.project.clone());
        if !first_time(st, tx, format!("membership:{iid}:{pid}")) {
            continue;
        }
        if let Some(identity) = st.identities.get(&iid)
            && !identity.projects.contains(&pid)
        {
            let mut identity = identity.clone();
            identity.projects.push(pid.clone());
            if let Some(paths) = &m.paths {
                identity
                    .path_scopes
                    .insert(pid, paths.iter().map(|p| normalize_path(p)).collect());
            }
            stage(st, tx, Record::Identity(identity));
        }
    }
}

fn seed_service_token(
    st: &mut State,
    tx: &mut Tx,
    t: &crate::seed::SeedServiceToken,
    slug_to_id: &BTreeMap<String, String>,
    now: i64,
) {
    let Some((id, secret)) = t.parts() else {
        return;
    };
    if !first_time(st, tx, format!("service-token:{id}")) || st.service_tokens.contains_key(id) {
        return;
    }
    let project_id = slug_to_id
        .get(&t.project)
        .cloned()
        .unwrap_or_else(|| t.project.clone());
    stage(
        st,
        tx,
        Record::ServiceToken(ServiceToken {
            id: id.to_owned(),
            name: t
                .name
                .clone()
                .unwrap_or_else(|| format!("service-token-{id}")),
            secret: secret.to_owned(),
            project_id,
            environment: t.environment.clone(),
            path: normalize_path(&t.path),
            permissions: t.permission_list(),
            created_at: now,
        }),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn below() {
        assert!(is_below("/a", "/"));
        assert!(!is_below("/", "/"));
        assert!(is_below("/a/b", "/a"));
        assert!(!is_below("/ab", "/a"));
        assert!(!is_below("/a", "/a"));
    }

    #[tokio::test]
    async fn auth_methods_scopes_and_service_tokens_are_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let seed = Seed::from_yaml(
            "projects: [{slug: p, environments: [dev]}]\n\
             identities: [{name: i, kubernetesAuth: {allowedNames: [app]}, \
               ldapAuth: {username: u, password: ' pw '}, projects: [{slug: p, paths: ['/a/**/']}]}]\n\
             serviceTokens: [{token: st.tid.sec.key, project: p, environment: dev, path: /a}]",
        )
        .expect("seed");
        let pid = derived("project", &["p"]);
        {
            let store = Store::open(Some(dir.path()), Duration::from_secs(5))
                .await
                .expect("open");
            let objects = store.apply_seed(&seed).await.expect("seed");
            assert!(
                objects
                    .iter()
                    .any(|o| o.kind == "service-token" && o.id == "tid"),
                "{objects:?}"
            );
            store.close().await;
        }
        let store = Store::open(Some(dir.path()), Duration::from_secs(5))
            .await
            .expect("reopen");
        let st = store.read().await;
        let identity = st.identities.values().next().expect("identity");
        assert_eq!(identity.path_scopes[&pid], ["/a/**"]);
        assert!(identity.may_use(&pid, "/a/b"));
        assert!(!identity.may_use(&pid, "/b"));
        assert!(identity.may_use("another-project", "/b"));
        let k8s = identity.kubernetes_auth.as_ref().expect("kubernetes auth");
        assert_eq!(k8s.allowed_names, ["app"]);
        assert!(k8s.allowed_namespaces.is_empty());
        assert_eq!(
            identity.ldap_auth.as_ref().map(|l| l.password.as_str()),
            Some("pw")
        );
        let token = &st.service_tokens["tid"];
        assert_eq!(
            (
                token.secret.as_str(),
                token.project_id.as_str(),
                token.path.as_str()
            ),
            ("sec", pid.as_str(), "/a")
        );
        assert_eq!(token.permissions, ["read"]);
    }

    #[tokio::test]
    async fn seed_is_create_if_absent_and_deletions_stick() {
        let dir = tempfile::tempdir().expect("tempdir");
        let seed = Seed::from_yaml(
            "projects: [{slug: p, environments: [dev], secrets: {dev: {/a: {K: v1, L: l}}}}]\n\
             identities: [{name: i, universalAuth: {clientSecret: s}, projects: [p]}]",
        )
        .expect("seed");
        let pid = derived("project", &["p"]);
        {
            let store = Store::open(Some(dir.path()), Duration::from_secs(5))
                .await
                .expect("open");
            let objects = store.apply_seed(&seed).await.expect("seed");
            assert!(objects.iter().any(|o| o.kind == "project" && o.id == pid));
            let mut st = store.write().await;
            let k = st.find_secret(&pid, "dev", "/a", "K").cloned().expect("K");
            let l = st.find_secret(&pid, "dev", "/a", "L").cloned().expect("L");
            assert!(st.folder_exists(&pid, "dev", "/a"));
            let mut tx = Tx::one(Record::Secret(Secret {
                value: "v2".into(),
                version: 2,
                ..k
            }));
            tx.delete(Kind::Secret, &l.id);
            store.commit(&mut st, tx).await.expect("commit");
            drop(st);
            store.close().await;
        }
        let store = Store::open(Some(dir.path()), Duration::from_secs(5))
            .await
            .expect("reopen");
        store.apply_seed(&seed).await.expect("seed again");
        let st = store.read().await;
        assert_eq!(
            st.find_secret(&pid, "dev", "/a", "K")
                .map(|s| s.value.as_str()),
            Some("v2")
        );
        assert!(st.find_secret(&pid, "dev", "/a", "L").is_none());
        let identity = st.identities.values().next().expect("identity");
        assert_eq!(identity.projects, std::slice::from_ref(&pid));
        assert_eq!(st.secrets.len(), 1);
    }
}
