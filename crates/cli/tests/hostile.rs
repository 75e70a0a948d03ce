//! Hostile clients against real `chorus node` processes (issue 22): input that used to crash
//! or exhaust a node, limits on what one client may send or hold, and a flood of clients.
//! Each test sends its bytes over a socket and then checks that the node still serves.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

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

// ------------------------------------------------------------------ input limits (point 2)

#[test]
fn before_auth_a_command_has_at_most_10_arguments_and_16_kib_per_bulk() {
    let cluster = Cluster::start(1, &["--requirepass", "pw"]);
    let addr = cluster.nodes[0].client;
    let eleven: Vec<&str> = vec!["MSET", "a", "1", "b", "2", "c", "3", "d", "4", "e", "5"];
    let mut stream = connect(addr);
    stream.write_all(&resp_array(&eleven)).unwrap();
    assert_eq!(read_line(&mut stream), "-ERR Protocol error: unauthenticated multibulk length");
    assert!(closed(&mut stream));
    let mut stream = connect(addr);
    stream.write_all(format!("*2\r\n$4\r\nAUTH\r\n${}\r\n", 16 * 1024 + 1).as_bytes()).unwrap();
    assert_eq!(read_line(&mut stream), "-ERR Protocol error: unauthenticated bulk length");
    assert!(closed(&mut stream));
    // Once authenticated, the same command is fine.
    let mut stream = connect(addr);
    stream.write_all(&resp_array(&["AUTH", "pw"])).unwrap();
    stream.write_all(&resp_array(&eleven)).unwrap();
    assert_eq!(read_line(&mut stream), "+OK");
    assert_eq!(read_line(&mut stream), "+OK");
    ping(&cluster, 0);
}

/// INFO's `used_memory` of node `node`.
fn used_memory(cluster: &Cluster, node: usize) -> u64 {
    cluster.info_number(node, "used_memory").expect("INFO reports used_memory")
}

#[test]
fn a_declared_bulk_length_reserves_no_memory_until_the_bytes_arrive() {
    let cluster = Cluster::start(1, &[]);
    let before = used_memory(&cluster, 0);
    // Twenty clients each announce a 60 MB value (under the 64 MiB limit) and send no more.
    let header = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$60000000\r\n";
    let mut streams: Vec<TcpStream> = (0..20).map(|_| connect(cluster.nodes[0].client)).collect();
    for stream in &mut streams {
        stream.write_all(header).unwrap();
    }
    ping(&cluster, 0); // every header has been read by now: connections are served in turn
    let after = used_memory(&cluster, 0);
    assert!(
        after < before + 64 * 1024 * 1024,
        "used_memory went from {before} to {after} for 20 announced 60 MB values"
    );
}

#[test]
fn a_client_over_the_query_buffer_limit_is_told_and_disconnected() {
    let cluster = Cluster::start(1, &["--client-query-buffer-limit", "2mb", "--proto-max-bulk-len", "4mb"]);
    let value = vec![b'v'; 1024 * 1024];
    let mut stream = connect(cluster.nodes[0].client);
    let command = resp_array(&[&b"MSET"[..], b"a", &value, b"b", &value, b"c", &value]);
    // The server may close before it has read everything: a failed write is fine.
    let _ = stream.write_all(&command);
    let reply = read_line(&mut stream);
    assert!(reply.starts_with("-ERR Protocol error: the query buffer holds"), "{reply}");
    assert!(reply.contains("client-query-buffer-limit"), "{reply}");
    assert!(closed(&mut stream));
    // A bulk over proto-max-bulk-len is refused from its header.
    let mut stream = connect(cluster.nodes[0].client);
    stream.write_all(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5000000\r\n").unwrap();
    let reply = read_line(&mut stream);
    assert!(reply.starts_with("-ERR Protocol error: bulk length 5000000 exceeds the limit"), "{reply}");
    // Others are not affected, and a value under the limits is stored.
    let mut con = cluster.client(0);
    let _: () = redis::cmd("SET").arg("big").arg(&value[..]).query(&mut con).unwrap();
    let stored: Vec<u8> = redis::cmd("GET").arg("big").query(&mut con).unwrap();
    assert_eq!(stored.len(), value.len());
}

#[test]
fn small_values_do_not_keep_their_clients_read_buffers_alive() {
    let cluster = Cluster::start(1, &[]);
    let before = used_memory(&cluster, 0);
    // Each client stores one 5-byte value and leaves: its 16 KiB read buffer must go with it.
    for i in 0..1_000 {
        let mut stream = connect(cluster.nodes[0].client);
        let key = format!("key:{i}");
        stream.write_all(&resp_array(&["SET", &key, "small"])).unwrap();
        assert_eq!(read_line(&mut stream), "+OK");
    }
    let after = used_memory(&cluster, 0);
    // 1,000 keys cost a few hundred KiB; pinned buffers would cost 16 MiB.
    assert!(after < before + 6 * 1024 * 1024, "used_memory went from {before} to {after}");
}

// ---------------------------------------------------------------- connections (point 3)

#[test]
fn idle_clients_are_closed_after_timeout_and_half_sent_commands_after_their_deadline() {
    let cluster = Cluster::start(1, &["--timeout", "1", "--incomplete-command-timeout-ms", "500"]);
    let mut idle = connect(cluster.nodes[0].client);
    idle.write_all(b"PING\r\n").unwrap();
    assert_eq!(read_line(&mut idle), "+PONG");
    assert!(closed(&mut idle), "an idle client is closed after `timeout` seconds");
    let mut slow = connect(cluster.nodes[0].client);
    slow.write_all(b"*2\r\n$3\r\nGET\r\n").unwrap();
    let reply = read_line(&mut slow);
    assert_eq!(reply, "-ERR Protocol error: a command was not received in full within 500 ms");
    assert!(closed(&mut slow));
    ping(&cluster, 0);
}

/// The kernel's timer for the TCP socket from `local` to `remote` (/proc/net/tcp's `tr`
/// column: 0 none, 1 retransmission, 2 keepalive, ...).
fn tcp_timer(local: SocketAddr, remote: SocketAddr) -> Option<u32> {
    let hex = |addr: SocketAddr| {
        let std::net::IpAddr::V4(ip) = addr.ip() else { panic!("IPv4 only") };
        format!("{:08X}:{:04X}", u32::from_le_bytes(ip.octets()), addr.port())
    };
    let (local, remote) = (hex(local), hex(remote));
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.get(1) == Some(&local.as_str()) && fields.get(2) == Some(&remote.as_str()))
            .then(|| fields[5].split(':').next().and_then(|timer| timer.parse().ok()))
            .flatten()
    })
}

#[test]
fn client_sockets_have_tcp_keepalive() {
    let cluster = Cluster::start(1, &[]);
    let mut stream = connect(cluster.nodes[0].client);
    stream.write_all(b"PING\r\n").unwrap();
    assert_eq!(read_line(&mut stream), "+PONG");
    let server_side = (cluster.nodes[0].client, stream.local_addr().unwrap());
    match tcp_timer(server_side.0, server_side.1) {
        Some(timer) => assert_eq!(timer, 2, "the server's socket runs no keepalive timer"),
        None => eprintln!("SKIPPED: /proc/net/tcp does not show the connection; keepalive not checked"),
    }
}

/// Nodes start with at most 256 open files (soft and hard), so maxclients must shrink.
fn at_most_256_files(command: &mut std::process::Command) {
    use std::os::unix::process::CommandExt as _;
    // SAFETY: setrlimit is async-signal-safe and the closure allocates nothing.
    unsafe {
        command.pre_exec(|| {
            let limit = libc::rlimit { rlim_cur: 256, rlim_max: 256 };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[test]
fn a_flood_of_clients_is_refused_past_maxclients_and_peer_links_still_reconnect() {
    let mut cluster = Cluster::start_with(3, &[], at_most_256_files);
    let log = cluster.log(0);
    assert!(log.contains("maxclients lowered from 10000 to"), "{log}");
    let maxclients = cluster.info_number(0, "maxclients").unwrap() as usize;
    assert!(maxclients < 256, "maxclients {maxclients} leaves no descriptor for peers");
    // Flood node 0 well past maxclients; keep every connection open.
    let mut flood = Vec::new();
    let mut refused = 0;
    for _ in 0..maxclients + 100 {
        let mut stream = connect(cluster.nodes[0].client);
        stream.write_all(b"PING\r\n").unwrap();
        match read_line(&mut stream).as_str() {
            "+PONG" => flood.push(stream),
            "-ERR max number of clients reached" => refused += 1,
            other => panic!("unexpected reply under the flood: {other:?}"),
        }
    }
    assert!(refused >= 100, "only {refused} clients were refused");
    // Cut node 0's links to node 2 by restarting node 2: both directions must reconnect
    // while node 0 is full of clients.
    cluster.sigkill(2);
    cluster.restart(2, &[]);
    cluster.wait_ready(2, 2);
    drop(flood);
    cluster.wait_ready(0, 2);
}

// ------------------------------------------------------------------------ memory (point 10)

#[test]
fn past_maxmemory_writes_are_refused_with_oom_and_reads_and_deletes_still_work() {
    let cluster = Cluster::start(1, &["--maxmemory", "32mb"]);
    let mut con = cluster.client(0);
    let value = vec![b'x'; 256 * 1024];
    let mut stored = 0;
    let oom = loop {
        assert!(stored < 1_000, "250 MB written and never refused");
        let reply: redis::RedisResult<()> =
            redis::cmd("SET").arg(format!("big:{stored}")).arg(&value[..]).query(&mut con);
        match reply {
            Ok(()) => stored += 1,
            Err(error) => break error,
        }
    };
    assert_eq!(oom.code(), Some("OOM"), "{oom}");
    assert!(oom.to_string().contains("command not allowed when used memory > 'maxmemory'"), "{oom}");
    assert!(stored >= 64, "refused after only {stored} values of 256 KiB under a 32 MB limit");
    // Reads and deletes go on; once enough is deleted, writes are accepted again.
    let first: Vec<u8> = redis::cmd("GET").arg("big:0").query(&mut con).unwrap();
    assert_eq!(first.len(), value.len());
    let info: String = redis::cmd("INFO").arg("memory").query(&mut con).unwrap();
    assert!(info.contains("maxmemory:33554432") && info.contains("maxmemory_policy:noeviction"), "{info}");
    for i in 0..stored {
        let _: i64 = redis::cmd("DEL").arg(format!("big:{i}")).query(&mut con).unwrap();
    }
    cluster.wait_until("writes accepted again after the deletes", 0, |cluster| {
        let mut con = cluster.client(0);
        redis::cmd("SET").arg("again").arg("1").query::<()>(&mut con).is_ok()
    });
}
