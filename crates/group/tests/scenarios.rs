//! Scripted scenarios for the group primitives (HyperLoop §4.2, Table 1): gCAS maps and undo,
//! interleaved gFLUSH ordering, bounds, a member failing mid-stream, pipelining, the tenant
//! token, and `Initialize` on a real mmap'd region.

use bytes::Bytes;
use chorus_core::{NodeId, Time};
use chorus_group::sim::{NetFaults, SimCluster, SimMemory, SIM_TENANT, SIM_TOKEN};
use chorus_group::{
    CallerConfig, ChainMember, GroupCaller, GroupConfig, GroupError, GroupId, GroupMessage, GroupOutbox,
    InitError, OpError, Operation, RequestId, Token,
};
use chorus_region::{FlushBackend, RegionMemory, RegionStore, TenantId};

fn caller_config() -> CallerConfig {
    CallerConfig { retransmit_after: Time::from_millis(5), attempts_max: 20, window_max: 32 }
}

fn reordering() -> NetFaults {
    NetFaults { loss: 0.05, duplicate: 0.1, reorder: 0.5, delay_min_us: 10, delay_spread_us: 500 }
}

fn word(cluster: &SimCluster, member: usize, offset: u64) -> u64 {
    cluster.members[member].memory().load_u64(offset).unwrap()
}

#[test]
fn gcas_reports_each_members_original_value_and_can_be_undone() {
    let mut group = SimCluster::new(1, 3, 64, caller_config(), NetFaults::none());
    // Only member 1 executes: its word becomes 5.
    let r = group.execute(vec![Operation::cas(8, 0, 5, 0b010)]);
    assert_eq!(r[0].as_ref().unwrap().result_map, vec![None, Some(0), None]);
    // Everyone tries 0 -> 9: members 0 and 2 succeed, member 1 reports its 5.
    let r = group.execute(vec![Operation::cas(8, 0, 9, 0b111)]);
    let outcome = r[0].as_ref().unwrap();
    assert_eq!(outcome.result_map, vec![Some(0), Some(5), Some(0)]);
    assert_eq!(outcome.swapped_map(0), 0b101);
    assert_eq!((word(&group, 0, 8), word(&group, 1, 8), word(&group, 2, 8)), (9, 5, 9));
    // Undo the partial success: swap back on exactly the members that swapped.
    let r = group.execute(vec![Operation::cas(8, 9, 0, 0b101)]);
    assert_eq!(r[0].as_ref().unwrap().result_map, vec![Some(9), None, Some(9)]);
    assert_eq!((word(&group, 0, 8), word(&group, 1, 8), word(&group, 2, 8)), (0, 5, 0));
}

#[test]
fn an_interleaved_flush_makes_every_preceding_operation_durable_at_every_member() {
    let mut group = SimCluster::new(2, 3, 64, caller_config(), NetFaults::none());
    let r = group.execute(vec![Operation::write(0, Bytes::from_static(b"volatile"))]);
    assert!(r[0].is_ok());
    for m in 0..3 {
        assert_eq!(&group.members[m].memory().bytes()[..8], b"volatile");
        assert_eq!(&group.members[m].memory().durable()[..8], &[0u8; 8], "no flush asked: not durable yet");
    }
    let r = group.execute(vec![
        Operation::memcpy(0, 16, 8),
        Operation::write(32, Bytes::from_static(b"durable!")).durable(),
        Operation::write(48, Bytes::from_static(b"after")),
    ]);
    assert!(r.iter().all(Result::is_ok));
    for m in 0..3 {
        let durable = group.members[m].memory().durable();
        assert_eq!(&durable[..8], b"volatile", "the flush covers earlier operations");
        assert_eq!(&durable[16..24], b"volatile");
        assert_eq!(&durable[32..40], b"durable!");
        assert_eq!(&durable[48..53], &[0u8; 5], "a later unflushed write is not durable");
    }
    assert!(group.execute(vec![Operation::flush()])[0].is_ok());
    for m in 0..3 {
        assert_eq!(group.members[m].memory().durable(), group.members[m].memory().bytes());
    }
}

#[test]
fn malformed_operations_are_rejected_change_nothing_and_do_not_stall_the_pipeline() {
    let mut group = SimCluster::new(3, 4, 64, caller_config(), reordering());
    let results = group.execute(vec![
        Operation::write(0, Bytes::from_static(b"ok")),
        Operation::write(60, Bytes::from_static(b"too long")),
        Operation::cas(4, 0, 1, 0b1111),
        Operation::cas(0, 0, 1, 0b10000),
        Operation::memcpy(0, 63, 2),
        Operation::memcpy(u64::MAX, 0, 2).durable(),
        Operation::write(u64::MAX - 1, Bytes::from_static(b"wrap")),
        Operation::write(2, Bytes::from_static(b"!")),
    ]);
    assert!(results[0].is_ok() && results[7].is_ok());
    for result in &results[1..7] {
        assert!(matches!(result, Err(GroupError::Rejected(_))), "{result:?}");
    }
    assert_eq!(results[2], Err(GroupError::Rejected(OpError::Misaligned { offset: 4 })));
    for m in 0..4 {
        let bytes = group.members[m].memory().bytes();
        assert_eq!(&bytes[..3], b"ok!");
        assert!(bytes[3..].iter().all(|b| *b == 0), "member {m} was changed by a rejected operation");
    }
}

#[test]
fn a_member_failing_mid_stream_gives_the_caller_an_error_not_a_hang() {
    let mut group = SimCluster::new(4, 3, 64, caller_config(), NetFaults::none());
    assert!(group.execute(vec![Operation::write(0, Bytes::from_static(b"a"))])[0].is_ok());
    group.crashed[2] = true; // the tail dies
    let results = group.execute((0..10).map(|i| Operation::write(i, Bytes::from_static(b"b"))).collect());
    for result in &results {
        assert!(
            matches!(result, Err(GroupError::Unavailable { .. }) | Err(GroupError::Broken(_))),
            "{result:?}"
        );
    }
    assert!(group.caller.is_broken());
    assert!(matches!(group.execute(vec![Operation::flush()])[0], Err(GroupError::Broken(_))));

    // The application's recovery (§5) installs a chain without the dead member.
    let mut config = group.caller.group().clone();
    config.epoch += 1;
    config.chain = vec![NodeId(0), NodeId(1)];
    config.start_seq = 1_000;
    let mut out = GroupOutbox::default();
    let now = group.now;
    for m in 0..2 {
        group.members[m].on_config(now, config.clone(), &mut out).unwrap();
    }
    group.caller.on_config(now, config, &mut out).unwrap();
    assert!(out.messages.is_empty());
    // The failed writes had unknown outcomes: they reached the members before the dead tail.
    assert_eq!(&group.members[0].memory().bytes()[..10], b"bbbbbbbbbb");
    let r = group.execute(vec![Operation::cas(16, 0, 1, 0b11)]);
    assert_eq!(r[0].as_ref().unwrap().result_map, vec![Some(0), Some(0)]);
}

#[test]
fn pipelined_operations_apply_in_order_at_every_member() {
    let mut group = SimCluster::new(5, 5, 64, caller_config(), reordering());
    let operations: Vec<Operation> =
        (0..300u32).map(|i| Operation::write(8, Bytes::from(i.to_le_bytes().to_vec()))).collect();
    let mut operations = operations;
    // Interleave gCAS increments that only succeed if everything before was applied in order.
    for i in 0..50u64 {
        operations.push(Operation::cas(16, i, i + 1, 0b11111));
    }
    let results = group.execute(operations);
    assert!(results.iter().all(Result::is_ok));
    for (i, result) in results[300..].iter().enumerate() {
        assert_eq!(
            result.as_ref().unwrap().swapped_map(i as u64),
            0b11111,
            "increment {i} saw an out-of-order state"
        );
    }
    for m in 0..5 {
        assert_eq!(word(&group, m, 8) as u32, 299);
        assert_eq!(word(&group, m, 16), 50);
    }
    assert!(group.messages_lost > 0 && group.messages_duplicated > 0, "the network did misbehave");
}

#[test]
fn a_caller_with_another_tenants_token_is_refused_and_changes_nothing() {
    let mut group = SimCluster::new(6, 3, 64, caller_config(), NetFaults::none());
    let mut config = group.caller.group().clone();
    config.token = Token(*b"not-the-tenant!!");
    group.caller = GroupCaller::new(config.clone(), config.caller, caller_config()).unwrap();
    let r = group.execute(vec![Operation::write(0, Bytes::from_static(b"evil"))]);
    assert_eq!(r[0], Err(GroupError::Unauthorized));
    for m in 0..3 {
        assert!(group.members[m].memory().bytes().iter().all(|b| *b == 0));
        assert_eq!(group.members[m].next_seq(), 1, "a refused operation consumes no sequence number");
    }
    // The real tenant's caller then works from sequence 1.
    config.token = SIM_TOKEN;
    group.caller = GroupCaller::new(config.clone(), config.caller, caller_config()).unwrap();
    assert!(group.execute(vec![Operation::write(0, Bytes::from_static(b"good"))])[0].is_ok());
}

fn config(chain: Vec<NodeId>, region_bytes: u64) -> GroupConfig {
    GroupConfig {
        group: GroupId(77),
        tenant: SIM_TENANT,
        token: SIM_TOKEN,
        epoch: 1,
        chain,
        caller: NodeId(9),
        region_bytes,
        start_seq: 1,
    }
}

#[test]
fn initialize_binds_a_group_to_a_real_region_of_the_tokens_tenant_only() {
    let dir = chorus_region::default_region_dir().join(format!("group-test-{}", std::process::id()));
    let store = RegionStore::open(&dir, FlushBackend::Msync).unwrap();
    let region = store.register(SIM_TENANT, "db", 4096).unwrap();
    let foreign = store.register(TenantId(99), "db", 4096).unwrap();
    assert!(matches!(
        ChainMember::new(config(vec![NodeId(0)], 4096), NodeId(0), foreign.tenant(), foreign),
        Err(InitError::ForeignRegion { .. })
    ));
    let small = store.register(SIM_TENANT, "small", 1024).unwrap();
    assert!(matches!(
        ChainMember::new(config(vec![NodeId(0)], 4096), NodeId(0), SIM_TENANT, small),
        Err(InitError::RegionTooSmall { .. })
    ));
    assert!(matches!(
        ChainMember::new(config(vec![NodeId(1)], 4096), NodeId(0), SIM_TENANT, Region::volatile_for_test()),
        Err(InitError::NotInChain(_))
    ));

    // A one-member chain over the mmap'd region, driven by hand.
    let cfg = config(vec![NodeId(0)], 4096);
    let mut member = ChainMember::new(cfg.clone(), NodeId(0), SIM_TENANT, region).unwrap();
    let mut caller = GroupCaller::new(cfg, NodeId(9), caller_config()).unwrap();
    let mut out = GroupOutbox::default();
    let now = Time::ZERO;
    caller.submit(
        now,
        RequestId(1),
        Operation::write(100, Bytes::from_static(b"persist")).durable(),
        &mut out,
    );
    let (to, message) = out.messages.pop().unwrap();
    assert_eq!(to, NodeId(0));
    member.on_message(now, NodeId(9), message, &mut out);
    let (to, ack) = out.messages.pop().unwrap();
    assert_eq!(to, NodeId(9));
    caller.on_message(now, NodeId(0), ack, &mut out);
    assert_eq!(out.completions.len(), 1);
    assert!(out.completions[0].1.is_ok());
    assert_eq!(member.memory().flushes(), 1, "the gFLUSH reached msync");
    assert_eq!(member.memory().dirty_range(), None);
    drop(member);
    let reopened = store.register(SIM_TENANT, "db", 4096).unwrap();
    assert_eq!(reopened.read_vec(100, 7).unwrap(), b"persist");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A tiny stand-in so the NotInChain check has a region to reject.
struct Region;
impl Region {
    fn volatile_for_test() -> chorus_region::Region {
        chorus_region::Region::volatile(SIM_TENANT, "v", 4096).unwrap()
    }
}

/// Route every message in `out` to its member until nothing is left but what goes to the
/// caller (returned). A chain of members at nodes 0, 1, 2; the caller is node 9.
fn route(members: &mut [ChainMember<SimMemory>], now: Time, out: &mut GroupOutbox) -> Vec<GroupMessage> {
    let mut to_caller = Vec::new();
    while !out.messages.is_empty() {
        let (to, message) = out.messages.remove(0);
        if to == NodeId(9) {
            to_caller.push(message);
            continue;
        }
        let from = if to == NodeId(0) { NodeId(9) } else { NodeId(to.0 - 1) };
        members[to.0 as usize].on_message(now, from, message, out);
    }
    to_caller
}

/// Issue 17, docs/protocols/chain.md ("the read lock and the group write lock"): a node's
/// reader holds member 1's lock word (a reader count, taken by the node's own CAS on the mapped
/// region, as `chorus node` does beside a group host) when the coordinator's write-lock gCAS
/// arrives with the batch's execute operations pipelined behind it. The lock yields to the
/// readers: member 1 applies none of the batch, forwards none and the tail acknowledges none
/// (so the reader can never see half an execution, and the coordinator never sees a failed
/// lock). Once the reader has left, the caller's retransmission applies the whole batch at
/// member 1 exactly once, and a late duplicate changes nothing.
#[test]
fn a_write_lock_yields_to_readers_and_nothing_pipelined_behind_it_is_applied() {
    use chorus_group::txn::WRITER_BIT;
    const LOCK: u64 = 0;
    let cfg = config(vec![NodeId(0), NodeId(1), NodeId(2)], 4096);
    let mut members: Vec<ChainMember<SimMemory>> = (0..3)
        .map(|n| ChainMember::new(cfg.clone(), NodeId(n), SIM_TENANT, SimMemory::new(4096)).unwrap())
        .collect();
    let mut caller = GroupCaller::new(cfg, NodeId(9), caller_config()).unwrap();
    members[0].memory_mut().write(64, b"the log record").unwrap();
    // A reader at member 1 (the reader count 1 in its lock word).
    assert_eq!(members[1].memory_mut().cas(LOCK, 0, 1).unwrap(), 0);

    let batch = [
        Operation::cas(LOCK, 0, WRITER_BIT | 1, 0b111).yielding_to_readers(),
        Operation::write(64, Bytes::from_static(b"the log record")),
        Operation::memcpy(64, 1024, 14).durable(),
        Operation::write(8, Bytes::from(78u64.to_le_bytes().to_vec())).durable(),
    ];
    let mut out = GroupOutbox::default();
    let mut now = Time::ZERO;
    for (r, operation) in batch.iter().enumerate() {
        caller.submit(now, RequestId(r as u64), operation.clone(), &mut out);
    }
    let first_copies = out.messages.clone();
    let acks = route(&mut members, now, &mut out);
    assert!(acks.is_empty(), "nothing of the batch reached the tail: {acks:?}");
    assert_eq!(members[0].memory().load_u64(LOCK).unwrap(), WRITER_BIT | 1, "the head took the lock");
    assert_eq!(&members[0].memory().bytes()[1024..1038], b"the log record", "and executed");
    for (m, member) in members.iter().enumerate().skip(1) {
        let memory = member.memory();
        assert_eq!(member.next_seq(), 1, "member {m}: the refused lock consumed no sequence number");
        assert_eq!(memory.load_u64(8).unwrap(), 0, "member {m}: the head word was not written");
        assert!(memory.bytes()[64..].iter().all(|b| *b == 0), "member {m}: nothing of the batch applied");
    }
    assert_eq!(members[1].memory().load_u64(LOCK).unwrap(), 1, "the reader's count is intact");
    assert!(members[1].stats().yielded_to_readers >= 1);

    // Still held at the caller's retransmission: refused again.
    now = now + Time::from_millis(5);
    caller.on_tick(now, &mut out);
    assert!(route(&mut members, now, &mut out).is_empty(), "still nothing while the reader holds the word");
    assert_eq!(members[1].next_seq(), 1);

    // The reader leaves; the next retransmission carries the whole batch through.
    assert_eq!(members[1].memory_mut().cas(LOCK, 1, 0).unwrap(), 1);
    now = now + Time::from_millis(5);
    caller.on_tick(now, &mut out);
    for ack in route(&mut members, now, &mut out) {
        caller.on_message(now, NodeId(2), ack, &mut out);
    }
    let mut completions = std::mem::take(&mut out.completions);
    completions.sort_by_key(|(request, _)| request.0);
    assert_eq!(completions.len(), 4, "every operation completed once: {completions:?}");
    let lock = completions[0].1.as_ref().expect("the lock completed");
    assert_eq!(lock.swapped_map(0), 0b111, "the lock was taken at every member, never refused");
    assert!(completions.iter().all(|(_, result)| result.is_ok()));
    for (m, member) in members.iter().enumerate() {
        assert_eq!(member.next_seq(), 5, "member {m}");
        assert_eq!(member.stats().applied, 4, "member {m} applied each operation exactly once");
        assert_eq!(member.memory().load_u64(LOCK).unwrap(), WRITER_BIT | 1, "member {m}");
        assert_eq!(&member.memory().bytes()[1024..1038], b"the log record", "member {m}");
        assert_eq!(member.memory().load_u64(8).unwrap(), 78, "member {m}");
    }

    // A late duplicate of the first copies changes nothing (at-most-once by sequence number).
    members[1].memory_mut().write(1024, b"overwritten!!!").unwrap();
    let applied = members[1].stats().applied;
    out.messages = first_copies;
    for late in route(&mut members, now, &mut out) {
        caller.on_message(now, NodeId(2), late, &mut out);
    }
    assert!(out.completions.is_empty(), "no operation completes twice");
    assert_eq!(members[1].stats().applied, applied, "no duplicate was applied again");
    assert_eq!(&members[1].memory().bytes()[1024..1038], b"overwritten!!!");
}

/// A write lock that finds another writer (not readers) is not held back: it is applied,
/// fails its compare, and reports the word, as any gCAS does (the caller undoes, §4.2).
#[test]
fn a_write_lock_that_finds_a_writer_fails_as_any_gcas() {
    use chorus_group::txn::WRITER_BIT;
    let mut group = SimCluster::new(8, 3, 64, caller_config(), NetFaults::none());
    group.members[2].memory_mut().cas(0, 0, WRITER_BIT | 7).unwrap();
    let r = group.execute(vec![Operation::cas(0, 0, WRITER_BIT | 1, 0b111).yielding_to_readers()]);
    assert_eq!(r[0].as_ref().unwrap().result_map, vec![Some(0), Some(0), Some(WRITER_BIT | 7)]);
    assert!(group.members.iter().all(|m| m.stats().yielded_to_readers == 0));
}

/// A region whose flushes fail, as a full disk or an I/O error under the region file would.
struct FailingFlush(SimMemory);
impl RegionMemory for FailingFlush {
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), chorus_region::RegionError> {
        self.0.read(offset, buf)
    }
    fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), chorus_region::RegionError> {
        self.0.write(offset, data)
    }
    fn memcpy(&mut self, src: u64, dst: u64, len: u64) -> Result<(), chorus_region::RegionError> {
        self.0.memcpy(src, dst, len)
    }
    fn cas(&mut self, offset: u64, old: u64, new: u64) -> Result<u64, chorus_region::RegionError> {
        self.0.cas(offset, old, new)
    }
    fn flush(&mut self) -> Result<(), chorus_region::RegionError> {
        let source = std::io::Error::other("no space left on the test device");
        Err(chorus_region::RegionError::Io { context: "msync".into(), source })
    }
}

/// A group host defers a frame's gFLUSHes to the end of its turn (`chorus group-host --sync`).
/// If that one flush fails, the durable write the turn applied must not be forwarded or
/// acknowledged: the member fails and the caller hears why.
#[test]
fn a_failed_turn_flush_lets_nothing_of_the_turn_leave_and_fails_the_member() {
    let cfg = config(vec![NodeId(0), NodeId(1)], 4096);
    let memory = chorus_region::TurnFlush::new(FailingFlush(SimMemory::new(4096)));
    let mut member = ChainMember::new(cfg.clone(), NodeId(0), SIM_TENANT, memory).unwrap();
    let mut caller = GroupCaller::new(cfg, NodeId(9), caller_config()).unwrap();
    let mut out = GroupOutbox::default();
    let write = Operation::write(100, Bytes::from_static(b"must not leave")).durable();
    caller.submit(Time::ZERO, RequestId(1), write, &mut out);
    let (_, op) = out.messages.pop().unwrap();
    member.on_message(Time::ZERO, NodeId(9), op, &mut out);
    assert!(out.messages.iter().any(|(to, _)| *to == NodeId(1)), "applied and queued for the next member");

    let reason = member.flush_turn_or_fail(&mut out).unwrap_err();
    assert!(reason.contains("no space left"), "{reason}");
    assert_eq!(member.failure(), Some(reason.as_str()));
    assert_eq!(out.messages.len(), 1, "only the refusal: {:?}", out.messages);
    let (to, refusal) = out.messages.pop().unwrap();
    assert_eq!(to, NodeId(9));
    assert!(matches!(refusal, GroupMessage::Refused { .. }), "{refusal:?}");
    caller.on_message(Time::ZERO, NodeId(0), refusal, &mut out);
    assert!(matches!(out.completions.pop(), Some((RequestId(1), Err(_)))), "the caller is told it failed");
}
