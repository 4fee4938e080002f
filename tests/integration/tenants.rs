//! What one tenant (who may create resources in their own namespace) or a
//! hostile KMS could do to everyone else, each as a regression test on the
//! real API server: templates that would stall or crash a replica, a
//! template's `fail` message carrying a secret or a forged log line, a KMS
//! answer of hundreds of thousands of secrets under the pod's memory limit,
//! and slow clients on the health port. (A tenant borrowing another's cloud
//! identity is tested with the cloud methods, in `cloud_auth`.)

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::harness::{self, TestNamespace, events_of, wait_for};
use crate::kms_secret::{apply_cr, expect, wait_condition, wait_data};
use crate::kms_secret_extras::{cr, create_secret, scope};
use crate::security::{Fixture, fixture};
use crate::support::{CLIENT_ID, CLIENT_SECRET, DevServer, Operator, seed};

fn credentials() -> Value {
    json!({"clientId": CLIENT_ID, "clientSecret": CLIENT_SECRET})
}

fn universal() -> Value {
    json!({"universalAuth": {"credentialsRef": {"secretName": "kms-credentials"}, "secretsScope": scope()}})
}

/// A KmsSecret whose one target renders `templates` (key → template).
fn templated(name: &str, host: &str, target: &str, templates: &[(&str, String)]) -> Value {
    let mut cr = cr(name, host, target, universal());
    let data: BTreeMap<&str, &String> = templates.iter().map(|(k, v)| (*k, v)).collect();
    cr["spec"]["managedKubeSecretReferences"][0]["template"] =
        json!({"includeAllSecrets": false, "data": data});
    cr
}

fn hostile_file(name: &str) -> String {
    let path = harness::repo().join("tests/fixtures/hostile").join(name);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .to_owned()
}

/// Templates that cost a lot of CPU if nothing bounds them: key
/// derivations of a bundle exported with 1,000,000 and with 100,000 PBKDF2
/// iterations in a loop, a list of lists shared 2^40 times handed to `set`
/// and `deepEqual`, and hashing 1 MiB in a loop.
fn expensive_templates() -> Vec<(&'static str, String)> {
    let derive = |bundle: &str| {
        format!(
            "{{{{ $b := decodeBase64ToBytes \"{}\" }}}}{{{{ range $i := until 100000 }}}}\
             {{{{ $_ := pkcs12certPass \"pw\" $b }}}}{{{{ end }}}}",
            hostile_file(bundle)
        )
    };
    let mut shared = String::from("{{ $a := list 1 }}");
    for _ in 0..40 {
        shared.push_str("{{ $a = list $a $a }}");
    }
    let mut equal = shared.clone();
    shared.push_str("{{ $_ := set (dict) \"k\" $a }}done");
    equal.push_str("{{ deepEqual $a $a }}");
    vec![
        ("p1m", derive("pbkdf2-1m.p12.b64")),
        ("p100k", derive("pbkdf2-100k.p12.b64")),
        ("shared", shared),
        ("equal", equal),
        (
            "hash",
            "{{ $s := repeat 1048576 \"x\" }}{{ range $i := until 100000 }}{{ $_ := sha512sum $s }}{{ end }}"
                .to_owned(),
        ),
    ]
}

/// A plain KmsSecret `fine` in `ns` syncs (the replica goes on).
async fn still_syncs(client: &Client, ns: &str, kms: &DevServer) {
    apply_cr(client, ns, cr("fine", &kms.api(), "fine-out", universal())).await;
    wait_data(
        client,
        ns,
        "fine-out",
        &expect(&[("DB_PASSWORD", "s3cret")]),
        Duration::from_secs(30),
    )
    .await;
}

/// Wait `seconds` at most for `Ready=False` on KmsSecret `ns/name`:
/// (reason, message).
async fn not_ready(client: &Client, ns: &str, name: &str, seconds: u64) -> (String, String) {
    let (_, reason, message) = wait_condition(
        client,
        ns,
        name,
        "Ready",
        "False",
        Duration::from_secs(seconds),
    )
    .await;
    (reason, message)
}

/// The shard Leases of the operators in `ns`: name → (holder, renewTime).
async fn shard_leases(client: &Client, ns: &str) -> BTreeMap<String, (String, String)> {
    Api::<Lease>::namespaced(client.clone(), ns)
        .list(&Default::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|l| {
            let name = l.metadata.name?;
            let spec = l.spec?;
            name.contains("-shard-").then(|| {
                (
                    name,
                    (
                        spec.holder_identity.unwrap_or_default(),
                        spec.renew_time.map(|t| t.0.to_string()).unwrap_or_default(),
                    ),
                )
            })
        })
        .collect()
}

/// Two tenants' KmsSecrets whose templates would cost minutes of CPU each,
/// on a replica pinned to one CPU (as the chart's 500m limit gives it one
/// runtime thread): its Leases keep being renewed, another namespace's
/// changes arrive as fast as ever, the hostile resources get a condition
/// that names the problem, and SIGTERM releases the Leases within 6 s.
#[tokio::test]
#[ignore = "timing: run alone with `-- --ignored --test-threads=1`"]
async fn expensive_templates_stall_no_one() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "tenant-cpu").await;
    let victim = TestNamespace::new(&client, "tenant-victim").await;
    let kms = DevServer::start(&seed(&[("DB_PASSWORD", "v0")])).await;
    for n in [&ns.name, &victim.name] {
        create_secret(&client, n, "kms-credentials", credentials()).await;
    }
    let mut op = Operator::spawn_via(
        &["taskset", "-c", "0"],
        &ns.name,
        &[&ns.name, &victim.name],
        &[],
        &[],
    );
    op.ready().await;
    // The victim listens for changes (instant updates): a change reaches its
    // Secret in about a second when nothing holds the replica back.
    let mut app = cr("app", &kms.api(), "app-out", universal());
    app["spec"]["syncConfig"] = json!({"instantUpdates": true, "resyncInterval": "10m"});
    apply_cr(&client, &victim.name, app).await;
    wait_data(
        &client,
        &victim.name,
        "app-out",
        &expect(&[("DB_PASSWORD", "v0")]),
        Duration::from_secs(30),
    )
    .await;

    let templates = expensive_templates();
    for name in ["hostile-a", "hostile-b"] {
        apply_cr(
            &client,
            &ns.name,
            templated(name, &kms.api(), &format!("{name}-out"), &templates),
        )
        .await;
    }

    // For 30 s: every shard Lease renewed (renewTime changes) at least every
    // 6 s (the renewal period is 2 s, the Lease lasts 10 s), and each
    // change of the victim's secret in the KMS reaches its Secret.
    let started = Instant::now();
    let mut last_change: BTreeMap<String, (String, Instant)> = BTreeMap::new();
    let mut worst_gap = Duration::ZERO;
    let mut next_value = 1;
    let mut changed_at = Instant::now();
    let mut slowest_sync = Duration::ZERO;
    let mut pending = false;
    let data_api =
        Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), &victim.name);
    let mut every = kms_testkit::wait::every(Duration::from_millis(500));
    while started.elapsed() < Duration::from_secs(30) {
        let now = Instant::now();
        for (name, (_, renewed)) in shard_leases(&client, &ns.name).await {
            let entry = last_change
                .entry(name.clone())
                .or_insert((renewed.clone(), now));
            if entry.0 != renewed {
                *entry = (renewed, now);
            }
            worst_gap = worst_gap.max(now - entry.1);
        }
        if !pending {
            kms.set_secret("demo", "dev", "/", "DB_PASSWORD", &format!("v{next_value}"))
                .await;
            changed_at = Instant::now();
            pending = true;
        } else {
            let current = data_api
                .get_opt("app-out")
                .await
                .ok()
                .flatten()
                .and_then(|s| s.data)
                .and_then(|d| d.get("DB_PASSWORD").map(|v| v.0.clone()));
            if current.as_deref() == Some(format!("v{next_value}").as_bytes()) {
                slowest_sync = slowest_sync.max(changed_at.elapsed());
                next_value += 1;
                pending = false;
            } else {
                assert!(
                    changed_at.elapsed() < Duration::from_secs(10),
                    "the victim's change v{next_value} did not arrive within 10 s:\n{}",
                    op.output.text()
                );
            }
        }
        // The loop is the measurement: a Lease read and a Secret read every
        // half second (no event says "not renewed").
        every.tick().await;
    }
    assert!(!last_change.is_empty(), "no shard Lease in {}", ns.name);
    println!(
        "longest time without a Lease renewal: {worst_gap:?}; {} victim changes, slowest {slowest_sync:?}",
        next_value - 1
    );
    assert!(
        worst_gap < Duration::from_secs(6),
        "a shard Lease went {worst_gap:?} without renewal"
    );
    assert!(
        next_value > 3,
        "only {} victim changes synced",
        next_value - 1
    );

    for name in ["hostile-a", "hostile-b"] {
        let (reason, message) = not_ready(&client, &ns.name, name, 30).await;
        assert_eq!(reason, "TemplateError", "{name}: {message}");
        assert!(
            ["iterations", "fuel", "too expensive"]
                .iter()
                .any(|w| message.contains(w)),
            "{name}: {message}"
        );
    }

    // A stop releases the Leases within 6 s, renders running or not.
    let took = op.stop_within(Duration::from_secs(6));
    assert!(took.is_some(), "SIGTERM did not end the replica within 6 s");
    let held: Vec<_> = shard_leases(&client, &ns.name)
        .await
        .into_iter()
        .filter(|(_, (holder, _))| !holder.is_empty())
        .collect();
    assert!(held.is_empty(), "still held after the stop: {held:?}");
    println!("stopped in {took:?}");
}

/// A render that runs past `--render-timeout` is stopped and reported as
/// too expensive; the replica goes on.
#[tokio::test]
async fn a_render_past_its_deadline_is_stopped_and_named() {
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "tenant-deadline").await;
    let kms = DevServer::start(&seed(&[("DB_PASSWORD", "s3cret")])).await;
    create_secret(&client, &ns.name, "kms-credentials", credentials()).await;
    let _op = Operator::start(&ns.name, &[&ns.name], &["--render-timeout=50ms"]).await;
    // Six key derivations of 100,000 iterations each: far more than 50 ms.
    let derive = format!(
        "{{{{ pkcs12certPass \"pw\" (decodeBase64ToBytes \"{}\") | b64enc }}}}",
        hostile_file("pbkdf2-100k.p12.b64")
    );
    let templates: Vec<(&str, String)> = ["a", "b", "c", "d", "e", "f"]
        .into_iter()
        .map(|k| (k, derive.clone()))
        .collect();
    apply_cr(
        &client,
        &ns.name,
        templated("slow", &kms.api(), "slow-out", &templates),
    )
    .await;
    apply_cr(
        &client,
        &ns.name,
        cr("fine", &kms.api(), "fine-out", universal()),
    )
    .await;
    let (reason, message) = not_ready(&client, &ns.name, "slow", 30).await;
    assert_eq!(reason, "TemplateError", "{message}");
    assert!(message.contains("too expensive"), "{message}");
    assert!(message.contains("50ms"), "{message}");
    wait_data(
        &client,
        &ns.name,
        "fine-out",
        &expect(&[("DB_PASSWORD", "s3cret")]),
        Duration::from_secs(30),
    )
    .await;
}

/// Templates that ask for more memory than a pod has (`indent` of 10^11
/// spaces, `printf` widths, joins of huge lists, the printing of a list of
/// shared 1 MB strings): each fails with a TemplateError and the replica,
/// under the chart's 512 MiB limit, is not killed.
#[tokio::test]
async fn huge_allocations_fail_the_template_not_the_replica() {
    use kms_testkit::cgroup;
    if !cgroup::available() {
        println!("skipped: making a memory cgroup needs root");
        return;
    }
    let Fixture {
        client,
        ns,
        kms,
        op,
    } = fixture("tenant-mem", &[("DB_PASSWORD", "s3cret")]).await;
    let pid = op.pid().expect("running");
    let group = cgroup::Group::memory(&format!("kms-tenant-mem-{pid}"), pid, 512 << 20)
        .expect("a memory cgroup");
    let big = "{{ $m := repeat 1000000 \"x\" }}{{ $c := list $m $m $m $m $m $m $m $m }}\
               {{ range $i := until 6 }}{{ $c = list $c $c $c $c $c $c $c $c }}{{ end }}";
    let cases: Vec<(&str, String)> = vec![
        ("indent", "{{ indent 100000000000 \"x\" }}".into()),
        ("nindent", "{{ nindent 3000000000 \"x\" }}".into()),
        ("indentmax", "{{ indent 9223372036854775807 \"x\" }}".into()),
        (
            "printf",
            "{{ range $i := until 5000 }}{{ $_ := printf \"%1048576d\" 1 }}{{ end }}".into(),
        ),
        (
            "join",
            "{{ join (repeat 60000 \"x\") (until 100000) }}".into(),
        ),
        ("print", format!("{big}{{{{ $c }}}}")),
        ("json", format!("{big}{{{{ toJson $c }}}}")),
        ("quote", format!("{big}{{{{ quote $c }}}}")),
    ];
    for (i, (name, template)) in cases.iter().enumerate() {
        let resource = format!("mem-{i}");
        apply_cr(
            &client,
            &ns.name,
            templated(
                &resource,
                &kms.api(),
                &format!("{resource}-out"),
                &[(name, template.clone())],
            ),
        )
        .await;
    }
    for (i, (name, _)) in cases.iter().enumerate() {
        let (reason, message) = not_ready(&client, &ns.name, &format!("mem-{i}"), 60).await;
        assert_eq!(reason, "TemplateError", "{name}: {message}");
    }
    // Still the same process, never killed, and it still syncs.
    assert_eq!(op.pid(), Some(pid));
    assert_eq!(group.oom_kills(), 0, "the replica was OOM-killed");
    still_syncs(&client, &ns.name, &kms).await;
    println!(
        "peak memory of the replica: {} MiB",
        group.peak_memory() >> 20
    );
}

/// `fail` with a secret value in its message, or a line break: the value
/// is in no condition, Event or log line, and no log line is forged.
#[tokio::test]
async fn a_templates_fail_message_is_not_repeated() {
    let Fixture {
        client,
        ns,
        kms,
        op,
    } = fixture("tenant-fail", &[("DB_PASSWORD", "hunter2-value")]).await;
    let cases = [
        ("upper", "{{ fail (upper .DB_PASSWORD.Value) }}"),
        ("b64", "{{ .DB_PASSWORD.Value | b64enc | fail }}"),
        (
            "forged",
            "x\n{{ fail \"boom\\n2026-01-01T00:00:00Z  INFO forged line\" }}",
        ),
    ];
    for (name, template) in cases {
        apply_cr(
            &client,
            &ns.name,
            templated(
                name,
                &kms.api(),
                &format!("{name}-out"),
                &[("K", template.to_owned())],
            ),
        )
        .await;
    }
    for (name, _) in cases {
        let (reason, message) = not_ready(&client, &ns.name, name, 30).await;
        assert_eq!(reason, "TemplateError", "{name}: {message}");
        assert!(message.contains("called fail"), "{name}: {message}");
        let line = if name == "forged" { "line 2" } else { "line 1" };
        assert!(message.contains(line), "{name}: {message}");
    }
    let events = wait_for(Duration::from_secs(20), || async {
        let all: Vec<_> =
            futures::future::join_all(cases.iter().map(|(n, _)| events_of(&client, &ns.name, n)))
                .await
                .into_iter()
                .flatten()
                .collect();
        (all.len() >= cases.len()).then_some(all)
    })
    .await
    .expect("an Event per resource");
    let log = op.output.text();
    for secret in ["hunter2-value", "HUNTER2-VALUE", "aHVudGVyMi12YWx1ZQ=="] {
        assert!(!log.contains(secret), "{secret} is in the log");
        for (reason, note) in &events {
            assert!(!note.contains(secret), "{secret} in Event {reason}: {note}");
        }
    }
    // Nothing of the message reaches the log at all (a text log would
    // also escape it: see the `telemetry` unit test).
    assert!(
        !log.contains("forged line"),
        "the fail message is in the log:\n{log}"
    );
}

/// A hostile KMS answers every list with 541,761 tiny secrets (32.5 MB),
/// read by 8 KmsSecrets at once, under the chart's 512 MiB limit: the
/// replica is not killed, and each resource says the answer holds too many
/// secrets.
#[tokio::test]
async fn an_answer_of_too_many_secrets_is_refused_within_the_memory_limit() {
    use kms_testkit::cgroup;
    if !cgroup::available() {
        println!("skipped: making a memory cgroup needs root");
        return;
    }
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "tenant-kms-oom").await;
    let mut body = String::with_capacity(33 << 20);
    body.push_str("{\"secrets\":[");
    for i in 0..541_761 {
        if i > 0 {
            body.push(',');
        }
        body.push_str(&format!(
            "{{\"secretKey\":\"K{i}\",\"secretValue\":\"v\",\"type\":\"shared\"}}"
        ));
    }
    body.push_str("],\"imports\":[]}");
    let body: Arc<bytes::Bytes> = Arc::new(body.into());
    println!("answer: {} MB", body.len() / 1_000_000);
    let listed = body.clone();
    let hostile = crate::security::StandIn::start(
        move || {
            use axum::response::IntoResponse;
            (
                [(axum::http::header::CONTENT_TYPE, "application/json")],
                (*listed).clone(),
            )
                .into_response()
        },
        true,
    )
    .await;
    create_secret(&client, &ns.name, "kms-credentials", credentials()).await;
    let op = Operator::start(&ns.name, &[&ns.name], &[]).await;
    let pid = op.pid().expect("running");
    let group = cgroup::Group::memory(&format!("kms-tenant-kms-{pid}"), pid, 512 << 20)
        .expect("a memory cgroup");
    for i in 0..8 {
        let mut resource = cr(
            &format!("big-{i}"),
            &hostile.api(),
            &format!("big-{i}-out"),
            universal(),
        );
        resource["spec"]["authentication"]["universalAuth"]["secretsScope"]["secretsPath"] =
            json!(format!("/p{i}"));
        apply_cr(&client, &ns.name, resource).await;
    }
    for i in 0..8 {
        let (reason, message) = not_ready(&client, &ns.name, &format!("big-{i}"), 90).await;
        assert_eq!(reason, "KMSBadResponse", "{message}");
        assert!(message.contains("more than 10000 secrets"), "{message}");
    }
    assert_eq!(op.pid(), Some(pid), "the replica restarted");
    assert_eq!(group.oom_kills(), 0, "the replica was OOM-killed");
    let peak = group.peak_memory();
    println!(
        "peak memory with 8 answers of 541,761 secrets: {} MiB",
        peak >> 20
    );
    assert!(peak < 512 << 20, "peak {} MiB", peak >> 20);
}

/// 400 connections each sending 380 KiB of a request head that never
/// ends: the health port's memory stays small, the connections are closed
/// within seconds, and the probes are answered again as soon as they are.
#[tokio::test]
async fn slow_clients_on_the_health_port_hold_little_for_long() {
    use tokio::io::AsyncWriteExt;
    let client = harness::client().await;
    let ns = TestNamespace::new(&client, "tenant-slowloris").await;
    let op = Operator::start(&ns.name, &[&ns.name], &[]).await;
    let health = op.served().into_iter().next().expect("a health address");
    let pid = op.pid().expect("running");
    let rss = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    let before = rss(pid);
    let chunk = format!(
        "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: {}",
        "a".repeat(4096)
    );
    let mut attackers = Vec::new();
    for _ in 0..400 {
        let (health, chunk) = (health.clone(), chunk.clone());
        attackers.push(tokio::spawn(async move {
            let Ok(mut s) = tokio::net::TcpStream::connect(&health).await else {
                return 0usize;
            };
            let mut sent = 0;
            // 380 KiB of one header line, slowly; never the blank line.
            let mut every = kms_testkit::wait::every(Duration::from_millis(10));
            while sent < 380 * 1024 {
                if s.write_all(chunk.as_bytes()).await.is_err() {
                    break;
                }
                sent += chunk.len();
                every.tick().await;
            }
            // Hold the connection as long as the server lets it.
            let _ = tokio::time::timeout(Duration::from_secs(40), async {
                let mut buf = [0u8; 1024];
                use tokio::io::AsyncReadExt;
                while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
            })
            .await;
            sent
        }));
    }
    // While the attack runs, the peak stays small.
    let mut peak = 0;
    let t0 = Instant::now();
    let mut every = kms_testkit::wait::every(Duration::from_millis(200));
    while t0.elapsed() < Duration::from_secs(8) {
        peak = peak.max(rss(pid));
        every.tick().await;
    }
    // The connections are dropped by the server (head too large, or its
    // timeout), not held for the attackers' 40 s.
    let all_closed = tokio::time::timeout(
        Duration::from_secs(20),
        futures::future::join_all(attackers),
    )
    .await
    .is_ok();
    let http = reqwest::Client::new();
    let probe = http
        .get(format!("http://{health}/healthz"))
        .timeout(Duration::from_secs(2))
        .send()
        .await;
    println!(
        "RSS before {} MiB, peak during the attack {} MiB",
        before >> 20,
        peak >> 20
    );
    assert!(all_closed, "connections were held for the attackers' 40 s");
    assert!(
        probe.is_ok_and(|r| r.status().is_success()),
        "no probe answer after the attack"
    );
    assert!(
        peak < before + (64 << 20),
        "the attack grew RSS from {} to {} MiB",
        before >> 20,
        peak >> 20
    );
}
