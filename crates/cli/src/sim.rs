//! `chorus sim`: run a protocol core under the deterministic simulator with faults and check
//! every seed's history for linearizability and liveness.

use std::io::Write;
use std::sync::Mutex;

use anyhow::bail;
use chorus_sim::broken::BrokenVariant;
use chorus_sim::runner::{check_seed, sweep, ProtocolSetup, SeedVerdict};
use chorus_sim::simulator::SimConfig;
use indicatif::{ProgressBar, ProgressStyle};

#[derive(clap::Args)]
pub struct SimArgs {
    /// Protocol core to simulate: hermes, craq, zab (linearizable sync reads), zab-local
    /// (ZooKeeper's local reads: sequentially consistent, expected to fail the check),
    /// raftlog (on simulated disks), chain (HyperLoop's), or PROTOCOL-shards (replica groups
    /// behind one slot map, slots moving while clients run).
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
    /// Run a deliberately broken variant of --protocol (see --list-broken): the sweep should
    /// find linearizability violations, and exits 1 when it does.
    #[arg(long, value_name = "VARIANT")]
    broken: Option<String>,
    /// List every broken variant, one `PROTOCOL VARIANT` line each, and exit.
    #[arg(long)]
    list_broken: bool,
    /// Hermes, CRAQ and ZAB keep their keys in the server's append-only file on each node's
    /// simulated disk (`appendfsync always`): crashed nodes and, on some seeds, every node after
    /// a power loss restart from what their disk kept, under lost, torn and corrupted writes.
    #[arg(long)]
    appendonly: bool,
}

const PROTOCOLS: &str =
    "hermes, craq, zab, zab-local, raftlog, chain; and the migration swarm: hermes-shards, craq-shards, zab-shards";

/// Every protocol's broken variants: the simulator's and the chain store's.
fn broken_variants() -> Vec<BrokenVariant> {
    let mut all = chorus_sim::broken::variants();
    all.extend(chorus_chain::sim::broken_variants());
    all
}

fn setup_for(args: &SimArgs) -> anyhow::Result<ProtocolSetup> {
    let Some(name) = &args.broken else {
        return match args.protocol.as_str() {
            "chain" => Ok(chorus_chain::sim::setup(None)),
            // Replica groups of the protocol behind one slot map, slots moving while clients run.
            other if other.ends_with("-shards") => {
                chorus_sim::shards::setup(other.trim_end_matches("-shards"))
                    .ok_or_else(|| anyhow::anyhow!("unknown protocol '{other}' (available: {PROTOCOLS})"))
            }
            other => ProtocolSetup::named(other)
                .ok_or_else(|| anyhow::anyhow!("unknown protocol '{other}' (available: {PROTOCOLS})")),
        };
    };
    let all = broken_variants();
    match chorus_sim::broken::find(&all, &args.protocol, name) {
        Some(variant) => Ok(variant.setup.clone()),
        None => {
            let known: Vec<&str> =
                all.iter().filter(|v| v.protocol == args.protocol).map(|v| v.name.as_str()).collect();
            bail!(
                "no broken variant '{name}' of protocol '{}' (its variants: {}; see --list-broken)",
                args.protocol,
                if known.is_empty() { "none".to_string() } else { known.join(", ") }
            )
        }
    }
}

pub fn run(args: SimArgs) -> anyhow::Result<i32> {
    if args.list_broken {
        for variant in broken_variants() {
            println!("{} {}", variant.protocol, variant.name);
        }
        return Ok(0);
    }
    let mut setup = setup_for(&args)?;
    if args.appendonly {
        if !matches!(args.protocol.as_str(), "hermes" | "craq" | "zab" | "zab-local" | "chain") {
            bail!(
                "--appendonly is for hermes, craq, zab and chain (raftlog always runs on its simulated disk)"
            );
        }
        setup = chorus_sim::runner::appendonly(setup, chorus_sim::managed::AppendOnly::Always);
    }
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
            progress.suspend(|| print_failure(&args, verdict));
            progress.set_message(format!("{} failing", failures.lock().expect("lock")));
        }
        true
    };
    let mut summary = sweep(&setup, args.replicas, &seeds, threads, &report);
    summary.broken = args.broken.clone();
    progress.finish_and_clear();
    let faults = &summary.faults;
    println!(
        "{}{}: {} seeds at {} replicas, {} operations checked ({} overlapping), {} faults injected \
         ({} crashes of which {} mid-broadcast, {} restarts, {} partitions, {} pauses, {} drifting clocks, \
         {} lost, {} duplicated; {} views, {} live nodes removed; storage: {} writes lost, {} torn, \
         {} sectors corrupted), {} violations, {} liveness failures, {} keys inconclusive",
        summary.protocol,
        summary.broken.as_ref().map_or(String::new(), |name| format!(" (broken: {name})")),
        summary.seeds,
        summary.replicas,
        summary.ops_checked,
        faults.ops_overlapping,
        summary.faults_injected,
        faults.crashes,
        faults.crashes_mid_broadcast,
        faults.restarts,
        faults.partitions,
        faults.pauses,
        faults.clocks_drifting,
        faults.messages_lost,
        faults.messages_duplicated,
        faults.views_installed,
        faults.live_nodes_removed,
        faults.storage_writes_lost,
        faults.storage_writes_torn,
        faults.storage_sectors_corrupted,
        summary.violations,
        summary.liveness_failures,
        summary.inconclusive_keys,
    );
    for (seed, message) in &summary.panicked_seeds {
        println!("seed {seed} PANICKED: {message}\n  replay: {}", replay_command(&args, *seed));
    }
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    }
    std::io::stdout().flush()?;
    // A seed fails for a violation, a liveness failure, a key the checker gave up on, or a
    // panic: each makes the exit code 1.
    Ok(if summary.failing_seeds.is_empty() { 0 } else { 1 })
}

fn replay_command(args: &SimArgs, seed: u64) -> String {
    let broken = args.broken.as_ref().map_or(String::new(), |name| format!(" --broken {name}"));
    let appendonly = if args.appendonly { " --appendonly" } else { "" };
    format!(
        "chorus sim --protocol {}{broken}{appendonly} --replicas {} --seed {seed} --seeds 1 --trace",
        args.protocol, args.replicas
    )
}

fn print_failure(args: &SimArgs, verdict: &SeedVerdict) {
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
    if verdict.inconclusive_keys > 0 {
        println!(
            "  {} keys inconclusive: the checker's search budget ran out (this fails the seed)",
            verdict.inconclusive_keys
        );
    }
    println!("  replay: {}", replay_command(args, verdict.seed));
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
        print_failure(args, &verdict);
    }
    if args.json {
        let line = serde_json::json!({
            "protocol": setup.name(), "replicas": args.replicas, "seeds": 1,
            "ops_checked": verdict.ops_checked, "faults_injected": verdict.faults.total(),
            "violations": verdict.violations.len(), "liveness_failures": verdict.liveness_failures.len(),
            "inconclusive_keys": verdict.inconclusive_keys, "broken": args.broken,
        });
        println!("{line}");
    }
    Ok(if passed { 0 } else { 1 })
}
