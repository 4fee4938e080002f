//! Records the commit the binary is built from, for `kms-operator
//! --version`: `KMS_OPERATOR_COMMIT` when set (a build from a source
//! tarball), else the checkout's `HEAD`, else `unknown`.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=KMS_OPERATOR_COMMIT");
    let commit = std::env::var("KMS_OPERATOR_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(git_head)
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=KMS_OPERATOR_COMMIT={}", commit.trim());
}

/// The abbreviated commit of `HEAD` (12 characters), with the files whose
/// change means another commit (so that only a new commit rebuilds).
fn git_head() -> Option<String> {
    let out = Command::new("git")
        .args(["rev-parse", "--absolute-git-dir"])
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let dir = String::from_utf8(out.stdout).ok()?;
    let dir = Path::new(dir.trim());
    let mut watched = vec![dir.join("HEAD"), dir.join("packed-refs")];
    if let Ok(head) = std::fs::read_to_string(dir.join("HEAD"))
        && let Some(reference) = head.trim().strip_prefix("ref: ")
    {
        watched.push(dir.join(reference));
    }
    for file in watched.iter().filter(|f| f.exists()) {
        println!("cargo:rerun-if-changed={}", file.display());
    }
    let out = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    Some(String::from_utf8(out.stdout).ok()?.trim().to_owned())
}
