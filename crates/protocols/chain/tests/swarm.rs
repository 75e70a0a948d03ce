//! The chain store under the simulator's swarm: seeds with message loss, duplication,
//! reordering, partitions and crashes of any chain position (the scripted membership then
//! installs a view without it and the new head recovers, HyperLoop §5.1). Every history is
//! checked for linearizability and every operation must complete once the network heals. The
//! broken variants show the checker sees what the write and read locks prevent (§5.2).

use std::sync::Arc;

use chorus_chain::sim::setup as sim_setup;
use chorus_chain::Bug;
use chorus_sim::runner::{assert_swarm_passes, check_seed, describe_failure, sweep};
use chorus_sim::simulator::SimConfig;

const SEEDS: u64 = 1_000;

#[test]
fn chain_is_linearizable_and_live_under_faults_with_3_replicas() {
    assert_swarm_passes(&sim_setup(None), 3, SEEDS);
}

#[test]
fn chain_is_linearizable_and_live_under_faults_with_5_replicas() {
    assert_swarm_passes(&sim_setup(None), 5, SEEDS);
}

#[test]
fn a_single_replica_chain_works_on_a_perfect_network() {
    // The simulator's fault plan needs a survivor, so one replica runs without faults.
    for seed in 0..50 {
        let mut config = SimConfig::new(seed, 1);
        config.faults = false;
        let verdict = check_seed(&sim_setup(None), &config);
        assert!(verdict.passed(), "{}", describe_failure(&verdict));
    }
}

#[test]
fn without_faults_every_chain_operation_completes_with_a_known_outcome() {
    for seed in 0..50 {
        let mut config = SimConfig::new(seed, 3);
        config.faults = false;
        let verdict = check_seed(&sim_setup(None), &config);
        assert!(verdict.passed(), "{}", describe_failure(&verdict));
        let unknown = verdict.run.history.operations.iter().filter(|op| op.completion.is_none()).count();
        assert_eq!(unknown, 0, "seed {seed}: no fault, yet {unknown} outcomes unknown");
    }
}

#[test]
fn a_chain_seed_replays_exactly() {
    let config = SimConfig::new(42, 3);
    let (first, second) = (check_seed(&sim_setup(None), &config), check_seed(&sim_setup(None), &config));
    assert_eq!(format!("{:?}", first.run.history), format!("{:?}", second.run.history));
    assert_eq!(first.run.events, second.run.events);
}

fn first_failing_seed(bug: Bug, replicas: usize, seeds_max: u64) -> Option<u64> {
    let setup = sim_setup(Some(Arc::new(move |config| config.bug = Some(bug))));
    let seeds: Vec<u64> = (0..seeds_max).collect();
    let summary = sweep(&setup, replicas, &seeds, 2, &|verdict| verdict.passed());
    summary.failing_seeds.first().copied()
}

#[test]
fn reading_at_a_non_tail_replica_without_the_read_lock_is_caught() {
    for replicas in [3, 5] {
        let found = first_failing_seed(Bug::ReadWithoutLock, replicas, 300);
        assert!(found.is_some(), "ReadWithoutLock at {replicas} replicas survived 300 seeds");
    }
}

#[test]
fn executing_without_the_group_write_lock_is_caught() {
    for replicas in [3, 5] {
        let found = first_failing_seed(Bug::NoWriteLock, replicas, 300);
        assert!(found.is_some(), "NoWriteLock at {replicas} replicas survived 300 seeds");
    }
}
