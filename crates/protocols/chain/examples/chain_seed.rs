//! Replay one simulator seed of the chain store with a trace: `chain_seed <replicas> <seed> [trace]`.
use chorus_sim::runner::{check_seed, describe_failure};
use chorus_sim::simulator::SimConfig;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let replicas: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(3);
    let seed: u64 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(0);
    let mut config = SimConfig::new(seed, replicas);
    config.trace = args.get(3).is_some();
    let verdict = check_seed(&chorus_chain::sim::setup(None), &config);
    for line in &verdict.run.trace {
        println!("{line}");
    }
    println!("{}", if verdict.passed() { "PASS".to_string() } else { describe_failure(&verdict) });
}
