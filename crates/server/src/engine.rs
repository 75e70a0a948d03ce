//! The event loop: ONE task owns the protocol core (sans-I/O) and is the only code that calls
//! it. Client commands arrive over a bounded channel, peer messages over the transport's
//! inbound channel, and a 1 ms tick drives retransmissions and replays.
//!
//! A **turn** handles one event, then everything else already waiting (bounded, so a flood on
//! one channel cannot starve the other or the tick), then performs the turn's outbox: every
//! peer message of the turn goes to [`Transport::send_turn`] at once (one batch frame per
//! peer, broadcasts encoded once: Hermes §4.2 opportunistic batching) and every reply
//! completes its client's oneshot.

use std::time::{Duration, Instant};

use chorus_core::codec::WireMessage;
use chorus_core::{
    ClientRequestId, Command, CommandError, Key, NodeId, Outbox, Outcome, Replica, Time, View,
};
use chorus_craq::Craq;
use chorus_hermes::Hermes;
use chorus_membership::{PersistRecord, Wire, WithMembership};
use chorus_net::Transport;
use chorus_raftlog::disk::DurableRaftLog;
use chorus_zab::Zab;
use rustc_hash::FxHashMap;
use tokio::sync::{mpsc, oneshot, watch};

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
    fn persist_turn(&mut self) -> Result<(), String> {
        self.persist().map_err(|error| error.to_string())
    }
    const REPLIES_AFTER_PERSIST: bool = true;
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
        vec![
            ("boot", self.boot()),
            ("snapshots_taken", s.snapshots_taken),
            ("snapshots_installed", s.snapshots_installed),
            ("snapshot_chunks_sent", s.snapshot_chunks_sent),
            ("snapshot_transfers_completed", s.snapshot_transfers_completed),
            ("snapshot_transfers_failed", s.snapshot_transfers_failed),
            ("txns_too_large", s.txns_too_large),
            ("disk_records_appended", d.records_appended),
            ("disk_flushes", d.flushes),
            ("disk_drains", d.drains),
            ("disk_bytes_drained", d.bytes_drained),
            ("disk_checkpoints", d.checkpoints),
            ("entries_proposed", s.entries_proposed),
            ("commands_proposed", s.commands_proposed),
            ("proposals_executed", s.proposals_executed),
            ("proposals_duplicate", s.proposals_duplicate),
            ("batches_forwarded", s.batches_forwarded),
            ("batches_resent", s.batches_resent),
            ("read_rounds", s.read_rounds),
            ("txns_started", s.txns_started),
            ("txns_answered", s.txns_answered),
            ("txn_lock_retries", s.txn_lock_retries),
            ("commands_blocked", s.commands_blocked),
            ("speculation_confirmed", s.speculation_confirmed),
            ("speculation_mismatches", s.speculation_mismatches),
            ("speculation_rolled_back", s.speculation_rolled_back),
            ("reads_served", s.reads_served),
        ]
    }
}

impl ServedReplica for Hermes {
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
        Hermes::keys(self).cloned().collect()
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

impl ServedReplica for chorus_chain::Chain {
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
    /// Every replica's region holds the whole database: list it from there.
    fn keys(&self) -> Vec<Key> {
        self.stored_keys()
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
        ]
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
    pub counters: Vec<(&'static str, u64)>,
}

pub enum EngineRequest {
    Command {
        command: Command,
        reply: oneshot::Sender<Outcome>,
    },
    /// One command of an external at-most-once session ([`ServedReplica::on_session_command`]).
    SessionCommand {
        client: u64,
        seq: u64,
        command: Command,
        reply: oneshot::Sender<Outcome>,
    },
    Status {
        reply: oneshot::Sender<EngineStatus>,
    },
    /// MULTI/EXEC: the commands run as one transaction; `replies[i]` answers `commands[i]`.
    Transaction {
        commands: Vec<Command>,
        replies: Vec<oneshot::Sender<Outcome>>,
    },
    /// Every key this node knows to hold a value (for FLUSHALL).
    Keys {
        reply: oneshot::Sender<Vec<Key>>,
    },
}

/// How connections reach the event loop. Cheap to clone.
#[derive(Clone)]
pub struct EngineHandle {
    tx: mpsc::Sender<EngineRequest>,
}

const SHUTTING_DOWN: CommandError = CommandError::Unavailable("the node is shutting down");

impl EngineHandle {
    /// Submit a command; the returned receiver completes with its outcome.
    pub async fn submit(&self, command: Command) -> oneshot::Receiver<Outcome> {
        let (reply, rx) = oneshot::channel();
        // If the loop is gone, `reply` is dropped with the request and `rx` reports it.
        let _ = self.tx.send(EngineRequest::Command { command, reply }).await;
        rx
    }

    pub async fn execute(&self, command: Command) -> Outcome {
        self.submit(command).await.await.unwrap_or(Outcome::Error(SHUTTING_DOWN))
    }

    /// Submit all commands before waiting for any: they run concurrently (MGET, MSET, DEL).
    pub async fn execute_all(&self, commands: Vec<Command>) -> Vec<Outcome> {
        let mut pending = Vec::with_capacity(commands.len());
        for command in commands {
            pending.push(self.submit(command).await);
        }
        let mut outcomes = Vec::with_capacity(pending.len());
        for rx in pending {
            outcomes.push(rx.await.unwrap_or(Outcome::Error(SHUTTING_DOWN)));
        }
        outcomes
    }

    /// Run `commands` as one transaction; the outcomes in order.
    pub async fn execute_transaction(&self, commands: Vec<Command>) -> Vec<Outcome> {
        let (replies, receivers): (Vec<_>, Vec<_>) = commands.iter().map(|_| oneshot::channel()).unzip();
        let _ = self.tx.send(EngineRequest::Transaction { commands, replies }).await;
        let mut outcomes = Vec::with_capacity(receivers.len());
        for rx in receivers {
            outcomes.push(rx.await.unwrap_or(Outcome::Error(SHUTTING_DOWN)));
        }
        outcomes
    }

    /// Run `command` at most once for session `client`, request number `seq`.
    pub async fn execute_in_session(&self, client: u64, seq: u64, command: Command) -> Outcome {
        let (reply, rx) = oneshot::channel();
        let _ = self.tx.send(EngineRequest::SessionCommand { client, seq, command, reply }).await;
        rx.await.unwrap_or(Outcome::Error(SHUTTING_DOWN))
    }

    pub async fn status(&self) -> Option<EngineStatus> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(EngineRequest::Status { reply }).await.ok()?;
        rx.await.ok()
    }

    pub async fn keys(&self) -> Vec<Key> {
        let (reply, rx) = oneshot::channel();
        if self.tx.send(EngineRequest::Keys { reply }).await.is_err() {
            return Vec::new();
        }
        rx.await.unwrap_or_default()
    }
}

/// Requests waiting for the event loop; connections wait when it is full.
pub const REQUESTS_QUEUED_MAX: usize = 16 * 1024;
/// Events handled per channel per turn after the first, before the outbox is performed.
const EVENTS_PER_TURN_MAX: usize = 512;
const TICK: Duration = Duration::from_millis(1);

pub fn channel() -> (EngineHandle, mpsc::Receiver<EngineRequest>) {
    let (tx, rx) = mpsc::channel(REQUESTS_QUEUED_MAX);
    (EngineHandle { tx }, rx)
}

struct EventLoop<R: ServedReplica>
where
    R::Message: WireMessage + Send + 'static,
{
    replica: R,
    transport: Transport<R::Message>,
    outbox: Outbox<R::Message>,
    pending: FxHashMap<ClientRequestId, oneshot::Sender<Outcome>>,
    next_request: u64,
    origin: Instant,
    last_tick: Time,
    /// Append-only file for [`ServedReplica::take_durable_records`], fsynced every turn that
    /// adds to it. `None`: the node has no data directory and keeps such state in memory.
    durable_log: Option<std::fs::File>,
    /// The view and serving state last logged: every change is logged once, at INFO.
    logged: Option<(View, bool)>,
}

/// Run the event loop until `shutdown` turns true or every request sender is gone.
pub async fn run<R>(
    replica: R,
    transport: Transport<R::Message>,
    mut requests: mpsc::Receiver<EngineRequest>,
    mut inbound: chorus_net::Inbound<R::Message>,
    mut shutdown: watch::Receiver<bool>,
    durable_log: Option<std::fs::File>,
) where
    R: ServedReplica,
    R::Message: WireMessage + Send + 'static,
{
    let mut state = EventLoop {
        replica,
        transport,
        outbox: Outbox::default(),
        pending: FxHashMap::default(),
        next_request: 0,
        origin: Instant::now(),
        last_tick: Time::ZERO,
        durable_log,
        logged: None,
    };
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            changed = shutdown.changed() => {
                if changed.is_err() || *shutdown.borrow() {
                    break;
                }
            }
            request = requests.recv() => match request {
                Some(request) => state.on_request(request),
                None => break,
            },
            Some((from, messages)) = inbound.recv() => state.on_messages(from, messages),
            _ = tick.tick() => {}
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
        state.log_view_changes();
    }
    // Dropping `state` drops the transport (its writers stop) and the pending oneshots (their
    // clients see the node going away).
}

impl<R: ServedReplica> EventLoop<R>
where
    R::Message: WireMessage + Send + 'static,
{
    fn now(&self) -> Time {
        Time::from_nanos(self.origin.elapsed().as_nanos() as u64)
    }

    fn on_request(&mut self, request: EngineRequest) {
        match request {
            EngineRequest::Command { command, reply } => {
                let id = ClientRequestId(self.next_request);
                self.next_request += 1;
                self.pending.insert(id, reply);
                let now = self.now();
                self.replica.on_client(now, id, command, &mut self.outbox);
                // Replies that are ready now (local reads) complete right away.
                self.complete_replies();
            }
            EngineRequest::Transaction { commands, replies } => {
                let mut requests = Vec::with_capacity(commands.len());
                for (command, reply) in commands.into_iter().zip(replies) {
                    let id = ClientRequestId(self.next_request);
                    self.next_request += 1;
                    self.pending.insert(id, reply);
                    requests.push((id, command));
                }
                let now = self.now();
                self.replica.on_transaction(now, requests, &mut self.outbox);
                self.complete_replies();
            }
            EngineRequest::SessionCommand { client, seq, command, reply } => {
                let id = ClientRequestId(self.next_request);
                self.next_request += 1;
                self.pending.insert(id, reply);
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
                    counters: self.replica.counters(),
                });
            }
            EngineRequest::Keys { reply } => {
                let _ = reply.send(self.replica.keys());
            }
        }
    }

    fn on_messages(&mut self, from: NodeId, messages: Vec<R::Message>) {
        let now = self.now();
        for message in messages {
            self.replica.on_message(now, from, message, &mut self.outbox);
        }
        self.complete_replies();
    }

    fn maybe_tick(&mut self) {
        let now = self.now();
        if now.saturating_sub(self.last_tick) >= Time::from_nanos(TICK.as_nanos() as u64) {
            self.last_tick = now;
            self.replica.on_tick(now, &mut self.outbox);
            self.complete_replies();
        }
    }

    fn complete_replies(&mut self) {
        if R::REPLIES_AFTER_PERSIST {
            return; // perform_outbox completes them once the turn's state is durable
        }
        self.complete_replies_now();
    }

    fn complete_replies_now(&mut self) {
        for (id, outcome) in self.outbox.replies.drain(..) {
            if let Some(reply) = self.pending.remove(&id) {
                // The client may have gone away; the command still took effect.
                let _ = reply.send(outcome);
            }
        }
    }

    fn perform_outbox(&mut self) {
        self.complete_replies();
        self.persist_durable_records();
        if let Err(error) = self.replica.persist_turn() {
            tracing::error!(%error, "cannot persist replica state; stopping this node");
            std::process::exit(1);
        }
        self.complete_replies_now();
        self.transport.send_turn(&mut self.outbox.messages);
    }

    /// Log every view this node installs (epoch and members) and every change of whether it
    /// serves, so an operator can follow a partition and its healing in the log.
    fn log_view_changes(&mut self) {
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
        let Some(file) = self.durable_log.as_mut().filter(|_| !records.is_empty()) else { return };
        let mut bytes = bytes::BytesMut::new();
        chorus_membership::encode_records(&records, &mut bytes);
        if let Err(error) = std::io::Write::write_all(file, &bytes).and_then(|()| file.sync_data()) {
            tracing::error!(%error, "cannot persist membership state; stopping this node");
            std::process::exit(1);
        }
    }
}
