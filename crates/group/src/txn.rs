//! The replicated-transaction API of HyperLoop §5 on top of the group primitives.
//!
//! Every member's region holds the same layout ([`TxnLayout`]): a lock word, the log head, a
//! circular write-ahead log and the database. The caller (transaction coordinator) drives it:
//!
//! * [`Txn::append`]: a redo record (a list of `(data, db offset)` entries) is written into
//!   the log of every member with one gWRITE carrying an interleaved gFLUSH, so it is durable
//!   everywhere when `append` returns;
//! * [`Txn::execute_and_advance`]: for the oldest unexecuted record, one gMEMCPY + gFLUSH per
//!   entry copies the data from the log to the database of every member, then a gWRITE +
//!   gFLUSH advances the log head. Re-executing a record after a failure is harmless: the
//!   copies are idempotent and the log space is not reused until the head moves past it;
//! * [`Txn::wr_lock`] / [`Txn::wr_unlock`]: a group write lock by gCAS on the lock word of
//!   every member; a partial success is undone with a second gCAS on exactly the members
//!   that swapped;
//! * [`Txn::rd_lock`] / [`Txn::rd_unlock`]: a reader count in the lock word of one member
//!   (read locks are not group-wide), incompatible with the write lock;
//! * [`Txn::read`]: a lock-free read of the database at one member (the head or the tail).
//!
//! [`TxnCore`] is the coordinator without I/O (the operations of each call and what their
//! results mean); [`Txn`] runs it on a synchronous [`GroupExecutor`], and the multi-tenant
//! benchmark's event loop runs it on the async [`crate::runtime::GroupClient`].
//!
//! Record format in the log: `lsn u64 | entries u32 | body_bytes u32`, then per entry
//! `db_offset u64 | len u32 | 0 u32 | data`. All integers little-endian. A record never
//! straddles the end of the log: it starts at the log's beginning instead.

use std::collections::VecDeque;

use bytes::{BufMut, Bytes, BytesMut};

use crate::op::{GroupError, OpOutcome, Operation};

/// The writer bit of the lock word; the low 32 bits count readers (at one member) or hold the
/// writer's owner id.
pub const WRITER_BIT: u64 = 1 << 63;
const RECORD_HEADER_BYTES: u64 = 16;
const ENTRY_HEADER_BYTES: u64 = 16;
/// gCAS attempts of a read lock or unlock before giving up.
const READ_LOCK_ATTEMPTS_MAX: usize = 16;

/// Where things live in every member's region.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct TxnLayout {
    pub lock_offset: u64,
    pub head_offset: u64,
    pub log_offset: u64,
    pub log_bytes: u64,
    pub db_offset: u64,
    pub db_bytes: u64,
}

impl TxnLayout {
    /// Lock word at 0, log head at 8, the log from 64, the database after it.
    pub fn new(log_bytes: u64, db_bytes: u64) -> TxnLayout {
        TxnLayout {
            lock_offset: 0,
            head_offset: 8,
            log_offset: 64,
            log_bytes,
            db_offset: 64 + log_bytes,
            db_bytes,
        }
    }
    /// The region size this layout needs.
    pub fn region_bytes(&self) -> u64 {
        self.db_offset + self.db_bytes
    }
}

#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum TxnError {
    #[error(transparent)]
    Group(#[from] GroupError),
    #[error("the log is full: the record needs {needed} bytes, {free} are free; execute records first")]
    LogFull { needed: u64, free: u64 },
    #[error("a record of {len} bytes cannot fit in a log of {log_bytes}")]
    RecordTooLarge { len: u64, log_bytes: u64 },
    #[error("entry of {len} bytes at database offset {offset} is outside the {db_bytes}-byte database")]
    EntryOutOfBounds { offset: u64, len: u64, db_bytes: u64 },
    #[error("lock not held: {0}")]
    LockNotHeld(String),
    #[error("no member at chain position {0}")]
    NoSuchMember(usize),
    #[error("unexpected group reply: {0}")]
    Protocol(String),
}

/// What the transaction API needs from a group: pipelined execution, and a local read of one
/// member's region (the tenant maps its region; HyperLoop's one-sided read).
pub trait GroupExecutor {
    /// Submit `operations` in order, pipelined, and wait for every one.
    fn execute(&mut self, operations: Vec<Operation>) -> Results;
    fn read(&mut self, position: usize, offset: u64, len: u64) -> Result<Vec<u8>, TxnError>;
    fn chain_len(&self) -> usize;
}

impl<E: GroupExecutor + ?Sized> GroupExecutor for &mut E {
    fn execute(&mut self, operations: Vec<Operation>) -> Vec<Result<OpOutcome, GroupError>> {
        (**self).execute(operations)
    }
    fn read(&mut self, position: usize, offset: u64, len: u64) -> Result<Vec<u8>, TxnError> {
        (**self).read(position, offset, len)
    }
    fn chain_len(&self) -> usize {
        (**self).chain_len()
    }
}

impl GroupExecutor for crate::sim::SimCluster {
    fn execute(&mut self, operations: Vec<Operation>) -> Vec<Result<OpOutcome, GroupError>> {
        crate::sim::SimCluster::execute(self, operations)
    }
    fn read(&mut self, position: usize, offset: u64, len: u64) -> Result<Vec<u8>, TxnError> {
        use chorus_region::RegionMemory;
        let member = self.members.get(position).ok_or(TxnError::NoSuchMember(position))?;
        member.memory().read_vec(offset, len).map_err(|e| TxnError::Protocol(e.to_string()))
    }
    fn chain_len(&self) -> usize {
        self.members.len()
    }
}

/// A record appended to every member's log and not yet executed.
#[derive(Debug)]
pub struct Appended {
    lsn: u64,
    end: u64,
    /// (source in the region, destination in the region, length)
    copies: Vec<(u64, u64, u64)>,
}

/// Results of one batch of group operations, in submission order.
pub type Results = Vec<Result<OpOutcome, GroupError>>;

/// What a write-lock gCAS found.
#[derive(Debug)]
pub enum WriteLockAttempt {
    /// Every member's lock word now holds this coordinator's writer word.
    Held,
    /// Some member's word was taken and no member swapped: nothing to undo.
    Taken,
    /// Some members swapped and some did not: run `undo` (a gCAS back on exactly the members
    /// in `swapped`), then check it with [`TxnCore::undone`].
    Undo { undo: Operation, swapped: u64 },
}

/// The transaction coordinator without I/O: the operations each call needs and what their
/// results mean. [`Txn`] runs it on a synchronous [`GroupExecutor`]; an event loop can run it
/// on an async group client with the same state transitions.
#[derive(Debug)]
pub struct TxnCore {
    layout: TxnLayout,
    owner: u32,
    head: u64,
    tail: u64,
    records: VecDeque<Appended>,
}

fn one(mut results: Results) -> Result<OpOutcome, TxnError> {
    results.pop().ok_or_else(|| TxnError::Protocol("no result".to_string()))?.map_err(TxnError::from)
}

/// The member bitmap of a chain of `chain_len`.
fn all_members(chain_len: usize) -> u64 {
    if chain_len >= 64 {
        u64::MAX
    } else {
        (1u64 << chain_len) - 1
    }
}

impl TxnCore {
    /// `owner` identifies this coordinator in the write-lock word (non-zero).
    pub fn new(layout: TxnLayout, owner: u32) -> TxnCore {
        TxnCore { layout, owner, head: 0, tail: 0, records: VecDeque::new() }
    }

    pub fn layout(&self) -> TxnLayout {
        self.layout
    }

    /// The durable gWRITE that appends a redo record of `entries` to every member's log; pass
    /// its results and the [`Appended`] to [`TxnCore::appended`].
    pub fn append_operation(&self, entries: &[(u64, Bytes)]) -> Result<(Operation, Appended), TxnError> {
        let log_bytes = self.layout.log_bytes;
        let mut len = RECORD_HEADER_BYTES;
        for (offset, data) in entries {
            let data_len = data.len() as u64;
            if offset.checked_add(data_len).is_none_or(|end| end > self.layout.db_bytes) {
                return Err(TxnError::EntryOutOfBounds {
                    offset: *offset,
                    len: data_len,
                    db_bytes: self.layout.db_bytes,
                });
            }
            len += ENTRY_HEADER_BYTES + data_len;
        }
        if len > log_bytes {
            return Err(TxnError::RecordTooLarge { len, log_bytes });
        }
        let position = self.tail % log_bytes;
        let start = if position + len > log_bytes { self.tail + (log_bytes - position) } else { self.tail };
        let end = start + len;
        if end - self.head > log_bytes {
            return Err(TxnError::LogFull { needed: len, free: log_bytes - (self.tail - self.head) });
        }
        let base = self.layout.log_offset + start % log_bytes;
        let mut record = BytesMut::with_capacity(len as usize);
        record.put_u64_le(start);
        record.put_u32_le(entries.len() as u32);
        record.put_u32_le((len - RECORD_HEADER_BYTES) as u32);
        let mut copies = Vec::with_capacity(entries.len());
        for (offset, data) in entries {
            record.put_u64_le(*offset);
            record.put_u32_le(data.len() as u32);
            record.put_u32_le(0);
            copies.push((base + record.len() as u64, self.layout.db_offset + offset, data.len() as u64));
            record.put_slice(data);
        }
        let operation = Operation::write(base, record.freeze()).durable();
        Ok((operation, Appended { lsn: start, end, copies }))
    }

    /// The append's gWRITE completed: the record is in the log. Returns its sequence number.
    pub fn appended(&mut self, appended: Appended, results: Results) -> Result<u64, TxnError> {
        // One append at a time: a second record planned before this one landed would overlap it.
        assert!(
            appended.lsn >= self.tail,
            "record {} planned before the tail {} moved",
            appended.lsn,
            self.tail
        );
        one(results)?;
        self.tail = appended.end;
        let lsn = appended.lsn;
        self.records.push_back(appended);
        Ok(lsn)
    }

    /// ExecuteAndAdvance of the oldest unexecuted record: a durable gMEMCPY per entry, then the
    /// log head's durable gWRITE. `None`: nothing to execute.
    pub fn execute_operations(&self) -> Option<Vec<Operation>> {
        let record = self.records.front()?;
        let mut operations: Vec<Operation> =
            record.copies.iter().map(|&(src, dst, len)| Operation::memcpy(src, dst, len).durable()).collect();
        operations
            .push(Operation::write(self.layout.head_offset, record.end.to_le_bytes().to_vec()).durable());
        Some(operations)
    }

    /// The oldest record's execution completed: advance the head. Returns its sequence number.
    pub fn executed(&mut self, results: Results) -> Result<Option<u64>, TxnError> {
        for result in results {
            result?;
        }
        let Some(record) = self.records.pop_front() else { return Ok(None) };
        self.head = if self.records.is_empty() { self.tail } else { record.end };
        Ok(Some(record.lsn))
    }

    fn writer_word(&self) -> u64 {
        WRITER_BIT | self.owner as u64
    }

    /// The gCAS that takes the group write lock on a chain of `chain_len`.
    pub fn wr_lock_operation(&self, chain_len: usize) -> Operation {
        Operation::cas(self.layout.lock_offset, 0, self.writer_word(), all_members(chain_len))
    }

    pub fn wr_lock_attempt(&self, chain_len: usize, results: Results) -> Result<WriteLockAttempt, TxnError> {
        let all = all_members(chain_len);
        let word = self.writer_word();
        let swapped = one(results)?.swapped_map(0);
        Ok(if swapped == all {
            WriteLockAttempt::Held
        } else if swapped == 0 {
            WriteLockAttempt::Taken
        } else {
            // Undo the partial success (HyperLoop §4.2): swap back exactly where it swapped.
            WriteLockAttempt::Undo {
                undo: Operation::cas(self.layout.lock_offset, word, 0, swapped),
                swapped,
            }
        })
    }

    /// The undo of a partial write lock completed: it must have swapped back everywhere it did.
    pub fn undone(&self, swapped: u64, results: Results) -> Result<(), TxnError> {
        let undo = one(results)?;
        if undo.swapped_map(self.writer_word()) != swapped {
            return Err(TxnError::Protocol(format!("undo of a partial write lock touched {undo:?}")));
        }
        Ok(())
    }

    pub fn wr_unlock_operation(&self, chain_len: usize) -> Operation {
        Operation::cas(self.layout.lock_offset, self.writer_word(), 0, all_members(chain_len))
    }

    pub fn wr_unlocked(&self, chain_len: usize, results: Results) -> Result<(), TxnError> {
        let outcome = one(results)?;
        if outcome.swapped_map(self.writer_word()) != all_members(chain_len) {
            return Err(TxnError::LockNotHeld(format!("write lock words were {:?}", outcome.result_map)));
        }
        Ok(())
    }

    /// Where `len` database bytes at `offset` are in a member's region.
    pub fn db_range(&self, offset: u64, len: u64) -> Result<u64, TxnError> {
        if offset.checked_add(len).is_none_or(|end| end > self.layout.db_bytes) {
            return Err(TxnError::EntryOutOfBounds { offset, len, db_bytes: self.layout.db_bytes });
        }
        Ok(self.layout.db_offset + offset)
    }
}

/// A transaction coordinator on one group: [`TxnCore`] on a synchronous executor.
pub struct Txn<E: GroupExecutor> {
    executor: E,
    core: TxnCore,
}

impl<E: GroupExecutor> Txn<E> {
    /// `owner` identifies this coordinator in the write-lock word (non-zero).
    pub fn new(executor: E, layout: TxnLayout, owner: u32) -> Txn<E> {
        Txn { executor, core: TxnCore::new(layout, owner) }
    }

    pub fn executor(&self) -> &E {
        &self.executor
    }
    pub fn executor_mut(&mut self) -> &mut E {
        &mut self.executor
    }
    pub fn layout(&self) -> TxnLayout {
        self.core.layout
    }
    /// Log sequence numbers: the head (oldest unexecuted byte) and the tail.
    pub fn log_bounds(&self) -> (u64, u64) {
        (self.core.head, self.core.tail)
    }
    pub fn unexecuted_records(&self) -> usize {
        self.core.records.len()
    }

    /// Append a redo record to every member's log, durably. Returns its log sequence number.
    pub fn append(&mut self, entries: &[(u64, Bytes)]) -> Result<u64, TxnError> {
        let (operation, appended) = self.core.append_operation(entries)?;
        let results = self.executor.execute(vec![operation]);
        self.core.appended(appended, results)
    }

    /// Execute the oldest unexecuted record on every member and advance the log head.
    /// Returns the record's log sequence number, or `None` when the log is empty.
    pub fn execute_and_advance(&mut self) -> Result<Option<u64>, TxnError> {
        let Some(operations) = self.core.execute_operations() else { return Ok(None) };
        let results = self.executor.execute(operations);
        self.core.executed(results)
    }

    /// Try to take the group write lock. `Ok(false)`: some member's lock word was taken (by a
    /// writer or readers); the members that did swap were rolled back.
    pub fn wr_lock(&mut self) -> Result<bool, TxnError> {
        let chain_len = self.executor.chain_len();
        let results = self.executor.execute(vec![self.core.wr_lock_operation(chain_len)]);
        match self.core.wr_lock_attempt(chain_len, results)? {
            WriteLockAttempt::Held => Ok(true),
            WriteLockAttempt::Taken => Ok(false),
            WriteLockAttempt::Undo { undo, swapped } => {
                let results = self.executor.execute(vec![undo]);
                self.core.undone(swapped, results)?;
                Ok(false)
            }
        }
    }

    pub fn wr_unlock(&mut self) -> Result<(), TxnError> {
        let chain_len = self.executor.chain_len();
        let results = self.executor.execute(vec![self.core.wr_unlock_operation(chain_len)]);
        self.core.wr_unlocked(chain_len, results)
    }

    /// Take a read lock at the member at `position` only. `Ok(false)`: it is write-locked.
    pub fn rd_lock(&mut self, position: usize) -> Result<bool, TxnError> {
        let bit = self.member_bit(position)?;
        let mut guess = 0u64;
        for _ in 0..READ_LOCK_ATTEMPTS_MAX {
            let next =
                guess.checked_add(1).ok_or_else(|| TxnError::Protocol("reader count overflow".into()))?;
            let lock_offset = self.core.layout.lock_offset;
            let outcome = one(self.executor.execute(vec![Operation::cas(lock_offset, guess, next, bit)]))?;
            let original = outcome.result_map.get(position).copied().flatten().unwrap_or(guess);
            if original == guess {
                return Ok(true);
            }
            if original & WRITER_BIT != 0 {
                return Ok(false);
            }
            guess = original;
        }
        Ok(false)
    }

    pub fn rd_unlock(&mut self, position: usize) -> Result<(), TxnError> {
        let bit = self.member_bit(position)?;
        let mut guess = 1u64;
        for _ in 0..READ_LOCK_ATTEMPTS_MAX {
            let lock_offset = self.core.layout.lock_offset;
            let outcome =
                one(self.executor.execute(vec![Operation::cas(lock_offset, guess, guess - 1, bit)]))?;
            let original = outcome.result_map.get(position).copied().flatten().unwrap_or(guess);
            if original == guess {
                return Ok(());
            }
            if original == 0 || original & WRITER_BIT != 0 {
                return Err(TxnError::LockNotHeld(format!("no read lock at member {position}")));
            }
            guess = original;
        }
        Err(TxnError::Protocol("read unlock kept racing".to_string()))
    }

    /// Lock-free read of `len` database bytes at `offset`, at the member at `position`.
    pub fn read(&mut self, position: usize, offset: u64, len: u64) -> Result<Vec<u8>, TxnError> {
        let at = self.core.db_range(offset, len)?;
        self.executor.read(position, at, len)
    }

    fn member_bit(&self, position: usize) -> Result<u64, TxnError> {
        if position >= self.executor.chain_len() {
            return Err(TxnError::NoSuchMember(position));
        }
        Ok(1u64 << position)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::caller::CallerConfig;
    use crate::sim::{NetFaults, SimCluster};
    use chorus_core::Time;
    use chorus_region::RegionMemory;

    fn cluster(members: usize, layout: TxnLayout, faults: NetFaults) -> SimCluster {
        let caller =
            CallerConfig { retransmit_after: Time::from_millis(5), attempts_max: 10_000, window_max: 8 };
        SimCluster::new(7, members, layout.region_bytes(), caller, faults)
    }

    fn lossy() -> NetFaults {
        NetFaults { loss: 0.1, duplicate: 0.1, reorder: 0.2, delay_min_us: 20, delay_spread_us: 300 }
    }

    #[test]
    fn append_and_execute_replicate_a_table_durably() {
        for faults in [NetFaults::none(), lossy()] {
            let layout = TxnLayout::new(256, 128);
            let mut txn = Txn::new(cluster(3, layout, faults), layout, 1);
            for round in 0..20u8 {
                let entries = vec![
                    ((round as u64 % 8) * 8, Bytes::from(vec![round; 8])),
                    (100, Bytes::from(format!("row{round:02}"))),
                ];
                txn.append(&entries).unwrap();
                if round % 3 == 2 {
                    while txn.execute_and_advance().unwrap().is_some() {}
                }
            }
            while txn.execute_and_advance().unwrap().is_some() {}
            let (head, tail) = txn.log_bounds();
            assert_eq!(head, tail, "everything executed");
            for position in 0..3 {
                assert_eq!(txn.read(position, 100, 5).unwrap(), b"row19");
                assert_eq!(txn.read(position, 3 * 8, 8).unwrap(), vec![19u8; 8]);
                let member = &txn.executor().members[position];
                let head_word = member.memory().load_u64(layout.head_offset).unwrap();
                assert_eq!(head_word, head, "the log head is replicated");
                assert_eq!(member.memory().durable(), member.memory().bytes(), "everything was flushed");
            }
        }
    }

    #[test]
    fn the_log_refuses_records_it_cannot_hold() {
        let layout = TxnLayout::new(128, 256);
        let mut txn = Txn::new(cluster(2, layout, NetFaults::none()), layout, 1);
        assert!(matches!(
            txn.append(&[(254, Bytes::from_static(b"123"))]),
            Err(TxnError::EntryOutOfBounds { .. })
        ));
        assert!(matches!(
            txn.append(&[(0, Bytes::from(vec![1u8; 100]))]),
            Err(TxnError::RecordTooLarge { .. })
        ));
        txn.append(&[(0, Bytes::from(vec![1u8; 60]))]).unwrap(); // 92 bytes
        assert!(matches!(txn.append(&[(0, Bytes::from(vec![2u8; 40]))]), Err(TxnError::LogFull { .. })));
        txn.execute_and_advance().unwrap();
        // Wraps to the log's start.
        txn.append(&[(0, Bytes::from(vec![2u8; 40]))]).unwrap();
        txn.execute_and_advance().unwrap();
        assert_eq!(txn.read(1, 0, 41).unwrap(), [vec![2u8; 40], vec![1u8]].concat());
    }

    #[test]
    fn write_locks_exclude_each_other_and_readers_and_undo_partial_success() {
        let layout = TxnLayout::new(128, 64);
        let mut group = cluster(3, layout, lossy());
        let word_at = |group: &SimCluster, m: usize| group.members[m].memory().load_u64(0).unwrap();
        let mut a = Txn::new(&mut group, layout, 1);
        assert!(a.rd_lock(1).unwrap(), "a reader at member 1");
        assert!(!a.wr_lock().unwrap(), "a writer cannot lock while member 1 has a reader");
        assert_eq!((word_at(a.executor(), 0), word_at(a.executor(), 1), word_at(a.executor(), 2)), (0, 1, 0));
        assert!(a.rd_lock(1).unwrap(), "read locks are shared");
        assert_eq!(word_at(a.executor(), 1), 2);
        a.rd_unlock(1).unwrap();
        a.rd_unlock(1).unwrap();
        assert!(matches!(a.rd_unlock(1), Err(TxnError::LockNotHeld(_))));
        assert!(a.wr_lock().unwrap());
        assert!(!a.rd_lock(2).unwrap(), "readers wait for the writer");

        // Another coordinator (owner 2) on the same group.
        let mut b = Txn::new(&mut group, layout, 2);
        assert!(!b.wr_lock().unwrap());
        assert!(matches!(b.wr_unlock(), Err(TxnError::LockNotHeld(_))));
        let writer = WRITER_BIT | 1;
        assert_eq!((word_at(&group, 0), word_at(&group, 1), word_at(&group, 2)), (writer, writer, writer));

        let mut a = Txn::new(&mut group, layout, 1);
        a.wr_unlock().unwrap();
        assert_eq!((word_at(&group, 0), word_at(&group, 1), word_at(&group, 2)), (0, 0, 0));
    }

    /// The event-loop driver runs `TxnCore` by hand: planning a second append before the first
    /// one's results are in would write two records at the same log position. That is a bug in
    /// the driver, caught where the second lands.
    #[test]
    #[should_panic(expected = "planned before the tail")]
    fn a_second_append_planned_before_the_first_lands_is_refused() {
        let layout = TxnLayout::new(256, 64);
        let mut group = cluster(3, layout, NetFaults::none());
        let mut core = TxnCore::new(layout, 1);
        let (first, first_record) = core.append_operation(&[(0, Bytes::from_static(b"first"))]).unwrap();
        let (second, second_record) = core.append_operation(&[(8, Bytes::from_static(b"second"))]).unwrap();
        let first_results = group.execute(vec![first]);
        core.appended(first_record, first_results).unwrap();
        let second_results = group.execute(vec![second]);
        let _ = core.appended(second_record, second_results);
    }

    #[test]
    fn a_write_lock_that_races_a_writer_at_one_member_is_rolled_back() {
        // Member 2's lock word is held by owner 9 (e.g. a coordinator whose undo is pending).
        let layout = TxnLayout::new(128, 64);
        let mut group = cluster(3, layout, NetFaults::none());
        group.members[2].memory_mut().cas(0, 0, WRITER_BIT | 9).unwrap();
        let mut txn = Txn::new(&mut group, layout, 1);
        assert!(!txn.wr_lock().unwrap());
        let words: Vec<u64> = (0..3).map(|m| group.members[m].memory().load_u64(0).unwrap()).collect();
        assert_eq!(words, vec![0, 0, WRITER_BIT | 9], "members 0 and 1 were rolled back, member 2 untouched");
    }
}
