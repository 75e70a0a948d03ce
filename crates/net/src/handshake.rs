//! The peer handshake: mutual challenge-response authentication over nonces from both sides.
//!
//! ```text
//! dialer   -> acceptor  HELLO     = magic "CHORUS" | version: u8 | dialer id: u8 | nonce_d: [32]
//! acceptor -> dialer    CHALLENGE = nonce_a: [32]
//! dialer   -> acceptor  PROOF     = mac_d: [32] | protocol: bytes
//! acceptor -> dialer    WELCOME   = mac_a: [32]          (or REFUSE = reason: UTF-8)
//!
//! mac_x = HMAC-SHA256(key = cluster token,
//!                     role_x | cluster id | dialer id | acceptor id | nonce_d | nonce_a | protocol)
//! ```
//!
//! * **The token never travels**, only MACs over fresh nonces. Both nonces come from the
//!   operating system's RNG, so a recorded exchange cannot be replayed on either side.
//! * **Both sides prove themselves.** The dialer proves first: the acceptor (which anyone on
//!   the network can reach) computes no MAC for a caller that has not proven it holds the
//!   token, so it cannot be used as an oracle for guessing tokens offline. The dialer only
//!   dials the addresses in its own configuration, and checks the acceptor's MAC before it
//!   sends anything else.
//! * **The cluster id is never sent**: it is part of what the MACs cover, so a node of
//!   another cluster fails authentication without learning this cluster's id. The same holds
//!   for the protocol name the acceptor runs.
//! * The roles are in the MAC, so a dialer's proof cannot be reflected back as an acceptor's.
//!
//! Without TLS the link is authenticated at its start but not encrypted or integrity
//! protected afterwards; `tls_cluster` (crate::tls) adds both.

use bytes::{Bytes, BytesMut};
use chorus_core::codec::{DecodeError, Reader, WireMessage, WriteExt};
use chorus_core::NodeId;
use hmac::{Hmac, Mac};
use sha2::Sha256;

const MAGIC: &[u8] = b"CHORUS";
/// Version 2: challenge-response. Version 1 sent the token in clear text. Version 3: the
/// same exchange, bumped because the replicated typed commands (`RmwOp::Exec`) gained
/// streams: every replica must run the same command set, or one would apply an XADD that
/// another answers "unknown command", so peers of different command sets must not form a
/// cluster. Bump it again whenever a typed command is added or changes what it writes.
/// Version 4: XSETID joined the typed commands, and Pub/Sub frames (`kind::PUBSUB`), which
/// a version 3 node would close the link over.
pub const HANDSHAKE_VERSION: u8 = 4;
pub const NONCE_BYTES: usize = 32;
pub const MAC_BYTES: usize = 32;
/// Bound on a handshake frame: enough for a MAC and a protocol name, small enough that a
/// stranger cannot make us buffer much before we refuse it.
pub const HELLO_BYTES_MAX: usize = 4096;
/// Shorter cluster tokens are refused at start: HMAC is only as strong as its key, and a
/// short token could be guessed offline from one recorded exchange.
pub const TOKEN_BYTES_MIN: usize = 16;

pub type Nonce = [u8; NONCE_BYTES];
pub type Tag = [u8; MAC_BYTES];

/// A fresh nonce from the operating system's RNG.
pub fn nonce() -> std::io::Result<Nonce> {
    let mut nonce = [0u8; NONCE_BYTES];
    getrandom::fill(&mut nonce)
        .map_err(|error| std::io::Error::other(format!("no OS randomness: {error}")))?;
    Ok(nonce)
}

#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Hello {
    pub node: NodeId,
    pub nonce: Nonce,
}

#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Challenge {
    pub nonce: Nonce,
}

#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Proof {
    pub mac: Tag,
    pub protocol: Bytes,
}

#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Welcome {
    pub mac: Tag,
}

fn read_array<const N: usize>(reader: &mut Reader) -> Result<[u8; N], DecodeError> {
    let mut out = [0u8; N];
    for byte in &mut out {
        *byte = reader.u8()?;
    }
    Ok(out)
}

impl WireMessage for Hello {
    fn encode(&self, buf: &mut BytesMut) {
        buf.extend_from_slice(MAGIC);
        buf.extend_from_slice(&[HANDSHAKE_VERSION, self.node.0]);
        buf.extend_from_slice(&self.nonce);
    }

    fn decode(reader: &mut Reader) -> Result<Self, DecodeError> {
        for expected in MAGIC {
            if reader.u8()? != *expected {
                return Err(DecodeError::Invalid("not a chorus handshake"));
            }
        }
        if reader.u8()? != HANDSHAKE_VERSION {
            return Err(DecodeError::Invalid("unsupported handshake version (a chorus of another release?)"));
        }
        let node = NodeId(reader.u8()?);
        Ok(Hello { node, nonce: read_array(reader)? })
    }
}

impl WireMessage for Challenge {
    fn encode(&self, buf: &mut BytesMut) {
        buf.extend_from_slice(&self.nonce);
    }

    fn decode(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(Challenge { nonce: read_array(reader)? })
    }
}

impl WireMessage for Proof {
    fn encode(&self, buf: &mut BytesMut) {
        buf.extend_from_slice(&self.mac);
        buf.put_bytes_prefixed(&self.protocol);
    }

    fn decode(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(Proof { mac: read_array(reader)?, protocol: reader.bytes()? })
    }
}

impl WireMessage for Welcome {
    fn encode(&self, buf: &mut BytesMut) {
        buf.extend_from_slice(&self.mac);
    }

    fn decode(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(Welcome { mac: read_array(reader)? })
    }
}

/// Which side a MAC speaks for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Role {
    Dialer,
    Acceptor,
}

/// What both sides' MACs cover: everything the exchange must agree on.
#[derive(Clone, Copy, Debug)]
pub struct Transcript<'a> {
    pub cluster_id: &'a [u8],
    pub dialer: NodeId,
    pub acceptor: NodeId,
    pub dialer_nonce: &'a Nonce,
    pub acceptor_nonce: &'a Nonce,
    pub protocol: &'a [u8],
}

/// The MAC `role` sends for `transcript`, keyed with the cluster token.
pub fn mac(token: &[u8], role: Role, transcript: &Transcript<'_>) -> Tag {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(token).expect("HMAC takes keys of any length");
    let label: &[u8] = match role {
        Role::Dialer => b"chorus peer dialer v2",
        Role::Acceptor => b"chorus peer acceptor v2",
    };
    // Length prefixes keep the fields apart: no two transcripts feed the same bytes.
    for field in [label, transcript.cluster_id, transcript.protocol] {
        mac.update(&(field.len() as u32).to_le_bytes());
        mac.update(field);
    }
    mac.update(&[transcript.dialer.0, transcript.acceptor.0]);
    mac.update(transcript.dialer_nonce);
    mac.update(transcript.acceptor_nonce);
    mac.finalize().into_bytes().into()
}

/// Check `tag` against the MAC `role` should have sent, in constant time.
pub fn verify(token: &[u8], role: Role, transcript: &Transcript<'_>, tag: &Tag) -> bool {
    constant_time_eq(&mac(token, role, transcript), tag)
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

/// The acceptor's verdict on a dialer's proof: `Ok` with the WELCOME to send, or the reason
/// for refusing, which is sent back and logged on both sides. Before the MAC checks out
/// nothing about this node is revealed: a wrong token and a wrong cluster id read the same.
pub fn check(
    hello: &Hello,
    acceptor_nonce: &Nonce,
    proof: &Proof,
    expect: &Expectations<'_>,
) -> Result<Welcome, String> {
    let claimed = Transcript {
        cluster_id: expect.cluster_id,
        dialer: hello.node,
        acceptor: expect.me,
        dialer_nonce: &hello.nonce,
        acceptor_nonce,
        protocol: &proof.protocol,
    };
    if !verify(expect.token, Role::Dialer, &claimed, &proof.mac) {
        return Err("authentication failed: wrong cluster token or cluster id".to_string());
    }
    if proof.protocol.as_ref() != expect.protocol {
        return Err(format!(
            "protocol mismatch: peer runs {:?}, this node runs {:?}",
            String::from_utf8_lossy(&proof.protocol),
            String::from_utf8_lossy(expect.protocol)
        ));
    }
    if hello.node == expect.me {
        return Err(format!("peer claims this node's own id {}", hello.node));
    }
    if !(expect.is_peer)(hello.node) {
        return Err(format!("node id {} is not in this node's peer list", hello.node));
    }
    Ok(Welcome { mac: mac(expect.token, Role::Acceptor, &claimed) })
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

    const TOKEN: &[u8] = b"0123456789abcdef-secret";

    struct Exchange {
        hello: Hello,
        challenge: Challenge,
    }

    fn exchange() -> Exchange {
        Exchange {
            hello: Hello { node: NodeId(1), nonce: nonce().unwrap() },
            challenge: Challenge { nonce: nonce().unwrap() },
        }
    }

    /// The dialer's side: its proof for `acceptor`, from what it knows.
    fn prove(exchange: &Exchange, token: &[u8], cluster_id: &[u8], protocol: &[u8]) -> Proof {
        let transcript = Transcript {
            cluster_id,
            dialer: exchange.hello.node,
            acceptor: NodeId(0),
            dialer_nonce: &exchange.hello.nonce,
            acceptor_nonce: &exchange.challenge.nonce,
            protocol,
        };
        Proof { mac: mac(token, Role::Dialer, &transcript), protocol: Bytes::copy_from_slice(protocol) }
    }

    fn expect(is_peer: &(dyn Fn(NodeId) -> bool + Sync)) -> Expectations<'_> {
        Expectations { me: NodeId(0), cluster_id: b"c", protocol: b"hermes", token: TOKEN, is_peer }
    }

    fn round_trip<M: WireMessage + PartialEq + std::fmt::Debug>(message: &M) {
        let mut buf = BytesMut::new();
        message.encode(&mut buf);
        assert_eq!(&M::decode_exact(buf.freeze()).unwrap(), message);
    }

    #[test]
    fn messages_round_trip_and_nonces_differ() {
        let exchange = exchange();
        round_trip(&exchange.hello);
        round_trip(&exchange.challenge);
        round_trip(&prove(&exchange, TOKEN, b"c", b"hermes"));
        round_trip(&Welcome { mac: [7; MAC_BYTES] });
        assert_ne!(exchange.hello.nonce, exchange.challenge.nonce);
    }

    #[test]
    fn both_sides_authenticate_and_the_acceptor_proof_is_not_the_dialers() {
        let exchange = exchange();
        let proof = prove(&exchange, TOKEN, b"c", b"hermes");
        let welcome = check(&exchange.hello, &exchange.challenge.nonce, &proof, &expect(&|_| true)).unwrap();
        let transcript = Transcript {
            cluster_id: b"c",
            dialer: NodeId(1),
            acceptor: NodeId(0),
            dialer_nonce: &exchange.hello.nonce,
            acceptor_nonce: &exchange.challenge.nonce,
            protocol: b"hermes",
        };
        assert!(verify(TOKEN, Role::Acceptor, &transcript, &welcome.mac));
        assert!(!verify(b"another-token-of-16+", Role::Acceptor, &transcript, &welcome.mac));
        assert_ne!(welcome.mac, proof.mac, "roles are part of the MAC: no reflection");
        // The proof binds the nonces: replayed against a fresh challenge it fails.
        let fresh = Challenge { nonce: nonce().unwrap() };
        assert!(check(&exchange.hello, &fresh.nonce, &proof, &expect(&|_| true)).is_err());
    }

    #[test]
    fn refuses_strangers_without_telling_them_the_cluster_id() {
        let any = |_| true;
        let exchange = exchange();
        let verdict = |proof: &Proof, is_peer| {
            check(&exchange.hello, &exchange.challenge.nonce, proof, &expect(is_peer))
        };
        let wrong_token = verdict(&prove(&exchange, b"guessed-token-guessed", b"c", b"hermes"), &any);
        let wrong_cluster = verdict(&prove(&exchange, TOKEN, b"other", b"hermes"), &any);
        assert_eq!(wrong_token.clone().unwrap_err(), wrong_cluster.clone().unwrap_err(), "indistinguishable");
        let reason = wrong_token.unwrap_err();
        assert!(reason.contains("authentication failed") && !reason.contains("\"c\""), "{reason}");
        let wrong_protocol = verdict(&prove(&exchange, TOKEN, b"c", b"craq"), &any).unwrap_err();
        assert!(wrong_protocol.contains("protocol"), "{wrong_protocol}");
        assert!(verdict(&prove(&exchange, TOKEN, b"c", b"hermes"), &|_| false)
            .unwrap_err()
            .contains("peer list"));
        let myself = Exchange { hello: Hello { node: NodeId(0), ..exchange.hello.clone() }, ..exchange };
        let proof = prove(&myself, TOKEN, b"c", b"hermes");
        assert!(check(&myself.hello, &myself.challenge.nonce, &proof, &expect(&any)).is_err());
        assert!(Hello::decode_exact(Bytes::from_static(b"GET / HTTP/1.1\r\n")).is_err());
    }

    #[test]
    fn hellos_of_older_versions_are_refused_clearly() {
        for version in 1..HANDSHAKE_VERSION {
            let mut old = BytesMut::from(&b"CHORUS"[..]);
            old.extend_from_slice(&[version, 1]);
            let error = Hello::decode_exact(old.freeze()).unwrap_err();
            assert!(error.to_string().contains("version"), "{error}");
        }
    }
}
