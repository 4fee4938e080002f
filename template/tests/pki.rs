//! Certificates and keys: PKCS#12 readers and writers (round trips,
//! OpenSSL interop, legacy bundles), filterPEM, filterCertChain.

mod common;

use common::{
    data, engine, err, ok, openssl, pem_ders, pki, pki_with_leaf_key, run_openssl, scratch,
};
use kms_template::{ErrorKind, SecretData, SecretEntry};
use p256::pkcs8::DecodePrivateKey;

fn b64(data: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(data)
}

fn unb64(text: &str) -> Vec<u8> {
    use base64::Engine as _;
    let clean: String = text.split_whitespace().collect();
    base64::engine::general_purpose::STANDARD
        .decode(clean)
        .unwrap()
}

fn der(pem_text: &str) -> Vec<u8> {
    pem_ders(pem_text).remove(0)
}

fn secrets(pairs: &[(&str, &str)]) -> SecretData {
    data(pairs)
}

/// Checks what our reader read against an independent reader,
/// `p12-keystore`: the same key, byte for byte, and the same certificates.
fn agrees_with_p12_keystore(bundle: &[u8], password: &str, key_pem: &str, certs_pem: &str) {
    let theirs = p12_keystore::Pkcs12Archive::from_pkcs12(bundle, password).unwrap();
    assert_eq!(theirs.keys.len(), 1);
    assert_eq!(der(key_pem), theirs.keys[0].key.as_der());
    let mut ours = pem_ders(certs_pem);
    let mut their_certs: Vec<Vec<u8>> = theirs
        .certs
        .iter()
        .map(|c| c.cert.as_der().to_vec())
        .collect();
    ours.sort();
    their_certs.sort();
    their_certs.dedup();
    assert_eq!(ours, their_certs);
}

/// The P-256 scalar of a PKCS#8 PEM key (to compare keys across encodings).
fn p256_scalar(key_pem: &str) -> Vec<u8> {
    p256::SecretKey::from_pkcs8_pem(key_pem)
        .unwrap()
        .to_bytes()
        .to_vec()
}

#[test]
fn pem_to_pkcs12_round_trip_without_password() {
    let pki = pki();
    let d = secrets(&[("CRT", &pki.leaf.cert), ("KEY", &pki.leaf.key)]);
    let p12 = ok("{{ pemToPkcs12(CRT.Value, KEY.Value) }}", &d);
    let d = secrets(&[("P12", &p12)]);
    let cert = ok("{{ P12.Value | decodeBase64ToBytes | pkcs12cert }}", &d);
    assert_eq!(pem_ders(&cert), vec![der(&pki.leaf.cert)]);
    assert!(cert.ends_with("-----END CERTIFICATE-----\n"));
    let key = ok("{{ P12.Value | decodeBase64ToBytes | pkcs12key }}", &d);
    assert!(key.starts_with("-----BEGIN PRIVATE KEY-----\n"));
    assert_eq!(p256_scalar(&key), p256_scalar(&pki.leaf.key));
    agrees_with_p12_keystore(&unb64(&p12), "", &key, &cert);
}

#[test]
fn full_pem_to_pkcs12_with_password_keeps_the_chain_in_order() {
    let pki = pki();
    let chain = format!(
        "{}{}{}",
        pki.leaf.cert, pki.intermediate.cert, pki.root.cert
    );
    let d = secrets(&[
        ("CHAIN", &chain),
        ("KEY", &pki.leaf.key),
        ("PW", "s3cret pass"),
    ]);
    let p12 = ok(
        "{{ fullPemToPkcs12Pass(CHAIN.Value, KEY.Value, PW.Value) }}",
        &d,
    );
    let d = secrets(&[("P12", &p12), ("PW", "s3cret pass")]);
    let certs = ok(
        "{{ P12.Value | decodeBase64ToBytes | pkcs12certPass(PW.Value) }}",
        &d,
    );
    assert_eq!(
        pem_ders(&certs),
        vec![
            der(&pki.leaf.cert),
            der(&pki.intermediate.cert),
            der(&pki.root.cert)
        ]
    );
    let key = ok(
        "{{ pkcs12keyPass(PW.Value, decodeBase64ToBytes(P12.Value)) }}",
        &d,
    );
    assert_eq!(p256_scalar(&key), p256_scalar(&pki.leaf.key));

    let e = err(
        "{{ P12.Value | decodeBase64ToBytes | pkcs12certPass('wrong') }}",
        &d,
    );
    assert_eq!(e.kind, ErrorKind::Function);
    assert!(e.message.contains("wrong password"), "{e}");
    let e = err("{{ P12.Value | decodeBase64ToBytes | pkcs12cert }}", &d);
    assert_eq!(e.kind, ErrorKind::Function, "{e}");
}

#[test]
fn pipelines_equal_function_calls() {
    let pki = pki();
    let chain = format!("{}{}", pki.leaf.cert, pki.intermediate.cert);
    let d = secrets(&[("CHAIN", &chain), ("KEY", &pki.leaf.key)]);
    let p12 = ok(
        "{{ fullPemToPkcs12Pass(CHAIN.Value, KEY.Value, 'pw') }}",
        &d,
    );
    // filter form: the piped value is the last argument
    assert_eq!(
        p12,
        ok(
            "{{ 'pw' | fullPemToPkcs12Pass(CHAIN.Value, KEY.Value) }}",
            &d
        )
    );
    let d = secrets(&[("P12", &p12)]);
    let piped = ok(
        "{{ P12.Value | decodeBase64ToBytes | pkcs12certPass(\"pw\") }}",
        &d,
    );
    let called = ok(
        "{{ pkcs12certPass(\"pw\", decodeBase64ToBytes(P12.Value)) }}",
        &d,
    );
    assert_eq!(piped, called);
    assert_eq!(pem_ders(&piped).len(), 2);
    assert_eq!(
        ok(
            "{{ P12.Value | decodeBase64ToBytes | pkcs12keyPass(\"pw\") }}",
            &d
        ),
        ok(
            "{{ pkcs12keyPass(\"pw\", decodeBase64ToBytes(P12.Value)) }}",
            &d
        )
    );
}

#[test]
fn writers_are_deterministic() {
    let pki = pki();
    let d = secrets(&[("CRT", &pki.leaf.cert), ("KEY", &pki.leaf.key)]);
    let a = ok("{{ pemToPkcs12Pass(CRT.Value, KEY.Value, 'pw') }}", &d);
    let b = engine()
        .render(
            "other.field",
            "{{ pemToPkcs12Pass(CRT.Value, KEY.Value, 'pw') }}",
            &d,
        )
        .unwrap();
    assert_eq!(a, b);
    let c = ok("{{ pemToPkcs12Pass(CRT.Value, KEY.Value, 'other') }}", &d);
    assert_ne!(a, c);
}

#[test]
fn writer_refuses_a_key_of_another_certificate() {
    let pki = pki();
    let d = secrets(&[("CRT", &pki.leaf.cert), ("KEY", &pki.root.key)]);
    let e = err("{{ pemToPkcs12(CRT.Value, KEY.Value) }}", &d);
    assert_eq!(e.kind, ErrorKind::Function);
    assert!(e.message.contains("does not belong"), "{e}");
    let e = err("{{ pemToPkcs12(CRT.Value, 'no key here') }}", &d);
    assert!(e.message.contains("no private key"), "{e}");
    let e = err("{{ pemToPkcs12('junk', KEY.Value) }}", &d);
    assert!(e.message.contains("no CERTIFICATE"), "{e}");
}

#[test]
fn keys_in_every_encoding_and_algorithm() {
    // P-384 and Ed25519 leaves, PKCS#8
    for alg in [
        &rcgen::PKCS_ECDSA_P384_SHA384,
        &rcgen::PKCS_ED25519,
        &rcgen::PKCS_ECDSA_P256_SHA256,
    ] {
        let pki = pki_with_leaf_key(rcgen::KeyPair::generate_for(alg).unwrap());
        let d = secrets(&[("CRT", &pki.leaf.cert), ("KEY", &pki.leaf.key)]);
        let p12 = ok("{{ pemToPkcs12(CRT.Value, KEY.Value) }}", &d);
        let d = secrets(&[("P12", &p12)]);
        let key = ok("{{ P12.Value | decodeBase64ToBytes | pkcs12key }}", &d);
        let cert = ok("{{ P12.Value | decodeBase64ToBytes | pkcs12cert }}", &d);
        assert_eq!(pem_ders(&cert), vec![der(&pki.leaf.cert)]);
        // the key read back still belongs to the certificate
        let d = secrets(&[("CRT", &cert), ("KEY", &key)]);
        ok("{{ pemToPkcs12(CRT.Value, KEY.Value) }}", &d);
    }
    // SEC1 "EC PRIVATE KEY"
    let pki = pki();
    let sec1 = p256::SecretKey::from_pkcs8_pem(&pki.leaf.key)
        .unwrap()
        .to_sec1_pem(p256::pkcs8::LineEnding::LF)
        .unwrap()
        .to_string();
    assert!(sec1.starts_with("-----BEGIN EC PRIVATE KEY-----"));
    let d = secrets(&[
        ("CRT", &pki.leaf.cert),
        (
            "KEY",
            &format!(
                "-----BEGIN EC PARAMETERS-----\nBggqhkjOPQMBBw==\n-----END EC PARAMETERS-----\n{sec1}"
            ),
        ),
    ]);
    let p12 = ok("{{ pemToPkcs12(CRT.Value, KEY.Value) }}", &d);
    let key = ok(
        "{{ P12.Value | decodeBase64ToBytes | pkcs12key }}",
        &secrets(&[("P12", &p12)]),
    );
    assert_eq!(p256_scalar(&key), p256_scalar(&pki.leaf.key));
}

#[test]
fn rsa_pkcs1_keys() {
    use rsa::pkcs1::EncodeRsaPrivateKey;
    use rsa::pkcs8::DecodePrivateKey as _;
    // The RSA key of RFC 7517 A.2, through jwkPrivateKeyPem.
    let pkcs8 = ok(
        "{{ J.Value | jwkPrivateKeyPem }}",
        &secrets(&[("J", common_jwk::RSA_PRIVATE)]),
    );
    let key = rsa::PrivateKey::from_pkcs8_pem(&pkcs8).unwrap();
    let pkcs1 = key
        .to_pkcs1_pem(rsa::pkcs1::LineEnding::LF)
        .unwrap()
        .to_string();
    let pair = rcgen::KeyPair::from_pem(&pkcs8).unwrap();
    let pki = pki_with_leaf_key(pair);
    let d = secrets(&[("CRT", &pki.leaf.cert), ("KEY", &pkcs1)]);
    let p12 = ok("{{ pemToPkcs12Pass(CRT.Value, KEY.Value, 'pw') }}", &d);
    let back = ok(
        "{{ P12.Value | decodeBase64ToBytes | pkcs12keyPass('pw') }}",
        &secrets(&[("P12", &p12)]),
    );
    assert_eq!(der(&back), der(&pkcs8));
}

#[test]
fn forgetting_to_decode_gets_a_hint() {
    let pki = pki();
    let d = secrets(&[("CRT", &pki.leaf.cert), ("KEY", &pki.leaf.key)]);
    let p12 = ok("{{ pemToPkcs12(CRT.Value, KEY.Value) }}", &d);
    let e = err("{{ P12.Value | pkcs12cert }}", &secrets(&[("P12", &p12)]));
    assert!(e.message.contains("decodeBase64ToBytes"), "{e}");
    assert!(!e.to_string().contains(&p12[..20]), "{e}");
}

#[test]
fn legacy_bundles_from_vectors() {
    let leaf = include_str!("vectors/leaf.crt");
    let root = include_str!("vectors/root.crt");
    let key = include_str!("vectors/leaf.key");
    for (file, password) in [
        (include_str!("vectors/legacy-rc2.p12.b64"), "legacy-pw"),
        (include_str!("vectors/legacy-3des.p12.b64"), "des-pw"),
    ] {
        let d = secrets(&[("P12", file), ("PW", password)]);
        let certs = ok(
            "{{ P12.Value | decodeBase64ToBytes | pkcs12certPass(PW.Value) }}",
            &d,
        );
        assert_eq!(pem_ders(&certs), vec![der(leaf), der(root)]);
        let k = ok(
            "{{ P12.Value | decodeBase64ToBytes | pkcs12keyPass(PW.Value) }}",
            &d,
        );
        assert_eq!(p256_scalar(&k), p256_scalar(key));
        agrees_with_p12_keystore(&unb64(file), password, &k, &certs);
    }
}

#[test]
fn binary_bundles_as_secret_values() {
    // A push source Secret may hold the bundle as raw bytes.
    let raw = unb64(include_str!("vectors/legacy-3des.p12.b64"));
    let mut d = SecretData::new();
    d.insert("P12".into(), SecretEntry::new(raw.clone(), "/"));
    let certs = ok(
        "{{ P12.Value | pkcs12certPass('des-pw') | filterCertChain('leaf') }}",
        &d,
    );
    assert_eq!(
        pem_ders(&certs),
        vec![der(include_str!("vectors/leaf.crt"))]
    );
    // …and a keystore can be written as binary Secret data.
    let out = engine()
        .render_bytes("f", "{{ P12.Value | b64enc | decodeBase64ToBytes }}", &d)
        .unwrap();
    assert_eq!(out, raw);
}

#[test]
fn tls_secret_from_a_pkcs12_secret() {
    let pki = pki();
    let chain = format!(
        "{}{}{}",
        pki.leaf.cert, pki.intermediate.cert, pki.root.cert
    );
    let p12 = ok(
        "{{ fullPemToPkcs12Pass(C.Value, K.Value, 'pw') }}",
        &secrets(&[("C", &chain), ("K", &pki.leaf.key)]),
    );
    let d = secrets(&[("P12", &p12)]);
    let e = engine();
    let crt = e
        .render_bytes(
            "managedKubeSecretReferences[0].template.data.tls.crt",
            "{{ P12.Value | decodeBase64ToBytes | pkcs12certPass('pw') }}",
            &d,
        )
        .unwrap();
    let key = e
        .render_bytes(
            "managedKubeSecretReferences[0].template.data.tls.key",
            "{{ P12.Value | decodeBase64ToBytes | pkcs12keyPass('pw') }}",
            &d,
        )
        .unwrap();
    let crt = String::from_utf8(crt).unwrap();
    assert_eq!(pem_ders(&crt)[0], der(&pki.leaf.cert));
    assert_eq!(
        p256_scalar(&String::from_utf8(key).unwrap()),
        p256_scalar(&pki.leaf.key)
    );
}

#[test]
fn filter_pem_keeps_one_type() {
    let pki = pki();
    let bundle = format!(
        "junk before\n{}{}\n{}",
        pki.leaf.key, pki.leaf.cert, pki.root.cert
    );
    let d = secrets(&[("B", &bundle)]);
    let certs = ok("{{ B.Value | filterPEM('CERTIFICATE') }}", &d);
    assert_eq!(
        pem_ders(&certs),
        vec![der(&pki.leaf.cert), der(&pki.root.cert)]
    );
    assert!(!certs.ends_with('\n'), "trimmed like the reference");
    assert_eq!(certs, ok("{{ filterPEM('certificate', B.Value) }}", &d));
    let keys = ok("{{ B.Value | filterPEM('PRIVATE KEY') }}", &d);
    assert_eq!(pem_ders(&keys), vec![der(&pki.leaf.key)]);
    assert_eq!(ok("{{ B.Value | filterPEM('RSA PRIVATE KEY') }}", &d), "");
    let d = secrets(&[
        ("J", "this is not PEM at all"),
        ("T", &format!("{}trailing junk", pki.leaf.key)),
    ]);
    let e = err("{{ J.Value | filterPEM('CERTIFICATE') }}", &d);
    assert_eq!(e.kind, ErrorKind::Function);
    assert!(!e.message.contains("not PEM at all"), "{e}");
    err("{{ T.Value | filterPEM('CERTIFICATE') }}", &d);
}

#[test]
fn filter_cert_chain_from_an_unordered_bundle() {
    let pki = pki();
    let orders = [
        format!(
            "{}{}{}",
            pki.root.cert, pki.leaf.cert, pki.intermediate.cert
        ),
        format!(
            "{}{}{}",
            pki.intermediate.cert, pki.root.cert, pki.leaf.cert
        ),
        format!(
            "{}{}{}{}",
            pki.leaf.key, pki.root.cert, pki.intermediate.cert, pki.leaf.cert
        ),
    ];
    for bundle in orders {
        let d = secrets(&[("B", &bundle)]);
        assert_eq!(
            pem_ders(&ok("{{ B.Value | filterCertChain('leaf') }}", &d)),
            vec![der(&pki.leaf.cert)]
        );
        assert_eq!(
            pem_ders(&ok("{{ filterCertChain('intermediate', B.Value) }}", &d)),
            vec![der(&pki.intermediate.cert)]
        );
        assert_eq!(
            pem_ders(&ok("{{ B.Value | filterCertChain('root') }}", &d)),
            vec![der(&pki.root.cert)]
        );
    }
    // no root in the bundle, a lone root, two chains, a bad type
    let d = secrets(&[("B", &format!("{}{}", pki.intermediate.cert, pki.leaf.cert))]);
    assert_eq!(ok("{{ B.Value | filterCertChain('root') }}", &d), "");
    assert_eq!(
        pem_ders(&ok("{{ B.Value | filterCertChain('intermediate') }}", &d)),
        vec![der(&pki.intermediate.cert)]
    );
    let d = secrets(&[("B", &pki.root.cert)]);
    assert_eq!(ok("{{ B.Value | filterCertChain('leaf') }}", &d), "");
    assert_eq!(
        pem_ders(&ok("{{ B.Value | filterCertChain('root') }}", &d)),
        vec![der(&pki.root.cert)]
    );
    let other = common::pki();
    let d = secrets(&[("B", &format!("{}{}", pki.leaf.cert, other.leaf.cert))]);
    let e = err("{{ B.Value | filterCertChain('leaf') }}", &d);
    assert!(e.message.contains("single chain"), "{e}");
    let e = err("{{ B.Value | filterCertChain('middle') }}", &d);
    assert!(e.message.contains("leaf, intermediate or root"), "{e}");
}

#[test]
fn pkcs12cert_orders_bundles_written_out_of_order() {
    let pki = pki();
    // fullPemToPkcs12 keeps the given order: root before intermediate here
    let chain = format!(
        "{}{}{}",
        pki.leaf.cert, pki.root.cert, pki.intermediate.cert
    );
    let p12 = ok(
        "{{ fullPemToPkcs12(C.Value, K.Value) }}",
        &secrets(&[("C", &chain), ("K", &pki.leaf.key)]),
    );
    let certs = ok(
        "{{ P12.Value | decodeBase64ToBytes | pkcs12cert }}",
        &secrets(&[("P12", &p12)]),
    );
    assert_eq!(
        pem_ders(&certs),
        vec![
            der(&pki.leaf.cert),
            der(&pki.intermediate.cert),
            der(&pki.root.cert)
        ]
    );
}

// ------------------------------------------------------------- OpenSSL

#[test]
fn openssl_accepts_what_we_write() {
    if openssl().is_none() {
        println!("note: openssl not found; skipping the OpenSSL interop test");
        return;
    }
    let pki = pki();
    let chain = format!(
        "{}{}{}",
        pki.leaf.cert, pki.intermediate.cert, pki.root.cert
    );
    let d = secrets(&[
        ("CRT", &pki.leaf.cert),
        ("CHAIN", &chain),
        ("KEY", &pki.leaf.key),
    ]);
    let dir = scratch();
    for (name, source, pass) in [
        (
            "pass.p12",
            "{{ pemToPkcs12Pass(CRT.Value, KEY.Value, 'open sesame') }}",
            "open sesame",
        ),
        (
            "full.p12",
            "{{ fullPemToPkcs12Pass(CHAIN.Value, KEY.Value, 'pw') }}",
            "pw",
        ),
        ("empty.p12", "{{ pemToPkcs12(CRT.Value, KEY.Value) }}", ""),
    ] {
        let p12 = unb64(&ok(source, &d));
        std::fs::write(dir.join(name), &p12).unwrap();
        let passin = format!("pass:{pass}");
        run_openssl(
            &dir,
            &[
                "pkcs12", "-info", "-in", name, "-passin", &passin, "-nokeys", "-noout",
            ],
        );
        let certs = run_openssl(
            &dir,
            &["pkcs12", "-in", name, "-passin", &passin, "-nokeys"],
        );
        let certs = String::from_utf8(certs).unwrap();
        assert_eq!(pem_ders(&certs)[0], der(&pki.leaf.cert), "{name}");
        let key = run_openssl(
            &dir,
            &[
                "pkcs12", "-in", name, "-passin", &passin, "-nocerts", "-nodes",
            ],
        );
        assert_eq!(
            p256_scalar(&String::from_utf8(key).unwrap()),
            p256_scalar(&pki.leaf.key),
            "{name}"
        );
    }
    // other key algorithms
    for alg in [&rcgen::PKCS_ED25519, &rcgen::PKCS_ECDSA_P384_SHA384] {
        let pki = pki_with_leaf_key(rcgen::KeyPair::generate_for(alg).unwrap());
        let d = secrets(&[("CRT", &pki.leaf.cert), ("KEY", &pki.leaf.key)]);
        let p12 = unb64(&ok("{{ pemToPkcs12Pass(CRT.Value, KEY.Value, 'pw') }}", &d));
        std::fs::write(dir.join("alg.p12"), &p12).unwrap();
        run_openssl(
            &dir,
            &[
                "pkcs12", "-info", "-in", "alg.p12", "-passin", "pass:pw", "-nokeys", "-noout",
            ],
        );
        let key = run_openssl(
            &dir,
            &[
                "pkcs12", "-in", "alg.p12", "-passin", "pass:pw", "-nocerts", "-nodes",
            ],
        );
        let d = secrets(&[
            ("CRT", &pki.leaf.cert),
            ("KEY", &String::from_utf8(key).unwrap()),
        ]);
        ok("{{ pemToPkcs12(CRT.Value, KEY.Value) }}", &d);
    }
    let n = pem_ders(
        &String::from_utf8(run_openssl(
            &dir,
            &["pkcs12", "-in", "full.p12", "-passin", "pass:pw", "-nokeys"],
        ))
        .unwrap(),
    )
    .len();
    assert_eq!(n, 3);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn we_read_what_openssl_writes() {
    if openssl().is_none() {
        println!("note: openssl not found; skipping the OpenSSL interop test");
        return;
    }
    let pki = pki();
    let dir = scratch();
    std::fs::write(
        dir.join("chain.pem"),
        format!(
            "{}{}{}",
            pki.leaf.cert, pki.intermediate.cert, pki.root.cert
        ),
    )
    .unwrap();
    std::fs::write(dir.join("key.pem"), &pki.leaf.key).unwrap();
    let base = ["pkcs12", "-export", "-in", "chain.pem", "-inkey", "key.pem"];
    let variants: Vec<(&str, Vec<&str>, &str)> = vec![
        ("modern.p12", vec!["-passout", "pass:pw"], "pw"),
        (
            "des.p12",
            vec![
                "-passout",
                "pass:pw",
                "-keypbe",
                "PBE-SHA1-3DES",
                "-certpbe",
                "PBE-SHA1-3DES",
                "-macalg",
                "sha1",
            ],
            "pw",
        ),
        ("legacy.p12", vec!["-passout", "pass:pw", "-legacy"], "pw"),
        ("nopass.p12", vec!["-passout", "pass:"], ""),
        (
            "plain.p12",
            vec!["-passout", "pass:", "-keypbe", "NONE", "-certpbe", "NONE"],
            "",
        ),
        ("nomac.p12", vec!["-passout", "pass:pw", "-nomac"], "pw"),
    ];
    for (name, extra, pass) in variants {
        let mut args: Vec<&str> = base.to_vec();
        args.extend(extra);
        args.extend(["-out", name]);
        let made = std::process::Command::new("openssl")
            .args(&args)
            .current_dir(&dir)
            .output()
            .unwrap();
        if !made.status.success() {
            println!(
                "note: this openssl cannot write {name}: {}",
                String::from_utf8_lossy(&made.stderr)
            );
            continue;
        }
        let p12 = std::fs::read(dir.join(name)).unwrap();
        let d = secrets(&[("P12", &b64(&p12)), ("PW", pass)]);
        let certs = ok(
            "{{ P12.Value | decodeBase64ToBytes | pkcs12certPass(PW.Value) }}",
            &d,
        );
        assert_eq!(
            pem_ders(&certs),
            vec![
                der(&pki.leaf.cert),
                der(&pki.intermediate.cert),
                der(&pki.root.cert)
            ],
            "{name}"
        );
        let key = ok(
            "{{ P12.Value | decodeBase64ToBytes | pkcs12keyPass(PW.Value) }}",
            &d,
        );
        assert_eq!(p256_scalar(&key), p256_scalar(&pki.leaf.key), "{name}");
        agrees_with_p12_keystore(&p12, pass, &key, &certs);
        if pass.is_empty() {
            assert_eq!(
                certs,
                ok("{{ P12.Value | decodeBase64ToBytes | pkcs12cert }}", &d),
                "{name}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

mod common_jwk {
    pub const RSA_PRIVATE: &str = include_str!("vectors/rfc7517-rsa-private.json");
}
