//! `chorus bench tenants`: the multi-tenant experiment of HyperLoop §2.2 and §6.2 (run by
//! [`run`]), with its figures and the target ratios:
//!
//! * `tenants-latency.png`: update latency (average, p95, p99) vs the number of tenants, one
//!   panel per statistic (the shape of Figure 2(a) and Figures 11-12);
//! * `tenants-cpu.png`: the replicas' CPU time per operation, cores they kept busy and
//!   updates per second vs the number of tenants.
//!
//! Solid lines: no background load; dashed: with stress-ng on every core.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;

pub mod run;

use run::{
    measure_point, target_ratios, PointSpec, Replicas, TenantClient, TenantsConfig, TenantsMode,
    TenantsReport, TenantsResult,
};

use crate::procs::{self, Procs};
use crate::resp::{self, Reply};
use chorus_group::kernel::netlab::NetLab;
use chorus_group::runtime::Datapath;

use crate::charts::{draw_grid, palette, Panel, Series};

/// The tenant count of the target (point 4), under background load.
pub const TARGET_TENANTS: usize = 32;
/// Naïve-Event p99 over the chain's p99, at least.
pub const TARGET_P99_RATIO: f64 = 10.0;
/// Reduction of the (p99 - average) gap, percent, at least (the paper: 81% on MongoDB).
pub const TARGET_GAP_REDUCTION_PCT: f64 = 80.0;

#[derive(clap::Args, Debug)]
pub struct TenantsArgs {
    /// Tenant counts, comma separated (default 1,8,32,100; --quick: 1,8,32).
    #[arg(long, value_delimiter = ',')]
    pub tenants: Option<Vec<usize>>,
    /// Protocols, comma separated: chain (one group host per host serves every tenant),
    /// naive (Naïve-Event: a replica process per tenant per host), naive-polling, hermes (one
    /// `chorus node --protocol hermes` per host serves every tenant's keys through RESP).
    #[arg(long, value_delimiter = ',', default_value = "chain,naive")]
    pub protocol: Vec<String>,
    /// Also run every point with stress-ng loading every core (installed with apt-get when
    /// missing and running as root).
    #[arg(long)]
    pub background_load: bool,
    /// T = 1, 8, 32 and 2 s per point: about two minutes with --background-load.
    #[arg(long)]
    pub quick: bool,
    /// Measured seconds per point (default 10; --quick: 2).
    #[arg(long)]
    pub measure_s: Option<f64>,
    /// Largest T run for the Naïve protocols (3 processes per tenant); larger T are skipped
    /// and reported as such.
    #[arg(long, default_value_t = 100)]
    pub naive_tenants_max: usize,
    /// Start the host processes (and so the Naïve replicas they fork) with this niceness,
    /// e.g. -10 to rank replication above the background load (negative needs root).
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    pub replica_nice: i32,
    /// Run the tenants' client threads at this niceness, e.g. -10: the paper's clients run on
    /// other machines, away from the background load (negative needs root).
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    pub client_nice: i32,
    /// Run the replicas (hosts, Naïve replicas, Hermes nodes) and the tenants' client event
    /// loop under SCHED_FIFO priority 1, the background load under the default class: the
    /// paper's NIC data path and remote clients are never descheduled by the tenants' load
    /// (needs root; the niceness options do not apply).
    #[arg(long)]
    pub fifo: bool,
    /// Run the background load under SCHED_IDLE (`chrt -i 0`): it keeps every core busy but
    /// yields at once to any replica or client, which keep the default class (no privilege
    /// needed; nothing real-time to starve the kernel's own threads, unlike --fifo).
    #[arg(long)]
    pub idle_load: bool,
    /// Measure every point this many times (interleaved, fresh replicas each time) and report
    /// each statistic's median, e.g. `--tenants 32 --rounds 5` for the target.
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// kernel: the chain's hosts apply and forward in the kernel's packet path (XDP; needs
    /// root and a build with clang), every group-host mode runs in network namespaces joined
    /// by veth pairs; user: loopback, the host processes do the work.
    #[arg(long, default_value = "user")]
    pub datapath: String,
    /// Spread the tenants' clients over this many event-loop threads (every protocol alike;
    /// default 1). On the kernel path the chain runs inside the clients' `sendto`, so the
    /// clients' threads are the chain's share of the CPU.
    #[arg(long, default_value_t = 1)]
    pub client_threads: usize,
    /// Keep the tenants' client event loops on this CPU (every protocol alike; the replicas
    /// and the background load stay free to run anywhere).
    #[arg(long, value_name = "CPU")]
    pub client_cpu: Option<usize>,
    /// Kernel path: steer the callers' datagrams at every chain host to these CPUs (a
    /// hexadecimal mask, e.g. 2 for CPU 1) with Receive Packet Steering, so every hop runs in
    /// those CPUs' NET_RX softirq instead of inside the clients' `sendto`. With --client-cpu
    /// outside the mask, no hop runs on the clients' CPU.
    #[arg(long, value_name = "MASK")]
    pub caller_rps_cpus: Option<String>,
    /// Where everything runs (docs/decisions.md entry 13). paper (the default on two or more
    /// CPUs): HyperLoop §6.2's server, the clients on a "client socket" (CPU 0) and on a
    /// "replica socket" (every other CPU) the replica processes, the background load (10
    /// stress-ng threads per replica CPU: "the number of application threads on each socket
    /// is 10x the number of its CPU cores") and the receive softirq of every replica's
    /// interface (kernel path: the chain's hops), by affinity only, alike for every protocol.
    /// shared: every thread anywhere, stress-ng with one thread per CPU.
    #[arg(long, value_name = "paper|shared", default_value = "paper")]
    pub topology: String,
    /// End the output with one JSON line: the data path, the target's ratios at T=32 under
    /// load, and the chain replicas' user CPU per operation there.
    #[arg(long)]
    pub json: bool,
    /// Where tenants.json and the PNG figures go.
    #[arg(long, default_value = "bench-results")]
    pub out: PathBuf,
    /// Measure nothing: print the summary and redraw the figures from a saved tenants.json.
    #[arg(long, value_name = "JSON")]
    pub from_json: Option<PathBuf>,
}

fn parse_protocol(name: &str) -> anyhow::Result<TenantsMode> {
    match name {
        "chain" | "chorus" => Ok(TenantsMode::Chorus),
        "naive" | "naive-event" => Ok(TenantsMode::Naive),
        "naive-polling" => Ok(TenantsMode::NaivePolling),
        "hermes" => Ok(TenantsMode::Hermes),
        other => anyhow::bail!("unknown protocol {other:?}: expected chain, naive, naive-polling or hermes"),
    }
}

/// The configuration `args` ask for. `child_command` starts hosts and Naïve replicas.
pub fn config_of(
    args: &TenantsArgs,
    child_command: Vec<String>,
    background_load_command: Option<Vec<String>>,
) -> anyhow::Result<TenantsConfig> {
    let mut config = if args.quick { TenantsConfig::quick() } else { TenantsConfig::default() };
    config.modes = args.protocol.iter().map(|p| parse_protocol(p.trim())).collect::<anyhow::Result<_>>()?;
    if let Some(tenants) = &args.tenants {
        anyhow::ensure!(tenants.iter().all(|&t| t >= 1), "--tenants are at least 1");
        config.tenants = tenants.clone();
    }
    if let Some(seconds) = args.measure_s {
        anyhow::ensure!(seconds > 0.0 && seconds.is_finite(), "--measure-s must be positive");
        config.measure_s = seconds;
        config.warmup_s = config.warmup_s.min(seconds);
    }
    config.naive_tenants_max = args.naive_tenants_max;
    anyhow::ensure!((-20..=19).contains(&args.replica_nice), "--replica-nice is -20 to 19");
    config.replica_nice = args.replica_nice;
    anyhow::ensure!((-20..=19).contains(&args.client_nice), "--client-nice is -20 to 19");
    config.client_nice = args.client_nice;
    config.fifo = args.fifo;
    anyhow::ensure!(args.rounds >= 1, "--rounds is at least 1");
    config.rounds = args.rounds;
    anyhow::ensure!(args.client_threads >= 1, "--client-threads is at least 1");
    config.client_threads = args.client_threads;
    config.client_cpu = args.client_cpu;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    config.sockets = match args.topology.as_str() {
        "shared" => None,
        "paper" => {
            anyhow::ensure!(
                args.client_cpu.is_none() && args.caller_rps_cpus.is_none(),
                "--client-cpu and --caller-rps-cpus apply to --topology shared (paper places the \
                 clients and the hops itself)"
            );
            let sockets = run::Sockets::split(cpus);
            if sockets.is_none() {
                eprintln!("tenants: one CPU: --topology paper needs two, running shared");
            }
            sockets
        }
        other => anyhow::bail!("--topology {other:?}: expected paper or shared"),
    };
    if let Some(mask) = &args.caller_rps_cpus {
        anyhow::ensure!(
            !mask.is_empty() && mask.chars().all(|c| c.is_ascii_hexdigit()),
            "--caller-rps-cpus is a hexadecimal CPU mask, e.g. 2 for CPU 1"
        );
        config.caller_rps_cpus = Some(mask.clone());
    }
    config.child_command = Some(child_command);
    anyhow::ensure!(
        !args.idle_load || background_load_command.is_some(),
        "--idle-load sets the background load's class: it needs --background-load"
    );
    config.idle_load = args.idle_load;
    config.datapath = args.datapath.parse().map_err(|e: String| anyhow::anyhow!("--datapath: {e}"))?;
    if config.datapath == Datapath::Kernel {
        if let Some(reason) = chorus_group::kernel::unavailable_reason().or_else(NetLab::unavailable_reason) {
            anyhow::bail!("--datapath kernel cannot run here: {reason}");
        }
    }
    let background_load_command = match (&config.sockets, background_load_command) {
        (Some(sockets), Some(command)) => Some(on_replica_socket(sockets, command)),
        (_, command) => command,
    };
    let idle = ["chrt", "-i", "0"].map(String::from);
    config.background_load_command = match background_load_command {
        Some(command) if args.idle_load => Some([idle.to_vec(), command].concat()),
        command => command,
    };
    Ok(config)
}

/// The background load on the replica socket: `taskset -c <replica CPUs>`, and stress-ng's
/// `--cpu` raised to 10 threads per replica CPU (the paper's 10x application threads per core).
fn on_replica_socket(sockets: &run::Sockets, mut command: Vec<String>) -> Vec<String> {
    if let Some(at) = command.iter().position(|arg| arg == "--cpu") {
        if let Some(count) = command.get_mut(at + 1) {
            *count = sockets.background_threads().to_string();
        }
    }
    [vec!["taskset".to_string(), "-c".to_string(), sockets.replica_list()], command].concat()
}

/// Run (or reload), save tenants.json, draw, print. `chorus` is the binary hosts run as.
pub fn run(
    args: TenantsArgs,
    chorus: &Path,
    background_load_command: Option<Vec<String>>,
) -> anyhow::Result<i32> {
    let json = args.out.join("tenants.json");
    let report: TenantsReport = match &args.from_json {
        Some(path) => serde_json::from_str(&std::fs::read_to_string(path)?)?,
        None => {
            let child = vec![chorus.display().to_string(), "naive-replica".to_string()];
            let config = config_of(&args, child, background_load_command)?;
            let stop = AtomicBool::new(false);
            let mut hermes = |point: &PointSpec| hermes_point(chorus, point, &stop);
            let report = run::run_with(config, &mut hermes)?;
            std::fs::create_dir_all(&args.out)?;
            std::fs::write(&json, serde_json::to_vec_pretty(&report)?)?;
            report
        }
    };
    print!("{}", report.table());
    print!("{}", summary(&report));
    if args.from_json.is_none() {
        println!("JSON report: {}", json.display());
    }
    let dir = match &args.from_json {
        Some(path) => path.parent().map(Path::to_path_buf).unwrap_or_default(),
        None => args.out.clone(),
    };
    for plot in plot_all(&report, &dir)? {
        println!("plot: {}", plot.display());
    }
    if args.json {
        println!("{}", target_line(&report));
    }
    Ok(0)
}

/// The target as one JSON line: `datapath`, `p99_ratio_t32_load`,
/// `gap_reduction_t32_load` (percent) and `replica_user_cpu_us_per_op` (the chain's replicas
/// at T=32 under load). Missing points are null.
pub fn target_line(report: &TenantsReport) -> String {
    let ratios = target_ratios(report, TenantsMode::Chorus, TARGET_TENANTS, true);
    let chain = report.find(TenantsMode::Chorus, TARGET_TENANTS, true);
    let line = serde_json::json!({
        "datapath": chain.map_or(report.config.datapath, |r| r.datapath).name(),
        "p99_ratio_t32_load": ratios.map(|(ratio, _)| ratio),
        "gap_reduction_t32_load": ratios.map(|(_, gap)| gap),
        "replica_user_cpu_us_per_op": chain.and_then(|r| r.replica_user_cpu_us_per_op),
    });
    line.to_string()
}

fn mode_color(mode: TenantsMode) -> plotters::style::RGBColor {
    match mode {
        TenantsMode::Chorus => palette(0),
        TenantsMode::Naive => palette(1),
        TenantsMode::NaivePolling => palette(2),
        TenantsMode::Hermes => palette(3),
    }
}

fn label(mode: TenantsMode, loaded: bool) -> String {
    let name = match mode {
        TenantsMode::Chorus => "chain",
        TenantsMode::Naive => "naive-event",
        TenantsMode::NaivePolling => "naive-polling",
        TenantsMode::Hermes => "hermes",
    };
    if loaded {
        format!("{name} +load")
    } else {
        name.to_string()
    }
}

/// A Hermes tenant: its records are the keys `tenant<t>:<record>`, on one RESP connection.
struct HermesTenant {
    conn: resp::RespConn,
    tenant: usize,
}

impl HermesTenant {
    /// Tenant `t` talks to node `t mod 3`: every node coordinates a third of the tenants' writes
    /// (Hermes writes from any replica) and serves their reads locally.
    async fn connect(targets: &[SocketAddr], t: usize) -> anyhow::Result<HermesTenant> {
        let conn = resp::RespConn::connect(targets[t % targets.len()]).await?;
        Ok(HermesTenant { conn, tenant: t })
    }

    /// One command and its reply (a silent node fails the point in the event loop's phase
    /// deadline, for every mode alike).
    async fn call(&mut self, args: &[&[u8]]) -> anyhow::Result<()> {
        match self.conn.call(args).await? {
            Reply::Error(error) => Err(anyhow::anyhow!("tenant {}: {error}", self.tenant)),
            _ => Ok(()),
        }
    }

    fn key(&self, record: u64) -> String {
        format!("tenant{}:{record}", self.tenant)
    }
}

impl TenantClient for HermesTenant {
    /// A local read at the tenant's node (Hermes: any replica, linearizable).
    async fn read(&mut self, record: u64) -> anyhow::Result<()> {
        let key = self.key(record);
        self.call(&[b"GET", key.as_bytes()]).await
    }

    /// A replicated write coordinated by the tenant's node: INV to the others, VAL after
    /// their ACKs (Hermes §3.2).
    async fn update(&mut self, record: u64, value: &[u8]) -> anyhow::Result<()> {
        let key = self.key(record);
        self.call(&[b"SET", key.as_bytes(), value]).await
    }
}

/// One Hermes point: a fresh 3-node cluster (one `chorus node` per host, at the hosts'
/// niceness or class) serving every tenant.
fn hermes_point(chorus: &Path, point: &PointSpec, stop: &AtomicBool) -> anyhow::Result<TenantsResult> {
    let tag = format!("tenants-hermes-t{}{}", point.tenants, if point.loaded { "-load" } else { "" });
    let mut procs = Procs::new(&tag, procs::scratch_root().join(&tag))?;
    let targets = procs::start_chorus_cluster(
        &mut procs,
        chorus,
        "hermes",
        run::GROUP_SIZE,
        &point.config.replica_command_prefix(),
        stop,
    )?;
    let pids = procs.pids();
    let replicas = Replicas { pids: &pids, processes: pids.len() };
    let targets = &targets;
    measure_point(point.config, point.mode, point.tenants, point.loaded, replicas, |t| {
        HermesTenant::connect(targets, t)
    })
}

fn tenant_counts(report: &TenantsReport) -> Vec<usize> {
    let mut counts: Vec<usize> = report.results.iter().map(|r| r.tenants).collect();
    counts.sort_unstable();
    counts.dedup();
    counts
}

type Pick = fn(&TenantsResult) -> f64;

fn series_by_tenants(report: &TenantsReport, counts: &[usize], pick: Pick) -> Vec<Series> {
    let mut modes: Vec<TenantsMode> = Vec::new();
    for r in &report.results {
        if !modes.contains(&r.mode) {
            modes.push(r.mode);
        }
    }
    let mut series = Vec::new();
    for loaded in [false, true] {
        for &mode in &modes {
            let points: Vec<(f64, f64)> = counts
                .iter()
                .enumerate()
                .filter_map(|(i, &t)| report.find(mode, t, loaded).map(|r| (i as f64, pick(r))))
                .collect();
            if !points.is_empty() {
                series.push(Series {
                    label: label(mode, loaded),
                    color: mode_color(mode),
                    dashed: loaded,
                    points,
                });
            }
        }
    }
    series
}

/// Draw the figures into `dir`; returns the files written.
pub fn plot_all(report: &TenantsReport, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let counts = tenant_counts(report);
    let categories: Vec<String> = counts.iter().map(|t| t.to_string()).collect();
    let panel = |title: &str, y_desc: &str, log_y: bool, pick: Pick| Panel {
        title: title.to_string(),
        x_desc: "tenants (groups of 3 on the same 3 hosts)".into(),
        y_desc: y_desc.into(),
        x_categories: Some(categories.clone()),
        log_y,
        series: series_by_tenants(report, &counts, pick),
    };
    let mut written = Vec::new();
    let latency = [
        panel("update latency, average", "average latency", true, |r| r.update_mean_us),
        panel("update latency, p95", "p95 latency", true, |r| r.update_p95_us),
        panel("update latency, p99", "p99 latency", true, |r| r.update_p99_us),
    ];
    let path = dir.join("tenants-latency.png");
    draw_grid(&path, "Figure 2 / 11-12 shape: YCSB-A update latency vs tenants (log scale)", 3, &latency)?;
    written.push(path);
    let cpu = [
        panel("replica CPU time per operation", "CPU per op (us)", false, |r| {
            r.replica_cpu_us_per_op.unwrap_or(0.0)
        }),
        panel("cores the replicas kept busy", "cores", false, |r| r.replica_cpu_cores.unwrap_or(0.0)),
        panel("updates per second (all tenants)", "updates/s", false, |r| r.updates_per_s),
    ];
    let path = dir.join("tenants-cpu.png");
    draw_grid(&path, "Replica CPU and throughput vs tenants", 3, &cpu)?;
    written.push(path);
    Ok(written)
}

fn ratios(r: &TenantsResult, reference: &TenantsResult) -> String {
    format!(
        "{:<14} avg {:.2}x  p95 {:.2}x  p99 {:.2}x  cpu/op {}",
        label(r.mode, false),
        r.update_mean_us / reference.update_mean_us.max(1e-9),
        r.update_p95_us / reference.update_p95_us.max(1e-9),
        r.update_p99_us / reference.update_p99_us.max(1e-9),
        match (r.replica_cpu_us_per_op, reference.replica_cpu_us_per_op) {
            (Some(a), Some(b)) if b > 0.0 => format!("{:.2}x", a / b),
            _ => "-".to_string(),
        }
    )
}

/// The point-4 ratios and whether they are met, plus the Naïve modes' ratios to each
/// Chorus arrangement (chain, Hermes) per point.
pub fn summary(report: &TenantsReport) -> String {
    let config = &report.config;
    let load = if config.idle_load { "SCHED_IDLE" } else { "nice 0" };
    let mut text = if config.fifo {
        format!("\nscheduling: replicas and the clients' event loop SCHED_FIFO 1, background load {load}")
    } else {
        format!(
            "\nscheduling: replicas nice {}, clients nice {} on {} event-loop thread(s), background load {load}",
            config.replica_nice, config.client_nice, config.client_threads
        )
    };
    if let Some(sockets) = &config.sockets {
        let _ = write!(
            text,
            "; topology paper: clients on CPU(s) {}, replicas, background load and the replicas' \
             receive softirq (the chain's hops) on CPU(s) {}",
            sockets.client_cpus.iter().map(usize::to_string).collect::<Vec<_>>().join(","),
            sockets.replica_list()
        );
    }
    if let Some(cpu) = config.client_cpu {
        let _ = write!(text, "; clients on CPU {cpu}");
    }
    if let Some(mask) = &config.caller_rps_cpus {
        let _ = write!(text, "; the chain's hops steered to CPU mask {mask} (RPS)");
    }
    if config.rounds > 1 {
        let _ = write!(text, "; every point the median of {} interleaved rounds", config.rounds);
    }
    text.push('\n');
    for chorus in [TenantsMode::Chorus, TenantsMode::Hermes] {
        if !report.results.iter().any(|r| r.mode == chorus) {
            continue;
        }
        let name = label(chorus, false);
        let _ = writeln!(text, "\nratios to {name} (update latency; > 1: {name} lower)");
        for loaded in [false, true] {
            for t in tenant_counts(report) {
                let Some(reference) = report.find(chorus, t, loaded) else { continue };
                for mode in [TenantsMode::Naive, TenantsMode::NaivePolling, TenantsMode::Hermes] {
                    if mode == chorus {
                        continue;
                    }
                    if let Some(r) = report.find(mode, t, loaded) {
                        let _ = writeln!(
                            text,
                            "  T={t:<4}{:<6} {}",
                            if loaded { " +load" } else { "" },
                            ratios(r, reference)
                        );
                    }
                }
            }
        }
    }
    for chorus in [TenantsMode::Chorus, TenantsMode::Hermes] {
        let name = label(chorus, false);
        match target_ratios(report, chorus, TARGET_TENANTS, true) {
            Some((p99_ratio, gap_reduction)) => {
                let met = p99_ratio >= TARGET_P99_RATIO && gap_reduction >= TARGET_GAP_REDUCTION_PCT;
                let _ = writeln!(
                    text,
                    "target (T={TARGET_TENANTS}, background load): Naïve-Event p99 / {name} p99 = {p99_ratio:.2}x \
                     (want >= {TARGET_P99_RATIO}x); reduction of the (p99 - avg) gap {gap_reduction:.0}% \
                     (want >= {TARGET_GAP_REDUCTION_PCT}%; negative: {name}'s gap is larger): {}",
                    if met { "MET on this machine" } else { "NOT met on this machine" }
                );
                let naive = report.find(TenantsMode::Naive, TARGET_TENANTS, true);
                let reference = report.find(chorus, TARGET_TENANTS, true);
                if let (Some(naive), Some(reference)) = (naive, reference) {
                    if reference.update_p99_rounds_us.len() > 1 {
                        let per_round: Vec<String> = naive
                            .update_p99_rounds_us
                            .iter()
                            .zip(&reference.update_p99_rounds_us)
                            .map(|(n, c)| format!("{:.2}x", n / c.max(1e-9)))
                            .collect();
                        let _ = writeln!(text, "  per round: {}", per_round.join(", "));
                    }
                }
            }
            None if report.results.iter().any(|r| r.mode == chorus) => {
                let _ = writeln!(
                    text,
                    "target (T={TARGET_TENANTS}, background load) for {name}: not measured (needs {name} and \
                     naive at T={TARGET_TENANTS} with --background-load)"
                );
            }
            None => {}
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: TenantsArgs,
    }

    fn config(flags: &[&str]) -> anyhow::Result<TenantsConfig> {
        let cli = Cli::try_parse_from(std::iter::once("tenants").chain(flags.iter().copied()))?;
        let load = ["stress-ng", "--cpu", "2"].map(String::from).to_vec();
        config_of(&cli.args, vec!["chorus".into(), "naive-replica".into()], Some(load))
    }

    /// The paper's topology: clients on CPU 0, replicas, their softirqs and 10 background
    /// threads per replica CPU on the others; nothing else changes anyone's priority.
    #[test]
    fn the_paper_topology_places_clients_replicas_and_load_on_two_sockets() {
        let sockets = run::Sockets { client_cpus: vec![0], replica_cpus: vec![1, 2, 3] };
        assert_eq!((sockets.replica_list(), sockets.replica_mask()), ("1,2,3".into(), "e".into()));
        assert_eq!(sockets.background_threads(), 30);
        assert_eq!(run::Sockets::split(1), None);
        assert_eq!(run::Sockets::split(2).unwrap().replica_cpus, vec![1]);
        let wide = run::Sockets { client_cpus: vec![0], replica_cpus: vec![1, 33] };
        assert_eq!(wide.replica_mask(), "2,2", "sysfs masks are 32-bit groups, high first");

        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let paper = config(&[]).unwrap();
        assert_eq!(paper.sockets, run::Sockets::split(cpus));
        if let Some(sockets) = &paper.sockets {
            let threads = sockets.background_threads().to_string();
            let list = sockets.replica_list();
            assert_eq!(
                paper.background_load_command.as_deref().unwrap(),
                ["taskset", "-c", &list, "stress-ng", "--cpu", &threads]
            );
            assert_eq!(paper.replica_command_prefix(), ["taskset", "-c", &list]);
            assert_eq!(
                (paper.fifo, paper.idle_load, paper.replica_nice, paper.client_nice),
                (false, false, 0, 0)
            );
        }
        let error = config(&["--client-cpu", "0"]).unwrap_err();
        assert!(error.to_string().contains("--topology shared"), "{error}");
        assert!(config(&["--topology", "sideways"]).is_err());
    }

    /// How each option schedules the replicas, the clients and the background load.
    #[test]
    fn scheduling_options_shape_the_commands() {
        let plain = config(&["--topology", "shared"]).unwrap();
        assert_eq!(plain.background_load_command.as_deref().unwrap(), ["stress-ng", "--cpu", "2"]);
        assert!(plain.replica_command_prefix().is_empty());
        assert_eq!((plain.fifo, plain.idle_load, plain.rounds), (false, false, 1));

        let idle = config(&["--topology", "shared", "--idle-load", "--rounds", "5"]).unwrap();
        assert_eq!(
            idle.background_load_command.as_deref().unwrap(),
            ["chrt", "-i", "0", "stress-ng", "--cpu", "2"]
        );
        assert!(idle.replica_command_prefix().is_empty(), "replicas keep the default class");
        assert_eq!((idle.idle_load, idle.rounds), (true, 5));

        let nice =
            config(&["--topology", "shared", "--replica-nice", "-10", "--client-nice", "-10"]).unwrap();
        assert_eq!(nice.replica_command_prefix(), ["nice", "-n", "-10"]);
        assert_eq!(nice.client_nice, -10);

        let fifo = config(&["--topology", "shared", "--fifo", "--replica-nice", "-10"]).unwrap();
        assert_eq!(fifo.replica_command_prefix(), ["chrt", "-f", "1"], "niceness does not apply");

        let cli = Cli::try_parse_from(["tenants", "--idle-load"]).unwrap();
        let error = config_of(&cli.args, vec!["chorus".into()], None).unwrap_err();
        assert!(error.to_string().contains("needs --background-load"), "{error}");

        let error = config(&["--rounds", "0"]).unwrap_err();
        assert!(error.to_string().contains("--rounds is at least 1"), "{error}");
    }
}
