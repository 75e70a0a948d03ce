//! Who belongs to every log: Raft configuration changes that replace a node, and identity
//! checks that refuse a node which lost its data.
//!
//! **Identities.** A member of a log is a Raft id, `(incarnation << 8 | node) + 1`: the
//! founding members are incarnation 0; a replacement starts with a fresh data directory and
//! a new incarnation, so it is a new Raft member, never mistaken for the one it replaces.
//! Every node with a data directory also has an *identity* (random, made with the
//! directory) and sends it, with its incarnation, in a [`Message::Hello`] when it starts and
//! whenever a peer asks. A peer records the first identity each Raft id showed it (durably:
//! [`Record::Identity`], checkpoints) and takes Raft messages from a node only once that
//! node's Hello matched since the peer started. A node that lost its data directory and
//! starts again as the same member shows a new identity under the old Raft id: it is
//! **refused** ([`Message::Refused`]); it has forgotten its votes and the entries it
//! acknowledged, so letting it vote or count towards a quorum could lose committed entries.
//! It must be replaced: started with `--join` (a new incarnation) on an empty directory.
//!
//! **Replacement.** A joining node announces itself (`Hello { joining: true }`) until it is
//! a member of every log of its shard. The leader of each log that still has another member
//! for that node proposes one configuration change (`ConfChangeV2`, joint consensus left
//! automatically): add the new Raft id, remove the old. Both majorities of the joint
//! configuration are reached by the other members, so a dead predecessor blocks nothing.
//! Configuration changes apply in log order when committed; after a change that adds a
//! member every replica compacts that log, so the snapshot the new member is sent already
//! lists it (raft-rs refuses a snapshot whose configuration lacks the receiver). A joining
//! node starts with the founding configuration, as every node did, and learns every later
//! change from the snapshot or the log; until its own Raft id is a voter it never campaigns.

use super::*;
use crate::durable::Record;
use raft::prelude::{ConfChangeSingle, ConfChangeTransition, ConfChangeType, ConfChangeV2, ConfState};

/// How often a joining node repeats its announcement until every log took it in.
const JOIN_ANNOUNCE_PERIOD: Time = Time::from_millis(200);

/// Membership state of one core.
#[derive(Debug, Default)]
pub(super) struct Members {
    /// The identity each peer Raft id first showed (persisted).
    pub identities: BTreeMap<u64, u64>,
    /// Peers whose Hello matched since this core started.
    pub verified: NodeSet,
    /// Peers refused: they came back under a Raft id whose data they lost.
    pub refused: NodeSet,
    /// When this core last asked each peer for a Hello.
    pub asked_at: FxHashMap<NodeId, Time>,
    /// Nodes announcing themselves as replacements, with their new incarnation.
    pub joiners: BTreeMap<NodeId, u64>,
    /// A peer refused this node: it lost its data and must be replaced (`--join`).
    pub refused_by: Option<NodeId>,
    /// This core sent its first Hellos; when a joining node announces itself next.
    pub greeted: bool,
    pub next_announce: Time,
}

/// Every Raft id `group` counts as a member (voters, outgoing voters, learners).
fn member_ids(group: &Group) -> impl Iterator<Item = u64> + '_ {
    group.raft.raft.prs().iter().map(|(id, _)| *id)
}

impl RaftLog {
    /// This node's Raft id in every log.
    pub(super) fn my_raft_id(&self) -> u64 {
        raft_id_of(self.config.me, self.config.incarnation)
    }

    /// Identity checks are on when this node has an identity (a data directory).
    fn checks_identities(&self) -> bool {
        self.config.identity != 0
    }

    /// A peer refused this node (it lost its data): it must be replaced, not restarted.
    pub fn refused_by(&self) -> Option<NodeId> {
        self.members.refused_by
    }

    /// Peers this node refused, and Raft ids it knows identities of.
    pub fn peers_refused(&self) -> NodeSet {
        self.members.refused
    }

    /// Whether this node is a voter of every log (a replacement: once it took its place).
    pub fn is_voter_everywhere(&self) -> bool {
        let me = self.my_raft_id();
        self.groups.iter().all(|group| group.raft.raft.prs().conf().voters().contains(me))
    }

    /// Whether messages from `from` may reach the logs: always without identity checks;
    /// with them, once `from`'s Hello matched (asked for, at most once per retry timeout).
    pub(super) fn admits(&mut self, now: Time, from: NodeId, out: &mut Outbox<Message>) -> bool {
        if !self.checks_identities() {
            return true;
        }
        if self.members.verified.contains(from) {
            return true;
        }
        if self.members.refused.contains(from) {
            self.stats.messages_refused += 1;
            out.send(from, Message::Refused);
            return false;
        }
        let due = self.members.asked_at.get(&from).is_none_or(|at| now >= *at + self.config.retry_timeout);
        if due {
            self.members.asked_at.insert(from, now);
            out.send(from, Message::HelloRequest);
        }
        self.stats.messages_refused += 1;
        false
    }

    /// Send this node's Hello to `to`.
    fn hello(&self, to: NodeId, out: &mut Outbox<Message>) {
        let (incarnation, identity, joining) =
            (self.config.incarnation, self.config.identity, self.config.joining);
        out.send(
            to,
            Message::Hello { incarnation, identity, joining: joining && !self.is_voter_everywhere() },
        );
    }

    /// Greet every peer at start; a joining node repeats it until every log took it in.
    pub(super) fn greet(&mut self, now: Time, out: &mut Outbox<Message>) {
        if !self.checks_identities() || self.members.refused_by.is_some() {
            return;
        }
        let announcing =
            self.config.joining && !self.is_voter_everywhere() && now >= self.members.next_announce;
        if self.members.greeted && !announcing {
            return;
        }
        self.members.greeted = true;
        self.members.next_announce = now + JOIN_ANNOUNCE_PERIOD;
        for peer in self.config.members.iter().filter(|peer| *peer != self.config.me) {
            self.hello(peer, out);
        }
    }

    /// A peer's Hello, HelloRequest or Refused.
    pub(super) fn on_member_message(&mut self, from: NodeId, message: Message, out: &mut Outbox<Message>) {
        match message {
            Message::HelloRequest if self.checks_identities() && self.members.refused_by.is_none() => {
                self.hello(from, out)
            }
            Message::Refused if self.checks_identities() => {
                self.members.refused_by.get_or_insert(from);
            }
            Message::Hello { incarnation, identity, joining } if self.checks_identities() => {
                self.on_hello(from, incarnation, identity, joining, out)
            }
            _ => {}
        }
    }

    fn on_hello(
        &mut self,
        from: NodeId,
        incarnation: u64,
        identity: u64,
        joining: bool,
        out: &mut Outbox<Message>,
    ) {
        let raft_id = raft_id_of(from, incarnation);
        match self.members.identities.get(&raft_id) {
            Some(known) if *known != identity => {
                // The same member with another data directory: it lost what it promised.
                self.members.refused.insert(from);
                self.members.verified.remove(from);
                self.stats.peers_refused += 1;
                out.send(from, Message::Refused);
                return;
            }
            Some(_) => {}
            None => {
                self.members.identities.insert(raft_id, identity);
                if self.config.durable {
                    self.push_durable(Record::Identity { raft_id, identity }, true);
                }
            }
        }
        self.members.refused.remove(from);
        self.members.verified.insert(from);
        if joining && incarnation != 0 {
            self.members.joiners.insert(from, incarnation);
        }
    }

    /// As the leader of `log`: swap the previous member of each announced replacement for
    /// it, one configuration change at a time.
    pub(super) fn propose_replacements(&mut self, log: usize) {
        if self.members.joiners.is_empty() || !self.groups[log].is_leader() {
            return;
        }
        let group = &self.groups[log];
        let raft = &group.raft.raft;
        if raft.has_pending_conf() || !raft.prs().conf().to_conf_state().voters_outgoing.is_empty() {
            return; // one change at a time; a joint configuration is being left
        }
        let replacement = self.members.joiners.iter().find_map(|(node, incarnation)| {
            let new = raft_id_of(*node, *incarnation);
            let present = member_ids(group).any(|id| id == new);
            (!present).then(|| {
                (new, member_ids(group).filter(|id| node_of(*id) == Some(*node)).collect::<Vec<_>>())
            })
        });
        let Some((new, old)) = replacement else { return };
        let mut changes = vec![ConfChangeSingle {
            change_type: ConfChangeType::AddNode,
            node_id: new,
            ..Default::default()
        }];
        changes.extend(old.iter().map(|id| ConfChangeSingle {
            change_type: ConfChangeType::RemoveNode,
            node_id: *id,
            ..Default::default()
        }));
        let change = ConfChangeV2 {
            transition: ConfChangeTransition::Auto,
            changes: changes.into(),
            ..Default::default()
        };
        if self.groups[log].raft.propose_conf_change(Vec::new(), change).is_ok() {
            self.stats.members_replaced += 1;
        }
    }

    /// A committed configuration change of `log` is applied, in log order: raft-rs takes it,
    /// the storage keeps the new configuration for snapshots, and a change that adds a member
    /// compacts the log so the snapshot the newcomer is sent lists it.
    pub(super) fn apply_conf_change(&mut self, log: usize, entry_type: EntryType, data: &[u8]) {
        let change = match entry_type {
            EntryType::EntryConfChangeV2 => ConfChangeV2::parse_from_bytes(data).ok(),
            EntryType::EntryConfChange => {
                raft::prelude::ConfChange::parse_from_bytes(data).ok().map(|change| {
                    let single = ConfChangeSingle {
                        change_type: change.get_change_type(),
                        node_id: change.node_id,
                        ..Default::default()
                    };
                    ConfChangeV2 { changes: vec![single].into(), ..Default::default() }
                })
            }
            EntryType::EntryNormal => None,
        };
        let Some(change) = change else {
            self.stats.entries_malformed += 1;
            return;
        };
        let group = &mut self.groups[log];
        let before: Vec<u64> = member_ids(group).collect();
        match group.raft.apply_conf_change(&change) {
            Ok(conf_state) => {
                let added = member_ids(group).any(|id| !before.contains(&id));
                group.raft.mut_store().set_conf_state(conf_state);
                self.stats.conf_changes_applied += 1;
                if added {
                    self.compaction_due = true;
                }
            }
            // Every replica refuses the same change the same way: the configuration stays.
            Err(_) => self.stats.entries_malformed += 1,
        }
    }

    /// The founding configuration: every member of the cluster at incarnation 0.
    pub(super) fn founding_conf(config: &RaftLogConfig) -> ConfState {
        ConfState::from((config.members.iter().map(raft_id).collect::<Vec<u64>>(), vec![]))
    }
}

use protobuf::Message as _;
