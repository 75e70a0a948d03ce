//! The CRAQ replica: the chain write path (head orders, tail commits, ACKs flow back), clean
//! and dirty versions, reads with version queries, retransmission by timers, re-linking the
//! chain on a view change, and joining (copying a chain neighbour's state while linked in).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use chorus_core::{
    ClientRequestId, Command, CommandError, Key, NodeId, NodeSet, Outbox, Outcome, Replica, Time, Value, View,
};
use rustc_hash::FxHashMap;

use crate::config::{Bug, CraqConfig};
use crate::key::{bucket_of_hash, key_bucket, key_hash, KeyEntry, Session, Version, Waiter};
use crate::message::{ChunkKey, ChunkSeen, ChunkSession, ChunkVersion, Message};

/// A donor never splits its keys into more chunks than this (a joiner tracks one flag each).
const BUCKETS_MAX: u32 = 1 << 16;
/// A joiner's update numbers start at `join epoch << SEQ_EPOCH_SHIFT`, above every number an
/// earlier incarnation of the same node used (each gets 2^40 updates), so replicas that
/// remember the old incarnation's updates never mistake a new one for a duplicate.
const SEQ_EPOCH_SHIFT: u32 = 40;

/// A joiner's progress copying its donor's state (Hermes §3.4 Recovery).
#[derive(Debug, Default)]
struct Copy {
    /// Fixed by the first chunk: every later request names the same split.
    buckets_total: Option<u32>,
    received: Vec<bool>,
    /// Whom the last request went to, and when to ask again if no chunk came.
    asked: Option<NodeId>,
    retry_at: Option<Time>,
    /// Successors that answered that they are joining too (only a joining head asks
    /// successors); cleared on every view.
    refused: NodeSet,
}

impl Copy {
    fn is_complete(&self) -> bool {
        self.buckets_total.is_some() && self.received.iter().all(|got| *got)
    }

    /// Whether a chunk is the next piece of this copy, and if so mark it received. Only the
    /// donor asked (see `Craq::donor`) has state that fits this chain position; each bucket
    /// is taken once, since the keys may have moved on since a duplicate was sent.
    fn take(&mut self, from: NodeId, bucket: u32, buckets_total: u32) -> bool {
        debug_assert!(bucket < buckets_total && buckets_total <= BUCKETS_MAX);
        if self.asked != Some(from) {
            return false;
        }
        match self.buckets_total {
            None => {
                self.buckets_total = Some(buckets_total);
                self.received = vec![false; buckets_total as usize];
            }
            Some(total) if total != buckets_total => return false, // An answer to another split.
            Some(_) => {}
        }
        if std::mem::replace(&mut self.received[bucket as usize], true) {
            return false;
        }
        self.retry_at = None;
        true
    }
}

/// Counters for INFO, the simulator's summary and benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CraqStats {
    /// Reads answered from a clean local copy.
    pub reads_local: u64,
    /// Reads that found the key dirty and asked the tail.
    pub reads_queried: u64,
    /// Versions assigned by this replica as head.
    pub versions_assigned: u64,
    /// Versions committed by this replica as tail.
    pub versions_committed: u64,
    pub write_retransmits: u64,
    pub forward_retransmits: u64,
    pub messages_dropped_epoch: u64,
    pub views_installed: u64,
    /// Joining: chunks copied, keys they held, chunks served to joiners, requests refused
    /// while joining, copies started over (a view changed the donor), and copies completed.
    pub chunks_received: u64,
    pub keys_copied: u64,
    pub chunks_served: u64,
    pub chunks_refused: u64,
    pub copies_restarted: u64,
    pub recoveries_completed: u64,
}

/// An update this replica's client issued, forwarded to the head and not yet answered.
#[derive(Debug)]
struct Outstanding {
    request: ClientRequestId,
    key: Key,
    command: Command,
    sent_at: Time,
    /// The update reached this replica as a version in the chain: it can no longer be lost
    /// while this replica lives, so the forward need not be sent again.
    in_chain: bool,
}

/// A read waiting for the tail's committed version.
#[derive(Debug)]
struct Query {
    request: ClientRequestId,
    key: Key,
    sent_at: Time,
}

/// A key as a donor sends it, and as persistence logs it.
fn chunk_key(key: &Key, entry: &KeyEntry) -> ChunkKey {
    ChunkKey {
        key: key.clone(),
        clean_version: entry.clean_version,
        clean_value: entry.clean_value.clone(),
        dirty: entry
            .dirty
            .iter()
            .map(|version| ChunkVersion {
                version: version.version,
                value: version.value.clone(),
                origin: version.origin,
                seq: version.seq,
                outcome: version.outcome.clone(),
            })
            .collect(),
    }
}

/// A copied key's latest version; `None` when its dirty versions do not sit right above its
/// clean one, one after another (malformed).
fn chunk_latest(chunk: &ChunkKey) -> Option<u64> {
    let contiguous = chunk
        .dirty
        .iter()
        .enumerate()
        .all(|(index, version)| version.version == chunk.clean_version + 1 + index as u64);
    contiguous.then(|| chunk.dirty.last().map_or(chunk.clean_version, |version| version.version))
}

fn versions_of(dirty: Vec<ChunkVersion>) -> VecDeque<Version> {
    let version_of = |version: ChunkVersion| Version {
        version: version.version,
        value: version.value,
        origin: version.origin,
        seq: version.seq,
        outcome: version.outcome,
    };
    dirty.into_iter().map(version_of).collect()
}

pub struct Craq {
    config: CraqConfig,
    view: View,
    keys: FxHashMap<Key, KeyEntry>,
    /// Keys with dirty versions: the only ones a tick visits for retransmission. Ordered, so
    /// a seed's run visits them in the same order every time.
    dirty_keys: BTreeSet<Key>,
    sessions: FxHashMap<NodeId, Session>,
    /// At the head: forwards that arrived before an earlier update of the same origin.
    head_buffer: BTreeMap<(NodeId, u64), Command>,
    next_seq: u64,
    outstanding: BTreeMap<u64, Outstanding>,
    next_query: u64,
    queries: BTreeMap<u64, Query>,
    stats: CraqStats,
    /// Set once this replica leaves a view: its copy may be stale from then on, so it serves
    /// again only after the membership re-adds it and it has copied the state afresh.
    retired: bool,
    /// Started empty in a running cluster, and no view including this replica has been
    /// installed yet: it ignores every message (it must not act in epochs before its join).
    awaiting_join: bool,
    /// Joining: linked into the chain, copying its donor's state; serves no client.
    copy: Option<Copy>,
    /// The membership lease (Hermes §2.4): `None` without a membership service (serve as if
    /// it never expired), else until when this replica may answer from its own state. A
    /// replica cut off from the others must stop serving before they remove it.
    lease: Option<Option<Time>>,
}

impl Craq {
    pub fn new(config: CraqConfig) -> Craq {
        assert!(config.retransmit_timeout > Time::ZERO, "retransmit_timeout must be positive");
        let recovering = config.recovering;
        Craq {
            view: config.initial_view,
            config,
            keys: FxHashMap::default(),
            dirty_keys: BTreeSet::new(),
            sessions: FxHashMap::default(),
            head_buffer: BTreeMap::new(),
            next_seq: 0,
            outstanding: BTreeMap::new(),
            next_query: 0,
            queries: BTreeMap::new(),
            stats: CraqStats::default(),
            retired: false,
            awaiting_join: recovering,
            copy: None,
            lease: None,
        }
    }

    pub fn view(&self) -> View {
        self.view
    }

    pub fn stats(&self) -> CraqStats {
        self.stats
    }

    /// Serves clients: live in its view, with all the data (not joining).
    pub fn is_operational(&self) -> bool {
        self.participates() && self.copy.is_none()
    }

    /// Takes part in the chain (fully, or as a joiner still copying): live in its view.
    fn participates(&self) -> bool {
        !self.retired && !self.awaiting_join && self.view.live.contains(self.config.me)
    }

    /// Waiting to be added, or added and still copying.
    pub fn is_joining(&self) -> bool {
        self.awaiting_join || (self.participates() && self.copy.is_some())
    }

    /// Whether this replica holds `key` as its chain position requires: always, unless it is
    /// joining and has not copied the key's chunk yet. Until then it drops every version,
    /// ACK and version query of the key; the senders retransmit.
    fn is_copied(&self, key: &[u8]) -> bool {
        match &self.copy {
            None => true,
            Some(copy) => {
                copy.buckets_total.is_some_and(|total| copy.received[key_bucket(key, total) as usize])
            }
        }
    }

    /// The key's clean version, its value, and how many dirty versions sit above it.
    pub fn key_state(&self, key: &[u8]) -> Option<(u64, Option<&Value>, usize)> {
        self.keys.get(key).map(|entry| (entry.clean_version, entry.clean_value.as_ref(), entry.dirty.len()))
    }

    /// The key's latest value, clean or dirty.
    pub fn latest_value(&self, key: &[u8]) -> Option<&Value> {
        self.keys.get(key).and_then(KeyEntry::latest_value)
    }

    /// Every key whose latest version (clean or dirty) holds a value, in no particular order.
    pub fn keys(&self) -> impl Iterator<Item = &Key> {
        self.keys.iter().filter(|(_, entry)| entry.latest_value().is_some()).map(|(key, _)| key)
    }

    /// Number of keys whose latest version holds a value.
    pub fn key_count(&self) -> usize {
        self.keys.values().filter(|entry| entry.latest_value().is_some()).count()
    }

    /// A key's durable state (clean and dirty versions), as a donor copies it; persistence
    /// logs it and a restart restores it through [`Craq::restore`]. `None`: never written.
    pub fn export_key(&self, key: &[u8]) -> Option<ChunkKey> {
        let (key, entry) = self.keys.get_key_value(key).filter(|(_, entry)| entry.latest_version() > 0)?;
        Some(chunk_key(key, entry))
    }

    /// Every key ever written (deleted ones too: their version must survive).
    pub fn written_keys(&self) -> Vec<Key> {
        self.keys.iter().filter(|(_, entry)| entry.latest_version() > 0).map(|(key, _)| key.clone()).collect()
    }

    /// Load keys from this replica's own disk before it starts. Per key the newest state
    /// wins (latest version, then the higher clean one): records are logged as keys change,
    /// and a snapshot's may be newer than the log's that follow it. Dirty versions go down
    /// the chain again at the first tick or view (a tail commits them), as after a view
    /// change. `seq_floor`: this start's update numbers begin above it, above every number
    /// an earlier start used (the runtime passes one derived from the clock), so replicas
    /// that remember them never take a new update for a duplicate.
    pub fn restore(&mut self, entries: impl IntoIterator<Item = ChunkKey>, seq_floor: u64) {
        for restored in entries {
            let Some(latest) = chunk_latest(&restored) else { continue };
            let entry = self.keys.entry(restored.key.clone()).or_default();
            if (latest, restored.clean_version) < (entry.latest_version(), entry.clean_version) {
                continue;
            }
            entry.clean_version = restored.clean_version;
            entry.clean_value = restored.clean_value;
            entry.dirty = versions_of(restored.dirty);
            if entry.dirty.is_empty() {
                entry.retransmit_at = None;
                self.dirty_keys.remove(&restored.key);
            } else {
                entry.retransmit_at = Some(Time::ZERO);
                self.dirty_keys.insert(restored.key);
            }
        }
        // Every restored dirty version is an update this replica has seen in the chain: as
        // head it must take its origin's retransmitted forward for a duplicate, or it would
        // execute the update a second time on top of the first (an INCRBY applied twice, a
        // GETSET that erases the writes ordered after it). Rebuilt from scratch on each call
        // (the loader calls this once per record), so it ends up naming exactly the updates
        // of the final state: never one the replica does not hold.
        // Updates squashed into a clean version need no entry: a version is clean here only
        // after it passed every replica, its origin too, which then never forwards it again.
        self.sessions.clear();
        for key in &self.dirty_keys {
            let hash = key_hash(key);
            for version in &self.keys[key].dirty {
                self.sessions.entry(version.origin).or_default().record(version.seq, None, hash);
            }
        }
        self.next_seq = self.next_seq.max(seq_floor);
    }

    pub fn head(&self) -> Option<NodeId> {
        self.view.live.iter().next()
    }

    pub fn tail(&self) -> Option<NodeId> {
        self.view.live.iter().last()
    }

    fn me(&self) -> NodeId {
        self.config.me
    }

    fn is_head(&self) -> bool {
        self.head() == Some(self.me())
    }

    fn is_tail(&self) -> bool {
        self.tail() == Some(self.me())
    }

    fn predecessor(&self) -> Option<NodeId> {
        let me = self.me();
        self.view.live.iter().take_while(|node| *node < me).last()
    }

    fn successor(&self) -> Option<NodeId> {
        let me = self.me();
        self.view.live.iter().find(|node| *node > me)
    }

    #[inline(always)]
    fn has_bug(&self, _bug: Bug) -> bool {
        #[cfg(feature = "broken-variants")]
        return self.config.bug == Some(_bug);
        #[cfg(not(feature = "broken-variants"))]
        false
    }

    /// Whether any deliberately broken variant is on (never without the feature).
    fn is_broken(&self) -> bool {
        #[cfg(feature = "broken-variants")]
        return self.config.bug.is_some();
        #[cfg(not(feature = "broken-variants"))]
        false
    }

    fn done_below(&self) -> u64 {
        self.outstanding.keys().next().copied().unwrap_or(self.next_seq)
    }

    // ---------------------------------------------------------------- client requests

    /// Start this replica's waiting requests of `key` in order, as far as per-key FIFO allows:
    /// updates pipeline behind updates, reads behind reads, never across.
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
            let Some(entry) = self.keys.get_mut(key) else { return };
            let Some(front) = entry.waiting.front() else { return };
            let is_read = matches!(front.command, Command::Read { .. });
            if (is_read && entry.updates_in_flight > 0) || (!is_read && entry.reads_in_flight > 0) {
                return;
            }
            let waiter = entry.waiting.pop_front().expect("front exists");
            if is_read {
                self.start_read(now, key, waiter.request, out);
            } else {
                self.start_update(now, key, waiter, out);
            }
        }
    }

    /// CRAQ §2.3: a clean key is read locally; a dirty one asks the tail which version is
    /// committed. (The tail is always clean: it commits what it receives.)
    fn start_read(&mut self, now: Time, key: &Key, request: ClientRequestId, out: &mut Outbox<Message>) {
        let read_dirty = self.has_bug(Bug::ReadDirtyLocally);
        let entry = self.keys.get_mut(key).expect("read key exists");
        if entry.is_clean() || read_dirty {
            out.reply(request, Outcome::Value(entry.latest_value().cloned()));
            self.stats.reads_local += 1;
            return;
        }
        entry.reads_in_flight += 1;
        self.stats.reads_queried += 1;
        let query = self.next_query;
        self.next_query += 1;
        self.queries.insert(query, Query { request, key: key.clone(), sent_at: now });
        self.send_query(query, out);
    }

    fn send_query(&mut self, query: u64, out: &mut Outbox<Message>) {
        let tail = self.tail().expect("an operational replica has a tail");
        debug_assert_ne!(tail, self.me(), "the tail is never dirty");
        let key = self.queries[&query].key.clone();
        out.send(tail, Message::VersionQuery { epoch: self.view.epoch, key, query });
    }

    fn start_update(&mut self, now: Time, key: &Key, waiter: Waiter, out: &mut Outbox<Message>) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.keys.get_mut(key).expect("updated key exists").updates_in_flight += 1;
        let outstanding = Outstanding {
            request: waiter.request,
            key: key.clone(),
            command: waiter.command,
            sent_at: now,
            in_chain: false,
        };
        self.outstanding.insert(seq, outstanding);
        self.send_forward(now, seq, out);
    }

    /// Send (or, at the head, hand to ourselves) an update on its way to the head.
    fn send_forward(&mut self, now: Time, seq: u64, out: &mut Outbox<Message>) {
        let done_below = self.done_below();
        // Handing an earlier update to ourselves (at the head or leader) may have answered
        // this one already.
        let Some(outstanding) = self.outstanding.get_mut(&seq) else { return };
        outstanding.sent_at = now;
        let command = outstanding.command.clone();
        if self.is_head() {
            let me = self.me();
            self.on_forward(now, me, seq, done_below, command, out);
        } else {
            let head = self.head().expect("an operational replica has a head");
            out.send(head, Message::Forward { epoch: self.view.epoch, seq, done_below, command });
        }
    }

    /// The update `seq` of this replica is answered: reply, and let the key's next requests go.
    fn complete_update(&mut self, now: Time, seq: u64, outcome: Outcome, out: &mut Outbox<Message>) {
        let Some(outstanding) = self.outstanding.remove(&seq) else { return };
        out.reply(outstanding.request, outcome);
        let entry = self.keys.get_mut(&outstanding.key).expect("updated key exists");
        entry.updates_in_flight -= 1;
        self.drain(now, &outstanding.key, out);
    }

    // ---------------------------------------------------------------- the head

    /// A forward reached the head. Each origin's updates execute in `seq` order, once.
    fn on_forward(
        &mut self,
        now: Time,
        origin: NodeId,
        seq: u64,
        done_below: u64,
        command: Command,
        out: &mut Outbox<Message>,
    ) {
        if !self.is_head() || self.copy.is_some() {
            // A forward meant for the head of another view, or a joining head that does not
            // know every key's latest version yet: the origin sends it again.
            return;
        }
        let session = self.sessions.entry(origin).or_default();
        session.advance_done_below(done_below);
        if session.is_duplicate(seq) {
            // Seen in the chain: the chain will answer it. Answered here without a version:
            // that answer was lost, send it again.
            if let Some(Some(outcome)) = session.seen.get(&seq).map(|seen| &seen.answer) {
                let outcome = outcome.clone();
                self.send_done(now, origin, seq, outcome, out);
            }
            return;
        }
        self.head_buffer.insert((origin, seq), command);
        loop {
            let session = self.sessions.get_mut(&origin).expect("session exists");
            let next = session.next;
            // Drop buffered forwards that are now known duplicates.
            let stale: Vec<u64> =
                self.head_buffer.range((origin, 0)..(origin, next)).map(|((_, seq), _)| *seq).collect();
            for seq in stale {
                self.head_buffer.remove(&(origin, seq));
            }
            let Some(command) = self.head_buffer.remove(&(origin, next)) else { break };
            self.execute(now, origin, next, command, out);
        }
    }

    /// The head orders an update: a new version on top of its latest one. An RMW runs on the
    /// latest (possibly dirty) version: every earlier version commits before it, because a
    /// replica accepts versions only in order.
    fn execute(&mut self, now: Time, origin: NodeId, seq: u64, command: Command, out: &mut Outbox<Message>) {
        let key = command.key().clone();
        let entry = self.keys.entry(key.clone()).or_default();
        let (value, outcome) = match command {
            Command::Write { value, .. } => (value, Outcome::Written),
            Command::Rmw { op, .. } => {
                let effect = op.apply(entry.latest_value());
                match effect.write {
                    // Decided not to write, on a clean key: nothing newer exists anywhere
                    // (the head orders every update), so the answer is linearizable now.
                    None if entry.is_clean() => {
                        let hash = key_hash(&key);
                        self.sessions.entry(origin).or_default().record(
                            seq,
                            Some(effect.outcome.clone()),
                            hash,
                        );
                        self.send_done(now, origin, seq, effect.outcome, out);
                        return;
                    }
                    // Decided not to write, on a dirty key: its answer depends on versions not
                    // committed yet, so it travels the chain as an unchanged version.
                    None => (entry.latest_value().cloned(), effect.outcome),
                    Some(value) => (value, effect.outcome),
                }
            }
            Command::Read { .. } => unreachable!("reads are never forwarded"),
        };
        let version = Version { version: entry.latest_version() + 1, value, origin, seq, outcome };
        self.stats.versions_assigned += 1;
        if self.has_bug(Bug::AckAtHead) {
            let outcome = version.outcome.clone();
            self.send_done(now, origin, seq, outcome, out);
        }
        self.append_version(now, key, version, out);
    }

    fn send_done(
        &mut self,
        now: Time,
        origin: NodeId,
        seq: u64,
        outcome: Outcome,
        out: &mut Outbox<Message>,
    ) {
        if origin == self.me() {
            self.complete_update(now, seq, outcome, out);
        } else {
            out.send(origin, Message::Done { epoch: self.view.epoch, seq, outcome });
        }
    }

    // ---------------------------------------------------------------- the chain

    /// Take `version` (the next one of its key) into this replica's dirty versions, and pass
    /// it on: down the chain, or, at the tail, commit it.
    fn append_version(&mut self, now: Time, key: Key, version: Version, out: &mut Outbox<Message>) {
        let me = self.me();
        let ack_at_head = self.has_bug(Bug::AckAtHead);
        self.sessions.entry(version.origin).or_default().record(version.seq, None, key_hash(&key));
        if version.origin == me {
            if let Some(outstanding) = self.outstanding.get_mut(&version.seq) {
                outstanding.in_chain = true;
            }
        }
        let number = version.version;
        let entry = self.keys.get_mut(&key).expect("appended key exists");
        debug_assert!(number == entry.latest_version() + 1 || ack_at_head);
        entry.dirty.push_back(version);
        if self.is_tail() {
            self.stats.versions_committed += 1;
            self.clean_up_to(now, &key, number, out);
            if let Some(predecessor) = self.predecessor() {
                out.send(predecessor, Message::Ack { epoch: self.view.epoch, key, version: number });
            }
            return;
        }
        let successor = self.successor().expect("a replica that is not the tail has a successor");
        let sent = self.keys[&key].dirty.back().expect("just pushed");
        out.send(successor, self.write_message(&key, sent));
        let retransmit_at = now + self.config.retransmit_timeout;
        self.keys.get_mut(&key).expect("appended key exists").retransmit_at.get_or_insert(retransmit_at);
        if !self.dirty_keys.contains(&key) {
            self.dirty_keys.insert(key);
        }
    }

    fn write_message(&self, key: &Key, version: &Version) -> Message {
        Message::Write {
            epoch: self.view.epoch,
            key: key.clone(),
            version: version.version,
            value: version.value.clone(),
            origin: version.origin,
            seq: version.seq,
            done_below: self.sessions.get(&version.origin).map_or(0, |session| session.done_below),
            outcome: version.outcome.clone(),
        }
    }

    /// Every version of `key` up to `version` is committed: it becomes the clean one, and the
    /// clients of this replica whose updates those versions were get their answers.
    fn clean_up_to(&mut self, now: Time, key: &Key, version: u64, out: &mut Outbox<Message>) {
        let me = self.me();
        let entry = self.keys.get_mut(key).expect("cleaned key exists");
        let mut answered = Vec::new();
        while entry.dirty.front().is_some_and(|front| front.version <= version) {
            let committed = entry.dirty.pop_front().expect("front exists");
            entry.clean_version = committed.version;
            entry.clean_value = committed.value;
            if committed.origin == me {
                answered.push((committed.seq, committed.outcome));
            }
        }
        if entry.dirty.is_empty() {
            entry.retransmit_at = None;
            self.dirty_keys.remove(key);
        }
        for (seq, outcome) in answered {
            self.complete_update(now, seq, outcome, out);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn on_write(
        &mut self,
        now: Time,
        from: NodeId,
        key: Key,
        version: Version,
        done_below: u64,
        out: &mut Outbox<Message>,
    ) {
        if self.predecessor() != Some(from) {
            return; // Only the predecessor of this view's chain sends versions down to us.
        }
        self.sessions.entry(version.origin).or_default().advance_done_below(done_below);
        let entry = self.keys.entry(key.clone()).or_default();
        let latest = entry.latest_version();
        if version.version <= latest {
            // A retransmission. If it is committed here, the predecessor lost our ACK.
            if version.version <= entry.clean_version {
                let clean = entry.clean_version;
                out.send(from, Message::Ack { epoch: self.view.epoch, key, version: clean });
            }
            return;
        }
        if version.version > latest + 1 {
            return; // An earlier version was lost or is late: the predecessor will resend both.
        }
        self.append_version(now, key, version, out);
    }

    fn on_ack(&mut self, now: Time, from: NodeId, key: Key, version: u64, out: &mut Outbox<Message>) {
        if self.successor() != Some(from) {
            return;
        }
        let Some(entry) = self.keys.get(&key) else { return };
        if version <= entry.clean_version || version > entry.latest_version() {
            return;
        }
        self.clean_up_to(now, &key, version, out);
        if let Some(predecessor) = self.predecessor() {
            out.send(predecessor, Message::Ack { epoch: self.view.epoch, key, version });
        }
    }

    fn on_version_reply(&mut self, now: Time, key: Key, query: u64, version: u64, out: &mut Outbox<Message>) {
        let Some(pending) = self.queries.get(&query) else { return };
        if pending.key != key {
            return;
        }
        let entry = self.keys.get(&key).expect("queried key exists");
        // The tail's committed version passed through us before it committed, so we hold it,
        // unless an ACK since made a newer version clean: that one was committed after the
        // tail answered and before now, so answering with it is linearizable too.
        let value = if version <= entry.clean_version {
            entry.clean_value.clone()
        } else {
            match entry.value_of(version) {
                Some(value) => value.cloned(),
                None => {
                    // Only a broken variant (a replica back with stale data) gets here.
                    debug_assert!(self.is_broken(), "the tail committed version {version} that we never saw");
                    return;
                }
            }
        };
        let pending = self.queries.remove(&query).expect("query exists");
        out.reply(pending.request, Outcome::Value(value));
        self.keys.get_mut(&key).expect("queried key exists").reads_in_flight -= 1;
        self.drain(now, &key, out);
    }

    /// The tail answers a pending read of its own directly: everything it holds is committed.
    fn answer_queries_locally(&mut self, now: Time, out: &mut Outbox<Message>) {
        for (_, query) in std::mem::take(&mut self.queries) {
            let entry = self.keys.get_mut(&query.key).expect("queried key exists");
            debug_assert!(entry.is_clean());
            out.reply(query.request, Outcome::Value(entry.clean_value.clone()));
            entry.reads_in_flight -= 1;
            self.drain(now, &query.key, out);
        }
    }

    // ---------------------------------------------------------------- time and views

    fn retransmit(&mut self, now: Time, out: &mut Outbox<Message>) {
        let timeout = self.config.retransmit_timeout;
        if let Some(successor) = self.successor() {
            let due: Vec<Key> = self
                .dirty_keys
                .iter()
                .filter(|key| self.keys[*key].retransmit_at.is_some_and(|at| now >= at))
                .cloned()
                .collect();
            for key in due {
                let entry = &self.keys[&key];
                for version in &entry.dirty {
                    out.send(successor, self.write_message(&key, version));
                }
                self.stats.write_retransmits += 1;
                self.keys.get_mut(&key).expect("dirty key exists").retransmit_at = Some(now + timeout);
            }
        }
        let due: Vec<u64> = self
            .outstanding
            .iter()
            .filter(|(_, pending)| !pending.in_chain && now >= pending.sent_at + timeout)
            .map(|(seq, _)| *seq)
            .collect();
        for seq in due {
            self.stats.forward_retransmits += 1;
            self.send_forward(now, seq, out);
        }
        let due: Vec<u64> = self
            .queries
            .iter()
            .filter(|(_, query)| now >= query.sent_at + timeout)
            .map(|(id, _)| *id)
            .collect();
        for query in due {
            self.queries.get_mut(&query).expect("query exists").sent_at = now;
            self.send_query(query, out);
        }
    }

    /// Leaving the view: stop serving. Waiting requests and reads never executed; forwarded
    /// updates may still commit through the chain, so their outcome is unknown.
    fn leave_service(&mut self, out: &mut Outbox<Message>) {
        self.retired = true;
        self.copy = None;
        self.fail_client_requests(out);
        self.head_buffer.clear();
    }

    /// Answer every request of this replica's clients that has not been answered: it will
    /// not be, from this state.
    fn fail_client_requests(&mut self, out: &mut Outbox<Message>) {
        for entry in self.keys.values_mut() {
            for waiter in entry.waiting.drain(..) {
                out.reply(
                    waiter.request,
                    Outcome::Error(CommandError::Unavailable("not in the current view")),
                );
            }
            entry.updates_in_flight = 0;
            entry.reads_in_flight = 0;
        }
        for (_, query) in std::mem::take(&mut self.queries) {
            out.reply(query.request, Outcome::Error(CommandError::Unavailable("not in the current view")));
        }
        for (_, outstanding) in std::mem::take(&mut self.outstanding) {
            out.reply(outstanding.request, Outcome::Error(CommandError::OutcomeUnknown));
        }
    }

    // ---------------------------------------------------------------- joining (§3.4 Recovery)

    /// The membership (re-)added this replica: start over, empty, as a joiner. Whatever it
    /// held may be stale; everything it needs comes from its donor or down the chain.
    fn become_joiner(&mut self, now: Time, out: &mut Outbox<Message>) {
        debug_assert!(self.outstanding.is_empty() && self.queries.is_empty());
        assert!(self.view.epoch.0 < 1 << (64 - SEQ_EPOCH_SHIFT), "epoch overflows the update numbering");
        let keep_data = self.has_bug(Bug::RejoinWithoutCopy);
        if !keep_data {
            self.clear_data();
        }
        self.outstanding.clear();
        self.queries.clear();
        self.retired = false;
        self.awaiting_join = false;
        // The join epoch is unique to this incarnation: its update numbers are too.
        self.next_seq = self.next_seq.max(self.view.epoch.0 << SEQ_EPOCH_SHIFT);
        if keep_data {
            return;
        }
        self.copy = Some(Copy::default());
        self.request_chunk_if_due(now, out);
    }

    fn clear_data(&mut self) {
        self.keys.clear();
        self.dirty_keys.clear();
        self.sessions.clear();
        self.head_buffer.clear();
    }

    /// Whom a joiner copies from. Chain replication's rule: the predecessor, whose state
    /// includes everything the rest of the chain holds (versions reach us only through it),
    /// so versions it sends after the copy land exactly on top of it. A joining head has no
    /// predecessor: it copies from the first successor that is not joining itself. Every
    /// version anywhere passed through that one, and the joiners before it hold nothing
    /// (they copy only from their predecessor, which is still copying).
    fn donor(&self) -> Option<NodeId> {
        if let Some(predecessor) = self.predecessor() {
            return Some(predecessor);
        }
        let refused = self.copy.as_ref().map_or(NodeSet::EMPTY, |copy| copy.refused);
        let me = self.me();
        self.view.live.iter().find(|node| *node > me && !refused.contains(*node))
    }

    fn request_chunk_if_due(&mut self, now: Time, out: &mut Outbox<Message>) {
        let timeout = Time::from_nanos(self.config.retransmit_timeout.as_nanos() * 4);
        let donor = self.donor();
        let epoch = self.view.epoch;
        let Some(copy) = &mut self.copy else { return };
        if copy.retry_at.is_some_and(|at| now < at) {
            return;
        }
        copy.retry_at = Some(now + timeout);
        let Some(donor) = donor else {
            // Every successor said it is joining: ask them all again after a while. (The
            // membership keeps a member with all the data in every view.)
            copy.refused = NodeSet::EMPTY;
            copy.asked = None;
            return;
        };
        let (bucket, buckets_total) = match copy.buckets_total {
            None => (0, 0),
            Some(total) => {
                let missing = copy.received.iter().position(|got| !got);
                (missing.expect("a finished copy is dropped") as u32, total)
            }
        };
        copy.asked = Some(donor);
        out.send(donor, Message::ChunkRequest { epoch, bucket, buckets_total });
    }

    /// Serve one chunk: this replica's state for the chunk's keys. Only a replica with all
    /// the data answers, and only in the joiner's epoch (checked by the caller).
    fn on_chunk_request(&mut self, from: NodeId, bucket: u32, buckets_total: u32, out: &mut Outbox<Message>) {
        let epoch = self.view.epoch;
        if self.copy.is_some() {
            self.stats.chunks_refused += 1;
            out.send(from, Message::ChunkRefused { epoch });
            return;
        }
        let buckets_total = if buckets_total == 0 { self.buckets_for_copy() } else { buckets_total };
        if buckets_total > BUCKETS_MAX || bucket >= buckets_total {
            return; // Malformed: a joiner never asks past the end.
        }
        let keys: Vec<ChunkKey> = self
            .keys
            .iter()
            .filter(|(key, entry)| entry.latest_version() > 0 && key_bucket(key, buckets_total) == bucket)
            .map(|(key, entry)| chunk_key(key, entry))
            .collect();
        let mut sessions: Vec<ChunkSession> = self
            .sessions
            .iter()
            .map(|(origin, session)| ChunkSession {
                origin: *origin,
                done_below: session.done_below,
                seen: session
                    .seen
                    .iter()
                    .filter(|(_, seen)| bucket_of_hash(seen.key_hash, buckets_total) == bucket)
                    .map(|(seq, seen)| ChunkSeen {
                        seq: *seq,
                        key_hash: seen.key_hash,
                        answer: seen.answer.clone(),
                    })
                    .collect(),
            })
            .collect();
        sessions.sort_by_key(|session| session.origin);
        self.stats.chunks_served += 1;
        out.send(from, Message::Chunk { epoch, bucket, buckets_total, keys, sessions });
    }

    /// How many chunks to split the keys into: about `chunk_bytes_target` each.
    fn buckets_for_copy(&self) -> u32 {
        let bytes: usize = self
            .keys
            .iter()
            .map(|(key, entry)| {
                let dirty: usize = entry
                    .dirty
                    .iter()
                    .map(|version| version.value.as_ref().map_or(0, |value| value.len()) + 48)
                    .sum();
                key.len() + entry.clean_value.as_ref().map_or(0, |value| value.len()) + 32 + dirty
            })
            .sum();
        let target = self.config.chunk_bytes_target.max(1);
        u32::try_from(bytes / target + 1).unwrap_or(u32::MAX).min(BUCKETS_MAX)
    }

    /// A chunk from the donor: take its keys as they stand there, then pass their dirty
    /// versions on down the chain (or, at the tail, commit them).
    #[allow(clippy::too_many_arguments)]
    fn on_chunk(
        &mut self,
        now: Time,
        from: NodeId,
        bucket: u32,
        buckets_total: u32,
        keys: Vec<ChunkKey>,
        sessions: Vec<ChunkSession>,
        out: &mut Outbox<Message>,
    ) {
        if buckets_total == 0 || buckets_total > BUCKETS_MAX || bucket >= buckets_total {
            return;
        }
        // After the copy, a chunk is a late duplicate: the keys have moved on since.
        let Some(copy) = &mut self.copy else { return };
        if !copy.take(from, bucket, buckets_total) {
            return;
        }
        self.stats.chunks_received += 1;
        self.stats.keys_copied += keys.len() as u64;
        for copied in keys {
            if key_bucket(&copied.key, buckets_total) == bucket {
                self.install_copied_key(now, copied, out);
            }
        }
        for copied in sessions {
            let session = self.sessions.entry(copied.origin).or_default();
            session.advance_done_below(copied.done_below);
            for seen in copied.seen {
                if bucket_of_hash(seen.key_hash, buckets_total) == bucket {
                    session.record(seen.seq, seen.answer, seen.key_hash);
                }
            }
        }
        if self.copy.as_ref().is_some_and(Copy::is_complete) {
            self.copy = None;
            self.stats.recoveries_completed += 1;
        } else {
            self.request_chunk_if_due(now, out);
        }
    }

    fn install_copied_key(&mut self, now: Time, copied: ChunkKey, out: &mut Outbox<Message>) {
        let Some(latest) = chunk_latest(&copied) else {
            return; // Malformed: a donor's dirty versions sit right above its clean one.
        };
        let key = copied.key;
        let hash = key_hash(&key);
        let entry = self.keys.entry(key.clone()).or_default();
        if entry.latest_version() >= latest {
            // Never newer: a joiner holds nothing of a key before its chunk. Kept as a guard
            // so that no copy can take a key backwards.
            return;
        }
        entry.clean_version = copied.clean_version;
        entry.clean_value = copied.clean_value;
        entry.dirty = versions_of(copied.dirty);
        entry.retransmit_at = None;
        let stamps: Vec<(NodeId, u64)> =
            entry.dirty.iter().map(|version| (version.origin, version.seq)).collect();
        let clean = entry.dirty.is_empty();
        let dirty_count = entry.dirty.len() as u64;
        for (origin, seq) in stamps {
            self.sessions.entry(origin).or_default().record(seq, None, hash);
        }
        if clean {
            self.dirty_keys.remove(&key);
        } else if self.is_tail() {
            // Every replica before us holds these versions (the donor, our predecessor, got
            // them from its own): as tail we commit them, like a tail after a view change.
            self.stats.versions_committed += dirty_count;
            self.clean_up_to(now, &key, latest, out);
            if let Some(predecessor) = self.predecessor() {
                out.send(predecessor, Message::Ack { epoch: self.view.epoch, key, version: latest });
            }
        } else {
            self.resend_dirty(now, &key, out);
        }
    }

    /// Send every dirty version of `key` to the successor, and time the next retransmission.
    fn resend_dirty(&mut self, now: Time, key: &Key, out: &mut Outbox<Message>) {
        let Some(successor) = self.successor() else { return };
        for version in &self.keys[key].dirty {
            out.send(successor, self.write_message(key, version));
        }
        self.keys.get_mut(key).expect("dirty key exists").retransmit_at =
            Some(now + self.config.retransmit_timeout);
        if !self.dirty_keys.contains(key) {
            self.dirty_keys.insert(key.clone());
        }
    }

    /// The asked donor is joining too. A joining head moves on to the next successor at
    /// once; anyone else waits for its predecessor, which answers once it has caught up.
    fn on_chunk_refused(&mut self, now: Time, from: NodeId, out: &mut Outbox<Message>) {
        let head = self.predecessor().is_none();
        let Some(copy) = &mut self.copy else { return };
        if copy.asked != Some(from) || !head {
            return;
        }
        copy.refused.insert(from);
        copy.retry_at = None;
        self.request_chunk_if_due(now, out);
    }

    /// A new view while copying. What was copied stays valid only if the donor is the same
    /// replica (same incarnation) with the same place in the chain: the view only removed
    /// others, and not our predecessor. A view that adds a node, or re-adds one (a restart
    /// keeps the live set and only moves the epoch), may have put a new, empty incarnation
    /// before us; keeping a copy then could leave us holding versions a joining head skips.
    fn on_view_while_copying(
        &mut self,
        now: Time,
        previous: View,
        previous_predecessor: Option<NodeId>,
        out: &mut Outbox<Message>,
    ) {
        let only_removals = previous.live.is_superset_of(self.view.live) && previous.live != self.view.live;
        if !only_removals || self.predecessor() != previous_predecessor {
            // Nothing to answer unless a broken variant served clients while copying.
            self.fail_client_requests(out);
            self.clear_data();
            self.copy = Some(Copy::default());
            self.stats.copies_restarted += 1;
        }
        let copy = self.copy.as_mut().expect("copying");
        copy.refused = NodeSet::EMPTY;
        copy.retry_at = None;
        self.request_chunk_if_due(now, out);
    }
}

impl Replica for Craq {
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
        let serves_early = self.has_bug(Bug::JoinerServes) && self.participates();
        if !self.is_operational() && !serves_early {
            let reason = if self.is_joining() {
                "joining: copying the data from a chain neighbour"
            } else {
                "not in the current view"
            };
            out.reply(request, Outcome::Error(CommandError::Unavailable(reason)));
            return;
        }
        let key = command.key().clone();
        let leased = self.leased(now);
        if leased && matches!(command, Command::Read { .. }) && !self.keys.contains_key(&key) {
            // Never written as far as this replica knows, and no update of it is in flight
            // anywhere upstream that has reached us: a clean read of "absent".
            out.reply(request, Outcome::Value(None));
            self.stats.reads_local += 1;
            return;
        }
        self.keys.entry(key.clone()).or_default().waiting.push_back(Waiter { request, command });
        self.drain(now, &key, out);
    }

    fn on_message(&mut self, now: Time, from: NodeId, message: Message, out: &mut Outbox<Message>) {
        if message.epoch() != self.view.epoch || !self.participates() {
            self.stats.messages_dropped_epoch += 1;
            return;
        }
        match message {
            Message::Forward { seq, done_below, command, .. } => {
                if command.is_update() {
                    self.on_forward(now, from, seq, done_below, command, out);
                }
            }
            Message::Write { key, version, value, origin, seq, done_below, outcome, .. } => {
                if self.is_copied(&key) {
                    let version = Version { version, value, origin, seq, outcome };
                    self.on_write(now, from, key, version, done_below, out);
                }
            }
            Message::Ack { key, version, .. } => {
                if self.is_copied(&key) {
                    self.on_ack(now, from, key, version, out);
                }
            }
            Message::Done { seq, outcome, .. } => self.complete_update(now, seq, outcome, out),
            Message::VersionQuery { key, query, .. } => {
                // The tail's answer decides what a dirty read returns: it needs the lease as
                // much as a local read does. The asker retransmits.
                if self.is_tail() && self.leased(now) && self.is_copied(&key) {
                    let version = self.keys.get(&key).map_or(0, |entry| entry.clean_version);
                    out.send(from, Message::VersionReply { epoch: self.view.epoch, key, query, version });
                }
            }
            Message::VersionReply { key, query, version, .. } => {
                self.on_version_reply(now, key, query, version, out)
            }
            Message::ChunkRequest { bucket, buckets_total, .. } => {
                self.on_chunk_request(from, bucket, buckets_total, out)
            }
            Message::Chunk { bucket, buckets_total, keys, sessions, .. } => {
                self.on_chunk(now, from, bucket, buckets_total, keys, sessions, out)
            }
            Message::ChunkRefused { .. } => self.on_chunk_refused(now, from, out),
        }
    }

    fn on_tick(&mut self, now: Time, out: &mut Outbox<Message>) {
        if self.participates() {
            self.request_chunk_if_due(now, out);
            self.retransmit(now, out);
        }
    }

    fn installed_view(&self) -> Option<View> {
        Some(self.view)
    }

    fn event_counts(&self, report: &mut dyn FnMut(&'static str, u64)) {
        let stats = &self.stats;
        report("craq.reads_queried", stats.reads_queried);
        report("craq.write_retransmits", stats.write_retransmits + stats.forward_retransmits);
        report("craq.keys_copied", stats.keys_copied);
        report("craq.copies_restarted", stats.copies_restarted);
        report("craq.recoveries", stats.recoveries_completed);
    }

    /// A joiner has caught up once it holds every chunk (Hermes §3.4 Recovery).
    fn is_caught_up(&self) -> bool {
        self.participates() && self.copy.is_none()
    }

    fn on_lease(&mut self, now: Time, valid_until: Option<Time>, out: &mut Outbox<Message>) {
        let was_leased = self.leased(now);
        self.lease = Some(valid_until);
        if !was_leased && self.leased(now) && self.is_operational() {
            // Requests held for want of a lease can go now.
            let mut waiting: Vec<Key> = self
                .keys
                .iter()
                .filter(|(_, entry)| !entry.waiting.is_empty())
                .map(|(key, _)| key.clone())
                .collect();
            waiting.sort();
            for key in waiting {
                self.drain(now, &key, out);
            }
        }
    }

    /// Re-link the chain (CRAQ §2.4 relies on chain replication's reconfiguration): the new
    /// tail commits whatever it holds (everything committed before passed through it, and
    /// the rest is now as far down as any write can go); every other replica re-drives its
    /// dirty versions to its new successor, and every origin re-sends to the new head the
    /// updates the chain has not shown it yet.
    fn on_view(&mut self, now: Time, view: View, out: &mut Outbox<Message>) {
        if view.epoch <= self.view.epoch {
            return; // Views only move forward; a late m-update is stale.
        }
        let (previous, previous_predecessor) = (self.view, self.predecessor());
        self.view = view;
        self.stats.views_installed += 1;
        if view.live.contains(self.me()) && (self.awaiting_join || self.retired) {
            self.become_joiner(now, out);
            return;
        }
        if !self.participates() {
            if !self.retired && !self.awaiting_join {
                self.leave_service(out);
            }
            return;
        }
        if self.copy.is_some() {
            self.on_view_while_copying(now, previous, previous_predecessor, out);
        }
        if !self.is_head() {
            self.head_buffer.clear();
        }
        let dirty: Vec<Key> = self.dirty_keys.iter().cloned().collect();
        if self.is_tail() {
            for key in dirty {
                let latest = self.keys[&key].latest_version();
                self.stats.versions_committed += self.keys[&key].dirty.len() as u64;
                self.clean_up_to(now, &key, latest, out);
                if let Some(predecessor) = self.predecessor() {
                    out.send(predecessor, Message::Ack { epoch: self.view.epoch, key, version: latest });
                }
            }
            self.answer_queries_locally(now, out);
        } else if let Some(successor) = self.successor() {
            for key in dirty {
                for version in &self.keys[&key].dirty {
                    out.send(successor, self.write_message(&key, version));
                }
                self.keys.get_mut(&key).expect("dirty key exists").retransmit_at =
                    Some(now + self.config.retransmit_timeout);
            }
            let queries: Vec<u64> = self.queries.keys().copied().collect();
            for query in queries {
                self.queries.get_mut(&query).expect("query exists").sent_at = now;
                self.send_query(query, out);
            }
        }
        let unseen: Vec<u64> =
            self.outstanding.iter().filter(|(_, pending)| !pending.in_chain).map(|(seq, _)| *seq).collect();
        for seq in unseen {
            self.send_forward(now, seq, out);
        }
    }
}
