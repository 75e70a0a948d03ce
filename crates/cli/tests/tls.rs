//! TLS through the real binary: a 3-node cluster whose peer links run over mutual TLS
//! (`--tls-cluster`), serving TLS clients on `--tls-port` to a real Redis client library
//! (redis-rs with rustls). Certificates are made here with rcgen; no key is committed.

mod support;

use std::path::Path;
use std::time::Duration;

use support::loopback::{free_addrs, Cluster};

/// A CA, one certificate for the nodes (naming 127.0.0.1) and one for a client.
struct Pki {
    ca_pem: String,
    client_cert_pem: String,
    client_key_pem: String,
}

fn make_pki(dir: &Path) -> Pki {
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, "chorus test CA");
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issue = |name: &str| {
        let mut params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let (node_cert, node_key) = issue("chorus node");
    let (client_cert_pem, client_key_pem) = issue("chorus client");
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    std::fs::write(dir.join("node.pem"), node_cert).unwrap();
    std::fs::write(dir.join("node.key"), node_key).unwrap();
    Pki { ca_pem: ca.pem(), client_cert_pem, client_key_pem }
}

fn tls_client(port: u16, pki: &Pki, with_certificate: bool) -> redis::RedisResult<redis::Connection> {
    let certificates = redis::TlsCertificates {
        client_tls: with_certificate.then(|| redis::ClientTlsConfig {
            client_cert: pki.client_cert_pem.clone().into_bytes(),
            client_key: pki.client_key_pem.clone().into_bytes(),
        }),
        root_cert: Some(pki.ca_pem.clone().into_bytes()),
    };
    let client = redis::Client::build_with_tls(format!("rediss://127.0.0.1:{port}/"), certificates)?;
    let con = client.get_connection_with_timeout(Duration::from_secs(10))?;
    con.set_read_timeout(Some(Duration::from_secs(10)))?;
    Ok(con)
}

#[test]
fn a_tls_cluster_replicates_over_tls_links_and_serves_tls_clients() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let tls_ports: Vec<u16> = free_addrs(3).iter().map(|addr| addr.port()).collect();
    let pki = std::sync::OnceLock::new();
    let cluster = Cluster::start_each(3, |i, dir| {
        pki.get_or_init(|| make_pki(dir));
        let file = |name: &str| dir.join(name).to_str().unwrap().to_string();
        vec![
            "--tls-cluster".into(),
            "true".into(),
            "--tls-port".into(),
            tls_ports[i].to_string(),
            "--tls-cert-file".into(),
            file("node.pem"),
            "--tls-key-file".into(),
            file("node.key"),
            "--tls-ca-cert-file".into(),
            file("ca.pem"),
        ]
    });
    let pki = pki.get().unwrap();
    // Ready means every peer link is up: over TLS, as each node logs.
    for i in 0..3 {
        let log = strip_ansi(&cluster.log(i));
        assert!(log.contains("peer link up") && log.contains("tls=true"), "node {i}:\n{log}");
        assert!(!log.contains("tls=false"), "node {i} has a plain peer link:\n{log}");
    }
    let mut first = tls_client(tls_ports[0], pki, true).expect("a TLS client with a certificate");
    let _: () = redis::cmd("SET").arg("over").arg("tls").query(&mut first).unwrap();
    let mut last = tls_client(tls_ports[2], pki, true).unwrap();
    let value: Option<String> = redis::cmd("GET").arg("over").query(&mut last).unwrap();
    assert_eq!(value.as_deref(), Some("tls"), "replicated over the TLS peer links");
    // Pub/Sub frames take the same TLS links.
    let mut subscriber_con = tls_client(tls_ports[2], pki, true).unwrap();
    let mut subscriber = subscriber_con.as_pubsub();
    subscriber.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    subscriber.subscribe("secure").unwrap();
    let _: u64 = redis::cmd("PUBLISH").arg("secure").arg("news").query(&mut first).unwrap();
    let message: String = subscriber.get_message().unwrap().get_payload().unwrap();
    assert_eq!(message, "news", "published at node 0, received at node 2 over TLS");
    drop(subscriber);
    // tls-auth-clients is on by default: no client certificate, no service.
    let anonymous =
        tls_client(tls_ports[1], pki, false).and_then(|mut con| redis::cmd("PING").query::<String>(&mut con));
    assert!(anonymous.is_err(), "a client without a certificate was served: {anonymous:?}");
    // Plain RESP on the TLS port gets no answer it could read as RESP.
    let plain = redis::Client::open(format!("redis://127.0.0.1:{}/", tls_ports[1]))
        .and_then(|client| client.get_connection_with_timeout(Duration::from_secs(5)))
        .and_then(|mut con| {
            con.set_read_timeout(Some(Duration::from_secs(5)))?;
            redis::cmd("PING").query::<String>(&mut con)
        });
    assert!(plain.is_err(), "plain text was served on the TLS port: {plain:?}");
}

/// The log without terminal colour codes.
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
