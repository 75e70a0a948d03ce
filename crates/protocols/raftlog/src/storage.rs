//! The in-memory Raft storage of one log: what raft-rs reads through its `Storage` trait.
//!
//! raft-rs's own `MemStorage` cannot compact while keeping the entries after the compaction
//! point (its `compact` forgets the term of the last compacted entry) and its `snapshot`
//! carries no data, so a follower that fell behind a compaction could never catch up. This
//! storage keeps the latest snapshot *with* the state machine bytes, so the leader can send
//! it (raft `MsgSnapshot`), and compacts to it. Durability is not its business: every change
//! the core makes here is also emitted as a `durable::Record` for the runtime to persist.
//!
//! Compaction may keep **trailing entries**: the last few entries the snapshot already
//! covers stay, so a follower that lags by less than them catches up from the log (raft-rs
//! sends entries from `first_index`) instead of receiving the whole state machine. They live
//! only in memory; a checkpoint carries the entries after the snapshot.

use raft::prelude::{ConfState, Entry, HardState, Snapshot};
use raft::{GetEntriesContext, RaftState, StorageError};

use crate::state::StateImage;

#[derive(Clone, Debug)]
pub struct LogStorage {
    hard_state: HardState,
    conf_state: ConfState,
    /// The latest snapshot's metadata (index, term, voters); its data is `image`.
    snapshot: Snapshot,
    /// The state machine at the snapshot, encoded only when first needed (a checkpoint's
    /// writer thread, or raft-rs sending it to a lagging follower).
    image: StateImage,
    /// Held entries: `entries[i].index == first + i`. `first <= snapshot index + 1`: the
    /// entries up to the snapshot index are trailing ones (covered by the snapshot, kept
    /// for lagging followers).
    entries: Vec<Entry>,
    first: u64,
    /// The term of entry `first - 1` (raft-rs asks for the term just before the first entry).
    term_before_first: u64,
}

impl LogStorage {
    pub fn new(voters: Vec<u64>) -> LogStorage {
        LogStorage::with_conf_state(ConfState::from((voters, vec![])))
    }

    /// An empty log whose configuration is `conf_state` (a node's founding configuration).
    pub fn with_conf_state(conf_state: ConfState) -> LogStorage {
        let mut snapshot = Snapshot::default();
        snapshot.mut_metadata().set_conf_state(conf_state.clone());
        LogStorage {
            hard_state: HardState::default(),
            conf_state,
            snapshot,
            image: StateImage::default(),
            entries: Vec::new(),
            first: 1,
            term_before_first: 0,
        }
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

    /// The configuration after a change was applied: later snapshots carry it.
    pub fn set_conf_state(&mut self, conf_state: ConfState) {
        self.conf_state = conf_state;
    }

    pub fn conf_state(&self) -> &ConfState {
        &self.conf_state
    }

    /// The configuration at the snapshot (what a checkpoint restores raft-rs from).
    pub fn snapshot_conf_state(&self) -> &ConfState {
        self.snapshot.get_metadata().get_conf_state()
    }

    pub fn set_commit(&mut self, commit: u64) {
        self.hard_state.commit = commit;
    }

    pub fn last_index(&self) -> u64 {
        (self.first + self.entries.len() as u64 - 1).max(self.snapshot_index())
    }

    /// Held entry `index`, if it is held (not compacted away, not beyond the end).
    pub fn entry(&self, index: u64) -> Option<&Entry> {
        self.entries.get(usize::try_from(index.checked_sub(self.first)?).ok()?)
    }

    /// The first entry raft-rs can read from this storage.
    pub fn first_held_index(&self) -> u64 {
        self.first
    }

    /// The entries after the snapshot (what a checkpoint must carry).
    pub fn held_entries(&self) -> &[Entry] {
        let covered = (self.snapshot_index() + 1 - self.first) as usize;
        &self.entries[covered.min(self.entries.len())..]
    }

    /// The term of entry `index`, if it is the snapshot's, still held, or the one just
    /// before the first held entry.
    pub fn term_of(&self, index: u64) -> Option<u64> {
        if index == self.snapshot_index() {
            return Some(self.snapshot_term());
        }
        if index + 1 == self.first {
            return Some(self.term_before_first);
        }
        let offset = index.checked_sub(self.first)?;
        self.entries.get(offset as usize).map(|entry| entry.term)
    }

    /// Drop every held entry, so the next one follows the snapshot.
    fn clear_entries(&mut self) {
        self.entries.clear();
        self.first = self.snapshot_index() + 1;
        self.term_before_first = self.snapshot_term();
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
        if self.entries.is_empty() {
            // Only the snapshot is held: the entries follow it.
            self.clear_entries();
        }
        self.entries.truncate((first.index - self.first) as usize);
        self.entries.extend(entries.into_iter().cloned());
        Ok(())
    }

    /// Install a snapshot received from the leader (or read at restart): every entry up to
    /// it is covered; later entries that agree with it are kept.
    pub fn apply_snapshot(&mut self, mut snapshot: Snapshot) {
        let index = snapshot.get_metadata().index;
        let term = snapshot.get_metadata().term;
        // (An older snapshot than the held entries never arrives; it would drop them all.)
        let agrees =
            self.term_of(index) == Some(term) && index <= self.last_index() && index + 1 >= self.first;
        let keep_from = if agrees { index + 1 } else { self.last_index() + 1 };
        let drop = keep_from.saturating_sub(self.first).min(self.entries.len() as u64) as usize;
        self.entries.drain(..drop);
        self.hard_state.term = self.hard_state.term.max(term);
        self.hard_state.commit = self.hard_state.commit.max(index);
        self.conf_state = snapshot.get_metadata().get_conf_state().clone();
        self.image = StateImage::from(std::mem::take(&mut snapshot.data));
        self.snapshot = snapshot;
        if !agrees || self.entries.is_empty() {
            self.clear_entries();
        } else {
            self.first = index + 1;
            self.term_before_first = term;
        }
    }

    /// Compact to `index` (applied, so covered by `state`): the snapshot becomes
    /// `(index, its term, state)` and earlier entries are dropped.
    pub fn compact(&mut self, index: u64, state: impl Into<StateImage>) {
        self.compact_keeping(index, state, 0);
    }

    /// How many entries up to `index` a compaction can keep: at most `count_max`, and no
    /// more than fit `bytes_max` of entry data.
    pub fn trailing_fitting(&self, index: u64, count_max: u64, bytes_max: u64) -> u64 {
        let Some(end) = (index + 1).checked_sub(self.first) else { return 0 };
        let end = (end as usize).min(self.entries.len());
        let mut bytes = 0u64;
        self.entries[..end]
            .iter()
            .rev()
            .take(count_max as usize)
            .take_while(|entry| {
                bytes += entry.data.len() as u64;
                bytes <= bytes_max
            })
            .count() as u64
    }

    /// [`LogStorage::compact`], keeping up to `trailing` entries at or before `index`
    /// (fewer if the storage holds fewer).
    pub fn compact_keeping(&mut self, index: u64, state: impl Into<StateImage>, trailing: u64) {
        assert!(index >= self.snapshot_index(), "compaction never goes backwards");
        assert!(index <= self.last_index(), "compaction only covers entries the log holds");
        let term = self.term_of(index).expect("the term of a held entry");
        let new_first = (index + 1).saturating_sub(trailing).max(self.first);
        let drop = ((new_first - self.first) as usize).min(self.entries.len());
        if drop > 0 {
            self.term_before_first = self.entries[drop - 1].term;
            self.entries.drain(..drop);
            self.first = new_first;
        }
        let mut snapshot = Snapshot::default();
        let metadata = snapshot.mut_metadata();
        metadata.index = index;
        metadata.term = term;
        metadata.set_conf_state(self.conf_state.clone());
        self.snapshot = snapshot;
        self.image = state.into();
        if self.entries.is_empty() || self.first > index + 1 {
            self.clear_entries();
        }
    }

    pub fn snapshot_image(&self) -> &StateImage {
        &self.image
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
        if low < self.first {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        assert!(high <= self.last_index() + 1, "raft-rs asked for entries past the last one");
        let offset = self.first;
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
        if index + 1 < self.first {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        self.term_of(index).ok_or(raft::Error::Store(StorageError::Unavailable))
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.first)
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(LogStorage::last_index(self))
    }

    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        if self.snapshot_index() < request_index {
            return Err(raft::Error::Store(StorageError::SnapshotTemporarilyUnavailable));
        }
        let mut snapshot = self.snapshot.clone();
        snapshot.data = self.image.bytes();
        Ok(snapshot)
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
    fn compaction_can_keep_trailing_entries_for_lagging_followers() {
        let mut storage = LogStorage::new(vec![1]);
        let entries: Vec<Entry> = (1..=10).map(|index| entry(index, 1 + index / 5)).collect();
        storage.append(&entries).unwrap();
        storage.compact_keeping(8, bytes::Bytes::from_static(b"state"), 3);
        // Entries 6..=8 stay readable (a follower at 5 catches up from the log), and the
        // term before the first one is known; earlier ones are compacted.
        assert_eq!(storage.first_index().unwrap(), 6);
        assert_eq!(storage.term(5).unwrap(), 2);
        assert!(storage.term(4).is_err());
        let read = storage.entries(6, 11, None, GetEntriesContext::empty(false)).unwrap();
        assert_eq!(read.iter().map(|entry| entry.index).collect::<Vec<_>>(), vec![6, 7, 8, 9, 10]);
        assert!(storage.entries(5, 11, None, GetEntriesContext::empty(false)).is_err());
        // A checkpoint carries only what follows the snapshot.
        assert_eq!(storage.held_entries().iter().map(|entry| entry.index).collect::<Vec<_>>(), vec![9, 10]);
        // Appends after trailing entries, and a later compaction without them.
        storage.append(&[entry(11, 3)]).unwrap();
        assert_eq!(storage.last_index(), 11);
        storage.compact(11, bytes::Bytes::from_static(b"later"));
        assert_eq!((storage.first_index().unwrap(), storage.last_index()), (12, 11));
        storage.append(&[entry(12, 3)]).unwrap();
        assert_eq!(storage.entries(12, 13, None, GetEntriesContext::empty(false)).unwrap().len(), 1);
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
