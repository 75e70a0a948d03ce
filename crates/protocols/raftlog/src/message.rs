//! Raftlog peer messages, log entry contents, and their wire encoding.

use bytes::{BufMut, Bytes, BytesMut};
use chorus_core::codec::{DecodeError, Reader, WireMessage, WriteExt};
use chorus_core::{Command, Key, Outcome, Value};
use protobuf::Message as _;

/// The unit of at-most-once execution (Cyclone §3.4): commands of one client session, under
/// one sequence number. A replica's own session batches every command that arrived for a log
/// while its previous batch was in flight; an external session (one client connection) would
/// send one command per sequence number.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Proposal {
    pub client: SessionId,
    pub seq: u64,
    pub commands: Vec<Command>,
    /// A step of a multi-key transaction (then `commands` is empty).
    pub step: Option<Step>,
    /// The origin replica's applied index of the proposal's log when it made the proposal
    /// (kept by every retry). Any copy of it that ran did so at a later index, so a copy
    /// that finds its session expired (`LogState`'s rule) is refused without running.
    pub sent_at_index: u64,
}

/// Whose sequence numbers a proposal carries. The kinds are separate name spaces, so no id an
/// external client picks can ever be a replica's own session or a transaction step, and no
/// two steps share one: the step's whole identity is the session id, not a hash of it.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum SessionId {
    /// A replica's own session (`disk::session_client_id`: node, incarnation or directory identity, boot).
    Replica(u64),
    /// An external client session (RESP `SESSION client seq ...`), any id the client picks.
    External(u64),
    /// One attempt of one transaction step in one log (`crate::txn`). `coordinator` and
    /// `begun_at` say where and at which index the transaction's `Begin` ran (both 0 for a
    /// `Begin` and for a gang's copy, which are not forgotten this way): a log forgets the
    /// records of the steps whose transaction began below its watermark for that
    /// coordinator (`LogState`, "Forgetting finished transactions").
    Step { txn: TxnId, kind: StepKind, log: u32, attempt: u32, coordinator: u32, begun_at: u64 },
}

impl SessionId {
    /// The coordinator log and `Begin` index of a step that is forgotten once its
    /// transaction finished (`Lock`, `Update`, `Finish`); `None` for every other session
    /// (a `Forget` keeps no record: it is idempotent).
    pub fn forgettable_step(&self) -> Option<(u32, u64)> {
        match *self {
            SessionId::Step {
                kind: StepKind::Lock | StepKind::Update | StepKind::Finish,
                coordinator,
                begun_at,
                ..
            } => Some((coordinator, begun_at)),
            _ => None,
        }
    }
}

/// The four steps of a transaction (`crate::txn`).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum StepKind {
    Begin,
    Lock,
    Update,
    Finish,
    /// A ganged operation's copy in one of its logs (`crate::replica::gang`).
    Gang,
    Forget,
}

impl StepKind {
    pub fn of(step: &Step) -> StepKind {
        match step {
            Step::Begin { .. } => StepKind::Begin,
            Step::Lock { .. } => StepKind::Lock,
            Step::Update { .. } => StepKind::Update,
            Step::Finish { .. } => StepKind::Finish,
            Step::Gang { .. } => StepKind::Gang,
            Step::Forget { .. } => StepKind::Forget,
        }
    }

    fn from_tag(tag: u8) -> Result<StepKind, DecodeError> {
        Ok(match tag {
            0 => StepKind::Begin,
            1 => StepKind::Lock,
            2 => StepKind::Update,
            3 => StepKind::Finish,
            4 => StepKind::Gang,
            5 => StepKind::Forget,
            tag => return Err(DecodeError::UnknownTag { what: "step kind", tag }),
        })
    }
}

impl WireMessage for SessionId {
    fn encode(&self, buf: &mut BytesMut) {
        match *self {
            SessionId::Replica(id) => {
                buf.put_u8(1);
                buf.put_u64_le(id);
            }
            SessionId::External(id) => {
                buf.put_u8(2);
                buf.put_u64_le(id);
            }
            SessionId::Step { txn, kind, log, attempt, coordinator, begun_at } => {
                buf.put_u8(3);
                put_txn(&txn, buf);
                buf.put_u8(kind as u8);
                buf.put_u32_le(log);
                buf.put_u32_le(attempt);
                buf.put_u32_le(coordinator);
                buf.put_u64_le(begun_at);
            }
        }
    }

    fn decode(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(match reader.u8()? {
            1 => SessionId::Replica(reader.u64()?),
            2 => SessionId::External(reader.u64()?),
            3 => SessionId::Step {
                txn: read_txn(reader)?,
                kind: StepKind::from_tag(reader.u8()?)?,
                log: reader.u32()?,
                attempt: reader.u32()?,
                coordinator: reader.u32()?,
                begun_at: reader.u64()?,
            },
            tag => return Err(DecodeError::UnknownTag { what: "session kind", tag }),
        })
    }
}

/// A multi-key transaction: the origin replica's session client id and its own counter.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct TxnId {
    pub origin: u64,
    pub number: u64,
}

/// The steps of a transaction across logs (Cyclone §4.2: acquire locks, verify and update,
/// release), each a request of its own at-most-once client, so every replica can drive the
/// transaction and each step still executes once (`crate::txn`).
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Step {
    /// Into the coordinator log: the transaction is accepted and will complete.
    Begin { txn: TxnId, commands: Vec<Command> },
    /// Into a participant log: lock these keys for `txn` and return their values, or
    /// refuse (another transaction holds one) without effect.
    Lock { txn: TxnId, keys: Vec<Key> },
    /// Into a participant log: write the transaction's results and release its locks.
    Update { txn: TxnId, writes: Vec<(Key, Option<Value>)>, unlock: Vec<Key> },
    /// Into the coordinator log: the transaction is done. It carries the outcomes (the
    /// origin answers its clients from them when it applies the `Finish`, if its own driver
    /// has not) and the participant logs (where every replica that applies it sends `Forget`).
    Finish { txn: TxnId, outcomes: Vec<Outcome>, logs: Vec<u32> },
    /// Into every log of a finished transaction: the transactions of `coordinator` that
    /// began below index `below` have all finished, so their step records can go and any
    /// later copy of one of their steps is refused (`LogState`, "Forgetting finished
    /// transactions"). Idempotent: every copy runs, none is recorded.
    Forget { txn: TxnId, coordinator: u32, below: u64 },
    /// A ganged operation (Cyclone's evaluation, "Ganged Operations"): the same copy goes
    /// into every log in `logs`, and runs once every one of them has reached it (the
    /// rendezvous, `crate::replica::gang`). `rank` orders gangs so that no two logs can
    /// wait for each other in a cycle.
    Gang { gang: TxnId, rank: u64, logs: Vec<u32>, commands: Vec<Command> },
}

impl Step {
    /// The transaction or gang the step belongs to.
    pub fn txn(&self) -> TxnId {
        match self {
            Step::Begin { txn, .. }
            | Step::Lock { txn, .. }
            | Step::Update { txn, .. }
            | Step::Finish { txn, .. }
            | Step::Forget { txn, .. } => *txn,
            Step::Gang { gang, .. } => *gang,
        }
    }
}

/// The contents of one Raft entry: every proposal a leader took in during one call of the
/// core (its own batch and the batches forwarded to it), so one entry per log per turn.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct EntryBatch {
    pub proposals: Vec<Proposal>,
}

#[derive(Clone, PartialEq, Debug)]
pub enum Message {
    /// A Raft message of group `log`, protobuf-encoded by the raft crate on the wire.
    Raft { log: u32, message: Box<raft::prelude::Message> },
    /// A follower hands a batch to the replica it believes leads `log`. `relayed`: the
    /// sender is not the origin but a replica that passed it on once; it is not passed on
    /// again, so a stale leader hint cannot make a batch circle.
    Forward { log: u32, proposal: Proposal, relayed: bool },
    /// A piece of a snapshot too large for one message (`crate::transfer`). The first
    /// (offset 0) carries the `MsgSnapshot` without its data.
    SnapshotChunk {
        log: u32,
        index: u64,
        offset: u64,
        total: u64,
        header: Option<Box<raft::prelude::Message>>,
        data: Bytes,
    },
    /// The follower holds `received` bytes of the snapshot at `index`.
    SnapshotAck { log: u32, index: u64, received: u64 },
    /// Who the sender is (`crate::replica::members`): its Raft incarnation (0: a founding
    /// member; a replacement has a new one, so it is a new member of every log) and the
    /// identity of its data directory. `joining`: it replaces the node's previous member.
    Hello { incarnation: u64, identity: u64, joining: bool },
    /// The receiver has not heard the sender's Hello since it started: send one.
    HelloRequest,
    /// The sender knows the receiver's incarnation under another data directory: the
    /// receiver lost its data and is refused until it is replaced.
    Refused,
    /// A leader tells one follower how far each of the logs it leads is committed, for all
    /// those logs in one message (`crate::replica::RaftLog::notice_commits`), instead of
    /// raft-rs's empty append per log (and its answer) each time a commit index moves.
    /// `from` is the leader's Raft id, `to` the follower's; each commit is at most the
    /// follower's match index, so the follower holds exactly the leader's entries that far.
    Commits { from: u64, to: u64, commits: Vec<LogCommit> },
    /// A follower's answers to one leader's appends, for all logs of one flush in one message
    /// (`crate::replica::RaftLog::send_append_answers`), instead of one raft-rs
    /// `MsgAppendResponse` per log. `from` is the follower's Raft id, `to` the leader's; the
    /// leader steps each answer into its log's raft-rs as the `MsgAppendResponse` it stands for
    /// ([`AppendAnswer::to_raft`]).
    AppendAnswers { from: u64, to: u64, answers: Vec<AppendAnswer> },
}

/// One log's commit index in a [`Message::Commits`], valid in the leader's `term` only.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct LogCommit {
    pub log: u32,
    pub term: u64,
    pub commit: u64,
}

/// A [`LogCommit`]'s encoded size.
const LOG_COMMIT_BYTES: usize = 4 + 8 + 8;

/// One raft-rs `MsgAppendResponse` of log `log` in a [`Message::AppendAnswers`]: every field
/// raft-rs sets in one, so the leader steps exactly the message the follower's raft-rs wrote.
/// A response that carries anything else (a snapshot request, a context, entries) has no
/// `AppendAnswer` ([`AppendAnswer::of`]) and travels as a plain [`Message::Raft`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct AppendAnswer {
    pub log: u32,
    pub term: u64,
    /// The follower's last index (accepted), or the probe's index (rejected).
    pub index: u64,
    pub commit: u64,
    pub reject: bool,
    pub reject_hint: u64,
    /// With a rejection: the term of the follower's entry at `reject_hint`.
    pub log_term: u64,
}

/// An [`AppendAnswer`]'s encoded size.
const APPEND_ANSWER_BYTES: usize = 4 + 8 + 8 + 8 + 1 + 8 + 8;

impl AppendAnswer {
    /// The answer standing for `message` of `log`, if `message` is an append response that
    /// [`AppendAnswer::to_raft`] rebuilds field for field; `None` for anything else.
    pub fn of(log: u32, message: &raft::prelude::Message) -> Option<AppendAnswer> {
        if message.get_msg_type() != raft::prelude::MessageType::MsgAppendResponse {
            return None;
        }
        let answer = AppendAnswer {
            log,
            term: message.term,
            index: message.index,
            commit: message.commit,
            reject: message.reject,
            reject_hint: message.reject_hint,
            log_term: message.log_term,
        };
        (answer.to_raft(message.from, message.to) == *message).then_some(answer)
    }

    /// The raft-rs `MsgAppendResponse` this answer stands for, from Raft id `from` to `to`.
    pub fn to_raft(&self, from: u64, to: u64) -> raft::prelude::Message {
        let mut message = raft::prelude::Message::default();
        message.set_msg_type(raft::prelude::MessageType::MsgAppendResponse);
        message.from = from;
        message.to = to;
        message.term = self.term;
        message.index = self.index;
        message.commit = self.commit;
        message.reject = self.reject;
        message.reject_hint = self.reject_hint;
        message.log_term = self.log_term;
        message
    }
}

const TAG_RAFT: u8 = 1;
const TAG_FORWARD: u8 = 2;
const TAG_SNAPSHOT_CHUNK: u8 = 3;
const TAG_SNAPSHOT_ACK: u8 = 4;
const TAG_HELLO: u8 = 5;
const TAG_HELLO_REQUEST: u8 = 6;
const TAG_REFUSED: u8 = 7;
const TAG_COMMITS: u8 = 8;
const TAG_APPEND_ANSWERS: u8 = 9;

/// Room for what a proposal carries besides its commands (ids, counts, tags).
const PROPOSAL_OVERHEAD_BYTES: usize = 88;

/// An upper bound on `command`'s encoded size, without encoding it: what batches and
/// entries are cut by, so neither outgrows a peer message.
/// The encoded size of an outcome (only a `Finish` step carries outcomes: rare, so measured
/// by encoding).
pub fn outcome_bytes(outcome: &Outcome) -> usize {
    let mut buf = BytesMut::new();
    outcome.encode(&mut buf);
    buf.len()
}

pub fn command_bytes(command: &Command) -> usize {
    const FIELD: usize = 8; // a length prefix or a tag, generously
    let key = command.key().len() + 2 * FIELD;
    key + match command {
        Command::Read { .. } => 0,
        Command::Write { value, .. } => FIELD + value.as_ref().map_or(0, |value| value.len()),
        Command::Rmw { op, .. } => {
            use chorus_core::RmwOp;
            let optional = |value: &Option<Value>| FIELD + value.as_ref().map_or(0, |value| value.len());
            FIELD
                + match op {
                    RmwOp::CompareAndSwap { expected, new } => optional(expected) + optional(new),
                    RmwOp::IncrementBy(_) => FIELD,
                    RmwOp::SetIfAbsent(value) | RmwOp::SetIfPresent(value) => FIELD + value.len(),
                    RmwOp::Swap(value) => optional(value),
                    RmwOp::HashSet { pairs, .. } => {
                        FIELD
                            + pairs
                                .iter()
                                .map(|(field, value)| 2 * FIELD + field.len() + value.len())
                                .sum::<usize>()
                    }
                    RmwOp::HashDelete(fields) => {
                        FIELD + fields.iter().map(|field| FIELD + field.len()).sum::<usize>()
                    }
                    RmwOp::Exec(exec) => {
                        2 * FIELD + exec.args.iter().map(|arg| FIELD + arg.len()).sum::<usize>()
                    }
                }
        }
    }
}

impl Proposal {
    /// An upper bound on the encoded size.
    pub fn bytes(&self) -> usize {
        let commands: usize = self.commands.iter().map(command_bytes).sum();
        let step = match &self.step {
            None => 0,
            Some(Step::Begin { commands, .. }) => commands.iter().map(command_bytes).sum(),
            Some(Step::Gang { logs, commands, .. }) => {
                16 + 4 * logs.len() + commands.iter().map(command_bytes).sum::<usize>()
            }
            Some(Step::Lock { keys, .. }) => keys.iter().map(|key| key.len() + 8).sum(),
            Some(Step::Update { writes, unlock, .. }) => {
                writes
                    .iter()
                    .map(|(key, value)| key.len() + value.as_ref().map_or(0, |value| value.len()) + 16)
                    .sum::<usize>()
                    + unlock.iter().map(|key| key.len() + 8).sum::<usize>()
            }
            Some(Step::Finish { outcomes, logs, .. }) => {
                4 * logs.len() + outcomes.iter().map(outcome_bytes).sum::<usize>() + 8
            }
            Some(Step::Forget { .. }) => 12,
        };
        PROPOSAL_OVERHEAD_BYTES + commands + step
    }
}

impl WireMessage for Proposal {
    fn encode(&self, buf: &mut BytesMut) {
        self.client.encode(buf);
        buf.put_u64_le(self.seq);
        buf.put_u64_le(self.sent_at_index);
        buf.put_u32_le(u32::try_from(self.commands.len()).expect("batch over u32 commands"));
        for command in &self.commands {
            command.encode(buf);
        }
        match &self.step {
            None => buf.put_u8(0),
            Some(step) => {
                buf.put_u8(1);
                step.encode(buf);
            }
        }
    }

    fn decode(reader: &mut Reader) -> Result<Self, DecodeError> {
        let client = SessionId::decode(reader)?;
        let seq = reader.u64()?;
        let sent_at_index = reader.u64()?;
        let count = reader.u32()? as usize;
        // Every command takes at least one byte: a larger count is a lie, and believing it
        // would let a peer make us allocate gigabytes.
        if count > reader.remaining() {
            return Err(DecodeError::Invalid("command count exceeds payload"));
        }
        let mut commands = Vec::with_capacity(count);
        for _ in 0..count {
            commands.push(Command::decode(reader)?);
        }
        let step = match reader.u8()? {
            0 => None,
            1 => Some(Step::decode(reader)?),
            tag => return Err(DecodeError::UnknownTag { what: "proposal step flag", tag }),
        };
        Ok(Proposal { client, seq, commands, step, sent_at_index })
    }
}

fn put_txn(txn: &TxnId, buf: &mut BytesMut) {
    buf.put_u64_le(txn.origin);
    buf.put_u64_le(txn.number);
}

fn read_txn(reader: &mut Reader) -> Result<TxnId, DecodeError> {
    Ok(TxnId { origin: reader.u64()?, number: reader.u64()? })
}

fn put_keys(keys: &[Key], buf: &mut BytesMut) {
    buf.put_u32_le(u32::try_from(keys.len()).expect("keys fit u32"));
    for key in keys {
        buf.put_bytes_prefixed(key);
    }
}

fn read_keys(reader: &mut Reader) -> Result<Vec<Key>, DecodeError> {
    let count = reader.u32()? as usize;
    if count > reader.remaining() {
        return Err(DecodeError::Invalid("key count exceeds payload"));
    }
    (0..count).map(|_| reader.bytes()).collect()
}

fn put_commands(commands: &[Command], buf: &mut BytesMut) {
    buf.put_u32_le(u32::try_from(commands.len()).expect("commands fit u32"));
    for command in commands {
        command.encode(buf);
    }
}

fn read_commands(reader: &mut Reader) -> Result<Vec<Command>, DecodeError> {
    let count = reader.u32()? as usize;
    if count > reader.remaining() {
        return Err(DecodeError::Invalid("command count exceeds payload"));
    }
    (0..count).map(|_| Command::decode(reader)).collect()
}

fn put_logs(logs: &[u32], buf: &mut BytesMut) {
    buf.put_u32_le(u32::try_from(logs.len()).expect("logs fit u32"));
    for log in logs {
        buf.put_u32_le(*log);
    }
}

fn read_logs(reader: &mut Reader) -> Result<Vec<u32>, DecodeError> {
    let count = reader.u32()? as usize;
    if count > reader.remaining() / 4 {
        return Err(DecodeError::Invalid("log count exceeds payload"));
    }
    (0..count).map(|_| reader.u32()).collect()
}

impl WireMessage for Step {
    fn encode(&self, buf: &mut BytesMut) {
        match self {
            Step::Begin { txn, commands } => {
                buf.put_u8(1);
                put_txn(txn, buf);
                put_commands(commands, buf);
            }
            Step::Lock { txn, keys } => {
                buf.put_u8(2);
                put_txn(txn, buf);
                put_keys(keys, buf);
            }
            Step::Update { txn, writes, unlock } => {
                buf.put_u8(3);
                put_txn(txn, buf);
                buf.put_u32_le(u32::try_from(writes.len()).expect("writes fit u32"));
                for (key, value) in writes {
                    buf.put_bytes_prefixed(key);
                    buf.put_optional_bytes(value.as_ref());
                }
                put_keys(unlock, buf);
            }
            Step::Finish { txn, outcomes, logs } => {
                buf.put_u8(4);
                put_txn(txn, buf);
                buf.put_u32_le(u32::try_from(outcomes.len()).expect("outcomes fit u32"));
                for outcome in outcomes {
                    outcome.encode(buf);
                }
                put_logs(logs, buf);
            }
            Step::Forget { txn, coordinator, below } => {
                buf.put_u8(6);
                put_txn(txn, buf);
                buf.put_u32_le(*coordinator);
                buf.put_u64_le(*below);
            }
            Step::Gang { gang, rank, logs, commands } => {
                buf.put_u8(5);
                put_txn(gang, buf);
                buf.put_u64_le(*rank);
                put_logs(logs, buf);
                put_commands(commands, buf);
            }
        }
    }

    fn decode(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(match reader.u8()? {
            1 => Step::Begin { txn: read_txn(reader)?, commands: read_commands(reader)? },
            2 => Step::Lock { txn: read_txn(reader)?, keys: read_keys(reader)? },
            3 => {
                let txn = read_txn(reader)?;
                let count = reader.u32()? as usize;
                if count > reader.remaining() {
                    return Err(DecodeError::Invalid("write count exceeds payload"));
                }
                let writes = (0..count)
                    .map(|_| Ok((reader.bytes()?, reader.optional_bytes()?)))
                    .collect::<Result<_, DecodeError>>()?;
                Step::Update { txn, writes, unlock: read_keys(reader)? }
            }
            4 => {
                let txn = read_txn(reader)?;
                let count = reader.u32()? as usize;
                if count > reader.remaining() {
                    return Err(DecodeError::Invalid("outcome count exceeds payload"));
                }
                let outcomes = (0..count).map(|_| Outcome::decode(reader)).collect::<Result<_, _>>()?;
                Step::Finish { txn, outcomes, logs: read_logs(reader)? }
            }
            5 => {
                let gang = read_txn(reader)?;
                let rank = reader.u64()?;
                let logs = read_logs(reader)?;
                Step::Gang { gang, rank, logs, commands: read_commands(reader)? }
            }
            6 => Step::Forget { txn: read_txn(reader)?, coordinator: reader.u32()?, below: reader.u64()? },
            tag => return Err(DecodeError::UnknownTag { what: "transaction step", tag }),
        })
    }
}

impl WireMessage for EntryBatch {
    fn encode(&self, buf: &mut BytesMut) {
        buf.put_u32_le(u32::try_from(self.proposals.len()).expect("entry over u32 proposals"));
        for proposal in &self.proposals {
            proposal.encode(buf);
        }
    }

    fn decode(reader: &mut Reader) -> Result<Self, DecodeError> {
        let count = reader.u32()? as usize;
        if count > reader.remaining() {
            return Err(DecodeError::Invalid("proposal count exceeds payload"));
        }
        let mut proposals = Vec::with_capacity(count);
        for _ in 0..count {
            proposals.push(Proposal::decode(reader)?);
        }
        Ok(EntryBatch { proposals })
    }
}

impl EntryBatch {
    pub fn to_bytes(&self) -> Bytes {
        let mut buf = BytesMut::new();
        self.encode(&mut buf);
        buf.freeze()
    }

    /// The encoding as the vector raft-rs proposes, without a copy (`BytesMut` hands over its
    /// buffer). `proposals_bytes`, an upper bound on the proposals' encoded size (their
    /// `bytes`), sizes the buffer once instead of growing it as proposals are written.
    pub fn to_vec(&self, proposals_bytes: usize) -> Vec<u8> {
        let mut buf = BytesMut::with_capacity(4 + proposals_bytes); // the count, then the proposals
        self.encode(&mut buf);
        Vec::from(buf)
    }
}

/// A Raft message as `put_bytes_prefixed` would write its protobuf bytes, encoded straight
/// into `buf` (no intermediate vector per message: a leader encodes an append per log and
/// follower every turn).
fn put_raft_prefixed(buf: &mut BytesMut, message: &raft::prelude::Message) {
    let size = message.compute_size();
    buf.put_u32_le(size);
    let start = buf.len();
    buf.resize(start + size as usize, 0);
    let mut stream = protobuf::CodedOutputStream::bytes(&mut buf[start..]);
    message.write_to_with_cached_sizes(&mut stream).expect("raft messages always encode");
    stream.check_eof();
}

impl WireMessage for Message {
    fn encode(&self, buf: &mut BytesMut) {
        match self {
            Message::Raft { log, message } => {
                buf.put_u8(TAG_RAFT);
                buf.put_u32_le(*log);
                put_raft_prefixed(buf, message);
            }
            Message::Forward { log, proposal, relayed } => {
                buf.put_u8(TAG_FORWARD);
                buf.put_u32_le(*log);
                buf.put_bool(*relayed);
                proposal.encode(buf);
            }
            Message::SnapshotChunk { log, index, offset, total, header, data } => {
                buf.put_u8(TAG_SNAPSHOT_CHUNK);
                buf.put_u32_le(*log);
                buf.put_u64_le(*index);
                buf.put_u64_le(*offset);
                buf.put_u64_le(*total);
                let header = header.as_ref().map(|message| {
                    Bytes::from(message.write_to_bytes().expect("raft messages always encode"))
                });
                buf.put_optional_bytes(header.as_ref());
                buf.put_bytes_prefixed(data);
            }
            Message::SnapshotAck { log, index, received } => {
                buf.put_u8(TAG_SNAPSHOT_ACK);
                buf.put_u32_le(*log);
                buf.put_u64_le(*index);
                buf.put_u64_le(*received);
            }
            Message::Hello { incarnation, identity, joining } => {
                buf.put_u8(TAG_HELLO);
                buf.put_u64_le(*incarnation);
                buf.put_u64_le(*identity);
                buf.put_bool(*joining);
            }
            Message::HelloRequest => buf.put_u8(TAG_HELLO_REQUEST),
            Message::Refused => buf.put_u8(TAG_REFUSED),
            Message::Commits { from, to, commits } => {
                buf.put_u8(TAG_COMMITS);
                buf.put_u64_le(*from);
                buf.put_u64_le(*to);
                buf.put_u32_le(u32::try_from(commits.len()).expect("commits fit u32"));
                for LogCommit { log, term, commit } in commits {
                    buf.put_u32_le(*log);
                    buf.put_u64_le(*term);
                    buf.put_u64_le(*commit);
                }
            }
            Message::AppendAnswers { from, to, answers } => {
                buf.put_u8(TAG_APPEND_ANSWERS);
                buf.put_u64_le(*from);
                buf.put_u64_le(*to);
                buf.put_u32_le(u32::try_from(answers.len()).expect("answers fit u32"));
                for answer in answers {
                    buf.put_u32_le(answer.log);
                    buf.put_u64_le(answer.term);
                    buf.put_u64_le(answer.index);
                    buf.put_u64_le(answer.commit);
                    buf.put_bool(answer.reject);
                    buf.put_u64_le(answer.reject_hint);
                    buf.put_u64_le(answer.log_term);
                }
            }
        }
    }

    fn decode(reader: &mut Reader) -> Result<Self, DecodeError> {
        Ok(match reader.u8()? {
            TAG_RAFT => {
                let log = reader.u32()?;
                let bytes = reader.bytes()?;
                let message = raft::prelude::Message::parse_from_bytes(&bytes)
                    .map_err(|_| DecodeError::Invalid("malformed raft message"))?;
                Message::Raft { log, message: Box::new(message) }
            }
            TAG_FORWARD => {
                let log = reader.u32()?;
                let relayed = reader.bool()?;
                Message::Forward { log, relayed, proposal: Proposal::decode(reader)? }
            }
            TAG_SNAPSHOT_CHUNK => {
                let (log, index, offset, total) =
                    (reader.u32()?, reader.u64()?, reader.u64()?, reader.u64()?);
                let header = match reader.optional_bytes()? {
                    None => None,
                    Some(bytes) => Some(Box::new(
                        raft::prelude::Message::parse_from_bytes(&bytes)
                            .map_err(|_| DecodeError::Invalid("malformed snapshot header"))?,
                    )),
                };
                Message::SnapshotChunk { log, index, offset, total, header, data: reader.bytes()? }
            }
            TAG_SNAPSHOT_ACK => {
                Message::SnapshotAck { log: reader.u32()?, index: reader.u64()?, received: reader.u64()? }
            }
            TAG_HELLO => Message::Hello {
                incarnation: reader.u64()?,
                identity: reader.u64()?,
                joining: reader.bool()?,
            },
            TAG_HELLO_REQUEST => Message::HelloRequest,
            TAG_REFUSED => Message::Refused,
            TAG_COMMITS => {
                let (from, to, count) = (reader.u64()?, reader.u64()?, reader.u32()? as usize);
                if count > reader.remaining() / LOG_COMMIT_BYTES {
                    return Err(DecodeError::Invalid("commit count exceeds payload"));
                }
                let commits = (0..count)
                    .map(|_| Ok(LogCommit { log: reader.u32()?, term: reader.u64()?, commit: reader.u64()? }))
                    .collect::<Result<_, DecodeError>>()?;
                Message::Commits { from, to, commits }
            }
            TAG_APPEND_ANSWERS => {
                let (from, to, count) = (reader.u64()?, reader.u64()?, reader.u32()? as usize);
                if count > reader.remaining() / APPEND_ANSWER_BYTES {
                    return Err(DecodeError::Invalid("answer count exceeds payload"));
                }
                let answers = (0..count)
                    .map(|_| {
                        Ok(AppendAnswer {
                            log: reader.u32()?,
                            term: reader.u64()?,
                            index: reader.u64()?,
                            commit: reader.u64()?,
                            reject: reader.bool()?,
                            reject_hint: reader.u64()?,
                            log_term: reader.u64()?,
                        })
                    })
                    .collect::<Result<_, DecodeError>>()?;
                Message::AppendAnswers { from, to, answers }
            }
            tag => return Err(DecodeError::UnknownTag { what: "raftlog message", tag }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chorus_core::codec::{decode_batch, encode_batch};
    use chorus_core::RmwOp;
    use proptest::prelude::*;
    use raft::prelude::{Entry, MessageType};

    fn arb_bytes() -> impl Strategy<Value = Bytes> {
        proptest::collection::vec(any::<u8>(), 0..24).prop_map(Bytes::from)
    }

    fn arb_command() -> impl Strategy<Value = Command> {
        prop_oneof![
            arb_bytes().prop_map(|key| Command::Read { key }),
            (arb_bytes(), proptest::option::of(arb_bytes()))
                .prop_map(|(key, value)| Command::Write { key, value }),
            (arb_bytes(), any::<i64>())
                .prop_map(|(key, delta)| Command::Rmw { key, op: RmwOp::IncrementBy(delta) }),
        ]
    }

    fn arb_outcome() -> impl Strategy<Value = Outcome> {
        prop_oneof![
            Just(Outcome::Written),
            any::<i64>().prop_map(Outcome::Integer),
            any::<bool>().prop_map(Outcome::Flag),
            proptest::option::of(arb_bytes()).prop_map(Outcome::Value),
            (any::<bool>(), proptest::option::of(arb_bytes()))
                .prop_map(|(swapped, previous)| Outcome::Cas { swapped, previous }),
            Just(Outcome::Error(chorus_core::CommandError::OutcomeUnknown)),
            Just(Outcome::Error(chorus_core::CommandError::NotInteger)),
        ]
    }

    fn arb_step() -> impl Strategy<Value = Option<Step>> {
        let txn = (any::<u64>(), any::<u64>()).prop_map(|(origin, number)| TxnId { origin, number });
        proptest::option::of(prop_oneof![
            (txn.clone(), proptest::collection::vec(arb_command(), 0..3))
                .prop_map(|(txn, commands)| Step::Begin { txn, commands }),
            (txn.clone(), proptest::collection::vec(arb_bytes(), 0..3))
                .prop_map(|(txn, keys)| Step::Lock { txn, keys }),
            (
                txn.clone(),
                proptest::collection::vec((arb_bytes(), proptest::option::of(arb_bytes())), 0..3),
                proptest::collection::vec(arb_bytes(), 0..3)
            )
                .prop_map(|(txn, writes, unlock)| Step::Update { txn, writes, unlock }),
            (
                txn.clone(),
                proptest::collection::vec(arb_outcome(), 0..3),
                proptest::collection::vec(any::<u32>(), 0..3)
            )
                .prop_map(|(txn, outcomes, logs)| Step::Finish { txn, outcomes, logs }),
            (txn.clone(), any::<u32>(), any::<u64>()).prop_map(|(txn, coordinator, below)| Step::Forget {
                txn,
                coordinator,
                below
            }),
            (
                txn,
                any::<u64>(),
                proptest::collection::vec(any::<u32>(), 0..4),
                proptest::collection::vec(arb_command(), 0..3)
            )
                .prop_map(|(gang, rank, logs, commands)| Step::Gang {
                    gang,
                    rank,
                    logs,
                    commands
                }),
        ])
    }

    fn arb_session() -> impl Strategy<Value = SessionId> {
        let txn = (any::<u64>(), any::<u64>()).prop_map(|(origin, number)| TxnId { origin, number });
        let kind = prop_oneof![
            Just(StepKind::Begin),
            Just(StepKind::Lock),
            Just(StepKind::Update),
            Just(StepKind::Finish),
            Just(StepKind::Gang),
            Just(StepKind::Forget)
        ];
        prop_oneof![
            any::<u64>().prop_map(SessionId::Replica),
            any::<u64>().prop_map(SessionId::External),
            (txn, kind, any::<u32>(), any::<u32>(), any::<u32>(), any::<u64>()).prop_map(
                |(txn, kind, log, attempt, coordinator, begun_at)| SessionId::Step {
                    txn,
                    kind,
                    log,
                    attempt,
                    coordinator,
                    begun_at
                }
            ),
        ]
    }

    fn arb_proposal() -> impl Strategy<Value = Proposal> {
        (
            arb_session(),
            any::<u64>(),
            proptest::collection::vec(arb_command(), 0..5),
            arb_step(),
            any::<u64>(),
        )
            .prop_map(|(client, seq, commands, step, sent_at_index)| Proposal {
                client,
                seq,
                commands,
                step,
                sent_at_index,
            })
    }

    fn arb_message() -> impl Strategy<Value = Message> {
        let raft_message = (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>(), arb_bytes()).prop_map(
            |(from, to, term, index, data)| {
                let mut message = raft::prelude::Message::default();
                message.set_msg_type(MessageType::MsgAppend);
                message.from = from;
                message.to = to;
                message.term = term;
                message.index = index;
                message.entries = vec![Entry { data, ..Default::default() }].into();
                message
            },
        );
        prop_oneof![
            (any::<u32>(), raft_message)
                .prop_map(|(log, message)| Message::Raft { log, message: Box::new(message) }),
            (any::<u32>(), arb_proposal(), any::<bool>())
                .prop_map(|(log, proposal, relayed)| Message::Forward { log, proposal, relayed }),
            (any::<u32>(), any::<u64>(), any::<u64>(), any::<u64>(), any::<bool>(), arb_bytes()).prop_map(
                |(log, index, offset, total, first, data)| {
                    let mut header = raft::prelude::Message::default();
                    header.set_msg_type(MessageType::MsgSnapshot);
                    header.mut_snapshot().mut_metadata().index = index;
                    let header = first.then(|| Box::new(header));
                    Message::SnapshotChunk { log, index, offset, total, header, data }
                }
            ),
            (any::<u32>(), any::<u64>(), any::<u64>())
                .prop_map(|(log, index, received)| Message::SnapshotAck { log, index, received }),
            (any::<u64>(), any::<u64>(), any::<bool>()).prop_map(|(incarnation, identity, joining)| {
                Message::Hello { incarnation, identity, joining }
            }),
            Just(Message::HelloRequest),
            Just(Message::Refused),
            (
                any::<u64>(),
                any::<u64>(),
                proptest::collection::vec((any::<u32>(), any::<u64>(), any::<u64>()), 0..4)
            )
                .prop_map(|(from, to, commits)| Message::Commits {
                    from,
                    to,
                    commits: commits
                        .into_iter()
                        .map(|(log, term, commit)| LogCommit { log, term, commit })
                        .collect(),
                }),
            (any::<u64>(), any::<u64>(), proptest::collection::vec(arb_append_answer(), 0..4))
                .prop_map(|(from, to, answers)| Message::AppendAnswers { from, to, answers }),
        ]
    }

    fn arb_append_answer() -> impl Strategy<Value = AppendAnswer> {
        (any::<u32>(), any::<u64>(), any::<u64>(), any::<u64>(), any::<bool>(), any::<u64>(), any::<u64>())
            .prop_map(|(log, term, index, commit, reject, reject_hint, log_term)| AppendAnswer {
                log,
                term,
                index,
                commit,
                reject,
                reject_hint,
                log_term,
            })
    }

    proptest! {
        /// An answer rebuilds exactly the response it was taken from, and stands only for that.
        #[test]
        fn append_answers_stand_for_exactly_their_response(answer in arb_append_answer(), from: u64, to: u64) {
            let message = answer.to_raft(from, to);
            prop_assert_eq!(AppendAnswer::of(answer.log, &message), Some(answer));
            let mut with_context = message.clone();
            with_context.context = Bytes::from_static(b"x");
            prop_assert_eq!(AppendAnswer::of(answer.log, &with_context), None);
            let mut asking_snapshot = message.clone();
            asking_snapshot.request_snapshot = 1;
            prop_assert_eq!(AppendAnswer::of(answer.log, &asking_snapshot), None);
            let mut append = message;
            append.set_msg_type(MessageType::MsgAppend);
            prop_assert_eq!(AppendAnswer::of(answer.log, &append), None);
        }
    }

    proptest! {
        #[test]
        fn messages_round_trip(messages in proptest::collection::vec(arb_message(), 0..6)) {
            let mut buf = BytesMut::new();
            encode_batch(messages.iter(), &mut buf);
            prop_assert_eq!(decode_batch::<Message>(buf.freeze()).unwrap(), messages);
        }

        #[test]
        fn entries_round_trip(proposals in proptest::collection::vec(arb_proposal(), 0..5)) {
            let batch = EntryBatch { proposals };
            prop_assert_eq!(EntryBatch::decode_exact(batch.to_bytes()).unwrap(), batch);
        }

        #[test]
        fn decoding_arbitrary_bytes_never_panics(junk in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode_batch::<Message>(Bytes::from(junk.clone()));
            let _ = Message::decode_exact(Bytes::from(junk.clone()));
            let _ = EntryBatch::decode_exact(Bytes::from(junk));
        }

        #[test]
        fn truncated_messages_are_errors(message in arb_message(), cut in any::<prop::sample::Index>()) {
            let mut buf = BytesMut::new();
            message.encode(&mut buf);
            let cut = cut.index(buf.len());
            prop_assert!(Message::decode_exact(buf.freeze().slice(..cut)).is_err());
        }
    }

    proptest! {
        #[test]
        fn size_bounds_cover_the_encoding(proposal in arb_proposal()) {
            let mut buf = BytesMut::new();
            proposal.encode(&mut buf);
            prop_assert!(buf.len() <= proposal.bytes(), "{} > {}", buf.len(), proposal.bytes());
        }
    }

    #[test]
    fn a_lying_command_count_is_refused_without_allocating() {
        let mut buf = BytesMut::new();
        SessionId::Replica(1).encode(&mut buf);
        buf.put_u64_le(1);
        buf.put_u32_le(u32::MAX);
        assert!(Proposal::decode_exact(buf.freeze()).is_err());
    }
}
