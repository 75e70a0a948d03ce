//! Cyclone (raftlog) as a sans-I/O replica core.
//!
//! Every replica hosts K independent Raft groups, the "physical logs" of Cyclone §4.1, each a
//! raft-rs `RawNode` over `storage::LogStorage`, whose changes the core hands the runtime as
//! durable records (`durable`) for Cyclone's two-level log (`circular`, `disk`). A key belongs to log `fnv1a64(key) % K`, so
//! operations on one key are totally ordered by one log while different logs proceed in
//! parallel (commands on different keys commute). One core drives every group: every Raft
//! message of every group produced during one call goes into one outbox, which the runtime
//! sends as one frame per peer.
//!
//! Updates are batched (Cyclone §3.3): the commands a replica receives for a log while its
//! previous batch is in flight leave together, and a leader proposes every batch it took in
//! during one call as one entry. Batches execute at most once per (client, sequence number)
//! (Cyclone §3.4), so they are retried freely across leader changes. Reads use ReadIndex at
//! the replica the client talks to. Multi-key transactions run across logs (`txn`, §4.2), and
//! every replica executes entries before they commit, rolling back lost ones (`replica::tentative`, §3.1). See docs/protocols/raftlog.md for
//! the section-by-section map and what is not implemented yet.

pub mod circular;
pub mod config;
mod cow;
pub mod disk;
pub mod durable;
pub mod message;
pub mod replica;
pub mod shard;
pub mod state;
pub mod storage;
mod transfer;
pub mod txn;

pub use config::{Bug, LeaderPlacement, RaftLogConfig};
pub use message::{AppendAnswer, EntryBatch, Message, Proposal, SessionId, Step, StepKind, TxnId};
pub use replica::{log_in_shard, log_of, shard_of, RaftLog, RaftLogStats, INCARNATION_MAX};
pub use state::{LogState, ProposalResult, SessionRecord, StateImage};
