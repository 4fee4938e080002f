//! One runner for the child processes of the `kms-operator` binary that the
//! suites start from outside: operator replicas for the integration tests,
//! the benchmark and the chaos runner (and, through the same machinery, the
//! dev server of [`crate::devserver`]).
//!
//! A [`Launch`] says what to start: the program and its arguments, the
//! environment, the replica's name (`POD_NAME`) and cache directory, its
//! health and metrics addresses (`127.0.0.1:0`, read back from the log's
//! "serving" lines, or a free port chosen beforehand with [`free_addr`]),
//! and where its output goes: a log file per start, lines kept in memory
//! ([`Lines`]), a callback that sees every line as it arrives, or any mix.
//! [`Launch::spawn`] gives a [`Replica`]: its pid, signals (TERM, KILL,
//! STOP, CONT), a graceful stop with a timeout and then SIGKILL that says
//! how long it took ([`Replica::stop`], [`stop_all`]), waits for its exit
//! and for its `/readyz` to answer 200 (failing early, with the log, when
//! the process exits first), and its `/proc` usage (peak RSS, CPU time).
//! Dropping a `Replica` kills the process.

use std::ffi::{OsStr, OsString};
use std::future::Future;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use serde_json::Value;

/// The poll period of the waits for a process to exit.
const EXIT_POLL: Duration = Duration::from_millis(20);
/// The poll period of [`Replica::wait_ready`].
const READY_POLL: Duration = Duration::from_millis(100);
/// How long [`Replica::log`] waits for the last lines of an exited process.
const READERS_DRAIN: Duration = Duration::from_secs(1);
/// The least a replica of [`stop_all`] is given to exit, however late.
const LEAST_STOP: Duration = Duration::from_millis(100);

/// A callback that sees every output line as it arrives.
pub type LineFn = Arc<dyn Fn(&str) + Send + Sync>;

/// Output lines kept in memory (a cheap handle: clones share the lines).
#[derive(Clone, Default)]
pub struct Lines(Arc<Mutex<Vec<String>>>);

impl Lines {
    fn push(&self, line: &str) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(line.to_owned());
    }

    /// Everything captured so far, one line per line.
    pub fn text(&self) -> String {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).join("\n")
    }
}

/// A free port of the loopback address (`127.0.0.1:PORT`), for a process
/// whose address must be known before it starts.
pub fn free_addr() -> anyhow::Result<String> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.to_string())
}

/// The addresses an operator's JSON log says it serves on (health,
/// metrics): the `addr` of its "serving…" lines.
pub fn served_addresses(log: &str) -> Vec<String> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| {
            v["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("serving"))
        })
        .filter_map(|v| v["fields"]["addr"].as_str().map(str::to_owned))
        .collect()
}

/// Wait up to `timeout` for `child` to exit, polling every 20 ms (from
/// synchronous code, as a `Drop` or a test without a runtime): its exit
/// status, `None` when it still runs.
pub fn wait_child(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let started = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if started.elapsed() < timeout => {}
            _ => return None,
        }
        std::thread::sleep(EXIT_POLL);
    }
}

/// What to start: the program, its arguments and environment, and where
/// its output goes. Arguments and environment changes apply in the order
/// they are given.
pub struct Launch {
    program: PathBuf,
    args: Vec<OsString>,
    env: Vec<(OsString, Option<OsString>)>,
    env_clear: bool,
    name: Option<String>,
    health_addr: Option<String>,
    log_file: Option<PathBuf>,
    lines: Option<Lines>,
    on_line: Option<LineFn>,
}

impl Launch {
    /// Start `program` (the operator binary, or whatever a command template
    /// names), with no arguments yet.
    pub fn new(program: impl Into<PathBuf>) -> Self {
        Self {
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            env_clear: false,
            name: None,
            health_addr: None,
            log_file: None,
            lines: None,
            on_line: None,
        }
    }

    /// One argument more.
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.args.push(arg.as_ref().to_owned());
        self
    }

    /// Arguments more.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// Set `key` in the process's environment.
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.env
            .push((key.as_ref().to_owned(), Some(value.as_ref().to_owned())));
        self
    }

    /// Remove `key` from the process's environment.
    pub fn env_remove(mut self, key: impl AsRef<OsStr>) -> Self {
        self.env.push((key.as_ref().to_owned(), None));
        self
    }

    /// Start from an empty environment instead of this process's.
    pub fn env_clear(mut self) -> Self {
        self.env_clear = true;
        self
    }

    /// The replica's name: `POD_NAME` in its environment, and the name its
    /// errors and [`Usage`] carry.
    pub fn name(mut self, name: &str) -> Self {
        self.name = Some(name.to_owned());
        self.env("POD_NAME", name)
    }

    /// `--cache-dir DIR`.
    pub fn cache_dir(self, dir: &Path) -> Self {
        self.arg("--cache-dir").arg(dir)
    }

    /// `--metrics-addr 127.0.0.1:0 --health-addr 127.0.0.1:0`: ports the
    /// system picks, read back from the log's "serving" lines (so the
    /// output must be captured or go to a log file).
    pub fn listen_any(self) -> Self {
        self.args([
            "--metrics-addr",
            "127.0.0.1:0",
            "--health-addr",
            "127.0.0.1:0",
        ])
    }

    /// Where `/readyz` answers, when the arguments fix it (see
    /// [`free_addr`]); otherwise it is read from the log.
    pub fn health_addr(mut self, addr: &str) -> Self {
        self.health_addr = Some(addr.to_owned());
        self
    }

    /// Standard output and error go to `path` (created anew).
    pub fn log_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.log_file = Some(path.into());
        self
    }

    /// Every output line is also kept in `lines`.
    pub fn capture(mut self, lines: &Lines) -> Self {
        self.lines = Some(lines.clone());
        self
    }

    /// Every output line is handed to `f` as it arrives (from a thread per
    /// stream, so `f` may see standard output and error interleaved).
    pub fn on_line(mut self, f: impl Fn(&str) + Send + Sync + 'static) -> Self {
        self.on_line = Some(Arc::new(f));
        self
    }

    fn label(&self) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| self.program.display().to_string())
    }

    /// Start the process.
    pub fn spawn(self) -> anyhow::Result<Replica> {
        let label = self.label();
        let mut command = Command::new(&self.program);
        command.args(&self.args);
        if self.env_clear {
            command.env_clear();
        }
        for (key, value) in &self.env {
            match value {
                Some(v) => command.env(key, v),
                None => command.env_remove(key),
            };
        }
        let file = match &self.log_file {
            Some(path) => Some(
                std::fs::File::create(path)
                    .with_context(|| format!("creating {}", path.display()))?,
            ),
            None => None,
        };
        let piped = self.lines.is_some() || self.on_line.is_some();
        match (&file, piped) {
            (Some(f), false) => {
                command.stdout(f.try_clone()?).stderr(f.try_clone()?);
            }
            (None, false) => {
                command.stdout(Stdio::null()).stderr(Stdio::null());
            }
            (_, true) => {
                command.stdout(Stdio::piped()).stderr(Stdio::piped());
            }
        }
        let mut child = command.spawn().with_context(|| {
            let argv: Vec<_> = self.args.iter().map(|a| a.to_string_lossy()).collect();
            format!(
                "starting {label}: {} {}",
                self.program.display(),
                argv.join(" ")
            )
        })?;
        let mut readers = Vec::new();
        if piped {
            let sink = Sink {
                file: file.map(|f| Arc::new(Mutex::new(f))),
                lines: self.lines.clone(),
                on_line: self.on_line,
            };
            readers.push(sink.read(child.stdout.take().context("stdout")?));
            readers.push(sink.read(child.stderr.take().context("stderr")?));
        }
        Ok(Replica {
            label,
            child,
            status: None,
            paused: AtomicBool::new(false),
            health_addr: self.health_addr,
            log_file: self.log_file,
            lines: self.lines,
            readers,
            http: OnceLock::new(),
        })
    }
}

/// Where piped output lines go.
#[derive(Clone)]
struct Sink {
    file: Option<Arc<Mutex<std::fs::File>>>,
    lines: Option<Lines>,
    on_line: Option<LineFn>,
}

impl Sink {
    /// Read `stream` to its end on a thread of its own (so the process
    /// never blocks on a full pipe).
    fn read(&self, stream: impl Read + Send + 'static) -> JoinHandle<()> {
        let sink = self.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                if let Some(f) = &sink.on_line {
                    f(&line);
                }
                if let Some(lines) = &sink.lines {
                    lines.push(&line);
                }
                if let Some(file) = &sink.file {
                    let _ = writeln!(file.lock().unwrap_or_else(|e| e.into_inner()), "{line}");
                }
            }
        })
    }
}

/// Why [`Replica::wait_ready`] gave up.
#[derive(Debug)]
pub enum NotReady {
    /// The process exited first: its status and log.
    Exited(String),
    /// `/readyz` did not answer 200 in time: the log.
    Timeout(String),
}

impl std::fmt::Display for NotReady {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Exited(s) | Self::Timeout(s) => f.write_str(s),
        }
    }
}

impl std::error::Error for NotReady {}

/// A started process (see [`Launch`]). Dropping it kills the process.
pub struct Replica {
    label: String,
    child: Child,
    status: Option<ExitStatus>,
    paused: AtomicBool,
    health_addr: Option<String>,
    log_file: Option<PathBuf>,
    lines: Option<Lines>,
    readers: Vec<JoinHandle<()>>,
    http: OnceLock<reqwest::Client>,
}

impl Replica {
    /// The process id while it is not known to have exited.
    pub fn pid(&self) -> Option<u32> {
        self.status.is_none().then(|| self.child.id())
    }

    /// Send `SIG<sig>` (`TERM`, `KILL`, `STOP`, `CONT`) and return at once;
    /// STOP and CONT also mark it paused or not. Nothing is sent to a
    /// process known to have exited.
    pub fn signal(&self, sig: &str) {
        let Some(pid) = self.pid() else {
            return;
        };
        crate::signal(pid, sig);
        match sig {
            "STOP" => self.paused.store(true, Ordering::SeqCst),
            "CONT" => self.paused.store(false, Ordering::SeqCst),
            _ => {}
        }
    }

    /// Whether it was paused with SIGSTOP (and not continued since).
    pub fn paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    /// Its exit status, if it has exited (without waiting).
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        if self.status.is_none()
            && let Ok(Some(status)) = self.child.try_wait()
        {
            self.status = Some(status);
        }
        self.status
    }

    /// Wait up to `timeout` for it to exit (sending nothing): its exit
    /// status, `None` when it still runs.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = wait_child(&mut self.child, timeout);
        }
        self.status
    }

    /// SIGKILL it and reap it.
    pub fn kill(&mut self) {
        if self.status.is_none() {
            let _ = self.child.kill();
            self.status = self.child.wait().ok();
        }
        self.paused.store(false, Ordering::SeqCst);
    }

    /// SIGCONT when paused, then SIGTERM.
    fn term(&self) {
        if self.paused() {
            self.signal("CONT");
        }
        self.signal("TERM");
    }

    /// After [`Replica::term`] at `started`: wait for the exit until
    /// `timeout` after it (at least `least`), then SIGKILL.
    fn finish(&mut self, started: Instant, timeout: Duration, least: Duration) -> Option<Duration> {
        let left = timeout.saturating_sub(started.elapsed()).max(least);
        if self.wait_exit(left).is_some() {
            return Some(started.elapsed());
        }
        self.kill();
        None
    }

    /// Stop it gracefully: SIGCONT when paused, SIGTERM, and SIGKILL when
    /// it has not exited within `timeout`. How long the graceful stop took,
    /// `None` when it had to be killed.
    pub fn stop(&mut self, timeout: Duration) -> Option<Duration> {
        let started = Instant::now();
        self.term();
        self.finish(started, timeout, Duration::ZERO)
    }

    /// Its output so far: the captured lines, or else the log file. Once
    /// it has exited, the last lines are waited for (up to a second).
    pub fn log(&self) -> String {
        if self.status.is_some() {
            let since = Instant::now();
            while self.readers.iter().any(|r| !r.is_finished()) && since.elapsed() < READERS_DRAIN {
                std::thread::sleep(EXIT_POLL);
            }
        }
        match (&self.lines, &self.log_file) {
            (Some(lines), _) => lines.text(),
            (None, Some(path)) => std::fs::read_to_string(path).unwrap_or_default(),
            (None, None) => String::new(),
        }
    }

    /// The addresses it serves on (health, metrics), from its log.
    pub fn served(&self) -> Vec<String> {
        served_addresses(&self.log())
    }

    /// Where to ask `/readyz`: the health address it was given, or else
    /// every address its log says it serves on.
    fn readyz_addresses(&self) -> Vec<String> {
        match &self.health_addr {
            Some(addr) => vec![addr.clone()],
            None => self.served(),
        }
    }

    fn http(&self) -> reqwest::Client {
        self.http
            .get_or_init(|| {
                reqwest::Client::builder()
                    .timeout(Duration::from_secs(2))
                    .build()
                    .unwrap_or_default()
            })
            .clone()
    }

    /// Whether `/readyz` answers 200 now (one probe per address).
    pub async fn is_ready(&self) -> bool {
        self.probe().await
    }

    /// One `/readyz` probe per address, as a future that does not borrow
    /// `self`: whether one answered 200.
    fn probe(&self) -> impl Future<Output = bool> + use<> {
        let addresses = self.readyz_addresses();
        let http = (!addresses.is_empty()).then(|| self.http());
        async move {
            let Some(http) = http else {
                return false;
            };
            for addr in addresses {
                if let Ok(r) = http.get(format!("http://{addr}/readyz")).send().await
                    && r.status().is_success()
                {
                    return true;
                }
            }
            false
        }
    }

    /// Wait up to `timeout` until `/readyz` answers 200 (caches listed,
    /// workers running), polling every 100 ms; fails early, with the log,
    /// when the process exits first.
    pub async fn wait_ready(&mut self, timeout: Duration) -> Result<(), NotReady> {
        let mut exited = None;
        let ready = crate::wait::until(READY_POLL, timeout, || {
            if exited.is_none() {
                exited = self.try_exit();
            }
            let gone = exited.is_some();
            let probe = self.probe();
            async move {
                if gone {
                    return Some(false);
                }
                probe.await.then_some(true)
            }
        })
        .await;
        match (ready, exited) {
            (Some(true), _) => Ok(()),
            (_, Some(status)) => Err(NotReady::Exited(format!(
                "{} exited ({status}) before it was ready:\n{}",
                self.label,
                self.log()
            ))),
            _ => Err(NotReady::Timeout(format!(
                "{} was not ready within {timeout:?}:\n{}",
                self.label,
                self.log()
            ))),
        }
    }

    /// Its peak resident set and CPU time so far, from `/proc`.
    pub fn usage(&self) -> Usage {
        self.pid()
            .map(|pid| usage_of(pid, &self.label))
            .unwrap_or_else(|| Usage {
                replica: self.label.clone(),
                ..Usage::default()
            })
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Stop `replicas` gracefully together: SIGCONT where paused and SIGTERM to
/// every one, then wait for each until `timeout` after that (each given at
/// least 100 ms), SIGKILL those still running. For each, in order, how long
/// its stop took, `None` when it had to be killed.
pub fn stop_all<'a>(
    replicas: impl IntoIterator<Item = &'a mut Replica>,
    timeout: Duration,
) -> Vec<Option<Duration>> {
    let mut replicas: Vec<&mut Replica> = replicas.into_iter().collect();
    let started = Instant::now();
    for r in &replicas {
        r.term();
    }
    replicas
        .iter_mut()
        .map(|r| r.finish(started, timeout, LEAST_STOP))
        .collect()
}

/// Resource use of one process.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Usage {
    /// Its name (a pod name, `dev-server`).
    pub replica: String,
    /// Peak resident set (`VmHWM`), MiB.
    pub peak_rss_mib: Option<f64>,
    /// Of the resident set when measured: anonymous memory (the heap,
    /// stacks), MiB (`RssAnon`).
    pub rss_anon_mib: Option<f64>,
    /// Of the resident set when measured: file pages mapped (mostly the
    /// binary's code, shared with every process running the same file),
    /// MiB (`RssFile`).
    pub rss_file_mib: Option<f64>,
    /// User + system CPU time, seconds.
    pub cpu_seconds: Option<f64>,
}

/// Peak RSS and CPU time of process `pid`, `name` for the report.
pub fn usage_of(pid: u32, name: &str) -> Usage {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    Usage {
        replica: name.to_owned(),
        peak_rss_mib: vm_hwm_kib(&status).map(|k| k as f64 / 1024.0),
        rss_anon_mib: status_kib(&status, "RssAnon:").map(|k| k as f64 / 1024.0),
        rss_file_mib: status_kib(&status, "RssFile:").map(|k| k as f64 / 1024.0),
        cpu_seconds: cpu_ticks(&stat).map(|t| t as f64 / clock_ticks()),
    }
}

/// Clock ticks per second (`getconf CLK_TCK`, 100 when unknown).
fn clock_ticks() -> f64 {
    static TICKS: OnceLock<f64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// `VmHWM` (peak resident set) of a `/proc/PID/status` text, in KiB.
fn vm_hwm_kib(status: &str) -> Option<u64> {
    status_kib(status, "VmHWM:")
}

/// The field `name` (with its colon) of a `/proc/PID/status` text, in KiB.
fn status_kib(status: &str, name: &str) -> Option<u64> {
    status.lines().find_map(|l| {
        let rest = l.strip_prefix(name)?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// `utime + stime` of a `/proc/PID/stat` text, in clock ticks. The command
/// name (field 2) may hold spaces and parentheses, so fields are counted
/// after the last `)`.
fn cpu_ticks(stat: &str) -> Option<u64> {
    let after = &stat[stat.rfind(')')? + 1..];
    // After the name: field 3 (state) is index 0, utime (14) is index 11,
    // stime (15) index 12.
    let f: Vec<&str> = after.split_whitespace().collect();
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_status_and_stat() {
        let status =
            "Name:\tkms-operator\nVmPeak:\t  900 kB\nVmHWM:\t   45312 kB\nVmRSS:\t 40000 kB\n";
        assert_eq!(vm_hwm_kib(status), Some(45312));
        assert_eq!(vm_hwm_kib("Name: x\n"), None);
        let status = "VmHWM:\t 75000 kB\nRssAnon:\t   53248 kB\nRssFile:\t   21504 kB\n";
        assert_eq!(status_kib(status, "RssAnon:"), Some(53248));
        assert_eq!(status_kib(status, "RssFile:"), Some(21504));
        assert_eq!(status_kib(status, "RssShmem:"), None);
        let stat =
            "4242 (kms op (x)) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 37 0 0 20 0 8 0 100 0 0";
        assert_eq!(cpu_ticks(stat), Some(287));
        assert_eq!(cpu_ticks("4242 (short) S 1"), None);
    }

    #[test]
    fn serving_lines_give_the_addresses() {
        let log = concat!(
            r#"{"level":"INFO","fields":{"message":"serving health","addr":"127.0.0.1:4001"}}"#,
            "\nnot json\n",
            r#"{"level":"INFO","fields":{"message":"serving metrics","addr":"127.0.0.1:4002"}}"#,
            "\n",
            r#"{"level":"INFO","fields":{"message":"started","addr":"x"}}"#,
        );
        assert_eq!(served_addresses(log), ["127.0.0.1:4001", "127.0.0.1:4002"]);
    }

    fn shell(script: &str) -> Launch {
        Launch::new("/bin/sh").args(["-c", script])
    }

    #[test]
    fn lines_reach_memory_the_callback_and_the_file() {
        let dir = std::env::temp_dir().join(format!("kms-testkit-replica-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("1.log");
        let lines = Lines::default();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let seen2 = seen.clone();
        let mut r = shell("echo out; echo err >&2")
            .name("r-0")
            .log_file(&log)
            .capture(&lines)
            .on_line(move |l| seen2.lock().unwrap().push(l.to_owned()))
            .spawn()
            .unwrap();
        assert!(
            r.wait_exit(Duration::from_secs(10))
                .is_some_and(|s| s.success())
        );
        assert_eq!(r.pid(), None);
        // Once it exited, the log waits for the last lines.
        let mut got = r.log().lines().map(str::to_owned).collect::<Vec<_>>();
        got.sort();
        assert_eq!(got, ["err", "out"]);
        assert_eq!(seen.lock().unwrap().len(), 2);
        let mut file: Vec<String> = std::fs::read_to_string(&log)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect();
        file.sort();
        assert_eq!(file, ["err", "out"]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_stop_is_graceful_or_ends_in_a_kill() {
        let mut quits = shell("sleep 30").spawn().unwrap();
        assert!(quits.stop(Duration::from_secs(10)).is_some());
        let mut stubborn = shell("trap '' TERM; while :; do sleep 0.05; done")
            .spawn()
            .unwrap();
        // Give the shell time to install its trap.
        std::thread::sleep(Duration::from_millis(200));
        stubborn.signal("STOP");
        assert!(stubborn.paused());
        assert_eq!(
            stop_all([&mut stubborn], Duration::from_millis(300)),
            [None]
        );
        assert!(!stubborn.paused());
        assert_eq!(stubborn.pid(), None);
    }

    #[tokio::test]
    async fn readiness_fails_early_when_the_process_exits() {
        let mut r = shell("echo boom; exit 3")
            .capture(&Lines::default())
            .spawn()
            .unwrap();
        let err = r.wait_ready(Duration::from_secs(30)).await.unwrap_err();
        assert!(matches!(err, NotReady::Exited(_)), "{err}");
        assert!(err.to_string().contains("boom"), "{err}");
    }
}
