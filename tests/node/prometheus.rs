//! A real Prometheus for the node scenarios: the server of the Debian
//! package `prometheus` (the one `testenv packages` installs with
//! `promtool`), run on the node's host, configured from the chart's own
//! ServiceMonitor and PrometheusRule as the cluster holds them, the way the
//! Prometheus Operator turns those objects into a scrape job and a rule
//! file. Nothing about the scrape (scheme, port, path, interval, TLS,
//! token) is written here a second time: it is read from the object.
//!
//! The translation covers what the chart's ServiceMonitor can hold and
//! refuses anything else, so a chart change cannot be scraped silently in
//! some other way:
//!
//! - targets: the EndpointSlices of the `namespaceSelector`'s namespaces,
//!   with the meta labels of Prometheus's Kubernetes discovery (role
//!   `endpointslice`); the relabelling keeps the Services whose labels
//!   match `selector.matchLabels` and the endpoint port named `port`.
//!   Debian builds Prometheus without its Kubernetes discovery, so
//!   [`Discovery`] lists the EndpointSlices itself (every second) and hands
//!   them to Prometheus as a `file_sd` file with those same meta labels;
//!   the relabelling that follows is the Prometheus Operator's;
//! - target labels as the Prometheus Operator sets them: `namespace`,
//!   `service`, `pod`, `container`, `endpoint`, and `job` = the Service's
//!   name (what the chart's alert rules and dashboard select on);
//! - `interval`, `scrapeTimeout`, `path`, `scheme`, and `tlsConfig`
//!   (`insecureSkipVerify`, `serverName`);
//! - `authorization` (type `Bearer`, `credentials` a key of a Secret in the
//!   ServiceMonitor's namespace): the Prometheus Operator reads the Secret
//!   and writes its value into the scrape job's `authorization.credentials`;
//!   so does this translation, from the Secret as the cluster holds it
//!   (waiting for the token controller to fill a ServiceAccount token);
//! - `bearerTokenFile` names a token file in Prometheus's own pod; here
//!   Prometheus runs outside a pod, so the file it reads is one the caller
//!   provides.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Client;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};

use crate::harness::wait_for;

/// One series of a query result: its labels and its values (an instant
/// query has one).
#[derive(Debug, Clone)]
pub struct Series {
    /// The series' labels.
    pub labels: BTreeMap<String, String>,
    /// `(unix seconds, value)` pairs.
    pub values: Vec<(f64, f64)>,
}

impl Series {
    /// The largest value (NaN ignored); `None` when there is none.
    pub fn max(&self) -> Option<f64> {
        self.values
            .iter()
            .map(|(_, v)| *v)
            .filter(|v| !v.is_nan())
            .reduce(f64::max)
    }

    /// The last value.
    pub fn last(&self) -> Option<f64> {
        self.values.last().map(|(_, v)| *v)
    }

    /// A label's value ("" when absent).
    pub fn label(&self, name: &str) -> &str {
        self.labels.get(name).map(String::as_str).unwrap_or("")
    }
}

/// A Prometheus server of the scenario, stopped on drop.
pub struct Prometheus {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    dir: PathBuf,
    http: reqwest::Client,
}

/// Where the server is; the Debian package installs it on PATH.
fn binary() -> PathBuf {
    let out = Command::new("sh")
        .args(["-c", "command -v prometheus"])
        .output()
        .expect("sh");
    let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(
        !path.is_empty(),
        "prometheus is missing: `tests/testenv/testenv packages` (as root) installs the Debian package"
    );
    PathBuf::from(path)
}

/// A free local port.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A duration of the Prometheus Operator's objects (`30s`, `1m`) in
/// seconds.
pub fn seconds(d: &str) -> f64 {
    let (n, unit) = d.split_at(d.find(|c: char| !c.is_ascii_digit()).unwrap_or(d.len()));
    let n: f64 = n.parse().unwrap_or_else(|_| panic!("duration {d:?}"));
    n * match unit {
        "ms" => 0.001,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        other => panic!("duration {d:?}: unit {other:?}"),
    }
}

/// The label name Prometheus's Kubernetes discovery derives from an
/// object label (anything but `[a-zA-Z0-9_]` becomes `_`).
fn meta_name(label: &str) -> String {
    label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// The value of `key` in the Secret `name` of `ns`, once it has one (a
/// ServiceAccount token Secret is filled in by the token controller).
async fn secret_value(client: &Client, ns: &str, name: &str, key: &str) -> String {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let value = wait_for(Duration::from_secs(60), || async {
        let s = secrets.get_opt(name).await.ok().flatten()?;
        let v = s.data?.get(key)?.0.clone();
        (!v.is_empty()).then(|| String::from_utf8(v).expect("a UTF-8 token"))
    })
    .await;
    value.unwrap_or_else(|| panic!("Secret {ns}/{name} has no {key:?} after 60 s"))
}

/// The scrape jobs of a ServiceMonitor (one per endpoint), reading their
/// targets from the `file_sd` file `targets`, with the credentials its
/// `authorization` names read from the cluster, or `token_file` for a
/// `bearerTokenFile` (see the module docs).
pub async fn scrape_jobs(
    client: &Client,
    monitor: &Value,
    targets: &Path,
    token_file: Option<&Path>,
) -> Vec<Value> {
    let ns = monitor["metadata"]["namespace"]
        .as_str()
        .expect("namespace");
    let name = monitor["metadata"]["name"].as_str().expect("name");
    let spec = &monitor["spec"];
    let known = ["selector", "namespaceSelector", "endpoints"];
    for key in spec.as_object().expect("spec").keys() {
        assert!(
            known.contains(&key.as_str()),
            "ServiceMonitor spec.{key} is not translated"
        );
    }
    let mut keep = Vec::new();
    for (k, v) in spec["selector"]["matchLabels"]
        .as_object()
        .expect("selector.matchLabels")
    {
        let m = meta_name(k);
        keep.push(json!({
            "action": "keep",
            "source_labels": [format!("__meta_kubernetes_service_label_{m}"), format!("__meta_kubernetes_service_labelpresent_{m}")],
            "regex": format!("({});true", v.as_str().expect("label value")),
        }));
    }
    assert!(
        spec["selector"].get("matchExpressions").is_none(),
        "selector.matchExpressions is not translated"
    );
    let endpoints = spec["endpoints"].as_array().expect("endpoints");
    let mut credentials = Vec::new();
    for ep in endpoints {
        let auth = &ep["authorization"];
        credentials.push(if auth.is_null() {
            None
        } else {
            for key in auth.as_object().expect("authorization").keys() {
                assert!(
                    ["type", "credentials"].contains(&key.as_str()),
                    "authorization.{key} is not translated"
                );
            }
            let kind = auth["type"].as_str().unwrap_or("Bearer");
            let secret = &auth["credentials"];
            let value = secret_value(
                client,
                ns,
                secret["name"]
                    .as_str()
                    .expect("authorization.credentials.name"),
                secret["key"]
                    .as_str()
                    .expect("authorization.credentials.key"),
            )
            .await;
            Some(json!({"type": kind, "credentials": value}))
        });
    }
    endpoints
        .iter()
        .zip(credentials)
        .enumerate()
        .map(|(i, (ep, credentials))| {
            let known = [
                "port",
                "scheme",
                "path",
                "interval",
                "scrapeTimeout",
                "bearerTokenFile",
                "authorization",
                "tlsConfig",
            ];
            for key in ep.as_object().expect("endpoint").keys() {
                assert!(known.contains(&key.as_str()), "endpoint {key} is not translated");
            }
            let port = ep["port"].as_str().expect("endpoints[].port (a port name)");
            let mut relabel = vec![json!({
                "source_labels": ["job"],
                "target_label": "__tmp_prometheus_job_name",
            })];
            relabel.extend(keep.iter().cloned());
            relabel.extend([
                json!({"action": "keep", "source_labels": ["__meta_kubernetes_endpointslice_port_name"], "regex": port}),
                json!({"source_labels": ["__meta_kubernetes_endpointslice_address_target_kind", "__meta_kubernetes_endpointslice_address_target_name"],
                       "separator": ";", "regex": "Pod;(.*)", "replacement": "${1}", "target_label": "pod"}),
                json!({"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"}),
                json!({"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"}),
                json!({"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"}),
                json!({"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"}),
                json!({"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job", "replacement": "${1}"}),
                json!({"target_label": "endpoint", "replacement": port}),
            ]);
            let mut job = json!({
                "job_name": format!("serviceMonitor/{ns}/{name}/{i}"),
                "honor_labels": false,
                "file_sd_configs": [{"files": [targets], "refresh_interval": "1s"}],
                "scheme": ep["scheme"].as_str().unwrap_or("http"),
                "metrics_path": ep["path"].as_str().unwrap_or("/metrics"),
                "relabel_configs": relabel,
            });
            if let Some(i) = ep["interval"].as_str() {
                job["scrape_interval"] = json!(i);
            }
            if let Some(t) = ep["scrapeTimeout"].as_str() {
                job["scrape_timeout"] = json!(t);
            }
            if ep["bearerTokenFile"].is_string() {
                let file = token_file.expect("a token file for the endpoint's bearerTokenFile");
                job["authorization"] = json!({"type": "Bearer", "credentials_file": file});
            }
            if let Some(c) = credentials {
                job["authorization"] = c;
            }
            if let Some(tls) = ep["tlsConfig"].as_object() {
                let mut out = serde_json::Map::new();
                for (k, v) in tls {
                    let key = match k.as_str() {
                        "insecureSkipVerify" => "insecure_skip_verify",
                        "serverName" => "server_name",
                        other => panic!("tlsConfig.{other} is not translated"),
                    };
                    out.insert(key.into(), v.clone());
                }
                job["tls_config"] = Value::Object(out);
            }
            job
        })
        .collect()
}

/// The targets of a ServiceMonitor's namespaces as Prometheus's Kubernetes
/// discovery (role `endpointslice`) would find them, written every second
/// to a `file_sd` file (see the module docs). Stopped on drop.
pub struct Discovery {
    task: tokio::task::JoinHandle<()>,
}

impl Discovery {
    /// Write `file` now and then every second, from the EndpointSlices,
    /// Services and Pods of the namespaces `monitor` selects.
    pub async fn start(client: Client, monitor: &Value, file: PathBuf) -> Discovery {
        let namespaces: Vec<String> =
            match monitor["spec"]["namespaceSelector"]["matchNames"].as_array() {
                Some(names) => names
                    .iter()
                    .filter_map(|n| n.as_str().map(str::to_owned))
                    .collect(),
                None => vec![
                    monitor["metadata"]["namespace"]
                        .as_str()
                        .expect("namespace")
                        .to_owned(),
                ],
            };
        write_targets(&client, &namespaces, &file).await;
        let task = tokio::spawn(async move {
            // Discovery's refresh period.
            let mut every = kms_testkit::wait::every(Duration::from_secs(1));
            every.tick().await;
            loop {
                every.tick().await;
                write_targets(&client, &namespaces, &file).await;
            }
        });
        Discovery { task }
    }
}

impl Drop for Discovery {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One discovery pass; the file is replaced atomically (a pass that fails
/// to list leaves the last file).
async fn write_targets(client: &Client, namespaces: &[String], file: &Path) {
    let mut groups = Vec::new();
    for ns in namespaces {
        let lp = ListParams::default();
        let (Ok(slices), Ok(services), Ok(pods)) = (
            Api::<EndpointSlice>::namespaced(client.clone(), ns)
                .list(&lp)
                .await,
            Api::<Service>::namespaced(client.clone(), ns)
                .list(&lp)
                .await,
            Api::<Pod>::namespaced(client.clone(), ns).list(&lp).await,
        ) else {
            return;
        };
        for slice in &slices.items {
            groups.extend(slice_groups(ns, slice, &services.items, &pods.items));
        }
    }
    let tmp = file.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(&groups).unwrap()).unwrap();
    std::fs::rename(&tmp, file).unwrap();
}

/// The target groups of one EndpointSlice: one per address and port, with
/// the meta labels of Kubernetes discovery.
fn slice_groups(ns: &str, slice: &EndpointSlice, services: &[Service], pods: &[Pod]) -> Vec<Value> {
    let labels = slice.metadata.labels.clone().unwrap_or_default();
    let Some(service) = labels.get("kubernetes.io/service-name").and_then(|name| {
        services
            .iter()
            .find(|s| s.metadata.name.as_ref() == Some(name))
    }) else {
        return Vec::new();
    };
    let mut common = BTreeMap::new();
    common.insert("__meta_kubernetes_namespace".to_owned(), ns.to_owned());
    common.insert(
        "__meta_kubernetes_endpointslice_name".to_owned(),
        slice.metadata.name.clone().unwrap_or_default(),
    );
    common.insert(
        "__meta_kubernetes_service_name".to_owned(),
        service.metadata.name.clone().unwrap_or_default(),
    );
    for (k, v) in service.metadata.labels.iter().flatten() {
        let m = meta_name(k);
        common.insert(format!("__meta_kubernetes_service_label_{m}"), v.clone());
        common.insert(
            format!("__meta_kubernetes_service_labelpresent_{m}"),
            "true".into(),
        );
    }
    let mut groups = Vec::new();
    for endpoint in slice.endpoints.iter().flatten() {
        let target = endpoint.target_ref.as_ref();
        let pod = target
            .filter(|t| t.kind.as_deref() == Some("Pod"))
            .and_then(|t| pods.iter().find(|p| p.metadata.name == t.name));
        let ready = endpoint
            .conditions
            .as_ref()
            .and_then(|c| c.ready)
            .unwrap_or(false);
        for port in slice.ports.iter().flatten() {
            let number = port.port.unwrap_or_default();
            let mut l = common.clone();
            l.insert(
                "__meta_kubernetes_endpointslice_port_name".into(),
                port.name.clone().unwrap_or_default(),
            );
            l.insert(
                "__meta_kubernetes_endpointslice_port".into(),
                number.to_string(),
            );
            l.insert(
                "__meta_kubernetes_endpointslice_endpoint_conditions_ready".into(),
                ready.to_string(),
            );
            if let Some(t) = target {
                l.insert(
                    "__meta_kubernetes_endpointslice_address_target_kind".into(),
                    t.kind.clone().unwrap_or_default(),
                );
                l.insert(
                    "__meta_kubernetes_endpointslice_address_target_name".into(),
                    t.name.clone().unwrap_or_default(),
                );
            }
            if let Some(p) = pod {
                l.insert(
                    "__meta_kubernetes_pod_name".into(),
                    p.metadata.name.clone().unwrap_or_default(),
                );
                let container = p.spec.iter().flat_map(|s| &s.containers).find(|c| {
                    c.ports
                        .iter()
                        .flatten()
                        .any(|cp| cp.container_port == number)
                });
                if let Some(c) = container {
                    l.insert(
                        "__meta_kubernetes_pod_container_name".into(),
                        c.name.clone(),
                    );
                }
            }
            let targets: Vec<String> = endpoint
                .addresses
                .iter()
                .map(|a| format!("{a}:{number}"))
                .collect();
            groups.push(json!({"targets": targets, "labels": l}));
        }
    }
    groups
}

/// The rule file of a PrometheusRule: its `spec` (`groups`), as the
/// Prometheus Operator writes it for Prometheus.
pub fn rule_file(rule: &Value) -> Value {
    let groups = rule["spec"]["groups"].clone();
    assert!(groups.is_array(), "PrometheusRule without spec.groups");
    json!({ "groups": groups })
}

impl Prometheus {
    /// Start a server with `jobs` and `rules`, evaluating rules every
    /// `evaluation` (a Prometheus duration), and wait until it is ready.
    pub async fn start(jobs: Vec<Value>, rules: &Value, evaluation: &str) -> Prometheus {
        let stamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let dir = std::env::temp_dir().join(format!("kms-node-prometheus-{stamp}"));
        std::fs::create_dir_all(dir.join("data")).unwrap();
        // JSON is YAML: the files are written as JSON.
        std::fs::write(
            dir.join("rules.yaml"),
            serde_json::to_vec_pretty(rules).unwrap(),
        )
        .unwrap();
        let config = json!({
            "global": {"scrape_interval": "30s", "evaluation_interval": evaluation},
            "rule_files": [dir.join("rules.yaml")],
            "scrape_configs": jobs,
        });
        std::fs::write(
            dir.join("prometheus.yaml"),
            serde_json::to_vec_pretty(&config).unwrap(),
        )
        .unwrap();
        let port = free_port();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new(binary())
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yaml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start prometheus");
        let prometheus = Prometheus {
            child,
            url: format!("http://127.0.0.1:{port}"),
            dir,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap(),
        };
        let ready = wait_for(Duration::from_secs(60), || async {
            let r = prometheus
                .http
                .get(format!("{}/-/ready", prometheus.url))
                .send()
                .await
                .ok()?;
            r.status().is_success().then_some(())
        })
        .await;
        assert!(
            ready.is_some(),
            "prometheus not ready:\n{}",
            prometheus.log()
        );
        prometheus
    }

    /// The server's log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }

    async fn api(&self, path: &str, query: &[(&str, String)]) -> Value {
        let resp = self
            .http
            .get(format!("{}/api/v1/{path}", self.url))
            .query(query)
            .send()
            .await
            .unwrap_or_else(|e| panic!("prometheus {path}: {e}"));
        let status = resp.status();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        assert!(
            status.is_success() && body["status"] == "success",
            "prometheus {path} {query:?}: {status} {body}"
        );
        body["data"].clone()
    }

    /// The active targets: `(labels, health, last error)`.
    pub async fn targets(&self) -> Vec<(BTreeMap<String, String>, String, String)> {
        let data = self.api("targets", &[("state", "active".into())]).await;
        data["activeTargets"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| {
                (
                    labels(&t["labels"]),
                    t["health"].as_str().unwrap_or("").to_owned(),
                    t["lastError"].as_str().unwrap_or("").to_owned(),
                )
            })
            .collect()
    }

    /// An instant query at the present.
    pub async fn query(&self, expr: &str) -> Vec<Series> {
        let data = self.api("query", &[("query", expr.to_owned())]).await;
        series(&data)
    }

    /// A range query from `start` to `end` (unix seconds), every `step` s.
    pub async fn query_range(&self, expr: &str, start: f64, end: f64, step: f64) -> Vec<Series> {
        let data = self
            .api(
                "query_range",
                &[
                    ("query", expr.to_owned()),
                    ("start", format!("{start:.3}")),
                    ("end", format!("{end:.3}")),
                    ("step", format!("{step}")),
                ],
            )
            .await;
        series(&data)
    }

    /// The values of `label` on the series of `selector` (what Grafana's
    /// `label_values(selector, label)` returns).
    pub async fn label_values(&self, selector: &str, label: &str) -> Vec<String> {
        let data = self
            .api(
                &format!("label/{label}/values"),
                &[("match[]", selector.to_owned())],
            )
            .await;
        data.as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect()
    }

    /// The alerts (pending or firing): `(name, state, labels)`.
    pub async fn alerts(&self) -> Vec<(String, String, BTreeMap<String, String>)> {
        let data = self.api("alerts", &[]).await;
        data["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| {
                let labels = labels(&a["labels"]);
                (
                    labels.get("alertname").cloned().unwrap_or_default(),
                    a["state"].as_str().unwrap_or("").to_owned(),
                    labels,
                )
            })
            .collect()
    }

    /// The state of alert `name` ("firing", "pending" or "inactive").
    pub async fn alert_state(&self, name: &str) -> String {
        let states: Vec<String> = self
            .alerts()
            .await
            .into_iter()
            .filter(|(n, _, _)| n == name)
            .map(|(_, s, _)| s)
            .collect();
        if states.iter().any(|s| s == "firing") {
            "firing".into()
        } else if states.iter().any(|s| s == "pending") {
            "pending".into()
        } else {
            "inactive".into()
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn labels(v: &Value) -> BTreeMap<String, String> {
    v.as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_owned()))
        .collect()
}

fn number(v: &Value) -> (f64, f64) {
    let t = v[0].as_f64().unwrap_or(0.0);
    let x = v[1]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or(f64::NAN);
    (t, x)
}

fn series(data: &Value) -> Vec<Series> {
    data["result"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| Series {
            labels: labels(&r["metric"]),
            values: match r.get("values").and_then(Value::as_array) {
                Some(vs) => vs.iter().map(number).collect(),
                None => vec![number(&r["value"])],
            },
        })
        .collect()
}

/// Grafana's `$__rate_interval` for a query of `step` seconds on series
/// scraped every `scrape` seconds: the larger of step + scrape and four
/// scrapes (Grafana's definition), in whole seconds.
pub fn rate_interval(step: f64, scrape: f64) -> String {
    format!("{}s", (step + scrape).max(4.0 * scrape).ceil() as u64)
}

/// The dashboard variables of an expression replaced by the written rule:
/// `$namespace`, `$job` and `$shard` by the values in `vars` (a multi-value
/// variable by its regex), `$__rate_interval` by [`rate_interval`].
pub fn substitute(expr: &str, vars: &BTreeMap<String, String>, rate: &str) -> String {
    let mut out = expr.replace("$__rate_interval", rate);
    // Longest names first, so `$shard` does not eat a `$shards`.
    let mut names: Vec<&String> = vars.keys().collect();
    names.sort_by_key(|n| std::cmp::Reverse(n.len()));
    for name in names {
        out = out
            .replace(&format!("${{{name}}}"), &vars[name])
            .replace(&format!("${name}"), &vars[name]);
    }
    assert!(!out.contains('$'), "a dashboard variable is left in {out}");
    out
}

/// The labels a legend format uses (`{{pod}} {{shard}}` → pod, shard).
pub fn legend_labels(format: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = format;
    while let Some(i) = rest.find("{{") {
        let after = &rest[i + 2..];
        let Some(j) = after.find("}}") else { break };
        out.push(after[..j].trim().to_owned());
        rest = &after[j + 2..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legend_and_substitution_rules() {
        assert_eq!(
            legend_labels("shard {{shard}} {{ direction }}"),
            ["shard", "direction"]
        );
        assert!(legend_labels("memory").is_empty());
        assert_eq!(rate_interval(2.0, 2.0), "8s");
        assert_eq!(rate_interval(30.0, 2.0), "32s");
        let vars = BTreeMap::from([
            ("namespace".to_owned(), "ns".to_owned()),
            ("shard".to_owned(), ".*".to_owned()),
        ]);
        assert_eq!(
            substitute(
                "x{namespace=\"$namespace\", shard=~\"$shard\"}[$__rate_interval]",
                &vars,
                "8s"
            ),
            "x{namespace=\"ns\", shard=~\".*\"}[8s]"
        );
        assert_eq!(seconds("2s"), 2.0);
        assert_eq!(seconds("5m"), 300.0);
        assert_eq!(
            meta_name("app.kubernetes.io/name"),
            "app_kubernetes_io_name"
        );
    }
}
