//! The fuzz targets: each decodes arbitrary bytes the way the network path does, checks what
//! must hold for any input, and returns a signature of the outcome (which decoder, how far it
//! got, which error) that the fuzzer uses to keep inputs reaching new outcomes.

use bytes::{Bytes, BytesMut};
use chorus_core::codec::{decode_batch, decode_frame, encode_batch, WireMessage};
use chorus_membership::{MembershipMessage, Wire};

/// A named target.
pub struct Target {
    pub name: &'static str,
    pub run: fn(&[u8]) -> u64,
    /// Valid inputs to start from (encodings of real messages).
    pub seeds: fn() -> Vec<Vec<u8>>,
}

pub const TARGETS: &[Target] = &[
    Target { name: "resp", run: resp, seeds: crate::seeds::resp },
    Target { name: "peer", run: peer, seeds: crate::seeds::peer },
    Target { name: "membership", run: membership, seeds: crate::seeds::membership },
    Target { name: "group", run: group, seeds: crate::seeds::group },
];

pub fn target(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|target| target.name == name)
}

/// Accumulates an outcome signature.
struct Signature(u64);

impl Signature {
    fn new(selector: u8) -> Signature {
        Signature(0xcbf2_9ce4_8422_2325 ^ selector as u64)
    }
    fn add(&mut self, value: u64) {
        self.0 = (self.0 ^ value).wrapping_mul(0x0000_0100_0000_01b3);
    }
    fn add_text(&mut self, text: &str) {
        // Only the words, not numbers: "frame declares 123 bytes" and "... 456 ..." are one path.
        let words: String = text.chars().filter(|c| c.is_alphabetic() || *c == ' ').collect();
        self.add(crate::fnv1a(words.as_bytes()));
    }
}

// ------------------------------------------------------------------------------------ RESP

/// RESP framing and command parsing, as a client connection feeds them: every command the
/// parser returns goes through the command table and its mapping to a core command. Parsing
/// the same bytes in pieces (as they arrive from a socket) must give the same commands and
/// the same error as parsing them at once.
pub fn resp(input: &[u8]) -> u64 {
    let limits = chorus_server::resp::Limits { bulk_bytes_max: 1 << 20, ..Default::default() };
    let (whole, error) = parse_resp(&[input], &limits);
    let step = 1 + input.first().map_or(0, |byte| *byte as usize % 13);
    let pieces: Vec<&[u8]> = input.chunks(step).collect();
    let (split, split_error) = parse_resp(&pieces, &limits);
    assert_eq!(whole, split, "commands differ when the bytes arrive {step} at a time");
    assert_eq!(error, split_error, "errors differ when the bytes arrive {step} at a time");
    let mut signature = Signature::new(0);
    signature.add(whole.len().min(4) as u64);
    if let Some(error) = &error {
        signature.add_text(error);
    }
    for args in &whole {
        let (name, request) = chorus_server::command::parse(args);
        signature.add(crate::fnv1a(name.as_bytes()));
        match request {
            Ok(request) => {
                if let Some(Err(reply)) = chorus_server::command::single_key_command(&request) {
                    signature.add_text(&format!("{reply:?}"));
                }
            }
            Err(reply) => signature.add_text(&format!("{reply:?}")),
        }
    }
    signature.0
}

type Parsed = (Vec<Vec<Bytes>>, Option<String>);

fn parse_resp(pieces: &[&[u8]], limits: &chorus_server::resp::Limits) -> Parsed {
    let mut buf = BytesMut::new();
    let mut parser = chorus_server::resp::Parser::default();
    let mut commands = Vec::new();
    for piece in pieces {
        buf.extend_from_slice(piece);
        loop {
            match parser.parse(&mut buf, limits) {
                Ok(Some(args)) => commands.push(args),
                Ok(None) => break,
                Err(error) => return (commands, Some(error.to_string())),
            }
        }
    }
    (commands, None)
}

// ------------------------------------------------------------------------------ peer codec

/// Peer links: the first byte picks what the rest is decoded as: frames (length, version,
/// kind, CRC) whose payloads are decoded by kind, a batch of one protocol's messages (with the
/// membership service's wrapper, as the server runs them), or a handshake message.
pub fn peer(input: &[u8]) -> u64 {
    let Some((&selector, rest)) = input.split_first() else { return 0 };
    let payload = Bytes::copy_from_slice(rest);
    let mut signature = Signature::new(selector);
    match selector % 10 {
        0 => frames(rest, &mut signature),
        1 => batch::<Wire<chorus_hermes::Message>>(payload, &mut signature),
        2 => batch::<Wire<chorus_craq::Message>>(payload, &mut signature),
        3 => batch::<Wire<chorus_zab::Message>>(payload, &mut signature),
        4 => batch::<chorus_raftlog::Message>(payload, &mut signature),
        5 => batch::<Wire<chorus_chain::Message>>(payload, &mut signature),
        6 => single::<chorus_net::handshake::Hello>(payload, &mut signature),
        7 => single::<chorus_net::handshake::Challenge>(payload, &mut signature),
        8 => single::<chorus_net::handshake::Proof>(payload, &mut signature),
        _ => single::<chorus_net::handshake::Welcome>(payload, &mut signature),
    }
    signature.0
}

/// Frames as a peer connection reads them, each payload decoded as every protocol would.
fn frames(input: &[u8], signature: &mut Signature) {
    let mut buf = BytesMut::from(input);
    loop {
        match decode_frame(&mut buf, 1 << 20) {
            Ok(Some(frame)) => {
                signature.add(frame.kind as u64);
                batch::<Wire<chorus_hermes::Message>>(frame.payload.clone(), signature);
                batch::<chorus_raftlog::Message>(frame.payload.clone(), signature);
                published(frame.payload, signature);
            }
            Ok(None) => return,
            Err(error) => return signature.add_text(&error.to_string()),
        }
    }
}

/// A Pub/Sub frame's payload (chorus_server::pubsub::wire): what decodes re-encodes to the
/// same bytes.
fn published(payload: Bytes, signature: &mut Signature) {
    use chorus_server::pubsub::wire;
    match wire::decode(payload.clone()) {
        Ok(message) => {
            signature.add(message.channel.len().min(4) as u64);
            let again = wire::encode(message.scope, &message.channel, &message.message);
            assert_eq!(again.as_ref(), payload.as_ref(), "re-encoding a Pub/Sub message is not stable");
        }
        Err(error) => signature.add_text(&error),
    }
}

/// Decode a batch; what decodes must re-encode to bytes that decode to the same encoding.
fn batch<M: WireMessage>(payload: Bytes, signature: &mut Signature) {
    match decode_batch::<M>(payload) {
        Ok(messages) => {
            signature.add(messages.len().min(4) as u64);
            let mut first = BytesMut::new();
            encode_batch(messages.iter(), &mut first);
            let again = decode_batch::<M>(first.clone().freeze()).expect("a re-encoded batch decodes");
            let mut second = BytesMut::new();
            encode_batch(again.iter(), &mut second);
            assert_eq!(first, second, "re-encoding a decoded batch is not stable");
        }
        Err(error) => signature.add_text(&error.to_string()),
    }
}

fn single<M: WireMessage>(payload: Bytes, signature: &mut Signature) {
    match M::decode_exact(payload) {
        Ok(message) => {
            let mut first = BytesMut::new();
            message.encode(&mut first);
            let again = M::decode_exact(first.clone().freeze()).expect("a re-encoded message decodes");
            let mut second = BytesMut::new();
            again.encode(&mut second);
            assert_eq!(first, second, "re-encoding a decoded message is not stable");
        }
        Err(error) => signature.add_text(&error.to_string()),
    }
}

// ------------------------------------------------------------------------------ membership

/// Membership messages (heartbeats, acks, Raft) and the membership log read at start.
pub fn membership(input: &[u8]) -> u64 {
    let Some((&selector, rest)) = input.split_first() else { return 0 };
    let mut signature = Signature::new(selector);
    match selector % 2 {
        0 => batch::<MembershipMessage>(Bytes::copy_from_slice(rest), &mut signature),
        _ => match chorus_membership::decode_records(rest) {
            Ok((records, valid_bytes)) => {
                assert!(valid_bytes <= rest.len(), "whole frames past the input's end");
                signature.add(records.len().min(4) as u64)
            }
            Err(error) => signature.add_text(&error.to_string()),
        },
    }
    signature.0
}

// ----------------------------------------------------------------------------- group host

/// The group host's wire: frames, the handshake, control requests and replies, batches of
/// group messages.
pub fn group(input: &[u8]) -> u64 {
    use chorus_group::runtime::wire::{self, ControlReply, ControlRequest, Hello};
    let Some((&selector, rest)) = input.split_first() else { return 0 };
    let payload = Bytes::copy_from_slice(rest);
    let mut signature = Signature::new(selector);
    match selector % 5 {
        0 => {
            let mut buf = BytesMut::from(rest);
            loop {
                match decode_frame(&mut buf, wire::HELLO_BYTES_MAX) {
                    Ok(Some(frame)) => {
                        signature.add(frame.kind as u64);
                        match frame.kind {
                            wire::FRAME_KIND_HELLO => single::<Hello>(frame.payload, &mut signature),
                            wire::FRAME_KIND_CONTROL => {
                                single::<ControlRequest>(frame.payload, &mut signature)
                            }
                            wire::FRAME_KIND_REPLY => single::<ControlReply>(frame.payload, &mut signature),
                            _ => batch::<chorus_group::GroupMessage>(frame.payload, &mut signature),
                        }
                    }
                    Ok(None) => break,
                    Err(error) => {
                        signature.add_text(&error.to_string());
                        break;
                    }
                }
            }
        }
        1 => single::<Hello>(payload, &mut signature),
        2 => single::<ControlRequest>(payload, &mut signature),
        3 => single::<ControlReply>(payload, &mut signature),
        _ => batch::<chorus_group::GroupMessage>(payload, &mut signature),
    }
    signature.0
}
