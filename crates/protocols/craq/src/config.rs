//! CRAQ configuration.

use chorus_core::{Epoch, NodeId, NodeSet, Time, View};

/// A deliberately broken protocol variant, used only by tests to show that the simulator and
/// the linearizability checker catch real bugs. Selecting one needs the `broken-variants`
/// feature (the `bug` field of [`CraqConfig`] exists only with it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bug {
    /// A replica answers reads with its latest version even when it is dirty, instead of
    /// asking the tail which version is committed (what chain replication without CRAQ's
    /// version query would do if it read from any node).
    ReadDirtyLocally,
    /// The head acknowledges a write to its origin as soon as it has assigned the version,
    /// before the tail committed it.
    AckAtHead,
    /// Leases are ignored: a replica cut off from the others keeps answering reads (and the
    /// tail version queries) from its own state until it is removed.
    IgnoreLease,
    /// A joiner serves clients before it has copied every chunk (from whatever it holds).
    JoinerServes,
    /// A replica removed while alive comes back with the data it had (no copy), as if it
    /// had never left: what was written meanwhile is missing from its clean versions.
    RejoinWithoutCopy,
}

impl Bug {
    /// Every variant, for `chorus sim --list-broken` and the tests that must catch each one.
    pub const ALL: [Bug; 5] =
        [Bug::ReadDirtyLocally, Bug::AckAtHead, Bug::IgnoreLease, Bug::JoinerServes, Bug::RejoinWithoutCopy];
}

#[derive(Clone, Debug)]
pub struct CraqConfig {
    /// This replica.
    pub me: NodeId,
    /// The view the replica starts in; it serves clients iff `me` is live in it.
    pub initial_view: View,
    /// A write not acknowledged by the successor in this long is sent down the chain again;
    /// a forward not seen in the chain, or a version query not answered, is sent again.
    pub retransmit_timeout: Time,
    /// Joining (Hermes §3.4 Recovery): this replica starts empty in a running cluster (a
    /// restart, or a new node). It ignores everything until the membership installs a view
    /// that includes it, then copies the state of its chain neighbour in chunks while linked
    /// into the chain, and serves clients only once it has every chunk.
    pub recovering: bool,
    /// A donor splits its keys into chunks of about this many bytes.
    pub chunk_bytes_target: usize,
    #[cfg(feature = "broken-variants")]
    pub bug: Option<Bug>,
}

impl CraqConfig {
    /// A replica of a chain whose initial view is every node in `replicas`, at epoch 1.
    pub fn new(me: NodeId, replicas: NodeSet) -> CraqConfig {
        CraqConfig {
            me,
            initial_view: View { epoch: Epoch(1), live: replicas },
            retransmit_timeout: Time::from_millis(50),
            recovering: false,
            chunk_bytes_target: 1024 * 1024,
            #[cfg(feature = "broken-variants")]
            bug: None,
        }
    }
}
