//! `chorus bench`: load generators and side-by-side comparisons with peers (crates/bench).

use chorus_bench::cli::{KvArgs, YcsbArgs};
use chorus_bench::compare::CompareArgs;

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
}

#[derive(clap::Args)]
struct GroupBenchArgs {
    /// A short run (one group size, two message sizes).
    #[arg(long)]
    quick: bool,
    /// Write the JSON report here.
    #[arg(long, default_value = "bench-results/group.json")]
    json: std::path::PathBuf,
}

fn run_group(args: GroupBenchArgs) -> anyhow::Result<i32> {
    let mut config = if args.quick { chorus_group::bench::BenchConfig::quick() } else { Default::default() };
    let exe = std::env::current_exe()?.to_string_lossy().into_owned();
    config.child_command = Some(vec![exe, "group-child".to_string()]);
    if let Some(dir) = args.json.parent() {
        std::fs::create_dir_all(dir)?;
    }
    config.output = Some(args.json.clone());
    let report = chorus_group::bench::run(config)?;
    print!("{}", report.table());
    println!("JSON report: {}", args.json.display());
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
    }
}
