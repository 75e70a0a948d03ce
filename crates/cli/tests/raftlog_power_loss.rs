//! Power losses of a whole raftlog cluster through the real binary (issue 16 point 4): every
//! node runs with `--raftlog-storage crash-test`, which keeps each write in the process's
//! memory until it is synced (fdatasync, or the circular log's flush that stands in for
//! msync), so a SIGKILL loses exactly what a power cut would: everything not synced. Killing
//! real files' processes cannot show that (the page cache survives the process), which is why
//! `raftlog_restart.rs` alone would pass with every sync removed; this test would not.
//!
//! While clients run, the whole cluster is killed at once twice and restarted from what the
//! nodes synced. The history must be linearizable (an acknowledged write that was lost shows
//! up as a read of an older value) and every counter must still hold at least the largest
//! value an acknowledged INCR returned.

mod support;

use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

use support::loopback::Cluster;
use support::workload;

/// Small logs and frequent checkpoints, so syncs of the circular log, drains into the log
/// file and checkpoints all happen between the power losses.
const ARGS: &[&str] = &[
    "--protocol",
    "raftlog",
    "--raftlog-logs",
    "2",
    "--raftlog-snapshot-entries",
    "1000",
    "--raftlog-storage",
    "crash-test",
];

fn power_loss(cluster: &mut Cluster) {
    cluster.power_loss();
}

/// Poll the nodes until, since their last start, they drained the circular log into the log
/// file and took a checkpoint; fail if that takes longer than a generous deadline, because
/// without both the test would not cover the log file's fdatasync or the snapshot's.
fn wait_for_drains_and_checkpoints(cluster: &Cluster) -> (u64, u64) {
    let started = Instant::now();
    loop {
        let sum = |field| (0..3).filter_map(|node| cluster.info_number(node, field)).sum::<u64>();
        let (drains, checkpoints) = (sum("raftlog_disk_drains"), sum("raftlog_disk_checkpoints"));
        if drains > 0 && checkpoints > 0 {
            return (drains, checkpoints);
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "since the last power loss: {drains} drains, {checkpoints} checkpoints after 60 s of load"
        );
        thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_raftlog_cluster_loses_no_acknowledged_write_when_every_unsynced_write_is_lost() {
    loses_nothing_acknowledged(&[]);
}

/// The same with every sync on the sync thread (`raftlog_sync = "thread"`): the loop goes on
/// while a sync runs, its messages that wait for a sync are held until the thread reports
/// it, and the leaders count their own entries only then (raft-rs's asynchronous
/// persistence). A message let go before its sync returned, or a leader counting an unsynced
/// copy, loses acknowledged writes here.
#[test]
fn a_raftlog_cluster_syncing_off_its_event_loops_loses_no_acknowledged_write_either() {
    loses_nothing_acknowledged(&["--raftlog-sync", "thread"]);
}

fn loses_nothing_acknowledged(extra: &[&str]) {
    let args: Vec<&str> = ARGS.iter().chain(extra).copied().collect();
    let mut cluster = Cluster::start(3, &args);
    for node in 0..3 {
        cluster.wait_ready(node, 2);
    }
    let (stop, clients) = workload::spawn_until_stopped(cluster.client_targets());
    for _ in 0..2 {
        thread::sleep(Duration::from_millis(700));
        power_loss(&mut cluster);
    }
    // Clients run on until every level of the log has been synced since the last power loss
    // (a drain into the log file and a checkpoint), however fast or slow this machine is.
    let (drains, checkpoints) = wait_for_drains_and_checkpoints(&cluster);
    stop.store(true, Ordering::Relaxed);
    let history = clients.join().unwrap();

    let promised = workload::check_across_crashes(&history, 500);

    eprintln!("since the last power loss: {drains} drains, {checkpoints} checkpoints");

    // And after a last power loss with no client running, nothing acknowledged is missing.
    power_loss(&mut cluster);
    cluster.assert_counters_kept(&promised, "power losses");
    if extra.contains(&"thread") {
        let on_thread =
            (0..3).filter_map(|node| cluster.info_number(node, "raftlog_syncs_on_thread")).sum::<u64>();
        assert!(on_thread > 0, "no sync ran on the sync thread since the last start");
    }
    assert_eq!(cluster.info_number(0, "raftlog_boot"), Some(4), "every node started four times");
}
