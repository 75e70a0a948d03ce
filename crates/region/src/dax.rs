//! The `clwb` + `sfence` backend: a DAX file mapped with `MAP_SYNC`, flushed line by line.
//!
//! `MAP_SYNC` (Linux 4.15+, only with `MAP_SHARED_VALIDATE`) guarantees that once a store to
//! the mapping is written back from the CPU caches, the file-system metadata needed to reach it
//! is durable too, so user space can make data durable with cache-line write-backs alone. The
//! kernel refuses `MAP_SYNC` (`EOPNOTSUPP`) on anything that is not DAX, e.g. tmpfs or a page-
//! cache-backed ext4, which is how [`check_support`] detects an unusable directory.

use std::fs::File;
use std::path::Path;

use crate::{FlushBackend, RegionError, CACHE_LINE_BYTES};

/// Does this CPU implement `clwb` (CPUID leaf 7, sub-leaf 0, EBX bit 24)?
pub fn clwb_supported_by_cpu() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // `cpuid` exists on every x86_64 CPU.
        #[allow(unused_unsafe)]
        // SAFETY: CPUID is available on all x86_64 processors; leaf 0 reports the highest leaf,
        // and leaf 7 is only queried when it exists. The intrinsic has no memory effects.
        let (max_leaf, ebx7) = unsafe {
            let max_leaf = std::arch::x86_64::__cpuid(0).eax;
            let ebx7 = if max_leaf >= 7 { std::arch::x86_64::__cpuid_count(7, 0).ebx } else { 0 };
            (max_leaf, ebx7)
        };
        max_leaf >= 7 && ebx7 & (1 << 24) != 0
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

fn unavailable(reason: String) -> RegionError {
    RegionError::BackendUnavailable { backend: FlushBackend::Clwb, reason }
}

/// Refuse the `clwb` backend unless the CPU has `clwb` and `dir` supports `MAP_SYNC` mappings.
pub fn check_support(dir: &Path) -> Result<(), RegionError> {
    if !clwb_supported_by_cpu() {
        return Err(unavailable("this CPU has no clwb instruction; use --flush msync".to_string()));
    }
    let probe_path = dir.join(format!(".dax-probe-{}", std::process::id()));
    let result = (|| {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&probe_path)
            .map_err(|e| RegionError::io(format!("creating {}", probe_path.display()), e))?;
        file.set_len(4096).map_err(|e| RegionError::io(format!("sizing {}", probe_path.display()), e))?;
        DaxMap::map(&file, 4096).map(drop).map_err(|e| {
            unavailable(format!(
                "{} is not on a DAX file system (mmap with MAP_SYNC failed: {e}); mount persistent \
                 memory with -o dax, or use --flush msync",
                dir.display()
            ))
        })
    })();
    let _ = std::fs::remove_file(&probe_path);
    result
}

/// A shared `MAP_SYNC` mapping of a whole file.
pub(crate) struct DaxMap {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: DaxMap owns its mapping exclusively (like memmap2::MmapMut); the raw pointer is only
// dereferenced through `&self`/`&mut self` borrows, so moving it across threads is sound.
unsafe impl Send for DaxMap {}
// SAFETY: shared access only hands out `&[u8]`, mutation needs `&mut self`.
unsafe impl Sync for DaxMap {}

impl DaxMap {
    #[cfg(target_os = "linux")]
    pub(crate) fn map(file: &File, len: usize) -> Result<DaxMap, std::io::Error> {
        use std::os::fd::AsRawFd;
        if len == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty mapping"));
        }
        // SAFETY: a fresh mapping (address chosen by the kernel) of `len` bytes of an open file
        // descriptor; the result is checked against MAP_FAILED before use.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED_VALIDATE | libc::MAP_SYNC,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(DaxMap { ptr: ptr.cast::<u8>(), len })
    }

    #[cfg(not(target_os = "linux"))]
    pub(crate) fn map(_file: &File, _len: usize) -> Result<DaxMap, std::io::Error> {
        Err(std::io::Error::new(std::io::ErrorKind::Unsupported, "MAP_SYNC needs Linux"))
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is a live mapping of `len` readable bytes until Drop.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` is a live mapping of `len` writable bytes until Drop, borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// Write back every cache line overlapping `[offset, offset + len)`, then `sfence`.
    /// Only reachable after [`check_support`] confirmed the CPU has `clwb`.
    pub(crate) fn clwb_range(&mut self, offset: usize, len: usize) {
        let end = offset.saturating_add(len).min(self.len);
        let mut line = offset - offset % CACHE_LINE_BYTES;
        while line < end {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `line < self.len`, so the address is inside the live mapping; clwb only
            // writes the line back (it neither reads nor modifies memory as seen by the program),
            // and the CPU supports it (checked by `check_support` before any DaxMap is flushed).
            unsafe {
                std::arch::asm!("clwb [{0}]", in(reg) self.ptr.add(line), options(nostack, preserves_flags));
            }
            line += CACHE_LINE_BYTES;
        }
        #[cfg(target_arch = "x86_64")]
        // SAFETY: sfence has no operands and no preconditions on x86_64 (SSE is baseline).
        unsafe {
            std::arch::x86_64::_mm_sfence();
        }
    }
}

impl Drop for DaxMap {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        // SAFETY: unmapping exactly the mapping created in `map`; no slices outlive `self`.
        unsafe {
            libc::munmap(self.ptr.cast::<libc::c_void>(), self.len);
        }
    }
}
