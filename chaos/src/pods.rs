//! Cluster mode: the replicas are the pods of the Helm chart on the node of
//! a testenv (`tests/testenv/testenv up DIR --node`), installed the way
//! users install it. The faults act on them as they would in production:
//! SIGKILL of the container's process (the kubelet restarts the container,
//! which keeps its emptyDir cache), pod deletion (graceful; the StatefulSet
//! creates a new pod with a new, empty cache), SIGSTOP, the cache damaged in
//! the pod's emptyDir on this machine, and `kubectl scale`. The pods' logs
//! are read from the kubelet's log files as they grow, into the same
//! history the checkers judge in process mode.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use kms_testkit::node;
use kms_testkit::signal;
use serde_json::Value;

use crate::history::{History, now_ms};
use crate::replicas::{Fleet, LogCounts, ingest};

/// The Helm release (and name prefix: `fullnameOverride`); its Leases are
/// `kms-operator-shard-N`, as in process mode.
pub const RELEASE: &str = "kms-operator";
/// The StatefulSet the chart creates for it.
const STATEFULSET: &str = "kms-operator-controller-manager";
/// The operator's container.
const CONTAINER: &str = "manager";
/// The pods' termination grace period: the process mode's stop timeout, after
/// which the kubelet kills the container as the runner kills a process.
const GRACE: Duration = Duration::from_secs(30);

/// What the release is installed with.
#[derive(Clone, Debug)]
pub struct PodSettings {
    /// `helm`.
    pub helm: PathBuf,
    /// `kubectl`.
    pub kubectl: PathBuf,
    /// Kubeconfig of the node's control plane.
    pub kubeconfig: PathBuf,
    /// The testenv directory (for the kubelet's files).
    pub testenv_dir: PathBuf,
    /// The chart.
    pub chart: PathBuf,
    /// The image, `repository:tag`, already on the node.
    pub image: String,
    /// Release namespace (the Leases live there).
    pub namespace: String,
    /// Watched namespaces (a namespace-scoped install).
    pub namespaces: Vec<String>,
    /// Replicas at the start.
    pub replicas: usize,
    /// Shards.
    pub shards: u32,
    /// Lease timing, seconds.
    pub lease_duration: u64,
    /// Renew deadline, seconds.
    pub renew_deadline: u64,
    /// Retry period, seconds.
    pub retry_period: u64,
    /// KMS requests per second.
    pub kms_rate_limit: f64,
    /// Where the values file and the copies of the logs go.
    pub dir: PathBuf,
}

/// One pod as `kubectl get` shows it.
#[derive(Clone, Debug, Default)]
struct PodState {
    name: String,
    uid: String,
    deleting: bool,
    running: bool,
    restarts: i64,
    last_exit: String,
}

fn pod_state(v: &Value) -> PodState {
    let status = &v["status"]["containerStatuses"];
    let manager = status
        .as_array()
        .and_then(|a| a.iter().find(|c| c["name"] == CONTAINER))
        .cloned()
        .unwrap_or_default();
    let term = &manager["lastState"]["terminated"];
    PodState {
        name: v["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        uid: v["metadata"]["uid"].as_str().unwrap_or_default().to_owned(),
        deleting: !v["metadata"]["deletionTimestamp"].is_null(),
        running: !manager["state"]["running"].is_null(),
        restarts: manager["restartCount"].as_i64().unwrap_or(0),
        last_exit: format!(
            "{} (exit code {}, signal {})",
            term["reason"].as_str().unwrap_or("?"),
            term["exitCode"],
            term["signal"]
        ),
    }
}

/// The pods of the release.
pub struct Pods {
    s: PodSettings,
    desired: usize,
    /// Paused pods, with the process that was stopped.
    paused: BTreeMap<String, u32>,
    /// Container restarts this runner caused, per pod uid.
    caused: HashMap<String, i64>,
    /// Restarts already accounted for, per pod uid.
    seen: HashMap<String, i64>,
    history: Arc<Mutex<History>>,
    counts: Arc<Mutex<LogCounts>>,
    stop_tail: Arc<AtomicBool>,
    tail: Option<std::thread::JoinHandle<()>>,
}

impl Pods {
    /// Install the release and wait until its pods are Ready; the logs are
    /// followed from the first line.
    pub fn install(s: PodSettings, history: Arc<Mutex<History>>) -> anyhow::Result<Self> {
        std::fs::create_dir_all(&s.dir)?;
        let counts = Arc::new(Mutex::new(LogCounts::default()));
        let stop_tail = Arc::new(AtomicBool::new(false));
        let tail = follow_logs(
            s.namespace.clone(),
            s.dir.join("logs"),
            history.clone(),
            counts.clone(),
            stop_tail.clone(),
        );
        let (repository, tag) = s
            .image
            .rsplit_once(':')
            .context("the image needs a tag (repository:tag)")?;
        let values = serde_json::json!({
            "fullnameOverride": RELEASE,
            "installCRDs": false,
            "scopedRBAC": true,
            "scopedNamespaces": s.namespaces,
            "controllerManager": {
                "replicas": s.replicas,
                "terminationGracePeriodSeconds": GRACE.as_secs(),
                "manager": {"image": {"repository": repository, "tag": tag, "pullPolicy": "Never"}},
            },
            "sharding": {"shards": s.shards},
            "leaderElection": {
                "leaseDuration": format!("{}s", s.lease_duration),
                "renewDeadline": format!("{}s", s.renew_deadline),
                "retryPeriod": format!("{}s", s.retry_period),
            },
            "kms": {"rateLimit": s.kms_rate_limit},
        });
        let values_file = s.dir.join("values.json");
        std::fs::write(&values_file, serde_json::to_vec_pretty(&values)?)?;
        let pods = Self {
            desired: s.replicas,
            s,
            paused: BTreeMap::new(),
            caused: HashMap::new(),
            seen: HashMap::new(),
            history,
            counts,
            stop_tail,
            tail: Some(tail),
        };
        pods.helm(&[
            "upgrade",
            "--install",
            RELEASE,
            pods.s.chart.to_str().unwrap_or_default(),
            "-n",
            &pods.s.namespace,
            "--wait",
            "--timeout",
            "180s",
            "-f",
            values_file.to_str().unwrap_or_default(),
        ])?;
        Ok(pods)
    }

    fn helm(&self, args: &[&str]) -> anyhow::Result<String> {
        let home = self.s.dir.join("helm-home");
        let out = Command::new(&self.s.helm)
            .args(args)
            .env("KUBECONFIG", &self.s.kubeconfig)
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_DATA_HOME", home.join("data"))
            .output()
            .context("running helm")?;
        if !out.status.success() {
            bail!("helm {}: {}", args[0], String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn kubectl(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new(&self.s.kubectl)
            .args(args)
            .args(["-n", &self.s.namespace])
            .env("KUBECONFIG", &self.s.kubeconfig)
            .output()
            .context("running kubectl")?;
        if !out.status.success() {
            bail!(
                "kubectl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The release's pods, by name (an API error reads as "none known").
    fn pods(&self) -> BTreeMap<String, PodState> {
        let Ok(text) = self.kubectl(&[
            "get",
            "pods",
            "-l",
            &format!("app.kubernetes.io/instance={RELEASE}"),
            "-o",
            "json",
        ]) else {
            return BTreeMap::new();
        };
        let v: Value = serde_json::from_str(&text).unwrap_or_default();
        v["items"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(pod_state)
                    .map(|p| (p.name.clone(), p))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn process(&self, name: &str) -> Option<u32> {
        node::operator_process(&self.s.namespace, name)
    }

    /// Wait until `name` runs (a new container or a new pod), at most
    /// `limit`.
    fn wait_running(&self, name: &str, not_uid: Option<&str>, limit: Duration) -> bool {
        let started = Instant::now();
        while started.elapsed() < limit {
            if let Some(p) = self.pods().get(name)
                && p.running
                && !p.deleting
                && Some(p.uid.as_str()) != not_uid
                && self.process(name).is_some()
            {
                return true;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        false
    }

    /// Scale the StatefulSet down by one (it removes its highest ordinal)
    /// and wait until that pod is gone; its name, and how long that took
    /// (`None` past `timeout`).
    fn remove_highest(&mut self, timeout: Duration) -> (String, Option<Duration>) {
        let name = format!("{STATEFULSET}-{}", self.desired.saturating_sub(1));
        let uid = self.pods().get(&name).map(|p| p.uid.clone());
        self.resume(&name);
        let started = Instant::now();
        if self.scale(self.desired.saturating_sub(1)).is_err() {
            return (name, None);
        }
        while started.elapsed() < timeout + Duration::from_secs(5) {
            if self
                .pods()
                .get(&name)
                .is_none_or(|p| Some(&p.uid) != uid.as_ref())
            {
                return (name, Some(started.elapsed()));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        (name, None)
    }

    /// A pod that took the whole grace period to go was killed by the
    /// kubelet: recorded as a kill, as the process mode records its own.
    fn killed_at_grace_end(&self, took: Option<Duration>) {
        if took.is_none_or(|t| t >= GRACE) {
            self.history
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .kills
                .push(now_ms());
        }
    }

    /// Delete pod `name` (graceful) and wait until it is gone; how long
    /// that took, `None` past `timeout` (the pod is then force-deleted).
    fn delete_pod(&mut self, name: &str, timeout: Duration) -> Option<Duration> {
        let uid = self.pods().get(name)?.uid.clone();
        self.resume(name);
        let started = Instant::now();
        self.kubectl(&["delete", "pod", name, "--wait=false"])
            .ok()?;
        while started.elapsed() < timeout + Duration::from_secs(5) {
            if self.pods().get(name).is_none_or(|p| p.uid != uid) {
                return Some(started.elapsed());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.kubectl(&["delete", "pod", name, "--grace-period=0", "--force"]);
        None
    }

    fn scale(&mut self, replicas: usize) -> anyhow::Result<()> {
        self.kubectl(&[
            "scale",
            "statefulset",
            STATEFULSET,
            &format!("--replicas={replicas}"),
        ])?;
        self.desired = replicas;
        Ok(())
    }
}

impl Fleet for Pods {
    fn live(&self) -> Vec<String> {
        self.pods()
            .into_values()
            .filter(|p| p.running && !p.deleting && !self.paused.contains_key(&p.name))
            .map(|p| p.name)
            .collect()
    }

    fn kill(&mut self, name: &str) {
        let pid = self.paused.remove(name).or_else(|| self.process(name));
        if let Some(pid) = pid {
            signal(pid, "KILL");
            if let Some(p) = self.pods().get(name) {
                *self.caused.entry(p.uid.clone()).or_default() += 1;
            }
            self.history
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .kills
                .push(now_ms());
        }
    }

    fn terminate(&mut self, name: &str, timeout: Duration) -> Option<Duration> {
        let took = self.delete_pod(name, timeout);
        self.killed_at_grace_end(took);
        took
    }

    fn pause(&mut self, name: &str) {
        if let Some(pid) = self.process(name) {
            signal(pid, "STOP");
            self.paused.insert(name.to_owned(), pid);
        }
    }

    fn resume(&mut self, name: &str) {
        if let Some(pid) = self.paused.remove(name) {
            signal(pid, "CONT");
        }
    }

    fn restart(&mut self, name: &str) -> anyhow::Result<()> {
        // The kubelet (a killed container) or the StatefulSet (a deleted
        // pod) brings it back; the kubelet's back-off can take a while.
        if !self.wait_running(name, None, Duration::from_secs(30)) {
            bail!("{name} was not running again within 30 s");
        }
        Ok(())
    }

    fn cache_dir(&self, name: &str) -> Option<PathBuf> {
        let uid = self.pods().get(name)?.uid.clone();
        Some(node::empty_dir(&self.s.testenv_dir, &uid, "cache"))
    }

    fn delete_cache(&mut self, _name: &str) -> String {
        "the new pod starts with a new, empty emptyDir".into()
    }

    fn scale_up(&mut self) -> anyhow::Result<String> {
        let name = format!("{STATEFULSET}-{}", self.desired);
        self.scale(self.desired + 1)?;
        if !self.wait_running(&name, None, Duration::from_secs(60)) {
            bail!("{name} did not start within 60 s");
        }
        Ok(name)
    }

    fn scale_down(&mut self, _name: &str, timeout: Duration) -> (String, Option<Duration>) {
        let (name, took) = self.remove_highest(timeout);
        self.killed_at_grace_end(took);
        (name, took)
    }

    fn exited(&mut self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for p in self.pods().into_values() {
            let caused = self.caused.get(&p.uid).copied().unwrap_or(0);
            let seen = self.seen.entry(p.uid.clone()).or_insert(0);
            let unexplained = p.restarts - caused;
            if unexplained > *seen {
                out.push((
                    p.name.clone(),
                    format!(
                        "{}: the container restarted without being killed: {}",
                        p.name, p.last_exit
                    ),
                ));
                *seen = unexplained;
            }
        }
        out
    }

    fn stop_all(&mut self, timeout: Duration) {
        let names: Vec<String> = self.paused.keys().cloned().collect();
        for n in names {
            self.resume(&n);
        }
        let _ = self.scale(0);
        let started = Instant::now();
        while started.elapsed() < timeout + Duration::from_secs(5) && !self.pods().is_empty() {
            std::thread::sleep(Duration::from_millis(250));
        }
        // Let the log follower read the last lines.
        std::thread::sleep(Duration::from_millis(500));
        let _ = self.helm(&["uninstall", RELEASE, "-n", &self.s.namespace]);
    }

    fn counts(&self) -> LogCounts {
        self.counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl Drop for Pods {
    fn drop(&mut self) {
        let names: Vec<String> = self.paused.keys().cloned().collect();
        for n in names {
            self.resume(&n);
        }
        self.stop_tail.store(true, Ordering::SeqCst);
        if let Some(t) = self.tail.take() {
            let _ = t.join();
        }
    }
}

/// One container log file being followed.
struct Followed {
    pod: String,
    file: File,
    inode: u64,
    partial: String,
    rest: Vec<u8>,
    copy: File,
}

impl Followed {
    /// Read what was appended; hand every complete line to `ingest`.
    fn read(&mut self, history: &Mutex<History>, counts: &Mutex<LogCounts>) -> usize {
        let mut buf = Vec::new();
        if self.file.read_to_end(&mut buf).is_err() || buf.is_empty() {
            return 0;
        }
        let n = buf.len();
        self.rest.extend_from_slice(&buf);
        while let Some(end) = self.rest.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.rest.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line[..line.len() - 1]).into_owned();
            let Some((partial, text)) = node::cri_line(&line) else {
                continue;
            };
            self.partial.push_str(text);
            if partial {
                continue;
            }
            let whole = std::mem::take(&mut self.partial);
            let _ = writeln!(self.copy, "{whole}");
            ingest(&whole, &self.pod, history, counts);
        }
        n
    }
}

/// Follow the logs of every operator pod in `namespace`: each container's
/// log file (`<restarts>.log`, and its successor when the kubelet rotates
/// it) from its first line, until `stop`. A new file is a new start of the
/// operator, which the budget checker needs to know.
fn follow_logs(
    namespace: String,
    copies: PathBuf,
    history: Arc<Mutex<History>>,
    counts: Arc<Mutex<LogCounts>>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let _ = std::fs::create_dir_all(&copies);
        let mut followed: BTreeMap<PathBuf, Followed> = BTreeMap::new();
        let prefix = format!("{namespace}_{STATEFULSET}-");
        loop {
            let stopping = stop.load(Ordering::SeqCst);
            for (path, pod) in log_files(Path::new(node::POD_LOGS), &prefix) {
                let Ok(meta) = std::fs::metadata(&path) else {
                    continue;
                };
                let rotated = followed.get(&path).is_some_and(|f| f.inode != meta.ino());
                if rotated && let Some(mut old) = followed.remove(&path) {
                    old.read(&history, &counts);
                }
                if followed.contains_key(&path) {
                    continue;
                }
                let Ok(file) = File::open(&path) else {
                    continue;
                };
                let copy_name = path
                    .strip_prefix(node::POD_LOGS)
                    .map(|p| p.to_string_lossy().replace('/', "_"))
                    .unwrap_or_default();
                let Ok(copy) = File::create(copies.join(copy_name)) else {
                    continue;
                };
                if !rotated {
                    history
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .starts
                        .push(now_ms());
                }
                followed.insert(
                    path,
                    Followed {
                        pod,
                        file,
                        inode: meta.ino(),
                        partial: String::new(),
                        rest: Vec::new(),
                        copy,
                    },
                );
            }
            let mut gone = Vec::new();
            for (path, f) in &mut followed {
                if f.read(&history, &counts) == 0 && !path.exists() {
                    gone.push(path.clone());
                }
            }
            for p in gone {
                followed.remove(&p);
            }
            if stopping {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    })
}

/// The operator container's log files under `root` of pods whose directory
/// starts with `prefix` (`<namespace>_<pod>_<uid>`), with the pod's name.
fn log_files(root: &Path, prefix: &str) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let Ok(dirs) = std::fs::read_dir(root) else {
        return out;
    };
    for d in dirs.flatten() {
        let dir_name = d.file_name().to_string_lossy().into_owned();
        if !dir_name.starts_with(prefix) {
            continue;
        }
        let mut parts = dir_name.splitn(3, '_');
        let (_, Some(pod)) = (parts.next(), parts.next()) else {
            continue;
        };
        let Ok(files) = std::fs::read_dir(d.path().join(CONTAINER)) else {
            continue;
        };
        for f in files.flatten() {
            let name = f.file_name().to_string_lossy().into_owned();
            // `N.log`; rotated files carry a time suffix and were read
            // before they were rotated.
            if name
                .strip_suffix(".log")
                .is_some_and(|n| n.parse::<u32>().is_ok())
            {
                out.push((f.path(), pod.to_owned()));
            }
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_status_reads_the_manager_container() {
        let v: Value = serde_json::from_str(
            r#"{"metadata":{"name":"kms-operator-controller-manager-1","uid":"u1"},
                "status":{"containerStatuses":[{"name":"manager","restartCount":2,
                  "state":{"running":{"startedAt":"x"}},
                  "lastState":{"terminated":{"reason":"Error","exitCode":137}}}]}}"#,
        )
        .unwrap();
        let p = pod_state(&v);
        assert_eq!(p.name, "kms-operator-controller-manager-1");
        assert!(p.running && !p.deleting);
        assert_eq!(p.restarts, 2);
        assert!(
            p.last_exit.starts_with("Error (exit code 137"),
            "{}",
            p.last_exit
        );
    }

    #[test]
    fn log_files_are_found_by_pod_and_partial_lines_joined() {
        let root = std::env::temp_dir().join(format!("kms-chaos-logs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let dir = root.join(format!("ns_{STATEFULSET}-0_uid-1/{CONTAINER}"));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("0.log");
        std::fs::write(
            &path,
            concat!(
                "2026-01-01T00:00:00Z stdout P {\"timestamp\":\"2026-01-01T00:00:01Z\",\"level\":\"INFO\",\n",
                "2026-01-01T00:00:00Z stdout F \"fields\":{\"message\":\"gained shard\",\"shard\":3}}\n",
                "2026-01-01T00:00:00Z stdout F {\"timestamp\":\"2026-01-01T00:00:02Z\",\"level\":\"ERROR\",\"fields\":{\"message\":\"boom\"}}\n",
                "2026-01-01T00:00:00Z stdout F half a li"
            ),
        )
        .unwrap();
        std::fs::write(dir.join("0.log.20260101-000000"), "old\n").unwrap();
        std::fs::create_dir_all(root.join("other_pod_uid/manager")).unwrap();
        std::fs::write(root.join("other_pod_uid/manager/0.log"), "x\n").unwrap();
        let files = log_files(&root, &format!("ns_{STATEFULSET}-"));
        assert_eq!(files, vec![(path.clone(), format!("{STATEFULSET}-0"))]);

        let history = Mutex::new(History::default());
        let counts = Mutex::new(LogCounts::default());
        let copy = root.join("copy.log");
        let mut f = Followed {
            pod: files[0].1.clone(),
            file: File::open(&path).unwrap(),
            inode: 0,
            partial: String::new(),
            rest: Vec::new(),
            copy: File::create(&copy).unwrap(),
        };
        assert!(f.read(&history, &counts) > 0);
        let h = history.lock().unwrap();
        assert_eq!(h.shard_log.len(), 1, "the joined line was read");
        assert_eq!(h.shard_log[0].shard, Some(3));
        assert_eq!(
            counts.lock().unwrap().errors[&format!("{STATEFULSET}-0")],
            1
        );
        // The unfinished line waits for its end.
        assert_eq!(f.rest, b"2026-01-01T00:00:00Z stdout F half a li");
        let _ = std::fs::remove_dir_all(&root);
    }
}
