use super::*;
use proptest::prelude::*;
use std::sync::atomic::AtomicUsize;

/// A fresh directory under /dev/shm (or the temp dir), removed on drop.
struct TestDir(PathBuf);

impl TestDir {
    fn new() -> TestDir {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir = default_region_dir().join(format!("test-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        TestDir(dir)
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const T: TenantId = TenantId(7);

#[cfg(unix)]
#[test]
fn region_files_are_private_to_their_user() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = TestDir::new();
    let store = RegionStore::open(dir.0.join("regions"), FlushBackend::Msync).unwrap();
    let region = store.register(T, "private", 4096).unwrap();
    let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(region.path().unwrap()), 0o600);
    assert_eq!(mode(&dir.0.join("regions")), 0o700);
    assert_eq!(mode(region.path().unwrap().parent().unwrap()), 0o700);
}

#[test]
fn a_registered_region_round_trips_and_survives_reopening() {
    let dir = TestDir::new();
    let store = RegionStore::open(&dir.0, FlushBackend::Msync).unwrap();
    let mut region = store.register(T, "log", 4096).unwrap();
    assert_eq!(region.size(), 4096);
    assert_eq!(region.read_vec(0, 16).unwrap(), vec![0u8; 16], "new regions are zero-filled");
    region.write(100, b"hello").unwrap();
    assert_eq!(region.dirty_range(), Some((100, 5)));
    region.flush().unwrap();
    assert_eq!(region.dirty_range(), None);
    assert_eq!(region.flushes(), 1);
    drop(region);

    let again = store.register(T, "log", 4096).unwrap();
    assert_eq!(again.read_vec(100, 5).unwrap(), b"hello");
    assert!(again.path().unwrap().starts_with(&dir.0));
    assert!(matches!(
        store.register(T, "log", 8192),
        Err(RegionError::SizeMismatch { existing: 4096, requested: 8192, .. })
    ));
    // Another tenant's region of the same name is a different file.
    let other = store.register(TenantId(8), "log", 64).unwrap();
    assert_eq!(other.read_vec(0, 5).unwrap(), vec![0u8; 5]);
    store.remove(T, "log").unwrap();
}

#[test]
fn out_of_bounds_and_misaligned_accesses_are_errors_not_panics() {
    let mut region = Region::volatile(T, "r", 64).unwrap();
    assert!(matches!(
        region.write(60, b"12345"),
        Err(RegionError::OutOfBounds { offset: 60, len: 5, size: 64 })
    ));
    assert!(matches!(region.write(u64::MAX, b"1"), Err(RegionError::OutOfBounds { .. })));
    assert!(region.write(64, b"").is_ok(), "an empty write at the end is in bounds");
    assert!(region.read_vec(u64::MAX - 1, 4).is_err());
    assert!(region.read_vec(0, u64::MAX).is_err());
    assert!(matches!(region.cas(4, 0, 1), Err(RegionError::Misaligned { offset: 4 })));
    assert!(matches!(region.cas(64, 0, 1), Err(RegionError::OutOfBounds { .. })));
    assert!(matches!(region.cas(u64::MAX - 7, 0, 1), Err(RegionError::OutOfBounds { .. })));
    assert!(region.memcpy(0, 60, 8).is_err());
    assert!(region.memcpy(60, 0, 8).is_err());
    assert!(region.memcpy(u64::MAX, 0, 2).is_err());
    assert!(region.load_u64(3).is_err());
    assert_eq!(region.as_bytes(), &[0u8; 64][..], "failed operations change nothing");
}

#[test]
fn compare_and_swap_reports_the_original_value() {
    let mut region = Region::volatile(T, "r", 64).unwrap();
    assert_eq!(region.cas(8, 0, 42).unwrap(), 0);
    assert_eq!(region.load_u64(8).unwrap(), 42);
    assert_eq!(region.cas(8, 0, 99).unwrap(), 42, "mismatch: original returned, nothing swapped");
    assert_eq!(region.load_u64(8).unwrap(), 42);
    assert_eq!(region.read_vec(8, 8).unwrap(), 42u64.to_le_bytes(), "words are little-endian");
}

#[test]
fn memcpy_handles_overlapping_ranges_like_memmove() {
    let mut region = Region::volatile(T, "r", 16).unwrap();
    region.write(0, b"abcdefgh").unwrap();
    region.memcpy(0, 2, 8).unwrap();
    assert_eq!(region.read_vec(0, 10).unwrap(), b"ababcdefgh");
    region.memcpy(2, 0, 8).unwrap();
    assert_eq!(region.read_vec(0, 10).unwrap(), b"abcdefghgh");
}

#[test]
fn cas_on_a_mapped_region_is_visible_to_another_mapping_of_the_file() {
    let dir = TestDir::new();
    let store = RegionStore::open(&dir.0, FlushBackend::Msync).unwrap();
    let mut region = store.register(T, "locks", 4096).unwrap();
    let file = File::open(region.path().unwrap()).unwrap();
    // SAFETY: a read-only view of a file this test owns; the region never truncates it.
    let tenant_view = unsafe { memmap2::Mmap::map(&file) }.unwrap();
    assert_eq!(region.cas(16, 0, 0xdead_beef).unwrap(), 0);
    assert_eq!(&tenant_view[16..24], &0xdead_beefu64.to_le_bytes());
    region.write(0, b"seen").unwrap();
    assert_eq!(&tenant_view[0..4], b"seen");
}

#[test]
fn names_and_sizes_are_validated() {
    let dir = TestDir::new();
    let store = RegionStore::open(&dir.0, FlushBackend::None).unwrap();
    for bad in ["", ".hidden", "../escape", "a/b", "sp ace", &"x".repeat(65)] {
        assert!(matches!(store.register(T, bad, 64), Err(RegionError::InvalidName(_))), "{bad:?}");
    }
    assert!(matches!(store.register(T, "zero", 0), Err(RegionError::InvalidSize { size: 0 })));
    assert!(matches!(store.register(T, "huge", REGION_BYTES_MAX + 1), Err(RegionError::InvalidSize { .. })));
}

#[test]
fn the_none_backend_never_flushes() {
    let dir = TestDir::new();
    let store = RegionStore::open(&dir.0, FlushBackend::None).unwrap();
    let mut region = store.register(T, "v", 128).unwrap();
    region.write(0, b"x").unwrap();
    assert_eq!(region.dirty_range(), None);
    region.flush().unwrap();
    assert_eq!(region.flushes(), 0);
    assert_eq!(region.backend(), FlushBackend::None);
}

#[test]
fn the_clwb_backend_is_refused_with_a_clear_message_without_dax() {
    // /dev/shm (tmpfs) and the temp dir are never DAX: MAP_SYNC is refused there. On a machine
    // whose temp dir is on real persistent memory this test would have nothing to refuse.
    let dir = TestDir::new();
    match RegionStore::open(&dir.0, FlushBackend::Clwb) {
        Err(RegionError::BackendUnavailable { backend: FlushBackend::Clwb, reason }) => {
            let message = reason.to_lowercase();
            assert!(message.contains("dax") || message.contains("clwb"), "unclear refusal: {reason}");
            assert!(message.contains("msync"), "the refusal names the alternative: {reason}");
        }
        Err(other) => panic!("unexpected error: {other}"),
        Ok(_) => eprintln!("{} supports MAP_SYNC: nothing to refuse here", dir.0.display()),
    }
    assert!(
        std::fs::read_dir(&dir.0).unwrap().next().is_none(),
        "the DAX probe file is removed whatever the outcome"
    );
}

#[test]
fn backend_names_parse() {
    for backend in [FlushBackend::Msync, FlushBackend::Clwb, FlushBackend::None] {
        assert_eq!(backend.name().parse::<FlushBackend>().unwrap(), backend);
    }
    assert!("fsync".parse::<FlushBackend>().unwrap_err().contains("msync, clwb, none"));
}

#[derive(Clone, Debug)]
enum Access {
    Write(u64, Vec<u8>),
    Memcpy(u64, u64, u64),
    Cas(u64, u64, u64),
    Read(u64, u64),
    Flush,
}

fn arb_access() -> impl Strategy<Value = Access> {
    let offset = prop_oneof![0u64..80, any::<u64>()];
    prop_oneof![
        (offset.clone(), proptest::collection::vec(any::<u8>(), 0..24))
            .prop_map(|(o, d)| Access::Write(o, d)),
        (offset.clone(), 0u64..80, 0u64..40).prop_map(|(s, d, l)| Access::Memcpy(s, d, l)),
        (offset.clone(), 0u64..3, 0u64..3).prop_map(|(o, a, b)| Access::Cas(o, a, b)),
        (offset, 0u64..40).prop_map(|(o, l)| Access::Read(o, l)),
        Just(Access::Flush),
    ]
}

proptest! {
    /// A mapped region behaves exactly like a heap region and a plain byte-vector model, and
    /// no input makes any of them panic.
    #[test]
    fn mapped_heap_and_model_agree(accesses in proptest::collection::vec(arb_access(), 0..40)) {
        let dir = TestDir::new();
        let store = RegionStore::open(&dir.0, FlushBackend::Msync).unwrap();
        let mut mapped = store.register(T, "p", 64).unwrap();
        let mut heap = Region::volatile(T, "p", 64).unwrap();
        let mut model = [0u8; 64];
        for access in accesses {
            let (a, b, expected) = match access.clone() {
                Access::Write(o, d) => {
                    let ok = o.checked_add(d.len() as u64).is_some_and(|e| e <= 64);
                    if ok { model[o as usize..o as usize + d.len()].copy_from_slice(&d); }
                    (mapped.write(o, &d).is_ok(), heap.write(o, &d).is_ok(), ok)
                }
                Access::Memcpy(s, d, l) => {
                    let ok = s.checked_add(l).is_some_and(|e| e <= 64) && d + l <= 64;
                    if ok { model.copy_within(s as usize..(s + l) as usize, d as usize); }
                    (mapped.memcpy(s, d, l).is_ok(), heap.memcpy(s, d, l).is_ok(), ok)
                }
                Access::Cas(o, old, new) => {
                    let ok = o % 8 == 0 && o <= 56;
                    let (ra, rb) = (mapped.cas(o, old, new), heap.cas(o, old, new));
                    if ok {
                        let current = u64::from_le_bytes(model[o as usize..o as usize + 8].try_into().unwrap());
                        prop_assert_eq!(ra.as_ref().ok(), Some(&current));
                        prop_assert_eq!(rb.as_ref().ok(), Some(&current));
                        if current == old { model[o as usize..o as usize + 8].copy_from_slice(&new.to_le_bytes()); }
                    }
                    (ra.is_ok(), rb.is_ok(), ok)
                }
                Access::Read(o, l) => {
                    let ok = o.checked_add(l).is_some_and(|e| e <= 64);
                    let (ra, rb) = (mapped.read_vec(o, l), heap.read_vec(o, l));
                    if ok {
                        prop_assert_eq!(ra.as_ref().unwrap(), &model[o as usize..(o + l) as usize]);
                        prop_assert_eq!(rb.as_ref().unwrap(), &model[o as usize..(o + l) as usize]);
                    }
                    (ra.is_ok(), rb.is_ok(), ok)
                }
                Access::Flush => (mapped.flush().is_ok(), heap.flush().is_ok(), true),
            };
            prop_assert_eq!(a, expected, "mapped region disagrees on {:?}", access);
            prop_assert_eq!(b, expected, "heap region disagrees on {:?}", access);
            prop_assert_eq!(mapped.as_bytes(), &model[..]);
            prop_assert_eq!(heap.as_bytes(), &model[..]);
        }
    }
}

#[test]
fn a_simulated_region_keeps_what_was_flushed_across_a_crash() {
    let mut region = Region::simulated(TenantId(1), "sim", 4096).unwrap();
    region.write(0, b"flushed").unwrap();
    region.flush().unwrap();
    region.write(64, b"lost").unwrap();
    region.cas(128, 0, 7).unwrap();
    assert_eq!(&region.as_bytes()[64..68], b"lost");
    assert_eq!(&region.crash_image()[..7], b"flushed");
    assert_eq!(&region.crash_image()[64..68], &[0; 4]);
    assert_eq!(&region.crash_image()[128..136], &[0; 8]);
    region.flush().unwrap();
    assert_eq!(&region.crash_image()[64..68], b"lost");
}

/// `TurnFlush` under each `appendfsync` policy: a gFLUSH only marks the turn, `sync_turn` makes
/// it durable when the policy says so, and a forced sync (a clean stop) always does.
#[test]
fn turn_flush_syncs_by_policy_and_always_when_forced() {
    let simulated = || Region::simulated(TenantId(1), "turns", 4096).unwrap();
    let durable = |memory: &TurnFlush<Region>| memory.inner().crash_image()[..4].to_vec();

    let mut always = TurnFlush::with_policy(simulated(), SyncPolicy::EveryTurn);
    always.write(0, b"turn").unwrap();
    always.sync_turn(false).unwrap();
    assert_eq!(always.syncs(), 0, "no gFLUSH in the turn: nothing to sync");
    always.flush().unwrap();
    assert!(always.flush_pending());
    assert_eq!(durable(&always), [0; 4], "a gFLUSH waits for the end of the turn");
    always.sync_turn(false).unwrap();
    assert_eq!((always.syncs(), durable(&always).as_slice()), (1, &b"turn"[..]));
    assert!(!always.flush_pending());

    // `everysec`: a turn inside the period defers; the first turn after it syncs.
    let mut everysec =
        TurnFlush::with_policy(simulated(), SyncPolicy::Every(std::time::Duration::from_secs(3600)));
    everysec.write(0, b"late").unwrap();
    everysec.flush().unwrap();
    everysec.sync_turn(false).unwrap();
    assert_eq!((everysec.syncs(), everysec.flush_pending()), (0, true), "inside the period");
    let mut elapsed = TurnFlush::with_policy(simulated(), SyncPolicy::Every(std::time::Duration::ZERO));
    elapsed.write(0, b"late").unwrap();
    elapsed.flush().unwrap();
    elapsed.sync_turn(false).unwrap();
    assert_eq!((elapsed.syncs(), durable(&elapsed).as_slice()), (1, &b"late"[..]), "the period is over");

    // `no`: only a forced sync writes back.
    let mut never = TurnFlush::with_policy(simulated(), SyncPolicy::Never);
    never.write(0, b"stop").unwrap();
    never.flush().unwrap();
    never.sync_turn(false).unwrap();
    assert_eq!(never.syncs(), 0);
    never.sync_turn(true).unwrap();
    everysec.sync_turn(true).unwrap();
    assert_eq!((never.syncs(), durable(&never).as_slice()), (1, &b"stop"[..]));
    assert_eq!((everysec.syncs(), durable(&everysec).as_slice()), (1, &b"late"[..]));
}
