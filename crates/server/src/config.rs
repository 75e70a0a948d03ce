//! `chorus node` configuration: a TOML file, overridden field by field by command-line flags,
//! validated into a [`NodeConfig`]. Every problem is one line that names the field.
//!
//! ```toml
//! node_id = 0
//! protocol = "hermes"                # or "craq", "zab", "zab-local" (zab with local reads), "raftlog", "chain"
//! membership = true                  # views through Raft + leases (default; not for raftlog)
//! heartbeat_ms = 50                  # membership: heartbeat period
//! missed_heartbeats = 6              # membership: silent periods before a node is suspected
//! lease_ms = 600                     # membership: how long an acknowledged heartbeat lets a node serve
//! zab_reads = "sync"                 # zab only: "sync" (linearizable, default) or "local"
//! client_addr = "127.0.0.1:7379"     # RESP clients
//! peer_addr = "127.0.0.1:8379"       # peer links (default: this node's entry in [peers])
//! data_dir = "/var/lib/chorus/n0"
//! cluster_id = "chorus"
//! cluster_token = "long-random-secret"
//! requirepass = "client-password"    # optional
//! metrics_addr = "127.0.0.1:9379"    # optional Prometheus endpoint
//! value_bytes_max = 67108864         # optional, default 64 MiB
//! worker_threads = 1                 # optional: threads running this node (default 1, see below)
//! event_loops = 1                    # hermes, craq, zab: event loops (threads) the keys are split over; 0: one per core
//! reactor = true                     # one thread owns the core, client sockets and peer links (default; see below)
//! raftlog_logs = 8                   # raftlog only: Raft logs per node
//! chain_shape = "server"             # chain only: "server" (69 MiB region) or "kernel" (1 MiB)
//! chain_hosts = ["10.0.0.1:7600"]    # chain only: each node's group host, by node id
//! chain_datapath = "user"            # chain with chain_hosts: "user" or "kernel" (XDP; root)
//! chain_log_bytes = 262144           # chain only: override the shape's log, index or heap
//! raftlog_shards = 1                 # raftlog only: event loops (threads) the logs are split over; 0: one per core
//! raftlog_leaders = "spread"         # raftlog only: "spread" (log l prefers node l % replicas) or "together"
//! peer_link_timeout_ms = 1000        # optional: a peer link silent this long is dropped and redialled
//! tls-port = 6380                    # optional: TLS clients (Redis' names; tls_port works too)
//! tls-cert-file = "node.pem"         # this node's certificate (PEM), for clients and peers
//! tls-key-file = "node.key"
//! tls-ca-cert-file = "ca.pem"        # verifies peers, and clients unless tls-auth-clients = false
//! tls-auth-clients = true            # TLS clients must present a certificate (default, as Redis)
//! tls-cluster = true                 # peer links over mutual TLS (alias tls-replication)
//! request_deadline_ms = 5000         # optional: longest a request waits for an answer
//! protected-mode = true              # refuse a non-loopback client_addr without requirepass
//! maxclients = 10000                 # Redis' names from here on, with Redis' defaults
//! timeout = 0                        # close clients idle this many seconds (0: never)
//! tcp-keepalive = 300
//! client-query-buffer-limit = "1gb"
//! proto-max-bulk-len = "512mb"
//! maxmemory = "0"                    # 0: no limit; otherwise writes past it answer -OOM
//! maxmemory-policy = "noeviction"
//!
//! [peers]                            # every replica, this one included
//! 0 = "127.0.0.1:8379"
//! 1 = "127.0.0.1:8380"
//! 2 = "127.0.0.1:8381"
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use chorus_core::NodeId;

/// The file (and flag) form: everything optional so flags can fill gaps and override.
#[derive(Clone, Debug, Default, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    pub node_id: Option<u8>,
    pub protocol: Option<String>,
    pub zab_reads: Option<String>,
    pub membership: Option<bool>,
    pub heartbeat_ms: Option<u64>,
    pub missed_heartbeats: Option<u32>,
    pub lease_ms: Option<u64>,
    pub client_addr: Option<String>,
    pub peer_addr: Option<String>,
    pub peers: Option<BTreeMap<String, String>>,
    pub data_dir: Option<PathBuf>,
    pub cluster_id: Option<String>,
    pub cluster_token: Option<String>,
    pub requirepass: Option<String>,
    pub metrics_addr: Option<String>,
    pub value_bytes_max: Option<usize>,
    pub peer_queue_bytes_max: Option<usize>,
    pub maxclients: Option<usize>,
    pub worker_threads: Option<usize>,
    /// Run the event loop as a reactor that owns the client sockets and peer links (default
    /// true; crate::reactor says when it applies).
    pub reactor: Option<bool>,
    /// hermes, craq, zab: event loops (threads) the keys are split over, each running its own
    /// instance of the protocol; 0 = one per core (default 1). docs/decisions.md, decision 9.
    pub event_loops: Option<usize>,
    /// raftlog only: number of Raft logs (default 8).
    pub raftlog_logs: Option<usize>,
    /// raftlog only: event loops (threads) the logs are split over; 0 = one per core
    /// (default 1).
    pub raftlog_shards: Option<usize>,
    /// raftlog only: most client commands per batch (default 1024; 1 = no batching).
    pub raftlog_batch_max: Option<usize>,
    /// raftlog only: how the circular log is flushed, "msync" (default) or "none".
    pub raftlog_flush: Option<String>,
    /// raftlog only: where the circular log's syncs run: "auto" (default: on a thread of
    /// their own while they take 300 us or more on average, else in the event loop),
    /// "thread" (always there, while the event loop goes on) or "loop" (the event loop
    /// waits for each).
    pub raftlog_sync: Option<String>,
    /// raftlog only, for benchmarks: wait this many microseconds after every sync of the
    /// circular log, as a slower disk would (default 0).
    pub raftlog_emulated_sync_delay_us: Option<u64>,
    /// raftlog only: checkpoint (and truncate the on-disk log) every this many applied
    /// entries (default 20000).
    pub raftlog_snapshot_entries: Option<u64>,
    /// raftlog only: a client session unused for this many entries of its log is forgotten
    /// (default 100000; 0 = never). docs/protocols/raftlog.md, "Session expiry".
    pub raftlog_session_expiry_entries: Option<u64>,
    /// raftlog only: how many of each log's latest entries a compaction keeps, so a briefly
    /// lagging follower catches up from the log (default 1000; 0 = none).
    pub raftlog_trailing_entries: Option<u64>,
    /// raftlog only: "decoupled" (default: every replica executes an entry on arrival, as a
    /// transaction committed with the entry and rolled back if it is lost; Cyclone §3.1) or
    /// "coupled" (execute after commit).
    pub raftlog_execution: Option<String>,
    /// raftlog only: flush the logs once per event-loop turn (default true) rather than
    /// after every message and request (false, the behaviour before; for comparisons).
    pub raftlog_flush_per_turn: Option<bool>,
    /// raftlog only: how MULTI/EXEC runs across logs: "ganged" (default: one copy in every
    /// log involved, run once all reached it) or "locking" (two-phase locking, Cyclone §4.2).
    pub raftlog_transactions: Option<String>,
    /// raftlog only: where the logs' leaders are: "spread" (default: log l prefers node
    /// l % replicas) or "together" (every log prefers the first node, as in Cyclone's
    /// evaluation).
    pub raftlog_leaders: Option<String>,
    /// raftlog only, for process-level crash tests (docs/testing.md): "files" (default) or
    /// "crash-test", which keeps every write in the process's memory until it is synced, so a
    /// SIGKILL loses exactly what a power cut would. Never a production choice.
    pub raftlog_storage: Option<String>,
    /// chain only: the region's shape, "server" (default: 4 MiB log, 65,536 keys, 64 MiB heap)
    /// or "kernel" (one kernel-path slot of 1 MiB: 256 KiB log, 2,048 keys, 735 KiB heap).
    pub chain_shape: Option<String>,
    /// chain only: the shape's log bytes, index slots or heap bytes, replaced.
    pub chain_log_bytes: Option<u64>,
    pub chain_index_slots: Option<u64>,
    pub chain_heap_bytes: Option<u64>,
    /// chain only: the group host of every replica, by node id (`chorus group-host`, one per
    /// machine). Set: the chain's members run on these hosts instead of in the nodes' event
    /// loops (docs/protocols/chain.md, "Where the members run"). Each host's region directory
    /// must be this node's `<data_dir>/regions`: the node reads the region the host writes.
    pub chain_hosts: Option<Vec<String>>,
    /// chain with `chain_hosts`: "user" (default: the hosts apply and forward in their
    /// process, the node maps the region file) or "kernel" (the hosts' XDP programs do, the
    /// coordinator sends datagrams and the node maps its host's BPF region slot; needs root
    /// and the kernel shape; docs/protocols/chain.md, "Where the members run").
    pub chain_datapath: Option<String>,
    /// Join a running cluster (Hermes §3.4 Recovery): the peer address of a live replica to
    /// copy the data from. `chorus node --join ADDR`.
    pub join: Option<String>,
    /// A peer link that carries nothing for this long is dropped and redialled (default 1000).
    pub peer_link_timeout_ms: Option<u64>,
    /// TLS clients on this port of `client_addr`'s IP. Redis' names work too (`tls-port`, ...).
    #[serde(alias = "tls-port")]
    pub tls_port: Option<u16>,
    #[serde(alias = "tls-cert-file")]
    pub tls_cert_file: Option<PathBuf>,
    #[serde(alias = "tls-key-file")]
    pub tls_key_file: Option<PathBuf>,
    #[serde(alias = "tls-ca-cert-file")]
    pub tls_ca_cert_file: Option<PathBuf>,
    /// TLS clients must present a certificate signed by the CA (default true, as in Redis).
    #[serde(alias = "tls-auth-clients")]
    pub tls_auth_clients: Option<bool>,
    /// Peer links over mutual TLS.
    #[serde(alias = "tls-cluster", alias = "tls-replication", alias = "tls_replication")]
    pub tls_cluster: Option<bool>,
    /// Longest a client request waits for the protocol to answer (default 5000).
    pub request_deadline_ms: Option<u64>,
    /// Longest a command may take to arrive once its first byte has (default 60000; 0: no
    /// bound): a half-sent command cannot hold a client slot forever.
    pub incomplete_command_timeout_ms: Option<u64>,
    // ---- Client limits and safety, under Redis' names and with Redis' defaults.
    #[serde(rename = "protected-mode")]
    pub protected_mode: Option<YesNo>,
    /// Close a client idle for this many seconds (0: never).
    pub timeout: Option<u64>,
    #[serde(rename = "tcp-keepalive")]
    pub tcp_keepalive: Option<u64>,
    #[serde(rename = "client-query-buffer-limit")]
    pub client_query_buffer_limit: Option<ByteSize>,
    #[serde(rename = "proto-max-bulk-len")]
    pub proto_max_bulk_len: Option<ByteSize>,
    pub maxmemory: Option<ByteSize>,
    #[serde(rename = "maxmemory-policy")]
    pub maxmemory_policy: Option<String>,
    // ---- Persistence of the keys (docs/operations.md, "Persistence"), Redis' names.
    /// Log every write to `<data_dir>/appendonly/` (default no, as Redis; `chorus up` turns it on).
    pub appendonly: Option<YesNo>,
    /// "always" (default: nothing acknowledged is lost), "everysec" or "no".
    pub appendfsync: Option<String>,
    /// Snapshot rules, Redis' `save "3600 1 300 100 60 10000"` ("" turns them off).
    pub save: Option<String>,
    /// For process-level crash tests only: "crash-test" keeps unsynced writes in memory.
    pub appendonly_storage: Option<String>,
    /// Scale-out: this node's replica group and every group's slots (cluster/config.rs).
    pub cluster: Option<crate::cluster::RawCluster>,
}

/// A size as Redis writes it: a number of bytes, or a string with a unit (`"1gb"`,
/// `"512mb"`, `"100k"`; `k`/`m`/`g` are powers of 1000, `kb`/`mb`/`gb` of 1024).
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(untagged)]
pub enum ByteSize {
    Bytes(u64),
    Text(String),
}

impl ByteSize {
    fn bytes(&self, field: &str) -> Result<u64, ConfigError> {
        match self {
            ByteSize::Bytes(bytes) => Ok(*bytes),
            ByteSize::Text(text) => parse_memory(text).ok_or_else(|| {
                field_error(
                    field,
                    format!("{text:?} is not a size (bytes, or a number with k, kb, m, mb, g or gb)"),
                )
            }),
        }
    }
}

/// Redis' `memtoll`: `<digits>[b|k|kb|m|mb|g|gb]`, case-insensitive.
pub fn parse_memory(text: &str) -> Option<u64> {
    let lower = text.trim().to_ascii_lowercase();
    let split = lower.find(|c: char| !c.is_ascii_digit()).unwrap_or(lower.len());
    let (digits, unit) = lower.split_at(split);
    let multiplier: u64 = match unit {
        "" | "b" => 1,
        "k" => 1_000,
        "kb" => 1 << 10,
        "m" => 1_000_000,
        "mb" => 1 << 20,
        "g" => 1_000_000_000,
        "gb" => 1 << 30,
        _ => return None,
    };
    digits.parse::<u64>().ok()?.checked_mul(multiplier)
}

/// Redis' yes/no, or a TOML boolean.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(untagged)]
pub enum YesNo {
    Bool(bool),
    Text(String),
}

impl YesNo {
    fn value(&self, field: &str) -> Result<bool, ConfigError> {
        match self {
            YesNo::Bool(value) => Ok(*value),
            YesNo::Text(text) => match text.to_ascii_lowercase().as_str() {
                "yes" | "true" => Ok(true),
                "no" | "false" => Ok(false),
                _ => Err(field_error(field, format!("{text:?} is neither yes nor no"))),
            },
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Hermes,
    Craq,
    /// ZAB with its read mode: `Sync` (linearizable) or `Local` (ZooKeeper's local reads,
    /// sequentially consistent). See docs/protocols/zab.md.
    Zab(ZabReadMode),
    /// Cyclone-style Raft logs (docs/protocols/raftlog.md).
    Raftlog,
    /// The key-value store on the HyperLoop group primitives (docs/protocols/chain.md).
    Chain,
}

/// Membership timing (docs/membership.md). Present when the node runs a membership service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MembershipTiming {
    pub heartbeat_ms: u64,
    pub missed_heartbeats: u32,
    pub lease_ms: u64,
}

pub use chorus_zab::ReadMode as ZabReadMode;

/// The values the `protocol` field (and `chorus up --protocol`) accepts. `zab-local` is
/// `zab` with `zab_reads = "local"`.
pub const PROTOCOL_NAMES: &[&str] = &["hermes", "craq", "zab", "zab-local", "raftlog", "chain"];

impl Protocol {
    /// The protocol's name on the wire: peers refuse a link to a node running another one.
    /// Both ZAB read modes speak the same protocol.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Hermes => "hermes",
            Protocol::Craq => "craq",
            Protocol::Zab(_) => "zab",
            Protocol::Raftlog => "raftlog",
            Protocol::Chain => "chain",
        }
    }

    /// Whether a node of this protocol can start empty (or stale) and join a running cluster (a
    /// restart, `--join`, or coming back after a removal): its core copies the data to it before
    /// it serves (docs/membership.md, "Joining").
    pub fn can_join(self) -> bool {
        match self {
            Protocol::Hermes | Protocol::Craq | Protocol::Zab(_) | Protocol::Chain => true,
            Protocol::Raftlog => false,
        }
    }
}

/// A validated node configuration.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    pub node_id: NodeId,
    pub protocol: Protocol,
    /// `None`: static views (the node never learns of failures), or a protocol with its own
    /// failover (raftlog).
    pub membership: Option<MembershipTiming>,
    pub client_addr: SocketAddr,
    pub peer_addr: SocketAddr,
    /// Every replica of the cluster, this one included, and its peer address.
    pub replicas: BTreeMap<NodeId, SocketAddr>,
    pub data_dir: Option<PathBuf>,
    pub cluster_id: String,
    pub cluster_token: String,
    pub requirepass: Option<String>,
    /// `protected-mode`: a non-loopback client port needs a password (kept at run time too).
    pub protected_mode: bool,
    pub metrics_addr: Option<SocketAddr>,
    pub value_bytes_max: usize,
    pub peer_queue_bytes_max: usize,
    pub maxclients: usize,
    /// Join a running cluster as a shadow, copying the data from this replica first.
    pub join: Option<NodeId>,
    /// Threads of the node's async runtime. 1 (the default) runs every task, the event loop
    /// included, on one thread: a client's write crosses the connection, the event loop and
    /// the peer links without a cross-thread wake-up, which measured ~20% lower latency and
    /// ~1.6x the SET throughput of a 2-thread runtime with three nodes on 2 cores
    /// (docs/benchmarks.md). With more, connections run on that many workers and the event
    /// loop on a thread of its own: worth it only when a node has cores to itself and many
    /// (pipelining) connections to parse.
    pub worker_threads: usize,
    /// The event loop is a reactor on a thread of its own that owns the client sockets and the
    /// peer links (crate::reactor; used only where it applies: one loop on one worker thread,
    /// plain peer links, no slot map). `false`: the task-based loop on the node's runtime.
    pub reactor: bool,
    /// Event loops (threads) the keys are split over by hash, each with its own instance of
    /// the protocol (and of the membership service), sharing the peer links (crate::loops).
    /// Always 1 for raftlog (its `raftlog.shards` are its loops) and the chain store.
    pub event_loops: usize,
    pub raftlog: RaftlogOptions,
    /// The chain store's region shape (`chain_shape` and its overrides).
    pub chain_layout: chorus_chain::ChainLayout,
    /// The group host of every replica by node id; empty: members in the event loop.
    pub chain_hosts: Vec<SocketAddr>,
    /// The hosts serve the members on the kernel data path (`chain_datapath = "kernel"`).
    pub chain_kernel: bool,
    /// A peer link silent this long is dropped and redialled (chorus_net::NetConfig::link_timeout).
    pub peer_link_timeout_ms: u64,
    /// TLS for clients and/or peers; `None`: plain TCP everywhere.
    pub tls: Option<TlsSettings>,
    pub clients: ClientLimits,
    pub persistence: crate::persistence::PersistenceOptions,
    /// `None`: not sharded, this group holds every key (the default).
    pub cluster: Option<crate::cluster::ClusterSettings>,
}

/// TLS settings (docs/operations.md, "Security").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsSettings {
    pub files: chorus_net::tls::TlsFiles,
    /// Serve TLS clients on this port (of `client_addr`'s IP).
    pub client_port: Option<u16>,
    pub auth_clients: bool,
    /// Peer links over mutual TLS.
    pub cluster: bool,
}

/// What the node allows its clients (docs/operations.md, "Security"; docs/resp.md, "Limits").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientLimits {
    /// Redis' `proto-max-bulk-len`; the parser enforces the smaller of it and `value_bytes_max`.
    pub proto_max_bulk_len: usize,
    /// Redis' `client-query-buffer-limit`: bytes one connection may have received and not yet
    /// parsed into commands.
    pub query_buffer_bytes_max: usize,
    /// Redis' `timeout`: idle clients are closed after this many seconds (0: never).
    pub idle_timeout_s: u64,
    /// Redis' `tcp-keepalive`, seconds (0: off).
    pub tcp_keepalive_s: u64,
    pub incomplete_command_timeout_ms: u64,
    pub request_deadline_ms: u64,
    /// Redis' `maxmemory` (0: no limit); the only policy is `noeviction`.
    pub maxmemory_bytes: u64,
}

impl Default for ClientLimits {
    fn default() -> Self {
        ClientLimits {
            proto_max_bulk_len: 512 * 1024 * 1024,
            query_buffer_bytes_max: 1024 * 1024 * 1024,
            idle_timeout_s: 0,
            tcp_keepalive_s: 300,
            incomplete_command_timeout_ms: 60_000,
            request_deadline_ms: 5_000,
            maxmemory_bytes: 0,
        }
    }
}

/// raftlog settings (docs/protocols/raftlog.md, docs/operations.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RaftlogOptions {
    /// Logs per node, over all shards.
    pub logs: usize,
    /// Event loops (threads) the logs are split over, each with `logs / shards` logs.
    pub shards: usize,
    pub batch_commands_max: usize,
    pub flush: chorus_raftlog::disk::FlushBackend,
    /// Where the circular log's syncs run (`raftlog_sync`).
    pub sync: chorus_raftlog::disk::SyncPlace,
    /// `raftlog_emulated_sync_delay_us` (benchmarks only).
    pub emulated_sync_delay: std::time::Duration,
    pub snapshot_entries: u64,
    pub session_expiry_entries: u64,
    pub trailing_entries: u64,
    pub decoupled: bool,
    /// Flush the logs once per event-loop turn (default), not after every call.
    pub flush_per_turn: bool,
    /// MULTI/EXEC as ganged operations (default) rather than with two-phase locking.
    pub ganged: bool,
    /// Where the logs' leaders are (`raftlog_leaders`).
    pub leaders: chorus_raftlog::LeaderPlacement,
    /// Where the two-level log's writes go (`raftlog_storage`, for crash tests only).
    pub storage: chorus_raftlog::disk::StorageKind,
}

impl Default for RaftlogOptions {
    fn default() -> Self {
        RaftlogOptions {
            logs: 8,
            shards: 1,
            batch_commands_max: 1_024,
            flush: chorus_raftlog::disk::FlushBackend::Msync,
            sync: chorus_raftlog::disk::SyncPlace::Auto,
            emulated_sync_delay: std::time::Duration::ZERO,
            snapshot_entries: 20_000,
            session_expiry_entries: 100_000,
            trailing_entries: 1_000,
            decoupled: true,
            flush_per_turn: true,
            ganged: true,
            leaders: chorus_raftlog::LeaderPlacement::Spread,
            storage: chorus_raftlog::disk::StorageKind::Files,
        }
    }
}

/// `raftlog_shards = 0`: one shard per core, as many as divide `logs` evenly.
fn shards_per_core(logs: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |cores| cores.get()).min(64);
    (1..=cores.min(logs)).rev().find(|shards| logs.is_multiple_of(*shards)).unwrap_or(1)
}

pub const DEFAULT_CLIENT_ADDR: &str = "127.0.0.1:7379";
pub const DEFAULT_VALUE_BYTES_MAX: usize = 64 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

/// Refuse the first of `fields` that is set (`(name, set)`) unless the node runs `owner`.
fn only_for(owner: Protocol, protocol: Protocol, fields: &[(&str, bool)]) -> Result<(), ConfigError> {
    match fields.iter().find(|(_, set)| *set) {
        Some((field, _)) if protocol != owner => {
            Err(field_error(field, format!("only applies to protocol \"{}\"", owner.name())))
        }
        _ => Ok(()),
    }
}

fn field_error(field: &str, message: impl std::fmt::Display) -> ConfigError {
    ConfigError(format!("config field `{field}`: {message}"))
}

impl RawConfig {
    /// Read and parse a TOML file. Errors are one line with the file, line and field.
    pub fn load(path: &Path) -> Result<RawConfig, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|error| ConfigError(format!("cannot read config file {}: {error}", path.display())))?;
        RawConfig::parse(&text)
            .map_err(|ConfigError(message)| ConfigError(format!("{}: {message}", path.display())))
    }

    pub fn parse(text: &str) -> Result<RawConfig, ConfigError> {
        toml::from_str(text).map_err(|error| {
            let message = error.message().replace('\n', " ");
            let Some(span) = error.span() else { return ConfigError(message) };
            let start = span.start.min(text.len());
            let line = text[..start].matches('\n').count() + 1;
            // Name the field when the error points into a `key = value` line.
            let line_text = text.lines().nth(line - 1).unwrap_or("");
            match line_text.split_once('=').map(|(key, _)| key.trim()).filter(|key| !key.is_empty()) {
                Some(key) if !message.contains(key) => {
                    ConfigError(format!("line {line}: field `{key}`: {message}"))
                }
                _ => ConfigError(format!("line {line}: {message}")),
            }
        })
    }

    /// Fields set in `overrides` win.
    pub fn merge(self, overrides: RawConfig) -> RawConfig {
        RawConfig {
            node_id: overrides.node_id.or(self.node_id),
            protocol: overrides.protocol.or(self.protocol),
            zab_reads: overrides.zab_reads.or(self.zab_reads),
            membership: overrides.membership.or(self.membership),
            heartbeat_ms: overrides.heartbeat_ms.or(self.heartbeat_ms),
            missed_heartbeats: overrides.missed_heartbeats.or(self.missed_heartbeats),
            lease_ms: overrides.lease_ms.or(self.lease_ms),
            client_addr: overrides.client_addr.or(self.client_addr),
            peer_addr: overrides.peer_addr.or(self.peer_addr),
            peers: overrides.peers.or(self.peers),
            data_dir: overrides.data_dir.or(self.data_dir),
            cluster_id: overrides.cluster_id.or(self.cluster_id),
            cluster_token: overrides.cluster_token.or(self.cluster_token),
            requirepass: overrides.requirepass.or(self.requirepass),
            metrics_addr: overrides.metrics_addr.or(self.metrics_addr),
            value_bytes_max: overrides.value_bytes_max.or(self.value_bytes_max),
            peer_queue_bytes_max: overrides.peer_queue_bytes_max.or(self.peer_queue_bytes_max),
            maxclients: overrides.maxclients.or(self.maxclients),
            worker_threads: overrides.worker_threads.or(self.worker_threads),
            reactor: overrides.reactor.or(self.reactor),
            event_loops: overrides.event_loops.or(self.event_loops),
            raftlog_logs: overrides.raftlog_logs.or(self.raftlog_logs),
            raftlog_shards: overrides.raftlog_shards.or(self.raftlog_shards),
            raftlog_batch_max: overrides.raftlog_batch_max.or(self.raftlog_batch_max),
            raftlog_flush: overrides.raftlog_flush.or(self.raftlog_flush),
            raftlog_sync: overrides.raftlog_sync.or(self.raftlog_sync),
            raftlog_emulated_sync_delay_us: overrides
                .raftlog_emulated_sync_delay_us
                .or(self.raftlog_emulated_sync_delay_us),
            raftlog_snapshot_entries: overrides.raftlog_snapshot_entries.or(self.raftlog_snapshot_entries),
            raftlog_session_expiry_entries: overrides
                .raftlog_session_expiry_entries
                .or(self.raftlog_session_expiry_entries),
            raftlog_trailing_entries: overrides.raftlog_trailing_entries.or(self.raftlog_trailing_entries),
            raftlog_execution: overrides.raftlog_execution.or(self.raftlog_execution),
            raftlog_flush_per_turn: overrides.raftlog_flush_per_turn.or(self.raftlog_flush_per_turn),
            raftlog_transactions: overrides.raftlog_transactions.or(self.raftlog_transactions),
            raftlog_leaders: overrides.raftlog_leaders.or(self.raftlog_leaders),
            raftlog_storage: overrides.raftlog_storage.or(self.raftlog_storage),
            chain_shape: overrides.chain_shape.or(self.chain_shape),
            chain_log_bytes: overrides.chain_log_bytes.or(self.chain_log_bytes),
            chain_index_slots: overrides.chain_index_slots.or(self.chain_index_slots),
            chain_heap_bytes: overrides.chain_heap_bytes.or(self.chain_heap_bytes),
            chain_hosts: overrides.chain_hosts.or(self.chain_hosts),
            chain_datapath: overrides.chain_datapath.or(self.chain_datapath),
            join: overrides.join.or(self.join),
            peer_link_timeout_ms: overrides.peer_link_timeout_ms.or(self.peer_link_timeout_ms),
            tls_port: overrides.tls_port.or(self.tls_port),
            tls_cert_file: overrides.tls_cert_file.or(self.tls_cert_file),
            tls_key_file: overrides.tls_key_file.or(self.tls_key_file),
            tls_ca_cert_file: overrides.tls_ca_cert_file.or(self.tls_ca_cert_file),
            tls_auth_clients: overrides.tls_auth_clients.or(self.tls_auth_clients),
            tls_cluster: overrides.tls_cluster.or(self.tls_cluster),
            request_deadline_ms: overrides.request_deadline_ms.or(self.request_deadline_ms),
            incomplete_command_timeout_ms: overrides
                .incomplete_command_timeout_ms
                .or(self.incomplete_command_timeout_ms),
            protected_mode: overrides.protected_mode.or(self.protected_mode),
            timeout: overrides.timeout.or(self.timeout),
            tcp_keepalive: overrides.tcp_keepalive.or(self.tcp_keepalive),
            client_query_buffer_limit: overrides.client_query_buffer_limit.or(self.client_query_buffer_limit),
            proto_max_bulk_len: overrides.proto_max_bulk_len.or(self.proto_max_bulk_len),
            maxmemory: overrides.maxmemory.or(self.maxmemory),
            maxmemory_policy: overrides.maxmemory_policy.or(self.maxmemory_policy),
            appendonly: overrides.appendonly.or(self.appendonly),
            appendfsync: overrides.appendfsync.or(self.appendfsync),
            save: overrides.save.or(self.save),
            appendonly_storage: overrides.appendonly_storage.or(self.appendonly_storage),
            cluster: overrides.cluster.or(self.cluster),
        }
    }

    pub fn validate(self) -> Result<NodeConfig, ConfigError> {
        let node_id = self
            .node_id
            .ok_or_else(|| field_error("node_id", "missing (set it in the file or pass --node-id)"))?;
        if node_id as usize >= NodeId::COUNT_MAX {
            return Err(field_error(
                "node_id",
                format!("{node_id} is out of range 0..{}", NodeId::COUNT_MAX),
            ));
        }
        let node_id = NodeId(node_id);
        let zab_reads = match self.zab_reads.as_deref() {
            None => None,
            Some("sync") => Some(ZabReadMode::Sync),
            Some("local") => Some(ZabReadMode::Local),
            Some(other) => {
                return Err(field_error("zab_reads", format!("{other:?} is neither \"sync\" nor \"local\"")))
            }
        };
        let protocol = match self.protocol.as_deref().unwrap_or("hermes") {
            "hermes" => Protocol::Hermes,
            "craq" => Protocol::Craq,
            "zab" => Protocol::Zab(zab_reads.unwrap_or(ZabReadMode::Sync)),
            "zab-local" if zab_reads == Some(ZabReadMode::Sync) => {
                return Err(field_error("zab_reads", "\"sync\" contradicts protocol \"zab-local\""))
            }
            "zab-local" => Protocol::Zab(ZabReadMode::Local),
            "raftlog" => Protocol::Raftlog,
            "chain" => Protocol::Chain,
            other => {
                return Err(field_error(
                    "protocol",
                    format!("unknown protocol {other:?} (available: {})", PROTOCOL_NAMES.join(", ")),
                ))
            }
        };
        if zab_reads.is_some() && !matches!(protocol, Protocol::Zab(_)) {
            return Err(field_error("zab_reads", "only applies to protocol \"zab\""));
        }
        let membership = self.membership_timing(protocol)?;
        let event_loops = self.event_loops(protocol)?;
        let persistence = self.persistence_options(protocol)?;
        let raftlog = self.raftlog_options(protocol)?;
        let chain_layout = self.chain_layout(protocol)?;
        let chain_hosts = self.chain_hosts(protocol)?;
        let chain_kernel = self.chain_kernel(&chain_hosts, &chain_layout)?;
        let clients = self.client_limits()?;
        let requirepass = self.requirepass.clone().filter(|password| !password.is_empty());
        let client_addr =
            parse_addr("client_addr", self.client_addr.as_deref().unwrap_or(DEFAULT_CLIENT_ADDR))?;
        let peers = self
            .peers
            .as_ref()
            .ok_or_else(|| field_error("peers", "missing: list every replica as `<id> = \"ip:port\"`"))?;
        let mut replicas = BTreeMap::new();
        for (id, addr) in peers {
            let id: u8 = id
                .parse()
                .ok()
                .filter(|id| (*id as usize) < NodeId::COUNT_MAX)
                .ok_or_else(|| field_error("peers", format!("key {id:?} is not a node id (0..63)")))?;
            replicas.insert(NodeId(id), parse_addr(&format!("peers.{id}"), addr)?);
        }
        let Some(advertised) = replicas.get(&node_id).copied() else {
            return Err(field_error("peers", format!("must list this node ({node_id}) too")));
        };
        let peer_addr = match self.peer_addr.as_deref() {
            Some(addr) => parse_addr("peer_addr", addr)?,
            None => advertised,
        };
        if peer_addr == client_addr {
            return Err(field_error("peer_addr", "must differ from client_addr"));
        }
        let tls = self.tls_settings(client_addr, peer_addr)?;
        let cluster_token = self.cluster_token.filter(|token| !token.is_empty()).ok_or_else(|| {
            field_error("cluster_token", "missing: peers authenticate with a shared secret")
        })?;
        let token_bytes_min = chorus_net::handshake::TOKEN_BYTES_MIN;
        if cluster_token.len() < token_bytes_min {
            return Err(field_error(
                "cluster_token",
                format!(
                    "is {} bytes; at least {token_bytes_min} are needed, or it could be guessed offline \
                     (e.g. 32 hex digits from `openssl rand -hex 16`)",
                    cluster_token.len()
                ),
            ));
        }
        let cluster_id = self.cluster_id.unwrap_or_else(|| "chorus".to_string());
        if cluster_id.is_empty() {
            return Err(field_error("cluster_id", "must not be empty"));
        }
        let metrics_addr =
            self.metrics_addr.as_deref().map(|addr| parse_addr("metrics_addr", addr)).transpose()?;
        let value_bytes_max = self.value_bytes_max.unwrap_or(DEFAULT_VALUE_BYTES_MAX);
        if value_bytes_max == 0 || value_bytes_max > 512 * 1024 * 1024 {
            return Err(field_error("value_bytes_max", "must be between 1 byte and 512 MiB"));
        }
        let peer_queue_bytes_max = self.peer_queue_bytes_max.unwrap_or(64 * 1024 * 1024);
        if peer_queue_bytes_max == 0 {
            return Err(field_error("peer_queue_bytes_max", "must be positive"));
        }
        let maxclients = self.maxclients.unwrap_or(10_000);
        if maxclients == 0 {
            return Err(field_error("maxclients", "must be positive"));
        }
        let worker_threads = self.worker_threads.unwrap_or(1);
        if !(1..=256).contains(&worker_threads) {
            return Err(field_error("worker_threads", "must be between 1 and 256"));
        }
        let peer_link_timeout_ms = self.peer_link_timeout_ms.unwrap_or(1_000);
        if !(100..=600_000).contains(&peer_link_timeout_ms) {
            return Err(field_error("peer_link_timeout_ms", "must be between 100 and 600000"));
        }
        let protected =
            self.protected_mode.as_ref().map(|value| value.value("protected-mode")).transpose()?;
        if protected.unwrap_or(true) && requirepass.is_none() && !client_addr.ip().is_loopback() {
            return Err(field_error(
                "protected-mode",
                format!(
                    "client_addr {client_addr} is not a loopback address and no requirepass is set: \
                     anyone who can reach it could read and write every key. Set requirepass (or \
                     CHORUS_REQUIREPASS), bind to 127.0.0.1, or set protected-mode = \"no\" if \
                     a firewall protects the port"
                ),
            ));
        }
        let join = self
            .join
            .as_deref()
            .map(|addr| join_donor(addr, node_id, protocol, &membership, &replicas))
            .transpose()?;
        let cluster = self.cluster.as_ref().map(|cluster| cluster.validate(client_addr)).transpose()?;
        Ok(NodeConfig {
            cluster,
            persistence,
            raftlog,
            chain_layout,
            chain_hosts,
            chain_kernel,
            node_id,
            protocol,
            membership,
            client_addr,
            peer_addr,
            replicas,
            data_dir: self.data_dir,
            cluster_id,
            cluster_token,
            requirepass,
            protected_mode: protected.unwrap_or(true),
            metrics_addr,
            value_bytes_max,
            peer_queue_bytes_max,
            maxclients,
            worker_threads,
            reactor: self.reactor.unwrap_or(true),
            event_loops,
            join,
            peer_link_timeout_ms,
            tls,
            clients,
        })
    }

    fn tls_settings(
        &self,
        client_addr: SocketAddr,
        peer_addr: SocketAddr,
    ) -> Result<Option<TlsSettings>, ConfigError> {
        let cluster = self.tls_cluster.unwrap_or(false);
        let wanted = cluster || self.tls_port.is_some();
        if !wanted {
            let stray = [
                ("tls_cert_file", self.tls_cert_file.is_some()),
                ("tls_key_file", self.tls_key_file.is_some()),
                ("tls_ca_cert_file", self.tls_ca_cert_file.is_some()),
                ("tls_auth_clients", self.tls_auth_clients.is_some()),
            ];
            if let Some((field, _)) = stray.iter().find(|(_, set)| *set) {
                return Err(field_error(field, "has no effect without tls_port or tls_cluster"));
            }
            return Ok(None);
        }
        let needed = |field: &str, value: &Option<PathBuf>| {
            value
                .clone()
                .ok_or_else(|| field_error(field, "missing: TLS needs this node's certificate and key"))
        };
        let files = chorus_net::tls::TlsFiles {
            cert_file: needed("tls_cert_file", &self.tls_cert_file)?,
            key_file: needed("tls_key_file", &self.tls_key_file)?,
            ca_cert_file: self.tls_ca_cert_file.clone(),
        };
        if cluster && files.ca_cert_file.is_none() {
            return Err(field_error(
                "tls_ca_cert_file",
                "missing: tls_cluster verifies peers against this CA",
            ));
        }
        let auth_clients = self.tls_auth_clients.unwrap_or(true);
        if self.tls_port.is_some() && auth_clients && files.ca_cert_file.is_none() {
            return Err(field_error(
                "tls_ca_cert_file",
                "missing: tls_auth_clients (on by default, as in Redis) verifies client certificates \
                 against it; set tls_auth_clients = false to accept clients without one",
            ));
        }
        if let Some(port) = self.tls_port {
            if port == 0 || port == client_addr.port() || SocketAddr::new(client_addr.ip(), port) == peer_addr
            {
                return Err(field_error(
                    "tls_port",
                    format!("{port} is 0 or already the client or peer port"),
                ));
            }
        }
        Ok(Some(TlsSettings { files, client_port: self.tls_port, auth_clients, cluster }))
    }
}

/// Redis' `save` line: pairs of seconds and changes ("" or "none": no snapshot rules).
fn parse_save_rules(text: &str) -> Result<Vec<crate::persistence::SaveRule>, ConfigError> {
    let words: Vec<&str> = text.split_whitespace().collect();
    if words.is_empty() || words == ["none"] {
        return Ok(Vec::new());
    }
    if !words.len().is_multiple_of(2) {
        return Err(field_error("save", format!("{text:?}: expected pairs of <seconds> <changes>")));
    }
    let number = |word: &str| {
        word.parse::<u64>().map_err(|_| field_error("save", format!("{word:?} is not a whole number")))
    };
    let mut rules = Vec::new();
    for pair in words.chunks(2) {
        rules.push(crate::persistence::SaveRule { seconds: number(pair[0])?, changes: number(pair[1])? });
    }
    Ok(rules)
}

/// `--join ADDR`: which replica (by its peer address, or its id) the joiner copies from.
fn join_donor(
    addr: &str,
    me: NodeId,
    protocol: Protocol,
    membership: &Option<MembershipTiming>,
    replicas: &BTreeMap<NodeId, SocketAddr>,
) -> Result<NodeId, ConfigError> {
    // raftlog joins as a replacement of this node's previous member in every log's Raft
    // configuration (docs/protocols/raftlog.md, "Replacing a node"): no membership service.
    let replaces = protocol == Protocol::Raftlog;
    if !protocol.can_join() && !replaces {
        return Err(field_error(
            "join",
            format!("{} cannot join a running cluster: it has no state transfer", protocol.name()),
        ));
    }
    if membership.is_none() && !replaces {
        return Err(field_error("join", "joining needs the membership service (membership = true)"));
    }
    let by_id = addr.parse::<u8>().ok().map(NodeId).filter(|node| replicas.contains_key(node));
    let by_addr = addr
        .parse::<SocketAddr>()
        .ok()
        .and_then(|addr| replicas.iter().find(|(_, peer)| **peer == addr).map(|(node, _)| *node));
    let donor = by_id.or(by_addr).ok_or_else(|| {
        field_error(
            "join",
            format!("{addr:?} is neither the peer address nor the id of a replica in [peers]"),
        )
    })?;
    if donor == me {
        return Err(field_error("join", "names this node; give a live replica to copy the data from"));
    }
    Ok(donor)
}

impl RawConfig {
    fn client_limits(&self) -> Result<ClientLimits, ConfigError> {
        let defaults = ClientLimits::default();
        let size = |value: &Option<ByteSize>, field: &str, default: usize| match value {
            None => Ok(default),
            Some(value) => value.bytes(field).map(|bytes| usize::try_from(bytes).unwrap_or(usize::MAX)),
        };
        let proto_max_bulk_len =
            size(&self.proto_max_bulk_len, "proto-max-bulk-len", defaults.proto_max_bulk_len)?;
        if proto_max_bulk_len < 1024 * 1024 {
            return Err(field_error("proto-max-bulk-len", "must be at least 1mb (Redis' minimum)"));
        }
        let query_buffer_bytes_max = size(
            &self.client_query_buffer_limit,
            "client-query-buffer-limit",
            defaults.query_buffer_bytes_max,
        )?;
        if query_buffer_bytes_max < 1024 * 1024 {
            return Err(field_error("client-query-buffer-limit", "must be at least 1mb (Redis' minimum)"));
        }
        let maxmemory_bytes = match &self.maxmemory {
            None => defaults.maxmemory_bytes,
            Some(value) => value.bytes("maxmemory")?,
        };
        match self.maxmemory_policy.as_deref() {
            None | Some("noeviction") => {}
            Some(other) => {
                return Err(field_error(
                    "maxmemory-policy",
                    format!("{other:?} is not supported: chorus never evicts keys (noeviction)"),
                ))
            }
        }
        let request_deadline_ms = self.request_deadline_ms.unwrap_or(defaults.request_deadline_ms);
        if request_deadline_ms == 0 {
            return Err(field_error("request_deadline_ms", "must be positive"));
        }
        Ok(ClientLimits {
            proto_max_bulk_len,
            query_buffer_bytes_max,
            idle_timeout_s: self.timeout.unwrap_or(defaults.idle_timeout_s),
            tcp_keepalive_s: self.tcp_keepalive.unwrap_or(defaults.tcp_keepalive_s),
            incomplete_command_timeout_ms: self
                .incomplete_command_timeout_ms
                .unwrap_or(defaults.incomplete_command_timeout_ms),
            request_deadline_ms,
            maxmemory_bytes,
        })
    }

    fn persistence_options(
        &self,
        protocol: Protocol,
    ) -> Result<crate::persistence::PersistenceOptions, ConfigError> {
        use crate::persistence::{AppendFsync, PersistenceOptions, StorageChoice};
        let defaults = PersistenceOptions::default();
        // ZAB restarts from its files through a join (a new epoch), so it needs the membership;
        // so does the chain (a node removed while it was down rejoins and catches up).
        let needs_membership = matches!(protocol, Protocol::Zab(_) | Protocol::Chain);
        let with_membership = needs_membership && self.membership != Some(false);
        let supported = matches!(protocol, Protocol::Hermes | Protocol::Craq) || with_membership;
        let appendonly = match &self.appendonly {
            None => false,
            Some(value) => value.value("appendonly")?,
        };
        if appendonly && !supported {
            return Err(field_error(
                "appendonly",
                format!(
                    "{} does not persist its keys through the append-only file (hermes, craq, \
                     and zab and chain with membership do; raftlog has its own durable log): set \
                     appendonly no",
                    protocol.name()
                ),
            ));
        }
        let appendfsync = match self.appendfsync.as_deref() {
            None => defaults.appendfsync,
            Some("always") => AppendFsync::Always,
            Some("everysec") => AppendFsync::Everysec,
            Some("no") => AppendFsync::No,
            Some(other) => {
                return Err(field_error("appendfsync", format!("{other:?} is none of always, everysec, no")))
            }
        };
        let save = match self.save.as_deref() {
            None => defaults.save,
            Some(text) => parse_save_rules(text)?,
        };
        let storage = match self.appendonly_storage.as_deref() {
            None | Some("files") => StorageChoice::Files,
            Some("crash-test") => StorageChoice::CrashTest,
            Some(other) => {
                return Err(field_error(
                    "appendonly_storage",
                    format!("{other:?} is neither \"files\" nor \"crash-test\""),
                ))
            }
        };
        Ok(PersistenceOptions { appendonly, appendfsync, save, storage, ..defaults })
    }

    fn chain_layout(&self, protocol: Protocol) -> Result<chorus_chain::ChainLayout, ConfigError> {
        let fields = [
            ("chain_shape", self.chain_shape.is_some()),
            ("chain_log_bytes", self.chain_log_bytes.is_some()),
            ("chain_index_slots", self.chain_index_slots.is_some()),
            ("chain_heap_bytes", self.chain_heap_bytes.is_some()),
        ];
        only_for(Protocol::Chain, protocol, &fields)?;
        let shape = chorus_chain::ChainLayout::named(self.chain_shape.as_deref().unwrap_or("server"))
            .map_err(|error| field_error("chain_shape", error))?;
        shape
            .with_sizes(self.chain_log_bytes, self.chain_index_slots, self.chain_heap_bytes)
            .map_err(|error| field_error("chain_log_bytes, chain_index_slots or chain_heap_bytes", error))
    }

    fn chain_hosts(&self, protocol: Protocol) -> Result<Vec<SocketAddr>, ConfigError> {
        only_for(Protocol::Chain, protocol, &[("chain_hosts", self.chain_hosts.is_some())])?;
        let hosts = self.chain_hosts.as_deref().unwrap_or_default();
        let ids = self.peers.iter().flatten().filter_map(|(id, _)| id.parse::<usize>().ok());
        let needed = ids.chain([usize::from(self.node_id.unwrap_or(0))]).max().unwrap_or(0) + 1;
        if !hosts.is_empty() && hosts.len() < needed {
            return Err(field_error(
                "chain_hosts",
                format!(
                    "lists {} hosts: it needs the group host of each of the {needed} node ids",
                    hosts.len()
                ),
            ));
        }
        hosts.iter().map(|host| parse_addr("chain_hosts", host)).collect()
    }

    fn chain_kernel(
        &self,
        hosts: &[SocketAddr],
        layout: &chorus_chain::ChainLayout,
    ) -> Result<bool, ConfigError> {
        let kernel = match self.chain_datapath.as_deref() {
            None | Some("user") => false,
            Some("kernel") => true,
            Some(other) => {
                return Err(field_error("chain_datapath", format!("{other:?}: expected user or kernel")))
            }
        };
        if self.chain_datapath.is_some() && hosts.is_empty() {
            return Err(field_error("chain_datapath", "needs chain_hosts (the members' group hosts)"));
        }
        let slot = chorus_group::kernel::layout::REGION_BYTES_MAX;
        if kernel && layout.region_bytes() > slot {
            return Err(field_error(
                "chain_datapath",
                format!(
                    "a {}-byte region does not fit the kernel path's {slot}-byte slots: use chain_shape = \"kernel\"",
                    layout.region_bytes()
                ),
            ));
        }
        Ok(kernel)
    }

    fn event_loops(&self, protocol: Protocol) -> Result<usize, ConfigError> {
        let loops = match self.event_loops.unwrap_or(1) {
            0 => std::thread::available_parallelism()
                .map_or(1, |cores| cores.get())
                .min(crate::loops::EVENT_LOOPS_MAX),
            loops if loops > crate::loops::EVENT_LOOPS_MAX => {
                return Err(field_error(
                    "event_loops",
                    format!("must be at most {}", crate::loops::EVENT_LOOPS_MAX),
                ))
            }
            loops => loops,
        };
        match protocol {
            _ if loops == 1 => Ok(1),
            Protocol::Raftlog => Err(field_error(
                "event_loops",
                "raftlog splits its logs over event loops with raftlog_shards; leave event_loops at 1",
            )),
            Protocol::Chain => {
                Err(field_error("event_loops", "the chain store has one region and one event loop"))
            }
            Protocol::Hermes | Protocol::Craq | Protocol::Zab(_) => Ok(loops),
        }
    }

    fn raftlog_options(&self, protocol: Protocol) -> Result<RaftlogOptions, ConfigError> {
        let fields = [
            ("raftlog_logs", self.raftlog_logs.is_some()),
            ("raftlog_shards", self.raftlog_shards.is_some()),
            ("raftlog_batch_max", self.raftlog_batch_max.is_some()),
            ("raftlog_flush", self.raftlog_flush.is_some()),
            ("raftlog_sync", self.raftlog_sync.is_some()),
            ("raftlog_emulated_sync_delay_us", self.raftlog_emulated_sync_delay_us.is_some()),
            ("raftlog_snapshot_entries", self.raftlog_snapshot_entries.is_some()),
            ("raftlog_session_expiry_entries", self.raftlog_session_expiry_entries.is_some()),
            ("raftlog_trailing_entries", self.raftlog_trailing_entries.is_some()),
            ("raftlog_execution", self.raftlog_execution.is_some()),
            ("raftlog_flush_per_turn", self.raftlog_flush_per_turn.is_some()),
            ("raftlog_transactions", self.raftlog_transactions.is_some()),
            ("raftlog_leaders", self.raftlog_leaders.is_some()),
            ("raftlog_storage", self.raftlog_storage.is_some()),
        ];
        only_for(Protocol::Raftlog, protocol, &fields)?;
        let defaults = RaftlogOptions::default();
        let logs = self.raftlog_logs.unwrap_or(defaults.logs);
        if !(1..=1024).contains(&logs) {
            return Err(field_error("raftlog_logs", "must be between 1 and 1024"));
        }
        let shards = match self.raftlog_shards.unwrap_or(defaults.shards) {
            0 => shards_per_core(logs),
            shards if shards > 64 => return Err(field_error("raftlog_shards", "must be at most 64")),
            shards if !logs.is_multiple_of(shards) => {
                return Err(field_error(
                    "raftlog_shards",
                    format!(
                        "{shards} does not divide raftlog_logs = {logs} (every shard hosts as many logs)"
                    ),
                ))
            }
            shards => shards,
        };
        let batch_commands_max = self.raftlog_batch_max.unwrap_or(defaults.batch_commands_max);
        if batch_commands_max == 0 {
            return Err(field_error("raftlog_batch_max", "must be at least 1 (1 turns batching off)"));
        }
        let flush = match self.raftlog_flush.as_deref() {
            None => defaults.flush,
            Some("msync") => chorus_raftlog::disk::FlushBackend::Msync,
            Some("none") => chorus_raftlog::disk::FlushBackend::None,
            Some(other) => {
                return Err(field_error(
                    "raftlog_flush",
                    format!("{other:?} is neither \"msync\" nor \"none\""),
                ))
            }
        };
        let sync = match self.raftlog_sync.as_deref() {
            None | Some("auto") => chorus_raftlog::disk::SyncPlace::Auto,
            Some("thread") => chorus_raftlog::disk::SyncPlace::Thread,
            Some("loop") => chorus_raftlog::disk::SyncPlace::Loop,
            Some(other) => {
                let message = format!("{other:?} is none of \"auto\", \"thread\" and \"loop\"");
                return Err(field_error("raftlog_sync", message));
            }
        };
        let emulated_sync_delay =
            std::time::Duration::from_micros(self.raftlog_emulated_sync_delay_us.unwrap_or(0));
        let snapshot_entries = self.raftlog_snapshot_entries.unwrap_or(defaults.snapshot_entries);
        let session_expiry_entries =
            self.raftlog_session_expiry_entries.unwrap_or(defaults.session_expiry_entries);
        let trailing_entries = self.raftlog_trailing_entries.unwrap_or(defaults.trailing_entries);
        let decoupled = match self.raftlog_execution.as_deref() {
            Some("coupled") => false,
            None | Some("decoupled") => true,
            Some(other) => {
                return Err(field_error(
                    "raftlog_execution",
                    format!("{other:?} is neither \"coupled\" nor \"decoupled\""),
                ))
            }
        };
        let ganged = match self.raftlog_transactions.as_deref() {
            None | Some("ganged") => true,
            Some("locking") => false,
            Some(other) => {
                return Err(field_error(
                    "raftlog_transactions",
                    format!("{other:?} is neither \"ganged\" nor \"locking\""),
                ))
            }
        };
        let leaders = match self.raftlog_leaders.as_deref() {
            None | Some("spread") => chorus_raftlog::LeaderPlacement::Spread,
            Some("together") => chorus_raftlog::LeaderPlacement::Together,
            Some(other) => {
                return Err(field_error(
                    "raftlog_leaders",
                    format!("{other:?} is neither \"spread\" nor \"together\""),
                ))
            }
        };
        let storage = match self.raftlog_storage.as_deref() {
            None | Some("files") => chorus_raftlog::disk::StorageKind::Files,
            Some("crash-test") => chorus_raftlog::disk::StorageKind::CrashTest,
            Some(other) => {
                return Err(field_error(
                    "raftlog_storage",
                    format!("{other:?} is neither \"files\" nor \"crash-test\""),
                ))
            }
        };
        Ok(RaftlogOptions {
            logs,
            shards,
            batch_commands_max,
            flush,
            sync,
            emulated_sync_delay,
            snapshot_entries,
            session_expiry_entries,
            trailing_entries,
            decoupled,
            flush_per_turn: self.raftlog_flush_per_turn.unwrap_or(defaults.flush_per_turn),
            ganged,
            leaders,
            storage,
        })
    }

    fn membership_timing(&self, protocol: Protocol) -> Result<Option<MembershipTiming>, ConfigError> {
        let wanted = self.membership.unwrap_or(protocol != Protocol::Raftlog);
        if !wanted {
            return Ok(None);
        }
        if protocol == Protocol::Raftlog {
            return Err(field_error("membership", "raftlog fails over through its own Raft logs"));
        }
        let timing = MembershipTiming {
            heartbeat_ms: self.heartbeat_ms.unwrap_or(50),
            missed_heartbeats: self.missed_heartbeats.unwrap_or(6),
            lease_ms: self.lease_ms.unwrap_or(600),
        };
        if timing.heartbeat_ms == 0 {
            return Err(field_error("heartbeat_ms", "must be positive"));
        }
        if timing.missed_heartbeats < 2 {
            return Err(field_error(
                "missed_heartbeats",
                "must be at least 2, or one late packet removes a node",
            ));
        }
        if timing.lease_ms <= 2 * timing.heartbeat_ms {
            return Err(field_error(
                "lease_ms",
                "must exceed two heartbeat periods, or leases lapse between renewals",
            ));
        }
        Ok(Some(timing))
    }
}

fn parse_addr(field: &str, text: &str) -> Result<SocketAddr, ConfigError> {
    text.parse().map_err(|_| field_error(field, format!("{text:?} is not an IP:PORT socket address")))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
node_id = 1
cluster_token = "secret-secret-secret"
client_addr = "127.0.0.1:7380"
[peers]
0 = "127.0.0.1:8379"
1 = "127.0.0.1:8380"
"#;

    #[test]
    fn a_good_file_validates_with_secure_defaults() {
        let config = RawConfig::parse(GOOD).unwrap().validate().unwrap();
        assert_eq!(config.node_id, NodeId(1));
        assert_eq!(config.peer_addr, "127.0.0.1:8380".parse().unwrap());
        assert_eq!(config.replicas.len(), 2);
        assert_eq!(config.protocol, Protocol::Hermes);
        assert_eq!(config.requirepass, None);
        assert_eq!(config.value_bytes_max, 64 * 1024 * 1024);
        assert!(config.client_addr.ip().is_loopback());
        assert_eq!(config.worker_threads, 1);
    }

    #[test]
    fn every_protocol_name_validates() {
        let protocol_of = |text: String| RawConfig::parse(&text).unwrap().validate().unwrap().protocol;
        assert_eq!(protocol_of(format!("protocol = \"craq\"\n{GOOD}")), Protocol::Craq);
        assert_eq!(protocol_of(format!("protocol = \"zab\"\n{GOOD}")), Protocol::Zab(ZabReadMode::Sync));
        let local = format!("protocol = \"zab\"\nzab_reads = \"local\"\n{GOOD}");
        assert_eq!(protocol_of(local), Protocol::Zab(ZabReadMode::Local));
        assert_eq!(
            protocol_of(format!("protocol = \"zab-local\"\n{GOOD}")),
            Protocol::Zab(ZabReadMode::Local)
        );
        for name in PROTOCOL_NAMES {
            RawConfig::parse(&format!("protocol = \"{name}\"\n{GOOD}")).unwrap().validate().unwrap();
        }
    }

    #[test]
    fn join_is_accepted_exactly_for_protocols_that_copy_data_to_a_joiner() {
        assert!(Protocol::Hermes.can_join() && Protocol::Craq.can_join());
        for name in PROTOCOL_NAMES.iter().filter(|name| **name != "raftlog") {
            let text = format!("protocol = \"{name}\"\njoin = \"127.0.0.1:8379\"\n{GOOD}");
            match RawConfig::parse(&text).unwrap().validate() {
                Ok(config) => {
                    assert!(config.protocol.can_join(), "{name} accepted --join");
                    assert_eq!(config.join, Some(NodeId(0)), "{name}: the donor by peer address");
                }
                Err(ConfigError(message)) => {
                    let plain = format!("protocol = \"{name}\"\n{GOOD}");
                    let protocol = RawConfig::parse(&plain).unwrap().validate().unwrap().protocol;
                    assert!(!protocol.can_join(), "{name}: {message}");
                    assert!(message.contains("cannot join a running cluster"), "{name}: {message}");
                }
            }
        }
    }

    #[test]
    fn persistence_settings_take_redis_names_and_refuse_what_is_not_built() {
        use crate::persistence::{AppendFsync, SaveRule};
        let validate = |text: String| RawConfig::parse(&text).unwrap().validate();
        let config = validate(format!(
            "appendonly = \"yes\"\nappendfsync = \"everysec\"\nsave = \"900 1 60 5\"\n{GOOD}"
        ))
        .unwrap();
        assert!(config.persistence.appendonly);
        assert_eq!(config.persistence.appendfsync, AppendFsync::Everysec);
        let rules = vec![SaveRule { seconds: 900, changes: 1 }, SaveRule { seconds: 60, changes: 5 }];
        assert_eq!(config.persistence.save, rules);
        assert!(validate(format!("save = \"\"\n{GOOD}")).unwrap().persistence.save.is_empty());
        assert!(!validate(GOOD.to_string()).unwrap().persistence.appendonly, "Redis' default: no");
        let craq = validate(format!("protocol = \"craq\"\nappendonly = \"yes\"\n{GOOD}")).unwrap();
        assert!(craq.persistence.appendonly);
        assert!(!validate(format!("protocol = \"zab\"\n{GOOD}")).unwrap().persistence.appendonly);
        let zab = validate(format!("protocol = \"zab\"\nappendonly = \"yes\"\n{GOOD}")).unwrap();
        assert!(zab.persistence.appendonly);
        for (bad, field) in [
            ("protocol = \"zab\"\nappendonly = true\nmembership = false", "appendonly"),
            ("protocol = \"chain\"\nappendonly = true\nmembership = false", "appendonly"),
            ("appendonly = \"maybe\"", "appendonly"),
            ("appendfsync = \"sometimes\"", "appendfsync"),
            ("save = \"900\"", "save"),
            ("save = \"x 1\"", "save"),
            ("appendonly_storage = \"tape\"", "appendonly_storage"),
        ] {
            let error = validate(format!("{bad}\n{GOOD}")).unwrap_err().to_string();
            assert!(error.contains(field), "{bad}: {error}");
        }
    }

    #[test]
    fn tls_settings_take_redis_names_and_say_what_is_missing() {
        let text = format!(
            "tls-port = 6390\ntls-cert-file = \"n.pem\"\ntls-key-file = \"n.key\"\ntls-ca-cert-file = \"ca.pem\"\ntls-replication = true\n{GOOD}"
        );
        let tls = RawConfig::parse(&text).unwrap().validate().unwrap().tls.unwrap();
        assert_eq!(tls.client_port, Some(6390));
        assert!(tls.cluster && tls.auth_clients);
        assert_eq!(tls.files.ca_cert_file, Some(PathBuf::from("ca.pem")));
        let no_key = format!("tls_port = 6390\ntls_cert_file = \"n.pem\"\n{GOOD}");
        assert!(error_of(&no_key).contains("`tls_key_file`"));
        let no_ca = format!("tls_port = 6390\ntls_cert_file = \"n.pem\"\ntls_key_file = \"n.key\"\n{GOOD}");
        assert!(error_of(&no_ca).contains("`tls_ca_cert_file`"));
        let anonymous_clients = format!("tls_auth_clients = false\n{no_ca}");
        let tls = RawConfig::parse(&anonymous_clients).unwrap().validate().unwrap().tls.unwrap();
        assert!(!tls.cluster && !tls.auth_clients);
        let cluster_without_ca =
            format!("tls_cluster = true\ntls_cert_file = \"n.pem\"\ntls_key_file = \"n.key\"\n{GOOD}");
        assert!(error_of(&cluster_without_ca).contains("`tls_ca_cert_file`"));
        assert!(error_of(&format!("tls_cert_file = \"n.pem\"\n{GOOD}")).contains("has no effect"));
        assert!(RawConfig::parse(GOOD).unwrap().validate().unwrap().tls.is_none());
    }

    #[test]
    fn flags_override_the_file() {
        let overrides = RawConfig { client_addr: Some("127.0.0.1:9999".into()), ..RawConfig::default() };
        let config = RawConfig::parse(GOOD).unwrap().merge(overrides).validate().unwrap();
        assert_eq!(config.client_addr.port(), 9999);
    }

    #[test]
    fn chain_shape_is_named_or_overridden_and_only_applies_to_chain() {
        let config = RawConfig::parse(&format!("protocol = \"chain\"\n{GOOD}")).unwrap().validate().unwrap();
        assert_eq!(config.chain_layout, chorus_chain::ChainLayout::server());
        let text = format!("protocol = \"chain\"\nchain_shape = \"kernel\"\n{GOOD}");
        let config = RawConfig::parse(&text).unwrap().validate().unwrap();
        assert_eq!(config.chain_layout, chorus_chain::ChainLayout::kernel_slot());
        let text = format!("protocol = \"chain\"\nchain_shape = \"kernel\"\nchain_index_slots = 64\n{GOOD}");
        let config = RawConfig::parse(&text).unwrap().validate().unwrap();
        assert_eq!(config.chain_layout.index_slots, 64);
        assert_eq!(config.chain_layout.txn.log_bytes, 256 * 1024);
        assert!(error_of(&format!("protocol = \"chain\"\nchain_shape = \"big\"\n{GOOD}"))
            .contains("`chain_shape`"));
        assert!(
            error_of(&format!("protocol = \"chain\"\nchain_log_bytes = 12\n{GOOD}")).contains("log_bytes")
        );
        assert!(error_of(&format!("chain_shape = \"kernel\"\n{GOOD}"))
            .contains("only applies to protocol \"chain\""));
    }

    #[test]
    fn raftlog_options_parse_and_only_apply_to_raftlog() {
        let text = format!(
            "protocol = \"raftlog\"\nraftlog_logs = 2\nraftlog_batch_max = 1\nraftlog_flush = \"none\"\nraftlog_execution = \"decoupled\"\nraftlog_transactions = \"locking\"\nraftlog_leaders = \"together\"\n{GOOD}"
        );
        let config = RawConfig::parse(&text).unwrap().validate().unwrap();
        assert_eq!(config.raftlog.logs, 2);
        assert_eq!(config.raftlog.batch_commands_max, 1);
        assert_eq!(config.raftlog.flush, chorus_raftlog::disk::FlushBackend::None);
        assert!(config.raftlog.decoupled);
        assert!(!config.raftlog.ganged);
        assert_eq!(config.raftlog.leaders, chorus_raftlog::LeaderPlacement::Together);
        assert!(error_of(&format!("raftlog_logs = 2\n{GOOD}")).contains("`raftlog_logs`"));
        assert!(
            error_of(&format!("protocol = \"raftlog\"\nraftlog_logs = 0\n{GOOD}")).contains("`raftlog_logs`")
        );
        assert!(error_of(&format!("protocol = \"raftlog\"\nraftlog_execution = \"later\"\n{GOOD}"))
            .contains("`raftlog_execution`"));
        assert!(error_of(&format!("protocol = \"raftlog\"\nraftlog_transactions = \"2pc\"\n{GOOD}"))
            .contains("`raftlog_transactions`"));
        assert!(error_of(&format!("protocol = \"raftlog\"\nraftlog_leaders = \"near\"\n{GOOD}"))
            .contains("`raftlog_leaders`"));
        assert!(error_of(&format!("raftlog_leaders = \"together\"\n{GOOD}")).contains("`raftlog_leaders`"));
    }

    #[test]
    fn event_loops_are_for_hermes_craq_and_zab() {
        let loops_of = |text: String| RawConfig::parse(&text).unwrap().validate().unwrap().event_loops;
        assert_eq!(loops_of(GOOD.to_string()), 1);
        assert_eq!(loops_of(format!("event_loops = 4\n{GOOD}")), 4);
        assert_eq!(loops_of(format!("protocol = \"craq\"\nevent_loops = 2\n{GOOD}")), 2);
        assert_eq!(loops_of(format!("protocol = \"zab\"\nevent_loops = 2\n{GOOD}")), 2);
        assert!((1..=crate::loops::EVENT_LOOPS_MAX).contains(&loops_of(format!("event_loops = 0\n{GOOD}"))));
        assert_eq!(loops_of(format!("protocol = \"raftlog\"\nevent_loops = 1\n{GOOD}")), 1);
        let raftlog = error_of(&format!("protocol = \"raftlog\"\nevent_loops = 2\n{GOOD}"));
        assert!(raftlog.contains("`event_loops`") && raftlog.contains("raftlog_shards"), "{raftlog}");
        assert!(error_of(&format!("protocol = \"chain\"\nevent_loops = 2\n{GOOD}")).contains("`event_loops`"));
        assert!(error_of(&format!("event_loops = 65\n{GOOD}")).contains("at most 64"));
    }

    fn error_of(text: &str) -> String {
        match RawConfig::parse(text).and_then(RawConfig::validate) {
            Ok(_) => panic!("accepted: {text}"),
            Err(ConfigError(message)) => {
                assert!(!message.contains('\n'), "one line: {message}");
                message
            }
        }
    }

    #[test]
    fn redis_names_and_sizes_parse() {
        assert_eq!(parse_memory("1gb"), Some(1 << 30));
        assert_eq!(parse_memory("512MB"), Some(512 << 20));
        assert_eq!(parse_memory("100k"), Some(100_000));
        assert_eq!(parse_memory("7"), Some(7));
        assert_eq!(parse_memory("1tb"), None);
        assert_eq!(parse_memory("mb"), None);
        assert_eq!(parse_memory("1k"), Some(1000));
        assert_eq!(parse_memory("99999999999999999999gb"), None, "overflow is refused, not wrapped");
        let text = format!(
            "maxmemory = \"64mb\"\ntimeout = 30\n\"tcp-keepalive\" = 60\n\"proto-max-bulk-len\" = 2097152\n\"client-query-buffer-limit\" = \"2mb\"\n{GOOD}"
        );
        let clients = RawConfig::parse(&text).unwrap().validate().unwrap().clients;
        assert_eq!(clients.maxmemory_bytes, 64 << 20);
        assert_eq!(clients.idle_timeout_s, 30);
        assert_eq!(clients.tcp_keepalive_s, 60);
        assert_eq!(clients.proto_max_bulk_len, 2 << 20);
        assert_eq!(clients.query_buffer_bytes_max, 2 << 20);
        let defaults = RawConfig::parse(GOOD).unwrap().validate().unwrap().clients;
        assert_eq!(defaults, ClientLimits::default());
        assert!(error_of(&format!("maxmemory = \"lots\"\n{GOOD}")).contains("`maxmemory`"));
        assert!(error_of(&format!("\"maxmemory-policy\" = \"allkeys-lru\"\n{GOOD}")).contains("noeviction"));
    }

    #[test]
    fn protected_mode_refuses_an_open_client_port_without_a_password() {
        let open = GOOD.replace("client_addr = \"127.0.0.1:7380\"", "client_addr = \"0.0.0.0:7380\"");
        let message = error_of(&open);
        assert!(message.contains("`protected-mode`") && message.contains("requirepass"), "{message}");
        let with_password = format!("requirepass = \"pw\"\n{open}");
        RawConfig::parse(&with_password).unwrap().validate().unwrap();
        for off in ["\"protected-mode\" = \"no\"", "\"protected-mode\" = false"] {
            RawConfig::parse(&format!("{off}\n{open}")).unwrap().validate().unwrap();
        }
        assert!(error_of(&format!("\"protected-mode\" = \"maybe\"\n{open}")).contains("yes nor no"));
    }

    #[test]
    fn errors_name_the_field() {
        assert!(error_of("cluster_token = \"s\"\n[peers]\n0 = \"127.0.0.1:1\"").contains("`node_id`"));
        assert!(error_of(&GOOD.replace("cluster_token = \"secret-secret-secret\"", ""))
            .contains("`cluster_token`"));
        let short = error_of(&GOOD.replace("secret-secret-secret", "secret"));
        assert!(short.contains("`cluster_token`") && short.contains("at least 16"), "{short}");
        assert!(error_of(&GOOD.replace("127.0.0.1:7380", "localhost")).contains("`client_addr`"));
        assert!(error_of(&GOOD.replace("1 = \"127.0.0.1:8380\"", "")).contains("`peers`"));
        assert!(error_of(&format!("protocol = \"paxos\"\n{GOOD}")).contains("`protocol`"));
        assert!(
            error_of(&format!("protocol = \"zab\"\nzab_reads = \"fast\"\n{GOOD}")).contains("`zab_reads`")
        );
        assert!(
            error_of(&format!("protocol = \"craq\"\nzab_reads = \"local\"\n{GOOD}")).contains("`zab_reads`")
        );
        assert!(error_of(&format!("worker_threads = 0\n{GOOD}")).contains("`worker_threads`"));
        let typo = error_of(&format!("nodeid = 3\n{GOOD}"));
        assert!(typo.contains("nodeid") && typo.contains("line 1"), "{typo}");
        let wrong_type = error_of(&GOOD.replace("node_id = 1", "node_id = \"one\""));
        assert!(wrong_type.contains("line 2") && wrong_type.contains("`node_id`"), "{wrong_type}");
    }
}
