//! Hermes driven by the real membership service (no scripted views): crashes, partitions
//! and message faults from the simulator's swarm, every history checked for
//! linearizability. Partitions now cause removals too, so this is where leases matter: a
//! replica cut off from the majority must stop serving reads before the others move on.

use chorus_core::{NodeId, NodeSet, Time};
use chorus_hermes::{Hermes, HermesConfig};
use chorus_membership::{Membership, MembershipConfig, WithMembership};
use chorus_sim::checker::{check_history, CheckerConfig};
use chorus_sim::simulator::{simulate, SimConfig};

fn build(me: NodeId, replicas: NodeSet, seed: u64) -> WithMembership<Hermes> {
    let mut hermes = HermesConfig::new(me, replicas);
    hermes.seed = seed;
    hermes.message_loss_timeout = Time::from_millis(20);
    let membership = Membership::new(MembershipConfig::new(me, replicas), Time::ZERO);
    WithMembership::new(Hermes::new(hermes), membership)
}

fn swarm(replicas: usize, seeds: u64) {
    let mut failures = Vec::new();
    let (mut removals, mut ops) = (0, 0);
    for seed in 0..seeds {
        let mut config = SimConfig::new(seed, replicas);
        config.scripted_membership = false;
        config.fault_phase_max = Time::from_millis(1_500);
        let run = simulate(&config, &mut build);
        let report = check_history(&run.history, &CheckerConfig::default());
        ops += report.ops_checked;
        removals += run.faults.crashes;
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
    assert!(removals > seeds / 10, "too few crashes exercised: {removals}");
    assert!(ops as u64 > seeds * 50, "too few operations checked: {ops}");
}

#[test]
fn hermes_with_real_membership_is_linearizable_under_faults_with_3_replicas() {
    swarm(3, 300);
}

#[test]
fn hermes_with_real_membership_is_linearizable_under_faults_with_5_replicas() {
    swarm(5, 200);
}
