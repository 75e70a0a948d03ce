//! Peer messages of the chain store and their wire encoding.

use bytes::{BufMut, BytesMut};
use chorus_core::codec::{DecodeError, Reader, WireMessage, WriteExt};
use chorus_core::{Command, Epoch, Outcome};
use chorus_group::GroupMessage;

#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Message {
    /// Group-primitive traffic (HyperLoop §4): operations member to member (the coordinator
    /// hands them to the head locally), and the tail's acknowledgements and any member's
    /// refusals on their way to the coordinator, which lives on the head's node.
    Group(GroupMessage),
    /// A client update that entered at the sender, on its way to the coordinator. `seq`
    /// numbers the sender's updates; `done_below`: every lower one has been answered.
    Forward { epoch: Epoch, seq: u64, done_below: u64, command: Command },
    /// The coordinator's answer to a forwarded update.
    Done { epoch: Epoch, seq: u64, outcome: Outcome },
}

const TAG_GROUP: u8 = 1;
const TAG_FORWARD: u8 = 2;
const TAG_DONE: u8 = 3;

impl WireMessage for Message {
    fn encode(&self, buf: &mut BytesMut) {
        match self {
            Message::Group(message) => {
                buf.put_u8(TAG_GROUP);
                message.encode(buf);
            }
            Message::Forward { epoch, seq, done_below, command } => {
                buf.put_u8(TAG_FORWARD);
                buf.put_epoch(*epoch);
                buf.put_u64_le(*seq);
                buf.put_u64_le(*done_below);
                command.encode(buf);
            }
            Message::Done { epoch, seq, outcome } => {
                buf.put_u8(TAG_DONE);
                buf.put_epoch(*epoch);
                buf.put_u64_le(*seq);
                outcome.encode(buf);
            }
        }
    }

    fn decode(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(match reader.u8()? {
            TAG_GROUP => Message::Group(GroupMessage::decode(reader)?),
            TAG_FORWARD => Message::Forward {
                epoch: reader.epoch()?,
                seq: reader.u64()?,
                done_below: reader.u64()?,
                command: Command::decode(reader)?,
            },
            TAG_DONE => Message::Done {
                epoch: reader.epoch()?,
                seq: reader.u64()?,
                outcome: Outcome::decode(reader)?,
            },
            tag => return Err(DecodeError::UnknownTag { what: "chain message", tag }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use chorus_core::RmwOp;

    #[test]
    fn messages_round_trip_and_garbage_is_an_error() {
        let messages = vec![
            Message::Forward {
                epoch: Epoch(3),
                seq: 9,
                done_below: 4,
                command: Command::Rmw { key: Bytes::from("k"), op: RmwOp::IncrementBy(-2) },
            },
            Message::Done { epoch: Epoch(1), seq: 2, outcome: Outcome::Integer(5) },
            Message::Group(GroupMessage::Ack {
                group: chorus_group::GroupId(1),
                epoch: 2,
                seq: 3,
                outcome: Ok(vec![Some(1), None]),
            }),
        ];
        for message in messages {
            let mut buf = BytesMut::new();
            message.encode(&mut buf);
            assert_eq!(Message::decode_exact(buf.freeze()).unwrap(), message);
        }
        for bytes in [&b""[..], &[9u8][..], &[2u8, 1, 2][..]] {
            assert!(Message::decode_exact(Bytes::copy_from_slice(bytes)).is_err());
        }
    }
}
