//! Test mode of the cloud logins (AWS IAM, Azure, GCP). The dev server
//! cannot ask the clouds, so it checks what it can from the request itself:
//!
//! - AWS: the decoded `GetCallerIdentity` request — method `POST`, the form
//!   body, a SigV4 `Authorization` header (`AWS4-HMAC-SHA256
//!   Credential=<key>/<date>/<region>/sts/aws4_request, SignedHeaders=…,
//!   Signature=<64 hex>`), `Host`, and an `X-Amz-Date` within 15 minutes of
//!   now. When the access key is seeded, the signature is recomputed with its
//!   secret (canonical request, string to sign, HMAC chain) and the key's
//!   ARN is the caller.
//! - Azure and GCP: the JWT's structure, `exp` (and `nbf`), and claims; its
//!   RS256 signature is verified when the identity lists public keys.

use base64::Engine;
use ring::{digest, hmac};
use serde_json::Value;

use crate::seed::{SeedAwsAuth, SeedJwk};

/// The only request body accepted.
pub(crate) const GET_CALLER_IDENTITY: &str = "Action=GetCallerIdentity&Version=2011-06-15";
/// How far `X-Amz-Date` may be from now.
const MAX_SKEW_SECS: i64 = 15 * 60;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Modulus and exponent of a JWK, if both decode.
pub(crate) fn rsa_key(k: &SeedJwk) -> Option<(Vec<u8>, Vec<u8>)> {
    let d = |s: &str| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(s.trim().trim_end_matches('='))
            .ok()
            .filter(|v| !v.is_empty())
    };
    Some((d(&k.n)?, d(&k.e)?))
}

/// The SigV4 canonical request of a request with an empty query.
pub(crate) fn canonical_request(
    method: &str,
    path: &str,
    headers: &[(String, String)],
    signed: &[&str],
    body: &[u8],
) -> String {
    let mut out = format!("{method}\n{path}\n\n");
    for name in signed {
        let values: Vec<String> = headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect();
        out.push_str(&format!("{name}:{}\n", values.join(",")));
    }
    out.push('\n');
    out.push_str(&signed.join(";"));
    out.push('\n');
    out.push_str(&hex(digest::digest(&digest::SHA256, body).as_ref()));
    out
}

/// The SigV4 signing key: the HMAC chain over date, region, service and
/// `aws4_request`.
fn signing_key(secret: &str, date: &str, region: &str, service: &str) -> hmac::Key {
    let step = |key: &[u8], data: &str| {
        hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), data.as_bytes())
            .as_ref()
            .to_vec()
    };
    let k = step(format!("AWS4{secret}").as_bytes(), date);
    let k = step(&k, region);
    let k = step(&k, service);
    hmac::Key::new(hmac::HMAC_SHA256, &step(&k, "aws4_request"))
}

/// The SigV4 signature of `string_to_sign`.
#[cfg(test)]
pub(crate) fn signature(
    secret: &str,
    date: &str,
    region: &str,
    service: &str,
    string_to_sign: &str,
) -> String {
    let key = signing_key(secret, date, region, service);
    hex(hmac::sign(&key, string_to_sign.as_bytes()).as_ref())
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The parts of a SigV4 `Authorization` header.
#[derive(Debug, PartialEq)]
pub(crate) struct Authorization {
    pub access_key_id: String,
    pub date: String,
    pub region: String,
    pub service: String,
    pub signed_headers: Vec<String>,
    pub signature: String,
}

/// Parse `AWS4-HMAC-SHA256 Credential=…, SignedHeaders=…, Signature=…`.
pub(crate) fn parse_authorization(value: &str) -> Result<Authorization, String> {
    let rest = value
        .strip_prefix("AWS4-HMAC-SHA256 ")
        .ok_or("the Authorization header is not AWS4-HMAC-SHA256")?;
    let mut credential = None;
    let mut signed = None;
    let mut sig = None;
    for part in rest.split(',').map(str::trim) {
        if let Some(v) = part.strip_prefix("Credential=") {
            credential = Some(v);
        } else if let Some(v) = part.strip_prefix("SignedHeaders=") {
            signed = Some(v);
        } else if let Some(v) = part.strip_prefix("Signature=") {
            sig = Some(v);
        }
    }
    let (Some(credential), Some(signed), Some(sig)) = (credential, signed, sig) else {
        return Err("the Authorization header lacks Credential, SignedHeaders or Signature".into());
    };
    let scope: Vec<&str> = credential.split('/').collect();
    let [key, date, region, service, "aws4_request"] = scope[..] else {
        return Err(
            "the credential scope is not <key>/<date>/<region>/<service>/aws4_request".into(),
        );
    };
    if key.is_empty() || date.len() != 8 || !date.bytes().all(|b| b.is_ascii_digit()) {
        return Err("the credential scope has no access key or no date".into());
    }
    if sig.len() != 64 || !sig.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return Err("the signature is not 64 lower-case hex digits".into());
    }
    let signed_headers: Vec<String> = signed.split(';').map(str::to_owned).collect();
    if signed_headers
        .iter()
        .any(|h| h.is_empty() || h.to_lowercase() != *h)
    {
        return Err("SignedHeaders is not a list of lower-case names".into());
    }
    Ok(Authorization {
        access_key_id: key.to_owned(),
        date: date.to_owned(),
        region: region.to_owned(),
        service: service.to_owned(),
        signed_headers,
        signature: sig.to_owned(),
    })
}

/// Seconds since the epoch of `YYYYMMDDTHHMMSSZ`.
fn amz_date_secs(v: &str) -> Option<i64> {
    let b = v.as_bytes();
    if b.len() != 16 || b[8] != b'T' || b[15] != b'Z' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| v.get(r)?.parse::<i64>().ok();
    let (y, m, d) = (num(0..4)?, num(4..6)?, num(6..8)?);
    let (hh, mm, ss) = (num(9..11)?, num(11..13)?, num(13..15)?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) || hh > 23 || mm > 59 || ss > 60 {
        return None;
    }
    // Days from civil (proleptic Gregorian).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hh * 3600 + mm * 60 + ss)
}

fn b64(field: &str, v: &str) -> Result<Vec<u8>, String> {
    base64::engine::general_purpose::STANDARD
        .decode(v.trim())
        .map_err(|_| format!("{field} is not base64"))
}

/// Check an AWS login; the caller's ARN when the key is seeded.
pub(crate) fn check_aws(
    auth: &SeedAwsAuth,
    method: &str,
    body_b64: &str,
    headers_b64: &str,
    now_secs: i64,
) -> Result<Option<String>, String> {
    if method != "POST" {
        return Err(format!("iamHttpRequestMethod must be POST, not {method:?}"));
    }
    let body = b64("iamRequestBody", body_b64)?;
    if body != GET_CALLER_IDENTITY.as_bytes() {
        return Err("iamRequestBody is not a GetCallerIdentity request".into());
    }
    let raw = b64("iamRequestHeaders", headers_b64)?;
    let map: serde_json::Map<String, Value> = serde_json::from_slice(&raw)
        .map_err(|_| "iamRequestHeaders is not a JSON object".to_owned())?;
    let mut headers = Vec::new();
    for (k, v) in map {
        match v {
            Value::String(s) => headers.push((k.to_lowercase(), s)),
            Value::Array(items) => {
                for item in items {
                    if let Value::String(s) = item {
                        headers.push((k.to_lowercase(), s));
                    }
                }
            }
            _ => return Err(format!("iamRequestHeaders: header {k} is not a string")),
        }
    }
    let get = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let authz = parse_authorization(get("authorization").ok_or("no Authorization header")?)?;
    if authz.service != "sts" {
        return Err(format!(
            "the request is signed for {:?}, not sts",
            authz.service
        ));
    }
    for needed in ["host", "x-amz-date"] {
        if get(needed).is_none() {
            return Err(format!("no {needed} header"));
        }
        if !authz.signed_headers.iter().any(|h| h == needed) {
            return Err(format!("{needed} is not among the signed headers"));
        }
    }
    let amz_date = get("x-amz-date").unwrap_or_default();
    let when = amz_date_secs(amz_date).ok_or("X-Amz-Date is not YYYYMMDDTHHMMSSZ")?;
    if (now_secs - when).abs() > MAX_SKEW_SECS {
        return Err("X-Amz-Date is more than 15 minutes from now".into());
    }
    if !amz_date.starts_with(&authz.date) {
        return Err("X-Amz-Date does not match the credential scope date".into());
    }
    let key = auth
        .keys
        .iter()
        .find(|k| k.access_key_id == authz.access_key_id);
    let Some(key) = key else {
        if auth.allowed_principal_arns.0.is_empty() && auth.allowed_account_ids.0.is_empty() {
            return Ok(None);
        }
        return Err(format!(
            "access key {} is unknown to the dev server (seed it under awsAuth.keys)",
            authz.access_key_id
        ));
    };
    let signed: Vec<&str> = authz.signed_headers.iter().map(String::as_str).collect();
    let canonical = canonical_request("POST", "/", &headers, &signed, &body);
    let string_to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{}/{}/sts/aws4_request\n{}",
        authz.date,
        authz.region,
        hex(digest::digest(&digest::SHA256, canonical.as_bytes()).as_ref())
    );
    // Checked in constant time by ring.
    let signing = signing_key(&key.secret_access_key, &authz.date, &authz.region, "sts");
    let good = unhex(&authz.signature)
        .is_some_and(|sig| hmac::verify(&signing, string_to_sign.as_bytes(), &sig).is_ok());
    if !good {
        return Err("the signature does not match (SignatureDoesNotMatch)".into());
    }
    let arn = key.arn.clone();
    let account = arn.split(':').nth(4).unwrap_or_default();
    let allowed = &auth.allowed_principal_arns.0;
    if !allowed.is_empty() && !allowed.iter().any(|p| wildcard(p, &arn)) {
        return Err(format!("principal {arn} is not allowed"));
    }
    let accounts = &auth.allowed_account_ids.0;
    if !accounts.is_empty() && !accounts.iter().any(|a| a == account) {
        return Err(format!("account {account} is not allowed"));
    }
    Ok(Some(arn))
}

/// `*` matches any run of characters (ARNs contain `/`).
fn wildcard(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !text.starts_with(first) || !text[first.len()..].ends_with(last) {
        return false;
    }
    let mut rest = &text[first.len()..text.len() - last.len()];
    for mid in &parts[1..parts.len() - 1] {
        match rest.find(mid) {
            Some(i) => rest = &rest[i + mid.len()..],
            None => return false,
        }
    }
    true
}

/// Check a JWT's structure, time claims and (with keys) its RS256
/// signature; its claims.
pub(crate) fn check_jwt(jwt: &str, keys: &[SeedJwk], now_secs: i64) -> Result<Value, String> {
    let parts: Vec<&str> = jwt.trim().split('.').collect();
    let [h, c, s] = parts[..] else {
        return Err("the token is not a JWT (three dot-separated parts)".into());
    };
    let d = |p: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(p);
    let header: Value = d(h)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or("the JWT header is not base64url JSON")?;
    let claims: Value = d(c)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .filter(Value::is_object)
        .ok_or("the JWT claims are not base64url JSON")?;
    let sig = d(s).map_err(|_| "the JWT signature is not base64url")?;
    let exp = claims["exp"].as_i64().ok_or("the JWT has no exp")?;
    if exp <= now_secs {
        return Err("the JWT has expired".into());
    }
    if claims["nbf"]
        .as_i64()
        .is_some_and(|nbf| nbf > now_secs + 60)
    {
        return Err("the JWT is not valid yet".into());
    }
    if !keys.is_empty() {
        if header["alg"] != "RS256" {
            return Err("the JWT is not RS256".into());
        }
        let kid = header["kid"].as_str();
        let message = format!("{h}.{c}");
        let verified = keys
            .iter()
            .filter(|k| match (k.kid.as_deref(), kid) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            })
            .filter_map(rsa_key)
            .any(|(n, e)| {
                ring::signature::RsaPublicKeyComponents { n: &n, e: &e }
                    .verify(
                        &ring::signature::RSA_PKCS1_2048_8192_SHA256,
                        message.as_bytes(),
                        &sig,
                    )
                    .is_ok()
            });
        if !verified {
            return Err("the JWT signature does not verify with the identity's keys".into());
        }
    }
    Ok(claims)
}

/// Whether the `aud` claim (a string or a list) holds `want` (a trailing
/// `/` does not matter).
pub(crate) fn has_audience(claims: &Value, want: &str) -> bool {
    let norm = |s: &str| s.trim_end_matches('/').to_owned();
    match &claims["aud"] {
        Value::String(a) => norm(a) == norm(want),
        Value::Array(items) => items
            .iter()
            .filter_map(Value::as_str)
            .any(|a| norm(a) == norm(want)),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seed::{SeedAwsKey, SeedList};

    /// The AWS SigV4 test suite's `get-vanilla` and
    /// `post-x-www-form-urlencoded`: canonical request, its hash and the
    /// signature.
    #[test]
    fn sigv4_suite_vectors() {
        let secret = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
        let headers = vec![
            ("host".to_owned(), "example.amazonaws.com".to_owned()),
            ("x-amz-date".to_owned(), "20150830T123600Z".to_owned()),
        ];
        let creq = canonical_request("GET", "/", &headers, &["host", "x-amz-date"], b"");
        assert_eq!(
            creq,
            "GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        let hash = hex(digest::digest(&digest::SHA256, creq.as_bytes()).as_ref());
        assert_eq!(
            hash,
            "bb579772317eb040ac9ed261061d46c1f17a8133879d6129b6e1c25292927e63"
        );
        let sts = format!(
            "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\n{hash}"
        );
        assert_eq!(
            signature(secret, "20150830", "us-east-1", "service", &sts),
            "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
        );

        let mut headers = headers;
        headers.push((
            "content-type".to_owned(),
            "application/x-www-form-urlencoded".to_owned(),
        ));
        let creq = canonical_request(
            "POST",
            "/",
            &headers,
            &["content-type", "host", "x-amz-date"],
            b"Param1=value1",
        );
        assert_eq!(
            creq,
            "POST\n/\n\ncontent-type:application/x-www-form-urlencoded\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\ncontent-type;host;x-amz-date\n9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e"
        );
        let hash = hex(digest::digest(&digest::SHA256, creq.as_bytes()).as_ref());
        let sts = format!(
            "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\n{hash}"
        );
        assert_eq!(
            signature(secret, "20150830", "us-east-1", "service", &sts),
            "ff11897932ad3f4e8b18135d722051e5ac45fc38421b1da7b9d196a0fe09473a"
        );
    }

    fn signed_login(secret: &str, date: &str) -> (String, String) {
        let b = |s: &[u8]| base64::engine::general_purpose::STANDARD.encode(s);
        let mut headers = vec![
            ("host".to_owned(), "sts.amazonaws.com".to_owned()),
            ("x-amz-date".to_owned(), date.to_owned()),
        ];
        let creq = canonical_request(
            "POST",
            "/",
            &headers,
            &["host", "x-amz-date"],
            GET_CALLER_IDENTITY.as_bytes(),
        );
        let sts = format!(
            "AWS4-HMAC-SHA256\n{date}\n{}/us-east-1/sts/aws4_request\n{}",
            &date[..8],
            hex(digest::digest(&digest::SHA256, creq.as_bytes()).as_ref())
        );
        let sig = signature(secret, &date[..8], "us-east-1", "sts", &sts);
        headers.push((
            "authorization".to_owned(),
            format!(
                "AWS4-HMAC-SHA256 Credential=AKIATEST/{}/us-east-1/sts/aws4_request, SignedHeaders=host;x-amz-date, Signature={sig}",
                &date[..8]
            ),
        ));
        let map: serde_json::Map<String, Value> = headers
            .into_iter()
            .map(|(k, v)| (k, Value::String(v)))
            .collect();
        (
            b(GET_CALLER_IDENTITY.as_bytes()),
            b(&serde_json::to_vec(&map).unwrap()),
        )
    }

    #[test]
    fn aws_logins_are_checked() {
        // 2015-08-30T12:36:00Z.
        let now = 1_440_938_160;
        assert_eq!(amz_date_secs("20150830T123600Z"), Some(now));
        let auth = SeedAwsAuth {
            allowed_principal_arns: SeedList(vec![
                "arn:aws:sts::111122223333:assumed-role/app/*".into(),
            ]),
            allowed_account_ids: SeedList(vec!["111122223333".into()]),
            keys: vec![SeedAwsKey {
                access_key_id: "AKIATEST".into(),
                secret_access_key: "s3cret".into(),
                arn: "arn:aws:sts::111122223333:assumed-role/app/pod".into(),
            }],
            ..SeedAwsAuth::default()
        };
        let (body, headers) = signed_login("s3cret", "20150830T123600Z");
        assert_eq!(
            check_aws(&auth, "POST", &body, &headers, now)
                .unwrap()
                .as_deref(),
            Some("arn:aws:sts::111122223333:assumed-role/app/pod")
        );
        let err = check_aws(&auth, "POST", &body, &headers, now + 3600).unwrap_err();
        assert!(err.contains("15 minutes"), "{err}");
        let (body2, headers2) = signed_login("wrong", "20150830T123600Z");
        let err = check_aws(&auth, "POST", &body2, &headers2, now).unwrap_err();
        assert!(err.contains("SignatureDoesNotMatch"), "{err}");
        let mut denied = auth.clone();
        denied.allowed_account_ids = SeedList(vec!["999".into()]);
        assert!(check_aws(&denied, "POST", &body, &headers, now).is_err());
        // Shape only: no keys, no allow lists.
        let open = SeedAwsAuth::default();
        assert_eq!(check_aws(&open, "POST", &body2, &headers2, now), Ok(None));
        assert!(check_aws(&open, "GET", &body, &headers, now).is_err());
        let bad = base64::engine::general_purpose::STANDARD.encode(b"Action=Other");
        assert!(check_aws(&open, "POST", &bad, &headers, now).is_err());
    }

    #[test]
    fn authorization_format() {
        let ok = "AWS4-HMAC-SHA256 Credential=AK/20150830/us-east-1/sts/aws4_request, SignedHeaders=host;x-amz-date, Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31";
        assert_eq!(parse_authorization(ok).unwrap().region, "us-east-1");
        for bad in [
            "Bearer x",
            "AWS4-HMAC-SHA256 Credential=AK/20150830/us-east-1/sts, SignedHeaders=host, Signature=00",
            "AWS4-HMAC-SHA256 Credential=AK/20150830/us-east-1/sts/aws4_request, SignedHeaders=host, Signature=XYZ",
        ] {
            assert!(parse_authorization(bad).is_err(), "{bad}");
        }
        assert!(wildcard("arn:aws:iam::1:role/*", "arn:aws:iam::1:role/a/b"));
        assert!(!wildcard("arn:aws:iam::1:role/a", "arn:aws:iam::1:role/b"));
    }

    #[test]
    fn jwt_structure_and_claims() {
        let b = |v: &Value| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string().as_bytes())
        };
        let jwt = format!(
            "{}.{}.c2ln",
            b(&serde_json::json!({"alg": "RS256"})),
            b(&serde_json::json!({"aud": ["x", "https://management.azure.com"], "exp": 200}))
        );
        let claims = check_jwt(&jwt, &[], 100).unwrap();
        assert!(has_audience(&claims, "https://management.azure.com/"));
        assert!(check_jwt(&jwt, &[], 300).is_err());
        assert!(check_jwt("a.b", &[], 100).is_err());
        let key = SeedJwk {
            kid: None,
            n: "AQAB".into(),
            e: "AQAB".into(),
        };
        assert!(check_jwt(&jwt, &[key], 100).is_err());
    }
}
