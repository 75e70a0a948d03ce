//! The peer handshake: the first frame on every peer connection.
//!
//! ```text
//! HELLO   = magic "CHORUS" | node id: u8 | cluster id: bytes | protocol: bytes | token: bytes
//! WELCOME = (empty)
//! REFUSE  = reason: UTF-8
//! ```
//!
//! The token travels in clear text: peer links are meant for a private network (the default
//! binds to 127.0.0.1). The token keeps strangers and misconfigured nodes out; it is not
//! encryption.

use bytes::{Bytes, BytesMut};
use chorus_core::codec::{DecodeError, Reader, WireMessage, WriteExt};
use chorus_core::NodeId;

const MAGIC: &[u8] = b"CHORUS";
/// Bound on a handshake frame: enough for ids, names and a token, small enough that a
/// stranger cannot make us buffer much before we refuse it.
pub const HELLO_BYTES_MAX: usize = 4096;

#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Hello {
    pub node: NodeId,
    pub cluster_id: Bytes,
    pub protocol: Bytes,
    pub token: Bytes,
}

impl WireMessage for Hello {
    fn encode(&self, buf: &mut BytesMut) {
        buf.extend_from_slice(MAGIC);
        buf.extend_from_slice(&[self.node.0]);
        buf.put_bytes_prefixed(&self.cluster_id);
        buf.put_bytes_prefixed(&self.protocol);
        buf.put_bytes_prefixed(&self.token);
    }

    fn decode(reader: &mut Reader) -> Result<Self, DecodeError> {
        for expected in MAGIC {
            if reader.u8()? != *expected {
                return Err(DecodeError::Invalid("not a chorus handshake"));
            }
        }
        Ok(Hello {
            node: NodeId(reader.u8()?),
            cluster_id: reader.bytes()?,
            protocol: reader.bytes()?,
            token: reader.bytes()?,
        })
    }
}

/// What the acceptor expects of a dialer.
#[derive(Clone)]
pub struct Expectations<'a> {
    pub me: NodeId,
    pub cluster_id: &'a [u8],
    pub protocol: &'a [u8],
    pub token: &'a [u8],
    pub is_peer: &'a (dyn Fn(NodeId) -> bool + Sync),
}

/// Why a HELLO is refused; the text is sent back to the dialer and logged on both sides.
pub fn check(hello: &Hello, expect: &Expectations<'_>) -> Result<(), String> {
    if hello.cluster_id.as_ref() != expect.cluster_id {
        return Err(format!(
            "wrong cluster id {:?} (this node is in cluster {:?})",
            String::from_utf8_lossy(&hello.cluster_id),
            String::from_utf8_lossy(expect.cluster_id)
        ));
    }
    if !constant_time_eq(&hello.token, expect.token) {
        return Err("wrong cluster token".to_string());
    }
    if hello.protocol.as_ref() != expect.protocol {
        return Err(format!(
            "protocol mismatch: peer runs {:?}, this node runs {:?}",
            String::from_utf8_lossy(&hello.protocol),
            String::from_utf8_lossy(expect.protocol)
        ));
    }
    if hello.node == expect.me {
        return Err(format!("peer claims this node's own id {}", hello.node));
    }
    if !(expect.is_peer)(hello.node) {
        return Err(format!("node id {} is not in this node's peer list", hello.node));
    }
    Ok(())
}

/// Compare secrets without an early exit that would leak the matching prefix length.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello() -> Hello {
        Hello {
            node: NodeId(1),
            cluster_id: Bytes::from_static(b"c"),
            protocol: Bytes::from_static(b"hermes"),
            token: Bytes::from_static(b"secret"),
        }
    }

    fn expect(is_peer: &(dyn Fn(NodeId) -> bool + Sync)) -> Expectations<'_> {
        Expectations { me: NodeId(0), cluster_id: b"c", protocol: b"hermes", token: b"secret", is_peer }
    }

    #[test]
    fn round_trips_and_accepts_a_peer() {
        let mut buf = BytesMut::new();
        hello().encode(&mut buf);
        let decoded = Hello::decode_exact(buf.freeze()).unwrap();
        assert_eq!(decoded, hello());
        assert_eq!(check(&decoded, &expect(&|_| true)), Ok(()));
    }

    #[test]
    fn refuses_strangers() {
        let any = |_| true;
        let mut wrong_token = hello();
        wrong_token.token = Bytes::from_static(b"guess");
        assert!(check(&wrong_token, &expect(&any)).unwrap_err().contains("token"));
        let mut wrong_cluster = hello();
        wrong_cluster.cluster_id = Bytes::from_static(b"other");
        assert!(check(&wrong_cluster, &expect(&any)).unwrap_err().contains("cluster id"));
        let mut wrong_protocol = hello();
        wrong_protocol.protocol = Bytes::from_static(b"craq");
        assert!(check(&wrong_protocol, &expect(&any)).unwrap_err().contains("protocol"));
        let mut myself = hello();
        myself.node = NodeId(0);
        assert!(check(&myself, &expect(&any)).is_err());
        assert!(check(&hello(), &expect(&|_| false)).unwrap_err().contains("peer list"));
        assert!(Hello::decode_exact(Bytes::from_static(b"GET / HTTP/1.1\r\n")).is_err());
    }
}
