//! CRAQ's durable records: each key's clean version and the dirty versions above it, as a
//! chain neighbour copies them to a joiner, encoded as CRAQ's own `Chunk` message.

use chorus_core::{Epoch, Key};
use chorus_craq::message::{ChunkKey, Message};
use chorus_craq::Craq;

/// The keys whose durable state a CRAQ message carries or answers for: a version must be on
/// disk before it is forwarded down the chain, a commit before its ACK goes up.
pub fn message_keys(message: &Message, keys: &mut Vec<Key>) {
    match message {
        Message::Write { key, .. } | Message::Ack { key, .. } => keys.push(key.clone()),
        Message::Chunk { keys: chunk, .. } => keys.extend(chunk.iter().map(|entry| entry.key.clone())),
        Message::Forward { command, .. } => keys.push(command.key().clone()),
        Message::Done { .. }
        | Message::VersionQuery { .. }
        | Message::VersionReply { .. }
        | Message::ChunkRequest { .. }
        | Message::ChunkRefused { .. } => {}
    }
}

pub fn record(craq: &Craq, keys: &[Key]) -> Option<Vec<u8>> {
    let keys: Vec<ChunkKey> = keys.iter().filter_map(|key| craq.export_key(key)).collect();
    let chunk = Message::Chunk { epoch: Epoch(0), bucket: 0, buckets_total: 0, keys, sessions: Vec::new() };
    matches!(&chunk, Message::Chunk { keys, .. } if !keys.is_empty()).then(|| super::encode(&chunk))
}

/// Load `records` (oldest first) into a replica that has not started; the number of keys.
/// `seq_floor`: see [`Craq::restore`].
pub fn restore(craq: &mut Craq, records: Vec<Vec<u8>>, seq_floor: u64) -> anyhow::Result<usize> {
    let keys = super::decode_each(records, |message| match message {
        Message::Chunk { keys, .. } => {
            let count = keys.len();
            craq.restore(keys, 0);
            Some(count)
        }
        _ => None,
    })?;
    craq.restore(Vec::new(), seq_floor);
    Ok(keys)
}
