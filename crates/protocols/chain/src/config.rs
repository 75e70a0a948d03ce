//! Chain store configuration.

use chorus_core::{Epoch, NodeId, NodeSet, Time, View};

use crate::durable::ChainState;
use crate::layout::ChainLayout;

/// A deliberately broken variant, used only by tests to show the simulator's checker catches
/// real bugs. Selecting one needs the `broken-variants` feature.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bug {
    /// Replicas other than the tail read without the read lock (ignoring the group write
    /// lock), so they can return a write the tail has not executed yet.
    ReadWithoutLock,
    /// The coordinator executes records without taking the group write lock.
    NoWriteLock,
    /// A joining member is linked into the chain as soon as it accepted the copy group, before
    /// any chunk of the copy was acknowledged (§5.1 says: only after the catch-up phase), so
    /// the new member serves a region that is empty or stale.
    LinkBeforeCopyCompletes,
}

impl Bug {
    /// Every variant, for `chorus sim --list-broken` and the tests that must catch each one.
    pub const ALL: [Bug; 3] = [Bug::ReadWithoutLock, Bug::NoWriteLock, Bug::LinkBeforeCopyCompletes];
}

#[derive(Clone, Debug)]
pub struct ChainConfig {
    pub me: NodeId,
    /// The view the replica starts in; the chain is its live nodes in id order.
    pub initial_view: View,
    pub layout: ChainLayout,
    /// Resend an unacknowledged group operation, or an unanswered forward, after this long.
    pub retransmit_timeout: Time,
    /// Group operations in flight at most.
    pub window_max: usize,
    /// This node starts without the data (a restart, a replacement machine: `chorus node
    /// --join`): it serves nothing until the coordinator has copied the log and the database
    /// region to it and linked it into the chain (§5.1).
    pub joining: bool,
    /// The coordinator copies the region to a joiner in gWRITEs of this many bytes.
    pub copy_chunk_bytes: u64,
    /// What this node recorded before it stopped (`crate::durable`), when it restarts on its
    /// data directory: linked and not `joining`, it comes back as the member it was (it
    /// serves again once the head configured the chain with it); joining, it offers its
    /// region for a catch-up if the record says the region is whole.
    pub restored: Option<ChainState>,
    /// Tells this start of the node apart from every earlier one (the server: the clock and
    /// the process id; the simulator: the restart's seed). Forwards name the coordinator
    /// incarnation they went to.
    pub incarnation: u64,
    /// Where this node numbers its forwarded updates from: above every number an earlier
    /// start used (a coordinator may remember those), so a restarted origin's updates are
    /// never taken for duplicates.
    pub seq_floor: u64,
    #[cfg(feature = "broken-variants")]
    pub bug: Option<Bug>,
}

impl ChainConfig {
    /// A replica of a chain over every node of `replicas`, epoch 1, with a small layout
    /// (64 KiB log, 4,096 index slots, 1 MiB heap).
    pub fn new(me: NodeId, replicas: NodeSet) -> ChainConfig {
        ChainConfig {
            me,
            initial_view: View { epoch: Epoch(1), live: replicas },
            layout: ChainLayout::new(64 * 1024, 4096, 1024 * 1024).expect("default layout is valid"),
            retransmit_timeout: Time::from_millis(20),
            window_max: 256,
            joining: false,
            copy_chunk_bytes: 4096,
            restored: None,
            incarnation: 1,
            seq_floor: 0,
            #[cfg(feature = "broken-variants")]
            bug: None,
        }
    }

    /// The server's shape: a 4 MiB log (values up to about 1 MiB), 65,536 index slots (keys),
    /// a 64 MiB heap: a region of 69 MiB per node.
    pub fn server(me: NodeId, replicas: NodeSet) -> ChainConfig {
        let mut config = ChainConfig::new(me, replicas);
        config.layout = ChainLayout::server();
        config.retransmit_timeout = Time::from_millis(50);
        // 69 MiB in 1,104 frames, well under the peer frame limit.
        config.copy_chunk_bytes = 64 * 1024;
        config
    }
}
