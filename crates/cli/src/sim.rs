//! `chorus sim`: run a protocol core under the deterministic simulator with faults and check
//! every seed's history for linearizability and liveness.

use std::io::Write;
use std::sync::Mutex;

use anyhow::bail;
use chorus_sim::runner::{check_seed, sweep, ProtocolSetup, ReadMode, SeedVerdict};
use chorus_sim::simulator::SimConfig;
use indicatif::{ProgressBar, ProgressStyle};

#[derive(clap::Args)]
pub struct SimArgs {
    /// Protocol core to simulate: hermes, craq, zab (linearizable sync reads) or zab-local
    /// (ZooKeeper's local reads: sequentially consistent, expected to fail the check).
    #[arg(long, default_value = "hermes")]
    protocol: String,
    /// How many seeds to run (starting at --seed).
    #[arg(long, default_value_t = 100)]
    seeds: u64,
    /// Replicas per cluster (3 to 7 in the papers; up to 64 here).
    #[arg(long, default_value_t = 3)]
    replicas: usize,
    /// First seed; with --seeds 1 this replays exactly one run.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print every event of the run (use with one seed).
    #[arg(long)]
    trace: bool,
    /// Finish with one line of JSON summarising the sweep.
    #[arg(long)]
    json: bool,
    /// Worker threads (default: available cores).
    #[arg(long)]
    threads: Option<usize>,
}

pub fn run(args: SimArgs) -> anyhow::Result<i32> {
    let setup = match args.protocol.as_str() {
        "hermes" => ProtocolSetup::hermes(),
        "craq" => ProtocolSetup::craq(),
        "zab" => ProtocolSetup::zab(ReadMode::Sync),
        "raftlog" => ProtocolSetup::Raftlog,
        "zab-local" => ProtocolSetup::zab(ReadMode::Local),
        "chain" => chorus_chain::sim::setup(None),
        other => {
            bail!("unknown protocol '{other}' (available: hermes, craq, zab, zab-local, raftlog, chain)")
        }
    };
    if !(1..=64).contains(&args.replicas) {
        bail!("--replicas must be between 1 and 64, got {}", args.replicas);
    }
    if args.trace {
        return trace_one(&setup, &args);
    }
    let seeds: Vec<u64> = (args.seed..args.seed.saturating_add(args.seeds)).collect();
    let threads = args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let progress = ProgressBar::new(seeds.len() as u64);
    progress.set_style(
        ProgressStyle::with_template("{spinner} {pos}/{len} seeds [{elapsed_precise}] {wide_bar} {msg}")
            .expect("valid template"),
    );
    let failures = Mutex::new(0usize);
    let report = |verdict: &SeedVerdict| {
        progress.inc(1);
        if !verdict.passed() {
            *failures.lock().expect("lock") += 1;
            progress.suspend(|| print_failure(&setup, args.replicas, verdict));
            progress.set_message(format!("{} failing", failures.lock().expect("lock")));
        }
        true
    };
    let summary = sweep(&setup, args.replicas, &seeds, threads, &report);
    progress.finish_and_clear();
    println!(
        "{}: {} seeds at {} replicas, {} operations checked, {} faults injected ({} crashes of which {} mid-broadcast, {} partitions, {} lost, {} duplicated), {} violations, {} liveness failures{}",
        summary.protocol,
        summary.seeds,
        summary.replicas,
        summary.ops_checked,
        summary.faults_injected,
        summary.faults.crashes,
        summary.faults.crashes_mid_broadcast,
        summary.faults.partitions,
        summary.faults.messages_lost,
        summary.faults.messages_duplicated,
        summary.violations,
        summary.liveness_failures,
        if summary.inconclusive_keys > 0 {
            format!(", {} keys inconclusive (search budget)", summary.inconclusive_keys)
        } else {
            String::new()
        }
    );
    for (seed, message) in &summary.panicked_seeds {
        println!(
            "seed {seed} PANICKED: {message}\n  replay: {}",
            replay_command(&setup, args.replicas, *seed)
        );
    }
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    }
    std::io::stdout().flush()?;
    Ok(if summary.failing_seeds.is_empty() { 0 } else { 1 })
}

fn replay_command(setup: &ProtocolSetup, replicas: usize, seed: u64) -> String {
    format!("chorus sim --protocol {} --replicas {replicas} --seed {seed} --seeds 1 --trace", setup.name())
}

fn print_failure(setup: &ProtocolSetup, replicas: usize, verdict: &SeedVerdict) {
    println!("seed {} FAILED ({})", verdict.seed, verdict.protocol_options);
    for violation in &verdict.violations {
        println!("  linearizability violation: {violation}");
    }
    for failure in verdict.liveness_failures.iter().take(5) {
        println!("  liveness: {failure}");
    }
    if verdict.liveness_failures.len() > 5 {
        println!("  ... and {} more pending operations", verdict.liveness_failures.len() - 5);
    }
    println!("  replay: {}", replay_command(setup, replicas, verdict.seed));
}

fn trace_one(setup: &ProtocolSetup, args: &SimArgs) -> anyhow::Result<i32> {
    let mut config = SimConfig::new(args.seed, args.replicas);
    config.trace = true;
    let verdict = check_seed(setup, &config);
    println!("seed {}: {}", args.seed, verdict.protocol_options);
    println!("faults: {:?}", verdict.run.fault_plan);
    println!("workload: {:?}", verdict.run.workload);
    for line in &verdict.run.trace {
        println!("{line}");
    }
    let passed = verdict.passed();
    if passed {
        println!("seed {} passed: {} operations linearizable, all completed", args.seed, verdict.ops_checked);
    } else {
        print_failure(setup, args.replicas, &verdict);
    }
    if args.json {
        let line = serde_json::json!({
            "protocol": setup.name(), "replicas": args.replicas, "seeds": 1,
            "ops_checked": verdict.ops_checked, "faults_injected": verdict.faults.total(),
            "violations": verdict.violations.len(), "liveness_failures": verdict.liveness_failures.len(),
        });
        println!("{line}");
    }
    Ok(if passed { 0 } else { 1 })
}
