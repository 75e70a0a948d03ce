//! The group host: one process per host that serves group operations on the registered
//! regions of every tenant (it plays HyperLoop's RDMA NIC), and the Naïve baseline's
//! dispatcher, which instead starts one replica per tenant replica (§6's Naïve-Event).
//!
//! Connections (see [`super::wire`]):
//!
//! * **caller** connections from a tenant's client, authenticated by the tenant's token:
//!   control requests (Initialize, one-sided Read, Ping), operations for the groups where this
//!   host is the head, and the acknowledgements / refusals this host sends back to the caller;
//! * **link** connections from the previous member of one group's chain, authenticated by the
//!   same token and bound to that group: operations travelling towards the tail. Links are
//!   one-way; the dialer only reads to notice the far end closing.
//!
//! Each group member is a [`ChainMember`] over a [`Region`] mapped from the host's region
//! directory. The task reading a member's single inbound connection (the caller's at the head,
//! the link elsewhere) applies every message of a received batch under the member's lock and
//! forwards what the core produced as one batch frame per destination (opportunistic
//! batching, as in `chorus-net`). Writers coalesce queued frames into one `write`.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use chorus_core::codec::{decode_batch, WireMessage};
use chorus_core::{NodeId, Time};
use chorus_region::{FlushBackend, Region, RegionMemory, RegionStore, TenantId, TurnFlush};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, Notify};
use tracing::{debug, error, info, warn};

use super::child::{spawn_child, ChildProcess};
use super::wire::{
    frame_of, group_frames, parse_token, read_frame, ControlReply, ControlRequest, Hello, Role,
    FRAME_BYTES_MAX, FRAME_KIND_CONTROL, FRAME_KIND_HELLO, FRAME_KIND_REFUSE, FRAME_KIND_REPLY,
    FRAME_KIND_WELCOME, HELLO_BYTES_MAX,
};
use crate::kernel::KernelDatapath;
use crate::member::ChainMember;
use crate::message::{GroupMessage, FRAME_KIND_GROUP};
use crate::op::{GroupConfig, GroupId, Refusal, Token, CHAIN_MEMBERS_MAX};
use crate::outbox::GroupOutbox;

/// Frames waiting for one connection's writer; when full, the producer waits (TCP pushes
/// back through the chain to the caller, whose window bounds what is in flight).
const WRITER_QUEUE_FRAMES: usize = 1024;
/// Coalesce queued frames into one write up to this many bytes.
const COALESCE_BYTES_MAX: usize = 1024 * 1024;
/// A link the next member does not accept yet is dialled again after this, doubling up to
/// [`LINK_RETRY_MAX`].
const LINK_RETRY_MIN: Duration = Duration::from_millis(5);
const LINK_RETRY_MAX: Duration = Duration::from_millis(200);

/// Who does the work of a group member.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HostMode {
    /// HyperLoop's arrangement: this host process applies and forwards the operations of every
    /// tenant's groups (the NIC's role); tenants' processes are never on the critical path.
    #[default]
    Chorus,
    /// The Naïve baseline: for every `Initialize` this host starts a replica dedicated to that
    /// tenant replica (a child process, or a thread with its own event loop when no replica
    /// command is configured) and redirects the caller to it; the replica receives, applies
    /// and forwards with its own CPU, woken by events (Naïve-Event).
    Naive,
    /// The Naïve baseline with busy-polling replicas (the paper's Naïve-Polling, §6.2): as
    /// [`HostMode::Naive`], but each replica's event loop never sleeps; it spins, checking its
    /// sockets with a zero timeout between spins, and so keeps a core busy while it lives.
    NaivePolling,
}

impl HostMode {
    /// Either Naïve variant: a replica process per tenant replica does the work.
    pub fn is_naive(self) -> bool {
        matches!(self, HostMode::Naive | HostMode::NaivePolling)
    }

    pub fn name(self) -> &'static str {
        match self {
            HostMode::Chorus => "chorus",
            HostMode::Naive => "naive",
            HostMode::NaivePolling => "naive-polling",
        }
    }
}

impl std::str::FromStr for HostMode {
    type Err = String;
    fn from_str(text: &str) -> Result<HostMode, String> {
        match text {
            "chorus" => Ok(HostMode::Chorus),
            "naive" | "naive-event" => Ok(HostMode::Naive),
            "naive-polling" => Ok(HostMode::NaivePolling),
            other => Err(format!("unknown mode {other:?}: expected chorus, naive or naive-polling")),
        }
    }
}

/// Where a host applies and forwards its members' operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Datapath {
    /// This process: a [`ChainMember`] per group over TCP links.
    #[default]
    User,
    /// The kernel's packet path (XDP, [`crate::kernel`]) for every group that fits it (IPv4,
    /// a region of at most 1 MiB, a chain of at most 8, a caller that asks for it); the others,
    /// and everything when the kernel path cannot load, fall back to the user path.
    Kernel,
}

impl Datapath {
    pub fn name(self) -> &'static str {
        match self {
            Datapath::User => "user",
            Datapath::Kernel => "kernel",
        }
    }
}

impl std::str::FromStr for Datapath {
    type Err = String;
    fn from_str(text: &str) -> Result<Datapath, String> {
        match text {
            "user" => Ok(Datapath::User),
            "kernel" => Ok(Datapath::Kernel),
            other => Err(format!("unknown data path {other:?}: expected kernel or user")),
        }
    }
}

/// What one tenant may hold on one host (issue 22: a tenant cannot exhaust a shared host).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantQuotas {
    /// Distinct regions registered.
    pub regions_max: usize,
    /// Their total size.
    pub region_bytes_max: u64,
    /// Naïve replicas running at once.
    pub naive_replicas_max: usize,
}

impl Default for TenantQuotas {
    fn default() -> Self {
        TenantQuotas { regions_max: 64, region_bytes_max: 1 << 30, naive_replicas_max: 128 }
    }
}

/// A tenant known to the host and its token (HyperLoop §7), 32 hexadecimal digits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantCredential {
    pub tenant: u32,
    pub token: String,
}

impl TenantCredential {
    pub fn new(tenant: TenantId, token: &Token) -> TenantCredential {
        TenantCredential { tenant: tenant.0, token: super::wire::format_token(token) }
    }
}

/// When a host's user-path members make their gFLUSHes durable (Redis' `appendfsync`, as the
/// chain store's nodes are told): a member's flushes wait for the end of the frame it is
/// applying and are done there, once for all of the frame's operations, before anything it
/// produced is forwarded or acknowledged (`chorus_region::TurnFlush`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HostSync {
    /// Every frame that asked for a flush, before its messages leave (HyperLoop's gFLUSH).
    #[default]
    Always,
    /// At most once a second (and at least once a second while something waits); messages do
    /// not wait for it.
    Everysec,
    /// Never but when the kernel writes back; the caller asked for no durability.
    No,
}

impl HostSync {
    pub fn name(self) -> &'static str {
        match self {
            HostSync::Always => "always",
            HostSync::Everysec => "everysec",
            HostSync::No => "no",
        }
    }

    fn policy(self) -> chorus_region::SyncPolicy {
        match self {
            HostSync::Always => chorus_region::SyncPolicy::EveryTurn,
            HostSync::Everysec => chorus_region::SyncPolicy::Every(EVERYSEC),
            HostSync::No => chorus_region::SyncPolicy::Never,
        }
    }
}

impl std::str::FromStr for HostSync {
    type Err = String;
    fn from_str(text: &str) -> Result<HostSync, String> {
        match text {
            "always" => Ok(HostSync::Always),
            "everysec" => Ok(HostSync::Everysec),
            "no" => Ok(HostSync::No),
            other => Err(format!("unknown sync policy {other:?}: expected always, everysec or no")),
        }
    }
}

/// The period of [`HostSync::Everysec`].
const EVERYSEC: Duration = Duration::from_secs(1);

/// Everything a group host needs. Serializable: Naïve replicas and benchmark hosts receive it
/// as JSON on stdin (see [`super::child_main`]).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HostConfig {
    /// Where callers and previous members connect (port 0: an ephemeral port).
    pub listen: SocketAddr,
    /// The regions' directory (`chorus_region::default_region_dir()`: /dev/shm by default).
    pub region_dir: PathBuf,
    #[serde(with = "flush_name")]
    pub flush: FlushBackend,
    /// When the user path's members flush what gFLUSH asked for.
    #[serde(default)]
    pub sync: HostSync,
    /// The tenants this host serves, with their tokens. Anyone else is refused at the handshake.
    pub tenants: Vec<TenantCredential>,
    #[serde(default)]
    pub mode: HostMode,
    /// Naïve mode: the command (program and arguments) that starts a replica process; it must
    /// end up in [`super::child_main`]. `None`: replicas are threads of this process, each with
    /// its own single-threaded event loop.
    #[serde(default)]
    pub replica_command: Option<Vec<String>>,
    /// Deadline of every connect, handshake, control request and socket write.
    #[serde(default = "default_io_timeout_ms")]
    pub io_timeout_ms: u64,
    /// Runtime worker threads when started through [`super::child_main`] (0: one per core,
    /// 1: a single-threaded event loop).
    #[serde(default)]
    pub worker_threads: usize,
    /// A Naïve replica exits once its group's caller has gone.
    #[serde(default)]
    pub exit_when_idle: bool,
    /// Busy-poll: the event loop spins instead of sleeping (Naïve-Polling replicas). Only
    /// honoured where the host builds its own runtime ([`super::child_main`], replica threads).
    #[serde(default)]
    pub busy_poll: bool,
    #[serde(default)]
    pub datapath: Datapath,
    /// Kernel path: the interfaces to attach to (empty: every one but `lo`).
    #[serde(default)]
    pub kernel_interfaces: Vec<String>,
    /// Kernel path: region slots of 1 MiB (0: 64).
    #[serde(default)]
    pub kernel_slots: u32,
    /// Kernel path: drop this share of arriving datagrams (tests: loss on the wire).
    #[serde(default)]
    pub kernel_loss_per_million: u32,
    /// Kernel path, inside a `kernel::netlab` namespace: a hexadecimal CPU mask for Receive
    /// Packet Steering on the interface facing the callers (`ckr`), which then takes the program
    /// in generic mode, so every hop of an operation runs in the NET_RX softirq of a CPU of the
    /// mask (raised by an IPI) rather than inside the caller's `sendto`. `None`: native XDP
    /// everywhere. docs/benchmarks.md ("The chain on the kernel data path") measures both.
    #[serde(default)]
    pub kernel_caller_rps_cpus: Option<String>,
    #[serde(default)]
    pub quotas: TenantQuotas,
    /// The other group hosts: a member's next hop must have one of their IP addresses (or a
    /// loopback address), so no tenant can make this host send to anyone else.
    #[serde(default)]
    pub peers: Vec<std::net::IpAddr>,
}

fn default_io_timeout_ms() -> u64 {
    5000
}

mod flush_name {
    use chorus_region::FlushBackend;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(backend: &FlushBackend, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(backend.name())
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<FlushBackend, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl HostConfig {
    pub fn new(
        listen: SocketAddr,
        region_dir: impl Into<PathBuf>,
        tenants: Vec<TenantCredential>,
    ) -> HostConfig {
        HostConfig {
            listen,
            region_dir: region_dir.into(),
            flush: FlushBackend::Msync,
            sync: HostSync::Always,
            tenants,
            mode: HostMode::Chorus,
            replica_command: None,
            io_timeout_ms: default_io_timeout_ms(),
            worker_threads: 0,
            exit_when_idle: false,
            busy_poll: false,
            datapath: Datapath::User,
            kernel_interfaces: Vec::new(),
            kernel_slots: 0,
            kernel_loss_per_million: 0,
            kernel_caller_rps_cpus: None,
            quotas: TenantQuotas::default(),
            peers: Vec::new(),
        }
    }

    pub fn io_timeout(&self) -> Duration {
        Duration::from_millis(self.io_timeout_ms.max(1))
    }
}

/// A running host. Dropping it (or [`HostHandle::shutdown`]) stops every task, closes every
/// connection and stops the Naïve replicas it started.
pub struct HostHandle {
    addr: SocketAddr,
    host: Arc<Host>,
}

impl HostHandle {
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
    /// The data path this host serves on (kernel only if it loaded).
    pub fn datapath(&self) -> Datapath {
        self.host.datapath()
    }
    /// The kernel path's counters (empty on the user path).
    pub fn kernel_stats(&self) -> Vec<(&'static str, u64)> {
        self.host.kernel.as_ref().map(|kernel| kernel.stats()).unwrap_or_default()
    }
    /// Groups with a member on this host.
    pub fn group_count(&self) -> usize {
        self.host.groups.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
    /// Resolves once a host started with `exit_when_idle` has served a group and has none left.
    pub async fn idle(&self) {
        loop {
            let notified = self.host.idle.notified();
            if self.host.is_idle() {
                return;
            }
            notified.await;
        }
    }
    /// Stop everything at once (also what a crash of the host looks like to its peers: every
    /// connection closes).
    pub fn shutdown(&self) {
        self.host.shutdown();
    }
}

impl Drop for HostHandle {
    fn drop(&mut self) {
        self.host.shutdown();
    }
}

/// Start a host on the current tokio runtime: bind, then serve in background tasks.
pub async fn start_host(config: HostConfig) -> anyhow::Result<HostHandle> {
    let mut tokens = HashMap::new();
    for credential in &config.tenants {
        let token = parse_token(&credential.token)
            .map_err(|e| anyhow::anyhow!("tenant {}: {e}", credential.tenant))?;
        tokens.insert(TenantId(credential.tenant), token);
    }
    if config.mode.is_naive() {
        if let Some(command) = &config.replica_command {
            anyhow::ensure!(!command.is_empty(), "the Naïve replica command is empty");
        }
    }
    let store = RegionStore::open(&config.region_dir, config.flush)?;
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen for group connections on {}: {e}", config.listen))?;
    let addr = listener.local_addr()?;
    let kernel = start_kernel(&config, addr.port());
    let host = Arc::new(Host {
        kernel,
        usage: Mutex::new(HashMap::new()),
        io_timeout: config.io_timeout(),
        config,
        store,
        tokens,
        groups: Mutex::new(HashMap::new()),
        tasks: Mutex::new(Vec::new()),
        replicas: Mutex::new(Vec::new()),
        idle: Notify::new(),
        served_a_group: AtomicBool::new(false),
        stopped: AtomicBool::new(false),
        origin: Instant::now(),
        next_conn: AtomicU64::new(1),
        addr,
    });
    let accepting = host.clone();
    host.spawn(async move { accepting.accept_loop(listener).await });
    if host.config.sync == HostSync::Everysec {
        let syncing = host.clone();
        host.spawn(async move { syncing.sync_every_second().await });
    }
    info!(%addr, mode = ?host.config.mode, backend = %host.config.flush, sync = host.config.sync.name(), datapath = host.datapath().name(), "group host listening");
    Ok(HostHandle { addr, host })
}

/// The kernel data path if asked for and available; otherwise the reason, loudly, and `None`
/// (every group is then served by the user-space path).
fn start_kernel(config: &HostConfig, port: u16) -> Option<KernelDatapath> {
    if config.datapath != Datapath::Kernel {
        return None;
    }
    if config.mode.is_naive() {
        warn!("the Naïve baseline has no kernel data path: its replicas do the work");
        return None;
    }
    let rps = config.kernel_caller_rps_cpus.as_deref();
    match KernelDatapath::start(port, &config.kernel_interfaces, config.kernel_slots, rps) {
        Ok(kernel) => {
            if config.kernel_loss_per_million > 0 {
                if let Err(error) = kernel.set_loss_per_million(config.kernel_loss_per_million) {
                    warn!("could not inject loss on the kernel path: {error}");
                }
            }
            info!(interfaces = ?kernel.interfaces(), port, "kernel data path attached (XDP)");
            Some(kernel)
        }
        Err(reason) => {
            warn!("kernel data path unavailable, serving on the user-space path: {reason}");
            eprintln!(
                "chorus group host: kernel data path unavailable ({reason}); using the user-space path"
            );
            None
        }
    }
}

/// Run a group host until the process is interrupted (Ctrl-C / SIGINT). Prints the address it
/// listens on. What `chorus group-host` calls.
pub async fn serve_host(config: HostConfig) -> anyhow::Result<()> {
    let handle = start_host(config).await?;
    println!("group host listening on {} (datapath {})", handle.local_addr(), handle.datapath().name());
    tokio::signal::ctrl_c().await?;
    handle.shutdown();
    Ok(())
}

struct GroupSlot {
    tenant: TenantId,
    group: GroupId,
    epoch: u64,
    position: usize,
    member: SlotMember,
    /// The connection of the caller that initialized the group: acknowledgements and refusals.
    caller: mpsc::Sender<Bytes>,
    caller_conn: u64,
    downstream: Option<mpsc::Sender<Bytes>>,
}

/// Who applies this member's operations.
enum SlotMember {
    User(Box<Mutex<ChainMember<TurnFlush<Region>>>>),
    /// The XDP program, on region slot `slot` of the kernel's regions map.
    Kernel {
        slot: u32,
    },
}

/// What a tenant holds on this host, against its [`TenantQuotas`].
#[derive(Default)]
struct TenantUsage {
    regions: HashMap<String, u64>,
}

/// The addresses of a caller's connection, as this host sees them.
#[derive(Clone, Copy)]
struct CallerAddrs {
    peer: SocketAddr,
    local: SocketAddr,
}

enum Replica {
    Thread { _stop: oneshot::Sender<()> },
    Process(Box<ChildProcess>),
}

impl Replica {
    fn is_running(&mut self) -> bool {
        match self {
            Replica::Thread { _stop } => !_stop.is_closed(),
            Replica::Process(child) => child.is_running(),
        }
    }
}

struct Host {
    kernel: Option<KernelDatapath>,
    usage: Mutex<HashMap<TenantId, TenantUsage>>,
    config: HostConfig,
    io_timeout: Duration,
    store: RegionStore,
    tokens: HashMap<TenantId, Token>,
    groups: Mutex<HashMap<(TenantId, GroupId), Arc<GroupSlot>>>,
    tasks: Mutex<Vec<tokio::task::AbortHandle>>,
    replicas: Mutex<Vec<(TenantId, Replica)>>,
    idle: Notify,
    served_a_group: AtomicBool,
    stopped: AtomicBool,
    origin: Instant,
    next_conn: AtomicU64,
    addr: SocketAddr,
}

impl Host {
    fn datapath(&self) -> Datapath {
        if self.kernel.is_some() {
            Datapath::Kernel
        } else {
            Datapath::User
        }
    }

    fn spawn<F>(self: &Arc<Self>, future: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        if self.stopped.load(Relaxed) {
            return;
        }
        let handle = tokio::spawn(future);
        let mut tasks = self.tasks.lock().unwrap_or_else(PoisonError::into_inner);
        if tasks.len() >= 256 {
            tasks.retain(|task| !task.is_finished());
        }
        tasks.push(handle.abort_handle());
    }

    fn shutdown(&self) {
        if self.stopped.swap(true, Relaxed) {
            return;
        }
        for task in self.tasks.lock().unwrap_or_else(PoisonError::into_inner).drain(..) {
            task.abort();
        }
        self.groups.lock().unwrap_or_else(PoisonError::into_inner).clear();
        self.replicas.lock().unwrap_or_else(PoisonError::into_inner).clear();
        self.idle.notify_waiters();
    }

    fn is_idle(&self) -> bool {
        self.stopped.load(Relaxed)
            || (self.config.exit_when_idle
                && self.served_a_group.load(Relaxed)
                && self.groups.lock().unwrap_or_else(PoisonError::into_inner).is_empty())
    }

    fn now(&self) -> Time {
        Time::from_nanos(self.origin.elapsed().as_nanos() as u64)
    }

    fn slot(&self, tenant: TenantId, group: GroupId) -> Option<Arc<GroupSlot>> {
        self.groups.lock().unwrap_or_else(PoisonError::into_inner).get(&(tenant, group)).cloned()
    }

    async fn accept_loop(self: Arc<Self>, listener: TcpListener) {
        loop {
            match listener.accept().await {
                Ok((stream, remote)) => {
                    let host = self.clone();
                    self.spawn(async move {
                        if let Err(reason) = host.serve_connection(stream).await {
                            debug!(%remote, "group connection closed: {reason}");
                        }
                    });
                }
                Err(error) => {
                    warn!("accepting group connections failed: {error}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    async fn serve_connection(self: Arc<Self>, stream: TcpStream) -> Result<(), String> {
        let _ = stream.set_nodelay(true);
        let addrs = CallerAddrs {
            peer: stream.peer_addr().map_err(|e| e.to_string())?,
            local: stream.local_addr().map_err(|e| e.to_string())?,
        };
        let (mut reader, mut writer) = stream.into_split();
        let mut buf = BytesMut::with_capacity(64 * 1024);
        let frame =
            match tokio::time::timeout(self.io_timeout, read_frame(&mut reader, &mut buf, HELLO_BYTES_MAX))
                .await
            {
                Err(_) => return Err("no handshake in time".into()),
                Ok(Err(error)) => return Err(format!("not a group client ({error})")),
                Ok(Ok(None)) => return Err("closed before the handshake".into()),
                Ok(Ok(Some(frame))) => frame,
            };
        if frame.kind != FRAME_KIND_HELLO {
            return Err(format!("first frame has kind {:#x}, not a handshake", frame.kind));
        }
        let hello = Hello::decode_exact(frame.payload).map_err(|e| format!("malformed handshake: {e}"))?;
        let verdict = self.check_hello(&hello);
        let answer = match &verdict {
            Ok(_) => frame_of_raw(FRAME_KIND_WELCOME, &[]),
            Err(reason) => frame_of_raw(FRAME_KIND_REFUSE, reason.as_bytes()),
        };
        let written = tokio::time::timeout(self.io_timeout, writer.write_all(&answer)).await;
        let slot = match verdict {
            Err(reason) => {
                warn!(tenant = %hello.tenant, "refused a group connection: {reason}");
                return Err(reason);
            }
            Ok(slot) => slot,
        };
        if !matches!(written, Ok(Ok(()))) {
            return Err("could not answer the handshake".into());
        }
        match (hello.role, slot) {
            (Role::Caller, _) => {
                let conn = self.next_conn.fetch_add(1, Relaxed);
                let (tx, rx) = mpsc::channel(WRITER_QUEUE_FRAMES);
                let timeout = self.io_timeout;
                self.spawn(async move {
                    let _ = write_loop(writer, rx, None, timeout).await;
                });
                let result = self.clone().serve_caller(conn, hello.tenant, addrs, reader, buf, tx).await;
                self.caller_closed(conn);
                result
            }
            (Role::Link { from_position, .. }, Some(slot)) => {
                // Keep the write half open: dropping it would tell the dialer the link closed.
                let _writer = writer;
                self.serve_link(slot, NodeId(from_position + 1), reader, buf).await
            }
            (Role::Link { .. }, None) => Err("link without a group".into()),
        }
    }

    /// Authenticate a handshake (§7): a known tenant, its token, and for a link a group of that
    /// tenant whose member here follows the dialer's position.
    fn check_hello(&self, hello: &Hello) -> Result<Option<Arc<GroupSlot>>, String> {
        let Some(token) = self.tokens.get(&hello.tenant) else {
            return Err(format!("{} is not served by this host", hello.tenant));
        };
        if !token.matches(&hello.token) {
            return Err(format!("wrong token for {}", hello.tenant));
        }
        match hello.role {
            Role::Caller => Ok(None),
            Role::Link { group, epoch, from_position } => {
                if self.config.mode.is_naive() {
                    return Err("a Naïve dispatcher takes no links: link to the replica".into());
                }
                let slot = self.slot(hello.tenant, group).ok_or_else(|| {
                    format!("group {} of {} is not initialized here", group.0, hello.tenant)
                })?;
                if slot.epoch != epoch || slot.position != from_position as usize + 1 {
                    return Err(format!(
                        "link from position {from_position} epoch {epoch} does not precede this member \
                         (position {}, epoch {})",
                        slot.position, slot.epoch
                    ));
                }
                Ok(Some(slot))
            }
        }
    }

    async fn serve_caller(
        self: Arc<Self>,
        conn: u64,
        tenant: TenantId,
        addrs: CallerAddrs,
        mut reader: OwnedReadHalf,
        mut buf: BytesMut,
        tx: mpsc::Sender<Bytes>,
    ) -> Result<(), String> {
        loop {
            let frame = match read_frame(&mut reader, &mut buf, FRAME_BYTES_MAX).await {
                Ok(Some(frame)) => frame,
                Ok(None) => return Ok(()),
                Err(error) => return Err(error.to_string()),
            };
            match frame.kind {
                FRAME_KIND_GROUP => {
                    let messages = decode_batch::<GroupMessage>(frame.payload)
                        .map_err(|e| format!("malformed batch: {e}"))?;
                    let mut runs: Vec<(GroupId, Vec<GroupMessage>)> = Vec::new();
                    for message in messages {
                        match runs.last_mut() {
                            Some((group, run)) if *group == message.group() => run.push(message),
                            _ => runs.push((message.group(), vec![message])),
                        }
                    }
                    for (group, run) in runs {
                        // Operations from a caller go to the head only.
                        match self.slot(tenant, group) {
                            Some(slot) if slot.position == 0 => self.deliver(&slot, NodeId(0), run).await,
                            _ => debug!(group = group.0, "operations for a group with no head here dropped"),
                        }
                    }
                }
                FRAME_KIND_CONTROL => {
                    let request = ControlRequest::decode_exact(frame.payload)
                        .map_err(|e| format!("malformed control request: {e}"))?;
                    let reply = self.control(conn, tenant, addrs, request, &tx).await;
                    if tx.send(frame_of(FRAME_KIND_REPLY, &reply)).await.is_err() {
                        return Ok(());
                    }
                }
                kind => return Err(format!("unexpected frame kind {kind:#x} from a caller")),
            }
        }
    }

    async fn serve_link(
        &self,
        slot: Arc<GroupSlot>,
        from: NodeId,
        mut reader: OwnedReadHalf,
        mut buf: BytesMut,
    ) -> Result<(), String> {
        loop {
            let frame = match read_frame(&mut reader, &mut buf, FRAME_BYTES_MAX).await {
                Ok(Some(frame)) => frame,
                Ok(None) => return Ok(()),
                Err(error) => return Err(error.to_string()),
            };
            if frame.kind != FRAME_KIND_GROUP {
                return Err(format!("unexpected frame kind {:#x} on a link", frame.kind));
            }
            let messages =
                decode_batch::<GroupMessage>(frame.payload).map_err(|e| format!("malformed batch: {e}"))?;
            self.deliver(&slot, from, messages).await;
        }
    }

    /// Apply a received batch under the member's lock, then send what it produced: one batch
    /// frame per destination.
    async fn deliver(&self, slot: &GroupSlot, from: NodeId, messages: Vec<GroupMessage>) {
        let SlotMember::User(member) = &slot.member else {
            debug!(group = slot.group.0, "operations over TCP for a kernel-path member dropped");
            return;
        };
        let now = self.now();
        let mut out = GroupOutbox::default();
        {
            let mut member = member.lock().unwrap_or_else(PoisonError::into_inner);
            for message in messages {
                member.on_message(now, from, message, &mut out);
            }
            // The frame's gFLUSHes, as one msync, before anything it produced leaves: one per
            // frame rather than one per operation (each is a disk write under the region file).
            if let Err(reason) = member.flush_turn_or_fail(&mut out) {
                error!(group = slot.group.0, "the member fails: {reason}");
            }
        }
        let next = NodeId(slot.position as u8 + 2);
        let (mut to_caller, mut to_next) = (Vec::new(), Vec::new());
        for (to, message) in out.messages {
            if to == NodeId(0) {
                to_caller.push(message);
            } else if to == next {
                to_next.push(message);
            }
        }
        for frame in group_frames(&to_caller) {
            let _ = slot.caller.send(frame).await;
        }
        if let Some(downstream) = &slot.downstream {
            for frame in group_frames(&to_next) {
                let _ = downstream.send(frame).await;
            }
        }
    }

    /// [`HostSync::Everysec`]: what waits for a flush is flushed within a second even when no
    /// frame arrives to do it.
    async fn sync_every_second(&self) {
        let mut ticks = tokio::time::interval(EVERYSEC);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let slots: Vec<Arc<GroupSlot>> =
                self.groups.lock().unwrap_or_else(PoisonError::into_inner).values().cloned().collect();
            for slot in slots {
                let SlotMember::User(member) = &slot.member else { continue };
                let mut out = GroupOutbox::default();
                {
                    let mut member = member.lock().unwrap_or_else(PoisonError::into_inner);
                    if let Err(reason) = member.flush_turn_or_fail(&mut out) {
                        error!(group = slot.group.0, "the member fails: {reason}");
                    }
                }
                let refusals: Vec<GroupMessage> = out.messages.into_iter().map(|(_, m)| m).collect();
                for frame in group_frames(&refusals) {
                    let _ = slot.caller.send(frame).await;
                }
            }
        }
    }

    fn caller_closed(&self, conn: u64) {
        let mut groups = self.groups.lock().unwrap_or_else(PoisonError::into_inner);
        groups.retain(|_, slot| {
            let keep = slot.caller_conn != conn;
            if let (false, SlotMember::Kernel { .. }, Some(kernel)) = (keep, &slot.member, &self.kernel) {
                kernel.remove(slot.tenant, slot.group);
            }
            keep
        });
        let empty = groups.is_empty();
        drop(groups);
        if empty {
            self.idle.notify_waiters();
        }
    }

    async fn control(
        self: &Arc<Self>,
        conn: u64,
        tenant: TenantId,
        addrs: CallerAddrs,
        request: ControlRequest,
        caller: &mpsc::Sender<Bytes>,
    ) -> ControlReply {
        let id = request.id();
        let result = match request {
            ControlRequest::Ping { id } => Ok(ControlReply::Pong { id }),
            ControlRequest::KernelRegion { id, region, region_bytes } => {
                self.kernel_region(tenant, &region, region_bytes).map(|(map_id, slot)| {
                    ControlReply::KernelRegion { id, map_id, slot, data_port: self.addr.port() }
                })
            }
            ControlRequest::Read { id, group, offset, len } => match self.slot(tenant, group) {
                None => Err(format!("group {} is not initialized here", group.0)),
                Some(_) if len > crate::op::OP_BYTES_MAX => {
                    Err(format!("a read is at most {} bytes", crate::op::OP_BYTES_MAX))
                }
                Some(slot) => match (&slot.member, &self.kernel) {
                    (SlotMember::User(member), _) => {
                        let member = member.lock().unwrap_or_else(PoisonError::into_inner);
                        member.memory().read_vec(offset, len).map_err(|e| e.to_string())
                    }
                    (SlotMember::Kernel { slot }, Some(kernel)) => kernel.read(*slot, offset, len),
                    (SlotMember::Kernel { .. }, None) => Err("no kernel data path".to_string()),
                }
                .map(|bytes| ControlReply::Data { id, bytes: Bytes::from(bytes) }),
            },
            ControlRequest::Initialize {
                id,
                group,
                epoch,
                start_seq,
                region,
                region_bytes,
                chain_len,
                position,
                next,
                caller_port,
            } => {
                let init = Init {
                    group,
                    epoch,
                    start_seq,
                    region,
                    region_bytes,
                    chain_len,
                    position,
                    next,
                    caller_port,
                };
                match self.config.mode {
                    HostMode::Chorus => self.initialize(conn, tenant, addrs, init, caller).await.map(
                        |(region_path, kernel)| match kernel {
                            false => ControlReply::Initialized { id, region_path },
                            true => ControlReply::InitializedKernel {
                                id,
                                region_path,
                                data_port: self.addr.port(),
                            },
                        },
                    ),
                    HostMode::Naive | HostMode::NaivePolling => self
                        .start_replica(tenant)
                        .await
                        .map(|addr| ControlReply::Redirect { id, addr: addr.to_string() }),
                }
            }
        };
        result.unwrap_or_else(|message| ControlReply::Error { id, message })
    }

    async fn initialize(
        self: &Arc<Self>,
        conn: u64,
        tenant: TenantId,
        addrs: CallerAddrs,
        init: Init,
        caller: &mpsc::Sender<Bytes>,
    ) -> Result<(String, bool), String> {
        let chain_len = init.chain_len as usize;
        let position = init.position as usize;
        if chain_len == 0 || chain_len > CHAIN_MEMBERS_MAX || position >= chain_len {
            return Err(format!("position {position} in a chain of {chain_len} is invalid"));
        }
        if init.next.is_some() != (position + 1 < chain_len) {
            return Err("every member but the tail needs the next member's address".into());
        }
        let token = *self.tokens.get(&tenant).ok_or("unknown tenant")?;
        let next: Option<SocketAddr> = match &init.next {
            None => None,
            Some(next) => Some(next.parse().map_err(|e| format!("next member address {next:?}: {e}"))?),
        };
        if let Some(next) = next {
            self.check_next_hop(next)?;
        }
        self.charge_region(tenant, &init.region, init.region_bytes)?;
        let kernel = self.kernel_for(&init, addrs, next);
        let config = GroupConfig {
            group: init.group,
            tenant,
            token,
            epoch: init.epoch,
            chain: (1..=chain_len).map(|i| NodeId(i as u8)).collect(),
            caller: NodeId(0),
            region_bytes: init.region_bytes,
            start_seq: init.start_seq,
        };
        config.check()?;
        let (member, region_path) = match kernel {
            Some(kernel) => {
                let slot = kernel.register_region(tenant, &init.region, init.region_bytes)?;
                (SlotMember::Kernel { slot }, format!("bpf:ck_regions[{slot}]"))
            }
            None => {
                let region = self
                    .store
                    .register(tenant, &init.region, init.region_bytes)
                    .map_err(|e| e.to_string())?;
                let path = region.path().map(|p| p.display().to_string()).unwrap_or_default();
                let region = TurnFlush::with_policy(region, self.config.sync.policy());
                let member = ChainMember::new(config, NodeId(position as u8 + 1), tenant, region)
                    .map_err(|e| e.to_string())?;
                (SlotMember::User(Box::new(Mutex::new(member))), path)
            }
        };
        // Links are dialled in the background, retrying until the next member holds the group
        // at this epoch: members may be initialized in any order (docs/decisions.md, "members
        // on group hosts"). The kernel path also needs the address its packets leave from
        // toward the next member: the route's source, found without sending anything.
        let (downstream, link_local) = match (next, kernel) {
            (None, _) => (None, None),
            (Some(addr), kernel) => {
                let local = match kernel {
                    Some(_) => Some(route_source(addr)?),
                    None => None,
                };
                (Some(self.link_lazily(addr, tenant, token, &init, caller)), local)
            }
        };
        if let (Some(kernel), SlotMember::Kernel { slot }) = (kernel, &member) {
            // The tail sends to the caller's UDP port from the address the caller reached it
            // on; the others to the next member from the address of their link to it.
            let port = self.addr.port();
            let (from, to) = match (next, link_local) {
                (Some(next), Some(local)) => (SocketAddr::new(local.ip(), port), next),
                _ => (
                    SocketAddr::new(addrs.local.ip(), port),
                    SocketAddr::new(addrs.peer.ip(), init.caller_port),
                ),
            };
            let (SocketAddr::V4(from), SocketAddr::V4(to)) = (from, to) else {
                return Err("the kernel data path is IPv4 only".into());
            };
            kernel.install(&crate::kernel::MemberInstall {
                tenant,
                group: init.group,
                epoch: init.epoch,
                token,
                start_seq: init.start_seq,
                slot: *slot,
                region_bytes: init.region_bytes,
                position,
                chain_len,
                from,
                to,
            })?;
        }
        let slot = Arc::new(GroupSlot {
            tenant,
            group: init.group,
            epoch: init.epoch,
            position,
            member,
            caller: caller.clone(),
            caller_conn: conn,
            downstream,
        });
        debug!(group = slot.group.0, %tenant, position, kernel = kernel.is_some(), "group member initialized");
        self.groups.lock().unwrap_or_else(PoisonError::into_inner).insert((tenant, init.group), slot);
        self.served_a_group.store(true, Relaxed);
        Ok((region_path, kernel.is_some()))
    }

    /// Register (or find again) the tenant's region on the kernel path: (map id, slot).
    fn kernel_region(&self, tenant: TenantId, name: &str, region_bytes: u64) -> Result<(u32, u32), String> {
        if self.config.mode != HostMode::Chorus {
            return Err("a Naïve host's replicas have no kernel data path".into());
        }
        let kernel = self.kernel.as_ref().ok_or(
            "this host serves on the user-space path (its log says why the kernel data path is unavailable)",
        )?;
        self.charge_region(tenant, name, region_bytes)?;
        let slot = kernel.register_region(tenant, name, region_bytes)?;
        Ok((kernel.regions_map_id()?, slot))
    }

    /// The kernel data path, if this group can use it: the caller asked (it gave a UDP port),
    /// the path is loaded, the group fits it, and every address is IPv4.
    fn kernel_for(
        &self,
        init: &Init,
        addrs: CallerAddrs,
        next: Option<SocketAddr>,
    ) -> Option<&KernelDatapath> {
        let kernel = self.kernel.as_ref()?;
        if init.caller_port == 0 {
            return None;
        }
        if let Err(reason) = KernelDatapath::fits(init.region_bytes, init.chain_len as usize) {
            info!(group = init.group.0, "serving on the user-space path: {reason}");
            return None;
        }
        let all_v4 = addrs.peer.is_ipv4() && addrs.local.is_ipv4() && next.is_none_or(|n| n.is_ipv4());
        all_v4.then_some(kernel)
    }

    /// Issue 22: a tenant names its chain, but this host only ever sends to other group hosts.
    fn check_next_hop(&self, next: SocketAddr) -> Result<(), String> {
        if next.ip().is_loopback() || self.config.peers.contains(&next.ip()) {
            return Ok(());
        }
        Err(format!("next member {next} is not one of this host's configured peers"))
    }

    /// Count the tenant's region against its quotas (a region registered before is free).
    fn charge_region(&self, tenant: TenantId, name: &str, region_bytes: u64) -> Result<(), String> {
        let quotas = self.config.quotas;
        let mut usage = self.usage.lock().unwrap_or_else(PoisonError::into_inner);
        let usage = usage.entry(tenant).or_default();
        if usage.regions.contains_key(name) {
            return Ok(());
        }
        if usage.regions.len() >= quotas.regions_max {
            return Err(format!("{tenant} already has {} regions here (quota)", usage.regions.len()));
        }
        let total: u64 = usage.regions.values().sum();
        if total.saturating_add(region_bytes) > quotas.region_bytes_max {
            return Err(format!(
                "{tenant} would hold {} region bytes here, over its quota of {}",
                total.saturating_add(region_bytes),
                quotas.region_bytes_max
            ));
        }
        usage.regions.insert(name.to_string(), region_bytes);
        Ok(())
    }

    /// The link to the next member, dialled in the background: until the next member's host
    /// accepts it (it holds the group at the next position and this epoch), operations wait in
    /// the link's queue, and TCP's back-pressure reaches the caller, whose window bounds them.
    /// Dialling stops once this member is replaced (a newer Initialize) or the host stops.
    fn link_lazily(
        self: &Arc<Self>,
        addr: SocketAddr,
        tenant: TenantId,
        token: Token,
        init: &Init,
        caller: &mpsc::Sender<Bytes>,
    ) -> mpsc::Sender<Bytes> {
        let position = init.position as usize;
        let hello = link_hello(init, tenant, token);
        let (tx, rx) = mpsc::channel(WRITER_QUEUE_FRAMES);
        let failed = caller.clone();
        let host = self.clone();
        let (group, epoch) = (init.group, init.epoch);
        self.spawn(async move {
            let mut backoff = LINK_RETRY_MIN;
            let stream = loop {
                match dial(addr, &hello, host.io_timeout).await {
                    Ok(stream) => break stream,
                    Err(reason) => debug!(group = group.0, epoch, "link to {addr} not up yet: {reason}"),
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(LINK_RETRY_MAX);
                let current = host.slot(tenant, group).is_some_and(|slot| slot.epoch == epoch);
                if !current || host.stopped.load(Relaxed) {
                    return;
                }
            };
            debug!(group = group.0, epoch, position, "link to the next member at {addr} up");
            let (probe, writer) = stream.into_split();
            if let Err(error) = write_loop(writer, rx, Some(probe), host.io_timeout).await {
                report_link_lost(&failed, group, epoch, position, error).await;
            }
        });
        tx
    }

    /// Naïve mode: start a replica dedicated to one tenant replica and return its address.
    async fn start_replica(self: &Arc<Self>, tenant: TenantId) -> Result<SocketAddr, String> {
        let token = self.tokens.get(&tenant).ok_or("unknown tenant")?;
        let mut config = HostConfig::new(
            SocketAddr::new(self.addr.ip(), 0),
            self.config.region_dir.clone(),
            vec![TenantCredential::new(tenant, token)],
        );
        config.flush = self.config.flush;
        config.io_timeout_ms = self.config.io_timeout_ms;
        config.worker_threads = 1;
        config.exit_when_idle = true;
        config.busy_poll = self.config.mode == HostMode::NaivePolling;
        config.peers = self.config.peers.clone();
        config.quotas = self.config.quotas;
        {
            let mut replicas = self.replicas.lock().unwrap_or_else(PoisonError::into_inner);
            replicas.retain_mut(|(_, replica)| replica.is_running());
            let running = replicas.iter().filter(|(owner, _)| *owner == tenant).count();
            if running >= self.config.quotas.naive_replicas_max {
                return Err(format!("{tenant} already has {running} Naïve replicas here (quota)"));
            }
        }
        let (addr, replica) = match &self.config.replica_command {
            Some(command) => {
                let (addr, child) =
                    spawn_child(command, &config, self.io_timeout).await.map_err(|e| format!("{e:#}"))?;
                (addr, Replica::Process(Box::new(child)))
            }
            None => {
                let (addr_tx, addr_rx) = oneshot::channel();
                let (stop_tx, stop_rx) = oneshot::channel::<()>();
                std::thread::Builder::new()
                    .name(format!("naive-{tenant}"))
                    .spawn(move || run_thread_replica(config, addr_tx, stop_rx))
                    .map_err(|e| format!("starting a replica thread: {e}"))?;
                let addr = tokio::time::timeout(self.io_timeout, addr_rx)
                    .await
                    .map_err(|_| "the replica did not start in time".to_string())?
                    .map_err(|_| "the replica thread ended".to_string())??;
                (addr, Replica::Thread { _stop: stop_tx })
            }
        };
        self.replicas.lock().unwrap_or_else(PoisonError::into_inner).push((tenant, replica));
        Ok(addr)
    }
}

/// The address this host's packets to `to` leave from: the source of the route to it (a
/// connected UDP socket sends nothing).
fn route_source(to: SocketAddr) -> Result<SocketAddr, String> {
    let any: SocketAddr = if to.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }.parse().expect("valid");
    let socket = std::net::UdpSocket::bind(any).map_err(|e| format!("route to {to}: {e}"))?;
    socket.connect(to).map_err(|e| format!("no route to the next member {to}: {e}"))?;
    socket.local_addr().map_err(|e| format!("route to {to}: {e}"))
}

struct Init {
    group: GroupId,
    epoch: u64,
    start_seq: u64,
    region: String,
    region_bytes: u64,
    chain_len: u8,
    position: u8,
    next: Option<String>,
    caller_port: u16,
}

/// A Naïve replica as a thread: its own single-threaded event loop, stopped when the
/// dispatcher drops the stop sender or the replica's caller leaves.
fn run_thread_replica(
    config: HostConfig,
    addr_tx: oneshot::Sender<Result<SocketAddr, String>>,
    stop_rx: oneshot::Receiver<()>,
) {
    let busy_poll = config.busy_poll;
    let runtime = match build_runtime(&config) {
        Ok(runtime) => runtime,
        Err(error) => {
            let _ = addr_tx.send(Err(format!("replica runtime: {error}")));
            return;
        }
    };
    runtime.block_on(async move {
        if busy_poll {
            spawn_spinner();
        }
        match start_host(config).await {
            Err(error) => {
                let _ = addr_tx.send(Err(format!("{error:#}")));
            }
            Ok(handle) => {
                let _ = addr_tx.send(Ok(handle.local_addr()));
                tokio::select! {
                    _ = stop_rx => {}
                    _ = handle.idle() => {}
                }
                handle.shutdown();
            }
        }
    });
}

/// The runtime a host builds for itself: `worker_threads` as configured (0: one per core, 1:
/// a single-threaded event loop); with `busy_poll`, one thread that checks for I/O on every
/// scheduler tick, for [`spawn_spinner`] to keep busy.
pub(crate) fn build_runtime(config: &HostConfig) -> io::Result<tokio::runtime::Runtime> {
    if config.busy_poll {
        return tokio::runtime::Builder::new_current_thread().event_interval(1).enable_all().build();
    }
    match config.worker_threads {
        1 => tokio::runtime::Builder::new_current_thread().enable_all().build(),
        0 => tokio::runtime::Builder::new_multi_thread().enable_all().build(),
        n => tokio::runtime::Builder::new_multi_thread().worker_threads(n).enable_all().build(),
    }
}

/// Busy-polling (Naïve-Polling): a task that is always ready, so the current-thread scheduler
/// never parks in epoll with a timeout; between its polls the I/O driver is checked with a zero
/// timeout. The replica's core stays at 100% whether or not operations arrive, as a polling
/// RDMA receiver does. Ends with the runtime.
pub(crate) fn spawn_spinner() {
    tokio::spawn(async {
        loop {
            tokio::task::yield_now().await;
        }
    });
}

/// The handshake of the link from `init`'s member to the next one.
fn link_hello(init: &Init, tenant: TenantId, token: Token) -> Hello {
    Hello {
        role: Role::Link { group: init.group, epoch: init.epoch, from_position: init.position },
        tenant,
        token,
    }
}

/// The link from the member at `position` to the next one broke (the next member is gone or
/// stuck): the chain is broken. Tell the caller now rather than letting its retransmissions
/// run out.
async fn report_link_lost(
    caller: &mpsc::Sender<Bytes>,
    group: GroupId,
    epoch: u64,
    position: usize,
    error: io::Error,
) {
    let refusal = Refusal::MemberFailed {
        position: position as u8 + 1,
        reason: format!("link from member {position} lost: {error}"),
    };
    let message = GroupMessage::Refused { group, epoch, seq: 0, refusal };
    for frame in group_frames(&[message]) {
        let _ = caller.send(frame).await;
    }
}

fn frame_of_raw(kind: u8, payload: &[u8]) -> Bytes {
    let mut frame = BytesMut::new();
    chorus_core::codec::encode_frame(kind, payload, &mut frame);
    frame.freeze()
}

/// Connect and handshake, within `timeout`.
pub(crate) async fn dial(addr: SocketAddr, hello: &Hello, timeout: Duration) -> Result<TcpStream, String> {
    let attempt = async {
        let mut stream = TcpStream::connect(addr).await.map_err(|e| format!("connecting to {addr}: {e}"))?;
        let _ = stream.set_nodelay(true);
        stream
            .write_all(&frame_of(FRAME_KIND_HELLO, hello))
            .await
            .map_err(|e| format!("handshake with {addr}: {e}"))?;
        let mut buf = BytesMut::new();
        let frame = read_frame(&mut stream, &mut buf, HELLO_BYTES_MAX)
            .await
            .map_err(|e| format!("handshake with {addr}: {e}"))?
            .ok_or_else(|| format!("{addr} closed the connection during the handshake"))?;
        match frame.kind {
            FRAME_KIND_WELCOME => Ok(stream),
            FRAME_KIND_REFUSE => {
                Err(format!("{addr} refused the connection: {}", String::from_utf8_lossy(&frame.payload)))
            }
            kind => Err(format!("{addr} answered the handshake with frame kind {kind:#x}")),
        }
    };
    tokio::time::timeout(timeout, attempt)
        .await
        .map_err(|_| format!("no handshake with {addr} within {timeout:?}"))?
}

/// Write queued frames, coalescing what is already queued into one write, until every sender
/// is gone (`Ok`) or the connection fails (`Err`). With `probe`, also notice the far end
/// closing a one-way link. Every write has a deadline.
pub(crate) async fn write_loop(
    mut writer: OwnedWriteHalf,
    mut rx: mpsc::Receiver<Bytes>,
    mut probe: Option<OwnedReadHalf>,
    timeout: Duration,
) -> io::Result<()> {
    let mut coalesced = BytesMut::new();
    let mut scratch = [0u8; 64];
    loop {
        let first = match probe.as_mut() {
            Some(reader) => tokio::select! {
                item = rx.recv() => item,
                read = reader.read(&mut scratch) => {
                    return Err(match read {
                        Ok(0) => io::Error::new(io::ErrorKind::UnexpectedEof, "the next member closed the link"),
                        Ok(_) => io::Error::new(io::ErrorKind::InvalidData, "data on a one-way link"),
                        Err(error) => error,
                    });
                }
            },
            None => rx.recv().await,
        };
        let Some(first) = first else { return Ok(()) };
        let write = match rx.try_recv() {
            Err(_) => tokio::time::timeout(timeout, writer.write_all(&first)).await,
            Ok(second) => {
                coalesced.clear();
                coalesced.extend_from_slice(&first);
                coalesced.extend_from_slice(&second);
                while coalesced.len() < COALESCE_BYTES_MAX {
                    let Ok(frame) = rx.try_recv() else { break };
                    coalesced.extend_from_slice(&frame);
                }
                tokio::time::timeout(timeout, writer.write_all(&coalesced)).await
            }
        };
        match write {
            Ok(Ok(())) => {}
            Ok(Err(error)) => return Err(error),
            Err(_) => return Err(io::Error::new(io::ErrorKind::TimedOut, "write deadline passed")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 22: a tenant cannot point a member at an address that is not a group host.
    #[test]
    fn initialize_refuses_a_next_hop_that_is_not_a_configured_peer() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let token = Token([3; 16]);
            let dir = std::env::temp_dir().join(format!("chorus-next-hop-{}", std::process::id()));
            let config = HostConfig::new(
                "127.0.0.1:0".parse().unwrap(),
                &dir,
                vec![TenantCredential::new(TenantId(5), &token)],
            );
            let host = start_host(config).await.unwrap();
            let hello = Hello { role: Role::Caller, tenant: TenantId(5), token };
            let mut stream = dial(host.local_addr(), &hello, Duration::from_secs(3)).await.unwrap();
            let request = ControlRequest::Initialize {
                id: 1,
                group: GroupId(1),
                epoch: 1,
                start_seq: 1,
                region: "r".into(),
                region_bytes: 64,
                chain_len: 2,
                position: 0,
                // Never dialled: refused before any connection is attempted.
                next: Some("192.0.2.1:7600".into()),
                caller_port: 0,
            };
            stream.write_all(&frame_of(FRAME_KIND_CONTROL, &request)).await.unwrap();
            let mut buf = BytesMut::new();
            let frame = read_frame(&mut stream, &mut buf, FRAME_BYTES_MAX).await.unwrap().unwrap();
            let reply = ControlReply::decode_exact(frame.payload).unwrap();
            let ControlReply::Error { message, .. } = reply else { panic!("accepted: {reply:?}") };
            assert!(message.contains("not one of this host's configured peers"), "{message}");
            assert_eq!(host.group_count(), 0);
            let _ = std::fs::remove_dir_all(&dir);
        });
    }

    #[test]
    fn host_config_round_trips_through_json() {
        let mut config = HostConfig::new(
            "127.0.0.1:0".parse().unwrap(),
            "/tmp/x",
            vec![TenantCredential { tenant: 1, token: "00".repeat(16) }],
        );
        config.flush = FlushBackend::None;
        config.mode = HostMode::Naive;
        config.sync = HostSync::Everysec;
        let json = serde_json::to_string(&config).unwrap();
        let back: HostConfig = serde_json::from_str(&json).unwrap();
        assert_eq!(back.flush, FlushBackend::None);
        assert_eq!(back.mode, HostMode::Naive);
        assert_eq!(back.sync, HostSync::Everysec);
        assert!(json.contains("\"flush\":\"none\""));
        // A configuration written before `sync` existed flushes every frame, as before.
        let old = json.replace(",\"sync\":\"everysec\"", "");
        assert_ne!(old, json);
        assert_eq!(serde_json::from_str::<HostConfig>(&old).unwrap().sync, HostSync::Always);
    }

    /// `chorus up` passes its nodes' appendfsync as the hosts' `--sync`.
    #[test]
    fn host_sync_reads_every_appendfsync_name() {
        for sync in [HostSync::Always, HostSync::Everysec, HostSync::No] {
            assert_eq!(sync.name().parse::<HostSync>(), Ok(sync));
        }
        assert_eq!(HostSync::Always.policy(), chorus_region::SyncPolicy::EveryTurn);
        assert_eq!(HostSync::No.policy(), chorus_region::SyncPolicy::Never);
        assert!("sometimes".parse::<HostSync>().is_err());
    }
}
