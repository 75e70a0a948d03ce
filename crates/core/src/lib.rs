//! Chorus core: the vocabulary every layer shares.
//!
//! * [`ids`]: node ids, node sets, epochs, views and Hermes-style logical timestamps.
//! * [`command`]: client commands (read, write, read-modify-writes) and their outcomes. The
//!   semantics of every RMW live here, once, so that protocols, the store and the
//!   linearizability checker cannot disagree about what `INCRBY` means.
//! * [`data`]: Redis' data types (lists, sets, sorted sets, the hash family, strings) and key
//!   expiry, each command one deterministic read-modify-write of one key.
//! * [`hash`]: the encoding of a Redis hash in one value, for the hash RMWs.
//! * [`replica`]: the sans-I/O interface every protocol core implements (`on_client`,
//!   `on_message`, `on_tick`, `on_view`, outputs into an [`replica::Outbox`]).
//! * [`slots`]: Redis Cluster's 16384 hash slots (CRC16 of the key or its `{hash tag}`).
//! * [`codec`]: the peer wire format (versioned, length-prefixed, checksummed frames) and a
//!   bounds-checked reader that turns malformed input into errors, never panics.

pub mod codec;
pub mod command;
pub mod data;
pub mod hash;
pub mod ids;
pub mod replica;
pub mod slots;
pub mod time;

pub use command::{Command, CommandError, Key, Outcome, RmwEffect, RmwOp, Value};
pub use ids::{Epoch, NodeId, NodeSet, Timestamp, View};
pub use replica::{ClientRequestId, Destination, Outbox, Replica};
pub use time::Time;
