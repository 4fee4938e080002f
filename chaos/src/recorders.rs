//! Background recorders: a watch on the shard Leases, a watch on managed
//! Secrets, the KMS request counter and the dynamic-lease snapshots. Each
//! appends to the shared [`History`]; none judges anything.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::task::JoinHandle;

use crate::history::{
    BudgetSample, History, LeaseObs, LeaseSnapshot, Ms, RecordedLeases, SecretObs, now_ms,
};
use crate::kms::DevServer;

/// Retry a failed watch every 200 ms: the recorders must come back as soon
/// as the API server does, or they miss changes.
struct Every(Duration);

impl Iterator for Every {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(self.0)
    }
}

impl kube::runtime::utils::Backoff for Every {
    fn reset(&mut self) {}
}

/// The API resource of a kind of ours.
pub fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("secrets.hanzo.ai", "v1alpha1", kind),
        plural,
    )
}

fn ms(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime) -> Ms {
    t.0.as_millisecond()
}

fn lease_obs(l: &Lease, prefix: &str, after_gap: bool, deleted: bool) -> Option<LeaseObs> {
    let shard: u32 = l
        .metadata
        .name
        .as_deref()?
        .strip_prefix(prefix)?
        .parse()
        .ok()?;
    let spec = l.spec.clone().unwrap_or_default();
    Some(LeaseObs {
        observed: now_ms(),
        shard,
        holder: spec.holder_identity.filter(|h| !h.is_empty()),
        acquire: spec.acquire_time.as_ref().map(ms),
        renew: spec.renew_time.as_ref().map(ms),
        duration_s: spec
            .lease_duration_seconds
            .and_then(|d| u32::try_from(d).ok())
            .unwrap_or(0),
        after_gap,
        deleted,
    })
}

/// Record every change of the shard Leases (`<lease_prefix>-shard-NN`) in
/// `namespace`. A re-list after a disconnection marks the states it brings
/// (`after_gap`); a resumed watch loses nothing and marks nothing.
pub fn watch_leases(
    client: Client,
    namespace: &str,
    lease_prefix: &str,
    history: Arc<Mutex<History>>,
) -> JoinHandle<()> {
    let api: Api<Lease> = Api::namespaced(client, namespace);
    let prefix = format!("{lease_prefix}-shard-");
    tokio::spawn(async move {
        let mut stream = watcher(api, watcher::Config::default())
            .backoff(Every(Duration::from_millis(200)))
            .boxed();
        let mut listed_once = false;
        let mut relisting = false;
        while let Some(ev) = stream.next().await {
            let obs = match ev {
                Ok(watcher::Event::Init) => {
                    relisting = listed_once;
                    None
                }
                Ok(watcher::Event::InitDone) => {
                    listed_once = true;
                    relisting = false;
                    None
                }
                Ok(watcher::Event::InitApply(l)) => lease_obs(&l, &prefix, relisting, false),
                Ok(watcher::Event::Apply(l)) => lease_obs(&l, &prefix, false, false),
                Ok(watcher::Event::Delete(l)) => lease_obs(&l, &prefix, false, true),
                Err(_) => None,
            };
            if let Some(o) = obs {
                history
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .leases
                    .push(o);
            }
        }
    })
}

fn secret_obs(s: &Secret, deleted: bool) -> SecretObs {
    SecretObs {
        at: now_ms(),
        namespace: s.metadata.namespace.clone().unwrap_or_default(),
        name: s.metadata.name.clone().unwrap_or_default(),
        owner: s
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("secrets.hanzo.ai/owner").cloned()),
        keys: if deleted {
            0
        } else {
            s.data.as_ref().map_or(0, |d| d.len())
        },
        deleted,
    }
}

/// Record every state of the managed Secrets in `namespaces`. A Secret
/// missing from a re-list is recorded as deleted.
pub fn watch_secrets(
    client: Client,
    namespaces: BTreeSet<String>,
    history: Arc<Mutex<History>>,
) -> JoinHandle<()> {
    let api: Api<Secret> = Api::all(client);
    tokio::spawn(async move {
        let cfg = watcher::Config::default().labels("secrets.hanzo.ai/managed=true");
        let mut stream = watcher(api, cfg)
            .backoff(Every(Duration::from_millis(200)))
            .boxed();
        let mut known: BTreeMap<(String, String), SecretObs> = BTreeMap::new();
        let mut listing: Option<BTreeSet<(String, String)>> = None;
        while let Some(ev) = stream.next().await {
            let mut out = Vec::new();
            match ev {
                Ok(watcher::Event::Init) => listing = Some(BTreeSet::new()),
                Ok(watcher::Event::InitApply(s)) | Ok(watcher::Event::Apply(s)) => {
                    let o = secret_obs(&s, false);
                    if namespaces.contains(&o.namespace) {
                        let key = (o.namespace.clone(), o.name.clone());
                        if let Some(l) = listing.as_mut() {
                            l.insert(key.clone());
                        }
                        let changed = known
                            .get(&key)
                            .is_none_or(|k| k.keys != o.keys || k.owner != o.owner);
                        known.insert(key, o.clone());
                        if changed {
                            out.push(o);
                        }
                    }
                }
                Ok(watcher::Event::Delete(s)) => {
                    let o = secret_obs(&s, true);
                    if namespaces.contains(&o.namespace) {
                        known.remove(&(o.namespace.clone(), o.name.clone()));
                        out.push(o);
                    }
                }
                Ok(watcher::Event::InitDone) => {
                    if let Some(seen) = listing.take() {
                        let gone: Vec<_> = known
                            .keys()
                            .filter(|k| !seen.contains(*k))
                            .cloned()
                            .collect();
                        for k in gone {
                            if let Some(mut o) = known.remove(&k) {
                                o.at = now_ms();
                                o.deleted = true;
                                o.keys = 0;
                                out.push(o);
                            }
                        }
                    }
                }
                Err(_) => {}
            }
            if !out.is_empty() {
                history
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .secrets
                    .extend(out);
            }
        }
    })
}

/// Sample the KMS request count (net of the runner's own) every second.
pub fn sample_budget(kms: Arc<DevServer>, history: Arc<Mutex<History>>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let own = kms.own_requests();
            let Ok(total) = kms.requests_total().await else {
                continue;
            };
            history
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .budget
                .push(BudgetSample {
                    at: now_ms(),
                    total: total.saturating_sub(own),
                });
        }
    })
}

/// The leases each KmsDynamicSecret in `namespaces` records.
pub async fn recorded_leases(
    client: &Client,
    namespaces: &BTreeSet<String>,
) -> anyhow::Result<BTreeMap<String, RecordedLeases>> {
    let api: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &resource("KmsDynamicSecret", "kmsdynamicsecrets"),
    );
    let list = api.list(&Default::default()).await?;
    Ok(list
        .items
        .iter()
        .filter(|o| {
            o.metadata
                .namespace
                .as_ref()
                .is_some_and(|n| namespaces.contains(n))
        })
        .map(|o| {
            let id = format!(
                "KmsDynamicSecret/{}/{}",
                o.metadata.namespace.as_deref().unwrap_or_default(),
                o.metadata.name.as_deref().unwrap_or_default()
            );
            let st = &o.data["status"];
            let rec = RecordedLeases {
                current: st["lease"]["id"].as_str().map(str::to_owned),
                retired: st["retiredLeases"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|r| r["id"].as_str().map(str::to_owned))
                    .collect(),
            };
            (id, rec)
        })
        .collect())
}

/// Take one lease snapshot: statuses first, then the KMS's active leases.
pub async fn lease_snapshot(
    client: &Client,
    kms: &DevServer,
    namespaces: &BTreeSet<String>,
) -> anyhow::Result<LeaseSnapshot> {
    let at = now_ms();
    let statuses = recorded_leases(client, namespaces).await?;
    let active = kms.leases().await?.into_iter().map(|l| l.lease).collect();
    Ok(LeaseSnapshot {
        at,
        statuses,
        active,
    })
}

/// Take a lease snapshot every two seconds.
pub fn sample_leases(
    client: Client,
    kms: Arc<DevServer>,
    namespaces: BTreeSet<String>,
    history: Arc<Mutex<History>>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(2));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Ok(s) = lease_snapshot(&client, &kms, &namespaces).await {
                history
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .snapshots
                    .push(s);
            }
        }
    })
}
