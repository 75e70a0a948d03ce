//! Registered memory regions: the memory HyperLoop's group primitives operate on.
//!
//! A tenant registers a named region of a given size with a [`RegionStore`] (one per node,
//! under the node's data directory; `/dev/shm` by default, the papers' stand-in for
//! battery-backed DRAM). A region is a file mapped with `mmap`, so the tenant's own process
//! can map the same file to read it while the node executes group operations on it.
//!
//! Every access is bounds-checked and returns a [`RegionError`], never panics:
//! [`Region::write`], [`Region::read`], [`Region::memcpy`] (overlapping ranges allowed,
//! `memmove` semantics) and [`Region::cas`] (8-byte compare-and-swap at an 8-byte aligned
//! offset, atomic with respect to other processes mapping the file).
//!
//! [`Region::flush`] makes every byte written since the previous flush durable, as far as the
//! region's [`FlushBackend`] can:
//!
//! | backend | what is durable when `flush` returns |
//! |---|---|
//! | `msync` (default) | the dirty pages were written back (`msync(MS_SYNC)`) to the file's backing store. On `/dev/shm` (tmpfs) that store is RAM: the data survives the node process crashing, not the machine losing power, which is what the papers assume of battery-backed DRAM. On a disk-backed file system it survives power loss once the device honours the flush. |
//! | `clwb` | every cache line written was written back with `clwb` and ordered with `sfence`, on a DAX mapping created with `MAP_SYNC`: the bytes are in the persistence domain of the persistent memory (ADR), and file-system metadata needed to reach them is already durable. |
//! | `none` | nothing beyond the writes being visible in memory: a volatile run. |

use std::fmt;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::MmapMut;

mod dax;

pub use dax::clwb_supported_by_cpu;

/// The largest region a store accepts (1 TiB): a guard against typos, not a design limit.
pub const REGION_BYTES_MAX: u64 = 1 << 40;
/// The longest region name.
pub const REGION_NAME_BYTES_MAX: usize = 64;
/// Cache line size assumed by the `clwb` backend.
pub const CACHE_LINE_BYTES: usize = 64;

/// A tenant: the owner of regions and groups (HyperLoop §7: a member only accepts operations
/// on regions of the tenant the caller's token belongs to).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct TenantId(pub u32);

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tenant-{}", self.0)
    }
}

/// How [`Region::flush`] makes data durable.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum FlushBackend {
    /// `msync(MS_SYNC)` of the dirty range of a shared file mapping.
    #[default]
    Msync,
    /// `clwb` of every dirty cache line then `sfence`, on a DAX file mapped with `MAP_SYNC`.
    /// Refused at start unless the CPU has `clwb` and the directory is on a DAX file system.
    Clwb,
    /// No flushing: volatile runs and benchmarks of the network path alone.
    None,
}

impl FlushBackend {
    pub fn name(self) -> &'static str {
        match self {
            FlushBackend::Msync => "msync",
            FlushBackend::Clwb => "clwb",
            FlushBackend::None => "none",
        }
    }
}

impl fmt::Display for FlushBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for FlushBackend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "msync" => Ok(FlushBackend::Msync),
            "clwb" => Ok(FlushBackend::Clwb),
            "none" => Ok(FlushBackend::None),
            other => Err(format!("unknown flush backend `{other}`, expected one of msync, clwb, none")),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RegionError {
    #[error("range of {len} bytes at offset {offset} is outside the region of {size} bytes")]
    OutOfBounds { offset: u64, len: u64, size: u64 },
    #[error("offset {offset} is not 8-byte aligned (compare-and-swap works on aligned 8-byte words)")]
    Misaligned { offset: u64 },
    #[error("invalid region name {0:?}: use 1-64 characters from [A-Za-z0-9_.-], not starting with '.'")]
    InvalidName(String),
    #[error("region size {size} is invalid: it must be between 1 and {REGION_BYTES_MAX} bytes")]
    InvalidSize { size: u64 },
    #[error("region `{name}` already exists with {existing} bytes, not the {requested} requested")]
    SizeMismatch { name: String, existing: u64, requested: u64 },
    #[error("flush backend `{backend}` is not available: {reason}")]
    BackendUnavailable { backend: FlushBackend, reason: String },
    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },
}

impl RegionError {
    fn io(context: impl Into<String>, source: std::io::Error) -> RegionError {
        RegionError::Io { context: context.into(), source }
    }
}

/// Check that `len` bytes at `offset` fit in a region of `size` bytes, and return the range as
/// `usize`s. The one bounds check every access goes through.
pub fn check_range(offset: u64, len: u64, size: u64) -> Result<(usize, usize), RegionError> {
    match offset.checked_add(len) {
        Some(end) if end <= size => {
            // size fits in usize because it is the length of a mapping.
            Ok((offset as usize, end as usize))
        }
        _ => Err(RegionError::OutOfBounds { offset, len, size }),
    }
}

/// Check an 8-byte word access (compare-and-swap, lock words).
pub fn check_word(offset: u64, size: u64) -> Result<usize, RegionError> {
    if !offset.is_multiple_of(8) {
        return Err(RegionError::Misaligned { offset });
    }
    Ok(check_range(offset, 8, size)?.0)
}

fn check_name(name: &str) -> Result<(), RegionError> {
    let ok = !name.is_empty()
        && name.len() <= REGION_NAME_BYTES_MAX
        && !name.starts_with('.')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(RegionError::InvalidName(name.to_string()))
    }
}

/// The memory a group member operates on. Implemented by [`Region`]; the group simulator
/// implements it with a model that also tracks what a crash would keep.
pub trait RegionMemory {
    /// Size in bytes.
    fn size(&self) -> u64;
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), RegionError>;
    fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), RegionError>;
    /// Copy `len` bytes from `src` to `dst` within the region; the ranges may overlap.
    fn memcpy(&mut self, src: u64, dst: u64, len: u64) -> Result<(), RegionError>;
    /// If the 8-byte little-endian word at `offset` equals `old`, replace it with `new`.
    /// Returns the original value either way.
    fn cas(&mut self, offset: u64, old: u64, new: u64) -> Result<u64, RegionError>;
    /// Make every write since the previous flush durable (see the crate docs per backend).
    fn flush(&mut self) -> Result<(), RegionError>;

    /// For memory whose flushes wait for the runtime ([`TurnFlush`]): do the flushes asked for
    /// since the last call, as one, when its policy says so or `force` (a clean stop). Others
    /// flush when asked and have nothing to do here.
    fn sync_turn(&mut self, _force: bool) -> Result<(), RegionError> {
        Ok(())
    }

    /// Whether a flush was asked for and not done yet ([`RegionMemory::sync_turn`] would do it).
    fn flush_pending(&self) -> bool {
        false
    }

    fn read_vec(&self, offset: u64, len: u64) -> Result<Vec<u8>, RegionError> {
        check_range(offset, len, self.size())?;
        let mut buf = vec![0u8; len as usize];
        self.read(offset, &mut buf)?;
        Ok(buf)
    }

    fn load_u64(&self, offset: u64) -> Result<u64, RegionError> {
        check_word(offset, self.size())?;
        let mut word = [0u8; 8];
        self.read(offset, &mut word)?;
        Ok(u64::from_le_bytes(word))
    }
}

/// A boxed region (a runtime choosing its region's backing at start) is one too.
impl<M: RegionMemory + ?Sized> RegionMemory for Box<M> {
    fn size(&self) -> u64 {
        (**self).size()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), RegionError> {
        (**self).read(offset, buf)
    }
    fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), RegionError> {
        (**self).write(offset, data)
    }
    fn memcpy(&mut self, src: u64, dst: u64, len: u64) -> Result<(), RegionError> {
        (**self).memcpy(src, dst, len)
    }
    fn cas(&mut self, offset: u64, old: u64, new: u64) -> Result<u64, RegionError> {
        (**self).cas(offset, old, new)
    }
    fn flush(&mut self) -> Result<(), RegionError> {
        (**self).flush()
    }
    fn sync_turn(&mut self, force: bool) -> Result<(), RegionError> {
        (**self).sync_turn(force)
    }
    fn flush_pending(&self) -> bool {
        (**self).flush_pending()
    }
}

/// A region whose flushes are batched by the runtime (issue 24: "syncs batched per turn"): a
/// [`RegionMemory::flush`] only notes that the writes so far must be durable before whatever
/// depends on them leaves, and [`RegionMemory::sync_turn`], which the runtime calls once per
/// event-loop turn before the turn's messages and replies leave, flushes the inner memory once
/// for all of them. A group member's "flush, then forward" holds as long as the forward is one
/// of the turn's messages, which is how the event loop sends them.
pub struct TurnFlush<M: RegionMemory> {
    inner: M,
    pending: bool,
    syncs: u64,
    policy: SyncPolicy,
    last_sync: std::time::Instant,
}

/// When [`TurnFlush`] flushes (Redis' `appendfsync`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncPolicy {
    /// At the end of every turn that asked for it, before its messages leave (`always`).
    EveryTurn,
    /// At most once per period; messages do not wait for it (`everysec`).
    Every(std::time::Duration),
    /// Only when forced (a clean stop); the kernel writes back when it likes (`no`).
    Never,
}

impl<M: RegionMemory> TurnFlush<M> {
    pub fn new(inner: M) -> TurnFlush<M> {
        TurnFlush::with_policy(inner, SyncPolicy::EveryTurn)
    }
    pub fn with_policy(inner: M, policy: SyncPolicy) -> TurnFlush<M> {
        TurnFlush { inner, pending: false, syncs: 0, policy, last_sync: std::time::Instant::now() }
    }
    pub fn inner(&self) -> &M {
        &self.inner
    }
    pub fn inner_mut(&mut self) -> &mut M {
        &mut self.inner
    }
    /// Flushes of the inner memory done so far.
    pub fn syncs(&self) -> u64 {
        self.syncs
    }
}

impl<M: RegionMemory> RegionMemory for TurnFlush<M> {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), RegionError> {
        self.inner.read(offset, buf)
    }
    fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), RegionError> {
        self.inner.write(offset, data)
    }
    fn memcpy(&mut self, src: u64, dst: u64, len: u64) -> Result<(), RegionError> {
        self.inner.memcpy(src, dst, len)
    }
    fn cas(&mut self, offset: u64, old: u64, new: u64) -> Result<u64, RegionError> {
        self.inner.cas(offset, old, new)
    }
    fn flush(&mut self) -> Result<(), RegionError> {
        self.pending = true;
        Ok(())
    }
    fn sync_turn(&mut self, force: bool) -> Result<(), RegionError> {
        let due = force
            || match self.policy {
                SyncPolicy::EveryTurn => true,
                SyncPolicy::Every(period) => self.last_sync.elapsed() >= period,
                SyncPolicy::Never => false,
            };
        if !self.pending || !due {
            return Ok(());
        }
        self.pending = false;
        self.syncs += 1;
        self.last_sync = std::time::Instant::now();
        self.inner.flush()
    }
    fn flush_pending(&self) -> bool {
        self.pending
    }
}

enum Backing {
    Mmap(MmapMut),
    Dax(dax::DaxMap),
    Heap(Vec<u8>),
    /// The simulator's: memory, and apart from it what a crash would keep (the bytes as of
    /// each flush).
    Simulated {
        bytes: Vec<u8>,
        durable: Vec<u8>,
    },
}

/// One registered region.
pub struct Region {
    tenant: TenantId,
    name: String,
    path: Option<PathBuf>,
    backend: FlushBackend,
    backing: Backing,
    /// Bytes written since the last flush: `[low, high)`, empty when `low >= high`.
    dirty_low: usize,
    dirty_high: usize,
    flushes: u64,
}

impl fmt::Debug for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Region")
            .field("tenant", &self.tenant)
            .field("name", &self.name)
            .field("path", &self.path)
            .field("backend", &self.backend)
            .field("size", &self.size())
            .finish()
    }
}

impl Region {
    /// A heap-backed region with no file and no durability (tests and volatile runs).
    pub fn volatile(tenant: TenantId, name: &str, size: u64) -> Result<Region, RegionError> {
        check_name(name)?;
        if size == 0 || size > REGION_BYTES_MAX {
            return Err(RegionError::InvalidSize { size });
        }
        let bytes = usize::try_from(size).map_err(|_| RegionError::InvalidSize { size })?;
        Ok(Region::with_backing(tenant, name, None, FlushBackend::None, Backing::Heap(vec![0u8; bytes])))
    }

    /// A heap-backed region that remembers what a crash would keep: every write is in memory
    /// at once and durable at the next [`Region::flush`] (the simulator's regions; see
    /// [`Region::crash_image`]).
    pub fn simulated(tenant: TenantId, name: &str, size: u64) -> Result<Region, RegionError> {
        check_name(name)?;
        if size == 0 || size > REGION_BYTES_MAX {
            return Err(RegionError::InvalidSize { size });
        }
        let bytes = usize::try_from(size).map_err(|_| RegionError::InvalidSize { size })?;
        let backing = Backing::Simulated { bytes: vec![0u8; bytes], durable: vec![0u8; bytes] };
        Ok(Region::with_backing(tenant, name, None, FlushBackend::Msync, backing))
    }

    /// `size` bytes at `offset` of memory another component owns and shares through `fd`
    /// (e.g. a slot of the kernel data path's BPF array, which the XDP program writes): mapped
    /// shared, with no flush backend (nothing of it is a file to write back). `offset` must be
    /// page-aligned; the mapping keeps the memory alive after `fd` is closed. [`Region::cas`]
    /// on it is atomic with respect to every other writer of the same memory.
    pub fn map_shared(
        tenant: TenantId,
        name: &str,
        fd: std::os::fd::BorrowedFd<'_>,
        offset: u64,
        size: u64,
    ) -> Result<Region, RegionError> {
        use std::os::fd::AsRawFd;
        check_name(name)?;
        let len = usize::try_from(size).ok().filter(|len| *len > 0 && size <= REGION_BYTES_MAX);
        let len = len.ok_or(RegionError::InvalidSize { size })?;
        // SAFETY: a shared mapping of memory that other writers (the kernel) change while it
        // is mapped, which every access tolerates as it does another process writing a mapped
        // region file: bytes are copied out, and the words CASed are atomics.
        let map = unsafe { memmap2::MmapOptions::new().offset(offset).len(len).map_mut(fd.as_raw_fd()) }
            .map_err(|e| RegionError::io(format!("mapping region `{name}`"), e))?;
        Ok(Region::with_backing(tenant, name, None, FlushBackend::None, Backing::Mmap(map)))
    }

    /// What a crash would leave of this region: for a simulated region, its bytes as of the
    /// last flush; for every other kind, its bytes (a mapping survives the process).
    pub fn crash_image(&self) -> &[u8] {
        match &self.backing {
            Backing::Simulated { durable, .. } => durable,
            _ => self.as_bytes(),
        }
    }

    fn with_backing(
        tenant: TenantId,
        name: &str,
        path: Option<PathBuf>,
        backend: FlushBackend,
        backing: Backing,
    ) -> Region {
        Region {
            tenant,
            name: name.to_string(),
            path,
            backend,
            backing,
            dirty_low: usize::MAX,
            dirty_high: 0,
            flushes: 0,
        }
    }

    pub fn tenant(&self) -> TenantId {
        self.tenant
    }
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The backing file, if any (the tenant's process maps it to read).
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }
    pub fn backend(&self) -> FlushBackend {
        self.backend
    }
    /// How many flushes reached the backend (for stats and tests).
    pub fn flushes(&self) -> u64 {
        self.flushes
    }

    /// The whole region, read-only.
    pub fn as_bytes(&self) -> &[u8] {
        match &self.backing {
            Backing::Mmap(map) => map,
            Backing::Dax(map) => map.as_slice(),
            Backing::Heap(bytes) | Backing::Simulated { bytes, .. } => bytes,
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        match &mut self.backing {
            Backing::Mmap(map) => map,
            Backing::Dax(map) => map.as_mut_slice(),
            Backing::Heap(bytes) | Backing::Simulated { bytes, .. } => bytes,
        }
    }

    fn mark_dirty(&mut self, start: usize, end: usize) {
        if start < end && self.backend != FlushBackend::None {
            self.dirty_low = self.dirty_low.min(start);
            self.dirty_high = self.dirty_high.max(end);
        }
    }

    /// Flush the whole region, whoever wrote it: through this mapping or through another
    /// mapping of the same file (a group host's, whose flushes follow its own policy). Nothing
    /// to do without a flush backend.
    pub fn flush_all(&mut self) -> Result<(), RegionError> {
        let len = self.as_bytes().len();
        if self.backend == FlushBackend::None || len == 0 {
            return Ok(());
        }
        self.dirty_low = 0;
        self.dirty_high = len;
        self.flush()
    }

    /// Bytes written and not yet flushed, as `(offset, len)`.
    pub fn dirty_range(&self) -> Option<(usize, usize)> {
        (self.dirty_low < self.dirty_high).then(|| (self.dirty_low, self.dirty_high - self.dirty_low))
    }
}

impl RegionMemory for Region {
    fn size(&self) -> u64 {
        self.as_bytes().len() as u64
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), RegionError> {
        let (start, end) = check_range(offset, buf.len() as u64, self.size())?;
        buf.copy_from_slice(&self.as_bytes()[start..end]);
        Ok(())
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), RegionError> {
        let (start, end) = check_range(offset, data.len() as u64, self.size())?;
        self.bytes_mut()[start..end].copy_from_slice(data);
        self.mark_dirty(start, end);
        Ok(())
    }

    fn memcpy(&mut self, src: u64, dst: u64, len: u64) -> Result<(), RegionError> {
        let size = self.size();
        let (src_start, src_end) = check_range(src, len, size)?;
        let (dst_start, dst_end) = check_range(dst, len, size)?;
        self.bytes_mut().copy_within(src_start..src_end, dst_start);
        self.mark_dirty(dst_start, dst_end);
        Ok(())
    }

    fn cas(&mut self, offset: u64, old: u64, new: u64) -> Result<u64, RegionError> {
        let at = check_word(offset, self.size())?;
        let original = match &mut self.backing {
            Backing::Heap(bytes) | Backing::Simulated { bytes, .. } => {
                // Exclusive access through `&mut self` and no other process can see a heap
                // region, so a plain read-compare-write is atomic enough.
                let word = &mut bytes[at..at + 8];
                let current = u64::from_le_bytes(word.try_into().unwrap_or([0; 8]));
                if current == old {
                    word.copy_from_slice(&new.to_le_bytes());
                }
                current
            }
            Backing::Mmap(map) => atomic_cas(&mut map[..], at, old, new),
            Backing::Dax(map) => atomic_cas(map.as_mut_slice(), at, old, new),
        };
        if original == old {
            self.mark_dirty(at, at + 8);
        }
        Ok(original)
    }

    fn flush(&mut self) -> Result<(), RegionError> {
        let Some((offset, len)) = self.dirty_range() else {
            return Ok(());
        };
        match &mut self.backing {
            Backing::Mmap(map) => map
                .flush_range(offset, len)
                .map_err(|e| RegionError::io(format!("msync of region `{}`", self.name), e))?,
            Backing::Dax(map) => map.clwb_range(offset, len),
            Backing::Heap(_) => {}
            Backing::Simulated { bytes, durable } => {
                durable[offset..offset + len].copy_from_slice(&bytes[offset..offset + len])
            }
        }
        self.dirty_low = usize::MAX;
        self.dirty_high = 0;
        self.flushes += 1;
        Ok(())
    }
}

/// Compare-and-swap the little-endian word at `at` of a page-aligned mapping, atomically with
/// respect to every other process mapping the same file.
fn atomic_cas(bytes: &mut [u8], at: usize, old: u64, new: u64) -> u64 {
    debug_assert!(at.is_multiple_of(8) && at + 8 <= bytes.len());
    let ptr = bytes[at..at + 8].as_mut_ptr();
    if !(ptr as usize).is_multiple_of(std::mem::align_of::<AtomicU64>()) {
        // Cannot happen for a mapping (page-aligned base, aligned offset); stay correct anyway.
        let current = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or([0; 8]));
        if current == old {
            bytes[at..at + 8].copy_from_slice(&new.to_le_bytes());
        }
        return current;
    }
    // SAFETY: `ptr` points to 8 bytes inside the mapping (bounds checked above and by the
    // slice index), is aligned for AtomicU64 (checked just above), and stays valid for the
    // duration of this call because `bytes` is borrowed mutably. Other processes may access the
    // same bytes concurrently, which is exactly why an atomic is used instead of plain loads.
    let word = unsafe { AtomicU64::from_ptr(ptr.cast::<u64>()) };
    // Values are little-endian in the region; on big-endian hosts convert.
    match word.compare_exchange(old.to_le(), new.to_le(), Ordering::SeqCst, Ordering::SeqCst) {
        Ok(previous) | Err(previous) => u64::from_le(previous),
    }
}

/// The regions of one node, as files under one directory, with one flush backend.
#[derive(Debug)]
pub struct RegionStore {
    dir: PathBuf,
    backend: FlushBackend,
}

/// Create `dir` and missing parents with mode 0700 (existing ones are left as they are).
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

impl RegionStore {
    /// Open (creating it if missing) the directory that holds this node's regions, and check
    /// that `backend` works there. The `clwb` backend is refused unless the CPU has `clwb`
    /// and the directory is on a file system that supports DAX mappings with `MAP_SYNC`.
    pub fn open(dir: impl Into<PathBuf>, backend: FlushBackend) -> Result<RegionStore, RegionError> {
        let dir = dir.into();
        create_private_dir(&dir)
            .map_err(|e| RegionError::io(format!("creating region directory {}", dir.display()), e))?;
        if backend == FlushBackend::Clwb {
            dax::check_support(&dir)?;
        }
        Ok(RegionStore { dir, backend })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
    pub fn backend(&self) -> FlushBackend {
        self.backend
    }

    fn path_of(&self, tenant: TenantId, name: &str) -> PathBuf {
        self.dir.join(format!("{tenant}")).join(format!("{name}.region"))
    }

    /// Register `name` for `tenant`: create a zero-filled file of `size` bytes and map it, or
    /// map the existing one (its contents survive a node restart) if it has exactly that size.
    pub fn register(&self, tenant: TenantId, name: &str, size: u64) -> Result<Region, RegionError> {
        check_name(name)?;
        if size == 0 || size > REGION_BYTES_MAX || usize::try_from(size).is_err() {
            return Err(RegionError::InvalidSize { size });
        }
        let path = self.path_of(tenant, name);
        if let Some(parent) = path.parent() {
            create_private_dir(parent)
                .map_err(|e| RegionError::io(format!("creating {}", parent.display()), e))?;
        }
        let mut options = OpenOptions::new();
        options.read(true).write(true).create(true).truncate(false);
        // A region holds a tenant's data: readable and writable by this user only.
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let file =
            options.open(&path).map_err(|e| RegionError::io(format!("opening {}", path.display()), e))?;
        let existing =
            file.metadata().map_err(|e| RegionError::io(format!("stat {}", path.display()), e))?.len();
        if existing == 0 {
            file.set_len(size).map_err(|e| RegionError::io(format!("sizing {}", path.display()), e))?;
        } else if existing != size {
            return Err(RegionError::SizeMismatch { name: name.to_string(), existing, requested: size });
        }
        let backing = self.map(&file, &path, size)?;
        Ok(Region::with_backing(tenant, name, Some(path), self.backend, backing))
    }

    fn map(&self, file: &File, path: &Path, size: u64) -> Result<Backing, RegionError> {
        match self.backend {
            FlushBackend::Clwb => Ok(Backing::Dax(dax::DaxMap::map(file, size as usize).map_err(|e| {
                RegionError::BackendUnavailable {
                    backend: FlushBackend::Clwb,
                    reason: format!("mapping {} with MAP_SYNC failed: {e}", path.display()),
                }
            })?)),
            FlushBackend::Msync | FlushBackend::None => {
                // SAFETY: the file is owned by this store (created under its directory); other
                // processes (the tenant) may map it too, which is the purpose of a region: all
                // mutation goes through bounds-checked copies and atomics, never references
                // handed out across processes. Truncation by another process would fault; the
                // node never truncates a registered region.
                let map = unsafe { MmapMut::map_mut(file) }
                    .map_err(|e| RegionError::io(format!("mapping {}", path.display()), e))?;
                Ok(Backing::Mmap(map))
            }
        }
    }

    /// Remove a region's file (after its groups are gone).
    pub fn remove(&self, tenant: TenantId, name: &str) -> Result<(), RegionError> {
        check_name(name)?;
        let path = self.path_of(tenant, name);
        std::fs::remove_file(&path).map_err(|e| RegionError::io(format!("removing {}", path.display()), e))
    }
}

/// A read-only mapping of a region file: how the tenant's own process looks at a region the
/// node operates on (it is never on the critical path; it never writes).
pub struct RegionView {
    path: PathBuf,
    map: memmap2::Mmap,
}

impl fmt::Debug for RegionView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegionView").field("path", &self.path).field("size", &self.map.len()).finish()
    }
}

impl RegionView {
    /// Map `path` (a region file, see [`Region::path`]) read-only.
    pub fn open(path: impl Into<PathBuf>) -> Result<RegionView, RegionError> {
        let path = path.into();
        let file =
            File::open(&path).map_err(|e| RegionError::io(format!("opening {}", path.display()), e))?;
        // SAFETY: a read-only shared mapping of a region file. The node writes the file through
        // its own mapping concurrently; this view only copies bytes out (never hands out
        // references that outlive a read), so a concurrent write can at worst make one read
        // observe a mix of old and new bytes, which is the documented behaviour of lock-free
        // reads. The node never truncates a registered region.
        let map = unsafe { memmap2::Mmap::map(&file) }
            .map_err(|e| RegionError::io(format!("mapping {}", path.display()), e))?;
        Ok(RegionView { path, map })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn size(&self) -> u64 {
        self.map.len() as u64
    }
    /// Copy `len` bytes at `offset` out of the mapping.
    pub fn read_vec(&self, offset: u64, len: u64) -> Result<Vec<u8>, RegionError> {
        let (start, end) = check_range(offset, len, self.size())?;
        Ok(self.map[start..end].to_vec())
    }
    /// The 8-byte little-endian word at an aligned `offset`.
    pub fn load_u64(&self, offset: u64) -> Result<u64, RegionError> {
        let at = check_word(offset, self.size())?;
        let mut word = [0u8; 8];
        word.copy_from_slice(&self.map[at..at + 8]);
        Ok(u64::from_le_bytes(word))
    }
}

/// Where regions live when the operator does not say: `/dev/shm/chorus-regions` when
/// `/dev/shm` is a writable directory, else the system temp directory.
pub fn default_region_dir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    let writable = std::fs::metadata(shm).map(|m| m.is_dir() && !m.permissions().readonly()).unwrap_or(false);
    if writable {
        shm.join("chorus-regions")
    } else {
        std::env::temp_dir().join("chorus-regions")
    }
}

#[cfg(test)]
mod tests;
