//! The simulator's disk: files in memory, with exactly what was synced remembered apart.
//!
//! Fault model (docs/testing.md, "Fault model"):
//! * a crash ([`SimDisk::crash`]) keeps every synced byte; each file's unsynced writes are
//!   lost, kept, or torn: written back in file order up to an arbitrary byte and not beyond
//!   (a truncation not yet synced survives only if the tear got past it);
//! * [`SimDisk::corrupt`] flips one byte of synced data (a latent sector error), sparing the
//!   last [`SPARED_WRITES`] writes synced to a file written in place or appended, and every
//!   write of its last sync: with one copy, a damaged newest record cannot be told from one
//!   torn at a crash (a crash during a sync writes its pages back in any order, so any record
//!   of the sync may be the torn one), so logs treat both as torn, and a node that lost the
//!   newest records it acknowledged could break consensus
//!   (protocol-aware recovery, Alagappan et al., FAST 2018, repairs it from the peers; Chorus
//!   does not). The model does not pretend otherwise. Checksums must catch everything else.

use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex};

use crate::Storage;

/// The unit a disk writes atomically; tears and corruption are counted in these.
pub const SECTOR_BYTES: usize = 512;

/// The newest synced writes of a file that corruption spares (a record's header and payload,
/// and a header slot moved after it).
pub const SPARED_WRITES: usize = 4;

/// A handle to one node's simulated disk; clones share it.
#[derive(Clone, Default)]
pub struct SimDisk {
    state: Arc<Mutex<BTreeMap<String, SimFile>>>,
}

impl std::fmt::Debug for SimDisk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let files = self.lock();
        f.debug_map()
            .entries(files.iter().map(|(name, file)| (name, (file.current.len(), file.durable.len()))))
            .finish()
    }
}

#[derive(Clone, Debug, Default)]
struct SimFile {
    current: Vec<u8>,
    durable: Vec<u8>,
    /// Replaced whole (checksummed, atomic): every byte may be corrupted. Otherwise the last
    /// write synced is spared (see the module docs).
    replaced: bool,
    /// Writes since the last sync, and the newest synced ones.
    unsynced_writes: Vec<(usize, usize)>,
    synced_writes: std::collections::VecDeque<(usize, usize)>,
    /// The writes the last sync that had any made durable.
    last_sync_writes: Vec<(usize, usize)>,
}

/// What a crash did to a disk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CrashReport {
    /// Files whose unsynced writes were all lost.
    pub files_lost: u64,
    /// Files whose unsynced writes were torn: written back partway.
    pub files_torn: u64,
}

/// SplitMix64, so this crate needs no RNG and a seed always does the same thing.
struct Draw(u64);

impl Draw {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, bound: u64) -> u64 {
        ((self.next() as u128 * bound.max(1) as u128) >> 64) as u64
    }
}

impl SimDisk {
    pub fn new() -> SimDisk {
        SimDisk::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, SimFile>> {
        self.state.lock().expect("sim disk lock")
    }

    /// Bytes written and not yet synced, over every file.
    pub fn unsynced_files(&self) -> usize {
        self.lock().values().filter(|file| file.current != file.durable).count()
    }

    /// A crash: what each file keeps of its unsynced writes, drawn from `seed`.
    pub fn crash(&self, seed: u64) -> CrashReport {
        let mut draw = Draw(seed);
        let mut report = CrashReport::default();
        for file in self.lock().values_mut() {
            if file.current == file.durable {
                continue;
            }
            match draw.below(3) {
                0 => {
                    file.current = file.durable.clone();
                    report.files_lost += 1;
                }
                1 => {} // Written back in full just before the crash.
                _ => {
                    tear(file, &mut draw);
                    report.files_torn += 1;
                }
            }
            file.durable = file.current.clone();
            // What the crash kept of them is now the newest durable data, as ambiguous as
            // a last sync's (the restarted node builds on it).
            file.last_sync_writes = std::mem::take(&mut file.unsynced_writes);
        }
        report
    }

    /// Flip one byte of synced data somewhere on the disk (see the module docs for what is
    /// spared). Returns the file it hit, if any byte was eligible.
    pub fn corrupt(&self, seed: u64) -> Option<String> {
        let mut draw = Draw(seed ^ 0xC0DE);
        let mut files = self.lock();
        let candidates: Vec<(String, Vec<usize>)> = files
            .iter()
            .filter_map(|(name, file)| {
                let spared: Vec<(usize, usize)> = if file.replaced {
                    Vec::new()
                } else {
                    file.synced_writes.iter().chain(&file.last_sync_writes).copied().collect()
                };
                let eligible: Vec<usize> = (0..file.durable.len().div_ceil(SECTOR_BYTES))
                    .filter(|sector| {
                        let (start, end) = (sector * SECTOR_BYTES, (sector + 1) * SECTOR_BYTES);
                        spared.iter().all(|&(from, to)| end <= from || start >= to)
                    })
                    .collect();
                (!eligible.is_empty()).then(|| (name.clone(), eligible))
            })
            .collect();
        if candidates.is_empty() {
            return None;
        }
        let (name, sectors) = &candidates[draw.below(candidates.len() as u64) as usize];
        let sector = sectors[draw.below(sectors.len() as u64) as usize];
        let file = files.get_mut(name).expect("candidate exists");
        let end = ((sector + 1) * SECTOR_BYTES).min(file.durable.len());
        let at = sector * SECTOR_BYTES + draw.below((end - sector * SECTOR_BYTES) as u64) as usize;
        let flip = 1u8 << draw.below(8);
        file.durable[at] ^= flip;
        if at < file.current.len() {
            file.current[at] ^= flip;
        }
        Some(name.clone())
    }
}

/// Write the unsynced part back in file order up to a random byte, the rest as it was.
fn tear(file: &mut SimFile, draw: &mut Draw) {
    let (current, durable) = (&file.current, &file.durable);
    let longest = current.len().max(durable.len());
    let first_difference =
        (0..longest).find(|&at| current.get(at) != durable.get(at)).expect("the file has unsynced writes");
    let cut = first_difference + draw.below((longest - first_difference) as u64 + 1) as usize;
    let mut kept: Vec<u8> = Vec::with_capacity(longest);
    for at in 0..longest {
        let byte = if at < cut { current.get(at) } else { durable.get(at) };
        match byte {
            Some(byte) => kept.push(*byte),
            // Past the end of the side the byte comes from: the file ends here.
            None => break,
        }
    }
    file.current = kept;
}

impl Storage for SimDisk {
    fn read(&self, name: &str) -> io::Result<Option<Vec<u8>>> {
        Ok(self.lock().get(name).map(|file| file.current.clone()))
    }

    fn append(&mut self, name: &str, data: &[u8]) -> io::Result<()> {
        let mut files = self.lock();
        let file = files.entry(name.to_string()).or_default();
        let start = file.current.len();
        file.current.extend_from_slice(data);
        file.unsynced_writes.push((start, start + data.len()));
        Ok(())
    }

    fn write_at(&mut self, name: &str, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut files = self.lock();
        let file = files.entry(name.to_string()).or_default();
        let (start, end) = (offset as usize, offset as usize + data.len());
        if file.current.len() < end {
            file.current.resize(end, 0);
        }
        file.current[start..end].copy_from_slice(data);
        file.unsynced_writes.push((start, end));
        Ok(())
    }

    fn truncate(&mut self, name: &str, len: u64) -> io::Result<()> {
        let mut files = self.lock();
        let file = files.entry(name.to_string()).or_default();
        file.current.resize(len as usize, 0);
        Ok(())
    }

    fn sync(&mut self, name: &str) -> io::Result<()> {
        let mut files = self.lock();
        let file = files.entry(name.to_string()).or_default();
        file.durable = file.current.clone();
        if !file.unsynced_writes.is_empty() {
            file.last_sync_writes.clone_from(&file.unsynced_writes);
        }
        for write in file.unsynced_writes.drain(..) {
            file.synced_writes.push_back(write);
            if file.synced_writes.len() > SPARED_WRITES {
                file.synced_writes.pop_front();
            }
        }
        Ok(())
    }

    /// Durable at once, as a rename of the directory entry is once its directory is synced.
    fn remove(&mut self, name: &str) -> io::Result<()> {
        self.lock().remove(name);
        Ok(())
    }

    fn replace(&mut self, name: &str, data: &[u8]) -> io::Result<()> {
        let mut files = self.lock();
        let file =
            SimFile { current: data.to_vec(), durable: data.to_vec(), replaced: true, ..SimFile::default() };
        files.insert(name.to_string(), file);
        Ok(())
    }

    fn describe(&self, name: &str) -> String {
        format!("sim:{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synced_bytes_survive_every_crash_and_unsynced_ones_are_lost_kept_or_torn() {
        let mut outcomes = CrashReport::default();
        let mut kept_whole = 0;
        for seed in 0..200 {
            let mut disk = SimDisk::new();
            disk.append("log", b"synced record").unwrap();
            disk.sync("log").unwrap();
            disk.append("log", b" and an unsynced one").unwrap();
            let report = disk.crash(seed);
            outcomes.files_lost += report.files_lost;
            outcomes.files_torn += report.files_torn;
            let after = disk.read("log").unwrap().unwrap();
            assert!(after.starts_with(b"synced record"), "seed {seed}: {after:?}");
            assert!(b"synced record and an unsynced one".starts_with(&after[..]), "seed {seed}: {after:?}");
            kept_whole += (after.len() == 33) as u32;
        }
        assert!(
            outcomes.files_lost > 30 && outcomes.files_torn > 30 && kept_whole > 30,
            "{outcomes:?} {kept_whole}"
        );
    }

    #[test]
    fn replaced_files_are_all_or_nothing_and_corruption_spares_the_last_synced_append() {
        let mut disk = SimDisk::new();
        disk.replace("snapshot", b"whole").unwrap();
        disk.append("log", &[1; 2 * SECTOR_BYTES]).unwrap();
        disk.sync("log").unwrap();
        for _ in 0..SPARED_WRITES {
            disk.append("log", &[2; SECTOR_BYTES / SPARED_WRITES]).unwrap();
        }
        disk.sync("log").unwrap();
        disk.crash(7);
        assert_eq!(disk.read("snapshot").unwrap().unwrap(), b"whole");
        for seed in 0..100 {
            let copy = SimDisk::new();
            copy.state.lock().unwrap().clone_from(&disk.state.lock().unwrap());
            let hit = copy.corrupt(seed).unwrap();
            let log = copy.read("log").unwrap().unwrap();
            assert_eq!(&log[2 * SECTOR_BYTES..], &[2; SECTOR_BYTES][..], "the last synced append is spared");
            assert!(hit == "snapshot" || log[..2 * SECTOR_BYTES] != [1; 2 * SECTOR_BYTES][..]);
        }
    }

    #[test]
    fn corruption_spares_every_write_of_the_last_sync() {
        let mut disk = SimDisk::new();
        disk.write_at("circular", 0, &[1; 4 * SECTOR_BYTES]).unwrap();
        disk.sync("circular").unwrap();
        let batch = 2 * SPARED_WRITES;
        for write in 0..batch {
            disk.write_at("circular", ((4 + write) * SECTOR_BYTES) as u64, &[2; SECTOR_BYTES]).unwrap();
        }
        disk.sync("circular").unwrap();
        let mut older_hit = false;
        for seed in 0..100 {
            let copy = SimDisk::new();
            copy.state.lock().unwrap().clone_from(&disk.state.lock().unwrap());
            copy.corrupt(seed).unwrap();
            let bytes = copy.read("circular").unwrap().unwrap();
            assert!(bytes[4 * SECTOR_BYTES..].iter().all(|byte| *byte == 2), "seed {seed} hit the last sync");
            older_hit |= bytes[..4 * SECTOR_BYTES] != [1; 4 * SECTOR_BYTES][..];
        }
        assert!(older_hit, "older synced data is still corrupted");
    }
}
