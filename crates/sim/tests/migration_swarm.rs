//! The migration swarm (issue 20 point 4; docs/decisions.md, decision 16): two or three
//! replica groups of one protocol behind one slot map, slots with keys moving between groups
//! while clients run, racing crashes, restarts, partitions, pauses and message loss. Every
//! client history is checked per key across groups. Two broken migrations must be caught as
//! linearizability violations, or a green swarm would mean less than it says.

use chorus_sim::runner::{assert_swarm_passes, first_violation, Minimum};
use chorus_sim::shards::{setup, setup_with, ShardBug};

/// What every migration swarm must have exercised, per 1,000 seeds: moves that finished
/// with keys in them, clients sent on with -ASK and held with -TRYAGAIN, racing movers,
/// moves called off, and the main swarm's faults.
const MIGRATION_MINIMUMS: &[Minimum] = &[
    Minimum { counter: "shards.moves_finished", per_1000_seeds: 1_000 },
    Minimum { counter: "shards.keys_moved", per_1000_seeds: 1_000 },
    Minimum { counter: "shards.asks", per_1000_seeds: 1_000 },
    Minimum { counter: "shards.try_agains", per_1000_seeds: 1_000 },
    Minimum { counter: "shards.moved", per_1000_seeds: 10_000 },
    Minimum { counter: "crashes", per_1000_seeds: 500 },
    Minimum { counter: "restarts", per_1000_seeds: 300 },
    Minimum { counter: "partitions", per_1000_seeds: 300 },
    Minimum { counter: "pauses", per_1000_seeds: 300 },
];

fn seeds() -> u64 {
    std::env::var("CHORUS_MIGRATION_SEEDS").ok().and_then(|seeds| seeds.parse().ok()).unwrap_or(40)
}

#[test]
fn hermes_groups_move_slots_with_keys_under_faults() {
    let summary = assert_swarm_passes(&setup("hermes").unwrap(), 3, seeds(), MIGRATION_MINIMUMS);
    eprintln!("{:?}", summary.faults);
}

#[test]
fn craq_groups_move_slots_with_keys_under_faults() {
    assert_swarm_passes(&setup("craq").unwrap(), 3, seeds(), MIGRATION_MINIMUMS);
}

#[test]
fn zab_groups_move_slots_with_keys_under_faults() {
    assert_swarm_passes(&setup("zab").unwrap(), 3, seeds(), MIGRATION_MINIMUMS);
}

fn assert_caught(bug: ShardBug, seeds_max: u64) {
    let catch = first_violation(&setup_with("hermes", Some(bug)).unwrap(), 3, seeds_max, 2);
    eprintln!("{bug:?}: first violation at seed {:?} of {}", catch.violation_seed, catch.seeds_run);
    assert!(
        catch.violation_seed.is_some(),
        "{bug:?} survived {seeds_max} seeds (panics {:?}, stalls {:?})",
        catch.panicked_seeds.first(),
        catch.liveness_only_seeds.first()
    );
}

#[test]
fn copying_before_every_node_drained_is_caught() {
    assert_caught(ShardBug::CopyBeforeDrained, 200);
}

#[test]
fn deleting_a_moved_key_instead_of_leaving_a_tombstone_is_caught() {
    assert_caught(ShardBug::DeleteInsteadOfTombstone, 400);
}

/// `CHORUS_TRACE_SEED=<seed> CHORUS_TRACE_PROTOCOL=hermes cargo test -p chorus-sim --test
/// migration_swarm trace_one_seed -- --ignored`: one seed's trace, to diagnose a failure.
#[test]
#[ignore]
fn trace_one_seed() {
    let seed: u64 = std::env::var("CHORUS_TRACE_SEED").expect("CHORUS_TRACE_SEED").parse().unwrap();
    let protocol = std::env::var("CHORUS_TRACE_PROTOCOL").unwrap_or_else(|_| "hermes".into());
    let mut config = chorus_sim::simulator::SimConfig::new(seed, 3);
    config.trace = true;
    let verdict = chorus_sim::runner::check_seed(&setup(&protocol).unwrap(), &config);
    for line in &verdict.run.trace {
        println!("{line}");
    }
    println!("{}", chorus_sim::runner::describe_failure(&verdict));
}
