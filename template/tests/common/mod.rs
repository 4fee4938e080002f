//! Shared test helpers: an engine, secret data, a PKI made with rcgen, and
//! access to the `openssl` command when the machine has it.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use kms_template::{Engine, Limits, SecretData, SecretEntry, TemplateError};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};

pub fn engine() -> Engine {
    Engine::new(Limits::default())
}

pub fn data(pairs: &[(&str, &str)]) -> SecretData {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), SecretEntry::new(*v, "/")))
        .collect()
}

pub fn render(source: &str, data: &SecretData) -> Result<String, TemplateError> {
    engine().render("template.data.test", source, data)
}

pub fn ok(source: &str, data: &SecretData) -> String {
    match render(source, data) {
        Ok(out) => out,
        Err(err) => panic!("template {source:?} failed: {err}"),
    }
}

pub fn err(source: &str, data: &SecretData) -> TemplateError {
    match render(source, data) {
        Ok(out) => panic!("template {source:?} rendered {out:?}, expected an error"),
        Err(err) => err,
    }
}

/// A certificate and its key, PEM.
pub struct Issued {
    pub cert: String,
    pub key: String,
}

/// root → intermediate → leaf, ECDSA P-256 unless a key is given.
pub struct Pki {
    pub root: Issued,
    pub intermediate: Issued,
    pub leaf: Issued,
}

fn ca_params(cn: &str) -> CertificateParams {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name.push(DnType::CommonName, cn);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.use_authority_key_identifier_extension = true;
    params
}

pub fn pki() -> Pki {
    pki_with_leaf_key(KeyPair::generate().unwrap())
}

pub fn pki_with_leaf_key(leaf_key: KeyPair) -> Pki {
    let root_key = KeyPair::generate().unwrap();
    let root_params = ca_params("Test Root CA");
    let root_cert = root_params.self_signed(&root_key).unwrap();
    let root_issuer = Issuer::new(root_params, &root_key);

    let inter_key = KeyPair::generate().unwrap();
    let inter_params = ca_params("Test Intermediate CA");
    let inter_cert = inter_params.signed_by(&inter_key, &root_issuer).unwrap();
    let inter_issuer = Issuer::new(inter_params, &inter_key);

    let mut leaf_params = CertificateParams::new(vec!["app.example.test".to_string()]).unwrap();
    leaf_params
        .distinguished_name
        .push(DnType::CommonName, "app.example.test");
    leaf_params.use_authority_key_identifier_extension = true;
    let leaf_cert = leaf_params.signed_by(&leaf_key, &inter_issuer).unwrap();

    Pki {
        root: Issued {
            cert: root_cert.pem(),
            key: root_key.serialize_pem(),
        },
        intermediate: Issued {
            cert: inter_cert.pem(),
            key: inter_key.serialize_pem(),
        },
        leaf: Issued {
            cert: leaf_cert.pem(),
            key: leaf_key.serialize_pem(),
        },
    }
}

/// The `openssl` command, when the machine has one.
pub fn openssl() -> Option<PathBuf> {
    let found = Command::new("openssl").arg("version").output().ok()?;
    found.status.success().then(|| PathBuf::from("openssl"))
}

/// A fresh scratch directory.
pub fn scratch() -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "kms-template-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs openssl with `args` in `dir`; panics with its stderr on failure.
pub fn run_openssl(dir: &PathBuf, args: &[&str]) -> Vec<u8> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl runs");
    assert!(
        out.status.success(),
        "openssl {:?} failed: {}",
        args,
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Splits a PEM text into its blocks (as text).
pub fn pem_blocks(text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        current.push_str(line);
        current.push('\n');
        if line.starts_with("-----END ") {
            blocks.push(std::mem::take(&mut current));
        }
    }
    blocks
}

/// The DER of every block of a PEM text.
pub fn pem_ders(text: &str) -> Vec<Vec<u8>> {
    pem::parse_many(text)
        .unwrap()
        .into_iter()
        .map(|p| p.into_contents())
        .collect()
}
