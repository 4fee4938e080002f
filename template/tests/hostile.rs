//! Hostile templates: one tenant's template must not stall or crash the
//! operator. Each test is a template that once could (CPU: work that was
//! not charged; memory: sizes not checked before allocating; `fail` and
//! error messages echoing secret values), plus the resource budget and its
//! canceller. Every render here must end quickly with an error or a value:
//! a test that hangs fails at its deadline.

mod common;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::{data, engine, openssl, run_openssl, scratch};
use der::Encode;
use kms_template::{Engine, ErrorKind, Limits, SecretData, SecretEntry, TemplateError};

/// How long a hostile render may take in a debug build before the test
/// fails (these renders take milliseconds; unbounded, some would take
/// hours).
const DEADLINE: Duration = Duration::from_secs(20);

/// Runs `f` on a thread of its own and fails when it takes longer than
/// [`DEADLINE`].
fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(DEADLINE) {
        Ok(v) => v,
        Err(_) => panic!("{what}: still running after {DEADLINE:?}"),
    }
}

fn render(source: &str, data: SecretData) -> Result<String, TemplateError> {
    let source = source.to_owned();
    within(&source.clone(), move || {
        engine().render("template.data.x", &source, &data)
    })
}

fn kind(source: &str) -> ErrorKind {
    match render(source, data(&[("A", "x")])) {
        Ok(out) => panic!("{source}: rendered {} bytes", out.len()),
        Err(e) => e.kind,
    }
}

// ------------------------------------------------------------------- CPU

/// 40 levels of `list $a $a`: 2^40 nodes when expanded, 40 distinct lists.
const DAG: &str = "{{ $a := list \"x\" }}{{ range until 40 }}{{ $a = list $a $a }}{{ end }}";

#[test]
fn storing_a_shared_list_in_a_map_is_not_exponential() {
    let out = render(
        &format!("{DAG}{{{{ len (set (dict) \"k\" $a) }}}}"),
        data(&[]),
    );
    assert_eq!(out.unwrap(), "1");
    let out = render(
        &format!("{DAG}{{{{ $d := dict \"a\" $a }}}}{{{{ len (merge (dict) $d $d) }}}}"),
        data(&[]),
    );
    assert_eq!(out.unwrap(), "1");
}

#[test]
fn comparing_shared_lists_is_not_exponential() {
    let both = format!(
        "{DAG}{{{{ $b := list \"x\" }}}}{{{{ range until 40 }}}}{{{{ $b = list $b $b }}}}{{{{ end }}}}"
    );
    let out = render(&format!("{both}{{{{ deepEqual $a $b }}}}"), data(&[]));
    assert_eq!(out.unwrap(), "true");
    let out = render(&format!("{both}{{{{ has $a (list $b) }}}}"), data(&[]));
    assert_eq!(out.unwrap(), "true");
}

#[test]
fn walking_a_shared_list_runs_out_of_fuel_quickly() {
    for walk in [
        "{{ toJson $a }}",
        "{{ mustToJson $a }}",
        "{{ deepCopy $a }}",
        "{{ toString $a }}",
        "{{ quote $a }}",
        "{{ printf \"%v\" $a }}",
        "{{ toYaml $a }}",
        "{{ print $a }}",
    ] {
        let k = kind(&format!("{DAG}{walk}"));
        assert_eq!(k, ErrorKind::OutOfFuel, "{walk}");
    }
    let printed = kind(&format!("{DAG}{{{{ $a }}}}"));
    assert!(
        matches!(printed, ErrorKind::OutputTooLarge | ErrorKind::OutOfFuel),
        "{printed:?}"
    );
}

#[test]
fn hashing_is_charged_by_the_byte() {
    // Ten SHA-512 sums of 1 MiB cost more than a render's fuel (they were
    // free: 50,000 fit).
    let source =
        "{{ $s := repeat 1048576 \"x\" }}{{ range until 10 }}{{ $_ := sha512sum $s }}{{ end }}";
    assert_eq!(kind(source), ErrorKind::OutOfFuel);
    let source =
        "{{ $s := repeat 1048576 \"x\" }}{{ range until 20 }}{{ $_ := sha256sum $s }}{{ end }}";
    assert_eq!(kind(source), ErrorKind::OutOfFuel);
    // One is fine.
    let out = render("{{ repeat 1048576 \"x\" | sha512sum | len }}", data(&[]));
    assert_eq!(out.unwrap(), "128");
}

#[test]
fn regular_expressions_are_charged() {
    // A 1 MiB haystack searched 20 times, and every match of a pattern
    // that matches everywhere.
    let scan = "{{ $s := repeat 1048576 \"a\" }}{{ range until 20 }}{{ $_ := regexMatch \"b\" $s }}{{ end }}";
    assert_eq!(kind(scan), ErrorKind::OutOfFuel);
    let matches = "{{ $s := repeat 200000 \"a\" }}{{ regexFindAll \"a\" $s -1 | len }}";
    assert_eq!(kind(matches), ErrorKind::OutOfFuel);
    // Compiled once per render, not once per call.
    let cached = "{{ range until 200 }}{{ $_ := regexMatch \"^[a-z]+$\" \"abc\" }}{{ end }}ok";
    assert_eq!(render(cached, data(&[])).unwrap(), "ok");
}

/// A PKCS#12 bundle whose MAC asks for `iterations` (its content is empty):
/// enough for the reader to decide.
fn bundle_with_mac_iterations(iterations: i32) -> Vec<u8> {
    use der::asn1::OctetString;
    use pkcs12::cms::cert::x509::spki::AlgorithmIdentifierOwned;
    use pkcs12::cms::content_info::ContentInfo;
    use pkcs12::{AuthenticatedSafe, DigestInfo, MacData};
    let empty: AuthenticatedSafe = Vec::new();
    let safes = empty.to_der().unwrap();
    let pfx = pkcs12::pfx::Pfx {
        version: pkcs12::pfx::Version::V3,
        auth_safe: ContentInfo {
            content_type: der::asn1::ObjectIdentifier::new_unwrap("1.2.840.113549.1.7.1"),
            content: der::Any::encode_from(&OctetString::new(safes).unwrap()).unwrap(),
        },
        mac_data: Some(MacData {
            mac: DigestInfo {
                algorithm: AlgorithmIdentifierOwned {
                    oid: der::asn1::ObjectIdentifier::new_unwrap("2.16.840.1.101.3.4.2.1"),
                    parameters: None,
                },
                digest: OctetString::new(vec![0u8; 32]).unwrap(),
            },
            mac_salt: OctetString::new(vec![1u8; 8]).unwrap(),
            iterations,
        }),
    };
    pfx.to_der().unwrap()
}

fn base64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[test]
fn bundles_asking_for_too_many_iterations_are_refused_before_any_work() {
    let d = data(&[("P12", &base64(&bundle_with_mac_iterations(1_000_000)))]);
    let source = "{{ $b := decodeBase64ToBytes .P12.Value }}{{ range $i := until 100000 }}{{ $_ := pkcs12certPass \"pw\" $b }}{{ end }}";
    let start = Instant::now();
    let e = render(source, d.clone()).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Function, "{e}");
    assert!(e.message.contains("1000000"), "{e}");
    assert!(e.message.contains("-iter 2048"), "{e}");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    let e = render(
        "{{ pkcs12certPass(\"pw\", P12.Value | decodeBase64ToBytes) }}",
        d,
    )
    .unwrap_err();
    assert!(e.message.contains("1000000"), "{e}");
    // At the cap, the derivation is charged: it costs a good part of a
    // render's fuel, so a loop of them runs out.
    let d = data(&[("P12", &base64(&bundle_with_mac_iterations(100_000)))]);
    let e = render(
        "{{ $b := decodeBase64ToBytes .P12.Value }}{{ range until 100 }}{{ $_ := pkcs12certPass \"pw\" $b }}{{ end }}",
        d,
    )
    .unwrap_err();
    assert!(
        matches!(e.kind, ErrorKind::Function | ErrorKind::OutOfFuel),
        "{e}"
    );
}

#[test]
fn a_bundle_exported_with_a_million_iterations_is_refused() {
    if openssl().is_none() {
        println!("note: openssl not found; skipping");
        return;
    }
    let pki = common::pki();
    let dir = scratch();
    std::fs::write(dir.join("leaf.crt"), &pki.leaf.cert).unwrap();
    std::fs::write(dir.join("leaf.key"), &pki.leaf.key).unwrap();
    run_openssl(
        &dir,
        &[
            "pkcs12", "-export", "-in", "leaf.crt", "-inkey", "leaf.key", "-out", "b.p12",
            "-passout", "pass:pw", "-iter", "1000000",
        ],
    );
    let bundle = std::fs::read(dir.join("b.p12")).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let d = data(&[("P12", &base64(&bundle))]);
    let source = "{{ $b := decodeBase64ToBytes .P12.Value }}{{ range $i := until 100000 }}{{ $_ := pkcs12certPass \"pw\" $b }}{{ end }}";
    let start = Instant::now();
    let e = render(source, d).unwrap_err();
    assert!(e.message.contains("1000000"), "{e}");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
}

// ---------------------------------------------------------------- memory

#[test]
fn huge_sizes_run_out_of_fuel_before_allocating() {
    for source in [
        "{{ indent 100000000000 \"x\" }}",
        "{{ nindent 3000000000 \"x\" }}",
        "{{ indent 9223372036854775807 \"x\" }}",
        "{{ repeat 9223372036854775807 \"xy\" }}",
        "{{ range until 5000 }}{{ $_ := printf \"%1048576d\" 1 }}{{ end }}",
        "{{ join (repeat 60000 \"x\") (until 100000) }}",
        "{{ $s := repeat 1048576 \"x\" }}{{ regexReplaceAllLiteral \"\" $s (repeat 1000 \"y\") }}",
        "{{ $s := repeat 1048576 \"x\" }}{{ regexReplaceAll \"x\" $s \"$0$0$0$0$0$0$0$0\" }}",
        "{{ until 9223372036854775807 }}",
        "{{ untilStep -9223372036854775808 9223372036854775807 1 }}",
        "{{ seq 100000000000 }}",
        "{{ $s := repeat 1048576 \"x\" }}{{ range until 100 }}{{ $_ := upper $s }}{{ end }}",
        "{{ $l := list }}{{ range until 100000 }}{{ $l = append $l 1 }}{{ end }}",
        "{{ $s := repeat 1000000 \"a,\" }}{{ splitList \",\" $s | len }}",
    ] {
        assert_eq!(kind(source), ErrorKind::OutOfFuel, "{source}");
    }
}

/// A list holding eight 1 MiB strings, doubled ten times (shared, so
/// cheap to build): 8 GiB of text when printed.
const BIG_LIST: &str = "{{ $s := repeat 1048576 \"x\" }}{{ $c := list $s $s $s $s $s $s $s $s }}{{ range until 10 }}{{ $c = list $c $c }}{{ end }}";

#[test]
fn printing_stops_at_the_limit_instead_of_building_the_text() {
    assert_eq!(
        kind(&format!("{BIG_LIST}{{{{ $c }}}}")),
        ErrorKind::OutputTooLarge
    );
    for f in [
        "toJson",
        "toPrettyJson",
        "quote",
        "squote",
        "cat",
        "toString",
        "print",
        "println",
    ] {
        assert_eq!(
            kind(&format!("{BIG_LIST}{{{{ $_ := {f} $c }}}}")),
            ErrorKind::OutOfFuel,
            "{f}"
        );
    }
}

/// The same list in Jinja.
const BIG_LIST_JINJA: &str = "{% set s = 'x' * 1048576 %}{% set ns = namespace(c=[s, s, s, s]) %}{% for i in range(10) %}{% set ns.c = [ns.c, ns.c] %}{% endfor %}";

#[test]
fn helpers_stringify_through_a_bounded_writer() {
    for f in [
        "toJson",
        "toPrettyJson",
        "upper",
        "lower",
        "quote",
        "b64enc",
        "sha256sum",
        "toYaml",
        "join(',')",
    ] {
        let call = if f.contains('(') {
            format!("{{{{ ns.c | {f} }}}}")
        } else {
            format!("{{{{ {f}(ns.c) }}}}")
        };
        let e = render(&format!("{BIG_LIST_JINJA}{call}"), data(&[])).unwrap_err();
        assert!(
            matches!(e.kind, ErrorKind::OutOfFuel | ErrorKind::Function),
            "{f}: {e}"
        );
    }
}

#[test]
fn binary_values_count_towards_the_output_limit() {
    let mut d = SecretData::new();
    d.insert("B".into(), SecretEntry::new(vec![0xffu8; 64 * 1024], "/"));
    let source = "{% for i in range(100000) %}{{ B.Value }}{% endfor %}";
    let e = within("binary", move || engine().render_bytes("f", source, &d)).unwrap_err();
    assert!(
        matches!(e.kind, ErrorKind::OutputTooLarge | ErrorKind::OutOfFuel),
        "{e}"
    );
}

// ------------------------------------------------------ fail and messages

#[test]
fn fail_never_copies_its_message() {
    let secret = "hunter2-Very-Secret";
    let d = data(&[("DB_PASSWORD", secret)]);
    for (source, line) in [
        ("{{ fail (upper .DB_PASSWORD.Value) }}", 1),
        ("a\n{{ .DB_PASSWORD.Value | b64enc | fail }}", 2),
        ("a\nb\n{{ fail \"forged\\nlevel=info msg=ok\" }}", 3),
        ("{{ printf \"%s!\" .DB_PASSWORD.Value | fail }}", 1),
    ] {
        let e = render(source, d.clone()).unwrap_err();
        let shown = format!("{e} {e:?}");
        assert_eq!(e.kind, ErrorKind::Function, "{shown}");
        assert_eq!(e.line, Some(line), "{shown}");
        assert!(
            e.message
                .contains(&format!("the template called fail at line {line}")),
            "{shown}"
        );
        for leak in [
            secret.to_owned(),
            secret.to_uppercase(),
            base64(secret.as_bytes()),
            "forged".to_owned(),
        ] {
            assert!(!shown.contains(&leak), "{source}: {shown}");
        }
        assert!(!e.to_string().contains('\n'), "{shown}");
    }
}

#[test]
fn errors_describe_arguments_without_their_value() {
    let secret = "(Hunter2-Pattern";
    let pin = "987654321";
    let d = data(&[("A", secret), ("PIN", pin), ("J", "{\"a\": Hunter2}")]);
    for source in [
        "{{ mustRegexMatch .A.Value \"x\" }}",
        "{{ mustRegexMatch (upper .A.Value) \"x\" }}",
        "{{ regexFind (lower .A.Value) \"x\" }}",
        "{{ regexReplaceAll (lower .A.Value) \"x\" \"y\" }}",
        "{{ index . (upper .A.Value) }}",
        "{{ index (list 1 2) (atoi .PIN.Value) }}",
        "{{ index \"ab\" (atoi .PIN.Value) }}",
        "{{ slice (list 1 2) (atoi .PIN.Value) }}",
        "{{ substr (atoi .PIN.Value) 2 \"ab\" }}",
        "{{ range $a, $b := atoi .PIN.Value }}{{ end }}",
        "{{ mustFromJson .J.Value }}",
        "{{ fromYaml (upper .A.Value) }}",
        "{{ toJson (float64 .PIN.Value | mulf 1e308 | mulf 1e308) }}",
    ] {
        let result = render(source, d.clone());
        let Err(e) = result else {
            continue;
        };
        let shown = format!("{e} {e:?}");
        for leak in [secret, "HUNTER2", "hunter2", "Hunter2", pin] {
            assert!(!shown.contains(leak), "{source}: {shown}");
        }
    }
}

// ------------------------------------------------------- budget and cancel

#[test]
fn a_resource_budget_is_shared_by_all_its_renders() {
    let engine = engine();
    let d = data(&[("A", "x")]);
    // An entry that costs about a tenth of a render's fuel.
    let source = "{% for i in range(6000) %}{% set x = i %}{% endfor %}ok";
    let mut probe = engine.budget();
    engine.render_in("probe", source, &d, &mut probe).unwrap();
    let cost = probe.used();
    let fuel = engine.limits().fuel;
    assert!(
        cost > fuel / 20 && cost < fuel / 5,
        "one entry costs {cost} of {fuel}"
    );

    let mut budget = engine.budget();
    assert_eq!(budget.remaining(), 1_000_000);
    let (mut rendered, mut refused) = (0u64, 0);
    for i in 0..1024 {
        match engine.render_in(&format!("template.data.k{i}"), source, &d, &mut budget) {
            Ok(out) => {
                assert_eq!(refused, 0, "entry {i} rendered after one was refused");
                assert_eq!(out, "ok");
                rendered += 1;
            }
            Err(e) => {
                assert_eq!(e.kind, ErrorKind::OutOfFuel, "{e}");
                assert!(e.message.contains("out of fuel for this resource"), "{e}");
                refused += 1;
            }
        }
    }
    let most = 1_000_000 / cost;
    assert!(
        rendered == most || rendered + 1 == most,
        "{rendered} of {cost} each"
    );
    assert_eq!(budget.remaining(), 0);
    assert_eq!(budget.used(), 1_000_000);
    // Once spent, a render fails at once, even a trivial one.
    let e = engine.render_in("f", "x", &d, &mut budget).unwrap_err();
    assert!(e.message.contains("for this resource"), "{e}");
}

#[test]
fn go_renders_are_charged_to_the_budget_too() {
    let engine = engine();
    let d = data(&[("A", "x")]);
    let mut budget = engine.budget();
    let mut rendered = 0;
    while engine
        .render_in("f", "{{ range until 20000 }}{{ end }}", &d, &mut budget)
        .is_ok()
    {
        rendered += 1;
        assert!(rendered < 1024, "the budget never ran out");
    }
    assert!(rendered > 1, "{rendered}");
    assert_eq!(budget.remaining(), 0);
}

#[test]
fn the_default_renders_keep_a_budget_of_their_own() {
    let engine = engine();
    let d = data(&[("A", "x")]);
    for _ in 0..50 {
        engine
            .render("f", "{% for i in range(20000) %}{% endfor %}", &d)
            .unwrap();
    }
}

/// An engine whose renders would run for hours: only a canceller stops them.
fn unbounded() -> Engine {
    Engine::new(Limits {
        fuel: u64::MAX / 1024,
        resource_fuel: u64::MAX / 1024,
        ..Limits::default()
    })
}

/// Starts `source` in a thread with a budget, cancels it after 200 ms and
/// returns the error and how long the render took to stop.
fn cancel_running(source: &'static str) -> (TemplateError, Duration) {
    let engine = unbounded();
    let mut budget = engine.budget();
    let canceller = budget.canceller();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let result = engine.render_in("f", source, &data(&[("A", "x")]), &mut budget);
        let _ = tx.send((result, Instant::now()));
    });
    thread::sleep(Duration::from_millis(200));
    assert!(
        rx.try_recv().is_err(),
        "{source}: finished before it was cancelled"
    );
    let cancelled = Instant::now();
    canceller.cancel();
    let (result, stopped) = rx.recv_timeout(DEADLINE).expect("the render stops");
    (
        result.unwrap_err(),
        stopped.saturating_duration_since(cancelled),
    )
}

#[test]
fn a_cancelled_go_render_stops_promptly() {
    let (e, took) =
        cancel_running("{{ range until 100000 }}{{ range until 100000 }}{{ end }}{{ end }}");
    assert_eq!(e.kind, ErrorKind::Cancelled, "{e}");
    assert!(e.message.contains("too expensive"), "{e}");
    assert!(took < Duration::from_secs(2), "{took:?}");
}

#[test]
fn a_cancelled_jinja_render_calling_helpers_stops_promptly() {
    let (e, took) = cancel_running(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% set y = upper('x') %}{% endfor %}{% endfor %}",
    );
    assert_eq!(e.kind, ErrorKind::Cancelled, "{e}");
    assert!(took < Duration::from_secs(2), "{took:?}");
}

#[test]
fn a_cancelled_budget_refuses_the_next_render() {
    let engine = engine();
    let mut budget = engine.budget();
    let canceller = budget.canceller();
    assert!(!canceller.is_cancelled());
    canceller.clone().cancel();
    assert!(canceller.is_cancelled());
    for source in ["x", "{{ .A.Value }}", "{{ A.Value }}"] {
        let e = engine
            .render_in("f", source, &data(&[("A", "x")]), &mut budget)
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Cancelled, "{e}");
        assert_eq!(e.kind.as_str(), "cancelled");
    }
}
