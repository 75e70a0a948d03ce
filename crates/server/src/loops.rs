//! N event loops per node for any key-partitioned protocol (issue 23 point 4; decision 9
//! generalised from raftlog's shards to Hermes, CRAQ and ZAB).
//!
//! With `event_loops = N > 1` a node runs N **independent instances** of its protocol core
//! (each with its own membership service when membership is on), one per event loop and OS
//! thread. A key belongs to loop `fnv1a64(key) % N` ([`chorus_raftlog::shard_of`], the same
//! function raftlog's shards use), on every node alike, so loop `i` of one node only ever
//! talks to loop `i` of the others: the N instances form N separate replica groups that share
//! the node's peer links. Nothing is shared between loops but the transport, so there are no
//! locks on the data path, and each instance is exactly the core the simulator's swarm checks.
//!
//! [`LoopCore`] wraps one instance so its messages are tagged with the loop on the way out
//! ([`LoopMessage`]) and checked on the way in; it is sans-I/O like the core it wraps.

pub use chorus_core::codec::LoopMessage;
use chorus_core::codec::WireMessage;
use chorus_core::{ClientRequestId, Command, Key, NodeId, NodeSet, Outbox, Replica, Time, View};
use chorus_membership::PersistRecord;

use crate::engine::{ServedReplica, WriteMark};

/// A peer message that names the event loop it is for, so one task can split a peer's
/// batches between the loops ([`LoopMessage`], which raftlog's `ShardMessage` is).
pub trait Routed {
    fn event_loop(&self) -> usize;
}

impl<M> Routed for LoopMessage<M> {
    fn event_loop(&self) -> usize {
        self.event_loop as usize
    }
}

/// The most event loops a node runs (the tag is a `u16`; 64 is far above any core count
/// this has been measured on).
pub const EVENT_LOOPS_MAX: usize = 64;

/// Which of `loops` event loops serves `key`.
pub fn loop_of(key: &[u8], loops: usize) -> usize {
    chorus_raftlog::shard_of(key, loops)
}

/// Protocol core `P` serving event loop `index` of `count`.
pub struct LoopCore<P: Replica> {
    index: u16,
    count: u16,
    core: P,
    /// The inner core's outbox of the current call, re-tagged into the caller's.
    scratch: Outbox<P::Message>,
    /// Messages that named another loop (only a peer with another layout could send them;
    /// the handshake's protocol name, which carries the loop count, keeps such peers out).
    messages_misrouted: u64,
}

impl<P: Replica> LoopCore<P> {
    pub fn new(core: P, index: usize, count: usize) -> LoopCore<P> {
        assert!(index < count && count <= EVENT_LOOPS_MAX, "loop {index} of {count}");
        LoopCore {
            index: index as u16,
            count: count as u16,
            core,
            scratch: Outbox::default(),
            messages_misrouted: 0,
        }
    }

    pub fn inner(&self) -> &P {
        &self.core
    }

    /// Run `call` on the inner core, then move its outbox into `out`, messages tagged.
    fn with_outbox(
        &mut self,
        out: &mut Outbox<LoopMessage<P::Message>>,
        call: impl FnOnce(&mut P, &mut Outbox<P::Message>),
    ) {
        call(&mut self.core, &mut self.scratch);
        let event_loop = self.index;
        out.messages.extend(
            self.scratch.messages.drain(..).map(|(to, message)| (to, LoopMessage { event_loop, message })),
        );
        out.replies.append(&mut self.scratch.replies);
    }

    /// A log number of the inner core, made unique across the node's loops (WAIT splits
    /// marks between loops by it): `local * count + index`.
    fn global_log(&self, local: u32) -> u32 {
        local * self.count as u32 + self.index as u32
    }
}

impl<P: Replica> Replica for LoopCore<P> {
    type Message = LoopMessage<P::Message>;

    fn id(&self) -> NodeId {
        self.core.id()
    }

    fn on_client(
        &mut self,
        now: Time,
        request: ClientRequestId,
        command: Command,
        out: &mut Outbox<Self::Message>,
    ) {
        debug_assert_eq!(loop_of(command.key(), self.count as usize), self.index as usize, "routed by key");
        self.with_outbox(out, |core, scratch| core.on_client(now, request, command, scratch));
    }

    fn on_message(
        &mut self,
        now: Time,
        from: NodeId,
        message: Self::Message,
        out: &mut Outbox<Self::Message>,
    ) {
        if message.event_loop != self.index {
            self.messages_misrouted += 1;
            return;
        }
        self.with_outbox(out, |core, scratch| core.on_message(now, from, message.message, scratch));
    }

    fn on_tick(&mut self, now: Time, out: &mut Outbox<Self::Message>) {
        self.with_outbox(out, |core, scratch| core.on_tick(now, scratch));
    }

    fn on_view(&mut self, now: Time, view: View, out: &mut Outbox<Self::Message>) {
        self.with_outbox(out, |core, scratch| core.on_view(now, view, scratch));
    }

    fn on_synced(&mut self, now: Time, out: &mut Outbox<Self::Message>) {
        self.with_outbox(out, |core, scratch| core.on_synced(now, scratch));
    }

    fn on_lease(&mut self, now: Time, valid_until: Option<Time>, out: &mut Outbox<Self::Message>) {
        self.with_outbox(out, |core, scratch| core.on_lease(now, valid_until, scratch));
    }

    fn is_caught_up(&self) -> bool {
        self.core.is_caught_up()
    }

    fn event_counts(&self, report: &mut dyn FnMut(&'static str, u64)) {
        self.core.event_counts(report);
    }

    fn leaves_before_sync(&self, message: &Self::Message) -> bool {
        self.core.leaves_before_sync(&message.message)
    }

    fn replies_before_sync(&self) -> bool {
        self.core.replies_before_sync()
    }
}

impl<P> ServedReplica for LoopCore<P>
where
    P: ServedReplica,
    P::Message: WireMessage + Send + 'static,
{
    fn protocol_name(&self) -> &'static str {
        self.core.protocol_name()
    }
    fn current_view(&self) -> View {
        self.core.current_view()
    }
    fn operational(&self) -> bool {
        self.core.operational()
    }
    fn keys_with_values(&self) -> usize {
        self.core.keys_with_values()
    }
    fn keys(&self) -> Vec<Key> {
        self.core.keys()
    }
    fn counters(&self) -> Vec<(&'static str, u64)> {
        let mut counters = self.core.counters();
        counters.push(("event_loops", 1));
        counters.push(("loop_messages_misrouted", self.messages_misrouted));
        counters
    }
    fn is_priority(message: &Self::Message) -> bool {
        P::is_priority(&message.message)
    }
    const READS_INLINE: bool = P::READS_INLINE;
    fn take_durable_records(&mut self) -> Vec<PersistRecord> {
        self.core.take_durable_records()
    }
    fn persist_turn(&mut self) -> Result<(), String> {
        self.core.persist_turn()
    }
    fn persist_all(&mut self) -> Result<(), String> {
        self.core.persist_all()
    }
    fn start_sync_thread(
        &mut self,
        wake: Box<dyn Fn() + Send>,
    ) -> Result<Option<std::time::Duration>, String> {
        self.core.start_sync_thread(wake)
    }
    fn persist_turn_elsewhere(&mut self) -> Result<Option<u64>, String> {
        self.core.persist_turn_elsewhere()
    }
    fn poll_synced(&mut self) -> Result<Option<(u64, std::time::Duration)>, String> {
        self.core.poll_synced()
    }
    fn turn_needs_sync(&self) -> bool {
        self.core.turn_needs_sync()
    }
    fn write_mark(&self, key: &Key) -> WriteMark {
        match self.core.write_mark(key) {
            WriteMark::Log { log, index } => WriteMark::Log { log: self.global_log(log), index },
            members => members,
        }
    }
    fn log_holders(&self, log: u32, index: u64) -> NodeSet {
        let count = self.count as u32;
        if log % count != self.index as u32 {
            return NodeSet::EMPTY;
        }
        self.core.log_holders(log / count, index)
    }
    fn message_keys(message: &Self::Message, keys: &mut Vec<Key>) {
        P::message_keys(&message.message, keys);
    }
    fn durable_record(&self, keys: &[Key]) -> Option<Vec<u8>> {
        self.core.durable_record(keys)
    }
    fn durable_keys(&self) -> Vec<Key> {
        self.core.durable_keys()
    }
    fn holds_all_data(&self) -> bool {
        self.core.holds_all_data()
    }
    fn leave(&mut self, now: Time, out: &mut Outbox<Self::Message>) {
        self.with_outbox(out, |core, scratch| core.leave(now, scratch));
    }
    fn has_left(&self) -> bool {
        self.core.has_left()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::{Bytes, BytesMut};
    use chorus_core::Outcome;
    use chorus_hermes::{Hermes, HermesConfig};

    fn members() -> NodeSet {
        NodeSet::from_iter([NodeId(0), NodeId(1), NodeId(2)])
    }

    fn hermes_loop(index: usize, count: usize) -> LoopCore<Hermes> {
        LoopCore::new(Hermes::new(HermesConfig::new(NodeId(0), members())), index, count)
    }

    fn key_on_loop(event_loop: usize, count: usize) -> Key {
        (0..)
            .map(|index| Key::from(format!("k{index}")))
            .find(|key| loop_of(key, count) == event_loop)
            .expect("some key on every loop")
    }

    #[test]
    fn messages_carry_their_loop_and_round_trip() {
        let mut core = hermes_loop(1, 2);
        let mut out = Outbox::default();
        let put = Command::Write { key: key_on_loop(1, 2), value: Some(Bytes::from_static(b"v")) };
        core.on_client(Time::ZERO, ClientRequestId(0), put, &mut out);
        assert!(!out.messages.is_empty(), "a write invalidates the other replicas");
        for (_, message) in &out.messages {
            assert_eq!(message.event_loop, 1);
            let mut buf = BytesMut::new();
            message.encode(&mut buf);
            assert_eq!(&LoopMessage::<chorus_hermes::Message>::decode_exact(buf.freeze()).unwrap(), message);
        }
        assert!(LoopMessage::<chorus_hermes::Message>::decode_exact(Bytes::from_static(&[1])).is_err());
    }

    #[test]
    fn a_loop_drops_and_counts_messages_for_another_loop() {
        let mut writer = hermes_loop(1, 2);
        let mut out = Outbox::default();
        let key = key_on_loop(1, 2);
        writer.on_client(
            Time::ZERO,
            ClientRequestId(0),
            Command::Write { key, value: Some(Bytes::from_static(b"v")) },
            &mut out,
        );
        let (_, invalidation) = out.messages.pop().expect("an invalidation");
        // Replica 1's loop 0 must not act on loop 1's invalidation.
        let mut other = LoopCore::new(Hermes::new(HermesConfig::new(NodeId(1), members())), 0, 2);
        let mut other_out = Outbox::default();
        other.on_message(Time::ZERO, NodeId(0), invalidation, &mut other_out);
        assert!(other_out.messages.is_empty(), "no acknowledgement from the wrong loop");
        assert_eq!(other.messages_misrouted, 1);
        // Its own loop reads the key as never written.
        let mut reads = Outbox::default();
        other.on_client(Time::ZERO, ClientRequestId(1), Command::Read { key: key_on_loop(0, 2) }, &mut reads);
        assert_eq!(reads.replies, vec![(ClientRequestId(1), Outcome::Value(None))]);
    }

    #[test]
    fn log_marks_are_numbered_across_loops() {
        let core = hermes_loop(1, 3);
        assert_eq!(core.global_log(0), 1);
        assert_eq!(core.global_log(2), 7);
        assert_eq!(core.log_holders(0, 1), NodeSet::EMPTY, "log 0 belongs to loop 0");
    }
}
