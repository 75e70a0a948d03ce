//! ZAB joins under the simulator's swarm: every crashed replica restarts with its Raft
//! records (its `membership.log`) and none of its data, joins through the membership
//! service, takes a snapshot and the history after it from the leader (ZooKeeper's SNAP;
//! Zab, DSN 2011, §IV-B phase 2 "synchronization"), and only then counts in quorums and
//! serves. Replicas removed by partitions rejoin with the history they kept. Every history is
//! checked for linearizability and every request must complete once the faults heal.

mod support;

use chorus_core::{NodeId, NodeSet, Time};
use chorus_membership::{Membership, MembershipConfig, WithMembership};
use chorus_sim::checker::{check_history, CheckerConfig};
use chorus_sim::simulator::{simulate_with_restarts, SimConfig};
use chorus_zab::{Bug, ReadMode, Zab, ZabConfig};

thread_local! {
    /// Partition-scale membership timing (see `membership_config`).
    static FAST: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// The broken variant the restarted replicas run with, if any.
    static BUG: std::cell::Cell<Option<Bug>> = const { std::cell::Cell::new(None) };
}

fn zab_config(me: NodeId, replicas: NodeSet, recovering: bool) -> ZabConfig {
    let mut zab = ZabConfig::new(me, replicas);
    zab.read_mode = ReadMode::Sync;
    zab.retransmit_timeout = Time::from_millis(20);
    zab.recovering = recovering;
    zab.bug = BUG.with(|bug| bug.get());
    // Small chunks, so a snapshot takes several round trips and writes land in between.
    zab.snapshot_chunk_bytes_target = 24;
    // Few entries per catch-up message, and compaction keeps logs short: joiners usually
    // need a snapshot rather than the whole log.
    zab.catch_up_entries_max = 8;
    zab
}

fn membership_config(me: NodeId, replicas: NodeSet) -> MembershipConfig {
    support::swarm_membership_config(me, replicas, FAST.with(|fast| fast.get()))
}

fn build(me: NodeId, replicas: NodeSet, _seed: u64) -> WithMembership<Zab> {
    let membership = Membership::new(membership_config(me, replicas), Time::ZERO);
    WithMembership::new(Zab::new(zab_config(me, replicas, false)), membership)
}

/// A restart keeps the Raft records (what `membership.log` holds) and loses the keys and the
/// ZAB history.
fn restart(
    me: NodeId,
    replicas: NodeSet,
    seed: u64,
    now: Time,
    crashed: &WithMembership<Zab>,
) -> WithMembership<Zab> {
    let membership = support::restarted_membership(crashed, membership_config(me, replicas), seed, now);
    let zab = Zab::new(zab_config(me, replicas, true));
    WithMembership::new(zab, membership)
}

fn sim_config(seed: u64, replicas: usize) -> SimConfig {
    let mut config = SimConfig::new(seed, replicas);
    config.scripted_membership = false;
    config.fault_phase_max = Time::from_millis(1_500);
    config.restart_after = Some(Time::from_millis(300));
    config
}

struct Sweep {
    failures: Vec<String>,
    violations: usize,
    restarts: u64,
    /// Snapshot chunks delivered in the traced seeds.
    snapshots: u64,
    ops: usize,
}

fn sweep(replicas: usize, seeds: u64) -> Sweep {
    let mut result = Sweep { failures: Vec::new(), violations: 0, restarts: 0, snapshots: 0, ops: 0 };
    for seed in 0..seeds {
        let mut config = sim_config(seed, replicas);
        // The first seeds are traced to count snapshot transfers (tracing costs time).
        config.trace = seed < 30;
        let run = simulate_with_restarts(&config, &mut build, &mut restart);
        let report = check_history(&run.history, &CheckerConfig::default());
        result.ops += report.ops_checked;
        result.restarts += run.faults.restarts;
        result.snapshots += run.trace.iter().filter(|line| line.contains("SnapshotChunk")).count() as u64;
        result.violations += usize::from(!report.violations.is_empty());
        if !report.violations.is_empty() || !run.liveness_failures.is_empty() {
            result.failures.push(format!(
                "seed {seed}: {:?} {:?}",
                report.violations.first().map(ToString::to_string),
                run.liveness_failures.first()
            ));
        }
    }
    result
}

fn swarm(replicas: usize, seeds: u64) {
    let result = sweep(replicas, seeds);
    assert!(
        result.failures.is_empty(),
        "{} failing seeds at {replicas} replicas; first: {}",
        result.failures.len(),
        result.failures[0]
    );
    assert!(result.restarts > seeds / 10, "too few restarts exercised: {}", result.restarts);
    assert!(result.snapshots > 0, "no snapshot chunk was sent in the traced seeds");
    assert!(result.ops as u64 > seeds * 50, "too few operations checked: {}", result.ops);
    eprintln!(
        "{replicas} replicas, {seeds} seeds: {} restarts, {} snapshot chunks (first 30 seeds), {} operations checked",
        result.restarts, result.snapshots, result.ops
    );
}

#[test]
fn restarted_zab_replicas_rejoin_through_snapshots_and_histories_stay_linearizable_with_3_replicas() {
    swarm(3, 150);
}

#[test]
fn restarted_zab_replicas_rejoin_through_snapshots_and_histories_stay_linearizable_with_5_replicas() {
    swarm(5, 80);
}

#[test]
fn zab_replicas_removed_by_partitions_rejoin_and_histories_stay_linearizable() {
    FAST.with(|fast| fast.set(true));
    swarm(3, 120);
    swarm(5, 60);
}

#[test]
fn the_checker_catches_a_joiner_that_serves_before_it_is_synchronised() {
    BUG.with(|cell| cell.set(Some(Bug::JoinerServesEarly)));
    let result = sweep(3, 150);
    BUG.with(|cell| cell.set(None));
    assert!(result.violations > 0, "no seed caught a joiner serving early");
}

/// `SEED=.. REPLICAS=.. GREP=.. [FAST=1] cargo test --test zab_join_swarm debug_seed -- --ignored`
#[test]
#[ignore]
fn debug_seed() {
    let seed: u64 = std::env::var("SEED").unwrap().parse().unwrap();
    let replicas: usize = std::env::var("REPLICAS").unwrap().parse().unwrap();
    let grep = std::env::var("GREP").unwrap_or_default();
    FAST.with(|fast| fast.set(std::env::var("FAST").is_ok()));
    let mut config = sim_config(seed, replicas);
    config.trace = true;
    let run = simulate_with_restarts(&config, &mut build, &mut restart);
    support::print_seed_run(&run, &grep);
}

/// A wider sweep than CI runs: `SEEDS=1000 cargo test --test zab_join_swarm wide -- --ignored`.
#[test]
#[ignore]
fn wide_sweep() {
    let seeds: u64 = std::env::var("SEEDS").map_or(1000, |seeds| seeds.parse().unwrap());
    for fast in [false, true] {
        FAST.with(|cell| cell.set(fast));
        swarm(3, seeds);
        swarm(5, seeds / 2);
    }
}
