//! The Sprig-style helpers and the encoding helpers, in function form and in
//! filter form (the piped value is the last argument).

mod common;

use common::{data, err, ok};
use kms_template::{ErrorKind, helper_names};

/// Renders `function` and `filter` and checks both give `expected`.
fn both(function: &str, filter: &str, expected: &str) {
    let d = data(&[("A", "abc"), ("J", r#"{"b": 2, "a": [1, "x<y"]}"#)]);
    assert_eq!(ok(function, &d), expected, "function form {function}");
    assert_eq!(ok(filter, &d), expected, "filter form {filter}");
}

#[test]
fn every_documented_helper_is_registered() {
    let names = helper_names();
    for name in [
        "decodeBase64ToBytes",
        "encodeBase64",
        "pkcs12key",
        "pkcs12keyPass",
        "pkcs12cert",
        "pkcs12certPass",
        "pemToPkcs12",
        "pemToPkcs12Pass",
        "fullPemToPkcs12",
        "fullPemToPkcs12Pass",
        "filterPEM",
        "filterCertChain",
        "jwkPublicKeyPem",
        "jwkPrivateKeyPem",
        "toYaml",
        "fromYaml",
        "b64enc",
        "b64dec",
        "upper",
        "lower",
        "trim",
        "trimPrefix",
        "trimSuffix",
        "replace",
        "quote",
        "squote",
        "indent",
        "nindent",
        "default",
        "toJson",
        "fromJson",
        "toPrettyJson",
        "sha256sum",
        "sha1sum",
        "contains",
        "hasPrefix",
        "hasSuffix",
        "split",
        "join",
        "dict",
        "get",
        "hasKey",
        "keys",
    ] {
        assert!(names.contains(&name), "{name} is missing");
    }
    let docs = include_str!("../../docs/templating.md");
    for name in names {
        assert!(
            docs.contains(&format!("`{name}")),
            "{name} is not documented"
        );
    }
}

#[test]
fn base64() {
    both("{{ b64enc(A.Value) }}", "{{ A.Value | b64enc }}", "YWJj");
    both(
        "{{ encodeBase64(A.Value) }}",
        "{{ A.Value | encodeBase64 }}",
        "YWJj",
    );
    both("{{ b64dec('YWJj') }}", "{{ 'YWJj' | b64dec }}", "abc");
    both(
        "{{ decodeBase64ToBytes('YWJj') }}",
        "{{ 'YWJj' | decodeBase64ToBytes }}",
        "abc",
    );
    // padding optional, line breaks ignored
    let e = err("{{ 'not base64!' | b64dec }}", &data(&[]));
    assert_eq!(e.kind, ErrorKind::Function);
    assert!(!e.message.contains("not base64!"), "{e}");
}

#[test]
fn base64_padding_and_wrapping() {
    let d = data(&[]);
    assert_eq!(ok("{{ 'YWI' | b64dec }}", &d), "ab");
    assert_eq!(ok("{{ 'YW\nJj' | b64dec }}", &d), "abc");
}

#[test]
fn hashes() {
    both(
        "{{ sha256sum(A.Value) }}",
        "{{ A.Value | sha256sum }}",
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
    );
    both(
        "{{ sha1sum(A.Value) }}",
        "{{ A.Value | sha1sum }}",
        "a9993e364706816aba3e25717850c26c9cd0d89d",
    );
}

#[test]
fn case_and_trim() {
    both("{{ upper(A.Value) }}", "{{ A.Value | upper }}", "ABC");
    both("{{ lower('ÀBC') }}", "{{ 'ÀBC' | lower }}", "àbc");
    both("{{ trim('  x \n') }}", "{{ '  x \n' | trim }}", "x");
    both(
        "{{ trimPrefix('a', A.Value) }}",
        "{{ A.Value | trimPrefix('a') }}",
        "bc",
    );
    both(
        "{{ trimSuffix('c', A.Value) }}",
        "{{ A.Value | trimSuffix('c') }}",
        "ab",
    );
    both(
        "{{ trimPrefix('z', A.Value) }}",
        "{{ A.Value | trimPrefix('z') }}",
        "abc",
    );
}

#[test]
fn replace_contains_prefix_suffix() {
    both(
        "{{ replace('b', 'BB', A.Value) }}",
        "{{ A.Value | replace('b', 'BB') }}",
        "aBBc",
    );
    both(
        "{{ contains('bc', A.Value) }}",
        "{{ A.Value | contains('bc') }}",
        "true",
    );
    both(
        "{{ contains('x', A.Value) }}",
        "{{ A.Value | contains('x') }}",
        "false",
    );
    both(
        "{{ hasPrefix('ab', A.Value) }}",
        "{{ A.Value | hasPrefix('ab') }}",
        "true",
    );
    both(
        "{{ hasSuffix('ab', A.Value) }}",
        "{{ A.Value | hasSuffix('ab') }}",
        "false",
    );
}

#[test]
fn quoting() {
    both("{{ quote(A.Value) }}", "{{ A.Value | quote }}", "\"abc\"");
    both("{{ squote(A.Value) }}", "{{ A.Value | squote }}", "'abc'");
    let d = data(&[]);
    assert_eq!(
        ok("{{ quote('a\"b\\\\c\\n\\t') }}", &d),
        "\"a\\\"b\\\\c\\n\\t\""
    );
    assert_eq!(
        ok("{{ quote('a', none, 1, true) }}", &d),
        "\"a\" \"1\" \"true\""
    );
    assert_eq!(ok("{{ quote('\u{1}é') }}", &d), "\"\\x01é\"");
}

#[test]
fn indentation_is_sprigs() {
    both(
        "{{ indent(2, 'a\nb') }}",
        "{{ 'a\nb' | indent(2) }}",
        "  a\n  b",
    );
    both(
        "{{ nindent(2, 'a\nb') }}",
        "{{ 'a\nb' | nindent(2) }}",
        "\n  a\n  b",
    );
    let e = err("{{ 'a' | indent(100000) }}", &data(&[]));
    assert_eq!(e.kind, ErrorKind::Function);
}

#[test]
fn default_uses_sprig_emptiness() {
    let d = data(&[("E", ""), ("A", "abc")]);
    for (given, expected) in [
        ("E.Value", "dflt"),
        ("A.Value", "abc"),
        ("0", "dflt"),
        ("false", "dflt"),
        ("none", "dflt"),
        ("[]", "dflt"),
        ("{}", "dflt"),
        ("secrets.MISSING", "dflt"),
        ("1", "1"),
    ] {
        assert_eq!(
            ok(&format!("{{{{ default('dflt', {given}) }}}}"), &d),
            expected,
            "{given}"
        );
        assert_eq!(
            ok(&format!("{{{{ {given} | default('dflt') }}}}"), &d),
            expected,
            "{given}"
        );
        assert_eq!(
            ok(&format!("{{{{ {given} | d('dflt') }}}}"), &d),
            expected,
            "{given}"
        );
    }
}

#[test]
fn split_and_join() {
    both(
        "{{ join('-', split(',', 'a,b,c')) }}",
        "{{ 'a,b,c' | split(',') | join('-') }}",
        "a-b-c",
    );
    both(
        "{{ split(',', 'a,b,c')[1] }}",
        "{{ ('a,b,c' | split(','))[1] }}",
        "b",
    );
    both(
        "{{ join(',', [1, none, 'x']) }}",
        "{{ [1, none, 'x'] | join(',') }}",
        "1,x",
    );
    both("{{ join(',', 'abc') }}", "{{ 'abc' | join(',') }}", "abc");
    both(
        "{{ splitList(',', 'a,b') | length }}",
        "{{ 'a  b' | split | length }}",
        "2",
    );
}

#[test]
fn dicts() {
    both(
        "{{ get(dict('k', 'v'), 'k') }}",
        "{{ 'k' | get(dict('k', 'v')) }}",
        "v",
    );
    // either order is accepted for get/hasKey: the map is recognisable
    both(
        "{{ get('k', dict('k', 'v')) }}",
        "{{ dict('k', 'v') | get('k') }}",
        "v",
    );
    both(
        "{{ get(dict('k', 'v'), 'x') }}",
        "{{ dict('k', 'v') | get('x') }}",
        "",
    );
    both(
        "{{ hasKey(dict('k', 'v'), 'k') }}",
        "{{ dict('k', 'v') | hasKey('k') }}",
        "true",
    );
    both(
        "{{ hasKey(secrets, 'A') }}",
        "{{ 'A' | hasKey(secrets) }}",
        "true",
    );
    both(
        "{{ keys(dict('b', 1, 'a', 2)) | join(',') }}",
        "{{ dict('b', 1, 'a', 2) | keys | join(',') }}",
        "a,b",
    );
    both(
        "{{ dict(a=1, b=2) | toJson }}",
        "{{ dict('a', 1, 'b', 2) | toJson }}",
        r#"{"a":1,"b":2}"#,
    );
    both(
        "{{ get(secrets, 'A').Value }}",
        "{{ (secrets | get('A')).Value }}",
        "abc",
    );
    let e = err("{{ dict('a') }}", &data(&[]));
    assert_eq!(e.kind, ErrorKind::Function);
}

#[test]
fn json() {
    both(
        "{{ toJson(fromJson(J.Value)) }}",
        "{{ J.Value | fromJson | toJson }}",
        r#"{"a":[1,"x\u003cy"],"b":2}"#,
    );
    both(
        "{{ toRawJson(fromJson(J.Value)) }}",
        "{{ J.Value | fromJson | toRawJson }}",
        r#"{"a":[1,"x<y"],"b":2}"#,
    );
    both(
        "{{ toPrettyJson(dict('a', [1, 2], 'b', dict())) }}",
        "{{ dict('a', [1, 2], 'b', dict()) | toPrettyJson }}",
        "{\n  \"a\": [\n    1,\n    2\n  ],\n  \"b\": {}\n}",
    );
    both(
        "{{ fromJson(J.Value).a[1] }}",
        "{{ (J.Value | fromJson).a[1] }}",
        "x<y",
    );
    let e = err("{{ '{\"a\": ' | fromJson }}", &data(&[]));
    assert_eq!(e.kind, ErrorKind::Function);
    let e = err("{{ fromJson('[' * 200 ~ ']' * 200) }}", &data(&[]));
    assert_eq!(e.kind, ErrorKind::Function, "{e}");
}

#[test]
fn yaml() {
    both(
        "{{ toYaml(dict('a', 1, 'b', ['x', 'y'])) }}",
        "{{ dict('a', 1, 'b', ['x', 'y']) | toYaml }}",
        "a: 1\nb:\n- x\n- \"y\"",
    );
    both(
        "{{ fromYaml('a: 1\nb: [v, w]').b[1] }}",
        "{{ ('a: 1\nb: [v, w]' | fromYaml).b[1] }}",
        "w",
    );
    both(
        "{{ toYaml(fromYaml('k: v')) }}",
        "{{ 'k: v' | fromYaml | toYaml }}",
        "k: v",
    );
    let e = err("{{ 'a: [' | fromYaml }}", &data(&[]));
    assert_eq!(e.kind, ErrorKind::Function);
    // a YAML bomb is refused by the parser budget
    let bomb = "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\ne: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]\ng: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]\n";
    let d = data(&[("BOMB", bomb)]);
    assert!(common::render("{{ BOMB.Value | fromYaml | toJson | length }}", &d).is_err());
}

#[test]
fn wrong_arity_names_the_helper() {
    let e = err("{{ trimPrefix('a') }}", &data(&[]));
    assert_eq!(e.kind, ErrorKind::Function);
    assert!(
        e.message.starts_with("trimPrefix: expects 2 arguments"),
        "{e}"
    );
}
