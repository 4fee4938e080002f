//! Go templates beyond the differential corpus: the operator's own helpers
//! under Go syntax (checked against the behaviour the reference documents
//! and against the same helpers under Jinja syntax), binary output, secrets
//! kept out of errors, and the limits that stop hostile templates.

mod common;

use common::{data, engine, err, ok, pem_ders, pki};
use kms_template::{Engine, ErrorKind, Limits, SecretData, SecretEntry};

fn unb64(text: &str) -> Vec<u8> {
    use base64::Engine as _;
    let clean: String = text.split_whitespace().collect();
    base64::engine::general_purpose::STANDARD
        .decode(clean)
        .unwrap()
}

#[test]
fn pkcs12_readers_as_the_reference_samples_use_them() {
    let leaf = include_str!("vectors/leaf.crt");
    let root = include_str!("vectors/root.crt");
    for (file, password) in [
        (include_str!("vectors/legacy-rc2.p12.b64"), "legacy-pw"),
        (include_str!("vectors/legacy-3des.p12.b64"), "des-pw"),
    ] {
        let d = data(&[("P12", file), ("PW", password)]);
        // Go argument order: (pass, p12bytes); the piped value comes last.
        let certs = ok(
            "{{ .P12.Value | decodeBase64ToBytes | pkcs12certPass .PW.Value }}",
            &d,
        );
        assert_eq!(pem_ders(&certs), pem_ders(&format!("{leaf}{root}")));
        assert_eq!(
            certs,
            ok(
                "{{ pkcs12certPass(PW.Value, P12.Value | decodeBase64ToBytes) }}",
                &d
            )
        );
        let key = ok(
            "{{ pkcs12keyPass .PW.Value (decodeBase64ToBytes .P12.Value) }}",
            &d,
        );
        assert!(key.starts_with("-----BEGIN PRIVATE KEY-----\n"), "{key}");
        assert_eq!(
            key,
            ok(
                "{{ P12.Value | decodeBase64ToBytes | pkcs12keyPass(PW.Value) }}",
                &d
            )
        );
        let only_leaf = ok(
            "{{ .P12.Value | decodeBase64ToBytes | pkcs12certPass .PW.Value | filterCertChain \"leaf\" }}",
            &d,
        );
        assert_eq!(pem_ders(&only_leaf), pem_ders(leaf));
    }
}

#[test]
fn pkcs12_writers_and_readers_round_trip() {
    let pki = pki();
    let chain = format!(
        "{}{}{}",
        pki.leaf.cert, pki.intermediate.cert, pki.root.cert
    );
    let d = data(&[
        ("CRT", &pki.leaf.cert),
        ("KEY", &pki.leaf.key),
        ("CHAIN", &chain),
    ]);
    // The writers are deterministic, so Go and Jinja syntax give the same bytes.
    let p12 = ok("{{ pemToPkcs12 .CRT.Value .KEY.Value }}", &d);
    assert_eq!(p12, ok("{{ pemToPkcs12(CRT.Value, KEY.Value) }}", &d));
    let full = ok(
        "{{ fullPemToPkcs12Pass .CHAIN.Value .KEY.Value \"pw\" }}",
        &d,
    );
    assert_eq!(
        full,
        ok(
            "{{ fullPemToPkcs12Pass(CHAIN.Value, KEY.Value, 'pw') }}",
            &d
        )
    );
    assert_eq!(
        ok("{{ pemToPkcs12Pass .CRT.Value .KEY.Value \"pw\" }}", &d),
        ok("{{ pemToPkcs12Pass(CRT.Value, KEY.Value, 'pw') }}", &d)
    );
    assert_eq!(
        ok("{{ fullPemToPkcs12 .CHAIN.Value .KEY.Value }}", &d),
        ok("{{ fullPemToPkcs12(CHAIN.Value, KEY.Value) }}", &d)
    );
    let d = data(&[("P12", &p12), ("FULL", &full)]);
    let cert = ok("{{ .P12.Value | decodeBase64ToBytes | pkcs12cert }}", &d);
    assert_eq!(pem_ders(&cert), pem_ders(&pki.leaf.cert));
    let key = ok("{{ .P12.Value | decodeBase64ToBytes | pkcs12key }}", &d);
    assert!(key.starts_with("-----BEGIN PRIVATE KEY-----\n"), "{key}");
    // leaf → intermediate → root.
    let certs = ok(
        "{{ .FULL.Value | decodeBase64ToBytes | pkcs12certPass \"pw\" }}",
        &d,
    );
    assert_eq!(pem_ders(&certs), pem_ders(&chain));
    // A wrong password is a function error without the secret.
    let e = err(
        "{{ .FULL.Value | decodeBase64ToBytes | pkcs12certPass \"nope\" }}",
        &d,
    );
    assert_eq!(e.kind, ErrorKind::Function, "{e}");
    assert!(!e.to_string().contains(&full[..16]), "{e}");
}

#[test]
fn pem_filters() {
    let pki = pki();
    let bundle = format!("{}{}{}", pki.leaf.key, pki.leaf.cert, pki.root.cert);
    let chain = format!(
        "{}{}{}",
        pki.root.cert, pki.leaf.cert, pki.intermediate.cert
    );
    let d = data(&[("B", &bundle), ("C", &chain)]);
    let certs = ok("{{ filterPEM \"certificate\" .B.Value }}", &d);
    assert_eq!(
        pem_ders(&certs),
        pem_ders(&format!("{}{}", pki.leaf.cert, pki.root.cert))
    );
    assert_eq!(certs, ok("{{ B.Value | filterPEM('certificate') }}", &d));
    let key = ok("{{ .B.Value | filterPEM \"PRIVATE KEY\" }}", &d);
    assert_eq!(pem_ders(&key), pem_ders(&pki.leaf.key));
    for (which, cert) in [
        ("leaf", &pki.leaf.cert),
        ("intermediate", &pki.intermediate.cert),
        ("root", &pki.root.cert),
    ] {
        let out = ok(
            &format!("{{{{ .C.Value | filterCertChain \"{which}\" }}}}"),
            &d,
        );
        assert_eq!(pem_ders(&out), pem_ders(cert), "{which}");
    }
    let e = err("{{ filterPEM \"CERTIFICATE\" \"junk\" }}", &d);
    assert_eq!(e.kind, ErrorKind::Function, "{e}");
}

#[test]
fn jwk_and_encoding_helpers() {
    let jwk = r#"{"kty":"EC","crv":"P-256","x":"MKBCTNIcKUSDii11ySs3526iDZ8AiTo7Tu6KPAqv7D4","y":"4Etl6SRW2YiLUrN5vfvVHuhp7x8PxltmWWlbbM4IFyM","d":"870MB6gfuTJ4HtUnUvYMyJpr5eUZNP4Bk43bVdj3eAE"}"#;
    let d = data(&[
        ("J", jwk),
        ("A", "hello"),
        ("Y", "key: value\nlist:\n  - 1\n  - two"),
    ]);
    for f in ["jwkPublicKeyPem", "jwkPrivateKeyPem"] {
        let go = ok(&format!("{{{{ .J.Value | {f} }}}}"), &d);
        assert_eq!(go, ok(&format!("{{{{ J.Value | {f} }}}}"), &d));
        assert!(go.starts_with("-----BEGIN "), "{go}");
    }
    assert_eq!(ok("{{ encodeBase64 .A.Value }}", &d), "aGVsbG8=");
    assert_eq!(
        ok("{{ .A.Value | encodeBase64 | decodeBase64ToBytes }}", &d),
        "hello"
    );
    let e = err("{{ decodeBase64ToBytes .A.Value }}", &d);
    assert_eq!(e.kind, ErrorKind::Function, "{e}");
    assert!(e.message.contains("decodeBase64ToBytes"), "{e}");
    assert_eq!(ok("{{ (fromYaml .Y.Value).key }}", &d), "value");
    assert_eq!(ok("{{ index (fromYaml .Y.Value).list 1 }}", &d), "two");
    assert_eq!(
        ok("{{ toYaml (dict \"b\" (list 1 \"x\") \"a\" \"s\") }}", &d),
        ok("{{ toYaml(dict(b=[1, 'x'], a='s')) }}", &d)
    );
    // toYaml has no trailing newline.
    assert!(!ok("{{ toYaml (dict \"a\" 1) }}", &d).ends_with('\n'));
}

#[test]
fn binary_values_stay_bytes() {
    let raw = unb64(include_str!("vectors/legacy-3des.p12.b64"));
    let mut d = SecretData::new();
    d.insert("P12".into(), SecretEntry::new(raw.clone(), "/"));
    let e = engine();
    let out = e
        .render_bytes("f", "{{ .P12.Value | b64enc | decodeBase64ToBytes }}", &d)
        .unwrap();
    assert_eq!(out, raw);
    assert_eq!(
        e.render_bytes("f", "{{ .P12.Value }}", &d).unwrap(),
        raw,
        "a binary secret prints byte for byte"
    );
    let err = e.render("f", "{{ .P12.Value }}", &d).unwrap_err();
    assert_eq!(err.kind, ErrorKind::BinaryOutput);
    let certs = e
        .render(
            "f",
            "{{ .P12.Value | pkcs12certPass \"des-pw\" | filterCertChain \"leaf\" }}",
            &d,
        )
        .unwrap();
    assert_eq!(pem_ders(&certs), pem_ders(include_str!("vectors/leaf.crt")));
}

#[test]
fn secrets_stay_out_of_errors() {
    let d = data(&[
        ("PW", "hunter2-very-secret"),
        ("J", "{not json hunter2-very-secret"),
    ]);
    for source in [
        "{{ fail .PW.Value }}",
        "{{ mustFromJson .J.Value }}",
        "{{ .PW.Value | int | printf \"%s\" | fail }}",
        "{{ printf \"%s\" .PW.Value | fail }}",
        "{{ .PW.Value.Field }}",
        "{{ index .PW.Value 99 }}",
        "{{ upper (list .PW.Value) }}",
    ] {
        let e = err(source, &d);
        assert!(
            !e.to_string().contains("hunter2-very-secret"),
            "{source}: {e}"
        );
    }
}

fn limited(fuel: u64) -> Engine {
    Engine::new(Limits {
        fuel,
        ..Limits::default()
    })
}

#[test]
fn hostile_templates_are_stopped() {
    let d = data(&[("A", "x")]);
    let e = engine();
    let kind = |source: &str| e.render("f", source, &d).unwrap_err().kind;
    // Work.
    assert_eq!(
        kind("{{ range until 100000000 }}{{ end }}"),
        ErrorKind::OutOfFuel
    );
    assert_eq!(kind("{{ range 100000000 }}{{ end }}"), ErrorKind::OutOfFuel);
    assert_eq!(
        kind("{{ range until 5000 }}{{ range until 5000 }}{{ end }}{{ end }}"),
        ErrorKind::OutOfFuel
    );
    // Memory.
    assert_eq!(kind("{{ repeat 1000000000 \"x\" }}"), ErrorKind::OutOfFuel);
    assert_eq!(
        kind("{{ $s := \"xx\" }}{{ range until 64 }}{{ $s = print $s $s }}{{ end }}"),
        ErrorKind::OutOfFuel
    );
    assert_eq!(
        kind("{{ $l := list }}{{ range until 1000000 }}{{ $l = list $l }}{{ end }}"),
        ErrorKind::OutOfFuel
    );
    // Output.
    let out = e
        .render(
            "f",
            "{{ range until 100000 }}0123456789abcdef0123456789abcdef{{ end }}",
            &d,
        )
        .unwrap_err();
    assert!(
        matches!(out.kind, ErrorKind::OutputTooLarge | ErrorKind::OutOfFuel),
        "{out}"
    );
    // Recursion and nesting.
    let rec = "{{ define \"r\" }}{{ template \"r\" . }}{{ end }}{{ template \"r\" . }}";
    let r = e.render("f", rec, &d).unwrap_err();
    assert_eq!(r.kind, ErrorKind::Render, "{r}");
    assert!(r.message.contains("depth"), "{r}");
    let deep = format!("{{{{ {}1{} }}}}", "(".repeat(5000), ")".repeat(5000));
    assert_eq!(kind(&deep), ErrorKind::Syntax);
    let deep_if = format!("{}x{}", "{{ if 1 }}".repeat(1000), "{{ end }}".repeat(1000));
    assert_eq!(kind(&deep_if), ErrorKind::Syntax);
    // A map cannot be made to hold itself (it would never be freed).
    assert_eq!(
        kind("{{ $d := dict }}{{ $_ := set $d \"self\" $d }}"),
        ErrorKind::Function
    );
    // Size of the template.
    let big = "x".repeat(Limits::default().template_bytes + 1) + "{{ .A.Value }}";
    assert_eq!(kind(&big), ErrorKind::TemplateTooLarge);
    // A small fuel budget still renders the usual templates.
    let small = limited(2_000);
    assert_eq!(
        small
            .render(
                "f",
                "{{ .A.Value | b64enc | quote }}{{ range until 10 }}{{ . }}{{ end }}",
                &d
            )
            .unwrap(),
        "\"eA==\"0123456789"
    );
}

#[test]
fn never_panics_on_odd_input() {
    let d = data(&[("A", "x")]);
    let e = engine();
    let pieces = [
        "{{",
        "}}",
        "{{-",
        "-}}",
        " ",
        ".",
        "$",
        "$x",
        ":=",
        "=",
        "|",
        "(",
        ")",
        "\"",
        "`",
        "'",
        "é",
        "1",
        "-1",
        "0x",
        "1e",
        ".A",
        ".A.Value",
        "if",
        "else",
        "end",
        "range",
        "with",
        "define",
        "template",
        "block",
        "break",
        "continue",
        "nil",
        "true",
        "/*",
        "*/",
        ",",
        "index",
        "printf",
        "\"%d\"",
        "\n",
        "\u{10FFFE}",
        "len",
        "and",
        "or",
        "eq",
    ];
    // A deterministic walk over combinations of the pieces.
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..20_000 {
        let mut source = String::new();
        let n = 1 + (state % 12) as usize;
        for _ in 0..n {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            source.push_str(pieces[(state % pieces.len() as u64) as usize]);
        }
        let _ = e.render_go_bytes("f", &source, &d);
        let _ = e.render("f", &source, &d);
    }
}

#[test]
fn every_refused_function_is_documented() {
    let docs = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/templating.md"),
    )
    .unwrap();
    let section = &docs[docs
        .find("## Go templates")
        .expect("a Go templates section")..];
    for name in kms_template::go_refused_functions() {
        assert!(
            section.contains(&format!("`{name}`")),
            "{name} is refused but not listed in docs/templating.md"
        );
        let e = engine()
            .render_go_bytes("f", &format!("{{{{ {name} }}}}"), &data(&[]))
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::UnknownFunction, "{name}: {e}");
        assert!(e.message.contains(&format!("{name:?}")), "{name}: {e}");
    }
}

#[test]
fn quadratic_templates_are_stopped() {
    let d = data(&[("A", "x")]);
    let e = engine();
    let start = std::time::Instant::now();
    for source in [
        "{{ $l := list }}{{ range until 200000 }}{{ $l = append $l 1 }}{{ end }}",
        "{{ $l := until 100000 }}{{ range until 1000 }}{{ $_ := uniq $l }}{{ end }}",
        "{{ $s := repeat 100000 \"x\" }}{{ replace \"\" $s $s }}",
        "{{ $d := dict }}{{ range $i := until 200000 }}{{ $_ := set $d (toString $i) $i }}{{ end }}{{ range until 1000 }}{{ $_ := keys $d }}{{ end }}",
    ] {
        let err = e.render("f", source, &d).unwrap_err();
        assert_eq!(err.kind, ErrorKind::OutOfFuel, "{source}: {err}");
    }
    assert!(
        start.elapsed() < std::time::Duration::from_secs(20),
        "{:?}",
        start.elapsed()
    );
}
