//! Scripted scenarios for the raftlog core (Cyclone over raft-rs).
//!
//! Every test drives a small cluster through a manual network and a manual clock, so it can
//! reproduce one exact interleaving (drop this append, crash that leader, retry there) and
//! check the replies, the applied state and the counters after each step.

use bytes::Bytes;
use chorus_core::{
    ClientRequestId, Command, CommandError, NodeId, NodeSet, Outbox, Outcome, Replica, RmwOp, Time, Value,
};
use chorus_raftlog::durable::{Record, Recovered};
use chorus_raftlog::{LeaderPlacement, Message, RaftLog, RaftLogConfig, SessionId};
use raft::prelude::MessageType;

// ================================================================ harness

#[derive(Clone, Debug)]
struct Envelope {
    from: u8,
    to: u8,
    msg: Message,
}

impl Envelope {
    fn raft_type(&self) -> Option<MessageType> {
        match &self.msg {
            Message::Raft { message, .. } => Some(message.get_msg_type()),
            _ => None,
        }
    }
    fn is_forward(&self) -> bool {
        matches!(self.msg, Message::Forward { .. })
    }
}

/// Which messages the network loses, whatever the link.
type Loss = Box<dyn Fn(&Envelope) -> bool>;

/// N raftlog replicas (ids 0..N) over a network the test controls message by message.
struct Cluster {
    nodes: Vec<RaftLog>,
    configs: Vec<RaftLogConfig>,
    /// Every durable record each node emitted: the runtime persists them before it sends
    /// anything, so a crash loses none of them.
    disk: Vec<Vec<Record>>,
    crashed: Vec<bool>,
    /// Messages sent and not yet delivered or dropped, in send order.
    net: Vec<Envelope>,
    /// Directed links that lose everything.
    cut: Vec<(u8, u8)>,
    /// Messages lost whatever the link.
    lost: Option<Loss>,
    replies: Vec<(ClientRequestId, Outcome)>,
    now: Time,
    next_request: u64,
    /// The transport's frame limit: a larger message is dropped, as the transport drops it.
    frame_bytes_max: Option<usize>,
    /// Messages dropped for exceeding it.
    oversized: usize,
    /// Every call's durable records, with the node and whether the call asked for a sync.
    turns: Vec<(u8, bool, Vec<Record>)>,
    /// Every message sent, with the sending call's facts ([`Sent`]).
    sent: Vec<Sent>,
    /// Every reply, with whether the call that gave it had records needing a sync.
    replied_in_syncing_call: Vec<(ClientRequestId, bool)>,
    /// Per node, a sync under way that has not returned (its ticket): set only while
    /// `syncs_held` holds the node's syncs back ([`Cluster::release_syncs`]).
    sync_held: Vec<Option<u64>>,
    syncs_held: Vec<bool>,
}

/// A message a call sent: what it was, whether the core let it leave before the call's
/// sync (`Replica::leaves_before_sync`), and whether the call had records needing one.
struct Sent {
    kind: String,
    entries: usize,
    early: bool,
    call_syncs: bool,
}

impl Sent {
    fn of(msg: &Message, early: bool, call_syncs: bool) -> Sent {
        let (kind, entries) = match msg {
            Message::Raft { message, .. } => (format!("{:?}", message.get_msg_type()), message.entries.len()),
            other => (format!("{other:?}").split([' ', '{', '(']).next().unwrap_or_default().to_string(), 0),
        };
        Sent { kind, entries, early, call_syncs }
    }
}

impl Cluster {
    fn new(n: u8, logs: usize) -> Cluster {
        Cluster::with(n, |config| config.logs = logs)
    }

    fn with(n: u8, tweak: impl Fn(&mut RaftLogConfig)) -> Cluster {
        let everyone: NodeSet = (0..n).map(NodeId).collect();
        let configs: Vec<RaftLogConfig> = (0..n)
            .map(|id| {
                let mut config = RaftLogConfig::new(NodeId(id), everyone);
                tweak(&mut config);
                config
            })
            .collect();
        Cluster {
            nodes: configs.iter().map(|config| RaftLog::new(config.clone())).collect(),
            configs,
            disk: vec![Vec::new(); n as usize],
            crashed: vec![false; n as usize],
            net: Vec::new(),
            cut: Vec::new(),
            lost: None,
            replies: Vec::new(),
            now: Time::ZERO,
            next_request: 0,
            frame_bytes_max: None,
            oversized: 0,
            turns: Vec::new(),
            sent: Vec::new(),
            replied_in_syncing_call: Vec::new(),
            sync_held: vec![None; n as usize],
            syncs_held: vec![false; n as usize],
        }
    }

    fn collect(&mut self, node: u8, mut out: Outbox<Message>) {
        // Each call is a turn of its own (a no-op unless the node flushes per turn).
        self.nodes[node as usize].end_turn(self.now, &mut out);
        let turn = self.nodes[node as usize].take_durable();
        if !turn.records.is_empty() {
            self.turns.push((node, turn.sync, turn.records.clone()));
        }
        self.disk[node as usize].extend(turn.records);
        for (_, msg) in &out.messages {
            let early = self.nodes[node as usize].leaves_before_sync(msg);
            self.sent.push(Sent::of(msg, early, turn.sync));
        }
        for (destination, msg) in out.messages {
            if let Some(limit) = self.frame_bytes_max {
                let mut encoded = bytes::BytesMut::new();
                chorus_core::codec::WireMessage::encode(&msg, &mut encoded);
                if encoded.len() > limit {
                    self.oversized += 1;
                    continue;
                }
            }
            for to in destination.nodes().iter() {
                assert_ne!(to.0, node, "a replica sent a message to itself");
                self.net.push(Envelope { from: node, to: to.0, msg: msg.clone() });
            }
        }
        for (id, outcome) in out.replies {
            assert!(self.reply_of(id).is_none(), "{id:?} answered twice");
            self.replied_in_syncing_call.push((id, turn.sync));
            self.replies.push((id, outcome));
        }
        if turn.sync {
            self.synced(node, turn.ticket);
        }
    }

    /// The node's sync of the records up to `ticket` returned (at once, unless its syncs are
    /// held): the core hears so in a call of its own.
    fn synced(&mut self, node: u8, ticket: u64) {
        if self.syncs_held[node as usize] {
            self.sync_held[node as usize] = Some(ticket);
            return;
        }
        let mut out = Outbox::default();
        self.nodes[node as usize].on_synced(ticket, self.now, &mut out);
        self.collect(node, out);
    }

    /// From now on the node's syncs do not return until [`Cluster::release_syncs`].
    fn hold_syncs(&mut self, node: u8) {
        self.syncs_held[node as usize] = true;
    }

    fn release_syncs(&mut self, node: u8) {
        self.syncs_held[node as usize] = false;
        if let Some(ticket) = self.sync_held[node as usize].take() {
            self.synced(node, ticket);
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

    fn session(&mut self, node: u8, client: u64, seq: u64, command: Command) -> ClientRequestId {
        self.next_request += 1;
        let id = ClientRequestId(self.next_request);
        let mut out = Outbox::default();
        self.nodes[node as usize].on_session_command(self.now, id, client, seq, command, &mut out);
        self.collect(node, out);
        id
    }

    fn reply_of(&self, id: ClientRequestId) -> Option<Outcome> {
        self.replies.iter().find(|(r, _)| *r == id).map(|(_, outcome)| outcome.clone())
    }

    fn receive(&mut self, e: Envelope) {
        if self.crashed[e.to as usize] || self.crashed[e.from as usize] || self.cut.contains(&(e.from, e.to))
        {
            return;
        }
        if self.lost.as_ref().is_some_and(|lost| lost(&e)) {
            return;
        }
        let mut out = Outbox::default();
        self.nodes[e.to as usize].on_message(self.now, NodeId(e.from), e.msg, &mut out);
        self.collect(e.to, out);
    }

    /// Deliver the queued messages matching `filter`, in send order; reactions are queued.
    fn deliver(&mut self, filter: impl Fn(&Envelope) -> bool) -> usize {
        let (matching, rest): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.net).into_iter().partition(|e| filter(e));
        self.net = rest;
        let count = matching.len();
        for e in matching {
            self.receive(e);
        }
        count
    }

    fn drop_where(&mut self, filter: impl Fn(&Envelope) -> bool) -> usize {
        let before = self.net.len();
        self.net.retain(|e| !filter(e));
        before - self.net.len()
    }

    /// Deliver everything, including reactions, until the network is quiet.
    fn deliver_all(&mut self) {
        for _ in 0..1_000 {
            if self.deliver(|_| true) == 0 {
                return;
            }
        }
        panic!("the network never went quiet");
    }

    /// Let `millis` of time pass: every live node ticks each millisecond and the network
    /// delivers everything in between.
    fn run_for(&mut self, millis: u64) {
        for _ in 0..millis {
            self.now = self.now + Time::from_millis(1);
            for node in 0..self.nodes.len() as u8 {
                if !self.crashed[node as usize] {
                    let mut out = Outbox::default();
                    self.nodes[node as usize].on_tick(self.now, &mut out);
                    self.collect(node, out);
                }
            }
            self.deliver_all();
        }
    }

    fn crash(&mut self, node: u8) {
        self.crashed[node as usize] = true;
        self.net.retain(|e| e.from != node && e.to != node);
    }

    /// Start a crashed node again from what it persisted: the last checkpoint and every
    /// record after it. A new incarnation gets a new session client id, as the server does.
    fn restart(&mut self, node: u8) {
        assert!(self.crashed[node as usize], "restart only a crashed node");
        let disk = &self.disk[node as usize];
        let last = disk.iter().rposition(|record| matches!(record, Record::Checkpoint(_)));
        let recovered = match last {
            Some(at) => {
                let Record::Checkpoint(checkpoint) = disk[at].clone() else { unreachable!() };
                Recovered { checkpoint: Some(checkpoint), records: disk[at + 1..].to_vec() }
            }
            None => Recovered { checkpoint: None, records: disk.clone() },
        };
        let config = &mut self.configs[node as usize];
        config.session_client_id += 1 << 40;
        self.nodes[node as usize] = RaftLog::restore(config.clone(), recovered).expect("restore");
        self.crashed[node as usize] = false;
        self.sync_held[node as usize] = None;
    }

    /// Cut every link between `side` and the other nodes, both ways.
    fn isolate(&mut self, side: &[u8]) {
        for a in 0..self.nodes.len() as u8 {
            for b in 0..self.nodes.len() as u8 {
                if side.contains(&a) != side.contains(&b) {
                    self.cut.push((a, b));
                }
            }
        }
    }

    fn heal(&mut self) {
        self.cut.clear();
    }

    fn leader_of(&self, node: u8, log: usize) -> Option<NodeId> {
        self.nodes[node as usize].leader_of(log)
    }
}

fn b(s: &str) -> Value {
    Bytes::copy_from_slice(s.as_bytes())
}
fn read(key: &str) -> Command {
    Command::Read { key: b(key) }
}
fn write(key: &str, value: &str) -> Command {
    Command::Write { key: b(key), value: Some(b(value)) }
}
fn incr(key: &str) -> Command {
    Command::Rmw { key: b(key), op: RmwOp::IncrementBy(1) }
}
fn value(s: &str) -> Outcome {
    Outcome::Value(Some(b(s)))
}

/// A 3-node cluster with one log whose leader n0 is elected and has committed its no-op.
fn settled_single_log() -> Cluster {
    let mut cluster = Cluster::new(3, 1);
    cluster.run_for(50);
    for node in 0..3 {
        assert_eq!(cluster.leader_of(node, 0), Some(NodeId(0)));
    }
    cluster
}

// ================================================================ logs and leaders

#[test]
fn each_log_elects_its_preferred_leader_so_leaders_spread_over_nodes() {
    let mut cluster = Cluster::new(3, 8);
    cluster.run_for(50);
    for log in 0..8 {
        for node in 0..3 {
            assert_eq!(cluster.leader_of(node, log), Some(NodeId((log % 3) as u8)), "log {log} at n{node}");
        }
    }
}

#[test]
fn leaders_placed_together_are_all_on_the_first_node_and_move_together_when_it_fails() {
    let mut cluster = Cluster::with(3, |config| {
        config.logs = 8;
        config.leaders = LeaderPlacement::Together;
    });
    cluster.run_for(50);
    let leaders = |cluster: &Cluster, node: u8| -> Vec<Option<NodeId>> {
        (0..8).map(|log| cluster.leader_of(node, log)).collect()
    };
    for node in 0..3 {
        assert_eq!(leaders(&cluster, node), vec![Some(NodeId(0)); 8], "at n{node}");
    }
    let keys: Vec<String> = (0..8).map(|log| key_in_log(log, 8)).collect();
    let requests: Vec<_> = keys.iter().map(|key| cluster.client(2, write(key, key))).collect();
    cluster.run_for(5);
    for (key, request) in keys.iter().zip(&requests) {
        assert_eq!(cluster.reply_of(*request), Some(Outcome::Written), "{key}");
    }
    assert_eq!(cluster.nodes[1].stats().entries_proposed, 0, "n1 leads nothing");
    assert_eq!(cluster.nodes[2].stats().entries_proposed, 0, "n2 leads nothing");
    // The first node fails: every log goes through the same election timeouts, so one
    // survivor wins them all and the leaders stay together.
    cluster.crash(0);
    cluster.run_for(400);
    let survivor = cluster.leader_of(1, 0).expect("log 0 has a new leader");
    assert_ne!(survivor, NodeId(0));
    for node in 1..3 {
        assert_eq!(leaders(&cluster, node), vec![Some(survivor); 8], "at n{node} after n0 failed");
    }
}

#[test]
fn keys_of_different_logs_are_served_by_different_leaders() {
    let mut cluster = Cluster::new(3, 8);
    cluster.run_for(50);
    let keys: Vec<String> = (0..64).map(|i| format!("key{i}")).collect();
    let requests: Vec<_> = keys.iter().map(|key| cluster.client(1, write(key, key))).collect();
    cluster.run_for(5);
    for (key, request) in keys.iter().zip(&requests) {
        assert_eq!(cluster.reply_of(*request), Some(Outcome::Written), "{key}");
    }
    let proposing_leaders = (0..3).filter(|&node| cluster.nodes[node].stats().entries_proposed > 0).count();
    assert_eq!(proposing_leaders, 3, "every node leads some log and proposed its entries");
    for node in 0..3 {
        assert_eq!(cluster.nodes[node].key_count(), 64, "every replica applied every write");
    }
}

/// A key of `log` (of `logs`).
fn key_in_log(log: usize, logs: usize) -> String {
    (0..).map(|i| format!("key{i}")).find(|key| chorus_raftlog::log_of(key.as_bytes(), logs) == log).unwrap()
}

/// The logs n0 leads in an 8-log cluster of 3 (log i's first leader is node i mod 3).
const N0_LOGS: [usize; 3] = [0, 3, 6];

/// An 8-log cluster of 3 flushing at turn end, where n0 took one write into each log it leads
/// in one turn; its messages are on the network.
fn eight_logs_with_a_write_into_each_log_n0_leads() -> (Cluster, Vec<ClientRequestId>) {
    let mut cluster = Cluster::with(3, |config| {
        config.logs = 8;
        config.flush_at_turn_end = true;
    });
    cluster.run_for(50);
    for log in N0_LOGS {
        assert!(cluster.nodes[0].is_leader(log), "n0 leads log {log}");
    }
    let mut out = Outbox::default();
    let requests = N0_LOGS
        .iter()
        .enumerate()
        .map(|(i, log)| {
            let request = ClientRequestId(1_000 + i as u64);
            cluster.nodes[0].on_client(cluster.now, request, write(&key_in_log(*log, 8), "v"), &mut out);
            request
        })
        .collect();
    cluster.collect(0, out);
    (cluster, requests)
}

/// Every request was answered `Written`, and every node applied the writes of
/// [`eight_logs_with_a_write_into_each_log_n0_leads`].
fn assert_written_everywhere(cluster: &Cluster, requests: &[ClientRequestId]) {
    for request in requests {
        assert_eq!(cluster.reply_of(*request), Some(Outcome::Written));
    }
    for node in 0..3 {
        for log in N0_LOGS {
            let key = key_in_log(log, 8);
            assert_eq!(cluster.nodes[node].applied_value(key.as_bytes()), Some(&b("v")), "n{node} {key}");
        }
    }
}

/// Commits reach followers in their leader's notices: one `Commits` message per follower per
/// turn for every log the turn committed, not raft-rs's empty append per log and commit
/// (each of which the follower would answer).
#[test]
fn commits_reach_followers_in_one_notice_per_follower_for_all_logs_of_a_turn() {
    let (mut cluster, requests) = eight_logs_with_a_write_into_each_log_n0_leads();
    // The followers append and answer; n0 takes in every answer in one turn.
    cluster.deliver(|e| e.to != 0);
    let answers: Vec<Envelope> = cluster.net.iter().filter(|e| e.to == 0).cloned().collect();
    cluster.net.retain(|e| e.to != 0);
    let mut out = Outbox::default();
    for e in answers {
        cluster.nodes[0].on_message(cluster.now, NodeId(e.from), e.msg, &mut out);
    }
    cluster.nodes[0].end_turn(cluster.now, &mut out);
    for follower in [NodeId(1), NodeId(2)] {
        let notices: Vec<_> = out
            .messages
            .iter()
            .filter(|(to, _)| to.nodes().contains(follower))
            .filter_map(|(_, message)| match message {
                Message::Commits { commits, .. } => Some(commits.iter().map(|c| c.log).collect::<Vec<_>>()),
                _ => None,
            })
            .collect();
        assert_eq!(notices, vec![vec![0, 3, 6]], "one notice to {follower} for the three logs");
    }
    let empty_appends = out.messages.iter().filter(|(_, message)| {
        matches!(message, Message::Raft { message, .. }
            if message.get_msg_type() == MessageType::MsgAppend && message.entries.is_empty())
    });
    assert_eq!(empty_appends.count(), 0, "no empty append carries a commit");
    cluster.collect(0, out);
    cluster.deliver_all();
    assert_written_everywhere(&cluster, &requests);
}

/// Append answers reach the leader in one message per follower per turn for every log the
/// turn appended to, not one raft-rs `MsgAppendResponse` per log; the leader steps each as
/// the response it stands for, so the writes commit as before.
#[test]
fn append_answers_reach_the_leader_in_one_message_per_follower_for_all_logs_of_a_turn() {
    let (mut cluster, requests) = eight_logs_with_a_write_into_each_log_n0_leads();
    let logs = N0_LOGS;
    for follower in [1u8, 2] {
        // The follower takes in the three logs' appends in one turn.
        let appends: Vec<Envelope> = cluster.net.iter().filter(|e| e.to == follower).cloned().collect();
        assert_eq!(appends.len(), 3, "one append per log to n{follower}");
        cluster.net.retain(|e| e.to != follower);
        let mut out = Outbox::default();
        for e in appends {
            cluster.nodes[follower as usize].on_message(cluster.now, NodeId(e.from), e.msg, &mut out);
        }
        cluster.nodes[follower as usize].end_turn(cluster.now, &mut out);
        let to_leader: Vec<&Message> = out
            .messages
            .iter()
            .filter(|(to, _)| to.nodes().contains(NodeId(0)))
            .map(|(_, message)| message)
            .collect();
        assert_eq!(to_leader.len(), 1, "one message from n{follower} to n0: {to_leader:?}");
        let Message::AppendAnswers { answers, .. } = to_leader[0] else {
            panic!("n{follower} answered with {:?}", to_leader[0]);
        };
        assert_eq!(answers.iter().map(|a| a.log as usize).collect::<Vec<_>>(), logs, "n{follower}");
        assert!(answers.iter().all(|a| !a.reject && a.term == cluster.nodes[0].term(a.log as usize)));
        cluster.collect(follower, out);
    }
    let raft_answers = cluster.net.iter().filter(|e| e.raft_type() == Some(MessageType::MsgAppendResponse));
    assert_eq!(raft_answers.count(), 0, "no append response travels on its own");
    cluster.deliver_all();
    assert_written_everywhere(&cluster, &requests);
}

// ================================================================ writes, batching

#[test]
fn a_write_at_a_follower_is_forwarded_and_answered_only_once_the_follower_applies_it() {
    let mut cluster = settled_single_log();
    let request = cluster.client(1, write("k", "v"));
    assert_eq!(cluster.net.len(), 1);
    assert!(cluster.net[0].is_forward() && cluster.net[0].to == 0, "forwarded to the leader");
    // The leader proposes and replicates; hold back everything addressed to the origin.
    cluster.deliver(|e| e.to == 0);
    cluster.deliver(|e| e.to != 1);
    cluster.deliver(|e| e.to != 1);
    assert_eq!(cluster.nodes[0].applied_value(b"k"), Some(&b("v")), "committed at the leader");
    assert_eq!(cluster.reply_of(request), None, "the origin has not applied it yet");
    cluster.deliver_all();
    assert_eq!(cluster.reply_of(request), Some(Outcome::Written));
    assert_eq!(cluster.nodes[1].applied_value(b"k"), Some(&b("v")));
}

#[test]
fn replicas_holding_an_entry_are_the_ones_whose_log_reached_it() {
    let mut cluster = settled_single_log();
    // The leader's appends reach n1 only: committed by n0 and n1, not held by n2.
    cluster.isolate(&[2]);
    let request = cluster.client(0, write("k", "v"));
    cluster.deliver_all();
    assert_eq!(cluster.reply_of(request), Some(Outcome::Written));
    let index = cluster.nodes[0].applied_index(0);
    let both: NodeSet = [NodeId(0), NodeId(1)].into_iter().collect();
    assert_eq!(cluster.nodes[0].replicas_holding(0, index), both, "the leader counts n1's match index");
    assert_eq!(cluster.nodes[1].replicas_holding(0, index), both, "a follower knows itself and the leader");
    assert_eq!(cluster.nodes[2].replicas_holding(0, index), NodeSet::EMPTY, "n2 has not applied it");
    // Once n2 catches up, the leader counts it too.
    cluster.heal();
    cluster.run_for(100);
    let everyone: NodeSet = (0..3).map(NodeId).collect();
    assert_eq!(cluster.nodes[0].replicas_holding(0, index), everyone);
    // A crashed follower holds nothing written after the crash.
    cluster.crash(2);
    let request = cluster.client(0, write("k", "w"));
    cluster.run_for(20);
    assert_eq!(cluster.reply_of(request), Some(Outcome::Written));
    let index = cluster.nodes[0].applied_index(0);
    assert_eq!(cluster.nodes[0].replicas_holding(0, index), both);
}

#[test]
fn commands_arriving_while_a_batch_is_in_flight_leave_together_as_one_entry() {
    let mut cluster = settled_single_log();
    let first = cluster.client(1, write("k", "0"));
    let rest: Vec<_> = (1..=5).map(|i| cluster.client(1, incr(&format!("c{i}")))).collect();
    assert_eq!(cluster.net.iter().filter(|e| e.is_forward()).count(), 1, "one batch in flight");
    cluster.deliver_all();
    assert_eq!(cluster.reply_of(first), Some(Outcome::Written));
    for request in rest {
        assert_eq!(cluster.reply_of(request), Some(Outcome::Integer(1)));
    }
    let stats = cluster.nodes[0].stats();
    assert_eq!((stats.entries_proposed, stats.commands_proposed), (2, 6), "{stats:?}");
}

#[test]
fn without_batching_every_command_is_its_own_entry() {
    let mut cluster = Cluster::with(3, |config| {
        config.logs = 1;
        config.batch_commands_max = 1;
    });
    cluster.run_for(50);
    let requests: Vec<_> = (0..4).map(|_| cluster.client(0, incr("k"))).collect();
    cluster.deliver_all();
    let outcomes: Vec<_> = requests.iter().map(|r| cluster.reply_of(*r)).collect();
    let expected: Vec<_> = (1..=4).map(|i| Some(Outcome::Integer(i))).collect();
    assert_eq!(outcomes, expected, "in arrival order");
    let stats = cluster.nodes[0].stats();
    assert_eq!((stats.entries_proposed, stats.commands_proposed), (4, 4));
}

// ================================================================ reads

#[test]
fn a_read_at_a_follower_waits_for_read_index_and_apply() {
    let mut cluster = settled_single_log();
    let write_request = cluster.client(0, write("k", "v"));
    while cluster.deliver(|e| e.to != 2) > 0 {} // n2 does not hear of the write yet
    assert_eq!(cluster.reply_of(write_request), Some(Outcome::Written));
    assert_eq!(cluster.nodes[2].applied_value(b"k"), None);
    let read_request = cluster.client(2, read("k"));
    assert_eq!(cluster.reply_of(read_request), None, "a follower never answers from its copy at once");
    let asked = cluster.net.iter().any(|e| e.raft_type() == Some(MessageType::MsgReadIndex));
    assert!(asked, "the follower asked the leader for a read index");
    cluster.deliver_all();
    assert_eq!(cluster.reply_of(read_request), Some(value("v")), "it waited to apply the write");
}

#[test]
fn a_deposed_leader_cut_off_from_the_majority_never_serves_a_stale_read() {
    let mut cluster = settled_single_log();
    let first = cluster.client(0, write("k", "old"));
    cluster.deliver_all();
    assert_eq!(cluster.reply_of(first), Some(Outcome::Written));
    cluster.isolate(&[0]);
    let stale_read = cluster.client(0, read("k"));
    cluster.run_for(400);
    let new_leader = cluster.leader_of(1, 0).expect("the majority elected a leader");
    assert_ne!(new_leader, NodeId(0));
    let update = cluster.client(new_leader.0, write("k", "new"));
    cluster.run_for(20);
    assert_eq!(cluster.reply_of(update), Some(Outcome::Written));
    assert_eq!(cluster.reply_of(stale_read), None, "the old leader could not confirm its leadership");
    assert_eq!(cluster.nodes[0].applied_value(b"k"), Some(&b("old")));
    cluster.heal();
    cluster.run_for(300);
    assert_eq!(cluster.reply_of(stale_read), Some(value("new")));
}

#[test]
fn a_pipelined_write_then_read_at_one_replica_reads_the_write() {
    let mut cluster = settled_single_log();
    let write_request = cluster.client(1, write("k", "mine"));
    let read_request = cluster.client(1, read("k"));
    // The read does not even ask for a read index before the write is applied here.
    assert!(!cluster.net.iter().any(|e| e.raft_type() == Some(MessageType::MsgReadIndex)));
    cluster.deliver_all();
    assert_eq!(cluster.reply_of(write_request), Some(Outcome::Written));
    assert_eq!(cluster.reply_of(read_request), Some(value("mine")));
}

// ================================================================ leader changes, at-most-once

/// n1 forwards `INCRBY k 1` to leader n0, which replicates it to n2 only; n2 never
/// acknowledges, so nothing commits, and n0 crashes. Returns the cluster and the request.
fn incr_stranded_by_a_crashed_leader(decoupled: bool) -> (Cluster, ClientRequestId) {
    let mut cluster = Cluster::with(3, |config| {
        config.logs = 1;
        config.decoupled = decoupled;
    });
    cluster.run_for(50);
    assert_eq!(cluster.leader_of(1, 0), Some(NodeId(0)));
    let request = cluster.client(1, incr("k"));
    cluster.deliver(|e| e.is_forward());
    assert_eq!(cluster.nodes[0].stats().entries_proposed, 1);
    cluster.drop_where(|e| e.to == 1); // the origin hears nothing of it
    cluster.deliver(|e| e.to == 2 && e.raft_type() == Some(MessageType::MsgAppend));
    cluster.drop_where(|e| e.to == 0); // n2's acknowledgement is lost
    cluster.crash(0);
    (cluster, request)
}

#[test]
fn a_retry_that_lands_in_the_log_twice_executes_once() {
    // Coupled: nothing runs before it commits.
    let (mut cluster, request) = incr_stranded_by_a_crashed_leader(false);
    // n2 holds the entry, wins the election and replicates it to n1. n1 sees the new leader
    // and re-forwards its batch before n2 committed anything of its term, so n2 cannot tell
    // it executed and proposes it again: the log holds the batch twice.
    cluster.run_for(400);
    assert_eq!(cluster.leader_of(1, 0), Some(NodeId(2)));
    assert_eq!(cluster.reply_of(request), Some(Outcome::Integer(1)));
    for node in [1, 2] {
        let stats = cluster.nodes[node].stats();
        assert_eq!(stats.proposals_executed, 1, "n{node}: {stats:?}");
        assert_eq!(stats.proposals_duplicate, 1, "n{node}: the second copy was recognised: {stats:?}");
        assert_eq!(cluster.nodes[node].applied_value(b"k"), Some(&b("1")));
    }
    assert!(cluster.nodes[1].stats().batches_resent >= 1);
}

#[test]
fn a_new_leader_that_executed_a_stranded_batch_does_not_propose_its_retry_again() {
    // Decoupled: n2 executed the entry when it appended it, so it knows the batch is in its
    // log (which commits if it keeps leading) and filters the retry; the execution commits
    // with n2's first entry of its term and answers n1.
    let (mut cluster, request) = incr_stranded_by_a_crashed_leader(true);
    cluster.run_for(400);
    assert_eq!(cluster.leader_of(1, 0), Some(NodeId(2)));
    assert_eq!(cluster.reply_of(request), Some(Outcome::Integer(1)));
    for node in [1, 2] {
        let stats = cluster.nodes[node].stats();
        assert_eq!((stats.proposals_executed, stats.proposals_duplicate), (1, 0), "n{node}: {stats:?}");
        assert_eq!(cluster.nodes[node].applied_value(b"k"), Some(&b("1")));
    }
}

#[test]
fn a_retry_of_a_batch_the_new_leader_already_executed_is_not_proposed_again() {
    let mut cluster = settled_single_log();
    let request = cluster.client(1, incr("k"));
    cluster.deliver(|e| e.is_forward());
    // n0 and n2 commit and apply it; n1 hears nothing; then n0 crashes.
    for _ in 0..4 {
        cluster.drop_where(|e| e.to == 1);
        cluster.deliver(|e| e.to != 1);
    }
    assert_eq!(cluster.nodes[2].applied_value(b"k"), Some(&b("1")));
    cluster.crash(0);
    cluster.run_for(400);
    assert_eq!(cluster.leader_of(1, 0), Some(NodeId(2)));
    assert_eq!(cluster.reply_of(request), Some(Outcome::Integer(1)), "learnt from its own log");
    assert_eq!(cluster.nodes[2].stats().entries_proposed, 0, "only no-ops: the retry was filtered");
    assert_eq!(cluster.nodes[1].stats().proposals_duplicate, 0);
    assert_eq!(cluster.nodes[1].applied_value(b"k"), Some(&b("1")));
}

#[test]
fn external_sessions_get_saved_results_for_retries_and_an_error_for_stale_numbers() {
    let mut cluster = settled_single_log();
    let client = 0xC11E_u64 << 32;
    let first = cluster.session(1, client, 1, incr("k"));
    cluster.deliver_all();
    assert_eq!(cluster.reply_of(first), Some(Outcome::Integer(1)));
    let second = cluster.session(2, client, 2, incr("k"));
    cluster.deliver_all();
    assert_eq!(cluster.reply_of(second), Some(Outcome::Integer(2)));
    // The client never saw the answer to 2 and retries it at another replica.
    let retry = cluster.session(0, client, 2, incr("k"));
    cluster.deliver_all();
    assert_eq!(cluster.reply_of(retry), Some(Outcome::Integer(2)), "the saved result");
    // Sequence number 1 is older than the last executed one.
    let stale = cluster.session(1, client, 1, incr("k"));
    cluster.deliver_all();
    match cluster.reply_of(stale) {
        Some(Outcome::Error(CommandError::StaleSequence)) => {}
        other => panic!("expected a stale sequence number error, got {other:?}"),
    }
    for node in 0..3 {
        assert_eq!(
            cluster.nodes[node].applied_value(b"k"),
            Some(&b("2")),
            "n{node}: ran twice, not four times"
        );
        assert_eq!(
            cluster.nodes[node].session(0, SessionId::External(client)).map(|record| record.last_seq),
            Some(2)
        );
    }
}

#[test]
fn an_external_retry_across_a_leader_change_executes_once() {
    let mut cluster = settled_single_log();
    let client = 99;
    let first = cluster.session(1, client, 1, incr("k"));
    cluster.deliver(|e| e.is_forward());
    cluster.drop_where(|e| e.to == 1);
    cluster.deliver(|e| e.to == 2 && e.raft_type() == Some(MessageType::MsgAppend));
    cluster.crash(0);
    // The client gives up on n1 and retries at n2, which holds the uncommitted entry.
    let retry = cluster.session(2, client, 1, incr("k"));
    cluster.run_for(400);
    assert_eq!(cluster.reply_of(first), Some(Outcome::Integer(1)));
    assert_eq!(cluster.reply_of(retry), Some(Outcome::Integer(1)));
    assert_eq!(cluster.nodes[1].applied_value(b"k"), Some(&b("1")));
    assert_eq!(cluster.nodes[2].applied_value(b"k"), Some(&b("1")));
}

/// Issue 18 point 5: session records expire after `session_expiry_entries` entries of their
/// log, so the table stays bounded however many clients come and go, and a replica's retry
/// that reaches the log after its session expired is refused, not run a second time.
#[test]
fn sessions_expire_and_a_retry_that_arrives_after_the_expiry_is_refused_not_run_twice() {
    let mut cluster = Cluster::with(3, |config| {
        config.logs = 1;
        config.session_expiry_entries = 8;
    });
    cluster.run_for(50);
    // n1's increment commits at the leader, but n1 receives no entries (heartbeats only),
    // so it keeps retrying; the leader skips the retries while the session is known.
    cluster.lost = Some(Box::new(|e| e.to == 1 && e.raft_type() == Some(MessageType::MsgAppend)));
    let first = cluster.client(1, incr("k"));
    for client in 0..30u64 {
        cluster.session((client % 2 * 2) as u8, 1_000 + client, 1, write(&format!("s{client}"), "v"));
        cluster.run_for(10);
    }
    for node in [0, 2] {
        let records = cluster.nodes[node].session_records();
        assert!(records <= 12, "n{node} holds {records} session records for 31 sessions");
    }
    // Once the session expired, a retry reaches the log: refused. Then n1 receives entries,
    // applies the original one and answers from that one execution.
    assert!(cluster.nodes[0].stats().proposals_expired >= 1, "{:?}", cluster.nodes[0].stats());
    assert!(cluster.reply_of(first).is_none());
    cluster.lost = None;
    cluster.run_for(500);
    assert_eq!(cluster.reply_of(first), Some(Outcome::Integer(1)));
    for node in 0..3 {
        assert_eq!(cluster.nodes[node].applied_value(b"k"), Some(&b("1")), "n{node}: ran once");
    }
    // A session within the expiry still gets its saved result.
    let again = cluster.session(0, 1_029, 1, write("s29", "other"));
    cluster.run_for(100);
    assert_eq!(cluster.reply_of(again), Some(Outcome::Written));
    assert_eq!(cluster.nodes[0].applied_value(b"s29"), Some(&b("v")), "the retry did not run");
}

// ================================================================ bad input

#[test]
fn messages_that_lie_about_their_sender_or_log_are_refused() {
    let mut cluster = settled_single_log();
    let mut heartbeat = raft::prelude::Message::default();
    heartbeat.set_msg_type(MessageType::MsgHeartbeat);
    heartbeat.from = 3; // n2's raft id, but it comes from n1
    heartbeat.to = 1;
    heartbeat.term = 99;
    let mut read_index = raft::prelude::Message::default();
    read_index.set_msg_type(MessageType::MsgReadIndex); // no context entry: raft-rs would panic
    read_index.from = 2;
    read_index.to = 1;
    let forged = [
        (1, Message::Raft { log: 0, message: Box::new(heartbeat) }),
        (1, Message::Raft { log: 0, message: Box::new(read_index) }),
        (1, Message::Raft { log: 7, message: Box::new(raft::prelude::Message::default()) }),
        (
            1,
            Message::Forward {
                log: 5,
                proposal: chorus_raftlog::Proposal {
                    client: SessionId::Replica(1),
                    seq: 1,
                    commands: vec![],
                    step: None,
                    sent_at_index: 0,
                },
                relayed: false,
            },
        ),
        (
            9,
            Message::Forward {
                log: 0,
                proposal: chorus_raftlog::Proposal {
                    client: SessionId::Replica(1),
                    seq: 1,
                    commands: vec![],
                    step: None,
                    sent_at_index: 0,
                },
                relayed: false,
            },
        ),
    ];
    for (from, message) in forged {
        let mut out = Outbox::default();
        cluster.nodes[0].on_message(cluster.now, NodeId(from), message, &mut out);
    }
    assert_eq!(cluster.nodes[0].stats().messages_refused, 5);
    assert_eq!(cluster.nodes[0].term(0), 1, "the forged term-99 heartbeat did not reach raft-rs");
    let request = cluster.client(0, write("k", "v"));
    cluster.deliver_all();
    assert_eq!(cluster.reply_of(request), Some(Outcome::Written), "still serving");
}

/// A heartbeat committing past the end of the follower's log (its sender believes it holds
/// more) made raft-rs panic: a panic reachable from the network. It is clamped instead.
#[test]
fn a_heartbeat_committing_past_the_log_does_not_panic() {
    let mut cluster = settled_single_log();
    let leader = cluster.leader_of(0, 0).expect("a leader");
    let follower = (0..3).map(NodeId).find(|node| *node != leader).expect("a follower");
    let mut heartbeat = raft::prelude::Message::default();
    heartbeat.set_msg_type(MessageType::MsgHeartbeat);
    heartbeat.from = leader.0 as u64 + 1;
    heartbeat.to = follower.0 as u64 + 1;
    heartbeat.term = cluster.nodes[follower.index()].term(0);
    heartbeat.commit = 1_000;
    let mut out = Outbox::default();
    let now = cluster.now;
    cluster.nodes[follower.index()].on_message(
        now,
        leader,
        Message::Raft { log: 0, message: Box::new(heartbeat) },
        &mut out,
    );
    let request = cluster.client(follower.0, write("k", "v"));
    cluster.deliver_all();
    assert_eq!(cluster.reply_of(request), Some(Outcome::Written), "still serving");
}

// ================================================================ broken variants

#[test]
fn the_local_reads_variant_serves_a_stale_value_from_a_deposed_leader() {
    let mut cluster = Cluster::with(3, |config| {
        config.logs = 1;
        config.bug = Some(chorus_raftlog::Bug::LocalReads);
    });
    cluster.run_for(50);
    let first = cluster.client(0, write("k", "old"));
    cluster.deliver_all();
    assert_eq!(cluster.reply_of(first), Some(Outcome::Written));
    cluster.isolate(&[0]);
    cluster.run_for(400);
    let new_leader = cluster.leader_of(1, 0).expect("the majority elected a leader");
    let update = cluster.client(new_leader.0, write("k", "new"));
    cluster.run_for(20);
    assert_eq!(cluster.reply_of(update), Some(Outcome::Written));
    let stale_read = cluster.client(0, read("k"));
    assert_eq!(cluster.reply_of(stale_read), Some(value("old")), "the bug: a stale read");
}

// ================================================================ durability and restarts

fn durable_single_log() -> Cluster {
    let mut cluster = Cluster::with(3, |config| {
        config.logs = 1;
        config.durable = true;
        config.snapshot_entries = 5; // checkpoints (and compactions) all the time
    });
    cluster.run_for(50);
    cluster
}

/// A write to the leader whose syncs are held, with one follower cut off, after the other
/// follower wrote and synced the entry: the cluster, the leader and the write.
fn write_with_the_leaders_sync_held(mut cluster: Cluster) -> (Cluster, u8, ClientRequestId) {
    cluster.run_for(50);
    let leader = cluster.leader_of(0, 0).expect("a leader").0;
    let (follower, cut_off) = ((leader + 1) % 3, (leader + 2) % 3);
    cluster.isolate(&[cut_off]);
    cluster.hold_syncs(leader);
    let id = cluster.client(leader, write("k", "v"));
    cluster.run_for(20);
    assert!(
        cluster.turns.iter().any(|(node, sync, records)| *node == follower
            && *sync
            && records.iter().any(|record| matches!(record, Record::Entries { .. }))),
        "the follower wrote the entry"
    );
    (cluster, leader, id)
}

/// [`durable_single_log`] after four writes, each sent to the next node from the leader on.
fn durable_single_log_after_four_writes() -> Cluster {
    let mut cluster = durable_single_log();
    let leader = cluster.leader_of(0, 0).expect("a leader").0;
    for round in 0..4 {
        let id = cluster.client(((leader as usize + round) % 3) as u8, write("k", &format!("v{round}")));
        cluster.run_for(5);
        assert_eq!(cluster.reply_of(id), Some(Outcome::Written));
    }
    cluster
}

/// Raft §5, Figure 2: the commit index is volatile state, while term, vote and log are
/// persistent. So a call whose records only move commit indexes (a leader taking append
/// answers, a follower told of a commit) asks for no sync and answers without waiting for the
/// disk; a call with entries, a new term or a new vote must sync before anything leaves.
#[test]
fn only_a_call_that_moves_nothing_but_commit_indexes_goes_without_a_sync() {
    let cluster = durable_single_log_after_four_writes();
    let mut last_term_vote: Vec<(u64, u64)> = vec![(0, 0); 3];
    let (mut synced, mut unsynced) = (0, 0);
    for (node, sync, records) in &cluster.turns {
        for record in records {
            match record {
                Record::HardState { term, vote, .. } => {
                    let moved = last_term_vote[*node as usize] != (*term, *vote);
                    assert!(*sync || !moved, "n{node}: a new term or vote was not synced: {record:?}");
                    last_term_vote[*node as usize] = (*term, *vote);
                }
                other => assert!(*sync, "n{node}: {other:?} was not synced"),
            }
        }
        if *sync {
            synced += 1;
        } else {
            unsynced += 1;
        }
    }
    assert!(synced > 0, "the election and the entries must sync");
    assert!(unsynced > 0, "commit-only calls must not sync");
}

/// Raft thesis §10.2.1: a leader may write its log in parallel with replicating it, so its
/// appends (with the entries the same call wrote) leave before its own sync; a follower's
/// answers and every vote wait for the sync of the call that produced them, since they
/// promise what that call wrote.
#[test]
fn a_leaders_appends_leave_before_its_sync_and_answers_and_votes_wait_for_theirs() {
    let cluster = durable_single_log_after_four_writes();
    let may_go_early = ["MsgAppend", "MsgHeartbeat", "Commits", "Forward"];
    for sent in cluster.sent.iter().filter(|sent| sent.early) {
        assert!(may_go_early.contains(&sent.kind.as_str()), "{} left before its sync", sent.kind);
    }
    let went = |kind: &str, early: bool| {
        cluster.sent.iter().any(|sent| sent.kind == kind && sent.early == early && sent.call_syncs)
    };
    assert!(
        cluster
            .sent
            .iter()
            .any(|sent| sent.kind == "MsgAppend" && sent.entries > 0 && sent.early && sent.call_syncs),
        "no append carried entries out before its leader's sync"
    );
    assert!(
        cluster.sent.iter().any(|sent| sent.kind == "Forward" && sent.early),
        "no forward was let go before a sync"
    );
    assert!(went("AppendAnswers", false), "no answer to an append waited for its follower's sync");
    assert!(went("MsgRequestVoteResponse", false), "no vote waited for its voter's sync");
}

/// raft-rs's asynchronous persistence: a leader counts its own copy of an entry toward a
/// commit only once its sync returned (`on_synced`). With its sync held and one follower cut
/// off, the other follower's answer alone commits nothing; the sync's return does. So a
/// reply, whatever call gives it, answers an entry a majority holds stable, and replies
/// never wait for the sync of the call that gives them, not even a single voter's.
#[test]
fn a_leader_counts_its_own_copy_only_once_its_sync_returned() {
    let (mut cluster, leader, id) = write_with_the_leaders_sync_held(durable_single_log());
    assert_eq!(cluster.reply_of(id), None, "committed on one stable copy of two");
    cluster.release_syncs(leader);
    cluster.run_for(5);
    assert_eq!(cluster.reply_of(id), Some(Outcome::Written));
    // The broken variant counts its copy at once: the same write is answered on one.
    let broken = Cluster::with(3, |config| {
        config.logs = 1;
        config.durable = true;
        config.bug = Some(chorus_raftlog::Bug::CountsUnsyncedCopy);
    });
    let (broken, _, id) = write_with_the_leaders_sync_held(broken);
    assert_eq!(broken.reply_of(id), Some(Outcome::Written), "the broken variant waited for its sync");

    let mut single = Cluster::with(1, |config| config.durable = true);
    single.run_for(50);
    let id = single.client(0, write("k", "v"));
    single.run_for(5);
    assert_eq!(single.reply_of(id), Some(Outcome::Written));
    let (_, syncing) =
        *single.replied_in_syncing_call.iter().find(|(reply, _)| *reply == id).expect("replied");
    assert!(!syncing, "a single voter answers once its sync returned, in a call that needs none");
    assert!(single.nodes[0].replies_before_sync());
}

#[test]
fn session_results_survive_a_restart_of_every_replica() {
    let mut cluster = durable_single_log();
    let client = 4242;
    for seq in 1..=8u64 {
        let id = cluster.session((seq % 3) as u8, client, seq, incr("k"));
        cluster.run_for(20);
        assert_eq!(cluster.reply_of(id), Some(Outcome::Integer(seq as i64)));
    }
    assert!(cluster.disk[0].iter().any(|record| matches!(record, Record::Checkpoint(_))), "no checkpoint");
    for node in 0..3 {
        cluster.crash(node);
    }
    for node in 0..3 {
        cluster.restart(node);
    }
    cluster.run_for(500);
    // The client never saw the answer to 8: its retry, at any replica, gets the saved
    // result from the restored session table instead of running again.
    for node in 0..3 {
        let retry = cluster.session(node, client, 8, incr("k"));
        cluster.run_for(100);
        assert_eq!(cluster.reply_of(retry), Some(Outcome::Integer(8)), "retry at n{node}");
    }
    let stale = cluster.session(1, client, 3, incr("k"));
    cluster.run_for(100);
    assert_eq!(cluster.reply_of(stale), Some(Outcome::Error(CommandError::StaleSequence)));
    let next = cluster.session(2, client, 9, incr("k"));
    cluster.run_for(100);
    assert_eq!(cluster.reply_of(next), Some(Outcome::Integer(9)));
    for node in 0..3 {
        assert_eq!(cluster.nodes[node].applied_value(b"k"), Some(&b("9")), "n{node}");
    }
}

#[test]
fn a_retry_across_a_leader_crash_and_its_restart_executes_once() {
    let mut cluster = durable_single_log();
    let leader = cluster.leader_of(1, 0).expect("a leader").0;
    let client = 7;
    let first = cluster.session(leader, client, 1, incr("k"));
    // The leader commits and applies, but its client never hears back: it crashes first.
    cluster.run_for(10);
    cluster.replies.retain(|(id, _)| *id != first);
    cluster.crash(leader);
    cluster.run_for(400);
    cluster.restart(leader);
    cluster.run_for(400);
    // The client retries at the restarted node (same id, same data).
    let retry = cluster.session(leader, client, 1, incr("k"));
    cluster.run_for(200);
    assert_eq!(cluster.reply_of(retry), Some(Outcome::Integer(1)));
    for node in 0..3 {
        assert_eq!(cluster.nodes[node].applied_value(b"k"), Some(&b("1")), "n{node} ran it twice");
    }
}

/// Writes 30 keys while node 2 is down, then restarts it: how it catches up depends on how
/// many trailing entries the others kept when they compacted (every 5 entries).
fn restart_behind_compaction(trailing_entries: u64) -> Cluster {
    let mut cluster = Cluster::with(3, |config| {
        config.logs = 1;
        config.durable = true;
        config.snapshot_entries = 5;
        config.trailing_entries = trailing_entries;
    });
    cluster.run_for(50);
    cluster.crash(2);
    for i in 0..30 {
        let id = cluster.client((i % 2) as u8, write(&format!("k{i}"), &format!("v{i}")));
        cluster.run_for(5);
        assert_eq!(cluster.reply_of(id), Some(Outcome::Written));
    }
    cluster.restart(2);
    cluster.run_for(500);
    assert_eq!(cluster.nodes[2].key_count(), 30);
    cluster
}

/// Issue 18 point 5: compaction keeps trailing entries, so a follower that lagged by fewer
/// catches up from the log; nobody sends it the whole state machine.
#[test]
fn a_briefly_lagging_follower_catches_up_from_trailing_entries_without_a_snapshot() {
    let cluster = restart_behind_compaction(100);
    assert!(cluster.nodes[0].stats().snapshots_taken >= 5, "the others compacted");
    assert_eq!(cluster.nodes[2].stats().snapshots_installed, 0, "{:?}", cluster.nodes[2].stats());
    for node in 0..2 {
        assert_eq!(cluster.nodes[node].stats().snapshot_chunks_sent, 0);
    }
}

/// Issue 18 point 5 (checkpoint cost): a compaction encodes only the logs that applied
/// something since their last snapshot; the others keep theirs.
#[test]
fn a_compaction_encodes_only_the_logs_that_changed() {
    let mut cluster = Cluster::with(3, |config| {
        config.logs = 8;
        config.snapshot_entries = 5;
    });
    cluster.run_for(50);
    for i in 0..30 {
        let id = cluster.client(0, write("one-key", &format!("v{i}")));
        cluster.run_for(20);
        assert_eq!(cluster.reply_of(id), Some(Outcome::Written));
    }
    for node in 0..3 {
        let stats = cluster.nodes[node].stats();
        assert!(stats.snapshots_taken >= 3, "{stats:?}");
        // The first compaction encodes all 8 logs (each applied its leader's no-op), later
        // ones only the busy log: not 8 per compaction.
        assert!(stats.snapshot_logs_encoded <= stats.snapshots_taken + 8, "{stats:?}");
    }
}

#[test]
fn a_restarted_node_behind_the_compaction_installs_the_leaders_snapshot() {
    let mut cluster = restart_behind_compaction(0);
    assert!(cluster.nodes[2].stats().snapshots_installed >= 1, "{:?}", cluster.nodes[2].stats());
    let read_id = cluster.client(2, read("k29"));
    cluster.run_for(100);
    assert_eq!(cluster.reply_of(read_id), Some(value("v29")));
    // And its own writes work under its new session.
    let id = cluster.client(2, write("after", "x"));
    cluster.run_for(100);
    assert_eq!(cluster.reply_of(id), Some(Outcome::Written));
}

/// Session ids are name spaces (issue 22): an external client that picks the very number a
/// replica uses for its own session (or any step's) only ever touches its own session. When
/// both were plain u64s, this external request made n1's own first batch look like a retry:
/// its write never ran and its client got the external INCR's result.
#[test]
fn an_external_session_id_equal_to_a_replicas_own_cannot_hijack_it() {
    let mut cluster = settled_single_log();
    let own = cluster.configs[1].session_client_id;
    let external = cluster.session(2, own, 1, incr("counter"));
    cluster.deliver_all();
    assert_eq!(cluster.reply_of(external), Some(Outcome::Integer(1)));
    let mine = cluster.client(1, write("k", "v"));
    cluster.run_for(50);
    assert_eq!(cluster.reply_of(mine), Some(Outcome::Written), "n1's own batch ran");
    for node in 0..3 {
        assert_eq!(cluster.nodes[node].applied_value(b"k"), Some(&b("v")), "n{node}");
        assert_eq!(cluster.nodes[node].applied_value(b"counter"), Some(&b("1")), "n{node}");
    }
}

/// A follower that fell behind a compacted log whose state is larger than one peer message
/// catches up (issue 22): the leader streams the snapshot in chunks. The harness drops every
/// message over the frame limit, as the transport does; a whole-state `MsgSnapshot` was
/// such a message, and the follower never caught up.
#[test]
fn a_lagging_follower_catches_up_from_a_snapshot_larger_than_a_message() {
    let frame_bytes_max = 16 * 1024;
    let mut cluster = Cluster::with(3, |config| {
        config.logs = 1;
        config.durable = true;
        config.snapshot_entries = 20;
        config.trailing_entries = 0; // the snapshot path, not trailing entries
        config.message_bytes_max = frame_bytes_max;
    });
    cluster.frame_bytes_max = Some(frame_bytes_max);
    cluster.run_for(300);
    cluster.crash(2);
    let value = "v".repeat(1_000);
    for i in 0..120 {
        let request = cluster.client(0, write(&format!("key:{i}"), &value));
        cluster.run_for(5);
        assert_eq!(cluster.reply_of(request), Some(Outcome::Written), "write {i}");
    }
    assert!(cluster.nodes[0].stats().snapshots_taken > 0, "the leader compacted its log");
    cluster.restart(2);
    cluster.run_for(2_000);
    assert_eq!(cluster.oversized, 0, "a message over the frame limit was produced");
    for i in 0..120 {
        assert_eq!(
            cluster.nodes[2].applied_value(format!("key:{i}").as_bytes()),
            Some(&b(&value)),
            "key:{i}"
        );
    }
    let leader = (0..2).map(|node| cluster.nodes[node].stats()).find(|stats| stats.snapshot_chunks_sent > 0);
    let leader = leader.expect("the snapshot went in chunks");
    assert!(leader.snapshot_transfers_completed >= 1, "{leader:?}");
    assert!(cluster.nodes[2].stats().snapshots_installed >= 1);
}

// ================================================================ decoupled execution (§3.1)

/// Leader n0 executes `INCRBY k 1` from its own client when it proposes it, but is cut off
/// before anyone else gets the entry; n1 and n2 elect a new leader, which commits other
/// entries in its place. When n0 comes back the new leader's entries replace its lost one:
/// n0 rolls the execution back and its retry runs once, at the new position.
fn lost_execution(tweak: impl Fn(&mut RaftLogConfig)) -> (Cluster, ClientRequestId) {
    let mut cluster = Cluster::with(3, |config| {
        config.logs = 1;
        tweak(config);
    });
    cluster.run_for(50);
    assert_eq!(cluster.leader_of(0, 0), Some(NodeId(0)));
    let executed_before = cluster.nodes[0].stats().entries_executed_early;
    let request = cluster.client(0, incr("k"));
    let executed = cluster.nodes[0].stats().entries_executed_early - executed_before;
    assert_eq!(executed, 1, "executed as it was proposed");
    assert_eq!(cluster.nodes[0].applied_value(b"k"), None, "not visible before it commits");
    cluster.drop_where(|_| true);
    cluster.isolate(&[0]);
    cluster.run_for(400);
    let new_leader = cluster.leader_of(1, 0).expect("n1 and n2 elect a leader");
    let other = cluster.client(new_leader.0, write("j", "5"));
    cluster.run_for(20);
    assert_eq!(cluster.reply_of(other), Some(Outcome::Written));
    assert_eq!(cluster.reply_of(request), None, "n0's entry never committed");
    cluster.heal();
    cluster.run_for(400);
    (cluster, request)
}

#[test]
fn an_execution_whose_entry_a_new_leader_replaced_is_rolled_back_and_the_retry_runs_once() {
    let (cluster, request) = lost_execution(|_| {});
    assert!(cluster.nodes[0].stats().executions_rolled_back >= 1, "{:?}", cluster.nodes[0].stats());
    assert_eq!(cluster.reply_of(request), Some(Outcome::Integer(1)));
    for node in 0..3 {
        assert_eq!(cluster.nodes[node].applied_value(b"k"), Some(&b("1")), "n{node}");
        assert_eq!(cluster.nodes[node].applied_value(b"j"), Some(&b("5")), "n{node}");
        let stats = cluster.nodes[node].stats();
        // Every entry a replica executed early either committed (its replies came from that
        // execution) or was rolled back; nothing ran a second time at commit.
        assert!(stats.executions_committed > 0, "n{node}: {stats:?}");
    }
}

#[test]
fn the_keep_rolled_back_variant_leaves_the_lost_execution_in_the_copy() {
    let (cluster, _) = lost_execution(|config| config.bug = Some(chorus_raftlog::Bug::KeepRolledBack));
    assert_eq!(cluster.nodes[0].applied_value(b"k"), Some(&b("2")), "the lost INCR and its retry both ran");
    assert_eq!(cluster.nodes[1].applied_value(b"k"), Some(&b("1")));
}

#[test]
fn coupled_execution_runs_entries_only_once_they_commit() {
    let mut cluster = Cluster::with(3, |config| {
        config.logs = 1;
        config.decoupled = false;
    });
    cluster.run_for(50);
    let request = cluster.client(1, incr("k"));
    cluster.run_for(20);
    assert_eq!(cluster.reply_of(request), Some(Outcome::Integer(1)));
    for node in 0..3 {
        let stats = cluster.nodes[node].stats();
        assert_eq!((stats.entries_executed_early, stats.proposals_executed), (0, 1), "n{node}: {stats:?}");
    }
}

// ================================================================ replacing a node

/// A 3-node cluster of `logs` logs whose nodes have data directory identities (so they check
/// each other's), compacting every few entries.
fn identified_cluster(logs: usize) -> Cluster {
    let mut cluster = Cluster::with(3, |config| {
        config.logs = logs;
        config.identity = 100 + config.me.0 as u64;
        config.snapshot_entries = 6;
        config.trailing_entries = 0;
        config.durable = true;
    });
    cluster.run_for(100);
    cluster
}

/// Node `node` comes back with an empty data directory: as the member it was
/// (`incarnation` 0), or as a replacement.
fn wipe(cluster: &mut Cluster, node: u8, incarnation: u64, identity: u64) {
    cluster.crash(node);
    cluster.disk[node as usize].clear();
    let config = &mut cluster.configs[node as usize];
    config.incarnation = incarnation;
    config.joining = incarnation != 0;
    config.identity = identity;
    config.session_client_id = (node as u64) << 40 | 1 << 39 | incarnation;
    cluster.nodes[node as usize] = RaftLog::new(config.clone());
    cluster.crashed[node as usize] = false;
}

#[test]
fn a_node_that_lost_its_data_is_refused_under_its_old_identity() {
    let mut cluster = identified_cluster(2);
    let first = cluster.client(0, write("k", "1"));
    cluster.run_for(20);
    assert_eq!(cluster.reply_of(first), Some(Outcome::Written));
    wipe(&mut cluster, 2, 0, 999);
    cluster.run_for(200);
    assert!(cluster.nodes[2].refused_by().is_some(), "the peers recognised a member without its data");
    assert!(cluster.nodes[0].peers_refused().contains(NodeId(2)));
    let refused = cluster.client(2, read("k"));
    assert!(matches!(cluster.reply_of(refused), Some(Outcome::Error(CommandError::Unavailable(_)))));
    // The others serve on: the refused node never voted or acknowledged anything.
    let second = cluster.client(1, write("k", "2"));
    cluster.run_for(50);
    assert_eq!(cluster.reply_of(second), Some(Outcome::Written));
    assert_eq!(cluster.nodes[2].applied_value(b"k"), None);
}

#[test]
fn a_replacement_takes_the_place_of_the_lost_node_in_every_log_and_catches_up_from_a_snapshot() {
    let mut cluster = identified_cluster(2);
    for i in 0..30 {
        cluster.client(i % 3, write(&format!("k{i}"), &format!("v{i}")));
        cluster.run_for(5);
    }
    wipe(&mut cluster, 2, 7, 777);
    cluster.run_for(1_000);
    let replacement = &cluster.nodes[2];
    assert!(replacement.refused_by().is_none());
    assert!(replacement.is_voter_everywhere(), "{}", replacement.debug_txns());
    assert!(replacement.stats().snapshots_installed >= 1, "{:?}", replacement.stats());
    for i in 0..30 {
        let key = format!("k{i}");
        assert_eq!(replacement.applied_value(key.as_bytes()), Some(&b(&format!("v{i}"))), "{key}");
    }
    let replaced: u64 = (0..2).map(|node| cluster.nodes[node].stats().members_replaced).sum();
    assert_eq!(replaced, 2, "one configuration change per log");
    // The replacement is a voter: with node 0 down, nodes 1 and 2 still commit, in every log.
    cluster.crash(0);
    cluster.run_for(600);
    let late = [cluster.client(1, write("a", "x")), cluster.client(2, write("b", "y"))];
    cluster.run_for(100);
    for request in late {
        assert_eq!(cluster.reply_of(request), Some(Outcome::Written));
    }
    // Node 1 restarts from its records: the new configuration and identities survive.
    cluster.crash(1);
    cluster.restart(1);
    cluster.run_for(600);
    let after = cluster.client(1, read("a"));
    cluster.run_for(100);
    assert_eq!(cluster.reply_of(after), Some(value("x")));
    assert!(cluster.nodes[1].is_voter_everywhere());
}

/// Seed 400 of the 5-replica disk swarm: a member that was down while another node was
/// replaced never saw the configuration change (and the log was compacted past it, so only a
/// snapshot from the leader can teach it). When the replacement then led the log, that member
/// refused every message from it as coming from outside its configuration, so it never
/// learned the change and stalled for good. Raft takes a leader's messages whatever the
/// receiver's configuration says (thesis §4.1).
#[test]
fn a_member_that_missed_a_replacement_follows_the_replacement_when_it_leads() {
    let mut cluster = Cluster::with(5, |config| {
        config.logs = 1;
        config.identity = 100 + config.me.0 as u64;
        config.snapshot_entries = 6;
        config.trailing_entries = 0;
        config.durable = true;
    });
    cluster.run_for(100);
    cluster.crash(1); // down through the whole replacement
    for i in 0..12 {
        let id = cluster.client(2 + (i % 3) as u8, write(&format!("k{i}"), &format!("v{i}")));
        cluster.run_for(5);
        assert_eq!(cluster.reply_of(id), Some(Outcome::Written));
    }
    wipe(&mut cluster, 0, 7, 777);
    cluster.run_for(1_000);
    assert!(cluster.nodes[0].is_voter_everywhere());
    // The replacement takes over the log: the leader that replaced it fails, and the two
    // other survivors cannot reach each other, so only node 0 can gather a majority.
    let leader = cluster.leader_of(2, 0).expect("a leader").0;
    assert_ne!(leader, 0);
    let others: Vec<u8> = (2..5).filter(|node| *node != leader).collect();
    cluster.cut.extend([(others[0], others[1]), (others[1], others[0])]);
    cluster.crash(leader);
    cluster.run_for(600);
    assert_eq!(cluster.leader_of(0, 0), Some(NodeId(0)), "the replacement leads");
    cluster.heal();
    cluster.restart(leader);
    cluster.restart(1); // with the founding configuration: it never heard of the replacement
    cluster.run_for(1_000);
    assert_eq!(cluster.leader_of(1, 0), Some(NodeId(0)), "n1 follows the replacement");
    assert!(cluster.nodes[1].stats().snapshots_installed >= 1, "{:?}", cluster.nodes[1].stats());
    for i in 0..12 {
        let key = format!("k{i}");
        assert_eq!(cluster.nodes[1].applied_value(key.as_bytes()), Some(&b(&format!("v{i}"))), "{key}");
    }
    let id = cluster.client(1, write("after", "x"));
    cluster.run_for(100);
    assert_eq!(cluster.reply_of(id), Some(Outcome::Written));
}

// ================================================================ one flush per turn

#[test]
fn with_a_flush_per_turn_every_command_of_a_turn_leaves_in_one_batch() {
    let mut cluster = Cluster::with(3, |config| {
        config.logs = 1;
        config.flush_at_turn_end = true;
    });
    cluster.run_for(50);
    assert_eq!(cluster.leader_of(1, 0), Some(NodeId(0)));
    let now = cluster.now;
    let mut out = Outbox::default();
    let requests: Vec<ClientRequestId> = (0..3).map(|i| ClientRequestId(1_000 + i)).collect();
    for (i, request) in requests.iter().enumerate() {
        cluster.nodes[1].on_client(now, *request, write(&format!("k{i}"), "v"), &mut out);
    }
    assert!(out.messages.is_empty(), "nothing leaves before the turn ends");
    cluster.collect(1, out); // ends the turn
    let forwards: Vec<&Envelope> = cluster.net.iter().filter(|e| e.is_forward()).collect();
    assert_eq!(forwards.len(), 1, "one batch for the turn");
    let Message::Forward { proposal, .. } = &forwards[0].msg else { unreachable!() };
    assert_eq!(proposal.commands.len(), 3);
    cluster.run_for(20);
    for request in requests {
        assert_eq!(cluster.reply_of(request), Some(Outcome::Written));
    }
}
