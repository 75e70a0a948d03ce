//! The transport: one acceptor task, one writer task per peer, and the [`Transport`] handle the
//! event loop uses to send what one turn produced.

use std::collections::BTreeMap;
use std::io;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use chorus_core::codec::{self, decode_batch, decode_frame, encode_frame, Frame, WireMessage};
use chorus_core::{Destination, NodeId};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tracing::{debug, error, info, warn};

use crate::handshake::{
    self, Challenge, Expectations, Hello, Proof, Role, Transcript, Welcome, HELLO_BYTES_MAX,
};
use crate::kind;
use crate::pubsub::PubSubPort;
use crate::stats::{NetStats, PeerStats};
use crate::stream::Stream;
use crate::tls::PeerTls;
use crate::turn::TurnEncoder;

/// Transport settings. [`NetConfig::new`] fills in the defaults.
#[derive(Clone, Debug)]
pub struct NetConfig {
    pub me: NodeId,
    pub cluster_id: String,
    pub cluster_token: String,
    /// The replication protocol's name; peers running another protocol are refused.
    pub protocol: String,
    pub listen_addr: SocketAddr,
    /// Every other replica and the address it accepts peer connections on.
    pub peers: BTreeMap<NodeId, SocketAddr>,
    /// Credits per peer: bytes that may wait in the peer's send queue. Frames beyond it are
    /// dropped and counted (Hermes retransmits). One frame is always admitted into an empty
    /// queue, so the bound is this plus one frame.
    pub peer_queue_bytes_max: usize,
    /// Largest frame payload sent or accepted. Must cover one message with the largest key
    /// and value the server admits.
    pub frame_payload_bytes_max: usize,
    /// Received batches waiting for the event loop; when full, readers stop reading and TCP
    /// pushes back on the senders.
    pub inbound_batches_max: usize,
    pub reconnect_backoff_min: Duration,
    /// Also the longest a healed network waits for the next dial attempt.
    pub reconnect_backoff_max: Duration,
    /// One TCP connect attempt. A partition drops SYNs silently; short attempts mean the
    /// next one goes out soon after the network heals, instead of waiting for TCP's SYN
    /// retransmission backoff.
    pub connect_timeout: Duration,
    /// TLS + challenge-response deadline, both directions.
    pub handshake_timeout: Duration,
    /// Liveness of a link: a writer with nothing to send sends a keepalive frame every
    /// quarter of this; a reader that hears nothing for this long closes the link; a
    /// writer whose bytes stay unacknowledged this long (TCP_USER_TIMEOUT, Linux) drops it
    /// and redials. Without it a link cut by a partition sits in TCP's retransmission
    /// backoff and can stay dead for many seconds after the network heals.
    pub link_timeout: Duration,
    /// Mutual TLS on peer links (`tls_cluster`); `None`: plain TCP.
    pub tls: Option<PeerTls>,
    /// Open the priority lane (a second connection per peer) for messages marked by
    /// [`Transport::set_priority`]. Off, they share the data connection and its queues.
    pub priority_lane: bool,
    /// Received priority batches waiting for the event loop.
    pub inbound_priority_batches_max: usize,
    /// Where Pub/Sub frames come in and go out ([`crate::pubsub`]); `None`: a received one
    /// is ignored.
    pub pubsub: Option<Arc<PubSubPort>>,
}

impl NetConfig {
    pub fn new(
        me: NodeId,
        cluster_id: impl Into<String>,
        cluster_token: impl Into<String>,
        protocol: impl Into<String>,
        listen_addr: SocketAddr,
        peers: BTreeMap<NodeId, SocketAddr>,
    ) -> NetConfig {
        NetConfig {
            me,
            cluster_id: cluster_id.into(),
            cluster_token: cluster_token.into(),
            protocol: protocol.into(),
            listen_addr,
            peers,
            peer_queue_bytes_max: 64 * 1024 * 1024,
            frame_payload_bytes_max: codec::FRAME_PAYLOAD_BYTES_MAX,
            inbound_batches_max: 4096,
            reconnect_backoff_min: Duration::from_millis(20),
            reconnect_backoff_max: Duration::from_millis(250),
            connect_timeout: Duration::from_millis(500),
            handshake_timeout: Duration::from_secs(2),
            link_timeout: Duration::from_secs(1),
            tls: None,
            priority_lane: true,
            inbound_priority_batches_max: 1024,
            pubsub: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("cannot listen for peers on {addr}: {source}")]
    Bind { addr: SocketAddr, source: io::Error },
    #[error("the peer list contains this node ({0}); pass only the other replicas")]
    PeerIsSelf(NodeId),
    #[error("the cluster token is {0} bytes; at least {min} are needed (e.g. 32 hex digits from `openssl rand -hex 16`)", min = handshake::TOKEN_BYTES_MIN)]
    TokenTooShort(usize),
}

/// Frames for one peer: the frame and how many messages it carries.
type QueuedFrame = (Bytes, u32);

#[derive(Clone)]
pub(crate) struct Link {
    node: NodeId,
    pub(crate) tx: mpsc::UnboundedSender<QueuedFrame>,
    /// The priority lane's writer, when the lane is open.
    priority_tx: Option<mpsc::UnboundedSender<QueuedFrame>>,
    pub(crate) stats: Arc<PeerStats>,
}

/// What peers sent, as the event loop receives it: priority batches first.
pub struct Inbound<M> {
    priority: mpsc::Receiver<(NodeId, Vec<M>)>,
    data: mpsc::Receiver<(NodeId, Vec<M>)>,
}

impl<M> Inbound<M> {
    /// An inbound stream fed by someone else: a runtime that splits one transport's batches
    /// between several event loops (raftlog's shards) gives each its own.
    pub fn from_channels(
        priority: mpsc::Receiver<(NodeId, Vec<M>)>,
        data: mpsc::Receiver<(NodeId, Vec<M>)>,
    ) -> Inbound<M> {
        Inbound { priority, data }
    }

    /// The next batch, a priority one if any is waiting. `None` once every reader is gone.
    pub async fn recv(&mut self) -> Option<(NodeId, Vec<M>)> {
        tokio::select! {
            biased;
            Some(batch) = self.priority.recv() => Some(batch),
            batch = self.data.recv() => batch,
        }
    }

    pub fn try_recv(&mut self) -> Result<(NodeId, Vec<M>), mpsc::error::TryRecvError> {
        self.priority.try_recv().or_else(|_| self.data.try_recv())
    }
}

/// The event loop's sending side. Not `Clone`: one event loop owns it.
pub struct Transport<M> {
    links: Vec<Link>,
    stats: Arc<NetStats>,
    frame_payload_bytes_max: usize,
    peer_queue_bytes_max: u64,
    /// This turn's messages, each encoded once.
    turn: TurnEncoder,
    priority: fn(&M) -> bool,
    _message: PhantomData<fn(M)>,
}

/// Start listening and dialing. Returns the sending handle, the stream of received batches
/// (sender, messages) and the shared counters.
pub async fn start<M>(config: NetConfig) -> Result<(Transport<M>, Inbound<M>, Arc<NetStats>), NetError>
where
    M: WireMessage + Send + 'static,
{
    if config.peers.contains_key(&config.me) {
        return Err(NetError::PeerIsSelf(config.me));
    }
    if config.cluster_token.len() < handshake::TOKEN_BYTES_MIN {
        return Err(NetError::TokenTooShort(config.cluster_token.len()));
    }
    let listener = TcpListener::bind(config.listen_addr)
        .await
        .map_err(|source| NetError::Bind { addr: config.listen_addr, source })?;
    let peers: BTreeMap<NodeId, Arc<PeerStats>> = config
        .peers
        .iter()
        .map(|(node, addr)| (*node, Arc::new(PeerStats::new(*node, addr.to_string()))))
        .collect();
    let stats = Arc::new(NetStats {
        peers,
        connections_refused: AtomicU64::new(0),
        inbound_connections: AtomicU64::new(0),
        links_timed_out: AtomicU64::new(0),
    });
    let config = Arc::new(config);
    let (inbound_tx, inbound_rx) = mpsc::channel(config.inbound_batches_max.max(1));
    let (priority_tx, priority_rx) = mpsc::channel(config.inbound_priority_batches_max.max(1));
    let queues = Delivery::Queues(InboundQueues { data: inbound_tx, priority: priority_tx });
    tokio::spawn(run_acceptor::<M>(listener, config.clone(), queues, stats.clone()));

    let mut links = Vec::new();
    for (node, addr) in &config.peers {
        let (tx, rx) = mpsc::unbounded_channel();
        let peer_stats = stats.peers[node].clone();
        tokio::spawn(run_writer(config.clone(), *node, *addr, rx, peer_stats.clone(), "data"));
        let priority_tx = config.priority_lane.then(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(run_writer(config.clone(), *node, *addr, rx, peer_stats.clone(), "priority"));
            tx
        });
        links.push(Link { node: *node, tx, priority_tx, stats: peer_stats });
    }
    if let Some(port) = &config.pubsub {
        port.attach(links.clone(), config.frame_payload_bytes_max, config.peer_queue_bytes_max as u64);
    }
    let transport = Transport {
        links,
        stats: stats.clone(),
        frame_payload_bytes_max: config.frame_payload_bytes_max,
        peer_queue_bytes_max: config.peer_queue_bytes_max as u64,
        turn: TurnEncoder::default(),
        priority: |_| false,
        _message: PhantomData,
    };
    Ok((transport, Inbound { priority: priority_rx, data: inbound_rx }, stats))
}

/// Where [`start_handover`] delivers links once they are authenticated: to an event loop
/// that owns its sockets itself (the server's reactor), instead of to reader and writer tasks.
pub trait LinkSink: Send + Sync + 'static {
    /// A send-only link to a peer is up. The sink completes (or drops) `closed` when the link
    /// fails or is closed; the dialer then redials.
    fn outbound(&self, link: OutboundLink);
    /// An accepted link from a peer is authenticated; the sink reads it from here on.
    fn inbound(&self, link: InboundLink);
}

/// A send-only link this node dialled, authenticated.
pub struct OutboundLink {
    pub node: NodeId,
    /// The priority lane's connection (membership messages), not the data lane's.
    pub priority: bool,
    /// Non-blocking.
    pub stream: std::net::TcpStream,
    /// Completed with `true` when the link failed (the dialer redials after its backoff);
    /// dropped or `false` when the link's owner is gone (the dialer stops).
    pub closed: tokio::sync::oneshot::Sender<bool>,
}

/// A link a peer dialled, authenticated: the receiving end.
pub struct InboundLink {
    pub node: NodeId,
    /// Non-blocking.
    pub stream: std::net::TcpStream,
    /// Bytes read during the handshake past its last frame (the start of the first batch).
    pub buffered: BytesMut,
}

/// Start listening and dialing like [`start`], but hand every authenticated link to `sink`
/// instead of serving it with tasks: the dialers and the acceptor stay here (connect,
/// handshake, backoff, redial), the sockets' traffic is the sink's. Plain TCP only: a TLS
/// stream cannot leave its task.
pub async fn start_handover<M>(config: NetConfig, sink: Arc<dyn LinkSink>) -> Result<Arc<NetStats>, NetError>
where
    M: WireMessage + Send + 'static,
{
    if config.peers.contains_key(&config.me) {
        return Err(NetError::PeerIsSelf(config.me));
    }
    if config.cluster_token.len() < handshake::TOKEN_BYTES_MIN {
        return Err(NetError::TokenTooShort(config.cluster_token.len()));
    }
    assert!(config.tls.is_none(), "handed-over links are plain TCP");
    let listener = TcpListener::bind(config.listen_addr)
        .await
        .map_err(|source| NetError::Bind { addr: config.listen_addr, source })?;
    let stats = Arc::new(NetStats {
        peers: config
            .peers
            .iter()
            .map(|(node, addr)| (*node, Arc::new(PeerStats::new(*node, addr.to_string()))))
            .collect(),
        connections_refused: AtomicU64::new(0),
        inbound_connections: AtomicU64::new(0),
        links_timed_out: AtomicU64::new(0),
    });
    let config = Arc::new(config);
    let delivery = Delivery::<M>::Handover(sink.clone());
    tokio::spawn(run_acceptor::<M>(listener, config.clone(), delivery, stats.clone()));
    for (node, addr) in &config.peers {
        let lanes: &[bool] = if config.priority_lane { &[false, true] } else { &[false] };
        for &priority in lanes {
            let peer_stats = stats.peers[node].clone();
            let dialer = run_dialer(config.clone(), *node, *addr, priority, peer_stats, sink.clone());
            tokio::spawn(dialer);
        }
    }
    Ok(stats)
}

/// One lane's dialer for [`start_handover`]: dial and authenticate, hand the link over, wait
/// until its owner says it failed, back off, redial. Stops when the owner is gone.
async fn run_dialer(
    config: Arc<NetConfig>,
    node: NodeId,
    addr: SocketAddr,
    priority: bool,
    stats: Arc<PeerStats>,
    sink: Arc<dyn LinkSink>,
) {
    let lane = if priority { "priority" } else { "data" };
    let mut backoff = config.reconnect_backoff_min;
    let mut failures = 0u64;
    loop {
        match dial(&config, node, addr).await {
            Ok(Stream::Plain(tcp)) => {
                let stream = match tcp.into_std() {
                    Ok(stream) => stream,
                    Err(error) => {
                        warn!(peer = %node, "cannot take the peer link's socket: {error}");
                        continue;
                    }
                };
                info!(peer = %node, %addr, lane, "peer link up");
                if !priority {
                    stats.connected.store(true, Relaxed);
                    stats.connects.fetch_add(1, Relaxed);
                }
                backoff = config.reconnect_backoff_min;
                failures = 0;
                let (closed, failed) = tokio::sync::oneshot::channel();
                sink.outbound(OutboundLink { node, priority, stream, closed });
                let failed = failed.await.unwrap_or(false);
                if !priority {
                    stats.connected.store(false, Relaxed);
                }
                if !failed {
                    return; // the owner of the links is gone: the node is stopping
                }
                info!(peer = %node, %addr, lane, "peer link down; redialling");
            }
            Ok(Stream::Tls(_)) => unreachable!("handed-over links are plain TCP"),
            Err(DialError::Refused(reason)) => {
                error!(peer = %node, %addr, lane, "peer link refused: {reason}");
                backoff = config.reconnect_backoff_max;
            }
            Err(DialError::Io(error)) => {
                if failures == 0 {
                    info!(peer = %node, %addr, lane, "cannot reach peer ({error}); retrying with backoff");
                } else {
                    debug!(peer = %node, %addr, failures, "cannot reach peer: {error}");
                }
            }
        }
        failures += 1;
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(config.reconnect_backoff_max);
    }
}

impl<M: WireMessage> Transport<M> {
    pub fn stats(&self) -> &Arc<NetStats> {
        &self.stats
    }

    /// Another sending handle on the same peer links, for another event loop of this node
    /// (raftlog's shards): each batches its own turn's messages into its own frames, and the
    /// frames of all of them share each peer's connection and credits.
    pub fn sibling(&self) -> Transport<M> {
        Transport {
            links: self.links.clone(),
            stats: self.stats.clone(),
            frame_payload_bytes_max: self.frame_payload_bytes_max,
            peer_queue_bytes_max: self.peer_queue_bytes_max,
            turn: TurnEncoder::default(),
            priority: self.priority,
            _message: PhantomData,
        }
    }

    /// Which messages take the priority lane (when [`NetConfig::priority_lane`] is on).
    pub fn set_priority(&mut self, classify: fn(&M) -> bool) {
        self.priority = classify;
    }

    /// Send every message one event-loop turn produced, draining `messages`. Each message is
    /// encoded once; each peer gets one batch frame holding all of its messages (split only
    /// if it would exceed the frame limit). Never blocks: a peer out of credits loses the
    /// frame, which is counted.
    pub fn send_turn(&mut self, messages: &mut Vec<(Destination, M)>) {
        if messages.is_empty() {
            return;
        }
        self.turn.encode(messages, self.priority);
        let limits = (self.frame_payload_bytes_max, self.peer_queue_bytes_max);
        for link in &self.links {
            // Priority messages first, on their own lane when it is open.
            if let Some(tx) = &link.priority_tx {
                let lane = Lane { tx, kind: kind::PRIORITY_BATCH, credits: false };
                fill_lane(&mut self.turn, link, &lane, limits, |priority| priority);
            }
            let shared = link.priority_tx.is_none();
            let lane = Lane { tx: &link.tx, kind: kind::BATCH, credits: true };
            fill_lane(&mut self.turn, link, &lane, limits, |priority| !priority || shared);
        }
    }
}

/// Queue for `link` every message of this turn that `takes` accepts, in batch frames;
/// `limits` are the frame payload and the peer queue bounds in bytes.
fn fill_lane(
    turn: &mut TurnEncoder,
    link: &Link,
    lane: &Lane,
    (payload_bytes_max, queue_bytes_max): (usize, u64),
    takes: impl Fn(bool) -> bool,
) {
    turn.batches(
        link.node,
        takes,
        payload_bytes_max,
        |payload, count| enqueue(link, lane, payload, count, queue_bytes_max),
        |size| {
            // Cannot happen when the server's value limit fits the frame limit.
            warn!(peer = %link.node, size, "message larger than the frame limit dropped");
            link.stats.messages_dropped.fetch_add(1, Relaxed);
        },
    );
}

/// Where a batch frame goes: the data connection (credits apply) or the priority lane
/// (small, rare messages that must not be dropped or delayed for credits).
struct Lane<'a> {
    tx: &'a mpsc::UnboundedSender<QueuedFrame>,
    kind: u8,
    credits: bool,
}

/// Frame `payload` (a batch of `count` messages) and queue it on `lane` if it has credits.
fn enqueue(link: &Link, lane: &Lane, payload: &[u8], count: u32, queue_bytes_max: u64) {
    let mut frame = BytesMut::with_capacity(payload.len() + codec::FRAME_HEADER_BYTES);
    encode_frame(lane.kind, payload, &mut frame);
    let bytes = frame.len() as u64;
    let queued = link.stats.queued_bytes.load(Relaxed);
    if lane.credits && queued > 0 && queued + bytes > queue_bytes_max {
        link.stats.frames_dropped.fetch_add(1, Relaxed);
        link.stats.messages_dropped.fetch_add(count as u64, Relaxed);
        return;
    }
    link.stats.queued_bytes.fetch_add(bytes, Relaxed);
    link.stats.queued_frames.fetch_add(1, Relaxed);
    link.stats.batch_messages.observe(count as u64);
    if lane.tx.send((frame.freeze(), count)).is_err() {
        // The writer task is gone (runtime shutting down); give the credits back.
        link.stats.queued_bytes.fetch_sub(bytes, Relaxed);
        link.stats.queued_frames.fetch_sub(1, Relaxed);
    }
}

// ------------------------------------------------------------------------------ sending side

/// Coalesce queued frames into one write up to this many bytes.
const COALESCE_BYTES_MAX: usize = 1024 * 1024;

enum DialError {
    Refused(String),
    Io(io::Error),
}

impl From<io::Error> for DialError {
    fn from(error: io::Error) -> Self {
        DialError::Io(error)
    }
}

async fn run_writer(
    config: Arc<NetConfig>,
    node: NodeId,
    addr: SocketAddr,
    mut rx: mpsc::UnboundedReceiver<QueuedFrame>,
    stats: Arc<PeerStats>,
    lane: &'static str,
) {
    let mut backoff = config.reconnect_backoff_min;
    let mut failures = 0u64;
    loop {
        match dial(&config, node, addr).await {
            Ok(stream) => {
                info!(peer = %node, %addr, lane, tls = config.tls.is_some(), "peer link up");
                // The data lane's state is the link's state in INFO and metrics.
                let data_lane = lane == "data";
                if data_lane {
                    stats.connected.store(true, Relaxed);
                    stats.connects.fetch_add(1, Relaxed);
                }
                backoff = config.reconnect_backoff_min;
                failures = 0;
                let result = write_loop(stream, &mut rx, &stats, config.link_timeout / 4).await;
                if data_lane {
                    stats.connected.store(false, Relaxed);
                }
                match result {
                    Ok(()) => return, // the event loop dropped the transport
                    Err(error) => info!(peer = %node, %addr, lane, "peer link down: {error}; redialling"),
                }
            }
            Err(DialError::Refused(reason)) => {
                error!(peer = %node, %addr, lane, "peer link refused: {reason}");
                backoff = config.reconnect_backoff_max;
            }
            Err(DialError::Io(error)) => {
                if failures == 0 {
                    info!(peer = %node, %addr, lane, "cannot reach peer ({error}); retrying with backoff");
                } else {
                    debug!(peer = %node, %addr, failures, "cannot reach peer: {error}");
                }
            }
        }
        failures += 1;
        if !drop_queued(&mut rx, &stats) {
            return;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(config.reconnect_backoff_max);
    }
}

/// Drop (and count) what was queued for a link that is down. `false`: the transport is gone.
fn drop_queued(rx: &mut mpsc::UnboundedReceiver<QueuedFrame>, stats: &PeerStats) -> bool {
    loop {
        match rx.try_recv() {
            Ok((frame, count)) => {
                stats.queued_bytes.fetch_sub(frame.len() as u64, Relaxed);
                stats.queued_frames.fetch_sub(1, Relaxed);
                stats.frames_dropped.fetch_add(1, Relaxed);
                stats.messages_dropped.fetch_add(count as u64, Relaxed);
            }
            Err(mpsc::error::TryRecvError::Empty) => return true,
            Err(mpsc::error::TryRecvError::Disconnected) => return false,
        }
    }
}

fn timed_out(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, what.to_string())
}

/// Connect to `node` at `addr`, start TLS if configured, and authenticate both ways.
async fn dial(config: &NetConfig, node: NodeId, addr: SocketAddr) -> Result<Stream, DialError> {
    let tcp = tokio::time::timeout(config.connect_timeout, TcpStream::connect(addr))
        .await
        .map_err(|_| timed_out("connect timed out"))??;
    tcp.set_nodelay(true)?;
    set_user_timeout(&tcp, config.link_timeout);
    let handshake = async {
        let mut stream = match &config.tls {
            None => Stream::Plain(tcp),
            Some(tls) => {
                let tls_stream = tls
                    .connector
                    .connect(PeerTls::server_name(addr.ip()), tcp)
                    .await
                    .map_err(|error| DialError::Refused(format!("TLS handshake failed: {error}")))?;
                Stream::Tls(Box::new(tls_stream.into()))
            }
        };
        authenticate_to(&mut stream, config, node).await?;
        Ok(stream)
    };
    tokio::time::timeout(config.handshake_timeout, handshake)
        .await
        .map_err(|_| timed_out("no handshake answer in time"))?
}

/// The dialer's half of the challenge-response (crate::handshake).
async fn authenticate_to(stream: &mut Stream, config: &NetConfig, peer: NodeId) -> Result<(), DialError> {
    let hello = Hello { node: config.me, nonce: handshake::nonce()? };
    send_message(stream, kind::HELLO, &hello).await?;
    let mut buf = BytesMut::new();
    let challenge: Challenge = expect_answer(stream, &mut buf, kind::CHALLENGE).await?;
    let transcript = Transcript {
        cluster_id: config.cluster_id.as_bytes(),
        dialer: config.me,
        acceptor: peer,
        dialer_nonce: &hello.nonce,
        acceptor_nonce: &challenge.nonce,
        protocol: config.protocol.as_bytes(),
    };
    let token = config.cluster_token.as_bytes();
    let proof = Proof {
        mac: handshake::mac(token, Role::Dialer, &transcript),
        protocol: Bytes::copy_from_slice(config.protocol.as_bytes()),
    };
    send_message(stream, kind::PROOF, &proof).await?;
    let welcome: Welcome = expect_answer(stream, &mut buf, kind::WELCOME).await?;
    if !handshake::verify(token, Role::Acceptor, &transcript, &welcome.mac) {
        return Err(DialError::Refused(
            "the peer did not prove it holds the cluster token (different cluster token or cluster id)"
                .into(),
        ));
    }
    Ok(())
}

async fn send_message<M: WireMessage>(stream: &mut Stream, kind: u8, message: &M) -> io::Result<()> {
    let mut payload = BytesMut::new();
    message.encode(&mut payload);
    let mut out = BytesMut::new();
    encode_frame(kind, &payload, &mut out);
    stream.write_all(&out).await?;
    stream.flush().await
}

/// The next handshake frame: a message of kind `wanted`, or the acceptor's refusal.
async fn expect_answer<M: WireMessage>(
    stream: &mut Stream,
    buf: &mut BytesMut,
    wanted: u8,
) -> Result<M, DialError> {
    let frame = read_frame(stream, buf, HELLO_BYTES_MAX).await?;
    match frame.kind {
        kind::REFUSE => Err(DialError::Refused(String::from_utf8_lossy(&frame.payload).into_owned())),
        kind if kind == wanted => M::decode_exact(frame.payload)
            .map_err(|error| DialError::Io(io::Error::new(io::ErrorKind::InvalidData, error.to_string()))),
        other => Err(DialError::Io(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unexpected frame kind {other} in the handshake"),
        ))),
    }
}

/// Unacknowledged bytes older than `timeout` make the kernel drop the connection
/// (TCP_USER_TIMEOUT): a writer into a partition learns within `timeout` instead of after
/// TCP's retransmissions give up (~15 minutes). Linux only; elsewhere the reader's silence
/// timeout on the other side is the only bound.
fn set_user_timeout(tcp: &TcpStream, timeout: Duration) {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    if let Err(error) = socket2::SockRef::from(tcp).set_tcp_user_timeout(Some(timeout)) {
        warn!("cannot set TCP_USER_TIMEOUT on a peer link: {error}");
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    let _ = (tcp, timeout);
}

/// Write queued frames until the transport is dropped (`Ok`) or the link fails (`Err`).
/// With nothing to send for `keepalive`, send a keepalive frame: the reader on the other
/// side counts silence as a dead link, and the kernel needs bytes in flight to notice one.
async fn write_loop(
    mut stream: Stream,
    rx: &mut mpsc::UnboundedReceiver<QueuedFrame>,
    stats: &PeerStats,
    keepalive: Duration,
) -> io::Result<()> {
    let mut keepalive_frame = BytesMut::new();
    encode_frame(kind::KEEPALIVE, &[], &mut keepalive_frame);
    let mut coalesced = BytesMut::new();
    let mut probe = [0u8; 64];
    // One timer for the link's life, moved only when it fires: a timer armed and cancelled
    // per frame cost two timer-wheel updates per peer message batch (issue 23's profile).
    let mut last_sent = tokio::time::Instant::now();
    let idle = tokio::time::sleep(keepalive);
    tokio::pin!(idle);
    loop {
        // The link is send-only: reading only notices the peer closing it.
        let next = tokio::select! {
            item = rx.recv() => match item {
                Some(item) => Some(item),
                None => return Ok(()),
            },
            read = stream.read(&mut probe) => {
                return Err(match read {
                    Ok(0) => io::Error::new(io::ErrorKind::UnexpectedEof, "peer closed the connection"),
                    Ok(_) => io::Error::new(io::ErrorKind::InvalidData, "peer sent data on a send-only link"),
                    Err(error) => error,
                });
            }
            () = &mut idle => None,
        };
        let Some((first, first_count)) = next else {
            // Due only if nothing went out for a whole period since the timer was set.
            if last_sent.elapsed() >= keepalive {
                stream.write_all(&keepalive_frame).await?;
                stream.flush().await?;
                last_sent = tokio::time::Instant::now();
            }
            idle.as_mut().reset(last_sent + keepalive);
            continue;
        };
        let mut frames = 1u64;
        let mut messages = first_count as u64;
        let mut bytes = first.len();
        let result = match rx.try_recv() {
            Err(_) => stream.write_all(&first).await,
            Ok((second, count)) => {
                coalesced.clear();
                coalesced.extend_from_slice(&first);
                coalesced.extend_from_slice(&second);
                frames += 1;
                messages += count as u64;
                bytes += second.len();
                while coalesced.len() < COALESCE_BYTES_MAX {
                    let Ok((frame, count)) = rx.try_recv() else { break };
                    coalesced.extend_from_slice(&frame);
                    frames += 1;
                    messages += count as u64;
                    bytes += frame.len();
                }
                stream.write_all(&coalesced).await
            }
        };
        let result = match result {
            Ok(()) => stream.flush().await,
            Err(error) => Err(error),
        };
        stats.queued_bytes.fetch_sub(bytes as u64, Relaxed);
        stats.queued_frames.fetch_sub(frames, Relaxed);
        if let Err(error) = result {
            stats.frames_dropped.fetch_add(frames, Relaxed);
            stats.messages_dropped.fetch_add(messages, Relaxed);
            return Err(error);
        }
        stats.frames_sent.fetch_add(frames, Relaxed);
        stats.messages_sent.fetch_add(messages, Relaxed);
        last_sent = tokio::time::Instant::now();
        stats.bytes_sent.fetch_add(bytes as u64, Relaxed);
        stats.writes.fetch_add(1, Relaxed);
    }
}

/// Read one whole frame, keeping any following bytes in `buf`.
async fn read_frame(stream: &mut Stream, buf: &mut BytesMut, payload_bytes_max: usize) -> io::Result<Frame> {
    loop {
        match decode_frame(buf, payload_bytes_max) {
            Ok(Some(frame)) => return Ok(frame),
            Ok(None) => {}
            Err(error) => return Err(io::Error::new(io::ErrorKind::InvalidData, error.to_string())),
        }
        if stream.read_buf(buf).await? == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed"));
        }
    }
}

// ---------------------------------------------------------------------------- receiving side

/// Where readers hand received batches: data and priority queues.
struct InboundQueues<M> {
    data: mpsc::Sender<(NodeId, Vec<M>)>,
    priority: mpsc::Sender<(NodeId, Vec<M>)>,
}

impl<M> Clone for InboundQueues<M> {
    fn clone(&self) -> Self {
        InboundQueues { data: self.data.clone(), priority: self.priority.clone() }
    }
}

/// What an accepted and authenticated link is for: read here into the event loop's queues,
/// or handed to a reactor that reads it itself ([`start_handover`]).
enum Delivery<M> {
    Queues(InboundQueues<M>),
    Handover(Arc<dyn LinkSink>),
}

impl<M> Clone for Delivery<M> {
    fn clone(&self) -> Self {
        match self {
            Delivery::Queues(queues) => Delivery::Queues(queues.clone()),
            Delivery::Handover(sink) => Delivery::Handover(sink.clone()),
        }
    }
}

async fn run_acceptor<M>(listener: TcpListener, config: Arc<NetConfig>, tx: Delivery<M>, stats: Arc<NetStats>)
where
    M: WireMessage + Send + 'static,
{
    loop {
        match listener.accept().await {
            Ok((stream, remote)) => {
                stats.inbound_connections.fetch_add(1, Relaxed);
                let (config, tx, stats) = (config.clone(), tx.clone(), stats.clone());
                tokio::spawn(async move {
                    match serve_inbound::<M>(stream, &config, &tx, &stats).await {
                        Ok(node) => debug!(peer = %node, %remote, "inbound peer link closed"),
                        Err(InboundError::Refused(reason)) => {
                            stats.connections_refused.fetch_add(1, Relaxed);
                            warn!(%remote, "refused peer connection: {reason}");
                        }
                        Err(InboundError::Failed(node, error)) => {
                            warn!(peer = %node, %remote, "closing inbound peer link: {error}");
                        }
                    }
                });
            }
            Err(error) => {
                // Typically out of file descriptors: back off instead of spinning.
                warn!("accepting peer connections failed: {error}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

enum InboundError {
    /// The handshake failed: a stranger, a misconfigured node or garbage.
    Refused(String),
    /// An accepted peer's link failed or carried a malformed frame.
    Failed(NodeId, String),
}

async fn serve_inbound<M>(
    tcp: TcpStream,
    config: &NetConfig,
    delivery: &Delivery<M>,
    stats: &NetStats,
) -> Result<NodeId, InboundError>
where
    M: WireMessage + Send,
{
    let _ = tcp.set_nodelay(true);
    let mut buf = BytesMut::with_capacity(16 * 1024);
    let handshake = async {
        let mut stream = match &config.tls {
            None => Stream::Plain(tcp),
            Some(tls) => {
                let tls_stream = tls
                    .acceptor
                    .accept(tcp)
                    .await
                    .map_err(|error| InboundError::Refused(format!("TLS handshake failed: {error}")))?;
                Stream::Tls(Box::new(tls_stream.into()))
            }
        };
        let node = authenticate_from(&mut stream, &mut buf, config).await?;
        Ok::<_, InboundError>((stream, node))
    };
    let (mut stream, node) = tokio::time::timeout(config.handshake_timeout, handshake)
        .await
        .map_err(|_| InboundError::Refused("no handshake in time".into()))??;
    let failed = |error: String| InboundError::Failed(node, error);
    info!(peer = %node, tls = config.tls.is_some(), "accepted inbound peer link");
    let tx = match delivery {
        Delivery::Queues(queues) => queues,
        Delivery::Handover(sink) => {
            let Stream::Plain(tcp) = stream else {
                return Err(failed("a TLS link cannot be handed to the reactor".into()));
            };
            let stream = tcp.into_std().map_err(|error| failed(error.to_string()))?;
            sink.inbound(InboundLink { node, stream, buffered: buf });
            return Ok(node);
        }
    };
    let peer_stats = stats.peers.get(&node).cloned();
    // One timer for the link's life (see write_loop): moved only when it fires early.
    let mut last_heard = tokio::time::Instant::now();
    let silence = tokio::time::sleep(config.link_timeout);
    tokio::pin!(silence);
    loop {
        let mut delivered = false;
        loop {
            let frame = match decode_frame(&mut buf, config.frame_payload_bytes_max) {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(error) => return Err(failed(format!("malformed frame: {error}"))),
            };
            let queue = match frame.kind {
                kind::BATCH => &tx.data,
                kind::PRIORITY_BATCH => &tx.priority,
                kind::KEEPALIVE => continue,
                kind::PUBSUB => {
                    if let Some(port) = &config.pubsub {
                        port.deliver(node, frame.payload);
                    }
                    continue;
                }
                other => return Err(failed(format!("unexpected frame kind {other}"))),
            };
            let messages = decode_batch::<M>(frame.payload)
                .map_err(|error| failed(format!("malformed batch: {error}")))?;
            if let Some(peer) = &peer_stats {
                peer.frames_received.fetch_add(1, Relaxed);
                peer.messages_received.fetch_add(messages.len() as u64, Relaxed);
            }
            if queue.send((node, messages)).await.is_err() {
                return Ok(node); // the event loop is gone: shutting down
            }
            delivered = true;
        }
        // Only time spent waiting for bytes counts as silence, not time spent waiting for
        // room in the event loop's queue.
        if delivered {
            last_heard = tokio::time::Instant::now();
        }
        let read = tokio::select! {
            read = stream.read_buf(&mut buf) => read,
            () = &mut silence => {
                if last_heard.elapsed() < config.link_timeout {
                    silence.as_mut().reset(last_heard + config.link_timeout);
                    continue;
                }
                stats.links_timed_out.fetch_add(1, Relaxed);
                return Err(failed(format!(
                    "silent for {} ms although keepalives are due; closing it",
                    config.link_timeout.as_millis()
                )));
            }
        };
        match read {
            Ok(0) => return Ok(node),
            Ok(_) => last_heard = tokio::time::Instant::now(),
            Err(error) => return Err(failed(error.to_string())),
        }
    }
}

/// The acceptor's half of the challenge-response: the dialer proves itself first, and only
/// then does this node prove itself (crate::handshake). Returns the authenticated peer.
async fn authenticate_from(
    stream: &mut Stream,
    buf: &mut BytesMut,
    config: &NetConfig,
) -> Result<NodeId, InboundError> {
    let not_a_peer = |error: String| InboundError::Refused(format!("not a chorus peer ({error})"));
    let frame =
        read_frame(stream, buf, HELLO_BYTES_MAX).await.map_err(|error| not_a_peer(error.to_string()))?;
    if frame.kind != kind::HELLO {
        return Err(not_a_peer(format!("first frame has kind {}", frame.kind)));
    }
    let hello = Hello::decode_exact(frame.payload).map_err(|error| not_a_peer(error.to_string()))?;
    let challenge = Challenge { nonce: handshake::nonce().map_err(|error| not_a_peer(error.to_string()))? };
    let claimed = hello.node;
    let io_failed =
        |error: io::Error| InboundError::Refused(format!("handshake with {claimed} failed: {error}"));
    send_message(stream, kind::CHALLENGE, &challenge).await.map_err(io_failed)?;
    let frame = read_frame(stream, buf, HELLO_BYTES_MAX).await.map_err(io_failed)?;
    if frame.kind != kind::PROOF {
        return Err(not_a_peer(format!("expected a proof, got frame kind {}", frame.kind)));
    }
    let proof = Proof::decode_exact(frame.payload).map_err(|error| not_a_peer(error.to_string()))?;
    let is_peer = |node: NodeId| config.peers.contains_key(&node);
    let expect = Expectations {
        me: config.me,
        cluster_id: config.cluster_id.as_bytes(),
        protocol: config.protocol.as_bytes(),
        token: config.cluster_token.as_bytes(),
        is_peer: &is_peer,
    };
    match handshake::check(&hello, &challenge.nonce, &proof, &expect) {
        Ok(welcome) => {
            send_message(stream, kind::WELCOME, &welcome).await.map_err(io_failed)?;
            Ok(hello.node)
        }
        Err(reason) => {
            let mut answer = BytesMut::new();
            encode_frame(kind::REFUSE, reason.as_bytes(), &mut answer);
            let _ = stream.write_all(&answer).await;
            let _ = stream.flush().await;
            Err(InboundError::Refused(format!("{reason} (claims to be {claimed})")))
        }
    }
}
