//! The deterministic simulator: virtual time, one event queue, one seeded RNG.
//!
//! Replicas are protocol cores (anything implementing [`Replica`]); the simulator plays the
//! network (delay, loss, duplication, reordering, partitions), the clients, and the
//! membership service (after a crash, it waits out the lease and installs a view with a
//! higher epoch at every surviving replica, at slightly different times). Given the same
//! seed, a run makes exactly the same choices in the same order.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::fmt::Debug;

use chorus_core::{
    ClientRequestId, CommandError, Epoch, NodeId, NodeSet, Outbox, Outcome, Replica, Time, View,
};
use rustc_hash::FxHashMap;

use crate::faults::{FaultCounts, FaultPlan};
use crate::history::{Completion, History, Operation};
use crate::rng::Rng;
use crate::workload::{CommandGenerator, WorkloadPlan};

/// How one seed runs.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub seed: u64,
    pub replicas: usize,
    /// Faults happen and clients issue operations during a phase of at most this long (each
    /// seed draws its own length).
    pub fault_phase_max: Time,
    /// After the fault phase the network heals; every pending operation must complete within
    /// this window, or the run reports a liveness failure.
    pub liveness_window: Time,
    pub tick_period: Time,
    /// Inject faults (the swarm plan) or run on a perfect network.
    pub faults: bool,
    /// Record a line per event, for `chorus sim --trace`.
    pub trace: bool,
    /// Play the membership service (after a crash, wait out the lease and install the next
    /// view everywhere). Off when the replicas run their own membership (`chorus-membership`).
    pub scripted_membership: bool,
    /// Restart every crashed node about this long after its crash (Hermes §3.4 Recovery),
    /// through the `restart` builder of [`simulate_with_restarts`]. `None`: crashed nodes
    /// stay down.
    pub restart_after: Option<Time>,
}

impl SimConfig {
    pub fn new(seed: u64, replicas: usize) -> SimConfig {
        assert!((1..=NodeId::COUNT_MAX).contains(&replicas));
        SimConfig {
            seed,
            replicas,
            fault_phase_max: Time::from_millis(400),
            liveness_window: Time::from_millis(20_000),
            tick_period: Time::from_millis(1),
            faults: true,
            trace: false,
            scripted_membership: true,
            restart_after: None,
        }
    }
}

/// Everything one seed produced.
#[derive(Debug)]
pub struct SeedRun {
    pub history: History,
    pub fault_plan: FaultPlan,
    pub workload: WorkloadPlan,
    pub faults: FaultCounts,
    /// Operations still pending at a live replica when the liveness window closed.
    pub liveness_failures: Vec<String>,
    pub trace: Vec<String>,
    pub events: u64,
    pub end: Time,
}

enum Event<M> {
    Deliver {
        from: NodeId,
        to: NodeId,
        message: M,
    },
    Tick(NodeId),
    ClientNext(u32),
    Crash(NodeId),
    Restart(NodeId),
    /// From now on, crash the node partway through its next outbox with messages.
    ArmCrash(NodeId),
    InstallView(NodeId, View),
    PartitionStart(usize),
    PartitionHeal(usize),
    FaultPhaseEnd,
}

struct Scheduled<M> {
    at: Time,
    seq: u64,
    event: Event<M>,
}

impl<M> PartialEq for Scheduled<M> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl<M> Eq for Scheduled<M> {}
impl<M> PartialOrd for Scheduled<M> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<M> Ord for Scheduled<M> {
    /// Reversed: the heap pops the earliest event; ties go to the one scheduled first.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

struct PendingOp {
    op_index: usize,
    client: u32,
    node: NodeId,
}

struct Client {
    generator: CommandGenerator,
    ops_issued: usize,
}

/// Builds a restarted node from the crashed one (whose durable state it may keep).
pub type RestartFn<'a, P> = dyn FnMut(NodeId, NodeSet, u64, Time, &P) -> P + 'a;

struct Engine<'a, P: Replica> {
    restart: Option<&'a mut RestartFn<'a, P>>,
    config: SimConfig,
    now: Time,
    rng: Rng,
    queue: BinaryHeap<Scheduled<P::Message>>,
    seq: u64,
    nodes: Vec<P>,
    crashed: Vec<bool>,
    /// Nodes that die partway through their next outbox with messages.
    crash_armed: Vec<bool>,
    /// `blocked[from][to]`: how many active partitions cut that directed link.
    blocked: Vec<Vec<u32>>,
    partition_active: Vec<bool>,
    plan: FaultPlan,
    workload: WorkloadPlan,
    clients: Vec<Client>,
    history: History,
    pending: FxHashMap<ClientRequestId, PendingOp>,
    counts: FaultCounts,
    /// The membership service's current view.
    view: View,
    quiescent: bool,
    outbox: Outbox<P::Message>,
    trace: Vec<String>,
}

/// Run one seed. `build(node, replicas, seed)` makes replica `node` of the cluster.
pub fn simulate<P>(config: &SimConfig, build: &mut dyn FnMut(NodeId, NodeSet, u64) -> P) -> SeedRun
where
    P: Replica,
    P::Message: Debug,
{
    run_seed(config, build, None)
}

/// Like [`simulate`], and every crashed node comes back `config.restart_after` later, as
/// `restart(node, replicas, seed, now, crashed_node)` builds it.
pub fn simulate_with_restarts<'a, P>(
    config: &SimConfig,
    build: &mut dyn FnMut(NodeId, NodeSet, u64) -> P,
    restart: &'a mut RestartFn<'a, P>,
) -> SeedRun
where
    P: Replica,
    P::Message: Debug,
{
    assert!(config.restart_after.is_some(), "restarts need restart_after");
    run_seed(config, build, Some(restart))
}

fn run_seed<'a, P>(
    config: &SimConfig,
    build: &mut dyn FnMut(NodeId, NodeSet, u64) -> P,
    restart: Option<&'a mut RestartFn<'a, P>>,
) -> SeedRun
where
    P: Replica,
    P::Message: Debug,
{
    let mut rng = Rng::new(config.seed);
    let plan = if config.faults {
        FaultPlan::draw(&mut rng, config.replicas, config.fault_phase_max)
    } else {
        FaultPlan::none(config.fault_phase_max)
    };
    let workload = WorkloadPlan::draw(&mut rng);
    let all: NodeSet = (0..config.replicas as u8).map(NodeId).collect();
    let nodes = (0..config.replicas as u8).map(|n| build(NodeId(n), all, rng.next_u64())).collect();
    let clients = (0..workload.clients as u32)
        .map(|client| Client { generator: CommandGenerator::new(client), ops_issued: 0 })
        .collect();
    let mut engine = Engine {
        restart,
        config: config.clone(),
        now: Time::ZERO,
        rng,
        queue: BinaryHeap::new(),
        seq: 0,
        nodes,
        crashed: vec![false; config.replicas],
        crash_armed: vec![false; config.replicas],
        blocked: vec![vec![0; config.replicas]; config.replicas],
        partition_active: vec![false; plan.partitions.len()],
        plan,
        workload,
        clients,
        history: History::default(),
        pending: FxHashMap::default(),
        counts: FaultCounts::default(),
        view: View { epoch: Epoch(1), live: all },
        quiescent: false,
        outbox: Outbox::default(),
        trace: Vec::new(),
    };
    engine.schedule_initial_events();
    let events = engine.run();
    engine.finish(events)
}

impl<P> Engine<'_, P>
where
    P: Replica,
    P::Message: Debug,
{
    fn schedule(&mut self, at: Time, event: Event<P::Message>) {
        self.seq += 1;
        self.queue.push(Scheduled { at, seq: self.seq, event });
    }

    fn schedule_initial_events(&mut self) {
        let tick_us = self.config.tick_period.as_micros();
        for node in 0..self.config.replicas as u8 {
            let offset = Time::from_micros(self.rng.below(tick_us));
            self.schedule(offset, Event::Tick(NodeId(node)));
        }
        for client in 0..self.workload.clients as u32 {
            let start = Time::from_micros(self.rng.below(self.workload.think_max_us + 1));
            self.schedule(start, Event::ClientNext(client));
        }
        for index in 0..self.plan.partitions.len() {
            let partition = &self.plan.partitions[index];
            let (start, end) = (partition.start, partition.start + partition.duration);
            self.schedule(start, Event::PartitionStart(index));
            self.schedule(end, Event::PartitionHeal(index));
        }
        for index in 0..self.plan.crashes.len() {
            let crash = &self.plan.crashes[index];
            let (at, node) = (crash.at, NodeId(crash.node));
            if crash.mid_broadcast {
                self.schedule(at, Event::ArmCrash(node));
                // A node with nothing to send still dies, a little later.
                self.schedule(at + Time::from_millis(20), Event::Crash(node));
            } else {
                self.schedule(at, Event::Crash(node));
            }
        }
        self.schedule(self.plan.phase, Event::FaultPhaseEnd);
    }

    /// Process events until everything settled or the liveness window closed.
    fn run(&mut self) -> u64 {
        let deadline = self.plan.phase + self.config.liveness_window;
        let mut events = 0;
        while let Some(scheduled) = self.queue.pop() {
            if scheduled.at > deadline {
                break;
            }
            debug_assert!(scheduled.at >= self.now, "time never runs backwards");
            self.now = scheduled.at;
            events += 1;
            self.handle(scheduled.event);
            if self.quiescent && self.pending.is_empty() {
                break;
            }
        }
        events
    }

    fn handle(&mut self, event: Event<P::Message>) {
        match event {
            Event::Deliver { from, to, message } => self.deliver(from, to, message),
            Event::Tick(node) => self.tick(node),
            Event::ClientNext(client) => self.client_next(client),
            Event::Crash(node) => self.crash(node),
            Event::Restart(node) => self.restart(node),
            Event::ArmCrash(node) => {
                if !self.quiescent {
                    self.crash_armed[node.index()] = true;
                }
            }
            Event::InstallView(node, view) => self.install_view(node, view),
            Event::PartitionStart(index) => self.partition_start(index),
            Event::PartitionHeal(index) => self.partition_heal(index),
            Event::FaultPhaseEnd => self.end_fault_phase(),
        }
    }

    fn trace(&mut self, line: impl FnOnce() -> String) {
        if self.config.trace {
            let line = format!("{:>14} {}", format!("{:?}", self.now), line());
            self.trace.push(line);
        }
    }

    // ------------------------------------------------------------------ network

    fn deliver(&mut self, from: NodeId, to: NodeId, message: P::Message) {
        if self.crashed[to.index()] {
            return;
        }
        if self.blocked[from.index()][to.index()] > 0 {
            self.counts.messages_blocked_by_partition += 1;
            self.trace(|| format!("{from} -x {to} blocked {message:?}"));
            return;
        }
        self.trace(|| format!("{from} -> {to} {message:?}"));
        let now = self.now;
        self.nodes[to.index()].on_message(now, from, message, &mut self.outbox);
        self.perform_outbox(to);
    }

    fn send(&mut self, from: NodeId, to: NodeId, message: P::Message) {
        if !self.quiescent {
            if self.blocked[from.index()][to.index()] > 0 {
                self.counts.messages_blocked_by_partition += 1;
                return;
            }
            if self.rng.chance(self.plan.loss_rate) {
                self.counts.messages_lost += 1;
                self.trace(|| format!("{from} -x {to} lost {message:?}"));
                return;
            }
            if self.rng.chance(self.plan.duplicate_rate) {
                self.counts.messages_duplicated += 1;
                let delay = self.plan.delay(&mut self.rng);
                self.schedule(self.now + delay, Event::Deliver { from, to, message: message.clone() });
            }
        }
        let delay = self.plan.delay(&mut self.rng);
        if delay.as_micros() > self.plan.delay_min_us + self.plan.delay_spread_us {
            self.counts.messages_reordered += 1;
        }
        self.schedule(self.now + delay, Event::Deliver { from, to, message });
    }

    /// Do what a replica asked for: send its messages, hand replies to clients.
    fn perform_outbox(&mut self, node: NodeId) {
        let mut outbox = std::mem::take(&mut self.outbox);
        let dies_now = self.crash_armed[node.index()] && !outbox.messages.is_empty();
        for (destination, message) in outbox.messages.drain(..) {
            for to in destination.nodes().iter() {
                debug_assert_ne!(to, node, "a replica never sends to itself");
                if dies_now && self.rng.chance(0.5) {
                    continue; // Never left: the node died mid-broadcast.
                }
                self.send(node, to, message.clone());
            }
        }
        if dies_now {
            outbox.replies.clear(); // A dead node answers no one.
            self.outbox = outbox;
            self.counts.crashes_mid_broadcast += 1;
            self.crash(node);
            return;
        }
        for (request, outcome) in outbox.replies.drain(..) {
            self.complete(request, outcome);
        }
        self.outbox = outbox;
    }

    fn partition_start(&mut self, index: usize) {
        if self.quiescent {
            return;
        }
        self.partition_active[index] = true;
        self.counts.partitions += 1;
        for &(from, to) in &self.plan.partitions[index].blocked {
            self.blocked[from as usize][to as usize] += 1;
        }
        let blocked = self.plan.partitions[index].blocked.clone();
        self.trace(|| format!("partition starts, blocked links {blocked:?}"));
    }

    fn partition_heal(&mut self, index: usize) {
        if !std::mem::replace(&mut self.partition_active[index], false) {
            return;
        }
        for &(from, to) in &self.plan.partitions[index].blocked {
            self.blocked[from as usize][to as usize] -= 1;
        }
        self.trace(|| format!("partition {index} heals"));
    }

    fn end_fault_phase(&mut self) {
        // A crash armed for mid-broadcast that found nothing to send happens now, while
        // crashes are still allowed.
        for node in 0..self.config.replicas as u8 {
            if self.crash_armed[node as usize] {
                self.crash(NodeId(node));
            }
        }
        self.quiescent = true;
        for index in 0..self.partition_active.len() {
            self.partition_heal(index);
        }
        self.trace(|| "fault phase ends: network heals, clients stop issuing".to_string());
    }

    // ------------------------------------------------------------------ replicas

    fn tick(&mut self, node: NodeId) {
        if self.crashed[node.index()] {
            return;
        }
        let now = self.now;
        self.nodes[node.index()].on_tick(now, &mut self.outbox);
        self.perform_outbox(node);
        self.schedule(now + self.config.tick_period, Event::Tick(node));
    }

    fn crash(&mut self, node: NodeId) {
        if self.crashed[node.index()] || self.quiescent {
            return;
        }
        self.crashed[node.index()] = true;
        self.crash_armed[node.index()] = false;
        self.counts.crashes += 1;
        self.trace(|| format!("{node} crashes"));
        // Its clients see the connection drop: the outcome of what they sent is unknown.
        let mut lost: Vec<ClientRequestId> =
            self.pending.iter().filter(|(_, op)| op.node == node).map(|(request, _)| *request).collect();
        lost.sort();
        for request in lost {
            let op = self.pending.remove(&request).expect("pending op");
            self.schedule_client_next(op.client);
        }
        if let Some(after) = self.config.restart_after {
            let jitter = Time::from_micros(self.rng.below(after.as_micros() / 2 + 1));
            self.schedule(self.now + after + jitter, Event::Restart(node));
        }
        if !self.config.scripted_membership {
            return; // The replicas' own membership service notices.
        }
        // The membership service waits out the lease, then installs the next view everywhere.
        self.view = View { epoch: Epoch(self.view.epoch.0 + 1), live: self.view.live.without(node) };
        self.counts.views_installed += 1;
        let view = self.view;
        for survivor in view.live.iter() {
            let delay = self.plan.lease_us + self.rng.below(self.plan.view_spread_us + 1);
            self.schedule(self.now + Time::from_micros(delay), Event::InstallView(survivor, view));
        }
    }

    /// A crashed node comes back with what it kept on disk (the restart builder decides).
    /// Messages already in flight to it are delivered to the new incarnation.
    fn restart(&mut self, node: NodeId) {
        let Some(restart) = self.restart.as_mut() else { return };
        if !self.crashed[node.index()] {
            return;
        }
        let all: NodeSet = (0..self.config.replicas as u8).map(NodeId).collect();
        let seed = self.rng.next_u64();
        let fresh = restart(node, all, seed, self.now, &self.nodes[node.index()]);
        self.nodes[node.index()] = fresh;
        self.crashed[node.index()] = false;
        self.crash_armed[node.index()] = false;
        self.counts.restarts += 1;
        self.trace(|| format!("{node} restarts"));
        self.schedule(self.now + self.config.tick_period, Event::Tick(node));
    }

    fn install_view(&mut self, node: NodeId, view: View) {
        if self.crashed[node.index()] {
            return;
        }
        self.trace(|| format!("{node} installs view {:?} live {:?}", view.epoch, view.live));
        let now = self.now;
        self.nodes[node.index()].on_view(now, view, &mut self.outbox);
        self.perform_outbox(node);
    }

    // ------------------------------------------------------------------ clients

    fn schedule_client_next(&mut self, client: u32) {
        let think = Time::from_micros(self.rng.below(self.workload.think_max_us + 1));
        self.schedule(self.now + think, Event::ClientNext(client));
    }

    fn client_next(&mut self, client: u32) {
        let state = &self.clients[client as usize];
        if self.quiescent || state.ops_issued >= self.workload.ops_per_client {
            return;
        }
        let up: Vec<u8> = (0..self.config.replicas as u8).filter(|n| !self.crashed[*n as usize]).collect();
        let node = NodeId(*self.rng.pick(&up));
        let state = &mut self.clients[client as usize];
        let command = state.generator.next(&mut self.rng, &self.workload);
        state.ops_issued += 1;
        let op_index = self.history.operations.len();
        let request = ClientRequestId(op_index as u64);
        self.trace(|| format!("client {client} -> {node} #{op_index} {command:?}"));
        self.history.operations.push(Operation {
            id: op_index,
            client,
            command: command.clone(),
            invoke: self.now,
            completion: None,
        });
        self.pending.insert(request, PendingOp { op_index, client, node });
        let now = self.now;
        self.nodes[node.index()].on_client(now, request, command, &mut self.outbox);
        self.perform_outbox(node);
    }

    fn complete(&mut self, request: ClientRequestId, outcome: Outcome) {
        let Some(op) = self.pending.remove(&request) else {
            return; // The client already gave up on it (its replica crashed).
        };
        self.trace(|| format!("#{} completes {outcome:?}", op.op_index));
        let known = !matches!(outcome, Outcome::Error(CommandError::OutcomeUnknown));
        if let Outcome::Value(value) | Outcome::Cas { previous: value, .. } = &outcome {
            self.clients[op.client as usize].generator.observe(value.clone());
        }
        if known {
            self.history.operations[op.op_index].completion = Some(Completion { at: self.now, outcome });
        }
        self.schedule_client_next(op.client);
    }

    fn finish(mut self, events: u64) -> SeedRun {
        let mut stuck: Vec<&PendingOp> = self.pending.values().collect();
        stuck.sort_by_key(|op| op.op_index);
        let liveness_failures = stuck
            .iter()
            .map(|op| {
                let operation = &self.history.operations[op.op_index];
                format!(
                    "#{} client {} at {}: {:?} invoked at {:?} never completed",
                    op.op_index, op.client, op.node, operation.command, operation.invoke
                )
            })
            .collect();
        SeedRun {
            history: std::mem::take(&mut self.history),
            fault_plan: self.plan,
            workload: self.workload,
            faults: self.counts,
            liveness_failures,
            trace: self.trace,
            events,
            end: self.now,
        }
    }
}
