//! raftlog's logs split over shards (issue 18 point 1, Cyclone §3.2: a Raft core per group of
//! logs) through the real binary: each shard runs its own event loop on its own thread, keys
//! are routed to their shard, the shards share the peer links, and a node killed and
//! restarted recovers every shard. A MULTI/EXEC across shards is refused with a clear error,
//! and a data directory written with another shard count is refused at start.

mod support;

use support::loopback::{key_on_loop, Cluster};

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

#[test]
fn sharded_raftlog_serves_linearizably_survives_a_kill_and_refuses_cross_shard_transactions() {
    let mut cluster = Cluster::start(3, ARGS);
    for node in 0..3 {
        let names = cluster.thread_names(node);
        assert!(
            names.contains("chorus-shard-0") && names.contains("chorus-shard-1"),
            "one event-loop thread per shard: {names:?}"
        );
    }
    cluster.assert_linearizable_across_a_kill(1);

    // Both shards serve: INFO sums them, and each led some of the cluster's logs.
    assert_eq!(cluster.info_number(0, "raftlog_shards"), Some(2));
    let led: u64 = (0..3).filter_map(|node| cluster.info_number(node, "raftlog_logs_led")).sum();
    assert_eq!(led, 4, "every one of the 4 logs (2 per shard) has one leader");

    // A transaction on one shard runs; one whose keys span both is refused, and runs nowhere.
    let mut con = cluster.client(0);
    let (a, b) = (key_on_loop(0, 2, "a"), key_on_loop(0, 2, "b"));
    let other = key_on_loop(1, 2, "c");
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
