//! Persistence: changes made through the API survive a restart with the
//! same seed, ids are stable, and acknowledged writes survive `kill -9` of
//! the server process.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::json;

use crate::common::{Client, demo_seed, start};

const LIST: &str = "/api/v3/secrets/raw?workspaceSlug=demo&environment=dev";

fn value_of(list: &serde_json::Value, key: &str) -> Option<(String, u64)> {
    list["secrets"]
        .as_array()?
        .iter()
        .find(|s| s["secretKey"] == key)
        .map(|s| {
            (
                s["secretValue"].as_str().unwrap_or_default().to_owned(),
                s["version"].as_u64().unwrap_or_default(),
            )
        })
}

#[tokio::test]
async fn api_changes_survive_a_restart_with_the_same_seed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = start(demo_seed(), Some(dir.path())).await;
    let ids = first.seeded().to_vec();
    let c = Client::new(first.addr());
    let token = c.login("op-client", "op-secret").await;
    let t = Some(token.as_str());
    let patch = json!({"projectSlug": "demo", "environment": "dev", "secretValue": "changed"});
    assert_eq!(
        c.json("PATCH", "/api/v3/secrets/raw/DB_PASSWORD", t, &patch)
            .await
            .status,
        200
    );
    assert_eq!(
        c.json(
            "POST",
            "/api/v3/secrets/raw/ADDED",
            t,
            &json!({"projectSlug": "demo", "environment": "dev", "secretValue": "new"})
        )
        .await
        .status,
        200
    );
    assert_eq!(
        c.json(
            "DELETE",
            "/api/v3/secrets/raw/LOG_LEVEL",
            t,
            &json!({"projectSlug": "demo", "environment": "dev"})
        )
        .await
        .status,
        200
    );
    let lease = c
        .json("POST", "/api/v1/dynamic-secrets/leases", t, &json!({"dynamicSecretName": "db-creds", "projectSlug": "demo", "environmentSlug": "dev"}))
        .await
        .json();
    let lease_id = lease["lease"]["id"].as_str().expect("lease").to_owned();
    first.shutdown().await;

    let second = start(demo_seed(), Some(dir.path())).await;
    assert_eq!(second.seeded(), ids.as_slice(), "same ids on every run");
    let c = Client::new(second.addr());
    let list = c.get(LIST, t).await;
    assert_eq!(list.status, 200, "a token survives the restart");
    let list = list.json();
    assert_eq!(value_of(&list, "DB_PASSWORD"), Some(("changed".into(), 2)));
    assert_eq!(value_of(&list, "ADDED"), Some(("new".into(), 1)));
    assert_eq!(
        value_of(&list, "LOG_LEVEL"),
        None,
        "a deleted seeded secret stays deleted"
    );
    let leases = c.admin("GET", "/admin/leases", None).await.json();
    assert_eq!(leases[0]["id"], lease_id.as_str());
    second.shutdown().await;
}

#[tokio::test]
async fn without_a_data_dir_nothing_is_kept() {
    let first = start(demo_seed(), None).await;
    let c = Client::new(first.addr());
    let token = c.login("op-client", "op-secret").await;
    let patch = json!({"projectSlug": "demo", "environment": "dev", "secretValue": "changed"});
    assert_eq!(
        c.json(
            "PATCH",
            "/api/v3/secrets/raw/DB_PASSWORD",
            Some(&token),
            &patch
        )
        .await
        .status,
        200
    );
    first.shutdown().await;
    let second = start(demo_seed(), None).await;
    let c = Client::new(second.addr());
    let token = c.login("op-client", "op-secret").await;
    assert_eq!(
        value_of(&c.get(LIST, Some(&token)).await.json(), "DB_PASSWORD"),
        Some(("s3cret".into(), 1))
    );
    second.shutdown().await;
}

/// A server process, killed when dropped (also when a test fails).
struct Server(Child);

impl Server {
    /// SIGKILL, and wait until the process is gone.
    fn kill_9(&mut self) {
        self.0.kill().expect("kill -9");
        self.0.wait().expect("reaped");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Start the standalone server binary; its address from the line it
/// prints, and the lines that follow.
fn spawn_server(dir: &Path) -> (Server, SocketAddr, mpsc::Receiver<String>) {
    let seed = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/examples/dev-seed.yaml");
    let mut child = Command::new(env!("CARGO_BIN_EXE_kms-devserver"))
        .arg("--addr")
        .arg("127.0.0.1:0")
        .arg("--data-dir")
        .arg(dir)
        .arg("--seed")
        .arg(seed)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the dev server");
    let stdout = child.stdout.take().expect("stdout");
    let child = Server(child);
    let mut lines = BufReader::new(stdout).lines();
    let addr = loop {
        let line = lines
            .next()
            .expect("the server printed its address")
            .expect("line");
        if let Some(url) = line.strip_prefix("dev-server listening on http://") {
            break url.parse().expect("address");
        }
    };
    // Keep reading so the server never blocks on a full pipe.
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    (child, addr, rx)
}

#[tokio::test]
async fn acknowledged_writes_survive_kill_9() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut child, addr, _) = spawn_server(dir.path());
    let c = Client::new(addr);
    let token = c.login("op-client", "op-secret").await;
    let t = Some(token.as_str());
    for i in 0..20 {
        let patch =
            json!({"projectSlug": "demo", "environment": "dev", "secretValue": format!("v{i}")});
        assert_eq!(
            c.json("PATCH", "/api/v3/secrets/raw/DB_PASSWORD", t, &patch)
                .await
                .status,
            200
        );
    }
    let created = c
        .json("POST", "/api/v3/secrets/raw/LAST", t, &json!({"projectSlug": "demo", "environment": "dev", "secretValue": "written just before the kill"}))
        .await;
    assert_eq!(created.status, 200);
    // SIGKILL right after the last acknowledgement: no shutdown, no flush.
    child.kill_9();

    let (_child, addr, _) = spawn_server(dir.path());
    let c = Client::new(addr);
    let list = c.get(LIST, t).await;
    assert_eq!(
        list.status, 200,
        "the token written before the kill is still valid"
    );
    let list = list.json();
    assert_eq!(value_of(&list, "DB_PASSWORD"), Some(("v19".into(), 21)));
    assert_eq!(
        value_of(&list, "LAST"),
        Some(("written just before the kill".into(), 1))
    );
}

#[cfg(unix)]
#[tokio::test]
async fn sigterm_stops_the_server_gracefully_and_ids_are_printed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut server, addr, lines) = spawn_server(dir.path());
    let printed: Vec<String> = (0..5)
        .map(|_| lines.recv_timeout(Duration::from_secs(10)).expect("a line"))
        .collect();
    assert!(printed[0].starts_with("project demo id="), "{printed:?}");
    assert!(
        printed
            .iter()
            .any(|l| l.starts_with("identity operator id=") && l.ends_with("clientId=op-client")),
        "{printed:?}"
    );
    let c = Client::new(addr);
    assert_eq!(c.get("/api/status", None).await.status, 200);
    let status = Command::new("kill")
        .arg("-TERM")
        .arg(server.0.id().to_string())
        .status()
        .expect("kill -TERM");
    assert!(status.success());
    let exit = server.0.wait().expect("wait");
    assert!(exit.success(), "{exit:?}");
}
