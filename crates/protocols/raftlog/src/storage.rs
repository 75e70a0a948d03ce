//! The in-memory Raft storage of one log: what raft-rs reads through its `Storage` trait.
//!
//! raft-rs's own `MemStorage` cannot compact while keeping the entries after the compaction
//! point (its `compact` forgets the term of the last compacted entry) and its `snapshot`
//! carries no data, so a follower that fell behind a compaction could never catch up. This
//! storage keeps the latest snapshot *with* the state machine bytes, so the leader can send
//! it (raft `MsgSnapshot`), and compacts to it. Durability is not its business: every change
//! the core makes here is also emitted as a `durable::Record` for the runtime to persist.

use raft::prelude::{ConfState, Entry, HardState, Snapshot};
use raft::{GetEntriesContext, RaftState, StorageError};

#[derive(Clone, Debug)]
pub struct LogStorage {
    hard_state: HardState,
    conf_state: ConfState,
    /// The latest snapshot: metadata (index, term, voters) and the encoded `LogState`.
    snapshot: Snapshot,
    /// Entries after the snapshot: `entries[i].index == snapshot index + 1 + i`.
    entries: Vec<Entry>,
}

impl LogStorage {
    pub fn new(voters: Vec<u64>) -> LogStorage {
        let conf_state = ConfState::from((voters, vec![]));
        let mut snapshot = Snapshot::default();
        snapshot.mut_metadata().set_conf_state(conf_state.clone());
        LogStorage { hard_state: HardState::default(), conf_state, snapshot, entries: Vec::new() }
    }

    pub fn snapshot_index(&self) -> u64 {
        self.snapshot.get_metadata().index
    }

    pub fn snapshot_term(&self) -> u64 {
        self.snapshot.get_metadata().term
    }

    pub fn hard_state(&self) -> &HardState {
        &self.hard_state
    }

    pub fn set_hard_state(&mut self, hard_state: HardState) {
        self.hard_state = hard_state;
    }

    pub fn set_commit(&mut self, commit: u64) {
        self.hard_state.commit = commit;
    }

    pub fn last_index(&self) -> u64 {
        self.snapshot_index() + self.entries.len() as u64
    }

    pub fn held_entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The term of entry `index`, if it is the snapshot's or still held.
    pub fn term_of(&self, index: u64) -> Option<u64> {
        if index == self.snapshot_index() {
            return Some(self.snapshot_term());
        }
        let offset = index.checked_sub(self.snapshot_index() + 1)?;
        self.entries.get(offset as usize).map(|entry| entry.term)
    }

    /// Append entries from raft-rs (or from replay), replacing any conflicting suffix.
    /// Entries at or below the snapshot are already covered by it and are skipped.
    /// A gap after the last entry is an error (a corrupt or incomplete log).
    pub fn append(&mut self, entries: &[Entry]) -> Result<(), &'static str> {
        let snapshot_index = self.snapshot_index();
        let entries: Vec<&Entry> = entries.iter().filter(|entry| entry.index > snapshot_index).collect();
        let Some(first) = entries.first() else { return Ok(()) };
        if first.index > self.last_index() + 1 {
            return Err("raft entries are not contiguous");
        }
        if entries.windows(2).any(|pair| pair[1].index != pair[0].index + 1) {
            return Err("raft entries are not contiguous");
        }
        self.entries.truncate((first.index - snapshot_index - 1) as usize);
        self.entries.extend(entries.into_iter().cloned());
        Ok(())
    }

    /// Install a snapshot received from the leader (or read at restart): every entry up to
    /// it is covered; later entries that agree with it are kept.
    pub fn apply_snapshot(&mut self, snapshot: Snapshot) {
        let index = snapshot.get_metadata().index;
        let term = snapshot.get_metadata().term;
        if self.term_of(index) == Some(term) && index <= self.last_index() {
            let keep_from = (index - self.snapshot_index()) as usize;
            self.entries.drain(..keep_from);
        } else {
            self.entries.clear();
        }
        self.hard_state.term = self.hard_state.term.max(term);
        self.hard_state.commit = self.hard_state.commit.max(index);
        self.conf_state = snapshot.get_metadata().get_conf_state().clone();
        self.snapshot = snapshot;
    }

    /// Compact to `index` (applied, so covered by `state`): the snapshot becomes
    /// `(index, its term, state)` and earlier entries are dropped.
    pub fn compact(&mut self, index: u64, state: bytes::Bytes) {
        assert!(index >= self.snapshot_index(), "compaction never goes backwards");
        assert!(index <= self.last_index(), "compaction only covers entries the log holds");
        let term = self.term_of(index).expect("the term of a held entry");
        let drop = (index - self.snapshot_index()) as usize;
        self.entries.drain(..drop);
        let mut snapshot = Snapshot::default();
        let metadata = snapshot.mut_metadata();
        metadata.index = index;
        metadata.term = term;
        metadata.set_conf_state(self.conf_state.clone());
        snapshot.data = state;
        self.snapshot = snapshot;
    }

    pub fn snapshot_data(&self) -> &bytes::Bytes {
        &self.snapshot.data
    }
}

impl raft::Storage for LogStorage {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState::new(self.hard_state.clone(), self.conf_state.clone()))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        if low <= self.snapshot_index() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        assert!(high <= self.last_index() + 1, "raft-rs asked for entries past the last one");
        let offset = self.snapshot_index() + 1;
        let mut entries = self.entries[(low - offset) as usize..(high - offset) as usize].to_vec();
        // raft-rs's size limit: at least one entry, then as many as fit.
        if let Some(max_size) = max_size.into() {
            let mut size = 0u64;
            let keep = entries
                .iter()
                .take_while(|entry| {
                    size += protobuf::Message::compute_size(*entry) as u64;
                    size <= max_size
                })
                .count();
            entries.truncate(keep.max(1));
        }
        Ok(entries)
    }

    fn term(&self, index: u64) -> raft::Result<u64> {
        if index < self.snapshot_index() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        self.term_of(index).ok_or(raft::Error::Store(StorageError::Unavailable))
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.snapshot_index() + 1)
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(LogStorage::last_index(self))
    }

    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        if self.snapshot_index() < request_index {
            return Err(raft::Error::Store(StorageError::SnapshotTemporarilyUnavailable));
        }
        Ok(self.snapshot.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use raft::Storage as _;

    fn entry(index: u64, term: u64) -> Entry {
        Entry { index, term, ..Default::default() }
    }

    #[test]
    fn append_replaces_a_conflicting_suffix_and_refuses_gaps() {
        let mut storage = LogStorage::new(vec![1, 2, 3]);
        storage.append(&[entry(1, 1), entry(2, 1), entry(3, 1)]).unwrap();
        storage.append(&[entry(2, 2)]).unwrap();
        assert_eq!(storage.last_index(), 2);
        assert_eq!(storage.term(2).unwrap(), 2);
        assert!(storage.append(&[entry(5, 2)]).is_err());
    }

    #[test]
    fn compaction_keeps_the_term_of_the_compacted_entry_and_later_entries() {
        let mut storage = LogStorage::new(vec![1]);
        storage.append(&[entry(1, 1), entry(2, 1), entry(3, 2)]).unwrap();
        storage.compact(2, bytes::Bytes::from_static(b"state"));
        assert_eq!(storage.first_index().unwrap(), 3);
        assert_eq!(storage.term(2).unwrap(), 1);
        assert!(storage.term(1).is_err());
        assert_eq!(storage.entries(3, 4, None, GetEntriesContext::empty(false)).unwrap().len(), 1);
        assert!(storage.entries(2, 4, None, GetEntriesContext::empty(false)).is_err());
        let snapshot = storage.snapshot(0, 2).unwrap();
        assert_eq!((snapshot.get_metadata().index, &snapshot.data[..]), (2, &b"state"[..]));
        // Replayed entries the snapshot covers are skipped.
        storage.append(&[entry(2, 1), entry(3, 2), entry(4, 2)]).unwrap();
        assert_eq!(storage.last_index(), 4);
    }

    #[test]
    fn an_installed_snapshot_keeps_entries_that_agree_with_it() {
        let mut storage = LogStorage::new(vec![1]);
        storage.append(&[entry(1, 1), entry(2, 1), entry(3, 1)]).unwrap();
        let mut snapshot = Snapshot::default();
        snapshot.mut_metadata().index = 2;
        snapshot.mut_metadata().term = 1;
        storage.apply_snapshot(snapshot.clone());
        assert_eq!(storage.last_index(), 3);
        snapshot.mut_metadata().index = 9;
        snapshot.mut_metadata().term = 3;
        storage.apply_snapshot(snapshot);
        assert_eq!((storage.last_index(), storage.hard_state().commit), (9, 9));
    }
}
