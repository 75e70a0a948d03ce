//! `chorus bench compare`: Chorus and its peers side by side, in one invocation.
//!
//! Systems, each started, measured and stopped in turn (never two at once), every process on
//! 127.0.0.1 with its data under /dev/shm:
//! * `chorus`: 3 `chorus node` replicas (Hermes); clients spread over the three.
//! * `raftlog`: 3 `chorus node` replicas running raftlog, durable (its log on disk, flushed
//!   before a write is acknowledged), the peer for etcd, which is durable too.
//! * `redis-wait`: a Redis primary with 2 replicas; every write is followed by `WAIT 2 1000`,
//!   so it is acknowledged only once both replicas have it (the honest replicated peer);
//!   every client talks to the primary (replica reads would not be linearizable).
//! * `redis`: a Redis primary alone, unreplicated: the ceiling.
//! * `etcd`: a 3-member etcd cluster driven by etcd's own benchmark tool over gRPC
//!   ([`crate::etcd_tool`]): `kv-w100` as `put`, `kv-w0` as linearizable `range`; other
//!   workloads are not measured for it.
//! * `etcd-http` (only when asked for): the same cluster through its HTTP/JSON gateway with
//!   this crate's load generator, every workload.
//!
//! The same workloads and client counts run against each; the report is one table with the
//! throughput, p50/p99/p99.9 and **server CPU per operation** (user + system time of every
//! server process, from /proc/<pid>/stat before and after the point, divided by the
//! operations) of each system and its ratios to Chorus, every process's command line, saved
//! as JSON and PNG plots.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use indicatif::ProgressBar;
use serde::{Deserialize, Serialize};

use crate::client::{Api, ClientConfig, Keyspace, Wait};
use crate::driver::{self, RunOptions};
use crate::generator::Distribution;
use crate::procs::{self, localhost, Procs};
use crate::report::Report;
use crate::workload::{KvSpec, OpGen, YcsbSpec};

#[derive(clap::Args, Clone, Debug)]
pub struct CompareArgs {
    /// A short run (fewer seconds per point, smaller data set): about 5 minutes (5 systems).
    #[arg(long)]
    pub quick: bool,
    /// Where the JSON and PNG files go.
    #[arg(long, default_value = "bench/results")]
    pub out: PathBuf,
    /// Systems to run, comma separated: chorus, raftlog, redis-wait, redis, etcd, etcd-http.
    #[arg(long, value_delimiter = ',', default_value = "chorus,raftlog,redis-wait,redis,etcd")]
    pub systems: Vec<String>,
    /// Client counts (default 1,16,64,256).
    #[arg(long, value_delimiter = ',')]
    pub clients: Option<Vec<usize>>,
    /// Workloads, comma separated: ycsb-a .. ycsb-f, kv-w<percent writes> (e.g. kv-w100).
    /// Default: ycsb-a,ycsb-b,kv-w100,kv-w5,kv-w0 (and kv-w50 without --quick).
    #[arg(long, value_delimiter = ',')]
    pub workloads: Option<Vec<String>>,
    /// Seconds per measurement point (default 2 with --quick, 10 without).
    #[arg(long)]
    pub duration_s: Option<f64>,
    /// Operations per point at most (the point also ends after --duration-s).
    #[arg(long)]
    pub ops: Option<u64>,
    /// YCSB records (default 10000 with --quick, 100000 without).
    #[arg(long)]
    pub records: Option<u64>,
    /// Microworkload keys (default 10000 with --quick, 100000 without).
    #[arg(long)]
    pub keys: Option<u64>,
    /// Rounds per point; the table shows medians (default 1 with --quick, 3 without).
    #[arg(long)]
    pub rounds: Option<usize>,
    /// Do not apt-get install redis-server / etcd-server when missing (skip those systems).
    #[arg(long)]
    pub no_install: bool,
    /// Load generator threads (default: the number of CPUs).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Value size of the kv-w* workloads, also etcd's puts (default 32 bytes).
    #[arg(long, default_value_t = 32)]
    pub value_bytes: usize,
    /// Where the systems keep their data (default: /dev/shm). A directory on a real file
    /// system makes every durable system (raftlog, etcd) sync to it.
    #[arg(long)]
    pub data_root: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SystemKind {
    Chorus,
    Raftlog,
    RedisWait,
    Redis,
    Etcd,
    EtcdHttp,
}

impl SystemKind {
    pub fn parse(name: &str) -> anyhow::Result<SystemKind> {
        Ok(match name.trim() {
            "chorus" => SystemKind::Chorus,
            "raftlog" => SystemKind::Raftlog,
            "redis-wait" => SystemKind::RedisWait,
            "redis" => SystemKind::Redis,
            "etcd" => SystemKind::Etcd,
            "etcd-http" => SystemKind::EtcdHttp,
            other => bail!("unknown system {other:?} (chorus, raftlog, redis-wait, redis, etcd, etcd-http)"),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            SystemKind::Chorus => "chorus",
            SystemKind::Raftlog => "raftlog",
            SystemKind::RedisWait => "redis-wait",
            SystemKind::Redis => "redis",
            SystemKind::Etcd => "etcd",
            SystemKind::EtcdHttp => "etcd-http",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            SystemKind::Chorus => {
                "Chorus, 3 replicas, Hermes with membership and leases, one thread per node \
                 (worker_threads = 1), in memory; reads served locally at every replica; clients \
                 spread over the three; this crate's RESP load generator"
            }
            SystemKind::Raftlog => {
                "Chorus, 3 replicas, raftlog (Raft), durable: its log in <data-dir> (on /dev/shm), \
                 flushed (msync) before a write is acknowledged; clients spread over the three"
            }
            SystemKind::RedisWait => {
                "Redis primary + 2 replicas (--save '' --appendonly no), WAIT 2 1000 after each \
                 write in the same round trip; every client on the primary"
            }
            SystemKind::Redis => "Redis primary alone (unreplicated, --save '' --appendonly no)",
            SystemKind::Etcd => {
                "etcd, 3 members (data on /dev/shm, fsync on), driven by etcd's own benchmark tool \
                 over gRPC: kv-w100 = `put` (16-byte random keys over the key space, uniform), \
                 kv-w0 = `range` of one key, linearizable; one gRPC connection per client, \
                 connections spread over the members"
            }
            SystemKind::EtcdHttp => {
                "etcd, 3 members through the HTTP/JSON gateway (slower than gRPC), this crate's \
                 load generator, linearizable reads"
            }
        }
    }

    /// Whether this system is measured on `workload`.
    fn measures(self, workload: &Workload) -> bool {
        match self {
            SystemKind::Etcd => matches!(workload, Workload::Kv(0) | Workload::Kv(100)),
            _ => true,
        }
    }
}

/// A workload of the comparison.
#[derive(Clone, Debug, PartialEq)]
pub enum Workload {
    Ycsb(char),
    /// Write ratio in percent.
    Kv(u32),
}

impl Workload {
    pub fn parse(name: &str) -> anyhow::Result<Workload> {
        let name = name.trim();
        if let Some(letter) = name.strip_prefix("ycsb-") {
            let letter = letter.chars().next().filter(|c| "abcdef".contains(*c) && letter.len() == 1);
            return letter.map(Workload::Ycsb).with_context(|| format!("unknown workload {name:?}"));
        }
        if let Some(percent) = name.strip_prefix("kv-w") {
            let percent: u32 =
                percent.parse().with_context(|| format!("bad write percentage in {name:?}"))?;
            anyhow::ensure!(percent <= 100, "write percentage above 100 in {name:?}");
            return Ok(Workload::Kv(percent));
        }
        bail!("unknown workload {name:?} (ycsb-a .. ycsb-f, kv-w<percent>)")
    }

    pub fn name(&self) -> String {
        match self {
            Workload::Ycsb(letter) => format!("ycsb-{letter}"),
            Workload::Kv(percent) => format!("kv-w{percent}"),
        }
    }
}

/// One measurement.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Point {
    pub system: SystemKind,
    pub workload: String,
    pub clients: usize,
    pub ops_per_s: f64,
    pub errors: u64,
    pub p50_us: f64,
    pub p95_us: f64,
    pub p99_us: f64,
    pub p99_9_us: f64,
    pub max_us: f64,
    /// Throughput of each round (the columns above are medians over rounds).
    pub round_ops_per_s: Vec<f64>,
    /// Server CPU (user + system, every server process) per operation, median over rounds.
    #[serde(default)]
    pub server_cpu_us_per_op: Option<f64>,
    #[serde(default)]
    pub round_server_cpu_us_per_op: Vec<f64>,
    /// Hermes RMWs aborted by a concurrent write to the same key (all rounds, all replicas).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rmw_aborts: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// The full report of each round.
    pub reports: Vec<Report>,
}

/// A performance target of issue 4, checked against this run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TargetCheck {
    pub target: String,
    pub measured: String,
    pub met: Option<bool>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Machine {
    pub nproc: usize,
    pub cpu_model: String,
    pub kernel: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Comparison {
    pub command: String,
    pub quick: bool,
    pub started_unix_s: u64,
    pub elapsed_s: f64,
    pub machine: Machine,
    pub versions: BTreeMap<String, String>,
    pub systems: BTreeMap<String, String>,
    /// Every process of every system: its label and command line.
    #[serde(default)]
    pub configurations: BTreeMap<String, Vec<(String, String)>>,
    pub skipped: BTreeMap<String, String>,
    pub seconds_per_point: f64,
    pub rounds: usize,
    pub records: u64,
    pub keys: u64,
    pub points: Vec<Point>,
    pub targets: Vec<TargetCheck>,
}

pub fn machine() -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find(|line| line.starts_with("model name"))
        .and_then(|line| line.split(':').nth(1))
        .map(|model| model.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|k| k.trim().to_string())
        .unwrap_or_default();
    Machine { nproc: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1), cpu_model, kernel }
}

/// A running system and how clients reach it.
struct System {
    kind: SystemKind,
    procs: Procs,
    targets: Vec<SocketAddr>,
    api: Api,
    wait: Option<Wait>,
    /// etcd's benchmark tool, for systems it drives.
    tool: Option<PathBuf>,
    /// The last throughput the tool measured per (workload, clients): sizes its next run.
    tool_rates: BTreeMap<(String, usize), f64>,
}

/// One round of one point.
struct Round {
    report: Report,
    server_cpu_us_per_op: Option<f64>,
    rmw_aborts: Option<u64>,
}

struct Plan {
    clients: Vec<usize>,
    workloads: Vec<Workload>,
    point: Duration,
    ops: u64,
    records: u64,
    keys: u64,
    rounds: usize,
    threads: Option<usize>,
    /// Value size of the kv-w* workloads.
    value_bytes: usize,
}

pub fn run(args: CompareArgs, chorus_exe: &Path) -> anyhow::Result<i32> {
    let started = Instant::now();
    let quick = args.quick;
    let workloads: Vec<Workload> = match &args.workloads {
        Some(names) => names.iter().map(|n| Workload::parse(n)).collect::<Result<_, _>>()?,
        None if quick => vec![
            Workload::Ycsb('a'),
            Workload::Ycsb('b'),
            Workload::Kv(100),
            Workload::Kv(5),
            Workload::Kv(0),
        ],
        None => vec![
            Workload::Ycsb('a'),
            Workload::Ycsb('b'),
            Workload::Kv(100),
            Workload::Kv(50),
            Workload::Kv(5),
            Workload::Kv(0),
        ],
    };
    let plan = Plan {
        clients: args.clients.clone().unwrap_or_else(|| vec![1, 16, 64, 256]),
        workloads,
        point: Duration::from_secs_f64(args.duration_s.unwrap_or(if quick { 1.6 } else { 10.0 })),
        ops: args.ops.unwrap_or(u64::MAX / 4),
        records: args.records.unwrap_or(if quick { 10_000 } else { 100_000 }),
        keys: args.keys.unwrap_or(if quick { 10_000 } else { 100_000 }),
        rounds: args.rounds.unwrap_or(if quick { 1 } else { 3 }).max(1),
        threads: args.threads,
        value_bytes: args.value_bytes.max(1),
    };
    anyhow::ensure!(plan.clients.iter().all(|c| *c > 0), "--clients must be positive");
    let kinds: Vec<SystemKind> =
        args.systems.iter().map(|s| SystemKind::parse(s)).collect::<Result<_, _>>()?;
    std::fs::create_dir_all(&args.out).with_context(|| format!("cannot create {}", args.out.display()))?;

    let runtime = crate::cli::runtime(plan.threads)?;
    let stop = Arc::new(AtomicBool::new(false));
    install_stop_signals(&runtime, stop.clone())?;

    // Programs first (installing what is missing), so a missing one is known before any run.
    let mut programs: BTreeMap<SystemKind, PathBuf> = BTreeMap::new();
    let mut versions = BTreeMap::new();
    let mut skipped = BTreeMap::new();
    let mut tools: BTreeMap<SystemKind, PathBuf> = BTreeMap::new();
    versions.insert("chorus".to_string(), env!("CARGO_PKG_VERSION").to_string());
    for kind in &kinds {
        let found = match kind {
            SystemKind::Chorus | SystemKind::Raftlog => Ok(chorus_exe.to_path_buf()),
            SystemKind::Redis | SystemKind::RedisWait => {
                procs::ensure_program("redis-server", &[], "redis-server", !args.no_install)
            }
            SystemKind::Etcd => {
                procs::ensure_program("etcd", &["/usr/bin/etcd"], "etcd-server", !args.no_install).and_then(
                    |etcd| {
                        let tool = crate::etcd_tool::ensure_tool(!args.no_install)?;
                        versions
                            .insert("etcd-benchmark".to_string(), crate::etcd_tool::TOOL_VERSION.to_string());
                        tools.insert(*kind, tool);
                        Ok(etcd)
                    },
                )
            }
            SystemKind::EtcdHttp => {
                procs::ensure_program("etcd", &["/usr/bin/etcd"], "etcd-server", !args.no_install)
            }
        };
        match found {
            Ok(path) => {
                if !matches!(kind, SystemKind::Chorus | SystemKind::Raftlog) {
                    versions.insert(kind.name().to_string(), procs::version(&path));
                }
                programs.insert(*kind, path);
            }
            Err(error) => {
                eprintln!("chorus bench: skipping {}: {error:#}", kind.name());
                skipped.insert(kind.name().to_string(), format!("{error:#}"));
            }
        }
    }

    // Every system runs for the whole comparison (idle ones cost little), and each point
    // measures the systems back to back, in an order that rotates from point to point and
    // round to round, so background noise that drifts over minutes hits them alike.
    let root = match &args.data_root {
        Some(dir) => dir.join(format!("chorus-bench-{}", std::process::id())),
        None => procs::scratch_root(),
    };
    let per_system = (plan.workloads.len() * plan.clients.len() * plan.rounds) as u64;
    let overall = crate::cli::bar(per_system * programs.len() as u64, "compare");
    let mut points = Vec::new();
    let mut running: Vec<System> = Vec::new();
    let mut configurations = BTreeMap::new();
    let result = (|| -> anyhow::Result<()> {
        for kind in &kinds {
            let Some(program) = programs.get(kind) else { continue };
            overall.set_message(format!("{} start", kind.name()));
            let started = start(*kind, program, &root, &runtime, &stop)
                .and_then(|mut system| load_system(&mut system, &plan, &runtime).map(|()| system));
            match started {
                Ok(mut system) => {
                    system.tool = tools.get(kind).cloned();
                    configurations.insert(kind.name().to_string(), system.procs.commands().to_vec());
                    running.push(system)
                }
                Err(error) => {
                    if stop.load(Ordering::Relaxed) {
                        return Err(error);
                    }
                    overall.suspend(|| eprintln!("chorus bench: {} did not start: {error:#}", kind.name()));
                    skipped.insert(kind.name().to_string(), format!("did not start: {error:#}"));
                    overall.inc(per_system);
                }
            }
        }
        let mut turn = 0usize;
        for workload in &plan.workloads {
            for &clients in &plan.clients {
                let mut rounds: Vec<Vec<Result<Round, String>>> =
                    running.iter().map(|_| Vec::new()).collect();
                for _ in 0..plan.rounds {
                    for k in 0..running.len() {
                        let i = (k + turn) % running.len();
                        if stop.load(Ordering::Relaxed) {
                            bail!("interrupted");
                        }
                        let system = &mut running[i];
                        if !system.kind.measures(workload) {
                            overall.inc(1);
                            continue;
                        }
                        system.procs.check_running()?;
                        overall.set_message(format!(
                            "{} {} c={clients}",
                            system.kind.name(),
                            workload.name()
                        ));
                        let report = run_point(system, workload, clients, &plan, &runtime, &stop);
                        if stop.load(Ordering::Relaxed) {
                            bail!("interrupted");
                        }
                        rounds[i].push(report.map_err(|error| format!("{error:#}")));
                        overall.inc(1);
                    }
                    turn += 1;
                }
                for (system, rounds) in running.iter().zip(rounds) {
                    if rounds.is_empty() {
                        continue;
                    }
                    let point = point_of(system.kind, workload, clients, rounds);
                    if let Some(failure) = &point.failure {
                        overall.suspend(|| {
                            eprintln!(
                                "chorus bench: {} {} c={clients}: {failure}",
                                system.kind.name(),
                                workload.name()
                            )
                        });
                    }
                    points.push(point);
                }
            }
        }
        Ok(())
    })();
    overall.finish_and_clear();
    for mut system in running {
        system.procs.stop();
    }
    let _ = std::fs::remove_dir_all(&root);
    result?;

    let targets = check_targets(&points);
    let comparison = Comparison {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        quick,
        started_unix_s: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0)
            .saturating_sub(started.elapsed().as_secs()),
        elapsed_s: started.elapsed().as_secs_f64(),
        machine: machine(),
        versions,
        systems: kinds.iter().map(|k| (k.name().to_string(), k.describe().to_string())).collect(),
        configurations,
        skipped,
        seconds_per_point: plan.point.as_secs_f64(),
        rounds: plan.rounds,
        records: plan.records,
        keys: plan.keys,
        points,
        targets,
    };
    let text = render_text(&comparison);
    print!("{text}");
    let json_path = args.out.join("compare.json");
    std::fs::write(&json_path, serde_json::to_string_pretty(&comparison)?)
        .with_context(|| format!("cannot write {}", json_path.display()))?;
    std::fs::write(args.out.join("compare.md"), &text)?;
    let plots = crate::plot::plot_all(&comparison, &args.out)?;
    println!("\nresults: {}", json_path.display());
    for plot in plots {
        println!("plot: {}", plot.display());
    }
    Ok(0)
}

fn install_stop_signals(runtime: &tokio::runtime::Runtime, stop: Arc<AtomicBool>) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    // Creating the streams registers the handlers now, before any child starts.
    let (mut interrupt, mut terminate) = runtime.block_on(async {
        anyhow::Ok((signal(SignalKind::interrupt())?, signal(SignalKind::terminate())?))
    })?;
    runtime.spawn(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
        eprintln!("chorus bench: stopping (signal)");
        stop.store(true, Ordering::Relaxed);
    });
    Ok(())
}

fn start(
    kind: SystemKind,
    program: &Path,
    root: &Path,
    runtime: &tokio::runtime::Runtime,
    stop: &AtomicBool,
) -> anyhow::Result<System> {
    let dir = root.join(kind.name());
    match kind {
        SystemKind::Chorus => start_chorus(kind, program, dir, "hermes", stop),
        SystemKind::Raftlog => start_chorus(kind, program, dir, "raftlog", stop),
        SystemKind::RedisWait => start_redis(kind, program, dir, 2, stop),
        SystemKind::Redis => start_redis(kind, program, dir, 0, stop),
        SystemKind::Etcd | SystemKind::EtcdHttp => start_etcd(kind, program, dir, runtime, stop),
    }
}

fn start_chorus(
    kind: SystemKind,
    exe: &Path,
    dir: PathBuf,
    protocol: &str,
    stop: &AtomicBool,
) -> anyhow::Result<System> {
    let mut procs = Procs::new(kind.name(), dir)?;
    let targets = procs::start_chorus_cluster(&mut procs, exe, protocol, 3, &[], stop)?;
    Ok(System::new(kind, procs, targets, Api::Resp, None))
}

impl System {
    fn new(kind: SystemKind, procs: Procs, targets: Vec<SocketAddr>, api: Api, wait: Option<Wait>) -> System {
        System { kind, procs, targets, api, wait, tool: None, tool_rates: BTreeMap::new() }
    }
}

fn start_redis(
    kind: SystemKind,
    program: &Path,
    dir: PathBuf,
    replicas: usize,
    stop: &AtomicBool,
) -> anyhow::Result<System> {
    let mut procs = Procs::new(kind.name(), dir)?;
    let ports = procs::free_ports(1 + replicas)?;
    for (i, port) in ports.iter().enumerate() {
        let data = procs.dir().join(format!("redis-{i}"));
        std::fs::create_dir_all(&data)?;
        let mut command = Command::new(program);
        command
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--daemonize", "no", "--protected-mode", "no", "--loglevel", "warning"])
            .arg("--dir")
            .arg(&data);
        if i > 0 {
            command.args(["--replicaof", "127.0.0.1", &ports[0].to_string()]);
        }
        procs.spawn(&format!("redis-{i}"), command)?;
    }
    let primary = localhost(ports[0]);
    let wanted = format!("connected_slaves:{replicas}");
    procs::wait_until(&mut procs, "redis primary", stop, || {
        procs::resp_text(primary, &[b"INFO", b"replication"]).is_ok_and(|info| info.contains(&wanted))
    })?;
    for port in &ports[1..] {
        let replica = localhost(*port);
        procs::wait_until(&mut procs, "redis replica", stop, || {
            procs::resp_text(replica, &[b"INFO", b"replication"])
                .is_ok_and(|info| info.contains("master_link_status:up"))
        })?;
    }
    let wait =
        (replicas > 0).then_some(Wait { replicas: replicas as u32, timeout_ms: 1000, aof_local: None });
    Ok(System::new(kind, procs, vec![primary], Api::Resp, wait))
}

fn start_etcd(
    kind: SystemKind,
    program: &Path,
    dir: PathBuf,
    runtime: &tokio::runtime::Runtime,
    stop: &AtomicBool,
) -> anyhow::Result<System> {
    let mut procs = Procs::new(kind.name(), dir)?;
    let ports = procs::free_ports(6)?;
    let url = |port: u16| format!("http://127.0.0.1:{port}");
    let cluster: Vec<String> = (0..3).map(|i| format!("m{i}={}", url(ports[3 + i]))).collect();
    let mut targets = Vec::new();
    for i in 0..3 {
        let mut command = Command::new(program);
        command
            .args(["--name", &format!("m{i}")])
            .arg("--data-dir")
            .arg(procs.dir().join(format!("m{i}")))
            .args(["--listen-client-urls", &url(ports[i]), "--advertise-client-urls", &url(ports[i])])
            .args([
                "--listen-peer-urls",
                &url(ports[3 + i]),
                "--initial-advertise-peer-urls",
                &url(ports[3 + i]),
            ])
            .args(["--initial-cluster", &cluster.join(",")])
            .args(["--initial-cluster-token", &format!("chorus-bench-{}", std::process::id())])
            .args(["--initial-cluster-state", "new", "--logger", "zap", "--log-level", "warn"]);
        procs.spawn(&format!("etcd-{i}"), command)?;
        targets.push(localhost(ports[i]));
    }
    for target in &targets {
        let target = *target;
        procs::wait_until(&mut procs, "etcd member", stop, || {
            runtime.block_on(async {
                let attempt = async {
                    let mut conn = crate::etcd::EtcdConn::connect(target).await?;
                    // Also the key the benchmark tool's `range` reads: a kv-sized value.
                    let value = crate::etcd::b64(&[b'v'; 32]);
                    conn.put(crate::etcd_tool::RANGE_KEY.as_bytes(), &value).await
                };
                matches!(tokio::time::timeout(Duration::from_secs(2), attempt).await, Ok(Ok(())))
            })
        })?;
    }
    Ok(System::new(kind, procs, targets, Api::Etcd, None))
}

fn client_config(system: &System, workload: &Workload, plan: &Plan) -> ClientConfig {
    let (keyspace, value_bytes) = match workload {
        Workload::Ycsb(_) => (Keyspace::Ycsb { fields: 10 }, 100),
        Workload::Kv(_) => (Keyspace::Kv, plan.value_bytes),
    };
    ClientConfig { api: system.api, keyspace, value_bytes, wait: system.wait, seed: 1 }
}

fn options(system: &System, workload: &Workload, plan: &Plan, clients: usize) -> RunOptions {
    RunOptions {
        targets: system.targets.clone(),
        clients,
        pipeline: 1,
        rate: None,
        operations: plan.ops,
        duration_max: Some(plan.point),
        client: client_config(system, workload, plan),
    }
}

/// Inserts the YCSB records and the microworkload keys the plan's workloads read.
fn load_system(system: &mut System, plan: &Plan, runtime: &tokio::runtime::Runtime) -> anyhow::Result<()> {
    if system.kind == SystemKind::Etcd {
        return Ok(()); // the tool's puts need nothing, its range reads the key written at start
    }
    let ycsb = plan.workloads.iter().find(|w| matches!(w, Workload::Ycsb(_)));
    let kv = plan.workloads.iter().find(|w| matches!(w, Workload::Kv(_)));
    for (workload, items) in [(ycsb, plan.records), (kv, plan.keys)] {
        let Some(workload) = workload else { continue };
        system.procs.check_running()?;
        let options = options(system, workload, plan, 32);
        runtime
            .block_on(driver::load(&options, items, 32, &ProgressBar::hidden()))
            .with_context(|| format!("{}: loading for {}", system.kind.name(), workload.name()))?;
    }
    Ok(())
}

/// One round of one point, with the servers' CPU time over it.
fn run_point(
    system: &mut System,
    workload: &Workload,
    clients: usize,
    plan: &Plan,
    runtime: &tokio::runtime::Runtime,
    stop: &Arc<AtomicBool>,
) -> anyhow::Result<Round> {
    let pids = system.procs.pids();
    let aborts_before = rmw_aborts(system);
    let cpu_before = crate::group::run::tree_cpu_us(&pids);
    let report = match system.tool.clone() {
        Some(tool) => run_tool_point(system, &tool, workload, clients, plan)?,
        None => run_driver_point(system, workload, clients, plan, runtime, stop)?,
    };
    let cpu_after = crate::group::run::tree_cpu_us(&pids);
    let server_cpu_us_per_op = match (cpu_before, cpu_after) {
        (Some(before), Some(after)) if report.operations > 0 => {
            Some(after.saturating_sub(before) as f64 / report.operations as f64)
        }
        _ => None,
    };
    let rmw_aborts = match (aborts_before, rmw_aborts(system)) {
        (Some(before), Some(after)) => Some(after.saturating_sub(before)),
        _ => None,
    };
    Ok(Round { report, server_cpu_us_per_op, rmw_aborts })
}

/// Hermes' `rmw_aborts` summed over the replicas (`None` for other systems).
fn rmw_aborts(system: &System) -> Option<u64> {
    if system.kind != SystemKind::Chorus {
        return None;
    }
    let mut total = 0;
    for target in &system.targets {
        let info = procs::resp_text(*target, &[b"INFO", b"stats"]).ok()?;
        let line = info.lines().find_map(|line| line.strip_prefix("hermes_rmw_aborts:"))?;
        total += line.trim().parse::<u64>().ok()?;
    }
    Some(total)
}

/// One run of etcd's benchmark tool, sized from the previous one to last about a point.
fn run_tool_point(
    system: &mut System,
    tool: &Path,
    workload: &Workload,
    clients: usize,
    plan: &Plan,
) -> anyhow::Result<Report> {
    let tool_workload = match workload {
        Workload::Kv(100) => {
            crate::etcd_tool::ToolWorkload::Put { key_space: plan.keys, value_bytes: plan.value_bytes }
        }
        Workload::Kv(0) => crate::etcd_tool::ToolWorkload::Range,
        other => bail!("etcd's benchmark tool does not run {}", other.name()),
    };
    let key = (workload.name(), clients);
    let seconds = plan.point.as_secs_f64();
    if !system.tool_rates.contains_key(&key) {
        // A short first run measures the rate that sizes the measured one.
        let requests = crate::etcd_tool::requests_for(None, seconds, clients);
        let args = crate::etcd_tool::arguments(&system.targets, clients, requests, &tool_workload);
        let warmup = crate::etcd_tool::run(tool, &args)?;
        system.tool_rates.insert(key.clone(), warmup.ops_per_s);
    }
    let requests = crate::etcd_tool::requests_for(system.tool_rates.get(&key).copied(), seconds, clients);
    let args = crate::etcd_tool::arguments(&system.targets, clients, requests, &tool_workload);
    let report = crate::etcd_tool::run(tool, &args)?;
    system.tool_rates.insert(key, report.ops_per_s);
    Ok(report)
}

/// One round of one point with this crate's load generator.
fn run_driver_point(
    system: &System,
    workload: &Workload,
    clients: usize,
    plan: &Plan,
    runtime: &tokio::runtime::Runtime,
    stop: &Arc<AtomicBool>,
) -> anyhow::Result<Report> {
    let generators = match workload {
        Workload::Ycsb(letter) => {
            let spec = YcsbSpec::core(*letter, plan.records, plan.ops)?;
            OpGen::ycsb(&spec, 1, clients)
        }
        Workload::Kv(percent) => {
            let spec = KvSpec {
                write_ratio: *percent as f64 / 100.0,
                keys: plan.keys,
                operations: plan.ops,
                value_bytes: plan.value_bytes,
                distribution: Distribution::Zipfian,
            };
            OpGen::kv(&spec, 1, clients)
        }
    };
    let options = options(system, workload, plan, clients);
    let result = runtime.block_on(driver::run(&options, generators, &ProgressBar::hidden(), stop.clone()))?;
    Ok(Report::of(&result))
}

fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

/// Combines the rounds of one point: medians of throughput and of each percentile.
fn point_of(
    system: SystemKind,
    workload: &Workload,
    clients: usize,
    rounds: Vec<Result<Round, String>>,
) -> Point {
    let measured: Vec<&Round> = rounds.iter().filter_map(|r| r.as_ref().ok()).collect();
    let reports: Vec<&Report> = measured.iter().map(|round| &round.report).collect();
    let mut cpu: Vec<f64> = measured.iter().filter_map(|round| round.server_cpu_us_per_op).collect();
    let round_server_cpu_us_per_op = cpu.clone();
    let server_cpu_us_per_op = (!cpu.is_empty()).then(|| median(&mut cpu));
    let aborts: Vec<u64> = measured.iter().filter_map(|round| round.rmw_aborts).collect();
    let rmw_aborts = (!aborts.is_empty()).then(|| aborts.iter().sum());
    let failure = rounds
        .iter()
        .find_map(|r| r.as_ref().err().cloned())
        .or_else(|| reports.iter().find_map(|r| r.first_error.clone()));
    let pick = |f: fn(&Report) -> f64| median(&mut reports.iter().map(|r| f(r)).collect::<Vec<_>>());
    Point {
        system,
        workload: workload.name(),
        clients,
        ops_per_s: pick(|r| r.ops_per_s),
        errors: reports.iter().map(|r| r.errors).sum(),
        p50_us: pick(|r| r.overall.latency.p50_us),
        p95_us: pick(|r| r.overall.latency.p95_us),
        p99_us: pick(|r| r.overall.latency.p99_us),
        p99_9_us: pick(|r| r.overall.latency.p99_9_us),
        max_us: pick(|r| r.overall.latency.max_us),
        round_ops_per_s: reports.iter().map(|r| r.ops_per_s).collect(),
        server_cpu_us_per_op,
        round_server_cpu_us_per_op,
        rmw_aborts,
        failure,
        reports: reports.into_iter().cloned().collect(),
    }
}

fn find<'a>(points: &'a [Point], system: SystemKind, workload: &str, clients: usize) -> Option<&'a Point> {
    points
        .iter()
        .find(|p| p.system == system && p.workload == workload && p.clients == clients && p.ops_per_s > 0.0)
}

/// The issue's targets, as far as this run measured them.
pub fn check_targets(points: &[Point]) -> Vec<TargetCheck> {
    let mut checks = Vec::new();
    let chorus = |workload: &str, clients| find(points, SystemKind::Chorus, workload, clients);
    let mut ratio_check =
        |target: &str, mine: Option<f64>, theirs: Option<f64>, wanted: f64, higher_is_better: bool| {
            let (measured, met) = match (mine, theirs) {
                (Some(mine), Some(theirs)) if mine > 0.0 && theirs > 0.0 => {
                    let ratio = mine / theirs;
                    let met = if higher_is_better { ratio >= wanted } else { ratio <= wanted };
                    let miss = if met {
                        String::new()
                    } else if higher_is_better {
                        format!(" (missed by {:.0}%)", (1.0 - ratio / wanted) * 100.0)
                    } else {
                        format!(" (missed by {:.0}%)", (ratio / wanted - 1.0) * 100.0)
                    };
                    (format!("{ratio:.2}x{miss}"), Some(met))
                }
                _ => ("not measured".to_string(), None),
            };
            checks.push(TargetCheck { target: target.to_string(), measured, met });
        };
    let ops = |p: Option<&Point>| p.map(|p| p.ops_per_s);
    let p99 = |p: Option<&Point>| p.map(|p| p.p99_us);
    let p99_9 = |p: Option<&Point>| p.map(|p| p.p99_9_us);
    let p50 = |p: Option<&Point>| p.map(|p| p.p50_us);
    let redis = |workload: &str, clients| find(points, SystemKind::Redis, workload, clients);
    let redis_wait = |workload: &str, clients| find(points, SystemKind::RedisWait, workload, clients);
    let (set, get) = ("kv-w100", "kv-w0");
    // Issue 23.
    ratio_check(
        "kv-w100 (SET), 64 clients: Chorus throughput >= 1.0x unreplicated Redis",
        ops(chorus(set, 64)),
        ops(redis(set, 64)),
        1.0,
        true,
    );
    ratio_check(
        "kv-w100 (SET), 64 clients: Chorus p99 <= Redis SET+WAIT 2 p99",
        p99(chorus(set, 64)),
        p99(redis_wait(set, 64)),
        1.0,
        false,
    );
    ratio_check(
        "kv-w0 (GET), 64 clients: Chorus throughput >= 1.2x unreplicated Redis",
        ops(chorus(get, 64)),
        ops(redis(get, 64)),
        1.2,
        true,
    );
    ratio_check(
        "kv-w0 (GET), 64 clients: Chorus p99 <= Redis p99",
        p99(chorus(get, 64)),
        p99(redis(get, 64)),
        1.0,
        false,
    );
    ratio_check(
        "kv-w0 (GET), 64 clients: Chorus p99.9 <= Redis p99.9",
        p99_9(chorus(get, 64)),
        p99_9(redis(get, 64)),
        1.0,
        false,
    );
    ratio_check(
        "kv-w100 (SET), 1 client: Chorus p50 <= 2.2x Redis p50",
        p50(chorus(set, 1)),
        p50(redis(set, 1)),
        2.2,
        false,
    );
    ratio_check(
        "kv-w0 (GET), 1 client: Chorus p50 <= 1.1x Redis p50",
        p50(chorus(get, 1)),
        p50(redis(get, 1)),
        1.1,
        false,
    );
    ratio_check(
        "ycsb-a, 64 clients: Chorus p99 <= 1.5x Redis SET+WAIT 2 p99",
        p99(chorus("ycsb-a", 64)),
        p99(redis_wait("ycsb-a", 64)),
        1.5,
        false,
    );
    // Issue 4's etcd targets, now against etcd over gRPC.
    ratio_check(
        "kv-w100, 64 clients: Chorus write throughput >= 10x etcd (gRPC)",
        ops(chorus(set, 64)),
        ops(find(points, SystemKind::Etcd, set, 64)),
        10.0,
        true,
    );
    ratio_check(
        "kv-w100, 64 clients: raftlog (durable) write throughput vs etcd (gRPC) >= 1x",
        ops(find(points, SystemKind::Raftlog, set, 64)),
        ops(find(points, SystemKind::Etcd, set, 64)),
        1.0,
        true,
    );
    checks
}

fn format_ratio(value: f64, chorus: f64) -> String {
    if chorus > 0.0 && value > 0.0 {
        format!("{:.2}", value / chorus)
    } else {
        "-".to_string()
    }
}

/// The table (Markdown, readable as text too) and the target checks.
pub fn render_text(comparison: &Comparison) -> String {
    let mut out = String::new();
    let m = &comparison.machine;
    out.push_str(&format!(
        "machine: {} CPUs, {}, kernel {}; {:.1} s per point, {} round(s) per point (medians); {} YCSB records, {} kv keys\n",
        m.nproc, m.cpu_model, m.kernel, comparison.seconds_per_point, comparison.rounds, comparison.records, comparison.keys
    ));
    for (name, version) in &comparison.versions {
        out.push_str(&format!("{name}: {version}\n"));
    }
    for (name, why) in &comparison.skipped {
        out.push_str(&format!("skipped {name}: {why}\n"));
    }
    out.push_str("\nSystems:\n");
    for (name, what) in &comparison.systems {
        out.push_str(&format!("- {name}: {what}\n"));
        for (label, command) in comparison.configurations.get(name).into_iter().flatten() {
            out.push_str(&format!("    {label}: {command}\n"));
        }
    }
    out.push_str("\nRatios are system / Chorus (ops/s: above 1 means faster than Chorus; latency: above 1 means slower).\n");
    out.push_str("CPU us/op: user + system CPU of every server process of the system over the point, per operation.\n\n");
    out.push_str("| workload | clients | system | ops/s | p50 us | p99 us | p99.9 us | CPU us/op | ops/s vs chorus | p50 vs chorus | p99 vs chorus | errors | RMW aborts |\n");
    out.push_str("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    let mut workloads: Vec<&str> = Vec::new();
    for point in &comparison.points {
        if !workloads.contains(&point.workload.as_str()) {
            workloads.push(&point.workload);
        }
    }
    let mut clients: Vec<usize> = comparison.points.iter().map(|p| p.clients).collect();
    clients.sort_unstable();
    clients.dedup();
    let mut systems: Vec<SystemKind> = comparison.points.iter().map(|p| p.system).collect();
    systems.sort();
    systems.dedup();
    for workload in &workloads {
        for &c in &clients {
            let chorus = comparison
                .points
                .iter()
                .find(|p| p.system == SystemKind::Chorus && p.workload == *workload && p.clients == c);
            for system in &systems {
                let Some(point) = comparison
                    .points
                    .iter()
                    .find(|p| p.system == *system && p.workload == *workload && p.clients == c)
                else {
                    continue;
                };
                let (ops_ratio, p50_ratio, p99_ratio) = match chorus {
                    Some(ch) => (
                        format_ratio(point.ops_per_s, ch.ops_per_s),
                        format_ratio(point.p50_us, ch.p50_us),
                        format_ratio(point.p99_us, ch.p99_us),
                    ),
                    None => ("-".into(), "-".into(), "-".into()),
                };
                let errors = match &point.failure {
                    Some(_) if point.reports.is_empty() => "failed".to_string(),
                    _ => point.errors.to_string(),
                };
                let cpu = point.server_cpu_us_per_op.map_or("-".to_string(), |cpu| format!("{cpu:.1}"));
                let aborts = point.rmw_aborts.map_or("-".to_string(), |aborts| aborts.to_string());
                out.push_str(&format!(
                    "| {} | {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {} | {} | {} | {} | {} | {} |\n",
                    workload,
                    c,
                    system.name(),
                    point.ops_per_s,
                    point.p50_us,
                    point.p99_us,
                    point.p99_9_us,
                    cpu,
                    ops_ratio,
                    p50_ratio,
                    p99_ratio,
                    errors,
                    aborts
                ));
            }
        }
    }
    out.push_str("\nTargets (issues 23 and 4):\n\n| target | measured | met |\n|---|---|---|\n");
    for check in &comparison.targets {
        let met = match check.met {
            Some(true) => "yes",
            Some(false) => "NO",
            None => "-",
        };
        out.push_str(&format!("| {} | {} | {} |\n", check.target, check.measured, met));
    }
    let failures: Vec<&Point> = comparison.points.iter().filter(|p| p.failure.is_some()).collect();
    if !failures.is_empty() {
        out.push_str("\nErrors:\n");
        for p in failures {
            out.push_str(&format!(
                "- {} {} c={}: {}\n",
                p.system.name(),
                p.workload,
                p.clients,
                p.failure.as_deref().unwrap_or("")
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Latency, OpStats};

    fn report(ops_per_s: f64, p50_us: f64, p99_us: f64, p99_9_us: f64) -> Report {
        let latency = Latency { p50_us, p99_us, p99_9_us, ..Latency::default() };
        let overall = OpStats { operation: "ALL".into(), count: 1000, errors: 0, ops_per_s, latency };
        Report {
            elapsed_s: 1.0,
            operations: 1000,
            errors: 0,
            ops_per_s,
            by_operation: vec![overall.clone()],
            overall,
            first_error: None,
        }
    }

    fn round(ops_per_s: f64, cpu: f64, aborts: Option<u64>) -> Result<Round, String> {
        Ok(Round {
            report: report(ops_per_s, 100.0, 1000.0, 2000.0),
            server_cpu_us_per_op: Some(cpu),
            rmw_aborts: aborts,
        })
    }

    #[test]
    fn a_point_has_the_median_cpu_per_operation_and_every_rounds_aborts() {
        let rounds =
            vec![round(100.0, 30.0, Some(2)), round(300.0, 10.0, Some(5)), round(200.0, 20.0, Some(0))];
        let point = point_of(SystemKind::Chorus, &Workload::Kv(100), 64, rounds);
        assert_eq!(point.ops_per_s, 200.0);
        assert_eq!(point.server_cpu_us_per_op, Some(20.0));
        assert_eq!(point.round_server_cpu_us_per_op, vec![30.0, 10.0, 20.0]);
        assert_eq!(point.rmw_aborts, Some(7));
        let redis = point_of(SystemKind::Redis, &Workload::Kv(100), 64, vec![round(1.0, 5.0, None)]);
        assert_eq!(redis.rmw_aborts, None);
    }

    fn point(
        system: SystemKind,
        workload: Workload,
        clients: usize,
        ops: f64,
        p50: f64,
        p99: f64,
        p99_9: f64,
    ) -> Point {
        let mut rounds = vec![round(ops, 1.0, None)];
        if let Ok(round) = &mut rounds[0] {
            round.report = report(ops, p50, p99, p99_9);
        }
        point_of(system, &workload, clients, rounds)
    }

    #[test]
    fn issue_23s_targets_are_ratios_to_redis_alone_and_with_wait() {
        use SystemKind::{Chorus, Redis, RedisWait};
        let points = vec![
            point(Chorus, Workload::Kv(100), 64, 50_000.0, 1000.0, 2000.0, 4000.0),
            point(Redis, Workload::Kv(100), 64, 40_000.0, 900.0, 1500.0, 3000.0),
            point(RedisWait, Workload::Kv(100), 64, 30_000.0, 1500.0, 2500.0, 5000.0),
            point(Chorus, Workload::Kv(0), 64, 60_000.0, 500.0, 3000.0, 9000.0),
            point(Redis, Workload::Kv(0), 64, 60_000.0, 500.0, 2000.0, 3000.0),
        ];
        let checks = check_targets(&points);
        let met = |prefix: &str| {
            checks.iter().find(|c| c.target.starts_with(prefix)).map(|c| (c.met, c.measured.clone()))
        };
        assert_eq!(met("kv-w100 (SET), 64 clients: Chorus throughput"), Some((Some(true), "1.25x".into())));
        assert_eq!(met("kv-w100 (SET), 64 clients: Chorus p99"), Some((Some(true), "0.80x".into())));
        assert_eq!(
            met("kv-w0 (GET), 64 clients: Chorus throughput"),
            Some((Some(false), "1.00x (missed by 17%)".into()))
        );
        assert_eq!(
            met("kv-w0 (GET), 64 clients: Chorus p99.9"),
            Some((Some(false), "3.00x (missed by 200%)".into()))
        );
        assert_eq!(met("ycsb-a, 64 clients"), Some((None, "not measured".into())));
    }
}
