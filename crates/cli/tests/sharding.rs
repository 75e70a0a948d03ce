//! Scale-out behind the Redis Cluster protocol (issue 20 points 1-3), through the real
//! binary: `chorus up --shards S --replicas R`, keys routed by MOVED redirects, CROSSSLOT,
//! the CLUSTER family, and the cluster-aware clients redis-cli -c and redis-benchmark
//! --cluster.

use std::collections::BTreeMap;
use std::process::Command;

use chorus_core::slots::key_slot;
use support::up::{client, free_port_run, Up};
use support::{error_of, query};

mod support;

/// Run `cmd` at `port`, following `-MOVED` as a cluster client does; the reply and how
/// many redirects it took.
fn follow(port: u16, cmd: &redis::Cmd) -> (redis::Value, usize) {
    let mut port = port;
    for redirects in 0..3 {
        match cmd.query::<redis::Value>(&mut client(port)) {
            Ok(value) => return (value, redirects),
            Err(error) if error.code() == Some("MOVED") => {
                let target = error.redirect_node().expect("MOVED names a node").0;
                port = target.rsplit(':').next().unwrap().parse().unwrap();
            }
            Err(error) => panic!("at port {port}: {error}"),
        }
    }
    panic!("redirected in circles, last to port {port}")
}

#[test]
fn a_sharded_cluster_splits_the_keys_and_redirects_clients() {
    // 2 groups of 3: group 0 on port..port+2 owns slots 0-8191, group 1 the rest.
    let port = free_port_run(18, 5);
    let (up, first) = Up::start(port, 6, &["--shards", "2", "--replicas", "3", "--in-memory"], &[]).unwrap();
    assert!(first.contains("2 shards x 3 hermes replicas up"), "{first}");
    let group_of = |key: &str| u16::from(key_slot(key.as_bytes()) >= 8192);

    // Every key written through whichever node, following redirects.
    let keys: Vec<String> = (0..120).map(|i| format!("key:{i}")).collect();
    let mut redirects = 0;
    for (i, key) in keys.iter().enumerate() {
        let (_, taken) = follow(port + (i % 6) as u16, redis::cmd("SET").arg(key).arg(i));
        redirects += taken;
    }
    assert!(redirects > 20, "about half the writes start at the wrong group: {redirects}");

    // Each group holds exactly its own keys, at every replica; the others answer MOVED to
    // the owning group's first node.
    let mut per_group = [0u64; 2];
    for key in &keys {
        per_group[usize::from(group_of(key))] += 1;
    }
    for node in 0..6u16 {
        let mut con = client(port + node);
        let group = node / 3;
        assert_eq!(query::<u64>(&mut con, "DBSIZE"), per_group[usize::from(group)], "node {node}");
        for (i, key) in keys.iter().enumerate() {
            if group_of(key) == group {
                let value: i64 = redis::cmd("GET").arg(key).query(&mut con).unwrap();
                assert_eq!(value, i as i64, "{key} at node {node}");
            } else {
                let error = redis::cmd("GET").arg(key).query::<redis::Value>(&mut con).unwrap_err();
                let owner = format!("127.0.0.1:{}", port + 3 * (1 - group));
                let slot = key_slot(key.as_bytes());
                assert_eq!(error.code(), Some("MOVED"), "{key} at node {node}: {error}");
                assert_eq!(error.redirect_node(), Some((owner.as_str(), slot)), "{key} at node {node}");
            }
        }
    }
    assert!(per_group.iter().all(|count| *count > 30), "{per_group:?}");

    let mut con = client(port);
    // Multi-key commands: one slot (hash tags) or CROSSSLOT.
    let error = error_of(&mut con, "MGET key:0 key:1 key:2 key:3");
    assert!(error.contains("CrossSlot") && error.contains("same slot"), "{error}");
    let _: () = query(&mut con, "MSET {user1}:a 1 {user1}:b 2");
    let values: Vec<i64> = query(&mut con, "MGET {user1}:a {user1}:b");
    assert_eq!(values, vec![1, 2]);

    // A redirect inside MULTI discards the transaction, as in Redis.
    let other = keys.iter().find(|key| group_of(key) == 1).unwrap();
    let mine = keys.iter().find(|key| group_of(key) == 0).unwrap();
    let _: () = query(&mut con, "MULTI");
    let _: redis::Value = query(&mut con, &format!("SET {mine} queued"));
    assert!(error_of(&mut con, &format!("SET {other} x")).contains("Moved"));
    let exec = error_of(&mut con, "EXEC");
    assert!(exec.contains("ExecAbort"), "{exec}");
    assert_ne!(query::<String>(&mut con, &format!("GET {mine}")), "queued");

    // The CLUSTER family.
    let slot: i64 = query(&mut con, "CLUSTER KEYSLOT somekey");
    assert_eq!(slot, 11058);
    let info: String = query(&mut con, "CLUSTER INFO");
    assert!(info.contains("cluster_state:ok") && info.contains("cluster_size:2"), "{info}");
    let info: String = query(&mut con, "INFO cluster");
    assert!(info.contains("cluster_enabled:1"), "{info}");
    // Each entry: first slot, last slot, then [ip, port, id] per node, the first one first.
    let slots: Vec<Vec<redis::Value>> = query(&mut con, "CLUSTER SLOTS");
    let entry = |i: usize| -> (i64, i64, Vec<(String, i64, String)>) {
        let value = |v: &redis::Value| redis::from_redis_value::<i64>(v).unwrap();
        let nodes = slots[i][2..].iter().map(|node| redis::from_redis_value(node).unwrap()).collect();
        (value(&slots[i][0]), value(&slots[i][1]), nodes)
    };
    assert_eq!(slots.len(), 2);
    let (first, second) = (entry(0), entry(1));
    assert_eq!((first.0, first.1, first.2[0].1), (0, 8191, i64::from(port)));
    assert_eq!((second.0, second.1, second.2[0].1), (8192, 16383, i64::from(port + 3)));
    assert_eq!(second.2.len(), 3, "every replica is advertised");
    let myid: String = query(&mut con, "CLUSTER MYID");
    let nodes: String = query(&mut con, "CLUSTER NODES");
    assert_eq!(nodes.lines().count(), 6);
    assert!(nodes.lines().any(|line| line.starts_with(&myid) && line.contains("myself,master")), "{nodes}");
    let _: () = query(&mut con, "READONLY");
    // COUNTKEYSINSLOT and GETKEYSINSLOT see this group's keys of one slot.
    let mut by_slot: BTreeMap<u16, Vec<&String>> = BTreeMap::new();
    for key in keys.iter().filter(|key| group_of(key) == 0) {
        by_slot.entry(key_slot(key.as_bytes())).or_default().push(key);
    }
    let (slot, in_slot) = by_slot.iter().next().unwrap();
    let count: usize = query(&mut con, &format!("CLUSTER COUNTKEYSINSLOT {slot}"));
    assert_eq!(count, in_slot.len());
    let listed: Vec<String> = query(&mut con, &format!("CLUSTER GETKEYSINSLOT {slot} 100"));
    assert_eq!(listed.iter().collect::<Vec<_>>(), *in_slot);
    up.stop();
}

#[test]
fn without_shards_nothing_changes() {
    let port = free_port_run(6, 6);
    let (up, _) = Up::start(port, 3, &["--in-memory"], &[]).unwrap();
    let mut con = client(port);
    let info: String = query(&mut con, "INFO cluster");
    assert!(info.contains("cluster_enabled:0"), "{info}");
    for line in ["CLUSTER INFO", "READONLY"] {
        assert!(error_of(&mut con, line).contains("cluster support disabled"), "{line}");
    }
    // Every key is served here: no redirects.
    for i in 0..50 {
        let _: () = redis::cmd("SET").arg(format!("key:{i}")).arg(i).query(&mut con).unwrap();
    }
    let _: () = query(&mut con, "MSET a 1 b 2");
    up.stop();
}

/// Whether `tool` runs; a loud note when it does not.
fn have(tool: &str) -> bool {
    let found = Command::new(tool).arg("--version").output().is_ok_and(|out| out.status.success());
    if !found {
        eprintln!(
            "SKIPPED: {tool} is not installed (apt-get install redis-tools; scripts/test.sh does as root)"
        );
    }
    found
}

#[test]
fn redis_cli_and_redis_benchmark_route_by_themselves() {
    if !have("redis-cli") || !have("redis-benchmark") {
        return;
    }
    // 3 groups of 1: nodes at port, port+1, port+2.
    let port = free_port_run(9, 7);
    let (up, _) = Up::start(port, 3, &["--shards", "3", "--replicas", "1", "--in-memory"], &[]).unwrap();
    let redis_cli = |node: u16, input: &str| {
        let mut child = Command::new("redis-cli")
            .args(["-c", "-p", &(port + node).to_string()])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write as _;
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    };
    let writes: String = (0..30).map(|i| format!("SET key:{i} value:{i}\n")).collect();
    assert_eq!(redis_cli(0, &writes).lines().filter(|line| *line == "OK").count(), 30);
    let reads: String = (0..30).map(|i| format!("GET key:{i}\n")).collect();
    // redis-cli -c notes each redirect it follows on a line of its own.
    let output = redis_cli(2, &reads);
    assert!(output.contains("-> Redirected to slot"), "{output}");
    let values: Vec<String> =
        output.lines().filter(|line| !line.starts_with("-> Redirected")).map(str::to_string).collect();
    assert_eq!(values, (0..30).map(|i| format!("value:{i}")).collect::<Vec<_>>());
    let dbsizes: Vec<u64> = (0..3).map(|node| query(&mut client(port + node), "DBSIZE")).collect();
    assert_eq!(dbsizes.iter().sum::<u64>(), 30);
    assert!(dbsizes.iter().all(|size| *size > 0), "{dbsizes:?}");

    // redis-benchmark --cluster reads CLUSTER NODES and sends each master keys of its slots.
    let out = Command::new("redis-benchmark")
        .args(["--cluster", "-p", &port.to_string(), "-t", "set", "-n", "3000", "-c", "6", "-q"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("Cluster has 3 master nodes") && !text.contains("Error"), "{text}");
    for node in 0..3 {
        let size: u64 = query(&mut client(port + node), "DBSIZE");
        assert_eq!(size, dbsizes[usize::from(node)] + 1, "one benchmark key per master (node {node})");
    }
    up.stop();
}

/// The epoch every node of `port..port + nodes` reports, once they all agree on `epoch`.
fn wait_for_epoch(port: u16, nodes: u16, epoch: u64) {
    let wanted = format!("cluster_current_epoch:{epoch}\r\n");
    for _ in 0..100 {
        let infos: Vec<String> =
            (0..nodes).map(|node| query(&mut client(port + node), "CLUSTER INFO")).collect();
        if infos.iter().all(|info| info.contains(&wanted)) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("the nodes did not all reach epoch {epoch}");
}

/// Issue 20 point 1: the slot map is the metadata service's (Raft over every node of every
/// group), not each node's configuration: a change made at one node is seen by every node of
/// both groups, in CLUSTER SLOTS/NODES/INFO and in where keys are served, and a restarted
/// cluster comes back with the changed map.
#[test]
fn a_slot_moved_through_the_metadata_service_is_seen_everywhere_and_kept() {
    let scratch = support::scratch::Scratch::new("sharding-metadata");
    let dir = scratch.0.to_str().unwrap();
    let port = free_port_run(18, 8);
    let args = ["--shards", "2", "--replicas", "3", "--data-dir", dir];
    let (up, _) = Up::start(port, 6, &args, &[]).unwrap();
    // "bar" is slot 5061, group 0's (ports port..port+2) at epoch 1.
    assert_eq!(key_slot(b"bar"), 5061);
    let mut follower = client(port + 1);
    let _: () = query(&mut follower, "SET bar before");
    let group_1: String = query(&mut client(port + 3), "CLUSTER MYID");
    let setslot = format!("CLUSTER SETSLOT 5061 NODE {group_1}");
    // The slot moves with its key, asked at any node: begun (epoch 2), drained (3), copied
    // (4), sealed (5), cleaned (6).
    let _: () = query(&mut client(port + 4), &setslot);
    wait_for_epoch(port, 6, 6);
    // The same move again changes nothing: the slot is there.
    let _: () = query(&mut client(port + 3), &setslot);
    let (value, _) = follow(port, redis::cmd("GET").arg("bar"));
    assert_eq!(value, redis::Value::BulkString(b"before".to_vec()));

    // Every node routes slot 5061 to group 1 now, and lists it there.
    for node in 0..6u16 {
        let mut con = client(port + node);
        if node < 3 {
            let error = redis::cmd("GET").arg("bar").query::<redis::Value>(&mut con).unwrap_err();
            let owner = format!("127.0.0.1:{}", port + 3);
            assert_eq!(error.redirect_node(), Some((owner.as_str(), 5061)), "node {node}: {error}");
        } else {
            let _: () = redis::cmd("SET").arg("bar").arg(format!("at {node}")).query(&mut con).unwrap();
        }
        let slots: Vec<Vec<redis::Value>> = query(&mut con, "CLUSTER SLOTS");
        let ranges: Vec<(i64, i64, i64)> = slots
            .iter()
            .map(|entry| {
                let int = |v: &redis::Value| redis::from_redis_value::<i64>(v).unwrap();
                let first_node: (String, i64, String) = redis::from_redis_value(&entry[2]).unwrap();
                (int(&entry[0]), int(&entry[1]), first_node.1 - i64::from(port))
            })
            .collect();
        assert_eq!(
            ranges,
            vec![(0, 5060, 0), (5061, 5061, 3), (5062, 8191, 0), (8192, 16383, 3)],
            "node {node}"
        );
        let nodes: String = query(&mut con, "CLUSTER NODES");
        let master_1 = nodes.lines().find(|line| line.starts_with(&group_1)).unwrap();
        assert!(master_1.contains(" 6 connected 5061 8192-16383"), "node {node}: {master_1}");
    }
    up.stop();

    // Restarted, every node rebuilds the map from its metadata.log: still epoch 6.
    let (up, first) = Up::start(port, 6, &args, &[]).unwrap();
    assert!(first.contains("restarted from the data kept"), "{first}");
    wait_for_epoch(port, 6, 6);
    for node in 0..6u16 {
        let (value, redirects) = follow(port + node, redis::cmd("GET").arg("bar"));
        assert_eq!(value, redis::Value::BulkString(b"at 5".to_vec()), "node {node}");
        assert_eq!(redirects, usize::from(node < 3), "node {node}");
    }
    up.stop();
}
