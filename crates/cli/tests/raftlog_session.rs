//! At-most-once client sessions over RESP (Cyclone §3.4): `SESSION client seq command...`
//! runs a single-key command once per (client, seq), whichever replica the client retries
//! at, across a restart of the whole cluster; an older sequence number is refused. Real
//! `chorus node` processes on loopback; no timing assertions.

use std::thread;
use std::time::{Duration, Instant};

use support::loopback::Cluster;

mod support;

const ARGS: &[&str] = &["--protocol", "raftlog", "--raftlog-logs", "2"];

/// `SESSION 7 seq INCR counter` at `node`, retried while the cluster is electing leaders.
fn session_incr(cluster: &Cluster, node: usize, seq: u64) -> redis::RedisResult<i64> {
    let started = Instant::now();
    loop {
        let result = cluster.try_client(node).and_then(|mut con| {
            redis::cmd("SESSION").arg(7).arg(seq).arg("INCR").arg("counter").query::<i64>(&mut con)
        });
        match result {
            Err(error) if error.is_io_error() && started.elapsed() < Duration::from_secs(30) => {
                thread::sleep(Duration::from_millis(50));
            }
            other => return other,
        }
    }
}

#[test]
fn a_retried_session_command_runs_once_at_any_replica_and_across_restarts() {
    let mut cluster = Cluster::start(3, ARGS);
    assert_eq!(session_incr(&cluster, 0, 1).unwrap(), 1);
    assert_eq!(session_incr(&cluster, 1, 1).unwrap(), 1, "a retry elsewhere answers the saved result");
    assert_eq!(session_incr(&cluster, 2, 2).unwrap(), 2);
    let stale = session_incr(&cluster, 0, 1).unwrap_err();
    assert!(stale.to_string().contains("stale sequence number"), "{stale}");

    // The session table is in the durable log: a full restart keeps it.
    for node in 0..3 {
        cluster.sigkill(node);
    }
    for node in 0..3 {
        cluster.restart(node, &[]);
    }
    for node in 0..3 {
        cluster.wait_ready(node, 2);
    }
    assert_eq!(session_incr(&cluster, 1, 2).unwrap(), 2, "the retry after a restart ran once");
    assert_eq!(session_incr(&cluster, 2, 3).unwrap(), 3);
    let mut con = cluster.client(0);
    let counter: i64 = redis::cmd("GET").arg("counter").query(&mut con).unwrap();
    assert_eq!(counter, 3);
    // Sessions wrap single-key commands only.
    let error = redis::cmd("SESSION").arg(7).arg(4).arg("MGET").arg("a").arg("b").query::<()>(&mut con);
    assert!(error.unwrap_err().to_string().contains("single-key"));
}

#[test]
fn protocols_without_sessions_refuse_session_commands() {
    let cluster = Cluster::start(3, &["--protocol", "hermes"]);
    let mut con = cluster.client(0);
    let error = redis::cmd("SESSION").arg(7).arg(1).arg("INCR").arg("counter").query::<i64>(&mut con);
    assert!(error.unwrap_err().to_string().contains("need protocol raftlog"));
    let counter: Option<i64> = redis::cmd("GET").arg("counter").query(&mut con).unwrap();
    assert_eq!(counter, None, "the refused command did not run");
}
