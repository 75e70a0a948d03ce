//! A member that lives on a group host, seen from the process that configures it: the caller
//! connection of the chain store's hosted member (`--protocol chain` with group hosts, issue
//! 17 point 5; docs/protocols/chain.md, "Where the members run").
//!
//! Unlike [`super::GroupClient`], which initializes a whole chain from one caller, each node
//! initializes only its own host's member, and never waits: [`HostLink`] is driven from a
//! synchronous event loop. It queues control requests and group frames for a background task
//! that owns the connection, and hands back what the host sent (acknowledgements of groups
//! whose tail this member is, refusals) through [`HostLink::drain`]. If the connection breaks,
//! the task dials again and repeats the last `Initialize` of every group (the host dropped
//! them with the connection); operations lost meanwhile are the caller's to retransmit.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use chorus_core::codec::{decode_batch, WireMessage};
use chorus_region::TenantId;
use tokio::sync::mpsc;
use tracing::{debug, info, trace, warn};

use super::host::{dial, write_loop};
use super::wire::{
    frame_of, group_frames, read_frame, ControlReply, ControlRequest, Hello, Role, FRAME_BYTES_MAX,
    FRAME_KIND_CONTROL, FRAME_KIND_REPLY,
};
use crate::message::{GroupMessage, FRAME_KIND_GROUP};
use crate::op::{GroupId, Token};

const QUEUE_FRAMES: usize = 1024;
const REDIAL_AFTER: Duration = Duration::from_millis(50);

/// One member's `Initialize` on its own host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostedInit {
    pub group: GroupId,
    pub epoch: u64,
    pub start_seq: u64,
    pub region: String,
    pub region_bytes: u64,
    pub chain_len: u8,
    pub position: u8,
    /// The next member's host (absent at the tail).
    pub next: Option<SocketAddr>,
    /// Kernel path: the UDP port the tail acknowledges to, at the address this connection
    /// comes from (0: the user path, acknowledgements on this connection).
    pub caller_port: u16,
}

enum Request {
    Initialize(HostedInit),
    Frame(Bytes),
}

/// The caller connection of one member hosted on a group host. Dropping it closes the
/// connection; the host then drops the member (the region file stays).
pub struct HostLink {
    requests: mpsc::UnboundedSender<Request>,
    received: std_mpsc::Receiver<GroupMessage>,
    last_error: Arc<Mutex<Option<String>>>,
    /// The connection was lost and, as asked, not dialled again.
    lost: Arc<std::sync::atomic::AtomicBool>,
    /// Called whenever the host sent something ([`HostLink::wake_with`]).
    wake: Arc<OnceLock<Wake>>,
    task: tokio::task::AbortHandle,
}

/// How a [`HostLink`] tells its event loop that [`HostLink::drain`] has something.
pub type Wake = Box<dyn Fn() + Send + Sync>;

impl Drop for HostLink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl HostLink {
    /// Start the connection to the host at `addr` on the current tokio runtime; dial again
    /// whenever it is lost.
    pub fn start(addr: SocketAddr, tenant: TenantId, token: Token, io_timeout: Duration) -> HostLink {
        HostLink::start_with(addr, tenant, token, io_timeout, true)
    }

    /// As [`HostLink::start`]; with `redial_after_loss` false, a connection that was up and is
    /// lost is not dialled again ([`HostLink::lost`]): on the kernel path the region lived in
    /// that host process, and a new one would hold an empty one under the same name.
    pub fn start_with(
        addr: SocketAddr,
        tenant: TenantId,
        token: Token,
        io_timeout: Duration,
        redial_after_loss: bool,
    ) -> HostLink {
        let (requests, rx) = mpsc::unbounded_channel();
        let (received_tx, received_rx) = std_mpsc::channel();
        let last_error = Arc::new(Mutex::new(None));
        let lost = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let hello = Hello { role: Role::Caller, tenant, token };
        let give_up = (!redial_after_loss).then(|| lost.clone());
        let wake = Arc::new(OnceLock::new());
        let received = Received { messages: received_tx, wake: wake.clone() };
        let task = tokio::spawn(run(addr, hello, io_timeout, rx, received, last_error.clone(), give_up));
        HostLink { requests, received: received_rx, last_error, lost, wake, task: task.abort_handle() }
    }

    /// Call `wake` whenever the host sends something, from the connection's task (at most
    /// once: a later call is ignored). An event loop that polls sockets of its own wakes its
    /// poll with it, so acknowledgements reach its core at once, not at its next tick.
    pub fn wake_with(&self, wake: Wake) {
        let _ = self.wake.set(wake);
    }

    /// The connection was lost and not dialled again (see [`HostLink::start_with`]).
    pub fn lost(&self) -> bool {
        self.lost.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Initialize (or re-initialize, in a newer epoch) this member on the host. Operations sent
    /// after it reach the host after it, on the same connection.
    pub fn initialize(&self, init: HostedInit) {
        let _ = self.requests.send(Request::Initialize(init));
    }

    /// Operations for the group whose head this member is (or any group message the host's
    /// member should apply as coming from the caller).
    pub fn send(&self, messages: &[GroupMessage]) {
        for frame in group_frames(messages) {
            let _ = self.requests.send(Request::Frame(frame));
        }
    }

    /// Everything the host sent since the last call: acknowledgements and refusals.
    pub fn drain(&self, into: &mut Vec<GroupMessage>) {
        into.extend(self.received.try_iter());
    }

    /// The host's last refusal of an `Initialize`, or why it cannot be reached.
    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

fn log_initialize(id: u64, init: &HostedInit) {
    debug!(
        id,
        group = init.group.0,
        epoch = init.epoch,
        start_seq = init.start_seq,
        position = init.position,
        chain_len = init.chain_len,
        next = ?init.next,
        "Initialize to the group host"
    );
}

fn initialize_request(id: u64, init: &HostedInit) -> ControlRequest {
    ControlRequest::Initialize {
        id,
        group: init.group,
        epoch: init.epoch,
        start_seq: init.start_seq,
        region: init.region.clone(),
        region_bytes: init.region_bytes,
        chain_len: init.chain_len,
        position: init.position,
        next: init.next.map(|addr| addr.to_string()),
        caller_port: init.caller_port,
    }
}

/// Where a member's region lives on its host's kernel data path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelRegionSlot {
    /// The host's regions map (a BPF array; `kernel::datapath::open_slot` maps a slot).
    pub map_id: u32,
    pub slot: u32,
    /// The host's UDP port for operations (its address is the host's).
    pub data_port: u16,
}

/// Ask the host at `addr` to register the tenant's region `name` on its kernel data path (or
/// find it again) and say where it is. Fails with the host's reason, e.g. when it serves on
/// the user path only.
pub async fn kernel_region(
    addr: SocketAddr,
    tenant: TenantId,
    token: Token,
    name: &str,
    region_bytes: u64,
    io_timeout: Duration,
) -> Result<KernelRegionSlot, String> {
    let hello = Hello { role: Role::Caller, tenant, token };
    let exchange = async {
        let stream = dial(addr, &hello, io_timeout).await?;
        let (mut reader, mut writer) = stream.into_split();
        let request = ControlRequest::KernelRegion { id: 1, region: name.to_string(), region_bytes };
        tokio::io::AsyncWriteExt::write_all(&mut writer, &frame_of(FRAME_KIND_CONTROL, &request))
            .await
            .map_err(|e| e.to_string())?;
        let mut buf = BytesMut::new();
        let frame = read_frame(&mut reader, &mut buf, FRAME_BYTES_MAX)
            .await
            .map_err(|e| e.to_string())?
            .ok_or("the host closed the connection")?;
        if frame.kind != FRAME_KIND_REPLY {
            return Err(format!("unexpected frame kind {:#x}", frame.kind));
        }
        match ControlReply::decode_exact(frame.payload).map_err(|e| e.to_string())? {
            ControlReply::KernelRegion { map_id, slot, data_port, .. } => {
                Ok(KernelRegionSlot { map_id, slot, data_port })
            }
            ControlReply::Error { message, .. } => Err(message),
            other => Err(format!("unexpected reply {other:?}")),
        }
    };
    tokio::time::timeout(io_timeout, exchange)
        .await
        .map_err(|_| format!("group host {addr} did not answer in {io_timeout:?}"))?
        .map_err(|reason| format!("group host {addr}: {reason}"))
}

/// Where the connection's reader puts what the host sent, and whom it wakes.
#[derive(Clone)]
struct Received {
    messages: std_mpsc::Sender<GroupMessage>,
    wake: Arc<OnceLock<Wake>>,
}

impl Received {
    fn wake(&self) {
        if let Some(wake) = self.wake.get() {
            wake();
        }
    }
}

async fn run(
    addr: SocketAddr,
    hello: Hello,
    io_timeout: Duration,
    mut requests: mpsc::UnboundedReceiver<Request>,
    received: Received,
    last_error: Arc<Mutex<Option<String>>>,
    give_up: Option<Arc<std::sync::atomic::AtomicBool>>,
) {
    let set_error =
        |error: Option<String>| *last_error.lock().unwrap_or_else(PoisonError::into_inner) = error;
    let mut inits: BTreeMap<GroupId, HostedInit> = BTreeMap::new();
    let mut next_id = 1u64;
    let mut connections = 0u64;
    let mut failed_dials = 0u64;
    loop {
        let stream = match dial(addr, &hello, io_timeout).await {
            Ok(stream) => stream,
            Err(reason) => {
                failed_dials += 1;
                if failed_dials == 1 {
                    info!(%addr, "cannot reach the group host ({reason}); dialling again every {REDIAL_AFTER:?}");
                } else {
                    debug!(%addr, failed_dials, "cannot reach the group host: {reason}");
                }
                set_error(Some(format!("group host {addr}: {reason}")));
                tokio::time::sleep(REDIAL_AFTER).await;
                // Keep the latest configuration; operations meanwhile are lost (retransmitted).
                while let Ok(request) = requests.try_recv() {
                    if let Request::Initialize(init) = request {
                        inits.insert(init.group, init);
                    }
                }
                continue;
            }
        };
        connections += 1;
        failed_dials = 0;
        if connections == 1 {
            debug!(%addr, "connected to the group host");
        } else {
            info!(%addr, groups = inits.len(), "connected to the group host again; initializing its members again");
        }
        let (mut reader, writer) = stream.into_split();
        let (tx, rx) = mpsc::channel(QUEUE_FRAMES);
        let writer = tokio::spawn(write_loop(writer, rx, None, io_timeout));
        for init in inits.values() {
            log_initialize(next_id, init);
            let _ = tx.send(frame_of(FRAME_KIND_CONTROL, &initialize_request(next_id, init))).await;
            next_id += 1;
        }
        let delivered = received.clone();
        let last_error = last_error.clone();
        let mut read = tokio::spawn(async move {
            let mut buf = BytesMut::with_capacity(64 * 1024);
            loop {
                match read_frame(&mut reader, &mut buf, FRAME_BYTES_MAX).await {
                    Ok(Some(frame)) if frame.kind == FRAME_KIND_GROUP => {
                        match decode_batch::<GroupMessage>(frame.payload) {
                            Ok(messages) => {
                                trace!(messages = messages.len(), "from the group host");
                                messages.into_iter().for_each(|m| drop(delivered.messages.send(m)));
                                delivered.wake();
                            }
                            Err(error) => return format!("malformed batch: {error}"),
                        }
                    }
                    Ok(Some(frame)) if frame.kind == FRAME_KIND_REPLY => {
                        match ControlReply::decode_exact(frame.payload) {
                            Ok(ControlReply::Error { id, message }) => {
                                warn!(id, "the group host refused Initialize: {message}");
                                *last_error.lock().unwrap_or_else(PoisonError::into_inner) = Some(message);
                            }
                            Ok(reply) => {
                                debug!(?reply, "the group host answered");
                                *last_error.lock().unwrap_or_else(PoisonError::into_inner) = None
                            }
                            Err(error) => return format!("malformed reply: {error}"),
                        }
                    }
                    Ok(Some(frame)) => return format!("unexpected frame kind {:#x}", frame.kind),
                    Ok(None) => return "closed".to_string(),
                    Err(error) => return error.to_string(),
                }
            }
        });
        let reason = loop {
            tokio::select! {
                request = requests.recv() => {
                    let frame = match request {
                        None => {
                            writer.abort();
                            read.abort();
                            return;
                        }
                        Some(Request::Initialize(init)) => {
                            log_initialize(next_id, &init);
                            let frame = frame_of(FRAME_KIND_CONTROL, &initialize_request(next_id, &init));
                            next_id += 1;
                            inits.insert(init.group, init);
                            frame
                        }
                        Some(Request::Frame(frame)) => frame,
                    };
                    if tx.send(frame).await.is_err() {
                        break "the connection's writer stopped".to_string();
                    }
                }
                reason = &mut read => break reason.unwrap_or_else(|error| error.to_string()),
            }
        };
        writer.abort();
        read.abort();
        set_error(Some(format!("connection to group host {addr} lost: {reason}")));
        if let Some(lost) = &give_up {
            warn!(%addr, "connection to the group host lost ({reason}); not dialling again");
            lost.store(true, std::sync::atomic::Ordering::Relaxed);
            received.wake();
            return;
        }
        info!(%addr, "connection to the group host lost ({reason}); dialling again");
        tokio::time::sleep(REDIAL_AFTER).await;
    }
}

/// The kernel path's datagrams of a member hosted on its node's group host, driven from a
/// synchronous event loop (the chain store's node, `--datapath kernel`): the operations of a
/// group this member heads go as datagrams to its host, whose XDP program applies them and
/// forwards them down the chain; the tail's program acknowledges straight to the port of the
/// coordinator's node, which reads them here. Retransmission stays the caller core's.
pub struct MemberDatagrams {
    socket: std::net::UdpSocket,
    host: SocketAddr,
    tenant: TenantId,
    /// Operations the caller found malformed (sent as no-ops), until acknowledged.
    rejected: std::collections::HashMap<(GroupId, u64), crate::op::OpError>,
    buf: Vec<u8>,
}

impl MemberDatagrams {
    /// Bind this node's datagram socket on `port` of every address (0: any port); `host` is
    /// the member's host's data address (its IP, its `data_port`).
    pub fn bind(port: u16, host: SocketAddr, tenant: TenantId) -> std::io::Result<MemberDatagrams> {
        let socket = std::net::UdpSocket::bind(("0.0.0.0", port))?;
        socket.set_nonblocking(true)?;
        Ok(MemberDatagrams {
            socket,
            host,
            tenant,
            rejected: std::collections::HashMap::new(),
            buf: Vec::with_capacity(2048),
        })
    }

    pub fn port(&self) -> u16 {
        self.socket.local_addr().map_or(0, |addr| addr.port())
    }

    /// Send an operation of a group this member heads (anything else is not for the wire).
    /// It must fit one datagram: the chain's coordinator splits larger ones
    /// (`Member::carries_datagrams`). A full socket buffer drops it: the caller retransmits.
    pub fn send(&mut self, message: &GroupMessage, region_bytes: u64, chain_len: usize) {
        let GroupMessage::Op { group, epoch, token, seq, operation, .. } = message else { return };
        let verdict = operation.validate(region_bytes, chain_len).err();
        if verdict.is_none() && crate::kernel::packet::split(operation).len() > 1 {
            debug_assert!(false, "an operation larger than a datagram reached the wire");
            warn!(group = group.0, seq, "an operation larger than a datagram was not sent");
            return;
        }
        if let Some(error) = verdict {
            self.rejected.insert((*group, *seq), error);
        }
        let address = crate::kernel::packet::GroupAddress {
            tenant: self.tenant,
            group: *group,
            epoch: *epoch,
            token: *token,
        };
        crate::kernel::packet::encode_op(&address, *seq, operation, verdict.is_some(), &mut self.buf);
        if let Err(error) = self.socket.send_to(&self.buf, self.host) {
            debug!(group = group.0, seq, "datagram to {} not sent: {error}", self.host);
        }
    }

    /// The acknowledgements received since the last call, as the caller core expects them,
    /// with result maps of the datagram's width (`kernel::layout::CHAIN_MAX` slots; the
    /// receiver cuts them to its chain's length).
    pub fn drain(&mut self, into: &mut Vec<GroupMessage>) {
        let mut datagram = [0u8; 2048];
        while let Ok(len) = self.socket.recv(&mut datagram) {
            let Some(ack) =
                crate::kernel::packet::decode_ack(&datagram[..len], crate::kernel::layout::CHAIN_MAX)
            else {
                continue;
            };
            if ack.tenant != self.tenant {
                continue;
            }
            let own = self.rejected.remove(&(ack.group, ack.seq));
            let outcome = match (ack.verdict, own) {
                (0, _) => Ok(ack.results),
                (_, Some(error)) => Err(error),
                // Rejected by the kernel although the sender found it valid: never expected.
                (_, None) => Err(crate::op::OpError::OutOfBounds { offset: 0, len: 0, region_bytes: 0 }),
            };
            into.push(GroupMessage::Ack { group: ack.group, epoch: ack.epoch, seq: ack.seq, outcome });
        }
    }
}
