//! raftlog durability through the real binary (issue 8 point 2, Cyclone §2's two-level log):
//! nodes are SIGKILLed under a client workload and restarted under their old ids from their
//! data directories; at the end the whole cluster is killed at once and restarted, so only
//! what was on disk survives. The history must be linearizable (a lost acknowledged write
//! shows up as a read of an older value), and every counter must still hold at least the
//! largest value an acknowledged INCR returned.

mod support;

use std::thread;
use std::time::Duration;

use support::loopback::{background_clients, Cluster};
use support::workload;

/// Small logs and frequent checkpoints, so the run drains the circular log into the log
/// file and truncates both behind checkpoints many times.
const ARGS: &[&str] = &["--protocol", "raftlog", "--raftlog-logs", "4", "--raftlog-snapshot-entries", "300"];

#[test]
fn killed_raftlog_nodes_rejoin_under_their_ids_and_lose_no_acknowledged_write() {
    let mut cluster = Cluster::start(3, ARGS);
    let clients = background_clients(&cluster, 250, Duration::from_secs(3), Duration::from_millis(4));
    // Kill and restart every node once, the others serving meanwhile.
    for victim in [1, 0, 2] {
        thread::sleep(Duration::from_millis(400));
        cluster.sigkill(victim);
        thread::sleep(Duration::from_millis(150));
        cluster.restart(victim, &[]);
        cluster.wait_ready(victim, 2);
    }
    let history = clients.join().unwrap();

    let promised = workload::check_across_crashes(&history, 600);

    // The run went through checkpoints (which truncate both log levels) before the crash.
    let checkpoints: u64 = (0..3)
        .map(|node| {
            let info: String = redis::cmd("INFO").query(&mut cluster.client(node)).unwrap();
            info_counter(&info, "disk_checkpoints")
        })
        .sum();
    eprintln!("checkpoints since the nodes' last starts: {checkpoints}");
    assert!(checkpoints > 0, "no checkpoint was taken: the test would not cover snapshot replay");

    // Now every node at once: only the two-level logs and checkpoints remain.
    cluster.power_loss();
    cluster.assert_counters_kept(&promised, "a full restart");
    // The restarted nodes serve new writes too.
    let mut con = cluster.client(2);
    let _: () = redis::cmd("SET").arg("after").arg("restart").query(&mut con).unwrap();
    let value: String = redis::cmd("GET").arg("after").query(&mut cluster.client(0)).unwrap();
    assert_eq!(value, "restart");
    let counter = info_counter;
    for node in 0..3 {
        let info: String = redis::cmd("INFO").query(&mut cluster.client(node)).unwrap();
        assert_eq!(counter(&info, "boot"), 3, "node {node} incarnation:\n{info}");
        eprintln!(
            "node {node} since its last start: {} records, {} drains, {} checkpoints, {} snapshots installed",
            counter(&info, "disk_records_appended"),
            counter(&info, "disk_drains"),
            counter(&info, "disk_checkpoints"),
            counter(&info, "snapshots_installed"),
        );
    }
}

fn info_counter(info: &str, name: &str) -> u64 {
    let line = info.lines().find(|line| line.starts_with(&format!("raftlog_{name}:"))).unwrap_or_default();
    line.split(':').nth(1).and_then(|value| value.trim().parse().ok()).unwrap_or(0)
}
