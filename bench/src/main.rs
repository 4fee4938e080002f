//! `kms-bench`: benchmarks of kms-operator (or of another operator speaking
//! the same KMS API) on a local control plane and the dev KMS.
//!
//! Scenarios: `converge` (N resources, R replicas: time to Ready, KMS and
//! API server requests, peak RSS and CPU per replica), `restart` (cold and
//! warm: KMS logins and fetches in the first minute, time to ready),
//! `change` (KMS values changed → Secrets updated, with and without instant
//! updates), `failover` (SIGTERM and SIGKILL of a replica → its shards moved
//! and a change applied), `devserver` (the dev KMS's own list latency and
//! throughput), `floor` (the least API work N resources need, no operator:
//! what a converge is compared with), `steady` (a converged session left
//! alone: what a window with nothing changing costs), `outage` (every
//! replica stopped for twice the resync interval, then started: how the
//! overdue work spreads under the KMS budget), `simulate` (no cluster: the shard
//! assignment and the shared KMS budget for 1 to 20 replicas), or `all`. It prints a table and writes JSON with `--out`.
//!
//! ```text
//! kms-bench converge --sizes 1000,10000 --replicas 1,3 --out bench.json
//! kms-bench all --out docs/bench.json
//! kms-bench converge --operator-cmd '/opt/peer --kubeconfig {kubeconfig} --pod {pod}' \
//!     --group secrets.example.com --version v1alpha1 --kind PeerSecret --plural peersecrets
//! ```

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use serde_json::{Value, json};

mod cluster;
mod kms;
mod newcomers;
mod outage;
mod peer;
mod replicas;
mod scenarios;
mod simulate;
mod stats;
mod steady;
mod workload;

use scenarios::{Env, Session, entry};
use workload::{Crd, SyncMode};

/// Benchmarks of kms-operator on a local control plane and the dev KMS.
#[derive(Debug, Parser)]
// `--version` names the peer CRD's version, so clap's own version flag is off.
#[command(name = "kms-bench", disable_version_flag = true)]
struct Args {
    /// Scenarios: converge, restart, change, failover, devserver, floor,
    /// steady, outage, simulate, all (every one but steady and outage).
    #[arg(required = true, value_delimiter = ',')]
    scenarios: Vec<String>,
    /// Write the results as JSON here.
    #[arg(long)]
    out: Option<PathBuf>,
    /// `converge` and `floor`: numbers of resources (ten per namespace).
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    sizes: Vec<usize>,
    /// `converge`: numbers of replicas.
    #[arg(long, value_delimiter = ',', default_value = "1,3")]
    replicas: Vec<usize>,
    /// `converge`: runs of each size and replica count, each on a fresh
    /// control plane and dev KMS; with more than one, a summary gives the
    /// min, median and max of each measure.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// `floor`: requests in flight at once; default: 3 replicas' workers
    /// (32 each, the operator's default `--workers`).
    #[arg(long, default_value_t = 96)]
    floor_concurrency: usize,
    /// `floor`: the status applied: `ready` (one `Ready` condition), or
    /// `full` (what a first sync writes: `Ready` and the four
    /// `secrets.hanzo.ai/…` conditions of a KmsSecret's status, `observedGeneration`,
    /// `lastSyncTime`, `syncedKeys`, `shard`).
    #[arg(long, default_value = "ready", value_parser = ["ready", "full"])]
    floor_status: String,
    /// Server-side rate limits of the dev KMS: `none`, or `infisical` (per
    /// client and route, 60-second windows: 40 secret reads and writes, 60
    /// other reads, 200 other writes per minute, as a recorded Infisical
    /// server answered; 429 with `Retry-After` beyond). All replicas of a
    /// session share one client address, as pods behind one NAT would.
    #[arg(long, default_value = "none")]
    kms_limits: String,
    /// `simulate`: largest replica count.
    #[arg(long, default_value_t = 20)]
    simulate_replicas: usize,
    /// `simulate`: total KMS rate, requests per second.
    #[arg(long, default_value_t = 20.0)]
    simulate_rate: f64,
    /// `restart`: resources.
    #[arg(long, default_value_t = 1000)]
    restart_size: usize,
    /// `restart`: replicas.
    #[arg(long, default_value_t = 3)]
    restart_replicas: usize,
    /// `restart`: seconds counted after the start.
    #[arg(long, default_value_t = 60)]
    restart_window: u64,
    /// `restart`: the resources' resync interval, longer than the window so
    /// that the count shows what the restart causes, not scheduled resyncs.
    #[arg(long, default_value = "10m")]
    restart_resync: String,
    /// `change`: resources.
    #[arg(long, default_value_t = 1000)]
    change_size: usize,
    /// `change`: replicas.
    #[arg(long, default_value_t = 3)]
    change_replicas: usize,
    /// `change`: share of KMS folders changed, percent.
    #[arg(long, default_value_t = 10.0)]
    change_percent: f64,
    /// `change`: resync interval of the run without instant updates.
    #[arg(long, default_value = "10s")]
    change_resync: String,
    /// `change`: modes, `poll` (resync only) and/or `instant`.
    #[arg(long, value_delimiter = ',', default_value = "poll,instant")]
    change_modes: Vec<String>,
    /// `converge` (and the converges of other scenarios): resources created
    /// one at a time, each in a fresh namespace, while it runs; each is
    /// timed from its create to Ready.
    #[arg(long, default_value_t = 0)]
    newcomers: usize,
    /// Seconds between newcomers (the first comes this long after the
    /// replicas start).
    #[arg(long, default_value_t = 15)]
    newcomer_every: u64,
    /// `steady`: seconds left alone after convergence, measured (the
    /// sizes and replicas are `converge`'s).
    #[arg(long, default_value_t = 1800)]
    steady_seconds: u64,
    /// `steady`: seconds waited after convergence before the window opens
    /// (the last first-sync status writes land).
    #[arg(long, default_value_t = 30)]
    steady_settle_seconds: u64,
    /// `outage`: the resources' resync interval (the replicas stay
    /// stopped for twice that; the sizes and replicas are `converge`'s).
    #[arg(long, default_value = "1m")]
    outage_resync: String,
    /// `outage`: the replicas' `--kms-rate-limit` after the outage
    /// (default: as before it).
    #[arg(long)]
    outage_budget: Option<f64>,
    /// `outage`: seconds measured after every folder was checked.
    #[arg(long, default_value_t = 30)]
    outage_after_seconds: u64,
    /// `failover`: resources (3 replicas, instant updates on).
    #[arg(long, default_value_t = 1000)]
    failover_size: usize,
    /// `failover`: trials per kind.
    #[arg(long, default_value_t = 20)]
    trials: usize,
    /// `failover`: kinds, `graceful` (SIGTERM) and/or `crash` (SIGKILL).
    #[arg(long, value_delimiter = ',', default_value = "graceful,crash")]
    failover_kinds: Vec<String>,
    /// `devserver`: secrets in the folder listed.
    #[arg(long, default_value_t = 1000)]
    devserver_secrets: usize,
    /// `devserver`: sequential requests for the latency.
    #[arg(long, default_value_t = 300)]
    devserver_requests: usize,
    /// `devserver`: clients of the throughput run.
    #[arg(long, default_value_t = 4)]
    devserver_concurrency: usize,
    /// `devserver`: seconds of the throughput run.
    #[arg(long, default_value_t = 5)]
    devserver_seconds: u64,
    /// The operator binary (`{bin}`); default: `kms-operator` next to this
    /// binary.
    #[arg(long)]
    operator_bin: Option<PathBuf>,
    /// The binary whose `dev-server` command runs the KMS; default: the
    /// `kms-operator` next to this binary.
    #[arg(long)]
    devserver_bin: Option<PathBuf>,
    /// Command that starts one replica, with placeholders {bin},
    /// {kubeconfig}, {namespace}, {pod}, {kms_url}, {cache_dir},
    /// {metrics_addr}, {health_addr}, {lease_prefix}, {shards}, {key_file}, {replicas}. Default:
    /// kms-operator's `run` with those flags.
    #[arg(long)]
    operator_cmd: Option<String>,
    /// Extra argument for every replica (repeatable).
    #[arg(long = "operator-arg", allow_hyphen_values = true)]
    operator_args: Vec<String>,
    /// API group of the custom resource.
    #[arg(long, default_value = "secrets.hanzo.ai")]
    group: String,
    /// Its version.
    #[arg(long, default_value = "v1alpha1")]
    version: String,
    /// Its kind.
    #[arg(long, default_value = "KmsSecret")]
    kind: String,
    /// Its plural.
    #[arg(long, default_value = "kmssecrets")]
    plural: String,
    /// Status condition that must be True; empty: only the Secret counts.
    #[arg(long, default_value = "Ready")]
    ready_condition: String,
    /// Directory of the CRD manifests to apply (default: `crds/`).
    #[arg(long)]
    crd_dir: Option<PathBuf>,
    /// Repository root (for `tests/testenv`); default: found from the
    /// current directory.
    #[arg(long)]
    repo: Option<PathBuf>,
    /// The testenv directory of the benchmark's own control plane (wiped for
    /// every session).
    #[arg(long, env = "KMS_BENCH_TESTENV_DIR")]
    testenv_dir: Option<PathBuf>,
    /// Where logs, caches and KMS data go (default: `bench/` in the target
    /// directory, next to `release/` or `debug/`).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// `--shards` of the operator.
    #[arg(long, default_value_t = 16)]
    shards: u32,
    /// `--lease-prefix` of the operator.
    #[arg(long, default_value = "kms-bench")]
    lease_prefix: String,
    /// The operator's namespace.
    #[arg(long, default_value = "kms-bench-system")]
    pod_namespace: String,
    /// Keys per KMS folder.
    #[arg(long, default_value_t = 5)]
    keys: usize,
    /// Longest wait for convergence, seconds.
    #[arg(long, default_value_t = 900)]
    converge_timeout: u64,
    /// CPU limit of every replica, in cores (`0.5` is the chart's
    /// `resources.limits.cpu: 500m`), enforced by a CPU cgroup per replica
    /// (`cpu.max` or `cpu.cfs_quota_us`; needs root). Default: none.
    #[arg(long)]
    replica_cpu: Option<f64>,
}

fn find_repo() -> anyhow::Result<PathBuf> {
    let mut d = std::env::current_dir()?;
    loop {
        if d.join("tests/testenv/testenv").is_file() && d.join("crds").is_dir() {
            return Ok(d);
        }
        if !d.pop() {
            anyhow::bail!("run from the repository (or give --repo)");
        }
    }
}

fn machine() -> Value {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kib: f64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    json!({
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "memory_gib": (mem_kib / 1024.0 / 1024.0 * 10.0).round() / 10.0,
    })
}

async fn run(args: Args) -> anyhow::Result<()> {
    let all = args.scenarios.iter().any(|s| s == "all");
    let want = |s: &str| all || args.scenarios.iter().any(|x| x == s);
    for s in &args.scenarios {
        anyhow::ensure!(
            [
                "converge",
                "restart",
                "change",
                "failover",
                "devserver",
                "floor",
                "simulate",
                "steady",
                "outage",
                "all"
            ]
            .contains(&s.as_str()),
            "unknown scenario {s}"
        );
    }
    let repo = match &args.repo {
        Some(r) => r.clone(),
        None => find_repo()?,
    };
    let exe_dir = std::env::current_exe()?
        .parent()
        .context("no directory of the executable")?
        .to_path_buf();
    let operator_bin = args
        .operator_bin
        .clone()
        .unwrap_or_else(|| exe_dir.join("kms-operator"));
    let devserver_bin = args
        .devserver_bin
        .clone()
        .unwrap_or_else(|| exe_dir.join("kms-operator"));
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    let env = Env {
        repo: repo.clone(),
        operator_bin: operator_bin.clone(),
        devserver_bin,
        template: args
            .operator_cmd
            .clone()
            .unwrap_or_else(|| peer::DEFAULT_TEMPLATE.to_owned()),
        extra_args: args.operator_args.clone(),
        crd: Crd {
            group: args.group.clone(),
            version: args.version.clone(),
            kind: args.kind.clone(),
            plural: args.plural.clone(),
            ready_condition: args.ready_condition.clone(),
        },
        crd_dir: args.crd_dir.clone().unwrap_or_else(|| repo.join("crds")),
        testenv_dir: args
            .testenv_dir
            .clone()
            .unwrap_or_else(|| home.join(".cache/kms-bench-testenv")),
        work_dir: args
            .work_dir
            .clone()
            .unwrap_or_else(|| exe_dir.join("../bench")),
        shards: args.shards,
        lease_prefix: args.lease_prefix.clone(),
        pod_namespace: args.pod_namespace.clone(),
        keys: args.keys,
        converge_timeout: Duration::from_secs(args.converge_timeout),
        replica_cpu: args.replica_cpu,
        newcomers: (args.newcomers, Duration::from_secs(args.newcomer_every)),
        kms_limits: match args.kms_limits.as_str() {
            "none" => None,
            "infisical" => Some(json!({"secrets": 40, "read": 60, "write": 200})),
            other => anyhow::bail!("--kms-limits: unknown {other} (none or infisical)"),
        },
    };
    std::fs::create_dir_all(&env.work_dir)?;
    let build = env.build();
    let mut results: Vec<(String, Value)> = Vec::new();
    let mut notes: Vec<String> = Vec::new();
    let default_sync = SyncMode {
        resync: None,
        instant: false,
    };

    let flush = |results: &[(String, Value)], notes: &[String]| -> anyhow::Result<()> {
        if let Some(out) = &args.out {
            let doc = json!({
                "date": scenarios::load().at,
                "machine": machine(),
                "build": build,
                "operator_command": env.template,
                "operator_args": env.extra_args,
                "kms_limits": env.kms_limits,
                "replica_cpu": env.replica_cpu,
                "resource": format!("{}/{} {} ({})", env.crd.group, env.crd.version, env.crd.kind, env.crd.plural),
                "notes": notes,
                "results": results.iter().map(|(k, v)| json!({"scenario": k, "result": v})).collect::<Vec<_>>(),
            });
            std::fs::write(out, serde_json::to_string_pretty(&doc)? + "\n")?;
        }
        Ok(())
    };

    if want("devserver") {
        match scenarios::devserver(
            &env,
            args.devserver_secrets,
            args.devserver_requests,
            args.devserver_concurrency,
            Duration::from_secs(args.devserver_seconds),
        )
        .await
        {
            Ok(r) => results.push(entry("devserver", &r)),
            Err(e) => notes.push(format!("devserver failed: {e:#}")),
        }
        flush(&results, &notes)?;
    }

    if want("simulate") {
        for &n in &args.sizes {
            let sim = simulate::run(args.shards, n, args.simulate_rate, args.simulate_replicas);
            results.push(entry("simulate", &sim));
        }
        flush(&results, &notes)?;
    }

    if want("floor") {
        for &n in &args.sizes {
            let label = format!("floor-{n}");
            let full = args.floor_status == "full";
            match scenarios::floor(&env, &label, n, args.floor_concurrency, full).await {
                Ok(f) => results.push(entry("floor", &f)),
                Err(e) => notes.push(format!("{label} failed: {e:#}")),
            }
            flush(&results, &notes)?;
        }
    }

    if want("converge") {
        for &n in &args.sizes {
            for &r in &args.replicas {
                for trial in 1..=args.repeat.max(1) {
                    let label = format!("converge-{n}-r{r}");
                    match Session::converge(&env, &label, n, r, default_sync.clone()).await {
                        Ok((s, c)) => {
                            results.push(entry("converge", &c));
                            s.stop();
                        }
                        Err(e) => notes.push(format!("{label} (run {trial}) failed: {e:#}")),
                    }
                    flush(&results, &notes)?;
                }
            }
        }
        if args.repeat > 1 {
            for summary in scenarios::converge_summary(&results) {
                results.push(("converge-summary".to_owned(), summary));
            }
            flush(&results, &notes)?;
        }
    }

    // Not part of `all`: its window is half an hour per size.
    if args.scenarios.iter().any(|x| x == "steady") {
        for &n in &args.sizes {
            for &r in &args.replicas {
                let label = format!("steady-{n}-r{r}");
                let outcome = async {
                    let (mut s, c) =
                        Session::converge(&env, &label, n, r, default_sync.clone()).await?;
                    results.push(entry("converge", &c));
                    let st = s
                        .steady(
                            Duration::from_secs(args.steady_settle_seconds),
                            Duration::from_secs(args.steady_seconds),
                        )
                        .await;
                    s.stop();
                    results.push(entry("steady", &st?));
                    anyhow::Ok(())
                }
                .await;
                if let Err(e) = outcome {
                    notes.push(format!("{label} failed: {e:#}"));
                }
                flush(&results, &notes)?;
            }
        }
    }

    // Not part of `all`: twice the resync interval of waiting per size.
    if args.scenarios.iter().any(|x| x == "outage") {
        let sync = SyncMode {
            resync: Some(args.outage_resync.clone()),
            instant: false,
        };
        let interval = steady::resync_interval(&sync);
        for &n in &args.sizes {
            for &r in &args.replicas {
                let label = format!("outage-{n}-r{r}");
                let outcome = async {
                    let (mut s, c) = Session::converge(&env, &label, n, r, sync.clone()).await?;
                    results.push(entry("converge", &c));
                    let o = s
                        .outage(
                            interval * 2,
                            args.outage_budget,
                            Duration::from_secs(args.outage_after_seconds),
                        )
                        .await;
                    s.stop();
                    results.push(entry("outage", &o?));
                    anyhow::Ok(())
                }
                .await;
                if let Err(e) = outcome {
                    notes.push(format!("{label} failed: {e:#}"));
                }
                flush(&results, &notes)?;
            }
        }
    }

    if want("restart") {
        let label = format!("restart-{}-r{}", args.restart_size, args.restart_replicas);
        let sync = SyncMode {
            resync: Some(args.restart_resync.clone()),
            instant: false,
        };
        let outcome = async {
            let (mut s, c) =
                Session::converge(&env, &label, args.restart_size, args.restart_replicas, sync)
                    .await?;
            results.push(entry("converge", &c));
            let r = s.restart(Duration::from_secs(args.restart_window)).await;
            s.stop();
            for x in r? {
                results.push(entry("restart", &x));
            }
            anyhow::Ok(())
        }
        .await;
        if let Err(e) = outcome {
            notes.push(format!("{label} failed: {e:#}"));
        }
        flush(&results, &notes)?;
    }

    let mut failover_done = false;
    if want("change") {
        for mode in &args.change_modes {
            let instant = mode == "instant";
            let sync = if instant {
                SyncMode {
                    resync: None,
                    instant: true,
                }
            } else {
                SyncMode {
                    resync: Some(args.change_resync.clone()),
                    instant: false,
                }
            };
            let label = format!(
                "change-{mode}-{}-r{}",
                args.change_size, args.change_replicas
            );
            let with_failover = instant
                && want("failover")
                && args.failover_size == args.change_size
                && args.change_replicas == 3;
            let outcome = async {
                let (mut s, c) =
                    Session::converge(&env, &label, args.change_size, args.change_replicas, sync)
                        .await?;
                results.push(entry("converge", &c));
                let timeout = Duration::from_secs(120);
                let ch = s.change(args.change_percent, timeout).await;
                let ch = match ch {
                    Ok(ch) => ch,
                    Err(e) => {
                        s.stop();
                        return Err(e);
                    }
                };
                results.push(entry("change", &ch));
                if with_failover {
                    flush(&results, &notes)?;
                    let f = s.failover(&args.failover_kinds, args.trials).await;
                    s.stop();
                    for x in f? {
                        results.push(entry("failover", &x));
                    }
                } else {
                    s.stop();
                }
                anyhow::Ok(())
            }
            .await;
            if with_failover {
                failover_done = true;
            }
            if let Err(e) = outcome {
                notes.push(format!("{label} failed: {e:#}"));
            }
            flush(&results, &notes)?;
        }
    }

    if want("failover") && !failover_done {
        let label = format!("failover-{}-r3", args.failover_size);
        let sync = SyncMode {
            resync: None,
            instant: true,
        };
        let outcome = async {
            let (mut s, c) = Session::converge(&env, &label, args.failover_size, 3, sync).await?;
            results.push(entry("converge", &c));
            let f = s.failover(&args.failover_kinds, args.trials).await;
            s.stop();
            for x in f? {
                results.push(entry("failover", &x));
            }
            anyhow::Ok(())
        }
        .await;
        if let Err(e) = outcome {
            notes.push(format!("{label} failed: {e:#}"));
        }
        flush(&results, &notes)?;
    }

    println!(
        "kms-bench ({build} build, {} CPUs, {} GiB)",
        machine()["cpus"],
        machine()["memory_gib"]
    );
    let rows = scenarios::table_rows(&results);
    let w0 = rows.iter().map(|r| r[0].len()).max().unwrap_or(0);
    let w1 = rows.iter().map(|r| r[1].len()).max().unwrap_or(0);
    for r in rows {
        println!("{:<w0$}  {:<w1$}  {}", r[0], r[1], r[2]);
    }
    for n in &notes {
        println!("note: {n}");
    }
    flush(&results, &notes)?;
    if !notes.is_empty() {
        anyhow::bail!("{} scenario(s) failed", notes.len());
    }
    Ok(())
}

fn main() -> ExitCode {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Args::parse();
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kms-bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kms-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        // clap checks names and flags only in debug builds, at parse time.
        Args::command().debug_assert();
        let a = Args::try_parse_from(["kms-bench", "converge", "--version", "v1"]).unwrap();
        assert_eq!(a.version, "v1");
    }
}
