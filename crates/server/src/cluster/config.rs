//! The `[cluster]` section of a node's configuration: which replica group this node is in
//! and which slots every group owns (docs/operations.md, "Sharding").
//!
//! ```toml
//! [cluster]
//! group = 1                                  # this node's group, an index into `groups`
//! [[cluster.groups]]
//! slots = ["0-8191"]                         # inclusive ranges, or single slots "42"
//! clients = ["10.0.0.1:7379", "10.0.0.2:7379", "10.0.0.3:7379"]  # its nodes, as clients reach them
//! meta = ["10.0.0.1:9379", "10.0.0.2:9379", "10.0.0.3:9379"]     # their metadata service
//! [[cluster.groups]]
//! slots = ["8192-16383"]
//! clients = ["10.0.1.1:7379", "10.0.1.2:7379", "10.0.1.3:7379"]
//! meta = ["10.0.1.1:9379", "10.0.1.2:9379", "10.0.1.3:9379"]
//! ```
//!
//! `slots` is the map at epoch 1; from then on the map is the metadata service's (every node
//! of every group is one of its Raft voters, at its `meta` address: cluster/service.rs).
//!
//! Every node of every group gets the same `groups`; only `group` differs. The first client
//! address of a group is the one `-MOVED` sends clients to and the one CLUSTER SLOTS lists
//! first (its "master"); every node of the group serves reads and writes of its slots.

use std::net::SocketAddr;

use chorus_core::slots::{Slot, SLOT_COUNT};

use crate::config::ConfigError;

#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawCluster {
    pub group: Option<u16>,
    #[serde(default)]
    pub groups: Vec<RawGroup>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct RawGroup {
    pub slots: Vec<String>,
    pub clients: Vec<String>,
    /// Per node, in the order of `clients`: where its metadata service listens for the
    /// other nodes' (peer traffic, like `peer_addr`).
    #[serde(default)]
    pub meta: Vec<String>,
}

/// A validated `[cluster]` section: every slot owned by exactly one group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterSettings {
    /// This node's group: an index into `groups`.
    pub group: u16,
    pub groups: Vec<GroupSettings>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupSettings {
    /// Inclusive slot ranges, sorted.
    pub slots: Vec<(Slot, Slot)>,
    /// The group's nodes as clients reach them; the first is the one redirects name.
    pub clients: Vec<SocketAddr>,
    /// The same nodes' metadata service addresses.
    pub meta: Vec<SocketAddr>,
}

/// Most nodes in all groups together: the metadata service's peer ids are one byte and its
/// transport's node sets hold 64.
pub const NODES_MAX: usize = chorus_core::NodeId::COUNT_MAX;

fn field_error(field: &str, message: impl std::fmt::Display) -> ConfigError {
    ConfigError(format!("config field `{field}`: {message}"))
}

impl RawCluster {
    /// Validate against this node's client address, which must be listed in its group.
    pub fn validate(&self, client_addr: SocketAddr) -> Result<ClusterSettings, ConfigError> {
        if self.groups.is_empty() {
            return Err(field_error("cluster.groups", "missing: list every replica group"));
        }
        if self.groups.len() > usize::from(SLOT_COUNT) {
            return Err(field_error("cluster.groups", format!("more than {SLOT_COUNT} groups")));
        }
        let group = self.group.ok_or_else(|| field_error("cluster.group", "missing: this node's group"))?;
        if usize::from(group) >= self.groups.len() {
            return Err(field_error(
                "cluster.group",
                format!("{group} is not a group (there are {})", self.groups.len()),
            ));
        }
        let mut owner: Vec<Option<usize>> = vec![None; usize::from(SLOT_COUNT)];
        let mut groups = Vec::with_capacity(self.groups.len());
        for (index, raw) in self.groups.iter().enumerate() {
            let field = format!("cluster.groups[{index}]");
            let slots = raw
                .slots
                .iter()
                .map(|text| {
                    parse_range(text).ok_or_else(|| {
                        field_error(
                            &format!("{field}.slots"),
                            format!(
                                "{text:?} is not a slot or a range \"first-last\" of slots 0..{}",
                                SLOT_COUNT - 1
                            ),
                        )
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            for (first, last) in &slots {
                for slot in *first..=*last {
                    if let Some(other) = owner[usize::from(slot)].replace(index) {
                        return Err(field_error(
                            &format!("{field}.slots"),
                            format!("slot {slot} is also owned by group {other}"),
                        ));
                    }
                }
            }
            if raw.clients.is_empty() {
                return Err(field_error(&format!("{field}.clients"), "missing: the group's nodes"));
            }
            let clients = parse_addrs(&raw.clients, &format!("{field}.clients"))?;
            let meta = parse_addrs(&raw.meta, &format!("{field}.meta"))?;
            if meta.len() != clients.len() {
                return Err(field_error(
                    &format!("{field}.meta"),
                    format!(
                        "{} addresses for {} nodes: list each node's metadata service address, in the order of `clients`",
                        meta.len(),
                        clients.len()
                    ),
                ));
            }
            let mut slots = slots;
            slots.sort_unstable();
            groups.push(GroupSettings { slots, clients, meta });
        }
        let nodes = groups.iter().map(|group| group.clients.len()).sum::<usize>();
        if nodes > NODES_MAX {
            return Err(field_error(
                "cluster.groups",
                format!("{nodes} nodes; at most {NODES_MAX} in all groups"),
            ));
        }
        if let Some(slot) = owner.iter().position(Option::is_none) {
            return Err(field_error("cluster.groups", format!("slot {slot} is owned by no group")));
        }
        if !groups[usize::from(group)].clients.contains(&client_addr) {
            return Err(field_error(
                "cluster.groups",
                format!("group {group}'s clients must list this node's client_addr {client_addr}"),
            ));
        }
        Ok(ClusterSettings { group, groups })
    }
}

fn parse_addrs(addrs: &[String], field: &str) -> Result<Vec<SocketAddr>, ConfigError> {
    addrs
        .iter()
        .map(|addr| {
            addr.parse::<SocketAddr>()
                .map_err(|error| field_error(field, format!("{addr:?} is not ip:port: {error}")))
        })
        .collect()
}

/// `"42"` or `"0-5460"` (inclusive), within `0..SLOT_COUNT`.
fn parse_range(text: &str) -> Option<(Slot, Slot)> {
    let (first, last) = match text.split_once('-') {
        Some((first, last)) => (first.trim().parse().ok()?, last.trim().parse().ok()?),
        None => {
            let slot = text.trim().parse().ok()?;
            (slot, slot)
        }
    };
    (first <= last && last < SLOT_COUNT).then_some((first, last))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(group: u16, groups: &[(&[&str], &[&str])]) -> RawCluster {
        RawCluster {
            group: Some(group),
            groups: groups
                .iter()
                .map(|(slots, clients)| RawGroup {
                    slots: slots.iter().map(|s| s.to_string()).collect(),
                    clients: clients.iter().map(|s| s.to_string()).collect(),
                    meta: clients.iter().map(|s| s.replace(":7", ":9")).collect(),
                })
                .collect(),
        }
    }

    const ME: &str = "127.0.0.1:7379";

    fn error(cluster: &RawCluster) -> String {
        cluster.validate(ME.parse().unwrap()).unwrap_err().0
    }

    #[test]
    fn a_complete_map_validates() {
        let cluster =
            raw(0, &[(&["0-8191"], &[ME, "127.0.0.1:7380"]), (&["8192-16383"], &["127.0.0.1:7381"])]);
        let settings = cluster.validate(ME.parse().unwrap()).unwrap();
        assert_eq!(settings.groups[1].slots, vec![(8192, 16383)]);
        assert_eq!(settings.groups[0].clients.len(), 2);
    }

    #[test]
    fn every_slot_must_have_exactly_one_owner() {
        let gap = raw(0, &[(&["0-8190"], &[ME]), (&["8192-16383"], &["127.0.0.1:1"])]);
        assert!(error(&gap).contains("slot 8191 is owned by no group"), "{}", error(&gap));
        let overlap = raw(0, &[(&["0-8192"], &[ME]), (&["8192-16383"], &["127.0.0.1:1"])]);
        assert!(error(&overlap).contains("slot 8192 is also owned by group 0"), "{}", error(&overlap));
    }

    #[test]
    fn bad_fields_are_named() {
        assert!(error(&raw(0, &[(&["0-16384"], &[ME])])).contains("cluster.groups[0].slots"));
        assert!(error(&raw(0, &[(&["9-1"], &[ME])])).contains("is not a slot"));
        assert!(error(&raw(1, &[(&["0-16383"], &[ME])])).contains("`cluster.group`"));
        assert!(error(&raw(0, &[(&["0-16383"], &["127.0.0.1:1"])])).contains("must list this node"));
        assert!(error(&raw(0, &[(&["0-16383"], &["nowhere"])])).contains("is not ip:port"));
        assert!(error(&RawCluster::default()).contains("`cluster.groups`"));
        let mut no_meta = raw(0, &[(&["0-16383"], &[ME])]);
        no_meta.groups[0].meta.clear();
        assert!(
            error(&no_meta).contains("`cluster.groups[0].meta`: 0 addresses for 1 nodes"),
            "{}",
            error(&no_meta)
        );
    }
}
