//! CRAQ under the swarm: thousands of seeds with faults (loss, duplication, reordering,
//! partitions, crashes of any chain position with the view change that re-links the chain),
//! every history checked for linearizability, every operation required to complete once the
//! network heals. Plus the broken variants the checker must catch.

use std::sync::Arc;

use chorus_craq::Bug;
use chorus_sim::runner::{assert_swarm_passes, check_seed, describe_failure, sweep, ProtocolSetup};
use chorus_sim::simulator::SimConfig;

/// Seeds per replica count. Each seed is a distinct fault mix and retransmission timeout.
const SEEDS: u64 = 1_500;

fn swarm(replicas: usize) {
    assert_swarm_passes(&ProtocolSetup::craq(), replicas, SEEDS);
}

#[test]
fn craq_is_linearizable_and_live_under_faults_with_3_replicas() {
    swarm(3);
}

#[test]
fn craq_is_linearizable_and_live_under_faults_with_5_replicas() {
    swarm(5);
}

#[test]
fn craq_with_7_replicas_passes_a_shorter_sweep() {
    let seeds: Vec<u64> = (0..300).collect();
    let summary = sweep(&ProtocolSetup::craq(), 7, &seeds, 2, &|_| true);
    assert!(summary.failing_seeds.is_empty(), "failing seeds at 7 replicas: {:?}", summary.failing_seeds);
}

#[test]
fn a_craq_seed_replays_exactly() {
    let config = SimConfig::new(42, 5);
    let (first, second) =
        (check_seed(&ProtocolSetup::craq(), &config), check_seed(&ProtocolSetup::craq(), &config));
    assert_eq!(format!("{:?}", first.run.history), format!("{:?}", second.run.history));
    assert_eq!(first.run.events, second.run.events);
}

#[test]
fn without_faults_every_craq_operation_completes_with_a_known_outcome() {
    for seed in 0..50 {
        let mut config = SimConfig::new(seed, 3);
        config.faults = false;
        let verdict = check_seed(&ProtocolSetup::craq(), &config);
        assert!(verdict.passed(), "{}", describe_failure(&verdict));
        let unknown = verdict.run.history.operations.iter().filter(|op| op.completion.is_none()).count();
        assert_eq!(unknown, 0, "seed {seed}: no fault, yet {unknown} outcomes unknown");
    }
}

/// The first failing seed in `0..seeds_max` with `bug` switched on, if any.
fn first_failing_seed(bug: Bug, replicas: usize, seeds_max: u64) -> Option<u64> {
    let setup = ProtocolSetup::Craq { tweak: Some(Arc::new(move |config| config.bug = Some(bug))) };
    let seeds: Vec<u64> = (0..seeds_max).collect();
    let summary = sweep(&setup, replicas, &seeds, 2, &|verdict| verdict.passed());
    summary.failing_seeds.first().copied()
}

#[test]
fn craq_serving_dirty_reads_locally_is_caught() {
    for replicas in [3, 5] {
        let found = first_failing_seed(Bug::ReadDirtyLocally, replicas, 300);
        assert!(found.is_some(), "ReadDirtyLocally at {replicas} replicas survived 300 seeds");
    }
}

#[test]
fn craq_acknowledging_at_the_head_is_caught() {
    for replicas in [3, 5] {
        let found = first_failing_seed(Bug::AckAtHead, replicas, 300);
        assert!(found.is_some(), "AckAtHead at {replicas} replicas survived 300 seeds");
    }
}
