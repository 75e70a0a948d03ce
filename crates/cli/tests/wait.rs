//! WAIT through the real binary (issue 22, point 7): it counts the replicas known to hold
//! every write the connection made, never more. After a replica is killed, the count falls.

use support::loopback::Cluster;

mod support;

fn set(con: &mut redis::Connection, key: &str, value: &str) {
    let _: () = redis::cmd("SET").arg(key).arg(value).query(con).unwrap();
}

fn wait(con: &mut redis::Connection, replicas: usize, timeout_ms: u64) -> i64 {
    redis::cmd("WAIT").arg(replicas).arg(timeout_ms).query(con).unwrap()
}

#[test]
fn raftlog_wait_counts_the_followers_whose_log_reached_the_write() {
    // One Raft log, so one leader: the replica that knows every follower's match index.
    let mut cluster = Cluster::start(3, &["--protocol", "raftlog", "--raftlog-logs", "1"]);
    let mut leader = None;
    cluster.wait_until("a raftlog leader", 0, |cluster| {
        leader = (0..3).find(|&node| cluster.info_number(node, "raftlog_logs_led") == Some(1));
        leader.is_some()
    });
    let leader = leader.unwrap();
    let follower = (0..3).find(|node| *node != leader).unwrap();
    let mut con = cluster.client(leader);
    set(&mut con, "k", "v1");
    assert_eq!(wait(&mut con, 2, 30_000), 2, "both followers hold the write");
    // A follower knows only itself and the leader.
    let mut at_follower = cluster.client(follower);
    set(&mut at_follower, "f", "1");
    assert_eq!(wait(&mut at_follower, 2, 200), 1);

    cluster.sigkill(follower);
    set(&mut con, "k", "v2");
    assert_eq!(wait(&mut con, 2, 500), 1, "the dead follower does not hold the new write");
    assert_eq!(wait(&mut con, 1, 30_000), 1);
}

#[test]
fn hermes_and_zab_wait_counts_fall_when_a_replica_dies() {
    for protocol in ["hermes", "zab"] {
        let mut cluster = Cluster::start(3, &["--protocol", protocol]);
        // ZAB's leader is the lowest live id: node 0 sees every acknowledgement.
        let mut con = cluster.client(0);
        set(&mut con, "k", "v1");
        assert_eq!(wait(&mut con, 2, 30_000), 2, "{protocol}: every replica holds the write");
        cluster.sigkill(2);
        set(&mut con, "k", "v2");
        assert_eq!(wait(&mut con, 2, 500), 1, "{protocol}: only node 1 holds the new write");
        // A connection that never wrote waits for nothing: every replica in the view.
        let mut fresh = cluster.client(1);
        let count = wait(&mut fresh, 0, 0);
        assert!(count <= 2, "{protocol}: {count}");
    }
}
