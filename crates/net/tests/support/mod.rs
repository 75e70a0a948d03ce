//! What the link tests share: a message type, free loopback addresses, and the
//! configurations of nodes that know each other.

#![allow(dead_code)] // Each test file uses a different part.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use chorus_core::codec::{DecodeError, Reader, WireMessage, WriteExt};
use chorus_core::NodeId;
use chorus_net::NetConfig;

/// Every wait's bound: it only guards against hangs.
pub const DEADLINE: Duration = Duration::from_secs(20);
pub const TOKEN: &str = "secret-token-of-32-bytes-or-so!!";

/// The messages the tests send: bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note(pub Bytes);

impl WireMessage for Note {
    fn encode(&self, buf: &mut BytesMut) {
        buf.put_bytes_prefixed(&self.0);
    }
    fn decode(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(Note(reader.bytes()?))
    }
}

pub fn note(text: &str) -> Note {
    Note(Bytes::copy_from_slice(text.as_bytes()))
}

/// A loopback address nothing listens on (until something binds it).
pub fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

/// Node `me`'s configuration in the test cluster ("test", protocol "notes").
pub fn config(me: u8, token: &str, listen: SocketAddr, peers: BTreeMap<NodeId, SocketAddr>) -> NetConfig {
    NetConfig::new(NodeId(me), "test", token, "notes", listen, peers)
}

/// The configurations of `n` nodes on free loopback addresses that all know each other; node
/// `me` holds the token `token_of(me)`.
pub fn mesh(n: u8, token_of: impl Fn(u8) -> &'static str) -> Vec<NetConfig> {
    let addrs: Vec<SocketAddr> = (0..n).map(|_| free_addr()).collect();
    (0..n)
        .map(|me| {
            let peers = (0..n).filter(|p| *p != me).map(|p| (NodeId(p), addrs[p as usize])).collect();
            config(me, token_of(me), addrs[me as usize], peers)
        })
        .collect()
}

/// Node 0 at `listen`, knowing one peer, node 1, at `peer` (where nothing may listen).
pub fn towards(listen: SocketAddr, peer: SocketAddr) -> NetConfig {
    config(0, TOKEN, listen, BTreeMap::from([(NodeId(1), peer)]))
}
