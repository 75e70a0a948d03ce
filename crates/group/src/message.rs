//! Messages between the caller and the members of a chain, and their wire encoding (the core
//! codec's `WireMessage`: bounds-checked, never panics on malformed input).

use bytes::{BufMut, BytesMut};
use chorus_core::codec::{DecodeError, Reader, WireMessage, WriteExt};

use crate::op::{GroupId, OpError, Operation, Primitive, Refusal, ResultMap, Token, CHAIN_MEMBERS_MAX};

/// Frame kind for batches of group messages on a peer link.
pub const FRAME_KIND_GROUP: u8 = 0x20;

#[derive(Clone, PartialEq, Eq, Debug)]
pub enum GroupMessage {
    /// An operation travelling head to tail: caller -> head, member i -> member i+1.
    Op {
        group: GroupId,
        epoch: u64,
        token: Token,
        seq: u64,
        /// Every sequence number up to this one has completed at the caller: members may
        /// forget what they remember for retransmissions of those.
        acked_through: u64,
        operation: Operation,
        /// Set by the head when the operation is rejected: it still travels (as a no-op) so
        /// every member's sequence advances, and the tail reports the error.
        verdict: Option<OpError>,
        /// gCAS results of the members upstream (one slot per member, filled on the way).
        results: ResultMap,
    },
    /// The tail's acknowledgement to the caller.
    Ack { group: GroupId, epoch: u64, seq: u64, outcome: Result<ResultMap, OpError> },
    /// A member refuses to serve (wrong token, or it has failed).
    Refused { group: GroupId, epoch: u64, seq: u64, refusal: Refusal },
}

impl GroupMessage {
    pub fn group(&self) -> GroupId {
        match self {
            GroupMessage::Op { group, .. }
            | GroupMessage::Ack { group, .. }
            | GroupMessage::Refused { group, .. } => *group,
        }
    }
    pub fn seq(&self) -> u64 {
        match self {
            GroupMessage::Op { seq, .. }
            | GroupMessage::Ack { seq, .. }
            | GroupMessage::Refused { seq, .. } => *seq,
        }
    }
}

const TAG_OP: u8 = 1;
/// An operation's flags byte (was a bool for the flush alone: 0 and 1 still mean the same).
const OP_FLAG_FLUSH: u8 = 1;
const OP_FLAG_YIELDS_TO_READERS: u8 = 2;
const TAG_ACK: u8 = 2;
const TAG_REFUSED: u8 = 3;

fn put_results(buf: &mut BytesMut, results: &ResultMap) {
    buf.put_u8(results.len() as u8);
    for slot in results {
        match slot {
            Some(value) => {
                buf.put_u8(1);
                buf.put_u64_le(*value);
            }
            None => buf.put_u8(0),
        }
    }
}

fn get_results(reader: &mut Reader) -> Result<ResultMap, DecodeError> {
    let count = reader.u8()? as usize;
    if count > CHAIN_MEMBERS_MAX {
        return Err(DecodeError::Invalid("result map longer than the longest chain"));
    }
    let mut results = Vec::with_capacity(count);
    for _ in 0..count {
        results.push(if reader.bool()? { Some(reader.u64()?) } else { None });
    }
    Ok(results)
}

fn put_op_error(buf: &mut BytesMut, error: &OpError) {
    match *error {
        OpError::OutOfBounds { offset, len, region_bytes } => {
            buf.put_u8(0);
            buf.put_u64_le(offset);
            buf.put_u64_le(len);
            buf.put_u64_le(region_bytes);
        }
        OpError::Misaligned { offset } => {
            buf.put_u8(1);
            buf.put_u64_le(offset);
        }
        OpError::ExecuteMapBeyondChain { execute_map, chain_len } => {
            buf.put_u8(2);
            buf.put_u64_le(execute_map);
            buf.put_u8(chain_len as u8);
        }
        OpError::TooLarge { len } => {
            buf.put_u8(3);
            buf.put_u64_le(len);
        }
    }
}

fn get_op_error(reader: &mut Reader) -> Result<OpError, DecodeError> {
    Ok(match reader.u8()? {
        0 => OpError::OutOfBounds { offset: reader.u64()?, len: reader.u64()?, region_bytes: reader.u64()? },
        1 => OpError::Misaligned { offset: reader.u64()? },
        2 => OpError::ExecuteMapBeyondChain { execute_map: reader.u64()?, chain_len: reader.u8()? as usize },
        3 => OpError::TooLarge { len: reader.u64()? },
        tag => return Err(DecodeError::UnknownTag { what: "group op error", tag }),
    })
}

impl WireMessage for Operation {
    fn encode(&self, buf: &mut BytesMut) {
        match &self.primitive {
            Primitive::Write { offset, data } => {
                buf.put_u8(0);
                buf.put_u64_le(*offset);
                buf.put_bytes_prefixed(data);
            }
            Primitive::Cas { offset, old, new, execute_map } => {
                buf.put_u8(1);
                buf.put_u64_le(*offset);
                buf.put_u64_le(*old);
                buf.put_u64_le(*new);
                buf.put_u64_le(*execute_map);
            }
            Primitive::Memcpy { src, dst, len } => {
                buf.put_u8(2);
                buf.put_u64_le(*src);
                buf.put_u64_le(*dst);
                buf.put_u64_le(*len);
            }
            Primitive::Flush => buf.put_u8(3),
        }
        let yields = if self.yields_to_readers { OP_FLAG_YIELDS_TO_READERS } else { 0 };
        buf.put_u8(if self.flush { OP_FLAG_FLUSH } else { 0 } | yields);
    }

    fn decode(reader: &mut Reader) -> Result<Self, DecodeError> {
        let primitive = match reader.u8()? {
            0 => Primitive::Write { offset: reader.u64()?, data: reader.bytes()? },
            1 => Primitive::Cas {
                offset: reader.u64()?,
                old: reader.u64()?,
                new: reader.u64()?,
                execute_map: reader.u64()?,
            },
            2 => Primitive::Memcpy { src: reader.u64()?, dst: reader.u64()?, len: reader.u64()? },
            3 => Primitive::Flush,
            tag => return Err(DecodeError::UnknownTag { what: "group primitive", tag }),
        };
        let flags = reader.u8()?;
        if flags & !(OP_FLAG_FLUSH | OP_FLAG_YIELDS_TO_READERS) != 0 {
            return Err(DecodeError::Invalid("unknown group operation flags"));
        }
        Ok(Operation {
            primitive,
            flush: flags & OP_FLAG_FLUSH != 0,
            yields_to_readers: flags & OP_FLAG_YIELDS_TO_READERS != 0,
        })
    }
}

impl WireMessage for GroupMessage {
    fn encode(&self, buf: &mut BytesMut) {
        match self {
            GroupMessage::Op { group, epoch, token, seq, acked_through, operation, verdict, results } => {
                buf.put_u8(TAG_OP);
                buf.put_u64_le(group.0);
                buf.put_u64_le(*epoch);
                buf.put_slice(&token.0);
                buf.put_u64_le(*seq);
                buf.put_u64_le(*acked_through);
                operation.encode(buf);
                buf.put_bool(verdict.is_some());
                if let Some(error) = verdict {
                    put_op_error(buf, error);
                }
                put_results(buf, results);
            }
            GroupMessage::Ack { group, epoch, seq, outcome } => {
                buf.put_u8(TAG_ACK);
                buf.put_u64_le(group.0);
                buf.put_u64_le(*epoch);
                buf.put_u64_le(*seq);
                match outcome {
                    Ok(results) => {
                        buf.put_u8(0);
                        put_results(buf, results);
                    }
                    Err(error) => {
                        buf.put_u8(1);
                        put_op_error(buf, error);
                    }
                }
            }
            GroupMessage::Refused { group, epoch, seq, refusal } => {
                buf.put_u8(TAG_REFUSED);
                buf.put_u64_le(group.0);
                buf.put_u64_le(*epoch);
                buf.put_u64_le(*seq);
                match refusal {
                    Refusal::Unauthorized => buf.put_u8(0),
                    Refusal::MemberFailed { position, reason } => {
                        buf.put_u8(1);
                        buf.put_u8(*position);
                        buf.put_bytes_prefixed(reason.as_bytes());
                    }
                }
            }
        }
    }

    fn decode(reader: &mut Reader) -> Result<Self, DecodeError> {
        let tag = reader.u8()?;
        let group = GroupId(reader.u64()?);
        let epoch = reader.u64()?;
        Ok(match tag {
            TAG_OP => {
                let mut token = [0u8; 16];
                for byte in token.iter_mut() {
                    *byte = reader.u8()?;
                }
                let seq = reader.u64()?;
                let acked_through = reader.u64()?;
                let operation = Operation::decode(reader)?;
                let verdict = if reader.bool()? { Some(get_op_error(reader)?) } else { None };
                let results = get_results(reader)?;
                GroupMessage::Op {
                    group,
                    epoch,
                    token: Token(token),
                    seq,
                    acked_through,
                    operation,
                    verdict,
                    results,
                }
            }
            TAG_ACK => {
                let seq = reader.u64()?;
                let outcome = match reader.u8()? {
                    0 => Ok(get_results(reader)?),
                    1 => Err(get_op_error(reader)?),
                    tag => return Err(DecodeError::UnknownTag { what: "group ack outcome", tag }),
                };
                GroupMessage::Ack { group, epoch, seq, outcome }
            }
            TAG_REFUSED => {
                let seq = reader.u64()?;
                let refusal = match reader.u8()? {
                    0 => Refusal::Unauthorized,
                    1 => {
                        let position = reader.u8()?;
                        let reason = String::from_utf8_lossy(&reader.bytes()?).into_owned();
                        Refusal::MemberFailed { position, reason }
                    }
                    tag => return Err(DecodeError::UnknownTag { what: "group refusal", tag }),
                };
                GroupMessage::Refused { group, epoch, seq, refusal }
            }
            tag => return Err(DecodeError::UnknownTag { what: "group message", tag }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use chorus_core::codec::{decode_batch, encode_batch};
    use proptest::prelude::*;

    fn arb_operation() -> impl Strategy<Value = Operation> {
        let primitive = prop_oneof![
            (any::<u64>(), proptest::collection::vec(any::<u8>(), 0..32))
                .prop_map(|(offset, data)| Primitive::Write { offset, data: Bytes::from(data) }),
            (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>())
                .prop_map(|(offset, old, new, execute_map)| Primitive::Cas { offset, old, new, execute_map }),
            (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(src, dst, len)| Primitive::Memcpy {
                src,
                dst,
                len
            }),
            Just(Primitive::Flush),
        ];
        (primitive, any::<bool>(), any::<bool>()).prop_map(|(primitive, flush, yields_to_readers)| {
            Operation { primitive, flush, yields_to_readers }
        })
    }

    fn arb_op_error() -> impl Strategy<Value = OpError> {
        prop_oneof![
            (any::<u64>(), any::<u64>(), any::<u64>())
                .prop_map(|(offset, len, region_bytes)| OpError::OutOfBounds { offset, len, region_bytes }),
            any::<u64>().prop_map(|offset| OpError::Misaligned { offset }),
            (any::<u64>(), 0usize..=64).prop_map(|(execute_map, chain_len)| OpError::ExecuteMapBeyondChain {
                execute_map,
                chain_len
            }),
            any::<u64>().prop_map(|len| OpError::TooLarge { len }),
        ]
    }

    fn arb_message() -> impl Strategy<Value = GroupMessage> {
        let results = proptest::collection::vec(proptest::option::of(any::<u64>()), 0..8);
        prop_oneof![
            (
                any::<u64>(),
                any::<u64>(),
                any::<[u8; 16]>(),
                any::<u64>(),
                any::<u64>(),
                arb_operation(),
                proptest::option::of(arb_op_error()),
                results.clone()
            )
                .prop_map(
                    |(g, epoch, token, seq, acked_through, operation, verdict, results)| {
                        GroupMessage::Op {
                            group: GroupId(g),
                            epoch,
                            token: Token(token),
                            seq,
                            acked_through,
                            operation,
                            verdict,
                            results,
                        }
                    }
                ),
            (
                any::<u64>(),
                any::<u64>(),
                any::<u64>(),
                prop_oneof![results.prop_map(Ok), arb_op_error().prop_map(Err)]
            )
                .prop_map(|(g, epoch, seq, outcome)| GroupMessage::Ack {
                    group: GroupId(g),
                    epoch,
                    seq,
                    outcome
                }),
            (any::<u64>(), any::<u64>(), any::<u64>(), any::<u8>(), "[a-z ]{0,20}", any::<bool>()).prop_map(
                |(g, epoch, seq, position, reason, unauthorized)| GroupMessage::Refused {
                    group: GroupId(g),
                    epoch,
                    seq,
                    refusal: if unauthorized {
                        Refusal::Unauthorized
                    } else {
                        Refusal::MemberFailed { position, reason }
                    },
                }
            ),
        ]
    }

    proptest! {
        #[test]
        fn messages_round_trip(messages in proptest::collection::vec(arb_message(), 0..8)) {
            let mut buf = BytesMut::new();
            encode_batch(messages.iter(), &mut buf);
            prop_assert_eq!(decode_batch::<GroupMessage>(buf.freeze()).unwrap(), messages);
        }

        #[test]
        fn arbitrary_bytes_never_panic(junk in proptest::collection::vec(any::<u8>(), 0..160)) {
            let _ = decode_batch::<GroupMessage>(Bytes::from(junk.clone()));
            let _ = GroupMessage::decode_exact(Bytes::from(junk));
        }

        #[test]
        fn truncated_messages_are_errors(message in arb_message(), cut in any::<prop::sample::Index>()) {
            let mut buf = BytesMut::new();
            message.encode(&mut buf);
            let cut = cut.index(buf.len());
            prop_assert!(GroupMessage::decode_exact(buf.freeze().slice(..cut)).is_err());
        }
    }
}
