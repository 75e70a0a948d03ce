//! Hermes configuration.

use chorus_core::{NodeId, NodeSet, Time, View};

/// The optimizations of Hermes §3.3 that are safe to switch, so their effect can be measured
/// and tested. O1 (a superseded coordinator skips VAL) is not a switch: Chorus found that
/// validating a superseded timestamp lets an RMW read a value that a concurrent write had
/// already replaced (docs/protocols/hermes.md), so superseded updates are never validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Optimizations {
    /// O2: virtual node ids per physical node for fairness among concurrent writers. `1` turns
    /// it off (cid = node id). Ids of different nodes never overlap: node `n` owns
    /// `n * virtual_ids_per_node .. (n + 1) * virtual_ids_per_node`.
    pub virtual_ids_per_node: u32,
    /// O3: followers broadcast ACKs to every replica and validate a key once they hold ACKs
    /// from all live replicas, so coordinators send no VAL.
    pub broadcast_acks: bool,
}

impl Default for Optimizations {
    fn default() -> Self {
        Optimizations { virtual_ids_per_node: 1, broadcast_acks: false }
    }
}

/// A deliberately broken protocol variant, used only by tests to show that the simulator and
/// the linearizability checker catch real bugs. Selecting one needs the `broken-variants`
/// feature (the `bug` field of [`HermesConfig`] exists only with it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bug {
    /// Reads are served whatever the key's state (violates "reads complete only in Valid").
    ReadInAnyState,
    /// VAL validates the key whatever its timestamp (violates F VAL).
    ValIgnoresTimestamp,
    /// Gathered ACKs survive a view change (the bug once missed by Hermes' public TLA+ model).
    KeepAcksOnViewChange,
    /// RMWs are acknowledged and committed like writes: never refused, never aborted (§3.6).
    RmwNeverAborts,
    /// The coordinator completes a write once a majority has acknowledged it, as if Hermes
    /// were majority-based (violates C ACK: every live replica must ACK).
    CommitOnMajority,
    /// Superseded updates are validated like any other: the coordinator sends VAL although a
    /// higher timestamp exists (Hermes with O1 off), and ACKs from replicas holding a higher
    /// timestamp are not told apart. An RMW can then be based on a value already replaced.
    ValidateSuperseded,
    /// A copied chunk overwrites the shadow's copy of a key whatever the timestamps, so a
    /// value copied before a concurrent write can replace that write (§3.4 Recovery).
    ChunkOverwritesNewer,
    /// A shadow serves clients before it has copied every chunk.
    ShadowServes,
    /// Local reads (and RMWs) are served without a valid membership lease (§2.4): a replica
    /// cut off from the others, or paused past its lease, answers from its own state after
    /// the others moved on without it.
    IgnoreLease,
}

impl Bug {
    /// Every variant, for `chorus sim --list-broken` and the tests that must catch each one.
    pub const ALL: [Bug; 9] = [
        Bug::ReadInAnyState,
        Bug::ValIgnoresTimestamp,
        Bug::KeepAcksOnViewChange,
        Bug::RmwNeverAborts,
        Bug::CommitOnMajority,
        Bug::ValidateSuperseded,
        Bug::ChunkOverwritesNewer,
        Bug::ShadowServes,
        Bug::IgnoreLease,
    ];
}

#[derive(Clone, Debug)]
pub struct HermesConfig {
    /// This replica.
    pub me: NodeId,
    /// The view the replica starts in; it serves clients iff `me` is live in it.
    pub initial_view: View,
    /// Message-loss timeout (mlt, §3.4): a coordinator retransmits INVs of a write that has
    /// not gathered its ACKs in this long, and a request stalled on an Invalid key for this
    /// long triggers a write replay.
    pub message_loss_timeout: Time,
    pub optimizations: Optimizations,
    /// Seeds the replica's private PRNG (used to pick O2 virtual ids). Keeps the core
    /// deterministic: same seed, same inputs, same outputs.
    pub seed: u64,
    /// §3.4 Recovery: this replica starts empty in a running cluster (a restart, or a new
    /// node). It ignores everything until the membership installs a view that includes it,
    /// then acts as a shadow: it takes part in writes as a follower while it copies the data
    /// in chunks, and serves clients only once it has every chunk.
    pub recovering: bool,
    /// Whom a shadow asks for chunks first (`chorus node --join ADDR`); any live replica
    /// otherwise, and the next one if the first stops answering.
    pub donor: Option<NodeId>,
    /// A donor splits its keys into chunks of about this many bytes.
    pub chunk_bytes_target: usize,
    #[cfg(feature = "broken-variants")]
    pub bug: Option<Bug>,
}

impl HermesConfig {
    /// A replica of a cluster whose initial view is every node in `replicas`, at epoch 1.
    pub fn new(me: NodeId, replicas: NodeSet) -> HermesConfig {
        HermesConfig {
            me,
            initial_view: View { epoch: chorus_core::Epoch(1), live: replicas },
            message_loss_timeout: Time::from_millis(50),
            optimizations: Optimizations::default(),
            seed: me.0 as u64,
            recovering: false,
            donor: None,
            chunk_bytes_target: 1024 * 1024,
            #[cfg(feature = "broken-variants")]
            bug: None,
        }
    }
}
