//! One shard of a node's logs: Cyclone's "Raft core" (§3.2), one event loop per group of logs.
//!
//! A node with S shards runs S independent [`DurableRaftLog`] cores, each with its own logs,
//! two-level log on disk and event loop (thread). A key belongs to shard
//! `fnv1a64(key) % S` ([`crate::shard_of`]) and, inside it, to log
//! `fnv1a64(key) / S % logs` ([`crate::log_in_shard`]); every node computes the same, so
//! shard `s` of one node only ever talks to shard `s` of the others. Peer messages carry
//! their shard ([`ShardMessage`]), so all shards share one transport (one connection per
//! peer) while every shard batches its own logs' messages into its own frames each turn.
//!
//! [`ShardCore`] wraps a core so its messages are tagged on the way out and checked on the
//! way in; it is sans-I/O like the core it wraps.

use chorus_core::codec::LoopMessage;
use chorus_core::{ClientRequestId, Command, NodeId, Outbox, Replica, Time, View};

use crate::disk::DurableRaftLog;
use crate::Message;

/// A raftlog message between shards `event_loop` of two nodes.
pub type ShardMessage = LoopMessage<Message>;

/// A raftlog core serving shard `shard` of its node.
pub struct ShardCore {
    shard: u16,
    core: DurableRaftLog,
    /// The inner core's outbox of the current call, re-tagged into the caller's.
    scratch: Outbox<Message>,
    /// Messages that named another shard (a peer with a different layout would send them;
    /// the handshake's protocol name prevents that).
    pub messages_misrouted: u64,
}

impl ShardCore {
    pub fn new(core: DurableRaftLog) -> ShardCore {
        let config = core.core().config();
        assert!(config.shard < config.shards && config.shards <= u16::MAX as usize, "shard in range");
        let shard = config.shard as u16;
        ShardCore { shard, core, scratch: Outbox::default(), messages_misrouted: 0 }
    }

    pub fn shard(&self) -> usize {
        self.shard as usize
    }

    /// Log `local` of this shard, numbered across the node: `local * shards + shard`.
    pub fn global_log(&self, local: u32) -> u32 {
        let shards = self.core.core().config().shards as u32;
        local * shards + self.shard as u32
    }

    pub fn inner(&self) -> &DurableRaftLog {
        &self.core
    }

    pub fn inner_mut(&mut self) -> &mut DurableRaftLog {
        &mut self.core
    }

    /// Run `call` on the inner core, then move its outbox into `out`, messages tagged.
    pub fn with_outbox(
        &mut self,
        out: &mut Outbox<ShardMessage>,
        call: impl FnOnce(&mut DurableRaftLog, &mut Outbox<Message>),
    ) {
        call(&mut self.core, &mut self.scratch);
        let shard = self.shard;
        out.messages.extend(
            self.scratch
                .messages
                .drain(..)
                .map(|(to, message)| (to, ShardMessage { event_loop: shard, message })),
        );
        out.replies.append(&mut self.scratch.replies);
    }
}

impl Replica for ShardCore {
    type Message = ShardMessage;

    fn id(&self) -> NodeId {
        self.core.id()
    }

    fn on_client(
        &mut self,
        now: Time,
        request: ClientRequestId,
        command: Command,
        out: &mut Outbox<ShardMessage>,
    ) {
        self.with_outbox(out, |core, scratch| core.on_client(now, request, command, scratch));
    }

    fn on_message(&mut self, now: Time, from: NodeId, message: ShardMessage, out: &mut Outbox<ShardMessage>) {
        if message.event_loop != self.shard {
            self.messages_misrouted += 1;
            return;
        }
        self.with_outbox(out, |core, scratch| core.on_message(now, from, message.message, scratch));
    }

    fn on_tick(&mut self, now: Time, out: &mut Outbox<ShardMessage>) {
        self.with_outbox(out, |core, scratch| core.on_tick(now, scratch));
    }

    fn end_turn(&mut self, now: Time, out: &mut Outbox<ShardMessage>) {
        self.with_outbox(out, |core, scratch| core.end_turn(now, scratch));
    }

    fn on_view(&mut self, now: Time, view: View, out: &mut Outbox<ShardMessage>) {
        self.with_outbox(out, |core, scratch| core.on_view(now, view, scratch));
    }

    fn event_counts(&self, report: &mut dyn FnMut(&'static str, u64)) {
        self.core.event_counts(report);
    }

    fn write_durable(&mut self) -> bool {
        self.core.write_durable()
    }

    fn sync_started(&mut self) {
        self.core.sync_started();
    }

    fn sync_durable(&mut self) {
        self.core.sync_durable();
    }

    fn on_synced(&mut self, now: Time, out: &mut Outbox<ShardMessage>) {
        self.with_outbox(out, |core, scratch| core.on_synced(now, scratch));
    }

    fn leaves_before_sync(&self, message: &ShardMessage) -> bool {
        self.core.leaves_before_sync(&message.message)
    }

    fn sync_due(&self) -> bool {
        Replica::sync_due(&self.core)
    }

    fn replies_before_sync(&self) -> bool {
        self.core.replies_before_sync()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{log_in_shard, log_of, shard_of, RaftLogConfig};
    use bytes::{Bytes, BytesMut};
    use chorus_core::codec::WireMessage;
    use chorus_core::{NodeSet, Outcome};

    fn core(shard: usize, shards: usize) -> ShardCore {
        let members = NodeSet::from_iter([NodeId(0), NodeId(1), NodeId(2)]);
        let mut config = RaftLogConfig::new(NodeId(0), members);
        config.logs = 4;
        config.shards = shards;
        config.shard = shard;
        ShardCore::new(DurableRaftLog::in_memory(config))
    }

    #[test]
    fn one_shard_places_keys_as_before() {
        for index in 0..1_000 {
            let key = format!("key:{index}");
            assert_eq!(shard_of(key.as_bytes(), 1), 0);
            assert_eq!(log_in_shard(key.as_bytes(), 8, 1), log_of(key.as_bytes(), 8));
        }
    }

    #[test]
    fn the_keys_of_a_shard_spread_over_all_of_its_logs() {
        let (shards, logs) = (4, 4);
        let mut counts = vec![vec![0usize; logs]; shards];
        for index in 0..16_000 {
            let key = format!("key:{index}");
            counts[shard_of(key.as_bytes(), shards)][log_in_shard(key.as_bytes(), logs, shards)] += 1;
        }
        for count in counts.iter().flatten() {
            assert!((700..1_300).contains(count), "uneven spread: {counts:?}");
        }
    }

    #[test]
    fn messages_carry_their_shard_and_round_trip() {
        let message =
            ShardMessage { event_loop: 3, message: Message::SnapshotAck { log: 1, index: 7, received: 9 } };
        let mut buf = BytesMut::new();
        message.encode(&mut buf);
        assert_eq!(ShardMessage::decode_exact(buf.freeze()).unwrap(), message);
        assert!(ShardMessage::decode_exact(Bytes::from_static(&[1])).is_err());
    }

    #[test]
    fn a_shard_tags_what_it_sends_and_refuses_other_shards_keys_and_messages() {
        let mut shard = core(1, 2);
        let mut out = Outbox::default();
        // The stagger-0 replica of a log campaigns at start-up: its vote requests leave tagged.
        for tick in 0..50 {
            shard.on_tick(Time::from_millis(10 * tick), &mut out);
        }
        assert!(!out.messages.is_empty());
        assert!(out.messages.iter().all(|(_, message)| message.event_loop == 1));
        let (foreign, _) = (0..100)
            .map(|index| format!("k{index}"))
            .map(|key| (key.clone(), shard_of(key.as_bytes(), 2)))
            .find(|(_, owner)| *owner == 0)
            .expect("some key belongs to shard 0");
        let mut out = Outbox::default();
        let command = Command::Read { key: Bytes::from(foreign) };
        shard.on_client(Time::from_millis(600), ClientRequestId(1), command, &mut out);
        assert!(matches!(out.replies.as_slice(), [(ClientRequestId(1), Outcome::Error(_))]), "{out:?}");
        let stray =
            ShardMessage { event_loop: 0, message: Message::SnapshotAck { log: 0, index: 1, received: 0 } };
        shard.on_message(Time::from_millis(600), NodeId(1), stray, &mut Outbox::default());
        assert_eq!(shard.messages_misrouted, 1);
    }
}
