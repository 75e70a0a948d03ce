//! Multi-key transactions across logs (Cyclone §4.2, Figure 6): strict two-phase locking
//! made fault tolerant by running every step through the logs as at-most-once requests.
//!
//! 1. The origin replica puts `Begin { txn, commands }` into the **coordinator log** (the log
//!    of the first key): from then on the transaction will complete, whoever crashes.
//! 2. Every replica that applies the `Begin` runs a [`Driver`] for it (so does a replica
//!    that restarts or installs a snapshot with the transaction still in progress). All
//!    drivers send the *same* requests: each step has its own client id, derived from
//!    `(txn, step, log, attempt)`, and sequence number 1, so the first copy to reach a log
//!    executes and every other copy gets the saved result (the paper uses one client id per
//!    phase for the same reason: a slow driver must still find its answer).
//! 3. **Acquire**: `Lock` the transaction's keys log by log, in ascending log order (so two
//!    transactions never wait for each other in a cycle). A log that finds a key locked by
//!    another transaction refuses without effect; the drivers try that log again, as a new
//!    attempt, after `retry_timeout`. A granted lock returns the keys' values.
//! 4. **Verify and update**: with every lock held, the commands run, in order, on the locked
//!    values, identically in every driver (they saw the same saved results). `Update` writes
//!    each log's results and releases its locks in one entry. The origin answers its client
//!    once every update applied.
//! 5. **Release** of the coordinator's record: `Finish`, which carries the outcomes (an
//!    origin whose driver fell behind answers from it) and the participant logs.
//! 6. **Forget**: every replica that applies the `Finish` proposes `Forget` into the
//!    transaction's logs, so their step records go and any late copy is refused
//!    (`crate::state`, "Forgetting finished transactions"). A driver whose step is refused
//!    that way knows the transaction is over and stops.
//!
//! Single-key commands on a locked key do not run (`CommandError::Locked`); the origin
//! holds them, and reads of locked keys, until its copy sees the lock released. So no
//! reader ever sees one log updated and another not yet.

use std::collections::{BTreeMap, BTreeSet};

use chorus_core::{ClientRequestId, Command, Key, Outcome, Time, Value};
use rustc_hash::FxHashMap;

use crate::message::{Proposal, SessionId, Step, StepKind, TxnId};
use crate::replica::log_in_shard;
use crate::state::LogState;

/// Where and at which index a transaction's `Begin` ran (`(0, 0)` for a `Begin` itself and
/// a gang's copies, which are not forgotten by watermark).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Begun {
    pub coordinator: usize,
    pub index: u64,
}

/// The at-most-once client of one step: the step's whole identity, so two steps never share
/// one and no other kind of session can be one.
pub(crate) fn step_client(txn: TxnId, kind: StepKind, log: usize, attempt: u32, begun: Begun) -> SessionId {
    SessionId::Step {
        txn,
        kind,
        log: u32::try_from(log).expect("logs fit u32"),
        attempt,
        coordinator: u32::try_from(begun.coordinator).expect("logs fit u32"),
        begun_at: begun.index,
    }
}

/// What a refused step (forgotten: its transaction finished) gives its driver.
pub(crate) const FORGOTTEN: Outcome = Outcome::Error(chorus_core::CommandError::OutcomeUnknown);

/// Outcomes a `Finish` carries up to this size (or the configured batch size, if smaller);
/// above it, none (an origin that needs them answers from its own driver, or that the
/// outcome is unknown): a `Finish` must fit one peer message.
pub(crate) const FINISH_OUTCOMES_BYTES_MAX: usize = 64 * 1024;

/// A step's result, as this replica learned it (from its own applied copy of the log).
#[derive(Clone, Debug)]
pub(crate) struct StepResult {
    pub txn: TxnId,
    pub kind: StepKind,
    pub log: usize,
    pub attempt: u32,
    pub outcomes: Vec<Outcome>,
}

/// A request the driver wants sent: into `log`, as `proposal`.
pub(crate) struct StepRequest {
    pub log: usize,
    pub proposal: Proposal,
    pub attempt: u32,
}

#[derive(Debug)]
enum Phase {
    Lock { index: usize, attempt: u32, sent: bool, not_before: Time },
    Update { pending: BTreeSet<usize>, sent: bool },
    Finish { sent: bool },
    Done,
}

/// One replica's driver of one transaction.
#[derive(Debug)]
pub(crate) struct Driver {
    txn: TxnId,
    commands: Vec<Command>,
    begun: Begun,
    /// The most outcome bytes its `Finish` carries.
    finish_outcomes_bytes_max: usize,
    /// Keys to lock per participant log, in ascending log order.
    keys_by_log: BTreeMap<usize, Vec<Key>>,
    values: FxHashMap<Key, Option<Value>>,
    writes_by_log: BTreeMap<usize, Vec<(Key, Option<Value>)>>,
    outcomes: Vec<Outcome>,
    phase: Phase,
    /// The origin's clients, one per command (empty at other replicas).
    pub replies: Vec<ClientRequestId>,
}

impl Driver {
    /// `begun_at`: the index the transaction's `Begin` ran at in its coordinator log;
    /// `batch_bytes_max`: the configuration's (a `Finish` is one proposal of one entry).
    pub(crate) fn new(
        txn: TxnId,
        commands: Vec<Command>,
        begun_at: u64,
        (logs, shards): (usize, usize),
        batch_bytes_max: usize,
    ) -> Driver {
        assert!(!commands.is_empty(), "a transaction has commands");
        let log_of = |key: &[u8]| log_in_shard(key, logs, shards);
        let begun = Begun { coordinator: log_of(commands[0].key()), index: begun_at };
        let mut keys_by_log: BTreeMap<usize, Vec<Key>> = BTreeMap::new();
        for command in &commands {
            keys_by_log.entry(log_of(command.key())).or_default().push(command.key().clone());
        }
        for keys in keys_by_log.values_mut() {
            keys.sort_unstable();
            keys.dedup();
        }
        Driver {
            txn,
            commands,
            begun,
            finish_outcomes_bytes_max: FINISH_OUTCOMES_BYTES_MAX.min(batch_bytes_max),
            keys_by_log,
            values: FxHashMap::default(),
            writes_by_log: BTreeMap::new(),
            outcomes: Vec::new(),
            phase: Phase::Lock { index: 0, attempt: 0, sent: false, not_before: Time::ZERO },
            replies: Vec::new(),
        }
    }

    pub(crate) fn is_done(&self) -> bool {
        matches!(self.phase, Phase::Done)
    }

    fn participant(&self, index: usize) -> (usize, &Vec<Key>) {
        let (log, keys) = self.keys_by_log.iter().nth(index).expect("index in range");
        (*log, keys)
    }

    fn request(&self, log: usize, kind: StepKind, attempt: u32, step: Step) -> StepRequest {
        let client = step_client(self.txn, kind, log, attempt, self.begun);
        StepRequest {
            log,
            attempt,
            // Steps are forgotten by watermark, not expired, so their index does not matter.
            proposal: Proposal { client, seq: 1, commands: Vec::new(), step: Some(step), sent_at_index: 0 },
        }
    }

    /// The requests due now (each sent once; the waiter machinery retries them).
    pub(crate) fn due(&mut self, now: Time) -> Vec<StepRequest> {
        let txn = self.txn;
        match &self.phase {
            Phase::Lock { index, attempt, sent: false, not_before } if now >= *not_before => {
                let (index, attempt) = (*index, *attempt);
                let (log, keys) = self.participant(index);
                let request =
                    self.request(log, StepKind::Lock, attempt, Step::Lock { txn, keys: keys.clone() });
                self.phase = Phase::Lock { index, attempt, sent: true, not_before: now };
                vec![request]
            }
            Phase::Update { pending, sent: false } => {
                let requests = pending
                    .iter()
                    .map(|log| {
                        let writes = self.writes_by_log.get(log).cloned().unwrap_or_default();
                        let unlock = self.keys_by_log[log].clone();
                        self.request(*log, StepKind::Update, 0, Step::Update { txn, writes, unlock })
                    })
                    .collect();
                let pending = pending.clone();
                self.phase = Phase::Update { pending, sent: true };
                requests
            }
            Phase::Finish { sent: false } => {
                let outcome_bytes: usize = self.outcomes.iter().map(crate::message::outcome_bytes).sum();
                let outcomes = match outcome_bytes <= self.finish_outcomes_bytes_max {
                    true => self.outcomes.clone(),
                    false => Vec::new(),
                };
                let logs = self.logs().map(|log| u32::try_from(log).expect("logs fit u32")).collect();
                let step = Step::Finish { txn, outcomes, logs };
                let request = self.request(self.begun.coordinator, StepKind::Finish, 0, step);
                self.phase = Phase::Finish { sent: true };
                vec![request]
            }
            _ => Vec::new(),
        }
    }

    /// The transaction's coordinator log.
    pub(crate) fn coordinator(&self) -> usize {
        self.begun.coordinator
    }

    /// Every log the transaction involves: its participants and its coordinator.
    pub(crate) fn logs(&self) -> impl Iterator<Item = usize> + '_ {
        let coordinator = std::iter::once(self.begun.coordinator);
        let participants = self.keys_by_log.keys().copied().filter(|log| *log != self.begun.coordinator);
        coordinator.chain(participants)
    }

    /// The transaction finished (other drivers completed it): stop. Returns the clients
    /// still owed their outcomes, and the outcomes if this driver computed them already
    /// (every lock held; empty before).
    pub(crate) fn stop(&mut self) -> (Vec<ClientRequestId>, Vec<Outcome>) {
        self.phase = Phase::Done;
        (std::mem::take(&mut self.replies), self.outcomes.clone())
    }

    /// Take a step's result. Returns the replies to send, once every update has applied.
    pub(crate) fn on_result(
        &mut self,
        result: &StepResult,
        now: Time,
        retry_timeout: Time,
    ) -> Vec<(ClientRequestId, Outcome)> {
        match &mut self.phase {
            Phase::Lock { index, attempt, .. }
                if result.kind == StepKind::Lock && result.attempt == *attempt =>
            {
                let (index, attempt) = (*index, *attempt);
                let (log, keys) = self.participant(index);
                if log != result.log {
                    return Vec::new();
                }
                let keys = keys.clone();
                match result.outcomes.split_first() {
                    Some((Outcome::Flag(true), values)) if values.len() == keys.len() => {
                        for (key, value) in keys.into_iter().zip(values) {
                            let Outcome::Value(value) = value else {
                                unreachable!("lock results are values")
                            };
                            self.values.insert(key, value.clone());
                        }
                        if index + 1 < self.keys_by_log.len() {
                            self.phase =
                                Phase::Lock { index: index + 1, attempt: 0, sent: false, not_before: now };
                        } else {
                            self.execute();
                        }
                    }
                    _ => {
                        // Another transaction holds a key: try this log again later.
                        self.phase = Phase::Lock {
                            index,
                            attempt: attempt + 1,
                            sent: false,
                            not_before: now + retry_timeout,
                        };
                    }
                }
                Vec::new()
            }
            Phase::Update { pending, .. } if result.kind == StepKind::Update => {
                pending.remove(&result.log);
                if !pending.is_empty() {
                    return Vec::new();
                }
                self.phase = Phase::Finish { sent: false };
                let replies = std::mem::take(&mut self.replies);
                replies.into_iter().zip(self.outcomes.iter().cloned()).collect()
            }
            Phase::Finish { .. } if result.kind == StepKind::Finish => {
                self.phase = Phase::Done;
                Vec::new()
            }
            _ => Vec::new(), // an answer to a step this driver is already past
        }
    }

    /// Every lock is held: run the commands in order on the locked values. Every driver
    /// computes the same outcomes and writes from the same saved lock results.
    fn execute(&mut self) {
        let mut scratch = LogState::default();
        for (key, value) in &self.values {
            if let Some(value) = value {
                scratch.execute(&Command::Write { key: key.clone(), value: Some(value.clone()) });
            }
        }
        self.outcomes = self.commands.iter().map(|command| scratch.execute(command)).collect();
        let written: BTreeSet<&Key> =
            self.commands.iter().filter(|command| command.is_update()).map(|command| command.key()).collect();
        for (log, keys) in &self.keys_by_log {
            let writes = keys
                .iter()
                .filter(|key| written.contains(key))
                .map(|key| (key.clone(), scratch.get(key).cloned()))
                .collect();
            self.writes_by_log.insert(*log, writes);
        }
        self.phase = Phase::Update { pending: self.keys_by_log.keys().copied().collect(), sent: false };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use chorus_core::RmwOp;

    fn b(text: &str) -> Bytes {
        Bytes::copy_from_slice(text.as_bytes())
    }

    #[test]
    fn step_clients_differ_by_every_part_and_never_look_like_a_replica_session() {
        let txn = TxnId { origin: 1 << 40 | 1, number: 7 };
        let begun = Begun { coordinator: 2, index: 40 };
        let base = step_client(txn, StepKind::Lock, 3, 0, begun);
        assert!(matches!(base, SessionId::Step { .. }));
        assert_eq!(base.forgettable_step(), Some((2, 40)));
        assert_ne!(base, step_client(TxnId { number: 8, ..txn }, StepKind::Lock, 3, 0, begun));
        assert_ne!(base, step_client(txn, StepKind::Update, 3, 0, begun));
        assert_ne!(base, step_client(txn, StepKind::Lock, 4, 0, begun));
        assert_ne!(base, step_client(txn, StepKind::Lock, 3, 1, begun));
        let begin = step_client(txn, StepKind::Begin, 2, 0, Begun::default());
        assert_eq!(begin.forgettable_step(), None, "a Begin expires as sessions do");
    }

    /// Outcomes too large for the `Finish` stay with the driver: an origin whose driver is
    /// stopped (its transaction finished elsewhere) still has them to answer with.
    #[test]
    fn outcomes_too_large_for_the_finish_stay_with_the_driver() {
        let txn = TxnId { origin: 1, number: 1 };
        let commands = vec![Command::Read { key: b("a") }];
        let mut driver = Driver::new(txn, commands, 5, (1, 1), 8);
        driver.replies = vec![ClientRequestId(1)];
        let (now, timeout) = (Time::ZERO, Time::from_millis(60));
        let lock = driver.due(now);
        let value = Outcome::Value(Some(b("a value longer than eight bytes")));
        let granted = vec![Outcome::Flag(true), value.clone()];
        let result =
            StepResult { txn, kind: StepKind::Lock, log: lock[0].log, attempt: 0, outcomes: granted };
        driver.on_result(&result, now, timeout);
        assert_eq!(driver.due(now).len(), 1, "the update");
        let (clients, computed) = driver.stop();
        assert_eq!((clients, computed), (vec![ClientRequestId(1)], vec![value.clone()]));
        assert!(driver.is_done());
        let mut driver = Driver::new(txn, vec![Command::Read { key: b("a") }], 5, (1, 1), 8);
        driver.due(now);
        let granted = vec![Outcome::Flag(true), value];
        driver.on_result(
            &StepResult { txn, kind: StepKind::Lock, log: 0, attempt: 0, outcomes: granted },
            now,
            timeout,
        );
        driver.due(now);
        let result =
            StepResult { txn, kind: StepKind::Update, log: 0, attempt: 0, outcomes: vec![Outcome::Written] };
        driver.on_result(&result, now, timeout);
        let finish = driver.due(now);
        let Some(Step::Finish { outcomes, logs, .. }) = &finish[0].proposal.step else { panic!() };
        assert!(outcomes.is_empty(), "over the cap, the Finish carries none");
        assert_eq!(logs, &vec![0]);
    }

    #[test]
    fn a_driver_locks_in_log_order_retries_a_refused_lock_then_updates_and_finishes() {
        let logs = 8;
        let commands = vec![
            Command::Rmw { key: b("a"), op: RmwOp::IncrementBy(-5) },
            Command::Rmw { key: b("b"), op: RmwOp::IncrementBy(5) },
            Command::Read { key: b("a") },
        ];
        let txn = TxnId { origin: 1, number: 1 };
        let mut driver = Driver::new(txn, commands, 5, (logs, 1), FINISH_OUTCOMES_BYTES_MAX);
        driver.replies = vec![ClientRequestId(1), ClientRequestId(2), ClientRequestId(3)];
        let timeout = Time::from_millis(60);
        let mut now = Time::ZERO;
        let mut locked = Vec::new();
        while let Phase::Lock { .. } = driver.phase {
            let due = driver.due(now);
            if due.is_empty() {
                now = now + Time::from_millis(10);
                continue;
            }
            let request = &due[0];
            let Some(Step::Lock { keys, .. }) = &request.proposal.step else { panic!() };
            // The first attempt at each log is refused once.
            let granted = request.attempt > 0;
            let outcomes = if granted {
                locked.push(request.log);
                let mut outcomes = vec![Outcome::Flag(true)];
                outcomes.extend(keys.iter().map(|_| Outcome::Value(Some(b("100")))));
                outcomes
            } else {
                vec![Outcome::Flag(false)]
            };
            let result = StepResult {
                txn,
                kind: StepKind::Lock,
                log: request.log,
                attempt: request.attempt,
                outcomes,
            };
            assert!(driver.on_result(&result, now, timeout).is_empty());
        }
        let mut sorted = locked.clone();
        sorted.sort_unstable();
        assert_eq!(locked, sorted, "locks are taken in ascending log order");
        let updates = driver.due(now);
        assert_eq!(updates.len(), locked.len());
        let mut replies = Vec::new();
        for update in &updates {
            let result = StepResult {
                txn,
                kind: StepKind::Update,
                log: update.log,
                attempt: 0,
                outcomes: vec![Outcome::Written],
            };
            replies.extend(driver.on_result(&result, now, timeout));
        }
        assert_eq!(
            replies,
            vec![
                (ClientRequestId(1), Outcome::Integer(95)),
                (ClientRequestId(2), Outcome::Integer(105)),
                (ClientRequestId(3), Outcome::Value(Some(b("95")))),
            ]
        );
        let finish = driver.due(now);
        assert_eq!(finish.len(), 1);
        // The Finish carries the outcomes (for an origin whose driver fell behind) and every
        // log the transaction involves (where the Forget steps go).
        let Some(Step::Finish { outcomes, logs: finish_logs, .. }) = &finish[0].proposal.step else {
            panic!()
        };
        assert_eq!(
            outcomes,
            &vec![Outcome::Integer(95), Outcome::Integer(105), Outcome::Value(Some(b("95")))]
        );
        let mut involved: Vec<u32> = locked.iter().map(|log| *log as u32).collect();
        involved.dedup();
        let mut carried = finish_logs.clone();
        carried.sort_unstable();
        assert_eq!(carried, involved);
        let result =
            StepResult { txn, kind: StepKind::Finish, log: finish[0].log, attempt: 0, outcomes: vec![] };
        driver.on_result(&result, now, timeout);
        assert!(driver.is_done());
    }
}
