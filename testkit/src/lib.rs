//! What the benchmark (`bench/`) and the chaos runner (`chaos/`) both need to
//! drive kms-operator from the outside: the dev KMS as a child process with
//! its admin API ([`devserver`]), the local control plane of `tests/testenv`
//! and clients for it ([`testenv`]), and signals to processes
//! ([`signal`]).

pub mod devserver;
pub mod testenv;

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
