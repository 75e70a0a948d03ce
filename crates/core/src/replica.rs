//! The sans-I/O replica interface (the etcd-io/raft `step`/`Ready` shape).
//!
//! A protocol core owns no sockets, threads, clocks or randomness. The runtime calls one of the
//! `on_*` methods with the current time, and the core appends what must happen to an
//! [`Outbox`]: messages to peers and replies to clients. The same core runs unchanged in the
//! deterministic simulator and in the TCP server.

use crate::command::{Command, Outcome};
use crate::ids::{NodeId, NodeSet, View};
use crate::time::Time;

/// Identifies one client request inside one replica, chosen by the runtime. The core hands it
/// back with the reply; the runtime maps it to a connection (or a simulated client).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct ClientRequestId(pub u64);

/// Where a message goes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Destination {
    Node(NodeId),
    /// One message to every node of the set. Kept as one entry so the transport encodes the
    /// message once (Hermes §4.2: Wings broadcasts).
    Nodes(NodeSet),
}

impl Destination {
    pub fn nodes(self) -> NodeSet {
        match self {
            Destination::Node(node) => NodeSet::single(node),
            Destination::Nodes(set) => set,
        }
    }
}

/// Everything a core wants done after one call. The runtime drains it after every call.
#[derive(Debug)]
pub struct Outbox<M> {
    pub messages: Vec<(Destination, M)>,
    pub replies: Vec<(ClientRequestId, Outcome)>,
}

impl<M> Default for Outbox<M> {
    fn default() -> Self {
        Outbox { messages: Vec::new(), replies: Vec::new() }
    }
}

impl<M> Outbox<M> {
    pub fn send(&mut self, to: NodeId, message: M) {
        self.messages.push((Destination::Node(to), message));
    }

    /// Send to every node in `to`; a no-op for the empty set.
    pub fn broadcast(&mut self, to: NodeSet, message: M) {
        if !to.is_empty() {
            self.messages.push((Destination::Nodes(to), message));
        }
    }

    pub fn reply(&mut self, request: ClientRequestId, outcome: Outcome) {
        self.replies.push((request, outcome));
    }

    pub fn is_empty(&self) -> bool {
        self.messages.is_empty() && self.replies.is_empty()
    }

    pub fn clear(&mut self) {
        self.messages.clear();
        self.replies.clear();
    }
}

/// A replication protocol core. One instance per replica (per shard).
pub trait Replica {
    /// The protocol's peer message.
    type Message: Clone + std::fmt::Debug;

    fn id(&self) -> NodeId;

    /// A client submitted `command`. The core eventually replies to `request` exactly once,
    /// unless the replica crashes.
    fn on_client(
        &mut self,
        now: Time,
        request: ClientRequestId,
        command: Command,
        out: &mut Outbox<Self::Message>,
    );

    /// A peer message arrived. Messages may be lost, duplicated, delayed and reordered.
    fn on_message(
        &mut self,
        now: Time,
        from: NodeId,
        message: Self::Message,
        out: &mut Outbox<Self::Message>,
    );

    /// Time passed. Called periodically; drives retransmissions and replays.
    fn on_tick(&mut self, now: Time, out: &mut Outbox<Self::Message>);

    /// The membership service installed a new view (epoch + live set).
    fn on_view(&mut self, now: Time, view: View, out: &mut Outbox<Self::Message>);

    /// The runtime's event-loop turn ended: every message and request of the turn was handed
    /// in. A protocol that does its work once per turn (raftlog with `flush_at_turn_end`, as
    /// the server runs it) does it here; the default does nothing.
    fn end_turn(&mut self, _now: Time, _out: &mut Outbox<Self::Message>) {}

    /// The membership service renewed (or still withholds) this replica's lease: it may serve
    /// local reads only while `now < valid_until`. `None` means no lease has been granted
    /// yet. Runtimes without a membership service never call this; a protocol then behaves
    /// as if its lease never expired. The default ignores leases: protocols whose reads
    /// depend on them must override it.
    fn on_lease(&mut self, _now: Time, _valid_until: Option<Time>, _out: &mut Outbox<Self::Message>) {}

    /// Whether this replica holds all the data (Hermes §3.4 Recovery: a shadow replica does
    /// not until it has copied every chunk). The membership service never leaves a view
    /// without such a replica. Protocols without shadow replicas always do.
    fn is_caught_up(&self) -> bool {
        true
    }

    /// Whether `message` is control traffic (membership heartbeats, leases, its Raft) rather
    /// than the protocol's own. The simulator's mid-broadcast crashes cut the protocol's
    /// broadcasts, not a heartbeat that happens to leave first.
    fn is_control(_message: &Self::Message) -> bool {
        false
    }

    /// The view this replica acts in, if it has one: the simulator counts view changes and
    /// which of them removed a node that was still alive.
    fn installed_view(&self) -> Option<View> {
        None
    }

    /// Write the durable state this call produced, without making it stable yet. The
    /// simulator calls it, then [`Replica::sync_durable`], before it performs the call's
    /// outbox, so a crash can strike between the two with the writes not synced (the server
    /// persists through its own path, in the same order). Returns whether anything was written
    /// (only then can a crash before the sync tear something). Cores without durable state
    /// ignore both.
    fn write_durable(&mut self) -> bool {
        false
    }

    /// Make what [`Replica::write_durable`] wrote stable: the call's messages and replies may
    /// leave only after this, except those [`Replica::leaves_before_sync`] lets go first.
    fn sync_durable(&mut self) {}

    /// A sync that takes time starts (the simulator's model of the server's sync thread): it
    /// covers what [`Replica::write_durable`] wrote so far, and the [`Replica::sync_durable`]
    /// that ends it, then [`Replica::on_synced`], must not claim more, though more may be
    /// written meanwhile. The default remembers nothing: its sync covers whatever is written.
    fn sync_started(&mut self) {}

    /// What the last [`Replica::sync_durable`] synced is stable: a core that waits to hear so
    /// before it counts on its own records (raftlog: a leader's entries toward a commit,
    /// raft-rs's asynchronous persistence) does what that allows now. A runtime calls it,
    /// as a call of its own, after every sync that synced something ([`Replica::sync_due`]
    /// was true). The default does nothing.
    fn on_synced(&mut self, _now: Time, _out: &mut Outbox<Self::Message>) {}

    /// Whether `message`, produced by the call now being made durable, may leave before that
    /// call's records are synced (the runtime sends it first, so the sync overlaps its
    /// journey). Only a message that depends on nothing the call made durable, or whose
    /// receiver's use of it is safe even if this node then loses the call's records, may:
    /// a Raft leader's appends are the case (Raft thesis §10.2.1). The default sends nothing
    /// early.
    fn leaves_before_sync(&self, _message: &Self::Message) -> bool {
        false
    }

    /// Whether the next [`Replica::sync_durable`] will sync (a write can be left written but
    /// unsynced for a later turn, as raftlog's commit-only turns are). The performance model
    /// charges a sync only then. By default a core syncs whatever it wrote.
    fn sync_due(&self) -> bool {
        true
    }

    /// Whether the replies of a call may leave before that call's records are synced: none
    /// of them depends on what the call wrote (a Raft group of several voters answers only
    /// entries a majority already holds stable). The default waits.
    fn replies_before_sync(&self) -> bool {
        false
    }

    /// Named event counters (replays, RMW aborts, snapshots, ...), for the simulator's
    /// coverage report: a sweep asserts minimums so a swarm that stops exercising a path
    /// fails loudly. Names are `protocol.event`.
    fn event_counts(&self, _report: &mut dyn FnMut(&'static str, u64)) {}
}
