//! `kms-operator run`: wire the watches, the queues, the workers, the KMS
//! client and the health/metrics server together, and stop gracefully on
//! SIGTERM (stop taking work, let in-flight reconciles finish, exit).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, PodTemplateSpec, Secret};
use kube::core::PartialObjectMeta;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::watcher::{self, Event};
use kube::{Client, ResourceExt};

use crate::api::kms_secret::KmsSecret;
use crate::cli::RunArgs;
use crate::controllers::queue::Queue;
use crate::controllers::refs::{GLOBAL_CONFIG_NAME, GlobalConfig, SecretReads};
use crate::controllers::stores;
use crate::controllers::target::{MANAGED_LABEL, OWNER_ANNOTATION, VERSION_ANNOTATION};
use crate::controllers::{
    self, Context, ContextParts, ObjectKey, RefIndex, Settings, kms_dynamic_secret,
    kms_push_secret, kms_secret,
};
use crate::kms::limiter::Limiter;
use crate::kms::{Kms, KmsConfig};
use crate::metrics::Metrics;
use crate::reload::runtime::{Reloader, Workloads};
use crate::reload::{
    AUTO_RELOAD_ANNOTATION, ConsumerIndex, Source, WorkloadKey, WorkloadKind, consumed,
};
use crate::server;
use crate::sharding::Ownership;

/// Keys whose change makes a KmsSecret worth reconciling: generation,
/// labels, annotations, deletion.
fn fingerprint(
    o: &KmsSecret,
) -> (
    Option<i64>,
    BTreeMap<String, String>,
    BTreeMap<String, String>,
    bool,
) {
    (
        o.metadata.generation,
        o.labels().clone(),
        o.annotations().clone(),
        o.metadata.deletion_timestamp.is_some(),
    )
}

/// Secrets a KmsSecret reads (credentials, CA) or writes, as `(namespace,
/// name)`. A target counts too: one the resource may not write yet (it
/// carries no adoption marker) is taken over as soon as someone adds the
/// marker, not at the resource's next retry.
fn referenced_secrets(o: &KmsSecret) -> Vec<(String, String)> {
    let ns = o.namespace().unwrap_or_default();
    let pick = |r_ns: Option<&String>, name: &str| {
        (
            r_ns.filter(|n| !n.is_empty())
                .cloned()
                .unwrap_or_else(|| ns.clone()),
            name.to_owned(),
        )
    };
    let mut out = Vec::new();
    if let Some(a) = &o.spec.authentication {
        if let Some(u) = &a.universal_auth {
            out.push(pick(
                u.credentials_ref.secret_namespace.as_ref(),
                &u.credentials_ref.secret_name,
            ));
        }
        if let Some(l) = &a.ldap_auth {
            out.push(pick(
                l.auth.credentials_ref.secret_namespace.as_ref(),
                &l.auth.credentials_ref.secret_name,
            ));
        }
        if let Some(s) = &a.service_token {
            let r = &s.service_token_secret_reference;
            out.push(pick(r.secret_namespace.as_ref(), &r.secret_name));
        }
    }
    if let Some(r) = &o.spec.token_secret_reference {
        out.push(pick(r.secret_namespace.as_ref(), &r.secret_name));
    }
    if let Some(ca) = o.spec.tls.as_ref().and_then(|t| t.ca_ref.as_ref()) {
        out.push(pick(ca.secret_namespace.as_ref(), &ca.secret_name));
    }
    for t in o
        .spec
        .managed_secret_reference
        .iter()
        .chain(o.spec.managed_kube_secret_references.iter().flatten())
    {
        out.push(pick(t.secret_namespace.as_ref(), &t.secret_name));
    }
    out
}

/// The work queues of the resource controllers.
#[derive(Clone)]
struct Queues {
    kms_secret: Arc<Queue<ObjectKey>>,
    push: Arc<Queue<ObjectKey>>,
    dynamic: Arc<Queue<ObjectKey>>,
}

impl Queues {
    /// Queue the resource named by an owner annotation
    /// (`<Kind>/<namespace>/<name>`).
    fn owner(&self, owner: &str, gate: &dyn Ownership) {
        let mut parts = owner.splitn(3, '/');
        let (Some(kind), Some(ns), Some(name)) = (parts.next(), parts.next(), parts.next()) else {
            return;
        };
        let queue = match kind {
            "KmsSecret" => &self.kms_secret,
            "KmsPushSecret" => &self.push,
            "KmsDynamicSecret" => &self.dynamic,
            _ => return,
        };
        queue.add(ObjectKey::new(ns, name), gate.shard_of(ns));
    }

    fn close(&self) {
        self.kms_secret.close();
        self.push.close();
        self.dynamic.close();
    }
}

/// Run the operator until SIGTERM or SIGINT.
pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    server::check_exposure(&args.metrics_addr, args.metrics_tls, args.metrics_insecure)?;
    let client = Client::try_default().await?;
    let pod_name = args
        .pod_name
        .clone()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "kms-operator".to_owned());
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        pod = %pod_name,
        namespaces = ?args.namespaces,
        "kms-operator starting"
    );
    let coordinator = shard::Coordinator::start(
        client.clone(),
        shard::Config {
            shards: args.shards,
            lease_duration: args.lease_duration,
            renew_deadline: args.renew_deadline,
            retry_period: args.retry_period,
            ..shard::Config::new(&args.pod_namespace, &args.lease_prefix, &pod_name)
        },
    )
    .map_err(|e| anyhow::anyhow!("sharding: {e}"))?;
    // Subscribe before anything is acquired, so no gain is missed.
    let shard_events = coordinator.events();
    let gate: Arc<dyn Ownership> = Arc::new(coordinator.clone());
    let metrics = Metrics::new(gate.shard_count());
    let cache = open_cache(&args)?;
    let mut kms = Kms::new(
        KmsConfig {
            rate_limit: args.kms_rate_limit,
            allowed_hosts: args
                .allowed_kms_hosts
                .iter()
                .filter(|h| !h.is_empty())
                .cloned()
                .collect(),
            ..KmsConfig::default()
        },
        metrics.clone(),
    );
    if let Some(store) = &cache {
        kms = kms.with_token_store(store.clone());
    }
    kms = kms.with_cloud(crate::kms::cloud::CloudConfig {
        aws_sts_endpoint: args
            .aws_sts_endpoint
            .clone()
            .filter(|e| !e.trim().is_empty()),
        aws_imds_endpoint: args.aws_imds_endpoint.clone(),
        azure_imds_endpoint: args.azure_imds_endpoint.clone(),
        gcp_metadata_endpoint: args.gcp_metadata_endpoint.clone(),
        key_file_dir: args.key_file_dir.clone(),
        timeout: args.cloud_timeout,
        ..crate::kms::cloud::CloudConfig::default()
    });
    let kms = Arc::new(kms);
    kms.set_members(gate.members());
    let namespaces: Vec<String> = args
        .namespaces
        .iter()
        .filter(|n| !n.is_empty())
        .cloned()
        .collect();
    let settings = Settings {
        allow_cross_namespace_refs: args.allow_cross_namespace_refs,
        pod_namespace: args.pod_namespace.clone(),
        namespaces: namespaces.clone(),
        cleanup_timeout: args.cleanup_timeout,
        ..Settings::default()
    };
    let queue: Arc<Queue<ObjectKey>> = Arc::new(Queue::new());
    let queues = Queues {
        kms_secret: queue.clone(),
        push: Arc::new(Queue::new()),
        dynamic: Arc::new(Queue::new()),
    };
    let reload_queue: Arc<Queue<WorkloadKey>> = Arc::new(Queue::new());
    let consumers = Arc::new(ConsumerIndex::default());
    let global = Arc::new(RwLock::new(GlobalConfig::default()));
    let index = Arc::new(RefIndex::default());
    let mut drivers: Vec<BoxFuture<'static, ()>> = Vec::new();
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "kms-operator".into(),
            instance: Some(pod_name.clone()),
        },
    );
    let undecodable = stores::Undecodable::new(metrics.clone(), Some(recorder.clone()));
    let watches = stores::Watches::new(client.clone(), namespaces.clone(), undecodable.clone());

    // KmsSecrets: reconcile on creation, spec, label, annotation or deletion
    // changes (not on our own status writes).
    let (kms_secrets, d) = {
        let (queue, gate, index) = (queue.clone(), gate.clone(), index.clone());
        let seen: Mutex<HashMap<String, _>> = Mutex::new(HashMap::new());
        watches.watch::<KmsSecret, _>(&watcher::Config::default(), move |event| {
            let (o, initial, deleted) = match event {
                Event::Apply(o) => (o, false, false),
                Event::InitApply(o) => (o, true, false),
                Event::Delete(o) => (o, false, true),
                Event::Init | Event::InitDone => return,
            };
            let key = ObjectKey::new(o.namespace().unwrap_or_default(), o.name_any());
            let uid = o.uid().unwrap_or_default();
            let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
            let owner = kms_secret::owner_id(&key.namespace, &key.name);
            if deleted {
                seen.remove(&uid);
                index.remove(&owner);
            } else {
                let fp = fingerprint(o);
                let changed = seen.get(&uid) != Some(&fp);
                seen.insert(uid, fp);
                index.set(&owner, referenced_secrets(o));
                if !changed && !initial {
                    return;
                }
            }
            let shard = gate.shard_of(&key.namespace);
            queue.add(key, shard);
        })
    };
    drivers.extend(d);

    // Managed objects: any change or deletion sends their owner round; a new
    // version (data change) sends the workloads that use them round, after
    // the debounce delay.
    let managed = watcher::Config::default().labels(&format!("{MANAGED_LABEL}=true"));
    let managed_trigger = |source: Source| {
        let (queues, reload_queue, gate, consumers) = (
            queues.clone(),
            reload_queue.clone(),
            gate.clone(),
            consumers.clone(),
        );
        let debounce = args.reload_debounce;
        let versions: Mutex<HashMap<(String, String), String>> = Mutex::new(HashMap::new());
        move |ns: String, name: String, annotations: &BTreeMap<String, String>, deleted: bool| {
            if let Some(owner) = annotations.get(OWNER_ANNOTATION) {
                queues.owner(owner, gate.as_ref());
            }
            let version = annotations.get(VERSION_ANNOTATION).cloned();
            let changed = {
                let mut versions = versions.lock().unwrap_or_else(|e| e.into_inner());
                let id = (ns.clone(), name.clone());
                if deleted {
                    versions.remove(&id);
                    false
                } else {
                    match version {
                        Some(v) => versions.insert(id, v.clone()).is_none_or(|old| old != v),
                        None => false,
                    }
                }
            };
            if changed {
                for w in consumers.consumers(&ns, source, &name) {
                    let shard = gate.shard_of(&w.namespace);
                    reload_queue.add_after(w, shard, debounce);
                }
            }
        }
    };
    let (secrets, d) = {
        let trigger = managed_trigger(Source::Secret);
        watches.watch::<Secret, _>(&managed, move |event| match event {
            Event::Apply(o) | Event::InitApply(o) => trigger(
                o.namespace().unwrap_or_default(),
                o.name_any(),
                o.annotations(),
                false,
            ),
            Event::Delete(o) => trigger(
                o.namespace().unwrap_or_default(),
                o.name_any(),
                o.annotations(),
                true,
            ),
            Event::Init | Event::InitDone => {}
        })
    };
    drivers.extend(d);
    let (config_maps, d) = {
        let trigger = managed_trigger(Source::ConfigMap);
        watches.watch::<ConfigMap, _>(&managed, move |event| match event {
            Event::Apply(o) | Event::InitApply(o) => trigger(
                o.namespace().unwrap_or_default(),
                o.name_any(),
                o.annotations(),
                false,
            ),
            Event::Delete(o) => trigger(
                o.namespace().unwrap_or_default(),
                o.name_any(),
                o.annotations(),
                true,
            ),
            Event::Init | Event::InitDone => {}
        })
    };
    drivers.extend(d);

    // Workloads that opted in to auto-reload: index what they use; a new
    // workload, or a change of what it uses, sends it round (to record the
    // versions it starts with) and its objects' owners round (to count it).
    let workload_trigger = |kind: WorkloadKind| {
        let (queues, reload_queue, gate, consumers) = (
            queues.clone(),
            reload_queue.clone(),
            gate.clone(),
            consumers.clone(),
        );
        let (secrets, config_maps) = (secrets.clone(), config_maps.clone());
        move |ns: String,
              name: String,
              annotations: &BTreeMap<String, String>,
              template: Option<&PodTemplateSpec>,
              deleted: bool| {
            let key = WorkloadKey {
                kind,
                namespace: ns.clone(),
                name,
            };
            let opted_in =
                annotations.get(AUTO_RELOAD_ANNOTATION).map(String::as_str) == Some("true");
            let before = consumers.uses(&key);
            let uses = match (deleted, opted_in, template.and_then(|t| t.spec.as_ref())) {
                (false, true, Some(spec)) => consumed(spec),
                _ => Default::default(),
            };
            if !consumers.set(&key, uses.clone()) {
                return;
            }
            let shard = gate.shard_of(&ns);
            if !uses.is_empty() {
                reload_queue.add(key, shard);
            }
            // Owners of the objects it uses (or used) recount their workloads.
            for (source, name) in before.union(&uses) {
                let annotations = match source {
                    Source::Secret => secrets
                        .get(Some(&ns), name)
                        .map(|o| o.annotations().clone()),
                    Source::ConfigMap => config_maps
                        .get(Some(&ns), name)
                        .map(|o| o.annotations().clone()),
                };
                if let Some(owner) = annotations.as_ref().and_then(|a| a.get(OWNER_ANNOTATION)) {
                    queues.owner(owner, gate.as_ref());
                }
            }
        }
    };
    macro_rules! watch_workloads {
        ($ty:ty, $kind:expr) => {{
            let trigger = workload_trigger($kind);
            let (store, d) =
                watches.watch::<$ty, _>(&watcher::Config::default(), move |event| match event {
                    Event::Apply(o) | Event::InitApply(o) => trigger(
                        o.namespace().unwrap_or_default(),
                        o.name_any(),
                        o.annotations(),
                        Some(&o.spec.template),
                        false,
                    ),
                    Event::Delete(o) => trigger(
                        o.namespace().unwrap_or_default(),
                        o.name_any(),
                        o.annotations(),
                        None,
                        true,
                    ),
                    Event::Init | Event::InitDone => {}
                });
            drivers.extend(d);
            store
        }};
    }
    let workloads = Workloads {
        deployments: watch_workloads!(Deployment, WorkloadKind::Deployment),
        stateful_sets: watch_workloads!(StatefulSet, WorkloadKind::StatefulSet),
        daemon_sets: watch_workloads!(DaemonSet, WorkloadKind::DaemonSet),
    };

    // Push and dynamic secrets.
    let (push, d) =
        kms_push_secret::watch(&watches, gate.clone(), queues.push.clone(), index.clone());
    drivers.extend(d);
    let (dynamic, d) = kms_dynamic_secret::watch(
        &watches,
        gate.clone(),
        queues.dynamic.clone(),
        index.clone(),
    );
    drivers.extend(d);
    let (push_resources, dynamic_resources) = (push.resources.clone(), dynamic.resources.clone());

    // Credential, CA and source Secrets (metadata only): the current version
    // of each keeps the shared reads of referenced Secrets honest, and a
    // change sends the resources that read them round.
    let referenced = Arc::new(SecretReads::default());
    {
        let scopes: Vec<(Option<String>, kube::Api<PartialObjectMeta<Secret>>)> =
            if namespaces.is_empty() {
                vec![(None, kube::Api::all(client.clone()))]
            } else {
                namespaces
                    .iter()
                    .map(|ns| (Some(ns.clone()), kube::Api::namespaced(client.clone(), ns)))
                    .collect()
            };
        for (scope, api) in scopes {
            let (queues, gate, index, referenced) = (
                queues.clone(),
                gate.clone(),
                index.clone(),
                referenced.clone(),
            );
            drivers.push(Box::pin(async move {
                use futures::StreamExt;
                use kube::runtime::WatchStreamExt;
                let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
                let mut stream = std::pin::pin!(stream);
                let scope = scope.as_deref();
                while let Some(event) = stream.next().await {
                    let (o, deleted): (PartialObjectMeta<Secret>, bool) = match event {
                        Ok(Event::Apply(o)) => (o, false),
                        Ok(Event::Delete(o)) => (o, true),
                        Ok(Event::Init) => {
                            referenced.relist_started(scope);
                            continue;
                        }
                        Ok(Event::InitApply(o)) => {
                            // Changed while the watch was down: as a change.
                            let changed = referenced.relisted(
                                scope,
                                o.metadata.namespace.as_deref().unwrap_or_default(),
                                o.metadata.name.as_deref().unwrap_or_default(),
                                o.metadata.resource_version.as_deref(),
                            );
                            if !changed {
                                continue;
                            }
                            (o, false)
                        }
                        Ok(Event::InitDone) => {
                            referenced.relist_done(scope);
                            continue;
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "watch of Secret metadata failed; retrying");
                            continue;
                        }
                    };
                    let ns = o.metadata.namespace.clone().unwrap_or_default();
                    let name = o.metadata.name.clone().unwrap_or_default();
                    // The version first, so the resources queued below read
                    // the new data.
                    if deleted {
                        referenced.gone(&ns, &name);
                    } else {
                        referenced.seen(&ns, &name, o.metadata.resource_version.as_deref());
                    }
                    for owner in index.dependents(&ns, &name) {
                        queues.owner(&owner, gate.as_ref());
                    }
                }
            }));
        }
    }

    // The global configuration ConfigMap.
    let (global_store, d) = {
        let (queues, gate, global) = (queues.clone(), gate.clone(), global.clone());
        let (kms_secrets, push_store, dynamic_store) = (
            kms_secrets.clone(),
            push_resources.clone(),
            dynamic_resources.clone(),
        );
        stores::Watches::new(
            client.clone(),
            vec![args.pod_namespace.clone()],
            undecodable.clone(),
        )
        .watch::<ConfigMap, _>(
            &watcher::Config::default().fields(&format!("metadata.name={GLOBAL_CONFIG_NAME}")),
            move |event| {
                let parsed = match event {
                    Event::Apply(cm) | Event::InitApply(cm) => GlobalConfig::from_config_map(cm),
                    Event::Delete(_) => GlobalConfig::default(),
                    Event::Init | Event::InitDone => return,
                };
                let changed = {
                    let mut g = global.write().unwrap_or_else(|e| e.into_inner());
                    let changed = *g != parsed;
                    *g = parsed;
                    changed
                };
                if changed {
                    tracing::info!("global configuration {GLOBAL_CONFIG_NAME} changed");
                    // Every resource without its own hostAPI uses it.
                    let uses_global = |host: Option<&str>| host.is_none_or(str::is_empty);
                    let add = |queue: &Queue<ObjectKey>, ns: Option<String>, name: String| {
                        let key = ObjectKey::new(ns.unwrap_or_default(), name);
                        let shard = gate.shard_of(&key.namespace);
                        queue.add(key, shard);
                    };
                    for o in kms_secrets.all() {
                        if uses_global(o.spec.host_api.as_deref()) {
                            add(&queues.kms_secret, o.namespace(), o.name_any());
                        }
                    }
                    for o in push_store.all() {
                        if uses_global(o.spec.host_api.as_deref()) {
                            add(&queues.push, o.namespace(), o.name_any());
                        }
                    }
                    for o in dynamic_store.all() {
                        if uses_global(o.spec.host_api.as_deref()) {
                            add(&queues.dynamic, o.namespace(), o.name_any());
                        }
                    }
                }
            },
        )
    };
    drivers.extend(d);

    let ctx = Arc::new(Context::new(
        ContextParts {
            client: client.clone(),
            kms,
            metrics: metrics.clone(),
            gate: gate.clone(),
            settings,
            recorder,
            renderer: Arc::new(kms_template::Engine::default()),
            global,
            kms_secret_queue: queue.clone(),
            consumers: consumers.clone(),
            referenced,
            cache: cache.clone(),
        },
        kms_secrets.clone(),
        secrets.clone(),
        config_maps.clone(),
    ));

    let mut watch_tasks = Vec::new();
    for d in drivers {
        watch_tasks.push(tokio::spawn(d));
    }
    // Ready means the workers run: set once every cache has its initial
    // list and the workers are started (below). Asking it never touches the
    // caches' own readiness futures.
    let started = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let ready = {
        let started = started.clone();
        Arc::new(move || started.load(std::sync::atomic::Ordering::Acquire))
    };
    let tls = server::MetricsTls {
        enabled: args.metrics_tls,
        cert_dir: args.metrics_cert_path.clone(),
        cert_name: args.metrics_cert_name.clone(),
        key_name: args.metrics_cert_key.clone(),
    };
    let servers = server::start(
        &args.health_addr,
        &args.metrics_addr,
        metrics.clone(),
        ready,
        &tls,
        client.clone(),
    )
    .await?;

    // Wait for the caches before reconciling, so that targets and owners are
    // known.
    kms_secrets.wait_ready().await;
    secrets.wait_ready().await;
    config_maps.wait_ready().await;
    global_store.wait_ready().await;
    workloads.deployments.wait_ready().await;
    workloads.stateful_sets.wait_ready().await;
    workloads.daemon_sets.wait_ready().await;
    push.resources.wait_ready().await;
    dynamic.resources.wait_ready().await;
    tracing::info!(
        objects = kms_secrets.all().len(),
        "caches synced; starting workers"
    );
    if let Some(store) = &cache {
        // Records of objects that no longer exist.
        let live: HashSet<String> = kms_secrets.all().iter().filter_map(|o| o.uid()).collect();
        match store.retain(|kind, uid| kind != storage::RecordKind::Sync || live.contains(uid)) {
            Ok(n) if n > 0 => {
                tracing::info!(removed = n, "pruned cache records of deleted resources")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "could not prune the cache"),
        }
    }

    let counted: Vec<(&'static str, Arc<Queue<ObjectKey>>, Namespaces)> = vec![
        (kms_secret::CONTROLLER, queues.kms_secret.clone(), {
            let s = kms_secrets.clone();
            Box::new(move || {
                s.all()
                    .iter()
                    .map(|o| o.namespace().unwrap_or_default())
                    .collect()
            })
        }),
        (kms_push_secret::CONTROLLER, queues.push.clone(), {
            let s = push.resources.clone();
            Box::new(move || {
                s.all()
                    .iter()
                    .map(|o| o.namespace().unwrap_or_default())
                    .collect()
            })
        }),
        (kms_dynamic_secret::CONTROLLER, queues.dynamic.clone(), {
            let s = dynamic.resources.clone();
            Box::new(move || {
                s.all()
                    .iter()
                    .map(|o| o.namespace().unwrap_or_default())
                    .collect()
            })
        }),
    ];
    let with_lease: Namespaces = {
        let s = dynamic_resources.clone();
        Box::new(move || {
            s.all()
                .iter()
                .filter(|o| o.status.as_ref().is_some_and(|st| st.lease.is_some()))
                .map(|o| o.namespace().unwrap_or_default())
                .collect()
        })
    };
    let stats = tokio::spawn(report_queue(ctx.clone(), counted, with_lease));
    let workers = tokio::spawn(controllers::run_workers(
        ctx.clone(),
        queue.clone(),
        kms_secret::CONTROLLER,
        Arc::new(kms_secret::Controller),
    ));
    let reload_budget = Arc::new(Limiter::new(args.max_reloads_per_second));
    reload_budget.set_members(gate.members());
    let reloader = Arc::new(Reloader {
        workloads: workloads.clone(),
        index: consumers.clone(),
        budget: reload_budget.clone(),
        debounce: args.reload_debounce,
    });
    let reload_workers = tokio::spawn(controllers::run_workers(
        ctx.clone(),
        reload_queue.clone(),
        crate::reload::runtime::CONTROLLER,
        reloader,
    ));
    let push_workers = tokio::spawn(controllers::run_workers(
        ctx.clone(),
        queues.push.clone(),
        kms_push_secret::CONTROLLER,
        Arc::new(push),
    ));
    let dynamic_workers = tokio::spawn(controllers::run_workers(
        ctx.clone(),
        queues.dynamic.clone(),
        kms_dynamic_secret::CONTROLLER,
        Arc::new(dynamic),
    ));
    tracing::info!("workers started; ready");
    started.store(true, std::sync::atomic::Ordering::Release);

    // Shard ownership: drain a shard before its Lease is given up; a full
    // pass over every object of a gained shard; metrics; the budget shares.
    {
        let (queues, reload_queue, cache) = (queues.clone(), reload_queue.clone(), cache.clone());
        let ctx = ctx.clone();
        coordinator.set_drain_hook(move |shard| {
            let (queues, reload_queue, cache) =
                (queues.clone(), reload_queue.clone(), cache.clone());
            ctx.instant.drop_shard(shard);
            async move {
                let dropped = queues.kms_secret.drop_shard(shard)
                    + queues.push.drop_shard(shard)
                    + queues.dynamic.drop_shard(shard)
                    + reload_queue.drop_shard(shard);
                let deadline = tokio::time::Instant::now() + Duration::from_secs(25);
                while queues.kms_secret.in_progress_for(shard)
                    + queues.push.in_progress_for(shard)
                    + queues.dynamic.in_progress_for(shard)
                    + reload_queue.in_progress_for(shard)
                    > 0
                    && tokio::time::Instant::now() < deadline
                {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                if let Some(store) = &cache
                    && let Err(e) = store.flush_async().await
                {
                    tracing::warn!(error = %e, "could not flush the cache");
                }
                tracing::info!(shard, dropped, "shard drained");
            }
        });
    }
    let full_pass = {
        let (queues, reload_queue, gate) = (queues.clone(), reload_queue.clone(), gate.clone());
        let (kms_secrets, push_store, dynamic_store, workloads) = (
            kms_secrets.clone(),
            push_resources.clone(),
            dynamic_resources.clone(),
            workloads.clone(),
        );
        move |shard: u32| {
            let of = |ns: Option<String>| gate.shard_of(&ns.unwrap_or_default()) == shard;
            for o in kms_secrets.all() {
                if of(o.namespace()) {
                    queues.kms_secret.add(
                        ObjectKey::new(o.namespace().unwrap_or_default(), o.name_any()),
                        shard,
                    );
                }
            }
            for o in push_store.all() {
                if of(o.namespace()) {
                    queues.push.add(
                        ObjectKey::new(o.namespace().unwrap_or_default(), o.name_any()),
                        shard,
                    );
                }
            }
            for o in dynamic_store.all() {
                if of(o.namespace()) {
                    queues.dynamic.add(
                        ObjectKey::new(o.namespace().unwrap_or_default(), o.name_any()),
                        shard,
                    );
                }
            }
            let opted = |a: &BTreeMap<String, String>| {
                a.get(AUTO_RELOAD_ANNOTATION).map(String::as_str) == Some("true")
            };
            let add = |kind: WorkloadKind,
                       ns: Option<String>,
                       name: String,
                       a: &BTreeMap<String, String>| {
                if opted(a) && of(ns.clone()) {
                    reload_queue.add(
                        WorkloadKey {
                            kind,
                            namespace: ns.unwrap_or_default(),
                            name,
                        },
                        shard,
                    );
                }
            };
            for o in workloads.deployments.all() {
                add(
                    WorkloadKind::Deployment,
                    o.namespace(),
                    o.name_any(),
                    o.annotations(),
                );
            }
            for o in workloads.stateful_sets.all() {
                add(
                    WorkloadKind::StatefulSet,
                    o.namespace(),
                    o.name_any(),
                    o.annotations(),
                );
            }
            for o in workloads.daemon_sets.all() {
                add(
                    WorkloadKind::DaemonSet,
                    o.namespace(),
                    o.name_any(),
                    o.annotations(),
                );
            }
        }
    };
    for shard in 0..gate.shard_count() {
        if gate.owns(shard) {
            full_pass(shard);
        }
    }
    let shard_task = {
        let (metrics, kms, budget) = (metrics.clone(), ctx.kms.clone(), reload_budget.clone());
        let recorder = ctx.recorder.clone();
        // Shard changes are Events on the operator's pod (repeats of one
        // reason become one Event series).
        let pod = k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("Pod".to_owned()),
            name: Some(pod_name.clone()),
            namespace: Some(args.pod_namespace.clone()),
            ..Default::default()
        };
        let publish = move |reason: &'static str, note: String| {
            let (recorder, pod) = (recorder.clone(), pod.clone());
            tokio::spawn(async move {
                let event = kube::runtime::events::Event {
                    type_: kube::runtime::events::EventType::Normal,
                    reason: reason.to_owned(),
                    note: Some(note),
                    action: "Shard".to_owned(),
                    secondary: None,
                };
                if let Err(e) = recorder.publish(&event, &pod).await {
                    tracing::debug!(error = %e, "could not publish a shard Event");
                }
            });
        };
        let mut events = shard_events;
        tokio::spawn(async move {
            loop {
                match events.recv().await {
                    Ok(shard::Event::Gained(s)) => {
                        metrics
                            .shard_handovers
                            .with_label_values(&[&s.to_string(), "gained"])
                            .inc();
                        full_pass(s);
                        publish("ShardGained", format!("Owns shard {s}"));
                    }
                    Ok(shard::Event::Lost { shard, reason }) => {
                        metrics
                            .shard_handovers
                            .with_label_values(&[&shard.to_string(), "lost"])
                            .inc();
                        tracing::info!(shard, reason = reason.as_str(), "shard lost");
                        publish(
                            "ShardLost",
                            format!("Gave up shard {shard} ({})", reason.as_str()),
                        );
                    }
                    Ok(shard::Event::RenewFailed {
                        shard: Some(s),
                        error,
                    }) => {
                        metrics
                            .lease_renew_failures
                            .with_label_values(&[&s.to_string()])
                            .inc();
                        tracing::warn!(shard = s, %error, "shard Lease renewal failed");
                        kms.hold_members();
                        budget.hold_members();
                    }
                    Ok(shard::Event::RenewFailed { shard: None, .. }) => {
                        kms.hold_members();
                        budget.hold_members();
                    }
                    Ok(shard::Event::MembersChanged(members)) => {
                        let n = u32::try_from(members.len()).unwrap_or(u32::MAX).max(1);
                        kms.set_members(n);
                        budget.set_members(n);
                        tracing::info!(?members, "live replicas changed");
                    }
                    Ok(shard::Event::ConfigMismatch(m)) => {
                        tracing::warn!(%m, "not acquiring shards")
                    }
                    Ok(_) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                }
            }
        })
    };

    shutdown_signal().await;
    tracing::info!("shutting down: no new work; waiting for reconciles in flight");
    queues.close();
    reload_queue.close();
    let drained = async {
        let _ = workers.await;
        let _ = reload_workers.await;
        let _ = push_workers.await;
        let _ = dynamic_workers.await;
    };
    if tokio::time::timeout(Duration::from_secs(20), drained)
        .await
        .is_err()
    {
        tracing::warn!("reconciles still running after 20s; exiting anyway");
    }
    if let Some(store) = &cache
        && let Err(e) = store.flush_async().await
    {
        tracing::warn!(error = %e, "could not flush the cache");
    }
    // Hand the shards over: clear each Lease's holder, delete the member Lease.
    coordinator.shutdown().await;
    // Leases created and not yet recorded are recorded or revoked before the
    // process goes (their reconciles may have been dropped above).
    ctx.critical.close();
    if tokio::time::timeout(Duration::from_secs(15), ctx.critical.wait())
        .await
        .is_err()
    {
        tracing::warn!("lease steps still running after 15s; exiting anyway");
    }
    shard_task.abort();
    stats.abort();
    for t in watch_tasks {
        t.abort();
    }
    servers.abort();
    tracing::info!("stopped");
    Ok(())
}

/// Open the persistent cache of `--cache-dir`. A database held by another
/// process means running without a cache; a corrupt one is moved aside and
/// rebuilt (one warning). A key file that cannot be read is an error.
fn open_cache(args: &RunArgs) -> anyhow::Result<Option<storage::Store>> {
    let Some(dir) = args
        .cache_dir
        .as_ref()
        .filter(|d| !d.as_os_str().is_empty())
    else {
        return Ok(None);
    };
    let encryption_key = match &args.cache_encryption_key_file {
        Some(path) => Some(
            storage::EncryptionKey::from_file(path)
                .map_err(|e| anyhow::anyhow!("--cache-encryption-key-file: {e}"))?,
        ),
        None => None,
    };
    let options = storage::Options {
        encryption_key,
        ..storage::Options::default()
    };
    match storage::Store::open(dir, options) {
        Ok((store, report)) => {
            if let Some(reason) = &report.recovered {
                tracing::warn!(%reason, moved_to = ?report.moved_to, "the cache was unreadable; it was moved aside and is rebuilt");
            }
            if let Some(why) = &report.permissions {
                // A mounted volume's root usually belongs to another user.
                tracing::info!(%why, "the cache directory itself is not private; the files in it are");
            }
            tracing::info!(
                dir = %dir.display(),
                records = report.records,
                dropped = report.dropped,
                tokens = store.encrypts_tokens(),
                "persistent cache opened"
            );
            Ok(Some(store))
        }
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "running without the persistent cache");
            Ok(None)
        }
    }
}

/// Namespaces of a controller's resources (one entry per resource).
type Namespaces = Box<dyn Fn() -> Vec<String> + Send + Sync>;

/// Publish queue depth, oldest age, owned shards and managed objects per
/// controller and shard.
async fn report_queue(
    ctx: Arc<Context>,
    controllers: Vec<(&'static str, Arc<Queue<ObjectKey>>, Namespaces)>,
    leases: Namespaces,
) {
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    loop {
        tick.tick().await;
        let mut held: HashMap<u32, i64> = HashMap::new();
        for ns in leases() {
            *held.entry(ctx.gate.shard_of(&ns)).or_default() += 1;
        }
        for shard in 0..ctx.gate.shard_count() {
            let n = if ctx.gate.owns(shard) {
                held.get(&shard).copied().unwrap_or(0)
            } else {
                0
            };
            ctx.metrics
                .dynamic_leases
                .with_label_values(&[&shard.to_string()])
                .set(n);
        }
        for shard in 0..ctx.gate.shard_count() {
            let s = shard.to_string();
            ctx.metrics
                .shard_owned
                .with_label_values(&[s.as_str()])
                .set(i64::from(ctx.gate.owns(shard)));
        }
        for (controller, queue, namespaces) in &controllers {
            let stats = queue.stats();
            let mut counts: HashMap<u32, i64> = HashMap::new();
            for ns in namespaces() {
                *counts.entry(ctx.gate.shard_of(&ns)).or_default() += 1;
            }
            for shard in 0..ctx.gate.shard_count() {
                let s = shard.to_string();
                let labels = [*controller, s.as_str()];
                let (depth, oldest) = stats.get(&shard).copied().unwrap_or_default();
                ctx.metrics
                    .queue_depth
                    .with_label_values(&labels)
                    .set(i64::try_from(depth).unwrap_or(i64::MAX));
                ctx.metrics
                    .queue_oldest
                    .with_label_values(&labels)
                    .set(oldest.as_secs_f64());
                let managed = if ctx.gate.owns(shard) {
                    counts.get(&shard).copied().unwrap_or(0)
                } else {
                    0
                };
                ctx.metrics
                    .managed_objects
                    .with_label_values(&labels)
                    .set(managed);
            }
        }
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
