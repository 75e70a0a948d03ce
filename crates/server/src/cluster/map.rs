//! The slot map a node routes by, and the one routing check: every command passes
//! [`SlotMap::route`] at dispatch (connection.rs, `execute`), before it is queued or run.
//! Who owns which slot, and the epoch, are the metadata service's ([`SlotMap::at`]); the
//! nodes and their addresses come from the configuration.

use std::net::SocketAddr;

use bytes::Bytes;
use chorus_core::slots::{crc16, key_slot, Slot, SLOT_COUNT};
use chorus_core::NodeId;
use chorus_membership::routing::{route, Route};
use chorus_membership::SlotTable;

use super::config::ClusterSettings;
use crate::resp::Reply;

/// One node as the CLUSTER commands describe it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterNode {
    /// Redis' 40-hex-digit node name: `<crc16(every group's client addresses)><group><index>`,
    /// the same on every node of every group (each group has its own cluster id, so that
    /// cannot be the tag: ids seen from another group would not match MYID)
    /// node without any exchange, and readable.
    pub id: String,
    pub addr: SocketAddr,
    /// Where its metadata service listens.
    pub meta: SocketAddr,
    /// Its id in the metadata service: its position among every group's nodes, in order.
    pub node: NodeId,
    pub group: u16,
    /// Position in its group: 0 is the one redirects name (its "master").
    pub index: usize,
}

/// Which group owns each slot, the moves in progress, every group's nodes, and this node.
#[derive(Clone, Debug)]
pub struct SlotMap {
    /// Bumped by every change of ownership; clients see it in CLUSTER INFO and NODES.
    pub epoch: u64,
    table: SlotTable,
    /// Per group, its nodes; `groups[g][0]` is the target of redirects to `g`.
    groups: Vec<Vec<ClusterNode>>,
    me: ClusterNode,
}

/// Where a command goes, as [`SlotMap::route_slot`] decides it.
#[derive(Debug, PartialEq)]
pub enum Routed {
    /// Run it here.
    Serve,
    /// Answer this instead (`-MOVED`, `-TRYAGAIN`).
    Reply(Reply),
    /// The slot is being copied from this group: read the command's keys; if this group holds
    /// none of them, answer `ask` (`-ASK`), else `-TRYAGAIN`.
    CheckPresence { ask: Reply },
}

/// The answer while a slot's keys are on their way (Redis sends it for multi-key commands
/// during a move; cluster clients retry it).
pub fn try_again(slot: Slot) -> Reply {
    Reply::error(format!("TRYAGAIN slot {slot} is moving to another group; retry shortly"))
}

impl SlotMap {
    /// The map a configuration describes, as seen by the node at `client_addr`.
    pub fn new(settings: &ClusterSettings, client_addr: SocketAddr) -> SlotMap {
        let mut owner = vec![u16::MAX; usize::from(SLOT_COUNT)];
        let every_client: Vec<String> =
            settings.groups.iter().flat_map(|group| &group.clients).map(SocketAddr::to_string).collect();
        let tag = crc16(every_client.join(",").as_bytes());
        let mut groups = Vec::with_capacity(settings.groups.len());
        for (group, config) in settings.groups.iter().enumerate() {
            let group = group as u16;
            for (first, last) in &config.slots {
                owner[usize::from(*first)..=usize::from(*last)].fill(group);
            }
            let before = groups.iter().map(Vec::len).sum::<usize>();
            let nodes = config.clients.iter().zip(&config.meta).enumerate().map(|(index, (addr, meta))| {
                ClusterNode {
                    id: format!("{tag:04x}{group:018x}{index:018x}"),
                    addr: *addr,
                    meta: *meta,
                    node: NodeId(u8::try_from(before + index).expect("validated: at most 64 nodes")),
                    group,
                    index,
                }
            });
            groups.push(nodes.collect::<Vec<_>>());
        }
        assert!(owner.iter().all(|group| *group != u16::MAX), "validated: every slot has an owner");
        let me = groups[usize::from(settings.group)]
            .iter()
            .find(|node| node.addr == client_addr)
            .expect("validated: this node is listed in its group")
            .clone();
        let group_of = groups.iter().flatten().map(|node| node.group).collect();
        SlotMap { epoch: 1, table: SlotTable::new(group_of, owner), groups, me }
    }

    /// The ownership part and the moves, as the metadata service holds them.
    pub fn table(&self) -> &SlotTable {
        &self.table
    }

    /// This map with the metadata service's ownership, moves and epoch.
    pub fn at(&self, table: &SlotTable) -> SlotMap {
        SlotMap {
            epoch: table.epoch(),
            table: table.clone(),
            groups: self.groups.clone(),
            me: self.me.clone(),
        }
    }

    /// The node CLUSTER commands name by `id`.
    pub fn node_named(&self, id: &[u8]) -> Option<&ClusterNode> {
        self.groups.iter().flatten().find(|node| node.id.as_bytes() == id)
    }

    pub fn me(&self) -> &ClusterNode {
        &self.me
    }

    pub fn groups(&self) -> &[Vec<ClusterNode>] {
        &self.groups
    }

    pub fn owner(&self, slot: Slot) -> u16 {
        self.table.owner(slot)
    }

    /// The node redirects to `group` name.
    pub fn first_of(&self, group: u16) -> &ClusterNode {
        &self.groups[usize::from(group)][0]
    }

    /// The slots of `group` as inclusive ranges, in order.
    pub fn ranges_of(&self, group: u16) -> Vec<(Slot, Slot)> {
        let mut ranges: Vec<(Slot, Slot)> = Vec::new();
        for slot in 0..SLOT_COUNT {
            if self.owner(slot) != group {
                continue;
            }
            match ranges.last_mut() {
                Some((_, last)) if *last + 1 == slot => *last = slot,
                _ => ranges.push((slot, slot)),
            }
        }
        ranges
    }

    /// The slot a command's keys are in: `None` for a command without keys, `-CROSSSLOT` when
    /// they are in different slots.
    pub fn slot_of(args: &[Bytes]) -> Result<Option<Slot>, Reply> {
        let keys = crate::command::command_keys(args);
        let mut keys = keys.iter();
        let Some(first) = keys.next() else { return Ok(None) };
        let slot = key_slot(first);
        if keys.any(|key| key_slot(key) != slot) {
            return Err(Reply::error("CROSSSLOT Keys in request don't hash to the same slot"));
        }
        Ok(Some(slot))
    }

    /// Where a command on `slot` goes from this node (`asking`: the client sent ASKING just
    /// before): the metadata service's map and moves, by the rule the simulator checks
    /// (`chorus_membership::routing::route`).
    pub fn route_slot(&self, slot: Slot, asking: bool) -> Routed {
        match route(&self.table, self.me.group, slot, asking) {
            Route::Serve => Routed::Serve,
            Route::Moved(group) => {
                Routed::Reply(Reply::error(format!("MOVED {slot} {}", self.first_of(group).addr)))
            }
            Route::TryAgain => Routed::Reply(try_again(slot)),
            Route::CheckPresence { to } => {
                Routed::CheckPresence { ask: Reply::error(format!("ASK {slot} {}", self.first_of(to).addr)) }
            }
        }
    }

    /// The whole check for a command outside a move: `None` when this node may run it,
    /// otherwise the reply instead (tests and callers without gates).
    pub fn route(&self, args: &[Bytes]) -> Option<Reply> {
        match Self::slot_of(args) {
            Err(reply) => Some(reply),
            Ok(None) => None,
            Ok(Some(slot)) => match self.route_slot(slot, false) {
                Routed::Serve => None,
                Routed::Reply(reply) => Some(reply),
                Routed::CheckPresence { .. } => Some(try_again(slot)),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::config::GroupSettings;

    fn map(me: u16) -> SlotMap {
        let settings = ClusterSettings {
            group: me,
            groups: vec![
                GroupSettings {
                    slots: vec![(0, 8191)],
                    clients: vec!["127.0.0.1:7000".parse().unwrap(), "127.0.0.1:7001".parse().unwrap()],
                    meta: vec!["127.0.0.1:9000".parse().unwrap(), "127.0.0.1:9001".parse().unwrap()],
                },
                GroupSettings {
                    slots: vec![(8192, 16383)],
                    clients: vec!["127.0.0.1:7002".parse().unwrap()],
                    meta: vec!["127.0.0.1:9002".parse().unwrap()],
                },
            ],
        };
        let addr = if me == 0 { "127.0.0.1:7001" } else { "127.0.0.1:7002" };
        SlotMap::new(&settings, addr.parse().unwrap())
    }

    fn args(line: &str) -> Vec<Bytes> {
        line.split(' ').map(|word| Bytes::copy_from_slice(word.as_bytes())).collect()
    }

    fn route(map: &SlotMap, line: &str) -> Option<String> {
        map.route(&args(line)).map(|reply| match reply {
            Reply::Error(text) => text,
            other => panic!("not an error: {other:?}"),
        })
    }

    #[test]
    fn keys_of_other_groups_are_moved_to_their_first_node() {
        let map = map(0);
        // "foo" is slot 12182 (group 1), "bar" 5061 (group 0).
        assert_eq!(route(&map, "GET foo").as_deref(), Some("MOVED 12182 127.0.0.1:7002"));
        assert_eq!(route(&map, "GET bar"), None);
        assert_eq!(route(&map, "SET bar 1"), None);
        assert_eq!(route(&map, "PING"), None);
        assert_eq!(route(&self::map(1), "GET bar").as_deref(), Some("MOVED 5061 127.0.0.1:7000"));
    }

    #[test]
    fn multi_key_commands_must_stay_in_one_slot() {
        let map = map(0);
        assert_eq!(
            route(&map, "MGET bar foo").as_deref(),
            Some("CROSSSLOT Keys in request don't hash to the same slot")
        );
        assert_eq!(route(&map, "MSET {bar}1 a {bar}2 b"), None);
        assert!(route(&map, "MSET bar 1 foo 2").unwrap().starts_with("CROSSSLOT"));
        // Keys after numkeys, and the destination of a *STORE.
        assert!(route(&map, "ZUNIONSTORE bar 2 bar foo").unwrap().starts_with("CROSSSLOT"));
        assert_eq!(route(&map, "ZUNIONSTORE {bar}d 2 {bar}a {bar}b"), None);
        assert!(route(&map, "SINTERCARD 2 bar foo").unwrap().starts_with("CROSSSLOT"));
        assert!(route(&map, "XREAD COUNT 1 STREAMS bar foo 0 0").unwrap().starts_with("CROSSSLOT"));
        assert_eq!(route(&map, "RENAME {foo}a {foo}b").as_deref(), Some("MOVED 12182 127.0.0.1:7002"));
    }

    #[test]
    fn node_ids_are_forty_hex_digits_and_distinct() {
        let map = map(0);
        let ids: Vec<&str> = map.groups().iter().flatten().map(|node| node.id.as_str()).collect();
        assert!(ids.iter().all(|id| id.len() == 40 && id.bytes().all(|b| b.is_ascii_hexdigit())));
        assert_eq!(ids.len(), 3);
        assert!(ids[0] != ids[1] && ids[1] != ids[2]);
        assert_eq!(map.me().index, 1);
        assert_eq!(map.ranges_of(1), vec![(8192, 16383)]);
        assert_eq!(map.me().node, NodeId(1));
        assert_eq!(map.groups()[1][0].node, NodeId(2));
    }

    #[test]
    fn routing_follows_the_metadata_services_table() {
        let map = map(0);
        let mut owner = map.table().owners().to_vec();
        owner[12182] = 0; // "foo" moves to group 0 in epoch 2; "bar" (5061) to group 1.
        owner[5061] = 1;
        let moved = map.at(&SlotTable::new(vec![0, 0, 1], owner));
        assert_eq!(route(&moved, "GET foo"), None);
        assert_eq!(route(&moved, "GET bar").as_deref(), Some("MOVED 5061 127.0.0.1:7002"));
    }
}
