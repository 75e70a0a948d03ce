//! The first level of Cyclone's two-level log (§2, "a small circular log in NVM that is
//! drained in batches to a larger log on flash"): a fixed-size circular log of records in a
//! memory region (an mmap'd file, `chorus-region`), made durable by flushing the region.
//!
//! Layout of the region:
//!
//! ```text
//! | header slot A (64 B) | header slot B (64 B) | data area (capacity bytes) ... |
//! ```
//!
//! A header slot holds `magic, counter, head (logical offset), head_seq, crc32`. Moving the
//! head writes the slot the current one is not in, with a larger counter, so a torn header
//! write leaves the other slot valid. Records in the data area are
//! `| len u32 | crc32 u32 | seq u64 | synced u64 | payload |`, at logical offsets that grow
//! forever and wrap physically (a record may straddle the end of the area). The CRC covers
//! `len`, `seq`, `synced` and the payload; sequence numbers are consecutive from `head_seq`.
//! Replay walks from the head until a record is torn (bad CRC, impossible length) or from an
//! earlier lap (wrong sequence number): that is the tail.
//!
//! `synced` is the largest sequence number a completed flush had made durable when the
//! record was written. It tells the two reasons a record can be bad apart when valid records
//! follow it. A power loss during a flush writes the flush's pages back in any order, so an
//! unsynced record can be torn while later unsynced ones survive: nobody was told about
//! them, and the log ends at the torn one (the survivors after it are erased, so that they
//! can never be mistaken for the successors of records written later). But when a later
//! record says the bad one was already synced, it was damaged after it was made durable,
//! and the start is refused rather than drop what followed. Only the last flush's records
//! are ambiguous (nothing written later vouches for them), as the newest record of any
//! single-copy log is.

use chorus_region::{RegionError, RegionMemory};

const MAGIC: u64 = 0x3267_6f6c_7466_6172; // "raftlog2"
/// The format before records carried `synced` (16-byte record headers).
const MAGIC_WITHOUT_SYNCED: u64 = 0x6c67_6f6c_7466_6172; // "raftlolg"
const SLOT_BYTES: u64 = 64;
const DATA_OFFSET: u64 = 2 * SLOT_BYTES;
/// `len`, `crc`, `seq`, `synced`.
pub const RECORD_HEADER_BYTES: u64 = 24;

#[derive(Debug, thiserror::Error)]
pub enum CircularError {
    #[error("circular log region: {0}")]
    Region(#[from] RegionError),
    #[error("circular log region of {0} bytes is too small (at least 4 KiB)")]
    TooSmall(u64),
    #[error("record of {0} bytes does not fit the circular log")]
    TooLarge(u64),
    #[error("circular log is full: drain it first")]
    Full,
    #[error("circular log: both header slots are damaged but the region holds data")]
    HeaderDamaged,
    #[error(
        "circular log written by an older Chorus (records without a synced mark); start that \
         release once and stop it cleanly, or move the data directory aside"
    )]
    OlderFormat,
}

/// A whole record read back.
struct ValidRecord {
    synced: u64,
    payload: Vec<u8>,
}

/// One record found by replay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CircularRecord {
    pub seq: u64,
    pub payload: Vec<u8>,
}

pub struct CircularLog<M: RegionMemory> {
    region: M,
    capacity: u64,
    /// Logical offset and sequence number of the oldest record not yet drained.
    head: u64,
    head_seq: u64,
    /// Where the next record goes, and its sequence number.
    tail: u64,
    next_seq: u64,
    /// The header slot counter last written.
    counter: u64,
    /// The largest sequence number a completed flush made durable (written into every
    /// record appended, see the module docs).
    synced_through: u64,
    /// Set by replay: a record damaged after a flush had made it durable.
    damaged: Option<u64>,
    /// Set by replay: valid records found past a torn unsynced one, and erased.
    erased_after_tear: u64,
}

/// What replay found past the record where it stopped.
enum PastTheTail {
    /// Nothing valid: an ordinary tail.
    Nothing,
    /// Valid records, none of which says the stopping record was synced: a power loss tore
    /// unsynced records; these (from `at` to `end`) are erased.
    Unsynced { records: u64, end: u64 },
    /// A valid record says the stopping record was synced: it was damaged since.
    SyncedRecordDamaged,
}

fn header_crc(words: &[u64; 4]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    for word in words {
        hasher.update(&word.to_le_bytes());
    }
    hasher.finalize()
}

fn record_crc(len: u32, seq: u64, synced: u64, payload: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&len.to_le_bytes());
    hasher.update(&seq.to_le_bytes());
    hasher.update(&synced.to_le_bytes());
    hasher.update(payload);
    hasher.finalize()
}

impl<M: RegionMemory> CircularLog<M> {
    /// Open the log in `region`: a region without a valid header is formatted empty, with
    /// sequence numbers starting at `first_seq`. Returns the log and the records between
    /// head and tail, oldest first.
    pub fn open(region: M, first_seq: u64) -> Result<(CircularLog<M>, Vec<CircularRecord>), CircularError> {
        if region.size() < DATA_OFFSET + 4096 {
            return Err(CircularError::TooSmall(region.size()));
        }
        let capacity = region.size() - DATA_OFFSET;
        let mut log = CircularLog {
            region,
            capacity,
            head: 0,
            head_seq: first_seq,
            tail: 0,
            next_seq: first_seq,
            counter: 0,
            synced_through: first_seq.saturating_sub(1),
            damaged: None,
            erased_after_tear: 0,
        };
        let Some((counter, head, head_seq)) = log.read_header(MAGIC)? else {
            // No valid header: a new region (all zeros) is formatted; anything else lost both
            // header slots to damage, and formatting it would silently drop its records.
            if log.read_header(MAGIC_WITHOUT_SYNCED)?.is_some() {
                return Err(CircularError::OlderFormat);
            }
            if !log.is_blank()? {
                return Err(CircularError::HeaderDamaged);
            }
            // Both slots, so that one damaged slot later still leaves a valid one.
            log.write_header(0, first_seq)?;
            log.write_header(0, first_seq)?;
            log.region.flush()?;
            return Ok((log, Vec::new()));
        };
        log.counter = counter;
        log.head = head;
        log.head_seq = head_seq;
        let records = log.scan()?;
        // What replay found may have been in the page cache only (the process died, the
        // machine did not): make it durable before anything is built on it.
        log.region.flush()?;
        log.synced_through = log.last_seq();
        Ok((log, records))
    }

    /// Whether the region holds nothing but zeros (never formatted).
    fn is_blank(&self) -> Result<bool, CircularError> {
        let mut chunk = vec![0u8; 4096];
        let mut offset = 0;
        while offset < self.region.size() {
            let len = (self.region.size() - offset).min(chunk.len() as u64) as usize;
            self.region.read(offset, &mut chunk[..len])?;
            if chunk[..len].iter().any(|byte| *byte != 0) {
                return Ok(false);
            }
            offset += len as u64;
        }
        Ok(true)
    }

    /// The newest valid header slot written with `magic`.
    fn read_header(&self, magic: u64) -> Result<Option<(u64, u64, u64)>, CircularError> {
        let mut best = None;
        for slot in 0..2 {
            let words: Vec<u64> =
                (0..4).map(|i| self.region.load_u64(slot * SLOT_BYTES + 8 * i)).collect::<Result<_, _>>()?;
            let crc = self.region.load_u64(slot * SLOT_BYTES + 32)? as u32;
            let words = [words[0], words[1], words[2], words[3]];
            if words[0] != magic || crc != header_crc(&words) {
                continue;
            }
            if best.is_none_or(|(counter, _, _)| words[1] > counter) {
                best = Some((words[1], words[2], words[3]));
            }
        }
        Ok(best)
    }

    /// Write the next header slot (not flushed: the caller flushes).
    fn write_header(&mut self, head: u64, head_seq: u64) -> Result<(), CircularError> {
        self.counter += 1;
        let words = [MAGIC, self.counter, head, head_seq];
        let slot = self.counter % 2;
        let mut bytes = Vec::with_capacity(40);
        for word in words {
            bytes.extend_from_slice(&word.to_le_bytes());
        }
        bytes.extend_from_slice(&(header_crc(&words) as u64).to_le_bytes());
        self.region.write(slot * SLOT_BYTES, &bytes)?;
        self.head = head;
        self.head_seq = head_seq;
        Ok(())
    }

    fn read_wrapped(&self, logical: u64, buf: &mut [u8]) -> Result<(), CircularError> {
        let start = logical % self.capacity;
        let first = (self.capacity - start).min(buf.len() as u64) as usize;
        self.region.read(DATA_OFFSET + start, &mut buf[..first])?;
        if first < buf.len() {
            self.region.read(DATA_OFFSET, &mut buf[first..])?;
        }
        Ok(())
    }

    fn write_wrapped(&mut self, logical: u64, data: &[u8]) -> Result<(), CircularError> {
        let start = logical % self.capacity;
        let first = (self.capacity - start).min(data.len() as u64) as usize;
        self.region.write(DATA_OFFSET + start, &data[..first])?;
        if first < data.len() {
            self.region.write(DATA_OFFSET, &data[first..])?;
        }
        Ok(())
    }

    /// Walk from the head; the first record that is torn or from an earlier lap ends the log.
    fn scan(&mut self) -> Result<Vec<CircularRecord>, CircularError> {
        let mut records = Vec::new();
        let mut at = self.head;
        let mut seq = self.head_seq;
        let end = self.head + self.capacity;
        // A record that is torn, from an earlier lap or never written ends the log.
        while let Some(record) = self.valid_record_at(at, |record_seq| record_seq == seq, end)? {
            at += RECORD_HEADER_BYTES + record.payload.len() as u64;
            records.push(CircularRecord { seq, payload: record.payload });
            seq += 1;
        }
        self.tail = at;
        self.next_seq = seq;
        match self.past_the_tail(at, seq)? {
            PastTheTail::Nothing => {}
            PastTheTail::SyncedRecordDamaged => self.damaged = Some(seq),
            PastTheTail::Unsynced { records, end } => {
                self.write_wrapped(at, &vec![0u8; (end - at) as usize])?;
                self.erased_after_tear = records;
            }
        }
        Ok(records)
    }

    /// The record at logical offset `at` if it is whole (its CRC matches), its sequence
    /// number passes `wanted`, and it ends by `end`.
    fn valid_record_at(
        &self,
        at: u64,
        wanted: impl Fn(u64) -> bool,
        end: u64,
    ) -> Result<Option<ValidRecord>, CircularError> {
        if at + RECORD_HEADER_BYTES > end {
            return Ok(None);
        }
        let mut header = [0u8; RECORD_HEADER_BYTES as usize];
        self.read_wrapped(at, &mut header)?;
        let len = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes"));
        let crc = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes"));
        let seq = u64::from_le_bytes(header[8..16].try_into().expect("8 bytes"));
        let synced = u64::from_le_bytes(header[16..24].try_into().expect("8 bytes"));
        if !wanted(seq) || at + RECORD_HEADER_BYTES + len as u64 > end {
            return Ok(None);
        }
        let mut payload = vec![0u8; len as usize];
        self.read_wrapped(at + RECORD_HEADER_BYTES, &mut payload)?;
        if record_crc(len, seq, synced, &payload) != crc {
            return Ok(None);
        }
        Ok(Some(ValidRecord { synced, payload }))
    }

    /// What lies past `at`, where replay stopped at sequence number `seq` (see the module
    /// docs). Records are written in order, so past an ordinary tail nothing newer is valid.
    /// Read only at start-up.
    fn past_the_tail(&self, at: u64, seq: u64) -> Result<PastTheTail, CircularError> {
        let end = self.head + self.capacity;
        let newer = |record_seq: u64| record_seq > seq && record_seq - seq < 1 << 32;
        let mut found = PastTheTail::Nothing;
        let mut probe = at + 1;
        while probe + RECORD_HEADER_BYTES <= end {
            let Some(record) = self.valid_record_at(probe, newer, end)? else {
                probe += 1;
                continue;
            };
            if record.synced >= seq {
                return Ok(PastTheTail::SyncedRecordDamaged);
            }
            probe += RECORD_HEADER_BYTES + record.payload.len() as u64;
            let records = match found {
                PastTheTail::Unsynced { records, .. } => records + 1,
                _ => 1,
            };
            found = PastTheTail::Unsynced { records, end: probe };
        }
        Ok(found)
    }

    /// The sequence number of a damaged record the replay stopped at, when a later record
    /// says it had been synced: the start must be refused rather than drop what followed it.
    pub fn damaged_record(&self) -> Option<u64> {
        self.damaged
    }

    /// How many valid records replay found (and erased) past a torn unsynced one.
    pub fn erased_after_tear(&self) -> u64 {
        self.erased_after_tear
    }

    pub fn capacity_bytes(&self) -> u64 {
        self.capacity
    }

    pub fn used_bytes(&self) -> u64 {
        self.tail - self.head
    }

    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    pub fn head_seq(&self) -> u64 {
        self.head_seq
    }

    /// Whether a record of `len` payload bytes fits without draining.
    pub fn fits(&self, len: usize) -> bool {
        self.used_bytes() + RECORD_HEADER_BYTES + len as u64 <= self.capacity
    }

    /// Append one record (not durable until [`CircularLog::flush`]). Returns its sequence
    /// number.
    pub fn append(&mut self, payload: &[u8]) -> Result<u64, CircularError> {
        let len = u32::try_from(payload.len()).map_err(|_| CircularError::TooLarge(payload.len() as u64))?;
        if RECORD_HEADER_BYTES + len as u64 > self.capacity {
            return Err(CircularError::TooLarge(len as u64));
        }
        if !self.fits(payload.len()) {
            return Err(CircularError::Full);
        }
        let seq = self.next_seq;
        let synced = self.synced_through;
        let mut header = [0u8; RECORD_HEADER_BYTES as usize];
        header[0..4].copy_from_slice(&len.to_le_bytes());
        header[4..8].copy_from_slice(&record_crc(len, seq, synced, payload).to_le_bytes());
        header[8..16].copy_from_slice(&seq.to_le_bytes());
        header[16..24].copy_from_slice(&synced.to_le_bytes());
        self.write_wrapped(self.tail, &header)?;
        self.write_wrapped(self.tail + RECORD_HEADER_BYTES, payload)?;
        self.tail += RECORD_HEADER_BYTES + len as u64;
        self.next_seq += 1;
        Ok(seq)
    }

    /// Every record between head and tail (what a drain moves to the second level).
    pub fn pending(&self) -> Result<Vec<CircularRecord>, CircularError> {
        let mut records = Vec::new();
        let mut at = self.head;
        for seq in self.head_seq..self.next_seq {
            let mut header = [0u8; RECORD_HEADER_BYTES as usize];
            self.read_wrapped(at, &mut header)?;
            let len = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes")) as u64;
            let mut payload = vec![0u8; len as usize];
            self.read_wrapped(at + RECORD_HEADER_BYTES, &mut payload)?;
            records.push(CircularRecord { seq, payload });
            at += RECORD_HEADER_BYTES + len;
        }
        debug_assert_eq!(at, self.tail);
        Ok(records)
    }

    /// Forget everything up to the tail (drained or superseded by a checkpoint), continuing
    /// with sequence number `next_seq` (never below the current one). Flushed before return.
    pub fn truncate_all(&mut self, next_seq: u64) -> Result<(), CircularError> {
        assert!(next_seq >= self.next_seq, "sequence numbers never go backwards");
        self.next_seq = next_seq;
        self.write_header(self.tail, next_seq)?;
        self.flush()
    }

    /// Forget the records before logical offset `head` (a record boundary at or before the
    /// tail), the first one kept being `head_seq`: they were drained. Flushed before return,
    /// so the space is reused only once the head's move is durable.
    pub fn release_to(&mut self, head: u64, head_seq: u64) -> Result<(), CircularError> {
        assert!(head >= self.head && head <= self.tail, "the head moves forward, up to the tail");
        assert!(head_seq >= self.head_seq && head_seq <= self.next_seq);
        self.write_header(head, head_seq)?;
        self.flush()
    }

    /// The logical offset where the next record goes.
    pub fn tail(&self) -> u64 {
        self.tail
    }

    /// Make every appended record durable.
    pub fn flush(&mut self) -> Result<(), CircularError> {
        self.region.flush()?;
        self.synced_through = self.last_seq();
        Ok(())
    }

    /// A sync of the region made by someone else (a sync thread) returned; it covered every
    /// record up to `seq`.
    pub fn mark_synced(&mut self, seq: u64) {
        self.synced_through = self.synced_through.max(seq);
    }

    /// The sequence number of the last record appended (or of the record before the first
    /// one to come).
    pub fn last_seq(&self) -> u64 {
        self.next_seq.saturating_sub(1)
    }

    /// The region, for tests that tear it.
    pub fn into_region(self) -> M {
        self.region
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chorus_region::{Region, TenantId};

    fn region(size: u64) -> Region {
        Region::volatile(TenantId(0), "circular", size).unwrap()
    }

    fn payload(i: u64) -> Vec<u8> {
        (0..(i % 300 + 1)).map(|b| (b as u8) ^ (i as u8)).collect()
    }

    #[test]
    fn records_survive_reopen_in_order() {
        let (mut log, records) = CircularLog::open(region(8192), 1).unwrap();
        assert!(records.is_empty());
        for i in 1..=5 {
            assert_eq!(log.append(&payload(i)).unwrap(), i);
        }
        log.flush().unwrap();
        let (log, records) = CircularLog::open(log.into_region(), 1).unwrap();
        assert_eq!(records.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![1, 2, 3, 4, 5]);
        assert!(records.iter().all(|r| r.payload == payload(r.seq)));
        assert_eq!(log.next_seq(), 6);
    }

    #[test]
    fn wraparound_keeps_records_straddling_the_end() {
        let (mut log, _) = CircularLog::open(region(DATA_OFFSET + 4096), 1).unwrap();
        let mut expected_first = 1;
        // Many laps: drain whenever full, so records land at every physical offset.
        for i in 1..=400u64 {
            if !log.fits(payload(i).len()) {
                let pending = log.pending().unwrap();
                assert_eq!(pending.first().unwrap().seq, expected_first);
                expected_first = i;
                log.truncate_all(i).unwrap();
            }
            log.append(&payload(i)).unwrap();
        }
        log.flush().unwrap();
        let (_, records) = CircularLog::open(log.into_region(), 1).unwrap();
        let seqs: Vec<u64> = records.iter().map(|r| r.seq).collect();
        assert_eq!(seqs, (expected_first..=400).collect::<Vec<_>>());
        assert!(records.iter().all(|r| r.payload == payload(r.seq)));
    }

    #[test]
    fn a_torn_tail_is_detected_by_the_crc() {
        let (mut log, _) = CircularLog::open(region(8192), 1).unwrap();
        for i in 1..=3 {
            log.append(&payload(i)).unwrap();
        }
        let tail_start = log.tail - (RECORD_HEADER_BYTES + payload(3).len() as u64);
        let mut region = log.into_region();
        // Tear the last record's payload: its CRC no longer matches.
        let at = DATA_OFFSET + tail_start + RECORD_HEADER_BYTES + 1;
        let byte = region.read_vec(at, 1).unwrap()[0];
        region.write(at, &[byte ^ 0xff]).unwrap();
        let (mut log, records) = CircularLog::open(region, 1).unwrap();
        assert_eq!(records.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![1, 2]);
        // The next append overwrites the torn record.
        assert_eq!(log.append(b"again").unwrap(), 3);
        let (_, records) = CircularLog::open(log.into_region(), 1).unwrap();
        assert_eq!(records.last().unwrap().payload, b"again");
    }

    #[test]
    fn records_from_an_earlier_lap_are_not_replayed() {
        let (mut log, _) = CircularLog::open(region(DATA_OFFSET + 4096), 1).unwrap();
        for i in 1..=3 {
            log.append(&payload(i)).unwrap();
        }
        // Truncate, then write less than before: the old records' bytes remain after the
        // new tail, with valid CRCs but sequence numbers from the earlier lap.
        log.truncate_all(4).unwrap();
        log.append(&payload(4)).unwrap();
        log.flush().unwrap();
        let (_, records) = CircularLog::open(log.into_region(), 1).unwrap();
        assert_eq!(records.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![4]);
    }

    #[test]
    fn a_torn_header_slot_falls_back_to_the_other() {
        let (mut log, _) = CircularLog::open(region(8192), 1).unwrap();
        log.append(b"one").unwrap();
        log.truncate_all(2).unwrap();
        log.append(b"two").unwrap();
        let slot = log.counter % 2;
        let mut region = log.into_region();
        region.write(slot * SLOT_BYTES + 16, &[0xff; 8]).unwrap(); // corrupt the newest slot
        let (_, records) = CircularLog::open(region, 1).unwrap();
        // The older header says the head is at record 1: both records are replayed, which is
        // safe (the second level skips sequence numbers it already holds).
        assert_eq!(
            records.iter().map(|r| r.payload.clone()).collect::<Vec<_>>(),
            vec![b"one".to_vec(), b"two".to_vec()]
        );
    }

    #[test]
    fn a_new_log_has_two_header_slots_and_losing_both_refuses_to_open() {
        let (mut log, _) = CircularLog::open(region(8192), 1).unwrap();
        log.append(b"record").unwrap();
        log.flush().unwrap();
        let mut region = log.into_region();
        region.write(8, &[0xff; 8]).unwrap(); // slot A's counter
        let (log, records) = CircularLog::open(region, 1).unwrap();
        assert_eq!(records.len(), 1, "slot B still holds the head");
        let mut region = log.into_region();
        region.write(SLOT_BYTES + 8, &[0xff; 8]).unwrap(); // and slot B's
        assert!(matches!(CircularLog::open(region, 1), Err(CircularError::HeaderDamaged)));
    }

    #[test]
    fn oversized_records_and_a_full_log_are_errors() {
        let (mut log, _) = CircularLog::open(region(DATA_OFFSET + 4096), 1).unwrap();
        assert!(matches!(log.append(&vec![0; 5000]), Err(CircularError::TooLarge(_))));
        while log.fits(1000) {
            log.append(&[1; 1000]).unwrap();
        }
        assert!(matches!(log.append(&[1; 1000]), Err(CircularError::Full)));
    }
}
