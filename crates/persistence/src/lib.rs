//! Persistence for the key-value protocols (Hermes, CRAQ and ZAB): an append-only file of the keys'
//! durable state, and snapshots that rewrite it, under Redis' names (`appendonly`,
//! `appendfsync`, `save`, `BGSAVE`, `LASTSAVE`, `INFO persistence`). docs/decisions.md
//! ("Persistence in the runtime") explains the design, docs/operations.md how to run it.
//!
//! The protocol cores stay sans-I/O. At the end of every event-loop turn the runtime takes
//! the keys the turn touched (keys of the messages received and about to be sent, of the
//! updates admitted and answered), asks the core for their durable state as one record,
//! appends it, and with `appendfsync always` syncs once before the turn's messages and
//! replies leave: a replica's ACK, forward or reply never precedes its write on disk, and
//! one fsync covers every write of the turn.
//!
//! Files, under `<data_dir>/appendonly/` (Redis 7's multi-part AOF):
//! * `manifest`: which base and incremental files make up the state, replaced atomically;
//! * `base.<gen>`: a snapshot, every key's state, written a slice of keys per turn;
//! * `incr.<gen>`: the records since that snapshot started.
//!
//! Records are state, not commands: loading merges them per key by the protocol's own
//! version (Hermes' timestamps), so a snapshot taken over many turns while writes go on,
//! followed by the records written meanwhile, restores the latest state of every key.
//!
//! No I/O here beyond the [`Storage`] it is given: the server runs it over files
//! (crates/server), the simulator over its faulty disk (`chorus_storage::SimDisk`, in
//! crates/sim/src/managed.rs), so the swarm's storage faults hit the code nodes run.

pub mod craq;
pub mod hermes;
mod manifest;
mod persisted;
pub mod records;
pub mod zab;

pub use persisted::Persisted;

use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use chorus_core::Key;
use chorus_storage::{CrashTestStorage, FileStorage, Storage};

/// What persistence needs of a replica: the durable state of keys, and whether it holds all
/// the data. Every served core has it (the server's `ServedReplica`, the simulator's
/// [`Persisted`] cores); tests use a plain map.
pub trait Durable {
    fn durable_record(&self, keys: &[Key]) -> Option<Vec<u8>>;
    fn durable_keys(&self) -> Vec<Key>;
    fn holds_all_data(&self) -> bool;
    /// A snapshot's first records, before its keys (ZAB: its applied point and history).
    fn snapshot_header(&self) -> Vec<Vec<u8>> {
        Vec::new()
    }
    /// The snapshot's record of `keys`.
    fn snapshot_record(&self, keys: &[Key]) -> Option<Vec<u8>> {
        self.durable_record(keys)
    }
}

use manifest::Manifest;
use records::Kind;

/// A protocol's record payload: one of its own messages, in its wire encoding.
pub fn encode<M: chorus_core::codec::WireMessage>(message: &M) -> Vec<u8> {
    let mut buf = bytes::BytesMut::new();
    message.encode(&mut buf);
    buf.to_vec()
}

/// Decode `records` (oldest first) as messages of `M` and hand each to `load`, which
/// returns how many keys it restored (`None`: not a record of this protocol).
fn decode_each<M: chorus_core::codec::WireMessage>(
    records: Vec<Vec<u8>>,
    mut load: impl FnMut(M) -> Option<usize>,
) -> anyhow::Result<usize> {
    let mut keys = 0;
    for (index, record) in records.into_iter().enumerate() {
        let message = M::decode_exact(bytes::Bytes::from(record))
            .map_err(|error| anyhow::anyhow!("append-only record {index} does not decode: {error}"))?;
        keys += load(message).with_context(|| format!("append-only record {index} is not a key record"))?;
    }
    Ok(keys)
}

/// When the append-only file is synced (Redis' `appendfsync`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AppendFsync {
    /// Before the turn's messages and replies leave: nothing acknowledged is lost.
    Always,
    /// About once a second, in the event loop; messages and replies do not wait.
    Everysec,
    /// Never explicitly: the kernel writes back when it likes (about 30 s on Linux).
    No,
}

impl AppendFsync {
    pub fn name(self) -> &'static str {
        match self {
            AppendFsync::Always => "always",
            AppendFsync::Everysec => "everysec",
            AppendFsync::No => "no",
        }
    }
}

/// Where the files' writes go.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StorageChoice {
    #[default]
    Files,
    /// Process crash tests only (`appendonly_storage = "crash-test"`): unsynced writes live
    /// in the process's memory, so SIGKILL loses exactly what a power cut would.
    CrashTest,
}

/// Redis' `save <seconds> <changes>`: snapshot when both have passed since the last one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SaveRule {
    pub seconds: u64,
    pub changes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PersistenceOptions {
    pub appendonly: bool,
    pub appendfsync: AppendFsync,
    pub save: Vec<SaveRule>,
    pub storage: StorageChoice,
    /// Rewrite (snapshot) once the incremental file passed this size and twice the base's
    /// (Redis' `auto-aof-rewrite-min-size` 64mb, `auto-aof-rewrite-percentage` 100).
    pub rewrite_bytes_min: u64,
}

impl Default for PersistenceOptions {
    fn default() -> Self {
        PersistenceOptions {
            appendonly: true,
            appendfsync: AppendFsync::Always,
            save: vec![
                SaveRule { seconds: 3600, changes: 1 },
                SaveRule { seconds: 300, changes: 100 },
                SaveRule { seconds: 60, changes: 10_000 },
            ],
            storage: StorageChoice::Files,
            rewrite_bytes_min: 64 << 20,
        }
    }
}

/// Keys per record: one turn's keys make one record, long turns a few.
const RECORD_KEYS_MAX: usize = 4096;
/// Keys a snapshot copies per turn: the event loop never stops for a snapshot longer than
/// encoding this many keys takes.
const SNAPSHOT_KEYS_PER_TURN: usize = 2048;
const EVERYSEC: Duration = Duration::from_secs(1);

/// What the files held at start.
pub struct Restored {
    /// The protocol's records, oldest first.
    pub records: Vec<Vec<u8>>,
    /// Whether the node may come back with this data as a full member: it held all the data
    /// when it stopped, and every record it acted on is here (`appendfsync always`, or a
    /// clean stop). Otherwise it rejoins and copies from a peer.
    pub trusted: bool,
    /// Why it is not trusted, for the log.
    pub reason: String,
    /// Every record the node acted on is here (`appendfsync always`, or a clean stop),
    /// whether or not it held all the data: what else it kept on disk in step with these
    /// records (the chain's region) is as sound as they are.
    pub synced: bool,
    /// A checksum caught damage: the files were refused (the node copies from a peer).
    pub refused: bool,
    /// No append-only file was there: the node never ran on this directory. Otherwise it is
    /// a restart, and a node that restores nothing must rejoin and copy, even if its
    /// membership service never wrote a record (a cluster that never changed its view).
    pub fresh: bool,
}

/// Counters and state for `INFO persistence`.
#[derive(Clone, Debug, Default)]
pub struct PersistenceInfo {
    pub appendfsync: &'static str,
    pub dir: String,
    pub changes_since_last_save: u64,
    pub bgsave_in_progress: bool,
    pub last_save_unix: u64,
    pub last_bgsave_ok: bool,
    pub last_write_ok: bool,
    pub snapshots: u64,
    pub records_appended: u64,
    pub syncs: u64,
    pub incr_bytes: u64,
    pub base_bytes: u64,
    pub restored_records: u64,
}

/// Where the time-based rules (`appendfsync everysec`, `save`) read the time.
#[derive(Clone, Copy, Debug)]
enum Clock {
    /// The time since this instant.
    Wall(Instant),
    /// Always zero: no time-based rule ever fires.
    Stopped,
}

impl Clock {
    fn now(&self) -> Duration {
        match self {
            Clock::Wall(origin) => origin.elapsed(),
            Clock::Stopped => Duration::ZERO,
        }
    }
}

struct Snapshot {
    base: String,
    keys: Vec<Key>,
    next: usize,
    bytes: u64,
}

pub struct Persistence {
    storage: Box<dyn Storage + Send>,
    options: PersistenceOptions,
    manifest: Manifest,
    /// The turn's records, appended with one write.
    buf: Vec<u8>,
    unsynced: bool,
    /// When the incremental file was last synced, on `clock`.
    last_sync: Duration,
    complete_logged: Option<bool>,
    snapshot: Option<Snapshot>,
    last_save: Duration,
    clock: Clock,
    info: PersistenceInfo,
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_secs())
}

impl Persistence {
    /// Open `dir` (creating it), load what it holds, and continue its newest file.
    pub fn open(dir: &Path, options: PersistenceOptions) -> anyhow::Result<(Persistence, Restored)> {
        let storage: Box<dyn Storage + Send> = match options.storage {
            StorageChoice::Files => Box::new(FileStorage::open(dir)?),
            StorageChoice::CrashTest => Box::new(CrashTestStorage::open(dir)?),
        };
        Persistence::open_on(storage, dir, options)
    }

    /// [`Persistence::open`] on any storage (the simulator's disk in tests).
    pub fn open_on(
        storage: Box<dyn Storage + Send>,
        dir: &Path,
        options: PersistenceOptions,
    ) -> anyhow::Result<(Persistence, Restored)> {
        let mut persistence = Persistence {
            storage,
            manifest: Manifest::default(),
            buf: Vec::new(),
            unsynced: false,
            last_sync: Duration::ZERO,
            complete_logged: None,
            snapshot: None,
            last_save: Duration::ZERO,
            clock: Clock::Wall(Instant::now()),
            info: PersistenceInfo {
                appendfsync: options.appendfsync.name(),
                dir: dir.display().to_string(),
                last_bgsave_ok: true,
                last_write_ok: true,
                last_save_unix: unix_now(),
                ..PersistenceInfo::default()
            },
            options,
        };
        let restored = match persistence.load() {
            Ok(restored) => restored,
            Err(damage) => {
                // Refuse the damaged files rather than serve from them; they stay on disk
                // for the operator. A new generation starts empty and the node rejoins,
                // copying every key from a peer.
                tracing::error!("{damage}; not using these files: the node rejoins and copies from a peer");
                persistence.start_over()?;
                Restored {
                    records: Vec::new(),
                    trusted: false,
                    reason: damage,
                    synced: false,
                    refused: true,
                    fresh: false,
                }
            }
        };
        persistence.info.restored_records = restored.records.len() as u64;
        Ok((persistence, restored))
    }

    /// Read the manifest and its files; cut a torn tail off the newest file.
    fn load(&mut self) -> Result<Restored, String> {
        let manifest =
            match self.storage.read(manifest::NAME) {
                Ok(None) => None,
                Ok(Some(bytes)) => Some(Manifest::decode(&bytes).map_err(|error| {
                    format!("{} is damaged: {error}", self.storage.describe(manifest::NAME))
                })?),
                Err(error) => {
                    return Err(format!("cannot read {}: {error}", self.storage.describe(manifest::NAME)))
                }
            };
        let Some(manifest) = manifest else {
            self.start_over().map_err(|error| error.to_string())?;
            let reason = "no append-only file yet".to_string();
            return Ok(Restored {
                records: Vec::new(),
                trusted: false,
                reason,
                synced: false,
                refused: false,
                fresh: true,
            });
        };
        let mut data = Vec::new();
        let mut complete = None;
        let mut clean = false;
        let files = manifest.files();
        for (index, name) in files.iter().enumerate() {
            let last = index + 1 == files.len();
            let bytes = self
                .storage
                .read(name)
                .map_err(|error| format!("cannot read {}: {error}", self.storage.describe(name)))?
                .unwrap_or_default();
            let decoded = records::decode(&bytes).map_err(|bad| {
                format!("{} is damaged at byte {}: {}", self.storage.describe(name), bad.offset, bad.reason)
            })?;
            for (kind, payload) in &decoded.records {
                clean = *kind == Kind::Clean;
                match kind {
                    Kind::Data => data.push(payload.to_vec()),
                    Kind::Complete if payload.len() == 2 => {
                        complete = Some((payload[0] == 1, payload[1] == 1))
                    }
                    Kind::Complete | Kind::Clean => {}
                }
            }
            if decoded.valid_bytes < bytes.len() {
                if !last {
                    return Err(format!(
                        "{} ends in a torn record at byte {} but is not the newest file",
                        self.storage.describe(name),
                        decoded.valid_bytes
                    ));
                }
                tracing::warn!(
                    file = %self.storage.describe(name),
                    valid_bytes = decoded.valid_bytes,
                    cut_bytes = bytes.len() - decoded.valid_bytes,
                    "cutting a torn tail (a write the crash interrupted)"
                );
                let cut = self
                    .storage
                    .truncate(name, decoded.valid_bytes as u64)
                    .and_then(|()| self.storage.sync(name));
                cut.map_err(|error| format!("cannot cut {}: {error}", self.storage.describe(name)))?;
            }
            if Some(name.as_str()) == manifest.base.as_deref() {
                self.info.base_bytes = decoded.valid_bytes as u64;
            } else if last {
                self.info.incr_bytes = decoded.valid_bytes as u64;
            }
        }
        self.manifest = manifest;
        let (trusted, reason) = match complete {
            None => (false, "the files do not say whether this node held all the data".to_string()),
            Some((false, _)) => (false, "this node did not hold all the data when it stopped".to_string()),
            Some((true, always)) if !always && !clean => (
                false,
                "appendfsync was not always and the node did not stop cleanly: its last writes may be lost"
                    .to_string(),
            ),
            Some(_) => (true, String::new()),
        };
        let synced = clean || complete.is_some_and(|(_, always)| always);
        Ok(Restored { records: data, trusted, reason, synced, refused: false, fresh: false })
    }

    /// A fresh generation: an empty incremental file, no base. Its number is past every file
    /// in the directory, so files refused as damaged stay for the operator.
    fn start_over(&mut self) -> anyhow::Result<()> {
        let mut generation = self.manifest.generation + 1;
        while self.storage.read(&manifest::incr_name(generation))?.is_some()
            || self.storage.read(&manifest::base_name(generation))?.is_some()
        {
            generation += 1;
        }
        let incr = manifest::incr_name(generation);
        self.manifest = Manifest { generation, base: None, incrs: vec![incr] };
        self.write_manifest()?;
        self.info.incr_bytes = 0;
        self.info.base_bytes = 0;
        Ok(())
    }

    fn write_manifest(&mut self) -> anyhow::Result<()> {
        let bytes = self.manifest.encode();
        self.storage
            .replace(manifest::NAME, &bytes)
            .with_context(|| format!("cannot write {}", self.storage.describe(manifest::NAME)))
    }

    /// Stop the clock `appendfsync everysec` and the `save` rules read (the simulator's: a
    /// seed then replays exactly, its syncs being the explicit ones of each turn).
    pub fn stop_clock(&mut self) {
        self.clock = Clock::Stopped;
    }

    fn since(&self, then: Duration) -> Duration {
        self.clock.now().saturating_sub(then)
    }

    fn current_incr(&self) -> &str {
        self.manifest.incrs.last().expect("a manifest always has an incremental file")
    }

    /// Whether replies must wait for the turn's sync.
    pub fn replies_wait(&self) -> bool {
        self.options.appendonly && self.options.appendfsync == AppendFsync::Always
    }

    /// Records the core itself produced this turn (ZAB's history), logged like the keys'.
    pub fn log_records(&mut self, payloads: Vec<Vec<u8>>) {
        self.info.changes_since_last_save += payloads.len() as u64;
        if !self.options.appendonly {
            return;
        }
        for payload in payloads {
            records::encode(Kind::Data, &payload, &mut self.buf);
            self.info.records_appended += 1;
        }
    }

    /// The end of a turn, before its messages and replies leave: log the state of `keys`
    /// (cleared), and sync as `appendfsync` says. An error must stop the node.
    ///
    /// `defer_sync`: none of the turn's messages and replies needs its records on disk first
    /// (docs/decisions.md 10, "Which syncs a write waits for"): with `appendfsync always` the
    /// records then wait for the next turn that syncs, or a second at most. A turn that logs
    /// whether the replica holds all the data never defers.
    pub fn end_turn<R: Durable>(
        &mut self,
        replica: &R,
        keys: &mut Vec<Key>,
        defer_sync: bool,
    ) -> anyhow::Result<()> {
        if !keys.is_empty() {
            keys.sort_unstable();
            keys.dedup();
            self.info.changes_since_last_save += keys.len() as u64;
            if self.options.appendonly {
                for slice in keys.chunks(RECORD_KEYS_MAX) {
                    if let Some(payload) = replica.durable_record(slice) {
                        records::encode(Kind::Data, &payload, &mut self.buf);
                        self.info.records_appended += 1;
                    }
                }
            }
            keys.clear();
        }
        let complete = replica.holds_all_data();
        let mut defer_sync = defer_sync;
        if self.options.appendonly && self.complete_logged != Some(complete) {
            self.log_complete(complete);
            defer_sync = false;
        }
        let result = self.write_turn(replica, defer_sync);
        self.info.last_write_ok = result.is_ok();
        result
    }

    fn log_complete(&mut self, complete: bool) {
        let always = self.options.appendfsync == AppendFsync::Always;
        records::encode(Kind::Complete, &[complete as u8, always as u8], &mut self.buf);
        self.complete_logged = Some(complete);
    }

    /// WAITAOF: everything appended so far on disk now, whatever `appendfsync` says.
    pub fn sync_now(&mut self) -> anyhow::Result<()> {
        self.flush_buf()?;
        if self.unsynced {
            self.sync_incr()?;
        }
        Ok(())
    }

    fn write_turn<R: Durable>(&mut self, replica: &R, defer_sync: bool) -> anyhow::Result<()> {
        self.flush_buf()?;
        let sync_due = match self.options.appendfsync {
            AppendFsync::Always => !defer_sync || self.since(self.last_sync) >= EVERYSEC,
            AppendFsync::Everysec => self.since(self.last_sync) >= EVERYSEC,
            AppendFsync::No => false,
        };
        if self.unsynced && sync_due {
            self.sync_incr()?;
        }
        self.step_snapshot(replica)?;
        if self.snapshot.is_none() && self.snapshot_due() {
            self.start_snapshot(replica)?;
        }
        Ok(())
    }

    fn flush_buf(&mut self) -> anyhow::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let name = self.current_incr().to_string();
        self.storage
            .append(&name, &self.buf)
            .with_context(|| format!("cannot append to {}", self.storage.describe(&name)))?;
        self.info.incr_bytes += self.buf.len() as u64;
        self.buf.clear();
        self.unsynced = true;
        Ok(())
    }

    fn sync_incr(&mut self) -> anyhow::Result<()> {
        let name = self.current_incr().to_string();
        self.storage.sync(&name).with_context(|| format!("cannot sync {}", self.storage.describe(&name)))?;
        self.unsynced = false;
        self.last_sync = self.clock.now();
        self.info.syncs += 1;
        Ok(())
    }

    fn snapshot_due(&self) -> bool {
        if !self.options.appendonly {
            return false;
        }
        let changes = self.info.changes_since_last_save;
        let elapsed_s = self.since(self.last_save).as_secs();
        let by_rule =
            self.options.save.iter().any(|rule| elapsed_s >= rule.seconds && changes >= rule.changes);
        let incr = self.info.incr_bytes;
        let by_size = incr >= self.options.rewrite_bytes_min && incr >= 2 * self.info.base_bytes;
        by_rule || by_size
    }

    /// `BGSAVE` / `BGREWRITEAOF`: start a snapshot unless one runs.
    pub fn bgsave<R: Durable>(&mut self, replica: &R) -> Result<(), String> {
        if !self.options.appendonly {
            return Err("appendonly is off: nothing is persisted (set appendonly yes)".into());
        }
        if self.snapshot.is_some() {
            return Err("Background save already in progress".into());
        }
        self.start_snapshot(replica).map_err(|error| error.to_string())
    }

    /// A new generation: records go to a new incremental file from now on (listed after the
    /// old ones, so a crash before the snapshot completes loads old base + every incr), and
    /// the keys' states go to the new base a slice per turn.
    fn start_snapshot<R: Durable>(&mut self, replica: &R) -> anyhow::Result<()> {
        self.flush_buf()?;
        if self.unsynced {
            self.sync_incr()?;
        }
        let generation = self.manifest.generation + 1;
        let (base, incr) = (manifest::base_name(generation), manifest::incr_name(generation));
        self.storage.remove(&base)?;
        self.storage.remove(&incr)?;
        self.manifest.generation = generation;
        self.manifest.incrs.push(incr);
        self.write_manifest()?;
        self.info.incr_bytes = 0;
        // The new file starts with where the replica stands.
        if let Some(complete) = self.complete_logged {
            self.log_complete(complete);
        }
        let mut header = Vec::new();
        for payload in replica.snapshot_header() {
            records::encode(Kind::Data, &payload, &mut header);
        }
        let write = self.storage.append(&base, &header);
        let bytes = header.len() as u64;
        self.snapshot = Some(Snapshot { base, keys: replica.durable_keys(), next: 0, bytes });
        self.info.bgsave_in_progress = true;
        self.info.changes_since_last_save = 0;
        self.last_save = self.clock.now();
        if let Err(error) = write {
            return self.abandon_snapshot(error.into());
        }
        tracing::info!(generation, "background save started");
        Ok(())
    }

    fn step_snapshot<R: Durable>(&mut self, replica: &R) -> anyhow::Result<()> {
        let Some(snapshot) = &mut self.snapshot else { return Ok(()) };
        let end = (snapshot.next + SNAPSHOT_KEYS_PER_TURN).min(snapshot.keys.len());
        let mut buf = Vec::new();
        if let Some(payload) = replica.snapshot_record(&snapshot.keys[snapshot.next..end]) {
            records::encode(Kind::Data, &payload, &mut buf);
        }
        snapshot.next = end;
        snapshot.bytes += buf.len() as u64;
        let base = snapshot.base.clone();
        let result = self.storage.append(&base, &buf);
        if let Err(error) = result {
            return self.abandon_snapshot(error.into());
        }
        if self.snapshot.as_ref().is_some_and(|snapshot| snapshot.next == snapshot.keys.len()) {
            return self.finish_snapshot();
        }
        Ok(())
    }

    /// The base is whole: sync it, point the manifest at it and the newest incr, and delete
    /// what they replace (the AOF rewrite).
    fn finish_snapshot(&mut self) -> anyhow::Result<()> {
        let snapshot = self.snapshot.take().expect("a snapshot runs");
        if let Err(error) = self.storage.sync(&snapshot.base) {
            self.snapshot = Some(snapshot);
            return self.abandon_snapshot(error.into());
        }
        let old = self.manifest.clone();
        let incr = self.current_incr().to_string();
        self.manifest =
            Manifest { generation: old.generation, base: Some(snapshot.base.clone()), incrs: vec![incr] };
        self.write_manifest()?;
        for name in old.files().into_iter().filter(|name| !self.manifest.files().contains(name)) {
            if let Err(error) = self.storage.remove(&name) {
                tracing::warn!(file = %self.storage.describe(&name), %error, "cannot remove a rewritten file");
            }
        }
        self.info.base_bytes = snapshot.bytes;
        self.info.snapshots += 1;
        self.info.last_save_unix = unix_now();
        self.info.bgsave_in_progress = false;
        self.info.last_bgsave_ok = true;
        tracing::info!(
            keys = snapshot.keys.len(),
            bytes = snapshot.bytes,
            "background save done, append-only file rewritten"
        );
        Ok(())
    }

    /// A snapshot that cannot be written is given up (the manifest still lists the old base
    /// and every incr, so nothing is lost); the next save rule or BGSAVE tries again.
    fn abandon_snapshot(&mut self, error: anyhow::Error) -> anyhow::Result<()> {
        let snapshot = self.snapshot.take().expect("a snapshot runs");
        tracing::error!(file = %self.storage.describe(&snapshot.base), %error, "background save failed");
        self.info.bgsave_in_progress = false;
        self.info.last_bgsave_ok = false;
        Ok(())
    }

    /// A clean stop: every record synced, then a marker saying so.
    pub fn close(&mut self) -> anyhow::Result<()> {
        if self.options.appendonly {
            records::encode(Kind::Clean, &[], &mut self.buf);
            self.flush_buf()?;
            self.sync_incr()?;
        }
        Ok(())
    }

    pub fn info(&self) -> PersistenceInfo {
        self.info.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory under the system's temporary one, removed when dropped.
    struct Scratch(std::path::PathBuf);

    impl Scratch {
        fn new(name: &str) -> Scratch {
            let dir = std::env::temp_dir().join(format!("chorus-persistence-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            Scratch(dir)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Files as a node leaves them: a manifest and one incremental file of `records`.
    fn write_files(dir: &Path, incr: &[u8]) {
        std::fs::create_dir_all(dir).unwrap();
        let manifest = Manifest { generation: 1, base: None, incrs: vec![manifest::incr_name(1)] };
        std::fs::write(dir.join(manifest::NAME), manifest.encode()).unwrap();
        std::fs::write(dir.join(manifest::incr_name(1)), incr).unwrap();
    }

    fn incr(always: bool, data: &[&[u8]], clean: bool) -> Vec<u8> {
        let mut buf = Vec::new();
        records::encode(Kind::Complete, &[1, always as u8], &mut buf);
        for payload in data {
            records::encode(Kind::Data, payload, &mut buf);
        }
        if clean {
            records::encode(Kind::Clean, &[], &mut buf);
        }
        buf
    }

    fn open(dir: &Path, appendfsync: AppendFsync) -> (Persistence, Restored) {
        let options = PersistenceOptions { appendfsync, ..PersistenceOptions::default() };
        Persistence::open(dir, options).unwrap()
    }

    #[test]
    fn a_torn_tail_is_cut_and_the_rest_restored() {
        let scratch = Scratch::new("torn");
        let whole = incr(true, &[b"one", b"two"], false);
        let mut torn = whole.clone();
        let mut third = Vec::new();
        records::encode(Kind::Data, b"three", &mut third);
        torn.extend_from_slice(&third[..third.len() - 2]);
        write_files(&scratch.0, &torn);
        let (_, restored) = open(&scratch.0, AppendFsync::Always);
        assert!(restored.trusted, "{}", restored.reason);
        assert_eq!(restored.records, vec![b"one".to_vec(), b"two".to_vec()]);
        let on_disk = std::fs::read(scratch.0.join(manifest::incr_name(1))).unwrap();
        assert_eq!(on_disk, whole, "the torn tail is cut off the file");
    }

    #[test]
    fn a_corrupted_record_in_the_middle_is_refused_and_the_node_copies_from_a_peer() {
        let scratch = Scratch::new("corrupt");
        let mut bytes = incr(true, &[b"one", b"two"], false);
        let second_record = incr(true, &[], false).len() + 8 + 1; // inside "one"'s payload
        bytes[second_record] ^= 0x40;
        write_files(&scratch.0, &bytes);
        let (_, restored) = open(&scratch.0, AppendFsync::Always);
        assert!(!restored.trusted);
        assert!(restored.records.is_empty());
        assert!(restored.reason.contains("is damaged at byte"), "{}", restored.reason);
        // The damaged file stays for the operator; the manifest moved on to a new generation.
        assert_eq!(std::fs::read(scratch.0.join(manifest::incr_name(1))).unwrap(), bytes);
        let manifest = Manifest::decode(&std::fs::read(scratch.0.join(manifest::NAME)).unwrap()).unwrap();
        assert_eq!(manifest.incrs, vec![manifest::incr_name(2)]);
    }

    #[test]
    fn without_appendfsync_always_only_a_clean_stop_is_trusted() {
        let scratch = Scratch::new("everysec");
        write_files(&scratch.0, &incr(false, &[b"one"], false));
        let (_, restored) = open(&scratch.0, AppendFsync::Everysec);
        assert!(!restored.trusted);
        assert!(restored.reason.contains("did not stop cleanly"), "{}", restored.reason);

        let scratch = Scratch::new("everysec-clean");
        write_files(&scratch.0, &incr(false, &[b"one"], true));
        let (_, restored) = open(&scratch.0, AppendFsync::Everysec);
        assert!(restored.trusted, "{}", restored.reason);
        assert_eq!(restored.records, vec![b"one".to_vec()]);
    }

    #[test]
    fn a_new_directory_starts_untrusted_and_empty() {
        let scratch = Scratch::new("new");
        let (mut persistence, restored) = open(&scratch.0, AppendFsync::Always);
        assert!(!restored.trusted && restored.records.is_empty());
        persistence.close().unwrap();
        let (_, restored) = open(&scratch.0, AppendFsync::Always);
        // A clean stop, but it never logged that it held all the data.
        assert!(!restored.trusted);
    }
    /// A store of key -> version, persisted as `key=version` lines: enough to check what
    /// survives, without a protocol.
    #[derive(Default)]
    struct Versions(std::collections::BTreeMap<Key, u64>);

    impl Durable for Versions {
        fn durable_record(&self, keys: &[Key]) -> Option<Vec<u8>> {
            let lines: Vec<String> = keys
                .iter()
                .filter_map(|key| self.0.get(key).map(|v| format!("{}={v}", String::from_utf8_lossy(key))))
                .collect();
            (!lines.is_empty()).then(|| lines.join("\n").into_bytes())
        }
        fn durable_keys(&self) -> Vec<Key> {
            self.0.keys().cloned().collect()
        }
        fn holds_all_data(&self) -> bool {
            true
        }
    }

    impl Versions {
        /// Records merge per key by the highest version, as Hermes merges by timestamp.
        fn restore(records: &[Vec<u8>]) -> Versions {
            let mut versions = Versions::default();
            for record in records {
                for line in std::str::from_utf8(record).unwrap().lines() {
                    let (key, version) = line.split_once('=').unwrap();
                    let slot = versions.0.entry(Key::copy_from_slice(key.as_bytes())).or_default();
                    *slot = (*slot).max(version.parse().unwrap());
                }
            }
            versions
        }
    }

    /// A turn whose messages need none of its records on disk first does not sync (the
    /// next turn that syncs covers them), except the turn that logs whether the replica
    /// holds all the data, which trust at restart depends on.
    #[test]
    fn a_deferred_turn_waits_for_the_next_sync() {
        let scratch = Scratch::new("deferred");
        let (mut persistence, _) = open(&scratch.0, AppendFsync::Always);
        let mut store = Versions::default();
        let write = |store: &mut Versions, persistence: &mut Persistence, version: u64, defer: bool| {
            store.0.insert(Key::from("k"), version);
            persistence.end_turn(store, &mut vec![Key::from("k")], defer).unwrap();
            persistence.info().syncs
        };
        assert_eq!(write(&mut store, &mut persistence, 1, true), 1, "the first turn logs Complete");
        assert_eq!(write(&mut store, &mut persistence, 2, true), 1, "deferred");
        assert_eq!(write(&mut store, &mut persistence, 3, false), 2, "one sync covers both turns");
    }

    /// The simulator's storage faults over these files: turns of writes (each acknowledged
    /// once `end_turn` returned), background saves and log rewrites, crashes that lose, keep
    /// or tear every unsynced write, and latent corruption of synced bytes. After each crash
    /// the files are either refused as damaged (the node would copy from a peer) or restore
    /// every acknowledged version and nothing never written.
    #[test]
    fn storage_faults_never_lose_an_acknowledged_write_silently() {
        let mut refused = 0;
        for seed in 0..300u64 {
            let disk = chorus_storage::SimDisk::new();
            let options = PersistenceOptions {
                save: Vec::new(),
                rewrite_bytes_min: 1024,
                ..PersistenceOptions::default()
            };
            let open =
                || Persistence::open_on(Box::new(disk.clone()), Path::new("sim"), options.clone()).unwrap();
            let (mut persistence, _) = open();
            let mut store = Versions::default();
            let mut acknowledged: std::collections::BTreeMap<Key, u64> = Default::default();
            let mut draw = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut next = |bound: u64| {
                draw ^= draw << 13;
                draw ^= draw >> 7;
                draw ^= draw << 17;
                draw % bound
            };
            let mut version = 0;
            for crash in 0..4 {
                for _ in 0..next(60) {
                    let mut keys = Vec::new();
                    for _ in 0..=next(4) {
                        version += 1;
                        let key = Key::from(format!("k{}", next(25)));
                        store.0.insert(key.clone(), version);
                        keys.push(key);
                    }
                    let touched = keys.clone();
                    persistence.end_turn(&store, &mut keys, false).unwrap();
                    for key in touched {
                        acknowledged.insert(key.clone(), store.0[&key]);
                    }
                    if next(20) == 0 {
                        let _ = persistence.bgsave(&store);
                    }
                }
                drop(persistence);
                disk.crash(seed * 7 + crash);
                let corrupted = next(4) == 0 && disk.corrupt(seed * 13 + crash).is_some();
                let (reopened, restored) = open();
                persistence = reopened;
                if !restored.trusted && !restored.reason.contains("damaged") {
                    // Crashed before its first turn: nothing says it held the data (a node
                    // in that state copies from a peer), and nothing was acknowledged.
                    assert!(acknowledged.is_empty(), "seed {seed}: {}", restored.reason);
                    assert!(restored.reason.contains("do not say"), "seed {seed}: {}", restored.reason);
                    continue;
                }
                if !restored.trusted {
                    assert!(corrupted, "seed {seed}: refused without corruption: {}", restored.reason);
                    refused += 1;
                    // Repaired from a peer: it copies the peer's state (here, what was
                    // acknowledged), logging the copied keys as it goes.
                    store = Versions(acknowledged.clone());
                    persistence.end_turn(&store, &mut store.durable_keys(), false).unwrap();
                    continue;
                }
                store = Versions::restore(&restored.records);
                for (key, acked) in &acknowledged {
                    let kept = store.0.get(key).copied().unwrap_or(0);
                    assert!(kept >= *acked, "seed {seed}: {key:?} acknowledged at {acked}, restored {kept}");
                }
                assert!(
                    store.0.values().all(|kept| *kept <= version),
                    "seed {seed}: a version never written"
                );
            }
        }
        assert!(refused > 0, "no corruption was ever caught: the sweep does not exercise it");
    }
}
