//! Scripted scenarios for the CRAQ core: the corner cases of chain replication with
//! apportioned queries (CRAQ §2.3, the Hermes paper §2.5), message by message, with a manual
//! network and a manual clock.

use bytes::Bytes;
use chorus_core::{
    ClientRequestId, Command, CommandError, Epoch, NodeId, NodeSet, Outbox, Outcome, Replica, RmwOp, Time,
    View,
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
                // Donors split their keys into small chunks: a copy takes several round trips.
                config.chunk_bytes_target = 64;
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
        self.install_live(epoch);
    }

    /// Install the view of every node not crashed, at `epoch`, on each of them.
    fn install_live(&mut self, epoch: u64) {
        let live: NodeSet =
            (0..self.nodes.len() as u8).filter(|i| !self.crashed[*i as usize]).map(NodeId).collect();
        for i in live.iter() {
            let mut out = Outbox::default();
            self.nodes[i.index()].on_view(self.now, View { epoch: Epoch(epoch), live }, &mut out);
            self.collect(i.0, out);
        }
    }

    /// `node` comes back empty (a restart loses the keys) and the membership adds it in
    /// `epoch` (Hermes §3.4 Recovery): it joins the chain at its id's place and copies.
    fn restart_and_join(&mut self, node: u8, epoch: u64) {
        self.net.retain(|envelope| envelope.from != node && envelope.to != node);
        let all: NodeSet = (0..self.nodes.len() as u8).map(NodeId).collect();
        let mut config = CraqConfig::new(NodeId(node), all);
        config.retransmit_timeout = TIMEOUT;
        config.recovering = true;
        // Small chunks: a copy takes several round trips.
        config.chunk_bytes_target = 64;
        self.nodes[node as usize] = Craq::new(config);
        self.crashed[node as usize] = false;
        self.install_live(epoch);
    }

    /// Deliver, and tick past every retransmission and chunk-request timeout, for a while.
    fn settle_with_ticks(&mut self) {
        for _ in 0..20 {
            self.settle();
            self.tick(TIMEOUT);
        }
        self.settle();
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

// ---------------------------------------------------------------- joining (Hermes §3.4 Recovery)

fn is_chunk(e: &Envelope) -> bool {
    matches!(e.msg, Message::Chunk { .. })
}

fn value(cluster: &Cluster, node: u8, key: &str) -> Option<Bytes> {
    cluster.nodes[node as usize].key_state(key.as_bytes()).and_then(|(_, value, _)| value.cloned())
}

/// A restarted middle replica is linked back in at once: it copies its predecessor's state in
/// chunks while writes keep passing through it, refuses clients until done, then serves the
/// latest values. Chain replication's rule: the predecessor's state covers everything
/// downstream, so versions it sends after a chunk land on top of the copy.
#[test]
fn a_restarted_middle_replica_copies_its_predecessor_in_chunks_while_writes_flow_then_serves() {
    let mut cluster = Cluster::new(3);
    for i in 0..20 {
        cluster.client(0, set(&format!("k{i}"), "old"));
    }
    cluster.settle();
    cluster.crash_and_install(1, 2);
    for i in 0..5 {
        cluster.client(2, set(&format!("k{i}"), "while-down"));
    }
    cluster.settle_with_ticks();
    cluster.restart_and_join(1, 3);
    assert!(!cluster.nodes[1].is_caught_up() && cluster.nodes[1].is_joining());
    let refused = cluster.client(1, get("k0"));
    let joining =
        Outcome::Error(CommandError::Unavailable("joining: copying the data from a chain neighbour"));
    assert_eq!(cluster.reply(refused), Some(&joining));
    // The first chunk, then writes through the joiner before the rest of the copy.
    cluster.deliver(|e| matches!(e.msg, Message::ChunkRequest { .. }) && e.to == 0);
    cluster.deliver(is_chunk);
    let during: Vec<ClientRequestId> =
        (0..20).map(|i| cluster.client(2, set(&format!("k{i}"), "during"))).collect();
    cluster.settle_with_ticks();
    assert!(cluster.nodes[1].is_caught_up() && cluster.nodes[1].is_operational());
    let stats = cluster.nodes[1].stats();
    assert!(stats.chunks_received > 2, "copied in several chunks: {stats:?}");
    assert_eq!(stats.recoveries_completed, 1);
    for request in during {
        assert_eq!(cluster.reply(request), Some(&Outcome::Written), "no write stalls for good");
    }
    for i in 0..20 {
        let key = format!("k{i}");
        for node in 0..3 {
            assert_eq!(value(&cluster, node, &key), Some(b("during")), "{key} at n{node}");
        }
        let read = cluster.client(1, get(&key));
        assert_eq!(cluster.reply(read), Some(&Outcome::Value(Some(b("during")))), "{key} read at n1");
    }
}

/// Until a key's chunk arrives, a joiner drops its versions (the predecessor re-sends them),
/// so no chunk ever lands under a newer version; and a chunk that comes again later (a
/// duplicate, or a late answer) never takes a key backwards.
#[test]
fn a_late_copy_of_a_chunk_never_takes_a_key_backwards() {
    let mut cluster = Cluster::new(2);
    cluster.client(0, set("k", "v1"));
    cluster.settle();
    cluster.restart_and_join(1, 2);
    cluster.deliver(|e| matches!(e.msg, Message::ChunkRequest { .. }));
    let chunk = cluster.net.iter().find(|e| is_chunk(e)).cloned().expect("a chunk in flight");
    let write = cluster.client(0, set("k", "v2"));
    cluster.settle_with_ticks();
    assert_eq!(cluster.reply(write), Some(&Outcome::Written));
    assert!(cluster.nodes[1].is_caught_up());
    cluster.net.push(chunk);
    cluster.settle();
    assert_eq!(cluster.nodes[1].key_state(b"k"), Some((2, Some(&b("v2")), 0)), "still the newer version");
    let read = cluster.client(1, get("k"));
    assert_eq!(cluster.reply(read), Some(&Outcome::Value(Some(b("v2")))));
}

/// A tail restarted before anyone noticed (the join view keeps the live set, only the epoch
/// moves): its old incarnation committed a version whose ACK never reached the predecessor.
/// The new tail copies it, still dirty, from the predecessor and commits it, so the write is
/// answered and a read at the predecessor sees it.
#[test]
fn a_tail_restarted_in_place_commits_what_its_predecessor_still_holds_dirty() {
    let mut cluster = Cluster::new(3);
    let write = cluster.client(0, set("k", "v"));
    cluster.deliver(|e| is_write(e) && e.to == 1);
    cluster.deliver(|e| is_write(e) && e.to == 2);
    assert_eq!(cluster.drop_matching(is_ack), 1, "the old tail's ACK is lost with it");
    cluster.restart_and_join(2, 2);
    cluster.settle_with_ticks();
    assert!(cluster.nodes[2].is_caught_up());
    assert_eq!(cluster.reply(write), Some(&Outcome::Written));
    assert_eq!(cluster.nodes[2].key_state(b"k"), Some((1, Some(&b("v")), 0)));
    let read = cluster.client(1, get("k"));
    assert_eq!(cluster.reply(read), Some(&Outcome::Value(Some(b("v")))));
}

/// A joining head has no predecessor: it copies from the first successor that is not itself
/// joining (a joining successor answers `ChunkRefused` and holds nothing yet). The joining
/// successor waits for its predecessor, the head, to finish, then copies from it.
#[test]
fn a_joining_head_skips_a_joining_successor_and_both_catch_up() {
    let mut cluster = Cluster::new(3);
    for i in 0..10 {
        cluster.client(2, set(&format!("k{i}"), "v"));
    }
    cluster.settle();
    cluster.crash_and_install(0, 2);
    cluster.crash_and_install(1, 3);
    let last = cluster.client(2, set("k0", "latest"));
    cluster.settle_with_ticks();
    assert_eq!(cluster.reply(last), Some(&Outcome::Written));
    // n1 comes back first; n0 comes back before n1 has copied anything.
    cluster.restart_and_join(1, 4);
    cluster.net.retain(|e| !matches!(e.msg, Message::ChunkRequest { .. }));
    cluster.restart_and_join(0, 5);
    cluster.settle_with_ticks();
    let (head, second) = (cluster.nodes[0].stats(), cluster.nodes[1].stats());
    assert!(head.chunks_received > 0 && second.chunks_received > 0, "{head:?}\n{second:?}");
    assert!(cluster.nodes[1].stats().chunks_refused > 0, "n1 refused the joining head");
    for node in 0..3 {
        assert!(cluster.nodes[node as usize].is_operational(), "n{node}");
        assert_eq!(value(&cluster, node, "k0"), Some(b("latest")), "k0 at n{node}");
        assert_eq!(value(&cluster, node, "k9"), Some(b("v")), "k9 at n{node}");
    }
    // The rejoined head orders new writes on top of the copied versions.
    let write = cluster.client(1, Command::Rmw { key: b("n"), op: RmwOp::IncrementBy(2) });
    let overwrite = cluster.client(2, set("k0", "after"));
    cluster.settle_with_ticks();
    assert_eq!(cluster.reply(write), Some(&Outcome::Integer(2)));
    assert_eq!(cluster.reply(overwrite), Some(&Outcome::Written));
    assert_eq!(cluster.nodes[2].key_state(b"k0"), Some((3, Some(&b("after")), 0)));
}

impl Cluster {
    /// `node` restarts from what it had on disk: a new core with every key's state restored
    /// (the runtime logs them before any message of the turn leaves), in the same view.
    fn restart_from_disk(&mut self, node: u8, seq_floor: u64) {
        let old = &self.nodes[node as usize];
        let saved: Vec<_> = old.written_keys().iter().filter_map(|key| old.export_key(key)).collect();
        self.net.retain(|envelope| envelope.from != node && envelope.to != node);
        let all: NodeSet = (0..self.nodes.len() as u8).map(NodeId).collect();
        let mut config = CraqConfig::new(NodeId(node), all);
        config.retransmit_timeout = TIMEOUT;
        let mut craq = Craq::new(config);
        craq.restore(saved, seq_floor);
        self.nodes[node as usize] = craq;
    }
}

#[test]
fn a_whole_chain_restarted_from_disk_commits_the_versions_it_held_dirty() {
    let mut cluster = Cluster::new(3);
    let first = cluster.client(0, set("k", "v1"));
    cluster.settle();
    assert_eq!(cluster.reply(first), Some(&Outcome::Written));
    // v2 reaches the middle replica, not the tail; then every node loses power.
    cluster.client(0, set("k", "v2"));
    cluster.deliver(|e| is_write(e) && e.to == 1);
    cluster.net.clear();
    for node in 0..3 {
        cluster.restart_from_disk(node, 1 << 20);
    }
    assert_eq!(cluster.nodes[1].key_state(b"k"), Some((1, Some(&b("v1")), 1)), "restored dirty");
    cluster.settle_with_ticks();
    for node in 0..3 {
        assert_eq!(cluster.nodes[node].key_state(b"k"), Some((2, Some(&b("v2")), 0)), "node {node}");
    }
}

#[test]
fn a_node_restarted_from_disk_numbers_its_updates_above_the_ones_its_peers_remember() {
    let mut cluster = Cluster::new(3);
    let first = cluster.client(1, Command::Rmw { key: b("n"), op: RmwOp::IncrementBy(1) });
    cluster.settle();
    assert_eq!(cluster.reply(first), Some(&Outcome::Integer(1)));
    // The origin restarts before anyone noticed: the head still remembers its update 0.
    cluster.restart_from_disk(1, 1 << 20);
    let second = cluster.client(1, Command::Rmw { key: b("n"), op: RmwOp::IncrementBy(1) });
    cluster.settle_with_ticks();
    assert_eq!(cluster.reply(second), Some(&Outcome::Integer(2)), "not taken for a duplicate of update 0");
    for node in 0..3 {
        assert_eq!(cluster.nodes[node].key_state(b"n"), Some((2, Some(&b("2")), 0)), "node {node}");
    }
}

/// The head restarts from its disk holding a version its successor never received (the
/// Write was lost with the crash), before anyone noticed. The origin still has the update
/// outstanding and forwards it again: the restarted head must take it for the duplicate it
/// is, not order it a second time (seed 310 of the craq `--appendonly` swarm: a GETSET
/// executed twice erased an INCRBY ordered after its first copy; seed 429: an INCRBY
/// applied twice).
#[test]
fn a_head_restarted_from_disk_does_not_execute_a_retransmitted_forward_again() {
    let mut cluster = Cluster::new(3);
    let increment = cluster.client(2, Command::Rmw { key: b("n"), op: RmwOp::IncrementBy(1) });
    cluster.deliver(|e| matches!(e.msg, Message::Forward { .. }) && e.to == 0);
    assert_eq!(cluster.nodes[0].key_state(b"n"), Some((0, None, 1)), "ordered, dirty at the head");
    cluster.restart_from_disk(0, 1 << 20); // The head's Write to n1 is lost with it.
    cluster.tick(TIMEOUT);
    // The origin's retransmitted forward reaches the restarted head first.
    cluster.deliver(|e| matches!(e.msg, Message::Forward { .. }) && e.to == 0);
    assert_eq!(cluster.nodes[0].key_state(b"n"), Some((0, None, 1)), "not ordered a second time");
    cluster.settle_with_ticks();
    assert_eq!(cluster.reply(increment), Some(&Outcome::Integer(1)));
    for node in 0..3 {
        assert_eq!(cluster.nodes[node].key_state(b"n"), Some((1, Some(&b("1")), 0)), "node {node}");
    }
}
