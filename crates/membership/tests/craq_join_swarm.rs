//! CRAQ joins under the simulator's swarm (Hermes §3.4 Recovery; chain replication adds a
//! node by copying its neighbour's state and linking it in): every crashed replica restarts
//! with its Raft state (its `membership.log`) but none of its keys, is linked back into the
//! chain at its id's place, copies its predecessor's state in chunks while versions keep
//! flowing past it, and serves again. With partition-scale timing, replicas removed while
//! alive come back the same way. Every history is checked for linearizability.

mod support;

use chorus_core::{NodeId, NodeSet, Time};
use chorus_craq::{Bug, Craq, CraqConfig};
use chorus_membership::{Membership, MembershipConfig, WithMembership};
use chorus_sim::checker::{check_history, CheckerConfig};
use chorus_sim::simulator::{simulate_with_restarts, SimConfig};

thread_local! {
    /// Partition-scale membership timing (see `membership_config`).
    static FAST: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// The broken variant every replica runs with, if any.
    static BUG: std::cell::Cell<Option<Bug>> = const { std::cell::Cell::new(None) };
}

fn craq_config(me: NodeId, replicas: NodeSet) -> CraqConfig {
    let mut craq = CraqConfig::new(me, replicas);
    craq.bug = BUG.with(|bug| bug.get());
    craq.retransmit_timeout = Time::from_millis(20);
    // Small chunks, so a copy takes several round trips and writes land in between.
    craq.chunk_bytes_target = 64;
    craq
}

fn membership_config(me: NodeId, replicas: NodeSet) -> MembershipConfig {
    support::swarm_membership_config(me, replicas, FAST.with(|fast| fast.get()))
}

fn build(me: NodeId, replicas: NodeSet, _seed: u64) -> WithMembership<Craq> {
    let membership = Membership::new(membership_config(me, replicas), Time::ZERO);
    WithMembership::new(Craq::new(craq_config(me, replicas)), membership)
}

/// A restart keeps the Raft records (what `membership.log` holds) and loses the keys.
fn restart(
    me: NodeId,
    replicas: NodeSet,
    seed: u64,
    now: Time,
    crashed: &WithMembership<Craq>,
) -> WithMembership<Craq> {
    let membership = support::restarted_membership(crashed, membership_config(me, replicas), seed, now);
    let mut craq = craq_config(me, replicas);
    craq.recovering = true;
    WithMembership::new(Craq::new(craq), membership)
}

fn sim_config(seed: u64, replicas: usize) -> SimConfig {
    let mut config = SimConfig::new(seed, replicas);
    config.scripted_membership = false;
    config.fault_phase_max = Time::from_millis(1_500);
    // With partition-scale timing, restart sooner too, so that most restarted replicas
    // rejoin, copy and serve while the clients are still running.
    let fast = FAST.with(|fast| fast.get());
    config.restart_after = Some(Time::from_millis(if fast { 40 } else { 300 }));
    config
}

struct Sweep {
    failures: Vec<String>,
    restarts: u64,
    ops: usize,
    /// Client operations answered (not with an error) by a replica after it restarted and
    /// rejoined: the joins were complete and the checker saw the joiners serve.
    served_by_rejoined: usize,
}

/// Counts, from the simulator's trace, operations a restarted replica answered successfully.
fn served_by_rejoined(trace: &[String]) -> usize {
    let mut restarted = std::collections::BTreeSet::new();
    let mut at_rejoined = std::collections::BTreeSet::new();
    let mut served = 0;
    for line in trace {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            [_, node, "restarts"] => {
                restarted.insert(node.to_string());
            }
            [_, "client", _, "->", node, op, ..] if restarted.contains(*node) => {
                at_rejoined.insert(op.to_string());
            }
            [_, op, "completes", outcome, ..]
                if at_rejoined.contains(*op) && !outcome.starts_with("Error") =>
            {
                served += 1;
            }
            _ => {}
        }
    }
    served
}

fn sweep(replicas: usize, seeds: std::ops::Range<u64>) -> Sweep {
    let mut result = Sweep { failures: Vec::new(), restarts: 0, ops: 0, served_by_rejoined: 0 };
    for seed in seeds {
        let mut config = sim_config(seed, replicas);
        config.trace = true;
        let run = simulate_with_restarts(&config, &mut build, &mut restart);
        let report = check_history(&run.history, &CheckerConfig::default());
        result.ops += report.ops_checked;
        result.restarts += run.faults.restarts as u64;
        result.served_by_rejoined += served_by_rejoined(&run.trace);
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
    let result = sweep(replicas, 0..seeds);
    assert!(
        result.failures.is_empty(),
        "{} failing seeds at {replicas} replicas; first: {}",
        result.failures.len(),
        result.failures[0]
    );
    assert!(result.restarts > seeds / 10, "too few restarts exercised: {}", result.restarts);
    assert!(result.ops as u64 > seeds * 50, "too few operations checked: {}", result.ops);
    assert!(result.served_by_rejoined > 0, "no rejoined replica served a client");
    eprintln!(
        "{replicas} replicas, {seeds} seeds: {} restarts, {} ops checked, {} served by rejoined replicas",
        result.restarts, result.ops, result.served_by_rejoined
    );
}

#[test]
fn restarted_craq_replicas_rejoin_and_histories_stay_linearizable_with_3_replicas() {
    swarm(3, 200);
}

#[test]
fn restarted_craq_replicas_rejoin_and_histories_stay_linearizable_with_5_replicas() {
    swarm(5, 120);
}

#[test]
fn craq_replicas_removed_by_partitions_rejoin_and_histories_stay_linearizable() {
    FAST.with(|fast| fast.set(true));
    swarm(3, 150);
    swarm(5, 80);
}

/// How many seeds of `seeds` show a linearizability violation with `bug` on.
fn seeds_caught(bug: Bug, replicas: usize, seeds: u64, fast: bool) -> usize {
    BUG.with(|cell| cell.set(Some(bug)));
    FAST.with(|cell| cell.set(fast));
    let caught = support::seeds_with_violations(seeds, |seed| {
        simulate_with_restarts(&sim_config(seed, replicas), &mut build, &mut restart)
    });
    BUG.with(|cell| cell.set(None));
    caught
}

// Partition-scale timing for the broken variants: restarted and removed replicas come back
// while the clients still run, so the checker sees what they serve.

#[test]
fn the_checker_catches_a_craq_joiner_that_serves_before_its_copy_is_complete() {
    let caught = seeds_caught(Bug::JoinerServes, 3, 100, true);
    assert!(caught > 0, "no seed caught a joiner serving early");
}

#[test]
fn the_checker_catches_a_craq_replica_that_rejoins_without_copying() {
    let caught = seeds_caught(Bug::RejoinWithoutCopy, 3, 100, true);
    assert!(caught > 0, "no seed caught a replica rejoining with its stale data");
}

/// `SEED=.. REPLICAS=.. GREP=.. [FAST=1] cargo test --test craq_join_swarm debug_seed -- --ignored`
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

/// How often a broken variant is caught: `BUG=.. SEEDS=.. cargo test --test craq_join_swarm bug_rate -- --ignored --nocapture`.
#[test]
#[ignore]
fn bug_rate() {
    let seeds: u64 = std::env::var("SEEDS").map_or(500, |seeds| seeds.parse().unwrap());
    let bug = match std::env::var("BUG").unwrap().as_str() {
        "JoinerServes" => Bug::JoinerServes,
        "RejoinWithoutCopy" => Bug::RejoinWithoutCopy,
        other => panic!("unknown bug {other}"),
    };
    for fast in [false, true] {
        for replicas in [3, 5] {
            println!(
                "fast={fast} replicas={replicas}: {} of {seeds}",
                seeds_caught(bug, replicas, seeds, fast)
            );
        }
    }
}

/// A wider sweep than CI runs:
/// `SEEDS=2000 [REPLICAS=3,5,7] cargo test --release --test craq_join_swarm wide -- --ignored --nocapture`.
#[test]
#[ignore]
fn wide_sweep() {
    let seeds: u64 = std::env::var("SEEDS").map_or(1000, |seeds| seeds.parse().unwrap());
    let sizes: Vec<usize> = std::env::var("REPLICAS")
        .map_or(vec![3, 5], |sizes| sizes.split(',').map(|size| size.parse().unwrap()).collect());
    for fast in [false, true] {
        FAST.with(|cell| cell.set(fast));
        for &replicas in &sizes {
            let result = sweep(replicas, 0..seeds);
            println!(
                "fast={fast} replicas={replicas}: {} failing of {seeds}, {} restarts, {} ops, {} served by rejoined",
                result.failures.len(),
                result.restarts,
                result.ops,
                result.served_by_rejoined
            );
            for failure in result.failures.iter().take(5) {
                println!("  {failure}");
            }
        }
    }
}
