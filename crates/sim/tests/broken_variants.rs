//! The checker bites: each deliberately broken Hermes variant is caught by the simulator
//! within a bounded number of seeds. If one of these tests fails, the simulator or the checker
//! has gone blind to a class of bugs, and the green swarm tests mean less than they claim.

use std::sync::Arc;

use chorus_hermes::Bug;
use chorus_sim::runner::{sweep, ProtocolSetup};

/// Returns the first failing seed found in `0..seeds_max`, if any.
fn first_failing_seed(bug: Bug, replicas: usize, seeds_max: u64) -> Option<u64> {
    let setup = ProtocolSetup::Hermes { tweak: Some(Arc::new(move |config| config.bug = Some(bug))) };
    let seeds: Vec<u64> = (0..seeds_max).collect();
    let summary = sweep(&setup, replicas, &seeds, 2, &|verdict| verdict.passed());
    summary.failing_seeds.first().copied()
}

fn assert_caught(bug: Bug, seeds_max: u64) {
    for replicas in [3, 5] {
        let found = first_failing_seed(bug, replicas, seeds_max);
        assert!(found.is_some(), "{bug:?} at {replicas} replicas survived {seeds_max} seeds");
        eprintln!("{bug:?} at {replicas} replicas: caught, first failing seed {found:?}");
    }
}

#[test]
fn reads_served_in_any_state_are_caught() {
    assert_caught(Bug::ReadInAnyState, 200);
}

#[test]
fn val_applied_whatever_its_timestamp_is_caught() {
    assert_caught(Bug::ValIgnoresTimestamp, 500);
}

#[test]
fn rmws_that_never_abort_are_caught() {
    assert_caught(Bug::RmwNeverAborts, 200);
}

#[test]
fn committing_on_a_majority_of_acks_is_caught() {
    assert_caught(Bug::CommitOnMajority, 500);
}

// `Bug::KeepAcksOnViewChange` is not here: 60,000 seeds at 3 and 5 replicas (with
// mid-broadcast crashes) did not produce a visible violation. The anomaly needs two
// concurrent RMWs, the higher one's coordinator dying mid-broadcast so that exactly the
// lower one's coordinator misses it, and later reads on both sides of the view change. The
// scripted scenario `keep_acks_on_view_change_commits_without_acks_of_new_epoch` in
// crates/protocols/hermes/tests/scenarios.rs shows the variant commits without the new
// epoch's ACKs. Making the swarm find it is an open task (docs/testing.md).

#[test]
fn validating_superseded_timestamps_is_caught() {
    // Hermes with O1 off: the RMW anomaly Chorus found (docs/protocols/hermes.md).
    assert_caught(Bug::ValidateSuperseded, 30_000);
}
