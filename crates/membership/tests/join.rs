//! Joining, scripted (Hermes §3.4 Recovery): a replica restarts with its Raft records but no
//! data, is added back as a shadow, takes part in writes while it copies the data in
//! chunks, then serves; and the cluster survives losing another replica afterwards. The
//! network is deterministic and in memory; any message kind can be held back.

use std::collections::HashMap;

use bytes::Bytes;
use chorus_core::{ClientRequestId, Command, NodeId, NodeSet, Outbox, Outcome, Replica, Time};
use chorus_hermes::{Bug, Hermes, HermesConfig, Message};
use chorus_membership::{Membership, MembershipConfig, Wire, WithMembership};

type Node = WithMembership<Hermes>;

const LINK_DELAY: Time = Time::from_micros(300);
const STEP: Time = Time::from_millis(1);

struct Cluster {
    nodes: Vec<Option<Node>>,
    members: NodeSet,
    now: Time,
    in_flight: Vec<(Time, NodeId, NodeId, Wire<Message>)>,
    /// Chunks to this node wait here until released.
    hold_chunks_to: Option<NodeId>,
    held: Vec<(NodeId, NodeId, Wire<Message>)>,
    replies: HashMap<ClientRequestId, Outcome>,
    next_request: u64,
    chunk_bytes_target: usize,
    bug: Option<Bug>,
}

impl Cluster {
    fn new(size: u8, chunk_bytes_target: usize) -> Cluster {
        let members: NodeSet = (0..size).map(NodeId).collect();
        let mut cluster = Cluster {
            nodes: Vec::new(),
            members,
            now: Time::ZERO,
            in_flight: Vec::new(),
            hold_chunks_to: None,
            held: Vec::new(),
            replies: HashMap::new(),
            next_request: 0,
            chunk_bytes_target,
            bug: None,
        };
        cluster.nodes = (0..size).map(|n| Some(cluster.build(NodeId(n), None))).collect();
        cluster
    }

    /// A first member, or (with `restart_from`) a restarted one: Raft records kept, data lost.
    fn build(&self, me: NodeId, restart_from: Option<&Node>) -> Node {
        let mut hermes = HermesConfig::new(me, self.members);
        hermes.message_loss_timeout = Time::from_millis(20);
        hermes.chunk_bytes_target = self.chunk_bytes_target;
        let mut membership = MembershipConfig::new(me, self.members);
        membership.rejoin = true;
        let records = match restart_from {
            None => Vec::new(),
            Some(crashed) => {
                hermes.recovering = true;
                hermes.bug = self.bug;
                membership.join = Some(0xC0FFEE + self.now.as_nanos());
                crashed.membership().durable_records()
            }
        };
        WithMembership::new(Hermes::new(hermes), Membership::restore(membership, self.now, &records))
    }

    fn crash(&mut self, node: u8) -> Node {
        self.nodes[node as usize].take().expect("node was up")
    }

    fn restart(&mut self, node: u8, crashed: &Node) {
        self.nodes[node as usize] = Some(self.build(NodeId(node), Some(crashed)));
    }

    fn node(&self, node: u8) -> &Node {
        self.nodes[node as usize].as_ref().expect("node is up")
    }

    fn perform(&mut self, from: NodeId, out: &mut Outbox<Wire<Message>>) {
        for (destination, message) in out.messages.drain(..) {
            for to in destination.nodes().iter() {
                self.in_flight.push((self.now + LINK_DELAY, from, to, message.clone()));
            }
        }
        for (request, outcome) in out.replies.drain(..) {
            self.replies.insert(request, outcome);
        }
    }

    fn run_for(&mut self, duration: Time) {
        let end = self.now + duration;
        let mut out = Outbox::default();
        while self.now < end {
            self.now = self.now + STEP;
            let (due, later): (Vec<_>, Vec<_>) = self.in_flight.drain(..).partition(|m| m.0 <= self.now);
            self.in_flight = later;
            for (_, from, to, message) in due {
                let is_chunk = matches!(message, Wire::Protocol(Message::Chunk { .. }));
                if is_chunk && self.hold_chunks_to == Some(to) {
                    self.held.push((from, to, message));
                    continue;
                }
                let now = self.now;
                let Some(node) = self.nodes[to.index()].as_mut() else { continue };
                node.on_message(now, from, message, &mut out);
                self.perform(to, &mut out);
            }
            for n in 0..self.nodes.len() {
                let now = self.now;
                let Some(node) = self.nodes[n].as_mut() else { continue };
                node.on_tick(now, &mut out);
                self.perform(NodeId(n as u8), &mut out);
            }
        }
    }

    fn release_held(&mut self) {
        self.hold_chunks_to = None;
        for (from, to, message) in std::mem::take(&mut self.held) {
            self.in_flight.push((self.now, from, to, message));
        }
    }

    fn submit(&mut self, node: u8, command: Command) -> ClientRequestId {
        self.next_request += 1;
        let request = ClientRequestId(self.next_request);
        let mut out = Outbox::default();
        let now = self.now;
        self.nodes[node as usize].as_mut().expect("node is up").on_client(now, request, command, &mut out);
        self.perform(NodeId(node), &mut out);
        request
    }

    /// Run until `request` is answered (at most 5 s).
    fn wait(&mut self, request: ClientRequestId) -> Outcome {
        for _ in 0..5_000 {
            if let Some(outcome) = self.replies.remove(&request) {
                return outcome;
            }
            self.run_for(STEP);
        }
        panic!("request {request:?} not answered within 5 s");
    }

    fn write(&mut self, node: u8, key: &str, value: &str) {
        let command = Command::Write { key: key_bytes(key), value: Some(Bytes::from(value.to_string())) };
        let request = self.submit(node, command);
        assert_eq!(self.wait(request), Outcome::Written, "write {key}={value} at n{node}");
    }

    fn read(&mut self, node: u8, key: &str) -> Option<String> {
        let request = self.submit(node, Command::Read { key: key_bytes(key) });
        match self.wait(request) {
            Outcome::Value(value) => value.map(|bytes| String::from_utf8(bytes.to_vec()).unwrap()),
            other => panic!("read {key} at n{node}: {other:?}"),
        }
    }

    /// Run until `node` serves clients again (at most 5 s); returns how long that took.
    fn until_operational(&mut self, node: u8) -> Time {
        let start = self.now;
        for _ in 0..5_000 {
            if self.node(node).protocol().is_operational()
                && self.node(node).membership().holds_lease(self.now)
            {
                return self.now.saturating_sub(start);
            }
            self.run_for(STEP);
        }
        panic!("n{node} did not become operational within 5 s");
    }
}

fn key_bytes(key: &str) -> Bytes {
    Bytes::from(key.to_string())
}

#[test]
fn a_restarted_replica_copies_the_data_as_a_shadow_serves_and_the_cluster_survives_another_failure() {
    let mut cluster = Cluster::new(3, 256);
    cluster.run_for(Time::from_millis(1_000));
    for i in 0..200 {
        cluster.write((i % 3) as u8, &format!("k{i}"), &format!("old{i}"));
    }
    let crashed = cluster.crash(2);
    cluster.run_for(Time::from_millis(2_000));
    assert!(!cluster.node(0).protocol().view().live.contains(NodeId(2)), "n2 removed");
    for i in 0..20 {
        cluster.write(1, &format!("k{i}"), &format!("while-down{i}"));
    }

    cluster.restart(2, &crashed);
    // Writes keep completing while n2 joins and copies: they need its ACK once it is a shadow.
    let mut was_shadow = false;
    for i in 20..60 {
        cluster.write((i % 2) as u8, &format!("k{i}"), &format!("during-copy{i}"));
        was_shadow |= cluster.node(2).protocol().is_shadow();
    }
    cluster.until_operational(2);
    let stats = cluster.node(2).protocol().stats();
    assert!(was_shadow, "writes ran while n2 was a shadow");
    assert!(stats.chunks_received > 3, "copied in several chunks: {stats:?}");
    assert_eq!(stats.recoveries_completed, 1);
    assert!(cluster.node(2).protocol().view().live.contains(NodeId(2)));

    for i in 0..200 {
        let expected = match i {
            0..20 => format!("while-down{i}"),
            20..60 => format!("during-copy{i}"),
            _ => format!("old{i}"),
        };
        assert_eq!(cluster.read(2, &format!("k{i}")).as_deref(), Some(expected.as_str()), "k{i} at n2");
    }

    // The rejoined replica is a full member: losing n0 leaves {n1, n2} serving.
    cluster.crash(0);
    cluster.run_for(Time::from_millis(2_000));
    let view = cluster.node(2).protocol().view();
    assert_eq!(view.live, [NodeId(1), NodeId(2)].into_iter().collect::<NodeSet>());
    cluster.write(2, "k0", "after-n0");
    assert_eq!(cluster.read(1, "k0").as_deref(), Some("after-n0"));
    assert_eq!(cluster.read(2, "k150").as_deref(), Some("old150"));
}

/// A write that reaches the shadow (as an INV) after the donor cut its chunk, but before
/// the chunk arrives, must survive the copy.
fn write_overtaking_a_chunk(bug: Option<Bug>) -> Option<String> {
    let mut cluster = Cluster::new(3, usize::MAX);
    cluster.bug = bug;
    cluster.run_for(Time::from_millis(1_000));
    cluster.write(0, "k", "old");
    let crashed = cluster.crash(2);
    cluster.run_for(Time::from_millis(2_000));
    cluster.hold_chunks_to = Some(NodeId(2));
    cluster.restart(2, &crashed);
    for _ in 0..3_000 {
        if !cluster.held.is_empty() {
            break;
        }
        cluster.run_for(STEP);
    }
    assert!(!cluster.held.is_empty(), "n2 asked for its chunk");
    cluster.write(1, "k", "new");
    cluster.release_held();
    cluster.until_operational(2);
    cluster.read(2, "k")
}

#[test]
fn a_write_that_overtakes_the_copy_wins_over_the_copied_value() {
    assert_eq!(write_overtaking_a_chunk(None).as_deref(), Some("new"));
    // The broken variant (copy overwrites whatever it finds) serves the stale value.
    assert_eq!(write_overtaking_a_chunk(Some(Bug::ChunkOverwritesNewer)).as_deref(), Some("old"));
}
