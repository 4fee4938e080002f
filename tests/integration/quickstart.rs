//! docs/quickstart.md, run as a new user would: every `sh` block of the
//! page, in order, in one shell that stops at the first failing command.
//! `scripts/local.sh` starts a control plane, the dev KMS and one replica
//! of its own, in a scratch directory and on free ports (its environment
//! variables), so a developer's own `scripts/local.sh` is left alone. The
//! page cannot drift: its commands are read from it, not copied here.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Command;

use crate::harness;
use crate::support::{TempDir, binary};

/// The `sh` blocks of a Markdown page, in order.
fn shell_blocks(page: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in page.lines() {
        match (&mut current, line.trim_end()) {
            (None, "```sh") => current = Some(String::new()),
            (Some(block), "```") => {
                blocks.push(std::mem::take(block));
                current = None;
            }
            (Some(block), _) => {
                block.push_str(line);
                block.push('\n');
            }
            (None, _) => {}
        }
    }
    blocks
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Stops what `scripts/local.sh` started, however the test ends.
struct LocalSetup {
    state: TempDir,
}

impl LocalSetup {
    fn command(&self, script: &str) -> Command {
        let mut cmd = Command::new("bash");
        cmd.args(["-c", script])
            .current_dir(harness::repo())
            .env("KMS_LOCAL_STATE", &self.state.0)
            .env("KMS_LOCAL_BIN", binary())
            .env("REPLICAS", "1")
            .env_remove("KUBECONFIG");
        cmd
    }
}

impl Drop for LocalSetup {
    fn drop(&mut self) {
        let _ = self.command("scripts/local.sh down").output();
    }
}

#[test]
fn the_quick_start_page_runs() {
    let page = std::fs::read_to_string(harness::repo().join("docs/quickstart.md")).unwrap();
    let blocks = shell_blocks(&page);
    assert!(
        blocks.len() >= 6 && blocks[0].starts_with("scripts/local.sh\n"),
        "the page's first command starts the local setup: {blocks:#?}"
    );
    let setup = LocalSetup {
        state: TempDir::new("quickstart"),
    };
    let (kms, health, metrics) = (free_port(), free_port(), free_port());
    let script = format!("set -euo pipefail\n{}", blocks.join("\n"));
    let out = setup
        .command(&script)
        .env("KMS_LOCAL_KMS_ADDR", format!("127.0.0.1:{kms}"))
        .env("KMS_LOCAL_HEALTH_PORT", health.to_string())
        .env("KMS_LOCAL_METRICS_PORT", metrics.to_string())
        .output()
        .expect("bash");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let logs: PathBuf = setup.state.0.join("operator-0.log");
    assert!(
        out.status.success(),
        "the quick start stopped:\n--- stdout\n{stdout}\n--- stderr\n{stderr}\n--- operator log\n{}",
        std::fs::read_to_string(&logs).unwrap_or_default()
    );
    // What the page says the user sees.
    let has_line = |words: &[&str]| {
        stdout.lines().any(|l| {
            l.split_whitespace()
                .take(words.len())
                .eq(words.iter().copied())
        })
    };
    assert!(has_line(&["app", "True", "Synced"]), "get kmss:\n{stdout}");
    assert!(
        stdout.lines().any(|l| l == "s3cret"),
        "the Secret's value:\n{stdout}"
    );
    assert!(
        has_line(&["broken", "False", "AuthenticationFailed"]),
        "the broken resource:\n{stdout}"
    );
    assert!(
        stdout.contains("Warning  AuthenticationFailed"),
        "describe shows the Warning Event:\n{stdout}"
    );
    assert!(
        has_line(&["KmsSecret", "broken", "False", "AuthenticationFailed"]),
        "kubectl kms status:\n{stdout}"
    );
    assert!(
        stdout.contains("kmssecret.secrets.hanzo.ai/broken condition met"),
        "the fixed resource recovered:\n{stdout}"
    );
}

#[test]
fn shell_blocks_are_read_in_order_and_whole() {
    let page = "text\n```sh\na\nb \\\n  c\n```\n```text\nout\n```\n```sh\nd\n```\n";
    assert_eq!(shell_blocks(page), vec!["a\nb \\\n  c\n", "d\n"]);
}
