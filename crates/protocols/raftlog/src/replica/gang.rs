//! Ganged operations (Cyclone's evaluation, "Ganged Operations"): a multi-key command whose
//! keys span logs is appended, as the same `Step::Gang`, to every log it involves, and runs
//! once every one of those logs has reached it: the **rendezvous**. No locks are taken and no
//! log is asked anything; each log just waits at the gang in its own order.
//!
//! Every replica applies each log in order, but a log whose next proposal is a gang stops
//! there (its later entries wait in `Group::pending`) until every log of the gang has the
//! gang at its head too. Then the gang runs once, atomically, on the copies of every log, and
//! all of them go on. So it reads and writes every key at the gang's position in that key's
//! log, which every replica agrees on: the copies stay equal and no command or read ever
//! sees a gang half done.
//!
//! **Order.** Two gangs over the same logs could land in opposite orders in two logs (A: G1
//! then G2, B: G2 then G1), and each log would wait for the other forever. Every gang
//! carries a rank (its origin picks one above every gang it has seen in its logs; the gang's
//! id breaks ties), and each log **admits** a gang only if it ranks above every gang the log
//! admitted before; otherwise the log refuses it. Admission is decided when an entry commits
//! (`scan`), before the log reaches it, from the log's contents alone, so every replica
//! decides the same. A gang that some log refused runs nowhere (its origin retries it under
//! a new id and a higher rank); a gang every log admitted runs. Admitted gangs are in
//! ascending rank in every log, so the lowest-ranked unresolved admitted gang is at the head
//! of each of its logs: nothing waits in a cycle.
//!
//! **Faults.** Copies are at-most-once per log: a log that already resolved a gang (it keeps
//! a `GangRecord`) skips later copies. An origin that crashed after its gang reached some of
//! its logs leaves those logs waiting; any replica whose log waited at a gang for
//! `retry_timeout` proposes the gang into the logs that have not got it (the copies are
//! identical, so whichever commits first counts). A replica whose copy of one log jumped
//! past the gang by a snapshot finds in that log's record what the gang wrote everywhere.

use super::*;
use crate::state::{GangOrder, GangRecord};
use chorus_core::Value;

/// Committed entries of one log not yet applied (the head may be part-applied).
#[derive(Debug)]
pub(super) struct PendingEntry {
    pub index: u64,
    pub proposals: VecDeque<Proposal>,
    /// `LogState::begin_entry` ran for it.
    pub started: bool,
    /// A configuration change (its entry type and bytes), applied when the log reaches it.
    pub conf_change: Option<(EntryType, bytes::Bytes)>,
}

/// Admission of the gangs committed in one log and not yet resolved by its state machine.
#[derive(Debug, Default)]
pub(super) struct GangScan {
    /// The highest-ordered gang admitted, over the state machine and the pending entries.
    pub max: Option<GangOrder>,
    pub decided: FxHashMap<TxnId, bool>,
}

impl GangScan {
    pub fn from_state(state: &LogState) -> GangScan {
        GangScan { max: state.gang_admitted_max(), decided: FxHashMap::default() }
    }
}

/// A gang this replica originated, until it can answer it.
#[derive(Debug)]
pub(super) struct OwnGang {
    pub requests: Vec<ClientRequestId>,
    pub commands: Vec<Command>,
}

/// Where a gang stands, as seen from one of its logs at this replica.
enum Fate {
    /// A log refused it (or it is malformed): it runs nowhere.
    Abort,
    /// Another log's copy ran it already (this replica installed that log's snapshot).
    Done(GangRecord),
    /// Every log admitted it and has it at its head.
    Ready,
    /// These logs have not committed it yet.
    Missing(Vec<usize>),
    /// Every log admitted it; some still apply earlier entries.
    Behind,
}

fn gang_client(gang: TxnId, log: usize) -> SessionId {
    crate::txn::step_client(gang, StepKind::Gang, log, 0, crate::txn::Begun::default())
}

/// The gang at the head of `group`, if its next proposal is one.
fn head_gang(group: &Group) -> Option<TxnId> {
    let head = group.pending.front()?.proposals.front()?;
    match &head.step {
        Some(Step::Gang { gang, .. }) => Some(*gang),
        _ => None,
    }
}

impl RaftLog {
    /// Whether a gang is well formed for this cluster: its logs ascending and ours, `log`
    /// among them, and every key in this shard and in one of them. Decided from the
    /// proposal and the configuration alone, so every replica decides the same.
    fn gang_valid(&self, log: usize, logs: &[u32], commands: &[Command]) -> bool {
        let count = self.groups.len();
        !commands.is_empty()
            && logs.windows(2).all(|pair| pair[0] < pair[1])
            && logs.iter().all(|gang_log| (*gang_log as usize) < count)
            && logs.contains(&(log as u32))
            && commands.iter().all(|command| {
                self.owns(command.key()) && logs.contains(&(self.log_of(command.key()) as u32))
            })
    }

    /// Committed entries of `log` join its pending queue; gangs in them are admitted or
    /// refused now, in log order, whatever the state machine is still waiting for.
    pub(super) fn enqueue_entry(
        &mut self,
        log: usize,
        index: u64,
        proposals: Vec<Proposal>,
        conf_change: Option<(EntryType, bytes::Bytes)>,
    ) {
        for proposal in &proposals {
            let Some(Step::Gang { gang, rank, logs, commands }) = &proposal.step else { continue };
            let valid = self.gang_valid(log, logs, commands);
            let group = &mut self.groups[log];
            // This log has it: nobody needs to propose it here again.
            group.waiters.remove(&(proposal.client, proposal.seq));
            if group.state.gang(gang).is_some() || group.scan.decided.contains_key(gang) {
                continue; // a later copy: skipped when reached
            }
            let order = (*rank, *gang);
            let admit = valid && group.scan.max.is_none_or(|max| order > max);
            if admit {
                group.scan.max = Some(order);
            }
            group.scan.decided.insert(*gang, admit);
        }
        self.groups[log].pending.push_back(PendingEntry {
            index,
            proposals: proposals.into(),
            started: false,
            conf_change,
        });
    }

    /// Apply what every log can apply: each up to its first gang that is not ready; a gang
    /// that resolves lets its other logs go on too, hence the loop over every log.
    pub(super) fn advance(&mut self, first: usize, out: &mut Outbox<Message>) {
        // `first` always: reads confirmed without new entries may be due.
        if !self.advance_log(first, out) {
            self.after_apply(first, out);
        }
        while std::mem::take(&mut self.gangs_resolved) {
            for log in 0..self.groups.len() {
                self.advance_log(log, out);
            }
        }
    }

    /// Apply `log` up to its first gang that is not ready. Returns whether it applied any.
    fn advance_log(&mut self, log: usize, out: &mut Outbox<Message>) -> bool {
        let mut progressed = false;
        loop {
            let group = &mut self.groups[log];
            let Some(head) = group.pending.front_mut() else { break };
            if !head.started {
                group.state.begin_entry(head.index);
                head.started = true;
            }
            match head.proposals.front().map(|proposal| matches!(proposal.step, Some(Step::Gang { .. }))) {
                Some(true) => {
                    if !self.resolve_gang(log) {
                        break;
                    }
                }
                Some(false) => {
                    let proposal = head.proposals.pop_front().expect("front exists");
                    self.apply_proposal(log, &proposal, out);
                }
                None => {
                    let entry = group.pending.pop_front().expect("front exists");
                    group.applied_index = entry.index;
                    self.applied_since_snapshot += 1;
                    if let Some((entry_type, data)) = entry.conf_change {
                        self.apply_conf_change(log, entry_type, &data);
                    }
                }
            }
            progressed = true;
        }
        if progressed {
            self.after_apply(log, out);
        }
        progressed
    }

    /// The head of `log` is a gang: resolve it if it can be. Returns whether it did.
    fn resolve_gang(&mut self, log: usize) -> bool {
        let group = &self.groups[log];
        let proposal =
            group.pending.front().and_then(|head| head.proposals.front()).expect("a gang at the head");
        let Some(Step::Gang { gang, rank, logs, commands }) = proposal.step.clone() else {
            unreachable!("checked by the caller")
        };
        let admitted = group.scan.decided.get(&gang).copied();
        if group.state.gang(&gang).is_some() || admitted.is_none() {
            // A later copy of a gang this log resolved already.
            self.pop_gang(log, gang, None, None);
            return true;
        }
        let order = admitted.expect("decided").then_some((rank, gang));
        if self.has_bug(crate::config::Bug::GangNoRendezvous) && order.is_some() {
            // Broken on purpose: run it where it first arrives, on whatever the other logs
            // hold right now.
            let record = self.execute_gang(&commands);
            self.pop_gang(log, gang, Some(record), order);
            return true;
        }
        match self.fate(log, gang, &logs, &commands) {
            Fate::Missing(_) | Fate::Behind => false,
            Fate::Abort => {
                let record = GangRecord { executed: false, outcomes: Vec::new(), writes: Vec::new() };
                self.pop_gang(log, gang, Some(record), order);
                true
            }
            Fate::Done(record) => {
                self.pop_gang(log, gang, Some(record), order);
                true
            }
            Fate::Ready => {
                let locked = commands
                    .iter()
                    .any(|command| self.groups[self.log_of(command.key())].state.is_locked(command.key()));
                let record = if locked {
                    // A transaction of the locking kind holds a key (a cluster switching
                    // modes): do not break its atomicity; the origin retries.
                    GangRecord { executed: false, outcomes: Vec::new(), writes: Vec::new() }
                } else {
                    self.execute_gang(&commands)
                };
                self.stats.gangs_executed += u64::from(record.executed);
                for gang_log in logs {
                    self.pop_gang(gang_log as usize, gang, Some(record.clone()), order);
                }
                true
            }
        }
    }

    fn has_bug(&self, bug: crate::config::Bug) -> bool {
        self.config.has_bug(bug)
    }

    fn fate(&self, log: usize, gang: TxnId, logs: &[u32], commands: &[Command]) -> Fate {
        if !self.gang_valid(log, logs, commands) {
            return Fate::Abort;
        }
        let (mut missing, mut behind) = (Vec::new(), false);
        for gang_log in logs.iter().map(|gang_log| *gang_log as usize) {
            let group = &self.groups[gang_log];
            if let Some(record) = group.state.gang(&gang) {
                return if record.executed { Fate::Done(record.clone()) } else { Fate::Abort };
            }
            match group.scan.decided.get(&gang) {
                Some(false) => return Fate::Abort,
                None => missing.push(gang_log),
                Some(true) => behind |= head_gang(group) != Some(gang),
            }
        }
        match (missing.is_empty(), behind) {
            (false, _) => Fate::Missing(missing),
            (true, true) => Fate::Behind,
            (true, false) => Fate::Ready,
        }
    }

    /// Run a gang's commands, in order, on the current values of its keys in their logs.
    fn execute_gang(&mut self, commands: &[Command]) -> GangRecord {
        let mut scratch = LogState::default();
        for command in commands {
            if let Some(value) = self.groups[self.log_of(command.key())].state.get(command.key()) {
                scratch.write(command.key(), Some(value.clone()));
            }
        }
        let outcomes = commands.iter().map(|command| scratch.execute(command)).collect();
        let mut writes: Vec<(Key, Option<Value>)> = commands
            .iter()
            .filter(|command| command.is_update())
            .map(|command| (command.key().clone(), scratch.get(command.key()).cloned()))
            .collect();
        writes.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        writes.dedup_by(|a, b| a.0 == b.0);
        GangRecord { executed: true, outcomes, writes }
    }

    /// The gang at the head of `log` is done there: write its part, remember it (unless this
    /// is a later copy: `record` None), and move past it.
    fn pop_gang(&mut self, log: usize, gang: TxnId, record: Option<GangRecord>, order: Option<GangOrder>) {
        let logs = self.groups.len();
        let shards = self.config.shards;
        let group = &mut self.groups[log];
        let head = group.pending.front_mut().expect("a gang at the head");
        if !head.started {
            group.state.begin_entry(head.index);
            head.started = true;
        }
        head.proposals.pop_front();
        group.gang_wait = None;
        let Some(record) = record else { return };
        if group.state.gang(&gang).is_none() {
            for (key, value) in record.writes.iter().filter(|(key, _)| log_in_shard(key, logs, shards) == log)
            {
                group.state.write(key, value.clone());
            }
            group.state.record_gang(gang, record, order);
        }
        group.scan.decided.remove(&gang);
        self.gangs_resolved = true;
    }

    /// A snapshot replaced `log`'s state machine: what was pending is covered by it.
    pub(super) fn reset_gangs(&mut self, log: usize) {
        let group = &mut self.groups[log];
        group.pending.clear();
        group.gang_wait = None;
        group.scan = GangScan::from_state(&group.state);
        let state = &group.state;
        group.waiters.retain(|(client, _), _| {
            !matches!(client, SessionId::Step { txn, kind: StepKind::Gang, .. } if state.gang(txn).is_some())
        });
        self.gangs_resolved = true;
    }

    /// A multi-key command as a ganged operation: its copy goes to every log it involves.
    pub(super) fn submit_gang(&mut self, own: OwnGang) {
        let mut logs: Vec<u32> =
            own.commands.iter().map(|command| self.log_of(command.key()) as u32).collect();
        logs.sort_unstable();
        logs.dedup();
        // Above every gang this replica has seen in those logs, so it is rarely refused.
        let seen =
            logs.iter().filter_map(|log| self.groups[*log as usize].scan.max).map(|(rank, _)| rank).max();
        let rank = seen.map_or(1, |rank| rank + 1);
        self.next_txn += 1;
        let gang = TxnId { origin: self.config.session_client_id, number: self.next_txn };
        let step = Step::Gang { gang, rank, logs: logs.clone(), commands: own.commands.clone() };
        for log in logs {
            self.register_gang_copy(log as usize, gang, &step);
        }
        self.stats.gangs_started += 1;
        self.gangs_out.insert(gang, own);
    }

    fn register_gang_copy(&mut self, log: usize, gang: TxnId, step: &Step) {
        let client = gang_client(gang, log);
        let proposal =
            Proposal { client, seq: 1, commands: Vec::new(), step: Some(step.clone()), sent_at_index: 0 };
        let group = &mut self.groups[log];
        if group.waiters.contains_key(&(client, 1)) {
            return;
        }
        let waiter = Waiter::new(proposal, Vec::new(), false, None);
        register_waiter(
            group,
            waiter,
            self.dedupe,
            &mut Outbox::default(),
            &mut self.step_results,
            &mut self.stats,
        );
    }

    /// Answer this replica's gangs that ran; submit again, under a new id and rank, those a
    /// log refused. Returns whether it submitted any.
    pub(super) fn answer_own_gangs(&mut self, out: &mut Outbox<Message>) -> bool {
        if self.gangs_out.is_empty() {
            return false;
        }
        let mut resolved = Vec::new();
        for (gang, own) in &self.gangs_out {
            let record = own
                .commands
                .iter()
                .find_map(|command| self.groups[self.log_of(command.key())].state.gang(gang));
            if let Some(record) = record {
                resolved.push((*gang, record.clone()));
            }
        }
        let mut again = false;
        for (gang, record) in resolved {
            let own = self.gangs_out.remove(&gang).expect("listed");
            if record.executed {
                self.stats.gangs_answered += 1;
                for (request, outcome) in own.requests.into_iter().zip(record.outcomes) {
                    out.reply(request, outcome);
                }
            } else {
                self.stats.gangs_refused += 1;
                self.submit_gang(own);
                again = true;
            }
        }
        again
    }

    /// A log that has waited at a gang for `retry_timeout` proposes it into the logs that
    /// have not committed it (its origin may have crashed before sending every copy).
    pub(super) fn rescue_gangs(&mut self, now: Time) {
        for log in 0..self.groups.len() {
            let Some(gang) = head_gang(&self.groups[log]) else { continue };
            let since = match self.groups[log].gang_wait {
                Some((waiting, since)) if waiting == gang => since,
                _ => {
                    self.groups[log].gang_wait = Some((gang, now));
                    continue;
                }
            };
            if now < since + self.config.retry_timeout {
                continue;
            }
            self.groups[log].gang_wait = Some((gang, now));
            let step = self.groups[log].pending[0].proposals[0].step.clone().expect("a gang");
            let Step::Gang { logs, commands, .. } = &step else { unreachable!("a gang") };
            if let Fate::Missing(missing) = self.fate(log, gang, logs, commands) {
                for missing_log in missing {
                    self.stats.gangs_rescued += 1;
                    self.register_gang_copy(missing_log, gang, &step);
                }
            }
        }
    }

    /// Gangs this replica still owes an answer, plus logs waiting at a rendezvous.
    pub fn gangs_in_progress(&self) -> usize {
        self.gangs_out.len() + self.groups.iter().filter(|group| !group.pending.is_empty()).count()
    }
}
