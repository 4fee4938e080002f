//! Access tokens: JWTs (HS256) signed with a key of this server, naming an
//! access-token record. Checks follow the real server's order and wording:
//! a token that is not a JWT of this server is refused with 403
//! `TokenError`; a well-formed one whose record is gone or expired with 401.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::hmac;
use serde::{Deserialize, Serialize};

use crate::errors::ApiError;

/// The claim that marks identity access tokens.
const IDENTITY_ACCESS_TOKEN: &str = "identityAccessToken";

/// Claims of an access token.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Claims {
    pub identity_id: String,
    pub identity_access_token_id: String,
    pub auth_token_type: String,
    pub iat: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exp: Option<i64>,
}

#[derive(Serialize, Deserialize)]
struct Header {
    alg: String,
    typ: Option<String>,
}

/// Why a bearer token is not a valid JWT of this server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JwtError {
    /// Not three dot-separated parts.
    Malformed,
    /// Parts that do not decode.
    Invalid,
    /// Not HS256.
    Algorithm,
    /// Signed with another key (for instance by an earlier in-memory server).
    Signature,
    /// Past its `exp`.
    Expired,
}

impl From<JwtError> for ApiError {
    fn from(e: JwtError) -> Self {
        ApiError::token_error(match e {
            JwtError::Malformed => {
                "The provided access token is malformed. Please use a valid token or generate a new one and try again."
            }
            JwtError::Invalid => "invalid token",
            JwtError::Algorithm => {
                "The access token is signed with an invalid algorithm. Please provide a valid token and try again."
            }
            JwtError::Signature => "invalid signature",
            JwtError::Expired => "Your token has expired. Please re-authenticate.",
        })
    }
}

/// Signs and checks access tokens.
pub(crate) struct Signer {
    key: hmac::Key,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Signer")
    }
}

impl Signer {
    /// A signer with this key.
    pub fn new(key: &[u8]) -> Signer {
        Signer {
            key: hmac::Key::new(hmac::HMAC_SHA256, key),
        }
    }

    /// A JWT for an access-token record, valid until `exp` (seconds) if set.
    pub fn issue(&self, identity_id: &str, token_id: &str, iat: i64, exp: Option<i64>) -> String {
        let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
        let claims = Claims {
            identity_id: identity_id.to_owned(),
            identity_access_token_id: token_id.to_owned(),
            auth_token_type: IDENTITY_ACCESS_TOKEN.to_owned(),
            iat,
            exp,
        };
        let payload = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims).unwrap_or_default());
        let signing_input = format!("{header}.{payload}");
        let tag = hmac::sign(&self.key, signing_input.as_bytes());
        format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(tag.as_ref()))
    }

    /// The claims of `token` if it is a valid, unexpired JWT of this server
    /// (`now` in seconds).
    pub fn verify(&self, token: &str, now: i64) -> Result<Claims, JwtError> {
        let parts: Vec<&str> = token.split('.').collect();
        let [header, payload, signature] = parts.as_slice() else {
            return Err(JwtError::Malformed);
        };
        let header_bytes = URL_SAFE_NO_PAD
            .decode(header)
            .map_err(|_| JwtError::Invalid)?;
        let header: Header =
            serde_json::from_slice(&header_bytes).map_err(|_| JwtError::Invalid)?;
        if header.alg != "HS256" {
            return Err(JwtError::Algorithm);
        }
        let tag = URL_SAFE_NO_PAD
            .decode(signature)
            .map_err(|_| JwtError::Invalid)?;
        let signing_input = &token[..token.len() - signature.len() - 1];
        hmac::verify(&self.key, signing_input.as_bytes(), &tag).map_err(|_| JwtError::Signature)?;
        let payload_bytes = URL_SAFE_NO_PAD
            .decode(payload)
            .map_err(|_| JwtError::Invalid)?;
        let claims: Claims =
            serde_json::from_slice(&payload_bytes).map_err(|_| JwtError::Invalid)?;
        if claims.exp.is_some_and(|exp| now >= exp) {
            return Err(JwtError::Expired);
        }
        if claims.auth_token_type != IDENTITY_ACCESS_TOKEN {
            return Err(JwtError::Invalid);
        }
        Ok(claims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_refusals() {
        let signer = Signer::new(&[7u8; 32]);
        let token = signer.issue("ident", "tok", 100, Some(200));
        assert_eq!(token.split('.').count(), 3);
        let claims = signer.verify(&token, 150).expect("valid");
        assert_eq!(claims.identity_access_token_id, "tok");
        assert_eq!(signer.verify(&token, 200), Err(JwtError::Expired));
        assert_eq!(
            Signer::new(&[8u8; 32]).verify(&token, 150),
            Err(JwtError::Signature)
        );
        assert_eq!(
            signer.verify("this-is-not-a-valid-token", 0),
            Err(JwtError::Malformed)
        );
        assert_eq!(signer.verify("a.b.c", 0), Err(JwtError::Invalid));
        assert_eq!(signer.verify("..", 0), Err(JwtError::Invalid));
        let mut tampered = token.clone();
        tampered.insert(token.find('.').map_or(0, |i| i + 2), 'x');
        assert!(signer.verify(&tampered, 150).is_err());
        let none = URL_SAFE_NO_PAD.encode(br#"{"alg":"none"}"#);
        assert_eq!(
            signer.verify(&format!("{none}.e30."), 0),
            Err(JwtError::Algorithm)
        );
        let forever = signer.issue("ident", "tok", 100, None);
        assert!(signer.verify(&forever, i64::MAX).is_ok());
    }
}
