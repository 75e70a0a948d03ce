//! What the join swarms share: membership timing scaled to the simulator's partitions, a
//! restarted node's membership (its Raft records survive, as `membership.log` does), the count
//! of seeds a broken variant is caught on, and the print-out of one seed for debugging.

#![allow(dead_code)] // Each test file uses a different part.

use chorus_core::{NodeId, NodeSet, Replica, Time};
use chorus_membership::{Membership, MembershipConfig, WithMembership};
use chorus_sim::checker::{check_history, CheckerConfig};
use chorus_sim::simulator::SeedRun;

/// The membership of a join swarm's node. `fast`: timing scaled to the simulator's partitions
/// (5 to 300 ms), so partitions remove live nodes, which then rejoin on their own.
pub fn swarm_membership_config(me: NodeId, replicas: NodeSet, fast: bool) -> MembershipConfig {
    let mut config = MembershipConfig::new(me, replicas);
    if fast {
        config.heartbeat_period = Time::from_millis(10);
        config.missed_heartbeats_max = 5;
        config.lease = Time::from_millis(60);
        config.drift_margin = Time::from_millis(5);
    }
    // Nodes removed while alive (partitions) come back through a join too.
    config.rejoin = true;
    config
}

/// The membership of `crashed`'s restart: its Raft records, and a join request under a new
/// incarnation.
pub fn restarted_membership<P: Replica>(
    crashed: &WithMembership<P>,
    mut config: MembershipConfig,
    seed: u64,
    now: Time,
) -> Membership {
    let records = crashed.membership().durable_records();
    config.join = Some(seed | 1);
    Membership::restore(config, now, &records)
}

/// How many of seeds `0..seeds` give a history with a linearizability violation: how a
/// broken variant shows that the checker catches it.
pub fn seeds_with_violations(seeds: u64, mut run: impl FnMut(u64) -> SeedRun) -> usize {
    (0..seeds)
        .filter(|&seed| !check_history(&run(seed).history, &CheckerConfig::default()).violations.is_empty())
        .count()
}

/// What a swarm's `debug_seed` prints: the trace lines containing `grep`, the fault plan, the
/// first liveness failure and the first linearizability violation.
pub fn print_seed_run(run: &SeedRun, grep: &str) {
    for line in run.trace.iter().filter(|line| line.contains(grep)) {
        println!("{line}");
    }
    println!("{:?}", run.fault_plan);
    println!("{:?}", run.liveness_failures.first());
    let report = check_history(&run.history, &CheckerConfig::default());
    println!("{:?}", report.violations.first().map(ToString::to_string));
}
