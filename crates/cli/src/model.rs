//! `chorus model`: predict a cluster's throughput and latency with the performance model
//! (chorus_sim::model, docs/model.md): the real protocol cores under virtual time, every
//! event charged from a cost table.

use std::path::PathBuf;

use anyhow::{bail, Context};
use chorus_core::Time;
use chorus_sim::model::{predict, CostTable, Load, ModelConfig, ModelReport, Network, Workload, PROTOCOLS};

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct ModelArgs {
    #[command(subcommand)]
    action: Option<ModelAction>,
    /// Protocol: hermes, craq, zab or raftlog.
    #[arg(long, default_value = "hermes")]
    protocol: String,
    /// Replicas, each on its own machine.
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Cores per machine.
    #[arg(long, default_value_t = 8)]
    cores: u32,
    /// The network between the machines: 10gbe, 25gbe or 100gbe.
    #[arg(long, default_value = "25gbe")]
    network: String,
    /// kv-wX (X% writes) or ycsb-a, ycsb-b, ycsb-c (their mixes, uniform keys).
    #[arg(long, default_value = "kv-w5")]
    workload: String,
    /// Value size in bytes.
    #[arg(long, default_value_t = 32)]
    value_bytes: usize,
    /// Closed-loop clients; a comma-separated list predicts one row per count.
    #[arg(long, value_delimiter = ',', default_value = "16")]
    clients: Vec<u32>,
    /// Offer this many operations per second in total (open loop, Poisson) instead of
    /// closed-loop clients; --clients then says how many connections carry them.
    #[arg(long)]
    open_loop_ops_per_s: Option<u64>,
    /// The measured window, after the warm-up, in virtual milliseconds.
    #[arg(long, default_value_t = 200)]
    duration_ms: u64,
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
}

#[derive(clap::Subcommand)]
enum ModelAction {
    /// Measure the cost table on this machine (the real binary's handlers, loopback, fsync,
    /// and a 3-node Hermes cluster with one client) and save it as JSON for --costs.
    Calibrate(crate::calibrate::CalibrateArgs),
    /// Real 3-replica loopback runs next to the model's predictions with a calibrated cost
    /// table: throughput and p50 per protocol and client count, and the model's error.
    Compare(crate::calibrate::CompareArgs),
}

pub fn run(args: ModelArgs) -> anyhow::Result<i32> {
    match args.action {
        Some(ModelAction::Calibrate(calibrate)) => return crate::calibrate::calibrate(calibrate),
        Some(ModelAction::Compare(compare)) => return crate::calibrate::compare(compare),
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
        bail!("unknown workload '{}' (kv-wX with X from 0 to 100, ycsb-a, ycsb-b, ycsb-c)", args.workload);
    };
    workload.value_bytes = args.value_bytes;
    if !PROTOCOLS.contains(&args.protocol.as_str()) {
        bail!("unknown protocol '{}' (available: {})", args.protocol, PROTOCOLS.join(", "));
    }
    if args.duration_ms == 0 {
        bail!("--duration-ms must be positive");
    }
    let mut reports = Vec::new();
    for &clients in &args.clients {
        let mut config = ModelConfig::new(&args.protocol, args.nodes, args.cores, network.clone(), clients);
        config.costs = costs.clone();
        config.workload = workload.clone();
        config.duration = Time::from_millis(args.duration_ms);
        config.warmup = Time::from_millis(args.warmup_ms);
        if let Some(ops_per_s) = args.open_loop_ops_per_s {
            config.load = Load::Open { ops_per_s };
        }
        reports.push(predict(&config).map_err(anyhow::Error::msg)?);
    }
    if args.json {
        println!("{}", serde_json::to_string(&reports)?);
    } else {
        print_table(&reports);
    }
    Ok(0)
}

fn read_costs(path: &PathBuf) -> anyhow::Result<CostTable> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not a cost table", path.display()))
}

fn print_table(reports: &[ModelReport]) {
    let Some(first) = reports.first() else { return };
    println!(
        "{} on {} nodes x {} cores, {}, {} ({}% writes, {} B values)",
        first.protocol,
        first.nodes,
        first.cores,
        first.network.name,
        first.workload.name,
        first.workload.write_percent,
        first.workload.value_bytes
    );
    println!("costs: {}", first.costs.source);
    println!(
        "{:>8} {:>14} {:>9} {:>9} {:>9} {:>7} {:>9} {:>6} {:>7}",
        "clients", "ops/s", "p50 us", "p99 us", "mean us", "cpu", "protocol", "nic", "errors"
    );
    for report in reports {
        println!(
            "{:>8} {:>14.0} {:>9.1} {:>9.1} {:>9.1} {:>6.0}% {:>8.0}% {:>5.0}% {:>7}",
            report.clients,
            report.throughput_ops_per_s,
            report.latency.p50_us,
            report.latency.p99_us,
            report.latency.mean_us,
            report.cpu_utilisation_max * 100.0,
            report.protocol_thread_utilisation_max * 100.0,
            report.nic_utilisation_max * 100.0,
            report.errors
        );
    }
    println!("(a model's prediction, not a measurement: see docs/model.md for what it leaves out)");
}
