//! The release's identity: the version lives in one place (the workspace
//! `Cargo.toml`) and everything that names it agrees — the chart's version
//! and appVersion, the image tag the chart defaults to, the changelog's
//! newest entry, the install guide's commands, the Dockerfile — and the
//! binary names its version and the commit it was built from.

use std::process::Command;

use crate::harness::repo;
use crate::support::binary;

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The value of `key: value` on a line of its own in YAML text.
fn yaml_value(text: &str, key: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .map(|v| v.trim().trim_matches('"').to_owned())
}

#[test]
fn the_version_lives_in_one_place() {
    let cargo = read("Cargo.toml");
    let version = cargo
        .split("[workspace.package]")
        .nth(1)
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("version = ")))
        .map(|v| v.trim_matches('"').to_owned())
        .expect("[workspace.package] version");
    assert_eq!(version, env!("CARGO_PKG_VERSION"));
    let chart = read("helm/secrets-operator/Chart.yaml");
    assert_eq!(
        yaml_value(&chart, "version"),
        Some(version.clone()),
        "Chart.yaml version"
    );
    assert_eq!(
        yaml_value(&chart, "appVersion"),
        Some(version.clone()),
        "Chart.yaml appVersion"
    );
    // The image tag defaults to the appVersion, in the chart's repository.
    let values = read("helm/secrets-operator/values.yaml");
    let image = values
        .split("    image:")
        .nth(1)
        .expect("the manager's image");
    assert_eq!(
        yaml_value(image, "      repository"),
        Some("ghcr.io/hanzoai/kms-operator".to_owned())
    );
    assert_eq!(yaml_value(image, "      tag"), Some(String::new()));
    let changelog = read("CHANGELOG.md");
    let newest = changelog
        .lines()
        .find(|l| l.starts_with("## "))
        .expect("a release in CHANGELOG.md");
    assert!(
        newest.starts_with(&format!("## {version} ")) || newest == format!("## {version}"),
        "the newest CHANGELOG.md entry is {newest:?}, not {version}"
    );
    let install = read("docs/install.md");
    let pinned: Vec<&str> = install
        .match_indices("--version ")
        .map(|(i, _)| install[i + 10..].split_whitespace().next().unwrap_or(""))
        .collect();
    assert!(!pinned.is_empty(), "docs/install.md installs no --version");
    assert!(
        pinned.iter().all(|v| *v == version),
        "docs/install.md installs {pinned:?}, not {version}"
    );
    assert!(
        read("Dockerfile").contains(&format!("ghcr.io/hanzoai/kms-operator:{version}")),
        "the Dockerfile's build line names another version"
    );
}

#[test]
fn the_binary_names_its_version_and_commit() {
    let out = Command::new(binary())
        .arg("--version")
        .output()
        .expect("--version");
    let shown = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(
        shown.starts_with(&format!(
            "kms-operator {} (commit ",
            env!("CARGO_PKG_VERSION")
        )),
        "{shown}"
    );
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(repo())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    if let Some(head) = head {
        assert_eq!(
            shown,
            format!("kms-operator {} (commit {head})", env!("CARGO_PKG_VERSION"))
        );
    }
}
