//! Snapshots larger than one peer message travel in acknowledged chunks.
//!
//! raft-rs sends a lagging follower the whole state machine as one `MsgSnapshot`. A log's
//! state can outgrow the transport's frame limit, and the transport drops what does not fit:
//! the follower would ask again forever and never catch up. So the leader keeps such a
//! snapshot back from the network and streams it instead: `SnapshotChunk`s of at most
//! `chunk_bytes`, at most [`WINDOW_CHUNKS`] unacknowledged at a time (the peer's send credits
//! stay far from exhausted), each acknowledged with the follower's assembled length. A lost
//! chunk or ack is resent after `retry_timeout` from the last acknowledged byte. Once the
//! follower has every byte it rebuilds the `MsgSnapshot` and steps it into raft-rs as if it
//! had arrived whole; the leader then reports the snapshot delivered. A transfer that makes
//! no progress for [`GIVE_UP_RETRIES`] retry timeouts is reported failed; raft-rs sends a new
//! snapshot when it probes the follower again.

use bytes::{Bytes, BytesMut};
use chorus_core::{NodeId, Time};

use crate::message::Message;

/// Chunks in flight per transfer.
pub const WINDOW_CHUNKS: u64 = 4;
/// Retry timeouts without progress before a transfer is given up.
pub const GIVE_UP_RETRIES: u64 = 50;

/// A snapshot this leader is streaming to one follower.
pub(crate) struct Outgoing {
    /// The `MsgSnapshot` without its data: what the follower rebuilds the message from.
    header: Box<raft::prelude::Message>,
    data: Bytes,
    /// The snapshot's index: names the transfer in chunks and acks.
    pub index: u64,
    acked: u64,
    sent: u64,
    /// When the last ack moved `acked` forward (or the transfer started).
    progress_at: Option<Time>,
    sent_at: Time,
}

impl Outgoing {
    /// The Raft id the snapshot goes to.
    pub fn raft_to(&self) -> u64 {
        self.header.to
    }

    pub fn new(mut message: raft::prelude::Message) -> Outgoing {
        let data = std::mem::take(&mut message.mut_snapshot().data);
        let index = message.get_snapshot().get_metadata().index;
        Outgoing {
            header: Box::new(message),
            data,
            index,
            acked: 0,
            sent: 0,
            progress_at: None,
            sent_at: Time::ZERO,
        }
    }

    /// The chunks to send now: the window's worth after the last one sent, or again from
    /// the last acknowledged byte if nothing moved for `retry_timeout`.
    pub fn due(&mut self, log: u32, now: Time, chunk_bytes: usize, retry_timeout: Time) -> Vec<Message> {
        let progress_at = *self.progress_at.get_or_insert(now);
        if self.sent > self.acked && now >= self.sent_at.max(progress_at) + retry_timeout {
            self.sent = self.acked; // a chunk or its ack was lost
        }
        let total = self.data.len() as u64;
        let window_end = self.acked.saturating_add(WINDOW_CHUNKS * chunk_bytes as u64).min(total);
        let mut chunks = Vec::new();
        while self.sent < window_end {
            let end = (self.sent + chunk_bytes as u64).min(total);
            chunks.push(Message::SnapshotChunk {
                log,
                index: self.index,
                offset: self.sent,
                total,
                header: (self.sent == 0).then(|| self.header.clone()),
                data: self.data.slice(self.sent as usize..end as usize),
            });
            self.sent = end;
            self.sent_at = now;
        }
        chunks
    }

    /// The follower holds `received` bytes. `true`: it has the whole snapshot.
    pub fn on_ack(&mut self, received: u64, now: Time) -> bool {
        let received = received.min(self.data.len() as u64);
        if received > self.acked {
            self.acked = received;
            self.progress_at = Some(now);
        } else if received < self.acked {
            // The follower started over (a restart, or a newer transfer replaced ours).
            self.acked = received;
            self.sent = received;
        }
        self.sent = self.sent.max(self.acked);
        self.acked == self.data.len() as u64
    }

    pub fn stalled(&self, now: Time, retry_timeout: Time) -> bool {
        let limit = Time::from_nanos(retry_timeout.as_nanos().saturating_mul(GIVE_UP_RETRIES));
        self.progress_at.is_some_and(|at| now >= at + limit)
    }
}

/// A snapshot this follower is assembling.
pub(crate) struct Incoming {
    from: NodeId,
    index: u64,
    total: u64,
    header: Box<raft::prelude::Message>,
    /// Grows as chunks arrive: memory follows the bytes received, not the declared total.
    data: BytesMut,
}

/// What a chunk did: the bytes held now (for the ack) and, once complete, the whole
/// `MsgSnapshot` to step into raft-rs.
pub(crate) struct ChunkResult {
    pub received: u64,
    pub complete: Option<Box<raft::prelude::Message>>,
}

pub(crate) struct Chunk {
    pub index: u64,
    pub offset: u64,
    pub total: u64,
    pub header: Option<Box<raft::prelude::Message>>,
    pub data: Bytes,
}

/// Add `chunk` from `from` to the assembly in `slot`. Chunks out of order (a loss ahead of
/// them) are not kept; the ack tells the leader where to resume.
pub(crate) fn on_chunk(slot: &mut Option<Incoming>, from: NodeId, chunk: Chunk) -> ChunkResult {
    let same = slot.as_ref().is_some_and(|incoming| incoming.from == from && incoming.index == chunk.index);
    if chunk.offset == 0 && !(same && slot.as_ref().is_some_and(|incoming| !incoming.data.is_empty())) {
        if let Some(header) = chunk.header {
            *slot = Some(Incoming {
                from,
                index: chunk.index,
                total: chunk.total,
                header,
                data: BytesMut::new(),
            });
        }
    }
    let Some(incoming) =
        slot.as_mut().filter(|incoming| incoming.from == from && incoming.index == chunk.index)
    else {
        return ChunkResult { received: 0, complete: None };
    };
    let fits = chunk.offset == incoming.data.len() as u64
        && chunk.total == incoming.total
        && incoming.data.len() as u64 + chunk.data.len() as u64 <= incoming.total;
    if fits {
        incoming.data.extend_from_slice(&chunk.data);
    }
    let received = incoming.data.len() as u64;
    if received < incoming.total {
        return ChunkResult { received, complete: None };
    }
    let mut incoming = slot.take().expect("checked above");
    incoming.header.mut_snapshot().data = incoming.data.freeze();
    ChunkResult { received, complete: Some(incoming.header) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use raft::prelude::MessageType;

    fn snapshot_message(bytes: usize) -> raft::prelude::Message {
        let mut message = raft::prelude::Message::default();
        message.set_msg_type(MessageType::MsgSnapshot);
        message.mut_snapshot().mut_metadata().index = 42;
        message.mut_snapshot().data = Bytes::from((0..bytes).map(|i| i as u8).collect::<Vec<u8>>());
        message
    }

    fn deliver(chunks: Vec<Message>, slot: &mut Option<Incoming>) -> Vec<ChunkResult> {
        chunks
            .into_iter()
            .map(|message| match message {
                Message::SnapshotChunk { index, offset, total, header, data, .. } => {
                    on_chunk(slot, NodeId(0), Chunk { index, offset, total, header, data })
                }
                other => panic!("not a chunk: {other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_snapshot_crosses_in_windows_and_arrives_whole() {
        let original = snapshot_message(10_000);
        let mut outgoing = Outgoing::new(original.clone());
        let mut slot = None;
        let retry = Time::from_millis(60);
        let mut now = Time::ZERO;
        let mut rounds = 0;
        loop {
            let chunks = outgoing.due(0, now, 1_000, retry);
            assert!(chunks.len() as u64 <= WINDOW_CHUNKS);
            let results = deliver(chunks, &mut slot);
            let last = results.last().expect("a window always has a chunk");
            if let Some(message) = &last.complete {
                assert_eq!(**message, original, "rebuilt exactly");
                assert!(outgoing.on_ack(last.received, now));
                break;
            }
            assert!(!outgoing.on_ack(last.received, now));
            now = now + Time::from_millis(1);
            rounds += 1;
        }
        assert_eq!(rounds, 2, "10 chunks in windows of 4");
    }

    #[test]
    fn a_lost_chunk_is_resent_from_the_last_acknowledged_byte() {
        let original = snapshot_message(5_000);
        let mut outgoing = Outgoing::new(original.clone());
        let mut slot = None;
        let retry = Time::from_millis(60);
        let mut chunks = outgoing.due(0, Time::ZERO, 1_000, retry);
        chunks.remove(1); // lost
        let results = deliver(chunks, &mut slot);
        assert!(results.iter().all(|result| result.received == 1_000), "later chunks are not kept");
        outgoing.on_ack(1_000, Time::ZERO);
        assert!(outgoing.due(0, Time::from_millis(10), 1_000, retry).len() == 1, "the window moved by one");
        let resent = outgoing.due(0, Time::from_millis(100), 1_000, retry);
        assert!(matches!(resent.first(), Some(Message::SnapshotChunk { offset: 1_000, .. })), "{resent:?}");
        let results = deliver(resent, &mut slot);
        let received = results.last().unwrap().received;
        assert_eq!(received, 5_000);
        assert_eq!(**results.last().unwrap().complete.as_ref().unwrap(), original);
    }

    #[test]
    fn chunks_of_another_transfer_or_beyond_the_total_are_ignored() {
        let mut slot = None;
        let header = Some(Box::new(snapshot_message(0)));
        let chunk = |index, offset, total, data: &'static [u8], header| Chunk {
            index,
            offset,
            total,
            header,
            data: Bytes::from_static(data),
        };
        assert_eq!(on_chunk(&mut slot, NodeId(0), chunk(1, 4, 8, b"late", None)).received, 0);
        assert_eq!(on_chunk(&mut slot, NodeId(0), chunk(1, 0, 8, b"abcd", header.clone())).received, 4);
        assert_eq!(
            on_chunk(&mut slot, NodeId(1), chunk(1, 4, 8, b"efgh", None)).received,
            0,
            "another sender"
        );
        assert_eq!(on_chunk(&mut slot, NodeId(0), chunk(1, 4, 8, b"too long!", None)).received, 4);
        let done = on_chunk(&mut slot, NodeId(0), chunk(1, 4, 8, b"efgh", None));
        assert_eq!(done.complete.unwrap().get_snapshot().data.as_ref(), b"abcdefgh");
        assert!(slot.is_none());
    }
}
