//! The reactor (crates/server/src/reactor.rs) through real `chorus node` processes: a node runs
//! its event loop as one thread that owns the client sockets and peer links; a connection
//! leaves it for a connection task at its first command the reactor does not run in place,
//! and must carry on exactly where it stopped. (The Hermes linearizability test in cluster.rs
//! runs its whole history through the reactor.) No timing assertions.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use support::loopback::Cluster;

mod support;

/// Read from `stream` until `expected` bytes arrived (or the deadline passes).
fn read_exactly(stream: &mut TcpStream, expected: usize) -> String {
    let mut received = Vec::new();
    let mut buf = [0u8; 4096];
    while received.len() < expected {
        let n = stream.read(&mut buf).expect("the replies arrive before the read timeout");
        assert!(n > 0, "closed after {:?}", String::from_utf8_lossy(&received));
        received.extend_from_slice(&buf[..n]);
    }
    String::from_utf8(received).expect("RESP text")
}

#[test]
fn a_pipeline_carries_on_in_order_across_the_hand_over_to_a_connection_task() {
    let cluster = Cluster::start(3, &["--protocol", "hermes"]);
    for node in 0..3 {
        let names = cluster.thread_names(node);
        assert!(names.contains("chorus-reactor"), "the node runs a reactor: {names:?}");
    }
    let mut stream = TcpStream::connect(cluster.nodes[0].client).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    // In one write: two commands the reactor runs, then MULTI (a connection task's), a
    // queued SET, EXEC, and a GET and a PING that arrived with them, parsed after the hand-over.
    let pipeline = "SET k first\r\nGET k\r\nMULTI\r\nSET k second\r\nEXEC\r\nGET k\r\nPING\r\n";
    stream.write_all(pipeline.as_bytes()).unwrap();
    let expected = "+OK\r\n$5\r\nfirst\r\n+OK\r\n+QUEUED\r\n*1\r\n+OK\r\n$6\r\nsecond\r\n+PONG\r\n";
    assert_eq!(read_exactly(&mut stream, expected.len()), expected);
    // Served by the connection task from now on, as before.
    stream.write_all(b"SET k third\r\nGET k\r\n").unwrap();
    let expected = "+OK\r\n$5\r\nthird\r\n";
    assert_eq!(read_exactly(&mut stream, expected.len()), expected);
    assert!(cluster.info_number(0, "chorus_requests_inline").unwrap_or(0) >= 2, "SET and GET ran in place");
}

#[test]
fn a_client_served_in_place_is_listed_and_can_be_killed() {
    let cluster = Cluster::start(3, &["--protocol", "hermes"]);
    let mut victim = TcpStream::connect(cluster.nodes[0].client).unwrap();
    victim.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    victim.write_all(b"SET v 1\r\n").unwrap();
    assert_eq!(read_exactly(&mut victim, 5), "+OK\r\n");
    let port = victim.local_addr().unwrap().port();
    let mut admin = cluster.client(0);
    let list: String = redis::cmd("CLIENT").arg("LIST").query(&mut admin).unwrap();
    let line = list
        .lines()
        .find(|line| line.contains(&format!("addr=127.0.0.1:{port} ")))
        .unwrap_or_else(|| panic!("the reactor's client is listed: {list}"));
    let id = line.split_whitespace().next().and_then(|field| field.strip_prefix("id=")).expect("an id");
    let killed: i64 = redis::cmd("CLIENT").arg("KILL").arg("ID").arg(id).query(&mut admin).unwrap();
    assert_eq!(killed, 1);
    // The reactor closes the socket: the client reads the end of the stream.
    let mut buf = [0u8; 16];
    assert_eq!(victim.read(&mut buf).expect("closed, not timed out"), 0);
}
