//! Run the §6.1 microbenchmarks without the `chorus` CLI:
//!
//! ```text
//! cargo run --release -p chorus-bench --example group_bench -- [quick] [out.json]
//! ```
//!
//! Hosts and Naïve replicas run as child processes of chorus-group's `chorus-group-child`
//! binary, which must have been built next to this example (same target directory).

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut config = if args.iter().any(|a| a == "quick") {
        chorus_bench::group::BenchConfig::quick()
    } else {
        chorus_bench::group::BenchConfig::default()
    };
    config.output = args.iter().find(|a| a.ends_with(".json")).map(Into::into);
    let exe = std::env::current_exe()?;
    // target/<profile>/examples/group_bench -> target/<profile>/chorus-group-child
    let child = exe.parent().and_then(|d| d.parent()).map(|d| d.join("chorus-group-child"));
    match child {
        Some(child) if child.exists() => config.child_command = Some(vec![child.display().to_string()]),
        _ => eprintln!("chorus-group-child not found next to the example: hosts run in-process"),
    }
    let report = chorus_bench::group::run::run(config)?;
    print!("{}", report.table());
    Ok(())
}
