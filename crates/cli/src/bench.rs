//! `chorus bench`: load generators and side-by-side comparisons with peers (crates/bench).

use chorus_bench::cli::{KvArgs, YcsbArgs};
use chorus_bench::compare::CompareArgs;
use chorus_bench::protocols::ProtocolsArgs;

#[derive(clap::Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(clap::Subcommand)]
enum BenchCommand {
    /// YCSB core workloads A-F against RESP servers (hashes of 10 fields) or etcd.
    Ycsb(YcsbArgs),
    /// GET/SET microworkload: throughput and latency vs write ratio.
    Kv(KvArgs),
    /// Start Chorus, Redis (primary + 2 replicas with WAIT 2; primary alone) and a 3-member
    /// etcd cluster, run the same workloads against each, and report side by side.
    Compare(CompareArgs),
    /// HyperLoop group primitives: gWRITE latency vs size, throughput, group size, gFLUSH
    /// cost and tenants, chain (one host process serves everyone) vs Naïve (a process per
    /// tenant replica).
    Group(GroupBenchArgs),
    /// Cyclone's evaluation on loopback: commands and Raft entries per second and latency as
    /// raftlog's optimisations are added (1 log without batching, + batching, + 8 logs), vs
    /// replica count (1, 3, 5) and payload (0-512 B). JSON + PNG.
    Raftlog(chorus_bench::raftlog::RaftlogBenchArgs),
    /// Throughput over time across a failure (Hermes §6.6): 5 replicas, one SIGKILLed
    /// after a few seconds, at 1%, 5% and 20% writes; JSON and a PNG plot.
    Failover(chorus_bench::failover::FailoverArgs),
    /// The Hermes paper's comparison (§6): Hermes, CRAQ and ZAB on the same store: throughput
    /// vs write ratio (uniform, zipfian), latency vs throughput, read/write latency, 3/5/7
    /// replicas. JSON, PNG figures and a summary with ratios to Hermes.
    Protocols(ProtocolsArgs),
    /// The multi-tenant experiment (HyperLoop §2.2, §6.2): T tenants, each a chain of 3 on
    /// the same 3 hosts, YCSB-A updates through the transaction API; chain (one host process
    /// serves every tenant) vs Naïve (a replica process per tenant per host). Latency vs T,
    /// replica CPU per operation, JSON + PNG and the target ratios at T=32 under load.
    Tenants(chorus_bench::tenants::TenantsArgs),
}

#[derive(clap::Args)]
struct GroupBenchArgs {
    /// A few minutes instead of the paper's full plan: 4 message sizes, 1,000 operations per
    /// latency point, 64 MiB (not 1 GB) per throughput point, shorter time caps.
    #[arg(long)]
    quick: bool,
    /// Write the JSON report here; the PNG figures go next to it.
    #[arg(long, default_value = "bench-results/group.json")]
    json: std::path::PathBuf,
    /// Also run everything with stress-ng loading every core (installed with apt-get when
    /// missing and running as root).
    #[arg(long)]
    background_load: bool,
    /// Modes, comma separated: chorus, naive (Naïve-Event), naive-polling.
    #[arg(long, value_delimiter = ',')]
    modes: Option<Vec<String>>,
    /// Group sizes, comma separated (default 3,5,7).
    #[arg(long, value_delimiter = ',')]
    group_sizes: Option<Vec<usize>>,
    /// kernel: the chain's hosts serve on the kernel data path (XDP), every mode runs in
    /// network namespaces joined by veth pairs, regions are 1 MiB; user: loopback.
    #[arg(long, default_value = "user")]
    datapath: String,
    /// Measure nothing: redraw the figures and the summary from a saved report (--json's file).
    #[arg(long, value_name = "JSON")]
    from_json: Option<std::path::PathBuf>,
}

/// stress-ng on every core, installing it when missing (as root); a clear error otherwise.
fn stress_ng_command() -> anyhow::Result<Vec<String>> {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let program = match chorus_bench::procs::find_program("stress-ng", &[]) {
        Some(found) => found,
        None if root => chorus_bench::procs::ensure_program("stress-ng", &[], "stress-ng", true)?,
        None => anyhow::bail!(
            "--background-load needs stress-ng, which is not installed, and installing it needs root: \
             run `apt-get install stress-ng` as root, or drop --background-load"
        ),
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    Ok(vec![
        program.display().to_string(),
        "--cpu".into(),
        cores.to_string(),
        "--timeout".into(),
        "6h".into(),
        "--quiet".into(),
    ])
}

fn run_group(args: GroupBenchArgs) -> anyhow::Result<i32> {
    if let Some(json) = &args.from_json {
        let text = std::fs::read_to_string(json)?;
        let report: chorus_bench::group::BenchReport = serde_json::from_str(&text)?;
        print!("{}", chorus_bench::group::summary(&report));
        let dir = json.parent().map(std::path::Path::to_path_buf).unwrap_or_default();
        for plot in chorus_bench::group::plot_all(&report, &dir)? {
            println!("plot: {}", plot.display());
        }
        return Ok(0);
    }
    let mut config =
        if args.quick { chorus_bench::group::BenchConfig::reduced() } else { Default::default() };
    let exe = std::env::current_exe()?.to_string_lossy().into_owned();
    config.child_command = Some(vec![exe, "naive-replica".to_string()]);
    if let Some(modes) = &args.modes {
        config.modes =
            modes.iter().map(|m| m.parse()).collect::<Result<_, String>>().map_err(anyhow::Error::msg)?;
    }
    if let Some(sizes) = &args.group_sizes {
        config.group_sizes = sizes.clone();
    }
    config.datapath = args.datapath.parse().map_err(|e: String| anyhow::anyhow!("--datapath: {e}"))?;
    if config.datapath == chorus_group::runtime::Datapath::Kernel {
        let lab = chorus_group::kernel::netlab::NetLab::unavailable_reason();
        if let Some(reason) = chorus_group::kernel::unavailable_reason().or(lab) {
            anyhow::bail!("--datapath kernel cannot run here: {reason}");
        }
    }
    if args.background_load {
        let command = stress_ng_command()?;
        println!("background load: {}", command.join(" "));
        config.background_load_command = Some(command);
    }
    let dir = args.json.parent().map(std::path::Path::to_path_buf).unwrap_or_default();
    std::fs::create_dir_all(&dir)?;
    config.output = Some(args.json.clone());
    let report = chorus_bench::group::run::run(config)?;
    print!("{}", report.table());
    print!("{}", chorus_bench::group::summary(&report));
    println!("\nJSON report: {}", args.json.display());
    for plot in chorus_bench::group::plot_all(&report, &dir)? {
        println!("plot: {}", plot.display());
    }
    Ok(0)
}

pub fn run(args: BenchArgs) -> anyhow::Result<i32> {
    match args.command {
        BenchCommand::Ycsb(args) => chorus_bench::cli::run_ycsb(args),
        BenchCommand::Kv(args) => chorus_bench::cli::run_kv(args),
        BenchCommand::Compare(args) => {
            let chorus = std::env::current_exe()?;
            chorus_bench::compare::run(args, &chorus)
        }
        BenchCommand::Group(args) => run_group(args),
        BenchCommand::Raftlog(args) => chorus_bench::raftlog::run(args, &std::env::current_exe()?),
        BenchCommand::Failover(args) => {
            let chorus = std::env::current_exe()?;
            chorus_bench::failover::run(args, &chorus)
        }
        BenchCommand::Tenants(args) => {
            let load = if args.background_load && args.from_json.is_none() {
                let command = stress_ng_command()?;
                println!("background load: {}", command.join(" "));
                Some(command)
            } else {
                None
            };
            chorus_bench::tenants::run(args, &std::env::current_exe()?, load)
        }
        BenchCommand::Protocols(args) => {
            let chorus = std::env::current_exe()?;
            chorus_bench::protocols::run(args, &chorus)
        }
    }
}
