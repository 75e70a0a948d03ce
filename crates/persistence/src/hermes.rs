//! Hermes' durable records: the keys' state exactly as a donor copies it to a shadow
//! (timestamp, value, RMW flag, whether it is Valid), encoded as Hermes' own `Chunk`
//! message, so the persisted format is the wire format and has one codec.

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

/// Whether `message` may leave only after the turn's records are synced. An INV carries the
/// coordinator's write (its timestamp must never be reused after a crash: a restarted
/// coordinator that lost it would issue the same timestamp with another value), an ACK
/// says the write is held, a chunk hands data over. A VAL only makes a key Valid, and a
/// Valid flag lost in a crash costs a replay (a key restored not known Valid comes back
/// Invalid), so VALs, and the replies of the turns that send them, go first.
pub fn must_persist_before(message: &Message) -> bool {
    !matches!(message, Message::Val { .. })
}

pub fn record(hermes: &Hermes, keys: &[Key]) -> Option<Vec<u8>> {
    let entries: Vec<ChunkEntry> = keys.iter().filter_map(|key| hermes.export_key(key)).collect();
    (!entries.is_empty())
        .then(|| super::encode(&Message::Chunk { epoch: Epoch(0), bucket: 0, buckets_total: 0, entries }))
}

/// Load `records` (oldest first) into a replica that has not started; the number of keys.
pub fn restore(hermes: &mut Hermes, records: Vec<Vec<u8>>) -> anyhow::Result<usize> {
    super::decode_each(records, |message| match message {
        Message::Chunk { entries, .. } => {
            let keys = entries.len();
            hermes.restore(entries);
            Some(keys)
        }
        _ => None,
    })
}
