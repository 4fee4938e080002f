//! The workload: per namespace a KmsSecret of its own folder, a KmsSecret
//! of a folder shared by all namespaces, a KmsPushSecret and a
//! KmsDynamicSecret; the KMS seed behind them; the churn that keeps
//! changing values; and the comparison of every object with the KMS.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Secret;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::core::DynamicObject;
use kube::{Api, Client};
use serde_json::json;

use crate::checkers::data::{Poll, diff};
use crate::history::now_ms;
use crate::kms::{CLIENT_ID, CLIENT_SECRET, DevServer, ENV, PROJECT};
use crate::recorders::{recorded_leases, resource};
use crate::rng::Rng;

/// Keys of each namespace's own folder.
pub const APP_KEYS: usize = 3;
/// Keys of the shared folder.
pub const SHARED_KEYS: usize = 4;
/// Keys of each push source.
pub const PUSH_KEYS: usize = 2;
/// The shared folder.
pub const SHARED: &str = "/shared";

/// Timing of the workload's resources.
#[derive(Clone, Debug)]
pub struct Timing {
    /// KmsSecret `syncConfig.resyncInterval`.
    pub resync: String,
    /// KmsPushSecret `resyncInterval`.
    pub push_resync: String,
    /// KmsDynamicSecret `leaseTTL` (also the dynamic secret's default TTL).
    pub lease_ttl: String,
    /// The dynamic secret's max TTL.
    pub lease_max_ttl: String,
}

/// The folder of namespace `ns`.
pub fn app_folder(ns: &str) -> String {
    format!("/apps/{ns}")
}

/// The push destination of namespace `ns`.
pub fn push_folder(ns: &str) -> String {
    format!("/pushed/{ns}")
}

/// What the KMS holds in the folders the KmsSecrets read (the runner is
/// their only writer).
#[derive(Clone, Debug, Default)]
pub struct Model {
    /// Folder → key → value.
    pub folders: BTreeMap<String, BTreeMap<String, String>>,
    counter: u64,
}

impl Model {
    /// A fresh value.
    pub fn value(&mut self, rng: &mut Rng) -> String {
        self.counter += 1;
        format!("v{}-{:08x}", self.counter, rng.next_u64() as u32)
    }
}

/// The initial model and the seed file of the dev server.
pub fn seed(namespaces: &[String], timing: &Timing, rng: &mut Rng) -> (Model, String) {
    let mut model = Model::default();
    let mut shared = BTreeMap::new();
    for i in 0..SHARED_KEYS {
        shared.insert(format!("S{i}"), model.value(rng));
    }
    model.folders.insert(SHARED.to_owned(), shared);
    for ns in namespaces {
        let mut f = BTreeMap::new();
        for i in 0..APP_KEYS {
            f.insert(format!("K{i}"), model.value(rng));
        }
        model.folders.insert(app_folder(ns), f);
    }
    let mut y = format!(
        "projects:\n  - slug: {PROJECT}\n    name: Chaos\n    environments: [{ENV}]\n    secrets:\n      {ENV}:\n"
    );
    for (folder, keys) in &model.folders {
        y.push_str(&format!("        {folder}:\n"));
        for (k, v) in keys {
            y.push_str(&format!("          {k}: \"{v}\"\n"));
        }
    }
    y.push_str(&format!(
        "    dynamicSecrets:\n      - name: db-creds\n        environment: {ENV}\n        path: /\n        \
         defaultTTL: {}\n        maxTTL: {}\n",
        timing.lease_ttl, timing.lease_max_ttl
    ));
    y.push_str(&format!(
        "identities:\n  - name: operator\n    universalAuth: {{clientId: {CLIENT_ID}, clientSecret: \
         {CLIENT_SECRET}, accessTokenTTL: 7200, accessTokenMaxTTL: 86400}}\n    projects: [{PROJECT}]\n"
    ));
    (model, y)
}

fn auth() -> serde_json::Value {
    json!({"universalAuth": {"credentialsRef": {"secretName": "kms-credentials"}}})
}

fn scoped_auth(path: &str) -> serde_json::Value {
    json!({"universalAuth": {
        "credentialsRef": {"secretName": "kms-credentials"},
        "secretsScope": {"projectSlug": PROJECT, "envSlug": ENV, "secretsPath": path}
    }})
}

async fn create(
    client: &Client,
    ns: &str,
    kind: &str,
    plural: &str,
    body: serde_json::Value,
) -> anyhow::Result<()> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &resource(kind, plural));
    let mut body = body;
    body["apiVersion"] = json!("secrets.hanzo.ai/v1alpha1");
    body["kind"] = json!(kind);
    let obj: DynamicObject = serde_json::from_value(body)?;
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Create the credentials, the push sources and the four resources of each
/// namespace.
pub async fn create_all(
    client: &Client,
    namespaces: &[String],
    api: &str,
    timing: &Timing,
    rng: &mut Rng,
) -> anyhow::Result<()> {
    for ns in namespaces {
        let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
        let creds: Secret = serde_json::from_value(json!({
            "metadata": {"name": "kms-credentials"},
            "stringData": {"clientId": CLIENT_ID, "clientSecret": CLIENT_SECRET}
        }))?;
        let mut src = BTreeMap::new();
        for i in 0..PUSH_KEYS {
            src.insert(format!("P{i}"), format!("p0-{:08x}", rng.next_u64() as u32));
        }
        let source: Secret = serde_json::from_value(json!({
            "metadata": {"name": "push-src"}, "stringData": src
        }))?;
        for s in [creds, source] {
            match secrets.create(&PostParams::default(), &s).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
        }
        create(client, ns, "KmsSecret", "kmssecrets", json!({
            "metadata": {"name": "app"},
            "spec": {
                "hostAPI": api,
                "syncConfig": {"resyncInterval": timing.resync},
                "authentication": scoped_auth(&app_folder(ns)),
                "managedKubeSecretReferences": [{"secretName": "app-out", "creationPolicy": "Owner"}]
            }
        }))
        .await?;
        create(client, ns, "KmsSecret", "kmssecrets", json!({
            "metadata": {"name": "shared"},
            "spec": {
                "hostAPI": api,
                "syncConfig": {"resyncInterval": timing.resync},
                "authentication": scoped_auth(SHARED),
                "managedKubeSecretReferences": [{"secretName": "shared-out", "creationPolicy": "Orphan"}]
            }
        }))
        .await?;
        create(client, ns, "KmsPushSecret", "kmspushsecrets", json!({
            "metadata": {"name": "push"},
            "spec": {
                "hostAPI": api,
                "resyncInterval": timing.push_resync,
                "destination": {"projectSlug": PROJECT, "environmentSlug": ENV, "secretsPath": push_folder(ns)},
                "authentication": auth(),
                "push": {"secret": {"secretName": "push-src"}}
            }
        }))
        .await?;
        create(client, ns, "KmsDynamicSecret", "kmsdynamicsecrets", json!({
            "metadata": {"name": "db"},
            "spec": {
                "hostAPI": api,
                "authentication": auth(),
                "dynamicSecret": {"secretName": "db-creds", "projectSlug": PROJECT, "environmentSlug": ENV, "secretsPath": "/"},
                "leaseTTL": timing.lease_ttl,
                "leaseRevocationPolicy": "Revoke",
                "managedSecretReference": {"secretName": "db-out", "creationPolicy": "Owner"}
            }
        }))
        .await?;
    }
    Ok(())
}

/// One change: a key of a namespace's folder, of the shared folder, or of
/// a push source. Returns what was changed.
pub async fn churn_once(
    client: &Client,
    kms: &DevServer,
    namespaces: &[String],
    model: &mut Model,
    rng: &mut Rng,
) -> anyhow::Result<String> {
    let roll = rng.below(100);
    let ns = &namespaces[rng.below(namespaces.len() as u64) as usize];
    if roll < 45 {
        let key = format!("K{}", rng.below(APP_KEYS as u64));
        let value = model.value(rng);
        let folder = app_folder(ns);
        kms.put_secret(&folder, &key, &value).await?;
        model
            .folders
            .entry(folder.clone())
            .or_default()
            .insert(key.clone(), value);
        Ok(format!("{folder}/{key}"))
    } else if roll < 55 {
        let key = format!("S{}", rng.below(SHARED_KEYS as u64));
        let value = model.value(rng);
        kms.put_secret(SHARED, &key, &value).await?;
        model
            .folders
            .entry(SHARED.to_owned())
            .or_default()
            .insert(key.clone(), value);
        Ok(format!("{SHARED}/{key}"))
    } else {
        push_change(
            client,
            ns,
            &format!("P{}", rng.below(PUSH_KEYS as u64)),
            &model.value(rng),
        )
        .await?;
        Ok(format!("{ns}/push-src"))
    }
}

/// Change one key of the push source of `ns`.
pub async fn push_change(client: &Client, ns: &str, key: &str, value: &str) -> anyhow::Result<()> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    secrets
        .patch(
            "push-src",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {key: value}})),
        )
        .await?;
    Ok(())
}

/// A final change to every object: one key of every folder and of every
/// push source, so convergence measures real propagation.
pub async fn change_everything(
    client: &Client,
    kms: &DevServer,
    namespaces: &[String],
    model: &mut Model,
    rng: &mut Rng,
) -> anyhow::Result<()> {
    let folders: Vec<String> = model.folders.keys().cloned().collect();
    for folder in folders {
        let key = if folder == SHARED { "S0" } else { "K0" };
        let value = model.value(rng);
        kms.put_secret(&folder, key, &value).await?;
        model
            .folders
            .entry(folder)
            .or_default()
            .insert(key.to_owned(), value);
    }
    for ns in namespaces {
        let v = model.value(rng);
        push_change(client, ns, "P0", &v).await?;
    }
    Ok(())
}

fn text_map(s: &Secret) -> BTreeMap<String, String> {
    s.data
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
        .collect()
}

/// Compare every object with what the KMS holds: the two KmsSecret targets
/// with the model, each push destination with its source Secret, each
/// dynamic Secret with the credentials of the lease its status records.
pub async fn poll(
    client: &Client,
    kms: &DevServer,
    namespaces: &[String],
    model: &Model,
) -> anyhow::Result<Poll> {
    let at = now_ms();
    let set: BTreeSet<String> = namespaces.iter().cloned().collect();
    let managed = Api::<Secret>::all(client.clone())
        .list(&kube::api::ListParams::default().labels("secrets.hanzo.ai/managed=true"))
        .await?;
    let sources = Api::<Secret>::all(client.clone())
        .list(&kube::api::ListParams::default().fields("metadata.name=push-src"))
        .await?;
    let mut actual: BTreeMap<(String, String), BTreeMap<String, String>> = BTreeMap::new();
    for s in managed.items.iter().chain(&sources.items) {
        let ns = s.metadata.namespace.clone().unwrap_or_default();
        if set.contains(&ns) {
            actual.insert(
                (ns, s.metadata.name.clone().unwrap_or_default()),
                text_map(s),
            );
        }
    }
    let statuses = recorded_leases(client, &set).await?;
    let leases: BTreeMap<String, BTreeMap<String, String>> = kms
        .leases()
        .await?
        .into_iter()
        .map(|l| (l.lease.id, l.data))
        .collect();
    let pushed = kms.list_tree("/pushed").await?;
    let mut mismatched = Vec::new();
    let mut checked = 0;
    let empty = BTreeMap::new();
    for ns in namespaces {
        let get = |name: &str| actual.get(&(ns.clone(), name.to_owned()));
        let id = statuses
            .get(&format!("KmsDynamicSecret/{ns}/db"))
            .and_then(|r| r.current.clone());
        let lease = id.as_ref().and_then(|id| leases.get(id));
        let pairs = [
            (
                format!("{ns}/app-out"),
                model.folders.get(&app_folder(ns)),
                get("app-out"),
            ),
            (
                format!("{ns}/shared-out"),
                model.folders.get(SHARED),
                get("shared-out"),
            ),
            (
                format!("KMS {}", push_folder(ns)),
                Some(get("push-src").unwrap_or(&empty)),
                pushed.get(&push_folder(ns)),
            ),
            (format!("{ns}/db-out"), lease, get("db-out")),
        ];
        for (what, wanted, got) in pairs {
            checked += 1;
            let why = match wanted {
                Some(w) => diff(w, got),
                None => Some(format!(
                    "the recorded lease {} is not active",
                    id.as_deref().unwrap_or("(none)")
                )),
            };
            if let Some(why) = why {
                mismatched.push(format!("{what}: {why}"));
            }
        }
    }
    Ok(Poll {
        at,
        checked,
        mismatched,
    })
}

/// Delete every KmsDynamicSecret of the run; returns their ids.
pub async fn delete_dynamic(client: &Client, namespaces: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for ns in namespaces {
        let api: Api<DynamicObject> = Api::namespaced_with(
            client.clone(),
            ns,
            &resource("KmsDynamicSecret", "kmsdynamicsecrets"),
        );
        for _ in 0..5 {
            match api.delete("db", &DeleteParams::default()).await {
                Ok(_) => break,
                Err(kube::Error::Api(e)) if e.code == 404 => break,
                Err(_) => tokio::time::sleep(std::time::Duration::from_secs(1)).await,
            }
        }
        out.push(format!("KmsDynamicSecret/{ns}/db"));
    }
    out
}

/// How many KmsDynamicSecrets of the run still exist.
pub async fn dynamic_left(client: &Client, namespaces: &[String]) -> anyhow::Result<usize> {
    let set: BTreeSet<String> = namespaces.iter().cloned().collect();
    Ok(recorded_leases(client, &set).await?.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seed_names_every_folder_and_is_reproducible() {
        let ns = vec!["a".to_owned(), "b".to_owned()];
        let t = Timing {
            resync: "20s".into(),
            push_resync: "30s".into(),
            lease_ttl: "30s".into(),
            lease_max_ttl: "90s".into(),
        };
        let (m1, y1) = seed(&ns, &t, &mut Rng::new(3));
        let (_, y2) = seed(&ns, &t, &mut Rng::new(3));
        assert_eq!(y1, y2);
        assert_eq!(m1.folders.len(), 3);
        assert!(y1.contains("/apps/a:"));
        assert!(y1.contains("maxTTL: 90s"));
        assert_eq!(m1.folders["/shared"].len(), SHARED_KEYS);
    }
}
