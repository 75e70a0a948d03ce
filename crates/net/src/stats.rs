//! Counters the transport keeps for INFO and the Prometheus endpoint. Plain relaxed atomics:
//! writers are the event loop and one writer task per peer; readers only take snapshots.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use chorus_core::NodeId;

/// A fixed-bucket histogram (Prometheus style: `le` upper bounds, cumulative when rendered).
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [u64],
    /// One count per bound plus the `+Inf` bucket; not cumulative.
    counts: Box<[AtomicU64]>,
    sum: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &'static [u64]) -> Histogram {
        debug_assert!(bounds.windows(2).all(|w| w[0] < w[1]), "bounds must increase");
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, value: u64) {
        let bucket = self.bounds.partition_point(|bound| *bound < value);
        self.counts[bucket].fetch_add(1, Relaxed);
        self.sum.fetch_add(value, Relaxed);
    }

    pub fn bounds(&self) -> &'static [u64] {
        self.bounds
    }

    /// Cumulative counts per bound, then the total (the `+Inf` bucket), and the sum.
    pub fn snapshot(&self) -> (Vec<u64>, u64) {
        let mut running = 0;
        let cumulative = self
            .counts
            .iter()
            .map(|count| {
                running += count.load(Relaxed);
                running
            })
            .collect();
        (cumulative, self.sum.load(Relaxed))
    }
}

/// Batch sizes in messages per frame.
pub const BATCH_MESSAGES_BOUNDS: &[u64] = &[1, 2, 4, 8, 16, 32, 64, 128, 256, 1024];

/// One peer link's counters (the sending direction, plus what we received from that peer).
#[derive(Debug)]
pub struct PeerStats {
    pub node: NodeId,
    pub addr: String,
    pub connected: AtomicBool,
    pub connects: AtomicU64,
    /// Bytes queued for the writer and not yet written: the credits in use.
    pub queued_bytes: AtomicU64,
    pub queued_frames: AtomicU64,
    pub frames_sent: AtomicU64,
    pub messages_sent: AtomicU64,
    pub bytes_sent: AtomicU64,
    /// Writes to the socket; fewer than frames when the writer coalesced frames.
    pub writes: AtomicU64,
    pub frames_dropped: AtomicU64,
    pub messages_dropped: AtomicU64,
    pub frames_received: AtomicU64,
    pub messages_received: AtomicU64,
    pub batch_messages: Histogram,
}

impl PeerStats {
    pub fn new(node: NodeId, addr: String) -> PeerStats {
        PeerStats {
            node,
            addr,
            connected: AtomicBool::new(false),
            connects: AtomicU64::new(0),
            queued_bytes: AtomicU64::new(0),
            queued_frames: AtomicU64::new(0),
            frames_sent: AtomicU64::new(0),
            messages_sent: AtomicU64::new(0),
            bytes_sent: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            frames_dropped: AtomicU64::new(0),
            messages_dropped: AtomicU64::new(0),
            frames_received: AtomicU64::new(0),
            messages_received: AtomicU64::new(0),
            batch_messages: Histogram::new(BATCH_MESSAGES_BOUNDS),
        }
    }

    pub fn snapshot(&self) -> PeerStatsSnapshot {
        PeerStatsSnapshot {
            node: self.node,
            addr: self.addr.clone(),
            connected: self.connected.load(Relaxed),
            connects: self.connects.load(Relaxed),
            queued_bytes: self.queued_bytes.load(Relaxed),
            queued_frames: self.queued_frames.load(Relaxed),
            frames_sent: self.frames_sent.load(Relaxed),
            messages_sent: self.messages_sent.load(Relaxed),
            bytes_sent: self.bytes_sent.load(Relaxed),
            writes: self.writes.load(Relaxed),
            frames_dropped: self.frames_dropped.load(Relaxed),
            messages_dropped: self.messages_dropped.load(Relaxed),
            frames_received: self.frames_received.load(Relaxed),
            messages_received: self.messages_received.load(Relaxed),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerStatsSnapshot {
    pub node: NodeId,
    pub addr: String,
    pub connected: bool,
    pub connects: u64,
    pub queued_bytes: u64,
    pub queued_frames: u64,
    pub frames_sent: u64,
    pub messages_sent: u64,
    pub bytes_sent: u64,
    pub writes: u64,
    pub frames_dropped: u64,
    pub messages_dropped: u64,
    pub frames_received: u64,
    pub messages_received: u64,
}

/// The whole transport's counters.
#[derive(Debug)]
pub struct NetStats {
    pub peers: BTreeMap<NodeId, Arc<PeerStats>>,
    /// Inbound connections closed because the handshake failed or a frame was malformed.
    pub connections_refused: AtomicU64,
    pub inbound_connections: AtomicU64,
    /// Inbound links closed because they stayed silent past the link timeout.
    pub links_timed_out: AtomicU64,
}

impl NetStats {
    pub fn connected_peers(&self) -> usize {
        self.peers.values().filter(|peer| peer.connected.load(Relaxed)).count()
    }
}
