//! N event loops per node for Hermes, CRAQ and ZAB (issue 23 point 4, decision 9) through the
//! real binary: each loop runs its own instance of the protocol (and of the membership
//! service) on its own thread, keys are routed to their loop by hash, the loops share the
//! peer links, each loop keeps its own append-only file, a node killed and restarted comes
//! back on every loop, and a data directory written with another loop count is refused.

mod support;

use std::collections::BTreeSet;

use support::loopback::{assert_concurrent_clients_linearizable_with, key_on_loop, Cluster};

/// The workload's keys must land on both loops, or a test of two loops would test one.
#[test]
fn the_recorded_workload_uses_both_loops() {
    let loops: BTreeSet<usize> = ["reg:0", "reg:1", "ctr:0", "ctr:1"]
        .iter()
        .map(|key| chorus_raftlog::shard_of(key.as_bytes(), 2))
        .collect();
    assert_eq!(loops.len(), 2);
}

#[test]
fn hermes_on_two_loops_is_linearizable_across_a_kill_and_keeps_each_loops_file() {
    let args = ["--protocol", "hermes", "--event-loops", "2", "--appendonly", "yes"];
    let mut cluster = Cluster::start(3, &args);
    for node in 0..3 {
        let names = cluster.thread_names(node);
        assert!(
            names.contains("chorus-loop-0") && names.contains("chorus-loop-1"),
            "one event-loop thread per loop: {names:?}"
        );
    }
    cluster.assert_linearizable_across_a_kill(1);

    // INFO sums the loops, and no message reached the wrong loop.
    assert_eq!(cluster.info_number(0, "hermes_event_loops"), Some(2));
    assert_eq!(cluster.info_number(0, "hermes_loop_messages_misrouted"), Some(0));
    let mut con = cluster.client(0);
    let (a, b) = (key_on_loop(0, 2, "a"), key_on_loop(1, 2, "b"));
    let () = redis::pipe().set(&a, "on-0").ignore().set(&b, "on-1").ignore().query(&mut con).unwrap();
    for node in 0..3 {
        let mut con = cluster.client(node);
        let (x, y): (String, String) = redis::pipe().get(&a).get(&b).query(&mut con).unwrap();
        assert_eq!((x.as_str(), y.as_str()), ("on-0", "on-1"), "node {node} reads both loops' keys");
    }
    // Loop 1 keeps its state (append-only file, membership log) under loop-1/.
    let loop_1 = cluster.dir.join("node-0").join("loop-1");
    assert!(loop_1.join("appendonly").is_dir(), "no append-only file for loop 1 in {}", loop_1.display());
    assert!(loop_1.join("membership.log").exists(), "no membership log for loop 1");

    // A full restart on the append-only files brings both loops' keys back.
    cluster.power_loss();
    for node in 0..3 {
        let mut con = cluster.client(node);
        let (x, y): (String, String) = redis::pipe().get(&a).get(&b).query(&mut con).unwrap();
        assert_eq!((x.as_str(), y.as_str()), ("on-0", "on-1"), "node {node} after the restart");
    }

    // The loop count is part of the data directory's layout.
    cluster.sigkill(2);
    let args = &mut cluster.nodes[2].args;
    let at = args.iter().position(|arg| arg == "--event-loops").unwrap();
    args[at + 1] = "1".into();
    cluster.restart(2, &[]);
    let status = cluster.nodes[2].child.as_mut().unwrap().wait().unwrap();
    assert!(!status.success());
    let log = cluster.log(2);
    assert!(log.contains("was written with event_loops = 2"), "{log}");
}

/// CRAQ and ZAB run on two loops as well (each loop its own chain, its own ZAB leader).
#[test]
fn craq_and_zab_on_two_loops_are_linearizable() {
    for protocol in ["craq", "zab"] {
        let cluster = assert_concurrent_clients_linearizable_with(protocol, &["--event-loops", "2"]);
        assert_eq!(cluster.info_number(0, &format!("{protocol}_event_loops")), Some(2));
    }
}
