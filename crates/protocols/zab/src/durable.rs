//! ZAB's durable state (issue 24), as the records a runtime appends to its log, in ZAB's own
//! message encoding (one codec for the wire and the disk), and what a restart loads from them.
//!
//! ZooKeeper keeps a transaction log and fuzzy snapshots of its data tree; so does this core:
//! * `Propose { epoch, first_index, entries, commit_index }`: the history from `first_index`
//!   on is `entries` (whatever followed is cut off), the history's epoch (ZAB's currentEpoch,
//!   in the `epoch` field) and how far it is committed;
//! * `SnapshotChunk { after_key: None, base_index, base_zxid, pairs, applied_seq, .. }`: a
//!   snapshot starts: the applied state at `base_index`, replacing everything before it;
//! * `SnapshotChunk { after_key: Some(_), pairs, base_index, .. }`: more keys of that
//!   snapshot, as they stood once `base_index` was applied (a later point: the snapshot is
//!   written a slice per turn while writes go on).
//!
//! Loading replays the committed entries after the snapshot's base over its keys. Entries
//! are idempotent writes, so the fuzzy snapshot plus the entries after its base give exactly
//! the applied state, as a pulled snapshot does (ZooKeeper's SNAP).

use std::collections::VecDeque;

use chorus_core::{Epoch, Key, NodeId, Value};
use rustc_hash::FxHashMap;

use crate::log::{Entry, Zxid};
use crate::message::Message;

/// How much of the replica's state the runtime has taken as records.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Cursor {
    /// Entries up to here are logged as they are now.
    pub index: u64,
    pub epoch: Epoch,
    pub commit: u64,
    /// A pulled snapshot replaced the state: log it whole.
    pub snapshot: bool,
}

/// What a restarted replica reloads (see [`crate::Zab::restore`]).
#[derive(Debug, Default)]
pub struct DurableState {
    pub(crate) store: FxHashMap<Key, Value>,
    pub(crate) applied_seq: FxHashMap<NodeId, u64>,
    /// The history holds entries `log_start ..`; the one before has zxid `compacted_zxid`.
    pub(crate) log_start: u64,
    pub(crate) compacted_zxid: Zxid,
    pub(crate) log: VecDeque<Entry>,
    pub(crate) current_epoch: Epoch,
    pub(crate) commit_index: u64,
    pub(crate) applied_index: u64,
}

impl DurableState {
    /// Rebuild the state from `records`, oldest first. A record that does not fit (a gap in
    /// the history, an epoch going back, another message) is damage: the error says which.
    pub fn load(records: impl IntoIterator<Item = Message>) -> Result<DurableState, String> {
        let mut state = DurableState { log_start: 1, ..DurableState::default() };
        for (number, record) in records.into_iter().enumerate() {
            state.record(record).map_err(|error| format!("ZAB record {number}: {error}"))?;
        }
        state.apply_committed();
        Ok(state)
    }

    pub fn last_index(&self) -> u64 {
        self.log_start + self.log.len() as u64 - 1
    }

    pub fn current_epoch(&self) -> Epoch {
        self.current_epoch
    }

    pub fn applied_index(&self) -> u64 {
        self.applied_index
    }

    pub fn key_count(&self) -> usize {
        self.store.len()
    }

    fn record(&mut self, record: Message) -> Result<(), String> {
        match record {
            Message::SnapshotChunk { after_key: None, base_index, base_zxid, pairs, applied_seq, .. } => {
                self.store = pairs.into_iter().collect();
                self.applied_seq = applied_seq.into_iter().collect();
                self.log.clear();
                self.log_start = base_index + 1;
                self.compacted_zxid = base_zxid;
                self.applied_index = base_index;
                self.commit_index = self.commit_index.max(base_index);
            }
            Message::SnapshotChunk { after_key: Some(_), pairs, base_index, .. } => {
                self.store.extend(pairs);
                // The keys reflect entries up to `base_index`: committed, so replayed too.
                self.commit_index = self.commit_index.max(base_index);
            }
            Message::Propose { epoch, first_index, entries, commit_index } => {
                if first_index > self.last_index() + 1 {
                    return Err(format!("history resumes at {first_index} after {}", self.last_index()));
                }
                if epoch < self.current_epoch {
                    return Err(format!("epoch {} after epoch {}", epoch.0, self.current_epoch.0));
                }
                // Entries the snapshot covers are skipped; from the first new index on, the
                // record's entries replace what followed.
                let keep = first_index.max(self.log_start) - self.log_start;
                self.log.truncate(keep as usize);
                let skipped = self.log_start.saturating_sub(first_index) as usize;
                self.log.extend(entries.into_iter().skip(skipped));
                self.current_epoch = epoch;
                self.commit_index = self.commit_index.max(commit_index);
            }
            other => return Err(format!("not a ZAB history record: {other:?}")),
        }
        Ok(())
    }

    fn apply_committed(&mut self) {
        let target = self.commit_index.min(self.last_index());
        while self.applied_index < target {
            let index = self.applied_index + 1;
            let entry = &self.log[(index - self.log_start) as usize];
            match &entry.write {
                Some(Some(value)) => {
                    self.store.insert(entry.key.clone(), value.clone());
                }
                Some(None) => {
                    self.store.remove(&entry.key);
                }
                None => {}
            }
            let seq = self.applied_seq.entry(entry.origin).or_default();
            *seq = (*seq).max(entry.seq);
            self.applied_index = index;
        }
    }
}

/// A snapshot's first record: the applied point, and the origins' applied numbers.
pub(crate) fn snapshot_start(
    base_index: u64,
    base_zxid: Zxid,
    pairs: Vec<(Key, Value)>,
    applied_seq: &FxHashMap<NodeId, u64>,
) -> Message {
    let mut applied_seq: Vec<(NodeId, u64)> = applied_seq.iter().map(|(node, seq)| (*node, *seq)).collect();
    applied_seq.sort_unstable();
    Message::SnapshotChunk {
        epoch: Epoch(0),
        after_key: None,
        base_index,
        base_zxid,
        pairs,
        applied_seq,
        last: false,
    }
}

/// More keys of a snapshot, as they stand with `applied_index` applied.
pub(crate) fn snapshot_more(applied_index: u64, pairs: Vec<(Key, Value)>) -> Option<Message> {
    let first = pairs.first()?.0.clone();
    Some(Message::SnapshotChunk {
        epoch: Epoch(0),
        after_key: Some(first),
        base_index: applied_index,
        base_zxid: Zxid::default(),
        pairs,
        applied_seq: Vec::new(),
        last: false,
    })
}
