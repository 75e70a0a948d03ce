//! CLUSTER SLOTS, SHARDS, NODES, KEYSLOT, INFO, MYID, COUNTKEYSINSLOT, GETKEYSINSLOT, and
//! READONLY/READWRITE, in Redis' reply formats so that cluster-aware clients parse them.
//! Pure functions of the slot map; the two commands that read keys say which slot they need
//! and the connection answers them with [`keys_reply`].

use bytes::Bytes;
use chorus_core::slots::{key_slot, Slot, SLOT_COUNT};

use super::map::{ClusterNode, SlotMap};
use crate::resp::Reply;

/// What the connection does for one CLUSTER-family command.
#[derive(Debug, PartialEq)]
pub enum Plan {
    Answer(Reply),
    /// COUNTKEYSINSLOT (`count` None) or GETKEYSINSLOT: this node's live keys of `slot`.
    KeysInSlot {
        slot: Slot,
        count: Option<usize>,
    },
    /// ASKING: the next command may run on a slot this group is importing.
    Asking,
    /// SETSLOT: move `slot` to `group` (start it unless it is under way) and wait for `until`.
    Move {
        slot: Slot,
        group: u16,
        until: MoveUntil,
    },
    /// SETSLOT STABLE: call off the slot's move if it is still closing.
    Cancel {
        slot: Slot,
    },
    /// CLUSTER COPYIN slot began key deadline payload: a mover's copy, run as `args` (a
    /// RESTORE ... REPLACE ABSTTL) while this group takes copies of that move.
    CopyIn {
        slot: Slot,
        began: u64,
        args: Vec<Bytes>,
    },
    /// MIGRATE: move `keys` of a slot being copied to the node at `to` now (the movers would
    /// soon; redis-cli --cluster reshard drives moves this way).
    Migrate {
        to: std::net::SocketAddr,
        keys: Vec<Bytes>,
        password: Option<String>,
    },
}

/// What a SETSLOT waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoveUntil {
    /// MIGRATING: every node of the owner drained: the keys are being copied.
    Copying,
    /// NODE: the new group owns the slot.
    Owned,
}

const DISABLED: &str = "This instance has cluster support disabled";

fn word(arg: &[u8]) -> String {
    String::from_utf8_lossy(arg).to_ascii_uppercase()
}

/// Plan the answer to `args` (`args[0]` is CLUSTER, READONLY or READWRITE); `map` is `None`
/// when the node is not sharded, and then the family is refused as by a non-cluster Redis.
pub fn plan(args: &[Bytes], map: Option<&SlotMap>) -> Plan {
    let Some(map) = map else { return Plan::Answer(Reply::err(DISABLED)) };
    let name = word(&args[0]);
    if name == "ASKING" {
        return Plan::Asking;
    }
    if name == "MIGRATE" {
        return migrate(args);
    }
    if name != "CLUSTER" {
        // Every node of the owning group serves reads and writes of its slots, so a replica
        // needs no permission to read (docs/resp.md, "Cluster").
        return Plan::Answer(Reply::ok());
    }
    let sub = word(&args[1]);
    let arity = |count: usize| -> Result<(), Reply> {
        if args.len() == count {
            Ok(())
        } else {
            Err(Reply::err(format!("wrong number of arguments for 'cluster|{}' command", sub.to_lowercase())))
        }
    };
    let answer = |result: Result<Reply, Reply>| Plan::Answer(result.unwrap_or_else(|error| error));
    match sub.as_str() {
        "KEYSLOT" => answer(arity(3).map(|()| Reply::Integer(i64::from(key_slot(&args[2]))))),
        "MYID" => answer(arity(2).map(|()| Reply::text(&map.me().id))),
        "MYSHARDID" => answer(arity(2).map(|()| Reply::text(&shard_id(map, map.me().group)))),
        "INFO" => answer(arity(2).map(|()| Reply::Verbatim(info(map)))),
        "SLOTS" => answer(arity(2).map(|()| slots(map))),
        "SHARDS" => answer(arity(2).map(|()| shards(map))),
        "NODES" => answer(arity(2).map(|()| Reply::Verbatim(nodes(map)))),
        "REPLICAS" | "SLAVES" => answer(arity(3).and_then(|()| replicas(map, &args[2]))),
        "COUNTKEYSINSLOT" => match arity(3).and_then(|()| slot_arg(&args[2])) {
            Ok(slot) => Plan::KeysInSlot { slot, count: None },
            Err(error) => Plan::Answer(error),
        },
        "GETKEYSINSLOT" => {
            let count = args.get(3).and_then(|arg| std::str::from_utf8(arg).ok()?.parse::<usize>().ok());
            match arity(4).and_then(|()| slot_arg(&args[2])) {
                Ok(_) if count.is_none() => Plan::Answer(Reply::err("Invalid number of keys")),
                Ok(slot) => Plan::KeysInSlot { slot, count },
                Err(error) => Plan::Answer(error),
            }
        }
        "SETSLOT" => setslot(args, map),
        "COPYIN" => copy_in(args),
        "HELP" => Plan::Answer(Reply::Array(
            [
                "CLUSTER KEYSLOT <key>",
                "CLUSTER MYID",
                "CLUSTER MYSHARDID",
                "CLUSTER INFO",
                "CLUSTER SLOTS",
                "CLUSTER SHARDS",
                "CLUSTER NODES",
                "CLUSTER REPLICAS <node-id>",
                "CLUSTER COUNTKEYSINSLOT <slot>",
                "CLUSTER GETKEYSINSLOT <slot> <count>",
                "CLUSTER SETSLOT <slot> NODE <node-id>",
                "CLUSTER SETSLOT <slot> MIGRATING <node-id>",
                "CLUSTER SETSLOT <slot> IMPORTING <node-id>",
                "CLUSTER SETSLOT <slot> STABLE",
            ]
            .iter()
            .map(|line| Reply::text(line))
            .collect(),
        )),
        other => Plan::Answer(Reply::err(format!(
            "CLUSTER {other} is not supported: the slot map comes from the nodes' configuration \
             (docs/operations.md, \"Sharding\")"
        ))),
    }
}

/// `CLUSTER SETSLOT <slot> NODE|MIGRATING|IMPORTING <node-id>` and `STABLE`: the slot moves to
/// that node's group with its keys (docs/resp.md, "Cluster"), at any node. MIGRATING answers
/// once the old group has drained (the keys are being copied), NODE once the new group owns
/// the slot; IMPORTING changes nothing (the move is one decision, made by MIGRATING or NODE),
/// STABLE calls off a move that is still closing.
fn setslot(args: &[Bytes], map: &SlotMap) -> Plan {
    if args.len() < 4 {
        return Plan::Answer(Reply::err("wrong number of arguments for 'cluster|setslot' command"));
    }
    let slot = match slot_arg(&args[2]) {
        Ok(slot) => slot,
        Err(error) => return Plan::Answer(error),
    };
    let action = word(&args[3]);
    let until = match action.as_str() {
        "STABLE" if args.len() == 4 => return Plan::Cancel { slot },
        "NODE" => MoveUntil::Owned,
        "MIGRATING" => MoveUntil::Copying,
        "IMPORTING" => MoveUntil::Copying,
        _ => {
            return Plan::Answer(Reply::err(
                "Invalid CLUSTER SETSLOT action or number of arguments. Try CLUSTER HELP",
            ))
        }
    };
    let Some(id) = args.get(4).filter(|_| args.len() == 5) else {
        return Plan::Answer(Reply::err(
            "Invalid CLUSTER SETSLOT action or number of arguments. Try CLUSTER HELP",
        ));
    };
    let Some(node) = map.node_named(id) else {
        return Plan::Answer(Reply::err(format!("Unknown node {}", String::from_utf8_lossy(id))));
    };
    if action == "IMPORTING" {
        return Plan::Answer(Reply::ok());
    }
    Plan::Move { slot, group: node.group, until }
}

/// `CLUSTER COPYIN <slot> <began> <key> <deadline ms> <payload>` (sent by movers only).
fn copy_in(args: &[Bytes]) -> Plan {
    let number = |at: usize| std::str::from_utf8(&args[at]).ok().and_then(|text| text.parse::<u64>().ok());
    if args.len() != 7 {
        return Plan::Answer(Reply::err("wrong number of arguments for 'cluster|copyin' command"));
    }
    let (Ok(slot), Some(began), Some(_)) = (slot_arg(&args[2]), number(3), number(5)) else {
        return Plan::Answer(Reply::err("Invalid slot, move or deadline"));
    };
    let restore = vec![
        Bytes::from_static(b"restore"),
        args[4].clone(),
        args[5].clone(),
        args[6].clone(),
        Bytes::from_static(b"REPLACE"),
        Bytes::from_static(b"ABSTTL"),
    ];
    Plan::CopyIn { slot, began, args: restore }
}

/// `MIGRATE host port key|"" db timeout [COPY] [REPLACE] [AUTH pw] [AUTH2 user pw] [KEYS k...]`.
fn migrate(args: &[Bytes]) -> Plan {
    let text = |at: usize| String::from_utf8_lossy(&args[at]).to_string();
    let Ok(to) = format!("{}:{}", text(1), text(2)).parse::<std::net::SocketAddr>() else {
        return Plan::Answer(Reply::err("MIGRATE needs a host given as an IP address and a port"));
    };
    let mut keys: Vec<Bytes> = if args[3].is_empty() { Vec::new() } else { vec![args[3].clone()] };
    let mut password = None;
    let mut at = 6;
    while at < args.len() {
        match word(&args[at]).as_str() {
            "COPY" => {
                return Plan::Answer(Reply::err(
                    "MIGRATE COPY is not supported: a key lives in one group (its slot's)",
                ))
            }
            "REPLACE" => {}
            "AUTH" if at + 1 < args.len() => {
                password = Some(text(at + 1));
                at += 1;
            }
            "AUTH2" if at + 2 < args.len() => {
                password = Some(text(at + 2));
                at += 2;
            }
            "KEYS" if args[3].is_empty() => {
                keys.extend(args[at + 1..].iter().cloned());
                break;
            }
            _ => return Plan::Answer(Reply::err("syntax error")),
        }
        at += 1;
    }
    Plan::Migrate { to, keys, password }
}

/// COUNTKEYSINSLOT or GETKEYSINSLOT over this node's live keys of the slot, sorted.
pub fn keys_reply(keys: Vec<Bytes>, count: Option<usize>) -> Reply {
    match count {
        None => Reply::Integer(keys.len() as i64),
        Some(count) => Reply::Array(keys.into_iter().take(count).map(Reply::Bulk).collect()),
    }
}

fn slot_arg(arg: &[u8]) -> Result<Slot, Reply> {
    std::str::from_utf8(arg)
        .ok()
        .and_then(|text| text.parse::<i64>().ok())
        .filter(|slot| (0..i64::from(SLOT_COUNT)).contains(slot))
        .map(|slot| slot as Slot)
        .ok_or_else(|| Reply::err("Invalid slot"))
}

fn shard_id(map: &SlotMap, group: u16) -> String {
    // The group's first node id with its index digits zeroed: 40 hex digits, one per group.
    let first = &map.groups()[usize::from(group)][0].id;
    format!("{}{:018x}", &first[..22], 0)
}

fn info(map: &SlotMap) -> String {
    let known = map.groups().iter().map(Vec::len).sum::<usize>();
    let lines = [
        ("cluster_state", "ok".to_string()),
        ("cluster_slots_assigned", SLOT_COUNT.to_string()),
        ("cluster_slots_ok", SLOT_COUNT.to_string()),
        ("cluster_slots_pfail", "0".into()),
        ("cluster_slots_fail", "0".into()),
        ("cluster_known_nodes", known.to_string()),
        ("cluster_size", map.groups().len().to_string()),
        ("cluster_current_epoch", map.epoch.to_string()),
        ("cluster_my_epoch", map.epoch.to_string()),
        ("cluster_stats_messages_sent", "0".into()),
        ("cluster_stats_messages_received", "0".into()),
        ("total_cluster_links_buffer_limit_exceeded", "0".into()),
    ];
    lines.iter().map(|(name, value)| format!("{name}:{value}\r\n")).collect()
}

fn node_triple(node: &ClusterNode) -> Reply {
    Reply::Array(vec![
        Reply::text(&node.addr.ip().to_string()),
        Reply::Integer(i64::from(node.addr.port())),
        Reply::text(&node.id),
    ])
}

/// One entry per contiguous range: start, end, then the group's nodes, the first one first.
fn slots(map: &SlotMap) -> Reply {
    let mut entries = Vec::new();
    for (group, nodes) in map.groups().iter().enumerate() {
        for (first, last) in map.ranges_of(group as u16) {
            let mut entry = vec![Reply::Integer(i64::from(first)), Reply::Integer(i64::from(last))];
            entry.extend(nodes.iter().map(node_triple));
            entries.push(Reply::Array(entry));
        }
    }
    entries.sort_by_key(|entry| match entry {
        Reply::Array(items) => match items[0] {
            Reply::Integer(first) => first,
            _ => 0,
        },
        _ => 0,
    });
    Reply::Array(entries)
}

fn shards(map: &SlotMap) -> Reply {
    let text = |s: &str| Reply::text(s);
    let shards = map.groups().iter().enumerate().map(|(group, nodes)| {
        let ranges = map.ranges_of(group as u16);
        let slots = ranges
            .iter()
            .flat_map(|(first, last)| [Reply::Integer(i64::from(*first)), Reply::Integer(i64::from(*last))])
            .collect();
        let nodes = nodes
            .iter()
            .map(|node| {
                let role = if node.index == 0 { "master" } else { "replica" };
                Reply::Map(vec![
                    (text("id"), text(&node.id)),
                    (text("port"), Reply::Integer(i64::from(node.addr.port()))),
                    (text("ip"), text(&node.addr.ip().to_string())),
                    (text("endpoint"), text(&node.addr.ip().to_string())),
                    (text("role"), text(role)),
                    (text("replication-offset"), Reply::Integer(0)),
                    (text("health"), text("online")),
                ])
            })
            .collect();
        Reply::Map(vec![(text("slots"), Reply::Array(slots)), (text("nodes"), Reply::Array(nodes))])
    });
    Reply::Array(shards.collect())
}

/// Redis' CLUSTER NODES lines: `id ip:port@cport flags master ping pong epoch link slots...`.
/// The cluster bus port is 0: Chorus groups talk over their own peer links, not a bus.
fn nodes(map: &SlotMap) -> String {
    let mut out = String::new();
    for (group, nodes) in map.groups().iter().enumerate() {
        let ranges = map.ranges_of(group as u16);
        for node in nodes {
            out.push_str(&node_line(map, node, &nodes[0], &ranges));
        }
    }
    out
}

fn node_line(map: &SlotMap, node: &ClusterNode, first: &ClusterNode, ranges: &[(Slot, Slot)]) -> String {
    let myself = if node.id == map.me().id { "myself," } else { "" };
    let (role, master) = if node.index == 0 { ("master", "-") } else { ("slave", first.id.as_str()) };
    let mut line = format!("{} {}@0 {myself}{role} {master} 0 0 {} connected", node.id, node.addr, map.epoch);
    if node.index == 0 {
        for (first, last) in ranges {
            if first == last {
                line.push_str(&format!(" {first}"));
            } else {
                line.push_str(&format!(" {first}-{last}"));
            }
        }
    }
    line.push('\n');
    line
}

fn replicas(map: &SlotMap, id: &[u8]) -> Result<Reply, Reply> {
    let group = map
        .groups()
        .iter()
        .find(|nodes| nodes[0].id.as_bytes() == id)
        .ok_or_else(|| Reply::err(format!("Unknown node {}", String::from_utf8_lossy(id))))?;
    let lines = group.iter().skip(1).map(|node| Reply::text(node_line(map, node, &group[0], &[]).trim_end()));
    Ok(Reply::Array(lines.collect()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::config::{ClusterSettings, GroupSettings};

    fn map() -> SlotMap {
        let addr = |port: u16| std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let settings = ClusterSettings {
            group: 1,
            groups: vec![
                GroupSettings {
                    slots: vec![(0, 5460)],
                    clients: vec![addr(7000), addr(7001)],
                    meta: vec![addr(9000), addr(9001)],
                },
                GroupSettings {
                    slots: vec![(5461, 16383)],
                    clients: vec![addr(7002), addr(7003)],
                    meta: vec![addr(9002), addr(9003)],
                },
            ],
        };
        SlotMap::new(&settings, addr(7003))
    }

    fn args(line: &str) -> Vec<Bytes> {
        line.split(' ').map(|word| Bytes::copy_from_slice(word.as_bytes())).collect()
    }

    fn answer(line: &str) -> Reply {
        match plan(&args(line), Some(&map())) {
            Plan::Answer(reply) => reply,
            other => panic!("{line}: {other:?}"),
        }
    }

    fn text(reply: Reply) -> String {
        match reply {
            Reply::Verbatim(text) => text,
            Reply::Bulk(bytes) => String::from_utf8(bytes.to_vec()).unwrap(),
            other => panic!("not text: {other:?}"),
        }
    }

    #[test]
    fn keyslot_and_identity() {
        assert_eq!(answer("CLUSTER KEYSLOT somekey"), Reply::Integer(11058));
        assert_eq!(text(answer("CLUSTER MYID")), map().me().id);
        assert!(text(answer("CLUSTER INFO")).contains("cluster_state:ok\r\ncluster_slots_assigned:16384"));
        assert!(text(answer("CLUSTER INFO")).contains("cluster_size:2\r\n"));
        assert!(answer("CLUSTER KEYSLOT").is_error());
        assert!(answer("CLUSTER ADDSLOTS 1").is_error());
    }

    #[test]
    fn slots_lists_each_range_with_its_group_first_node_first() {
        let Reply::Array(entries) = answer("CLUSTER SLOTS") else { panic!() };
        assert_eq!(entries.len(), 2);
        let Reply::Array(second) = &entries[1] else { panic!() };
        assert_eq!(second[0], Reply::Integer(5461));
        assert_eq!(second[1], Reply::Integer(16383));
        let Reply::Array(node) = &second[2] else { panic!() };
        assert_eq!(node[1], Reply::Integer(7002));
        assert_eq!(second.len(), 4);
    }

    #[test]
    fn nodes_marks_myself_masters_and_replicas() {
        let nodes = text(answer("CLUSTER NODES"));
        let lines: Vec<&str> = nodes.lines().collect();
        assert_eq!(lines.len(), 4);
        assert!(lines[0].contains(" 127.0.0.1:7000@0 master - 0 0 1 connected 0-5460"), "{}", lines[0]);
        assert!(lines[3].contains("myself,slave"), "{}", lines[3]);
        assert!(!lines[3].contains("5461"));
        assert!(lines[2].ends_with("connected 5461-16383"));
    }

    #[test]
    fn keys_in_slot_are_planned_and_checked() {
        let map = map();
        assert_eq!(
            plan(&args("CLUSTER GETKEYSINSLOT 12 3"), Some(&map)),
            Plan::KeysInSlot { slot: 12, count: Some(3) }
        );
        assert_eq!(
            plan(&args("CLUSTER COUNTKEYSINSLOT 16383"), Some(&map)),
            Plan::KeysInSlot { slot: 16383, count: None }
        );
        assert!(answer("CLUSTER COUNTKEYSINSLOT 16384").is_error());
        assert!(answer("CLUSTER GETKEYSINSLOT 1 x").is_error());
        let keys = vec![Bytes::from_static(b"a"), Bytes::from_static(b"b")];
        assert_eq!(keys_reply(keys.clone(), None), Reply::Integer(2));
        assert_eq!(keys_reply(keys, Some(1)), Reply::Array(vec![Reply::Bulk(Bytes::from_static(b"a"))]));
    }

    #[test]
    fn setslot_and_migrate_are_planned() {
        let map = map(); // This node is in group 1, which owns 5461-16383.
        let first_of_group_0 = map.groups()[0][0].id.clone();
        let line = format!("CLUSTER SETSLOT 6000 NODE {first_of_group_0}");
        assert_eq!(
            plan(&args(&line), Some(&map)),
            Plan::Move { slot: 6000, group: 0, until: MoveUntil::Owned }
        );
        let line = format!("CLUSTER SETSLOT 10 MIGRATING {first_of_group_0}");
        assert_eq!(
            plan(&args(&line), Some(&map)),
            Plan::Move { slot: 10, group: 0, until: MoveUntil::Copying }
        );
        assert_eq!(answer(&format!("CLUSTER SETSLOT 10 IMPORTING {first_of_group_0}")), Reply::ok());
        assert_eq!(plan(&args("CLUSTER SETSLOT 10 STABLE"), Some(&map)), Plan::Cancel { slot: 10 });
        assert!(text_error(answer("CLUSTER SETSLOT 6000 NODE nobody")).contains("Unknown node"));
        assert!(text_error(answer("CLUSTER SETSLOT 99999 NODE x")).contains("Invalid slot"));
        assert!(text_error(answer("CLUSTER SETSLOT 6000")).contains("wrong number"));
        assert_eq!(plan(&args("ASKING"), Some(&map)), Plan::Asking);
        assert_eq!(
            plan(&args("MIGRATE 127.0.0.1 7002 k 0 5000 REPLACE"), Some(&map)),
            Plan::Migrate {
                to: "127.0.0.1:7002".parse().unwrap(),
                keys: vec![Bytes::from("k")],
                password: None
            }
        );
        let mut keys = args("MIGRATE 127.0.0.1 7002 - 0 5000 AUTH pw KEYS a b");
        keys[3] = Bytes::new();
        assert!(matches!(
            plan(&keys, Some(&map)),
            Plan::Migrate { keys, password: Some(_), .. } if keys == vec![Bytes::from("a"), Bytes::from("b")]
        ));
    }

    fn text_error(reply: Reply) -> String {
        match reply {
            Reply::Error(text) => text,
            other => panic!("not an error: {other:?}"),
        }
    }

    #[test]
    fn without_sharding_the_family_is_refused_as_by_redis() {
        for line in ["CLUSTER INFO", "READONLY"] {
            assert_eq!(plan(&args(line), None), Plan::Answer(Reply::err(DISABLED)));
        }
        assert_eq!(answer("READONLY"), Reply::ok());
    }
}
