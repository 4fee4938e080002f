//! Operator replicas as child processes, run by the shared runner
//! (`kms_testkit::replica`): each with its own pod name, cache directory
//! and log file per incarnation, started, signalled and restarted under the
//! same name. Log lines that matter to the checkers (writes and shard
//! events) are parsed as they arrive ([`ingest`]).
//!
//! [`Fleet`] is what the process track does to replicas; [`Replicas`] does
//! it to processes, `pods::Pods` to the chart's pods on a node.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kms_testkit::replica::{self, Launch, Replica as Process};
use serde_json::Value;

use crate::history::{History, Ms, ShardLogLine, WriteObs, now_ms};

/// Settings shared by every replica of a run.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The operator binary.
    pub bin: PathBuf,
    /// Kubeconfig.
    pub kubeconfig: PathBuf,
    /// Namespace of the Leases.
    pub pod_namespace: String,
    /// Watched namespaces.
    pub namespaces: Vec<String>,
    /// `--shards`.
    pub shards: u32,
    /// `--lease-duration`, seconds.
    pub lease_duration: u64,
    /// `--renew-deadline`, seconds.
    pub renew_deadline: u64,
    /// `--retry-period`, seconds.
    pub retry_period: u64,
    /// `--kms-rate-limit`.
    pub kms_rate_limit: f64,
    /// `--expected-replicas`: the run's initial replica count, as the chart
    /// renders its `replicaCount` (scaling later does not change it, as
    /// `kubectl scale` does not change a StatefulSet's environment).
    pub expected_replicas: usize,
    /// `--cache-encryption-key-file`.
    pub key_file: PathBuf,
    /// Where replica directories go.
    pub dir: PathBuf,
}

/// One replica (a pod name) and its current process, if any.
pub struct Replica {
    /// Pod name.
    pub name: String,
    process: Option<Process>,
    /// Number of processes started under this name.
    pub incarnations: u32,
    /// Cache directory.
    pub cache_dir: PathBuf,
}

/// Counters of what the replicas logged.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct LogCounts {
    /// ERROR lines per replica.
    pub errors: BTreeMap<String, usize>,
    /// WARN lines per replica.
    pub warnings: BTreeMap<String, usize>,
    /// A few distinct ERROR messages.
    pub error_samples: Vec<String>,
    /// Panics seen.
    pub panics: Vec<String>,
}

/// The replicas of a run as the process track sees them: processes of this
/// runner ([`Replicas`]) or the pods of a Helm release (`pods::Pods`).
pub trait Fleet: Send {
    /// Names of replicas that run and are not paused, sorted.
    fn live(&self) -> Vec<String>;
    /// SIGKILL `name`'s process.
    fn kill(&mut self, name: &str);
    /// Stop `name` gracefully, killing it after `timeout`; how long the
    /// graceful stop took, `None` when it had to be killed.
    fn terminate(&mut self, name: &str, timeout: Duration) -> Option<Duration>;
    /// SIGSTOP `name`.
    fn pause(&mut self, name: &str);
    /// SIGCONT `name`.
    fn resume(&mut self, name: &str);
    /// Bring `name` back after a kill or a stop (pods come back on their
    /// own: this waits a while for them).
    fn restart(&mut self, name: &str) -> anyhow::Result<()>;
    /// The cache directory of `name`, as a path of this machine.
    fn cache_dir(&self, name: &str) -> Option<PathBuf>;
    /// Delete the cache of `name` (stopped); what was done.
    fn delete_cache(&mut self, name: &str) -> String;
    /// One replica more; its name.
    fn scale_up(&mut self) -> anyhow::Result<String>;
    /// One replica fewer (`name`, or whichever the fleet must remove), with
    /// a graceful stop; the name and how long the stop took.
    fn scale_down(&mut self, name: &str, timeout: Duration) -> (String, Option<Duration>);
    /// Replicas that exited without being told to since the last call
    /// (`(name, what happened)`).
    fn exited(&mut self) -> Vec<(String, String)>;
    /// Stop every replica gracefully.
    fn stop_all(&mut self, timeout: Duration);
    /// What the logs said so far.
    fn counts(&self) -> LogCounts;
}

/// The replicas of a run.
pub struct Replicas {
    settings: Settings,
    /// By name.
    pub set: BTreeMap<String, Replica>,
    history: Arc<Mutex<History>>,
    /// What the logs said.
    pub counts: Arc<Mutex<LogCounts>>,
    next: usize,
}

fn parse_ts(v: &Value) -> Option<Ms> {
    v.as_str()?
        .parse::<k8s_openapi::jiff::Timestamp>()
        .ok()
        .map(|t| t.as_millisecond())
}

/// Read one JSON log line of `replica` into the history.
pub fn ingest(line: &str, replica: &str, history: &Mutex<History>, counts: &Mutex<LogCounts>) {
    if line.contains("panicked at") {
        let mut c = counts.lock().unwrap_or_else(|e| e.into_inner());
        if c.panics.len() < 20 {
            c.panics.push(format!("{replica}: {line}"));
        }
    }
    let Ok(v) = serde_json::from_str::<Value>(line) else {
        return;
    };
    let level = v["level"].as_str().unwrap_or_default();
    let msg = v["fields"]["message"].as_str().unwrap_or_default();
    if level == "ERROR" || level == "WARN" {
        let mut c = counts.lock().unwrap_or_else(|e| e.into_inner());
        let map = if level == "ERROR" {
            &mut c.errors
        } else {
            &mut c.warnings
        };
        *map.entry(replica.to_owned()).or_default() += 1;
        if level == "ERROR"
            && c.error_samples.len() < 20
            && !c.error_samples.iter().any(|s| s.ends_with(msg))
        {
            c.error_samples.push(format!("{replica}: {msg}"));
        }
    }
    let Some(at) = parse_ts(&v["timestamp"]) else {
        return;
    };
    match msg {
        "target written" | "lease created" => {
            let resource = v["fields"]["resource"].as_str().unwrap_or_default();
            let namespace = resource.split('/').nth(1).unwrap_or_default();
            history
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .writes
                .push(WriteObs {
                    at,
                    replica: replica.to_owned(),
                    namespace: namespace.to_owned(),
                    resource: resource.to_owned(),
                    message: msg.to_owned(),
                });
        }
        "could not record a new lease; revoking it" => {
            if let Some(id) = v["fields"]["lease"].as_str() {
                history
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .revoke_attempts
                    .push(id.to_owned());
            }
        }
        "gained shard" | "lost shard" | "shard lost" | "shard drained" => {
            let shard = v["fields"]["shard"]
                .as_u64()
                .and_then(|s| u32::try_from(s).ok());
            history
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .shard_log
                .push(ShardLogLine {
                    at,
                    replica: replica.to_owned(),
                    message: msg.to_owned(),
                    shard,
                });
        }
        _ => {}
    }
}

impl Replicas {
    /// No replicas yet.
    pub fn new(settings: Settings, history: Arc<Mutex<History>>) -> Self {
        Self {
            settings,
            set: BTreeMap::new(),
            history,
            counts: Arc::new(Mutex::new(LogCounts::default())),
            next: 0,
        }
    }

    /// A name not used yet in this run.
    pub fn fresh_name(&mut self) -> String {
        loop {
            let name = format!("replica-{}", self.next);
            self.next += 1;
            if !self.set.contains_key(&name) {
                return name;
            }
        }
    }

    /// Names of replicas whose process runs and is not paused, sorted.
    pub fn live(&self) -> Vec<String> {
        self.set
            .values()
            .filter(|r| r.process.as_ref().is_some_and(|p| !p.paused()))
            .map(|r| r.name.clone())
            .collect()
    }

    /// Start (or restart) the process of `name`.
    pub fn start(&mut self, name: &str) -> anyhow::Result<()> {
        let s = &self.settings;
        let dir = s.dir.join(name);
        let cache_dir = dir.join("cache");
        std::fs::create_dir_all(&dir)?;
        let r = self.set.entry(name.to_owned()).or_insert_with(|| Replica {
            name: name.to_owned(),
            process: None,
            incarnations: 0,
            cache_dir: cache_dir.clone(),
        });
        if r.process.is_some() {
            return Ok(());
        }
        r.incarnations += 1;
        let (replica, history, counts) =
            (name.to_owned(), self.history.clone(), self.counts.clone());
        let process = Launch::new(&s.bin)
            .env("KUBECONFIG", &s.kubeconfig)
            .env_remove("RUST_LOG")
            .name(name)
            .args(["--log-format", "json", "--log-level", "info", "run"])
            .arg(format!("--pod-name={name}"))
            .arg(format!("--pod-namespace={}", s.pod_namespace))
            .arg(format!("--namespaces={}", s.namespaces.join(",")))
            .arg(format!("--shards={}", s.shards))
            .arg(format!("--lease-duration={}", s.lease_duration))
            .arg(format!("--renew-deadline={}", s.renew_deadline))
            .arg(format!("--retry-period={}", s.retry_period))
            .arg(format!("--kms-rate-limit={}", s.kms_rate_limit))
            .arg(format!("--expected-replicas={}", s.expected_replicas))
            .cache_dir(&cache_dir)
            .arg("--cache-encryption-key-file")
            .arg(&s.key_file)
            .listen_any()
            .log_file(dir.join(format!("{}.log", r.incarnations)))
            .on_line(move |line| ingest(line, &replica, &history, &counts))
            .spawn()?;
        r.process = Some(process);
        self.history
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .starts
            .push(now_ms());
        Ok(())
    }

    fn process(&self, name: &str) -> Option<&Process> {
        self.set.get(name)?.process.as_ref()
    }

    fn record_kill(&self) {
        self.history
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .kills
            .push(now_ms());
    }

    /// kill -9 `name` and reap it.
    pub fn kill(&mut self, name: &str) {
        if let Some(mut p) = self.set.get_mut(name).and_then(|r| r.process.take()) {
            p.kill();
            self.record_kill();
        }
    }

    /// SIGTERM `name` and wait up to `timeout` for it to exit (then kill
    /// -9). Returns how long the graceful stop took, `None` if it had to be
    /// killed.
    pub fn terminate(&mut self, name: &str, timeout: Duration) -> Option<Duration> {
        let took = self.set.get_mut(name)?.process.take()?.stop(timeout);
        if took.is_none() {
            self.record_kill();
        }
        took
    }

    /// SIGSTOP `name`.
    pub fn pause(&mut self, name: &str) {
        if let Some(p) = self.process(name) {
            p.signal("STOP");
        }
    }

    /// SIGCONT `name`.
    pub fn resume(&mut self, name: &str) {
        if let Some(p) = self.process(name) {
            p.signal("CONT");
        }
    }

    /// Forget `name` (after it stopped for good).
    pub fn remove(&mut self, name: &str) {
        self.kill(name);
        self.set.remove(name);
    }

    /// The cache directory of `name`.
    pub fn cache_dir(&self, name: &str) -> Option<&Path> {
        self.set.get(name).map(|r| r.cache_dir.as_path())
    }

    /// Processes that exited on their own.
    pub fn exited(&mut self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for r in self.set.values_mut() {
            if let Some(status) = r.process.as_mut().and_then(Process::try_exit) {
                out.push((r.name.clone(), format!("{} exited: {status}", r.name)));
                r.process = None;
            }
        }
        out
    }

    /// Stop every replica gracefully (SIGCONT first).
    pub fn stop_all(&mut self, timeout: Duration) {
        let mut stopped: Vec<Process> = self
            .set
            .values_mut()
            .filter_map(|r| r.process.take())
            .collect();
        for took in replica::stop_all(&mut stopped, timeout) {
            if took.is_none() {
                self.record_kill();
            }
        }
    }
}

impl Fleet for Replicas {
    fn live(&self) -> Vec<String> {
        Replicas::live(self)
    }

    fn kill(&mut self, name: &str) {
        Replicas::kill(self, name);
    }

    fn terminate(&mut self, name: &str, timeout: Duration) -> Option<Duration> {
        Replicas::terminate(self, name, timeout)
    }

    fn pause(&mut self, name: &str) {
        Replicas::pause(self, name);
    }

    fn resume(&mut self, name: &str) {
        Replicas::resume(self, name);
    }

    fn restart(&mut self, name: &str) -> anyhow::Result<()> {
        self.start(name)
    }

    fn cache_dir(&self, name: &str) -> Option<PathBuf> {
        Replicas::cache_dir(self, name).map(Path::to_path_buf)
    }

    fn delete_cache(&mut self, name: &str) -> String {
        match Replicas::cache_dir(self, name) {
            Some(d) => {
                let _ = std::fs::remove_dir_all(d);
                "cache deleted".into()
            }
            None => "no cache to delete".into(),
        }
    }

    fn scale_up(&mut self) -> anyhow::Result<String> {
        let name = self.fresh_name();
        self.start(&name)?;
        Ok(name)
    }

    fn scale_down(&mut self, name: &str, timeout: Duration) -> (String, Option<Duration>) {
        let took = Replicas::terminate(self, name, timeout);
        self.remove(name);
        (name.to_owned(), took)
    }

    fn exited(&mut self) -> Vec<(String, String)> {
        Replicas::exited(self)
    }

    fn stop_all(&mut self, timeout: Duration) {
        Replicas::stop_all(self, timeout);
    }

    fn counts(&self) -> LogCounts {
        self.counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_become_writes_and_shard_events() {
        let h = Mutex::new(History::default());
        let c = Mutex::new(LogCounts::default());
        ingest(
            r#"{"timestamp":"2026-01-01T00:00:01.250Z","level":"INFO","fields":{"message":"target written","resource":"KmsSecret/ns-1/app","target":"Secret/ns-1/app-out"},"target":"x"}"#,
            "replica-0",
            &h,
            &c,
        );
        ingest(
            r#"{"timestamp":"2026-01-01T00:00:02Z","level":"INFO","fields":{"message":"gained shard","shard":7},"target":"shard"}"#,
            "replica-0",
            &h,
            &c,
        );
        ingest(
            r#"{"timestamp":"2026-01-01T00:00:02Z","level":"ERROR","fields":{"message":"boom"}}"#,
            "replica-1",
            &h,
            &c,
        );
        ingest("not json", "replica-0", &h, &c);
        let h = h.into_inner().unwrap();
        assert_eq!(h.writes.len(), 1);
        assert_eq!(h.writes[0].namespace, "ns-1");
        assert_eq!(h.writes[0].at, 1_767_225_601_250);
        assert_eq!(h.shard_log[0].shard, Some(7));
        assert_eq!(c.into_inner().unwrap().errors["replica-1"], 1);
    }
}
