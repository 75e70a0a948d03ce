//! `chorus bench kv` and `chorus bench ycsb` against a real 3-node cluster started here, with
//! tiny operation counts. Checks that the runs complete without errors and that the JSON
//! report has its shape; nothing here looks at how fast anything was.

mod support;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::loopback::free_addrs;

const DEADLINE: Duration = Duration::from_secs(60);

struct Cluster {
    clients: Vec<SocketAddr>,
    children: Vec<Child>,
    dir: PathBuf,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!("node logs kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn start_cluster(name: &str) -> Cluster {
    let dir = std::env::temp_dir().join(format!("chorus-bench-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let addrs = free_addrs(6);
    let mut cluster = Cluster { clients: Vec::new(), children: Vec::new(), dir: dir.clone() };
    for i in 0..3 {
        let mut command = Command::new(env!("CARGO_BIN_EXE_chorus"));
        command
            .arg("node")
            .args(["--node-id", &i.to_string()])
            .args(["--client-addr", &addrs[i].to_string()])
            .args(["--cluster-token", "bench-test-token"])
            .args(["--data-dir", dir.join(format!("node-{i}")).to_str().unwrap()]);
        for j in 0..3 {
            command.args(["--peer", &format!("{j}={}", addrs[3 + j])]);
        }
        let log = std::fs::File::create(dir.join(format!("node-{i}.log"))).unwrap();
        command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(log);
        cluster.children.push(command.spawn().expect("start chorus node"));
        cluster.clients.push(addrs[i]);
    }
    for addr in cluster.clients.clone() {
        let started = Instant::now();
        loop {
            let ready = redis::Client::open(format!("redis://{addr}/"))
                .and_then(|client| client.get_connection_with_timeout(Duration::from_secs(2)))
                .and_then(|mut con| redis::cmd("INFO").arg("replication").query::<String>(&mut con))
                .is_ok_and(|info| info.contains("chorus_peers_connected:2"));
            if ready {
                break;
            }
            assert!(started.elapsed() < DEADLINE, "node {addr} not ready");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    cluster
}

fn bench(args: &[&str]) -> (i32, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_chorus"))
        .arg("bench")
        .args(args)
        .output()
        .expect("run chorus bench");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    (output.status.code().unwrap_or(-1), format!("{stdout}\n{stderr}"))
}

fn read_json(path: &PathBuf) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).expect("json written")).expect("valid json")
}

#[test]
fn bench_kv_and_ycsb_run_against_a_three_node_cluster() {
    let cluster = start_cluster("kv");
    let targets = cluster.clients.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(",");

    let json = cluster.dir.join("kv.json");
    let (code, output) = bench(&[
        "kv",
        "--targets",
        &targets,
        "--write-ratio",
        "0.5",
        "--keys",
        "100",
        "--ops",
        "400",
        "--clients",
        "4",
        "--pipeline",
        "2",
        "--threads",
        "1",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{output}");
    assert!(output.contains("[OVERALL]"), "{output}");
    let report = read_json(&json);
    assert_eq!(report["command"], "kv");
    assert_eq!(report["clients"], 4);
    assert_eq!(report["load"]["items"], 100);
    let run = &report["run"];
    assert_eq!(run["operations"], 400, "{run}");
    assert_eq!(run["errors"], 0, "{run}");
    let names: Vec<&str> =
        run["by_operation"].as_array().unwrap().iter().map(|op| op["operation"].as_str().unwrap()).collect();
    assert_eq!(names, ["GET", "SET"], "{run}");
    assert!(run["overall"]["latency"]["p99_us"].as_f64().unwrap() > 0.0);

    // YCSB-F (read-modify-write) in an open loop, and YCSB-E (scans and inserts).
    let json = cluster.dir.join("ycsb.json");
    let (code, output) = bench(&[
        "ycsb",
        "--workload",
        "f",
        "--targets",
        &targets,
        "--records",
        "50",
        "--ops",
        "200",
        "--clients",
        "3",
        "--rate",
        "2000",
        "--threads",
        "1",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{output}");
    let report = read_json(&json);
    assert_eq!(report["spec"]["workload"], "f");
    assert_eq!(report["run"]["operations"], 200);
    assert_eq!(report["run"]["errors"], 0);
    let (code, output) = bench(&[
        "ycsb",
        "--workload",
        "e",
        "--targets",
        &targets,
        "--records",
        "50",
        "--ops",
        "100",
        "--clients",
        "2",
        "--threads",
        "1",
    ]);
    assert_eq!(code, 0, "{output}");
    assert!(output.contains("SCAN"), "{output}");
}

#[test]
fn bench_reports_an_unreachable_target() {
    let free = free_addrs(1)[0];
    let (code, output) = bench(&["kv", "--targets", &free.to_string(), "--ops", "10", "--keys", "10"]);
    assert_ne!(code, 0);
    assert!(output.contains("cannot connect"), "{output}");
}

/// `chorus bench raftlog` with its nodes' data on a directory given (a real file system in a
/// run that means it) and Cyclone's placement: every log led by one node and every client there,
/// so no node forwards a batch; with the clients spread, nodes that do not lead a key's log
/// forward.
#[test]
fn bench_raftlog_puts_its_data_where_told_and_its_clients_at_the_leader() {
    let root = std::env::temp_dir().join(format!("chorus-bench-raftlog-root-{}", std::process::id()));
    std::fs::create_dir_all(&root).unwrap();
    let run = |at: &str| {
        let out = root.join(format!("out-{at}"));
        let args = [
            "raftlog",
            "--sweeps",
            "optimizations",
            "--duration-s",
            "0.5",
            "--clients",
            "6",
            "--clients-at",
            at,
            "--data-root",
            root.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ];
        let (code, output) = bench(&args);
        assert_eq!(code, 0, "{output}");
        read_json(&out.join("raftlog.json"))
    };
    for (at, forwards) in [("leader", false), ("all", true)] {
        let report = run(at);
        let note = report["note"].as_str().unwrap();
        assert!(note.contains(root.to_str().unwrap()), "{note}");
        let points = report["points"].as_array().unwrap();
        assert_eq!(points.len(), 3, "{report}");
        for point in points {
            assert_eq!(point["errors"], 0, "{point}");
            assert!(point["commands_per_s"].as_f64().unwrap() > 0.0, "{point}");
        }
        // One log without batching: every command of a client at a follower is a batch forwarded.
        let forwarded = points[0]["batches_forwarded"].as_u64().unwrap();
        assert_eq!(forwarded > 0, forwards, "clients at {at}: {} forwarded", points[0]);
    }
    let left: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("chorus-bench-"))
        .collect();
    assert!(left.is_empty(), "the nodes' data directories were left behind: {left:?}");
    let _ = std::fs::remove_dir_all(&root);
}
