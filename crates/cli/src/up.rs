//! `chorus up`: a local cluster of `chorus node` processes on one machine.
//!
//! Writes one config file per replica under the data directory, starts one child process per
//! replica (this same binary, `chorus node --config ...`), waits until each serves RESP,
//! prints the addresses, and on Ctrl-C or SIGTERM stops them all (SIGTERM, then SIGKILL for
//! any that do not exit within a few seconds).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use chorus_group::kernel::netlab::NetLab;
use chorus_server::config::RawConfig;

#[derive(clap::Args)]
pub struct UpArgs {
    /// Number of replicas (per shard).
    #[arg(long, default_value_t = 3)]
    pub replicas: u8,
    /// Replica groups the 16384 hash slots are split over, behind the Redis Cluster
    /// protocol (docs/resp.md, "Cluster"). 1 (default): one group holds every key.
    #[arg(long, default_value_t = 1)]
    pub shards: u16,
    /// Replication protocol.
    #[arg(long, default_value = "hermes")]
    pub protocol: String,
    /// RESP port of replica 0; replica i serves on port + i (with shards, node i is replica
    /// i % replicas of shard i / replicas).
    #[arg(long, default_value_t = 7379)]
    pub port: u16,
    /// Peer port of replica 0; replica i listens for peers on peer-port + i (default port + 1000).
    #[arg(long)]
    pub peer_port: Option<u16>,
    /// With --shards: the metadata service port of node 0 (node i: meta-port + i; default
    /// port + 2000). The slot map is agreed there by every node of every group.
    #[arg(long)]
    pub meta_port: Option<u16>,
    /// Where the nodes keep their data, configs and logs; kept on exit. Default:
    /// $XDG_DATA_HOME/chorus/up-<port> (else ~/.local/share/chorus/up-<port>), which survives
    /// a reboot. `chorus up` on a directory that holds a cluster restarts that cluster.
    #[arg(long, conflicts_with = "in_memory")]
    pub data_dir: Option<PathBuf>,
    /// Keep nothing: a fresh private /dev/shm/chorus-<random> directory, removed on exit,
    /// and no append-only file.
    #[arg(long)]
    pub in_memory: bool,
    /// Log every write to the nodes' append-only files (hermes, craq, zab, chain; default yes).
    #[arg(long, value_name = "yes|no")]
    pub appendonly: Option<String>,
    /// When the append-only files are synced: always (default), everysec or no.
    #[arg(long, value_name = "always|everysec|no")]
    pub appendfsync: Option<String>,
    /// raftlog only: its circular log's flush, msync (default: every turn, before the turn's
    /// messages leave) or none (volatile).
    #[arg(long, value_name = "msync|none")]
    pub raftlog_flush: Option<String>,
    /// raftlog only: where its syncs run, auto (default: on a thread of their own while
    /// they are slow), thread or loop (the event loop waits for each).
    #[arg(long, value_name = "auto|thread|loop")]
    pub raftlog_sync: Option<String>,
    /// raftlog only, for benchmarks: wait this long after every sync, as a slower disk would.
    #[arg(long, value_name = "MICROSECONDS")]
    pub raftlog_emulated_sync_delay_us: Option<u64>,
    /// raftlog only: checkpoint every this many applied entries (default 20000).
    #[arg(long, value_name = "ENTRIES")]
    pub raftlog_snapshot_entries: Option<u64>,
    /// raftlog only: Raft logs per node, the keys split between them by hash (default 8).
    #[arg(long, value_name = "LOGS")]
    pub raftlog_logs: Option<usize>,
    /// raftlog only: where the logs' leaders are, spread (default: log l prefers node
    /// l % replicas) or together (every log prefers node 0, as Cyclone's evaluation runs).
    #[arg(long, value_name = "spread|together")]
    pub raftlog_leaders: Option<String>,
    /// Event loops (threads) per replica, the keys split between them (hermes, craq, zab;
    /// default 1; 0: one per core). docs/decisions.md, decision 9.
    #[arg(long)]
    pub event_loops: Option<usize>,
    /// Address every replica binds to.
    #[arg(long, default_value = "127.0.0.1")]
    pub bind: IpAddr,
    /// Password clients must AUTH with (or CHORUS_REQUIREPASS). It reaches the nodes through
    /// their config files (mode 0600), not their command lines.
    #[arg(long)]
    pub requirepass: Option<String>,
    /// With a non-loopback --bind and no password, the nodes refuse to start unless this is
    /// "no" (a firewall protects the ports).
    #[arg(long, value_name = "yes|no")]
    pub protected_mode: Option<String>,
    /// Serve Prometheus metrics for replica i on metrics-port + i.
    #[arg(long)]
    pub metrics_port: Option<u16>,
    /// chain: the region's shape, "server" (69 MiB per node, default) or "kernel" (1 MiB: one
    /// slot of the kernel data path; 2,048 keys, values up to about 64 KiB).
    #[arg(long, value_name = "server|kernel")]
    pub chain_shape: Option<String>,
    /// chain: run the members on a group host per node (`chorus group-host`, HyperLoop's
    /// NIC) instead of in the nodes' event loops. "user": the host applies and forwards in its
    /// own process. "kernel": the hosts' XDP programs apply and forward in the kernel's packet
    /// path, each host in its own network namespace joined to the others and to the nodes by
    /// veth pairs (needs root and a build with clang; the region shape defaults to "kernel";
    /// without them the cluster runs on the user path, saying why).
    #[arg(long, value_name = "user|kernel")]
    pub datapath: Option<String>,
    /// chain with --datapath: replica i's group host listens on group-host-port + i
    /// (default port + 3000; port + 2000 is the metadata service's).
    #[arg(long)]
    pub group_host_port: Option<u16>,
    /// Log level of the nodes (their logs go to <data-dir>/node-<i>.log).
    #[arg(long, default_value = "info")]
    pub log_level: String,
}

const STARTUP_TIMEOUT: Duration = Duration::from_secs(15);
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

struct Replica {
    /// Node id within its group.
    id: u8,
    /// Position among all nodes: ports, directories and logs are numbered by it.
    index: u16,
    client_addr: SocketAddr,
    peer_addr: SocketAddr,
    /// Its metadata service (used with --shards only).
    meta_addr: SocketAddr,
    log: PathBuf,
    child: Option<Child>,
}

pub fn run(args: UpArgs) -> anyhow::Result<i32> {
    if args.replicas == 0 || args.replicas as usize > chorus_core::NodeId::COUNT_MAX {
        bail!("--replicas must be between 1 and {}", chorus_core::NodeId::COUNT_MAX);
    }
    if !chorus_server::config::PROTOCOL_NAMES.contains(&args.protocol.as_str()) {
        bail!(
            "--protocol {:?}: unknown protocol (available: {})",
            args.protocol,
            chorus_server::config::PROTOCOL_NAMES.join(", ")
        );
    }
    if let Some(shape) = &args.chain_shape {
        if args.protocol != "chain" {
            bail!("--chain-shape only applies to --protocol chain");
        }
        chorus_chain::ChainLayout::named(shape).map_err(|error| anyhow::anyhow!("--chain-shape: {error}"))?;
    }
    let mut args = args;
    let asked_kernel = args.datapath.as_deref() == Some("kernel");
    match (args.datapath.as_deref(), args.protocol.as_str()) {
        (None, _) | (Some("user"), "chain") => {}
        (Some("kernel"), "chain") => {
            if args.chain_shape.as_deref().is_some_and(|shape| shape != "kernel") {
                bail!(
                    "--datapath kernel holds each region in one 1 MiB kernel slot: use --chain-shape kernel"
                );
            }
            args.chain_shape = Some("kernel".to_string());
            if let Some(reason) = kernel_unavailable(&args) {
                eprintln!(
                    "chorus: --datapath kernel unavailable ({reason}); the chain's members run on \
                     the group hosts' user-space path instead (--datapath user)"
                );
                args.datapath = Some("user".to_string());
            }
        }
        (Some(other), "chain") => bail!("--datapath {other:?}: expected user or kernel"),
        (Some(_), _) => bail!("--datapath only applies to --protocol chain"),
    }
    let kernel = args.datapath.as_deref() == Some("kernel");
    if args.shards == 0 || args.shards > 64 {
        bail!("--shards must be between 1 and 64");
    }
    let n = args.replicas as u16 * args.shards;
    let peer_port = args.peer_port.unwrap_or(args.port.saturating_add(1000));
    let meta_port = args.meta_port.unwrap_or(args.port.saturating_add(2000));
    let group_host_port = args.group_host_port.unwrap_or(args.port.saturating_add(3000));
    let port_of = |base: u16, i: u16, flag: &str| {
        base.checked_add(i)
            .filter(|port| *port != 0)
            .with_context(|| format!("--{flag} {base} + {i} is not a port"))
    };
    let requirepass = args
        .requirepass
        .clone()
        .or_else(|| std::env::var("CHORUS_REQUIREPASS").ok())
        .filter(|pw| !pw.is_empty());
    let (data_dir, remove_on_exit) = if args.in_memory {
        let shm = Path::new("/dev/shm");
        let base = if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() };
        (chorus_server::files::create_temp_dir_in(&base, "chorus")?, true)
    } else {
        let dir = match &args.data_dir {
            Some(dir) => dir.clone(),
            None => default_data_dir(args.port)?,
        };
        chorus_server::files::create_private_dir(&dir)?;
        (dir, false)
    };
    let identity = ClusterIdentity::open_or_create(&data_dir, &args)?;
    // On by default where the protocol has it (hermes, craq, zab, chain): `chorus up` keeps its data.
    let appendonly = match (&args.appendonly, args.in_memory) {
        (Some(value), _) => Some(value.clone()),
        (None, true) => Some("no".to_string()),
        (None, false) => has_appendonly(&args.protocol).then(|| "yes".to_string()),
    };

    // The group hosts flush the chain's region as the nodes would (the node's default is always).
    let host_sync = match (appendonly.as_deref(), args.appendfsync.as_deref()) {
        (Some("no"), _) => "no".to_string(),
        (_, Some(policy)) => policy.to_string(),
        (_, None) => "always".to_string(),
    };

    let r = args.replicas as u16;
    let mut peers = vec![BTreeMap::new(); usize::from(args.shards)];
    let mut replicas = Vec::new();
    for i in 0..n {
        let client_addr = SocketAddr::new(args.bind, port_of(args.port, i, "port")?);
        let peer_addr = SocketAddr::new(args.bind, port_of(peer_port, i, "peer-port")?);
        let meta_addr = SocketAddr::new(args.bind, port_of(meta_port, i, "meta-port")?);
        let id = (i % r) as u8;
        peers[usize::from(i / r)].insert(id.to_string(), peer_addr.to_string());
        let log = data_dir.join(format!("node-{i}.log"));
        replicas.push(Replica { id, index: i, client_addr, peer_addr, meta_addr, log, child: None });
    }
    let sections: Vec<_> = (0..args.shards).map(|group| sharding(&args, &replicas, group)).collect();
    // Refuse early when a port is taken: a node that cannot bind would exit, and another
    // server on that port would otherwise pass for our replica.
    for replica in &replicas {
        let meta = Some(replica.meta_addr).filter(|_| args.shards > 1);
        for addr in [replica.client_addr, replica.peer_addr].into_iter().chain(meta) {
            if let Err(error) = std::net::TcpListener::bind(addr) {
                bail!(
                    "cannot use {addr} for node {}: {error} (choose other ports with --port/--peer-port/--meta-port)",
                    replica.index
                );
            }
        }
    }
    let exe = std::env::current_exe().context("cannot find the chorus binary")?;
    // Kernel path: every node's host in a network namespace of its own, the nodes in this one.
    let lab = match kernel {
        true => Some(
            NetLab::create(usize::from(n)).map_err(|error| anyhow::anyhow!("network namespaces: {error}"))?,
        ),
        false => None,
    };
    let host_ip = |i: u16| match &lab {
        Some(lab) => IpAddr::V4(lab.host_ip(usize::from(i))),
        None => args.bind,
    };
    let chain_hosts: Vec<SocketAddr> = match args.datapath {
        None => Vec::new(),
        Some(_) => (0..n)
            .map(|i| {
                port_of(group_host_port, i, "group-host-port").map(|port| SocketAddr::new(host_ip(i), port))
            })
            .collect::<anyhow::Result<_>>()?,
    };
    let mut cluster =
        Cluster { replicas, hosts: Vec::new(), data_dir: data_dir.clone(), remove_on_exit, lab: None };
    if let Some(lab) = lab {
        // The hosts first: a node maps its host's region slot as it starts. Their regions are
        // kernel memory, so nothing of a node's directory is shared.
        let peers: Vec<IpAddr> = chain_hosts.iter().map(SocketAddr::ip).collect();
        for (i, addr) in chain_hosts.iter().enumerate() {
            let node_dir = data_dir.join(format!("node-{i}"));
            let host = HostPlan {
                listen: *addr,
                node_dir: &node_dir,
                log_level: &args.log_level,
                sync: &host_sync,
                kernel: Some((&lab, i, &peers)),
            };
            cluster.hosts.push(start_group_host(&exe, host)?);
        }
        cluster.lab = Some(lab);
    }

    for replica in &mut cluster.replicas {
        let group = replica.index / r;
        // Groups are separate clusters: their own peers, and an id no other group accepts.
        let cluster_id = match args.shards {
            1 => identity.cluster_id.clone(),
            _ => format!("{}-g{group}", identity.cluster_id),
        };
        let config = RawConfig {
            node_id: Some(replica.id),
            protocol: Some(args.protocol.clone()),
            client_addr: Some(replica.client_addr.to_string()),
            peer_addr: Some(replica.peer_addr.to_string()),
            peers: Some(peers[usize::from(group)].clone()),
            data_dir: Some(data_dir.join(format!("node-{}", replica.index))),
            cluster_id: Some(cluster_id),
            cluster: sections[usize::from(group)].clone(),
            cluster_token: Some(identity.cluster_token.clone()),
            appendonly: appendonly.clone().map(chorus_server::config::YesNo::Text),
            appendfsync: args.appendfsync.clone(),
            raftlog_flush: args.raftlog_flush.clone(),
            raftlog_sync: args.raftlog_sync.clone(),
            raftlog_emulated_sync_delay_us: args.raftlog_emulated_sync_delay_us,
            raftlog_snapshot_entries: args.raftlog_snapshot_entries,
            raftlog_logs: args.raftlog_logs,
            raftlog_leaders: args.raftlog_leaders.clone(),
            chain_shape: args.chain_shape.clone(),
            chain_hosts: (!chain_hosts.is_empty())
                .then(|| chain_hosts.iter().map(|addr| addr.to_string()).collect()),
            chain_datapath: args.datapath.clone(),
            event_loops: args.event_loops,
            requirepass: requirepass.clone(),
            protected_mode: args.protected_mode.clone().map(chorus_server::config::YesNo::Text),
            metrics_addr: args
                .metrics_port
                .map(|base| {
                    port_of(base, replica.index, "metrics-port")
                        .map(|p| SocketAddr::new(args.bind, p).to_string())
                })
                .transpose()?,
            ..RawConfig::default()
        };
        // Nodes that kept their keys (hermes, craq, zab and chain with appendonly, raftlog)
        // restart from them (zab through a join, in a new epoch; the chain from its region and
        // the view and order it recorded). The others kept none: membership state left by an
        // earlier run describes a cluster whose data is gone, and a node restarted on it would
        // wait to rejoin it, so they start as a new cluster. A chain region left without its
        // recorded view and order (appendonly no) is removed too: nothing would say which
        // region is current (a node that had stopped early could come back as the head with a
        // stale region).
        if !keeps_keys(&args.protocol, appendonly.as_deref()) {
            let node_dir = data_dir.join(format!("node-{}", replica.index));
            remove_stale(&node_dir.join("membership.log"), false)?;
            remove_stale(&node_dir.join("regions"), true)?;
        }
        let path = data_dir.join(format!("node-{}.toml", replica.index));
        write_private(&path, &toml::to_string(&config)?)?;
        let log = std::fs::File::create(&replica.log)
            .with_context(|| format!("cannot create log file {}", replica.log.display()))?;
        let mut command = Command::new(&exe);
        command
            .arg("node")
            .arg("--config")
            .arg(&path)
            .arg("--log-level")
            .arg(&args.log_level)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        die_with_parent(&mut command);
        replica.child = Some(command.spawn().context("cannot start `chorus node`")?);
    }

    // After the nodes, which clear a fresh cluster's region directories: the hosts map the
    // same files. A node dials its host again until it is up.
    for (i, addr) in chain_hosts.iter().enumerate().filter(|_| !kernel) {
        let node_dir = data_dir.join(format!("node-{i}"));
        let host = HostPlan {
            listen: *addr,
            node_dir: &node_dir,
            log_level: &args.log_level,
            sync: &host_sync,
            kernel: None,
        };
        cluster.hosts.push(start_group_host(&exe, host)?);
    }

    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let mut stop = Box::pin(stop_signal());
        // Wait for every replica to serve, or for a failure or a signal.
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        for i in 0..cluster.replicas.len() {
            loop {
                if let Some(status) = cluster.replicas[i].exited() {
                    let log = tail(&cluster.replicas[i].log);
                    bail!("node {i} exited during startup ({status}):\n{log}");
                }
                if replica_operational(cluster.replicas[i].client_addr, requirepass.as_deref()) {
                    break;
                }
                if Instant::now() > deadline {
                    bail!("node {i} did not start serving on {} in time", cluster.replicas[i].client_addr);
                }
                tokio::select! {
                    () = &mut stop => return Ok(()),
                    () = tokio::time::sleep(Duration::from_millis(50)) => {}
                }
            }
        }
        let kept = if remove_on_exit {
            "in memory: nothing is kept"
        } else if !keeps_keys(&args.protocol, appendonly.as_deref()) {
            "keys in memory; configs and logs kept"
        } else if identity.restarted {
            "restarted from the data kept"
        } else {
            "data kept across restarts"
        };
        let kept = match (args.datapath.as_deref(), asked_kernel) {
            (Some("kernel"), _) => format!("{kept}; members on the group hosts' kernel data path (XDP)"),
            (Some(_), true) => {
                format!("{kept}; members on the group hosts' user-space path: kernel path unavailable")
            }
            (Some(_), false) => format!("{kept}; members on the group hosts' user-space path"),
            (None, _) => kept.to_string(),
        };
        if args.shards == 1 {
            println!(
                "chorus: {} {} replicas up (data, configs and logs in {}; {kept})",
                n,
                args.protocol,
                data_dir.display()
            );
        } else {
            println!(
                "chorus: {} shards x {} {} replicas up, 16384 slots (data, configs and logs in {}; {kept})",
                args.shards,
                args.replicas,
                args.protocol,
                data_dir.display()
            );
        }
        let cluster_flag = if args.shards > 1 { " -c" } else { "" };
        for replica in &cluster.replicas {
            let shard = match args.shards {
                1 => String::new(),
                _ => format!("shard {} ", replica.index / r),
            };
            println!(
                "  {shard}replica {}: redis-cli{cluster_flag} -h {} -p {}   (peers on {}, log {})",
                replica.id,
                replica.client_addr.ip(),
                replica.client_addr.port(),
                replica.peer_addr,
                replica.log.display()
            );
        }
        println!("Ctrl-C stops the cluster.");
        loop {
            tokio::select! {
                () = &mut stop => break,
                () = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
            let mut running = 0;
            for replica in &mut cluster.replicas {
                match replica.exited() {
                    Some(status) => {
                        eprintln!(
                            "chorus: node {} exited ({status}); see {}",
                            replica.index,
                            replica.log.display()
                        );
                        replica.child = None;
                    }
                    None if replica.child.is_some() => running += 1,
                    None => {}
                }
            }
            if running == 0 {
                bail!("every replica has exited");
            }
        }
        Ok(())
    })?;
    drop(cluster); // stops the children
    println!("chorus: cluster stopped");
    Ok(0)
}

/// Remove what an earlier run left at `path` (a file, or a directory with `dir`), if anything.
fn remove_stale(path: &Path, dir: bool) -> anyhow::Result<()> {
    let removed = if dir { std::fs::remove_dir_all(path) } else { std::fs::remove_file(path) };
    match removed {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(error).with_context(|| format!("cannot remove {}", path.display())),
    }
}

/// The `[cluster]` section of `group`'s nodes: slots split evenly as `redis-cli --cluster
/// create` does, each group's nodes in order. `None` without sharding.
fn sharding(args: &UpArgs, replicas: &[Replica], group: u16) -> Option<chorus_server::cluster::RawCluster> {
    if args.shards == 1 {
        return None;
    }
    let r = usize::from(args.replicas);
    let groups = chorus_core::slots::even_ranges(args.shards)
        .into_iter()
        .zip(replicas.chunks(r))
        .map(|((first, last), nodes)| chorus_server::cluster::RawGroup {
            slots: vec![format!("{first}-{last}")],
            clients: nodes.iter().map(|node| node.client_addr.to_string()).collect(),
            meta: nodes.iter().map(|node| node.meta_addr.to_string()).collect(),
        })
        .collect();
    Some(chorus_server::cluster::RawCluster { group: Some(group), groups })
}

/// Where `chorus up` keeps a cluster by default: per port, so clusters on other ports do
/// not share it.
fn default_data_dir(port: u16) -> anyhow::Result<PathBuf> {
    let base = match std::env::var_os("XDG_DATA_HOME").filter(|dir| !dir.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => match std::env::var_os("HOME").filter(|dir| !dir.is_empty()) {
            Some(home) => PathBuf::from(home).join(".local/share"),
            None => bail!("neither XDG_DATA_HOME nor HOME is set: pass --data-dir DIR or --in-memory"),
        },
    };
    Ok(base.join("chorus").join(format!("up-{port}")))
}

/// Whether the nodes keep their keys on disk (and so restart as the members they were).
fn keeps_keys(protocol: &str, appendonly: Option<&str>) -> bool {
    let appendonly = appendonly.is_some_and(|value| value.eq_ignore_ascii_case("yes"));
    protocol == "raftlog" || (has_appendonly(protocol) && appendonly)
}

/// The protocols that persist their keys through the append-only file.
fn has_appendonly(protocol: &str) -> bool {
    matches!(protocol, "hermes" | "craq" | "zab" | "zab-local" | "chain")
}

/// What makes the directory's nodes one cluster, kept in `<dir>/cluster.toml` (mode 0600:
/// it holds the token) so that `chorus up` on the same directory restarts the same cluster.
#[derive(serde::Serialize, serde::Deserialize)]
struct ClusterIdentity {
    protocol: String,
    replicas: u8,
    /// Absent in files written before sharding: one group.
    #[serde(default = "one_shard")]
    shards: u16,
    cluster_id: String,
    cluster_token: String,
    #[serde(skip)]
    restarted: bool,
}

impl ClusterIdentity {
    const FILE: &'static str = "cluster.toml";

    fn open_or_create(dir: &Path, args: &UpArgs) -> anyhow::Result<ClusterIdentity> {
        let path = dir.join(Self::FILE);
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                let mut identity: ClusterIdentity =
                    toml::from_str(&text).with_context(|| format!("{} is damaged", path.display()))?;
                if identity.protocol != args.protocol
                    || identity.replicas != args.replicas
                    || identity.shards != args.shards
                {
                    bail!(
                        "{} holds a {}-shard {}-replica {} cluster, not {} x {} {}: restart it with \
                         --protocol {} --shards {} --replicas {}, or choose another --data-dir",
                        dir.display(),
                        identity.shards,
                        identity.replicas,
                        identity.protocol,
                        args.shards,
                        args.replicas,
                        args.protocol,
                        identity.protocol,
                        identity.shards,
                        identity.replicas
                    );
                }
                identity.restarted = true;
                Ok(identity)
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                let identity = ClusterIdentity {
                    protocol: args.protocol.clone(),
                    replicas: args.replicas,
                    shards: args.shards,
                    cluster_id: format!("chorus-up-{}", chorus_server::files::random_hex(8)?),
                    cluster_token: chorus_server::files::random_hex(16)?,
                    restarted: false,
                };
                write_private(&path, &toml::to_string(&identity)?)?;
                Ok(identity)
            }
            Err(error) => Err(error).with_context(|| format!("cannot read {}", path.display())),
        }
    }
}

fn one_shard() -> u16 {
    1
}

struct Cluster {
    replicas: Vec<Replica>,
    /// The chain's group hosts (`--datapath`), stopped after the nodes.
    hosts: Vec<Child>,
    data_dir: PathBuf,
    remove_on_exit: bool,
    /// `--datapath kernel`: the hosts' network namespaces, removed after the hosts stopped.
    lab: Option<NetLab>,
}

impl Replica {
    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut().and_then(|child| child.try_wait().ok().flatten())
    }
}

impl Drop for Cluster {
    /// Stop every child (also on errors and panics): SIGTERM, wait, then SIGKILL.
    fn drop(&mut self) {
        for replica in &mut self.replicas {
            if let Some(child) = &replica.child {
                terminate(child);
            }
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        for replica in &mut self.replicas {
            let Some(child) = replica.child.as_mut() else { continue };
            while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
            if matches!(child.try_wait(), Ok(None)) {
                eprintln!("chorus: node {} did not stop in time; killing it", replica.index);
                let _ = child.kill();
            }
            let _ = child.wait();
        }
        for host in &mut self.hosts {
            let _ = host.kill();
            let _ = host.wait();
        }
        drop(self.lab.take());
        if self.remove_on_exit {
            let _ = std::fs::remove_dir_all(&self.data_dir);
        }
    }
}

/// Why `--datapath kernel` cannot run here, if it cannot.
fn kernel_unavailable(args: &UpArgs) -> Option<String> {
    if args.shards != 1 {
        return Some("it runs one replica group (--shards 1)".into());
    }
    if usize::from(args.replicas) > chorus_group::kernel::layout::CHAIN_MAX {
        return Some(format!("a chain has at most {} members", chorus_group::kernel::layout::CHAIN_MAX));
    }
    chorus_group::kernel::unavailable_reason().or_else(NetLab::unavailable_reason)
}

/// Where and how one node's group host runs.
struct HostPlan<'a> {
    listen: SocketAddr,
    node_dir: &'a Path,
    log_level: &'a str,
    /// When the host makes the members' gFLUSHes durable: the nodes' appendfsync.
    sync: &'a str,
    /// Kernel path: the lab, the host's namespace in it, and every host's address (its peers).
    kernel: Option<(&'a NetLab, usize, &'a [IpAddr])>,
}

/// A group host for the chain's member of one node: its regions are the node's (the node reads
/// what the host writes; on the kernel path, the host's BPF region slot), its log
/// `<node dir>-host.log`.
fn start_group_host(exe: &Path, plan: HostPlan<'_>) -> anyhow::Result<Child> {
    let log_path = plan.node_dir.with_extension("host.log");
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("cannot create log file {}", log_path.display()))?;
    let token = chorus_group::runtime::format_token(&chorus_chain::replica::TOKEN);
    let tenant = chorus_chain::replica::TENANT.0;
    let mut line = vec![
        exe.display().to_string(),
        "group-host".into(),
        "--listen".into(),
        plan.listen.to_string(),
        "--region-dir".into(),
        plan.node_dir.join("regions").display().to_string(),
        "--tenant".into(),
        format!("{tenant}:{token}"),
        "--datapath".into(),
        if plan.kernel.is_some() { "kernel" } else { "user" }.into(),
        "--sync".into(),
        plan.sync.into(),
    ];
    if let Some((lab, i, peers)) = plan.kernel {
        for peer in peers {
            line.extend(["--peer".to_string(), peer.to_string()]);
        }
        line = lab.command_in(i, &line);
    }
    let mut command = Command::new(&line[0]);
    command
        .args(&line[1..])
        .env("RUST_LOG", plan.log_level)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    die_with_parent(&mut command);
    command.spawn().context("cannot start `chorus group-host`")
}

fn terminate(child: &Child) {
    #[cfg(unix)]
    {
        // SAFETY: kill(2) with a pid we own and a valid signal number has no memory effects.
        unsafe {
            libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
        }
    }
    #[cfg(not(unix))]
    let _ = child;
}

/// On Linux, children get SIGKILL if `chorus up` itself dies without cleaning up.
fn die_with_parent(command: &mut Command) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt as _;
        // SAFETY: prctl is async-signal-safe; the closure allocates nothing.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = command;
}

async fn stop_signal() {
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

/// Config files hold the cluster token: readable by the owner only.
fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(0o600);
    }
    let mut file = options.open(path).with_context(|| format!("cannot write {}", path.display()))?;
    file.write_all(text.as_bytes()).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// The last lines of a log, for startup failures.
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(10)..].join("\n")
}

/// One RESP array of bulk strings.
fn resp_command(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Whether the replica answers INFO and says it serves (peer links up and, with the
/// membership service, a lease granted): only then is the cluster announced as up. With a
/// password it authenticates first, as any client must.
fn replica_operational(addr: std::net::SocketAddr, requirepass: Option<&str>) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else { return false };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    let mut request = Vec::new();
    if let Some(password) = requirepass {
        request.extend(resp_command(&[b"AUTH", password.as_bytes()]));
    }
    request.extend(resp_command(&[b"INFO", b"replication"]));
    if stream.write_all(&request).is_err() {
        return false;
    }
    let mut reply = Vec::new();
    let mut chunk = [0u8; 4096];
    while let Ok(read) = stream.read(&mut chunk) {
        if read == 0 {
            break;
        }
        reply.extend_from_slice(&chunk[..read]);
        let text = String::from_utf8_lossy(&reply);
        if text.contains("chorus_operational:1") {
            return true;
        }
        if text.contains("chorus_operational:0") {
            return false;
        }
    }
    false
}
