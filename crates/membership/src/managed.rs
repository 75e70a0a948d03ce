//! A protocol core together with its membership node, as one `Replica`: the membership node
//! decides views and leases, and the protocol hears about them through `on_view` and
//! `on_lease`. The simulator and the server drive this pair exactly like a bare protocol.

use bytes::{BufMut, BytesMut};
use chorus_core::codec::{DecodeError, Reader, WireMessage};
use chorus_core::{ClientRequestId, Command, NodeId, Outbox, Replica, Time, View};

use crate::message::MembershipMessage;
use crate::node::{Membership, MembershipEvent, MembershipOutbox, PersistRecord};

/// What travels between two managed replicas.
#[derive(Clone, Debug)]
pub enum Wire<M> {
    Protocol(M),
    Membership(MembershipMessage),
}

pub struct WithMembership<P: Replica> {
    protocol: P,
    membership: Membership,
    protocol_out: Outbox<P::Message>,
    membership_out: MembershipOutbox,
    /// Raft state the runtime must make durable before it sends what the same calls produced.
    persist: Vec<PersistRecord>,
    /// The protocol has heard the membership's lease at least once. Until then a core runs
    /// with the lease it was built with (unlimited, for tests without a membership service),
    /// so a node restarted from its files would serve reads before its first tick.
    lease_told: bool,
    /// Client requests that arrived while the membership was restarting
    /// ([`Membership::is_restarting`]): the protocol gets them once it knows its view.
    held: Vec<(ClientRequestId, Command)>,
}

impl<P: Replica> WithMembership<P> {
    pub fn new(protocol: P, membership: Membership) -> WithMembership<P> {
        assert_eq!(protocol.id(), membership.me(), "a protocol and its membership node are one replica");
        WithMembership {
            protocol,
            membership,
            protocol_out: Outbox::default(),
            membership_out: MembershipOutbox::default(),
            persist: Vec::new(),
            lease_told: false,
            held: Vec::new(),
        }
    }

    pub fn protocol(&self) -> &P {
        &self.protocol
    }

    /// For the runtime's persistence hooks (taking a core's durable records), which produce no
    /// messages: anything that does must go through the `Replica` methods.
    pub fn protocol_mut(&mut self) -> &mut P {
        &mut self.protocol
    }

    pub fn membership(&self) -> &Membership {
        &self.membership
    }

    /// Leave the view for a planned stop (see [`Membership::leave`]): the protocol hears
    /// at once that it holds no lease, so it serves nothing before the others drop it.
    pub fn leave(&mut self, now: Time, out: &mut Outbox<Wire<P::Message>>) {
        self.membership.leave(now, &mut self.membership_out);
        self.protocol.on_lease(now, None, &mut self.protocol_out);
        self.flush(now, out);
    }

    /// Records to write durably, in order, before sending the messages produced since the
    /// last call. A runtime without durable storage (the simulator) may drop them.
    pub fn take_persist_records(&mut self) -> Vec<PersistRecord> {
        std::mem::take(&mut self.persist)
    }

    fn tell_lease(&mut self, now: Time) {
        self.protocol.on_lease(now, self.membership.lease_until(), &mut self.protocol_out);
        self.lease_told = true;
    }

    /// A node restarted with its data keeps its protocol out of every view until the
    /// membership has replayed its log and waited out its previous incarnation's promises: the
    /// core, built from its files, starts in the cluster's first view, older than its data.
    fn protocol_waits(&self) -> bool {
        self.membership.is_restarting()
    }

    /// The restart is over: the protocol has heard its view; give it the held requests.
    fn release_held(&mut self, now: Time, out: &mut Outbox<Wire<P::Message>>) {
        if self.held.is_empty() || self.protocol_waits() {
            return;
        }
        self.tell_lease(now);
        for (request, command) in std::mem::take(&mut self.held) {
            self.protocol.on_client(now, request, command, &mut self.protocol_out);
        }
        self.flush(now, out);
    }

    /// Hand the membership node's news to the protocol, then everything to the runtime.
    fn flush(&mut self, now: Time, out: &mut Outbox<Wire<P::Message>>) {
        self.persist.append(&mut self.membership_out.persist);
        for event in self.membership_out.events.drain(..) {
            let MembershipEvent::ViewInstalled(view) = event;
            self.protocol.on_view(now, view, &mut self.protocol_out);
        }
        for (to, message) in self.membership_out.messages.drain(..) {
            out.send(to, Wire::Membership(message));
        }
        for (destination, message) in self.protocol_out.messages.drain(..) {
            out.messages.push((destination, Wire::Protocol(message)));
        }
        out.replies.append(&mut self.protocol_out.replies);
    }
}

impl<P: Replica> Replica for WithMembership<P> {
    type Message = Wire<P::Message>;

    fn id(&self) -> NodeId {
        self.protocol.id()
    }

    fn on_client(
        &mut self,
        now: Time,
        request: ClientRequestId,
        command: Command,
        out: &mut Outbox<Self::Message>,
    ) {
        if self.protocol_waits() {
            self.held.push((request, command));
            return;
        }
        if !self.lease_told {
            self.tell_lease(now);
        }
        self.protocol.on_client(now, request, command, &mut self.protocol_out);
        self.flush(now, out);
    }

    fn on_message(
        &mut self,
        now: Time,
        from: NodeId,
        message: Self::Message,
        out: &mut Outbox<Self::Message>,
    ) {
        match message {
            // Dropped, as if lost: the sender retransmits to the view we will act in.
            Wire::Protocol(_) if self.protocol_waits() => {}
            Wire::Protocol(message) => self.protocol.on_message(now, from, message, &mut self.protocol_out),
            Wire::Membership(message) => {
                self.membership.on_message(now, from, message, &mut self.membership_out)
            }
        }
        self.flush(now, out);
        self.release_held(now, out);
    }

    fn on_tick(&mut self, now: Time, out: &mut Outbox<Self::Message>) {
        self.membership.on_tick(now, &mut self.membership_out);
        self.flush(now, out);
        if self.protocol_waits() {
            return;
        }
        self.release_held(now, out);
        self.tell_lease(now);
        self.protocol.on_tick(now, &mut self.protocol_out);
        if self.protocol.is_caught_up() {
            self.membership.note_caught_up(now);
        }
        self.flush(now, out);
    }

    /// Views come from the membership node, not from outside.
    fn on_view(&mut self, _now: Time, _view: View, _out: &mut Outbox<Self::Message>) {}

    fn end_turn(&mut self, now: Time, out: &mut Outbox<Self::Message>) {
        self.protocol.end_turn(now, &mut self.protocol_out);
        self.flush(now, out);
    }

    /// Joined (or never left) and holding all the data.
    fn is_caught_up(&self) -> bool {
        !self.membership.is_joining() && !self.protocol_waits() && self.protocol.is_caught_up()
    }

    fn is_control(message: &Self::Message) -> bool {
        match message {
            Wire::Membership(_) => true,
            Wire::Protocol(message) => P::is_control(message),
        }
    }

    fn leaves_before_sync(&self, message: &Self::Message) -> bool {
        match message {
            Wire::Membership(_) => false,
            Wire::Protocol(message) => self.protocol.leaves_before_sync(message),
        }
    }

    fn replies_before_sync(&self) -> bool {
        self.protocol.replies_before_sync()
    }

    /// The view the protocol acts in: a joiner's protocol hears of none before its join.
    fn installed_view(&self) -> Option<View> {
        if self.membership.is_joining() || self.protocol_waits() {
            return None;
        }
        Some(self.membership.view())
    }

    fn event_counts(&self, report: &mut dyn FnMut(&'static str, u64)) {
        self.protocol.event_counts(report);
        let stats = self.membership.stats();
        report("membership.lease_lapses", stats.lease_lapses);
        report("membership.rejoins", self.membership.rejoins());
    }
}

const TAG_PROTOCOL: u8 = 1;
const TAG_MEMBERSHIP: u8 = 2;

impl<M: WireMessage> WireMessage for Wire<M> {
    fn encode(&self, buf: &mut BytesMut) {
        match self {
            Wire::Protocol(message) => {
                buf.put_u8(TAG_PROTOCOL);
                message.encode(buf);
            }
            Wire::Membership(message) => {
                buf.put_u8(TAG_MEMBERSHIP);
                message.encode(buf);
            }
        }
    }

    fn decode(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(match reader.u8()? {
            TAG_PROTOCOL => Wire::Protocol(M::decode(reader)?),
            TAG_MEMBERSHIP => Wire::Membership(MembershipMessage::decode(reader)?),
            tag => return Err(DecodeError::UnknownTag { what: "wire", tag }),
        })
    }
}
