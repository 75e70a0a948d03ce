//! The TCP runtime end to end on loopback: group hosts (in-process and as child processes),
//! the client library, the Naïve baseline, the transaction API, refusals and failures.
//! No timing assertions; every wait is bounded.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use chorus_core::Time;
use chorus_group::runtime::{
    spawn_child, start_host, BlockingGroupClient, ChildProcess, GroupClient, GroupSpec, HostConfig,
    HostHandle, HostMode, TenantCredential,
};
use chorus_group::txn::{Txn, TxnLayout, WRITER_BIT};
use chorus_group::{CallerConfig, GroupError, GroupId, OpError, Operation, Token};
use chorus_region::{default_region_dir, FlushBackend, RegionView, TenantId};

const TENANT: TenantId = TenantId(7);
const TOKEN: Token = Token([0x5a; 16]);

/// A fresh directory under /dev/shm (or the temp dir), removed on drop.
struct TestDir(PathBuf);

impl TestDir {
    fn new(tag: &str) -> TestDir {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir = default_region_dir().join(format!("group-rt-{tag}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        TestDir(dir)
    }
    fn host(&self, i: usize) -> PathBuf {
        self.0.join(format!("host{i}"))
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn host_config(dir: PathBuf, mode: HostMode) -> HostConfig {
    let mut config = HostConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        dir,
        vec![TenantCredential::new(TENANT, &TOKEN), TenantCredential::new(TenantId(8), &Token([8; 16]))],
    );
    config.mode = mode;
    config.io_timeout_ms = 3000;
    config
}

/// `n` in-process hosts, each with its own region directory (as on separate machines).
fn start_hosts(rt: &tokio::runtime::Runtime, dir: &TestDir, n: usize, mode: HostMode) -> Vec<HostHandle> {
    (0..n).map(|i| rt.block_on(start_host(host_config(dir.host(i), mode))).unwrap()).collect()
}

fn spec(hosts: &[SocketAddr], region_bytes: u64) -> GroupSpec {
    let mut spec = GroupSpec::new(hosts.to_vec(), TENANT, TOKEN, GroupId(1), "table", region_bytes);
    spec.io_timeout = Duration::from_secs(3);
    spec.caller = CallerConfig { retransmit_after: Time::from_millis(500), attempts_max: 4, window_max: 32 };
    spec
}

fn addrs(hosts: &[HostHandle]) -> Vec<SocketAddr> {
    hosts.iter().map(HostHandle::local_addr).collect()
}

fn region_files(client: &BlockingGroupClient) -> Vec<Vec<u8>> {
    client.client().region_paths().iter().map(|path| std::fs::read(path).unwrap()).collect()
}

/// A workload touching every primitive; returns the region every member must end with.
fn run_every_primitive(client: &BlockingGroupClient) -> Vec<u8> {
    let mut expected = vec![0u8; 256];
    let results = client.execute_blocking(vec![
        Operation::write(0, Bytes::from_static(b"hello, group")),
        Operation::write(100, Bytes::from(vec![9u8; 50])).durable(),
        Operation::memcpy(0, 200, 12),
        Operation::cas(64, 0, 42, 0b111),
        Operation::flush(),
    ]);
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(results[3].as_ref().unwrap().result_map, vec![Some(0), Some(0), Some(0)]);
    expected[..12].copy_from_slice(b"hello, group");
    expected[100..150].fill(9);
    expected[200..212].copy_from_slice(b"hello, group");
    expected[64..72].copy_from_slice(&42u64.to_le_bytes());

    // gCAS on members 0 and 2 only, one of which no longer matches; then undo the partial success.
    let r = client.execute_blocking(vec![Operation::cas(64, 42, 43, 0b101)]);
    assert_eq!(r[0].as_ref().unwrap().result_map, vec![Some(42), None, Some(42)]);
    let r = client.execute_blocking(vec![Operation::cas(64, 42, 44, 0b111)]);
    let outcome = r[0].as_ref().unwrap();
    assert_eq!(outcome.result_map, vec![Some(43), Some(42), Some(43)]);
    assert_eq!(outcome.swapped_map(42), 0b010);
    let r = client.execute_blocking(vec![Operation::cas(64, 44, 42, 0b010)]);
    assert_eq!(r[0].as_ref().unwrap().swapped_map(44), 0b010, "undo on exactly the member that swapped");
    let r = client.execute_blocking(vec![Operation::cas(64, 43, 42, 0b101).durable()]);
    assert!(r[0].is_ok());

    // Many operations in flight, applied in order everywhere.
    let pipelined: Vec<Operation> = (0..200u64)
        .map(|i| Operation::write(160 + (i % 4) * 8, Bytes::from(i.to_le_bytes().to_vec())))
        .collect();
    assert!(client.execute_blocking(pipelined).iter().all(Result::is_ok));
    for slot in 0..4u64 {
        let last = 196 + slot;
        expected[(160 + slot * 8) as usize..(168 + slot * 8) as usize].copy_from_slice(&last.to_le_bytes());
    }
    assert!(client.execute_blocking(vec![Operation::flush()])[0].is_ok());
    expected
}

#[test]
fn three_hosts_apply_every_primitive_identically() {
    let dir = TestDir::new("prims");
    let rt = runtime();
    let hosts = start_hosts(&rt, &dir, 3, HostMode::Chorus);
    let client = BlockingGroupClient::initialize(spec(&addrs(&hosts), 256)).unwrap();
    let expected = run_every_primitive(&client);
    for (position, file) in region_files(&client).iter().enumerate() {
        assert_eq!(file, &expected, "member {position}'s region file");
    }
    // The tenant's read-only view of a member's region, and the one-sided read at the tail.
    let view = RegionView::open(&client.client().region_paths()[1]).unwrap();
    assert_eq!(view.read_vec(0, 12).unwrap(), b"hello, group");
    assert_eq!(view.load_u64(64).unwrap(), 42);
    assert_eq!(client.read_blocking(2, 200, 12).unwrap(), b"hello, group");
    assert!(client.read_blocking(2, 250, 12).is_err(), "reads are bounds-checked too");
    assert!(rt.block_on(client.client().ping(1)).is_ok());
    drop(client);
    drop(hosts);
}

#[test]
fn a_wrong_token_is_refused_and_an_unknown_tenant_too() {
    let dir = TestDir::new("token");
    let rt = runtime();
    let hosts = start_hosts(&rt, &dir, 3, HostMode::Chorus);
    let mut wrong = spec(&addrs(&hosts), 64);
    wrong.token = Token([1; 16]);
    let error = BlockingGroupClient::initialize(wrong).err().expect("a wrong token is refused");
    assert!(format!("{error:#}").contains("wrong token"), "{error:#}");
    let mut stranger = spec(&addrs(&hosts), 64);
    stranger.tenant = TenantId(99);
    let error = BlockingGroupClient::initialize(stranger).err().expect("an unknown tenant is refused");
    assert!(format!("{error:#}").contains("not served"), "{error:#}");
    // Tenant 8's token does not open tenant 7's region either: it is another tenant's token.
    let mut other = spec(&addrs(&hosts), 64);
    other.token = Token([8; 16]);
    assert!(BlockingGroupClient::initialize(other).is_err());
    for host in &hosts {
        assert_eq!(host.group_count(), 0, "nothing was initialized");
    }
}

#[test]
fn an_out_of_bounds_operation_is_rejected_and_changes_nothing() {
    let dir = TestDir::new("bounds");
    let rt = runtime();
    let hosts = start_hosts(&rt, &dir, 3, HostMode::Chorus);
    let client = BlockingGroupClient::initialize(spec(&addrs(&hosts), 128)).unwrap();
    assert!(client.execute_blocking(vec![Operation::write(0, Bytes::from_static(b"before")).durable()])[0]
        .is_ok());
    let before = region_files(&client);
    let results = client.execute_blocking(vec![
        Operation::write(120, Bytes::from(vec![1u8; 16])),
        Operation::memcpy(0, 100, 64),
        Operation::cas(12, 0, 1, 0b111),
        Operation::cas(0, 0, 1, 0b1000),
    ]);
    assert!(matches!(results[0], Err(GroupError::Rejected(OpError::OutOfBounds { .. }))), "{results:?}");
    assert!(matches!(results[1], Err(GroupError::Rejected(OpError::OutOfBounds { .. }))));
    assert!(matches!(results[2], Err(GroupError::Rejected(OpError::Misaligned { offset: 12 }))));
    assert!(matches!(results[3], Err(GroupError::Rejected(OpError::ExecuteMapBeyondChain { .. }))));
    assert_eq!(region_files(&client), before, "nothing changed at any member");
    // The pipeline did not stall.
    assert!(
        client.execute_blocking(vec![Operation::write(8, Bytes::from_static(b"after")).durable()])[0].is_ok()
    );
    for file in region_files(&client) {
        assert_eq!(&file[..13], b"before\0\0after");
    }
}

#[test]
fn transactions_append_execute_and_lock_over_tcp() {
    let dir = TestDir::new("txn");
    let rt = runtime();
    let hosts = start_hosts(&rt, &dir, 3, HostMode::Chorus);
    let layout = TxnLayout::new(512, 256);
    let client = BlockingGroupClient::initialize(spec(&addrs(&hosts), layout.region_bytes())).unwrap();
    let paths = client.client().region_paths().to_vec();
    let mut txn = Txn::new(client, layout, 1);
    assert!(txn.wr_lock().unwrap());
    for round in 0..12u8 {
        txn.append(&[
            ((round as u64 % 4) * 8, Bytes::from(vec![round; 8])),
            (100, Bytes::from(format!("row{round:02}"))),
        ])
        .unwrap();
        if round % 3 == 2 {
            while txn.execute_and_advance().unwrap().is_some() {}
        }
    }
    while txn.execute_and_advance().unwrap().is_some() {}
    txn.wr_unlock().unwrap();
    let (head, tail) = txn.log_bounds();
    assert_eq!(head, tail);
    for position in [0, 2] {
        assert_eq!(txn.read(position, 100, 5).unwrap(), b"row11", "lock-free read at member {position}");
        assert_eq!(txn.read(position, 3 * 8, 8).unwrap(), vec![11u8; 8]);
    }
    // Read locks at one member exclude the writer; the lock word lives in every region file.
    assert!(txn.rd_lock(1).unwrap());
    assert!(!txn.wr_lock().unwrap(), "a reader at member 1 blocks the group write lock");
    txn.rd_unlock(1).unwrap();
    assert!(txn.wr_lock().unwrap());
    for path in &paths {
        let view = RegionView::open(path).unwrap();
        assert_eq!(view.load_u64(layout.lock_offset).unwrap(), WRITER_BIT | 1);
        assert_eq!(view.load_u64(layout.head_offset).unwrap(), head);
        assert_eq!(view.read_vec(layout.db_offset + 100, 5).unwrap(), b"row11");
    }
    txn.wr_unlock().unwrap();
    drop(txn);
    drop(hosts);
}

#[test]
fn naive_replicas_produce_identical_regions() {
    let dir = TestDir::new("naive");
    let rt = runtime();
    let chorus = start_hosts(&rt, &TestDir(dir.0.join("chorus")), 3, HostMode::Chorus);
    let naive = start_hosts(&rt, &TestDir(dir.0.join("naive")), 3, HostMode::Naive);
    let a = BlockingGroupClient::initialize(spec(&addrs(&chorus), 256)).unwrap();
    let b = BlockingGroupClient::initialize(spec(&addrs(&naive), 256)).unwrap();
    assert_ne!(
        b.client().data_addrs(),
        addrs(&naive).as_slice(),
        "the Naïve dispatcher redirected to replicas"
    );
    let expected_a = run_every_primitive(&a);
    let expected_b = run_every_primitive(&b);
    assert_eq!(expected_a, expected_b);
    assert_eq!(region_files(&a), region_files(&b));
    for file in region_files(&b) {
        assert_eq!(file, expected_b);
    }
    drop((a, b));
    drop((chorus, naive));
}

#[test]
fn a_host_killed_mid_stream_fails_the_operations_instead_of_hanging() {
    let dir = TestDir::new("kill");
    let rt = runtime();
    let hosts = start_hosts(&rt, &dir, 3, HostMode::Chorus);
    let client = rt.block_on(GroupClient::initialize(spec(&addrs(&hosts), 4096))).unwrap();
    let client = std::sync::Arc::new(client);
    let streaming = client.clone();
    let stream = rt.spawn(async move {
        let mut outcomes = Vec::new();
        for round in 0..400u64 {
            let ops = (0..16)
                .map(|i| Operation::write((i * 64) % 4096, Bytes::from(vec![round as u8; 64])))
                .collect();
            let results = streaming.execute(ops).await;
            let failed = results.iter().any(Result::is_err);
            outcomes.extend(results);
            if failed {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        outcomes
    });
    std::thread::sleep(Duration::from_millis(100));
    hosts[1].shutdown(); // the middle member dies: its sockets close
    let outcomes =
        rt.block_on(async { tokio::time::timeout(Duration::from_secs(30), stream).await }).unwrap().unwrap();
    let errors: Vec<_> = outcomes.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(!errors.is_empty(), "the stream saw the failure");
    assert!(
        errors.iter().all(|e| matches!(
            e,
            GroupError::Disconnected(_)
                | GroupError::MemberFailed { .. }
                | GroupError::Unavailable { .. }
                | GroupError::Broken(_)
        )),
        "{errors:?}"
    );
    // The group is broken until reconfigured: later operations fail at once.
    let later = rt.block_on(async {
        tokio::time::timeout(
            Duration::from_secs(10),
            client.submit(Operation::write(0, Bytes::from_static(b"x"))),
        )
        .await
    });
    assert!(matches!(later, Ok(Err(_))), "{later:?}");
    drop(client);
    drop(hosts);
}

#[test]
fn naive_polling_replicas_produce_identical_regions_and_spin() {
    let dir = TestDir::new("polling");
    let rt = runtime();
    let mut children: Vec<ChildProcess> = Vec::new();
    let mut addrs = Vec::new();
    for i in 0..3 {
        let mut config = host_config(dir.host(i), HostMode::NaivePolling);
        config.replica_command = Some(child_command());
        config.worker_threads = 1;
        let (addr, child) =
            rt.block_on(spawn_child(&child_command(), &config, Duration::from_secs(10))).unwrap();
        addrs.push(addr);
        children.push(child);
    }
    let client = BlockingGroupClient::initialize(spec(&addrs, 256)).unwrap();
    assert_ne!(client.client().data_addrs(), addrs.as_slice(), "redirected to polling replicas");
    let expected = run_every_primitive(&client);
    for file in region_files(&client) {
        assert_eq!(file, expected);
    }
    // Busy-polling: the replicas (grandchildren of this test) burn CPU while no operation
    // arrives. Wait, bounded, until they have used 300 ms of CPU between them.
    let pids: Vec<u32> = children.iter().filter_map(ChildProcess::id).collect();
    let start = tree_cpu_us(&pids);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let used = tree_cpu_us(&pids) - start;
        if used >= 300_000 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "idle polling replicas used only {used} us of CPU");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(client);
    drop(children);
}

fn child_command() -> Vec<String> {
    vec![env!("CARGO_BIN_EXE_chorus-group-child").to_string()]
}

#[test]
fn hosts_and_naive_replicas_as_processes() {
    let dir = TestDir::new("procs");
    let rt = runtime();
    let mut children: Vec<ChildProcess> = Vec::new();
    let mut addrs = Vec::new();
    for i in 0..3 {
        let mut config = host_config(dir.host(i), if i == 1 { HostMode::Naive } else { HostMode::Chorus });
        config.replica_command = Some(child_command());
        config.flush = FlushBackend::Msync;
        config.worker_threads = 2;
        let (addr, child) =
            rt.block_on(spawn_child(&child_command(), &config, Duration::from_secs(10))).unwrap();
        addrs.push(addr);
        children.push(child);
    }
    let client = BlockingGroupClient::initialize(spec(&addrs, 256)).unwrap();
    let expected = run_every_primitive(&client);
    for file in region_files(&client) {
        assert_eq!(file, expected);
    }
    // Kill the tail process: the next operation fails (it cannot be acknowledged), no hang.
    rt.block_on(children[2].kill());
    let results = client.execute_blocking(vec![Operation::write(0, Bytes::from_static(b"late"))]);
    assert!(results[0].is_err(), "{results:?}");
    drop(client);
    drop(children);
}

/// CPU time (user + system, microseconds) of these processes and all their descendants,
/// from /proc (clock ticks of 10 ms).
fn tree_cpu_us(roots: &[u32]) -> u64 {
    let mut stats = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        // Fields after the command (which may hold spaces): state ppid ... utime(14) stime(15).
        let Some(rest) = stat.rsplit_once(')').map(|(_, rest)| rest) else { continue };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ppid: u32 = fields[1].parse().unwrap_or(0);
        let ticks: u64 = fields[11].parse::<u64>().unwrap_or(0) + fields[12].parse::<u64>().unwrap_or(0);
        stats.push((pid, ppid, ticks));
    }
    let mut members: Vec<u32> = roots.to_vec();
    loop {
        let before = members.len();
        for (pid, ppid, _) in &stats {
            if members.contains(ppid) && !members.contains(pid) {
                members.push(*pid);
            }
        }
        if members.len() == before {
            break;
        }
    }
    stats.iter().filter(|(pid, _, _)| members.contains(pid)).map(|(_, _, ticks)| ticks * 10_000).sum()
}

#[test]
fn tenant_quotas_refuse_regions_and_naive_replicas_beyond_them() {
    let dir = TestDir::new("quotas");
    let rt = runtime();
    let mut config = host_config(dir.host(0), HostMode::Chorus);
    config.quotas.regions_max = 2;
    config.quotas.region_bytes_max = 3000;
    let host = rt.block_on(start_host(config)).unwrap();
    let named = |group: u64, region: &str, bytes: u64| {
        let mut spec = spec(&[host.local_addr()], bytes);
        spec.group = GroupId(group);
        spec.region = region.to_string();
        spec
    };
    let first = BlockingGroupClient::initialize(named(1, "a", 1000)).unwrap();
    // The same region again is not counted twice.
    let again = BlockingGroupClient::initialize(named(2, "a", 1000)).unwrap();
    let error = BlockingGroupClient::initialize(named(3, "b", 2500)).err().unwrap();
    assert!(format!("{error:#}").contains("over its quota of 3000"), "{error:#}");
    let second = BlockingGroupClient::initialize(named(4, "b", 1000)).unwrap();
    let error = BlockingGroupClient::initialize(named(5, "c", 100)).err().unwrap();
    assert!(format!("{error:#}").contains("already has 2 regions"), "{error:#}");
    // What the tenant has keeps working.
    assert!(first.execute_blocking(vec![Operation::write(0, Bytes::from_static(b"ok"))])[0].is_ok());
    drop((first, again, second));

    let mut config = host_config(dir.host(1), HostMode::Naive);
    config.quotas.naive_replicas_max = 1;
    let naive = rt.block_on(start_host(config)).unwrap();
    let mut spec_one = spec(&[naive.local_addr()], 256);
    spec_one.region = "n1".into();
    let one = BlockingGroupClient::initialize(spec_one).unwrap();
    let mut spec_two = spec(&[naive.local_addr()], 256);
    spec_two.group = GroupId(2);
    spec_two.region = "n2".into();
    let error = BlockingGroupClient::initialize(spec_two).err().unwrap();
    assert!(format!("{error:#}").contains("Naïve replicas here (quota)"), "{error:#}");
    drop(one);
}

/// Issue 17 point 5: every member is initialized by its own caller (the chain store's nodes
/// each configure their own host), in any order. The head is initialized first, so its link
/// to the next member can only come up once that member exists: the host dials it again
/// until it is accepted, and the write reaches every region and is acknowledged to the
/// tail's caller (`HostLink`).
#[test]
fn hosted_members_initialized_head_first_link_up_and_acknowledge_at_the_tails_caller() {
    use chorus_core::NodeId;
    use chorus_group::runtime::{HostLink, HostedInit};
    use chorus_group::{GroupCaller, GroupConfig, GroupMessage, GroupOutbox, RequestId};

    let rt = runtime();
    let dir = TestDir::new("hosted");
    let hosts = start_hosts(&rt, &dir, 3, HostMode::Chorus);
    let hosts_addrs = addrs(&hosts);
    let region_bytes = 4096;
    let _guard = rt.enter();
    let links: Vec<HostLink> = hosts_addrs
        .iter()
        .map(|addr| HostLink::start(*addr, TENANT, TOKEN, Duration::from_secs(3)))
        .collect();
    for (position, link) in links.iter().enumerate() {
        link.initialize(HostedInit {
            group: GroupId(1),
            epoch: 1,
            start_seq: 1,
            region: "hosted".into(),
            region_bytes,
            chain_len: 3,
            position: position as u8,
            next: hosts_addrs.get(position + 1).copied(),
            caller_port: 0,
        });
        // Let the head's host try (and fail) to link before the next member exists.
        std::thread::sleep(Duration::from_millis(20));
    }
    let config = GroupConfig {
        group: GroupId(1),
        tenant: TENANT,
        token: TOKEN,
        epoch: 1,
        chain: vec![NodeId(1), NodeId(2), NodeId(3)],
        caller: NodeId(0),
        region_bytes,
        start_seq: 1,
    };
    let caller_config =
        CallerConfig { retransmit_after: Time::from_millis(200), attempts_max: 50, window_max: 8 };
    let mut caller = GroupCaller::new(config, NodeId(0), caller_config).unwrap();
    let mut out = GroupOutbox::default();
    caller.submit(
        Time::ZERO,
        RequestId(1),
        Operation::write(64, Bytes::from_static(b"hosted!")).durable(),
        &mut out,
    );
    let started = std::time::Instant::now();
    let mut acked = None;
    while acked.is_none() && started.elapsed() < Duration::from_secs(10) {
        let ops: Vec<GroupMessage> = out.messages.drain(..).map(|(_, message)| message).collect();
        links[0].send(&ops);
        let mut from_tail = Vec::new();
        links[2].drain(&mut from_tail);
        for message in from_tail {
            caller.on_message(Time::ZERO, NodeId(3), message, &mut out);
        }
        acked = out.completions.drain(..).next();
        std::thread::sleep(Duration::from_millis(5));
    }
    let (request, result) = acked.expect("the tail's caller got the acknowledgement");
    assert_eq!(request, RequestId(1));
    assert!(result.is_ok(), "{result:?}");
    for i in 0..3 {
        let region = std::fs::read(dir.host(i).join(format!("{TENANT}")).join("hosted.region")).unwrap();
        assert_eq!(&region[64..71], b"hosted!", "member {i}");
    }
    assert_eq!(links[0].last_error(), None);
    drop(links);
    drop(hosts);
}
