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
pub mod workload;

use chorus_core::{Command, NodeId, NodeSet, Outcome, Replica, Time};
use chorus_craq::{Craq, CraqConfig};
use chorus_hermes::{Hermes, HermesConfig};
use chorus_raftlog::disk::DurableRaftLog;
use chorus_raftlog::RaftLogConfig;
use chorus_zab::{ReadMode, Zab, ZabConfig};
use serde::Serialize;

pub use costs::{CostTable, Network, ProtocolHandlers};
pub use engine::{resp_reply_bytes, resp_request_bytes};
pub use workload::{Distribution, Mix, OpKind, Workload, Zipfian};

use engine::{AfterReply, Issued, Layout, MachineSpec};
use workload::Generator;

/// The protocols the model runs (`zab-local`: ZAB with local, sequentially consistent reads,
/// the Hermes paper's rZAB; `zab`: reads after a sync, linearizable). The chain store runs
/// through [`predict_with`] (its crate builds on this one).
pub const PROTOCOLS: &[&str] = &["hermes", "craq", "zab", "zab-local", "raftlog"];

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
    /// Replicas per group.
    pub nodes: usize,
    /// Cores per machine.
    pub cores: u32,
    /// Event loops per node: independent instances of the protocol core over disjoint keys
    /// (the server's `event_loops`, raftlog's `raftlog_shards`), each its own protocol thread.
    pub loops: usize,
    /// Replica groups of `nodes` replicas each (the scale-out issue's shards): keys go to
    /// groups by slot, every group on machines of its own unless `groups_share_machines`.
    pub groups: usize,
    /// Every group on the same `nodes` machines (tenants of a multi-tenant host), client `c`
    /// talking only to group `c % groups`.
    pub groups_share_machines: bool,
    /// Threads per protocol instance (how many of its stages run at once). `None`: the
    /// machine's cores (a process with a thread per core); `Some(1)`: a single-threaded
    /// process (the default server, a Naïve-RDMA replica).
    pub threads: Option<u32>,
    /// `Some(slice)`: every machine's cores run a CPU-bound background load whenever no
    /// replica work holds them, in slices of this length (co-located tenants, stress-ng).
    pub background_slice: Option<Time>,
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
    /// When the clients start (before the warm-up ends, so queues are full by then): at the
    /// start by default. Later starts keep the protocols' elections free of client traffic
    /// and the run short where every operation is many events.
    pub clients_start: Time,
    pub tick_period: Time,
    pub seed: u64,
    /// Raftlog's logs per node (Cyclone's physical logs; the server's `raftlog_logs`, default
    /// 8), split evenly over the `loops` (the server's `raftlog_shards`).
    pub raftlog_logs: usize,
    /// Raftlog's `raftlog_batch_max`: the most commands one entry carries (1: no batching).
    pub raftlog_batch_commands_max: usize,
    /// Time every call of the cores' `on_client` and `on_message` in wall-clock time (for
    /// `chorus model calibrate`: [`ModelReport::handlers`]); the prediction is unchanged.
    pub time_handlers: bool,
    /// A node's send stage writes each reply, then each peer frame, as a system call of its
    /// own, and each leaves when the thread has made it (the reactor's `write_clients`, then
    /// `flush_links`), instead of all at the stage's end. Off by default: docs/model.md,
    /// "Writes one by one" (session 20) says what it moves.
    pub writes_one_by_one: bool,
    /// Raftlog flushes its logs once per event-loop turn, at its end (the server's
    /// `raftlog_flush_per_turn`, default on), rather than after every call.
    pub raftlog_flush_per_turn: bool,
    /// A turn that syncs sends what may leave before its sync (`Replica::leaves_before_sync`:
    /// a raftlog leader's appends, a follower's forwards) in frames of their own, ahead of the
    /// turn's other frames, as the server's `send_before_sync` does. On by default.
    pub split_frames_at_sync: bool,
}

impl ModelConfig {
    pub fn new(protocol: &str, nodes: usize, cores: u32, network: Network, clients: u32) -> ModelConfig {
        ModelConfig {
            protocol: protocol.into(),
            nodes,
            cores,
            loops: 1,
            groups: 1,
            groups_share_machines: false,
            threads: None,
            background_slice: None,
            host_cores: None,
            network,
            costs: CostTable::placeholder(),
            workload: Workload::named("kv-w5").expect("a known workload"),
            clients,
            load: Load::Closed,
            // Raftlog elects its leaders after 100-160 ms.
            warmup: Time::from_millis(400),
            duration: Time::from_millis(200),
            clients_start: Time::ZERO,
            tick_period: Time::from_millis(1),
            seed: 1,
            raftlog_logs: 8,
            raftlog_batch_commands_max: 1_024,
            time_handlers: false,
            writes_one_by_one: false,
            raftlog_flush_per_turn: true,
            split_frames_at_sync: true,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Latency {
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub mean_us: f64,
}

/// A prediction.
#[derive(Clone, Debug, Serialize)]
pub struct ModelReport {
    pub protocol: String,
    pub nodes: usize,
    pub cores: u32,
    pub loops: usize,
    pub groups: usize,
    pub host_cores: Option<u32>,
    pub network: Network,
    pub workload: Workload,
    pub clients: u32,
    pub load: Load,
    pub costs: CostTable,
    pub duration_ms: f64,
    /// Successful operations completed in the measured window, per second.
    pub throughput_ops_per_s: f64,
    /// Of the operations invoked and completed within the window.
    pub latency: Latency,
    /// The same, of reads (reads and scans) and of writes (updates, inserts,
    /// read-modify-writes) apart.
    pub read_latency: Latency,
    pub write_latency: Latency,
    pub ops_measured: u64,
    /// Operations answered with an error (not serving, no leader yet) in the window.
    pub errors: u64,
    /// The busiest machine's cores, protocol thread and NIC direction, busy over the
    /// measured window (0 to 1, work counted when it starts): which resource saturates. On a shared host, the cores are the host's.
    /// Replica work only: a background load is not counted.
    pub cpu_utilisation_max: f64,
    pub protocol_thread_utilisation_max: f64,
    pub nic_utilisation_max: f64,
    /// Every node's CPU over the window per operation completed in it, in microseconds.
    pub nodes_cpu_us_per_op: f64,
    /// On a shared host, the load generator's CPU per operation, in microseconds, and how
    /// many times per operation one of its threads woke from sleep.
    pub client_cpu_us_per_op: f64,
    pub client_wakes_per_op: f64,
    /// Times a node's thread was woken (by work or its timer), per operation.
    pub nodes_wakes_per_op: f64,
    /// Peer frames sent per operation, and the messages in them: how much the turns batched.
    pub frames_per_op: f64,
    pub messages_per_op: f64,
    /// Turns the nodes' protocol threads took per operation (every node's): how many events
    /// a turn held.
    pub turns_per_op: f64,
    /// With [`ModelConfig::time_handlers`]: the cores' handlers' mean wall time on this
    /// machine, over the whole run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handlers: Option<timing::HandlerTiming>,
    pub events: u64,
}

/// Run the model for `config`. Errors name what is wrong with it.
pub fn predict(config: &ModelConfig) -> Result<ModelReport, String> {
    let all = check(config)?;
    match config.protocol.as_str() {
        "hermes" => predict_with(config, |me, _| Hermes::new(HermesConfig::new(me, all)), None),
        "craq" => predict_with(config, |me, _| Craq::new(CraqConfig::new(me, all)), None),
        "zab" | "zab-local" => {
            let read_mode = if config.protocol == "zab" { ReadMode::Sync } else { ReadMode::Local };
            let build = |me, _| {
                let mut zab = ZabConfig::new(me, all);
                zab.read_mode = read_mode;
                Zab::new(zab)
            };
            predict_with(config, build, None)
        }
        "raftlog" => predict_with(config, |me, shard| raftlog_syncing(config, me, all, shard), None),
        other => Err(format!("unknown protocol {other:?}: the model runs {}", PROTOCOLS.join(", "))),
    }
}

/// The replicas of one group: every node of `config.nodes`.
fn check(config: &ModelConfig) -> Result<NodeSet, String> {
    if !(1..=NodeId::COUNT_MAX).contains(&config.nodes) {
        return Err(format!("--nodes must be between 1 and {}", NodeId::COUNT_MAX));
    }
    if !(1..=1024).contains(&config.cores) {
        return Err("--cores must be between 1 and 1024".into());
    }
    if !(1..=64).contains(&config.loops) {
        return Err("--loops must be between 1 and 64 (the server's EVENT_LOOPS_MAX)".into());
    }
    if !(1..=1024).contains(&config.groups) {
        return Err("--groups must be between 1 and 1024".into());
    }
    if config.host_cores.is_some_and(|cores| !(1..=1024).contains(&cores)) {
        return Err("a shared host needs between 1 and 1024 cores".into());
    }
    if config.protocol == "raftlog" && !config.raftlog_logs.is_multiple_of(config.loops) {
        return Err("raftlog's logs must split evenly over the event loops".into());
    }
    if config.threads == Some(0) {
        return Err("an instance needs at least one thread".into());
    }
    if config.clients == 0 {
        return Err("--clients must be at least 1".into());
    }
    if config.network.bandwidth_bits_per_s == 0 {
        return Err("the network's bandwidth must be positive".into());
    }
    let mix = config.workload.mix;
    if mix.read + mix.update + mix.insert + mix.scan + mix.read_modify_write != 100 {
        return Err("the workload's mix must add up to 100%".into());
    }
    Ok((0..config.nodes as u8).map(NodeId).collect())
}

/// Run the model for `config` with replicas built by `build(member, loop)` (every group
/// builds the same), where the messages `nic_handled` accepts are handled by the receiving
/// NIC instead of its CPU (HyperLoop's offloaded hops; `None`: every message by the CPU). For
/// protocols outside this crate (the chain store), and behind [`predict`].
pub fn predict_with<P>(
    config: &ModelConfig,
    mut build: impl FnMut(NodeId, usize) -> P,
    nic_handled: Option<fn(&P::Message) -> bool>,
) -> Result<ModelReport, String>
where
    P: Replica,
    P::Message: chorus_core::codec::WireMessage,
{
    check(config)?;
    let mut replicas = Vec::with_capacity(config.groups * config.nodes * config.loops);
    for _group in 0..config.groups {
        for member in 0..config.nodes {
            for loop_index in 0..config.loops {
                replicas.push(build(NodeId(member as u8), loop_index));
            }
        }
    }
    Ok(run(config, replicas, nic_handled))
}

/// Raftlog as the server runs it with a data directory: every turn that produced durable
/// records syncs them (charged `sync_ns`). The records themselves are dropped: the model
/// needs to know that a turn syncs, not what it wrote (a simulated disk copies whole files
/// at every sync, far too slow for millions of turns).
/// Shard `shard` of `config.loops` holds its share of the logs, as the server's
/// `open_raftlog_shard`.
fn raftlog_syncing(config: &ModelConfig, me: NodeId, all: NodeSet, shard: usize) -> DurableRaftLog {
    let mut raftlog = RaftLogConfig::new(me, all);
    raftlog.durable = true;
    raftlog.logs = (config.raftlog_logs / config.loops).max(1);
    raftlog.shards = config.loops;
    raftlog.shard = shard;
    raftlog.batch_commands_max = config.raftlog_batch_commands_max.max(1);
    raftlog.flush_at_turn_end = config.raftlog_flush_per_turn;
    DurableRaftLog::in_memory(raftlog)
}

/// Where the machines are: one per node (groups apart or sharing `nodes` machines), or one
/// host for everything.
fn layout(config: &ModelConfig) -> Layout {
    let nodes_total = config.groups * config.nodes;
    let background_slice_ns = config.background_slice.map(|slice| slice.as_nanos());
    let (machine_of_node, machines) = match config.host_cores {
        Some(cores) => (vec![0; nodes_total], vec![MachineSpec { cores, background_slice_ns }]),
        None => {
            let machines = if config.groups_share_machines { config.nodes } else { nodes_total };
            let of_node = (0..nodes_total).map(|node| node % machines).collect();
            (of_node, vec![MachineSpec { cores: config.cores, background_slice_ns }; machines])
        }
    };
    Layout {
        nodes: config.nodes,
        loops: config.loops,
        groups: config.groups,
        machine_of_node,
        machines,
        threads: config.threads.unwrap_or(config.cores),
        shared_host: config.host_cores.is_some(),
        client_per_group: config.groups_share_machines,
    }
}

fn run<P>(config: &ModelConfig, replicas: Vec<P>, nic_handled: Option<fn(&P::Message) -> bool>) -> ModelReport
where
    P: Replica,
    P::Message: chorus_core::codec::WireMessage,
{
    let warmup_ns = config.warmup.as_nanos();
    let end_ns = warmup_ns + config.duration.as_nanos();
    let mut clients = ClientSet::new(config, warmup_ns, end_ns);
    let setup = engine::Setup {
        costs: config.costs.for_protocol(&config.protocol),
        network: config.network.clone(),
        nic_handled,
        time_handlers: config.time_handlers,
        writes_one_by_one: config.writes_one_by_one,
        split_frames_at_sync: config.split_frames_at_sync,
        tick_ns: config.tick_period.as_nanos(),
        record_bytes: config.workload.record_bytes as u64,
    };
    let engine = engine::Engine::new(replicas, layout(config), setup, &mut clients);
    let measured = engine.run(warmup_ns, end_ns);
    let window_s = config.duration.as_nanos() as f64 / 1e9;
    let utilisation = |busy: &[u64], capacity: &dyn Fn(usize) -> f64| {
        busy.iter()
            .enumerate()
            .map(|(index, ns)| *ns as f64 / (measured.window_ns as f64 * capacity(index)))
            .fold(0.0, f64::max)
    };
    let one = |_| 1.0;
    let nic = utilisation(&measured.egress_busy_ns, &one).max(utilisation(&measured.ingress_busy_ns, &one));
    let cpu = match config.host_cores {
        Some(cores) => {
            let busy = measured.machine_busy_ns.iter().sum::<u64>() + measured.client_busy_ns;
            utilisation(&[busy], &|_| cores as f64)
        }
        None => utilisation(&measured.machine_busy_ns, &|index| measured.machine_cores[index] as f64),
    };
    let completed = clients.completed_in_window;
    ModelReport {
        protocol: config.protocol.clone(),
        nodes: config.nodes,
        cores: config.cores,
        loops: config.loops,
        groups: config.groups,
        host_cores: config.host_cores,
        network: config.network.clone(),
        workload: config.workload.clone(),
        clients: config.clients,
        load: config.load,
        costs: config.costs.clone(),
        duration_ms: config.duration.as_nanos() as f64 / 1e6,
        throughput_ops_per_s: completed as f64 / window_s,
        latency: percentiles(&mut clients.all_ns()),
        read_latency: percentiles(&mut clients.reads_ns),
        write_latency: percentiles(&mut clients.writes_ns),
        ops_measured: (clients.reads_ns.len() + clients.writes_ns.len()) as u64,
        errors: clients.errors,
        cpu_utilisation_max: cpu,
        protocol_thread_utilisation_max: utilisation(&measured.protocol_busy_ns, &one),
        nic_utilisation_max: nic,
        nodes_cpu_us_per_op: measured.window_nodes_busy_ns as f64 / 1e3 / completed.max(1) as f64,
        client_cpu_us_per_op: measured.client_busy_ns as f64 / 1e3 / completed.max(1) as f64,
        client_wakes_per_op: measured.client_wakes as f64 / completed.max(1) as f64,
        nodes_wakes_per_op: measured.node_wakes as f64 / completed.max(1) as f64,
        frames_per_op: measured.frames_sent as f64 / completed.max(1) as f64,
        messages_per_op: measured.messages_sent as f64 / completed.max(1) as f64,
        turns_per_op: measured.turns as f64 / completed.max(1) as f64,
        handlers: config.time_handlers.then(|| measured.handlers.timing(&config.protocol)),
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
    Latency { p50_us: at(0.50), p90_us: at(0.90), p99_us: at(0.99), p999_us: at(0.999), mean_us: mean }
}

/// An operation in flight: who issued it, when, what is left of it.
struct InFlight {
    kind: OpKind,
    started_ns: u64,
    /// Replies the current step still waits for.
    outstanding: usize,
    /// The steps after the current one.
    steps: std::collections::VecDeque<Vec<Command>>,
    failed: bool,
}

/// The simulated clients and what they measured.
struct ClientSet {
    generator: Generator,
    load: Load,
    clients: u32,
    start_ns: u64,
    warmup_ns: u64,
    end_ns: u64,
    next_tag: u64,
    in_flight: rustc_hash::FxHashMap<u64, InFlight>,
    completed_in_window: u64,
    errors: u64,
    reads_ns: Vec<u64>,
    writes_ns: Vec<u64>,
}

impl ClientSet {
    fn new(config: &ModelConfig, warmup_ns: u64, end_ns: u64) -> ClientSet {
        ClientSet {
            generator: Generator::new(&config.workload, config.seed),
            load: config.load,
            clients: config.clients,
            start_ns: config.clients_start.as_nanos().min(warmup_ns),
            warmup_ns,
            end_ns,
            next_tag: 0,
            in_flight: Default::default(),
            completed_in_window: 0,
            errors: 0,
            reads_ns: Vec::new(),
            writes_ns: Vec::new(),
        }
    }

    fn all_ns(&self) -> Vec<u64> {
        self.reads_ns.iter().chain(&self.writes_ns).copied().collect()
    }

    /// An exponential gap for one client of an open loop offering `ops_per_s` in total.
    fn open_gap_ns(&mut self, ops_per_s: u64) -> u64 {
        let mean_ns = self.clients as f64 * 1e9 / ops_per_s.max(1) as f64;
        let unit = self.generator.rng().unit().max(f64::MIN_POSITIVE);
        (-unit.ln() * mean_ns) as u64 + 1
    }

    /// An operation ended (its last reply arrived): count it if it ended in the window.
    fn finish(&mut self, operation: InFlight, now: u64) {
        let in_window = (self.warmup_ns..=self.end_ns).contains(&now);
        if operation.failed {
            self.errors += in_window as u64;
        } else if in_window {
            self.completed_in_window += 1;
            if operation.started_ns >= self.warmup_ns {
                let samples = if operation.kind.writes() { &mut self.writes_ns } else { &mut self.reads_ns };
                samples.push(now - operation.started_ns);
            }
        }
    }
}

impl engine::Clients for ClientSet {
    fn initial(&mut self) -> Vec<(u64, u32)> {
        (0..self.clients)
            .map(|client| match self.load {
                // Spread over the first tick, so closed-loop clients do not move in lockstep.
                Load::Closed => (self.start_ns + self.generator.rng().below(1_000_000), client),
                Load::Open { ops_per_s } => (self.start_ns + self.open_gap_ns(ops_per_s), client),
            })
            .collect()
    }

    fn issue(&mut self, _client: u32, now: u64) -> Option<Issued> {
        if now >= self.end_ns {
            return None;
        }
        let operation = self.generator.next_operation();
        let mut steps: std::collections::VecDeque<Vec<Command>> = operation.steps.into();
        let commands = steps.pop_front().expect("an operation has a step");
        let tag = self.next_tag;
        self.next_tag += 1;
        self.in_flight.insert(
            tag,
            InFlight {
                kind: operation.kind,
                started_ns: now,
                outstanding: commands.len(),
                steps,
                failed: false,
            },
        );
        let next_issue = match self.load {
            Load::Closed => None,
            Load::Open { ops_per_s } => Some(now + self.open_gap_ns(ops_per_s)),
        };
        Some(Issued { tag, commands, next_issue })
    }

    fn completed(&mut self, tag: u64, now: u64, outcome: &Outcome) -> AfterReply {
        let Some(operation) = self.in_flight.get_mut(&tag) else { return AfterReply::Wait };
        operation.failed |= matches!(outcome, Outcome::Error(_));
        operation.outstanding -= 1;
        if operation.outstanding > 0 {
            return AfterReply::Wait;
        }
        if !operation.failed {
            if let Some(commands) = operation.steps.pop_front() {
                operation.outstanding = commands.len();
                return AfterReply::Send(commands);
            }
        }
        let operation = self.in_flight.remove(&tag).expect("in flight");
        // A client whose request failed (no leader yet) retries a little later, so an
        // election does not turn into a storm of errors.
        let retry_ns = if operation.failed { 100_000 } else { 0 };
        self.finish(operation, now);
        match self.load {
            Load::Closed => AfterReply::IssueAt(now + retry_ns),
            Load::Open { .. } => AfterReply::Wait,
        }
    }
}
