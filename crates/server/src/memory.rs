//! How much memory the node uses, for INFO's `used_memory` and `maxmemory`.
//!
//! The figure is the allocator's: bytes handed out by `malloc` and not yet freed (glibc's
//! `mallinfo2`: `uordblks`, the arenas' chunks in use, plus `hblkhd`, chunks mapped on their
//! own). It counts keys and values with their overhead, and also connection buffers, peer
//! queues and the protocols' state: everything the process could be asked to give back. A
//! chain store's region is a mapped file, not allocated memory, and is not counted. Without
//! glibc the figure falls back to the resident set size.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use crate::metrics::Metrics;

#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub const ALLOCATOR: &str = "libc";
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub const ALLOCATOR: &str = "rss";

/// Bytes the allocator holds for the process.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn used_bytes() -> u64 {
    // SAFETY: mallinfo2 takes no arguments and returns a plain struct; glibc locks each arena
    // while it sums it.
    let info = unsafe { libc::mallinfo2() };
    (info.uordblks + info.hblkhd) as u64
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn used_bytes() -> u64 {
    rss_bytes()
}

/// Resident set size, from `/proc/self/statm` (0 where there is none).
pub fn rss_bytes() -> u64 {
    let Ok(statm) = std::fs::read_to_string("/proc/self/statm") else { return 0 };
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|field| field.parse().ok()).unwrap_or(0);
    // SAFETY: sysconf with a valid name has no side effects.
    let page_bytes = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * page_bytes.max(0) as u64
}

/// Redis' `used_memory_human`: `1.50M`, `812.00K`, `12B`.
pub fn human(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10), ("B", 1)];
    let (unit, size) = UNITS.iter().find(|(_, size)| bytes >= *size).copied().unwrap_or(("B", 1));
    if size == 1 {
        return format!("{bytes}B");
    }
    format!("{:.2}{unit}", bytes as f64 / size as f64)
}

/// How often the figure `maxmemory` is checked against is refreshed.
pub const SAMPLE_PERIOD: Duration = Duration::from_millis(100);

/// Keep `metrics.used_memory` current while `limited()` says a `maxmemory` is set (CONFIG SET
/// can set one at any time; without one the allocator is not asked).
pub async fn sample(metrics: Arc<Metrics>, limited: impl Fn() -> bool) {
    let mut interval = tokio::time::interval(SAMPLE_PERIOD);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        interval.tick().await;
        if limited() {
            metrics.used_memory.store(used_bytes(), Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_like_redis() {
        assert_eq!(human(12), "12B");
        assert_eq!(human(1536), "1.50K");
        assert_eq!(human(3 << 20), "3.00M");
    }

    #[test]
    fn an_allocation_shows_in_the_figure() {
        // Other tests in this process allocate and free at the same time, so one reading can
        // be off by what they freed meanwhile; an allocator figure that ignored the block would
        // fail every attempt.
        let attempts: Vec<(u64, u64)> = (0..5)
            .map(|_| {
                let before = used_bytes();
                let block = std::hint::black_box(vec![1u8; 8 << 20]);
                let during = used_bytes();
                drop(block);
                (before, during)
            })
            .collect();
        let shown = |(before, during): &(u64, u64)| *during >= before + (8 << 20) - (1 << 20);
        assert!(attempts.iter().any(shown), "before -> during: {attempts:?}");
    }
}
