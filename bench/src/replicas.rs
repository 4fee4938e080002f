//! The replicas of a benchmark session, started from the command template
//! (see `peer`) by the shared runner (`kms_testkit::replica`): each with
//! its pod name, cache directory, free health and metrics ports and a log
//! file per start; stopped with SIGTERM or SIGKILL; measured through
//! `/proc` (peak RSS, CPU seconds) and `/readyz`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use kms_testkit::replica::{self, Launch, Replica as Process};

pub use kms_testkit::replica::Usage;

use crate::peer;

/// What every replica of a session shares.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Command template.
    pub template: String,
    /// `{bin}`.
    pub bin: PathBuf,
    /// `{kubeconfig}` (also `KUBECONFIG`).
    pub kubeconfig: PathBuf,
    /// `{namespace}`: the operator's own namespace (Leases).
    pub namespace: String,
    /// `{kms_url}`.
    pub kms_url: String,
    /// `{lease_prefix}`.
    pub lease_prefix: String,
    /// `{shards}`.
    pub shards: u32,
    /// `{key_file}`.
    pub key_file: PathBuf,
    /// Extra arguments appended to the command.
    pub extra_args: Vec<String>,
    /// Where replica directories go.
    pub dir: PathBuf,
    /// CPU limit of every replica in cores, `None` for none.
    pub cpu_limit: Option<f64>,
}

/// One replica: a name, its cache, and its process while it runs.
pub struct Replica {
    /// Pod name.
    pub name: String,
    /// Cache directory.
    pub cache_dir: PathBuf,
    process: Option<Process>,
    /// Its CPU cgroup while it runs under `Settings::cpu_limit`.
    cgroup: Option<kms_testkit::cgroup::Group>,
    /// Where the running process serves `/metrics`.
    metrics_addr: Option<String>,
    starts: u32,
}

/// The replicas of a session, by name.
pub struct Replicas {
    settings: Settings,
    /// By pod name.
    pub set: BTreeMap<String, Replica>,
}

impl Replicas {
    /// `count` replicas named `replica-0`…, not started.
    pub fn new(settings: Settings, count: usize) -> anyhow::Result<Self> {
        let mut set = BTreeMap::new();
        for i in 0..count {
            let name = format!("replica-{i}");
            let dir = settings.dir.join(&name);
            std::fs::create_dir_all(&dir)?;
            set.insert(
                name.clone(),
                Replica {
                    cache_dir: dir.join("cache"),
                    name,
                    process: None,
                    cgroup: None,
                    metrics_addr: None,
                    starts: 0,
                },
            );
        }
        Ok(Self { settings, set })
    }

    /// Names of the replicas.
    pub fn names(&self) -> Vec<String> {
        self.set.keys().cloned().collect()
    }

    /// Names of replicas whose process runs.
    pub fn running(&self) -> Vec<String> {
        self.set
            .values()
            .filter(|r| r.process.is_some())
            .map(|r| r.name.clone())
            .collect()
    }

    fn processes(&mut self) -> impl Iterator<Item = &mut Process> {
        self.set.values_mut().filter_map(|r| r.process.as_mut())
    }

    /// Start `name` (no-op when it runs): the command template filled in,
    /// free health and metrics ports, a log file per start.
    pub fn start(&mut self, name: &str) -> anyhow::Result<()> {
        let s = &self.settings;
        let count = self.set.len();
        let r = self.set.get_mut(name).context("no such replica")?;
        if r.process.is_some() {
            return Ok(());
        }
        r.starts += 1;
        let health_addr = replica::free_addr()?;
        let metrics_addr = replica::free_addr()?;
        let values: BTreeMap<&str, String> = [
            ("bin", s.bin.display().to_string()),
            ("kubeconfig", s.kubeconfig.display().to_string()),
            ("namespace", s.namespace.clone()),
            ("pod", name.to_owned()),
            ("kms_url", s.kms_url.clone()),
            ("cache_dir", r.cache_dir.display().to_string()),
            ("metrics_addr", metrics_addr.clone()),
            ("health_addr", health_addr.clone()),
            ("lease_prefix", s.lease_prefix.clone()),
            ("shards", s.shards.to_string()),
            ("key_file", s.key_file.display().to_string()),
            ("replicas", count.to_string()),
        ]
        .into_iter()
        .collect();
        let argv = peer::render(&s.template, &values)?;
        let process = Launch::new(&argv[0])
            .args(&argv[1..])
            .args(&s.extra_args)
            .env("KUBECONFIG", &s.kubeconfig)
            .name(name)
            .env("POD_NAMESPACE", &s.namespace)
            .env_remove("RUST_LOG")
            .health_addr(&health_addr)
            .log_file(s.dir.join(name).join(format!("{}.log", r.starts)))
            .spawn()?;
        if let (Some(cores), Some(pid)) = (s.cpu_limit, process.pid()) {
            // A start replaces the group of the previous one (empty by now).
            r.cgroup = None;
            match kms_testkit::cgroup::Group::cpu(&format!("kms-bench-{name}-{pid}"), pid, cores) {
                Ok(group) => r.cgroup = Some(group),
                Err(e) => {
                    let mut process = process;
                    process.kill();
                    return Err(e.context(format!("limiting the CPU of {name}")));
                }
            }
        }
        r.process = Some(process);
        r.metrics_addr = Some(metrics_addr);
        Ok(())
    }

    /// The extra arguments of every replica started from now on.
    pub fn extra_args(&self) -> &[String] {
        &self.settings.extra_args
    }

    /// Replace the extra arguments of every replica started from now on.
    pub fn set_extra_args(&mut self, args: Vec<String>) {
        self.settings.extra_args = args;
    }

    /// Start every replica.
    pub fn start_all(&mut self) -> anyhow::Result<()> {
        for n in self.names() {
            self.start(&n)?;
        }
        Ok(())
    }

    /// Usage of every running replica.
    pub fn usage(&self) -> Vec<Usage> {
        self.set
            .values()
            .filter_map(|r| Some(r.process.as_ref()?.usage()))
            .collect()
    }

    /// Signal `name` and return at once (the process is reaped later by
    /// `wait_exit`).
    pub fn send(&self, name: &str, sig: &str) {
        if let Some(p) = self.set.get(name).and_then(|r| r.process.as_ref()) {
            p.signal(sig);
        }
    }

    /// Wait up to `timeout` for `name` to exit, then SIGKILL it; forget the
    /// process. Returns whether it exited by itself.
    pub fn wait_exit(&mut self, name: &str, timeout: Duration) -> bool {
        let Some(mut p) = self.set.get_mut(name).and_then(|r| r.process.take()) else {
            return true;
        };
        let exited = p.wait_exit(timeout).is_some();
        p.kill();
        exited
    }

    /// SIGTERM every replica, wait up to `timeout` for all of them.
    pub fn stop_all(&mut self, timeout: Duration) {
        replica::stop_all(self.processes(), timeout);
        for r in self.set.values_mut() {
            r.process = None;
        }
    }

    /// Delete the cache directory of every replica.
    pub fn wipe_caches(&self) {
        for r in self.set.values() {
            let _ = std::fs::remove_dir_all(&r.cache_dir);
        }
    }

    /// Reconciles finished so far by the running replicas (the sum of
    /// `controller_runtime_reconcile_total` over their `/metrics`): `None`
    /// when a replica exports no such counter (a peer); an error when one
    /// does not answer (still starting).
    pub async fn reconciles(&self) -> anyhow::Result<Option<f64>> {
        let http = reqwest::Client::new();
        let mut sum = 0.0;
        for r in self.set.values().filter(|r| r.process.is_some()) {
            let addr = r.metrics_addr.as_ref().context("no metrics address")?;
            let text = http
                .get(format!("http://{addr}/metrics"))
                .timeout(std::time::Duration::from_secs(5))
                .send()
                .await?
                .error_for_status()?
                .text()
                .await?;
            let mut seen = false;
            for line in text.lines() {
                if let Some(rest) = line.strip_prefix("controller_runtime_reconcile_total{") {
                    seen = true;
                    sum += rest
                        .rsplit(' ')
                        .next()
                        .and_then(|v| v.parse::<f64>().ok())
                        .unwrap_or(0.0);
                }
            }
            if !seen {
                return Ok(None);
            }
        }
        Ok(Some(sum))
    }

    /// Whether `/readyz` of every running replica answers 200.
    pub async fn all_ready(&self) -> bool {
        for p in self.set.values().filter_map(|r| r.process.as_ref()) {
            if !p.is_ready().await {
                return false;
            }
        }
        true
    }

    /// Names whose process exited by itself (with the status).
    pub fn exited(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        for r in self.set.values_mut() {
            if let Some(status) = r.process.as_mut().and_then(Process::try_exit) {
                out.push(format!("{} exited: {status}", r.name));
                r.process = None;
            }
        }
        out
    }
}
