//! Child entry point for group hosts and Naïve replicas started by tests and benchmarks: reads
//! a host configuration (JSON) from stdin, prints `LISTENING <addr>`, serves until stdin
//! closes. The `chorus` CLI exposes the same function as `chorus group-child`.

fn main() {
    if let Err(error) = chorus_group::runtime::child_main() {
        eprintln!("chorus-group-child: {error:#}");
        std::process::exit(1);
    }
}
