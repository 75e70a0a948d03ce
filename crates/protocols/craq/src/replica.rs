//! The CRAQ replica: the chain write path (head orders, tail commits, ACKs flow back), clean
//! and dirty versions, reads with version queries, retransmission by timers, and re-linking
//! the chain on a view change.

use std::collections::{BTreeMap, BTreeSet};

use chorus_core::{
    ClientRequestId, Command, CommandError, Key, NodeId, Outbox, Outcome, Replica, Time, Value, View,
};
use rustc_hash::FxHashMap;

use crate::config::{Bug, CraqConfig};
use crate::key::{KeyEntry, Session, Version, Waiter};
use crate::message::Message;

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
    /// Set once this replica leaves a view: its copy may be stale from then on, so it never
    /// serves again (like Hermes, docs/decisions.md 3).
    retired: bool,
    /// The membership lease (Hermes §2.4): `None` without a membership service (serve as if
    /// it never expired), else until when this replica may answer from its own state. A
    /// replica cut off from the others must stop serving before they remove it.
    lease: Option<Option<Time>>,
}

impl Craq {
    pub fn new(config: CraqConfig) -> Craq {
        assert!(config.retransmit_timeout > Time::ZERO, "retransmit_timeout must be positive");
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
            lease: None,
        }
    }

    pub fn view(&self) -> View {
        self.view
    }

    pub fn stats(&self) -> CraqStats {
        self.stats
    }

    pub fn is_operational(&self) -> bool {
        !self.retired && self.view.live.contains(self.config.me)
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
        if !self.is_head() {
            return; // A forward meant for the head of another view.
        }
        let session = self.sessions.entry(origin).or_default();
        session.advance_done_below(done_below);
        if session.is_duplicate(seq) {
            // Seen in the chain: the chain will answer it. Answered here without a version:
            // that answer was lost, send it again.
            if let Some(Some(outcome)) = session.seen.get(&seq) {
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
                        self.sessions.entry(origin).or_default().record(seq, Some(effect.outcome.clone()));
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
        self.sessions.entry(version.origin).or_default().record(version.seq, None);
        if version.origin == me {
            if let Some(outstanding) = self.outstanding.get_mut(&version.seq) {
                outstanding.in_chain = true;
            }
        }
        let number = version.version;
        let entry = self.keys.get_mut(&key).expect("appended key exists");
        debug_assert_eq!(number, entry.latest_version() + 1);
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
                    debug_assert!(false, "the tail committed version {version} that we never saw");
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
        self.head_buffer.clear();
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
        if !self.is_operational() {
            out.reply(request, Outcome::Error(CommandError::Unavailable("not in the current view")));
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
        if message.epoch() != self.view.epoch || !self.is_operational() {
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
                let version = Version { version, value, origin, seq, outcome };
                self.on_write(now, from, key, version, done_below, out);
            }
            Message::Ack { key, version, .. } => self.on_ack(now, from, key, version, out),
            Message::Done { seq, outcome, .. } => self.complete_update(now, seq, outcome, out),
            Message::VersionQuery { key, query, .. } => {
                // The tail's answer decides what a dirty read returns: it needs the lease as
                // much as a local read does. The asker retransmits.
                if self.is_tail() && self.leased(now) {
                    let version = self.keys.get(&key).map_or(0, |entry| entry.clean_version);
                    out.send(from, Message::VersionReply { epoch: self.view.epoch, key, query, version });
                }
            }
            Message::VersionReply { key, query, version, .. } => {
                self.on_version_reply(now, key, query, version, out)
            }
        }
    }

    fn on_tick(&mut self, now: Time, out: &mut Outbox<Message>) {
        if self.is_operational() {
            self.retransmit(now, out);
        }
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
        self.view = view;
        self.stats.views_installed += 1;
        if !self.is_operational() {
            self.leave_service(out);
            return;
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
