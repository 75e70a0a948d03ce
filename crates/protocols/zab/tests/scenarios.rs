//! Scripted scenarios for the ZAB core: recovery (discovery, synchronisation), broadcast on a
//! majority, sync reads, and leader failure, message by message with a manual network and a
//! manual clock.

use bytes::Bytes;
use chorus_core::{
    ClientRequestId, Command, CommandError, Epoch, NodeId, NodeSet, Outbox, Outcome, Replica, RmwOp, Time,
    View,
};
use chorus_zab::{DurableState, Message, ReadMode, Zab, ZabConfig};

const TIMEOUT: Time = Time::from_millis(50);

#[derive(Clone, Debug)]
struct Envelope {
    from: u8,
    to: u8,
    msg: Message,
}

struct Cluster {
    nodes: Vec<Zab>,
    crashed: Vec<bool>,
    net: Vec<Envelope>,
    replies: Vec<(ClientRequestId, Outcome)>,
    now: Time,
    next_request: u64,
    /// Each node's logged records (`Zab::take_durable` after every event), when persisting.
    disks: Vec<Vec<Message>>,
}

fn b(text: &str) -> Bytes {
    Bytes::copy_from_slice(text.as_bytes())
}

impl Cluster {
    fn new(n: u8, read_mode: ReadMode) -> Cluster {
        let all: NodeSet = (0..n).map(NodeId).collect();
        let nodes = (0..n)
            .map(|i| {
                let mut config = ZabConfig::new(NodeId(i), all);
                config.retransmit_timeout = TIMEOUT;
                config.read_mode = read_mode;
                // Snapshots (served by the source) then take several chunks.
                config.snapshot_chunk_bytes_target = 16;
                Zab::new(config)
            })
            .collect();
        Cluster {
            nodes,
            crashed: vec![false; n as usize],
            net: Vec::new(),
            replies: Vec::new(),
            now: Time::from_millis(1),
            next_request: 0,
            disks: vec![Vec::new(); n as usize],
        }
    }

    /// A cluster whose initial recovery is done: n0 leads epoch 1.
    fn established(n: u8, read_mode: ReadMode) -> Cluster {
        let mut cluster = Cluster::new(n, read_mode);
        cluster.tick(Time::from_millis(1));
        cluster.settle();
        assert!(cluster.nodes[0].is_established_leader());
        cluster
    }

    fn collect(&mut self, from: u8, out: Outbox<Message>) {
        // The runtime logs the event's records before its messages leave.
        let records = self.nodes[from as usize].take_durable();
        self.disks[from as usize].extend(records);
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

    /// Deliver everything except messages matching `hold` (which stay in flight).
    fn settle_except(&mut self, hold: impl Fn(&Envelope) -> bool) {
        let mut steps = 0;
        while self.net.iter().any(|e| !hold(e)) {
            self.deliver(|e| !hold(e));
            steps += 1;
            assert!(steps < 10_000, "the network never settles");
        }
    }

    fn settle(&mut self) {
        self.settle_except(|_| false);
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

fn to(node: u8) -> impl Fn(&Envelope) -> bool {
    move |e| e.to == node
}

fn set(key: &str, value: &str) -> Command {
    Command::Write { key: b(key), value: Some(b(value)) }
}
fn get(key: &str) -> Command {
    Command::Read { key: b(key) }
}

#[test]
fn the_initial_leader_recovers_before_it_broadcasts() {
    let mut cluster = Cluster::new(3, ReadMode::Sync);
    // A write submitted before recovery waits in the leader's buffer.
    let write = cluster.client(1, set("k", "v"));
    cluster.settle();
    assert!(cluster.reply(write).is_none(), "nothing commits before recovery");
    cluster.tick(Time::from_millis(1)); // the leader's first tick sends NEWEPOCH
    cluster.settle();
    assert!(cluster.nodes[0].is_established_leader());
    assert_eq!(cluster.reply(write), Some(&Outcome::Written));
}

#[test]
fn a_write_commits_with_a_majority_while_one_follower_hears_nothing() {
    let mut cluster = Cluster::established(3, ReadMode::Sync);
    let write = cluster.client(1, Command::Rmw { key: b("n"), op: RmwOp::IncrementBy(4) });
    cluster.settle_except(to(2));
    assert_eq!(cluster.reply(write), Some(&Outcome::Integer(4)), "leader + n1 are a majority of 3");
    assert_eq!(cluster.nodes[2].applied_index(), 0);
    // n2's messages were lost; the leader's retransmission catches it up.
    cluster.net.clear();
    cluster.tick(TIMEOUT);
    cluster.settle();
    assert_eq!(cluster.nodes[2].value(b"n"), Some(&b("4")));
}

#[test]
fn replicas_holding_an_entry_are_the_ones_that_acknowledged_it() {
    let mut cluster = Cluster::established(3, ReadMode::Sync);
    let write = cluster.client(0, set("k", "v"));
    cluster.settle_except(to(2));
    assert_eq!(cluster.reply(write), Some(&Outcome::Written));
    let index = cluster.nodes[0].applied_index();
    let both: NodeSet = [NodeId(0), NodeId(1)].into_iter().collect();
    assert_eq!(cluster.nodes[0].replicas_holding(index), both, "n2 never acknowledged it");
    assert_eq!(cluster.nodes[1].replicas_holding(index), both, "a follower knows itself and the leader");
    assert_eq!(cluster.nodes[2].replicas_holding(index), NodeSet::EMPTY);
    cluster.settle();
    let everyone: NodeSet = (0..3).map(NodeId).collect();
    assert_eq!(cluster.nodes[0].replicas_holding(index), everyone);
}

#[test]
fn no_commit_without_a_majority() {
    let mut cluster = Cluster::established(5, ReadMode::Sync);
    let write = cluster.client(0, set("k", "v"));
    cluster.settle_except(|e| e.to >= 2);
    assert!(cluster.reply(write).is_none(), "2 of 5 is not a quorum");
    cluster.settle_except(|e| e.to >= 3);
    assert_eq!(cluster.reply(write), Some(&Outcome::Written), "3 of 5 is");
}

#[test]
fn a_sync_read_waits_until_the_follower_applied_the_leaders_commit_point() {
    let mut cluster = Cluster::established(3, ReadMode::Sync);
    let write = cluster.client(0, set("k", "new"));
    // n1 acknowledges (so the write commits) but never hears the COMMIT yet.
    cluster.deliver(|e| matches!(e.msg, Message::Propose { .. }) && e.to == 1);
    cluster.deliver(|e| matches!(e.msg, Message::Ack { .. }));
    assert_eq!(cluster.reply(write), Some(&Outcome::Written));
    let read = cluster.client(1, get("k"));
    cluster.deliver(|e| matches!(e.msg, Message::Sync { .. }));
    cluster.deliver(|e| matches!(e.msg, Message::SyncReply { .. }));
    assert!(cluster.reply(read).is_none(), "n1 has not applied the leader's commit point yet");
    cluster.deliver(|e| matches!(e.msg, Message::Commit { .. }) && e.to == 1);
    assert_eq!(cluster.reply(read), Some(&Outcome::Value(Some(b("new")))));
}

#[test]
fn a_local_read_at_a_lagging_follower_returns_the_older_value() {
    let mut cluster = Cluster::established(3, ReadMode::Local);
    let write = cluster.client(0, set("k", "new"));
    cluster.settle_except(to(2));
    assert_eq!(cluster.reply(write), Some(&Outcome::Written));
    let read = cluster.client(2, get("k"));
    // Sequentially consistent, not linearizable: the write completed, the read misses it.
    assert_eq!(cluster.reply(read), Some(&Outcome::Value(None)));
}

#[test]
fn a_committed_write_survives_the_leaders_crash() {
    let mut cluster = Cluster::established(3, ReadMode::Sync);
    let write = cluster.client(0, set("k", "kept"));
    // Only n2 acknowledges; n1 hears nothing. The write commits at the leader, which crashes.
    cluster.settle_except(to(1));
    assert_eq!(cluster.reply(write), Some(&Outcome::Written));
    cluster.crash_and_install(0, 2);
    // n1 leads epoch 2; its own history is empty, n2's holds the write: n1 must adopt n2's.
    cluster.settle();
    assert!(cluster.nodes[1].is_established_leader());
    assert_eq!(cluster.nodes[1].value(b"k"), Some(&b("kept")));
    let read = cluster.client(1, get("k"));
    assert_eq!(cluster.reply(read), Some(&Outcome::Value(Some(b("kept")))));
}

#[test]
fn a_forward_lost_with_the_old_leader_is_proposed_once_by_the_new_one() {
    let mut cluster = Cluster::established(3, ReadMode::Sync);
    let write = cluster.client(2, Command::Rmw { key: b("n"), op: RmwOp::IncrementBy(2) });
    cluster.deliver(|e| matches!(e.msg, Message::Forward { .. }));
    cluster.net.clear(); // the proposal never leaves n0
    cluster.crash_and_install(0, 2);
    cluster.settle();
    cluster.tick(TIMEOUT);
    cluster.settle();
    assert_eq!(cluster.reply(write), Some(&Outcome::Integer(2)));
    assert_eq!(cluster.nodes[1].value(b"n"), Some(&b("2")), "executed once");
}

#[test]
fn messages_of_an_older_epoch_are_dropped() {
    let mut cluster = Cluster::established(3, ReadMode::Sync);
    cluster.client(0, set("k", "v"));
    let stale = cluster.net.iter().position(to(2)).unwrap();
    let stale = cluster.net.remove(stale);
    cluster.crash_and_install(1, 2);
    let mut out = Outbox::default();
    cluster.nodes[2].on_message(cluster.now, NodeId(stale.from), stale.msg, &mut out);
    assert!(out.is_empty());
    assert_eq!(cluster.nodes[2].stats().messages_dropped_epoch, 1);
}

impl Cluster {
    /// `node` comes back empty (its state was in memory) and every live replica installs the
    /// view that adds it back, as the membership service would after its join.
    fn restart_and_install(&mut self, node: u8, epoch: u64) {
        let all: NodeSet = (0..self.nodes.len() as u8).map(NodeId).collect();
        let mut config = ZabConfig::new(NodeId(node), all);
        config.retransmit_timeout = TIMEOUT;
        config.recovering = true;
        config.snapshot_chunk_bytes_target = 16;
        self.nodes[node as usize] = Zab::new(config);
        self.crashed[node as usize] = false;
        let live: NodeSet =
            (0..self.nodes.len() as u8).filter(|i| !self.crashed[*i as usize]).map(NodeId).collect();
        for i in live.iter() {
            let mut out = Outbox::default();
            self.nodes[i.index()].on_view(self.now, View { epoch: Epoch(epoch), live }, &mut out);
            self.collect(i.0, out);
        }
    }

    /// Writes `count` keys through `node`, then lets heartbeats carry the compaction point.
    fn write_keys(&mut self, node: u8, prefix: &str, count: usize) {
        for i in 0..count {
            let write = self.client(node, set(&format!("{prefix}{i:02}"), &format!("v{i}")));
            self.settle();
            assert_eq!(self.reply(write), Some(&Outcome::Written));
        }
        for _ in 0..3 {
            self.tick(TIMEOUT);
            self.settle();
        }
    }
}

fn snapshot_chunks(cluster: &Cluster, node: u8) -> u64 {
    cluster.nodes[node as usize].stats().snapshot_chunks_received
}

/// Zab §IV-B phase 2 (synchronisation) with ZooKeeper's SNAP: a replica that restarted empty
/// joins while the others have forgotten the entries it lacks. As the new view's leader it
/// pulls the best follower's snapshot in chunks and the history after it; as a follower it
/// pulls the leader's. Until then it counts in no quorum and serves nobody.
#[test]
fn restarted_replicas_take_snapshots_in_chunks_as_leader_and_as_follower() {
    let mut cluster = Cluster::established(3, ReadMode::Sync);
    cluster.write_keys(0, "a", 10);
    assert!(cluster.nodes[1].entry(1).is_none(), "followers compacted what every replica applied");
    // n0 dies; n1 leads epoch 2 and commits more.
    cluster.crash_and_install(0, 2);
    cluster.tick(TIMEOUT);
    cluster.settle();
    assert!(cluster.nodes[1].is_established_leader());
    cluster.write_keys(1, "b", 5);
    // n0 restarts empty and leads epoch 3 (lowest id): the others no longer hold entry 1.
    cluster.restart_and_install(0, 3);
    let early = cluster.client(0, get("a00"));
    assert!(
        matches!(cluster.reply(early), Some(Outcome::Error(CommandError::Unavailable(why))) if why.starts_with("joining")),
        "{:?}",
        cluster.reply(early)
    );
    cluster.tick(TIMEOUT);
    cluster.settle();
    assert!(cluster.nodes[0].is_established_leader());
    assert!(cluster.nodes[0].is_complete());
    assert!(snapshot_chunks(&cluster, 0) >= 3, "15 keys in 16-byte chunks: {}", snapshot_chunks(&cluster, 0));
    assert_eq!(cluster.nodes[0].value(b"a03"), Some(&b("v3")));
    assert_eq!(cluster.nodes[0].value(b"b04"), Some(&b("v4")));
    // n2 restarts empty as a follower of n0, whose history starts after its snapshot.
    cluster.write_keys(0, "c", 3);
    cluster.crashed[2] = true;
    cluster.net.retain(|envelope| envelope.from != 2 && envelope.to != 2);
    cluster.restart_and_install(2, 4);
    cluster.tick(TIMEOUT);
    cluster.settle();
    assert!(cluster.nodes[2].is_complete());
    assert!(snapshot_chunks(&cluster, 2) >= 3);
    let read = cluster.client(2, get("c02"));
    cluster.settle();
    assert_eq!(cluster.reply(read), Some(&Outcome::Value(Some(b("v2")))));
    // The joiner counts in quorums again: with n1 gone, n0 and n2 commit.
    cluster.crash_and_install(1, 5);
    cluster.tick(TIMEOUT);
    cluster.settle();
    let write = cluster.client(2, set("after", "joins"));
    cluster.settle();
    assert_eq!(cluster.reply(write), Some(&Outcome::Written));
}

/// A replica that restarted empty may have acknowledged entries it no longer holds, so its
/// FollowerInfo does not count toward the discovery quorum: with one complete replica of
/// three live, the leader waits rather than adopt a history that may miss committed entries.
#[test]
fn an_empty_replica_does_not_count_in_a_discovery_quorum() {
    let mut cluster = Cluster::established(3, ReadMode::Sync);
    cluster.write_keys(0, "k", 2);
    // n1 and n2 both restart empty (two amnesiacs of three: data the cluster cannot vouch for).
    cluster.crashed[1] = true;
    cluster.crashed[2] = true;
    cluster.net.clear();
    cluster.restart_and_install(1, 2);
    cluster.restart_and_install(2, 3);
    cluster.tick(TIMEOUT);
    cluster.settle();
    assert!(!cluster.nodes[0].is_established_leader(), "two empty replicas are no quorum");
    assert!(!cluster.nodes[1].is_complete() && !cluster.nodes[2].is_complete());
}

/// An origin that left a view answered its unapplied updates `OutcomeUnknown` and gave up
/// on their numbers; after it is added back, its next update must not wait for them.
#[test]
fn an_origin_back_in_the_view_is_not_blocked_by_the_updates_it_gave_up() {
    let mut cluster = Cluster::established(3, ReadMode::Sync);
    // n2's forward is lost, then n2 is removed: its update's outcome is unknown.
    let lost = cluster.client(2, set("x", "1"));
    cluster.net.clear();
    let view = |live: &[u8]| live.iter().copied().map(NodeId).collect::<NodeSet>();
    for (epoch, live) in [(2, view(&[0, 1])), (3, view(&[0, 1, 2]))] {
        for node in 0..3u8 {
            let mut out = Outbox::default();
            cluster.nodes[node as usize].on_view(cluster.now, View { epoch: Epoch(epoch), live }, &mut out);
            cluster.collect(node, out);
        }
        cluster.tick(TIMEOUT);
        cluster.settle();
    }
    assert_eq!(cluster.reply(lost), Some(&Outcome::Error(CommandError::OutcomeUnknown)));
    let write = cluster.client(2, set("x", "2"));
    cluster.settle();
    assert_eq!(cluster.reply(write), Some(&Outcome::Written), "the leader waited for the abandoned number");
}

// ------------------------------------------------------------------ persistence (issue 24)

impl Cluster {
    fn persisting(n: u8) -> Cluster {
        let mut cluster = Cluster::new(n, ReadMode::Sync);
        for node in &mut cluster.nodes {
            node.enable_persistence();
        }
        cluster.tick(Time::from_millis(1));
        cluster.settle();
        assert!(cluster.nodes[0].is_established_leader());
        cluster
    }

    /// Every node loses power at once (what was in flight is gone), restarts from its
    /// records and rejoins: the membership service adds each back in a new view.
    fn power_loss(&mut self, epoch: u64) {
        self.net.clear();
        let all: NodeSet = (0..self.nodes.len() as u8).map(NodeId).collect();
        for node in 0..self.nodes.len() {
            let mut config = ZabConfig::new(NodeId(node as u8), all);
            config.retransmit_timeout = TIMEOUT;
            config.recovering = true;
            let mut zab = Zab::new(config);
            let state = DurableState::load(self.disks[node].clone()).unwrap();
            zab.restore(state, 1 << 20);
            self.nodes[node] = zab;
        }
        for i in all.iter() {
            let mut out = Outbox::default();
            self.nodes[i.index()].on_view(self.now, View { epoch: Epoch(epoch), live: all }, &mut out);
            self.collect(i.0, out);
        }
        self.tick(TIMEOUT);
        self.settle();
    }
}

/// Issue 24 point 2: every replica loses power at once. Each comes back from its own records
/// with every entry it acknowledged, so discovery (by currentEpoch, then last zxid) finds every
/// committed write in a quorum; the leader sends each follower only the entries after its
/// applied point, never a snapshot.
#[test]
fn a_whole_cluster_power_loss_keeps_every_committed_write_and_copies_no_snapshot() {
    let mut cluster = Cluster::persisting(3);
    cluster.write_keys(0, "a", 10);
    // Committed by n0 and n1 while n2 hears nothing.
    let write = cluster.client(1, set("late", "1"));
    cluster.settle_except(to(2));
    assert_eq!(cluster.reply(write), Some(&Outcome::Written));
    cluster.power_loss(2);
    assert!(cluster.nodes[0].is_established_leader());
    for node in 0..3u8 {
        assert!(cluster.nodes[node as usize].is_complete());
        assert_eq!(snapshot_chunks(&cluster, node), 0, "n{node} pulled a snapshot");
        for (key, value) in [("a00", "v0"), ("a09", "v9"), ("late", "1")] {
            let read = cluster.client(node, get(key));
            cluster.settle();
            assert_eq!(cluster.reply(read), Some(&Outcome::Value(Some(b(value)))), "{key} at n{node}");
        }
    }
    // Updates go on with numbers no earlier run used, and a second power loss keeps them.
    let write = cluster.client(2, set("after", "x"));
    cluster.settle();
    assert_eq!(cluster.reply(write), Some(&Outcome::Written));
    cluster.power_loss(3);
    let read = cluster.client(1, get("after"));
    cluster.settle();
    assert_eq!(cluster.reply(read), Some(&Outcome::Value(Some(b("x")))));
}

/// A snapshot written a slice of keys at a time while writes go on (fuzzy), followed by the
/// records logged meanwhile, loads as exactly the replica's applied state.
#[test]
fn a_fuzzy_snapshot_and_the_history_after_it_load_as_the_applied_state() {
    let mut cluster = Cluster::persisting(3);
    cluster.write_keys(0, "k", 6);
    let mut records = cluster.nodes[1].snapshot_header();
    let keys: Vec<Bytes> = cluster.nodes[1].keys().cloned().collect();
    let logged = cluster.disks[1].len();
    // Half the keys now, then overwrites, a delete and a new key, then the other half.
    records.extend(cluster.nodes[1].snapshot_record(&keys[..3]));
    for command in
        [set("k00", "new"), set("k04", "new"), Command::Write { key: b("k05"), value: None }, set("n", "1")]
    {
        cluster.client(0, command);
        cluster.settle();
    }
    for _ in 0..3 {
        cluster.tick(TIMEOUT);
        cluster.settle();
    }
    records.extend(cluster.nodes[1].snapshot_record(&keys[3..]));
    records.extend(cluster.disks[1][logged..].iter().cloned());
    let state = DurableState::load(records).unwrap();
    assert_eq!(state.applied_index(), cluster.nodes[1].applied_index());
    assert_eq!(state.key_count(), cluster.nodes[1].key_count());
    let all: NodeSet = (0..3).map(NodeId).collect();
    let mut restored = Zab::new(ZabConfig { recovering: true, ..ZabConfig::new(NodeId(1), all) });
    restored.restore(state, 1);
    for key in ["k00", "k01", "k04", "k05", "n"] {
        assert_eq!(restored.value(key.as_bytes()), cluster.nodes[1].value(key.as_bytes()), "{key}");
    }
    assert_eq!(restored.value(b"k00"), Some(&b("new")));
}
