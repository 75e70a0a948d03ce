//! One physical log's state machine: the keys it owns and its at-most-once session table.
//!
//! Every replica applies the same committed entries in the same order to its copy, so every
//! copy holds the same keys and the same session table (Cyclone §3.4: "each execution core
//! independently enforces that accepted RPC calls from the same client bear increasing
//! sequence numbers", remembering the last sequence number and its result per client).
//!
//! **Session expiry** bounds that table, by a rule every copy applies identically because it
//! counts log entries, not time: a session record (replica or external session, or a
//! transaction's `Begin`; the other steps go as below, gang records are kept) that no
//! proposal used for `session_expiry_entries`
//! entries of its log is dropped, at the first sweep after that (sweeps run at every index
//! divisible by an eighth of the expiry). At-most-once still holds: a proposal whose session
//! has no record runs only if its origin made it fewer than `session_expiry_entries` entries
//! ago (`Proposal::sent_at_index`); an older one is refused (`ProposalResult::Expired`),
//! since a copy of it may have run and had its record dropped since. A replica's retries
//! keep their first `sent_at_index`, so they never run twice; an external client's retry
//! is a new proposal wherever it lands, so it is deduplicated only if it arrives within the
//! expiry of the session's last request.
//!
//! **Forgetting finished transactions** bounds the records of transaction steps, which a
//! late copy must never find missing while the transaction may still need them. Every step
//! session names its transaction's coordinator log and the index its `Begin` ran at there.
//! When the coordinator applies `Finish(T)` it computes `below`: the lowest `Begin` index of
//! its transactions still in progress, or the `Finish`'s own index if none is. Every
//! transaction that began there below `below` has finished, and stays finished. Every
//! replica that applies the `Finish` proposes `Forget { coordinator, below }` into each log
//! of `T`; a log that applies it raises its watermark for that coordinator to `below`,
//! drops the step records of the transactions under it, and from then on refuses (without
//! running) any step of theirs that has no record (`ProposalResult::Expired`). A late copy
//! therefore never runs twice, a driver that finds its step refused knows its transaction
//! is over, and what remains is one watermark per coordinator log plus the records of
//! transactions begun since the last `Forget` a log applied.

use bytes::{BufMut, Bytes, BytesMut};
use chorus_core::codec::{DecodeError, Reader, WireMessage, WriteExt};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};

use chorus_core::{Command, CommandError, Key, Outcome, Value};
use rustc_hash::FxHashMap;

use crate::cow::CowMap;
use crate::message::{Proposal, SessionId, Step, TxnId};

/// What one client session last executed in this log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionRecord {
    pub last_seq: u64,
    /// The log index of the session's latest proposal (executed or a retry): what expiry
    /// counts from.
    pub last_index: u64,
    /// The outcomes of `last_seq`'s commands, returned again to a retry.
    pub outcomes: Vec<Outcome>,
}

/// What applying a proposal did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProposalResult {
    /// First time this sequence number reached the log: its commands ran.
    Executed,
    /// A retry of the last executed sequence number: nothing ran; its saved outcomes stand.
    Duplicate,
    /// Older than the last executed sequence number of its client: nothing ran and the
    /// outcome is gone (Cyclone keeps only the last one per client).
    Stale { last_seq: u64 },
    /// Its session has no record and it was made `session_expiry_entries` or more entries
    /// ago: an earlier copy may have run and expired, so nothing ran; the outcome is unknown.
    Expired,
}

/// What a ganged operation (`crate::replica::gang`) did, kept in every log it involves: a
/// later copy of its proposal in that log is recognised and skipped, its origin reads its
/// outcomes there, and a replica whose copy of one log jumped past the gang by a snapshot
/// finds there what the gang wrote in the other logs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GangRecord {
    /// False: a log refused it (ranked below a gang it had already admitted); nothing ran.
    pub executed: bool,
    pub outcomes: Vec<Outcome>,
    /// Every key the gang wrote, in every log it involves, with its new value.
    pub writes: Vec<(Key, Option<Value>)>,
}

/// How ganged operations are ordered in a log: rank first, the gang's id breaks ties.
pub type GangOrder = (u64, TxnId);

/// `Clone` is cheap for the keys (a [`CowMap`]) and costs the rest of the state (sessions,
/// locks, transactions, gang records, all bounded or small): what a checkpoint takes inside
/// the event loop ([`StateImage::of`]).
#[derive(Clone, Default, Debug)]
pub struct LogState {
    store: CowMap,
    sessions: FxHashMap<SessionId, SessionRecord>,
    /// Keys locked by a multi-key transaction (Cyclone §4.2's bucket locks, per key here).
    /// Single-key commands on a locked key do not run (`CommandError::Locked`).
    locks: FxHashMap<Key, TxnId>,
    /// Transactions begun in this log (as their coordinator log) and not finished, with the
    /// index their `Begin` ran at: what a restarted or lagging replica resumes driving.
    txns: BTreeMap<TxnId, (u64, Vec<Command>)>,
    /// Per coordinator log: every transaction it began below this index has finished; their
    /// steps' records are gone from this log and their late copies are refused.
    forgotten_below: BTreeMap<u32, u64>,
    /// Ganged operations this log resolved (kept, like transaction steps' sessions).
    gangs: BTreeMap<TxnId, GangRecord>,
    /// The highest-ordered gang this log admitted: a later gang ordered below it is refused.
    gang_admitted_max: Option<GangOrder>,
    /// Lock steps grant without recording or checking locks (the `NoTxnLocks` bug).
    pub(crate) ignore_locks: bool,
    /// `Forget` drops step records but later copies of forgotten steps still run (the
    /// `RunsForgottenSteps` bug).
    pub(crate) runs_forgotten_steps: bool,
    /// Settings, not state (a snapshot does not carry them): the expiry in entries (0:
    /// never), and the index of the entry being applied.
    pub(crate) session_expiry_entries: u64,
    index: u64,
    /// Decoupled execution (Cyclone §3.1): entries executed before they commit, each
    /// undoable until it does (`LogState::execute_tentatively`). Empty when coupled.
    journal: Journal,
}

/// The undo records of the entries a replica executed before they committed: one
/// transaction per entry, committed (forgotten) in log order when the entry commits, or
/// rolled back newest first when the entry is lost (a new leader overwrote it).
#[derive(Clone, Default, Debug)]
struct Journal {
    entries: std::collections::VecDeque<Tentative>,
    /// An entry is being executed: changes are recorded in the newest entry.
    recording: bool,
}

/// One tentatively executed entry: what it changed, as the values before it.
#[derive(Clone, Debug)]
struct Tentative {
    index: u64,
    term: u64,
    /// `LogState::index` before the entry.
    index_before: u64,
    /// Each key the entry wrote, with its value before the entry (first write only).
    keys: FxHashMap<Key, Option<Value>>,
    /// Each session record the entry changed or dropped, as it was before the entry.
    sessions: Vec<(SessionId, Option<SessionRecord>)>,
}

impl Journal {
    /// The entry being executed, if one is.
    fn recording(&mut self) -> Option<&mut Tentative> {
        match self.recording {
            true => self.entries.back_mut(),
            false => None,
        }
    }
}

impl Tentative {
    fn remember_session(&mut self, client: SessionId, before: impl FnOnce() -> Option<SessionRecord>) {
        if !self.sessions.iter().any(|(seen, _)| *seen == client) {
            self.sessions.push((client, before()));
        }
    }
}

impl LogState {
    /// The committed value of `key`: what uncommitted (tentatively executed) entries wrote
    /// is not visible until they commit.
    pub fn get(&self, key: &[u8]) -> Option<&Value> {
        match self.journal.entries.iter().find_map(|entry| entry.keys.get(key)) {
            Some(before) => before.as_ref(),
            None => self.store.get(key),
        }
    }

    /// How many keys the committed state holds.
    pub fn key_count(&self) -> usize {
        let mut count = self.store.len();
        for key in self.tentative_keys() {
            count = count + self.get(key).is_some() as usize - self.store.get(key).is_some() as usize;
        }
        count
    }

    /// Every key present in the committed state, in no particular order.
    pub fn keys(&self) -> impl Iterator<Item = &Key> {
        let tentative = !self.journal.entries.is_empty();
        let kept = self.store.keys().filter(move |key| !tentative || self.get(key).is_some());
        // Keys that uncommitted entries deleted are still committed.
        let deleted =
            self.tentative_keys().filter(|key| self.get(key).is_some() && self.store.get(key).is_none());
        kept.chain(deleted)
    }

    /// Each key an uncommitted entry wrote, once.
    fn tentative_keys(&self) -> impl Iterator<Item = &Key> {
        let entries = &self.journal.entries;
        entries.iter().enumerate().flat_map(move |(position, entry)| {
            entry
                .keys
                .keys()
                .filter(move |key| entries.iter().take(position).all(|older| !older.keys.contains_key(*key)))
        })
    }

    /// The committed session record of `client`.
    pub fn session(&self, client: SessionId) -> Option<&SessionRecord> {
        let before = self.journal.entries.iter().find_map(|entry| {
            entry.sessions.iter().find(|(seen, _)| *seen == client).map(|(_, record)| record)
        });
        match before {
            Some(record) => record.as_ref(),
            None => self.sessions.get(&client),
        }
    }

    /// The last sequence number `client` executed here and committed (0: none).
    pub fn last_seq(&self, client: SessionId) -> u64 {
        self.session(client).map_or(0, |record| record.last_seq)
    }

    /// The last sequence number `client` executed, committed or not: what a leader, whose
    /// uncommitted entries all commit if it keeps leading, need not propose again.
    pub fn executed_seq(&self, client: SessionId) -> u64 {
        self.sessions.get(&client).map_or(0, |record| record.last_seq)
    }

    /// How many session records this copy holds.
    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    /// Entry `index` is about to be applied: stamp its sessions with it, and drop the
    /// records that expired (at a sweep index, so every copy drops the same ones).
    pub fn begin_entry(&mut self, index: u64) {
        debug_assert!(index >= self.index, "entries apply in order");
        self.index = index;
        let expiry = self.session_expiry_entries;
        if expiry == 0 || !index.is_multiple_of((expiry / 8).max(1)) {
            return;
        }
        let expired = self
            .sessions
            .extract_if(|client, record| expires_by_entries(client) && record.last_index + expiry <= index);
        if let Some(entry) = self.journal.recording() {
            for (client, record) in expired {
                entry.remember_session(client, || Some(record));
            }
        } else {
            expired.for_each(drop);
        }
    }

    /// Apply a committed proposal, at most once per `(client, seq)`. `dedupe: false` is the
    /// broken variant that executes every copy.
    pub fn apply(&mut self, proposal: &Proposal, dedupe: bool) -> ProposalResult {
        if let Some(Step::Forget { coordinator, below, .. }) = &proposal.step {
            // Idempotent (a watermark only rises), so every copy runs and none is recorded.
            self.forget(*coordinator, *below);
            return ProposalResult::Executed;
        }
        let index = self.index;
        let record = self.sessions.get_mut(&proposal.client);
        let last_seq = record.as_ref().map_or(0, |record| record.last_seq);
        if dedupe {
            if let Some(record) = record {
                if proposal.seq <= record.last_seq {
                    if let Some(entry) = self.journal.recording() {
                        entry.remember_session(proposal.client, || Some(record.clone()));
                    }
                    record.last_index = index;
                    return match proposal.seq == last_seq {
                        true => ProposalResult::Duplicate,
                        false => ProposalResult::Stale { last_seq },
                    };
                }
            } else if self.expired(proposal) || self.forgotten(proposal.client) {
                return ProposalResult::Expired;
            }
        }
        let outcomes = match &proposal.step {
            Some(step) => self.execute_step(step),
            None => proposal.commands.iter().map(|command| self.execute_unless_locked(command)).collect(),
        };
        let seq = if dedupe { proposal.seq } else { proposal.seq.max(last_seq) };
        let before = self
            .sessions
            .insert(proposal.client, SessionRecord { last_seq: seq, last_index: index, outcomes });
        if let Some(entry) = self.journal.recording() {
            entry.remember_session(proposal.client, || before);
        }
        ProposalResult::Executed
    }

    /// Decoupled execution (Cyclone §3.1): execute entry `index` (of `term`) now, before it
    /// commits, as a transaction that [`LogState::commit_tentative`] commits and
    /// [`LogState::roll_back_from`] undoes. Entries are executed in log order, each right
    /// after the previous one (committed or tentative), so every result is the one the
    /// committed execution gives, unless an entry before it is lost, and then it is rolled
    /// back too. Returns each proposal's result and outcomes (a retry's are the saved ones).
    pub fn execute_tentatively(
        &mut self,
        index: u64,
        term: u64,
        proposals: &[Proposal],
        dedupe: bool,
    ) -> Vec<(ProposalResult, Vec<Outcome>)> {
        debug_assert!(proposals.iter().all(|proposal| proposal.step.is_none()), "steps run coupled");
        self.journal.entries.push_back(Tentative {
            index,
            term,
            index_before: self.index,
            keys: FxHashMap::default(),
            sessions: Vec::new(),
        });
        self.journal.recording = true;
        self.begin_entry(index);
        let results = proposals
            .iter()
            .map(|proposal| {
                let result = self.apply(proposal, dedupe);
                let outcomes = match result {
                    ProposalResult::Executed | ProposalResult::Duplicate => self
                        .sessions
                        .get(&proposal.client)
                        .map(|record| record.outcomes.clone())
                        .unwrap_or_default(),
                    ProposalResult::Stale { .. } | ProposalResult::Expired => Vec::new(),
                };
                (result, outcomes)
            })
            .collect();
        self.journal.recording = false;
        results
    }

    /// The oldest tentatively executed entry, as `(index, term)`.
    pub fn first_tentative(&self) -> Option<(u64, u64)> {
        self.journal.entries.front().map(|entry| (entry.index, entry.term))
    }

    /// The newest tentatively executed entry, as `(index, term)`.
    pub fn last_tentative(&self) -> Option<(u64, u64)> {
        self.journal.entries.back().map(|entry| (entry.index, entry.term))
    }

    /// The term of tentative entry `index`, if it is one.
    pub fn tentative_term(&self, index: u64) -> Option<u64> {
        // Ascending; found by index rather than by offset from the first, so a gap in the
        // journal could never lend an entry another's term.
        let at = self.journal.entries.binary_search_by_key(&index, |entry| entry.index).ok()?;
        Some(self.journal.entries[at].term)
    }

    /// Tentatively executed entries not committed yet.
    pub fn tentative_entries(&self) -> usize {
        self.journal.entries.len()
    }

    /// The oldest tentative entry committed: its changes stand and its undo records go.
    pub fn commit_tentative(&mut self) {
        debug_assert!(!self.journal.recording);
        self.journal.entries.pop_front();
    }

    /// Every tentative entry at or after `index` is lost: undo them, newest first, and
    /// return how many. `keep_writes` is the broken variant that keeps their writes.
    pub fn roll_back_from(&mut self, index: u64, keep_writes: bool) -> usize {
        let mut rolled_back = 0;
        while self.journal.entries.back().is_some_and(|entry| entry.index >= index) {
            let entry = self.journal.entries.pop_back().expect("checked");
            if !keep_writes {
                for (key, before) in entry.keys {
                    self.put(&key, before);
                }
            }
            for (client, before) in entry.sessions {
                match before {
                    Some(record) => self.sessions.insert(client, record),
                    None => self.sessions.remove(&client),
                };
            }
            self.index = entry.index_before;
            rolled_back += 1;
        }
        rolled_back
    }

    /// A proposal without a session record is refused if a copy of it could have run and
    /// expired since (see the module comment).
    fn expired(&self, proposal: &Proposal) -> bool {
        let expiry = self.session_expiry_entries;
        expiry > 0
            && expires_by_entries(&proposal.client)
            && proposal.sent_at_index.saturating_add(expiry) <= self.index
    }

    /// Whether `client` is a step of a transaction this log knows finished (its records
    /// forgotten, every later copy refused; the module comment).
    pub fn forgotten(&self, client: SessionId) -> bool {
        let Some((coordinator, begun_at)) = client.forgettable_step() else { return false };
        !self.runs_forgotten_steps
            && self.forgotten_below.get(&coordinator).is_some_and(|below| begun_at < *below)
    }

    /// Transaction steps' session records this log holds (what forgetting bounds).
    pub fn step_records(&self) -> usize {
        self.sessions.keys().filter(|client| client.forgettable_step().is_some()).count()
    }

    /// The `Forget` step: raise the watermark for `coordinator` and drop the records it covers.
    fn forget(&mut self, coordinator: u32, below: u64) {
        let watermark = self.forgotten_below.entry(coordinator).or_default();
        *watermark = (*watermark).max(below);
        let below = *watermark;
        self.sessions.retain(|client, _| {
            client.forgettable_step().is_none_or(|(of, begun_at)| of != coordinator || begun_at >= below)
        });
    }

    pub fn is_locked(&self, key: &[u8]) -> bool {
        self.locks.contains_key(key)
    }

    pub fn debug_locks(&self) -> Vec<(&Key, &TxnId)> {
        self.locks.iter().collect()
    }

    pub fn locked_keys(&self) -> usize {
        self.locks.len()
    }

    /// The index `txn`'s `Begin` ran at, while this log coordinates it in progress.
    pub fn begun_at(&self, txn: &TxnId) -> Option<u64> {
        self.txns.get(txn).map(|(begun_at, _)| *begun_at)
    }

    /// Whether this log coordinates `txn` and has applied its `Begin` and not its `Finish`.
    pub fn txn_in_progress(&self, txn: &TxnId) -> bool {
        self.txns.contains_key(txn)
    }

    /// Transactions this log coordinates that have begun and not finished: each with the
    /// index its `Begin` ran at and its commands.
    pub fn txns_in_progress(&self) -> impl Iterator<Item = (&TxnId, u64, &Vec<Command>)> {
        self.txns.iter().map(|(txn, (begun_at, commands))| (txn, *begun_at, commands))
    }

    pub fn gang(&self, gang: &TxnId) -> Option<&GangRecord> {
        self.gangs.get(gang)
    }

    pub fn gang_records(&self) -> usize {
        self.gangs.len()
    }

    pub fn gang_admitted_max(&self) -> Option<GangOrder> {
        self.gang_admitted_max
    }

    /// A gang is resolved in this log: remember what it did, and whether this log admitted
    /// it (what orders the gangs after it).
    pub(crate) fn record_gang(&mut self, gang: TxnId, record: GangRecord, admitted: Option<GangOrder>) {
        self.gang_admitted_max = self.gang_admitted_max.max(admitted);
        self.gangs.insert(gang, record);
    }

    /// Write a gang's result for one key of this log.
    pub(crate) fn write(&mut self, key: &Key, value: Option<Value>) {
        self.put(key, value);
    }

    fn execute_unless_locked(&mut self, command: &Command) -> Outcome {
        if self.locks.contains_key(command.key()) {
            return Outcome::Error(CommandError::Locked);
        }
        self.execute(command)
    }

    /// One transaction step (see `crate::txn` for how they combine). Outcomes:
    /// `Lock`: `[Flag(true), Value(v) per key]` when granted, `[Flag(false)]` when another
    /// transaction holds a key; `Finish`: `[Integer(below)]`, the watermark its `Forget`
    /// steps carry (module comment); the others `[Written]`.
    fn execute_step(&mut self, step: &Step) -> Vec<Outcome> {
        match step {
            Step::Begin { txn, commands } => {
                self.txns.insert(*txn, (self.index, commands.clone()));
                vec![Outcome::Written]
            }
            Step::Lock { txn, keys } => {
                if !self.ignore_locks {
                    if keys.iter().any(|key| self.locks.get(key).is_some_and(|holder| holder != txn)) {
                        return vec![Outcome::Flag(false)];
                    }
                    for key in keys {
                        self.locks.insert(key.clone(), *txn);
                    }
                }
                let mut outcomes = vec![Outcome::Flag(true)];
                outcomes.extend(keys.iter().map(|key| Outcome::Value(self.store.get(key).cloned())));
                outcomes
            }
            Step::Update { txn, writes, unlock } => {
                for (key, value) in writes {
                    self.put(key, value.clone());
                }
                for key in unlock {
                    if self.locks.get(key) == Some(txn) {
                        self.locks.remove(key);
                    }
                }
                vec![Outcome::Written]
            }
            Step::Finish { txn, .. } => {
                self.txns.remove(txn);
                // A `Begin` later in this entry has this index too, so it is not below it.
                let oldest_in_progress = self.txns.values().map(|(begun_at, _)| *begun_at).min();
                let below = oldest_in_progress.unwrap_or(self.index).min(self.index);
                vec![Outcome::Integer(i64::try_from(below).expect("log indexes fit i64"))]
            }
            Step::Forget { .. } => unreachable!("`apply` runs a Forget without a session record"),
            // Gangs never reach `apply`: the replica resolves them at the rendezvous.
            Step::Gang { .. } => {
                vec![Outcome::Error(CommandError::Unavailable("a gang outside its rendezvous"))]
            }
        }
    }

    /// Run one command. Deterministic: RMWs go through `RmwOp::apply`, the only definition
    /// of their semantics.
    pub fn execute(&mut self, command: &Command) -> Outcome {
        match command {
            Command::Read { key } => Outcome::Value(self.store.get(key).cloned()),
            Command::Write { key, value } => {
                self.put(key, value.clone());
                Outcome::Written
            }
            Command::Rmw { key, op } => {
                let effect = op.apply(self.store.get(key));
                if let Some(write) = effect.write {
                    self.put(key, write);
                }
                effect.outcome
            }
        }
    }

    /// The snapshot form (Cyclone keeps the application state and the session table together;
    /// so does a snapshot: a restored replica answers retries exactly as before). Keys and
    /// clients are sorted so equal states encode to equal bytes.
    pub fn encode(&self) -> Bytes {
        if !self.journal.entries.is_empty() {
            // Only committed state is ever saved or sent: undo the tentative entries on a copy.
            let mut committed = self.clone();
            committed.roll_back_from(0, false);
            return committed.encode();
        }
        let mut buf = BytesMut::new();
        let mut keys: Vec<(&Key, &Value)> = self.store.iter().collect();
        keys.sort_unstable();
        buf.put_u64_le(keys.len() as u64);
        for (key, value) in keys {
            buf.put_bytes_prefixed(key);
            buf.put_bytes_prefixed(value);
        }
        let mut sessions: Vec<(&SessionId, &SessionRecord)> = self.sessions.iter().collect();
        sessions.sort_unstable_by_key(|(client, _)| **client);
        buf.put_u64_le(sessions.len() as u64);
        for (client, record) in sessions {
            client.encode(&mut buf);
            buf.put_u64_le(record.last_seq);
            buf.put_u64_le(record.last_index);
            buf.put_u32_le(u32::try_from(record.outcomes.len()).expect("outcomes fit u32"));
            for outcome in &record.outcomes {
                outcome.encode(&mut buf);
            }
        }
        let mut locks: Vec<(&Key, &TxnId)> = self.locks.iter().collect();
        locks.sort_unstable();
        buf.put_u64_le(locks.len() as u64);
        for (key, txn) in locks {
            buf.put_bytes_prefixed(key);
            buf.put_u64_le(txn.origin);
            buf.put_u64_le(txn.number);
        }
        buf.put_u64_le(self.txns.len() as u64);
        for (txn, (begun_at, commands)) in &self.txns {
            buf.put_u64_le(txn.origin);
            buf.put_u64_le(txn.number);
            buf.put_u64_le(*begun_at);
            buf.put_u32_le(u32::try_from(commands.len()).expect("commands fit u32"));
            for command in commands {
                command.encode(&mut buf);
            }
        }
        buf.put_u64_le(self.forgotten_below.len() as u64);
        for (coordinator, below) in &self.forgotten_below {
            buf.put_u32_le(*coordinator);
            buf.put_u64_le(*below);
        }
        match self.gang_admitted_max {
            None => buf.put_u8(0),
            Some((rank, gang)) => {
                buf.put_u8(1);
                buf.put_u64_le(rank);
                buf.put_u64_le(gang.origin);
                buf.put_u64_le(gang.number);
            }
        }
        buf.put_u64_le(self.gangs.len() as u64);
        for (gang, record) in &self.gangs {
            buf.put_u64_le(gang.origin);
            buf.put_u64_le(gang.number);
            buf.put_bool(record.executed);
            buf.put_u32_le(u32::try_from(record.outcomes.len()).expect("outcomes fit u32"));
            for outcome in &record.outcomes {
                outcome.encode(&mut buf);
            }
            buf.put_u32_le(u32::try_from(record.writes.len()).expect("writes fit u32"));
            for (key, value) in &record.writes {
                buf.put_bytes_prefixed(key);
                buf.put_optional_bytes(value.as_ref());
            }
        }
        buf.freeze()
    }

    pub fn decode(bytes: Bytes) -> Result<LogState, DecodeError> {
        let mut reader = Reader::new(bytes);
        let mut state = LogState::default();
        let keys = reader.u64()?;
        // Every record takes at least 8 bytes: a larger count is a lie.
        if keys > reader.remaining() as u64 {
            return Err(DecodeError::Invalid("key count exceeds snapshot"));
        }
        for _ in 0..keys {
            let key = reader.bytes()?;
            let value = reader.bytes()?;
            state.store.insert(key, value);
        }
        let sessions = reader.u64()?;
        if sessions > reader.remaining() as u64 {
            return Err(DecodeError::Invalid("session count exceeds snapshot"));
        }
        for _ in 0..sessions {
            let client = SessionId::decode(&mut reader)?;
            let last_seq = reader.u64()?;
            let last_index = reader.u64()?;
            let count = reader.u32()? as usize;
            if count > reader.remaining() {
                return Err(DecodeError::Invalid("outcome count exceeds snapshot"));
            }
            let mut outcomes = Vec::with_capacity(count);
            for _ in 0..count {
                outcomes.push(Outcome::decode(&mut reader)?);
            }
            state.sessions.insert(client, SessionRecord { last_seq, last_index, outcomes });
        }
        let locks = reader.u64()?;
        if locks > reader.remaining() as u64 {
            return Err(DecodeError::Invalid("lock count exceeds snapshot"));
        }
        for _ in 0..locks {
            let key = reader.bytes()?;
            let txn = TxnId { origin: reader.u64()?, number: reader.u64()? };
            state.locks.insert(key, txn);
        }
        let txns = reader.u64()?;
        if txns > reader.remaining() as u64 {
            return Err(DecodeError::Invalid("transaction count exceeds snapshot"));
        }
        for _ in 0..txns {
            let txn = TxnId { origin: reader.u64()?, number: reader.u64()? };
            let begun_at = reader.u64()?;
            let count = reader.u32()? as usize;
            if count > reader.remaining() {
                return Err(DecodeError::Invalid("command count exceeds snapshot"));
            }
            let commands = (0..count).map(|_| Command::decode(&mut reader)).collect::<Result<_, _>>()?;
            state.txns.insert(txn, (begun_at, commands));
        }
        let watermarks = reader.u64()?;
        if watermarks > reader.remaining() as u64 {
            return Err(DecodeError::Invalid("watermark count exceeds snapshot"));
        }
        for _ in 0..watermarks {
            state.forgotten_below.insert(reader.u32()?, reader.u64()?);
        }
        state.decode_gangs(&mut reader)?;
        reader.finish()?;
        Ok(state)
    }

    fn decode_gangs(&mut self, reader: &mut Reader) -> Result<(), DecodeError> {
        self.gang_admitted_max = match reader.u8()? {
            0 => None,
            1 => Some((reader.u64()?, TxnId { origin: reader.u64()?, number: reader.u64()? })),
            tag => return Err(DecodeError::UnknownTag { what: "gang order flag", tag }),
        };
        let gangs = reader.u64()?;
        if gangs > reader.remaining() as u64 {
            return Err(DecodeError::Invalid("gang count exceeds snapshot"));
        }
        for _ in 0..gangs {
            let gang = TxnId { origin: reader.u64()?, number: reader.u64()? };
            let executed = reader.bool()?;
            let count = reader.u32()? as usize;
            if count > reader.remaining() {
                return Err(DecodeError::Invalid("outcome count exceeds snapshot"));
            }
            let outcomes = (0..count).map(|_| Outcome::decode(reader)).collect::<Result<_, _>>()?;
            let count = reader.u32()? as usize;
            if count > reader.remaining() {
                return Err(DecodeError::Invalid("write count exceeds snapshot"));
            }
            let writes = (0..count)
                .map(|_| Ok((reader.bytes()?, reader.optional_bytes()?)))
                .collect::<Result<_, DecodeError>>()?;
            self.gangs.insert(gang, GangRecord { executed, outcomes, writes });
        }
        Ok(())
    }

    fn put(&mut self, key: &Key, value: Option<Value>) {
        // One lookup in the store: the value replaced comes back from the write itself.
        let previous = match value {
            Some(value) => self.store.insert(key.clone(), value),
            None => self.store.remove(key),
        };
        if let Some(entry) = self.journal.recording() {
            // The entry's first write of the key keeps what it replaced, for a rollback.
            entry.keys.entry(key.clone()).or_insert(previous);
        }
    }
}

/// Sessions whose records expire after `session_expiry_entries` idle entries: replicas',
/// external clients' and transactions' `Begin` (made by the origin alone, with its
/// `sent_at_index`). The other steps are forgotten once their transaction finished, and
/// gang records are kept (docs/protocols/raftlog.md, "Not yet implemented").
fn expires_by_entries(client: &SessionId) -> bool {
    match client {
        SessionId::Replica(_) | SessionId::External(_) => true,
        SessionId::Step { kind, .. } => *kind == crate::message::StepKind::Begin,
    }
}

/// A log's state machine at a snapshot index, encoded lazily and at most once: taking one
/// ([`StateImage::of`]) is a copy-on-write clone of the state, and the bytes are made where
/// they are first needed, on the checkpoint writer's thread or when a lagging follower is
/// sent the snapshot. Clones share the bytes.
#[derive(Clone, Default)]
pub struct StateImage(Arc<ImageInner>);

#[derive(Default)]
struct ImageInner {
    /// The state until it is encoded (then dropped, so the live state's buckets stop being
    /// shared and writes stop copying them).
    state: Mutex<Option<LogState>>,
    bytes: OnceLock<Bytes>,
}

impl StateImage {
    pub fn of(state: &LogState) -> StateImage {
        StateImage(Arc::new(ImageInner { state: Mutex::new(Some(state.clone())), bytes: OnceLock::new() }))
    }

    /// `LogState::encode` of the state it was taken from.
    pub fn bytes(&self) -> Bytes {
        self.0
            .bytes
            .get_or_init(|| {
                let state = self.0.state.lock().expect("state image lock").take();
                state.map(|state| state.encode()).unwrap_or_default()
            })
            .clone()
    }

    /// Whether the bytes were made yet (tests: the loop must not have made them).
    pub fn is_encoded(&self) -> bool {
        self.0.bytes.get().is_some()
    }
}

impl From<Bytes> for StateImage {
    fn from(bytes: Bytes) -> StateImage {
        StateImage(Arc::new(ImageInner { state: Mutex::new(None), bytes: OnceLock::from(bytes) }))
    }
}

impl PartialEq for StateImage {
    fn eq(&self, other: &StateImage) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.bytes() == other.bytes()
    }
}

impl std::fmt::Debug for StateImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.bytes.get() {
            Some(bytes) => write!(f, "StateImage({} bytes)", bytes.len()),
            None => write!(f, "StateImage(not encoded)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use chorus_core::RmwOp;

    fn incr(client: u64, seq: u64) -> Proposal {
        Proposal {
            client: SessionId::External(client),
            seq,
            commands: vec![Command::Rmw { key: Bytes::from_static(b"k"), op: RmwOp::IncrementBy(1) }],
            step: None,
            sent_at_index: 0,
        }
    }

    #[test]
    fn a_retried_sequence_number_returns_the_saved_result_without_running_again() {
        let mut state = LogState::default();
        assert_eq!(state.apply(&incr(7, 1), true), ProposalResult::Executed);
        assert_eq!(state.apply(&incr(7, 1), true), ProposalResult::Duplicate);
        assert_eq!(state.session(SessionId::External(7)).unwrap().outcomes, vec![Outcome::Integer(1)]);
        assert_eq!(state.get(b"k"), Some(&Bytes::from_static(b"1")), "the retry did not run");
        // Another client's first request runs.
        assert_eq!(state.apply(&incr(8, 1), true), ProposalResult::Executed);
        assert_eq!(state.get(b"k"), Some(&Bytes::from_static(b"2")));
    }

    #[test]
    fn a_stale_sequence_number_is_refused() {
        let mut state = LogState::default();
        state.apply(&incr(7, 1), true);
        state.apply(&incr(7, 2), true);
        assert_eq!(state.apply(&incr(7, 1), true), ProposalResult::Stale { last_seq: 2 });
        assert_eq!(state.get(b"k"), Some(&Bytes::from_static(b"2")));
        assert_eq!(
            state.session(SessionId::External(7)).unwrap().last_seq,
            2,
            "a stale request changes nothing"
        );
    }

    #[test]
    fn a_snapshot_carries_keys_and_sessions() {
        let mut state = LogState::default();
        state.apply(&incr(7, 1), true);
        state.apply(&incr(8, 4), true);
        let gang = TxnId { origin: 3, number: 9 };
        let record = GangRecord {
            executed: true,
            outcomes: vec![Outcome::Integer(5)],
            writes: vec![(Bytes::from_static(b"x"), Some(Bytes::from_static(b"5")))],
        };
        state.record_gang(gang, record.clone(), Some((4, gang)));
        let bytes = state.encode();
        let restored = LogState::decode(bytes.clone()).unwrap();
        assert_eq!(restored.encode(), bytes);
        assert_eq!(restored.gang(&gang), Some(&record));
        assert_eq!(restored.gang_admitted_max(), Some((4, gang)));
        assert_eq!(restored.session(SessionId::External(8)).unwrap().outcomes, vec![Outcome::Integer(2)]);
        // The restored copy still refuses what the original refused.
        let mut restored = restored;
        assert_eq!(restored.apply(&incr(8, 4), true), ProposalResult::Duplicate);
        assert_eq!(restored.apply(&incr(8, 3), true), ProposalResult::Stale { last_seq: 4 });
        for cut in 0..bytes.len() {
            assert!(LogState::decode(bytes.slice(..cut)).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn finished_transactions_are_forgotten_below_the_coordinators_watermark_and_late_steps_refused() {
        use crate::message::StepKind;
        let (t1, t2, t3) =
            (TxnId { origin: 1, number: 1 }, TxnId { origin: 1, number: 2 }, TxnId { origin: 1, number: 3 });
        let step_of = |txn, kind, log, begun_at, step| Proposal {
            client: SessionId::Step { txn, kind, log, attempt: 0, coordinator: 0, begun_at },
            seq: 1,
            commands: vec![],
            step: Some(step),
            sent_at_index: 0,
        };
        let begin = |txn| Proposal {
            client: SessionId::Step {
                txn,
                kind: StepKind::Begin,
                log: 0,
                attempt: 0,
                coordinator: 0,
                begun_at: 0,
            },
            seq: 1,
            commands: vec![],
            step: Some(Step::Begin { txn, commands: vec![Command::Read { key: Bytes::from_static(b"k") }] }),
            sent_at_index: 0,
        };
        let finish = |txn, begun_at| {
            step_of(txn, StepKind::Finish, 0, begun_at, Step::Finish { txn, outcomes: vec![], logs: vec![1] })
        };
        // The coordinator: T1 begins at 5, T2 at 6; T2 finishes first, while T1 is in progress.
        let mut coordinator = LogState::default();
        coordinator.begin_entry(5);
        coordinator.apply(&begin(t1), true);
        coordinator.begin_entry(6);
        coordinator.apply(&begin(t2), true);
        assert_eq!(coordinator.begun_at(&t1), Some(5));
        coordinator.begin_entry(9);
        coordinator.apply(&finish(t2, 6), true);
        let below = |state: &LogState, txn, begun_at| {
            state.session(finish(txn, begun_at).client).unwrap().outcomes.clone()
        };
        assert_eq!(
            below(&coordinator, t2, 6),
            vec![Outcome::Integer(5)],
            "T1 (begun at 5) is still in progress"
        );
        coordinator.begin_entry(12);
        coordinator.apply(&finish(t1, 5), true);
        assert_eq!(below(&coordinator, t1, 5), vec![Outcome::Integer(12)], "nothing is in progress");

        // A participant: both locked and updated the key, in turn.
        let key = Bytes::from_static(b"k");
        let lock = |txn, begun_at| {
            step_of(txn, StepKind::Lock, 1, begun_at, Step::Lock { txn, keys: vec![key.clone()] })
        };
        let update = |txn, begun_at, value: &'static [u8]| {
            let writes = vec![(key.clone(), Some(Bytes::from_static(value)))];
            step_of(
                txn,
                StepKind::Update,
                1,
                begun_at,
                Step::Update { txn, writes, unlock: vec![key.clone()] },
            )
        };
        let forget =
            |below| step_of(t1, StepKind::Forget, 1, 5, Step::Forget { txn: t1, coordinator: 0, below });
        let mut participant = LogState::default();
        participant.begin_entry(1);
        assert_eq!(participant.apply(&lock(t1, 5), true), ProposalResult::Executed);
        assert_eq!(participant.apply(&update(t1, 5, b"1"), true), ProposalResult::Executed);
        assert_eq!(participant.apply(&lock(t2, 6), true), ProposalResult::Executed);
        assert_eq!(participant.apply(&update(t2, 6, b"2"), true), ProposalResult::Executed);
        assert_eq!(participant.step_records(), 4);
        // T2's Forget says only "below 5": T1's and T2's records stay.
        participant.begin_entry(2);
        assert_eq!(participant.apply(&forget(5), true), ProposalResult::Executed);
        assert_eq!(participant.step_records(), 4);
        assert_eq!(participant.apply(&update(t1, 5, b"1"), true), ProposalResult::Duplicate);
        // T1's Forget says "below 12": both go, and their late copies are refused, not run.
        participant.begin_entry(3);
        participant.apply(&forget(12), true);
        participant.apply(&forget(12), true);
        assert_eq!(participant.step_records(), 0);
        assert_eq!(participant.session_count(), 0, "a Forget keeps no record of its own");
        let mut participant = LogState::decode(participant.encode()).unwrap();
        participant.begin_entry(4);
        assert_eq!(participant.apply(&update(t1, 5, b"1"), true), ProposalResult::Expired);
        assert_eq!(participant.apply(&lock(t2, 6), true), ProposalResult::Expired);
        assert_eq!(participant.get(b"k"), Some(&Bytes::from_static(b"2")), "T1's late update did not run");
        assert!(!participant.is_locked(b"k"), "T2's late lock did not run");
        assert!(participant.forgotten(lock(t1, 5).client));
        // A lower watermark never lowers it; a transaction begun at 12 is not covered.
        participant.apply(&forget(7), true);
        assert_eq!(participant.apply(&lock(t3, 12), true), ProposalResult::Executed);
        assert!(participant.is_locked(b"k"));
        // The broken variant forgets the records and then runs the late copy.
        let mut broken = participant.clone();
        broken.runs_forgotten_steps = true;
        assert_eq!(broken.apply(&update(t1, 5, b"1"), true), ProposalResult::Executed);
        assert_eq!(broken.get(b"k"), Some(&Bytes::from_static(b"1")));
    }

    #[test]
    fn locks_block_single_key_commands_and_other_transactions_until_the_update() {
        let mut state = LogState::default();
        let (t1, t2) = (TxnId { origin: 1, number: 1 }, TxnId { origin: 2, number: 1 });
        let key = Bytes::from_static(b"k");
        let step = |client, step| Proposal {
            client: SessionId::External(client),
            seq: 1,
            commands: vec![],
            step: Some(step),
            sent_at_index: 0,
        };
        state.apply(&step(10, Step::Lock { txn: t1, keys: vec![key.clone()] }), true);
        assert_eq!(
            state.session(SessionId::External(10)).unwrap().outcomes,
            vec![Outcome::Flag(true), Outcome::Value(None)]
        );
        state.apply(&step(11, Step::Lock { txn: t2, keys: vec![key.clone()] }), true);
        assert_eq!(
            state.session(SessionId::External(11)).unwrap().outcomes,
            vec![Outcome::Flag(false)],
            "t2 must wait"
        );
        state.apply(&incr(7, 1), true);
        assert_eq!(
            state.session(SessionId::External(7)).unwrap().outcomes,
            vec![Outcome::Error(CommandError::Locked)]
        );
        // The snapshot keeps the lock.
        let mut state = LogState::decode(state.encode()).unwrap();
        let writes = vec![(key.clone(), Some(Bytes::from_static(b"5")))];
        state.apply(&step(12, Step::Update { txn: t1, writes, unlock: vec![key.clone()] }), true);
        state.apply(&incr(7, 2), true);
        assert_eq!(state.session(SessionId::External(7)).unwrap().outcomes, vec![Outcome::Integer(6)]);
    }

    #[test]
    fn idle_sessions_expire_at_sweeps_and_old_proposals_without_a_record_are_refused() {
        let mut state = LogState { session_expiry_entries: 16, ..LogState::default() };
        let step_session = SessionId::Step {
            txn: TxnId { origin: 1, number: 1 },
            kind: crate::StepKind::Lock,
            log: 0,
            attempt: 0,
            coordinator: 0,
            begun_at: 1,
        };
        state.begin_entry(1);
        state.apply(&incr(7, 1), true);
        state.apply(&Proposal { client: step_session, ..incr(0, 1) }, true);
        state.begin_entry(2);
        state.apply(&incr(8, 1), true);
        // Session 8 stays alive by retrying; 7 goes idle.
        state.begin_entry(10);
        assert_eq!(state.apply(&incr(8, 1), true), ProposalResult::Duplicate);
        state.begin_entry(16);
        assert_eq!(state.session_count(), 3, "not expired before 16 entries");
        state.begin_entry(18);
        assert!(state.session(SessionId::External(7)).is_none(), "7 expired at the sweep at 18");
        assert!(state.session(SessionId::External(8)).is_some(), "8 was used at 10");
        assert!(state.session(step_session).is_some(), "steps are forgotten, not expired");
        // A copy of 7's request made at index 0 may have run at 1: refused, nothing runs.
        assert_eq!(state.apply(&incr(7, 1), true), ProposalResult::Expired);
        assert_eq!(state.get(b"k"), Some(&Bytes::from_static(b"3")));
        // One made recently is a new session's request and runs.
        assert_eq!(
            state.apply(&Proposal { sent_at_index: 17, ..incr(7, 2) }, true),
            ProposalResult::Executed
        );
        // The record's index survives a snapshot.
        let restored = LogState::decode(state.encode()).unwrap();
        assert_eq!(restored.session(SessionId::External(7)).unwrap().last_index, 18);
    }

    #[test]
    fn tentative_entries_are_invisible_until_committed_and_roll_back_keys_sessions_and_sweeps() {
        let mut state = LogState { session_expiry_entries: 16, ..LogState::default() };
        state.begin_entry(1);
        state.apply(&incr(7, 1), true);
        let committed = state.encode();
        // Entry 2 increments k again (client 8); entry 4 retries client 7's request (2 and 4
        // are sweep indexes, every 16 / 8 entries, but nothing has idled 16 entries yet).
        let results = state.execute_tentatively(2, 5, &[incr(8, 1)], true);
        assert_eq!(results, vec![(ProposalResult::Executed, vec![Outcome::Integer(2)])]);
        let results = state.execute_tentatively(4, 5, &[incr(7, 1)], true);
        assert_eq!(results[0].0, ProposalResult::Duplicate, "the retry is recognised early too");
        assert_eq!(state.get(b"k"), Some(&Bytes::from_static(b"1")), "reads see committed state");
        assert!(state.session(SessionId::External(8)).is_none());
        assert_eq!(state.encode(), committed, "snapshots hold committed state only");
        assert_eq!(state.key_count(), 1);
        assert_eq!((state.first_tentative(), state.tentative_term(4)), (Some((2, 5)), Some(5)));
        // Entry 2 commits: its write becomes visible; entry 4 is lost (a new leader).
        state.commit_tentative();
        assert_eq!(state.get(b"k"), Some(&Bytes::from_static(b"2")));
        assert_eq!(state.roll_back_from(3, false), 1);
        assert_eq!(state.session(SessionId::External(7)).unwrap().last_index, 1, "its retry is undone");
        // The replacing entry at 4 runs on the state entry 2 left.
        let results = state.execute_tentatively(4, 6, &[incr(9, 1)], true);
        assert_eq!(results[0].1, vec![Outcome::Integer(3)]);
        state.commit_tentative();
        assert_eq!(state.get(b"k"), Some(&Bytes::from_static(b"3")));
        assert_eq!(state.tentative_entries(), 0);
    }

    #[test]
    fn a_rolled_back_sweep_restores_the_records_it_dropped() {
        let mut state = LogState { session_expiry_entries: 8, ..LogState::default() };
        state.begin_entry(1);
        state.apply(&incr(7, 1), true);
        // Index 9 is a sweep (every index divisible by 1 here): 7's record, last used at 1, goes.
        state.execute_tentatively(9, 2, &[], true);
        assert!(!state.sessions.contains_key(&SessionId::External(7)), "swept at the tip");
        assert!(state.session(SessionId::External(7)).is_some(), "still committed");
        assert_eq!(state.roll_back_from(9, false), 1);
        assert_eq!(state.sessions.get(&SessionId::External(7)).unwrap().last_seq, 1);
        // The broken variant keeps the lost entry's writes but not its sessions.
        state.execute_tentatively(2, 2, &[incr(8, 1)], true);
        assert_eq!(state.roll_back_from(2, true), 1);
        assert_eq!(state.get(b"k"), Some(&Bytes::from_static(b"2")), "kept: the bug");
        assert!(state.session(SessionId::External(8)).is_none());
    }

    #[test]
    fn without_dedupe_a_retry_runs_twice() {
        let mut state = LogState::default();
        state.apply(&incr(7, 1), false);
        state.apply(&incr(7, 1), false);
        assert_eq!(state.get(b"k"), Some(&Bytes::from_static(b"2")));
    }

    #[test]
    fn writes_deletes_and_rmws_share_one_register_per_key() {
        let mut state = LogState::default();
        let key = Bytes::from_static(b"k");
        assert_eq!(
            state.execute(&Command::Write { key: key.clone(), value: Some(Bytes::from_static(b"9")) }),
            Outcome::Written
        );
        assert_eq!(
            state.execute(&Command::Rmw { key: key.clone(), op: RmwOp::Swap(None) }),
            Outcome::Value(Some(Bytes::from_static(b"9")))
        );
        assert_eq!(state.execute(&Command::Read { key }), Outcome::Value(None));
        assert_eq!(state.key_count(), 0);
    }
}
