//! `chorus model`: predict a cluster's throughput and latency with the performance model
//! (chorus_sim::model, docs/model.md): the real protocol cores under virtual time, every
//! event charged from a cost table. `chorus model paper` runs the papers' experiments at
//! their scale (crate::model_paper).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use chorus_bench::charts::{draw_grid, palette, Panel, Series};
use chorus_chain::{Chain, ChainConfig, ChainLayout};
use chorus_core::{NodeId, NodeSet, Time};
use chorus_region::{Region, TenantId};
use chorus_sim::model::{
    predict, predict_with, CostTable, Distribution, Load, ModelConfig, ModelReport, Network, Workload,
    PROTOCOLS,
};

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct ModelArgs {
    #[command(subcommand)]
    action: Option<ModelAction>,
    /// Protocol: hermes, craq, zab (linearizable reads after a sync), zab-local (local,
    /// sequentially consistent reads), raftlog or chain.
    #[arg(long, default_value = "hermes")]
    protocol: String,
    /// Replicas (per group), each on its own machine.
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Cores per machine.
    #[arg(long, default_value_t = 8)]
    cores: u32,
    /// Event loops per node (the server's `event_loops`, raftlog's `raftlog_shards`): the
    /// keys split over this many independent protocol threads. 0: one per core.
    #[arg(long, default_value_t = 1)]
    loops: usize,
    /// Replica groups (`chorus up --shards`): keys spread over them by slot, every group on
    /// machines of its own.
    #[arg(long, default_value_t = 1)]
    groups: usize,
    /// The network between the machines: 10gbe, 25gbe or 100gbe (kernel TCP), or rdma (56 Gb/s
    /// InfiniBand through a kernel-bypass stack: the per-message costs become
    /// `CostTable::kernel_bypass`'s).
    #[arg(long, default_value = "25gbe")]
    network: String,
    /// kv-wX (X% writes, uniform keys, 32-byte values) or ycsb-a to ycsb-f (YCSB's mixes,
    /// zipfian keys, 1000-byte records).
    #[arg(long, default_value = "kv-w5")]
    workload: String,
    /// Keys: uniform, zipfian (YCSB's 0.99) or latest; default: the workload's own.
    #[arg(long)]
    distribution: Option<String>,
    /// Keys in the key space.
    #[arg(long)]
    keys: Option<u64>,
    /// Bytes an update writes (default: the workload's: 32 for kv-wX, 100 for YCSB).
    #[arg(long)]
    value_bytes: Option<usize>,
    /// Closed-loop clients; a comma-separated list predicts one row per count.
    #[arg(long, value_delimiter = ',', default_value = "16")]
    clients: Vec<u32>,
    /// Offer this many operations per second in total (open loop, Poisson) instead of
    /// closed-loop clients; --clients then says how many connections carry them.
    #[arg(long)]
    open_loop_ops_per_s: Option<u64>,
    /// The measured window, after the warm-up, in virtual milliseconds.
    #[arg(long, default_value_t = 200.0)]
    duration_ms: f64,
    /// Virtual time before measuring (leaders elected), in milliseconds.
    #[arg(long, default_value_t = 400)]
    warmup_ms: u64,
    /// A cost table (JSON, the fields `--print-costs` shows). Default: the placeholder table,
    /// which is NOT a calibration.
    #[arg(long)]
    costs: Option<PathBuf>,
    /// Print the placeholder cost table as JSON (a starting point for --costs) and exit.
    #[arg(long)]
    print_costs: bool,
    /// Print the predictions as JSON (one array) instead of a table.
    #[arg(long)]
    json: bool,
    /// Draw p50 and p99 latency against throughput over the client counts to this PNG.
    #[arg(long)]
    plot: Option<PathBuf>,
}

#[derive(clap::Subcommand)]
enum ModelAction {
    /// Measure the cost table on this machine (the real binary's handlers, loopback, fsync,
    /// and a 3-node Hermes cluster with one client) and save it as JSON for --costs.
    Calibrate(crate::calibrate::CalibrateArgs),
    /// Real 3-replica loopback runs next to the model's predictions with a calibrated cost
    /// table: throughput and p50 per protocol and client count, and the model's error.
    Compare(crate::calibrate::CompareArgs),
    /// The papers' experiments at their scale (Hermes, Cyclone, HyperLoop, the scale-out
    /// groups), each replica on a machine of its own, next to the papers' numbers.
    Paper(crate::model_paper::PaperArgs),
}

pub fn run(args: ModelArgs) -> anyhow::Result<i32> {
    match args.action {
        Some(ModelAction::Calibrate(calibrate)) => return crate::calibrate::calibrate(calibrate),
        Some(ModelAction::Compare(compare)) => return crate::calibrate::compare(compare),
        Some(ModelAction::Paper(paper)) => return crate::model_paper::run(paper),
        None => {}
    }
    if args.print_costs {
        println!("{}", serde_json::to_string_pretty(&CostTable::placeholder())?);
        return Ok(0);
    }
    let costs = match &args.costs {
        Some(path) => read_costs(path)?,
        None => CostTable::placeholder(),
    };
    let Some(network) = Network::preset(&args.network) else {
        bail!("unknown network '{}' (available: {})", args.network, Network::PRESETS.join(", "));
    };
    let Some(mut workload) = Workload::named(&args.workload) else {
        bail!("unknown workload '{}' ({})", args.workload, Workload::NAMES);
    };
    if let Some(name) = &args.distribution {
        workload.distribution = distribution(name)?;
    }
    if let Some(keys) = args.keys {
        workload.keys = keys.max(1);
    }
    if let Some(bytes) = args.value_bytes {
        workload.value_bytes = bytes;
        workload.record_bytes = workload.record_bytes.max(bytes);
    }
    if !PROTOCOLS.contains(&args.protocol.as_str()) && args.protocol != "chain" {
        bail!("unknown protocol '{}' (available: {}, chain)", args.protocol, PROTOCOLS.join(", "));
    }
    if args.duration_ms.is_nan() || args.duration_ms <= 0.0 {
        bail!("--duration-ms must be positive");
    }
    let loops = if args.loops == 0 { args.cores as usize } else { args.loops };
    let mut reports = Vec::new();
    for &clients in &args.clients {
        let mut config = ModelConfig::new(&args.protocol, args.nodes, args.cores, network.clone(), clients);
        config.costs = network.costs_for(&costs);
        config.workload = workload.clone();
        config.loops = loops;
        config.groups = args.groups;
        config.duration = Time::from_nanos((args.duration_ms * 1e6) as u64);
        config.warmup = Time::from_millis(args.warmup_ms);
        // Clients join for the last quarter of the warm-up: leaders are elected by then
        // (raftlog's after 100-160 ms), and the queues fill before the window.
        config.clients_start = Time::from_millis(args.warmup_ms * 3 / 4);
        if let Some(ops_per_s) = args.open_loop_ops_per_s {
            config.load = Load::Open { ops_per_s };
        }
        reports.push(predict_any(&config, ChainHops::Cpu).map_err(anyhow::Error::msg)?);
    }
    if args.json {
        println!("{}", serde_json::to_string(&reports)?);
    } else {
        print_table(&reports);
    }
    if let Some(path) = &args.plot {
        plot_latency_vs_throughput(path, &reports)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(0)
}

pub fn distribution(name: &str) -> anyhow::Result<Distribution> {
    Ok(match name {
        "uniform" => Distribution::Uniform,
        "zipfian" => Distribution::Zipfian { theta: chorus_sim::model::workload::YCSB_THETA },
        "latest" => Distribution::Latest { theta: chorus_sim::model::workload::YCSB_THETA },
        other => bail!("unknown distribution '{other}' (uniform, zipfian, latest)"),
    })
}

/// Where the chain's hops between members run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChainHops {
    /// On each member's CPU: Chorus' chain store in its event loop, or HyperLoop's
    /// Naïve-RDMA baseline.
    Cpu,
    /// On the NICs (HyperLoop: gWRITE, gCAS, gMEMCPY forwarded and applied by the NIC): the
    /// members' handlers cost no CPU; the coordinator's work at the head still does.
    Nic,
}

/// [`predict`] for the protocols of chorus_sim, and the chain store (its crate builds on the
/// simulator, so it is run from here) with its hops on the CPU or on the NIC.
pub fn predict_any(config: &ModelConfig, hops: ChainHops) -> Result<ModelReport, String> {
    if config.protocol != "chain" {
        return predict(config);
    }
    let all: NodeSet = (0..config.nodes as u8).map(NodeId).collect();
    let layout = chain_layout(&config.workload);
    let build = |me: NodeId, _loop: usize| {
        let mut chain_config = ChainConfig::new(me, all);
        chain_config.layout = layout;
        let region =
            Region::simulated(TenantId(0), "chain", layout.region_bytes()).expect("a region of the layout");
        Chain::with_region(chain_config, region)
    };
    let nic_handled: Option<fn(&chorus_chain::Message) -> bool> = match hops {
        ChainHops::Cpu => None,
        ChainHops::Nic => Some(is_member_hop),
    };
    predict_with(config, build, nic_handled)
}

/// A HyperLoop group operation travelling between members (caller to head, member to
/// member): what the NIC forwards and applies. The tail's acknowledgement to the caller and
/// everything else reach the CPU.
fn is_member_hop(message: &chorus_chain::Message) -> bool {
    matches!(message, chorus_chain::Message::Group(chorus_group::GroupMessage::Op { .. }))
}

/// A region large enough for the workload's keys and values, and no larger (a simulated
/// region is held in memory twice, and a multi-tenant run has hundreds).
fn chain_layout(workload: &Workload) -> ChainLayout {
    let keys = workload.keys.max(16);
    let entry = (workload.record_bytes.max(workload.value_bytes) as u64 + 64).next_multiple_of(8);
    let slots = (2 * keys).next_power_of_two();
    // Room for every key's live entry and as many superseded ones.
    let heap = (4 * keys * entry).next_multiple_of(8);
    let log = (64 * 1024u64).max(64 * entry);
    ChainLayout::new(log, slots, heap).expect("a valid chain layout")
}

pub fn read_costs(path: &Path) -> anyhow::Result<CostTable> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not a cost table", path.display()))
}

fn print_table(reports: &[ModelReport]) {
    let Some(first) = reports.first() else { return };
    println!(
        "{} on {} group(s) of {} nodes x {} cores, {} event loop(s) per node, {}, {} ({}% writes, {} B values, {:?} keys)",
        first.protocol,
        first.groups,
        first.nodes,
        first.cores,
        first.loops,
        first.network.name,
        first.workload.name,
        first.workload.write_percent,
        first.workload.value_bytes,
        first.workload.distribution,
    );
    println!("costs: {}", first.costs.source);
    println!(
        "{:>8} {:>14} {:>9} {:>9} {:>9} {:>9} {:>7} {:>9} {:>6} {:>7}",
        "clients", "ops/s", "p50 us", "p99 us", "p99.9 us", "mean us", "cpu", "protocol", "nic", "errors"
    );
    for report in reports {
        println!(
            "{:>8} {:>14.0} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>6.0}% {:>8.0}% {:>5.0}% {:>7}",
            report.clients,
            report.throughput_ops_per_s,
            report.latency.p50_us,
            report.latency.p99_us,
            report.latency.p999_us,
            report.latency.mean_us,
            report.cpu_utilisation_max * 100.0,
            report.protocol_thread_utilisation_max * 100.0,
            report.nic_utilisation_max * 100.0,
            report.errors
        );
    }
    println!("(a model's prediction, not a measurement: see docs/model.md for what it leaves out)");
}

/// p50 and p99 against throughput, one point per client count (the Hermes paper's Figure 6a
/// shape): where the curve turns up is the cluster's capacity at that latency.
fn plot_latency_vs_throughput(path: &Path, reports: &[ModelReport]) -> anyhow::Result<()> {
    let Some(first) = reports.first() else { bail!("nothing to plot") };
    let points = |pick: fn(&ModelReport) -> f64| -> Vec<(f64, f64)> {
        reports.iter().map(|report| (report.throughput_ops_per_s / 1e6, pick(report))).collect()
    };
    let panel = Panel {
        title: format!(
            "{} x{} nodes, {} cores, {}, {}",
            first.protocol, first.nodes, first.cores, first.network.name, first.workload.name
        ),
        x_desc: "throughput (M ops/s)".into(),
        y_desc: "latency (us)".into(),
        x_categories: None,
        log_y: true,
        series: vec![
            Series {
                label: "p50".into(),
                color: palette(0),
                dashed: false,
                points: points(|r| r.latency.p50_us),
            },
            Series {
                label: "p99".into(),
                color: palette(0),
                dashed: true,
                points: points(|r| r.latency.p99_us),
            },
        ],
    };
    if let Some(parent) = path.parent().filter(|parent| !parent.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    draw_grid(path, "chorus model: latency vs throughput (a prediction)", 1, &[panel])
}
