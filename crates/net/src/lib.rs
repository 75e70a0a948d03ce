//! Chorus peer transport: TCP links between replicas.
//!
//! * **Frames** come from [`chorus_core::codec`]: length-prefixed, versioned, CRC-checked.
//! * **Links are one-way.** Every node dials every peer and uses that connection only to send;
//!   it accepts connections from its peers and only reads from them. Two TCP connections per
//!   pair of nodes, no tie-breaking, and a reconnect on either side never races the other.
//! * **Opportunistic batching** (Hermes §4.2, Wings): the event loop hands the transport every
//!   message produced during one turn ([`Transport::send_turn`]). Each message is encoded
//!   once, even a broadcast; the transport then builds one batch frame per destination peer
//!   and queues it. The per-peer writer task coalesces whatever frames are already queued into
//!   one `write` — it never waits to fill a batch.
//! * **Flow control with credits.** Each peer has a budget of queued bytes
//!   ([`NetConfig::peer_queue_bytes_max`]). Queuing a frame takes credits, the writer returns
//!   them once the bytes are in the kernel. When a peer is slow or unreachable its budget runs
//!   out and new frames for it are *dropped and counted* instead of growing memory: Hermes
//!   treats a lost message like any network loss and retransmits after its message-loss
//!   timeout. Receivers apply back-pressure through TCP: a reader stops reading while the
//!   node's bounded inbound queue is full.
//! * **Reconnect with backoff** from [`NetConfig::reconnect_backoff_min`] doubling to
//!   [`NetConfig::reconnect_backoff_max`]. Frames queued while a link is down are dropped
//!   (counted), so a reconnect never floods a peer with stale messages.
//! * **Liveness** ([`NetConfig::link_timeout`]): an idle writer sends keepalive frames, a
//!   reader closes a link that stays silent, and a writer whose bytes go unacknowledged drops
//!   the link (TCP_USER_TIMEOUT) and redials with short connect attempts, so a link cut by a
//!   partition is back within about a second of the network healing.
//! * **Priority lane.** Messages the event loop marks as priority ([`Transport::set_priority`]:
//!   the membership service's heartbeats, acks and Raft) travel on a second connection per
//!   peer with its own writer, never wait for credits, and land in their own inbound queue,
//!   which [`Inbound`] serves first. Under a saturating client load the data queues can hold
//!   a second of work; a heartbeat acknowledgement stuck behind it would let a lease lapse.
//! * **Handshake** ([`handshake`]): mutual challenge-response with HMAC-SHA256 over nonces
//!   from both sides, keyed with the cluster token, which never travels; the cluster id is
//!   covered by the MACs and never sent. Strangers are refused with a clear log line; garbage
//!   closes that connection only.
//! * **Pub/Sub** ([`pubsub`]): published messages travel to every peer as frames of their
//!   own kind on the data connections, handed to the node's Pub/Sub hub on arrival rather
//!   than to the event loop; at most once, in order per sending node.
//! * **TLS** ([`tls`], optional): mutual TLS on every peer connection, the handshake inside it.
//! * **Handed over** ([`start_handover`], [`links`]): the dialers and the acceptor authenticate
//!   plain-TCP links and hand the sockets to an event loop that polls them itself (the server's
//!   reactor); [`links::Links`] then does what the reader and writer tasks do (frames, batches,
//!   credits, keepalives, silence) on that loop's thread, and reports failed links back to
//!   their dialers.

pub mod handshake;
pub mod links;
pub mod pubsub;
pub mod stats;
pub mod stream;
pub mod tls;
pub mod transport;
mod turn;

pub use pubsub::PubSubPort;
pub use stats::{Histogram, NetStats, PeerStats, PeerStatsSnapshot};
pub use stream::Stream;
pub use transport::{
    start, start_handover, Inbound, InboundLink, LinkSink, NetConfig, NetError, OutboundLink, Transport,
};

/// Frame kinds on peer links.
pub mod kind {
    /// Dialer -> acceptor: who I am, and my nonce.
    pub const HELLO: u8 = 1;
    /// Acceptor -> dialer: accepted, with the acceptor's proof.
    pub const WELCOME: u8 = 2;
    /// Acceptor -> dialer: refused, with a UTF-8 reason.
    pub const REFUSE: u8 = 3;
    /// A batch of protocol messages ([`chorus_core::codec::encode_batch`]).
    pub const BATCH: u8 = 4;
    /// A batch of priority messages (membership heartbeats, acks, Raft), on the priority
    /// lane: its own connection, its own inbound queue, read first by the event loop.
    pub const PRIORITY_BATCH: u8 = 5;
    /// Acceptor -> dialer: the acceptor's nonce.
    pub const CHALLENGE: u8 = 6;
    /// Dialer -> acceptor: the dialer's proof and protocol.
    pub const PROOF: u8 = 7;
    /// Nothing: an idle writer's sign of life.
    pub const KEEPALIVE: u8 = 8;
    /// A published Pub/Sub message, on the data connection ([`crate::pubsub`]).
    pub const PUBSUB: u8 = 9;
}
