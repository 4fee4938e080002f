//! The image the node runs (`scripts/image.sh`) against the image users
//! build (the `Dockerfile`): the same entrypoint, default arguments, user
//! and exposed ports, the binary where the entrypoint says, a CA bundle and
//! the non-root user; and the chart's container ports among the exposed
//! ones. `helm template` only: no cluster is touched.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::harness::{ok, repo};

/// What the final stage of the Dockerfile declares.
#[derive(Debug, Default)]
struct Declared {
    entrypoint: Vec<String>,
    cmd: Vec<String>,
    user: String,
    exposed: BTreeSet<String>,
    binary: String,
}

/// Reads the instructions after the last `FROM` (the image users get).
fn dockerfile() -> Declared {
    let text = std::fs::read_to_string(repo().join("Dockerfile")).expect("Dockerfile");
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let last_from = lines
        .iter()
        .rposition(|l| l.starts_with("FROM "))
        .expect("a FROM line");
    let mut d = Declared::default();
    for line in &lines[last_from + 1..] {
        let Some((instruction, rest)) = line.split_once(' ') else {
            continue;
        };
        let exec_form = || -> Vec<String> {
            serde_json::from_str(rest.trim())
                .unwrap_or_else(|e| panic!("{instruction} is not in exec form: {e}"))
        };
        match instruction {
            "ENTRYPOINT" => d.entrypoint = exec_form(),
            "CMD" => d.cmd = exec_form(),
            "USER" => d.user = rest.trim().to_string(),
            "EXPOSE" => {
                d.exposed = rest
                    .split_whitespace()
                    .map(|p| {
                        if p.contains('/') {
                            p.to_string()
                        } else {
                            format!("{p}/tcp")
                        }
                    })
                    .collect()
            }
            "COPY" => d.binary = rest.split_whitespace().last().unwrap_or("").to_string(),
            _ => {}
        }
    }
    d
}

/// One member of a tarball.
fn member(tarball: &Path, name: &str) -> Vec<u8> {
    let out = Command::new("tar")
        .arg("-xOf")
        .arg(tarball)
        .arg(name)
        .output()
        .expect("tar");
    assert!(
        out.status.success(),
        "{name} is not in {}: {}",
        tarball.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

#[test]
fn s0_the_node_image_declares_what_the_dockerfile_declares() {
    let declared = dockerfile();
    assert!(
        !declared.entrypoint.is_empty() && !declared.user.is_empty(),
        "the Dockerfile's final stage has no ENTRYPOINT or USER: {declared:?}"
    );
    assert_eq!(
        declared.entrypoint.first(),
        Some(&declared.binary),
        "the entrypoint is not the binary the Dockerfile copies"
    );

    // The variables `cargo test` sets for a test (CARGO_PKG_*, the library
    // path, …) would make the script's `cargo build --release` rebuild the
    // binary the node phase built a moment ago, and again after: the script
    // gets the caller's environment without them.
    let out = Command::new(repo().join("scripts/image.sh"))
        .args(["--tag", "check"])
        .env_clear()
        .envs(std::env::vars().filter(|(k, _)| {
            (!k.starts_with("CARGO_") || matches!(k.as_str(), "CARGO_HOME" | "CARGO_TARGET_DIR"))
                && !matches!(
                    k.as_str(),
                    "CARGO" | "LD_LIBRARY_PATH" | "OUT_DIR" | "RUSTC" | "RUSTDOC"
                )
        }))
        .output()
        .expect("scripts/image.sh");
    assert!(
        out.status.success(),
        "scripts/image.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tarball = std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());

    let manifest: Value = serde_json::from_slice(&member(&tarball, "manifest.json")).unwrap();
    let manifest = &manifest[0];
    assert_eq!(manifest["RepoTags"][0], "localhost/kms-operator:check");
    let config: Value =
        serde_json::from_slice(&member(&tarball, manifest["Config"].as_str().unwrap())).unwrap();
    let config = &config["config"];
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(
        strings(&config["Entrypoint"]),
        declared.entrypoint,
        "entrypoint"
    );
    assert_eq!(strings(&config["Cmd"]), declared.cmd, "default arguments");
    assert_eq!(
        config["User"].as_str(),
        Some(declared.user.as_str()),
        "user"
    );
    let exposed: BTreeSet<String> = config["ExposedPorts"]
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    assert_eq!(exposed, declared.exposed, "exposed ports");

    // The filesystem: the binary where the entrypoint points, the CA
    // bundle, the user in /etc/passwd.
    let layer = member(&tarball, manifest["Layers"][0].as_str().unwrap());
    let layer_path = tarball.with_extension("layer.tar");
    std::fs::write(&layer_path, &layer).unwrap();
    let listing = Command::new("tar")
        .arg("-tvf")
        .arg(&layer_path)
        .output()
        .expect("tar");
    let listing = String::from_utf8_lossy(&listing.stdout).into_owned();
    let entry = |path: &str| {
        listing
            .lines()
            .find(|l| l.ends_with(&format!(" {}", path.trim_start_matches('/'))))
            .map(str::to_string)
    };
    let binary =
        entry(&declared.binary).unwrap_or_else(|| panic!("no {} in the image", declared.binary));
    assert!(binary.starts_with("-rwxr-xr-x"), "{binary}");
    assert!(
        entry("/etc/ssl/certs/ca-certificates.crt").is_some(),
        "no CA bundle"
    );
    let passwd = Command::new("tar")
        .arg("-xOf")
        .arg(&layer_path)
        .arg("etc/passwd")
        .output()
        .expect("tar");
    let uid = declared.user.split(':').next().unwrap();
    assert!(
        String::from_utf8_lossy(&passwd.stdout)
            .lines()
            .any(|l| l.split(':').nth(2) == Some(uid)),
        "user {uid} is not in the image's /etc/passwd"
    );
    let _ = std::fs::remove_file(&layer_path);
    let _ = std::fs::remove_file(&tarball);

    // The chart's container ports are ports the image exposes.
    let rendered = ok(
        "helm",
        &[
            "template",
            "kms",
            repo().join("helm/secrets-operator").to_str().unwrap(),
        ],
    );
    let ports: BTreeSet<String> = rendered
        .lines()
        .filter_map(|l| l.trim().strip_prefix("containerPort:"))
        .map(|p| format!("{}/tcp", p.trim()))
        .collect();
    assert!(!ports.is_empty(), "the chart declares no container port");
    for l in rendered
        .lines()
        .filter(|l| l.trim().starts_with("runAsUser:"))
    {
        assert_eq!(
            l.trim().trim_start_matches("runAsUser:").trim(),
            uid,
            "the chart runs as another user than the image"
        );
    }
    assert!(
        ports.is_subset(&declared.exposed),
        "the chart's container ports {ports:?} are not all exposed by the image {:?}",
        declared.exposed
    );
}
