//! Online resharding through real processes (issue 20 point 4; docs/decisions.md, decision
//! 13): `chorus up --shards 2`, clients that follow -MOVED, -ASK and -TRYAGAIN as a cluster
//! client does writing and reading while slots with keys move back and forth between the
//! groups, and their history checked per key by the simulator's linearizability checker.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use chorus_core::slots::key_slot;
use chorus_core::{Command, CommandError, Outcome, RmwOp, Time};
use chorus_sim::checker::{check_history, CheckerConfig};
use chorus_sim::history::{Completion, History, Operation};
use support::up::{client, free_port_run, Up};
use support::{error_of, query};

mod support;

/// Registers and counters in two slots: `{a}` (slot 15495) and `{b}` (slot 3300).
const KEYS: [&str; 6] = ["{a}reg:0", "{a}reg:1", "{a}ctr", "{b}reg:0", "{b}reg:1", "{b}ctr"];

/// A client of the cluster: where it sends a command first, and how it follows redirects.
struct ClusterClient {
    ports: Vec<u16>,
    /// The port each slot was last served at.
    routes: std::collections::BTreeMap<u16, u16>,
    connections: std::collections::BTreeMap<u16, redis::Connection>,
    redirects: u64,
    asks: u64,
    try_agains: u64,
}

/// What a reply means for the history; `None`: the outcome is unknown.
fn outcome_of(command: &Command, reply: redis::RedisResult<redis::Value>) -> Option<Outcome> {
    let value = match reply {
        Ok(value) => value,
        Err(error) if error.to_string().contains("not an integer") => {
            return Some(Outcome::Error(CommandError::NotInteger))
        }
        Err(_) => return None,
    };
    let bulk = |value: &redis::Value| match value {
        redis::Value::BulkString(bytes) => Some(Bytes::copy_from_slice(bytes)),
        _ => None,
    };
    Some(match command {
        Command::Read { .. } => Outcome::Value(bulk(&value)),
        Command::Write { .. } => Outcome::Written,
        Command::Rmw { op: RmwOp::IncrementBy(_), .. } => {
            Outcome::Integer(redis::from_redis_value(&value).ok()?)
        }
        Command::Rmw { op: RmwOp::CompareAndSwap { .. }, .. } => {
            let (swapped, previous): (i64, Option<Vec<u8>>) = redis::from_redis_value(&value).ok()?;
            Outcome::Cas { swapped: swapped == 1, previous: previous.map(Bytes::from) }
        }
        other => unreachable!("not issued: {other:?}"),
    })
}

fn redis_command(command: &Command) -> redis::Cmd {
    match command {
        Command::Read { key } => redis::cmd("GET").arg(key.as_ref()).clone(),
        Command::Write { key, value: Some(value) } => {
            redis::cmd("SET").arg(key.as_ref()).arg(value.as_ref()).clone()
        }
        Command::Rmw { key, op: RmwOp::IncrementBy(delta) } => {
            redis::cmd("INCRBY").arg(key.as_ref()).arg(*delta).clone()
        }
        Command::Rmw { key, op: RmwOp::CompareAndSwap { expected: Some(expected), new: Some(new) } } => {
            redis::cmd("CAS").arg(key.as_ref()).arg(expected.as_ref()).arg(new.as_ref()).clone()
        }
        other => unreachable!("not issued: {other:?}"),
    }
}

impl ClusterClient {
    fn new(ports: Vec<u16>) -> ClusterClient {
        ClusterClient {
            ports,
            routes: Default::default(),
            connections: Default::default(),
            redirects: 0,
            asks: 0,
            try_agains: 0,
        }
    }

    fn connection(&mut self, port: u16) -> Option<&mut redis::Connection> {
        if let std::collections::btree_map::Entry::Vacant(entry) = self.connections.entry(port) {
            let con = redis::Client::open(format!("redis://127.0.0.1:{port}/")).ok()?;
            let con = con.get_connection_with_timeout(Duration::from_secs(2)).ok()?;
            con.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
            entry.insert(con);
        }
        self.connections.get_mut(&port)
    }

    /// Run `command`, following redirects as redis-py's RedisCluster does. `None`: unknown.
    fn run(&mut self, command: &Command, first: u16) -> Option<Outcome> {
        let slot = key_slot(command.key());
        let mut port = *self.routes.get(&slot).unwrap_or(&first);
        let mut asking = false;
        for _ in 0..200 {
            let cmd = redis_command(command);
            let Some(con) = self.connection(port) else {
                port = self.ports[(port as usize + 1) % self.ports.len()];
                continue;
            };
            if asking && redis::cmd("ASKING").query::<()>(con).is_err() {
                self.connections.remove(&port);
                return None;
            }
            let reply = cmd.query::<redis::Value>(con);
            asking = false;
            match &reply {
                Err(error) if error.code() == Some("MOVED") => {
                    self.redirects += 1;
                    port = redirect_port(error);
                    self.routes.insert(slot, port);
                }
                Err(error) if error.code() == Some("ASK") => {
                    self.asks += 1;
                    port = redirect_port(error);
                    asking = true;
                }
                Err(error) if error.code() == Some("TRYAGAIN") => {
                    self.try_agains += 1;
                    thread::sleep(Duration::from_millis(5));
                }
                Err(error) if error.is_io_error() || error.is_timeout() => {
                    self.connections.remove(&port);
                    return None;
                }
                _ => return outcome_of(command, reply),
            }
        }
        panic!("{command:?} redirected 200 times");
    }
}

fn redirect_port(error: &redis::RedisError) -> u16 {
    let (node, _) = error.redirect_node().expect("a redirect names a node");
    node.rsplit(':').next().unwrap().parse().unwrap()
}

/// Six clients over the registers and counters until `stop`; their history.
fn run_clients(ports: Vec<u16>, stop: Arc<AtomicBool>) -> (History, [u64; 3]) {
    let origin = Instant::now();
    let workers: Vec<_> = (0..6)
        .map(|client| {
            let (ports, stop) = (ports.clone(), stop.clone());
            thread::spawn(move || {
                let mut cluster = ClusterClient::new(ports.clone());
                let mut operations = Vec::new();
                let mut last_seen: Option<Bytes> = None;
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let key = Bytes::from_static(KEYS[(i as usize * 7 + client) % KEYS.len()].as_bytes());
                    let fresh = Bytes::from(format!("c{client}-{i}"));
                    let command = if key.ends_with(b"ctr") {
                        if i.is_multiple_of(3) {
                            Command::Read { key }
                        } else {
                            Command::Rmw { key, op: RmwOp::IncrementBy(1) }
                        }
                    } else {
                        match i % 4 {
                            0 => Command::Read { key },
                            1 => Command::Write { key, value: Some(fresh) },
                            2 => Command::Rmw {
                                key,
                                op: RmwOp::CompareAndSwap {
                                    expected: Some(
                                        last_seen.clone().unwrap_or_else(|| Bytes::from_static(b"none")),
                                    ),
                                    new: Some(fresh),
                                },
                            },
                            _ => Command::Read { key },
                        }
                    };
                    let invoke = Time::from_nanos(origin.elapsed().as_nanos() as u64);
                    let first = ports[(i as usize + client) % ports.len()];
                    let outcome = cluster.run(&command, first);
                    let at = Time::from_nanos(origin.elapsed().as_nanos() as u64);
                    if let Some(Outcome::Value(Some(value)) | Outcome::Cas { previous: Some(value), .. }) =
                        &outcome
                    {
                        last_seen = Some(value.clone());
                    }
                    operations.push(Operation {
                        id: 0,
                        client: client as u32,
                        command,
                        invoke,
                        completion: outcome.map(|outcome| Completion { at, outcome }),
                    });
                    thread::sleep(Duration::from_millis(1));
                }
                (operations, [cluster.redirects, cluster.asks, cluster.try_agains])
            })
        })
        .collect();
    let mut operations = Vec::new();
    let mut counts = [0u64; 3];
    for worker in workers {
        let (mine, seen) = worker.join().unwrap();
        operations.extend(mine);
        for (total, count) in counts.iter_mut().zip(seen) {
            *total += count;
        }
    }
    operations.sort_by_key(|op| op.invoke);
    for (id, op) in operations.iter_mut().enumerate() {
        op.id = id;
    }
    (History { operations }, counts)
}

fn owner_port(port: u16, slot: u16) -> u16 {
    let slots: Vec<Vec<redis::Value>> = query(&mut client(port), "CLUSTER SLOTS");
    for entry in slots {
        let int = |v: &redis::Value| redis::from_redis_value::<i64>(v).unwrap();
        if (int(&entry[0])..=int(&entry[1])).contains(&i64::from(slot)) {
            let first: (String, i64, String) = redis::from_redis_value(&entry[2]).unwrap();
            return first.1 as u16;
        }
    }
    panic!("slot {slot} has no owner");
}

#[test]
fn slots_with_keys_move_back_and_forth_while_clients_run_and_every_key_stays_linearizable() {
    let port = free_port_run(18, 9);
    let (up, first) = Up::start(port, 6, &["--shards", "2", "--replicas", "3", "--in-memory"], &[]).unwrap();
    assert!(first.contains("2 shards x 3 hermes replicas up"), "{first}");
    let ports: Vec<u16> = (port..port + 6).collect();
    let ids: Vec<String> = [port, port + 3].iter().map(|p| query(&mut client(*p), "CLUSTER MYID")).collect();
    let slots = [key_slot(b"{a}"), key_slot(b"{b}")];
    let stop = Arc::new(AtomicBool::new(false));
    let clients = {
        let (ports, stop) = (ports.clone(), stop.clone());
        thread::spawn(move || run_clients(ports, stop))
    };
    thread::sleep(Duration::from_millis(300));
    // Each slot moves to the other group and back, three times, sent to a different node
    // each time (any node takes SETSLOT NODE); the clients never stop.
    let mut moves = 0;
    for round in 0..6u16 {
        for slot in slots {
            let owner = owner_port(port, slot);
            let to = if owner < port + 3 { &ids[1] } else { &ids[0] };
            let at = port + (round + slot % 6) % 6;
            let _: () = query(&mut client(at), &format!("CLUSTER SETSLOT {slot} NODE {to}"));
            moves += 1;
            assert_ne!(owner_port(port, slot), owner, "slot {slot} moved");
            thread::sleep(Duration::from_millis(100));
        }
    }
    // The handshake redis-cli --cluster reshard drives: MIGRATING at the owner, then MIGRATE
    // of the listed keys, then NODE.
    let slot = slots[0];
    let owner = owner_port(port, slot);
    let (to_port, to_id, from_id) =
        if owner < port + 3 { (port + 3, &ids[1], &ids[0]) } else { (port, &ids[0], &ids[1]) };
    let _: () = query(&mut client(to_port), &format!("CLUSTER SETSLOT {slot} IMPORTING {from_id}"));
    let _: () = query(&mut client(owner), &format!("CLUSTER SETSLOT {slot} MIGRATING {to_id}"));
    let keys: Vec<String> = query(&mut client(owner), &format!("CLUSTER GETKEYSINSLOT {slot} 100"));
    for key in &keys {
        let reply: redis::RedisResult<String> = redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(to_port)
            .arg(key)
            .arg(0)
            .arg(5000)
            .query(&mut client(owner));
        // OK, or NOKEY when the movers got there first.
        assert!(reply.is_ok(), "MIGRATE {key}: {reply:?}");
    }
    let _: () = query(&mut client(owner), &format!("CLUSTER SETSLOT {slot} NODE {to_id}"));
    assert_eq!(owner_port(port, slot), to_port);
    thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let (history, [redirects, asks, try_agains]) = clients.join().unwrap();

    let completed = history.operations.iter().filter(|op| op.completion.is_some()).count();
    let report = check_history(&history, &CheckerConfig::default());
    eprintln!(
        "{moves} moves; {} operations ({completed} completed), {redirects} MOVED, {asks} ASK, {try_agains} TRYAGAIN",
        history.operations.len()
    );
    assert!(report.is_linearizable(), "violations: {:#?}", report.violations);
    assert!(report.inconclusive_keys.is_empty(), "inconclusive: {:?}", report.inconclusive_keys);
    assert!(completed > 500, "too little completed: {completed}");
    assert!(
        redirects > 0 && try_agains > 0,
        "the moves were not felt: {redirects} MOVED, {try_agains} TRYAGAIN"
    );

    // Nothing is left behind: each key is at its slot's owner only, at every node of it.
    for key in KEYS {
        let owner = owner_port(port, key_slot(key.as_bytes()));
        let group = if owner < port + 3 { port..port + 3 } else { port + 3..port + 6 };
        for node in port..port + 6 {
            let count: u64 =
                query(&mut client(node), &format!("CLUSTER COUNTKEYSINSLOT {}", key_slot(key.as_bytes())));
            if group.contains(&node) {
                assert!(count > 0, "node {node} holds the slot of {key}");
            } else {
                assert_eq!(count, 0, "node {node} kept keys of a slot it gave away");
            }
        }
    }
    // A move from the owner's side can be called off while it closes; STABLE with no move is OK.
    let error = error_of(&mut client(port), "CLUSTER SETSLOT 5 NODE nobody");
    assert!(error.contains("Unknown node"), "{error}");
    let _: () = query(&mut client(port), "CLUSTER SETSLOT 5 STABLE");
    up.stop();
}
