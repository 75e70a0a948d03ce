//! The performance model: the real protocol cores (the same ones the server and the
//! correctness simulator run) driven under virtual time, where every event costs CPU time on
//! its node and every message costs NIC time ([`costs`]), so queueing at cores and links
//! follows from the events. `chorus model` runs it; docs/model.md says what it models and what
//! it leaves out.
//!
//! Its event loop ([`engine`]) is separate from the swarm simulator's (crate::simulator): no
//! faults, fixed latencies, measured clients. The swarms therefore replay exactly as before.

pub mod costs;
mod engine;
pub mod timing;

use bytes::Bytes;
use chorus_core::{Command, NodeId, NodeSet, Outcome, Replica, Time};
use chorus_craq::{Craq, CraqConfig};
use chorus_hermes::{Hermes, HermesConfig};
use chorus_raftlog::disk::DurableRaftLog;
use chorus_raftlog::RaftLogConfig;
use chorus_zab::{Zab, ZabConfig};
use serde::Serialize;

pub use costs::{CostTable, Network};
pub use engine::{resp_reply_bytes, resp_request_bytes};

use crate::rng::Rng;

/// The protocols the model runs.
pub const PROTOCOLS: &[&str] = &["hermes", "craq", "zab", "raftlog"];

/// The operation mix: uniform keys, reads and blind writes of fixed-size values.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Workload {
    pub name: String,
    pub write_percent: u32,
    pub keys: u64,
    pub value_bytes: usize,
}

impl Workload {
    /// `kv-wX` (X% writes), or `ycsb-a` (50%), `ycsb-b` (5%), `ycsb-c` (0%) with YCSB's
    /// mixes but uniform keys (no Zipf skew yet).
    pub fn named(name: &str) -> Option<Workload> {
        let write_percent = match name {
            "ycsb-a" => 50,
            "ycsb-b" => 5,
            "ycsb-c" => 0,
            _ => name.strip_prefix("kv-w")?.parse().ok().filter(|percent| *percent <= 100)?,
        };
        Some(Workload { name: name.into(), write_percent, keys: 100_000, value_bytes: 32 })
    }
}

/// How clients offer load.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Load {
    /// Each client sends its next request as soon as the previous one is answered.
    Closed,
    /// Requests arrive at this total rate (Poisson), whether or not earlier ones are answered.
    Open { ops_per_s: u64 },
}

#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub protocol: String,
    pub nodes: usize,
    /// Cores per machine, and so threads per node.
    pub cores: u32,
    /// `Some(cores)`: every node and the load generator share ONE machine of this many cores
    /// (a loopback run: `chorus model compare`), each node still running on at most `cores`
    /// threads (the server's `worker_threads`).
    pub host_cores: Option<u32>,
    pub network: Network,
    pub costs: CostTable,
    pub workload: Workload,
    pub clients: u32,
    pub load: Load,
    /// Leaders elected, caches warm: nothing before this is measured.
    pub warmup: Time,
    /// The measured window after the warm-up.
    pub duration: Time,
    pub tick_period: Time,
    pub seed: u64,
}

impl ModelConfig {
    pub fn new(protocol: &str, nodes: usize, cores: u32, network: Network, clients: u32) -> ModelConfig {
        ModelConfig {
            protocol: protocol.into(),
            nodes,
            cores,
            host_cores: None,
            network,
            costs: CostTable::placeholder(),
            workload: Workload::named("kv-w5").expect("a known workload"),
            clients,
            load: Load::Closed,
            // Raftlog elects its leaders after 100-160 ms.
            warmup: Time::from_millis(400),
            duration: Time::from_millis(200),
            tick_period: Time::from_millis(1),
            seed: 1,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Latency {
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub mean_us: f64,
}

/// A prediction.
#[derive(Clone, Debug, Serialize)]
pub struct ModelReport {
    pub protocol: String,
    pub nodes: usize,
    pub cores: u32,
    pub host_cores: Option<u32>,
    pub network: Network,
    pub workload: Workload,
    pub clients: u32,
    pub load: Load,
    pub costs: CostTable,
    pub duration_ms: u64,
    /// Successful operations completed in the measured window, per second.
    pub throughput_ops_per_s: f64,
    /// Of the operations invoked and completed within the window.
    pub latency: Latency,
    pub ops_measured: u64,
    /// Operations answered with an error (not serving, no leader yet) in the window.
    pub errors: u64,
    /// The busiest node's cores, protocol thread and NIC direction, busy over the whole run
    /// (0 to 1): which resource saturates. On a shared host, the cores are the host's.
    pub cpu_utilisation_max: f64,
    pub protocol_thread_utilisation_max: f64,
    pub nic_utilisation_max: f64,
    /// Every node's CPU over the window per operation completed in it, in microseconds.
    pub nodes_cpu_us_per_op: f64,
    pub events: u64,
}

/// Run the model for `config`. Errors name what is wrong with it.
pub fn predict(config: &ModelConfig) -> Result<ModelReport, String> {
    if !(1..=NodeId::COUNT_MAX).contains(&config.nodes) {
        return Err(format!("--nodes must be between 1 and {}", NodeId::COUNT_MAX));
    }
    if !(1..=1024).contains(&config.cores) {
        return Err("--cores must be between 1 and 1024".into());
    }
    if config.host_cores.is_some_and(|cores| !(1..=1024).contains(&cores)) {
        return Err("a shared host needs between 1 and 1024 cores".into());
    }
    if config.clients == 0 {
        return Err("--clients must be at least 1".into());
    }
    if config.network.bandwidth_bits_per_s == 0 {
        return Err("the network's bandwidth must be positive".into());
    }
    let all: NodeSet = (0..config.nodes as u8).map(NodeId).collect();
    match config.protocol.as_str() {
        "hermes" => Ok(run(config, build_all(config, |me| Hermes::new(HermesConfig::new(me, all))))),
        "craq" => Ok(run(config, build_all(config, |me| Craq::new(CraqConfig::new(me, all))))),
        "zab" => Ok(run(config, build_all(config, |me| Zab::new(ZabConfig::new(me, all))))),
        "raftlog" => Ok(run(config, build_all(config, |me| raftlog_syncing(me, all)))),
        other => Err(format!("unknown protocol {other:?}: the model runs {}", PROTOCOLS.join(", "))),
    }
}

fn build_all<P>(config: &ModelConfig, build: impl Fn(NodeId) -> P) -> Vec<P> {
    (0..config.nodes as u8).map(|node| build(NodeId(node))).collect()
}

/// Raftlog as the server runs it with a data directory: every turn that produced durable
/// records syncs them (charged `sync_ns`). The records themselves are dropped: the model
/// needs to know that a turn syncs, not what it wrote (a simulated disk copies whole files
/// at every sync, far too slow for millions of turns).
fn raftlog_syncing(me: NodeId, all: NodeSet) -> DurableRaftLog {
    let mut config = RaftLogConfig::new(me, all);
    config.durable = true;
    DurableRaftLog::in_memory(config)
}

fn run<P>(config: &ModelConfig, replicas: Vec<P>) -> ModelReport
where
    P: Replica,
    P::Message: chorus_core::codec::WireMessage,
{
    let warmup_ns = config.warmup.as_nanos();
    let end_ns = warmup_ns + config.duration.as_nanos();
    let mut clients = ClientSet::new(config, warmup_ns, end_ns);
    // Clients spread over the nodes round-robin, as `chorus bench` connects them.
    let client_node =
        (0..config.clients).map(|client| NodeId((client as usize % config.nodes) as u8)).collect();
    let engine = engine::Engine::new(
        replicas,
        engine::Placement { threads: config.cores, host_cores: config.host_cores },
        config.costs.clone(),
        config.network.clone(),
        config.tick_period.as_nanos(),
        &mut clients,
        client_node,
    );
    let measured = engine.run(warmup_ns, end_ns);
    let window_s = config.duration.as_nanos() as f64 / 1e9;
    let utilisation = |busy: &[u64], capacity: f64| {
        busy.iter().map(|ns| *ns as f64 / (measured.end_ns as f64 * capacity)).fold(0.0, f64::max)
    };
    let nic = utilisation(&measured.egress_busy_ns, 1.0).max(utilisation(&measured.ingress_busy_ns, 1.0));
    ModelReport {
        protocol: config.protocol.clone(),
        nodes: config.nodes,
        cores: config.cores,
        host_cores: config.host_cores,
        network: config.network.clone(),
        workload: config.workload.clone(),
        clients: config.clients,
        load: config.load,
        costs: config.costs.clone(),
        duration_ms: config.duration.as_millis(),
        throughput_ops_per_s: clients.completed_in_window as f64 / window_s,
        latency: percentiles(&mut clients.latencies_ns),
        ops_measured: clients.latencies_ns.len() as u64,
        errors: clients.errors,
        cpu_utilisation_max: match config.host_cores {
            Some(cores) => {
                let busy = measured.node_busy_ns.iter().sum::<u64>() + measured.client_busy_ns;
                utilisation(&[busy], cores as f64)
            }
            None => utilisation(&measured.node_busy_ns, config.cores as f64),
        },
        protocol_thread_utilisation_max: utilisation(&measured.protocol_busy_ns, 1.0),
        nic_utilisation_max: nic,
        nodes_cpu_us_per_op: measured.window_nodes_busy_ns as f64
            / 1e3
            / clients.completed_in_window.max(1) as f64,
        events: measured.events,
    }
}

fn percentiles(samples_ns: &mut [u64]) -> Latency {
    if samples_ns.is_empty() {
        return Latency::default();
    }
    samples_ns.sort_unstable();
    let at = |fraction: f64| {
        let index = ((samples_ns.len() as f64 * fraction).ceil() as usize).clamp(1, samples_ns.len()) - 1;
        samples_ns[index] as f64 / 1e3
    };
    let mean = samples_ns.iter().sum::<u64>() as f64 / samples_ns.len() as f64 / 1e3;
    Latency { p50_us: at(0.50), p90_us: at(0.90), p99_us: at(0.99), mean_us: mean }
}

/// The simulated clients and what they measured.
struct ClientSet {
    rng: Rng,
    workload: Workload,
    load: Load,
    clients: u32,
    value: Bytes,
    warmup_ns: u64,
    end_ns: u64,
    completed_in_window: u64,
    errors: u64,
    latencies_ns: Vec<u64>,
}

impl ClientSet {
    fn new(config: &ModelConfig, warmup_ns: u64, end_ns: u64) -> ClientSet {
        ClientSet {
            rng: Rng::new(config.seed),
            workload: config.workload.clone(),
            load: config.load,
            clients: config.clients,
            value: Bytes::from(vec![b'v'; config.workload.value_bytes]),
            warmup_ns,
            end_ns,
            completed_in_window: 0,
            errors: 0,
            latencies_ns: Vec::new(),
        }
    }

    /// An exponential gap for one client of an open loop offering `ops_per_s` in total.
    fn open_gap_ns(&mut self, ops_per_s: u64) -> u64 {
        let mean_ns = self.clients as f64 * 1e9 / ops_per_s.max(1) as f64;
        let unit = self.rng.unit().max(f64::MIN_POSITIVE);
        (-unit.ln() * mean_ns) as u64 + 1
    }
}

impl engine::Clients for ClientSet {
    fn initial(&mut self) -> Vec<(u64, u32)> {
        (0..self.clients)
            .map(|client| match self.load {
                // Spread over the first tick, so closed-loop clients do not move in lockstep.
                Load::Closed => (self.rng.below(1_000_000), client),
                Load::Open { ops_per_s } => (self.open_gap_ns(ops_per_s), client),
            })
            .collect()
    }

    fn command(&mut self, _client: u32, now: u64) -> Option<(Command, Option<u64>)> {
        if now >= self.end_ns {
            return None;
        }
        let key = Bytes::from(format!("key:{:012}", self.rng.below(self.workload.keys)));
        let command = if self.rng.below(100) < self.workload.write_percent as u64 {
            Command::Write { key, value: Some(self.value.clone()) }
        } else {
            Command::Read { key }
        };
        let next = match self.load {
            Load::Closed => None,
            Load::Open { ops_per_s } => Some(now + self.open_gap_ns(ops_per_s)),
        };
        Some((command, next))
    }

    fn completed(&mut self, _client: u32, invoked: u64, now: u64, outcome: &Outcome) -> Option<u64> {
        let in_window = (self.warmup_ns..=self.end_ns).contains(&now);
        if matches!(outcome, Outcome::Error(_)) {
            self.errors += in_window as u64;
        } else if in_window {
            self.completed_in_window += 1;
            if invoked >= self.warmup_ns {
                self.latencies_ns.push(now - invoked);
            }
        }
        matches!(self.load, Load::Closed).then_some(now)
    }
}
