//! The cluster metadata service: the slot map (which replica group owns each of the 16384
//! hash slots, and the map's epoch) agreed through Raft by every node of every group
//! (docs/decisions.md, "The slot map's metadata service"). Each node holds the whole map;
//! a change is a Raft entry, applied in the same order everywhere, so every node goes
//! through the same sequence of epochs, and a restarted node rebuilds the map from its log.
//!
//! Sans-I/O like the membership node: ticks, messages and proposals in; records to persist,
//! messages and applied proposals out. The Raft group is separate from the per-group
//! membership groups: its voters span all groups, the membership groups do not.

use std::collections::{BTreeMap, BTreeSet};

use chorus_core::slots::{Slot, SLOT_COUNT};
use chorus_core::{NodeId, NodeSet, Time};
use raft::prelude::{Entry, EntryType, MessageType};
use raft::storage::MemStorage;
use raft::{RawNode, StateRole};

use crate::message::MembershipMessage;
use crate::node::PersistRecord;

/// The metadata service's Raft log in the data directory.
pub const METADATA_LOG: &str = "metadata.log";

/// The slot map: an owner group per slot, the moves in progress, and the epoch, bumped by
/// every applied change that routing sees.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotTable {
    epoch: u64,
    groups: u16,
    owner: Vec<u16>,
    /// Per metadata node id, its replica group: whose reports a move out of a group waits for.
    group_of: Vec<u16>,
    moves: BTreeMap<Slot, SlotMove>,
}

/// A slot on its way from its owner to another group (docs/decisions.md, decision 16). Each
/// phase ends when every node that must say so has, or when a mover has seen its work done:
///
/// * `Closing`: the owner's nodes stop serving the slot; each reports `Drained` once it has
///   applied the move and nothing it started on the slot is running.
/// * `Copying` (every owner node drained): movers mark each key at the owner, copy it to the
///   new group, leave a tombstone; the owner sends clients on (`-ASK`) for keys it does not
///   hold, the new group serves them after ASKING. A mover says `Copied` once every key is
///   gone or a tombstone.
/// * `Sealing`: the new group's nodes stop taking copies; each reports `Sealed` once none is
///   running there, so no copy can land after a client wrote the key.
/// * `Cleaning` (every new-group node sealed): movers delete what is left of the slot at the
///   owner (tombstones, and writes no client was answered for); `Cleaned` ends the move and
///   the new group owns the slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotMove {
    pub to: u16,
    /// The epoch the move began at: it names this move, so a report proposed for an earlier
    /// move of the same slot (and decided late) is refused.
    pub began: u64,
    pub phase: MovePhase,
    /// Owner nodes that reported `Drained` (while closing).
    pub drained: NodeSet,
    /// New-group nodes that reported `Sealed` (while sealing).
    pub sealed: NodeSet,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum MovePhase {
    Closing,
    Copying,
    Sealing,
    Cleaning,
}

impl SlotTable {
    /// The map every node starts from (its configuration): epoch 1. `group_of[n]` is the
    /// group of metadata node `n`; there are as many groups as it names.
    pub fn new(group_of: Vec<u16>, owner: Vec<u16>) -> SlotTable {
        assert_eq!(owner.len(), usize::from(SLOT_COUNT), "an owner per slot");
        assert!(group_of.len() <= NodeId::COUNT_MAX, "at most 64 nodes");
        let groups = group_of.iter().copied().max().map_or(0, |last| last + 1);
        assert!(owner.iter().all(|group| *group < groups), "owners are groups");
        SlotTable { epoch: 1, groups, owner, group_of, moves: BTreeMap::new() }
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    pub fn groups(&self) -> u16 {
        self.groups
    }

    pub fn owner(&self, slot: Slot) -> u16 {
        self.owner[usize::from(slot)]
    }

    pub fn owners(&self) -> &[u16] {
        &self.owner
    }

    /// The move of `slot` in progress, if any.
    pub fn moving(&self, slot: Slot) -> Option<&SlotMove> {
        self.moves.get(&slot)
    }

    pub fn moves(&self) -> impl Iterator<Item = (Slot, &SlotMove)> {
        self.moves.iter().map(|(slot, moving)| (*slot, moving))
    }

    /// The metadata nodes of `group`.
    pub fn nodes_of(&self, group: u16) -> NodeSet {
        (0..self.group_of.len())
            .filter(|node| self.group_of[*node] == group)
            .map(|node| NodeId(node as u8))
            .collect()
    }

    /// Apply one decided change: the epoch it made, or why it did nothing. Refused alike at
    /// every node (the table is the same everywhere when a change applies).
    pub(crate) fn apply(&mut self, change: &SlotChange) -> Result<u64, ChangeRefused> {
        match *change {
            SlotChange::Assign { first, last, group } => self.assign(first, last, group)?,
            SlotChange::BeginMove { slot, to } => {
                if to >= self.groups {
                    return Err(ChangeRefused::NoSuchGroup(to));
                }
                if self.owner(slot) == to {
                    return Err(ChangeRefused::Unchanged);
                }
                if self.moves.contains_key(&slot) {
                    return Err(ChangeRefused::Moving(slot));
                }
                let began = self.epoch + 1;
                let moving = SlotMove {
                    to,
                    began,
                    phase: MovePhase::Closing,
                    drained: NodeSet::EMPTY,
                    sealed: NodeSet::EMPTY,
                };
                self.moves.insert(slot, moving);
            }
            SlotChange::Drained { slot, node, began } => {
                let owner_nodes = self.nodes_of(self.owner(slot));
                return self.report(slot, began, MovePhase::Closing, node, owner_nodes);
            }
            SlotChange::Copied { slot, began } => self.advance(slot, began, MovePhase::Copying)?,
            SlotChange::Sealed { slot, node, began } => {
                let moving = self.current_move(slot, began)?;
                let new_nodes = self.nodes_of(moving.to);
                return self.report(slot, began, MovePhase::Sealing, node, new_nodes);
            }
            SlotChange::Cleaned { slot, began } => {
                let moving = self.current_move(slot, began)?;
                if moving.phase != MovePhase::Cleaning {
                    return Err(ChangeRefused::Phase(slot));
                }
                self.owner[usize::from(slot)] = moving.to;
                self.moves.remove(&slot);
            }
            SlotChange::CancelMove { slot, began } => {
                // Once copying, the new group may have served the slot's keys: going back
                // would lose what it wrote. Only a move still closing can be called off.
                if self.current_move(slot, began)?.phase != MovePhase::Closing {
                    return Err(ChangeRefused::Phase(slot));
                }
                self.moves.remove(&slot);
            }
        }
        self.epoch += 1;
        Ok(self.epoch)
    }

    /// The move goes from `phase` to the next one.
    fn advance(&mut self, slot: Slot, began: u64, phase: MovePhase) -> Result<(), ChangeRefused> {
        if self.current_move(slot, began)?.phase != phase {
            return Err(ChangeRefused::Phase(slot));
        }
        let moving = self.moves.get_mut(&slot).expect("checked");
        moving.phase = match phase {
            MovePhase::Closing => MovePhase::Copying,
            MovePhase::Copying => MovePhase::Sealing,
            MovePhase::Sealing | MovePhase::Cleaning => MovePhase::Cleaning,
        };
        Ok(())
    }

    /// A node of `from` reports the move's `phase` done where it is; the last report ends the
    /// phase (and bumps the epoch: routing changes). Other reports change no epoch.
    fn report(
        &mut self,
        slot: Slot,
        began: u64,
        phase: MovePhase,
        node: NodeId,
        from: NodeSet,
    ) -> Result<u64, ChangeRefused> {
        let moving = self.current_move(slot, began)?;
        if moving.phase != phase || !from.contains(node) {
            return Err(ChangeRefused::Unchanged);
        }
        let moving = self.moves.get_mut(&slot).expect("checked");
        let reported = if phase == MovePhase::Closing { &mut moving.drained } else { &mut moving.sealed };
        reported.insert(node);
        if reported.is_superset_of(from) {
            self.advance(slot, began, phase)?;
            self.epoch += 1;
        }
        Ok(self.epoch)
    }

    /// The move of `slot` that began at epoch `began`, if it is the one in progress.
    fn current_move(&self, slot: Slot, began: u64) -> Result<&SlotMove, ChangeRefused> {
        self.moves.get(&slot).filter(|moving| moving.began == began).ok_or(ChangeRefused::NotMoving(slot))
    }

    fn assign(&mut self, first: Slot, last: Slot, group: u16) -> Result<(), ChangeRefused> {
        if group >= self.groups {
            return Err(ChangeRefused::NoSuchGroup(group));
        }
        if let Some((slot, _)) = self.moves.range(first..=last).next() {
            return Err(ChangeRefused::Moving(*slot));
        }
        let range = &mut self.owner[usize::from(first)..=usize::from(last)];
        if range.iter().all(|owner| *owner == group) {
            return Err(ChangeRefused::Unchanged);
        }
        range.fill(group);
        Ok(())
    }
}

/// A change of the slot map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotChange {
    /// Slots `first..=last` belong to `group` from the next epoch on (for empty slots: the
    /// caller checks; none of them may be moving).
    Assign { first: Slot, last: Slot, group: u16 },
    /// Start moving `slot` to group `to`: its owner's nodes stop serving it.
    BeginMove { slot: Slot, to: u16 },
    /// `node`, of the slot's owner, applied the move that began at epoch `began` and has
    /// nothing on the slot in flight.
    Drained { slot: Slot, node: NodeId, began: u64 },
    /// Every key of the slot is at the new group (or never was at the owner): seal.
    Copied { slot: Slot, began: u64 },
    /// `node`, of the new group, takes no more copies of this move and runs none.
    Sealed { slot: Slot, node: NodeId, began: u64 },
    /// Nothing of the slot is left at the old owner: the new group owns it.
    Cleaned { slot: Slot, began: u64 },
    /// Call off a move that is still closing (a node of the owner never drained).
    CancelMove { slot: Slot, began: u64 },
}

impl SlotChange {
    /// The slots it concerns, as an inclusive range.
    fn range(&self) -> (Slot, Slot) {
        match *self {
            SlotChange::Assign { first, last, .. } => (first, last),
            SlotChange::BeginMove { slot, .. }
            | SlotChange::Drained { slot, .. }
            | SlotChange::Copied { slot, .. }
            | SlotChange::Sealed { slot, .. }
            | SlotChange::Cleaned { slot, .. }
            | SlotChange::CancelMove { slot, .. } => (slot, slot),
        }
    }
}

/// Why a decided change did nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ChangeRefused {
    #[error("there is no group {0}")]
    NoSuchGroup(u16),
    #[error("the slots already belong to that group")]
    Unchanged,
    #[error("slot {0} is being moved")]
    Moving(Slot),
    #[error("slot {0} is not being moved (or not by that move)")]
    NotMoving(Slot),
    #[error("slot {0}'s move is not in the phase that change ends (a closing move alone can be called off)")]
    Phase(Slot),
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
/// [tag, proposal (8), kind, slot (2), argument (2), began (8)]: the move changes.
const MOVE_TAG: u8 = 0x4D;
const MOVE_BYTES: usize = 22;

fn encode(proposal: u64, change: &SlotChange) -> Vec<u8> {
    let (tag, words, began): (u8, [u16; 3], u64) = match *change {
        SlotChange::Assign { first, last, group } => (ASSIGN_TAG, [first, last, group], 0),
        SlotChange::BeginMove { slot, to } => (MOVE_TAG, [1, slot, to], 0),
        SlotChange::Drained { slot, node, began } => (MOVE_TAG, [2, slot, u16::from(node.0)], began),
        SlotChange::Copied { slot, began } => (MOVE_TAG, [3, slot, 0], began),
        SlotChange::CancelMove { slot, began } => (MOVE_TAG, [4, slot, 0], began),
        SlotChange::Sealed { slot, node, began } => (MOVE_TAG, [5, slot, u16::from(node.0)], began),
        SlotChange::Cleaned { slot, began } => (MOVE_TAG, [6, slot, 0], began),
    };
    let mut data = vec![tag];
    data.extend_from_slice(&proposal.to_le_bytes());
    if tag == MOVE_TAG {
        data.push(words[0] as u8);
        data.extend_from_slice(&words[1].to_le_bytes());
        data.extend_from_slice(&words[2].to_le_bytes());
        data.extend_from_slice(&began.to_le_bytes());
        debug_assert_eq!(data.len(), MOVE_BYTES);
    } else {
        for word in words {
            data.extend_from_slice(&word.to_le_bytes());
        }
        debug_assert_eq!(data.len(), ASSIGN_BYTES);
    }
    data
}

fn decode(data: &[u8]) -> Option<(u64, SlotChange)> {
    let tag = *data.first()?;
    let expected = match tag {
        ASSIGN_TAG => ASSIGN_BYTES,
        MOVE_TAG => MOVE_BYTES,
        _ => return None, // Leader no-ops.
    };
    if data.len() != expected {
        return None;
    }
    let proposal = u64::from_le_bytes(data[1..9].try_into().ok()?);
    let half = |at: usize| u16::from_le_bytes([data[at], data[at + 1]]);
    let change = if tag == ASSIGN_TAG {
        SlotChange::Assign { first: half(9), last: half(11), group: half(13) }
    } else {
        let (slot, argument) = (half(10), half(12));
        let began = u64::from_le_bytes(data[14..22].try_into().ok()?);
        match data[9] {
            1 => SlotChange::BeginMove { slot, to: argument },
            2 => SlotChange::Drained { slot, node: NodeId(u8::try_from(argument).ok()?), began },
            3 => SlotChange::Copied { slot, began },
            4 => SlotChange::CancelMove { slot, began },
            5 => SlotChange::Sealed { slot, node: NodeId(u8::try_from(argument).ok()?), began },
            6 => SlotChange::Cleaned { slot, began },
            _ => return None,
        }
    };
    // The proposer checked the range, but a log is input like any other: never index past it.
    let (first, last) = change.range();
    (first <= last && last < SLOT_COUNT).then_some((proposal, change))
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
        let (first, last) = change.range();
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
        // Nodes 0 and 1 are group 0, nodes 2 and 3 group 1 (the tests run 3 or 4 nodes).
        SlotTable::new(vec![0, 0, 1, 1], owner)
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
    fn a_move_goes_through_its_phases_only_when_every_node_concerned_reported() {
        let mut net = Net::new(4);
        net.run_ms(1_000);
        let change = |net: &mut Net, id: u64, change: SlotChange| {
            net.propose(3, id, change).unwrap();
            net.run_ms(50);
            net.decided.iter().find(|(proposal, _)| *proposal == id).expect("decided").1
        };
        let phase = |net: &Net| net.nodes[1].as_ref().unwrap().table().moving(100).map(|moving| moving.phase);
        let drained = |node: u8| SlotChange::Drained { slot: 100, node: NodeId(node), began: 2 };
        assert_eq!(
            change(&mut net, 1, SlotChange::BeginMove { slot: 100, to: 0 }),
            Err(ChangeRefused::Unchanged)
        );
        assert_eq!(change(&mut net, 2, SlotChange::BeginMove { slot: 100, to: 1 }), Ok(2));
        assert_eq!(
            change(&mut net, 3, SlotChange::BeginMove { slot: 100, to: 1 }),
            Err(ChangeRefused::Moving(100))
        );
        assert_eq!(
            change(&mut net, 4, SlotChange::Assign { first: 0, last: 200, group: 1 }),
            Err(ChangeRefused::Moving(100))
        );
        assert_eq!(
            change(&mut net, 5, SlotChange::Copied { slot: 100, began: 2 }),
            Err(ChangeRefused::Phase(100))
        );
        // Node 2 is not of the owner (group 0): its report counts for nothing.
        assert_eq!(change(&mut net, 6, drained(2)), Err(ChangeRefused::Unchanged));
        assert_eq!(change(&mut net, 7, drained(0)), Ok(2));
        assert_eq!(phase(&net), Some(MovePhase::Closing));
        assert_eq!(change(&mut net, 8, drained(1)), Ok(3));
        assert_eq!(phase(&net), Some(MovePhase::Copying));
        // Copying: the new group may have served keys, so there is no way back.
        assert_eq!(
            change(&mut net, 9, SlotChange::CancelMove { slot: 100, began: 2 }),
            Err(ChangeRefused::Phase(100))
        );
        assert_eq!(change(&mut net, 10, SlotChange::Copied { slot: 100, began: 2 }), Ok(4));
        assert_eq!(phase(&net), Some(MovePhase::Sealing));
        let sealed = |node: u8| SlotChange::Sealed { slot: 100, node: NodeId(node), began: 2 };
        assert_eq!(change(&mut net, 11, sealed(0)), Err(ChangeRefused::Unchanged));
        assert_eq!(change(&mut net, 12, sealed(2)), Ok(4));
        assert_eq!(
            change(&mut net, 13, SlotChange::Cleaned { slot: 100, began: 2 }),
            Err(ChangeRefused::Phase(100))
        );
        assert_eq!(change(&mut net, 14, sealed(3)), Ok(5));
        assert_eq!(phase(&net), Some(MovePhase::Cleaning));
        assert_eq!(net.nodes[0].as_ref().unwrap().table().owner(100), 0);
        assert_eq!(change(&mut net, 15, SlotChange::Cleaned { slot: 100, began: 2 }), Ok(6));
        for node in net.nodes.iter().flatten() {
            assert_eq!(node.table().owner(100), 1);
            assert!(node.table().moving(100).is_none());
        }
        // A report made for an earlier move of a slot is refused by a later one.
        assert_eq!(change(&mut net, 16, SlotChange::BeginMove { slot: 100, to: 0 }), Ok(7));
        assert_eq!(change(&mut net, 17, drained(2)), Err(ChangeRefused::NotMoving(100)));
        // A move still closing can be called off.
        assert_eq!(change(&mut net, 18, SlotChange::CancelMove { slot: 100, began: 7 }), Ok(8));
        assert_eq!(net.nodes[0].as_ref().unwrap().table().owner(100), 1);
        assert_eq!(net.epochs(), vec![Some(8); 4]);
    }

    #[test]
    fn garbage_entries_are_ignored() {
        assert_eq!(decode(&[ASSIGN_TAG; 3]), None);
        let mut bad = encode(1, &SlotChange::Assign { first: 5, last: 6, group: 0 });
        bad[11..13].copy_from_slice(&20_000u16.to_le_bytes());
        assert_eq!(decode(&bad), None);
        for change in [
            SlotChange::Assign { first: 5, last: 6, group: 1 },
            SlotChange::BeginMove { slot: 16383, to: 2 },
            SlotChange::Drained { slot: 0, node: NodeId(63), began: 77 },
            SlotChange::Copied { slot: 9, began: 3 },
            SlotChange::Sealed { slot: 9, node: NodeId(5), began: 3 },
            SlotChange::Cleaned { slot: 9, began: 3 },
            SlotChange::CancelMove { slot: 10, began: u64::MAX },
        ] {
            assert_eq!(decode(&encode(9, &change)), Some((9, change)));
        }
        let mut bad_move = encode(1, &SlotChange::Copied { slot: 3, began: 1 });
        bad_move[10..12].copy_from_slice(&16384u16.to_le_bytes());
        assert_eq!(decode(&bad_move), None);
        bad_move[9] = 7;
        assert_eq!(decode(&bad_move), None);
    }
}
