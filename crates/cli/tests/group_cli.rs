//! The HyperLoop pieces through the real `chorus` binary: `chorus group-host` in every mode
//! (the Naïve modes start `chorus naive-replica` processes) serving the transaction API, and
//! smoke runs of `chorus bench group` and `chorus bench protocols` that check the JSON and PNG
//! files appear. Nothing here looks at how fast anything was.

mod support;

use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use chorus_group::runtime::{BlockingGroupClient, GroupSpec};
use chorus_group::txn::{Txn, TxnLayout};
use chorus_group::{GroupId, Token};
use chorus_region::TenantId;
use support::loopback::free_addrs;
use support::scratch::Scratch;

const DEADLINE: Duration = Duration::from_secs(60);
const TOKEN_HEX: &str = "00112233445566778899aabbccddeeff";

struct Hosts(Vec<Child>);

impl Drop for Hosts {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn start_hosts(mode: &str, scratch: &Scratch) -> (Hosts, Vec<SocketAddr>) {
    let addrs = free_addrs(3);
    let mut hosts = Hosts(Vec::new());
    for (i, addr) in addrs.iter().enumerate() {
        let child = Command::new(env!("CARGO_BIN_EXE_chorus"))
            .arg("group-host")
            .args(["--listen", &addr.to_string()])
            .args(["--tenant", &format!("7:{TOKEN_HEX}")])
            .args(["--mode", mode, "--flush", "msync"])
            .arg("--region-dir")
            .arg(scratch.0.join(format!("host{i}")))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("start chorus group-host");
        hosts.0.push(child);
    }
    for addr in &addrs {
        let started = Instant::now();
        while TcpStream::connect(addr).is_err() {
            assert!(started.elapsed() < DEADLINE, "group host at {addr} did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    (hosts, addrs)
}

fn token() -> Token {
    chorus_group::runtime::parse_token(TOKEN_HEX).unwrap()
}

#[test]
fn group_hosts_serve_the_transaction_api_in_every_mode() {
    for mode in ["chorus", "naive", "naive-polling"] {
        let scratch = Scratch::new(&format!("group-cli-{mode}"));
        let (hosts, addrs) = start_hosts(mode, &scratch);
        let layout = TxnLayout::new(1024, 256);
        let spec =
            GroupSpec::new(addrs.clone(), TenantId(7), token(), GroupId(1), "t", layout.region_bytes());
        let client = BlockingGroupClient::initialize(spec).unwrap();
        if mode == "chorus" {
            assert_eq!(client.client().data_addrs(), addrs.as_slice());
        } else {
            assert_ne!(client.client().data_addrs(), addrs.as_slice(), "{mode}: redirected to naive-replica");
        }
        let paths = client.client().region_paths().to_vec();
        let mut txn = Txn::new(client, layout, 1);
        assert!(txn.wr_lock().unwrap(), "{mode}");
        txn.append(&[(0, Bytes::from_static(b"alpha")), (100, Bytes::from_static(b"omega"))]).unwrap();
        txn.execute_and_advance().unwrap();
        txn.wr_unlock().unwrap();
        assert_eq!(txn.read(0, 0, 5).unwrap(), b"alpha", "{mode}: read at the head");
        assert_eq!(txn.read(2, 100, 5).unwrap(), b"omega", "{mode}: read at the tail");
        let files: Vec<Vec<u8>> = paths.iter().map(|p| std::fs::read(p).unwrap()).collect();
        assert!(files.windows(2).all(|w| w[0] == w[1]), "{mode}: identical region files");
        // A wrong token is refused by the real binary too.
        let mut wrong = GroupSpec::new(addrs.clone(), TenantId(7), Token([1; 16]), GroupId(2), "u", 64);
        wrong.io_timeout = Duration::from_secs(5);
        assert!(BlockingGroupClient::initialize(wrong).is_err(), "{mode}");
        drop(txn);
        drop(hosts);
    }
}

#[test]
fn bench_group_writes_json_and_the_paper_shaped_figures() {
    let scratch = Scratch::new("group-cli-bench-group");
    let json = scratch.0.join("group.json");
    let status = Command::new(env!("CARGO_BIN_EXE_chorus"))
        .args(["bench", "group", "--quick", "--modes", "chorus", "--group-sizes", "3"])
        .arg("--json")
        .arg(&json)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let results = report["results"].as_array().unwrap();
    for primitive in ["gWRITE", "gMEMCPY", "gCAS"] {
        assert!(results.iter().any(|r| r["primitive"] == primitive), "{primitive}");
    }
    assert!(results.iter().all(|r| r["host_cpu_us_per_op"].is_number()), "CPU per op from /proc");
    for figure in
        ["group-fig8-latency", "group-table2-gcas", "group-fig9-throughput", "group-fig10-group-size"]
    {
        let png = std::fs::read(scratch.0.join(format!("{figure}.png"))).unwrap();
        assert_eq!(&png[1..4], b"PNG", "{figure}");
    }
}

#[test]
fn bench_protocols_runs_end_to_end_on_a_tiny_plan() {
    let scratch = Scratch::new("group-cli-bench-protocols");
    let status = Command::new(env!("CARGO_BIN_EXE_chorus"))
        .args([
            "bench",
            "protocols",
            "--protocols",
            "hermes,craq",
            "--replicas",
            "3",
            "--scale-replicas",
            "3",
        ])
        .args([
            "--duration-s",
            "0.2",
            "--rounds",
            "1",
            "--keys",
            "200",
            "--clients",
            "2",
            "--sweep-clients",
            "1",
        ])
        .arg("--out")
        .arg(&scratch.0)
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(scratch.0.join("protocols.json")).unwrap()).unwrap();
    let points = report["points"].as_array().unwrap();
    // 12 write-ratio points and one sweep point per protocol.
    assert_eq!(points.len(), 2 * 13, "{points:?}");
    assert!(points.iter().all(|p| p["ops_per_s"].as_f64().unwrap() > 0.0 && p["errors"] == 0), "{points:?}");
    for figure in [
        "protocols-fig5-throughput",
        "protocols-fig6a-latency-vs-throughput",
        "protocols-fig6bc-read-write-latency",
        "protocols-scalability",
    ] {
        let png = std::fs::read(scratch.0.join(format!("{figure}.png"))).unwrap();
        assert_eq!(&png[1..4], b"PNG", "{figure}");
    }
}

/// `chorus group-host --datapath kernel` in three network namespaces (root, BPF and clang
/// needed; otherwise it says why it skips): the transaction API runs with every operation and
/// read applied by the hosts' XDP programs, and each host reports serving on the kernel path.
#[test]
fn group_hosts_serve_the_transaction_api_on_the_kernel_path() {
    use chorus_group::kernel::netlab::NetLab;
    use chorus_group::runtime::Datapath;
    use std::io::BufRead;
    if let Some(reason) = chorus_group::kernel::unavailable_reason().or_else(NetLab::unavailable_reason) {
        eprintln!("SKIPPED: the kernel data path cannot run here: {reason}");
        return;
    }
    let scratch = Scratch::new("group-cli-kernel");
    let lab = NetLab::create(3).unwrap();
    let peers: Vec<String> = (0..3).map(|h| lab.host_ip(h).to_string()).collect();
    // Each host is alone in its namespace: a fixed port cannot collide with anything.
    let addrs: Vec<SocketAddr> = (0..3).map(|h| SocketAddr::new(lab.host_ip(h).into(), 22_600)).collect();
    let mut hosts = Hosts(Vec::new());
    for (i, addr) in addrs.iter().enumerate() {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &lab.namespace(i), env!("CARGO_BIN_EXE_chorus"), "group-host"]);
        command.args([
            "--listen",
            &addr.to_string(),
            "--tenant",
            &format!("7:{TOKEN_HEX}"),
            "--datapath",
            "kernel",
        ]);
        for peer in &peers {
            command.args(["--peer", peer]);
        }
        command.arg("--region-dir").arg(scratch.0.join(format!("host{i}")));
        let mut child =
            command.stdin(Stdio::null()).stdout(Stdio::piped()).spawn().expect("start chorus group-host");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        hosts.0.push(child);
        assert!(line.contains("(datapath kernel)"), "host {i} said: {line}");
    }
    let layout = TxnLayout::new(1024, 256);
    let mut spec =
        GroupSpec::new(addrs.clone(), TenantId(7), token(), GroupId(1), "t", layout.region_bytes());
    spec.datapath = Datapath::Kernel;
    let client = BlockingGroupClient::initialize(spec).unwrap();
    assert_eq!(client.client().datapath(), Datapath::Kernel);
    let mut txn = Txn::new(client, layout, 1);
    assert!(txn.wr_lock().unwrap());
    txn.append(&[(0, Bytes::from_static(b"alpha")), (100, Bytes::from_static(b"omega"))]).unwrap();
    txn.execute_and_advance().unwrap();
    txn.wr_unlock().unwrap();
    assert_eq!(txn.read(0, 0, 5).unwrap(), b"alpha", "read at the head");
    assert_eq!(txn.read(2, 100, 5).unwrap(), b"omega", "read at the tail");
    assert!(txn.executor().client().kernel_reads_served() >= 2, "reads answered by the XDP programs");
    drop(txn);
    drop(hosts);
    drop(lab);
}
