//! One event-loop turn's outgoing messages, each encoded once, cut into batch payloads per
//! peer and lane (Hermes §4.2: a broadcast is encoded once, every peer gets one frame per
//! turn). Both senders use it: the writer tasks' [`crate::Transport`] and the reactor's
//! [`crate::links::Links`]; they differ only in where a finished batch goes.

use bytes::{BufMut, BytesMut};
use chorus_core::codec::WireMessage;
use chorus_core::{Destination, NodeId, NodeSet};

/// Where one message of the turn lies in the arena, and who gets it.
#[derive(Clone, Copy)]
struct Span {
    nodes: NodeSet,
    start: usize,
    end: usize,
    priority: bool,
}

/// A turn's messages encoded once, and the scratch space batches are cut in. Kept across
/// turns so its buffers are reused.
#[derive(Default)]
pub(crate) struct TurnEncoder {
    arena: BytesMut,
    spans: Vec<Span>,
    payload: BytesMut,
}

impl TurnEncoder {
    /// Encode every message of the turn once, draining `messages`; `priority` says which
    /// take the priority lane. Replaces the previous turn's.
    pub(crate) fn encode<M: WireMessage>(
        &mut self,
        messages: &mut Vec<(Destination, M)>,
        priority: fn(&M) -> bool,
    ) {
        self.arena.clear();
        self.spans.clear();
        for (destination, message) in messages.drain(..) {
            let start = self.arena.len();
            let priority = priority(&message);
            message.encode(&mut self.arena);
            self.spans.push(Span { nodes: destination.nodes(), start, end: self.arena.len(), priority });
        }
    }

    /// Every batch payload for `node` of the messages whose priority `takes` accepts, in
    /// order: `batch(payload, count)` gets each (its message count already in front), split
    /// only where one would exceed `payload_bytes_max`. A message that cannot fit a frame on
    /// its own is left out and reported to `oversized` with its size.
    pub(crate) fn batches(
        &mut self,
        node: NodeId,
        takes: impl Fn(bool) -> bool,
        payload_bytes_max: usize,
        mut batch: impl FnMut(&[u8], u32),
        mut oversized: impl FnMut(usize),
    ) {
        let mut count = 0u32;
        self.start_batch();
        for span in &self.spans {
            if !span.nodes.contains(node) || !takes(span.priority) {
                continue;
            }
            let size = span.end - span.start;
            if size + 4 > payload_bytes_max {
                oversized(size);
                continue;
            }
            if count > 0 && self.payload.len() + size > payload_bytes_max {
                self.payload[..4].copy_from_slice(&count.to_le_bytes());
                batch(&self.payload, count);
                count = 0;
                self.payload.clear();
                self.payload.put_u32_le(0);
            }
            self.payload.extend_from_slice(&self.arena[span.start..span.end]);
            count += 1;
        }
        if count > 0 {
            self.payload[..4].copy_from_slice(&count.to_le_bytes());
            batch(&self.payload, count);
        }
    }

    fn start_batch(&mut self) {
        self.payload.clear();
        self.payload.put_u32_le(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use chorus_core::codec::decode_batch;

    /// A message that is its bytes; priority when its first byte is 1.
    #[derive(Clone, Debug, PartialEq)]
    struct Raw(Vec<u8>);

    impl WireMessage for Raw {
        fn encode(&self, buf: &mut BytesMut) {
            buf.put_u32_le(self.0.len() as u32);
            buf.put_slice(&self.0);
        }

        fn decode(reader: &mut chorus_core::codec::Reader) -> Result<Self, chorus_core::codec::DecodeError> {
            Ok(Raw(reader.bytes()?.to_vec()))
        }
    }

    fn collect(
        encoder: &mut TurnEncoder,
        node: u8,
        takes: impl Fn(bool) -> bool,
        max: usize,
    ) -> Vec<Vec<Raw>> {
        let mut batches = Vec::new();
        encoder.batches(
            NodeId(node),
            takes,
            max,
            |payload, count| {
                let messages = decode_batch::<Raw>(Bytes::copy_from_slice(payload)).unwrap();
                assert_eq!(messages.len() as u32, count);
                batches.push(messages);
            },
            |_| {},
        );
        batches
    }

    #[test]
    fn each_peer_gets_its_messages_in_order_and_lanes_split_by_priority() {
        let mut encoder = TurnEncoder::default();
        let both = NodeSet::from_iter([NodeId(1), NodeId(2)]);
        let mut messages = vec![
            (Destination::Nodes(both), Raw(vec![0, 10])),
            (Destination::Node(NodeId(2)), Raw(vec![1, 20])),
            (Destination::Node(NodeId(1)), Raw(vec![0, 30])),
        ];
        encoder.encode(&mut messages, |message: &Raw| message.0[0] == 1);
        assert!(messages.is_empty());
        assert_eq!(collect(&mut encoder, 1, |_| true, 1024), vec![vec![Raw(vec![0, 10]), Raw(vec![0, 30])]]);
        assert_eq!(collect(&mut encoder, 2, |priority| priority, 1024), vec![vec![Raw(vec![1, 20])]]);
        assert_eq!(collect(&mut encoder, 2, |priority| !priority, 1024), vec![vec![Raw(vec![0, 10])]]);
        assert!(collect(&mut encoder, 3, |_| true, 1024).is_empty());
    }

    #[test]
    fn a_batch_is_split_at_the_frame_limit_and_an_oversized_message_is_left_out() {
        let mut encoder = TurnEncoder::default();
        let mut messages: Vec<_> =
            (0..5u8).map(|i| (Destination::Node(NodeId(1)), Raw(vec![0, i, 0, 0, 0, 0]))).collect();
        messages.insert(2, (Destination::Node(NodeId(1)), Raw(vec![0; 40])));
        encoder.encode(&mut messages, |_| false);
        // Each small message is 10 bytes encoded; 4 bytes of count; at most 24 bytes a batch.
        let mut oversized = Vec::new();
        let mut counts = Vec::new();
        encoder.batches(NodeId(1), |_| true, 24, |_, count| counts.push(count), |size| oversized.push(size));
        assert_eq!(oversized, vec![44]);
        assert_eq!(counts, vec![2, 2, 1]);
    }
}
