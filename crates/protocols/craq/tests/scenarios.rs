//! Scripted scenarios for the CRAQ core: the corner cases of chain replication with
//! apportioned queries (CRAQ §2.3, the Hermes paper §2.5), message by message, with a manual
//! network and a manual clock.

use bytes::Bytes;
use chorus_core::{
    ClientRequestId, Command, Epoch, NodeId, NodeSet, Outbox, Outcome, Replica, RmwOp, Time, View,
};
use chorus_craq::{Craq, CraqConfig, Message};

const TIMEOUT: Time = Time::from_millis(50);

#[derive(Clone, Debug)]
struct Envelope {
    from: u8,
    to: u8,
    msg: Message,
}

struct Cluster {
    nodes: Vec<Craq>,
    crashed: Vec<bool>,
    net: Vec<Envelope>,
    replies: Vec<(ClientRequestId, Outcome)>,
    now: Time,
    next_request: u64,
}

fn b(text: &str) -> Bytes {
    Bytes::copy_from_slice(text.as_bytes())
}

impl Cluster {
    fn new(n: u8) -> Cluster {
        let all: NodeSet = (0..n).map(NodeId).collect();
        let nodes = (0..n)
            .map(|i| {
                let mut config = CraqConfig::new(NodeId(i), all);
                config.retransmit_timeout = TIMEOUT;
                Craq::new(config)
            })
            .collect();
        Cluster {
            nodes,
            crashed: vec![false; n as usize],
            net: Vec::new(),
            replies: Vec::new(),
            now: Time::from_millis(1),
            next_request: 0,
        }
    }

    fn collect(&mut self, from: u8, out: Outbox<Message>) {
        for (destination, msg) in out.messages {
            for to in destination.nodes().iter() {
                self.net.push(Envelope { from, to: to.0, msg: msg.clone() });
            }
        }
        self.replies.extend(out.replies);
    }

    fn client(&mut self, node: u8, command: Command) -> ClientRequestId {
        let request = ClientRequestId(self.next_request);
        self.next_request += 1;
        let mut out = Outbox::default();
        self.nodes[node as usize].on_client(self.now, request, command, &mut out);
        self.collect(node, out);
        request
    }

    fn reply(&self, request: ClientRequestId) -> Option<&Outcome> {
        self.replies.iter().find(|(id, _)| *id == request).map(|(_, outcome)| outcome)
    }

    /// Deliver the first message in flight matching `filter`; panics if there is none.
    fn deliver(&mut self, filter: impl Fn(&Envelope) -> bool) {
        let index =
            self.net.iter().position(&filter).unwrap_or_else(|| panic!("no such message in {:#?}", self.net));
        let envelope = self.net.remove(index);
        if self.crashed[envelope.to as usize] {
            return;
        }
        let mut out = Outbox::default();
        self.nodes[envelope.to as usize].on_message(self.now, NodeId(envelope.from), envelope.msg, &mut out);
        self.collect(envelope.to, out);
    }

    /// Deliver everything until the network is empty.
    fn settle(&mut self) {
        let mut steps = 0;
        while !self.net.is_empty() {
            self.deliver(|_| true);
            steps += 1;
            assert!(steps < 10_000, "the network never settles");
        }
    }

    fn drop_matching(&mut self, filter: impl Fn(&Envelope) -> bool) -> usize {
        let before = self.net.len();
        self.net.retain(|envelope| !filter(envelope));
        before - self.net.len()
    }

    fn tick(&mut self, advance: Time) {
        self.now = self.now + advance;
        for i in 0..self.nodes.len() {
            if !self.crashed[i] {
                let mut out = Outbox::default();
                self.nodes[i].on_tick(self.now, &mut out);
                self.collect(i as u8, out);
            }
        }
    }

    fn crash_and_install(&mut self, node: u8, epoch: u64) {
        self.crashed[node as usize] = true;
        self.net.retain(|envelope| envelope.from != node && envelope.to != node);
        let live: NodeSet =
            (0..self.nodes.len() as u8).filter(|i| !self.crashed[*i as usize]).map(NodeId).collect();
        for i in live.iter() {
            let mut out = Outbox::default();
            self.nodes[i.index()].on_view(self.now, View { epoch: Epoch(epoch), live }, &mut out);
            self.collect(i.0, out);
        }
    }
}

fn is_write(e: &Envelope) -> bool {
    matches!(e.msg, Message::Write { .. })
}
fn is_ack(e: &Envelope) -> bool {
    matches!(e.msg, Message::Ack { .. })
}

fn set(key: &str, value: &str) -> Command {
    Command::Write { key: b(key), value: Some(b(value)) }
}
fn get(key: &str) -> Command {
    Command::Read { key: b(key) }
}

#[test]
fn a_write_travels_head_to_tail_and_its_ack_cleans_the_chain() {
    let mut cluster = Cluster::new(3);
    // Entering at the middle replica, the write goes to the head first.
    let write = cluster.client(1, set("k", "v1"));
    cluster.deliver(|e| matches!(e.msg, Message::Forward { .. }) && e.to == 0);
    cluster.deliver(|e| is_write(e) && e.from == 0 && e.to == 1);
    assert_eq!(cluster.nodes[0].key_state(b"k"), Some((0, None, 1)), "dirty at the head");
    assert_eq!(cluster.nodes[1].key_state(b"k"), Some((0, None, 1)), "dirty in the middle");
    cluster.deliver(|e| is_write(e) && e.from == 1 && e.to == 2);
    assert_eq!(cluster.nodes[2].key_state(b"k"), Some((1, Some(&b("v1")), 0)), "the tail commits at once");
    assert!(cluster.reply(write).is_none(), "the origin answers only once the ACK reaches it");
    cluster.deliver(|e| is_ack(e) && e.to == 1);
    assert_eq!(cluster.reply(write), Some(&Outcome::Written));
    cluster.deliver(|e| is_ack(e) && e.to == 0);
    assert_eq!(cluster.nodes[0].key_state(b"k"), Some((1, Some(&b("v1")), 0)));
    assert!(cluster.net.is_empty());
}

#[test]
fn a_dirty_read_asks_the_tail_and_answers_with_the_committed_version() {
    let mut cluster = Cluster::new(3);
    let first = cluster.client(0, set("k", "old"));
    cluster.settle();
    assert_eq!(cluster.reply(first), Some(&Outcome::Written));
    // A second write reaches the middle replica but not the tail.
    cluster.client(0, set("k", "new"));
    cluster.deliver(|e| is_write(e) && e.to == 1);
    let read = cluster.client(1, get("k"));
    assert!(cluster.reply(read).is_none(), "dirty: not answered locally");
    cluster.deliver(|e| matches!(e.msg, Message::VersionQuery { .. }) && e.to == 2);
    cluster.deliver(|e| matches!(e.msg, Message::VersionReply { .. }));
    assert_eq!(
        cluster.reply(read),
        Some(&Outcome::Value(Some(b("old")))),
        "the tail had not committed 'new'"
    );
    // A clean replica answers locally, at once.
    let at_tail = cluster.client(2, get("k"));
    assert_eq!(cluster.reply(at_tail), Some(&Outcome::Value(Some(b("old")))));
}

#[test]
fn a_lost_write_is_resent_and_a_duplicate_is_applied_once() {
    let mut cluster = Cluster::new(3);
    let write = cluster.client(0, Command::Rmw { key: b("n"), op: RmwOp::IncrementBy(5) });
    assert_eq!(cluster.drop_matching(is_write), 1);
    cluster.tick(TIMEOUT);
    let resent = cluster.net.iter().filter(|e| is_write(e)).count();
    assert_eq!(resent, 1, "the head re-sends its dirty version after the timeout");
    let duplicate = cluster.net[0].clone();
    cluster.net.push(duplicate);
    cluster.settle();
    assert_eq!(cluster.reply(write), Some(&Outcome::Integer(5)));
    for node in 0..3 {
        assert_eq!(cluster.nodes[node].key_state(b"n"), Some((1, Some(&b("5")), 0)), "node {node}");
    }
}

#[test]
fn versions_out_of_order_wait_for_the_gap() {
    let mut cluster = Cluster::new(2);
    cluster.client(0, set("k", "a"));
    cluster.client(0, set("k", "b"));
    // Version 2 arrives first: the tail must not commit it without version 1.
    let second = cluster.net.iter().rposition(is_write).unwrap();
    let envelope = cluster.net.remove(second);
    cluster.net.insert(0, envelope);
    cluster.deliver(is_write);
    assert_eq!(cluster.nodes[1].key_state(b"k"), Some((0, None, 0)), "version 2 alone is dropped");
    cluster.settle();
    cluster.tick(TIMEOUT);
    cluster.settle();
    assert_eq!(cluster.nodes[1].key_state(b"k"), Some((2, Some(&b("b")), 0)));
}

#[test]
fn rmws_execute_at_the_head_on_its_latest_dirty_version() {
    let mut cluster = Cluster::new(3);
    let first = cluster.client(1, Command::Rmw { key: b("n"), op: RmwOp::IncrementBy(1) });
    let second = cluster.client(2, Command::Rmw { key: b("n"), op: RmwOp::IncrementBy(10) });
    cluster.deliver(|e| matches!(e.msg, Message::Forward { .. }) && e.from == 1);
    cluster.deliver(|e| matches!(e.msg, Message::Forward { .. }) && e.from == 2);
    assert_eq!(cluster.nodes[0].key_state(b"n"), Some((0, None, 2)), "two dirty versions at the head");
    cluster.settle();
    assert_eq!(cluster.reply(first), Some(&Outcome::Integer(1)));
    assert_eq!(cluster.reply(second), Some(&Outcome::Integer(11)));
}

#[test]
fn when_the_tail_crashes_the_new_tail_commits_what_it_holds() {
    let mut cluster = Cluster::new(3);
    let write = cluster.client(0, set("k", "v"));
    cluster.deliver(|e| is_write(e) && e.to == 1);
    // The old tail never sees it; it crashes and the view removes it.
    cluster.crash_and_install(2, 2);
    assert_eq!(cluster.nodes[1].key_state(b"k"), Some((1, Some(&b("v")), 0)), "n1 is the tail: committed");
    cluster.settle();
    assert_eq!(cluster.reply(write), Some(&Outcome::Written));
    assert_eq!(cluster.nodes[0].key_state(b"k"), Some((1, Some(&b("v")), 0)));
}

#[test]
fn when_the_head_crashes_a_forward_it_never_passed_on_is_executed_once_by_the_new_head() {
    let mut cluster = Cluster::new(3);
    let write = cluster.client(2, Command::Rmw { key: b("n"), op: RmwOp::IncrementBy(7) });
    cluster.deliver(|e| matches!(e.msg, Message::Forward { .. }));
    assert_eq!(cluster.drop_matching(is_write), 1, "the head's version is lost with it");
    cluster.crash_and_install(0, 2);
    cluster.settle();
    assert_eq!(cluster.reply(write), Some(&Outcome::Integer(7)));
    // The origin's retransmission after the timeout must not execute it again.
    cluster.tick(TIMEOUT);
    cluster.settle();
    assert_eq!(cluster.nodes[2].key_state(b"n"), Some((1, Some(&b("7")), 0)));
}

#[test]
fn a_forward_the_new_head_already_holds_is_not_executed_twice() {
    let mut cluster = Cluster::new(3);
    let write = cluster.client(2, Command::Rmw { key: b("n"), op: RmwOp::IncrementBy(3) });
    cluster.deliver(|e| matches!(e.msg, Message::Forward { .. }));
    cluster.deliver(|e| is_write(e) && e.to == 1);
    // n1 holds the version; n0 crashes before anything else moves.
    cluster.crash_and_install(0, 2);
    cluster.settle();
    cluster.tick(TIMEOUT);
    cluster.settle();
    assert_eq!(cluster.reply(write), Some(&Outcome::Integer(3)));
    assert_eq!(cluster.nodes[1].key_state(b"n"), Some((1, Some(&b("3")), 0)), "one version, not two");
}

#[test]
fn messages_of_another_epoch_are_dropped() {
    let mut cluster = Cluster::new(3);
    cluster.client(0, set("k", "v"));
    let stale = cluster.net.remove(0);
    cluster.crash_and_install(2, 2);
    let mut out = Outbox::default();
    cluster.nodes[1].on_message(cluster.now, NodeId(stale.from), stale.msg, &mut out);
    assert!(out.is_empty());
    assert_eq!(cluster.nodes[1].stats().messages_dropped_epoch, 1);
}
