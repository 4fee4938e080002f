//! PEM blocks and certificate chains: `filterPEM`, `filterCertChain`, and
//! the chain ordering shared with the PKCS#12 readers.
//!
//! PEM is parsed with the `pem` crate and certificates with `x509-parser`.
//! Output PEM is re-encoded (64-column base64, `\n` line ends).
//!
//! Chain order: certificate B issued certificate A when A's issuer name is
//! B's subject name and, when both key identifiers are present, A's
//! authority key identifier equals B's subject key identifier (or, names
//! aside, when those identifiers match). A root is self-issued (subject =
//! issuer) with no authority key identifier or one equal to its own subject
//! key identifier. The leaf is the one certificate that issued no other.

use minijinja::{Error, State, Value};
use x509_parser::extensions::ParsedExtension;
use x509_parser::prelude::FromDer;

use crate::args::{arity, fail, reserve_usize, text, work};
use crate::cost;

/// Fuel of parsing one certificate, besides its bytes.
const CERT_FUEL: u64 = 200;

/// DER bytes of a certificate one fuel pays for when parsed.
const CERT_BYTES_PER_FUEL: u64 = 16;

/// Encodes one PEM block.
pub(crate) fn encode(tag: &str, der: &[u8]) -> String {
    pem::encode_config(
        &pem::Pem::new(tag, der.to_vec()),
        pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
    )
}

/// Parses every PEM block of `input`. Text between blocks is skipped. The
/// scan and the decoded blocks are charged first.
pub(crate) fn parse(state: &State, func: &str, input: &str) -> Result<Vec<pem::Pem>, Error> {
    work(state, cost::bytes_usize(input.len()))?;
    reserve_usize(state, input.len())?;
    pem::parse_many(input).map_err(|_| fail(func, "the input holds a malformed PEM block"))
}

/// Whether non-blank text follows the last PEM block (or there is no block
/// and the input is not blank).
fn has_trailing_junk(input: &str) -> bool {
    let Some(end) = input.rfind("-----END ") else {
        return !input.trim().is_empty();
    };
    let rest = &input[end + "-----END ".len()..];
    match rest.find("-----") {
        Some(close) => !rest[close + 5..].trim().is_empty(),
        None => true,
    }
}

/// `filterPEM(pemType, input)`: the blocks of that type (case-insensitive),
/// trimmed of surrounding blank space. When nothing matched and the input
/// holds something that is not PEM, that is an error (as in the reference).
pub(crate) fn filter_pem(state: &State, args: &[Value]) -> Result<Value, Error> {
    arity("filterPEM", args, 2, 2)?;
    let wanted = text(state, "filterPEM", "the PEM type", &args[0])?;
    let input = text(state, "filterPEM", "the input", &args[1])?;
    let blocks = parse(state, "filterPEM", &input)?;
    reserve_usize(state, input.len().saturating_mul(2))?;
    let mut out = String::new();
    for block in blocks
        .iter()
        .filter(|b| b.tag().eq_ignore_ascii_case(&wanted))
    {
        out.push_str(&pem::encode_config(
            block,
            pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF),
        ));
    }
    if out.is_empty() && has_trailing_junk(&input) {
        return Err(fail(
            "filterPEM",
            "no block of the requested type, and the input holds text that is not PEM",
        ));
    }
    Ok(Value::from(out.trim()))
}

/// What chain ordering needs to know about a certificate.
#[derive(Debug, Clone)]
pub(crate) struct CertInfo {
    pub der: Vec<u8>,
    subject: Vec<u8>,
    issuer: Vec<u8>,
    aki: Option<Vec<u8>>,
    ski: Option<Vec<u8>>,
    /// The raw SubjectPublicKeyInfo.
    pub spki: Vec<u8>,
}

impl CertInfo {
    /// Parses a DER certificate (charged first).
    pub(crate) fn from_der(state: &State, func: &str, der: &[u8]) -> Result<CertInfo, Error> {
        work(
            state,
            CERT_FUEL.saturating_add((der.len() as u64).div_ceil(CERT_BYTES_PER_FUEL)),
        )?;
        let (_, cert) = x509_parser::certificate::X509Certificate::from_der(der)
            .map_err(|_| fail(func, "a certificate does not parse as X.509"))?;
        let mut aki = None;
        let mut ski = None;
        for ext in cert.extensions() {
            match ext.parsed_extension() {
                ParsedExtension::AuthorityKeyIdentifier(a) => {
                    aki = a.key_identifier.as_ref().map(|k| k.0.to_vec());
                }
                ParsedExtension::SubjectKeyIdentifier(k) => ski = Some(k.0.to_vec()),
                _ => {}
            }
        }
        Ok(CertInfo {
            der: der.to_vec(),
            subject: cert.subject().as_raw().to_vec(),
            issuer: cert.issuer().as_raw().to_vec(),
            aki,
            ski,
            spki: cert.public_key().raw.to_vec(),
        })
    }

    /// Whether `self` was issued by `parent`.
    fn issued_by(&self, parent: &CertInfo) -> bool {
        let ids = match (&self.aki, &parent.ski) {
            (Some(aki), Some(ski)) => Some(aki == ski),
            _ => None,
        };
        match ids {
            Some(ids_match) => ids_match,
            None => self.issuer == parent.subject,
        }
    }

    /// Self-issued with no authority key identifier, or one equal to its own
    /// subject key identifier.
    pub(crate) fn is_root(&self) -> bool {
        self.subject == self.issuer
            && match (&self.aki, &self.ski) {
                (Some(aki), Some(ski)) => aki == ski,
                _ => true,
            }
    }
}

/// Parses the `CERTIFICATE` blocks of a PEM text (other blocks are skipped),
/// dropping exact duplicates.
pub(crate) fn certificates(state: &State, func: &str, input: &str) -> Result<Vec<CertInfo>, Error> {
    let mut certs: Vec<CertInfo> = Vec::new();
    for block in parse(state, func, input)? {
        if !block.tag().eq_ignore_ascii_case("CERTIFICATE") {
            continue;
        }
        let info = CertInfo::from_der(state, func, block.contents())?;
        work(state, cost::nodes(certs.len() as u64))?;
        if !certs.iter().any(|c| c.der == info.der) {
            certs.push(info);
        }
    }
    Ok(certs)
}

/// The result of ordering a set of certificates.
pub(crate) struct Ordered {
    /// Indexes into the input, leaf first.
    pub order: Vec<usize>,
    /// Whether the certificates form exactly one chain from `order[0]`.
    pub complete: bool,
}

/// Fuel of [`order`]ing `n` certificates (it compares every pair).
pub(crate) fn order_fuel(n: usize) -> u64 {
    cost::nodes((n as u64).saturating_mul(n as u64))
}

/// Orders `certs` leaf → intermediates → root. The walk starts at `leaf`
/// when given (the certificate of a PKCS#12 key), else at the one
/// certificate that issued no other. When that is ambiguous the input
/// order is kept; certificates the walk does not reach follow in input order.
/// The caller charges [`order_fuel`] first.
pub(crate) fn order(certs: &[CertInfo], leaf: Option<usize>) -> Ordered {
    let n = certs.len();
    let start = leaf.or_else(|| {
        if n == 1 {
            return Some(0);
        }
        let mut candidates = (0..n).filter(|&i| {
            !(0..n).any(|j| j != i && certs[j].issued_by(&certs[i]) && !certs[j].is_root())
        });
        let first = candidates.next()?;
        candidates.next().is_none().then_some(first)
    });
    let Some(start) = start else {
        return Ordered {
            order: (0..n).collect(),
            complete: false,
        };
    };
    let mut order = vec![start];
    let mut placed = vec![false; n];
    placed[start] = true;
    let mut current = start;
    while !certs[current].is_root() {
        let next = (0..n).find(|&j| !placed[j] && certs[current].issued_by(&certs[j]));
        match next {
            Some(j) => {
                order.push(j);
                placed[j] = true;
                current = j;
            }
            None => break,
        }
    }
    let complete = order.len() == n;
    order.extend((0..n).filter(|&i| !placed[i]));
    Ordered { order, complete }
}

/// `filterCertChain(certType, input)`: `leaf`, `intermediate` or `root` from
/// a bundle in any order. Empty when the bundle has no such certificate
/// (a lone root has no leaf; a chain without its root has no root).
pub(crate) fn filter_cert_chain(state: &State, args: &[Value]) -> Result<Value, Error> {
    const FUNC: &str = "filterCertChain";
    arity(FUNC, args, 2, 2)?;
    let cert_type = text(state, FUNC, "the certificate type", &args[0])?.to_ascii_lowercase();
    if !matches!(cert_type.as_str(), "leaf" | "intermediate" | "root") {
        return Err(fail(
            FUNC,
            "the certificate type must be leaf, intermediate or root",
        ));
    }
    let input = text(state, FUNC, "the input", &args[1])?;
    let certs = certificates(state, FUNC, &input)?;
    if certs.is_empty() {
        return Err(fail(FUNC, "the input holds no certificate"));
    }
    work(state, order_fuel(certs.len()))?;
    let ordered = order(&certs, None);
    reserve_usize(state, input.len().saturating_mul(2))?;
    if !ordered.complete {
        return Err(fail(FUNC, "the certificates do not form a single chain"));
    }
    let chain: Vec<&CertInfo> = ordered.order.iter().map(|&i| &certs[i]).collect();
    let mut out = String::new();
    match cert_type.as_str() {
        "leaf" => {
            if !chain[0].is_root() {
                out.push_str(&encode("CERTIFICATE", &chain[0].der));
            }
        }
        "intermediate" => {
            for cert in chain.iter().skip(1).filter(|c| !c.is_root()) {
                out.push_str(&encode("CERTIFICATE", &cert.der));
            }
        }
        _ => {
            if let Some(root) = chain.last().filter(|c| c.is_root()) {
                out.push_str(&encode("CERTIFICATE", &root.der));
            }
        }
    }
    Ok(Value::from(out))
}
