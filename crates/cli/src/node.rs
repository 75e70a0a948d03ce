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
    /// Shared secret peers present when they connect.
    #[arg(long)]
    pub cluster_token: Option<String>,
    /// Password clients must AUTH with.
    #[arg(long)]
    pub requirepass: Option<String>,
    /// Serve Prometheus metrics on this address (off by default).
    #[arg(long)]
    pub metrics_addr: Option<String>,
    /// Largest key or value accepted from clients, in bytes (default 64 MiB).
    #[arg(long)]
    pub value_bytes_max: Option<usize>,
    /// Threads running the node (default 1: every task on one thread, lowest latency).
    #[arg(long)]
    pub worker_threads: Option<usize>,
    /// raftlog: number of Raft logs (default 8).
    #[arg(long)]
    pub raftlog_logs: Option<usize>,
    /// raftlog: most client commands per batch (default 1024; 1 turns batching off).
    #[arg(long)]
    pub raftlog_batch_max: Option<usize>,
    /// raftlog: circular log flush, msync (default) or none.
    #[arg(long)]
    pub raftlog_flush: Option<String>,
    /// raftlog: checkpoint every this many applied entries (default 20000).
    #[arg(long)]
    pub raftlog_snapshot_entries: Option<u64>,
    /// raftlog: coupled (execute after commit, default) or decoupled.
    #[arg(long)]
    pub raftlog_execution: Option<String>,
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
        raftlog_logs: args.raftlog_logs,
        raftlog_batch_max: args.raftlog_batch_max,
        raftlog_flush: args.raftlog_flush,
        raftlog_snapshot_entries: args.raftlog_snapshot_entries,
        raftlog_execution: args.raftlog_execution,
        join: args.join,
        peer_link_timeout_ms: args.peer_link_timeout_ms,
        tls_port: args.tls_port,
        tls_cert_file: args.tls_cert_file,
        tls_key_file: args.tls_key_file,
        tls_ca_cert_file: args.tls_ca_cert_file,
        tls_auth_clients: args.tls_auth_clients,
        tls_cluster: args.tls_cluster,
        ..RawConfig::default()
    };
    let config = file.merge(overrides).validate()?;
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
