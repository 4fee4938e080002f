//! `kms-chaos`: the chaos suite of kms-operator.
//!
//! It starts (or reuses) a local control plane, the dev KMS and several
//! operator replicas as separate processes, creates a workload of
//! KmsSecrets, KmsPushSecrets and KmsDynamicSecrets over many namespaces,
//! keeps changing KMS values, injects faults on a schedule derived from a
//! seed, and checks the invariants of the design (`docs/chaos.md`) over what it
//! recorded: exclusive shard ownership, no data lost and convergence, no
//! leaked leases, coverage of every shard, and the KMS budget. It prints a
//! report, writes it as JSON, and exits non-zero on any violation.
//!
//! ```text
//! kms-chaos --profile short                       # about 5 minutes, ≥ 30 faults
//! kms-chaos --profile long --report docs/chaos-report.json
//! kms-chaos --profile short --seed 42              # replay a run
//! kms-chaos --mode pods --kubeconfig DIR/kubeconfig # the chart's pods on a node
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

mod checkers;
mod cluster;
mod faults;
mod history;
mod kms;
mod leaselog;
mod pods;
mod profile;
mod recorders;
mod replicas;
mod report;
mod rng;
mod run;
mod scenario;
mod schedule;
mod workload;

/// Chaos suite of kms-operator: faults on a real control plane, invariants
/// that never break.
#[derive(Debug, Parser)]
#[command(name = "kms-chaos", version)]
struct Args {
    /// `short` (about 5 minutes, at least 30 faults) or `long` (at least 100).
    #[arg(long, default_value = "short")]
    profile: String,
    /// Seed of the fault schedule and the workload; a run is replayed by
    /// its seed. Default: from the clock.
    #[arg(long)]
    seed: Option<u64>,
    /// Use this cluster instead of starting a local control plane. If it is
    /// a `tests/testenv` control plane (its directory holds `state.json`),
    /// kube-apiserver and etcd are restarted too.
    #[arg(long, env = "KMS_CHAOS_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// The testenv directory of `--kubeconfig`, when it is not the
    /// kubeconfig's own directory.
    #[arg(long)]
    testenv_dir: Option<PathBuf>,
    /// `process`: the replicas are child processes of this runner.
    /// `pods`: they are the Helm chart's pods on the node of the
    /// `--kubeconfig` testenv (`tests/testenv/testenv up DIR --node`), with
    /// `--image` imported into it (`scripts/image.sh --import DIR`).
    #[arg(long, default_value = "process", value_parser = ["process", "pods"])]
    mode: String,
    /// The operator image of `--mode pods`.
    #[arg(long, default_value = "localhost/kms-operator:dev")]
    image: String,
    /// The operator binary (default: `kms-operator` next to this binary).
    #[arg(long)]
    operator_bin: Option<PathBuf>,
    /// Where the run's files go (replica logs, caches, the dev server's
    /// data, the recorded history); emptied at the start. Default:
    /// `target/chaos/<seed>`.
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Write the JSON report here. Default: `<work-dir>/report.json`.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Scenario file (default: the `chaos/scenarios.tsv` built in).
    #[arg(long)]
    scenarios: Option<PathBuf>,
    /// Override the profile's number of namespaces.
    #[arg(long)]
    namespaces: Option<usize>,
    /// Override the profile's number of faults per track (`PROCESS,KMS`).
    #[arg(long, value_delimiter = ',')]
    faults: Option<Vec<usize>>,
    /// Leave the control plane (if started here) and the namespaces.
    #[arg(long)]
    keep: bool,
    /// Print the fault schedule of the seed and exit.
    #[arg(long)]
    plan_only: bool,
    /// Judge a shard Lease history recorded elsewhere (the kind runner's
    /// `leases.tsv`) with the exclusivity and coverage checkers, and exit.
    #[arg(long)]
    analyze_lease_log: Option<PathBuf>,
    /// Shards, for `--analyze-lease-log`.
    #[arg(long, default_value_t = 16)]
    shards: u32,
    /// Retry period in seconds, for `--analyze-lease-log`'s coverage bound.
    #[arg(long, default_value_t = 1)]
    retry_period: u64,
}

/// `--analyze-lease-log`: the two Lease checkers over a recorded history.
fn analyze(path: &std::path::Path, shards: u32, retry_period: u64) -> anyhow::Result<bool> {
    let text = std::fs::read_to_string(path)?;
    let (obs, windows) = leaselog::parse(&text);
    let Some(from) = leaselog::all_held_at(&obs, shards) else {
        anyhow::bail!(
            "the {shards} shards never all had a holder in {}",
            path.display()
        );
    };
    let to = obs.iter().map(|o| o.observed).max().unwrap_or(from);
    let duration = obs.iter().map(|o| o.duration_s).max().unwrap_or(0);
    let bound = i64::from(duration) * 1000 + i64::try_from(retry_period).unwrap_or(0) * 1000 + 1000;
    let outcomes = [
        checkers::exclusive::check(&obs, &[], &[], &|_| 0, to, &Default::default()),
        checkers::coverage::check(
            &obs,
            &windows,
            &checkers::coverage::Params {
                bound,
                from,
                to,
                shards,
            },
        ),
    ];
    let mut ok = true;
    for o in &outcomes {
        ok &= o.passed();
        println!(
            "{:<10} {}  {}",
            o.name,
            if o.passed() { "ok  " } else { "FAIL" },
            serde_json::Value::Object(o.stats.clone())
        );
        for v in &o.violations {
            println!("      {}", v.message);
        }
    }
    Ok(ok)
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_default()
}

async fn main_inner(args: Args) -> anyhow::Result<bool> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut profile = profile::Profile::named(&args.profile)
        .ok_or_else(|| anyhow::anyhow!("unknown profile {:?} (short or long)", args.profile))?;
    if let Some(n) = args.namespaces {
        profile.namespaces = n.max(1);
    }
    if let Some(f) = &args.faults {
        let [p, k] = f.as_slice() else {
            anyhow::bail!("--faults takes PROCESS,KMS");
        };
        profile.process_faults = *p;
        profile.kms_faults = *k;
    }
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64 % 1_000_000_000)
            .unwrap_or(1)
    });
    let scenarios = scenario::parse(&match &args.scenarios {
        Some(p) => std::fs::read_to_string(p)?,
        None => scenario::BUILTIN.to_owned(),
    })?;
    let repo = repo();
    if let Some(path) = &args.analyze_lease_log {
        return analyze(path, args.shards, args.retry_period);
    }
    if args.plan_only {
        let plan = schedule::plan(
            seed,
            &scenarios,
            &schedule::Shape {
                process_faults: profile.process_faults,
                kms_faults: profile.kms_faults,
                gap_min: profile.gap_min,
                gap_max: profile.gap_max,
            },
            &schedule::Limits {
                initial_replicas: profile.replicas,
                min_replicas: profile.min_replicas,
                max_replicas: profile.max_replicas,
                control_plane: true,
            },
        );
        println!("{}", serde_json::to_string_pretty(&plan)?);
        return Ok(true);
    }
    let operator_bin = match args.operator_bin {
        Some(p) => p,
        None => std::env::current_exe()?
            .parent()
            .map(|d| d.join("kms-operator"))
            .unwrap_or_default(),
    };
    if !operator_bin.is_file() {
        anyhow::bail!(
            "no operator binary at {} (build it with `cargo build -p kms-operator` in the same \
             profile, or pass --operator-bin)",
            operator_bin.display()
        );
    }
    let work_dir = args
        .work_dir
        .unwrap_or_else(|| repo.join("target/chaos").join(seed.to_string()));
    let report_path = args.report.unwrap_or_else(|| work_dir.join("report.json"));
    let mut replay = format!("kms-chaos --profile {} --seed {seed}", profile.name);
    if let Some(n) = args.namespaces {
        replay.push_str(&format!(" --namespaces {n}"));
    }
    if let Some(f) = &args.faults {
        replay.push_str(&format!(" --faults {},{}", f[0], f[1]));
    }
    let mode = if args.mode == "pods" {
        if args.kubeconfig.is_none() {
            anyhow::bail!(
                "--mode pods needs --kubeconfig of a testenv with a node (tests/testenv/testenv up DIR --node)"
            );
        }
        replay.push_str(&format!(" --mode pods --image {}", args.image));
        run::Mode::Pods {
            image: args.image.clone(),
        }
    } else {
        run::Mode::Process
    };
    eprintln!("kms-chaos: profile {}, seed {seed}", profile.name);
    let report = run::run(run::Options {
        profile,
        seed,
        kubeconfig: args.kubeconfig,
        testenv_dir: args.testenv_dir,
        work_dir,
        operator_bin,
        repo,
        keep: args.keep,
        scenarios,
        replay,
        mode,
    })
    .await?;
    if let Some(dir) = report_path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&report_path, serde_json::to_string_pretty(&report)? + "\n")?;
    println!("{}", report.text());
    println!("report: {}", report_path.display());
    Ok(report.passed)
}

#[tokio::main]
async fn main() -> ExitCode {
    match main_inner(Args::parse()).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("kms-chaos: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
