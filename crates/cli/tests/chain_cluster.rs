//! Process-level tests of `--protocol chain` (the key-value store on the HyperLoop group
//! primitives, docs/protocols/chain.md): three real `chorus node` processes on loopback,
//! concurrent clients, and the simulator's linearizability checker on the recorded history;
//! the same RESP commands as the other protocols; a member SIGKILLed mid-load, and a fresh
//! node joining in its place (§5.1: copied to by the head, then linked). No timing
//! assertions: every wait has a generous deadline that only guards against hangs.

use std::thread;
use std::time::{Duration, Instant};

use chorus_sim::checker::{check_history, CheckerConfig};
use support::loopback::{assert_concurrent_clients_linearizable, background_clients, Bulk, Cluster};

mod support;

#[test]
fn chain_clients_on_three_nodes_see_a_linearizable_history() {
    assert_concurrent_clients_linearizable("chain");
}

#[test]
fn chain_serves_the_same_commands_across_replicas() {
    let cluster = Cluster::start(3, &["--protocol", "chain"]);
    let mut first = cluster.client(0);
    let mut second = cluster.client(1);
    let mut third = cluster.client(2);
    let _: () = redis::cmd("SET").arg("greeting").arg("hello").query(&mut first).unwrap();
    // Node 1 reads under its read lock, node 2 (the tail) lock-free.
    for con in [&mut first, &mut second, &mut third] {
        let read: Option<String> = redis::cmd("GET").arg("greeting").query(con).unwrap();
        assert_eq!(read.as_deref(), Some("hello"));
    }
    for _ in 0..5 {
        let _: i64 = redis::cmd("INCR").arg("hits").query(&mut second).unwrap();
    }
    let total: i64 = redis::cmd("INCRBY").arg("hits").arg(10).query(&mut third).unwrap();
    assert_eq!(total, 15, "increments from two replicas add up");
    let previous: Option<String> =
        redis::cmd("GETSET").arg("greeting").arg("world").query(&mut third).unwrap();
    assert_eq!(previous.as_deref(), Some("hello"));
    let set: i64 = redis::cmd("SETNX").arg("greeting").arg("other").query(&mut second).unwrap();
    assert_eq!(set, 0, "SETNX on a present key");
    let _: () = redis::cmd("MSET").arg("a").arg("1").arg("b").arg("2").query(&mut first).unwrap();
    let both: Vec<Option<String>> = redis::cmd("MGET").arg("a").arg("b").query(&mut third).unwrap();
    assert_eq!(both, vec![Some("1".to_string()), Some("2".to_string())]);
    let not_integer = redis::cmd("INCR").arg("greeting").query::<i64>(&mut first).unwrap_err();
    assert!(not_integer.to_string().contains("not an integer"), "{not_integer}");
    let deleted: i64 = redis::cmd("DEL").arg("greeting").query(&mut first).unwrap();
    assert_eq!(deleted, 1);
    for con in [&mut first, &mut second, &mut third] {
        let exists: i64 = redis::cmd("EXISTS").arg("greeting").query(con).unwrap();
        assert_eq!(exists, 0, "the delete is seen at once on every replica");
    }
    // Every replica's region holds the whole database: DBSIZE and FLUSHALL see every key.
    let size: i64 = redis::cmd("DBSIZE").query(&mut second).unwrap();
    assert_eq!(size, 3, "hits, a, b");
    let _: () = redis::cmd("FLUSHALL").query(&mut second).unwrap();
    for con in [&mut first, &mut second, &mut third] {
        let size: i64 = redis::cmd("DBSIZE").query(con).unwrap();
        assert_eq!(size, 0);
    }
    let info: String = redis::cmd("INFO").query(&mut first).unwrap();
    assert!(info.contains("chorus_protocol:chain"), "{info}");
}

/// HyperLoop §5.1 with real processes: the head (the coordinator) is SIGKILLed while six
/// clients run; the membership service's heartbeats declare it failed, the next view makes
/// node 1 the head, which redoes its log and resumes. The whole history, before, during and
/// after, must be linearizable: no acknowledged write is lost.
#[test]
fn chain_survives_a_sigkill_of_the_head_mid_load() {
    let mut cluster = Cluster::start(3, &["--protocol", "chain"]);
    let load = background_clients(&cluster, 250, Duration::from_secs(10), Duration::from_millis(2));
    std::thread::sleep(Duration::from_millis(300));
    cluster.sigkill(0);
    let history = load.join().unwrap();
    let completed_after_kill = history.operations.iter().filter(|op| op.completion.is_some()).count();
    let report = check_history(&history, &CheckerConfig::default());
    eprintln!(
        "chain with a killed head: {} operations ({completed_after_kill} completed), inconclusive: {:?}",
        history.operations.len(),
        report.inconclusive_keys
    );
    assert!(report.is_linearizable(), "violations: {:#?}", report.violations);
    // The survivors serve, in a chain without node 0 (node 1 recovered it as the new head),
    // and agree.
    let mut con = cluster.client(1);
    let info: String = redis::cmd("INFO").query(&mut con).unwrap();
    assert!(info.contains("chorus_view_live:1,2"), "node 0 was not removed:\n{info}");
    let _: () = redis::cmd("SET").arg("after").arg("kill").query(&mut con).unwrap();
    let mut tail = cluster.client(2);
    let read: Option<String> = redis::cmd("GET").arg("after").query(&mut tail).unwrap();
    assert_eq!(read.as_deref(), Some("kill"));
}

const BULK: Bulk = Bulk { keys: 200 };

/// HyperLoop §5.1 with real processes: the head is SIGKILLed while six clients run; the
/// survivors re-chain without it. A fresh node with the same id and an empty data directory
/// starts with `--join`; the new head pauses writes, copies its log and database region to it
/// (gWRITE chunks + gFLUSH), links it as the new tail, and resumes. The joiner refuses clients
/// until then, serves the latest values after, and the whole history (before, during and after
/// the kill and the join) is linearizable: no acknowledged write is lost.
#[test]
fn a_fresh_node_joins_the_chain_after_a_member_is_sigkilled_mid_load() {
    let mut cluster = Cluster::start(3, &["--protocol", "chain"]);
    BULK.write_initial(&cluster, 0);
    let load = background_clients(&cluster, 600, Duration::from_secs(10), Duration::from_millis(5));
    thread::sleep(Duration::from_millis(300));
    cluster.sigkill(0);
    cluster.wait_until("survivors remove n0", 1, |c| {
        c.info_number(1, "chorus_view_epoch").is_some_and(|epoch| epoch >= 2)
    });
    // Writes the joiner must get from the copy.
    BULK.overwrite_while_down(&cluster, 1);
    // A replacement machine: nothing of the old node's data directory survives.
    let data_dir = cluster.dir.join("node-0");
    std::fs::remove_dir_all(&data_dir).unwrap();
    let donor = cluster.nodes[1].peer.to_string();
    let restarted = Instant::now();
    cluster.restart(0, &["--join", &donor]);
    // Until it is linked, the joiner refuses clients with a clear reason.
    let refused = cluster.try_client(0).ok().and_then(|mut con| {
        redis::cmd("GET").arg("bulk:0").query::<Option<String>>(&mut con).err().map(|error| error.to_string())
    });
    if let Some(error) = &refused {
        assert!(error.contains("replica is not serving"), "{error}");
    }
    // Ready means operational: linked into the chain, so caught up.
    cluster.wait_ready(0, 2);
    eprintln!("n0 restarted to linked in {:?} (the first GET was refused: {refused:?})", restarted.elapsed());
    let copies = cluster.info_number(0, "chain_copies_received");
    assert_eq!(copies, Some(1), "copies received by n0");
    let linked = cluster.info_number(1, "chain_joins_linked").unwrap();
    assert_eq!(linked, 1, "n1, the new head, copied to and linked n0");
    let pause_us = cluster.info_number(1, "chain_last_join_pause_us").unwrap();
    eprintln!("writes paused {:.1} ms for the copy and the link", pause_us as f64 / 1000.0);
    let copied = cluster.info_number(1, "chain_copy_bytes_sent").unwrap();
    assert!(copied > 64 * 1024 * 1024, "the whole region is copied: {copied} bytes");
    BULK.assert_latest_at(&cluster, 0);
    let mut con = cluster.client(0);
    let history = load.join().unwrap();

    // n0 is a full member now, at the tail: a write through it reaches every replica.
    let _: () = redis::cmd("SET").arg("after").arg("join").query(&mut con).unwrap();
    for node in [1, 2] {
        let mut con = cluster.client(node);
        let value: Option<String> = redis::cmd("GET").arg("after").query(&mut con).unwrap();
        assert_eq!(value.as_deref(), Some("join"), "at n{node}");
    }
    let info: String = redis::cmd("INFO").query(&mut con).unwrap();
    assert!(info.contains("chorus_view_live:0,1,2"), "n0 was not added back:\n{info}");

    let completed = history.operations.iter().filter(|op| op.completion.is_some()).count();
    let report = check_history(&history, &CheckerConfig::default());
    eprintln!(
        "chain with a killed and replaced head: {} operations ({completed} completed), inconclusive: {:?}",
        history.operations.len(),
        report.inconclusive_keys
    );
    assert!(report.is_linearizable(), "violations: {:#?}", report.violations);
    assert!(completed > 1_000, "too few operations completed: {completed}");
}
