//! Membership messages and their wire encoding.

use bytes::{BufMut, Bytes, BytesMut};
use chorus_core::codec::{DecodeError, Reader, WireMessage, WriteExt};
use protobuf::Message as _;

#[derive(Clone, PartialEq, Debug)]
pub enum MembershipMessage {
    /// A Raft message of the membership group, protobuf-encoded by the raft crate.
    Raft(raft::prelude::Message),
    /// "I am alive": asks for a lease-granting acknowledgement.
    Heartbeat {
        seq: u64,
    },
    HeartbeatAck {
        seq: u64,
    },
}

const TAG_RAFT: u8 = 1;
const TAG_HEARTBEAT: u8 = 2;
const TAG_HEARTBEAT_ACK: u8 = 3;

impl WireMessage for MembershipMessage {
    fn encode(&self, buf: &mut BytesMut) {
        match self {
            MembershipMessage::Raft(message) => {
                buf.put_u8(TAG_RAFT);
                let bytes = message.write_to_bytes().expect("raft messages always encode");
                buf.put_bytes_prefixed(&bytes);
            }
            MembershipMessage::Heartbeat { seq } => {
                buf.put_u8(TAG_HEARTBEAT);
                buf.put_u64_le(*seq);
            }
            MembershipMessage::HeartbeatAck { seq } => {
                buf.put_u8(TAG_HEARTBEAT_ACK);
                buf.put_u64_le(*seq);
            }
        }
    }

    fn decode(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(match reader.u8()? {
            TAG_RAFT => {
                let bytes: Bytes = reader.bytes()?;
                let message = raft::prelude::Message::parse_from_bytes(&bytes)
                    .map_err(|_| DecodeError::Invalid("malformed raft message"))?;
                MembershipMessage::Raft(message)
            }
            TAG_HEARTBEAT => MembershipMessage::Heartbeat { seq: reader.u64()? },
            TAG_HEARTBEAT_ACK => MembershipMessage::HeartbeatAck { seq: reader.u64()? },
            tag => return Err(DecodeError::UnknownTag { what: "membership message", tag }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(junk in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = MembershipMessage::decode_exact(Bytes::from(junk));
        }
    }

    #[test]
    fn messages_round_trip() {
        let raft_message = raft::prelude::Message { from: 1, to: 2, term: 7, ..Default::default() };
        for message in [
            MembershipMessage::Raft(raft_message),
            MembershipMessage::Heartbeat { seq: 9 },
            MembershipMessage::HeartbeatAck { seq: u64::MAX },
        ] {
            let mut buf = BytesMut::new();
            message.encode(&mut buf);
            assert_eq!(MembershipMessage::decode_exact(buf.freeze()).unwrap(), message);
        }
    }
}
