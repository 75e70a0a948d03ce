//! etcd v3 through its HTTP/JSON gRPC gateway (`/v3/kv/put`, `/v3/kv/range`, `/v3/kv/txn`),
//! one keep-alive HTTP/1.1 connection per client (hyper). Keys and values travel base64-encoded.
//!
//! The gateway is several times slower than etcd's native gRPC, so `chorus bench compare`
//! measures etcd with etcd's own benchmark tool ([`crate::etcd_tool`]) and uses this client
//! only to check that members serve and for the opt-in `etcd-http` system.

use std::net::SocketAddr;

use anyhow::{bail, Context as _};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

pub struct EtcdConn {
    sender: SendRequest<Full<Bytes>>,
    host: String,
    connection: tokio::task::JoinHandle<()>,
}

impl Drop for EtcdConn {
    fn drop(&mut self) {
        self.connection.abort();
    }
}

pub fn b64(bytes: &[u8]) -> String {
    B64.encode(bytes)
}

/// The smallest key greater than every key starting with `prefix` (etcd's `range_end`).
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

impl EtcdConn {
    pub async fn connect(addr: SocketAddr) -> anyhow::Result<EtcdConn> {
        let stream =
            TcpStream::connect(addr).await.with_context(|| format!("cannot connect to etcd at {addr}"))?;
        stream.set_nodelay(true)?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .context("HTTP handshake with etcd")?;
        let connection = tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(EtcdConn { sender, host: addr.to_string(), connection })
    }

    /// POSTs a JSON body to `path`; returns the response body.
    pub async fn post(&mut self, path: &str, body: String) -> anyhow::Result<Bytes> {
        self.sender.ready().await.context("etcd connection closed")?;
        let request = hyper::Request::post(path)
            .header(hyper::header::HOST, &self.host)
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))?;
        let response = self.sender.send_request(request).await.context("etcd request")?;
        let status = response.status();
        let body = response.into_body().collect().await.context("etcd response")?.to_bytes();
        if !status.is_success() {
            bail!("etcd answered {status}: {}", String::from_utf8_lossy(&body));
        }
        Ok(body)
    }

    pub async fn put(&mut self, key: &[u8], value_b64: &str) -> anyhow::Result<()> {
        let body = format!(r#"{{"key":"{}","value":"{}"}}"#, b64(key), value_b64);
        self.post("/v3/kv/put", body).await.map(drop)
    }

    /// A linearizable read of one key (or of every key in [key, range_end)).
    /// Returns the response body.
    pub async fn range(&mut self, key: &[u8], range_end: Option<&[u8]>) -> anyhow::Result<Bytes> {
        let body = match range_end {
            Some(end) => format!(r#"{{"key":"{}","range_end":"{}"}}"#, b64(key), b64(end)),
            None => format!(r#"{{"key":"{}"}}"#, b64(key)),
        };
        self.post("/v3/kv/range", body).await
    }

    /// Puts every (key, base64 value) pair in one transaction (at most 128 by etcd's default).
    pub async fn put_all(&mut self, pairs: &[(Vec<u8>, &str)]) -> anyhow::Result<()> {
        let mut body = String::from(r#"{"success":["#);
        for (i, (key, value_b64)) in pairs.iter().enumerate() {
            if i > 0 {
                body.push(',');
            }
            body.push_str(&format!(r#"{{"request_put":{{"key":"{}","value":"{}"}}}}"#, b64(key), value_b64));
        }
        body.push_str("]}");
        self.post("/v3/kv/txn", body).await.map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_is_the_next_key() {
        assert_eq!(prefix_end(b"user1/"), b"user10".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff"), vec![0]);
        assert_eq!(b64(b"foo"), "Zm9v");
    }
}
