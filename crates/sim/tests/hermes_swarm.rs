//! Hermes under the main swarm: the real membership service (leases, live nodes removed by
//! partitions and pauses, rejoins, restarts), drifting clocks, and network faults; every
//! history checked for linearizability, every operation required to complete once the
//! network heals, and every kind of fault and protocol event counted above a floor.

use chorus_sim::runner::{
    assert_swarm_passes, check_seed, describe_failure, sweep, Minimum, ProtocolSetup, MANAGED_MINIMUMS,
};
use chorus_sim::simulator::SimConfig;

/// Seeds per replica count. Each seed is a distinct fault mix and Hermes option set.
const SEEDS: u64 = 1_500;

/// Hermes' own paths, per 1,000 seeds: replays, RMW aborts, retransmissions, shadows copying.
const HERMES_MINIMUMS: &[Minimum] = &[
    Minimum { counter: "crashes_mid_broadcast", per_1000_seeds: 50 },
    Minimum { counter: "hermes.replays", per_1000_seeds: 1_000 },
    Minimum { counter: "hermes.rmw_aborts", per_1000_seeds: 1_000 },
    Minimum { counter: "hermes.inv_retransmits", per_1000_seeds: 5_000 },
    Minimum { counter: "hermes.recoveries", per_1000_seeds: 300 },
    Minimum { counter: "membership.rejoins", per_1000_seeds: 300 },
];

fn swarm(replicas: usize, seeds: u64) {
    let minimums: Vec<Minimum> = MANAGED_MINIMUMS.iter().chain(HERMES_MINIMUMS).copied().collect();
    let summary = assert_swarm_passes(&ProtocolSetup::hermes(), replicas, seeds, &minimums);
    eprintln!("{replicas} replicas: {:?}", summary.faults);
}

#[test]
fn hermes_is_linearizable_and_live_under_faults_with_3_replicas() {
    swarm(3, SEEDS);
}

#[test]
fn hermes_is_linearizable_and_live_under_faults_with_5_replicas() {
    swarm(5, SEEDS / 2);
}

#[test]
fn hermes_with_7_replicas_passes_a_shorter_sweep() {
    let seeds: Vec<u64> = (0..200).collect();
    let summary = sweep(&ProtocolSetup::hermes(), 7, &seeds, 2, &|_| true);
    assert!(summary.failing_seeds.is_empty(), "failing seeds at 7 replicas: {:?}", summary.failing_seeds);
}

#[test]
fn a_seed_replays_exactly() {
    let config = SimConfig::new(42, 5);
    let (first, second) =
        (check_seed(&ProtocolSetup::hermes(), &config), check_seed(&ProtocolSetup::hermes(), &config));
    assert_eq!(format!("{:?}", first.run.history), format!("{:?}", second.run.history));
    assert_eq!(first.run.events, second.run.events);
    let other = check_seed(&ProtocolSetup::hermes(), &SimConfig::new(43, 5));
    assert_ne!(format!("{:?}", first.run.history), format!("{:?}", other.run.history));
}

#[test]
fn without_faults_every_operation_completes_with_a_known_outcome() {
    for seed in 0..50 {
        let mut config = SimConfig::new(seed, 3);
        config.faults = false;
        let verdict = check_seed(&ProtocolSetup::hermes(), &config);
        assert!(verdict.passed(), "{}", describe_failure(&verdict));
        assert_eq!(verdict.faults.total(), 0);
        assert_eq!(verdict.faults.views_installed, 0, "seed {seed}: a view change without a fault");
        let unknown = verdict.run.history.operations.iter().filter(|op| op.completion.is_none()).count();
        assert_eq!(unknown, 0, "seed {seed}: no fault, yet {unknown} outcomes unknown");
    }
}

/// Seed 16012 of the 100,000-seed sweep: node 0, paused past its lease and removed, resumed
/// and answered two queued CAS requests from stale state, because node 1, just restarted as a
/// joiner, acknowledged its heartbeat before replaying the membership log that removed it.
/// Seed 4123: node 2, cut off in view {1, 2} and removed by node 1, served stale reads at
/// 917 ms, because node 1, replaced by an empty joiner after its membership.log failed its
/// checksum, knew only the cluster's first view (which holds node 2) and acknowledged node 2's
/// heartbeat before its own join was applied.
#[test]
fn hermes_seeds_the_long_sweeps_found_pass() {
    for seed in [16012, 4123] {
        let verdict = check_seed(&ProtocolSetup::hermes(), &SimConfig::new(seed, 3));
        assert!(verdict.passed(), "seed {seed}: {}", describe_failure(&verdict));
    }
}

/// A core that panics on one seed (say, an assertion a broken variant trips) is reported as
/// that failing seed with its message, and the sweep itself does not die.
#[test]
fn a_panicking_seed_is_a_failing_seed() {
    let hermes = ProtocolSetup::hermes();
    let simulate = std::sync::Arc::new(move |config: &SimConfig| {
        assert_ne!(config.seed, 3, "invariant broken on purpose");
        hermes.simulate(config)
    });
    let setup = ProtocolSetup::Custom { name: "hermes-panics-on-3", simulate };
    let seeds: Vec<u64> = (0..6).collect();
    let summary = sweep(&setup, 3, &seeds, 1, &|_| true);
    assert_eq!(summary.failing_seeds, vec![3]);
    assert_eq!(summary.seeds, 6, "the sweep goes on after a panic");
    assert_eq!(summary.panicked_seeds.len(), 1);
    assert!(
        summary.panicked_seeds[0].1.contains("invariant broken on purpose"),
        "{:?}",
        summary.panicked_seeds
    );
}

/// The main swarm with Hermes' keys in the server's append-only file on each node's simulated
/// disk: crashed nodes and power losses restart from what the disk kept (unsynced writes lost
/// or torn, a sector corrupted on some seeds), and every acknowledged write must survive.
#[test]
fn hermes_restarts_from_its_append_only_file_under_storage_faults() {
    let setup =
        chorus_sim::runner::appendonly(ProtocolSetup::hermes(), chorus_sim::managed::AppendOnly::Always);
    let minimums: Vec<Minimum> =
        MANAGED_MINIMUMS.iter().chain(chorus_sim::runner::APPENDONLY_MINIMUMS).copied().collect();
    let summary = assert_swarm_passes(&setup, 3, 300, &minimums);
    eprintln!("{:?}", summary.faults);
}
