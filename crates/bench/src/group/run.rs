//! HyperLoop §6.1 microbenchmarks over the TCP runtime on loopback, for the chain
//! ([`HostMode::Chorus`]: one group host per host does the work) and the Naïve baseline
//! ([`HostMode::Naive`]: a replica per tenant replica does it):
//!
//! * latency (mean, p50, p95, p99, max) of gWRITE for every message size and group size, of
//!   gMEMCPY and gCAS at the smallest group size, one operation in flight per tenant;
//! * the cost of gFLUSH: gWRITE with an interleaved gFLUSH, and a gFLUSH alone after a gWRITE;
//! * gWRITE throughput with `window` operations in flight;
//! * a multi-tenant run: several tenants' groups on the same hosts at once (where a process
//!   per tenant replica competes for the cores);
//! * with hosts as child processes, the CPU time the hosts (and their Naïve replicas) used per
//!   operation, from /proc;
//! * with `background_load_command` (stress-ng on every core), everything a second time under
//!   that load, as the paper's §6.1 does.
//!
//! [`BenchConfig::default`] is the paper's plan (10,000 operations per point, 128 B to 8 KB,
//! groups of 3, 5 and 7, 1 GB written in 1-64 KB messages), each point capped in time so a
//! starved configuration (Naïve-Polling on a 2-core machine) cannot stall the run; a capped
//! point says so (`truncated`).
//!
//! [`run`] is blocking and builds its own runtime; [`BenchReport`] serializes to JSON.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use chorus_core::Time;
use chorus_region::{default_region_dir, FlushBackend, TenantId};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use chorus_group::kernel::netlab::NetLab;
use chorus_group::runtime::{
    spawn_child, start_host, ChildProcess, Datapath, GroupClient, GroupSpec, HostConfig, HostHandle,
    HostMode, TenantCredential,
};
use chorus_group::{CallerConfig, GroupId, Operation, Token};

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BenchConfig {
    pub modes: Vec<HostMode>,
    pub group_sizes: Vec<usize>,
    /// gWRITE latency message sizes, bytes.
    pub message_sizes: Vec<usize>,
    /// Recorded operations per latency measurement (after `warmup_ops`). The paper uses 10,000.
    pub latency_ops: usize,
    pub warmup_ops: usize,
    /// Bytes written per throughput measurement. The paper writes 1 GB.
    pub throughput_bytes: u64,
    pub throughput_message_sizes: Vec<usize>,
    /// Operations in flight per group in the throughput runs.
    pub window: usize,
    /// Message sizes of the gFLUSH cost runs.
    pub flush_message_sizes: Vec<usize>,
    /// Tenant counts of the multi-tenant latency runs (1 KiB gWRITE, smallest group size).
    pub multi_tenant: Vec<usize>,
    /// The hosts' flush backend ("msync", "clwb", "none").
    pub flush: String,
    /// Start each host as a child process with this command (program and arguments ending in
    /// `chorus_group::runtime::child_main`, e.g. `["/usr/bin/chorus", "group-child"]`); Naïve
    /// replicas then are processes too. `None`: hosts are tasks of this process and Naïve
    /// replicas threads (quicker, less honest: everyone shares one process).
    pub child_command: Option<Vec<String>>,
    /// Where the hosts' regions go; a fresh subdirectory is made and removed. Default: the
    /// region default (/dev/shm/chorus-regions).
    pub region_dir: Option<PathBuf>,
    /// Write the report there as JSON.
    pub output: Option<PathBuf>,
    /// A command that loads every core (e.g. `stress-ng --cpu N`): when set, the whole plan runs
    /// once without and once with it running. Started in its own process group and stopped
    /// (SIGTERM, then SIGKILL) when the loaded pass ends.
    #[serde(default)]
    pub background_load_command: Option<Vec<String>>,
    /// Wall-clock cap of one latency point, seconds (the point keeps the operations done).
    #[serde(default = "default_point_time_max_s")]
    pub latency_time_max_s: f64,
    /// Wall-clock cap of one throughput point, seconds (the point keeps the bytes written).
    #[serde(default = "default_point_time_max_s")]
    pub throughput_time_max_s: f64,
    /// Kernel: every mode runs in network namespaces (veth between hosts) and the chain's
    /// hosts serve on the kernel data path, with 1 MiB regions; user: loopback.
    #[serde(default)]
    pub datapath: Datapath,
}

fn default_point_time_max_s() -> f64 {
    30.0
}

impl Default for BenchConfig {
    /// The paper's §6.1 plan.
    fn default() -> Self {
        BenchConfig {
            modes: vec![HostMode::Chorus, HostMode::Naive, HostMode::NaivePolling],
            group_sizes: vec![3, 5, 7],
            message_sizes: vec![128, 256, 512, 1024, 2048, 4096, 8192],
            latency_ops: 10_000,
            warmup_ops: 500,
            throughput_bytes: 1 << 30,
            throughput_message_sizes: vec![1024, 2048, 4096, 8192, 16384, 32768, 65536],
            window: 64,
            flush_message_sizes: vec![128, 8192],
            multi_tenant: vec![8],
            flush: "msync".to_string(),
            child_command: None,
            region_dir: None,
            output: None,
            background_load_command: None,
            latency_time_max_s: default_point_time_max_s(),
            throughput_time_max_s: default_point_time_max_s(),
            datapath: Datapath::User,
        }
    }
}

impl BenchConfig {
    /// `chorus bench group --quick`: every figure's shape in a few minutes: fewer sizes, 1,000
    /// operations per latency point, 64 MiB (not 1 GB) per throughput point.
    pub fn reduced() -> BenchConfig {
        BenchConfig {
            message_sizes: vec![128, 512, 2048, 8192],
            latency_ops: 1000,
            warmup_ops: 50,
            throughput_bytes: 64 << 20,
            throughput_message_sizes: vec![1024, 8192, 65536],
            flush_message_sizes: vec![1024],
            multi_tenant: vec![4],
            latency_time_max_s: 3.0,
            throughput_time_max_s: 4.0,
            ..BenchConfig::default()
        }
    }

    /// A run small enough for a smoke test.
    pub fn quick() -> BenchConfig {
        BenchConfig {
            group_sizes: vec![3],
            message_sizes: vec![64, 4096],
            latency_ops: 50,
            warmup_ops: 10,
            throughput_bytes: 1024 * 1024,
            throughput_message_sizes: vec![4096],
            window: 16,
            flush_message_sizes: vec![4096],
            multi_tenant: vec![2],
            modes: vec![HostMode::Chorus, HostMode::Naive],
            latency_time_max_s: 10.0,
            throughput_time_max_s: 10.0,
            ..BenchConfig::default()
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BenchReport {
    pub config: BenchConfig,
    pub cores: usize,
    pub hosts_are_processes: bool,
    pub region_dir: String,
    pub results: Vec<BenchResult>,
    /// /proc/cpuinfo's model name and the kernel release, for the record.
    #[serde(default)]
    pub cpu_model: String,
    #[serde(default)]
    pub kernel: String,
    #[serde(default)]
    pub elapsed_s: f64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BenchResult {
    pub mode: HostMode,
    /// "latency" or "throughput".
    pub kind: String,
    /// "gWRITE", "gWRITE+gFLUSH", "gFLUSH", "gMEMCPY", "gCAS".
    pub primitive: String,
    pub group_size: usize,
    pub tenants: usize,
    pub message_bytes: usize,
    pub ops: u64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p95_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    pub ops_per_s: f64,
    pub mib_per_s: f64,
    /// CPU time of the hosts and their replicas per operation (hosts as processes only).
    pub host_cpu_us_per_op: Option<f64>,
    /// The same CPU time divided by the wall-clock time: cores the replicas kept busy.
    #[serde(default)]
    pub host_cpu_cores: Option<f64>,
    /// Measured with the background load running.
    #[serde(default)]
    pub background_load: bool,
    /// The point hit its time cap before its planned operations or bytes.
    #[serde(default)]
    pub truncated: bool,
    /// Where the operations were applied (the chain on the kernel path, or user space).
    #[serde(default)]
    pub datapath: Datapath,
    /// The serving processes' user CPU, context switches and the machine's softirq time per
    /// operation (hosts as processes only).
    #[serde(default)]
    pub per_op: Option<PerOp>,
}

impl BenchReport {
    /// One line per result, for the terminal.
    pub fn table(&self) -> String {
        let mut text = format!(
            "{:<13} {:<4} {:<10} {:<14} {:>2} {:>3} {:>7} {:>9} {:>9} {:>9} {:>9} {:>10} {:>9} {:>9}\n",
            "mode",
            "load",
            "kind",
            "primitive",
            "n",
            "ten",
            "bytes",
            "mean_us",
            "p50_us",
            "p99_us",
            "max_us",
            "ops/s",
            "MiB/s",
            "cpu_us/op"
        );
        for r in &self.results {
            text.push_str(&format!(
                "{:<13} {:<4} {:<10} {:<14} {:>2} {:>3} {:>7} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>10.0} {:>9.1} {:>9}{}\n",
                r.mode.name(),
                if r.background_load { "bg" } else { "-" },
                r.kind,
                r.primitive,
                r.group_size,
                r.tenants,
                r.message_bytes,
                r.mean_us,
                r.p50_us,
                r.p99_us,
                r.max_us,
                r.ops_per_s,
                r.mib_per_s,
                r.host_cpu_us_per_op.map_or("-".to_string(), |c| format!("{c:.1}")),
                if r.truncated { " (time cap)" } else { "" },
            ));
        }
        text
    }
}

const TOKEN_BASE: u8 = 0xb0;
const REGION_BYTES: u64 = 4 * 1024 * 1024;
/// The kernel path's regions are at most one slot of its regions map.
const KERNEL_REGION_BYTES: u64 = chorus_group::kernel::layout::REGION_BYTES_MAX;

pub(crate) fn tenant(t: usize) -> (TenantId, Token) {
    (TenantId(1000 + t as u32), Token([TOKEN_BASE.wrapping_add(t as u8); 16]))
}

/// Tenant `t`'s group on `addrs`: its credentials, group id `t + 1`, a region of
/// `region_bytes` named `name`. Callers set the caller and I/O timeouts their runs need.
pub(crate) fn tenant_spec(addrs: &[SocketAddr], t: usize, name: String, region_bytes: u64) -> GroupSpec {
    let (id, token) = tenant(t);
    GroupSpec::new(addrs.to_vec(), id, token, GroupId(t as u64 + 1), name, region_bytes)
}

pub(crate) enum Hosts {
    /// Kept until the run ends: dropping a handle stops its host.
    InProcess {
        _handles: Vec<HostHandle>,
    },
    Processes(Vec<ChildProcess>),
}

impl Hosts {
    pub(crate) fn pids(&self) -> Vec<u32> {
        match self {
            Hosts::InProcess { .. } => Vec::new(),
            Hosts::Processes(children) => children.iter().filter_map(ChildProcess::id).collect(),
        }
    }
}

/// Run the microbenchmarks. Blocking (builds its own runtime); writes `config.output` if set.
pub fn run(config: BenchConfig) -> anyhow::Result<BenchReport> {
    let flush: FlushBackend = config.flush.parse().map_err(anyhow::Error::msg)?;
    anyhow::ensure!(
        !config.group_sizes.is_empty() && config.group_sizes.iter().all(|n| (1..=64).contains(n)),
        "group sizes are 1 to 64"
    );
    anyhow::ensure!(config.window > 0, "window must be positive");
    let largest = config
        .message_sizes
        .iter()
        .chain(&config.throughput_message_sizes)
        .chain(&config.flush_message_sizes)
        .copied()
        .max()
        .unwrap_or(0) as u64;
    anyhow::ensure!(largest * 2 <= REGION_BYTES, "message sizes are at most {} bytes", REGION_BYTES / 2);
    let base = config.region_dir.clone().unwrap_or_else(default_region_dir);
    let dir = base.join(format!("bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let started = Instant::now();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let result = runtime.block_on(async {
        let mut results = run_all(&config, flush, &dir.join("quiet"), false).await?;
        if let Some(command) = &config.background_load_command {
            let load = BackgroundLoad::start(command)?;
            // Let the load spread over every core before measuring.
            tokio::time::sleep(Duration::from_secs(1)).await;
            let loaded = run_all(&config, flush, &dir.join("loaded"), true).await;
            load.stop();
            results.extend(loaded?);
        }
        anyhow::Ok(results)
    });
    let _ = std::fs::remove_dir_all(&dir);
    runtime.shutdown_timeout(Duration::from_secs(2));
    let report = BenchReport {
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        hosts_are_processes: config.child_command.is_some(),
        region_dir: dir.display().to_string(),
        results: result?,
        config,
        cpu_model: cpu_model(),
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string(),
        elapsed_s: started.elapsed().as_secs_f64(),
    };
    if let Some(path) = &report.config.output {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(report)
}

pub(crate) fn cpu_model() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    info.lines()
        .find_map(|line| {
            line.strip_prefix("model name").map(|rest| rest.trim_start_matches([' ', '\t', ':']))
        })
        .unwrap_or("unknown")
        .to_string()
}

/// A CPU hog on every core (stress-ng), in its own process group so stopping it stops its
/// workers too. It also gets SIGKILL if this process dies (PR_SET_PDEATHSIG).
pub(crate) struct BackgroundLoad {
    child: std::process::Child,
}

impl BackgroundLoad {
    pub(crate) fn start(command: &[String]) -> anyhow::Result<BackgroundLoad> {
        use std::os::unix::process::CommandExt;
        let (program, args) = command.split_first().context("empty background load command")?;
        let mut builder = std::process::Command::new(program);
        builder
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .process_group(0);
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            builder.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = builder.spawn().with_context(|| format!("starting the background load {program}"))?;
        Ok(BackgroundLoad { child })
    }

    pub(crate) fn stop(mut self) {
        let group = self.child.id() as i32;
        // SAFETY: signalling our own child's process group.
        unsafe { libc::kill(-group, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                // Workers may outlive the parent by a moment.
                unsafe { libc::kill(-group, libc::SIGKILL) };
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        unsafe { libc::kill(-group, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

/// How one run starts its hosts.
pub(crate) struct HostsPlan<'a> {
    /// Start each host as a process with this command (ending in
    /// [`chorus_group::runtime::child_main`]); `None`: in this process. Naïve replicas start with it
    /// too, from their host.
    pub command: Option<&'a [String]>,
    /// What only the hosts' command line starts with (`nice -n N`, `chrt -f 1`). Naïve
    /// replicas inherit the host's niceness and class by fork; starting them with the prefix
    /// again would apply a relative `nice -n` twice.
    pub host_prefix: &'a [String],
    pub flush: FlushBackend,
    pub dir: &'a std::path::Path,
    pub mode: HostMode,
    pub hosts: usize,
    pub tenants: usize,
    /// The hosts' I/O timeout, when not the default.
    pub io_timeout_ms: Option<u64>,
    pub start_timeout: Duration,
    /// Run host i in namespace i of this lab (hosts must be processes), where the kernel data
    /// path can run; `None`: on loopback.
    pub lab: Option<&'a NetLab>,
    pub datapath: Datapath,
    /// The kernel path's RPS CPU mask at the interface facing the callers
    /// ([`HostConfig::kernel_caller_rps_cpus`]).
    pub caller_rps_cpus: Option<&'a str>,
}

pub(crate) async fn start_hosts(plan: HostsPlan<'_>) -> anyhow::Result<(Hosts, Vec<SocketAddr>)> {
    let credentials: Vec<TenantCredential> = (0..plan.tenants)
        .map(|t| {
            let (id, token) = tenant(t);
            TenantCredential::new(id, &token)
        })
        .collect();
    let mut addrs = Vec::new();
    let mut handles = Vec::new();
    let mut children = Vec::new();
    anyhow::ensure!(
        plan.lab.is_none() || plan.command.is_some(),
        "hosts in network namespaces must be processes"
    );
    for i in 0..plan.hosts {
        let listen = match plan.lab {
            Some(lab) => SocketAddr::new(lab.host_ip(i).into(), 0),
            None => "127.0.0.1:0".parse()?,
        };
        let mut host = HostConfig::new(listen, plan.dir.join(format!("host{i}")), credentials.clone());
        host.datapath = plan.datapath;
        host.kernel_caller_rps_cpus = plan.caller_rps_cpus.map(str::to_string);
        // A 1 MiB kernel region slot per tenant (the default 64 would refuse T = 100).
        host.kernel_slots = (plan.tenants as u32).max(64);
        if let Some(lab) = plan.lab {
            host.peers = (0..lab.hosts()).map(|h| lab.host_ip(h).into()).collect();
        }
        host.flush = plan.flush;
        host.mode = plan.mode;
        host.replica_command = plan.command.map(<[String]>::to_vec);
        host.worker_threads = 1; // a host's event loop: one thread, like a NIC's one engine
        if let Some(timeout_ms) = plan.io_timeout_ms {
            host.io_timeout_ms = timeout_ms;
        }
        match plan.command {
            Some(command) => {
                let command = [plan.host_prefix, command].concat();
                let command = match plan.lab {
                    Some(lab) => lab.command_in(i, &command),
                    None => command,
                };
                let (addr, child) = spawn_child(&command, &host, plan.start_timeout).await?;
                addrs.push(addr);
                children.push(child);
            }
            None => {
                let handle = start_host(host).await?;
                addrs.push(handle.local_addr());
                handles.push(handle);
            }
        }
    }
    let hosts = if plan.command.is_some() {
        Hosts::Processes(children)
    } else {
        Hosts::InProcess { _handles: handles }
    };
    Ok((hosts, addrs))
}

async fn groups(
    addrs: &[SocketAddr],
    tenants: usize,
    window: usize,
    tag: &str,
    datapath: Datapath,
) -> anyhow::Result<Vec<Arc<GroupClient>>> {
    let mut clients = Vec::new();
    let region = if datapath == Datapath::Kernel { KERNEL_REGION_BYTES } else { REGION_BYTES };
    for t in 0..tenants {
        let mut spec = tenant_spec(addrs, t, format!("{tag}-t{t}"), region);
        spec.caller =
            CallerConfig { retransmit_after: Time::from_millis(2000), attempts_max: 5, window_max: window };
        spec.datapath = datapath;
        spec.kernel_caller.window_max = window;
        clients.push(Arc::new(GroupClient::initialize(spec).await?));
    }
    Ok(clients)
}

#[derive(Clone, Copy)]
enum Prim {
    Write,
    WriteFlush,
    FlushAfterWrite,
    Memcpy,
    Cas,
}

impl Prim {
    fn name(self) -> &'static str {
        match self {
            Prim::Write => "gWRITE",
            Prim::WriteFlush => "gWRITE+gFLUSH",
            Prim::FlushAfterWrite => "gFLUSH",
            Prim::Memcpy => "gMEMCPY",
            Prim::Cas => "gCAS",
        }
    }
}

fn micros(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

fn region_of(client: &GroupClient) -> u64 {
    if client.datapath() == Datapath::Kernel {
        KERNEL_REGION_BYTES
    } else {
        REGION_BYTES
    }
}

/// One closed-loop client per tenant, one operation in flight each; latencies of all tenants
/// in one histogram (nanoseconds).
async fn latency(
    clients: &[Arc<GroupClient>],
    prim: Prim,
    size: usize,
    ops: usize,
    warmup: usize,
    time_max: Duration,
) -> anyhow::Result<(Histogram<u64>, Duration)> {
    let deadline = Instant::now() + time_max;
    let mut tasks = Vec::new();
    for client in clients {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let mut histogram = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
            let payload = Bytes::from(vec![0x5au8; size]);
            let all = (1u64 << client.chain_len()) - 1;
            let region = region_of(&client);
            let span = region / 2 - size as u64;
            let mut measured_from = Instant::now();
            for i in 0..(warmup + ops) {
                if i == warmup {
                    measured_from = Instant::now();
                }
                let offset = (i as u64 * size as u64) % span.max(1);
                let start;
                match prim {
                    Prim::Write | Prim::WriteFlush => {
                        let mut op = Operation::write(offset, payload.clone());
                        op.flush = matches!(prim, Prim::WriteFlush);
                        start = Instant::now();
                        client.submit(op).await?;
                    }
                    Prim::FlushAfterWrite => {
                        client.submit(Operation::write(offset, payload.clone())).await?;
                        start = Instant::now();
                        client.submit(Operation::flush()).await?;
                    }
                    Prim::Memcpy => {
                        start = Instant::now();
                        client.submit(Operation::memcpy(offset, region / 2 + offset, size as u64)).await?;
                    }
                    Prim::Cas => {
                        start = Instant::now();
                        client.submit(Operation::cas(0, i as u64, i as u64 + 1, all)).await?;
                    }
                }
                if i >= warmup {
                    histogram.saturating_record(start.elapsed().as_nanos().max(1) as u64);
                }
                if i > warmup && Instant::now() > deadline {
                    break;
                }
            }
            anyhow::Ok((histogram, measured_from.elapsed()))
        }));
    }
    let mut merged = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    let mut elapsed = Duration::ZERO;
    for task in tasks {
        let (histogram, measured) = task.await.context("latency task")??;
        merged.add(&histogram).map_err(|e| anyhow::anyhow!("{e:?}"))?;
        elapsed = elapsed.max(measured);
    }
    Ok((merged, elapsed))
}

/// gWRITE throughput: `window` operations in flight per group, `bytes` in total per group.
async fn throughput(
    clients: &[Arc<GroupClient>],
    size: usize,
    bytes: u64,
    window: usize,
    time_max: Duration,
) -> anyhow::Result<(u64, Duration)> {
    let per_group = (bytes / size as u64).max(1);
    let started = Instant::now();
    let deadline = started + time_max;
    let mut tasks = Vec::new();
    for client in clients {
        // Two submitters per group, each with half the window, so the pipeline never drains.
        for part in 0..2u64 {
            let client = client.clone();
            let share = per_group / 2 + if part == 0 { per_group % 2 } else { 0 };
            let chunk = (window / 2).max(1) as u64;
            tasks.push(tokio::spawn(async move {
                let payload = Bytes::from(vec![0xa5u8; size]);
                let span = region_of(&client) / 2 - size as u64;
                let mut done = 0u64;
                while done < share {
                    let count = chunk.min(share - done);
                    let ops = (0..count)
                        .map(|k| Operation::write(((done + k) * size as u64) % span.max(1), payload.clone()))
                        .collect();
                    for result in client.execute(ops).await {
                        result?;
                    }
                    done += count;
                    if Instant::now() > deadline {
                        break;
                    }
                }
                anyhow::Ok(done)
            }));
        }
    }
    let mut total = 0;
    for task in tasks {
        total += task.await.context("throughput task")??;
    }
    Ok((total, started.elapsed()))
}

/// One process, from /proc/<pid>/stat.
struct ProcStat {
    ppid: u32,
    /// User + system CPU time.
    cpu_us: u64,
    /// User CPU time alone.
    user_us: u64,
    /// The command name (`ksoftirqd/0`, ...).
    name: String,
    /// Scheduling policy (SCHED_OTHER 0, SCHED_FIFO 1, ...).
    policy: u32,
}

/// Every process now (those that exit while being read are left out).
fn process_table() -> Option<BTreeMap<u32, ProcStat>> {
    let ticks = 100u64; // USER_HZ on Linux
    let mut table = BTreeMap::new();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        // Fields after the command name (which may contain spaces) start after the last ')'.
        let Some((head, rest)) = stat.rsplit_once(')') else { continue };
        let name = head.split_once('(').map_or("", |(_, name)| name).to_string();
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // fields[0] is field 3 (state): ppid is field 4, utime 14, stime 15, policy 41.
        let number = |field: usize| fields.get(field - 3).and_then(|value| value.parse::<u64>().ok());
        let (Some(ppid), Some(utime), Some(stime), Some(policy)) =
            (number(4), number(14), number(15), number(41))
        else {
            continue;
        };
        let cpu_us = (utime + stime) * 1_000_000 / ticks;
        let user_us = utime * 1_000_000 / ticks;
        table.insert(pid, ProcStat { ppid: ppid as u32, cpu_us, user_us, name, policy: policy as u32 });
    }
    Some(table)
}

/// Whether `pid` is one of `roots` or descends from one.
fn in_trees(table: &BTreeMap<u32, ProcStat>, roots: &[u32], pid: u32) -> bool {
    let mut at = pid;
    for _ in 0..64 {
        if roots.contains(&at) {
            return true;
        }
        match table.get(&at) {
            Some(process) if process.ppid != 0 && process.ppid != at => at = process.ppid,
            _ => return false,
        }
    }
    false
}

/// User + system CPU time, in microseconds, of `pids` and all their descendants (from
/// /proc/<pid>/stat, clock ticks of 10 ms). Processes that already exited are not counted.
pub fn tree_cpu_us(pids: &[u32]) -> Option<u64> {
    if pids.is_empty() {
        return None;
    }
    let table = process_table()?;
    Some(
        table.iter().filter(|(&pid, _)| in_trees(&table, pids, pid)).map(|(_, process)| process.cpu_us).sum(),
    )
}

/// Whether `pids` and every process descending from them (Naïve replicas, forked by their
/// host) run under SCHED_FIFO. `None` without processes or when /proc cannot be read.
pub fn all_sched_fifo(pids: &[u32]) -> Option<bool> {
    if pids.is_empty() {
        return None;
    }
    let table = process_table()?;
    let fifo = libc::SCHED_FIFO as u32;
    let mut tree = table.iter().filter(|(&pid, _)| in_trees(&table, pids, pid)).peekable();
    tree.peek()?;
    Some(tree.all(|(_, process)| process.policy == fifo))
}

/// Where the replicas' CPU went, read from /proc: the serving processes' (and their
/// descendants') user and system time and context switches, and the machine's softirq time,
/// NET_RX softirqs and ksoftirqd time (on veth every hop runs on this machine's CPUs).
#[derive(Clone, Copy, Debug, Default)]
pub struct HostCounters {
    pub user_us: u64,
    pub system_us: u64,
    pub context_switches: u64,
    pub softirq_us: u64,
    pub net_rx_softirqs: u64,
    pub ksoftirqd_us: u64,
}

impl HostCounters {
    /// Now, for `pids` and their descendants. `None` without processes or /proc.
    pub fn read(pids: &[u32]) -> Option<HostCounters> {
        if pids.is_empty() {
            return None;
        }
        let table = process_table()?;
        let mut counters = HostCounters::default();
        for (&pid, process) in &table {
            if in_trees(&table, pids, pid) {
                counters.user_us += process.user_us;
                counters.system_us += process.cpu_us - process.user_us;
                counters.context_switches += context_switches(pid);
            }
            if process.name.starts_with("ksoftirqd/") {
                counters.ksoftirqd_us += process.cpu_us;
            }
        }
        counters.softirq_us = machine_softirq_us().unwrap_or(0);
        counters.net_rx_softirqs = net_rx_softirqs().unwrap_or(0);
        Some(counters)
    }

    /// What happened between `before` and `self`.
    pub fn since(&self, before: &HostCounters) -> HostCounters {
        HostCounters {
            user_us: self.user_us.saturating_sub(before.user_us),
            system_us: self.system_us.saturating_sub(before.system_us),
            context_switches: self.context_switches.saturating_sub(before.context_switches),
            softirq_us: self.softirq_us.saturating_sub(before.softirq_us),
            net_rx_softirqs: self.net_rx_softirqs.saturating_sub(before.net_rx_softirqs),
            ksoftirqd_us: self.ksoftirqd_us.saturating_sub(before.ksoftirqd_us),
        }
    }

    /// Per operation.
    pub fn per_op(&self, ops: u64) -> PerOp {
        let ops = ops.max(1) as f64;
        PerOp {
            user_us: self.user_us as f64 / ops,
            system_us: self.system_us as f64 / ops,
            context_switches: self.context_switches as f64 / ops,
            softirq_us: self.softirq_us as f64 / ops,
            net_rx_softirqs: self.net_rx_softirqs as f64 / ops,
            ksoftirqd_us: self.ksoftirqd_us as f64 / ops,
        }
    }
}

/// [`HostCounters`] per operation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PerOp {
    pub user_us: f64,
    pub system_us: f64,
    pub context_switches: f64,
    /// Machine-wide: every CPU's softirq time (the kernel path's work, and the stack's).
    pub softirq_us: f64,
    pub net_rx_softirqs: f64,
    /// Softirq work deferred to ksoftirqd threads (at normal priority, behind the load).
    pub ksoftirqd_us: f64,
}

/// Voluntary plus involuntary context switches of every thread of `pid`.
fn context_switches(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0 };
    let mut total = 0;
    for task in tasks.flatten() {
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else { continue };
        for line in status.lines() {
            if let Some(value) = line
                .strip_prefix("voluntary_ctxt_switches:")
                .or_else(|| line.strip_prefix("nonvoluntary_ctxt_switches:"))
            {
                total += value.trim().parse::<u64>().unwrap_or(0);
            }
        }
    }
    total
}

/// Every CPU's softirq time so far (/proc/stat's `cpu` line, field 7, clock ticks).
fn machine_softirq_us() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|line| line.starts_with("cpu "))?;
    let ticks: u64 = line.split_whitespace().nth(7)?.parse().ok()?;
    Some(ticks * 10_000)
}

/// NET_RX softirqs raised so far, all CPUs (/proc/softirqs).
fn net_rx_softirqs() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/softirqs").ok()?;
    let line = text.lines().find(|line| line.trim_start().starts_with("NET_RX:"))?;
    Some(line.split_whitespace().skip(1).filter_map(|n| n.parse::<u64>().ok()).sum())
}

#[allow(clippy::too_many_arguments)]
fn result(
    mode: HostMode,
    kind: &str,
    prim: &str,
    group_size: usize,
    tenants: usize,
    size: usize,
    histogram: Option<&Histogram<u64>>,
    ops: u64,
    elapsed: Duration,
    cpu_us: Option<u64>,
) -> BenchResult {
    let seconds = elapsed.as_secs_f64().max(1e-9);
    let (mean, p50, p95, p99, max) = match histogram {
        Some(h) => {
            (h.mean() / 1000.0, micros(h, 0.5), micros(h, 0.95), micros(h, 0.99), h.max() as f64 / 1000.0)
        }
        None => {
            let mean = seconds * 1e6 / ops.max(1) as f64;
            (mean, 0.0, 0.0, 0.0, 0.0)
        }
    };
    BenchResult {
        mode,
        kind: kind.to_string(),
        primitive: prim.to_string(),
        group_size,
        tenants,
        message_bytes: size,
        ops,
        mean_us: mean,
        p50_us: p50,
        p95_us: p95,
        p99_us: p99,
        max_us: max,
        ops_per_s: ops as f64 / seconds,
        mib_per_s: ops as f64 * size as f64 / seconds / (1024.0 * 1024.0),
        host_cpu_us_per_op: cpu_us.map(|us| us as f64 / ops.max(1) as f64),
        host_cpu_cores: None,
        background_load: false,
        truncated: false,
        datapath: Datapath::User,
        per_op: None,
    }
}

async fn run_all(
    config: &BenchConfig,
    flush: FlushBackend,
    dir: &std::path::Path,
    loaded: bool,
) -> anyhow::Result<Vec<BenchResult>> {
    let mut results = Vec::new();
    let latency_cap = Duration::from_secs_f64(config.latency_time_max_s.max(0.1));
    let throughput_cap = Duration::from_secs_f64(config.throughput_time_max_s.max(0.1));
    let smallest = *config.group_sizes.iter().min().unwrap_or(&3);
    let max_tenants = config.multi_tenant.iter().copied().max().unwrap_or(1).max(1);
    for &mode in &config.modes {
        for &n in &config.group_sizes {
            let tag = format!("{}-{n}", mode.name());
            let lab = match config.datapath {
                Datapath::Kernel => Some(NetLab::create(n).map_err(anyhow::Error::msg)?),
                Datapath::User => None,
            };
            // Only the chain has a kernel path; the Naïve modes run in the same namespaces.
            let datapath = if mode == HostMode::Chorus { config.datapath } else { Datapath::User };
            let (hosts, addrs) = start_hosts(HostsPlan {
                command: config.child_command.as_deref(),
                host_prefix: &[],
                flush,
                dir: &dir.join(&tag),
                mode,
                hosts: n,
                tenants: max_tenants,
                io_timeout_ms: None,
                start_timeout: Duration::from_secs(10),
                lab: lab.as_ref(),
                datapath,
                caller_rps_cpus: None,
            })
            .await?;
            let clients = groups(&addrs, 1, config.window, &tag, datapath).await?;
            let served = clients.first().map_or(Datapath::User, |client| client.datapath());
            let pids = hosts.pids();
            let mut plan: Vec<(Prim, usize)> =
                config.message_sizes.iter().map(|&s| (Prim::Write, s)).collect();
            if n == smallest {
                plan.extend(config.message_sizes.iter().map(|&s| (Prim::Memcpy, s)));
                plan.push((Prim::Cas, 8));
                plan.extend(config.flush_message_sizes.iter().map(|&s| (Prim::WriteFlush, s)));
                plan.extend(config.flush_message_sizes.iter().map(|&s| (Prim::FlushAfterWrite, s)));
            }
            for (prim, size) in plan {
                let before = tree_cpu_us(&pids);
                let counters = HostCounters::read(&pids);
                let began = Instant::now();
                let (histogram, elapsed) =
                    latency(&clients, prim, size, config.latency_ops, config.warmup_ops, latency_cap).await?;
                let cpu = tree_cpu_us(&pids).zip(before).map(|(after, before)| after.saturating_sub(before));
                let ops = histogram.len();
                let cpu_ops = if matches!(prim, Prim::FlushAfterWrite) { 2 } else { 1 }
                    * (ops + config.warmup_ops as u64);
                let mut r =
                    result(mode, "latency", prim.name(), n, 1, size, Some(&histogram), ops, elapsed, None);
                r.host_cpu_us_per_op = cpu.map(|us| us as f64 / cpu_ops.max(1) as f64);
                r.host_cpu_cores = cpu.map(|us| us as f64 / 1e6 / began.elapsed().as_secs_f64().max(1e-9));
                r.background_load = loaded;
                r.truncated = ops < config.latency_ops as u64;
                r.datapath = served;
                r.per_op = HostCounters::read(&pids)
                    .zip(counters)
                    .map(|(after, before)| after.since(&before).per_op(cpu_ops));
                results.push(r);
            }
            if n == smallest {
                for &size in &config.throughput_message_sizes {
                    let before = tree_cpu_us(&pids);
                    let (ops, elapsed) =
                        throughput(&clients, size, config.throughput_bytes, config.window, throughput_cap)
                            .await?;
                    let cpu =
                        tree_cpu_us(&pids).zip(before).map(|(after, before)| after.saturating_sub(before));
                    let mut r = result(mode, "throughput", "gWRITE", n, 1, size, None, ops, elapsed, cpu);
                    r.datapath = served;
                    r.host_cpu_cores = cpu.map(|us| us as f64 / 1e6 / elapsed.as_secs_f64().max(1e-9));
                    r.background_load = loaded;
                    r.truncated = ops < (config.throughput_bytes / size as u64).max(1);
                    results.push(r);
                }
                drop(clients);
                for &tenants in &config.multi_tenant {
                    let clients =
                        groups(&addrs, tenants, config.window, &format!("{tag}-mt{tenants}"), datapath)
                            .await?;
                    let before = tree_cpu_us(&pids);
                    let began = Instant::now();
                    let (histogram, elapsed) = latency(
                        &clients,
                        Prim::Write,
                        1024,
                        config.latency_ops,
                        config.warmup_ops,
                        latency_cap,
                    )
                    .await?;
                    let cpu =
                        tree_cpu_us(&pids).zip(before).map(|(after, before)| after.saturating_sub(before));
                    let ops = histogram.len();
                    let mut r = result(
                        mode,
                        "latency",
                        "gWRITE",
                        n,
                        tenants,
                        1024,
                        Some(&histogram),
                        ops,
                        elapsed,
                        None,
                    );
                    let all_ops = ops + (config.warmup_ops * tenants) as u64;
                    r.host_cpu_us_per_op = cpu.map(|us| us as f64 / all_ops.max(1) as f64);
                    r.host_cpu_cores =
                        cpu.map(|us| us as f64 / 1e6 / began.elapsed().as_secs_f64().max(1e-9));
                    r.background_load = loaded;
                    r.truncated = ops < (config.latency_ops * tenants) as u64;
                    r.datapath = served;
                    results.push(r);
                }
            }
            drop(hosts);
            drop(lab);
        }
    }
    Ok(results)
}
