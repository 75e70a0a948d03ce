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
    /// Joining (Hermes §3.4 Recovery, chain replication's "copy the predecessor's state"):
    /// a joiner asks its donor for chunk `bucket` of `buckets_total` (0: the donor picks the
    /// split, from its data size).
    ChunkRequest { epoch: Epoch, bucket: u32, buckets_total: u32 },
    /// The donor's state for every key of one chunk, and what it knows of every origin's
    /// updates to those keys (so a joiner that becomes head executes no update twice).
    Chunk { epoch: Epoch, bucket: u32, buckets_total: u32, keys: Vec<ChunkKey>, sessions: Vec<ChunkSession> },
    /// The asked replica is joining too and has no complete state to give.
    ChunkRefused { epoch: Epoch },
}

/// One key as a donor holds it: the clean version and the dirty ones above it.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ChunkKey {
    pub key: Key,
    pub clean_version: u64,
    pub clean_value: Option<Value>,
    pub dirty: Vec<ChunkVersion>,
}

#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ChunkVersion {
    pub version: u64,
    pub value: Option<Value>,
    pub origin: NodeId,
    pub seq: u64,
    pub outcome: Outcome,
}

/// A donor's session of one origin, limited to the updates of the chunk's keys.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ChunkSession {
    pub origin: NodeId,
    pub done_below: u64,
    pub seen: Vec<ChunkSeen>,
}

#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ChunkSeen {
    pub seq: u64,
    pub key_hash: u64,
    pub answer: Option<Outcome>,
}

impl Message {
    pub fn epoch(&self) -> Epoch {
        match self {
            Message::Forward { epoch, .. }
            | Message::Write { epoch, .. }
            | Message::Ack { epoch, .. }
            | Message::Done { epoch, .. }
            | Message::VersionQuery { epoch, .. }
            | Message::VersionReply { epoch, .. }
            | Message::ChunkRequest { epoch, .. }
            | Message::Chunk { epoch, .. }
            | Message::ChunkRefused { epoch } => *epoch,
        }
    }
}

const TAG_FORWARD: u8 = 1;
const TAG_WRITE: u8 = 2;
const TAG_ACK: u8 = 3;
const TAG_DONE: u8 = 4;
const TAG_QUERY: u8 = 5;
const TAG_REPLY: u8 = 6;
const TAG_CHUNK_REQUEST: u8 = 7;
const TAG_CHUNK: u8 = 8;
const TAG_CHUNK_REFUSED: u8 = 9;

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
            Message::ChunkRequest { epoch, bucket, buckets_total } => {
                buf.put_u8(TAG_CHUNK_REQUEST);
                buf.put_epoch(*epoch);
                buf.put_u32_le(*bucket);
                buf.put_u32_le(*buckets_total);
            }
            Message::Chunk { epoch, bucket, buckets_total, keys, sessions } => {
                buf.put_u8(TAG_CHUNK);
                buf.put_epoch(*epoch);
                buf.put_u32_le(*bucket);
                buf.put_u32_le(*buckets_total);
                put_count(buf, keys.len());
                for key in keys {
                    encode_chunk_key(key, buf);
                }
                put_count(buf, sessions.len());
                for session in sessions {
                    buf.put_u8(session.origin.0);
                    buf.put_u64_le(session.done_below);
                    put_count(buf, session.seen.len());
                    for seen in &session.seen {
                        buf.put_u64_le(seen.seq);
                        buf.put_u64_le(seen.key_hash);
                        put_optional_outcome(buf, seen.answer.as_ref());
                    }
                }
            }
            Message::ChunkRefused { epoch } => {
                buf.put_u8(TAG_CHUNK_REFUSED);
                buf.put_epoch(*epoch);
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
            TAG_CHUNK_REQUEST => {
                Message::ChunkRequest { epoch, bucket: reader.u32()?, buckets_total: reader.u32()? }
            }
            TAG_CHUNK => {
                let (bucket, buckets_total) = (reader.u32()?, reader.u32()?);
                let keys = reader.list(decode_chunk_key)?;
                let sessions = reader.list(|reader| {
                    let origin = node_id(reader)?;
                    let done_below = reader.u64()?;
                    let seen = reader.list(|reader| {
                        Ok(ChunkSeen {
                            seq: reader.u64()?,
                            key_hash: reader.u64()?,
                            answer: optional_outcome(reader)?,
                        })
                    })?;
                    Ok(ChunkSession { origin, done_below, seen })
                })?;
                Message::Chunk { epoch, bucket, buckets_total, keys, sessions }
            }
            TAG_CHUNK_REFUSED => Message::ChunkRefused { epoch },
            tag => return Err(DecodeError::UnknownTag { what: "craq message", tag }),
        })
    }
}

fn put_count(buf: &mut BytesMut, count: usize) {
    buf.put_u32_le(u32::try_from(count).expect("a chunk's item count fits u32"));
}

fn put_optional_outcome(buf: &mut BytesMut, outcome: Option<&Outcome>) {
    match outcome {
        Some(outcome) => {
            buf.put_u8(1);
            outcome.encode(buf);
        }
        None => buf.put_u8(0),
    }
}

fn optional_outcome(reader: &mut Reader) -> Result<Option<Outcome>, DecodeError> {
    Ok(if reader.bool()? { Some(Outcome::decode(reader)?) } else { None })
}

fn encode_chunk_key(key: &ChunkKey, buf: &mut BytesMut) {
    buf.put_bytes_prefixed(&key.key);
    buf.put_u64_le(key.clean_version);
    buf.put_optional_bytes(key.clean_value.as_ref());
    put_count(buf, key.dirty.len());
    for version in &key.dirty {
        buf.put_u64_le(version.version);
        buf.put_optional_bytes(version.value.as_ref());
        buf.put_u8(version.origin.0);
        buf.put_u64_le(version.seq);
        version.outcome.encode(buf);
    }
}

fn decode_chunk_key(reader: &mut Reader) -> Result<ChunkKey, DecodeError> {
    let (key, clean_version, clean_value) = (reader.bytes()?, reader.u64()?, reader.optional_bytes()?);
    let dirty = reader.list(|reader| {
        let (version, value) = (reader.u64()?, reader.optional_bytes()?);
        let origin = node_id(reader)?;
        Ok(ChunkVersion { version, value, origin, seq: reader.u64()?, outcome: Outcome::decode(reader)? })
    })?;
    Ok(ChunkKey { key, clean_version, clean_value, dirty })
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

    fn arb_chunk_key() -> impl Strategy<Value = ChunkKey> {
        let version = (any::<u64>(), proptest::option::of(arb_bytes()), 0u8..64, any::<u64>(), arb_outcome())
            .prop_map(|(version, value, origin, seq, outcome)| ChunkVersion {
                version,
                value,
                origin: NodeId(origin),
                seq,
                outcome,
            });
        (
            arb_bytes(),
            any::<u64>(),
            proptest::option::of(arb_bytes()),
            proptest::collection::vec(version, 0..3),
        )
            .prop_map(|(key, clean_version, clean_value, dirty)| ChunkKey {
                key,
                clean_version,
                clean_value,
                dirty,
            })
    }

    fn arb_chunk_session() -> impl Strategy<Value = ChunkSession> {
        let seen = (any::<u64>(), any::<u64>(), proptest::option::of(arb_outcome()))
            .prop_map(|(seq, key_hash, answer)| ChunkSeen { seq, key_hash, answer });
        (0u8..64, any::<u64>(), proptest::collection::vec(seen, 0..3))
            .prop_map(|(origin, done_below, seen)| ChunkSession { origin: NodeId(origin), done_below, seen })
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
            (epoch.clone(), arb_bytes(), any::<u64>(), any::<u64>()).prop_map(
                |(epoch, key, query, version)| { Message::VersionReply { epoch, key, query, version } }
            ),
            (epoch.clone(), any::<u32>(), any::<u32>()).prop_map(|(epoch, bucket, buckets_total)| {
                Message::ChunkRequest { epoch, bucket, buckets_total }
            }),
            (
                epoch.clone(),
                any::<u32>(),
                any::<u32>(),
                proptest::collection::vec(arb_chunk_key(), 0..3),
                proptest::collection::vec(arb_chunk_session(), 0..3)
            )
                .prop_map(|(epoch, bucket, buckets_total, keys, sessions)| Message::Chunk {
                    epoch,
                    bucket,
                    buckets_total,
                    keys,
                    sessions
                }),
            epoch.prop_map(|epoch| Message::ChunkRefused { epoch }),
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
