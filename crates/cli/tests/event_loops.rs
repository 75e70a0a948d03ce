//! N event loops per node for Hermes, CRAQ and ZAB (issue 23 point 4, decision 9) through the
//! real binary: each loop runs its own instance of the protocol (and of the membership
//! service) on its own thread, keys are routed to their loop by hash, the loops share the
//! peer links, each loop keeps its own append-only file, a node killed and restarted comes
//! back on every loop, and a data directory written with another loop count is refused.

mod support;

use std::collections::BTreeSet;
use std::thread;
use std::time::Duration;

use chorus_sim::checker::{check_history, CheckerConfig};
use support::loopback::Cluster;
use support::workload::{self, Workload};

/// The names of node `i`'s threads.
fn thread_names(cluster: &Cluster, i: usize) -> BTreeSet<String> {
    let pid = cluster.nodes[i].child.as_ref().expect("running").id();
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("linux /proc");
    tasks
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .map(|name| name.trim().to_string())
        .collect()
}

fn workload(cluster: &Cluster) -> Workload {
    Workload {
        targets: cluster.nodes.iter().map(|node| node.client.to_string()).collect(),
        clients: 6,
        ops_per_client: 200,
        reply_timeout: Duration::from_secs(3),
        think: Duration::from_millis(3),
    }
}

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
        let names = thread_names(&cluster, node);
        assert!(
            names.contains("chorus-loop-0") && names.contains("chorus-loop-1"),
            "one event-loop thread per loop: {names:?}"
        );
    }
    let run = workload(&cluster);
    let clients = thread::spawn(move || workload::run(run));
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

    // INFO sums the loops; each loop committed writes of its own keys.
    assert_eq!(cluster.info_number(0, "hermes_event_loops"), Some(2));
    assert_eq!(cluster.info_number(0, "hermes_loop_messages_misrouted"), Some(0));
    let mut con = cluster.client(0);
    let (a, b) = (key_on_loop(0, "a"), key_on_loop(1, "b"));
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

/// Keys `prefix0`, `prefix1`, ... until one lands on loop `event_loop` of two.
fn key_on_loop(event_loop: usize, prefix: &str) -> String {
    (0..)
        .map(|index| format!("{prefix}{index}"))
        .find(|key| chorus_raftlog::shard_of(key.as_bytes(), 2) == event_loop)
        .expect("some key is on every loop")
}

/// CRAQ and ZAB run on two loops as well (each loop its own chain, its own ZAB leader).
#[test]
fn craq_and_zab_on_two_loops_are_linearizable() {
    for protocol in ["craq", "zab"] {
        let cluster = Cluster::start(3, &["--protocol", protocol, "--event-loops", "2"]);
        let history = workload::run(workload(&cluster));
        let report = check_history(&history, &CheckerConfig::default());
        assert!(report.violations.is_empty(), "{protocol} not linearizable: {:?}", report.violations);
        let completed = history.operations.iter().filter(|op| op.completion.is_some()).count();
        assert_eq!(
            completed,
            history.operations.len(),
            "{protocol}: without faults every operation completes"
        );
        assert_eq!(cluster.info_number(0, &format!("{protocol}_event_loops")), Some(2));
    }
}
