//! Pub/Sub through the real binary (issue 19, point 4): Redis 7's replies byte for byte in
//! RESP2 and RESP3, messages published at one replica reaching subscribers on every replica
//! (with the `redis` crate as the client), PUBLISH reaching every node of a sharded cluster
//! and SPUBLISH its shard's group, and a subscriber that stops reading closed at its output
//! buffer limit while the others keep receiving.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use chorus_core::slots::key_slot;
use support::loopback::Cluster;
use support::query;
use support::up::{free_port_run, Up};

mod support;

const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// A client that sends RESP arrays and reads whole replies as raw bytes.
struct Raw {
    stream: TcpStream,
    buffer: Vec<u8>,
}

impl Raw {
    fn connect(addr: SocketAddr) -> Raw {
        let stream = TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
        Raw { stream, buffer: Vec::new() }
    }

    fn send(&mut self, line: &str) {
        let words: Vec<&str> = line.split(' ').collect();
        let mut out = format!("*{}\r\n", words.len());
        for word in words {
            out.push_str(&format!("${}\r\n{word}\r\n", word.len()));
        }
        self.stream.write_all(out.as_bytes()).unwrap();
    }

    /// The next `count` replies (or pushes), raw.
    fn replies(&mut self, count: usize) -> String {
        let mut out = String::new();
        for _ in 0..count {
            let end = loop {
                if let Some(end) = value_end(&self.buffer, 0) {
                    break end;
                }
                let mut chunk = [0u8; 4096];
                let read =
                    self.stream.read(&mut chunk).unwrap_or_else(|error| panic!("after {out:?}: {error}"));
                assert!(read > 0, "closed after {out:?}");
                self.buffer.extend_from_slice(&chunk[..read]);
            };
            out.push_str(&String::from_utf8_lossy(&self.buffer[..end]));
            self.buffer.drain(..end);
        }
        out
    }

    fn run(&mut self, line: &str, replies: usize) -> String {
        self.send(line);
        self.replies(replies)
    }
}

/// Where the RESP value starting at `at` ends, if it is complete.
fn value_end(buffer: &[u8], at: usize) -> Option<usize> {
    let line_end = at + buffer.get(at..)?.windows(2).position(|pair| pair == b"\r\n")?;
    let line = std::str::from_utf8(&buffer[at + 1..line_end]).unwrap();
    let next = line_end + 2;
    match buffer[at] {
        b'+' | b'-' | b':' | b'_' | b',' | b'#' => Some(next),
        b'$' | b'=' | b'!' => match line.parse::<i64>().unwrap() {
            -1 => Some(next),
            length => (buffer.len() >= next + length as usize + 2).then_some(next + length as usize + 2),
        },
        b'*' | b'>' | b'~' | b'%' => {
            let count = line.parse::<i64>().unwrap();
            let items = if buffer[at] == b'%' { 2 * count } else { count };
            (0..items.max(0)).try_fold(next, |at, _| value_end(buffer, at))
        }
        other => panic!("unexpected RESP type {:?}", char::from(other)),
    }
}

/// The exchange of `pubsub_replies_are_those_of_redis_7`: (client, command, replies read
/// after it, from which client). `None` as the command: only read.
const SCRIPT: &[(usize, Option<&str>, usize, usize)] = &[
    (0, Some("UNSUBSCRIBE"), 1, 0),
    (0, Some("PUNSUBSCRIBE"), 1, 0),
    (0, Some("SUBSCRIBE ch1 ch2"), 2, 0),
    (0, Some("PSUBSCRIBE c*"), 1, 0),
    (0, Some("SSUBSCRIBE s1"), 1, 0),
    (0, Some("PING"), 1, 0),
    (0, Some("PING hi"), 1, 0),
    (0, Some("GET k"), 1, 0),
    (0, Some("CLIENT ID"), 1, 0),
    (1, Some("PUBLISH ch1 hello"), 1, 1),
    (0, None, 2, 0),
    (1, Some("SPUBLISH s1 x"), 1, 1),
    (0, None, 1, 0),
    (1, Some("PUBSUB CHANNELS ch1"), 1, 1),
    (1, Some("PUBSUB NUMSUB ch1 zz"), 1, 1),
    (1, Some("PUBSUB NUMPAT"), 1, 1),
    (1, Some("PUBSUB SHARDCHANNELS"), 1, 1),
    (1, Some("PUBSUB SHARDNUMSUB s1"), 1, 1),
    (1, Some("PUBSUB FOO"), 1, 1),
    (1, Some("SUBSCRIBE"), 1, 1),
    (0, Some("UNSUBSCRIBE ch1"), 1, 0),
    (0, Some("UNSUBSCRIBE"), 1, 0),
    (0, Some("PUNSUBSCRIBE"), 1, 0),
    (0, Some("SUNSUBSCRIBE"), 1, 0),
    (0, Some("SUNSUBSCRIBE"), 1, 0),
    (0, Some("PING"), 1, 0),
    (0, Some("SUBSCRIBE x"), 1, 0),
    (0, Some("RESET"), 1, 0),
    (0, Some("PING"), 1, 0),
    (2, Some("UNSUBSCRIBE"), 1, 2),
    (2, Some("SUBSCRIBE ch1"), 1, 2),
    (2, Some("PSUBSCRIBE c*"), 1, 2),
    (2, Some("PING"), 1, 2),
    (2, Some("GET k"), 1, 2),
    (1, Some("PUBLISH ch1 m3"), 1, 1),
    (2, None, 2, 2),
    (2, Some("PUBLISH ch1 self"), 3, 2),
];

/// What Redis 7.0.15 answers to [`SCRIPT`], step by step (client 2 speaks RESP3).
const REDIS_7: &[&str] = &[
    "*3\r\n$11\r\nunsubscribe\r\n$-1\r\n:0\r\n",
    "*3\r\n$12\r\npunsubscribe\r\n$-1\r\n:0\r\n",
    "*3\r\n$9\r\nsubscribe\r\n$3\r\nch1\r\n:1\r\n*3\r\n$9\r\nsubscribe\r\n$3\r\nch2\r\n:2\r\n",
    "*3\r\n$10\r\npsubscribe\r\n$2\r\nc*\r\n:3\r\n",
    "*3\r\n$10\r\nssubscribe\r\n$2\r\ns1\r\n:1\r\n",
    "*2\r\n$4\r\npong\r\n$0\r\n\r\n",
    "*2\r\n$4\r\npong\r\n$2\r\nhi\r\n",
    "-ERR Can't execute 'get': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context\r\n",
    "-ERR Can't execute 'client|id': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context\r\n",
    ":2\r\n",
    "*3\r\n$7\r\nmessage\r\n$3\r\nch1\r\n$5\r\nhello\r\n*4\r\n$8\r\npmessage\r\n$2\r\nc*\r\n$3\r\nch1\r\n$5\r\nhello\r\n",
    ":1\r\n",
    "*3\r\n$8\r\nsmessage\r\n$2\r\ns1\r\n$1\r\nx\r\n",
    "*1\r\n$3\r\nch1\r\n",
    "*4\r\n$3\r\nch1\r\n:1\r\n$2\r\nzz\r\n:0\r\n",
    ":1\r\n",
    "*1\r\n$2\r\ns1\r\n",
    "*2\r\n$2\r\ns1\r\n:1\r\n",
    "-ERR unknown subcommand 'FOO'. Try PUBSUB HELP.\r\n",
    "-ERR wrong number of arguments for 'subscribe' command\r\n",
    "*3\r\n$11\r\nunsubscribe\r\n$3\r\nch1\r\n:2\r\n",
    "*3\r\n$11\r\nunsubscribe\r\n$3\r\nch2\r\n:1\r\n",
    "*3\r\n$12\r\npunsubscribe\r\n$2\r\nc*\r\n:0\r\n",
    "*3\r\n$12\r\nsunsubscribe\r\n$2\r\ns1\r\n:0\r\n",
    "*3\r\n$12\r\nsunsubscribe\r\n$-1\r\n:0\r\n",
    "+PONG\r\n",
    "*3\r\n$9\r\nsubscribe\r\n$1\r\nx\r\n:1\r\n",
    "+RESET\r\n",
    "+PONG\r\n",
    ">3\r\n$11\r\nunsubscribe\r\n_\r\n:0\r\n",
    ">3\r\n$9\r\nsubscribe\r\n$3\r\nch1\r\n:1\r\n",
    ">3\r\n$10\r\npsubscribe\r\n$2\r\nc*\r\n:2\r\n",
    "+PONG\r\n",
    "_\r\n",
    ":2\r\n",
    ">3\r\n$7\r\nmessage\r\n$3\r\nch1\r\n$2\r\nm3\r\n>4\r\n$8\r\npmessage\r\n$2\r\nc*\r\n$3\r\nch1\r\n$2\r\nm3\r\n",
    ">3\r\n$7\r\nmessage\r\n$3\r\nch1\r\n$4\r\nself\r\n>4\r\n$8\r\npmessage\r\n$2\r\nc*\r\n$3\r\nch1\r\n$4\r\nself\r\n:2\r\n",
];

/// Run [`SCRIPT`] against the server at `addr`; each step's raw replies.
fn run_script(addr: SocketAddr) -> Vec<String> {
    let mut clients = [Raw::connect(addr), Raw::connect(addr), Raw::connect(addr)];
    clients[2].send("HELLO 3");
    clients[2].replies(1);
    SCRIPT
        .iter()
        .map(|&(to, command, replies, from)| {
            if let Some(command) = command {
                clients[to].send(command);
            }
            clients[from].replies(replies)
        })
        .collect()
}

/// A Redis server of our own on a free port, stopped when dropped.
struct RedisServer(Child);

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn redis_server() -> Option<(RedisServer, SocketAddr)> {
    let port = free_port_run(1, 9);
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let server = RedisServer(child);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let started = Instant::now();
    while TcpStream::connect(addr).is_err() {
        assert!(started.elapsed() < READ_TIMEOUT, "redis-server did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    Some((server, addr))
}

#[test]
fn pubsub_replies_are_those_of_redis_7_byte_for_byte() {
    // The transcript is Redis' own: checked against a real redis-server when there is one.
    match redis_server() {
        Some((_server, addr)) => {
            let redis = run_script(addr);
            for (step, (got, expected)) in redis.iter().zip(REDIS_7).enumerate() {
                if got != expected {
                    let version = Command::new("redis-server").arg("--version").output().unwrap();
                    eprintln!(
                        "redis-server answers step {step} ({:?}) differently ({got:?}): the transcript is \
                         Redis 7.0's; this one is {}",
                        SCRIPT[step],
                        String::from_utf8_lossy(&version.stdout)
                    );
                }
            }
        }
        None => {
            eprintln!("SKIPPED checking the transcript against Redis itself: redis-server is not installed")
        }
    }
    let cluster = Cluster::start(1, &["--protocol", "hermes"]);
    let chorus = run_script(cluster.nodes[0].client);
    for (step, (got, expected)) in chorus.iter().zip(REDIS_7).enumerate() {
        assert_eq!(got, expected, "step {step}: {:?}", SCRIPT[step]);
    }
}

/// Read `count` messages from `pubsub`: (channel, payload).
fn messages(pubsub: &mut redis::PubSub, count: usize) -> Vec<(String, String)> {
    (0..count)
        .map(|_| {
            let message = pubsub.get_message().expect("a message within the read timeout");
            (message.get_channel_name().to_string(), message.get_payload().unwrap())
        })
        .collect()
}

/// A `redis` crate subscriber at node `node` (its connection lives as long as the test).
fn subscriber(cluster: &Cluster, node: usize) -> redis::PubSub<'static> {
    let con = Box::leak(Box::new(cluster.client(node)));
    let pubsub = con.as_pubsub();
    pubsub.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    pubsub
}

#[test]
fn messages_published_at_any_replica_reach_subscribers_on_every_replica() {
    let mut cluster = Cluster::start(3, &["--protocol", "hermes"]);
    let mut publisher = cluster.client(0);
    // A channel subscriber on each node (the one on node 2 also has a pattern), and a
    // pattern subscriber on node 1.
    let mut subscribers: Vec<redis::PubSub> = (0..3).map(|node| subscriber(&cluster, node)).collect();
    for pubsub in &mut subscribers {
        pubsub.subscribe("news").unwrap();
    }
    subscribers[2].psubscribe("ne*").unwrap();
    let mut pattern = subscriber(&cluster, 1);
    pattern.psubscribe("n?ws").unwrap();

    // PUBLISH counts this node's receivers, as a Redis Cluster node does.
    let sent: Vec<String> = (0..200).map(|i| format!("m{i}")).collect();
    for message in &sent {
        let receivers: u64 = redis::cmd("PUBLISH").arg("news").arg(message).query(&mut publisher).unwrap();
        assert_eq!(receivers, 1, "node 0 has one subscriber");
    }
    let expected: Vec<(String, String)> = sent.iter().map(|m| ("news".to_string(), m.clone())).collect();
    assert_eq!(messages(&mut subscribers[0], 200), expected, "on the publisher's node");
    assert_eq!(messages(&mut subscribers[1], 200), expected, "on another replica, in order");
    assert_eq!(messages(&mut pattern, 200), expected, "a pattern on another replica");
    // Node 2's client has a channel and a pattern that match: two deliveries of each.
    let both: Vec<(String, String)> = expected.iter().flat_map(|m| [m.clone(), m.clone()]).collect();
    assert_eq!(messages(&mut subscribers[2], 400), both);

    // Any replica publishes; the introspection is each node's own.
    let mut at_two = cluster.client(2);
    assert_eq!(query::<u64>(&mut at_two, "PUBLISH news from-two"), 2, "a channel and a pattern here");
    let from_two = [("news".to_string(), "from-two".to_string())];
    assert_eq!(messages(&mut subscribers[0], 1), from_two);
    assert_eq!(messages(&mut subscribers[1], 1), from_two);
    assert_eq!(messages(&mut pattern, 1), from_two);
    assert_eq!(messages(&mut subscribers[2], 2).len(), 2);
    assert_eq!(query::<(String, u64)>(&mut at_two, "PUBSUB NUMSUB news"), ("news".to_string(), 1));
    assert_eq!(query::<u64>(&mut at_two, "PUBSUB NUMPAT"), 1);

    // A replica that dies takes its subscribers with it; the others keep receiving, in order.
    cluster.sigkill(2);
    for message in &sent[..20] {
        let _: u64 = redis::cmd("PUBLISH").arg("news").arg(message).query(&mut publisher).unwrap();
    }
    assert_eq!(messages(&mut subscribers[1], 20), expected[..20]);
    assert_eq!(messages(&mut pattern, 20), expected[..20]);
}

/// One subscription over a raw connection at `port`: the confirmation is checked.
fn raw_subscriber(port: u16, command: &str, channel: &str) -> Raw {
    let mut raw = Raw::connect(SocketAddr::from(([127, 0, 0, 1], port)));
    let confirmation = raw.run(&format!("{command} {channel}"), 1);
    assert!(confirmation.contains(channel) && confirmation.ends_with(":1\r\n"), "{confirmation}");
    raw
}

fn message_of(raw: &mut Raw) -> String {
    let push = raw.replies(1);
    push.rsplit("\r\n").nth(1).unwrap().to_string()
}

#[test]
fn publish_reaches_every_node_of_a_sharded_cluster_and_spublish_the_owning_group() {
    // 2 groups of 2: nodes 0-1 own slots 0-8191, nodes 2-3 the rest.
    let port = free_port_run(12, 7);
    let (up, _) = Up::start(port, 4, &["--shards", "2", "--replicas", "2", "--in-memory"], &[]).unwrap();
    let mut subscribers: Vec<Raw> =
        (0..4).map(|node| raw_subscriber(port + node, "SUBSCRIBE", "news")).collect();
    let mut publisher = support::up::client(port);

    // The metadata service's links come up after the nodes serve: publish until every node
    // has heard (Pub/Sub is at most once), then every message must arrive, in order.
    let mut heard = [false; 4];
    while !heard.iter().all(|heard| *heard) {
        let _: u64 = redis::cmd("PUBLISH").arg("news").arg("probe").query(&mut publisher).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        for (node, subscriber) in subscribers.iter_mut().enumerate() {
            subscriber.stream.set_nonblocking(true).unwrap();
            let mut chunk = [0u8; 4096];
            loop {
                match subscriber.stream.read(&mut chunk) {
                    Ok(read) if read > 0 => subscriber.buffer.extend_from_slice(&chunk[..read]),
                    Err(error) if error.kind() == ErrorKind::WouldBlock => break,
                    other => panic!("subscriber at node {node}: {other:?}"),
                }
            }
            subscriber.stream.set_nonblocking(false).unwrap();
            while value_end(&subscriber.buffer, 0).is_some() {
                assert_eq!(message_of(subscriber), "probe");
                heard[node] = true;
            }
        }
    }
    for i in 0..50 {
        let receivers: u64 =
            redis::cmd("PUBLISH").arg("news").arg(format!("m{i}")).query(&mut publisher).unwrap();
        assert_eq!(receivers, 1, "one subscriber on the publishing node");
    }
    for (node, subscriber) in subscribers.iter_mut().enumerate() {
        let got: Vec<String> = (0..50).map(|_| message_of(subscriber)).collect();
        assert_eq!(got, (0..50).map(|i| format!("m{i}")).collect::<Vec<_>>(), "node {node}");
    }

    // A shard channel lives in its slot's group: SSUBSCRIBE elsewhere is redirected, and
    // SPUBLISH reaches that group's subscribers only.
    let channel = (0..).map(|i| format!("orders{i}")).find(|name| key_slot(name.as_bytes()) >= 8192).unwrap();
    let mut elsewhere = Raw::connect(SocketAddr::from(([127, 0, 0, 1], port)));
    let refusal = elsewhere.run(&format!("SSUBSCRIBE {channel}"), 1);
    assert!(refusal.starts_with("-MOVED"), "{refusal}");
    let mut shard_subscribers =
        [raw_subscriber(port + 2, "SSUBSCRIBE", &channel), raw_subscriber(port + 3, "SSUBSCRIBE", &channel)];
    let mut at_three = support::up::client(port + 3);
    for i in 0..20 {
        let receivers: u64 =
            redis::cmd("SPUBLISH").arg(&channel).arg(format!("s{i}")).query(&mut at_three).unwrap();
        assert_eq!(receivers, 1);
    }
    for subscriber in &mut shard_subscribers {
        let got: Vec<String> = (0..20).map(|_| message_of(subscriber)).collect();
        assert_eq!(got, (0..20).map(|i| format!("s{i}")).collect::<Vec<_>>());
    }
    let error = redis::cmd("SPUBLISH").arg(&channel).arg("x").query::<u64>(&mut publisher).unwrap_err();
    assert_eq!(error.code(), Some("MOVED"), "{error}");
    up.stop();
}

fn info_number(con: &mut redis::Connection, field: &str) -> u64 {
    let info: String = query(con, "INFO stats");
    let prefix = format!("{field}:");
    info.lines().find_map(|line| line.strip_prefix(&prefix)).expect(field).trim().parse().unwrap()
}

#[test]
fn a_subscriber_that_stops_reading_is_closed_at_its_output_buffer_limit() {
    let cluster = Cluster::start(2, &["--protocol", "hermes"]);
    let mut admin = cluster.client(1);
    let mut limit = redis::cmd("CONFIG");
    limit.arg("SET").arg("client-output-buffer-limit").arg("pubsub 1mb 512kb 60");
    limit.query::<()>(&mut admin).unwrap();
    // The hostile subscriber never reads; a well-behaved one on the same node does.
    let mut hostile = Raw::connect(cluster.nodes[1].client);
    hostile.run("SUBSCRIBE feed", 1);
    let mut fast_con = cluster.client(1);
    let mut fast = fast_con.as_pubsub();
    fast.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
    fast.subscribe("feed").unwrap();

    // Messages published at the other node, 64 KiB each, until node 1 closes the hostile
    // one (the kernel's socket buffers take several MB first).
    let mut publisher = cluster.client(0);
    let payload = "x".repeat(64 * 1024);
    let (mut published, mut received) = (0, 0);
    // Four messages a round: what waits for the fast subscriber stays far below the 512 KiB
    // soft limit even when the kernel buffers none of it (16 a round, 1 MiB, got the fast
    // one closed on a loaded machine in CI).
    while info_number(&mut admin, "client_output_buffer_limit_disconnections") == 0 {
        for _ in 0..4 {
            let message = format!("{published:06}{payload}");
            let _: u64 = redis::cmd("PUBLISH").arg("feed").arg(message).query(&mut publisher).unwrap();
            published += 1;
        }
        // Keep up: the fast subscriber must never come near the limit.
        for _ in 0..4 {
            let message: String = fast.get_message().unwrap().get_payload().unwrap();
            assert_eq!(message[..6], format!("{received:06}"), "in order, none lost");
            received += 1;
        }
        assert!(published < 4096, "not closed after {published} messages of 64 KiB");
    }
    assert!(published > 16, "closed before its limit: {published} messages");

    // It is gone: what it had not read is dropped and its connection closed, and only the
    // fast subscriber is left, still receiving every message in order.
    let mut drained = 0u64;
    let mut chunk = vec![0u8; 1 << 16];
    loop {
        match hostile.stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(read) => drained += read as u64,
            Err(error) if error.kind() == ErrorKind::ConnectionReset => break,
            Err(error) => panic!("the hostile subscriber was not closed: {error} after {drained} bytes"),
        }
    }
    eprintln!("closed after {published} messages of 64 KiB; it had {drained} bytes in its socket");
    assert!(drained < (published as u64) * 65 * 1024, "it got everything");
    let list: String = query(&mut admin, "CLIENT LIST TYPE pubsub");
    assert_eq!(list.lines().count(), 1, "{list}");
    assert!(list.contains("sub=1") && list.contains("flags=P") && list.contains("cmd=subscribe"), "{list}");
    assert_eq!(query::<(String, u64)>(&mut admin, "PUBSUB NUMSUB feed"), ("feed".to_string(), 1));
}
