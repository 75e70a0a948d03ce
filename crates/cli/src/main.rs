//! `chorus`: one binary, one subcommand per job.

use clap::{Parser, Subcommand};

mod bench;
mod calibrate;
mod group;
mod model;
mod model_paper;
mod node;
mod sim;
mod up;

#[derive(Parser)]
#[command(name = "chorus", version, about = "Chorus: a replicated key-value store and replication engine")]
struct Cli {
    #[command(subcommand)]
    command: Subcommands,
}

#[derive(Subcommand)]
enum Subcommands {
    /// Start a local cluster of `chorus node` processes and stop them on Ctrl-C.
    Up(up::UpArgs),
    /// Run one replica.
    Node(Box<node::NodeArgs>),
    /// Run protocol cores under the deterministic simulator with faults and check linearizability.
    Sim(sim::SimArgs),
    /// Predict a cluster's throughput and latency with the performance model (the real
    /// protocol cores under virtual time, every event charged CPU and network time).
    Model(model::ModelArgs),
    /// Benchmarks: load generators and side-by-side comparisons with peers.
    Bench(bench::BenchArgs),
    /// Serve HyperLoop group operations (gWRITE, gCAS, gMEMCPY, gFLUSH) on this host's
    /// regions for the listed tenants.
    GroupHost(group::GroupHostArgs),
    /// A group host or Naïve replica started by another chorus process (config on stdin).
    #[command(hide = true)]
    GroupChild,
    /// A Naïve-baseline replica for one tenant replica (HyperLoop §6): receives, applies and
    /// forwards group operations with its own CPU, event-driven or busy-polling. Started by
    /// `chorus group-host --mode naive|naive-polling`, which writes its configuration (JSON)
    /// to its stdin; it prints `LISTENING <addr>` and exits when its caller or parent leaves.
    NaiveReplica,
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Subcommands::Up(args) => up::run(args),
        Subcommands::Node(args) => node::run(*args),
        Subcommands::Sim(args) => sim::run(args),
        Subcommands::Model(args) => model::run(args),
        Subcommands::Bench(args) => bench::run(args),
        Subcommands::GroupHost(args) => group::run_host(args),
        Subcommands::GroupChild | Subcommands::NaiveReplica => group::run_child(),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(error) => {
            eprintln!("chorus: {error:#}");
            std::process::exit(2);
        }
    }
}
