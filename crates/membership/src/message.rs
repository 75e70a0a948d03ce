//! Membership messages and their wire encoding.

use bytes::{BufMut, Bytes, BytesMut};
use chorus_core::codec::{DecodeError, Reader, WireMessage, WriteExt};
use protobuf::Message as _;

#[derive(Clone, PartialEq, Debug)]
pub enum MembershipMessage {
    /// A Raft message of the membership group, protobuf-encoded by the raft crate.
    Raft(raft::prelude::Message),
    /// "I am alive": asks for a lease-granting acknowledgement. `epoch`: the sender's
    /// installed view, which tells a joined node when the sender's leases start to need it.
    Heartbeat {
        seq: u64,
        epoch: u64,
    },
    HeartbeatAck {
        seq: u64,
    },
    /// §3.4 Recovery: "add me to the view" from a node that starts empty. `incarnation`
    /// tells this start apart from earlier ones of the same node id.
    JoinRequest {
        incarnation: u64,
    },
}

const TAG_RAFT: u8 = 1;
const TAG_HEARTBEAT: u8 = 2;
const TAG_HEARTBEAT_ACK: u8 = 3;
const TAG_JOIN_REQUEST: u8 = 4;

impl WireMessage for MembershipMessage {
    fn encode(&self, buf: &mut BytesMut) {
        match self {
            MembershipMessage::Raft(message) => {
                buf.put_u8(TAG_RAFT);
                let bytes = message.write_to_bytes().expect("raft messages always encode");
                buf.put_bytes_prefixed(&bytes);
            }
            MembershipMessage::Heartbeat { seq, epoch } => {
                buf.put_u8(TAG_HEARTBEAT);
                buf.put_u64_le(*seq);
                buf.put_u64_le(*epoch);
            }
            MembershipMessage::JoinRequest { incarnation } => {
                buf.put_u8(TAG_JOIN_REQUEST);
                buf.put_u64_le(*incarnation);
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
            TAG_HEARTBEAT => MembershipMessage::Heartbeat { seq: reader.u64()?, epoch: reader.u64()? },
            TAG_JOIN_REQUEST => MembershipMessage::JoinRequest { incarnation: reader.u64()? },
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
            MembershipMessage::Heartbeat { seq: 9, epoch: 4 },
            MembershipMessage::JoinRequest { incarnation: 77 },
            MembershipMessage::HeartbeatAck { seq: u64::MAX },
        ] {
            let mut buf = BytesMut::new();
            message.encode(&mut buf);
            assert_eq!(MembershipMessage::decode_exact(buf.freeze()).unwrap(), message);
        }
    }
}

// ---------------------------------------------------------------------- durable records

use crate::node::PersistRecord;

const TAG_HARD_STATE: u8 = 1;
const TAG_ENTRIES: u8 = 2;

impl WireMessage for PersistRecord {
    fn encode(&self, buf: &mut BytesMut) {
        match self {
            PersistRecord::HardState { term, vote, commit } => {
                buf.put_u8(TAG_HARD_STATE);
                buf.put_u64_le(*term);
                buf.put_u64_le(*vote);
                buf.put_u64_le(*commit);
            }
            PersistRecord::Entries(entries) => {
                buf.put_u8(TAG_ENTRIES);
                buf.put_u32_le(u32::try_from(entries.len()).expect("entry count fits u32"));
                for entry in entries {
                    let bytes = entry.write_to_bytes().expect("raft entries always encode");
                    buf.put_bytes_prefixed(&bytes);
                }
            }
        }
    }

    fn decode(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(match reader.u8()? {
            TAG_HARD_STATE => {
                PersistRecord::HardState { term: reader.u64()?, vote: reader.u64()?, commit: reader.u64()? }
            }
            TAG_ENTRIES => {
                let count = reader.u32()? as usize;
                if count > reader.remaining() {
                    return Err(DecodeError::Invalid("entry count exceeds record"));
                }
                let mut entries = Vec::with_capacity(count);
                for _ in 0..count {
                    let bytes = reader.bytes()?;
                    let entry = raft::prelude::Entry::parse_from_bytes(&bytes)
                        .map_err(|_| DecodeError::Invalid("malformed raft entry"))?;
                    entries.push(entry);
                }
                PersistRecord::Entries(entries)
            }
            tag => return Err(DecodeError::UnknownTag { what: "persist record", tag }),
        })
    }
}

/// Frame kind of a durable membership record in a node's `membership.log`.
pub const PERSIST_FRAME_KIND: u8 = 0x30;

/// Append `records` to `log` as checksummed frames (the runtime then fsyncs).
pub fn encode_records(records: &[PersistRecord], log: &mut BytesMut) {
    let mut payload = BytesMut::new();
    for record in records {
        payload.clear();
        record.encode(&mut payload);
        chorus_core::codec::encode_frame(PERSIST_FRAME_KIND, &payload, log);
    }
}

/// Read back what [`encode_records`] wrote, and how many bytes of it are whole frames. A torn
/// last frame (a crash mid-append) ends the log: the caller must cut it before appending, or
/// the next start would find it in the middle; anything else malformed is an error: the node
/// must not start on a corrupt vote.
pub fn decode_records(bytes: &[u8]) -> Result<(Vec<PersistRecord>, usize), DecodeError> {
    let mut stream = BytesMut::from(bytes);
    let mut records = Vec::new();
    while let Some(frame) = chorus_core::codec::decode_frame(&mut stream, 64 * 1024 * 1024)? {
        if frame.kind != PERSIST_FRAME_KIND {
            return Err(DecodeError::UnknownTag { what: "membership log frame", tag: frame.kind });
        }
        records.push(PersistRecord::decode_exact(frame.payload)?);
    }
    Ok((records, bytes.len() - stream.len()))
}

#[cfg(test)]
mod record_tests {
    use super::*;

    #[test]
    fn records_round_trip_and_a_torn_tail_is_ignored() {
        let entry =
            raft::prelude::Entry { index: 3, term: 2, data: vec![1, 2, 3].into(), ..Default::default() };
        let records = vec![
            PersistRecord::HardState { term: 2, vote: 1, commit: 0 },
            PersistRecord::Entries(vec![entry]),
            PersistRecord::HardState { term: 2, vote: 1, commit: 3 },
        ];
        let mut log = BytesMut::new();
        encode_records(&records, &mut log);
        assert_eq!(decode_records(&log).unwrap(), (records.clone(), log.len()));
        let torn = &log[..log.len() - 5];
        let (whole, valid_bytes) = decode_records(torn).unwrap();
        assert_eq!(whole, records[..2]);
        assert!(valid_bytes < torn.len());
        let mut corrupt = log.to_vec();
        corrupt[12] ^= 0xFF;
        assert!(decode_records(&corrupt).is_err());
    }
}
