//! ZAB (Junqueira, Reed, Serafini, "Zab: High-performance broadcast for primary-backup
//! systems", DSN 2011; the ZooKeeper atomic broadcast, the Hermes paper's rZAB baseline) as a
//! sans-I/O replica core.
//!
//! The leader of a view is its lowest live id; the view's epoch is ZAB's epoch (the membership
//! service plays leader election). A new leader first recovers: it gathers the last zxid and
//! the epoch of the last synchronised history from a quorum of the ensemble, adopts the best
//! history (ZAB phase 1, discovery), and synchronises followers to it (phase 2, NEWLEADER);
//! once a quorum acknowledged, the whole history is committed and broadcast resumes
//! (phase 3): every update is forwarded to the leader, ordered by zxid `(epoch, counter)`,
//! proposed, committed on a majority of ACKs, and applied by every replica in zxid order.
//!
//! Reads are local ([`ReadMode::Local`]: ZooKeeper's reads, sequentially consistent per
//! replica, what the Hermes paper evaluates) or linearizable ([`ReadMode::Sync`]: the replica
//! asks the leader for its commit point and answers once it has applied that far). See
//! docs/protocols/zab.md for the section-by-section map.

pub mod config;
pub mod durable;
pub mod log;
pub mod message;
pub mod replica;

pub use config::{Bug, ReadMode, ZabConfig};
pub use durable::DurableState;
pub use log::{Entry, Zxid};
pub use message::Message;
pub use replica::{Zab, ZabStats};
