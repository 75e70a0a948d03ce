//! Hermes' durable records: the keys' state exactly as a donor copies it to a shadow
//! (timestamp, value, RMW flag, whether it is Valid), encoded as Hermes' own `Chunk`
//! message, so the persisted format is the wire format and has one codec.

use bytes::{Bytes, BytesMut};
use chorus_core::codec::WireMessage;
use chorus_core::{Epoch, Key};
use chorus_hermes::message::ChunkEntry;
use chorus_hermes::{Hermes, Message};

/// The keys whose durable state a Hermes message carries or answers for: an INV's write
/// must be on disk before its ACK leaves, a coordinator's before its INV does.
pub fn message_keys(message: &Message, keys: &mut Vec<Key>) {
    match message {
        Message::Inv { key, .. } | Message::Ack { key, .. } | Message::Val { key, .. } => {
            keys.push(key.clone())
        }
        Message::Chunk { entries, .. } => keys.extend(entries.iter().map(|entry| entry.key.clone())),
        Message::ChunkRequest { .. } => {}
    }
}

pub fn record(hermes: &Hermes, keys: &[Key]) -> Option<Vec<u8>> {
    let entries: Vec<ChunkEntry> = keys.iter().filter_map(|key| hermes.export_key(key)).collect();
    if entries.is_empty() {
        return None;
    }
    let mut buf = BytesMut::new();
    Message::Chunk { epoch: Epoch(0), bucket: 0, buckets_total: 0, entries }.encode(&mut buf);
    Some(buf.to_vec())
}

/// Load `records` (oldest first) into a replica that has not started.
pub fn restore(hermes: &mut Hermes, records: Vec<Vec<u8>>) -> anyhow::Result<usize> {
    let mut keys = 0;
    for (index, record) in records.into_iter().enumerate() {
        match Message::decode_exact(Bytes::from(record)) {
            Ok(Message::Chunk { entries, .. }) => {
                keys += entries.len();
                hermes.restore(entries);
            }
            Ok(_) => anyhow::bail!("append-only record {index} is not a Hermes key record"),
            Err(error) => anyhow::bail!("append-only record {index} does not decode: {error}"),
        }
    }
    Ok(keys)
}
