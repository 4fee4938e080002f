//! The persistent cache on a real API server: a restart costs the KMS
//! nothing until resources are due, then conditional GETs answered 304 with
//! the persisted token; a deleted or corrupt cache degrades to a miss.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::PostParams;
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::harness::{self, TestNamespace, holds_for, wait_for};
use crate::support::{CLIENT_SECRET, DevServer, Operator, TempDir, create_credentials, seed};

const LIST: &str = "GET /api/v3/secrets/raw";
const LOGIN: &str = "POST /api/v1/auth/universal-auth/login";

async fn setup(client: &Client, ns: &str, kms: &DevServer, count: usize, interval: &str) {
    create_credentials(client, ns, "creds").await;
    let api = kms_secrets(client, ns);
    for i in 0..count {
        let o: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "secrets.hanzo.ai/v1alpha1", "kind": "KmsSecret",
            "metadata": {"name": format!("cr{i}")},
            "spec": {
                "hostAPI": kms.api(),
                "syncConfig": {"resyncInterval": interval},
                "authentication": {"universalAuth": {
                    "credentialsRef": {"secretName": "creds"},
                    "secretsScope": {"projectSlug": "demo", "envSlug": "dev", "secretsPath": "/"}
                }},
                "managedKubeSecretReferences": [{"secretName": format!("out{i}")}]
            }
        }))
        .unwrap();
        api.create(&PostParams::default(), &o).await.unwrap();
    }
}

/// The KmsSecrets of a namespace.
fn kms_secrets(client: &Client, ns: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("secrets.hanzo.ai", "v1alpha1", "KmsSecret"),
        "kmssecrets",
    );
    Api::namespaced_with(client.clone(), ns, &ar)
}

/// Now, in Unix milliseconds.
fn unix_ms_now() -> i64 {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    i64::try_from(since.as_millis()).unwrap()
}

/// resourceVersion of every managed Secret, once all `count` exist.
async fn synced(client: &Client, ns: &str, count: usize) -> BTreeMap<String, String> {
    let api = Api::<Secret>::namespaced(client.clone(), ns);
    wait_for(Duration::from_secs(60), || async {
        let list = api.list(&Default::default()).await.ok()?;
        let outs: BTreeMap<String, String> = list
            .items
            .iter()
            .filter(|s| {
                s.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with("out"))
            })
            .filter(|s| s.data.as_ref().is_some_and(|d| d.contains_key("A")))
            .map(|s| {
                (
                    s.metadata.name.clone().unwrap(),
                    s.metadata.resource_version.clone().unwrap(),
                )
            })
            .collect();
        (outs.len() == count).then_some(outs)
    })
    .await
    .expect("resources did not sync")
}

/// Wait until `count` KmsSecrets say `Ready` for their generation.
async fn all_ready(client: &Client, ns: &str, count: usize) {
    let api = kms_secrets(client, ns);
    let ready = wait_for(Duration::from_secs(60), || async {
        let list = api.list(&Default::default()).await.ok()?;
        let n = list
            .items
            .iter()
            .filter(|o| {
                let generation = o.metadata.generation;
                o.data["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| {
                        c["type"] == "Ready"
                            && c["status"] == "True"
                            && c["observedGeneration"].as_i64() == generation
                    })
            })
            .count();
        (n == count).then_some(())
    })
    .await;
    assert!(ready.is_some(), "not every KmsSecret is Ready");
}

fn write_key(dir: &TempDir) -> std::path::PathBuf {
    let path = dir.0.join("cache.key");
    let key: Vec<u8> = (0..32).map(|_| fastrand::u8(..)).collect();
    std::fs::write(&path, key).unwrap();
    path
}

#[tokio::test]
async fn a_restart_costs_the_kms_nothing() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "cache-restart").await;
    let kms = DevServer::start(&seed(&[("A", "top-secret-value-1")])).await;
    let dir = TempDir::new("cache");
    let key = write_key(&dir);
    let cache = dir.0.join("cache");
    let flags = [
        format!("--cache-dir={}", cache.display()),
        format!("--cache-encryption-key-file={}", key.display()),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    const N: usize = 20;
    let mut op = Operator::start(&ns.name, &[&ns.name], &flags).await;
    setup(&client, &ns.name, &kms, N, "40s").await;
    let before = synced(&client, &ns.name, N).await;
    // Every status written too (a Secret is written before its status): a
    // status still to write would be written after the restart.
    all_ready(&client, &ns.name, N).await;
    op.stop();
    let resources_before: BTreeMap<String, String> = {
        kms_secrets(&client, &ns.name)
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .map(|o| (o.name_any(), o.resource_version().unwrap_or_default()))
            .collect()
    };

    // Restart: nothing is due, so nothing is asked of the KMS.
    kms.reset_stats().await;
    let op = Operator::start(&ns.name, &[&ns.name], &flags).await;
    let held = holds_for(Duration::from_secs(10), || async {
        kms.count(LOGIN, None).await == 0 && kms.count(LIST, None).await == 0
    })
    .await;
    if let Err(when) = held {
        panic!(
            "logins or fetches after restart, {when}: {}",
            kms.stats().await
        );
    }
    assert_eq!(
        synced(&client, &ns.name, N).await,
        before,
        "Secrets were written after restart"
    );

    // When they are due: conditional GETs answered 304 (resources due at
    // about the same time share one), with the persisted token (no login),
    // and nothing written: no Secret, no status (not even `lastSyncTime`).
    let crs = kms_secrets(&client, &ns.name);
    let due = wait_for(Duration::from_secs(50), || async {
        let log = op.output.text();
        (0..N)
            .all(|i| {
                let me = format!("\"resource\":\"KmsSecret/{}/cr{i}\"", ns.name);
                log.lines().any(|l| {
                    l.contains("KMS steps of a sync timed")
                        && l.contains(&me)
                        && l.contains("\"decision\":\"Conditional\"")
                })
            })
            .then_some(())
    })
    .await;
    assert!(
        due.is_some(),
        "not every resource resynced: {}",
        kms.stats().await
    );
    // The last check's status write, if any, would show within this.
    let statuses = || async {
        crs.list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .map(|o| (o.name_any(), o.resource_version().unwrap_or_default()))
            .collect::<BTreeMap<String, String>>()
    };
    if let Err(when) = holds_for(Duration::from_secs(3), || async {
        statuses().await == resources_before
    })
    .await
    {
        let after = statuses().await;
        let log = op.output.text();
        for (name, rv) in &after {
            if resources_before.get(name) != Some(rv) {
                let me = format!("/{name}\"");
                for l in log.lines().filter(|l| l.contains(&me)) {
                    eprintln!("{name}: {l}");
                }
                let o = crs.get(name).await.unwrap();
                eprintln!("{name} now: {}", o.data["status"]);
            }
        }
        panic!(
            "a resync that found nothing new wrote the status, {when}: {:?} -> {:?}",
            resources_before, after
        );
    }
    assert!(
        kms.count(LIST, Some("304")).await >= 1,
        "no 304: {}",
        kms.stats().await
    );
    assert_eq!(
        kms.count(LIST, Some("200")).await,
        0,
        "full fetches: {}",
        kms.stats().await
    );
    assert_eq!(
        kms.count(LOGIN, None).await,
        0,
        "the persisted token was not reused"
    );
    assert_eq!(
        synced(&client, &ns.name, N).await,
        before,
        "Secrets were written at the 304 resync"
    );

    // The cache files hold no secret value and no credential in clear text.
    for entry in kms_testkit::files_below(&cache) {
        let bytes = std::fs::read(&entry).unwrap();
        for needle in ["top-secret-value-1", CLIENT_SECRET] {
            assert!(
                !bytes.windows(needle.len()).any(|w| w == needle.as_bytes()),
                "{} contains {needle:?}",
                entry.display()
            );
        }
    }
}

/// The value of key `A` in each managed Secret `out*`.
async fn values(client: &Client, ns: &str) -> BTreeMap<String, String> {
    Api::<Secret>::namespaced(client.clone(), ns)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|s| s.name_any().starts_with("out"))
        .map(|s| {
            let a = s.data.as_ref().and_then(|d| d.get("A"));
            let v = a.map(|b| String::from_utf8_lossy(&b.0).into_owned());
            (s.name_any(), v.unwrap_or_default())
        })
        .collect()
}

/// A scheduled resync of resources nothing touched since their last sync is
/// their folder's conditional request alone, without a reconcile each (by
/// ticket); what changes still reaches the targets: a new value in the KMS
/// at the next resync, a target edited or deleted at once.
#[tokio::test]
async fn resources_left_alone_resync_by_their_folders_answer_alone() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "cache-ticket").await;
    let kms = DevServer::start(&seed(&[("A", "v1")])).await;
    let dir = TempDir::new("cache");
    let cache = dir.0.join("cache");
    let flags = [format!("--cache-dir={}", cache.display())];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    const N: usize = 6;
    let op = Operator::start(&ns.name, &[&ns.name], &flags).await;
    setup(&client, &ns.name, &kms, N, "5s").await;
    let before = synced(&client, &ns.name, N).await;

    // The first sync writes, the first resync checks everything and
    // leaves a ticket, the resyncs after it go by ticket.
    let by_ticket = |log: &str, i: usize| {
        let me = format!("\"resource\":\"{}/cr{i}\"", ns.name);
        log.lines()
            .filter(|l| l.contains("resync by ticket") && l.contains(&me))
            .count()
    };
    let all = wait_for(Duration::from_secs(40), || async {
        let log = op.output.text();
        (0..N).all(|i| by_ticket(&log, i) >= 1).then_some(())
    })
    .await;
    assert!(
        all.is_some(),
        "not every resource resynced by ticket: {}",
        kms.stats().await
    );

    // Left alone: one conditional request per check of the folder (every
    // 5 s; its resources come due together), no login, nothing written.
    kms.reset_stats().await;
    let log_before = op.output.text();
    let rounds = wait_for(Duration::from_secs(20), || async {
        let log = op.output.text();
        (0..N)
            .all(|i| by_ticket(&log, i) >= by_ticket(&log_before, i) + 2)
            .then_some(())
    })
    .await;
    assert!(
        rounds.is_some(),
        "two more resyncs by ticket did not come: {}",
        kms.stats().await
    );
    let lists = kms.count(LIST, None).await;
    assert!(
        (2..=5).contains(&lists) && kms.count(LIST, Some("304")).await == lists,
        "{lists} requests for about three checks of one folder: {}",
        kms.stats().await
    );
    assert_eq!(kms.count(LOGIN, None).await, 0, "{}", kms.stats().await);
    assert_eq!(
        synced(&client, &ns.name, N).await,
        before,
        "Secrets were written"
    );

    // The cache's records moved on with the resyncs by ticket, so a restart
    // finds none of them overdue. The records themselves were last written
    // by the whole resync that issued the tickets, at least two rounds
    // (10 s) before this: unmoved, they would be due 10 s ago or more.
    let uids: Vec<String> = kms_secrets(&client, &ns.name)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|o| o.uid().unwrap())
        .collect();
    assert_eq!(uids.len(), N);
    let mut op = op;
    let stopping = unix_ms_now();
    op.stop();
    {
        let (store, _) = storage::Store::open(&cache, storage::Options::default()).unwrap();
        for uid in &uids {
            let storage::Lookup::Hit(record) = store.get_sync(uid) else {
                panic!("no cache record for {uid}");
            };
            let overdue_ms = stopping - record.next_due_unix_ms;
            assert!(
                overdue_ms < 7_500,
                "{uid} is due {overdue_ms} ms before the stop: its record did not move on"
            );
        }
    }
    let _op = Operator::start(&ns.name, &[&ns.name], &flags).await;

    // A new value in the KMS: the folder's answer has data, so the
    // resyncs are whole again, and every Secret has it at the next one.
    kms.set_secret("demo", "dev", "/", "A", "v2").await;
    let all_v2 = |v: &BTreeMap<String, String>| v.len() == N && v.values().all(|x| x == "v2");
    let changed = wait_for(Duration::from_secs(15), || async {
        let v = values(&client, &ns.name).await;
        all_v2(&v).then_some(v)
    })
    .await;
    assert!(
        changed.is_some(),
        "the change did not reach every Secret: {:?}",
        values(&client, &ns.name).await
    );

    // A target edited by hand is put back, a deleted one recreated (their
    // events queue a whole reconcile; a ticket never hides them).
    let secrets = Api::<Secret>::namespaced(client.clone(), &ns.name);
    let mut edited = secrets.get("out0").await.unwrap();
    edited.data.as_mut().unwrap().insert(
        "A".to_owned(),
        k8s_openapi::ByteString(b"tampered".to_vec()),
    );
    secrets
        .replace("out0", &PostParams::default(), &edited)
        .await
        .unwrap();
    secrets.delete("out1", &Default::default()).await.unwrap();
    let restored = wait_for(Duration::from_secs(15), || async {
        let v = values(&client, &ns.name).await;
        all_v2(&v).then_some(())
    })
    .await;
    assert!(
        restored.is_some(),
        "not restored: {:?}",
        values(&client, &ns.name).await
    );
}

#[tokio::test]
async fn a_lost_or_corrupt_cache_is_a_miss() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "cache-lost").await;
    let kms = DevServer::start(&seed(&[("A", "v1")])).await;
    let dir = TempDir::new("cache");
    let cache = dir.0.join("cache");
    let flags = [format!("--cache-dir={}", cache.display())];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    const N: usize = 5;
    let mut op = Operator::start(&ns.name, &[&ns.name], &flags).await;
    setup(&client, &ns.name, &kms, N, "1h").await;
    let before = synced(&client, &ns.name, N).await;
    op.stop();

    // Deleted cache: the status and the version annotations prove the
    // Secrets are current, and nothing is due: no KMS call.
    std::fs::remove_dir_all(&cache).unwrap();
    kms.reset_stats().await;
    let mut op = Operator::start(&ns.name, &[&ns.name], &flags).await;
    let held = holds_for(Duration::from_secs(8), || async {
        kms.count(LIST, None).await + kms.count(LOGIN, None).await == 0
    })
    .await;
    if let Err(when) = held {
        panic!("KMS calls without a cache, {when}: {}", kms.stats().await);
    }
    assert_eq!(synced(&client, &ns.name, N).await, before);
    op.stop();

    // Corrupt cache: one warning, rebuilt, and new work still converges.
    for f in kms_testkit::files_below(&cache) {
        if f.file_name().is_some_and(|n| n != "LOCK") {
            std::fs::write(&f, vec![0xAB; 4096]).unwrap();
        }
    }
    let op = Operator::start(&ns.name, &[&ns.name], &flags).await;
    setup_one_more(&client, &ns.name, &kms).await;
    let converged = wait_for(Duration::from_secs(30), || async {
        Api::<Secret>::namespaced(client.clone(), &ns.name)
            .get_opt("late")
            .await
            .ok()
            .flatten()
    })
    .await;
    assert!(
        converged.is_some(),
        "a new resource did not sync after the cache was corrupted"
    );
    let log = op.output.text();
    let warnings = log.matches("moved aside").count();
    assert_eq!(
        warnings, 1,
        "expected one warning about the rebuilt cache:\n{log}"
    );
}

async fn setup_one_more(client: &Client, ns: &str, kms: &DevServer) {
    let o: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "secrets.hanzo.ai/v1alpha1", "kind": "KmsSecret",
        "metadata": {"name": "late"},
        "spec": {
            "hostAPI": kms.api(),
            "authentication": {"universalAuth": {
                "credentialsRef": {"secretName": "creds"},
                "secretsScope": {"projectSlug": "demo", "envSlug": "dev", "secretsPath": "/"}
            }},
            "managedKubeSecretReferences": [{"secretName": "late"}]
        }
    }))
    .unwrap();
    kms_secrets(client, ns)
        .create(&PostParams::default(), &o)
        .await
        .unwrap();
}
