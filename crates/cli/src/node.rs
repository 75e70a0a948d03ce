//! `chorus node`: run one replica.

use std::path::PathBuf;

use chorus_server::config::RawConfig;

#[derive(clap::Args)]
pub struct NodeArgs {
    /// TOML configuration file; the flags below override its fields.
    #[arg(long, short = 'c')]
    pub config: Option<PathBuf>,
    /// This replica's id (0..63).
    #[arg(long)]
    pub node_id: Option<u8>,
    /// Replication protocol: hermes, craq, zab, zab-local or raftlog.
    #[arg(long)]
    pub protocol: Option<String>,
    /// Run the membership service (views through Raft, heartbeats, leases): true or false.
    /// Default true, except for raftlog.
    #[arg(long)]
    pub membership: Option<bool>,
    /// Membership heartbeat period in milliseconds (default 50).
    #[arg(long)]
    pub heartbeat_ms: Option<u64>,
    /// Heartbeat periods of silence before a node is suspected (default 6).
    #[arg(long)]
    pub missed_heartbeats: Option<u32>,
    /// Membership lease in milliseconds (default 600).
    #[arg(long)]
    pub lease_ms: Option<u64>,
    /// Where RESP clients connect (default 127.0.0.1:7379).
    #[arg(long)]
    pub client_addr: Option<String>,
    /// Where peers connect (default: this node's entry in the peer list).
    #[arg(long)]
    pub peer_addr: Option<String>,
    /// A replica of the cluster as ID=IP:PORT, this node included; repeat for each. Replaces
    /// the file's [peers] table.
    #[arg(long = "peer", value_name = "ID=IP:PORT")]
    pub peers: Vec<String>,
    /// Directory for this node's files.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    #[arg(long)]
    pub cluster_id: Option<String>,
    /// Shared secret peers present when they connect. Prefer the config file or the
    /// CHORUS_CLUSTER_TOKEN environment variable: other users can read command lines.
    #[arg(long)]
    pub cluster_token: Option<String>,
    /// Password clients must AUTH with (or CHORUS_REQUIREPASS, or the config file).
    #[arg(long)]
    pub requirepass: Option<String>,
    /// Refuse to start on a non-loopback client address without requirepass: yes (default)
    /// or no.
    #[arg(long, value_name = "yes|no")]
    pub protected_mode: Option<String>,
    /// Most clients connected at once (default 10000; lowered to fit the open-file limit).
    #[arg(long)]
    pub maxclients: Option<usize>,
    /// Close clients idle this many seconds (default 0: never).
    #[arg(long)]
    pub timeout: Option<u64>,
    /// Refuse writes with -OOM while the node uses more memory than this (e.g. 2gb; 0: no limit).
    #[arg(long)]
    pub maxmemory: Option<String>,
    /// Longest a request waits for an answer, in milliseconds (default 5000).
    #[arg(long)]
    pub request_deadline_ms: Option<u64>,
    /// Longest a command may take to arrive once it has started, in ms (default 60000; 0: none).
    #[arg(long)]
    pub incomplete_command_timeout_ms: Option<u64>,
    /// Largest bulk string a client may send (e.g. 512mb; the value limit applies too).
    #[arg(long)]
    pub proto_max_bulk_len: Option<String>,
    /// Most bytes one connection may have sent and not yet had parsed (e.g. 1gb).
    #[arg(long)]
    pub client_query_buffer_limit: Option<String>,
    /// Serve Prometheus metrics on this address (off by default).
    #[arg(long)]
    pub metrics_addr: Option<String>,
    /// Largest key or value accepted from clients, in bytes (default 64 MiB).
    #[arg(long)]
    pub value_bytes_max: Option<usize>,
    /// Threads running the node (default 1: every task on one thread, lowest latency).
    #[arg(long)]
    pub worker_threads: Option<usize>,
    /// chain: the region's shape, "server" (69 MiB, default) or "kernel" (1 MiB, one slot of
    /// the kernel data path).
    #[arg(long, value_name = "server|kernel")]
    pub chain_shape: Option<String>,
    /// hermes, craq, zab: event loops (threads) the keys are split over, each with its own
    /// instance of the protocol (default 1; 0: one per core).
    #[arg(long)]
    pub event_loops: Option<usize>,
    /// raftlog: number of Raft logs (default 8).
    #[arg(long)]
    pub raftlog_logs: Option<usize>,
    /// raftlog: event loops (threads) the logs are split over (default 1; 0: one per core).
    #[arg(long)]
    pub raftlog_shards: Option<usize>,
    /// raftlog: most client commands per batch (default 1024; 1 turns batching off).
    #[arg(long)]
    pub raftlog_batch_max: Option<usize>,
    /// raftlog: circular log flush, msync (default) or none.
    #[arg(long)]
    pub raftlog_flush: Option<String>,
    /// raftlog: where its syncs run, auto (default), thread or loop.
    #[arg(long, value_name = "auto|thread|loop")]
    pub raftlog_sync: Option<String>,
    /// raftlog, for benchmarks: wait this long after every sync, as a slower disk would.
    #[arg(long, value_name = "MICROSECONDS")]
    pub raftlog_emulated_sync_delay_us: Option<u64>,
    /// raftlog: checkpoint every this many applied entries (default 20000).
    #[arg(long)]
    pub raftlog_snapshot_entries: Option<u64>,
    /// raftlog: forget a client session unused for this many entries of its log (default
    /// 100000; 0: never).
    #[arg(long)]
    pub raftlog_session_expiry_entries: Option<u64>,
    /// raftlog: entries each log keeps after a compaction for lagging followers (default
    /// 1000; 0: none, a follower behind the compaction always gets a snapshot).
    #[arg(long)]
    pub raftlog_trailing_entries: Option<u64>,
    /// raftlog: decoupled (execute on arrival, roll back lost entries; default) or coupled
    /// (execute after commit).
    #[arg(long)]
    pub raftlog_execution: Option<String>,
    /// raftlog: flush the logs once per event-loop turn (default true) or after every call.
    #[arg(long)]
    pub raftlog_flush_per_turn: Option<bool>,
    /// raftlog: how MULTI/EXEC runs across logs: ganged (default) or locking.
    #[arg(long, value_name = "ganged|locking")]
    pub raftlog_transactions: Option<String>,
    /// raftlog: where the logs' leaders are: spread (default: log l prefers node l %
    /// replicas) or together (every log prefers the first node, as in Cyclone's evaluation).
    #[arg(long)]
    pub raftlog_leaders: Option<String>,
    /// raftlog, crash tests only: "crash-test" keeps unsynced writes in memory (docs/testing.md).
    #[arg(long, hide = true)]
    pub raftlog_storage: Option<String>,
    /// Log every write to <data-dir>/appendonly/ (hermes, craq, zab; default no, as Redis; `chorus up` turns it on).
    #[arg(long, value_name = "yes|no")]
    pub appendonly: Option<String>,
    /// When the append-only file is synced: always (default), everysec or no.
    #[arg(long, value_name = "always|everysec|no")]
    pub appendfsync: Option<String>,
    /// Snapshot rules, Redis' `save`: "3600 1 300 100 60 10000" (default), "" for none.
    #[arg(long)]
    pub save: Option<String>,
    /// appendonly, crash tests only: "crash-test" keeps unsynced writes in memory.
    #[arg(long, hide = true)]
    pub appendonly_storage: Option<String>,
    /// Join a running cluster (hermes, craq): this node starts as a shadow replica that takes
    /// part in writes while it copies the data in chunks from ADDR (the peer address, or the
    /// id, of a live replica; craq copies from its chain predecessor instead), then serves. A
    /// node restarted with its data_dir rejoins the same way without the flag.
    #[arg(long, value_name = "ADDR")]
    pub join: Option<String>,
    /// A peer link that carries nothing for this long (milliseconds) is dropped and
    /// redialled (default 1000).
    #[arg(long)]
    pub peer_link_timeout_ms: Option<u64>,
    /// Serve TLS clients on this port (same IP as --client-addr).
    #[arg(long)]
    pub tls_port: Option<u16>,
    /// This node's certificate (PEM), for TLS clients and peers.
    #[arg(long)]
    pub tls_cert_file: Option<PathBuf>,
    /// The private key of --tls-cert-file (PEM).
    #[arg(long)]
    pub tls_key_file: Option<PathBuf>,
    /// The CA (PEM) that peers' and clients' certificates must chain to.
    #[arg(long)]
    pub tls_ca_cert_file: Option<PathBuf>,
    /// TLS clients must present a certificate signed by the CA: true (default) or false.
    #[arg(long)]
    pub tls_auth_clients: Option<bool>,
    /// Peer links over mutual TLS: true or false (default).
    #[arg(long)]
    pub tls_cluster: Option<bool>,
    /// Log filter: error, warn, info, debug, trace, or a tracing directive.
    #[arg(long, default_value = "info")]
    pub log_level: String,
}

pub fn run(args: NodeArgs) -> anyhow::Result<i32> {
    let file = match &args.config {
        Some(path) => RawConfig::load(path)?,
        None => RawConfig::default(),
    };
    let peers = if args.peers.is_empty() {
        None
    } else {
        let mut table = std::collections::BTreeMap::new();
        for peer in &args.peers {
            let Some((id, addr)) = peer.split_once('=') else {
                anyhow::bail!("--peer {peer:?}: expected ID=IP:PORT");
            };
            table.insert(id.trim().to_string(), addr.trim().to_string());
        }
        Some(table)
    };
    if args.cluster_token.is_some() || args.requirepass.is_some() {
        eprintln!(
            "chorus: warning: a secret on the command line (--cluster-token/--requirepass) is visible to \
             other users of this machine; prefer the config file or CHORUS_CLUSTER_TOKEN/CHORUS_REQUIREPASS"
        );
    }
    let size = |text: Option<String>| text.map(chorus_server::config::ByteSize::Text);
    let protected_mode = args.protected_mode.map(chorus_server::config::YesNo::Text);
    let overrides = RawConfig {
        node_id: args.node_id,
        protocol: args.protocol,
        membership: args.membership,
        heartbeat_ms: args.heartbeat_ms,
        missed_heartbeats: args.missed_heartbeats,
        lease_ms: args.lease_ms,
        client_addr: args.client_addr,
        peer_addr: args.peer_addr,
        peers,
        data_dir: args.data_dir,
        cluster_id: args.cluster_id,
        cluster_token: args.cluster_token,
        requirepass: args.requirepass,
        metrics_addr: args.metrics_addr,
        value_bytes_max: args.value_bytes_max,
        worker_threads: args.worker_threads,
        chain_shape: args.chain_shape,
        event_loops: args.event_loops,
        raftlog_logs: args.raftlog_logs,
        raftlog_shards: args.raftlog_shards,
        raftlog_batch_max: args.raftlog_batch_max,
        raftlog_flush: args.raftlog_flush,
        raftlog_sync: args.raftlog_sync,
        raftlog_emulated_sync_delay_us: args.raftlog_emulated_sync_delay_us,
        raftlog_snapshot_entries: args.raftlog_snapshot_entries,
        raftlog_session_expiry_entries: args.raftlog_session_expiry_entries,
        raftlog_trailing_entries: args.raftlog_trailing_entries,
        raftlog_execution: args.raftlog_execution,
        raftlog_flush_per_turn: args.raftlog_flush_per_turn,
        raftlog_transactions: args.raftlog_transactions,
        raftlog_leaders: args.raftlog_leaders,
        raftlog_storage: args.raftlog_storage,
        appendonly: args.appendonly.map(chorus_server::config::YesNo::Text),
        appendfsync: args.appendfsync,
        save: args.save,
        appendonly_storage: args.appendonly_storage,
        join: args.join,
        peer_link_timeout_ms: args.peer_link_timeout_ms,
        tls_port: args.tls_port,
        tls_cert_file: args.tls_cert_file,
        tls_key_file: args.tls_key_file,
        tls_ca_cert_file: args.tls_ca_cert_file,
        tls_auth_clients: args.tls_auth_clients,
        tls_cluster: args.tls_cluster,
        protected_mode,
        maxclients: args.maxclients,
        timeout: args.timeout,
        maxmemory: size(args.maxmemory),
        request_deadline_ms: args.request_deadline_ms,
        incomplete_command_timeout_ms: args.incomplete_command_timeout_ms,
        proto_max_bulk_len: size(args.proto_max_bulk_len),
        client_query_buffer_limit: size(args.client_query_buffer_limit),
        ..RawConfig::default()
    };
    let config = file.merge(secrets_from_env()).merge(overrides).validate()?;
    init_tracing(&args.log_level)?;
    let runtime = match config.worker_threads {
        1 => tokio::runtime::Builder::new_current_thread().enable_all().build()?,
        threads => {
            tokio::runtime::Builder::new_multi_thread().worker_threads(threads).enable_all().build()?
        }
    };
    runtime.block_on(chorus_server::run_node(config, shutdown_signal()))?;
    Ok(0)
}

/// Secrets from the environment (CHORUS_CLUSTER_TOKEN, CHORUS_REQUIREPASS): they override the
/// config file, and flags override them.
fn secrets_from_env() -> RawConfig {
    let var = |name: &str| std::env::var(name).ok().filter(|value| !value.is_empty());
    RawConfig {
        cluster_token: var("CHORUS_CLUSTER_TOKEN"),
        requirepass: var("CHORUS_REQUIREPASS"),
        ..RawConfig::default()
    }
}

pub fn init_tracing(level: &str) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(level)
        .map_err(|error| anyhow::anyhow!("--log-level {level:?}: {error}"))?;
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_target(false).init();
    Ok(())
}

/// Completes on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}
