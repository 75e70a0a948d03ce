//! Replacing a raftlog node through the real binary (docs/protocols/raftlog.md, "Replacing a
//! node"): under a client workload a node is SIGKILLed and its data directory wiped. Started
//! again as the member it was, its peers refuse it (it forgot its votes and the entries it
//! acknowledged) and it stops, naming `--join`. Started with `--join` on an empty directory it
//! becomes a new Raft member of every log in its predecessor's place, catches up from a
//! snapshot, and counts for quorums: with another node killed afterwards the cluster still
//! commits through it. No acknowledged write is lost and the history is linearizable.

mod support;

use std::thread;
use std::time::{Duration, Instant};

use support::loopback::{background_clients, Cluster};
use support::workload;

/// Frequent compactions keeping no trailing entries: the replacement must catch up by snapshot.
const ARGS: &[&str] = &[
    "--protocol",
    "raftlog",
    "--raftlog-logs",
    "4",
    "--raftlog-snapshot-entries",
    "100",
    "--raftlog-trailing-entries",
    "0",
];

#[test]
fn a_wiped_raftlog_node_is_refused_as_itself_and_replaced_with_join() {
    let mut cluster = Cluster::start(3, ARGS);
    let clients = background_clients(&cluster, 250, Duration::from_secs(3), Duration::from_millis(4));
    thread::sleep(Duration::from_millis(600));
    let data_dir = cluster.dir.join("node-2");
    cluster.sigkill(2);
    std::fs::remove_dir_all(&data_dir).unwrap();

    // As the member it was, without its data: refused, and it says what to do.
    cluster.restart(2, &[]);
    let status = wait_for_exit(&mut cluster, 2, Duration::from_secs(30));
    assert!(!status.success(), "a node without its data must not keep running as itself");
    let log = cluster.log(2);
    assert!(log.contains("refused by node") && log.contains("--join"), "{log}");

    // As a replacement: a new member of every log, caught up from a snapshot.
    std::fs::remove_dir_all(&data_dir).unwrap();
    cluster.restart(2, &["--join", "0"]);
    cluster.wait_ready(2, 2);
    cluster.wait_until("the replacement is a voter of every log", 2, |cluster| {
        cluster.info_number(2, "raftlog_voter_everywhere") == Some(1)
    });
    let history = clients.join().unwrap();
    let promised = workload::check_across_crashes(&history, 600);
    assert!(cluster.info_number(2, "raftlog_incarnation").unwrap() > 0);
    assert!(cluster.info_number(2, "raftlog_snapshots_installed").unwrap() > 0, "{}", cluster.log(2));
    let refusals: u64 = (0..2).map(|node| cluster.info_number(node, "raftlog_peers_refused").unwrap()).sum();
    assert!(refusals > 0, "the peers counted the refusal");
    cluster.assert_counters_kept(&promised, "the replacement caught up");

    // The replacement counts for quorums: node 0 down, nodes 1 and 2 commit in every log.
    cluster.sigkill(0);
    for i in 0..8 {
        let key = format!("after-{i}");
        let _: () = redis::cmd("SET").arg(&key).arg(i).query(&mut cluster.client(1 + i % 2)).unwrap();
        let value: i64 = redis::cmd("GET").arg(&key).query(&mut cluster.client(2 - i % 2)).unwrap();
        assert_eq!(value, i as i64);
    }
}

fn wait_for_exit(cluster: &mut Cluster, node: usize, deadline: Duration) -> std::process::ExitStatus {
    let started = Instant::now();
    loop {
        let child = cluster.nodes[node].child.as_mut().expect("running");
        if let Some(status) = child.try_wait().unwrap() {
            cluster.nodes[node].child = None;
            return status;
        }
        assert!(started.elapsed() < deadline, "node {node} kept running:\n{}", cluster.log(node));
        thread::sleep(Duration::from_millis(50));
    }
}
