//! The raftlog replica: K Raft groups (raft-rs `RawNode`s) driven by one sans-I/O core.
//!
//! Per log, a replica plays three parts:
//!
//! * **origin** of its clients' commands. Updates join this replica's own session for the
//!   log: while one batch is in flight, newly arrived commands wait and leave together as
//!   the next batch, under the next sequence number. A batch goes to the log's leader (or is
//!   proposed here, if this replica leads) and is re-sent after `retry_timeout` or as soon as
//!   a different leader is known, until this replica *applies* it: the origin answers its
//!   clients from its own state machine, so no reply message exists and a lost leader
//!   never strands a request. Retries are safe because execution is at most once per
//!   `(client, seq)`.
//! * **leader**, if it leads the log: every batch accepted during one call of the core
//!   (its own and those forwarded to it) becomes one Raft entry.
//! * **state machine**: committed entries are applied in log order, each proposal at most
//!   once (`state::LogState`).
//!
//! Reads use ReadIndex (Raft thesis §6.4, raft-rs `read_index`): the receiving replica,
//! leader or follower, learns a commit index that the leader confirmed with a quorum after
//! the read arrived, waits until it has applied that far, and reads its own copy.

use std::collections::{BTreeMap, VecDeque};

use chorus_core::codec::WireMessage;
use chorus_core::{
    ClientRequestId, Command, CommandError, Epoch, Key, NodeId, NodeSet, Outbox, Outcome, Replica, Time, View,
};
use raft::prelude::{Entry, EntryType, MessageType, Snapshot};
use raft::{Config, RawNode, ReadState, StateRole, INVALID_ID};
use rustc_hash::FxHashMap;

use crate::config::{LeaderPlacement, RaftLogConfig};
use crate::durable::{Checkpoint, DurableTurn, LogCheckpoint, Record, Recovered};
use crate::message::{AppendAnswer, EntryBatch, LogCommit, Message, Proposal, Step, TxnId};
use crate::message::{SessionId, StepKind};
use crate::state::{LogState, ProposalResult, SessionRecord, StateImage};
use crate::storage::LogStorage;
use crate::transfer::{self, Incoming, Outgoing};
use crate::txn::{Begun, Driver, StepResult, FORGOTTEN};

mod gang;
mod members;
mod tentative;
use gang::{GangScan, OwnGang, PendingEntry};
use members::Members;
use tentative::{Executed, ProposedEntry};

/// Counters for INFO, the simulator's summary and benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RaftLogStats {
    /// Raft entries this replica proposed as leader, and the client commands in them.
    pub entries_proposed: u64,
    pub commands_proposed: u64,
    /// Proposals (one session's batch) applied, executed or recognised as retries.
    pub proposals_executed: u64,
    pub proposals_duplicate: u64,
    pub proposals_stale: u64,
    /// Proposals refused because their session expired before they reached the log
    /// (`state::LogState`'s rule): nothing ran, the client hears the outcome is unknown.
    pub proposals_expired: u64,
    /// Committed entries whose contents did not decode (skipped identically everywhere).
    pub entries_malformed: u64,
    pub batches_forwarded: u64,
    /// Batches sent again: retry timeout or a new leader.
    pub batches_resent: u64,
    pub forwards_relayed: u64,
    pub read_rounds: u64,
    pub read_rounds_retried: u64,
    pub reads_served: u64,
    /// Raft messages refused before reaching raft-rs (wrong sender, bad snapshot, malformed).
    pub messages_refused: u64,
    /// Compactions of every log to its applied index (each one a checkpoint when durable).
    pub snapshots_taken: u64,
    /// Log state machines encoded by those compactions (logs unchanged since their last
    /// snapshot are not encoded again).
    pub snapshot_logs_encoded: u64,
    /// Snapshots received from a leader and installed (this replica had fallen behind).
    pub snapshots_installed: u64,
    /// Snapshot chunks sent, and snapshots streamed in chunks to the end or given up
    /// (`crate::transfer`).
    pub snapshot_chunks_sent: u64,
    pub snapshot_transfers_completed: u64,
    pub snapshot_transfers_failed: u64,
    /// Transactions refused because they would not fit one peer message.
    pub txns_too_large: u64,
    /// Transactions this replica originated, and transactions it answered.
    pub txns_started: u64,
    pub txns_answered: u64,
    /// Lock requests refused because another transaction held a key (each retried).
    pub txn_lock_retries: u64,
    /// `Forget` steps this replica's logs applied (each drops finished transactions' step
    /// records), drivers stopped because their step was refused as forgotten, and clients
    /// answered that their transaction's outcome is unknown (this replica's copy jumped past
    /// it by a snapshot, or its results were too large to carry in the `Finish`).
    pub txn_forgets_applied: u64,
    pub txn_drivers_stopped: u64,
    pub txns_outcome_unknown: u64,
    /// Own commands that found their key locked and waited for the release.
    pub commands_blocked: u64,
    /// Decoupled execution (`tentative`): entries executed before they committed; of those,
    /// entries whose execution committed (their replies came from it) and entries rolled back
    /// because they were lost (a new leader replaced them) or a snapshot replaced the state.
    pub entries_executed_early: u64,
    pub executions_committed: u64,
    pub executions_rolled_back: u64,
    /// Ganged operations (`gang`): originated here; run at this replica's rendezvous; answered
    /// to their client; refused by a log (submitted again); copies proposed for a gang whose
    /// origin had not put it in every log after `retry_timeout`.
    pub gangs_started: u64,
    pub gangs_executed: u64,
    pub gangs_answered: u64,
    pub gangs_refused: u64,
    pub gangs_rescued: u64,
    /// Membership (`members`): peers refused because they came back under a Raft id whose
    /// data they lost; configuration changes this replica proposed as a leader to swap a
    /// node for its replacement; configuration changes applied.
    pub peers_refused: u64,
    pub members_replaced: u64,
    pub conf_changes_applied: u64,
}

/// FNV-1a (64-bit) of the key: the one hash that places keys on shards and logs.
pub(crate) fn fnv1a64(key: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key {
        hash ^= *byte as u64;
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// Which log a key belongs to on a node with one shard: FNV-1a (64-bit) of the key, modulo
/// the number of logs. A fixed function, so every node and every build agree.
pub fn log_of(key: &[u8], logs: usize) -> usize {
    log_in_shard(key, logs, 1)
}

/// Which shard (event loop) of a node a key belongs to: the hash modulo the shard count.
pub fn shard_of(key: &[u8], shards: usize) -> usize {
    (fnv1a64(key) % shards as u64) as usize
}

/// Which of its shard's `logs` logs a key belongs to: the hash with the shard digit removed,
/// so the keys of one shard spread over all of its logs. With one shard this is [`log_of`].
pub fn log_in_shard(key: &[u8], logs: usize, shards: usize) -> usize {
    (fnv1a64(key) / shards as u64 % logs as u64) as usize
}

/// A node's Raft id in incarnation `incarnation`: `(incarnation << 8 | node) + 1`, never 0.
/// A replacement (a new incarnation) is a different Raft member from the node it replaces.
pub(crate) fn raft_id_of(node: NodeId, incarnation: u64) -> u64 {
    ((incarnation << 8) | node.0 as u64) + 1
}

/// A founding member's Raft id (incarnation 0).
fn raft_id(node: NodeId) -> u64 {
    raft_id_of(node, 0)
}

fn node_of(raft_id: u64) -> Option<NodeId> {
    raft_id.checked_sub(1).map(|id| NodeId(id as u8))
}

/// The largest incarnation a Raft id can carry.
pub const INCARNATION_MAX: u64 = (1 << 55) - 1;

/// A batch this replica waits to see applied: its own session's, or one external session
/// request.
#[derive(Debug)]
struct Waiter {
    proposal: Proposal,
    /// Who gets which command's outcome: `(command index, request)`.
    requests: Vec<(usize, ClientRequestId)>,
    own: bool,
    /// A transaction step this replica's driver sent: its result goes to the driver.
    step: Option<(StepKind, u32)>,
    sent_at: Option<Time>,
    /// The Raft id it was last sent (or proposed) to.
    sent_to: u64,
}

/// The `Forget` steps one applied `Finish` asks of this replica.
#[derive(Debug)]
struct ForgetDue {
    txn: TxnId,
    begun: Begun,
    below: u64,
    logs: Vec<usize>,
}

impl ForgetDue {
    fn requests(&self) -> impl Iterator<Item = crate::txn::StepRequest> + '_ {
        let coordinator = u32::try_from(self.begun.coordinator).expect("logs fit u32");
        self.logs.iter().map(move |log| {
            let client = crate::txn::step_client(self.txn, StepKind::Forget, *log, 0, self.begun);
            let step = Step::Forget { txn: self.txn, coordinator, below: self.below };
            let proposal =
                Proposal { client, seq: 1, commands: Vec::new(), step: Some(step), sent_at_index: 0 };
            crate::txn::StepRequest { log: *log, proposal, attempt: 0 }
        })
    }
}

#[derive(Debug)]
struct PendingRead {
    request: ClientRequestId,
    key: Key,
    /// How many of this replica's own updates of the log must be applied before the read
    /// may start: a pipelined `SET k` then `GET k` from one connection reads its write.
    barrier: u64,
}

#[derive(Debug)]
struct ReadRound {
    id: u64,
    started_at: Time,
    /// The leader the ReadIndex request went to (through raft-rs).
    leader: u64,
    reads: Vec<(ClientRequestId, Key)>,
}

struct Group {
    /// This group's log number.
    log: usize,
    raft: RawNode<LogStorage>,
    state: LogState,
    applied_index: u64,
    // ---- origin
    queue: VecDeque<(ClientRequestId, Command)>,
    own_seq: u64,
    own_in_flight: bool,
    updates_accepted: u64,
    updates_applied: u64,
    waiters: BTreeMap<(SessionId, u64), Waiter>,
    /// This replica's own commands that hit a key locked by a transaction: sent again
    /// once this replica's copy shows the lock released.
    blocked: Vec<(ClientRequestId, Command)>,
    // ---- reads
    reads_waiting: VecDeque<PendingRead>,
    /// Confirmed reads of a locked key, served once the lock is released.
    reads_blocked: Vec<(ClientRequestId, Key)>,
    read_round: Option<ReadRound>,
    next_read_round: u64,
    /// Rounds the leader confirmed, waiting for this replica to apply up to their index.
    reads_confirmed: Vec<(u64, Vec<(ClientRequestId, Key)>)>,
    // ---- leader
    to_propose: Vec<Proposal>,
    /// The highest sequence number per client proposed in `proposed_term`: a retry of a
    /// batch already in this leader's log is not proposed again.
    proposed: FxHashMap<SessionId, u64>,
    proposed_term: u64,
    // ---- decoupled execution (tentative.rs)
    /// The results of each tentatively executed entry, oldest first (one list per entry
    /// of `state`'s journal).
    executed: VecDeque<Vec<Executed>>,
    /// The entry `(index, term)` execution stopped at: it runs when it commits.
    execution_stop: Option<(u64, u64)>,
    /// The proposals of entries this replica proposed as leader and has not executed yet,
    /// oldest first: executing them needs no decoding of what was just encoded.
    proposed_entries: VecDeque<ProposedEntry>,
    // ---- snapshots in chunks (crate::transfer)
    snapshots_out: BTreeMap<NodeId, Outgoing>,
    snapshot_in: Option<Incoming>,
    // ---- ganged operations (gang.rs)
    /// Committed entries not applied yet: the log waits at a gang until the rendezvous.
    pending: VecDeque<PendingEntry>,
    scan: GangScan,
    /// The gang the log waits at, and since when.
    gang_wait: Option<(TxnId, Time)>,
    /// Something reached this log since its last flush (a message, a command): the next
    /// flush visits it. Logs nothing touched are skipped unless work spans logs.
    dirty: bool,
    // ---- leader: commit notices (`notice_commits`)
    /// The commit index last told to each follower (by Raft id) in `noticed_term`.
    noticed: Vec<(u64, u64)>,
    noticed_term: u64,
    // ---- persistence (durable only)
    /// The number of the last raft-rs Ready whose records this log queued for the disk.
    ready_written: u64,
    /// The number of the last Ready raft-rs was told is stable (`on_persist_ready`).
    ready_synced: u64,
}

impl Group {
    fn leader(&self) -> u64 {
        self.raft.raft.leader_id
    }

    fn is_leader(&self) -> bool {
        self.raft.raft.state == StateRole::Leader
    }
}

pub struct RaftLog {
    config: RaftLogConfig,
    view: View,
    groups: Vec<Group>,
    next_raft_tick: Time,
    stats: RaftLogStats,
    /// At-most-once on (always, except the `NoSessions` broken variant).
    dedupe: bool,
    /// Reads without ReadIndex (the `LocalReads` broken variant).
    local_reads: bool,
    /// What the runtime must make durable before it sends this call's messages and replies
    /// (only with `config.durable`).
    durable_out: Vec<Record>,
    /// Whether `durable_out` holds a record that must be synced, not only written: anything
    /// but a HardState that moves only the commit index.
    durable_sync_needed: bool,
    /// The last [`DurableTurn::ticket`] handed out.
    durable_ticket: u64,
    /// Per take of durable records that wrote Readies: its ticket and every log's
    /// `ready_written` then, oldest first, until a sync covers it ([`RaftLog::on_synced`]).
    readies_taken: VecDeque<(u64, Vec<u64>)>,
    /// Entries applied (over all logs) since the last compaction.
    applied_since_snapshot: u64,
    /// A snapshot was installed: write a checkpoint at the end of this call.
    checkpoint_due: bool,
    /// Raft ids this replica sent a snapshot to during the current Ready cycle.
    snapshots_sent: Vec<u64>,
    // ---- transactions (crate::txn)
    drivers: BTreeMap<TxnId, Driver>,
    /// Transactions whose `Begin` this replica applied (or found in a snapshot) since the
    /// drivers last ran, with the index the `Begin` ran at.
    txns_begun: Vec<(TxnId, u64, Vec<Command>)>,
    /// `Forget` steps to propose: a `Finish` applied here (`crate::state`, "Forgetting
    /// finished transactions").
    forgets_due: Vec<ForgetDue>,
    /// The clients of transactions this replica originated whose driver stopped before
    /// answering (a step refused as forgotten): answered from the `Finish` when it applies.
    /// Keyed by transaction: its coordinator log, the clients, and the outcomes if the
    /// driver had computed them.
    txn_clients_owed: FxHashMap<TxnId, (usize, Vec<ClientRequestId>, Vec<Outcome>)>,
    step_results: Vec<StepResult>,
    /// The clients (and commands) of transactions this replica originated, until their
    /// driver exists.
    txn_clients: FxHashMap<TxnId, (Vec<ClientRequestId>, Vec<Command>)>,
    next_txn: u64,
    // ---- ganged operations (gang.rs)
    gangs_out: BTreeMap<TxnId, OwnGang>,
    /// A gang was resolved in some log since the flag was cleared: other logs may go on.
    gangs_resolved: bool,
    // ---- membership (members.rs)
    members: Members,
    /// A configuration change added a member: compact every log at the end of this call.
    compaction_due: bool,
    /// The next flush visits every log (a Raft tick, work that spans logs).
    flush_all: bool,
    /// Commit notices for the logs this replica leads, per follower (node, Raft id), sent at
    /// the end of the flush as one `Message::Commits` each.
    commits_out: BTreeMap<(NodeId, u64), Vec<LogCommit>>,
    /// This replica's answers to appends, per leader (node, this replica's Raft id, the
    /// leader's Raft id), sent at the end of the flush as one `Message::AppendAnswers` each.
    answers_out: BTreeMap<(NodeId, u64, u64), Vec<AppendAnswer>>,
}

const READ_CONTEXT_BYTES: usize = 13;

/// A key that another shard of this node serves reached this one (a routing bug).
const OTHER_SHARD: CommandError = CommandError::Unavailable("the key belongs to another shard of this node");

/// A peer refused this node: it came back under its old Raft identity without its data.
const LOST_DATA: CommandError = CommandError::Unavailable(
    "this node lost its data directory and was refused by its peers; replace it (start it with --join)",
);

impl RaftLog {
    pub fn new(config: RaftLogConfig) -> RaftLog {
        assert!(config.logs >= 1, "at least one log");
        let groups = (0..config.logs).map(|log| new_group(&config, log, None)).collect();
        RaftLog::with_groups(config, groups)
    }

    fn with_groups(config: RaftLogConfig, groups: Vec<Group>) -> RaftLog {
        // (`ignore_locks` is the NoTxnLocks bug, set on every state machine below.)
        assert!(config.logs >= 1, "at least one log");
        assert!(config.shard < config.shards, "the shard is one of the node's shards");
        assert!(u32::try_from(config.logs).is_ok(), "log numbers travel as u32");
        assert!(config.members.contains(config.me), "a node is a member of its own cluster");
        assert!(config.batch_commands_max >= 1, "a batch holds at least one command");
        assert!(config.retry_timeout > Time::ZERO, "retry_timeout must be positive");
        assert!(config.incarnation <= INCARNATION_MAX, "incarnations fit a Raft id");
        assert!(!config.joining || config.incarnation != 0, "a replacement has a new incarnation");
        assert_eq!(groups.len(), config.logs);
        #[cfg(feature = "broken-variants")]
        let (dedupe, local_reads, ignore_locks, runs_forgotten_steps) = (
            config.bug != Some(crate::config::Bug::NoSessions),
            config.bug == Some(crate::config::Bug::LocalReads),
            config.bug == Some(crate::config::Bug::NoTxnLocks),
            config.bug == Some(crate::config::Bug::RunsForgottenSteps),
        );
        #[cfg(not(feature = "broken-variants"))]
        let (dedupe, local_reads, ignore_locks, runs_forgotten_steps) = (true, false, false, false);
        let mut groups = groups;
        for group in &mut groups {
            group.state.ignore_locks = ignore_locks;
            group.state.runs_forgotten_steps = runs_forgotten_steps;
            group.state.session_expiry_entries = config.session_expiry_entries;
        }
        RaftLog {
            view: View { epoch: Epoch(1), live: config.members },
            next_raft_tick: config.raft_tick_period,
            groups,
            stats: RaftLogStats::default(),
            dedupe,
            local_reads,
            durable_out: Vec::new(),
            durable_sync_needed: false,
            durable_ticket: 0,
            readies_taken: VecDeque::new(),
            applied_since_snapshot: 0,
            checkpoint_due: false,
            snapshots_sent: Vec::new(),
            drivers: BTreeMap::new(),
            txns_begun: Vec::new(),
            step_results: Vec::new(),
            txn_clients: FxHashMap::default(),
            forgets_due: Vec::new(),
            txn_clients_owed: FxHashMap::default(),
            next_txn: 0,
            gangs_out: BTreeMap::new(),
            gangs_resolved: false,
            members: Members::default(),
            compaction_due: false,
            flush_all: true,
            commits_out: BTreeMap::new(),
            answers_out: BTreeMap::new(),
            config,
        }
    }

    /// Rebuild a replica from what a previous incarnation persisted: the last checkpoint
    /// (state machine with session table, HardState and unapplied entries of every log) and
    /// every record after it. The replica rejoins under its old id: its vote and log are
    /// what it promised before the crash. Committed entries after the checkpoint are applied
    /// again through raft-rs (`Config::applied` is the checkpoint's index).
    ///
    /// Errors on records that do not fit together (a corrupt data directory).
    pub fn restore(config: RaftLogConfig, recovered: Recovered) -> Result<RaftLog, String> {
        if recovered.is_empty() {
            return Ok(RaftLog::new(config));
        }
        let founding = RaftLog::founding_conf(&config);
        let mut storages: Vec<(LogStorage, LogState)> = (0..config.logs)
            .map(|_| (LogStorage::with_conf_state(founding.clone()), LogState::default()))
            .collect();
        let mut identities = BTreeMap::new();
        if let Some(checkpoint) = &recovered.checkpoint {
            if checkpoint.logs.len() != config.logs {
                return Err(format!(
                    "the data directory holds {} logs but `logs` is {}: the number of logs cannot change",
                    checkpoint.logs.len(),
                    config.logs
                ));
            }
            for (log, saved) in checkpoint.logs.iter().enumerate() {
                let (storage, state) = &mut storages[log];
                let mut snapshot = Snapshot::default();
                snapshot.mut_metadata().index = saved.snapshot_index;
                snapshot.mut_metadata().term = saved.snapshot_term;
                let conf_state = saved.conf_state.clone().unwrap_or_else(|| founding.clone());
                snapshot.mut_metadata().set_conf_state(conf_state);
                let state_bytes = saved.state.bytes();
                snapshot.data = state_bytes.clone();
                storage.apply_snapshot(snapshot);
                storage.set_hard_state(saved.hard_state());
                storage
                    .append(&saved.entries)
                    .map_err(|error| format!("checkpoint of log {log}: {error}"))?;
                // A log that had applied nothing when the checkpoint was taken (its first
                // election still pending) was never compacted: its state is the empty one,
                // saved as no bytes. Such a node used to refuse to restart (the simulator's
                // power losses found it).
                *state = if saved.snapshot_index == 0 && state_bytes.is_empty() {
                    LogState::default()
                } else {
                    LogState::decode(state_bytes)
                        .map_err(|error| format!("checkpoint of log {log}: state machine: {error}"))?
                };
            }
        }
        for record in recovered.records {
            match record {
                Record::Entries { log, entries } => {
                    let (storage, _) = storages
                        .get_mut(log as usize)
                        .ok_or_else(|| format!("a record names log {log}, beyond `logs`"))?;
                    storage.append(&entries).map_err(|error| format!("log {log}: {error}"))?;
                }
                Record::HardState { log, term, vote, commit } => {
                    let (storage, _) = storages
                        .get_mut(log as usize)
                        .ok_or_else(|| format!("a record names log {log}, beyond `logs`"))?;
                    let hard_state = raft::prelude::HardState { term, vote, commit, ..Default::default() };
                    storage.set_hard_state(hard_state);
                }
                Record::Identity { raft_id, identity } => {
                    identities.insert(raft_id, identity);
                }
                Record::Checkpoint(_) => return Err("a checkpoint inside the log".to_string()),
            }
        }
        let groups = storages
            .into_iter()
            .enumerate()
            .map(|(log, restored)| new_group(&config, log, Some(restored)))
            .collect();
        let mut replica = RaftLog::with_groups(config, groups);
        if let Some(checkpoint) = &recovered.checkpoint {
            replica.members.identities.extend(checkpoint.identities.iter().copied());
        }
        replica.members.identities.extend(identities);
        replica.resume_txns_in_progress();
        Ok(replica)
    }

    /// Records the runtime must write before it performs this call's outbox, and whether it
    /// must also sync them first. A turn whose only records move commit indexes needs no sync:
    /// the commit index is volatile state (Raft §5, Figure 2), which a restarted node learns
    /// again from the leader, so losing it loses nothing acknowledged. Such a turn (a leader
    /// taking acknowledgements, a follower told of a commit) answers without waiting for the
    /// disk; the next syncing turn makes its records stable with everything else.
    ///
    /// raft-rs learns that the records are stable only from [`Self::on_synced`] (its
    /// asynchronous persistence: `advance_append_async`, `on_persist_ready`). Until then a
    /// leader does not count itself toward committing its new entries and no replica applies
    /// them, so nothing a message or reply of a later call says can rest on records that are
    /// not stable yet, and the runtime may run further calls while the sync is under way.
    pub fn take_durable(&mut self) -> DurableTurn {
        self.durable_ticket += 1;
        // Compared in place: most takes (every turn of the loop) wrote no new Ready.
        let unsynced = match self.readies_taken.back() {
            Some((_, last)) => self.groups.iter().zip(last).any(|(group, mark)| group.ready_written != *mark),
            None => self.groups.iter().any(|group| group.ready_written > group.ready_synced),
        };
        if unsynced {
            let written = self.groups.iter().map(|group| group.ready_written).collect();
            self.readies_taken.push_back((self.durable_ticket, written));
        }
        let sync = std::mem::take(&mut self.durable_sync_needed);
        DurableTurn { records: std::mem::take(&mut self.durable_out), sync, ticket: self.durable_ticket }
    }

    /// Every record of the takes up to `ticket` ([`DurableTurn::ticket`]) is stable: raft-rs
    /// may count this replica's copies of their entries (a leader toward a commit) and apply
    /// them. What that makes possible (commits, replies, appends) is done at once.
    pub fn on_synced(&mut self, ticket: u64, now: Time, out: &mut Outbox<Message>) {
        let mut covered = None;
        while self.readies_taken.front().is_some_and(|(taken, _)| *taken <= ticket) {
            covered = self.readies_taken.pop_front().map(|(_, marks)| marks);
        }
        let Some(marks) = covered else { return };
        for (group, number) in self.groups.iter_mut().zip(marks) {
            if number > group.ready_synced {
                group.raft.on_persist_ready(number);
                group.ready_synced = number;
                group.dirty = true;
            }
        }
        // A call of its own, flushed at once: its runtime may have no turn end coming.
        self.flush(now, out);
    }

    /// Whether the records queued since the last [`Self::take_durable`] need a sync.
    pub fn records_need_sync(&self) -> bool {
        self.durable_sync_needed
    }

    /// Queue `record` for the disk; every record but a commit-only HardState needs a sync.
    fn push_durable(&mut self, record: Record, sync: bool) {
        self.durable_sync_needed |= sync;
        self.durable_out.push(record);
    }

    /// The cluster this replica belongs to.
    pub fn members(&self) -> NodeSet {
        self.config.members
    }

    pub fn config(&self) -> &RaftLogConfig {
        &self.config
    }

    pub fn stats(&self) -> RaftLogStats {
        self.stats
    }

    /// The latest view the membership service installed (informational: Raft's own quorums
    /// decide who serves; see docs/protocols/raftlog.md).
    pub fn view(&self) -> View {
        self.view
    }

    pub fn logs(&self) -> usize {
        self.groups.len()
    }

    pub fn log_of(&self, key: &[u8]) -> usize {
        log_in_shard(key, self.groups.len(), self.config.shards)
    }

    /// Whether `key` belongs to this core's shard. The server routes every key to its shard;
    /// a key of another shard here would be a routing bug, refused rather than misplaced.
    pub fn owns(&self, key: &[u8]) -> bool {
        shard_of(key, self.config.shards) == self.config.shard
    }

    /// The leader this replica knows for `log`, if any.
    pub fn leader_of(&self, log: usize) -> Option<NodeId> {
        node_of(self.groups[log].leader())
    }

    pub fn is_leader(&self, log: usize) -> bool {
        self.groups[log].is_leader()
    }

    pub fn term(&self, log: usize) -> u64 {
        self.groups[log].raft.raft.term
    }

    pub fn applied_index(&self, log: usize) -> u64 {
        self.groups[log].applied_index
    }

    /// Replicas known to hold entry `index` of `log` (for WAIT): this one once it has applied
    /// it; at the log's leader, every follower whose log matches the leader's that far (Raft's
    /// match index); at a follower that applied it, the leader it knows, which holds every
    /// committed entry (Leader Completeness). Never a replica merely assumed to be in the
    /// majority that committed it.
    pub fn replicas_holding(&self, log: usize, index: u64) -> NodeSet {
        let group = &self.groups[log];
        let mut holders = NodeSet::EMPTY;
        if group.applied_index < index {
            return holders;
        }
        holders.insert(self.config.me);
        if group.is_leader() {
            // Not a predecessor that a joint configuration still lists: its node now runs
            // its replacement, which may not hold the entry.
            let current = group.raft.raft.prs().conf().to_conf_state();
            for (id, progress) in group.raft.raft.prs().iter() {
                if !current.voters.contains(id) && !current.learners.contains(id) {
                    continue;
                }
                if let Some(node) = node_of(*id).filter(|_| progress.matched >= index) {
                    holders.insert(node);
                }
            }
        } else if let Some(leader) = node_of(group.leader()) {
            holders.insert(leader);
        }
        holders
    }

    /// This replica's applied copy of `key` (not a linearizable read).
    pub fn applied_value(&self, key: &[u8]) -> Option<&chorus_core::Value> {
        self.groups[self.log_of(key)].state.get(key)
    }

    pub fn key_count(&self) -> usize {
        self.groups.iter().map(|group| group.state.key_count()).sum()
    }

    /// Every key this replica's applied copies hold (every replica applies every log, so
    /// this is every key the cluster committed up to this replica's applied indexes).
    pub fn keys(&self) -> impl Iterator<Item = &Key> {
        self.groups.iter().flat_map(|group| group.state.keys())
    }

    /// What `client` last executed in `log`, as this replica has applied it.
    /// Session records held over all logs (bounded by session expiry).
    pub fn session_records(&self) -> usize {
        self.groups.iter().map(|group| group.state.session_count()).sum()
    }

    /// Transaction steps' session records held over all logs (bounded by forgetting).
    pub fn step_records(&self) -> usize {
        self.groups.iter().map(|group| group.state.step_records()).sum()
    }

    /// Keys locked by a transaction, over all logs.
    pub fn locked_keys(&self) -> usize {
        self.groups.iter().map(|group| group.state.locked_keys()).sum()
    }

    /// Every lock over all logs, with the transaction holding it (for tests' invariants).
    pub fn locks(&self) -> Vec<(Key, TxnId)> {
        let locks = self.groups.iter().flat_map(|group| group.state.debug_locks());
        locks.map(|(key, txn)| (key.clone(), *txn)).collect()
    }

    /// Whether this replica's copy of `txn`'s coordinator log has it begun and not finished.
    pub fn txn_in_progress(&self, txn: &TxnId) -> bool {
        self.groups.iter().any(|group| group.state.txn_in_progress(txn))
    }

    pub fn session(&self, log: usize, client: SessionId) -> Option<&SessionRecord> {
        self.groups[log].state.session(client)
    }

    /// Client requests this replica has accepted and not answered yet.
    pub fn pending_requests(&self) -> usize {
        self.groups
            .iter()
            .map(|group| {
                group.queue.len()
                    + group.waiters.values().map(|waiter| waiter.requests.len()).sum::<usize>()
                    + group.reads_waiting.len()
                    + group.blocked.len()
                    + group.reads_blocked.len()
                    + group.read_round.as_ref().map_or(0, |round| round.reads.len())
                    + group.reads_confirmed.iter().map(|(_, reads)| reads.len()).sum::<usize>()
            })
            .sum::<usize>()
            + self.gangs_out.values().map(|own| own.requests.len()).sum::<usize>()
    }

    /// A request of an external client session (Cyclone §3.4): `client` must be unique to
    /// that client and `seq` must grow with each of its requests, one outstanding at a time.
    /// A retry (same `client` and `seq`, at any replica) gets the saved outcome of the first
    /// execution instead of running again; a sequence number older than the client's last
    /// executed one is refused with a `stale sequence number` error.
    pub fn on_session_command(
        &mut self,
        now: Time,
        request: ClientRequestId,
        client: u64,
        seq: u64,
        command: Command,
        out: &mut Outbox<Message>,
    ) {
        if !self.owns(command.key()) {
            out.reply(request, Outcome::Error(OTHER_SHARD));
            return;
        }
        let log = self.log_of(command.key());
        let group = &mut self.groups[log];
        if let Some(waiter) = group.waiters.get_mut(&(SessionId::External(client), seq)) {
            // The same request again, while the first copy is still in flight: both get the
            // one outcome.
            waiter.requests.push((0, request));
        } else {
            let client = SessionId::External(client);
            let sent_at_index = group.applied_index;
            let proposal = Proposal { client, seq, commands: vec![command], step: None, sent_at_index };
            let waiter = Waiter::new(proposal, vec![(0, request)], false, None);
            register_waiter(group, waiter, self.dedupe, out, &mut self.step_results, &mut self.stats);
        }
        self.groups[log].dirty = true;
        self.after_call(now, out);
    }

    /// A multi-key transaction (RESP `MULTI`/`EXEC`): `requests[i]` gets the outcome of
    /// `requests[i].1`, all of them executed atomically with respect to every other command
    /// and transaction, across logs (`crate::txn`). Replies arrive once every log applied
    /// the transaction's updates.
    pub fn on_transaction(
        &mut self,
        now: Time,
        requests: Vec<(ClientRequestId, Command)>,
        out: &mut Outbox<Message>,
    ) {
        if requests.is_empty() {
            return;
        }
        if !requests.iter().all(|(_, command)| self.owns(command.key())) {
            for (request, _) in requests {
                out.reply(request, Outcome::Error(OTHER_SHARD));
            }
            return;
        }
        let bytes: usize = requests.iter().map(|(_, command)| crate::message::command_bytes(command)).sum();
        if bytes > self.config.batch_bytes_max() {
            // Its Begin step carries every command in one entry; it cannot be split.
            self.stats.txns_too_large += 1;
            for (request, _) in requests {
                out.reply(
                    request,
                    Outcome::Error(CommandError::Unavailable(
                        "the transaction is larger than one peer message can carry; split it",
                    )),
                );
            }
            return;
        }
        if self.config.ganged {
            let (requests, commands) = requests.into_iter().unzip();
            self.submit_gang(OwnGang { requests, commands });
            self.flush_all = true;
            self.after_call(now, out);
            return;
        }
        self.next_txn += 1;
        self.stats.txns_started += 1;
        let txn = TxnId { origin: self.config.session_client_id, number: self.next_txn };
        let (clients, commands): (Vec<ClientRequestId>, Vec<Command>) = requests.into_iter().unzip();
        let coordinator = self.log_of(commands[0].key());
        self.txn_clients.insert(txn, (clients, commands.clone()));
        let client = crate::txn::step_client(txn, StepKind::Begin, coordinator, 0, Begun::default());
        let step = Some(Step::Begin { txn, commands });
        let group = &mut self.groups[coordinator];
        // A `Begin`'s record expires as a session's does: its retries keep this index.
        let sent_at_index = group.applied_index;
        let proposal = Proposal { client, seq: 1, commands: Vec::new(), step, sent_at_index };
        let waiter = Waiter::new(proposal, Vec::new(), false, Some((StepKind::Begin, 0)));
        register_waiter(group, waiter, self.dedupe, out, &mut self.step_results, &mut self.stats);
        self.flush_all = true;
        self.after_call(now, out);
    }

    /// A description of every driver and lock, for test failure messages.
    pub fn debug_txns(&self) -> String {
        let mut text = String::new();
        for driver in self.drivers.values() {
            text.push_str(&format!("{driver:?}\n"));
        }
        for group in &self.groups {
            let raft = &group.raft.raft;
            text.push_str(&format!(
                "log {} applied {} commit {} last {} snap {} term {} role {:?} leader {} locks {:?} waiters {:?}\n",
                group.log,
                group.applied_index,
                raft.raft_log.committed,
                raft.raft_log.last_index(),
                group.raft.store().snapshot_index(),
                raft.term,
                raft.state,
                raft.leader_id,
                group.state.debug_locks(),
                group.waiters.iter().map(|(k, w)| (k.0, w.sent_at, w.sent_to)).collect::<Vec<_>>()
            ));
        }
        text
    }

    /// Transactions this replica is driving (its own and everyone else's in progress).
    pub fn txns_driven(&self) -> usize {
        self.drivers.len()
    }

    /// Every transaction the applied state says is in progress gets a driver (after a
    /// restart or a snapshot install: whoever was driving it may be gone).
    fn resume_txns_in_progress(&mut self) {
        for group in &self.groups {
            for (txn, begun_at, commands) in group.state.txns_in_progress() {
                self.txns_begun.push((*txn, begun_at, commands.clone()));
            }
        }
    }

    /// Start drivers for begun transactions, feed them step results, send what they want.
    /// Returns whether anything happened.
    fn drive_txns(&mut self, now: Time, out: &mut Outbox<Message>) -> bool {
        if self.txns_begun.is_empty()
            && self.step_results.is_empty()
            && self.drivers.is_empty()
            && self.forgets_due.is_empty()
        {
            return false;
        }
        let mut progressed = !self.txns_begun.is_empty() || !self.step_results.is_empty();
        for (txn, begun_at, commands) in std::mem::take(&mut self.txns_begun) {
            self.start_driver(txn, begun_at, commands);
        }
        for result in std::mem::take(&mut self.step_results) {
            if result.kind == StepKind::Begin {
                self.on_own_begin(result.txn, out);
                progressed = true;
                continue;
            }
            if result.kind == StepKind::Lock && result.outcomes.first() == Some(&Outcome::Flag(false)) {
                self.stats.txn_lock_retries += 1;
            }
            let Some(driver) = self.drivers.get_mut(&result.txn) else { continue };
            if result.outcomes == [FORGOTTEN] {
                let coordinator = driver.coordinator();
                let (clients, outcomes) = driver.stop();
                self.stats.txn_drivers_stopped += 1;
                self.owe_or_give_up(result.txn, coordinator, clients, outcomes, out);
                continue;
            }
            for (request, outcome) in driver.on_result(&result, now, self.config.retry_timeout) {
                self.stats.txns_answered += 1;
                out.reply(request, outcome);
            }
        }
        self.drivers.retain(|_, driver| !driver.is_done());
        let mut requests = Vec::new();
        for driver in self.drivers.values_mut() {
            requests.extend(driver.due(now));
        }
        for forget in std::mem::take(&mut self.forgets_due) {
            requests.extend(forget.requests());
            // No driver may be left to make this flush visit every log: send them now.
            self.flush_all = true;
        }
        for request in requests {
            progressed = true;
            let kind = StepKind::of(request.proposal.step.as_ref().expect("a step"));
            let waiter = Waiter::new(request.proposal, Vec::new(), false, Some((kind, request.attempt)));
            let group = &mut self.groups[request.log];
            if group.waiters.contains_key(&(waiter.proposal.client, waiter.proposal.seq)) {
                continue;
            }
            register_waiter(group, waiter, self.dedupe, out, &mut self.step_results, &mut self.stats);
        }
        progressed
    }

    /// A driver for a transaction whose `Begin` this replica applied (at `begun_at` in its
    /// coordinator log), with the origin's clients if this replica is the origin.
    fn start_driver(&mut self, txn: TxnId, begun_at: u64, commands: Vec<Command>) -> &mut Driver {
        let layout = (self.groups.len(), self.config.shards);
        let batch_bytes_max = self.config.batch_bytes_max();
        let driver = self
            .drivers
            .entry(txn)
            .or_insert_with(|| Driver::new(txn, commands, begun_at, layout, batch_bytes_max));
        if let Some((clients, _)) = self.txn_clients.remove(&txn) {
            driver.replies = clients;
        }
        driver
    }

    /// The origin's own `Begin` is settled. Normally applying it started the driver, which
    /// took the clients. A snapshot that covers the `Begin` did not: if the transaction is
    /// still in progress there, drive it here; if it is over (the copy jumped past its
    /// `Finish`), or the `Begin` was refused as expired, its outcomes are not known here.
    fn on_own_begin(&mut self, txn: TxnId, out: &mut Outbox<Message>) {
        let Some((clients, commands)) = self.txn_clients.remove(&txn) else { return };
        if let Some(driver) = self.drivers.get_mut(&txn) {
            driver.replies = clients;
            return;
        }
        let coordinator = self.log_of(commands[0].key());
        match self.groups[coordinator].state.begun_at(&txn) {
            Some(begun_at) => self.start_driver(txn, begun_at, commands).replies = clients,
            None => self.answer_outcome_unknown(clients, out),
        }
    }

    /// A driver stopped (its transaction finished elsewhere) still owing `clients` their
    /// outcomes: the `Finish` carries them, so wait for it here, unless this replica's
    /// coordinator log is already past it (then only what the driver computed can answer).
    fn owe_or_give_up(
        &mut self,
        txn: TxnId,
        coordinator: usize,
        clients: Vec<ClientRequestId>,
        computed: Vec<Outcome>,
        out: &mut Outbox<Message>,
    ) {
        if clients.is_empty() {
            return;
        }
        if !self.groups[coordinator].state.txn_in_progress(&txn) {
            self.answer_txn(clients, &[], &computed, out);
            return;
        }
        self.txn_clients_owed.insert(txn, (coordinator, clients, computed));
    }

    /// Answer a finished transaction's clients: from the outcomes its `Finish` carried, or
    /// else those a driver here computed, or else "outcome unknown" (it did run).
    fn answer_txn(
        &mut self,
        clients: Vec<ClientRequestId>,
        carried: &[Outcome],
        computed: &[Outcome],
        out: &mut Outbox<Message>,
    ) {
        let outcomes = [carried, computed].into_iter().find(|outcomes| outcomes.len() == clients.len());
        let Some(outcomes) = outcomes else {
            self.answer_outcome_unknown(clients, out);
            return;
        };
        for (request, outcome) in clients.into_iter().zip(outcomes.iter().cloned()) {
            self.stats.txns_answered += 1;
            out.reply(request, outcome);
        }
    }

    fn answer_outcome_unknown(&mut self, clients: Vec<ClientRequestId>, out: &mut Outbox<Message>) {
        for client in clients {
            self.stats.txns_outcome_unknown += 1;
            out.reply(client, Outcome::Error(CommandError::OutcomeUnknown));
        }
    }

    /// `Finish(txn)` ran in coordinator log `log`: the transaction is over. Its driver here
    /// stops; clients this replica still owes are answered from the outcomes the `Finish`
    /// carries; and this replica proposes the `Forget` steps (`crate::state`).
    fn on_finish_applied(
        &mut self,
        log: usize,
        client: SessionId,
        txn: TxnId,
        outcomes: &[Outcome],
        logs: &[u32],
        out: &mut Outbox<Message>,
    ) {
        // Whoever here still owes the clients: the origin's driver, or what it left owed.
        let (mut clients, mut computed) =
            self.drivers.remove(&txn).map(|mut driver| driver.stop()).unwrap_or_default();
        if let Some((_, owed, owed_computed)) = self.txn_clients_owed.remove(&txn) {
            clients.extend(owed);
            computed = owed_computed;
        }
        // Its `Begin` applied in the same pass (this copy was behind): no driver is needed.
        self.txns_begun.retain(|(begun, ..)| *begun != txn);
        if let Some((owed, _)) = self.txn_clients.remove(&txn) {
            clients.extend(owed);
        }
        if !clients.is_empty() {
            // A `Finish` carries no outcomes over 64 KiB: then the driver's, if it has them.
            self.answer_txn(clients, outcomes, &computed, out);
        }
        let record = self.groups[log].state.session(client).expect("a Finish just ran");
        let Some(Outcome::Integer(below)) = record.outcomes.first() else {
            unreachable!("a Finish's outcome is its watermark")
        };
        let (_, begun_at) = client.forgettable_step().expect("a Finish is a forgettable step");
        let mut forget_logs: Vec<usize> = logs.iter().map(|log| *log as usize).collect();
        forget_logs.push(log);
        forget_logs.sort_unstable();
        forget_logs.dedup();
        forget_logs.retain(|log| *log < self.groups.len());
        self.forgets_due.push(ForgetDue {
            txn,
            begun: Begun { coordinator: log, index: begun_at },
            below: u64::try_from(*below).expect("a watermark is an index"),
            logs: forget_logs,
        });
    }

    // ------------------------------------------------------------------ the turn

    /// Everything a call leaves to do, for every log: form this replica's next batch, send
    /// what is due, start a ReadIndex round, propose what the leader collected as one entry,
    /// and run the raft-rs Ready cycle (messages out, entries applied, reads answered).
    /// Applying can complete a batch and free the way for the next, hence the loop.
    fn flush(&mut self, now: Time, out: &mut Outbox<Message>) {
        self.greet(now, out);
        self.rescue_gangs(now);
        for _ in 0..4 {
            self.drive_txns(now, out);
            self.flush_logs(now, out);
            let resubmitted = self.answer_own_gangs(out);
            if self.txns_begun.is_empty() && self.step_results.is_empty() && !resubmitted {
                break;
            }
        }
        self.send_append_answers(out);
        self.send_commit_notices(out);
        self.maybe_snapshot();
    }

    /// The end of a call: flush now, or at the end of the turn (`flush_at_turn_end`).
    fn after_call(&mut self, now: Time, out: &mut Outbox<Message>) {
        if !self.config.flush_at_turn_end {
            self.flush(now, out);
        }
    }

    /// Work that spans logs (transactions, gangs, a waiting rendezvous, a replacement):
    /// every log is visited while there is any.
    fn spans_logs(&self) -> bool {
        !self.drivers.is_empty()
            || !self.txns_begun.is_empty()
            || !self.step_results.is_empty()
            || !self.gangs_out.is_empty()
            || !self.members.joiners.is_empty()
            || self.groups.iter().any(|group| !group.pending.is_empty())
    }

    fn flush_logs(&mut self, now: Time, out: &mut Outbox<Message>) {
        let all = std::mem::take(&mut self.flush_all) || self.spans_logs();
        for log in 0..self.groups.len() {
            if !std::mem::take(&mut self.groups[log].dirty) && !all {
                continue;
            }
            for _ in 0..4 {
                self.execute_held_entries(log);
                self.dispatch_own_batch(log, out);
                self.send_waiters(log, now, out);
                self.start_read_round(log, now);
                self.propose(log);
                self.propose_replacements(log);
                let ready = self.handle_ready(log, out);
                self.pump_snapshots(log, now, out);
                if !ready {
                    break;
                }
            }
            self.notice_commits(log);
        }
    }

    /// As leader of `log`: note for each follower how far the log is committed, up to the
    /// follower's match index (Raft's, as a heartbeat carries it: the follower holds this
    /// leader's entries that far, so it may commit them). raft-rs would instead send every
    /// follower an empty append for each commit of each log, and each follower would answer
    /// it (`skip_bcast_commit` turns that off); these notices leave once per flush, one
    /// message per follower for all logs. A follower that already reported the commit in an
    /// append response is not told again.
    fn notice_commits(&mut self, log: usize) {
        let me = self.my_raft_id();
        let (members, my_node) = (self.config.members, self.config.me);
        let group = &mut self.groups[log];
        if !group.is_leader() {
            return;
        }
        let raft = &group.raft.raft;
        if group.noticed_term != raft.term {
            group.noticed.clear();
            group.noticed_term = raft.term;
        }
        let committed = raft.raft_log.committed;
        for (id, progress) in raft.prs().iter() {
            let commit = committed.min(progress.matched);
            if *id == me || commit <= progress.committed_index {
                continue;
            }
            let noticed = match group.noticed.iter_mut().find(|(follower, _)| follower == id) {
                Some((_, noticed)) => noticed,
                None => {
                    group.noticed.push((*id, 0));
                    &mut group.noticed.last_mut().expect("just pushed").1
                }
            };
            if commit <= *noticed {
                continue;
            }
            *noticed = commit;
            // (Not to a node whose predecessor a joint configuration still lists: it is not it.)
            let Some(node) = node_of(*id).filter(|node| members.contains(*node) && *node != my_node) else {
                continue;
            };
            let notice = LogCommit { log: log as u32, term: raft.term, commit };
            self.commits_out.entry((node, *id)).or_default().push(notice);
        }
    }

    fn send_commit_notices(&mut self, out: &mut Outbox<Message>) {
        let from = self.my_raft_id();
        for ((node, to), commits) in std::mem::take(&mut self.commits_out) {
            out.send(node, Message::Commits { from, to, commits });
        }
    }

    /// A follower's append responses of this flush leave as one message per leader for all
    /// logs (raft-rs would send one per log and append). Each is still the exact message
    /// raft-rs wrote (`AppendAnswer::of` takes only those it rebuilds field for field), and the
    /// leader steps them in the order they were written; the runtime persists the flush's
    /// records before anything leaves, so an answer never precedes what it acknowledges.
    fn send_append_answers(&mut self, out: &mut Outbox<Message>) {
        for ((node, from, to), answers) in std::mem::take(&mut self.answers_out) {
            out.send(node, Message::AppendAnswers { from, to, answers });
        }
    }

    /// A follower's append answers (`send_append_answers`): each is stepped into its log as
    /// the `MsgAppendResponse` it stands for, through the checks every Raft message passes.
    fn on_append_answers(&mut self, from: NodeId, follower: u64, to: u64, answers: Vec<AppendAnswer>) {
        for answer in answers {
            self.step_raft(from, answer.log, answer.to_raft(follower, to));
        }
    }

    /// Hand a peer's Raft message of `log` to raft-rs, unless `acceptable` refuses it.
    fn step_raft(&mut self, from: NodeId, log: u32, mut message: raft::prelude::Message) {
        let me = self.my_raft_id();
        let Some(group) = self.groups.get_mut(log as usize) else {
            self.stats.messages_refused += 1;
            return;
        };
        if !acceptable(&message, from, me, self.config.members) {
            self.stats.messages_refused += 1;
            return;
        }
        group.dirty = true;
        guard_log_length(&mut group.raft, &mut message);
        // A stale or out-of-order message is the sender's problem, not a reason to stop.
        let _ = group.raft.step(message);
    }

    /// A leader's commit notices (`notice_commits`): each log whose leader in the notice's term
    /// is the sender commits that far (clamped to what it holds, as a heartbeat is).
    fn on_commits(&mut self, from: NodeId, leader: u64, to: u64, commits: Vec<LogCommit>) {
        if to != self.my_raft_id() || node_of(leader) != Some(from) {
            self.stats.messages_refused += 1;
            return;
        }
        for LogCommit { log, term, commit } in commits {
            let Some(group) = self.groups.get_mut(log as usize) else {
                self.stats.messages_refused += 1;
                continue;
            };
            let raft = &mut group.raft.raft;
            if raft.term != term || raft.leader_id != leader || raft.state != StateRole::Follower {
                continue; // from another term: the sender's match index says nothing now
            }
            let commit = commit.min(raft.raft_log.last_index());
            if commit > raft.raft_log.committed {
                raft.raft_log.commit_to(commit);
                group.dirty = true;
            }
        }
    }

    /// Turn queued updates into this replica's next batch, unless one is in flight.
    fn dispatch_own_batch(&mut self, log: usize, out: &mut Outbox<Message>) {
        let group = &mut self.groups[log];
        if group.own_in_flight || group.queue.is_empty() {
            return;
        }
        // Bounded by count and by bytes: a batch travels as one message (at least one
        // command, which always fits).
        let bytes_max = self.config.batch_bytes_max();
        let mut bytes = 0;
        let count = group
            .queue
            .iter()
            .take(self.config.batch_commands_max)
            .take_while(|(_, command)| {
                bytes += crate::message::command_bytes(command);
                bytes <= bytes_max
            })
            .count()
            .max(1);
        let mut commands = Vec::with_capacity(count);
        let mut requests = Vec::with_capacity(count);
        for (index, (request, command)) in group.queue.drain(..count).enumerate() {
            commands.push(command);
            requests.push((index, request));
        }
        group.own_seq += 1;
        group.own_in_flight = true;
        let client = SessionId::Replica(self.config.session_client_id);
        let sent_at_index = group.applied_index;
        let proposal = Proposal { client, seq: group.own_seq, commands, step: None, sent_at_index };
        let waiter = Waiter::new(proposal, requests, true, None);
        register_waiter(group, waiter, self.dedupe, out, &mut self.step_results, &mut self.stats);
    }

    /// Send every waiting batch that was never sent, whose leader changed, or whose retry
    /// timeout ran out, to the log's leader (or propose it, if we lead).
    fn send_waiters(&mut self, log: usize, now: Time, out: &mut Outbox<Message>) {
        let retry_timeout = self.config.retry_timeout;
        let me = self.my_raft_id();
        let group = &mut self.groups[log];
        let leader = group.leader();
        if leader == INVALID_ID || group.waiters.is_empty() {
            return; // Nobody to send to yet: the next call after an election sends.
        }
        let mut to_accept = Vec::new();
        for waiter in group.waiters.values_mut() {
            let due = match waiter.sent_at {
                None => true,
                Some(at) => waiter.sent_to != leader || now >= at + retry_timeout,
            };
            if !due {
                continue;
            }
            if waiter.sent_at.is_some() {
                self.stats.batches_resent += 1;
            }
            waiter.sent_at = Some(now);
            waiter.sent_to = leader;
            if leader == me {
                to_accept.push(waiter.proposal.clone());
            } else if let Some(node) = node_of(leader).filter(|node| *node != self.config.me) {
                self.stats.batches_forwarded += 1;
                out.send(
                    node,
                    Message::Forward { log: log as u32, proposal: waiter.proposal.clone(), relayed: false },
                );
            }
        }
        for proposal in to_accept {
            self.accept_proposal(log, proposal);
        }
    }

    /// As leader: take a batch into the next entry, unless it already executed or is already
    /// in this leader's log.
    fn accept_proposal(&mut self, log: usize, proposal: Proposal) {
        let group = &mut self.groups[log];
        if !group.is_leader() {
            return;
        }
        let term = group.raft.raft.term;
        if group.proposed_term != term {
            group.proposed.clear();
            group.proposed_term = term;
        }
        if let Some(Step::Gang { gang, .. }) = &proposal.step {
            if group.state.gang(gang).is_some() || group.scan.decided.contains_key(gang) {
                return; // already in this log
            }
        }
        if self.dedupe {
            // Executed already: its origin learns the outcome when it applies that entry.
            if group.state.executed_seq(proposal.client) >= proposal.seq {
                return;
            }
            if group.proposed.get(&proposal.client).is_some_and(|&seq| seq >= proposal.seq) {
                return;
            }
        }
        group.proposed.insert(proposal.client, proposal.seq);
        group.to_propose.push(proposal);
    }

    /// Propose everything accepted during this call as one Raft entry, or as several when it
    /// would not fit one peer message (each holds at least one proposal).
    fn propose(&mut self, log: usize) {
        let group = &mut self.groups[log];
        if group.to_propose.is_empty() {
            return;
        }
        if !group.is_leader() {
            group.to_propose.clear();
            group.proposed.clear();
            return; // Lost leadership within the call: the origins retry elsewhere.
        }
        let proposals = std::mem::take(&mut group.to_propose);
        let bytes_max = self.config.batch_bytes_max();
        let mut entry = EntryBatch::default();
        let mut bytes = 0;
        for proposal in proposals {
            let size = proposal.bytes();
            if !entry.proposals.is_empty() && bytes + size > bytes_max {
                self.propose_entry(log, std::mem::take(&mut entry), bytes);
                bytes = 0;
            }
            bytes += size;
            entry.proposals.push(proposal);
        }
        self.propose_entry(log, entry, bytes);
    }

    /// `bytes`: an upper bound on the proposals' encoded size (their `bytes`).
    fn propose_entry(&mut self, log: usize, batch: EntryBatch, bytes: usize) {
        let group = &mut self.groups[log];
        let commands: usize = batch.proposals.iter().map(|proposal| proposal.commands.len()).sum();
        if group.raft.propose(vec![], batch.to_vec(bytes)).is_ok() {
            self.stats.entries_proposed += 1;
            self.stats.commands_proposed += commands as u64;
            let raft = &group.raft.raft;
            let (index, term) = (raft.raft_log.last_index(), raft.term);
            self.keep_proposed(log, index, term, batch.proposals);
        } else {
            // Dropped (e.g. a leadership transfer): forget it so a retry proposes it again.
            for proposal in &batch.proposals {
                if group.proposed.get(&proposal.client) == Some(&proposal.seq) {
                    group.proposed.remove(&proposal.client);
                }
            }
        }
    }

    /// Start a ReadIndex round for the reads whose barrier is met, unless one is in flight;
    /// restart a round that got no answer in time or whose leader changed.
    fn start_read_round(&mut self, log: usize, now: Time) {
        let me = self.config.me;
        let retry_timeout = self.config.retry_timeout;
        let group = &mut self.groups[log];
        let leader = group.leader();
        if let Some(round) = &mut group.read_round {
            let stale = round.leader != leader || now >= round.started_at + retry_timeout;
            if !stale || leader == INVALID_ID {
                return;
            }
            // The request or its answer was lost, or went to a deposed leader. The reads were
            // invoked before the first attempt, so a later confirmation still suffices.
            self.stats.read_rounds_retried += 1;
            round.id = group.next_read_round;
            round.started_at = now;
            round.leader = leader;
            group.next_read_round += 1;
            group.raft.read_index(read_context(me, log, round.id));
            return;
        }
        if leader == INVALID_ID {
            return; // raft-rs drops ReadIndex requests while no leader is known.
        }
        let mut reads = Vec::new();
        while group.reads_waiting.front().is_some_and(|read| read.barrier <= group.updates_applied) {
            let read = group.reads_waiting.pop_front().expect("front exists");
            reads.push((read.request, read.key));
        }
        if reads.is_empty() {
            return;
        }
        let id = group.next_read_round;
        group.next_read_round += 1;
        self.stats.read_rounds += 1;
        group.read_round = Some(ReadRound { id, started_at: now, leader, reads });
        group.raft.read_index(read_context(me, log, id));
    }

    /// The raft-rs 0.7 Ready cycle (as in chorus-membership): send, apply, persist, advance,
    /// then the light ready. Returns whether there was anything to do.
    fn handle_ready(&mut self, log: usize, out: &mut Outbox<Message>) -> bool {
        if !self.groups[log].raft.has_ready() {
            return false;
        }
        let mut ready = self.groups[log].raft.ready();
        // A leader's own messages may leave before its entries are stable (Raft thesis
        // §10.2.1; raft-rs puts them in `messages`); everything else waits for the runtime
        // to persist this call's durable records, which it does before sending anything.
        self.send_raft(log, ready.take_messages(), out);
        if !ready.snapshot().is_empty() {
            self.install_snapshot(log, ready.snapshot().clone(), out);
        }
        for read_state in ready.take_read_states() {
            self.on_read_state(log, read_state);
        }
        let committed = ready.take_committed_entries();
        self.apply(log, committed, out);
        let durable = self.config.durable;
        if !ready.entries().is_empty() {
            // Taken, not cloned: `advance` needs only the Ready's number, so the durable record
            // owns the entries and the storage keeps the one copy it needs.
            let entries = ready.take_entries();
            self.abort_replaced(log, &entries);
            let storage = self.groups[log].raft.mut_store();
            storage.append(&entries).expect("raft-rs appends contiguous entries");
            if durable {
                self.push_durable(Record::Entries { log: log as u32, entries }, true);
            }
            self.execute_held_entries(log);
        }
        let storage = self.groups[log].raft.mut_store();
        if let Some(hard_state) = ready.hs() {
            let previous = storage.hard_state();
            // Term and vote must be stable before anything that depends on them leaves.
            let sync = (hard_state.term, hard_state.vote) != (previous.term, previous.vote);
            storage.set_hard_state(hard_state.clone());
            if durable {
                let record = Record::HardState {
                    log: log as u32,
                    term: hard_state.term,
                    vote: hard_state.vote,
                    commit: hard_state.commit,
                };
                self.push_durable(record, sync);
            }
        }
        self.send_raft(log, ready.take_persisted_messages(), out);
        let number = ready.number();
        let asynchronous = durable && !self.config.has_bug(crate::Bug::CountsUnsyncedCopy);
        if asynchronous && ready.snapshot().is_empty() {
            // raft-rs hears that this Ready is stable from `on_synced`, once the runtime's
            // sync covers it; the commits and applies that waits for come in a later Ready.
            self.groups[log].raft.advance_append_async(ready);
            self.groups[log].ready_written = number;
        } else {
            // An installed snapshot counts as stable at once (raft-rs applies from it at
            // once): it holds only what a majority committed, and the follower's answer to
            // it still waits for the sync of its checkpoint. Every earlier Ready's entries
            // lie below it or were replaced by it.
            self.advance_in_memory(log, ready, out);
            let group = &mut self.groups[log];
            (group.ready_written, group.ready_synced) = (number, number);
        }
        self.groups[log].raft.advance_apply();
        // raft-rs keeps a follower it sent a snapshot to paused until told how it went; the
        // network may lose the snapshot, so report it delivered at once: the follower's next
        // append response (or rejection, which makes the leader send a snapshot again)
        // resumes replication.
        for to in std::mem::take(&mut self.snapshots_sent) {
            self.groups[log].raft.report_snapshot(to, raft::SnapshotStatus::Finish);
        }
        true
    }

    /// Without a disk a Ready is stable once handled: commit and apply what that allows now.
    fn advance_in_memory(&mut self, log: usize, ready: raft::Ready, out: &mut Outbox<Message>) {
        let mut light = self.groups[log].raft.advance_append(ready);
        if let Some(commit) = light.commit_index() {
            self.groups[log].raft.mut_store().set_commit(commit);
        }
        self.send_raft(log, light.take_messages(), out);
        let committed = light.take_committed_entries();
        self.apply(log, committed, out);
        self.execute_held_entries(log);
    }

    /// A leader sent a snapshot because this replica is behind its compacted log: the
    /// snapshot's state machine (keys and session table) replaces ours. Batches it covers
    /// are answered from the session table, as if applied.
    fn install_snapshot(&mut self, log: usize, snapshot: Snapshot, out: &mut Outbox<Message>) {
        let Ok(state) = LogState::decode(snapshot.data.clone()) else {
            // `acceptable` checked the bytes before raft-rs saw them.
            unreachable!("snapshots are validated on arrival");
        };
        let index = snapshot.get_metadata().index;
        self.drop_tentative(log);
        let group = &mut self.groups[log];
        group.raft.mut_store().apply_snapshot(snapshot);
        let (ignore_locks, expiry) = (group.state.ignore_locks, group.state.session_expiry_entries);
        let runs_forgotten_steps = group.state.runs_forgotten_steps;
        group.state = state;
        group.state.ignore_locks = ignore_locks;
        group.state.runs_forgotten_steps = runs_forgotten_steps;
        group.state.session_expiry_entries = expiry;
        group.state.begin_entry(index);
        group.applied_index = index;
        self.reset_gangs(log);
        let group = &mut self.groups[log];
        self.stats.snapshots_installed += 1;
        self.checkpoint_due = true;
        let covered: Vec<(SessionId, u64)> = group
            .waiters
            .keys()
            .filter(|(client, seq)| group.state.last_seq(*client) >= *seq || group.state.forgotten(*client))
            .copied()
            .collect();
        for key in covered {
            let waiter = group.waiters.remove(&key).expect("listed");
            let last_seq = group.state.last_seq(key.0);
            let result = if group.state.forgotten(key.0) && last_seq < key.1 {
                ProposalResult::Expired
            } else if key.1 == last_seq {
                ProposalResult::Duplicate
            } else {
                ProposalResult::Stale { last_seq }
            };
            complete_waiter(group, waiter, result, None, out, &mut self.step_results, &mut self.stats);
        }
        for (txn, begun_at, commands) in group.state.txns_in_progress() {
            self.txns_begun.push((*txn, begun_at, commands.clone()));
        }
        // Owed clients of a transaction this copy jumped past (its `Finish` will not apply
        // here): only what the driver computed can answer them now.
        let jumped: Vec<TxnId> = self
            .txn_clients_owed
            .iter()
            .filter(|(txn, (coordinator, ..))| *coordinator == log && !group.state.txn_in_progress(txn))
            .map(|(txn, _)| *txn)
            .collect();
        release_unlocked(group, out);
        for txn in jumped {
            let (_, clients, computed) = self.txn_clients_owed.remove(&txn).expect("listed");
            self.answer_txn(clients, &[], &computed, out);
        }
    }

    /// Compact every log to its applied index once enough entries were applied (bounding
    /// memory; a follower behind the compaction gets the snapshot instead of entries), and,
    /// when durable, hand the runtime a checkpoint so it can truncate both log levels.
    fn maybe_snapshot(&mut self) {
        let due = std::mem::take(&mut self.compaction_due)
            || self.config.snapshot_entries > 0
                && self.applied_since_snapshot >= self.config.snapshot_entries;
        let checkpoint_due = self.checkpoint_due && self.config.durable;
        if !(due || checkpoint_due) {
            return;
        }
        self.applied_since_snapshot = 0;
        self.checkpoint_due = false;
        self.stats.snapshots_taken += 1;
        let mut checkpoint = Checkpoint { installed: checkpoint_due, ..Checkpoint::default() };
        for group in &mut self.groups {
            // A log waiting at a gang in the middle of an entry holds part of that entry's
            // effects: its state is not the state at any index, so it keeps its snapshot.
            let part_applied = group.pending.front().is_some_and(|head| head.started);
            let storage = group.raft.mut_store();
            // Only entries this replica holds can be compacted (a just-installed snapshot's
            // index is held as the snapshot itself). A log that applied nothing since its
            // last snapshot keeps it: encoding the state again would give the same bytes.
            let index = group.applied_index.min(storage.last_index());
            if index > storage.snapshot_index() && !part_applied {
                // A copy-on-write image, not the bytes: the writer thread encodes it.
                let state = StateImage::of(&group.state);
                self.stats.snapshot_logs_encoded += 1;
                let trailing = storage.trailing_fitting(
                    index,
                    self.config.trailing_entries,
                    self.config.trailing_bytes_max,
                );
                storage.compact_keeping(index, state, trailing);
            }
            if self.config.durable {
                let hard_state = storage.hard_state();
                checkpoint.logs.push(LogCheckpoint {
                    conf_state: Some(storage.snapshot_conf_state().clone()),
                    snapshot_index: storage.snapshot_index(),
                    snapshot_term: storage.snapshot_term(),
                    state: storage.snapshot_image().clone(),
                    term: hard_state.term,
                    vote: hard_state.vote,
                    commit: hard_state.commit,
                    entries: storage.held_entries().to_vec(),
                });
            }
        }
        if self.config.durable {
            checkpoint.identities =
                self.members.identities.iter().map(|(id, identity)| (*id, *identity)).collect();
            self.push_durable(Record::Checkpoint(checkpoint), true);
        }
    }

    fn send_raft(&mut self, log: usize, messages: Vec<raft::prelude::Message>, out: &mut Outbox<Message>) {
        let chunk_bytes = self.config.snapshot_chunk_bytes();
        for message in messages {
            // (A message to this node's predecessor, which a joint configuration still lists,
            // goes nowhere: this node is not it.)
            let to = node_of(message.to)
                .filter(|node| self.config.members.contains(*node) && *node != self.config.me);
            if let Some(to) = to {
                if message.get_msg_type() == MessageType::MsgSnapshot {
                    if message.get_snapshot().data.len() > chunk_bytes {
                        // Too large for one message: streamed in chunks, reported when done.
                        self.groups[log].snapshots_out.insert(to, Outgoing::new(message));
                        continue;
                    }
                    self.snapshots_sent.push(message.to);
                }
                if let Some(answer) = AppendAnswer::of(log as u32, &message) {
                    self.answers_out.entry((to, message.from, message.to)).or_default().push(answer);
                    continue;
                }
                out.send(to, Message::Raft { log: log as u32, message: Box::new(message) });
            }
        }
    }

    /// Send the chunks of every snapshot transfer that are due; give up stalled ones.
    fn pump_snapshots(&mut self, log: usize, now: Time, out: &mut Outbox<Message>) {
        let (chunk_bytes, retry_timeout) = (self.config.snapshot_chunk_bytes(), self.config.retry_timeout);
        let group = &mut self.groups[log];
        if group.snapshots_out.is_empty() {
            return;
        }
        if !group.is_leader() {
            group.snapshots_out.clear(); // the new leader sends its own
            return;
        }
        let mut stalled = Vec::new();
        for (to, transfer) in &mut group.snapshots_out {
            if transfer.stalled(now, retry_timeout) {
                stalled.push((*to, transfer.raft_to()));
                continue;
            }
            for chunk in transfer.due(log as u32, now, chunk_bytes, retry_timeout) {
                self.stats.snapshot_chunks_sent += 1;
                out.send(*to, chunk);
            }
        }
        for (to, raft_to) in stalled {
            group.snapshots_out.remove(&to);
            group.raft.report_snapshot(raft_to, raft::SnapshotStatus::Failure);
            self.stats.snapshot_transfers_failed += 1;
        }
    }

    fn on_read_state(&mut self, log: usize, read_state: ReadState) {
        let group = &mut self.groups[log];
        let Some(round) = &group.read_round else { return };
        // Answers to earlier attempts (or duplicates) carry another round id: ignored.
        if read_state.request_ctx != read_context(self.config.me, log, round.id) {
            return;
        }
        let round = group.read_round.take().expect("round exists");
        group.reads_confirmed.push((read_state.index, round.reads));
    }

    /// Committed entries join their log's pending queue and are applied in order, up to a
    /// gang that waits for its rendezvous (`gang`).
    fn apply(&mut self, log: usize, entries: Vec<Entry>, out: &mut Outbox<Message>) {
        for entry in entries {
            if self.commit_executed(log, &entry, out) {
                continue; // executed when it arrived: its transaction commits, nothing runs
            }
            // Leader no-ops are empty; configuration changes apply in log order (`members`).
            if entry.get_entry_type() != EntryType::EntryNormal {
                let change = Some((entry.get_entry_type(), entry.data.clone()));
                self.enqueue_entry(log, entry.index, Vec::new(), change);
                continue;
            }
            let proposals = if entry.data.is_empty() {
                Vec::new()
            } else {
                match EntryBatch::decode_exact(entry.data.clone()) {
                    Ok(batch) => batch.proposals,
                    Err(_) => {
                        // Every replica skips the same committed entry, so the copies stay equal.
                        self.stats.entries_malformed += 1;
                        Vec::new()
                    }
                }
            };
            self.enqueue_entry(log, entry.index, proposals, None);
        }
        self.advance(log, out);
    }

    /// Apply one committed proposal (not a gang) to `log`'s state machine.
    fn apply_proposal(&mut self, log: usize, proposal: &Proposal, out: &mut Outbox<Message>) {
        let group = &mut self.groups[log];
        let result = group.state.apply(proposal, self.dedupe);
        // Applied: the session table (or its expiry rule) answers retries from now on, so
        // the leader's memory of proposing it can go (it stays bounded).
        if group.proposed.get(&proposal.client).is_some_and(|&seq| seq <= proposal.seq) {
            group.proposed.remove(&proposal.client);
        }
        self.count_result(result);
        match (result, &proposal.step) {
            (ProposalResult::Executed, Some(Step::Begin { txn, commands })) => {
                let begun_at = self.groups[log].state.begun_at(txn).expect("a Begin just ran");
                self.txns_begun.push((*txn, begun_at, commands.clone()));
            }
            (ProposalResult::Executed, Some(Step::Finish { txn, outcomes, logs })) => {
                self.on_finish_applied(log, proposal.client, *txn, outcomes, logs, out);
            }
            (ProposalResult::Executed, Some(Step::Forget { .. })) => self.stats.txn_forgets_applied += 1,
            _ => {}
        }
        let group = &mut self.groups[log];
        let Some(waiter) = group.waiters.remove(&(proposal.client, proposal.seq)) else { return };
        complete_waiter(group, waiter, result, None, out, &mut self.step_results, &mut self.stats);
    }

    fn count_result(&mut self, result: ProposalResult) {
        match result {
            ProposalResult::Executed => self.stats.proposals_executed += 1,
            ProposalResult::Duplicate => self.stats.proposals_duplicate += 1,
            ProposalResult::Stale { .. } => self.stats.proposals_stale += 1,
            ProposalResult::Expired => self.stats.proposals_expired += 1,
        }
    }

    /// After `log` applied entries: confirmed reads now covered are answered, and what waited
    /// for a transaction's lock goes again.
    fn after_apply(&mut self, log: usize, out: &mut Outbox<Message>) {
        let group = &mut self.groups[log];
        // Confirmed reads whose index is now applied (a locked key waits for its release).
        let applied_index = group.applied_index;
        let mut served = 0;
        let (state, reads_blocked) = (&group.state, &mut group.reads_blocked);
        group.reads_confirmed.retain(|(index, reads)| {
            if *index > applied_index {
                return true;
            }
            for (request, key) in reads {
                if state.is_locked(key) {
                    reads_blocked.push((*request, key.clone()));
                    continue;
                }
                out.reply(*request, Outcome::Value(state.get(key).cloned()));
                served += 1;
            }
            false
        });
        self.stats.reads_served += served;
        release_unlocked(group, out);
    }
}

fn new_group(config: &RaftLogConfig, log: usize, restored: Option<(LogStorage, LogState)>) -> Group {
    let fresh = restored.is_none();
    let (storage, state) = restored.unwrap_or_else(|| {
        (LogStorage::with_conf_state(RaftLog::founding_conf(config)), LogState::default())
    });
    let applied_index = storage.snapshot_index();
    // raft-rs draws election timeouts from a thread-local RNG, which would make the simulator
    // non-deterministic. A fixed per-node timeout (min = max - 1) keeps it deterministic;
    // staggering it by rank avoids endless split votes, and rotating the ranks per log
    // spreads the leaders of different logs over different nodes (as Cyclone spreads its
    // Raft cores' work).
    let members = config.members.len();
    let rank = config.members.iter().position(|node| node == config.me).expect("member");
    let stagger = match config.leaders {
        LeaderPlacement::Spread => (rank + members - log % members) % members,
        LeaderPlacement::Together => rank,
    };
    let election_tick = config.election_ticks + 3 * stagger;
    let raft_config = Config {
        id: raft_id_of(config.me, config.incarnation),
        election_tick,
        heartbeat_tick: config.heartbeat_ticks,
        min_election_tick: election_tick,
        max_election_tick: election_tick + 1,
        pre_vote: true,
        check_quorum: true,
        // Appends carry entries up to this size (at least one entry each; entries are cut at
        // the same bound), so they always fit a peer message.
        max_size_per_msg: config.batch_bytes_max().min(1 << 20) as u64,
        max_inflight_msgs: 256,
        // Commits reach followers in this core's notices (`notice_commits`), one message per
        // follower for all logs, not in an empty append per log and commit.
        skip_bcast_commit: true,
        // Restored: the checkpoint's state machine covers everything up to its index; raft-rs
        // hands out the committed entries after it again.
        applied: applied_index,
        ..Default::default()
    };
    let logger = slog::Logger::root(slog::Discard, slog::o!());
    let mut raft = RawNode::new(&raft_config, storage, &logger).expect("valid raft config");
    if stagger == 0 && fresh && !config.joining {
        // The log's preferred node campaigns at once rather than after an election timeout,
        // so a fresh cluster serves within a round trip.
        let _ = raft.campaign();
    }
    Group {
        log,
        raft,
        applied_index,
        ready_written: 0,
        ready_synced: 0,
        queue: VecDeque::new(),
        own_seq: 0,
        own_in_flight: false,
        updates_accepted: 0,
        updates_applied: 0,
        waiters: BTreeMap::new(),
        blocked: Vec::new(),
        reads_waiting: VecDeque::new(),
        reads_blocked: Vec::new(),
        read_round: None,
        next_read_round: 0,
        reads_confirmed: Vec::new(),
        to_propose: Vec::new(),
        proposed: FxHashMap::default(),
        proposed_term: 0,
        executed: VecDeque::new(),
        execution_stop: None,
        proposed_entries: VecDeque::new(),
        snapshots_out: BTreeMap::new(),
        snapshot_in: None,
        scan: GangScan::from_state(&state),
        state,
        pending: VecDeque::new(),
        gang_wait: None,
        dirty: true,
        noticed: Vec::new(),
        noticed_term: 0,
    }
}

impl Waiter {
    fn new(
        proposal: Proposal,
        requests: Vec<(usize, ClientRequestId)>,
        own: bool,
        step: Option<(StepKind, u32)>,
    ) -> Waiter {
        Waiter { proposal, requests, own, step, sent_at: None, sent_to: INVALID_ID }
    }
}

/// Track a batch until this replica applies it. One that this replica has applied already
/// (a retry of an external request, a step another driver got executed) is answered at once.
fn register_waiter(
    group: &mut Group,
    waiter: Waiter,
    dedupe: bool,
    out: &mut Outbox<Message>,
    step_results: &mut Vec<StepResult>,
    stats: &mut RaftLogStats,
) {
    let last_seq = group.state.last_seq(waiter.proposal.client);
    if dedupe && waiter.proposal.seq > last_seq && group.state.forgotten(waiter.proposal.client) {
        // A step of a transaction this copy knows finished: it would be refused.
        complete_waiter(group, waiter, ProposalResult::Expired, None, out, step_results, stats);
        return;
    }
    if dedupe && waiter.proposal.seq <= last_seq {
        let result = if waiter.proposal.seq == last_seq {
            ProposalResult::Duplicate
        } else {
            ProposalResult::Stale { last_seq }
        };
        complete_waiter(group, waiter, result, None, out, step_results, stats);
        return;
    }
    group.waiters.insert((waiter.proposal.client, waiter.proposal.seq), waiter);
}

/// `outcomes`: what executing it gave, if it was executed before it committed; otherwise the
/// session record (just applied) holds them.
fn complete_waiter(
    group: &mut Group,
    waiter: Waiter,
    result: ProposalResult,
    outcomes: Option<Vec<Outcome>>,
    out: &mut Outbox<Message>,
    step_results: &mut Vec<StepResult>,
    stats: &mut RaftLogStats,
) {
    if let (Some((kind, attempt)), Some(step)) = (waiter.step, &waiter.proposal.step) {
        // Steps use sequence number 1 only, so their result is never stale; a refused one
        // (`Expired`) is forgotten: its transaction finished.
        let outcomes = match result {
            ProposalResult::Expired => vec![crate::txn::FORGOTTEN],
            _ => group
                .state
                .session(waiter.proposal.client)
                .map(|record| record.outcomes.clone())
                .unwrap_or_default(),
        };
        let txn = step.txn();
        let log = group.log;
        step_results.push(StepResult { txn, kind, log, attempt, outcomes });
        return;
    }
    let mut blocked = 0;
    match result {
        ProposalResult::Executed | ProposalResult::Duplicate => {
            let outcomes = outcomes.unwrap_or_else(|| {
                group.state.session(waiter.proposal.client).expect("applied session").outcomes.clone()
            });
            for (index, request) in &waiter.requests {
                let outcome = outcomes.get(*index).cloned().unwrap_or(Outcome::Error(
                    // A retry that reused the sequence number for a different batch.
                    CommandError::Unavailable("sequence number reused for a different request"),
                ));
                if waiter.own && outcome == Outcome::Error(CommandError::Locked) {
                    // Locked by a transaction: did not run. Wait for the release, then go again.
                    group.blocked.push((*request, waiter.proposal.commands[*index].clone()));
                    blocked += 1;
                    continue;
                }
                out.reply(*request, outcome);
            }
        }
        ProposalResult::Stale { .. } => {
            debug_assert!(!waiter.own, "this replica's own session never goes backwards");
            for (_, request) in &waiter.requests {
                out.reply(*request, Outcome::Error(CommandError::StaleSequence));
            }
        }
        ProposalResult::Expired => {
            // It did not run now, and whether an earlier copy ran is unknown (not
            // `Unavailable`, which promises it never ran).
            for (_, request) in &waiter.requests {
                out.reply(*request, Outcome::Error(CommandError::OutcomeUnknown));
            }
        }
    }
    stats.commands_blocked += blocked as u64;
    if waiter.own {
        group.own_in_flight = false;
        group.updates_applied += (waiter.requests.len() - blocked) as u64;
    }
}

/// Commands and reads that waited for a transaction's lock go again once this replica's
/// copy shows the key unlocked: commands to the front of the queue (in their order), reads
/// answered from the copy.
fn release_unlocked(group: &mut Group, out: &mut Outbox<Message>) {
    if !group.blocked.is_empty() {
        let state = &group.state;
        let (free, still): (Vec<_>, Vec<_>) = std::mem::take(&mut group.blocked)
            .into_iter()
            .partition(|(_, command)| !state.is_locked(command.key()));
        group.blocked = still;
        for entry in free.into_iter().rev() {
            group.queue.push_front(entry);
        }
    }
    if !group.reads_blocked.is_empty() {
        let state = &group.state;
        group.reads_blocked.retain(|(request, key)| {
            if state.is_locked(key) {
                return true;
            }
            out.reply(*request, Outcome::Value(state.get(key).cloned()));
            false
        });
    }
}

/// The ReadIndex context: unique per requesting node, log and round, because the leader
/// keys its pending reads by it.
fn read_context(me: NodeId, log: usize, round: u64) -> Vec<u8> {
    let mut context = Vec::with_capacity(READ_CONTEXT_BYTES);
    context.push(me.0);
    context.extend_from_slice(&(log as u32).to_le_bytes());
    context.extend_from_slice(&round.to_le_bytes());
    context
}

/// Whether a Raft message from a peer may reach raft-rs. raft-rs trusts its input (some
/// malformed messages make it panic), so the obvious lies are refused here: a wrong
/// sender or recipient, messages only a local caller may produce, snapshots whose state
/// machine bytes do not decode or whose members are not of this cluster, proposals (only
/// leaders propose here), and ReadIndex messages without exactly one context entry.
///
/// A sender outside this log's configuration is *not* refused: this replica's
/// configuration may be the stale one. A member that was down while another node was
/// replaced knows only the old Raft id of the replacement; when the replacement leads, its
/// appends and snapshots are the only way that member learns the change, and refusing them
/// stalled it for good (seed 400 at 5 replicas). Raft processes messages without consulting
/// the configuration (thesis §4.1): which messages arrive never decides safety, votes count
/// only from the configuration's voters, and a replaced member's late messages are handled
/// like any delayed ones (terms checked; campaigns held off by pre-vote and check-quorum's
/// lease, as raft-rs intends for removed members).
fn acceptable(message: &raft::prelude::Message, from: NodeId, me: u64, members: NodeSet) -> bool {
    if node_of(message.from) != Some(from) || message.to != me {
        return false;
    }
    match message.get_msg_type() {
        MessageType::MsgHup
        | MessageType::MsgBeat
        | MessageType::MsgUnreachable
        | MessageType::MsgSnapStatus
        | MessageType::MsgCheckQuorum
        | MessageType::MsgPropose => false,
        MessageType::MsgSnapshot => {
            let snapshot = message.get_snapshot();
            let conf = snapshot.get_metadata().get_conf_state();
            let ids = conf.voters.iter().chain(&conf.learners).chain(&conf.voters_outgoing);
            !conf.voters.is_empty()
                && ids.clone().all(|id| node_of(*id).is_some_and(|node| members.contains(node)))
                && snapshot.get_metadata().index > 0
                && LogState::decode(snapshot.data.clone()).is_ok()
        }
        MessageType::MsgReadIndex | MessageType::MsgReadIndexResp => message.entries.len() == 1,
        _ => true,
    }
}

impl Replica for RaftLog {
    type Message = Message;

    fn id(&self) -> NodeId {
        self.config.me
    }

    /// With `flush_at_turn_end`, the logs the turn touched are flushed now, once.
    fn end_turn(&mut self, now: Time, out: &mut Outbox<Message>) {
        if self.config.flush_at_turn_end {
            self.flush(now, out);
        }
    }

    /// A leader's appends and heartbeats, its commit notices and a follower's forwarded
    /// batches leave before the call's records are synced (docs/protocols/raftlog.md, "Raft
    /// details"). An append may carry entries this very call wrote: the leader writes its log
    /// in parallel with replicating it (Raft thesis §10.2.1). The commit index an append, a
    /// heartbeat or a notice carries rests only on stable copies: raft-rs counts this
    /// leader's own entries toward a commit only once [`RaftLog::on_synced`] says they are
    /// stable. The term it carries was synced before the votes that made this node leader
    /// were asked for. A forward is a batch no log holds yet. Everything else, a follower's
    /// answers and votes above all, waits for the sync.
    fn leaves_before_sync(&self, message: &Message) -> bool {
        match message {
            Message::Raft { message, .. } => {
                matches!(message.get_msg_type(), MessageType::MsgAppend | MessageType::MsgHeartbeat)
            }
            Message::Commits { .. } | Message::Forward { .. } => true,
            Message::SnapshotChunk { .. }
            | Message::SnapshotAck { .. }
            | Message::Hello { .. }
            | Message::HelloRequest
            | Message::Refused
            | Message::AppendAnswers { .. } => false,
        }
    }

    /// A reply answers an entry a majority holds stable, counting this replica only once
    /// [`RaftLog::on_synced`] said its copy is (or a read of such entries, or a refusal):
    /// nothing it says rests on what the call wrote.
    fn replies_before_sync(&self) -> bool {
        true
    }

    fn on_client(
        &mut self,
        now: Time,
        request: ClientRequestId,
        command: Command,
        out: &mut Outbox<Message>,
    ) {
        if !self.owns(command.key()) {
            out.reply(request, Outcome::Error(OTHER_SHARD));
            return;
        }
        if self.members.refused_by.is_some() {
            out.reply(request, Outcome::Error(LOST_DATA));
            return;
        }
        let log = self.log_of(command.key());
        let group = &mut self.groups[log];
        match command {
            Command::Read { key } if self.local_reads => {
                out.reply(request, Outcome::Value(group.state.get(&key).cloned()));
                return;
            }
            Command::Read { key } => {
                group.reads_waiting.push_back(PendingRead { request, key, barrier: group.updates_accepted })
            }
            command => {
                group.queue.push_back((request, command));
                group.updates_accepted += 1;
            }
        }
        group.dirty = true;
        self.after_call(now, out);
    }

    fn on_message(&mut self, now: Time, from: NodeId, message: Message, out: &mut Outbox<Message>) {
        if !self.config.members.contains(from) {
            self.stats.messages_refused += 1;
            return; // Not one of ours: the transport's handshake should have refused it.
        }
        if matches!(message, Message::Hello { .. } | Message::HelloRequest | Message::Refused) {
            self.on_member_message(from, message, out);
            self.flush_all = true;
            self.after_call(now, out);
            return;
        }
        if self.members.refused_by.is_some() || !self.admits(now, from, out) {
            return; // refused (this node lost its data), or the peer is not verified yet
        }
        let me = self.my_raft_id();
        let touched = match &message {
            Message::Raft { log, .. }
            | Message::SnapshotChunk { log, .. }
            | Message::SnapshotAck { log, .. }
            | Message::Forward { log, .. } => Some(*log as usize),
            Message::Hello { .. }
            | Message::HelloRequest
            | Message::Refused
            | Message::Commits { .. }
            | Message::AppendAnswers { .. } => None,
        };
        if let Some(group) = touched.and_then(|log| self.groups.get_mut(log)) {
            group.dirty = true;
        }
        match message {
            Message::Raft { log, message } => self.step_raft(from, log, *message),
            Message::SnapshotChunk { log, index, offset, total, header, data } => {
                let Some(group) = self.groups.get_mut(log as usize) else {
                    self.stats.messages_refused += 1;
                    return;
                };
                let chunk = transfer::Chunk { index, offset, total, header, data };
                let result = transfer::on_chunk(&mut group.snapshot_in, from, chunk);
                out.send(from, Message::SnapshotAck { log, index, received: result.received });
                if let Some(message) = result.complete {
                    if acceptable(&message, from, me, self.config.members) {
                        let _ = group.raft.step(*message);
                    } else {
                        self.stats.messages_refused += 1;
                    }
                }
            }
            Message::SnapshotAck { log, index, received } => {
                let Some(group) = self.groups.get_mut(log as usize) else {
                    self.stats.messages_refused += 1;
                    return;
                };
                let done = match group.snapshots_out.get_mut(&from) {
                    Some(transfer) if transfer.index == index => transfer.on_ack(received, now),
                    _ => false,
                };
                if done {
                    let transfer = group.snapshots_out.remove(&from).expect("just found");
                    group.raft.report_snapshot(transfer.raft_to(), raft::SnapshotStatus::Finish);
                    self.stats.snapshot_transfers_completed += 1;
                }
            }
            Message::Forward { log, proposal, relayed } => {
                let log = log as usize;
                let Some(group) = self.groups.get(log) else {
                    self.stats.messages_refused += 1;
                    return;
                };
                if group.is_leader() {
                    self.accept_proposal(log, proposal);
                } else if !relayed {
                    // We are not (or no longer) the leader the origin believed in: pass it on
                    // once to the leader we know, rather than wait for the origin's retry.
                    let leader = group.leader();
                    if let Some(node) =
                        node_of(leader).filter(|node| *node != from && *node != self.config.me)
                    {
                        self.stats.forwards_relayed += 1;
                        out.send(node, Message::Forward { log: log as u32, proposal, relayed: true });
                    }
                }
            }
            Message::Commits { from: leader, to, commits } => self.on_commits(from, leader, to, commits),
            Message::AppendAnswers { from: follower, to, answers } => {
                self.on_append_answers(from, follower, to, answers)
            }
            Message::Hello { .. } | Message::HelloRequest | Message::Refused => {
                unreachable!("membership messages are handled above")
            }
        }
        self.after_call(now, out);
    }

    fn on_tick(&mut self, now: Time, out: &mut Outbox<Message>) {
        while now >= self.next_raft_tick {
            for group in &mut self.groups {
                group.raft.tick();
            }
            self.next_raft_tick = self.next_raft_tick + self.config.raft_tick_period;
            // Ticks move every log (elections, heartbeats), and retries are checked at them.
            self.flush_all = true;
        }
        self.after_call(now, out);
    }

    fn event_counts(&self, report: &mut dyn FnMut(&'static str, u64)) {
        let stats = &self.stats;
        report("raftlog.batches_resent", stats.batches_resent);
        report("raftlog.proposals_duplicate", stats.proposals_duplicate);
        report("raftlog.read_rounds_retried", stats.read_rounds_retried);
        report("raftlog.snapshots_taken", stats.snapshots_taken);
        report("raftlog.snapshots_installed", stats.snapshots_installed);
        report("raftlog.executions_rolled_back", stats.executions_rolled_back);
        report("raftlog.conf_changes_applied", stats.conf_changes_applied);
        report("raftlog.peers_refused", stats.peers_refused);
    }

    fn on_view(&mut self, _now: Time, view: View, _out: &mut Outbox<Message>) {
        // Informational: every group's quorum already tolerates a crashed minority, and the
        // voters stay fixed (no conf changes yet). See docs/protocols/raftlog.md.
        if view.epoch > self.view.epoch {
            self.view = view;
        }
    }
}

/// Two messages raft-rs mishandles when a follower's log is shorter than the leader thinks
/// (a node that lost its last entries: a replaced disk, or one that acknowledged before it
/// synced): a heartbeat committing past the follower's end makes raft-rs panic, so it is
/// clamped to what the log holds (a heartbeat commits nothing it does not hold); and the
/// follower's rejection, hinting at an end below what it acknowledged, is taken for a stale
/// message and ignored forever, so the leader lowers what it counts as matched and probes
/// from there (commits may come later, never wrongly). chorus-membership does the same.
fn guard_log_length(raft: &mut RawNode<LogStorage>, message: &mut raft::prelude::Message) {
    let last_index = raft.raft.raft_log.last_index();
    if message.get_msg_type() == MessageType::MsgHeartbeat && message.get_commit() > last_index {
        message.set_commit(last_index);
    }
    if message.get_msg_type() == MessageType::MsgAppendResponse && message.get_reject() {
        let hint = message.get_reject_hint();
        if let Some(progress) = raft.raft.mut_prs().get_mut(message.get_from()) {
            if hint < progress.matched {
                progress.matched = hint;
                progress.become_probe();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn the_log_of_a_key_never_changes() {
        // Pinned values: the hash must be identical on every node and in every build.
        assert_eq!(log_of(b"", 8), (0xcbf2_9ce4_8422_2325u64 % 8) as usize);
        assert_eq!(log_of(b"a", 1_000_003), (0xaf63_dc4c_8601_ec8cu64 % 1_000_003) as usize);
        assert_eq!(log_of(b"foobar", 1_000_003), (0x85944171f73967e8u64 % 1_000_003) as usize);
    }

    /// A checkpoint taken before a log applied anything holds no state bytes for it (never
    /// compacted): the node must still restart from it.
    #[test]
    fn a_checkpoint_with_a_log_that_applied_nothing_restores() {
        let members: NodeSet = (0..3).map(NodeId).collect();
        let mut config = RaftLogConfig::new(NodeId(0), members);
        config.logs = 2;
        config.durable = true;
        let busy = LogCheckpoint {
            snapshot_index: 3,
            snapshot_term: 1,
            state: LogState::default().encode().into(),
            term: 1,
            commit: 3,
            ..LogCheckpoint::default()
        };
        let idle = LogCheckpoint::default();
        let recovered = Recovered {
            checkpoint: Some(Checkpoint { logs: vec![busy, idle], ..Checkpoint::default() }),
            records: Vec::new(),
        };
        assert!(RaftLog::restore(config, recovered).is_ok());
    }

    /// A checkpoint hands the runtime images of the state, not bytes: the loop encodes
    /// nothing, and writes after the checkpoint do not leak into it (copy-on-write).
    #[test]
    fn a_checkpoint_carries_unencoded_images_that_later_writes_do_not_change() {
        let mut config = RaftLogConfig::new(NodeId(0), [NodeId(0)].into_iter().collect());
        config.logs = 1;
        config.durable = true;
        config.snapshot_entries = 4;
        let mut core = RaftLog::new(config);
        let mut out = Outbox::default();
        let mut now_ms = 0;
        while !core.groups[0].is_leader() {
            now_ms += 10;
            core.on_tick(Time::from_millis(now_ms), &mut out);
        }
        let write =
            |value: String| Command::Write { key: Bytes::from_static(b"k"), value: Some(Bytes::from(value)) };
        let mut checkpoint = None;
        for request in 0..12 {
            core.on_client(
                Time::from_millis(now_ms),
                ClientRequestId(request),
                write(format!("v{request}")),
                &mut out,
            );
            now_ms += 1;
            core.on_tick(Time::from_millis(now_ms), &mut out);
            // Each take is synced at once; hearing so commits (a single voter) and applies.
            for _ in 0..3 {
                let turn = core.take_durable();
                for record in turn.records {
                    if let Record::Checkpoint(taken) = record {
                        checkpoint.get_or_insert(taken);
                    }
                }
                core.on_synced(turn.ticket, Time::from_millis(now_ms), &mut out);
            }
        }
        let checkpoint = checkpoint.expect("a checkpoint every 4 entries");
        let image = &checkpoint.logs[0].state;
        assert!(!image.is_encoded(), "the loop must leave the encoding to the writer");
        assert!(checkpoint.logs[0].snapshot_index < core.groups[0].applied_index);
        let live = core.groups[0].state.get(b"k").cloned();
        assert_eq!(live.as_deref(), Some(&b"v11"[..]));
        // The later writes changed the live state, not the image taken before them.
        let saved = LogState::decode(image.bytes()).unwrap();
        assert_eq!(saved.key_count(), 1);
        assert_ne!(saved.get(b"k").cloned(), live, "the image kept the value it had");
        assert_ne!(saved.get(b"k").cloned(), live, "the image kept its own value");
    }

    #[test]
    fn keys_spread_over_every_log() {
        let mut counts = [0usize; 8];
        for index in 0..8_000 {
            counts[log_of(format!("key:{index}").as_bytes(), 8)] += 1;
        }
        assert!(counts.iter().all(|&count| (800..1_200).contains(&count)), "{counts:?}");
    }

    #[test]
    fn read_contexts_differ_by_node_log_and_round() {
        let base = read_context(NodeId(1), 2, 3);
        assert_eq!(base.len(), READ_CONTEXT_BYTES);
        assert_ne!(base, read_context(NodeId(2), 2, 3));
        assert_ne!(base, read_context(NodeId(1), 3, 3));
        assert_ne!(base, read_context(NodeId(1), 2, 4));
    }
}
