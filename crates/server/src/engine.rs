//! The event loop: ONE task owns the protocol core (sans-I/O) and is the only code that calls
//! it. Client commands arrive over a bounded channel, peer messages over the transport's
//! inbound channel, and a 1 ms tick drives retransmissions and replays.
//!
//! A **turn** handles one event, then everything else already waiting (bounded, so a flood on
//! one channel cannot starve the other or the tick), then performs the turn's outbox: every
//! peer message of the turn goes to [`Transport::send_turn`] at once (one batch frame per
//! peer, broadcasts encoded once: Hermes §4.2 opportunistic batching) and every reply
//! completes its client's oneshot.
//!
//! On shutdown the loop first **leaves** the view (with the membership service) so that the
//! others go on without waiting for failure detection, answers new requests `not serving`,
//! lets in-flight ones complete meanwhile, makes the turn's state durable, and only then
//! fails what is still pending (docs/operations.md, "Stopping a node").

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use chorus_core::codec::WireMessage;
use chorus_core::{
    ClientRequestId, Command, CommandError, Key, NodeId, NodeSet, Outbox, Outcome, Replica, Time, View,
};
use chorus_craq::Craq;
use chorus_hermes::Hermes;
use chorus_membership::{PersistRecord, Wire, WithMembership};
use chorus_net::Transport;
use chorus_raftlog::disk::DurableRaftLog;
use chorus_raftlog::shard::{ShardCore, ShardMessage};
use chorus_zab::Zab;
use rustc_hash::FxHashMap;
use tokio::sync::{mpsc, oneshot, watch};

use crate::persistence::{Persistence, PersistenceInfo};

/// What the server needs from a protocol core beyond [`Replica`].
pub trait ServedReplica: Replica + Send + 'static
where
    Self::Message: WireMessage + Send + 'static,
{
    fn protocol_name(&self) -> &'static str;
    fn current_view(&self) -> View;
    fn operational(&self) -> bool;
    fn keys_with_values(&self) -> usize;
    /// Every key holding a value at this replica (FLUSHALL enumerates them).
    fn keys(&self) -> Vec<Key>;
    /// Protocol counters for INFO and metrics, as (name, value).
    fn counters(&self) -> Vec<(&'static str, u64)>;
    /// A cheap fingerprint of the core's role beyond its view (the chain's order, group epoch
    /// and coordinator phase): when it changes, [`Self::describe_role`] is logged.
    fn role_fingerprint(&self) -> u64 {
        0
    }
    fn describe_role(&self) -> String {
        String::new()
    }
    /// Messages that take the transport's priority lane (membership heartbeats and acks,
    /// which keep leases alive and must not queue behind client traffic).
    fn is_priority(_message: &Self::Message) -> bool {
        false
    }
    /// State that must be durable before this turn's messages leave (the membership
    /// service's Raft log and vote). Most cores have none.
    fn take_durable_records(&mut self) -> Vec<PersistRecord> {
        Vec::new()
    }
    /// Make the core's own durable state stable (raftlog's two-level log). Called once per
    /// turn, before the turn's messages are sent and, if [`Self::REPLIES_AFTER_PERSIST`],
    /// before its replies complete. An error stops the node.
    fn persist_turn(&mut self) -> Result<(), String> {
        Ok(())
    }
    /// Replies wait for [`Self::persist_turn`]: an acknowledged write must be on disk.
    const REPLIES_AFTER_PERSIST: bool = false;
    /// Whether [`Self::persist_turn`] will sync this turn: only then do the messages
    /// [`Replica::leaves_before_sync`] lets go first leave apart from the rest (otherwise
    /// they would cost a second write for nothing).
    fn turn_needs_sync(&self) -> bool {
        false
    }
    /// A clean stop: make everything durable, whatever `appendfsync` says (before the
    /// append-only file's clean-stop marker, which says so).
    fn persist_all(&mut self) -> Result<(), String> {
        self.persist_turn()
    }
    /// Start a thread to sync on, which calls `wake` whenever a sync returns. Returns from
    /// what average sync time on the loop should hand its syncs over (raftlog with its
    /// circular log in an msync'd file); `None`: the core syncs in [`Self::persist_turn`].
    fn start_sync_thread(&mut self, _wake: Box<dyn Fn() + Send>) -> Result<Option<Duration>, String> {
        Ok(None)
    }
    /// With a sync thread: [`Self::persist_turn`] with the sync handed to the thread. Returns
    /// the sync the turn's messages that wait for one must wait for (`None`: none is under
    /// way, they leave now).
    fn persist_turn_elsewhere(&mut self) -> Result<Option<u64>, String> {
        self.persist_turn().map(|()| None)
    }
    /// With a sync thread: the sync it finished since the last call, if any, and how long
    /// it took.
    fn poll_synced(&mut self) -> Result<Option<(u64, Duration)>, String> {
        Ok(None)
    }
    /// Reads may run on the connection's task between the loop's turns ([`InlineLoop`]):
    /// the core answers a read at once or queues it, and sends nothing for it (Hermes). A core
    /// whose reads send messages (ZAB's sync, CRAQ's tail query) would send them a frame per
    /// read instead of a batch per turn.
    const READS_INLINE: bool = false;
    /// Run `requests` as one atomic transaction (MULTI/EXEC), replying to each. Only
    /// raftlog can; the others refuse every command rather than claim atomicity.
    fn on_transaction(
        &mut self,
        _now: Time,
        requests: Vec<(ClientRequestId, Command)>,
        out: &mut Outbox<Self::Message>,
    ) {
        for (request, _) in requests {
            out.reply(
                request,
                Outcome::Error(CommandError::Unavailable("transactions need protocol raftlog")),
            );
        }
    }
    /// A write on `key` has just completed at this replica: where it stands, for WAIT. By
    /// default it is held by every live member of the view, since the write completed only
    /// once each of them acknowledged it (Hermes; CRAQ and the chain store, whose tail
    /// acknowledges a write after every member before it applied it).
    fn write_mark(&self, _key: &Key) -> WriteMark {
        WriteMark::Members(self.current_view().live)
    }
    /// The replicas known to hold position `index` of ordered log `log`, for cores whose
    /// [`Self::write_mark`] is a [`WriteMark::Log`].
    fn log_holders(&self, _log: u32, _index: u64) -> NodeSet {
        NodeSet::single(self.id())
    }
    /// Persistence (crates/server/src/persistence): the keys whose durable state `message`
    /// carries or answers for. Cores that persist no keys have none.
    fn message_keys(_message: &Self::Message, _keys: &mut Vec<Key>) {}
    /// The durable state of `keys` as one record (`None`: nothing to log).
    fn durable_record(&self, _keys: &[Key]) -> Option<Vec<u8>> {
        None
    }
    /// Whether `message` may leave only once the turn's records are on disk (`appendfsync
    /// always`). A turn whose messages and replies all may go first sends them, then syncs
    /// (docs/decisions.md 10, "Which syncs a write waits for").
    fn must_persist_before(_message: &Self::Message) -> bool {
        true
    }
    /// Whether this turn's client replies may leave only once its records are on disk.
    fn replies_must_persist_first(&self) -> bool {
        true
    }
    /// Every key with durable state, for a snapshot.
    fn durable_keys(&self) -> Vec<Key> {
        Vec::new()
    }
    /// Records of state that is not keyed (ZAB's history, epoch and commit point) changed
    /// this turn, logged with the turn's keys before its messages leave.
    fn take_log_records(&mut self) -> Vec<Vec<u8>> {
        Vec::new()
    }
    /// A snapshot's first records, before its keys' (see `persistence::Durable`).
    fn snapshot_header(&self) -> Vec<Vec<u8>> {
        Vec::new()
    }
    /// The snapshot's record of `keys`; by default the keys' durable record.
    fn snapshot_record(&self, keys: &[Key]) -> Option<Vec<u8>> {
        self.durable_record(keys)
    }
    /// Whether this replica holds all the data (not a joiner still copying, not removed).
    fn holds_all_data(&self) -> bool {
        self.is_caught_up()
    }
    /// Start leaving the view for a planned stop. Cores without a membership service have no
    /// view to leave.
    fn leave(&mut self, _now: Time, _out: &mut Outbox<Self::Message>) {}
    /// Whether this replica is out of the view (or never had one to leave).
    fn has_left(&self) -> bool {
        true
    }
    /// Run `command` at most once for an external client session (`SESSION client seq ...`).
    /// Only raftlog keeps sessions; the others refuse rather than run it unprotected.
    fn on_session_command(
        &mut self,
        _now: Time,
        request: ClientRequestId,
        _client: u64,
        _seq: u64,
        _command: Command,
        out: &mut Outbox<Self::Message>,
    ) {
        out.reply(
            request,
            Outcome::Error(CommandError::Unavailable("at-most-once sessions need protocol raftlog")),
        );
    }
}

impl<P> ServedReplica for WithMembership<P>
where
    P: ServedReplica,
    P::Message: WireMessage + Send + 'static,
{
    fn protocol_name(&self) -> &'static str {
        self.protocol().protocol_name()
    }
    fn current_view(&self) -> View {
        self.protocol().current_view()
    }
    /// Serving needs a lease too: right after start there is none until the first
    /// heartbeats are acknowledged, and INFO's `chorus_operational` says so.
    fn operational(&self) -> bool {
        self.protocol().operational() && self.membership().lease_until().is_some()
    }
    fn keys_with_values(&self) -> usize {
        self.protocol().keys_with_values()
    }
    fn keys(&self) -> Vec<Key> {
        self.protocol().keys()
    }
    fn counters(&self) -> Vec<(&'static str, u64)> {
        let mut counters = self.protocol().counters();
        let membership = self.membership();
        counters.push(("membership_epoch", membership.view().epoch.0));
        counters.push(("membership_raft_leader", membership.is_raft_leader() as u64));
        let stats = membership.stats();
        counters.push(("membership_lease_lapses", stats.lease_lapses));
        counters.push(("membership_heartbeats_acknowledged", stats.heartbeats_acknowledged));
        counters.push(("membership_heartbeats_slow", stats.heartbeats_slow));
        counters.push(("membership_heartbeat_round_trip_max_us", stats.heartbeat_round_trip_max.as_micros()));
        counters
    }
    /// The membership service's messages (heartbeats, acks, Raft) are few and small, and a
    /// late acknowledgement costs a lease.
    fn is_priority(message: &Self::Message) -> bool {
        matches!(message, Wire::Membership(_))
    }
    fn take_durable_records(&mut self) -> Vec<PersistRecord> {
        self.take_persist_records()
    }
    fn persist_turn(&mut self) -> Result<(), String> {
        self.protocol_mut().persist_turn()
    }
    fn persist_all(&mut self) -> Result<(), String> {
        self.protocol_mut().persist_all()
    }
    fn turn_needs_sync(&self) -> bool {
        self.protocol().turn_needs_sync()
    }
    /// The lease is checked by the protocol core's own read path (Hermes' `leased`).
    const READS_INLINE: bool = P::READS_INLINE;
    fn message_keys(message: &Self::Message, keys: &mut Vec<Key>) {
        if let Wire::Protocol(message) = message {
            P::message_keys(message, keys);
        }
    }
    fn durable_record(&self, keys: &[Key]) -> Option<Vec<u8>> {
        self.protocol().durable_record(keys)
    }
    /// The membership's own records have their own log, synced before anything leaves.
    fn must_persist_before(message: &Self::Message) -> bool {
        match message {
            Wire::Protocol(message) => P::must_persist_before(message),
            Wire::Membership(_) => false,
        }
    }
    fn replies_must_persist_first(&self) -> bool {
        self.protocol().replies_must_persist_first()
    }
    fn durable_keys(&self) -> Vec<Key> {
        self.protocol().durable_keys()
    }
    fn take_log_records(&mut self) -> Vec<Vec<u8>> {
        self.protocol_mut().take_log_records()
    }
    fn snapshot_header(&self) -> Vec<Vec<u8>> {
        self.protocol().snapshot_header()
    }
    fn snapshot_record(&self, keys: &[Key]) -> Option<Vec<u8>> {
        self.protocol().snapshot_record(keys)
    }
    fn holds_all_data(&self) -> bool {
        self.protocol().holds_all_data()
    }
    fn write_mark(&self, key: &Key) -> WriteMark {
        self.protocol().write_mark(key)
    }
    fn log_holders(&self, log: u32, index: u64) -> NodeSet {
        self.protocol().log_holders(log, index)
    }
    fn role_fingerprint(&self) -> u64 {
        self.protocol().role_fingerprint()
    }
    fn describe_role(&self) -> String {
        self.protocol().describe_role()
    }
    fn leave(&mut self, now: Time, out: &mut Outbox<Self::Message>) {
        WithMembership::leave(self, now, out);
    }
    fn has_left(&self) -> bool {
        self.membership().has_left()
    }
}

/// A peer refused this node's Raft messages: it came back without its data.
fn raftlog_refusal(core: &chorus_raftlog::RaftLog) -> Result<(), String> {
    match core.refused_by() {
        None => Ok(()),
        Some(peer) => Err(format!(
            "refused by node {}: this node came back as the Raft member it was, without that \
             member's data (a lost or replaced data directory); it must be replaced: start it \
             with an empty data_dir and --join",
            peer.0
        )),
    }
}

impl ServedReplica for DurableRaftLog {
    fn protocol_name(&self) -> &'static str {
        "raftlog"
    }
    fn current_view(&self) -> View {
        self.core().view()
    }
    fn operational(&self) -> bool {
        true // Raft itself decides which replica can commit.
    }
    fn keys_with_values(&self) -> usize {
        self.core().key_count()
    }
    fn keys(&self) -> Vec<Key> {
        self.core().keys().cloned().collect()
    }
    /// A clean stop syncs even what a commit-only turn left written but unsynced.
    fn persist_all(&mut self) -> Result<(), String> {
        self.persist_and_sync().map_err(|error| error.to_string())?;
        raftlog_refusal(self.core())
    }
    fn persist_turn(&mut self) -> Result<(), String> {
        self.persist().map_err(|error| error.to_string())?;
        raftlog_refusal(self.core())
    }
    fn start_sync_thread(&mut self, wake: Box<dyn Fn() + Send>) -> Result<Option<Duration>, String> {
        DurableRaftLog::start_sync_thread(self, wake).map_err(|error| error.to_string())
    }
    fn persist_turn_elsewhere(&mut self) -> Result<Option<u64>, String> {
        let wait = self.persist_elsewhere().map_err(|error| error.to_string())?;
        raftlog_refusal(self.core())?;
        Ok(wait)
    }
    fn poll_synced(&mut self) -> Result<Option<(u64, Duration)>, String> {
        DurableRaftLog::poll_synced(self).map_err(|error| error.to_string())
    }
    const REPLIES_AFTER_PERSIST: bool = true;
    fn turn_needs_sync(&self) -> bool {
        DurableRaftLog::turn_needs_sync(self)
    }
    /// The write's entry is at or below its log's applied index when its origin answers.
    fn write_mark(&self, key: &Key) -> WriteMark {
        let core = self.core();
        let log = core.log_of(key);
        WriteMark::Log { log: log as u32, index: core.applied_index(log) }
    }
    fn log_holders(&self, log: u32, index: u64) -> NodeSet {
        let core = self.core();
        if log as usize >= core.logs() {
            return NodeSet::EMPTY;
        }
        core.replicas_holding(log as usize, index)
    }
    fn on_transaction(
        &mut self,
        now: Time,
        requests: Vec<(ClientRequestId, Command)>,
        out: &mut Outbox<chorus_raftlog::Message>,
    ) {
        self.core_mut().on_transaction(now, requests, out);
    }
    fn on_session_command(
        &mut self,
        now: Time,
        request: ClientRequestId,
        client: u64,
        seq: u64,
        command: Command,
        out: &mut Outbox<chorus_raftlog::Message>,
    ) {
        self.core_mut().on_session_command(now, request, client, seq, command, out);
    }
    fn counters(&self) -> Vec<(&'static str, u64)> {
        let s = self.core().stats();
        let d = self.disk_stats();
        let logs_led = (0..self.core().logs()).filter(|log| self.core().is_leader(*log)).count();
        vec![
            ("boot", self.boot()),
            ("logs_led", logs_led as u64),
            ("snapshots_taken", s.snapshots_taken),
            ("snapshots_installed", s.snapshots_installed),
            ("snapshot_chunks_sent", s.snapshot_chunks_sent),
            ("snapshot_transfers_completed", s.snapshot_transfers_completed),
            ("snapshot_transfers_failed", s.snapshot_transfers_failed),
            ("txns_too_large", s.txns_too_large),
            ("disk_records_appended", d.records_appended),
            ("disk_flushes", d.flushes),
            ("disk_drains", d.drains),
            ("syncs_on_thread", self.syncs_on_thread()),
            ("disk_bytes_drained", d.bytes_drained),
            ("disk_checkpoints", d.checkpoints),
            ("disk_records_erased_after_tear", d.records_erased_after_tear),
            ("entries_proposed", s.entries_proposed),
            ("commands_proposed", s.commands_proposed),
            ("proposals_executed", s.proposals_executed),
            ("proposals_duplicate", s.proposals_duplicate),
            ("proposals_expired", s.proposals_expired),
            ("session_records", self.core().session_records() as u64),
            ("batches_forwarded", s.batches_forwarded),
            ("batches_resent", s.batches_resent),
            ("read_rounds", s.read_rounds),
            ("txns_started", s.txns_started),
            ("txns_answered", s.txns_answered),
            ("txn_lock_retries", s.txn_lock_retries),
            ("txn_step_records", self.core().step_records() as u64),
            ("txn_forgets_applied", s.txn_forgets_applied),
            ("txn_drivers_stopped", s.txn_drivers_stopped),
            ("txns_outcome_unknown", s.txns_outcome_unknown),
            ("commands_blocked", s.commands_blocked),
            ("gangs_started", s.gangs_started),
            ("gangs_executed", s.gangs_executed),
            ("gangs_answered", s.gangs_answered),
            ("gangs_refused", s.gangs_refused),
            ("gangs_rescued", s.gangs_rescued),
            ("entries_executed_early", s.entries_executed_early),
            ("executions_committed", s.executions_committed),
            ("executions_rolled_back", s.executions_rolled_back),
            ("incarnation", self.core().config().incarnation),
            ("voter_everywhere", self.core().is_voter_everywhere() as u64),
            ("members_replaced", s.members_replaced),
            ("conf_changes_applied", s.conf_changes_applied),
            ("peers_refused", s.peers_refused),
            ("reads_served", s.reads_served),
        ]
    }
}

/// One shard of a raftlog node (`raftlog_shards > 1`): the shard's core, its messages tagged
/// with the shard. A write's mark names its log globally, `local * shards + shard`, so WAIT
/// can be split between the shards by the log number.
impl ServedReplica for ShardCore {
    fn protocol_name(&self) -> &'static str {
        "raftlog"
    }
    fn current_view(&self) -> View {
        self.inner().current_view()
    }
    fn operational(&self) -> bool {
        true
    }
    fn keys_with_values(&self) -> usize {
        self.inner().keys_with_values()
    }
    fn keys(&self) -> Vec<Key> {
        ServedReplica::keys(self.inner())
    }
    fn persist_turn(&mut self) -> Result<(), String> {
        self.inner_mut().persist_turn()
    }
    fn persist_all(&mut self) -> Result<(), String> {
        self.inner_mut().persist_all()
    }
    fn start_sync_thread(&mut self, wake: Box<dyn Fn() + Send>) -> Result<Option<Duration>, String> {
        ServedReplica::start_sync_thread(self.inner_mut(), wake)
    }
    fn persist_turn_elsewhere(&mut self) -> Result<Option<u64>, String> {
        ServedReplica::persist_turn_elsewhere(self.inner_mut())
    }
    fn poll_synced(&mut self) -> Result<Option<(u64, Duration)>, String> {
        ServedReplica::poll_synced(self.inner_mut())
    }
    const REPLIES_AFTER_PERSIST: bool = true;
    fn turn_needs_sync(&self) -> bool {
        self.inner().turn_needs_sync()
    }
    fn write_mark(&self, key: &Key) -> WriteMark {
        match self.inner().write_mark(key) {
            WriteMark::Log { log, index } => WriteMark::Log { log: self.global_log(log), index },
            members => members,
        }
    }
    fn log_holders(&self, log: u32, index: u64) -> NodeSet {
        let shards = self.inner().core().config().shards as u32;
        if log % shards != self.shard() as u32 {
            return NodeSet::EMPTY;
        }
        self.inner().log_holders(log / shards, index)
    }
    fn on_transaction(
        &mut self,
        now: Time,
        requests: Vec<(ClientRequestId, Command)>,
        out: &mut Outbox<ShardMessage>,
    ) {
        self.with_outbox(out, |core, scratch| core.core_mut().on_transaction(now, requests, scratch));
    }
    fn on_session_command(
        &mut self,
        now: Time,
        request: ClientRequestId,
        client: u64,
        seq: u64,
        command: Command,
        out: &mut Outbox<ShardMessage>,
    ) {
        self.with_outbox(out, |core, scratch| {
            core.core_mut().on_session_command(now, request, client, seq, command, scratch)
        });
    }
    fn counters(&self) -> Vec<(&'static str, u64)> {
        let mut counters = self.inner().counters();
        counters.push(("shards", 1));
        counters.push(("shard_messages_misrouted", self.messages_misrouted));
        counters
    }
}

impl ServedReplica for Hermes {
    /// A read is local (Valid key, under the lease) or waits in the key's queue.
    const READS_INLINE: bool = true;
    fn protocol_name(&self) -> &'static str {
        "hermes"
    }
    fn current_view(&self) -> View {
        self.view()
    }
    fn operational(&self) -> bool {
        self.is_operational()
    }
    fn keys_with_values(&self) -> usize {
        self.key_count()
    }
    fn keys(&self) -> Vec<Key> {
        Hermes::keys(self).collect()
    }
    fn message_keys(message: &chorus_hermes::Message, keys: &mut Vec<Key>) {
        crate::persistence::hermes::message_keys(message, keys);
    }
    fn durable_record(&self, keys: &[Key]) -> Option<Vec<u8>> {
        crate::persistence::hermes::record(self, keys)
    }
    fn must_persist_before(message: &chorus_hermes::Message) -> bool {
        crate::persistence::hermes::must_persist_before(message)
    }
    /// With other live replicas every write this replica answers went out in INVs, in a turn
    /// that synced it first; alone, it commits (and answers) in the turn it writes.
    fn replies_must_persist_first(&self) -> bool {
        self.view().live.len() <= 1
    }
    fn durable_keys(&self) -> Vec<Key> {
        self.written_keys()
    }
    fn counters(&self) -> Vec<(&'static str, u64)> {
        let s = self.stats();
        vec![
            ("reads_local", s.reads_local),
            ("reads_stalled", s.reads_stalled),
            ("updates_started", s.updates_started),
            ("updates_committed", s.updates_committed),
            ("rmw_aborts", s.rmw_aborts),
            ("replays_started", s.replays_started),
            ("inv_retransmits", s.inv_retransmits),
            ("messages_dropped_epoch", s.messages_dropped_epoch),
            ("views_installed", s.views_installed),
            ("shadow", self.is_shadow() as u64),
            ("chunks_received", s.chunks_received),
            ("keys_copied", s.keys_copied),
            ("chunks_served", s.chunks_served),
            ("recoveries_completed", s.recoveries_completed),
        ]
    }
}

impl ServedReplica for Craq {
    fn protocol_name(&self) -> &'static str {
        "craq"
    }
    fn current_view(&self) -> View {
        self.view()
    }
    fn operational(&self) -> bool {
        self.is_operational()
    }
    fn keys_with_values(&self) -> usize {
        self.key_count()
    }
    fn keys(&self) -> Vec<Key> {
        Craq::keys(self).cloned().collect()
    }
    fn message_keys(message: &chorus_craq::Message, keys: &mut Vec<Key>) {
        crate::persistence::craq::message_keys(message, keys);
    }
    fn durable_record(&self, keys: &[Key]) -> Option<Vec<u8>> {
        crate::persistence::craq::record(self, keys)
    }
    fn durable_keys(&self) -> Vec<Key> {
        self.written_keys()
    }
    fn counters(&self) -> Vec<(&'static str, u64)> {
        let s = self.stats();
        vec![
            ("reads_local", s.reads_local),
            ("reads_queried", s.reads_queried),
            ("versions_assigned", s.versions_assigned),
            ("versions_committed", s.versions_committed),
            ("write_retransmits", s.write_retransmits),
            ("forward_retransmits", s.forward_retransmits),
            ("messages_dropped_epoch", s.messages_dropped_epoch),
            ("views_installed", s.views_installed),
            ("joining", self.is_joining() as u64),
            ("chunks_received", s.chunks_received),
            ("keys_copied", s.keys_copied),
            ("chunks_served", s.chunks_served),
            ("chunks_refused", s.chunks_refused),
            ("copies_restarted", s.copies_restarted),
            ("recoveries_completed", s.recoveries_completed),
        ]
    }
}

impl ServedReplica for Zab {
    fn protocol_name(&self) -> &'static str {
        match self.read_mode() {
            chorus_zab::ReadMode::Sync => "zab",
            chorus_zab::ReadMode::Local => "zab-local",
        }
    }
    fn current_view(&self) -> View {
        self.view()
    }
    fn operational(&self) -> bool {
        self.serves_clients()
    }
    fn keys_with_values(&self) -> usize {
        self.key_count()
    }
    fn keys(&self) -> Vec<Key> {
        Zab::keys(self).cloned().collect()
    }
    fn take_log_records(&mut self) -> Vec<Vec<u8>> {
        self.take_durable().iter().map(crate::persistence::encode).collect()
    }
    fn snapshot_header(&self) -> Vec<Vec<u8>> {
        Zab::snapshot_header(self).iter().map(crate::persistence::encode).collect()
    }
    fn durable_keys(&self) -> Vec<Key> {
        ServedReplica::keys(self)
    }
    fn snapshot_record(&self, keys: &[Key]) -> Option<Vec<u8>> {
        Zab::snapshot_record(self, keys).map(|record| crate::persistence::encode(&record))
    }
    /// One history: the write's entry is at or below the applied index when its origin answers.
    fn write_mark(&self, _key: &Key) -> WriteMark {
        WriteMark::Log { log: 0, index: self.applied_index() }
    }
    fn log_holders(&self, _log: u32, index: u64) -> NodeSet {
        self.replicas_holding(index)
    }
    fn counters(&self) -> Vec<(&'static str, u64)> {
        let s = self.stats();
        vec![
            ("reads_local", s.reads_local),
            ("reads_synced", s.reads_synced),
            ("proposals", s.proposals),
            ("entries_applied", s.entries_applied),
            ("recoveries", s.recoveries),
            ("retransmits", s.retransmits),
            ("messages_dropped_epoch", s.messages_dropped_epoch),
            ("views_installed", s.views_installed),
            ("complete", self.is_complete() as u64),
            ("snapshot_chunks_served", s.snapshot_chunks_served),
            ("snapshot_chunks_received", s.snapshot_chunks_received),
            ("snapshots_installed", s.snapshots_installed),
        ]
    }
}

impl<M: chorus_chain::Member + Send + 'static> ServedReplica for chorus_chain::Chain<M> {
    fn protocol_name(&self) -> &'static str {
        "chain"
    }
    fn current_view(&self) -> View {
        self.view()
    }
    fn operational(&self) -> bool {
        self.is_operational()
    }
    fn keys_with_values(&self) -> usize {
        self.stored_keys().len()
    }
    fn role_fingerprint(&self) -> u64 {
        let state = match self.coordinator_state() {
            None => 0u64,
            Some(state) => 1 + u64::from(state.as_bytes()[0]) + ((state.len() as u64) << 8),
        };
        let order = self.chain_order().iter().fold(0u64, |acc, node| (acc << 8) | (u64::from(node.0) + 1));
        let epoch = self.group_epoch().unwrap_or(u64::MAX);
        epoch.rotate_left(17)
            ^ order.rotate_left(41)
            ^ state
            ^ (u64::from(self.is_awaiting_configuration()) << 63)
    }
    fn describe_role(&self) -> String {
        format!(
            "chain order {:?}, group epoch {:?}, coordinator {}, awaiting configuration {}",
            self.chain_order(),
            self.group_epoch(),
            self.coordinator_state().unwrap_or("no"),
            self.is_awaiting_configuration()
        )
    }
    /// Every replica's region holds the whole database: list it from there.
    fn keys(&self) -> Vec<Key> {
        self.stored_keys()
    }
    /// The chain's durable state (view, order, linked) when it changed: the region file is
    /// the log and the database, this record says where it stands (docs/decisions.md 13).
    fn take_log_records(&mut self) -> Vec<Vec<u8>> {
        self.take_state_record().into_iter().collect()
    }
    fn snapshot_header(&self) -> Vec<Vec<u8>> {
        vec![self.durable_state().encode()]
    }
    /// The region's flush for every gFLUSH of the turn, once, before the turn's messages
    /// (forwards, acknowledgements) leave (`appendfsync always`; see `lib.rs`, `sync_policy`).
    fn persist_turn(&mut self) -> Result<(), String> {
        self.sync_turn(false)
    }
    fn persist_all(&mut self) -> Result<(), String> {
        self.sync_turn(true)
    }
    fn counters(&self) -> Vec<(&'static str, u64)> {
        let s = self.stats();
        vec![
            ("reads_tail", s.reads_tail),
            ("reads_locked", s.reads_locked),
            ("reads_parked", s.reads_parked),
            ("batches", s.batches),
            ("records_appended", s.records_appended),
            ("updates_executed", s.updates_executed),
            ("recoveries", s.recoveries),
            ("lock_failures", s.lock_failures),
            ("forward_retransmits", s.forward_retransmits),
            ("views_installed", s.views_installed),
            ("configurations", s.configurations),
            ("joins_linked", s.joins_linked),
            ("copy_bytes_sent", s.copy_bytes_sent),
            ("copies_received", s.copies_received),
            ("last_join_pause_us", s.last_join_pause_us),
            ("catch_ups", s.catch_ups),
            ("restarts_rejoined", s.restarts_rejoined),
            ("awaiting_configuration", self.is_awaiting_configuration() as u64),
        ]
    }
}

/// Where a completed write stands, to tell WAIT which replicas are known to hold it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteMark {
    /// These replicas held it when it completed.
    Members(NodeSet),
    /// Position `index` of ordered log `log` (raftlog's Raft logs, ZAB's history): held by
    /// the replicas whose log reached it, which the core knows.
    Log { log: u32, index: u64 },
}

/// Every write one connection made, as marks (a prefix of a log is implied by its last
/// position, so one per log suffices).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WriteMarks {
    /// The replicas that held every [`WriteMark::Members`] write (`None`: no such write).
    members: Option<NodeSet>,
    /// The highest position written per log.
    logs: Vec<(u32, u64)>,
}

impl WriteMarks {
    pub fn record(&mut self, mark: WriteMark) {
        match mark {
            WriteMark::Members(held) => {
                let both =
                    self.members.map_or(held, |members| NodeSet::from_bits(members.bits() & held.bits()));
                self.members = Some(both);
            }
            WriteMark::Log { log, index } => match self.logs.iter_mut().find(|(known, _)| *known == log) {
                Some((_, highest)) => *highest = (*highest).max(index),
                None => self.logs.push((log, index)),
            },
        }
    }
}

/// A completed command: its outcome and, for a write that took effect, where it stands.
#[derive(Clone, Debug)]
pub struct Done {
    pub outcome: Outcome,
    pub mark: Option<WriteMark>,
}

impl Done {
    fn failed(error: CommandError) -> Done {
        Done { outcome: Outcome::Error(error), mark: None }
    }
}

/// A snapshot of the core for INFO, DBSIZE and metrics.
#[derive(Clone, Debug)]
pub struct EngineStatus {
    pub me: NodeId,
    pub protocol: &'static str,
    pub view: View,
    pub operational: bool,
    pub keys: usize,
    pub pending_requests: usize,
    /// Requests answered by the request deadline rather than by the core.
    pub requests_past_deadline: u64,
    /// Commands run by connection tasks between the loop's turns ([`InlineLoop`]).
    pub requests_inline: u64,
    pub counters: Vec<(&'static str, u64)>,
}

pub enum EngineRequest {
    Command {
        command: Command,
        reply: oneshot::Sender<Done>,
    },
    /// One command of an external at-most-once session ([`ServedReplica::on_session_command`]).
    SessionCommand {
        client: u64,
        seq: u64,
        command: Command,
        reply: oneshot::Sender<Done>,
    },
    Status {
        reply: oneshot::Sender<EngineStatus>,
    },
    /// MULTI/EXEC: the commands run as one transaction; `replies[i]` answers `commands[i]`.
    Transaction {
        commands: Vec<Command>,
        replies: Vec<oneshot::Sender<Done>>,
    },
    /// Every key this node knows to hold a value (for FLUSHALL).
    Keys {
        reply: oneshot::Sender<Vec<Key>>,
    },
    /// BGSAVE (`save`: start one) or INFO persistence / LASTSAVE (`save` false). `None`:
    /// the node persists nothing.
    Persistence {
        save: bool,
        reply: oneshot::Sender<Option<Result<PersistenceInfo, String>>>,
    },
    /// WAITAOF: sync the append-only file now, and say what a write held by a replica means.
    SyncAof {
        reply: oneshot::Sender<AofDurability>,
    },
    /// WAIT: answer how many other replicas hold every write in `marks`, once at least
    /// `replicas` do or at `deadline` (`None`: no deadline), whichever comes first.
    Wait {
        marks: WriteMarks,
        replicas: usize,
        deadline: Option<Instant>,
        reply: oneshot::Sender<usize>,
    },
}

/// How connections reach the event loop, or, with several (raftlog shards, `event_loops`),
/// the event loop that owns each key (`chorus_raftlog::shard_of`). Cheap to clone.
#[derive(Clone)]
pub struct EngineHandle {
    shards: Arc<[mpsc::Sender<EngineRequest>]>,
    /// Per shard, the event loop's state when that loop runs as a task of the connections'
    /// own thread ([`InlineLoop`]); empty otherwise.
    inline: Arc<[InlineSlot]>,
    /// Per shard, how to wake that loop after queueing a request, when it sleeps in a poll of
    /// its own (crate::reactor) rather than on the channel.
    wake: Arc<[WakeSlot]>,
}

/// Where a reactor publishes its waker.
pub type WakeSlot = OnceLock<Arc<mio::Waker>>;

/// Where an event loop publishes its state for the inline path. Weak: the loop alone keeps
/// its state (and its transport) alive, so stopping it drops them as before.
pub type InlineSlot = OnceLock<Weak<dyn InlineLoop>>;

/// A read run by the connection's task through the event loop's own code, instead of being
/// queued to the loop and woken back (issue 23: the hand-off connection -> event loop ->
/// connection). Only possible while the loop is between turns, which on one thread is whenever
/// another task runs: the loop holds its state's lock for a whole turn and never across an
/// `.await`. The read goes through exactly what the loop does with a received request
/// ([`EventLoop::on_request`]), so what the core decides (a Hermes read is local only for a
/// Valid key under a lease, and otherwise waits in the key's queue) is unchanged: the request
/// simply arrives between two turns. Updates keep going through the loop's turns, where their
/// messages are batched (docs/benchmarks.md measures both).
pub trait InlineLoop: Send + Sync {
    /// Submit `command` now; `Err` gives it back when the loop is in a turn (another thread)
    /// or runs such commands only in its own turns.
    fn try_submit(&self, command: Command) -> Result<oneshot::Receiver<Done>, Command>;
}

/// A request submitted to a node that is stopping, or whose event loop is gone: not executed.
pub const SHUTTING_DOWN: CommandError = CommandError::Unavailable("the node is shutting down");
/// A read the core did not answer within the request deadline (an update gets
/// [`CommandError::OutcomeUnknown`]).
const PAST_DEADLINE: CommandError =
    CommandError::Unavailable("no answer within the request deadline; not executed, try another replica");
/// A MULTI/EXEC whose keys live on different shards (event loops) of a raftlog node: no one
/// core can run it atomically, so it runs nowhere (as Redis Cluster's CROSSSLOT).
pub const CROSS_SHARD: CommandError = CommandError::Unavailable(
    "the transaction's keys belong to different raftlog shards (raftlog_shards > 1); run it with \
     raftlog_shards = 1 or keep its keys on one shard",
);

/// What a dropped reply means: the event loop stopped before the command completed. A read
/// has no effect either way; an update may already have been sent to the others.
fn lost(is_update: bool) -> Done {
    Done::failed(if is_update { CommandError::OutcomeUnknown } else { SHUTTING_DOWN })
}

impl EngineHandle {
    /// Queue `request` for event loop `shard` and wake it if it polls for itself. `Err`: the
    /// loop is gone.
    async fn send(&self, shard: usize, request: EngineRequest) -> Result<(), ()> {
        self.shards[shard].send(request).await.map_err(|_| ())?;
        if let Some(waker) = self.wake[shard].get() {
            let _ = waker.wake();
        }
        Ok(())
    }

    /// Where reactors publish their wakers.
    pub fn wake_slots(&self) -> Arc<[WakeSlot]> {
        self.wake.clone()
    }

    /// Submit a command; the returned receiver completes once it has (at once for a local
    /// read run inline).
    async fn submit(&self, command: Command) -> oneshot::Receiver<Done> {
        let shard = chorus_raftlog::shard_of(command.key(), self.shards.len());
        let command = match self.inline[shard].get().and_then(Weak::upgrade) {
            Some(state) => match state.try_submit(command) {
                Ok(rx) => return rx,
                Err(command) => command,
            },
            None => command,
        };
        let (reply, rx) = oneshot::channel();
        // If the loop is gone, `reply` is dropped with the request and `rx` reports it.
        let _ = self.send(shard, EngineRequest::Command { command, reply }).await;
        rx
    }

    /// Where the event loops publish their state for the inline path (not the handle
    /// itself: a loop holding a request sender would never see its channel close).
    pub fn inline_slots(&self) -> Arc<[InlineSlot]> {
        self.inline.clone()
    }

    pub async fn execute(&self, command: Command) -> Done {
        let is_update = command.is_update();
        self.submit(command).await.await.unwrap_or_else(|_| lost(is_update))
    }

    /// Submit all commands before waiting for any: they run concurrently (MGET, MSET, DEL).
    pub async fn execute_all(&self, commands: Vec<Command>) -> Vec<Done> {
        let mut pending = Vec::with_capacity(commands.len());
        for command in commands {
            let is_update = command.is_update();
            pending.push((self.submit(command).await, is_update));
        }
        let mut done = Vec::with_capacity(pending.len());
        for (rx, is_update) in pending {
            done.push(rx.await.unwrap_or_else(|_| lost(is_update)));
        }
        done
    }

    /// Run `commands` as one transaction; the outcomes in order.
    pub async fn execute_transaction(&self, commands: Vec<Command>) -> Vec<Done> {
        let Some(first) = commands.first() else { return Vec::new() };
        let shards = self.shards.len();
        let shard = chorus_raftlog::shard_of(first.key(), shards);
        if commands.iter().any(|command| chorus_raftlog::shard_of(command.key(), shards) != shard) {
            return commands.iter().map(|_| Done::failed(CROSS_SHARD)).collect();
        }
        let (replies, receivers): (Vec<_>, Vec<_>) = commands.iter().map(|_| oneshot::channel()).unzip();
        let _ = self.send(shard, EngineRequest::Transaction { commands, replies }).await;
        let mut done = Vec::with_capacity(receivers.len());
        for rx in receivers {
            done.push(rx.await.unwrap_or_else(|_| lost(true)));
        }
        done
    }

    /// Run `command` at most once for session `client`, request number `seq`.
    pub async fn execute_in_session(&self, client: u64, seq: u64, command: Command) -> Done {
        let (reply, rx) = oneshot::channel();
        let is_update = command.is_update();
        let shard = chorus_raftlog::shard_of(command.key(), self.shards.len());
        let _ = self.send(shard, EngineRequest::SessionCommand { client, seq, command, reply }).await;
        rx.await.unwrap_or_else(|_| lost(is_update))
    }

    /// How many other replicas hold every write in `marks`: as soon as `replicas` do, or
    /// what is known at `deadline`. `None` if the event loop is gone. With shards, each shard
    /// answers for the logs it owns (a raftlog mark's log number names its shard) and the
    /// answer is the smallest.
    pub async fn wait_for(
        &self,
        marks: WriteMarks,
        replicas: usize,
        deadline: Option<Instant>,
    ) -> Option<usize> {
        let shards = self.shards.len();
        let mut answers = Vec::new();
        for shard in 0..shards {
            let logs: Vec<(u32, u64)> =
                marks.logs.iter().copied().filter(|(log, _)| *log as usize % shards == shard).collect();
            // A members mark is judged by every loop (the write's own among them).
            if shard > 0 && logs.is_empty() && marks.members.is_none() {
                continue;
            }
            let marks = WriteMarks { members: marks.members, logs };
            let (reply, rx) = oneshot::channel();
            self.send(shard, EngineRequest::Wait { marks, replicas, deadline, reply }).await.ok()?;
            answers.push(rx);
        }
        let mut fewest = usize::MAX;
        for rx in answers {
            fewest = fewest.min(rx.await.ok()?);
        }
        Some(fewest)
    }

    /// Start a background save (`save`), or read the persistence state. `None`: the node
    /// persists nothing (or its event loop is gone). Only unsharded protocols persist keys.
    /// WAITAOF: every write this node acknowledged is on its disk once this returns, if
    /// `local`; `None`: the event loop is gone. With several event loops every loop syncs its
    /// own file, and the node's answer is what holds for all of them.
    pub async fn sync_aof(&self) -> Option<AofDurability> {
        let mut all = AofDurability { local: true, replicas: true };
        for shard in 0..self.shards.len() {
            let (reply, rx) = oneshot::channel();
            self.send(shard, EngineRequest::SyncAof { reply }).await.ok()?;
            let durability = rx.await.ok()?;
            all.local &= durability.local;
            all.replicas &= durability.replicas;
        }
        Some(all)
    }

    /// With several event loops each keeps its own file: every loop saves, and the answer
    /// is loop 0's state with the counters summed (the first error, if any loop failed).
    pub async fn persistence(&self, save: bool) -> Option<Result<PersistenceInfo, String>> {
        let mut merged: Option<PersistenceInfo> = None;
        for shard in 0..self.shards.len() {
            let (reply, rx) = oneshot::channel();
            self.send(shard, EngineRequest::Persistence { save, reply }).await.ok()?;
            let info = match rx.await.ok().flatten()? {
                Ok(info) => info,
                Err(error) => return Some(Err(error)),
            };
            merged = Some(match merged {
                None => info,
                Some(total) => merge_persistence(total, info),
            });
        }
        merged.map(Ok)
    }

    /// The node's state; with shards, theirs summed (counters, keys, requests).
    pub async fn status(&self) -> Option<EngineStatus> {
        let mut merged: Option<EngineStatus> = None;
        for shard in 0..self.shards.len() {
            let (reply, rx) = oneshot::channel();
            self.send(shard, EngineRequest::Status { reply }).await.ok()?;
            let status = rx.await.ok()?;
            merged = Some(match merged {
                None => status,
                Some(total) => total.merge(status),
            });
        }
        merged
    }

    pub async fn keys(&self) -> Vec<Key> {
        let mut keys = Vec::new();
        for shard in 0..self.shards.len() {
            let (reply, rx) = oneshot::channel();
            if self.send(shard, EngineRequest::Keys { reply }).await.is_err() {
                return Vec::new();
            }
            keys.extend(rx.await.unwrap_or_default());
        }
        keys
    }
}

/// One node's persistence state from two of its event loops' (each has its own file).
fn merge_persistence(mut total: PersistenceInfo, other: PersistenceInfo) -> PersistenceInfo {
    total.changes_since_last_save += other.changes_since_last_save;
    total.bgsave_in_progress |= other.bgsave_in_progress;
    total.last_save_unix = total.last_save_unix.min(other.last_save_unix);
    total.last_bgsave_ok &= other.last_bgsave_ok;
    total.last_write_ok &= other.last_write_ok;
    total.snapshots += other.snapshots;
    total.records_appended += other.records_appended;
    total.syncs += other.syncs;
    total.incr_bytes += other.incr_bytes;
    total.base_bytes += other.base_bytes;
    total.restored_records += other.restored_records;
    total
}

/// Counters that name a state or an identity rather than count events: merged by maximum.
const MERGED_BY_MAX: &[&str] =
    &["boot", "shard", "membership_epoch", "membership_raft_leader", "shadow", "joining"];

impl EngineStatus {
    /// One node's status from two of its event loops' (raftlog shards, `event_loops > 1`).
    fn merge(mut self, other: EngineStatus) -> EngineStatus {
        self.operational &= other.operational;
        self.keys += other.keys;
        self.pending_requests += other.pending_requests;
        self.requests_past_deadline += other.requests_past_deadline;
        self.requests_inline += other.requests_inline;
        for (name, value) in other.counters {
            match self.counters.iter_mut().find(|(known, _)| *known == name) {
                // Per-shard identities (the incarnation, the shard number) are not summed.
                Some((_, total)) if MERGED_BY_MAX.contains(&name) => *total = (*total).max(value),
                Some((_, total)) => *total += value,
                None => self.counters.push((name, value)),
            }
        }
        self
    }
}

/// Requests waiting for the event loop; connections wait when it is full.
pub const REQUESTS_QUEUED_MAX: usize = 16 * 1024;
/// Events handled per channel per turn after the first, before the outbox is performed.
const EVENTS_PER_TURN_MAX: usize = 512;
const TICK: Duration = Duration::from_millis(1);

pub fn channel() -> (EngineHandle, mpsc::Receiver<EngineRequest>) {
    let (handle, mut receivers) = channels(1);
    (handle, receivers.pop().expect("one receiver"))
}

/// One request channel per shard (event loop), and the handle that routes to them by key.
pub fn channels(shards: usize) -> (EngineHandle, Vec<mpsc::Receiver<EngineRequest>>) {
    assert!(shards >= 1, "at least one event loop");
    let (senders, receivers): (Vec<_>, Vec<_>) =
        (0..shards).map(|_| mpsc::channel(REQUESTS_QUEUED_MAX)).unzip();
    let inline = (0..shards).map(|_| OnceLock::new()).collect();
    let wake = (0..shards).map(|_| OnceLock::new()).collect();
    (EngineHandle { shards: senders.into(), inline, wake }, receivers)
}

/// How long a stopping node tries to leave the view before it stops anyway (the others then
/// detect the failure), and how long it keeps running once it has left, so the messages that
/// tell the others (the Raft commit of its leave) go out.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(2);
const LINGER_AFTER_LEAVING: Duration = Duration::from_millis(150);

/// A client request the core has not answered yet.
struct Pending {
    reply: ReplyTo,
    /// The key of an update, for its WAIT mark once it completes.
    update: Option<Key>,
}

/// Where a request's answer goes: a connection task waiting on a oneshot, or a connection the
/// reactor serves on the loop's own thread (crate::reactor), which collects its answers after
/// each step with [`EventLoop::take_local_done`].
pub(crate) enum ReplyTo {
    Task(oneshot::Sender<Done>),
    Local(LocalClient),
}

/// A connection of the reactor: its slot and that slot's generation (a slot reused by a later
/// connection never receives an earlier one's answer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LocalClient {
    pub slot: u32,
    pub generation: u32,
}

/// A turn's sync at least this long (on average) lets the turn's answers leave before it
/// ([`EventLoop::syncs_are_slow`]).
const SLOW_SYNC: Duration = Duration::from_micros(100);

/// How the loop's peer messages leave: through the transport's writer tasks, or appended to
/// the links the reactor writes itself (with the reactor's registry, for [`Self::send_now`]).
pub(crate) enum PeerSender<M> {
    Tasks(Transport<M>),
    Links(chorus_net::links::Links<M>, mio::Registry),
}

impl<M: WireMessage> PeerSender<M> {
    fn send_turn(&mut self, messages: &mut Vec<(chorus_core::Destination, M)>) {
        match self {
            PeerSender::Tasks(transport) => transport.send_turn(messages),
            PeerSender::Links(links, _) => links.send_turn(messages),
        }
    }

    /// Send `messages` and write them out now, not at the end of the reactor's pass (with
    /// the writer tasks, sending is writing).
    fn send_now(&mut self, messages: &mut Vec<(chorus_core::Destination, M)>) {
        self.send_turn(messages);
        if let PeerSender::Links(links, registry) = self {
            links.flush(registry);
        }
    }
}

struct Waiter {
    marks: WriteMarks,
    replicas: usize,
    deadline: Option<Instant>,
    reply: oneshot::Sender<usize>,
}

pub(crate) struct EventLoop<R: ServedReplica>
where
    R::Message: WireMessage + Send + 'static,
{
    replica: R,
    transport: PeerSender<R::Message>,
    /// Answers for the reactor's connections ([`ReplyTo::Local`]), in completion order.
    local_done: Vec<(LocalClient, Done)>,
    outbox: Outbox<R::Message>,
    /// The turn's messages that leave before its sync ([`Self::send_before_sync`]).
    early_messages: Vec<(chorus_core::Destination, R::Message)>,
    pending: FxHashMap<ClientRequestId, Pending>,
    /// When each request admitted is due, in admission order (every request gets the same
    /// deadline, so the order is also deadline order). Answered ones are skipped.
    deadlines: VecDeque<(Instant, ClientRequestId)>,
    request_deadline: Duration,
    requests_past_deadline: u64,
    /// Commands run by connection tasks between turns ([`InlineLoop`]).
    requests_inline: u64,
    /// How long the turns' syncs take, smoothed ([`Self::syncs_are_slow`]).
    sync_ns_average: u64,
    waiters: Vec<Waiter>,
    /// Since when the node has been stopping.
    stopping: Option<Instant>,
    left_at: Option<Instant>,

    next_request: u64,
    origin: Instant,
    last_tick: Time,
    /// Append-only file for [`ServedReplica::take_durable_records`], fsynced every turn that
    /// adds to it. `None`: the node has no data directory and keeps such state in memory.
    durable_log: Option<chorus_membership::MembershipLog<chorus_storage::FileStorage>>,
    /// The view and serving state last logged: every change is logged once, at INFO.
    logged: Option<(View, bool)>,
    /// [`ServedReplica::role_fingerprint`] when last logged.
    logged_role: u64,
    /// The keys' append-only file and snapshots; `None`: keys live in memory only.
    persistence: Option<Persistence>,
    /// Keys the turn touched, logged at its end.
    touched: Vec<Key>,
    /// Replies wait for the turn's sync (`appendfsync always`).
    replies_wait: bool,
    /// The core has a thread of its own to sync on ([`ServedReplica::start_sync_thread`]),
    /// used while syncs take this long or more on average ([`Self::syncs_elsewhere`]).
    sync_thread_from: Option<Duration>,
    /// Messages waiting for a sync of that thread to reach their ticket, oldest first.
    held: VecDeque<(u64, PeerMessages<R::Message>)>,
}

type PeerMessages<M> = Vec<(chorus_core::Destination, M)>;

/// `result`'s value, or the node stops: a replica that cannot `doing` (persist, sync) must not
/// go on answering as if it had.
fn or_stop<T>(result: Result<T, String>, doing: &str) -> T {
    result.unwrap_or_else(|error| {
        tracing::error!(%error, "cannot {doing}; stopping this node");
        std::process::exit(1)
    })
}

/// What WAITAOF can count on at this node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AofDurability {
    /// Every write this node acknowledged is on its disk (now that it synced).
    pub local: bool,
    /// A replica that holds a write has it on disk: it acknowledged only after syncing
    /// (`appendfsync always`, assumed the same on every node as `chorus up` sets it, or a
    /// core with its own durable log).
    pub replicas: bool,
}

/// What the node keeps on disk besides a core's own files.
pub struct NodeDisk {
    /// The membership service's log (views this node installed).
    pub membership_log: Option<chorus_membership::MembershipLog<chorus_storage::FileStorage>>,
    /// The keys' append-only file and snapshots (crate::persistence).
    pub persistence: Option<Persistence>,
}

impl NodeDisk {
    /// Nothing on disk besides the core's own files.
    pub fn none() -> NodeDisk {
        NodeDisk { membership_log: None, persistence: None }
    }
}

/// Run the event loop until every request sender is gone, or `shutdown` turns true and the
/// node has left the view (or failed to within [`LEAVE_TIMEOUT`]). Every request the core has
/// not answered within `request_deadline` is answered for it: a read was not executed, an
/// update's outcome is unknown.
#[allow(clippy::too_many_arguments)] // the loop's inputs, each its own thing; a struct would only rename them
pub async fn run<R>(
    replica: R,
    request_deadline: Duration,
    transport: Transport<R::Message>,
    mut requests: mpsc::Receiver<EngineRequest>,
    mut inbound: chorus_net::Inbound<R::Message>,
    mut shutdown: watch::Receiver<bool>,
    disk: NodeDisk,
    inline: Option<(Arc<[InlineSlot]>, usize)>,
) where
    R: ServedReplica,
    R::Message: WireMessage + Send + 'static,
{
    let state = EventLoop::new(replica, request_deadline, PeerSender::Tasks(transport), disk);
    // The loop owns its state; connections on its thread borrow it between turns (InlineLoop).
    let shared = Arc::new(Mutex::new(state));
    if let Some((slots, shard)) = inline {
        let weak: Weak<dyn InlineLoop> = Arc::downgrade(&shared) as Weak<dyn InlineLoop>;
        let _ = slots[shard].set(weak);
    }
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut stopping = false;
    loop {
        let event = tokio::select! {
            changed = shutdown.changed(), if !stopping => Event::Shutdown(changed.is_err() || *shutdown.borrow()),
            request = requests.recv() => match request {
                Some(request) => Event::Request(request),
                None => break,
            },
            Some((from, messages)) = inbound.recv() => Event::Messages(from, messages),
            _ = tick.tick() => Event::Tick,
        };
        // Held for the whole turn and never across an `.await`.
        let mut state = lock(&shared);
        match event {
            Event::Shutdown(true) => state.start_stopping(),
            Event::Shutdown(false) | Event::Tick => {}
            Event::Request(request) => state.on_request(request),
            Event::Messages(from, messages) => state.on_messages(from, messages),
        }
        for _ in 0..EVENTS_PER_TURN_MAX {
            let Ok((from, messages)) = inbound.try_recv() else { break };
            state.on_messages(from, messages);
        }
        for _ in 0..EVENTS_PER_TURN_MAX {
            let Ok(request) = requests.try_recv() else { break };
            state.on_request(request);
        }
        state.maybe_tick();
        state.perform_outbox();
        state.answer_overdue();
        state.answer_waiters();
        if state.done_stopping() {
            break;
        }
        state.log_view_changes();
        stopping = state.stopping.is_some();
    }
    lock(&shared).finish();
    // Dropping the state (the one strong reference) drops the transport: its writers stop.
}

/// What woke the event loop.
enum Event<M> {
    Shutdown(bool),
    Request(EngineRequest),
    Messages(NodeId, Vec<M>),
    Tick,
}

/// The loop's state. A panic while it was held already stopped the node's loop; what is left
/// is only read to fail what was pending.
fn lock<T>(shared: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    shared.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl<R: ServedReplica> InlineLoop for Mutex<EventLoop<R>>
where
    R::Message: WireMessage + Send + 'static,
{
    fn try_submit(&self, command: Command) -> Result<oneshot::Receiver<Done>, Command> {
        let Ok(mut state) = self.try_lock() else { return Err(command) };
        if !state.takes_inline(&command) {
            return Err(command);
        }
        state.requests_inline += 1;
        let (reply, rx) = oneshot::channel();
        state.on_request(EngineRequest::Command { command, reply });
        // Whatever the request left in the outbox (nothing, for the cores that take inline
        // reads) goes out as a turn of its own.
        if !state.outbox.messages.is_empty() || !state.outbox.replies.is_empty() {
            state.perform_outbox();
        }
        Ok(rx)
    }
}

impl<R: ServedReplica> EventLoop<R>
where
    R::Message: WireMessage + Send + 'static,
{
    pub(crate) fn new(
        replica: R,
        request_deadline: Duration,
        transport: PeerSender<R::Message>,
        disk: NodeDisk,
    ) -> EventLoop<R> {
        EventLoop {
            replica,
            transport,
            local_done: Vec::new(),
            outbox: Outbox::default(),
            early_messages: Vec::new(),
            pending: FxHashMap::default(),
            deadlines: VecDeque::new(),
            request_deadline,
            requests_past_deadline: 0,
            requests_inline: 0,
            sync_ns_average: 0,
            waiters: Vec::new(),
            stopping: None,
            left_at: None,
            next_request: 0,
            origin: Instant::now(),
            last_tick: Time::ZERO,
            durable_log: disk.membership_log,
            logged: None,
            logged_role: 0,
            replies_wait: disk.persistence.as_ref().is_some_and(Persistence::replies_wait),
            sync_thread_from: None,
            held: VecDeque::new(),
            persistence: disk.persistence,
            touched: Vec::new(),
        }
    }

    /// The loop stops: what is pending is failed, the append-only file closed.
    pub(crate) fn finish(&mut self) {
        self.fail_pending();
        if let Err(error) = self.replica.persist_all() {
            tracing::error!(%error, "cannot make the replica's state durable at the stop");
        }
        if let Some(persistence) = &mut self.persistence {
            if let Err(error) = persistence.close() {
                tracing::error!(%error, "cannot close the append-only file cleanly");
            }
        }
    }

    pub(crate) fn sender_mut(&mut self) -> &mut PeerSender<R::Message> {
        &mut self.transport
    }

    /// How long until the next 1 ms tick is due (the reactor sleeps at most that long).
    pub(crate) fn next_tick_in(&self) -> Duration {
        let since = self.now().saturating_sub(self.last_tick);
        TICK.saturating_sub(Duration::from_nanos(since.as_nanos()))
    }

    /// The reactor's links, when the loop sends through them.
    pub(crate) fn links(&mut self) -> Option<&mut chorus_net::links::Links<R::Message>> {
        match &mut self.transport {
            PeerSender::Links(links, _) => Some(links),
            PeerSender::Tasks(_) => None,
        }
    }

    /// Run `command` for a connection of the reactor (crate::reactor), on the loop's own thread:
    /// exactly what the loop does with a request it received, answered through
    /// [`EventLoop::take_local_done`]. Counted as run in place (INFO `chorus_requests_inline`).
    pub(crate) fn submit_local(&mut self, command: Command, client: LocalClient) {
        self.requests_inline += 1;
        let Some(id) = self.admit(&command, ReplyTo::Local(client)) else { return };
        let now = self.now();
        self.replica.on_client(now, id, command, &mut self.outbox);
        self.complete_replies();
    }

    /// Answers for the reactor's connections since the last call, in completion order.
    pub(crate) fn take_local_done(&mut self, into: &mut Vec<(LocalClient, Done)>) {
        into.append(&mut self.local_done);
    }

    /// Whether the turn left anything to perform (messages to send, replies to complete).
    pub(crate) fn has_outbox(&self) -> bool {
        !self.outbox.messages.is_empty() || !self.outbox.replies.is_empty()
    }

    /// Answer one request.
    fn answer(local_done: &mut Vec<(LocalClient, Done)>, reply: ReplyTo, done: Done) {
        match reply {
            // The client may have gone away; the command still took effect.
            ReplyTo::Task(reply) => {
                let _ = reply.send(done);
            }
            ReplyTo::Local(client) => local_done.push((client, done)),
        }
    }

    fn now(&self) -> Time {
        Time::from_nanos(self.origin.elapsed().as_nanos() as u64)
    }

    /// Whether `command` may run inline: reads only. An update run inline ends a turn of its
    /// own, so its messages leave in frames of their own instead of in the turn's batch: at 64
    /// clients that cost a SET more than the hand-off it saved (docs/benchmarks.md). Nor when
    /// replies wait for the turn's sync (raftlog, `appendfsync always`).
    fn takes_inline(&self, command: &Command) -> bool {
        R::READS_INLINE && !command.is_update() && !R::REPLIES_AFTER_PERSIST && !self.replies_wait
    }

    pub(crate) fn start_stopping(&mut self) {
        tracing::info!("stopping: leaving the view, then answering what is in flight");
        self.stopping = Some(Instant::now());
        let now = self.now();
        self.replica.leave(now, &mut self.outbox);
    }

    pub(crate) fn done_stopping(&mut self) -> bool {
        let Some(since) = self.stopping else { return false };
        if self.left_at.is_none() && self.replica.has_left() {
            self.left_at = Some(Instant::now());
        }
        if let Some(left_at) = self.left_at {
            return left_at.elapsed() >= LINGER_AFTER_LEAVING;
        }
        if since.elapsed() >= LEAVE_TIMEOUT {
            tracing::warn!("could not leave the view in time; stopping anyway (the others will detect it)");
            return true;
        }
        false
    }

    /// Answer what is still pending once the loop stops (after the last turn was made
    /// durable): reads were not executed, updates may have been.
    fn fail_pending(&mut self) {
        for (_, pending) in self.pending.drain() {
            let done = lost(pending.update.is_some());
            Self::answer(&mut self.local_done, pending.reply, done);
        }
        for waiter in self.waiters.drain(..) {
            let _ = waiter.reply.send(0);
        }
    }

    /// A new id for `reply`, or `None` (answered already) while the node is stopping.
    fn admit(&mut self, command: &Command, reply: ReplyTo) -> Option<ClientRequestId> {
        if self.stopping.is_some() {
            Self::answer(&mut self.local_done, reply, Done::failed(SHUTTING_DOWN));
            return None;
        }
        let id = ClientRequestId(self.next_request);
        self.next_request += 1;
        let update = command.is_update().then(|| command.key().clone());
        if let Some(key) = update.as_ref().filter(|_| self.persistence.is_some()) {
            self.touched.push(key.clone());
        }
        self.pending.insert(id, Pending { reply, update });
        self.deadlines.push_back((Instant::now() + self.request_deadline, id));
        Some(id)
    }

    /// Answer the requests whose deadline passed (a partitioned or stalled replica must not
    /// leave a client waiting forever). The core may still complete an update afterwards;
    /// its answer then goes nowhere, which is what "outcome unknown" told the client.
    pub(crate) fn answer_overdue(&mut self) {
        let now = Instant::now();
        while let Some(&(due, id)) = self.deadlines.front() {
            if due > now {
                break;
            }
            self.deadlines.pop_front();
            if let Some(pending) = self.pending.remove(&id) {
                self.requests_past_deadline += 1;
                let error =
                    if pending.update.is_some() { CommandError::OutcomeUnknown } else { PAST_DEADLINE };
                Self::answer(&mut self.local_done, pending.reply, Done::failed(error));
            }
        }
    }

    pub(crate) fn on_request(&mut self, request: EngineRequest) {
        match request {
            EngineRequest::Command { command, reply } => {
                let Some(id) = self.admit(&command, ReplyTo::Task(reply)) else { return };
                let now = self.now();
                self.replica.on_client(now, id, command, &mut self.outbox);
                // Replies that are ready now (local reads) complete right away.
                self.complete_replies();
            }
            EngineRequest::Transaction { commands, replies } => {
                let mut requests = Vec::with_capacity(commands.len());
                for (command, reply) in commands.into_iter().zip(replies) {
                    let Some(id) = self.admit(&command, ReplyTo::Task(reply)) else { continue };
                    requests.push((id, command));
                }
                if requests.is_empty() {
                    return;
                }
                let now = self.now();
                self.replica.on_transaction(now, requests, &mut self.outbox);
                self.complete_replies();
            }
            EngineRequest::SessionCommand { client, seq, command, reply } => {
                let Some(id) = self.admit(&command, ReplyTo::Task(reply)) else { return };
                let now = self.now();
                self.replica.on_session_command(now, id, client, seq, command, &mut self.outbox);
                self.complete_replies();
            }
            EngineRequest::Status { reply } => {
                let _ = reply.send(EngineStatus {
                    me: self.replica.id(),
                    protocol: self.replica.protocol_name(),
                    view: self.replica.current_view(),
                    operational: self.replica.operational(),
                    keys: self.replica.keys_with_values(),
                    pending_requests: self.pending.len(),
                    requests_past_deadline: self.requests_past_deadline,
                    requests_inline: self.requests_inline,
                    counters: self.replica.counters(),
                });
            }
            EngineRequest::SyncAof { reply } => {
                let durability = match self.persistence.as_mut() {
                    Some(persistence) => {
                        persistence.log_records(self.replica.take_log_records());
                        if let Err(error) = persistence.sync_now() {
                            tracing::error!(
                                "cannot sync the append-only file ({error:#}); stopping this node"
                            );
                            std::process::exit(1);
                        }
                        AofDurability { local: true, replicas: persistence.replies_wait() }
                    }
                    // A core with its own durable log (raftlog) syncs before it answers.
                    None => {
                        AofDurability { local: R::REPLIES_AFTER_PERSIST, replicas: R::REPLIES_AFTER_PERSIST }
                    }
                };
                let _ = reply.send(durability);
            }
            EngineRequest::Persistence { save, reply } => {
                let answer = self.persistence.as_mut().map(|persistence| {
                    // The snapshot starts from a state whose records are all logged.
                    persistence.log_records(self.replica.take_log_records());
                    if save {
                        persistence.bgsave(&crate::persistence::Served(&self.replica))?;
                    }
                    Ok(persistence.info())
                });
                let _ = reply.send(answer);
            }
            EngineRequest::Keys { reply } => {
                let _ = reply.send(self.replica.keys());
            }
            EngineRequest::Wait { marks, replicas, deadline, reply } => {
                self.waiters.push(Waiter { marks, replicas, deadline, reply });
                self.answer_waiters();
            }
        }
    }

    /// The replicas known to hold every write in `marks`.
    fn holders(&self, marks: &WriteMarks) -> NodeSet {
        let live = self.replica.current_view().live;
        let mut holders =
            marks.members.map_or(live, |members| NodeSet::from_bits(members.bits() & live.bits()));
        for (log, index) in &marks.logs {
            holders = NodeSet::from_bits(holders.bits() & self.replica.log_holders(*log, *index).bits());
        }
        holders
    }

    /// Answer every WAIT that has enough replicas, or whose deadline passed (checked every
    /// turn, and a turn runs at least every tick).
    pub(crate) fn answer_waiters(&mut self) {
        if self.waiters.is_empty() {
            return;
        }
        let me = self.replica.id();
        let now = Instant::now();
        let waiters = std::mem::take(&mut self.waiters);
        for waiter in waiters {
            if waiter.reply.is_closed() {
                continue;
            }
            let count = self.holders(&waiter.marks).without(me).len();
            if count >= waiter.replicas || waiter.deadline.is_some_and(|deadline| now >= deadline) {
                let _ = waiter.reply.send(count);
            } else {
                self.waiters.push(waiter);
            }
        }
    }

    pub(crate) fn on_messages(&mut self, from: NodeId, messages: Vec<R::Message>) {
        if self.persistence.is_some() {
            for message in &messages {
                R::message_keys(message, &mut self.touched);
            }
        }
        let now = self.now();
        for message in messages {
            self.replica.on_message(now, from, message, &mut self.outbox);
        }
        self.complete_replies();
    }

    pub(crate) fn maybe_tick(&mut self) {
        let now = self.now();
        if now.saturating_sub(self.last_tick) >= Time::from_nanos(TICK.as_nanos() as u64) {
            self.last_tick = now;
            self.replica.on_tick(now, &mut self.outbox);
            self.complete_replies();
        }
    }

    fn complete_replies(&mut self) {
        if R::REPLIES_AFTER_PERSIST || self.replies_wait {
            return; // perform_outbox completes them once the turn's state is durable
        }
        self.complete_replies_now();
    }

    fn complete_replies_now(&mut self) {
        let replica = &self.replica;
        for (id, outcome) in self.outbox.replies.drain(..) {
            if let Some(pending) = self.pending.remove(&id) {
                let took_effect = !matches!(outcome, Outcome::Error(_));
                let mark = pending.update.filter(|_| took_effect).map(|key| replica.write_mark(&key));
                Self::answer(&mut self.local_done, pending.reply, Done { outcome, mark });
            }
        }
    }

    /// Perform the turn's outbox, and the turns what its sync made possible fill
    /// ([`Self::finish_turn`]).
    pub(crate) fn perform_outbox(&mut self) {
        loop {
            if self.perform_outbox_until_sync() {
                self.finish_turn();
            }
            if !self.has_outbox() {
                return;
            }
        }
    }

    /// Perform the turn's outbox up to its sync. Returns whether the sync is still to come:
    /// then the messages and replies that may leave before it have been sent and completed,
    /// the caller may write the answers to their clients, and must call
    /// [`Self::finish_turn`] before anything else reaches the core (a later call could
    /// otherwise act on records not yet stable, such as committing on them).
    pub(crate) fn perform_outbox_until_sync(&mut self) -> bool {
        let now = self.now();
        // Every message and request of the turn is in: a core that flushes once per turn
        // (raftlog) does it here (`Replica::end_turn`).
        self.replica.end_turn(now, &mut self.outbox);
        self.complete_replies();
        self.persist_durable_records();
        let defer_sync = !self.sync_first();
        self.persist_keys(defer_sync);
        if self.syncs_elsewhere() || !self.replica.turn_needs_sync() {
            self.finish_turn();
            return false;
        }
        self.send_before_sync();
        if !(self.replica.replies_before_sync() && self.syncs_are_slow()) {
            self.finish_turn();
            return false;
        }
        self.complete_replies_now();
        true
    }

    /// An average over about the last eight syncs.
    fn note_sync_time(&mut self, took: Duration) {
        let took_ns = took.as_nanos().min(u64::MAX as u128) as u64;
        self.sync_ns_average = self.sync_ns_average - self.sync_ns_average / 8 + took_ns / 8;
    }

    /// Whether this turn's sync goes to the sync thread: syncs take long enough that the
    /// loop has better to do than wait for them.
    fn syncs_elsewhere(&self) -> bool {
        self.sync_thread_from.is_some_and(|from| self.sync_ns_average >= from.as_nanos() as u64)
    }

    /// Whether the turns' syncs take long enough that answers should not wait for them: an
    /// answer written in the middle of the reactor's pass wakes its client while the pass
    /// still has the sync and the peer frames to do, which on a shared host costs the pass
    /// about a context switch (measured: 10% fewer SETs with the region on tmpfs, where an
    /// msync takes a microsecond), while an msync to a disk takes milliseconds.
    fn syncs_are_slow(&self) -> bool {
        self.sync_ns_average >= SLOW_SYNC.as_nanos() as u64
    }

    /// Make the turn's records stable, then complete its replies and send its messages.
    pub(crate) fn finish_turn(&mut self) {
        if self.syncs_elsewhere() {
            return self.finish_turn_syncing_elsewhere();
        }
        let (syncs, started) = (self.replica.turn_needs_sync(), Instant::now());
        or_stop(self.replica.persist_turn(), "persist replica state");
        if syncs {
            self.note_sync_time(started.elapsed());
            // This sync covered every record written, those of syncs still under way on the
            // sync thread too: what waited for them may leave.
            self.release_held(u64::MAX);
        }
        self.complete_replies_now();
        self.transport.send_turn(&mut self.outbox.messages);
        if syncs {
            // What the sync made stable the core may now count on (a leader's own entries
            // toward a commit): what that allows fills the outbox for the next turn.
            let now = self.now();
            self.replica.on_synced(now, &mut self.outbox);
        }
    }

    /// [`Self::finish_turn`] with a sync thread: the turn's records are written and their
    /// sync handed over. Its replies complete now (they answer what a majority holds stable,
    /// [`Replica::replies_before_sync`]) and the messages the core lets go before a sync
    /// leave; the rest wait for the sync under way, this turn's or an earlier one's
    /// ([`Self::take_synced`] sends them).
    fn finish_turn_syncing_elsewhere(&mut self) {
        let wait = or_stop(self.replica.persist_turn_elsewhere(), "persist replica state");
        debug_assert!(self.replica.replies_before_sync(), "a core with a sync thread answers at once");
        self.complete_replies_now();
        match wait {
            Some(ticket) => {
                let replica = &self.replica;
                let held: Vec<_> = self
                    .outbox
                    .messages
                    .extract_if(.., |(_, message)| !replica.leaves_before_sync(message))
                    .collect();
                if !held.is_empty() {
                    self.held.push_back((ticket, held));
                }
            }
            None => self.release_held(u64::MAX),
        }
        self.transport.send_turn(&mut self.outbox.messages);
    }

    /// Sync off the event loop, if the core can: `wake` interrupts the loop's wait when a
    /// sync returns. A node that cannot start the thread stops.
    pub(crate) fn start_sync_thread(&mut self, wake: Box<dyn Fn() + Send>) {
        self.sync_thread_from = or_stop(self.replica.start_sync_thread(wake), "start the sync thread");
    }

    /// A sync of the sync thread returned: the messages that waited for it leave, and the
    /// core hears what it made stable (its answer fills the outbox for the next turn).
    pub(crate) fn take_synced(&mut self) {
        let Some((synced, took)) = or_stop(self.replica.poll_synced(), "sync replica state") else { return };
        self.note_sync_time(took);
        self.release_held(synced);
        let now = self.now();
        self.replica.on_synced(now, &mut self.outbox);
    }

    /// Send the held messages whose sync is done (`ticket` or earlier), in order.
    fn release_held(&mut self, ticket: u64) {
        while self.held.front().is_some_and(|(waits_for, _)| *waits_for <= ticket) {
            if let Some((_, mut messages)) = self.held.pop_front() {
                self.transport.send_turn(&mut messages);
            }
        }
    }

    /// The turn's messages the core lets leave before its sync (a Raft leader's appends, Raft
    /// thesis §10.2.1) go now, so the followers' syncs overlap this node's instead of
    /// following it; the rest keep their order and wait.
    fn send_before_sync(&mut self) {
        let replica = &self.replica;
        let early = self.outbox.messages.extract_if(.., |(_, message)| replica.leaves_before_sync(message));
        self.early_messages.extend(early);
        self.transport.send_now(&mut self.early_messages);
    }

    /// Whether a message or reply of this turn may leave only after the turn's records are
    /// synced (otherwise they leave at once and the next turn's sync covers the records).
    fn sync_first(&self) -> bool {
        let replies = !self.outbox.replies.is_empty() && self.replica.replies_must_persist_first();
        replies || self.outbox.messages.iter().any(|(_, message)| R::must_persist_before(message))
    }

    /// The turn's keys go to the append-only file (synced, with `appendfsync always`) before
    /// any message or reply of the turn that depends on them leaves. A node that cannot write
    /// them must stop: it would acknowledge writes it could lose.
    fn persist_keys(&mut self, defer_sync: bool) {
        let Some(persistence) = &mut self.persistence else { return };
        persistence.log_records(self.replica.take_log_records());
        for (_, message) in &self.outbox.messages {
            R::message_keys(message, &mut self.touched);
        }
        for (id, _) in &self.outbox.replies {
            if let Some(key) = self.pending.get(id).and_then(|pending| pending.update.as_ref()) {
                self.touched.push(key.clone());
            }
        }
        if let Err(error) =
            persistence.end_turn(&crate::persistence::Served(&self.replica), &mut self.touched, defer_sync)
        {
            tracing::error!("cannot persist keys ({error:#}); stopping this node");
            std::process::exit(1);
        }
    }

    /// Log every view this node installs (epoch and members) and every change of whether it
    /// serves, so an operator can follow a partition and its healing in the log.
    pub(crate) fn log_view_changes(&mut self) {
        let role = self.replica.role_fingerprint();
        if role != self.logged_role {
            self.logged_role = role;
            tracing::info!("{}", self.replica.describe_role());
        }
        let (view, serving) = (self.replica.current_view(), self.replica.operational());
        if self.logged == Some((view, serving)) {
            return;
        }
        let members: Vec<String> = view.live.iter().map(|node| node.to_string()).collect();
        let members = members.join(",");
        match self.logged {
            Some((last, _)) if last == view => {
                tracing::info!(epoch = view.epoch.0, %members, serving, "serving state changed")
            }
            _ => tracing::info!(epoch = view.epoch.0, %members, serving, "view installed"),
        }
        self.logged = Some((view, serving));
    }

    /// Raft's safety needs its vote and log on disk before any message that depends on them
    /// leaves. A node that cannot write them must stop rather than risk voting twice.
    fn persist_durable_records(&mut self) {
        let records = self.replica.take_durable_records();
        let Some(log) = self.durable_log.as_mut().filter(|_| !records.is_empty()) else { return };
        if let Err(error) = log.append(&records).and_then(|()| log.sync()) {
            tracing::error!(%error, "cannot persist membership state; stopping this node");
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use chorus_core::{Epoch, Timestamp};
    use chorus_hermes::{HermesConfig, Message};
    use std::collections::BTreeMap;

    fn value(text: &'static str) -> Option<Bytes> {
        Some(Bytes::from_static(text.as_bytes()))
    }

    /// Node 0's event loop with Hermes and no real peers: the test plays node 1 by feeding
    /// its messages into the loop's inbound channel (what node 0 sends goes nowhere).
    async fn hermes_loop() -> (EngineHandle, mpsc::Sender<(NodeId, Vec<Message>)>) {
        let members = NodeSet::from_iter([NodeId(0), NodeId(1), NodeId(2)]);
        let unreachable: BTreeMap<NodeId, std::net::SocketAddr> =
            [(NodeId(1), "127.0.0.1:9".parse().unwrap()), (NodeId(2), "127.0.0.1:9".parse().unwrap())].into();
        let config = chorus_net::NetConfig::new(
            NodeId(0),
            "inline-test",
            "0123456789abcdef0123456789abcdef",
            "hermes",
            "127.0.0.1:0".parse().unwrap(),
            unreachable,
        );
        let (transport, _inbound, _stats) = chorus_net::start::<Message>(config).await.expect("transport");
        let (data_tx, data_rx) = mpsc::channel(16);
        let (_priority_tx, priority_rx) = mpsc::channel(16);
        let inbound = chorus_net::Inbound::from_channels(priority_rx, data_rx);
        let (handle, mut receivers) = channels(1);
        let (_shutdown_tx, shutdown) = watch::channel(false);
        let hermes = Hermes::new(HermesConfig::new(NodeId(0), members));
        let inline = Some((handle.inline_slots(), 0));
        let requests = receivers.pop().expect("one loop");
        let deadline = Duration::from_secs(60);
        tokio::spawn(async move {
            let _keep = _shutdown_tx;
            run(hermes, deadline, transport, requests, inbound, shutdown, NodeDisk::none(), inline).await;
        });
        (handle, data_tx)
    }

    /// A message from node 1 handled by the loop: the loop drains its inbound channel in the
    /// turn that answers the status request sent after it.
    async fn deliver(handle: &EngineHandle, peer: &mpsc::Sender<(NodeId, Vec<Message>)>, message: Message) {
        peer.send((NodeId(1), vec![message])).await.expect("loop running");
        handle.status().await.expect("loop running");
    }

    /// The inline path (a connection running a command through the loop between turns) must
    /// serve only what the core would serve: a Valid key at once, an Invalid one (an INV seen,
    /// its VAL not yet) only once it is valid again, with the new value, never the stale one.
    #[test]
    fn an_inline_read_waits_for_an_invalid_key_and_never_serves_the_stale_value() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let (handle, peer) = hermes_loop().await;
            let key = Key::from("k".to_string());
            let read = || Command::Read { key: key.clone() };
            // Committed first version, written by node 1.
            let ts1 = Timestamp::new(2, 1);
            let epoch = Epoch(1);
            let inv1 = Message::Inv {
                epoch,
                key: key.clone(),
                ts: ts1,
                value: value("old"),
                rmw: false,
                superseded: false,
            };
            deliver(&handle, &peer, inv1).await;
            deliver(&handle, &peer, Message::Val { epoch, key: key.clone(), ts: ts1 }).await;

            // Valid: served inline, in the call itself (no turn of the loop in between).
            let mut rx = handle.submit(read()).await;
            let served = rx.try_recv().expect("a Valid key is served inline, at once");
            assert_eq!(served.outcome, Outcome::Value(value("old")));

            // Node 1 invalidates the key with a newer write; its VAL has not arrived.
            let ts2 = Timestamp::new(4, 1);
            let inv2 = Message::Inv {
                epoch,
                key: key.clone(),
                ts: ts2,
                value: value("new"),
                rmw: false,
                superseded: false,
            };
            deliver(&handle, &peer, inv2).await;
            let mut rx = handle.submit(read()).await;
            assert!(
                matches!(rx.try_recv(), Err(oneshot::error::TryRecvError::Empty)),
                "an Invalid key must not be served (the stale value would break linearizability)"
            );
            deliver(&handle, &peer, Message::Val { epoch, key: key.clone(), ts: ts2 }).await;
            assert_eq!(rx.await.expect("answered").outcome, Outcome::Value(value("new")));

            let status = handle.status().await.expect("loop running");
            assert_eq!(status.requests_inline, 2, "both reads ran inline");
        });
    }
}
