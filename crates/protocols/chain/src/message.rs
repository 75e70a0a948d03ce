//! Peer messages of the chain store and their wire encoding.

use bytes::{BufMut, BytesMut};
use chorus_core::codec::{DecodeError, Reader, WireMessage, WriteExt};
use chorus_core::{Command, Epoch, NodeId, Outcome};
use chorus_group::GroupMessage;

use crate::layout::RegionSummary;

#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Message {
    /// Group-primitive traffic (HyperLoop §4): operations member to member (the coordinator
    /// hands them to the head locally), and the tail's acknowledgements and any member's
    /// refusals on their way to the coordinator, which lives on the head's node.
    Group(GroupMessage),
    /// A client update that entered at the sender, on its way to the coordinator. `seq`
    /// numbers the sender's updates; `done_below`: every lower one has been answered. `head`:
    /// the incarnation of the coordinator it was first sent to; another incarnation (the head
    /// restarted) ignores it, since it cannot know whether its predecessor executed it.
    Forward { epoch: Epoch, head: u64, seq: u64, done_below: u64, command: Command },
    /// The coordinator's answer to a forwarded update.
    Done { epoch: Epoch, seq: u64, outcome: Outcome },
    /// The coordinator (on the head's node) configures the group in view `epoch`: the data
    /// path's chain (`copy` false), or a one-member copy group with a joiner (`copy` true).
    /// `group_epoch` orders every configuration, also within one view. `catch_up`: the copy
    /// sends only the records the joiner's region lacks (it offered a region that is a
    /// prefix of the head's), so the region stays whole throughout. `coordinator`: the
    /// coordinator's incarnation (forwards go to it).
    Configure {
        epoch: Epoch,
        group_epoch: u64,
        copy: bool,
        catch_up: bool,
        chain: Vec<NodeId>,
        coordinator: u64,
    },
    /// A member installed the configuration `group_epoch`. `last_executed`: the lsn of the last
    /// record its region executed (its last-executed word): a recovery redoes every record
    /// from the oldest any member reports, so a member that missed part of an earlier,
    /// interrupted recovery (or restarted) is brought up to date.
    Configured { epoch: Epoch, group_epoch: u64, last_executed: u64 },
    /// A joiner refuses a data-path configuration that includes it: it has not been copied
    /// to in this view, so its region may be stale (§5.1: copy first, then join).
    NeedCopy { epoch: Epoch, group_epoch: u64 },
    /// A member without the data announces that it is joining in view `epoch` (sent until
    /// the coordinator starts copying to it), so members that still list it as linked (it
    /// restarted before anyone noticed) drop it. `offer`: where its region stands, when it is a
    /// whole image of the chain at some earlier point (a restart on its data directory): the
    /// coordinator then sends only what it missed, if its log still holds that.
    Joining { epoch: Epoch, offer: Option<RegionSummary> },
    /// A member restarted on its data, still linked (it was never removed from the view), in
    /// incarnation `incarnation`: its group member lost its place in the operation sequence,
    /// so the coordinator configures the chain again (and redoes the records in flight).
    Restarted { epoch: Epoch, incarnation: u64 },
    /// Every member of configuration `group_epoch` installed it: a joiner in its chain now
    /// holds all the data and is linked (it may serve and count as caught up).
    Linked { epoch: Epoch, group_epoch: u64 },
    /// The answer to `Linked`.
    LinkedAck { epoch: Epoch, group_epoch: u64 },
}

const TAG_GROUP: u8 = 1;
const TAG_FORWARD: u8 = 2;
const TAG_DONE: u8 = 3;
const TAG_CONFIGURE: u8 = 4;
const TAG_CONFIGURED: u8 = 5;
const TAG_NEED_COPY: u8 = 6;
const TAG_JOINING: u8 = 7;
const TAG_LINKED: u8 = 8;
const TAG_LINKED_ACK: u8 = 9;
const TAG_RESTARTED: u8 = 10;
/// More than any group can hold (`chorus_group::CHAIN_MEMBERS_MAX`); a bound for decoding.
const CHAIN_NODES_MAX: u8 = 64;

impl WireMessage for Message {
    fn encode(&self, buf: &mut BytesMut) {
        match self {
            Message::Group(message) => {
                buf.put_u8(TAG_GROUP);
                message.encode(buf);
            }
            Message::Forward { epoch, head, seq, done_below, command } => {
                buf.put_u8(TAG_FORWARD);
                buf.put_epoch(*epoch);
                buf.put_u64_le(*head);
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
            Message::Configure { epoch, group_epoch, copy, catch_up, chain, coordinator } => {
                buf.put_u8(TAG_CONFIGURE);
                buf.put_epoch(*epoch);
                buf.put_u64_le(*group_epoch);
                buf.put_u64_le(*coordinator);
                buf.put_bool(*copy);
                buf.put_bool(*catch_up);
                debug_assert!(chain.len() <= CHAIN_NODES_MAX as usize);
                buf.put_u8(chain.len() as u8);
                for node in chain {
                    buf.put_u8(node.0);
                }
            }
            Message::Configured { epoch, group_epoch, last_executed } => {
                put_pair(buf, TAG_CONFIGURED, *epoch, *group_epoch);
                buf.put_u64_le(*last_executed);
            }
            Message::NeedCopy { epoch, group_epoch } => put_pair(buf, TAG_NEED_COPY, *epoch, *group_epoch),
            Message::Joining { epoch, offer } => {
                buf.put_u8(TAG_JOINING);
                buf.put_epoch(*epoch);
                buf.put_bool(offer.is_some());
                if let Some(offer) = offer {
                    buf.put_u64_le(offer.log_head);
                    buf.put_u64_le(offer.last_lsn);
                    buf.put_u32_le(offer.last_crc);
                }
            }
            Message::Restarted { epoch, incarnation } => put_pair(buf, TAG_RESTARTED, *epoch, *incarnation),
            Message::Linked { epoch, group_epoch } => put_pair(buf, TAG_LINKED, *epoch, *group_epoch),
            Message::LinkedAck { epoch, group_epoch } => put_pair(buf, TAG_LINKED_ACK, *epoch, *group_epoch),
        }
    }

    fn decode(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(match reader.u8()? {
            TAG_GROUP => Message::Group(GroupMessage::decode(reader)?),
            TAG_FORWARD => Message::Forward {
                epoch: reader.epoch()?,
                head: reader.u64()?,
                seq: reader.u64()?,
                done_below: reader.u64()?,
                command: Command::decode(reader)?,
            },
            TAG_DONE => Message::Done {
                epoch: reader.epoch()?,
                seq: reader.u64()?,
                outcome: Outcome::decode(reader)?,
            },
            TAG_CONFIGURE => {
                let epoch = reader.epoch()?;
                let group_epoch = reader.u64()?;
                let coordinator = reader.u64()?;
                let copy = flag(reader, "chain copy flag")?;
                let catch_up = flag(reader, "chain catch-up flag")?;
                let len = reader.u8()?;
                if len == 0 || len > CHAIN_NODES_MAX {
                    return Err(DecodeError::UnknownTag { what: "chain length", tag: len });
                }
                let chain = (0..len).map(|_| reader.u8().map(NodeId)).collect::<Result<_, _>>()?;
                Message::Configure { epoch, group_epoch, copy, catch_up, chain, coordinator }
            }
            TAG_CONFIGURED => Message::Configured {
                epoch: reader.epoch()?,
                group_epoch: reader.u64()?,
                last_executed: reader.u64()?,
            },
            TAG_NEED_COPY => Message::NeedCopy { epoch: reader.epoch()?, group_epoch: reader.u64()? },
            TAG_JOINING => {
                let epoch = reader.epoch()?;
                let offer = match flag(reader, "chain offer flag")? {
                    false => None,
                    true => Some(RegionSummary {
                        log_head: reader.u64()?,
                        last_lsn: reader.u64()?,
                        last_crc: reader.u32()?,
                    }),
                };
                Message::Joining { epoch, offer }
            }
            TAG_RESTARTED => Message::Restarted { epoch: reader.epoch()?, incarnation: reader.u64()? },
            TAG_LINKED => Message::Linked { epoch: reader.epoch()?, group_epoch: reader.u64()? },
            TAG_LINKED_ACK => Message::LinkedAck { epoch: reader.epoch()?, group_epoch: reader.u64()? },
            tag => return Err(DecodeError::UnknownTag { what: "chain message", tag }),
        })
    }
}

fn flag(reader: &mut Reader, what: &'static str) -> Result<bool, DecodeError> {
    match reader.u8()? {
        0 => Ok(false),
        1 => Ok(true),
        tag => Err(DecodeError::UnknownTag { what, tag }),
    }
}

fn put_pair(buf: &mut BytesMut, tag: u8, epoch: Epoch, group_epoch: u64) {
    buf.put_u8(tag);
    buf.put_epoch(epoch);
    buf.put_u64_le(group_epoch);
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
                head: 11,
                seq: 9,
                done_below: 4,
                command: Command::Rmw { key: Bytes::from("k"), op: RmwOp::IncrementBy(-2) },
            },
            Message::Done { epoch: Epoch(1), seq: 2, outcome: Outcome::Integer(5) },
            Message::Configure {
                epoch: Epoch(4),
                group_epoch: 7,
                copy: false,
                catch_up: false,
                chain: vec![NodeId(1), NodeId(0), NodeId(2)],
                coordinator: 5,
            },
            Message::Configure {
                epoch: Epoch(4),
                group_epoch: 6,
                copy: true,
                catch_up: true,
                chain: vec![NodeId(0)],
                coordinator: 5,
            },
            Message::Configured { epoch: Epoch(4), group_epoch: 7, last_executed: 96 },
            Message::NeedCopy { epoch: Epoch(4), group_epoch: 7 },
            Message::Joining { epoch: Epoch(5), offer: None },
            Message::Joining {
                epoch: Epoch(5),
                offer: Some(RegionSummary { log_head: 96, last_lsn: 40, last_crc: 0xDEAD_BEEF }),
            },
            Message::Restarted { epoch: Epoch(5), incarnation: 77 },
            Message::Linked { epoch: Epoch(4), group_epoch: 7 },
            Message::LinkedAck { epoch: Epoch(4), group_epoch: 7 },
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
        for bytes in [&b""[..], &[99u8][..], &[2u8, 1, 2][..], &[4u8, 1, 0, 0, 0, 0, 0, 0, 0][..]] {
            assert!(Message::decode_exact(Bytes::copy_from_slice(bytes)).is_err());
        }
    }
}
