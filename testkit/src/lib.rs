//! What the benchmark (`bench/`), the chaos runner (`chaos/`), the
//! integration tests (`tests/integration`) and the node suite (`tests/node`)
//! need to drive kms-operator from the outside: operator replicas as child
//! processes ([`replica`]), the dev KMS as a child process with its admin
//! API ([`devserver`]) and calls to its public API as a client makes them
//! ([`api`]), the local control plane of `tests/testenv` and clients for it
//! ([`testenv`]), its node seen from this machine ([`node`]), signals to
//! processes ([`signal`]), CPU and memory limits on a process ([`cgroup`]), stand-ins for the Prometheus Operator's CRDs
//! ([`monitoring`]), waits on conditions ([`wait`]), and the files below a
//! directory ([`files_below`], to inspect a cache on disk).

pub mod api;
pub mod cgroup;
pub mod devserver;
pub mod monitoring;
pub mod node;
pub mod replica;
pub mod testenv;
pub mod wait;

use std::process::{Command, Stdio};

/// Send `SIG<sig>` (`TERM`, `KILL`, `STOP`, `CONT`) to `pid`; a process that
/// is already gone is not an error.
pub fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stderr(Stdio::null())
        .status();
}

/// Every file below `dir`, depth first (an unreadable directory counts as
/// empty).
pub fn files_below(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(files_below(&path));
        } else {
            out.push(path);
        }
    }
    out
}
