//! ZAB peer messages and their wire encoding.

use bytes::{BufMut, BytesMut};
use chorus_core::codec::{DecodeError, Reader, WireMessage, WriteExt};
use chorus_core::{Command, Epoch, Key, NodeId, Outcome, Value};

use crate::log::{Entry, Zxid};

/// Every message carries the sender's epoch; receivers drop messages of any other epoch, so
/// a leader of an older epoch can neither propose to nor commit at a replica that moved on.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Message {
    /// A client update that entered at the sender, on its way to the leader. The leader
    /// proposes each sender's updates once each, in `seq` order. `floor`: the sender's lowest
    /// unanswered `seq`; it gave up on the ones below it that it has not applied (it left a
    /// view and answered them `OutcomeUnknown`), so the leader must not wait for them.
    Forward {
        epoch: Epoch,
        seq: u64,
        floor: u64,
        command: Command,
    },
    /// Entries `first_index ..` of the leader's history, and its commit point. One entry in
    /// the common case (PROPOSAL), several when a follower catches up.
    Propose {
        epoch: Epoch,
        first_index: u64,
        entries: Vec<Entry>,
        commit_index: u64,
    },
    /// A follower's history now ends at `last_index` (matching the leader's) and it has
    /// applied up to `applied_index`. Also the acknowledgement of NEWLEADER.
    Ack {
        epoch: Epoch,
        last_index: u64,
        applied_index: u64,
    },
    /// Entries up to `commit_index` are committed (COMMIT; also the leader's heartbeat).
    /// Entries up to `compact_index` are applied everywhere and may be forgotten.
    Commit {
        epoch: Epoch,
        commit_index: u64,
        compact_index: u64,
    },
    /// Recovery, phase 1: the leader of `epoch` asks for the follower's history summary.
    NewEpoch {
        epoch: Epoch,
    },
    /// The follower's answer (ACK-E): the epoch of the last history it synchronised to, its
    /// last zxid, and how far it has applied. `complete` is false for a replica that lost its
    /// history (restarted empty) and has not been synchronised since: it does not count in a
    /// discovery quorum. `snapshot_base` (0: none) is the index of a snapshot it has pulled
    /// and holds aside, ready to take the history after it.
    FollowerInfo {
        epoch: Epoch,
        current_epoch: Epoch,
        last_zxid: Zxid,
        applied_index: u64,
        complete: bool,
        snapshot_base: u64,
    },
    /// The leader adopts the sender's history: send entries from `from_index` on.
    FetchHistory {
        epoch: Epoch,
        from_index: u64,
    },
    History {
        epoch: Epoch,
        from_index: u64,
        entries: Vec<Entry>,
    },
    /// Recovery, phase 2: the follower's history becomes its applied prefix plus `entries`
    /// (starting at `prev_index + 1`), the leader's history.
    NewLeader {
        epoch: Epoch,
        prev_index: u64,
        entries: Vec<Entry>,
        commit_index: u64,
    },
    /// ZooKeeper's SNAP: the sender's history starts at `log_start`, after what the receiver
    /// holds, so the receiver must pull a snapshot of the sender's applied state first.
    TakeSnapshot {
        epoch: Epoch,
        log_start: u64,
    },
    /// The next snapshot chunk: keys after `after_key` (`None`: the first chunk).
    SnapshotRequest {
        epoch: Epoch,
        after_key: Option<Key>,
    },
    /// Keys after `after_key`, in key order. `base_index`/`base_zxid`: the sender's applied
    /// point when it served the chunk (the receiver keeps the first chunk's). `applied_seq`
    /// (in the last chunk): the highest applied `seq` per origin.
    SnapshotChunk {
        epoch: Epoch,
        after_key: Option<Key>,
        base_index: u64,
        base_zxid: Zxid,
        pairs: Vec<(Key, Value)>,
        applied_seq: Vec<(NodeId, u64)>,
        last: bool,
    },
    /// A linearizable read asks for the leader's commit point.
    Sync {
        epoch: Epoch,
        nonce: u64,
    },
    SyncReply {
        epoch: Epoch,
        nonce: u64,
        commit_index: u64,
    },
}

impl Message {
    pub fn epoch(&self) -> Epoch {
        match self {
            Message::Forward { epoch, .. }
            | Message::Propose { epoch, .. }
            | Message::Ack { epoch, .. }
            | Message::Commit { epoch, .. }
            | Message::NewEpoch { epoch }
            | Message::FollowerInfo { epoch, .. }
            | Message::FetchHistory { epoch, .. }
            | Message::History { epoch, .. }
            | Message::NewLeader { epoch, .. }
            | Message::TakeSnapshot { epoch, .. }
            | Message::SnapshotRequest { epoch, .. }
            | Message::SnapshotChunk { epoch, .. }
            | Message::Sync { epoch, .. }
            | Message::SyncReply { epoch, .. } => *epoch,
        }
    }
}

const TAG_FORWARD: u8 = 1;
const TAG_PROPOSE: u8 = 2;
const TAG_ACK: u8 = 3;
const TAG_COMMIT: u8 = 4;
const TAG_NEW_EPOCH: u8 = 5;
const TAG_FOLLOWER_INFO: u8 = 6;
const TAG_FETCH: u8 = 7;
const TAG_HISTORY: u8 = 8;
const TAG_NEW_LEADER: u8 = 9;
const TAG_SYNC: u8 = 10;
const TAG_SYNC_REPLY: u8 = 11;
const TAG_TAKE_SNAPSHOT: u8 = 12;
const TAG_SNAPSHOT_REQUEST: u8 = 13;
const TAG_SNAPSHOT_CHUNK: u8 = 14;

impl WireMessage for Entry {
    fn encode(&self, buf: &mut BytesMut) {
        buf.put_u64_le(self.zxid.epoch);
        buf.put_u64_le(self.zxid.counter);
        buf.put_bytes_prefixed(&self.key);
        match &self.write {
            None => buf.put_u8(0),
            Some(value) => {
                buf.put_u8(1);
                buf.put_optional_bytes(value.as_ref());
            }
        }
        buf.put_u8(self.origin.0);
        buf.put_u64_le(self.seq);
        self.outcome.encode(buf);
    }

    fn decode(reader: &mut Reader) -> Result<Self, DecodeError> {
        let zxid = Zxid { epoch: reader.u64()?, counter: reader.u64()? };
        let key = reader.bytes()?;
        let write = match reader.u8()? {
            0 => None,
            1 => Some(reader.optional_bytes()?),
            tag => return Err(DecodeError::UnknownTag { what: "zab entry write", tag }),
        };
        let origin = reader.u8()?;
        if origin as usize >= NodeId::COUNT_MAX {
            return Err(DecodeError::Invalid("node id out of range"));
        }
        Ok(Entry {
            zxid,
            key,
            write,
            origin: NodeId(origin),
            seq: reader.u64()?,
            outcome: Outcome::decode(reader)?,
        })
    }
}

fn put_entries(buf: &mut BytesMut, entries: &[Entry]) {
    buf.put_u32_le(u32::try_from(entries.len()).expect("entry count over u32"));
    for entry in entries {
        entry.encode(buf);
    }
}

fn put_optional_key(buf: &mut BytesMut, key: &Option<Key>) {
    match key {
        None => buf.put_u8(0),
        Some(key) => {
            buf.put_u8(1);
            buf.put_bytes_prefixed(key);
        }
    }
}

fn optional_key(reader: &mut Reader) -> Result<Option<Key>, DecodeError> {
    match reader.u8()? {
        0 => Ok(None),
        1 => Ok(Some(reader.bytes()?)),
        tag => Err(DecodeError::UnknownTag { what: "zab optional key", tag }),
    }
}

fn put_zxid(buf: &mut BytesMut, zxid: Zxid) {
    buf.put_u64_le(zxid.epoch);
    buf.put_u64_le(zxid.counter);
}

fn zxid(reader: &mut Reader) -> Result<Zxid, DecodeError> {
    Ok(Zxid { epoch: reader.u64()?, counter: reader.u64()? })
}

fn node(reader: &mut Reader) -> Result<NodeId, DecodeError> {
    let node = reader.u8()?;
    if node as usize >= NodeId::COUNT_MAX {
        return Err(DecodeError::Invalid("node id out of range"));
    }
    Ok(NodeId(node))
}

/// A count read from the wire, refused if the payload cannot hold that many items of at least
/// `item_bytes_min` bytes (before anything is allocated).
fn count(reader: &mut Reader, item_bytes_min: usize) -> Result<usize, DecodeError> {
    let count = reader.u32()? as usize;
    if count.saturating_mul(item_bytes_min) > reader.remaining() {
        return Err(DecodeError::Invalid("item count exceeds payload"));
    }
    Ok(count)
}

fn entries(reader: &mut Reader) -> Result<Vec<Entry>, DecodeError> {
    let count = reader.u32()? as usize;
    // Every entry takes well over one byte: a larger count is a lie, refused before allocating.
    if count > reader.remaining() {
        return Err(DecodeError::Invalid("entry count exceeds payload"));
    }
    (0..count).map(|_| Entry::decode(reader)).collect()
}

impl WireMessage for Message {
    fn encode(&self, buf: &mut BytesMut) {
        match self {
            Message::Forward { epoch, seq, floor, command } => {
                put_header(buf, TAG_FORWARD, *epoch);
                buf.put_u64_le(*seq);
                buf.put_u64_le(*floor);
                command.encode(buf);
            }
            Message::Propose { epoch, first_index, entries, commit_index } => {
                put_header(buf, TAG_PROPOSE, *epoch);
                buf.put_u64_le(*first_index);
                put_entries(buf, entries);
                buf.put_u64_le(*commit_index);
            }
            Message::Ack { epoch, last_index, applied_index } => {
                put_header(buf, TAG_ACK, *epoch);
                buf.put_u64_le(*last_index);
                buf.put_u64_le(*applied_index);
            }
            Message::Commit { epoch, commit_index, compact_index } => {
                put_header(buf, TAG_COMMIT, *epoch);
                buf.put_u64_le(*commit_index);
                buf.put_u64_le(*compact_index);
            }
            Message::NewEpoch { epoch } => put_header(buf, TAG_NEW_EPOCH, *epoch),
            Message::FollowerInfo {
                epoch,
                current_epoch,
                last_zxid,
                applied_index,
                complete,
                snapshot_base,
            } => {
                put_header(buf, TAG_FOLLOWER_INFO, *epoch);
                buf.put_epoch(*current_epoch);
                put_zxid(buf, *last_zxid);
                buf.put_u64_le(*applied_index);
                buf.put_u8(u8::from(*complete));
                buf.put_u64_le(*snapshot_base);
            }
            Message::TakeSnapshot { epoch, log_start } => {
                put_header(buf, TAG_TAKE_SNAPSHOT, *epoch);
                buf.put_u64_le(*log_start);
            }
            Message::SnapshotRequest { epoch, after_key } => {
                put_header(buf, TAG_SNAPSHOT_REQUEST, *epoch);
                put_optional_key(buf, after_key);
            }
            Message::SnapshotChunk { epoch, after_key, base_index, base_zxid, pairs, applied_seq, last } => {
                put_header(buf, TAG_SNAPSHOT_CHUNK, *epoch);
                put_optional_key(buf, after_key);
                buf.put_u64_le(*base_index);
                put_zxid(buf, *base_zxid);
                buf.put_u32_le(u32::try_from(pairs.len()).expect("pair count over u32"));
                for (key, value) in pairs {
                    buf.put_bytes_prefixed(key);
                    buf.put_bytes_prefixed(value);
                }
                buf.put_u32_le(u32::try_from(applied_seq.len()).expect("origin count over u32"));
                for (origin, seq) in applied_seq {
                    buf.put_u8(origin.0);
                    buf.put_u64_le(*seq);
                }
                buf.put_u8(u8::from(*last));
            }
            Message::FetchHistory { epoch, from_index } => {
                put_header(buf, TAG_FETCH, *epoch);
                buf.put_u64_le(*from_index);
            }
            Message::History { epoch, from_index, entries } => {
                put_header(buf, TAG_HISTORY, *epoch);
                buf.put_u64_le(*from_index);
                put_entries(buf, entries);
            }
            Message::NewLeader { epoch, prev_index, entries, commit_index } => {
                put_header(buf, TAG_NEW_LEADER, *epoch);
                buf.put_u64_le(*prev_index);
                put_entries(buf, entries);
                buf.put_u64_le(*commit_index);
            }
            Message::Sync { epoch, nonce } => {
                put_header(buf, TAG_SYNC, *epoch);
                buf.put_u64_le(*nonce);
            }
            Message::SyncReply { epoch, nonce, commit_index } => {
                put_header(buf, TAG_SYNC_REPLY, *epoch);
                buf.put_u64_le(*nonce);
                buf.put_u64_le(*commit_index);
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
                floor: reader.u64()?,
                command: Command::decode(reader)?,
            },
            TAG_PROPOSE => Message::Propose {
                epoch,
                first_index: reader.u64()?,
                entries: entries(reader)?,
                commit_index: reader.u64()?,
            },
            TAG_ACK => Message::Ack { epoch, last_index: reader.u64()?, applied_index: reader.u64()? },
            TAG_COMMIT => {
                Message::Commit { epoch, commit_index: reader.u64()?, compact_index: reader.u64()? }
            }
            TAG_NEW_EPOCH => Message::NewEpoch { epoch },
            TAG_FOLLOWER_INFO => Message::FollowerInfo {
                epoch,
                current_epoch: reader.epoch()?,
                last_zxid: zxid(reader)?,
                applied_index: reader.u64()?,
                complete: flag(reader)?,
                snapshot_base: reader.u64()?,
            },
            TAG_TAKE_SNAPSHOT => Message::TakeSnapshot { epoch, log_start: reader.u64()? },
            TAG_SNAPSHOT_REQUEST => Message::SnapshotRequest { epoch, after_key: optional_key(reader)? },
            TAG_SNAPSHOT_CHUNK => {
                let after_key = optional_key(reader)?;
                let base_index = reader.u64()?;
                let base_zxid = zxid(reader)?;
                // A pair is at least its two length prefixes.
                let pair_count = count(reader, 8)?;
                let pairs = (0..pair_count)
                    .map(|_| Ok((reader.bytes()?, reader.bytes()?)))
                    .collect::<Result<_, _>>()?;
                let origin_count = count(reader, 9)?;
                let applied_seq = (0..origin_count)
                    .map(|_| Ok((node(reader)?, reader.u64()?)))
                    .collect::<Result<_, _>>()?;
                Message::SnapshotChunk {
                    epoch,
                    after_key,
                    base_index,
                    base_zxid,
                    pairs,
                    applied_seq,
                    last: flag(reader)?,
                }
            }
            TAG_FETCH => Message::FetchHistory { epoch, from_index: reader.u64()? },
            TAG_HISTORY => Message::History { epoch, from_index: reader.u64()?, entries: entries(reader)? },
            TAG_NEW_LEADER => Message::NewLeader {
                epoch,
                prev_index: reader.u64()?,
                entries: entries(reader)?,
                commit_index: reader.u64()?,
            },
            TAG_SYNC => Message::Sync { epoch, nonce: reader.u64()? },
            TAG_SYNC_REPLY => Message::SyncReply { epoch, nonce: reader.u64()?, commit_index: reader.u64()? },
            tag => return Err(DecodeError::UnknownTag { what: "zab message", tag }),
        })
    }
}

fn flag(reader: &mut Reader) -> Result<bool, DecodeError> {
    match reader.u8()? {
        0 => Ok(false),
        1 => Ok(true),
        tag => Err(DecodeError::UnknownTag { what: "zab flag", tag }),
    }
}

fn put_header(buf: &mut BytesMut, tag: u8, epoch: Epoch) {
    buf.put_u8(tag);
    buf.put_epoch(epoch);
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use chorus_core::codec::{decode_batch, encode_batch};
    use chorus_core::RmwOp;
    use proptest::prelude::*;

    fn arb_bytes() -> impl Strategy<Value = Bytes> + Clone {
        proptest::collection::vec(any::<u8>(), 0..24).prop_map(Bytes::from)
    }

    fn arb_entry() -> impl Strategy<Value = Entry> + Clone {
        (
            any::<(u64, u64)>(),
            arb_bytes(),
            proptest::option::of(proptest::option::of(arb_bytes())),
            0u8..64,
            any::<u64>(),
            any::<i64>(),
        )
            .prop_map(|((epoch, counter), key, write, origin, seq, n)| Entry {
                zxid: Zxid { epoch, counter },
                key,
                write,
                origin: NodeId(origin),
                seq,
                outcome: Outcome::Integer(n),
            })
    }

    fn arb_message() -> impl Strategy<Value = Message> {
        let epoch = any::<u64>().prop_map(Epoch);
        let entries = proptest::collection::vec(arb_entry(), 0..4);
        prop_oneof![
            (epoch.clone(), any::<(u64, u64)>(), arb_bytes()).prop_map(|(epoch, (seq, floor), key)| {
                Message::Forward {
                    epoch,
                    seq,
                    floor,
                    command: Command::Rmw { key, op: RmwOp::IncrementBy(1) },
                }
            }),
            (epoch.clone(), any::<u64>(), entries.clone(), any::<u64>()).prop_map(
                |(epoch, first_index, entries, commit_index)| Message::Propose {
                    epoch,
                    first_index,
                    entries,
                    commit_index
                }
            ),
            (epoch.clone(), any::<u64>(), any::<u64>()).prop_map(|(epoch, last_index, applied_index)| {
                Message::Ack { epoch, last_index, applied_index }
            }),
            (epoch.clone(), any::<u64>(), any::<u64>()).prop_map(|(epoch, commit_index, compact_index)| {
                Message::Commit { epoch, commit_index, compact_index }
            }),
            epoch.clone().prop_map(|epoch| Message::NewEpoch { epoch }),
            (epoch.clone(), any::<u64>(), any::<(u64, u64)>(), any::<u64>(), any::<bool>(), any::<u64>())
                .prop_map(|(epoch, current, (e, c), applied_index, complete, snapshot_base)| {
                    Message::FollowerInfo {
                        epoch,
                        current_epoch: Epoch(current),
                        last_zxid: Zxid { epoch: e, counter: c },
                        applied_index,
                        complete,
                        snapshot_base,
                    }
                }),
            (epoch.clone(), any::<u64>())
                .prop_map(|(epoch, log_start)| Message::TakeSnapshot { epoch, log_start }),
            (epoch.clone(), proptest::option::of(arb_bytes()))
                .prop_map(|(epoch, after_key)| Message::SnapshotRequest { epoch, after_key }),
            (
                epoch.clone(),
                proptest::option::of(arb_bytes()),
                any::<(u64, u64, u64)>(),
                proptest::collection::vec((arb_bytes(), arb_bytes()), 0..4),
                proptest::collection::vec((0u8..64, any::<u64>()), 0..4),
                any::<bool>()
            )
                .prop_map(|(epoch, after_key, (base_index, e, c), pairs, seqs, last)| {
                    Message::SnapshotChunk {
                        epoch,
                        after_key,
                        base_index,
                        base_zxid: Zxid { epoch: e, counter: c },
                        pairs,
                        applied_seq: seqs.into_iter().map(|(node, seq)| (NodeId(node), seq)).collect(),
                        last,
                    }
                }),
            (epoch.clone(), any::<u64>())
                .prop_map(|(epoch, from_index)| Message::FetchHistory { epoch, from_index }),
            (epoch.clone(), any::<u64>(), entries.clone())
                .prop_map(|(epoch, from_index, entries)| Message::History { epoch, from_index, entries }),
            (epoch.clone(), any::<u64>(), entries, any::<u64>()).prop_map(
                |(epoch, prev_index, entries, commit_index)| Message::NewLeader {
                    epoch,
                    prev_index,
                    entries,
                    commit_index
                }
            ),
            (epoch.clone(), any::<u64>()).prop_map(|(epoch, nonce)| Message::Sync { epoch, nonce }),
            (epoch, any::<u64>(), any::<u64>()).prop_map(|(epoch, nonce, commit_index)| Message::SyncReply {
                epoch,
                nonce,
                commit_index
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
