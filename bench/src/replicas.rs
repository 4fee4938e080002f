//! Operator replicas as child processes started from the command template
//! (see `peer`): each with its pod name, cache directory, health and
//! metrics ports and a log file per start; stopped with SIGTERM or SIGKILL;
//! measured through `/proc` (peak RSS, CPU seconds) and `/readyz`.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;

use crate::peer;
use crate::stats;
use kms_testkit::signal;

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
}

/// One replica.
#[derive(Debug)]
pub struct Replica {
    /// Pod name.
    pub name: String,
    /// Cache directory.
    pub cache_dir: PathBuf,
    /// `host:port` of `/readyz`.
    pub health_addr: String,
    child: Option<Child>,
    starts: u32,
}

/// Resource use of one process.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Usage {
    /// Pod name.
    pub replica: String,
    /// Peak resident set (`VmHWM`), MiB.
    pub peak_rss_mib: Option<f64>,
    /// User + system CPU time, seconds.
    pub cpu_seconds: Option<f64>,
}

fn free_addr() -> anyhow::Result<String> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.to_string())
}

/// Clock ticks per second (`getconf CLK_TCK`, 100 when unknown).
pub fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// Peak RSS and CPU time of process `pid`, `name` for the report.
pub fn usage_of(pid: u32, name: &str) -> Usage {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    Usage {
        replica: name.to_owned(),
        peak_rss_mib: stats::vm_hwm_kib(&status).map(|k| k as f64 / 1024.0),
        cpu_seconds: stats::cpu_ticks(&stat).map(|t| t as f64 / clock_ticks()),
    }
}

/// The replicas of a session, by name.
pub struct Replicas {
    settings: Settings,
    /// By pod name.
    pub set: BTreeMap<String, Replica>,
    http: reqwest::Client,
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
                    health_addr: String::new(),
                    name,
                    child: None,
                    starts: 0,
                },
            );
        }
        Ok(Self {
            settings,
            set,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(2))
                .build()?,
        })
    }

    /// Names of the replicas.
    pub fn names(&self) -> Vec<String> {
        self.set.keys().cloned().collect()
    }

    /// Names of replicas whose process runs.
    pub fn running(&self) -> Vec<String> {
        self.set
            .values()
            .filter(|r| r.child.is_some())
            .map(|r| r.name.clone())
            .collect()
    }

    /// Start `name` (no-op when it runs).
    pub fn start(&mut self, name: &str) -> anyhow::Result<()> {
        let s = &self.settings;
        let r = self.set.get_mut(name).context("no such replica")?;
        if r.child.is_some() {
            return Ok(());
        }
        r.starts += 1;
        r.health_addr = free_addr()?;
        let metrics_addr = free_addr()?;
        let values: BTreeMap<&str, String> = [
            ("bin", s.bin.display().to_string()),
            ("kubeconfig", s.kubeconfig.display().to_string()),
            ("namespace", s.namespace.clone()),
            ("pod", name.to_owned()),
            ("kms_url", s.kms_url.clone()),
            ("cache_dir", r.cache_dir.display().to_string()),
            ("metrics_addr", metrics_addr),
            ("health_addr", r.health_addr.clone()),
            ("lease_prefix", s.lease_prefix.clone()),
            ("shards", s.shards.to_string()),
            ("key_file", s.key_file.display().to_string()),
        ]
        .into_iter()
        .collect();
        let argv = peer::render(&s.template, &values)?;
        let log_path = s.dir.join(name).join(format!("{}.log", r.starts));
        let log = std::fs::File::create(&log_path)?;
        let child = Command::new(&argv[0])
            .args(&argv[1..])
            .args(&s.extra_args)
            .env("KUBECONFIG", &s.kubeconfig)
            .env("POD_NAME", name)
            .env("POD_NAMESPACE", &s.namespace)
            .env_remove("RUST_LOG")
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {name}: {}", argv.join(" ")))?;
        r.child = Some(child);
        Ok(())
    }

    /// Start every replica.
    pub fn start_all(&mut self) -> anyhow::Result<()> {
        for n in self.names() {
            self.start(&n)?;
        }
        Ok(())
    }

    /// PID of `name`, if it runs.
    pub fn pid(&self, name: &str) -> Option<u32> {
        self.set.get(name)?.child.as_ref().map(Child::id)
    }

    /// Usage of every running replica.
    pub fn usage(&self) -> Vec<Usage> {
        self.set
            .values()
            .filter_map(|r| Some(usage_of(r.child.as_ref()?.id(), &r.name)))
            .collect()
    }

    /// Signal `name` and return at once (the process is reaped later by
    /// `wait_exit`).
    pub fn send(&self, name: &str, sig: &str) {
        if let Some(pid) = self.pid(name) {
            signal(pid, sig);
        }
    }

    /// Wait up to `timeout` for `name` to exit, then SIGKILL it; forget the
    /// process. Returns whether it exited by itself.
    pub fn wait_exit(&mut self, name: &str, timeout: Duration) -> bool {
        let Some(r) = self.set.get_mut(name) else {
            return true;
        };
        let Some(mut c) = r.child.take() else {
            return true;
        };
        let started = Instant::now();
        while started.elapsed() < timeout {
            if let Ok(Some(_)) = c.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = c.kill();
        let _ = c.wait();
        false
    }

    /// SIGTERM every replica, wait up to `timeout` for all of them.
    pub fn stop_all(&mut self, timeout: Duration) {
        for n in self.running() {
            self.send(&n, "TERM");
        }
        let started = Instant::now();
        for n in self.running() {
            let left = timeout
                .saturating_sub(started.elapsed())
                .max(Duration::from_millis(100));
            self.wait_exit(&n, left);
        }
    }

    /// Delete the cache directory of every replica.
    pub fn wipe_caches(&self) {
        for r in self.set.values() {
            let _ = std::fs::remove_dir_all(&r.cache_dir);
        }
    }

    /// Whether `/readyz` of every running replica answers 200.
    pub async fn all_ready(&self) -> bool {
        for r in self.set.values().filter(|r| r.child.is_some()) {
            let ok = self
                .http
                .get(format!("http://{}/readyz", r.health_addr))
                .send()
                .await
                .is_ok_and(|resp| resp.status().is_success());
            if !ok {
                return false;
            }
        }
        true
    }

    /// Names whose process exited by itself (with the status).
    pub fn exited(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        for r in self.set.values_mut() {
            if let Some(c) = r.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                out.push(format!("{} exited: {status}", r.name));
                r.child = None;
            }
        }
        out
    }
}

impl Drop for Replicas {
    fn drop(&mut self) {
        for r in self.set.values_mut() {
            if let Some(mut c) = r.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}
