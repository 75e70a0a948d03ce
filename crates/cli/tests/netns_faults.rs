//! Fault injection across network namespaces: real `chorus node` processes, each in its own
//! namespace, under partitions (nftables), random loss (nftables) and pauses (SIGSTOP /
//! SIGCONT), while concurrent clients record a history that must be linearizable, and the
//! cluster must serve every node again once the faults end.
//!
//! Every protocol runs the fault mix: hermes, craq, zab and chain with the membership service
//! (partitioned nodes are removed and rejoin: hermes and craq nodes copy the data afresh, zab
//! nodes are synchronised as followers, chain nodes are copied the head's region), raftlog
//! with its own Raft failover. Kill-and-restart with `--join` runs for every protocol with the
//! membership service (§3.4 Recovery; ZooKeeper's SNAP for zab; HyperLoop §5.1 for chain);
//! raftlog restarts from its durable log (Cyclone's Raft catches it up).
//!
//! Runs as root (CI and `scripts/test.sh` are); elsewhere it prints why it skipped.

mod support;

use std::thread;
use std::time::{Duration, Instant};

use chorus_sim::checker::{check_history, CheckerConfig};
use chorus_sim::history::History;
use support::netns::{Lab, Nodes};
use support::workload::{self, Workload};

/// A SIGSTOP pause: longer than the default lease (600 ms) and failure detection (300 ms).
const PAUSE: Duration = Duration::from_millis(1_200);

/// A cluster of `chorus node` processes of one protocol, one per namespace of the lab.
struct Cluster {
    nodes: Nodes,
    protocol: String,
    replicas: usize,
}

fn start_nodes(lab: &Lab, replicas: usize, protocol: &str) -> Cluster {
    let nodes = Nodes::new("netns", replicas);
    let mut cluster = Cluster { nodes, protocol: protocol.to_string(), replicas };
    for node in 0..replicas {
        spawn_node(lab, &mut cluster, node, &[]);
    }
    cluster
}

/// Start `node` in its namespace with its data directory (a restart keeps it).
fn spawn_node(lab: &Lab, cluster: &mut Cluster, node: usize, extra_args: &[&str]) {
    let mut args: Vec<String> = vec![
        "node".into(),
        "--node-id".into(),
        node.to_string(),
        "--protocol".into(),
        cluster.protocol.clone(),
        "--client-addr".into(),
        lab.client_addr(node),
        // The namespaces are private to the test: nothing else can reach the client port.
        "--protected-mode".into(),
        "no".into(),
        "--cluster-token".into(),
        "netns-test-token-0123".into(),
        "--data-dir".into(),
        cluster.nodes.data_dir(node).to_str().unwrap().into(),
        "--log-level".into(),
        "info".into(),
    ];
    args.extend(extra_args.iter().map(|arg| arg.to_string()));
    for peer in 0..cluster.replicas {
        args.extend(["--peer".into(), format!("{peer}={}", lab.peer_addr(peer))]);
    }
    cluster.nodes.start(lab, node, args);
}

fn wait_ready(lab: &Lab, replicas: usize) {
    wait_ready_nodes(lab, replicas, 0..replicas);
}

fn wait_ready_nodes(lab: &Lab, replicas: usize, which: impl Iterator<Item = usize>) {
    lab.wait_ready(which, replicas - 1, Duration::from_secs(60));
}

fn connect(lab: &Lab, node: usize) -> redis::Connection {
    lab.connect(node, Duration::from_secs(30)).unwrap()
}

/// Six recording clients over every node, 400 operations each, `think` apart.
fn six_clients(lab: &Lab, replicas: usize, think: Duration) -> thread::JoinHandle<History> {
    let targets = (0..replicas).map(|node| lab.client_addr(node)).collect();
    let reply_timeout = Duration::from_secs(3);
    workload::spawn(Workload { targets, clients: 6, ops_per_client: 400, reply_timeout, think })
}

/// After the faults, every node either serves or refuses clearly (the membership service
/// removed it), at least one serves, and what one serving node writes the others read.
fn assert_survivors_serve_and_agree(lab: &Lab, replicas: usize) -> Vec<usize> {
    let mut serving = Vec::new();
    for node in 0..replicas {
        let result: redis::RedisResult<String> =
            redis::cmd("SET").arg("after").arg(node).query(&mut connect(lab, node));
        match result {
            Ok(_) => serving.push(node),
            Err(error) => {
                let text = error.to_string();
                assert!(text.contains("not serving"), "node {node} failed unclearly: {text}");
            }
        }
    }
    if serving.is_empty() {
        for node in 0..replicas {
            let info: redis::RedisResult<String> =
                redis::cmd("INFO").arg("replication").query(&mut connect(lab, node));
            let info = info.unwrap_or_default();
            let view: Vec<&str> = info.lines().filter(|line| line.starts_with("chorus_view")).collect();
            eprintln!("node {node}: {view:?}");
        }
        panic!("no node serves after the faults healed");
    }
    let last = *serving.last().unwrap();
    for &node in &serving {
        let got: String = redis::cmd("GET").arg("after").query(&mut connect(lab, node)).unwrap();
        assert_eq!(got, last.to_string(), "node {node} reads the last write");
    }
    serving
}

#[test]
fn partitions_loss_and_pauses_across_namespaces_keep_hermes_linearizable() {
    fault_mix("hermes");
}

#[test]
fn partitions_loss_and_pauses_across_namespaces_keep_craq_linearizable() {
    fault_mix("craq");
}

/// This once hung for more than 10 minutes after the faults healed: nodes removed by the
/// faults never came back, the view shrank below a ZAB quorum, and the survivor could never
/// commit. Removed ZAB nodes now rejoin (docs/membership.md).
#[test]
fn partitions_loss_and_pauses_across_namespaces_keep_zab_linearizable() {
    fault_mix("zab");
}

#[test]
fn partitions_loss_and_pauses_across_namespaces_keep_chain_linearizable() {
    fault_mix("chain");
}

#[test]
fn partitions_loss_and_pauses_across_namespaces_keep_raftlog_linearizable() {
    fault_mix("raftlog");
}

/// Six recording clients while the network partitions (both ways, then one way), loses 30%
/// of one node's packets, and one node pauses longer than a lease.
fn fault_mix(protocol: &str) {
    if let Some(reason) = Lab::unavailable_reason() {
        eprintln!("SKIPPED network-namespace fault injection ({protocol}): {reason}");
        return;
    }
    let replicas = 3;
    let lab = Lab::create(replicas);
    let cluster = start_nodes(&lab, replicas, protocol);
    wait_ready(&lab, replicas);

    let clients = six_clients(&lab, replicas, Duration::from_millis(10));

    thread::sleep(Duration::from_millis(300));
    // A symmetric partition isolating node 0.
    for other in 1..replicas {
        lab.cut(0, other);
        lab.cut(other, 0);
    }
    thread::sleep(Duration::from_millis(500));
    lab.heal();
    // A one-way partition: node 1 stops hearing node 2.
    lab.cut(2, 1);
    thread::sleep(Duration::from_millis(300));
    lab.heal();
    // Heavy random loss into node 1.
    lab.lose(1, 30);
    thread::sleep(Duration::from_millis(500));
    lab.heal();
    // Node 2 pauses for longer than its lease (600 ms by default) plus failure detection
    // (6 x 50 ms): the others remove it, and when it wakes its lease has run out, so it must
    // not serve a read before it is back in a view.
    cluster.nodes.signal(2, libc::SIGSTOP);
    thread::sleep(PAUSE);
    cluster.nodes.signal(2, libc::SIGCONT);

    let history = clients.join().unwrap();
    let last_invoke = history.operations.iter().map(|op| op.invoke).max().unwrap_or_default();
    eprintln!("workload ran {last_invoke:?}; faults were injected from 0.3 s to about 3.1 s");
    let report = check_history(&history, &CheckerConfig::default());
    let completed = history.operations.iter().filter(|op| op.completion.is_some()).count();
    eprintln!(
        "{} operations, {completed} with known outcomes, {} keys checked",
        history.operations.len(),
        report.keys_checked
    );
    assert!(report.is_linearizable(), "violations: {:#?}", report.violations);
    assert!(completed > history.operations.len() / 2, "too few operations completed: {completed}");
    let serving = assert_survivors_serve_and_agree(&lab, replicas);
    eprintln!("{protocol}: serving after the faults: {serving:?}, view epoch {}", lab.view_epoch(serving[0]));
}

#[test]
fn after_a_sigkill_the_survivors_move_on_and_stay_linearizable() {
    if let Some(reason) = Lab::unavailable_reason() {
        eprintln!("SKIPPED network-namespace fault injection: {reason}");
        return;
    }
    let replicas = 3;
    let lab = Lab::create(replicas);
    let mut cluster = start_nodes(&lab, replicas, "hermes");
    wait_ready(&lab, replicas);
    // Clients on the survivors only: the victim's clients would just see a dead socket.
    let targets = (0..2).map(|node| lab.client_addr(node)).collect();
    let clients = workload::spawn(Workload {
        targets,
        clients: 4,
        ops_per_client: 300,
        reply_timeout: Duration::from_secs(5),
        think: Duration::from_millis(5),
    });
    thread::sleep(Duration::from_millis(500));
    let killed_at = Instant::now();
    cluster.nodes.kill(2);
    // Writes resume once the membership service has removed the dead node.
    let mut con = connect(&lab, 0);
    loop {
        let result: redis::RedisResult<String> = redis::cmd("SET").arg("probe").arg("x").query(&mut con);
        if result.is_ok() {
            break;
        }
        assert!(killed_at.elapsed() < Duration::from_secs(30), "writes never resumed: {result:?}");
        thread::sleep(Duration::from_millis(10));
    }
    let resumed_after = killed_at.elapsed();
    let history = clients.join().unwrap();
    let report = check_history(&history, &CheckerConfig::default());
    eprintln!(
        "writes resumed {resumed_after:?} after the SIGKILL (default detection 6 x 50 ms, lease 600 ms); {} operations",
        history.operations.len()
    );
    assert!(report.is_linearizable(), "violations: {:#?}", report.violations);
    assert_eq!(lab.view_epoch(0), 2, "exactly one view change: the dead node's removal");
    assert_eq!(assert_survivors_serve_and_agree(&lab, 2), vec![0, 1]);
}

#[test]
fn kill_and_restart_for_every_protocol() {
    if let Some(reason) = Lab::unavailable_reason() {
        eprintln!("SKIPPED network-namespace fault injection: {reason}");
        return;
    }
    for protocol in ["hermes", "craq", "zab", "chain", "raftlog"] {
        kill_and_restart(protocol);
    }
}

/// SIGKILL node 2 under load, restart it with `--join` on its old data directory: it rejoins
/// (a Hermes shadow, a CRAQ joiner, a ZAB follower, a chain tail), copies the data, serves;
/// then SIGKILL node 0: {1, 2} carry on. raftlog restarts from its durable log instead. The
/// history of clients on every node (the restarted one included) must be linearizable.
fn kill_and_restart(protocol: &str) {
    let replicas = 3;
    let lab = Lab::create(replicas);
    let mut cluster = start_nodes(&lab, replicas, protocol);
    wait_ready(&lab, replicas);
    let clients = six_clients(&lab, replicas, Duration::from_millis(8));
    thread::sleep(Duration::from_millis(400));
    cluster.nodes.kill(2);
    // raftlog has no membership views: its logs fail over by Raft, and a restarted node
    // recovers from its durable log and is caught up by its logs' leaders (no --join).
    let membership = protocol != "raftlog";
    if membership {
        let started = Instant::now();
        while lab.view_epoch(0) < 2 {
            assert!(started.elapsed() < Duration::from_secs(30), "node 2 was never removed");
            thread::sleep(Duration::from_millis(20));
        }
        spawn_node(&lab, &mut cluster, 2, &["--join", &lab.peer_addr(0)]);
    } else {
        thread::sleep(Duration::from_millis(500));
        spawn_node(&lab, &mut cluster, 2, &[]);
    }
    wait_ready_nodes(&lab, replicas, 2..3);
    cluster.nodes.kill(0);
    let history = clients.join().unwrap();
    let report = check_history(&history, &CheckerConfig::default());
    let completed = history.operations.iter().filter(|op| op.completion.is_some()).count();
    eprintln!("{protocol} kill-and-restart: {} operations, {completed} completed", history.operations.len());
    assert!(report.is_linearizable(), "violations: {:#?}", report.violations);
    assert!(completed > history.operations.len() / 2, "too few operations completed: {completed}");
    let mut con = connect(&lab, 2);
    let _: () = redis::cmd("SET").arg("after").arg("restart").query(&mut con).unwrap();
    let got: String = redis::cmd("GET").arg("after").query(&mut connect(&lab, 1)).unwrap();
    assert_eq!(got, "restart");
    if membership {
        assert!(lab.view_epoch(1) >= 4, "views: remove 2, add 2, remove 0");
    }
}

// ------------------------------------------------------------- peer links recover fast

/// Peer links recover as fast as the network does (issue 22, point 15): one replica is cut
/// off from its peers for 30 s (its client port stays reachable), the others move on to a
/// view without it, then the network heals. Measured from the heal: when its peer links are
/// back, when it answers a client (served, or refused with a clear error while it rejoins),
/// and when it is back in the survivors' view and serving. Before peer links had a liveness
/// timeout their TCP connections sat in retransmission backoff and the replica stayed out
/// for 20 s or more (23 s measured). The bound asserted here (5 s) is loose so a busy
/// machine cannot fail it, yet far below that; the measured times are printed, and
/// docs/operations.md quotes them against the 2 s target.
const PARTITION: Duration = Duration::from_secs(30);
const REJOIN_BOUND: Duration = Duration::from_secs(5);

/// A connection that gives up quickly: a probe, not a client.
fn connect_quick(lab: &Lab, node: usize) -> redis::RedisResult<redis::Connection> {
    let url = format!("redis://{}/", lab.client_addr(node));
    let con = redis::Client::open(url)?.get_connection_with_timeout(Duration::from_secs(1))?;
    con.set_read_timeout(Some(Duration::from_millis(500)))?;
    con.set_write_timeout(Some(Duration::from_millis(500)))?;
    Ok(con)
}

/// `field:value` from node's `INFO replication`.
fn info(lab: &Lab, node: usize, field: &str) -> Option<String> {
    let text: String =
        redis::cmd("INFO").arg("replication").query(&mut connect_quick(lab, node).ok()?).ok()?;
    let prefix = format!("{field}:");
    text.lines().find_map(|line| line.strip_prefix(&prefix)).map(|value| value.trim().to_string())
}

/// Poll `done` until it holds; the time since `since` when it did.
fn wait_for(what: &str, since: Instant, deadline: Duration, mut done: impl FnMut() -> bool) -> Duration {
    while !done() {
        assert!(since.elapsed() < deadline, "{what}: not within {deadline:?}");
        thread::sleep(Duration::from_millis(20));
    }
    since.elapsed()
}

/// The node answers a write: served, or refused with an error that says why.
fn answers_clearly(lab: &Lab, node: usize) -> bool {
    let Ok(mut con) = connect_quick(lab, node) else { return false };
    let result: redis::RedisResult<String> = redis::cmd("SET").arg("probe").arg(node).query(&mut con);
    match result {
        Ok(_) => true,
        Err(error) if error.is_timeout() || error.is_io_error() => false,
        Err(error) => {
            let text = error.to_string();
            assert!(text.contains("not serving") || text.contains("joining"), "an unclear refusal: {text}");
            true
        }
    }
}

#[test]
fn a_replica_cut_off_for_30_s_is_back_within_seconds_of_the_heal() {
    if let Some(reason) = Lab::unavailable_reason() {
        eprintln!("SKIPPED network-namespace partition-heal test: {reason}");
        return;
    }
    let replicas = 3;
    let lab = Lab::create(replicas);
    let cluster = start_nodes(&lab, replicas, "hermes");
    wait_ready(&lab, replicas);
    for other in 1..replicas {
        lab.cut(0, other);
        lab.cut(other, 0);
    }
    let cut_at = Instant::now();
    wait_for("the survivors remove node 0", cut_at, Duration::from_secs(20), || {
        info(&lab, 1, "chorus_view_live").as_deref() == Some("1,2")
    });
    thread::sleep(PARTITION.saturating_sub(cut_at.elapsed()));
    lab.heal();
    let healed = Instant::now();
    let links_up = wait_for("node 0's peer links come back", healed, Duration::from_secs(60), || {
        info(&lab, 0, "chorus_peers_connected").as_deref() == Some("2")
    });
    let answering =
        wait_for("node 0 answers clients", healed, Duration::from_secs(60), || answers_clearly(&lab, 0));
    let rejoined =
        wait_for("node 0 is back in the view and serving", healed, Duration::from_secs(60), || {
            info(&lab, 1, "chorus_view_live").as_deref() == Some("0,1,2")
                && info(&lab, 0, "chorus_operational").as_deref() == Some("1")
        });
    eprintln!(
        "after a {PARTITION:?} partition, from the heal: peer links up {links_up:?}, answering \
         clients (served or refused clearly) {answering:?}, back in the view and serving {rejoined:?} \
         (target: 2 s)"
    );
    assert!(links_up < REJOIN_BOUND, "peer links took {links_up:?} to come back");
    assert!(answering < REJOIN_BOUND, "node 0 took {answering:?} to answer clients");
    // Every link change and view change is in the logs, with epochs and members.
    let survivor = cluster.nodes.log(1);
    assert!(survivor.contains("view installed") && survivor.contains("members"), "{survivor}");
    let cut_off = cluster.nodes.log(0);
    assert!(cut_off.contains("peer link down") || cut_off.contains("silent for"), "{cut_off}");
    assert!(cut_off.contains("peer link up"), "{cut_off}");
}
