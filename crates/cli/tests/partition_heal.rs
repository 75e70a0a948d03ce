//! Peer links recover as fast as the network does (issue 22, point 15): real `chorus node`
//! processes in network namespaces; one replica is cut off from its peers for 30 s (its
//! client port stays reachable), the others move on to a view without it, then the network
//! heals. Measured from the heal: when the cut-off replica's peer links are back, when it
//! answers a client (served, or refused with a clear error while it rejoins), and when it
//! is back in the survivors' view and serving.
//!
//! Before peer links had a liveness timeout, their TCP connections sat in retransmission
//! backoff after a long partition and the replica stayed out for 20 s or more. The bound
//! asserted here (5 s) is loose so a busy machine cannot fail it, yet far below that; the
//! measured times are printed, and docs/operations.md quotes them against the 2 s target.
//!
//! Runs as root (CI and `scripts/test.sh` are); elsewhere it prints why it skipped.

mod support;

use std::thread;
use std::time::{Duration, Instant};

use support::netns::Lab;

const CLIENT_PORT: u16 = 6379;
const PEER_PORT: u16 = 7000;
const PARTITION: Duration = Duration::from_secs(30);
const REJOIN_BOUND: Duration = Duration::from_secs(5);

struct Nodes {
    children: Vec<std::process::Child>,
    dir: std::path::PathBuf,
}

impl Drop for Nodes {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        if thread::panicking() {
            eprintln!("node logs kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn start(lab: &Lab, replicas: usize, protocol: &str) -> Nodes {
    let dir = std::env::temp_dir().join(format!("chorus-heal-{}-{protocol}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut children = Vec::new();
    for node in 0..replicas {
        let mut command = lab.command_in(node, env!("CARGO_BIN_EXE_chorus"));
        command
            .arg("node")
            .args(["--node-id", &node.to_string()])
            .args(["--protocol", protocol])
            .args(["--client-addr", &format!("{}:{CLIENT_PORT}", lab.node_ip(node))])
            .args(["--cluster-token", "partition-heal-token-0123"])
            .args(["--data-dir", dir.join(format!("node-{node}")).to_str().unwrap()])
            .args(["--log-level", "info"]);
        for peer in 0..replicas {
            command.args(["--peer", &format!("{peer}={}:{PEER_PORT}", lab.node_ip(peer))]);
        }
        let log = std::fs::File::create(dir.join(format!("node-{node}.log"))).unwrap();
        command.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null()).stderr(log);
        children.push(command.spawn().expect("start chorus node in its namespace"));
    }
    Nodes { children, dir }
}

fn connect(lab: &Lab, node: usize) -> redis::RedisResult<redis::Connection> {
    let url = format!("redis://{}:{CLIENT_PORT}/", lab.node_ip(node));
    let con = redis::Client::open(url)?.get_connection_with_timeout(Duration::from_secs(1))?;
    con.set_read_timeout(Some(Duration::from_millis(500)))?;
    con.set_write_timeout(Some(Duration::from_millis(500)))?;
    Ok(con)
}

/// `field:value` from node's `INFO replication`.
fn info(lab: &Lab, node: usize, field: &str) -> Option<String> {
    let text: String = redis::cmd("INFO").arg("replication").query(&mut connect(lab, node).ok()?).ok()?;
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
    let Ok(mut con) = connect(lab, node) else { return false };
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
        eprintln!("SKIPPED partition-heal test: {reason}");
        return;
    }
    let replicas = 3;
    let lab = Lab::create(replicas);
    let nodes = start(&lab, replicas, "hermes");
    for node in 0..replicas {
        wait_for(&format!("node {node} ready"), Instant::now(), Duration::from_secs(60), || {
            info(&lab, node, "chorus_peers_connected").as_deref() == Some("2")
                && info(&lab, node, "chorus_operational").as_deref() == Some("1")
        });
    }
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
    let log = |node: usize| std::fs::read_to_string(nodes.dir.join(format!("node-{node}.log"))).unwrap();
    let survivor = log(1);
    assert!(survivor.contains("view installed") && survivor.contains("members"), "{survivor}");
    let cut_off = log(0);
    assert!(cut_off.contains("peer link down") || cut_off.contains("silent for"), "{cut_off}");
    assert!(cut_off.contains("peer link up"), "{cut_off}");
}
