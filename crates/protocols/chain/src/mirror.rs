//! The coordinator's picture of the database: an exact copy of the index (plus each live
//! slot's key) and a free list of the heap. It turns updates into redo-record entries (heap
//! entry first, then the index slot, so every intermediate state a replica can read is
//! consistent), and is rebuilt from the coordinator's own region after every recovery.

use std::collections::BTreeMap;

use bytes::Bytes;
use chorus_core::{Key, Value};
use chorus_region::RegionMemory;

use crate::layout::{
    encode_entry, encode_slot, entry_bytes, key_hash, read_entry, read_slot, summary, ChainLayout,
    LayoutError, RegionSummary, SLOT_BYTES,
};

/// Check a whole region before serving from it (a restart on its data directory): its header
/// and last executed record, every index slot and every live heap entry against their
/// checksums, and that no two entries overlap. Returns where it stands.
pub fn verify(memory: &impl RegionMemory, layout: ChainLayout) -> Result<RegionSummary, LayoutError> {
    let summary = summary(memory, &layout)?;
    Mirror::rebuild(memory, layout)?;
    Ok(summary)
}

#[derive(Clone, Debug, Default)]
struct Slot {
    hash: u64,
    /// Database offset of the live entry; 0 = empty (hash 0) or deleted (tombstone).
    entry: u64,
    entry_size: u64,
    key: Option<Key>,
}

/// Why an update cannot be planned. Nothing was changed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum PlanError {
    /// Every index slot holds a live key.
    IndexFull,
    /// No free heap range is large enough.
    HeapFull,
    /// A key or value above the record limit (a quarter of the log).
    TooLarge,
}

impl PlanError {
    pub fn message(self) -> &'static str {
        match self {
            PlanError::IndexFull => "the chain region's index is full (raise chain_index_slots)",
            PlanError::HeapFull => "the chain region's heap is full (raise chain_heap_bytes)",
            PlanError::TooLarge => "the value is too large for the chain's log (raise chain_log_bytes)",
        }
    }
}

pub struct Mirror {
    layout: ChainLayout,
    slots: Vec<Slot>,
    /// Free heap ranges (database offsets): start -> length. Adjacent ranges are merged.
    free: BTreeMap<u64, u64>,
    /// Ranges freed by the batch being planned.
    deferred: Vec<(u64, u64)>,
    live_keys: usize,
}

impl Mirror {
    /// Read the index and every live entry of `memory`.
    pub fn rebuild(memory: &impl RegionMemory, layout: ChainLayout) -> Result<Mirror, LayoutError> {
        let mut slots = Vec::with_capacity(layout.index_slots as usize);
        let mut used: Vec<(u64, u64)> = Vec::new();
        for slot in 0..layout.index_slots {
            let word = read_slot(memory, &layout, slot)?;
            let mut entry = Slot { hash: word.hash, ..Slot::default() };
            if word.hash != 0 && word.entry != 0 {
                let (key, _, size) = read_entry(memory, &layout, word.entry)?;
                if key_hash(&key) != word.hash {
                    return Err(LayoutError::Corrupt(format!("slot {slot} hash does not match its key")));
                }
                entry.entry = word.entry;
                entry.entry_size = size;
                entry.key = Some(key);
                used.push((word.entry, size));
            }
            slots.push(entry);
        }
        used.sort();
        let mut free = BTreeMap::new();
        let mut cursor = layout.heap_start();
        for (start, size) in &used {
            if *start < cursor {
                return Err(LayoutError::Corrupt(format!("heap entries overlap at {start}")));
            }
            if *start > cursor {
                free.insert(cursor, start - cursor);
            }
            cursor = start + size;
        }
        if cursor < layout.txn.db_bytes {
            free.insert(cursor, layout.txn.db_bytes - cursor);
        }
        Ok(Mirror { layout, slots, free, deferred: Vec::new(), live_keys: used.len() })
    }

    pub fn live_keys(&self) -> usize {
        self.live_keys
    }

    /// Every key with a value.
    pub fn keys(&self) -> Vec<Key> {
        self.slots.iter().filter_map(|slot| slot.key.clone()).collect()
    }

    pub fn free_heap_bytes(&self) -> u64 {
        self.free.values().sum()
    }

    fn find(&self, key: &[u8]) -> (Option<usize>, Option<usize>) {
        let hash = key_hash(key);
        let count = self.slots.len();
        let mut slot = (hash % count as u64) as usize;
        let mut reusable = None;
        for _ in 0..count {
            let entry = &self.slots[slot];
            if entry.hash == 0 {
                return (None, reusable.or(Some(slot)));
            }
            if entry.entry == 0 {
                reusable = reusable.or(Some(slot));
            } else if entry.hash == hash && entry.key.as_deref() == Some(key) {
                return (Some(slot), reusable);
            }
            slot = (slot + 1) % count;
        }
        (None, reusable)
    }

    /// The live entry of `key`: database offset.
    pub fn entry_of(&self, key: &[u8]) -> Option<u64> {
        self.find(key).0.map(|slot| self.slots[slot].entry)
    }

    /// The current value of `key` in `memory`, which must be the coordinator's region with every
    /// planned record executed (the coordinator plans a batch only then).
    pub fn value(&self, memory: &impl RegionMemory, key: &[u8]) -> Result<Option<Value>, LayoutError> {
        match self.entry_of(key) {
            None => Ok(None),
            Some(entry) => read_entry(memory, &self.layout, entry).map(|(_, value, _)| Some(value)),
        }
    }

    /// Plan `key := value` (`None` deletes): the redo entries (database offset, bytes), heap
    /// entry before index slot, so a replica reading between the two sees the old value. The
    /// old entry's space is reusable only after [`Mirror::end_batch`]: within a batch a reader
    /// at the tail may still reach it through a slot not yet updated there.
    pub fn plan(&mut self, key: &Key, value: Option<&Value>) -> Result<Vec<(u64, Bytes)>, PlanError> {
        let (existing, reusable) = self.find(key);
        let Some(value) = value else {
            let Some(slot) = existing else { return Ok(Vec::new()) };
            let hash = self.slots[slot].hash;
            self.release(slot);
            self.live_keys -= 1;
            return Ok(vec![(slot as u64 * SLOT_BYTES, encode_slot(hash, 0))]);
        };
        let size = entry_bytes(key.len(), value.len());
        if size + 64 > self.layout.record_bytes_max() {
            return Err(PlanError::TooLarge);
        }
        let Some(slot) = existing.or(reusable) else { return Err(PlanError::IndexFull) };
        let Some(entry) = self.allocate(size) else { return Err(PlanError::HeapFull) };
        if existing.is_some() {
            self.release(slot);
        } else {
            self.live_keys += 1;
        }
        let hash = key_hash(key);
        self.slots[slot] = Slot { hash, entry, entry_size: size, key: Some(key.clone()) };
        Ok(vec![(entry, encode_entry(key, value)), (slot as u64 * SLOT_BYTES, encode_slot(hash, entry))])
    }

    /// The batch's record is planned: space its updates freed becomes reusable by the next
    /// batch, which executes only after this one is executed everywhere.
    pub fn end_batch(&mut self) {
        for (start, len) in std::mem::take(&mut self.deferred) {
            self.give_back(start, len);
        }
    }

    /// Free the slot's entry at the end of the batch (the slot keeps its hash: a tombstone,
    /// until reused).
    fn release(&mut self, slot: usize) {
        let (start, len) = (self.slots[slot].entry, self.slots[slot].entry_size);
        debug_assert!(start != 0 && len > 0);
        self.deferred.push((start, len));
        let entry = &mut self.slots[slot];
        entry.entry = 0;
        entry.entry_size = 0;
        entry.key = None;
    }

    fn allocate(&mut self, size: u64) -> Option<u64> {
        let (&start, &len) = self.free.iter().find(|(_, len)| **len >= size)?;
        self.free.remove(&start);
        if len > size {
            self.free.insert(start + size, len - size);
        }
        Some(start)
    }

    fn give_back(&mut self, mut start: u64, mut len: u64) {
        if let Some((&before, &before_len)) = self.free.range(..start).next_back() {
            if before + before_len == start {
                self.free.remove(&before);
                start = before;
                len += before_len;
            }
        }
        if let Some(after_len) = self.free.remove(&(start + len)) {
            len += after_len;
        }
        self.free.insert(start, len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{encode_record, lookup, parse_record};
    use chorus_region::{Region, TenantId};

    fn apply(region: &mut Region, layout: &ChainLayout, entries: &[(u64, Bytes)]) {
        for (offset, data) in entries {
            region.write(layout.txn.db_offset + offset, data).unwrap();
        }
    }

    #[test]
    fn planned_entries_make_the_region_answer_reads_by_itself() {
        let layout = ChainLayout::new(4096, 8, 512).unwrap();
        let mut region = Region::volatile(TenantId(0), "t", layout.region_bytes()).unwrap();
        let mut mirror = Mirror::rebuild(&region, layout).unwrap();
        let mut model = std::collections::HashMap::new();
        let mut rng = 7u64;
        for round in 0..2000u64 {
            rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let key = Bytes::from(format!("k{}", (rng >> 33) % 12));
            let value = (!(rng >> 20).is_multiple_of(4))
                .then(|| Bytes::from(vec![round as u8; ((rng >> 40) % 40) as usize]));
            match mirror.plan(&key, value.as_ref()) {
                Ok(entries) => {
                    apply(&mut region, &layout, &entries);
                    if round % 3 == 0 {
                        mirror.end_batch();
                    }
                    model.insert(key.clone(), value);
                }
                Err(PlanError::IndexFull | PlanError::HeapFull) => {}
                Err(PlanError::TooLarge) => panic!("small values fit"),
            }
            for (key, value) in &model {
                assert_eq!(&lookup(&region, &layout, key).unwrap(), value, "round {round}");
            }
            if round % 97 == 0 {
                mirror.end_batch();
                let rebuilt = Mirror::rebuild(&region, layout).unwrap();
                assert_eq!(rebuilt.free, mirror.free, "round {round}: free list survives a rebuild");
                assert_eq!(rebuilt.live_keys, mirror.live_keys);
            }
        }
    }

    #[test]
    fn a_full_heap_or_index_refuses_and_changes_nothing() {
        let layout = ChainLayout::new(4096, 2, 64).unwrap();
        let region = Region::volatile(TenantId(0), "t", layout.region_bytes()).unwrap();
        let mut mirror = Mirror::rebuild(&region, layout).unwrap();
        let free = mirror.free_heap_bytes();
        assert_eq!(
            mirror.plan(&Bytes::from("a"), Some(&Bytes::from(vec![0u8; 100]))),
            Err(PlanError::HeapFull)
        );
        assert_eq!(mirror.free_heap_bytes(), free);
        mirror.plan(&Bytes::from("a"), Some(&Bytes::from("1"))).unwrap();
        mirror.plan(&Bytes::from("b"), Some(&Bytes::from("2"))).unwrap();
        assert_eq!(mirror.plan(&Bytes::from("c"), Some(&Bytes::from("3"))), Err(PlanError::IndexFull));
        // Replacing a value with one too large keeps the old one allocated.
        let before = mirror.free_heap_bytes();
        assert_eq!(
            mirror.plan(&Bytes::from("a"), Some(&Bytes::from(vec![0u8; 60]))),
            Err(PlanError::HeapFull)
        );
        assert_eq!(mirror.free_heap_bytes(), before);
        assert!(mirror.entry_of(b"a").is_some());
    }

    #[test]
    fn records_parse_back_and_older_laps_do_not() {
        let layout = ChainLayout::new(1024, 8, 512).unwrap();
        let mut region = Region::volatile(TenantId(0), "t", layout.region_bytes()).unwrap();
        let entries = vec![(128u64, Bytes::from(vec![5u8; 100]))];
        let mut lsn = 0;
        for _ in 0..30 {
            let len = encode_record(&layout, 0, &entries).bytes.len() as u64;
            let start = crate::layout::record_start(lsn, len, 1024);
            let record = encode_record(&layout, start, &entries);
            region.write(record.base, &record.bytes).unwrap();
            assert_eq!(parse_record(&region, &layout, lsn), Some(record.clone()), "lsn {lsn}");
            assert_eq!(parse_record(&region, &layout, record.end), None);
            lsn = record.end;
        }
        assert_eq!(parse_record(&region, &layout, lsn + 1024), None);
    }
}
