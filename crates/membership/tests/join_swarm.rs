//! Joins under the simulator's swarm (Hermes §3.4 Recovery): every crashed replica restarts
//! with its Raft state (its `membership.log`) but none of its data, rejoins as a shadow,
//! copies the data in chunks while taking part in writes, and serves again. Every history is
//! checked for linearizability, with crashes, partitions, loss and duplication as in
//! `hermes_swarm.rs`.

mod support;

use chorus_core::{NodeId, NodeSet, Time};
use chorus_hermes::{Bug, Hermes, HermesConfig};
use chorus_membership::{Membership, MembershipConfig, WithMembership};
use chorus_sim::checker::{check_history, CheckerConfig};
use chorus_sim::simulator::{simulate_with_restarts, SimConfig};

thread_local! {
    /// Partition-scale membership timing (see `membership_config`).
    static FAST: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// The broken variant the restarted replicas run with, if any.
    static BUG: std::cell::Cell<Option<Bug>> = const { std::cell::Cell::new(None) };
}

fn hermes_config(me: NodeId, replicas: NodeSet, seed: u64) -> HermesConfig {
    let mut hermes = HermesConfig::new(me, replicas);
    hermes.bug = BUG.with(|bug| bug.get());
    hermes.seed = seed;
    hermes.message_loss_timeout = Time::from_millis(20);
    // Small chunks, so a copy takes several round trips and writes land in between.
    hermes.chunk_bytes_target = 64;
    hermes
}

fn membership_config(me: NodeId, replicas: NodeSet) -> MembershipConfig {
    support::swarm_membership_config(me, replicas, FAST.with(|fast| fast.get()))
}

fn build(me: NodeId, replicas: NodeSet, seed: u64) -> WithMembership<Hermes> {
    let membership = Membership::new(membership_config(me, replicas), Time::ZERO);
    WithMembership::new(Hermes::new(hermes_config(me, replicas, seed)), membership)
}

/// A restart keeps the Raft records (what `membership.log` holds) and loses the keys.
fn restart(
    me: NodeId,
    replicas: NodeSet,
    seed: u64,
    now: Time,
    crashed: &WithMembership<Hermes>,
) -> WithMembership<Hermes> {
    let membership = support::restarted_membership(crashed, membership_config(me, replicas), seed, now);
    let mut hermes = hermes_config(me, replicas, seed);
    hermes.recovering = true;
    WithMembership::new(Hermes::new(hermes), membership)
}

fn sim_config(seed: u64, replicas: usize) -> SimConfig {
    let mut config = SimConfig::new(seed, replicas);
    config.scripted_membership = false;
    config.fault_phase_max = Time::from_millis(1_500);
    config.restart_after = Some(Time::from_millis(300));
    config
}

fn swarm(replicas: usize, seeds: u64) {
    let mut failures = Vec::new();
    let (mut restarts, mut ops) = (0, 0);
    for seed in 0..seeds {
        let run = simulate_with_restarts(&sim_config(seed, replicas), &mut build, &mut restart);
        let report = check_history(&run.history, &CheckerConfig::default());
        ops += report.ops_checked;
        restarts += run.faults.restarts;
        if !report.violations.is_empty() || !run.liveness_failures.is_empty() {
            failures.push(format!(
                "seed {seed}: {:?} {:?}",
                report.violations.first().map(ToString::to_string),
                run.liveness_failures.first()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} failing seeds at {replicas} replicas; first: {}",
        failures.len(),
        failures[0]
    );
    assert!(restarts > seeds / 10, "too few restarts exercised: {restarts}");
    assert!(ops as u64 > seeds * 50, "too few operations checked: {ops}");
}

#[test]
fn restarted_replicas_rejoin_as_shadows_and_histories_stay_linearizable_with_3_replicas() {
    swarm(3, 200);
}

#[test]
fn restarted_replicas_rejoin_as_shadows_and_histories_stay_linearizable_with_5_replicas() {
    swarm(5, 120);
}

#[test]
fn replicas_removed_by_partitions_rejoin_as_shadows_and_histories_stay_linearizable() {
    FAST.with(|fast| fast.set(true));
    swarm(3, 150);
    swarm(5, 80);
}

/// How many seeds of `seeds` show a linearizability violation with `bug` on.
fn seeds_caught(bug: Bug, replicas: usize, seeds: u64) -> usize {
    BUG.with(|cell| cell.set(Some(bug)));
    let caught = support::seeds_with_violations(seeds, |seed| {
        simulate_with_restarts(&sim_config(seed, replicas), &mut build, &mut restart)
    });
    BUG.with(|cell| cell.set(None));
    caught
}

#[test]
fn the_checker_catches_a_shadow_that_serves_before_its_copy_is_complete() {
    let caught = seeds_caught(Bug::ShadowServes, 3, 200);
    assert!(caught > 0, "no seed caught a shadow serving early");
}

/// `SEED=.. REPLICAS=.. GREP=.. cargo test --test join_swarm debug_seed -- --ignored`
#[test]
#[ignore]
fn debug_seed() {
    let seed: u64 = std::env::var("SEED").unwrap().parse().unwrap();
    let replicas: usize = std::env::var("REPLICAS").unwrap().parse().unwrap();
    FAST.with(|fast| fast.set(std::env::var("FAST").is_ok()));
    let mut config = sim_config(seed, replicas);
    config.trace = true;
    let run = simulate_with_restarts(&config, &mut build, &mut restart);
    support::print_seed_run(&run, &std::env::var("GREP").unwrap_or_default());
}

/// A wider sweep than CI runs: `SEEDS=2000 cargo test --release --test join_swarm wide -- --ignored`.
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
