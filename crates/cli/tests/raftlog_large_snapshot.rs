//! raftlog through the real binary (issue 22, point 13): a follower that was down while the
//! others wrote and compacted more state than one peer frame can carry catches up from a
//! snapshot streamed in chunks. `--value-bytes-max 4096` makes the frame limit ~72 KiB; each
//! of the 2 logs then holds ~400 KiB, so a whole-state `MsgSnapshot` would not fit and the
//! transport would drop it, every time. Unless compaction keeps trailing entries: then the
//! follower catches up from the log and no snapshot moves.

mod support;

use std::thread;
use std::time::{Duration, Instant};

use support::loopback::Cluster;

const ARGS: &[&str] = &[
    "--protocol",
    "raftlog",
    "--raftlog-logs",
    "2",
    "--raftlog-snapshot-entries",
    "100",
    "--value-bytes-max",
    "4096",
];
const KEYS: usize = 400;

/// Node 2 is down while node 0 writes `KEYS` large values (the logs compact every 100
/// entries), then restarts and reads them all; returns (snapshots node 2 installed, snapshot
/// chunks the leaders sent) and node 2's log.
fn restart_behind_compaction(trailing_entries: &str) -> (u64, u64, String) {
    let mut args = ARGS.to_vec();
    args.extend(["--raftlog-trailing-entries", trailing_entries]);
    let mut cluster = Cluster::start(3, &args);
    cluster.sigkill(2);
    let value = "x".repeat(2_000);
    let mut con = cluster.client(0);
    for i in 0..KEYS {
        let _: () = redis::cmd("SET").arg(format!("big:{i}")).arg(&value).query(&mut con).unwrap();
    }
    cluster.restart(2, &[]);
    cluster.wait_ready(2, 2);
    // Reads at node 2 wait until it has applied up to the leader's commit index.
    let started = Instant::now();
    let mut con = cluster.client(2);
    for i in (0..KEYS).rev() {
        loop {
            let got: redis::RedisResult<Option<String>> =
                redis::cmd("GET").arg(format!("big:{i}")).query(&mut con);
            match got {
                Ok(Some(got)) if got == value => break,
                other => {
                    assert!(started.elapsed() < Duration::from_secs(60), "big:{i} at node 2: {other:?}");
                    thread::sleep(Duration::from_millis(50));
                }
            }
        }
    }
    let installed = cluster.info_number(2, "raftlog_snapshots_installed").unwrap_or(0);
    let chunks: u64 =
        (0..2).filter_map(|node| cluster.info_number(node, "raftlog_snapshot_chunks_sent")).sum();
    eprintln!("node 2 installed {installed} snapshots; the leaders sent {chunks} chunks");
    (installed, chunks, cluster.log(2))
}

#[test]
fn a_restarted_follower_catches_up_from_a_snapshot_larger_than_a_frame() {
    // No trailing entries: the follower must come back through the snapshot.
    let (installed, chunks, log) = restart_behind_compaction("0");
    assert!(installed >= 1, "node 2 caught up without a snapshot:\n{log}");
    assert!(chunks >= 2, "the snapshot did not go in chunks");
}

/// Issue 18 point 5: with the default trailing entries (1,000 per log, at most 4 MiB), the
/// same follower, ~200 entries behind per log, catches up from the log: no snapshot moves.
#[test]
fn a_briefly_lagging_follower_catches_up_from_trailing_entries() {
    let (installed, chunks, log) = restart_behind_compaction("1000");
    assert_eq!((installed, chunks), (0, 0), "a snapshot moved:\n{log}");
}
