//! KmsDynamicSecret on a real API server with the dev KMS: leases created
//! once, renewed in time without touching the Secret, replaced at max TTL,
//! revoked on deletion, never leaked (also across crashes and failed status
//! writes).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::harness::{self, TestNamespace, holds_for, wait_for};
use crate::support::{CLIENT_ID, CLIENT_SECRET, DevServer, Operator, TempDir, create_credentials};

fn api(client: &Client, ns: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("secrets.hanzo.ai", "v1alpha1", "KmsDynamicSecret"),
        "kmsdynamicsecrets",
    );
    Api::namespaced_with(client.clone(), ns, &ar)
}

fn seed(default_ttl: &str, max_ttl: &str) -> String {
    format!(
        "projects:\n  - slug: demo\n    name: Demo\n    environments: [dev]\n    dynamicSecrets:\n      - name: db-creds\n        environment: dev\n        path: /\n        defaultTTL: {default_ttl}\n        maxTTL: {max_ttl}\n\
         identities:\n  - name: operator\n    universalAuth: {{clientId: {CLIENT_ID}, clientSecret: {CLIENT_SECRET}}}\n    projects: [demo]\n"
    )
}

async fn dev_server(default_ttl: &str, max_ttl: &str) -> DevServer {
    DevServer::start_with(&seed(default_ttl, max_ttl), &["--min-lease-ttl", "1s"]).await
}

async fn create(client: &Client, ns: &str, name: &str, host: &str, ttl: &str, revoke: bool) {
    let o: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "secrets.hanzo.ai/v1alpha1", "kind": "KmsDynamicSecret",
        "metadata": {"name": name},
        "spec": {
            "hostAPI": host,
            "authentication": {"universalAuth": {"credentialsRef": {"secretName": "creds"}}},
            "dynamicSecret": {"secretName": "db-creds", "projectSlug": "demo", "environmentSlug": "dev", "secretsPath": "/"},
            "leaseTTL": ttl,
            "leaseRevocationPolicy": if revoke { "Revoke" } else { "None" },
            "managedSecretReference": {"secretName": format!("{name}-creds"), "creationPolicy": "Owner"}
        }
    }))
    .unwrap();
    api(client, ns)
        .create(&PostParams::default(), &o)
        .await
        .expect("create KmsDynamicSecret");
}

async fn lease_of(client: &Client, ns: &str, name: &str) -> Option<(String, String)> {
    let o = api(client, ns).get(name).await.ok()?;
    let l = &o.data["status"]["lease"];
    Some((
        l["id"].as_str()?.to_owned(),
        l["expiresAt"].as_str()?.to_owned(),
    ))
}

fn data_of(s: &Secret) -> BTreeMap<String, String> {
    s.data
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8(v.0).unwrap()))
        .collect()
}

async fn secret(client: &Client, ns: &str, name: &str) -> Option<Secret> {
    Api::<Secret>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .ok()
        .flatten()
}

fn active_ids(leases: &[Value]) -> Vec<String> {
    leases
        .iter()
        .filter_map(|l| l["id"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn a_lease_is_created_once_and_renewed_without_touching_the_secret() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "dyn-renew").await;
    let kms = dev_server("1h", "24h").await;
    create_credentials(&client, &ns.name, "creds").await;
    let _op = Operator::start(&ns.name, &[&ns.name], &[]).await;
    create(&client, &ns.name, "db", &kms.api(), "6s", true).await;

    let s = wait_for(Duration::from_secs(30), || async {
        secret(&client, &ns.name, "db-creds")
            .await
            .filter(|s| data_of(s).contains_key("DB_PASSWORD"))
    })
    .await
    .expect("the Secret did not receive credentials");
    let (id, first_expiry) = lease_of(&client, &ns.name, "db")
        .await
        .expect("lease in status");
    assert_eq!(
        active_ids(&kms.leases(false).await),
        vec![id.clone()],
        "exactly one active lease"
    );
    let data = data_of(&s);
    assert!(data["DB_USERNAME"].starts_with("dev-"));
    assert_eq!(
        s.metadata
            .annotations
            .clone()
            .unwrap_or_default()
            .get("secrets.hanzo.ai/version"),
        Some(&format!("{id}-1"))
    );

    // Two renewals (6 s period, renewed at 50–70 %, never later than 2 s
    // before expiry): the expiry moves, the lease and the Secret do not.
    let renewed_twice = wait_for(Duration::from_secs(30), || async {
        let (lid, exp) = lease_of(&client, &ns.name, "db").await?;
        let gained = exp
            .parse::<k8s_openapi::jiff::Timestamp>()
            .ok()?
            .as_second()
            - first_expiry
                .parse::<k8s_openapi::jiff::Timestamp>()
                .ok()?
                .as_second();
        (lid == id && gained >= 12).then_some(())
    })
    .await;
    assert!(
        renewed_twice.is_some(),
        "the lease was not renewed twice: {:?}",
        lease_of(&client, &ns.name, "db").await
    );
    assert_eq!(
        active_ids(&kms.leases(false).await),
        vec![id.clone()],
        "still one lease, the same"
    );
    let now = secret(&client, &ns.name, "db-creds").await.unwrap();
    assert_eq!(
        now.metadata.resource_version, s.metadata.resource_version,
        "renewal touched the Secret"
    );
    let o = api(&client, &ns.name).get("db").await.unwrap();
    let renewal = o.data["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "secrets.hanzo.ai/LeaseRenewal")
        .cloned()
        .expect("LeaseRenewal condition");
    assert_eq!(renewal["status"], "True");
}

#[tokio::test]
async fn max_ttl_replaces_the_lease_and_revokes_the_old_one() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "dyn-max").await;
    let kms = dev_server("4s", "10s").await;
    create_credentials(&client, &ns.name, "creds").await;
    let op = Operator::start(&ns.name, &[&ns.name], &[]).await;
    create(&client, &ns.name, "db", &kms.api(), "4s", true).await;
    let first = wait_for(Duration::from_secs(30), || async {
        lease_of(&client, &ns.name, "db").await
    })
    .await
    .expect("first lease");
    let first_data = wait_for(Duration::from_secs(10), || async {
        secret(&client, &ns.name, "db-creds")
            .await
            .map(|s| data_of(&s))
            .filter(|d| !d.is_empty())
    })
    .await
    .unwrap();
    // Max TTL 10 s: before it, a new lease replaces the first.
    let second = wait_for(Duration::from_secs(30), || async {
        lease_of(&client, &ns.name, "db")
            .await
            .filter(|(id, _)| *id != first.0)
    })
    .await
    .expect("the lease was not replaced at max TTL");
    let updated = wait_for(Duration::from_secs(10), || async {
        secret(&client, &ns.name, "db-creds")
            .await
            .map(|s| data_of(&s))
            .filter(|d| *d != first_data)
    })
    .await;
    assert!(
        updated.is_some(),
        "the Secret did not get the new lease's credentials"
    );
    // The old lease is revoked after its grace: exactly one active lease.
    let one = wait_for(Duration::from_secs(20), || async {
        let active = active_ids(&kms.leases(false).await);
        (!active.contains(&first.0) && active.len() == 1).then_some(active)
    })
    .await;
    assert!(
        one.is_some(),
        "active leases: {:?}",
        kms.leases(false).await
    );
    let all = kms.leases(true).await;
    let old = all
        .iter()
        .find(|l| l["id"] == first.0.as_str())
        .expect("old lease known");
    assert_eq!(
        old["state"],
        "revoked",
        "the old lease was left to expire, not revoked: {old}\n{}",
        op.output.text()
    );
    let _ = second;
}

#[tokio::test]
async fn deletion_revokes_even_after_an_outage_and_crashes_never_reissue() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "dyn-del").await;
    let kms = dev_server("1h", "24h").await;
    create_credentials(&client, &ns.name, "creds").await;
    let mut op = Some(Operator::start(&ns.name, &[&ns.name], &[]).await);
    create(&client, &ns.name, "db", &kms.api(), "20s", true).await;
    // The first sync is complete: the lease is recorded and the Secret holds
    // its credentials. (A replica killed between recording a lease and
    // writing the Secret leaves a lease whose credentials nobody has: the
    // next one creates another and retires that one, by design.)
    let (id, _) = wait_for(Duration::from_secs(30), || async {
        let (id, exp) = lease_of(&client, &ns.name, "db").await?;
        let s = secret(&client, &ns.name, "db-creds").await?;
        let version = s
            .metadata
            .annotations?
            .get("secrets.hanzo.ai/version")?
            .clone();
        version.starts_with(&format!("{id}-")).then_some((id, exp))
    })
    .await
    .expect("lease in the Secret");

    // Kill -9 and restart ten times: the lease is reused, never re-issued.
    let mut logs = Vec::new();
    for _ in 0..10 {
        if let Some(old) = op.take() {
            logs.push(old.output.clone());
        }
        op = Some(Operator::start(&ns.name, &[&ns.name], &[]).await);
        let held = holds_for(Duration::from_millis(1500), || async {
            active_ids(&kms.leases(false).await).len() <= 1
        })
        .await;
        if let Err(when) = held {
            let active = active_ids(&kms.leases(false).await);
            logs.extend(op.as_ref().map(|o| o.output.clone()));
            let text: Vec<String> = logs
                .iter()
                .map(|l| {
                    l.text()
                        .lines()
                        .filter(|l| l.contains("lease") || l.contains("WARN"))
                        .collect::<Vec<_>>()
                        .join("\n")
                })
                .collect();
            panic!(
                "leases re-issued, {when}: {active:?}\n{}",
                text.join("\n----\n")
            );
        }
    }
    let held = holds_for(Duration::from_secs(3), || async {
        lease_of(&client, &ns.name, "db")
            .await
            .map(|l| l.0)
            .as_ref()
            == Some(&id)
            && active_ids(&kms.leases(false).await) == [id.clone()]
    })
    .await;
    if let Err(when) = held {
        panic!(
            "the lease changed, {when}: status {:?}, active {:?}, was {id}",
            lease_of(&client, &ns.name, "db").await,
            active_ids(&kms.leases(false).await)
        );
    }

    // Delete while the KMS is down: the resource waits for the KMS.
    kms.fault(json!({"outage": true})).await;
    api(&client, &ns.name)
        .delete("db", &DeleteParams::default())
        .await
        .unwrap();
    let held = holds_for(Duration::from_secs(6), || async {
        api(&client, &ns.name)
            .get_opt("db")
            .await
            .unwrap()
            .is_some()
    })
    .await;
    if let Err(when) = held {
        panic!("deleted before the lease was revoked, {when}");
    }
    kms.clear_faults().await;
    let gone = wait_for(Duration::from_secs(40), || async {
        api(&client, &ns.name)
            .get_opt("db")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    assert!(
        gone.is_some(),
        "the resource was not released after the KMS came back"
    );
    assert!(
        kms.leases(false).await.is_empty(),
        "leases left: {:?}",
        kms.leases(false).await
    );
}

#[tokio::test]
async fn a_failed_status_write_revokes_the_new_lease() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "dyn-vap").await;
    let kms = dev_server("1h", "24h").await;
    create_credentials(&client, &ns.name, "creds").await;
    // An admission policy refuses any status that records a lease.
    let policy = format!("deny-lease-{}", ns.name);
    let vap: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": policy},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": ["secrets.hanzo.ai"], "apiVersions": ["v1alpha1"],
                "operations": ["UPDATE"], "resources": ["kmsdynamicsecrets/status"]
            }]},
            "validations": [{"expression": "!has(object.status) || !has(object.status.lease)", "message": "test: lease status refused"}]
        }
    }))
    .unwrap();
    let binding: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": policy},
        "spec": {
            "policyName": policy,
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns.name}}}
        }
    }))
    .unwrap();
    let gvk = |kind: &str| {
        ApiResource::from_gvk(&GroupVersionKind::gvk(
            "admissionregistration.k8s.io",
            "v1",
            kind,
        ))
    };
    let vaps: Api<DynamicObject> = Api::all_with(client.clone(), &gvk("ValidatingAdmissionPolicy"));
    let bindings: Api<DynamicObject> =
        Api::all_with(client.clone(), &gvk("ValidatingAdmissionPolicyBinding"));
    vaps.create(&PostParams::default(), &vap)
        .await
        .expect("policy");
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .expect("binding");
    // The API server enforces a new policy a moment later: once it refuses
    // a status with a lease (a dry run on a resource of its own, gone
    // before the operator starts).
    create(&client, &ns.name, "probe", &kms.api(), "1h", false).await;
    let probe_status = json!({"status": {"lease": {
        "id": "probe", "version": 1,
        "creationTimestamp": "2026-01-01T00:00:00Z", "expiresAt": "2026-01-01T01:00:00Z"
    }}});
    let dry_run = PatchParams {
        dry_run: true,
        ..PatchParams::default()
    };
    let enforced = wait_for(Duration::from_secs(30), || async {
        match api(&client, &ns.name)
            .patch_status("probe", &dry_run, &Patch::Merge(&probe_status))
            .await
        {
            Err(kube::Error::Api(e)) if e.message.contains("test: lease status refused") => {
                Some(())
            }
            _ => None,
        }
    })
    .await;
    assert!(enforced.is_some(), "the admission policy was not enforced");
    api(&client, &ns.name)
        .delete("probe", &DeleteParams::default())
        .await
        .unwrap();

    let _op = Operator::start(&ns.name, &[&ns.name], &[]).await;
    create(&client, &ns.name, "db", &kms.api(), "1h", true).await;
    // The attempt creates a lease and revokes it right away: none stays
    // active. A refused write is not something retrying soon fixes: the
    // resource waits for a change (or its resync interval).
    let attempted = wait_for(Duration::from_secs(30), || async {
        let all = kms.leases(true).await;
        (!all.is_empty() && all.iter().all(|l| l["state"] == "revoked")).then_some(())
    })
    .await;
    assert!(
        attempted.is_some(),
        "leases not revoked: {:?}",
        kms.leases(true).await
    );
    assert!(
        secret(&client, &ns.name, "db-creds").await.is_none(),
        "credentials reached the Secret"
    );

    // The policy goes; a change of the resource sends it round again and
    // the credentials arrive (touched until the API server has dropped the
    // policy: each refused attempt waits for the next change).
    let _ = vaps.delete(&policy, &Default::default()).await;
    let _ = bindings.delete(&policy, &Default::default()).await;
    let mut touch = 0;
    let synced = wait_for(Duration::from_secs(60), || {
        touch += 1;
        let (client, ns) = (client.clone(), ns.name.clone());
        async move {
            if secret(&client, &ns, "db-creds").await.is_some() {
                return Some(());
            }
            if touch % 20 == 0 {
                let _ = api(&client, &ns)
                    .patch(
                        "db",
                        &PatchParams::default(),
                        &Patch::Merge(
                            json!({"metadata": {"annotations": {"test/touch": touch.to_string()}}}),
                        ),
                    )
                    .await;
            }
            None
        }
    })
    .await;
    assert!(
        synced.is_some(),
        "a change after the policy went did not bring the credentials"
    );
    let _ = api(&client, &ns.name)
        .patch(
            "db",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"secrets.hanzo.ai/skip-cleanup": "true"}}}),
            ),
        )
        .await;
}

/// A graceful stop while the KMS answers lease creations with `429`: the
/// creation gives its worker back instead of waiting the pause out (the
/// resource says it waits), so the replica stops at once; no lease is
/// created for a shard being given up, and every lease alive in the KMS is
/// one a status records. (The chaos suite's seed 7 leaked a lease created
/// after a stopping replica's shards were released, whose revocation then
/// waited on a 429 until the process was gone.)
#[tokio::test]
async fn a_graceful_stop_during_a_429_leaks_no_lease() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "dyn-stop-429").await;
    let kms = dev_server("1h", "24h").await;
    create_credentials(&client, &ns.name, "creds").await;
    // One lease creation a minute: the first is made, the next is refused
    // with a Retry-After of up to a minute.
    kms.fault(json!({"route": "POST /api/v1/dynamic-secrets/leases", "rateLimitPerMinute": 1}))
        .await;
    let mut op = Operator::start(&ns.name, &[&ns.name], &[]).await;
    create(&client, &ns.name, "first", &kms.api(), "", true).await;
    wait_for(Duration::from_secs(30), || async {
        lease_of(&client, &ns.name, "first").await
    })
    .await
    .expect("the first lease");
    // The second creation gets the 429; the third meets the pause it set.
    // Neither waits the pause out in its worker: both say they wait.
    for name in ["second", "third"] {
        create(&client, &ns.name, name, &kms.api(), "", true).await;
        let refused = wait_for(Duration::from_secs(30), || async {
            let o = api(&client, &ns.name).get(name).await.ok()?;
            let ready = o.data["status"]["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == "Ready")?
                .clone();
            (ready["reason"] == "KMSRateLimited").then_some(ready["message"].clone())
        })
        .await;
        let Some(refused) = refused else {
            let status = api(&client, &ns.name)
                .get(name)
                .await
                .map(|o| o.data["status"].clone());
            panic!("the refused creation of {name} was not reported: {status:?}");
        };
        assert!(
            refused
                .as_str()
                .is_some_and(|m| m.contains("waits for its Retry-After")),
            "{name}: {refused}"
        );
    }
    let stopping = std::time::Instant::now();
    op.stop();
    let took = stopping.elapsed();
    assert!(took < Duration::from_secs(10), "the stop took {took:?}");
    let recorded: Vec<String> = [
        lease_of(&client, &ns.name, "first").await,
        lease_of(&client, &ns.name, "second").await,
        lease_of(&client, &ns.name, "third").await,
    ]
    .into_iter()
    .flatten()
    .map(|(id, _)| id)
    .collect();
    let mut active = active_ids(&kms.leases(false).await);
    active.sort();
    let mut recorded = recorded;
    recorded.sort();
    assert_eq!(
        active, recorded,
        "a lease alive in the KMS is recorded nowhere"
    );
    kms.clear_faults().await;
}

#[tokio::test]
async fn a_lease_created_before_a_crash_and_never_recorded_is_revoked_after_the_restart() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "dyn-pending").await;
    let kms = dev_server("1h", "24h").await;
    create_credentials(&client, &ns.name, "creds").await;
    let dir = TempDir::new("dyn-cache");
    let cache = dir.0.join("cache");
    let flag = format!("--cache-dir={}", cache.display());
    let mut op = Operator::start(&ns.name, &[&ns.name], &[&flag]).await;
    create(&client, &ns.name, "db", &kms.api(), "1h", true).await;
    let (recorded, _) = wait_for(Duration::from_secs(30), || {
        lease_of(&client, &ns.name, "db")
    })
    .await
    .expect("a lease recorded");
    op.stop();

    // What a replica killed between creating a lease and writing the status
    // leaves: a lease the KMS holds and the status does not name, remembered
    // in the replica's cache.
    let http = reqwest::Client::new();
    let token = kms_testkit::api::login(&http, &kms.api(), CLIENT_ID, CLIENT_SECRET)
        .await
        .unwrap();
    let created: Value = http
        .post(format!("{}/v1/dynamic-secrets/leases", kms.api()))
        .bearer_auth(&token)
        .json(
            &json!({"dynamicSecretName": "db-creds", "projectSlug": "demo",
            "environmentSlug": "dev", "path": "/", "ttl": "1h"}),
        )
        .send()
        .await
        .unwrap()
        .error_for_status()
        .unwrap()
        .json()
        .await
        .unwrap();
    let orphan = created["lease"]["id"].as_str().unwrap().to_owned();
    let expires: k8s_openapi::jiff::Timestamp = created["lease"]["expireAt"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let uid = api(&client, &ns.name)
        .get("db")
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    {
        let (store, _) = storage::Store::open(&cache, storage::Options::default()).unwrap();
        let record = storage::LeaseRecord {
            lease_id: orphan.clone(),
            version: 1,
            expires_at_unix_ms: expires.as_millisecond(),
        };
        store.put_lease(&uid, &record).unwrap();
        store.flush().unwrap();
    }
    let mut active = active_ids(&kms.leases(false).await);
    active.sort();
    let mut both = vec![recorded.clone(), orphan.clone()];
    both.sort();
    assert_eq!(active, both);

    // The restart revokes it, says so, and keeps the recorded lease.
    let _op = Operator::start(&ns.name, &[&ns.name], &[&flag]).await;
    let revoked = wait_for(Duration::from_secs(30), || async {
        (active_ids(&kms.leases(false).await) == [recorded.clone()]).then_some(())
    })
    .await;
    assert!(
        revoked.is_some(),
        "the unrecorded lease {orphan} is still active: {:?}",
        kms.leases(false).await
    );
    let note = harness::wait_event(
        &client,
        &ns.name,
        "db",
        "UnrecordedLeaseRevoked",
        Duration::from_secs(10),
    )
    .await;
    assert!(note.contains(&orphan), "{note}");
    assert_eq!(
        lease_of(&client, &ns.name, "db").await.map(|l| l.0),
        Some(recorded)
    );
}

/// `secrets.hanzo.ai/force-sync` on a KmsDynamicSecret: the lease is
/// checked with the KMS at once (one renewal, the same lease, the Secret
/// untouched) and the status records the value handled.
#[tokio::test]
async fn force_sync_renews_the_lease_at_once() {
    const RENEW: &str = "POST /api/v1/dynamic-secrets/leases/:leaseId/renew";
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "dyn-force").await;
    let kms = dev_server("1h", "24h").await;
    create_credentials(&client, &ns.name, "creds").await;
    let _op = Operator::start(&ns.name, &[&ns.name], &[]).await;
    create(&client, &ns.name, "db", &kms.api(), "1h", true).await;
    let s = wait_for(Duration::from_secs(30), || async {
        secret(&client, &ns.name, "db-creds")
            .await
            .filter(|s| data_of(s).contains_key("DB_PASSWORD"))
    })
    .await
    .expect("the Secret did not receive credentials");
    let (id, first_expiry) = lease_of(&client, &ns.name, "db").await.unwrap();
    kms.reset_stats().await;
    let resources = api(&client, &ns.name);
    crate::force_sync::force(&resources, "db", "one").await;
    crate::force_sync::wait_handled(&resources, "db", "one").await;
    assert_eq!(
        kms.count(RENEW, Some("200")).await,
        1,
        "{}",
        kms.stats().await
    );
    let (now_id, expiry) = lease_of(&client, &ns.name, "db").await.unwrap();
    assert_eq!(now_id, id, "the same lease");
    assert!(expiry >= first_expiry, "{expiry} < {first_expiry}");
    let now = secret(&client, &ns.name, "db-creds").await.unwrap();
    assert_eq!(
        now.metadata.resource_version, s.metadata.resource_version,
        "the renewal touched the Secret"
    );
}
