//! The Chorus node: a RESP2/RESP3 front end (readable like mini-redis) over one event loop
//! that drives a sans-I/O protocol core and the peer transport.
//!
//! * [`resp`]: parsing commands, encoding replies.
//! * [`command`]: typed requests and their mapping onto `chorus_core::Command`.
//! * [`hash`]: Redis hashes stored as one value, updated with compare-and-swap.
//! * [`connection`]: one client connection, pipelined, replies in request order.
//! * [`engine`]: the event loop that owns the protocol core.
//! * [`config`]: the node's TOML configuration.
//! * [`metrics`]: counters and the Prometheus endpoint.

pub mod command;
pub mod config;
pub mod connection;
pub mod engine;
pub mod hash;
pub mod metrics;
pub mod resp;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use anyhow::Context as _;
use chorus_core::NodeSet;
use chorus_craq::{Craq, CraqConfig};
use chorus_hermes::{Hermes, HermesConfig};
use chorus_net::NetConfig;
use chorus_zab::{Zab, ZabConfig};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::config::{NodeConfig, Protocol};
use crate::connection::{Connection, Settings, Shared};
use crate::metrics::Metrics;

/// The Redis version the server claims in INFO and HELLO: clients enable features by it.
pub const REDIS_COMPATIBLE_VERSION: &str = "7.2.0";

/// Run one node until `shutdown` completes. Binding errors are returned before serving.
pub async fn run_node(config: NodeConfig, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    if let Some(dir) = &config.data_dir {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("config field `data_dir`: cannot create {}", dir.display()))?;
    }
    let me = config.node_id;
    let replicas: NodeSet = config.replicas.keys().copied().collect();
    let peers =
        config.replicas.iter().filter(|(node, _)| **node != me).map(|(node, addr)| (*node, *addr)).collect();
    let mut net = NetConfig::new(
        me,
        config.cluster_id.clone(),
        config.cluster_token.clone(),
        config.protocol.name(),
        config.peer_addr,
        peers,
    );
    net.peer_queue_bytes_max = config.peer_queue_bytes_max;
    // One message carries at most a key and a value, each bounded by the value limit.
    net.frame_payload_bytes_max = 2 * config.value_bytes_max + 64 * 1024;

    let clients = TcpListener::bind(config.client_addr)
        .await
        .with_context(|| format!("cannot listen for clients on {}", config.client_addr))?;
    let metrics_listener = match config.metrics_addr {
        Some(addr) => Some(
            TcpListener::bind(addr).await.with_context(|| format!("cannot listen for metrics on {addr}"))?,
        ),
        None => None,
    };

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let (engine, requests) = engine::channel();
    let net_stats = match config.protocol {
        Protocol::Hermes => {
            let (transport, inbound, net_stats) = chorus_net::start(net).await?;
            let replica = Hermes::new(HermesConfig::new(me, replicas));
            tokio::spawn(engine::run(replica, transport, requests, inbound, shutdown_rx));
            net_stats
        }
        Protocol::Craq => {
            let (transport, inbound, net_stats) = chorus_net::start(net).await?;
            let replica = Craq::new(CraqConfig::new(me, replicas));
            tokio::spawn(engine::run(replica, transport, requests, inbound, shutdown_rx));
            net_stats
        }
        Protocol::Zab(read_mode) => {
            let (transport, inbound, net_stats) = chorus_net::start(net).await?;
            let mut zab_config = ZabConfig::new(me, replicas);
            zab_config.read_mode = read_mode;
            let replica = Zab::new(zab_config);
            tokio::spawn(engine::run(replica, transport, requests, inbound, shutdown_rx));
            net_stats
        }
    };

    let metrics = Arc::new(Metrics::default());
    if let Some(listener) = metrics_listener {
        info!(addr = %listener.local_addr()?, "serving Prometheus metrics");
        tokio::spawn(metrics::serve(listener, metrics.clone(), net_stats.clone(), engine.clone()));
    }
    let limits = resp::Limits { bulk_bytes_max: config.value_bytes_max, ..resp::Limits::default() };
    let shared = Arc::new(Shared {
        engine,
        metrics,
        net: net_stats,
        settings: Settings {
            node_id: me.0,
            protocol: config.protocol.name(),
            client_addr: config.client_addr,
            peer_addr: config.peer_addr,
            requirepass: config.requirepass.clone(),
            limits,
            maxclients: config.maxclients,
        },
        next_client_id: AtomicU64::new(0),
    });
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
    tokio::select! {
        () = accept_clients(clients, shared) => {}
        () = shutdown => info!(node = %me, "shutting down"),
    }
    let _ = shutdown_tx.send(true);
    Ok(())
}

async fn accept_clients(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                warn!("accepting client connections failed: {error}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let metrics = &shared.metrics;
        metrics.connections_accepted.fetch_add(1, Relaxed);
        if metrics.connections_current.load(Relaxed) as usize >= shared.settings.maxclients {
            metrics.connections_rejected.fetch_add(1, Relaxed);
            tokio::spawn(async move {
                use tokio::io::AsyncWriteExt as _;
                let mut stream = stream;
                let _ = stream.write_all(b"-ERR max number of clients reached\r\n").await;
            });
            continue;
        }
        metrics.connections_current.fetch_add(1, Relaxed);
        let shared = shared.clone();
        tokio::spawn(async move {
            Connection::new(shared.clone(), stream).run().await;
            shared.metrics.connections_current.fetch_sub(1, Relaxed);
        });
    }
}
