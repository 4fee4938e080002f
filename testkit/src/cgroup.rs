//! Resource limits on one process, as a pod's `resources.limits` set them:
//! a cgroup of its own with a CPU quota (`cores` × the period) or a memory
//! limit. cgroup v2 (`cpu.max`, `memory.max`) when the unified hierarchy
//! offers the controller, else v1 (`cpu.cfs_quota_us`,
//! `memory.limit_in_bytes`). Needs root. The group is removed when dropped
//! (once the process has exited; a group that still holds one is left).

use std::path::{Path, PathBuf};

use anyhow::Context;

/// The period of a CPU quota, microseconds (the kernel's and the kubelet's
/// default).
const PERIOD_US: u64 = 100_000;

/// A cgroup holding one process.
#[derive(Debug)]
pub struct Group {
    dir: PathBuf,
}

/// The cgroup controller a limit needs.
#[derive(Clone, Copy)]
enum Controller {
    Cpu,
    Memory,
}

impl Controller {
    fn name(self) -> &'static str {
        match self {
            Controller::Cpu => "cpu",
            Controller::Memory => "memory",
        }
    }
}

impl Group {
    /// Create group `name` with a CPU quota of `cores` and move `pid` into
    /// it.
    pub fn cpu(name: &str, pid: u32, cores: f64) -> anyhow::Result<Self> {
        anyhow::ensure!(
            cores > 0.0 && cores.is_finite(),
            "the CPU limit must be a positive number of cores, not {cores}"
        );
        let quota = quota_us(cores);
        Self::create(
            name,
            pid,
            Controller::Cpu,
            vec![("cpu.max", format!("{quota} {PERIOD_US}"))],
            vec![
                ("cpu.cfs_period_us", PERIOD_US.to_string()),
                ("cpu.cfs_quota_us", quota.to_string()),
            ],
        )
    }

    /// Create group `name` with a memory limit of `bytes` (no swap) and
    /// move `pid` into it. Past the limit the kernel kills the process, as
    /// the kubelet's OOM kill does.
    pub fn memory(name: &str, pid: u32, bytes: u64) -> anyhow::Result<Self> {
        anyhow::ensure!(bytes >= 1 << 20, "a memory limit below 1 MiB: {bytes}");
        Self::create(
            name,
            pid,
            Controller::Memory,
            vec![
                ("memory.max", bytes.to_string()),
                ("memory.swap.max", "0".to_owned()),
            ],
            vec![("memory.limit_in_bytes", bytes.to_string())],
        )
    }

    fn create(
        name: &str,
        pid: u32,
        controller: Controller,
        v2: Vec<(&str, String)>,
        v1: Vec<(&str, String)>,
    ) -> anyhow::Result<Self> {
        let unified = Path::new("/sys/fs/cgroup");
        let legacy = unified.join(controller.name());
        let (dir, settings) = if offers(unified, controller) {
            (unified.join(name), v2)
        } else if legacy.join("cgroup.procs").exists() {
            (legacy.join(name), v1)
        } else {
            anyhow::bail!(
                "no {} cgroup controller under /sys/fs/cgroup",
                controller.name()
            );
        };
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let group = Self { dir };
        for (file, value) in settings {
            let path = group.dir.join(file);
            // memory.swap.max is absent without swap accounting.
            if file == "memory.swap.max" && !path.exists() {
                continue;
            }
            std::fs::write(&path, &value)
                .with_context(|| format!("writing {value} to {}", path.display()))?;
        }
        let procs = group.dir.join("cgroup.procs");
        std::fs::write(&procs, pid.to_string())
            .with_context(|| format!("moving {pid} into {}", procs.display()))?;
        Ok(group)
    }

    /// Times the kernel killed a process of the group for its memory limit
    /// (v2 `memory.events` `oom_kill`, v1 `memory.oom_control`
    /// `oom_kill`); 0 when unknown.
    pub fn oom_kills(&self) -> u64 {
        ["memory.events", "memory.oom_control"]
            .iter()
            .filter_map(|f| std::fs::read_to_string(self.dir.join(f)).ok())
            .flat_map(|text| {
                text.lines()
                    .filter_map(|l| l.strip_prefix("oom_kill "))
                    .filter_map(|n| n.trim().parse::<u64>().ok())
                    .collect::<Vec<_>>()
            })
            .sum()
    }

    /// The most memory the group used, bytes (v2 `memory.peak`, v1
    /// `memory.max_usage_in_bytes`); 0 when unknown.
    pub fn peak_memory(&self) -> u64 {
        ["memory.peak", "memory.max_usage_in_bytes"]
            .iter()
            .filter_map(|f| std::fs::read_to_string(self.dir.join(f)).ok())
            .find_map(|t| t.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Whether cgroups can be made here: root, and a cgroup file system.
pub fn available() -> bool {
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .map(|u| u.split_whitespace().next() == Some("0"))
        })
        .unwrap_or(false);
    root && Path::new("/sys/fs/cgroup").exists()
}

/// The quota of `cores` per period, at least the kernel's minimum (1 ms).
fn quota_us(cores: f64) -> u64 {
    ((cores * PERIOD_US as f64).round() as u64).max(1_000)
}

/// Whether the unified hierarchy at `root` offers `controller` to its
/// children.
fn offers(root: &Path, controller: Controller) -> bool {
    std::fs::read_to_string(root.join("cgroup.subtree_control"))
        .map(|s| s.split_whitespace().any(|c| c == controller.name()))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quota_is_cores_times_the_period() {
        assert_eq!(quota_us(0.5), 50_000);
        assert_eq!(quota_us(2.0), 200_000);
        assert_eq!(quota_us(0.001), 1_000);
    }

    #[test]
    fn limits_that_make_no_sense_are_refused() {
        let e = Group::cpu("kms-testkit-test", 1, 0.0).unwrap_err();
        assert!(e.to_string().contains("positive"), "{e}");
        let e = Group::memory("kms-testkit-test", 1, 1024).unwrap_err();
        assert!(e.to_string().contains("below 1 MiB"), "{e}");
    }
}
