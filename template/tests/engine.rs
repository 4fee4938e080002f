//! The engine: data model, strict mode, Go-syntax detection, limits, error
//! format and the rule that errors never show secret values.

mod common;

use common::{data, engine, err, ok, render};
use kms_template::{Engine, ErrorKind, Limits, SecretData, SecretEntry};

#[test]
fn engine_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Engine>();
}

#[test]
fn value_and_secret_path() {
    let mut d = SecretData::new();
    d.insert("DB_PASSWORD".into(), SecretEntry::new("pw", "/db"));
    assert_eq!(
        ok("{{ DB_PASSWORD.Value }}@{{ DB_PASSWORD.SecretPath }}", &d),
        "pw@/db"
    );
}

#[test]
fn secrets_map_reaches_any_key() {
    let d = data(&[("my-key", "a"), ("with.dot", "b"), ("X", "c")]);
    assert_eq!(
        ok(
            r#"{{ secrets["my-key"].Value }}{{ secrets["with.dot"].Value }}{{ secrets.X.Value }}"#,
            &d
        ),
        "abc"
    );
}

#[test]
fn a_secret_named_secrets_is_reached_through_the_map() {
    let d = data(&[("secrets", "inner"), ("other", "o")]);
    assert_eq!(
        ok(
            r#"{{ secrets["secrets"].Value }}/{{ secrets.other.Value }}"#,
            &d
        ),
        "inner/o"
    );
}

#[test]
fn undefined_is_an_error_naming_the_expression() {
    let d = data(&[("A", "1")]);
    let e = err("line one\n{{ MISSING.Value }}", &d);
    assert_eq!(e.kind, ErrorKind::Undefined);
    assert_eq!(e.line, Some(2));
    assert_eq!(e.column, Some(4), "{e}");
    assert!(e.message.contains("MISSING"), "{e}");
    assert_eq!(e.field, "template.data.test");
    assert!(
        e.to_string()
            .starts_with("template.data.test line 2, column 4: undefined value"),
        "{e}"
    );
}

#[test]
fn lowercase_fields_get_a_hint() {
    let d = data(&[("A", "1")]);
    let e = err("{{ A.value }}", &d);
    assert_eq!(e.kind, ErrorKind::Undefined);
    assert!(e.message.contains("`Value` and `SecretPath`"), "{e}");
}

#[test]
fn optional_secrets_with_is_defined() {
    let d = data(&[("A", "1")]);
    assert_eq!(
        ok(
            r#"{{ secrets.B.Value if secrets.B is defined else "none" }}|{% if "A" in secrets %}yes{% endif %}"#,
            &d
        ),
        "none|yes"
    );
}

#[test]
fn booleans_print_like_go_and_none_prints_nothing() {
    let d = data(&[]);
    assert_eq!(
        ok("{{ true }} {{ 1 == 2 }} [{{ none }}]", &d),
        "true false []"
    );
}

#[test]
fn no_autoescape() {
    let d = data(&[("A", "<a href=\"x\">&</a>")]);
    assert_eq!(ok("{{ A.Value }}", &d), "<a href=\"x\">&</a>");
}

#[test]
fn go_syntax_renders_with_go_semantics() {
    let d = data(&[("KEY", "v"), ("k", "w")]);
    for (source, want) in [
        ("{{ .KEY }}", "{v /}"),
        ("{{ .KEY.Value }}", "v"),
        ("{{- .KEY.SecretPath }}", "/"),
        ("{{ index . \"k\" }}", "{w /}"),
        ("{{ (index . \"k\").Value }}", "w"),
        ("{{ b64enc .KEY.Value }}", "dg=="),
        ("{{ .KEY.Value | b64enc }}", "dg=="),
        (
            "a\nb\n{{ range $k, $v := . }}{{ $k }}{{ end }}",
            "a\nb\nKEYk",
        ),
        ("{{ printf \"%s-%d\" \"x\" 3 }}", "x-3"),
        ("{{/* a comment */}}x", "x"),
    ] {
        assert!(engine().is_go_template(source), "{source}");
        assert_eq!(ok(source, &d), want, "{source}");
    }
    // A Go template that uses an unknown function fails when parsed.
    let e = err("a\nb\n{{ fn .A .B }}", &d);
    assert_eq!(e.kind, ErrorKind::UnknownFunction, "{e}");
    assert_eq!((e.line, e.column), (Some(3), Some(4)), "{e}");
    assert!(
        e.to_string()
            .starts_with("template.data.test line 3, column 4: "),
        "{e}"
    );
    // A missing key is an error, as documented (Go would print `<no value>`).
    let e = err("x\n{{ .MISSING.Value }}", &d);
    assert_eq!(e.kind, ErrorKind::Undefined, "{e}");
    assert_eq!(e.line, Some(2));
    assert!(e.message.contains("\"MISSING\""), "{e}");
    // Jinja templates stay Jinja.
    for source in [
        "{{ KEY.Value }}",
        "{{ secrets[\"k\"].Value }}",
        "{% if KEY %}y{% endif %}",
        "plain",
        "{{ KEY.Value | b64enc }}",
    ] {
        assert!(!engine().is_go_template(source), "{source}");
    }
    assert_eq!(ok("{{ secrets[\"k\"].Value }}", &d), "w");
}

#[test]
fn jinja_is_not_mistaken_for_go() {
    let d = data(&[("KEY", "v")]);
    assert_eq!(
        ok("{{ KEY.Value }} {{ \" .x \" }} {{ '{{ .KEY }}' }}", &d),
        "v  .x  {{ .KEY }}"
    );
    let e = err("{{ KEY.Value ", &d);
    assert_eq!(e.kind, ErrorKind::Syntax, "{e}");
}

#[test]
fn unknown_function_is_reported() {
    let e = err("{{ genPrivateKey(\"rsa\") }}", &data(&[]));
    assert_eq!(e.kind, ErrorKind::UnknownFunction, "{e}");
    let e = err("{{ 'x' | randAlphaNum }}", &data(&[]));
    assert_eq!(e.kind, ErrorKind::UnknownFunction, "{e}");
}

#[test]
fn no_debug_no_env_no_files() {
    let d = data(&[("A", "secret-value")]);
    for source in [
        "{{ debug() }}",
        "{{ env(\"HOME\") }}",
        "{{ expandenv(\"$HOME\") }}",
        "{{ now() }}",
        "{{ randAlphaNum(5) }}",
    ] {
        let e = err(source, &d);
        assert_eq!(e.kind, ErrorKind::UnknownFunction, "{source}: {e}");
    }
    for source in [
        "{% include \"x\" %}",
        "{% import \"x\" as y %}",
        "{% extends \"x\" %}",
    ] {
        assert!(render(source, &d).is_err(), "{source}");
    }
}

#[test]
fn template_size_limit() {
    let e = Engine::new(Limits {
        template_bytes: 10,
        ..Limits::default()
    })
    .render("f", "{{ 'more than ten bytes' }}", &data(&[]))
    .unwrap_err();
    assert_eq!(e.kind, ErrorKind::TemplateTooLarge);
    assert!(e.message.contains("limit of 10 bytes"), "{e}");
}

#[test]
fn fuel_stops_runaway_loops() {
    let d = data(&[]);
    for source in [
        "{% for i in range(100000) %}{% for j in range(100000) %}{{ j }}{% endfor %}{% endfor %}",
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
        "{{ 'x' * 100000000 }}",
    ] {
        let e = err(source, &d);
        assert_eq!(e.kind, ErrorKind::OutOfFuel, "{source}: {e}");
        assert!(e.message.contains("out of fuel"), "{e}");
    }
    // range itself refuses huge ranges
    let e = err("{% for i in range(100000000) %}{% endfor %}", &d);
    assert!(
        matches!(e.kind, ErrorKind::Render | ErrorKind::OutOfFuel),
        "{e}"
    );
}

#[test]
fn recursion_is_bounded() {
    let d = data(&[]);
    let e = err("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", &d);
    assert!(
        matches!(e.kind, ErrorKind::Render | ErrorKind::OutOfFuel),
        "{e}"
    );
}

#[test]
fn deep_values_do_not_overflow_the_stack() {
    let d = data(&[]);
    let source = "{% set ns = namespace(v=[]) %}{% for i in range(20000) %}{% set ns.v = [ns.v] %}{% endfor %}{{ toJson(ns.v) }}";
    let e = err(source, &d);
    assert!(
        matches!(e.kind, ErrorKind::Function | ErrorKind::OutOfFuel),
        "{e}"
    );
}

#[test]
fn output_size_limit() {
    let engine = Engine::new(Limits {
        output_bytes: 100,
        ..Limits::default()
    });
    let e = engine
        .render("f", "{% for i in range(50) %}abcd{% endfor %}", &data(&[]))
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::OutputTooLarge, "{e}");
    assert!(
        engine
            .render("f", "{% for i in range(20) %}abcd{% endfor %}", &data(&[]))
            .is_ok()
    );
}

#[test]
fn errors_never_show_secret_values() {
    let secret = "hunter2-very-secret";
    let d = data(&[("PW", secret), ("N", "12345678901234567890123")]);
    for source in [
        "{{ PW.Value | decodeBase64ToBytes }}",
        "{{ PW.Value | fromJson }}",
        r#"{{ (PW.Value ~ ": [") | fromYaml }}"#,
        "{{ filterPEM('CERTIFICATE', PW.Value) }}",
        "{{ PW.Value | pkcs12cert }}",
        "{{ PW.Value | jwkPublicKeyPem }}",
        "{{ PW.Value | int }}",
        "{{ PW.Value + 1 }}",
        "{{ PW.Value.foo.bar }}",
        "{{ PW.Value[PW.Value] }}",
        "{{ (PW.Value | length) // 0 }}",
        "{{ PW.Value | indent(PW.Value) }}",
        "{{ PW.Value | b64dec }}",
        "{{ range(PW.Value) }}",
        "{% for x in PW.Value %}{{ x.y }}{% endfor %}",
        "{{ PW.Value | join(',') | split | trimPrefix }}",
        "{{ dict(PW.Value) }}",
        "{{ PW.Value(1) }}",
        "{{ PW.Value is startingwith }}",
    ] {
        let e = err(source, &d);
        let shown = format!("{e} {e:?}");
        assert!(!shown.contains(secret), "{source}: {shown}");
        assert!(!shown.contains("hunter2"), "{source}: {shown}");
    }
}

#[test]
fn secret_entry_debug_is_redacted() {
    let entry = SecretEntry::new("topsecret", "/p");
    let shown = format!("{entry:?}");
    assert!(!shown.contains("topsecret"), "{shown}");
    assert!(shown.contains("/p"));
}

#[test]
fn check_parses_without_rendering() {
    let e = engine();
    assert!(e.check("f", "{{ A.Value | b64enc }}").is_ok());
    assert!(e.check("f", "{{ .A }}").is_ok());
    let err = e.check("f", "{{ .A | nosuch }}").unwrap_err();
    assert_eq!(err.kind, ErrorKind::UnknownFunction);
    let err = e.check("f", "{{ .A | randAlphaNum 3 }}").unwrap_err();
    assert_eq!(err.kind, ErrorKind::UnknownFunction);
    assert!(err.message.contains("\"randAlphaNum\""), "{err}");
    let err = e.check("f", "{{ if .A }}").unwrap_err();
    assert_eq!(err.kind, ErrorKind::Syntax);
    let err = e.check("f", "{% if %}").unwrap_err();
    assert_eq!(err.kind, ErrorKind::Syntax);
    assert_eq!(err.line, Some(1));
}

#[test]
fn binary_output() {
    let e = engine();
    let raw: Vec<u8> = vec![0x30, 0x82, 0xff, 0x00, 0xfe, b'A'];
    let b64 = base64_std(&raw);
    let d = data(&[("BIN", &b64)]);
    let out = e
        .render_bytes("f", "{{ BIN.Value | decodeBase64ToBytes }}", &d)
        .unwrap();
    assert_eq!(out, raw);
    let out = e
        .render_bytes("f", "<{{ BIN.Value | decodeBase64ToBytes }}>", &d)
        .unwrap();
    assert_eq!(out, [b"<".as_slice(), &raw, b">"].concat());
    let err = e
        .render("f", "{{ BIN.Value | decodeBase64ToBytes }}", &d)
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::BinaryOutput);
    // UTF-8 bytes render as text in both
    let d = data(&[("T", "aGVsbG8=")]);
    assert_eq!(
        e.render("f", "{{ T.Value | decodeBase64ToBytes }}", &d)
            .unwrap(),
        "hello"
    );
    // binary secret values reach the template as bytes
    let mut d = SecretData::new();
    d.insert("RAW".into(), SecretEntry::new(raw.clone(), "/"));
    assert_eq!(e.render_bytes("f", "{{ RAW.Value }}", &d).unwrap(), raw);
    assert_eq!(e.render("f", "{{ RAW.Value | b64enc }}", &d).unwrap(), b64);
    // reserved characters in the template are refused
    assert!(
        e.render("f", "\u{10FFFE}0\u{10FFFF}", &SecretData::new())
            .is_err()
    );
}

#[test]
fn each_render_is_independent_and_deterministic() {
    let e = engine();
    let d = data(&[("A", "1")]);
    let a = e.render("f", "{% set x = A.Value %}{{ x }}", &d).unwrap();
    let b = e.render("g", "{{ x is defined }}", &d).unwrap();
    assert_eq!((a.as_str(), b.as_str()), ("1", "false"));
}

fn base64_std(data: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(data)
}
