//! Scripted scenarios for the Hermes core (Katsarou et al., ASPLOS 2020, §3).
//!
//! Every test drives a small cluster step by step through a manual network and a manual clock,
//! so it can reproduce one exact interleaving of the paper (deliver this INV, drop that VAL,
//! crash that node) and check the key states and client replies after each step.

use bytes::Bytes;
use chorus_core::{
    ClientRequestId, Command, CommandError, Epoch, NodeId, NodeSet, Outbox, Outcome, Replica, RmwOp, Time,
    Timestamp, Value, View,
};
use chorus_hermes::{Hermes, HermesConfig, KeyState, Message};
use KeyState::{Invalid, Replay, Trans, Valid, Write};

// ================================================================ harness

/// The message-loss timeout (mlt, §3.4) every replica of a test cluster uses.
const MLT: Time = Time::from_millis(50);
/// One nanosecond: `t + MLT - NS` is the last instant before a timeout fires.
const NS: Time = Time::from_nanos(1);
/// Wildcard node for message filters.
const ANY: u8 = u8::MAX;

/// A message in flight from one replica to another.
#[derive(Clone, Debug)]
struct Envelope {
    from: u8,
    to: u8,
    msg: Message,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Inv,
    Ack,
    Val,
    /// State transfer to a shadow (§3.4 Recovery); these scenarios have no joins.
    Chunk,
}

impl Envelope {
    fn kind(&self) -> Kind {
        match self.msg {
            Message::Inv { .. } => Kind::Inv,
            Message::Ack { .. } => Kind::Ack,
            Message::Val { .. } => Kind::Val,
            Message::ChunkRequest { .. } | Message::Chunk { .. } => Kind::Chunk,
        }
    }

    fn ts(&self) -> Timestamp {
        match self.msg {
            Message::Inv { ts, .. } | Message::Ack { ts, .. } | Message::Val { ts, .. } => ts,
            Message::ChunkRequest { .. } | Message::Chunk { .. } => Timestamp::ZERO,
        }
    }
}

/// Matches messages of `kind` from `from` to `to` (either may be [`ANY`]).
fn msg(kind: Kind, from: u8, to: u8) -> impl Fn(&Envelope) -> bool {
    move |e| e.kind() == kind && (from == ANY || e.from == from) && (to == ANY || e.to == to)
}
fn inv(from: u8, to: u8) -> impl Fn(&Envelope) -> bool {
    msg(Kind::Inv, from, to)
}
fn ack(from: u8, to: u8) -> impl Fn(&Envelope) -> bool {
    msg(Kind::Ack, from, to)
}
fn val(from: u8, to: u8) -> impl Fn(&Envelope) -> bool {
    msg(Kind::Val, from, to)
}
fn all(_: &Envelope) -> bool {
    true
}

/// N Hermes replicas (ids 0..N) over a network the test controls message by message.
struct Cluster {
    nodes: Vec<Hermes>,
    crashed: Vec<bool>,
    /// Messages sent and not yet delivered or dropped, in send order.
    net: Vec<Envelope>,
    replies: Vec<(ClientRequestId, Outcome)>,
    now: Time,
    next_request: u64,
}

impl Cluster {
    fn new(n: u8) -> Cluster {
        Cluster::with(n, |_| {})
    }

    /// A cluster whose replicas' configs are adjusted by `tweak` (optimizations, bugs).
    fn with(n: u8, tweak: impl Fn(&mut HermesConfig)) -> Cluster {
        let everyone: NodeSet = (0..n).map(NodeId).collect();
        let nodes = (0..n)
            .map(|id| {
                let mut config = HermesConfig::new(NodeId(id), everyone);
                config.message_loss_timeout = MLT;
                tweak(&mut config);
                Hermes::new(config)
            })
            .collect();
        let crashed = vec![false; n as usize];
        Cluster { nodes, crashed, net: Vec::new(), replies: Vec::new(), now: Time::ZERO, next_request: 0 }
    }

    /// Queue what `node` sent (one envelope per destination) and record its replies.
    fn collect(&mut self, node: u8, out: Outbox<Message>) {
        for (dest, msg) in out.messages {
            for to in dest.nodes().iter() {
                assert_ne!(to.0, node, "a replica sent a message to itself");
                self.net.push(Envelope { from: node, to: to.0, msg: msg.clone() });
            }
        }
        for (id, outcome) in out.replies {
            assert!(self.reply_of(id).is_none(), "{id:?} answered twice");
            self.replies.push((id, outcome));
        }
    }

    fn client(&mut self, node: u8, command: Command) -> ClientRequestId {
        self.next_request += 1;
        let id = ClientRequestId(self.next_request);
        let mut out = Outbox::default();
        self.nodes[node as usize].on_client(self.now, id, command, &mut out);
        self.collect(node, out);
        id
    }

    fn reply_of(&self, id: ClientRequestId) -> Option<Outcome> {
        self.replies.iter().find(|(r, _)| *r == id).map(|(_, outcome)| outcome.clone())
    }

    /// The key's state, timestamp and value at `node`; a key the node never saw is in its
    /// initial state (Valid, [0,0], absent), as in §3.5.
    fn state(&self, node: u8, key: &str) -> (KeyState, Timestamp, Option<Value>) {
        match self.nodes[node as usize].key_state(key.as_bytes()) {
            Some((state, ts, value)) => (state, ts, value.cloned()),
            None => (Valid, Timestamp::ZERO, None),
        }
    }

    fn receive(&mut self, e: Envelope) {
        if self.crashed[e.to as usize] {
            return;
        }
        let mut out = Outbox::default();
        self.nodes[e.to as usize].on_message(self.now, NodeId(e.from), e.msg, &mut out);
        self.collect(e.to, out);
    }

    /// Deliver the queued messages matching `filter`, in send order. Messages sent in reaction
    /// are queued, not delivered. Returns how many were delivered.
    fn deliver(&mut self, filter: impl Fn(&Envelope) -> bool) -> usize {
        let matching = self.take(filter);
        let count = matching.len();
        for e in matching {
            self.receive(e);
        }
        count
    }

    /// Deliver everything, including replies to replies, until the network is empty.
    fn deliver_all(&mut self) {
        for _ in 0..100 {
            if self.deliver(all) == 0 {
                return;
            }
        }
        panic!("the network never went quiet: {:?}", self.net);
    }

    /// Deliver everything one message at a time in a pseudo-random order fixed by `seed`.
    fn deliver_shuffled(&mut self, mut seed: u64) {
        for _ in 0..10_000 {
            if self.net.is_empty() {
                return;
            }
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let e = self.net.remove((seed >> 33) as usize % self.net.len());
            self.receive(e);
        }
        panic!("the network never went quiet");
    }

    /// Remove the matching messages from the network (lost, or held back for later `inject`).
    fn take(&mut self, filter: impl Fn(&Envelope) -> bool) -> Vec<Envelope> {
        let (matching, rest) = std::mem::take(&mut self.net).into_iter().partition(|e| filter(e));
        self.net = rest;
        matching
    }

    fn drop(&mut self, filter: impl Fn(&Envelope) -> bool) -> usize {
        self.take(filter).len()
    }

    /// Put a (held back, duplicated or forged) message on the network.
    fn inject(&mut self, e: Envelope) {
        self.net.push(e);
    }

    /// The network duplicates the matching messages.
    fn duplicate(&mut self, filter: impl Fn(&Envelope) -> bool) {
        let copies: Vec<Envelope> = self.net.iter().filter(|e| filter(e)).cloned().collect();
        self.net.extend(copies);
    }

    fn pending(&self, filter: impl Fn(&Envelope) -> bool) -> Vec<&Envelope> {
        self.net.iter().filter(|e| filter(e)).collect()
    }

    fn tick(&mut self, node: u8, at: Time) {
        assert!(at >= self.now, "time goes forward");
        self.now = at;
        let mut out = Outbox::default();
        self.nodes[node as usize].on_tick(at, &mut out);
        self.collect(node, out);
    }

    /// Crash-stop: the node handles nothing more and everything to or from it is lost.
    fn crash(&mut self, node: u8) {
        self.crashed[node as usize] = true;
        self.net.retain(|e| e.from != node && e.to != node);
    }

    /// The m-update for view `epoch` with `live` reaches `node`.
    fn install_view(&mut self, node: u8, live: &[u8], epoch: u64) {
        let view = View { epoch: Epoch(epoch), live: live.iter().copied().map(NodeId).collect() };
        let mut out = Outbox::default();
        self.nodes[node as usize].on_view(self.now, view, &mut out);
        self.collect(node, out);
    }

    /// The membership service installs view `epoch` with `live` at every replica still running.
    fn view_change(&mut self, live: &[u8], epoch: u64) {
        for node in 0..self.nodes.len() as u8 {
            if !self.crashed[node as usize] {
                self.install_view(node, live, epoch);
            }
        }
    }
}

fn b(s: &str) -> Value {
    Bytes::copy_from_slice(s.as_bytes())
}
fn v(s: &str) -> Option<Value> {
    Some(b(s))
}
fn ts(version: u64, cid: u32) -> Timestamp {
    Timestamp::new(version, cid)
}
fn read(key: &str) -> Command {
    Command::Read { key: b(key) }
}
fn write(key: &str, value: &str) -> Command {
    Command::Write { key: b(key), value: v(value) }
}
fn rmw(key: &str, op: RmwOp) -> Command {
    Command::Rmw { key: b(key), op }
}
fn incr(key: &str) -> Command {
    rmw(key, RmwOp::IncrementBy(1))
}
fn value(s: &str) -> Option<Outcome> {
    Some(Outcome::Value(v(s)))
}
const WRITTEN: Option<Outcome> = Some(Outcome::Written);

// ================================================================ §3.2: reads and writes

#[test]
fn failure_free_write_goes_through_write_invalid_valid_and_follower_read_waits_for_val() {
    // §3.2 C TS, C INV: the coordinator bumps the version by 2 (a write, §3.6), applies the
    // value locally and goes to Write.
    let mut c = Cluster::new(3);
    let w = c.client(0, write("A", "1"));
    assert_eq!(c.state(0, "A"), (Write, ts(2, 0), v("1")));
    assert_eq!(c.pending(inv(0, ANY)).len(), 2);

    // F INV: followers take the timestamp and value and go Invalid.
    c.deliver(inv(0, ANY));
    assert_eq!(c.state(1, "A"), (Invalid, ts(2, 0), v("1")));
    assert_eq!(c.state(2, "A"), (Invalid, ts(2, 0), v("1")));

    // Reads are served only in Valid: this one stalls.
    let r = c.client(1, read("A"));
    assert_eq!(c.reply_of(r), None);

    // C ACK: ACKs from *all* live replicas are needed; one is not enough.
    c.deliver(ack(1, 0));
    assert_eq!(c.state(0, "A").0, Write);
    assert_eq!(c.reply_of(w), None);
    c.deliver(ack(2, 0));
    assert_eq!(c.state(0, "A"), (Valid, ts(2, 0), v("1")));
    assert_eq!(c.reply_of(w), WRITTEN);

    // C VAL / F VAL: the VAL validates followers and releases the stalled read.
    assert_eq!(c.pending(val(0, ANY)).len(), 2);
    c.deliver(val(0, 1));
    assert_eq!(c.state(1, "A"), (Valid, ts(2, 0), v("1")));
    assert_eq!(c.reply_of(r), value("1"));
    c.deliver(val(0, 2));
    assert_eq!(c.state(2, "A"), (Valid, ts(2, 0), v("1")));
    assert!(c.net.is_empty());
}

#[test]
fn read_of_valid_key_is_local_and_sends_nothing() {
    // §3.2 Reads: a Valid key is read locally, at any replica.
    let mut c = Cluster::new(3);
    c.client(0, write("A", "1"));
    c.deliver_all();
    for node in 0..3 {
        let r = c.client(node, read("A"));
        assert_eq!(c.reply_of(r), value("1"));
    }
    let never_written = c.client(2, read("B"));
    assert_eq!(c.reply_of(never_written), Some(Outcome::Value(None)));
    assert!(c.net.is_empty());
}

#[test]
fn read_at_coordinator_stalls_until_its_own_write_completes() {
    // §3.2: "If the key is in any other state [than Valid], the request is stalled", Write
    // included.
    let mut c = Cluster::new(3);
    c.client(0, write("A", "1"));
    let r = c.client(0, read("A"));
    assert_eq!(c.reply_of(r), None);
    c.deliver(inv(0, ANY));
    c.deliver(ack(ANY, 0));
    assert_eq!(c.reply_of(r), value("1"));
}

#[test]
fn write_at_invalid_key_stalls_then_replays_before_issuing() {
    // §3.2: "A coordinator node issues a write to a key only if it is in the Valid state;
    // otherwise the write is stalled." Node 1 lost node 0's VAL, so its write waits for an
    // mlt and a replay, then goes out with a timestamp above the replayed one.
    let mut c = Cluster::new(3);
    c.client(0, write("A", "1"));
    c.deliver(inv(0, ANY));
    c.deliver(ack(ANY, 0));
    c.drop(val(0, 1));
    c.deliver_all();
    let t = c.now;
    let w = c.client(1, write("A", "2"));
    assert_eq!(c.state(1, "A"), (Invalid, ts(2, 0), v("1")));
    assert!(c.net.is_empty());
    c.tick(1, t + MLT);
    assert_eq!(c.state(1, "A").0, Replay);
    c.deliver_all();
    assert_eq!(c.reply_of(w), WRITTEN);
    for node in 0..3 {
        assert_eq!(c.state(node, "A"), (Valid, ts(4, 1), v("2")));
    }
}

// ================================================================ §3.5: Figure 4

/// Figure 4 (§3.5) with the paper's nodes 1, 2, 3 as our 0, 1, 2: node 0 writes A=1 with [2,0]
/// and node 2 writes A=3 with [2,2] concurrently; every INV is delivered, node 1 seeing node 0's
/// first. Returns the two write requests.
fn figure4_invs(c: &mut Cluster) -> (ClientRequestId, ClientRequestId) {
    let w0 = c.client(0, write("A", "1"));
    let w2 = c.client(2, write("A", "3"));
    assert_eq!(c.state(0, "A"), (Write, ts(2, 0), v("1")));
    assert_eq!(c.state(2, "A"), (Write, ts(2, 2), v("3")));
    c.deliver(inv(0, 1));
    assert_eq!(c.state(1, "A"), (Invalid, ts(2, 0), v("1")));
    // Node 2 ACKs node 0's INV but keeps its own higher timestamp (same version, higher cid).
    c.deliver(inv(0, 2));
    assert_eq!(c.state(2, "A"), (Write, ts(2, 2), v("3")));
    assert_eq!(c.pending(ack(2, 0)).len(), 1);
    // Node 1 takes the higher timestamp, staying Invalid.
    c.deliver(inv(2, 1));
    assert_eq!(c.state(1, "A"), (Invalid, ts(2, 2), v("3")));
    // Node 0's own write is superseded: Trans.
    c.deliver(inv(2, 0));
    assert_eq!(c.state(0, "A"), (Trans, ts(2, 2), v("3")));
    (w0, w2)
}

#[test]
fn figure4_concurrent_writes_higher_cid_wins_and_superseded_coordinator_skips_val() {
    // §3.5, with O1 (§3.3) on, the default.
    let mut c = Cluster::new(3);
    let (w0, w2) = figure4_invs(&mut c);

    let r1 = c.client(1, read("A"));
    assert_eq!(c.reply_of(r1), None);

    // Node 2 gathers its ACKs, completes and broadcasts VAL.
    c.deliver(ack(ANY, 2));
    assert_eq!(c.state(2, "A"), (Valid, ts(2, 2), v("3")));
    assert_eq!(c.reply_of(w2), WRITTEN);
    assert_eq!(c.pending(val(2, ANY)).len(), 2);

    // Node 1's stalled read returns node 2's value.
    c.deliver(val(2, 1));
    assert_eq!(c.state(1, "A"), (Valid, ts(2, 2), v("3")));
    assert_eq!(c.reply_of(r1), value("3"));

    // Node 0 gets its ACKs: its write completes (linearized before node 2's), Trans -> Invalid
    // since node 2's VAL has not arrived yet, and the client is told Written.
    c.deliver(ack(ANY, 0));
    assert_eq!(c.state(0, "A"), (Invalid, ts(2, 2), v("3")));
    assert_eq!(c.reply_of(w0), WRITTEN);
    // O1: no VAL for a superseded write.
    assert!(c.pending(val(0, ANY)).is_empty());

    c.deliver(val(2, 0));
    assert_eq!(c.state(0, "A"), (Valid, ts(2, 2), v("3")));
    assert!(c.net.is_empty());
}

#[test]
fn write_committed_over_a_higher_timestamp_is_not_validated_anywhere() {
    // Chorus' strengthening of O1 (docs/protocols/hermes.md): node 0 writes [2,0] while node 2
    // holds the concurrent [2,2]. Node 2's ACK says "superseded", so node 0 commits its write
    // without sending VAL and without validating [2,0], and node 2 hands node 0 its newer INV.
    let mut c = Cluster::new(3);
    let w0 = c.client(0, write("A", "1"));
    let w2 = c.client(2, write("A", "3"));
    c.deliver(inv(2, 1));
    c.deliver(inv(0, ANY));
    c.deliver(ack(ANY, 0));
    assert_eq!(c.reply_of(w0), WRITTEN, "the write commits: every live replica acknowledged it");
    assert!(c.pending(val(0, ANY)).is_empty(), "a superseded timestamp is never validated");
    assert_ne!(c.state(0, "A").0, Valid);
    assert_eq!(c.pending(inv(2, 0)).len(), 2, "node 2's own INV and the newer state it hands back");
    c.deliver_all();
    assert_eq!(c.reply_of(w2), WRITTEN);
    for node in 0..3 {
        assert_eq!(c.state(node, "A"), (Valid, ts(2, 2), v("3")));
    }
}

#[test]
fn figure4_trans_coordinator_validated_by_winner_before_its_acks_still_replies() {
    // §3.2 footnote 7: Trans exists so the coordinator can tell its client when its own
    // write completes, even if the superseding write's VAL arrives first.
    let mut c = Cluster::new(3);
    let (w0, _) = figure4_invs(&mut c);
    c.deliver(ack(ANY, 2));
    c.deliver(val(2, 0));
    assert_eq!(c.state(0, "A"), (Valid, ts(2, 2), v("3")));
    assert_eq!(c.reply_of(w0), None);
    c.deliver(ack(ANY, 0));
    assert_eq!(c.reply_of(w0), WRITTEN);
    assert_eq!(c.state(0, "A"), (Valid, ts(2, 2), v("3")));
    assert!(c.pending(val(0, ANY)).is_empty());
}

#[test]
fn figure4_lost_val_and_crash_read_after_view_change_replays_winner_write() {
    // §3.5, last step: node 2's VAL to node 0 is lost and node 2 crashes. After the m-update
    // (epoch 2, live {0,1}) a read at node 0 finds A invalidated by a failed node and replays
    // node 2's write with node 2's original timestamp (cid 2) and value.
    let mut c = Cluster::new(3);
    let (w0, w2) = figure4_invs(&mut c);
    c.deliver(ack(ANY, 2));
    c.deliver(val(2, 1));
    c.deliver(ack(ANY, 0));
    assert_eq!((c.reply_of(w0), c.reply_of(w2)), (WRITTEN, WRITTEN));
    assert_eq!(c.drop(val(2, 0)), 1);
    c.crash(2);
    c.view_change(&[0, 1], 2);
    // Nothing is waiting on A, so the view change alone starts nothing.
    assert_eq!(c.state(0, "A"), (Invalid, ts(2, 2), v("3")));
    assert!(c.net.is_empty());

    let t = c.now;
    let r0 = c.client(0, read("A"));
    assert_eq!(c.reply_of(r0), None);
    c.tick(0, t + MLT - NS);
    assert!(c.net.is_empty());
    c.tick(0, t + MLT);
    assert_eq!(c.state(0, "A"), (Replay, ts(2, 2), v("3")));
    let replay = Message::Inv {
        epoch: Epoch(2),
        key: b("A"),
        ts: ts(2, 2),
        value: v("3"),
        rmw: false,
        superseded: false,
    };
    assert_eq!(c.net.len(), 1);
    assert_eq!((c.net[0].from, c.net[0].to, &c.net[0].msg), (0, 1, &replay));

    // Node 1 already holds [2,2]: it ACKs without applying anything.
    c.deliver(inv(0, 1));
    assert_eq!(c.state(1, "A"), (Valid, ts(2, 2), v("3")));
    c.deliver(ack(1, 0));
    assert_eq!(c.state(0, "A"), (Valid, ts(2, 2), v("3")));
    assert_eq!(c.reply_of(r0), value("3"));
    // The replay ends with a VAL to the live nodes only.
    assert_eq!(c.pending(val(0, 1)).len(), 1);
    assert_eq!(c.net.len(), 1);
}

#[test]
fn replay_waiting_for_crashed_node_completes_after_view_change() {
    // §3.2: a coordinator (here a replayer) waits for the ACK of a failed node until the
    // membership is updated; the view change then lets it finish with the live set only.
    let mut c = Cluster::new(3);
    figure4_invs(&mut c);
    c.deliver(ack(ANY, 2));
    c.deliver(val(2, 1));
    c.deliver(ack(ANY, 0));
    c.drop(val(2, 0));
    c.crash(2);

    let t = c.now;
    let r0 = c.client(0, read("A"));
    c.tick(0, t + MLT);
    assert_eq!(c.state(0, "A").0, Replay);
    c.deliver_all();
    // Node 1 ACKed, node 2 never will.
    assert_eq!(c.reply_of(r0), None);
    // The replay keeps retransmitting to node 2 (only), in vain.
    c.tick(0, t + MLT + MLT);
    let resent: Vec<u8> = c.pending(all).iter().map(|e| e.to).collect();
    assert_eq!(resent, vec![2]);
    c.deliver_all();
    assert_eq!(c.reply_of(r0), None);

    c.view_change(&[0, 1], 2);
    // The view change resets the replay's ACKs and re-sends the INV in the new epoch.
    let invs = c.pending(inv(0, 1));
    assert_eq!(invs.len(), 1);
    assert_eq!(invs[0].msg.epoch(), Epoch(2));
    c.deliver_all();
    assert_eq!(c.reply_of(r0), value("3"));
}

// ================================================================ §3.4: imperfect links

#[test]
fn lost_inv_is_retransmitted_after_mlt_only_to_the_missing_follower() {
    // §3.4: the coordinator suspects a lost INV/ACK once the write exceeds its mlt and
    // re-sends the INV; only the replica that has not ACKed needs it.
    let mut c = Cluster::new(3);
    let t = c.now;
    let w = c.client(0, write("A", "1"));
    assert_eq!(c.drop(inv(0, 2)), 1);
    c.deliver(inv(0, 1));
    c.deliver(ack(1, 0));
    assert_eq!(c.state(0, "A").0, Write);

    c.tick(0, t + MLT - NS);
    assert!(c.net.is_empty());
    c.tick(0, t + MLT);
    let resent = c.pending(all);
    assert_eq!(resent.len(), 1);
    assert_eq!((resent[0].kind(), resent[0].to, resent[0].ts()), (Kind::Inv, 2, ts(2, 0)));
    assert_eq!(c.nodes[0].stats().inv_retransmits, 1);

    c.deliver_all();
    assert_eq!(c.reply_of(w), WRITTEN);
    for node in 0..3 {
        assert_eq!(c.state(node, "A"), (Valid, ts(2, 0), v("1")));
    }
}

#[test]
fn lost_ack_is_recovered_by_retransmitting_the_inv() {
    // §3.4: a lost ACK looks the same as a lost INV to the coordinator; the follower ACKs the
    // retransmitted INV again.
    let mut c = Cluster::new(3);
    let t = c.now;
    let w = c.client(0, write("A", "1"));
    c.deliver(inv(0, ANY));
    c.drop(ack(2, 0));
    c.deliver_all();
    assert_eq!(c.reply_of(w), None);
    c.tick(0, t + MLT);
    assert_eq!(c.pending(all).len(), 1);
    c.deliver_all();
    assert_eq!(c.reply_of(w), WRITTEN);
    assert_eq!(c.state(2, "A"), (Valid, ts(2, 0), v("1")));
}

#[test]
fn lost_val_follower_with_stalled_read_replays_after_mlt() {
    // §3.4: the loss of a VAL is handled by the follower: a request that finds the key Invalid
    // for an mlt triggers a write replay (Replay state), after which the read is served.
    let mut c = Cluster::new(3);
    let w = c.client(0, write("A", "1"));
    c.deliver(inv(0, ANY));
    c.deliver(ack(ANY, 0));
    assert_eq!(c.reply_of(w), WRITTEN);
    assert_eq!(c.drop(val(0, 1)), 1);
    c.deliver_all();

    let t = c.now;
    let r = c.client(1, read("A"));
    c.tick(1, t + MLT - NS);
    assert!(c.net.is_empty());
    assert_eq!(c.reply_of(r), None);
    c.tick(1, t + MLT);
    assert_eq!(c.state(1, "A"), (Replay, ts(2, 0), v("1")));
    assert_eq!(c.pending(inv(1, ANY)).len(), 2);
    assert_eq!(c.nodes[1].stats().replays_started, 1);

    c.deliver_all();
    assert_eq!(c.reply_of(r), value("1"));
    for node in 0..3 {
        assert_eq!(c.state(node, "A"), (Valid, ts(2, 0), v("1")));
    }
}

#[test]
fn follower_replay_completes_coordinator_whose_acks_were_lost() {
    // §3.2 Write Replays: a replay re-executes C INV..C VAL with the original timestamp. When
    // the coordinator's ACKs are lost, a follower's replay may commit the write first; its
    // VAL then completes the coordinator's write, and the coordinator's client is answered.
    let mut c = Cluster::new(3);
    let t = c.now;
    let w = c.client(0, write("A", "1"));
    c.deliver(inv(0, ANY));
    c.drop(ack(ANY, 0));
    let r = c.client(1, read("A"));
    c.tick(1, t + MLT);
    assert_eq!(c.state(1, "A").0, Replay);
    c.deliver(inv(1, ANY));
    c.deliver(ack(ANY, 1));
    assert_eq!(c.reply_of(r), value("1"));
    assert_eq!(c.reply_of(w), None);
    c.deliver(val(1, 0));
    assert_eq!(c.state(0, "A"), (Valid, ts(2, 0), v("1")));
    assert_eq!(c.reply_of(w), WRITTEN);
}

#[test]
fn duplicate_inv_after_val_does_not_invalidate_and_its_ack_is_harmless() {
    // §3.4: timestamps make duplicates safe. A duplicated INV arriving after the VAL carries the
    // timestamp the follower already holds: no state change, just another ACK, which the
    // coordinator (with nothing in flight) ignores.
    let mut c = Cluster::new(3);
    let w = c.client(0, write("A", "1"));
    let late_copy = c.pending(inv(0, 2))[0].clone();
    c.deliver_all();
    assert_eq!(c.reply_of(w), WRITTEN);
    assert_eq!(c.state(2, "A"), (Valid, ts(2, 0), v("1")));

    c.inject(late_copy);
    c.deliver(inv(0, 2));
    assert_eq!(c.state(2, "A"), (Valid, ts(2, 0), v("1")));
    assert_eq!(c.pending(ack(2, 0)).len(), 1);
    c.deliver_all();
    assert_eq!(c.state(0, "A"), (Valid, ts(2, 0), v("1")));
    assert!(c.net.is_empty());
}

#[test]
fn duplicate_ack_from_one_follower_does_not_stand_in_for_another() {
    // §3.2 C ACK: the coordinator needs an ACK from *every* live replica; a duplicate ACK from
    // node 1 must not complete the write while node 2 has not acknowledged.
    let mut c = Cluster::new(3);
    let w = c.client(0, write("A", "1"));
    c.deliver(inv(0, 1));
    c.duplicate(ack(1, 0));
    assert_eq!(c.deliver(ack(1, 0)), 2);
    assert_eq!(c.state(0, "A").0, Write);
    assert_eq!(c.reply_of(w), None);
    c.deliver_all();
    assert_eq!(c.reply_of(w), WRITTEN);
}

#[test]
fn old_val_delivered_after_newer_inv_is_ignored_and_duplicate_val_is_harmless() {
    // §3.2 F VAL: a reordered VAL of an older write must not validate a newer invalidation.
    let mut c = Cluster::new(3);
    c.client(0, write("A", "1"));
    c.deliver(inv(0, ANY));
    c.deliver(ack(ANY, 0));
    let old_val = c.take(val(0, 1)).pop().expect("VAL [2,0] to node 1");
    c.deliver_all();

    c.client(0, write("A", "2"));
    c.deliver(inv(0, 1));
    assert_eq!(c.state(1, "A"), (Invalid, ts(4, 0), v("2")));
    c.inject(old_val.clone());
    c.deliver(val(0, 1));
    assert_eq!(c.state(1, "A"), (Invalid, ts(4, 0), v("2")));
    let r = c.client(1, read("A"));
    assert_eq!(c.reply_of(r), None);

    c.deliver(inv(0, 2));
    c.deliver(ack(ANY, 0));
    c.duplicate(val(0, 1));
    assert_eq!(c.deliver(val(0, 1)), 2);
    assert_eq!(c.state(1, "A"), (Valid, ts(4, 0), v("2")));
    assert_eq!(c.reply_of(r), value("2"));
    // Even later, the stale VAL still changes nothing.
    c.inject(old_val);
    c.deliver_all();
    assert_eq!(c.state(1, "A"), (Valid, ts(4, 0), v("2")));
}

#[test]
fn stale_inv_delivered_after_newer_write_is_acked_without_rolling_back() {
    // §3.2 F INV / F ACK: a lower-timestamp INV is acknowledged but never applied.
    let mut c = Cluster::new(3);
    c.client(0, write("A", "1"));
    let delayed = c.take(inv(0, 2)).pop().expect("INV [2,0] to node 2");
    c.deliver_all();
    c.tick(0, MLT); // the retransmission reaches node 2 instead
    c.deliver_all();
    c.client(1, write("A", "2"));
    c.deliver_all();
    assert_eq!(c.state(2, "A"), (Valid, ts(4, 1), v("2")));
    c.inject(delayed);
    c.deliver(inv(0, 2));
    assert_eq!(c.state(2, "A"), (Valid, ts(4, 1), v("2")));
    c.deliver_all();
    for node in 0..3 {
        assert_eq!(c.state(node, "A"), (Valid, ts(4, 1), v("2")));
    }
}

// ================================================================ §2.4, §3.4: epochs

#[test]
fn messages_of_another_epoch_are_dropped() {
    // §3.4: a replica drops messages tagged with an epoch other than its own, lower (stale) or
    // higher (it has not received the m-update yet).
    let mut c = Cluster::new(3);
    for epoch in [0, 2] {
        let msg = Message::Inv {
            epoch: Epoch(epoch),
            key: b("A"),
            ts: ts(2, 0),
            value: v("x"),
            rmw: false,
            superseded: false,
        };
        c.inject(Envelope { from: 0, to: 1, msg });
    }
    c.deliver_all();
    assert_eq!(c.state(1, "A"), (Valid, Timestamp::ZERO, None));
    assert_eq!(c.nodes[1].stats().messages_dropped_epoch, 2);

    // An epoch-1 INV still in flight when the view changes is dropped by its receiver.
    c.client(0, write("A", "1"));
    c.view_change(&[0, 1, 2], 2);
    assert_eq!(c.deliver(|e| e.msg.epoch() == Epoch(1)), 2);
    assert_eq!(c.state(1, "A"), (Valid, Timestamp::ZERO, None));
    assert!(c.pending(ack(1, 0)).is_empty());
    assert_eq!(c.nodes[1].stats().messages_dropped_epoch, 3);
}

#[test]
fn follower_behind_on_m_update_drops_new_epoch_inv_until_it_installs_the_view() {
    // §3.4 Membership reconfiguration: a live follower that has not received the m-update
    // drops the INVs of the new epoch, which looks like message loss to the coordinator; the
    // write completes once the follower catches up.
    let mut c = Cluster::new(3);
    c.install_view(0, &[0, 1, 2], 2);
    c.install_view(1, &[0, 1, 2], 2);
    let t = c.now;
    let w = c.client(0, write("A", "1"));
    c.deliver_all();
    assert_eq!(c.reply_of(w), None);
    assert_eq!(c.state(2, "A"), (Valid, Timestamp::ZERO, None));

    c.install_view(2, &[0, 1, 2], 2);
    c.tick(0, t + MLT);
    c.deliver_all();
    assert_eq!(c.reply_of(w), WRITTEN);
}

/// A write at node 0 that node 1 ACKed in epoch 1 while node 2 never got the INV; node 2 then
/// crashes and epoch 2 makes {0,1} the live set. The ACKs from epoch 1 cover the new live set.
fn write_acked_by_node1_then_node2_leaves(c: &mut Cluster) -> ClientRequestId {
    let w = c.client(0, write("A", "1"));
    c.drop(inv(0, 2));
    c.deliver(inv(0, 1));
    c.deliver(ack(1, 0));
    assert_eq!(c.reply_of(w), None);
    c.crash(2);
    c.view_change(&[0, 1], 2);
    w
}

#[test]
fn view_change_resets_gathered_acks_and_recollects_them_in_new_epoch() {
    // §3.4 and §3.6 (C RMW-replay): ACKs gathered in an older epoch do not count after a view
    // change; the coordinator re-sends its INV to the new live set and waits for node 1 again.
    let mut c = Cluster::new(3);
    let w = write_acked_by_node1_then_node2_leaves(&mut c);
    assert_eq!(c.reply_of(w), None);
    assert_eq!(c.state(0, "A").0, Write);
    let resent = c.pending(all);
    assert_eq!(resent.len(), 1);
    assert_eq!((resent[0].kind(), resent[0].to, resent[0].msg.epoch()), (Kind::Inv, 1, Epoch(2)));

    c.deliver(inv(0, 1));
    assert_eq!(c.reply_of(w), None);
    c.deliver(ack(1, 0));
    assert_eq!(c.reply_of(w), WRITTEN);
    assert_eq!(c.state(0, "A"), (Valid, ts(2, 0), v("1")));
}

#[test]
fn rmw_in_flight_recollects_acks_after_view_change_and_still_commits() {
    // §3.6 C RMW-replay: after a reconfiguration the coordinator resets the gathered ACKs of a
    // pending RMW and replays it to the new live set; the client gets the single result.
    let mut c = Cluster::new(3);
    let i = c.client(0, incr("A"));
    c.drop(inv(0, 2));
    c.deliver(inv(0, 1));
    c.deliver(ack(1, 0));
    c.crash(2);
    c.view_change(&[0, 1], 2);
    assert_eq!(c.reply_of(i), None);
    let resent = c.pending(all);
    assert_eq!(resent.len(), 1);
    let expected = Message::Inv {
        epoch: Epoch(2),
        key: b("A"),
        ts: ts(1, 0),
        value: v("1"),
        rmw: true,
        superseded: false,
    };
    assert_eq!((resent[0].to, &resent[0].msg), (1, &expected));
    c.deliver_all();
    assert_eq!(c.reply_of(i), Some(Outcome::Integer(1)));
    assert_eq!(c.state(1, "A"), (Valid, ts(1, 0), v("1")));
}

#[test]
fn stalled_request_replay_timer_restarts_when_timestamp_changes() {
    // §3.4: a follower suspects a lost VAL only if "the timestamp or the state has not been
    // updated within the mlt"; a newer INV restarts the wait.
    let mut c = Cluster::new(3);
    c.client(0, write("A", "1")); // [2,0]
    c.client(2, write("A", "3")); // [2,2]
    c.deliver(inv(0, 1));
    let r = c.client(1, read("A"));
    let later = Time::from_millis(30);
    c.tick(1, later);
    c.deliver(inv(2, 1));
    assert_eq!(c.state(1, "A"), (Invalid, ts(2, 2), v("3")));
    c.tick(1, MLT);
    assert_eq!(c.state(1, "A").0, Invalid);
    assert!(c.pending(inv(1, ANY)).is_empty());
    c.tick(1, later + MLT);
    assert_eq!(c.state(1, "A"), (Replay, ts(2, 2), v("3")));
    c.deliver_all();
    assert_eq!(c.reply_of(r), value("3"));
    for node in 0..3 {
        assert_eq!(c.state(node, "A"), (Valid, ts(2, 2), v("3")));
    }
}

// ================================================================ §3.6: RMWs

#[test]
fn rmw_bumps_version_by_one_and_write_by_two() {
    // §3.6 C TS: RMWs get +1 and writes +2, so a write always beats a concurrent RMW.
    let mut c = Cluster::new(3);
    let w = c.client(0, write("A", "5"));
    assert_eq!(c.state(0, "A").1, ts(2, 0));
    c.deliver_all();
    let i = c.client(1, incr("A"));
    assert_eq!(c.state(1, "A"), (Write, ts(3, 1), v("6")));
    c.deliver_all();
    let w2 = c.client(2, write("A", "9"));
    assert_eq!(c.state(2, "A").1, ts(5, 2));
    c.deliver_all();
    assert_eq!((c.reply_of(w), c.reply_of(i), c.reply_of(w2)), (WRITTEN, Some(Outcome::Integer(6)), WRITTEN));
    // An RMW's INV carries the RMW flag; a write's does not.
    c.client(0, incr("A"));
    assert!(c.pending(inv(0, ANY)).iter().all(|e| matches!(e.msg, Message::Inv { rmw: true, .. })));
}

#[test]
fn follower_with_higher_timestamp_refuses_rmw_with_inv_and_coordinator_retries_on_new_value() {
    // §3.6 F RMW-ACK: a follower ACKs an RMW's INV only if its timestamp is at least the local
    // one, otherwise it answers with an INV of its own state. C RMW-abort: the coordinator,
    // seeing a higher timestamp, aborts; the retry is invisible to the client, which gets the
    // result computed on the new value.
    let mut c = Cluster::new(3);
    let w = c.client(0, write("A", "10")); // [2,0]
    c.deliver(inv(0, 1));
    let i = c.client(2, incr("A")); // [1,2] on the absent value: would return 1
    assert_eq!(c.state(2, "A"), (Write, ts(1, 2), v("1")));

    c.deliver(inv(2, 1));
    let answer = c.pending(|e| e.from == 1 && e.to == 2);
    assert_eq!(answer.len(), 1, "an INV instead of an ACK: {answer:?}");
    let refusal = Message::Inv {
        epoch: Epoch(1),
        key: b("A"),
        ts: ts(2, 0),
        value: v("10"),
        rmw: false,
        superseded: false,
    };
    assert_eq!(answer[0].msg, refusal);
    assert_eq!(c.state(1, "A"), (Invalid, ts(2, 0), v("10")));

    c.deliver(inv(1, 2));
    assert_eq!(c.state(2, "A"), (Invalid, ts(2, 0), v("10")));
    assert_eq!(c.nodes[2].stats().rmw_aborts, 1);
    assert_eq!(c.reply_of(i), None);

    c.deliver_all();
    assert_eq!(c.reply_of(w), WRITTEN);
    assert_eq!(c.reply_of(i), Some(Outcome::Integer(11)));
    for node in 0..3 {
        assert_eq!(c.state(node, "A"), (Valid, ts(3, 2), v("11")));
    }
}

#[test]
fn coordinator_aborts_rmw_on_higher_timestamp_inv_from_concurrent_write() {
    // §3.6 C RMW-abort: an RMW with pending ACKs aborts on an INV with a higher timestamp,
    // here a concurrent write's (writes always beat concurrent RMWs).
    let mut c = Cluster::new(3);
    let i = c.client(0, rmw("A", RmwOp::Swap(v("s")))); // [1,0]
    let w = c.client(1, write("A", "w")); // [2,1]
    c.deliver(inv(1, 0));
    assert_eq!(c.state(0, "A"), (Invalid, ts(2, 1), v("w")));
    assert_eq!(c.nodes[0].stats().rmw_aborts, 1);
    c.deliver_all();
    assert_eq!(c.reply_of(w), WRITTEN);
    // The retried swap ran after the write: it returns the written value.
    assert_eq!(c.reply_of(i), value("w"));
    for node in 0..3 {
        assert_eq!(c.state(node, "A"), (Valid, ts(3, 0), v("s")));
    }
}

#[test]
fn concurrent_incrs_on_two_replicas_one_commits_other_retries_final_value_two() {
    // §3.6: at most one of concurrent RMWs commits; the other aborts and is retried. Checked
    // under many delivery orders.
    for seed in 0..64 {
        let mut c = Cluster::new(3);
        let i0 = c.client(0, incr("A")); // [1,0]
        let i1 = c.client(1, incr("A")); // [1,1]: the higher timestamp commits first
        c.deliver_shuffled(seed);
        let replies = (c.reply_of(i0), c.reply_of(i1));
        assert_eq!(replies, (Some(Outcome::Integer(2)), Some(Outcome::Integer(1))), "seed {seed}");
        assert_eq!(c.nodes[0].stats().rmw_aborts, 1, "seed {seed}");
        for node in 0..3 {
            assert_eq!(c.state(node, "A"), (Valid, ts(2, 0), v("2")), "seed {seed}");
        }
    }
}

#[test]
fn rmw_that_does_not_write_replies_immediately_without_messages() {
    // §3.6 / command semantics: an RMW that decides not to write is a local read of a Valid key.
    let mut c = Cluster::new(3);
    let cas = c.client(0, rmw("A", RmwOp::CompareAndSwap { expected: v("x"), new: v("y") }));
    assert_eq!(c.reply_of(cas), Some(Outcome::Cas { swapped: false, previous: None }));
    c.client(0, write("A", "abc"));
    c.deliver_all();
    let i = c.client(1, incr("A"));
    assert_eq!(c.reply_of(i), Some(Outcome::Error(CommandError::NotInteger)));
    let setnx = c.client(2, rmw("A", RmwOp::SetIfAbsent(b("z"))));
    assert_eq!(c.reply_of(setnx), Some(Outcome::Flag(false)));
    assert!(c.net.is_empty());
    for node in 0..3 {
        assert_eq!(c.state(node, "A"), (Valid, ts(2, 0), v("abc")));
    }
}

#[test]
fn coordinator_does_not_ack_replay_of_its_own_in_flight_rmw() {
    // Documented deviation (replica.rs, on_inv): while the coordinator lives, only it commits
    // its RMW. A follower replaying it gets no ACK from the coordinator and completes on the
    // coordinator's VAL.
    let mut c = Cluster::new(3);
    let t = c.now;
    let i = c.client(0, incr("A"));
    c.deliver(inv(0, ANY));
    c.drop(ack(1, 0));
    let r = c.client(1, read("A"));
    c.tick(1, t + MLT);
    assert_eq!(c.state(1, "A").0, Replay);
    c.deliver(inv(1, 0));
    assert!(c.pending(ack(0, 1)).is_empty());
    c.deliver_all();
    assert_eq!((c.reply_of(i), c.reply_of(r)), (None, None));

    c.tick(0, t + MLT); // node 0 re-sends its INV to node 1, which ACKs it
    c.deliver_all();
    assert_eq!(c.reply_of(i), Some(Outcome::Integer(1)));
    assert_eq!(c.reply_of(r), value("1"));
    for node in 0..3 {
        assert_eq!(c.state(node, "A"), (Valid, ts(1, 0), v("1")));
    }
}

// ================================================================ per-key serialization

#[test]
fn second_write_to_same_key_at_same_node_waits_for_first() {
    // One update in flight per key per coordinator (§3.2: writes are issued only in Valid).
    let mut c = Cluster::new(3);
    let w1 = c.client(0, write("A", "1"));
    let w2 = c.client(0, write("A", "2"));
    assert_eq!(c.pending(inv(0, ANY)).len(), 2);
    assert!(c.pending(inv(0, ANY)).iter().all(|e| e.ts() == ts(2, 0)));
    c.deliver(inv(0, ANY));
    c.deliver(ack(ANY, 0));
    assert_eq!((c.reply_of(w1), c.reply_of(w2)), (WRITTEN, None));
    // The second write goes out as soon as the first completes.
    assert_eq!(c.state(0, "A"), (Write, ts(4, 0), v("2")));
    c.deliver_all();
    assert_eq!(c.reply_of(w2), WRITTEN);
    for node in 0..3 {
        assert_eq!(c.state(node, "A"), (Valid, ts(4, 0), v("2")));
    }
}

#[test]
fn writes_to_different_keys_proceed_concurrently() {
    // §3.7: updates are inter-key concurrent: both INVs go out before any ACK.
    let mut c = Cluster::new(3);
    let wa = c.client(0, write("A", "1"));
    let wb = c.client(0, write("B", "2"));
    assert_eq!(c.pending(inv(0, ANY)).len(), 4);
    assert_eq!((c.state(0, "A").0, c.state(0, "B").0), (Write, Write));
    c.deliver_all();
    assert_eq!((c.reply_of(wa), c.reply_of(wb)), (WRITTEN, WRITTEN));
}

// ================================================================ §3.3: optimizations

#[test]
fn o2_virtual_ids_of_node_n_lie_in_its_own_range() {
    // §3.3 O2: node n draws its cids from [4n, 4n+4); ranges never overlap.
    let mut c = Cluster::with(3, |config| config.optimizations.virtual_ids_per_node = 4);
    for node in 0..3u8 {
        let mut cids = std::collections::BTreeSet::new();
        for round in 0..16 {
            let key = format!("k{node}-{round}");
            c.client(node, write(&key, "x"));
            cids.insert(c.state(node, &key).1.cid);
            c.deliver_all();
        }
        let range = 4 * node as u32..4 * node as u32 + 4;
        assert!(cids.iter().all(|cid| range.contains(cid)), "node {node}: {cids:?}");
        assert!(cids.len() > 1, "node {node} used only {cids:?}");
    }
}

fn o3_cluster() -> Cluster {
    Cluster::with(3, |config| config.optimizations.broadcast_acks = true)
}

#[test]
fn o3_followers_broadcast_acks_and_validate_without_val() {
    // §3.3 O3: followers broadcast ACKs to all replicas and serve reads once they hold ACKs from
    // all live replicas, half a round trip earlier; the coordinator sends no VAL.
    let mut c = o3_cluster();
    let w = c.client(0, write("A", "1"));
    c.deliver(inv(0, ANY));
    let mut acks: Vec<(u8, u8)> = c.pending(ack(ANY, ANY)).iter().map(|e| (e.from, e.to)).collect();
    acks.sort();
    assert_eq!(acks, vec![(1, 0), (1, 2), (2, 0), (2, 1)]);

    let r = c.client(1, read("A"));
    assert_eq!(c.reply_of(r), None);
    c.deliver(ack(2, 1));
    assert_eq!(c.state(1, "A"), (Valid, ts(2, 0), v("1")));
    assert_eq!(c.reply_of(r), value("1"));

    c.deliver_all();
    assert_eq!(c.reply_of(w), WRITTEN);
    assert!(c.pending(val(ANY, ANY)).is_empty());
    for node in 0..3 {
        assert_eq!(c.state(node, "A"), (Valid, ts(2, 0), v("1")));
    }
}

#[test]
fn o3_ack_overheard_before_inv_still_counts_for_known_key() {
    // §3.3 O3 under reordering (§3.4): node 2's broadcast ACK may reach node 1 before node 0's
    // INV does; once the INV arrives, node 1 knows every live replica holds the write.
    let mut c = o3_cluster();
    c.client(0, write("A", "0"));
    c.deliver_all();
    c.client(0, write("A", "1"));
    c.deliver(inv(0, 2));
    c.deliver(ack(2, 1));
    c.deliver(inv(0, 1));
    assert_eq!(c.state(1, "A"), (Valid, ts(4, 0), v("1")));
}

#[test]

fn o3_ack_overheard_before_inv_still_counts_for_new_key() {
    // Same as above for a key node 1 has never seen: on_ack returns early when the key has no
    // entry, so node 2's ACK is forgotten and, with no VAL under O3, node 1 stays Invalid.
    let mut c = o3_cluster();
    c.client(0, write("A", "1"));
    c.deliver(inv(0, 2));
    c.deliver(ack(2, 1));
    c.deliver(inv(0, 1));
    assert_eq!(c.state(1, "A"), (Valid, ts(2, 0), v("1")));
}

#[test]
fn o3_rmw_still_needs_val_at_followers() {
    // Documented deviation (replica.rs): O3 follower validation is for writes only; an RMW may
    // still abort at its coordinator, so followers wait for its VAL.
    let mut c = o3_cluster();
    let i = c.client(0, incr("A"));
    c.deliver(inv(0, ANY));
    c.deliver(ack(ANY, ANY));
    assert_eq!(c.reply_of(i), Some(Outcome::Integer(1)));
    assert_eq!(c.state(1, "A"), (Invalid, ts(1, 0), v("1")));
    assert_eq!(c.pending(val(0, ANY)).len(), 2);
    c.deliver_all();
    assert_eq!(c.state(1, "A"), (Valid, ts(1, 0), v("1")));
}

// ================================================================ membership

#[test]
fn replica_outside_the_view_refuses_clients_as_unavailable() {
    // §2.4 / §3.4: only replicas live in the current view (holding a lease) serve requests.
    let mut c = Cluster::new(3);
    c.view_change(&[0, 1], 2);
    let r = c.client(2, read("A"));
    let w = c.client(2, write("A", "1"));
    for id in [r, w] {
        assert!(matches!(c.reply_of(id), Some(Outcome::Error(CommandError::Unavailable(_)))));
    }
    assert!(c.net.is_empty());
    // It also ignores peer messages, even of the current epoch.
    let msg = Message::Inv {
        epoch: Epoch(2),
        key: b("A"),
        ts: ts(2, 0),
        value: v("x"),
        rmw: false,
        superseded: false,
    };
    c.inject(Envelope { from: 0, to: 2, msg });
    c.deliver_all();
    assert_eq!(c.state(2, "A"), (Valid, Timestamp::ZERO, None));
}

#[test]
fn coordinator_removed_from_view_replies_outcome_unknown_and_write_may_still_commit() {
    // §3.4: a replica that leaves the view stops serving. Its in-flight write's outcome is
    // unknown (another replica may replay it), while a stalled request was never executed.
    let mut c = Cluster::new(3);
    let w = c.client(2, write("A", "7"));
    let r = c.client(2, read("A"));
    c.deliver(inv(2, 0));
    c.view_change(&[0, 1], 2);
    assert_eq!(c.reply_of(w), Some(Outcome::Error(CommandError::OutcomeUnknown)));
    assert!(matches!(c.reply_of(r), Some(Outcome::Error(CommandError::Unavailable(_)))));

    // Node 0 holds node 2's INV and replays it: the "unknown" write did take effect.
    let t = c.now;
    let r0 = c.client(0, read("A"));
    c.tick(0, t + MLT);
    c.deliver_all();
    assert_eq!(c.reply_of(r0), value("7"));
    assert_eq!(c.state(1, "A"), (Valid, ts(2, 2), v("7")));
}

#[test]

fn aborted_rmw_requeued_when_coordinator_leaves_view_may_have_taken_effect() {
    // Node 0's INCR [1,0] reaches node 1, then aborts at node 0 on node 4's write [2,4] and
    // waits to be retried. Nodes 0 and 4 leave the view. leave_service answers the waiting
    // INCR Unavailable ("did not execute"), but node 1 replays [1,0] among {1,2,3}, which all
    // hold lower timestamps and ACK it: the INCR's effect is committed. Expected
    // OutcomeUnknown, as for an update in flight (the checker drops Unavailable operations).
    let mut c = Cluster::new(5);
    let i = c.client(0, incr("A"));
    c.deliver(inv(0, 1));
    let w = c.client(4, write("A", "10"));
    c.deliver(inv(4, 0));
    assert_eq!(c.nodes[0].stats().rmw_aborts, 1);
    assert_eq!(c.reply_of(i), None);

    c.view_change(&[1, 2, 3], 2);
    assert_eq!(c.reply_of(w), Some(Outcome::Error(CommandError::OutcomeUnknown)));
    let t = c.now;
    let r = c.client(1, read("A"));
    c.tick(1, t + MLT);
    c.deliver_all();
    assert_eq!(c.reply_of(r), value("1"), "the INCR took effect");
    assert_eq!(c.reply_of(i), Some(Outcome::Error(CommandError::OutcomeUnknown)));
}

#[test]

fn replica_re_added_to_view_does_not_serve_stale_reads() {
    // §3.4 Recovery: a node re-joining must first reconstruct the datastore as a shadow
    // replica. on_view makes a re-added replica operational at once, with the keys it left
    // Valid still Valid, so it serves values overwritten while it was away.
    let mut c = Cluster::new(3);
    c.client(0, write("A", "old"));
    c.deliver_all();
    c.view_change(&[0, 1], 2);
    let w = c.client(0, write("A", "new"));
    c.deliver_all();
    assert_eq!(c.reply_of(w), WRITTEN);
    c.view_change(&[0, 1, 2], 3);
    let r = c.client(2, read("A"));
    assert_ne!(c.reply_of(r), value("old"), "stale read at the re-added replica");
}

// ================================================================ broken variants

/// Each deliberately broken variant changes what a scripted scenario observes, so a test
/// relying on the correct behaviour would catch it.
#[cfg(feature = "broken-variants")]
mod broken_variants {
    use super::*;
    use chorus_hermes::Bug;

    fn with_bug(n: u8, bug: Bug) -> Cluster {
        Cluster::with(n, |config| config.bug = Some(bug))
    }

    #[test]
    fn read_in_any_state_serves_an_invalid_key() {
        // Violates §3.2 Reads: the follower returns the uncommitted value at once.
        let mut c = with_bug(3, Bug::ReadInAnyState);
        c.client(0, write("A", "1"));
        c.deliver(inv(0, 1));
        assert_eq!(c.state(1, "A").0, Invalid);
        let r = c.client(1, read("A"));
        assert_eq!(c.reply_of(r), value("1"));
    }

    #[test]
    fn val_ignores_timestamp_validates_on_an_older_val() {
        // Violates §3.2 F VAL: the old VAL [2,0] validates node 1's invalidation by [4,0].
        let mut c = with_bug(3, Bug::ValIgnoresTimestamp);
        c.client(0, write("A", "1"));
        c.deliver(inv(0, ANY));
        c.deliver(ack(ANY, 0));
        let old_val = c.take(val(0, 1)).pop().expect("VAL to node 1");
        c.deliver_all();
        c.client(0, write("A", "2"));
        c.deliver(inv(0, 1));
        c.inject(old_val);
        c.deliver(val(0, 1));
        assert_eq!(c.state(1, "A"), (Valid, ts(4, 0), v("2")));
    }

    #[test]
    fn keep_acks_on_view_change_commits_without_acks_of_new_epoch() {
        // The correct core waits for node 1's ACK again in epoch 2
        // (view_change_resets_gathered_acks_and_recollects_them_in_new_epoch); this one
        // completes on the epoch-1 ACK as soon as the view changes.
        let mut c = with_bug(3, Bug::KeepAcksOnViewChange);
        let w = write_acked_by_node1_then_node2_leaves(&mut c);
        assert_eq!(c.reply_of(w), WRITTEN);
        assert_eq!(c.state(0, "A").0, Valid);
    }

    #[test]
    fn rmw_never_aborts_lets_two_conflicting_incrs_both_commit() {
        // Violates §3.6: both INCRs read 0 and both commit, so one increment is lost.
        let mut c = with_bug(3, Bug::RmwNeverAborts);
        let i0 = c.client(0, incr("A"));
        let i1 = c.client(1, incr("A"));
        c.deliver_all();
        assert_eq!((c.reply_of(i0), c.reply_of(i1)), (Some(Outcome::Integer(1)), Some(Outcome::Integer(1))));
        assert_eq!(c.nodes[0].stats().rmw_aborts, 0);
        assert_eq!(c.state(1, "A").2, v("1"));
    }

    #[test]
    fn commit_on_majority_replies_before_the_last_ack_and_allows_a_stale_read() {
        // Violates §3.2 C ACK: with ACKs from nodes 0 and 1 (a majority) the write is reported
        // done while node 2 never saw it, and node 2 then serves the old value.
        let mut c = with_bug(3, Bug::CommitOnMajority);
        let w = c.client(0, write("A", "1"));
        c.deliver(inv(0, 1));
        c.deliver(ack(1, 0));
        assert_eq!(c.reply_of(w), WRITTEN);
        let r = c.client(2, read("A"));
        assert_eq!(c.reply_of(r), Some(Outcome::Value(None)));
    }
}
