//! The migration swarm (issue 20 point 4; docs/decisions.md, decision 16): several replica
//! groups of one protocol behind one slot map, slots with keys moving between groups while
//! clients run, under the main swarm's faults (loss, duplication, delay, partitions, pauses,
//! crashes and restarts, drifting clocks). Every client history is checked per key, across
//! groups: a key is one register whichever group holds it.
//!
//! Each simulated node is a [`ShardNode`]: its group's protocol core with the group's own
//! membership service (as `chorus node` runs it), a node of the metadata service (the slot
//! map's Raft group, `chorus_membership::Metadata`, every node of every group a voter), and
//! the server's migration logic (`chorus_membership::routing`): the routing rule, the drain
//! reports, and movers that run each key of a copying slot through [`KeyMove`].
//!
//! A client talks to one node, as a cluster-aware Redis client talks to the node its map
//! names; that node follows `-MOVED`, `-ASK` (with `ASKING`) and `-TRYAGAIN` for it, over
//! the simulated network, the way a client library does. An answer that does not come back
//! leaves the operation's outcome unknown.
//!
//! What the swarm does not cover: the server's key listing (GETKEYSINSLOT; movers here know
//! every key the workload can use) and its connection-level drain counting (here one counter
//! per slot in the node, as in the server's `cluster/gate.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use chorus_core::slots::{key_slot, moving_marker, Slot, SLOT_COUNT};
use chorus_core::{
    ClientRequestId, Command, CommandError, Key, NodeId, NodeSet, Outbox, Outcome, Replica, Time, View,
};
use chorus_membership::routing::{accepts_copy, clean_step, route, KeyMove, MoveStep, Route};
use chorus_membership::{
    Membership, MembershipConfig, MembershipMessage, Metadata, MetadataOutbox, MovePhase, SlotChange,
    SlotMove, SlotTable, Wire, WithMembership,
};

use crate::managed::swarm_membership_config;
use crate::rng::Rng;
use crate::simulator::{simulate_with_restarts, RestartContext, Restarted, SeedRun, SimConfig};

/// Redirects a client follows before it gives up on an operation (answered as refused).
const REDIRECTS_MAX: u32 = 24;
/// How long a node waits for another node's answer before the outcome is unknown.
const ANSWER_TIMEOUT: Time = Time::from_millis(300);
/// A mover copies a key again when the new group has not answered by then: short, so copies
/// of one key are often in flight at once and the seal is exercised.
const COPY_TIMEOUT: Time = Time::from_millis(20);
/// A client's pause before it retries after `-TRYAGAIN`.
const TRY_AGAIN_DELAY: Time = Time::from_millis(3);
/// How often an undecided proposal to the metadata service is made again.
const PROPOSE_PERIOD: Time = Time::from_millis(30);
/// A move whose source has not drained by then is called off by the node that began it.
const DRAIN_PATIENCE: Time = Time::from_millis(400);
/// Keys a mover works on at once per slot.
const MOVERS_PER_SLOT: usize = 4;

/// A deliberately broken migration, which the swarm must catch as a linearizability
/// violation (crates/sim/tests/migration_swarm.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShardBug {
    /// Copy as soon as the move is decided, without waiting for every node of the old group
    /// to drain: the "check at dispatch" a node that has not applied the move yet defeats.
    CopyBeforeDrained,
    /// A moved key is deleted at the old group instead of left as a tombstone: the old group
    /// sends clients on with `-ASK` while another copy of the key is still on its way, and
    /// that copy overwrites what they wrote.
    DeleteInsteadOfTombstone,
}

/// How one seed's cluster is shaped and which slots it moves.
#[derive(Clone, Debug)]
pub struct ShardPlan {
    pub groups: usize,
    pub replicas_per_group: usize,
    /// Every key the workload can touch, by slot (the movers' key listing).
    pub keys_by_slot: BTreeMap<Slot, Vec<Key>>,
    /// The slot map at epoch 1.
    pub owner: Vec<u16>,
    /// `(at, node, slot)`: at local time `at`, `node` starts moving `slot` to the next group.
    pub moves: Vec<(Time, NodeId, Slot)>,
}

impl ShardPlan {
    /// Two or three groups; the workload's keys spread over them; a few moves during the
    /// fault phase, some of the same slot one after another (back to a group it left).
    pub fn draw(seed: u64, replicas_per_group: usize, fault_phase: Time) -> ShardPlan {
        let mut rng = Rng::new(seed ^ 0x5348_4152_4453);
        let groups = if rng.chance(0.7) { 2 } else { 3 };
        let mut keys_by_slot: BTreeMap<Slot, Vec<Key>> = BTreeMap::new();
        for prefix in ['k', 'h', 'e'] {
            for index in 0..4 {
                for generation in 0..=48 {
                    let name = match generation {
                        0 => format!("{prefix}{index}"),
                        _ => format!("{prefix}{index}-{generation}"),
                    };
                    keys_by_slot.entry(key_slot(name.as_bytes())).or_default().push(Key::from(name));
                }
            }
        }
        let mut owner = vec![0u16; usize::from(SLOT_COUNT)];
        for slot in keys_by_slot.keys() {
            owner[usize::from(*slot)] = rng.below(groups as u64) as u16;
        }
        // The slots of the first generation of keys: the ones clients hit from the start.
        let busy: Vec<Slot> = ['k', 'h', 'e']
            .iter()
            .flat_map(|prefix| (0..4).map(move |index| key_slot(format!("{prefix}{index}").as_bytes())))
            .collect();
        let nodes = groups * replicas_per_group;
        let mut moves = Vec::new();
        for _ in 0..rng.range(2, 7) {
            let at = Time::from_millis(rng.range(20, fault_phase.as_millis().max(40)));
            let node = NodeId(rng.below(nodes as u64) as u8);
            moves.push((at, node, *rng.pick(&busy)));
        }
        moves.sort();
        ShardPlan { groups, replicas_per_group, keys_by_slot, owner, moves }
    }

    fn group_of(&self, node: NodeId) -> u16 {
        (node.index() / self.replicas_per_group) as u16
    }

    fn nodes_of(&self, group: u16) -> NodeSet {
        let first = usize::from(group) * self.replicas_per_group;
        (first..first + self.replicas_per_group).map(|node| NodeId(node as u8)).collect()
    }

    fn table(&self) -> SlotTable {
        let nodes = self.groups * self.replicas_per_group;
        let group_of = (0..nodes).map(|node| self.group_of(NodeId(node as u8))).collect();
        SlotTable::new(group_of, self.owner.clone())
    }
}

/// What travels between two shard nodes.
#[derive(Clone, Debug)]
pub enum ShardWire<M> {
    /// The group's protocol and membership.
    Group(Wire<M>),
    /// The metadata service's Raft.
    Meta(MembershipMessage),
    /// A client's command forwarded by the node it talks to (`asking`: after `-ASK`), or a
    /// mover's copy for the move that began at epoch `copy`.
    Request {
        id: u64,
        command: Command,
        asking: bool,
        copy: Option<u64>,
    },
    Answer {
        id: u64,
        answer: Answer,
    },
}

/// A node's answer to a command.
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
    Done(Outcome),
    Moved(u16),
    Ask(u16),
    TryAgain,
}

/// Who is waiting for a command this node runs.
#[derive(Clone, Copy, Debug)]
enum Origin {
    /// A client operation this node drives (its id in `operations`).
    Local(u64),
    Remote {
        node: NodeId,
        id: u64,
    },
}

/// What a request to this node's own core is for.
#[derive(Clone, Debug)]
enum CoreRequest {
    Client {
        origin: Origin,
        slot: Slot,
    },
    Presence {
        origin: Origin,
        to: u16,
    },
    /// A mover's step at the source, for the move (slot, began, phase).
    Move {
        slot: MoveId,
        key: Key,
    },
    /// A mover's copy arriving here, at the new group.
    Copy {
        origin: Origin,
        slot: Slot,
    },
}

/// One phase of one move: (slot, the epoch it began at, the phase).
type MoveId = (Slot, u64, MovePhase);

/// A client operation this node drives on the client's behalf.
#[derive(Clone, Debug)]
struct Operation {
    request: ClientRequestId,
    command: Command,
    redirects: u32,
    /// Waiting for another node's answer since then.
    waiting_since: Option<Time>,
    /// Retry (after `-TRYAGAIN`) at this time.
    retry_at: Option<Time>,
}

/// One key a mover is working on, and whether a step is in flight.
#[derive(Clone, Debug)]
struct Moving {
    state: KeyMove,
    busy: bool,
    /// Retry a refused step at this time.
    retry_at: Time,
}

#[derive(Default, Debug, Clone, Copy)]
struct Counts {
    moves_begun: u64,
    moves_finished: u64,
    moves_cancelled: u64,
    keys_moved: u64,
    marks_raced: u64,
    asks: u64,
    try_agains: u64,
    moved: u64,
    drained_reports: u64,
    answers_lost: u64,
}

pub struct ShardNode<P: Replica> {
    me: NodeId,
    bug: Option<ShardBug>,
    group: u16,
    plan: Arc<ShardPlan>,
    core: WithMembership<P>,
    meta: Metadata,
    core_out: Outbox<Wire<P::Message>>,
    /// Client commands running in the core, per slot: a slot drains when its count is 0.
    running: BTreeMap<Slot, u32>,
    /// Movers' copies running in the core, per slot: a slot seals when its count is 0.
    copying: BTreeMap<Slot, u32>,
    core_requests: BTreeMap<u64, CoreRequest>,
    operations: BTreeMap<u64, Operation>,
    /// Requests from other nodes already run (the network duplicates; a client's TCP does not).
    seen: BTreeSet<(NodeId, u64)>,
    /// Mover steps sent to the new group, by request id.
    target_writes: BTreeMap<u64, (MoveId, Key, Time)>,
    /// Per move phase, its keys' movers.
    movers: BTreeMap<MoveId, BTreeMap<Key, Moving>>,
    /// Proposals not decided yet: change and when to propose again.
    proposals: BTreeMap<u64, (SlotChange, Time)>,
    /// Moves this node began, and when: called off if the source does not drain in time.
    began: BTreeMap<Slot, Time>,
    next_move: usize,
    next_id: u64,
    counts: Counts,
}

impl<P: Replica> ShardNode<P> {
    fn new(
        me: NodeId,
        plan: Arc<ShardPlan>,
        core: WithMembership<P>,
        meta: Metadata,
        incarnation: u64,
        now: Time,
    ) -> ShardNode<P> {
        let group = plan.group_of(me);
        let next_move = plan.moves.iter().take_while(|(at, _, _)| *at < now).count();
        ShardNode {
            me,
            bug: None,
            group,
            plan,
            core,
            meta,
            core_out: Outbox::default(),
            running: BTreeMap::new(),
            copying: BTreeMap::new(),
            core_requests: BTreeMap::new(),
            operations: BTreeMap::new(),
            seen: BTreeSet::new(),
            target_writes: BTreeMap::new(),
            movers: BTreeMap::new(),
            proposals: BTreeMap::new(),
            began: BTreeMap::new(),
            next_move,
            // Ids never repeat across restarts: a late answer to an earlier incarnation finds nothing.
            next_id: incarnation << 32,

            counts: Counts::default(),
        }
    }

    fn table(&self) -> &SlotTable {
        self.meta.table()
    }

    fn fresh_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    // ------------------------------------------------------------ the client's side

    /// Run `command` here for `origin`, as the server's connection does: route, then run or
    /// answer with a redirect.
    fn execute(
        &mut self,
        now: Time,
        origin: Origin,
        command: Command,
        asking: bool,
        out: &mut Outbox<ShardWire<P::Message>>,
    ) {
        let slot = key_slot(command.key());
        match self.route_here(slot, asking) {
            Route::Serve => {
                *self.running.entry(slot).or_default() += 1;
                self.submit(now, CoreRequest::Client { origin, slot }, command, out);
            }
            Route::Moved(group) => {
                self.counts.moved += 1;
                self.answer(now, origin, Answer::Moved(group), out);
            }
            Route::TryAgain => {
                self.counts.try_agains += 1;
                self.answer(now, origin, Answer::TryAgain, out);
            }
            Route::CheckPresence { to } => {
                let read = Command::Read { key: command.key().clone() };
                self.submit(now, CoreRequest::Presence { origin, to }, read, out);
            }
        }
    }

    /// [`route`], or what the broken variant makes of it.
    fn route_here(&self, slot: Slot, asking: bool) -> Route {
        let decided = route(self.table(), self.group, slot, asking);
        let (Some(ShardBug::CopyBeforeDrained), Some(moving)) = (self.bug, self.table().moving(slot)) else {
            return decided;
        };
        match decided {
            Route::TryAgain => Route::CheckPresence { to: moving.to },
            Route::Moved(_) if moving.to == self.group && asking => Route::Serve,
            other => other,
        }
    }

    fn submit(
        &mut self,
        now: Time,
        purpose: CoreRequest,
        command: Command,
        out: &mut Outbox<ShardWire<P::Message>>,
    ) {
        let id = self.fresh_id();
        self.core_requests.insert(id, purpose);
        self.core.on_client(now, ClientRequestId(id), command, &mut self.core_out);
        self.flush_core(now, out);
    }

    fn answer(&mut self, now: Time, origin: Origin, answer: Answer, out: &mut Outbox<ShardWire<P::Message>>) {
        match origin {
            Origin::Local(id) => self.on_answer(now, id, answer, out),
            Origin::Remote { node, id } => out.send(node, ShardWire::Answer { id, answer }),
        }
    }

    /// What the node (this one or another) said about one of the operations this node drives.
    /// Operations are kept under the id of their current attempt, so a late or duplicated
    /// answer to an earlier attempt finds nothing.
    fn on_answer(&mut self, now: Time, id: u64, answer: Answer, out: &mut Outbox<ShardWire<P::Message>>) {
        let Some(mut operation) = self.operations.remove(&id) else { return };
        operation.waiting_since = None;
        let target = match answer {
            Answer::Done(outcome) => {
                out.reply(operation.request, outcome);
                return;
            }
            Answer::TryAgain => None,
            Answer::Moved(group) => Some((group, false)),
            Answer::Ask(group) => {
                self.counts.asks += 1;
                Some((group, true))
            }
        };
        operation.redirects += 1;
        if operation.redirects > REDIRECTS_MAX {
            // Every answer so far said the command did not run.
            out.reply(operation.request, Outcome::Error(CommandError::Unavailable("slot kept moving")));
            return;
        }
        let next = self.fresh_id();
        match target {
            None => {
                operation.retry_at = Some(now + TRY_AGAIN_DELAY);
                self.operations.insert(next, operation);
            }
            Some((group, asking)) => self.forward(now, next, operation, group, asking, out),
        }
    }

    /// Send `operation` (attempt `id`) to a node of `group`, as a client follows a redirect.
    fn forward(
        &mut self,
        now: Time,
        id: u64,
        mut operation: Operation,
        group: u16,
        asking: bool,
        out: &mut Outbox<ShardWire<P::Message>>,
    ) {
        let nodes: Vec<NodeId> = self.plan.nodes_of(group).iter().collect();
        let node = nodes[(id as usize) % nodes.len()];
        let command = operation.command.clone();
        if node == self.me {
            self.operations.insert(id, operation);
            self.execute(now, Origin::Local(id), command, asking, out);
        } else {
            operation.waiting_since = Some(now);
            self.operations.insert(id, operation);
            out.send(node, ShardWire::Request { id, command, asking, copy: None });
        }
    }

    /// Retries after `-TRYAGAIN` that are due, and answers that never came.
    fn tick_operations(&mut self, now: Time, out: &mut Outbox<ShardWire<P::Message>>) {
        let due: Vec<u64> = self
            .operations
            .iter()
            .filter(|(_, operation)| operation.retry_at.is_some_and(|at| now >= at))
            .map(|(id, _)| *id)
            .collect();
        for id in due {
            let mut operation = self.operations.remove(&id).expect("operation");
            operation.retry_at = None;
            let command = operation.command.clone();
            let next = self.fresh_id();
            self.operations.insert(next, operation);
            self.execute(now, Origin::Local(next), command, false, out);
        }
        let lost: Vec<u64> = self
            .operations
            .iter()
            .filter(|(_, operation)| {
                operation.waiting_since.is_some_and(|since| now >= since + ANSWER_TIMEOUT)
            })
            .map(|(id, _)| *id)
            .collect();
        for id in lost {
            self.counts.answers_lost += 1;
            let operation = self.operations.remove(&id).expect("operation");
            out.reply(operation.request, Outcome::Error(CommandError::OutcomeUnknown));
        }
    }

    // ------------------------------------------------------------ the core

    /// Hand the core's messages on and act on its replies.
    fn flush_core(&mut self, now: Time, out: &mut Outbox<ShardWire<P::Message>>) {
        let mut core_out = std::mem::take(&mut self.core_out);
        for (destination, message) in core_out.messages.drain(..) {
            out.messages.push((destination, ShardWire::Group(message)));
        }
        let replies: Vec<_> = core_out.replies.drain(..).collect();
        self.core_out = core_out;
        for (request, outcome) in replies {
            let Some(purpose) = self.core_requests.remove(&request.0) else { continue };
            self.on_core_reply(now, purpose, outcome, out);
        }
    }

    fn on_core_reply(
        &mut self,
        now: Time,
        purpose: CoreRequest,
        outcome: Outcome,
        out: &mut Outbox<ShardWire<P::Message>>,
    ) {
        match purpose {
            CoreRequest::Client { origin, slot } => {
                let running = self.running.entry(slot).or_default();
                *running = running.saturating_sub(1);
                self.answer(now, origin, Answer::Done(outcome), out);
            }
            CoreRequest::Presence { origin, to } => {
                let answer = match outcome {
                    Outcome::Value(None) => Answer::Ask(to),
                    _ => {
                        self.counts.try_agains += 1;
                        Answer::TryAgain
                    }
                };
                self.answer(now, origin, answer, out);
            }
            CoreRequest::Move { slot, key } => self.on_move_outcome(now, slot, key, &outcome),
            CoreRequest::Copy { origin, slot } => {
                let copying = self.copying.entry(slot).or_default();
                *copying = copying.saturating_sub(1);
                self.answer(now, origin, Answer::Done(outcome), out);
            }
        }
    }

    // ------------------------------------------------------------ the metadata service

    fn propose(&mut self, now: Time, change: SlotChange, out: &mut Outbox<ShardWire<P::Message>>) {
        let id = (u64::from(self.me.0) << 56) ^ self.fresh_id();
        self.proposals.insert(id, (change, now));
        self.propose_again(now, out);
    }

    fn propose_again(&mut self, now: Time, out: &mut Outbox<ShardWire<P::Message>>) {
        let mut meta_out = MetadataOutbox::default();
        for (id, (change, next)) in &mut self.proposals {
            if now >= *next {
                *next = now + PROPOSE_PERIOD;
                let _ = self.meta.propose(*id, *change, &mut meta_out);
            }
        }
        self.flush_meta(meta_out, out);
    }

    fn flush_meta(&mut self, mut meta_out: MetadataOutbox, out: &mut Outbox<ShardWire<P::Message>>) {
        for (to, message) in meta_out.messages.drain(..) {
            out.send(to, ShardWire::Meta(message));
        }
        for (id, _) in meta_out.decided {
            self.proposals.remove(&id);
        }
    }

    /// Start moves, report drained and sealed slots, run the movers, call off moves that
    /// never drained.
    fn tick_moves(&mut self, now: Time, out: &mut Outbox<ShardWire<P::Message>>) {
        while let Some(&(at, node, slot)) = self.plan.moves.get(self.next_move) {
            if at > now {
                break;
            }
            self.next_move += 1;
            if node == self.me && self.table().moving(slot).is_none() {
                let to = (self.table().owner(slot) + 1) % self.plan.groups as u16;
                self.counts.moves_begun += 1;
                self.began.insert(slot, now);
                self.propose(now, SlotChange::BeginMove { slot, to }, out);
            }
        }
        let moves: Vec<(Slot, SlotMove)> =
            self.table().moves().map(|(slot, moving)| (slot, *moving)).collect();
        for (slot, moving) in &moves {
            let (slot, began) = (*slot, moving.began);
            let ours = self.table().owner(slot) == self.group;
            let theirs = moving.to == self.group;
            match moving.phase {
                MovePhase::Closing
                    if ours
                        && !moving.drained.contains(self.me)
                        && self.running.get(&slot).copied().unwrap_or(0) == 0 =>
                {
                    self.counts.drained_reports += 1;
                    self.propose_once(now, SlotChange::Drained { slot, node: self.me, began }, out);
                }
                MovePhase::Closing if ours && self.bug == Some(ShardBug::CopyBeforeDrained) => {
                    self.run_movers(now, (slot, began, MovePhase::Copying), moving.to, out);
                }
                MovePhase::Copying | MovePhase::Cleaning if ours => {
                    self.run_movers(now, (slot, began, moving.phase), moving.to, out);
                }
                MovePhase::Sealing
                    if theirs
                        && !moving.sealed.contains(self.me)
                        && self.copying.get(&slot).copied().unwrap_or(0) == 0 =>
                {
                    self.propose_once(now, SlotChange::Sealed { slot, node: self.me, began }, out);
                }
                _ => {}
            }
            if moving.phase == MovePhase::Closing
                && self.began.get(&slot).is_some_and(|at| now >= *at + DRAIN_PATIENCE)
            {
                self.began.remove(&slot);
                self.counts.moves_cancelled += 1;
                self.propose(now, SlotChange::CancelMove { slot, began }, out);
            }
        }
        // Phases that ended: forget their movers.
        let early = self.bug == Some(ShardBug::CopyBeforeDrained);
        self.movers.retain(|(slot, began, phase), _| {
            moves.iter().any(|(moving, state)| {
                moving == slot
                    && state.began == *began
                    && (state.phase == *phase || (early && state.phase == MovePhase::Closing))
            })
        });
        self.began
            .retain(|slot, at| now < *at + DRAIN_PATIENCE || moves.iter().any(|(moving, _)| moving == slot));
    }

    /// Propose `change` unless the same change is already waiting to be decided.
    fn propose_once(&mut self, now: Time, change: SlotChange, out: &mut Outbox<ShardWire<P::Message>>) {
        if !self.proposals.values().any(|(proposed, _)| *proposed == change) {
            self.propose(now, change, out);
        }
    }

    /// Work on the keys of one move phase (copying or cleaning), a few at a time; once every
    /// key is done, say so.
    fn run_movers(&mut self, now: Time, id: MoveId, to: u16, out: &mut Outbox<ShardWire<P::Message>>) {
        if !self.movers.contains_key(&id) {
            let keys = self.plan.keys_by_slot.get(&id.0).cloned().unwrap_or_default();
            let movers = keys
                .into_iter()
                .map(|key| (key, Moving { state: KeyMove::start(), busy: false, retry_at: now }))
                .collect();
            self.movers.insert(id, movers);
        }
        let (slot, began, phase) = id;
        let movers = &self.movers[&id];
        if movers.values().all(|moving| moving.state == KeyMove::Done) {
            let done = match phase {
                MovePhase::Cleaning => SlotChange::Cleaned { slot, began },
                _ => SlotChange::Copied { slot, began },
            };
            if !self.proposals.values().any(|(change, _)| *change == done) {
                self.counts.moves_finished += u64::from(phase == MovePhase::Cleaning);
                self.propose(now, done, out);
            }
            return;
        }
        let busy = movers.values().filter(|moving| moving.busy).count();
        let ready: Vec<Key> = movers
            .iter()
            .filter(|(_, moving)| !moving.busy && moving.state != KeyMove::Done && now >= moving.retry_at)
            .map(|(key, _)| key.clone())
            .take(MOVERS_PER_SLOT.saturating_sub(busy))
            .collect();
        for key in ready {
            let mover = self.movers.get_mut(&id).expect("movers").get_mut(&key).expect("mover");
            let mut step = mover.state.step(&key);
            if phase == MovePhase::Cleaning {
                // Cleaning: read, and delete whatever is there (`Mark` holds what was read).
                if let KeyMove::Mark { value } = &mover.state {
                    step = MoveStep::Source(clean_step(&key, Some(value)).expect("a value"));
                }
            } else if let (Some(ShardBug::DeleteInsteadOfTombstone), KeyMove::Bury { value }) =
                (self.bug, &mover.state)
            {
                step = MoveStep::Source(clean_step(&key, Some(&moving_marker(value))).expect("a value"));
            }
            mover.busy = true;
            match step {
                MoveStep::Source(command) => {
                    self.submit(now, CoreRequest::Move { slot: id, key }, command, out);
                }
                MoveStep::Target { key, value } => {
                    let request = self.fresh_id();
                    let nodes: Vec<NodeId> = self.plan.nodes_of(to).iter().collect();
                    let node = nodes[request as usize % nodes.len()];
                    self.target_writes.insert(request, (id, key.clone(), now));
                    let command = Command::Write { key, value: Some(value) };
                    out.send(
                        node,
                        ShardWire::Request { id: request, command, asking: false, copy: Some(began) },
                    );
                }
                MoveStep::Done => {}
            }
        }
    }

    fn on_move_outcome(&mut self, now: Time, id: MoveId, key: Key, outcome: &Outcome) {
        let Some(moving) = self.movers.get_mut(&id).and_then(|movers| movers.get_mut(&key)) else { return };
        moving.busy = false;
        let before = moving.state.clone();
        moving.state = match (&before, outcome, id.2) {
            // Cleaning: a delete that ran (or lost a race) means read again.
            (KeyMove::Mark { .. }, Outcome::Cas { .. }, MovePhase::Cleaning) => KeyMove::Read,
            (KeyMove::Read, Outcome::Value(Some(stored)), MovePhase::Cleaning) => {
                KeyMove::Mark { value: stored.clone() }
            }
            _ => moving.state.clone().next(outcome),
        };
        if moving.state == before {
            moving.retry_at = now + TRY_AGAIN_DELAY; // Refused: try the step again later.
        }
        if matches!(before, KeyMove::Mark { .. })
            && moving.state == KeyMove::Read
            && id.2 != MovePhase::Cleaning
        {
            self.counts.marks_raced += 1;
        }
        if matches!(before, KeyMove::Bury { .. }) {
            self.counts.keys_moved += 1;
        }
    }

    fn tick_target_writes(&mut self, now: Time) {
        let lost: Vec<u64> = self
            .target_writes
            .iter()
            .filter(|(_, (_, _, sent))| now >= *sent + COPY_TIMEOUT)
            .map(|(id, _)| *id)
            .collect();
        for id in lost {
            let (slot, key, _) = self.target_writes.remove(&id).expect("target write");
            if let Some(moving) = self.movers.get_mut(&slot).and_then(|movers| movers.get_mut(&key)) {
                moving.busy = false; // Copy it again: the same bytes, while the marker stands.
            }
        }
    }

    /// A mover's copy arriving here: run it while this group takes copies of that move.
    fn copy_in(
        &mut self,
        now: Time,
        origin: Origin,
        command: Command,
        began: u64,
        out: &mut Outbox<ShardWire<P::Message>>,
    ) {
        let slot = key_slot(command.key());
        let open = match self.bug {
            Some(ShardBug::CopyBeforeDrained) => self
                .table()
                .moving(slot)
                .is_some_and(|moving| moving.to == self.group && moving.began == began),
            _ => accepts_copy(self.table(), self.group, slot, began),
        };
        if !open {
            self.answer(now, origin, Answer::TryAgain, out);
            return;
        }
        *self.copying.entry(slot).or_default() += 1;
        self.submit(now, CoreRequest::Copy { origin, slot }, command, out);
    }
}

impl<P: Replica> Replica for ShardNode<P> {
    type Message = ShardWire<P::Message>;

    fn id(&self) -> NodeId {
        self.me
    }

    fn on_client(
        &mut self,
        now: Time,
        request: ClientRequestId,
        command: Command,
        out: &mut Outbox<Self::Message>,
    ) {
        let id = self.fresh_id();
        let operation = Operation {
            request,
            command: command.clone(),
            redirects: 0,
            waiting_since: None,
            retry_at: None,
        };
        self.operations.insert(id, operation);
        self.execute(now, Origin::Local(id), command, false, out);
    }

    fn on_message(
        &mut self,
        now: Time,
        from: NodeId,
        message: Self::Message,
        out: &mut Outbox<Self::Message>,
    ) {
        match message {
            ShardWire::Group(message) => {
                self.core.on_message(now, from, message, &mut self.core_out);
                self.flush_core(now, out);
            }
            ShardWire::Meta(message) => {
                let mut meta_out = MetadataOutbox::default();
                self.meta.on_message(from, message, &mut meta_out);
                self.flush_meta(meta_out, out);
            }
            ShardWire::Request { id, command, asking, copy } => {
                if self.seen.insert((from, id)) {
                    let origin = Origin::Remote { node: from, id };
                    match copy {
                        Some(began) => self.copy_in(now, origin, command, began, out),
                        None => self.execute(now, origin, command, asking, out),
                    }
                }
            }
            ShardWire::Answer { id, answer } => {
                if let Some((slot, key, _)) = self.target_writes.remove(&id) {
                    let written = match answer {
                        Answer::Done(outcome) => outcome,
                        _ => Outcome::Error(CommandError::Unavailable("not importing yet")),
                    };
                    self.on_move_outcome(now, slot, key, &written);
                } else {
                    self.on_answer(now, id, answer, out);
                }
            }
        }
    }

    fn on_tick(&mut self, now: Time, out: &mut Outbox<Self::Message>) {
        self.core.on_tick(now, &mut self.core_out);
        self.flush_core(now, out);
        let mut meta_out = MetadataOutbox::default();
        self.meta.on_tick(now, &mut meta_out);
        self.flush_meta(meta_out, out);
        self.propose_again(now, out);
        self.tick_moves(now, out);
        self.tick_operations(now, out);
        self.tick_target_writes(now);
    }

    /// Views come from each group's own membership service.
    fn on_view(&mut self, _now: Time, _view: View, _out: &mut Outbox<Self::Message>) {}

    fn is_caught_up(&self) -> bool {
        self.core.is_caught_up()
    }

    fn is_control(message: &Self::Message) -> bool {
        match message {
            ShardWire::Group(message) => WithMembership::<P>::is_control(message),
            ShardWire::Meta(_) => true,
            ShardWire::Request { .. } | ShardWire::Answer { .. } => false,
        }
    }

    fn installed_view(&self) -> Option<View> {
        self.core.installed_view()
    }

    fn event_counts(&self, report: &mut dyn FnMut(&'static str, u64)) {
        self.core.event_counts(report);
        let counts = self.counts;
        report("shards.moves_begun", counts.moves_begun);
        report("shards.moves_finished", counts.moves_finished);
        report("shards.moves_cancelled", counts.moves_cancelled);
        report("shards.keys_moved", counts.keys_moved);
        report("shards.marks_raced", counts.marks_raced);
        report("shards.asks", counts.asks);
        report("shards.try_agains", counts.try_agains);
        report("shards.moved", counts.moved);
        report("shards.drained_reports", counts.drained_reports);
        report("shards.answers_lost", counts.answers_lost);
    }
}

/// Builds one group's protocol core: `(me, the group's nodes, seed, recovering)`.
pub type BuildGroupCore<'a, P> = dyn Fn(NodeId, NodeSet, u64, bool) -> P + 'a;

/// Run one seed of the migration swarm with groups of `build`'s protocol (3 replicas each),
/// under the managed swarm's faults (`crate::managed::managed_sim_config`).
pub fn simulate_shards<P>(config: &SimConfig, build: &BuildGroupCore<'_, P>) -> SeedRun
where
    P: Replica,
    P::Message: std::fmt::Debug,
{
    simulate_shards_with(config, None, build)
}

/// [`simulate_shards`] with a broken migration.
pub fn simulate_shards_with<P>(
    config: &SimConfig,
    bug: Option<ShardBug>,
    build: &BuildGroupCore<'_, P>,
) -> SeedRun
where
    P: Replica,
    P::Message: std::fmt::Debug,
{
    let replicas_per_group = 3;
    let plan = Arc::new(ShardPlan::draw(config.seed, replicas_per_group, config.fault_phase_max));
    let nodes = plan.groups * replicas_per_group;
    let mut config = crate::managed::managed_sim_config(config);
    config.replicas = nodes;
    config.crash_group_size = Some(replicas_per_group);
    let members: Vec<NodeId> = (0..nodes).map(|node| NodeId(node as u8)).collect();
    let membership = |me: NodeId, group: NodeSet| -> MembershipConfig { swarm_membership_config(me, group) };
    let mut first = |me: NodeId, _all: NodeSet, seed: u64| {
        let group = plan.nodes_of(plan.group_of(me));
        let core = WithMembership::new(
            build(me, group, seed, false),
            Membership::new(membership(me, group), Time::ZERO),
        );
        let meta = Metadata::restore(me, &members, plan.table(), &[], Time::ZERO);
        let mut node = ShardNode::new(me, plan.clone(), core, meta, seed & 0xFFFF, Time::ZERO);
        node.bug = bug;
        node
    };
    let mut restart = |context: RestartContext, crashed: &ShardNode<P>| {
        let me = context.node;
        let group = plan.nodes_of(plan.group_of(me));
        let mut membership_config = membership(me, group);
        membership_config.join = Some(context.seed | 1);
        let records = crashed.core.membership().durable_records();
        let core = WithMembership::new(
            build(me, group, context.seed, true),
            Membership::restore(membership_config, context.now, &records),
        );
        let mut meta =
            Metadata::restore(me, &members, plan.table(), &crashed.meta.durable_records(), context.now);
        // Re-apply the restored log before serving anything, as the server does at start.
        meta.on_tick(context.now, &mut MetadataOutbox::default());
        let mut node = ShardNode::new(me, plan.clone(), core, meta, context.seed & 0xFFFF, context.now);
        // A client's connection never delivers a request twice; the simulated network may.
        node.seen = crashed.seen.clone();
        node.bug = bug;
        Restarted::up(node)
    };
    simulate_with_restarts(&config, &mut first, &mut restart)
}

/// The migration swarm of a protocol, for [`crate::runner::sweep`] and `chorus sim
/// --shards`: `hermes`, `craq` or `zab` groups with each protocol's default options, so a
/// failing seed is about the move, not an option the protocol's own swarm covers.
pub fn setup(protocol: &str) -> Option<crate::runner::ProtocolSetup> {
    setup_with(protocol, None)
}

/// [`setup`] with a deliberately broken migration (`crate::broken`).
pub fn setup_with(protocol: &str, bug: Option<ShardBug>) -> Option<crate::runner::ProtocolSetup> {
    use chorus_craq::{Craq, CraqConfig};
    use chorus_hermes::{Hermes, HermesConfig};
    use chorus_zab::{Zab, ZabConfig};
    let name: &'static str = match (protocol, bug) {
        ("hermes", None) => "hermes-shards",
        ("craq", None) => "craq-shards",
        ("zab", None) => "zab-shards",
        ("hermes", Some(_)) => "hermes-shards-broken",
        _ => return None,
    };
    let simulate: crate::runner::CustomSimulate = match protocol {
        "hermes" => std::sync::Arc::new(move |config: &SimConfig| {
            let build = |me, group, seed, recovering| {
                let mut hermes = HermesConfig::new(me, group);
                hermes.recovering = recovering;
                hermes.seed = seed;
                Hermes::new(hermes)
            };
            (simulate_shards_with(config, bug, &build), "hermes groups".to_string())
        }),
        "craq" => std::sync::Arc::new(|config: &SimConfig| {
            let build = |me, group, _seed, recovering| {
                let mut craq = CraqConfig::new(me, group);
                craq.recovering = recovering;
                Craq::new(craq)
            };
            (simulate_shards(config, &build), "craq groups".to_string())
        }),
        "zab" => std::sync::Arc::new(|config: &SimConfig| {
            let build = |me, group, _seed, recovering| {
                let mut zab = ZabConfig::new(me, group);
                zab.recovering = recovering;
                Zab::new(zab)
            };
            (simulate_shards(config, &build), "zab groups".to_string())
        }),
        _ => return None,
    };
    Some(crate::runner::ProtocolSetup::Custom { name, simulate })
}
