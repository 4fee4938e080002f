//! The report: JSON for machines (and the committed results), text for
//! people. Times inside are seconds from the start of the run.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::checkers::Outcome;
use crate::faults::FaultRecord;
use crate::history::Ms;
use crate::replicas::LogCounts;

/// The machine the run used.
#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    /// Logical CPUs.
    pub cpus: usize,
    /// Memory, GiB.
    pub memory_gib: f64,
    /// OS and architecture.
    pub os: String,
}

impl Machine {
    /// This machine.
    pub fn detect() -> Self {
        let mem_kib: f64 = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find(|l| l.starts_with("MemTotal:"))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|v| v.parse().ok())
            })
            .unwrap_or(0.0);
        Self {
            cpus: std::thread::available_parallelism().map_or(0, |n| n.get()),
            memory_gib: (mem_kib / 1024.0 / 1024.0 * 10.0).round() / 10.0,
            os: format!("{}-{}", std::env::consts::OS, std::env::consts::ARCH),
        }
    }
}

/// A fault in the report.
#[derive(Clone, Debug, Serialize)]
pub struct FaultLine {
    /// Seconds from the start of the run.
    pub at_s: f64,
    /// Seconds it lasted.
    pub lasted_s: f64,
    /// Track and position.
    pub step: String,
    /// The fault.
    pub kind: String,
    /// Its target.
    pub target: Option<String>,
    /// What happened.
    pub detail: String,
    /// Why it was skipped.
    pub skipped: Option<String>,
}

/// A checker in the report.
#[derive(Clone, Debug, Serialize)]
pub struct CheckerLine {
    /// Name.
    pub name: String,
    /// Passed?
    pub passed: bool,
    /// Rule and tolerances.
    pub rule: String,
    /// Violations with their time (seconds from the start).
    pub violations: Vec<serde_json::Value>,
    /// Figures.
    pub stats: serde_json::Map<String, serde_json::Value>,
}

/// Convergence times.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Convergence {
    /// From resources created to every object in step, seconds.
    pub initial_s: Option<f64>,
    /// From the faults stopping (and a last change to every object) to
    /// every object in step, seconds.
    pub after_faults_s: Option<f64>,
    /// The bound, seconds.
    pub bound_s: f64,
}

/// The whole report.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Every invariant held.
    pub passed: bool,
    /// The seed.
    pub seed: u64,
    /// The profile.
    pub profile: String,
    /// How to replay this run.
    pub replay: String,
    /// The machine.
    pub machine: Machine,
    /// Start, RFC 3339.
    pub started_at: String,
    /// Wall-clock length of the run, seconds.
    pub duration_s: f64,
    /// Length of the fault phase, seconds.
    pub chaos_s: f64,
    /// The settings.
    pub settings: serde_json::Value,
    /// Faults planned.
    pub faults_planned: usize,
    /// Faults injected.
    pub faults_injected: usize,
    /// Injected faults by kind.
    pub faults_by_kind: BTreeMap<String, usize>,
    /// Checker results.
    pub checkers: Vec<CheckerLine>,
    /// Convergence.
    pub convergence: Convergence,
    /// SIGTERM → exit of the replicas, seconds: median and maximum.
    pub graceful_stop_s: Option<(f64, f64)>,
    /// Replicas that exited without being told to.
    pub unexpected_exits: Vec<String>,
    /// What the replicas logged.
    pub operator_logs: LogCounts,
    /// KMS requests by route and status (dev server counters, runner's own
    /// reads included).
    pub kms_requests: serde_json::Value,
    /// Notes on the run.
    pub notes: Vec<String>,
    /// Every fault.
    pub faults: Vec<FaultLine>,
}

fn secs(ms: Ms) -> f64 {
    (ms as f64 / 100.0).round() / 10.0
}

/// Turn records into report lines, times relative to `t0`.
pub fn fault_lines(records: &[FaultRecord], t0: Ms) -> Vec<FaultLine> {
    let mut v: Vec<FaultLine> = records
        .iter()
        .map(|r| FaultLine {
            at_s: secs(r.from - t0),
            lasted_s: secs(r.to - r.from),
            step: format!(
                "{}#{}",
                serde_json::to_value(r.track)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default(),
                r.index
            ),
            kind: r.kind.to_string(),
            target: r.target.clone(),
            detail: r.detail.clone(),
            skipped: r.skipped.clone(),
        })
        .collect();
    v.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    v
}

/// Turn outcomes into report lines, times relative to `t0`.
pub fn checker_lines(outcomes: &[Outcome], t0: Ms) -> Vec<CheckerLine> {
    outcomes
        .iter()
        .map(|o| CheckerLine {
            name: o.name.to_owned(),
            passed: o.passed(),
            rule: o.rule.clone(),
            violations: o
                .violations
                .iter()
                .map(|v| {
                    serde_json::json!({
                        "at_s": v.at.map(|a| secs(a - t0)),
                        "message": v.message,
                    })
                })
                .collect(),
            stats: o.stats.clone(),
        })
        .collect()
}

impl Report {
    /// The text form.
    pub fn text(&self) -> String {
        let mut s = String::new();
        let verdict = if self.passed { "PASSED" } else { "FAILED" };
        s.push_str(&format!(
            "kms-chaos {verdict}: profile {}, seed {}, {} faults in {:.0} s (run {:.0} s) on {} CPUs / {} GiB\n",
            self.profile,
            self.seed,
            self.faults_injected,
            self.chaos_s,
            self.duration_s,
            self.machine.cpus,
            self.machine.memory_gib
        ));
        s.push_str(&format!("replay: {}\n\nfaults by kind:\n", self.replay));
        for (k, n) in &self.faults_by_kind {
            s.push_str(&format!("  {k:<18} {n}\n"));
        }
        s.push_str("\ncheckers:\n");
        for c in &self.checkers {
            s.push_str(&format!(
                "  {:<10} {}  {}\n",
                c.name,
                if c.passed { "ok  " } else { "FAIL" },
                serde_json::Value::Object(c.stats.clone())
            ));
            for v in c.violations.iter().take(20) {
                s.push_str(&format!(
                    "      at {}s: {}\n",
                    v["at_s"],
                    v["message"].as_str().unwrap_or_default()
                ));
            }
            if c.violations.len() > 20 {
                s.push_str(&format!("      … {} more\n", c.violations.len() - 20));
            }
        }
        let f = |x: Option<f64>| x.map_or("never".to_owned(), |v| format!("{v:.1} s"));
        s.push_str(&format!(
            "\nconvergence: initial {}, after the faults {} (bound {:.0} s)\n",
            f(self.convergence.initial_s),
            f(self.convergence.after_faults_s),
            self.convergence.bound_s
        ));
        if let Some((p50, max)) = self.graceful_stop_s {
            s.push_str(&format!(
                "graceful stop: median {p50:.1} s, max {max:.1} s\n"
            ));
        }
        if !self.unexpected_exits.is_empty() {
            s.push_str(&format!("unexpected exits: {:?}\n", self.unexpected_exits));
        }
        if !self.operator_logs.panics.is_empty() {
            s.push_str(&format!("panics: {:?}\n", self.operator_logs.panics));
        }
        for n in &self.notes {
            s.push_str(&format!("note: {n}\n"));
        }
        s
    }
}
