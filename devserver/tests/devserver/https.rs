//! HTTPS: a dev server given a certificate signed by a test CA is reachable
//! by a client that trusts that CA, and refused by one that does not (and
//! by plain HTTP); bad certificate settings stop it from starting.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use kms_devserver::Config;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::RootCertStore;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::common::{Client, config, demo_seed, start_config};

/// A CA and a server certificate it signed for `localhost` and 127.0.0.1,
/// written as PEM files; the CA's certificate.
struct Pki {
    _dir: tempfile::TempDir,
    cert: PathBuf,
    key: PathBuf,
    ca: CertificateDer<'static>,
}

fn ca(name: &str) -> (CertificateParams, KeyPair) {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    (params, KeyPair::generate().expect("CA key"))
}

fn pki() -> Pki {
    let (ca_params, ca_key) = ca("dev-server test CA");
    let ca_cert = ca_params.self_signed(&ca_key).expect("CA certificate");
    let issuer = Issuer::new(ca_params, ca_key);
    let params = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
        .expect("server params");
    let key = KeyPair::generate().expect("server key");
    let cert = params.signed_by(&key, &issuer).expect("server certificate");
    let dir = tempfile::tempdir().expect("tempdir");
    let cert_path = dir.path().join("tls.crt");
    let key_path = dir.path().join("tls.key");
    std::fs::write(&cert_path, cert.pem()).expect("write cert");
    std::fs::write(&key_path, key.serialize_pem()).expect("write key");
    Pki {
        cert: cert_path,
        key: key_path,
        ca: ca_cert.der().clone(),
        _dir: dir,
    }
}

fn connector(roots: &[CertificateDer<'static>]) -> TlsConnector {
    let mut store = RootCertStore::empty();
    for root in roots {
        store.add(root.clone()).expect("root");
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(store)
    .with_no_client_auth();
    TlsConnector::from(Arc::new(config))
}

/// A request over TLS; `Err` when the handshake or the exchange fails.
async fn https(
    addr: SocketAddr,
    roots: &[CertificateDer<'static>],
    server_name: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&Value>,
) -> Result<(u16, Value), String> {
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let name = ServerName::try_from(server_name.to_owned()).map_err(|e| e.to_string())?;
    let tls = connector(roots)
        .connect(name, tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", server_name);
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let bytes = match body {
        Some(b) => {
            req = req.header("content-type", "application/json");
            serde_json::to_vec(b).map_err(|e| e.to_string())?
        }
        None => Vec::new(),
    };
    let resp = sender
        .send_request(
            req.body(Full::new(Bytes::from(bytes)))
                .map_err(|e| e.to_string())?,
        )
        .await
        .map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    let json = serde_json::from_slice(&body).unwrap_or(Value::Null);
    Ok((status, json))
}

fn tls_config(cert: &Path, key: &Path) -> Config {
    Config {
        tls_cert: Some(cert.to_path_buf()),
        tls_key: Some(key.to_path_buf()),
        ..config(demo_seed())
    }
}

#[tokio::test]
async fn reachable_with_the_ca_it_was_given_and_refused_without() {
    let pki = pki();
    let server = start_config(tls_config(&pki.cert, &pki.key)).await;
    let addr = server.addr();
    assert_eq!(server.url(), format!("https://{addr}"));
    let roots = [pki.ca.clone()];

    let (status, body) = https(addr, &roots, "localhost", "GET", "/api/status", None, None)
        .await
        .expect("HTTPS with the CA");
    assert_eq!((status, body["message"].clone()), (200, json!("Ok")));
    // By IP too (the certificate names 127.0.0.1), and a whole exchange.
    let (status, login) = https(
        addr,
        &roots,
        "127.0.0.1",
        "POST",
        "/api/v1/auth/universal-auth/login",
        None,
        Some(&json!({"clientId": "op-client", "clientSecret": "op-secret"})),
    )
    .await
    .expect("login over HTTPS");
    assert_eq!(status, 200);
    let token = login["accessToken"].as_str().expect("token").to_owned();
    let (status, list) = https(
        addr,
        &roots,
        "localhost",
        "GET",
        "/api/v3/secrets/raw?workspaceSlug=demo&environment=dev",
        Some(&token),
        None,
    )
    .await
    .expect("list over HTTPS");
    assert_eq!(status, 200);
    assert!(list["secrets"].as_array().is_some_and(|s| !s.is_empty()));

    // A client that does not trust the CA: no roots at all, or another CA.
    let refused = https(addr, &[], "localhost", "GET", "/api/status", None, None).await;
    assert!(
        refused.as_ref().is_err_and(|e| e.starts_with("handshake")),
        "{refused:?}"
    );
    let (other_params, other_key) = ca("another CA");
    let other = other_params.self_signed(&other_key).expect("other CA");
    let refused = https(
        addr,
        &[other.der().clone()],
        "localhost",
        "GET",
        "/api/status",
        None,
        None,
    )
    .await;
    assert!(
        refused.as_ref().is_err_and(|e| e.contains("certificate")),
        "{refused:?}"
    );
    // A name the certificate does not have.
    let refused = https(
        addr,
        &roots,
        "kms.example",
        "GET",
        "/api/status",
        None,
        None,
    )
    .await;
    assert!(refused.is_err(), "{refused:?}");
    // Plain HTTP gets no answer.
    let plain = Client::new(addr)
        .try_send("GET", "/api/status", &[], None)
        .await;
    assert!(plain.is_err(), "{plain:?}");
    // The server still serves after refused handshakes.
    let (status, _) = https(addr, &roots, "localhost", "GET", "/api/status", None, None)
        .await
        .expect("still serving");
    assert_eq!(status, 200);
    server.shutdown().await;
}

#[tokio::test]
async fn bad_certificate_settings_stop_the_start() {
    let (pki, other) = (pki(), pki());
    let cases = [
        (
            Config {
                tls_cert: Some(pki.cert.clone()),
                ..config(demo_seed())
            },
            "together",
        ),
        (
            tls_config(Path::new("/nonexistent/tls.crt"), &pki.key),
            "tls",
        ),
        (tls_config(&pki.cert, &other.key), "do not fit"),
        (tls_config(&pki.key, &pki.key), "no certificate"),
    ];
    for (config, want) in cases {
        let err = kms_devserver::start(config)
            .await
            .expect_err("refused")
            .to_string();
        assert!(err.contains(want), "{err}");
    }
}
