//! What the core asks the runtime to make durable, and the byte form it takes on disk.
//!
//! The core stays sans-I/O: every Raft Ready that appends entries or changes the HardState
//! becomes a [`Record`] in the core's durable outbox (`RaftLog::take_durable`), exactly as
//! `chorus-membership` does. raft-rs requires the entries and HardState of a Ready to be
//! stable before the messages that depend on them (votes, append acknowledgements) are sent,
//! and the origin answers a client when it applies the client's batch, so the runtime must
//! persist a turn's records before it sends that turn's messages or replies.
//! `disk::TwoLevelLog` does that with Cyclone's two-level log.

use bytes::{BufMut, Bytes, BytesMut};
use chorus_core::codec::{DecodeError, Reader, WireMessage, WriteExt};
use protobuf::Message as _;
use raft::prelude::{ConfState, Entry, HardState};

use crate::state::StateImage;

/// One durable change. A [`Record::Checkpoint`] supersedes every record before it.
#[derive(Clone, Debug, PartialEq)]
pub enum Record {
    /// Entries appended to `log` (a suffix that may replace conflicting entries).
    Entries {
        log: u32,
        entries: Vec<Entry>,
    },
    HardState {
        log: u32,
        term: u64,
        vote: u64,
        commit: u64,
    },
    /// A snapshot of every log: the state machine (keys and session table) at its applied
    /// index, the HardState, and the entries after the snapshot. Written to a file of its
    /// own; both levels of the log are truncated behind it (Cyclone §2: "snapshots ...
    /// allow the log to be truncated").
    Checkpoint(Checkpoint),
    /// The data directory identity a peer's Raft id first showed (`replica::members`): a peer
    /// that comes back under that Raft id with another identity lost its data.
    Identity {
        raft_id: u64,
        identity: u64,
    },
}

#[derive(Clone, Debug, PartialEq, Default)]
pub struct Checkpoint {
    pub logs: Vec<LogCheckpoint>,
    /// Records a snapshot installed from the leader, which no other record holds: it must be
    /// durable before the turn's messages (which acknowledge it) leave, so the runtime
    /// writes it at once instead of in the background. Not stored.
    pub installed: bool,
    /// Every `(raft id, identity)` this node recorded of its peers.
    pub identities: Vec<(u64, u64)>,
}

#[derive(Clone, Debug, PartialEq, Default)]
pub struct LogCheckpoint {
    pub snapshot_index: u64,
    pub snapshot_term: u64,
    /// The state machine at `snapshot_index`, encoded by whoever writes the checkpoint.
    pub state: StateImage,
    pub term: u64,
    pub vote: u64,
    pub commit: u64,
    pub entries: Vec<Entry>,
    /// The log's configuration at `snapshot_index` (None in checkpoints written before
    /// configuration changes existed: the founding members).
    pub conf_state: Option<ConfState>,
}

impl LogCheckpoint {
    pub fn hard_state(&self) -> HardState {
        HardState { term: self.term, vote: self.vote, commit: self.commit, ..Default::default() }
    }
}

/// What a restarting replica restores from: the last checkpoint (if any) and every record
/// persisted after it, in order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Recovered {
    pub checkpoint: Option<Checkpoint>,
    pub records: Vec<Record>,
}

impl Recovered {
    pub fn is_empty(&self) -> bool {
        self.checkpoint.is_none() && self.records.is_empty()
    }
}

/// One turn's records for the disk ([`crate::RaftLog::take_durable`]), and whether the turn's
/// messages and replies must wait for them to be synced or only written.
#[derive(Debug, Default)]
pub struct DurableTurn {
    pub records: Vec<Record>,
    pub sync: bool,
    /// This take's number: once a sync covers these records, the runtime passes it (or a
    /// later one) to [`crate::RaftLog::on_synced`].
    pub ticket: u64,
}

const TAG_ENTRIES: u8 = 1;
const TAG_HARD_STATE: u8 = 2;
const TAG_CHECKPOINT: u8 = 3;
const TAG_IDENTITY: u8 = 4;

fn put_entries(entries: &[Entry], buf: &mut BytesMut) {
    buf.put_u32_le(u32::try_from(entries.len()).expect("entries fit u32"));
    for entry in entries {
        let bytes = entry.write_to_bytes().expect("raft entries always encode");
        buf.put_bytes_prefixed(&bytes);
    }
}

fn read_entries(reader: &mut Reader) -> Result<Vec<Entry>, DecodeError> {
    let count = reader.u32()? as usize;
    if count > reader.remaining() {
        return Err(DecodeError::Invalid("entry count exceeds record"));
    }
    let mut entries = Vec::with_capacity(count);
    for _ in 0..count {
        let bytes = reader.bytes()?;
        entries
            .push(Entry::parse_from_bytes(&bytes).map_err(|_| DecodeError::Invalid("malformed raft entry"))?);
    }
    Ok(entries)
}

impl WireMessage for Checkpoint {
    fn encode(&self, buf: &mut BytesMut) {
        buf.put_u32_le(u32::try_from(self.logs.len()).expect("logs fit u32"));
        for log in &self.logs {
            buf.put_u64_le(log.snapshot_index);
            buf.put_u64_le(log.snapshot_term);
            buf.put_bytes_prefixed(&log.state.bytes());
            buf.put_u64_le(log.term);
            buf.put_u64_le(log.vote);
            buf.put_u64_le(log.commit);
            put_entries(&log.entries, buf);
        }
        // Added later, at the end, so older checkpoints still read (without them).
        buf.put_u32_le(u32::try_from(self.identities.len()).expect("identities fit u32"));
        for (raft_id, identity) in &self.identities {
            buf.put_u64_le(*raft_id);
            buf.put_u64_le(*identity);
        }
        for log in &self.logs {
            let conf =
                log.conf_state.as_ref().map(|conf| Bytes::from(conf.write_to_bytes().expect("encodes")));
            buf.put_optional_bytes(conf.as_ref());
        }
    }

    fn decode(reader: &mut Reader) -> Result<Self, DecodeError> {
        let count = reader.u32()? as usize;
        if count > reader.remaining() {
            return Err(DecodeError::Invalid("log count exceeds checkpoint"));
        }
        let mut logs = Vec::with_capacity(count);
        for _ in 0..count {
            logs.push(LogCheckpoint {
                snapshot_index: reader.u64()?,
                snapshot_term: reader.u64()?,
                state: StateImage::from(reader.bytes()?),
                term: reader.u64()?,
                vote: reader.u64()?,
                commit: reader.u64()?,
                entries: read_entries(reader)?,
                conf_state: None,
            });
        }
        let mut identities = Vec::new();
        if reader.remaining() > 0 {
            let count = reader.u32()? as usize;
            if count > reader.remaining() {
                return Err(DecodeError::Invalid("identity count exceeds checkpoint"));
            }
            for _ in 0..count {
                identities.push((reader.u64()?, reader.u64()?));
            }
            for log in &mut logs {
                log.conf_state = match reader.optional_bytes()? {
                    None => None,
                    Some(bytes) => Some(
                        ConfState::parse_from_bytes(&bytes)
                            .map_err(|_| DecodeError::Invalid("malformed configuration"))?,
                    ),
                };
            }
        }
        Ok(Checkpoint { logs, installed: false, identities })
    }
}

impl WireMessage for Record {
    fn encode(&self, buf: &mut BytesMut) {
        match self {
            Record::Entries { log, entries } => {
                buf.put_u8(TAG_ENTRIES);
                buf.put_u32_le(*log);
                put_entries(entries, buf);
            }
            Record::HardState { log, term, vote, commit } => {
                buf.put_u8(TAG_HARD_STATE);
                buf.put_u32_le(*log);
                buf.put_u64_le(*term);
                buf.put_u64_le(*vote);
                buf.put_u64_le(*commit);
            }
            Record::Checkpoint(checkpoint) => {
                buf.put_u8(TAG_CHECKPOINT);
                checkpoint.encode(buf);
            }
            Record::Identity { raft_id, identity } => {
                buf.put_u8(TAG_IDENTITY);
                buf.put_u64_le(*raft_id);
                buf.put_u64_le(*identity);
            }
        }
    }

    fn decode(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(match reader.u8()? {
            TAG_ENTRIES => Record::Entries { log: reader.u32()?, entries: read_entries(reader)? },
            TAG_HARD_STATE => Record::HardState {
                log: reader.u32()?,
                term: reader.u64()?,
                vote: reader.u64()?,
                commit: reader.u64()?,
            },
            TAG_CHECKPOINT => Record::Checkpoint(Checkpoint::decode(reader)?),
            TAG_IDENTITY => Record::Identity { raft_id: reader.u64()?, identity: reader.u64()? },
            tag => return Err(DecodeError::UnknownTag { what: "raftlog durable record", tag }),
        })
    }
}

impl Record {
    pub fn to_bytes(&self) -> Bytes {
        let mut buf = BytesMut::new();
        self.encode(&mut buf);
        buf.freeze()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u64, data: &'static [u8]) -> Entry {
        Entry { index, term: 3, data: Bytes::from_static(data), ..Default::default() }
    }

    #[test]
    fn records_round_trip_and_truncations_are_errors() {
        let records = vec![
            Record::Entries { log: 2, entries: vec![entry(5, b"abc"), entry(6, b"")] },
            Record::HardState { log: 7, term: 3, vote: 2, commit: 6 },
            Record::Checkpoint(Checkpoint {
                logs: vec![LogCheckpoint {
                    snapshot_index: 4,
                    snapshot_term: 2,
                    state: Bytes::from_static(b"state").into(),
                    term: 3,
                    vote: 1,
                    commit: 5,
                    entries: vec![entry(5, b"x")],
                    conf_state: Some(ConfState::from((vec![1, 2, 258], vec![]))),
                }],
                installed: false,
                identities: vec![(258, 77)],
            }),
            Record::Identity { raft_id: 3, identity: 99 },
        ];
        for record in records {
            let bytes = record.to_bytes();
            assert_eq!(Record::decode_exact(bytes.clone()).unwrap(), record);
            for cut in 0..bytes.len() {
                // A checkpoint cut right before its later additions reads as an older one
                // (without identities): never as the record written. Checkpoint files carry
                // their own checksum, which catches the cut itself.
                let decoded = Record::decode_exact(bytes.slice(..cut));
                assert!(
                    decoded.as_ref().is_ok_and(|decoded| *decoded != record) || decoded.is_err(),
                    "cut at {cut}"
                );
            }
        }
    }
}
