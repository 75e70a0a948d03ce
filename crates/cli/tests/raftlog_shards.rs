//! raftlog's logs split over shards (issue 18 point 1, Cyclone §3.2: a Raft core per group of
//! logs) through the real binary: each shard runs its own event loop on its own thread, keys
//! are routed to their shard, the shards share the peer links, and a node killed and
//! restarted recovers every shard. A MULTI/EXEC across shards is refused with a clear error,
//! and a data directory written with another shard count is refused at start.

mod support;

use std::collections::BTreeSet;
use std::thread;
use std::time::Duration;

use chorus_sim::checker::{check_history, CheckerConfig};
use support::loopback::Cluster;
use support::workload::{self, Workload};

const ARGS: &[&str] = &[
    "--protocol",
    "raftlog",
    "--raftlog-logs",
    "4",
    "--raftlog-shards",
    "2",
    "--raftlog-snapshot-entries",
    "300",
];

/// The names of node `i`'s threads.
fn thread_names(cluster: &Cluster, i: usize) -> BTreeSet<String> {
    let pid = cluster.nodes[i].child.as_ref().expect("running").id();
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("linux /proc");
    tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .map(|name| name.trim().to_string())
        .collect()
}

/// Keys `prefix0`, `prefix1`, ... until one lands on each of the two shards.
fn key_on_shard(shard: usize, prefix: &str) -> String {
    (0..)
        .map(|index| format!("{prefix}{index}"))
        .find(|key| chorus_raftlog::shard_of(key.as_bytes(), 2) == shard)
        .expect("some key is on every shard")
}

#[test]
fn sharded_raftlog_serves_linearizably_survives_a_kill_and_refuses_cross_shard_transactions() {
    let mut cluster = Cluster::start(3, ARGS);
    for node in 0..3 {
        let names = thread_names(&cluster, node);
        assert!(
            names.contains("chorus-shard-0") && names.contains("chorus-shard-1"),
            "one event-loop thread per shard: {names:?}"
        );
    }

    let targets: Vec<String> = cluster.nodes.iter().map(|node| node.client.to_string()).collect();
    let clients = thread::spawn(move || {
        workload::run(Workload {
            targets,
            clients: 6,
            ops_per_client: 200,
            reply_timeout: Duration::from_secs(3),
            think: Duration::from_millis(3),
        })
    });
    thread::sleep(Duration::from_millis(400));
    cluster.sigkill(1);
    thread::sleep(Duration::from_millis(150));
    cluster.restart(1, &[]);
    cluster.wait_ready(1, 2);
    let history = clients.join().unwrap();
    let report = check_history(&history, &CheckerConfig::default());
    assert!(report.violations.is_empty(), "not linearizable: {:?}", report.violations);
    let completed = history.operations.iter().filter(|op| op.completion.is_some()).count();
    assert!(completed > history.operations.len() / 2, "too few completed: {completed}");

    // Both shards serve: INFO sums them, and each led some of the cluster's logs.
    assert_eq!(cluster.info_number(0, "raftlog_shards"), Some(2));
    let led: u64 = (0..3).filter_map(|node| cluster.info_number(node, "raftlog_logs_led")).sum();
    assert_eq!(led, 4, "every one of the 4 logs (2 per shard) has one leader");

    // A transaction on one shard runs; one whose keys span both is refused, and runs nowhere.
    let mut con = cluster.client(0);
    let (a, b) = (key_on_shard(0, "a"), key_on_shard(0, "b"));
    let other = key_on_shard(1, "c");
    let (x, y): (i64, i64) = redis::pipe().atomic().incr(&a, 1).incr(&b, 2).query(&mut con).unwrap();
    assert_eq!((x, y), (1, 2));
    let refused = redis::pipe().atomic().incr(&a, 1).incr(&other, 1).query::<(i64, i64)>(&mut con);
    let error = refused.expect_err("a transaction across shards is refused");
    assert!(error.to_string().contains("different raftlog shards"), "{error}");
    let (x, z): (i64, Option<i64>) = redis::pipe().get(&a).get(&other).query(&mut con).unwrap();
    assert_eq!((x, z), (1, None), "the refused transaction changed nothing");

    // The shard count is part of the data directory's layout.
    cluster.sigkill(2);
    let args = &mut cluster.nodes[2].args;
    let at = args.iter().position(|arg| arg == "--raftlog-shards").unwrap();
    args[at + 1] = "1".into();
    cluster.restart(2, &[]);
    let status = cluster.nodes[2].child.as_mut().unwrap().wait().unwrap();
    assert!(!status.success());
    let log = cluster.log(2);
    assert!(log.contains("was written with raftlog_shards = 2"), "{log}");
}
