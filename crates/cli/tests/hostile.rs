//! Hostile clients against real `chorus node` processes (issue 22): input that used to crash
//! or exhaust a node, limits on what one client may send or hold, and a flood of clients.
//! Each test sends its bytes over a socket and then checks that the node still serves.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use support::loopback::{Cluster, DEADLINE};

mod support;

/// One RESP array of bulk strings.
fn resp_array<A: AsRef<[u8]>>(args: &[A]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        let arg = arg.as_ref();
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    out
}

fn connect(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(DEADLINE)).unwrap();
    stream
}

/// Read one reply line (`+...`, `-...`, `:...`) or whatever arrives before the server closes.
fn read_line(stream: &mut TcpStream) -> String {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while !line.ends_with(b"\r\n") {
        match stream.read(&mut byte) {
            Ok(1) => line.push(byte[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&line).trim_end().to_string()
}

/// Whether the server closes `stream` (EOF or reset) within the read timeout.
fn closed(stream: &mut TcpStream) -> bool {
    let mut rest = Vec::new();
    match stream.read_to_end(&mut rest) {
        Ok(_) => true,
        Err(error) => !matches!(error.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
    }
}

fn ping(cluster: &Cluster, node: usize) {
    let mut con = cluster.client(node);
    let pong: String = redis::cmd("PING").query(&mut con).unwrap();
    assert_eq!(pong, "PONG");
}

#[test]
fn a_command_nested_200000_sessions_deep_is_an_error_not_a_crash() {
    let cluster = Cluster::start(1, &["--protocol", "raftlog"]);
    let mut args: Vec<&str> = Vec::with_capacity(600_002);
    for _ in 0..200_000 {
        args.extend(["SESSION", "1", "1"]);
    }
    args.extend(["GET", "k"]);
    let mut stream = connect(cluster.nodes[0].client);
    stream.write_all(&resp_array(&args)).unwrap();
    let reply = read_line(&mut stream);
    assert_eq!(reply, "-ERR SESSION cannot be nested");
    // The same connection and new ones keep working.
    stream.write_all(&resp_array(&["PING"])).unwrap();
    assert_eq!(read_line(&mut stream), "+PONG");
    ping(&cluster, 0);
}
