//! The Chorus node: a RESP2/RESP3 front end (readable like mini-redis) over one event loop
//! that drives a sans-I/O protocol core and the peer transport.
//!
//! * [`resp`]: parsing commands, encoding replies.
//! * [`command`]: typed requests and their mapping onto `chorus_core::Command`.
//! * [`hash`]: Redis hashes stored as one value, updated with compare-and-swap.
//! * [`listener`]: accepting clients (admission, socket options), generic over the stream.
//! * [`connection`]: one client connection, pipelined, replies in request order.
//! * [`engine`]: the event loop that owns the protocol core.
//! * [`cluster`]: hash slots over replica groups, behind the Redis Cluster protocol.
//! * [`pubsub`]: PUBLISH / SUBSCRIBE, delivered to subscribers on every node.
//! * [`config`]: the node's TOML configuration.
//! * [`metrics`]: counters and the Prometheus endpoint.
//! * [`memory`]: `used_memory` (the allocator's figure) for INFO and `maxmemory`.
//! * [`files`]: private data directories, unpredictable temporary ones.

pub mod admin;
pub mod chain_host;
pub mod clients;
pub mod cluster;
pub mod command;
pub mod config;
pub mod connection;
pub mod engine;
pub mod files;
pub mod listener;
pub mod live;
pub mod loops;
pub mod memory;
pub mod metrics;
pub mod monitor;
pub mod pause;
pub mod persistence;
pub mod pubsub;
pub mod reactor;
pub mod resp;

use std::future::Future;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use anyhow::Context as _;
use chorus_core::codec::WireMessage;
use chorus_core::NodeSet;
use chorus_core::Time;
use chorus_craq::{Craq, CraqConfig};
use chorus_hermes::{Hermes, HermesConfig};
use chorus_membership::{Membership, MembershipConfig, MembershipLog, WithMembership, MEMBERSHIP_LOG};
use chorus_net::{NetConfig, NetStats};
use chorus_raftlog::disk::{DiskOptions, DurableRaftLog};
use chorus_raftlog::shard::ShardCore;
use chorus_raftlog::RaftLogConfig;
use chorus_storage::FileStorage;
use chorus_zab::{Zab, ZabConfig};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::config::{MembershipTiming, NodeConfig, Protocol};
use crate::connection::{Settings, Shared};
use crate::engine::{EngineRequest, ServedReplica};
use crate::metrics::Metrics;

/// The Redis version the server claims in INFO and HELLO: clients enable features by it.
pub const REDIS_COMPATIBLE_VERSION: &str = "7.2.0";

/// Run one node until `shutdown` completes or a client sends SHUTDOWN, then stop gracefully
/// (docs/operations.md, "Stopping a node"). Binding errors are returned before serving.
pub async fn run_node(mut config: NodeConfig, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    // Membership state and the chain's region need a directory; without a configured one
    // they get a fresh private temporary one, removed when the node stops.
    let temporary_dir = match &config.data_dir {
        Some(dir) => {
            files::create_private_dir(dir).context("config field `data_dir`")?;
            None
        }
        None if config.membership.is_some() || config.protocol == Protocol::Chain => {
            let dir = files::create_temp_dir(&format!("chorus-node-{}", config.node_id.0))?;
            warn!(dir = %dir.display(), "no data_dir: node state goes to a temporary directory, removed at exit");
            Some(dir)
        }
        None => None,
    };
    let result = serve_node(&mut config, temporary_dir.clone(), shutdown).await;
    if let Some(dir) = temporary_dir {
        let _ = std::fs::remove_dir_all(dir);
    }
    result
}

async fn serve_node(
    config: &mut NodeConfig,
    temporary_dir: Option<std::path::PathBuf>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    config.maxclients = descriptor_budget(config.maxclients, config.replicas.len().saturating_sub(1))?;
    let state_dir = config.data_dir.clone().or(temporary_dir);
    let config = &*config;
    let me = config.node_id;
    let replicas: NodeSet = config.replicas.keys().copied().collect();
    let peers =
        config.replicas.iter().filter(|(node, _)| **node != me).map(|(node, addr)| (*node, *addr)).collect();
    // Nodes must agree on the protocol and on whether membership messages travel with it.
    let wire_protocol = match config.membership {
        Some(_) => format!("{}+membership", config.protocol.name()),
        // Shards tag their messages, and a key's shard depends on their number.
        None if config.protocol == Protocol::Raftlog && config.raftlog.shards > 1 => {
            format!("raftlog/shards={}", config.raftlog.shards)
        }
        None => config.protocol.name().to_string(),
    };
    // Loops tag their messages, and a key's loop depends on their number.
    let wire_protocol = match config.event_loops {
        1 => wire_protocol,
        loops => format!("{wire_protocol}/loops={loops}"),
    };
    let mut net = NetConfig::new(
        me,
        config.cluster_id.clone(),
        config.cluster_token.clone(),
        wire_protocol,
        config.peer_addr,
        peers,
    );
    net.peer_queue_bytes_max = config.peer_queue_bytes_max;
    // For measuring what the priority lane buys (docs/benchmarks.md); on by default.
    if std::env::var_os("CHORUS_PRIORITY_LANE").is_some_and(|value| value == "off") {
        warn!("CHORUS_PRIORITY_LANE=off: membership messages share the data connections");
        net.priority_lane = false;
    }
    net.frame_payload_bytes_max = frame_payload_bytes_max(config);
    net.link_timeout = std::time::Duration::from_millis(config.peer_link_timeout_ms);
    if let Some(tls) = config.tls.as_ref().filter(|tls| tls.cluster) {
        net.tls = Some(chorus_net::tls::PeerTls::load(&tls.files).context("tls_cluster")?);
    }
    // The metadata service's links are peer links too: the same TLS when it is on.
    let net_tls = net.tls.clone();
    // Published messages travel over the group's links, and with shards over the metadata
    // service's, which reach every node.
    let pubsub = pubsub::Hub::new(config.cluster.is_some());
    net.pubsub = Some(pubsub.group_port());

    let clients = TcpListener::bind(config.client_addr)
        .await
        .with_context(|| format!("cannot listen for clients on {}", config.client_addr))?;
    let tls_clients = match config.tls.as_ref().and_then(|tls| Some((tls, tls.client_port?))) {
        None => None,
        Some((tls, port)) => {
            let acceptor =
                chorus_net::tls::client_acceptor(&tls.files, tls.auth_clients).context("tls_port")?;
            let addr = std::net::SocketAddr::new(config.client_addr.ip(), port);
            let listener = TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen for TLS clients on {addr}"))?;
            info!(%addr, auth_clients = tls.auth_clients, "serving TLS clients");
            Some((listener, acceptor))
        }
    };
    let metrics_listener = match config.metrics_addr {
        Some(addr) => Some(
            TcpListener::bind(addr).await.with_context(|| format!("cannot listen for metrics on {addr}"))?,
        ),
        None => None,
    };

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    // Several event loops (raftlog shards, `event_loops`): each key's requests go to its own.
    let shards =
        if config.protocol == Protocol::Raftlog { config.raftlog.shards } else { config.event_loops };
    let (engine, requests) = engine::channels(shards);
    if let Some(data_dir) = &config.data_dir {
        check_loop_layout(data_dir, LOOPS_FILE, "event_loops", config.event_loops)?;
    }
    let mut loops = (0..config.event_loops)
        .map(|index| LoopSetup::open(config, state_dir.as_deref(), index))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let joining = loops[0].joining;
    let chain_start = loops.first_mut().and_then(|setup| setup.chain.take());
    let engine_thread = config.worker_threads > 1;
    let (stopped_tx, stopped) = tokio::sync::oneshot::channel();
    let request_deadline = std::time::Duration::from_millis(config.clients.request_deadline_ms);
    let reactor_door = Arc::new(std::sync::OnceLock::new());
    let start = Start {
        reactor: reactor::applies(config).then(|| reactor_door.clone()),
        net,
        requests,
        inline: engine.inline_slots(),
        wake: engine.wake_slots(),
        shutdown: shutdown_rx,
        engine_thread,
        stopped: stopped_tx,
        request_deadline,
    };
    let net_stats = match config.protocol {
        Protocol::Hermes => {
            start
                .spawn_loops(loops, |restored, joining| open_hermes(config, replicas, restored, joining))
                .await?
        }
        Protocol::Craq => {
            start
                .spawn_loops(loops, |restored, joining| open_craq(config, replicas, restored, joining))
                .await?
        }
        Protocol::Zab(read_mode) => {
            // A node back from its own files takes only what it missed, if still held.
            let persisting = loops[0].persistence.is_some();
            let open = |restored: Option<persistence::Restored>, joining| {
                let mut zab_config = ZabConfig::new(me, replicas);
                zab_config.read_mode = read_mode;
                // A joining node starts empty: it takes a snapshot and the history from the
                // leader (ZooKeeper's SNAP) and serves nobody until then.
                zab_config.recovering = joining;
                if joining {
                    info!("joining the cluster: will synchronise from the ZAB leader");
                }
                if persisting {
                    zab_config.history_retained_entries = ZAB_HISTORY_RETAINED_ENTRIES;
                }
                let mut zab = Zab::new(zab_config);
                if persisting {
                    zab.enable_persistence();
                }
                if let Some(restored) = restored.filter(|restored| restored.trusted) {
                    // Only through a join (a new epoch): see `LoopSetup::open`.
                    anyhow::ensure!(
                        joining,
                        "ZAB restarts from its append-only file only with the membership service \
                         (membership = true): its recovery needs a new epoch"
                    );
                    let records = restored.records.len();
                    let keys = persistence::zab::restore(&mut zab, restored.records, seq_floor())
                        .context("cannot load ZAB's append-only file")?;
                    info!(
                        records,
                        keys,
                        last_zxid = ?zab.last_zxid(),
                        applied_index = zab.applied_index(),
                        "history restored from the append-only file; rejoining to catch up on what was missed"
                    );
                }
                Ok(zab)
            };
            start.spawn_loops(loops, open).await?
        }
        Protocol::Raftlog if shards == 1 => {
            start.spawn_loops(loops, |_, _| open_raftlog(config, replicas)).await?
        }
        Protocol::Raftlog => {
            let cores = open_raftlog_shards(config, replicas)?
                .into_iter()
                .map(|core| (core, engine::NodeDisk::none()));
            start.run_loops(cores.collect(), "chorus-shard").await?
        }
        Protocol::Chain => {
            let chain_start = chain_start.expect("the chain store always has a directory");
            let chain_config = chain_start.config(config, replicas, joining);
            match chain_start.region {
                ChainRegion::Local(region) => {
                    let mut chain = Some(open_chain(config, chain_config, region)?);
                    start
                        .spawn_loops(loops, |_, _| chain.take().context("the chain store has one event loop"))
                        .await?
                }
                ChainRegion::Hosted(region) => {
                    let mut chain = Some(open_hosted_chain(config, chain_config, region).await?);
                    start
                        .spawn_loops(loops, |_, _| chain.take().context("the chain store has one event loop"))
                        .await?
                }
            }
        }
    };

    let metrics = Arc::new(Metrics::default());
    if let Some(listener) = metrics_listener {
        info!(addr = %listener.local_addr()?, "serving Prometheus metrics");
        tokio::spawn(metrics::serve(listener, metrics.clone(), net_stats.clone(), engine.clone()));
    }
    // A bulk must fit both Redis' protocol limit and the store's value limit.
    let bulk_bytes_max = config.clients.proto_max_bulk_len.min(config.value_bytes_max);
    let limits = resp::Limits { bulk_bytes_max, ..resp::Limits::default() };
    let (closing_tx, closing) = watch::channel(false);
    let stop_requested = Arc::new(tokio::sync::Notify::new());
    let cluster = match &config.cluster {
        None => None,
        Some(settings) => {
            let map = cluster::SlotMap::new(settings, config.client_addr);
            let dir = state_dir.as_deref().expect("a node always has a state directory");
            let tls = net_tls.clone();
            let links = cluster::service::PubSubLinks {
                port: pubsub.cluster_port(),
                frame_payload_bytes_max: frame_payload_bytes_max(config),
            };
            Some(cluster::service::start(map, &config.cluster_token, tls, dir, links).await?)
        }
    };
    let shared = Arc::new(Shared {
        engine,
        metrics,
        net: net_stats,
        settings: Settings {
            node_id: me.0,
            protocol: config.protocol.name(),
            client_addr: config.client_addr,
            peer_addr: config.peer_addr,
            limits,
            clients: config.clients,
        },
        live: live::Live::new(
            config.requirepass.as_deref(),
            config.protected_mode && !config.client_addr.ip().is_loopback(),
            config.maxclients,
            clients_fitting(config.replicas.len().saturating_sub(1)).max(config.maxclients as u64),
            &config.clients,
        )
        .with_pubsub_limits(pubsub.limits.clone()),
        monitor: monitor::Monitor::default(),
        pause: pause::Pause::default(),
        next_client_id: AtomicU64::new(0),
        clients: clients::Registry::default(),
        closing,
        shutdown: stop_requested.clone(),
        cluster,
        pubsub,
        reactor: reactor_door,
    });
    if let Some(cluster) = &shared.cluster {
        tokio::spawn(cluster::migrate::run_movers(
            cluster.clone(),
            shared.engine.clone(),
            config.requirepass.clone(),
        ));
    }
    let sampled = shared.clone();
    tokio::spawn(memory::sample(shared.metrics.clone(), move || {
        sampled.live.maxmemory_bytes.load(std::sync::atomic::Ordering::Relaxed) > 0
    }));
    info!(
        node = %me,
        protocol = config.protocol.name(),
        client_addr = %config.client_addr,
        peer_addr = %config.peer_addr,
        replicas = config.replicas.len(),
        cluster = %config.cluster_id,
        auth = config.requirepass.is_some(),
        "chorus node serving"
    );
    let serve_tls = async {
        match tls_clients {
            Some((tls_listener, acceptor)) => {
                let upgrade = move |stream| tls_upgrade(acceptor.clone(), stream);
                listener::accept_loop(tls_listener, shared.clone(), upgrade, false).await
            }
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        () = listener::accept_loop(clients, shared.clone(), listener::plain, true) => {}
        () = serve_tls => {}
        () = shutdown => info!(node = %me, "shutting down (signal)"),
        () = stop_requested.notified() => info!(node = %me, "shutting down (SHUTDOWN)"),
    }
    // No new clients from here on (the listener is gone). The event loop leaves the view,
    // answers what is in flight and makes its state durable; then the connections close.
    let _ = shutdown_tx.send(true);
    let _ = stopped.await;
    let _ = closing_tx.send(true);
    let drained = tokio::time::timeout(CONNECTIONS_DRAIN_TIMEOUT, async {
        while shared.metrics.connections_current.load(std::sync::atomic::Ordering::Relaxed) > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    });
    let _ = drained.await;
    info!(node = %me, "stopped");
    Ok(())
}

/// How long a stopping node waits for its connections to write their last replies.
const CONNECTIONS_DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// Descriptors kept for everything but clients: peer links (a dialled and an accepted
/// connection per peer, and their reconnections), listeners, data files. A flood of clients
/// then never takes the descriptors a peer link needs to reconnect.
fn reserved_descriptors(peers: usize) -> u64 {
    64 + 4 * peers as u64
}

/// How many clients the open-file limit leaves room for now (CONFIG SET maxclients' bound).
#[allow(clippy::unnecessary_cast)]
fn clients_fitting(peers: usize) -> u64 {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into the struct we pass and has no other effect.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return 0;
    }
    (limit.rlim_cur as u64).saturating_sub(reserved_descriptors(peers))
}

/// Check `maxclients` against the open-file limit as Redis does: raise the soft limit to fit
/// `maxclients` plus the reserve if the hard limit allows; otherwise lower `maxclients` to
/// what fits, and say so. Refuses to start when not even one client fits.
// `rlim_t` is `u64` on Linux but not everywhere, hence the casts.
#[allow(clippy::unnecessary_cast)]
fn descriptor_budget(maxclients: usize, peers: usize) -> anyhow::Result<usize> {
    let reserved = reserved_descriptors(peers);
    let wanted = maxclients as u64 + reserved;
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into the struct we pass and has no other effect.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        warn!("cannot read the open-file limit; maxclients {maxclients} is not checked against it");
        return Ok(maxclients);
    }
    let soft = limit.rlim_cur as u64;
    let hard = limit.rlim_max as u64;
    let mut usable = soft;
    if soft < wanted {
        let raised = libc::rlimit { rlim_cur: wanted.min(hard) as libc::rlim_t, rlim_max: limit.rlim_max };
        // SAFETY: setrlimit reads the struct we pass; raising the soft limit up to the hard
        // one needs no privilege.
        if raised.rlim_cur as u64 > soft && unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            usable = raised.rlim_cur as u64;
            info!(
                "raised the open-file limit from {soft} to {usable} (maxclients {maxclients} + {reserved} \
                 reserved for peer links and files)"
            );
        }
    }
    if usable >= wanted {
        return Ok(maxclients);
    }
    let fitting = usable.saturating_sub(reserved);
    if fitting == 0 {
        anyhow::bail!(
            "the open-file limit is {usable} (hard limit {hard}): not even one client fits next to the \
             {reserved} descriptors reserved for peer links and files; raise it (ulimit -n)"
        );
    }
    warn!(
        "maxclients lowered from {maxclients} to {fitting}: the open-file limit is {usable} (hard limit \
         {hard}) and {reserved} descriptors are reserved for peer links and files; raise it (ulimit -n)"
    );
    Ok(fitting as usize)
}

/// A TLS client's handshake (`tls_port`): [`listener::accept_loop`]'s `upgrade`, bounded in
/// time so a silent client cannot hold a slot. Failures are logged with rustls' reason.
async fn tls_upgrade(
    tls: chorus_net::tls::TlsAcceptor,
    stream: tokio::net::TcpStream,
) -> std::io::Result<chorus_net::Stream> {
    let peer = stream.peer_addr().ok();
    let result = match tokio::time::timeout(std::time::Duration::from_secs(10), tls.accept(stream)).await {
        Ok(result) => result,
        Err(_) => Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "handshake timed out")),
    };
    match result {
        Ok(stream) => Ok(chorus_net::Stream::Tls(Box::new(stream.into()))),
        Err(error) => {
            info!(?peer, "TLS client handshake failed: {error}");
            Err(error)
        }
    }
}

/// What one event loop's core starts from: its append-only file and what it held, its
/// membership service, and whether it joins. Loop 0 keeps its state in the node's data
/// directory, loop `i > 0` in `<data_dir>/loop-<i>`, so one loop is laid out as before.
struct LoopSetup {
    persistence: Option<persistence::Persistence>,
    restored: Option<persistence::Restored>,
    membership: Option<Managed>,
    joining: bool,
    /// The chain store's region, opened and checked before the membership decides whether
    /// the node comes back as the member it was.
    chain: Option<ChainStart>,
}

impl LoopSetup {
    fn open(
        config: &NodeConfig,
        state_dir: Option<&std::path::Path>,
        index: usize,
    ) -> anyhow::Result<LoopSetup> {
        let data_dir = config.data_dir.as_deref().map(|dir| loop_dir(dir, index));
        let (persistence, restored) = open_persistence(config, data_dir.as_deref())?;
        let mut data_restored = restored.as_ref().is_some_and(|restored| restored.trusted);
        let chain = match (config.protocol, state_dir) {
            (Protocol::Chain, Some(dir)) => {
                let start = ChainStart::open(config, dir, restored.as_ref())?;
                // The chain comes back as the member it was only if it was linked and its region
                // passed its checks.
                data_restored &= start.assessment.state.as_ref().is_some_and(|state| state.linked);
                Some(start)
            }
            _ => None,
        };
        // An append-only file was there: a restart, whatever the membership log holds.
        let files_existed = restored.as_ref().is_some_and(|restored| !restored.fresh);
        // ZAB rejoins even with its data: its recovery then runs in a new epoch, as every ZAB
        // leader's must (zxids of a reused epoch could repeat ones its earlier run proposed).
        let rejoins_with_data = matches!(config.protocol, Protocol::Zab(_));
        let membership = match (config.membership, state_dir) {
            (Some(timing), Some(dir)) => {
                let dir = loop_dir(dir, index);
                files::create_private_dir(&dir)
                    .with_context(|| format!("cannot create {}", dir.display()))?;
                let data_restored = data_restored && !rejoins_with_data;
                Some(Managed::open(config, timing, &dir, data_restored, files_existed)?)
            }
            _ => None,
        };
        let joining = membership.as_ref().is_some_and(|managed| managed.membership.is_joining());
        Ok(LoopSetup { persistence, restored, membership, joining, chain })
    }
}

/// Where event loop `index` keeps its state under a node directory.
fn loop_dir(dir: &std::path::Path, index: usize) -> std::path::PathBuf {
    match index {
        0 => dir.to_path_buf(),
        index => dir.join(format!("loop-{index}")),
    }
}

/// The file that records how many event loops a node's data directory was written with.
const LOOPS_FILE: &str = "event_loops";

/// The Hermes core of one event loop, restored from its append-only file.
fn open_hermes(
    config: &NodeConfig,
    replicas: NodeSet,
    restored: Option<persistence::Restored>,
    joining: bool,
) -> anyhow::Result<Hermes> {
    let mut hermes = HermesConfig::new(config.node_id, replicas);
    // §3.4 Recovery: a joining node starts empty and copies the data as a shadow.
    hermes.recovering = joining;
    hermes.donor = config.join;
    if joining {
        info!(donor = ?config.join, "joining the cluster as a shadow replica");
    }
    let mut hermes = Hermes::new(hermes);
    if let Some(restored) = restored.filter(|restored| restored.trusted && !joining) {
        let records = restored.records.len();
        let keys = persistence::hermes::restore(&mut hermes, restored.records)?;
        info!(records, keys, live_keys = hermes.key_count(), "keys restored from the append-only file");
    }
    Ok(hermes)
}

/// The CRAQ core of one event loop, restored from its append-only file.
fn open_craq(
    config: &NodeConfig,
    replicas: NodeSet,
    restored: Option<persistence::Restored>,
    joining: bool,
) -> anyhow::Result<Craq> {
    let mut craq = CraqConfig::new(config.node_id, replicas);
    // A joining node starts empty and copies its chain neighbour's state.
    craq.recovering = joining;
    if joining {
        info!("joining the cluster: copying the chain neighbour's state");
    }
    let mut craq = Craq::new(craq);
    if let Some(restored) = restored.filter(|restored| restored.trusted && !joining) {
        let records = restored.records.len();
        let keys = persistence::craq::restore(&mut craq, restored.records, seq_floor())?;
        info!(records, keys, live_keys = craq.key_count(), "keys restored from the append-only file");
    }
    Ok(craq)
}

/// What starting the event loops needs, whatever the protocol.
struct Start {
    net: NetConfig,
    /// One per event loop: one, one per raftlog shard, or `event_loops`.
    requests: Vec<tokio::sync::mpsc::Receiver<EngineRequest>>,
    /// Where a loop on the connections' thread publishes its state ([`engine::InlineLoop`]).
    inline: Arc<[engine::InlineSlot]>,
    /// Where a reactor publishes its waker ([`engine::EngineHandle`] wakes it per request).
    wake: Arc<[engine::WakeSlot]>,
    shutdown: watch::Receiver<bool>,
    /// Run the event loop on a thread of its own rather than as a task of the node's runtime.
    engine_thread: bool,
    /// Completed when every event loop has stopped (its last turn durable).
    stopped: tokio::sync::oneshot::Sender<()>,
    request_deadline: std::time::Duration,
    /// Run a single event loop as a reactor (crate::reactor), publishing its client door
    /// here; `None`: the task-based loop.
    reactor: Option<Arc<std::sync::OnceLock<reactor::ClientDoor>>>,
}

impl Start {
    /// Build each loop's core with `open(restored, joining)` (wrapped with its membership
    /// service when configured) and run it: one loop as the node always did, several each
    /// on its own thread ([`Start::run_loops`]), tagged with [`loops::LoopCore`].
    async fn spawn_loops<P>(
        self,
        setups: Vec<LoopSetup>,
        mut open: impl FnMut(Option<persistence::Restored>, bool) -> anyhow::Result<P>,
    ) -> anyhow::Result<Arc<NetStats>>
    where
        P: ServedReplica,
        P::Message: WireMessage + Send + 'static,
    {
        let count = setups.len();
        let managed = setups[0].membership.is_some();
        let mut plain = Vec::new();
        let mut with_membership = Vec::new();
        for setup in setups {
            let core = open(setup.restored, setup.joining)?;
            assert_eq!(setup.membership.is_some(), managed, "membership on every loop or on none");
            match setup.membership {
                None => plain
                    .push((core, engine::NodeDisk { membership_log: None, persistence: setup.persistence })),
                Some(managed) => with_membership.push((
                    WithMembership::new(core, managed.membership),
                    engine::NodeDisk {
                        membership_log: Some(managed.durable_log),
                        persistence: setup.persistence,
                    },
                )),
            }
        }
        match (count, managed) {
            (1, false) => self.run(plain.pop().expect("one loop")).await,
            (1, true) => self.run(with_membership.pop().expect("one loop")).await,
            (_, false) => self.run_loops(tag_loops(plain), "chorus-loop").await,
            (_, true) => self.run_loops(tag_loops(with_membership), "chorus-loop").await,
        }
    }

    async fn run<R>(self, (replica, disk): (R, engine::NodeDisk)) -> anyhow::Result<Arc<NetStats>>
    where
        R: ServedReplica,
        R::Message: WireMessage + Send + 'static,
    {
        if let Some(door) = self.reactor {
            let [requests]: [_; 1] = self.requests.try_into().expect("one event loop, one request channel");
            let parts = reactor::Parts {
                replica,
                disk,
                requests,
                shutdown: self.shutdown,
                request_deadline: self.request_deadline,
                net: self.net,
                wake: self.wake,
                stopped: self.stopped,
            };
            let (client_door, net_stats) = reactor::start(parts).await?;
            let _ = door.set(client_door);
            return Ok(net_stats);
        }
        let (mut transport, inbound, net_stats) = chorus_net::start(self.net).await?;
        transport.set_priority(R::is_priority);
        let stopped = self.stopped;
        let [requests]: [_; 1] = self.requests.try_into().expect("one event loop, one request channel");
        // On the connections' own thread, they may run commands through the loop between its
        // turns; on a thread of its own, the loop keeps its core to itself.
        let inline = (!self.engine_thread).then(|| (self.inline.clone(), 0));
        let event_loop = async move {
            let deadline = self.request_deadline;
            engine::run(replica, deadline, transport, requests, inbound, self.shutdown, disk, inline).await;
            let _ = stopped.send(());
        };
        // With one worker thread (the default) the event loop is one more task on it: a
        // request then crosses connection, event loop and peer links without a cross-thread
        // wake-up (lower latency and more unpipelined throughput on 2 cores). With more
        // workers it gets a thread of its own, so that under a flood of client connections it
        // is not queued behind hundreds of connection tasks on the shared workers; leases
        // ride on it answering heartbeats in time. Both keep leases under a saturating load
        // (docs/benchmarks.md, "Membership under load").
        if !self.engine_thread {
            tokio::spawn(event_loop);
            return Ok(net_stats);
        }
        std::thread::Builder::new()
            .name("chorus-engine".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a current-thread runtime for the event loop");
                runtime.block_on(event_loop);
            })
            .context("cannot start the event loop thread")?;
        Ok(net_stats)
    }
}

/// Each loop's core tagged with its loop number, for [`Start::run_loops`].
fn tag_loops<P>(cores: Vec<(P, engine::NodeDisk)>) -> Vec<(loops::LoopCore<P>, engine::NodeDisk)>
where
    P: ServedReplica,
    P::Message: WireMessage + Send + 'static,
{
    let count = cores.len();
    cores
        .into_iter()
        .enumerate()
        .map(|(index, (core, disk))| (loops::LoopCore::new(core, index, count), disk))
        .collect()
}

/// One event loop's inbound channels: priority batches and data batches.
type LoopInbound<M> = (
    tokio::sync::mpsc::Sender<(chorus_core::NodeId, Vec<M>)>,
    tokio::sync::mpsc::Sender<(chorus_core::NodeId, Vec<M>)>,
);

impl Start {
    /// Run several event loops, each with its own core on its own thread (Cyclone §3.2's Raft
    /// cores, Hermes' worker threads; decision 9). They share the transport: each loop sends
    /// its turns' frames through its own handle on the same peer links, and one task hands
    /// each loop the messages tagged with its number, priority ones on its priority lane.
    async fn run_loops<R>(
        self,
        cores: Vec<(R, engine::NodeDisk)>,
        thread_name: &str,
    ) -> anyhow::Result<Arc<NetStats>>
    where
        R: ServedReplica,
        R::Message: WireMessage + loops::Routed + Send + 'static,
    {
        assert_eq!(cores.len(), self.requests.len(), "one request channel per event loop");
        let (mut transport, inbound, net_stats) = chorus_net::start::<R::Message>(self.net).await?;
        transport.set_priority(R::is_priority);
        let mut inbound_senders = Vec::new();
        let mut stopped = Vec::new();
        for (((core, disk), requests), index) in cores.into_iter().zip(self.requests).zip(0..) {
            let (data_tx, data_rx) = tokio::sync::mpsc::channel(SHARD_INBOUND_BATCHES_MAX);
            let (priority_tx, priority_rx) = tokio::sync::mpsc::channel(SHARD_INBOUND_BATCHES_MAX);
            inbound_senders.push((priority_tx, data_tx));
            let inbound = chorus_net::Inbound::from_channels(priority_rx, data_rx);
            let (stopped_tx, stopped_rx) = tokio::sync::oneshot::channel();
            stopped.push(stopped_rx);
            let (transport, shutdown, deadline) =
                (transport.sibling(), self.shutdown.clone(), self.request_deadline);
            let event_loop = async move {
                engine::run(core, deadline, transport, requests, inbound, shutdown, disk, None).await;
                let _ = stopped_tx.send(());
            };
            std::thread::Builder::new()
                .name(format!("{thread_name}-{index}"))
                .spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .expect("a current-thread runtime for an event loop");
                    runtime.block_on(event_loop);
                })
                .context("cannot start an event loop thread")?;
        }
        drop(transport);
        tokio::spawn(split_inbound(inbound, inbound_senders, R::is_priority));
        let all_stopped = self.stopped;
        tokio::spawn(async move {
            for shard in stopped {
                let _ = shard.await;
            }
            let _ = all_stopped.send(());
        });
        Ok(net_stats)
    }
}

/// Batches of peer messages waiting for one event loop.
const SHARD_INBOUND_BATCHES_MAX: usize = 4096;

/// Hand every received message to its event loop, keeping each sender's messages in order
/// per lane; priority messages (membership heartbeats) go on the loop's priority lane so they
/// do not queue behind data. A message naming a loop this node does not have is dropped (the
/// handshake's protocol name, which carries the loop count, keeps such peers out).
async fn split_inbound<M: loops::Routed>(
    mut inbound: chorus_net::Inbound<M>,
    loops: Vec<LoopInbound<M>>,
    is_priority: fn(&M) -> bool,
) {
    while let Some((from, messages)) = inbound.recv().await {
        let mut batches: Vec<(Vec<M>, Vec<M>)> = loops.iter().map(|_| (Vec::new(), Vec::new())).collect();
        for message in messages {
            if let Some((priority, data)) = batches.get_mut(message.event_loop()) {
                if is_priority(&message) { priority } else { data }.push(message);
            }
        }
        for ((priority, data), (priority_tx, data_tx)) in batches.into_iter().zip(&loops) {
            for (batch, tx) in [(priority, priority_tx), (data, data_tx)] {
                if !batch.is_empty() && tx.send((from, batch)).await.is_err() {
                    return; // that event loop stopped: the node is stopping
                }
            }
        }
    }
}

/// The chain store's member memory in the event loop: the region file (mmap'd) or, for crash
/// tests, the file behind a storage that loses unsynced writes; flushed once per turn.
pub type LocalChain = chorus_chain::Chain<chorus_group::ChainMember<TurnFlushed>>;
type TurnFlushed = chorus_region::TurnFlush<Box<dyn chorus_region::RegionMemory + Send>>;

/// Where the chain's member keeps its region.
enum ChainRegion {
    /// In this node's event loop: flushed by the loop once per turn (`appendfsync`).
    Local(TurnFlushed),
    /// On the node's group host, which maps the same file and flushes every operation itself.
    Hosted(chorus_region::Region),
}

/// The chain store's region, opened, with what the node kept about its place in the chain.
struct ChainStart {
    region: ChainRegion,
    assessment: chorus_chain::restore::Assessment,
}

impl ChainStart {
    /// Open `<dir>/regions/tenant-0/chain.region` (docs/protocols/chain.md) and, when the node
    /// persists (`appendonly yes`), decide from its append-only file and the region itself what
    /// it restarts from: redo the records a crash cut short, check every checksum, refuse a
    /// damaged region (it is repaired by a copy from the head).
    fn open(
        config: &NodeConfig,
        dir: &std::path::Path,
        restored: Option<&persistence::Restored>,
    ) -> anyhow::Result<ChainStart> {
        let layout = config.chain_layout;
        let bytes = layout.region_bytes();
        let regions = dir.join("regions");
        let persisting = config.persistence.appendonly && config.data_dir.is_some();
        let crash_test = persisting && config.persistence.storage == persistence::StorageChoice::CrashTest;
        anyhow::ensure!(
            !crash_test || config.chain_hosts.is_empty(),
            "appendonly_storage = \"crash-test\" cannot be used with chain_hosts: the group hosts map the region file"
        );
        // Without appendonly nothing is restored, so nothing needs flushing.
        let backend = if persisting || !config.chain_hosts.is_empty() {
            chorus_region::FlushBackend::Msync
        } else {
            chorus_region::FlushBackend::None
        };
        let store = chorus_region::RegionStore::open(&regions, backend)
            .with_context(|| format!("cannot open the chain region directory under {}", dir.display()))?;
        let mut region: Box<dyn chorus_region::RegionMemory + Send> = if crash_test {
            warn!("appendonly_storage = \"crash-test\": the chain region's unsynced writes wait in memory");
            let file_dir = regions.join(format!("{}", chorus_chain::replica::TENANT));
            let storage = chorus_storage::CrashTestStorage::open(&file_dir)
                .with_context(|| format!("cannot open {}", file_dir.display()))?;
            let name = format!("{}.region", chain_host::REGION_NAME);
            Box::new(
                chorus_storage::StorageRegion::open(storage, &name, bytes)
                    .context("cannot open the chain region")?,
            )
        } else {
            let region = store
                .register(chorus_chain::replica::TENANT, chain_host::REGION_NAME, bytes)
                .context("cannot open the chain region")?;
            info!(path = ?region.path(), bytes, "chain region mapped");
            Box::new(region)
        };
        let assessment = match restored {
            Some(restored) if !restored.fresh => {
                chorus_chain::restore::assess(&restored.records, restored.synced, layout, &mut region)
            }
            _ => chorus_chain::restore::Assessment::default(),
        };
        match &assessment.state {
            Some(state) if state.linked => info!(
                view = state.view_epoch,
                order = ?state.order,
                "chain region checked; restarting as the member it was"
            ),
            Some(_) => {
                info!(reason = %assessment.reason, "chain region checked; rejoining, offering it for a catch-up")
            }
            None if assessment.region_refused => tracing::error!("{}", assessment.reason),
            None if !assessment.reason.is_empty() => {
                info!(reason = %assessment.reason, "not restarting from the chain region")
            }
            None => {}
        }
        let region = if config.chain_hosts.is_empty() {
            ChainRegion::Local(chorus_region::TurnFlush::with_policy(region, sync_policy(config)))
        } else {
            // The host maps the file: the node's own mapping must be the same file.
            drop(region);
            let region = store
                .register(chorus_chain::replica::TENANT, chain_host::REGION_NAME, bytes)
                .context("cannot open the chain region")?;
            ChainRegion::Hosted(region)
        };
        Ok(ChainStart { region, assessment })
    }

    /// The core's configuration: the server's shape, and what the node restarts from.
    fn config(&self, config: &NodeConfig, replicas: NodeSet, joining: bool) -> chorus_chain::ChainConfig {
        let mut chain_config = chorus_chain::ChainConfig::server(config.node_id, replicas);
        chain_config.layout = config.chain_layout;
        // §5.1: a joining node serves nothing until the head has copied its region over this
        // one (empty or stale) or sent it the records it lacks, and linked it into the chain.
        chain_config.joining = joining;
        chain_config.restored = self.assessment.state.clone();
        chain_config.incarnation = incarnation();
        chain_config.seq_floor = seq_floor();
        if joining {
            info!("joining the chain: waiting for the head to copy the log and the database region");
        }
        chain_config
    }
}

/// When the chain's region is flushed: `appendfsync` (always: every turn, before its messages
/// leave; everysec: once a second; no: never but at a clean stop).
fn sync_policy(config: &NodeConfig) -> chorus_region::SyncPolicy {
    use persistence::AppendFsync;
    if !config.persistence.appendonly {
        return chorus_region::SyncPolicy::Never;
    }
    match config.persistence.appendfsync {
        AppendFsync::Always => chorus_region::SyncPolicy::EveryTurn,
        AppendFsync::Everysec => chorus_region::SyncPolicy::Every(std::time::Duration::from_secs(1)),
        AppendFsync::No => chorus_region::SyncPolicy::Never,
    }
}

/// The chain store with its member in this node's event loop.
fn open_chain(
    config: &NodeConfig,
    chain_config: chorus_chain::ChainConfig,
    region: TurnFlushed,
) -> anyhow::Result<LocalChain> {
    let me = config.node_id;
    usable_chain(chorus_chain::Chain::with_member(chain_config, |initial| {
        chorus_group::ChainMember::new(initial, me, chorus_chain::replica::TENANT, region)
            .map_err(|error| error.to_string())
    }))
}

fn usable_chain<M: chorus_chain::Member>(
    chain: chorus_chain::Chain<M>,
) -> anyhow::Result<chorus_chain::Chain<M>> {
    match chain.region_error() {
        Some(error) => anyhow::bail!("the chain region cannot be used: {error}"),
        None => Ok(chain),
    }
}

/// The chain store with its member on this node's group host (`chain_hosts`): the host maps
/// the same region file, under the same directory, or, on the kernel path, this node maps the
/// host's BPF region slot (docs/protocols/chain.md, "Where the members run").
async fn open_hosted_chain(
    config: &NodeConfig,
    mut chain_config: chorus_chain::ChainConfig,
    region: chorus_region::Region,
) -> anyhow::Result<chorus_chain::Chain<chain_host::HostedMember>> {
    let (me, hosts) = (config.node_id, config.chain_hosts.clone());
    let (region, kernel) = if config.chain_kernel {
        // The kernel path's region lives in the host's BPF map, not in the file: nothing of
        // it survives the host, so the node restarts as nothing it recorded (it joins).
        if chain_config.restored.take().is_some() {
            warn!("the kernel data path keeps no region across restarts: joining instead of restoring");
        }
        // The members remember 256 gCAS results (the program's ring): no more in flight.
        chain_config.window_max = chain_config.window_max.min(chorus_group::kernel::layout::RING);
        let bytes = chain_config.layout.region_bytes();
        let (region, kernel) = open_kernel_chain_region(config, bytes).await?;
        (region, Some(kernel))
    } else {
        (region, None)
    };
    let path = if kernel.is_some() { "kernel" } else { "user" };
    info!(host = %hosts[usize::from(me.0)], path, "the chain's member runs on this node's group host");
    usable_chain(chorus_chain::Chain::with_member(chain_config, |initial| {
        chain_host::HostedMember::new(me, initial, region, hosts, kernel, std::time::Duration::from_secs(5))
    }))
}

/// How long a node waits for its group host to register the kernel path's region (the host
/// may start after it).
const KERNEL_REGION_WAIT: std::time::Duration = std::time::Duration::from_secs(20);

/// The chain's region on the host's kernel data path: registered by the host, mapped here by
/// the BPF map's id (needs root), and this node's datagram socket on its peer port (UDP).
async fn open_kernel_chain_region(
    config: &NodeConfig,
    bytes: u64,
) -> anyhow::Result<(chorus_region::Region, chain_host::KernelPath)> {
    use chorus_chain::replica::{TENANT, TOKEN};
    let host = config.chain_hosts[usize::from(config.node_id.0)];
    let timeout = std::time::Duration::from_secs(2);
    let deadline = std::time::Instant::now() + KERNEL_REGION_WAIT;
    let slot = loop {
        match chorus_group::runtime::kernel_region(
            host,
            TENANT,
            TOKEN,
            chain_host::REGION_NAME,
            bytes,
            timeout,
        )
        .await
        {
            Ok(slot) => break slot,
            Err(error) if std::time::Instant::now() < deadline && !error.contains("user-space path") => {
                tracing::debug!("waiting for the group host: {error}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            Err(error) => anyhow::bail!("the chain's kernel data path: {error}"),
        }
    };
    let region = chorus_group::kernel::datapath::open_slot(
        TENANT,
        chain_host::REGION_NAME,
        slot.map_id,
        slot.slot,
        bytes,
    )
    .map_err(|error| anyhow::anyhow!("mapping the kernel region slot: {error}"))?;
    info!(
        map_id = slot.map_id,
        slot = slot.slot,
        bytes,
        "chain region mapped from the group host's kernel path"
    );
    let data = std::net::SocketAddr::new(host.ip(), slot.data_port);
    let datagrams = chorus_group::runtime::MemberDatagrams::bind(config.peer_addr.port(), data, TENANT)
        .with_context(|| {
            format!("binding the chain's datagram socket on UDP port {}", config.peer_addr.port())
        })?;
    let ids = config.replicas.keys().map(|id| usize::from(id.0)).max().unwrap_or(0) + 1;
    let mut ports = vec![0u16; ids];
    for (id, addr) in &config.replicas {
        ports[usize::from(id.0)] = addr.port();
    }
    Ok((region, chain_host::KernelPath { datagrams, ports }))
}

/// One message carries at most a key and a value, each bounded by the value limit.
fn frame_payload_bytes_max(config: &NodeConfig) -> usize {
    2 * config.value_bytes_max + 64 * 1024
}

/// The raftlog replica, restored from `<data_dir>/raftlog` (its two-level log and last
/// checkpoint); without a data directory it keeps everything in memory and must never
/// rejoin under the same id after a restart.
fn open_raftlog(config: &NodeConfig, replicas: NodeSet) -> anyhow::Result<DurableRaftLog> {
    if let Some(data_dir) = &config.data_dir {
        check_shard_layout(&data_dir.join("raftlog"), 1)?;
    }
    open_raftlog_shard(config, replicas, 0)
}

/// Every shard of a raftlog node with `raftlog_shards > 1`: shard 0 in `<data_dir>/raftlog`,
/// shard `s` in `<data_dir>/raftlog/shard-<s>`.
fn open_raftlog_shards(config: &NodeConfig, replicas: NodeSet) -> anyhow::Result<Vec<ShardCore>> {
    if let Some(data_dir) = &config.data_dir {
        check_shard_layout(&data_dir.join("raftlog"), config.raftlog.shards)?;
    }
    info!(shards = config.raftlog.shards, logs = config.raftlog.logs, "raftlog logs split over shards");
    (0..config.raftlog.shards)
        .map(|shard| Ok(ShardCore::new(open_raftlog_shard(config, replicas, shard)?)))
        .collect()
}

/// The file that records how many shards a raftlog data directory was written with.
const SHARDS_FILE: &str = "shards";

fn check_shard_layout(dir: &std::path::Path, shards: usize) -> anyhow::Result<()> {
    check_loop_layout(dir, SHARDS_FILE, "raftlog_shards", shards)
}

/// A key's loop (raftlog: shard and log) depends on the loop count, so a data directory
/// written with one count cannot be served with another: refuse, naming both. `file` in
/// `dir` records the count; a directory without it was written with one loop (before loops
/// existed, or by a first start). One loop on a fresh directory writes nothing, so the
/// layout of a one-loop node is what it always was.
fn check_loop_layout(dir: &std::path::Path, file: &str, field: &str, count: usize) -> anyhow::Result<()> {
    files::create_private_dir(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let path = dir.join(file);
    let has_data = std::fs::read_dir(dir)?.any(|entry| entry.is_ok_and(|entry| entry.file_name() != file));
    let recorded = match std::fs::read_to_string(&path) {
        Ok(text) => text.trim().parse::<usize>().with_context(|| format!("{} is damaged", path.display()))?,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound && (has_data || count == 1) => 1,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            std::fs::write(&path, format!("{count}\n"))
                .with_context(|| format!("cannot write {}", path.display()))?;
            return Ok(());
        }
        Err(error) => return Err(error).with_context(|| format!("cannot read {}", path.display())),
    };
    anyhow::ensure!(
        recorded == count,
        "{} was written with {field} = {recorded}, but this node is configured with {count}: \
         keys would move between event loops; start it with {field} = {recorded} (or a fresh data_dir)",
        dir.display()
    );
    Ok(())
}

/// Shard `shard` of the raftlog replica (the whole replica when there is one shard).
fn open_raftlog_shard(
    config: &NodeConfig,
    replicas: NodeSet,
    shard: usize,
) -> anyhow::Result<DurableRaftLog> {
    let mut raftlog = RaftLogConfig::new(config.node_id, replicas);
    raftlog.logs = config.raftlog.logs / config.raftlog.shards;
    raftlog.shards = config.raftlog.shards;
    raftlog.shard = shard;
    raftlog.batch_commands_max = config.raftlog.batch_commands_max;
    raftlog.snapshot_entries = config.raftlog.snapshot_entries;
    raftlog.session_expiry_entries = config.raftlog.session_expiry_entries;
    raftlog.trailing_entries = config.raftlog.trailing_entries;
    raftlog.decoupled = config.raftlog.decoupled;
    raftlog.ganged = config.raftlog.ganged;
    raftlog.leaders = config.raftlog.leaders;
    // The event loop calls `end_turn` before it performs each turn's outbox.
    raftlog.flush_at_turn_end = config.raftlog.flush_per_turn;
    // A replacement (`--join`) is a new Raft member of every log; the data directory keeps
    // its incarnation and identity (only a fresh directory takes these).
    raftlog.joining = config.join.is_some();
    raftlog.incarnation = if raftlog.joining { incarnation() & chorus_raftlog::INCARNATION_MAX } else { 0 };
    raftlog.identity = incarnation().rotate_left(17);
    // Batches and entries are cut to fit the transport's frames; larger snapshots go in chunks.
    raftlog.message_bytes_max = frame_payload_bytes_max(config);
    let Some(data_dir) = &config.data_dir else {
        warn!("no data_dir: raftlog state is in memory only; a restarted node must not rejoin under its id");
        return Ok(DurableRaftLog::in_memory(raftlog));
    };
    let mut dir = data_dir.join("raftlog");
    if shard > 0 {
        dir = dir.join(format!("shard-{shard}"));
    }
    let mut options = DiskOptions {
        flush: config.raftlog.flush,
        storage: config.raftlog.storage,
        sync: config.raftlog.sync,
        emulated_sync_delay: config.raftlog.emulated_sync_delay,
        ..DiskOptions::default()
    };
    if options.storage == chorus_raftlog::disk::StorageKind::CrashTest {
        warn!("raftlog_storage = \"crash-test\": unsynced writes wait in memory (process crash tests only)");
        // A small circular log, so a crash test drains it into the log file every few hundred
        // records and a power loss can strike between a drain and the next checkpoint.
        options.circular_bytes = 128 + 16 * 1024;
    }
    let replica = DurableRaftLog::open(raftlog, &dir, options)
        .with_context(|| format!("cannot open the raftlog data in {}", dir.display()))?;
    let incarnation = replica.core().config().incarnation;
    info!(shard, boot = replica.boot(), incarnation, dir = %dir.display(), "raftlog state restored");
    Ok(replica)
}

/// The keys' append-only file under `<data_dir>/appendonly/` (`data_dir`: the event loop's
/// directory), and what it held. Only with a configured data directory: a temporary one dies
/// with the node.
fn open_persistence(
    config: &NodeConfig,
    data_dir: Option<&std::path::Path>,
) -> anyhow::Result<(Option<persistence::Persistence>, Option<persistence::Restored>)> {
    let options = config.persistence.clone();
    if !options.appendonly {
        return Ok((None, None));
    }
    let Some(data_dir) = data_dir else {
        warn!("no data_dir: appendonly has nowhere to write; keys live in memory only");
        return Ok((None, None));
    };
    let dir = data_dir.join("appendonly");
    if options.storage == persistence::StorageChoice::CrashTest {
        warn!(
            "appendonly_storage = \"crash-test\": unsynced writes wait in memory (process crash tests only)"
        );
    }
    let appendfsync = options.appendfsync.name();
    let (persistence, restored) = persistence::Persistence::open(&dir, options)
        .with_context(|| format!("cannot open the append-only file in {}", dir.display()))?;
    if restored.trusted {
        info!(dir = %dir.display(), appendfsync, "persisting keys; restarting with the data on disk");
    } else {
        info!(dir = %dir.display(), appendfsync, reason = %restored.reason, "persisting keys; not restoring them");
    }
    Ok((Some(persistence), Some(restored)))
}

/// Entries a persisting ZAB node keeps after every live replica applied them (ZooKeeper
/// keeps 500 in memory and serves DIFFs from its transaction log too): a node restarted after
/// missing fewer takes only those; one that missed more takes a snapshot.
const ZAB_HISTORY_RETAINED_ENTRIES: u64 = 20_000;

/// Where a CRAQ or ZAB node restarted with its data numbers its updates from: the wall clock in
/// milliseconds times 2^16, above every number an earlier start used unless that start
/// made more than 65536 updates per millisecond it ran.
fn seq_floor() -> u64 {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as u64);
    millis << 16
}

/// Tells this start of the node apart from every earlier one (join entries carry it).
fn incarnation() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos() as u64);
    nanos ^ ((std::process::id() as u64) << 40) | 1
}

/// The membership node, restored from the data directory's `membership.log`.
struct Managed {
    membership: Membership,
    durable_log: MembershipLog<FileStorage>,
}

impl Managed {
    /// `data_restored`: the protocol's keys came back from this node's own append-only file
    /// (all of them, every acknowledged one included), so a restart needs no copy.
    /// `files_existed`: it found an append-only file, so it ran before even if its membership
    /// log is empty (a cluster that never changed its view): without its data it must rejoin,
    /// not come back as an empty member.
    fn open(
        config: &NodeConfig,
        timing: MembershipTiming,
        dir: &std::path::Path,
        data_restored: bool,
        files_existed: bool,
    ) -> anyhow::Result<Managed> {
        let storage = FileStorage::open(dir).with_context(|| format!("cannot open {}", dir.display()))?;
        let path = dir.join(MEMBERSHIP_LOG);
        let (durable_log, records) = MembershipLog::open(storage)?;
        let replicas: NodeSet = config.replicas.keys().copied().collect();
        let mut membership_config = MembershipConfig::new(config.node_id, replicas);
        membership_config.heartbeat_period = Time::from_millis(timing.heartbeat_ms);
        membership_config.missed_heartbeats_max = timing.missed_heartbeats;
        membership_config.lease = Time::from_millis(timing.lease_ms);
        if !records.is_empty() {
            info!(records = records.len(), "membership state restored from {}", path.display());
        }
        let restarted = !records.is_empty() || files_existed;
        if config.protocol.can_join() {
            // Without its keys on disk a restarted node has lost them (CRAQ and ZAB keep them in
            // memory; a chain region may have missed writes while the node was down), and so
            // has a node whose append-only file is not complete: it rejoins like a new one and
            // is copied to (docs/operations.md, "Replacing a node"). With them it comes back
            // as the member it was (docs/membership.md, "Restarting with the data").
            if (restarted && !data_restored) || config.join.is_some() {
                membership_config.join = Some(incarnation());
            }
            membership_config.rejoin = true;
        } else if restarted {
            anyhow::bail!(
                "{} holds membership state from an earlier run, but {} cannot rejoin a running \
                 cluster (no state transfer): start every node with a fresh \
                 data_dir to start a new cluster",
                path.display(),
                config.protocol.name()
            );
        }
        // The event loop's clock starts at zero when it starts, right after this.
        let membership = Membership::restore(membership_config, Time::ZERO, &records);
        Ok(Managed { membership, durable_log })
    }
}
