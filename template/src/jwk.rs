//! JWK → PEM: `jwkPublicKeyPem` (PKIX `PUBLIC KEY`) and `jwkPrivateKeyPem`
//! (PKCS#8 `PRIVATE KEY`).
//!
//! Key types: `RSA`; `EC` on `P-256`, `P-384`, `P-521`; `OKP` on `Ed25519`.
//! The JWK members are read with our own serde struct (private members
//! included) and the keys are built with the RustCrypto crates, which also
//! check them: a private `d` that does not match the public `x`/`y` is an
//! error. Errors name the problem, never a member's value.

use base64::Engine as _;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use minijinja::value::ValueKind;
use minijinja::{Error, State, Value};
use pkcs8::{EncodePrivateKey, EncodePublicKey, LineEnding};
use rsa::BoxedUint;
use serde::Deserialize;

use crate::args::{arity, defined, fail, reserve, text, work};
use crate::encoding::{PARSED_GROWTH, to_json_value};
use crate::keys::{ED25519_FUEL, P256_FUEL, P384_FUEL, P521_FUEL, rsa_fuel};

/// base64url, padding optional.
const B64URL: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::URL_SAFE,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

#[derive(Deserialize)]
struct Jwk {
    kty: Option<String>,
    crv: Option<String>,
    n: Option<String>,
    e: Option<String>,
    d: Option<String>,
    p: Option<String>,
    q: Option<String>,
    x: Option<String>,
    y: Option<String>,
    oth: Option<serde_json::Value>,
    keys: Option<serde_json::Value>,
}

struct Member<'a> {
    func: &'a str,
}

impl Member<'_> {
    fn get(&self, value: &Option<String>, name: &str) -> Result<Vec<u8>, Error> {
        let encoded = value
            .as_deref()
            .ok_or_else(|| fail(self.func, format!("the JWK has no `{name}` member")))?;
        B64URL.decode(encoded.trim()).map_err(|_| {
            fail(
                self.func,
                format!("the JWK member `{name}` is not valid base64url"),
            )
        })
    }
}

fn parse(state: &State, func: &str, input: &Value) -> Result<Jwk, Error> {
    defined(state, input)?;
    let json = if input.kind() == ValueKind::Map {
        to_json_value(state, func, input, 0)?
    } else {
        let text = text(state, func, "the JWK", input)?;
        reserve(state, (text.len() as u64).saturating_mul(PARSED_GROWTH))?;
        serde_json::from_str(&text).map_err(|_| fail(func, "the input is not valid JSON"))?
    };
    let jwk: Jwk = serde_json::from_value(json).map_err(|_| {
        fail(
            func,
            "the input is not a JWK (an object with string members)",
        )
    })?;
    if jwk.keys.is_some() && jwk.kty.is_none() {
        return Err(fail(
            func,
            "the input is a JWK Set; pass a single key (for instance `fromJson(s).keys[0]`)",
        ));
    }
    Ok(jwk)
}

fn uint(bytes: &[u8]) -> BoxedUint {
    BoxedUint::from_be_slice_vartime(bytes)
}

/// Pads a big-endian coordinate to the field size; refuses longer ones.
fn coordinate(func: &str, name: &str, bytes: Vec<u8>, size: usize) -> Result<Vec<u8>, Error> {
    if bytes.len() > size {
        return Err(fail(
            func,
            format!("the JWK member `{name}` is too long for the curve"),
        ));
    }
    let mut out = vec![0u8; size - bytes.len()];
    out.extend_from_slice(&bytes);
    Ok(out)
}

fn pem_out(func: &str, pem: Result<String, impl std::fmt::Debug>) -> Result<Value, Error> {
    pem.map(Value::from)
        .map_err(|_| fail(func, "the key cannot be encoded"))
}

/// An EC key on one curve crate: public from x/y, private from d (checked
/// against x/y when they are given).
macro_rules! ec_pem {
    ($krate:ident, $size:expr, $func:expr, $m:expr, $jwk:expr, $private:expr) => {{
        let func = $func;
        let jwk = $jwk;
        let public = match (&jwk.x, &jwk.y) {
            (Some(_), Some(_)) => {
                let mut sec1 = vec![4u8];
                sec1.extend(coordinate(func, "x", $m.get(&jwk.x, "x")?, $size)?);
                sec1.extend(coordinate(func, "y", $m.get(&jwk.y, "y")?, $size)?);
                Some(
                    $krate::PublicKey::from_sec1_bytes(&sec1)
                        .map_err(|_| fail(func, "the JWK point `x`/`y` is not on the curve"))?,
                )
            }
            _ => None,
        };
        if $private {
            let d = coordinate(func, "d", $m.get(&jwk.d, "d")?, $size)?;
            let secret = $krate::SecretKey::from_slice(&d)
                .map_err(|_| fail(func, "the JWK member `d` is not a valid private scalar"))?;
            if public.is_some_and(|p| p != secret.public_key()) {
                return Err(fail(func, "the JWK private key `d` does not match `x`/`y`"));
            }
            pem_out(
                func,
                secret.to_pkcs8_pem(LineEnding::LF).map(|p| p.to_string()),
            )
        } else {
            let public = public.ok_or_else(|| fail(func, "the JWK has no `x`/`y` members"))?;
            pem_out(func, public.to_public_key_pem(LineEnding::LF))
        }
    }};
}

fn rsa_pem(
    state: &State,
    func: &str,
    m: &Member,
    jwk: &Jwk,
    private: bool,
) -> Result<Value, Error> {
    let n = m.get(&jwk.n, "n")?;
    let e = m.get(&jwk.e, "e")?;
    // A private key without its primes has them recovered from `d`: as
    // costly as checking the key, a few times over.
    let recover = if private && (jwk.p.is_none() || jwk.q.is_none()) {
        4
    } else {
        1
    };
    work(state, rsa_fuel(n.len() * 4).saturating_mul(recover))?;
    if !private {
        let key = rsa::PublicKey::new(uint(&n), uint(&e))
            .map_err(|_| fail(func, "the JWK is not a valid RSA public key"))?;
        return pem_out(func, key.to_public_key_pem(LineEnding::LF));
    }
    if jwk.oth.is_some() {
        return Err(fail(func, "multi-prime RSA keys (`oth`) are not supported"));
    }
    let d = m.get(&jwk.d, "d")?;
    let primes = match (&jwk.p, &jwk.q) {
        (Some(_), Some(_)) => vec![uint(&m.get(&jwk.p, "p")?), uint(&m.get(&jwk.q, "q")?)],
        _ => Vec::new(),
    };
    let key = rsa::PrivateKey::from_components(uint(&n), uint(&e), uint(&d), primes)
        .map_err(|_| fail(func, "the JWK is not a valid RSA private key"))?;
    pem_out(
        func,
        key.to_pkcs8_pem(LineEnding::LF).map(|p| p.to_string()),
    )
}

fn ed25519_pem(func: &str, m: &Member, jwk: &Jwk, private: bool) -> Result<Value, Error> {
    let public = match &jwk.x {
        Some(_) => {
            let x: [u8; 32] = m
                .get(&jwk.x, "x")?
                .try_into()
                .map_err(|_| fail(func, "the JWK member `x` must be 32 bytes"))?;
            Some(
                ed25519_dalek::VerifyingKey::from_bytes(&x)
                    .map_err(|_| fail(func, "the JWK member `x` is not an Ed25519 public key"))?,
            )
        }
        None => None,
    };
    if private {
        let d: [u8; 32] = m
            .get(&jwk.d, "d")?
            .try_into()
            .map_err(|_| fail(func, "the JWK member `d` must be 32 bytes"))?;
        let key = ed25519_dalek::SigningKey::from_bytes(&d);
        if public.is_some_and(|p| p != key.verifying_key()) {
            return Err(fail(func, "the JWK private key `d` does not match `x`"));
        }
        pem_out(func, crate::keys::ed25519_pkcs8_pem(&key))
    } else {
        let public = public.ok_or_else(|| fail(func, "the JWK has no `x` member"))?;
        pem_out(func, public.to_public_key_pem(LineEnding::LF))
    }
}

fn convert(state: &State, func: &str, args: &[Value], private: bool) -> Result<Value, Error> {
    arity(func, args, 1, 1)?;
    let jwk = parse(state, func, &args[0])?;
    let m = Member { func };
    let kty = jwk
        .kty
        .as_deref()
        .ok_or_else(|| fail(func, "the JWK has no `kty` member"))?;
    let crv = jwk.crv.as_deref();
    match (kty, crv) {
        ("RSA", _) => rsa_pem(state, func, &m, &jwk, private),
        ("EC", Some("P-256")) => {
            work(state, P256_FUEL)?;
            ec_pem!(p256, 32, func, m, &jwk, private)
        }
        ("EC", Some("P-384")) => {
            work(state, P384_FUEL)?;
            ec_pem!(p384, 48, func, m, &jwk, private)
        }
        ("EC", Some("P-521")) => {
            work(state, P521_FUEL)?;
            ec_pem!(p521, 66, func, m, &jwk, private)
        }
        ("EC", _) => Err(fail(
            func,
            "unsupported EC curve (supported: P-256, P-384, P-521)",
        )),
        ("OKP", Some("Ed25519")) => {
            work(state, ED25519_FUEL)?;
            ed25519_pem(func, &m, &jwk, private)
        }
        ("OKP", _) => Err(fail(func, "unsupported OKP curve (supported: Ed25519)")),
        ("oct", _) => Err(fail(func, "symmetric (`oct`) keys have no PEM form")),
        _ => Err(fail(func, "unsupported key type (supported: RSA, EC, OKP)")),
    }
}

/// `jwkPublicKeyPem(jwk)`: the public key as PKIX `PUBLIC KEY` PEM (a
/// private JWK gives its public half).
pub(crate) fn jwk_public_key_pem(state: &State, args: &[Value]) -> Result<Value, Error> {
    convert(state, "jwkPublicKeyPem", args, false)
}

/// `jwkPrivateKeyPem(jwk)`: the private key as PKCS#8 `PRIVATE KEY` PEM.
pub(crate) fn jwk_private_key_pem(state: &State, args: &[Value]) -> Result<Value, Error> {
    convert(state, "jwkPrivateKeyPem", args, true)
}
