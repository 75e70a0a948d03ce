//! Cyclone's two-level log on disk (§2): the runtime side of durability, outside the
//! sans-I/O core.
//!
//! ```text
//! <data_dir>/raftlog/
//!   tenant-0/circular.region   level 1: the circular log, an mmap'd file (chorus-region),
//!                              flushed (msync) before the turn's messages and replies leave
//!   log                        level 2: append-only; the circular log drains into it in
//!                              batches (write + fdatasync, then the circular head moves)
//!   snapshot                   the last checkpoint: every log's state machine (keys and
//!                              session table), HardState and unapplied entries
//!   boot                       incarnation counter: this node's session client id
//! ```
//!
//! Records carry sequence numbers that only grow. A checkpoint file records the first
//! sequence number after it; writing it (to a temporary file, fsync, rename, fsync of the
//! directory) is the commit point, after which the log file is truncated and the circular
//! log emptied. Replay reads the checkpoint, then the log file's records, then the circular
//! log's, keeping each sequence number once and requiring them to be consecutive: a crash
//! between any two steps leaves either duplicates (skipped) or records older than the
//! checkpoint (skipped), never a hole.

use std::fs::{File, OpenOptions};
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};

use bytes::{Bytes, BytesMut};
use chorus_core::codec::WireMessage;
use chorus_core::{ClientRequestId, Command, NodeId, Outbox, Replica, Time, View};
pub use chorus_region::FlushBackend;
use chorus_region::{Region, RegionStore, TenantId};

use crate::circular::{CircularError, CircularLog, RECORD_HEADER_BYTES};
use crate::durable::{Checkpoint, Record, Recovered};
use crate::{Message, RaftLog, RaftLogConfig};

const SNAPSHOT_MAGIC: u64 = 0x7061_6e73_676f_6c72; // "rlogsnap"

#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },
    #[error(transparent)]
    Circular(#[from] CircularError),
    #[error("{0}: refusing to start on it")]
    Corrupt(String),
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> DiskError {
    let context = context.into();
    move |source| DiskError::Io { context, source }
}

/// How the two-level log is set up.
#[derive(Clone, Copy, Debug)]
pub struct DiskOptions {
    /// Size of the circular log's data area plus its 128-byte header.
    pub circular_bytes: u64,
    /// How the circular log is made durable: `msync` (default) or `none` (volatile).
    pub flush: FlushBackend,
}

impl Default for DiskOptions {
    fn default() -> Self {
        DiskOptions { circular_bytes: 4 << 20, flush: FlushBackend::Msync }
    }
}

/// Counters for INFO and benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskStats {
    pub records_appended: u64,
    pub flushes: u64,
    pub drains: u64,
    pub bytes_drained: u64,
    pub checkpoints: u64,
}

pub struct TwoLevelLog {
    dir: PathBuf,
    circular: CircularLog<Region>,
    file: File,
    /// The largest sequence number in the log file.
    file_last_seq: u64,
    stats: DiskStats,
}

fn frame(seq: u64, payload: &[u8], buf: &mut Vec<u8>) {
    let len = payload.len() as u32;
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&len.to_le_bytes());
    hasher.update(&seq.to_le_bytes());
    hasher.update(payload);
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(&hasher.finalize().to_le_bytes());
    buf.extend_from_slice(&seq.to_le_bytes());
    buf.extend_from_slice(payload);
}

/// The valid prefix of a log file: its records and its length. A torn last frame (a crash
/// during a drain, whose records the circular log still holds) ends it.
fn parse_log_file(bytes: &[u8]) -> (Vec<(u64, Bytes)>, usize) {
    let mut records = Vec::new();
    let mut at = 0usize;
    while bytes.len() - at >= RECORD_HEADER_BYTES as usize {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().expect("4 bytes"));
        let seq = u64::from_le_bytes(bytes[at + 8..at + 16].try_into().expect("8 bytes"));
        let start = at + RECORD_HEADER_BYTES as usize;
        if bytes.len() - start < len {
            break;
        }
        let payload = &bytes[start..start + len];
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&(len as u32).to_le_bytes());
        hasher.update(&seq.to_le_bytes());
        hasher.update(payload);
        if hasher.finalize() != crc {
            break;
        }
        records.push((seq, Bytes::copy_from_slice(payload)));
        at = start + len;
    }
    (records, at)
}

fn sync_dir(dir: &Path) -> Result<(), DiskError> {
    File::open(dir).and_then(|dir_file| dir_file.sync_all()).map_err(io(format!("fsync {}", dir.display())))
}

impl TwoLevelLog {
    /// Open (or create) the two-level log in `dir` and recover what it holds.
    pub fn open(dir: &Path, options: DiskOptions) -> Result<(TwoLevelLog, Recovered), DiskError> {
        std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
        let (checkpoint, first_seq) = read_checkpoint(&dir.join("snapshot"))?;

        let log_path = dir.join("log");
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&log_path)
            .map_err(io(format!("opening {}", log_path.display())))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(io(format!("reading {}", log_path.display())))?;
        let (file_records, valid_bytes) = parse_log_file(&bytes);
        if valid_bytes < bytes.len() {
            file.set_len(valid_bytes as u64).map_err(io(format!("truncating {}", log_path.display())))?;
            file.sync_data().map_err(io(format!("fsync {}", log_path.display())))?;
        }
        let file_last_seq = file_records.last().map_or(0, |(seq, _)| *seq);

        let store = RegionStore::open(dir, options.flush).map_err(CircularError::from)?;
        let region =
            store.register(TenantId(0), "circular", options.circular_bytes).map_err(CircularError::from)?;
        let (mut circular, circular_records) = CircularLog::open(region, first_seq.max(file_last_seq + 1))?;

        // Keep every sequence number from the checkpoint on, once, in order.
        let mut expected = first_seq;
        let mut records = Vec::new();
        let all = file_records
            .into_iter()
            .chain(circular_records.into_iter().map(|record| (record.seq, Bytes::from(record.payload))));
        for (seq, payload) in all {
            if seq < expected {
                continue; // superseded by the checkpoint, or drained twice
            }
            if seq > expected {
                return Err(DiskError::Corrupt(format!(
                    "{}: record {expected} is missing (next found: {seq})",
                    dir.display()
                )));
            }
            let record = Record::decode_exact(payload)
                .map_err(|error| DiskError::Corrupt(format!("{}: record {seq}: {error}", dir.display())))?;
            records.push(record);
            expected += 1;
        }
        // Appends continue after everything recovered (a checkpoint may be ahead of a
        // circular log whose reset the crash interrupted).
        if circular.next_seq() < expected {
            circular.truncate_all(expected)?;
        }
        let log = TwoLevelLog {
            dir: dir.to_path_buf(),
            circular,
            file,
            file_last_seq,
            stats: DiskStats::default(),
        };
        Ok((log, Recovered { checkpoint, records }))
    }

    pub fn stats(&self) -> DiskStats {
        self.stats
    }

    /// Make `records` durable, in order; returns once they are (the circular log flushed,
    /// or a checkpoint file renamed into place).
    pub fn persist(&mut self, records: &[Record]) -> Result<(), DiskError> {
        if records.is_empty() {
            return Ok(());
        }
        let mut buf = BytesMut::new();
        for record in records {
            if let Record::Checkpoint(checkpoint) = record {
                self.checkpoint(checkpoint)?;
                continue;
            }
            buf.clear();
            record.encode(&mut buf);
            self.append(&buf)?;
            self.stats.records_appended += 1;
        }
        self.circular.flush()?;
        self.stats.flushes += 1;
        // Cyclone drains in batches: once half full, everything goes to the file at once.
        if self.circular.used_bytes() > self.circular.capacity_bytes() / 2 {
            self.drain()?;
        }
        Ok(())
    }

    fn append(&mut self, payload: &[u8]) -> Result<(), DiskError> {
        if RECORD_HEADER_BYTES + payload.len() as u64 > self.circular.capacity_bytes() / 2 {
            // Too big for the small log: straight to the file, in sequence.
            self.drain()?;
            let seq = self.circular.next_seq();
            let mut bytes = Vec::with_capacity(payload.len() + RECORD_HEADER_BYTES as usize);
            frame(seq, payload, &mut bytes);
            self.write_file(&bytes)?;
            self.file_last_seq = seq;
            self.circular.truncate_all(seq + 1)?;
            return Ok(());
        }
        if !self.circular.fits(payload.len()) {
            self.drain()?;
        }
        self.circular.append(payload)?;
        Ok(())
    }

    fn write_file(&mut self, bytes: &[u8]) -> Result<(), DiskError> {
        let path = self.dir.join("log");
        self.file.write_all(bytes).map_err(io(format!("appending to {}", path.display())))?;
        self.file.sync_data().map_err(io(format!("fsync {}", path.display())))
    }

    /// Move every record of the circular log to the log file, then empty the circular log.
    pub fn drain(&mut self) -> Result<(), DiskError> {
        let pending = self.circular.pending()?;
        let mut bytes = Vec::new();
        let mut last = self.file_last_seq;
        for record in pending.iter().filter(|record| record.seq > self.file_last_seq) {
            frame(record.seq, &record.payload, &mut bytes);
            last = record.seq;
        }
        if !bytes.is_empty() {
            self.write_file(&bytes)?;
            self.stats.drains += 1;
            self.stats.bytes_drained += bytes.len() as u64;
        }
        self.file_last_seq = last;
        self.circular.truncate_all(self.circular.next_seq())?;
        Ok(())
    }

    fn checkpoint(&mut self, checkpoint: &Checkpoint) -> Result<(), DiskError> {
        let next_seq = self.circular.next_seq();
        let mut payload = BytesMut::new();
        checkpoint.encode(&mut payload);
        let mut bytes = Vec::with_capacity(payload.len() + 24);
        bytes.extend_from_slice(&SNAPSHOT_MAGIC.to_le_bytes());
        frame(next_seq, &payload, &mut bytes);
        let path = self.dir.join("snapshot");
        let tmp = self.dir.join("snapshot.tmp");
        let mut file = File::create(&tmp).map_err(io(format!("creating {}", tmp.display())))?;
        file.write_all(&bytes)
            .and_then(|()| file.sync_all())
            .map_err(io(format!("writing {}", tmp.display())))?;
        std::fs::rename(&tmp, &path).map_err(io(format!("renaming {}", tmp.display())))?;
        sync_dir(&self.dir)?;
        // The checkpoint is in place: both levels of the log may go.
        let log_path = self.dir.join("log");
        self.file.set_len(0).map_err(io(format!("truncating {}", log_path.display())))?;
        self.file.sync_data().map_err(io(format!("fsync {}", log_path.display())))?;
        self.file_last_seq = next_seq.saturating_sub(1);
        self.circular.truncate_all(next_seq)?;
        self.stats.checkpoints += 1;
        Ok(())
    }
}

/// The checkpoint and the sequence number of the first record after it (1 without one).
fn read_checkpoint(path: &Path) -> Result<(Option<Checkpoint>, u64), DiskError> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok((None, 1)),
        Err(error) => return Err(io(format!("reading {}", path.display()))(error)),
    };
    let corrupt = |what: &str| DiskError::Corrupt(format!("{}: {what}", path.display()));
    if bytes.len() < 8 || bytes[..8] != SNAPSHOT_MAGIC.to_le_bytes() {
        return Err(corrupt("not a raftlog snapshot"));
    }
    let (records, valid) = parse_log_file(&bytes[8..]);
    if records.len() != 1 || valid != bytes.len() - 8 {
        return Err(corrupt("damaged (checksum or length)"));
    }
    let (next_seq, payload) = records.into_iter().next().expect("one record");
    let checkpoint = Checkpoint::decode_exact(payload).map_err(|error| corrupt(&error.to_string()))?;
    Ok((Some(checkpoint), next_seq))
}

/// Read, increment and durably store this node's incarnation counter.
fn next_boot(dir: &Path) -> Result<u64, DiskError> {
    let path = dir.join("boot");
    let boot = match std::fs::read_to_string(&path) {
        Ok(text) => text
            .trim()
            .parse::<u64>()
            .map_err(|_| DiskError::Corrupt(format!("{}: not a number", path.display())))?,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => 0,
        Err(error) => return Err(io(format!("reading {}", path.display()))(error)),
    } + 1;
    let tmp = dir.join("boot.tmp");
    let mut file = File::create(&tmp).map_err(io(format!("creating {}", tmp.display())))?;
    file.write_all(format!("{boot}\n").as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(io(format!("writing {}", tmp.display())))?;
    std::fs::rename(&tmp, &path).map_err(io(format!("renaming {}", tmp.display())))?;
    sync_dir(dir)?;
    Ok(boot)
}

/// A raftlog replica with its two-level log: the core plus the I/O that makes its Raft
/// state durable. The runtime calls [`DurableRaftLog::persist`] after every turn, before it
/// sends the turn's messages and replies.
pub struct DurableRaftLog {
    core: RaftLog,
    disk: Option<TwoLevelLog>,
    boot: u64,
}

impl DurableRaftLog {
    /// A replica without a data directory: nothing survives a restart, so a restarted node
    /// must not rejoin under its old id.
    pub fn in_memory(config: RaftLogConfig) -> DurableRaftLog {
        DurableRaftLog { core: RaftLog::new(config), disk: None, boot: 0 }
    }

    /// Open `dir` (created if missing) and restore the replica the previous incarnation
    /// left there; the node rejoins under its old id.
    pub fn open(
        mut config: RaftLogConfig,
        dir: &Path,
        options: DiskOptions,
    ) -> Result<DurableRaftLog, DiskError> {
        std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
        let boot = next_boot(dir)?;
        // One at-most-once session per incarnation: the previous one may have batches in
        // flight under sequence numbers this one would reuse.
        config.session_client_id = ((config.me.0 as u64) << 40) | boot;
        config.durable = true;
        let (disk, recovered) = TwoLevelLog::open(dir, options)?;
        let core = RaftLog::restore(config, recovered)
            .map_err(|error| DiskError::Corrupt(format!("{}: {error}", dir.display())))?;
        Ok(DurableRaftLog { core, disk: Some(disk), boot })
    }

    pub fn core(&self) -> &RaftLog {
        &self.core
    }

    pub fn core_mut(&mut self) -> &mut RaftLog {
        &mut self.core
    }

    /// This node's incarnation (1 for the first start with this data directory; 0 without one).
    pub fn boot(&self) -> u64 {
        self.boot
    }

    pub fn disk_stats(&self) -> DiskStats {
        self.disk.as_ref().map(TwoLevelLog::stats).unwrap_or_default()
    }

    /// Make the core's durable records of the last calls stable.
    pub fn persist(&mut self) -> Result<(), DiskError> {
        let records = self.core.take_durable();
        match &mut self.disk {
            Some(disk) => disk.persist(&records),
            None => Ok(()),
        }
    }
}

impl Replica for DurableRaftLog {
    type Message = Message;

    fn id(&self) -> NodeId {
        self.core.id()
    }

    fn on_client(
        &mut self,
        now: Time,
        request: ClientRequestId,
        command: Command,
        out: &mut Outbox<Message>,
    ) {
        self.core.on_client(now, request, command, out);
    }

    fn on_message(&mut self, now: Time, from: NodeId, message: Message, out: &mut Outbox<Message>) {
        self.core.on_message(now, from, message, out);
    }

    fn on_tick(&mut self, now: Time, out: &mut Outbox<Message>) {
        self.core.on_tick(now, out);
    }

    fn on_view(&mut self, now: Time, view: View, out: &mut Outbox<Message>) {
        self.core.on_view(now, view, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::durable::LogCheckpoint;
    use raft::prelude::Entry;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("raftlog-disk-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn small() -> DiskOptions {
        DiskOptions { circular_bytes: 128 + 4096, flush: FlushBackend::Msync }
    }

    fn entries(log: u32, from: u64, count: u64, size: usize) -> Record {
        Record::Entries {
            log,
            entries: (from..from + count)
                .map(|index| Entry {
                    index,
                    term: 1,
                    data: Bytes::from(vec![index as u8; size]),
                    ..Default::default()
                })
                .collect(),
        }
    }

    #[test]
    fn records_replay_across_both_levels_in_order() {
        let dir = temp_dir("replay");
        let (mut log, recovered) = TwoLevelLog::open(&dir, small()).unwrap();
        assert!(recovered.is_empty());
        let mut written = Vec::new();
        for i in 0..60u64 {
            // Some records go to the circular log, large ones straight to the file; the
            // circular log drains many times over.
            let record = entries((i % 3) as u32, i + 1, 1, if i % 17 == 0 { 3000 } else { 100 });
            log.persist(std::slice::from_ref(&record)).unwrap();
            written.push(record);
        }
        assert!(log.stats().drains >= 3, "{:?}", log.stats());
        drop(log);
        let (_, recovered) = TwoLevelLog::open(&dir, small()).unwrap();
        assert_eq!(recovered.records, written);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_checkpoint_truncates_both_levels() {
        let dir = temp_dir("checkpoint");
        let (mut log, _) = TwoLevelLog::open(&dir, small()).unwrap();
        for i in 0..20 {
            log.persist(&[entries(0, i + 1, 1, 300)]).unwrap();
        }
        let checkpoint = Checkpoint {
            logs: vec![LogCheckpoint {
                snapshot_index: 20,
                snapshot_term: 1,
                commit: 20,
                term: 1,
                ..Default::default()
            }],
        };
        let after = Record::HardState { log: 0, term: 2, vote: 1, commit: 20 };
        log.persist(&[Record::Checkpoint(checkpoint.clone()), after.clone()]).unwrap();
        assert_eq!(std::fs::metadata(dir.join("log")).unwrap().len(), 0);
        drop(log);
        let (_, recovered) = TwoLevelLog::open(&dir, small()).unwrap();
        assert_eq!(recovered.checkpoint, Some(checkpoint));
        assert_eq!(recovered.records, vec![after]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_torn_log_file_tail_is_cut_and_the_circular_copy_used() {
        let dir = temp_dir("torn");
        let (mut log, _) = TwoLevelLog::open(&dir, small()).unwrap();
        let records: Vec<Record> = (0..5).map(|i| entries(0, i + 1, 1, 100)).collect();
        log.persist(&records[..3]).unwrap();
        log.drain().unwrap();
        log.persist(&records[3..]).unwrap();
        drop(log);
        // A crash in the middle of a later drain: half a frame at the end of the file.
        let mut file = OpenOptions::new().append(true).open(dir.join("log")).unwrap();
        file.write_all(&[7, 0, 0, 0, 1, 2]).unwrap();
        drop(file);
        let (_, recovered) = TwoLevelLog::open(&dir, small()).unwrap();
        assert_eq!(recovered.records, records);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_damaged_snapshot_refuses_to_start() {
        let dir = temp_dir("damaged");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("snapshot"), b"garbage!garbage").unwrap();
        assert!(matches!(TwoLevelLog::open(&dir, small()), Err(DiskError::Corrupt(_))));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
