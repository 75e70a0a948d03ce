//! The chain store replica: one HyperLoop group member (its region) on every node, and on the
//! head's node the coordinator that drives the group (the paper's MongoDB front end, §5.2).
//!
//! Write path, per batch of client updates (HyperLoop §5):
//! 1. gCAS the group write lock on every member, pipelined with `Append`: one gWRITE+gFLUSH
//!    of the redo record into every member's log;
//! 2. once both are acknowledged by the tail, `ExecuteAndAdvance`: one gMEMCPY+gFLUSH per
//!    entry from the log to the database, then gWRITE+gFLUSH of the log head;
//! 3. once the tail acknowledges that, every member has executed the batch: the clients get
//!    their answers, and the unlock gCAS goes out ahead of the next batch's lock and append.
//!
//! Reads are served from the replica's own region (never from in-memory state): at the tail
//! without a lock; at any other replica under a read lock (a reader count in its own lock
//! word, refused while the group write lock is held, so the read waits for the unlock).
//!
//! Failures (§5.1): the membership service's view decides the chain. On every new view the
//! head's node becomes (or stays) the coordinator and recovers before serving writes: it
//! fences reads everywhere, redoes from its own log the last executed record and the pending
//! one (re-appended verbatim, then executed), and unlocks. Upstream members have applied a
//! superset of what downstream ones did, so the head's log holds everything any survivor has.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bytes::Bytes;
use chorus_core::{
    ClientRequestId, Command, CommandError, Key, NodeId, Outbox, Outcome, Replica, Time, Value, View,
};
use chorus_group::txn::WRITER_BIT;
use chorus_group::{
    CallerConfig, ChainMember, GroupCaller, GroupConfig, GroupError, GroupId, GroupMessage, GroupOutbox,
    OpOutcome, Operation, RequestId, Token,
};
use chorus_region::{Region, RegionMemory, TenantId};
use rustc_hash::FxHashMap;

use crate::config::{Bug, ChainConfig};
use crate::layout::{
    encode_record, lookup, parse_record, record_start, ChainLayout, Record, HEAD_OFFSET, LOCK_OFFSET,
    MAGIC_OFFSET, RECORD_ENTRY_HEADER_BYTES, RECORD_HEADER_BYTES, RECOVERING,
};
use crate::message::Message;
use crate::mirror::Mirror;

/// The coordinator is not a chain member (`GroupConfig::check`), so it gets an id no replica
/// has; its messages never cross the network: it lives on the head's node.
pub const COORDINATOR: NodeId = NodeId(u8::MAX);
const GROUP: GroupId = GroupId(1);
const TENANT: TenantId = TenantId(0);
/// Peer links are already authenticated with the cluster token; the group token only keeps
/// the group core's §7 check meaningful within one cluster.
const TOKEN: Token = Token(*b"chorus-chain-grp");
/// The owner id in the write-lock word.
const OWNER: u64 = 1;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChainStats {
    pub reads_tail: u64,
    pub reads_locked: u64,
    pub reads_parked: u64,
    pub batches: u64,
    pub records_appended: u64,
    pub updates_executed: u64,
    pub recoveries: u64,
    pub lock_failures: u64,
    pub forward_retransmits: u64,
    pub views_installed: u64,
}

#[derive(Clone, Copy, Debug)]
enum Origin {
    Local(ClientRequestId),
    Remote { node: NodeId, seq: u64 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OpKind {
    Recovery,
    Lock,
    Undo,
    Append,
    Execute,
    Unlock,
}

enum Phase {
    /// Waiting for `waiting` recovery operations.
    Recovering {
        waiting: usize,
    },
    Idle,
    /// Lock and append in flight.
    Appending {
        waiting: usize,
    },
    Executing {
        waiting: usize,
    },
    /// A group operation failed in a way only a new view can repair.
    Broken,
}

struct Batch {
    items: Vec<(Origin, Outcome)>,
    record: Option<Record>,
}

struct Coordinator {
    caller: GroupCaller,
    mirror: Option<Mirror>,
    phase: Phase,
    queue: VecDeque<(Origin, Command)>,
    batch: Option<Batch>,
    ops: FxHashMap<RequestId, OpKind>,
    next_request: u64,
    /// The log sequence number after the last executed record (the next append goes there).
    log_tail: u64,
}

#[derive(Default)]
struct Session {
    /// Every update of the origin below this was answered and is forgotten: a late copy of
    /// its forward is a duplicate.
    done_below: u64,
    accepted: BTreeSet<u64>,
    done: BTreeMap<u64, Outcome>,
}

struct Outstanding {
    request: ClientRequestId,
    command: Command,
    sent_at: Time,
}

pub struct Chain {
    config: ChainConfig,
    view: View,
    member: Option<ChainMember<Region>>,
    /// Set when the region could not be used; the replica serves nothing.
    region_error: Option<String>,
    coordinator: Option<Coordinator>,
    sessions: FxHashMap<NodeId, Session>,
    next_seq: u64,
    outstanding: BTreeMap<u64, Outstanding>,
    parked_reads: VecDeque<(ClientRequestId, Key)>,
    /// `None`: no membership service (serve as if the lease never expires).
    lease: Option<Option<Time>>,
    now: Time,
    stats: ChainStats,
}

fn group_config(view: View, layout: &ChainLayout) -> GroupConfig {
    GroupConfig {
        group: GROUP,
        tenant: TENANT,
        token: TOKEN,
        epoch: view.epoch.0,
        chain: view.live.iter().collect(),
        caller: COORDINATOR,
        region_bytes: layout.region_bytes(),
        start_seq: 1,
    }
}

impl Chain {
    /// A replica over a fresh in-memory region (simulator, tests).
    pub fn new(config: ChainConfig) -> Chain {
        let region =
            Region::volatile(TENANT, "chain", config.layout.region_bytes()).expect("layout fits in memory");
        Chain::with_region(config, region)
    }

    /// A replica over `region` (the server's mmap'd file, possibly holding an earlier run's
    /// data). A region of another layout is refused: the replica then serves nothing and
    /// says why in every error.
    pub fn with_region(config: ChainConfig, region: Region) -> Chain {
        assert!(config.retransmit_timeout > Time::ZERO, "retransmit_timeout must be positive");
        assert!(config.window_max > 0, "window_max must be positive");
        let view = config.initial_view;
        let mut region_error = config.layout.check_region(&region).err();
        let member = if view.live.contains(config.me) && region_error.is_none() {
            match ChainMember::new(group_config(view, &config.layout), config.me, TENANT, region) {
                Ok(member) => Some(member),
                Err(error) => {
                    region_error = Some(error.to_string());
                    None
                }
            }
        } else {
            None
        };
        let mut chain = Chain {
            config,
            view,
            member,
            region_error,
            coordinator: None,
            sessions: FxHashMap::default(),
            next_seq: 0,
            outstanding: BTreeMap::new(),
            parked_reads: VecDeque::new(),
            lease: None,
            now: Time::ZERO,
            stats: ChainStats::default(),
        };
        let mut out = Outbox::default();
        chain.become_coordinator_if_head(Time::ZERO, &mut out);
        debug_assert!(out.replies.is_empty());
        // The first recovery's messages are all local or retransmitted by the caller's timer.
        chain
    }

    pub fn view(&self) -> View {
        self.view
    }
    pub fn stats(&self) -> ChainStats {
        self.stats
    }
    pub fn layout(&self) -> ChainLayout {
        self.config.layout
    }
    pub fn is_operational(&self) -> bool {
        self.member.is_some()
    }
    /// Whether the coordinator (on the head) has recovered and accepts batches.
    pub fn is_coordinating(&self) -> bool {
        self.coordinator.as_ref().is_some_and(|c| c.mirror.is_some())
    }
    pub fn region(&self) -> Option<&Region> {
        self.member.as_ref().map(|member| member.memory())
    }
    pub fn region_error(&self) -> Option<&str> {
        self.region_error.as_deref()
    }

    /// The value this replica's region holds for `key` (no lock: for inspection).
    pub fn stored_value(&self, key: &[u8]) -> Option<Value> {
        let region = self.region()?;
        lookup(region, &self.config.layout, key).ok().flatten()
    }

    /// Every key with a value in this replica's region.
    pub fn stored_keys(&self) -> Vec<Key> {
        let Some(region) = self.region() else { return Vec::new() };
        Mirror::rebuild(region, self.config.layout).map(|mirror| mirror.keys()).unwrap_or_default()
    }

    fn head(&self) -> Option<NodeId> {
        self.view.live.iter().next()
    }
    fn is_tail(&self) -> bool {
        self.view.live.iter().last() == Some(self.config.me)
    }

    #[inline(always)]
    fn has_bug(&self, _bug: Bug) -> bool {
        #[cfg(feature = "broken-variants")]
        return self.config.bug == Some(_bug);
        #[cfg(not(feature = "broken-variants"))]
        false
    }

    fn leased(&self, now: Time) -> bool {
        match self.lease {
            None => true,
            Some(until) => until.is_some_and(|until| now < until),
        }
    }

    // ------------------------------------------------------------------ reads

    /// Serve a read from this replica's own region, or say it must wait.
    fn try_read(&mut self, now: Time, key: &Key) -> Option<Outcome> {
        if !self.leased(now) {
            return None;
        }
        let tail = self.is_tail();
        let lock_free = self.has_bug(Bug::ReadWithoutLock);
        let layout = self.config.layout;
        let member = self.member.as_mut()?;
        let region = member.memory_mut();
        let word = region.load_u64(LOCK_OFFSET).ok()?;
        let result = if tail && word != RECOVERING {
            // HyperLoop §5: lock-free one-sided reads at the tail. Everything the tail has
            // executed is executed everywhere.
            self.stats.reads_tail += 1;
            lookup(region, &layout, key)
        } else if lock_free && word != RECOVERING {
            self.stats.reads_locked += 1;
            lookup(region, &layout, key)
        } else {
            // rdLock: a reader count in this replica's lock word, refused while the group
            // write lock (or recovery) holds it. Not group-wide (§5).
            if word & WRITER_BIT != 0 {
                return None;
            }
            let original = region.cas(LOCK_OFFSET, word, word + 1).ok()?;
            debug_assert_eq!(original, word, "the core is the only writer of its region between calls");
            let value = lookup(region, &layout, key);
            let _ = region.cas(LOCK_OFFSET, word + 1, word);
            self.stats.reads_locked += 1;
            value
        };
        Some(match result {
            Ok(value) => Outcome::Value(value),
            Err(_) => Outcome::Error(CommandError::Unavailable("the chain region is corrupt")),
        })
    }

    fn retry_parked_reads(&mut self, now: Time, out: &mut Outbox<Message>) {
        for _ in 0..self.parked_reads.len() {
            let Some((request, key)) = self.parked_reads.pop_front() else { break };
            match self.try_read(now, &key) {
                Some(outcome) => out.reply(request, outcome),
                None => self.parked_reads.push_back((request, key)),
            }
        }
    }

    // ------------------------------------------------------------------ updates

    fn done_below(&self) -> u64 {
        self.outstanding.keys().next().copied().unwrap_or(self.next_seq)
    }

    fn send_forward(&mut self, seq: u64, out: &mut Outbox<Message>) {
        let Some(head) = self.head() else { return };
        let done_below = self.done_below();
        let Some(pending) = self.outstanding.get(&seq) else { return };
        out.send(
            head,
            Message::Forward { epoch: self.view.epoch, seq, done_below, command: pending.command.clone() },
        );
    }

    fn on_forward(
        &mut self,
        now: Time,
        from: NodeId,
        seq: u64,
        done_below: u64,
        command: Command,
        out: &mut Outbox<Message>,
    ) {
        if self.coordinator.is_none() {
            return;
        }
        let epoch = self.view.epoch;
        let session = self.sessions.entry(from).or_default();
        session.done_below = session.done_below.max(done_below);
        session.done = session.done.split_off(&session.done_below);
        if let Some(outcome) = session.done.get(&seq) {
            out.send(from, Message::Done { epoch, seq, outcome: outcome.clone() });
            return;
        }
        if seq < session.done_below || !session.accepted.insert(seq) {
            return;
        }
        let coordinator = self.coordinator.as_mut().expect("checked");
        coordinator.queue.push_back((Origin::Remote { node: from, seq }, command));
        self.drive(now, GroupOutbox::default(), out);
    }

    fn answer(&mut self, origin: Origin, outcome: Outcome, out: &mut Outbox<Message>) {
        match origin {
            Origin::Local(request) => out.reply(request, outcome),
            Origin::Remote { node, seq } => {
                let session = self.sessions.entry(node).or_default();
                session.accepted.remove(&seq);
                session.done.insert(seq, outcome.clone());
                out.send(node, Message::Done { epoch: self.view.epoch, seq, outcome });
            }
        }
    }

    // ------------------------------------------------------------------ the coordinator

    fn become_coordinator_if_head(&mut self, now: Time, out: &mut Outbox<Message>) {
        if self.head() != Some(self.config.me) || self.member.is_none() {
            return;
        }
        let caller_config = CallerConfig {
            retransmit_after: self.config.retransmit_timeout,
            // Never give up: a dead member is the membership service's to remove (§5.1), and
            // the next view reconfigures the chain.
            attempts_max: u32::MAX,
            window_max: self.config.window_max,
        };
        let caller =
            GroupCaller::new(group_config(self.view, &self.config.layout), COORDINATOR, caller_config)
                .expect("the group configuration is valid");
        self.coordinator = Some(Coordinator {
            caller,
            mirror: None,
            phase: Phase::Recovering { waiting: 0 },
            queue: VecDeque::new(),
            batch: None,
            ops: FxHashMap::default(),
            next_request: 0,
            log_tail: 0,
        });
        self.start_recovery(now, out);
    }

    /// §5.1: fence reads at every member, redo the last executed and the pending record from
    /// this (the head's) log, and, once the tail acknowledged all that, unlock.
    fn start_recovery(&mut self, now: Time, out: &mut Outbox<Message>) {
        self.stats.recoveries += 1;
        let layout = self.config.layout;
        let region = self.member.as_ref().expect("the coordinator's node is a member").memory();
        let head = region.load_u64(HEAD_OFFSET).unwrap_or(0);
        let last = region.load_u64(HEAD_OFFSET + 8).unwrap_or(0);
        let mut records: Vec<Record> = Vec::new();
        if last < head {
            if let Some(record) = parse_record(region, &layout, last).filter(|r| r.end == head) {
                records.push(record);
            }
        }
        if let Some(record) = parse_record(region, &layout, head) {
            records.push(record);
        }
        let mut operations = vec![Operation::write(LOCK_OFFSET, RECOVERING.to_le_bytes().to_vec()).durable()];
        for record in &records {
            operations.push(Operation::write(record.base, record.bytes.clone()).durable());
        }
        for record in &records {
            operations.extend(execute_operations(record));
        }
        operations.push(Operation::write(MAGIC_OFFSET, layout.magic_words()).durable());
        // The unlock goes out only once the tail has acknowledged all of this: a replica
        // upstream must not serve the redone state before the tail has it.
        let coordinator = self.coordinator.as_mut().expect("recovering coordinator");
        coordinator.phase = Phase::Recovering { waiting: operations.len() };
        let mut gout = GroupOutbox::default();
        for operation in operations {
            coordinator.submit(now, OpKind::Recovery, operation, &mut gout);
        }
        self.drive(now, gout, out);
    }

    /// Route group messages (locally to this node's member or coordinator, or to peers) and
    /// handle completions until nothing is left.
    fn drive(&mut self, now: Time, mut gout: GroupOutbox, out: &mut Outbox<Message>) {
        let me = self.config.me;
        let mut applied = false;
        loop {
            if gout.messages.is_empty() && gout.completions.is_empty() {
                if self
                    .coordinator
                    .as_ref()
                    .is_some_and(|c| matches!(c.phase, Phase::Idle) && !c.queue.is_empty())
                {
                    self.start_batch(now, &mut gout, out);
                    if gout.is_empty() {
                        continue;
                    }
                } else {
                    break;
                }
            }
            let messages = std::mem::take(&mut gout.messages);
            for (to, message) in messages {
                let for_caller = !matches!(message, GroupMessage::Op { .. });
                if for_caller {
                    // The tail's ack or a refusal, addressed to the coordinator.
                    match self.head() {
                        Some(head) if head == me => {
                            if let Some(coordinator) = self.coordinator.as_mut() {
                                coordinator.caller.on_message(now, me, message, &mut gout);
                            }
                        }
                        Some(head) => out.send(head, Message::Group(message)),
                        None => {}
                    }
                } else if to == me {
                    if let Some(member) = self.member.as_mut() {
                        member.on_message(now, COORDINATOR, message, &mut gout);
                        applied = true;
                    }
                } else {
                    out.send(to, Message::Group(message));
                }
            }
            let completions = std::mem::take(&mut gout.completions);
            for (request, result) in completions {
                self.on_completion(now, request, result, &mut gout, out);
            }
        }
        if applied {
            self.retry_parked_reads(now, out);
        }
    }

    fn on_completion(
        &mut self,
        now: Time,
        request: RequestId,
        result: Result<OpOutcome, GroupError>,
        gout: &mut GroupOutbox,
        out: &mut Outbox<Message>,
    ) {
        let Some(coordinator) = self.coordinator.as_mut() else { return };
        let Some(kind) = coordinator.ops.remove(&request) else { return };
        let outcome = match result {
            Ok(outcome) => outcome,
            Err(GroupError::Reconfigured) => return, // the new view's recovery takes over
            Err(_) => {
                // Only a new view repairs the group; the batch's outcome is unknown.
                coordinator.phase = Phase::Broken;
                self.fail_batch(out);
                return;
            }
        };
        let all = coordinator.caller.group().all_members();
        match (kind, &mut coordinator.phase) {
            (OpKind::Recovery, Phase::Recovering { waiting }) => {
                *waiting -= 1;
                if *waiting == 0 {
                    let unlock = Operation::write(LOCK_OFFSET, 0u64.to_le_bytes().to_vec()).durable();
                    coordinator.submit(now, OpKind::Unlock, unlock, gout);
                    self.finish_recovery(out);
                }
            }
            (OpKind::Lock, Phase::Executing { waiting }) => {
                let swapped = outcome.swapped_map(0);
                if swapped != all {
                    // Cannot happen with one coordinator per epoch and reads that hold their
                    // read lock only within one call; if it does, the batch ran without
                    // isolation somewhere. Undo the partial success (§4.2) and stop writing
                    // until a new view's recovery re-establishes one state.
                    self.stats.lock_failures += 1;
                    if swapped != 0 {
                        let undo = Operation::cas(LOCK_OFFSET, WRITER_BIT | OWNER, 0, swapped);
                        coordinator.submit(now, OpKind::Undo, undo, gout);
                    }
                    coordinator.phase = Phase::Broken;
                    self.fail_batch(out);
                    return;
                }
                *waiting -= 1;
                if *waiting == 0 {
                    self.finish_batch(now, gout, out);
                }
            }
            (OpKind::Append, Phase::Appending { waiting }) => {
                *waiting -= 1;
                if *waiting == 0 {
                    self.execute(now, gout);
                }
            }
            (OpKind::Execute, Phase::Executing { waiting }) => {
                *waiting -= 1;
                if *waiting == 0 {
                    self.finish_batch(now, gout, out);
                }
            }
            (OpKind::Undo | OpKind::Unlock, _) => {}
            (kind, _) => debug_assert!(false, "completion of {kind:?} in an unexpected phase"),
        }
    }

    fn finish_recovery(&mut self, out: &mut Outbox<Message>) {
        let layout = self.config.layout;
        let region = self.member.as_ref().expect("coordinator is a member").memory();
        let head = region.load_u64(HEAD_OFFSET).unwrap_or(0);
        let coordinator = self.coordinator.as_mut().expect("recovering");
        match Mirror::rebuild(region, layout) {
            Ok(mirror) => {
                coordinator.mirror = Some(mirror);
                coordinator.log_tail = head;
                coordinator.phase = Phase::Idle;
            }
            Err(error) => {
                self.region_error = Some(error.to_string());
                coordinator.phase = Phase::Broken;
                let queued: Vec<Origin> = coordinator.queue.drain(..).map(|(origin, _)| origin).collect();
                for origin in queued {
                    self.answer(
                        origin,
                        Outcome::Error(CommandError::Unavailable("the chain region is corrupt")),
                        out,
                    );
                }
            }
        }
    }

    /// Plan the queued updates into one redo record, against the state every member has
    /// executed (the previous batch is done), and send lock + append.
    fn start_batch(&mut self, now: Time, gout: &mut GroupOutbox, out: &mut Outbox<Message>) {
        let layout = self.config.layout;
        let region = self.member.as_ref().expect("coordinator is a member").memory();
        let coordinator = self.coordinator.as_mut().expect("coordinating");
        let mirror = coordinator.mirror.as_mut().expect("recovered");
        let cap = layout.record_bytes_max();
        let mut used = RECORD_HEADER_BYTES;
        let mut entries: Vec<(u64, Bytes)> = Vec::new();
        let mut items = Vec::new();
        let mut overlay: FxHashMap<Key, Option<Value>> = FxHashMap::default();
        while let Some((_, command)) = coordinator.queue.front() {
            // A hash update's new value is the current hash plus its pairs; only hash updates
            // need the current value's size, so only they read it here.
            let is_hash_update = matches!(
                command,
                Command::Rmw {
                    op: chorus_core::RmwOp::HashSet { .. } | chorus_core::RmwOp::HashDelete(_),
                    ..
                }
            );
            let current_bytes = if !is_hash_update {
                0
            } else if let Some(value) = overlay.get(command.key()) {
                value.as_ref().map_or(0, |v| v.len())
            } else {
                mirror.value(region, command.key()).ok().flatten().map_or(0, |v| v.len())
            };
            let bound = update_bytes_bound(command, current_bytes);
            if !items.is_empty() && used + bound > cap {
                break;
            }
            let (origin, command) = coordinator.queue.pop_front().expect("front exists");
            let (key, write, outcome) = match command {
                Command::Write { key, value } => (key, Some(value), Outcome::Written),
                Command::Rmw { key, op } => {
                    let current = match overlay.get(&key) {
                        Some(value) => value.clone(),
                        None => match mirror.value(region, &key) {
                            Ok(value) => value,
                            Err(_) => {
                                let error = CommandError::Unavailable("the chain region is corrupt");
                                items.push((origin, Outcome::Error(error)));
                                continue;
                            }
                        },
                    };
                    let effect = op.apply(current.as_ref());
                    (key, effect.write, effect.outcome)
                }
                Command::Read { .. } => unreachable!("reads never reach the coordinator"),
            };
            let Some(value) = write else {
                items.push((origin, outcome));
                continue;
            };
            match mirror.plan(&key, value.as_ref()) {
                Ok(planned) => {
                    used +=
                        planned.iter().map(|(_, d)| RECORD_ENTRY_HEADER_BYTES + d.len() as u64).sum::<u64>();
                    entries.extend(planned);
                    overlay.insert(key, value);
                    items.push((origin, outcome));
                }
                Err(error) => {
                    items.push((origin, Outcome::Error(CommandError::Unavailable(error.message()))))
                }
            }
        }
        mirror.end_batch();
        self.stats.batches += 1;
        if entries.is_empty() {
            // Nothing to write (reads-only RMWs, deletes of absent keys, refusals): the state
            // they saw is executed everywhere, so they are answered now.
            for (origin, outcome) in items {
                self.answer(origin, outcome, out);
            }
            return;
        }
        let len = encode_record(&layout, 0, &entries).bytes.len() as u64;
        debug_assert!(len <= cap);
        let lsn = record_start(coordinator.log_tail, len, layout.txn.log_bytes);
        let record = encode_record(&layout, lsn, &entries);
        coordinator.submit(
            now,
            OpKind::Append,
            Operation::write(record.base, record.bytes.clone()).durable(),
            gout,
        );
        coordinator.phase = Phase::Appending { waiting: 1 };
        coordinator.batch = Some(Batch { items, record: Some(record) });
        self.stats.records_appended += 1;
    }

    /// ExecuteAndAdvance under the group write lock: the lock gCAS goes first in the pipeline,
    /// so every member takes it before it copies anything.
    fn execute(&mut self, now: Time, gout: &mut GroupOutbox) {
        let no_lock = self.has_bug(Bug::NoWriteLock);
        let coordinator = self.coordinator.as_mut().expect("coordinating");
        let record = coordinator.batch.as_ref().and_then(|b| b.record.clone()).expect("batch has a record");
        let mut operations = execute_operations(&record);
        let mut kinds = vec![OpKind::Execute; operations.len()];
        if !no_lock {
            let all = coordinator.caller.group().all_members();
            operations.insert(0, Operation::cas(LOCK_OFFSET, 0, WRITER_BIT | OWNER, all));
            kinds.insert(0, OpKind::Lock);
        }
        coordinator.phase = Phase::Executing { waiting: operations.len() };
        for (kind, operation) in kinds.into_iter().zip(operations) {
            coordinator.submit(now, kind, operation, gout);
        }
    }

    fn finish_batch(&mut self, now: Time, gout: &mut GroupOutbox, out: &mut Outbox<Message>) {
        let no_lock = self.has_bug(Bug::NoWriteLock);
        let coordinator = self.coordinator.as_mut().expect("coordinating");
        let batch = coordinator.batch.take().expect("executing a batch");
        if let Some(record) = &batch.record {
            coordinator.log_tail = record.end;
        }
        if !no_lock {
            let all = coordinator.caller.group().all_members();
            coordinator.submit(
                now,
                OpKind::Unlock,
                Operation::cas(LOCK_OFFSET, WRITER_BIT | OWNER, 0, all),
                gout,
            );
        }
        coordinator.phase = Phase::Idle;
        self.stats.updates_executed += batch.items.len() as u64;
        for (origin, outcome) in batch.items {
            self.answer(origin, outcome, out);
        }
    }

    fn fail_batch(&mut self, out: &mut Outbox<Message>) {
        let Some(coordinator) = self.coordinator.as_mut() else { return };
        let Some(batch) = coordinator.batch.take() else { return };
        for (origin, _) in batch.items {
            if let Origin::Local(request) = origin {
                out.reply(request, Outcome::Error(CommandError::OutcomeUnknown));
            }
            // Remote origins fail their forwards themselves when the view changes.
        }
    }

    // ------------------------------------------------------------------ views

    fn install_view(&mut self, now: Time, view: View, out: &mut Outbox<Message>) {
        self.view = view;
        self.stats.views_installed += 1;
        // Whatever was in flight has an unknown outcome; the new coordinator redoes the log.
        self.fail_batch(out);
        if let Some(coordinator) = self.coordinator.take() {
            for (origin, _) in coordinator.queue {
                if let Origin::Local(request) = origin {
                    out.reply(request, Outcome::Error(CommandError::OutcomeUnknown));
                }
            }
        }
        self.sessions.clear();
        for (_, pending) in std::mem::take(&mut self.outstanding) {
            out.reply(pending.request, Outcome::Error(CommandError::OutcomeUnknown));
        }
        if !view.live.contains(self.config.me) {
            self.member = None;
            for (request, _) in std::mem::take(&mut self.parked_reads) {
                out.reply(request, Outcome::Error(CommandError::Unavailable("not in the current view")));
            }
            return;
        }
        let Some(member) = self.member.as_mut() else { return };
        let mut gout = GroupOutbox::default();
        if let Err(error) = member.on_config(now, group_config(view, &self.config.layout), &mut gout) {
            self.region_error = Some(error.to_string());
            self.member = None;
            return;
        }
        self.become_coordinator_if_head(now, out);
        self.retry_parked_reads(now, out);
    }
}

impl Coordinator {
    fn submit(&mut self, now: Time, kind: OpKind, operation: Operation, gout: &mut GroupOutbox) {
        let request = RequestId(self.next_request);
        self.next_request += 1;
        self.ops.insert(request, kind);
        self.caller.submit(now, request, operation, gout);
    }
}

/// ExecuteAndAdvance for one record (§5): gMEMCPY+gFLUSH per entry, then the log head (and
/// the last executed record, for recovery) with gWRITE+gFLUSH.
fn execute_operations(record: &Record) -> Vec<Operation> {
    let mut operations: Vec<Operation> =
        record.copies.iter().map(|&(src, dst, len)| Operation::memcpy(src, dst, len).durable()).collect();
    let mut header = Vec::with_capacity(16);
    header.extend_from_slice(&record.end.to_le_bytes());
    header.extend_from_slice(&record.lsn.to_le_bytes());
    operations.push(Operation::write(HEAD_OFFSET, header).durable());
    operations
}

/// At most how many record bytes an update adds (heap entry + index slot + entry headers),
/// given the size of the key's current value.
fn update_bytes_bound(command: &Command, current_bytes: usize) -> u64 {
    use chorus_core::RmwOp;
    let value_len = match command {
        Command::Write { value, .. } => value.as_ref().map_or(0, |v| v.len()),
        Command::Rmw { op, .. } => match op {
            RmwOp::CompareAndSwap { new, .. } => new.as_ref().map_or(0, |v| v.len()),
            RmwOp::IncrementBy(_) => 20,
            RmwOp::SetIfAbsent(v) | RmwOp::SetIfPresent(v) => v.len(),
            RmwOp::Swap(v) => v.as_ref().map_or(0, |v| v.len()),
            RmwOp::HashSet { pairs, .. } => {
                let added: usize = pairs.iter().map(|(field, value)| 8 + field.len() + value.len()).sum();
                current_bytes.max(chorus_core::hash::MAGIC.len() + 4) + added
            }
            RmwOp::HashDelete(_) => current_bytes,
        },
        Command::Read { .. } => 0,
    };
    crate::layout::entry_bytes(command.key().len(), value_len) + 16 + 2 * RECORD_ENTRY_HEADER_BYTES
}

impl Replica for Chain {
    type Message = Message;

    fn id(&self) -> NodeId {
        self.config.me
    }

    fn on_client(
        &mut self,
        now: Time,
        request: ClientRequestId,
        command: Command,
        out: &mut Outbox<Message>,
    ) {
        self.now = now;
        if self.member.is_none() {
            let reason = if self.region_error.is_some() {
                "the chain region is unusable"
            } else {
                "not in the current view"
            };
            out.reply(request, Outcome::Error(CommandError::Unavailable(reason)));
            return;
        }
        if let Command::Read { key } = command {
            match self.try_read(now, &key) {
                Some(outcome) => out.reply(request, outcome),
                None => {
                    self.stats.reads_parked += 1;
                    self.parked_reads.push_back((request, key));
                }
            }
            return;
        }
        if let Some(coordinator) = self.coordinator.as_mut() {
            coordinator.queue.push_back((Origin::Local(request), command));
            self.drive(now, GroupOutbox::default(), out);
            return;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.outstanding.insert(seq, Outstanding { request, command, sent_at: now });
        self.send_forward(seq, out);
    }

    fn on_message(&mut self, now: Time, from: NodeId, message: Message, out: &mut Outbox<Message>) {
        self.now = now;
        match message {
            Message::Group(message) => {
                let mut gout = GroupOutbox::default();
                match message {
                    GroupMessage::Op { .. } => {
                        if let Some(member) = self.member.as_mut() {
                            member.on_message(now, from, message, &mut gout);
                        }
                        self.drive(now, gout, out);
                        self.retry_parked_reads(now, out);
                    }
                    _ => {
                        if let Some(coordinator) = self.coordinator.as_mut() {
                            coordinator.caller.on_message(now, from, message, &mut gout);
                            self.drive(now, gout, out);
                        }
                    }
                }
            }
            Message::Forward { epoch, seq, done_below, command } => {
                if !command.is_update() || epoch != self.view.epoch {
                    return; // another epoch's, or malformed: reads are never forwarded
                }
                self.on_forward(now, from, seq, done_below, command, out);
            }
            Message::Done { epoch, seq, outcome } => {
                if epoch != self.view.epoch || Some(from) != self.head() {
                    return;
                }
                if let Some(pending) = self.outstanding.remove(&seq) {
                    out.reply(pending.request, outcome);
                }
            }
        }
    }

    fn on_tick(&mut self, now: Time, out: &mut Outbox<Message>) {
        self.now = now;
        let mut gout = GroupOutbox::default();
        if let Some(member) = self.member.as_mut() {
            member.on_tick(now, &mut gout);
        }
        if let Some(coordinator) = self.coordinator.as_mut() {
            coordinator.caller.on_tick(now, &mut gout);
        }
        self.drive(now, gout, out);
        let due: Vec<u64> = self
            .outstanding
            .iter()
            .filter(|(_, pending)| now.saturating_sub(pending.sent_at) >= self.config.retransmit_timeout)
            .map(|(seq, _)| *seq)
            .collect();
        for seq in due {
            self.stats.forward_retransmits += 1;
            if let Some(pending) = self.outstanding.get_mut(&seq) {
                pending.sent_at = now;
            }
            self.send_forward(seq, out);
        }
        self.retry_parked_reads(now, out);
    }

    fn on_view(&mut self, now: Time, view: View, out: &mut Outbox<Message>) {
        if view.epoch <= self.view.epoch {
            return;
        }
        self.now = now;
        self.install_view(now, view, out);
    }

    fn on_lease(&mut self, now: Time, valid_until: Option<Time>, out: &mut Outbox<Message>) {
        self.lease = Some(valid_until);
        self.retry_parked_reads(now, out);
    }
}
