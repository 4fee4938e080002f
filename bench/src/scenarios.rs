//! The scenarios. A session is a fresh control plane, a fresh dev server
//! seeded for N resources, the resources created while no operator runs,
//! then R replicas started: that start is the `converge` measurement. The
//! other cluster scenarios (`restart`, `change`, `failover`, `steady`)
//! continue a converged session; `devserver` needs no cluster. `floor` is the same
//! start without an operator: a plain client does the least API work the
//! resources need (each Secret written, each status applied), with the
//! concurrency of the replicas' workers — the time any operator needs at
//! least on this control plane.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use serde_json::{Value, json};

use crate::cluster::{self, ControlPlane};
use crate::kms::{self, DevServer};
use crate::replicas::{Replicas, Settings, Usage};
use crate::stats::{KmsCounts, Summary};
use crate::workload::{self, Crd, SyncMode, Tracker};

/// What every session shares.
#[derive(Clone, Debug)]
pub struct Env {
    /// Repository root (for `tests/testenv`).
    pub repo: PathBuf,
    /// The operator binary (`{bin}`).
    pub operator_bin: PathBuf,
    /// The binary that runs the dev server (`kms-operator`).
    pub devserver_bin: PathBuf,
    /// Command template of a replica.
    pub template: String,
    /// Extra arguments for every replica.
    pub extra_args: Vec<String>,
    /// The custom resource.
    pub crd: Crd,
    /// Directory of CRD manifests to apply.
    pub crd_dir: PathBuf,
    /// The testenv directory (wiped for every session).
    pub testenv_dir: PathBuf,
    /// Where logs, caches and KMS data go.
    pub work_dir: PathBuf,
    /// `--shards`.
    pub shards: u32,
    /// `--lease-prefix`.
    pub lease_prefix: String,
    /// The operator's namespace.
    pub pod_namespace: String,
    /// Keys per KMS folder.
    pub keys: usize,
    /// Longest wait for convergence.
    pub converge_timeout: Duration,
    /// Server-side rate limits of the dev KMS (`POST /admin/ratelimit`
    /// body), `None` for none.
    pub kms_limits: Option<serde_json::Value>,
    /// CPU limit of every replica in cores (a cgroup each), `None` for none.
    pub replica_cpu: Option<f64>,
    /// Newcomers created while a converge runs (`crate::newcomers`), and
    /// how far apart.
    pub newcomers: (usize, Duration),
}

impl Env {
    /// The work directory of session `label`: named after the resource kind
    /// too, so that a peer operator's run and ours in one `--work-dir` keep
    /// their own logs.
    pub fn session_dir(&self, label: &str) -> PathBuf {
        self.work_dir
            .join(format!("{}-{label}", self.crd.kind.to_lowercase()))
    }

    /// What runs as a replica, for the report: this repository's binary
    /// (`release`, `debug`) when the command template runs `{bin}`, else
    /// `custom command` (a peer operator).
    pub fn build(&self) -> &'static str {
        if !self.template.contains("{bin}") {
            "custom command"
        } else if self
            .operator_bin
            .components()
            .any(|c| c.as_os_str() == "release")
        {
            "release"
        } else if self
            .operator_bin
            .components()
            .any(|c| c.as_os_str() == "debug")
        {
            "debug"
        } else {
            "unknown"
        }
    }
}

/// Load average and time of a measurement.
#[derive(Clone, Debug, Serialize)]
pub struct Load {
    /// `/proc/loadavg`: 1, 5 and 15 minutes.
    pub loadavg: [f64; 3],
    /// UTC time.
    pub at: String,
}

/// Read the load average now.
pub fn load() -> Load {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut f = text
        .split_whitespace()
        .map(|x| x.parse::<f64>().unwrap_or(-1.0));
    Load {
        loadavg: [
            f.next().unwrap_or(-1.0),
            f.next().unwrap_or(-1.0),
            f.next().unwrap_or(-1.0),
        ],
        at: k8s_openapi::jiff::Timestamp::now()
            .round(k8s_openapi::jiff::Unit::Second)
            .map(|t| t.to_string())
            .unwrap_or_default(),
    }
}

fn secs(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0).round() / 1000.0
}

/// A converged session, ready for the follow-up scenarios.
pub struct Session {
    env: Env,
    /// Label.
    pub label: String,
    /// The replicas (dropped, hence killed, first).
    pub replicas: Replicas,
    tracker: Tracker,
    kms: DevServer,
    client: kube::Client,
    _cp: ControlPlane,
    namespaces: Vec<String>,
    n: usize,
    sync: SyncMode,
}

/// Result of `converge`.
#[derive(Clone, Debug, Serialize)]
pub struct Converge {
    /// Resources.
    pub n: usize,
    /// Namespaces.
    pub namespaces: usize,
    /// Replicas.
    pub replicas: usize,
    /// The resources' sync settings.
    pub sync: SyncMode,
    /// Load before the start.
    pub load: Load,
    /// Seconds from the replicas' start until every resource was Ready with
    /// its Secret; `None` when it did not happen within the timeout.
    pub seconds: Option<f64>,
    /// Resources done at the end (all of them unless timed out).
    pub converged: usize,
    /// KMS requests until then.
    pub kms: KmsCounts,
    /// API server requests until then (every client; the benchmark's own
    /// watches were open before).
    pub apiserver_requests: f64,
    /// The same by verb.
    pub apiserver_by_verb: BTreeMap<String, f64>,
    /// The same by verb and resource (`APPLY kmssecrets/status`).
    #[serde(default)]
    pub apiserver_by_request: BTreeMap<String, f64>,
    /// Bytes the API server's watches sent until then, by kind (every
    /// watcher).
    #[serde(default)]
    pub watch_bytes: BTreeMap<String, f64>,
    /// Events the API server's watches sent until then, by kind (every
    /// watcher: each replica and the benchmark).
    #[serde(default)]
    pub watch_events: BTreeMap<String, f64>,
    /// Peak RSS and CPU per replica at that time.
    pub usage: Vec<Usage>,
    /// Seconds spent creating the resources (before the replicas started).
    pub create_seconds: f64,
    /// Resources created in fresh namespaces while it ran, timed to Ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub newcomers: Option<crate::newcomers::NewcomerTimes>,
}

impl Session {
    /// Start a session of `n` resources and `r` replicas and measure their
    /// convergence.
    pub async fn converge(
        env: &Env,
        label: &str,
        n: usize,
        r: usize,
        sync: SyncMode,
    ) -> anyhow::Result<(Self, Converge)> {
        let (dir, cp, client) = fresh_cluster(env, label).await?;
        cluster::create_namespace(&client, &env.pod_namespace).await?;
        let namespaces = workload::namespaces(n);
        eprintln!("[{label}] dev server ({} folders)", namespaces.len());
        let (newcomers, newcomer_every) = env.newcomers;
        let seeded = [namespaces.clone(), workload::newcomer_namespaces(newcomers)].concat();
        let kms = DevServer::start(
            &env.devserver_bin,
            &dir.join("kms"),
            &kms::seed(&seeded, env.keys),
        )?;
        if let Some(limits) = &env.kms_limits {
            kms.admin(reqwest::Method::POST, "ratelimit", Some(limits.clone()))
                .await?;
        }
        let key_file = dir.join("cache.key");
        let key = format!(
            "{:032x}",
            k8s_openapi::jiff::Timestamp::now().as_nanosecond()
        );
        std::fs::write(&key_file, &key.as_bytes()[key.len() - 32..])?;
        let tracker = Tracker::start(&client, &env.crd);
        eprintln!("[{label}] creating {n} resources");
        let created = Instant::now();
        workload::create(&client, &env.crd, n, &kms.api(), &sync).await?;
        let create_seconds = secs(created.elapsed());
        let replicas = Replicas::new(
            Settings {
                template: env.template.clone(),
                bin: env.operator_bin.clone(),
                kubeconfig: cp.kubeconfig.clone(),
                namespace: env.pod_namespace.clone(),
                kms_url: kms.api(),
                lease_prefix: env.lease_prefix.clone(),
                shards: env.shards,
                key_file,
                extra_args: env.extra_args.clone(),
                cpu_limit: env.replica_cpu,
                dir: dir.join("replicas"),
            },
            r,
        )?;
        // Let the API server settle after the burst of creates.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let mut s = Self {
            env: env.clone(),
            label: label.to_owned(),
            _cp: cp,
            client,
            kms,
            replicas,
            tracker,
            namespaces,
            n,
            sync: sync.clone(),
        };
        s.kms.reset_stats().await?;
        let api_before = cluster::apiserver_requests(&s.client).await?;
        let load = load();
        eprintln!("[{label}] starting {r} replica(s), load {:?}", load.loadavg);
        let t0 = Instant::now();
        s.replicas.start_all()?;
        let arrivals = (newcomers > 0).then(|| {
            crate::newcomers::Newcomers::start(
                &s.client,
                &env.crd,
                &s.kms.api(),
                &sync,
                newcomers,
                newcomer_every,
            )
        });
        let took = s
            .tracker
            .wait_converged(n, t0, env.converge_timeout, |done| {
                eprintln!(
                    "[{label}]   {done}/{n} after {:.0} s",
                    t0.elapsed().as_secs_f64()
                );
            })
            .await;
        let usage = s.replicas.usage();
        let counts = s.kms.counts().await?;
        let api = cluster::apiserver_requests(&s.client)
            .await?
            .since(&api_before);
        let newcomers = match arrivals {
            Some(a) => Some(a.finish(&s.tracker, t0, Duration::from_secs(60)).await),
            None => None,
        };
        // Every resource said Ready; now check that their Secrets exist
        // (one list, not timed, not counted) and watch them for what
        // follows.
        s.tracker.watch_secrets();
        if !s
            .tracker
            .wait_secrets_listed(Duration::from_secs(120))
            .await
        {
            eprintln!("[{label}] the Secrets were not listed within 120 s");
        }
        let exited = s.replicas.exited();
        if !exited.is_empty() {
            eprintln!("[{label}] replicas exited: {exited:?}");
        }
        let result = Converge {
            n,
            namespaces: s.namespaces.len(),
            replicas: r,
            sync,
            load,
            seconds: took.map(secs),
            converged: s.tracker.converged(),
            kms: counts,
            apiserver_requests: api.total,
            apiserver_by_verb: api.by_verb,
            apiserver_by_request: api.by_request,
            watch_bytes: api.watch_bytes,
            watch_events: api.watch_events,
            usage,
            create_seconds,
            newcomers,
        };
        eprintln!(
            "[{label}] converged: {:?} s, KMS {} requests",
            result.seconds, result.kms.total
        );
        Ok((s, result))
    }

    /// Leave the converged session alone: wait `settle`, then count what a
    /// `window` with nothing changing costs (see [`crate::steady`]).
    pub async fn steady(
        &mut self,
        settle: Duration,
        window: Duration,
    ) -> anyhow::Result<crate::steady::Steady> {
        use crate::steady;
        tokio::time::sleep(settle).await;
        let load = load();
        self.kms.reset_stats().await?;
        let api_before = cluster::apiserver_requests(&self.client).await?;
        let usage_before = self.replicas.usage();
        let t0 = Instant::now();
        eprintln!("[{}] steady for {} s", self.label, window.as_secs());
        while t0.elapsed() < window {
            let left = window.saturating_sub(t0.elapsed());
            tokio::time::sleep(left.min(Duration::from_secs(300))).await;
            let so_far = self.kms.counts().await?;
            eprintln!(
                "[{}]   {:.0} s: KMS {} ({} fetches, {} × 304)",
                self.label,
                t0.elapsed().as_secs_f64(),
                so_far.total,
                so_far.fetches,
                so_far.fetches_not_modified
            );
        }
        let took = t0.elapsed();
        let kms = self.kms.counts().await?;
        let api = cluster::apiserver_requests(&self.client)
            .await?
            .since(&api_before);
        let usage = self.replicas.usage();
        let writes = steady::writes(&api.by_request);
        let minutes = took.as_secs_f64() / 60.0;
        let interval = steady::resync_interval(&self.sync);
        Ok(steady::Steady {
            n: self.n,
            folders: self.namespaces.len(),
            replicas: self.replicas.set.len(),
            sync: self.sync.clone(),
            load,
            settle_seconds: secs(settle),
            window_seconds: secs(took),
            fetches_per_minute: kms.fetches as f64 / minutes,
            folders_due_per_minute: self.namespaces.len() as f64 * 60.0 / interval.as_secs_f64(),
            kms,
            apiserver_requests: api.total,
            lease_writes_per_second: writes.get("leases").copied().unwrap_or(0.0)
                / took.as_secs_f64(),
            lease_writes_per_second_model: steady::lease_writes_model(
                self.env.shards,
                self.replicas.set.len(),
            ),
            apiserver_by_request: api.by_request,
            writes,
            watch_bytes_per_second: steady::per_second(&api.watch_bytes, took.as_secs_f64()),
            watch_events_per_second: steady::per_second(&api.watch_events, took.as_secs_f64()),
            cpu_percent: steady::cpu_percent(&usage_before, &usage, took),
            usage,
        })
    }

    /// Stop everything of the session.
    pub fn stop(mut self) {
        self.replicas.stop_all(Duration::from_secs(20));
        self.kms.stop();
    }

    /// Restart every replica cold (caches deleted) and warm (caches kept).
    pub async fn restart(&mut self, window: Duration) -> anyhow::Result<Vec<Restart>> {
        let mut out = Vec::new();
        for mode in ["cold", "warm"] {
            self.replicas.stop_all(Duration::from_secs(30));
            if mode == "cold" {
                self.replicas.wipe_caches();
            }
            self.kms.reset_stats().await?;
            let load = load();
            eprintln!("[{}] {mode} restart, load {:?}", self.label, load.loadavg);
            let t0 = Instant::now();
            self.replicas.start_all()?;
            let mut ready_at = None;
            let mut at_ready = None;
            while t0.elapsed() < window {
                if ready_at.is_none() && self.replicas.all_ready().await {
                    ready_at = Some(t0.elapsed());
                    at_ready = Some(self.kms.counts().await?);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let in_window = self.kms.counts().await?;
            out.push(Restart {
                mode: mode.to_owned(),
                n: self.n,
                replicas: self.replicas.set.len(),
                load,
                seconds_to_ready: ready_at.map(secs),
                kms_until_ready: at_ready,
                window_seconds: window.as_secs_f64(),
                kms_in_window: in_window,
                usage: self.replicas.usage(),
            });
        }
        Ok(out)
    }

    /// Stop every replica for `outage`, start them again (with `budget`
    /// as `--kms-rate-limit` when given) and measure until every folder has
    /// been read, or three times the target and two minutes passed, and
    /// `after` more (see [`crate::outage`]).
    pub async fn outage(
        &mut self,
        outage: Duration,
        budget: Option<f64>,
        after: Duration,
    ) -> anyhow::Result<crate::outage::Outage> {
        use crate::outage;
        self.replicas.stop_all(Duration::from_secs(30));
        eprintln!(
            "[{}] every replica stopped for {} s",
            self.label,
            outage.as_secs()
        );
        tokio::time::sleep(outage).await;
        if let Some(b) = budget {
            let args = outage::with_budget(self.replicas.extra_args(), b);
            self.replicas.set_extra_args(args);
        }
        let budget = outage::budget_of(self.replicas.extra_args());
        let folders = self.namespaces.len();
        let wait = outage::target(folders, budget) * 3 + Duration::from_secs(120);
        self.kms.reset_stats().await?;
        let load = load();
        let t0 = Instant::now();
        self.replicas.start_all()?;
        let (mut per_second, mut last_total) = (Vec::new(), 0);
        let mut sample_seconds = vec![0.0];
        let (mut ready_at, mut checked_at, mut end) = (None, None, t0 + wait);
        let mut reconciled_at = None;
        let mut counts = self.kms.counts().await?;
        while Instant::now() < end {
            let next = t0 + Duration::from_secs(per_second.len() as u64 + 1);
            tokio::time::sleep_until(next.into()).await;
            counts = self.kms.counts().await?;
            sample_seconds.push(t0.elapsed().as_secs_f64());
            per_second.push(counts.total - last_total);
            last_total = counts.total;
            if ready_at.is_none() && self.replicas.all_ready().await {
                ready_at = Some(t0.elapsed());
            }
            if per_second.len() % 10 == 0 {
                eprintln!(
                    "[{}]   {} s: {} KMS requests, {}/{folders} folders checked",
                    self.label,
                    per_second.len(),
                    counts.total,
                    counts.folders_read
                );
            }
            if reconciled_at.is_none()
                && let Ok(Some(done)) = self.replicas.reconciles().await
                && done >= self.n as f64
            {
                reconciled_at = Some(t0.elapsed());
            }
            if checked_at.is_none()
                && counts.folders_read >= folders as u64
                && reconciled_at.is_some()
            {
                checked_at = Some(t0.elapsed());
                end = Instant::now() + after;
                eprintln!(
                    "[{}] every folder checked after {:.1} s",
                    self.label,
                    t0.elapsed().as_secs_f64()
                );
            }
        }
        let window_budget = budget * outage::WINDOW as f64;
        let (max_window, windows_above_budget) =
            outage::windows(&sample_seconds, &per_second, outage::WINDOW, budget);
        Ok(outage::Outage {
            n: self.n,
            folders,
            replicas: self.replicas.set.len(),
            sync: self.sync.clone(),
            load,
            outage_seconds: secs(outage),
            budget,
            target_seconds: secs(outage::target(folders, budget)),
            seconds_to_ready: ready_at.map(secs),
            seconds_all_checked: checked_at.map(secs),
            seconds_reconciled: reconciled_at.map(secs),
            folders_checked: counts.folders_read,
            kms: counts,
            per_second,
            sample_seconds,
            max_window,
            window_budget,
            windows_above_budget,
            usage: self.replicas.usage(),
        })
    }

    /// Change `KEY` in `percent`% of the folders; measure until the Secrets
    /// follow.
    pub async fn change(&mut self, percent: f64, timeout: Duration) -> anyhow::Result<Change> {
        // Let the start-up work finish.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let count = ((self.namespaces.len() as f64 * percent / 100.0).ceil() as usize)
            .clamp(1, self.namespaces.len());
        let stride = self.namespaces.len() / count;
        let chosen: Vec<String> = (0..count)
            .map(|i| self.namespaces[i * stride].clone())
            .collect();
        let before = self.kms.counts().await?;
        let load = load();
        eprintln!(
            "[{}] changing {count} folders ({} Secrets), load {:?}",
            self.label,
            count * workload::PER_NAMESPACE,
            load.loadavg
        );
        let stamp = k8s_openapi::jiff::Timestamp::now().as_millisecond();
        let mut changes = Vec::new();
        for ns in &chosen {
            let value = format!("v1-{ns}-{stamp}");
            let t0 = Instant::now();
            self.kms
                .put_secret(&kms::folder(ns), workload::KEY, &value)
                .await?;
            changes.push((ns.clone(), value, t0));
        }
        let per_ns = |ns: &str| {
            let idx = self.namespaces.iter().position(|x| x == ns).unwrap_or(0);
            (self.n - idx * workload::PER_NAMESPACE).min(workload::PER_NAMESPACE)
        };
        let expected: usize = chosen.iter().map(|ns| per_ns(ns)).sum();
        let started = Instant::now();
        let mut latencies = Vec::new();
        loop {
            latencies.clear();
            for (ns, value, t0) in &changes {
                for i in 0..per_ns(ns) {
                    let secret = workload::secret_of(&workload::resource_name(i));
                    if let Some(t) = self.tracker.first_seen(ns, &secret, value) {
                        latencies.push(t.saturating_duration_since(*t0).as_secs_f64());
                    }
                }
            }
            if latencies.len() >= expected || started.elapsed() > timeout {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let after = self.kms.counts().await?;
        Ok(Change {
            n: self.n,
            replicas: self.replicas.set.len(),
            sync: self.sync.clone(),
            percent,
            folders_changed: count,
            secrets_expected: expected,
            secrets_followed: latencies.len(),
            load,
            latency_seconds: Summary::of(&latencies),
            kms_during: after.since(&before),
        })
    }

    async fn holders(&self) -> BTreeMap<u32, String> {
        cluster::shard_holders(
            &self.client,
            &self.env.pod_namespace,
            &self.env.lease_prefix,
        )
        .await
        .unwrap_or_default()
    }

    /// Wait until every shard is held by a running replica and every running
    /// replica holds one, unchanged for a second.
    async fn wait_balanced(&self, timeout: Duration) -> bool {
        let started = Instant::now();
        let mut stable_since: Option<(Instant, BTreeMap<u32, String>)> = None;
        while started.elapsed() < timeout {
            let h = self.holders().await;
            let running: BTreeSet<String> = self.replicas.running().into_iter().collect();
            let holders: BTreeSet<&String> = h.values().collect();
            let ok = h.len() == self.env.shards as usize
                && h.values().all(|x| running.contains(x))
                && running.iter().all(|r| holders.contains(r));
            if ok {
                match &stable_since {
                    Some((t, prev)) if *prev == h => {
                        if t.elapsed() > Duration::from_secs(1) {
                            return true;
                        }
                    }
                    _ => stable_since = Some((Instant::now(), h)),
                }
            } else {
                stable_since = None;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        false
    }

    /// Wait until the running replicas finish no reconcile for two seconds
    /// (a replica restarted by the trial before is done with its opening
    /// checks), at most `timeout`; true when they did. An operator without
    /// the counter (a peer) counts as idle.
    async fn wait_idle(&self, timeout: Duration) -> bool {
        let started = Instant::now();
        let mut last: Option<(f64, Instant)> = None;
        while started.elapsed() < timeout {
            let n = match self.replicas.reconciles().await {
                Ok(Some(n)) => n,
                Ok(None) => return true,
                Err(_) => {
                    // A replica still starting: not idle yet.
                    last = None;
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    continue;
                }
            };
            match last {
                Some((m, since)) if (m - n).abs() < 0.5 => {
                    if since.elapsed() >= Duration::from_secs(2) {
                        return true;
                    }
                }
                _ => last = Some((n, Instant::now())),
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        false
    }

    /// Stop a replica `trials` times per kind (SIGTERM, SIGKILL) and measure
    /// until its shards are held by others and a change in one of its
    /// namespaces reached the Secret.
    pub async fn failover(
        &mut self,
        kinds: &[String],
        trials: usize,
    ) -> anyhow::Result<Vec<Failover>> {
        let ring = shard::ring::Ring::new(self.env.shards).context("bad --shards")?;
        let names = self.replicas.names();
        let mut out = Vec::new();
        for kind in kinds {
            let sig = if kind == "crash" { "KILL" } else { "TERM" };
            let load = load();
            let mut rows = Vec::new();
            for trial in 0..trials {
                if !self.wait_balanced(Duration::from_secs(120)).await {
                    eprintln!(
                        "[{}] shards not balanced; trial {trial} runs anyway",
                        self.label
                    );
                }
                if !self.wait_idle(Duration::from_secs(60)).await {
                    eprintln!(
                        "[{}] replicas still busy after 60 s; trial {trial} runs anyway",
                        self.label
                    );
                }
                let victim = names[trial % names.len()].clone();
                let held = self.holders().await;
                let moved: BTreeSet<u32> = held
                    .iter()
                    .filter(|(_, h)| **h == victim)
                    .map(|(s, _)| *s)
                    .collect();
                let Some(ns) = self
                    .namespaces
                    .iter()
                    .filter(|ns| moved.contains(&ring.shard_of(ns)))
                    .nth(trial / names.len())
                    .or_else(|| {
                        self.namespaces
                            .iter()
                            .find(|ns| moved.contains(&ring.shard_of(ns)))
                    })
                    .cloned()
                else {
                    eprintln!(
                        "[{}] {victim} holds no shard with a namespace; skipped",
                        self.label
                    );
                    continue;
                };
                let value = format!(
                    "fo-{kind}-{trial}-{}",
                    k8s_openapi::jiff::Timestamp::now().as_millisecond()
                );
                let t0 = Instant::now();
                self.replicas.send(&victim, sig);
                self.kms
                    .put_secret(&kms::folder(&ns), workload::KEY, &value)
                    .await?;
                let mut lease_at = None;
                let mut secret_at = None;
                while t0.elapsed() < Duration::from_secs(120)
                    && (lease_at.is_none() || secret_at.is_none())
                {
                    if lease_at.is_none() {
                        let h = self.holders().await;
                        if moved
                            .iter()
                            .all(|s| h.get(s).is_some_and(|x| !x.is_empty() && *x != victim))
                        {
                            lease_at = Some(t0.elapsed());
                        }
                    }
                    if secret_at.is_none()
                        && let Some(t) = self.tracker.first_seen(&ns, "out-0", &value)
                    {
                        secret_at = Some(t.saturating_duration_since(t0));
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                let exited = self.replicas.wait_exit(&victim, Duration::from_secs(30));
                let row = FailoverTrial {
                    trial,
                    replica: victim.clone(),
                    shards_moved: moved.len(),
                    namespace: ns,
                    lease_seconds: lease_at.map(secs),
                    secret_seconds: secret_at.map(secs),
                    seconds: lease_at.zip(secret_at).map(|(a, b)| secs(a.max(b))),
                    exited_by_itself: exited,
                };
                eprintln!("[{}] {kind} #{trial}: {:?}", self.label, row);
                rows.push(row);
                self.replicas.start(&victim)?;
            }
            let totals: Vec<f64> = rows.iter().filter_map(|r| r.seconds).collect();
            let leases: Vec<f64> = rows.iter().filter_map(|r| r.lease_seconds).collect();
            let secrets: Vec<f64> = rows.iter().filter_map(|r| r.secret_seconds).collect();
            out.push(Failover {
                kind: kind.clone(),
                n: self.n,
                replicas: names.len(),
                sync: self.sync.clone(),
                load,
                trials: rows.len(),
                seconds: Summary::of(&totals),
                lease_seconds: Summary::of(&leases),
                secret_seconds: Summary::of(&secrets),
                rows,
            });
        }
        Ok(out)
    }
}

/// Result of one restart.
#[derive(Clone, Debug, Serialize)]
pub struct Restart {
    /// `cold` or `warm`.
    pub mode: String,
    /// Resources.
    pub n: usize,
    /// Replicas.
    pub replicas: usize,
    /// Load before.
    pub load: Load,
    /// Seconds until every replica's `/readyz` answered 200.
    pub seconds_to_ready: Option<f64>,
    /// KMS requests until then.
    pub kms_until_ready: Option<KmsCounts>,
    /// Length of the window.
    pub window_seconds: f64,
    /// KMS requests in the window after the start.
    pub kms_in_window: KmsCounts,
    /// Peak RSS and CPU per replica at the end of the window.
    pub usage: Vec<Usage>,
}

/// Result of `change`.
#[derive(Clone, Debug, Serialize)]
pub struct Change {
    /// Resources.
    pub n: usize,
    /// Replicas.
    pub replicas: usize,
    /// The resources' sync settings.
    pub sync: SyncMode,
    /// Share of folders changed.
    pub percent: f64,
    /// Folders changed.
    pub folders_changed: usize,
    /// Secrets that should follow.
    pub secrets_expected: usize,
    /// Secrets that did within the timeout.
    pub secrets_followed: usize,
    /// Load before.
    pub load: Load,
    /// Seconds from the KMS write to the Secret showing the value.
    pub latency_seconds: Summary,
    /// KMS requests meanwhile.
    pub kms_during: KmsCounts,
}

/// One failover trial.
#[derive(Clone, Debug, Serialize)]
pub struct FailoverTrial {
    /// Trial number.
    pub trial: usize,
    /// The replica stopped.
    pub replica: String,
    /// Shards it held.
    pub shards_moved: usize,
    /// The namespace whose folder changed.
    pub namespace: String,
    /// Seconds until its shard Leases were all held by others.
    pub lease_seconds: Option<f64>,
    /// Seconds until the change reached the Secret.
    pub secret_seconds: Option<f64>,
    /// The later of both.
    pub seconds: Option<f64>,
    /// Whether the process exited by itself (SIGTERM) within 30 s.
    pub exited_by_itself: bool,
}

/// Result of `failover` of one kind.
#[derive(Clone, Debug, Serialize)]
pub struct Failover {
    /// `graceful` (SIGTERM) or `crash` (SIGKILL).
    pub kind: String,
    /// Resources.
    pub n: usize,
    /// Replicas.
    pub replicas: usize,
    /// The resources' sync settings.
    pub sync: SyncMode,
    /// Load before the first trial.
    pub load: Load,
    /// Trials run.
    pub trials: usize,
    /// Signal → Leases moved and change applied.
    pub seconds: Summary,
    /// Signal → Leases moved.
    pub lease_seconds: Summary,
    /// Signal → change applied.
    pub secret_seconds: Summary,
    /// Every trial.
    pub rows: Vec<FailoverTrial>,
}

/// Result of `devserver`.
#[derive(Clone, Debug, Serialize)]
pub struct DevServerBench {
    /// Secrets in the folder listed.
    pub secrets: usize,
    /// Load before.
    pub load: Load,
    /// Sequential list latency, milliseconds.
    pub latency_ms: Summary,
    /// Lists per second with `concurrency` clients.
    pub requests_per_second: f64,
    /// Clients of the throughput run.
    pub concurrency: usize,
    /// Peak RSS and CPU of the dev server at the end.
    pub server: Usage,
}

/// List latency and throughput of the dev server with `secrets` secrets in
/// one folder.
pub async fn devserver(
    env: &Env,
    secrets: usize,
    requests: usize,
    concurrency: usize,
    seconds: Duration,
) -> anyhow::Result<DevServerBench> {
    let dir = env.session_dir("devserver");
    let _ = std::fs::remove_dir_all(&dir);
    let mut seed = format!(
        "projects:\n  - slug: {}\n    environments: [{}]\n    secrets:\n      {}:\n        /load:\n",
        kms::PROJECT,
        kms::ENV,
        kms::ENV
    );
    for i in 0..secrets {
        seed.push_str(&format!(
            "          KEY_{i:05}: \"{}\"\n",
            kms::initial_value("load", i)
        ));
    }
    seed.push_str(&format!(
        "identities:\n  - name: loader\n    universalAuth: {{clientId: load, clientSecret: load-secret}}\n    projects: [{}]\n",
        kms::PROJECT
    ));
    let mut server = DevServer::start(&env.devserver_bin, &dir, &seed)?;
    let token = server.login("load", "load-secret").await?;
    let got = server.list(&token, "/load").await?;
    anyhow::ensure!(got == secrets, "listed {got} secrets, expected {secrets}");
    for _ in 0..20 {
        server.list(&token, "/load").await?;
    }
    let load = load();
    let mut lat = Vec::with_capacity(requests);
    for _ in 0..requests {
        let t = Instant::now();
        server.list(&token, "/load").await?;
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let started = Instant::now();
    let mut tasks = Vec::new();
    let server_ref = &server;
    for _ in 0..concurrency {
        let token = token.clone();
        tasks.push(async move {
            let mut n = 0u64;
            while started.elapsed() < seconds {
                server_ref.list(&token, "/load").await?;
                n += 1;
            }
            anyhow::Ok(n)
        });
    }
    let counts = futures::future::try_join_all(tasks).await?;
    let rps = counts.iter().sum::<u64>() as f64 / started.elapsed().as_secs_f64();
    let usage = server
        .pid()
        .map(|p| kms_testkit::replica::usage_of(p, "dev-server"))
        .unwrap_or_default();
    server.stop();
    let _ = std::fs::remove_dir_all(&dir);
    Ok(DevServerBench {
        secrets,
        load,
        latency_ms: Summary::of(&lat),
        requests_per_second: (rps * 10.0).round() / 10.0,
        concurrency,
        server: usage,
    })
}

/// Min, median (nearest rank: of an even count, the lower middle value)
/// and max of `values`; `null` when there are none.
fn spread(values: &[f64]) -> Value {
    match (
        values.iter().copied().reduce(f64::min),
        crate::stats::percentile(values, 50.0),
        values.iter().copied().reduce(f64::max),
    ) {
        (Some(min), Some(median), Some(max)) => json!({"min": min, "median": median, "max": max}),
        _ => Value::Null,
    }
}

/// The converge runs of each size and replica count summarised: how many,
/// and the min, median and max of the time, the KMS requests, the largest
/// replica's peak RSS and its anonymous memory at the end. Only runs that
/// converged count.
pub fn converge_summary(results: &[(String, Value)]) -> Vec<Value> {
    let mut runs: BTreeMap<(u64, u64), Vec<&Value>> = BTreeMap::new();
    for (name, v) in results {
        if name != "converge" || v["converged"].as_u64() != v["n"].as_u64() {
            continue;
        }
        if let (Some(n), Some(r)) = (v["n"].as_u64(), v["replicas"].as_u64()) {
            runs.entry((n, r)).or_default().push(v);
        }
    }
    let largest = |v: &Value, field: &str| {
        v["usage"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|u| u[field].as_f64())
            .reduce(f64::max)
    };
    runs.into_iter()
        .map(|((n, r), vs)| {
            let of = |f: &dyn Fn(&Value) -> Option<f64>| -> Value {
                spread(&vs.iter().filter_map(|v| f(v)).collect::<Vec<_>>())
            };
            json!({
                "n": n,
                "replicas": r,
                "runs": vs.len(),
                "seconds": of(&|v| v["seconds"].as_f64()),
                "kms_requests": of(&|v| v["kms"]["total"].as_f64()),
                "largest_peak_rss_mib": of(&|v| largest(v, "peak_rss_mib")),
                "largest_rss_anon_mib": of(&|v| largest(v, "rss_anon_mib")),
            })
        })
        .collect()
}

/// One line per result for the table.
pub fn table_rows(results: &[(String, Value)]) -> Vec<[String; 3]> {
    let f = |v: &Value| match v.as_f64() {
        Some(x) => format!("{x:.3}"),
        None => "—".to_owned(),
    };
    let mib = |v: &Value| -> String {
        let peaks: Vec<String> = v
            .as_array()
            .into_iter()
            .flatten()
            .map(|u| match u["peak_rss_mib"].as_f64() {
                Some(x) => format!("{x:.0}"),
                None => "?".into(),
            })
            .collect();
        let cpu: Vec<String> = v
            .as_array()
            .into_iter()
            .flatten()
            .map(|u| match u["cpu_seconds"].as_f64() {
                Some(x) => format!("{x:.1}"),
                None => "?".into(),
            })
            .collect();
        // The resident set split when measured: anonymous + file pages
        // (the binary's code, shared by processes of the same file).
        let split: Vec<String> = v
            .as_array()
            .into_iter()
            .flatten()
            .map(
                |u| match (u["rss_anon_mib"].as_f64(), u["rss_file_mib"].as_f64()) {
                    (Some(a), Some(f)) => format!("{a:.0}+{f:.0}"),
                    _ => "?".into(),
                },
            )
            .collect();
        format!(
            "RSS MiB [{}] (anon+file at the end [{}]) CPU s [{}]",
            peaks.join(","),
            split.join(","),
            cpu.join(",")
        )
    };
    let ld = |v: &Value| format!("load {}", f(&v["load"]["loadavg"][0]));
    results
        .iter()
        .map(|(name, v)| {
            let (params, out) = match name.as_str() {
                "converge" => (
                    format!(
                        "N={} R={} ns={} resync={} instant={}",
                        v["n"], v["replicas"], v["namespaces"], v["sync"]["resync"], v["sync"]["instant"]
                    ),
                    format!(
                        "{} s ({}/{} ready); KMS {} (login {}, fetch {}); apiserver {}; {}{}; {}",
                        f(&v["seconds"]),
                        v["converged"],
                        v["n"],
                        v["kms"]["total"],
                        v["kms"]["logins"],
                        v["kms"]["fetches"],
                        f(&v["apiserver_requests"]),
                        mib(&v["usage"]),
                        match v.get("newcomers") {
                            Some(nc) => format!(
                                "; newcomers ready within 2 s: {}/{} (p50 {} s, max {} s)",
                                nc["within_2s"],
                                nc["trials"],
                                f(&nc["summary"]["p50"]),
                                f(&nc["summary"]["max"])
                            ),
                            None => String::new(),
                        },
                        ld(v)
                    ),
                ),
                "steady" => (
                    format!("N={} R={} window={} s", v["n"], v["replicas"], v["window_seconds"]),
                    format!(
                        "KMS fetches {}/min (folders due {}/min; {} × 304), logins {}; writes {}; Lease writes {}/s (model {}/s); watch bytes/s {}; CPU % of a core {}; {}",
                        f(&v["fetches_per_minute"]),
                        f(&v["folders_due_per_minute"]),
                        v["kms"]["fetches_not_modified"],
                        v["kms"]["logins"],
                        v["writes"],
                        f(&v["lease_writes_per_second"]),
                        f(&v["lease_writes_per_second_model"]),
                        v["watch_bytes_per_second"],
                        v["cpu_percent"],
                        ld(v)
                    ),
                ),
                "restart" => (
                    format!("{} N={} R={}", v["mode"], v["n"], v["replicas"]),
                    format!(
                        "ready {} s; first {} s: logins {}, fetches {} ({} × 304), KMS total {}; {}",
                        f(&v["seconds_to_ready"]),
                        v["window_seconds"],
                        v["kms_in_window"]["logins"],
                        v["kms_in_window"]["fetches"],
                        v["kms_in_window"]["fetches_not_modified"],
                        v["kms_in_window"]["total"],
                        ld(v)
                    ),
                ),
                "change" => (
                    format!(
                        "instant={} resync={} N={} R={} {}%",
                        v["sync"]["instant"], v["sync"]["resync"], v["n"], v["replicas"], v["percent"]
                    ),
                    format!(
                        "p50 {} s, p99 {} s, max {} s ({}/{} Secrets); KMS {}; {}",
                        f(&v["latency_seconds"]["p50"]),
                        f(&v["latency_seconds"]["p99"]),
                        f(&v["latency_seconds"]["max"]),
                        v["secrets_followed"],
                        v["secrets_expected"],
                        v["kms_during"]["total"],
                        ld(v)
                    ),
                ),
                "failover" => (
                    format!("{} N={} R={} trials={}", v["kind"], v["n"], v["replicas"], v["trials"]),
                    format!(
                        "{}/{} changes applied within 120 s; median {} s, max {} s (leases: median {}, max {}; Secret: median {}, max {}); {}",
                        v["secret_seconds"]["n"],
                        v["trials"],
                        f(&v["seconds"]["p50"]),
                        f(&v["seconds"]["max"]),
                        f(&v["lease_seconds"]["p50"]),
                        f(&v["lease_seconds"]["max"]),
                        f(&v["secret_seconds"]["p50"]),
                        f(&v["secret_seconds"]["max"]),
                        ld(v)
                    ),
                ),
                "simulate" => (
                    format!("S={} N={} rate={}", v["shards"], v["resources"], v["rate"]),
                    v["steps"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|s| {
                            format!(
                                "R={} shards {}-{} join {} (least {}) leave {}; demand {} s, even {} s, bound {} s",
                                s["replicas"],
                                s["min_shards"],
                                s["max_shards"],
                                s["moves_on_join"],
                                s["least_on_join"],
                                s["moves_on_leave"],
                                f(&s["budget_by_demand_seconds"]),
                                f(&s["even_split_seconds"]),
                                f(&s["bound_seconds"]),
                            )
                        })
                        .collect::<Vec<_>>()
                        .join("\n    "),
                ),
                "converge-summary" => {
                    let mmm = |x: &Value| {
                        format!("{}/{}/{}", f(&x["min"]), f(&x["median"]), f(&x["max"]))
                    };
                    (
                        format!("N={} R={} runs={}", v["n"], v["replicas"], v["runs"]),
                        format!(
                            "min/median/max: {} s; KMS {}; largest replica peak RSS {} MiB, anon at the end {} MiB",
                            mmm(&v["seconds"]),
                            mmm(&v["kms_requests"]),
                            mmm(&v["largest_peak_rss_mib"]),
                            mmm(&v["largest_rss_anon_mib"]),
                        ),
                    )
                }
                "floor" => (
                    format!("N={} ns={} concurrency={}", v["n"], v["namespaces"], v["concurrency"]),
                    format!(
                        "{} s (every Secret written, every status applied, status {}); apiserver {}; {}",
                        f(&v["seconds"]),
                        v["status"].as_str().unwrap_or("ready"),
                        f(&v["apiserver_requests"]),
                        ld(v)
                    ),
                ),
                "devserver" => (
                    format!("{} secrets", v["secrets"]),
                    format!(
                        "list p50 {} ms, p99 {} ms; {} req/s with {} clients; {}",
                        f(&v["latency_ms"]["p50"]),
                        f(&v["latency_ms"]["p99"]),
                        v["requests_per_second"],
                        v["concurrency"],
                        ld(v)
                    ),
                ),
                _ => (String::new(), v.to_string()),
            };
            [name.clone(), params, out]
        })
        .collect()
}

/// A session's empty work directory and a fresh control plane with the
/// CRDs applied.
async fn fresh_cluster(
    env: &Env,
    label: &str,
) -> anyhow::Result<(PathBuf, ControlPlane, kube::Client)> {
    let dir = env.session_dir(label);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    eprintln!("[{label}] control plane");
    let cp = ControlPlane::fresh(&env.repo, &env.testenv_dir)?;
    let client = cluster::client(&cp.kubeconfig).await?;
    cluster::apply_crds(&cp, &env.crd_dir, &client, &env.crd.crd_name()).await?;
    Ok((dir, cp, client))
}

/// Result of `floor`.
#[derive(Clone, Debug, Serialize)]
pub struct Floor {
    /// Resources.
    pub n: usize,
    /// Namespaces.
    pub namespaces: usize,
    /// Requests in flight at once (the replicas' workers).
    pub concurrency: usize,
    /// The status applied: `ready` (one condition) or `full` (a first
    /// sync's).
    pub status: &'static str,
    /// Load before the start.
    pub load: Load,
    /// Seconds to write every Secret and apply every status.
    pub seconds: f64,
    /// API server requests meanwhile (every client).
    pub apiserver_requests: f64,
    /// The same by verb and resource.
    pub apiserver_by_request: BTreeMap<String, f64>,
    /// Seconds spent creating the resources (before the clock started).
    pub create_seconds: f64,
}

/// The floor of a converge of `n` resources: a fresh control plane with the
/// resources created as for `converge`, then, with `concurrency` requests
/// in flight, for each resource a server-side apply of its Secret (the
/// data a sync writes: `env.keys` keys, the managed labels and version
/// annotation) followed by a server-side apply of its status (`Ready`
/// alone, or with `full_status` the status a first sync writes: every
/// condition a KmsSecret's status carries and the status fields). No KMS, no reads,
/// no Events, no watches.
pub async fn floor(
    env: &Env,
    label: &str,
    n: usize,
    concurrency: usize,
    full_status: bool,
) -> anyhow::Result<Floor> {
    use futures::StreamExt;
    use kube::api::{Patch, PatchParams};
    let (_dir, cp, client) = fresh_cluster(env, label).await?;
    let namespaces = workload::namespaces(n);
    eprintln!("[{label}] creating {n} resources");
    let created = Instant::now();
    let no_kms = "http://127.0.0.1:9/api";
    let sync = SyncMode {
        resync: None,
        instant: false,
    };
    workload::create(&client, &env.crd, n, no_kms, &sync).await?;
    let create_seconds = secs(created.elapsed());
    // As converge does: let the API server settle after the creates.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let resources: Vec<(String, String)> = namespaces
        .iter()
        .enumerate()
        .flat_map(|(idx, ns)| {
            let here = (n - idx * workload::PER_NAMESPACE).min(workload::PER_NAMESPACE);
            (0..here).map(move |i| (ns.clone(), workload::resource_name(i)))
        })
        .collect();
    let ar = env.crd.resource();
    let keys = env.keys;
    let api_before = cluster::apiserver_requests(&client).await?;
    let load = load();
    eprintln!(
        "[{label}] writing {} Secrets and statuses, {concurrency} at once, load {:?}",
        resources.len(),
        load.loadavg
    );
    let params = PatchParams::apply("kms-bench-floor").force();
    let t0 = Instant::now();
    let writes = futures::stream::iter(resources.iter().map(|(ns, name)| {
        let (client, ar, params) = (client.clone(), ar.clone(), params.clone());
        async move {
            let data: serde_json::Map<String, Value> = (0..keys)
                .map(|k| (format!("KEY_{k}"), json!(format!("value-{k}-{name}"))))
                .collect();
            let secret = json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {
                    "name": workload::secret_of(name), "namespace": ns,
                    "labels": {"secrets.hanzo.ai/managed": "true", "app.kubernetes.io/managed-by": "kms-operator"},
                    "annotations": {"secrets.hanzo.ai/version": format!("floor-{name}")}
                },
                "type": "Opaque",
                "stringData": data,
            });
            let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> =
                kube::Api::namespaced(client.clone(), ns);
            secrets
                .patch(&workload::secret_of(name), &params, &Patch::Apply(&secret))
                .await?;
            let now = k8s_openapi::jiff::Timestamp::now()
                .round(k8s_openapi::jiff::Unit::Second)?
                .to_string();
            let condition = |type_: &str, reason: &str, message: String| {
                json!({"type": type_, "status": "True", "reason": reason, "message": message,
                       "lastTransitionTime": now, "observedGeneration": 1})
            };
            let status = if full_status {
                json!({
                    "conditions": [
                        condition("secrets.hanzo.ai/Endpoint", "Resolved", "http://127.0.0.1:9/api".into()),
                        condition("secrets.hanzo.ai/LoadedKMSToken", "OK",
                            "Logged in to the KMS using the universal auth authentication strategy".into()),
                        condition("secrets.hanzo.ai/ReadyToSyncSecrets", "OK",
                            format!("Synced {keys} secrets into 1 target(s)")),
                        condition("Ready", "Synced", format!("Synced {keys} secrets")),
                        condition("secrets.hanzo.ai/AutoRedeployReady", "OK",
                            "0 workload(s) that opted in to auto-reload use the targets".into()),
                    ],
                    "observedGeneration": 1, "lastSyncTime": now, "syncedKeys": keys, "shard": 0,
                })
            } else {
                json!({"conditions": [{
                    "type": "Ready", "status": "True", "reason": "Synced",
                    "message": format!("Synced {keys} secrets"),
                    "lastTransitionTime": now,
                }]})
            };
            let status = json!({
                "apiVersion": ar.api_version, "kind": ar.kind,
                "status": status,
            });
            let resources: kube::Api<kube::core::DynamicObject> =
                kube::Api::namespaced_with(client, ns, &ar);
            resources
                .patch_status(name, &params, &Patch::Apply(&status))
                .await?;
            anyhow::Ok(())
        }
    }))
    .buffer_unordered(concurrency.max(1))
    .collect::<Vec<_>>()
    .await;
    let seconds = secs(t0.elapsed());
    if let Some(e) = writes.into_iter().find_map(Result::err) {
        return Err(e.context("a floor write failed"));
    }
    let api = cluster::apiserver_requests(&client)
        .await?
        .since(&api_before);
    eprintln!("[{label}] floor: {seconds} s, {} API requests", api.total);
    cp.stop();
    Ok(Floor {
        n,
        namespaces: namespaces.len(),
        concurrency,
        status: if full_status { "full" } else { "ready" },
        load,
        seconds,
        apiserver_requests: api.total,
        apiserver_by_request: api.by_request,
        create_seconds,
    })
}

/// A result as JSON with its scenario name.
pub fn entry(name: &str, v: &impl Serialize) -> (String, Value) {
    (
        name.to_owned(),
        serde_json::to_value(v).unwrap_or(json!(null)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_converges_are_summarised_per_size_and_replica_count() {
        let run = |r: u64, seconds: f64, peaks: [f64; 2], converged: u64| {
            let usage: Vec<Value> = peaks
                .iter()
                .map(|p| json!({"peak_rss_mib": p, "rss_anon_mib": p - 20.0}))
                .collect();
            (
                "converge".to_owned(),
                json!({"n": 100, "replicas": r, "converged": converged, "seconds": seconds,
                       "kms": {"total": seconds * 2.0}, "usage": usage}),
            )
        };
        let results = vec![
            run(3, 12.0, [60.0, 70.0], 100),
            run(3, 10.0, [61.0, 75.0], 100),
            run(3, 11.0, [62.0, 72.0], 100),
            // Did not converge: not counted.
            run(3, 900.0, [10.0, 10.0], 99),
            run(1, 20.0, [90.0, 0.0], 100),
            ("floor".to_owned(), json!({"n": 100, "seconds": 1.0})),
        ];
        let s = converge_summary(&results);
        assert_eq!(s.len(), 2, "{s:?}");
        let (one, three) = (&s[0], &s[1]);
        assert_eq!(
            (one["replicas"].as_u64(), one["runs"].as_u64()),
            (Some(1), Some(1))
        );
        assert_eq!(three["runs"], 3);
        assert_eq!(
            three["seconds"],
            json!({"min": 10.0, "median": 11.0, "max": 12.0})
        );
        assert_eq!(three["kms_requests"]["median"], 22.0);
        // Of each run, its largest replica.
        assert_eq!(
            three["largest_peak_rss_mib"],
            json!({"min": 70.0, "median": 72.0, "max": 75.0})
        );
        assert_eq!(three["largest_rss_anon_mib"]["max"], 55.0);
        let rows = table_rows(&[("converge-summary".to_owned(), three.clone())]);
        assert!(
            rows[0][2].starts_with("min/median/max: 10.000/11.000/12.000 s"),
            "{}",
            rows[0][2]
        );
    }

    #[test]
    fn table_rows_read_the_json() {
        let v = json!({"n": 1000, "replicas": 3, "namespaces": 100, "seconds": 12.5, "converged": 1000,
            "kms": {"total": 210, "logins": 100, "fetches": 100}, "apiserver_requests": 4000.0,
            "usage": [{"peak_rss_mib": 30.2, "rss_anon_mib": 12.4, "rss_file_mib": 17.6, "cpu_seconds": 4.0}],
            "load": {"loadavg": [1.0, 1.0, 1.0]}});
        let rows = table_rows(&[("converge".into(), v)]);
        assert!(
            rows[0][1].starts_with("N=1000 R=3 ns=100"),
            "{}",
            rows[0][1]
        );
        assert!(
            rows[0][2].starts_with("12.500 s (1000/1000 ready)"),
            "{}",
            rows[0][2]
        );
        assert!(
            rows[0][2].contains("RSS MiB [30] (anon+file at the end [12+18]) CPU s [4.0]"),
            "{}",
            rows[0][2]
        );
        let floor = json!({"n": 1000, "namespaces": 100, "concurrency": 24, "seconds": 2.432,
            "apiserver_requests": 2001.0, "load": {"loadavg": [1.3, 0.8, 0.9]}});
        let rows = table_rows(&[("floor".into(), floor)]);
        assert_eq!(rows[0][1], "N=1000 ns=100 concurrency=24");
        assert!(
            rows[0][2].starts_with("2.432 s (every Secret written"),
            "{}",
            rows[0][2]
        );
    }
}
