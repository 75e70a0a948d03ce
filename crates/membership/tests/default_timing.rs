//! The membership service with the timing a node runs by default (50 ms heartbeats, 600 ms
//! leases) under the simulator's swarm. The main swarms (crates/sim) scale the timing down to
//! the simulator's partitions so that partitions and pauses remove live nodes; here a crashed
//! node usually restarts and asks to join *before* the others noticed it was gone, and
//! partitions rarely outlast the lease: the paths a production cluster takes most.

use chorus_core::{NodeId, NodeSet, Time};
use chorus_hermes::{Hermes, HermesConfig};
use chorus_membership::MembershipConfig;
use chorus_sim::checker::{check_history, CheckerConfig};
use chorus_sim::faults::FaultCounts;
use chorus_sim::managed::{managed_sim_config_for, simulate_managed_with};
use chorus_sim::runner::{coverage_shortfalls, Minimum};
use chorus_sim::simulator::{SeedRun, SimConfig};
use chorus_zab::{ReadMode, Zab, ZabConfig};

fn default_timing(me: NodeId, replicas: NodeSet) -> MembershipConfig {
    let mut config = MembershipConfig::new(me, replicas);
    config.rejoin = true;
    config
}

fn sim_config(seed: u64, replicas: usize) -> SimConfig {
    managed_sim_config_for(
        &SimConfig::new(seed, replicas),
        &default_timing(NodeId(0), NodeSet::single(NodeId(0))),
    )
}

fn hermes(seed: u64, replicas: usize) -> SeedRun {
    let mut build = |me: NodeId, replicas: NodeSet, seed: u64, crashed: Option<&Hermes>| {
        let mut config = HermesConfig::new(me, replicas);
        config.seed = seed;
        config.message_loss_timeout = Time::from_millis(20);
        config.chunk_bytes_target = 64;
        config.recovering = crashed.is_some();
        Hermes::new(config)
    };
    simulate_managed_with(&sim_config(seed, replicas), &default_timing, None, &mut build)
}

/// Failing seeds (violation, stall or a key the checker gave up on) and the sweep's counts.
fn sweep(seeds: u64, mut run: impl FnMut(u64) -> SeedRun) -> (Vec<String>, FaultCounts) {
    let (mut failures, mut counts) = (Vec::new(), FaultCounts::default());
    for seed in 0..seeds {
        let run = run(seed);
        let report = check_history(&run.history, &CheckerConfig::default());
        counts.add(&run.faults);
        if !report.violations.is_empty()
            || !run.liveness_failures.is_empty()
            || !report.inconclusive_keys.is_empty()
        {
            failures.push(format!(
                "seed {seed}: {:?} {:?} {} inconclusive",
                report.violations.first().map(ToString::to_string),
                run.liveness_failures.first(),
                report.inconclusive_keys.len()
            ));
        }
    }
    (failures, counts)
}

#[test]
fn hermes_with_the_default_membership_timing_is_linearizable_and_live() {
    for (replicas, seeds) in [(3, 200), (5, 100)] {
        let (failures, counts) = sweep(seeds, |seed| hermes(seed, replicas));
        assert!(
            failures.is_empty(),
            "{replicas} replicas: {} failing, first {}",
            failures.len(),
            failures[0]
        );
        let minimums = [
            Minimum { counter: "restarts", per_1000_seeds: 300 },
            Minimum { counter: "hermes.recoveries", per_1000_seeds: 200 },
            Minimum { counter: "views_installed", per_1000_seeds: 300 },
        ];
        let shortfalls = coverage_shortfalls(&counts, seeds, &minimums);
        assert!(shortfalls.is_empty(), "{replicas} replicas: {shortfalls:?}");
    }
}

/// Why ZAB replicas removed while alive must ask to come back (`MembershipConfig::rejoin`):
/// ZAB commits with a majority of the configured ensemble whatever the view holds, so once
/// partitions have removed enough members the view can never commit again. With rejoining
/// off (and partition-scale timing, so partitions do remove), seeds stall.
#[test]
fn without_rejoining_removals_leave_zab_below_a_quorum_and_requests_pending() {
    let no_rejoin = |me: NodeId, replicas: NodeSet| {
        let mut config = chorus_sim::managed::swarm_membership_config(me, replicas);
        config.rejoin = false;
        config
    };
    let (failures, _) = sweep(100, |seed| {
        let mut build = |me: NodeId, replicas: NodeSet, _seed: u64, crashed: Option<&Zab>| {
            let mut config = ZabConfig::new(me, replicas);
            config.read_mode = ReadMode::Sync;
            config.recovering = crashed.is_some();
            Zab::new(config)
        };
        let mut sim = chorus_sim::managed::managed_sim_config(&SimConfig::new(seed, 3));
        sim.restart_after = None; // Only removals of live nodes: nobody crashes for good here.
        sim.pauses = false;
        simulate_managed_with(&sim, &no_rejoin, None, &mut build)
    });
    assert!(
        failures.iter().any(|failure| failure.contains("never completed")),
        "no seed stalled without rejoining; the sweep no longer shows the cause: {failures:?}"
    );
}
