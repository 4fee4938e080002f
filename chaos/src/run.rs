//! One chaos run from start to end: control plane, CRDs, dev KMS, workload,
//! recorders, replicas; the faults with churn alongside; convergence; the
//! deletion of the dynamic resources; then the checkers and the report.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use kube::Client;

use crate::checkers::{self, Outcome};
use crate::cluster::{self, ControlPlane};
use crate::faults::{FaultRecord, ProcessTrack, run_kms_track};
use crate::history::{Excuse, History, Ms, now_ms};
use crate::kms::DevServer;
use crate::pods::{PodSettings, Pods};
use crate::profile::Profile;
use crate::recorders;
use crate::replicas::{Fleet, Replicas, Settings};
use crate::report::{Convergence, Machine, Report, checker_lines, fault_lines};
use crate::rng::Rng;
use crate::scenario::Scenario;
use crate::schedule::{self, Limits, Shape};
use crate::workload::{self, Model};

/// Everything a run needs to know.
#[derive(Clone, Debug)]
pub struct Options {
    /// The profile.
    pub profile: Profile,
    /// The seed.
    pub seed: u64,
    /// Reuse this cluster.
    pub kubeconfig: Option<PathBuf>,
    /// Its testenv directory (for restarts), when not next to the kubeconfig.
    pub testenv_dir: Option<PathBuf>,
    /// Where this run's files go.
    pub work_dir: PathBuf,
    /// The operator binary.
    pub operator_bin: PathBuf,
    /// The repository (for `tests/testenv` and `crds/`).
    pub repo: PathBuf,
    /// Leave the control plane and namespaces behind.
    pub keep: bool,
    /// The scenarios.
    pub scenarios: Vec<Scenario>,
    /// Command line that replays this run.
    pub replay: String,
    /// Processes of this runner, or the chart's pods on a node.
    pub mode: Mode,
}

/// What the replicas are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Child processes of the runner (the default; CI runs this).
    Process,
    /// The Helm chart's pods on the node of the `--kubeconfig` testenv,
    /// running `image` (imported into the node).
    Pods {
        /// `repository:tag`.
        image: String,
    },
}

/// The node's address, from the testenv's state (`testenv up DIR --node`).
fn node_ip(testenv_dir: &std::path::Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(testenv_dir.join("state.json"))
        .with_context(|| format!("reading {}/state.json", testenv_dir.display()))?;
    let state: serde_json::Value = serde_json::from_str(&text)?;
    if state["node"] != true {
        anyhow::bail!(
            "{} is a control plane without a node: start one with `tests/testenv/testenv up DIR --node`",
            testenv_dir.display()
        );
    }
    state["nodeIP"]
        .as_str()
        .map(str::to_owned)
        .context("the testenv state has no nodeIP")
}

fn say(msg: impl AsRef<str>) {
    eprintln!("kms-chaos: {}", msg.as_ref());
}

/// Run, and always clean up what was started.
pub async fn run(opts: Options) -> anyhow::Result<Report> {
    // A replayed seed starts from nothing: the dev server's data, caches and
    // logs of an earlier run would not match the seed's model.
    if opts.work_dir.exists() {
        std::fs::remove_dir_all(&opts.work_dir)?;
    }
    std::fs::create_dir_all(&opts.work_dir)?;
    let own_testenv = opts.repo.join("target/chaos-testenv");
    let cp = {
        let (repo, kc, dir) = (
            opts.repo.clone(),
            opts.kubeconfig.clone(),
            opts.testenv_dir.clone(),
        );
        tokio::task::spawn_blocking(move || {
            ControlPlane::start_or_reuse(&repo, kc, dir, &own_testenv)
        })
        .await??
    };
    let cp = Arc::new(cp);
    say(format!(
        "control plane {} ({})",
        cp.kubeconfig.display(),
        if cp.restartable() {
            "restartable"
        } else {
            "not restartable: no kube-apiserver/etcd restarts"
        }
    ));
    let result = run_on(&opts, cp.clone()).await;
    if !opts.keep {
        let cp2 = cp.clone();
        let _ = tokio::task::spawn_blocking(move || cp2.stop()).await;
    }
    result
}

/// Watch for the machine standing still: a thread that wakes every 100 ms
/// records every wake-up more than a second late. When the runner itself
/// could not run, neither could the replicas or the control plane (a
/// virtual machine paused, a host swapping), and what they did not do then
/// is not theirs to answer for.
fn watch_stalls(
    history: Arc<Mutex<History>>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut last = now_ms();
        while !stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(100));
            let now = now_ms();
            if now - last > 1100 {
                history
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .stalls
                    .push(crate::history::Window {
                        from: last,
                        to: now,
                    });
            }
            last = now;
        }
    })
}

struct Recorders(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Recorders {
    fn drop(&mut self) {
        for h in &self.0 {
            h.abort();
        }
    }
}

fn all_shards_held(history: &Mutex<History>, shards: u32) -> bool {
    let h = history.lock().unwrap_or_else(|e| e.into_inner());
    let mut last: BTreeMap<u32, bool> = BTreeMap::new();
    for o in &h.leases {
        last.insert(o.shard, o.holder.is_some() && !o.deleted);
    }
    last.len() == shards as usize && last.values().all(|v| *v)
}

async fn poll_until(
    client: &Client,
    kms: &DevServer,
    namespaces: &[String],
    model: &Model,
    limit: Duration,
    also: impl Fn() -> bool,
) -> (Vec<checkers::data::Poll>, Option<Duration>) {
    let started = Instant::now();
    let mut polls = Vec::new();
    while started.elapsed() < limit {
        if let Ok(p) = workload::poll(client, kms, namespaces, model).await {
            let done = p.mismatched.is_empty() && also();
            polls.push(p);
            if done {
                return (polls, Some(started.elapsed()));
            }
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    (polls, None)
}

async fn run_on(opts: &Options, cp: Arc<ControlPlane>) -> anyhow::Result<Report> {
    let p = &opts.profile;
    let t0 = now_ms();
    let started_at = k8s_openapi::jiff::Timestamp::now().to_string();
    let run_id = format!(
        "{:06x}",
        (opts.seed ^ (t0 as u64).wrapping_mul(0x9e37_79b9)) & 0xff_ffff
    );
    let pod_ns = format!("chaos-{run_id}-system");
    let namespaces: Vec<String> = (0..p.namespaces)
        .map(|i| format!("chaos-{run_id}-{i:02}"))
        .collect();
    let ns_set: BTreeSet<String> = namespaces.iter().cloned().collect();
    let mut notes = Vec::new();

    let client = cluster::client(&cp.kubeconfig).await?;
    cluster::apply_crds(&cp, &opts.repo, &client).await?;
    cluster::create_namespace(&client, &pod_ns).await?;
    for ns in &namespaces {
        cluster::create_namespace(&client, ns).await?;
    }
    say(format!(
        "run {run_id}: {} namespaces, pod namespace {pod_ns}",
        namespaces.len()
    ));

    // The KMS and the workload.
    let mut rng = Rng::fork(opts.seed, "workload");
    let (model, seed_yaml) = workload::seed(&namespaces, &p.timing, &mut rng);
    // Pods reach the dev KMS at the node's address; processes at loopback.
    let kms_ip = match &opts.mode {
        Mode::Process => "127.0.0.1".to_owned(),
        Mode::Pods { .. } => node_ip(
            cp.testenv_dir
                .as_deref()
                .context("cluster mode needs the testenv directory of its node")?,
        )?,
    };
    let kms = Arc::new(
        DevServer::start(
            &kms_ip,
            &opts.operator_bin,
            &opts.work_dir.join("kms"),
            &seed_yaml,
        )
        .context("starting the dev server")?,
    );
    let key_file = opts.work_dir.join("cache.key");
    let key: String = (0..32)
        .map(|_| format!("{:02x}", rng.next_u64() as u8))
        .collect();
    std::fs::write(&key_file, &key[..32])?;

    let history = Arc::new(Mutex::new(History::default()));
    let stall_stop = Arc::new(AtomicBool::new(false));
    let stall_watch = watch_stalls(history.clone(), stall_stop.clone());
    let mut recorders = Recorders(vec![
        recorders::watch_leases(client.clone(), &pod_ns, "kms-operator", history.clone()),
        recorders::watch_secrets(client.clone(), ns_set.clone(), history.clone()),
        recorders::sample_leases(client.clone(), kms.clone(), ns_set.clone(), history.clone()),
    ]);
    let budget_task = recorders::sample_budget(kms.clone(), history.clone());

    let created = Instant::now();
    workload::create_all(&client, &namespaces, &kms.api(), &p.timing, &mut rng).await?;
    let replicas: Box<dyn Fleet> = match &opts.mode {
        Mode::Process => {
            let mut replicas = Replicas::new(
                Settings {
                    bin: opts.operator_bin.clone(),
                    kubeconfig: cp.kubeconfig.clone(),
                    pod_namespace: pod_ns.clone(),
                    namespaces: namespaces.clone(),
                    shards: p.shards,
                    lease_duration: p.lease_duration,
                    renew_deadline: p.renew_deadline,
                    retry_period: p.retry_period,
                    kms_rate_limit: p.kms_rate_limit,
                    expected_replicas: p.replicas,
                    key_file,
                    dir: opts.work_dir.join("replicas"),
                },
                history.clone(),
            );
            for _ in 0..p.replicas {
                let name = replicas.fresh_name();
                replicas.start(&name)?;
            }
            Box::new(replicas)
        }
        Mode::Pods { image } => {
            let testenv = kms_testkit::testenv::Testenv::new(&opts.repo);
            let settings = PodSettings {
                helm: testenv.tool("helm")?,
                kubectl: cp.kubectl()?,
                kubeconfig: cp.kubeconfig.clone(),
                testenv_dir: cp.testenv_dir.clone().unwrap_or_default(),
                chart: opts.repo.join("helm/secrets-operator"),
                image: image.clone(),
                namespace: pod_ns.clone(),
                namespaces: namespaces.clone(),
                replicas: p.replicas,
                shards: p.shards,
                lease_duration: p.lease_duration,
                renew_deadline: p.renew_deadline,
                retry_period: p.retry_period,
                kms_rate_limit: p.kms_rate_limit,
                dir: opts.work_dir.join("pods"),
            };
            let history = history.clone();
            Box::new(
                tokio::task::spawn_blocking(move || Pods::install(settings, history))
                    .await?
                    .context("installing the chart")?,
            )
        }
    };
    say(format!(
        "{} replicas started ({}); waiting for the workload to be in step",
        p.replicas,
        match &opts.mode {
            Mode::Process => "processes".to_owned(),
            Mode::Pods { image } => format!("pods of the chart, {image}"),
        }
    ));
    let shards = p.shards;
    let (_, ready) = poll_until(&client, &kms, &namespaces, &model, p.ready_timeout, || {
        all_shards_held(&history, shards)
    })
    .await;
    let initial = ready.map(|_| created.elapsed());
    if initial.is_none() {
        let last = workload::poll(&client, &kms, &namespaces, &model)
            .await
            .ok();
        anyhow::bail!(
            "the workload was not in step {} s after the start: {:?}",
            p.ready_timeout.as_secs(),
            last.map(|l| l.mismatched.into_iter().take(10).collect::<Vec<_>>())
        );
    }
    say(format!(
        "in step after {:.1} s; faults start",
        initial.unwrap_or_default().as_secs_f64()
    ));

    // Faults, with churn alongside.
    let plan = schedule::plan(
        opts.seed,
        &opts.scenarios,
        &Shape {
            process_faults: p.process_faults,
            kms_faults: p.kms_faults,
            gap_min: p.gap_min,
            gap_max: p.gap_max,
        },
        &Limits {
            initial_replicas: p.replicas,
            min_replicas: p.min_replicas,
            max_replicas: p.max_replicas,
            control_plane: cp.restartable(),
        },
    );
    let chaos_from = now_ms();
    let stop = Arc::new(AtomicBool::new(false));
    let model = Arc::new(tokio::sync::Mutex::new(model));
    let churn = {
        let (client, kms, namespaces, model, stop) = (
            client.clone(),
            kms.clone(),
            namespaces.clone(),
            model.clone(),
            stop.clone(),
        );
        let every = p.churn_every;
        let mut rng = Rng::fork(opts.seed, "churn");
        tokio::spawn(async move {
            let mut changes = 0usize;
            while !stop.load(Ordering::SeqCst) {
                tokio::time::sleep(every).await;
                let mut m = model.lock().await;
                if workload::churn_once(&client, &kms, &namespaces, &mut m, &mut rng)
                    .await
                    .is_ok()
                {
                    changes += 1;
                }
            }
            changes
        })
    };
    let mut track = ProcessTrack {
        replicas,
        control_plane: cp.clone(),
        history: history.clone(),
        lease_duration: Duration::from_secs(p.lease_duration),
        graceful_stops: Vec::new(),
        unexpected_exits: Vec::new(),
    };
    let process_steps = plan.process.clone();
    let stop_p = Arc::new(AtomicBool::new(false));
    let process = {
        let stop_p = stop_p.clone();
        tokio::task::spawn_blocking(move || {
            let records = track.run(&process_steps, &stop_p);
            (track, records)
        })
    };
    let never = AtomicBool::new(false);
    let kms_records = run_kms_track(&plan.kms, &kms, &never).await;
    let (mut track, process_records) = process.await.context("the process track panicked")?;
    let _ = kms.clear_faults().await;
    let chaos_to = now_ms();
    stop.store(true, Ordering::SeqCst);
    let churned = churn.await.unwrap_or(0);
    say(format!(
        "faults over after {:.0} s; {churned} changes made during them",
        (chaos_to - chaos_from) as f64 / 1000.0
    ));

    // Convergence: one last change to every object, then poll.
    let mut model = Arc::try_unwrap(model)
        .map(|m| m.into_inner())
        .unwrap_or_default();
    let mut rng = Rng::fork(opts.seed, "final");
    let _ = workload::change_everything(&client, &kms, &namespaces, &mut model, &mut rng).await;
    let (polls, converged) = poll_until(
        &client,
        &kms,
        &namespaces,
        &model,
        p.convergence_bound + Duration::from_secs(10),
        || true,
    )
    .await;
    say(match converged {
        Some(d) => format!(
            "every object in step {:.1} s after the faults",
            d.as_secs_f64()
        ),
        None => "objects did not converge".to_owned(),
    });
    track.check_exits();
    budget_task.abort();

    // Delete the dynamic resources; every lease must go.
    let deleted_at = now_ms();
    let ids = workload::delete_dynamic(&client, &namespaces).await;
    history
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .excuses
        .extend(ids.into_iter().map(|owner| Excuse {
            at: deleted_at,
            owner,
        }));
    let gone_by = Instant::now() + Duration::from_secs(120);
    while Instant::now() < gone_by {
        if workload::dynamic_left(&client, &namespaces).await.ok() == Some(0) {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let left = workload::dynamic_left(&client, &namespaces)
        .await
        .unwrap_or(usize::MAX);
    if left > 0 {
        notes.push(format!(
            "{left} KmsDynamicSecrets were still present 120 s after deletion"
        ));
    }
    // Wait for unrecorded orphans to reach their TTL (at most 2 minutes).
    let orphans_by = Instant::now() + Duration::from_secs(120);
    let mut at_end = None;
    while Instant::now() < orphans_by {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let Ok(snap) = recorders::lease_snapshot(&client, &kms, &ns_set).await else {
            continue;
        };
        history
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .snapshots
            .push(snap.clone());
        let latest = snap.active.iter().map(|l| l.expires).max().unwrap_or(0);
        if snap.active.is_empty() || now_ms() > latest + 3000 {
            at_end = Some(snap.active);
            break;
        }
    }
    let checked_to = now_ms();
    let every_lease: Option<Vec<crate::history::KmsLease>> = kms
        .all_leases()
        .await
        .ok()
        .map(|v| v.into_iter().map(|l| l.lease).collect());

    // Stop everything, then judge.
    let kms_stats = kms.stats().await.unwrap_or_default();
    let mut replicas = track.replicas;
    let stopped = tokio::task::spawn_blocking(move || {
        replicas.stop_all(Duration::from_secs(30));
        replicas
    })
    .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    for h in recorders.0.drain(..) {
        h.abort();
    }
    if let Ok(mut k) = Arc::try_unwrap(kms) {
        k.stop();
    }
    if !opts.keep {
        for ns in namespaces.iter().chain(std::iter::once(&pod_ns)) {
            cluster::delete_namespace(&client, ns).await;
        }
    }

    stall_stop.store(true, Ordering::SeqCst);
    let _ = stall_watch.join();
    let h = history.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let ring = shard::Ring::new(p.shards).context("shard count")?;
    let shard_of = |ns: &str| ring.shard_of(ns);
    let mut outcomes: Vec<Outcome> = Vec::new();
    outcomes.push(checkers::exclusive::check(
        &h.leases,
        &h.writes,
        &h.pauses,
        &shard_of,
        checked_to,
        &Default::default(),
    ));
    let mut data = checkers::data::check_secrets(&h.secrets, &h.excuses);
    let conv = checkers::data::check_convergence(
        &polls,
        chaos_to,
        p.convergence_bound.as_millis() as Ms,
        &mut data,
    );
    outcomes.push(data);
    outcomes.push(checkers::leases::check(
        &h.snapshots,
        at_end.as_deref(),
        every_lease.as_deref(),
        &h.kills,
        &h.revoke_attempts,
        &Default::default(),
    ));
    let excluded: Vec<crate::history::Window> =
        h.control_plane.iter().chain(&h.stalls).copied().collect();
    outcomes.push(checkers::coverage::check(
        &h.leases,
        &excluded,
        &checkers::coverage::Params {
            bound: p.coverage_bound_ms(),
            from: chaos_from,
            to: checked_to,
            shards: p.shards,
        },
    ));
    outcomes.push(checkers::budget::check(
        &h.budget,
        &h.starts,
        &checkers::budget::Params {
            rate: p.kms_rate_limit,
            burst_factor: 2.0,
            lag_s: p.retry_period as f64,
            slack_s: 0.5,
            windows_s: vec![10, 60],
        },
    ));

    let mut records: Vec<FaultRecord> = process_records;
    records.extend(kms_records);
    let injected: Vec<&FaultRecord> = records.iter().filter(|r| r.skipped.is_none()).collect();
    let mut by_kind: BTreeMap<String, usize> = BTreeMap::new();
    for r in &injected {
        *by_kind.entry(r.kind.to_string()).or_default() += 1;
    }
    let skipped = records.len() - injected.len();
    if skipped > 0 {
        notes.push(format!(
            "{skipped} planned faults were skipped (see the fault list)"
        ));
    }
    if !h.stalls.is_empty() {
        let total: Ms = h.stalls.iter().map(|w| w.to - w.from).sum();
        notes.push(format!(
            "the machine stood still {} time(s), {:.1} s in all (longest {:.1} s); those windows \
             are excluded from coverage like control-plane restarts",
            h.stalls.len(),
            total as f64 / 1000.0,
            h.stalls.iter().map(|w| w.to - w.from).max().unwrap_or(0) as f64 / 1000.0
        ));
    }
    if !cp.restartable() {
        notes.push(
            "kube-apiserver and etcd restarts were not planned: the cluster is not a local testenv"
                .into(),
        );
    }
    let mut stops = track.graceful_stops.clone();
    stops.sort();
    let graceful = (!stops.is_empty()).then(|| {
        (
            stops[stops.len() / 2].as_secs_f64(),
            stops.last().map_or(0.0, Duration::as_secs_f64),
        )
    });
    let counts = stopped.counts();
    let passed = outcomes.iter().all(Outcome::passed)
        && track.unexpected_exits.is_empty()
        && counts.panics.is_empty();
    if !track.unexpected_exits.is_empty() {
        notes.push("replicas exited without being told to (counted as a failure)".into());
    }
    if !counts.panics.is_empty() {
        notes.push("a replica panicked (counted as a failure)".into());
    }
    notes.push(format!(
        "{churned} KMS and source changes during the faults; work files in {}",
        opts.work_dir.display()
    ));
    let report = Report {
        passed,
        seed: opts.seed,
        profile: p.name.clone(),
        replay: opts.replay.clone(),
        machine: Machine::detect(),
        started_at,
        duration_s: (now_ms() - t0) as f64 / 1000.0,
        chaos_s: (chaos_to - chaos_from) as f64 / 1000.0,
        settings: p.describe(),
        faults_planned: plan.faults(),
        faults_injected: injected.len(),
        faults_by_kind: by_kind,
        checkers: checker_lines(&outcomes, t0),
        convergence: Convergence {
            initial_s: initial.map(|d| (d.as_secs_f64() * 10.0).round() / 10.0),
            after_faults_s: conv.map(|ms| (ms as f64 / 100.0).round() / 10.0),
            bound_s: p.convergence_bound.as_secs_f64(),
        },
        graceful_stop_s: graceful,
        unexpected_exits: track.unexpected_exits.clone(),
        operator_logs: counts,
        kms_requests: kms_stats,
        notes,
        faults: fault_lines(&records, t0),
    };
    let hist_path = opts.work_dir.join("history.json");
    if let Ok(f) = std::fs::File::create(&hist_path) {
        let _ = serde_json::to_writer(std::io::BufWriter::new(f), &h);
    }
    Ok(report)
}
