//! `chorus model paper`: the papers' experiments at their scale (issue 21 point 3), each
//! replica on a machine of its own as the paper's testbed has it, run through the real
//! protocol cores by the performance model (chorus_sim::model), with a cost table calibrated
//! on this machine and scaled to the paper's machines as documented (docs/model.md, "The
//! papers at their scale"): by their clock, and to a kernel-bypass stack's per-message cost
//! where the paper bypasses the kernel (RDMA, DPDK).
//!
//! Each experiment writes `<out>/<name>.json` (the testbed, the scaled costs, every row and
//! the paper's own claims, quoted), `<out>/<name>.md` (its tables) and `<out>/<name>.png`.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};
use chorus_bench::charts::{draw_grid, palette, Panel, Series};
use chorus_core::Time;
use chorus_sim::model::{CostTable, Distribution, Latency, ModelConfig, ModelReport, Network, Workload};
use serde::Serialize;

use crate::model::{predict_any, read_costs, ChainHops};

#[derive(clap::Args)]
pub struct PaperArgs {
    /// Experiments: hermes, cyclone, hyperloop, groups, or all.
    #[arg(long, value_delimiter = ',', default_value = "all")]
    experiments: Vec<String>,
    /// The calibrated cost table (`chorus model calibrate`) the papers' machines are scaled
    /// from.
    #[arg(long, default_value = "docs/benchmarks/model/costs-session12-busy.json")]
    costs: PathBuf,
    /// The clock of the machine the table was measured on, in GHz (default: the table's own
    /// `cpu_ghz`, which `chorus model calibrate` records).
    #[arg(long)]
    costs_ghz: Option<f64>,
    /// Where the JSON, tables and PNGs go.
    #[arg(long, default_value = "docs/benchmarks/model")]
    out: PathBuf,
    /// Fewer points and shorter windows (a smoke run, seconds).
    #[arg(long)]
    quick: bool,
}

/// The experiments, in the order `all` runs them.
const EXPERIMENTS: &[Entry] = &[
    Entry { name: "hermes", plan: hermes },
    Entry { name: "cyclone", plan: cyclone },
    Entry { name: "hyperloop", plan: hyperloop },
    Entry { name: "groups", plan: groups },
];

/// One experiment: its name and what plans its points and says what they model.
struct Entry {
    name: &'static str,
    plan: fn(&Setup) -> Plan,
}

pub fn run(args: PaperArgs) -> anyhow::Result<i32> {
    for name in &args.experiments {
        if name != "all" && !EXPERIMENTS.iter().any(|entry| entry.name == name) {
            let names: Vec<&str> = EXPERIMENTS.iter().map(|entry| entry.name).collect();
            bail!("unknown experiment '{name}' ({}, all)", names.join(", "));
        }
    }
    let wanted = |entry: &&Entry| args.experiments.iter().any(|name| name == "all" || name == entry.name);
    let chosen: Vec<&Entry> = EXPERIMENTS.iter().filter(wanted).collect();
    let base = read_costs(&args.costs)?;
    let Some(base_ghz) = args.costs_ghz.or(base.cpu_ghz) else {
        bail!("{} does not say its CPU's clock: give it with --costs-ghz", args.costs.display());
    };
    if base_ghz.is_nan() || base_ghz <= 0.0 {
        bail!("--costs-ghz must be positive");
    }
    std::fs::create_dir_all(&args.out).with_context(|| format!("cannot create {}", args.out.display()))?;
    let context = Setup { base, base_ghz, base_path: args.costs.clone(), quick: args.quick };
    for entry in chosen {
        let started = std::time::Instant::now();
        let name = entry.name;
        let mut plan = (entry.plan)(&context);
        let rows = run_points(std::mem::take(&mut plan.points))?;
        let experiment = Experiment { experiment: name.into(), command: command(name), plan, rows };
        let stem = if args.quick { format!("{name}-quick") } else { name.to_string() };
        write(&args.out, &stem, &experiment)?;
        eprintln!("{name}: {} rows in {:.0} s", experiment.rows.len(), started.elapsed().as_secs_f64());
    }
    Ok(0)
}

struct Setup {
    base: CostTable,
    base_ghz: f64,
    base_path: PathBuf,
    quick: bool,
}

/// How the calibrated table became the paper machines' table.
#[derive(Serialize, Clone)]
struct Scaling {
    calibration: String,
    calibration_source: String,
    calibration_ghz: f64,
    paper_cpu: String,
    paper_ghz: f64,
    /// The calibrated kernel-TCP cost of a message over the kernel-bypass cost put in its
    /// place (`CostTable::kernel_to_bypass_ratio`), where the paper bypasses the kernel.
    kernel_to_bypass_ratio: Option<f64>,
}

/// One modelled point.
#[derive(Serialize, Clone)]
struct Row {
    figure: String,
    series: String,
    /// The varied parameter, named by `x_name`.
    x: f64,
    x_name: String,
    nodes: usize,
    cores: u32,
    loops: usize,
    groups: usize,
    clients: u32,
    workload: String,
    network: String,
    throughput_ops_per_s: f64,
    latency: Latency,
    read_latency: Latency,
    write_latency: Latency,
    cpu_utilisation_max: f64,
    protocol_thread_utilisation_max: f64,
    nic_utilisation_max: f64,
    nodes_cpu_us_per_op: f64,
    ops_measured: u64,
    errors: u64,
}

impl Row {
    fn of(figure: &str, series: &str, x: f64, x_name: &str, report: &ModelReport) -> Row {
        Row {
            figure: figure.into(),
            series: series.into(),
            x,
            x_name: x_name.into(),
            nodes: report.nodes,
            cores: report.cores,
            loops: report.loops,
            groups: report.groups,
            clients: report.clients,
            workload: format!("{} ({:?})", report.workload.name, report.workload.distribution),
            network: report.network.name.clone(),
            throughput_ops_per_s: report.throughput_ops_per_s,
            latency: report.latency.clone(),
            read_latency: report.read_latency.clone(),
            write_latency: report.write_latency.clone(),
            cpu_utilisation_max: report.cpu_utilisation_max,
            protocol_thread_utilisation_max: report.protocol_thread_utilisation_max,
            nic_utilisation_max: report.nic_utilisation_max,
            nodes_cpu_us_per_op: report.nodes_cpu_us_per_op,
            ops_measured: report.ops_measured,
            errors: report.errors,
        }
    }
}

/// A figure: its rows drawn as one panel.
struct Figure {
    name: String,
    title: String,
    x_desc: String,
    y_desc: String,
    log_y: bool,
    /// Which value of a row the panel draws.
    y: fn(&Row) -> f64,
    /// Draw against throughput (M ops/s) instead of `x`.
    x_is_throughput: bool,
}

impl Figure {
    /// Throughput in millions a second (`y_desc` names them) against the rows' `x`.
    fn throughput(name: &str, title: &str, x_desc: &str, y_desc: &str) -> Figure {
        Figure {
            name: name.into(),
            title: title.into(),
            x_desc: x_desc.into(),
            y_desc: y_desc.into(),
            log_y: false,
            y: |row| row.throughput_ops_per_s / 1e6,
            x_is_throughput: false,
        }
    }

    /// A latency of the rows (`y`, in us) on a log scale against their `x`.
    fn latency(name: &str, title: &str, x_desc: &str, y: fn(&Row) -> f64) -> Figure {
        Figure {
            log_y: true,
            y,
            y_desc: "latency (us)".into(),
            ..Figure::throughput(name, title, x_desc, "")
        }
    }
}

/// An experiment run: what it models, and its rows.
#[derive(Serialize)]
struct Experiment {
    experiment: String,
    command: String,
    #[serde(flatten)]
    plan: Plan,
    rows: Vec<Row>,
}

/// What an experiment models (the testbed, the scaled costs, the paper's own claims, quoted),
/// the points it runs and the figures it draws of their rows.
#[derive(Serialize)]
struct Plan {
    testbed: String,
    modelled_as: String,
    scaling: Scaling,
    costs: CostTable,
    /// The paper's own words and numbers for these experiments, quoted from its text.
    paper: Vec<String>,
    /// The paper's numbers that fit a figure's axes (drawn dashed beside the model's).
    paper_points: Vec<PaperPoint>,
    #[serde(skip)]
    figures: Vec<Figure>,
    #[serde(skip)]
    points: Vec<Point>,
}

/// One modelled point: its row's place in a figure, its configuration, and how long its
/// measured window runs.
struct Point {
    figure: String,
    series: String,
    x: f64,
    x_name: &'static str,
    config: ModelConfig,
    hops: ChainHops,
    window: Window,
}

/// How long a point's measured window runs: long enough for some thousands of operations.
enum Window {
    Fixed(Time),
    /// About `ops` operations at `ops_per_s`.
    Expected {
        ops: f64,
        ops_per_s: f64,
    },
    /// About `ops` operations at the previous point's throughput (at least 100 000 ops/s;
    /// `first_ops_per_s` for the experiment's first point).
    AfterPrevious {
        ops: f64,
        first_ops_per_s: f64,
    },
    /// A 5 ms pilot of the point tells how fast it runs; the window then holds about `ops`
    /// operations, within 5 ms and 4 s of virtual time.
    Pilot {
        ops: f64,
    },
}

impl Window {
    fn duration(
        &self,
        config: &ModelConfig,
        hops: ChainHops,
        previous_ops_per_s: Option<f64>,
    ) -> anyhow::Result<Time> {
        Ok(match *self {
            Window::Fixed(duration) => duration,
            Window::Expected { ops, ops_per_s } => window_for(ops_per_s, ops),
            Window::AfterPrevious { ops, first_ops_per_s } => {
                window_for(previous_ops_per_s.map_or(first_ops_per_s, |previous| previous.max(1e5)), ops)
            }
            Window::Pilot { ops } => {
                let pilot_config = ModelConfig { duration: Time::from_millis(5), ..config.clone() };
                let pilot = predict_any(&pilot_config, hops).map_err(anyhow::Error::msg)?;
                let seconds = (ops / pilot.throughput_ops_per_s.max(1.0)).clamp(0.005, 4.0);
                Time::from_nanos((seconds * 1e9) as u64)
            }
        })
    }
}

/// Run an experiment's points in order, each window sized as its [`Window`] says.
fn run_points(points: Vec<Point>) -> anyhow::Result<Vec<Row>> {
    let mut previous_ops_per_s = None;
    let mut rows = Vec::with_capacity(points.len());
    for mut point in points {
        point.config.duration = point.window.duration(&point.config, point.hops, previous_ops_per_s)?;
        let report = run_point(&point.config, point.hops)?;
        previous_ops_per_s = Some(report.throughput_ops_per_s);
        rows.push(Row::of(&point.figure, &point.series, point.x, point.x_name, &report));
    }
    Ok(rows)
}

/// One of the paper's own numbers on a figure's axes, read from its text.
#[derive(Serialize)]
struct PaperPoint {
    figure: String,
    x: f64,
    y: f64,
    quote: String,
}

fn paper_point(figure: &str, x: f64, y: f64, quote: &str) -> PaperPoint {
    PaperPoint { figure: figure.into(), x, y, quote: quote.into() }
}

fn scaled(context: &Setup, paper_cpu: &str, paper_ghz: f64, network: &Network) -> (CostTable, Scaling) {
    let clocked = context.base.at_clock(context.base_ghz, paper_ghz);
    let costs = network.costs_for(&clocked);
    let scaling = Scaling {
        calibration: context.base_path.display().to_string(),
        calibration_source: context.base.source.clone(),
        calibration_ghz: context.base_ghz,
        paper_cpu: paper_cpu.into(),
        paper_ghz,
        kernel_to_bypass_ratio: network.kernel_bypass.then(|| clocked.kernel_to_bypass_ratio()),
    };
    (costs, scaling)
}

/// A configuration on a paper's testbed: clients start shortly before the window (the
/// protocols' leaders are elected by then), the window long enough for some thousands of
/// operations.
fn paper_config(
    protocol: &str,
    nodes: usize,
    cores: u32,
    network: &Network,
    costs: &CostTable,
    clients: u32,
) -> ModelConfig {
    let mut config = ModelConfig::new(protocol, nodes, cores, network.clone(), clients);
    config.costs = costs.clone();
    let elects = matches!(protocol, "zab" | "zab-local" | "raftlog");
    config.warmup = Time::from_millis(if elects { 300 } else { 3 });
    config.clients_start = Time::from_millis(if elects { 297 } else { 0 });
    config
}

fn run_point(config: &ModelConfig, hops: ChainHops) -> anyhow::Result<ModelReport> {
    let report = predict_any(config, hops).map_err(anyhow::Error::msg)?;
    eprintln!(
        "  {} n={} loops={} groups={} clients={} {}: {:.3} M ops/s, p50 {:.1} us, p99 {:.1} us, errors {}",
        config.protocol,
        config.nodes,
        config.loops,
        config.groups,
        config.clients,
        config.workload.name,
        report.throughput_ops_per_s / 1e6,
        report.latency.p50_us,
        report.latency.p99_us,
        report.errors
    );
    Ok(report)
}

/// Choose a window that holds about `ops` operations at `expected_ops_per_s`, within bounds.
fn window_for(expected_ops_per_s: f64, ops: f64) -> Time {
    let seconds = (ops / expected_ops_per_s.max(1.0)).clamp(0.000_5, 0.05);
    Time::from_nanos((seconds * 1e9) as u64)
}

// ---------------------------------------------------------------------------------------
// Hermes (Katsarakis et al., ASPLOS 2020), §5.2 and §6: Figures 5a, 5b, 6a and the 3/5/7
// scalability figure.

fn hermes(context: &Setup) -> Plan {
    let network = Network::preset("rdma").expect("a preset");
    let (costs, scaling) = scaled(context, "Intel Xeon E5-2630 v4 (2 x 10 cores, turbo off)", 2.2, &network);
    let cores = 20;
    let loops = 20;
    let keys = 1_000_000;
    let protocols = ["hermes", "craq", "zab-local"];
    let ratios: &[u32] = if context.quick { &[1, 20, 100] } else { &[0, 1, 5, 20, 50, 100] };
    let per_loop_clients = if context.quick { 4 } else { 8 };
    let window = || Window::AfterPrevious {
        ops: if context.quick { 4_000.0 } else { 20_000.0 },
        first_ops_per_s: 20e6,
    };
    let clients_at = |nodes: usize, per_loop: u32| per_loop * (nodes * loops) as u32;
    let point = |figure: &str, protocol: &str, (x, x_name), nodes, clients, writes, distribution| {
        let mut workload = Workload::named(&format!("kv-w{writes}")).expect("a workload");
        workload.keys = keys;
        workload.distribution = distribution;
        let mut config = paper_config(protocol, nodes, cores, &network, &costs, clients);
        config.loops = loops;
        config.workload = workload;
        Point {
            figure: figure.into(),
            series: protocol.into(),
            x,
            x_name,
            config,
            hops: ChainHops::Cpu,
            window: window(),
        }
    };
    let zipf = Distribution::Zipfian { theta: chorus_sim::model::workload::YCSB_THETA };
    let mut points = Vec::new();
    for (figure, distribution) in [("fig5a", Distribution::Uniform), ("fig5b", zipf)] {
        for protocol in protocols {
            for &writes in ratios {
                let clients = clients_at(5, per_loop_clients);
                points.push(point(
                    figure,
                    protocol,
                    (writes as f64, "write %"),
                    5,
                    clients,
                    writes,
                    distribution,
                ));
            }
        }
    }
    // Figure 6a: p50 and p99 against throughput at 5% writes, from a sweep of clients.
    let sweep: &[u32] = if context.quick { &[1, 4] } else { &[1, 2, 4, 8, 16] };
    for protocol in protocols {
        for &per_loop in sweep {
            let clients = clients_at(5, per_loop);
            let x = (clients as f64, "clients");
            points.push(point("fig6a", protocol, x, 5, clients, 5, Distribution::Uniform));
        }
    }
    // Scalability: 3, 5 and 7 replicas at 5% and 20% writes.
    for writes in [5, 20] {
        for protocol in protocols {
            for nodes in [3usize, 5, 7] {
                let clients = clients_at(nodes, per_loop_clients);
                let x = (nodes as f64, "replicas");
                let figure = format!("scalability-w{writes}");
                points.push(point(&figure, protocol, x, nodes, clients, writes, Distribution::Uniform));
            }
        }
    }
    let figures = vec![
        Figure::throughput("fig5a", "Figure 5a: throughput vs write ratio, uniform", "write %", "M ops/s"),
        Figure::throughput(
            "fig5b",
            "Figure 5b: throughput vs write ratio, zipfian 0.99",
            "write %",
            "M ops/s",
        ),
        Figure {
            x_is_throughput: true,
            ..Figure::latency(
                "fig6a",
                "Figure 6a: p50 (solid) and p99 (dashed) vs throughput, 5% writes",
                "M ops/s",
                |row| row.latency.p50_us,
            )
        },
        Figure::throughput("scalability-w5", "Scalability, 5% writes", "replicas", "M ops/s"),
        Figure::throughput("scalability-w20", "Scalability, 20% writes", "replicas", "M ops/s"),
    ];
    Plan {
        testbed: "Hermes §5.2: 7 servers on a 12-port InfiniBand switch, each two 10-core Xeon E5-2630 v4, a 56 Gb InfiniBand NIC; one million keys, uniform or zipfian 0.99; 5 replicas unless stated.".into(),
        modelled_as: format!("5 replicas (3/5/7 for scalability), each a machine of {cores} cores with {loops} event loops (the server's event_loops: one independent protocol core per core, keys split by hash, as HermesKV's worker threads), 56 Gb/s RDMA (kernel-bypass costs, polling: no wakes), {keys} keys of 32-byte values, closed-loop clients on other machines spread over the replicas ({per_loop_clients} per event loop at saturation). zab-local is Chorus' ZAB with local reads (the paper's rZAB reads locally): each event loop is its own ZAB instance, whose leader is the same node for every loop."),
        scaling,
        costs,
        paper: vec![
            "§6.1: \"For read-only, all three systems exhibit identical behaviour ... as all systems perform reads locally from all replicas.\"".into(),
            "§6.1: \"As the write ratio increases, the throughput of HermesKV gradually drops ... writes require an exchange of messages over the network, which cost both CPU cycles and network bandwidth.\"".into(),
            "§6.1: \"rCRAQ performs worse than HermesKV across all write ratios, with the gap widening as write ratios increase.\" \"at high ratios, the tail node is heavily loaded as it receives read queries from all nodes.\"".into(),
            "§6.1: \"ZAB fails to achieve high throughput at non-zero write ratios as it imposes a strict ordering constraint on all writes at the leader.\"".into(),
            "§6.2 (zipfian 0.99): \"HermesKV gracefully tolerates skewed access patterns\"; for rCRAQ \"at higher write ratios, the tail limits rCRAQ's performance\"; \"rZAB is not affected by the conflicts created by the skewed access pattern\".".into(),
            "§6.3.1 (5% writes): medians are reads' latencies, the tail is the writes'; rZAB's \"tail latency is much larger (e.g., more than 3.6x than that of Hermes at 75MReq/s)\".".into(),
            "§6.4: HermesKV achieves \"almost linear scalability with the number of replicas\" at the low write ratio; rCRAQ \"throughput degrades when the chain is extended from 5 to 7 nodes\"; for rZAB \"increasing the replication degree from 5 to 7 cuts the performance almost in half\".".into(),
            "The seed text of the paper (../shared/seeds/003_b902a949263df2c2.txt) has lost most figures' numbers (\"HermesKV achieves MReqs/s\"): only the ratios and words above survive, so the comparison is of shapes and of the 3.6x.".into(),
        ],
        paper_points: Vec::new(),
        figures,
        points,
    }
}

// ---------------------------------------------------------------------------------------
// Cyclone (its evaluation section): the network optimisations, logs and cores up to 32,
// replicas, payload.

/// A Cyclone point: raftlog with one log per event loop on `nodes` replicas, 100% writes of
/// `payload` bytes each, `batch` commands at most per log entry, the throughput expected.
#[derive(Clone, Copy)]
struct Logs<'a> {
    network: &'a Network,
    costs: &'a CostTable,
    nodes: usize,
    logs: usize,
    batch: usize,
    payload: usize,
    clients: u32,
    expected_ops_per_s: f64,
}

impl Logs<'_> {
    fn point(self, cores: u32, ops: f64, figure: &str, series: &str, x: f64, x_name: &'static str) -> Point {
        let mut workload = Workload::named("kv-w100").expect("a workload");
        workload.keys = 100_000;
        // Cyclone logs a 60-byte header and the payload; the model's SET carries its key
        // (16 bytes) and the value.
        workload.value_bytes = 44 + self.payload;
        workload.record_bytes = workload.value_bytes;
        let mut config = paper_config("raftlog", self.nodes, cores, self.network, self.costs, self.clients);
        config.loops = self.logs;
        config.raftlog_logs = self.logs;
        config.raftlog_batch_commands_max = self.batch;
        config.workload = workload;
        Point {
            figure: figure.into(),
            series: series.into(),
            x,
            x_name,
            config,
            hops: ChainHops::Cpu,
            window: Window::Expected { ops, ops_per_s: self.expected_ops_per_s },
        }
    }
}

fn cyclone(context: &Setup) -> Plan {
    let tcp = Network::preset("10gbe").expect("a preset");
    let dpdk = Network { name: "10gbe-dpdk".into(), kernel_bypass: true, ..tcp.clone() };
    let dpdk_4 = Network {
        name: "4x10gbe-dpdk".into(),
        bandwidth_bits_per_s: 4 * tcp.bandwidth_bits_per_s,
        packet_ns: tcp.packet_ns / 4,
        kernel_bypass: true,
        ..tcp.clone()
    };
    let cpu = "not named in the paper's text: taken at this table's own clock";
    let (tcp_costs, _) = scaled(context, cpu, context.base_ghz, &tcp);
    let (dpdk_costs, scaling) = scaled(context, cpu, context.base_ghz, &dpdk);
    let cores = 40;
    let ops = if context.quick { 2_000.0 } else { 10_000.0 };
    // The network optimisations, one step at a time (3 replicas, no payload).
    let tcp_1 = Logs {
        network: &tcp,
        costs: &tcp_costs,
        nodes: 3,
        logs: 1,
        batch: 1,
        payload: 0,
        clients: 256,
        expected_ops_per_s: 3e4,
    };
    let dpdk_1 = Logs { network: &dpdk, costs: &dpdk_costs, expected_ops_per_s: 5e4, ..tcp_1 };
    let batching = Logs { batch: 1_024, expected_ops_per_s: 2e5, ..dpdk_1 };
    let logs_8 = Logs { logs: 8, clients: 8 * 256, expected_ops_per_s: 1e6, ..batching };
    let ports_4 = Logs { network: &dpdk_4, ..logs_8 };
    let mut points = Vec::new();
    let steps = [
        ("TCP/IP, 1 log, no batching", tcp_1),
        ("+DPDK", dpdk_1),
        ("+batching", batching),
        ("+8 logs", logs_8),
        ("+4 ports", ports_4),
    ];
    for (step, (series, logs)) in steps.into_iter().enumerate() {
        points.push(logs.point(cores, ops, "optimizations", series, step as f64, "step"));
    }
    // Unloaded latency: one client, one log.
    let unloaded = [
        ("TCP/IP, 3 replicas", Logs { batch: 1_024, clients: 1, expected_ops_per_s: 1e4, ..tcp_1 }),
        ("DPDK, 3 replicas", Logs { clients: 1, expected_ops_per_s: 2e4, ..batching }),
        ("DPDK, 1 replica", Logs { nodes: 1, clients: 1, expected_ops_per_s: 4e4, ..batching }),
    ];
    for (configuration, (series, logs)) in unloaded.into_iter().enumerate() {
        points.push(logs.point(cores, ops, "unloaded", series, configuration as f64, "configuration"));
    }
    // Logs and cores: one log per event loop, one loop per core, up to 32.
    let counts: &[usize] = if context.quick { &[1, 8, 32] } else { &[1, 2, 4, 8, 16, 32] };
    for &count in counts {
        let logs = Logs {
            logs: count,
            clients: 256 * count as u32,
            expected_ops_per_s: 2e5 * count as f64,
            ..ports_4
        };
        let x_name = "logs (= event loops = cores used)";
        points.push(logs.point(cores, ops, "logs", "4 ports, batching", count as f64, x_name));
    }
    // Replicas.
    for nodes in [1usize, 3, 5] {
        let logs = Logs { nodes, ..ports_4 };
        points.push(logs.point(cores, ops, "replicas", "8 logs, 4 ports", nodes as f64, "replicas"));
    }
    // Payload.
    let payloads: &[usize] = if context.quick { &[0, 512] } else { &[0, 64, 256, 512] };
    for &payload in payloads {
        let logs = Logs { payload, ..ports_4 };
        points.push(logs.point(cores, ops, "payload", "8 logs, 4 ports", payload as f64, "payload bytes"));
    }
    let figures = vec![
        Figure {
            log_y: true,
            ..Figure::throughput(
                "optimizations",
                "Network optimisations (0 TCP/IP, 1 +DPDK, 2 +batching, 3 +8 logs, 4 +4 ports)",
                "step",
                "M entries/s",
            )
        },
        Figure::throughput("logs", "Logs (one per core), 4 x 10 GbE, DPDK", "logs", "M entries/s"),
        Figure::throughput("replicas", "Replicas (8 logs)", "replicas", "M entries/s"),
        Figure::latency(
            "unloaded",
            "One client: p50 (0 TCP/IP, 1 DPDK, 2 DPDK 1 replica)",
            "configuration",
            |row| row.latency.p50_us,
        ),
        Figure::throughput("payload", "Payload (8 logs, 3 replicas)", "payload bytes", "M entries/s"),
    ];
    let costs = dpdk_costs;
    Plan {
        testbed: "Cyclone: a 12-node cluster on a 10 GigE switch; 3 servers with 4 x 10 GigE ports, 9 clients; DPDK; DRAM standing in for NVDIMM; 32 application threads and at most 8 Raft threads; a 60-byte header and a payload per entry, echoed back.".into(),
        modelled_as: format!("raftlog (Chorus' Cyclone-style log) with one log per event loop (raftlog_shards = raftlog_logs), machines of {cores} cores, the circular log synced per turn at the calibrated /dev/shm cost, 100% writes (each command one log entry unless batched), 10 GbE with kernel TCP for the first step and DPDK (kernel-bypass costs) after; 4 ports modelled as one NIC of 4 x the bandwidth and packet rate; closed-loop clients on other machines."),
        scaling,
        costs,
        paper: vec![
            "\"Using TCP/IP to replicate a RAFT log tops out at around 30K entries/s.\"".into(),
            "\"Switching to DPDK ... improves the throughput by an order of magnitude to around 50K entries/s.\"".into(),
            "\"Using batching ... bringing us close to a million entries/s. Scaling horizontally to 8 physical logs ... close to 2M entries/s. Finally using all 4 ports ... 6M entries/s.\"".into(),
            "\"Cyclone also considerably improves the latency for replication, from close to 100us with TCP/IP to around 30us at peak throughput.\"".into(),
            "\"Using only a single replica ... best unloaded latency (10 us) and peak throughput (near 10M entries/s). Adding replicas decreases the peak throughput down to around 2M entries/s.\"".into(),
            "\"Peak throughput drops from 6M entries/s to approximately 2M entries/s\" from no payload to 512 bytes, where \"all four 10 GigE ports are now saturated\".".into(),
            "Ganged operations from 1 to 32 cores: unloaded latency \"to around 40 us from the baseline of 20 us\" (not modelled here: a gang is issue 18's, measured in docs/benchmarks.md).".into(),
        ],
        paper_points: vec![
            paper_point("optimizations", 0.0, 0.03, "TCP/IP: around 30K entries/s"),
            paper_point("optimizations", 1.0, 0.05, "+DPDK: around 50K entries/s"),
            paper_point("optimizations", 2.0, 1.0, "+batching: close to a million entries/s"),
            paper_point("optimizations", 3.0, 2.0, "+8 phy logs: close to 2M entries/s"),
            paper_point("optimizations", 4.0, 6.0, "+4 ports: 6M entries/s"),
            paper_point("unloaded", 0.0, 100.0, "close to 100us with TCP/IP"),
            paper_point("unloaded", 1.0, 30.0, "around 30us at peak throughput"),
            paper_point("unloaded", 2.0, 10.0, "single replica: best unloaded latency (10 us)"),
            paper_point("replicas", 1.0, 10.0, "single replica: near 10M entries/s"),
            paper_point("replicas", 3.0, 2.0, "adding replicas: around 2M entries/s"),
            paper_point("payload", 0.0, 6.0, "from 6M entries/s"),
            paper_point("payload", 512.0, 2.0, "to approximately 2M entries/s"),
        ],
        figures,
        points,
    }
}

// ---------------------------------------------------------------------------------------
// HyperLoop (Kim et al., SIGCOMM 2018), §2.2 and §6.2: the multi-tenant experiment.

fn hyperloop(context: &Setup) -> Plan {
    let network = Network::preset("rdma").expect("a preset");
    let (costs, scaling) = scaled(context, "Intel Xeon E5-2650 v2 (2 x 8 cores)", 2.6, &network);
    // Naïve-Event: every hop wakes the replica's process through the kernel (an RDMA
    // completion channel is a file descriptor), so the wakes of the kernel stack stay.
    let clocked = context.base.at_clock(context.base_ghz, 2.6);
    let mut naive_costs = costs.clone();
    naive_costs.wake_ns = clocked.wake_ns;
    naive_costs.timer_wake_ns = clocked.timer_wake_ns;
    naive_costs.source = format!("{} (Naïve-Event: the kernel's wakes kept)", costs.source);
    let cores = 16;
    // Linux CFS with every core busy: a runnable process gets the first core whose current
    // slice ends; the slice is sched_min_granularity, 0.75 ms x (1 + log2(min(CPUs, 8))) =
    // 3 ms on these 32-thread machines.
    let slice = Time::from_millis(3);
    let tenants: &[u32] = if context.quick { &[1, 8] } else { &[1, 8, 32, 64] };
    let mut points = Vec::new();
    for loaded in [false, true] {
        for (series, hops, table) in [
            ("HyperLoop (hops on the NIC)", ChainHops::Nic, &costs),
            ("Naïve-Event (hops on the CPU)", ChainHops::Cpu, &naive_costs),
        ] {
            for &count in tenants {
                let mut workload = Workload::named("ycsb-a").expect("a workload");
                // Per tenant: 256 records of 1 KiB, uniform (docs/benchmarks.md's tenants run).
                workload.keys = 256;
                workload.value_bytes = 1024;
                workload.record_bytes = 1024;
                workload.distribution = Distribution::Uniform;
                let mut config = paper_config("chain", 3, cores, &network, table, count);
                config.groups = count as usize;
                config.groups_share_machines = true;
                // Every tenant replica is a process of its own with one thread.
                config.threads = Some(1);
                config.background_slice = loaded.then_some(slice);
                config.workload = workload;
                config.warmup = Time::from_millis(20);
                let name = format!("{series}{}", if loaded { ", CPUs busy" } else { ", CPUs idle" });
                points.push(Point {
                    figure: "tenants".into(),
                    series: name,
                    x: count as f64,
                    x_name: "tenants",
                    config,
                    hops,
                    window: Window::Pilot { ops: if context.quick { 4_000.0 } else { 20_000.0 } },
                });
            }
        }
    }
    let figures = vec![
        Figure::latency(
            "tenants-p99",
            "Update p99 vs tenants (YCSB-A, chains of 3 on 3 machines)",
            "tenants",
            |row| row.write_latency.p99_us,
        ),
        Figure::latency("tenants-mean", "Update mean vs tenants", "tenants", |row| row.write_latency.mean_us),
    ];
    Plan {
        testbed: "HyperLoop §6: machines of two 8-core Xeon E5-2650 v2, 64 GB, a 56 Gbps ConnectX-3 RDMA NIC; §6.2: 3 machines, groups of 3, YCSB (32-byte keys, 1024-byte values), replicas co-located with busy tenants (\"The number of application threads on each socket is 10x the number of its CPU cores\").".into(),
        modelled_as: format!("T tenants, each a Chorus chain store of 3 replicas on the same 3 machines of {cores} cores (groups sharing machines), every tenant replica a process of one thread, one closed-loop client per tenant on another machine, YCSB-A over 256 records of 1 KiB per tenant (uniform), 56 Gb/s RDMA. HyperLoop: the chain's member-to-member operations (gWRITE, gCAS, gMEMCPY) are handled by the NICs (no CPU, no wake); the coordinator at the head (client requests, the tail's acknowledgements, replies) runs on the head's CPU. Naïve-Event: every message is a process wake and handler on the receiver's CPU. 'CPUs busy': every core runs a CPU-bound background load whenever no replica work holds it, in 3 ms slices (CFS's minimum granularity at 8+ CPUs); a woken replica gets the first core whose slice ends."),
        scaling,
        costs,
        paper: vec![
            "Table 2 (gCAS, group of 3): Naïve-RDMA average 539 us, p95 3928 us, p99 11886 us; HyperLoop 10 us, 13 us, 14 us.".into(),
            "§6.1: \"for gWRITE ... 99th percentile latency can be reduced by up to 801.8x with HyperLoop\"; gMEMCPY \"up to 848x\".".into(),
            "§6.2 RocksDB (YCSB-A updates): \"HyperLoop offers significantly lower tail latency in contrast to Naïve-Event (5.7x lower) and Naïve-Polling (24.2x lower).\"".into(),
            "§6.2 MongoDB (10:1 processes to cores): \"HyperLoop reduces replication latency by up to 79%\" and \"reduces the gap between average and 99th percentile latency by up to 81%\".".into(),
            "§2.2 Figure 2: MongoDB's latency grows with the number of partitions per server as context switches grow; with 18 replica-sets, more cores lower latency and context switches.".into(),
        ],
        paper_points: Vec::new(),
        figures,
        points,
    }
}

// ---------------------------------------------------------------------------------------
// The scale-out issue's groups (issue 20 point 6): 1, 2, 3, 4 groups of 3, every group on
// machines of its own.

fn groups(context: &Setup) -> Plan {
    let network = Network::preset("25gbe").expect("a preset");
    let (costs, scaling) = scaled(context, "this machine's (no scaling)", context.base_ghz, &network);
    let cores = 8;
    let counts: &[usize] = if context.quick { &[1, 3] } else { &[1, 2, 3, 4] };
    let mut points = Vec::new();
    for (figure, workload_name) in
        [("groups-set", "kv-w100"), ("groups-get", "kv-w0"), ("groups-ycsb-a", "ycsb-a")]
    {
        for &count in counts {
            let mut workload = Workload::named(workload_name).expect("a workload");
            workload.keys = 100_000;
            let mut config = paper_config("hermes", 3, cores, &network, &costs, 64 * count as u32);
            config.groups = count;
            config.loops = cores as usize;
            config.workload = workload;
            points.push(Point {
                figure: figure.into(),
                series: "hermes".into(),
                x: count as f64,
                x_name: "groups of 3",
                config,
                hops: ChainHops::Cpu,
                window: Window::Fixed(Time::from_millis(if context.quick { 5 } else { 20 })),
            });
        }
    }
    let figures = vec![
        Figure::throughput(
            "groups-set",
            "SET (100% writes, uniform), 64 clients per group",
            "groups",
            "M ops/s",
        ),
        Figure::throughput("groups-get", "GET (uniform), 64 clients per group", "groups", "M ops/s"),
        Figure::throughput(
            "groups-ycsb-a",
            "YCSB-A (zipfian 0.99), 64 clients per group",
            "groups",
            "M ops/s",
        ),
    ];
    Plan {
        testbed: "Issue 20 point 6 (docs/benchmarks.md, \"Scale-out\"): `chorus up --shards S --replicas 3`, measured on this 2-core machine with every group sharing it; the prediction there is for groups on machines of their own.".into(),
        modelled_as: format!("S groups of 3 Hermes replicas, each replica a machine of {cores} cores with {cores} event loops, 25 GbE with kernel TCP, keys spread over the groups by slot (Redis' CRC16, even slot ranges), 64 closed-loop clients per group, each sending every command to its key's group (a cluster client)."),
        scaling,
        costs,
        paper: vec![
            "docs/benchmarks.md (issue 20, measured on 2 shared cores): SET 1.00 / 1.50 / 1.93 and GET 1.00 / 2.41 / 1.90 of one group's throughput at 1 / 2 / 3 groups; \"Expect no capacity gain from sharding on one machine\".".into(),
            "docs/benchmarks.md, its prediction: \"With each group on machines of its own, writes and reads should therefore grow close to linearly in S for keys spread like these, limited by the clients' ability to spread their connections, by hot keys (a key lives in one group)\".".into(),
        ],
        paper_points: Vec::new(),
        figures,
        points,
    }
}

fn command(experiment: &str) -> String {
    format!("chorus model paper --experiments {experiment} --costs docs/benchmarks/model/costs-session12-busy.json --costs-ghz 2.45 --out docs/benchmarks/model")
}

fn write(out: &Path, stem: &str, experiment: &Experiment) -> anyhow::Result<()> {
    let json = out.join(format!("{stem}.json"));
    std::fs::write(&json, serde_json::to_string_pretty(experiment)?)
        .with_context(|| format!("cannot write {}", json.display()))?;
    let markdown = out.join(format!("{stem}.md"));
    std::fs::write(&markdown, tables(experiment))
        .with_context(|| format!("cannot write {}", markdown.display()))?;
    let png = out.join(format!("{stem}.png"));
    draw(&png, experiment)?;
    eprintln!("wrote {}, {} and {}", json.display(), markdown.display(), png.display());
    Ok(())
}

/// One markdown table per figure: a row per series and point.
fn tables(experiment: &Experiment) -> String {
    let mut text = format!("<!-- {} -->\n", experiment.command);
    let mut figures: Vec<&str> = Vec::new();
    for row in &experiment.rows {
        if !figures.contains(&row.figure.as_str()) {
            figures.push(&row.figure);
        }
    }
    for name in figures {
        text.push_str(&format!("\n**{name}**\n\n"));
        text.push_str("| series | x | clients | M ops/s | p50 us | p99 us | read p99 us | write p50 us | write p99 us | busiest machine's cores | busiest protocol thread | busiest NIC | errors |\n");
        text.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        for row in experiment.rows.iter().filter(|row| row.figure == name) {
            text.push_str(&format!(
                "| {} | {} {} | {} | {:.3} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.0}% | {:.0}% | {:.0}% | {} |\n",
                row.series,
                row.x,
                row.x_name,
                row.clients,
                row.throughput_ops_per_s / 1e6,
                row.latency.p50_us,
                row.latency.p99_us,
                row.read_latency.p99_us,
                row.write_latency.p50_us,
                row.write_latency.p99_us,
                row.cpu_utilisation_max * 100.0,
                row.protocol_thread_utilisation_max * 100.0,
                row.nic_utilisation_max * 100.0,
                row.errors
            ));
        }
    }
    text
}

fn draw(path: &Path, experiment: &Experiment) -> anyhow::Result<()> {
    let panels: Vec<Panel> = experiment
        .plan
        .figures
        .iter()
        .map(|figure| {
            let rows: Vec<&Row> = experiment
                .rows
                .iter()
                .filter(|row| figure.name.starts_with(&row.figure) || row.figure == figure.name)
                .collect();
            let mut names: Vec<&str> = Vec::new();
            for row in &rows {
                if !names.contains(&row.series.as_str()) {
                    names.push(&row.series);
                }
            }
            let mut series = Vec::new();
            for (index, name) in names.iter().enumerate() {
                let mine: Vec<&&Row> = rows.iter().filter(|row| row.series == *name).collect();
                let x =
                    |row: &Row| if figure.x_is_throughput { row.throughput_ops_per_s / 1e6 } else { row.x };
                series.push(Series {
                    label: name.to_string(),
                    color: palette(index),
                    dashed: false,
                    points: mine.iter().map(|row| (x(row), (figure.y)(row))).collect(),
                });
                if figure.x_is_throughput {
                    // Figure 6a's tail: p99 dashed beside the p50.
                    series.push(Series {
                        label: format!("{name} p99"),
                        color: palette(index),
                        dashed: true,
                        points: mine.iter().map(|row| (x(row), row.latency.p99_us)).collect(),
                    });
                }
            }
            let quoted: Vec<(f64, f64)> = experiment
                .plan
                .paper_points
                .iter()
                .filter(|point| point.figure == figure.name)
                .map(|point| (point.x, point.y))
                .collect();
            if !quoted.is_empty() {
                series.push(Series {
                    label: "the paper (quoted)".into(),
                    color: palette(7),
                    dashed: true,
                    points: quoted,
                });
            }
            Panel {
                title: figure.title.clone(),
                x_desc: figure.x_desc.clone(),
                y_desc: figure.y_desc.clone(),
                x_categories: None,
                log_y: figure.log_y,
                series,
            }
        })
        .collect();
    let cols = if panels.len() >= 4 { 2 } else { panels.len().max(1) };
    draw_grid(
        path,
        &format!("chorus model paper: {} (a model, not a measurement)", experiment.experiment),
        cols,
        &panels,
    )
}
