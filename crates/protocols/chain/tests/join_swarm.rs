//! Joins with the membership's default timing (HyperLoop §5.1: "a new member in the chain
//! copies the log and the database ... writes are paused for a short duration of catch-up
//! phase. Only then does it formally join the chain"). The main swarm (tests/swarm.rs) runs
//! the chain with partition-scale timing, where partitions remove live nodes; here, with 50 ms
//! heartbeats and 600 ms leases, a crashed node usually restarts before its failure is
//! noticed, so the join view keeps it live and the members still list it as linked
//! (`Joining`, `NeedCopy`). Every history is checked for linearizability.

use chorus_chain::{Chain, ChainConfig, ChainLayout};
use chorus_core::{NodeId, NodeSet, Time};
use chorus_membership::MembershipConfig;
use chorus_region::{Region, RegionMemory, TenantId};
use chorus_sim::checker::{check_history, CheckerConfig};
use chorus_sim::managed::{managed_sim_config_for, simulate_managed_with};
use chorus_sim::rng::Rng;
use chorus_sim::simulator::{SeedRun, SimConfig};

fn chain_config(me: NodeId, replicas: NodeSet, seed: u64) -> ChainConfig {
    // Every node of a seed must agree on the layout: draw it from the seed alone.
    let mut draw = Rng::new(seed ^ 0x4A4F_494E);
    let mut config = ChainConfig::new(me, replicas);
    config.retransmit_timeout = Time::from_millis(draw.range(3, 30));
    config.window_max = [4, 16, 64][draw.below(3) as usize];
    let log_bytes = [1024, 4096][draw.below(2) as usize];
    let index_slots = [16, 64][draw.below(2) as usize];
    config.layout = ChainLayout::new(log_bytes, index_slots, 4096).expect("valid layout");
    config.copy_chunk_bytes = 512;
    config
}

fn default_timing(me: NodeId, replicas: NodeSet) -> MembershipConfig {
    let mut config = MembershipConfig::new(me, replicas);
    config.rejoin = true;
    config
}

/// A restart keeps the Raft records and, for odd seeds, the crashed node's region (a restart
/// on its data directory; even seeds: a replacement machine with an empty one).
fn run(seed: u64, replicas: usize) -> SeedRun {
    let mut build = move |me: NodeId, all: NodeSet, _node_seed: u64, crashed: Option<&Chain>| {
        let mut config = chain_config(me, all, seed);
        config.joining = crashed.is_some();
        let Some(crashed) = crashed else { return Chain::new(config) };
        let bytes = config.layout.region_bytes();
        let mut region = Region::volatile(TenantId(0), "chain", bytes).expect("region");
        if let (Some(stale), true) = (crashed.region(), seed % 2 == 1) {
            region.write(0, &stale.as_bytes()[..bytes as usize]).expect("same size");
        }
        Chain::with_region(config, region)
    };
    let mut sim = managed_sim_config_for(
        &SimConfig::new(seed, replicas),
        &default_timing(NodeId(0), NodeSet::single(NodeId(0))),
    );
    // Back before the failure is detected (6 missed 50 ms heartbeats).
    sim.restart_after = Some(Time::from_millis(100));
    simulate_managed_with(&sim, &default_timing, None, &mut build)
}

#[test]
fn nodes_restarted_before_their_failure_is_noticed_rejoin_through_a_copy() {
    let (mut failures, mut restarts) = (Vec::new(), 0);
    for seed in 0..100 {
        let run = run(seed, 3);
        let report = check_history(&run.history, &CheckerConfig::default());
        restarts += run.faults.restarts;
        if !report.violations.is_empty()
            || !run.liveness_failures.is_empty()
            || !report.inconclusive_keys.is_empty()
        {
            failures.push(format!(
                "seed {seed}: {:?} {:?}",
                report.violations.first().map(ToString::to_string),
                run.liveness_failures.first()
            ));
        }
    }
    assert!(failures.is_empty(), "{} failing seeds; first: {}", failures.len(), failures[0]);
    assert!(restarts > 30, "too few restarts exercised: {restarts}");
}

#[test]
fn a_joiner_refuses_clients_with_a_clear_reason_until_it_is_linked() {
    use chorus_core::{ClientRequestId, Command, CommandError, Outbox, Outcome, Replica};
    let replicas: NodeSet = (0..3).map(NodeId).collect();
    let mut config = chain_config(NodeId(0), replicas, 1);
    config.joining = true;
    let mut joiner = Chain::new(config);
    let mut out = Outbox::default();
    joiner.on_view(
        Time::from_millis(5),
        chorus_core::View { epoch: chorus_core::Epoch(3), live: replicas },
        &mut out,
    );
    assert!(!joiner.is_caught_up() && !joiner.is_operational());
    assert!(joiner.chain_order().is_empty(), "a joiner lists no linked member");
    let read = Command::Read { key: bytes::Bytes::from_static(b"k") };
    joiner.on_client(Time::from_millis(6), ClientRequestId(1), read, &mut out);
    let Some((_, Outcome::Error(CommandError::Unavailable(reason)))) = out.replies.first() else {
        panic!("{:?}", out.replies)
    };
    assert!(reason.starts_with("joining:"), "{reason}");
    // It announces itself so members that still list it as linked drop it.
    assert!(out.messages.iter().any(|(_, message)| matches!(message, chorus_chain::Message::Joining { .. })));
}
