//! A CPU limit on one replica process, as a pod's `resources.limits.cpu`
//! sets one: a CPU cgroup of its own with a quota of `cores` × the period,
//! cgroup v2 (`cpu.max`) when the unified hierarchy has the CPU controller,
//! else v1 (`cpu.cfs_quota_us`). The group is removed when dropped (once the
//! process has exited; a group that still holds one is left).

use std::path::{Path, PathBuf};

use anyhow::Context;

/// The period of the quota, microseconds (the kernel's and the kubelet's
/// default).
const PERIOD_US: u64 = 100_000;

/// A CPU cgroup holding one process.
#[derive(Debug)]
pub struct Group {
    dir: PathBuf,
}

impl Group {
    /// Create group `name` with a quota of `cores` and move `pid` into it.
    pub fn limit(name: &str, pid: u32, cores: f64) -> anyhow::Result<Self> {
        anyhow::ensure!(
            cores > 0.0 && cores.is_finite(),
            "the CPU limit must be a positive number of cores, not {cores}"
        );
        let quota = quota_us(cores);
        let unified = Path::new("/sys/fs/cgroup");
        let v1 = Path::new("/sys/fs/cgroup/cpu");
        let (dir, settings): (PathBuf, Vec<(&str, String)>) = if has_cpu_controller(unified) {
            (
                unified.join(name),
                vec![("cpu.max", format!("{quota} {PERIOD_US}"))],
            )
        } else if v1.join("cpu.cfs_quota_us").exists() {
            (
                v1.join(name),
                vec![
                    ("cpu.cfs_period_us", PERIOD_US.to_string()),
                    ("cpu.cfs_quota_us", quota.to_string()),
                ],
            )
        } else {
            anyhow::bail!("no CPU cgroup controller under /sys/fs/cgroup");
        };
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let group = Self { dir };
        for (file, value) in settings {
            let path = group.dir.join(file);
            std::fs::write(&path, &value)
                .with_context(|| format!("writing {value} to {}", path.display()))?;
        }
        let procs = group.dir.join("cgroup.procs");
        std::fs::write(&procs, pid.to_string())
            .with_context(|| format!("moving {pid} into {}", procs.display()))?;
        Ok(group)
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// The quota of `cores` per period, at least the kernel's minimum (1 ms).
fn quota_us(cores: f64) -> u64 {
    ((cores * PERIOD_US as f64).round() as u64).max(1_000)
}

/// Whether the unified hierarchy at `root` offers the CPU controller to its
/// children.
fn has_cpu_controller(root: &Path) -> bool {
    std::fs::read_to_string(root.join("cgroup.subtree_control"))
        .map(|s| s.split_whitespace().any(|c| c == "cpu"))
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
    fn a_limit_of_no_cores_is_refused() {
        let e = Group::limit("kms-bench-test", 1, 0.0).unwrap_err();
        assert!(e.to_string().contains("positive"), "{e}");
    }
}
