//! ZAB configuration.

use chorus_core::{Epoch, NodeId, NodeSet, Time, View};

/// How reads are served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadMode {
    /// From the replica's applied state, at once (ZooKeeper's `getData`). Sequentially
    /// consistent for one replica's clients, not linearizable: a lagging follower returns a
    /// value older than a write that already completed elsewhere.
    Local,
    /// After a sync round trip: the replica asks the leader for its commit point and answers
    /// once it has applied at least that far (ZooKeeper's `sync` + read). Linearizable.
    Sync,
}

impl ReadMode {
    pub fn name(self) -> &'static str {
        match self {
            ReadMode::Local => "local",
            ReadMode::Sync => "sync",
        }
    }
}

/// A deliberately broken protocol variant, used only by tests to show that the simulator and
/// the linearizability checker catch real bugs. Selecting one needs the `broken-variants`
/// feature (the `bug` field of [`ZabConfig`] exists only with it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bug {
    /// The leader commits every proposal at once, without waiting for a quorum of ACKs.
    CommitWithoutQuorum,
    /// The leader answers reads from its latest proposed (uncommitted) state.
    LeaderReadsUncommitted,
    /// Leases are ignored: a leader cut off from the others keeps answering reads (and sync
    /// requests) from its own state until it is removed.
    IgnoreLease,
    /// A replica that restarted empty answers reads from its own state before it has been
    /// synchronised (before the join view, its snapshot and the history after it are in).
    JoinerServesEarly,
}

impl Bug {
    /// Every variant, for `chorus sim --list-broken` and the tests that must catch each one.
    pub const ALL: [Bug; 4] =
        [Bug::CommitWithoutQuorum, Bug::LeaderReadsUncommitted, Bug::IgnoreLease, Bug::JoinerServesEarly];
}

#[derive(Clone, Debug)]
pub struct ZabConfig {
    /// This replica.
    pub me: NodeId,
    /// The view the replica starts in. Its live set is also the ensemble: quorums are
    /// majorities of it, whatever later views hold, so any two quorums intersect.
    pub initial_view: View,
    pub read_mode: ReadMode,
    /// Proposals, forwards, syncs and recovery messages not answered in this long are sent
    /// again; the leader also sends its commit point to followers this often.
    pub retransmit_timeout: Time,
    /// Most entries one proposal message carries when a follower catches up.
    pub catch_up_entries_max: usize,
    /// This replica restarted without its data (in memory, so lost): it joins through the
    /// membership service, takes a snapshot and the history after it from the leader
    /// (ZooKeeper's SNAP), and counts in no quorum and serves no client until then.
    pub recovering: bool,
    /// A snapshot chunk carries keys until it holds about this many bytes (at least one key).
    pub snapshot_chunk_bytes_target: usize,
    /// Applied entries kept past the point every live replica applied (ZooKeeper's committed
    /// log), so a replica that restarts from its own files after missing fewer than this
    /// many takes only those entries (DIFF) rather than a snapshot.
    pub history_retained_entries: u64,
    #[cfg(feature = "broken-variants")]
    pub bug: Option<Bug>,
}

impl ZabConfig {
    /// A replica of an ensemble whose initial view is every node in `replicas`, at epoch 1.
    pub fn new(me: NodeId, replicas: NodeSet) -> ZabConfig {
        ZabConfig {
            me,
            initial_view: View { epoch: Epoch(1), live: replicas },
            read_mode: ReadMode::Sync,
            retransmit_timeout: Time::from_millis(50),
            catch_up_entries_max: 256,
            recovering: false,
            snapshot_chunk_bytes_target: 64 * 1024,
            history_retained_entries: 0,
            #[cfg(feature = "broken-variants")]
            bug: None,
        }
    }

    /// A majority of the ensemble.
    pub fn quorum(&self) -> usize {
        self.initial_view.live.len() / 2 + 1
    }
}
