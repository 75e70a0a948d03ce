//! The replicated history: zxids and entries.

use std::fmt;

use chorus_core::{Key, NodeId, Outcome, Value};

/// ZAB's transaction id: the epoch of the leader that proposed the entry and a counter
/// within that epoch. Ordered lexicographically (the derived `Ord` compares fields in
/// declaration order).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Zxid {
    pub epoch: u64,
    pub counter: u64,
}

impl fmt::Debug for Zxid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<{},{}>", self.epoch, self.counter)
    }
}

/// One transaction. ZooKeeper's leader turns a request into an idempotent state change
/// before proposing it; so does this one: the entry holds the key's new value (or no change,
/// for an RMW that decided not to write) and the outcome the client will be told.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Entry {
    pub zxid: Zxid,
    pub key: Key,
    /// `None`: no change. `Some(None)`: delete. `Some(Some(v))`: set.
    pub write: Option<Option<Value>>,
    /// The replica whose client issued the update, and its number there: the origin answers
    /// its client when it applies the entry, and the leader proposes each number once.
    pub origin: NodeId,
    pub seq: u64,
    pub outcome: Outcome,
}
