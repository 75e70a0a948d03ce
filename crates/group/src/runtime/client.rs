//! The tenant's client library: `Initialize` a group on a chain of hosts, then submit gWRITE,
//! gCAS, gMEMCPY and gFLUSH with many operations in flight, read one member's region, and run
//! the transaction API of §5 over it ([`BlockingGroupClient`] implements
//! [`crate::txn::GroupExecutor`]).
//!
//! The client opens one caller connection per member (authenticated with the tenant's token):
//! control requests go to every member, operations to the head, and acknowledgements come back
//! from the tail (refusals from any member). A [`GroupCaller`] core, driven by one task,
//! numbers, pipelines and retransmits; the operations submitted during one turn leave in one
//! batch frame. A connection that closes fails every pending operation at once with
//! [`GroupError::Disconnected`]; a silent chain fails them when retransmissions run out
//! ([`CallerConfig`]). Nothing waits without a deadline.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::{Bytes, BytesMut};
use chorus_core::codec::{decode_batch, WireMessage};
use chorus_core::{NodeId, Time};
use chorus_region::TenantId;
use tokio::net::tcp::OwnedReadHalf;
use tokio::sync::{mpsc, oneshot};

use super::host::{dial, write_loop, Datapath};
use super::wire::{
    frame_of, group_frames, read_frame, ControlReply, ControlRequest, Hello, Role, FRAME_BYTES_MAX,
    FRAME_KIND_CONTROL, FRAME_KIND_REPLY,
};
use crate::caller::{CallerConfig, GroupCaller};
use crate::kernel::layout::{CHAIN_MAX, CHUNK_BYTES_MAX, RING};
use crate::kernel::packet::{self, GroupAddress};
use crate::message::{GroupMessage, FRAME_KIND_GROUP};
use crate::op::{GroupConfig, GroupError, GroupId, OpError, OpOutcome, Operation, Token, CHAIN_MEMBERS_MAX};
use crate::outbox::{GroupOutbox, RequestId};
use crate::txn::{GroupExecutor, TxnError};
use tokio::net::UdpSocket;

/// How to set up a group.
#[derive(Clone, Debug)]
pub struct GroupSpec {
    /// The chain, head first: each member's host address.
    pub hosts: Vec<SocketAddr>,
    pub tenant: TenantId,
    pub token: Token,
    pub group: GroupId,
    /// The region's name on every member (registered, or reopened, for the tenant).
    pub region: String,
    pub region_bytes: u64,
    pub epoch: u64,
    pub start_seq: u64,
    pub caller: CallerConfig,
    /// Deadline of connects, handshakes and control requests.
    pub io_timeout: Duration,
    /// Ask the hosts for the kernel data path ([`Datapath::Kernel`]): operations then travel as
    /// UDP datagrams that the hosts' XDP programs apply and forward. Falls back to the user
    /// path when any member cannot serve it.
    pub datapath: Datapath,
    /// The caller's timing on the kernel path, where datagrams can be lost: retransmit soon.
    pub kernel_caller: CallerConfig,
    /// Faults injected into the datagrams this caller sends (tests of the kernel path).
    pub wire_faults: Option<WireFaults>,
    /// Kernel path: the datagram socket and receiving task to share with other groups (one
    /// per event loop, [`KernelEndpoint`]); `None`: this group binds its own.
    pub kernel_endpoint: Option<Arc<KernelEndpoint>>,
}

/// One datagram socket and one receiving task for every group of an event loop on the kernel
/// path: the tails' acknowledgements and the members' read answers of all of them arrive on
/// it, are read in as few wake-ups as they come (every datagram queued is taken at each), and
/// go to their group by (tenant, group). A client with many groups (the multi-tenant
/// benchmark's event loop) then has one socket in its poll set and one reader instead of one
/// per group.
pub struct KernelEndpoint {
    socket: Arc<UdpSocket>,
    routes: Routes,
    task: tokio::task::AbortHandle,
}

type Routes = Arc<Mutex<HashMap<(TenantId, GroupId), Route>>>;

/// Where one group's datagrams go.
#[derive(Clone)]
struct Route {
    inbound: mpsc::UnboundedSender<Inbound>,
    reads: PendingReads,
    chain_len: usize,
}

impl std::fmt::Debug for KernelEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelEndpoint").field("port", &self.port()).finish()
    }
}

impl Drop for KernelEndpoint {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl KernelEndpoint {
    /// Bind a socket on any port and start its reader on the current tokio runtime.
    pub async fn bind() -> anyhow::Result<Arc<KernelEndpoint>> {
        let socket =
            Arc::new(UdpSocket::bind(("0.0.0.0", 0)).await.context("binding the caller's datagram socket")?);
        let routes: Routes = Arc::default();
        let task = tokio::spawn(receive_replies(socket.clone(), routes.clone()));
        Ok(Arc::new(KernelEndpoint { socket, routes, task: task.abort_handle() }))
    }

    pub fn port(&self) -> u16 {
        self.socket.local_addr().map_or(0, |addr| addr.port())
    }

    fn route(&self, tenant: TenantId, group: GroupId, route: Route) {
        self.routes.lock().unwrap_or_else(PoisonError::into_inner).insert((tenant, group), route);
    }

    fn unroute(&self, tenant: TenantId, group: GroupId) {
        self.routes.lock().unwrap_or_else(PoisonError::into_inner).remove(&(tenant, group));
    }
}

/// Loss, duplication and reordering of the caller's datagrams, drawn from `seed`.
#[derive(Clone, Copy, Debug, Default)]
pub struct WireFaults {
    pub seed: u64,
    pub drop_per_million: u32,
    pub duplicate_per_million: u32,
    /// Held back and sent after the next datagram.
    pub reorder_per_million: u32,
}

impl GroupSpec {
    pub fn new(
        hosts: Vec<SocketAddr>,
        tenant: TenantId,
        token: Token,
        group: GroupId,
        region: impl Into<String>,
        region_bytes: u64,
    ) -> GroupSpec {
        GroupSpec {
            hosts,
            tenant,
            token,
            group,
            region: region.into(),
            region_bytes,
            epoch: 1,
            start_seq: 1,
            // TCP does not lose messages: retransmissions only matter when a member is stuck,
            // and a closed connection is noticed at once.
            caller: CallerConfig {
                retransmit_after: Time::from_millis(1000),
                attempts_max: 5,
                window_max: 128,
            },
            io_timeout: Duration::from_secs(5),
            datapath: Datapath::User,
            kernel_caller: CallerConfig {
                retransmit_after: Time::from_millis(20),
                attempts_max: 200,
                window_max: 128,
            },
            wire_faults: None,
            kernel_endpoint: None,
        }
    }
}

type Results = Vec<Result<OpOutcome, GroupError>>;

enum Command {
    Execute { operations: Vec<Operation>, reply: oneshot::Sender<Results> },
}

enum Inbound {
    Messages(NodeId, Vec<GroupMessage>),
    /// Acknowledgements that arrived as datagrams (the kernel path).
    KernelAcks(Vec<packet::Ack>),
    Lost(usize, String),
}

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<ControlReply>>>>;

/// One caller connection to a member.
struct Conn {
    tx: mpsc::Sender<Bytes>,
    pending: Pending,
    active: Arc<AtomicBool>,
    tasks: Vec<tokio::task::AbortHandle>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Conn {
    async fn open(
        addr: SocketAddr,
        spec: &GroupSpec,
        position: usize,
        inbound: mpsc::UnboundedSender<Inbound>,
    ) -> anyhow::Result<Conn> {
        let hello = Hello { role: Role::Caller, tenant: spec.tenant, token: spec.token };
        let stream = dial(addr, &hello, spec.io_timeout).await.map_err(anyhow::Error::msg)?;
        let (reader, writer) = stream.into_split();
        let (tx, rx) = mpsc::channel(1024);
        let pending: Pending = Arc::new(Mutex::new(HashMap::new()));
        let active = Arc::new(AtomicBool::new(false));
        let timeout = spec.io_timeout;
        let writer = tokio::spawn(async move {
            let _ = write_loop(writer, rx, None, timeout).await;
        });
        let reader = tokio::spawn(read_loop(reader, position, inbound, pending.clone(), active.clone()));
        Ok(Conn { tx, pending, active, tasks: vec![writer.abort_handle(), reader.abort_handle()] })
    }

    async fn control(&self, request: ControlRequest, timeout: Duration) -> anyhow::Result<ControlReply> {
        let id = request.id();
        let (reply_tx, reply_rx) = oneshot::channel();
        self.pending.lock().unwrap_or_else(PoisonError::into_inner).insert(id, reply_tx);
        let exchange = async {
            self.tx.send(frame_of(FRAME_KIND_CONTROL, &request)).await.ok().context("connection closed")?;
            reply_rx.await.ok().context("connection closed before the reply")
        };
        let result = tokio::time::timeout(timeout, exchange).await;
        self.pending.lock().unwrap_or_else(PoisonError::into_inner).remove(&id);
        match result {
            Ok(reply) => reply,
            Err(_) => bail!("no reply within {timeout:?}"),
        }
    }
}

async fn read_loop(
    mut reader: OwnedReadHalf,
    position: usize,
    inbound: mpsc::UnboundedSender<Inbound>,
    pending: Pending,
    active: Arc<AtomicBool>,
) {
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let reason = loop {
        match read_frame(&mut reader, &mut buf, FRAME_BYTES_MAX).await {
            Ok(Some(frame)) if frame.kind == FRAME_KIND_GROUP => {
                match decode_batch::<GroupMessage>(frame.payload) {
                    Ok(messages) => {
                        let _ = inbound.send(Inbound::Messages(NodeId(position as u8 + 1), messages));
                    }
                    Err(error) => break format!("malformed batch from member {position}: {error}"),
                }
            }
            Ok(Some(frame)) if frame.kind == FRAME_KIND_REPLY => {
                match ControlReply::decode_exact(frame.payload) {
                    Ok(reply) => {
                        let waiter =
                            pending.lock().unwrap_or_else(PoisonError::into_inner).remove(&reply.id());
                        if let Some(waiter) = waiter {
                            let _ = waiter.send(reply);
                        }
                    }
                    Err(error) => break format!("malformed reply from member {position}: {error}"),
                }
            }
            Ok(Some(frame)) => {
                break format!("unexpected frame kind {:#x} from member {position}", frame.kind)
            }
            Ok(None) => break format!("member {position} closed the connection"),
            Err(error) => break format!("connection to member {position} failed: {error}"),
        }
    };
    pending.lock().unwrap_or_else(PoisonError::into_inner).clear();
    if active.load(Relaxed) {
        let _ = inbound.send(Inbound::Lost(position, reason));
    }
}

/// A tenant's handle on one group. Dropping it closes its connections; the hosts then drop
/// the group's members (the regions stay).
pub struct GroupClient {
    commands: mpsc::UnboundedSender<Command>,
    conns: Vec<Conn>,
    region_paths: Vec<String>,
    data_addrs: Vec<SocketAddr>,
    group: GroupId,
    io_timeout: Duration,
    next_control: AtomicU64,
    datapath: Datapath,
    driver: tokio::task::AbortHandle,
    /// One-sided reads as datagrams (kernel path only).
    kernel_reads: Option<KernelReads>,
    /// Where this group's datagrams come in (kernel path only).
    endpoint: Option<(Arc<KernelEndpoint>, TenantId)>,
}

type PendingReads = Arc<Mutex<HashMap<u64, oneshot::Sender<Vec<u8>>>>>;

/// One-sided reads served by the members' XDP programs (no host process woken).
struct KernelReads {
    socket: Arc<UdpSocket>,
    /// Each member's datagram address.
    members: Vec<SocketAddr>,
    address: GroupAddress,
    pending: PendingReads,
    next_id: AtomicU64,
    /// Reads the members' XDP programs answered.
    served: AtomicU64,
}

/// Reads are retried this often, this long apart, before falling back to the control connection.
const KERNEL_READ_ATTEMPTS: u32 = 5;
const KERNEL_READ_TIMEOUT: Duration = Duration::from_millis(20);

impl KernelReads {
    async fn read(&self, position: usize, offset: u64, len: u64) -> Option<Vec<u8>> {
        let to = *self.members.get(position)?;
        let mut buf = Vec::new();
        for _ in 0..KERNEL_READ_ATTEMPTS {
            let id = self.next_id.fetch_add(1, Relaxed);
            let (tx, rx) = oneshot::channel();
            self.pending.lock().unwrap_or_else(PoisonError::into_inner).insert(id, tx);
            packet::encode_read(&self.address, id, offset, len, &mut buf);
            let sent = self.socket.send_to(&buf, to).await.is_ok();
            let answer = if sent { tokio::time::timeout(KERNEL_READ_TIMEOUT, rx).await.ok() } else { None };
            self.pending.lock().unwrap_or_else(PoisonError::into_inner).remove(&id);
            if let Some(Ok(bytes)) = answer {
                self.served.fetch_add(1, Relaxed);
                return Some(bytes);
            }
        }
        None
    }
}

impl Drop for GroupClient {
    fn drop(&mut self) {
        self.driver.abort();
        if let Some((endpoint, tenant)) = &self.endpoint {
            endpoint.unroute(*tenant, self.group);
        }
    }
}

/// What initializing every member produced.
struct Members {
    conns: Vec<Conn>,
    data_addrs: Vec<SocketAddr>,
    region_paths: Vec<String>,
    /// Each member's UDP data port if it is on the kernel path.
    kernel_ports: Vec<Option<u16>>,
}

impl GroupClient {
    /// HyperLoop §5 `Initialize`: bind the group's member on every host, tail first (each
    /// member links to the next one), following a Naïve dispatcher's redirect to the replica
    /// it started. Fails with the host's reason (wrong token, region size mismatch...).
    pub async fn initialize(spec: GroupSpec) -> anyhow::Result<GroupClient> {
        let n = spec.hosts.len();
        if n == 0 || n > CHAIN_MEMBERS_MAX {
            bail!("a chain has 1 to {CHAIN_MEMBERS_MAX} members, not {n}");
        }
        let (inbound_tx, inbound_rx) = mpsc::unbounded_channel();
        let next_control = AtomicU64::new(1);
        let endpoint = match (spec.datapath, &spec.kernel_endpoint) {
            (Datapath::Kernel, shared) if n <= CHAIN_MAX && spec.kernel_caller.window_max <= RING => {
                Some(match shared {
                    Some(shared) => shared.clone(),
                    None => KernelEndpoint::bind().await?,
                })
            }
            _ => None,
        };
        let caller_port = endpoint.as_ref().map_or(0, |endpoint| endpoint.port());
        let mut members = initialize_members(&spec, caller_port, &inbound_tx, &next_control).await?;
        let on_kernel = members.kernel_ports.iter().all(Option::is_some);
        if caller_port != 0 && !on_kernel {
            // Some member cannot serve the kernel path: every member goes to the user path
            // (closing the first connections drops what was installed).
            tracing::info!("a member is not on the kernel data path: the group uses the user-space path");
            drop(members);
            members = initialize_members(&spec, 0, &inbound_tx, &next_control).await?;
        }
        let datapath = if caller_port != 0 && on_kernel { Datapath::Kernel } else { Datapath::User };
        let config = GroupConfig {
            group: spec.group,
            tenant: spec.tenant,
            token: spec.token,
            epoch: spec.epoch,
            chain: (1..=n).map(|i| NodeId(i as u8)).collect(),
            caller: NodeId(0),
            region_bytes: spec.region_bytes,
            start_seq: spec.start_seq,
        };
        let caller_config = if datapath == Datapath::Kernel { &spec.kernel_caller } else { &spec.caller };
        let caller =
            GroupCaller::new(config, NodeId(0), caller_config.clone()).map_err(anyhow::Error::msg)?;
        let tick =
            Duration::from_nanos(caller_config.retransmit_after.as_nanos() / 2).max(Duration::from_millis(1));
        let (transport, kernel_reads, endpoint) = match (datapath, endpoint) {
            (Datapath::Kernel, Some(endpoint)) => {
                let kernel_addrs: Vec<SocketAddr> = (0..n)
                    .map(|i| {
                        SocketAddr::new(members.data_addrs[i].ip(), members.kernel_ports[i].unwrap_or(0))
                    })
                    .collect();
                let address = GroupAddress {
                    tenant: spec.tenant,
                    group: spec.group,
                    epoch: spec.epoch,
                    token: spec.token,
                };
                let pending: PendingReads = Arc::default();
                let route = Route { inbound: inbound_tx.clone(), reads: pending.clone(), chain_len: n };
                endpoint.route(spec.tenant, spec.group, route);
                let socket = endpoint.socket.clone();
                let sender = KernelSender::new(
                    socket.clone(),
                    kernel_addrs[0],
                    address,
                    spec.region_bytes,
                    n,
                    spec.wire_faults,
                );
                let reads = KernelReads {
                    socket,
                    members: kernel_addrs,
                    address,
                    pending,
                    next_id: AtomicU64::new(1),
                    served: AtomicU64::new(0),
                };
                (Transport::Kernel(Box::new(sender)), Some(reads), Some((endpoint, spec.tenant)))
            }
            _ => (Transport::Tcp(members.conns[0].tx.clone()), None, None),
        };
        let (commands_tx, commands_rx) = mpsc::unbounded_channel();
        let driver = tokio::spawn(drive(caller, commands_rx, inbound_rx, transport, tick));
        Ok(GroupClient {
            commands: commands_tx,
            conns: members.conns,
            region_paths: members.region_paths,
            data_addrs: members.data_addrs,
            group: spec.group,
            io_timeout: spec.io_timeout,
            next_control,
            datapath,
            driver: driver.abort_handle(),
            kernel_reads,
            endpoint,
        })
    }

    /// How many one-sided reads the members' XDP programs answered (kernel path).
    pub fn kernel_reads_served(&self) -> u64 {
        self.kernel_reads.as_ref().map_or(0, |reads| reads.served.load(Relaxed))
    }

    /// The data path this group's operations take.
    pub fn datapath(&self) -> Datapath {
        self.datapath
    }

    pub fn chain_len(&self) -> usize {
        self.conns.len()
    }
    pub fn group(&self) -> GroupId {
        self.group
    }
    /// Each member's region file on its host (the tenant's process there maps it read-only,
    /// `chorus_region::RegionView`).
    pub fn region_paths(&self) -> &[String] {
        &self.region_paths
    }
    /// Where each member's operations are served: the host itself, or a Naïve replica.
    pub fn data_addrs(&self) -> &[SocketAddr] {
        &self.data_addrs
    }

    /// Submit `operations` in order, pipelined, and wait for every one. Each completes exactly
    /// once: acknowledged by the tail, rejected (nothing changed), or failed with an
    /// outcome-unknown error when the chain is unreachable.
    pub async fn execute(&self, operations: Vec<Operation>) -> Results {
        let count = operations.len();
        if count == 0 {
            return Vec::new();
        }
        let (reply, wait) = oneshot::channel();
        let stopped = || vec![Err(GroupError::Disconnected("the client's driver stopped".into())); count];
        if self.commands.send(Command::Execute { operations, reply }).is_err() {
            return stopped();
        }
        wait.await.unwrap_or_else(|_| stopped())
    }

    pub async fn submit(&self, operation: Operation) -> Result<OpOutcome, GroupError> {
        self.execute(vec![operation])
            .await
            .pop()
            .unwrap_or_else(|| Err(GroupError::Disconnected("no result".into())))
    }

    /// One-sided read of `len` bytes at `offset` of the member at `position`'s region
    /// (HyperLoop's lock-free read at the head or the tail), served by that member's host.
    pub async fn read(&self, position: usize, offset: u64, len: u64) -> Result<Vec<u8>, TxnError> {
        let conn = self.conns.get(position).ok_or(TxnError::NoSuchMember(position))?;
        // On the kernel path the member's XDP program answers (no process woken); a read it
        // cannot serve (too large, out of bounds, lost every time) goes over the connection.
        if let Some(reads) = &self.kernel_reads {
            if (1..=CHUNK_BYTES_MAX).contains(&len) {
                if let Some(bytes) = reads.read(position, offset, len).await {
                    return Ok(bytes);
                }
            }
        }
        let id = self.next_control.fetch_add(1, Relaxed);
        let request = ControlRequest::Read { id, group: self.group, offset, len };
        match conn.control(request, self.io_timeout).await {
            Ok(ControlReply::Data { bytes, .. }) => Ok(bytes.to_vec()),
            Ok(ControlReply::Error { message, .. }) => Err(TxnError::Protocol(message)),
            Ok(other) => Err(TxnError::Protocol(format!("unexpected reply {other:?}"))),
            Err(error) => Err(TxnError::Group(GroupError::Disconnected(format!("{error:#}")))),
        }
    }

    /// Is member `position`'s host answering? (A round trip on its control connection.)
    pub async fn ping(&self, position: usize) -> anyhow::Result<()> {
        let conn = self.conns.get(position).context("no such member")?;
        let id = self.next_control.fetch_add(1, Relaxed);
        match conn.control(ControlRequest::Ping { id }, self.io_timeout).await? {
            ControlReply::Pong { .. } => Ok(()),
            other => bail!("unexpected reply {other:?}"),
        }
    }
}

/// HyperLoop §5 `Initialize` on every member, tail first (each member links to the next one),
/// following a Naïve dispatcher's redirect to the replica it started.
async fn initialize_members(
    spec: &GroupSpec,
    caller_port: u16,
    inbound_tx: &mpsc::UnboundedSender<Inbound>,
    next_control: &AtomicU64,
) -> anyhow::Result<Members> {
    let n = spec.hosts.len();
    let mut conns: Vec<Option<Conn>> = (0..n).map(|_| None).collect();
    let mut data_addrs: Vec<Option<SocketAddr>> = vec![None; n];
    let mut region_paths = vec![String::new(); n];
    let mut kernel_ports = vec![None; n];
    for position in (0..n).rev() {
        let next = if position + 1 < n { data_addrs[position + 1].map(|a| a.to_string()) } else { None };
        let mut addr = spec.hosts[position];
        let mut redirects = 0;
        loop {
            let conn = Conn::open(addr, spec, position, inbound_tx.clone())
                .await
                .with_context(|| format!("member {position} at {addr}"))?;
            let request = ControlRequest::Initialize {
                id: next_control.fetch_add(1, Relaxed),
                group: spec.group,
                epoch: spec.epoch,
                start_seq: spec.start_seq,
                region: spec.region.clone(),
                region_bytes: spec.region_bytes,
                chain_len: n as u8,
                position: position as u8,
                next: next.clone(),
                caller_port,
            };
            let reply = conn
                .control(request, spec.io_timeout)
                .await
                .with_context(|| format!("initializing member {position} at {addr}"))?;
            let (region_path, kernel_port) = match reply {
                ControlReply::Initialized { region_path, .. } => (region_path, None),
                ControlReply::InitializedKernel { region_path, data_port, .. } => {
                    (region_path, Some(data_port))
                }
                ControlReply::Redirect { addr: to, .. } if redirects == 0 => {
                    redirects += 1;
                    addr = to.parse().with_context(|| format!("redirect to {to:?}"))?;
                    continue;
                }
                ControlReply::Error { message, .. } => {
                    bail!("member {position} at {addr} refused Initialize: {message}")
                }
                other => bail!("member {position} at {addr} answered Initialize with {other:?}"),
            };
            conn.active.store(true, Relaxed);
            conns[position] = Some(conn);
            data_addrs[position] = Some(addr);
            region_paths[position] = region_path;
            kernel_ports[position] = kernel_port;
            break;
        }
    }
    Ok(Members {
        conns: conns.into_iter().flatten().collect(),
        data_addrs: data_addrs.into_iter().flatten().collect(),
        region_paths,
        kernel_ports,
    })
}

/// Where the driver sends operations for the head.
enum Transport {
    /// Batch frames on the caller connection to the head.
    Tcp(mpsc::Sender<Bytes>),
    /// Datagrams to the head's XDP program.
    Kernel(Box<KernelSender>),
}

/// The kernel path's sender: one datagram per operation, the caller's own verdicts kept to
/// report them when the tail acknowledges, and optional injected faults.
struct KernelSender {
    socket: Arc<UdpSocket>,
    head: SocketAddr,
    address: GroupAddress,
    region_bytes: u64,
    chain_len: usize,
    /// Operations the caller found malformed, by sequence number, until acknowledged.
    rejected: HashMap<u64, OpError>,
    buf: Vec<u8>,
    faults: Option<(WireFaults, u64)>,
    held: Option<Vec<u8>>,
}

impl KernelSender {
    fn new(
        socket: Arc<UdpSocket>,
        head: SocketAddr,
        address: GroupAddress,
        region_bytes: u64,
        chain_len: usize,
        faults: Option<WireFaults>,
    ) -> KernelSender {
        KernelSender {
            socket,
            head,
            address,
            region_bytes,
            chain_len,
            rejected: HashMap::new(),
            buf: Vec::with_capacity(2048),
            faults: faults.map(|f| (f, f.seed)),
            held: None,
        }
    }

    /// Operations larger than a datagram become several (see [`packet::split`]); a malformed
    /// one stays whole, to be rejected.
    fn pieces(&self, operation: Operation) -> Vec<Operation> {
        match operation.validate(self.region_bytes, self.chain_len) {
            Ok(()) => packet::split(&operation),
            Err(_) => vec![operation],
        }
    }

    async fn send(&mut self, message: &GroupMessage) {
        let GroupMessage::Op { seq, operation, .. } = message else { return };
        let verdict = operation.validate(self.region_bytes, self.chain_len).err();
        if let Some(error) = verdict {
            self.rejected.insert(*seq, error);
        }
        packet::encode_op(&self.address, *seq, operation, verdict.is_some(), &mut self.buf);
        let datagram = std::mem::take(&mut self.buf);
        self.send_datagram(&datagram).await;
        self.buf = datagram;
    }

    async fn send_datagram(&mut self, datagram: &[u8]) {
        let Some((faults, state)) = &mut self.faults else {
            let _ = self.socket.send_to(datagram, self.head).await;
            return;
        };
        let roll = |state: &mut u64, per_million: u32| splitmix64(state) % 1_000_000 < u64::from(per_million);
        let faults = *faults;
        if roll(state, faults.drop_per_million) {
            return;
        }
        if self.held.is_none() && roll(state, faults.reorder_per_million) {
            self.held = Some(datagram.to_vec());
            return;
        }
        let copies = if roll(state, faults.duplicate_per_million) { 2 } else { 1 };
        for _ in 0..copies {
            let _ = self.socket.send_to(datagram, self.head).await;
        }
        if let Some(held) = self.held.take() {
            let _ = self.socket.send_to(&held, self.head).await;
        }
    }

    /// Send whatever was held back for reordering (the end of a turn).
    async fn flush_held(&mut self) {
        if let Some(held) = self.held.take() {
            let _ = self.socket.send_to(&held, self.head).await;
        }
    }

    /// The acknowledgement as the caller core expects it.
    fn ack_message(&mut self, ack: packet::Ack) -> GroupMessage {
        let own = self.rejected.remove(&ack.seq);
        let outcome = match (ack.verdict, own) {
            (0, _) => Ok(ack.results),
            (_, Some(error)) => Err(error),
            // The kernel rejected what the caller found valid: only a verdict of its own
            // (never expected; reported as out of bounds rather than invented precisely).
            (_, None) => Err(OpError::OutOfBounds { offset: 0, len: 0, region_bytes: self.region_bytes }),
        };
        GroupMessage::Ack { group: ack.group, epoch: ack.epoch, seq: ack.seq, outcome }
    }
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Read the tails' acknowledgements (to each group's driver) and the members' read answers
/// (to their waiters) off a caller's datagram socket, for every group routed through it: every
/// datagram queued is taken at each wake-up, and each group's acknowledgements go to its
/// driver as one batch.
async fn receive_replies(socket: Arc<UdpSocket>, routes: Routes) {
    let mut buf = vec![0u8; 2048];
    let mut acks: HashMap<(TenantId, GroupId), Vec<packet::Ack>> = HashMap::new();
    loop {
        let Ok(len) = socket.recv(&mut buf).await else { return };
        {
            let routes = routes.lock().unwrap_or_else(PoisonError::into_inner);
            let mut keep = |datagram: &[u8]| route_reply(datagram, &routes, &mut acks);
            keep(&buf[..len]);
            while let Ok(len) = socket.try_recv(&mut buf) {
                keep(&buf[..len]);
            }
            for (key, acks) in acks.drain() {
                if let Some(route) = routes.get(&key) {
                    let _ = route.inbound.send(Inbound::KernelAcks(acks));
                }
            }
        }
    }
}

/// One datagram: an acknowledgement kept for its group's driver, or a read's answer handed to
/// its waiter; anything else (another tenant's, malformed, late) is dropped.
fn route_reply(
    datagram: &[u8],
    routes: &HashMap<(TenantId, GroupId), Route>,
    acks: &mut HashMap<(TenantId, GroupId), Vec<packet::Ack>>,
) {
    match packet::decode_reply(datagram, CHAIN_MAX) {
        Some(packet::Reply::Ack(mut ack)) => {
            let key = (ack.tenant, ack.group);
            let Some(route) = routes.get(&key) else { return };
            ack.results.truncate(route.chain_len);
            acks.entry(key).or_default().push(ack);
        }
        Some(packet::Reply::Data { tenant, group, id, bytes }) => {
            let Some(route) = routes.get(&(tenant, group)) else { return };
            if let Some(waiter) = route.reads.lock().unwrap_or_else(PoisonError::into_inner).remove(&id) {
                let _ = waiter.send(bytes);
            }
        }
        None => {}
    }
}

struct Batch {
    results: Vec<Option<Result<OpOutcome, GroupError>>>,
    /// Per operation, the pieces (datagram-sized operations) not completed yet.
    pieces_left: Vec<usize>,
    remaining: usize,
    reply: Option<oneshot::Sender<Results>>,
}

impl Batch {
    /// One piece of operation `index` completed: the operation's result is its first error,
    /// or its first piece's outcome (a gCAS is never split).
    fn complete(&mut self, index: usize, result: Result<OpOutcome, GroupError>) {
        let (Some(slot), Some(left)) = (self.results.get_mut(index), self.pieces_left.get_mut(index)) else {
            return;
        };
        if *left == 0 {
            return;
        }
        match (&slot, &result) {
            (None, _) | (Some(Ok(_)), Err(_)) => *slot = Some(result),
            _ => {}
        }
        *left -= 1;
        if *left == 0 {
            self.remaining -= 1;
        }
    }
}

async fn drive(
    mut caller: GroupCaller,
    mut commands: mpsc::UnboundedReceiver<Command>,
    mut inbound: mpsc::UnboundedReceiver<Inbound>,
    mut transport: Transport,
    tick: Duration,
) {
    let origin = Instant::now();
    let now = || Time::from_nanos(origin.elapsed().as_nanos() as u64);
    let mut batches: HashMap<u64, Batch> = HashMap::new();
    let mut requests: HashMap<RequestId, (u64, usize)> = HashMap::new();
    let (mut next_request, mut next_batch) = (0u64, 0u64);
    // Retransmissions are checked `tick` after an operation is pending, and only then: an
    // idle group (or a hundred of them on one event loop) costs no timer wake-ups.
    let mut retransmit_check: Option<tokio::time::Instant> = None;
    let mut out = GroupOutbox::default();
    let mut to_head = Vec::new();
    let tail = NodeId(caller.group().chain.len() as u8);
    loop {
        let mut submit =
            |command: Command, out: &mut GroupOutbox, caller: &mut GroupCaller, transport: &Transport| {
                let Command::Execute { operations, reply } = command;
                let batch = next_batch;
                next_batch += 1;
                let pieces: Vec<Vec<Operation>> = operations
                    .into_iter()
                    .map(|operation| match transport {
                        Transport::Kernel(sender) => sender.pieces(operation),
                        Transport::Tcp(_) => vec![operation],
                    })
                    .collect();
                batches.insert(
                    batch,
                    Batch {
                        results: (0..pieces.len()).map(|_| None).collect(),
                        pieces_left: pieces.iter().map(Vec::len).collect(),
                        remaining: pieces.len(),
                        reply: Some(reply),
                    },
                );
                let at = now();
                for (index, operation) in
                    pieces.into_iter().enumerate().flat_map(|(i, ps)| ps.into_iter().map(move |p| (i, p)))
                {
                    let request = RequestId(next_request);
                    next_request += 1;
                    requests.insert(request, (batch, index));
                    caller.submit(at, request, operation, out);
                }
            };
        let handle_inbound = |item: Inbound,
                              out: &mut GroupOutbox,
                              caller: &mut GroupCaller,
                              transport: &mut Transport| match item {
            Inbound::Messages(from, messages) => {
                let at = now();
                for message in messages {
                    caller.on_message(at, from, message, out);
                }
            }
            Inbound::KernelAcks(acks) => {
                let at = now();
                if let Transport::Kernel(sender) = transport {
                    for ack in acks {
                        caller.on_message(at, tail, sender.ack_message(ack), out);
                    }
                }
            }
            Inbound::Lost(position, reason) => {
                tracing::debug!(position, "group connection lost: {reason}");
                caller.on_link_lost(reason, out);
            }
        };
        tokio::select! {
            command = commands.recv() => {
                let Some(command) = command else { break };
                submit(command, &mut out, &mut caller, &transport);
                while let Ok(command) = commands.try_recv() {
                    submit(command, &mut out, &mut caller, &transport);
                }
            }
            item = inbound.recv() => {
                let Some(item) = item else { break };
                handle_inbound(item, &mut out, &mut caller, &mut transport);
                while let Ok(item) = inbound.try_recv() {
                    handle_inbound(item, &mut out, &mut caller, &mut transport);
                }
            }
            _ = sleep_until_some(retransmit_check), if retransmit_check.is_some() => {
                retransmit_check = None;
                caller.on_tick(now(), &mut out);
            }
        }
        to_head.clear();
        for (to, message) in out.messages.drain(..) {
            if to == NodeId(1) {
                to_head.push(message);
            }
        }
        match &mut transport {
            Transport::Tcp(head) => {
                for frame in group_frames(&to_head) {
                    if head.send(frame).await.is_err() {
                        caller.on_link_lost("the connection to the head is closed".into(), &mut out);
                        break;
                    }
                }
            }
            Transport::Kernel(sender) => {
                for message in &to_head {
                    sender.send(message).await;
                }
                sender.flush_held().await;
            }
        }
        retransmit_check = match (caller.pending(), retransmit_check) {
            (0, _) => None,
            (_, None) => Some(tokio::time::Instant::now() + tick),
            (_, armed) => armed,
        };
        for (request, result) in out.completions.drain(..) {
            let Some((batch_id, index)) = requests.remove(&request) else { continue };
            let Some(batch) = batches.get_mut(&batch_id) else { continue };
            batch.complete(index, result);
            if batch.remaining == 0 {
                if let Some(batch) = batches.remove(&batch_id) {
                    let results = batch
                        .results
                        .into_iter()
                        .map(|r| r.unwrap_or_else(|| Err(GroupError::Disconnected("lost".into()))))
                        .collect();
                    if let Some(reply) = batch.reply {
                        let _ = reply.send(results);
                    }
                }
            }
        }
    }
}

async fn sleep_until_some(deadline: Option<tokio::time::Instant>) {
    if let Some(deadline) = deadline {
        tokio::time::sleep_until(deadline).await;
    }
}

/// A [`GroupClient`] with its own runtime, for synchronous code: the transaction API
/// ([`crate::txn::Txn`]) runs on it through [`GroupExecutor`]. Do not call it from inside an
/// async runtime.
pub struct BlockingGroupClient {
    // Dropped before the runtime (field order): its tasks are aborted first.
    client: GroupClient,
    runtime: tokio::runtime::Runtime,
}

impl BlockingGroupClient {
    pub fn initialize(spec: GroupSpec) -> anyhow::Result<BlockingGroupClient> {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
        let client = runtime.block_on(GroupClient::initialize(spec))?;
        Ok(BlockingGroupClient { client, runtime })
    }

    fn inner(&self) -> &GroupClient {
        &self.client
    }

    pub fn client(&self) -> &GroupClient {
        self.inner()
    }
    pub fn execute_blocking(&self, operations: Vec<Operation>) -> Results {
        self.runtime.block_on(self.inner().execute(operations))
    }
    pub fn read_blocking(&self, position: usize, offset: u64, len: u64) -> Result<Vec<u8>, TxnError> {
        self.runtime.block_on(self.inner().read(position, offset, len))
    }
}

impl GroupExecutor for BlockingGroupClient {
    fn execute(&mut self, operations: Vec<Operation>) -> Vec<Result<OpOutcome, GroupError>> {
        self.execute_blocking(operations)
    }
    fn read(&mut self, position: usize, offset: u64, len: u64) -> Result<Vec<u8>, TxnError> {
        self.read_blocking(position, offset, len)
    }
    fn chain_len(&self) -> usize {
        self.inner().chain_len()
    }
}
