//! The multi-tenant experiment of HyperLoop §2.2 (Figure 2) and §6.2 (Figures 11-12) on
//! loopback: `T` tenants, each a chain of 3 members on the same 3 hosts, each driven by one
//! closed-loop YCSB-A client (50% reads, 50% updates of 1 KiB values) through the
//! replicated-transaction API ([`chorus_group::txn`]), the way the paper's MongoDB case study (§5.2)
//! replicates: an update takes the group write lock (gCAS), appends a redo record (gWRITE +
//! gFLUSH), executes it with ExecuteAndAdvance (gMEMCPY + gFLUSH, head gWRITE + gFLUSH) and
//! releases the lock; a read is a lock-free read of the tail's database.
//!
//! * [`HostMode::Chorus`]: one host process per host serves every tenant's member;
//! * [`HostMode::Naive`] (Naïve-Event) and [`HostMode::NaivePolling`]: every tenant replica is
//!   its own process (T per host), which must be scheduled to receive, apply and forward.
//!
//! Optionally everything runs a second time with a background load (stress-ng on every core).
//! Per (mode, T, load) point: update latency (average, p50, p95, p99, max), read latency,
//! updates and operations per second, and the CPU time of the host process trees (hosts and
//! their Naïve replicas) per operation, from /proc.
//!
//! On commodity hardware nothing is offloaded to a NIC: what differs between the modes is one
//! process per host against one process per tenant per host under CPU contention.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use chorus_core::Time;
use chorus_region::{default_region_dir, FlushBackend};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use chorus_group::kernel::netlab::NetLab;
use chorus_group::runtime::Datapath;

use crate::group::run::{
    all_sched_fifo, cpu_model, start_hosts, tenant_spec, tree_cpu_us, BackgroundLoad, HostCounters,
    HostsPlan, PerOp,
};
use chorus_group::runtime::{GroupClient, HostMode, KernelEndpoint};
use chorus_group::txn::{TxnCore, TxnLayout, WriteLockAttempt};
use chorus_group::CallerConfig;

/// Members per tenant group (the paper's replica sets of 3).
pub const GROUP_SIZE: usize = 3;
/// A write lock attempt that finds the lock taken retries this often before failing (one client
/// per tenant: the lock is only ever taken by a stuck earlier attempt).
const LOCK_ATTEMPTS_MAX: usize = 100;

/// What serves the tenants in one series of points.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TenantsMode {
    /// The chain on the group primitives ([`HostMode::Chorus`]): one host process per host
    /// serves every tenant's member.
    Chorus,
    /// Naïve-Event ([`HostMode::Naive`]): a replica process per tenant per host.
    Naive,
    /// Naïve-Polling ([`HostMode::NaivePolling`]).
    NaivePolling,
    /// Hermes: one `chorus node --protocol hermes` per host serves every tenant's keys through
    /// RESP. This crate does not start nodes: the caller's [`PointRunner`] runs these points.
    Hermes,
}

impl TenantsMode {
    /// The group host arrangement of this mode; `None` for modes the caller runs.
    pub fn host_mode(self) -> Option<HostMode> {
        match self {
            TenantsMode::Chorus => Some(HostMode::Chorus),
            TenantsMode::Naive => Some(HostMode::Naive),
            TenantsMode::NaivePolling => Some(HostMode::NaivePolling),
            TenantsMode::Hermes => None,
        }
    }

    pub fn is_naive(self) -> bool {
        self.host_mode().is_some_and(HostMode::is_naive)
    }

    pub fn name(self) -> &'static str {
        match self {
            TenantsMode::Hermes => "hermes",
            mode => mode.host_mode().expect("group modes have a host mode").name(),
        }
    }
}

/// Runs the points of modes this crate cannot start ([`TenantsMode::Hermes`]).
pub type PointRunner<'a> = &'a mut dyn FnMut(&PointSpec) -> anyhow::Result<TenantsResult>;

/// One point for a [`PointRunner`].
pub struct PointSpec<'a> {
    pub config: &'a TenantsConfig,
    pub mode: TenantsMode,
    pub tenants: usize,
    /// Whether the background load is running.
    pub loaded: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TenantsConfig {
    pub modes: Vec<TenantsMode>,
    /// Tenant counts, one point each.
    pub tenants: Vec<usize>,
    /// Records per tenant (the database is `records * value_bytes`).
    pub records: u64,
    pub value_bytes: usize,
    /// Fraction of operations that are reads (YCSB-A: 0.5).
    pub read_fraction: f64,
    /// Measured wall-clock time of one point, after the warm-up.
    pub measure_s: f64,
    pub warmup_s: f64,
    /// The largest T run for the Naïve modes (T processes per host); larger T are skipped with
    /// a note in the report.
    pub naive_tenants_max: usize,
    /// The hosts' flush backend ("msync", "clwb", "none").
    pub flush: String,
    /// Start hosts (and Naïve replicas) as processes with this command (ending in
    /// [`chorus_group::runtime::child_main`]). `None`: in this process (tests only; no CPU numbers).
    pub child_command: Option<Vec<String>>,
    pub region_dir: Option<PathBuf>,
    /// Also run every point under this load (e.g. stress-ng on every core).
    pub background_load_command: Option<Vec<String>>,
    /// Niceness the host processes start with (through `nice -n`; negative needs root); Naïve
    /// replicas inherit it from their host. 0: the same priority as the background load.
    #[serde(default)]
    pub replica_nice: i32,
    /// Niceness of the tenants' client threads (negative needs root). The paper's clients run
    /// on other machines, out of the background load's way; on one machine, a negative value
    /// keeps the clients' own scheduling delays out of the measured latency. 0: the same
    /// priority as the background load.
    #[serde(default)]
    pub client_nice: i32,
    /// Run the replicas (host processes, the Naïve replicas they fork, Hermes nodes) and the
    /// tenants' client event loop under SCHED_FIFO priority 1 (needs root); the background
    /// load stays SCHED_OTHER. HyperLoop's data path runs in the NICs and its clients on other
    /// machines, so the tenants' CPU load never deschedules either; on one machine, a
    /// real-time class is how they keep out of its way. Niceness does not apply then.
    #[serde(default)]
    pub fifo: bool,
    /// Run the background load under SCHED_IDLE: it keeps every core busy but yields to any
    /// other thread at once (the scheduler preempts an idle-class task on every wake-up),
    /// the way the paper's NIC data path never waits for the tenants' CPU work. Every replica
    /// and client keeps the default class, so kernel threads (softirqs) are never starved
    /// behind them, as they can be under [`TenantsConfig::fifo`]. Needs no privilege.
    #[serde(default)]
    pub idle_load: bool,
    /// Times every point is measured (each on fresh replicas, the rounds interleaved so that
    /// a noisy minute touches every mode); the report holds each statistic's median.
    #[serde(default = "one_round")]
    pub rounds: usize,
    /// Kernel: the group-host modes run in network namespaces and the chain's hosts serve on
    /// the kernel data path; user: on loopback, in the host processes.
    #[serde(default)]
    pub datapath: Datapath,
    /// Event-loop threads the tenants' clients are spread over (every mode alike).
    #[serde(default = "one_loop")]
    pub client_threads: usize,
    /// Keep the clients' event loops on this CPU (every mode alike); the replicas and the
    /// background load stay free. With [`TenantsConfig::caller_rps_cpus`] naming the other
    /// CPUs, the chain's hops never run on the clients' CPU.
    #[serde(default)]
    pub client_cpu: Option<usize>,
    /// Kernel path: the chain's hosts steer their callers' datagrams to these CPUs (a
    /// hexadecimal mask) with Receive Packet Steering, so every hop runs in those CPUs'
    /// softirq instead of inside the clients' `sendto`
    /// ([`chorus_group::runtime::HostConfig::kernel_caller_rps_cpus`]).
    #[serde(default)]
    pub caller_rps_cpus: Option<String>,
    /// The paper's topology (§6.2, docs/decisions.md entry 13): the clients on a "client
    /// socket", the replica processes, the background load and (kernel path) the chain's
    /// hops on a "replica socket". `None`: every thread anywhere (`--topology shared`).
    #[serde(default)]
    pub sockets: Option<Sockets>,
}

/// Which CPUs play which socket of the paper's server (§6.2: "we co-located replicated
/// RocksDB processes with multiple instances of I/O intensive background tasks ... on the
/// same CPU socket, each serving a YCSB client running on the remote socket of the same
/// server"). Applied alike to every protocol: affinity only, no priority or class.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sockets {
    /// Where the tenants' client event loops (and the bench itself) run.
    pub client_cpus: Vec<usize>,
    /// Where the replica processes (group hosts, the Naïve replicas they fork, Hermes
    /// nodes), the background load and the receive softirq of every replica's network
    /// interface run.
    pub replica_cpus: Vec<usize>,
}

impl Sockets {
    /// CPU 0 the client socket, the others the replica socket; `None` on one CPU.
    pub fn split(cpus: usize) -> Option<Sockets> {
        (cpus >= 2).then(|| Sockets { client_cpus: vec![0], replica_cpus: (1..cpus).collect() })
    }

    /// `taskset -c` syntax.
    pub fn replica_list(&self) -> String {
        cpu_list(&self.replica_cpus)
    }

    /// The replica CPUs as a hexadecimal mask (Receive Packet Steering's syntax).
    pub fn replica_mask(&self) -> String {
        cpu_mask(&self.replica_cpus)
    }

    /// The paper's "number of application threads on each socket is 10x the number of its
    /// CPU cores": background threads for the replica socket.
    pub fn background_threads(&self) -> usize {
        10 * self.replica_cpus.len()
    }
}

fn cpu_list(cpus: &[usize]) -> String {
    cpus.iter().map(usize::to_string).collect::<Vec<_>>().join(",")
}

/// A hexadecimal CPU mask, 32-bit groups separated by commas as sysfs writes them.
fn cpu_mask(cpus: &[usize]) -> String {
    let groups = cpus.iter().max().map_or(1, |max| max / 32 + 1);
    let mut words = vec![0u32; groups];
    for &cpu in cpus {
        words[cpu / 32] |= 1 << (cpu % 32);
    }
    words.iter().rev().map(|word| format!("{word:x}")).collect::<Vec<_>>().join(",")
}

fn one_loop() -> usize {
    1
}

fn one_round() -> usize {
    1
}

impl Default for TenantsConfig {
    /// Figure 2's tenant counts, 10 s per point.
    fn default() -> Self {
        TenantsConfig {
            modes: vec![TenantsMode::Chorus, TenantsMode::Naive],
            tenants: vec![1, 8, 32, 100],
            records: 256,
            value_bytes: 1024,
            read_fraction: 0.5,
            measure_s: 10.0,
            warmup_s: 1.0,
            naive_tenants_max: 100,
            flush: "msync".to_string(),
            child_command: None,
            region_dir: None,
            background_load_command: None,
            replica_nice: 0,
            client_nice: 0,
            fifo: false,
            idle_load: false,
            rounds: 1,
            datapath: Datapath::User,
            client_threads: 1,
            client_cpu: None,
            caller_rps_cpus: None,
            sockets: None,
        }
    }
}

impl TenantsConfig {
    /// `--quick`: T = 1, 8, 32 and 2 s per point (about two minutes with the background load).
    pub fn quick() -> TenantsConfig {
        TenantsConfig { tenants: vec![1, 8, 32], measure_s: 2.0, warmup_s: 0.5, ..TenantsConfig::default() }
    }

    /// What the replica processes' command lines start with: `chrt -f 1` under
    /// [`TenantsConfig::fifo`], else `nice -n N` for a non-zero [`TenantsConfig::replica_nice`].
    /// Processes they fork (Naïve replicas) inherit either.
    /// With [`TenantsConfig::sockets`], `taskset -c <replica CPUs>` first.
    pub fn replica_command_prefix(&self) -> Vec<String> {
        let mut prefix = match &self.sockets {
            Some(sockets) => vec!["taskset".into(), "-c".into(), sockets.replica_list()],
            None => Vec::new(),
        };
        if self.fifo {
            prefix.extend(["chrt", "-f", "1"].map(String::from));
        } else if self.replica_nice != 0 {
            prefix.extend(["nice".into(), "-n".into(), self.replica_nice.to_string()]);
        }
        prefix
    }

    /// The CPUs the clients' event loops keep to: the client socket, else `--client-cpu`.
    fn client_cpus(&self) -> Option<Vec<usize>> {
        match (&self.sockets, self.client_cpu) {
            (Some(sockets), _) => Some(sockets.client_cpus.clone()),
            (None, Some(cpu)) => Some(vec![cpu]),
            (None, None) => None,
        }
    }

    /// The kernel path's RPS mask at the chain hosts' caller interface: the replica socket's
    /// CPUs, else `--caller-rps-cpus`.
    fn caller_rps_mask(&self) -> Option<String> {
        match &self.sockets {
            Some(sockets) => Some(sockets.replica_mask()),
            None => self.caller_rps_cpus.clone(),
        }
    }

    fn layout(&self) -> TxnLayout {
        TxnLayout::new(64 * 1024, self.records * self.value_bytes as u64)
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TenantsResult {
    pub mode: TenantsMode,
    pub tenants: usize,
    pub background_load: bool,
    /// Updates measured (all tenants).
    pub updates: u64,
    pub reads: u64,
    pub update_mean_us: f64,
    pub update_p50_us: f64,
    pub update_p95_us: f64,
    pub update_p99_us: f64,
    pub update_max_us: f64,
    pub read_mean_us: f64,
    pub read_p99_us: f64,
    pub updates_per_s: f64,
    pub ops_per_s: f64,
    /// CPU time of the hosts' process trees per operation (reads and updates), microseconds.
    pub replica_cpu_us_per_op: Option<f64>,
    /// The same CPU time over the wall-clock time: cores the replicas kept busy.
    pub replica_cpu_cores: Option<f64>,
    /// Processes serving the tenants (hosts plus Naïve replicas).
    pub replica_processes: usize,
    pub measured_s: f64,
    /// Rounds behind this point: every statistic above is their median (counts: their sum).
    #[serde(default = "one_round")]
    pub rounds: usize,
    /// Each round's update p99 (µs), to show the spread behind the median.
    #[serde(default)]
    pub update_p99_rounds_us: Vec<f64>,
    /// Whether every replica process (hosts, Hermes nodes) was seen under SCHED_FIFO while
    /// measuring; `None` for in-process hosts.
    #[serde(default)]
    pub replicas_fifo: Option<bool>,
    /// Cores the clients' event loop kept busy (its thread's CPU time over the window): near
    /// 1.0, the clients themselves were the bottleneck. `None` in older reports.
    #[serde(default)]
    pub client_cpu_cores: Option<f64>,
    /// Time the clients' event loops spent runnable but waiting for a CPU (the run-queue
    /// wait of /proc/thread-self/schedstat), over the window: the share of every operation's
    /// latency that is the client's scheduling, not the replicas' work. `None` in older reports.
    #[serde(default)]
    pub client_wait_cores: Option<f64>,
    /// Where the chain's operations were applied (Naïve and Hermes: always user space).
    #[serde(default)]
    pub datapath: Datapath,
    /// The replica processes' user CPU time per operation, microseconds (the target's measure:
    /// at most 2 µs on the kernel path).
    #[serde(default)]
    pub replica_user_cpu_us_per_op: Option<f64>,
    /// User and system CPU, context switches of the replica processes, and the machine's
    /// softirq work, per operation.
    #[serde(default)]
    pub per_op: Option<PerOp>,
}

impl TenantsResult {
    /// The point of several rounds of one (mode, T, load): the median of every statistic,
    /// the sum of the counts.
    fn median_of(rounds: Vec<TenantsResult>) -> TenantsResult {
        let median = |pick: &dyn Fn(&TenantsResult) -> f64| {
            let mut values: Vec<f64> = rounds.iter().map(pick).collect();
            values.sort_by(f64::total_cmp);
            let middle = values.len() / 2;
            if values.len().is_multiple_of(2) {
                (values[middle - 1] + values[middle]) / 2.0
            } else {
                values[middle]
            }
        };
        let median_some = |pick: &dyn Fn(&TenantsResult) -> Option<f64>| {
            rounds.iter().all(|r| pick(r).is_some()).then(|| median(&|r| pick(r).unwrap_or(0.0)))
        };
        let first = &rounds[0];
        TenantsResult {
            mode: first.mode,
            tenants: first.tenants,
            background_load: first.background_load,
            updates: rounds.iter().map(|r| r.updates).sum(),
            reads: rounds.iter().map(|r| r.reads).sum(),
            update_mean_us: median(&|r| r.update_mean_us),
            update_p50_us: median(&|r| r.update_p50_us),
            update_p95_us: median(&|r| r.update_p95_us),
            update_p99_us: median(&|r| r.update_p99_us),
            update_max_us: median(&|r| r.update_max_us),
            read_mean_us: median(&|r| r.read_mean_us),
            read_p99_us: median(&|r| r.read_p99_us),
            updates_per_s: median(&|r| r.updates_per_s),
            ops_per_s: median(&|r| r.ops_per_s),
            replica_cpu_us_per_op: median_some(&|r| r.replica_cpu_us_per_op),
            replica_cpu_cores: median_some(&|r| r.replica_cpu_cores),
            replica_processes: first.replica_processes,
            measured_s: median(&|r| r.measured_s),
            rounds: rounds.len(),
            update_p99_rounds_us: rounds.iter().map(|r| r.update_p99_us).collect(),
            replicas_fifo: rounds
                .iter()
                .map(|r| r.replicas_fifo)
                .collect::<Option<Vec<bool>>>()
                .map(|each| each.into_iter().all(|fifo| fifo)),
            client_cpu_cores: median_some(&|r| r.client_cpu_cores),
            client_wait_cores: median_some(&|r| r.client_wait_cores),
            datapath: first.datapath,
            replica_user_cpu_us_per_op: median_some(&|r| r.replica_user_cpu_us_per_op),
            per_op: rounds.iter().all(|r| r.per_op.is_some()).then(|| {
                let field = |pick: fn(&PerOp) -> f64| median(&|r| r.per_op.as_ref().map_or(0.0, pick));
                PerOp {
                    user_us: field(|p| p.user_us),
                    system_us: field(|p| p.system_us),
                    context_switches: field(|p| p.context_switches),
                    softirq_us: field(|p| p.softirq_us),
                    net_rx_softirqs: field(|p| p.net_rx_softirqs),
                    ksoftirqd_us: field(|p| p.ksoftirqd_us),
                }
            }),
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TenantsReport {
    pub config: TenantsConfig,
    pub cores: usize,
    pub cpu_model: String,
    pub kernel: String,
    pub results: Vec<TenantsResult>,
    /// Points not run, and why.
    pub skipped: Vec<String>,
    pub elapsed_s: f64,
}

impl TenantsReport {
    pub fn find(&self, mode: TenantsMode, tenants: usize, loaded: bool) -> Option<&TenantsResult> {
        self.results.iter().find(|r| r.mode == mode && r.tenants == tenants && r.background_load == loaded)
    }

    pub fn table(&self) -> String {
        let mut text = format!(
            "{:<20} {:<4} {:>4} {:>9} {:>9} {:>9} {:>9} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6}\n",
            "mode",
            "load",
            "T",
            "avg_us",
            "p95_us",
            "p99_us",
            "read_us",
            "updates/s",
            "cpu_us/op",
            "usr_us/op",
            "sirq_us/op",
            "cli_cpu",
            "cli_wait",
            "procs"
        );
        for r in &self.results {
            text.push_str(&format!(
                "{:<20} {:<4} {:>4} {:>9.0} {:>9.0} {:>9.0} {:>9.0} {:>10.0} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6}\n",
                format!("{} ({})", r.mode.name(), r.datapath.name()),
                if r.background_load { "bg" } else { "-" },
                r.tenants,
                r.update_mean_us,
                r.update_p95_us,
                r.update_p99_us,
                r.read_mean_us,
                r.updates_per_s,
                r.replica_cpu_us_per_op.map_or("-".to_string(), |c| format!("{c:.0}")),
                r.replica_user_cpu_us_per_op.map_or("-".to_string(), |c| format!("{c:.1}")),
                r.per_op.map_or("-".to_string(), |p| format!("{:.1}", p.softirq_us)),
                r.client_cpu_cores.map_or("-".to_string(), |c| format!("{c:.2}")),
                r.client_wait_cores.map_or("-".to_string(), |c| format!("{c:.2}")),
                r.replica_processes,
            ));
        }
        for note in &self.skipped {
            text.push_str(&format!("skipped: {note}\n"));
        }
        text
    }
}

/// Run the experiment. Blocking: the tenants' clients run on an event loop of their own thread.
/// Modes without a group host ([`TenantsMode::Hermes`]) are refused: use [`run_with`].
pub fn run(config: TenantsConfig) -> anyhow::Result<TenantsReport> {
    run_with(config, &mut |point: &PointSpec| {
        anyhow::bail!("no runner for {} points (chorus bench tenants runs them)", point.mode.name())
    })
}

/// [`run`], with `external` running the points of modes this crate cannot start, inside the
/// same passes (so under the same background load).
pub fn run_with(config: TenantsConfig, external: PointRunner) -> anyhow::Result<TenantsReport> {
    let flush: FlushBackend = config.flush.parse().map_err(anyhow::Error::msg)?;
    anyhow::ensure!(
        !config.tenants.is_empty() && config.tenants.iter().all(|&t| t >= 1),
        "tenant counts are >= 1"
    );
    anyhow::ensure!(!config.modes.is_empty(), "no protocol to run");
    anyhow::ensure!((0.0..=1.0).contains(&config.read_fraction), "read fraction is 0 to 1");
    anyhow::ensure!(config.records >= 1 && config.value_bytes >= 8, "need records of at least 8 bytes");
    let base = config.region_dir.clone().unwrap_or_else(default_region_dir);
    let dir = base.join(format!("tenants-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    if let Some(sockets) = &config.sockets {
        // The bench itself (and every thread it starts) is on the client socket; replicas
        // and the background load are started under `taskset` on the replica socket.
        pin_thread(&sockets.client_cpus);
    }
    let started = Instant::now();
    let mut results = Vec::new();
    let mut skipped = Vec::new();
    let outcome = (|| {
        run_pass(&config, flush, &dir.join("quiet"), false, external, &mut results, &mut skipped)?;
        if let Some(command) = &config.background_load_command {
            let load = BackgroundLoad::start(command)?;
            // Let the load spread over every core before measuring.
            std::thread::sleep(Duration::from_secs(1));
            let loaded =
                run_pass(&config, flush, &dir.join("loaded"), true, external, &mut results, &mut skipped);
            load.stop();
            loaded?;
        }
        anyhow::Ok(())
    })();
    let _ = std::fs::remove_dir_all(&dir);
    outcome?;
    Ok(TenantsReport {
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        cpu_model: cpu_model(),
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string(),
        results,
        skipped,
        config,
        elapsed_s: started.elapsed().as_secs_f64(),
    })
}

fn run_pass(
    config: &TenantsConfig,
    flush: FlushBackend,
    dir: &std::path::Path,
    loaded: bool,
    external: PointRunner,
    results: &mut Vec<TenantsResult>,
    skipped: &mut Vec<String>,
) -> anyhow::Result<()> {
    let mut points: Vec<(TenantsMode, usize)> = Vec::new();
    for &mode in &config.modes {
        for &tenants in &config.tenants {
            if mode.is_naive() && tenants > config.naive_tenants_max {
                skipped.push(format!(
                    "{} at T={tenants}{}: more than --naive-tenants-max={} tenants ({} replica processes)",
                    mode.name(),
                    if loaded { " (load)" } else { "" },
                    config.naive_tenants_max,
                    tenants * GROUP_SIZE
                ));
            } else {
                points.push((mode, tenants));
            }
        }
    }
    let rounds = config.rounds.max(1);
    let mut measured: Vec<Vec<TenantsResult>> = vec![Vec::with_capacity(rounds); points.len()];
    for round in 0..rounds {
        for (&(mode, tenants), runs) in points.iter().zip(&mut measured) {
            let tag = format!("{}-t{tenants}-r{round}", mode.name());
            let point = match mode.host_mode() {
                Some(host_mode) => run_point(config, flush, &dir.join(tag), host_mode, tenants, loaded),
                None => external(&PointSpec { config, mode, tenants, loaded }),
            }
            .with_context(|| format!("{} with {tenants} tenants", mode.name()))?;
            eprintln!(
                "tenants: {} T={tenants}{}{}: update avg {:.0} us p99 {:.0} us, {:.0} updates/s",
                mode.name(),
                if loaded { " +load" } else { "" },
                if rounds > 1 { format!(" (round {}/{rounds})", round + 1) } else { String::new() },
                point.update_mean_us,
                point.update_p99_us,
                point.updates_per_s
            );
            runs.push(point);
        }
    }
    results.extend(measured.into_iter().map(TenantsResult::median_of));
    Ok(())
}

/// One tenant's measured run.
struct TenantRun {
    updates: Histogram<u64>,
    reads: Histogram<u64>,
    /// From the loop's start to the end of its last operation.
    elapsed: Duration,
}

fn latency_histogram() -> Histogram<u64> {
    Histogram::<u64>::new_with_bounds(1, 600_000_000_000, 3).expect("valid histogram bounds")
}

/// splitmix64: the tenants' key and operation choices, seeded per tenant (reproducible).
fn next_random(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The serving processes of one point.
pub struct Replicas<'a> {
    /// Their CPU time (with their descendants') is charged to the replicas.
    pub pids: &'a [u32],
    /// How many processes serve the tenants (reported).
    pub processes: usize,
}

/// One point's result from its tenants' runs, the window the CPU counters covered and the
/// replicas' CPU time in it.
fn summarize(
    mode: TenantsMode,
    tenants: usize,
    loaded: bool,
    replicas: &Replicas,
    runs: Vec<TenantRun>,
    measured: Duration,
    cpu_us: Option<u64>,
) -> anyhow::Result<TenantsResult> {
    let (mut updates, mut reads) = (latency_histogram(), latency_histogram());
    let mut elapsed_sum = Duration::ZERO;
    for run in runs {
        updates.add(&run.updates).map_err(|e| anyhow::anyhow!("{e:?}"))?;
        reads.add(&run.reads).map_err(|e| anyhow::anyhow!("{e:?}"))?;
        elapsed_sum += run.elapsed;
    }
    // Every tenant measures for the same duration from the same instant: their mean is the window.
    let seconds = (elapsed_sum.as_secs_f64() / tenants.max(1) as f64).max(1e-9);
    let cpu_seconds = measured.as_secs_f64().max(1e-9);
    let ops = updates.len() + reads.len();
    let micros = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    Ok(TenantsResult {
        mode,
        tenants,
        background_load: loaded,
        updates: updates.len(),
        reads: reads.len(),
        update_mean_us: updates.mean() / 1000.0,
        update_p50_us: micros(&updates, 0.5),
        update_p95_us: micros(&updates, 0.95),
        update_p99_us: micros(&updates, 0.99),
        update_max_us: updates.max() as f64 / 1000.0,
        read_mean_us: reads.mean() / 1000.0,
        read_p99_us: micros(&reads, 0.99),
        updates_per_s: updates.len() as f64 / seconds,
        ops_per_s: ops as f64 / seconds,
        replica_cpu_us_per_op: cpu_us.map(|us| us as f64 / ops.max(1) as f64),
        replica_cpu_cores: cpu_us.map(|us| us as f64 / 1e6 / cpu_seconds),
        replica_processes: replicas.processes,
        measured_s: seconds,
        rounds: 1,
        update_p99_rounds_us: vec![micros(&updates, 0.99)],
        replicas_fifo: None,
        client_cpu_cores: None,
        client_wait_cores: None,
        datapath: Datapath::User,
        replica_user_cpu_us_per_op: None,
        per_op: None,
    })
}

/// One tenant's closed-loop client, a task of the tenants' event loop ([`measure_point`]):
/// what a read and an update of a record are in one mode.
pub trait TenantClient: 'static {
    fn read(&mut self, record: u64) -> impl std::future::Future<Output = anyhow::Result<()>>;
    fn update(&mut self, record: u64, value: &[u8]) -> impl std::future::Future<Output = anyhow::Result<()>>;
}

/// How long past its phase a tenant's last operation may take before the point fails.
const STALL_MAX: Duration = Duration::from_secs(30);

/// What a tenant's closed loop does (copied out of the config so that tasks own it).
#[derive(Clone, Copy)]
struct Workload {
    records: u64,
    read_fraction: f64,
    value_bytes: usize,
}

/// Measure one point: `tenants` closed-loop YCSB-A clients, each made by `connect(t)`, warm
/// up, then all measure from the same instant for `config.measure_s`.
///
/// Every client is a task of one of `config.client_threads` event loops, each on its own
/// thread (at the clients' niceness or scheduling class), tenant `t` on loop `t % loops`: the
/// way a load generator drives many connections, at the cost of one thread's wake-ups per
/// batch of replies, not a thread per tenant. With a thread per tenant, 32 tenants' client
/// threads took a third of the CPU the replicas got, at SCHED_FIFO they ran the machine into
/// the real-time throttle, and on the kernel path (where a client never waits: the chain runs
/// inside its `sendto`) 32 always-runnable threads time-sliced each other into a 93 ms p99.
pub fn measure_point<C, F, Fut>(
    config: &TenantsConfig,
    mode: TenantsMode,
    tenants: usize,
    loaded: bool,
    replicas: Replicas,
    connect: F,
) -> anyhow::Result<TenantsResult>
where
    C: TenantClient,
    F: Fn(usize) -> Fut + Sync,
    Fut: std::future::Future<Output = anyhow::Result<C>>,
{
    let measured = measure_on_loops(config, tenants, &replicas, &connect)?;
    let result =
        summarize(mode, tenants, loaded, &replicas, measured.runs, measured.window, measured.cpu_us)?;
    let window_s = measured.window.as_secs_f64().max(1e-9);
    let client_cpu_cores = Some(measured.client_cpu_us as f64 / 1e6 / window_s);
    let client_wait_cores = measured.client_wait_us.map(|wait| wait as f64 / 1e6 / window_s);
    let ops = result.updates + result.reads;
    let per_op = measured.counters.map(|counters| counters.per_op(ops));
    Ok(TenantsResult {
        replicas_fifo: measured.replicas_fifo,
        client_cpu_cores,
        client_wait_cores,
        replica_user_cpu_us_per_op: per_op.map(|p| p.user_us),
        per_op,
        ..result
    })
}

/// Run the tenants on `loops` event-loop threads. Every phase (connect, warm-up, measure)
/// starts and ends on a barrier shared with this thread, which reads the CPU counters while
/// every tenant is idle; a loop that failed still passes every barrier, so none waits forever.
fn measure_on_loops<C, F, Fut>(
    config: &TenantsConfig,
    tenants: usize,
    replicas: &Replicas,
    connect: &F,
) -> anyhow::Result<Measured>
where
    C: TenantClient,
    F: Fn(usize) -> Fut + Sync,
    Fut: std::future::Future<Output = anyhow::Result<C>>,
{
    let measure = Duration::from_secs_f64(config.measure_s.max(0.05));
    let warmup = Duration::from_secs_f64(config.warmup_s.max(0.0));
    let workload = Workload {
        records: config.records,
        read_fraction: config.read_fraction,
        value_bytes: config.value_bytes,
    };
    let loops = config.client_threads.clamp(1, tenants);
    let barrier = std::sync::Barrier::new(loops + 1);
    std::thread::scope(|scope| {
        let mut threads = Vec::with_capacity(loops);
        for l in 0..loops {
            let barrier = &barrier;
            let thread = std::thread::Builder::new().name(format!("tenants-loop-{l}")).spawn_scoped(
                scope,
                move || {
                    schedule_client_thread(config);
                    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
                    let local = tokio::task::LocalSet::new();
                    let mine: Vec<usize> = (l..tenants).step_by(loops).collect();
                    let event_loop = async {
                        let mut clients = Vec::with_capacity(mine.len());
                        for &t in &mine {
                            let client = connect(t).await.with_context(|| format!("tenant {t}: connect"))?;
                            clients.push((client, 0x7e4a_4e75 ^ ((t as u64) << 32)));
                        }
                        anyhow::Ok(clients)
                    };
                    let run = |runtime: &tokio::runtime::Runtime| {
                        let clients = local.block_on(runtime, event_loop);
                        barrier.wait();
                        let warmed = clients.and_then(|clients| {
                            local.block_on(runtime, drive_all(clients, warmup, workload))
                        });
                        barrier.wait();
                        // Every tenant is idle here: the /proc reads stay outside the window.
                        barrier.wait();
                        let cpu_before = thread_cpu_us();
                        let wait_before = thread_wait_us();
                        let done = warmed.and_then(|warmed| {
                            let clients = warmed.into_iter().map(|(client, rng, _)| (client, rng)).collect();
                            local.block_on(runtime, drive_all(clients, measure, workload))
                        });
                        let cpu_us = thread_cpu_us().saturating_sub(cpu_before);
                        let wait_us = thread_wait_us()
                            .zip(wait_before)
                            .map(|(after, before)| after.saturating_sub(before));
                        barrier.wait();
                        done.map(|done| {
                            (
                                done.into_iter().map(|(_, _, run)| run).collect::<Vec<TenantRun>>(),
                                cpu_us,
                                wait_us,
                            )
                        })
                    };
                    match runtime {
                        Ok(runtime) => run(&runtime),
                        Err(error) => {
                            (0..4).for_each(|_| {
                                barrier.wait();
                            });
                            Err(error.into())
                        }
                    }
                },
            )?;
            threads.push(thread);
        }
        barrier.wait();
        barrier.wait();
        let replicas_fifo = all_sched_fifo(replicas.pids);
        let cpu_before = tree_cpu_us(replicas.pids);
        let counters_before = HostCounters::read(replicas.pids);
        let window = Instant::now();
        barrier.wait();
        barrier.wait();
        let window = window.elapsed();
        let cpu_us =
            tree_cpu_us(replicas.pids).zip(cpu_before).map(|(after, before)| after.saturating_sub(before));
        let counters = HostCounters::read(replicas.pids)
            .zip(counters_before)
            .map(|(after, before)| after.since(&before));
        let mut runs = Vec::with_capacity(tenants);
        let mut client_cpu_us = 0;
        let mut client_wait_us = Some(0);
        for thread in threads {
            let (loop_runs, cpu, wait) =
                thread.join().map_err(|_| anyhow::anyhow!("a tenants' event loop panicked"))??;
            runs.extend(loop_runs);
            client_cpu_us += cpu;
            client_wait_us = client_wait_us.zip(wait).map(|(sum, wait)| sum + wait);
        }
        anyhow::ensure!(runs.len() == tenants, "{} of {tenants} tenants reported", runs.len());
        Ok(Measured { runs, window, cpu_us, replicas_fifo, client_cpu_us, client_wait_us, counters })
    })
}

/// What the client event loops bring back from one point.
struct Measured {
    runs: Vec<TenantRun>,
    /// From the CPU counters' first read to the last tenant's end.
    window: Duration,
    /// The replicas' CPU time in the window.
    cpu_us: Option<u64>,
    replicas_fifo: Option<bool>,
    /// The event loops' own CPU time in the window.
    client_cpu_us: u64,
    /// The event loops' run-queue wait in the window (`None` without schedstat).
    client_wait_us: Option<u64>,
    /// The replicas' and the machine's counters over the window.
    counters: Option<HostCounters>,
}

/// CPU time of the calling thread.
fn thread_cpu_us() -> u64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec, which lives for the call.
    let result = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    if result != 0 {
        return 0;
    }
    now.tv_sec as u64 * 1_000_000 + now.tv_nsec as u64 / 1_000
}

/// Time the calling thread has spent runnable but waiting for a CPU (the second field of
/// /proc/thread-self/schedstat, in nanoseconds). `None` where the kernel has no schedstat.
fn thread_wait_us() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let wait_ns: u64 = text.split_whitespace().nth(1)?.parse().ok()?;
    Some(wait_ns / 1_000)
}

/// Run every tenant's closed loop for `duration`, concurrently on the current `LocalSet`;
/// hands the clients (and their random states) back for the next phase.
async fn drive_all<C: TenantClient>(
    clients: Vec<(C, u64)>,
    duration: Duration,
    workload: Workload,
) -> anyhow::Result<Vec<(C, u64, TenantRun)>> {
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|(mut client, mut rng)| {
            tokio::task::spawn_local(async move {
                let run = drive_loop(&mut client, &mut rng, duration, workload).await;
                run.map(|run| (client, rng, run))
            })
        })
        .collect();
    // A tenant checks its deadline between operations, so each task ends at most one operation
    // after `duration`. A replica that stays silent (a starved one is slow, not dead) fails the
    // point here instead of hanging the run, in every mode.
    let deadline = tokio::time::Instant::now() + duration + STALL_MAX;
    let mut done = Vec::with_capacity(tasks.len());
    for (t, task) in tasks.into_iter().enumerate() {
        let finished = tokio::time::timeout_at(deadline, task).await.map_err(|_| {
            anyhow::anyhow!("tenant {t}: no operation completed in {} s", STALL_MAX.as_secs())
        })?;
        done.push(finished.map_err(|e| anyhow::anyhow!("a tenant task failed: {e}"))??);
    }
    Ok(done)
}

/// The closed loop: YCSB-A operations on uniformly chosen records until `duration` is up.
async fn drive_loop(
    client: &mut impl TenantClient,
    rng: &mut u64,
    duration: Duration,
    workload: Workload,
) -> anyhow::Result<TenantRun> {
    let began = Instant::now();
    let mut run =
        TenantRun { updates: latency_histogram(), reads: latency_histogram(), elapsed: Duration::ZERO };
    let deadline = began + duration;
    let mut value = vec![0u8; workload.value_bytes];
    while Instant::now() < deadline {
        let record = next_random(rng) % workload.records;
        let is_read = (next_random(rng) >> 11) as f64 / (1u64 << 53) as f64 <= workload.read_fraction;
        let start = Instant::now();
        if is_read {
            client.read(record).await?;
            run.reads.saturating_record(start.elapsed().as_nanos().max(1) as u64);
        } else {
            value[..8].copy_from_slice(&next_random(rng).to_le_bytes());
            client.update(record, &value).await?;
            run.updates.saturating_record(start.elapsed().as_nanos().max(1) as u64);
        }
    }
    run.elapsed = began.elapsed();
    Ok(run)
}

/// Put the calling (client) thread in the clients' scheduling class: SCHED_FIFO under
/// [`TenantsConfig::fifo`], else `client_nice` (Linux niceness is per thread). Best effort: an
/// unprivileged process cannot raise either, and the run goes on at the inherited priority.
fn schedule_client_thread(config: &TenantsConfig) {
    if let Some(cpus) = config.client_cpus() {
        pin_thread(&cpus);
    }
    // SAFETY: gettid, sched_setscheduler and setpriority on the calling thread; the only
    // memory passed is a sched_param that outlives the call.
    let (result, what) = unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::pid_t;
        if config.fifo {
            let param = libc::sched_param { sched_priority: 1 };
            (libc::sched_setscheduler(tid, libc::SCHED_FIFO, &param), "SCHED_FIFO".to_string())
        } else if config.client_nice != 0 {
            let nice = config.client_nice;
            (libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice), format!("niceness {nice}"))
        } else {
            return;
        }
    };
    if result != 0 {
        eprintln!("tenants: cannot set the clients' {what}: {}", std::io::Error::last_os_error());
    }
}

/// Keep the calling thread (and the threads it starts later) on `cpus`
/// ([`TenantsConfig::client_cpus`]). Best effort, as the other scheduling options: the run
/// goes on unpinned, saying so.
fn pin_thread(cpus: &[usize]) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET and sched_setaffinity on the
    // calling thread (tid 0) only read it.
    let result = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &cpu in cpus {
            libc::CPU_SET(cpu, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if result != 0 {
        eprintln!("tenants: cannot pin to CPUs {}: {}", cpu_list(cpus), std::io::Error::last_os_error());
    }
}

fn run_point(
    config: &TenantsConfig,
    flush: FlushBackend,
    dir: &std::path::Path,
    mode: HostMode,
    tenants: usize,
    loaded: bool,
) -> anyhow::Result<TenantsResult> {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    // Naïve replicas are forked by their host: they inherit its niceness or class.
    let host_prefix = config.replica_command_prefix();
    let lab = match config.datapath {
        Datapath::Kernel => Some(NetLab::create(GROUP_SIZE).map_err(anyhow::Error::msg)?),
        Datapath::User => None,
    };
    if let (Some(lab), Some(sockets)) = (&lab, &config.sockets) {
        // Every host's arrivals from the callers are received in the replica socket's
        // softirq, as a NIC's interrupts would be, whichever protocol serves them.
        lab.steer_caller_arrivals(&sockets.replica_mask()).map_err(anyhow::Error::msg)?;
    }
    let caller_rps_cpus = config.caller_rps_mask();
    // Only the chain has a kernel path; the Naïve modes run in the same namespaces.
    let datapath = if mode == HostMode::Chorus { config.datapath } else { Datapath::User };
    let (hosts, addrs) = runtime.block_on(start_hosts(HostsPlan {
        command: config.child_command.as_deref(),
        host_prefix: &host_prefix,
        flush,
        dir,
        mode,
        hosts: GROUP_SIZE,
        tenants,
        io_timeout_ms: Some(30_000), // a starved Naïve replica is slow, not dead
        start_timeout: Duration::from_secs(30),
        lab: lab.as_ref(),
        datapath,
        caller_rps_cpus: caller_rps_cpus.as_deref(),
    }))?;
    let host_pids = hosts.pids();
    let processes = if mode.is_naive() { GROUP_SIZE * (tenants + 1) } else { GROUP_SIZE };
    let tenants_mode = match mode {
        HostMode::Chorus => TenantsMode::Chorus,
        HostMode::Naive => TenantsMode::Naive,
        HostMode::NaivePolling => TenantsMode::NaivePolling,
    };
    let replicas = Replicas { pids: &host_pids, processes };
    let layout = config.layout();
    let addrs = &addrs;
    let result = measure_point(config, tenants_mode, tenants, loaded, replicas, |t| {
        ChainTenant::initialize(addrs, t, layout, config.value_bytes, datapath)
    })
    .map(|result| TenantsResult { datapath, ..result });
    drop(hosts);
    drop(lab);
    runtime.shutdown_timeout(Duration::from_secs(2));
    result
}

thread_local! {
    /// The kernel path's datagram socket and reader of this event-loop thread, shared by all
    /// its tenants (`KernelEndpoint`): one socket and one reading task per loop, as a load
    /// generator would have, instead of one per tenant.
    static LOOP_ENDPOINT: std::cell::RefCell<Option<Arc<KernelEndpoint>>> = const { std::cell::RefCell::new(None) };
}

/// This event loop's [`LOOP_ENDPOINT`], bound on first use.
async fn loop_endpoint() -> anyhow::Result<Arc<KernelEndpoint>> {
    if let Some(endpoint) = LOOP_ENDPOINT.with(|cell| cell.borrow().clone()) {
        return Ok(endpoint);
    }
    let endpoint = KernelEndpoint::bind().await?;
    LOOP_ENDPOINT.with(|cell| *cell.borrow_mut() = Some(endpoint.clone()));
    Ok(endpoint)
}

/// A tenant of the chain: records at `record * value_bytes` of its region's database. The
/// coordinator is [`TxnCore`] on the async [`GroupClient`], so that every tenant is a task of
/// the clients' event loop.
struct ChainTenant {
    client: GroupClient,
    core: TxnCore,
    tail: usize,
    value_bytes: u64,
}

impl ChainTenant {
    /// Set up tenant `t`'s group.
    async fn initialize(
        addrs: &[SocketAddr],
        t: usize,
        layout: TxnLayout,
        value_bytes: usize,
        datapath: Datapath,
    ) -> anyhow::Result<Self> {
        let mut spec = tenant_spec(addrs, t, format!("tenant{t}"), layout.region_bytes());
        spec.datapath = datapath;
        if datapath == Datapath::Kernel {
            spec.kernel_endpoint = Some(loop_endpoint().await?);
        }
        spec.kernel_caller.window_max = 16;
        // A starved Naïve replica answers late; it has not lost anything (TCP).
        spec.caller =
            CallerConfig { retransmit_after: Time::from_millis(5000), attempts_max: 6, window_max: 16 };
        spec.io_timeout = Duration::from_secs(30);
        let client = GroupClient::initialize(spec).await?;
        anyhow::ensure!(
            client.datapath() == datapath,
            "tenant {t}: the hosts serve on the {} path, not the {} path asked for (see their log)",
            client.datapath().name(),
            datapath.name()
        );
        let tail = client.chain_len() - 1;
        let core = TxnCore::new(layout, t as u32 + 1);
        Ok(ChainTenant { client, core, tail, value_bytes: value_bytes as u64 })
    }

    /// [`chorus_group::txn::Txn::wr_lock`] on the event loop.
    async fn wr_lock(&mut self) -> anyhow::Result<bool> {
        let chain_len = self.client.chain_len();
        let results = self.client.execute(vec![self.core.wr_lock_operation(chain_len)]).await;
        Ok(match self.core.wr_lock_attempt(chain_len, results)? {
            WriteLockAttempt::Held => true,
            WriteLockAttempt::Taken => false,
            WriteLockAttempt::Undo { undo, swapped } => {
                let results = self.client.execute(vec![undo]).await;
                self.core.undone(swapped, results)?;
                false
            }
        })
    }

    async fn append_and_execute(&mut self, offset: u64, value: Bytes) -> anyhow::Result<()> {
        let (operation, appended) = self.core.append_operation(&[(offset, value)])?;
        let results = self.client.execute(vec![operation]).await;
        self.core.appended(appended, results)?;
        while let Some(operations) = self.core.execute_operations() {
            let results = self.client.execute(operations).await;
            self.core.executed(results)?;
        }
        Ok(())
    }
}

impl TenantClient for ChainTenant {
    /// A lock-free read of the tail's database.
    async fn read(&mut self, record: u64) -> anyhow::Result<()> {
        let at = self.core.db_range(record * self.value_bytes, self.value_bytes)?;
        self.client.read(self.tail, at, self.value_bytes).await?;
        Ok(())
    }

    /// One replicated update, the MongoDB case study's shape (HyperLoop §5.2): write lock,
    /// Append of the redo record, ExecuteAndAdvance, unlock.
    async fn update(&mut self, record: u64, value: &[u8]) -> anyhow::Result<()> {
        let mut locked = false;
        for _ in 0..LOCK_ATTEMPTS_MAX {
            if self.wr_lock().await? {
                locked = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        anyhow::ensure!(locked, "the group write lock stayed taken");
        let applied = self.append_and_execute(record * self.value_bytes, Bytes::copy_from_slice(value)).await;
        let chain_len = self.client.chain_len();
        let results = self.client.execute(vec![self.core.wr_unlock_operation(chain_len)]).await;
        let unlocked = self.core.wr_unlocked(chain_len, results);
        applied?;
        unlocked?;
        Ok(())
    }
}

/// Point 4 of the issue, at `tenants` under load: Naïve-Event p99 over `chorus`' p99 (the
/// chain or Hermes), and how much smaller `chorus`' (p99 - average) gap is, in percent. `None`
/// when a point is missing.
pub fn target_ratios(
    report: &TenantsReport,
    chorus: TenantsMode,
    tenants: usize,
    loaded: bool,
) -> Option<(f64, f64)> {
    let chain = report.find(chorus, tenants, loaded)?;
    let naive = report.find(TenantsMode::Naive, tenants, loaded)?;
    let p99_ratio = naive.update_p99_us / chain.update_p99_us.max(1e-9);
    let chain_gap = chain.update_p99_us - chain.update_mean_us;
    let naive_gap = naive.update_p99_us - naive.update_mean_us;
    let gap_reduction = if naive_gap > 0.0 { (1.0 - chain_gap / naive_gap) * 100.0 } else { 0.0 };
    Some((p99_ratio, gap_reduction))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In-process hosts without flushes, regions in a scratch directory named after `name`.
    fn quick_config(name: &str) -> TenantsConfig {
        let dir = std::env::temp_dir().join(format!("chorus-tenants-{name}-{}", std::process::id()));
        TenantsConfig {
            warmup_s: 0.05,
            flush: "none".to_string(),
            region_dir: Some(dir),
            ..TenantsConfig::default()
        }
    }

    /// Both arrangements run end to end in one process (hosts as tasks, Naïve replicas as
    /// threads): every tenant's updates and reads complete through the transaction API.
    #[test]
    fn in_process_points_complete_for_every_tenant() {
        // Three tenants on two client event loops: every loop's tenants run and count.
        let config = TenantsConfig {
            tenants: vec![3],
            records: 16,
            measure_s: 0.3,
            client_threads: 2,
            ..quick_config("test")
        };
        let report = run(config).unwrap();
        assert_eq!(report.results.len(), 2);
        for r in &report.results {
            assert_eq!((r.rounds, r.update_p99_rounds_us.len()), (1, 1), "{r:?}");
            assert!(r.updates > 0 && r.reads > 0, "{r:?}");
            assert!(r.update_p99_us >= r.update_p50_us && r.update_p50_us > 0.0, "{r:?}");
            assert!(r.replica_cpu_us_per_op.is_none(), "in-process hosts have no process tree");
            assert!(r.client_cpu_cores.is_some_and(|cores| cores > 0.0), "the client loop's CPU: {r:?}");
            // Every tenant runs until its own deadline: rates divide by at least that window
            // (a window read by the coordinating thread once ran short on a loaded machine
            // and inflated updates/s by 6x).
            assert!(r.measured_s >= 0.3, "{r:?}");
        }
        assert!(target_ratios(&report, TenantsMode::Chorus, 3, false).is_some());
        assert!(target_ratios(&report, TenantsMode::Chorus, 3, true).is_none());
        assert!(target_ratios(&report, TenantsMode::Hermes, 3, false).is_none());
    }

    /// Two rounds of every point, interleaved: one median point per (mode, T), with both
    /// rounds' p99s and their operations.
    #[test]
    fn rounds_of_a_point_become_one_median_point() {
        let config = TenantsConfig {
            modes: vec![TenantsMode::Chorus],
            tenants: vec![1],
            records: 8,
            measure_s: 0.1,
            rounds: 2,
            ..quick_config("rounds")
        };
        let report = run(config).unwrap();
        assert_eq!(report.results.len(), 1);
        let point = &report.results[0];
        assert_eq!((point.rounds, point.update_p99_rounds_us.len()), (2, 2), "{point:?}");
        let (low, high) = (point.update_p99_rounds_us[0], point.update_p99_rounds_us[1]);
        assert_eq!(point.update_p99_us, (low + high) / 2.0, "the median of two is their mean");
    }

    #[test]
    fn the_median_of_rounds_is_per_statistic_and_counts_add_up() {
        let round = |p99: f64, updates: u64, cpu: Option<f64>| TenantsResult {
            mode: TenantsMode::Naive,
            tenants: 32,
            background_load: true,
            updates,
            reads: updates,
            update_mean_us: p99 / 2.0,
            update_p50_us: p99 / 3.0,
            update_p95_us: p99 / 1.5,
            update_p99_us: p99,
            update_max_us: p99 * 2.0,
            read_mean_us: 1.0,
            read_p99_us: 2.0,
            updates_per_s: updates as f64,
            ops_per_s: 2.0 * updates as f64,
            replica_cpu_us_per_op: cpu,
            replica_cpu_cores: cpu,
            replica_processes: 99,
            measured_s: 10.0,
            rounds: 1,
            update_p99_rounds_us: vec![p99],
            replicas_fifo: Some(true),
            client_cpu_cores: cpu,
            client_wait_cores: None,
            datapath: Datapath::User,
            replica_user_cpu_us_per_op: cpu,
            per_op: cpu.map(|c| PerOp { user_us: c, ..PerOp::default() }),
        };
        let point = TenantsResult::median_of(vec![
            round(9_000.0, 30, Some(3.0)),
            round(1_000.0, 10, Some(1.0)),
            round(4_000.0, 20, Some(2.0)),
        ]);
        assert_eq!(
            (point.update_p99_us, point.update_mean_us, point.updates_per_s),
            (4_000.0, 2_000.0, 20.0)
        );
        assert_eq!((point.updates, point.reads, point.rounds), (60, 60, 3));
        assert_eq!(point.replica_cpu_us_per_op, Some(2.0));
        assert_eq!(point.replica_user_cpu_us_per_op, Some(2.0));
        assert_eq!(point.per_op.map(|p| p.user_us), Some(2.0), "per-operation counters: the median too");
        assert_eq!(point.update_p99_rounds_us, vec![9_000.0, 1_000.0, 4_000.0], "in round order");
        let unknown_cpu = TenantsResult::median_of(vec![round(1.0, 1, None), round(2.0, 1, Some(1.0))]);
        assert_eq!(unknown_cpu.replica_cpu_us_per_op, None, "a round without CPU time: no median");
    }

    #[test]
    fn naive_points_over_the_cap_are_skipped_with_a_note() {
        let config = TenantsConfig {
            modes: vec![TenantsMode::Naive],
            tenants: vec![5],
            naive_tenants_max: 4,
            ..TenantsConfig::default()
        };
        let report = run(config).unwrap();
        assert!(report.results.is_empty());
        assert_eq!(report.skipped.len(), 1);
        assert!(report.skipped[0].contains("T=5"), "{}", report.skipped[0]);
    }
}
