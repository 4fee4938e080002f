//! The node of a testenv (`tests/testenv/testenv up DIR --node`) seen from
//! the machine it runs on: container processes are processes of this
//! machine, so an operator pod's process can be signalled directly, and the
//! kubelet's files (pod volumes, container logs) are plain paths.

use std::path::{Path, PathBuf};

/// The machine's process of the operator container of pod `namespace/name`
/// (found by the pod identity the chart gives it in its environment).
pub fn operator_process(namespace: &str, name: &str) -> Option<u32> {
    let want_name = format!("KMS_OPERATOR_POD_NAME={name}");
    let want_ns = format!("KMS_OPERATOR_POD_NAMESPACE={namespace}");
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if !cmdline.starts_with(b"/usr/local/bin/kms-operator\0run") {
            continue;
        }
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let vars: Vec<&[u8]> = environ.split(|b| *b == 0).collect();
        if vars.contains(&want_name.as_bytes()) && vars.contains(&want_ns.as_bytes()) {
            return Some(pid);
        }
    }
    None
}

/// Where the kubelet of the testenv in `dir` keeps the emptyDir volume
/// `volume` of the pod with `uid`.
pub fn empty_dir(dir: &Path, uid: &str, volume: &str) -> PathBuf {
    dir.join("node/kubelet/pods")
        .join(uid)
        .join("volumes/kubernetes.io~empty-dir")
        .join(volume)
}

/// The kubelet's container log directory (its default `podLogsDir`):
/// `<namespace>_<pod>_<uid>/<container>/<restarts>.log`.
pub const POD_LOGS: &str = "/var/log/pods";

/// One line of a container log file (the CRI format: time, stream, `F` for
/// a full line or `P` for a part of one, then the text).
pub fn cri_line(line: &str) -> Option<(bool, &str)> {
    let mut parts = line.splitn(4, ' ');
    let _time = parts.next()?;
    let _stream = parts.next()?;
    let partial = match parts.next()? {
        "P" => true,
        "F" => false,
        _ => return None,
    };
    Some((partial, parts.next().unwrap_or("")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cri_lines_split_into_flag_and_text() {
        assert_eq!(
            cri_line("2026-12-03T16:00:00.1Z stdout F {\"a\": 1}"),
            Some((false, "{\"a\": 1}"))
        );
        assert_eq!(
            cri_line("2026-12-03T16:00:00.1Z stderr P abc def"),
            Some((true, "abc def"))
        );
        assert_eq!(
            cri_line("2026-12-03T16:00:00.1Z stdout F "),
            Some((false, ""))
        );
        assert_eq!(cri_line("garbage"), None);
    }
}
