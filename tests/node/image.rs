//! The release's image (`scripts/release.sh`, the one the node pulls)
//! against the image users build (the `Dockerfile`): the same entrypoint,
//! default arguments, user and exposed ports, the binary where the
//! entrypoint says (naming its version and commit, without the dev KMS), a
//! CA bundle and the non-root user; and the chart's container ports among
//! the exposed ones. `helm template` only: no cluster is touched.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::harness::{ok, release_dir, release_version, repo};

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

/// A blob of an OCI image layout.
fn blob(layout: &Path, digest: &str) -> Vec<u8> {
    let path = layout
        .join("blobs/sha256")
        .join(digest.trim_start_matches("sha256:"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn s0_the_release_image_declares_what_the_dockerfile_declares() {
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

    // The release's image, as scripts/release.sh wrote it: an OCI layout
    // whose index holds one manifest, tagged with the version.
    let version = release_version();
    let layout = release_dir(&version).join("image");
    let index: Value = serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap())
        .expect("index.json");
    assert_eq!(index["manifests"].as_array().map(Vec::len), Some(1));
    assert_eq!(
        index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"],
        version.as_str()
    );
    let manifest: Value = serde_json::from_slice(&blob(
        &layout,
        index["manifests"][0]["digest"].as_str().unwrap(),
    ))
    .unwrap();
    let config: Value = serde_json::from_slice(&blob(
        &layout,
        manifest["config"]["digest"].as_str().unwrap(),
    ))
    .unwrap();
    assert_eq!(
        config["config"]["Labels"]["org.opencontainers.image.version"],
        version.as_str()
    );
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

    // The filesystem: the binary where the entrypoint points (the release
    // build: the version and commit, no dev KMS), the CA bundle, the user.
    let root = std::env::temp_dir().join(format!("kms-node-image-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let layer = layout.join("blobs/sha256").join(
        manifest["layers"][0]["digest"]
            .as_str()
            .unwrap()
            .trim_start_matches("sha256:"),
    );
    let unpacked = Command::new("tar")
        .arg("-xzf")
        .arg(&layer)
        .arg("-C")
        .arg(&root)
        .status()
        .expect("tar");
    assert!(unpacked.success(), "the layer does not unpack");
    let binary = root.join(declared.binary.trim_start_matches('/'));
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&binary)
            .unwrap_or_else(|e| panic!("no {} in the image: {e}", declared.binary))
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o755, "{}", declared.binary);
    assert!(
        root.join("etc/ssl/certs/ca-certificates.crt").exists(),
        "no CA bundle"
    );
    let uid = declared.user.split(':').next().unwrap();
    let passwd = std::fs::read_to_string(root.join("etc/passwd")).unwrap_or_default();
    assert!(
        passwd.lines().any(|l| l.split(':').nth(2) == Some(uid)),
        "user {uid} is not in the image's /etc/passwd"
    );
    let shown = Command::new(&binary)
        .arg("--version")
        .output()
        .expect("--version");
    let shown = String::from_utf8_lossy(&shown.stdout).into_owned();
    let commit = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(repo())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    assert!(
        shown.contains(&version.split('-').next().unwrap().to_owned()),
        "{shown}"
    );
    if let Some(commit) = commit {
        assert!(shown.contains(&format!("(commit {commit})")), "{shown}");
    }
    let dev = Command::new(&binary)
        .args(["dev-server", "--help"])
        .output()
        .unwrap();
    assert!(
        !dev.status.success()
            && String::from_utf8_lossy(&dev.stderr).contains("unrecognized subcommand"),
        "the image's binary has a dev-server command"
    );
    let _ = std::fs::remove_dir_all(&root);

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
