//! Every template function, called with huge arguments, under a real
//! memory limit: it returns an error or a value, and never aborts the
//! process ("memory allocation of N bytes failed") or gets it killed.
//!
//! The limit is a memory cgroup of its own (512 MiB) holding a child
//! process: the test re-runs its own binary, filtered to itself, with
//! [`CHILD`] set, and moves the child into the group (cgroup v2
//! `memory.max` when the unified hierarchy offers the memory controller,
//! else v1 `memory.limit_in_bytes`, nested under the test's own group).
//! `ulimit -v` would not do: every render reserves a 256 MiB stack. The
//! parent checks that the child exited 0: an abort (SIGABRT) or the
//! kernel's OOM kill (SIGKILL) fails the test with a message saying so.
//!
//! Creating a cgroup needs root: as root (CI) a missing memory controller
//! fails the test; otherwise it is skipped with a message.
//!
//! The calls: every Go/Sprig function of a Go template
//! ([`go_function_names`]) and every helper of the Jinja syntax
//! ([`helper_names`], `dict` included), with one to three arguments drawn
//! from huge numbers (1e11, 3e9, `i64::MAX`, -1, `i64::MIN`), a 1 MiB
//! string, a list holding 1 MiB strings shared a thousand times over, a
//! list of lists shared 2^40 times over, and small values; first a sweep
//! of every function with a fixed set of argument tuples (on two threads),
//! then random tuples (`FUZZ_CASES`, 64 by default).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use kms_template::{Engine, SecretData, SecretEntry, go_function_names, helper_names};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

/// Marks the child process (its value: the cgroup it must wait to be in).
const CHILD: &str = "KMS_TEMPLATE_MEMORY_CHILD";

/// This test's name, to run it alone in the child.
const TEST: &str = "every_function_survives_huge_arguments_under_a_memory_limit";

/// The child's memory limit.
const LIMIT_BYTES: u64 = 512 * 1024 * 1024;

#[test]
fn every_function_survives_huge_arguments_under_a_memory_limit() {
    if let Some(group) = std::env::var_os(CHILD) {
        wait_until_in(Path::new(&group));
        exercise();
        return;
    }
    if !is_root() {
        println!(
            "note: skipped: a memory cgroup needs root (this process is not); \
             CI runs this test as root"
        );
        return;
    }
    let group = Group::create(&format!("kms-template-memory-{}", std::process::id()))
        .unwrap_or_else(|e| panic!("running as root, but no memory cgroup is available: {e}"));
    let exe = std::env::current_exe().expect("the test binary");
    let mut child = Command::new(exe)
        .args([TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, &group.dir)
        .spawn()
        .expect("the child starts");
    group.add(child.id()).expect("the child joins the group");
    let status = child.wait().expect("the child ends");
    let peak = group.peak();
    let killed = group.oom_kills();
    drop(group);
    println!(
        "child peak memory: {}",
        peak.map_or("unknown".into(), |b| format!("{} MiB", b / (1024 * 1024)))
    );
    if let Some(signal) = std::os::unix::process::ExitStatusExt::signal(&status) {
        let why = match signal {
            6 => "it aborted (SIGABRT): an allocation failed",
            9 => "it was killed (SIGKILL): the kernel's OOM killer, over the memory limit",
            _ => "it was killed by a signal",
        };
        panic!(
            "the child under a {} MiB memory limit died by signal {signal}: {why} \
             (OOM kills in the group: {})",
            LIMIT_BYTES / (1024 * 1024),
            killed.map_or("unknown".into(), |n| n.to_string())
        );
    }
    assert!(status.success(), "the child failed: {status}");
}

/// Whether this process runs as root (effective uid 0), from
/// `/proc/self/status`.
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("Uid:"))?.to_owned();
            line.split_whitespace().nth(2).map(|uid| uid == "0")
        })
        .unwrap_or(false)
}

/// Waits until this process is in the cgroup `dir` (the parent moves it
/// there right after starting it).
fn wait_until_in(dir: &Path) {
    let started = Instant::now();
    loop {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        let me = std::process::id().to_string();
        if procs.lines().any(|p| p.trim() == me) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the child was never moved into {}",
            dir.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A memory cgroup holding one process, removed when dropped.
struct Group {
    dir: PathBuf,
    v2: bool,
}

impl Group {
    /// A new group `name` with a limit of [`LIMIT_BYTES`] and no swap.
    fn create(name: &str) -> Result<Group, String> {
        let unified = Path::new("/sys/fs/cgroup");
        let group = if controllers(unified).contains(&"memory".to_owned()) {
            Group {
                dir: unified.join(name),
                v2: true,
            }
        } else if Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists() {
            Group {
                dir: v1_parent().join(name),
                v2: false,
            }
        } else {
            return Err("no memory controller under /sys/fs/cgroup (v2 or v1)".into());
        };
        std::fs::create_dir_all(&group.dir)
            .map_err(|e| format!("creating {}: {e}", group.dir.display()))?;
        let limit = LIMIT_BYTES.to_string();
        let settings: &[(&str, &str)] = if group.v2 {
            &[("memory.max", &limit), ("memory.swap.max", "0")]
        } else {
            &[("memory.limit_in_bytes", &limit)]
        };
        for (file, value) in settings {
            let path = group.dir.join(file);
            // No swap file is fine (the machine may have no swap).
            if !path.exists() && file.contains("swap") {
                continue;
            }
            std::fs::write(&path, value)
                .map_err(|e| format!("writing {value} to {}: {e}", path.display()))?;
        }
        Ok(group)
    }

    fn add(&self, pid: u32) -> Result<(), String> {
        let procs = self.dir.join("cgroup.procs");
        std::fs::write(&procs, pid.to_string())
            .map_err(|e| format!("moving {pid} into {}: {e}", procs.display()))
    }

    /// The most memory the group used.
    fn peak(&self) -> Option<u64> {
        let file = if self.v2 {
            "memory.peak"
        } else {
            "memory.max_usage_in_bytes"
        };
        std::fs::read_to_string(self.dir.join(file))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// How many processes of the group the OOM killer killed.
    fn oom_kills(&self) -> Option<u64> {
        let file = if self.v2 {
            "memory.events"
        } else {
            "memory.oom_control"
        };
        let text = std::fs::read_to_string(self.dir.join(file)).ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|n| n.trim().parse().ok())
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// The controllers the unified hierarchy at `root` offers its children.
fn controllers(root: &Path) -> Vec<String> {
    std::fs::read_to_string(root.join("cgroup.subtree_control"))
        .map(|s| s.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// Where a v1 group goes: under this process's own memory group (so its
/// usage still counts there), or at the root.
fn v1_parent() -> PathBuf {
    let root = PathBuf::from("/sys/fs/cgroup/memory");
    let own = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                let mut parts = l.splitn(3, ':');
                let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
                controllers
                    .split(',')
                    .any(|c| c == "memory")
                    .then(|| path.trim_start_matches('/').to_owned())
            })
        });
    match own {
        Some(path) if !path.is_empty() && root.join(&path).is_dir() => root.join(path),
        _ => root,
    }
}

// ------------------------------------------------------------ the calls

/// Huge and small arguments of a Go call.
const GO_ARGS: &[&str] = &[
    "100000000000",
    "3000000000",
    "9223372036854775807",
    "-1",
    "-9223372036854775808",
    "$s",
    "$c",
    "$a",
    "$m",
    "\"x\"",
    "\"\"",
    "1",
    ".A.Value",
];

/// Defines `$s` (1 MiB), `$c` (eight 1 MiB strings, doubled ten times),
/// `$a` (a list doubled 40 times) and `$m` (a map holding both).
const GO_PRELUDE: &str = "{{- $s := repeat 1048576 \"x\" -}}\
{{- $c := list $s $s $s $s $s $s $s $s -}}{{- range until 10 }}{{ $c = list $c $c }}{{ end -}}\
{{- $a := list \"x\" -}}{{- range until 40 }}{{ $a = list $a $a }}{{ end -}}\
{{- $m := dict \"c\" $c \"a\" $a \"s\" $s -}}";

/// Huge and small arguments of a Jinja call.
const JINJA_ARGS: &[&str] = &[
    "100000000000",
    "3000000000",
    "9223372036854775807",
    "-1",
    "-9223372036854775807 - 1",
    "s",
    "ns.c",
    "ns.a",
    "ns.m",
    "'x'",
    "''",
    "1",
    "A.Value",
];

const JINJA_PRELUDE: &str = "{%- set s = 'x' * 1048576 -%}\
{%- set ns = namespace(c=[s, s, s, s, s, s, s, s], a=['x']) -%}\
{%- for i in range(10) %}{% set ns.c = [ns.c, ns.c] %}{% endfor -%}\
{%- for i in range(40) %}{% set ns.a = [ns.a, ns.a] %}{% endfor -%}\
{%- set ns.m = {'c': ns.c, 'a': ns.a, 's': s} -%}";

/// A Go call of `f` with `args`, as a command and piped.
fn go_calls(f: &str, args: &[&str]) -> Vec<String> {
    let mut calls = vec![format!("{GO_PRELUDE}{{{{ {f} {} }}}}", args.join(" "))];
    if let Some((last, rest)) = args.split_last() {
        calls.push(format!(
            "{GO_PRELUDE}{{{{ {last} | {f} {} }}}}",
            rest.join(" ")
        ));
    }
    calls
}

/// A Jinja call of `f` with `args`, as a function and as a filter.
fn jinja_calls(f: &str, args: &[&str]) -> Vec<String> {
    let mut calls = vec![format!("{JINJA_PRELUDE}{{{{ {f}({}) }}}}", args.join(", "))];
    if f != "dict"
        && let Some((last, rest)) = args.split_last()
    {
        calls.push(format!(
            "{JINJA_PRELUDE}{{{{ ({last}) | {f}({}) }}}}",
            rest.join(", ")
        ));
    }
    calls
}

/// The argument tuples of the sweep: each argument alone, each with the
/// huge string after it, each number before the huge string and the shared
/// list, and a few three-argument mixes.
fn sweep(pool: &[&'static str]) -> Vec<Vec<&'static str>> {
    let (s, c) = (pool[5], pool[6]);
    let mut tuples: Vec<Vec<&str>> = vec![vec![]];
    for &a in pool {
        tuples.push(vec![a]);
        tuples.push(vec![a, s]);
        tuples.push(vec![a, c]);
    }
    for &n in &pool[..5] {
        tuples.push(vec![n, n, s]);
        tuples.push(vec![n, s, s]);
        tuples.push(vec![s, n, c]);
    }
    tuples.push(vec![s, s, s]);
    tuples.push(vec![c, c, c]);
    tuples
}

fn secrets() -> SecretData {
    let mut data = SecretData::new();
    data.insert("A".into(), SecretEntry::new("x".repeat(1024), "/"));
    data
}

/// Renders `source`: any error or value is fine; an abort is not (it
/// kills the process, which the parent sees).
fn survive(engine: &Engine, data: &SecretData, source: &str) {
    let started = Instant::now();
    let _ = engine.render_bytes("template.data.x", source, data);
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(20),
        "a render took {took:?}: {source}"
    );
}

fn cases() -> u32 {
    std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

/// Every call of the sweep: each function with each argument tuple.
fn sweep_calls() -> Vec<String> {
    let mut calls = Vec::new();
    let go_tuples = sweep(GO_ARGS);
    for f in go_function_names() {
        for args in &go_tuples {
            calls.extend(go_calls(f, args));
        }
    }
    let jinja_tuples = sweep(JINJA_ARGS);
    for f in helper_names() {
        for args in &jinja_tuples {
            calls.extend(jinja_calls(f, args));
        }
    }
    calls
}

/// Threads the sweep runs on (the renders are independent).
const THREADS: usize = 2;

/// The body, in the child: the sweep, then random tuples.
fn exercise() {
    let engine = Engine::default();
    let data = secrets();
    let calls = sweep_calls();
    let started = Instant::now();
    std::thread::scope(|scope| {
        for part in calls.chunks(calls.len().div_ceil(THREADS)) {
            let (engine, data) = (&engine, &data);
            scope.spawn(move || {
                for source in part {
                    survive(engine, data, source);
                }
            });
        }
    });
    println!(
        "swept {} calls of {} Go functions and {} helpers in {:?}",
        calls.len(),
        go_function_names().len(),
        helper_names().len(),
        started.elapsed()
    );
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        ..Config::default()
    });
    let call = (
        prop::sample::select(go_function_names()),
        prop::collection::vec(prop::sample::select(GO_ARGS.to_vec()), 0..4),
        prop::sample::select(helper_names()),
        prop::collection::vec(prop::sample::select(JINJA_ARGS.to_vec()), 0..4),
    );
    runner
        .run(&call, |(g, g_args, j, j_args)| {
            for source in go_calls(g, &g_args) {
                survive(&engine, &data, &source);
            }
            for source in jinja_calls(j, &j_args) {
                survive(&engine, &data, &source);
            }
            Ok(())
        })
        .unwrap();
}
