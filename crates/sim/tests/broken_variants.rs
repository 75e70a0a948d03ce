//! The checker bites: every deliberately broken variant of Hermes, CRAQ, ZAB, raftlog and the
//! membership service yields a linearizability violation within its bound of seeds at 3
//! replicas, in the same swarm `chorus sim --broken VARIANT` runs. A panic, a debug assertion
//! or a stall does not count: a seed that only panics or stalls is reported and skipped. If
//! one of these tests fails, the simulator or the checker has gone blind to a class of bugs,
//! and the green swarm tests mean less than they claim.

use chorus_sim::broken::{find, variants};
use chorus_sim::runner::first_violation;

fn assert_caught(protocol: &str, name: &str) {
    let all = variants();
    let variant = find(&all, protocol, name).unwrap_or_else(|| panic!("no variant {protocol} {name}"));
    let catch = first_violation(&variant.setup, 3, variant.seeds_max, 2);
    eprintln!(
        "{protocol} {name}: first violation at seed {:?} ({} seeds run; {} panicked, {} stalled without a violation)",
        catch.violation_seed,
        catch.seeds_run,
        catch.panicked_seeds.len(),
        catch.liveness_only_seeds.len()
    );
    assert!(
        catch.violation_seed.is_some(),
        "{protocol} {name} survived {} seeds without a linearizability violation (panics: {:?}, stalls: {:?})",
        variant.seeds_max,
        catch.panicked_seeds.first(),
        catch.liveness_only_seeds.first(),
    );
}

macro_rules! caught {
    ($($test:ident: $protocol:literal $name:literal,)*) => {
        $(
            #[test]
            fn $test() {
                assert_caught($protocol, $name);
            }
        )*

        /// Every variant the registry lists has its test above, or is caught by its named
        /// invariant in the test listed in [`CAUGHT_BY_AN_INVARIANT`].
        #[test]
        fn every_broken_variant_has_a_test() {
            let tested = [$(($protocol, $name)),*];
            for variant in variants() {
                let elsewhere = CAUGHT_BY_AN_INVARIANT
                    .iter()
                    .any(|(protocol, name, _)| (*protocol, *name) == (variant.protocol, variant.name.as_str()));
                assert!(
                    elsewhere || tested.contains(&(variant.protocol, variant.name.as_str())),
                    "{} {} has no test in broken_variants.rs",
                    variant.protocol,
                    variant.name
                );
            }
        }
    };
}

/// Variants the swarm's workload cannot express, each caught by its named invariant (an
/// error the test checks for, not a panic) in another test: transactions are not in the
/// simulator's workload, so taking no locks, running a late copy of a forgotten transaction
/// step, or running a ganged operation without its rendezvous, is caught by the bank (every
/// audit and every replica's copy must total the same).
const CAUGHT_BY_AN_INVARIANT: &[(&str, &str, &str)] = &[
    (
        "raftlog",
        "no-txn-locks",
        "crates/protocols/raftlog/tests/bank.rs: transactions_without_locks_are_caught_by_the_bank",
    ),
    (
        "raftlog",
        "runs-forgotten-steps",
        "crates/protocols/raftlog/tests/bank.rs: steps_run_after_their_transaction_was_forgotten_are_caught_by_the_bank",
    ),
    (
        "raftlog",
        "gang-no-rendezvous",
        "crates/protocols/raftlog/tests/bank.rs: gangs_without_the_rendezvous_are_caught_by_the_bank",
    ),
];

caught! {
    hermes_reads_in_any_state: "hermes" "read-in-any-state",
    hermes_val_ignoring_timestamps: "hermes" "val-ignores-timestamp",
    // The 2024 bug in Hermes' TLA+ specification: ACKs from before a view change survive it.
    hermes_keeping_acks_across_a_view_change: "hermes" "keep-acks-on-view-change",
    hermes_rmws_that_never_abort: "hermes" "rmw-never-aborts",
    hermes_committing_on_a_majority: "hermes" "commit-on-majority",
    hermes_validating_superseded_updates: "hermes" "validate-superseded",
    hermes_chunks_overwriting_newer_values: "hermes" "chunk-overwrites-newer",
    hermes_shadows_serving_early: "hermes" "shadow-serves",
    hermes_reading_without_a_lease: "hermes" "ignore-lease",
    membership_leases_without_a_drift_margin: "hermes" "lease-without-drift-margin",
    craq_dirty_local_reads: "craq" "read-dirty-locally",
    craq_acknowledging_at_the_head: "craq" "ack-at-head",
    craq_reading_without_a_lease: "craq" "ignore-lease",
    craq_joiners_serving_early: "craq" "joiner-serves",
    craq_rejoining_without_a_copy: "craq" "rejoin-without-copy",
    zab_committing_without_a_quorum: "zab" "commit-without-quorum",
    zab_leader_reading_uncommitted_state: "zab" "leader-reads-uncommitted",
    zab_reading_without_a_lease: "zab" "ignore-lease",
    zab_joiners_serving_early: "zab" "joiner-serves-early",
    raftlog_reads_without_read_index: "raftlog" "local-reads",
    raftlog_without_sessions: "raftlog" "no-sessions",
    // Acknowledges before syncing: caught after a power loss of every node.
    raftlog_acknowledging_before_syncing: "raftlog" "ack-before-sync",
    // Decoupled execution keeping the writes of an entry a new leader replaced.
    raftlog_keeping_rolled_back_executions: "raftlog" "keep-rolled-back",
    // A leader counting its own copy of an entry before its sync thread's sync returned.
    raftlog_counting_an_unsynced_copy: "raftlog" "counts-unsynced-copy",
    // The server's persistence: ACKs and replies before the append-only file is synced,
    // caught in the swarm that restarts nodes from their files.
    hermes_acknowledging_before_syncing: "hermes" "ack-before-sync",
    // The server's: a replica expiring keys by its own clock, caught under drifting clocks.
    hermes_expiring_by_the_local_clock: "hermes" "expiry-by-local-clock",
    craq_expiring_by_the_local_clock: "craq" "expiry-by-local-clock",
    zab_expiring_by_the_local_clock: "zab" "expiry-by-local-clock",
    raftlog_expiring_by_the_local_clock: "raftlog" "expiry-by-local-clock",
}
