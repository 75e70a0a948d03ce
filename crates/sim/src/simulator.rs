//! The deterministic simulator: virtual time, one event queue, one seeded RNG.
//!
//! Replicas are protocol cores (anything implementing [`Replica`]); the simulator plays the
//! network (delay, loss, duplication, reordering, partitions), the clients, each node's clock
//! (its own rate within the configured drift bound, and pauses of the whole process), crashes
//! and restarts, and, unless the replicas run their own membership service, the membership
//! service too (after a crash, it waits out the lease and installs a view with a higher epoch
//! at every surviving replica, at slightly different times). Given the same seed, a run makes
//! exactly the same choices in the same order.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap};
use std::fmt::Debug;

use chorus_core::data::{Access, ExecOp};
use chorus_core::{
    ClientRequestId, Command, CommandError, Epoch, NodeId, NodeSet, Outbox, Outcome, Replica, RmwOp, Time,
    View,
};
use rustc_hash::FxHashMap;

use crate::faults::{FaultCounts, FaultPlan, PlanLimits};
use crate::history::{Completion, History, Operation};
use crate::managed::AppendOnly;
use crate::rng::Rng;
use crate::workload::{CommandGenerator, KeySpace, WorkloadPlan};

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
    /// The clock-rate error the replicas are configured to tolerate (their leases' drift
    /// margin), in parts per million: half the seeds run each node's clock at its own rate
    /// within it. 0: every clock runs true.
    pub clock_drift_max_ppm: u32,
    /// Seeds may pause a node's process (it handles nothing while its clock runs on).
    pub pauses: bool,
    /// Seeds may cut the power to every node at once (for replicas that keep everything they
    /// acknowledged on disk: every node restarts from what its disk kept).
    pub power_loss: bool,
    /// A broken server (`expiry-by-local-clock`): a typed read that finds the key's deadline
    /// passed by its replica's own clock answers "absent" at once instead of running the
    /// replicated delete (docs/expiry.md). The checker must catch it under drifting clocks.
    pub expiry_by_local_clock: bool,
    /// Hermes, CRAQ and ZAB keep their keys in the server's append-only file on each node's
    /// simulated disk and restart from it ([`crate::managed::simulate_managed_appendonly`]).
    pub appendonly: AppendOnly,
    /// How many nodes a turn's protocol messages must reach for an armed crash to strike in it
    /// (mid-broadcast, or between its writes and their sync): 2 for protocols that broadcast
    /// (an INV, a proposal), 1 for a chain, whose traffic is one message down the chain.
    pub crash_turn_destinations_min: usize,
    /// The nodes form replica groups of this many consecutive ids (the migration swarm,
    /// `crate::shards`): a crash must also leave a majority of the node's own group with
    /// its data.
    pub crash_group_size: Option<usize>,
    /// Syncs take between these two times, as on the server's sync thread: the node goes on
    /// while one runs, the messages of its calls that wait for a sync are held until it
    /// returns (the replies leave at once, where [`Replica::replies_before_sync`] says they
    /// may), and a crash in the meantime loses what it had not synced yet. `None`: a call's
    /// sync returns before its node handles anything else (the server's event loop syncing).
    pub sync_latency: Option<(Time, Time)>,
    /// Turns as the server's event loop runs them: a node's calls that arrive while its turn
    /// is open share one outbox, and the turn ends (`Replica::end_turn`, then its outbox is
    /// performed: written, synced, sent, answered) at most this long after its first call
    /// (a paused node's turn ends when it wakes). `None`: every call is a turn of its own.
    pub turn_max: Option<Time>,
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
            clock_drift_max_ppm: 0,
            pauses: false,
            power_loss: false,
            expiry_by_local_clock: false,
            appendonly: AppendOnly::Off,
            crash_turn_destinations_min: 2,
            crash_group_size: None,
            sync_latency: None,
            turn_max: None,
        }
    }

    fn plan_limits(&self) -> PlanLimits {
        PlanLimits {
            replicas: self.replicas,
            phase_max: self.fault_phase_max,
            restarts: self.restart_after.is_some(),
            clock_drift_max_ppm: self.clock_drift_max_ppm,
            pauses: self.pauses,
            power_loss: self.power_loss && self.restart_after.is_some(),
        }
    }
}

/// The turns a swarm seed runs (`SimConfig::turn_max`), drawn from the seed itself so the
/// seed's other draws stay what they were: three seeds in four run turns of up to 20 us,
/// 200 us or 1 ms, as the server's event loop does; the fourth runs every call as a turn of
/// its own.
pub fn swarm_turn_max(seed: u64) -> Option<Time> {
    [None, Some(20), Some(200), Some(1_000)][(seed / 11 % 4) as usize].map(Time::from_micros)
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

/// What a restart did to the node's storage, for the run's counters.
#[derive(Clone, Copy, Debug, Default)]
pub struct StorageFaults {
    pub writes_lost: u64,
    pub writes_torn: u64,
    pub sectors_corrupted: u64,
    /// A checksum caught corruption at start-up.
    pub corruption_detected: u64,
}

impl StorageFaults {
    /// Crash `disk` (its unsynced writes lost, kept or torn, drawn from `seed`) and, if
    /// `corrupt`, flip a byte of its synced data: what a restarting node finds.
    pub fn crash(disk: &chorus_storage::SimDisk, seed: u64, corrupt: bool) -> StorageFaults {
        let crash = disk.crash(seed);
        StorageFaults {
            writes_lost: crash.files_lost,
            writes_torn: crash.files_torn,
            sectors_corrupted: (corrupt && disk.corrupt(seed).is_some()) as u64,
            corruption_detected: 0,
        }
    }
}

/// What the restart builder made of a crashed node.
pub struct Restarted<P> {
    /// `Err`: the node refused to start, saying why (its storage failed a check), and stays
    /// down.
    pub replica: Result<P, String>,
    pub storage: StorageFaults,
}

impl<P> Restarted<P> {
    pub fn up(replica: P) -> Restarted<P> {
        Restarted { replica: Ok(replica), storage: StorageFaults::default() }
    }
}

/// What a restart builder is told.
#[derive(Clone, Copy, Debug)]
pub struct RestartContext {
    pub node: NodeId,
    pub replicas: NodeSet,
    /// Fresh randomness for this restart (an incarnation number, storage faults).
    pub seed: u64,
    /// The node's own clock.
    pub now: Time,
    /// Its previous start was refused (its storage failed a check): it comes back on a new,
    /// empty disk and joins, as an operator replaces a machine whose disk went bad. A builder
    /// whose protocol cannot join refuses again (the node then stays down).
    pub replace: bool,
}

/// Builds a restarted node from the crashed one (whose durable state it may keep).
pub type RestartFn<'a, P> = dyn FnMut(RestartContext, &P) -> Restarted<P> + 'a;

enum Event<M> {
    Deliver {
        from: NodeId,
        to: NodeId,
        message: M,
    },
    Tick(NodeId),
    ClientNext(u32),
    /// A client request reaching its replica (later than its invocation if the node was
    /// paused).
    ClientArrives {
        request: ClientRequestId,
        node: NodeId,
        command: Command,
    },
    Crash(NodeId),
    Restart(NodeId),
    /// From now on, crash the node partway through its next outbox with protocol messages.
    ArmCrash(NodeId),
    InstallView(NodeId, View),
    PartitionStart(usize),
    PartitionHeal(usize),
    Pause(usize),
    PowerLoss,
    FaultPhaseEnd,
    /// The next update answered by a node whose own sync runs cuts the power right after
    /// (`SimConfig::sync_latency`).
    ArmPowerLoss,
    /// A sync of the node's sync thread returns (`SimConfig::sync_latency`), unless the node
    /// crashed since it started (its `generation` then is stale).
    SyncDone {
        node: NodeId,
        generation: u64,
    },
    /// The node's turn ends (`SimConfig::turn_max`), unless it ended already (its `number`
    /// then is stale).
    EndTurn {
        node: NodeId,
        number: u64,
    },
}

impl<M> Event<M> {
    /// The node whose process handles this event, if one does: a paused node's events wait.
    fn handled_by(&self) -> Option<NodeId> {
        match self {
            Event::Deliver { to, .. } => Some(*to),
            Event::Tick(node) | Event::InstallView(node, _) => Some(*node),
            Event::ClientArrives { node, .. } => Some(*node),
            Event::SyncDone { node, .. } | Event::EndTurn { node, .. } => Some(*node),
            _ => None,
        }
    }
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
    /// A typed read (GET, PTTL of an expiring key) not yet found expired: the replica reads
    /// the value locally and judges it, as the server does (`run_data`).
    read_locally: bool,
}

struct Client {
    generator: CommandGenerator,
    ops_issued: usize,
    /// The replica this client sent its last request to.
    last_node: Option<NodeId>,
}

/// A node's clock: it runs at `1 + ppm / 10^6` times the simulator's rate, from zero.
#[derive(Clone, Copy)]
struct Clock {
    ppm: i32,
}

impl Clock {
    fn local(self, global: Time) -> Time {
        let nanos = global.as_nanos() as i128;
        Time::from_nanos((nanos + nanos * self.ppm as i128 / 1_000_000) as u64)
    }
}

struct Engine<'a, P: Replica> {
    restart: Option<&'a mut RestartFn<'a, P>>,
    config: SimConfig,
    now: Time,
    rng: Rng,
    queue: BinaryHeap<Scheduled<P::Message>>,
    seq: u64,
    nodes: Vec<P>,
    crashed: Vec<bool>,
    /// Crashed, or restarted and not yet caught up.
    without_data: Vec<bool>,
    /// Nodes that die partway through their next outbox with protocol messages.
    crash_armed: Vec<bool>,
    /// Nodes whose last start was refused: their next restart is a replacement.
    refused: Vec<bool>,
    clocks: Vec<Clock>,
    /// A paused node handles nothing before this (global) time.
    paused_until: Vec<Time>,
    /// `blocked[from][to]`: how many active partitions cut that directed link.
    blocked: Vec<Vec<u32>>,
    partition_active: Vec<bool>,
    plan: FaultPlan,
    workload: WorkloadPlan,
    keys: KeySpace,
    clients: Vec<Client>,
    history: History,
    pending: FxHashMap<ClientRequestId, PendingOp>,
    counts: FaultCounts,
    /// The membership service's current view (scripted membership).
    view: View,
    /// The newest view any replica installed, for counting view changes.
    newest_view: View,
    quiescent: bool,
    /// Per node, what its current turn's calls asked for.
    outboxes: Vec<Outbox<P::Message>>,
    /// Per node, its current turn (`SimConfig::turn_max`).
    turns: Vec<Turn>,
    trace: Vec<String>,
    /// Per node, with `SimConfig::sync_latency`: whether a sync runs, its generation (bumped
    /// by a crash), and what waits for it.
    syncs: Vec<SyncThread<P::Message>>,
    /// The next sync to return cuts the power instead (`SimConfig::sync_latency`).
    power_loss_armed: bool,
}

/// A node's event-loop turn (`SimConfig::turn_max`): its number, and how many calls it has
/// taken so far whose outputs wait for its end (0: no turn is open).
#[derive(Clone, Copy, Default)]
struct Turn {
    number: u64,
    calls: u32,
}

/// A node's sync thread in the simulator (`SimConfig::sync_latency`). A sync makes stable
/// what was written before it started, no more: records written while it runs wait for the
/// next one.
struct SyncThread<M> {
    running: bool,
    generation: u64,
    /// The number of the last sync started.
    started: u64,
    /// Records were written since the running sync started: another must follow it.
    wanted: bool,
    /// Messages and replies of calls that wait for a sync, in call order.
    held: Vec<HeldCall<M>>,
}

/// A call's messages and replies waiting for the sync numbered `waits_for`.
type HeldCall<M> = (u64, Vec<(chorus_core::Destination, M)>, Vec<(ClientRequestId, Outcome)>);

impl<M> Default for SyncThread<M> {
    fn default() -> Self {
        SyncThread { running: false, generation: 0, started: 0, wanted: false, held: Vec::new() }
    }
}

/// Run one seed. `build(node, replicas, seed)` makes replica `node` of the cluster.
pub fn simulate<P>(config: &SimConfig, build: &mut dyn FnMut(NodeId, NodeSet, u64) -> P) -> SeedRun
where
    P: Replica,
    P::Message: Debug,
{
    run_seed(config, build, None)
}

/// Like [`simulate`], and every crashed node comes back `config.restart_after` later (if
/// set), as `restart(context, crashed_node)` builds it.
pub fn simulate_with_restarts<'a, P>(
    config: &SimConfig,
    build: &mut dyn FnMut(NodeId, NodeSet, u64) -> P,
    restart: &'a mut RestartFn<'a, P>,
) -> SeedRun
where
    P: Replica,
    P::Message: Debug,
{
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
        FaultPlan::draw(&mut rng, config.plan_limits())
    } else {
        FaultPlan::none(config.fault_phase_max, config.replicas)
    };
    let workload = WorkloadPlan::draw(&mut rng);
    let all: NodeSet = (0..config.replicas as u8).map(NodeId).collect();
    let nodes = (0..config.replicas as u8).map(|n| build(NodeId(n), all, rng.next_u64())).collect();
    let clients = (0..workload.clients as u32)
        .map(|client| Client { generator: CommandGenerator::new(client), ops_issued: 0, last_node: None })
        .collect();
    let counts = FaultCounts {
        clocks_drifting: plan.clock_ppm.iter().filter(|ppm| **ppm != 0).count() as u64,
        ..FaultCounts::default()
    };
    let first_view = View { epoch: Epoch(1), live: all };
    let mut engine = Engine {
        restart,
        config: config.clone(),
        now: Time::ZERO,
        rng,
        queue: BinaryHeap::new(),
        seq: 0,
        nodes,
        crashed: vec![false; config.replicas],
        without_data: vec![false; config.replicas],
        crash_armed: vec![false; config.replicas],
        refused: vec![false; config.replicas],
        clocks: plan.clock_ppm.iter().map(|&ppm| Clock { ppm }).collect(),
        paused_until: vec![Time::ZERO; config.replicas],
        blocked: vec![vec![0; config.replicas]; config.replicas],
        partition_active: vec![false; plan.partitions.len()],
        plan,
        workload,
        keys: KeySpace::default(),
        clients,
        history: History::default(),
        pending: FxHashMap::default(),
        counts,
        view: first_view,
        newest_view: first_view,
        quiescent: false,
        outboxes: (0..config.replicas).map(|_| Outbox::default()).collect(),
        turns: vec![Turn::default(); config.replicas],
        trace: Vec::new(),
        syncs: (0..config.replicas).map(|_| SyncThread::default()).collect(),
        power_loss_armed: false,
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

    /// `node`'s own clock now.
    fn local_now(&self, node: NodeId) -> Time {
        self.clocks[node.index()].local(self.now)
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
        for index in 0..self.plan.pauses.len() {
            self.schedule(self.plan.pauses[index].at, Event::Pause(index));
        }
        if self.config.sync_latency.is_some() && self.config.power_loss && self.config.restart_after.is_some()
        {
            // One power loss more, aimed at answers given while their node's sync runs.
            let at = Time::from_micros(self.rng.below(self.plan.phase.as_micros() + 1));
            self.schedule(at, Event::ArmPowerLoss);
        }
        if let Some(at) = self.plan.power_loss {
            self.schedule(at, Event::PowerLoss);
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
            if let Some(node) = scheduled.event.handled_by() {
                let wake = self.paused_until[node.index()];
                if self.now < wake && !self.crashed[node.index()] {
                    // A stopped process: its events wait, in order, for it to wake.
                    self.schedule(wake, scheduled.event);
                    continue;
                }
            }
            events += 1;
            let node = scheduled.event.handled_by();
            self.handle(scheduled.event);
            if let Some(node) = node {
                self.note_view(node);
            }
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
            Event::ClientArrives { request, node, command } => self.client_arrives(request, node, command),
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
            Event::Pause(index) => self.pause(index),
            Event::PowerLoss => self.power_loss_now_or_armed(),
            Event::ArmPowerLoss => self.power_loss_armed = !self.quiescent,
            Event::FaultPhaseEnd => self.end_fault_phase(),
            Event::SyncDone { node, generation } => self.sync_done(node, generation),
            Event::EndTurn { node, number } => {
                let turn = self.turns[node.index()];
                if turn.number == number && turn.calls > 0 && !self.crashed[node.index()] {
                    self.end_turn(node);
                }
            }
        }
    }

    fn trace(&mut self, line: impl FnOnce() -> String) {
        if self.config.trace {
            let line = format!("{:>14} {}", format!("{:?}", self.now), line());
            self.trace.push(line);
        }
    }

    /// Count a view newer than any installed so far: its removals (of running nodes too, the
    /// ones a partition or a pause got removed) and re-additions.
    fn note_view(&mut self, node: NodeId) {
        if self.without_data[node.index()]
            && !self.crashed[node.index()]
            && self.nodes[node.index()].is_caught_up()
        {
            self.without_data[node.index()] = false;
        }
        let Some(view) = self.nodes[node.index()].installed_view() else { return };
        if view.epoch <= self.newest_view.epoch || self.crashed[node.index()] {
            return;
        }
        let before = self.newest_view.live;
        self.newest_view = view;
        self.counts.views_installed += 1;
        for removed in before.iter().filter(|old| !view.live.contains(*old)) {
            self.counts.nodes_removed += 1;
            if !self.crashed[removed.index()] {
                self.counts.live_nodes_removed += 1;
            }
        }
        self.counts.nodes_readded += view.live.iter().filter(|new| !before.contains(*new)).count() as u64;
        self.trace(|| format!("{node} is first to install {:?} live {:?}", view.epoch, view.live));
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
        let now = self.local_now(to);
        self.nodes[to.index()].on_message(now, from, message, &mut self.outboxes[to.index()]);
        self.end_call(to);
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

    /// A call of `node` returned. With turns (`SimConfig::turn_max`) its outputs wait in the
    /// node's outbox for the end of its turn, which the turn's first call schedules; without,
    /// the call is a turn of its own and ends now.
    fn end_call(&mut self, node: NodeId) {
        let Some(turn_max) = self.config.turn_max else { return self.end_turn(node) };
        let turn = &mut self.turns[node.index()];
        turn.calls += 1;
        if turn.calls > 1 {
            return;
        }
        let number = turn.number;
        let after = Time::from_micros(self.rng.below(turn_max.as_micros() + 1));
        self.schedule(self.now + after, Event::EndTurn { node, number });
    }

    /// Every call of the node's turn is in: the core does its once-a-turn work
    /// (`Replica::end_turn`, as the server's event loop calls it before each outbox it
    /// performs), then the turn's outbox is performed.
    fn end_turn(&mut self, node: NodeId) {
        let turn = &mut self.turns[node.index()];
        self.counts.turns_of_several_calls += (turn.calls > 1) as u64;
        *turn = Turn { number: turn.number + 1, calls: 0 };
        let now = self.local_now(node);
        self.nodes[node.index()].end_turn(now, &mut self.outboxes[node.index()]);
        self.perform_outbox(node);
    }

    /// Do what a replica asked for: send its messages, hand replies to clients.
    fn perform_outbox(&mut self, node: NodeId) {
        if self.config.sync_latency.is_some() {
            return self.perform_outbox_syncing_elsewhere(node);
        }
        let mut outbox = std::mem::take(&mut self.outboxes[node.index()]);
        // What the call must make durable is written first (written, not yet synced).
        let wrote = self.nodes[node.index()].write_durable();
        // What the core lets go before the call's sync (a Raft leader's appends) leaves
        // next, as the server sends it; the rest of the messages and the replies leave only
        // once the writes are synced.
        let replica = &self.nodes[node.index()];
        let mut early: Vec<_> =
            outbox.messages.extract_if(.., |(_, message)| replica.leaves_before_sync(message)).collect();
        // An armed crash strikes in the middle of a broadcast of the protocol's own traffic
        // (an INV, a proposal: messages to two nodes or more; for a chain, a message down the
        // chain), not of a heartbeat or a lone acknowledgement that happens to leave first;
        // or between messages that left before a sync and that sync.
        let broadcast = protocol_destinations::<P>(early.iter().chain(&outbox.messages))
            >= self.config.crash_turn_destinations_min;
        let sent_early = !early.is_empty();
        let dies_now =
            self.crash_armed[node.index()] && (broadcast || sent_early && wrote) && self.may_crash(node);
        if sent_early {
            self.counts.turns_sending_before_sync += 1;
            self.send_all(node, &mut early, dies_now);
        }
        if wrote && self.nodes[node.index()].replies_before_sync() {
            // The replies too, when none depends on what the call wrote.
            self.counts.replies_before_sync += outbox.replies.len() as u64;
            for (request, outcome) in outbox.replies.drain(..) {
                self.complete(request, outcome);
            }
        }
        if dies_now && wrote && self.rng.chance(0.5) {
            // Before the sync returned: its writes may be torn, and nothing else of the turn left.
            outbox.clear();
            self.outboxes[node.index()] = outbox;
            self.counts.crashes_before_sync += 1;
            self.counts.crashes_before_sync_after_sends += sent_early as u64;
            self.crash(node);
            return;
        }
        let synced = wrote && self.nodes[node.index()].sync_due();
        self.nodes[node.index()].sync_durable();
        self.send_all(node, &mut outbox.messages, dies_now);
        if dies_now {
            outbox.replies.clear(); // A dead node answers no one.
            self.outboxes[node.index()] = outbox;
            self.counts.crashes_mid_broadcast += 1;
            self.crash(node);
            return;
        }
        for (request, outcome) in outbox.replies.drain(..) {
            self.complete(request, outcome);
        }
        self.outboxes[node.index()] = outbox;
        if synced {
            // What the sync made stable the core may now count on: a call of its own, as in
            // the server, performed as any other when it has anything to send or answer (a
            // core that writes on every call would otherwise recurse here for ever).
            let now = self.local_now(node);
            self.nodes[node.index()].on_synced(now, &mut self.outboxes[node.index()]);
            if !self.outboxes[node.index()].is_empty() {
                self.end_turn(node);
            }
        }
    }

    /// [`Self::perform_outbox`] for a node whose syncs run on a thread of their own
    /// (`SimConfig::sync_latency`), as the server's do: the call's writes are written, the
    /// messages the core lets go before a sync leave, the replies too where the core allows
    /// it, and the rest waits for a sync, the one this call starts or the one running (a
    /// later call's messages may rest on an earlier call's records).
    fn perform_outbox_syncing_elsewhere(&mut self, node: NodeId) {
        let mut outbox = std::mem::take(&mut self.outboxes[node.index()]);
        let at = node.index();
        let wrote = self.nodes[at].write_durable();
        let due = wrote && self.nodes[at].sync_due();
        let replica = &self.nodes[at];
        let mut early: Vec<_> =
            outbox.messages.extract_if(.., |(_, message)| replica.leaves_before_sync(message)).collect();
        let broadcast = protocol_destinations::<P>(early.iter().chain(&outbox.messages))
            >= self.config.crash_turn_destinations_min;
        let dies_now = self.crash_armed[at] && broadcast && self.may_crash(node);
        if !early.is_empty() {
            self.counts.turns_sending_before_sync += 1;
            self.send_all(node, &mut early, dies_now);
        }
        if dies_now {
            // Mid-broadcast: what the call wrote is not synced, nothing else of it left.
            outbox.clear();
            self.outboxes[node.index()] = outbox;
            self.counts.crashes_mid_broadcast += 1;
            self.crash(node);
            return;
        }
        if self.nodes[at].replies_before_sync() {
            let history = &self.history.operations;
            let replied = outbox
                .replies
                .iter()
                .any(|(request, _)| history.get(request.0 as usize).is_some_and(|op| op.command.is_update()));
            self.counts.replies_before_sync += outbox.replies.len() as u64;
            for (request, outcome) in outbox.replies.drain(..) {
                self.complete(request, outcome);
            }
            let strikes = replied && (due || self.syncs[at].running) && !self.quiescent;
            if strikes && std::mem::take(&mut self.power_loss_armed) {
                // Updates answered, this node's own writes not stable yet: what a core that
                // counted them would have answered on records the power loss now takes.
                // Nothing else of the call leaves.
                outbox.clear();
                self.outboxes[node.index()] = outbox;
                self.counts.power_losses_after_replies_before_a_sync += 1;
                self.power_loss();
                return;
            }
        }
        // The sync this call's messages wait for: the one it starts, the one after the one
        // running (which started before its writes), or the last one asked for.
        let sync = &mut self.syncs[at];
        sync.wanted |= due && sync.running;
        let waits_for = sync.started + (due || sync.wanted) as u64;
        let waits = due || sync.running || sync.wanted;
        if waits && !(outbox.messages.is_empty() && outbox.replies.is_empty()) {
            self.counts.calls_waiting_for_a_sync += 1;
            let held = (waits_for, std::mem::take(&mut outbox.messages), std::mem::take(&mut outbox.replies));
            self.syncs[at].held.push(held);
        }
        self.send_all(node, &mut outbox.messages, false);
        for (request, outcome) in outbox.replies.drain(..) {
            self.complete(request, outcome);
        }
        self.outboxes[node.index()] = outbox;
        if due && !self.syncs[at].running {
            self.start_sync(node);
        }
    }

    /// Start a sync of everything the node wrote so far; it returns after
    /// `SimConfig::sync_latency`, when the simulated disk makes the writes stable (those
    /// made meanwhile too, as a disk may; the core is told only of those before the start).
    fn start_sync(&mut self, node: NodeId) {
        let Some((fastest, slowest)) = self.config.sync_latency else { return };
        let at = node.index();
        self.nodes[at].sync_started();
        let spread = slowest.as_micros().saturating_sub(fastest.as_micros());
        let took = fastest + Time::from_micros(self.rng.below(spread + 1));
        let sync = &mut self.syncs[at];
        (sync.running, sync.wanted, sync.started) = (true, false, sync.started + 1);
        let (generation, number) = (sync.generation, sync.started);
        self.trace(|| format!("{node} starts sync {number}, returning in {took:?}"));
        self.schedule(self.now + took, Event::SyncDone { node, generation });
    }

    /// The node's sync returned: what waited for it leaves, the core hears so in a call of
    /// its own, and the next sync starts if records were written meanwhile.
    fn sync_done(&mut self, node: NodeId, generation: u64) {
        let at = node.index();
        if self.crashed[at] || self.syncs[at].generation != generation {
            return;
        }
        self.syncs[at].running = false;
        self.counts.syncs_on_thread += 1;
        let number = self.syncs[at].started;
        self.trace(|| format!("{node}'s sync {number} returns"));
        self.nodes[at].sync_durable();
        let (ready, waiting) = std::mem::take(&mut self.syncs[at].held)
            .into_iter()
            .partition(|(waits_for, ..)| *waits_for <= number);
        self.syncs[at].held = waiting;
        for (_, mut messages, replies) in ready {
            self.send_all(node, &mut messages, false);
            for (request, outcome) in replies {
                self.complete(request, outcome);
            }
        }
        // The core hears of this sync before the next starts: that one's records are not
        // stable until it returns.
        let now = self.local_now(node);
        self.nodes[at].on_synced(now, &mut self.outboxes[at]);
        self.end_call(node);
        if self.syncs[at].wanted && !self.syncs[at].running && !self.crashed[at] {
            self.start_sync(node);
        }
    }

    /// Send every message of `messages` (drained); a node that `dies_now` loses each copy
    /// with even odds (it died mid-broadcast).
    fn send_all(
        &mut self,
        node: NodeId,
        messages: &mut Vec<(chorus_core::Destination, P::Message)>,
        dies_now: bool,
    ) {
        for (destination, message) in messages.drain(..) {
            for to in destination.nodes().iter() {
                debug_assert_ne!(to, node, "a replica never sends to itself");
                if dies_now && self.rng.chance(0.5) {
                    continue; // Never left: the node died mid-broadcast.
                }
                self.send(node, to, message.clone());
            }
        }
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

    fn pause(&mut self, index: usize) {
        let (node, duration) = (NodeId(self.plan.pauses[index].node), self.plan.pauses[index].duration);
        if self.quiescent || self.crashed[node.index()] {
            return;
        }
        let wake = self.now + duration;
        self.paused_until[node.index()] = self.paused_until[node.index()].max(wake);
        self.counts.pauses += 1;
        self.trace(|| format!("{node} pauses until {wake:?}"));
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
        let now = self.local_now(node);
        self.nodes[node.index()].on_tick(now, &mut self.outboxes[node.index()]);
        self.end_call(node);
        self.schedule(self.now + self.config.tick_period, Event::Tick(node));
    }

    fn crash(&mut self, node: NodeId) {
        if self.crashed[node.index()] || self.quiescent {
            return;
        }
        if !self.may_crash(node) {
            self.crash_armed[node.index()] = false;
            self.counts.crashes_skipped += 1;
            return;
        }
        self.kill(node);
    }

    /// With syncs on a thread, half the power losses strike right after a node answered an
    /// update while its own sync ran: a node that counted records its sync had not made
    /// stable yet answers on them then, and the power loss takes them.
    fn power_loss_now_or_armed(&mut self) {
        if self.config.sync_latency.is_some() && self.rng.chance(0.5) {
            self.power_loss_armed = !self.quiescent;
            return;
        }
        self.power_loss();
    }

    /// Every node loses power at once; each restarts later from what its disk kept.
    fn power_loss(&mut self) {
        if self.quiescent {
            return;
        }
        self.counts.power_losses += 1;
        self.trace(|| "power loss: every node crashes".to_string());
        for node in 0..self.config.replicas as u8 {
            if !self.crashed[node as usize] {
                self.kill(NodeId(node));
            }
        }
    }

    fn kill(&mut self, node: NodeId) {
        let sync = &mut self.syncs[node.index()];
        if sync.running {
            self.counts.crashes_with_sync_running += 1;
        }
        // What waited for the sync never leaves; the sync never returns.
        (sync.running, sync.wanted, sync.generation) = (false, false, sync.generation + 1);
        sync.held.clear();
        // The outputs of its open turn die with it.
        self.outboxes[node.index()].clear();
        let turn = &mut self.turns[node.index()];
        *turn = Turn { number: turn.number + 1, calls: 0 };
        self.crashed[node.index()] = true;
        self.without_data[node.index()] = true;
        self.crash_armed[node.index()] = false;
        self.paused_until[node.index()] = Time::ZERO;
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
        let view = self.view;
        for survivor in view.live.iter() {
            let delay = self.plan.lease_us + self.rng.below(self.plan.view_spread_us + 1);
            self.schedule(self.now + Time::from_micros(delay), Event::InstallView(survivor, view));
        }
    }

    /// A majority must stay up with its data (for the membership service and every quorum): a
    /// crash that would leave fewer is skipped. A restarted node counts as down until it has
    /// caught up (`Replica::is_caught_up`): protocols that keep their data in memory lose it
    /// at a crash, and a majority restarted empty could not know what was committed.
    fn may_crash(&self, node: NodeId) -> bool {
        let crash_max = (self.config.replicas - 1) / 2;
        !self.crashed[node.index()]
            && self.without_data.iter().filter(|without| **without).count() < crash_max
            && self.config.crash_group_size.is_none_or(|size| {
                let group = node.index() / size;
                let without =
                    self.without_data[group * size..(group + 1) * size].iter().filter(|w| **w).count();
                without < (size - 1) / 2
            })
    }

    /// A crashed node comes back with what it kept on disk (the restart builder decides).
    /// Messages already in flight to it are delivered to the new incarnation.
    fn restart(&mut self, node: NodeId) {
        let Some(restart) = self.restart.as_mut() else { return };
        if !self.crashed[node.index()] {
            return;
        }
        let context = RestartContext {
            node,
            replicas: (0..self.config.replicas as u8).map(NodeId).collect(),
            seed: self.rng.next_u64(),
            now: self.clocks[node.index()].local(self.now),
            replace: self.refused[node.index()],
        };
        let restarted = restart(context, &self.nodes[node.index()]);
        let storage = restarted.storage;
        self.counts.storage_writes_lost += storage.writes_lost;
        self.counts.storage_writes_torn += storage.writes_torn;
        self.counts.storage_sectors_corrupted += storage.sectors_corrupted;
        self.counts.storage_corruption_detected += storage.corruption_detected;
        let fresh = match restarted.replica {
            Ok(fresh) => fresh,
            Err(reason) => {
                self.trace(|| format!("{node} refuses to start: {reason}"));
                if !std::mem::replace(&mut self.refused[node.index()], true) {
                    // Replaced once, a while later; a replacement refused too stays down.
                    let after = self.config.restart_after.unwrap_or(Time::ZERO);
                    self.schedule(self.now + after + after, Event::Restart(node));
                }
                return;
            }
        };
        self.refused[node.index()] = false;
        let old = std::mem::replace(&mut self.nodes[node.index()], fresh);
        add_counters(&mut self.counts.events, &old);
        self.crashed[node.index()] = false;
        self.crash_armed[node.index()] = false;
        self.counts.restarts += 1;
        self.trace(|| format!("{node} restarts{}", if context.replace { " on a new disk" } else { "" }));
        self.schedule(self.now + self.config.tick_period, Event::Tick(node));
    }

    fn install_view(&mut self, node: NodeId, view: View) {
        if self.crashed[node.index()] {
            return;
        }
        self.trace(|| format!("{node} installs view {:?} live {:?}", view.epoch, view.live));
        let now = self.local_now(node);
        self.nodes[node.index()].on_view(now, view, &mut self.outboxes[node.index()]);
        self.end_call(node);
    }

    // ------------------------------------------------------------------ clients

    /// A client's next request leaves strictly after its previous answer: the checker orders
    /// operations by real time only, and touching intervals count as concurrent, so a burst
    /// of instant answers (a replica alone in its view, refusals while joining) would
    /// otherwise make a client's whole burst one concurrent blob.
    fn schedule_client_next(&mut self, client: u32) {
        let think = Time::from_micros(1 + self.rng.below(self.workload.think_max_us + 1));
        self.schedule(self.now + think, Event::ClientNext(client));
    }

    fn client_next(&mut self, client: u32) {
        let state = &self.clients[client as usize];
        if self.quiescent || state.ops_issued >= self.workload.ops_per_client {
            return;
        }
        let up: Vec<u8> = (0..self.config.replicas as u8).filter(|n| !self.crashed[*n as usize]).collect();
        if up.is_empty() {
            // Every node is down (a power loss): try again a little later.
            self.schedule(self.now + Time::from_millis(5), Event::ClientNext(client));
            return;
        }
        let last = self.clients[client as usize].last_node;
        let node = match last {
            Some(node) if !self.crashed[node.index()] && self.rng.chance(self.workload.stickiness) => node,
            _ => NodeId(*self.rng.pick(&up)),
        };
        let state = &mut self.clients[client as usize];
        state.last_node = Some(node);
        let command = state.generator.next(&mut self.rng, &self.workload, &mut self.keys);
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
        let read_locally = typed_read(&command).is_some();
        self.pending.insert(request, PendingOp { op_index, client, node, read_locally });
        self.client_arrives(request, node, command);
    }

    /// The request reaches its replica (a paused one gets it when it wakes: see `run`).
    fn client_arrives(&mut self, request: ClientRequestId, node: NodeId, command: Command) {
        if self.now < self.paused_until[node.index()] {
            self.schedule(self.paused_until[node.index()], Event::ClientArrives { request, node, command });
            return;
        }
        let Some(pending) = self.pending.get(&request) else {
            return; // The connection dropped with a crash while the node was paused.
        };
        if self.crashed[node.index()] {
            return;
        }
        let (op_index, read_locally) = (pending.op_index, pending.read_locally);
        let now = self.local_now(node);
        let command = self.stamp_clock(op_index, command, now);
        let command = if read_locally { Command::Read { key: command.key().clone() } } else { command };
        self.nodes[node.index()].on_client(now, request, command, &mut self.outboxes[node.index()]);
        self.end_call(node);
    }

    /// A typed command carries the clock reading of the replica that submits it (the server's
    /// `wall_clock_ms`): relative deadlines count from it and deadlines are judged against it.
    /// The history records the command as stamped, so the checker's model judges expiry at
    /// the very clock reading the replica used.
    fn stamp_clock(&mut self, op_index: usize, command: Command, now: Time) -> Command {
        let Command::Rmw { key, op: RmwOp::Exec(mut op) } = command else { return command };
        op.now_ms = now.as_millis();
        let stamped = Command::Rmw { key, op: RmwOp::Exec(op) };
        self.history.operations[op_index].command = stamped.clone();
        stamped
    }

    /// A typed read's locally read value, judged as the server judges it: answered if its
    /// deadline has not passed by the op's clock reading; otherwise the command runs again as
    /// a replicated RMW, stamped anew, and that decides. `None`: the operation goes on.
    fn judge_typed_read(&mut self, request: ClientRequestId, outcome: Outcome) -> Option<Outcome> {
        let pending = self.pending.get_mut(&request).expect("pending op");
        let Outcome::Value(value) = outcome else { return Some(outcome) };
        let command = &self.history.operations[pending.op_index].command;
        let op = typed_read(command).expect("a typed read").clone();
        let effect = chorus_core::data::apply(&op, value.as_ref());
        if effect.write.is_none() || self.config.expiry_by_local_clock {
            return Some(effect.outcome);
        }
        pending.read_locally = false;
        let (node, command) = (pending.node, command.clone());
        *self.counts.events.entry("expiry.reads_found_expired".to_string()).or_default() += 1;
        self.trace(|| format!("#{} found its key expired: replicated delete", request.0));
        self.schedule(self.now, Event::ClientArrives { request, node, command });
        None
    }

    fn complete(&mut self, request: ClientRequestId, outcome: Outcome) {
        let Some(pending) = self.pending.get(&request) else {
            return; // The client already gave up on it (its replica crashed).
        };
        let outcome = if pending.read_locally {
            match self.judge_typed_read(request, outcome) {
                Some(outcome) => outcome,
                None => return,
            }
        } else {
            outcome
        };
        let op = self.pending.remove(&request).expect("pending op");
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
        for node in &self.nodes {
            add_counters(&mut self.counts.events, node);
        }
        self.counts.ops_overlapping = count_overlapping(&self.history, self.now);
        self.counts.updates_interrupted = self
            .history
            .operations
            .iter()
            .filter(|op| op.command.is_update() && op.completion.is_none())
            .count() as u64;
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

/// The typed command of a read-only typed op (GET, PTTL, ...), which replicas run on a
/// locally read value.
fn typed_read(command: &Command) -> Option<&ExecOp> {
    match command {
        Command::Rmw { op: RmwOp::Exec(op), .. } => {
            let name = String::from_utf8_lossy(&op.args[0]).to_ascii_lowercase();
            (chorus_core::data::access(&name) == Some(Access::Read)).then_some(op)
        }
        _ => None,
    }
}

/// How many nodes `messages` reach, counting protocol messages only (not control traffic).
fn protocol_destinations<'a, P: Replica>(
    messages: impl Iterator<Item = &'a (chorus_core::Destination, P::Message)>,
) -> usize
where
    P::Message: 'a,
{
    let mut reached = NodeSet::EMPTY;
    for (destination, message) in messages {
        if !P::is_control(message) {
            reached = NodeSet::from_bits(reached.bits() | destination.nodes().bits());
        }
    }
    reached.len()
}

fn add_counters<P: Replica>(totals: &mut BTreeMap<String, u64>, replica: &P) {
    replica.event_counts(&mut |name, count| {
        if count > 0 {
            *totals.entry(name.to_string()).or_default() += count;
        }
    });
}

/// Operations whose interval (invocation to completion, or to the end for unknown outcomes)
/// overlaps another client's operation on the same key: the concurrency the checker has to
/// untangle.
fn count_overlapping(history: &History, end: Time) -> u64 {
    let mut by_key: FxHashMap<&[u8], Vec<(Time, Time, u32)>> = FxHashMap::default();
    for op in &history.operations {
        let done = op.completion.as_ref().map_or(end, |completion| completion.at);
        by_key.entry(op.command.key()).or_default().push((op.invoke, done, op.client));
    }
    let mut overlapping = 0;
    for intervals in by_key.values_mut() {
        intervals.sort_unstable();
        let mut flags = vec![false; intervals.len()];
        // Each interval against the later-starting ones it reaches (sorted by start).
        for i in 0..intervals.len() {
            let (_, end_i, client_i) = intervals[i];
            for j in i + 1..intervals.len() {
                let (start_j, _, client_j) = intervals[j];
                if start_j > end_i {
                    break;
                }
                if client_i != client_j {
                    flags[i] = true;
                    flags[j] = true;
                }
            }
        }
        overlapping += flags.iter().filter(|flag| **flag).count() as u64;
    }
    overlapping
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::rc::Rc;

    use super::*;

    /// What [`TurnProbe`] saw: per turn, how many calls it took, and how long after its first
    /// call it ended.
    #[derive(Default)]
    struct Turns {
        calls: Vec<u32>,
        lengths: Vec<Time>,
    }

    /// A lone replica that answers only at the end of a turn: every request of the turn is
    /// refused there (nothing executes, so any history is linearizable).
    struct TurnProbe {
        me: NodeId,
        waiting: Vec<ClientRequestId>,
        calls: u32,
        first_call: Time,
        seen: Rc<RefCell<Turns>>,
    }

    impl TurnProbe {
        fn call(&mut self, now: Time) {
            if self.calls == 0 {
                self.first_call = now;
            }
            self.calls += 1;
        }
    }

    impl Replica for TurnProbe {
        type Message = ();

        fn id(&self) -> NodeId {
            self.me
        }
        fn on_client(&mut self, now: Time, request: ClientRequestId, _: Command, _: &mut Outbox<()>) {
            self.call(now);
            self.waiting.push(request);
        }
        fn on_message(&mut self, now: Time, _: NodeId, _: (), _: &mut Outbox<()>) {
            self.call(now);
        }
        fn on_tick(&mut self, now: Time, _: &mut Outbox<()>) {
            self.call(now);
        }
        fn on_view(&mut self, now: Time, _: View, _: &mut Outbox<()>) {
            self.call(now);
        }
        fn end_turn(&mut self, now: Time, out: &mut Outbox<()>) {
            assert!(self.calls > 0, "a turn ends only after a call");
            let mut seen = self.seen.borrow_mut();
            seen.calls.push(std::mem::take(&mut self.calls));
            seen.lengths.push(Time::from_nanos(now.as_nanos() - self.first_call.as_nanos()));
            for request in self.waiting.drain(..) {
                out.reply(request, Outcome::Error(CommandError::Unavailable("probe")));
            }
        }
    }

    fn run_probe(turn_max: Option<Time>) -> (SeedRun, Turns) {
        let mut config = SimConfig::new(7, 1);
        config.faults = false;
        config.turn_max = turn_max;
        let seen = Rc::new(RefCell::new(Turns::default()));
        let mut build = |me, _, _| TurnProbe {
            me,
            waiting: Vec::new(),
            calls: 0,
            first_call: Time::ZERO,
            seen: seen.clone(),
        };
        let run = simulate(&config, &mut build);
        let turns = Rc::try_unwrap(seen).ok().expect("the probe is gone").into_inner();
        (run, turns)
    }

    /// With `turn_max`, calls that arrive while a node's turn is open join it; the turn
    /// ends once (`Replica::end_turn`, before its outbox is performed) within `turn_max` of
    /// its first call, and every reply it gave there reaches its client.
    #[test]
    fn a_turn_takes_the_calls_that_arrive_while_it_is_open_and_ends_once() {
        let turn_max = Time::from_millis(2);
        let (run, turns) = run_probe(Some(turn_max));
        assert!(run.liveness_failures.is_empty(), "{:?}", run.liveness_failures);
        assert!(run.history.operations.iter().all(|op| op.completion.is_some()));
        assert!(turns.calls.iter().any(|calls| *calls > 1), "some turn took several calls");
        assert!(turns.lengths.iter().all(|length| *length <= turn_max));
        let several = turns.calls.iter().filter(|calls| **calls > 1).count() as u64;
        assert_eq!(run.faults.turns_of_several_calls, several);
    }

    /// Without `turn_max`, every call is a turn of its own, and `end_turn` still follows it.
    #[test]
    fn without_turns_every_call_ends_its_own_turn() {
        let (run, turns) = run_probe(None);
        assert!(run.liveness_failures.is_empty(), "{:?}", run.liveness_failures);
        assert!(run.history.operations.iter().all(|op| op.completion.is_some()));
        assert!(!turns.calls.is_empty() && turns.calls.iter().all(|calls| *calls == 1));
        assert!(turns.lengths.iter().all(|length| *length == Time::ZERO));
    }
}
