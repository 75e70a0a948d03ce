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

fn wait_aof(
    con: &mut redis::Connection,
    local: usize,
    replicas: usize,
    timeout_ms: u64,
) -> redis::RedisResult<Vec<i64>> {
    redis::cmd("WAITAOF").arg(local).arg(replicas).arg(timeout_ms).query(con)
}

/// WAITAOF (issue 24): with `appendfsync always` a replica holds a write only once it is on
/// its disk, so the count is WAIT's; the local file is synced on the spot. Without
/// `appendonly` there is no local file to wait for (Redis' error), and with `everysec` no
/// replica is known to have synced.
#[test]
fn waitaof_counts_the_disks_that_hold_the_writes() {
    let mut cluster =
        Cluster::start(3, &["--protocol", "hermes", "--appendonly", "yes", "--appendfsync", "always"]);
    let mut con = cluster.client(0);
    set(&mut con, "k", "v1");
    assert_eq!(wait_aof(&mut con, 1, 2, 30_000).unwrap(), vec![1, 2]);
    cluster.sigkill(2);
    set(&mut con, "k", "v2");
    assert_eq!(wait_aof(&mut con, 1, 2, 500).unwrap(), vec![1, 1], "the dead replica's disk does not count");
    drop(cluster);

    let cluster =
        Cluster::start(3, &["--protocol", "hermes", "--appendonly", "yes", "--appendfsync", "everysec"]);
    let mut con = cluster.client(0);
    set(&mut con, "k", "v1");
    assert_eq!(
        wait_aof(&mut con, 1, 2, 100).unwrap(),
        vec![1, 0],
        "synced here; replicas sync when they like"
    );
    drop(cluster);

    let cluster = Cluster::start(3, &["--protocol", "hermes", "--appendonly", "no"]);
    let mut con = cluster.client(0);
    set(&mut con, "k", "v1");
    let error = wait_aof(&mut con, 1, 0, 0).unwrap_err();
    assert!(error.to_string().contains("appendonly is disabled"), "{error}");
    assert_eq!(wait_aof(&mut con, 0, 2, 100).unwrap(), vec![0, 0]);
}
