//! The model's event loop: the real protocol cores under virtual time, with every event
//! costing CPU time on its machine and every message costing NIC time on its links.
//!
//! A node is what the server is (crates/server/src/engine.rs): each of its `loops` event
//! loops is ONE protocol thread owning an independent instance of the core (the server's
//! `event_loops`, raftlog's shards: a key belongs to loop `shard_of(key, loops)`, loop `i` of
//! one node only talks to loop `i` of the others), while receiving, parsing, encoding and
//! sending run on any core. Work goes through three stages, each waiting for a free thread of
//! its instance and a free core of its machine:
//!
//! 1. receive (any thread): `client_request_ns` per client request, `message_received_ns` per
//!    peer frame and `peer_message_ns` per message in it, plus its bytes;
//! 2. handle (the protocol thread): a **turn** takes every event already waiting (up to the
//!    server's 512), as the server's event loop does; each costs `handle_ns` (a tick
//!    `tick_ns`), a client command `key_op_ns` more, and the turn `sync_ns` once if it wrote
//!    durable state;
//! 3. send (any thread): `message_sent_ns` per frame (and `peer_message_ns` per message in
//!    it) and `reply_sent_ns` per reply, plus bytes, where a turn's messages to one peer travel in ONE frame (the server's
//!    `send_turn`: opportunistic batching, Hermes §4.2).
//!
//! Then each frame queues for its machine's egress NIC, crosses the switch (`latency_ns`),
//! and queues for the receiver's ingress NIC. Ticks skip stage 1.
//!
//! Machines: a node's machine is its own (a replica per machine, clients elsewhere), or
//! shared by several nodes (`groups` of tenants on the same machines, or every node and the
//! load generator on one host: a loopback run, where each request also costs the load
//! generator `client_op_ns`). A machine may run a **background load** that keeps every core
//! busy in slices (the HyperLoop paper's co-located tenants): work that needs a core waits
//! for the first slice to end. Messages a protocol marks as **handled by the NIC** (the
//! HyperLoop chain's hops: gWRITE, gCAS, gMEMCPY forwarded by the NIC) skip the CPU stages:
//! the core's handler runs when the frame has arrived, and what it sends leaves at once.
//! No faults: the correctness swarms are the simulator's job (crate::simulator), and this loop
//! leaves them untouched.

use std::collections::{BTreeMap, VecDeque};

use bytes::BytesMut;
use chorus_core::codec::{WireMessage, FRAME_HEADER_BYTES};
use chorus_core::slots::{even_ranges, key_slot};
use chorus_core::{ClientRequestId, Command, Destination, NodeId, Outbox, Outcome, Replica, Time};

use super::costs::{CostTable, Network};

/// Time as the model counts it: nanoseconds since the start.
type Nanos = u64;

/// What the clients do once one of their requests is answered.
pub(super) enum AfterReply {
    /// Nothing yet (more replies of the same step outstanding, or an open loop).
    Wait,
    /// Send the next step of the same operation now.
    Send(Vec<Command>),
    /// The operation is done; the client issues its next one at this time.
    IssueAt(Nanos),
}

/// One step of a client operation: commands sent together (pipelined), under a tag the
/// clients use to tell their operations apart.
pub(super) struct Issued {
    pub tag: u64,
    pub commands: Vec<Command>,
    /// In an open loop: when this client issues its next operation, whatever the answers.
    pub next_issue: Option<Nanos>,
}

/// What the engine needs to know about the clients' traffic.
pub(super) trait Clients {
    /// The first operation of every client (closed loop) or every planned arrival (open
    /// loop): `(at, client)` pairs.
    fn initial(&mut self) -> Vec<(Nanos, u32)>;
    /// Client `client` starts its next operation now (`None`: it is done).
    fn issue(&mut self, client: u32, now: Nanos) -> Option<Issued>;
    /// A reply to one of operation `tag`'s requests reached its client.
    fn completed(&mut self, tag: u64, now: Nanos, outcome: &Outcome) -> AfterReply;
}

enum Work<M> {
    Client {
        request: ClientRequestId,
        command: Command,
    },
    /// One frame: every message a peer's turn sent here (of one kind: CPU or NIC).
    Messages {
        from: NodeId,
        messages: Vec<M>,
        nic: bool,
    },
    Tick,
}

/// One frame a turn sends: to one peer, every message of one kind.
struct Frame<M> {
    to: NodeId,
    messages: Vec<M>,
    bytes: u64,
    /// Handled by the receiver's NIC, not its CPU.
    nic: bool,
}

/// What one turn produced, with its encoded sizes.
struct Outputs<M> {
    frames: Vec<Frame<M>>,
    replies: Vec<(ClientRequestId, Outcome, u64)>,
}

/// A request on its way out of the load generator (shared host only).
struct Outgoing {
    request: ClientRequestId,
    command: Command,
    instance: usize,
}

/// How many events one turn takes, as the server's event loop (EVENTS_PER_TURN_MAX).
const EVENTS_PER_TURN_MAX: usize = 512;

/// One machine: its cores and whether a background load keeps them busy.
#[derive(Clone, Copy, Debug)]
pub(super) struct MachineSpec {
    pub cores: u32,
    /// `Some(slice)`: every core runs a CPU-bound background process whenever no replica work
    /// holds it, in slices of this length; work waiting for a core gets the first one whose
    /// slice ends.
    pub background_slice_ns: Option<Nanos>,
}

/// Where the instances run and how clients reach them.
#[derive(Clone, Debug)]
pub(super) struct Layout {
    /// Replicas per group.
    pub nodes: usize,
    /// Event loops (independent protocol instances) per node.
    pub loops: usize,
    /// Replica groups; keys go to groups by slot (even ranges of Redis' 16 384 slots).
    pub groups: usize,
    /// The machine of node `group * nodes + member`.
    pub machine_of_node: Vec<usize>,
    pub machines: Vec<MachineSpec>,
    /// Threads per instance: how many of its stages run at once.
    pub threads: u32,
    /// Machine 0 also runs the load generator (a loopback run on one host).
    pub shared_host: bool,
    /// Client `c` talks only to group `c % groups` (a tenant), instead of following its keys.
    pub client_per_group: bool,
}

impl Layout {
    fn instances(&self) -> usize {
        self.groups * self.nodes * self.loops
    }

    fn instance(&self, group: usize, member: usize, loop_index: usize) -> usize {
        (group * self.nodes + member) * self.loops + loop_index
    }
}

enum Event<M> {
    /// A client's next operation is due.
    Issue(u32),
    /// The load generator has encoded and written a request (shared host only).
    ClientSent(Outgoing),
    /// Work reaches an instance (its machine's ingress NIC done with it).
    Arrive {
        instance: usize,
        work: Work<M>,
        bytes: u64,
    },
    ReceiveDone {
        instance: usize,
        work: Work<M>,
    },
    HandleDone {
        instance: usize,
        outputs: Outputs<M>,
    },
    SendDone {
        instance: usize,
        outputs: Outputs<M>,
    },
    /// One write of a send stage is done: its frame or reply leaves (the stage goes on).
    Written {
        instance: usize,
        outputs: Outputs<M>,
    },
    /// A reply reaches its client.
    Reply {
        request: ClientRequestId,
        outcome: Outcome,
    },
    Tick(usize),
    /// A background slice on one of the machine's cores ends.
    SliceEnd(usize),
}

/// One protocol instance: its core's position and its stage queues.
struct Instance<M> {
    group: usize,
    loop_index: usize,
    machine: usize,
    threads: u32,
    threads_free: u32,
    /// The wake-up the instance owes (`wake_ns`, or `timer_wake_ns` when its tick woke it):
    /// charged to the next stage it starts.
    wake_owed_ns: Nanos,
    protocol_busy: bool,
    /// Work waiting for a core to receive it, with its size on the wire and when it arrived.
    receive: VecDeque<(Work<M>, u64, Nanos)>,
    handle: VecDeque<Work<M>>,
    /// An instance with one thread runs like the server's reactor (crates/server/src/reactor.rs):
    /// in **passes**, each one poll, reading what had arrived by then, one turn, and writing
    /// the turn's frames and replies; what arrives during a pass waits for the next poll. With
    /// more threads the protocol thread goes first (it is the serial part) and receiving runs
    /// beside it.
    receive_first: bool,
    /// The instant the current pass's poll returned (one-thread instances; `None` between
    /// passes): it receives only what had arrived by then.
    poll_at: Option<Nanos>,
    /// The current pass has taken its turn: what reaches the thread now (a tick too) waits
    /// for the next pass, as the reactor ticks once per pass, before its turn.
    pass_turned: bool,
    send: VecDeque<Outputs<M>>,
    protocol_busy_ns: u64,
}

impl<M> Instance<M> {
    fn idle(&self) -> bool {
        self.threads_free == self.threads
            && self.receive.is_empty()
            && self.handle.is_empty()
            && self.send.is_empty()
    }
}

/// One machine's cores and NIC.
struct Machine {
    spec: MachineSpec,
    cores_free: u32,
    /// Its instances, and where the next dispatch starts among them (round robin).
    instances: Vec<usize>,
    next_first: usize,
    egress_free_at: Nanos,
    ingress_free_at: Nanos,
    /// Core time spent on replica work (not the background's), for utilisation.
    busy_ns: u64,
    egress_busy_ns: u64,
    ingress_busy_ns: u64,
}

/// What one run measured over its window, before summarising.
pub(super) struct Measured {
    /// The window's length.
    pub window_ns: Nanos,
    /// Per machine that runs replicas, busy within the window.
    pub machine_busy_ns: Vec<u64>,
    pub machine_cores: Vec<u32>,
    pub protocol_busy_ns: Vec<u64>,
    pub egress_busy_ns: Vec<u64>,
    pub ingress_busy_ns: Vec<u64>,
    /// The load generator's CPU on a shared host, and its threads' wakes.
    pub client_busy_ns: u64,
    pub client_wakes: u64,
    /// Times a node's thread was woken (a socket's or its timer's wake charged).
    pub node_wakes: u64,
    /// Peer frames sent, and the messages in them (one per destination), within the window.
    pub frames_sent: u64,
    pub messages_sent: u64,
    /// Turns the protocol threads took within the window (every instance's).
    pub turns: u64,
    /// The handlers' wall time over the whole run, when timed.
    pub handlers: super::timing::Totals,
    /// Every replica's CPU within the window.
    pub window_nodes_busy_ns: u64,
    pub events: u64,
}

/// The busy-time counters at one instant (work is counted when it starts).
struct Counters {
    machine_busy_ns: Vec<u64>,
    protocol_busy_ns: Vec<u64>,
    egress_busy_ns: Vec<u64>,
    ingress_busy_ns: Vec<u64>,
    client_busy_ns: u64,
    client_wakes: u64,
    node_wakes: u64,
    frames_sent: u64,
    messages_sent: u64,
    turns: u64,
}

/// Which messages the receiving NIC handles without the CPU (HyperLoop's offloaded hops).
pub(super) type NicHandled<M> = fn(&M) -> bool;

/// What a run charges and how its clock ticks.
pub(super) struct Setup<M> {
    pub costs: CostTable,
    pub network: Network,
    pub nic_handled: Option<NicHandled<M>>,
    /// The event loops' tick period.
    pub tick_ns: Nanos,
    /// A read of a key no write of the run reached is sized as a loaded record of this many
    /// value bytes.
    pub record_bytes: u64,
    /// Time every handler call (wall clock: calibration only; the prediction ignores it).
    pub time_handlers: bool,
    /// A send stage's writes leave one by one, each when the thread has made it
    /// ([`crate::model::ModelConfig::writes_one_by_one`]).
    pub writes_one_by_one: bool,
    /// [`crate::model::ModelConfig::split_frames_at_sync`].
    pub split_frames_at_sync: bool,
}

pub(super) struct Engine<'a, P: Replica, C: Clients> {
    replicas: Vec<P>,
    instances: Vec<Instance<P::Message>>,
    machines: Vec<Machine>,
    layout: Layout,
    /// The slot ranges of the groups.
    group_ranges: Vec<(u16, u16)>,
    /// Requests waiting for the load generator's CPU (shared host only).
    outgoing: VecDeque<Outgoing>,
    /// The load generator's threads not running (asleep): one runtime worker per host core,
    /// as `chorus bench`'s. A request that finds no generator thread running wakes one.
    client_threads_free: u32,
    client_busy_ns: u64,
    client_wakes: u64,
    node_wakes: u64,
    frames_sent: u64,
    messages_sent: u64,
    turns: u64,
    time_handlers: bool,
    writes_one_by_one: bool,
    split_frames_at_sync: bool,
    handler_totals: super::timing::Totals,
    costs: CostTable,
    network: Network,
    nic_handled: Option<NicHandled<P::Message>>,
    tick_ns: Nanos,
    clients: &'a mut C,
    /// `request -> (operation tag, client)`.
    pending: rustc_hash::FxHashMap<ClientRequestId, (u64, u32)>,
    next_request: u64,
    /// Pending events by `(at, seq)`: the earliest first, ties in the order scheduled.
    queue: BTreeMap<(Nanos, u64), Event<P::Message>>,
    seq: u64,
    now: Nanos,
    outbox: Outbox<P::Message>,
    buffer: BytesMut,
    /// A read of a key no write of the run reached is sized as a loaded record of this many
    /// value bytes (the model loads no data; the records are taken as loaded).
    record_bytes: u64,
}

impl<'a, P, C> Engine<'a, P, C>
where
    P: Replica,
    P::Message: WireMessage,
    C: Clients,
{
    /// `replicas` in instance order: group, then member, then loop.
    pub(super) fn new(
        replicas: Vec<P>,
        layout: Layout,
        setup: Setup<P::Message>,
        clients: &'a mut C,
    ) -> Self {
        let Setup {
            costs,
            network,
            nic_handled,
            tick_ns,
            record_bytes,
            time_handlers,
            writes_one_by_one,
            split_frames_at_sync,
        } = setup;
        assert_eq!(replicas.len(), layout.instances(), "one replica per instance");
        assert_eq!(layout.machine_of_node.len(), layout.groups * layout.nodes, "a machine per node");
        assert!(layout.threads >= 1, "an instance needs a thread");
        assert!(layout.machines.iter().all(|machine| machine.cores >= 1), "a machine needs a core");
        let mut machines: Vec<Machine> = layout
            .machines
            .iter()
            .map(|spec| Machine {
                spec: *spec,
                cores_free: spec.cores,
                instances: Vec::new(),
                next_first: 0,
                egress_free_at: 0,
                ingress_free_at: 0,
                busy_ns: 0,
                egress_busy_ns: 0,
                ingress_busy_ns: 0,
            })
            .collect();
        let mut instances = Vec::with_capacity(replicas.len());
        for index in 0..replicas.len() {
            let node = index / layout.loops;
            let machine = layout.machine_of_node[node];
            machines[machine].instances.push(index);
            instances.push(Instance {
                group: node / layout.nodes,
                loop_index: index % layout.loops,
                machine,
                threads: layout.threads,
                threads_free: layout.threads,
                wake_owed_ns: 0,
                protocol_busy: false,
                receive: VecDeque::new(),
                handle: VecDeque::new(),
                receive_first: layout.threads == 1,
                poll_at: None,
                pass_turned: false,
                send: VecDeque::new(),
                protocol_busy_ns: 0,
            });
        }
        let group_ranges = even_ranges(layout.groups as u16);
        let client_threads_free = if layout.shared_host { layout.machines[0].cores } else { 0 };
        Engine {
            replicas,
            instances,
            machines,
            layout,
            group_ranges,
            outgoing: VecDeque::new(),
            client_threads_free,
            client_busy_ns: 0,
            client_wakes: 0,
            node_wakes: 0,
            frames_sent: 0,
            messages_sent: 0,
            turns: 0,
            time_handlers,
            writes_one_by_one,
            split_frames_at_sync,
            handler_totals: Default::default(),
            costs,
            network,
            nic_handled,
            tick_ns,
            clients,
            pending: Default::default(),
            next_request: 0,
            queue: BTreeMap::new(),
            seq: 0,
            now: 0,
            outbox: Outbox::default(),
            buffer: BytesMut::new(),
            record_bytes,
        }
    }

    fn schedule(&mut self, at: Nanos, event: Event<P::Message>) {
        debug_assert!(at >= self.now, "no event in the past");
        self.seq += 1;
        self.queue.insert((at, self.seq), event);
    }

    /// Run until `end_ns` of virtual time; what is measured is what happened from
    /// `window_ns` on.
    pub(super) fn run(mut self, window_ns: Nanos, end_ns: Nanos) -> Measured {
        let count = self.instances.len() as u64;
        for instance in 0..self.instances.len() {
            // Ticks of different loops and nodes fall at different instants, as real
            // clocks' do.
            let offset = self.tick_ns * instance as u64 / count;
            self.schedule(offset, Event::Tick(instance));
        }
        for machine in 0..self.machines.len() {
            self.start_background(machine);
        }
        for (at, client) in self.clients.initial() {
            self.schedule(at, Event::Issue(client));
        }
        let mut events = 0;
        let mut at_window = None;
        while let Some(((at, _), event)) = self.queue.pop_first() {
            if at > end_ns {
                break;
            }
            if at >= window_ns && at_window.is_none() {
                at_window = Some(self.counters());
            }
            self.now = at;
            events += 1;
            self.handle(event);
        }
        let start = at_window.unwrap_or_else(|| self.counters());
        let end = self.counters();
        let minus =
            |after: &[u64], before: &[u64]| after.iter().zip(before).map(|(a, b)| a - b).collect::<Vec<_>>();
        let machine_busy_ns = minus(&end.machine_busy_ns, &start.machine_busy_ns);
        let used: Vec<usize> = (0..self.machines.len())
            .filter(|machine| !self.machines[*machine].instances.is_empty())
            .collect();
        let pick = |all: Vec<u64>| used.iter().map(|machine| all[*machine]).collect::<Vec<_>>();
        Measured {
            window_ns: end_ns.saturating_sub(window_ns).max(1),
            window_nodes_busy_ns: machine_busy_ns.iter().sum(),
            machine_busy_ns: pick(machine_busy_ns),
            machine_cores: used.iter().map(|machine| self.machines[*machine].spec.cores).collect(),
            protocol_busy_ns: minus(&end.protocol_busy_ns, &start.protocol_busy_ns),
            egress_busy_ns: pick(minus(&end.egress_busy_ns, &start.egress_busy_ns)),
            ingress_busy_ns: pick(minus(&end.ingress_busy_ns, &start.ingress_busy_ns)),
            client_busy_ns: end.client_busy_ns - start.client_busy_ns,
            client_wakes: end.client_wakes - start.client_wakes,
            node_wakes: end.node_wakes - start.node_wakes,
            frames_sent: end.frames_sent - start.frames_sent,
            messages_sent: end.messages_sent - start.messages_sent,
            turns: end.turns - start.turns,
            handlers: self.handler_totals,
            events,
        }
    }

    fn counters(&self) -> Counters {
        Counters {
            machine_busy_ns: self.machines.iter().map(|machine| machine.busy_ns).collect(),
            protocol_busy_ns: self.instances.iter().map(|instance| instance.protocol_busy_ns).collect(),
            egress_busy_ns: self.machines.iter().map(|machine| machine.egress_busy_ns).collect(),
            ingress_busy_ns: self.machines.iter().map(|machine| machine.ingress_busy_ns).collect(),
            client_busy_ns: self.client_busy_ns,
            client_wakes: self.client_wakes,
            node_wakes: self.node_wakes,
            frames_sent: self.frames_sent,
            messages_sent: self.messages_sent,
            turns: self.turns,
        }
    }

    fn handle(&mut self, event: Event<P::Message>) {
        match event {
            Event::Issue(client) => self.issue(client),
            Event::ClientSent(outgoing) => {
                self.machines[0].cores_free += 1;
                self.deliver_request(outgoing);
                // The thread carries on with the next request waiting, awake; with none it
                // sleeps (epoll_wait), and the next request that finds no thread running
                // pays a wake.
                if !self.client_send_next(false) {
                    self.client_threads_free += 1;
                }
                self.dispatch_machine(0);
            }
            Event::Arrive { instance, work: Work::Messages { from, messages, nic: true }, .. } => {
                self.nic_handle(instance, from, messages);
            }
            Event::Arrive { instance, work, bytes } => {
                self.note_wake(instance, self.costs.wake_ns);
                self.instances[instance].receive.push_back((work, bytes, self.now));
                self.dispatch(instance);
            }
            Event::ReceiveDone { instance, work } => {
                self.release(instance);
                self.instances[instance].handle.push_back(work);
                self.carry_on(instance);
            }
            Event::HandleDone { instance, outputs } => {
                self.release(instance);
                let state = &mut self.instances[instance];
                state.protocol_busy = false;
                state.send.push_back(outputs);
                self.carry_on(instance);
            }
            Event::SendDone { instance, outputs } => {
                self.release(instance);
                self.transmit(instance, outputs);
                self.carry_on(instance);
            }
            Event::Written { instance, outputs } => self.transmit(instance, outputs),
            Event::Reply { request, outcome } => self.reply(request, outcome),
            Event::Tick(instance) => {
                self.note_wake(instance, self.costs.timer_wake_ns);
                self.instances[instance].handle.push_back(Work::Tick);
                self.dispatch(instance);
                self.schedule(self.now + self.tick_ns, Event::Tick(instance));
            }
            Event::SliceEnd(machine) => {
                // The background process gives up the core; waiting replica work takes it,
                // or the background runs another slice.
                self.machines[machine].cores_free += 1;
                self.dispatch_machine(machine);
            }
        }
    }

    /// Work reaches `instance`: if it had nothing to do, its thread sleeps and must be woken.
    fn note_wake(&mut self, instance: usize, wake_ns: Nanos) {
        let state = &mut self.instances[instance];
        if state.idle() {
            state.wake_owed_ns = wake_ns;
        }
    }

    fn issue(&mut self, client: u32) {
        let Some(issued) = self.clients.issue(client, self.now) else { return };
        if let Some(next) = issued.next_issue {
            self.schedule(next.max(self.now), Event::Issue(client));
        }
        self.send_step(client, issued.tag, issued.commands);
    }

    fn send_step(&mut self, client: u32, tag: u64, commands: Vec<Command>) {
        for command in commands {
            let request = ClientRequestId(self.next_request);
            self.next_request += 1;
            self.pending.insert(request, (tag, client));
            let instance = self.route(client, command.key());
            let outgoing = Outgoing { request, command, instance };
            if self.layout.shared_host {
                // The load generator shares the host: encoding, writing and later reading
                // the reply cost it `client_op_ns` of a core before the request leaves.
                self.outgoing.push_back(outgoing);
            } else {
                self.deliver_request(outgoing);
            }
        }
        if self.layout.shared_host {
            self.dispatch_machine(0);
        }
    }

    /// The instance a client's command goes to: its key's group (or the client's tenant),
    /// the client's replica in that group (clients spread over the replicas round-robin, as
    /// `chorus bench` connects them), and its key's event loop there.
    fn route(&self, client: u32, key: &[u8]) -> usize {
        let layout = &self.layout;
        let group = if layout.client_per_group {
            client as usize % layout.groups
        } else {
            let slot = key_slot(key);
            self.group_ranges.iter().position(|(low, high)| (*low..=*high).contains(&slot)).unwrap_or(0)
        };
        let member = client as usize % layout.nodes;
        let loop_index = chorus_raftlog::shard_of(key, layout.loops);
        layout.instance(group, member, loop_index)
    }

    fn deliver_request(&mut self, outgoing: Outgoing) {
        let Outgoing { request, command, instance } = outgoing;
        let bytes = resp_request_bytes(&command);
        // The client's own NIC is never the bottleneck: the request crosses the switch and
        // queues for the node's ingress.
        let machine = self.instances[instance].machine;
        let at = self.ingress(machine, self.now + self.network.latency_ns, bytes);
        self.schedule(at, Event::Arrive { instance, work: Work::Client { request, command }, bytes });
    }

    fn reply(&mut self, request: ClientRequestId, outcome: Outcome) {
        let Some((tag, client)) = self.pending.remove(&request) else { return };
        match self.clients.completed(tag, self.now, &outcome) {
            AfterReply::Wait => {}
            AfterReply::Send(commands) => self.send_step(client, tag, commands),
            AfterReply::IssueAt(at) => self.schedule(at.max(self.now), Event::Issue(client)),
        }
    }

    /// A stage of `instance` ended: its thread and its machine's core are free again.
    fn release(&mut self, instance: usize) {
        let state = &mut self.instances[instance];
        state.threads_free += 1;
        self.machines[state.machine].cores_free += 1;
    }

    fn dispatch(&mut self, instance: usize) {
        self.dispatch_machine(self.instances[instance].machine);
    }

    /// A stage of `instance` ended: its thread keeps the core for its own next stage if it
    /// has one (a running thread is not descheduled between its stages), then the machine's
    /// other work takes whatever is free.
    fn carry_on(&mut self, instance: usize) {
        self.start_one(instance);
        self.dispatch(instance);
    }

    /// Start work on a machine until its cores are busy or nothing waits: its instances (and
    /// the load generator, on a shared host) take turns, one stage each, so none starves the
    /// others. Cores left over go to the background load, if the machine has one.
    fn dispatch_machine(&mut self, machine: usize) {
        let count = self.machines[machine].instances.len();
        loop {
            let mut started = machine == 0 && self.start_client_send();
            let first = self.machines[machine].next_first;
            for offset in 0..count {
                if self.machines[machine].cores_free == 0 {
                    break;
                }
                let instance = self.machines[machine].instances[(first + offset) % count];
                started |= self.start_one(instance);
            }
            if count > 0 {
                self.machines[machine].next_first = (first + 1) % count;
            }
            if !started || self.machines[machine].cores_free == 0 {
                break;
            }
        }
        self.start_background(machine);
    }

    /// Every core nothing else wants runs the background load for a slice.
    fn start_background(&mut self, machine: usize) {
        let Some(slice_ns) = self.machines[machine].spec.background_slice_ns else { return };
        let cores = self.machines[machine].spec.cores as u64;
        while self.machines[machine].cores_free > 0 {
            self.machines[machine].cores_free -= 1;
            // At the start the cores' slices are staggered, as real ones are.
            let slice = if self.now == 0 {
                slice_ns * (self.machines[machine].cores_free as u64 + 1) / cores
            } else {
                slice_ns
            };
            self.schedule(self.now + slice.max(1), Event::SliceEnd(machine));
        }
    }

    /// A sleeping thread of the load generator wakes for a waiting request, if a core is free.
    fn start_client_send(&mut self) -> bool {
        if !self.layout.shared_host || self.client_threads_free == 0 || self.outgoing.is_empty() {
            return false;
        }
        if !self.client_send_next(true) {
            return false;
        }
        self.client_threads_free -= 1;
        true
    }

    /// A thread of the load generator takes the next waiting request, if a core is free: its
    /// `client_op_ns` (reading the reply, recording it, encoding and writing the request),
    /// and its wake first if the thread was asleep (`CostTable::load_generator_wake_ns`).
    fn client_send_next(&mut self, waking: bool) -> bool {
        if self.machines[0].cores_free == 0 {
            return false;
        }
        let Some(outgoing) = self.outgoing.pop_front() else { return false };
        self.machines[0].cores_free -= 1;
        let wake = if waking { self.costs.load_generator_wake_ns() } else { 0 };
        self.client_wakes += waking as u64;
        let cost = self.costs.client_op_ns + wake;
        self.client_busy_ns += cost;
        self.schedule(self.now + cost, Event::ClientSent(outgoing));
        true
    }

    /// Start one stage of `instance`, if a thread and a core are free and work waits. Order:
    /// see [`Instance::receive_first`]; sends before receives (they free memory and unblock
    /// peers).
    fn start_one(&mut self, instance: usize) -> bool {
        let state = &self.instances[instance];
        if state.threads_free == 0 || self.machines[state.machine].cores_free == 0 {
            return false;
        }
        if state.receive_first {
            return self.start_in_pass(instance);
        }
        if !state.protocol_busy && !state.handle.is_empty() {
            self.start_turn(instance);
        } else if !self.start_send(instance) && !self.start_receive(instance) {
            return false;
        }
        true
    }

    /// One thread, as the server's reactor: a pass polls, reads what had arrived by then
    /// (the wake, if the thread slept, comes first: what arrives while it wakes is in the same
    /// poll), takes one turn of it, and writes the turn's output; then the next poll.
    fn start_in_pass(&mut self, instance: usize) -> bool {
        if self.start_send(instance) {
            return true;
        }
        loop {
            let state = &mut self.instances[instance];
            let poll_at = *state.poll_at.get_or_insert(self.now + state.wake_owed_ns);
            if !state.pass_turned {
                if state.receive.front().is_some_and(|(_, _, arrived)| *arrived <= poll_at) {
                    return self.start_receive(instance);
                }
                if !state.handle.is_empty() {
                    self.instances[instance].pass_turned = true;
                    self.start_turn(instance);
                    return true;
                }
            }
            // The pass is over: the next poll finds what arrived meanwhile, or the thread
            // sleeps.
            state.poll_at = None;
            state.pass_turned = false;
            if state.receive.is_empty() && state.handle.is_empty() {
                return false;
            }
        }
    }

    fn start_send(&mut self, instance: usize) -> bool {
        let Some(outputs) = self.instances[instance].send.pop_front() else { return false };
        let work = self.send_cost(&outputs);
        let cost = self.occupy(instance, work);
        if !self.writes_one_by_one {
            self.schedule(self.now + cost, Event::SendDone { instance, outputs });
            return true;
        }
        // Each reply, then each frame, is a write of its own (the reactor's `write_clients`,
        // then `flush_links`): it leaves when the thread has made it, not at the stage's end.
        let Outputs { frames, replies } = outputs;
        let mut at = self.now + (cost - work);
        for (request, outcome, bytes) in replies {
            at += self.costs.reply_sent_ns + self.costs.bytes_ns(bytes);
            let outputs = Outputs { frames: Vec::new(), replies: vec![(request, outcome, bytes)] };
            self.schedule(at, Event::Written { instance, outputs });
        }
        for frame in frames {
            at += self.frame_sent_ns(&frame);
            let outputs = Outputs { frames: vec![frame], replies: Vec::new() };
            self.schedule(at, Event::Written { instance, outputs });
        }
        let outputs = Outputs { frames: Vec::new(), replies: Vec::new() };
        self.schedule(self.now + cost, Event::SendDone { instance, outputs });
        true
    }

    fn start_receive(&mut self, instance: usize) -> bool {
        let Some((work, bytes, _)) = self.instances[instance].receive.pop_front() else { return false };
        let cost = self.occupy(instance, self.receive_cost(&work, bytes));
        self.schedule(self.now + cost, Event::ReceiveDone { instance, work });
        true
    }

    /// Take a thread of `instance` and a core of its machine for a stage of `cost`; returns
    /// how long the stage runs (with the wake-up the instance owes, if any).
    fn occupy(&mut self, instance: usize, cost: Nanos) -> Nanos {
        let state = &mut self.instances[instance];
        state.threads_free -= 1;
        let machine = &mut self.machines[state.machine];
        machine.cores_free -= 1;
        let wake = std::mem::take(&mut state.wake_owed_ns);
        self.node_wakes += (wake > 0) as u64;
        machine.busy_ns += cost + wake;
        cost + wake
    }

    fn receive_cost(&self, work: &Work<P::Message>, bytes: u64) -> Nanos {
        let per_event = match work {
            Work::Client { .. } => self.costs.client_request_ns,
            Work::Messages { messages, .. } => {
                self.costs.message_received_ns + messages.len() as u64 * self.costs.peer_message_ns
            }
            Work::Tick => return 0,
        };
        per_event + self.costs.bytes_ns(bytes)
    }

    fn frame_sent_ns(&self, frame: &Frame<P::Message>) -> Nanos {
        self.costs.message_sent_ns
            + frame.messages.len() as u64 * self.costs.peer_message_ns
            + self.costs.bytes_ns(frame.bytes)
    }

    fn send_cost(&self, outputs: &Outputs<P::Message>) -> Nanos {
        let frames = outputs.frames.iter().map(|frame| self.frame_sent_ns(frame));
        let replies = outputs
            .replies
            .iter()
            .map(|(_, _, bytes)| self.costs.reply_sent_ns + self.costs.bytes_ns(*bytes));
        frames.sum::<Nanos>() + replies.sum::<Nanos>()
    }

    /// The protocol thread takes a turn: every event waiting (up to the server's bound), the
    /// core's handlers run now, and their outputs leave when the turn's time is up.
    fn start_turn(&mut self, instance: usize) {
        let now = Time::from_nanos(self.now);
        let taken = self.instances[instance].handle.len().min(EVENTS_PER_TURN_MAX);
        let turn: Vec<Work<P::Message>> = self.instances[instance].handle.drain(..taken).collect();
        self.turns += 1;
        let replica = &mut self.replicas[instance];
        let timing = self.time_handlers;
        let mut cost = 0;
        for work in turn {
            match work {
                Work::Client { request, command } => {
                    cost += self.costs.handle_ns + self.costs.key_op_ns;
                    let started = timing.then(std::time::Instant::now);
                    replica.on_client(now, request, command, &mut self.outbox);
                    if let Some(started) = started {
                        self.handler_totals.client(started);
                    }
                }
                Work::Messages { from, messages, .. } => {
                    for message in messages {
                        cost += self.costs.handle_ns;
                        let started = timing.then(std::time::Instant::now);
                        replica.on_message(now, from, message, &mut self.outbox);
                        if let Some(started) = started {
                            self.handler_totals.message(started);
                        }
                    }
                }
                Work::Tick => {
                    cost += self.costs.tick_ns;
                    replica.on_tick(now, &mut self.outbox);
                }
            }
        }
        // The turn's end, as the server's event loop calls it (raftlog flushes its logs here).
        // Timed with the messages: its work is what they caused, so calibration folds it
        // into the per-message figure the turn is charged by.
        let started = timing.then(std::time::Instant::now);
        replica.end_turn(now, &mut self.outbox);
        if let Some(started) = started {
            self.handler_totals.turn_end(started);
        }
        // The server makes a turn durable once, before its messages and replies leave; a turn
        // that wrote only what may wait (raftlog's commit indexes) leaves it unsynced.
        // A sync lets the core count on what it made stable (raftlog's own entries toward a
        // commit): that call's records are made durable the same way, in the same turn.
        let (mut early, mut first_sync) = (Vec::new(), true);
        while replica.write_durable() && replica.sync_due() {
            if std::mem::take(&mut first_sync) && self.split_frames_at_sync {
                // The server writes what may leave before the turn's sync to the peers first
                // (`send_before_sync`): its own frames, apart from the turn's later ones.
                early.extend(
                    self.outbox.messages.extract_if(.., |(_, message)| replica.leaves_before_sync(message)),
                );
            }
            cost += self.costs.sync_ns;
            replica.sync_durable();
            replica.on_synced(now, &mut self.outbox);
        }
        replica.sync_durable();
        let mut outputs = self.take_outputs();
        if !early.is_empty() {
            let later = std::mem::take(&mut outputs.frames);
            outputs.frames = self.frames_of(early);
            outputs.frames.extend(later);
        }
        self.instances[instance].protocol_busy = true;
        let cost = self.occupy(instance, cost);
        self.instances[instance].protocol_busy_ns += cost;
        self.schedule(self.now + cost, Event::HandleDone { instance, outputs });
    }

    /// A frame of NIC-handled messages has arrived: the core's handler runs now, on no CPU,
    /// and whatever it sends leaves now, sent by the NIC.
    fn nic_handle(&mut self, instance: usize, from: NodeId, messages: Vec<P::Message>) {
        let now = Time::from_nanos(self.now);
        let replica = &mut self.replicas[instance];
        for message in messages {
            replica.on_message(now, from, message, &mut self.outbox);
        }
        replica.sync_durable();
        let outputs = self.take_outputs();
        self.transmit(instance, outputs);
    }

    /// Drain the outbox into one frame per destination node and kind (the model sends no
    /// multicast), with each frame's size on the wire.
    fn take_outputs(&mut self) -> Outputs<P::Message> {
        let messages = std::mem::take(&mut self.outbox.messages);
        let frames = self.frames_of(messages);
        let record_bytes = self.record_bytes;
        let replies = self.outbox.replies.drain(..).map(|(request, outcome)| {
            let bytes = match outcome {
                Outcome::Value(None) if record_bytes > 0 => bulk_reply_bytes(record_bytes as usize),
                _ => resp_reply_bytes(&outcome),
            };
            (request, outcome, bytes)
        });
        Outputs { frames, replies: replies.collect() }
    }

    /// One frame per destination (and per NIC-handled or not) for `messages`, in order.
    fn frames_of(&mut self, messages: Vec<(Destination, P::Message)>) -> Vec<Frame<P::Message>> {
        let mut frames: Vec<Frame<P::Message>> = Vec::new();
        for (destination, message) in messages {
            self.buffer.clear();
            message.encode(&mut self.buffer);
            let bytes = self.buffer.len() as u64;
            let nic = self.nic_handled.is_some_and(|handled| handled(&message));
            for to in destination.nodes().iter() {
                match frames.iter_mut().find(|frame| frame.to == to && frame.nic == nic) {
                    Some(frame) => {
                        frame.messages.push(message.clone());
                        frame.bytes += bytes;
                    }
                    None => frames.push(Frame {
                        to,
                        messages: vec![message.clone()],
                        bytes: frame_header_bytes() + bytes,
                        nic,
                    }),
                }
            }
        }
        frames
    }

    /// Hand a stage's outputs to the NICs.
    fn transmit(&mut self, instance: usize, outputs: Outputs<P::Message>) {
        let (group, loop_index, machine) = {
            let state = &self.instances[instance];
            (state.group, state.loop_index, state.machine)
        };
        for Frame { to, messages, bytes, nic } in outputs.frames {
            self.frames_sent += 1;
            self.messages_sent += messages.len() as u64;
            let to_instance = self.layout.instance(group, to.index(), loop_index);
            let to_machine = self.instances[to_instance].machine;
            let on_switch = self.egress(machine, bytes) + self.network.latency_ns;
            let at = self.ingress(to_machine, on_switch, bytes);
            let from = NodeId((instance / self.layout.loops % self.layout.nodes) as u8);
            let work = Work::Messages { from, messages, nic };
            self.schedule(at, Event::Arrive { instance: to_instance, work, bytes });
        }
        for (request, outcome, bytes) in outputs.replies {
            let at = self.egress(machine, bytes) + self.network.latency_ns;
            self.schedule(at, Event::Reply { request, outcome });
        }
    }

    /// Queue `bytes` for `machine`'s egress NIC now; returns when the last bit has left.
    fn egress(&mut self, machine: usize, bytes: u64) -> Nanos {
        let wire = self.network.wire_ns(bytes);
        let state = &mut self.machines[machine];
        let done = state.egress_free_at.max(self.now) + wire;
        state.egress_free_at = done;
        state.egress_busy_ns += wire;
        done
    }

    /// `bytes` reach `machine`'s ingress NIC at `at`; returns when it has received them.
    /// Queued in the order the sends happen, which is close to arrival order (every hop has
    /// the same latency).
    fn ingress(&mut self, machine: usize, at: Nanos, bytes: u64) -> Nanos {
        let wire = self.network.wire_ns(bytes);
        let state = &mut self.machines[machine];
        let done = state.ingress_free_at.max(at) + wire;
        state.ingress_free_at = done;
        state.ingress_busy_ns += wire;
        done
    }
}

/// A batch frame's header and message count, before its messages.
fn frame_header_bytes() -> u64 {
    (FRAME_HEADER_BYTES + 4) as u64
}

/// The RESP array a client sends for `command` (GET, SET, DEL, INCRBY, ...), exactly for
/// reads and writes and by the same shape for RMWs.
pub fn resp_request_bytes(command: &Command) -> u64 {
    let key = command.key().len();
    match command {
        Command::Read { .. } => resp_array(&[3, key]),
        Command::Write { value: Some(value), .. } => resp_array(&[3, key, value.len()]),
        Command::Write { value: None, .. } => resp_array(&[3, key]),
        // An RMW: its name, the key and an argument of about a value's size.
        _ => resp_array(&[6, key, 16]),
    }
}

/// `*N\r\n` then `$len\r\nbytes\r\n` per argument.
fn resp_array(arguments: &[usize]) -> u64 {
    let header = 3 + decimal_digits(arguments.len());
    let bodies: usize = arguments.iter().map(|len| 1 + decimal_digits(*len) + 2 + len + 2).sum();
    (header + bodies) as u64
}

fn decimal_digits(value: usize) -> usize {
    value.checked_ilog10().unwrap_or(0) as usize + 1
}

/// The RESP reply: a bulk string for a value, a short status otherwise.
pub fn resp_reply_bytes(outcome: &Outcome) -> u64 {
    match outcome {
        Outcome::Value(Some(value)) => bulk_reply_bytes(value.len()),
        _ => 5, // `+OK\r\n`, `$-1\r\n`, `:1\r\n`-sized
    }
}

/// `$len\r\nbytes\r\n`.
fn bulk_reply_bytes(len: usize) -> u64 {
    (1 + decimal_digits(len) + 2 + len + 2) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn resp_sizes_match_the_encoding() {
        let set =
            Command::Write { key: Bytes::from_static(b"key"), value: Some(Bytes::from(vec![b'x'; 10])) };
        // *3\r\n $3\r\nSET\r\n $3\r\nkey\r\n $10\r\nxxxxxxxxxx\r\n
        assert_eq!(resp_request_bytes(&set), 4 + 9 + 9 + 17);
        let get = Command::Read { key: Bytes::from_static(b"key") };
        assert_eq!(resp_request_bytes(&get), 4 + 9 + 9);
        assert_eq!(resp_reply_bytes(&Outcome::Value(Some(Bytes::from_static(b"abc")))), 9);
    }
}
