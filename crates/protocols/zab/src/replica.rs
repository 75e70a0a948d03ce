//! The ZAB replica: recovery (discovery and synchronisation) after every view change, then
//! broadcast (forward, propose, ACK, commit on a quorum, apply in zxid order), with
//! retransmission by timers since the network may lose, duplicate and reorder messages.

use std::collections::{BTreeMap, VecDeque};

use chorus_core::{
    ClientRequestId, Command, CommandError, Epoch, Key, NodeId, NodeSet, Outbox, Outcome, Replica, Time,
    Value, View,
};
use rustc_hash::FxHashMap;

use crate::config::{Bug, ReadMode, ZabConfig};
use crate::durable::{self, Cursor, DurableState};
use crate::log::{Entry, Zxid};
use crate::message::Message;

/// Counters for INFO, the simulator's summary and benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ZabStats {
    pub reads_local: u64,
    /// Reads served after a sync round trip to the leader.
    pub reads_synced: u64,
    pub proposals: u64,
    pub entries_applied: u64,
    /// Recoveries this replica completed as leader.
    pub recoveries: u64,
    pub retransmits: u64,
    pub messages_dropped_epoch: u64,
    pub views_installed: u64,
    /// Snapshot chunks (ZooKeeper's SNAP) this replica served and received.
    pub snapshot_chunks_served: u64,
    pub snapshot_chunks_received: u64,
    /// Snapshots this replica installed (with the history after them).
    pub snapshots_installed: u64,
}

/// A follower's answer to NEWEPOCH.
#[derive(Clone, Copy, Debug)]
struct FollowerInfo {
    current_epoch: Epoch,
    last_zxid: Zxid,
    applied_index: u64,
    /// Holds a history no acknowledged entry was lost from: counts in a discovery quorum.
    complete: bool,
    /// A pulled snapshot waits at this index (0: none) for the history after it.
    snapshot_base: u64,
}

/// A snapshot being pulled (ZooKeeper's SNAP), kept aside from the replica's own state until
/// the history after it arrives: until then the replica keeps the history it reported.
#[derive(Debug)]
struct SnapshotPull {
    source: NodeId,
    /// The last key received; the next request asks for keys after it.
    after_key: Option<Key>,
    /// The source's applied point when it served the first chunk. Later chunks may reflect
    /// later applied states (the snapshot is fuzzy, like ZooKeeper's); the entries after the
    /// base are idempotent writes, so replaying them over it yields the exact state.
    base: Option<(u64, Zxid)>,
    store: FxHashMap<Key, Value>,
    applied_seq: Vec<(NodeId, u64)>,
    done: bool,
    requested_at: Time,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Gathering follower infos from a quorum.
    Discovery,
    /// Adopting the history of `best`, which is not ours.
    Fetching { best: NodeId },
    /// Synchronising followers to the adopted history (NEWLEADER), waiting for a quorum.
    Syncing,
    /// Broadcast.
    Established,
}

struct LeaderState {
    phase: Phase,
    infos: BTreeMap<NodeId, FollowerInfo>,
    /// Followers synchronised in this epoch (they acknowledged NEWLEADER).
    synced: NodeSet,
    /// How far each synchronised follower's history matches ours.
    matched: FxHashMap<NodeId, u64>,
    /// How far each follower reported having applied (for compaction).
    applied: FxHashMap<NodeId, u64>,
    /// When each follower next gets a retransmission if it makes no progress.
    resend_at: FxHashMap<NodeId, Time>,
    fetch_resend_at: Time,
    heartbeat_at: Time,
    counter: u64,
    /// The highest `seq` of each origin in our history: the next one to propose is one more.
    proposed_seq: FxHashMap<NodeId, u64>,
    /// Each key's value after our last proposal of it, while that proposal is uncommitted:
    /// RMWs execute on it (ZooKeeper's "outstanding changes").
    pending_values: FxHashMap<Key, (u64, Option<Value>)>,
    /// Forwards waiting for recovery to finish, or for an earlier `seq` of their origin.
    forwards: BTreeMap<(NodeId, u64), Command>,
    /// The highest `floor` each origin announced (see `Message::Forward`).
    floors: FxHashMap<NodeId, u64>,
}

impl LeaderState {
    fn new() -> LeaderState {
        LeaderState {
            phase: Phase::Discovery,
            infos: BTreeMap::new(),
            synced: NodeSet::EMPTY,
            matched: FxHashMap::default(),
            applied: FxHashMap::default(),
            resend_at: FxHashMap::default(),
            fetch_resend_at: Time::ZERO,
            heartbeat_at: Time::ZERO,
            counter: 0,
            proposed_seq: FxHashMap::default(),
            pending_values: FxHashMap::default(),
            forwards: BTreeMap::new(),
            floors: FxHashMap::default(),
        }
    }
}

enum Role {
    Leader(Box<LeaderState>),
    /// `synced`: this follower accepted the NEWLEADER of the current epoch, so its history
    /// is a prefix of the leader's and it may accept proposals.
    Follower {
        synced: bool,
    },
}

/// An update this replica's client issued, not yet applied here.
#[derive(Debug)]
struct Outstanding {
    request: ClientRequestId,
    key: Key,
    command: Command,
    sent_at: Time,
    /// In our history of the current epoch already: no need to forward it again.
    proposed: bool,
}

/// A read in Sync mode waiting for the leader's commit point, then for us to apply it.
#[derive(Debug)]
struct SyncRead {
    request: ClientRequestId,
    key: Key,
    sent_at: Time,
    target: Option<u64>,
}

/// Per-key FIFO of this replica's requests (as in Hermes and CRAQ).
#[derive(Debug, Default)]
struct KeyQueue {
    waiting: VecDeque<(ClientRequestId, Command)>,
    updates_in_flight: u32,
    reads_in_flight: u32,
}

pub struct Zab {
    config: ZabConfig,
    view: View,
    role: Role,
    /// History entries `log_start ..= last_index()`; earlier ones are applied everywhere
    /// live and forgotten.
    log: VecDeque<Entry>,
    log_start: u64,
    /// The zxid of entry `log_start - 1` (zero when nothing was ever forgotten).
    compacted_zxid: Zxid,
    applied_index: u64,
    /// The highest commit point heard from a leader (or decided, as leader).
    commit_index: u64,
    /// The epoch of the last history this replica synchronised to (ZAB's currentEpoch).
    current_epoch: Epoch,
    store: FxHashMap<Key, Value>,
    /// The highest applied `seq` of each origin: part of the replicated state, so a new leader
    /// knows which forwards it has already proposed.
    applied_seq: FxHashMap<NodeId, u64>,
    next_seq: u64,
    outstanding: BTreeMap<u64, Outstanding>,
    next_nonce: u64,
    syncs: BTreeMap<u64, SyncRead>,
    queues: FxHashMap<Key, KeyQueue>,
    stats: ZabStats,
    /// Set once this replica leaves a view: it never serves again (docs/decisions.md 3).
    retired: bool,
    /// The membership lease (Hermes §2.4): `None` without a membership service (serve as if
    /// it never expired), else until when this replica may answer from its own state. A
    /// replica cut off from the others must stop serving before they remove it.
    lease: Option<Option<Time>>,
    /// This replica's history lost no entry it acknowledged: false after a restart (state is
    /// in memory) until it has been synchronised to a leader's history.
    complete: bool,
    pull: Option<SnapshotPull>,
    /// What the runtime has logged of our state (`None`: nothing is persisted). See
    /// crate::durable.
    durable: Option<Cursor>,
}

impl Zab {
    pub fn new(config: ZabConfig) -> Zab {
        assert!(config.retransmit_timeout > Time::ZERO, "retransmit_timeout must be positive");
        assert!(config.catch_up_entries_max > 0, "catch_up_entries_max must be positive");
        let view = config.initial_view;
        let me = config.me;
        let recovering = config.recovering;
        let mut zab = Zab {
            config,
            view,
            role: Role::Follower { synced: false },
            log: VecDeque::new(),
            log_start: 1,
            compacted_zxid: Zxid::default(),
            applied_index: 0,
            commit_index: 0,
            current_epoch: Epoch(0),
            store: FxHashMap::default(),
            applied_seq: FxHashMap::default(),
            next_seq: 1,
            outstanding: BTreeMap::new(),
            next_nonce: 0,
            syncs: BTreeMap::new(),
            queues: FxHashMap::default(),
            stats: ZabStats::default(),
            // A restarted replica acts in no view until the membership service hands it the
            // one that adds it back.
            retired: recovering,
            lease: None,
            complete: !recovering,
            pull: None,
            durable: None,
        };
        // The initial view starts like any other: its leader recovers (from empty histories)
        // before it broadcasts, so there is one code path for leadership. The first tick
        // sends what recovery needs.
        if zab.view.live.contains(me) && !recovering {
            zab.start_epoch();
        }
        zab
    }

    pub fn view(&self) -> View {
        self.view
    }

    pub fn stats(&self) -> ZabStats {
        self.stats
    }

    pub fn read_mode(&self) -> ReadMode {
        self.config.read_mode
    }

    pub fn is_operational(&self) -> bool {
        !self.retired && self.view.live.contains(self.config.me)
    }

    /// The leader of the current view: its lowest live id.
    pub fn leader(&self) -> Option<NodeId> {
        self.view.live.iter().next()
    }

    /// Whether this replica leads the current view and has finished recovery.
    pub fn is_established_leader(&self) -> bool {
        matches!(&self.role, Role::Leader(state) if state.phase == Phase::Established)
    }

    pub fn applied_index(&self) -> u64 {
        self.applied_index
    }

    pub fn commit_index(&self) -> u64 {
        self.commit_index
    }

    pub fn last_index(&self) -> u64 {
        self.log_start + self.log.len() as u64 - 1
    }

    pub fn last_zxid(&self) -> Zxid {
        self.log.back().map_or(self.compacted_zxid, |entry| entry.zxid)
    }

    /// Replicas known to hold entry `index` of the history (for WAIT): this one once it has
    /// applied it; at the established leader, every synchronised follower that acknowledged
    /// that far; at a synchronised follower that applied it, the leader (whose history it
    /// follows). Never a replica merely assumed to be in the quorum that committed it.
    pub fn replicas_holding(&self, index: u64) -> NodeSet {
        let mut holders = NodeSet::EMPTY;
        if self.applied_index < index {
            return holders;
        }
        holders.insert(self.me());
        match &self.role {
            Role::Leader(state) if state.phase == Phase::Established => {
                for follower in state.synced.iter() {
                    if state.matched.get(&follower).is_some_and(|matched| *matched >= index) {
                        holders.insert(follower);
                    }
                }
            }
            Role::Follower { synced: true } => {
                if let Some(leader) = self.leader() {
                    holders.insert(leader);
                }
            }
            _ => {}
        }
        holders
    }

    /// The entry at `index`, if this replica still holds it.
    pub fn entry(&self, index: u64) -> Option<&Entry> {
        let offset = index.checked_sub(self.log_start)?;
        self.log.get(offset as usize)
    }

    /// The applied value of `key`.
    pub fn value(&self, key: &[u8]) -> Option<&Value> {
        self.store.get(key)
    }

    /// Every key of the applied store, in no particular order.
    pub fn keys(&self) -> impl Iterator<Item = &Key> {
        self.store.keys()
    }

    pub fn key_count(&self) -> usize {
        self.store.len()
    }

    /// Whether this replica answers clients: operational and, after a restart, synchronised.
    pub fn serves_clients(&self) -> bool {
        self.is_operational() && self.complete
    }

    /// Whether this replica holds a history it lost nothing from (see `ZabConfig::recovering`).
    pub fn is_complete(&self) -> bool {
        self.complete
    }

    #[inline(always)]
    fn has_bug(&self, _bug: Bug) -> bool {
        #[cfg(feature = "broken-variants")]
        return self.config.bug == Some(_bug);
        #[cfg(not(feature = "broken-variants"))]
        false
    }

    fn me(&self) -> NodeId {
        self.config.me
    }

    fn peers(&self) -> NodeSet {
        self.view.live.without(self.me())
    }

    fn leader_state(&mut self) -> Option<&mut LeaderState> {
        match &mut self.role {
            Role::Leader(state) => Some(state),
            Role::Follower { .. } => None,
        }
    }

    fn my_info(&self) -> FollowerInfo {
        let snapshot_base = match &self.pull {
            Some(SnapshotPull { done: true, base: Some((base, _)), .. }) => *base,
            _ => 0,
        };
        FollowerInfo {
            current_epoch: self.current_epoch,
            last_zxid: self.last_zxid(),
            applied_index: self.applied_index,
            complete: self.complete,
            snapshot_base,
        }
    }

    fn send_info(&self, to: NodeId, out: &mut Outbox<Message>) {
        let info = self.my_info();
        out.send(
            to,
            Message::FollowerInfo {
                epoch: self.view.epoch,
                current_epoch: info.current_epoch,
                last_zxid: info.last_zxid,
                applied_index: info.applied_index,
                complete: info.complete,
                snapshot_base: info.snapshot_base,
            },
        );
    }

    /// Entries `from ..= to` (clamped to what we hold).
    fn entries(&self, from: u64, to: u64) -> Vec<Entry> {
        let from = from.max(self.log_start);
        let to = to.min(self.last_index());
        (from..=to).filter_map(|index| self.entry(index).cloned()).collect()
    }

    /// Drop every entry after `index` (never an applied one: those are committed).
    fn truncate_after(&mut self, index: u64) {
        assert!(index >= self.applied_index, "truncating applied entries");
        let keep = (index + 1).saturating_sub(self.log_start) as usize;
        self.log.truncate(keep);
        if let Some(cursor) = &mut self.durable {
            cursor.index = cursor.index.min(index);
        }
    }

    /// Append `entries` starting at `first_index`, skipping those we hold (same index and
    /// epoch: the same leader's entries). Returns false on a gap.
    fn append(&mut self, first_index: u64, entries: Vec<Entry>) -> bool {
        if first_index > self.last_index() + 1 {
            return false;
        }
        let me = self.me();
        for (offset, entry) in entries.into_iter().enumerate() {
            let index = first_index + offset as u64;
            if index <= self.last_index() {
                debug_assert!(
                    index < self.log_start || self.entry(index).map(|e| e.zxid) == Some(entry.zxid)
                );
                continue;
            }
            if entry.origin == me {
                if let Some(outstanding) = self.outstanding.get_mut(&entry.seq) {
                    outstanding.proposed = true;
                }
            }
            self.log.push_back(entry);
        }
        true
    }

    /// Apply committed entries in zxid order; an entry whose origin is this replica answers
    /// its client.
    fn apply_committed(&mut self, now: Time, out: &mut Outbox<Message>) {
        let target = self.commit_index.min(self.last_index());
        while self.applied_index < target {
            let index = self.applied_index + 1;
            let entry = self.entry(index).expect("unapplied entries are held").clone();
            if let Some(write) = &entry.write {
                match write {
                    Some(value) => self.store.insert(entry.key.clone(), value.clone()),
                    None => self.store.remove(&entry.key),
                };
            }
            let seq = self.applied_seq.entry(entry.origin).or_default();
            *seq = (*seq).max(entry.seq);
            self.applied_index = index;
            self.stats.entries_applied += 1;
            if let Some(state) = self.leader_state() {
                if state.pending_values.get(&entry.key).is_some_and(|(at, _)| *at == index) {
                    state.pending_values.remove(&entry.key);
                }
            }
            if entry.origin == self.me() {
                self.complete_update(now, entry.seq, entry.outcome, out);
            }
        }
        self.serve_syncs(now, out);
    }

    /// Forget entries applied everywhere live (`compact_index` comes from the leader).
    fn compact(&mut self, compact_index: u64) {
        // An entry leaves memory only once it is logged (when persisting).
        let logged = self.durable.map_or(u64::MAX, |cursor| cursor.index);
        let upto = compact_index.min(self.applied_index).min(logged);
        let upto = upto.saturating_sub(self.config.history_retained_entries);
        while self.log_start <= upto {
            let entry = self.log.pop_front().expect("compacted entries are held");
            self.compacted_zxid = entry.zxid;
            self.log_start += 1;
        }
    }

    // ---------------------------------------------------------------- client requests

    /// Start this replica's waiting requests of `key` as far as per-key FIFO allows: updates
    /// pipeline behind updates, reads behind reads, never across.
    /// Whether this replica may answer from its own state now.
    fn leased(&self, now: Time) -> bool {
        let ignore = self.has_bug(Bug::IgnoreLease);
        ignore || self.lease.is_none_or(|until| until.is_some_and(|until| now < until))
    }

    fn drain(&mut self, now: Time, key: &Key, out: &mut Outbox<Message>) {
        // Without a lease requests wait (like Hermes): a late answer beats an error, and if
        // the replica is removed instead, leaving the view answers every waiter.
        if !self.leased(now) {
            return;
        }
        loop {
            let Some(queue) = self.queues.get_mut(key) else { return };
            let Some((_, command)) = queue.waiting.front() else {
                if queue.updates_in_flight == 0 && queue.reads_in_flight == 0 {
                    self.queues.remove(key);
                }
                return;
            };
            let is_read = matches!(command, Command::Read { .. });
            if (is_read && queue.updates_in_flight > 0) || (!is_read && queue.reads_in_flight > 0) {
                return;
            }
            let (request, command) = queue.waiting.pop_front().expect("front exists");
            if is_read {
                self.start_read(now, key, request, out);
            } else {
                queue.updates_in_flight += 1;
                self.start_update(now, key, request, command, out);
            }
        }
    }

    fn start_read(&mut self, now: Time, key: &Key, request: ClientRequestId, out: &mut Outbox<Message>) {
        if self.has_bug(Bug::LeaderReadsUncommitted) {
            if let Some(state) = self.leader_state() {
                if let Some((_, value)) = state.pending_values.get(key) {
                    let value = value.clone();
                    out.reply(request, Outcome::Value(value));
                    return;
                }
            }
        }
        // The established leader's applied state is its commit point: nothing committed is
        // missing from it, so even a Sync read is answered at once.
        if self.config.read_mode == ReadMode::Local || self.is_established_leader() {
            out.reply(request, Outcome::Value(self.store.get(key).cloned()));
            self.stats.reads_local += 1;
            return;
        }
        self.queues.get_mut(key).expect("queued key exists").reads_in_flight += 1;
        let nonce = self.next_nonce;
        self.next_nonce += 1;
        self.syncs.insert(nonce, SyncRead { request, key: key.clone(), sent_at: now, target: None });
        self.send_sync(nonce, out);
    }

    fn send_sync(&mut self, nonce: u64, out: &mut Outbox<Message>) {
        let leader = self.leader().expect("an operational replica has a leader");
        if leader != self.me() {
            out.send(leader, Message::Sync { epoch: self.view.epoch, nonce });
        }
        // As a recovering leader, our own sync reads get their target when recovery ends.
    }

    /// Answer sync reads whose target we have applied.
    fn serve_syncs(&mut self, now: Time, out: &mut Outbox<Message>) {
        let applied = self.applied_index;
        let ready: Vec<u64> = self
            .syncs
            .iter()
            .filter(|(_, read)| read.target.is_some_and(|target| target <= applied))
            .map(|(nonce, _)| *nonce)
            .collect();
        for nonce in ready {
            // Answering one read may start the next request of its key, which may apply more
            // entries and serve other reads of this batch first.
            let Some(read) = self.syncs.remove(&nonce) else { continue };
            out.reply(read.request, Outcome::Value(self.store.get(&read.key).cloned()));
            self.stats.reads_synced += 1;
            self.queues.get_mut(&read.key).expect("queued key exists").reads_in_flight -= 1;
            self.drain(now, &read.key, out);
        }
    }

    fn start_update(
        &mut self,
        now: Time,
        key: &Key,
        request: ClientRequestId,
        command: Command,
        out: &mut Outbox<Message>,
    ) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let outstanding = Outstanding { request, key: key.clone(), command, sent_at: now, proposed: false };
        self.outstanding.insert(seq, outstanding);
        self.send_forward(now, seq, out);
    }

    fn send_forward(&mut self, now: Time, seq: u64, out: &mut Outbox<Message>) {
        // Handing an earlier update to ourselves (at the head or leader) may have answered
        // this one already.
        let Some(outstanding) = self.outstanding.get_mut(&seq) else { return };
        outstanding.sent_at = now;
        let command = outstanding.command.clone();
        let leader = self.leader().expect("an operational replica has a leader");
        let floor = self.outstanding.keys().next().copied().expect("this update is outstanding");
        if leader == self.me() {
            let me = self.me();
            self.on_forward(now, me, seq, floor, command, out);
        } else {
            out.send(leader, Message::Forward { epoch: self.view.epoch, seq, floor, command });
        }
    }

    fn complete_update(&mut self, now: Time, seq: u64, outcome: Outcome, out: &mut Outbox<Message>) {
        let Some(outstanding) = self.outstanding.remove(&seq) else { return };
        out.reply(outstanding.request, outcome);
        self.queues.get_mut(&outstanding.key).expect("queued key exists").updates_in_flight -= 1;
        self.drain(now, &outstanding.key, out);
    }

    // ---------------------------------------------------------------- broadcast (leader)

    fn on_forward(
        &mut self,
        now: Time,
        origin: NodeId,
        seq: u64,
        floor: u64,
        command: Command,
        out: &mut Outbox<Message>,
    ) {
        let Some(state) = self.leader_state() else { return };
        let given_up = state.floors.entry(origin).or_default();
        *given_up = (*given_up).max(floor);
        if seq <= state.proposed_seq.get(&origin).copied().unwrap_or(0) && state.phase == Phase::Established {
            return; // Proposed already: it commits (or did) through the history.
        }
        state.forwards.insert((origin, seq), command);
        self.propose_ready(now, out);
    }

    /// Propose buffered forwards whose turn has come: each origin's next `seq`.
    fn propose_ready(&mut self, now: Time, out: &mut Outbox<Message>) {
        loop {
            let Some(state) = self.leader_state() else { return };
            if state.phase != Phase::Established {
                return;
            }
            // An origin that left a view gave up on its unanswered updates: numbers below
            // its floor that are not in our history never come, so they leave no gap.
            for (origin, floor) in state.floors.iter() {
                let proposed = state.proposed_seq.entry(*origin).or_default();
                *proposed = (*proposed).max(floor.saturating_sub(1));
            }
            let mut next = None;
            let mut stale = Vec::new();
            for ((origin, seq), _) in state.forwards.iter() {
                let proposed = state.proposed_seq.get(origin).copied().unwrap_or(0);
                if *seq <= proposed {
                    stale.push((*origin, *seq));
                } else if *seq == proposed + 1 {
                    next = Some((*origin, *seq));
                    break;
                }
            }
            for at in stale {
                state.forwards.remove(&at);
            }
            let Some((origin, seq)) = next else { return };
            let command = state.forwards.remove(&(origin, seq)).expect("forward exists");
            self.propose(now, origin, seq, command, out);
        }
    }

    /// Turn a request into an idempotent entry on the latest proposed state and broadcast it.
    fn propose(&mut self, now: Time, origin: NodeId, seq: u64, command: Command, out: &mut Outbox<Message>) {
        let epoch = self.view.epoch;
        let index = self.last_index() + 1;
        let commit_index = self.commit_index;
        let store = &self.store;
        let Role::Leader(state) = &mut self.role else { unreachable!("only the leader proposes") };
        let key = command.key().clone();
        let latest = match state.pending_values.get(&key) {
            Some((_, value)) => value.as_ref(),
            None => store.get(&key),
        };
        let (write, outcome) = match command {
            Command::Write { value, .. } => (Some(value), Outcome::Written),
            Command::Rmw { op, .. } => {
                let effect = op.apply(latest);
                (effect.write, effect.outcome)
            }
            Command::Read { .. } => unreachable!("reads are never forwarded"),
        };
        if let Some(value) = &write {
            state.pending_values.insert(key.clone(), (index, value.clone()));
        }
        state.counter += 1;
        state.proposed_seq.insert(origin, seq);
        let entry =
            Entry { zxid: Zxid { epoch: epoch.0, counter: state.counter }, key, write, origin, seq, outcome };
        let synced = state.synced;
        self.stats.proposals += 1;
        out.broadcast(
            synced,
            Message::Propose { epoch, first_index: index, entries: vec![entry.clone()], commit_index },
        );
        self.log.push_back(entry);
        if origin == self.me() {
            if let Some(outstanding) = self.outstanding.get_mut(&seq) {
                outstanding.proposed = true;
            }
        }
        self.advance_commit(now, out);
    }

    /// Commit the highest index a quorum holds (the leader holds everything it proposed).
    fn advance_commit(&mut self, now: Time, out: &mut Outbox<Message>) {
        let quorum = self.config.quorum();
        let last = self.last_index();
        let without_quorum = self.has_bug(Bug::CommitWithoutQuorum);
        let Role::Leader(state) = &self.role else { return };
        if state.phase != Phase::Established {
            return;
        }
        let mut held: Vec<u64> =
            state.synced.iter().map(|node| state.matched.get(&node).copied().unwrap_or(0)).collect();
        held.push(last);
        held.sort_unstable_by(|a, b| b.cmp(a));
        let committed = if without_quorum { last } else { held.get(quorum - 1).copied().unwrap_or(0) };
        if committed > self.commit_index {
            self.commit_index = committed;
            let message = self.commit_message();
            let synced = state.synced;
            out.broadcast(synced, message);
            self.apply_committed(now, out);
        }
    }

    fn commit_message(&self) -> Message {
        Message::Commit {
            epoch: self.view.epoch,
            commit_index: self.commit_index,
            compact_index: self.compact_index(),
        }
    }

    /// Entries applied at every live replica: nobody will ever need them again, not even a
    /// future leader's recovery (live sets only shrink, and each of them applied that far).
    fn compact_index(&self) -> u64 {
        let Role::Leader(state) = &self.role else { return 0 };
        let mut lowest = self.applied_index;
        for peer in self.peers().iter() {
            match state.applied.get(&peer) {
                Some(applied) if state.synced.contains(peer) => lowest = lowest.min(*applied),
                _ => return 0,
            }
        }
        lowest
    }

    fn on_ack(
        &mut self,
        now: Time,
        from: NodeId,
        last_index: u64,
        applied_index: u64,
        out: &mut Outbox<Message>,
    ) {
        let quorum = self.config.quorum();
        let Some(state) = self.leader_state() else { return };
        if matches!(state.phase, Phase::Discovery | Phase::Fetching { .. }) {
            return;
        }
        state.synced.insert(from);
        let matched = state.matched.entry(from).or_default();
        if last_index > *matched {
            *matched = last_index;
            state.resend_at.insert(from, now);
        }
        let applied = state.applied.entry(from).or_default();
        *applied = (*applied).max(applied_index);
        if state.phase == Phase::Syncing && state.synced.len() + 1 >= quorum {
            self.establish(now, out);
        } else {
            self.advance_commit(now, out);
        }
    }

    // ---------------------------------------------------------------- recovery (leader)

    /// Enter the current view's epoch: lead it (recovery first) or follow its leader.
    fn start_epoch(&mut self) {
        // A snapshot pulled in an older epoch may come from a history this epoch discards.
        self.pull = None;
        if self.leader() == Some(self.me()) {
            let mut state = LeaderState::new();
            state.infos.insert(self.me(), self.my_info());
            self.role = Role::Leader(Box::new(state));
        } else {
            self.role = Role::Follower { synced: false };
        }
    }

    fn on_follower_info(&mut self, now: Time, from: NodeId, info: FollowerInfo, out: &mut Outbox<Message>) {
        let Some(state) = self.leader_state() else { return };
        state.infos.insert(from, info);
        match state.phase {
            Phase::Discovery => self.choose_history(now, out),
            Phase::Fetching { .. } => {}
            Phase::Syncing | Phase::Established => {
                if !state.synced.contains(from) {
                    self.send_new_leader(from, out);
                }
            }
        }
    }

    /// ZAB phase 1: with infos from a quorum, adopt the history of the one with the highest
    /// (currentEpoch, last zxid). Comparing currentEpoch first matters: a history that a later
    /// leader synchronised a quorum to beats a longer one from an older epoch whose tail that
    /// leader discarded.
    ///
    /// Besides a quorum, every live member of the view must have answered. A view that adds a
    /// node with a lower id than the old leader's moves the leadership to it while the old
    /// leader stays live, and nothing else makes the old leader stop: its membership lease
    /// goes on (the others still acknowledge a live member), so until it installs the new view
    /// it keeps answering reads as the established leader of the old epoch, while the new
    /// leader's quorum commits writes without it. A member answers `NewEpoch` only once it
    /// has installed the new view, so waiting for every live member waits out the old
    /// leader's reign. The simulator's main swarm found this (a paused leader rejoining). A
    /// live member that cannot reach the new leader stalls recovery until the membership
    /// removes it or the partition heals, as a Hermes write would.
    fn choose_history(&mut self, now: Time, out: &mut Outbox<Message>) {
        let quorum = self.config.quorum();
        let me = self.me();
        let from_index = self.fetch_from_index();
        let epoch = self.view.epoch;
        let timeout = self.config.retransmit_timeout;
        let live = self.view.live;
        let Some(state) = self.leader_state() else { return };
        // A replica that restarted empty may have acknowledged entries it no longer holds: a
        // quorum of such replicas could miss a committed entry. Only complete ones count.
        let complete = state.infos.values().filter(|info| info.complete).count();
        let every_live_member = live.iter().all(|node| state.infos.contains_key(&node));
        if state.phase != Phase::Discovery || complete < quorum || !every_live_member {
            return;
        }
        let rank = |node: NodeId, info: &FollowerInfo| (info.current_epoch, info.last_zxid, node == me);
        let best = state
            .infos
            .iter()
            .filter(|(_, info)| info.complete)
            .max_by_key(|(node, info)| rank(**node, info))
            .map(|(node, _)| *node)
            .expect("a quorum is not empty");
        if best == me {
            self.adopt_history(now, out);
        } else {
            state.phase = Phase::Fetching { best };
            state.fetch_resend_at = now + timeout;
            out.send(best, Message::FetchHistory { epoch, from_index });
        }
    }

    fn on_history(
        &mut self,
        now: Time,
        from: NodeId,
        from_index: u64,
        entries: Vec<Entry>,
        out: &mut Outbox<Message>,
    ) {
        let fetching =
            matches!(&self.role, Role::Leader(state) if state.phase == (Phase::Fetching { best: from }));
        if !fetching {
            return;
        }
        if self.my_info().snapshot_base + 1 == from_index && from_index > 1 {
            self.install_snapshot(now, out);
        }
        if from_index != self.applied_index + 1 {
            return;
        }
        let applied = self.applied_index;
        // Our unapplied tail may differ from the best history: replace it.
        self.truncate_after(applied);
        let appended = self.append(from_index, entries);
        debug_assert!(appended);
        self.adopt_history(now, out);
    }

    /// Our log is now the epoch's history. ZAB phase 2: synchronise the followers we heard.
    fn adopt_history(&mut self, now: Time, out: &mut Outbox<Message>) {
        self.current_epoch = self.view.epoch;
        // Adopted from a quorum of complete histories: nothing committed is missing.
        self.become_complete();
        let quorum = self.config.quorum();
        let me = self.me();
        let Some(state) = self.leader_state() else { return };
        state.phase = Phase::Syncing;
        let followers: Vec<NodeId> = state.infos.keys().copied().filter(|node| *node != me).collect();
        for follower in followers {
            self.send_new_leader(follower, out);
        }
        // A one-replica ensemble is its own quorum.
        if quorum <= 1 {
            self.establish(now, out);
        }
    }

    fn send_new_leader(&mut self, follower: NodeId, out: &mut Outbox<Message>) {
        let (epoch, commit_index, last) = (self.view.epoch, self.commit_index, self.last_index());
        let Role::Leader(state) = &self.role else { return };
        let Some(info) = state.infos.get(&follower) else { return };
        // The follower's applied entries are committed, hence in our history at the same
        // indices: send only what follows them (or its pulled snapshot).
        let prev_index = if info.snapshot_base > 0 { info.snapshot_base } else { info.applied_index };
        if prev_index + 1 < self.log_start {
            // We forgot entries it lacks (a restarted replica lacks all): SNAP first.
            out.send(follower, Message::TakeSnapshot { epoch, log_start: self.log_start });
            return;
        }
        let entries = self.entries(prev_index + 1, last);
        out.send(follower, Message::NewLeader { epoch, prev_index, entries, commit_index });
    }

    /// A quorum holds the history: it is committed. Broadcast resumes.
    fn establish(&mut self, now: Time, out: &mut Outbox<Message>) {
        let last = self.last_index();
        self.commit_index = self.commit_index.max(last);
        self.apply_committed(now, out);
        let applied_seq = self.applied_seq.clone();
        let commit = self.commit_message();
        let commit_index = self.commit_index;
        let Some(state) = self.leader_state() else { return };
        state.phase = Phase::Established;
        state.proposed_seq = applied_seq;
        state.pending_values.clear();
        state.counter = 0;
        state.heartbeat_at = now;
        let synced = state.synced;
        out.broadcast(synced, commit);
        self.stats.recoveries += 1;
        for read in self.syncs.values_mut() {
            read.target.get_or_insert(commit_index);
        }
        self.serve_syncs(now, out);
        self.propose_ready(now, out);
    }

    fn leader_tick(&mut self, now: Time, out: &mut Outbox<Message>) {
        let epoch = self.view.epoch;
        let timeout = self.config.retransmit_timeout;
        let batch = self.config.catch_up_entries_max as u64;
        let (commit_index, last) = (self.commit_index, self.last_index());
        let fetch_from = self.fetch_from_index();
        let peers = self.peers();
        let commit = self.commit_message();
        let mut catch_up = Vec::new();
        let mut new_leader = Vec::new();
        let Role::Leader(state) = &mut self.role else { return };
        if let Phase::Fetching { best } = state.phase {
            if now >= state.fetch_resend_at {
                state.fetch_resend_at = now + timeout;
                out.send(best, Message::FetchHistory { epoch, from_index: fetch_from });
            }
        }
        for peer in peers.iter() {
            let due = state.resend_at.get(&peer).is_none_or(|at| now >= *at);
            if !due {
                continue;
            }
            if state.synced.contains(peer) {
                let matched = state.matched.get(&peer).copied().unwrap_or(0);
                if matched < last {
                    catch_up.push((peer, matched + 1));
                    state.resend_at.insert(peer, now + timeout);
                }
            } else {
                let recovered = matches!(state.phase, Phase::Syncing | Phase::Established);
                if recovered && state.infos.contains_key(&peer) {
                    new_leader.push(peer);
                } else {
                    out.send(peer, Message::NewEpoch { epoch });
                }
                state.resend_at.insert(peer, now + timeout);
            }
        }
        if state.phase == Phase::Established && now >= state.heartbeat_at {
            state.heartbeat_at = now + timeout;
            out.broadcast(state.synced, commit);
        }
        for (peer, from) in catch_up {
            let entries = self.entries(from, from + batch - 1);
            self.stats.retransmits += 1;
            out.send(peer, Message::Propose { epoch, first_index: from, entries, commit_index });
        }
        for peer in new_leader {
            self.stats.retransmits += 1;
            self.send_new_leader(peer, out);
        }
        // The leader forgets what every live replica applied, like its followers: otherwise
        // its log grows without bound. A replica that needs forgotten entries later (one
        // removed meanwhile, or restarted) gets a snapshot; while a live replica is not
        // synchronised, `compact_index` is 0, so a snapshot's base stays replayable.
        let compact_index = self.compact_index();
        self.compact(compact_index);
    }

    // ---------------------------------------------------------------- follower

    fn is_synced_follower(&self) -> bool {
        matches!(self.role, Role::Follower { synced: true })
    }

    fn send_ack(&self, to: NodeId, out: &mut Outbox<Message>) {
        let message = Message::Ack {
            epoch: self.view.epoch,
            last_index: self.last_index(),
            applied_index: self.applied_index,
        };
        out.send(to, message);
    }

    fn on_propose(
        &mut self,
        now: Time,
        from: NodeId,
        first_index: u64,
        entries: Vec<Entry>,
        commit_index: u64,
        out: &mut Outbox<Message>,
    ) {
        if !self.is_synced_follower() {
            return;
        }
        // On a gap (an earlier proposal lost or late) the ACK tells the leader where we are.
        self.append(first_index, entries);
        self.commit_index = self.commit_index.max(commit_index);
        self.apply_committed(now, out);
        self.send_ack(from, out);
    }

    fn on_new_leader(
        &mut self,
        now: Time,
        from: NodeId,
        prev_index: u64,
        entries: Vec<Entry>,
        commit_index: u64,
        out: &mut Outbox<Message>,
    ) {
        if matches!(self.role, Role::Leader(_)) {
            return;
        }
        if self.is_synced_follower() {
            self.send_ack(from, out); // Our ACK was lost; the history is already ours.
            return;
        }
        if self.my_info().snapshot_base == prev_index && prev_index > 0 {
            self.install_snapshot(now, out);
        }
        if prev_index != self.applied_index {
            // Built on a FollowerInfo that no longer describes us: describe us again.
            self.send_info(from, out);
            return;
        }
        self.truncate_after(prev_index);
        let appended = self.append(prev_index + 1, entries);
        debug_assert!(appended);
        self.current_epoch = self.view.epoch;
        self.role = Role::Follower { synced: true };
        self.become_complete();
        // Commit points only ever cover committed entries, which keep their indices in every
        // later history, so one heard in an older epoch still holds.
        self.commit_index = self.commit_index.max(commit_index);
        self.apply_committed(now, out);
        self.send_ack(from, out);
    }

    /// Forwards not yet seen in our history and syncs not yet answered go out again.
    fn retransmit_requests(&mut self, now: Time, out: &mut Outbox<Message>) {
        let timeout = self.config.retransmit_timeout;
        let due: Vec<u64> = self
            .outstanding
            .iter()
            .filter(|(_, pending)| !pending.proposed && now >= pending.sent_at + timeout)
            .map(|(seq, _)| *seq)
            .collect();
        for seq in due {
            self.stats.retransmits += 1;
            self.send_forward(now, seq, out);
        }
        let due: Vec<u64> = self
            .syncs
            .iter()
            .filter(|(_, read)| read.target.is_none() && now >= read.sent_at + timeout)
            .map(|(nonce, _)| *nonce)
            .collect();
        for nonce in due {
            self.syncs.get_mut(&nonce).expect("sync exists").sent_at = now;
            self.send_sync(nonce, out);
        }
    }

    /// Leaving the view: stop serving. Waiting requests and reads never executed; forwarded
    /// updates may still commit, so their outcome is unknown.
    fn leave_service(&mut self, out: &mut Outbox<Message>) {
        self.retired = true;
        self.role = Role::Follower { synced: false };
        for (_, queue) in self.queues.drain() {
            for (request, _) in queue.waiting {
                out.reply(request, Outcome::Error(CommandError::Unavailable("not in the current view")));
            }
        }
        for (_, read) in std::mem::take(&mut self.syncs) {
            out.reply(read.request, Outcome::Error(CommandError::Unavailable("not in the current view")));
        }
        for (_, outstanding) in std::mem::take(&mut self.outstanding) {
            out.reply(outstanding.request, Outcome::Error(CommandError::OutcomeUnknown));
        }
    }
}

/// A received snapshot chunk (the fields of `Message::SnapshotChunk`).
struct Chunk {
    after_key: Option<Key>,
    base_index: u64,
    base_zxid: Zxid,
    pairs: Vec<(Key, Value)>,
    applied_seq: Vec<(NodeId, u64)>,
    last: bool,
}

// -------------------------------------------------------------------- snapshots (SNAP)

impl Zab {
    /// Where a leader fetching the best history needs it from: after its pulled snapshot, or
    /// after what it applied.
    fn fetch_from_index(&self) -> u64 {
        match self.my_info().snapshot_base {
            0 => self.applied_index + 1,
            base => base + 1,
        }
    }

    /// We now hold a history a leader synchronised us to (or adopted from a quorum of complete
    /// ones): we count in quorums and may serve. Our update numbers continue after the
    /// highest of ours in it, since the leader proposes each origin's numbers in order.
    fn become_complete(&mut self) {
        self.pull = None;
        if self.complete {
            return;
        }
        self.complete = true;
        let me = self.me();
        let in_log = self.log.iter().filter(|entry| entry.origin == me).map(|entry| entry.seq).max();
        let highest = in_log.unwrap_or(0).max(self.applied_seq.get(&me).copied().unwrap_or(0));
        assert!(self.outstanding.is_empty(), "an incomplete replica issued no update");
        self.next_seq = self.next_seq.max(highest + 1);
    }

    /// Snapshots are served by a recovered leader to its followers, and by a follower that
    /// has not synchronised to this epoch yet to its leader (its state is frozen then). Only
    /// from a complete history.
    fn serves_snapshots_to(&self, from: NodeId) -> bool {
        let recovered_leader = matches!(
            &self.role,
            Role::Leader(state) if matches!(state.phase, Phase::Syncing | Phase::Established)
        );
        let fetched_by_leader =
            self.leader() == Some(from) && matches!(self.role, Role::Follower { synced: false });
        self.complete && (recovered_leader || fetched_by_leader)
    }

    /// The keys after `after_key` in key order, up to about `snapshot_chunk_bytes_target`.
    /// The leader keeps every entry after its applied point while a live peer is not
    /// synchronised (`compact_index` is 0 then), so the receiver can replay them over the
    /// chunks. Each chunk sorts the keys left to send: O(n log n) per chunk.
    fn send_snapshot_chunk(&mut self, to: NodeId, after_key: Option<Key>, out: &mut Outbox<Message>) {
        let mut keys: Vec<&Key> =
            self.store.keys().filter(|key| after_key.as_ref().is_none_or(|after| *key > after)).collect();
        keys.sort_unstable();
        let (mut pairs, mut size_bytes) = (Vec::new(), 0);
        for key in &keys {
            if !pairs.is_empty() && size_bytes >= self.config.snapshot_chunk_bytes_target {
                break;
            }
            let value = self.store.get(*key).expect("listed key exists").clone();
            size_bytes += key.len() + value.len();
            pairs.push(((*key).clone(), value));
        }
        let last = pairs.len() == keys.len();
        let mut applied_seq: Vec<(NodeId, u64)> = if last {
            self.applied_seq.iter().map(|(origin, seq)| (*origin, *seq)).collect()
        } else {
            Vec::new()
        };
        applied_seq.sort_unstable();
        let base_index = self.applied_index;
        let base_zxid = self.entry(base_index).map_or(self.compacted_zxid, |entry| entry.zxid);
        debug_assert!(base_index + 1 >= self.log_start, "applied entries are never compacted early");
        let epoch = self.view.epoch;
        self.stats.snapshot_chunks_served += 1;
        out.send(
            to,
            Message::SnapshotChunk { epoch, after_key, base_index, base_zxid, pairs, applied_seq, last },
        );
    }

    /// `from` (our leader, or the best history we fetch as leader) no longer holds the
    /// entries after our applied point: pull its snapshot, unless we have one already.
    fn on_take_snapshot(&mut self, now: Time, from: NodeId, log_start: u64, out: &mut Outbox<Message>) {
        if self.is_synced_follower() && self.leader() == Some(from) {
            // The leader worked from a FollowerInfo that arrived late (from before our sync)
            // and lost our ACK of NEWLEADER: it would ask for ever. Tell it where we are.
            self.send_ack(from, out);
            return;
        }
        let from_leader =
            self.leader() == Some(from) && matches!(self.role, Role::Follower { synced: false });
        let from_best =
            matches!(&self.role, Role::Leader(state) if state.phase == (Phase::Fetching { best: from }));
        if !from_leader && !from_best {
            return;
        }
        let base = self.my_info().snapshot_base;
        let have = if base > 0 { base } else { self.applied_index };
        if have + 1 >= log_start {
            // The sender worked from an old description of us.
            if from_leader {
                self.send_info(from, out);
            } else {
                let from_index = self.fetch_from_index();
                out.send(from, Message::FetchHistory { epoch: self.view.epoch, from_index });
            }
            return;
        }
        if self.pull.as_ref().is_some_and(|pull| pull.source == from) {
            return; // Pulling already; our own timer re-sends lost requests.
        }
        self.pull = Some(SnapshotPull {
            source: from,
            after_key: None,
            base: None,
            store: FxHashMap::default(),
            applied_seq: Vec::new(),
            done: false,
            requested_at: now,
        });
        out.send(from, Message::SnapshotRequest { epoch: self.view.epoch, after_key: None });
    }

    fn on_snapshot_chunk(&mut self, now: Time, from: NodeId, chunk: Chunk, out: &mut Outbox<Message>) {
        let epoch = self.view.epoch;
        let Some(pull) = &mut self.pull else { return };
        if pull.source != from || pull.done || pull.after_key != chunk.after_key {
            return; // Late or duplicated.
        }
        if pull.base.is_none() {
            assert!(chunk.after_key.is_none(), "the first chunk answers the first request");
            pull.base = Some((chunk.base_index, chunk.base_zxid));
        }
        if let Some((key, _)) = chunk.pairs.last() {
            pull.after_key = Some(key.clone());
        }
        pull.store.extend(chunk.pairs);
        self.stats.snapshot_chunks_received += 1;
        pull.requested_at = now;
        if !chunk.last {
            out.send(from, Message::SnapshotRequest { epoch, after_key: pull.after_key.clone() });
            return;
        }
        pull.done = true;
        pull.applied_seq = chunk.applied_seq;
        // Ask for the history after the snapshot.
        if matches!(self.role, Role::Leader(_)) {
            let from_index = self.fetch_from_index();
            out.send(from, Message::FetchHistory { epoch, from_index });
        } else {
            self.send_info(from, out);
        }
    }

    fn retransmit_snapshot_request(&mut self, now: Time, out: &mut Outbox<Message>) {
        let timeout = self.config.retransmit_timeout;
        let epoch = self.view.epoch;
        let Some(pull) = &mut self.pull else { return };
        if pull.done || now < pull.requested_at + timeout {
            return;
        }
        pull.requested_at = now;
        self.stats.retransmits += 1;
        out.send(pull.source, Message::SnapshotRequest { epoch, after_key: pull.after_key.clone() });
    }

    /// Replace our state by the pulled snapshot: the history after its base comes next.
    /// Only done together with taking that history, so we never hold a snapshot without it.
    fn install_snapshot(&mut self, now: Time, out: &mut Outbox<Message>) {
        let Some(pull) = self.pull.take() else { return };
        let Some((base_index, base_zxid)) = pull.base else { return };
        assert!(pull.done, "only a complete snapshot is installed");
        self.stats.snapshots_installed += 1;
        if let Some(cursor) = &mut self.durable {
            cursor.snapshot = true;
        }
        self.store = pull.store;
        self.applied_seq = pull.applied_seq.into_iter().collect();
        self.log.clear();
        self.log_start = base_index + 1;
        self.compacted_zxid = base_zxid;
        self.applied_index = base_index;
        self.commit_index = self.commit_index.max(base_index);
        // Our updates the snapshot already holds were applied where its entries were
        // forgotten: a write's outcome is always `Written`; an RMW's went with its entry.
        let me = self.me();
        let applied_seq = self.applied_seq.get(&me).copied().unwrap_or(0);
        let covered: Vec<u64> = self.outstanding.range(..=applied_seq).map(|(seq, _)| *seq).collect();
        for seq in covered {
            let outcome = match self.outstanding[&seq].command {
                Command::Write { .. } => Outcome::Written,
                _ => Outcome::Error(CommandError::OutcomeUnknown),
            };
            self.complete_update(now, seq, outcome, out);
        }
    }
}

impl Replica for Zab {
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
        let is_read = matches!(command, Command::Read { .. });
        if !self.complete && is_read && self.has_bug(Bug::JoinerServesEarly) {
            out.reply(request, Outcome::Value(self.store.get(command.key()).cloned()));
            return;
        }
        if !self.is_operational() {
            out.reply(request, Outcome::Error(CommandError::Unavailable("not in the current view")));
            return;
        }
        if !self.complete {
            let why = "joining: taking a snapshot and the history from the leader";
            out.reply(request, Outcome::Error(CommandError::Unavailable(why)));
            return;
        }
        let key = command.key().clone();
        self.queues.entry(key.clone()).or_default().waiting.push_back((request, command));
        self.drain(now, &key, out);
    }

    fn on_message(&mut self, now: Time, from: NodeId, message: Message, out: &mut Outbox<Message>) {
        if message.epoch() != self.view.epoch || !self.is_operational() {
            self.stats.messages_dropped_epoch += 1;
            return;
        }
        let from_leader = self.leader() == Some(from);
        match message {
            Message::Forward { seq, floor, command, .. } if command.is_update() && floor <= seq => {
                self.on_forward(now, from, seq, floor, command, out);
            }
            Message::Propose { first_index, entries, commit_index, .. } if from_leader => {
                self.on_propose(now, from, first_index, entries, commit_index, out)
            }
            Message::Ack { last_index, applied_index, .. } => {
                self.on_ack(now, from, last_index, applied_index, out)
            }
            Message::Commit { commit_index, compact_index, .. }
                if from_leader && self.is_synced_follower() =>
            {
                self.commit_index = self.commit_index.max(commit_index);
                self.apply_committed(now, out);
                self.compact(compact_index);
            }
            Message::NewEpoch { .. } if from_leader => self.send_info(from, out),
            Message::FollowerInfo {
                current_epoch,
                last_zxid,
                applied_index,
                complete,
                snapshot_base,
                ..
            } => {
                let info = FollowerInfo { current_epoch, last_zxid, applied_index, complete, snapshot_base };
                self.on_follower_info(now, from, info, out)
            }
            // Only before we synchronise to this epoch's history: our log is still what we
            // reported in FollowerInfo. What we forgot comes as a snapshot first.
            Message::FetchHistory { from_index, .. }
                if from_leader && matches!(self.role, Role::Follower { synced: false }) =>
            {
                let epoch = self.view.epoch;
                if from_index >= self.log_start {
                    let entries = self.entries(from_index, self.last_index());
                    out.send(from, Message::History { epoch, from_index, entries });
                } else {
                    out.send(from, Message::TakeSnapshot { epoch, log_start: self.log_start });
                }
            }
            Message::TakeSnapshot { log_start, .. } => self.on_take_snapshot(now, from, log_start, out),
            Message::SnapshotRequest { after_key, .. } if self.serves_snapshots_to(from) => {
                self.send_snapshot_chunk(from, after_key, out)
            }
            Message::SnapshotChunk { after_key, base_index, base_zxid, pairs, applied_seq, last, .. } => {
                let chunk = Chunk { after_key, base_index, base_zxid, pairs, applied_seq, last };
                self.on_snapshot_chunk(now, from, chunk, out)
            }
            Message::History { from_index, entries, .. } => {
                self.on_history(now, from, from_index, entries, out)
            }
            Message::NewLeader { prev_index, entries, commit_index, .. } if from_leader => {
                self.on_new_leader(now, from, prev_index, entries, commit_index, out)
            }
            // A recovering leader does not know the commit point yet: the follower asks again.
            // The leader's commit point answers sync reads: it needs the lease as much as a
            // local read does. The asker retransmits.
            Message::Sync { nonce, .. } if self.is_established_leader() && self.leased(now) => {
                let commit_index = self.commit_index;
                out.send(from, Message::SyncReply { epoch: self.view.epoch, nonce, commit_index });
            }
            Message::SyncReply { nonce, commit_index, .. } if from_leader => {
                if let Some(read) = self.syncs.get_mut(&nonce) {
                    read.target.get_or_insert(commit_index);
                    self.serve_syncs(now, out);
                }
            }
            // Leader-only messages from a replica that does not lead our view.
            _ => {}
        }
    }

    fn installed_view(&self) -> Option<View> {
        Some(self.view)
    }

    fn event_counts(&self, report: &mut dyn FnMut(&'static str, u64)) {
        let stats = &self.stats;
        report("zab.reads_synced", stats.reads_synced);
        report("zab.recoveries", stats.recoveries);
        report("zab.retransmits", stats.retransmits);
        report("zab.snapshots_installed", stats.snapshots_installed);
    }

    /// Until a restarted replica has been synchronised, the membership service must not count
    /// it as holding the data.
    fn is_caught_up(&self) -> bool {
        self.complete
    }

    fn on_lease(&mut self, now: Time, valid_until: Option<Time>, out: &mut Outbox<Message>) {
        let was_leased = self.leased(now);
        self.lease = Some(valid_until);
        if !was_leased && self.leased(now) && self.is_operational() {
            // Requests held for want of a lease can go now.
            let mut waiting: Vec<Key> = self
                .queues
                .iter()
                .filter(|(_, queue)| !queue.waiting.is_empty())
                .map(|(key, _)| key.clone())
                .collect();
            waiting.sort();
            for key in waiting {
                self.drain(now, &key, out);
            }
        }
    }

    fn on_tick(&mut self, now: Time, out: &mut Outbox<Message>) {
        if !self.is_operational() {
            return;
        }
        if matches!(self.role, Role::Leader(_)) {
            self.leader_tick(now, out);
            // The initial view's leader, with a quorum of one, recovers on its first tick.
            self.choose_history(now, out);
        }
        self.retransmit_requests(now, out);
        self.retransmit_snapshot_request(now, out);
    }

    /// A new view is a new ZAB epoch with the lowest live id as leader. Messages of the old
    /// epoch are dropped from now on; the leader recovers before anything commits again; every
    /// replica sends its unproposed forwards and unanswered syncs to the new leader.
    fn on_view(&mut self, now: Time, view: View, out: &mut Outbox<Message>) {
        if view.epoch <= self.view.epoch {
            return; // Views only move forward; a late m-update is stale.
        }
        self.view = view;
        self.stats.views_installed += 1;
        if !view.live.contains(self.me()) {
            if !self.retired {
                self.leave_service(out);
            }
            return;
        }
        // Back in a view (the membership service added us again): we keep the history we
        // have (it is still ours: nothing we acknowledged is lost) and this epoch's recovery
        // brings it up to date before we serve.
        self.retired = false;
        self.start_epoch();
        // Our history may be truncated by the recovery: every unapplied update is forwarded
        // again (the new leader proposes each origin's `seq` once).
        for outstanding in self.outstanding.values_mut() {
            outstanding.proposed = false;
            outstanding.sent_at = Time::ZERO;
        }
        for read in self.syncs.values_mut() {
            read.sent_at = Time::ZERO;
        }
        let seqs: Vec<u64> = self.outstanding.keys().copied().collect();
        for seq in seqs {
            self.send_forward(now, seq, out);
        }
        let nonces: Vec<u64> =
            self.syncs.iter().filter(|(_, read)| read.target.is_none()).map(|(n, _)| *n).collect();
        for nonce in nonces {
            self.syncs.get_mut(&nonce).expect("sync exists").sent_at = now;
            self.send_sync(nonce, out);
        }
        if matches!(self.role, Role::Leader(_)) {
            self.leader_tick(now, out);
            // A quorum of one (a one-replica ensemble) needs no follower.
            self.choose_history(now, out);
        }
    }
}

// -------------------------------------------------------------------- persistence (issue 24)

impl Zab {
    /// Log our state from now on: [`Zab::take_durable`] hands the runtime what changed each
    /// turn, and no entry is forgotten before it was taken.
    pub fn enable_persistence(&mut self) {
        let cursor = Cursor { index: 0, epoch: Epoch(0), commit: 0, snapshot: true };
        self.durable = Some(cursor);
    }

    /// The records of what changed since the last call (crate::durable), to be on disk before
    /// this turn's messages leave: an ACK (of a proposal or of NEWLEADER) never precedes the
    /// history it acknowledges. Empty when nothing changed or nothing is persisted.
    pub fn take_durable(&mut self) -> Vec<Message> {
        let Some(cursor) = self.durable else { return Vec::new() };
        let (last, epoch, commit) = (self.last_index(), self.current_epoch, self.commit_index);
        let mut records = Vec::new();
        if cursor.snapshot {
            records = self.snapshot_header();
            let keys: Vec<Key> = self.store.keys().cloned().collect();
            for slice in keys.chunks(4096) {
                records.extend(self.snapshot_record(slice));
            }
        } else if cursor.index < last || cursor.epoch != epoch || cursor.commit != commit {
            let first_index = cursor.index + 1;
            debug_assert!(first_index >= self.log_start, "unlogged entries are never compacted");
            let entries = self.entries(first_index, last);
            records.push(Message::Propose { epoch, first_index, entries, commit_index: commit });
        }
        self.durable = Some(Cursor { index: last, epoch, commit, snapshot: false });
        records
    }

    /// A snapshot's first records: the applied point (its keys follow in
    /// [`Zab::snapshot_record`]s) and the history after it. Everything earlier is replaced.
    pub fn snapshot_header(&self) -> Vec<Message> {
        let base_index = self.applied_index;
        let base_zxid = self.entry(base_index).map_or(self.compacted_zxid, |entry| entry.zxid);
        let history = Message::Propose {
            epoch: self.current_epoch,
            first_index: base_index + 1,
            entries: self.entries(base_index + 1, self.last_index()),
            commit_index: self.commit_index,
        };
        vec![durable::snapshot_start(base_index, base_zxid, Vec::new(), &self.applied_seq), history]
    }

    /// The applied values of `keys` (those that have one) as a snapshot record.
    pub fn snapshot_record(&self, keys: &[Key]) -> Option<Message> {
        let pairs: Vec<(Key, Value)> =
            keys.iter().filter_map(|key| Some((key.clone(), self.store.get(key)?.clone()))).collect();
        durable::snapshot_more(self.applied_index, pairs)
    }

    /// Take back the state a previous run of this replica logged, before any event. With
    /// every record synced before its ACK (`appendfsync always`) the history holds every
    /// entry this replica acknowledged, so it is complete: it counts in discovery quorums
    /// and its history competes by (currentEpoch, last zxid) like any other. Our update
    /// numbers start above `seq_floor`, which must exceed every number an earlier run used
    /// (forwards of ours may be in a leader's history and not in ours).
    pub fn restore(&mut self, state: DurableState, seq_floor: u64) {
        assert!(self.outstanding.is_empty() && self.log.is_empty(), "restored before any event");
        let me = self.me();
        let in_log = state.log.iter().filter(|entry| entry.origin == me).map(|entry| entry.seq).max();
        let highest = in_log.unwrap_or(0).max(state.applied_seq.get(&me).copied().unwrap_or(0));
        self.next_seq = (highest + 1).max(seq_floor);
        self.store = state.store;
        self.applied_seq = state.applied_seq;
        self.log_start = state.log_start;
        self.compacted_zxid = state.compacted_zxid;
        self.log = state.log;
        self.current_epoch = state.current_epoch;
        self.commit_index = state.commit_index;
        self.applied_index = state.applied_index;
        self.complete = true;
        let logged = Cursor {
            index: self.last_index(),
            epoch: self.current_epoch,
            commit: self.commit_index,
            snapshot: false,
        };
        self.durable = Some(logged);
        if !self.retired && self.view.live.contains(me) {
            self.start_epoch(); // describe the restored history, not the empty one
        }
    }
}
