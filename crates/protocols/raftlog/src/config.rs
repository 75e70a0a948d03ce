//! Raftlog configuration.

use chorus_core::{NodeId, NodeSet, Time};

/// A deliberately broken protocol variant, used only by tests to show that the simulator and
/// the linearizability checker catch real bugs. Selecting one needs the `broken-variants`
/// feature (the `bug` field of [`RaftLogConfig`] exists only with it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bug {
    /// Reads are answered at once from the receiving replica's applied state, without
    /// ReadIndex: a follower (or a deposed leader) serves stale values.
    LocalReads,
    /// At-most-once is off: the state machine executes every copy of a proposal that reaches
    /// the log, and leaders do not filter retries. A retry after a leader change runs twice.
    NoSessions,
    /// Transactions take no locks: a lock step always grants, and single-key commands are
    /// never held back. Concurrent transfers lose updates and audits see half-done ones.
    NoTxnLocks,
    /// The runtime syncs the two-level log only every 64th turn while every turn's messages
    /// and replies leave at once (what `appendfsync everysec` trades): an acknowledged entry
    /// can be lost when a majority crashes together.
    AckBeforeSync,
    /// A ganged operation runs in the first of its logs to reach it, on whatever the other
    /// logs hold at that moment, without waiting for the rendezvous: replicas read the other
    /// logs at different points, so updates are lost and copies drift apart.
    GangNoRendezvous,
    /// Decoupled execution keeps the writes of an entry it executed before commit when the
    /// entry is lost (a new leader replaced it): they are not rolled back, so the replica's
    /// copy holds writes the log never committed, and a retry of the lost command runs again.
    KeepRolledBack,
    /// raft-rs is told a Ready is stable as soon as it is handled (synchronous `advance`),
    /// while the runtime still syncs it on its sync thread: a leader counts its own unsynced
    /// copy toward a commit, so an entry one follower holds is answered, and lost when the
    /// leader crashes before its sync returns and the others elect a log without it.
    CountsUnsyncedCopy,
    /// A log forgets a finished transaction's step records at its `Forget` but does not
    /// refuse later copies of those steps: a copy that arrives late (a lagging driver's, a
    /// retry) runs again, writing the transaction's old results over newer ones or taking
    /// a lock nobody will release.
    RunsForgottenSteps,
}

impl Bug {
    /// Every variant, for `chorus sim --list-broken` and the tests that must catch each one.
    pub const ALL: [Bug; 8] = [
        Bug::LocalReads,
        Bug::NoSessions,
        Bug::NoTxnLocks,
        Bug::AckBeforeSync,
        Bug::GangNoRendezvous,
        Bug::KeepRolledBack,
        Bug::CountsUnsyncedCopy,
        Bug::RunsForgottenSteps,
    ];
}

/// Which node each log's election favours (docs/protocols/raftlog.md, §4.1 and "Where the
/// leaders are"). Only the preferred leader changes: any node may still win an election.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaderPlacement {
    /// Log `l`'s preferred leader is member `l % replicas`: the leaders' work spreads over
    /// the nodes, but every node then exchanges forwards, appends and answers with every
    /// other node each turn.
    Spread,
    /// Every log prefers the first member, as in Cyclone's evaluation (one leader replica for
    /// all its Raft instances): a follower's traffic of a turn goes to one node, so a turn
    /// costs the frames of one log whatever the number of logs.
    Together,
}

#[derive(Clone, Debug)]
pub struct RaftLogConfig {
    /// This replica.
    pub me: NodeId,
    /// The cluster's nodes: the founding members are voters of every Raft group; a node
    /// replaced later (`joining`) takes its predecessor's place through a configuration
    /// change of every log (`crate::replica::members`).
    pub members: NodeSet,
    /// This node's Raft incarnation: 0 for the members that founded the cluster; a
    /// replacement gets a new one (never 0), so it is a new Raft member in every log, never
    /// mistaken for the one it replaces. The data directory records it.
    pub incarnation: u64,
    /// Start as a replacement of this node's previous member: announce the new incarnation,
    /// and every log's leader swaps the old member for it (a Raft configuration change); it
    /// catches up by snapshot. Needs a fresh data directory.
    pub joining: bool,
    /// The identity of this node's data directory (made with the directory). Peers record
    /// the identity each incarnation first showed them and refuse one that comes back under
    /// another: a node that lost its data directory and starts again as the same member has
    /// forgotten its votes and acknowledged entries. 0: no identity checks (in-memory tests).
    pub identity: u64,
    /// How many independent Raft groups ("physical logs", Cyclone §4.1) this core hosts.
    /// A key's log is `fnv1a64(key) / shards % logs`, identical on every node and in every
    /// build.
    pub logs: usize,
    /// How many cores (shards) the node's logs are split over, each on its own event loop
    /// and thread, and which one this is (Cyclone §3.2: one Raft core per group of logs).
    /// A key belongs to shard `fnv1a64(key) % shards`; the server routes it there, and this
    /// core refuses keys of other shards. Every shard hosts `logs` logs. Default: 1 shard.
    pub shards: usize,
    pub shard: usize,
    /// How often the Raft groups tick (raft-rs counts elections and heartbeats in ticks).
    pub raft_tick_period: Time,
    /// Election timeout, in ticks, of the replica that campaigns first for a log. Replica
    /// ranks are staggered by 3 ticks per rank (rotated per log so leaders spread out).
    pub election_ticks: usize,
    pub heartbeat_ticks: usize,
    /// A forwarded batch whose execution this replica has not seen, or a ReadIndex request
    /// without an answer, is sent again after this long.
    pub retry_timeout: Time,
    /// The most client commands one batch (one Raft entry per origin) carries. `1` turns
    /// batching off: every command is its own entry (the benchmark's baseline).
    pub batch_commands_max: usize,
    /// The client id of this replica's own session (at-most-once, Cyclone §3.4). Each log
    /// keeps its own sequence numbers for it. It must differ between nodes and between
    /// incarnations of one node: a restarted node that reused it would start again at
    /// sequence number 1 and find every request stale. The default, the node id, is right
    /// for a replica that never restarts; `disk::DurableRaftLog::open` sets
    /// `disk::session_client_id` (node, incarnation or directory identity, boot counter).
    pub session_client_id: u64,
    /// Decoupled execution (Cyclone §3.1, `crate::replica::tentative`): every replica executes
    /// an entry when it receives it, as a transaction committed when the entry commits (its
    /// results are the replies) and rolled back if the entry is lost. Default: on. Off
    /// (coupled): entries execute once committed.
    pub decoupled: bool,
    /// How multi-key transactions (MULTI/EXEC) run across logs: as ganged operations (true,
    /// the default: one copy in every log involved, run at the rendezvous,
    /// `crate::replica::gang`) or with strict two-phase locking (`crate::txn`, Cyclone §4.2).
    /// Every node of a cluster must use the same.
    pub ganged: bool,
    /// Where each log's preferred leader is (`crate::replica::new_group`'s election stagger):
    /// spread over the nodes by log number, or every log led by the first member.
    pub leaders: LeaderPlacement,
    /// The runtime calls [`chorus_core::Replica::end_turn`] once per event-loop turn, after every
    /// message and request of the turn: the logs are flushed there, once per turn (every
    /// command of the turn joins one batch per log, every batch a leader took in one entry),
    /// instead of after every call. Off (the simulator, tests): each call flushes.
    pub flush_at_turn_end: bool,
    /// Emit durable records (`RaftLog::take_durable`) for a runtime that persists them
    /// (the server's two-level log). The simulator runs without.
    pub durable: bool,
    /// Compact every log to its applied index after this many entries were applied (over
    /// all logs); when durable, each compaction is a checkpoint that truncates both levels
    /// of the on-disk log. 0: never.
    pub snapshot_entries: u64,
    /// A compaction keeps up to this many of each log's latest applied entries (and at most
    /// `trailing_bytes_max` of their data), so a follower that lags by less catches up from
    /// the log rather than by a snapshot of the whole state machine. 0: keep none.
    pub trailing_entries: u64,
    pub trailing_bytes_max: u64,
    /// A session record (at-most-once, Cyclone §3.4) that no proposal used for this many
    /// entries of its log is dropped; a proposal made this long ago whose session has no
    /// record is refused (`state::LogState`). 0: sessions never expire.
    pub session_expiry_entries: u64,
    /// The largest message the transport carries (its frame payload limit). Batches and
    /// entries are cut at half of it (a single command always fits: the server bounds keys
    /// and values accordingly), transactions larger than that are refused, and snapshots
    /// larger than a chunk travel in chunks (`crate::transfer`), never dropped.
    pub message_bytes_max: usize,
    #[cfg(feature = "broken-variants")]
    pub bug: Option<Bug>,
}

/// Snapshot chunks are at most this big, however large messages may be.
const SNAPSHOT_CHUNK_BYTES_MAX: usize = 1 << 20;

impl RaftLogConfig {
    /// Batches and entries are cut at this many bytes (one command or proposal may exceed it).
    pub fn batch_bytes_max(&self) -> usize {
        self.message_bytes_max / 2
    }

    /// Snapshots larger than this travel in chunks of this size.
    pub fn snapshot_chunk_bytes(&self) -> usize {
        (self.message_bytes_max / 2).clamp(1, SNAPSHOT_CHUNK_BYTES_MAX)
    }

    /// Whether a deliberately broken variant is on; always false without the feature.
    pub fn has_bug(&self, _bug: Bug) -> bool {
        #[cfg(feature = "broken-variants")]
        return self.bug == Some(_bug);
        #[cfg(not(feature = "broken-variants"))]
        false
    }

    /// Defaults: 8 logs, 10 ms Raft ticks, elections after 100-160 ms at 3 replicas,
    /// heartbeats every 30 ms, retries after 60 ms, batches of up to 1,024 commands.
    pub fn new(me: NodeId, members: NodeSet) -> RaftLogConfig {
        RaftLogConfig {
            me,
            members,
            incarnation: 0,
            joining: false,
            identity: 0,
            logs: 8,
            shards: 1,
            shard: 0,
            raft_tick_period: Time::from_millis(10),
            election_ticks: 10,
            heartbeat_ticks: 3,
            retry_timeout: Time::from_millis(60),
            batch_commands_max: 1_024,
            session_client_id: me.0 as u64,
            decoupled: true,
            ganged: true,
            leaders: LeaderPlacement::Spread,
            flush_at_turn_end: false,
            durable: false,
            snapshot_entries: 20_000,
            trailing_entries: 1_000,
            trailing_bytes_max: 4 << 20,
            session_expiry_entries: 100_000,
            message_bytes_max: chorus_core::codec::FRAME_PAYLOAD_BYTES_MAX,
            #[cfg(feature = "broken-variants")]
            bug: None,
        }
    }
}
