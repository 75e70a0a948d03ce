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
    cluster.power_loss();
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

/// Issue 18 point 5: sessions expire. With `--raftlog-session-expiry-entries 16` and one log,
/// 200 one-shot client sessions leave at most a few dozen session records on every replica
/// (INFO `raftlog_session_records`; without expiry there would be 200), while a retry within
/// the expiry still answers the saved result without running again.
#[test]
fn idle_sessions_expire_so_the_session_table_stays_bounded() {
    let args = ["--protocol", "raftlog", "--raftlog-logs", "1", "--raftlog-session-expiry-entries", "16"];
    let cluster = Cluster::start(3, &args);
    assert_eq!(session_incr(&cluster, 0, 1).unwrap(), 1);
    let mut con = cluster.client(0);
    for client in 1_000..1_200u64 {
        let reply: String = redis::cmd("SESSION")
            .arg(client)
            .arg(1)
            .arg("SET")
            .arg(format!("k{client}"))
            .arg("v")
            .query(&mut con)
            .unwrap();
        assert_eq!(reply, "OK");
    }
    let retry: String =
        redis::cmd("SESSION").arg(1_199).arg(1).arg("SET").arg("k1199").arg("other").query(&mut con).unwrap();
    assert_eq!(retry, "OK");
    let value: String = redis::cmd("GET").arg("k1199").query(&mut con).unwrap();
    assert_eq!(value, "v", "a retry within the expiry did not run again");
    for node in 0..3 {
        cluster.wait_until("followers apply every entry", node, |cluster| {
            cluster.info_number(node, "raftlog_proposals_executed").is_some_and(|executed| executed >= 201)
        });
        let records = cluster.info_number(node, "raftlog_session_records").expect("INFO field");
        assert!(records <= 40, "n{node} holds {records} session records for 202 sessions");
    }
}
