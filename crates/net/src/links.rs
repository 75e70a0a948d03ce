//! Peer links driven by an event loop that owns their sockets (the server's reactor, issue 23):
//! the same frames, batching, credits, keepalives and silence timeout as the task-based
//! [`crate::Transport`], without a task, a channel or a waker between the event loop and the
//! socket. [`crate::transport::start_handover`] dials, accepts and authenticates the links
//! on tokio and hands each one over; from then on the event loop
//!
//! * encodes a turn's messages once and appends one batch frame per peer and lane to that
//!   lane's output buffer ([`Links::send_turn`]),
//! * writes every lane's buffer once per pass of its poll loop ([`Links::flush`]), keeping what
//!   the kernel did not take until the socket is writable again,
//! * reads every readable inbound link, decodes its frames and hands each batch to the core at
//!   once ([`Links::on_event`]),
//! * sends keepalives and closes silent links on its timer ([`Links::on_timer`]).
//!
//! A failed outbound link is closed here and reported to its dialer, which redials with
//! backoff and hands the new link over; frames for a lane that is down are dropped and counted
//! (Hermes retransmits), as the task-based transport does.

use std::io::{self, Read, Write};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use chorus_core::codec::{self, decode_batch, decode_frame, encode_frame, WireMessage};
use chorus_core::{Destination, NodeId};
use mio::{Interest, Registry, Token};
use tracing::{debug, info, warn};

use crate::kind;
use crate::stats::{NetStats, PeerStats};
use crate::transport::{InboundLink, NetConfig, OutboundLink};
use crate::turn::TurnEncoder;

/// Tokens from the owner's base: two per peer (data, priority), then the inbound links.
const INBOUND_TOKEN_OFFSET: usize = 1024;
/// Tokens reserved for links from the owner's base.
pub const TOKENS: usize = 1 << 20;
/// Read at most this much from one inbound link per readiness event before serving others.
const READ_BYTES_PER_EVENT_MAX: usize = 1024 * 1024;

/// One lane of one peer: the data connection or the priority one.
struct Lane {
    stream: Option<mio::net::TcpStream>,
    /// Told when the link fails (the dialer redials) or when `Links` is dropped.
    closed: Option<tokio::sync::oneshot::Sender<bool>>,
    /// Bytes the kernel has not taken yet.
    pending: BytesMut,
    pending_frames: u64,
    pending_messages: u64,
    /// The socket returned WouldBlock: wait for a writable event.
    blocked: bool,
    last_sent: Instant,
    /// Since when frames have waited for a link that is not up ([`Links::on_timer`] drops
    /// them after the link timeout, as the writer tasks drop theirs after a failed dial).
    waiting_since: Option<Instant>,
    /// The lane had a link once: while it is down again, frames are dropped, not kept (the
    /// peer may come back as a new process, to which they would be stale: raftlog's refusal
    /// of a node that lost its data must not reach its replacement).
    was_up: bool,
}

impl Lane {
    fn new() -> Lane {
        Lane {
            stream: None,
            closed: None,
            pending: BytesMut::new(),
            pending_frames: 0,
            pending_messages: 0,
            blocked: false,
            last_sent: Instant::now(),
            waiting_since: None,
            was_up: false,
        }
    }
}

impl Lane {
    /// Drop what the lane holds, counted as dropped.
    fn drop_pending(&mut self, stats: &PeerStats) {
        stats.queued_bytes.fetch_sub(self.pending.len() as u64, Relaxed);
        stats.queued_frames.fetch_sub(self.pending_frames, Relaxed);
        stats.frames_dropped.fetch_add(self.pending_frames, Relaxed);
        stats.messages_dropped.fetch_add(self.pending_messages, Relaxed);
        self.pending.clear();
        self.pending_frames = 0;
        self.pending_messages = 0;
    }
}

struct Peer {
    node: NodeId,
    stats: Arc<PeerStats>,
    /// `[data, priority]`.
    lanes: [Lane; 2],
}

struct InLink {
    node: NodeId,
    stream: mio::net::TcpStream,
    buf: BytesMut,
    last_heard: Instant,
}

/// Every peer link of one event loop.
pub struct Links<M> {
    stats: Arc<NetStats>,
    peers: Vec<Peer>,
    inbound: Vec<Option<InLink>>,
    /// Inbound links left with bytes unread after their read budget: read again next pass.
    unfinished: Vec<usize>,
    token_base: usize,
    frame_payload_bytes_max: usize,
    peer_queue_bytes_max: usize,
    priority_lane: bool,
    keepalive: Duration,
    link_timeout: Duration,
    keepalive_frame: BytesMut,
    /// This turn's messages, each encoded once.
    turn: TurnEncoder,
    priority: fn(&M) -> bool,
    /// Where Pub/Sub frames come in and go out (`NetConfig::pubsub`).
    pubsub: Option<Arc<crate::pubsub::PubSubPort>>,
}

impl<M: WireMessage> Links<M> {
    /// Links for `config`'s peers, counted in `stats` (what [`crate::transport::start_handover`]
    /// returned); their tokens start at `token_base` and span [`TOKENS`].
    pub fn new(config: &NetConfig, stats: Arc<NetStats>, token_base: usize) -> Links<M> {
        let peers = stats
            .peers
            .values()
            .map(|peer| Peer { node: peer.node, stats: peer.clone(), lanes: [Lane::new(), Lane::new()] })
            .collect();
        let mut keepalive_frame = BytesMut::new();
        encode_frame(kind::KEEPALIVE, &[], &mut keepalive_frame);
        Links {
            stats,
            peers,
            inbound: Vec::new(),
            unfinished: Vec::new(),
            token_base,
            frame_payload_bytes_max: config.frame_payload_bytes_max,
            peer_queue_bytes_max: config.peer_queue_bytes_max,
            priority_lane: config.priority_lane,
            keepalive: config.link_timeout / 4,
            link_timeout: config.link_timeout,
            keepalive_frame,
            turn: TurnEncoder::default(),
            priority: |_| false,
            pubsub: config.pubsub.clone(),
        }
    }

    /// Queue the Pub/Sub frames published since the last turn on every peer's data lane
    /// (written by the next [`Links::flush`]); a peer whose link is down, or whose lane holds
    /// half its queue, loses the frame, counted, as on the writer tasks.
    pub fn send_pubsub(&mut self) {
        let Some(port) = &self.pubsub else { return };
        for frame in port.take_polled() {
            for peer in &mut self.peers {
                let lane = &mut peer.lanes[0];
                let full = !lane.pending.is_empty()
                    && lane.pending.len() + frame.len() > self.peer_queue_bytes_max / 2;
                if lane.stream.is_none() || full {
                    port.count_dropped(1);
                    continue;
                }
                lane.pending.extend_from_slice(&frame);
                lane.pending_frames += 1;
                peer.stats.queued_bytes.fetch_add(frame.len() as u64, Relaxed);
                peer.stats.queued_frames.fetch_add(1, Relaxed);
            }
        }
    }

    /// Which messages take the priority lane (when it is open).
    pub fn set_priority(&mut self, classify: fn(&M) -> bool) {
        self.priority = classify;
    }

    pub fn stats(&self) -> &Arc<NetStats> {
        &self.stats
    }

    /// Whether `token` is one of these links'.
    pub fn owns(&self, token: Token) -> bool {
        (self.token_base..self.token_base + TOKENS).contains(&token.0)
    }

    /// Take over a link a dialer established.
    pub fn add_outbound(&mut self, registry: &Registry, link: OutboundLink) {
        let Some(index) = self.peers.iter().position(|peer| peer.node == link.node) else {
            let _ = link.closed.send(false);
            return;
        };
        let lane_index = usize::from(link.priority);
        let token = Token(self.token_base + 2 * index + lane_index);
        self.close_lane(registry, index, lane_index, true);
        let mut stream = mio::net::TcpStream::from_std(link.stream);
        if let Err(error) = registry.register(&mut stream, token, Interest::READABLE | Interest::WRITABLE) {
            warn!(peer = %link.node, "cannot watch a peer link: {error}");
            let _ = link.closed.send(true);
            return;
        }
        let lane = &mut self.peers[index].lanes[lane_index];
        lane.stream = Some(stream);
        lane.waiting_since = None;
        lane.was_up = true;
        lane.closed = Some(link.closed);
        lane.blocked = false;
        lane.last_sent = Instant::now();
    }

    /// Take over a link a peer dialled; what arrived with its handshake is delivered now.
    pub fn add_inbound(
        &mut self,
        registry: &Registry,
        link: InboundLink,
        deliver: &mut impl FnMut(NodeId, Vec<M>),
    ) {
        let slot = match self.inbound.iter().position(Option::is_none) {
            Some(slot) => slot,
            None => {
                self.inbound.push(None);
                self.inbound.len() - 1
            }
        };
        if INBOUND_TOKEN_OFFSET + slot >= TOKENS {
            warn!(peer = %link.node, "too many inbound peer links; closing this one");
            return;
        }
        let token = Token(self.token_base + INBOUND_TOKEN_OFFSET + slot);
        let mut stream = mio::net::TcpStream::from_std(link.stream);
        if let Err(error) = registry.register(&mut stream, token, Interest::READABLE) {
            warn!(peer = %link.node, "cannot watch a peer link: {error}");
            return;
        }
        self.inbound[slot] =
            Some(InLink { node: link.node, stream, buf: link.buffered, last_heard: Instant::now() });
        // Bytes may have arrived between the handshake and the registration: read them now
        // (an edge that fired before the registration is not reported again).
        self.read_inbound(registry, slot, deliver);
    }

    /// Handle a readiness event for one of these links' tokens.
    pub fn on_event(
        &mut self,
        registry: &Registry,
        token: Token,
        readable: bool,
        writable: bool,
        deliver: &mut impl FnMut(NodeId, Vec<M>),
    ) {
        let offset = token.0 - self.token_base;
        if offset >= INBOUND_TOKEN_OFFSET {
            if readable {
                self.read_inbound(registry, offset - INBOUND_TOKEN_OFFSET, deliver);
            }
            return;
        }
        let (index, lane_index) = (offset / 2, offset % 2);
        if index >= self.peers.len() {
            return;
        }
        if readable {
            self.probe_outbound(registry, index, lane_index);
        }
        if writable {
            let lane = &mut self.peers[index].lanes[lane_index];
            lane.blocked = false;
            if !lane.pending.is_empty() {
                self.write_lane(registry, index, lane_index);
            }
        }
    }

    /// A send-only link is readable only when the peer closed it (or broke the protocol).
    fn probe_outbound(&mut self, registry: &Registry, index: usize, lane_index: usize) {
        let Some(stream) = self.peers[index].lanes[lane_index].stream.as_mut() else { return };
        let mut probe = [0u8; 64];
        let error = match stream.read(&mut probe) {
            Ok(0) => "peer closed the connection".to_string(),
            Ok(_) => "peer sent data on a send-only link".to_string(),
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => return,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => return,
            Err(error) => error.to_string(),
        };
        info!(peer = %self.peers[index].node, "peer link down: {error}");
        self.close_lane(registry, index, lane_index, true);
    }

    /// Send every message one turn produced: each encoded once, one batch frame per peer and
    /// lane appended to the lane's buffer; [`Links::flush`] writes them. A lane over its
    /// credits, or whose link went down, loses the frame (counted); a lane whose first link
    /// is not up yet keeps it for that link (at most the link timeout).
    pub fn send_turn(&mut self, messages: &mut Vec<(Destination, M)>) {
        if messages.is_empty() {
            return;
        }
        self.turn.encode(messages, self.priority);
        for index in 0..self.peers.len() {
            if self.priority_lane {
                self.fill_lane(index, 1, |priority| priority);
                self.fill_lane(index, 0, |priority| !priority);
            } else {
                self.fill_lane(index, 0, |_| true);
            }
        }
    }

    /// Queue on one lane of peer `index` every message of this turn that `takes` accepts.
    fn fill_lane(&mut self, index: usize, lane_index: usize, takes: impl Fn(bool) -> bool) {
        let Peer { node, stats, lanes } = &mut self.peers[index];
        let queue_bytes_max = self.peer_queue_bytes_max;
        self.turn.batches(
            *node,
            takes,
            self.frame_payload_bytes_max,
            |payload, count| {
                queue_frame(&mut lanes[lane_index], lane_index, stats, payload, count, queue_bytes_max)
            },
            |size| {
                warn!(peer = %node, size, "message larger than the frame limit dropped");
                stats.messages_dropped.fetch_add(1, Relaxed);
            },
        );
    }

    /// Write what every lane holds, one `write` per lane (the turn's frames coalesced).
    pub fn flush(&mut self, registry: &Registry) {
        for index in 0..self.peers.len() {
            for lane_index in 0..2 {
                let lane = &self.peers[index].lanes[lane_index];
                if !lane.pending.is_empty() && !lane.blocked {
                    self.write_lane(registry, index, lane_index);
                }
            }
        }
    }

    fn write_lane(&mut self, registry: &Registry, index: usize, lane_index: usize) {
        let peer = &mut self.peers[index];
        let lane = &mut peer.lanes[lane_index];
        let Some(stream) = lane.stream.as_mut() else { return };
        let mut written = 0usize;
        let mut failure = None;
        while written < lane.pending.len() {
            match stream.write(&lane.pending[written..]) {
                Ok(0) => {
                    failure = Some("the connection took no bytes".to_string());
                    break;
                }
                Ok(n) => written += n,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                    lane.blocked = true;
                    break;
                }
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => {
                    failure = Some(error.to_string());
                    break;
                }
            }
        }
        if written > 0 {
            lane.pending.advance(written);
            peer.stats.queued_bytes.fetch_sub(written as u64, Relaxed);
            peer.stats.bytes_sent.fetch_add(written as u64, Relaxed);
            peer.stats.writes.fetch_add(1, Relaxed);
            lane.last_sent = Instant::now();
        }
        if lane.pending.is_empty() {
            peer.stats.queued_frames.fetch_sub(lane.pending_frames, Relaxed);
            peer.stats.frames_sent.fetch_add(lane.pending_frames, Relaxed);
            peer.stats.messages_sent.fetch_add(lane.pending_messages, Relaxed);
            lane.pending_frames = 0;
            lane.pending_messages = 0;
            // Keep a buffer that grew for a burst from pinning its memory forever.
            if lane.pending.capacity() > 4 * 1024 * 1024 {
                lane.pending = BytesMut::new();
            }
        }
        if let Some(error) = failure {
            info!(peer = %peer.node, "peer link down: {error}; redialling");
            self.close_lane(registry, index, lane_index, true);
        }
    }

    /// Close one lane's connection; what it still held is dropped and counted (a lane that
    /// had no connection keeps what it queued meanwhile). `failed`: its dialer redials
    /// (otherwise it stops).
    fn close_lane(&mut self, registry: &Registry, index: usize, lane_index: usize, failed: bool) {
        let peer = &mut self.peers[index];
        let lane = &mut peer.lanes[lane_index];
        let was_connected = match lane.stream.take() {
            Some(mut stream) => {
                let _ = registry.deregister(&mut stream);
                true
            }
            None => false,
        };
        if let Some(closed) = lane.closed.take() {
            let _ = closed.send(failed);
        }
        lane.blocked = false;
        if !was_connected {
            // Frames queued while it waited for its link: the new link writes them.
            return;
        }
        // What a failed connection did not take (maybe part of a frame) is lost with it.
        lane.drop_pending(&peer.stats);
    }

    /// Read an inbound link and deliver every whole batch in it.
    fn read_inbound(&mut self, registry: &Registry, slot: usize, deliver: &mut impl FnMut(NodeId, Vec<M>)) {
        let Some(link) = self.inbound.get_mut(slot).and_then(Option::as_mut) else { return };
        let mut read_total = 0usize;
        let mut closed = None;
        loop {
            let pubsub = self.pubsub.as_deref();
            if let Err(error) =
                decode_batches(link, self.frame_payload_bytes_max, &self.stats, pubsub, deliver)
            {
                closed = Some(error);
                break;
            }
            if read_total >= READ_BYTES_PER_EVENT_MAX {
                // More may be waiting, and with edge-triggered readiness it would not be
                // reported again: read on in the next pass (`read_unfinished`), after the
                // loop has served everyone else.
                if !self.unfinished.contains(&slot) {
                    self.unfinished.push(slot);
                }
                break;
            }
            link.buf.reserve(16 * 1024);
            let spare = link.buf.capacity() - link.buf.len();
            match read_into(&mut link.stream, &mut link.buf) {
                Ok(0) => {
                    closed = Some("closed by the peer".to_string());
                    break;
                }
                Ok(n) => {
                    read_total += n;
                    link.last_heard = Instant::now();
                    if n < spare {
                        // A short read drained the socket (as tokio assumes too): the next
                        // bytes will raise a new edge.
                        let pubsub = self.pubsub.as_deref();
                        let _ =
                            decode_batches(link, self.frame_payload_bytes_max, &self.stats, pubsub, deliver)
                                .map_err(|error| closed = Some(error));
                        break;
                    }
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => break,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => {
                    closed = Some(error.to_string());
                    break;
                }
            }
        }
        if let Some(reason) = closed {
            let mut link = self.inbound[slot].take().expect("the link just read");
            debug!(peer = %link.node, "inbound peer link closed: {reason}");
            let _ = registry.deregister(&mut link.stream);
        }
    }

    /// Whether some inbound link was left with bytes to read ([`Links::read_unfinished`]):
    /// the owner's next poll must not sleep.
    pub fn has_unfinished_reads(&self) -> bool {
        !self.unfinished.is_empty()
    }

    /// Read on where a link's read budget ran out.
    pub fn read_unfinished(&mut self, registry: &Registry, deliver: &mut impl FnMut(NodeId, Vec<M>)) {
        for slot in std::mem::take(&mut self.unfinished) {
            self.read_inbound(registry, slot, deliver);
        }
    }

    /// Keepalives for idle lanes, and silent inbound links closed (their peer is gone or cut
    /// off). Call every few milliseconds.
    pub fn on_timer(&mut self, registry: &Registry) {
        let now = Instant::now();
        for peer in &mut self.peers {
            for lane in &mut peer.lanes {
                if lane.waiting_since.is_some_and(|since| now.duration_since(since) >= self.link_timeout) {
                    // Its link stayed down: what waited for it is stale by now.
                    lane.waiting_since = None;
                    lane.drop_pending(&peer.stats);
                }
                if lane.stream.is_some() && now.duration_since(lane.last_sent) >= self.keepalive {
                    lane.pending.extend_from_slice(&self.keepalive_frame);
                    peer.stats.queued_bytes.fetch_add(self.keepalive_frame.len() as u64, Relaxed);
                    // Counted as sent at once: it is no frame of the protocol's.
                    lane.last_sent = now;
                }
            }
        }
        for slot in self.inbound.iter_mut() {
            if slot.as_ref().is_none_or(|link| now.duration_since(link.last_heard) < self.link_timeout) {
                continue;
            }
            self.stats.links_timed_out.fetch_add(1, Relaxed);
            let mut link = slot.take().expect("checked");
            warn!(
                peer = %link.node,
                "closing inbound peer link: silent for {} ms although keepalives are due",
                self.link_timeout.as_millis()
            );
            let _ = registry.deregister(&mut link.stream);
        }
    }
}

impl<M> Drop for Links<M> {
    /// The dialers stop: their links' owner is gone.
    fn drop(&mut self) {
        for peer in &mut self.peers {
            for lane in &mut peer.lanes {
                if let Some(closed) = lane.closed.take() {
                    let _ = closed.send(false);
                }
            }
        }
    }
}

/// Frame the batch `payload` (`count` messages) onto `lane` (`lane_index` 1: the priority
/// lane), counted in its peer's `stats`.
fn queue_frame(
    lane: &mut Lane,
    lane_index: usize,
    stats: &PeerStats,
    payload: &[u8],
    count: u32,
    queue_bytes_max: usize,
) {
    let frame_kind = if lane_index == 1 { kind::PRIORITY_BATCH } else { kind::BATCH };
    let bytes = payload.len() + codec::FRAME_HEADER_BYTES;
    // A lane whose first link is not up yet keeps what it is given, as the writer tasks'
    // queues do during their first dial, and writes it once the link is up: a node's first
    // messages (raftlog's Hello) are sent before its dialers have connected. The data
    // lane's credits bound it; the priority lane, which has none, is bounded alike while it
    // waits. A lane whose link went down drops its frames until it is up again.
    let lost = lane.stream.is_none() && lane.was_up;
    let bounded = lane_index == 0 || lane.stream.is_none();
    let over_credits = bounded && !lane.pending.is_empty() && lane.pending.len() + bytes > queue_bytes_max;
    if lost || over_credits {
        stats.frames_dropped.fetch_add(1, Relaxed);
        stats.messages_dropped.fetch_add(u64::from(count), Relaxed);
        return;
    }
    if lane.stream.is_none() {
        lane.waiting_since.get_or_insert_with(Instant::now);
    }
    encode_frame(frame_kind, payload, &mut lane.pending);
    lane.pending_frames += 1;
    lane.pending_messages += u64::from(count);
    stats.queued_bytes.fetch_add(bytes as u64, Relaxed);
    stats.queued_frames.fetch_add(1, Relaxed);
    stats.batch_messages.observe(u64::from(count));
}

/// Read into the spare capacity of `buf`.
fn read_into(stream: &mut mio::net::TcpStream, buf: &mut BytesMut) -> io::Result<usize> {
    let spare = buf.spare_capacity_mut();
    // SAFETY: `read` only writes into the slice, and only the bytes it reports are exposed.
    let slice = unsafe { std::slice::from_raw_parts_mut(spare.as_mut_ptr().cast::<u8>(), spare.len()) };
    let n = stream.read(slice)?;
    // SAFETY: the kernel initialised `n` bytes of the spare capacity.
    unsafe { buf.set_len(buf.len() + n) };
    Ok(n)
}

/// Deliver every whole batch frame in `link`'s buffer; an error closes the link.
fn decode_batches<M: WireMessage>(
    link: &mut InLink,
    payload_bytes_max: usize,
    stats: &NetStats,
    pubsub: Option<&crate::pubsub::PubSubPort>,
    deliver: &mut impl FnMut(NodeId, Vec<M>),
) -> Result<(), String> {
    loop {
        let frame = match decode_frame(&mut link.buf, payload_bytes_max) {
            Ok(Some(frame)) => frame,
            Ok(None) => return Ok(()),
            Err(error) => return Err(format!("malformed frame: {error}")),
        };
        match frame.kind {
            kind::BATCH | kind::PRIORITY_BATCH => {}
            kind::KEEPALIVE => continue,
            kind::PUBSUB => {
                if let Some(port) = pubsub {
                    port.deliver(link.node, frame.payload);
                }
                continue;
            }
            other => return Err(format!("unexpected frame kind {other}")),
        }
        let messages =
            decode_batch::<M>(frame.payload).map_err(|error| format!("malformed batch: {error}"))?;
        if let Some(peer) = stats.peers.get(&link.node) {
            peer.frames_received.fetch_add(1, Relaxed);
            peer.messages_received.fetch_add(messages.len() as u64, Relaxed);
        }
        deliver(link.node, messages);
    }
}
