//! The cluster metadata service: the slot map (which replica group owns each of the 16384
//! hash slots, and the map's epoch) agreed through Raft by every node of every group
//! (docs/decisions.md, "The slot map's metadata service"). Each node holds the whole map;
//! a change is a Raft entry, applied in the same order everywhere, so every node goes
//! through the same sequence of epochs, and a restarted node rebuilds the map from its log.
//!
//! Sans-I/O like the membership node: ticks, messages and proposals in; records to persist,
//! messages and applied proposals out. The Raft group is separate from the per-group
//! membership groups: its voters span all groups, the membership groups do not.

use std::collections::BTreeSet;

use chorus_core::slots::{Slot, SLOT_COUNT};
use chorus_core::{NodeId, Time};
use raft::prelude::{Entry, EntryType, MessageType};
use raft::storage::MemStorage;
use raft::{RawNode, StateRole};

use crate::message::MembershipMessage;
use crate::node::PersistRecord;

/// The metadata service's Raft log in the data directory.
pub const METADATA_LOG: &str = "metadata.log";

/// The slot map: an owner group per slot and the epoch, bumped by every applied change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotTable {
    epoch: u64,
    groups: u16,
    owner: Vec<u16>,
}

impl SlotTable {
    /// The map every node starts from (its configuration): epoch 1.
    pub fn new(groups: u16, owner: Vec<u16>) -> SlotTable {
        assert_eq!(owner.len(), usize::from(SLOT_COUNT), "an owner per slot");
        assert!(owner.iter().all(|group| *group < groups), "owners are groups");
        SlotTable { epoch: 1, groups, owner }
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    pub fn owner(&self, slot: Slot) -> u16 {
        self.owner[usize::from(slot)]
    }

    pub fn owners(&self) -> &[u16] {
        &self.owner
    }

    /// Apply one decided change. A change that names no group, or that would change
    /// nothing, is refused and leaves the epoch alone, at every node alike.
    fn apply(&mut self, change: &SlotChange) -> Result<u64, ChangeRefused> {
        match *change {
            SlotChange::Assign { first, last, group } => {
                if group >= self.groups {
                    return Err(ChangeRefused::NoSuchGroup(group));
                }
                let range = &mut self.owner[usize::from(first)..=usize::from(last)];
                if range.iter().all(|owner| *owner == group) {
                    return Err(ChangeRefused::Unchanged);
                }
                range.fill(group);
            }
        }
        self.epoch += 1;
        Ok(self.epoch)
    }
}

/// A change of the slot map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotChange {
    /// Slots `first..=last` belong to `group` from the next epoch on.
    Assign { first: Slot, last: Slot, group: u16 },
}

/// Why a decided change did nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ChangeRefused {
    #[error("there is no group {0}")]
    NoSuchGroup(u16),
    #[error("the slots already belong to that group")]
    Unchanged,
}

/// Why a proposal was not even put in the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProposeError {
    #[error("the metadata service has no Raft leader (a majority of all nodes is needed)")]
    NoLeader,
    #[error("slot range {0}-{1} is not within 0-16383")]
    BadRange(Slot, Slot),
}

const ASSIGN_TAG: u8 = 0x53;
const ASSIGN_BYTES: usize = 15;

fn encode(proposal: u64, change: &SlotChange) -> Vec<u8> {
    let SlotChange::Assign { first, last, group } = *change;
    let mut data = vec![ASSIGN_TAG];
    data.extend_from_slice(&proposal.to_le_bytes());
    for half in [first, last, group] {
        data.extend_from_slice(&half.to_le_bytes());
    }
    debug_assert_eq!(data.len(), ASSIGN_BYTES);
    data
}

fn decode(data: &[u8]) -> Option<(u64, SlotChange)> {
    if data.len() != ASSIGN_BYTES || data[0] != ASSIGN_TAG {
        return None; // Leader no-ops.
    }
    let proposal = u64::from_le_bytes(data[1..9].try_into().ok()?);
    let half = |at: usize| u16::from_le_bytes([data[at], data[at + 1]]);
    let (first, last) = (half(9), half(11));
    // The proposer checked the range, but a log is input like any other: never index past it.
    (first <= last && last < SLOT_COUNT)
        .then_some((proposal, SlotChange::Assign { first, last, group: half(13) }))
}

#[derive(Default, Debug)]
pub struct MetadataOutbox {
    /// Write these durably, in order, before sending `messages`.
    pub persist: Vec<PersistRecord>,
    pub messages: Vec<(NodeId, MembershipMessage)>,
    /// Proposals of this node that were decided, with the epoch they made or why not.
    pub decided: Vec<(u64, Result<u64, ChangeRefused>)>,
    /// The map changed: publish [`Metadata::table`].
    pub changed: bool,
}

pub struct Metadata {
    me: NodeId,
    raft: RawNode<MemStorage>,
    table: SlotTable,
    raft_tick_period: Time,
    next_raft_tick: Time,
    /// Proposals made here, by id, so that only this node reports them decided.
    pending: BTreeSet<u64>,
    /// Every proposal id applied (decided by the log, so the same at every node): a proposal
    /// made again, because the first copy might have been lost, is applied once.
    applied: BTreeSet<u64>,
}

/// Raft ids must be non-zero.
fn raft_id(node: NodeId) -> u64 {
    u64::from(node.0) + 1
}

impl Metadata {
    /// A node of the service whose voters are `members` (every node of every group), starting
    /// from `initial` and the records a previous incarnation persisted. Call [`Metadata::on_tick`]
    /// once before trusting [`Metadata::table`]: it re-applies the restored log.
    pub fn restore(
        me: NodeId,
        members: &[NodeId],
        initial: SlotTable,
        records: &[PersistRecord],
        now: Time,
    ) -> Metadata {
        assert!(members.contains(&me), "a node is a member of its own metadata service");
        let voters = members.iter().copied().map(raft_id).collect();
        let raft_tick_period = Time::from_millis(10);
        Metadata {
            me,
            raft: crate::raft_io::restore(raft_id(me), me.index(), voters, records),
            table: initial,
            raft_tick_period,
            next_raft_tick: now + raft_tick_period,
            pending: BTreeSet::new(),
            applied: BTreeSet::new(),
        }
    }

    pub fn table(&self) -> &SlotTable {
        &self.table
    }

    pub fn is_leader(&self) -> bool {
        self.raft.raft.state == StateRole::Leader
    }

    /// What a crash now would leave on disk (the simulator and tests restart from it).
    pub fn durable_records(&self) -> Vec<PersistRecord> {
        crate::raft_io::durable_records(&self.raft)
    }

    /// Put `change` in the log under the caller's unique `proposal` id; a follower forwards
    /// it to the leader. It may be lost on the way (a link not up yet, a leader that fails):
    /// the caller proposes it again under the same id, which is applied at most once.
    pub fn propose(
        &mut self,
        proposal: u64,
        change: SlotChange,
        out: &mut MetadataOutbox,
    ) -> Result<(), ProposeError> {
        let SlotChange::Assign { first, last, .. } = change;
        if first > last || last >= SLOT_COUNT {
            return Err(ProposeError::BadRange(first, last));
        }
        if self.raft.raft.leader_id == raft::INVALID_ID {
            return Err(ProposeError::NoLeader);
        }
        self.raft.propose(vec![], encode(proposal, &change)).map_err(|_| ProposeError::NoLeader)?;
        self.pending.insert(proposal);
        self.handle_ready(out);
        Ok(())
    }

    /// Forget a proposal its caller gave up on.
    pub fn abandon(&mut self, proposal: u64) {
        self.pending.remove(&proposal);
    }

    pub fn on_tick(&mut self, now: Time, out: &mut MetadataOutbox) {
        while now >= self.next_raft_tick {
            self.raft.tick();
            self.next_raft_tick = self.next_raft_tick + self.raft_tick_period;
        }
        self.handle_ready(out);
    }

    pub fn on_message(&mut self, from: NodeId, message: MembershipMessage, out: &mut MetadataOutbox) {
        let MembershipMessage::Raft(mut message) = message else { return };
        if message.from != raft_id(from) {
            return; // A peer speaks for itself only.
        }
        // As in the membership node: a heartbeat commits nothing this log does not hold
        // (a node that lost its metadata.log would make raft-rs panic otherwise).
        let last_index = self.raft.raft.raft_log.last_index();
        if message.get_msg_type() == MessageType::MsgHeartbeat && message.get_commit() > last_index {
            message.set_commit(last_index);
        }
        // A malformed or stale message is the sender's problem, not a reason to stop.
        let _ = self.raft.step(message);
        self.handle_ready(out);
    }

    fn handle_ready(&mut self, out: &mut MetadataOutbox) {
        let readied = crate::raft_io::drive(&mut self.raft, &mut out.persist);
        for message in readied.messages {
            if let Ok(to) = u8::try_from(message.to - 1) {
                out.messages.push((NodeId(to), MembershipMessage::Raft(message)));
            }
        }
        for entry in &readied.committed {
            self.apply(entry, out);
        }
    }

    fn apply(&mut self, entry: &Entry, out: &mut MetadataOutbox) {
        if entry.get_entry_type() != EntryType::EntryNormal {
            return;
        }
        let Some((proposal, change)) = decode(&entry.data) else { return };
        if !self.applied.insert(proposal) {
            return; // A copy of a proposal already applied.
        }
        let result = self.table.apply(&change);
        out.changed |= result.is_ok();
        if self.pending.remove(&proposal) {
            out.decided.push((proposal, result));
        }
    }

    pub fn me(&self) -> NodeId {
        self.me
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `count` nodes delivering every message at once, in order; `down` nodes get nothing.
    struct Net {
        nodes: Vec<Option<Metadata>>,
        disks: Vec<Vec<PersistRecord>>,
        now: Time,
        decided: Vec<(u64, Result<u64, ChangeRefused>)>,
    }

    fn initial() -> SlotTable {
        let owner = (0..SLOT_COUNT).map(|slot| u16::from(slot >= 8192)).collect();
        SlotTable::new(2, owner)
    }

    fn members(count: u8) -> Vec<NodeId> {
        (0..count).map(NodeId).collect()
    }

    impl Net {
        fn new(count: u8) -> Net {
            let nodes = members(count)
                .into_iter()
                .map(|me| Some(Metadata::restore(me, &members(count), initial(), &[], Time::ZERO)))
                .collect();
            Net { nodes, disks: vec![Vec::new(); usize::from(count)], now: Time::ZERO, decided: Vec::new() }
        }

        fn settle(&mut self, outs: Vec<(usize, MetadataOutbox)>) {
            let mut queue = std::collections::VecDeque::from(outs);
            while let Some((from, out)) = queue.pop_front() {
                self.disks[from].extend(out.persist);
                self.decided.extend(out.decided);
                for (to, message) in out.messages {
                    let Some(node) = self.nodes[to.index()].as_mut() else { continue };
                    let mut reply = MetadataOutbox::default();
                    node.on_message(NodeId(from as u8), message, &mut reply);
                    queue.push_back((to.index(), reply));
                }
            }
        }

        fn run_ms(&mut self, ms: u64) {
            for _ in 0..ms / 10 {
                self.now = self.now + Time::from_millis(10);
                let mut outs = Vec::new();
                for (index, node) in self.nodes.iter_mut().enumerate() {
                    if let Some(node) = node {
                        let mut out = MetadataOutbox::default();
                        node.on_tick(self.now, &mut out);
                        outs.push((index, out));
                    }
                }
                self.settle(outs);
            }
        }

        fn propose(&mut self, at: usize, proposal: u64, change: SlotChange) -> Result<(), ProposeError> {
            let mut out = MetadataOutbox::default();
            let result = self.nodes[at].as_mut().unwrap().propose(proposal, change, &mut out);
            self.settle(vec![(at, out)]);
            result
        }

        fn epochs(&self) -> Vec<Option<u64>> {
            self.nodes.iter().map(|node| node.as_ref().map(|node| node.table().epoch())).collect()
        }
    }

    #[test]
    fn a_change_proposed_at_a_follower_reaches_every_node() {
        let mut net = Net::new(4);
        net.run_ms(1_000);
        let follower = net.nodes.iter().position(|node| !node.as_ref().unwrap().is_leader()).unwrap();
        net.propose(follower, 7, SlotChange::Assign { first: 100, last: 199, group: 1 }).unwrap();
        net.run_ms(100);
        assert_eq!(net.decided, vec![(7, Ok(2))]);
        assert_eq!(net.epochs(), vec![Some(2); 4]);
        for node in net.nodes.iter().flatten() {
            assert_eq!(node.table().owner(99), 0);
            assert_eq!(node.table().owner(100), 1);
            assert_eq!(node.table().owner(199), 1);
            assert_eq!(node.table().owner(200), 0);
        }
        // Refused alike everywhere: no epoch is spent on a change that changes nothing.
        net.propose(follower, 8, SlotChange::Assign { first: 100, last: 100, group: 1 }).unwrap();
        net.propose(follower, 9, SlotChange::Assign { first: 0, last: 0, group: 5 }).unwrap();
        net.run_ms(100);
        assert_eq!(
            net.decided[1..],
            [(8, Err(ChangeRefused::Unchanged)), (9, Err(ChangeRefused::NoSuchGroup(5)))]
        );
        assert_eq!(net.epochs(), vec![Some(2); 4]);
        // A proposal made again (its first copy might have been lost) is applied once, even
        // after a later change it would otherwise undo.
        net.propose(follower, 11, SlotChange::Assign { first: 300, last: 300, group: 1 }).unwrap();
        net.propose(follower, 12, SlotChange::Assign { first: 300, last: 300, group: 0 }).unwrap();
        net.propose(follower, 11, SlotChange::Assign { first: 300, last: 300, group: 1 }).unwrap();
        net.run_ms(100);
        assert_eq!(net.epochs(), vec![Some(4); 4]);
        assert!(net.nodes.iter().flatten().all(|node| node.table().owner(300) == 0));
        assert_eq!(
            net.propose(follower, 10, SlotChange::Assign { first: 5, last: 16384, group: 0 }),
            Err(ProposeError::BadRange(5, 16384))
        );
    }

    #[test]
    fn a_restarted_node_rebuilds_the_map_from_its_log() {
        let mut net = Net::new(3);
        net.run_ms(1_000);
        net.propose(0, 1, SlotChange::Assign { first: 0, last: 10, group: 1 }).unwrap();
        net.run_ms(100);
        // Node 2 crashes; the others move on without it, then it restarts from its disk.
        net.nodes[2] = None;
        net.propose(0, 2, SlotChange::Assign { first: 16000, last: 16383, group: 0 }).unwrap();
        net.run_ms(100);
        assert_eq!(net.epochs(), vec![Some(3), Some(3), None]);
        let restored = Metadata::restore(NodeId(2), &members(3), initial(), &net.disks[2], net.now);
        net.nodes[2] = Some(restored);
        net.run_ms(10);
        // What it had decided comes back from its own log at once...
        assert!(net.nodes[2].as_ref().unwrap().table().epoch() >= 2);
        assert_eq!(net.nodes[2].as_ref().unwrap().table().owner(10), 1);
        // ...and what it missed from the leader.
        net.run_ms(500);
        assert_eq!(net.epochs(), vec![Some(3); 3]);
        assert_eq!(net.nodes[2].as_ref().unwrap().table(), net.nodes[0].as_ref().unwrap().table());
    }

    #[test]
    fn without_a_majority_nothing_changes() {
        let mut net = Net::new(3);
        net.run_ms(1_000);
        let leader = net.nodes.iter().position(|node| node.as_ref().unwrap().is_leader()).unwrap();
        for other in (0..3).filter(|index| *index != leader) {
            net.nodes[other] = None;
        }
        // check_quorum: the lone leader steps down, and proposals are refused or never decided.
        net.run_ms(1_000);
        let _ = net.propose(leader, 3, SlotChange::Assign { first: 0, last: 0, group: 1 });
        net.run_ms(500);
        assert!(net.decided.is_empty());
        assert_eq!(net.nodes[leader].as_ref().unwrap().table().epoch(), 1);
    }

    #[test]
    fn garbage_entries_are_ignored() {
        assert_eq!(decode(&[ASSIGN_TAG; 3]), None);
        let mut bad = encode(1, &SlotChange::Assign { first: 5, last: 6, group: 0 });
        bad[11..13].copy_from_slice(&20_000u16.to_le_bytes());
        assert_eq!(decode(&bad), None);
        let good = encode(9, &SlotChange::Assign { first: 5, last: 6, group: 1 });
        assert_eq!(decode(&good), Some((9, SlotChange::Assign { first: 5, last: 6, group: 1 })));
    }
}
