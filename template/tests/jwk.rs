//! JWK → PEM against the example keys of RFC 7517 (Appendix A.1, A.2) and
//! RFC 8037 (Ed25519), plus P-384 and P-521 keys made from fixed scalars.

mod common;

use common::{data, err, ok, openssl, run_openssl, scratch};
use kms_template::ErrorKind;
use pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePublicKey};

const EC_PUBLIC: &str = r#"{"kty":"EC","crv":"P-256","x":"MKBCTNIcKUSDii11ySs3526iDZ8AiTo7Tu6KPAqv7D4","y":"4Etl6SRW2YiLUrN5vfvVHuhp7x8PxltmWWlbbM4IFyM","use":"enc","kid":"1"}"#;
const EC_PRIVATE: &str = r#"{"kty":"EC","crv":"P-256","x":"MKBCTNIcKUSDii11ySs3526iDZ8AiTo7Tu6KPAqv7D4","y":"4Etl6SRW2YiLUrN5vfvVHuhp7x8PxltmWWlbbM4IFyM","d":"870MB6gfuTJ4HtUnUvYMyJpr5eUZNP4Bk43bVdj3eAE","use":"enc","kid":"1"}"#;
const RSA_N: &str = "0vx7agoebGcQSuuPiLJXZptN9nndrQmbXEps2aiAFbWhM78LhWx4cbbfAAtVT86zwu1RK7aPFFxuhDR1L6tSoc_BJECPebWKRXjBZCiFV4n3oknjhMstn64tZ_2W-5JsGY4Hc5n9yBXArwl93lqt7_RN5w6Cf0h4QyQ5v-65YGjQR0_FDW2QvzqY368QQMicAtaSqzs8KJZgnYb9c7d0zgdAZHzu6qMQvRL5hajrn1n91CbOpbISD08qNLyrdkt-bFTWhAI4vMQFh6WeZu0fM4lFd2NcRwr3XPksINHaQ-G_xBniIqbw0Ls1jF44-csFCur-kEgU8awapJzKnqDKgw";
const RSA_PRIVATE: &str = include_str!("vectors/rfc7517-rsa-private.json");
const ED25519_PRIVATE: &str = r#"{"kty":"OKP","crv":"Ed25519","d":"nWGxne_9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}"#;

fn b64url(s: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s)
        .unwrap()
}

fn b64url_enc(b: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

fn member(json: &str, name: &str) -> Vec<u8> {
    let v: serde_json::Value = serde_json::from_str(json).unwrap();
    b64url(v[name].as_str().unwrap())
}

fn jwk_pem(function: &str, jwk: &str) -> String {
    let d = data(&[("J", jwk)]);
    let piped = ok(&format!("{{{{ J.Value | {function} }}}}"), &d);
    assert_eq!(piped, ok(&format!("{{{{ {function}(J.Value) }}}}"), &d));
    // a parsed JWK (a map) works too
    assert_eq!(
        piped,
        ok(&format!("{{{{ {function}(fromJson(J.Value)) }}}}"), &d)
    );
    piped
}

fn strip_zeros(b: &[u8]) -> &[u8] {
    let i = b.iter().position(|&x| x != 0).unwrap_or(b.len());
    &b[i..]
}

#[test]
fn rfc7517_ec_public() {
    let pem = jwk_pem("jwkPublicKeyPem", EC_PUBLIC);
    assert!(
        pem.starts_with("-----BEGIN PUBLIC KEY-----\n")
            && pem.ends_with("-----END PUBLIC KEY-----\n")
    );
    let key = p256::PublicKey::from_public_key_pem(&pem).unwrap();
    let mut expected = vec![4u8];
    expected.extend(member(EC_PUBLIC, "x"));
    expected.extend(member(EC_PUBLIC, "y"));
    assert_eq!(key.to_sec1_bytes().to_vec(), expected);
}

#[test]
fn rfc7517_ec_private() {
    let pem = jwk_pem("jwkPrivateKeyPem", EC_PRIVATE);
    assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----\n"));
    let key = p256::SecretKey::from_pkcs8_pem(&pem).unwrap();
    assert_eq!(key.to_bytes().to_vec(), member(EC_PRIVATE, "d"));
    // the public half of the private JWK is the A.1 public key
    assert_eq!(
        jwk_pem("jwkPublicKeyPem", EC_PRIVATE),
        jwk_pem("jwkPublicKeyPem", EC_PUBLIC)
    );
    assert_eq!(
        key.public_key()
            .to_public_key_pem(pkcs8::LineEnding::LF)
            .unwrap(),
        jwk_pem("jwkPublicKeyPem", EC_PUBLIC)
    );
}

#[test]
fn rfc7517_rsa_public() {
    let jwk =
        format!(r#"{{"kty":"RSA","n":"{RSA_N}","e":"AQAB","alg":"RS256","kid":"2011-04-29"}}"#);
    let pem = jwk_pem("jwkPublicKeyPem", &jwk);
    let key = rsa::PublicKey::from_public_key_pem(&pem).unwrap();
    use rsa::traits::PublicKeyParts;
    assert_eq!(
        strip_zeros(&key.n().to_be_bytes()),
        b64url(RSA_N).as_slice()
    );
    assert_eq!(strip_zeros(&key.e().to_be_bytes()), &[1, 0, 1]);
    assert_eq!(jwk_pem("jwkPublicKeyPem", RSA_PRIVATE), pem);
}

#[test]
fn rfc7517_rsa_private() {
    let pem = jwk_pem("jwkPrivateKeyPem", RSA_PRIVATE);
    let info = pkcs8::PrivateKeyInfoRef::try_from(pem_der(&pem).as_slice())
        .unwrap()
        .private_key
        .as_bytes()
        .to_vec();
    let k: rsa::pkcs1::RsaPrivateKeyRef<'_> = der::Decode::from_der(info.as_slice()).unwrap();
    for (name, got) in [
        ("n", k.modulus.as_bytes()),
        ("e", k.public_exponent.as_bytes()),
        ("d", k.private_exponent.as_bytes()),
        ("p", k.prime1.as_bytes()),
        ("q", k.prime2.as_bytes()),
        ("dp", k.exponent1.as_bytes()),
        ("dq", k.exponent2.as_bytes()),
        ("qi", k.coefficient.as_bytes()),
    ] {
        assert_eq!(
            strip_zeros(got),
            strip_zeros(&member(RSA_PRIVATE, name)),
            "{name}"
        );
    }
    // without p and q the primes are recovered
    let mut v: serde_json::Value = serde_json::from_str(RSA_PRIVATE).unwrap();
    for m in ["p", "q", "dp", "dq", "qi"] {
        v.as_object_mut().unwrap().remove(m);
    }
    let pem2 = jwk_pem("jwkPrivateKeyPem", &v.to_string());
    assert_eq!(
        rsa::PrivateKey::from_pkcs8_pem(&pem2).unwrap(),
        rsa::PrivateKey::from_pkcs8_pem(&pem).unwrap()
    );
}

fn pem_der(text: &str) -> Vec<u8> {
    pem::parse(text).unwrap().into_contents()
}

#[test]
fn rfc8037_ed25519() {
    let private = jwk_pem("jwkPrivateKeyPem", ED25519_PRIVATE);
    let key = ed25519_dalek::SigningKey::from_pkcs8_pem(&private).unwrap();
    assert_eq!(key.to_bytes().to_vec(), member(ED25519_PRIVATE, "d"));
    let public = jwk_pem("jwkPublicKeyPem", ED25519_PRIVATE);
    let vk = ed25519_dalek::VerifyingKey::from_public_key_pem(&public).unwrap();
    assert_eq!(vk.to_bytes().to_vec(), member(ED25519_PRIVATE, "x"));
    assert_eq!(vk, key.verifying_key());
}

macro_rules! curve_case {
    ($krate:ident, $crv:expr, $size:expr) => {{
        let scalar: Vec<u8> = (1..=$size as u8).collect();
        let secret = $krate::SecretKey::from_slice(&scalar).unwrap();
        let point = secret.public_key().to_sec1_bytes();
        let (x, y) = point[1..].split_at($size);
        let jwk = format!(
            r#"{{"kty":"EC","crv":"{}","x":"{}","y":"{}","d":"{}"}}"#,
            $crv,
            b64url_enc(x),
            b64url_enc(y),
            b64url_enc(&scalar)
        );
        let private = jwk_pem("jwkPrivateKeyPem", &jwk);
        assert_eq!(
            $krate::SecretKey::from_pkcs8_pem(&private)
                .unwrap()
                .to_bytes()
                .to_vec(),
            scalar
        );
        let public = jwk_pem("jwkPublicKeyPem", &jwk);
        assert_eq!(
            $krate::PublicKey::from_public_key_pem(&public).unwrap(),
            secret.public_key()
        );
        // a d that does not match x/y is refused
        let mut other = scalar.clone();
        other[$size - 1] ^= 1;
        let bad = jwk.replace(&b64url_enc(&scalar), &b64url_enc(&other));
        let e = err("{{ J.Value | jwkPrivateKeyPem }}", &data(&[("J", &bad)]));
        assert!(e.message.contains("does not match"), "{e}");
        (private, public)
    }};
}

#[test]
fn p384_and_p521() {
    curve_case!(p384, "P-384", 48);
    curve_case!(p521, "P-521", 66);
}

#[test]
fn openssl_reads_the_keys() {
    if openssl().is_none() {
        println!("note: openssl not found; skipping the OpenSSL check");
        return;
    }
    let dir = scratch();
    for (name, jwk) in [
        ("ec", EC_PRIVATE),
        ("rsa", RSA_PRIVATE),
        ("ed", ED25519_PRIVATE),
    ] {
        let private = jwk_pem("jwkPrivateKeyPem", jwk);
        let public = jwk_pem("jwkPublicKeyPem", jwk);
        std::fs::write(dir.join(format!("{name}.pem")), &private).unwrap();
        let derived = run_openssl(&dir, &["pkey", "-in", &format!("{name}.pem"), "-pubout"]);
        assert_eq!(String::from_utf8(derived).unwrap(), public, "{name}");
        if name != "ed" {
            run_openssl(
                &dir,
                &["pkey", "-in", &format!("{name}.pem"), "-check", "-noout"],
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_jwks_are_explained_without_their_values() {
    let cases = [
        (r#"{"keys":[{"kty":"EC"}]}"#, "JWK Set"),
        (
            r#"{"kty":"oct","k":"c2VjcmV0LXN5bW1ldHJpYy1rZXk"}"#,
            "symmetric",
        ),
        (
            r#"{"kty":"EC","crv":"P-192","x":"AA","y":"AA"}"#,
            "unsupported EC curve",
        ),
        (
            r#"{"kty":"EC","crv":"P-256","x":"MKBCTNIcKUSDii11ySs3526iDZ8AiTo7Tu6KPAqv7D4"}"#,
            "no `x`/`y`",
        ),
        (
            r#"{"kty":"RSA","n":"!!notbase64url!!","e":"AQAB"}"#,
            "not valid base64url",
        ),
        (
            r#"{"kty":"OKP","crv":"X25519","x":"AA"}"#,
            "unsupported OKP curve",
        ),
        ("not json at all", "not valid JSON"),
        (
            r#"{"kty":"EC","crv":"P-256","x":"AAAA","y":"AAAA"}"#,
            "not on the curve",
        ),
    ];
    for (jwk, expected) in cases {
        let e = err("{{ J.Value | jwkPublicKeyPem }}", &data(&[("J", jwk)]));
        assert_eq!(e.kind, ErrorKind::Function);
        assert!(e.message.contains(expected), "{jwk}: {e}");
        assert!(
            !e.message.contains("notbase64url") && !e.message.contains("MKBCTNIc"),
            "{e}"
        );
    }
    let e = err(
        "{{ J.Value | jwkPrivateKeyPem }}",
        &data(&[("J", EC_PUBLIC)]),
    );
    assert!(e.message.contains("no `d`"), "{e}");
    assert_eq!(
        ok(
            "{{ jwkPublicKeyPem(fromJson(S.Value).keys[0]) }}",
            &data(&[("S", &format!(r#"{{"keys":[{EC_PUBLIC}]}}"#))])
        ),
        jwk_pem("jwkPublicKeyPem", EC_PUBLIC)
    );
}
