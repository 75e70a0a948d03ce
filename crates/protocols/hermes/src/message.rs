//! Hermes peer messages (Figure 3) and their wire encoding.

use bytes::{BufMut, BytesMut};
use chorus_core::codec::{DecodeError, Reader, WireMessage, WriteExt};
use chorus_core::{Epoch, Key, Timestamp, Value};

/// Every message carries the sender's epoch; receivers drop messages of any other epoch
/// (§2.4, §3.4).
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Message {
    /// Invalidation: carries the new value so any invalidated replica can replay the write.
    /// `rmw` marks an RMW update (§3.6: RMW_flag), which followers acknowledge only if its
    /// timestamp is at least their own. `superseded`: the sender already holds a higher
    /// timestamp (a retransmission from the Trans state), so O3 must not count it as holding
    /// exactly `ts`.
    Inv { epoch: Epoch, key: Key, ts: Timestamp, value: Option<Value>, rmw: bool, superseded: bool },
    /// Acknowledgement of the INV with timestamp `ts`. `superseded`: the acknowledging replica
    /// already held a higher timestamp, so `ts` commits but must not be validated anywhere
    /// (see docs/protocols/hermes.md, "superseded timestamps are never validated").
    Ack { epoch: Epoch, key: Key, ts: Timestamp, superseded: bool },
    /// Validation: the update with timestamp `ts` is committed.
    Val { epoch: Epoch, key: Key, ts: Timestamp },
    /// §3.4 Recovery: a shadow replica asks a live replica for one chunk of its keys: those
    /// whose hash falls in `bucket` out of `buckets_total` (0: the donor chooses the split).
    ChunkRequest { epoch: Epoch, bucket: u32, buckets_total: u32 },
    /// One chunk of the donor's keys with their timestamps, so the shadow keeps whichever of
    /// a copied value and a concurrently received INV is newer.
    Chunk { epoch: Epoch, bucket: u32, buckets_total: u32, entries: Vec<ChunkEntry> },
}

/// One key as a donor holds it. `valid`: the donor's copy was Valid (committed); otherwise it
/// carries an update still in flight, which the shadow keeps Invalid.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ChunkEntry {
    pub key: Key,
    pub ts: Timestamp,
    pub value: Option<Value>,
    pub rmw: bool,
    pub valid: bool,
}

impl Message {
    pub fn epoch(&self) -> Epoch {
        match self {
            Message::Inv { epoch, .. }
            | Message::Ack { epoch, .. }
            | Message::Val { epoch, .. }
            | Message::ChunkRequest { epoch, .. }
            | Message::Chunk { epoch, .. } => *epoch,
        }
    }
}

const TAG_INV: u8 = 1;
const TAG_ACK: u8 = 2;
const TAG_VAL: u8 = 3;
const TAG_CHUNK_REQUEST: u8 = 4;
const TAG_CHUNK: u8 = 5;

impl WireMessage for Message {
    fn encode(&self, buf: &mut BytesMut) {
        match self {
            Message::Inv { epoch, key, ts, value, rmw, superseded } => {
                put_header(buf, TAG_INV, *epoch, key, *ts);
                buf.put_optional_bytes(value.as_ref());
                buf.put_bool(*rmw);
                buf.put_bool(*superseded);
            }
            Message::Ack { epoch, key, ts, superseded } => {
                put_header(buf, TAG_ACK, *epoch, key, *ts);
                buf.put_bool(*superseded);
            }
            Message::Val { epoch, key, ts } => put_header(buf, TAG_VAL, *epoch, key, *ts),
            Message::ChunkRequest { epoch, bucket, buckets_total } => {
                buf.put_u8(TAG_CHUNK_REQUEST);
                buf.put_epoch(*epoch);
                buf.put_u32_le(*bucket);
                buf.put_u32_le(*buckets_total);
            }
            Message::Chunk { epoch, bucket, buckets_total, entries } => {
                buf.put_u8(TAG_CHUNK);
                buf.put_epoch(*epoch);
                buf.put_u32_le(*bucket);
                buf.put_u32_le(*buckets_total);
                buf.put_u32_le(u32::try_from(entries.len()).expect("chunk entry count fits u32"));
                for entry in entries {
                    buf.put_bytes_prefixed(&entry.key);
                    buf.put_timestamp(entry.ts);
                    buf.put_optional_bytes(entry.value.as_ref());
                    buf.put_bool(entry.rmw);
                    buf.put_bool(entry.valid);
                }
            }
        }
    }

    fn decode(reader: &mut Reader) -> Result<Self, DecodeError> {
        let tag = reader.u8()?;
        let epoch = reader.epoch()?;
        match tag {
            TAG_CHUNK_REQUEST => {
                return Ok(Message::ChunkRequest {
                    epoch,
                    bucket: reader.u32()?,
                    buckets_total: reader.u32()?,
                })
            }
            TAG_CHUNK => {
                let (bucket, buckets_total) = (reader.u32()?, reader.u32()?);
                let count = reader.u32()? as usize;
                // Every entry takes more than one byte: a count beyond the rest is a lie.
                if count > reader.remaining() {
                    return Err(DecodeError::Invalid("chunk entry count exceeds message"));
                }
                let mut entries = Vec::with_capacity(count);
                for _ in 0..count {
                    entries.push(ChunkEntry {
                        key: reader.bytes()?,
                        ts: reader.timestamp()?,
                        value: reader.optional_bytes()?,
                        rmw: reader.bool()?,
                        valid: reader.bool()?,
                    });
                }
                return Ok(Message::Chunk { epoch, bucket, buckets_total, entries });
            }
            _ => {}
        }
        let key = reader.bytes()?;
        let ts = reader.timestamp()?;
        Ok(match tag {
            TAG_INV => Message::Inv {
                epoch,
                key,
                ts,
                value: reader.optional_bytes()?,
                rmw: reader.bool()?,
                superseded: reader.bool()?,
            },
            TAG_ACK => Message::Ack { epoch, key, ts, superseded: reader.bool()? },
            TAG_VAL => Message::Val { epoch, key, ts },
            tag => return Err(DecodeError::UnknownTag { what: "hermes message", tag }),
        })
    }
}

fn put_header(buf: &mut BytesMut, tag: u8, epoch: Epoch, key: &Key, ts: Timestamp) {
    buf.put_u8(tag);
    buf.put_epoch(epoch);
    buf.put_bytes_prefixed(key);
    buf.put_timestamp(ts);
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use chorus_core::codec::{decode_batch, encode_batch};
    use proptest::prelude::*;

    fn arb_message() -> impl Strategy<Value = Message> {
        let key = proptest::collection::vec(any::<u8>(), 0..16).prop_map(Bytes::from);
        let value = proptest::option::of(proptest::collection::vec(any::<u8>(), 0..64).prop_map(Bytes::from));
        (0u8..5, any::<u64>(), key, any::<u64>(), any::<u32>(), value, any::<bool>(), any::<bool>()).prop_map(
            |(kind, epoch, key, version, cid, value, rmw, superseded)| {
                let (epoch, ts) = (Epoch(epoch), Timestamp::new(version, cid));
                match kind {
                    0 => Message::Inv { epoch, key, ts, value, rmw, superseded },
                    1 => Message::Ack { epoch, key, ts, superseded },
                    2 => Message::Val { epoch, key, ts },
                    3 => Message::ChunkRequest { epoch, bucket: cid, buckets_total: version as u32 },
                    _ => {
                        let entry = ChunkEntry { key, ts, value, rmw, valid: superseded };
                        Message::Chunk {
                            epoch,
                            bucket: cid,
                            buckets_total: 7,
                            entries: vec![entry.clone(), entry],
                        }
                    }
                }
            },
        )
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
