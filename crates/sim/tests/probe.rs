use chorus_sim::runner::{describe_failure, sweep, ProtocolSetup};

fn setup() -> ProtocolSetup {
    let name = std::env::var("PROTO").unwrap_or("hermes".into());
    match std::env::var("BUG").ok() {
        Some(bug) => {
            chorus_sim::broken::find(&chorus_sim::broken::variants(), &name, &bug).unwrap().setup.clone()
        }
        None => ProtocolSetup::named(&name).unwrap(),
    }
}

#[test]
#[ignore]
fn probe_protocol() {
    let replicas: usize = std::env::var("REPLICAS").map_or(3, |s| s.parse().unwrap());
    let seeds: u64 = std::env::var("SEEDS").map_or(200, |s| s.parse().unwrap());
    let first: u64 = std::env::var("FIRST").map_or(0, |s| s.parse().unwrap());
    let list: Vec<u64> = (first..first + seeds).collect();
    let shown = std::sync::atomic::AtomicUsize::new(0);
    let t = std::time::Instant::now();
    let setup = setup();
    let summary = sweep(&setup, replicas, &list, 2, &|v| {
        if !v.passed() && shown.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < 3 {
            eprintln!("{}", describe_failure(v));
        }
        true
    });
    eprintln!(
        "{} {:?}: violations {} liveness {} inconclusive {} failing {} {:?} panics {:?}\n{:?}",
        setup.name(),
        t.elapsed(),
        summary.violations,
        summary.liveness_failures,
        summary.inconclusive_keys,
        summary.failing_seeds.len(),
        &summary.failing_seeds[..summary.failing_seeds.len().min(20)],
        summary.panicked_seeds.iter().take(3).collect::<Vec<_>>(),
        summary.faults
    );
}

#[test]
#[ignore]
fn probe_trace() {
    let replicas: usize = std::env::var("REPLICAS").map_or(3, |s| s.parse().unwrap());
    let seed: u64 = std::env::var("SEED").unwrap().parse().unwrap();
    let grep = std::env::var("GREP").unwrap_or_default();
    let mut config = chorus_sim::simulator::SimConfig::new(seed, replicas);
    config.trace = true;
    let v = chorus_sim::runner::check_seed(&setup(), &config);
    println!("{:?}", v.run.fault_plan);
    println!("{:?}", v.run.workload);
    for line in v.run.trace.iter().filter(|l| grep.split('|').any(|g| l.contains(g))) {
        println!("{line}");
    }
    println!("{}", describe_failure(&v));
}
