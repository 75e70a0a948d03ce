//! ZAB under the swarm: thousands of seeds with faults (loss, duplication, reordering,
//! partitions, crashes of the leader or a follower, each followed by a view with a new epoch
//! that reaches replicas at different times), every history checked for linearizability in
//! Sync read mode, every operation required to complete once the network heals. Local read
//! mode must fail the check, and so must the broken variants.

use std::sync::Arc;

use chorus_sim::runner::{assert_swarm_passes, check_seed, describe_failure, sweep, ProtocolSetup, ReadMode};
use chorus_sim::simulator::SimConfig;
use chorus_zab::Bug;

/// Seeds per replica count. Each seed is a distinct fault mix and option set.
const SEEDS: u64 = 1_500;

fn swarm(replicas: usize) {
    assert_swarm_passes(&ProtocolSetup::zab(ReadMode::Sync), replicas, SEEDS);
}

#[test]
fn zab_sync_reads_are_linearizable_and_live_under_faults_with_3_replicas() {
    swarm(3);
}

#[test]
fn zab_sync_reads_are_linearizable_and_live_under_faults_with_5_replicas() {
    swarm(5);
}

#[test]
fn zab_with_7_replicas_passes_a_shorter_sweep() {
    let seeds: Vec<u64> = (0..300).collect();
    let summary = sweep(&ProtocolSetup::zab(ReadMode::Sync), 7, &seeds, 2, &|_| true);
    assert!(summary.failing_seeds.is_empty(), "failing seeds at 7 replicas: {:?}", summary.failing_seeds);
}

#[test]
fn a_zab_seed_replays_exactly() {
    let setup = ProtocolSetup::zab(ReadMode::Sync);
    let config = SimConfig::new(42, 5);
    let (first, second) = (check_seed(&setup, &config), check_seed(&setup, &config));
    assert_eq!(format!("{:?}", first.run.history), format!("{:?}", second.run.history));
    assert_eq!(first.run.events, second.run.events);
}

#[test]
fn without_faults_every_zab_operation_completes_with_a_known_outcome() {
    for read_mode in [ReadMode::Sync, ReadMode::Local] {
        for seed in 0..50 {
            let mut config = SimConfig::new(seed, 3);
            config.faults = false;
            let verdict = check_seed(&ProtocolSetup::zab(read_mode), &config);
            assert!(verdict.liveness_failures.is_empty(), "{}", describe_failure(&verdict));
            let unknown = verdict.run.history.operations.iter().filter(|op| op.completion.is_none()).count();
            assert_eq!(unknown, 0, "seed {seed}: no fault, yet {unknown} outcomes unknown");
        }
    }
}

/// The first failing seed in `0..seeds_max`, if any.
fn first_failing_seed(setup: &ProtocolSetup, replicas: usize, seeds_max: u64) -> Option<u64> {
    let seeds: Vec<u64> = (0..seeds_max).collect();
    let summary = sweep(setup, replicas, &seeds, 2, &|verdict| verdict.passed());
    summary.failing_seeds.first().copied()
}

/// ZooKeeper's local reads are sequentially consistent, not linearizable: a client that
/// completed a write at one replica may then read an older value at a lagging one. The
/// checker must find such a history, and every such failure must be a violation, never a
/// liveness failure (local reads are as live as sync ones).
#[test]
fn zab_local_reads_are_not_linearizable() {
    for replicas in [3, 5] {
        let setup = ProtocolSetup::zab(ReadMode::Local);
        let seeds: Vec<u64> = (0..200).collect();
        let summary = sweep(&setup, replicas, &seeds, 2, &|_| true);
        assert!(
            summary.violations > 0,
            "local reads at {replicas} replicas looked linearizable over 200 seeds"
        );
        assert_eq!(summary.liveness_failures, 0, "local reads must stay live");
    }
}

fn assert_caught(bug: Bug, seeds_max: u64) {
    let setup = ProtocolSetup::Zab {
        read_mode: ReadMode::Sync,
        tweak: Some(Arc::new(move |config| config.bug = Some(bug))),
    };
    for replicas in [3, 5] {
        let found = first_failing_seed(&setup, replicas, seeds_max);
        assert!(found.is_some(), "{bug:?} at {replicas} replicas survived {seeds_max} seeds");
    }
}

#[test]
fn zab_committing_without_a_quorum_is_caught() {
    assert_caught(Bug::CommitWithoutQuorum, 3_000);
}

#[test]
fn zab_leader_serving_uncommitted_reads_is_caught() {
    assert_caught(Bug::LeaderReadsUncommitted, 1_000);
}
