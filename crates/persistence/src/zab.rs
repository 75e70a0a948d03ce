//! ZAB's durable records: its history, epoch and commit point as `Propose` messages and its
//! fuzzy snapshots as `SnapshotChunk`s (chorus_zab::durable says what each means), so the
//! persisted format is the wire format and has one codec.

use chorus_zab::{DurableState, Message, Zab};

/// Load `records` (oldest first) into a replica that has not started; the number of keys.
/// `seq_floor`: see [`Zab::restore`].
pub fn restore(zab: &mut Zab, records: Vec<Vec<u8>>, seq_floor: u64) -> anyhow::Result<usize> {
    let mut messages = Vec::with_capacity(records.len());
    super::decode_each(records, |message: Message| {
        messages.push(message);
        Some(0)
    })?;
    let state = DurableState::load(messages).map_err(|error| anyhow::anyhow!("{error}"))?;
    let keys = state.key_count();
    zab.restore(state, seq_floor);
    Ok(keys)
}
