//! The Hermes replica: §3.2 (reads, writes, replays), §3.3 (O1-O3), §3.4 (message loss,
//! epochs, reconfiguration) and §3.6 (RMWs) as a deterministic state machine.

use std::collections::BTreeSet;

use chorus_core::{
    ClientRequestId, Command, CommandError, Key, NodeId, NodeSet, Outbox, Outcome, Replica, Time, Timestamp,
    Value, View,
};

use crate::config::HermesConfig;
use crate::key::{HoldersSeen, KeyEntry, KeyState, StoredKey, Update, UpdateClient, UpdateKind, Waiter};
use crate::message::{ChunkEntry, Message};

use crate::config::Bug;

/// Counters for INFO, the simulator's summary and benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HermesStats {
    pub reads_local: u64,
    pub reads_stalled: u64,
    pub updates_started: u64,
    pub updates_committed: u64,
    pub rmw_aborts: u64,
    pub replays_started: u64,
    pub inv_retransmits: u64,
    pub messages_dropped_epoch: u64,
    pub views_installed: u64,
    /// §3.4 Recovery: chunks this replica copied as a shadow, the keys they held, and the
    /// chunks it served to shadows.
    pub chunks_received: u64,
    pub keys_copied: u64,
    pub chunks_served: u64,
    pub recoveries_completed: u64,
}

/// A shadow replica's progress copying the data (§3.4 Recovery).
#[derive(Debug)]
struct Shadow {
    /// Fixed by the first chunk: every donor splits the keys the same way.
    buckets_total: Option<u32>,
    received: Vec<bool>,
    /// The bucket asked for, and when to ask again (perhaps another donor).
    asked: Option<(u32, Time)>,
    /// Index into the live set of the donor asked last; rotates on timeouts.
    donor_turn: usize,
}

/// Whether `command`, first in its key's queue, may be served now: a read needs a Valid key
/// (§3.1) and the lease; a write or an RMW also needs no update in flight (§3.2). An RMW reads
/// locally too, so it needs the lease as much as a read does.
fn servable_now(entry: &KeyEntry, command: &Command, leased: bool, read_in_any_state: bool) -> bool {
    let valid = entry.state == KeyState::Valid;
    match command {
        Command::Read { .. } => (valid || read_in_any_state) && leased,
        Command::Write { .. } | Command::Rmw { .. } => valid && entry.update.is_none() && leased,
    }
}

/// Every key this replica knows, with its state. hashbrown's map, for `entry_ref`: one hash
/// and one probe find or insert a key, where std's map needs two (a profile of SETs at 64
/// clients showed the second lookup at ~3% of a node's user time).
type KeyTable = hashbrown::HashMap<StoredKey, KeyEntry, rustc_hash::FxBuildHasher>;

/// The entry of `key` in `keys`, created (Valid, timestamp zero) when there is none. The
/// key is copied into the table only then: a lookup never allocates.
fn entry_or_default<'a>(keys: &'a mut KeyTable, key: &[u8]) -> &'a mut KeyEntry {
    keys.entry_ref(key).or_default()
}

/// Where a key's chunk lives: FNV-1a, so every replica splits keys alike.
fn key_bucket(key: &[u8], buckets_total: u32) -> u32 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key {
        hash ^= *byte as u64;
        hash = hash.wrapping_mul(0x0000_0100_0000_01B3);
    }
    (hash % buckets_total as u64) as u32
}

pub struct Hermes {
    config: HermesConfig,
    view: View,
    keys: KeyTable,
    /// Keys with an in-flight update or stalled requests: the only ones a tick must visit.
    /// Ordered, so ticks visit keys in the same order on every run of a seed.
    watched: BTreeSet<Key>,
    rng_state: u64,
    stats: HermesStats,
    scratch_keys: Vec<Key>,
    /// Set once this replica leaves a view. Its data may be stale from then on, so it serves
    /// again only after the membership re-adds it and it has copied the data afresh as a
    /// shadow (§3.4 Recovery).
    retired: bool,
    /// Recovering and no view including this replica has been installed yet: it ignores
    /// every message (epochs before its join carry nothing it may acknowledge).
    awaiting_join: bool,
    /// Copying the data (§3.4 Recovery): takes part in writes, serves no client.
    shadow: Option<Shadow>,
    /// Added to every cid this incarnation picks. A rejoined replica has forgotten the
    /// timestamps it created before; an update of its old incarnation may still sit,
    /// uncommitted, at some replica that the donor did not hear from. Without the offset the
    /// new incarnation could issue the same `[version, cid]` for another value, and a VAL
    /// for one would validate the other (found by the join swarm, seed 19).
    cid_offset: u32,
    /// §2.4: a replica serves reads only while its membership lease is valid. `Unlimited`
    /// when no membership service drives this replica (the simulator's scripted membership,
    /// tests), which then guarantees removal only after the replica is gone.
    lease: Lease,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lease {
    Unlimited,
    Until(Option<Time>),
}

impl Lease {
    fn is_valid(self, now: Time) -> bool {
        match self {
            Lease::Unlimited => true,
            Lease::Until(until) => until.is_some_and(|until| now < until),
        }
    }
}

impl Hermes {
    pub fn new(config: HermesConfig) -> Hermes {
        assert!(config.optimizations.virtual_ids_per_node >= 1, "virtual_ids_per_node must be at least 1");
        assert!(config.message_loss_timeout > Time::ZERO, "message_loss_timeout must be positive");
        Hermes {
            view: config.initial_view,
            rng_state: config.seed ^ 0x9E37_79B9_7F4A_7C15,
            keys: KeyTable::default(),
            watched: BTreeSet::new(),
            stats: HermesStats::default(),
            scratch_keys: Vec::new(),
            retired: false,
            awaiting_join: config.recovering,
            shadow: None,
            cid_offset: 0,
            lease: Lease::Unlimited,
            config,
        }
    }

    pub fn view(&self) -> View {
        self.view
    }

    pub fn stats(&self) -> HermesStats {
        self.stats
    }

    /// A replica serves clients only while it is live in its view (it holds a lease) and
    /// has all the data (it is not a shadow).
    pub fn is_operational(&self) -> bool {
        self.participates() && self.shadow.is_none()
    }

    /// Takes part in the protocol (as a full replica or a shadow): live in its view.
    fn participates(&self) -> bool {
        !self.retired && !self.awaiting_join && self.view.live.contains(self.config.me)
    }

    /// A shadow replica still copying the data (§3.4 Recovery).
    pub fn is_shadow(&self) -> bool {
        self.participates() && self.shadow.is_some()
    }

    /// The key's protocol state, timestamp and local value (for tests, INFO and tracing).
    pub fn key_state(&self, key: &[u8]) -> Option<(KeyState, Timestamp, Option<&Value>)> {
        self.keys.get(key).map(|entry| (entry.state, entry.ts, entry.value.as_ref()))
    }

    /// Every key holding a value here, in no particular order. Every replica sees every
    /// key's INV, so this is every key written anywhere up to what this replica has seen.
    pub fn keys(&self) -> impl Iterator<Item = Key> + '_ {
        self.keys.iter().filter(|(_, entry)| entry.value.is_some()).map(|(key, _)| Key::copy_from_slice(key))
    }

    /// Number of keys holding a value (deleted keys keep their timestamp but do not count).
    pub fn key_count(&self) -> usize {
        self.keys.values().filter(|entry| entry.value.is_some()).count()
    }

    /// A key's durable state, in the form a donor copies it (persistence logs it, and a
    /// restart restores it through [`Hermes::restore`]). `None`: the key was never written.
    pub fn export_key(&self, key: &[u8]) -> Option<ChunkEntry> {
        let entry = self.keys.get(key).filter(|entry| entry.ts != Timestamp::ZERO)?;
        Some(ChunkEntry {
            key: Key::copy_from_slice(key),
            ts: entry.ts,
            value: entry.value.clone(),
            rmw: entry.rmw_flag,
            valid: entry.state == KeyState::Valid,
        })
    }

    /// Every key with a timestamp (deleted ones too: their timestamp must survive, or a
    /// later write could reuse a lower one).
    pub fn written_keys(&self) -> Vec<Key> {
        let written = self.keys.iter().filter(|(_, entry)| entry.ts != Timestamp::ZERO);
        written.map(|(key, _)| Key::copy_from_slice(key)).collect()
    }

    /// Load keys from this replica's own disk before it starts: per key the highest
    /// timestamp wins, as when a shadow merges a chunk. A key not known Valid comes back
    /// Invalid, so a read of it replays the write first (§3.2): the update may not have
    /// committed, and a replay either commits it everywhere or meets a newer one.
    pub fn restore(&mut self, entries: impl IntoIterator<Item = ChunkEntry>) {
        for restored in entries {
            let entry = entry_or_default(&mut self.keys, &restored.key);
            if restored.ts > entry.ts {
                entry.ts = restored.ts;
                entry.value = restored.value;
                entry.rmw_flag = restored.rmw;
                entry.state = if restored.valid { KeyState::Valid } else { KeyState::Invalid };
            } else if restored.ts == entry.ts && restored.valid {
                entry.state = KeyState::Valid;
            }
        }
    }

    fn peers(&self) -> NodeSet {
        self.view.live.without(self.config.me)
    }

    /// Whether a deliberately broken variant is on; always false without the feature, so
    /// the checks compile away in the server.
    #[inline(always)]
    fn has_bug(&self, _bug: Bug) -> bool {
        #[cfg(feature = "broken-variants")]
        return self.config.bug == Some(_bug);
        #[cfg(not(feature = "broken-variants"))]
        false
    }

    /// §2.4: local reads (and the local half of RMWs) need a valid lease.
    fn leased(&self, now: Time) -> bool {
        self.lease.is_valid(now) || self.has_bug(Bug::IgnoreLease)
    }

    /// O2: a fresh (virtual) coordinator id for a new update's timestamp.
    fn next_cid(&mut self) -> u32 {
        let per_node = self.config.optimizations.virtual_ids_per_node;
        let base = self.config.me.0 as u32 * per_node + self.cid_offset;
        if per_node == 1 {
            return base;
        }
        // xorshift64*: tiny, deterministic, good enough to spread ids.
        self.rng_state ^= self.rng_state >> 12;
        self.rng_state ^= self.rng_state << 25;
        self.rng_state ^= self.rng_state >> 27;
        let random = self.rng_state.wrapping_mul(0x2545_F491_4F6C_DD1D);
        base + (random % per_node as u64) as u32
    }

    fn watch(&mut self, key: &Key) {
        let quiet = self.keys.get(&key[..]).is_none_or(KeyEntry::is_quiet);
        if quiet {
            self.watched.remove(key);
        } else if !self.watched.contains(key) {
            self.watched.insert(key.clone());
        }
    }

    // ---------------------------------------------------------------- client requests

    /// Serve stalled requests of `key` in arrival order, as far as the key's state allows.
    fn drain(&mut self, now: Time, key: &Key, out: &mut Outbox<Message>) {
        let read_in_any_state = self.has_bug(Bug::ReadInAnyState);
        let leased = self.leased(now);
        loop {
            let entry = self.keys.get_mut(&key[..]).expect("drained key exists");
            let Some(front) = entry.waiting.front() else { break };
            if !servable_now(entry, &front.command, leased, read_in_any_state) {
                break;
            }
            match &front.command {
                Command::Read { .. } => {
                    let waiter = entry.waiting.pop_front().expect("front exists");
                    out.reply(waiter.request, Outcome::Value(entry.value.clone()));
                    self.stats.reads_local += 1;
                }
                Command::Write { value, .. } => {
                    let value = value.clone();
                    let waiter = entry.waiting.pop_front().expect("front exists");
                    let client = UpdateClient {
                        request: waiter.request,
                        reply: Outcome::Written,
                        command: waiter.command,
                    };
                    self.start_client_update(now, key, value, false, client, out);
                }
                Command::Rmw { op, .. } => {
                    let effect = op.apply(entry.value.as_ref());
                    let waiter = entry.waiting.pop_front().expect("front exists");
                    match effect.write {
                        // The RMW decided not to write: it is a read of a Valid key, which is
                        // linearizable locally.
                        None => out.reply(waiter.request, effect.outcome),
                        Some(value) => {
                            let client = UpdateClient {
                                request: waiter.request,
                                reply: effect.outcome,
                                command: waiter.command,
                            };
                            self.start_client_update(now, key, value, true, client, out);
                        }
                    }
                }
            }
        }
        let entry = self.keys.get_mut(&key[..]).expect("drained key exists");
        if !entry.waiting.is_empty() && entry.state == KeyState::Invalid && entry.replay_at.is_none() {
            entry.replay_at = Some(now + self.config.message_loss_timeout);
        }
        if entry.waiting.is_empty() {
            entry.replay_at = None;
        }
    }

    /// The common case, with one key lookup where the queue-and-drain path takes six to
    /// nine (the profile at 64 clients had a tenth of a node's CPU in key lookups): a leased
    /// read of a Valid key with nothing queued before it (§3.1: served locally), a read of
    /// a key never written (no entry, so read-only misses do not grow the map), and a
    /// write to a Valid key with nothing queued or in flight (§3.2: C TS + C INV at once).
    /// Anything else hands the command back for the queue, which keeps per-key FIFO order.
    fn serve_without_queueing(
        &mut self,
        now: Time,
        request: ClientRequestId,
        key: &Key,
        command: Command,
        out: &mut Outbox<Message>,
    ) -> Option<Command> {
        let read_in_any_state = self.has_bug(Bug::ReadInAnyState);
        let Some(entry) = self.keys.get_mut(&key[..]) else {
            if matches!(command, Command::Read { .. }) {
                out.reply(request, Outcome::Value(None));
                self.stats.reads_local += 1;
                return None;
            }
            return Some(command);
        };
        let leased = true; // The caller checked.
        if !entry.waiting.is_empty()
            || entry.replay_at.is_some()
            || !servable_now(entry, &command, leased, read_in_any_state)
        {
            return Some(command);
        }
        match &command {
            Command::Read { .. } => {
                out.reply(request, Outcome::Value(entry.value.clone()));
                self.stats.reads_local += 1;
                None
            }
            Command::Write { value, .. } => {
                let value = value.clone();
                let client = UpdateClient { request, reply: Outcome::Written, command };
                self.start_client_update(now, key, value, false, client, out);
                self.watch(key);
                None
            }
            // An RMW's effect is computed in one place, `drain`.
            Command::Rmw { .. } => Some(command),
        }
    }

    /// C TS + C INV (§3.2): a new timestamp (version +2 for writes, +1 for RMWs, §3.6), apply
    /// locally, broadcast INV.
    fn start_client_update(
        &mut self,
        now: Time,
        key: &Key,
        value: Option<Value>,
        rmw: bool,
        client: UpdateClient,
        out: &mut Outbox<Message>,
    ) {
        let cid = self.next_cid();
        let entry = self.keys.get_mut(&key[..]).expect("updated key exists");
        debug_assert_eq!(entry.state, KeyState::Valid);
        let version_step = if rmw { 1 } else { 2 };
        let ts = Timestamp::new(entry.ts.version + version_step, cid);
        entry.ts = ts;
        entry.value = value.clone();
        entry.rmw_flag = rmw;
        entry.state = KeyState::Write;
        self.begin_update(now, key, UpdateKind::Client, ts, value, rmw, Some(client), out);
    }

    /// Write replay (§3.2, §3.4): re-run C INV..C VAL with the key's stored timestamp and value,
    /// so the original coordinator's write is linearized where it belongs.
    fn start_replay(&mut self, now: Time, key: &Key, out: &mut Outbox<Message>) {
        let entry = self.keys.get_mut(&key[..]).expect("replayed key exists");
        debug_assert_eq!(entry.state, KeyState::Invalid);
        debug_assert!(entry.update.is_none());
        entry.state = KeyState::Replay;
        entry.replay_at = None;
        let (ts, value, rmw) = (entry.ts, entry.value.clone(), entry.rmw_flag);
        self.stats.replays_started += 1;
        self.begin_update(now, key, UpdateKind::Replay, ts, value, rmw, None, out);
    }

    #[allow(clippy::too_many_arguments)]
    fn begin_update(
        &mut self,
        now: Time,
        key: &Key,
        kind: UpdateKind,
        ts: Timestamp,
        value: Option<Value>,
        rmw: bool,
        client: Option<UpdateClient>,
        out: &mut Outbox<Message>,
    ) {
        let epoch = self.view.epoch;
        let inv = Message::Inv { epoch, key: key.clone(), ts, value: value.clone(), rmw, superseded: false };
        out.broadcast(self.peers(), inv);
        let entry = self.keys.get_mut(&key[..]).expect("updated key exists");
        entry.update = Some(Box::new(Update {
            kind,
            ts,
            value,
            rmw,
            acks: NodeSet::single(self.config.me),
            superseded: false,
            client,
            retransmit_at: now + self.config.message_loss_timeout,
        }));
        self.stats.updates_started += 1;
        self.complete_if_acknowledged(now, key, out);
    }

    /// C ACK + C VAL (§3.2): once every live replica acknowledged, the update is committed.
    ///
    /// A committed update whose timestamp is superseded (we hold a higher one: Trans; or an
    /// ACK said its sender did) is never validated: no VAL, and the key stays Invalid until
    /// the higher update's own INV/VAL arrives. Validating it would let a replica that has not
    /// yet seen the higher write base an RMW on the superseded value, with an RMW timestamp
    /// above that write (docs/protocols/hermes.md). This subsumes O1.
    fn complete_if_acknowledged(&mut self, now: Time, key: &Key, out: &mut Outbox<Message>) {
        let live = self.view.live;
        let majority = live.len() / 2 + 1;
        let commit_on_majority = self.has_bug(Bug::CommitOnMajority);
        let validate_superseded = self.has_bug(Bug::ValidateSuperseded);
        let entry = self.keys.get_mut(&key[..]).expect("completed key exists");
        let Some(update) = &entry.update else { return };
        let acknowledged =
            update.acks.is_superset_of(live) || (commit_on_majority && update.acks.len() >= majority);
        if !acknowledged {
            return;
        }
        let update = entry.update.take().expect("update exists");
        debug_assert!(entry.ts >= update.ts);
        let superseded_here = entry.ts > update.ts;
        let superseded_elsewhere = update.superseded && !validate_superseded;
        match entry.state {
            KeyState::Write | KeyState::Replay if superseded_elsewhere => entry.state = KeyState::Invalid,
            KeyState::Write | KeyState::Replay => {
                debug_assert!(!superseded_here);
                entry.state = KeyState::Valid;
            }
            KeyState::Trans => entry.state = KeyState::Invalid,
            // Trans, then the VAL of the superseding update: already Valid.
            KeyState::Valid => debug_assert!(superseded_here),
            KeyState::Invalid => unreachable!("an Invalid key has no update in flight"),
        }
        if entry.state == KeyState::Invalid && !entry.waiting.is_empty() {
            entry.replay_at = Some(now + self.config.message_loss_timeout);
        }
        // O3: followers validate on the ACK set for writes; RMWs still need a VAL (see on_ack).
        let o3_covers = self.config.optimizations.broadcast_acks && !update.rmw;
        let superseded = (superseded_here && !validate_superseded) || superseded_elsewhere;
        if !o3_covers && !superseded {
            let val = Message::Val { epoch: self.view.epoch, key: key.clone(), ts: update.ts };
            out.broadcast(live.without(self.config.me), val);
        }
        if let Some(client) = update.client {
            out.reply(client.request, client.reply);
        }
        self.stats.updates_committed += 1;
        self.drain(now, key, out);
    }

    // ---------------------------------------------------------------- peer messages

    #[allow(clippy::too_many_arguments)]
    fn on_inv(
        &mut self,
        now: Time,
        from: NodeId,
        key: Key,
        ts: Timestamp,
        value: Option<Value>,
        rmw: bool,
        sender_superseded: bool,
        out: &mut Outbox<Message>,
    ) {
        let epoch = self.view.epoch;
        let rmw_never_aborts = self.has_bug(Bug::RmwNeverAborts);
        let entry = entry_or_default(&mut self.keys, &key);

        // F RMW-ACK (§3.6): an RMW older than what we hold is refused; we answer with our own
        // state as an INV, which aborts the RMW at its coordinator.
        if rmw && ts < entry.ts && !rmw_never_aborts {
            let (ts, value, rmw) = (entry.ts, entry.value.clone(), entry.rmw_flag);
            let reply = Message::Inv { epoch, key, ts, value, rmw, superseded: false };
            out.send(from, reply);
            return;
        }
        // A coordinator does not acknowledge another replica's replay of its own in-flight
        // RMW. Otherwise the replay could commit the RMW while the coordinator, seeing a later
        // higher-timestamp INV, aborts and retries it: the RMW would take effect twice. While
        // the coordinator lives, only it commits its RMW; the replayer completes once the
        // coordinator's VAL arrives (or once a view change removes the coordinator).
        let own_pending_rmw = entry
            .update
            .as_ref()
            .is_some_and(|update| update.kind == UpdateKind::Client && update.rmw && update.ts == ts);
        if own_pending_rmw && !rmw_never_aborts {
            return;
        }
        if ts > entry.ts {
            self.apply_higher_inv(now, &key, ts, value, rmw);
        }
        // F ACK: acknowledged whatever the timestamp comparison said, telling the coordinator
        // whether we already hold something higher.
        let superseded = self.keys[&key[..]].ts > ts && !self.has_bug(Bug::ValidateSuperseded);
        let ack = Message::Ack { epoch, key: key.clone(), ts, superseded };
        if superseded {
            // The sender cannot validate `ts`; hand it the higher update, so a replayer whose
            // only source of that update crashed can adopt and replay it (as F RMW-ACK does).
            let entry = &self.keys[&key[..]];
            let newer = Message::Inv {
                epoch,
                key: key.clone(),
                ts: entry.ts,
                value: entry.value.clone(),
                rmw: entry.rmw_flag,
                superseded: false,
            };
            out.send(from, newer);
        }
        if self.config.optimizations.broadcast_acks {
            let me = self.config.me;
            self.note_holders(&key, ts, NodeSet::single(from), sender_superseded);
            self.note_holders(&key, ts, NodeSet::single(me), superseded);
            out.broadcast(self.peers(), ack);
            self.validate_if_all_hold(now, &key, out);
        } else {
            out.send(from, ack);
        }
        self.drain(now, &key, out);
    }

    /// F INV: a higher timestamp invalidates the key (Trans if we coordinate an update of it)
    /// and, for a pending RMW, aborts it (C RMW-abort, §3.6).
    fn apply_higher_inv(&mut self, now: Time, key: &Key, ts: Timestamp, value: Option<Value>, rmw: bool) {
        let rmw_never_aborts = self.has_bug(Bug::RmwNeverAborts);
        let mlt = self.config.message_loss_timeout;
        let entry = self.keys.get_mut(&key[..]).expect("entry exists");
        let aborts = entry.update.as_ref().is_some_and(|update| update.rmw) && !rmw_never_aborts;
        if aborts {
            let update = entry.update.take().expect("update exists");
            if let Some(client) = update.client {
                // Retried from the front once the key is Valid again: the client never sees
                // the abort, only a later, non-conflicting execution.
                entry.waiting.push_front(Waiter {
                    request: client.request,
                    command: client.command,
                    sent_before: true,
                });
                self.stats.rmw_aborts += 1;
            }
        }
        entry.ts = ts;
        entry.value = value;
        entry.rmw_flag = rmw;
        entry.state = if entry.update.is_some() { KeyState::Trans } else { KeyState::Invalid };
        if !entry.waiting.is_empty() {
            entry.replay_at = Some(now + mlt);
        }
    }

    fn on_ack(
        &mut self,
        now: Time,
        from: NodeId,
        key: Key,
        ts: Timestamp,
        superseded: bool,
        out: &mut Outbox<Message>,
    ) {
        if self.config.optimizations.broadcast_acks {
            // An overheard ACK may overtake the INV of a key we have never seen: remember it,
            // or the INV alone could never validate the key (O3 sends no VAL).
            entry_or_default(&mut self.keys, &key);
            self.note_holders(&key, ts, NodeSet::single(from), superseded);
            self.validate_if_all_hold(now, &key, out);
        }
        let Some(entry) = self.keys.get_mut(&key[..]) else { return };
        if let Some(update) = &mut entry.update {
            if update.ts == ts {
                update.acks.insert(from);
                update.superseded |= superseded;
                self.complete_if_acknowledged(now, &key, out);
            }
        }
    }

    fn on_val(&mut self, now: Time, key: Key, ts: Timestamp, out: &mut Outbox<Message>) {
        let ignore_ts = self.has_bug(Bug::ValIgnoresTimestamp);
        let Some(entry) = self.keys.get_mut(&key[..]) else { return };
        if ts != entry.ts && !ignore_ts {
            return; // F VAL: only the current timestamp validates.
        }
        match entry.state {
            KeyState::Invalid | KeyState::Trans => entry.state = KeyState::Valid,
            KeyState::Write | KeyState::Replay if ts == entry.ts => {
                // Another replica replayed our update and committed it: it is done. (Never a
                // client RMW: we refuse to acknowledge replays of those.)
                entry.state = KeyState::Valid;
                let update = entry.update.take().expect("Write/Replay has an update");
                debug_assert!(!(update.rmw && update.kind == UpdateKind::Client) || ignore_ts);
                if let Some(client) = update.client {
                    out.reply(client.request, client.reply);
                }
                self.stats.updates_committed += 1;
            }
            KeyState::Valid | KeyState::Write | KeyState::Replay => {}
        }
        self.drain(now, &key, out);
    }

    /// O3: remember who held `ts` when it spoke (or that someone held more).
    fn note_holders(&mut self, key: &Key, ts: Timestamp, holders: NodeSet, superseded: bool) {
        let entry = self.keys.get_mut(&key[..]).expect("entry exists");
        if ts < entry.ts {
            return;
        }
        let fresh = HoldersSeen { ts, holders: NodeSet::EMPTY, superseded: false };
        let mut seen = match entry.acks_seen {
            Some(seen) if seen.ts > ts => return,
            Some(seen) if seen.ts == ts => seen,
            _ => fresh,
        };
        if superseded {
            seen.superseded = true;
        } else {
            seen.holders = NodeSet::from_bits(seen.holders.bits() | holders.bits());
        }
        entry.acks_seen = Some(seen);
    }

    /// O3: a follower validates a write once every live replica is known to have held its
    /// timestamp, none of them anything higher. Only for writes: an RMW may still abort at
    /// its coordinator, so followers wait for its VAL.
    fn validate_if_all_hold(&mut self, now: Time, key: &Key, out: &mut Outbox<Message>) {
        let live = self.view.live;
        let entry = self.keys.get_mut(&key[..]).expect("entry exists");
        let Some(seen) = entry.acks_seen else { return };
        let invalid = matches!(entry.state, KeyState::Invalid | KeyState::Trans);
        let all_hold = seen.holders.is_superset_of(live) && !seen.superseded;
        if invalid && seen.ts == entry.ts && !entry.rmw_flag && all_hold {
            entry.state = KeyState::Valid;
            self.drain(now, key, out);
        }
    }

    // ---------------------------------------------------------------- time and views

    fn retransmit_or_replay(&mut self, now: Time, key: &Key, out: &mut Outbox<Message>) {
        let (epoch, peers) = (self.view.epoch, self.peers());
        let mlt = self.config.message_loss_timeout;
        let entry = self.keys.get_mut(&key[..]).expect("watched key exists");
        let holds_higher = entry.update.as_ref().is_some_and(|update| entry.ts > update.ts);
        if let Some(update) = &mut entry.update {
            if now >= update.retransmit_at {
                // §3.4: INV or ACK suspected lost: re-send to whoever has not acknowledged.
                let missing = NodeSet::from_bits(peers.bits() & !update.acks.bits());
                let inv = Message::Inv {
                    epoch,
                    key: key.clone(),
                    ts: update.ts,
                    value: update.value.clone(),
                    rmw: update.rmw,
                    superseded: holds_higher,
                };
                out.broadcast(missing, inv);
                update.retransmit_at = now + mlt;
                self.stats.inv_retransmits += 1;
            }
            return;
        }
        let replay_due = entry.replay_at.is_some_and(|at| now >= at);
        if entry.state == KeyState::Invalid && !entry.waiting.is_empty() && replay_due {
            self.start_replay(now, key, out);
        }
    }

    /// Leaving the view: stop serving. Stalled requests were never executed. In-flight updates
    /// may still be completed by a replay elsewhere, so their outcome is unknown.
    fn leave_service(&mut self) -> Vec<(ClientRequestId, Outcome)> {
        self.retired = true;
        let mut replies = Vec::new();
        for key in std::mem::take(&mut self.watched) {
            let entry = self.keys.get_mut(&key[..]).expect("watched key exists");
            for waiter in entry.waiting.drain(..) {
                let outcome = if waiter.sent_before {
                    CommandError::OutcomeUnknown
                } else {
                    CommandError::Unavailable("not in the current view")
                };
                replies.push((waiter.request, Outcome::Error(outcome)));
            }
            if let Some(client) = entry.update.take().and_then(|update| update.client) {
                replies.push((client.request, Outcome::Error(CommandError::OutcomeUnknown)));
            }
            entry.state = KeyState::Invalid;
        }
        replies
    }

    // ---------------------------------------------------------------- recovery (§3.4)

    /// The membership (re-)added this replica: start over as a shadow. Whatever it held is
    /// dropped: it may be stale, and every value it needs comes from a donor or a new INV.
    fn become_shadow(&mut self, now: Time, out: &mut Outbox<Message>) {
        debug_assert!(self.watched.is_empty() || !self.retired || self.has_bug(Bug::ShadowServes));
        self.keys.clear();
        self.watched.clear();
        self.retired = false;
        // The join view's epoch is unique to this incarnation: every node's ids for it lie in
        // one block of `COUNT_MAX * per_node` cids that no other incarnation uses.
        let block = NodeId::COUNT_MAX as u32 * self.config.optimizations.virtual_ids_per_node;
        let incarnations = u32::MAX / block;
        self.cid_offset = (self.view.epoch.0 % incarnations as u64) as u32 * block;
        self.awaiting_join = false;
        self.shadow = Some(Shadow { buckets_total: None, received: Vec::new(), asked: None, donor_turn: 0 });
        self.request_chunk_if_due(now, out);
    }

    /// The donor for the next request: the configured one while it is live, else the live
    /// replicas in turn (rotating whenever a request times out).
    fn pick_donor(&self, turn: usize) -> Option<NodeId> {
        let others: Vec<NodeId> = self.peers().iter().collect();
        if others.is_empty() {
            return None;
        }
        match self.config.donor {
            Some(donor) if turn == 0 && others.contains(&donor) => Some(donor),
            _ => Some(others[turn % others.len()]),
        }
    }

    fn request_chunk_if_due(&mut self, now: Time, out: &mut Outbox<Message>) {
        let timeout = Time::from_nanos(self.config.message_loss_timeout.as_nanos() * 4);
        let epoch = self.view.epoch;
        let Some(shadow) = &self.shadow else { return };
        if shadow.asked.is_some_and(|(_, at)| now < at) {
            return;
        }
        let timed_out = shadow.asked.is_some();
        let turn = shadow.donor_turn + timed_out as usize;
        let (bucket, buckets_total) = match shadow.buckets_total {
            None => (0, 0),
            Some(total) => {
                let missing = shadow.received.iter().position(|got| !got);
                (missing.expect("a shadow with every chunk has finished") as u32, total)
            }
        };
        let donor = self.pick_donor(turn);
        let shadow = self.shadow.as_mut().expect("shadow exists");
        shadow.donor_turn = turn;
        shadow.asked = Some((bucket, now + timeout));
        // Alone in the view there is no one to copy from: wait. (The membership never
        // leaves a shadow alone: the replicas that hold the data stay until it has caught
        // up, see `Replica::is_caught_up`.)
        if let Some(donor) = donor {
            out.send(donor, Message::ChunkRequest { epoch, bucket, buckets_total });
        }
    }

    /// Serve one chunk to a shadow. Only a replica with all the data answers, and only in the
    /// shadow's epoch (checked by the caller): every write committed in an earlier epoch was
    /// acknowledged here before this replica moved on, so the chunk holds it.
    fn on_chunk_request(&mut self, from: NodeId, bucket: u32, buckets_total: u32, out: &mut Outbox<Message>) {
        if !self.is_operational() {
            return;
        }
        let buckets_total = if buckets_total == 0 { self.buckets_for_copy() } else { buckets_total };
        if bucket >= buckets_total {
            return; // Malformed: a shadow never asks past the end.
        }
        let entries: Vec<ChunkEntry> = self
            .keys
            .iter()
            .filter(|(key, entry)| entry.ts != Timestamp::ZERO && key_bucket(key, buckets_total) == bucket)
            .map(|(key, entry)| ChunkEntry {
                key: Key::copy_from_slice(key),
                ts: entry.ts,
                value: entry.value.clone(),
                rmw: entry.rmw_flag,
                valid: entry.state == KeyState::Valid,
            })
            .collect();
        self.stats.chunks_served += 1;
        out.send(from, Message::Chunk { epoch: self.view.epoch, bucket, buckets_total, entries });
    }

    /// How many chunks to split the keys into: about `chunk_bytes_target` each.
    fn buckets_for_copy(&self) -> u32 {
        let bytes: usize = self
            .keys
            .iter()
            .map(|(key, entry)| key.len() + entry.value.as_ref().map_or(0, |value| value.len()) + 32)
            .sum();
        let target = self.config.chunk_bytes_target.max(1);
        u32::try_from(bytes / target + 1).unwrap_or(u32::MAX).min(1 << 16)
    }

    /// A chunk arrived: keep, per key, whichever is newer of the copy and what INVs brought.
    fn on_chunk(
        &mut self,
        now: Time,
        bucket: u32,
        buckets_total: u32,
        entries: Vec<ChunkEntry>,
        out: &mut Outbox<Message>,
    ) {
        let overwrite = self.has_bug(Bug::ChunkOverwritesNewer);
        let Some(shadow) = &mut self.shadow else { return };
        if buckets_total == 0 || buckets_total > 1 << 16 || bucket >= buckets_total {
            return;
        }
        match shadow.buckets_total {
            None => {
                shadow.buckets_total = Some(buckets_total);
                shadow.received = vec![false; buckets_total as usize];
            }
            Some(total) if total != buckets_total => return, // An answer to another split.
            Some(_) => {}
        }
        if std::mem::replace(&mut shadow.received[bucket as usize], true) {
            return; // A duplicate.
        }
        shadow.asked = None;
        self.stats.chunks_received += 1;
        self.stats.keys_copied += entries.len() as u64;
        for copied in entries {
            let entry = entry_or_default(&mut self.keys, &copied.key);
            let newer = copied.ts > entry.ts || overwrite;
            if newer {
                entry.ts = copied.ts;
                entry.value = copied.value;
                entry.rmw_flag = copied.rmw;
                entry.acks_seen = None;
                entry.state = if copied.valid { KeyState::Valid } else { KeyState::Invalid };
            } else if copied.ts == entry.ts && copied.valid && entry.state == KeyState::Invalid {
                // We saw this update's INV but not its VAL; the donor saw it committed.
                entry.state = KeyState::Valid;
            }
        }
        let done = self.shadow.as_ref().is_some_and(|shadow| shadow.received.iter().all(|got| *got));
        if done {
            self.finish_recovery();
        } else {
            self.request_chunk_if_due(now, out);
        }
    }

    fn finish_recovery(&mut self) {
        self.shadow = None;
        self.stats.recoveries_completed += 1;
    }
}

impl Replica for Hermes {
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
        if !self.is_operational() && !self.has_bug(Bug::ShadowServes) {
            let reason = if self.awaiting_join || self.is_shadow() {
                "joining: copying the data from live replicas"
            } else {
                "not in the current view"
            };
            out.reply(request, Outcome::Error(CommandError::Unavailable(reason)));
            return;
        }
        let key = command.key().clone();
        // Without a lease the request waits (drain checks the lease) rather than failing:
        // under overload a renewal can come late, and a late answer beats an error. If the
        // replica is removed instead, leaving the view answers every waiter.
        let leased = self.leased(now);
        let command = if leased {
            match self.serve_without_queueing(now, request, &key, command, out) {
                Some(queued) => queued,
                None => return,
            }
        } else {
            command
        };
        let entry = entry_or_default(&mut self.keys, &key);
        let stalls = !entry.waiting.is_empty() || entry.state != KeyState::Valid;
        if stalls && !command.is_update() {
            self.stats.reads_stalled += 1;
        }
        // Per-key FIFO: a request never overtakes one stalled before it on the same key.
        entry.waiting.push_back(Waiter { request, command, sent_before: false });
        self.drain(now, &key, out);
        self.watch(&key);
    }

    fn on_message(&mut self, now: Time, from: NodeId, message: Message, out: &mut Outbox<Message>) {
        if message.epoch() != self.view.epoch || !self.participates() {
            self.stats.messages_dropped_epoch += 1;
            return;
        }
        let key = match message {
            Message::ChunkRequest { bucket, buckets_total, .. } => {
                self.on_chunk_request(from, bucket, buckets_total, out);
                return;
            }
            Message::Chunk { bucket, buckets_total, entries, .. } => {
                self.on_chunk(now, bucket, buckets_total, entries, out);
                return;
            }
            Message::Inv { key, ts, value, rmw, superseded, .. } => {
                self.on_inv(now, from, key.clone(), ts, value, rmw, superseded, out);
                key
            }
            Message::Ack { key, ts, superseded, .. } => {
                self.on_ack(now, from, key.clone(), ts, superseded, out);
                key
            }
            Message::Val { key, ts, .. } => {
                self.on_val(now, key.clone(), ts, out);
                key
            }
        };
        self.watch(&key);
    }

    fn on_tick(&mut self, now: Time, out: &mut Outbox<Message>) {
        if !self.participates() {
            return;
        }
        self.request_chunk_if_due(now, out);
        let mut keys = std::mem::take(&mut self.scratch_keys);
        keys.extend(self.watched.iter().cloned());
        for key in keys.drain(..) {
            self.retransmit_or_replay(now, &key, out);
            self.watch(&key);
        }
        self.scratch_keys = keys;
    }

    fn installed_view(&self) -> Option<View> {
        Some(self.view)
    }

    fn event_counts(&self, report: &mut dyn FnMut(&'static str, u64)) {
        let stats = &self.stats;
        report("hermes.replays", stats.replays_started);
        report("hermes.rmw_aborts", stats.rmw_aborts);
        report("hermes.inv_retransmits", stats.inv_retransmits);
        report("hermes.reads_stalled", stats.reads_stalled);
        report("hermes.keys_copied", stats.keys_copied);
        report("hermes.recoveries", stats.recoveries_completed);
    }

    fn is_caught_up(&self) -> bool {
        self.participates() && self.shadow.is_none()
    }

    fn on_lease(&mut self, now: Time, valid_until: Option<Time>, out: &mut Outbox<Message>) {
        let was_valid = self.leased(now);
        self.lease = Lease::Until(valid_until);
        if !was_valid && self.leased(now) {
            // Requests stalled only for want of a lease can go now.
            let mut keys = std::mem::take(&mut self.scratch_keys);
            keys.extend(self.watched.iter().cloned());
            for key in keys.drain(..) {
                self.drain(now, &key, out);
                self.watch(&key);
            }
            self.scratch_keys = keys;
        }
    }

    fn on_view(&mut self, now: Time, view: View, out: &mut Outbox<Message>) {
        if view.epoch <= self.view.epoch {
            return; // Views only move forward; a late m-update is stale.
        }
        self.view = view;
        self.stats.views_installed += 1;
        let listed = view.live.contains(self.config.me);
        if listed && (self.awaiting_join || self.retired) {
            self.become_shadow(now, out);
            return;
        }
        if !self.participates() {
            if !self.retired {
                for (request, outcome) in self.leave_service() {
                    out.reply(request, outcome);
                }
            }
            return;
        }
        if let Some(shadow) = &mut self.shadow {
            // The donor may have left: ask again in the new epoch, at once.
            if let Some((bucket, _)) = shadow.asked {
                shadow.asked = Some((bucket, now));
            }
            self.request_chunk_if_due(now, out);
        }
        let keep_acks = self.has_bug(Bug::KeepAcksOnViewChange);
        let me = self.config.me;
        let mut keys = std::mem::take(&mut self.scratch_keys);
        keys.extend(self.watched.iter().cloned());
        for key in keys.drain(..) {
            let entry = self.keys.get_mut(&key[..]).expect("watched key exists");
            entry.acks_seen = None;
            if let Some(update) = &mut entry.update {
                // §3.4 and §3.6 (C RMW-replay): ACKs gathered in an older epoch do not count;
                // re-collect them from the new live set, starting now.
                if !keep_acks {
                    update.acks = NodeSet::single(me);
                    update.superseded = false;
                }
                update.retransmit_at = now;
            } else if entry.state == KeyState::Invalid && !entry.waiting.is_empty() {
                // Likely invalidated by a replica that just left: replay without waiting.
                entry.replay_at = Some(now);
            }
            self.retransmit_or_replay(now, &key, out);
            self.complete_if_acknowledged(now, &key, out);
            self.watch(&key);
        }
        self.scratch_keys = keys;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys up to 24 bytes are stored inline, longer ones on the heap: both are found by
    /// their bytes, and a second call finds the entry the first created.
    #[test]
    fn stored_keys_inline_and_spilled_are_found() {
        let mut keys = KeyTable::default();
        let short = Key::from_static(b"user:1");
        let long = Key::from(vec![b'k'; 200]);
        entry_or_default(&mut keys, &short).ts = Timestamp { version: 1, cid: 0 };
        entry_or_default(&mut keys, &long).ts = Timestamp { version: 2, cid: 0 };
        assert_eq!(keys.len(), 2);
        assert_eq!(entry_or_default(&mut keys, &short).ts.version, 1);
        assert_eq!(entry_or_default(&mut keys, &long).ts.version, 2);
        assert_eq!(keys.len(), 2);
        let spilled: Vec<bool> =
            keys.keys().filter(|key| key.len() == 200).map(|key| key.spilled()).collect();
        assert_eq!(spilled, [true]);
    }
}
