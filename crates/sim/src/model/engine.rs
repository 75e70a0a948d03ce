//! The model's event loop: the real protocol cores under virtual time, with every event
//! costing CPU time on its node and every message costing NIC time on its links.
//!
//! A node is what the server is (crates/server/src/engine.rs): ONE protocol thread owns the
//! core and handles one event at a time, while receiving, parsing, encoding and sending run on
//! any of the node's `cores`. Each event therefore goes through three stages, each waiting for
//! a free core:
//!
//! 1. receive (any core): `client_request_ns` or `message_received_ns`, plus its bytes;
//! 2. handle (the protocol thread, which also holds a core): the core's handler runs at the
//!    stage's start, charged `handle_ns`, `key_op_ns` for a client command, `sync_ns` if the
//!    turn wrote durable state;
//! 3. send (any core): `message_sent_ns` plus bytes per message and per reply.
//!
//! Then each message queues for its node's egress NIC, crosses the switch (`latency_ns`), and
//! queues for the receiver's ingress NIC. Ticks skip stage 1. No faults: the correctness
//! swarms are the simulator's job (crate::simulator), and this loop leaves them untouched.

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
    Client { request: ClientRequestId, command: Command },
    Message { from: NodeId, message: M },
    Tick,
}

/// What one handled event produced, with its encoded sizes.
struct Outputs<M> {
    messages: Vec<(NodeId, M, u64)>,
    replies: Vec<(ClientRequestId, Outcome, u64)>,
}

enum Event<M> {
    /// A client's next request leaves its machine.
    Issue(u32),
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
    cores_free: u32,
    protocol_busy: bool,
    /// Work waiting for a core to receive it, with its size on the wire.
    receive: VecDeque<(Work<M>, u64)>,
    handle: VecDeque<Work<M>>,
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
    pub events: u64,
}

pub(super) struct Engine<'a, P: Replica, C: Clients> {
    replicas: Vec<P>,
    nodes: Vec<Node<P::Message>>,
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
        cores: u32,
        costs: CostTable,
        network: Network,
        tick_ns: Nanos,
        clients: &'a mut C,
        client_node: Vec<NodeId>,
    ) -> Self {
        assert!(cores >= 1, "a node needs a core");
        let nodes = (0..replicas.len())
            .map(|_| Node {
                cores_free: cores,
                protocol_busy: false,
                receive: VecDeque::new(),
                handle: VecDeque::new(),
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

    /// Run until `end_ns` of virtual time.
    pub(super) fn run(mut self, end_ns: Nanos) -> Measured {
        for node in 0..self.replicas.len() {
            // Ticks of different nodes fall at different instants, as real clocks' do.
            let offset = self.tick_ns * node as u64 / self.replicas.len() as u64;
            self.schedule(offset, Event::Tick(NodeId(node as u8)));
        }
        for (at, client) in self.clients.initial() {
            self.schedule(at, Event::Issue(client));
        }
        let mut events = 0;
        while let Some(((at, _), event)) = self.queue.pop_first() {
            if at > end_ns {
                break;
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
            events,
        }
    }

    fn handle(&mut self, event: Event<P::Message>) {
        match event {
            Event::Issue(client) => self.issue(client),
            Event::Arrive { node, work, bytes } => {
                self.nodes[node.index()].receive.push_back((work, bytes));
                self.dispatch(node);
            }
            Event::ReceiveDone { node, work } => {
                self.nodes[node.index()].cores_free += 1;
                self.nodes[node.index()].handle.push_back(work);
                self.dispatch(node);
            }
            Event::HandleDone { node, outputs } => {
                let state = &mut self.nodes[node.index()];
                state.cores_free += 1;
                state.protocol_busy = false;
                state.send.push_back(outputs);
                self.dispatch(node);
            }
            Event::SendDone { node, outputs } => {
                self.nodes[node.index()].cores_free += 1;
                self.transmit(node, outputs);
                self.dispatch(node);
            }
            Event::Reply { request, outcome } => self.reply(request, outcome),
            Event::Tick(node) => {
                self.nodes[node.index()].handle.push_back(Work::Tick);
                self.dispatch(node);
                self.schedule(self.now + self.tick_ns, Event::Tick(node));
            }
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

    /// Start whatever work the node's free cores can take: the protocol thread first (it is
    /// the serial part), then sends (they free memory and unblock peers), then receives.
    fn dispatch(&mut self, node: NodeId) {
        loop {
            let state = &mut self.nodes[node.index()];
            if state.cores_free == 0 {
                return;
            }
            if !state.protocol_busy && !state.handle.is_empty() {
                let work = state.handle.pop_front().expect("not empty");
                self.start_handle(node, work);
            } else if let Some(outputs) = state.send.pop_front() {
                let cost = self.send_cost(&outputs);
                self.occupy_core(node, cost);
                self.schedule(self.now + cost, Event::SendDone { node, outputs });
            } else if let Some((work, bytes)) = state.receive.pop_front() {
                let cost = self.receive_cost(&work, bytes);
                self.occupy_core(node, cost);
                self.schedule(self.now + cost, Event::ReceiveDone { node, work });
            } else {
                return;
            }
        }
    }

    fn occupy_core(&mut self, node: NodeId, cost: Nanos) {
        let state = &mut self.nodes[node.index()];
        state.cores_free -= 1;
        state.busy_ns += cost;
    }

    fn receive_cost(&self, work: &Work<P::Message>, bytes: u64) -> Nanos {
        let per_event = match work {
            Work::Client { .. } => self.costs.client_request_ns,
            Work::Message { .. } => self.costs.message_received_ns,
            Work::Tick => return 0,
        };
        per_event + self.costs.bytes_ns(bytes)
    }

    fn send_cost(&self, outputs: &Outputs<P::Message>) -> Nanos {
        let items = outputs.messages.iter().map(|(_, _, bytes)| *bytes);
        let replies = outputs.replies.iter().map(|(_, _, bytes)| *bytes);
        items.chain(replies).map(|bytes| self.costs.message_sent_ns + self.costs.bytes_ns(bytes)).sum()
    }

    /// The protocol thread takes `work`: the core's handler runs now; its outputs leave when
    /// the stage's time is up.
    fn start_handle(&mut self, node: NodeId, work: Work<P::Message>) {
        let now = Time::from_nanos(self.now);
        let replica = &mut self.replicas[node.index()];
        let mut cost = self.costs.handle_ns;
        match work {
            Work::Client { request, command } => {
                cost += self.costs.key_op_ns;
                replica.on_client(now, request, command, &mut self.outbox);
            }
            Work::Message { from, message } => replica.on_message(now, from, message, &mut self.outbox),
            Work::Tick => replica.on_tick(now, &mut self.outbox),
        }
        if replica.write_durable() {
            cost += self.costs.sync_ns;
        }
        replica.sync_durable();
        let outputs = self.take_outputs();
        let state = &mut self.nodes[node.index()];
        state.protocol_busy = true;
        state.protocol_busy_ns += cost;
        self.occupy_core(node, cost);
        self.schedule(self.now + cost, Event::HandleDone { node, outputs });
    }

    /// Drain the outbox, one entry per destination node (the model sends no multicast), with
    /// each entry's size on the wire.
    fn take_outputs(&mut self) -> Outputs<P::Message> {
        let mut messages = Vec::new();
        for (destination, message) in self.outbox.messages.drain(..) {
            self.buffer.clear();
            message.encode(&mut self.buffer);
            let bytes = framed_bytes(self.buffer.len());
            for to in destination.nodes().iter() {
                messages.push((to, message.clone(), bytes));
            }
        }
        let replies = self.outbox.replies.drain(..).map(|(request, outcome)| {
            let bytes = resp_reply_bytes(&outcome);
            (request, outcome, bytes)
        });
        Outputs { messages, replies: replies.collect() }
    }

    /// Hand a stage's outputs to the NICs.
    fn transmit(&mut self, node: NodeId, outputs: Outputs<P::Message>) {
        for (to, message, bytes) in outputs.messages {
            let on_switch = self.egress(node, bytes) + self.network.latency_ns;
            let at = self.ingress(to, on_switch, bytes);
            self.schedule(at, Event::Arrive { node: to, work: Work::Message { from: node, message }, bytes });
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

/// One message framed on its own: the frame header and a batch count of one.
fn framed_bytes(encoded: usize) -> u64 {
    (FRAME_HEADER_BYTES + 4 + encoded) as u64
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
