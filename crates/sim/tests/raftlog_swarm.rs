//! raftlog under the disk swarm (`chorus sim --protocol raftlog`): each node keeps its
//! two-level log and checkpoints on its own simulated disk; crashes (some between a turn's
//! writes and their sync), power losses of every node, restarts from what the disk kept
//! (unsynced writes lost or torn), corrupted sectors that checksums must catch, drifting
//! clocks and pauses, over network faults; on some seeds one restart finds an empty disk and
//! comes back as a replacement (a new Raft member of every log, caught up by snapshot).
//! Every history must be linearizable and live, and
//! every kind of storage fault must have happened often enough for that to mean something.
//! (crates/protocols/raftlog/tests/swarm.rs runs the in-memory core under the plain swarm.)

use chorus_sim::runner::{assert_swarm_passes, Minimum, ProtocolSetup};

const SEEDS: u64 = 1_000;

/// Per 1,000 seeds; about half of what the sweep counted when the floors were set.
const RAFTLOG_DISK_MINIMUMS: &[Minimum] = &[
    Minimum { counter: "messages_lost", per_1000_seeds: 1_000 },
    Minimum { counter: "partitions", per_1000_seeds: 500 },
    Minimum { counter: "crashes", per_1000_seeds: 500 },
    Minimum { counter: "crashes_mid_broadcast", per_1000_seeds: 50 },
    Minimum { counter: "crashes_before_sync", per_1000_seeds: 8 },
    // A leader's appends leave before its own sync (`Replica::leaves_before_sync`): turns
    // that sent some, and crashes between such sends and the sync (29.5 per 1,000 seeds
    // when the floor was set).
    Minimum { counter: "turns_sending_before_sync", per_1000_seeds: 100_000 },
    Minimum { counter: "crashes_before_sync_after_sends", per_1000_seeds: 12 },
    Minimum { counter: "power_losses", per_1000_seeds: 120 },
    // Half the seeds sync on a thread (`SimConfig::sync_latency`): syncs that returned,
    // calls whose messages waited for one, crashes while one ran, and power losses right
    // after updates were answered while their node's sync ran (104,000, 140,000, 485 and
    // 315 per 1,000 seeds when the floors were set).
    Minimum { counter: "syncs_on_thread", per_1000_seeds: 50_000 },
    Minimum { counter: "calls_waiting_for_a_sync", per_1000_seeds: 70_000 },
    Minimum { counter: "crashes_with_sync_running", per_1000_seeds: 200 },
    Minimum { counter: "power_losses_after_replies_before_a_sync", per_1000_seeds: 150 },
    Minimum { counter: "restarts", per_1000_seeds: 500 },
    // Three seeds in four run turns of several calls, as the server's event loop does, most
    // of them flushing the logs once a turn (293,526 per 1,000 seeds when the floor was set).
    Minimum { counter: "turns_of_several_calls", per_1000_seeds: 150_000 },
    // Rare by nature (a crash must strike a turn between its writes and their sync, and then
    // lose rather than keep or tear them): 3 per 1,000 seeds since commit notices changed the
    // turns' timing (with 4 torn and 13 crashes before sync), about 8 before.
    Minimum { counter: "storage_writes_lost", per_1000_seeds: 2 },
    Minimum { counter: "storage_writes_torn", per_1000_seeds: 1 },
    Minimum { counter: "storage_sectors_corrupted", per_1000_seeds: 60 },
    Minimum { counter: "storage_corruption_detected", per_1000_seeds: 40 },
    Minimum { counter: "clocks_drifting", per_1000_seeds: 500 },
    Minimum { counter: "pauses", per_1000_seeds: 400 },
    Minimum { counter: "expiry.reads_found_expired", per_1000_seeds: 1_000 },
    Minimum { counter: "ops_overlapping", per_1000_seeds: 50_000 },
    Minimum { counter: "updates_interrupted", per_1000_seeds: 300 },
    Minimum { counter: "raftlog.disk_drains", per_1000_seeds: 2_500 },
    Minimum { counter: "raftlog.disk_checkpoints", per_1000_seeds: 5_000 },
    Minimum { counter: "raftlog.snapshots_installed", per_1000_seeds: 400 },
    // Decoupled execution (the default): entries executed on arrival and lost to a leader
    // change are rolled back (147 per 1,000 seeds when the floor was set).
    Minimum { counter: "raftlog.executions_rolled_back", per_1000_seeds: 70 },
    // Replacements (an empty disk joining as a new member): configuration changes applied,
    // entering and leaving the joint configuration, in every log at every replica (1,775).
    Minimum { counter: "raftlog.conf_changes_applied", per_1000_seeds: 800 },
];

#[test]
fn raftlog_on_simulated_disks_loses_no_acknowledged_write_under_crashes_power_losses_and_corruption() {
    let summary = assert_swarm_passes(&ProtocolSetup::raftlog(), 3, SEEDS, RAFTLOG_DISK_MINIMUMS);
    eprintln!("{:?}", summary.faults);
}
