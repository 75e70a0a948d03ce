//! Cyclone's two-level log on disk (§2): the runtime side of durability, outside the
//! sans-I/O core.
//!
//! ```text
//! <data_dir>/raftlog/
//!   tenant-0/circular.region   level 1: the circular log, an mmap'd file (chorus-region),
//!                              flushed (msync) before the turn's messages and replies leave
//!   log, log.1                 level 2: append-only; the circular log drains into one of
//!                              them in batches (write + fdatasync on the drain thread, then
//!                              the circular head moves); a checkpoint switches to the other
//!   snapshot                   the last checkpoint: every log's state machine (keys and
//!                              session table), HardState and unapplied entries
//!   boot                       incarnation counter: this node's session client id
//! ```
//!
//! Every file goes through a [`chorus_storage::Storage`] and the circular log through a
//! `RegionMemory`: real files and an mmap'd region in production, the simulator's disk (which
//! loses, tears and corrupts what was not synced) in the swarms, and a crash-test storage
//! that keeps unsynced writes in the process's memory in process-level crash tests.
//!
//! Records carry sequence numbers that only grow. A checkpoint file records the first
//! sequence number after it; writing it (to a temporary file, fsync, rename, fsync of the
//! directory) is the commit point. **Checkpoints are written off the event loop**: at a
//! checkpoint the drains switch to the other log file (empty), and a writer thread encodes
//! the checkpoint (the core handed it copy-on-write images of the state, see
//! `state::StateImage`), writes and renames it, and only then empties the file the drains
//! left, whose records all precede the checkpoint. The loop goes on meanwhile; everything
//! it persists stays in the two log levels, so a crash before the rename recovers from the
//! previous checkpoint and both files. One checkpoint is in flight at a time (a second one
//! waits for it: backpressure), and a checkpoint that records a snapshot installed from the
//! leader is waited for, since the turn's messages acknowledge it. Replay reads the
//! checkpoint, then the two log files' records (older file first), then the circular log's,
//! keeping each sequence number once and requiring them to be consecutive: a crash between
//! any two steps leaves either duplicates (skipped) or records older than the checkpoint
//! (skipped), never a hole. The circular log's header says which records were
//! drained (durably) to the file, so the file must reach that far; a damaged record there, or
//! in the middle of the circular log, refuses the start instead of silently dropping what
//! followed it.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use chorus_core::codec::WireMessage;
use chorus_core::{ClientRequestId, Command, NodeId, Outbox, Replica, Time, View};
pub use chorus_region::FlushBackend;
use chorus_region::{RegionMemory, RegionStore, TenantId};
use chorus_storage::{CrashTestStorage, FileStorage, Storage, StorageRegion};

use crate::circular::{CircularError, CircularLog, RECORD_HEADER_BYTES};
use crate::durable::{Checkpoint, Record, Recovered};
use crate::{Message, RaftLog, RaftLogConfig};

const SNAPSHOT_MAGIC: u64 = 0x7061_6e73_676f_6c72; // "rlogsnap"
/// The two log files: drains go to one, a checkpoint switches them to the other.
const LOGS: [&str; 2] = ["log", "log.1"];
#[cfg(test)]
const LOG: &str = LOGS[0];
const SNAPSHOT: &str = "snapshot";
const BOOT: &str = "boot";
const IDENTITY: &str = "identity";
/// The on-disk format this build writes and reads (`FORMAT_VERSION`): `"raftlog-format N CRC\n"`.
const FORMAT: &str = "format";
/// Raise this whenever the encoding of a record, a checkpoint or a state image changes
/// (`durable.rs`, `state.rs`): a directory written under another number is refused at
/// start with a message saying so, instead of failing to decode somewhere in the middle.
/// 1: the formats as of session 24 (transaction steps that name their coordinator).
pub const FORMAT_VERSION: u32 = 1;
const CIRCULAR: &str = "circular.region";
/// The checkpoint writer's nice value (docs/benchmarks.md, "Durable raftlog against etcd").
const CHECKPOINT_NICE: i32 = 10;
/// A log file's record frame: `len u32, crc32 u32, seq u64`, then the payload.
const FRAME_HEADER_BYTES: usize = 16;

/// The storage a two-level log uses for its files.
pub type BoxedStorage = Box<dyn Storage + Send>;
/// The memory its circular log lives in.
pub type BoxedRegion = Box<dyn RegionMemory + Send>;

#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },
    #[error(transparent)]
    Circular(#[from] CircularError),
    #[error("{0}: refusing to start on it")]
    Corrupt(String),
    #[error("{path} says its raftlog data is in format {found}, and this build reads format {FORMAT_VERSION} only: refusing to start on it (start the build that wrote it, or replace this node with an empty data directory and --join)")]
    Format { path: String, found: u32 },
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> DiskError {
    let context = context.into();
    move |source| DiskError::Io { context, source }
}

/// Where the two-level log's files live.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StorageKind {
    /// Real files, the circular log in an mmap'd region.
    #[default]
    Files,
    /// For process-level crash tests only: real files, but every write waits in the
    /// process's memory until synced, and the circular log is a file of the same storage, so
    /// killing the process loses exactly the unsynced writes (docs/testing.md).
    CrashTest,
}

/// How the two-level log is set up.
#[derive(Clone, Copy, Debug)]
pub struct DiskOptions {
    /// Size of the circular log's data area plus its 128-byte header.
    pub circular_bytes: u64,
    /// How the circular log is made durable: `msync` (default) or `none` (volatile).
    pub flush: FlushBackend,
    pub storage: StorageKind,
    /// Checkpoints are written by a thread of their own (the server), or in the call that
    /// hands them over (the simulator, which must stay deterministic).
    pub checkpoint_thread: bool,
    /// Broken variant `Bug::AckBeforeSync`: sync only every this many turns, while every
    /// turn's messages and replies leave at once. 1 (correct): every turn.
    pub sync_every_turns: u32,
    /// Where a runtime syncs the circular log (`raftlog_sync`).
    pub sync: SyncPlace,
    /// Benchmarks only (`raftlog_emulated_sync_delay_us`): wait this long after every sync
    /// of the circular log, as a slower disk would. Zero otherwise.
    pub emulated_sync_delay: Duration,
}

/// Where the circular log's syncs run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SyncPlace {
    /// In the event loop, which waits for each.
    Loop,
    /// On a [`SyncThread`], while the loop goes on.
    Thread,
    /// On the thread while syncs take [`SYNC_THREAD_FROM`] or more on average, else in the
    /// loop (the default).
    #[default]
    Auto,
}

/// With [`SyncPlace::Auto`], syncs this slow on average go to the sync thread. Handing a sync
/// over costs two wake-ups (the thread's, then the loop's); measured here with a 55 us
/// `fdatasync`, handing every one over cost a quarter of the SETs at 64 clients
/// (docs/benchmarks.md, "Syncs off the loop").
pub const SYNC_THREAD_FROM: Duration = Duration::from_micros(300);

impl Default for DiskOptions {
    fn default() -> Self {
        DiskOptions {
            circular_bytes: 4 << 20,
            flush: FlushBackend::Msync,
            storage: StorageKind::Files,
            checkpoint_thread: true,
            sync_every_turns: 1,
            sync: SyncPlace::Auto,
            emulated_sync_delay: Duration::ZERO,
        }
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
    /// Records the start found past a torn unsynced one in the circular log, and erased (a
    /// power loss during a flush; see `circular`).
    pub records_erased_after_tear: u64,
}

pub struct TwoLevelLog {
    storage: BoxedStorage,
    circular: CircularLog<BoxedRegion>,
    /// The largest sequence number in the log files.
    file_last_seq: u64,
    /// Which of `LOGS` drains go to. The other is empty, or holds records that only a
    /// checkpoint in flight makes obsolete.
    current: usize,
    /// The other file holds records no durable checkpoint covers (recovery found a
    /// checkpoint that never completed): the next checkpoint cannot switch to it, so it is
    /// written in the loop and empties both files.
    other_needed: bool,
    /// The checkpoint writer thread (None: checkpoints are written inline).
    writer: Option<Worker<CheckpointJob>>,
    /// A checkpoint was handed to the writer and is not done yet.
    in_flight: bool,
    /// The drain thread (None: drains are written inline, in the caller's turn).
    drainer: Option<Worker<DrainJob>>,
    /// A drain handed to the drain thread and not done yet.
    draining: Option<DrainInFlight>,
    stats: DiskStats,
    sync_every_turns: u32,
    turns_unsynced: u32,
    /// [`DiskOptions::sync`].
    sync: SyncPlace,
    /// [`DiskOptions::emulated_sync_delay`].
    emulated_sync_delay: Duration,
    /// What a [`SyncThread`] would sync (real storage only; taken when one starts).
    sync_target: Option<SyncTarget>,
}

/// A checkpoint to write, and the log file it makes obsolete.
struct CheckpointJob {
    checkpoint: Checkpoint,
    /// The sequence number of the first record after it.
    next_seq: u64,
    obsolete: &'static str,
}

/// The checkpoint file's bytes: the magic, then one framed record whose sequence number is
/// the first record after the checkpoint. Encoding the state images happens here.
fn checkpoint_file(checkpoint: &Checkpoint, next_seq: u64) -> Vec<u8> {
    let mut payload = BytesMut::new();
    checkpoint.encode(&mut payload);
    let mut bytes = Vec::with_capacity(payload.len() + 24);
    bytes.extend_from_slice(&SNAPSHOT_MAGIC.to_le_bytes());
    frame(next_seq, &payload, &mut bytes);
    bytes
}

/// Write the checkpoint into place (the commit point), then empty the log file it made
/// obsolete. Runs on the writer thread, or inline.
fn write_checkpoint(storage: &mut (dyn Storage + Send), job: &CheckpointJob) -> Result<(), DiskError> {
    let bytes = checkpoint_file(&job.checkpoint, job.next_seq);
    let describe = storage.describe(SNAPSHOT);
    storage.replace(SNAPSHOT, &bytes).map_err(io(format!("writing {describe}")))?;
    let log = storage.describe(job.obsolete);
    storage.truncate(job.obsolete, 0).map_err(io(format!("truncating {log}")))?;
    storage.sync(job.obsolete).map_err(io(format!("fsync {log}")))
}

/// A thread that does one kind of write job for the log (checkpoints, drains) in order, with
/// a storage handle of its own on the same files, and reports each job's result.
struct Worker<J> {
    jobs: Option<mpsc::Sender<J>>,
    done: mpsc::Receiver<Result<(), DiskError>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The thread's name, for errors.
    name: &'static str,
}

impl<J: Send + 'static> Worker<J> {
    /// Start the thread; `nice` above 0 lowers its scheduling priority (Linux's per-thread
    /// nice value), so that on a busy machine it takes CPU from the event loops last.
    fn start(
        name: &'static str,
        nice: i32,
        mut storage: BoxedStorage,
        work: fn(&mut (dyn Storage + Send), &J) -> Result<(), DiskError>,
    ) -> Result<Worker<J>, DiskError> {
        let (jobs, pending) = mpsc::channel::<J>();
        let (report, done) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                if nice > 0 {
                    lower_this_threads_priority(nice);
                }
                for job in pending {
                    if report.send(work(storage.as_mut(), &job)).is_err() {
                        return; // the log was dropped
                    }
                }
            })
            .map_err(io(format!("starting the {name} thread")))?;
        Ok(Worker { jobs: Some(jobs), done, thread: Some(thread), name })
    }

    fn send(&self, job: J) -> Result<(), DiskError> {
        let jobs = self.jobs.as_ref().expect("the worker is running");
        jobs.send(job).map_err(|_| self.gone())
    }

    /// The next job's result, waiting for it.
    fn wait(&self) -> Result<(), DiskError> {
        self.done.recv().map_err(|_| self.gone())?
    }

    /// The next job's result if it is in.
    fn poll(&self) -> Option<Result<(), DiskError>> {
        match self.done.try_recv() {
            Ok(result) => Some(result),
            Err(mpsc::TryRecvError::Empty) => None,
            Err(mpsc::TryRecvError::Disconnected) => Some(Err(self.gone())),
        }
    }

    fn gone(&self) -> DiskError {
        DiskError::Io {
            context: format!("the {} thread", self.name),
            source: std::io::Error::other("it stopped"),
        }
    }
}

impl<J> Drop for Worker<J> {
    /// Let the job in flight finish: a half-written checkpoint or drain is harmless (the
    /// rename is a checkpoint's commit point; a drain's records stay in the circular log
    /// until it is done), but a finished one saves the next start a longer replay.
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Set the calling thread's nice value (Linux: nice is per thread; `who` 0 is the caller).
/// Best effort: a refusal leaves the thread at its priority, which is only slower.
fn lower_this_threads_priority(nice: i32) {
    // SAFETY: setpriority takes plain integers and has no memory effects.
    let _ = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) };
}

/// Records framed for a log file, and the circular log's state once they are in it durably.
struct DrainJob {
    file: &'static str,
    bytes: Vec<u8>,
}

/// Where the circular log's head moves once a drain in flight is durable.
#[derive(Clone, Copy)]
struct DrainInFlight {
    /// The logical offset and sequence number after the last record drained.
    head: u64,
    head_seq: u64,
}

/// Append a drain's records to its log file and fsync it. Runs on the drain thread.
fn write_drain(storage: &mut (dyn Storage + Send), job: &DrainJob) -> Result<(), DiskError> {
    let describe = storage.describe(job.file);
    storage.append(job.file, &job.bytes).map_err(io(format!("appending to {describe}")))?;
    storage.sync(job.file).map_err(io(format!("fsync {describe}")))
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
    while bytes.len() - at >= FRAME_HEADER_BYTES {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().expect("4 bytes"));
        let seq = u64::from_le_bytes(bytes[at + 8..at + 16].try_into().expect("8 bytes"));
        let start = at + FRAME_HEADER_BYTES;
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

/// The storage and circular-log region `options` ask for, in `dir`, a second handle on the
/// storage for the checkpoint writer thread, and what a [`SyncThread`] would sync.
fn open_storage(dir: &Path, options: DiskOptions) -> Result<OpenedStorage, DiskError> {
    let opening = || io(format!("opening {}", dir.display()));
    match options.storage {
        StorageKind::Files => {
            let storage = FileStorage::open(dir).map_err(opening())?;
            let writer = FileStorage::open(dir).map_err(opening())?;
            let drainer = FileStorage::open(dir).map_err(opening())?;
            let store = RegionStore::open(dir, options.flush).map_err(CircularError::from)?;
            let region = store
                .register(TenantId(0), "circular", options.circular_bytes)
                .map_err(CircularError::from)?;
            // An fdatasync of the mapped file writes back the same page cache as an msync
            // of the mapping (on Linux both are vfs_fsync_range); without msync there is
            // nothing to sync.
            let sync = match (options.flush, region.path()) {
                (FlushBackend::Msync, Some(path)) => {
                    let file =
                        std::fs::File::open(path).map_err(io(format!("opening {}", path.display())))?;
                    let sync: SyncAction = Box::new(move || file.sync_data());
                    Some(SyncTarget { describe: format!("fdatasync of {}", path.display()), sync })
                }
                _ => None,
            };
            Ok(OpenedStorage {
                storage: Box::new(storage),
                region: Box::new(region),
                writer: Box::new(writer),
                drainer: Box::new(drainer),
                sync,
            })
        }
        StorageKind::CrashTest => {
            let storage = CrashTestStorage::open(dir).map_err(opening())?;
            let region = StorageRegion::open(storage.clone(), CIRCULAR, options.circular_bytes)
                .map_err(CircularError::from)?;
            let mut syncing = storage.clone();
            let sync: SyncAction = Box::new(move || syncing.sync(CIRCULAR));
            Ok(OpenedStorage {
                storage: Box::new(storage.clone()),
                region: Box::new(region),
                writer: Box::new(storage.clone()),
                drainer: Box::new(storage),
                sync: Some(SyncTarget { describe: format!("sync of crash-test {CIRCULAR}"), sync }),
            })
        }
    }
}

struct OpenedStorage {
    storage: BoxedStorage,
    region: BoxedRegion,
    writer: BoxedStorage,
    drainer: BoxedStorage,
    sync: Option<SyncTarget>,
}

/// What a [`SyncThread`] runs to make every write to the circular log so far durable.
type SyncAction = Box<dyn FnMut() -> std::io::Result<()> + Send>;

/// A [`SyncAction`], and what it syncs (for errors).
pub struct SyncTarget {
    describe: String,
    sync: SyncAction,
}

impl TwoLevelLog {
    /// Open (or create) the two-level log in `dir` and recover what it holds.
    pub fn open(dir: &Path, options: DiskOptions) -> Result<(TwoLevelLog, Recovered), DiskError> {
        let opened = open_storage(dir, options)?;
        let (mut log, recovered) = TwoLevelLog::open_on(opened.storage, opened.region, options)?;
        log.sync_target = opened.sync;
        let log =
            if options.checkpoint_thread { log.with_writers(opened.writer, opened.drainer)? } else { log };
        Ok((log, recovered))
    }

    /// Open the two-level log on `storage` (its files) and `region` (its circular log).
    pub fn open_on(
        mut storage: BoxedStorage,
        region: BoxedRegion,
        options: DiskOptions,
    ) -> Result<(TwoLevelLog, Recovered), DiskError> {
        let (checkpoint, first_seq) = read_checkpoint(storage.as_ref())?;
        let mut files = Vec::with_capacity(LOGS.len());
        for (file, name) in LOGS.iter().enumerate() {
            files.push((file, read_log_file(storage.as_mut(), name)?));
        }
        // The file drained to last holds the newest records; the other one older records
        // (a checkpoint in flight at the crash) or none.
        files.sort_by_key(|(_, records)| records.last().map_or(0, |(seq, _)| *seq));
        let current = if files[1].1.is_empty() { 0 } else { files[1].0 };
        let other = LOGS[1 - current];
        let other_needed = files.iter().any(|(file, records)| {
            *file != current && records.last().is_some_and(|(seq, _)| *seq >= first_seq)
        });
        if !other_needed && files.iter().any(|(file, records)| *file != current && !records.is_empty()) {
            // Everything in it precedes the checkpoint: finish what its writer did not.
            storage.truncate(other, 0).map_err(io(format!("truncating {}", storage.describe(other))))?;
            storage.sync(other).map_err(io(format!("fsync {}", storage.describe(other))))?;
        }
        let file_records: Vec<(u64, Bytes)> = files.into_iter().flat_map(|(_, records)| records).collect();
        let file_last_seq = file_records.iter().map(|(seq, _)| *seq).max().unwrap_or(0);

        let (mut circular, circular_records) = CircularLog::open(region, first_seq.max(file_last_seq + 1))?;
        if let Some(damaged) = circular.damaged_record() {
            return Err(DiskError::Corrupt(format!(
                "{}: circular log record {damaged} is damaged and later records follow it",
                storage.describe(CIRCULAR)
            )));
        }
        // Everything before the circular log's head was drained to the file, durably.
        let drained_through = circular.head_seq().saturating_sub(1);

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
                    storage.describe(LOGS[current])
                )));
            }
            let record = Record::decode_exact(payload).map_err(|error| {
                DiskError::Corrupt(format!("{}: record {seq}: {error}", storage.describe(LOGS[current])))
            })?;
            records.push(record);
            expected += 1;
        }
        if expected <= drained_through {
            return Err(DiskError::Corrupt(format!(
                "{}: records {expected}..={drained_through} were drained to it but are not there (damaged)",
                storage.describe(LOGS[current])
            )));
        }
        // Appends continue after everything recovered (a checkpoint may be ahead of a
        // circular log whose reset the crash interrupted).
        if circular.next_seq() < expected {
            circular.truncate_all(expected)?;
        }
        let records_erased_after_tear = circular.erased_after_tear();
        let log = TwoLevelLog {
            storage,
            circular,
            file_last_seq,
            current,
            other_needed,
            writer: None,
            in_flight: false,
            drainer: None,
            draining: None,
            stats: DiskStats { records_erased_after_tear, ..DiskStats::default() },
            sync_every_turns: options.sync_every_turns.max(1),
            turns_unsynced: 0,
            sync: options.sync,
            emulated_sync_delay: options.emulated_sync_delay,
            sync_target: None,
        };
        Ok((log, Recovered { checkpoint, records }))
    }

    pub fn stats(&self) -> DiskStats {
        self.stats
    }

    /// Write checkpoints and drains on threads of their own, through `writer` and `drainer`
    /// (more handles on the same files).
    pub fn with_writers(
        mut self,
        writer: BoxedStorage,
        drainer: BoxedStorage,
    ) -> Result<TwoLevelLog, DiskError> {
        // Encoding a checkpoint is CPU work nobody waits for, unlike a drain (a full circular
        // log waits for it) or the loop; at nice 10 it gets a tenth of a busy core.
        self.writer = Some(Worker::start("raftlog-checkpoint", CHECKPOINT_NICE, writer, write_checkpoint)?);
        self.drainer = Some(Worker::start("raftlog-drain", 0, drainer, write_drain)?);
        Ok(self)
    }

    /// Return once the checkpoint in flight (if any) is in place.
    pub fn wait_for_checkpoint(&mut self) -> Result<(), DiskError> {
        if !self.in_flight {
            return Ok(());
        }
        let writer = self.writer.as_ref().expect("only a writer has checkpoints in flight");
        let result = writer.wait();
        self.checkpoint_done(result)
    }

    /// Take the writer's report if it is in, without waiting.
    fn poll_checkpoint(&mut self) -> Result<(), DiskError> {
        let Some(writer) = self.writer.as_ref().filter(|_| self.in_flight) else { return Ok(()) };
        match writer.poll() {
            Some(result) => self.checkpoint_done(result),
            None => Ok(()),
        }
    }

    /// Return once the drain in flight (if any) is durable, and move the circular log's
    /// head past what it carried. Anything that writes a log file or moves the head itself
    /// waits for it first: the file's records stay in order, and the head only moves forward.
    fn wait_for_drain(&mut self) -> Result<(), DiskError> {
        let Some(drainer) = self.drainer.as_ref().filter(|_| self.draining.is_some()) else { return Ok(()) };
        let result = drainer.wait();
        self.drain_done(result)
    }

    /// Take the drain thread's report if it is in, without waiting.
    fn poll_drain(&mut self) -> Result<(), DiskError> {
        let Some(drainer) = self.drainer.as_ref().filter(|_| self.draining.is_some()) else { return Ok(()) };
        match drainer.poll() {
            Some(result) => self.drain_done(result),
            None => Ok(()),
        }
    }

    fn drain_done(&mut self, result: Result<(), DiskError>) -> Result<(), DiskError> {
        let drained = self.draining.take().expect("a drain was in flight");
        result?;
        self.circular.release_to(drained.head, drained.head_seq)?;
        Ok(())
    }

    fn checkpoint_done(&mut self, result: Result<(), DiskError>) -> Result<(), DiskError> {
        self.in_flight = false;
        result?;
        self.stats.checkpoints += 1;
        Ok(())
    }

    /// Make `records` durable, in order; returns once they are (the circular log flushed,
    /// or a checkpoint file renamed into place).
    pub fn persist(&mut self, records: &[Record]) -> Result<(), DiskError> {
        self.write(records)?;
        self.sync()
    }

    /// Write `records` (a checkpoint is made durable at once; the rest waits for
    /// [`TwoLevelLog::sync`]).
    pub fn write(&mut self, records: &[Record]) -> Result<(), DiskError> {
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
        Ok(())
    }

    /// Make every record written so far durable: flush the circular log, and drain it into
    /// the file once it is half full (Cyclone drains in batches).
    pub fn sync(&mut self) -> Result<(), DiskError> {
        self.poll_checkpoint()?;
        self.poll_drain()?;
        self.turns_unsynced += 1;
        if self.turns_unsynced < self.sync_every_turns {
            return Ok(()); // Broken variant AckBeforeSync: the turn's messages leave anyway.
        }
        self.turns_unsynced = 0;
        self.circular.flush()?;
        if !self.emulated_sync_delay.is_zero() {
            std::thread::sleep(self.emulated_sync_delay);
        }
        self.after_flush()
    }

    /// [`TwoLevelLog::sync`] for a runtime whose [`SyncThread`] syncs the circular log's file:
    /// everything but the flush (the checkpoint's progress, a drain once half full). Returns
    /// the last circular-log record the sync will cover, for [`Self::synced_elsewhere`].
    pub fn sync_elsewhere(&mut self) -> Result<u64, DiskError> {
        let last = self.circular.last_seq();
        self.poll_checkpoint()?;
        self.poll_drain()?;
        self.after_flush()?;
        Ok(last)
    }

    /// A sync handed over by [`Self::sync_elsewhere`] returned: the circular log's records
    /// up to `seq` are durable (later records say so, see `circular`).
    pub fn synced_elsewhere(&mut self, seq: u64) {
        self.circular.mark_synced(seq);
    }

    /// A flush was done or handed over: count it, and drain the circular log into the file
    /// once it is half full (Cyclone drains in batches), on the drain thread if there is one.
    fn after_flush(&mut self) -> Result<(), DiskError> {
        self.stats.flushes += 1;
        if self.draining.is_none() && self.circular.used_bytes() > self.circular.capacity_bytes() / 2 {
            self.start_drain()?;
        }
        Ok(())
    }

    fn append(&mut self, payload: &[u8]) -> Result<(), DiskError> {
        if RECORD_HEADER_BYTES + payload.len() as u64 > self.circular.capacity_bytes() / 2 {
            // Too big for the small log: straight to the file, in sequence.
            self.drain()?;
            let seq = self.circular.next_seq();
            let mut bytes = Vec::with_capacity(payload.len() + FRAME_HEADER_BYTES);
            frame(seq, payload, &mut bytes);
            self.write_file(&bytes)?;
            self.file_last_seq = seq;
            self.circular.truncate_all(seq + 1)?;
            return Ok(());
        }
        if !self.circular.fits(payload.len()) {
            // Full: the drain in flight frees its part; if that is not enough, drain the rest.
            self.wait_for_drain()?;
            if !self.circular.fits(payload.len()) {
                self.drain()?;
            }
        }
        self.circular.append(payload)?;
        Ok(())
    }

    fn write_file(&mut self, bytes: &[u8]) -> Result<(), DiskError> {
        debug_assert!(self.draining.is_none(), "a drain in flight writes this file");
        let name = LOGS[self.current];
        let describe = self.storage.describe(name);
        self.storage.append(name, bytes).map_err(io(format!("appending to {describe}")))?;
        self.storage.sync(name).map_err(io(format!("fsync {describe}")))
    }

    /// Move every record of the circular log to the log file, then empty the circular log;
    /// returns once done.
    pub fn drain(&mut self) -> Result<(), DiskError> {
        self.wait_for_drain()?;
        let bytes = self.frame_pending()?;
        if !bytes.is_empty() {
            self.write_file(&bytes)?;
        }
        self.circular.truncate_all(self.circular.next_seq())?;
        Ok(())
    }

    /// Start moving every record of the circular log to the log file: on the drain thread
    /// (the head moves when it is durable, [`Self::poll_drain`]), or here without one. The
    /// loop goes on appending meanwhile, into the half the drain does not hold.
    fn start_drain(&mut self) -> Result<(), DiskError> {
        if self.drainer.is_none() {
            return self.drain();
        }
        let head = DrainInFlight { head: self.circular.tail(), head_seq: self.circular.next_seq() };
        let bytes = self.frame_pending()?;
        if bytes.is_empty() {
            return self.circular.release_to(head.head, head.head_seq).map_err(DiskError::from);
        }
        let drainer = self.drainer.as_ref().expect("checked above");
        drainer.send(DrainJob { file: LOGS[self.current], bytes })?;
        self.draining = Some(head);
        Ok(())
    }

    /// The circular log's records that are not in the log files yet, framed for a log file
    /// (counted as drained: a drain is about to write them).
    fn frame_pending(&mut self) -> Result<Vec<u8>, DiskError> {
        let pending = self.circular.pending()?;
        let mut bytes = Vec::new();
        let in_files = self.file_last_seq;
        for record in pending.iter().filter(|record| record.seq > in_files) {
            frame(record.seq, &record.payload, &mut bytes);
            self.file_last_seq = record.seq;
        }
        if !bytes.is_empty() {
            self.stats.drains += 1;
            self.stats.bytes_drained += bytes.len() as u64;
        }
        Ok(bytes)
    }

    /// Switch the drains to the other log file and have the checkpoint written (by the
    /// writer thread, or here); the file left holds only records the checkpoint covers.
    fn checkpoint(&mut self, checkpoint: &Checkpoint) -> Result<(), DiskError> {
        // One at a time: the file this one frees is the one the next one switches to. And
        // after the drain in flight: the file it writes may be the one this one empties.
        self.wait_for_checkpoint()?;
        self.wait_for_drain()?;
        let next_seq = self.circular.next_seq();
        if self.other_needed {
            return self.checkpoint_in_place(checkpoint, next_seq);
        }
        let obsolete = LOGS[self.current];
        self.current = 1 - self.current;
        let job = CheckpointJob { checkpoint: checkpoint.clone(), next_seq, obsolete };
        match &self.writer {
            Some(writer) => {
                writer.send(job)?;
                self.in_flight = true;
                if checkpoint.installed {
                    self.wait_for_checkpoint()?;
                }
                Ok(())
            }
            None => {
                write_checkpoint(self.storage.as_mut(), &job)?;
                self.checkpoint_done(Ok(()))
            }
        }
    }

    /// A checkpoint written in the loop, after which both log files and the circular log
    /// are emptied (everything persisted so far precedes it).
    fn checkpoint_in_place(&mut self, checkpoint: &Checkpoint, next_seq: u64) -> Result<(), DiskError> {
        let job =
            CheckpointJob { checkpoint: checkpoint.clone(), next_seq, obsolete: LOGS[1 - self.current] };
        write_checkpoint(self.storage.as_mut(), &job)?;
        let log = self.storage.describe(LOGS[self.current]);
        self.storage.truncate(LOGS[self.current], 0).map_err(io(format!("truncating {log}")))?;
        self.storage.sync(LOGS[self.current]).map_err(io(format!("fsync {log}")))?;
        self.file_last_seq = next_seq.saturating_sub(1);
        self.circular.truncate_all(next_seq)?;
        self.other_needed = false;
        self.checkpoint_done(Ok(()))
    }
}

/// The valid records of log file `name`, cutting a torn tail (a drain the crash interrupted;
/// the circular log still holds what it carried). If it was damage instead, the sequence
/// check of the replay finds the records it hid missing.
fn read_log_file(storage: &mut (dyn Storage + Send), name: &str) -> Result<Vec<(u64, Bytes)>, DiskError> {
    let describe = storage.describe(name);
    let bytes = storage.read(name).map_err(io(format!("reading {describe}")))?.unwrap_or_default();
    let (records, valid_bytes) = parse_log_file(&bytes);
    if valid_bytes < bytes.len() {
        storage.truncate(name, valid_bytes as u64).map_err(io(format!("truncating {describe}")))?;
        storage.sync(name).map_err(io(format!("fsync {describe}")))?;
    }
    Ok(records)
}

/// The checkpoint and the sequence number of the first record after it (1 without one).
fn read_checkpoint(storage: &(dyn Storage + Send)) -> Result<(Option<Checkpoint>, u64), DiskError> {
    let path = storage.describe(SNAPSHOT);
    let Some(bytes) = storage.read(SNAPSHOT).map_err(io(format!("reading {path}")))? else {
        return Ok((None, 1));
    };
    let corrupt = |what: &str| DiskError::Corrupt(format!("{path}: {what}"));
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

/// Read, increment and durably store this node's incarnation counter: `"N CRC\n"`, the CRC-32
/// of the decimal `N` (a damaged counter could reuse an old session's id). A bare `"N\n"`
/// from before the checksum is still read.
fn next_boot(storage: &mut (dyn Storage + Send)) -> Result<u64, DiskError> {
    let path = storage.describe(BOOT);
    let boot = match storage.read(BOOT).map_err(io(format!("reading {path}")))? {
        None => 0,
        Some(bytes) => {
            let corrupt = || DiskError::Corrupt(format!("{path}: not a boot counter"));
            let text = std::str::from_utf8(&bytes).map_err(|_| corrupt())?;
            let mut words = text.split_whitespace();
            let number = words.next().ok_or_else(corrupt)?;
            if let Some(crc) = words.next() {
                if crc.parse::<u32>().ok() != Some(chorus_storage::checksum(&[number.as_bytes()])) {
                    return Err(DiskError::Corrupt(format!("{path}: checksum mismatch")));
                }
            }
            number.parse::<u64>().map_err(|_| corrupt())?
        }
    } + 1;
    let text = format!("{boot} {}\n", chorus_storage::checksum(&[boot.to_string().as_bytes()]));
    storage.replace(BOOT, text.as_bytes()).map_err(io(format!("writing {path}")))?;
    Ok(boot)
}

/// Whether the directory says which format it is in (`FORMAT`), refusing one in another
/// format than this build's. A directory without the file is new, or from before format
/// numbers (the formats of session 24, which this build reads): it gets the file at this
/// start.
fn check_format(storage: &(dyn Storage + Send)) -> Result<bool, DiskError> {
    let path = storage.describe(FORMAT);
    let Some(bytes) = storage.read(FORMAT).map_err(io(format!("reading {path}")))? else {
        return Ok(false);
    };
    let corrupt = || DiskError::Corrupt(format!("{path}: not a raftlog format number"));
    let text = std::str::from_utf8(&bytes).map_err(|_| corrupt())?;
    let words: Vec<&str> = text.split_whitespace().collect();
    let ["raftlog-format", number, crc] = words[..] else { return Err(corrupt()) };
    if crc.parse::<u32>().ok() != Some(chorus_storage::checksum(&[number.as_bytes()])) {
        return Err(DiskError::Corrupt(format!("{path}: checksum mismatch")));
    }
    let found = number.parse::<u32>().map_err(|_| corrupt())?;
    if found != FORMAT_VERSION {
        return Err(DiskError::Format { path, found });
    }
    Ok(true)
}

fn write_format(storage: &mut (dyn Storage + Send)) -> Result<(), DiskError> {
    let path = storage.describe(FORMAT);
    let number = FORMAT_VERSION.to_string();
    let text = format!("raftlog-format {number} {}\n", chorus_storage::checksum(&[number.as_bytes()]));
    storage.replace(FORMAT, text.as_bytes()).map_err(io(format!("writing {path}")))
}

/// This data directory's Raft incarnation and identity (`replica::members`):
/// `"INCARNATION IDENTITY CRC\n"`, written when the directory is first opened: the
/// configured incarnation (0 for a founding member, a new one for a replacement) and the
/// configured identity (random, chosen by the caller). A directory from before identities
/// existed is a founding member's and gets the configured identity now.
fn incarnation_and_identity(
    storage: &mut (dyn Storage + Send),
    config: &RaftLogConfig,
) -> Result<(u64, u64), DiskError> {
    let path = storage.describe(IDENTITY);
    if let Some(bytes) = storage.read(IDENTITY).map_err(io(format!("reading {path}")))? {
        let corrupt = || DiskError::Corrupt(format!("{path}: not an incarnation and identity"));
        let text = std::str::from_utf8(&bytes).map_err(|_| corrupt())?;
        let words: Vec<&str> = text.split_whitespace().collect();
        let [incarnation, identity, crc] = words[..] else { return Err(corrupt()) };
        let body = format!("{incarnation} {identity}");
        if crc.parse::<u32>().ok() != Some(chorus_storage::checksum(&[body.as_bytes()])) {
            return Err(DiskError::Corrupt(format!("{path}: checksum mismatch")));
        }
        let incarnation = incarnation.parse::<u64>().map_err(|_| corrupt())?;
        if config.joining && incarnation == 0 {
            return Err(DiskError::Corrupt(format!(
                "{path}: this directory holds a founding member's raftlog data; a replacement \
                 (--join) starts with an empty one"
            )));
        }
        return Ok((incarnation, identity.parse::<u64>().map_err(|_| corrupt())?));
    }
    let incarnation = if config.joining { config.incarnation } else { 0 };
    let body = format!("{incarnation} {}", config.identity);
    let text = format!("{body} {}\n", chorus_storage::checksum(&[body.as_bytes()]));
    storage.replace(IDENTITY, text.as_bytes()).map_err(io(format!("writing {path}")))?;
    Ok((incarnation, config.identity))
}

/// The at-most-once client id of this node's own sessions in start `boot`: the node id in
/// the top bits; a replacement sets bit 39 and puts the low 23 bits of its incarnation above
/// a 16-bit boot counter, so it does not reuse its predecessor's ids; a founding member puts
/// the low 23 bits of its data directory's random identity there instead, so a node whose
/// directory was wiped (its boot counter back at 1) does not reuse the ids of its first
/// start either: entries of its old session would make its new batches look stale or, worse,
/// duplicates answered with the old batch's outcomes, in the moment before its peers refuse
/// it. (Without a data directory, identity 0: `node << 40 | boot`.)
pub fn session_client_id(me: NodeId, incarnation: u64, identity: u64, boot: u64) -> u64 {
    let node = (me.0 as u64) << 40;
    match incarnation {
        0 => node | (identity & 0x7F_FFFF) << 16 | (boot & 0xFFFF),
        _ => node | 1 << 39 | (incarnation & 0x7F_FFFF) << 16 | (boot & 0xFFFF),
    }
}

/// Syncs the circular log's file off the event loop (raft-rs's asynchronous persistence,
/// docs/protocols/raftlog.md, "Persistence"): the loop writes a turn's records, hands the
/// turn's ticket over and goes on with the next turn; the thread `fdatasync`s the file,
/// which makes every record written before the call durable, publishes the ticket and wakes
/// the loop. Requests that pile up while a sync runs are served by one sync (group commit).
pub struct SyncThread {
    requests: Option<mpsc::Sender<u64>>,
    done: Arc<SyncDone>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// What the thread syncs, for errors.
    describe: String,
}

#[derive(Default)]
struct SyncDone {
    /// The last ticket whose records a finished sync covered.
    ticket: AtomicU64,
    /// How long that sync took.
    took_ns: AtomicU64,
    /// A sync failed: `failure` says why (checked first, so the loop's many looks at the
    /// ticket take no lock).
    has_failed: std::sync::atomic::AtomicBool,
    /// Why a sync failed (the error's kind and text): the node must stop.
    failure: std::sync::Mutex<Option<(std::io::ErrorKind, String)>>,
}

impl SyncThread {
    /// Start syncing `target`; `wake` is called after every sync (the loop's waker), and
    /// each sync waits `emulated_delay` more ([`DiskOptions::emulated_sync_delay`]).
    pub fn start(
        target: SyncTarget,
        emulated_delay: Duration,
        wake: Box<dyn Fn() + Send>,
    ) -> Result<SyncThread, DiskError> {
        let SyncTarget { describe, mut sync } = target;
        let (requests, pending) = mpsc::channel::<u64>();
        let done = Arc::new(SyncDone::default());
        let report = done.clone();
        let thread = std::thread::Builder::new()
            .name("raftlog-sync".into())
            .spawn(move || {
                while let Ok(mut ticket) = pending.recv() {
                    while let Ok(later) = pending.try_recv() {
                        ticket = later; // one sync covers every record written so far
                    }
                    let started = std::time::Instant::now();
                    let synced = sync();
                    if !emulated_delay.is_zero() {
                        std::thread::sleep(emulated_delay);
                    }
                    match synced {
                        Ok(()) => {
                            let took_ns = started.elapsed().as_nanos().min(u64::MAX as u128) as u64;
                            report.took_ns.store(took_ns, Ordering::Relaxed);
                            report.ticket.store(ticket, Ordering::Release);
                        }
                        Err(error) => {
                            let failure = (error.kind(), error.to_string());
                            *report.failure.lock().unwrap_or_else(|poison| poison.into_inner()) =
                                Some(failure);
                            report.has_failed.store(true, Ordering::Release);
                            wake();
                            return;
                        }
                    }
                    wake();
                }
            })
            .map_err(io("starting the sync thread"))?;
        Ok(SyncThread { requests: Some(requests), done, thread: Some(thread), describe })
    }

    /// Sync every record written so far; `ticket` names them.
    fn request(&self, ticket: u64) -> Result<(), DiskError> {
        let requests = self.requests.as_ref().expect("the sync thread is running");
        requests.send(ticket).map_err(|_| self.failure().unwrap_or_else(sync_thread_gone))
    }

    /// The last ticket a finished sync covered, or why syncing failed.
    fn synced(&self) -> Result<u64, DiskError> {
        match self.failure() {
            Some(error) => Err(error),
            None => Ok(self.done.ticket.load(Ordering::Acquire)),
        }
    }

    fn failure(&self) -> Option<DiskError> {
        if !self.done.has_failed.load(Ordering::Acquire) {
            return None;
        }
        let failure = self.done.failure.lock().unwrap_or_else(|poison| poison.into_inner());
        let (kind, message) = failure.clone()?;
        Some(DiskError::Io { context: self.describe.clone(), source: std::io::Error::new(kind, message) })
    }
}

fn sync_thread_gone() -> DiskError {
    DiskError::Io { context: "the sync thread".into(), source: std::io::Error::other("it stopped") }
}

impl Drop for SyncThread {
    fn drop(&mut self) {
        self.requests = None; // the thread's loop ends
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What [`DurableRaftLog::write_taken`] wrote.
struct WrittenTurn {
    /// The records need a sync ([`crate::durable::DurableTurn::sync`]).
    sync: bool,
    ticket: u64,
    /// Any record at all.
    wrote: bool,
}

/// A raftlog replica with its two-level log: the core plus the I/O that makes its Raft
/// state durable. The runtime calls [`DurableRaftLog::persist`] after every turn, before it
/// sends the turn's messages and replies.
pub struct DurableRaftLog {
    core: RaftLog,
    disk: Option<TwoLevelLog>,
    boot: u64,
    /// The simulator's `write_durable` wrote records that `sync_durable` must sync.
    sync_pending: bool,
    /// The ticket of the last records written ([`crate::durable::DurableTurn::ticket`]).
    written_ticket: u64,
    /// The ticket of the last records a sync covered, for [`RaftLog::on_synced`].
    synced_ticket: u64,
    /// The simulator's sync under way covers the records up to this ticket
    /// ([`Replica::sync_started`]).
    sync_covers: Option<u64>,
    /// Syncs run off the event loop ([`DurableRaftLog::start_sync_thread`]).
    sync_thread: Option<SyncThread>,
    /// The last ticket handed to the sync thread.
    sync_requested: u64,
    /// Syncs handed to the sync thread.
    syncs_on_thread: u64,
    /// Each ticket handed to the sync thread, with the last circular-log record its sync
    /// covers (oldest first; [`TwoLevelLog::synced_elsewhere`]).
    syncs_requested: std::collections::VecDeque<(u64, u64)>,
}

impl DurableRaftLog {
    /// A replica without a data directory: nothing survives a restart, so a restarted node
    /// must not rejoin under its old id.
    pub fn in_memory(config: RaftLogConfig) -> DurableRaftLog {
        DurableRaftLog::with(RaftLog::new(config), None, 0)
    }

    fn with(core: RaftLog, disk: Option<TwoLevelLog>, boot: u64) -> DurableRaftLog {
        DurableRaftLog {
            core,
            disk,
            boot,
            sync_pending: false,
            written_ticket: 0,
            synced_ticket: 0,
            sync_covers: None,
            sync_thread: None,
            sync_requested: 0,
            syncs_on_thread: 0,
            syncs_requested: std::collections::VecDeque::new(),
        }
    }

    /// Open `dir` (created if missing) and restore the replica the previous incarnation
    /// left there; the node rejoins under its old id.
    pub fn open(
        config: RaftLogConfig,
        dir: &Path,
        options: DiskOptions,
    ) -> Result<DurableRaftLog, DiskError> {
        let opened = open_storage(dir, options)?;
        let mut replica = DurableRaftLog::open_on(config, opened.storage, opened.region, options)?;
        replica.disk = match replica.disk.take() {
            Some(mut disk) => {
                disk.sync_target = opened.sync;
                Some(if options.checkpoint_thread {
                    disk.with_writers(opened.writer, opened.drainer)?
                } else {
                    disk
                })
            }
            None => None,
        };
        Ok(replica)
    }

    /// Like [`DurableRaftLog::open`], on given storage (the simulator's disk).
    pub fn open_on(
        mut config: RaftLogConfig,
        mut storage: BoxedStorage,
        region: BoxedRegion,
        mut options: DiskOptions,
    ) -> Result<DurableRaftLog, DiskError> {
        let versioned = check_format(storage.as_ref())?;
        let boot = next_boot(storage.as_mut())?;
        let (incarnation, identity) = incarnation_and_identity(storage.as_mut(), &config)?;
        config.incarnation = incarnation;
        config.identity = identity;
        // A replacement announces itself until every log took it in, across restarts too.
        config.joining = incarnation != 0;
        // One at-most-once session per start: the previous one may have batches in flight
        // under sequence numbers this one would reuse. A replacement's boot counter starts
        // again at 1, so its sessions also carry (part of) its incarnation.
        config.session_client_id = session_client_id(config.me, config.incarnation, config.identity, boot);
        config.durable = true;
        if config.has_bug(crate::Bug::AckBeforeSync) {
            options.sync_every_turns = 64;
        }
        let unversioned = |error: DiskError| match error {
            DiskError::Corrupt(what) if !versioned && boot > 1 => DiskError::Corrupt(format!(
                "{what} (this directory has no `{FORMAT}` file: a build older than format \
                 numbers may have written it in a format this one cannot read)"
            )),
            error => error,
        };
        let (mut disk, recovered) = TwoLevelLog::open_on(storage, region, options).map_err(unversioned)?;
        let core = RaftLog::restore(config, recovered)
            .map_err(|error| unversioned(DiskError::Corrupt(error.to_string())))?;
        if !versioned {
            // Only once it read: a directory this build cannot read keeps saying so.
            write_format(disk.storage.as_mut())?;
        }
        Ok(DurableRaftLog::with(core, Some(disk), boot))
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

    /// Write the core's durable records and sync everything written so far, whatever the
    /// turn needs (a clean stop).
    pub fn persist_and_sync(&mut self) -> Result<(), DiskError> {
        self.write_turn(true)
    }

    /// Make the core's durable records of the last calls stable, or only write them when
    /// none needs a sync ([`RaftLog::take_durable`]: a turn that moved only commit indexes).
    pub fn persist(&mut self) -> Result<(), DiskError> {
        self.write_turn(false)
    }

    /// Whether [`Self::persist`] will sync: the core's calls since the last one left records
    /// that need it, and there is a disk.
    pub fn turn_needs_sync(&self) -> bool {
        self.disk.is_some() && (self.core.records_need_sync() || self.sync_outstanding())
    }

    /// Syncs handed to the sync thread so far.
    pub fn syncs_on_thread(&self) -> u64 {
        self.syncs_on_thread
    }

    /// Whether a sync handed to the sync thread has not returned yet.
    pub fn sync_outstanding(&self) -> bool {
        let synced = self.sync_thread.as_ref().map_or(Ok(u64::MAX), SyncThread::synced);
        synced.is_ok_and(|synced| synced < self.sync_requested)
    }

    fn write_turn(&mut self, sync_always: bool) -> Result<(), DiskError> {
        // A sync of the thread still under way is overtaken: this turn's messages must not
        // leave before what that sync covers is stable.
        let sync_always = sync_always || self.sync_outstanding();
        let turn = self.write_taken()?;
        let Some(disk) = &mut self.disk else {
            self.synced_ticket = turn.ticket; // nothing to wait for
            return Ok(());
        };
        if turn.sync || sync_always {
            disk.sync()?;
            self.synced_ticket = turn.ticket;
        }
        Ok(())
    }

    /// Take the core's durable records and write them (not synced); every way of persisting
    /// starts here.
    fn write_taken(&mut self) -> Result<WrittenTurn, DiskError> {
        let turn = self.core.take_durable();
        self.written_ticket = turn.ticket;
        if let Some(disk) = &mut self.disk {
            disk.write(&turn.records)?;
        }
        Ok(WrittenTurn { sync: turn.sync, ticket: turn.ticket, wrote: !turn.records.is_empty() })
    }

    /// Tell the core what the syncs so far made stable ([`RaftLog::on_synced`]); a no-op
    /// when nothing new was synced.
    pub fn on_synced_now(&mut self, now: Time, out: &mut Outbox<Message>) {
        self.core.on_synced(self.synced_ticket, now, out);
    }

    /// Start a [`SyncThread`], when the circular log has something to sync and
    /// `raftlog_sync` allows it; `wake` is called whenever a sync returns. Returns from what
    /// average sync time on the runtime should sync there ([`SyncPlace`]); `None`: the loop
    /// keeps syncing (no disk, a volatile one, or `raftlog_sync = "loop"`).
    pub fn start_sync_thread(&mut self, wake: Box<dyn Fn() + Send>) -> Result<Option<Duration>, DiskError> {
        let Some(disk) = &mut self.disk else { return Ok(None) };
        let from = match disk.sync {
            SyncPlace::Loop => return Ok(None),
            SyncPlace::Thread => Duration::ZERO,
            SyncPlace::Auto => SYNC_THREAD_FROM,
        };
        let Some(target) = disk.sync_target.take() else { return Ok(None) };
        self.sync_thread = Some(SyncThread::start(target, disk.emulated_sync_delay, wake)?);
        Ok(Some(from))
    }

    /// [`Self::persist`] with the sync handed to the sync thread: the core's records are
    /// written, and a turn that needs a sync asks the thread for one. Returns the ticket a
    /// sync must reach before the messages of this turn that wait for a sync may leave:
    /// this turn's, or an earlier one still under way (a later turn's answers may rest on an
    /// earlier turn's records, such as a follower acknowledging entries it already holds);
    /// `None` when nothing is under way. Without a sync thread this is [`Self::persist`].
    pub fn persist_elsewhere(&mut self) -> Result<Option<u64>, DiskError> {
        if self.sync_thread.is_none() || self.disk.is_none() {
            self.persist()?;
            return Ok(None);
        }
        let turn = self.write_taken()?;
        let thread = self.sync_thread.as_ref().expect("checked above");
        let disk = self.disk.as_mut().expect("checked above");
        if turn.sync {
            let last_seq = disk.sync_elsewhere()?;
            self.syncs_requested.push_back((turn.ticket, last_seq));
            thread.request(turn.ticket)?;
            self.sync_requested = turn.ticket;
            self.syncs_on_thread += 1;
        }
        Ok((thread.synced()? < self.sync_requested).then_some(self.sync_requested))
    }

    /// The ticket of a sync the thread finished since the last call (for
    /// [`Self::on_synced_now`]) and how long it took, or why syncing failed.
    pub fn poll_synced(&mut self) -> Result<Option<(u64, Duration)>, DiskError> {
        let Some(thread) = &self.sync_thread else { return Ok(None) };
        let synced = thread.synced()?;
        let took = Duration::from_nanos(thread.done.took_ns.load(Ordering::Relaxed));
        let disk = self.disk.as_mut().expect("a sync thread syncs a disk");
        while let Some(&(ticket, last_seq)) = self.syncs_requested.front() {
            if ticket > synced {
                break;
            }
            disk.synced_elsewhere(last_seq);
            self.syncs_requested.pop_front();
        }
        if synced <= self.synced_ticket {
            return Ok(None);
        }
        self.synced_ticket = synced;
        Ok(Some((synced, took)))
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

    fn end_turn(&mut self, now: Time, out: &mut Outbox<Message>) {
        self.core.end_turn(now, out);
    }

    fn on_view(&mut self, now: Time, view: View, out: &mut Outbox<Message>) {
        self.core.on_view(now, view, out);
    }

    fn event_counts(&self, report: &mut dyn FnMut(&'static str, u64)) {
        self.core.event_counts(report);
        let stats = self.disk_stats();
        report("raftlog.disk_drains", stats.drains);
        report("raftlog.disk_checkpoints", stats.checkpoints);
        report("raftlog.disk_records_erased_after_tear", stats.records_erased_after_tear);
    }

    /// The simulator's two halves of `persist`: a crash may strike between them.
    /// A node that cannot write must stop (the server exits); the simulator's disk never
    /// fails a write, so here that is a panic the sweep reports.
    fn write_durable(&mut self) -> bool {
        let turn = self.write_taken().expect("the two-level log cannot be written");
        self.sync_pending |= turn.sync;
        turn.wrote
    }

    fn leaves_before_sync(&self, message: &Message) -> bool {
        self.core.leaves_before_sync(message)
    }

    fn replies_before_sync(&self) -> bool {
        self.core.replies_before_sync()
    }

    fn sync_started(&mut self) {
        self.sync_covers = Some(self.written_ticket);
        self.sync_pending = false; // what is written from now on needs the next sync
    }

    fn sync_durable(&mut self) {
        let covers = self.sync_covers.take();
        if !std::mem::take(&mut self.sync_pending) && covers.is_none() {
            return; // only commit indexes moved: written, left for the next syncing turn
        }
        if let Some(disk) = &mut self.disk {
            disk.sync().expect("the two-level log cannot be synced");
        }
        // A sync that took time made stable what it covered; later writes it may have
        // carried too are not claimed.
        self.synced_ticket = covers.unwrap_or(self.written_ticket);
    }

    fn on_synced(&mut self, now: Time, out: &mut Outbox<Message>) {
        self.on_synced_now(now, out);
    }

    /// Only a turn with more than commit indexes to write syncs (the model charges it).
    fn sync_due(&self) -> bool {
        self.sync_pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::durable::LogCheckpoint;
    use raft::prelude::Entry;
    use std::fs::OpenOptions;
    use std::io::Write as _;
    use std::path::PathBuf;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("raftlog-disk-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn small() -> DiskOptions {
        DiskOptions { circular_bytes: 128 + 4096, ..DiskOptions::default() }
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

    /// A drain is written by the drain thread while the turns go on appending; the head
    /// moves once it is durable, and nothing is lost or replayed out of order.
    #[test]
    fn drains_on_their_thread_leave_the_turns_appending() {
        let dir = temp_dir("drain-thread");
        let (mut log, _) = TwoLevelLog::open(&dir, small()).unwrap();
        let mut written = Vec::new();
        let mut appended_while_draining = 0;
        for i in 0..400u64 {
            let was_draining = log.draining.is_some();
            let record = entries((i % 3) as u32, i + 1, 1, 100);
            log.persist(std::slice::from_ref(&record)).unwrap();
            written.push(record);
            appended_while_draining += was_draining as u32;
        }
        assert!(log.stats().drains >= 10, "{:?}", log.stats());
        assert!(appended_while_draining > 0, "no turn appended while a drain was in flight");
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
            ..Checkpoint::default()
        };
        let after = Record::HardState { log: 0, term: 2, vote: 1, commit: 20 };
        log.persist(&[Record::Checkpoint(checkpoint.clone()), after.clone()]).unwrap();
        log.wait_for_checkpoint().unwrap();
        assert_eq!(log.stats().checkpoints, 1);
        assert_eq!(std::fs::metadata(dir.join("log")).unwrap().len(), 0);
        log.drain().unwrap(); // the drains went to the other file
        assert!(std::fs::metadata(dir.join("log.1")).unwrap().len() > 0);
        drop(log);
        let (_, recovered) = TwoLevelLog::open(&dir, small()).unwrap();
        assert_eq!(recovered.checkpoint, Some(checkpoint));
        assert_eq!(recovered.records, vec![after]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn checkpoint_at(index: u64) -> Checkpoint {
        Checkpoint {
            logs: vec![LogCheckpoint {
                snapshot_index: index,
                snapshot_term: 1,
                state: Bytes::from(format!("state at {index}")).into(),
                commit: index,
                term: 1,
                ..Default::default()
            }],
            ..Checkpoint::default()
        }
    }

    #[test]
    fn a_crash_before_a_background_checkpoint_completes_recovers_from_both_log_files() {
        let disk = chorus_storage::SimDisk::new();
        let (mut log, _) = on_sim(&disk).unwrap();
        let first: Vec<Record> = (1..=10).map(|i| entries(0, i, 1, 300)).collect();
        log.persist(&first).unwrap();
        log.persist(&[Record::Checkpoint(checkpoint_at(10))]).unwrap();
        let middle: Vec<Record> = (11..=20).map(|i| entries(0, i, 1, 300)).collect();
        log.persist(&middle).unwrap();
        log.drain().unwrap();
        // The next checkpoint switched the drains to the other file, and its writer never
        // finished (the crash): the records of both files are needed.
        log.current = 1 - log.current;
        let last: Vec<Record> = (21..=30).map(|i| entries(0, i, 1, 300)).collect();
        log.persist(&last).unwrap();
        log.drain().unwrap();
        drop(log);
        disk.crash(7);
        let (mut log, recovered) = on_sim(&disk).unwrap();
        assert_eq!(recovered.checkpoint, Some(checkpoint_at(10)));
        let expected: Vec<Record> = middle.iter().chain(&last).cloned().collect();
        assert_eq!(recovered.records, expected);
        assert!(log.other_needed);
        // The next checkpoint cannot switch to a needed file: written in place, it empties
        // both, and later records replay after it.
        log.persist(&[Record::Checkpoint(checkpoint_at(30))]).unwrap();
        assert!(!log.other_needed);
        let after = entries(0, 31, 1, 300);
        log.persist(std::slice::from_ref(&after)).unwrap();
        drop(log);
        let (_, recovered) = on_sim(&disk).unwrap();
        assert_eq!(recovered.checkpoint, Some(checkpoint_at(30)));
        assert_eq!(recovered.records, vec![after]);
    }

    #[test]
    fn records_persisted_while_a_checkpoint_is_written_replay_after_it() {
        let dir = temp_dir("background");
        let (mut log, _) = TwoLevelLog::open(&dir, small()).unwrap();
        let mut after = Vec::new();
        for round in 1..=5u64 {
            for i in 0..8 {
                log.persist(&[entries(0, round * 100 + i, 1, 300)]).unwrap();
            }
            // Each checkpoint goes to the writer; the records that follow it go on at once
            // (the next checkpoint waits for the previous one).
            log.persist(&[Record::Checkpoint(checkpoint_at(round * 100 + 7))]).unwrap();
            after = (0..6).map(|i| entries(1, round * 100 + i, 1, 500)).collect();
            for record in &after {
                log.persist(std::slice::from_ref(record)).unwrap();
            }
        }
        log.wait_for_checkpoint().unwrap();
        assert_eq!(log.stats().checkpoints, 5);
        drop(log);
        let (_, recovered) = TwoLevelLog::open(&dir, small()).unwrap();
        assert_eq!(recovered.checkpoint, Some(checkpoint_at(507)));
        assert_eq!(recovered.records, after);
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

    fn on_sim(disk: &chorus_storage::SimDisk) -> Result<(TwoLevelLog, Recovered), DiskError> {
        let region = StorageRegion::open(disk.clone(), CIRCULAR, 128 + 4096).unwrap();
        TwoLevelLog::open_on(Box::new(disk.clone()), Box::new(region), DiskOptions::default())
    }

    /// Damage one byte of `file` at `at` (what a latent sector error does).
    fn flip(disk: &chorus_storage::SimDisk, file: &str, at: usize) {
        let mut bytes = disk.read(file).unwrap().unwrap();
        bytes[at] ^= 0x40;
        let mut writer = disk.clone();
        writer.write_at(file, 0, &bytes).unwrap();
        writer.sync(file).unwrap();
    }

    /// Where record `n` (from 1) of the circular log starts in its file, when every record
    /// is `entries(.., 100)`: a 24-byte header and a 120-byte payload, after the 128-byte
    /// header slots.
    fn circular_record_at(n: usize) -> usize {
        128 + (n - 1) * (24 + 120)
    }

    #[test]
    fn a_damaged_record_in_the_middle_of_the_circular_log_refuses_the_start() {
        let disk = chorus_storage::SimDisk::new();
        let (mut log, _) = on_sim(&disk).unwrap();
        let records: Vec<Record> = (0..4).map(|i| entries(0, i + 1, 1, 100)).collect();
        log.persist(&records).unwrap();
        // A later flush's record says the first four were synced.
        log.persist(&[entries(0, 5, 1, 100)]).unwrap();
        drop(log);
        flip(&disk, CIRCULAR, circular_record_at(2) + 24 + 30);
        match on_sim(&disk) {
            Err(DiskError::Corrupt(message)) => assert!(message.contains("damaged"), "{message}"),
            other => {
                panic!("expected a refusal, got {:?}", other.map(|(_, recovered)| recovered.records.len()))
            }
        }
    }

    /// A power loss during a flush writes its pages back in any order: an unsynced record can
    /// be torn while later unsynced ones survive. Nobody was told about any of them, so the
    /// log ends at the torn one, and the survivors are erased: a record written later in the
    /// torn one's place must not find them behind it as its successors.
    #[test]
    fn unsynced_records_past_a_torn_one_are_dropped_and_never_come_back() {
        let disk = chorus_storage::SimDisk::new();
        let (mut log, _) = on_sim(&disk).unwrap();
        let synced: Vec<Record> = (0..2).map(|i| entries(0, i + 1, 1, 100)).collect();
        log.persist(&synced).unwrap();
        // The flush of records 3 to 5 was under way: 3 is torn, 4 and 5 made it.
        let in_flight: Vec<Record> = (2..5).map(|i| entries(0, i + 1, 1, 100)).collect();
        log.persist(&in_flight).unwrap();
        drop(log);
        flip(&disk, CIRCULAR, circular_record_at(3) + 24 + 30);
        let (mut log, recovered) = on_sim(&disk).expect("a tear of unsynced records is not damage");
        assert_eq!(recovered.records, synced);
        assert_eq!(log.stats().records_erased_after_tear, 2);
        // Record 3 again, the same size: old record 4 would sit right behind it.
        let again = entries(0, 3, 1, 100);
        log.persist(std::slice::from_ref(&again)).unwrap();
        drop(log);
        let (log, recovered) = on_sim(&disk).unwrap();
        assert_eq!(recovered.records, [synced, vec![again]].concat());
        assert_eq!(log.stats().records_erased_after_tear, 0);
    }

    #[test]
    fn a_damaged_record_in_the_log_file_refuses_the_start_even_with_the_circular_log_empty() {
        let disk = chorus_storage::SimDisk::new();
        let (mut log, _) = on_sim(&disk).unwrap();
        let records: Vec<Record> = (0..3).map(|i| entries(0, i + 1, 1, 100)).collect();
        log.persist(&records).unwrap();
        log.drain().unwrap();
        drop(log);
        // The last record in the file, which the circular log no longer holds.
        let file_bytes = disk.read(LOG).unwrap().unwrap().len();
        flip(&disk, LOG, file_bytes - 10);
        assert!(matches!(on_sim(&disk), Err(DiskError::Corrupt(_))));
    }

    /// A data directory says which format it is in: another number is refused with a
    /// message naming both, a directory without the file (new, or from before format
    /// numbers) gets it once it opened.
    #[test]
    fn a_directory_in_another_format_is_refused_with_a_message_that_says_so() {
        let disk = chorus_storage::SimDisk::new();
        let open = || {
            let region = StorageRegion::open(disk.clone(), CIRCULAR, 128 + 4096).unwrap();
            let config = RaftLogConfig::new(NodeId(0), chorus_core::NodeSet::single(NodeId(0)));
            DurableRaftLog::open_on(config, Box::new(disk.clone()), Box::new(region), DiskOptions::default())
        };
        let format_file = || String::from_utf8(disk.read(FORMAT).unwrap().expect("a format file")).unwrap();
        drop(open().expect("an empty directory opens"));
        assert!(format_file().starts_with(&format!("raftlog-format {FORMAT_VERSION} ")));
        let mut writer = disk.clone();
        writer.remove(FORMAT).unwrap();
        drop(open().expect("a directory from before format numbers opens"));
        assert!(format_file().starts_with(&format!("raftlog-format {FORMAT_VERSION} ")));

        let next = (FORMAT_VERSION + 1).to_string();
        let text = format!("raftlog-format {next} {}\n", chorus_storage::checksum(&[next.as_bytes()]));
        writer.replace(FORMAT, text.as_bytes()).unwrap();
        let Err(error) = open() else { panic!("a directory in another format opened") };
        assert!(matches!(error, DiskError::Format { found, .. } if found == FORMAT_VERSION + 1));
        let message = error.to_string();
        assert!(message.contains(&format!("format {next}")) && message.contains("refusing"), "{message}");

        writer.replace(FORMAT, b"raftlog-format 1 12345\n").unwrap();
        assert!(matches!(open(), Err(DiskError::Corrupt(_))));
    }

    #[test]
    fn a_damaged_boot_counter_refuses_the_start() {
        let mut disk: BoxedStorage = Box::new(chorus_storage::SimDisk::new());
        assert_eq!(next_boot(disk.as_mut()).unwrap(), 1);
        assert_eq!(next_boot(disk.as_mut()).unwrap(), 2);
        disk.replace(BOOT, b"7 12345\n").unwrap();
        assert!(matches!(next_boot(disk.as_mut()), Err(DiskError::Corrupt(_))));
        disk.replace(BOOT, b"7\n").unwrap(); // the format before the checksum
        assert_eq!(next_boot(disk.as_mut()).unwrap(), 8);
    }
}
