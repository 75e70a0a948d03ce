//! Pub/Sub frames on the peer links ([`kind::PUBSUB`]): a node's published messages go to
//! every peer over the same authenticated connections as the protocol's batches, but never
//! through the event loop. Opaque to this crate: the server encodes what a frame carries.
//!
//! * **Sending** ([`PubSubPort::broadcast`]): one frame, encoded once, queued on every peer's
//!   data connection, from any task or thread. A peer whose link is down, or whose queue
//!   already holds half of [`NetConfig::peer_queue_bytes_max`](crate::NetConfig), loses the
//!   frame (counted in [`PubSubPort::dropped`]): Pub/Sub is at most once, as in Redis, and can
//!   never take the whole queue from the protocol's messages.
//! * **Order.** Frames for one peer share one FIFO queue and one TCP connection with no
//!   retransmission, so a peer receives one node's frames in the order they were queued,
//!   with gaps where frames were dropped, never duplicated or reordered.
//! * **Receiving**: the link's reader hands each frame to the port's `deliver` callback at
//!   once, on the reader's task; the callback must not block.
//! * **Polled links** (the server's reactor, [`crate::links`]): the same guarantees, with the
//!   frames queued in the port ([`PubSubPort::attach_polled`]) until the event loop's thread,
//!   woken, moves them onto its links, and received frames delivered from that thread.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;

use bytes::{Bytes, BytesMut};
use chorus_core::codec::{self, encode_frame};
use chorus_core::NodeId;

use crate::kind;
use crate::transport::Link;

type Deliver = Box<dyn Fn(NodeId, Bytes) + Send + Sync>;

/// Where one transport's Pub/Sub frames come in and go out. Put it in
/// [`NetConfig::pubsub`](crate::NetConfig) before [`start`](crate::start); the transport
/// attaches its links to it when it starts.
pub struct PubSubPort {
    deliver: Deliver,
    links: OnceLock<Attached>,
    /// Frames queued for a peer.
    pub sent: AtomicU64,
    /// Frames a peer did not get: its link was down or its queue was too full.
    pub dropped: AtomicU64,
    /// Frames received from peers.
    pub received: AtomicU64,
}

struct Attached {
    /// Where frames go: the transport's writer tasks, or an event loop that polls its links.
    route: Route,
    frame_payload_bytes_max: usize,
    queue_bytes_max: u64,
}

enum Route {
    /// The transport's links, each with its writer task ([`crate::transport::start`]).
    Tasks(Vec<Link>),
    /// Links an event loop owns ([`crate::links::Links`], after [`crate::start_handover`]): it
    /// takes the frames queued here ([`PubSubPort::take_polled`]) on the turn `wake` causes.
    Polled { peers: usize, frames: std::sync::Mutex<PolledFrames>, wake: Box<dyn Fn() + Send + Sync> },
}

/// Frames waiting for the polling event loop.
#[derive(Default)]
pub struct PolledFrames {
    pub frames: Vec<Bytes>,
    pub bytes: u64,
}

impl fmt::Debug for PubSubPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PubSubPort").field("attached", &self.links.get().is_some()).finish()
    }
}

impl PubSubPort {
    /// A port whose received frames go to `deliver(sender, payload)`.
    pub fn new(deliver: impl Fn(NodeId, Bytes) + Send + Sync + 'static) -> PubSubPort {
        PubSubPort {
            deliver: Box::new(deliver),
            links: OnceLock::new(),
            sent: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            received: AtomicU64::new(0),
        }
    }

    pub(crate) fn attach(&self, links: Vec<Link>, frame_payload_bytes_max: usize, peer_queue_bytes_max: u64) {
        let attached = Attached {
            route: Route::Tasks(links),
            frame_payload_bytes_max,
            queue_bytes_max: peer_queue_bytes_max / 2,
        };
        self.set_attached(attached);
    }

    /// Attach to links an event loop polls itself (the server's reactor): frames queue here,
    /// `wake` interrupts its poll, and it moves them onto its links ([`Self::take_polled`]).
    pub fn attach_polled(
        &self,
        peers: usize,
        frame_payload_bytes_max: usize,
        peer_queue_bytes_max: u64,
        wake: impl Fn() + Send + Sync + 'static,
    ) {
        let route = Route::Polled { peers, frames: Default::default(), wake: Box::new(wake) };
        self.set_attached(Attached {
            route,
            frame_payload_bytes_max,
            queue_bytes_max: peer_queue_bytes_max / 2,
        });
    }

    /// The frames queued for the polling event loop since it last looked.
    pub fn take_polled(&self) -> Vec<Bytes> {
        match self.links.get().map(|attached| &attached.route) {
            Some(Route::Polled { frames, .. }) => {
                let mut frames = frames.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                frames.bytes = 0;
                std::mem::take(&mut frames.frames)
            }
            _ => Vec::new(),
        }
    }

    /// A frame the polling event loop could not send (its link is down or full): counted.
    pub fn count_dropped(&self, frames: u64) {
        self.dropped.fetch_add(frames, Relaxed);
    }

    fn set_attached(&self, attached: Attached) {
        if self.links.set(attached).is_err() {
            tracing::warn!("a Pub/Sub port was attached to a second transport; the first keeps it");
        }
    }

    pub(crate) fn deliver(&self, from: NodeId, payload: Bytes) {
        self.received.fetch_add(1, Relaxed);
        (self.deliver)(from, payload);
    }

    /// The largest payload a frame may carry; `None` before the transport started.
    pub fn payload_bytes_max(&self) -> Option<usize> {
        self.links.get().map(|attached| attached.frame_payload_bytes_max)
    }

    /// How many peers the transport links to (0 before it started).
    pub fn peers(&self) -> usize {
        self.links.get().map_or(0, |attached| match &attached.route {
            Route::Tasks(links) => links.len(),
            Route::Polled { peers, .. } => *peers,
        })
    }

    /// Queue `payload` as one frame for every peer; how many peers it was queued for. Never
    /// blocks. A payload over the frame limit goes nowhere (check
    /// [`PubSubPort::payload_bytes_max`] first).
    pub fn broadcast(&self, payload: &[u8]) -> usize {
        let Some(attached) = self.links.get() else { return 0 };
        if payload.len() > attached.frame_payload_bytes_max {
            self.dropped.fetch_add(self.peers() as u64, Relaxed);
            return 0;
        }
        let mut frame = BytesMut::with_capacity(payload.len() + codec::FRAME_HEADER_BYTES);
        encode_frame(kind::PUBSUB, payload, &mut frame);
        let frame = frame.freeze();
        let bytes = frame.len() as u64;
        let links = match &attached.route {
            Route::Tasks(links) => links,
            Route::Polled { peers, frames, wake } => {
                let mut waiting = frames.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                if waiting.bytes > 0 && waiting.bytes + bytes > attached.queue_bytes_max {
                    self.dropped.fetch_add(*peers as u64, Relaxed);
                    return 0;
                }
                waiting.bytes += bytes;
                waiting.frames.push(frame);
                drop(waiting);
                wake();
                // Sent (or dropped, counted) by the event loop on its next turn.
                self.sent.fetch_add(*peers as u64, Relaxed);
                return *peers;
            }
        };
        let mut queued = 0;
        for link in links {
            let waiting = link.stats.queued_bytes.load(Relaxed);
            let full = waiting > 0 && waiting + bytes > attached.queue_bytes_max;
            if !link.stats.connected.load(Relaxed) || full {
                self.dropped.fetch_add(1, Relaxed);
                continue;
            }
            link.stats.queued_bytes.fetch_add(bytes, Relaxed);
            link.stats.queued_frames.fetch_add(1, Relaxed);
            if link.tx.send((frame.clone(), 0)).is_err() {
                // The writer is gone (the node is stopping): give the credits back.
                link.stats.queued_bytes.fetch_sub(bytes, Relaxed);
                link.stats.queued_frames.fetch_sub(1, Relaxed);
                self.dropped.fetch_add(1, Relaxed);
                continue;
            }
            queued += 1;
        }
        self.sent.fetch_add(queued as u64, Relaxed);
        queued
    }
}
