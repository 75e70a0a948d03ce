//! CRAQ peer messages and their wire encoding.

use bytes::{BufMut, BytesMut};
use chorus_core::codec::{DecodeError, Reader, WireMessage, WriteExt};
use chorus_core::{Command, Epoch, Key, NodeId, Outcome, Value};

/// Every message carries the sender's epoch; receivers drop messages of any other epoch, so a
/// message sent along an old chain never lands on the re-linked one.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Message {
    /// A client update that entered the chain at `origin` (the sender), on its way to the
    /// head. `seq` numbers the origin's updates; `done_below` says every update of the origin
    /// with a lower `seq` has been answered, so replicas can forget those.
    Forward { epoch: Epoch, seq: u64, done_below: u64, command: Command },
    /// Version `version` of `key`, travelling from predecessor to successor. Carries the
    /// update's origin and outcome so whichever replica the client talked to can answer it
    /// once the version is clean, and so a new head recognises a retransmitted forward.
    Write {
        epoch: Epoch,
        key: Key,
        version: u64,
        value: Option<Value>,
        origin: NodeId,
        seq: u64,
        done_below: u64,
        outcome: Outcome,
    },
    /// From successor to predecessor: every version of `key` up to `version` is committed.
    Ack { epoch: Epoch, key: Key, version: u64 },
    /// From the head to an origin: an RMW that decided not to write, answered on a clean key.
    Done { epoch: Epoch, seq: u64, outcome: Outcome },
    /// Which version of `key` has the tail committed? (A read found the key dirty.)
    VersionQuery { epoch: Epoch, key: Key, query: u64 },
    /// The tail's answer: `version` is the newest committed version of `key`.
    VersionReply { epoch: Epoch, key: Key, query: u64, version: u64 },
}

impl Message {
    pub fn epoch(&self) -> Epoch {
        match self {
            Message::Forward { epoch, .. }
            | Message::Write { epoch, .. }
            | Message::Ack { epoch, .. }
            | Message::Done { epoch, .. }
            | Message::VersionQuery { epoch, .. }
            | Message::VersionReply { epoch, .. } => *epoch,
        }
    }
}

const TAG_FORWARD: u8 = 1;
const TAG_WRITE: u8 = 2;
const TAG_ACK: u8 = 3;
const TAG_DONE: u8 = 4;
const TAG_QUERY: u8 = 5;
const TAG_REPLY: u8 = 6;

impl WireMessage for Message {
    fn encode(&self, buf: &mut BytesMut) {
        match self {
            Message::Forward { epoch, seq, done_below, command } => {
                buf.put_u8(TAG_FORWARD);
                buf.put_epoch(*epoch);
                buf.put_u64_le(*seq);
                buf.put_u64_le(*done_below);
                command.encode(buf);
            }
            Message::Write { epoch, key, version, value, origin, seq, done_below, outcome } => {
                buf.put_u8(TAG_WRITE);
                buf.put_epoch(*epoch);
                buf.put_bytes_prefixed(key);
                buf.put_u64_le(*version);
                buf.put_optional_bytes(value.as_ref());
                buf.put_u8(origin.0);
                buf.put_u64_le(*seq);
                buf.put_u64_le(*done_below);
                outcome.encode(buf);
            }
            Message::Ack { epoch, key, version } => {
                buf.put_u8(TAG_ACK);
                buf.put_epoch(*epoch);
                buf.put_bytes_prefixed(key);
                buf.put_u64_le(*version);
            }
            Message::Done { epoch, seq, outcome } => {
                buf.put_u8(TAG_DONE);
                buf.put_epoch(*epoch);
                buf.put_u64_le(*seq);
                outcome.encode(buf);
            }
            Message::VersionQuery { epoch, key, query } => {
                buf.put_u8(TAG_QUERY);
                buf.put_epoch(*epoch);
                buf.put_bytes_prefixed(key);
                buf.put_u64_le(*query);
            }
            Message::VersionReply { epoch, key, query, version } => {
                buf.put_u8(TAG_REPLY);
                buf.put_epoch(*epoch);
                buf.put_bytes_prefixed(key);
                buf.put_u64_le(*query);
                buf.put_u64_le(*version);
            }
        }
    }

    fn decode(reader: &mut Reader) -> Result<Self, DecodeError> {
        let tag = reader.u8()?;
        let epoch = reader.epoch()?;
        Ok(match tag {
            TAG_FORWARD => Message::Forward {
                epoch,
                seq: reader.u64()?,
                done_below: reader.u64()?,
                command: Command::decode(reader)?,
            },
            TAG_WRITE => {
                let (key, version, value) = (reader.bytes()?, reader.u64()?, reader.optional_bytes()?);
                let origin = node_id(reader)?;
                let (seq, done_below) = (reader.u64()?, reader.u64()?);
                Message::Write {
                    epoch,
                    key,
                    version,
                    value,
                    origin,
                    seq,
                    done_below,
                    outcome: Outcome::decode(reader)?,
                }
            }
            TAG_ACK => Message::Ack { epoch, key: reader.bytes()?, version: reader.u64()? },
            TAG_DONE => Message::Done { epoch, seq: reader.u64()?, outcome: Outcome::decode(reader)? },
            TAG_QUERY => Message::VersionQuery { epoch, key: reader.bytes()?, query: reader.u64()? },
            TAG_REPLY => Message::VersionReply {
                epoch,
                key: reader.bytes()?,
                query: reader.u64()?,
                version: reader.u64()?,
            },
            tag => return Err(DecodeError::UnknownTag { what: "craq message", tag }),
        })
    }
}

fn node_id(reader: &mut Reader) -> Result<NodeId, DecodeError> {
    let id = reader.u8()?;
    if id as usize >= NodeId::COUNT_MAX {
        return Err(DecodeError::Invalid("node id out of range"));
    }
    Ok(NodeId(id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use chorus_core::codec::{decode_batch, encode_batch};
    use chorus_core::{CommandError, RmwOp};
    use proptest::prelude::*;

    fn arb_bytes() -> impl Strategy<Value = Bytes> {
        proptest::collection::vec(any::<u8>(), 0..24).prop_map(Bytes::from)
    }

    fn arb_outcome() -> impl Strategy<Value = Outcome> {
        prop_oneof![
            proptest::option::of(arb_bytes()).prop_map(Outcome::Value),
            Just(Outcome::Written),
            any::<i64>().prop_map(Outcome::Integer),
            any::<bool>().prop_map(Outcome::Flag),
            Just(Outcome::Error(CommandError::NotInteger)),
        ]
    }

    fn arb_command() -> impl Strategy<Value = Command> {
        prop_oneof![
            (arb_bytes(), proptest::option::of(arb_bytes()))
                .prop_map(|(key, value)| Command::Write { key, value }),
            (arb_bytes(), any::<i64>()).prop_map(|(key, d)| Command::Rmw { key, op: RmwOp::IncrementBy(d) }),
        ]
    }

    fn arb_message() -> impl Strategy<Value = Message> {
        let epoch = any::<u64>().prop_map(Epoch);
        prop_oneof![
            (epoch.clone(), any::<u64>(), any::<u64>(), arb_command()).prop_map(
                |(epoch, seq, done_below, command)| Message::Forward { epoch, seq, done_below, command }
            ),
            (
                epoch.clone(),
                arb_bytes(),
                any::<u64>(),
                proptest::option::of(arb_bytes()),
                0u8..64,
                any::<u64>(),
                any::<u64>(),
                arb_outcome()
            )
                .prop_map(|(epoch, key, version, value, origin, seq, done_below, outcome)| {
                    Message::Write {
                        epoch,
                        key,
                        version,
                        value,
                        origin: NodeId(origin),
                        seq,
                        done_below,
                        outcome,
                    }
                }),
            (epoch.clone(), arb_bytes(), any::<u64>()).prop_map(|(epoch, key, version)| Message::Ack {
                epoch,
                key,
                version
            }),
            (epoch.clone(), any::<u64>(), arb_outcome()).prop_map(|(epoch, seq, outcome)| Message::Done {
                epoch,
                seq,
                outcome
            }),
            (epoch.clone(), arb_bytes(), any::<u64>())
                .prop_map(|(epoch, key, query)| Message::VersionQuery { epoch, key, query }),
            (epoch, arb_bytes(), any::<u64>(), any::<u64>()).prop_map(|(epoch, key, query, version)| {
                Message::VersionReply { epoch, key, query, version }
            }),
        ]
    }

    proptest! {
        #[test]
        fn messages_round_trip(messages in proptest::collection::vec(arb_message(), 0..10)) {
            let mut buf = BytesMut::new();
            encode_batch(messages.iter(), &mut buf);
            prop_assert_eq!(decode_batch::<Message>(buf.freeze()).unwrap(), messages);
        }

        #[test]
        fn decoding_arbitrary_bytes_never_panics(junk in proptest::collection::vec(any::<u8>(), 0..128)) {
            let _ = decode_batch::<Message>(Bytes::from(junk.clone()));
            let _ = Message::decode_exact(Bytes::from(junk));
        }

        #[test]
        fn truncated_messages_are_errors(message in arb_message(), cut in any::<prop::sample::Index>()) {
            let mut buf = BytesMut::new();
            message.encode(&mut buf);
            let cut = cut.index(buf.len());
            prop_assert!(Message::decode_exact(buf.freeze().slice(..cut)).is_err());
        }
    }
}
