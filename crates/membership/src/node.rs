//! The membership node: one per replica, driven by the runtime like a protocol core.

use std::collections::VecDeque;

use chorus_core::{Epoch, NodeId, NodeSet, Time, View};
use raft::prelude::{Entry, EntryType, MessageType};
use raft::storage::MemStorage;
use raft::{RawNode, StateRole};

use crate::message::MembershipMessage;

#[derive(Clone, Debug)]
pub struct MembershipConfig {
    pub me: NodeId,
    /// The cluster: Raft voters, and the first view's live set.
    pub members: NodeSet,
    pub heartbeat_period: Time,
    /// A live node that misses this many heartbeat periods is suspected.
    pub missed_heartbeats_max: u32,
    /// How long a majority-acknowledged heartbeat keeps its sender serving.
    pub lease: Time,
    /// Added to every promise: covers clock-rate drift between nodes over one lease.
    pub drift_margin: Time,
    pub raft_tick_period: Time,
    /// §3.4 Recovery: start by asking to be added to the view, as the node with this
    /// incarnation (unique per start of this node id). A node that starts without its data
    /// (a restart, a new machine) must join; the first nodes of a new cluster do not.
    pub join: Option<u64>,
    /// Ask to rejoin after being removed while alive (a partition, a long pause). Only for
    /// protocols whose cores copy the data to a joiner (Hermes, CRAQ); others stay out once
    /// removed.
    pub rejoin: bool,
}

impl MembershipConfig {
    /// Defaults: suspicion after 6 x 50 ms, a 600 ms lease and a 30 ms margin, so a dead
    /// node is removed, and the survivors serve writes again, within about 0.7 s. A shorter
    /// lease lapsed under a saturating redis-benchmark on 2 cores, when acknowledgements
    /// queued behind the request backlog.
    pub fn new(me: NodeId, members: NodeSet) -> MembershipConfig {
        MembershipConfig {
            me,
            members,
            heartbeat_period: Time::from_millis(50),
            missed_heartbeats_max: 6,
            lease: Time::from_millis(600),
            drift_margin: Time::from_millis(30),
            raft_tick_period: Time::from_millis(10),
            join: None,
            rejoin: false,
        }
    }

    /// The longest a client can see writes stall after a node dies: detection, then the
    /// promise to the dead node running out.
    pub fn failover_bound(&self) -> Time {
        let detection =
            Time::from_nanos(self.heartbeat_period.as_nanos() * self.missed_heartbeats_max as u64);
        detection.max(self.lease + self.drift_margin) + self.heartbeat_period
    }
}

/// How a decided view differs from the one before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Change {
    Remove(NodeId),
    /// The node asked to be removed for a planned stop, after giving up its lease: nobody
    /// waits on a promise to it.
    Leave(NodeId),
    Join {
        node: NodeId,
        incarnation: u64,
    },
}

/// This node is asking to be added (§3.4 Recovery).
#[derive(Clone, Copy, Debug)]
struct Joining {
    incarnation: u64,
    /// The log has decided our join: stop asking.
    decided: bool,
    next_request: Time,
}

/// First byte of a join entry; removals are 9 bytes without a tag.
const JOIN_ENTRY_TAG: u8 = 0x4A;
const JOIN_ENTRY_BYTES: usize = 18;
/// "This joined node has copied all the data": [tag, node, incarnation (8)].
const CAUGHT_UP_ENTRY_TAG: u8 = 0x43;
const CAUGHT_UP_ENTRY_BYTES: usize = 10;
/// "This node leaves for a planned stop and serves no more": [tag, node, epoch (8)].
const LEAVE_ENTRY_TAG: u8 = 0x4C;
const LEAVE_ENTRY_BYTES: usize = 10;

/// Something the runtime must act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MembershipEvent {
    /// Hand this view to the protocol core (`Replica::on_view`).
    ViewInstalled(View),
}

/// Raft state that must be durable before this outbox's messages leave: Raft's safety (one
/// vote per term, no acknowledged entry forgotten) depends on it across restarts.
#[derive(Clone, Debug, PartialEq)]
pub enum PersistRecord {
    HardState {
        term: u64,
        vote: u64,
        commit: u64,
    },
    /// Entries to append; any existing entries from the first one's index on are replaced.
    Entries(Vec<Entry>),
}

#[derive(Default, Debug)]
pub struct MembershipOutbox {
    /// Write these durably, in order, before sending `messages`.
    pub persist: Vec<PersistRecord>,
    pub messages: Vec<(NodeId, MembershipMessage)>,
    pub events: Vec<MembershipEvent>,
}

/// Lease health, for INFO and for measuring the transport's priority lane.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MembershipStats {
    /// Times this node's lease ran out while it was a live member.
    pub lease_lapses: u64,
    /// Heartbeats whose last acknowledgement arrived, and the slowest round trip.
    pub heartbeats_acknowledged: u64,
    pub heartbeat_round_trip_max: Time,
    /// Round trips longer than a quarter of the lease.
    pub heartbeats_slow: u64,
}

struct SentHeartbeat {
    seq: u64,
    sent_at: Time,
    acks: NodeSet,
}

pub struct Membership {
    config: MembershipConfig,
    raft: RawNode<MemStorage>,
    next_raft_tick: Time,
    /// The newest view the Raft log has decided.
    decided: View,
    /// Views decided but not installed yet: each waits until this node's promise to the
    /// node it removes has run out.
    /// A removal carries this node's promise to the removed node as it stood when the removal
    /// was decided: once a node rejoins, promises to its new incarnation concern later views.
    to_install: VecDeque<(View, Change, Time)>,
    /// The view this node acts in.
    installed: View,
    lease_until: Option<Time>,
    heartbeat_seq: u64,
    next_heartbeat: Time,
    heartbeats_sent: VecDeque<SentHeartbeat>,
    last_heard: [Time; NodeId::COUNT_MAX],
    promised_until: [Time; NodeId::COUNT_MAX],
    removal_proposed: [Option<(Epoch, Time)>; NodeId::COUNT_MAX],
    /// Set while this node asks to be added, until it installs the view that adds it. Until
    /// then the protocol hears of no view: it must not act in epochs before its join.
    joining: Option<Joining>,
    /// How many times this process has rejoined after being removed (new incarnations).
    rejoins: u64,
    /// Members of this node's join view it has not yet heard a heartbeat from sent in that
    /// view or later. Such a member may still hold a lease granted before it knew of us, so
    /// we never install its removal on our own promise alone (docs/membership.md, joins).
    unsettled: NodeSet,
    /// Nodes whose rejoin was applied after our join entry and before we installed our join
    /// view: they start out settled (see `settle_rejoined`).
    rejoined_since_join: NodeSet,
    /// The epoch of the view that added this node (0: one of the cluster's first members).
    joined_epoch: u64,
    /// The highest installed epoch each node's heartbeats announced.
    heard_epoch: [u64; NodeId::COUNT_MAX],
    /// Since when the front of `to_install` has waited only on `unsettled`.
    stuck_since: Option<Time>,
    left_proposed_at: Option<Time>,
    /// Raft-decided: the last join incarnation applied per node (a duplicate is ignored).
    joined_incarnation: [u64; NodeId::COUNT_MAX],
    join_proposed: [Option<(u64, Time)>; NodeId::COUNT_MAX],
    /// Raft-decided: live members that hold all the data (every first member; a joined node
    /// once its caught-up entry is applied). A removal that would leave none is refused:
    /// the data would exist only on nodes outside the view.
    complete: NodeSet,
    /// Our join is installed and our protocol has caught up, but the log does not say so
    /// yet: when to propose it again.
    caught_up_proposed_at: Option<Time>,
    stats: MembershipStats,
    leased_at_last_tick: bool,
    /// Set by [`Membership::leave`]: no more leases, no rejoin; when the leave entry was last
    /// proposed.
    leaving: Option<Option<Time>>,
    /// A node restarted with its data (not joining) tells its protocol no view until it has
    /// installed the views its log restored, which waits out, where a view removes a node, the
    /// promises its previous incarnation may have made (they are not on disk); at the latest
    /// until this time (see [`Membership::is_restarting`]).
    restarting_until: Option<Time>,
    /// What replaying the restored log produced before the first call: handed out then.
    restored_out: MembershipOutbox,
    /// Started without Raft state to join: no vote until its own join is applied
    /// (`withholds_vote`).
    votes_withheld: bool,
    /// Started without Raft state to join: it knows none of the views its previous
    /// incarnation decided, so it acknowledges no heartbeat until its own join is applied
    /// (`on_heartbeat`).
    acks_withheld: bool,
}

/// Raft ids must be non-zero.
fn raft_id(node: NodeId) -> u64 {
    node.0 as u64 + 1
}

fn node_of(raft_id: u64) -> Option<NodeId> {
    u8::try_from(raft_id.checked_sub(1)?).ok().map(NodeId)
}

impl Membership {
    pub fn new(config: MembershipConfig, now: Time) -> Membership {
        Membership::restore(config, now, &[])
    }

    /// Rebuild a node from the records a previous incarnation persisted (all of them, in
    /// order). Views decided by the restored log are applied again as Raft re-delivers the
    /// committed entries.
    pub fn restore(config: MembershipConfig, now: Time, records: &[PersistRecord]) -> Membership {
        assert!(config.members.contains(config.me), "a node is a member of its own cluster");
        let voters: Vec<u64> = config.members.iter().map(raft_id).collect();
        let raft = crate::raft_io::restore(raft_id(config.me), config.me.index(), voters, records);
        let view = View { epoch: Epoch(1), live: config.members };
        // Promises are not persisted. A restarted node may have promised anyone a full lease
        // just before it died, and a joining one may be a node whose earlier incarnation did,
        // so either honours that until one lease after it starts.
        let restart_promise = if records.is_empty() && config.join.is_none() {
            Time::ZERO
        } else {
            now + config.lease + config.drift_margin
        };
        let mut node = Membership {
            next_raft_tick: now + config.raft_tick_period,
            next_heartbeat: now,
            raft,
            decided: view,
            to_install: VecDeque::new(),
            installed: view,
            lease_until: None,
            heartbeat_seq: 0,
            heartbeats_sent: VecDeque::new(),
            last_heard: [now; NodeId::COUNT_MAX],
            promised_until: [restart_promise; NodeId::COUNT_MAX],
            removal_proposed: [None; NodeId::COUNT_MAX],
            joining: config.join.map(|incarnation| Joining {
                incarnation,
                decided: false,
                next_request: now,
            }),
            rejoins: 0,
            unsettled: NodeSet::EMPTY,
            rejoined_since_join: NodeSet::EMPTY,
            joined_epoch: 0,
            heard_epoch: [0; NodeId::COUNT_MAX],
            stuck_since: None,
            left_proposed_at: None,
            joined_incarnation: [0; NodeId::COUNT_MAX],
            join_proposed: [None; NodeId::COUNT_MAX],
            complete: config.members,
            caught_up_proposed_at: None,
            stats: MembershipStats::default(),
            leased_at_last_tick: false,
            leaving: None,
            restarting_until: None,
            restored_out: MembershipOutbox::default(),
            votes_withheld: records.is_empty() && config.join.is_some(),
            acks_withheld: records.is_empty() && config.join.is_some(),
            config,
        };
        if !records.is_empty() {
            node.replay_restored_log(now);
        }
        node
    }

    /// Apply what the restored log says was committed before this node does anything else.
    /// Its previous incarnation acted in every view up to its durable commit index (the hard
    /// state is synced before anything that depended on it leaves), so until the log is
    /// replayed this node would act on views older than its own past: acknowledge a heartbeat
    /// of a member it had itself removed and thereby lend that member, paused past its lease
    /// and serving from stale state, a fresh lease (simulator seed 16012 of hermes). A node
    /// coming back with its data (not joining) then stays restarting until its previous
    /// incarnation's promises have run out.
    fn replay_restored_log(&mut self, now: Time) {
        let mut out = MembershipOutbox::default();
        if self.joining.is_none() {
            self.restarting_until = Some(now + self.config.lease + self.config.drift_margin);
        }
        self.handle_ready(&mut out);
        self.install_due_views(now, &mut out);
        self.restored_out = out;
    }

    /// Hand out what replaying the restored log produced (once, before anything newer).
    fn take_restored_out(&mut self, out: &mut MembershipOutbox) {
        if self.restored_out.persist.is_empty()
            && self.restored_out.messages.is_empty()
            && self.restored_out.events.is_empty()
        {
            return;
        }
        let mut restored = std::mem::take(&mut self.restored_out);
        restored.persist.append(&mut out.persist);
        restored.messages.append(&mut out.messages);
        restored.events.append(&mut out.events);
        *out = restored;
    }

    /// Restarted with its data and still installing the views its log restored: the runtime
    /// must keep the protocol from acting (no view, no messages, no clients) until this turns
    /// false, when the membership hands it the view it starts in. A
    /// protocol core built from its files starts in the cluster's first view; acting in it
    /// would mean acting in a view older than its own data.
    pub fn is_restarting(&self) -> bool {
        self.restarting_until.is_some()
    }

    /// Still asking to be added, or added but not yet installed in the joining view.
    pub fn is_joining(&self) -> bool {
        self.joining.is_some()
    }

    /// What this node would find on disk if it crashed now: the Raft hard state and log
    /// (the simulator restarts nodes from it).
    pub fn durable_records(&self) -> Vec<PersistRecord> {
        crate::raft_io::durable_records(&self.raft)
    }

    pub fn me(&self) -> NodeId {
        self.config.me
    }

    pub fn view(&self) -> View {
        self.installed
    }

    /// Until when this node may serve. `None`: no lease yet.
    pub fn lease_until(&self) -> Option<Time> {
        self.lease_until
    }

    pub fn holds_lease(&self, now: Time) -> bool {
        self.lease_until.is_some_and(|until| now < until)
    }

    /// The Raft term and the vote cast in it (a Raft id, 0 for none), as persisted.
    pub fn raft_term_and_vote(&self) -> (u64, u64) {
        (self.raft.raft.term, self.raft.raft.vote)
    }

    /// The newest view the log has decided (installed or waiting to be).
    pub fn decided_view(&self) -> View {
        self.decided
    }

    pub fn is_raft_leader(&self) -> bool {
        self.raft.raft.state == StateRole::Leader
    }

    pub fn stats(&self) -> MembershipStats {
        self.stats
    }

    /// Leave the view for a planned stop (SIGTERM, SHUTDOWN). This node gives up its lease at
    /// once (the runtime must tell its protocol, which then serves no read) and asks, through
    /// the Raft log, to be removed; because it has stopped serving before the request exists,
    /// the others install the view without it as soon as the entry is applied, without
    /// waiting for failure detection or for their promises to it. It keeps acknowledging
    /// heartbeats meanwhile, so their leases never depend on a node that went quiet. The
    /// request is repeated until [`Membership::has_left`]. Never undone in this process.
    pub fn leave(&mut self, now: Time, out: &mut MembershipOutbox) {
        self.take_restored_out(out);
        self.lease_until = None;
        if self.leaving.is_none() {
            self.leaving = Some(None);
        }
        self.propose_leave_if_due(now);
        self.handle_ready(out);
    }

    /// This node is not (or no longer) a member of the view it acts in: it left, was removed,
    /// or never finished joining. A leaving node may stop once this holds.
    pub fn has_left(&self) -> bool {
        let me = self.config.me;
        // The last live member is never removed: once it stops serving there is nobody to
        // hand over to, and nothing to wait for.
        let last = self.leaving.is_some() && self.installed.live.without(me).is_empty();
        self.joining.is_some() || !self.installed.live.contains(me) || last
    }

    fn propose_leave_if_due(&mut self, now: Time) {
        let me = self.config.me;
        let Some(proposed_at) = self.leaving else { return };
        let retry = self.config.heartbeat_period + self.config.heartbeat_period;
        if self.has_left()
            || !self.decided.live.contains(me)
            || proposed_at.is_some_and(|at| now < at + retry)
        {
            return;
        }
        let mut data = vec![LEAVE_ENTRY_TAG, me.0];
        data.extend_from_slice(&self.decided.epoch.0.to_le_bytes());
        // A follower forwards it to the leader; without a leader it is dropped and retried.
        let _ = self.raft.propose(vec![], data);
        self.leaving = Some(Some(now));
    }

    /// How many times this process rejoined after being removed while alive.
    pub fn rejoins(&self) -> u64 {
        self.rejoins
    }

    pub fn on_tick(&mut self, now: Time, out: &mut MembershipOutbox) {
        self.take_restored_out(out);
        let leased = self.holds_lease(now);
        if self.leased_at_last_tick && !leased && self.installed.live.contains(self.config.me) {
            self.stats.lease_lapses += 1;
        }
        self.leased_at_last_tick = leased;
        while now >= self.next_raft_tick {
            self.raft.tick();
            self.next_raft_tick = self.next_raft_tick + self.config.raft_tick_period;
        }
        if now >= self.next_heartbeat {
            self.send_heartbeats(now, out);
            self.next_heartbeat = now + self.config.heartbeat_period;
        }
        if self.is_raft_leader() {
            self.propose_removals(now);
        }
        self.propose_leave_if_due(now);
        self.request_join_if_due(now, out);
        self.handle_ready(out);
        self.install_due_views(now, out);
    }

    pub fn on_message(
        &mut self,
        now: Time,
        from: NodeId,
        message: MembershipMessage,
        out: &mut MembershipOutbox,
    ) {
        if !self.config.members.contains(from) {
            return; // Not one of ours: the transport's handshake should have refused it.
        }
        self.take_restored_out(out);
        match message {
            MembershipMessage::Raft(mut message) => {
                // A replacement machine that lost `membership.log` has an empty Raft log, and a
                // leader that still counts its old progress sends heartbeats committing past
                // its end, on which raft-rs panics. A heartbeat commits nothing the log does
                // not hold: clamp it.
                let last_index = self.raft.raft.raft_log.last_index();
                if message.get_msg_type() == MessageType::MsgHeartbeat && message.get_commit() > last_index {
                    message.set_commit(last_index);
                }
                // The leader hears of the loss as a rejection hinting at a log shorter than
                // what the follower had acknowledged, which raft-rs takes for a stale message
                // and ignores forever. Forget the lost part and probe from the real end (only
                // lowers what the leader counts: commits can be later, never wrong).
                if message.get_msg_type() == MessageType::MsgAppendResponse && message.get_reject() {
                    let hint = message.get_reject_hint();
                    if let Some(progress) = self.raft.raft.mut_prs().get_mut(message.get_from()) {
                        if hint < progress.matched {
                            progress.matched = hint;
                            progress.become_probe();
                        }
                    }
                }
                if self.withholds_vote(&message) {
                    return;
                }
                // A malformed or stale message is the sender's problem, not a reason to stop.
                let _ = self.raft.step(message);
            }
            MembershipMessage::Heartbeat { seq, epoch } => self.on_heartbeat(now, from, seq, epoch, out),
            MembershipMessage::HeartbeatAck { seq } => self.on_heartbeat_ack(now, from, seq),
            MembershipMessage::JoinRequest { incarnation } => self.on_join_request(now, from, incarnation),
        }
        self.handle_ready(out);
        self.install_due_views(now, out);
    }

    /// A node that starts without its Raft state but joins (a replacement machine, or a
    /// restart whose `membership.log` was empty) may be standing in for a node whose log held
    /// entries a majority needed to commit: voting with an empty log could elect a leader that
    /// lacks them, and raft-rs would then overwrite them (the simulator found it, replacing a
    /// node whose log failed its checksum: a view decided on a majority that included the old
    /// log vanished). Nor does it know what the old node voted for. So it answers no vote
    /// request until its own join entry is applied: that entry follows every entry committed
    /// before it started, so its log then holds them all. Hearing a leader is not enough: if
    /// that leader dies before the log reached the joiner, the joiner's vote (an empty log
    /// grants any candidate) could elect a node that lacks committed entries.
    fn withholds_vote(&self, message: &raft::prelude::Message) -> bool {
        self.votes_withheld
            && matches!(message.get_msg_type(), MessageType::MsgRequestVote | MessageType::MsgRequestPreVote)
    }

    // ------------------------------------------------------------------ leases

    fn send_heartbeats(&mut self, now: Time, out: &mut MembershipOutbox) {
        self.heartbeat_seq += 1;
        let seq = self.heartbeat_seq;
        self.heartbeats_sent.push_back(SentHeartbeat {
            seq,
            sent_at: now,
            acks: NodeSet::single(self.config.me),
        });
        // Acknowledgements older than a lease cannot extend it any more.
        while self.heartbeats_sent.front().is_some_and(|sent| sent.sent_at + self.config.lease < now) {
            self.heartbeats_sent.pop_front();
        }
        for member in self.config.members.without(self.config.me).iter() {
            out.messages.push((member, MembershipMessage::Heartbeat { seq, epoch: self.installed.epoch.0 }));
        }
        self.grant_lease_if_all_acknowledged(seq);
    }

    fn on_heartbeat(&mut self, now: Time, from: NodeId, seq: u64, epoch: u64, out: &mut MembershipOutbox) {
        self.last_heard[from.index()] = now;
        let heard = &mut self.heard_epoch[from.index()];
        *heard = (*heard).max(epoch);
        if self.joining.is_none() && epoch >= self.joined_epoch {
            // `from` has installed our join view (or a later one): its leases need us now.
            self.unsettled.remove(from);
        }
        // Only a node that is still live in the newest decided view gets a promise: a node
        // being removed must let its lease run out, or the removal could never be installed.
        // A node that lost its log knows no decided view until its join is applied: the
        // cluster's first view it starts with may hold a node its previous incarnation removed
        // (hermes seed 4123: that node, cut off in a view of just the two of them, got a
        // lease and served from stale state).
        if self.acks_withheld || !self.decided.live.contains(from) {
            return;
        }
        let promise = now + self.config.lease + self.config.drift_margin;
        self.promised_until[from.index()] = self.promised_until[from.index()].max(promise);
        out.messages.push((from, MembershipMessage::HeartbeatAck { seq }));
    }

    fn on_heartbeat_ack(&mut self, now: Time, from: NodeId, seq: u64) {
        let others = self.installed.live.without(self.config.me);
        if let Some(sent) = self.heartbeats_sent.iter_mut().find(|sent| sent.seq == seq) {
            let complete_before = sent.acks.is_superset_of(others);
            sent.acks.insert(from);
            if !complete_before && sent.acks.is_superset_of(others) {
                let round_trip = now.saturating_sub(sent.sent_at);
                self.stats.heartbeats_acknowledged += 1;
                self.stats.heartbeat_round_trip_max = self.stats.heartbeat_round_trip_max.max(round_trip);
                if round_trip.as_nanos() * 4 > self.config.lease.as_nanos() {
                    self.stats.heartbeats_slow += 1;
                }
            }
        }
        self.grant_lease_if_all_acknowledged(seq);
    }

    /// A lease needs an acknowledgement from every other live member of this node's installed
    /// view, not just a majority of the cluster. Views only shrink, so every member of any
    /// later view that drops this node has promised it and waits out the promise before
    /// installing. A majority of the configured members could instead be this node plus
    /// members already removed, none of whom gate the new view's writes. The network-
    /// namespace harness found exactly that: node 0 removed but alive kept lending node 2 a
    /// lease while node 1 moved on alone.
    fn grant_lease_if_all_acknowledged(&mut self, seq: u64) {
        let others = self.installed.live.without(self.config.me);
        let Some(sent) = self.heartbeats_sent.iter().find(|sent| sent.seq == seq) else { return };
        if self.leaving.is_some() {
            return; // A leaving node serves no more: its leave entry relies on it.
        }
        if self.installed.live.contains(self.config.me) && sent.acks.is_superset_of(others) {
            let until = sent.sent_at + self.config.lease;
            self.lease_until = Some(self.lease_until.map_or(until, |current| current.max(until)));
        }
    }

    // ------------------------------------------------------------------ views

    fn propose_removals(&mut self, now: Time) {
        let silence_max = Time::from_nanos(
            self.config.heartbeat_period.as_nanos() * self.config.missed_heartbeats_max as u64,
        );
        let epoch = self.decided.epoch;
        if self.decided.live.len() <= 1 {
            return; // The last live member stays, however silent: an empty view serves no one.
        }
        for node in self.decided.live.without(self.config.me).iter() {
            let silent = now.saturating_sub(self.last_heard[node.index()]) > silence_max;
            let promise_expired = now >= self.promised_until[node.index()];
            // Re-propose at most once a lease per epoch: a proposal can be lost with a leader.
            let recently = self.removal_proposed[node.index()]
                .is_some_and(|(at_epoch, at)| at_epoch == epoch && now < at + self.config.lease);
            if silent && promise_expired && !recently {
                let mut data = vec![node.0];
                data.extend_from_slice(&epoch.0.to_le_bytes());
                if self.raft.propose(vec![], data).is_ok() {
                    self.removal_proposed[node.index()] = Some((epoch, now));
                }
            }
        }
    }

    // ------------------------------------------------------------------ joins (§3.4)

    fn request_join_if_due(&mut self, now: Time, out: &mut MembershipOutbox) {
        let Some(joining) = &mut self.joining else { return };
        if joining.decided || now < joining.next_request {
            return;
        }
        joining.next_request = now + self.config.heartbeat_period;
        let incarnation = joining.incarnation;
        if self.is_raft_leader() {
            // Nobody else would propose it: requests go to the leader, and that is us.
            self.on_join_request(now, self.config.me, incarnation);
        }
        for member in self.config.members.without(self.config.me).iter() {
            out.messages.push((member, MembershipMessage::JoinRequest { incarnation }));
        }
    }

    fn on_join_request(&mut self, now: Time, from: NodeId, incarnation: u64) {
        if !self.is_raft_leader() || self.joined_incarnation[from.index()] == incarnation {
            return;
        }
        // One proposal per heartbeat period: the joiner repeats its request until decided.
        let recently = self.join_proposed[from.index()]
            .is_some_and(|(proposed, at)| proposed == incarnation && now < at + self.config.heartbeat_period);
        if recently {
            return;
        }
        let mut data = vec![JOIN_ENTRY_TAG, from.0];
        data.extend_from_slice(&self.decided.epoch.0.to_le_bytes());
        data.extend_from_slice(&incarnation.to_le_bytes());
        if self.raft.propose(vec![], data).is_ok() {
            self.join_proposed[from.index()] = Some((incarnation, now));
        }
    }

    fn apply_join(&mut self, data: &[u8]) {
        let node = NodeId(data[1]);
        let epoch = Epoch(u64::from_le_bytes(data[2..10].try_into().expect("8 bytes")));
        let incarnation = u64::from_le_bytes(data[10..18].try_into().expect("8 bytes"));
        // A proposal made against an older view is stale (a duplicate of an applied join is
        // one too), exactly as for removals.
        if epoch != self.decided.epoch
            || node.index() >= NodeId::COUNT_MAX
            || !self.config.members.contains(node)
            || self.joined_incarnation[node.index()] == incarnation
        {
            return;
        }
        self.joined_incarnation[node.index()] = incarnation;
        self.settle_rejoined(node);
        self.complete.remove(node);
        let mut live = self.decided.live;
        live.insert(node);
        self.decided = View { epoch: Epoch(epoch.0 + 1), live };
        let mut promised_until = Time::ZERO;
        if let Some(joining) = &mut self.joining {
            if node == self.config.me && incarnation == joining.incarnation {
                joining.decided = true;
                // Our join entry follows every entry committed before we started, so we
                // have now applied every view our previous incarnation acted in, and our
                // log holds every entry it may have helped commit: we may vote again.
                self.acks_withheld = false;
                self.votes_withheld = false;
                promised_until = self.promises_to_nodes_outside(live);
            }
        }
        self.to_install.push_back((self.decided, Change::Join { node, incarnation }, promised_until));
    }

    /// `node` rejoins in a view decided after our own join: its new incarnation acts only from
    /// that view on, which holds us (its leases need our acknowledgement), and its earlier one
    /// acts no more (it was restarted, or learnt its removal first). So `node` holds no lease
    /// granted before it knew of us: it is settled, even if its earlier incarnation died
    /// before announcing our join view (then nothing else would ever settle it, and a member
    /// that cannot leave because it alone holds all the data would wait forever).
    fn settle_rejoined(&mut self, node: NodeId) {
        if node == self.config.me {
            return;
        }
        match &self.joining {
            None => {
                self.unsettled.remove(node);
            }
            // Our join is decided, not yet installed: keep it out of the set then.
            Some(joining) if joining.decided => self.rejoined_since_join.insert(node),
            Some(_) => {} // Its join precedes ours: its view does not hold us.
        }
    }

    /// Until when this node has promised any node outside `live` not to act in a view without
    /// it. A joining node installs its join view, the first it acts in, only after that: its
    /// promises as it stood when the join was decided, which include those a restart inherits
    /// from the previous incarnation (as removals carry theirs).
    fn promises_to_nodes_outside(&self, live: NodeSet) -> Time {
        self.config
            .members
            .iter()
            .filter(|node| !live.contains(*node))
            .map(|node| self.promised_until[node.index()])
            .max()
            .unwrap_or(Time::ZERO)
    }

    /// Our protocol holds all the data: record it in the log (retried every heartbeat
    /// period until applied), so removals may leave us as the view's only complete member.
    pub fn note_caught_up(&mut self, now: Time) {
        let me = self.config.me;
        let incarnation = self.joined_incarnation[me.index()];
        if self.joining.is_some() || self.complete.contains(me) || !self.decided.live.contains(me) {
            return;
        }
        let due = self.caught_up_proposed_at.is_none_or(|at| now >= at + self.config.heartbeat_period);
        if due {
            let mut data = vec![CAUGHT_UP_ENTRY_TAG, me.0];
            data.extend_from_slice(&incarnation.to_le_bytes());
            // Followers forward proposals to the leader; a dropped one is retried.
            let _ = self.raft.propose(vec![], data);
            self.caught_up_proposed_at = Some(now);
        }
    }

    fn apply_caught_up(&mut self, data: &[u8]) {
        let node = NodeId(data[1]);
        let incarnation = u64::from_le_bytes(data[2..10].try_into().expect("8 bytes"));
        if node.index() < NodeId::COUNT_MAX
            && self.decided.live.contains(node)
            && self.joined_incarnation[node.index()] == incarnation
        {
            self.complete.insert(node);
        }
    }

    fn apply(&mut self, entry: &Entry) {
        if entry.get_entry_type() != EntryType::EntryNormal {
            return;
        }
        if entry.data.len() == CAUGHT_UP_ENTRY_BYTES && entry.data[0] == CAUGHT_UP_ENTRY_TAG {
            self.apply_caught_up(&entry.data);
            return;
        }
        if entry.data.len() == JOIN_ENTRY_BYTES && entry.data[0] == JOIN_ENTRY_TAG {
            self.apply_join(&entry.data);
            return;
        }
        let (node, epoch, change) = match entry.data.len() {
            9 => {
                let node = NodeId(entry.data[0]);
                (node, &entry.data[1..9], Change::Remove(node))
            }
            LEAVE_ENTRY_BYTES if entry.data[0] == LEAVE_ENTRY_TAG => {
                let node = NodeId(entry.data[1]);
                (node, &entry.data[2..10], Change::Leave(node))
            }
            _ => return, // Leader no-ops and anything else carry no view change.
        };
        let epoch = Epoch(u64::from_le_bytes(epoch.try_into().expect("8 bytes")));
        // Proposals made against an older view are stale: the decision is deterministic at
        // every member because it only depends on the log.
        if epoch != self.decided.epoch
            || !self.decided.live.contains(node)
            || node.index() >= NodeId::COUNT_MAX
        {
            return;
        }
        // Checked when applied, so every member decides alike: never remove the last member,
        // nor the last one holding all the data (a joined node still copying does not).
        let remaining = self.decided.live.without(node);
        let complete_remaining = NodeSet::from_bits(remaining.bits() & self.complete.bits());
        if self.decided.live.len() <= 1 || complete_remaining.is_empty() {
            return;
        }
        self.complete.remove(node);
        self.decided = View { epoch: Epoch(epoch.0 + 1), live: self.decided.live.without(node) };
        let promised_until = match change {
            Change::Leave(_) => Time::ZERO,
            _ => self.promised_until[node.index()],
        };
        self.to_install.push_back((self.decided, change, promised_until));
    }

    fn install_due_views(&mut self, now: Time, out: &mut MembershipOutbox) {
        let me = self.config.me;
        if self.joining.is_none() && !self.decided.live.contains(me) && self.installed.live.contains(me) {
            // We are out: stop at once. Waiting on promises is for those who stay.
            self.to_install.clear();
            self.install(self.decided, None, out);
        }
        while let Some(&(view, change, promised_until)) = self.to_install.front() {
            match change {
                Change::Remove(removed) => {
                    // A joining node installs every view before its own at once: it acts in none.
                    let waits = self.joining.is_none()
                        && removed != me
                        && (now < promised_until || self.unsettled.contains(removed));
                    if waits {
                        self.escape_if_stuck(now, promised_until);
                        break;
                    }
                }
                // Our own join: the first view we act in waits out our promises to the nodes
                // it leaves out (ZERO for every other change).
                Change::Join { .. } if now < promised_until => break,
                _ => {}
            }
            self.stuck_since = None;
            self.to_install.pop_front();
            self.install(view, Some(change), out);
        }
        self.finish_restart_if_due(now, out);
    }

    /// A node restarted with its data starts acting once every view it restored is installed
    /// (each removal among them waits out the previous incarnation's promises, which is all
    /// that acting in a view can break), or at the latest once those promises ran out: the
    /// protocol hears the view it acts in.
    fn finish_restart_if_due(&mut self, now: Time, out: &mut MembershipOutbox) {
        let Some(until) = self.restarting_until else { return };
        if self.joining.is_some() || (now < until && !self.to_install.is_empty()) {
            return;
        }
        self.restarting_until = None;
        out.events.push(MembershipEvent::ViewInstalled(self.installed));
    }

    fn install(&mut self, view: View, change: Option<Change>, out: &mut MembershipOutbox) {
        let me = self.config.me;
        self.installed = view;
        if let Some(Change::Remove(removed) | Change::Leave(removed)) = change {
            self.unsettled.remove(removed);
        }
        if self.restarting_until.is_some() {
            if view.live.contains(me) {
                return; // Told once the restart is over (`finish_restart_if_due`).
            }
            // Removed while away: the protocol hears it at once (it then serves nothing).
            self.restarting_until = None;
        }
        if let Some(joining) = self.joining {
            let mine = change == Some(Change::Join { node: me, incarnation: joining.incarnation });
            if !mine {
                return; // Not our epoch yet: the protocol hears of no view before its join.
            }
            self.joining = None;
            self.left_proposed_at = None;
            // Members that have not yet announced this view may hold leases granted before
            // they knew of us; we learn otherwise from their heartbeats.
            let installed_epoch = view.epoch.0;
            self.joined_epoch = installed_epoch;
            self.unsettled = view
                .live
                .without(me)
                .iter()
                .filter(|node| self.heard_epoch[node.index()] < installed_epoch)
                .filter(|node| !self.rejoined_since_join.contains(*node))
                .collect();
            self.rejoined_since_join = NodeSet::EMPTY;
            out.events.push(MembershipEvent::ViewInstalled(view));
            return;
        }
        out.events.push(MembershipEvent::ViewInstalled(view));
        if !view.live.contains(me) {
            self.lease_until = None;
        }
        if !view.live.contains(me) && self.config.rejoin && self.leaving.is_none() {
            // Removed while alive (a partition, a pause, or we asked): our data may be stale
            // from now on, so come back the only safe way, as a new shadow (§3.4).
            self.rejoins += 1;
            let incarnation = self.config.join.unwrap_or(0) ^ (self.rejoins << 48) ^ 0x5EED;
            self.joining = Some(Joining { incarnation, decided: false, next_request: Time::ZERO });
        }
    }

    /// A removal that waits only because its node never announced our join view cannot
    /// wait forever: that node may be dead. We leave instead (our own removal needs no
    /// promise from us) and rejoin once the others have moved on without it.
    fn escape_if_stuck(&mut self, now: Time, promised_until: Time) {
        if now < promised_until {
            return; // Still waiting on our own promise: normal.
        }
        let since = *self.stuck_since.get_or_insert(now);
        let patience = self.config.lease + self.config.lease;
        let asked_recently = self.left_proposed_at.is_some_and(|at| now < at + self.config.lease);
        if now >= since + patience && !asked_recently && self.decided.live.contains(self.config.me) {
            let mut data = vec![self.config.me.0];
            data.extend_from_slice(&self.decided.epoch.0.to_le_bytes());
            if self.raft.propose(vec![], data).is_ok() {
                self.left_proposed_at = Some(now);
            }
        }
    }

    // ------------------------------------------------------------------ raft plumbing

    fn send_raft(&self, messages: Vec<raft::prelude::Message>, out: &mut MembershipOutbox) {
        for message in messages {
            if let Some(to) = node_of(message.to) {
                out.messages.push((to, MembershipMessage::Raft(message)));
            }
        }
    }

    /// The raft-rs Ready cycle (raft_io), then apply what was committed.
    fn handle_ready(&mut self, out: &mut MembershipOutbox) {
        let readied = crate::raft_io::drive(&mut self.raft, &mut out.persist);
        self.send_raft(readied.messages, out);
        for entry in &readied.committed {
            self.apply(entry);
        }
    }
}
