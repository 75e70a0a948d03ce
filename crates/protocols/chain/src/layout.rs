//! What every member's region holds, and how to read it without any in-memory state.
//!
//! The region follows `chorus_group::txn::TxnLayout` (HyperLoop §5: a write-ahead log and a
//! database in one NVM area), with a header the transaction API leaves free put to use:
//!
//! ```text
//! 0      lock word        (txn: WRITER_BIT | owner, or a reader count; RECOVERING during recovery)
//! 8      log head         (txn: the log sequence number of the oldest unexecuted byte)
//! 16     last executed    (the lsn of the last record executed; recovery redoes it)
//! 24     magic + layout   (log bytes, index slots, heap bytes: a region of another shape is refused)
//! 56     redoing from     (REDOING | lsn while a recovery redoes records from lsn on; else 0)
//! 64     log              (circular; records never straddle its end)
//! 64+L   database:  index: `slots` x 16 bytes  (key hash u64 | check u16 << 48 | entry offset)
//!                   heap:  entries             (key_len u32 | value_len u32 | crc32 u32 | 0 u32 |
//!                                               key | value, 8-aligned)
//! ```
//!
//! The database is self-describing: a replica answers a read by hashing the key, probing the
//! index (linear probing) and reading the entry, straight from its own region. An index slot
//! with hash 0 is empty (ends a probe); a slot with a hash and entry 0 is a deleted key (a
//! tombstone: probes continue past it, an insert may reuse it). Entry offsets are relative to
//! the database start, so 0 never names an entry (the index comes first).
//!
//! Log records use the transaction API's format: `lsn u64 | entries u32 | body_bytes u32`,
//! then per entry `db_offset u64 | len u32 | crc32 u32 | data`, the CRC (of the lsn, offset,
//! length and data) in the word the transaction API leaves 0. All integers little-endian.
//!
//! Checksums (issue 24 point 3): every heap entry and every record entry carries a CRC-32, and
//! every index slot a 16-bit check of its hash and offset, so a region damaged on disk is
//! refused when it is read ([`LayoutError::Corrupt`]) instead of served: at start
//! ([`verify`]), by recovery, and by any read that reaches the damage.

use bytes::{BufMut, Bytes, BytesMut};
use chorus_core::{Key, Value};
use chorus_group::txn::TxnLayout;
use chorus_region::RegionMemory;

pub const LOCK_OFFSET: u64 = 0;
pub const HEAD_OFFSET: u64 = 8;
pub const LAST_EXECUTED_OFFSET: u64 = 16;
pub const MAGIC_OFFSET: u64 = 24;
/// Set by a recovery before it redoes anything (`REDOING | lsn` of the first record it
/// redoes) and cleared by its last operation. Redoing records a member had already executed
/// overwrites heap entries that later records reused, so until the redo reaches the log head
/// the database is a mixture no single lsn describes: a recovery cut short by a view change
/// must be redone from the same record, not from the last executed one (sweep seed 14580).
pub const REDO_FROM_OFFSET: u64 = 56;
pub const REDOING: u64 = 1 << 63;
pub const MAGIC: u64 = u64::from_le_bytes(*b"CHRSCHN2");
pub const SLOT_BYTES: u64 = 16;
pub const ENTRY_HEADER_BYTES: u64 = 16;
pub const RECORD_HEADER_BYTES: u64 = 16;
pub const RECORD_ENTRY_HEADER_BYTES: u64 = 16;
/// The lock word while a new coordinator brings the chain back to one state (§5.1): every
/// replica, the tail included, holds its reads until recovery ends.
pub const RECOVERING: u64 = chorus_group::txn::WRITER_BIT | 0xFFFF_FFFF;
/// The low bits of an index slot's entry word hold the offset; the top 16 its check.
const SLOT_OFFSET_MASK: u64 = (1 << 48) - 1;

/// The shape of a chain region. Identical at every member.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ChainLayout {
    pub txn: TxnLayout,
    pub index_slots: u64,
    pub heap_bytes: u64,
}

#[derive(Clone, PartialEq, Eq, Debug)]
pub enum LayoutError {
    /// The region bytes do not parse (a bug or foreign data): never served.
    Corrupt(String),
    Region(String),
}

impl std::fmt::Display for LayoutError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LayoutError::Corrupt(what) => write!(f, "corrupt chain region: {what}"),
            LayoutError::Region(what) => write!(f, "region access failed: {what}"),
        }
    }
}

fn region_error(error: chorus_region::RegionError) -> LayoutError {
    LayoutError::Region(error.to_string())
}

impl ChainLayout {
    pub fn new(log_bytes: u64, index_slots: u64, heap_bytes: u64) -> Result<ChainLayout, String> {
        if log_bytes < 1024 || !log_bytes.is_multiple_of(8) {
            return Err(format!("log_bytes must be a multiple of 8 and at least 1024, not {log_bytes}"));
        }
        if index_slots == 0 || heap_bytes < 64 || !heap_bytes.is_multiple_of(8) {
            return Err("the index needs slots and the heap at least 64 bytes (a multiple of 8)".into());
        }
        let db_bytes = index_slots
            .checked_mul(SLOT_BYTES)
            .and_then(|index| index.checked_add(heap_bytes))
            .ok_or("layout overflows")?;
        Ok(ChainLayout { txn: TxnLayout::new(log_bytes, db_bytes), index_slots, heap_bytes })
    }

    /// The server's default shape: a 4 MiB log (values up to about 1 MiB), 65,536 index slots
    /// (keys), a 64 MiB heap: a region of 69 MiB per node.
    pub fn server() -> ChainLayout {
        ChainLayout::new(4 * 1024 * 1024, 65_536, 64 * 1024 * 1024).expect("the server shape is valid")
    }

    /// A shape that fits one slot of the kernel data path (1 MiB,
    /// `chorus_group::kernel::layout::REGION_BYTES_MAX`): a 256 KiB log (values up to about
    /// 64 KiB), 2,048 keys, and the rest of the MiB as heap (735 KiB). Issue 17 point 5.
    pub fn kernel_slot() -> ChainLayout {
        const REGION_BYTES: u64 = chorus_group::kernel::layout::REGION_BYTES_MAX;
        const LOG_BYTES: u64 = 256 * 1024;
        const INDEX_SLOTS: u64 = 2048;
        let heap_bytes = REGION_BYTES - 64 - LOG_BYTES - INDEX_SLOTS * SLOT_BYTES;
        ChainLayout::new(LOG_BYTES, INDEX_SLOTS, heap_bytes).expect("the kernel-slot shape is valid")
    }

    /// A named shape: `server` or `kernel` (see [`ChainLayout::server`], [`ChainLayout::kernel_slot`]).
    pub fn named(name: &str) -> Result<ChainLayout, String> {
        match name {
            "server" => Ok(ChainLayout::server()),
            "kernel" => Ok(ChainLayout::kernel_slot()),
            other => Err(format!("unknown chain shape {other:?}: expected \"server\" or \"kernel\"")),
        }
    }

    /// This shape with its log, index or heap replaced where given (a TOML override).
    pub fn with_sizes(
        self,
        log_bytes: Option<u64>,
        index_slots: Option<u64>,
        heap_bytes: Option<u64>,
    ) -> Result<ChainLayout, String> {
        ChainLayout::new(
            log_bytes.unwrap_or(self.txn.log_bytes),
            index_slots.unwrap_or(self.index_slots),
            heap_bytes.unwrap_or(self.heap_bytes),
        )
    }

    pub fn region_bytes(&self) -> u64 {
        self.txn.region_bytes()
    }

    /// The heap's first byte, relative to the database start.
    pub fn heap_start(&self) -> u64 {
        self.index_slots * SLOT_BYTES
    }

    /// The largest record one batch may append: a quarter of the log, so the record being
    /// redone and the one after it never overlap in the circular log (§5.1 recovery).
    pub fn record_bytes_max(&self) -> u64 {
        self.txn.log_bytes / 4
    }

    /// The header words a fresh coordinator writes: magic and shape.
    pub fn magic_words(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(32);
        for word in [MAGIC, self.txn.log_bytes, self.index_slots, self.heap_bytes] {
            bytes.extend_from_slice(&word.to_le_bytes());
        }
        bytes
    }

    /// Refuse a region written with another layout; accept a fresh (zero) one.
    pub fn check_region(&self, memory: &impl RegionMemory) -> Result<(), String> {
        if memory.size() < self.region_bytes() {
            return Err(format!(
                "the region has {} bytes, the layout needs {}",
                memory.size(),
                self.region_bytes()
            ));
        }
        let words = memory.read_vec(MAGIC_OFFSET, 32).map_err(|e| e.to_string())?;
        if words.iter().all(|b| *b == 0) || words == self.magic_words() {
            return Ok(());
        }
        Err("the region was written with another chain layout (log, index or heap size differ)".into())
    }

    fn slot_offset(&self, slot: u64) -> u64 {
        self.txn.db_offset + slot * SLOT_BYTES
    }
}

/// FNV-1a, never 0 (0 marks an empty slot). Fixed, so every process agrees.
pub fn key_hash(key: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key {
        hash ^= *byte as u64;
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash | 1
}

/// Bytes an entry takes in the heap (8-aligned).
pub fn entry_bytes(key_len: usize, value_len: usize) -> u64 {
    (ENTRY_HEADER_BYTES + key_len as u64 + value_len as u64).div_ceil(8) * 8
}

/// The CRC a heap entry carries: of its lengths, key and value.
fn entry_crc(key: &[u8], value: &[u8]) -> u32 {
    let mut crc = crc32fast::Hasher::new();
    crc.update(&(key.len() as u32).to_le_bytes());
    crc.update(&(value.len() as u32).to_le_bytes());
    crc.update(key);
    crc.update(value);
    crc.finalize()
}

pub fn encode_entry(key: &[u8], value: &[u8]) -> Bytes {
    let len = entry_bytes(key.len(), value.len()) as usize;
    let mut bytes = BytesMut::with_capacity(len);
    bytes.put_u32_le(key.len() as u32);
    bytes.put_u32_le(value.len() as u32);
    bytes.put_u32_le(entry_crc(key, value));
    bytes.put_u32_le(0);
    bytes.put_slice(key);
    bytes.put_slice(value);
    bytes.resize(len, 0);
    bytes.freeze()
}

/// A slot's 16-bit check of its hash and entry offset (an empty slot, hash 0, has none).
fn slot_check(hash: u64, entry: u64) -> u64 {
    let mut crc = crc32fast::Hasher::new();
    crc.update(&hash.to_le_bytes());
    crc.update(&entry.to_le_bytes());
    (crc.finalize() & 0xFFFF) as u64
}

pub fn encode_slot(hash: u64, entry: u64) -> Bytes {
    debug_assert!(entry <= SLOT_OFFSET_MASK, "database offsets fit in 48 bits");
    let mut bytes = BytesMut::with_capacity(SLOT_BYTES as usize);
    bytes.put_u64_le(hash);
    bytes.put_u64_le(entry | slot_check(hash, entry) << 48);
    bytes.freeze()
}

/// One index slot as stored.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct SlotWord {
    pub hash: u64,
    pub entry: u64,
}

pub fn read_slot(
    memory: &impl RegionMemory,
    layout: &ChainLayout,
    slot: u64,
) -> Result<SlotWord, LayoutError> {
    let offset = layout.slot_offset(slot);
    let hash = memory.load_u64(offset).map_err(region_error)?;
    let word = memory.load_u64(offset + 8).map_err(region_error)?;
    if hash == 0 && word == 0 {
        return Ok(SlotWord { hash, entry: 0 });
    }
    let entry = word & SLOT_OFFSET_MASK;
    if hash == 0 || word >> 48 != slot_check(hash, entry) {
        return Err(LayoutError::Corrupt(format!("index slot {slot} fails its check")));
    }
    Ok(SlotWord { hash, entry })
}

/// The entry at database offset `entry`: (key, value, bytes it occupies).
pub fn read_entry(
    memory: &impl RegionMemory,
    layout: &ChainLayout,
    entry: u64,
) -> Result<(Key, Value, u64), LayoutError> {
    let heap = layout.heap_start()..layout.txn.db_bytes;
    if !heap.contains(&entry) || !entry.is_multiple_of(8) {
        return Err(LayoutError::Corrupt(format!("entry offset {entry} is outside the heap")));
    }
    let at = layout.txn.db_offset + entry;
    let header = memory.read_vec(at, ENTRY_HEADER_BYTES).map_err(region_error)?;
    let key_len = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes")) as u64;
    let value_len = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes")) as u64;
    let size = entry_bytes(key_len as usize, value_len as usize);
    if entry + size > layout.txn.db_bytes {
        return Err(LayoutError::Corrupt(format!("entry at {entry} runs past the heap")));
    }
    let body = memory.read_vec(at + ENTRY_HEADER_BYTES, key_len + value_len).map_err(region_error)?;
    let body = Bytes::from(body);
    let (key, value) = (body.slice(..key_len as usize), body.slice(key_len as usize..));
    let crc = u32::from_le_bytes(header[8..12].try_into().expect("4 bytes"));
    if crc != entry_crc(&key, &value) {
        return Err(LayoutError::Corrupt(format!("the heap entry at {entry} fails its checksum")));
    }
    Ok((key, value, size))
}

/// A read served from the region alone (what any replica does, §5.2): probe the index.
pub fn lookup(
    memory: &impl RegionMemory,
    layout: &ChainLayout,
    key: &[u8],
) -> Result<Option<Value>, LayoutError> {
    let hash = key_hash(key);
    let slots = layout.index_slots;
    let mut slot = hash % slots;
    for _ in 0..slots {
        let word = read_slot(memory, layout, slot)?;
        if word.hash == 0 {
            return Ok(None);
        }
        if word.hash == hash && word.entry != 0 {
            let (stored, value, _) = read_entry(memory, layout, word.entry)?;
            if stored == key {
                return Ok(Some(value));
            }
        }
        slot = (slot + 1) % slots;
    }
    Ok(None)
}

/// Where a region stands: the log position after its last executed record, that record's lsn
/// and the CRC of its bytes. What a joiner restarted on its data offers the coordinator, which
/// sends only the records after `log_head` if its own log holds the same record at
/// `last_lsn` (so the region is a prefix of the head's) and everything after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionSummary {
    pub log_head: u64,
    pub last_lsn: u64,
    pub last_crc: u32,
}

impl RegionSummary {
    /// A region that never executed a record (every database byte zero).
    pub const EMPTY: RegionSummary = RegionSummary { log_head: 0, last_lsn: 0, last_crc: 0 };
}

/// The CRC of a record's bytes (what [`RegionSummary::last_crc`] holds).
pub fn record_crc(record: &Record) -> u32 {
    crc32fast::hash(&record.bytes)
}

/// Where `memory` stands, from its header words and its last executed record, which must be
/// whole (the magic words are its shape or, for a region that never executed anything,
/// zero). A damaged header or last record is an error naming it.
pub fn summary(memory: &impl RegionMemory, layout: &ChainLayout) -> Result<RegionSummary, LayoutError> {
    let log_head = memory.load_u64(HEAD_OFFSET).map_err(region_error)?;
    let last_lsn = memory.load_u64(LAST_EXECUTED_OFFSET).map_err(region_error)?;
    let magic = memory.read_vec(MAGIC_OFFSET, 32).map_err(region_error)?;
    if log_head == 0 && last_lsn == 0 {
        if magic.iter().all(|byte| *byte == 0) || magic == layout.magic_words() {
            return Ok(RegionSummary::EMPTY);
        }
        return Err(LayoutError::Corrupt("the header's magic words are damaged".into()));
    }
    if magic != layout.magic_words() {
        return Err(LayoutError::Corrupt("the header's magic words are damaged".into()));
    }
    let record = parse_record(memory, layout, last_lsn).filter(|record| record.end == log_head);
    let Some(record) = record else {
        return Err(LayoutError::Corrupt(format!(
            "the last executed record (lsn {last_lsn}, ending at {log_head}) is missing or fails its checksum"
        )));
    };
    Ok(RegionSummary { log_head, last_lsn, last_crc: record_crc(&record) })
}

/// Redo, from this region's own log, the records whose execution may have been cut short by a
/// crash, before the region is checked and used (a restart on its data directory). A crash
/// between a turn's writes and their flush can keep some of them and lose others (a power
/// cut: the page cache's write-back order is not the program's): the last-executed word may
/// say a record ran while some of its copies were lost, and a record being executed may have
/// reached the database in part. Copies are idempotent physical redo, so executing again
/// (1) the last executed record and (2) the record at the log head, if the lock word says its
/// execution had begun (`WRITER_BIT`: the group write lock, or recovery, taken before any copy),
/// restores a state the chain went through. A record whose execution began had been appended
/// at every member of its configuration, so redoing it adds nothing the chain does not have.
/// Returns how many records were redone.
pub fn redo_interrupted(memory: &mut impl RegionMemory, layout: &ChainLayout) -> Result<usize, LayoutError> {
    let log_head = memory.load_u64(HEAD_OFFSET).map_err(region_error)?;
    let last_lsn = memory.load_u64(LAST_EXECUTED_OFFSET).map_err(region_error)?;
    let lock = memory.load_u64(LOCK_OFFSET).map_err(region_error)?;
    let mut records = Vec::new();
    if log_head != 0 {
        if let Some(record) = parse_record(memory, layout, last_lsn).filter(|record| record.end == log_head) {
            records.push(record);
        }
    }
    if lock & chorus_group::txn::WRITER_BIT != 0 {
        records.extend(parse_record(memory, layout, log_head));
    }
    for record in &records {
        for &(src, dst, len) in &record.copies {
            memory.memcpy(src, dst, len).map_err(region_error)?;
        }
        let mut header = Vec::with_capacity(16);
        header.extend_from_slice(&record.end.to_le_bytes());
        header.extend_from_slice(&record.lsn.to_le_bytes());
        memory.write(HEAD_OFFSET, &header).map_err(region_error)?;
    }
    memory.flush().map_err(region_error)?;
    Ok(records.len())
}

/// A redo record as parsed back from a log (recovery, §5.1).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Record {
    pub lsn: u64,
    pub end: u64,
    /// The record's bytes, as appended (re-appended verbatim by recovery).
    pub bytes: Bytes,
    /// Region offset of the record's first byte.
    pub base: u64,
    /// (source offset in the region's log, destination offset in the region, length)
    pub copies: Vec<(u64, u64, u64)>,
}

/// Where a record of `len` bytes appended at log position `tail` starts: at `tail`, or at the
/// next lap's beginning if it would straddle the log's end.
pub fn record_start(tail: u64, len: u64, log_bytes: u64) -> u64 {
    let position = tail % log_bytes;
    if position + len > log_bytes {
        tail + (log_bytes - position)
    } else {
        tail
    }
}

/// The CRC a record entry carries: of the record's lsn, the entry's offset, length and data.
fn record_entry_crc(lsn: u64, offset: u64, data: &[u8]) -> u32 {
    let mut crc = crc32fast::Hasher::new();
    crc.update(&lsn.to_le_bytes());
    crc.update(&offset.to_le_bytes());
    crc.update(&(data.len() as u32).to_le_bytes());
    crc.update(data);
    crc.finalize()
}

/// Encode a record at `lsn` and return it with the copies that execute it.
pub fn encode_record(layout: &ChainLayout, lsn: u64, entries: &[(u64, Bytes)]) -> Record {
    let len = RECORD_HEADER_BYTES
        + entries.iter().map(|(_, data)| RECORD_ENTRY_HEADER_BYTES + data.len() as u64).sum::<u64>();
    let base = layout.txn.log_offset + lsn % layout.txn.log_bytes;
    let mut bytes = BytesMut::with_capacity(len as usize);
    bytes.put_u64_le(lsn);
    bytes.put_u32_le(entries.len() as u32);
    bytes.put_u32_le((len - RECORD_HEADER_BYTES) as u32);
    let mut copies = Vec::with_capacity(entries.len());
    for (offset, data) in entries {
        bytes.put_u64_le(*offset);
        bytes.put_u32_le(data.len() as u32);
        bytes.put_u32_le(record_entry_crc(lsn, *offset, data));
        copies.push((base + bytes.len() as u64, layout.txn.db_offset + offset, data.len() as u64));
        bytes.put_slice(data);
    }
    Record { lsn, end: lsn + len, bytes: bytes.freeze(), base, copies }
}

/// The record a log holds for `lsn`, if one was appended there: looks at `lsn`'s position and,
/// when a record could not have fit there, at the next lap's start. `None` when nothing valid
/// is there (never appended, or an older lap's record).
pub fn parse_record(memory: &impl RegionMemory, layout: &ChainLayout, lsn: u64) -> Option<Record> {
    let log_bytes = layout.txn.log_bytes;
    let try_at = |start: u64| -> Option<Record> {
        let base = layout.txn.log_offset + start % log_bytes;
        let room = log_bytes - start % log_bytes;
        if room < RECORD_HEADER_BYTES {
            return None;
        }
        let header = memory.read_vec(base, RECORD_HEADER_BYTES).ok()?;
        let stored_lsn = u64::from_le_bytes(header[0..8].try_into().ok()?);
        let count = u32::from_le_bytes(header[8..12].try_into().ok()?) as u64;
        let body = u32::from_le_bytes(header[12..16].try_into().ok()?) as u64;
        if stored_lsn != start
            || count == 0
            || RECORD_HEADER_BYTES + body > room.min(layout.record_bytes_max())
        {
            return None;
        }
        let bytes = Bytes::from(memory.read_vec(base, RECORD_HEADER_BYTES + body).ok()?);
        let mut entries = Vec::with_capacity(count as usize);
        let mut at = RECORD_HEADER_BYTES as usize;
        for _ in 0..count {
            if at + RECORD_ENTRY_HEADER_BYTES as usize > bytes.len() {
                return None;
            }
            let offset = u64::from_le_bytes(bytes[at..at + 8].try_into().ok()?);
            let len = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().ok()?) as usize;
            at += RECORD_ENTRY_HEADER_BYTES as usize;
            if at + len > bytes.len() || offset.checked_add(len as u64)? > layout.txn.db_bytes {
                return None;
            }
            entries.push((offset, bytes.slice(at..at + len)));
            at += len;
        }
        if at != bytes.len() {
            return None;
        }
        let record = encode_record(layout, start, &entries);
        (record.bytes == bytes).then_some(record)
    };
    try_at(lsn).or_else(|| {
        let next_lap = lsn + (log_bytes - lsn % log_bytes);
        if next_lap != lsn {
            try_at(next_lap)
        } else {
            None
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use chorus_group::kernel::{layout::CHAIN_MAX, KernelDatapath};

    #[test]
    fn the_kernel_shape_fills_exactly_one_kernel_slot_and_the_server_shape_does_not_fit() {
        let kernel = ChainLayout::kernel_slot();
        assert_eq!(kernel.region_bytes(), chorus_group::kernel::layout::REGION_BYTES_MAX);
        assert_eq!(KernelDatapath::fits(kernel.region_bytes(), CHAIN_MAX), Ok(()));
        assert_eq!(kernel.record_bytes_max(), 64 * 1024);
        let server = ChainLayout::server();
        assert_eq!(server.region_bytes(), 64 + 4 * 1024 * 1024 + 65_536 * 16 + 64 * 1024 * 1024);
        assert!(KernelDatapath::fits(server.region_bytes(), 3).is_err());
    }

    #[test]
    fn shapes_are_chosen_by_name_and_overridden_field_by_field() {
        assert_eq!(ChainLayout::named("kernel"), Ok(ChainLayout::kernel_slot()));
        assert_eq!(ChainLayout::named("server"), Ok(ChainLayout::server()));
        assert!(ChainLayout::named("huge").unwrap_err().contains("\"server\" or \"kernel\""));
        let small = ChainLayout::kernel_slot().with_sizes(Some(8192), None, Some(4096)).unwrap();
        assert_eq!((small.txn.log_bytes, small.index_slots, small.heap_bytes), (8192, 2048, 4096));
        assert!(ChainLayout::server().with_sizes(Some(100), None, None).is_err());
        assert!(ChainLayout::server().with_sizes(None, Some(0), None).is_err());
    }
}
