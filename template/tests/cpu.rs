//! How much CPU one resource's templates can take with the default limits
//! (a measurement, not a check: ignored by default). Each hostile template
//! is rendered as the entries of one resource, one after another within one
//! [`Budget`](kms_template::Budget), until the budget is spent (or 1,024
//! entries); the thread's CPU time (from `/proc/thread-self/schedstat`) is
//! reported with the fuel used.
//!
//! ```text
//! cargo test --release -p kms-template --test cpu -- --ignored --nocapture
//! ```

mod common;

use std::time::Duration;

use common::{data, openssl, run_openssl, scratch};
use kms_template::{Engine, SecretData};

/// The CPU time this thread has used.
fn cpu_time() -> Duration {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    let ns = text
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    Duration::from_nanos(ns)
}

/// Renders `source` as the entries of one resource until its budget is
/// spent: the CPU time, the fuel used and the entries rendered.
fn resource(engine: &Engine, source: &str, data: &SecretData) -> (Duration, u64, usize) {
    let mut budget = engine.budget();
    let start = cpu_time();
    let mut entries = 0;
    while entries < 1024 && budget.remaining() > 0 {
        let _ = engine.render_bytes_in("template.data.x", source, data, &mut budget);
        entries += 1;
    }
    (cpu_time() - start, budget.used(), entries)
}

fn base64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Bundles written by OpenSSL with these options (empty when there is no
/// openssl).
fn bundles() -> Vec<(String, String)> {
    if openssl().is_none() {
        return Vec::new();
    }
    let dir = scratch();
    run_openssl(
        &dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "k.pem",
            "-out",
            "c.pem",
            "-subj",
            "/CN=t",
            "-days",
            "1",
        ],
    );
    let mut out = Vec::new();
    for (name, extra) in [
        ("2048 iterations", vec!["-iter", "2048"]),
        ("100,000 iterations", vec!["-iter", "100000"]),
        ("1,000,000 iterations", vec!["-iter", "1000000"]),
        ("100,000 legacy", vec!["-iter", "100000", "-legacy"]),
        (
            "100,000 SHA-512 MAC",
            vec!["-iter", "100000", "-macalg", "sha512"],
        ),
        (
            "20,000 SHA-512 MAC",
            vec!["-iter", "20000", "-macalg", "sha512"],
        ),
    ] {
        let mut args = vec![
            "pkcs12", "-export", "-in", "c.pem", "-inkey", "k.pem", "-out", "b.p12", "-passout",
            "pass:pw",
        ];
        args.extend(extra);
        run_openssl(&dir, &args);
        out.push((
            name.to_owned(),
            base64(&std::fs::read(dir.join("b.p12")).unwrap()),
        ));
    }
    let _ = std::fs::remove_dir_all(&dir);
    out
}

const GO_DAG: &str = "{{ $a := list \"x\" }}{{ range until 40 }}{{ $a = list $a $a }}{{ end }}";
const JINJA_DAG: &str = "{% set ns = namespace(a=['x']) %}{% for i in range(40) %}{% set ns.a = [ns.a, ns.a] %}{% endfor %}";
const MIB: &str = "{{ $s := repeat 1048576 \"a\" }}";

#[test]
#[ignore]
fn worst_case_cpu_per_resource() {
    let engine = Engine::default();
    let mut cases: Vec<(String, String, SecretData)> = Vec::new();
    let mut add = |name: &str, source: String, data: SecretData| {
        cases.push((name.to_owned(), source, data));
    };
    let none = data(&[("A", "x")]);
    for (name, bundle) in bundles() {
        add(
            &format!("pkcs12certPass once, {name}"),
            "{{ pkcs12certPass \"pw\" (decodeBase64ToBytes .P12.Value) }}".into(),
            data(&[("P12", &bundle)]),
        );
        add(
            &format!("pkcs12certPass loop, {name}"),
            "{{ $b := decodeBase64ToBytes .P12.Value }}{{ range until 100000 }}{{ $_ := pkcs12certPass \"pw\" $b }}{{ end }}".into(),
            data(&[("P12", &bundle)]),
        );
    }
    add(
        "set (dict) of a 2^40 shared list",
        format!(
            "{GO_DAG}{{{{ range until 1000 }}}}{{{{ $_ := set (dict) \"k\" $a }}}}{{{{ end }}}}"
        ),
        none.clone(),
    );
    add(
        "deepEqual of two 2^40 shared lists",
        format!(
            "{GO_DAG}{{{{ $b := list \"x\" }}}}{{{{ range until 40 }}}}{{{{ $b = list $b $b }}}}{{{{ end }}}}{{{{ range until 1000 }}}}{{{{ $_ := deepEqual $a $b }}}}{{{{ end }}}}"
        ),
        none.clone(),
    );
    for f in ["toJson", "print", "toYaml", "deepCopy"] {
        add(
            &format!("Go {f} of a 2^40 shared list"),
            format!("{GO_DAG}{{{{ {f} $a }}}}"),
            none.clone(),
        );
    }
    add(
        "Go print of a 2^40 shared list",
        format!("{GO_DAG}{{{{ $a }}}}"),
        none.clone(),
    );
    for f in ["toJson(ns.a)", "lower(ns.a)", "ns.a", "ns.a | join(',')"] {
        add(
            &format!("Jinja {f}, 2^40 shared list"),
            format!("{JINJA_DAG}{{{{ {f} }}}}"),
            none.clone(),
        );
    }
    for (f, rest) in [
        ("sha512sum", ""),
        ("sha256sum", ""),
        ("upper", ""),
        ("b64enc", ""),
        ("adler32sum", ""),
        ("quote", ""),
    ] {
        add(
            &format!("{f} of 1 MiB, in a loop"),
            format!("{MIB}{{{{ range until 1000 }}}}{{{{ $_ := {f} $s{rest} }}}}{{{{ end }}}}"),
            none.clone(),
        );
    }
    add(
        "regexMatch over 1 MiB",
        format!(
            "{MIB}{{{{ range until 1000 }}}}{{{{ $_ := regexMatch \"(a|b)*c\" $s }}}}{{{{ end }}}}"
        ),
        none.clone(),
    );
    add(
        "regexMatch over 128 KiB, in a loop",
        "{{ $s := repeat 131072 \"a\" }}{{ range until 1000 }}{{ $_ := regexMatch \"(a|b)*c\" $s }}{{ end }}".into(),
        none.clone(),
    );
    add(
        "regexMatch [ab]*a[ab]{20} over 128 KiB, in a loop",
        "{{ $s := repeat 65536 \"ab\" }}{{ range until 1000 }}{{ $_ := regexMatch \"[ab]*a[ab]{20}c\" $s }}{{ end }}".into(),
        none.clone(),
    );
    add(
        "regexReplaceAll with captures, a match per byte",
        "{{ $s := repeat 20000 \"ab\" }}{{ range until 1000 }}{{ $_ := regexReplaceAll \"(a|b)\" $s \"${1}\" }}{{ end }}".into(),
        none.clone(),
    );
    add(
        "regexFindAll, a match per byte",
        "{{ $s := repeat 20000 \"a\" }}{{ range until 1000 }}{{ $_ := regexFindAll \"a\" $s -1 }}{{ end }}".into(),
        none.clone(),
    );
    add(
        "distinct Unicode regexes compiled",
        "{{ range $i := until 1000 }}{{ $_ := regexMatch (printf \"[\\\\w\\\\s]{1,%d}x\" (add 3 $i)) \"x\" }}{{ end }}".into(),
        none.clone(),
    );
    add(
        "printf %1048576d in a loop",
        "{{ range until 5000 }}{{ $_ := printf \"%1048576d\" 1 }}{{ end }}".into(),
        none.clone(),
    );
    add(
        "Go nested range",
        "{{ range until 100000 }}{{ range until 100000 }}{{ end }}{{ end }}".into(),
        none.clone(),
    );
    add(
        "Jinja nested for",
        "{% for i in range(100000) %}{% for j in range(100000) %}{% set x = j %}{% endfor %}{% endfor %}".into(),
        none.clone(),
    );
    add(
        "Jinja helper calls",
        "{% for i in range(100000) %}{% for j in range(100000) %}{% set x = upper('x') %}{% endfor %}{% endfor %}".into(),
        none.clone(),
    );
    add(
        "fromJson of 64 KiB of [0,0,…]",
        "{{ $j := printf \"[%s0]\" (repeat 32768 \"0,\") }}{{ range until 1000 }}{{ $_ := fromJson $j }}{{ end }}".into(),
        none.clone(),
    );
    add(
        "fromYaml of 64 KiB",
        "{{ $y := repeat 16384 \"- 0\\n\" }}{{ range until 1000 }}{{ $_ := fromYaml $y }}{{ end }}"
            .into(),
        none.clone(),
    );
    add(
        "append in a loop",
        "{{ $l := list }}{{ range until 100000 }}{{ $l = append $l 1 }}{{ end }}".into(),
        none.clone(),
    );
    add(
        "splitList of 64 KiB into characters",
        "{{ $s := repeat 65536 \"a\" }}{{ range until 1000 }}{{ $_ := splitList \"\" $s }}{{ end }}".into(),
        none.clone(),
    );
    for bits in [4096, 8192] {
        let dir = scratch();
        if openssl().is_none() {
            break;
        }
        run_openssl(
            &dir,
            &[
                "req",
                "-x509",
                "-newkey",
                &format!("rsa:{bits}"),
                "-nodes",
                "-keyout",
                "k.pem",
                "-out",
                "c.pem",
                "-subj",
                "/CN=t",
                "-days",
                "1",
            ],
        );
        let key = std::fs::read_to_string(dir.join("k.pem")).unwrap();
        let cert = std::fs::read_to_string(dir.join("c.pem")).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        add(
            &format!("pemToPkcs12, RSA {bits}, in a loop"),
            "{{ range until 1000 }}{{ $_ := pemToPkcs12 .C.Value .K.Value }}{{ end }}".into(),
            data(&[("C", &cert), ("K", &key)]),
        );
    }
    for curve in ["P-256", "P-384", "P-521"] {
        let dir = scratch();
        if openssl().is_none() {
            break;
        }
        run_openssl(
            &dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                &format!("ec_paramgen_curve:{curve}"),
                "-nodes",
                "-keyout",
                "k.pem",
                "-out",
                "c.pem",
                "-subj",
                "/CN=t",
                "-days",
                "1",
            ],
        );
        let key = std::fs::read_to_string(dir.join("k.pem")).unwrap();
        let cert = std::fs::read_to_string(dir.join("c.pem")).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        add(
            &format!("pemToPkcs12, {curve}, in a loop"),
            "{{ range until 1000 }}{{ $_ := pemToPkcs12 .C.Value .K.Value }}{{ end }}".into(),
            data(&[("C", &cert), ("K", &key)]),
        );
    }

    add(
        "a 60 KiB Jinja template (parsing)",
        "{{ A.Value }}{{ 1 }}".repeat(3000),
        none.clone(),
    );
    add(
        "a 60 KiB Go template (parsing)",
        "{{ .A.Value }}{{ 1 }}".repeat(3000),
        none.clone(),
    );
    add(
        "a 60 KiB template that looks like both",
        "{{ 1 }}{{ x }}".repeat(4000) + "{{",
        none.clone(),
    );
    add(
        "1 MiB of secret data, a tiny template",
        "{{ A.Value | length }}".into(),
        data(&[("A", &"x".repeat(1 << 20))]),
    );
    typical(&engine);
    let mut worst = (Duration::ZERO, String::new());
    println!(
        "{:<52} {:>9} {:>10} {:>8} {:>8}",
        "template (entries of one resource)", "CPU ms", "fuel", "ns/fuel", "entries"
    );
    for (name, source, data) in &cases {
        let (cpu, fuel, entries) = resource(&engine, source, data);
        println!(
            "{name:<52} {:>9.1} {fuel:>10} {:>8.0} {entries:>8}",
            cpu.as_secs_f64() * 1e3,
            cpu.as_nanos() as f64 / fuel.max(1) as f64,
        );
        if cpu > worst.0 {
            worst = (cpu, name.clone());
        }
    }
    println!(
        "worst: {:.1} ms CPU ({})",
        worst.0.as_secs_f64() * 1e3,
        worst.1
    );
}

/// A resource as users write them: a connection string, a TLS Secret from
/// a PKCS#12 bundle (OpenSSL's defaults), a JSON config, a Go template.
fn typical(engine: &Engine) {
    let Some((_, bundle)) = bundles().into_iter().next() else {
        return;
    };
    let d = data(&[
        ("DB_PASSWORD", "s3cret-password"),
        ("P12", &bundle),
        ("P12_PASSWORD", "pw"),
        ("API_KEY", "k-0123456789abcdef"),
    ]);
    let entries = [
        "postgres://app:{{ DB_PASSWORD.Value }}@db:5432/app",
        "{{ P12.Value | decodeBase64ToBytes | pkcs12certPass(P12_PASSWORD.Value) }}",
        "{{ P12.Value | decodeBase64ToBytes | pkcs12keyPass(P12_PASSWORD.Value) }}",
        "{{ P12.Value | decodeBase64ToBytes | pkcs12certPass(P12_PASSWORD.Value) | filterCertChain('leaf') }}",
        "{{ toJson(dict('apiKey', API_KEY.Value, 'db', DB_PASSWORD.Value)) }}",
        "{{ .API_KEY.Value | b64enc | quote }}",
        "{{ range $k, $v := . }}{{ $k }}={{ $v.SecretPath }}\n{{ end }}",
    ];
    let mut budget = engine.budget();
    let start = cpu_time();
    for source in entries {
        engine
            .render_bytes_in("template.data.x", source, &d, &mut budget)
            .unwrap();
    }
    println!(
        "a typical resource: {} entries, {:.2} ms CPU, {} fuel",
        entries.len(),
        (cpu_time() - start).as_secs_f64() * 1e3,
        budget.used()
    );
}
