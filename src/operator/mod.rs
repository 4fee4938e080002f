//! `kms-operator run`: wire the watches, the registered kinds (their
//! queues and workers), the KMS client, shard ownership and the
//! health/metrics server together, and stop gracefully on SIGTERM (stop
//! taking work, let in-flight reconciles finish, hand the shards over).
//!
//! - [`control`]: the runtime of the Lease coordinator and the probes;
//! - [`watches`]: the watches that route work to the kinds;
//! - [`shards`]: caches, draining, full passes and budgets as shards move;
//! - [`shard_labels`]: the shard label on the objects watched by shard.

mod control;
mod shard_labels;
mod shards;
mod watches;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::runtime::events::Reporter;

use crate::api::kms_secret::KmsSecret;
use crate::api::served::ServedKinds;
use crate::cli::{RunArgs, WatchScope};
use crate::controllers::cloud_identities::CloudIdentities;
use crate::controllers::context::{Context, Settings};
use crate::controllers::events::Recorder;
use crate::controllers::queue::Queue;
use crate::controllers::refs::RefIndex;
use crate::controllers::refs::{GlobalConfig, SecretReads};
use crate::controllers::registry::{Kind, Registry, Wiring};
use crate::controllers::reload::ConsumerIndex;
use crate::controllers::reload::runtime::{self as reload, Reloader};
use crate::controllers::stores::{self, Scoped};
use crate::controllers::{kms_dynamic_secret, kms_push_secret, kms_secret};
use crate::kms::limiter::Limiter;
use crate::kms::{Kms, KmsConfig};
use crate::metrics::Metrics;
use crate::server;
use crate::sharding::Ownership;

/// Run the operator until SIGTERM or SIGINT: the probes and the shard
/// Leases first (on their own runtime), then the watches, the caches' first
/// lists, the workers (ready), and the shards followed; then the graceful
/// stop.
pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    server::check_exposure(&args.metrics_addr, args.metrics_tls, args.metrics_insecure)?;
    let client = Client::try_default().await?;
    let pod_name = args
        .pod_name
        .clone()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "kms-operator".to_owned());
    tracing::info!(version = crate::cli::VERSION, pod = %pod_name, namespaces = ?args.namespaces, "kms-operator starting");
    let metrics = Metrics::new(args.shards);
    // Ready means the workers run: set once every cache has its initial list
    // and the workers are started. Asking never touches the caches.
    let readiness = Arc::new(Readiness::default());
    let (control, servers) = start_control(&args, &metrics, readiness.clone()).await?;

    // Every write carries the kind the cluster serves (ours, or the Go
    // operator's spelling after a hand-over in place); no CRDs, no start:
    // it waits for them, and /readyz says which are missing.
    let served = ServedKinds::discover(&client, |why| {
        readiness.waiting_for(why.map(|e| e.to_string()))
    })
    .await;
    if served.is_legacy() {
        tracing::info!(kinds = ?served, "the CRDs serve the Hanzo Go operator's kind spelling; writing with it");
    }
    // A member Lease of ours that is still there means the last process of
    // this replica died without handing over (a crash): it resumes its shards
    // at once. Otherwise, split by shard, it waits a moment before watching
    // what it gains (see `shards::follow_scopes`).
    let resumed = resumed_member(&client, &args, &pod_name).await;
    let coordinator = start_coordinator(&control, &args, &pod_name)?;
    // Subscribe before anything is acquired, so no gain is missed.
    let shard_events = coordinator.events();
    let (scopes, gate) = ownership(&args, &coordinator);
    let cache = open_cache(&args)?;
    let wired = wire(
        &args,
        &client,
        &pod_name,
        (gate.clone(), scopes.clone()),
        &metrics,
        cache.clone(),
        served,
    )?;
    let (ctx, registry) = (wired.ctx.clone(), wired.registry.clone());
    let (mut tasks, labeler) = start_watches(wired.drivers, &client, &scopes, &gate, &ctx);
    wait_for_caches(&wired.caches, &registry, &wired.global_store, &args).await;
    tracing::info!(
        objects = registry
            .kinds()
            .iter()
            .filter_map(|k| k.cached())
            .map(|(_, counts)| counts.values().sum::<usize>())
            .sum::<usize>(),
        "caches synced; starting workers"
    );
    tasks.push(tokio::spawn(prune_cache(
        client.clone(),
        ctx.settings.namespaces.clone(),
        cache.clone(),
    )));
    tasks.push(tokio::spawn(write_touched_times(cache.clone())));
    tasks.push(tokio::spawn(report_readiness(
        ctx.clone(),
        registry.clone(),
        args.metrics_per_resource,
    )));
    tasks.push(tokio::spawn(report_queue(
        ctx.clone(),
        registry.clone(),
        wired.cached,
    )));
    let workers: Vec<_> = registry
        .kinds()
        .iter()
        .map(|k| k.clone().start(ctx.clone()))
        .collect();
    tracing::info!("workers started; ready");
    readiness.started.store(true, Ordering::Release);

    let shard_moves = ShardMoves {
        coordinator: &coordinator,
        registry: &registry,
        ctx: &ctx,
        gate: &gate,
        scopes: scopes.zip(labeler),
        settle: if resumed {
            shards::Settle::at_once()
        } else {
            shards::Settle::fresh(args.retry_period, args.expected_replicas)
        },
    };
    tasks.extend(shard_moves.follow(shard_events, wired.reload_budget, pod_ref(&args, pod_name)));
    tasks.push(servers);

    shutdown_signal().await;
    stop(&registry, &ctx, &coordinator, workers, tasks).await;
    Ok(())
}

/// The control runtime, and the health and metrics servers started on it:
/// probes are answered (not ready until `started`) from the start, however
/// long discovery and the first lists take.
/// Whether the replica is ready (its caches synced and its workers
/// started), and what it waits for until then.
#[derive(Default)]
struct Readiness {
    started: AtomicBool,
    waiting: std::sync::Mutex<Option<String>>,
}

impl Readiness {
    fn waiting_for(&self, why: Option<String>) {
        *self.waiting.lock().unwrap_or_else(|e| e.into_inner()) = why;
    }

    fn check(&self) -> Result<(), String> {
        if self.started.load(Ordering::Acquire) {
            return Ok(());
        }
        let waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        Err(waiting
            .clone()
            .unwrap_or_else(|| "caches not synced".to_owned()))
    }
}

async fn start_control(
    args: &RunArgs,
    metrics: &Metrics,
    readiness: Arc<Readiness>,
) -> anyhow::Result<(control::Control, tokio::task::JoinHandle<()>)> {
    let ready: server::ReadyFn = Arc::new(move || readiness.check());
    let tls = server::MetricsTls {
        enabled: args.metrics_tls,
        cert_dir: args.metrics_cert_path.clone(),
        cert_name: args.metrics_cert_name.clone(),
        key_name: args.metrics_cert_key.clone(),
    };
    let control = control::Control::start().await?;
    let (health, addr) = (args.health_addr, args.metrics_addr);
    let (metrics, client) = (metrics.clone(), control.client.clone());
    let servers = control
        .run(async move { server::start(&health, &addr, metrics, ready, &tls, client).await })
        .await??;
    Ok((control, servers))
}

/// The shard coordinator, on the control runtime with its client.
fn start_coordinator(
    control: &control::Control,
    args: &RunArgs,
    pod_name: &str,
) -> anyhow::Result<shard::Coordinator> {
    let _control = control.enter();
    shard::Coordinator::start(
        control.client.clone(),
        shard::Config {
            shards: args.shards,
            lease_duration: args.lease_duration,
            renew_deadline: args.renew_deadline,
            retry_period: args.retry_period,
            ..shard::Config::new(&args.pod_namespace, &args.lease_prefix, pod_name)
        },
    )
    .map_err(|e| anyhow::anyhow!("sharding: {e}"))
}

/// Split by shard (the default), a replica caches only what it owns and
/// works on a gained shard once its watches have listed it: the shard
/// scopes, and the gate that says so.
fn ownership(
    args: &RunArgs,
    coordinator: &shard::Coordinator,
) -> (Option<Arc<stores::ShardScopes>>, Arc<dyn Ownership>) {
    let scopes = (args.watch_scope == WatchScope::Shard).then(|| {
        let c = coordinator.clone();
        let shard_of: stores::ShardOf = Arc::new(move |ns: &str| c.shard_of(ns));
        stores::ShardScopes::new(stores::ShardLabels::new(args.shards, shard_of))
    });
    let gate: Arc<dyn Ownership> = match &scopes {
        Some(scopes) => Arc::new(shards::CachedGate::new(coordinator.clone(), scopes.clone())),
        None => Arc::new(coordinator.clone()),
    };
    (scopes, gate)
}

/// Spawn every watch (the kinds' and, split by shard, the shard labeller's).
fn start_watches(
    mut drivers: Vec<futures::future::BoxFuture<'static, ()>>,
    client: &Client,
    scopes: &Option<Arc<stores::ShardScopes>>,
    gate: &Arc<dyn Ownership>,
    ctx: &Context,
) -> (
    Vec<tokio::task::JoinHandle<()>>,
    Option<Arc<shard_labels::Labeler>>,
) {
    let labeler = scopes.as_ref().map(|scopes| {
        let labeler =
            shard_labels::Labeler::new(client.clone(), scopes.labels().clone(), gate.clone());
        drivers.extend(labeler.drivers(&ctx.settings.namespaces));
        labeler
    });
    (drivers.into_iter().map(tokio::spawn).collect(), labeler)
}

/// Wait for the caches' first lists (targets and owners first, then the
/// kinds), and briefly for the global configuration.
async fn wait_for_caches(
    caches: &[Box<dyn Cache>],
    registry: &Registry,
    global: &Scoped<ConfigMap>,
    args: &RunArgs,
) {
    for cache in caches {
        cache.wait_ready().await;
    }
    for kind in registry.kinds() {
        kind.wait_ready().await;
    }
    if tokio::time::timeout(GLOBAL_CONFIG_WAIT, global.wait_ready())
        .await
        .is_err()
    {
        tracing::warn!(
            namespace = %args.global_config_namespace,
            "the global configuration ConfigMap {} could not be listed yet; starting without it \
             (resources that fall back to it wait until it can be read)",
            crate::controllers::refs::GLOBAL_CONFIG_NAME
        );
    }
}

/// This replica's pod, as Events about shard moves name it.
fn pod_ref(args: &RunArgs, pod_name: String) -> k8s_openapi::api::core::v1::ObjectReference {
    k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".to_owned()),
        kind: Some("Pod".to_owned()),
        name: Some(pod_name),
        namespace: Some(args.pod_namespace.clone()),
        ..Default::default()
    }
}

/// What follows the shards as they move.
struct ShardMoves<'a> {
    coordinator: &'a shard::Coordinator,
    registry: &'a Registry,
    ctx: &'a Arc<Context>,
    gate: &'a Arc<dyn Ownership>,
    /// Split by shard: the scopes and the labeller.
    scopes: Option<(Arc<stores::ShardScopes>, Arc<shard_labels::Labeler>)>,
    /// How a fresh replica waits before watching what it gains.
    settle: shards::Settle,
}

impl ShardMoves<'_> {
    /// The drain hook set, the shards' caches followed (split by shard) or
    /// every owned shard queued, the KMS budget shared and shard moves
    /// published: the tasks doing it.
    fn follow(
        self,
        events: tokio::sync::broadcast::Receiver<shard::Event>,
        reload_budget: Arc<Limiter>,
        pod: k8s_openapi::api::core::v1::ObjectReference,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        let (registry, ctx) = (self.registry, self.ctx);
        shards::set_drain_hook(self.coordinator, registry.clone(), ctx.clone());
        let split = self.scopes.is_some();
        let mut tasks = Vec::new();
        match self.scopes {
            Some((scopes, labeler)) => tasks.push(shards::follow_scopes(
                self.coordinator,
                scopes,
                labeler,
                registry.clone(),
                self.gate.clone(),
                self.settle,
            )),
            None => {
                for shard in (0..self.gate.shard_count()).filter(|s| self.gate.owns(*s)) {
                    shards::full_pass(registry, self.gate.as_ref(), shard);
                }
            }
        }
        tasks.push(shards::share_kms_budget(registry.clone(), ctx.clone()));
        tasks.push(shards::follow(
            events,
            registry.clone(),
            ctx.clone(),
            reload_budget,
            pod,
            split,
        ));
        tasks
    }
}

/// The render threads of `--render-threads` and `--render-timeout`.
fn render_pool(args: &RunArgs, metrics: &Metrics) -> crate::controllers::render::RenderPool {
    use crate::controllers::render::{RenderPool, default_threads};
    let threads = match args.render_threads {
        0 => default_threads(),
        n => usize::from(n),
    };
    let stopped = metrics.renders_stopped.clone();
    RenderPool::new(
        threads,
        args.render_timeout,
        kms_template::Limits::default().resource_fuel,
        Arc::new(move || stopped.inc()),
    )
}

/// Whether this replica's member Lease exists, held by it: its last process
/// did not stop gracefully (a graceful stop deletes it).
async fn resumed_member(client: &Client, args: &RunArgs, identity: &str) -> bool {
    let name = shard::member_lease_name(&args.lease_prefix, identity);
    let api: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(client.clone(), &args.pod_namespace);
    match api.get_opt(&name).await {
        Ok(Some(lease)) => lease
            .spec
            .and_then(|s| s.holder_identity)
            .is_some_and(|h| h == identity),
        _ => false,
    }
}

/// How long the reconciles in flight get to finish when the operator stops,
/// before those still running are dropped. A reconcile finishes in
/// milliseconds when the KMS and the API server answer; one still running
/// after this is waiting on a failing KMS (retrying for up to 15 s) or a
/// write the API server holds, and the next holder of its shard does it
/// again sooner than it would finish.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// The graceful stop: no new work, the reconciles in flight finish
/// ([`STOP_GRACE`], then those left are dropped as on a lost shard), the
/// cache is flushed, the shards are handed over, and lease steps that must
/// not be dropped finish (15 s at most).
async fn stop(
    registry: &Registry,
    ctx: &Context,
    coordinator: &shard::Coordinator,
    workers: Vec<tokio::task::JoinHandle<()>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
) {
    tracing::info!("shutting down: no new work; waiting for reconciles in flight");
    registry.close();
    let mut drained = futures::future::join_all(workers);
    if tokio::time::timeout(STOP_GRACE, &mut drained)
        .await
        .is_err()
    {
        tracing::info!(
            grace = ?STOP_GRACE,
            "reconciles still running at the end of the grace; dropping them (the next holder of their shards does them)"
        );
        ctx.stop.cancel();
        if tokio::time::timeout(Duration::from_secs(5), drained)
            .await
            .is_err()
        {
            tracing::warn!(
                "workers still running 5s after their reconciles were dropped; exiting anyway"
            );
        }
    }
    if let Some(store) = &ctx.cache
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
    for t in tasks {
        t.abort();
    }
    tracing::info!("stopped");
}

/// How long the start waits for the first list of `kms-config`.
const GLOBAL_CONFIG_WAIT: Duration = Duration::from_secs(5);

/// What [`wire`] puts together; nothing runs until the drivers are spawned.
struct Wired {
    ctx: Arc<Context>,
    registry: Registry,
    /// The futures that drive every watch.
    drivers: Vec<futures::future::BoxFuture<'static, ()>>,
    /// Caches to wait for besides the kinds' own.
    caches: Vec<Box<dyn Cache>>,
    /// The global configuration's watch: waited for briefly, never
    /// required (see [`GLOBAL_CONFIG_WAIT`]).
    global_store: Scoped<ConfigMap>,
    /// The rollout budget, shared among live replicas.
    reload_budget: Arc<Limiter>,
    /// The caches of managed objects, by kind (for
    /// `kms_operator_cached_objects`; the kinds' own caches are counted
    /// through the registry).
    cached: Vec<(&'static str, Box<dyn Cache>)>,
}

/// A cache that can be waited for and counted by shard.
trait Cache: Send + Sync {
    fn wait_ready(&self) -> futures::future::BoxFuture<'_, ()>;
    fn counts(&self) -> std::collections::BTreeMap<Option<u32>, usize>;
}

impl<K> Cache for Scoped<K>
where
    K: kube::Resource
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + serde::Serialize
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default + std::hash::Hash + Eq + Clone + Send + Sync,
{
    fn wait_ready(&self) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(Scoped::wait_ready(self))
    }
    fn counts(&self) -> std::collections::BTreeMap<Option<u32>, usize> {
        Scoped::counts(self)
    }
}

/// The watches, the registered kinds and the reconcile context.
fn wire(
    args: &RunArgs,
    client: &Client,
    pod_name: &str,
    (gate, scopes): (Arc<dyn Ownership>, Option<Arc<stores::ShardScopes>>),
    metrics: &Metrics,
    cache: Option<storage::Store>,
    served: ServedKinds,
) -> anyhow::Result<Wired> {
    let kms = kms_client(args, metrics, cache.as_ref());
    let namespaces: Vec<String> = args
        .namespaces
        .iter()
        .filter(|n| !n.is_empty())
        .cloned()
        .collect();
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "kms-operator".into(),
            instance: Some(pod_name.to_owned()),
        },
    );
    let undecodable = stores::Undecodable::new(metrics.clone(), Some(recorder.clone()));
    let all = stores::Watches::new(client.clone(), namespaces.clone(), undecodable.clone());
    // The resources and the objects they manage, split by shard unless
    // `--watch-scope=cluster`; workloads are users' objects and carry no
    // shard label.
    let by_shard = match scopes {
        Some(scopes) => all.by_shard(scopes),
        None => all.clone(),
    };
    let routes = watches::Routes {
        registry: Registry::default(),
        gate: gate.clone(),
        reload_queue: Arc::new(Queue::new()),
        consumers: Arc::new(ConsumerIndex::default()),
        debounce: args.reload_debounce,
        own_writes: Arc::default(),
    };
    let index = Arc::new(RefIndex::default());
    // The table of kinds: one line each.
    let wiring = Wiring {
        watches: &by_shard,
        gate: gate.clone(),
        refs: index.clone(),
        kms: kms.clone(),
    };
    let mut drivers = Vec::new();
    let mut kinds: Vec<Arc<dyn Kind>> = Vec::new();
    for register in [
        kms_secret::watch::kind,
        kms_push_secret::kind,
        kms_dynamic_secret::kind,
    ] {
        let (kind, d) = register(&wiring);
        kinds.push(kind);
        drivers.extend(d);
    }
    let (secrets, config_maps, d) = watches::managed_objects(&by_shard, &routes, index.clone());
    drivers.extend(d);
    let (workloads, d) =
        watches::workloads(&all, &routes, (&secrets, &config_maps), args.argo_rollouts);
    drivers.extend(d);
    let referenced = Arc::new(SecretReads::new(secrets.clone()));
    drivers.extend(watches::referenced_secrets(
        client,
        &namespaces,
        &routes,
        index,
        referenced.clone(),
    ));
    let (global, global_epoch, global_store, d) = global_config(client, args, undecodable, &routes);
    drivers.extend(d);
    let reload_budget = Arc::new(Limiter::new(args.max_reloads_per_second));
    reload_budget.set_members(gate.members());
    // The one list of kinds: routing, readiness, the global configuration,
    // full passes, drains, metrics, workers and shutdown all loop over it.
    let registry = routes.registry.clone();
    kinds.push(Arc::new(reload::Registration {
        reloader: Arc::new(Reloader {
            workloads,
            index: routes.consumers.clone(),
            budget: reload_budget.clone(),
            debounce: args.reload_debounce,
            registry: routes.registry.clone(),
        }),
        queue: routes.reload_queue.clone(),
    }));
    registry.set(kinds);
    let settings = settings(args, namespaces)?;
    let ctx = Arc::new(Context {
        client: client.clone(),
        kms,
        metrics: metrics.clone(),
        gate,
        settings,
        recorder,
        renderer: crate::controllers::target::engine_renderer(kms_template::Engine::default()),
        renders: Arc::new(render_pool(args, metrics)),
        secrets: secrets.clone(),
        config_maps: config_maps.clone(),
        consumers: routes.consumers.clone(),
        cache,
        referenced,
        critical: tokio_util::task::TaskTracker::new(),
        stop: tokio_util::sync::CancellationToken::new(),
        global,
        global_epoch,
        served,
        worker_scale: tokio::sync::watch::Sender::new(1.0),
        own_writes: routes.own_writes.clone(),
    });
    let cached: Vec<(&'static str, Box<dyn Cache>)> = vec![
        ("Secret", Box::new(secrets.clone())),
        ("ConfigMap", Box::new(config_maps.clone())),
    ];
    Ok(Wired {
        ctx,
        registry,
        drivers,
        caches: vec![Box::new(secrets), Box::new(config_maps)],
        global_store,
        reload_budget,
        cached,
    })
}

/// The global configuration (`kms-config`), its change count, its watch's
/// cache and drivers. Until the watch has listed it, what falls back to
/// kms-config waits; the operator starts without it (a namespace-scoped
/// install may lack access to it, and the namespace may not exist yet).
#[allow(clippy::type_complexity)]
fn global_config(
    client: &Client,
    args: &RunArgs,
    undecodable: stores::Undecodable,
    routes: &watches::Routes,
) -> (
    Arc<RwLock<GlobalConfig>>,
    Arc<std::sync::atomic::AtomicU64>,
    Scoped<ConfigMap>,
    Vec<futures::future::BoxFuture<'static, ()>>,
) {
    let global = Arc::new(RwLock::new(GlobalConfig::pending(
        &args.global_config_namespace,
    )));
    let global_epoch = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (store, drivers) = watches::global_config(
        client,
        &args.global_config_namespace,
        undecodable,
        (global.clone(), global_epoch.clone()),
        routes,
    );
    (global, global_epoch, store, drivers)
}

/// The controllers' settings from the flags.
fn settings(args: &RunArgs, namespaces: Vec<String>) -> anyhow::Result<Settings> {
    Ok(Settings {
        allow_cross_namespace_refs: args.allow_cross_namespace_refs,
        pod_namespace: args.pod_namespace.clone(),
        global_config_namespace: args.global_config_namespace.clone(),
        defaults: crate::controllers::refs::Defaults {
            host_api: args
                .default_host_api
                .clone()
                .map(|h| h.trim().to_owned())
                .filter(|h| !h.is_empty()),
            ca_ref: args.default_ca_ref.clone(),
        },
        namespaces,
        cleanup_timeout: args.cleanup_timeout,
        workers: usize::from(args.workers),
        cloud_identities: Arc::new(match &args.cloud_identities {
            Some(path) => CloudIdentities::load(path)?,
            None => CloudIdentities::default(),
        }),
        ..Settings::default()
    })
}

/// The KMS client: its budget, allowed hosts, token store and the cloud
/// identity endpoints.
fn kms_client(args: &RunArgs, metrics: &Metrics, cache: Option<&storage::Store>) -> Arc<Kms> {
    let mut kms = Kms::new(
        KmsConfig {
            rate_limit: args.kms_rate_limit,
            max_secrets: args.kms_max_secrets,
            answer_budget: args.kms_memory_budget,
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
    if let Some(store) = cache {
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
    Arc::new(kms)
}

/// How often the times that resyncs by ticket moved on are written to the
/// cache (what a crash can lose: those resources are checked again sooner).
const TOUCHED_EVERY: Duration = Duration::from_secs(5);
/// How many of those times one step writes before the task yields.
const TOUCHED_STEP: usize = 256;

/// Write the times resyncs by ticket moved on every [`TOUCHED_EVERY`], in
/// key order (see `storage::Store::touch_sync`), a few hundred at a time
/// with a yield between (a step takes a millisecond or two); a flush at a
/// hand-over or at the stop writes what is left. Written in one batch from
/// a blocking thread instead, the replicas' memory grew by 54–89 MiB in 7
/// minutes left alone at 100,000 resources; this way, by 8–18 MiB.
async fn write_touched_times(cache: Option<storage::Store>) {
    let Some(store) = cache else { return };
    let mut tick = tokio::time::interval(TOUCHED_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        loop {
            match store.write_touched(TOUCHED_STEP) {
                Ok(0) => break,
                Ok(_) => tokio::task::yield_now().await,
                Err(e) => {
                    tracing::warn!(error = %e, "could not write the cache's moved-on times");
                    break;
                }
            }
        }
    }
}

/// Drop the cache's sync records of KmsSecrets that no longer exist and
/// the access tokens that have expired. (Lease records go when their lease
/// is recorded or revoked; see `kms_dynamic_secret::pending`.) The live
/// resources are listed by metadata, a page at a time: a replica caches
/// only its shards' resources, the cache may hold any.
async fn prune_cache(client: Client, namespaces: Vec<String>, cache: Option<storage::Store>) {
    let Some(store) = cache else { return };
    match live_uids(&client, &namespaces).await {
        Ok(live) => {
            match store.retain(|kind, uid| kind != storage::RecordKind::Sync || live.contains(uid))
            {
                Ok(n) if n > 0 => {
                    tracing::info!(removed = n, "pruned cache records of deleted resources")
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "could not prune the cache"),
            }
        }
        Err(e) => tracing::warn!(error = %e, "could not list KmsSecrets to prune the cache"),
    }
    let now = k8s_openapi::jiff::Timestamp::now().as_millisecond();
    match store.prune_tokens(now) {
        Ok(n) if n > 0 => {
            tracing::info!(removed = n, "pruned expired access tokens from the cache")
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "could not prune the cache's access tokens"),
    }
}

/// The uids of every KmsSecret in `namespaces` (all when empty).
async fn live_uids(client: &Client, namespaces: &[String]) -> Result<HashSet<String>, kube::Error> {
    let apis: Vec<kube::Api<KmsSecret>> = if namespaces.is_empty() {
        vec![kube::Api::all(client.clone())]
    } else {
        namespaces
            .iter()
            .map(|ns| kube::Api::namespaced(client.clone(), ns))
            .collect()
    };
    let mut live = HashSet::new();
    for api in apis {
        let mut params = kube::api::ListParams::default().limit(500);
        loop {
            let page = api.list_metadata(&params).await?;
            live.extend(page.items.iter().filter_map(|o| o.metadata.uid.clone()));
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => break,
            }
        }
    }
    Ok(live)
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

/// Publish queue depth, oldest age, owned shards, managed objects and held
/// dynamic leases per controller and shard, every 5 s.
/// Every 5 s, the resources this replica owns by their Ready condition
/// (`kms_operator_resource_ready`, see `controllers::readiness`).
async fn report_readiness(ctx: Arc<Context>, registry: Registry, per_resource: bool) {
    use crate::controllers::readiness;
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    let mut last = readiness::Published::default();
    loop {
        tick.tick().await;
        // The rows come from the cached objects of the shards owned: with
        // no store changed and the same shards owned they are those
        // published last (a scan decodes every resource's conditions).
        let shards: Vec<u32> = (0..ctx.gate.shard_count())
            .filter(|s| ctx.gate.owns(*s))
            .collect();
        if !last.stale(crate::controllers::packed::changes(), shards) {
            continue;
        }
        let owned = |ns: &str| ctx.gate.owns(ctx.gate.shard_of(ns));
        let rows: Vec<_> = registry
            .kinds()
            .iter()
            .flat_map(|k| k.ready_rows(&owned))
            .collect();
        readiness::publish(&ctx.metrics, &rows, per_resource, &mut last);
    }
}

/// Counts of the cached objects (kind → shard or `None` → count) and of each
/// kind's resources by shard, as of a count of store changes.
#[derive(Default)]
struct Counted {
    changes: Option<u64>,
    cached: Vec<(&'static str, std::collections::BTreeMap<Option<u32>, usize>)>,
    resources: Vec<Option<HashMap<u32, i64>>>,
}

async fn report_queue(
    ctx: Arc<Context>,
    registry: Registry,
    cached: Vec<(&'static str, Box<dyn Cache>)>,
) {
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    let mut counted = Counted::default();
    loop {
        tick.tick().await;
        // Counting walks every cached object: only when a store changed
        // since the last count (left alone, none does).
        let changes = crate::controllers::packed::changes();
        if counted.changes != Some(changes) {
            let of_kinds = registry.kinds().iter().filter_map(|k| k.cached());
            let of_caches = cached.iter().map(|(kind, cache)| (*kind, cache.counts()));
            counted = Counted {
                changes: Some(changes),
                cached: of_kinds.chain(of_caches).collect(),
                resources: registry
                    .kinds()
                    .iter()
                    .map(|kind| {
                        let mut counts: HashMap<u32, i64> = HashMap::new();
                        for ns in kind.resource_namespaces()? {
                            *counts.entry(ctx.gate.shard_of(&ns)).or_default() += 1;
                        }
                        Some(counts)
                    })
                    .collect(),
            };
        }
        for (kind, counts) in &counted.cached {
            let whole = counts.get(&None).copied();
            let gauge = |shard: &str, n: usize| {
                ctx.metrics
                    .cached_objects
                    .with_label_values(&[kind, shard])
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            };
            match whole {
                Some(n) => gauge("all", n),
                None => {
                    for shard in 0..ctx.gate.shard_count() {
                        gauge(
                            &shard.to_string(),
                            counts.get(&Some(shard)).copied().unwrap_or(0),
                        );
                    }
                }
            }
        }
        for (kind, counts) in registry.kinds().iter().zip(&counted.resources) {
            kind.report(&ctx);
            let Some(counts) = counts else {
                continue;
            };
            let (controller, stats) = (kind.controller(), kind.queue().stats());
            for shard in 0..ctx.gate.shard_count() {
                let s = shard.to_string();
                let labels = [controller, s.as_str()];
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
