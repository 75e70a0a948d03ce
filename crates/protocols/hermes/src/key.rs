//! Per-key protocol metadata (Figure 3) and this replica's in-flight update for the key.

use std::collections::VecDeque;

use chorus_core::{ClientRequestId, Command, NodeSet, Outcome, Time, Timestamp, Value};

/// A key as the key table stores it: inline up to 24 bytes (most keys are shorter), so
/// comparing it during a lookup reads the table's own cache line rather than chasing a
/// pointer; a longer key lives on the heap. A received key is copied once, when its entry is
/// created, so the table never pins the client or peer buffer it arrived in.
pub type StoredKey = smallvec::SmallVec<[u8; 24]>;

/// The key states of §3.2.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum KeyState {
    /// The local value is the latest committed one: reads complete locally.
    Valid,
    /// Invalidated by another replica's update that has not been validated yet.
    Invalid,
    /// This replica coordinates an update of the key (C INV done, ACKs being gathered).
    Write,
    /// This replica replays another coordinator's update (§3.2, Write Replays).
    Replay,
    /// This replica's own update (write or replay) was superseded by a higher-timestamp INV
    /// while gathering ACKs. Becomes Invalid when the ACKs are in.
    Trans,
}

/// Everything a replica knows about one key.
#[derive(Debug)]
pub struct KeyEntry {
    pub state: KeyState,
    pub ts: Timestamp,
    pub value: Option<Value>,
    /// Whether the update that installed `ts` was an RMW (§3.6): replays must keep it.
    pub rmw_flag: bool,
    /// This replica's in-flight update of the key, if any (at most one per key, §3.2).
    /// Boxed: most keys have none, and inline it made every entry 360 bytes, so the key
    /// table of a busy node outgrew the caches (a key lookup was 15% of a SET's CPU).
    pub update: Option<Box<Update>>,
    /// Client requests stalled on this key, in arrival order.
    pub waiting: VecDeque<Waiter>,
    /// When a request stalled on this Invalid key may trigger a replay (§3.4, mlt).
    pub replay_at: Option<Time>,
    /// O3: the highest timestamp for which ACKs were overheard, and who is known to hold it.
    pub acks_seen: Option<HoldersSeen>,
}

impl Default for KeyEntry {
    fn default() -> Self {
        KeyEntry::new()
    }
}

impl KeyEntry {
    pub fn new() -> KeyEntry {
        KeyEntry {
            state: KeyState::Valid,
            ts: Timestamp::ZERO,
            value: None,
            rmw_flag: false,
            update: None,
            waiting: VecDeque::new(),
            replay_at: None,
            acks_seen: None,
        }
    }

    /// Nothing in flight and nothing waiting: the tick loop can forget the key.
    pub fn is_quiet(&self) -> bool {
        self.update.is_none() && self.waiting.is_empty()
    }
}

/// O3 bookkeeping: replicas known to have held exactly `ts`, and whether any replica was seen
/// holding a higher timestamp when it acknowledged `ts` (then `ts` must never be validated).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct HoldersSeen {
    pub ts: Timestamp,
    pub holders: NodeSet,
    pub superseded: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum UpdateKind {
    /// A client's write or RMW coordinated here.
    Client,
    /// A replay of another coordinator's update (or our own, after a view change).
    Replay,
}

/// An update this replica coordinates: a client write/RMW, or a replay.
#[derive(Debug)]
pub struct Update {
    pub kind: UpdateKind,
    pub ts: Timestamp,
    pub value: Option<Value>,
    pub rmw: bool,
    /// Replicas that acknowledged `ts` in the current epoch, this one included.
    pub acks: NodeSet,
    /// Some replica held a higher timestamp when it acknowledged: the update commits, but
    /// its timestamp must not be validated anywhere.
    pub superseded: bool,
    /// The client waiting for this update, with the reply to send once it commits. For an
    /// RMW, the original command too, so an abort can re-queue it.
    pub client: Option<UpdateClient>,
    pub retransmit_at: Time,
}

#[derive(Debug)]
pub struct UpdateClient {
    pub request: ClientRequestId,
    pub reply: Outcome,
    pub command: Command,
}

/// A stalled client request.
#[derive(Debug)]
pub struct Waiter {
    pub request: ClientRequestId,
    pub command: Command,
    /// An aborted RMW waiting for its retry: its INVs went out, so a replay elsewhere may
    /// still commit that first attempt. If this replica stops serving before the retry, the
    /// client must hear "outcome unknown", not "never executed".
    pub sent_before: bool,
}
