//! The Helm chart `helm/secrets-operator` on a real API server: `helm lint`; a
//! matrix of values rendered, checked object by object and accepted by the
//! API server (server-side dry-run); the chart's settings accepted by the
//! operator binary; a real install, upgrade and uninstall; the chart's CRDs
//! against `crds/`; the values schema; and the namespace-scoped RBAC exercised
//! by an operator process that runs with the chart's ServiceAccount token.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use base64::Engine as _;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, Role};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Client, Config};
use serde_json::{Value, json};

use crate::harness::{self, TestNamespace, holds_for, wait_for};
use crate::support::{CLIENT_ID, CLIENT_SECRET, DevServer, TempDir, binary, exited, seed};
use kms_testkit::replica::{Launch, Replica};

// ---------------------------------------------------------------------------
// Tools: helm and kubectl from the test environment's cache.

fn testenv_path(name: &str) -> PathBuf {
    let out = Command::new(harness::repo().join("tests/testenv/testenv"))
        .args(["path", name])
        .output()
        .unwrap_or_else(|e| panic!("tests/testenv/testenv path {name}: {e}"));
    assert!(
        out.status.success(),
        "tests/testenv/testenv path {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

fn helm_binary() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| testenv_path("helm"))
}

pub(crate) fn kubectl_binary() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| testenv_path("kubectl"))
}

fn chart() -> PathBuf {
    harness::repo().join("helm/secrets-operator")
}

/// The result of a command.
struct Run {
    ok: bool,
    stdout: String,
    stderr: String,
}

fn run(mut cmd: Command) -> Run {
    let out = cmd.output().expect("run command");
    Run {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Run helm against the test cluster, with its state kept under `target/`.
fn helm(args: &[&str]) -> Run {
    let home = harness::repo().join("target/helm-home");
    let mut cmd = Command::new(helm_binary());
    cmd.args(args)
        .env("KUBECONFIG", harness::kubeconfig())
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"));
    run(cmd)
}

fn helm_ok(args: &[&str]) -> String {
    let out = helm(args);
    assert!(
        out.ok,
        "helm {} failed:\n{}\n{}",
        args.join(" "),
        out.stderr,
        out.stdout
    );
    out.stdout
}

/// A values file in a scratch directory.
struct ValuesFile {
    dir: TempDir,
}

impl ValuesFile {
    fn new(values: &Value) -> Self {
        let dir = TempDir::new("helm-values");
        std::fs::write(dir.0.join("values.json"), values.to_string()).expect("values file");
        Self { dir }
    }

    fn path(&self) -> String {
        self.dir.0.join("values.json").display().to_string()
    }
}

// ---------------------------------------------------------------------------
// Rendered manifests.

/// A rendered (or installed) manifest: the text and its objects.
struct Rendered {
    text: String,
    docs: Vec<Value>,
}

impl Rendered {
    fn parse(text: String) -> Self {
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
            .unwrap_or_else(|e| panic!("rendered YAML does not parse: {e}\n{text}"));
        let docs = docs.into_iter().filter(|d| !d.is_null()).collect();
        Self { text, docs }
    }

    fn all(&self, kind: &str) -> Vec<&Value> {
        self.docs.iter().filter(|d| d["kind"] == kind).collect()
    }

    fn find(&self, kind: &str, name: &str) -> Option<&Value> {
        self.docs
            .iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
    }

    fn get(&self, kind: &str, name: &str) -> &Value {
        self.find(kind, name).unwrap_or_else(|| {
            panic!(
                "no {kind} {name}; rendered: {:?}",
                self.docs.iter().map(describe).collect::<Vec<_>>()
            )
        })
    }

    fn statefulset(&self) -> &Value {
        let all = self.all("StatefulSet");
        assert_eq!(all.len(), 1, "expected one StatefulSet");
        all[0]
    }

    fn pod_spec(&self) -> &Value {
        &self.statefulset()["spec"]["template"]["spec"]
    }

    /// The operator's container: the first, named `manager` (sidecars
    /// come after it).
    fn container(&self) -> &Value {
        let containers = self.pod_spec()["containers"]
            .as_array()
            .expect("containers");
        assert_eq!(containers[0]["name"], "manager");
        &containers[0]
    }

    /// The manager's environment: name → entry.
    fn env(&self) -> BTreeMap<String, Value> {
        self.container()["env"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| (e["name"].as_str().unwrap_or_default().to_owned(), e.clone()))
            .collect()
    }

    fn env_value(&self, name: &str) -> Option<String> {
        self.env()
            .get(name)
            .and_then(|e| e["value"].as_str().map(str::to_owned))
    }

    fn replicas(&self) -> u64 {
        self.statefulset()["spec"]["replicas"]
            .as_u64()
            .expect("replicas")
    }
}

fn describe(d: &Value) -> String {
    format!(
        "{} {}/{}",
        d["kind"].as_str().unwrap_or("?"),
        d["metadata"]["namespace"].as_str().unwrap_or("-"),
        d["metadata"]["name"].as_str().unwrap_or("?")
    )
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_owned))
        .collect()
}

fn render(release: &str, namespace: &str, values: &Value) -> Rendered {
    let file = ValuesFile::new(values);
    let chart = chart().display().to_string();
    let text = helm_ok(&[
        "template",
        release,
        &chart,
        "--namespace",
        namespace,
        "-f",
        &file.path(),
    ]);
    Rendered::parse(text)
}

// ---------------------------------------------------------------------------
// What the operator needs from the API (the controllers and `docs/install.md`).

/// (API group, resource, verbs) in every watched namespace.
/// An API group, a resource, and verbs on it.
type Need = (&'static str, &'static str, &'static [&'static str]);

const MANAGER_NEEDS: &[Need] = &[
    (
        "secrets.hanzo.ai",
        "kmssecrets",
        &["get", "list", "watch", "patch"],
    ),
    (
        "secrets.hanzo.ai",
        "kmspushsecrets",
        &["get", "list", "watch", "patch"],
    ),
    (
        "secrets.hanzo.ai",
        "kmsdynamicsecrets",
        &["get", "list", "watch", "patch"],
    ),
    ("secrets.hanzo.ai", "kmssecrets/status", &["patch"]),
    ("secrets.hanzo.ai", "kmspushsecrets/status", &["patch"]),
    ("secrets.hanzo.ai", "kmsdynamicsecrets/status", &["patch"]),
    ("secrets.hanzo.ai", "kmssecrets/finalizers", &["update"]),
    ("secrets.hanzo.ai", "kmspushsecrets/finalizers", &["update"]),
    (
        "secrets.hanzo.ai",
        "kmsdynamicsecrets/finalizers",
        &["update"],
    ),
    (
        "",
        "secrets",
        &[
            "get", "list", "watch", "create", "patch", "update", "delete",
        ],
    ),
    (
        "",
        "configmaps",
        &[
            "get", "list", "watch", "create", "patch", "update", "delete",
        ],
    ),
    ("", "serviceaccounts", &["get"]),
    ("", "serviceaccounts/token", &["create"]),
    ("apps", "deployments", &["get", "list", "watch", "patch"]),
    ("apps", "statefulsets", &["get", "list", "watch", "patch"]),
    ("apps", "daemonsets", &["get", "list", "watch", "patch"]),
    ("events.k8s.io", "events", &["create", "patch"]),
    ("", "events", &["create", "patch"]),
];

/// Cluster-wide in every mode.
const CLUSTER_NEEDS: &[Need] = &[
    (
        "secrets.hanzo.ai",
        "clustergenerators",
        &["get", "list", "watch"],
    ),
    ("authentication.k8s.io", "tokenreviews", &["create"]),
    ("authorization.k8s.io", "subjectaccessreviews", &["create"]),
];

/// In the release namespace only.
const COORDINATION_NEEDS: &[Need] = &[(
    "coordination.k8s.io",
    "leases",
    &["get", "list", "watch", "create", "update", "delete"],
)];

fn allows(rules: &Value, group: &str, resource: &str, verb: &str) -> bool {
    rules.as_array().into_iter().flatten().any(|r| {
        strings(&r["apiGroups"]).iter().any(|g| g == group)
            && strings(&r["resources"]).iter().any(|x| x == resource)
            && strings(&r["verbs"]).iter().any(|v| v == verb)
            && r.get("resourceNames").is_none()
    })
}

fn assert_grants(what: &str, rules: &Value, needs: &[Need]) {
    for (group, resource, verbs) in needs {
        for verb in *verbs {
            assert!(
                allows(rules, group, resource, verb),
                "{what} does not grant {verb} on {group}/{resource}: {rules}"
            );
        }
    }
}

// ---------------------------------------------------------------------------
// The matrix.

struct Ctx {
    release: &'static str,
    namespace: String,
    fullname: String,
}

impl Ctx {
    fn name(&self, suffix: &str) -> String {
        format!("{}-{suffix}", self.fullname)
    }
}

/// What every rendering must satisfy. `watched` is the namespace list the
/// operator must run with (empty: cluster-wide).
fn invariants(ctx: &Ctx, r: &Rendered, watched: &[String]) {
    let sts = r.statefulset();
    let manager = ctx.name("controller-manager");
    assert_eq!(sts["metadata"]["name"], manager.as_str());
    assert_eq!(sts["spec"]["podManagementPolicy"], "Parallel");

    // Labels (the CRDs are exactly those of crds/) and namespaces.
    for d in &r.docs {
        let labels = &d["metadata"]["labels"];
        if d["kind"] == "CustomResourceDefinition" {
            assert!(labels.is_null(), "{}", describe(d));
            continue;
        }
        assert_eq!(
            labels["app.kubernetes.io/instance"],
            ctx.release,
            "{}",
            describe(d)
        );
        assert_eq!(
            labels["app.kubernetes.io/name"],
            "secrets-operator",
            "{}",
            describe(d)
        );
        let cluster_scoped = matches!(
            d["kind"].as_str(),
            Some("ClusterRole" | "ClusterRoleBinding" | "CustomResourceDefinition")
        );
        assert_eq!(
            d["metadata"]["namespace"].is_string(),
            !cluster_scoped,
            "namespace of {}",
            describe(d)
        );
    }

    // The pods: selector, identity from the downward API, the chart's settings.
    let selector = &sts["spec"]["selector"]["matchLabels"];
    let pod_labels = &sts["spec"]["template"]["metadata"]["labels"];
    for (k, v) in selector.as_object().expect("selector") {
        assert_eq!(&pod_labels[k], v, "pod label {k}");
    }
    let env = r.env();
    assert_eq!(
        env["KMS_OPERATOR_POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.name"
    );
    assert_eq!(
        env["KMS_OPERATOR_POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.namespace"
    );
    assert_eq!(
        r.env_value("KMS_OPERATOR_LEASE_PREFIX").as_deref(),
        Some(ctx.fullname.as_str())
    );
    assert_eq!(
        r.env_value("KMS_OPERATOR_METRICS_TLS").as_deref(),
        Some("true")
    );
    assert_eq!(
        r.env_value("KMS_OPERATOR_METRICS_ADDR").as_deref(),
        Some(":8443")
    );
    assert_eq!(
        r.env_value("KMS_OPERATOR_HEALTH_ADDR").as_deref(),
        Some(":8081")
    );
    assert_eq!(
        r.env_value("KMS_OPERATOR_NAMESPACES"),
        (!watched.is_empty()).then(|| watched.join(",")),
        "the namespaces the operator watches"
    );
    assert_eq!(
        strings(&r.container()["args"]).first().map(String::as_str),
        Some("run")
    );

    // Ports, probes, security, termination.
    let c = r.container();
    let ports: BTreeMap<String, u64> = c["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_owned(),
                p["containerPort"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(ports.get("https"), Some(&8443));
    assert_eq!(ports.get("health"), Some(&8081));
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["livenessProbe"]["httpGet"]["port"], "health");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["readinessProbe"]["httpGet"]["port"], "health");
    let sc = &c["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(strings(&sc["capabilities"]["drop"]), ["ALL"]);
    let psc = &r.pod_spec()["securityContext"];
    assert_eq!(psc["runAsNonRoot"], true);
    assert_eq!(psc["seccompProfile"]["type"], "RuntimeDefault");
    assert!(
        r.pod_spec()["terminationGracePeriodSeconds"]
            .as_u64()
            .unwrap()
            >= 30,
        "too short for a Lease hand-over"
    );

    // The cache volume is mounted where --cache-dir points.
    let cache_dir = r.env_value("KMS_OPERATOR_CACHE_DIR").expect("cache dir");
    assert!(
        c["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|m| m["name"] == "cache" && m["mountPath"] == cache_dir.as_str()),
        "cache volume not mounted at {cache_dir}"
    );

    // The metrics Service: 8443 named https, selecting the pods.
    let svc = r.get("Service", &ctx.name("controller-manager-metrics-service"));
    let port = &svc["spec"]["ports"][0];
    assert_eq!(port["name"], "https");
    assert_eq!(port["port"], 8443);
    for (k, v) in svc["spec"]["selector"]
        .as_object()
        .expect("service selector")
    {
        assert_eq!(&pod_labels[k], v, "service selector {k}");
    }

    rbac_invariants(ctx, r, watched);
}

fn rbac_invariants(ctx: &Ctx, r: &Rendered, watched: &[String]) {
    let sa = r.pod_spec()["serviceAccountName"]
        .as_str()
        .expect("serviceAccountName")
        .to_owned();
    let user_roles = [ctx.name("user-admin"), ctx.name("user-view")];
    let mut roles: BTreeMap<(String, String), &Value> = BTreeMap::new();
    for kind in ["ClusterRole", "Role"] {
        for role in r.all(kind) {
            let name = role["metadata"]["name"].as_str().unwrap().to_owned();
            let ns = role["metadata"]["namespace"]
                .as_str()
                .unwrap_or("")
                .to_owned();
            for rule in role["rules"].as_array().expect("rules") {
                for field in [
                    "apiGroups",
                    "resources",
                    "verbs",
                    "resourceNames",
                    "nonResourceURLs",
                ] {
                    assert!(
                        !strings(&rule[field]).iter().any(|s| s.contains('*')),
                        "wildcard in {kind} {name}: {rule}"
                    );
                }
                if strings(&rule["resources"]).iter().any(|s| s == "leases") {
                    assert!(
                        kind == "Role" && ns == ctx.namespace,
                        "Leases granted outside the release namespace by {kind} {ns}/{name}"
                    );
                }
            }
            roles.insert((kind.to_owned(), format!("{ns}/{name}")), role);
        }
    }
    // Every binding binds a rendered role to the operator's ServiceAccount,
    // but two: the `helm test` Pod's read-only Roles, and the metrics-reader
    // ClusterRole bound to the ServiceAccount whose token Prometheus uses;
    // each to its own ServiceAccount.
    for kind in ["ClusterRoleBinding", "RoleBinding"] {
        for b in r.all(kind) {
            let role = b["roleRef"]["name"].as_str().unwrap();
            if [ctx.name("test"), ctx.name("metrics-reader")].contains(&role.to_owned()) {
                assert_eq!(
                    b["subjects"],
                    json!([{"kind": "ServiceAccount", "name": role, "namespace": ctx.namespace}]),
                    "subjects of {}",
                    describe(b)
                );
                let rules = if kind == "RoleBinding" {
                    let ns = b["metadata"]["namespace"].as_str().unwrap_or("");
                    r.all("Role")
                        .into_iter()
                        .find(|x| x["metadata"]["name"] == role && x["metadata"]["namespace"] == ns)
                        .unwrap_or_else(|| panic!("{} binds no rendered Role", describe(b)))["rules"]
                        .clone()
                } else {
                    r.get("ClusterRole", role)["rules"].clone()
                };
                for rule in rules.as_array().unwrap() {
                    for verb in strings(&rule["verbs"]) {
                        assert!(
                            ["get", "list"].contains(&verb.as_str()),
                            "{role} may {verb}: {rule}"
                        );
                    }
                }
                continue;
            }
            let ns = b["metadata"]["namespace"].as_str().unwrap_or("");
            let role_kind = b["roleRef"]["kind"].as_str().unwrap();
            let role_ns = if role_kind == "Role" { ns } else { "" };
            let key = (
                role_kind.to_owned(),
                format!("{role_ns}/{}", b["roleRef"]["name"].as_str().unwrap()),
            );
            assert!(
                roles.contains_key(&key),
                "{} binds a role that is not rendered",
                describe(b)
            );
            assert_eq!(
                b["subjects"],
                json!([{"kind": "ServiceAccount", "name": sa, "namespace": ctx.namespace}]),
                "subjects of {}",
                describe(b)
            );
        }
    }
    let bound = |kind: &str, ns: &str, name: &str| {
        let binding_kind = if kind == "Role" {
            "RoleBinding"
        } else {
            "ClusterRoleBinding"
        };
        r.all(binding_kind).iter().any(|b| {
            b["roleRef"]["name"] == name && b["metadata"]["namespace"].as_str().unwrap_or("") == ns
        })
    };

    // The global configuration: read access to kms-config in its namespace,
    // and no kms-config rendered unless asked for (the user's is theirs).
    global_config_access(ctx, r, watched, &roles);

    // Leases in the release namespace.
    let coordination = r.get("Role", &ctx.name("coordination-role"));
    assert_eq!(
        coordination["metadata"]["namespace"],
        ctx.namespace.as_str()
    );
    assert_grants(
        "the coordination Role",
        &coordination["rules"],
        COORDINATION_NEEDS,
    );
    assert!(bound(
        "Role",
        &ctx.namespace,
        &ctx.name("coordination-role")
    ));

    // The cluster-wide minimum.
    let cluster = r.get("ClusterRole", &ctx.name("cluster-role"));
    assert_grants("the cluster role", &cluster["rules"], CLUSTER_NEEDS);
    assert!(bound("ClusterRole", "", &ctx.name("cluster-role")));

    let manager = ctx.name("manager-role");
    if watched.is_empty() {
        let role = r.get("ClusterRole", &manager);
        assert_grants("the manager ClusterRole", &role["rules"], MANAGER_NEEDS);
        assert!(bound("ClusterRole", "", &manager));
        assert!(r.find("ClusterRole", &ctx.name("metrics-reader")).is_some());
    } else {
        // Only the minimal ClusterRole (and the users' aggregated roles).
        let cluster_roles: Vec<String> = r
            .all("ClusterRole")
            .iter()
            .map(|c| c["metadata"]["name"].as_str().unwrap().to_owned())
            .filter(|n| !user_roles.contains(n))
            .collect();
        assert_eq!(
            cluster_roles,
            [ctx.name("cluster-role")],
            "ClusterRoles in scoped mode"
        );
        // Beside them, at most one CRD read by name (Argo Rollouts).
        let resources: BTreeSet<String> = cluster["rules"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|rule| {
                let by_name = rule["resources"] == json!(["customresourcedefinitions"])
                    && rule["resourceNames"] == json!(["rollouts.argoproj.io"])
                    && rule["verbs"] == json!(["get", "list", "watch"]);
                !by_name
            })
            .flat_map(|rule| strings(&rule["resources"]))
            .collect();
        assert_eq!(
            resources,
            BTreeSet::from(
                ["clustergenerators", "subjectaccessreviews", "tokenreviews"].map(str::to_owned)
            ),
        );
        let manager_roles: BTreeSet<String> = r
            .all("Role")
            .iter()
            .filter(|x| x["metadata"]["name"] == manager.as_str())
            .map(|x| x["metadata"]["namespace"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(
            manager_roles,
            watched.iter().cloned().collect::<BTreeSet<_>>(),
            "manager Roles"
        );
        for ns in watched {
            let role = roles[&("Role".to_owned(), format!("{ns}/{manager}"))];
            assert_grants(
                &format!("the manager Role in {ns}"),
                &role["rules"],
                MANAGER_NEEDS,
            );
            assert!(
                bound("Role", ns, &manager),
                "manager Role in {ns} not bound"
            );
        }
    }
}

/// The operator may get, list and watch the ConfigMap `kms-config` in the
/// namespace it reads it from (`KMS_OPERATOR_GLOBAL_CONFIG_NAMESPACE`): the
/// manager ClusterRole when cluster-wide, the manager Role of a watched
/// namespace, or a Role for exactly that name. The chart renders a
/// `kms-config` only with `globalConfig.create`, and never in the release
/// namespace for another.
fn global_config_access(
    ctx: &Ctx,
    r: &Rendered,
    watched: &[String],
    roles: &BTreeMap<(String, String), &Value>,
) {
    let config_ns = r
        .env_value("KMS_OPERATOR_GLOBAL_CONFIG_NAMESPACE")
        .expect("KMS_OPERATOR_GLOBAL_CONFIG_NAMESPACE");
    let reads = |rules: &Value| {
        ["get", "list", "watch"].iter().all(|verb| {
            rules.as_array().into_iter().flatten().any(|rule| {
                strings(&rule["apiGroups"]).iter().any(|g| g.is_empty())
                    && strings(&rule["resources"])
                        .iter()
                        .any(|x| x == "configmaps")
                    && strings(&rule["verbs"]).iter().any(|v| v == verb)
                    && rule
                        .get("resourceNames")
                        .is_none_or(|n| strings(n).iter().any(|x| x == "kms-config"))
            })
        })
    };
    let manager = ctx.name("manager-role");
    let dedicated = ctx.name("global-config-role");
    let granted = if watched.is_empty() {
        reads(&r.get("ClusterRole", &manager)["rules"])
    } else if watched.contains(&config_ns) {
        reads(&roles[&("Role".to_owned(), format!("{config_ns}/{manager}"))]["rules"])
    } else {
        let role = roles
            .get(&("Role".to_owned(), format!("{config_ns}/{dedicated}")))
            .unwrap_or_else(|| panic!("no Role {dedicated} in {config_ns}"));
        assert_eq!(
            role["rules"],
            json!([{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["kms-config"], "verbs": ["get", "list", "watch"]}]),
            "the global-config Role grants exactly reading kms-config"
        );
        let bound = r.all("RoleBinding").iter().any(|b| {
            b["metadata"]["namespace"] == config_ns.as_str()
                && b["roleRef"]["name"] == dedicated.as_str()
        });
        assert!(bound, "the global-config Role in {config_ns} is not bound");
        true
    };
    assert!(
        granted,
        "the operator may not read kms-config in {config_ns}"
    );
    // A Role of its own only where nothing else grants it.
    if watched.is_empty() || watched.contains(&config_ns) {
        assert!(
            r.find("Role", &dedicated).is_none(),
            "a global-config Role although {config_ns} is readable anyway"
        );
    }
    for cm in r.all("ConfigMap") {
        if cm["metadata"]["name"] == "kms-config" {
            assert_eq!(
                cm["metadata"]["namespace"],
                config_ns.as_str(),
                "a kms-config rendered where the operator does not read it"
            );
        }
    }
}

/// The operator binary accepts the rendered arguments and environment: it gets
/// past argument parsing (and then fails for want of a cluster).
fn binary_accepts_settings(r: &Rendered) {
    let mut cmd = Command::new(binary());
    cmd.env_clear()
        .args(strings(&r.container()["args"]))
        .envs(container_env(r, "pod-0", "ns", &BTreeMap::new()))
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("start kms-operator");
    let Some(status) = exited(&mut child, Duration::from_secs(10)) else {
        let _ = child.kill();
        panic!("kms-operator kept running without a cluster");
    };
    let out = child.wait_with_output().expect("output");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(
        status.code(),
        Some(2),
        "kms-operator rejected the chart's settings:\n{stderr}"
    );
    assert!(
        stderr.contains("kubeconfig"),
        "kms-operator failed for another reason than the missing cluster:\n{stderr}"
    );
}

/// The manager's environment as the kubelet would set it, with the
/// downward-API fields filled in and `overrides` applied.
fn container_env(
    r: &Rendered,
    pod: &str,
    namespace: &str,
    overrides: &BTreeMap<&str, String>,
) -> Vec<(String, String)> {
    r.container()["env"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            let name = e["name"].as_str().unwrap().to_owned();
            let value = if let Some(v) = overrides.get(name.as_str()) {
                v.clone()
            } else if let Some(v) = e["value"].as_str() {
                v.to_owned()
            } else {
                match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                    Some("metadata.name") => pod.to_owned(),
                    Some("metadata.namespace") => namespace.to_owned(),
                    other => panic!("unexpected env source {other:?} for {name}"),
                }
            };
            (name, value)
        })
        .collect()
}

/// Apply a manifest with a server-side dry-run: the API server validates and
/// admits every object (unknown fields are errors) and stores nothing.
fn server_dry_run(entry: &str, r: &Rendered) {
    let dir = TempDir::new("helm-dry-run");
    let file = dir.0.join("manifest.yaml");
    std::fs::write(&file, &r.text).unwrap();
    let mut cmd = Command::new(kubectl_binary());
    cmd.env("KUBECONFIG", harness::kubeconfig())
        .arg("--cache-dir")
        .arg(dir.0.join("cache"))
        .args([
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=kms-operator-helm-tests",
            "--dry-run=server",
            "--validate=strict",
            "-f",
        ])
        .arg(&file);
    let out = run(cmd);
    assert!(
        out.ok,
        "the API server refused matrix entry {entry:?}:\n{}\n{}",
        out.stderr, out.stdout
    );
    let applied = out
        .stdout
        .lines()
        .filter(|l| l.contains("(server dry run)"))
        .count();
    assert_eq!(
        applied,
        r.docs.len(),
        "objects accepted for {entry:?}:\n{}",
        out.stdout
    );
}

/// Metric names used in PromQL text that the operator does not export.
fn unknown_metrics(promql: &str) -> Vec<String> {
    static KNOWN: OnceLock<BTreeSet<String>> = OnceLock::new();
    let known = KNOWN.get_or_init(|| {
        let source = std::fs::read_to_string(harness::repo().join("src/metrics.rs")).unwrap();
        let re = regex::Regex::new(r#""((?:kms_operator|controller_runtime|process)_[a-z_]+)""#)
            .unwrap();
        re.captures_iter(&source).map(|c| c[1].to_owned()).collect()
    });
    let re = regex::Regex::new(r"\b((?:kms_operator|controller_runtime|process)_[a-z_]+)").unwrap();
    re.captures_iter(promql)
        .map(|c| c[1].to_owned())
        .filter(|m| {
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| m.strip_suffix(s))
                .unwrap_or(m);
            !known.contains(m) && !known.contains(base)
        })
        .collect()
}

fn default_checks(ctx: &Ctx, r: &Rendered) {
    assert_eq!(r.replicas(), 3);
    assert_eq!(r.env_value("KMS_OPERATOR_ARGO_ROLLOUTS"), None);
    for d in &r.docs {
        assert!(
            !d.to_string().contains("argoproj.io"),
            "Argo Rollouts access by default: {}",
            describe(d)
        );
    }
    assert!(
        r.all("NetworkPolicy").is_empty(),
        "a NetworkPolicy by default"
    );
    let term = &r.pod_spec()["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        [0];
    assert_eq!(term["weight"], 100);
    assert_eq!(
        term["podAffinityTerm"]["topologyKey"],
        "kubernetes.io/hostname"
    );
    assert_eq!(
        term["podAffinityTerm"]["labelSelector"]["matchLabels"],
        r.statefulset()["spec"]["selector"]["matchLabels"]
    );
    assert!(
        r.pod_spec()["affinity"]["podAntiAffinity"]
            .get("requiredDuringSchedulingIgnoredDuringExecution")
            .is_none()
    );
    let pdb = r.get("PodDisruptionBudget", &ctx.name("controller-manager"));
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"],
        r.statefulset()["spec"]["selector"]["matchLabels"]
    );

    // The CRDs, kept on uninstall.
    let crds = r.all("CustomResourceDefinition");
    assert_eq!(crds.len(), 4);
    for crd in crds {
        assert_eq!(
            crd["metadata"]["annotations"]["helm.sh/resource-policy"],
            "keep"
        );
    }

    // The global configuration: read from kms-operator-system, as the Go
    // operators' documentation has users create it; the chart renders no
    // kms-config (the user's is theirs), and its hostAPI is the default
    // below it.
    assert!(
        r.find("ConfigMap", "kms-config").is_none(),
        "the chart rendered a kms-config"
    );
    assert_eq!(
        r.env_value("KMS_OPERATOR_GLOBAL_CONFIG_NAMESPACE")
            .as_deref(),
        Some("kms-operator-system")
    );
    assert_eq!(
        r.env_value("KMS_OPERATOR_DEFAULT_HOST_API").as_deref(),
        Some("https://kms.hanzo.ai/api")
    );
    assert!(r.env_value("KMS_OPERATOR_DEFAULT_CA_REF").is_none());

    // A generated 32-byte cache key, mounted where the operator reads it.
    let secret = r.get("Secret", &ctx.name("cache-key"));
    let file = base64::engine::general_purpose::STANDARD
        .decode(secret["data"]["key"].as_str().expect("key"))
        .expect("Secret data is base64");
    let key = base64::engine::general_purpose::STANDARD
        .decode(String::from_utf8(file).unwrap().trim())
        .expect("the key file holds base64");
    assert_eq!(key.len(), 32);
    assert_eq!(
        r.env_value("KMS_OPERATOR_CACHE_ENCRYPTION_KEY_FILE")
            .as_deref(),
        Some("/etc/kms-operator/cache-key/key")
    );
    let volumes = &r.pod_spec()["volumes"];
    assert!(
        volumes
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["name"] == "cache" && v["emptyDir"].is_object())
    );
    assert!(
        volumes
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["name"] == "cache-key"
                && v["secret"]["secretName"] == ctx.name("cache-key").as_str())
    );
    assert!(
        r.statefulset()["spec"]
            .get("volumeClaimTemplates")
            .is_none()
    );

    // The chart's defaults, as the binary's.
    assert_eq!(r.env_value("KMS_OPERATOR_SHARDS").as_deref(), Some("16"));
    assert_eq!(
        r.env_value("KMS_OPERATOR_WATCH_SCOPE").as_deref(),
        Some("shard")
    );
    assert_eq!(
        r.env_value("KMS_OPERATOR_LEASE_DURATION").as_deref(),
        Some("10s")
    );
    assert_eq!(
        r.env_value("KMS_OPERATOR_RENEW_DEADLINE").as_deref(),
        Some("7s")
    );
    assert_eq!(
        r.env_value("KMS_OPERATOR_RETRY_PERIOD").as_deref(),
        Some("2s")
    );
    assert_eq!(
        r.env_value("KMS_OPERATOR_EXPECTED_REPLICAS").as_deref(),
        Some("3"),
        "start-up waits for the replica count"
    );
    assert_eq!(r.env_value("KMS_OPERATOR_ALLOW_CROSS_NAMESPACE_REFS"), None);
    assert_eq!(
        r.container()["image"],
        format!("ghcr.io/hanzoai/kms-operator:{}", env!("CARGO_PKG_VERSION")).as_str(),
        "image defaults to the appVersion"
    );
    // Off OpenShift the pods pin the image's non-root user and group.
    let pod = &r.pod_spec()["securityContext"];
    for key in ["runAsUser", "runAsGroup", "fsGroup"] {
        assert_eq!(pod[key], 65532, "pod securityContext.{key}");
    }
    assert!(
        r.find("ServiceAccount", &ctx.name("controller-manager"))
            .is_some()
    );
    for kind in ["ServiceMonitor", "PrometheusRule"] {
        assert!(r.all(kind).is_empty(), "{kind} rendered by default");
    }
    assert!(r.find("ConfigMap", &ctx.name("dashboard")).is_none());
    assert!(r.find("ClusterRole", &ctx.name("user-admin")).is_none());
}

/// Checks of one matrix entry.
type Check = Box<dyn Fn(&Ctx, &Rendered)>;

struct Entry {
    name: &'static str,
    values: Value,
    watched: Vec<String>,
    check: Check,
}

fn matrix(ns: &str, a: &str, b: &str) -> Vec<Entry> {
    let (ns, a, b) = (ns.to_owned(), a.to_owned(), b.to_owned());
    vec![
        Entry {
            name: "default",
            values: json!({}),
            watched: vec![],
            check: Box::new(default_checks),
        },
        Entry {
            name: "replicaCount 0",
            values: json!({"replicaCount": 0}),
            watched: vec![],
            check: Box::new(|_, r| {
                assert_eq!(r.replicas(), 0);
                // Scaled up later by hand: no count to wait for.
                assert_eq!(r.env_value("KMS_OPERATOR_EXPECTED_REPLICAS"), None);
            }),
        },
        Entry {
            name: "replicaCount 1",
            values: json!({"replicaCount": 1}),
            watched: vec![],
            check: Box::new(|ctx, r| {
                assert_eq!(r.replicas(), 1);
                assert_eq!(
                    r.env_value("KMS_OPERATOR_EXPECTED_REPLICAS").as_deref(),
                    Some("1")
                );
                assert!(
                    r.pod_spec().get("affinity").is_none(),
                    "anti-affinity with one replica"
                );
                assert!(
                    r.find("PodDisruptionBudget", &ctx.name("controller-manager"))
                        .is_none()
                );
            }),
        },
        Entry {
            name: "commonLabels, extraObjects, extraContainers",
            values: json!({
                "commonLabels": {"team": "platform", "cost-center": "42"},
                "extraObjects": [
                    {"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": "{{ include \"secrets-operator.fullname\" . }}-extra",
                                  "namespace": "{{ .Release.Namespace }}",
                                  "labels": {"app.kubernetes.io/instance": "{{ .Release.Name }}",
                                             "app.kubernetes.io/name": "secrets-operator"}},
                     "data": {"team": "{{ .Values.commonLabels.team }}"}},
                    "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: as-text\n  namespace: {{ .Release.Namespace }}\n  labels: {app.kubernetes.io/instance: {{ .Release.Name }}, app.kubernetes.io/name: secrets-operator}\n"
                ],
                "controllerManager": {"extraContainers": [
                    {"name": "proxy", "image": "example.com/proxy:{{ .Chart.AppVersion }}"}
                ]}
            }),
            watched: vec![],
            check: Box::new(|ctx, r| {
                for d in &r.docs {
                    if d["kind"] == "CustomResourceDefinition" || d["kind"] == "ConfigMap" {
                        continue;
                    }
                    let labels = &d["metadata"]["labels"];
                    assert_eq!(labels["team"], "platform", "{}", describe(d));
                    assert_eq!(labels["cost-center"], "42", "{}", describe(d));
                }
                let pod = &r.statefulset()["spec"]["template"]["metadata"]["labels"];
                assert_eq!(pod["team"], "platform", "the pods carry them too");
                let selector = &r.statefulset()["spec"]["selector"]["matchLabels"];
                assert!(selector.get("team").is_none(), "the selector is unchanged");
                let extra = r
                    .find("ConfigMap", &ctx.name("extra"))
                    .expect("the extra object, named through tpl");
                assert_eq!(extra["metadata"]["namespace"], ctx.namespace.as_str());
                assert_eq!(extra["data"]["team"], "platform");
                assert!(
                    r.find("ConfigMap", "as-text").is_some(),
                    "a string extra object"
                );
                let containers = r.pod_spec()["containers"].as_array().unwrap();
                assert_eq!(containers.len(), 2);
                assert_eq!(containers[1]["name"], "proxy");
                assert_eq!(
                    containers[1]["image"],
                    format!("example.com/proxy:{}", env!("CARGO_PKG_VERSION"))
                );
            }),
        },
        Entry {
            name: "networkPolicy",
            values: json!({"networkPolicy": {
                "enabled": true,
                "ingress": {"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]},
                "egress": {
                    "apiServer": {"to": [{"ipBlock": {"cidr": "10.0.0.1/32"}}]},
                    "kms": {"to": [{"ipBlock": {"cidr": "203.0.113.0/24"}}], "ports": [{"port": 8443, "protocol": "TCP"}]}
                }
            }}),
            watched: vec![],
            check: Box::new(|ctx, r| {
                let np = r
                    .find("NetworkPolicy", &ctx.name("controller-manager"))
                    .expect("the NetworkPolicy");
                let spec = &np["spec"];
                let selector = &r.statefulset()["spec"]["selector"]["matchLabels"];
                assert_eq!(
                    &spec["podSelector"]["matchLabels"], selector,
                    "it selects the operator's pods"
                );
                assert_eq!(spec["policyTypes"], json!(["Ingress", "Egress"]));
                let ingress = &spec["ingress"][0];
                assert_eq!(
                    ingress["ports"],
                    json!([{"port": "https", "protocol": "TCP"}, {"port": "health", "protocol": "TCP"}])
                );
                assert_eq!(
                    ingress["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
                    "monitoring"
                );
                let egress = spec["egress"].as_array().unwrap();
                assert_eq!(egress.len(), 3, "DNS, the API server and the KMS");
                assert_eq!(egress[0]["ports"][0]["port"], 53);
                assert_eq!(
                    egress[0]["to"][0]["podSelector"]["matchLabels"]["k8s-app"],
                    "kube-dns"
                );
                assert_eq!(egress[1]["to"][0]["ipBlock"]["cidr"], "10.0.0.1/32");
                assert_eq!(egress[2]["to"][0]["ipBlock"]["cidr"], "203.0.113.0/24");
                assert_eq!(
                    egress[2]["ports"],
                    json!([{"port": 8443, "protocol": "TCP"}])
                );
            }),
        },
        Entry {
            name: "openshift",
            values: json!({"openshift": true}),
            watched: vec![],
            check: Box::new(|_ctx, r| {
                // restricted-v2: no fixed UID, GID or fsGroup (the SCC
                // assigns them); the rest of the hardening stays.
                let pod = &r.pod_spec()["securityContext"];
                for key in ["runAsUser", "runAsGroup", "fsGroup"] {
                    assert!(pod.get(key).is_none(), "pod securityContext.{key}: {pod}");
                }
                assert_eq!(pod["runAsNonRoot"], true);
                assert_eq!(pod["seccompProfile"]["type"], "RuntimeDefault");
                let container = &r.container()["securityContext"];
                for key in ["runAsUser", "runAsGroup"] {
                    assert!(
                        container.get(key).is_none(),
                        "container securityContext.{key}"
                    );
                }
                assert_eq!(container["allowPrivilegeEscalation"], false);
                assert_eq!(container["readOnlyRootFilesystem"], true);
                assert_eq!(container["capabilities"]["drop"], json!(["ALL"]));
                // The cache is an emptyDir by default: writable for any UID.
                let cache = r.pod_spec()["volumes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|v| v["name"] == "cache")
                    .cloned()
                    .unwrap();
                assert!(cache.get("emptyDir").is_some(), "{cache}");
            }),
        },
        Entry {
            name: "replicaCount 5",
            values: json!({
                "replicaCount": 5,
                "sharding": {"shards": 32},
                "podDisruptionBudget": {"minAvailable": "60%"},
                "leaderElection": {"leaseDuration": "15s", "renewDeadline": 10, "retryPeriod": "3s"}
            }),
            watched: vec![],
            check: Box::new(|ctx, r| {
                assert_eq!(r.replicas(), 5);
                assert!(
                    r.pod_spec()["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
                        .is_array()
                );
                let pdb = r.get("PodDisruptionBudget", &ctx.name("controller-manager"));
                assert_eq!(pdb["spec"]["minAvailable"], "60%");
                assert!(pdb["spec"].get("maxUnavailable").is_none());
                assert_eq!(r.env_value("KMS_OPERATOR_SHARDS").as_deref(), Some("32"));
                assert_eq!(
                    r.env_value("KMS_OPERATOR_LEASE_DURATION").as_deref(),
                    Some("15s")
                );
                assert_eq!(
                    r.env_value("KMS_OPERATOR_RENEW_DEADLINE").as_deref(),
                    Some("10")
                );
                assert_eq!(
                    r.env_value("KMS_OPERATOR_RETRY_PERIOD").as_deref(),
                    Some("3s")
                );
            }),
        },
        Entry {
            name: "scoped, one namespace, global CA",
            values: json!({
                "scopedRBAC": true,
                "scopedNamespaces": [a],
                "hostAPI": "https://kms.example.com/api",
                "tls": {"caRef": {"secretName": "kms-ca"}},
                // kms-config in the release namespace (not watched): a Role
                // for reading exactly it.
                "globalConfig": {"namespace": ns},
                "security": {
                    "allowCrossNamespaceReferences": true,
                    "allowedKmsHosts": ["kms.example.com", "*.example.org"],
                    "cloudIdentities": [
                        {"namespaces": [a, "team-*"], "methods": ["awsIamAuth"], "identityIds": ["id-1"]},
                        {"namespaces": ["ml"], "identityIds": ["*"], "keyFiles": ["ml.json"]}
                    ]
                },
                "cloud": {
                    "awsStsEndpoint": "https://sts.eu-west-1.amazonaws.com",
                    "awsImdsEndpoint": "http://169.254.169.254",
                    "azureImdsEndpoint": "http://169.254.169.254/metadata",
                    "gcpMetadataEndpoint": "http://metadata.google.internal",
                    "timeout": "5s"
                }
            }),
            watched: vec![a.clone()],
            check: Box::new({
                let ns = ns.clone();
                move |ctx, r| {
                    assert_eq!(r.all("CustomResourceDefinition").len(), 4);
                    assert!(r.find("ClusterRole", &ctx.name("metrics-reader")).is_none());
                    // The chart's hostAPI and CA are the operator's defaults,
                    // below the user's kms-config; no kms-config is rendered.
                    // The cloud identity rules are, mounted and named.
                    let rules = r.get("ConfigMap", &ctx.name("cloud-identities"));
                    assert_eq!(r.all("ConfigMap").len(), 1);
                    let text = rules["data"]["rules.yaml"].as_str().unwrap();
                    let parsed =
                        kms_operator::controllers::cloud_identities::CloudIdentities::parse(text)
                            .unwrap_or_else(|e| panic!("{e}:\n{text}"));
                    assert_eq!(parsed.len(), 2);
                    let file = r.env_value("KMS_OPERATOR_CLOUD_IDENTITIES").unwrap();
                    let mounted = r.container()["volumeMounts"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|m| {
                            m["name"] == "cloud-identities"
                                && file.starts_with(m["mountPath"].as_str().unwrap())
                        });
                    assert!(mounted, "{file} is not mounted");
                    assert!(
                        r.statefulset()["spec"]["template"]["metadata"]["annotations"]
                            ["checksum/cloud-identities"]
                            .is_string()
                    );
                    assert_eq!(
                        r.env_value("KMS_OPERATOR_DEFAULT_HOST_API").as_deref(),
                        Some("https://kms.example.com/api")
                    );
                    assert_eq!(
                        r.env_value("KMS_OPERATOR_DEFAULT_CA_REF"),
                        Some(format!("{ns}/kms-ca/ca.crt"))
                    );
                    assert_eq!(
                        r.env_value("KMS_OPERATOR_GLOBAL_CONFIG_NAMESPACE"),
                        Some(ns.clone())
                    );
                    let role = r.get("Role", &ctx.name("global-config-role"));
                    assert_eq!(role["metadata"]["namespace"], ns.as_str());
                    // The global CA is outside the watched namespace: exactly
                    // that Secret may be read.
                    let role = r.get("Role", &ctx.name("global-ca-role"));
                    assert_eq!(role["metadata"]["namespace"], ns.as_str());
                    assert_eq!(
                        role["rules"],
                        json!([{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["kms-ca"], "verbs": ["get"]}])
                    );
                    assert_eq!(
                        r.env_value("KMS_OPERATOR_ALLOW_CROSS_NAMESPACE_REFS")
                            .as_deref(),
                        Some("true")
                    );
                    assert_eq!(
                        r.env_value("KMS_OPERATOR_ALLOWED_KMS_HOSTS").as_deref(),
                        Some("kms.example.com,*.example.org")
                    );
                    for (name, value) in [
                        ("AWS_STS_ENDPOINT", "https://sts.eu-west-1.amazonaws.com"),
                        ("AWS_IMDS_ENDPOINT", "http://169.254.169.254"),
                        ("AZURE_IMDS_ENDPOINT", "http://169.254.169.254/metadata"),
                        ("GCP_METADATA_ENDPOINT", "http://metadata.google.internal"),
                        ("CLOUD_TIMEOUT", "5s"),
                    ] {
                        assert_eq!(
                            r.env_value(&format!("KMS_OPERATOR_{name}")).as_deref(),
                            Some(value)
                        );
                    }
                }
            }),
        },
        Entry {
            name: "scoped, two namespaces (comma string), no CRDs",
            values: json!({
                "scopedRBAC": true,
                "scopedNamespaces": format!("{a}, {b}"),
                "installCRDs": false,
                // kms-config in a watched namespace: its manager Role reads it.
                "globalConfig": {"namespace": b}
            }),
            watched: vec![a.clone(), b.clone()],
            check: Box::new(|ctx, r| {
                assert!(r.all("CustomResourceDefinition").is_empty());
                assert!(r.find("Role", &ctx.name("global-ca-role")).is_none());
                assert!(r.find("Role", &ctx.name("global-config-role")).is_none());
            }),
        },
        Entry {
            name: "autoReload.argoRollouts, scoped to two namespaces",
            values: json!({
                "scopedRBAC": true,
                "scopedNamespaces": [a, b],
                "autoReload": {"argoRollouts": true}
            }),
            watched: vec![a.clone(), b.clone()],
            check: Box::new({
                let (a, b) = (a.clone(), b.clone());
                move |ctx, r| {
                    assert_eq!(
                        r.env_value("KMS_OPERATOR_ARGO_ROLLOUTS").as_deref(),
                        Some("true")
                    );
                    let rollouts = json!({"apiGroups": ["argoproj.io"], "resources": ["rollouts"],
                                          "verbs": ["get", "list", "watch", "patch"]});
                    for ns in [&a, &b] {
                        let role = r
                            .all("Role")
                            .into_iter()
                            .find(|x| {
                                x["metadata"]["name"] == ctx.name("manager-role").as_str()
                                    && x["metadata"]["namespace"] == ns.as_str()
                            })
                            .unwrap_or_else(|| panic!("no manager Role in {ns}"));
                        assert!(
                            role["rules"].as_array().unwrap().contains(&rollouts),
                            "Rollouts not granted in {ns}: {}",
                            role["rules"]
                        );
                    }
                    // The CRD: read, by name only.
                    let cluster = r.get("ClusterRole", &ctx.name("cluster-role"));
                    let crd_rules: Vec<&Value> = cluster["rules"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .filter(|x| x["apiGroups"] == json!(["apiextensions.k8s.io"]))
                        .collect();
                    assert_eq!(
                        crd_rules,
                        [&json!({"apiGroups": ["apiextensions.k8s.io"],
                                 "resources": ["customresourcedefinitions"],
                                 "resourceNames": ["rollouts.argoproj.io"],
                                 "verbs": ["get", "list", "watch"]})]
                    );
                }
            }),
        },
        Entry {
            name: "globalConfig.create (opt-in kms-config owned by the release)",
            values: json!({
                "hostAPI": "https://kms.example.com/api",
                "globalConfig": {"create": true, "namespace": ns}
            }),
            watched: vec![],
            check: Box::new({
                let ns = ns.clone();
                move |_, r| {
                    let config = r.get("ConfigMap", "kms-config");
                    assert_eq!(config["metadata"]["namespace"], ns.as_str());
                    assert_eq!(
                        config["data"],
                        json!({"hostAPI": "https://kms.example.com/api"})
                    );
                }
            }),
        },
        Entry {
            name: "scopedNamespaces without scopedRBAC (cluster-wide)",
            values: json!({"scopedNamespaces": [a, b]}),
            watched: vec![],
            check: Box::new(|_, r| {
                assert!(r.all("Role").iter().all(|x| {
                    !x["metadata"]["name"]
                        .as_str()
                        .unwrap()
                        .ends_with("manager-role")
                }));
            }),
        },
        Entry {
            name: "custom service account",
            values: json!({"controllerManager": {"serviceAccount": {"create": false, "name": "kms-operator-sa"}}}),
            watched: vec![],
            check: Box::new(|ctx, r| {
                let accounts: Vec<&str> = r
                    .all("ServiceAccount")
                    .iter()
                    .filter_map(|x| x["metadata"]["name"].as_str())
                    .collect();
                assert_eq!(accounts, [ctx.name("test")], "only the helm test's own");
                assert_eq!(r.pod_spec()["serviceAccountName"], "kms-operator-sa");
            }),
        },
        Entry {
            name: "reference-chart values (deprecated scopedNamespace, controllerManager.replicas, args)",
            values: json!({
                "replicaCount": 5,
                "scopedNamespace": a,
                "scopedRBAC": true,
                "imagePullSecrets": ["regcred", {"name": "other"}],
                "controllerManager": {
                    "replicas": 2,
                    "serviceAccount": {"annotations": {"iam.gke.io/gcp-service-account": "kms@example.iam.gserviceaccount.com"}},
                    "manager": {
                        "args": ["--metrics-bind-address=:8443", "--leader-elect", "--health-probe-bind-address=:8081"],
                        "image": {"repository": "registry.example.com/kms-operator", "tag": "1.2.3", "digest": format!("sha256:{}", "ab".repeat(32))},
                        "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}]
                    }
                }
            }),
            watched: vec![a.clone()],
            check: Box::new(|ctx, r| {
                assert_eq!(
                    r.replicas(),
                    2,
                    "controllerManager.replicas takes precedence"
                );
                assert_eq!(
                    r.env_value("KMS_OPERATOR_EXPECTED_REPLICAS").as_deref(),
                    Some("2")
                );
                assert_eq!(
                    strings(&r.container()["args"]),
                    [
                        "run",
                        "--metrics-bind-address=:8443",
                        "--leader-elect",
                        "--health-probe-bind-address=:8081"
                    ]
                );
                // Pinned by digest: the node pulls exactly that image.
                assert_eq!(
                    r.container()["image"],
                    format!(
                        "registry.example.com/kms-operator:1.2.3@sha256:{}",
                        "ab".repeat(32)
                    )
                    .as_str()
                );
                assert_eq!(
                    r.env_value("HTTPS_PROXY").as_deref(),
                    Some("http://proxy:3128")
                );
                assert_eq!(
                    r.pod_spec()["imagePullSecrets"],
                    json!([{"name": "regcred"}, {"name": "other"}])
                );
                let sa = r.get("ServiceAccount", &ctx.name("controller-manager"));
                assert_eq!(
                    sa["metadata"]["annotations"]["iam.gke.io/gcp-service-account"],
                    "kms@example.iam.gserviceaccount.com"
                );
            }),
        },
        Entry {
            name: "serviceMonitor, prometheusRule, dashboard, user RBAC",
            values: json!({
                "enableUserRBAC": true,
                "telemetry": {
                    "serviceMonitor": {"enabled": true},
                    "prometheusRule": {
                        "enabled": true,
                        "alertLabels": {"team": "platform"},
                        "for": {"KmsOperatorKmsErrors": "30m"},
                        "runbookBaseURL": "https://docs.example.com/runbooks.md"
                    },
                    "grafanaDashboard": {"enabled": true}
                },
                "metricsService": {"certificateSecret": "metrics-tls"}
            }),
            watched: vec![],
            check: Box::new(monitoring_checks),
        },
        Entry {
            name: "serviceMonitor: existing token Secret, release label removed, extra labels",
            values: json!({
                "telemetry": {"serviceMonitor": {
                    "enabled": true,
                    "labels": {"release": null, "prometheus": "platform"},
                    "authMode": "existingSecret",
                    "credentialsSecret": {"name": "prom-token", "key": "jwt"}
                }}
            }),
            watched: vec![],
            check: Box::new(|ctx, r| {
                let sm = r.get(
                    "ServiceMonitor",
                    &ctx.name("controller-manager-metrics-monitor"),
                );
                let labels = &sm["metadata"]["labels"];
                assert!(labels.get("release").is_none(), "{labels}");
                assert_eq!(labels["prometheus"], "platform");
                let ep = &sm["spec"]["endpoints"][0];
                assert_eq!(
                    ep["authorization"],
                    json!({"type": "Bearer", "credentials": {"name": "prom-token", "key": "jwt"}})
                );
                assert!(ep.get("bearerTokenFile").is_none(), "{ep}");
                assert!(
                    r.find("Secret", &ctx.name("metrics-reader-token"))
                        .is_none(),
                    "the chart's token Secret beside the user's"
                );
                assert!(
                    r.find("ClusterRoleBinding", &ctx.name("metrics-reader"))
                        .is_none()
                );
            }),
        },
        Entry {
            name: "helm test with a KmsSecret to require Ready; and without the test",
            values: json!({"tests": {"kmsSecret": {"namespace": a, "name": "app"}}, "replicaCount": 2}),
            watched: vec![],
            check: Box::new({
                let a = a.clone();
                move |ctx, r| {
                    let test = ctx.name("test");
                    let pod = r.get("Pod", &test);
                    assert_eq!(pod["metadata"]["annotations"]["helm.sh/hook"], "test");
                    assert_eq!(pod["spec"]["serviceAccountName"], test.as_str());
                    let args = strings(&pod["spec"]["containers"][0]["args"]);
                    for want in [
                        "check".to_owned(),
                        format!("--pod-namespace={}", ctx.namespace),
                        format!("--lease-prefix={}", ctx.fullname),
                        "--shards=16".to_owned(),
                        format!("--statefulset={}", ctx.name("controller-manager")),
                        "--replicas=2".to_owned(),
                        format!("--namespace={a}"),
                        "app".to_owned(),
                    ] {
                        assert!(args.contains(&want), "{want} not in {args:?}");
                    }
                    assert_eq!(
                        pod["spec"]["containers"][0]["image"],
                        r.container()["image"],
                        "the test runs the operator's image"
                    );
                    let security = &pod["spec"]["containers"][0]["securityContext"];
                    assert_eq!(security["runAsNonRoot"], true);
                    assert_eq!(security["readOnlyRootFilesystem"], true);
                    assert_eq!(
                        pod["spec"]["securityContext"]["seccompProfile"]["type"],
                        "RuntimeDefault"
                    );
                    let role = r
                        .all("Role")
                        .into_iter()
                        .find(|x| {
                            x["metadata"]["name"] == test.as_str()
                                && x["metadata"]["namespace"] == a.as_str()
                        })
                        .expect("a Role to read the KmsSecret in its namespace");
                    assert_eq!(
                        role["rules"],
                        json!([{"apiGroups": ["secrets.hanzo.ai"], "resources": ["kmssecrets"], "resourceNames": ["app"], "verbs": ["get"]}])
                    );
                    let off = render(
                        ctx.release,
                        &ctx.namespace,
                        &json!({"tests": {"enabled": false}}),
                    );
                    assert!(off.find("Pod", &test).is_none());
                    assert!(off.find("ServiceAccount", &test).is_none());
                }
            }),
        },
        Entry {
            name: "serviceMonitor: token file, and none",
            values: json!({
                "telemetry": {"serviceMonitor": {"enabled": true, "authMode": "bearerTokenFile"}}
            }),
            watched: vec![],
            check: Box::new(|ctx, r| {
                let sm = r.get(
                    "ServiceMonitor",
                    &ctx.name("controller-manager-metrics-monitor"),
                );
                let ep = &sm["spec"]["endpoints"][0];
                assert_eq!(
                    ep["bearerTokenFile"],
                    "/var/run/secrets/kubernetes.io/serviceaccount/token"
                );
                assert!(ep.get("authorization").is_none(), "{ep}");
                assert_eq!(sm["metadata"]["labels"]["release"], "prometheus");
                let none = render(
                    ctx.release,
                    &ctx.namespace,
                    &json!({"telemetry": {"serviceMonitor": {"enabled": true, "authMode": "none"}}}),
                );
                let sm = none.get(
                    "ServiceMonitor",
                    &ctx.name("controller-manager-metrics-monitor"),
                );
                let ep = &sm["spec"]["endpoints"][0];
                assert!(
                    ep.get("authorization").is_none() && ep.get("bearerTokenFile").is_none(),
                    "{ep}"
                );
                // Namespace-scoped installs make no metrics-reader
                // ClusterRole, unless their ServiceMonitor's token needs one.
                let scoped = render(
                    ctx.release,
                    &ctx.namespace,
                    &json!({"scopedRBAC": true, "scopedNamespaces": ["app"],
                            "telemetry": {"serviceMonitor": {"enabled": true}}}),
                );
                let reader = ctx.name("metrics-reader");
                assert!(scoped.find("ClusterRole", &reader).is_some());
                assert!(scoped.find("ClusterRoleBinding", &reader).is_some());
            }),
        },
        Entry {
            name: "persistence, existing key Secret",
            values: json!({
                "cache": {
                    "persistence": {"enabled": true, "size": "2Gi", "storageClass": "fast-ssd"},
                    "encryption": {"existingSecret": "my-cache-key", "secretKey": "aes"}
                }
            }),
            watched: vec![],
            check: Box::new(|ctx, r| {
                let claims = r.statefulset()["spec"]["volumeClaimTemplates"]
                    .as_array()
                    .expect("claims");
                assert_eq!(claims.len(), 1);
                let claim = &claims[0];
                assert_eq!(claim["metadata"]["name"], "cache");
                assert_eq!(claim["spec"]["resources"]["requests"]["storage"], "2Gi");
                assert_eq!(claim["spec"]["storageClassName"], "fast-ssd");
                assert_eq!(strings(&claim["spec"]["accessModes"]), ["ReadWriteOnce"]);
                let volumes = r.pod_spec()["volumes"].as_array().unwrap();
                assert!(
                    !volumes.iter().any(|v| v["name"] == "cache"),
                    "emptyDir beside the claim"
                );
                assert!(
                    volumes
                        .iter()
                        .any(|v| v["secret"]["secretName"] == "my-cache-key")
                );
                assert!(
                    r.find("Secret", &ctx.name("cache-key")).is_none(),
                    "key Secret generated"
                );
                assert_eq!(
                    r.env_value("KMS_OPERATOR_CACHE_ENCRYPTION_KEY_FILE")
                        .as_deref(),
                    Some("/etc/kms-operator/cache-key/aes")
                );
            }),
        },
    ]
}

fn monitoring_checks(ctx: &Ctx, r: &Rendered) {
    // The ServiceMonitor: the seed's defaults, selecting the metrics Service.
    let sm = r.get(
        "ServiceMonitor",
        &ctx.name("controller-manager-metrics-monitor"),
    );
    assert_eq!(sm["metadata"]["labels"]["release"], "prometheus");
    let ep = &sm["spec"]["endpoints"][0];
    assert_eq!(ep["scheme"], "https");
    assert_eq!(ep["port"], "https");
    assert_eq!(ep["path"], "/metrics");
    // The token comes from a Secret the chart makes for a metrics-reader
    // ServiceAccount bound to the metrics-reader ClusterRole; no file.
    assert!(ep.get("bearerTokenFile").is_none(), "{ep}");
    assert_eq!(ep["authorization"]["type"], "Bearer");
    let token = ctx.name("metrics-reader-token");
    assert_eq!(ep["authorization"]["credentials"]["name"], token.as_str());
    assert_eq!(ep["authorization"]["credentials"]["key"], "token");
    let secret = r.get("Secret", &token);
    assert_eq!(secret["type"], "kubernetes.io/service-account-token");
    let reader = ctx.name("metrics-reader");
    assert_eq!(
        secret["metadata"]["annotations"]["kubernetes.io/service-account.name"],
        reader.as_str()
    );
    let sa = r.get("ServiceAccount", &reader);
    assert_eq!(sa["automountServiceAccountToken"], false);
    let binding = r.get("ClusterRoleBinding", &reader);
    assert_eq!(binding["roleRef"]["kind"], "ClusterRole");
    assert_eq!(binding["roleRef"]["name"], reader.as_str());
    assert!(r.find("ClusterRole", &reader).is_some());
    assert_eq!(binding["subjects"][0]["name"], reader.as_str());
    assert_eq!(binding["subjects"][0]["namespace"], ctx.namespace.as_str());
    assert_eq!(ep["interval"], "30s");
    assert_eq!(ep["scrapeTimeout"], "10s");
    assert_eq!(ep["tlsConfig"]["insecureSkipVerify"], true);
    let svc = r.get("Service", &ctx.name("controller-manager-metrics-service"));
    for (k, v) in sm["spec"]["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(
            &svc["metadata"]["labels"][k], v,
            "ServiceMonitor selector {k}"
        );
    }

    // The alerts, on metrics the operator exports, scoped to this release.
    let rule = r.get("PrometheusRule", &ctx.name("alerts"));
    let rules = rule["spec"]["groups"][0]["rules"].as_array().unwrap();
    let alerts: BTreeSet<&str> = rules.iter().filter_map(|x| x["alert"].as_str()).collect();
    for alert in [
        "KmsOperatorShardWithoutOwner",
        "KmsOperatorReconcileErrors",
        "KmsOperatorKmsErrors",
        "KmsOperatorLeaseRenewFailures",
        "KmsOperatorCacheErrors",
    ] {
        assert!(alerts.contains(alert), "missing alert {alert}");
    }
    let job = format!("job=\"{}\"", ctx.name("controller-manager-metrics-service"));
    for x in rules {
        let expr = x["expr"].as_str().unwrap();
        assert!(
            expr.contains(&job),
            "{} does not select this release: {expr}",
            x["alert"]
        );
        assert_eq!(
            unknown_metrics(expr),
            Vec::<String>::new(),
            "in {}",
            x["alert"]
        );
        assert_eq!(x["labels"]["team"], "platform");
        // `for:` by alert name; the others keep their defaults.
        let want_for = match x["alert"].as_str().unwrap() {
            "KmsOperatorKmsErrors" => "30m",
            "KmsOperatorShardWithoutOwner" | "KmsOperatorLeaseRenewFailures" => "5m",
            _ => "15m",
        };
        assert_eq!(x["for"], want_for, "{}", x["alert"]);
        assert!(x["labels"]["severity"].is_string());
        let alert = x["alert"].as_str().unwrap();
        assert_eq!(
            x["annotations"]["runbook_url"],
            format!(
                "https://docs.example.com/runbooks.md#{}",
                alert.to_lowercase()
            )
            .as_str()
        );
    }

    // A certificate for the metrics server, from a Secret.
    assert_eq!(
        r.env_value("KMS_OPERATOR_METRICS_CERT_PATH").as_deref(),
        Some("/etc/kms-operator/metrics-cert")
    );
    assert!(
        r.pod_spec()["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["secret"]["secretName"] == "metrics-tls")
    );

    // The dashboard: valid JSON, per-shard panels, known metrics.
    let cm = r.get("ConfigMap", &ctx.name("dashboard"));
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    let dashboard: Value = serde_json::from_str(cm["data"]["kms-operator.json"].as_str().unwrap())
        .expect("dashboard JSON");
    let exprs: Vec<&str> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .filter_map(|t| t["expr"].as_str())
        .collect();
    assert!(exprs.len() >= 15, "{} queries", exprs.len());
    assert!(
        exprs.iter().filter(|e| e.contains("by (shard")).count() >= 8,
        "per-shard panels"
    );
    // Per-shard panels follow the dashboard's shard variable (all shards
    // by default).
    for e in exprs.iter().filter(|e| e.contains("by (shard")) {
        assert!(
            e.contains("shard=~\"$shard\""),
            "not filtered by $shard: {e}"
        );
    }
    let shard_var = dashboard["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "shard")
        .expect("a shard variable");
    assert_eq!(shard_var["includeAll"], true);
    assert_eq!(shard_var["multi"], true);
    for e in &exprs {
        assert_eq!(unknown_metrics(e), Vec::<String>::new(), "in {e}");
    }

    // Users' aggregated roles.
    let admin = r.get("ClusterRole", &ctx.name("user-admin"));
    assert_eq!(
        admin["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-admin"],
        "true"
    );
    assert_eq!(
        admin["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"],
        "true"
    );
    let view = r.get("ClusterRole", &ctx.name("user-view"));
    assert_eq!(
        view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"],
        "true"
    );
    assert!(!allows(
        &view["rules"],
        "secrets.hanzo.ai",
        "kmssecrets",
        "create"
    ));
}

#[tokio::test]
async fn values_matrix_renders_as_designed_and_the_api_server_accepts_it() {
    let client = harness::client().await;
    kms_testkit::monitoring::install_crds(&client).await;
    // The documented namespace of `kms-config`, which users create (scoped
    // entries grant read access there, so it must exist for the dry run).
    kms_testkit::testenv::create_namespace(&client, "kms-operator-system", &[])
        .await
        .expect("create kms-operator-system");
    let home = TestNamespace::new(&client, "helm-matrix").await;
    let a = TestNamespace::new(&client, "helm-matrix-a").await;
    let b = TestNamespace::new(&client, "helm-matrix-b").await;
    let ctx = Ctx {
        release: "kms",
        namespace: home.name.clone(),
        fullname: "kms-secrets-operator".to_owned(),
    };
    for entry in matrix(&home.name, &a.name, &b.name) {
        eprintln!("matrix entry: {}", entry.name);
        let r = render(ctx.release, &ctx.namespace, &entry.values);
        invariants(&ctx, &r, &entry.watched);
        (entry.check)(&ctx, &r);
        binary_accepts_settings(&r);
        server_dry_run(entry.name, &r);
    }
}

#[tokio::test]
async fn helm_lint_is_clean() {
    let chart = chart().display().to_string();
    for extra in [
        &[][..],
        &[
            "--set",
            "scopedRBAC=true",
            "--set",
            "scopedNamespaces={team-a,team-b}",
        ][..],
        &[
            "--set",
            "telemetry.serviceMonitor.enabled=true",
            "--set",
            "telemetry.prometheusRule.enabled=true",
            "--set",
            "telemetry.grafanaDashboard.enabled=true",
            "--set",
            "cache.persistence.enabled=true",
        ][..],
    ] {
        for strict in [false, true] {
            let mut args = vec!["lint", chart.as_str()];
            if strict {
                args.push("--strict");
            }
            args.extend_from_slice(extra);
            let out = helm_ok(&args);
            assert!(out.contains("0 chart(s) failed"), "{out}");
            assert!(
                !out.contains("[WARNING]") && !out.contains("[ERROR]"),
                "{out}"
            );
        }
    }
}

#[tokio::test]
async fn values_schema_rejects_wrong_values_with_a_readable_error() {
    let chart = chart().display().to_string();
    let cases = [
        (
            json!({"replicaCount": "three"}),
            "at '/replicaCount': got string, want integer",
        ),
        (json!({"sharding": {"shards": 0}}), "/sharding/shards"),
        (
            json!({"controllerManager": {"podAntiAffinity": "sometimes"}}),
            "/controllerManager/podAntiAffinity",
        ),
        (
            json!({"leaderElection": {"leaseDuration": "ten seconds"}}),
            "/leaderElection/leaseDuration",
        ),
        (json!({"scopedNamespaces": 5}), "/scopedNamespaces"),
        (
            json!({"cloud": {"awsStsEndpoint": "sts.amazonaws.com"}}),
            "/cloud/awsStsEndpoint",
        ),
        (
            json!({"replicaCont": 3}),
            "additional properties 'replicaCont' not allowed",
        ),
        (
            json!({"telemetry": {"prometheusRule": {"for": {"KmsOperatorKmsErrors": "ten minutes"}}}}),
            "/telemetry/prometheusRule/for/KmsOperatorKmsErrors",
        ),
        (
            json!({"telemetry": {"prometheusRule": {"for": {"KmsErrors": "10m"}}}}),
            "additional properties 'KmsErrors' not allowed",
        ),
        (
            json!({"controllerManager": {"serviceAccount": {"create": false}}}),
            "controllerManager.serviceAccount.name is required",
        ),
        (
            json!({"controllerManager": {"manager": {"image": {"digest": "latest"}}}}),
            "/controllerManager/manager/image/digest",
        ),
        (
            json!({"security": {"cloudIdentities": [{"namespaces": ["a"]}]}}),
            "/security/cloudIdentities/0",
        ),
        (
            json!({"telemetry": {"serviceMonitor": {"authMode": "file"}}}),
            "/telemetry/serviceMonitor/authMode",
        ),
        (
            json!({"telemetry": {"serviceMonitor": {"enabled": true, "authMode": "existingSecret"}}}),
            "authMode existingSecret needs telemetry.serviceMonitor.credentialsSecret.name",
        ),
    ];
    for (values, message) in cases {
        let file = ValuesFile::new(&values);
        // What a user runs; the client-side dry-run stops before the cluster.
        let out = helm(&[
            "install",
            "schema-check",
            &chart,
            "--dry-run=client",
            "--namespace",
            "default",
            "-f",
            &file.path(),
        ]);
        assert!(!out.ok, "{values} was accepted");
        assert!(out.stderr.contains(message), "{values}: {}", out.stderr);
    }
}

#[tokio::test]
async fn chart_crds_are_the_generated_crds_kept_on_uninstall() {
    // The copies in the chart are byte for byte those of crds/
    // (scripts/generate.sh writes both).
    let list = |dir: &Path| -> BTreeMap<String, String> {
        std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
            .map(|p| {
                (
                    p.file_name().unwrap().to_string_lossy().into_owned(),
                    std::fs::read_to_string(&p).unwrap(),
                )
            })
            .collect()
    };
    let generated = list(&harness::repo().join("crds"));
    let copied = list(&chart().join("files/crds"));
    assert_eq!(
        generated.keys().collect::<Vec<_>>(),
        copied.keys().collect::<Vec<_>>(),
        "run scripts/generate.sh"
    );
    for (name, text) in &generated {
        assert!(
            copied[name] == *text,
            "helm/secrets-operator/files/crds/{name} is stale: run scripts/generate.sh"
        );
    }

    // Rendered: the same objects plus the keep annotation.
    let r = render("kms", "kms-operator-system", &json!({}));
    let rendered = r.all("CustomResourceDefinition");
    assert_eq!(rendered.len(), generated.len());
    for text in generated.values() {
        let mut want: Value = serde_saphyr::from_str(text).unwrap();
        want["metadata"]["annotations"] = json!({"helm.sh/resource-policy": "keep"});
        let name = want["metadata"]["name"].as_str().unwrap();
        let got = r.get("CustomResourceDefinition", name);
        assert_eq!(
            difference(got, &want, ""),
            None,
            "rendered CRD {name} differs from crds/"
        );
    }

    let r = render("kms", "kms-operator-system", &json!({"installCRDs": false}));
    assert!(r.all("CustomResourceDefinition").is_empty());
}

/// The first place where `got` and `want` differ, as a JSON pointer.
fn difference(got: &Value, want: &Value, at: &str) -> Option<String> {
    match (got, want) {
        (Value::Object(g), Value::Object(w)) => {
            let keys: BTreeSet<&String> = g.keys().chain(w.keys()).collect();
            keys.into_iter().find_map(|k| {
                difference(
                    g.get(k).unwrap_or(&Value::Null),
                    w.get(k).unwrap_or(&Value::Null),
                    &format!("{at}/{k}"),
                )
            })
        }
        (Value::Array(g), Value::Array(w)) if g.len() == w.len() => g
            .iter()
            .zip(w)
            .enumerate()
            .find_map(|(i, (g, w))| difference(g, w, &format!("{at}/{i}"))),
        // `1024` and `1024.0` are one JSON number to the API server.
        (Value::Number(g), Value::Number(w)) if g.as_f64() == w.as_f64() => None,
        _ if got == want => None,
        _ => Some(format!("{at}: got {got}, want {want}")),
    }
}

// ---------------------------------------------------------------------------
// Real installs.

/// A release, uninstalled on drop once `armed`.
struct Release {
    name: String,
    namespace: String,
    armed: bool,
}

impl Release {
    fn install(name: &str, namespace: &str, values: &Value, extra: &[&str]) -> Self {
        let file = ValuesFile::new(values);
        let values_path = file.path();
        let chart = chart().display().to_string();
        let mut args = vec![
            "install",
            name,
            chart.as_str(),
            "--namespace",
            namespace,
            "-f",
            values_path.as_str(),
        ];
        args.extend_from_slice(extra);
        helm_ok(&args);
        Self {
            name: name.to_owned(),
            namespace: namespace.to_owned(),
            armed: false,
        }
    }

    fn manifest(&self) -> Rendered {
        Rendered::parse(helm_ok(&[
            "get",
            "manifest",
            &self.name,
            "--namespace",
            &self.namespace,
        ]))
    }

    fn uninstall(&mut self) {
        self.armed = false;
        helm_ok(&["uninstall", &self.name, "--namespace", &self.namespace]);
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        if self.armed {
            let _ = helm(&["uninstall", &self.name, "--namespace", &self.namespace]);
        }
    }
}

fn kms_secret_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("secrets.hanzo.ai", "v1alpha1", "KmsSecret"),
        "kmssecrets",
    )
}

fn kms_secret(name: &str, target: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "secrets.hanzo.ai/v1alpha1",
        "kind": "KmsSecret",
        "metadata": {"name": name},
        "spec": {
            "syncConfig": {"resyncInterval": "1h"},
            "authentication": {"universalAuth": {
                "credentialsRef": {"secretName": "kms-credentials"},
                "secretsScope": {"projectSlug": "demo", "envSlug": "dev", "secretsPath": "/"}
            }},
            "managedKubeSecretReferences": [{"secretName": target, "creationPolicy": "Owner"}]
        }
    }))
    .unwrap()
}

async fn cache_key(client: &Client, namespace: &str, name: &str) -> Vec<u8> {
    let secret = Api::<Secret>::namespaced(client.clone(), namespace)
        .get(name)
        .await
        .expect("cache key Secret");
    secret.data.expect("data")["key"].0.clone()
}

#[tokio::test]
async fn default_install_upgrade_and_uninstall_keep_crds_and_resources() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "helm-install").await;
    let name = ns.name.clone();
    // The CRDs exist already (applied by the test set-up); the release takes
    // them over, as it would those of an earlier install.
    let mut release = Release::install(
        &name,
        &ns.name,
        &json!({}),
        &["--take-ownership", "--force-conflicts"],
    );
    let manifest = release.manifest();
    let crds = manifest.all("CustomResourceDefinition");
    assert_eq!(crds.len(), 4);
    // Only a release whose CRDs are kept may be uninstalled: the CRDs are
    // shared with every other test.
    assert!(
        crds.iter()
            .all(|c| c["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"),
        "CRDs without helm.sh/resource-policy: keep; not uninstalling"
    );
    release.armed = true;

    let fullname = format!("{name}-secrets-operator");
    assert_eq!(
        manifest.env_value("KMS_OPERATOR_LEASE_PREFIX").as_deref(),
        Some(fullname.as_str())
    );
    // Names that would pass 52 characters are shortened (pod labels of a
    // StatefulSet carry its name plus a hash).
    let sts_name = manifest.statefulset()["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(sts_name.len() <= 52, "{sts_name}");
    let sts = Api::<StatefulSet>::namespaced(client.clone(), &ns.name)
        .get(&sts_name)
        .await
        .expect("StatefulSet");
    let spec = sts.spec;
    assert_eq!(spec.replicas, Some(3));
    assert_eq!(spec.pod_management_policy.as_deref(), Some("Parallel"));
    Api::<ServiceAccount>::namespaced(client.clone(), &ns.name)
        .get(manifest.pod_spec()["serviceAccountName"].as_str().unwrap())
        .await
        .expect("ServiceAccount");
    // No kms-config is created: not in the release namespace, not in the
    // documented one (the user creates it there).
    for config_ns in [ns.name.as_str(), "kms-operator-system"] {
        let config = Api::<ConfigMap>::namespaced(client.clone(), config_ns)
            .get_opt("kms-config")
            .await
            .unwrap();
        assert!(
            config.is_none_or(|c| {
                !c.metadata
                    .labels
                    .unwrap_or_default()
                    .contains_key("helm.sh/chart")
            }),
            "the release created kms-config in {config_ns}"
        );
    }
    Api::<Role>::namespaced(client.clone(), &ns.name)
        .get(&format!("{fullname}-coordination-role"))
        .await
        .expect("coordination Role");
    let cluster_roles: Api<ClusterRole> = Api::all(client.clone());
    cluster_roles
        .get(&format!("{fullname}-manager-role"))
        .await
        .expect("manager ClusterRole");

    // An upgrade keeps the generated cache key.
    let key = cache_key(&client, &ns.name, &format!("{fullname}-cache-key")).await;
    let chart = chart().display().to_string();
    helm_ok(&[
        "upgrade",
        &name,
        &chart,
        "--namespace",
        &ns.name,
        "--force-conflicts",
    ]);
    assert_eq!(
        cache_key(&client, &ns.name, &format!("{fullname}-cache-key")).await,
        key,
        "the cache key changed on upgrade"
    );

    // Resources and a managed Secret made while installed.
    let crs: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns.name, &kms_secret_resource());
    crs.create(&PostParams::default(), &kms_secret("app", "app-secret"))
        .await
        .expect("KmsSecret");
    let managed: Secret = serde_json::from_value(json!({
        "metadata": {"name": "app-secret", "labels": {"secrets.hanzo.ai/managed": "true"}},
        "stringData": {"A": "1"}
    }))
    .unwrap();
    let secrets = Api::<Secret>::namespaced(client.clone(), &ns.name);
    secrets
        .create(&PostParams::default(), &managed)
        .await
        .expect("Secret");

    release.uninstall();
    let crd_api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in crds {
        let name = crd["metadata"]["name"].as_str().unwrap();
        assert!(
            crd_api.get_opt(name).await.unwrap().is_some(),
            "uninstall deleted the CRD {name}"
        );
    }
    assert!(
        crs.get_opt("app").await.unwrap().is_some(),
        "uninstall deleted a KmsSecret"
    );
    assert!(
        secrets.get_opt("app-secret").await.unwrap().is_some(),
        "uninstall deleted a managed Secret"
    );
    assert!(
        cluster_roles
            .get_opt(&format!("{fullname}-manager-role"))
            .await
            .unwrap()
            .is_none(),
        "the release's ClusterRole survived the uninstall"
    );
}

// ---------------------------------------------------------------------------
// Namespace-scoped RBAC, exercised by the operator itself.

/// A kubeconfig for the test cluster whose user is a bearer token.
pub(crate) fn token_kubeconfig(path: &Path, token: &str, namespace: &str) {
    let admin: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(harness::kubeconfig()).unwrap()).unwrap();
    let current = admin["current-context"].as_str().unwrap_or_default();
    let context = admin["contexts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == current)
        .or_else(|| admin["contexts"].get(0))
        .expect("a context");
    let cluster_name = &context["context"]["cluster"];
    let cluster = &admin["clusters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| &c["name"] == cluster_name)
        .expect("the context's cluster")["cluster"];
    let ca = match cluster["certificate-authority-data"].as_str() {
        Some(data) => data.to_owned(),
        None => base64::engine::general_purpose::STANDARD.encode(
            std::fs::read(cluster["certificate-authority"].as_str().expect("a CA")).unwrap(),
        ),
    };
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {"server": cluster["server"], "certificate-authority-data": ca}}],
        "users": [{"name": "operator", "user": {"token": token}}],
        "contexts": [{"name": "operator", "context": {"cluster": "test", "user": "operator", "namespace": namespace}}],
        "current-context": "operator"
    });
    std::fs::write(path, config.to_string()).unwrap();
}

async fn client_from(path: &Path) -> Client {
    let kubeconfig = Kubeconfig::read_from(path).unwrap();
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    Client::try_from(config).unwrap()
}

/// The operator as the chart runs it: the StatefulSet container's arguments
/// and environment (and nothing else), as a child process of the binary
/// under test, its output in `log`.
fn chart_operator(
    env: Vec<(String, String)>,
    args: Vec<String>,
    kubeconfig: &Path,
    log: PathBuf,
) -> Replica {
    let mut launch = Launch::new(binary()).env_clear();
    for (key, value) in env {
        launch = launch.env(key, value);
    }
    launch
        .env("KUBECONFIG", kubeconfig)
        .args(args)
        // No TLS listener in tests: random local ports, as elsewhere.
        .listen_any()
        .log_file(log)
        .spawn()
        .expect("start kms-operator")
}

#[tokio::test]
async fn scoped_install_syncs_in_its_namespace_and_is_refused_elsewhere() {
    let client = harness::client().await;
    let home = TestNamespace::new(&client, "helm-home").await;
    let team = TestNamespace::new(&client, "helm-team").await;
    let other = TestNamespace::new(&client, "helm-other").await;
    let kms = DevServer::start(&seed(&[("DB_PASSWORD", "s3cret"), ("API_KEY", "k-123")])).await;

    // Scoped to `team`. The documented workflow, with the release namespace
    // standing in for kms-operator-system (shared by every test): the user
    // applies kms-config there, the chart only grants reading it (a Role for
    // that one name; the operator does not watch the namespace otherwise).
    // The chart's own hostAPI, a dead port, is the default below it.
    let config: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "kms-config"},
        "data": {"hostAPI": kms.api()}
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(client.clone(), &home.name)
        .create(&PostParams::default(), &config)
        .await
        .expect("the user's kms-config");
    let name = home.name.clone();
    let mut release = Release::install(
        &name,
        &home.name,
        &json!({
            "installCRDs": false,
            "scopedRBAC": true,
            "scopedNamespaces": [team.name],
            "hostAPI": "http://127.0.0.1:9/api",
            "globalConfig": {"namespace": home.name},
            "replicaCount": 1
        }),
        &[],
    );
    assert!(
        release.manifest().find("ConfigMap", "kms-config").is_none(),
        "the chart renders a kms-config of its own"
    );
    release.armed = true;
    let manifest = release.manifest();
    let fullname = manifest
        .env_value("KMS_OPERATOR_LEASE_PREFIX")
        .expect("lease prefix");
    let pod = format!(
        "{}-0",
        manifest.statefulset()["metadata"]["name"].as_str().unwrap()
    );
    let sa = manifest.pod_spec()["serviceAccountName"]
        .as_str()
        .unwrap()
        .to_owned();

    // The ServiceAccount's token, as the kubelet would mount it.
    let request: TokenRequest =
        serde_json::from_value(json!({"spec": {"audiences": [], "expirationSeconds": 3600}}))
            .unwrap();
    let token = Api::<ServiceAccount>::namespaced(client.clone(), &home.name)
        .create_token_request(&sa, &PostParams::default(), &request)
        .await
        .expect("TokenRequest")
        .status
        .and_then(|s| s.token)
        .expect("token");
    let dir = TempDir::new("helm-scoped");
    let kubeconfig = dir.0.join("kubeconfig");
    token_kubeconfig(&kubeconfig, &token, &home.name);

    // The cache and its key, where the chart mounts them.
    let key_file = dir.0.join("key");
    std::fs::write(
        &key_file,
        cache_key(&client, &home.name, &format!("{fullname}-cache-key")).await,
    )
    .unwrap();
    let overrides = BTreeMap::from([
        (
            "KMS_OPERATOR_CACHE_DIR",
            dir.0.join("cache").display().to_string(),
        ),
        (
            "KMS_OPERATOR_CACHE_ENCRYPTION_KEY_FILE",
            key_file.display().to_string(),
        ),
    ]);
    let mut op = chart_operator(
        container_env(&manifest, &pod, &home.name, &overrides),
        strings(&manifest.container()["args"]),
        &kubeconfig,
        dir.0.join("operator.log"),
    );

    // The same resource in the watched namespace and in another one.
    for ns in [&team.name, &other.name] {
        let creds: Secret = serde_json::from_value(json!({
            "metadata": {"name": "kms-credentials"},
            "stringData": {"clientId": CLIENT_ID, "clientSecret": CLIENT_SECRET}
        }))
        .unwrap();
        Api::<Secret>::namespaced(client.clone(), ns)
            .create(&PostParams::default(), &creds)
            .await
            .unwrap();
        Api::<DynamicObject>::namespaced_with(client.clone(), ns, &kms_secret_resource())
            .create(&PostParams::default(), &kms_secret("app", "app-secret"))
            .await
            .unwrap();
    }

    let synced = wait_for(Duration::from_secs(30), || async {
        let s = Api::<Secret>::namespaced(client.clone(), &team.name)
            .get_opt("app-secret")
            .await
            .ok()??;
        let data = s.data?;
        (data.get("DB_PASSWORD")?.0 == b"s3cret" && data.get("API_KEY")?.0 == b"k-123")
            .then_some(())
    })
    .await;
    assert!(
        synced.is_some(),
        "not synced in the watched namespace; operator log:\n{}",
        op.log()
    );
    // The status names where the host came from; the user's ConfigMap is
    // untouched (the install did not take it over). The status follows the
    // Secret within the same reconcile, unless that reconcile stopped in
    // between (for instance the shard lost to a renewal a loaded API
    // server answered too late): then it comes with a later pass, so it
    // gets as long as the Secret did.
    let endpoint = wait_for(Duration::from_secs(30), || async {
        let o = Api::<DynamicObject>::namespaced_with(
            client.clone(),
            &team.name,
            &kms_secret_resource(),
        )
        .get("app")
        .await
        .ok()?;
        let conditions = o.data["status"]["conditions"].as_array()?.clone();
        conditions
            .iter()
            .find(|c| c["type"] == "secrets.hanzo.ai/Endpoint")
            .and_then(|c| c["message"].as_str().map(str::to_owned))
    })
    .await
    .unwrap_or_default();
    assert!(
        endpoint.contains(&format!("from kms-config ({}/kms-config)", home.name)),
        "Endpoint condition: {endpoint:?}; operator log:\n{}",
        op.log()
    );
    let config = Api::<ConfigMap>::namespaced(client.clone(), &home.name)
        .get("kms-config")
        .await
        .unwrap();
    assert!(
        !config
            .metadata
            .labels
            .unwrap_or_default()
            .contains_key("app.kubernetes.io/managed-by"),
        "the release took the user's kms-config over"
    );

    // Ready: the watches (including kms-config through its named-resource
    // Role) have listed.
    if let Err(e) = op.wait_ready(Duration::from_secs(20)).await {
        panic!("/readyz never succeeded: {e}");
    }

    // Shard Leases in the release namespace, named after the release, held by
    // the pod name from the downward API.
    let lease = Api::<Lease>::namespaced(client.clone(), &home.name)
        .get(&format!("{fullname}-shard-00"))
        .await
        .expect("shard Lease");
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some(pod.as_str())
    );

    // Nothing happens outside the watched namespace.
    let held = holds_for(Duration::from_secs(2), || async {
        Api::<Secret>::namespaced(client.clone(), &other.name)
            .get_opt("app-secret")
            .await
            .unwrap()
            .is_none()
    })
    .await;
    if let Err(when) = held {
        panic!("synced outside the watched namespace, {when}");
    }

    // And the token is refused there: a Secret write, a cluster-wide list,
    // Leases outside the release namespace.
    let as_operator = client_from(&kubeconfig).await;
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let probe: Secret = serde_json::from_value(json!({"metadata": {"name": "probe"}})).unwrap();
    Api::<Secret>::namespaced(as_operator.clone(), &team.name)
        .create(&dry_run, &probe)
        .await
        .expect("a Secret write in the watched namespace");
    let forbidden = |r: Result<_, kube::Error>, what: &str| match r {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        other => panic!("{what}: expected 403, got {other:?}"),
    };
    forbidden(
        Api::<Secret>::namespaced(as_operator.clone(), &other.name)
            .create(&dry_run, &probe)
            .await
            .map(drop),
        "Secret write in another namespace",
    );
    forbidden(
        Api::<Secret>::all(as_operator.clone())
            .list(&ListParams::default())
            .await
            .map(drop),
        "cluster-wide Secret list",
    );
    forbidden(
        Api::<Lease>::namespaced(as_operator.clone(), &team.name)
            .list(&ListParams::default())
            .await
            .map(drop),
        "Leases outside the release namespace",
    );
    forbidden(
        Api::<ConfigMap>::namespaced(as_operator.clone(), &home.name)
            .get_opt("other-config")
            .await
            .map(drop),
        "ConfigMaps of the release namespace other than kms-config",
    );

    // The operator itself was never refused anything.
    let log = op.log();
    assert!(
        !log.to_lowercase().contains("forbidden"),
        "the operator was refused access:\n{log}"
    );
    drop(op);
    release.uninstall();
}

/// Every alert the chart renders can have its `for:` set through
/// `telemetry.prometheusRule.for.<alert>`: the schema takes the name, and
/// the rule gets the duration.
#[test]
fn every_alert_takes_its_for_from_the_values() {
    let alerts = |r: &Rendered| -> Vec<(String, String)> {
        r.get("PrometheusRule", "kms-secrets-operator-alerts")["spec"]["groups"][0]["rules"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|x| {
                Some((
                    x["alert"].as_str()?.to_owned(),
                    x["for"].as_str()?.to_owned(),
                ))
            })
            .collect()
    };
    let on = json!({"telemetry": {"prometheusRule": {"enabled": true}}});
    let names: Vec<String> = alerts(&render("kms", "kms-operator-system", &on))
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert!(names.len() >= 6, "{names:?}");
    let durations: serde_json::Map<String, Value> =
        names.iter().map(|n| (n.clone(), json!("7m"))).collect();
    let values = json!({"telemetry": {"prometheusRule": {"enabled": true, "for": durations}}});
    // `helm template` checks the values against the schema first.
    for (name, duration) in alerts(&render("kms", "kms-operator-system", &values)) {
        assert_eq!(duration, "7m", "{name}");
    }
}

/// The alert rules as the chart renders them for release `kms` in
/// `kms-operator-system` (the PrometheusRule's `spec`: a Prometheus rules
/// file), committed as `tests/prometheus/rules.yaml` for promtool.
#[test]
fn the_committed_alert_rules_are_what_the_chart_renders() {
    let r = render(
        "kms",
        "kms-operator-system",
        &json!({"telemetry": {"prometheusRule": {"enabled": true}}}),
    );
    let rule = r
        .all("PrometheusRule")
        .into_iter()
        .next()
        .expect("a PrometheusRule")
        .clone();
    let rendered = &rule["spec"];
    let path = harness::repo().join("tests/prometheus/rules.yaml");
    if std::env::var_os("KMS_BLESS").is_some() {
        let text = format!(
            "# The chart's alert rules, rendered for release kms in kms-operator-system\n\
             # (scripts/generate.sh writes this file; a test checks it is current).\n{}",
            serde_saphyr::to_string(rendered).unwrap()
        );
        std::fs::write(&path, text).unwrap();
    }
    let committed: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
    .unwrap();
    assert_eq!(
        difference(&committed, rendered, ""),
        None,
        "tests/prometheus/rules.yaml is stale: run scripts/generate.sh"
    );
}

/// Every chart object the docs name as `<name>-…` (the release's full name,
/// `<release>-secrets-operator`) is one the chart renders, cluster-wide or
/// namespace-scoped, with the optional objects on; and no doc spells a name
/// `<release>-…` without the chart's name.
#[test]
fn the_names_the_docs_use_are_the_names_the_chart_renders() {
    let (release, fullname) = ("kms-operator", "kms-operator-secrets-operator");
    let mut rendered: BTreeSet<String> = BTreeSet::new();
    for values in [
        json!({"telemetry": {"serviceMonitor": {"enabled": true}, "prometheusRule": {"enabled": true}, "grafanaDashboard": {"enabled": true}}}),
        json!({"scopedRBAC": true, "scopedNamespaces": ["app"]}),
    ] {
        for d in render(release, "kms-operator-system", &values).docs {
            if let Some(name) = d["metadata"]["name"].as_str() {
                rendered.insert(name.to_owned());
            }
        }
    }
    // `<name>-shard-NN`, `<name>-member-<pod>`: Leases the operator makes.
    let uses = regex::Regex::new(r"<name>(-[a-z0-9-]*[a-z0-9])(-NN|-<)?").unwrap();
    let bare_release = regex::Regex::new(r"<release>-([a-z0-9-]+)").unwrap();
    let mut missing = Vec::new();
    let mut checked = 0;
    let docs = harness::repo().join("docs");
    let mut pages: Vec<PathBuf> = std::fs::read_dir(&docs)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.push(harness::repo().join("README.md"));
    for page in pages {
        let text = std::fs::read_to_string(&page).unwrap();
        let file = page.file_name().unwrap().to_string_lossy().into_owned();
        for c in uses.captures_iter(&text) {
            if c.get(2).is_some() {
                continue;
            }
            checked += 1;
            // Names are cut to 63 characters, as the chart cuts them.
            let name = format!("{fullname}{}", &c[1]);
            let name = name[..name.len().min(63)].trim_end_matches('-').to_owned();
            if !rendered.contains(&name) {
                missing.push(format!("{file}: <name>{} ({name} is not rendered)", &c[1]));
            }
        }
        for c in bare_release.captures_iter(&text) {
            if &c[1] != "secrets-operator" {
                missing.push(format!(
                    "{file}: <release>-{} (the chart's objects are <release>-secrets-operator-…)",
                    &c[1]
                ));
            }
        }
    }
    assert!(checked >= 8, "only {checked} names checked");
    assert!(
        missing.is_empty(),
        "names in the docs the chart does not render:\n{}\nrendered: {rendered:#?}",
        missing.join("\n")
    );
}

/// `commonLabelsOnCRDs` puts `commonLabels` on the CRDs; without it they
/// are exactly those of `crds/`.
#[test]
fn common_labels_reach_the_crds_only_when_asked() {
    let with = |on: bool| {
        render(
            "kms",
            "kms-system",
            &json!({"commonLabels": {"team": "platform"}, "commonLabelsOnCRDs": on}),
        )
    };
    for d in with(true).all("CustomResourceDefinition") {
        assert_eq!(
            d["metadata"]["labels"]["team"],
            "platform",
            "{}",
            describe(d)
        );
    }
    for d in with(false).all("CustomResourceDefinition") {
        assert!(d["metadata"]["labels"].is_null(), "{}", describe(d));
    }
}
