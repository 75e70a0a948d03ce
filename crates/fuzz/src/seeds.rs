//! Seed inputs: encodings of real messages, produced by running the real cores for a moment
//! (a write, an increment, ticks, and one round of answers), so the committed corpus follows
//! the wire formats as they change (`chorus-fuzz seed` rewrites it).

use bytes::{Bytes, BytesMut};
use chorus_core::codec::{encode_batch, encode_frame, WireMessage};
use chorus_core::{ClientRequestId, Command, NodeId, NodeSet, Outbox, Replica, RmwOp, Time};
use chorus_membership::{Membership, MembershipConfig, WithMembership};

fn replicas() -> NodeSet {
    [NodeId(0), NodeId(1), NodeId(2)].into_iter().collect()
}

fn key(text: &str) -> Bytes {
    Bytes::copy_from_slice(text.as_bytes())
}

/// What nodes 0 and 1 of a fresh 3-node cluster send while node 0 serves a write and an
/// increment and both tick for 300 ms.
fn conversation<R: Replica>(mut make: impl FnMut(NodeId) -> R) -> Vec<R::Message>
where
    R::Message: Clone,
{
    let (mut first, mut second) = (make(NodeId(0)), make(NodeId(1)));
    let mut out = Outbox::default();
    let mut sent = Vec::new();
    let write = Command::Write { key: key("k"), value: Some(key("value")) };
    let incr = Command::Rmw { key: key("n"), op: RmwOp::IncrementBy(5) };
    for millis in 1..300u64 {
        let now = Time::from_millis(millis);
        if millis == 100 {
            first.on_client(now, ClientRequestId(1), write.clone(), &mut out);
            first.on_client(now, ClientRequestId(2), incr.clone(), &mut out);
        }
        first.on_tick(now, &mut out);
        second.on_tick(now, &mut out);
        let messages: Vec<_> = out.messages.drain(..).map(|(_, message)| message).collect();
        out.replies.clear();
        for message in &messages {
            second.on_message(now, NodeId(0), message.clone(), &mut out);
        }
        sent.extend(messages);
        if sent.len() > 64 {
            break;
        }
    }
    sent.extend(out.messages.drain(..).map(|(_, message)| message));
    sent.truncate(64);
    sent
}

fn managed<P: Replica>(protocol: P, me: NodeId) -> WithMembership<P> {
    WithMembership::new(protocol, Membership::new(MembershipConfig::new(me, replicas()), Time::ZERO))
}

/// Each message alone and all of them in one batch, behind `selector`.
fn batches<M: WireMessage>(selector: u8, messages: &[M]) -> Vec<Vec<u8>> {
    let mut seeds = Vec::new();
    let mut one = |messages: &[M]| {
        let mut buf = BytesMut::from(&[selector][..]);
        encode_batch(messages.iter(), &mut buf);
        seeds.push(buf.to_vec());
    };
    for message in messages.iter().take(16) {
        one(std::slice::from_ref(message));
    }
    one(messages);
    seeds
}

fn single<M: WireMessage>(selector: u8, message: &M) -> Vec<u8> {
    let mut buf = BytesMut::from(&[selector][..]);
    message.encode(&mut buf);
    buf.to_vec()
}

pub fn resp() -> Vec<Vec<u8>> {
    [
        &b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nvalue\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"[..],
        b"PING\r\nset k v\r\nINCRBY n 5\r\n",
        b"*4\r\n$7\r\nSESSION\r\n$1\r\n7\r\n$1\r\n1\r\n$4\r\nINCR\r\n",
        b"*1\r\n$5\r\nMULTI\r\n*3\r\n$3\r\nSET\r\n$1\r\na\r\n$1\r\n1\r\n*1\r\n$4\r\nEXEC\r\n",
        b"*4\r\n$4\r\nHSET\r\n$1\r\nh\r\n$1\r\nf\r\n$1\r\nv\r\n*3\r\n$3\r\nCAS\r\n$1\r\nk\r\n$1\r\nv\r\n",
        b"*2\r\n$4\r\nAUTH\r\n$6\r\nsecret\r\n*3\r\n$5\r\nHELLO\r\n$1\r\n3\r\n",
        b"*5\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n$2\r\nNX\r\n$3\r\nGET\r\n*2\r\n$4\r\nINFO\r\n$11\r\nreplication\r\n",
        b"*3\r\n$4\r\nMGET\r\n$1\r\na\r\n$1\r\nb\r\n*1\r\n$6\r\nDBSIZE\r\n*2\r\n$4\r\nKEYS\r\n$1\r\n*\r\n",
    ]
    .iter()
    .map(|seed| seed.to_vec())
    .collect()
}

pub fn peer() -> Vec<Vec<u8>> {
    let hermes = conversation(|me| {
        managed(chorus_hermes::Hermes::new(chorus_hermes::HermesConfig::new(me, replicas())), me)
    });
    let craq =
        conversation(|me| managed(chorus_craq::Craq::new(chorus_craq::CraqConfig::new(me, replicas())), me));
    let zab =
        conversation(|me| managed(chorus_zab::Zab::new(chorus_zab::ZabConfig::new(me, replicas())), me));
    let raftlog =
        conversation(|me| chorus_raftlog::RaftLog::new(chorus_raftlog::RaftLogConfig::new(me, replicas())));
    let chain = conversation(|me| {
        managed(chorus_chain::Chain::new(chorus_chain::ChainConfig::new(me, replicas())), me)
    });
    let mut seeds = Vec::new();
    // Whole frames, as on a peer connection.
    let mut payload = BytesMut::new();
    encode_batch(hermes.iter(), &mut payload);
    let mut frame = BytesMut::from(&[0u8][..]);
    encode_frame(chorus_net::kind::BATCH, &payload, &mut frame);
    seeds.push(frame.to_vec());
    // A published message, as the Pub/Sub hubs send it.
    let published =
        chorus_server::pubsub::wire::encode(chorus_server::pubsub::wire::Scope::Global, b"news", b"hello");
    let mut frame = BytesMut::from(&[0u8][..]);
    encode_frame(chorus_net::kind::PUBSUB, &published, &mut frame);
    seeds.push(frame.to_vec());
    seeds.extend(batches(1, &hermes));
    seeds.extend(batches(2, &craq));
    seeds.extend(batches(3, &zab));
    seeds.extend(batches(4, &raftlog));
    seeds.extend(batches(5, &chain));
    let nonce = [7u8; chorus_net::handshake::NONCE_BYTES];
    seeds.push(single(6, &chorus_net::handshake::Hello { node: NodeId(1), nonce }));
    seeds.push(single(7, &chorus_net::handshake::Challenge { nonce }));
    let proof = chorus_net::handshake::Proof { mac: [9; 32], protocol: key("hermes+membership") };
    seeds.push(single(8, &proof));
    seeds.push(single(9, &chorus_net::handshake::Welcome { mac: [9; 32] }));
    seeds
}

pub fn membership() -> Vec<Vec<u8>> {
    let messages: Vec<chorus_membership::MembershipMessage> = conversation(|me| {
        managed(chorus_hermes::Hermes::new(chorus_hermes::HermesConfig::new(me, replicas())), me)
    })
    .into_iter()
    .filter_map(|wire| match wire {
        chorus_membership::Wire::Membership(message) => Some(message),
        chorus_membership::Wire::Protocol(_) => None,
    })
    .collect();
    let mut seeds = batches(0, &messages);
    // A membership log: what a node persisted while it started.
    let mut node = managed(
        chorus_hermes::Hermes::new(chorus_hermes::HermesConfig::new(NodeId(0), replicas())),
        NodeId(0),
    );
    let mut out = Outbox::default();
    for millis in 1..300 {
        node.on_tick(Time::from_millis(millis), &mut out);
    }
    let records = node.take_persist_records();
    let mut log = BytesMut::from(&[1u8][..]);
    chorus_membership::encode_records(&records, &mut log);
    seeds.push(log.to_vec());
    seeds
}

pub fn group() -> Vec<Vec<u8>> {
    use chorus_group::runtime::wire::{ControlReply, ControlRequest, Hello, Role};
    use chorus_group::{GroupId, GroupMessage, Token};
    let token = Token([3; 16]);
    let hello = Hello { role: Role::Caller, tenant: chorus_region::TenantId(1), token };
    let link = Hello {
        role: Role::Link { group: GroupId(2), epoch: 1, from_position: 0 },
        tenant: chorus_region::TenantId(1),
        token,
    };
    let mut seeds = vec![single(1, &hello), single(1, &link)];
    seeds.push(single(2, &ControlRequest::Ping { id: 1 }));
    seeds.push(single(2, &ControlRequest::Read { id: 2, group: GroupId(2), offset: 0, len: 64 }));
    seeds.push(single(3, &ControlReply::Data { id: 2, bytes: key("region bytes") }));
    seeds.push(single(3, &ControlReply::Error { id: 3, message: "no such group".into() }));
    let messages = vec![GroupMessage::Refused {
        group: GroupId(2),
        epoch: 1,
        seq: 9,
        refusal: chorus_group::Refusal::Unauthorized,
    }];
    seeds.extend(batches(4, &messages));
    let mut frame = BytesMut::from(&[0u8][..]);
    let mut payload = BytesMut::new();
    hello.encode(&mut payload);
    encode_frame(chorus_group::runtime::wire::FRAME_KIND_HELLO, &payload, &mut frame);
    seeds.push(frame.to_vec());
    seeds
}
