//! Process-level tests: real `chorus node` processes on loopback, driven through the `redis`
//! crate. No timing assertions: every wait has a generous deadline that only guards against
//! hangs. Child processes are killed when a test ends, passes or panics.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;

use support::loopback::{assert_concurrent_clients_linearizable_with, Cluster, DEADLINE};

mod support;

// ------------------------------------------------------------------------ linearizability

#[test]
fn concurrent_clients_on_three_nodes_see_a_linearizable_history() {
    let cluster = assert_concurrent_clients_linearizable_with("hermes", &[]);
    // That history's reads went through the inline path (a connection running the read
    // through its event loop between turns), so the check above covers it.
    let inline: u64 = (0..3).map(|i| cluster.info_number(i, "chorus_requests_inline").unwrap_or(0)).sum();
    assert!(inline > 0, "no read was served inline");
}

// -------------------------------------------------------------------------------- SIGKILL

#[test]
fn after_a_sigkill_the_remaining_nodes_keep_acknowledged_data() {
    let mut cluster = Cluster::start(3, &[]);
    // Writes coordinated by nodes 0 and 1 (the survivors), each acknowledged.
    let mut written = Vec::new();
    for i in 0..40 {
        let mut con = cluster.client(i % 2);
        let (key, value) = (format!("key:{i}"), format!("value:{i}"));
        let _: String = redis::cmd("SET").arg(&key).arg(&value).query(&mut con).unwrap();
        written.push((key, value));
    }
    let mut con = cluster.client(0);
    for _ in 0..10 {
        let _: i64 = redis::cmd("INCR").arg("counter").query(&mut con).unwrap();
    }
    // Readers keep reading while node 2 dies.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let stop = stop.clone();
        let mut con = cluster.client(1);
        let written = written.clone();
        thread::spawn(move || {
            let mut reads = 0;
            while !stop.load(Ordering::Relaxed) || reads < written.len() {
                let (key, value) = &written[reads % written.len()];
                let got: Option<String> = redis::cmd("GET").arg(key).query(&mut con).unwrap();
                assert_eq!(got.as_ref(), Some(value), "{key} during the kill");
                reads += 1;
            }
            reads
        })
    };
    cluster.sigkill(2);
    stop.store(true, Ordering::Relaxed);
    assert!(reader.join().unwrap() >= written.len());
    // Both survivors still serve every acknowledged write.
    for survivor in [0, 1] {
        let mut con = cluster.client(survivor);
        for (key, value) in &written {
            let got: Option<String> = redis::cmd("GET").arg(key).query(&mut con).unwrap();
            assert_eq!(got.as_ref(), Some(value), "{key} at node {survivor} after the kill");
        }
        let counter: i64 = redis::cmd("GET").arg("counter").query(&mut con).unwrap();
        assert_eq!(counter, 10);
    }
}

// ------------------------------------------------------------------------------ bad input

/// Send raw bytes, then read everything until the server closes the connection.
fn raw_exchange(addr: SocketAddr, input: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(DEADLINE)).unwrap();
    stream.write_all(input).unwrap();
    let mut output = Vec::new();
    let _ = stream.read_to_end(&mut output);
    String::from_utf8_lossy(&output).into_owned()
}

#[test]
fn bad_input_gets_a_clear_error_and_the_node_keeps_serving() {
    let cluster = Cluster::start(2, &["--value-bytes-max", "1024"]);
    let addr = cluster.nodes[0].client;
    // Malformed frame after a good command: the good one is answered, then an error, then close.
    let output = raw_exchange(addr, b"*1\r\n$4\r\nPING\r\n*x\r\n");
    assert_eq!(output, "+PONG\r\n-ERR Protocol error: invalid multibulk length\r\n");
    // A value over the size limit.
    let output = raw_exchange(addr, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2000\r\n");
    assert!(output.starts_with("-ERR Protocol error: bulk length 2000 exceeds the limit"), "{output}");
    // QUIT closes cleanly after +OK.
    assert_eq!(raw_exchange(addr, b"QUIT\r\n"), "+OK\r\n");

    let mut con = cluster.client(0);
    let error = redis::cmd("GET").query::<Option<String>>(&mut con).unwrap_err();
    assert!(error.to_string().contains("wrong number of arguments for 'get' command"), "{error}");
    let error = redis::cmd("INCRBY").arg("n").arg("ten").query::<i64>(&mut con).unwrap_err();
    assert!(error.to_string().contains("not an integer"), "{error}");
    let _: String = redis::cmd("SET").arg("word").arg("hello").query(&mut con).unwrap();
    let error = redis::cmd("INCR").arg("word").query::<i64>(&mut con).unwrap_err();
    assert!(error.to_string().contains("not an integer"), "{error}");
    let error = redis::cmd("FROB").arg("x").query::<String>(&mut con).unwrap_err();
    assert!(error.to_string().contains("unknown command 'FROB'"), "{error}");

    // A client that disconnects mid-pipeline: many INCRs and half a command, then gone.
    {
        let mut stream = TcpStream::connect(addr).unwrap();
        let mut pipeline = Vec::new();
        for _ in 0..200 {
            pipeline.extend_from_slice(b"*2\r\n$4\r\nINCR\r\n$7\r\npipeline\r\n");
        }
        pipeline.extend_from_slice(b"*2\r\n$4\r\nINCR\r\n$7\r\npipe");
        stream.write_all(&pipeline).unwrap();
    }
    // Garbage on the peer port closes that connection only.
    let peer_output = raw_exchange(cluster.nodes[0].peer, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(!peer_output.contains("HTTP"), "{peer_output}");

    // The node still serves everyone, and what it acknowledged is still there on both nodes.
    let mut con = cluster.client(0);
    let pong: String = redis::cmd("PING").query(&mut con).unwrap();
    assert_eq!(pong, "PONG");
    let _: String = redis::cmd("SET").arg("after").arg("ok").query(&mut con).unwrap();
    let mut other = cluster.client(1);
    let after: Option<String> = redis::cmd("GET").arg("after").query(&mut other).unwrap();
    assert_eq!(after.as_deref(), Some("ok"));
    let word: Option<String> = redis::cmd("GET").arg("word").query(&mut other).unwrap();
    assert_eq!(word.as_deref(), Some("hello"));
    let counted: Option<i64> = redis::cmd("GET").arg("pipeline").query(&mut other).unwrap();
    assert!(counted.unwrap_or(0) <= 200);
}

#[test]
fn a_node_with_a_bad_config_names_the_field() {
    let output = Command::new(env!("CARGO_BIN_EXE_chorus"))
        .args(["node", "--node-id", "0", "--peer", "0=127.0.0.1:1"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("`cluster_token`"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
}
