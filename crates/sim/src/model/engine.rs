//! The model's event loop: the real protocol cores under virtual time, with every event
//! costing CPU time on its node and every message costing NIC time on its links.
//!
//! A node is what the server is (crates/server/src/engine.rs): ONE protocol thread owns the
//! core, while receiving, parsing, encoding and sending run on any of the node's `threads`.
//! Work goes through three stages, each waiting for a free thread of its node and a free core
//! of the node's machine:
//!
//! 1. receive (any thread): `client_request_ns` per client request, `message_received_ns` per
//!    peer frame, plus its bytes;
//! 2. handle (the protocol thread): a **turn** takes every event already waiting (up to the
//!    server's 512), as the server's event loop does; each costs `handle_ns` (a tick
//!    `tick_ns`), a client command `key_op_ns` more, and the turn `sync_ns` once if it wrote
//!    durable state;
//! 3. send (any thread): `message_sent_ns` per frame and `reply_sent_ns` per reply, plus
//!    bytes, where a turn's messages to one peer travel in ONE frame (the server's
//!    `send_turn`: opportunistic batching, Hermes §4.2).
//!
//! Then each frame queues for its node's egress NIC, crosses the switch (`latency_ns`), and
//! queues for the receiver's ingress NIC. Ticks skip stage 1. A machine either belongs to one
//! node (`host_cores: None`: a replica per machine, clients elsewhere) or is shared by every
//! node and the clients (`Some(cores)`: a loopback run on one host, where each request also
//! costs the load generator `client_op_ns`). No faults: the correctness swarms are the
//! simulator's job (crate::simulator), and this loop leaves them untouched.

use std::collections::{BTreeMap, VecDeque};

use bytes::BytesMut;
use chorus_core::codec::{WireMessage, FRAME_HEADER_BYTES};
use chorus_core::{ClientRequestId, Command, NodeId, Outbox, Outcome, Replica, Time};

use super::costs::{CostTable, Network};

/// Time as the model counts it: nanoseconds since the start.
type Nanos = u64;

/// What the engine needs to know about the clients' traffic.
pub(super) trait Clients {
    /// The first request of every client (closed loop) or every planned arrival (open loop):
    /// `(at, client)` pairs.
    fn initial(&mut self) -> Vec<(Nanos, u32)>;
    /// Client `client` issues its next command now (`None`: it is done), and, in an open
    /// loop, when it issues the one after whatever the answers.
    fn command(&mut self, client: u32, now: Nanos) -> Option<(Command, Option<Nanos>)>;
    /// A reply reached `client`; returns when it issues its next request, if it does.
    fn completed(&mut self, client: u32, invoked: Nanos, now: Nanos, outcome: &Outcome) -> Option<Nanos>;
}

enum Work<M> {
    Client {
        request: ClientRequestId,
        command: Command,
    },
    /// One frame: every message a peer's turn sent here.
    Messages {
        from: NodeId,
        messages: Vec<M>,
    },
    Tick,
}

/// What one turn produced, with its encoded sizes: one frame per destination.
struct Outputs<M> {
    frames: Vec<(NodeId, Vec<M>, u64)>,
    replies: Vec<(ClientRequestId, Outcome, u64)>,
}

/// A request on its way out of the load generator (shared host only).
struct Outgoing {
    request: ClientRequestId,
    command: Command,
    node: NodeId,
}

/// How many events one turn takes, as the server's event loop (EVENTS_PER_TURN_MAX).
const EVENTS_PER_TURN_MAX: usize = 512;

/// Where the machines are: a machine per node, or one machine for everything.
#[derive(Clone, Copy, Debug)]
pub(super) struct Placement {
    /// Threads per node: how many of its stages run at once.
    pub threads: u32,
    /// `None`: every node has a machine of `threads` cores. `Some(cores)`: every node and the
    /// load generator share one machine of `cores` cores.
    pub host_cores: Option<u32>,
}

enum Event<M> {
    /// A client's next request is due.
    Issue(u32),
    /// The load generator has encoded and written a request (shared host only).
    ClientSent(Outgoing),
    /// Work reaches a node (its ingress NIC done with it).
    Arrive {
        node: NodeId,
        work: Work<M>,
        bytes: u64,
    },
    ReceiveDone {
        node: NodeId,
        work: Work<M>,
    },
    HandleDone {
        node: NodeId,
        outputs: Outputs<M>,
    },
    SendDone {
        node: NodeId,
        outputs: Outputs<M>,
    },
    /// A reply reaches its client.
    Reply {
        request: ClientRequestId,
        outcome: Outcome,
    },
    Tick(NodeId),
}

/// One node's CPU and NIC queues.
struct Node<M> {
    threads: u32,
    threads_free: u32,
    /// The wake-up the node owes (`wake_ns`, or `timer_wake_ns` when its tick woke it):
    /// charged to the next stage it starts.
    wake_owed_ns: Nanos,
    /// The machine whose cores it uses (an index into `Engine::cores_free`).
    machine: usize,
    protocol_busy: bool,
    /// Work waiting for a core to receive it, with its size on the wire.
    receive: VecDeque<(Work<M>, u64)>,
    handle: VecDeque<Work<M>>,
    /// A node with one thread runs like tokio's current-thread runtime: every ready
    /// connection task before the event loop's next turn. With more threads the protocol
    /// thread goes first (it is the serial part).
    receive_first: bool,
    send: VecDeque<Outputs<M>>,
    egress_free_at: Nanos,
    ingress_free_at: Nanos,
    /// Core time spent, for utilisation.
    busy_ns: u64,
    protocol_busy_ns: u64,
    egress_busy_ns: u64,
    ingress_busy_ns: u64,
}

/// What one run measured, before summarising.
pub(super) struct Measured {
    pub end_ns: Nanos,
    pub node_busy_ns: Vec<u64>,
    pub protocol_busy_ns: Vec<u64>,
    pub egress_busy_ns: Vec<u64>,
    pub ingress_busy_ns: Vec<u64>,
    /// The load generator's CPU on a shared host.
    pub client_busy_ns: u64,
    /// Every node's CPU from the measured window's start on.
    pub window_nodes_busy_ns: u64,
    pub events: u64,
}

pub(super) struct Engine<'a, P: Replica, C: Clients> {
    replicas: Vec<P>,
    nodes: Vec<Node<P::Message>>,
    /// Free cores per machine.
    cores_free: Vec<u32>,
    /// Requests waiting for the load generator's CPU (shared host only).
    outgoing: VecDeque<Outgoing>,
    shared_host: bool,
    client_busy_ns: u64,
    costs: CostTable,
    network: Network,
    tick_ns: Nanos,
    clients: &'a mut C,
    /// Which node each client talks to.
    client_node: Vec<NodeId>,
    /// `request -> (client, invoked)`.
    pending: rustc_hash::FxHashMap<ClientRequestId, (u32, Nanos)>,
    next_request: u64,
    /// Pending events by `(at, seq)`: the earliest first, ties in the order scheduled.
    queue: BTreeMap<(Nanos, u64), Event<P::Message>>,
    seq: u64,
    now: Nanos,
    outbox: Outbox<P::Message>,
    buffer: BytesMut,
}

impl<'a, P, C> Engine<'a, P, C>
where
    P: Replica,
    P::Message: WireMessage,
    C: Clients,
{
    pub(super) fn new(
        replicas: Vec<P>,
        placement: Placement,
        costs: CostTable,
        network: Network,
        tick_ns: Nanos,
        clients: &'a mut C,
        client_node: Vec<NodeId>,
    ) -> Self {
        assert!(placement.threads >= 1, "a node needs a thread");
        assert!(placement.host_cores != Some(0), "a machine needs a core");
        let cores_free = match placement.host_cores {
            Some(cores) => vec![cores],
            None => vec![placement.threads; replicas.len()],
        };
        let shared_host = placement.host_cores.is_some();
        let nodes = (0..replicas.len())
            .map(|index| Node {
                threads: placement.threads,
                threads_free: placement.threads,
                wake_owed_ns: 0,
                machine: if shared_host { 0 } else { index },
                protocol_busy: false,
                receive: VecDeque::new(),
                handle: VecDeque::new(),
                receive_first: placement.threads == 1,
                send: VecDeque::new(),
                egress_free_at: 0,
                ingress_free_at: 0,
                busy_ns: 0,
                protocol_busy_ns: 0,
                egress_busy_ns: 0,
                ingress_busy_ns: 0,
            })
            .collect();
        Engine {
            replicas,
            nodes,
            cores_free,
            outgoing: VecDeque::new(),
            shared_host,
            client_busy_ns: 0,
            costs,
            network,
            tick_ns,
            clients,
            client_node,
            pending: Default::default(),
            next_request: 0,
            queue: BTreeMap::new(),
            seq: 0,
            now: 0,
            outbox: Outbox::default(),
            buffer: BytesMut::new(),
        }
    }

    fn schedule(&mut self, at: Nanos, event: Event<P::Message>) {
        debug_assert!(at >= self.now, "no event in the past");
        self.seq += 1;
        self.queue.insert((at, self.seq), event);
    }

    /// Run until `end_ns` of virtual time; CPU spent from `window_ns` on is also summed apart.
    pub(super) fn run(mut self, window_ns: Nanos, end_ns: Nanos) -> Measured {
        for node in 0..self.replicas.len() {
            // Ticks of different nodes fall at different instants, as real clocks' do.
            let offset = self.tick_ns * node as u64 / self.replicas.len() as u64;
            self.schedule(offset, Event::Tick(NodeId(node as u8)));
        }
        for (at, client) in self.clients.initial() {
            self.schedule(at, Event::Issue(client));
        }
        let mut events = 0;
        let mut busy_before_window = None;
        while let Some(((at, _), event)) = self.queue.pop_first() {
            if at > end_ns {
                break;
            }
            if at >= window_ns && busy_before_window.is_none() {
                busy_before_window = Some(self.nodes_busy_ns());
            }
            self.now = at;
            events += 1;
            self.handle(event);
        }
        Measured {
            end_ns,
            node_busy_ns: self.nodes.iter().map(|node| node.busy_ns).collect(),
            protocol_busy_ns: self.nodes.iter().map(|node| node.protocol_busy_ns).collect(),
            egress_busy_ns: self.nodes.iter().map(|node| node.egress_busy_ns).collect(),
            ingress_busy_ns: self.nodes.iter().map(|node| node.ingress_busy_ns).collect(),
            client_busy_ns: self.client_busy_ns,
            window_nodes_busy_ns: self.nodes_busy_ns() - busy_before_window.unwrap_or(0),
            events,
        }
    }

    fn nodes_busy_ns(&self) -> u64 {
        self.nodes.iter().map(|node| node.busy_ns).sum()
    }

    fn handle(&mut self, event: Event<P::Message>) {
        match event {
            Event::Issue(client) => self.issue(client),
            Event::ClientSent(outgoing) => {
                self.cores_free[0] += 1;
                self.deliver_request(outgoing);
                self.dispatch_machine(0);
            }
            Event::Arrive { node, work, bytes } => {
                self.note_wake(node, self.costs.wake_ns);
                self.nodes[node.index()].receive.push_back((work, bytes));
                self.dispatch(node);
            }
            Event::ReceiveDone { node, work } => {
                self.release(node);
                self.nodes[node.index()].handle.push_back(work);
                self.dispatch(node);
            }
            Event::HandleDone { node, outputs } => {
                self.release(node);
                let state = &mut self.nodes[node.index()];
                state.protocol_busy = false;
                state.send.push_back(outputs);
                self.dispatch(node);
            }
            Event::SendDone { node, outputs } => {
                self.release(node);
                self.transmit(node, outputs);
                self.dispatch(node);
            }
            Event::Reply { request, outcome } => self.reply(request, outcome),
            Event::Tick(node) => {
                self.note_wake(node, self.costs.timer_wake_ns);
                self.nodes[node.index()].handle.push_back(Work::Tick);
                self.dispatch(node);
                self.schedule(self.now + self.tick_ns, Event::Tick(node));
            }
        }
    }

    /// Work reaches `node`: if it had nothing to do, its thread sleeps and must be woken.
    fn note_wake(&mut self, node: NodeId, wake_ns: Nanos) {
        let state = &mut self.nodes[node.index()];
        let idle = state.threads_free == state.threads
            && state.receive.is_empty()
            && state.handle.is_empty()
            && state.send.is_empty();
        if idle {
            state.wake_owed_ns = wake_ns;
        }
    }

    fn issue(&mut self, client: u32) {
        let Some((command, next)) = self.clients.command(client, self.now) else { return };
        if let Some(next) = next {
            self.schedule(next.max(self.now), Event::Issue(client));
        }
        let request = ClientRequestId(self.next_request);
        self.next_request += 1;
        self.pending.insert(request, (client, self.now));
        let node = self.client_node[client as usize];
        let outgoing = Outgoing { request, command, node };
        if self.shared_host {
            // The load generator shares the host: encoding, writing and later reading the
            // reply cost it `client_op_ns` of a core before the request leaves.
            self.outgoing.push_back(outgoing);
            self.dispatch_machine(0);
        } else {
            self.deliver_request(outgoing);
        }
    }

    fn deliver_request(&mut self, outgoing: Outgoing) {
        let Outgoing { request, command, node } = outgoing;
        let bytes = resp_request_bytes(&command);
        // The client's own NIC is never the bottleneck: the request crosses the switch and
        // queues for the node's ingress.
        let at = self.ingress(node, self.now + self.network.latency_ns, bytes);
        self.schedule(at, Event::Arrive { node, work: Work::Client { request, command }, bytes });
    }

    fn reply(&mut self, request: ClientRequestId, outcome: Outcome) {
        let Some((client, invoked)) = self.pending.remove(&request) else { return };
        if let Some(next) = self.clients.completed(client, invoked, self.now, &outcome) {
            self.schedule(next.max(self.now), Event::Issue(client));
        }
    }

    /// A stage of `node` ended: its thread and its machine's core are free again; whoever
    /// else shares that machine may start.
    fn release(&mut self, node: NodeId) {
        let state = &mut self.nodes[node.index()];
        state.threads_free += 1;
        self.cores_free[state.machine] += 1;
        if self.shared_host {
            self.dispatch_machine(0);
        }
    }

    /// Start whatever the node's free threads and its machine's free cores can take.
    fn dispatch(&mut self, node: NodeId) {
        while self.start_one(node) {}
    }

    /// Start work on a shared machine until its cores are busy or nothing waits: the nodes
    /// and the load generator take turns, one stage each, so none starves the others.
    fn dispatch_machine(&mut self, machine: usize) {
        loop {
            let mut started = self.start_client_send(machine);
            for node in 0..self.nodes.len() {
                if self.nodes[node].machine == machine {
                    started |= self.start_one(NodeId(node as u8));
                }
            }
            if !started {
                return;
            }
        }
    }

    fn start_client_send(&mut self, machine: usize) -> bool {
        if !self.shared_host || machine != 0 || self.cores_free[0] == 0 {
            return false;
        }
        let Some(outgoing) = self.outgoing.pop_front() else { return false };
        self.cores_free[0] -= 1;
        let cost = self.costs.client_op_ns;
        self.client_busy_ns += cost;
        self.schedule(self.now + cost, Event::ClientSent(outgoing));
        true
    }

    /// Start one stage of `node`, if a thread and a core are free and work waits. Order: see
    /// [`Node::receive_first`]; sends before receives (they free memory and unblock peers).
    fn start_one(&mut self, node: NodeId) -> bool {
        let state = &self.nodes[node.index()];
        if state.threads_free == 0 || self.cores_free[state.machine] == 0 {
            return false;
        }
        let can_handle = !state.protocol_busy && !state.handle.is_empty();
        let can_receive = !state.receive.is_empty();
        if can_handle && !(state.receive_first && (can_receive || !state.send.is_empty())) {
            self.start_turn(node);
        } else if let Some(outputs) = self.nodes[node.index()].send.pop_front() {
            let cost = self.occupy(node, self.send_cost(&outputs));
            self.schedule(self.now + cost, Event::SendDone { node, outputs });
        } else if let Some((work, bytes)) = self.nodes[node.index()].receive.pop_front() {
            let cost = self.occupy(node, self.receive_cost(&work, bytes));
            self.schedule(self.now + cost, Event::ReceiveDone { node, work });
        } else {
            return false;
        }
        true
    }

    /// Take a thread of `node` and a core of its machine for a stage of `cost`; returns how
    /// long the stage runs (with the wake-up the node owes, if any).
    fn occupy(&mut self, node: NodeId, cost: Nanos) -> Nanos {
        let state = &mut self.nodes[node.index()];
        state.threads_free -= 1;
        self.cores_free[state.machine] -= 1;
        let wake = std::mem::take(&mut state.wake_owed_ns);
        state.busy_ns += cost + wake;
        cost + wake
    }

    fn receive_cost(&self, work: &Work<P::Message>, bytes: u64) -> Nanos {
        let per_event = match work {
            Work::Client { .. } => self.costs.client_request_ns,
            Work::Messages { .. } => self.costs.message_received_ns,
            Work::Tick => return 0,
        };
        per_event + self.costs.bytes_ns(bytes)
    }

    fn send_cost(&self, outputs: &Outputs<P::Message>) -> Nanos {
        let frames = outputs
            .frames
            .iter()
            .map(|(_, _, bytes)| self.costs.message_sent_ns + self.costs.bytes_ns(*bytes));
        let replies = outputs
            .replies
            .iter()
            .map(|(_, _, bytes)| self.costs.reply_sent_ns + self.costs.bytes_ns(*bytes));
        frames.sum::<Nanos>() + replies.sum::<Nanos>()
    }

    /// The protocol thread takes a turn: every event waiting (up to the server's bound), the
    /// core's handlers run now, and their outputs leave when the turn's time is up.
    fn start_turn(&mut self, node: NodeId) {
        let now = Time::from_nanos(self.now);
        let taken = self.nodes[node.index()].handle.len().min(EVENTS_PER_TURN_MAX);
        let turn: Vec<Work<P::Message>> = self.nodes[node.index()].handle.drain(..taken).collect();
        let replica = &mut self.replicas[node.index()];
        let mut cost = 0;
        for work in turn {
            match work {
                Work::Client { request, command } => {
                    cost += self.costs.handle_ns + self.costs.key_op_ns;
                    replica.on_client(now, request, command, &mut self.outbox);
                }
                Work::Messages { from, messages } => {
                    for message in messages {
                        cost += self.costs.handle_ns;
                        replica.on_message(now, from, message, &mut self.outbox);
                    }
                }
                Work::Tick => {
                    cost += self.costs.tick_ns;
                    replica.on_tick(now, &mut self.outbox);
                }
            }
        }
        // The server makes a turn durable once, before its messages and replies leave.
        if replica.write_durable() {
            cost += self.costs.sync_ns;
        }
        replica.sync_durable();
        let outputs = self.take_outputs();
        self.nodes[node.index()].protocol_busy = true;
        let cost = self.occupy(node, cost);
        self.nodes[node.index()].protocol_busy_ns += cost;
        self.schedule(self.now + cost, Event::HandleDone { node, outputs });
    }

    /// Drain the outbox into one frame per destination node (the model sends no multicast),
    /// with each frame's size on the wire.
    fn take_outputs(&mut self) -> Outputs<P::Message> {
        let mut frames: Vec<(NodeId, Vec<P::Message>, u64)> = Vec::new();
        for (destination, message) in self.outbox.messages.drain(..) {
            self.buffer.clear();
            message.encode(&mut self.buffer);
            let bytes = self.buffer.len() as u64;
            for to in destination.nodes().iter() {
                match frames.iter_mut().find(|(node, _, _)| *node == to) {
                    Some((_, messages, size)) => {
                        messages.push(message.clone());
                        *size += bytes;
                    }
                    None => frames.push((to, vec![message.clone()], frame_header_bytes() + bytes)),
                }
            }
        }
        let replies = self.outbox.replies.drain(..).map(|(request, outcome)| {
            let bytes = resp_reply_bytes(&outcome);
            (request, outcome, bytes)
        });
        Outputs { frames, replies: replies.collect() }
    }

    /// Hand a stage's outputs to the NICs.
    fn transmit(&mut self, node: NodeId, outputs: Outputs<P::Message>) {
        for (to, messages, bytes) in outputs.frames {
            let on_switch = self.egress(node, bytes) + self.network.latency_ns;
            let at = self.ingress(to, on_switch, bytes);
            let work = Work::Messages { from: node, messages };
            self.schedule(at, Event::Arrive { node: to, work, bytes });
        }
        for (request, outcome, bytes) in outputs.replies {
            let at = self.egress(node, bytes) + self.network.latency_ns;
            self.schedule(at, Event::Reply { request, outcome });
        }
    }

    /// Queue `bytes` for `node`'s egress NIC now; returns when the last bit has left.
    fn egress(&mut self, node: NodeId, bytes: u64) -> Nanos {
        let wire = self.network.wire_ns(bytes);
        let state = &mut self.nodes[node.index()];
        let done = state.egress_free_at.max(self.now) + wire;
        state.egress_free_at = done;
        state.egress_busy_ns += wire;
        done
    }

    /// `bytes` reach `node`'s ingress NIC at `at`; returns when it has received them. Queued
    /// in the order the sends happen, which is close to arrival order (every hop has the
    /// same latency).
    fn ingress(&mut self, node: NodeId, at: Nanos, bytes: u64) -> Nanos {
        let wire = self.network.wire_ns(bytes);
        let state = &mut self.nodes[node.index()];
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
        Outcome::Value(Some(value)) => (1 + decimal_digits(value.len()) + 2 + value.len() + 2) as u64,
        _ => 5, // `+OK\r\n`, `$-1\r\n`, `:1\r\n`-sized
    }
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
