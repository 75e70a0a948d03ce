//! The kernel data path against the sans-I/O chain core (issue 17, point 3).
//!
//! Three group hosts run as processes in their own network namespaces (a full mesh of veth
//! pairs, `kernel::netlab`), each with the XDP program attached; the test is the caller. The
//! same random operation sequences (all four primitives, overlapping ranges, gCAS execute maps,
//! operations larger than one datagram, malformed ones) go through the kernel path and through
//! the model (`sim::SimCluster`: `GroupCaller` + `ChainMember`s, no faults), and every result
//! and every member's region must match byte for byte: with a clean wire, and with loss at
//! every host's ingress plus loss, duplication and reordering of the caller's datagrams.
//! One-sided reads (answered by the members' XDP programs) are checked against the model too.
//!
//! Needs root, BPF and the compiled program; otherwise each test prints why it skips.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use chorus_group::kernel::netlab::NetLab;
use chorus_group::runtime::{
    spawn_child, BlockingGroupClient, ChildProcess, Datapath, GroupClient, GroupSpec, HostConfig,
    TenantCredential, WireFaults,
};
use chorus_group::sim::{draw_workload, NetFaults, SimCluster};
use chorus_group::txn::{Txn, TxnLayout};
use chorus_group::{CallerConfig, GroupId, Operation, Token};
use chorus_region::{FlushBackend, TenantId};
use chorus_sim::rng::Rng;

const TENANT: TenantId = TenantId(11);
const TOKEN: Token = Token([0x6b; 16]);
const REGION_BYTES: u64 = 8192;

fn skip_reason() -> Option<String> {
    chorus_group::kernel::unavailable_reason().or_else(NetLab::unavailable_reason)
}

macro_rules! require_kernel_path {
    () => {
        if let Some(reason) = skip_reason() {
            eprintln!("SKIPPED: the kernel data path cannot run here: {reason}");
            return;
        }
    };
}

struct Chain {
    // Hosts before the lab: they must exit before their namespaces go.
    _hosts: Vec<ChildProcess>,
    addrs: Vec<SocketAddr>,
    _dir: TempDir,
    lab: NetLab,
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn start_chain(members: usize, loss_per_million: u32) -> Chain {
    start_chain_with(members, loss_per_million, None).await
}

/// With `caller_rps_cpus`, every host steers its callers' datagrams to those CPUs
/// (`HostConfig::kernel_caller_rps_cpus`: generic XDP on the callers' interface, then RPS).
async fn start_chain_with(members: usize, loss_per_million: u32, caller_rps_cpus: Option<&str>) -> Chain {
    let lab = NetLab::create(members).expect("building the namespaces");
    let dir = TempDir(std::env::temp_dir().join(format!(
        "ck-kernel-test-{}-{}",
        std::process::id(),
        lab.namespace(0)
    )));
    let peers: Vec<_> = (0..members).map(|h| lab.host_ip(h).into()).collect();
    let mut hosts = Vec::new();
    let mut addrs = Vec::new();
    for host in 0..members {
        let mut config = HostConfig::new(
            SocketAddr::new(lab.host_ip(host).into(), 0),
            dir.0.join(format!("host{host}")),
            vec![TenantCredential::new(TENANT, &TOKEN)],
        );
        config.flush = FlushBackend::None;
        config.datapath = Datapath::Kernel;
        config.kernel_loss_per_million = loss_per_million;
        config.kernel_caller_rps_cpus = caller_rps_cpus.map(str::to_string);
        config.peers = peers.clone();
        config.worker_threads = 1;
        let command = lab.command_in(host, &[env!("CARGO_BIN_EXE_chorus-group-child").to_string()]);
        let (addr, child) =
            spawn_child(&command, &config, Duration::from_secs(20)).await.expect("starting a host");
        addrs.push(addr);
        hosts.push(child);
    }
    Chain { _hosts: hosts, addrs, _dir: dir, lab }
}

/// `ip netns exec <namespace> <command>`'s standard output.
fn in_namespace(chain: &Chain, host: usize, command: &[&str]) -> String {
    let output = std::process::Command::new("ip")
        .args(["netns", "exec", &chain.lab.namespace(host)])
        .args(command)
        .output()
        .expect("ip netns exec");
    assert!(output.status.success(), "{command:?}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn spec(chain: &Chain, group: u64, faults: Option<WireFaults>) -> GroupSpec {
    let mut spec = GroupSpec::new(
        chain.addrs.clone(),
        TENANT,
        TOKEN,
        GroupId(group),
        format!("diff-{group}"),
        REGION_BYTES,
    );
    spec.datapath = Datapath::Kernel;
    spec.wire_faults = faults;
    spec
}

/// Mostly valid operations that collide on a few hundred bytes, some far larger than a
/// datagram (split by the caller), some malformed.
fn workload(rng: &mut Rng, count: usize) -> Vec<Operation> {
    let mut operations = draw_workload(rng, count, 3, REGION_BYTES);
    for (i, operation) in operations.iter_mut().enumerate() {
        if i % 5 != 0 {
            continue;
        }
        let len = rng.range(1000, 3500);
        *operation = if rng.chance(0.5) {
            let data: Vec<u8> = (0..len).map(|j| (i as u64 * 7 + j) as u8).collect();
            Operation::write(rng.below(REGION_BYTES - len + 1), Bytes::from(data))
        } else {
            let src = rng.below(REGION_BYTES - len + 1);
            let dst = (src + rng.range(0, 600)).min(REGION_BYTES - len);
            if rng.chance(0.5) {
                Operation::memcpy(src, dst, len)
            } else {
                Operation::memcpy(dst, src, len)
            }
        };
        if rng.chance(0.3) {
            operation.flush = true;
        }
    }
    operations
}

/// Run `rounds` batches through the kernel path and the model; compare results and regions.
async fn differential(chain: &Chain, seed: u64, rounds: usize, faults: Option<WireFaults>) {
    let client = GroupClient::initialize(spec(chain, seed, faults)).await.expect("initialize");
    assert_eq!(client.datapath(), Datapath::Kernel, "every member should be on the kernel path");
    let mut model = SimCluster::new(seed, 3, REGION_BYTES, CallerConfig::default(), NetFaults::none());
    let mut rng = Rng::new(seed);
    for round in 0..rounds {
        let operations = workload(&mut rng, 40);
        let expected = model.execute(operations.clone());
        let got = client.execute(operations.clone()).await;
        for (i, (got, expected)) in got.iter().zip(&expected).enumerate() {
            assert_eq!(
                got,
                expected,
                "seed {seed} round {round} operation {i}: {}",
                describe(&operations[i])
            );
        }
    }
    for position in 0..3 {
        let region = client.read(position, 0, REGION_BYTES).await.expect("read");
        let want = model.members[position].memory().bytes();
        let first = region.iter().zip(want).position(|(a, b)| a != b);
        assert!(first.is_none(), "seed {seed}: member {position} differs from the model at byte {first:?}");
        // One-sided reads of a datagram or less are answered by the member's XDP program.
        for (offset, len) in [(0u64, 1024u64), (1000, 8), (REGION_BYTES - 1024, 1024)] {
            let bytes = client.read(position, offset, len).await.expect("kernel read");
            assert_eq!(bytes, &want[offset as usize..(offset + len) as usize], "read {len} at {offset}");
        }
    }
    if faults.is_none() {
        assert_eq!(client.kernel_reads_served(), 9, "every small read answered in the kernel");
    }
}

/// An operation without its bytes.
fn describe(operation: &Operation) -> String {
    match &operation.primitive {
        chorus_group::Primitive::Write { offset, data } => format!("gWRITE {} bytes at {offset}", data.len()),
        other => format!("{other:?}"),
    }
}

/// Each member's slot of `region`, mapped here as the node maps it.
fn map_member_slots(
    runtime: &tokio::runtime::Runtime,
    chain: &Chain,
    region: &str,
) -> Vec<chorus_region::Region> {
    (0..chain.addrs.len())
        .map(|position| {
            let slot = runtime
                .block_on(chorus_group::runtime::kernel_region(
                    chain.addrs[position],
                    TENANT,
                    TOKEN,
                    region,
                    REGION_BYTES,
                    Duration::from_secs(5),
                ))
                .expect("the host says where the region is");
            chorus_group::kernel::datapath::open_slot(TENANT, region, slot.map_id, slot.slot, REGION_BYTES)
                .expect("mapping the slot")
        })
        .collect()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

#[test]
fn kernel_path_matches_the_model_byte_for_byte() {
    require_kernel_path!();
    runtime().block_on(async {
        let chain = start_chain(3, 0).await;
        for seed in 1..=3 {
            differential(&chain, seed, 6, None).await;
        }
    });
}

#[test]
fn kernel_path_matches_the_model_under_loss_duplication_and_reordering() {
    require_kernel_path!();
    runtime().block_on(async {
        // 3% of datagrams lost at every host's ingress, and the caller's own datagrams lost,
        // duplicated and reordered.
        let chain = start_chain(3, 30_000).await;
        for seed in 10..=12 {
            let faults = WireFaults {
                seed,
                drop_per_million: 30_000,
                duplicate_per_million: 50_000,
                reorder_per_million: 100_000,
            };
            differential(&chain, seed, 4, Some(faults)).await;
        }
    });
}

/// Every hop in the softirq of a steered CPU instead of the caller's `sendto`: the callers'
/// interface runs the program in generic (skb) mode behind Receive Packet Steering, the other
/// interfaces natively. Same operations, same model, same bytes.
#[test]
fn kernel_path_with_steered_arrivals_matches_the_model() {
    require_kernel_path!();
    runtime().block_on(async {
        // CPU 0 exists everywhere; which CPU does not matter to the results.
        let chain = start_chain_with(3, 0, Some("1")).await;
        for host in 0..3 {
            let link = in_namespace(&chain, host, &["ip", "link", "show", "ckr"]);
            assert!(
                link.contains("xdpgeneric"),
                "host {host}: the callers' interface in generic mode: {link}"
            );
            let mask = in_namespace(&chain, host, &["cat", "/sys/class/net/ckr/queues/rx-0/rps_cpus"]);
            assert_eq!(mask.trim().trim_start_matches(['0', ',']), "1", "host {host}: RPS mask");
        }
        for seed in 20..=21 {
            differential(&chain, seed, 4, None).await;
        }
    });
}

/// The transaction API's circular log wraps (records restart at the log's beginning, the head
/// passes the end) and every group's sequence numbers pass the members' ring of remembered gCAS
/// results (`RING`) several times, through the kernel path and through the model, with loss:
/// every member's region must match the model byte for byte at the end.
#[test]
fn kernel_path_matches_the_model_across_log_and_ring_wrap_around() {
    require_kernel_path!();
    let runtime = runtime();
    let _context = runtime.enter();
    let chain = runtime.block_on(start_chain(3, 10_000));
    // A 600-byte log holds two or three records: it wraps every few updates.
    let layout = TxnLayout::new(600, 4096);
    let region_bytes = layout.region_bytes();
    let mut spec = spec(&chain, 77, None);
    spec.region = "wrap-77".to_string();
    spec.region_bytes = region_bytes;
    let client = BlockingGroupClient::initialize(spec).expect("initialize");
    assert_eq!(client.client().datapath(), Datapath::Kernel, "every member should be on the kernel path");
    let model = SimCluster::new(77, 3, region_bytes, CallerConfig::default(), NetFaults::none());
    let mut kernel = Txn::new(client, layout, 1);
    let mut reference = Txn::new(model, layout, 1);
    let mut rng = Rng::new(77);
    let updates = 2 * chorus_group::kernel::layout::RING / 4 + 40;
    for update in 0..updates {
        // At most 16 + 3 * (16 + 60) = 244 bytes a record: two fit in the log, a third wraps.
        let entries: Vec<(u64, Bytes)> = (0..rng.range(1, 3))
            .map(|e| {
                let len = rng.range(8, 60);
                let data: Vec<u8> = (0..len).map(|j| (update as u64 * 31 + e * 7 + j) as u8).collect();
                (rng.below(4096 - len + 1), Bytes::from(data))
            })
            .collect();
        for txn in [&mut kernel as &mut dyn TxnSteps, &mut reference] {
            txn.update(&entries);
        }
        assert_eq!(kernel.log_bounds(), reference.log_bounds(), "update {update}: log bounds");
    }
    assert!(reference.log_bounds().1 > 10 * 600, "the log wrapped many times");
    for position in 0..3 {
        let region = kernel.executor().read_blocking(position, 0, region_bytes).expect("read");
        let want = reference.executor().members[position].memory().bytes();
        let first = region.iter().zip(want).position(|(a, b)| a != b);
        assert!(first.is_none(), "member {position} differs from the model at byte {first:?}");
    }
}

/// One locked update through [`Txn`], on either executor.
trait TxnSteps {
    fn update(&mut self, entries: &[(u64, Bytes)]);
}

impl<E: chorus_group::txn::GroupExecutor> TxnSteps for Txn<E> {
    fn update(&mut self, entries: &[(u64, Bytes)]) {
        assert!(self.wr_lock().expect("lock"), "nobody else holds the lock");
        self.append(entries).expect("append");
        while self.execute_and_advance().expect("execute").is_some() {}
        self.wr_unlock().expect("unlock");
    }
}

/// The read lock next to the program's gCAS (docs/protocols/hyperloop.md, "`--protocol chain`
/// on the group host", step 4). The chain store's node takes a member's read lock with a CAS
/// on the lock word through its own mapping of the host's region slot (`kernel::datapath::
/// open_slot`, as `chorus node` does on the kernel path), while the coordinator's write lock is
/// a gCAS the XDP program applies to the same word. Here a reader thread takes and releases
/// read locks at every member as fast as it can, reading a block under each, while the caller
/// runs the transaction shape (gCAS write lock on every member, a gWRITE of the block, gCAS
/// unlock; a refused lock is undone where it swapped and retried). If the two CASes were not
/// atomic against each other, a reader's count would overwrite the writer's bit (or the other
/// way round): a reader would see a block half written, an unlock would find another value
/// than the lock, or a reader's release would not find its own count. At the end every
/// member's region must equal the model's after the updates that took the lock.
#[test]
fn the_read_locks_cas_through_the_mapped_slot_and_the_programs_gcas_exclude_each_other() {
    require_kernel_path!();
    use chorus_group::txn::WRITER_BIT;
    use chorus_region::RegionMemory;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

    const LOCK: u64 = 0;
    const BLOCK: u64 = 512;
    const BLOCK_BYTES: u64 = 256;
    const UPDATES: u64 = 300;
    let runtime = runtime();
    let chain = runtime.block_on(start_chain(3, 0));
    let mut spec = spec(&chain, 91, None);
    spec.region = "rdlock-91".to_string();
    let client = runtime.block_on(GroupClient::initialize(spec)).expect("initialize");
    assert_eq!(client.datapath(), Datapath::Kernel, "every member should be on the kernel path");
    let mut regions = map_member_slots(&runtime, &chain, "rdlock-91");
    let done = AtomicBool::new(false);
    let reads = AtomicU64::new(0);
    let writes = std::thread::scope(|scope| {
        let reader = scope.spawn(|| {
            let mut block = vec![0u8; BLOCK_BYTES as usize];
            let mut position = 0;
            while !done.load(Relaxed) {
                position = (position + 1) % 3;
                let region = &mut regions[position];
                let word = region.load_u64(LOCK).unwrap();
                if word & WRITER_BIT != 0 || region.cas(LOCK, word, word + 1).unwrap() != word {
                    continue; // the writer holds it (or just took it): try again
                }
                region.read(BLOCK, &mut block).unwrap();
                assert!(
                    block.iter().all(|b| *b == block[0]),
                    "member {position}: a block read under the read lock is half written: {:?}",
                    &block[..16]
                );
                let released = region.cas(LOCK, word + 1, word).unwrap();
                assert_eq!(released, word + 1, "member {position}: the reader's count was overwritten");
                reads.fetch_add(1, Relaxed);
            }
        });
        let mut writes = Vec::new();
        runtime.block_on(async {
            let all = 0b111;
            for update in 1..=UPDATES {
                loop {
                    let lock = Operation::cas(LOCK, 0, WRITER_BIT | 1, all);
                    let outcome = client.submit(lock).await.expect("lock");
                    let swapped = outcome.swapped_map(0);
                    if swapped == all {
                        break;
                    }
                    if swapped != 0 {
                        let undo = Operation::cas(LOCK, WRITER_BIT | 1, 0, swapped);
                        let undone = client.submit(undo).await.expect("undo");
                        assert_eq!(undone.swapped_map(WRITER_BIT | 1), swapped, "the undo found the lock");
                    }
                    tokio::task::yield_now().await;
                }
                let block = Operation::write(BLOCK, Bytes::from(vec![update as u8; BLOCK_BYTES as usize]));
                client.submit(block.clone()).await.expect("write");
                writes.push(block);
                let unlock = Operation::cas(LOCK, WRITER_BIT | 1, 0, all);
                let unlocked = client.submit(unlock).await.expect("unlock");
                assert_eq!(
                    unlocked.swapped_map(WRITER_BIT | 1),
                    all,
                    "update {update}: the unlock found the lock"
                );
            }
        });
        done.store(true, Relaxed);
        reader.join().expect("the reader");
        writes
    });
    assert!(reads.load(Relaxed) > 0, "the reader took read locks");
    // The updates that took the lock, through the model (the lock itself ends free everywhere).
    let mut model = SimCluster::new(91, 3, REGION_BYTES, CallerConfig::default(), NetFaults::none());
    model.execute(writes);
    for position in 0..3 {
        let region = runtime.block_on(client.read(position, 0, REGION_BYTES)).expect("read");
        let want = model.members[position].memory().bytes();
        let first = region.iter().zip(want).position(|(a, b)| a != b);
        assert!(first.is_none(), "member {position} differs from the model at byte {first:?}");
    }
    eprintln!("read locks taken beside the program's gCAS: {}", reads.load(Relaxed));
}

/// Issue 17 on the kernel path (docs/protocols/chain.md, "The read lock and the group write
/// lock"): the test, as the node beside member 1's host, holds a read lock on member 1's lock
/// word through its mapping of the slot while the caller sends the chain's batch shape: a
/// write-lock gCAS that yields to readers, execute operations pipelined behind it, an unlock.
/// The XDP program at member 1 drops the lock unconsumed and everything behind it as ahead of
/// a gap: while the reader holds the word, member 1 and the tail stay untouched although the
/// head has executed the batch and the caller keeps retransmitting. Once the reader leaves,
/// the retransmissions carry the batch through exactly once: the lock was taken everywhere
/// (never refused), and every region equals the model's.
#[test]
fn kernel_path_holds_a_write_lock_and_its_batch_while_a_reader_holds_the_word() {
    require_kernel_path!();
    use chorus_group::txn::WRITER_BIT;
    use chorus_region::RegionMemory;

    const LOCK: u64 = 0;
    let runtime = runtime();
    let chain = runtime.block_on(start_chain(3, 0));
    let mut spec = spec(&chain, 93, None);
    spec.region = "yield-93".to_string();
    let client = runtime.block_on(GroupClient::initialize(spec)).expect("initialize");
    assert_eq!(client.datapath(), Datapath::Kernel, "every member should be on the kernel path");
    let mut regions = map_member_slots(&runtime, &chain, "yield-93");
    assert_eq!(regions[1].cas(LOCK, 0, 1).unwrap(), 0, "the reader takes member 1's read lock");

    let all = 0b111;
    let batch = vec![
        Operation::cas(LOCK, 0, WRITER_BIT | 1, all).yielding_to_readers(),
        Operation::write(512, Bytes::from(vec![0xab; 700])),
        Operation::memcpy(512, 2048, 700).durable(),
        Operation::write(8, Bytes::from(78u64.to_le_bytes().to_vec())).durable(),
        Operation::cas(LOCK, WRITER_BIT | 1, 0, all),
    ];
    let submitted = batch.clone();
    let batch_done = runtime.spawn(async move {
        let results = client.execute(submitted).await;
        (client, results)
    });
    // The head executes the whole batch at once; then give member 1 the first copies and a
    // few of the caller's retransmissions (every 20 ms) while the reader holds the word.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while regions[0].load_u64(8).unwrap() != 78 {
        assert!(std::time::Instant::now() < deadline, "the head never executed the batch");
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(100));
    for (position, region) in regions.iter().enumerate().skip(1) {
        let mut bytes = vec![0u8; REGION_BYTES as usize];
        region.read(0, &mut bytes).unwrap();
        let reader_count = if position == 1 { 1 } else { 0 };
        assert_eq!(region.load_u64(LOCK).unwrap(), reader_count, "member {position}'s lock word");
        assert!(
            bytes[8..].iter().all(|b| *b == 0),
            "member {position} applied part of the batch while the reader held member 1's word"
        );
    }
    assert!(!batch_done.is_finished(), "the batch completed while a reader held member 1's word");

    assert_eq!(regions[1].cas(LOCK, 1, 0).unwrap(), 1, "the reader leaves");
    let (client, results) = runtime.block_on(batch_done).expect("the batch's task");
    let lock = results[0].as_ref().expect("the lock completed");
    assert_eq!(lock.swapped_map(0), all, "the lock was taken at every member: {:?}", lock.result_map);
    let unlock = results[4].as_ref().expect("the unlock completed");
    assert_eq!(unlock.swapped_map(WRITER_BIT | 1), all, "each member took the lock exactly once");
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let mut model = SimCluster::new(93, 3, REGION_BYTES, CallerConfig::default(), NetFaults::none());
    model.execute(batch);
    for position in 0..3 {
        let region = runtime.block_on(client.read(position, 0, REGION_BYTES)).expect("read");
        let want = model.members[position].memory().bytes();
        let first = region.iter().zip(want).position(|(a, b)| a != b);
        assert!(first.is_none(), "member {position} differs from the model at byte {first:?}");
    }
}
