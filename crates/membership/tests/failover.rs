//! Membership under crashes and partitions, on a deterministic in-memory network. The
//! property that matters (Hermes §2.4): a node that is removed from the view has stopped
//! serving (its lease expired) before any survivor installs the view without it.

use chorus_core::{Epoch, NodeId, NodeSet, Time};
use chorus_membership::{
    Membership, MembershipConfig, MembershipEvent, MembershipMessage, MembershipOutbox, PersistRecord,
};

struct Cluster {
    nodes: Vec<Membership>,
    config: MembershipConfig,
    now: Time,
    crashed: Vec<bool>,
    /// `blocked[from][to]`: messages on that directed link are dropped.
    blocked: Vec<Vec<bool>>,
    in_flight: Vec<(Time, NodeId, NodeId, MembershipMessage)>,
    installed_at: Vec<Vec<(Time, Epoch, NodeSet)>>,
    /// What each node asked to persist, in order: its "disk".
    disks: Vec<Vec<PersistRecord>>,
}

const LINK_DELAY: Time = Time::from_micros(300);
const STEP: Time = Time::from_millis(1);

impl Cluster {
    fn new(size: u8) -> Cluster {
        let members: NodeSet = (0..size).map(NodeId).collect();
        let config = MembershipConfig::new(NodeId(0), members);
        let nodes = (0..size)
            .map(|n| Membership::new(MembershipConfig { me: NodeId(n), ..config.clone() }, Time::ZERO))
            .collect();
        let size = size as usize;
        Cluster {
            nodes,
            config,
            now: Time::ZERO,
            crashed: vec![false; size],
            blocked: vec![vec![false; size]; size],
            in_flight: Vec::new(),
            installed_at: vec![Vec::new(); size],
            disks: vec![Vec::new(); size],
        }
    }

    fn perform(&mut self, from: usize, out: MembershipOutbox) {
        self.disks[from].extend(out.persist);
        for (to, message) in out.messages {
            if !self.blocked[from][to.index()] {
                self.in_flight.push((self.now + LINK_DELAY, NodeId(from as u8), to, message));
            }
        }
        for MembershipEvent::ViewInstalled(view) in out.events {
            self.installed_at[from].push((self.now, view.epoch, view.live));
        }
    }

    fn run_for(&mut self, duration: Time) {
        let end = self.now + duration;
        while self.now < end {
            self.now = self.now + STEP;
            let (due, later): (Vec<_>, Vec<_>) = self.in_flight.drain(..).partition(|m| m.0 <= self.now);
            self.in_flight = later;
            for (_, from, to, message) in due {
                if self.crashed[to.index()] || self.blocked[from.index()][to.index()] {
                    continue;
                }
                let mut out = MembershipOutbox::default();
                self.nodes[to.index()].on_message(self.now, from, message, &mut out);
                self.perform(to.index(), out);
            }
            for node in 0..self.nodes.len() {
                if !self.crashed[node] {
                    let mut out = MembershipOutbox::default();
                    self.nodes[node].on_tick(self.now, &mut out);
                    self.perform(node, out);
                }
            }
        }
    }

    /// When the first survivor installed a view without `node`.
    fn first_install_without(&self, node: usize) -> Option<Time> {
        self.installed_at
            .iter()
            .enumerate()
            .filter(|(n, _)| *n != node)
            .flat_map(|(_, views)| views.iter())
            .filter(|(_, _, live)| !live.contains(NodeId(node as u8)))
            .map(|(at, _, _)| *at)
            .min()
    }
}

#[test]
fn healthy_cluster_keeps_its_view_and_every_node_holds_a_lease() {
    let mut cluster = Cluster::new(3);
    cluster.run_for(Time::from_millis(3_000));
    for (n, node) in cluster.nodes.iter().enumerate() {
        assert_eq!(node.view().epoch, Epoch(1), "node {n} changed view with no failure");
        assert!(node.holds_lease(cluster.now), "node {n} has no lease");
    }
    assert_eq!(cluster.nodes.iter().filter(|node| node.is_raft_leader()).count(), 1);
}

#[test]
fn a_crashed_node_is_removed_within_the_failover_bound() {
    for size in [3u8, 5] {
        let mut cluster = Cluster::new(size);
        cluster.run_for(Time::from_millis(1_000));
        let crash_at = cluster.now;
        let victim = (size - 1) as usize;
        cluster.crashed[victim] = true;
        cluster.run_for(Time::from_millis(3_000));
        for n in (0..size as usize).filter(|n| *n != victim) {
            let view = cluster.nodes[n].view();
            assert_eq!(view.epoch, Epoch(2), "size {size}: node {n} did not move on");
            assert!(!view.live.contains(NodeId(victim as u8)));
        }
        let installed = cluster.first_install_without(victim).expect("view installed");
        let bound = cluster.config.failover_bound() + Time::from_millis(100); // + a Raft round and election
        assert!(
            installed - crash_at <= bound,
            "size {size}: survivors moved on after {:?}, bound {:?}",
            installed - crash_at,
            bound
        );
    }
}

#[test]
fn a_leaving_node_is_dropped_at_once_and_nobody_loses_a_lease() {
    // Node 0 is the first Raft leader (the shortest election timeout); node 2 a follower.
    for leaver in [0usize, 2] {
        let mut cluster = Cluster::new(3);
        cluster.run_for(Time::from_millis(1_000));
        let asked_at = cluster.now;
        let mut out = MembershipOutbox::default();
        cluster.nodes[leaver].leave(asked_at, &mut out);
        cluster.perform(leaver, out);
        assert!(!cluster.nodes[leaver].holds_lease(asked_at), "a leaving node serves no more");
        assert!(!cluster.nodes[leaver].has_left());
        cluster.run_for(Time::from_millis(2_000));
        assert!(cluster.nodes[leaver].has_left());
        assert!(!cluster.nodes[leaver].holds_lease(cluster.now));
        let installed = cluster.first_install_without(leaver).expect("the others dropped it");
        // A removal would wait out the promise to the node (a lease after its last heartbeat,
        // which it sent just before asking); a leave waits for nothing but the Raft entry.
        assert!(
            installed - asked_at < cluster.config.lease,
            "leaver {leaver}: dropped after {:?}, the lease is {:?}",
            installed - asked_at,
            cluster.config.lease
        );
        for n in (0..3).filter(|n| *n != leaver) {
            let node = &cluster.nodes[n];
            assert!(!node.view().live.contains(NodeId(leaver as u8)));
            assert!(node.holds_lease(cluster.now), "node {n} lost its lease");
            assert_eq!(node.stats().lease_lapses, 0, "node {n}'s lease lapsed during the leave");
        }
    }
}

#[test]
fn a_crashed_raft_leader_is_removed_too() {
    let mut cluster = Cluster::new(3);
    cluster.run_for(Time::from_millis(1_000));
    let leader = cluster.nodes.iter().position(|node| node.is_raft_leader()).expect("a leader");
    cluster.crashed[leader] = true;
    cluster.run_for(Time::from_millis(3_000));
    for n in (0..3).filter(|n| *n != leader) {
        assert!(!cluster.nodes[n].view().live.contains(NodeId(leader as u8)));
    }
}

#[test]
fn a_partitioned_node_stops_serving_before_the_others_move_on() {
    // One-way partition: the victim still hears everyone, but nobody hears it. What it
    // hears does not keep its lease alive: only acknowledged heartbeats do.
    for size in [3u8, 5] {
        let mut cluster = Cluster::new(size);
        cluster.run_for(Time::from_millis(1_000));
        let victim = 0usize;
        for other in 1..size as usize {
            cluster.blocked[victim][other] = true;
        }
        let mut lease_lost_at = None;
        for _ in 0..3_000 {
            cluster.run_for(STEP);
            if lease_lost_at.is_none() && !cluster.nodes[victim].holds_lease(cluster.now) {
                lease_lost_at = Some(cluster.now);
            }
        }
        let lease_lost_at = lease_lost_at.expect("the victim's lease ran out");
        let moved_on_at = cluster.first_install_without(victim).expect("the others removed the victim");
        assert!(
            lease_lost_at < moved_on_at,
            "size {size}: lease lost at {lease_lost_at:?}, others moved on at {moved_on_at:?}"
        );
    }
}

#[test]
fn a_removed_node_is_not_granted_a_lease_after_the_partition_heals() {
    let mut cluster = Cluster::new(3);
    cluster.run_for(Time::from_millis(1_000));
    for other in 1..3 {
        cluster.blocked[0][other] = true;
        cluster.blocked[other][0] = true;
    }
    cluster.run_for(Time::from_millis(2_000));
    assert!(!cluster.nodes[1].view().live.contains(NodeId(0)));
    for other in 1..3 {
        cluster.blocked[0][other] = false;
        cluster.blocked[other][0] = false;
    }
    cluster.run_for(Time::from_millis(2_000));
    assert!(!cluster.nodes[0].holds_lease(cluster.now), "a removed node must not serve again");
    assert!(!cluster.nodes[0].view().live.contains(NodeId(0)), "it learns its removal from the log");
}

#[test]
fn a_restarted_node_recovers_its_term_vote_and_views_from_what_it_persisted() {
    let mut cluster = Cluster::new(3);
    cluster.run_for(Time::from_millis(1_000));
    cluster.crashed[2] = true;
    cluster.run_for(Time::from_millis(2_000));
    assert_eq!(cluster.nodes[0].decided_view().epoch, Epoch(2));
    let (term, vote) = cluster.nodes[0].raft_term_and_vote();
    // Node 0 loses its memory and comes back from its disk alone.
    let config = MembershipConfig { me: NodeId(0), ..cluster.config.clone() };
    cluster.nodes[0] = Membership::restore(config, cluster.now, &cluster.disks[0]);
    let (restored_term, restored_vote) = cluster.nodes[0].raft_term_and_vote();
    assert_eq!((restored_term, restored_vote), (term, vote), "one vote per term survives a restart");
    cluster.run_for(Time::from_millis(2_000));
    let view = cluster.nodes[0].decided_view();
    assert_eq!(view.epoch, Epoch(2), "the restarted node re-learns the decided views from its log");
    assert!(!view.live.contains(NodeId(2)));
    assert_eq!(cluster.nodes.iter().filter(|node| node.is_raft_leader()).count(), 1);
}

#[test]
fn a_removed_but_alive_node_cannot_lend_a_lease_to_another_node() {
    // Found by the network-namespace harness: node 0 is removed yet alive; then node 1 stops
    // hearing node 2. A lease from a majority of the configured members ({2, 0}) would let
    // node 2 serve while node 1, which never promised it anything, moves on alone.
    let mut cluster = Cluster::new(3);
    cluster.run_for(Time::from_millis(1_000));
    for other in 1..3 {
        cluster.blocked[0][other] = true;
        cluster.blocked[other][0] = true;
    }
    cluster.run_for(Time::from_millis(2_000));
    assert!(!cluster.nodes[1].view().live.contains(NodeId(0)), "node 0 removed first");
    for other in 1..3 {
        cluster.blocked[0][other] = false;
        cluster.blocked[other][0] = false;
    }
    cluster.blocked[2][1] = true;
    let mut lease_lost_at = None;
    for _ in 0..3_000 {
        cluster.run_for(STEP);
        if lease_lost_at.is_none() && !cluster.nodes[2].holds_lease(cluster.now) {
            lease_lost_at = Some(cluster.now);
        }
    }
    let moved_on =
        cluster.installed_at[1].iter().find(|(_, _, live)| !live.contains(NodeId(2))).map(|(at, _, _)| *at);
    if let Some(moved_on) = moved_on {
        let lease_lost_at = lease_lost_at.expect("node 2 lost its lease before node 1 moved on");
        assert!(
            lease_lost_at < moved_on,
            "node 2 served until {lease_lost_at:?}, node 1 moved on at {moved_on:?}"
        );
    }
}

fn isolate(cluster: &mut Cluster, node: usize) {
    for other in (0..cluster.nodes.len()).filter(|other| *other != node) {
        cluster.blocked[node][other] = true;
        cluster.blocked[other][node] = true;
    }
}

fn heal(cluster: &mut Cluster) {
    let size = cluster.nodes.len();
    cluster.blocked = vec![vec![false; size]; size];
}

#[test]
fn the_last_live_member_is_never_removed() {
    // Found by the network-namespace harness: nodes removed while alive stay Raft voters, so
    // a Raft majority can outlive the view. Shrink the view to one member that way, then
    // silence that member: the others must not remove it and leave an empty view.
    let mut cluster = Cluster::new(5);
    cluster.run_for(Time::from_millis(1_000));
    for node in [4, 3, 2, 1] {
        isolate(&mut cluster, node);
        cluster.run_for(Time::from_millis(2_000));
        heal(&mut cluster);
        cluster.run_for(Time::from_millis(500));
        assert!(!cluster.nodes[0].decided_view().live.contains(NodeId(node as u8)), "node {node} removed");
    }
    assert_eq!(cluster.nodes[0].decided_view().live, NodeSet::single(NodeId(0)));
    isolate(&mut cluster, 0);
    cluster.run_for(Time::from_millis(3_000));
    for node in 1..5 {
        let live = cluster.nodes[node].decided_view().live;
        assert_eq!(live, NodeSet::single(NodeId(0)), "node {node}: the last member stays");
    }
}

impl Cluster {
    /// Crash `node` and start it again at once from what it persisted, joining as `join`.
    fn restart(&mut self, node: usize, join: Option<u64>) {
        let config = MembershipConfig { me: NodeId(node as u8), join, ..self.config.clone() };
        self.nodes[node] = Membership::restore(config, self.now, &self.disks[node]);
        self.in_flight.retain(|(_, _, to, _)| to.index() != node);
    }

    /// When `node` first told its protocol a view after `since`.
    fn first_install_at(&self, node: usize, since: Time) -> Option<Time> {
        self.installed_at[node].iter().map(|(at, _, _)| *at).find(|at| *at > since)
    }
}

/// Hermes seed 16012: node 0, paused past its lease, was removed by node 1; node 1 then
/// crashed and restarted, and the first thing it handled was node 0's heartbeat, before its
/// log's views were applied again: it acknowledged it, so node 0 (whose view was {0, 1})
/// held a fresh lease and answered from stale state. A restarted node must know every view
/// its previous incarnation acted in before it answers anyone.
#[test]
fn a_restarted_node_never_acknowledges_a_member_its_log_removed() {
    let mut cluster = Cluster::new(3);
    cluster.run_for(Time::from_millis(1_000));
    isolate(&mut cluster, 0);
    cluster.run_for(Time::from_millis(2_000));
    assert!(!cluster.nodes[1].view().live.contains(NodeId(0)), "node 0 removed");
    heal(&mut cluster);
    for join in [None, Some(77)] {
        cluster.restart(1, join);
        let restarted = &cluster.nodes[1];
        assert!(!restarted.decided_view().live.contains(NodeId(0)), "the log is replayed at restore");
        let mut out = MembershipOutbox::default();
        let heartbeat = MembershipMessage::Heartbeat { seq: 9_999, epoch: 1 };
        cluster.nodes[1].on_message(cluster.now, NodeId(0), heartbeat, &mut out);
        let acknowledged = out.messages.iter().any(|(to, message)| {
            *to == NodeId(0) && matches!(message, MembershipMessage::HeartbeatAck { .. })
        });
        assert!(!acknowledged, "join {join:?}: a restarted node lent a lease to a node it had removed");
        cluster.run_for(Time::from_millis(1_500));
    }
}

/// Hermes seed 4123: node 1 removed node 2 (cut off, its installed view still {1, 2}), then
/// crashed; its `membership.log` failed its checksum and it was replaced by an empty joiner.
/// With no log, the newest view it knew was the cluster's first, which holds node 2: it
/// acknowledged node 2's heartbeat, and node 2 held a lease and served from stale state.
/// A node that starts without its Raft state knows nothing of what its previous incarnation
/// decided, so it acknowledges nobody until its own join is applied (by then it has applied
/// every entry committed before it, hence every view the old node acted in).
#[test]
fn a_node_started_without_its_log_acknowledges_nobody_until_its_join_is_applied() {
    let mut cluster = Cluster::new(3);
    cluster.run_for(Time::from_millis(1_000));
    isolate(&mut cluster, 0);
    cluster.run_for(Time::from_millis(2_000));
    assert!(!cluster.nodes[1].decided_view().live.contains(NodeId(0)), "node 0 removed");
    cluster.disks[1].clear();
    cluster.restart(1, Some(77));
    let acknowledges = |cluster: &mut Cluster, from: u8| {
        let mut out = MembershipOutbox::default();
        let heartbeat = MembershipMessage::Heartbeat { seq: 9_999, epoch: 1 };
        cluster.nodes[1].on_message(cluster.now, NodeId(from), heartbeat, &mut out);
        out.messages.iter().any(|(to, message)| {
            *to == NodeId(from) && matches!(message, MembershipMessage::HeartbeatAck { .. })
        })
    };
    assert!(!acknowledges(&mut cluster, 0), "an empty joiner lent a lease to a node its log had removed");
    assert!(!acknowledges(&mut cluster, 2), "an empty joiner acknowledged before it knew any decided view");
    cluster.run_for(Time::from_millis(2_000));
    assert!(!cluster.nodes[1].is_joining(), "the empty joiner is added again");
    assert!(!acknowledges(&mut cluster, 0), "node 0 is still out of the view");
    assert!(acknowledges(&mut cluster, 2), "once joined it acknowledges the members");
    for node in [1, 2] {
        assert!(cluster.nodes[node].holds_lease(cluster.now), "node {node} serves again");
    }
}

/// Promises are not persisted: a node that restarts may have acknowledged a heartbeat of a
/// node just before a view without that node was decided, so it must not act in such a view
/// before those promises would have run out, whether it comes back with its data (it stays
/// restarting) or joins (its join view waits). Without a removal in its log it acts at once.
#[test]
fn a_restarted_node_acts_in_no_view_without_a_node_before_its_previous_promises_run_out() {
    let promise = Time::from_millis(600 + 30);
    for join in [None, Some(5)] {
        let mut cluster = Cluster::new(3);
        cluster.run_for(Time::from_millis(1_000));
        isolate(&mut cluster, 0);
        while cluster.nodes[2].decided_view().live.contains(NodeId(0)) {
            cluster.run_for(STEP);
        }
        let restarted_at = cluster.now;
        cluster.restart(2, join);
        cluster.run_for(Time::from_millis(2_000));
        let first = cluster.first_install_at(2, restarted_at).expect("node 2 hears a view again");
        assert!(
            first >= restarted_at + promise,
            "join {join:?}: node 2 acted in a view without node 0 {:?} after restarting, before its promises ran out",
            first - restarted_at
        );
        assert!(!cluster.nodes[2].is_restarting() && !cluster.nodes[2].is_joining());
        assert!(cluster.nodes[2].holds_lease(cluster.now), "join {join:?}: node 2 serves again");
    }
    let mut cluster = Cluster::new(3);
    cluster.run_for(Time::from_millis(1_000));
    cluster.restart(2, None);
    assert!(!cluster.nodes[2].is_restarting(), "nothing to wait for: it acts in the view it had");
}

/// An empty joiner (its `membership.log` lost) that hears a leader must still not vote until
/// its own join is applied: if the leader dies before the log reached it, its empty log grants
/// any candidate, which could be a node missing entries the joiner's previous incarnation
/// helped commit. Here node `cut` is cut off and removed by `leader` and `joiner`; the joiner
/// is replaced by an empty one, hears the leader once, and the leader crashes. `cut` must not
/// be elected (its log lacks its own removal): the cluster waits for the leader to come back,
/// and then the removal stands and the joiner is added.
#[test]
fn an_empty_joiner_votes_for_nobody_until_its_join_is_applied_even_after_hearing_a_leader() {
    use raft::prelude::{Message, MessageType};
    let mut cluster = Cluster::new(3);
    cluster.run_for(Time::from_millis(1_000));
    let leader = cluster.nodes.iter().position(|node| node.is_raft_leader()).expect("a leader");
    let (joiner, cut) = ((leader + 1) % 3, (leader + 2) % 3);
    isolate(&mut cluster, cut);
    cluster.run_for(Time::from_millis(2_000));
    assert!(!cluster.nodes[leader].decided_view().live.contains(NodeId(cut as u8)), "removed");
    assert!(cluster.nodes[leader].is_raft_leader());
    cluster.disks[joiner].clear();
    cluster.restart(joiner, Some(77));
    isolate(&mut cluster, joiner);
    // The joiner hears the leader (a Raft heartbeat that commits nothing), then the leader dies.
    let (term, _) = cluster.nodes[leader].raft_term_and_vote();
    let mut heartbeat = Message::default();
    heartbeat.set_msg_type(MessageType::MsgHeartbeat);
    heartbeat.from = leader as u64 + 1;
    heartbeat.to = joiner as u64 + 1;
    heartbeat.term = term;
    let mut out = MembershipOutbox::default();
    cluster.nodes[joiner].on_message(
        cluster.now,
        NodeId(leader as u8),
        MembershipMessage::Raft(heartbeat),
        &mut out,
    );
    cluster.perform(joiner, out);
    cluster.crashed[leader] = true;
    heal(&mut cluster);
    cluster.run_for(Time::from_millis(3_000));
    assert!(!cluster.nodes[cut].is_raft_leader(), "a node missing committed entries was elected");
    assert!(cluster.nodes[joiner].is_joining(), "nobody could add the joiner without the leader");
    // The leader comes back with its log: the removal stands and the joiner is added.
    cluster.crashed[leader] = false;
    cluster.restart(leader, None);
    cluster.run_for(Time::from_millis(3_000));
    assert!(!cluster.nodes[joiner].is_joining(), "the joiner is added once the leader is back");
    for node in [leader, joiner] {
        let live = cluster.nodes[node].decided_view().live;
        assert!(!live.contains(NodeId(cut as u8)), "node {node}: the removal of node {cut} was lost");
    }
}
